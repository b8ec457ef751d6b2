// Directories we own (OwnedDir): the run directory, a checkpoint's, `keel prepare`'s and
// `keel export`'s output, opened so that another local user cannot redirect what keel writes,
// and cleaned up after a failed start by removing exactly what this process created. (How the
// run uses its directory is run/run_directory.hpp.)
//
// The rule, checked on the directory itself (fstat of the descriptor the run then works
// through) and on every existing directory on the way to it (each prefix of the path as given
// and of its canonical form, so the directories a symlink on the way leads through too):
// - a directory on the way belongs to us or to root, and is not writable by its group or by
//   other users, unless its sticky bit is set: then others can add entries to it but cannot
//   rename or remove ours, so keel may create its directory there (/tmp, /var/tmp);
// - the run directory itself, when it exists, belongs to us (the effective uid) and is
//   writable by no one else, sticky bit or not: whoever can add an entry to it could plant a
//   symlink named like a file the run writes, or a directory of their own in it;
// - the run directory is not a symlink (it is opened with O_NOFOLLOW).
// "Writable by its group" does not count for a user's private group (the group of the user's
// own name, the user's primary group, listing no other member), which umask 002 systems give
// every directory a user creates. Directories keel creates get mode 0755 less the umask.
//
// The run directory's own files (manifest.resolved.toml, plugins.json, run.log, the write
// probe, checkpoints/, an evaluation's eval-<time>/) are created with openat/mkdirat relative
// to the run directory's descriptor, O_NOFOLLOW, and an existing one must be a regular file
// (resp. a directory) of ours: a symlink planted under such a name is refused, never followed.
// The checkpoint store and plugins (metric sinks, profilers) open their files by path inside
// the run directory; that is safe because the rule above leaves no other user (root aside) a
// way to plant anything there or to swap a directory on the way.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "files/files.hpp"  // write_all (run/run_directory.cpp takes it from here)

namespace keel {

class OwnedDir;

// What a directory OwnedDir opens is for: how its messages name it and which rule applies to the
// directory itself. The defaults are a run directory's. keel's other outputs (keel report's
// page, keel prepare's token files, keel export's directory) are opened with their own.
struct DirUse {
  std::string what = "run directory";  // how messages name it
  // What hints tell the user to change: empty for a run directory ([run] output_dir), else the
  // command's flag ("--output").
  std::string flag;
  // Whether the directory itself may be writable by others when sticky (/tmp), like a directory
  // on the way. True where keel only writes single files into it with write_file (each created
  // exclusively, then renamed into place: in a sticky directory renaming over another user's
  // entry fails) or creates one new subdirectory it then renames (keel export), never a tree of
  // files that plugins open by path.
  bool sticky_ok = false;
};

// What one process created in and around a run directory, each entry identified by device and
// inode when it was created, so that a failed start removes only those: an entry whose name now
// refers to something else is left alone, and a directory is removed only when it is empty
// once its own entries went (never one that holds what another run put there).
class CreatedEntries {
 public:
  CreatedEntries() = default;
  ~CreatedEntries();
  CreatedEntries(const CreatedEntries&) = delete;
  CreatedEntries& operator=(const CreatedEntries&) = delete;

  // Records `name` in the directory `dir_fd` (duplicated here), shown as `path`.
  void add(int dir_fd, const std::string& name, const std::string& path, dev_t dev, ino_t ino,
           bool is_dir);
  // Whether (dev, ino) is recorded.
  bool contains(dev_t dev, ino_t ino) const;
  // Records the regular files directly in `dir` that this process holds open, that are empty,
  // and whose (device, inode) is not in `before` (the directory's entries when the run opened
  // it): files its components created during the start (a metric sink's metrics.jsonl, which
  // holds no record before training starts). One with content stays: another run sharing the
  // directory (--overwrite) may have written its records into it.
  void add_open_files(const OwnedDir& dir, const std::vector<std::pair<dev_t, ino_t>>& before);
  // An entry renamed from `from` to `to` in the same directory (write_file's temporary file).
  void renamed(dev_t dev, ino_t ino, const std::string& to, const std::string& to_path);
  // Removes the record of (dev, ino) (an entry this process removed itself).
  void erase(dev_t dev, ino_t ino);
  // Removes the entries, newest first. Returns the paths of this process's entries that could
  // not be removed ("" when everything went), comma-separated; a directory left because
  // something it did not create is in it is not named (it was not this process's alone).
  std::string remove_all();
  // Forgets the entries (the run started: they are its files now).
  void forget();
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    int dir_fd;
    std::string name, path;
    dev_t dev;
    ino_t ino;
    bool is_dir;
  };
  std::vector<Entry> entries_;
};

