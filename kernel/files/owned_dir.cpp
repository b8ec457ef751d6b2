#include "files/owned_dir.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "error.hpp"
#include "files/files.hpp"
#include "unique_fd.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

constexpr const char* kOwnHint =
    "; hint: choose an output_dir that only you can write (--set run.output_dir=DIR), under "
    "directories that belong to you or root and that others cannot write (or that are sticky, "
    "like /tmp)";

// kOwnHint for a directory of `use`.
std::string own_hint(const DirUse& use) {
  if (use.flag.empty()) return kOwnHint;
  return "; hint: give " + use.flag + " a directory that only you can write, under directories "
         "that belong to you or root and that others cannot write (or that are sticky, like "
         "/tmp)";
}

// "set [run] output_dir to `what`", or for a directory of another use "give --output `what`".
std::string set_hint(const DirUse& use, const std::string& what) {
  return (use.flag.empty() ? "set [run] output_dir to " : "give " + use.flag + " ") + what;
}

std::string mode_text(mode_t mode) {
  char m[8];
  std::snprintf(m, sizeof m, "%04o", static_cast<unsigned>(mode & 07777));
  return m;
}

// The user's private group: named like the user, the user's primary group, no members listed.
bool private_group(gid_t gid) {
  std::vector<char> buf(1 << 16);
  struct passwd pw {}, *pwp = nullptr;
  if (getpwuid_r(geteuid(), &pw, buf.data(), buf.size() / 2, &pwp) != 0 || !pwp) return false;
  if (pw.pw_gid != gid) return false;
  struct group gr {}, *grp = nullptr;
  char* gbuf = buf.data() + buf.size() / 2;
  if (getgrgid_r(gid, &gr, gbuf, buf.size() / 2, &grp) != 0 || !grp) return false;
  if (std::strcmp(gr.gr_name, pw.pw_name) != 0) return false;
  for (char** m = gr.gr_mem; m && *m; ++m)
    if (std::strcmp(*m, pw.pw_name) != 0) return false;
  return true;
}

std::string errno_text() { return std::strerror(errno); }

// Checks the existing prefixes of `p` (absolute) as directories on the way to a run directory.
void check_prefixes(const fs::path& p, const std::string& run_path, const DirUse& use) {
  fs::path prefix;
  for (const auto& part : p) {
    prefix /= part;
    struct stat st {};
    if (::stat(prefix.c_str(), &st) != 0) return;  // missing from here on: keel creates it
    const std::string why = untrusted_directory(st, false);
    if (!why.empty())
      throw Error(use.what + " " + run_path + ": " + prefix.string() + " on the way to it " +
                  why + own_hint(use));
  }
}

// write_file's error line: `path` could not be written or renamed into place (`why`).
std::string cannot_replace(const std::string& path, const std::string& why, const DirUse& use) {
  return "cannot write " + path + " (" + why + "); hint: " + set_hint(use, "a writable directory");
}

// A unique name for a temporary or probe file of this process.
std::string own_name(const std::string& stem) {
  static std::atomic<unsigned> counter{0};
  return stem + "." + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

}  // namespace

std::string untrusted_directory(const struct stat& st, bool is_run_dir) {
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  const uid_t me = ::geteuid();
  if (st.st_uid != me && (is_run_dir || st.st_uid != 0))
    return "belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  const bool others = st.st_mode & S_IWOTH;
  const bool group = (st.st_mode & S_IWGRP) && !private_group(st.st_gid);
  if (!others && !group) return "";
  if (!is_run_dir && (st.st_mode & S_ISVTX)) return "";  // others cannot rename or remove ours
  return std::string("is writable by ") + (others ? "every user" : "its group") + " (mode " +
         mode_text(st.st_mode) + (is_run_dir ? ")" : ", no sticky bit)");
}

// ---- CreatedEntries ----

CreatedEntries::~CreatedEntries() { forget(); }

void CreatedEntries::add(int dir_fd, const std::string& name, const std::string& path, dev_t dev,
                         ino_t ino, bool is_dir) {
  const int fd = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw Error(path + ": cannot keep track of it: " + errno_text());
  entries_.push_back({fd, name, path, dev, ino, is_dir});
}

bool CreatedEntries::contains(dev_t dev, ino_t ino) const {
  return std::any_of(entries_.begin(), entries_.end(),
                     [&](const Entry& e) { return e.dev == dev && e.ino == ino; });
}

