#include "safe_path.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <vector>

namespace fs = std::filesystem;

namespace keel {
namespace {

bool trusted_owner(uid_t uid) { return uid == getuid() || uid == 0; }

std::string mode_text(const struct stat& st) {
  char m[8];
  std::snprintf(m, sizeof m, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return m;
}

std::string writable_by(const struct stat& st) {
  return (st.st_mode & S_IWOTH) ? "every user" : "its group";
}

bool others_write(const struct stat& st) { return (st.st_mode & (S_IWGRP | S_IWOTH)) != 0; }

std::string parent_of(const std::string& resolved) {
  const size_t slash = resolved.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : resolved.substr(0, slash);
}

std::string joined(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

// A directory entered on the way: its owner; writable by others only when sticky.
std::string check_passed_dir(const std::string& dir, const struct stat& st) {
  if (!trusted_owner(st.st_uid))
    return fmt::format("{}, a directory on its path, belongs to another user (uid {})", dir,
                       st.st_uid);
  if (others_write(st) && !(st.st_mode & S_ISVTX))
    return dir + ", a directory on its path, is writable by " + writable_by(st) + " (mode " +
           mode_text(st) + ") without the sticky bit";
  return "";
}

// The directory holding the last name: never writable by others.
std::string check_holder(const std::string& dir, const struct stat& st) {
  if (others_write(st))
    return "its directory " + dir + " is writable by " + writable_by(st) + " (mode " +
           mode_text(st) + ")" +
           ((st.st_mode & S_ISVTX) ? ": another user can add names to it (the sticky bit "
                                     "only protects names that are not theirs)"
                                   : "");
  return "";
}

// The walk of unsafe_path: the names still to visit, the directory reached and its lstat.
class PathWalk {
 public:
  PathWalk(bool is_dir, struct stat* final) : is_dir_(is_dir), final_(final) {}

  std::string run(const std::string& absolute) {
    push_components(absolute);
    if (lstat("/", &cur_st_) != 0) return std::string("cannot check /: ") + std::strerror(errno);
    if (std::string bad = check_passed_dir("/", cur_st_); !bad.empty()) return bad;
    if (todo_.empty()) return end_at_directory("/", cur_st_, true);
    while (!todo_.empty()) {
      const std::string name = todo_.front();
      todo_.pop_front();
      if (std::string bad = name == ".." ? up() : enter(name); !bad.empty()) return bad;
    }
    return "";
  }

 private:
  // Puts the components of `path` in front of those still to visit.
  void push_components(const std::string& path) {
    std::deque<std::string> parts;
    size_t start = 0;
    while (start <= path.size()) {
      const size_t slash = path.find('/', start);
      const std::string part =
          path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
      if (!part.empty() && part != ".") parts.push_back(part);
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    todo_.insert(todo_.begin(), parts.begin(), parts.end());
  }

  // The path ends at the directory `dir` (`at_root`: at / itself, or by a link to it).
  std::string end_at_directory(const std::string& dir, const struct stat& st,
                               bool at_root = false) {
    if (!is_dir_) return at_root ? "/ is not a file" : dir + " is a directory";
    if (std::string bad = check_holder(dir, st); !bad.empty()) return bad;
    if (final_) *final_ = st;
    return "";
  }

  std::string up() {
    cur_ = parent_of(cur_);
    if (lstat(cur_.c_str(), &cur_st_) != 0)
      return "cannot check " + cur_ + ": " + std::strerror(errno);
    return todo_.empty() ? end_at_directory(cur_, cur_st_) : "";
  }

  std::string enter(const std::string& name) {
    const bool last = todo_.empty();
    const std::string next = joined(cur_, name);
    struct stat st;
    if (lstat(next.c_str(), &st) != 0)
      return "cannot check " + next + ": " + std::strerror(errno);
    if (last && !is_dir_)  // the directory holding the file, or the link that names it
      if (std::string bad = check_holder(cur_, cur_st_); !bad.empty()) return bad;
    if (!trusted_owner(st.st_uid))
      return next + (S_ISLNK(st.st_mode) ? ", a symbolic link on its path," : "") +
             (S_ISDIR(st.st_mode) ? ", a directory on its path," : "") +
             " belongs to another user (uid " + std::to_string(st.st_uid) + ")";
    if (S_ISLNK(st.st_mode)) return follow(next);
    if (S_ISDIR(st.st_mode)) return enter_directory(next, st, last);
    if (!last || is_dir_) return next + " is not a directory";
    if (others_write(st))
      return "the file is writable by " + writable_by(st) + " (mode " + mode_text(st) + ")";
    if (final_) *final_ = st;
    return "";
  }

  std::string follow(const std::string& link) {
    if (++links_ > 40) return "too many symbolic links on its path";
    std::vector<char> target(PATH_MAX + 1);
    const ssize_t n = readlink(link.c_str(), target.data(), PATH_MAX);
    if (n < 0) return "cannot read the link " + link + ": " + std::strerror(errno);
    const std::string to(target.data(), static_cast<size_t>(n));
    if (!to.empty() && to[0] == '/') {
      cur_ = "/";
      lstat("/", &cur_st_);
    }
    push_components(to);
    return todo_.empty() ? end_at_directory("/", cur_st_, true) : "";  // a link to / ends there
  }

  std::string enter_directory(const std::string& dir, const struct stat& st, bool last) {
    // The directory holding the path's last name says so; the others are on its way.
    const bool holds_last = todo_.size() == 1 && todo_.front() != ".." && !is_dir_;
    if (std::string bad = holds_last ? check_holder(dir, st) : ""; !bad.empty()) return bad;
    if (std::string bad = check_passed_dir(dir, st); !bad.empty()) return bad;
    cur_ = dir;
    cur_st_ = st;
    return last ? end_at_directory(dir, st) : "";
  }

  const bool is_dir_;
  struct stat* const final_;
  std::deque<std::string> todo_;
  std::string cur_ = "/";
  struct stat cur_st_ {};
  int links_ = 0;
};

}  // namespace

std::string unsafe_path(const std::string& path_in, bool is_dir, struct stat* final) {
  if (path_in.empty()) return "an empty path";
  std::string path = path_in;
  if (path[0] != '/') {
    std::error_code ec;
    const fs::path cwd = fs::current_path(ec);
    if (ec) return "the working directory cannot be read: " + ec.message();
    path = (cwd / path).string();
  }
  return PathWalk(is_dir, final).run(path);
}

}  // namespace keel
