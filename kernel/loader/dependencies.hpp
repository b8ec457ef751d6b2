// The libraries a plugin brings with it: found as the dynamic loader would find them, checked
// (safe_path.hpp), copied (sealed_copy.hpp) and loaded from those copies. registry.hpp says how
// discovery uses them; package.cpp checks a package's dependencies at install with them.
#pragma once

#include <string>
#include <vector>

namespace keel {

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