void CreatedEntries::add_open_files(const OwnedDir& dir,
                                    const std::vector<std::pair<dev_t, ino_t>>& before) {
  const std::set<std::pair<dev_t, ino_t>> had(before.begin(), before.end());
  std::set<std::pair<dev_t, ino_t>> open;
  if (DIR* fds = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(fds)) {
      struct stat st {};
      if (e->d_name[0] == '.' || ::fstat(std::atoi(e->d_name), &st) != 0) continue;
      if (S_ISREG(st.st_mode)) open.insert({st.st_dev, st.st_ino});
    }
    ::closedir(fds);
  }
  for (const std::string& name : dir.entries()) {
    struct stat st {};
    if (::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      continue;
    const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
    if (st.st_size == 0 && open.count(id) && !had.count(id) && !contains(st.st_dev, st.st_ino))
      add(dir.fd(), name, dir.path_of(name), st.st_dev, st.st_ino, false);
  }
}

void CreatedEntries::renamed(dev_t dev, ino_t ino, const std::string& to,
                             const std::string& to_path) {
  for (Entry& e : entries_)
    if (e.dev == dev && e.ino == ino) {
      e.name = to;
      e.path = to_path;
    }
}

void CreatedEntries::erase(dev_t dev, ino_t ino) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->dev == dev && it->ino == ino) {
      ::close(it->dir_fd);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

std::string CreatedEntries::remove_all() {
  std::string left;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    struct stat st {};
    if (::fstatat(it->dir_fd, it->name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (st.st_dev != it->dev || st.st_ino != it->ino) continue;  // the name is another's now
    if (::unlinkat(it->dir_fd, it->name.c_str(), it->is_dir ? AT_REMOVEDIR : 0) == 0) continue;
    // A directory that holds what this process did not put there stays, unnamed.
    if (it->is_dir && (errno == ENOTEMPTY || errno == EEXIST)) continue;
    left += (left.empty() ? "" : ", ") + it->path;
  }
  forget();
  return left;
}

void CreatedEntries::forget() {
  for (const Entry& e : entries_) ::close(e.dir_fd);
  entries_.clear();
}

// ---- OwnedDir ----

OwnedDir OwnedDir::open(const std::string& path_text, CreatedEntries& created, const DirUse& use) {
  fs::path path = fs::path(path_text).lexically_normal();
  if (!path.has_filename() && path.has_relative_path()) path = path.parent_path();  // "/a/b/"
  const std::string shown = path.string();
  if (!path.is_absolute())
    throw Error(use.what + " " + shown + ": not an absolute path" + own_hint(use));
  if (!path.has_filename())
    throw Error(use.what + " " + shown + ": the root directory cannot be a " + use.what +
                "; hint: " + set_hint(use, "a directory of its own"));
  // The directories a symlink on the way leads through: every prefix of the parent's canonical
  // path. (Those of the path as given are checked below, on the descriptors the walk opens.)
  std::error_code ec;
  const fs::path canonical_parent = fs::weakly_canonical(path.parent_path(), ec);
  if (!ec) check_prefixes(canonical_parent, shown, use);

  UniqueFd dir(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) throw Error(use.what + " " + shown + ": cannot open /: " + errno_text());
  fs::path at = "/";
  std::vector<fs::path> parts(++path.begin(), path.end());
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    const std::string name = parts[i].string();
    const fs::path here = at / name;
    {
      struct stat st {};
      if (::fstat(dir.get(), &st) != 0)
        throw Error(use.what + " " + shown + ": cannot read " + at.string() + ": " +
                    errno_text());
      const std::string why = untrusted_directory(st, false);
      if (!why.empty())
        throw Error(use.what + " " + shown + ": " + at.string() + " on the way to it " + why +
                    own_hint(use));
    }
    bool made = false;
    if (::mkdirat(dir.get(), name.c_str(), 0755) == 0) {
      made = true;
    } else if (errno != EEXIST) {
      throw Error(use.what + " " + shown + ": cannot create " + here.string() + " (" +
                  errno_text() + "); hint: " + set_hint(use, "a writable directory"));
    }
    // Directories on the way may be symlinks (checked through their canonical path above);
    // the run directory itself may not.
    UniqueFd next(::openat(dir.get(), name.c_str(),
                     O_RDONLY | O_DIRECTORY | O_CLOEXEC | (last ? O_NOFOLLOW : 0)));
    if (next.get() < 0) {
      const int err = errno;
      struct stat lst {};
      const bool link = ::fstatat(dir.get(), name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
                        S_ISLNK(lst.st_mode);
      if (last && link)
        throw Error(use.what + " " + shown + " is a symbolic link; keel does not follow one "
                    "for " + (use.flag.empty() ? "a run directory" : use.flag) + "; hint: " +
                    set_hint(use, "the directory it points to, after checking who made it"));
      if (err == ENOTDIR)
        throw Error(use.what + " " + shown + ": cannot create it (" + here.string() +
                    " is a file, not a directory); hint: " +
                    set_hint(use, "a writable directory"));
      throw Error(use.what + " " + shown + ": cannot open " + here.string() + " (" +
                  std::strerror(err) + "); hint: " + set_hint(use, "a writable directory"));
    }
    struct stat st {};
    if (::fstat(next.get(), &st) != 0)
      throw Error(use.what + " " + shown + ": cannot read " + here.string() + ": " +
                  errno_text());
    if (made) created.add(dir.get(), name, here.string(), st.st_dev, st.st_ino, true);
    if (last) {
      const std::string why = untrusted_directory(st, !use.sticky_ok);
      if (!why.empty()) throw Error(use.what + " " + shown + " " + why + own_hint(use));
    }
    dir.reset(next.release());
    at = here;
  }
  return OwnedDir(dir.release(), shown, use);
}

OwnedDir::OwnedDir(OwnedDir&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), use_(std::move(other.use_)) {}

OwnedDir& OwnedDir::operator=(OwnedDir&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    use_ = std::move(other.use_);
  }
  return *this;
}

OwnedDir::~OwnedDir() {
  if (fd_ >= 0) ::close(fd_);
}

OwnedDir OwnedDir::subdir(const std::string& name, CreatedEntries& created) const {
  const std::string shown = path_of(name);
  const bool made = ::mkdirat(fd_, name.c_str(), 0755) == 0;
  if (!made && errno != EEXIST)
    throw Error(shown + ": cannot create it (" + errno_text() +
                "); hint: " + set_hint(use_, "a writable directory"));
  UniqueFd fd(::openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0)
    throw Error(shown + ": cannot open it as a directory (" +
                (errno == ELOOP ? std::string("it is a symbolic link") : errno_text()) +
                "); keel does not follow symlinks in a run directory; hint: remove it, after "
                "checking who made it");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw Error(shown + ": cannot read it: " + errno_text());
  if (made) created.add(fd_, name, shown, st.st_dev, st.st_ino, true);
  const std::string why = untrusted_directory(st, true);
  if (!why.empty()) throw Error(shown + " " + why + own_hint(use_));
  return OwnedDir(fd.release(), shown, use_);
}

OwnedDir OwnedDir::new_subdir(const std::string& stem, CreatedEntries& created) const {
  for (int i = 0; i < 1000; ++i) {
    const std::string name = i == 0 ? stem : stem + "-" + std::to_string(i);
    if (::mkdirat(fd_, name.c_str(), 0755) != 0) {
      if (errno == EEXIST) continue;
      throw Error(path_of(name) + ": cannot create it (" + errno_text() +
                  "); hint: " + set_hint(use_, "a writable directory"));
    }
    UniqueFd fd(::openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0)
      throw Error(path_of(name) + ": cannot open the directory keel just created (" +
                  errno_text() + "); hint: check who else writes " + path_);
    created.add(fd_, name, path_of(name), st.st_dev, st.st_ino, true);
    return OwnedDir(fd.release(), path_of(name), use_);
  }
  throw Error(path_of(stem) + "-999 exists too; hint: move earlier ones out of " + path_);
}

int OwnedDir::open_file(const std::string& name, int flags, CreatedEntries& created,
                      bool* existed) const {
  const std::string shown = path_of(name);
  constexpr int kBase = O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  UniqueFd fd(::openat(fd_, name.c_str(), kBase | O_CREAT | O_EXCL, 0644));
  bool was_there = false;
  if (fd.get() < 0 && errno == EEXIST) {
    if (flags & O_EXCL) return -1;
    was_there = true;
    fd.reset(::openat(fd_, name.c_str(), kBase | (flags & O_APPEND)));
  }
  if (fd.get() < 0) {
    if (errno == ELOOP)
      throw Error(shown + " is a symbolic link; keel does not write through symlinks in " +
                  (use_.flag.empty() ? "a run directory" : "the directory of " + use_.flag) +
                  "; hint: remove it, after checking who made it and where it points");
    throw Error(shown + ": cannot write it (" + errno_text() +
                "); hint: " + set_hint(use_, "a writable directory"));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw Error(shown + ": cannot read it: " + errno_text());
  if (!was_there) {
    created.add(fd_, name, shown, st.st_dev, st.st_ino, false);
  } else if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1) {
    throw Error(fmt::format(
        "{} is not a regular file of ours with one link ({}); keel does not write it; hint: "
        "remove it, after checking who made it",
        shown, !S_ISREG(st.st_mode)        ? std::string("another kind of file")
               : st.st_uid != ::geteuid() ? fmt::format("uid {}", st.st_uid)
                                          : fmt::format("{} links", st.st_nlink)));
  }
  if (was_there && (flags & O_TRUNC) && ::ftruncate(fd.get(), 0) != 0)
    throw Error(shown + ": cannot write it (" + errno_text() + ")");
  // Blocking writes from here on (O_NONBLOCK only kept a FIFO from blocking the open).
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  if (existed) *existed = was_there;
  return fd.release();
}

void OwnedDir::write_file(const std::string& name, const std::string& text,
                        CreatedEntries& created) const {
  const std::string tmp = own_name("." + name) + ".tmp";
  UniqueFd fd(open_file(tmp, O_EXCL, created));
  if (fd.get() < 0) throw Error(path_of(tmp) + ": exists already; hint: remove it");
  struct stat st {}, old {};
  ::fstat(fd.get(), &st);
  const bool replacing = ::fstatat(fd_, name.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0;
  // fsync before the rename and of the directory after it (files/files.hpp's durable_rename).
  const bool ok = write_all(fd.get(), text) && ::fsync(fd.get()) == 0;
  if (!ok || ::close(fd.release()) != 0 ||
      ::renameat(fd_, tmp.c_str(), fd_, name.c_str()) != 0 || ::fsync(fd_) != 0) {
    const std::string why = errno_text();
    ::unlinkat(fd_, tmp.c_str(), 0);
    created.erase(st.st_dev, st.st_ino);
    throw Error(cannot_replace(path_of(name), why, use_));
  }
  // A file that replaced an earlier one is kept even when the start fails: removing it would
  // not bring the earlier one back.
  if (replacing)
    created.erase(st.st_dev, st.st_ino);
  else
    created.renamed(st.st_dev, st.st_ino, name, path_of(name));
}

void OwnedDir::check_replaceable(const std::string& name) const {
  struct stat st {};
  // renameat replaces a file or a symlink of that name, and fails on a directory.
  if (::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
    throw Error(cannot_replace(path_of(name), std::strerror(EISDIR), use_));
}

bool OwnedDir::has(const std::string& name) const {
  struct stat st {};
  return ::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

std::vector<std::string> OwnedDir::entries(const std::string& sub) const {
  std::vector<std::string> names;
  const int fd = ::openat(fd_, sub.empty() ? "." : sub.c_str(),
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return names;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return names;
  }
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
      names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

std::vector<std::pair<dev_t, ino_t>> OwnedDir::identities() const {
  std::vector<std::pair<dev_t, ino_t>> ids;
  for (const std::string& name : entries()) {
    struct stat st {};
    if (::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
      ids.emplace_back(st.st_dev, st.st_ino);
  }
  return ids;
}

void OwnedDir::probe_writable(CreatedEntries& created) const {
  const std::string name = own_name(".keel-write-check");
  UniqueFd fd(open_file(name, O_EXCL, created));
  if (fd.get() < 0) throw Error(path_of(name) + ": exists already; hint: remove it");
  struct stat st {};
  const bool written = write_all(fd.get(), "keel\n") && ::fstat(fd.get(), &st) == 0 &&
                       st.st_size == 5 && ::close(fd.release()) == 0;
  const std::string why = errno_text();
  if (::unlinkat(fd_, name.c_str(), 0) == 0 && written) created.erase(st.st_dev, st.st_ino);
  if (!written)
    throw Error(use_.what + " " + path_ + ": cannot write to it (" + why +
                "); hint: " + set_hint(use_, "a writable directory"));
}

}  // namespace keel