// An open directory of ours (a run directory, a subdirectory of one, or an output directory),
// read and written through its descriptor.
class OwnedDir {
 public:
  // Opens directory `path` (absolute), creating it and its missing parents (each with mkdirat
  // relative to its parent's descriptor); refuses, with one line and a hint, a directory the
  // rule above does not trust. What it creates is recorded in `created`. Throws keel::Error.
  // `use`: what the directory is for (messages; the sticky exception for the directory itself).
  static OwnedDir open(const std::string& path, CreatedEntries& created, const DirUse& use = {});

  OwnedDir(OwnedDir&& other) noexcept;
  OwnedDir& operator=(OwnedDir&& other) noexcept;
  ~OwnedDir();
  OwnedDir(const OwnedDir&) = delete;
  OwnedDir& operator=(const OwnedDir&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::string path_of(const std::string& name) const { return path_ + "/" + name; }

  // Subdirectory `name`: created (recorded) when missing, else opened O_NOFOLLOW and checked
  // like the run directory itself.
  OwnedDir subdir(const std::string& name, CreatedEntries& created) const;
  // A new subdirectory `<stem>`, or `<stem>-1`, `<stem>-2`, ... when that name exists
  // (mkdirat: never an existing one). Recorded in `created`.
  OwnedDir new_subdir(const std::string& stem, CreatedEntries& created) const;

  // Opens file `name` for writing: O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | `flags`
  // (O_EXCL, O_TRUNC or O_APPEND), mode 0644 less the umask. A newly created file is recorded
  // in `created`; an existing one must be a regular file of ours with one link. A symlink,
  // FIFO or other entry of that name is refused: keel::Error naming it, with a hint. Returns
  // the descriptor; *existed (when given) tells whether the file was there before.
  int open_file(const std::string& name, int flags, CreatedEntries& created,
                bool* existed = nullptr) const;
  // Writes `text` as file `name`, replacing what has that name: written to a new temporary file
  // (open_file with O_EXCL) first, fsync'd, then renamed over `name` (renameat replaces a
  // symlink of that name itself, never its target), and the directory fsync'd. Recorded in
  // `created` when no file of that name was there before. Throws keel::Error.
  void write_file(const std::string& name, const std::string& text,
                  CreatedEntries& created) const;
  // Throws the keel::Error write_file(name, ...) would end with when the entry `name` cannot be
  // replaced (a directory), writing nothing: how `keel validate` checks a run's files.
  void check_replaceable(const std::string& name) const;
  // Whether an entry `name` exists (lstat: a symlink counts).
  bool has(const std::string& name) const;
  // The names of the entries of the directory, or of its subdirectory `sub` (not followed when
  // a symlink: then none), without . and ..
  std::vector<std::string> entries(const std::string& sub = "") const;
  // (device, inode) of every entry (lstat).
  std::vector<std::pair<dev_t, ino_t>> identities() const;
  // Checks that a file of ours can be created and written here (a probe file with its own name,
  // removed again). Throws keel::Error.
  void probe_writable(CreatedEntries& created) const;

 private:
  OwnedDir(int fd, std::string path, DirUse use)
      : fd_(fd), path_(std::move(path)), use_(std::move(use)) {}
  int fd_ = -1;
  std::string path_;
  DirUse use_;
};

// Why a directory on the way to a run directory (`is_run_dir` false) or the run directory
// itself (true) with status `st` is not trusted under the rule above, or "" when it is.
std::string untrusted_directory(const struct stat& st, bool is_run_dir);

}  // namespace keel
