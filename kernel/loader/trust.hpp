// Whether a library file can be trusted from where it lies, the libraries a plugin brings with
// it, and copies of their bytes that nobody can change (registry.hpp says how discovery uses
// them; package.cpp checks a package's dependencies at install with the same functions).
//
// The path rule (unsafe_path). Another user must not be able to change what a path names. So,
// walking the path from / component by component, and through every symbolic link on it (the
// link's own directory, then the directories of its target):
//   - every directory, file and link met belongs to this user or to root;
//   - no directory met is writable by its group or by others, with one exception: a sticky
//     directory (mode +t, like /tmp's 1777) may be passed through, because in a sticky
//     directory only an entry's owner (or the directory's, or root) can rename or delete the
//     entry, and the entry below it must belong to this user or root (the rule above);
//   - the directory that holds the file (or the link, or that is the directory checked) is
//     never writable by others, sticky or not: another user could add names to it;
//   - the file is not writable by its group or by others.
// So /tmp/keel-xyz (0700, ours) is a safe place for plugins; /tmp itself, a 0777 directory on
// the way, or a directory of another user is not.
#pragma once

#include <sys/stat.h>

#include <string>
#include <vector>

namespace keel {

// "" when `path` satisfies the rule above, else why not, as a phrase that names the component
// ("its directory /srv/p is writable by every user (mode 0777)"). `is_dir`: `path` names a
// directory (a RUNPATH entry), else a file. On success, `*final` (when given) is the lstat of
// the file or directory the path ends at, for comparing with an open descriptor's inode.
std::string unsafe_path(const std::string& path, bool is_dir, struct stat* final = nullptr);

// A copy of the regular file open at `fd` in a memfd (MFD_ALLOW_SEALING | MFD_CLOEXEC), sealed
// against writing, growing, shrinking and further seals, so that what is checked and hashed in
// it is what dlopen of /proc/self/fd/N maps. Returns the memfd, or -1 with `*error` set.
// Writing the copy counts against the file size limit (RLIMIT_FSIZE, `ulimit -f`): when the
// file is larger than the soft limit, the limit is raised for the copy (to the hard limit, or,
// where that is not enough, to unlimited if the process may: CAP_SYS_RESOURCE) and put back
// right after. The limit is the process's: a thread writing elsewhere during the copy is not
// held to it meanwhile. Where it cannot be raised far enough: with `path_checked` (the file
// passed unsafe_path, so only this user or root can change it) the result is a duplicate of
// `fd` itself, the file read twice (to check and hash, then by dlopen) as before sealed copies,
// and a debug line in the run log says so; without it, -1 and an error that names the limit.
int sealed_copy(int fd, const std::string& name, bool path_checked, std::string* error);

// A plugin's own library, found the way the dynamic loader would find it.
struct Dependency {
  std::string needed;  // the DT_NEEDED name (the library's soname)
  std::string path;    // the file that name resolves to
  std::string sha256;  // of `memfd`'s bytes
  int memfd = -1;      // a sealed copy (sealed_copy), owned by the caller; -1 when already loaded
};

// Finds the dependencies of the ELF object held by `fd` (a sealed copy of the file in the
// directory `origin`, which is what $ORIGIN stands for), as the dynamic loader searches for
// each DT_NEEDED name that is not already loaded in this process: DT_RPATH (when there is no
// DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH, then the system directories (/lib, /usr/lib, their
// multiarch and lib64 directories and those /etc/ld.so.conf names, which ld.so.cache indexes).
// Refuses (returns why, as one phrase with a hint) a relative RUNPATH or RPATH entry, an $ORIGIN
// entry that leaves `origin`, a $LIB or $PLATFORM entry, a RUNPATH or RPATH directory that does
// not exist, an empty or relative LD_LIBRARY_PATH entry (the dynamic loader reads those against
// the working directory), and, with `check_permissions`, any RUNPATH, RPATH or LD_LIBRARY_PATH
// directory searched, or library found, that fails unsafe_path. A library found in a system
// directory is trusted with what it needs. Any other is a non-system dependency: it must have
// the soname its DT_NEEDED names (so that, loaded first from its sealed copy, the dynamic loader
// takes it for that name instead of searching), and its own dependencies are found the same
// way. Appends them to `out` in loading order (a library after those it needs).
std::string find_dependencies(int fd, const std::string& origin, bool check_permissions,
                              std::vector<Dependency>* out);

// find_dependencies for `keel plugins install`: the plugin file open at `fd`, in `dir` (what
// $ORIGIN stands for), with the permission checks unless KEEL_ALLOW_WRITABLE_PLUGINS=1; ""
// or why not (one phrase with a hint). Loads nothing.
std::string install_dependency_problem(int fd, const std::string& dir);

// Loads a non-system dependency from its sealed copy (RTLD_NOW | RTLD_LOCAL), once per soname
// for the process's lifetime, so that the dynamic loader finds it by its soname when a plugin
// that needs it is loaded. Returns "" or dlerror()'s text. Takes `dep.memfd` (keeps or closes
// it).
std::string preload_dependency(Dependency& dep);

// The record of a dependency preloaded earlier in this process under `soname`: a later plugin
// that needs it gets that copy (find_dependencies reports it with memfd -1), or nullptr.
const Dependency* preloaded_dependency(const std::string& soname);

}  // namespace keel
