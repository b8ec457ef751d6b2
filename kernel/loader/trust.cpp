#include "trust.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>

#include "digest.hpp"
#include "elf.hpp"

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

void push_components(const std::string& path, std::deque<std::string>* todo) {
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
  todo->insert(todo->begin(), parts.begin(), parts.end());
}

}  // namespace

std::string unsafe_path(const std::string& path_in, bool is_dir, struct stat* final) {
  std::string path = path_in;
  if (path.empty()) return "an empty path";
  if (path[0] != '/') {
    std::error_code ec;
    const fs::path cwd = fs::current_path(ec);
    if (ec) return "the working directory cannot be read: " + ec.message();
    path = (cwd / path).string();
  }
  std::deque<std::string> todo;
  push_components(path, &todo);
  std::string cur = "/";
  struct stat cur_st;
  if (lstat("/", &cur_st) != 0) return std::string("cannot check /: ") + std::strerror(errno);
  // Checks a directory entered on the way (owner; writable by others only when sticky).
  auto check_dir = [](const std::string& dir, const struct stat& st) -> std::string {
    if (!trusted_owner(st.st_uid))
      return dir + ", a directory on its path, belongs to another user (uid " +
             std::to_string(st.st_uid) + ")";
    if (others_write(st) && !(st.st_mode & S_ISVTX))
      return dir + ", a directory on its path, is writable by " + writable_by(st) + " (mode " +
             mode_text(st) + ") without the sticky bit";
    return "";
  };
  // The directory holding the last name: never writable by others.
  auto check_holder = [](const std::string& dir, const struct stat& st) -> std::string {
    if (others_write(st))
      return "its directory " + dir + " is writable by " + writable_by(st) + " (mode " +
             mode_text(st) + ")" +
             ((st.st_mode & S_ISVTX) ? ": another user can add names to it (the sticky bit "
                                       "only protects names that are not theirs)"
                                     : "");
    return "";
  };
  if (std::string bad = check_dir("/", cur_st); !bad.empty()) return bad;
  if (todo.empty()) {
    if (!is_dir) return "/ is not a file";
    if (std::string bad = check_holder("/", cur_st); !bad.empty()) return bad;
    if (final) *final = cur_st;
    return "";
  }
  int links = 0;
  while (!todo.empty()) {
    const std::string name = todo.front();
    todo.pop_front();
    if (name == "..") {
      cur = parent_of(cur);
      if (lstat(cur.c_str(), &cur_st) != 0)
        return "cannot check " + cur + ": " + std::strerror(errno);
      if (todo.empty()) {  // the path ends at this directory
        if (!is_dir) return cur + " is a directory";
        if (std::string bad = check_holder(cur, cur_st); !bad.empty()) return bad;
        if (final) *final = cur_st;
      }
      continue;
    }
    const bool last = todo.empty();
    const std::string next = joined(cur, name);
    struct stat st;
    if (lstat(next.c_str(), &st) != 0)
      return "cannot check " + next + ": " + std::strerror(errno);
    if (last && !is_dir)  // the directory holding the file, or the link that names it
      if (std::string bad = check_holder(cur, cur_st); !bad.empty()) return bad;
    if (!trusted_owner(st.st_uid))
      return next + (S_ISLNK(st.st_mode) ? ", a symbolic link on its path," : "") +
             (S_ISDIR(st.st_mode) ? ", a directory on its path," : "") +
             " belongs to another user (uid " + std::to_string(st.st_uid) + ")";
    if (S_ISLNK(st.st_mode)) {
      if (++links > 40) return "too many symbolic links on its path";
      std::vector<char> target(PATH_MAX + 1);
      const ssize_t n = readlink(next.c_str(), target.data(), PATH_MAX);
      if (n < 0) return "cannot read the link " + next + ": " + std::strerror(errno);
      const std::string to(target.data(), static_cast<size_t>(n));
      if (!to.empty() && to[0] == '/') {
        cur = "/";
        lstat("/", &cur_st);
      }
      push_components(to, &todo);
      if (todo.empty()) {  // a link to "/" ends the path at /
        if (!is_dir) return "/ is not a file";
        if (std::string bad = check_holder("/", cur_st); !bad.empty()) return bad;
        if (final) *final = cur_st;
      }
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      // The directory holding the path's last name says so; the others are on its way.
      const bool holds_last = todo.size() == 1 && todo.front() != ".." && !is_dir;
      if (std::string bad = holds_last ? check_holder(next, st) : ""; !bad.empty()) return bad;
      if (std::string bad = check_dir(next, st); !bad.empty()) return bad;
      cur = next;
      cur_st = st;
      if (last) {
        if (!is_dir) return next + " is a directory";
        if (std::string bad = check_holder(next, st); !bad.empty()) return bad;
        if (final) *final = st;
      }
      continue;
    }
    if (!last) return next + " is not a directory";
    if (is_dir) return next + " is not a directory";
    if (others_write(st))
      return "the file is writable by " + writable_by(st) + " (mode " + mode_text(st) + ")";
    if (final) *final = st;
  }
  return "";
}

namespace {

// Raises RLIMIT_FSIZE so that `size` bytes can be written, for its lifetime (sealed_copy).
class FileSizeLimitAtLeast {
 public:
  explicit FileSizeLimitAtLeast(off_t size) {
    if (getrlimit(RLIMIT_FSIZE, &old_) != 0 || old_.rlim_cur == RLIM_INFINITY ||
        static_cast<rlim_t>(size) <= old_.rlim_cur)
      return;
    struct rlimit raised = old_;
    raised.rlim_cur = old_.rlim_max;
    if (old_.rlim_max != RLIM_INFINITY && static_cast<rlim_t>(size) > old_.rlim_max)
      raised.rlim_cur = raised.rlim_max = RLIM_INFINITY;  // needs CAP_SYS_RESOURCE
    if (setrlimit(RLIMIT_FSIZE, &raised) == 0)
      changed_ = true;
    else
      short_by_ = true;
  }
  ~FileSizeLimitAtLeast() {
    if (changed_) setrlimit(RLIMIT_FSIZE, &old_);
  }
  // Why the limit stays too low, or "".
  std::string problem(off_t size) const {
    if (!short_by_) return "";
    return "cannot copy it into memory: it is " + std::to_string(size / 1024) + " KiB, over the "
           "file size limit of " + std::to_string(old_.rlim_max / 1024) + " KiB (ulimit -f), "
           "which this process may not raise; hint: raise `ulimit -f` to at least its size";
  }

 private:
  struct rlimit old_ {};
  bool changed_ = false;
  bool short_by_ = false;
};

}  // namespace

int sealed_copy(int fd, const std::string& name, bool path_checked, std::string* error) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *error = std::string("cannot stat it: ") + std::strerror(errno);
    return -1;
  }
  const FileSizeLimitAtLeast limit(st.st_size);
  if (std::string why = limit.problem(st.st_size); !why.empty()) {
    if (path_checked) {
      const int same = fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (same >= 0) {
        spdlog::debug("{}: loaded from the file itself, not a sealed copy: {}", name,
                      why.substr(0, why.find("; hint: ")));
        return same;
      }
    }
    *error = std::move(why);
    return -1;
  }
  const int mfd = memfd_create(name.substr(0, 200).c_str(), MFD_ALLOW_SEALING | MFD_CLOEXEC);
  if (mfd < 0) {
    *error = std::string("cannot make a sealed copy of it (memfd_create: ") +
             std::strerror(errno) + ")";
    return -1;
  }
  std::vector<char> buf(1 << 20);
  off_t offset = 0;
  for (;;) {
    const ssize_t n = pread(fd, buf.data(), buf.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = std::string("cannot read it: ") + std::strerror(errno);
      close(mfd);
      return -1;
    }
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = write(mfd, buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        *error = std::string("cannot copy it into memory: ") + std::strerror(errno);
        close(mfd);
        return -1;
      }
      done += w;
    }
    offset += n;
  }
  if (fcntl(mfd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    *error = std::string("cannot seal its copy: ") + std::strerror(errno);
    close(mfd);
    return -1;
  }
  return mfd;
}

namespace {

#if defined(__x86_64__)
constexpr const char* kMultiarch = "x86_64-linux-gnu";
#elif defined(__aarch64__)
constexpr const char* kMultiarch = "aarch64-linux-gnu";
#elif defined(__powerpc64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr const char* kMultiarch = "powerpc64le-linux-gnu";
#elif defined(__riscv)
constexpr const char* kMultiarch = "riscv64-linux-gnu";
#else
constexpr const char* kMultiarch = "";
#endif

void read_ld_so_conf(const std::string& file, int depth, std::vector<std::string>* dirs) {
  if (depth > 8) return;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    const size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    const size_t e = line.find_last_not_of(" \t\r");
    line = line.substr(b, e - b + 1);
    if (line.rfind("include", 0) == 0 && line.size() > 7 && (line[7] == ' ' || line[7] == '\t')) {
      std::string pattern = line.substr(8);
      pattern = pattern.substr(pattern.find_first_not_of(" \t"));
      if (pattern[0] != '/') pattern = parent_of(file) + "/" + pattern;
      glob_t g{};
      if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) read_ld_so_conf(g.gl_pathv[i], depth + 1, dirs);
      globfree(&g);
    } else if (line[0] == '/') {
      dirs->push_back(fs::path(line).lexically_normal().string());
    }
  }
}

// The directories the dynamic loader's cache and defaults cover.
const std::vector<std::string>& system_dirs() {
  static const std::vector<std::string> dirs = [] {
    std::vector<std::string> out;
    read_ld_so_conf("/etc/ld.so.conf", 0, &out);
    for (const char* base : {"/lib", "/usr/lib"}) {
      if (*kMultiarch) out.push_back(std::string(base) + "/" + kMultiarch);
      out.push_back(base);
      out.push_back(std::string(base) + "64");
    }
    for (auto& d : out)
      while (d.size() > 1 && d.back() == '/') d.pop_back();
    return out;
  }();
  return dirs;
}

bool is_system_dir(const std::string& dir) {
  for (const auto& d : system_dirs())
    if (d == dir) return true;
  return false;
}

struct Preloaded {
  Dependency record;
  void* handle = nullptr;
};
std::mutex g_preload_mutex;
std::map<std::string, Preloaded>& preloaded() {
  static std::map<std::string, Preloaded> m;
  return m;
}

// "WHAT: MESSAGE", or MESSAGE for the plugin itself (WHAT empty).
std::string at(const std::string& what, const std::string& message) {
  return what.empty() ? message : what + ": " + message;
}

bool already_loaded(const std::string& name) {
  void* h = dlopen(name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return false;
  dlclose(h);
  return true;
}

constexpr const char* kRunpathHint =
    "; hint: link it with absolute RUNPATH entries, or $ORIGIN ones inside its own directory, "
    "naming directories that exist and that only you or root can write";

struct Finder {
  bool check_permissions;
  std::vector<Dependency>* out;
  std::set<std::string> seen;

  // One RUNPATH/RPATH entry of an object in `origin`, as an absolute directory, or why not.
  std::string expand(const std::string& entry, const std::string& origin, const char* tag,
                     std::string* dir) {
    std::string e = entry;
    for (const char* token : {"${ORIGIN}", "$ORIGIN"})
      for (size_t at; (at = e.find(token)) != std::string::npos;)
        e.replace(at, std::strlen(token), origin);
    if (e.find('$') != std::string::npos)
      return std::string(tag) + " entry '" + entry + "' uses a token keel does not resolve " +
             "($LIB, $PLATFORM)" + kRunpathHint;
    if (e.empty() || e[0] != '/')
      return std::string(tag) + " entry '" + entry + "' is relative (the dynamic loader reads it " +
             "against the working directory)" + kRunpathHint;
    const std::string normal = fs::path(e).lexically_normal().string();
    *dir = normal.size() > 1 && normal.back() == '/' ? normal.substr(0, normal.size() - 1)
                                                     : normal;
    if (entry.find("ORIGIN") != std::string::npos && *dir != origin &&
        dir->rfind(origin + "/", 0) != 0)
      return std::string(tag) + " entry '" + entry + "' leaves its directory " + origin + " (" +
             *dir + ")" + kRunpathHint;
    return "";
  }

  // A searched directory: it must exist and (with the checks) be safe.
  std::string check_dir(const std::string& dir, const std::string& what) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      return what + " directory " + dir + " does not exist (another user could create it " +
             "later)" + kRunpathHint;
    return check_safe(dir, what);
  }
  std::string check_safe(const std::string& dir, const std::string& what) {
    if (check_permissions)
      if (std::string bad = unsafe_path(dir, true); !bad.empty())
        return what + " directory " + dir + " is not safe: " + bad + kRunpathHint;
    return "";
  }

  std::string find(int fd, const std::string& origin, const std::vector<std::string>& inherited,
                   const std::string& what, int depth) {
    if (depth > 16) return at(what, "dependencies nested too deep (more than 16 levels)");
    ElfDynamic dyn;
    if (std::string bad = elf_read_dynamic(fd, &dyn); !bad.empty())
      return at(what, "cannot read its dynamic section: " + bad);
    // Each entry expanded ($ORIGIN) and checked, into `out`; "" or why not.
    auto directories = [&](const std::vector<std::string>& entries, const char* kind,
                           std::vector<std::string>* out) -> std::string {
      for (const auto& e : entries) {
        std::string dir;
        if (std::string bad = expand(e, origin, kind, &dir); !bad.empty()) return bad;
        if (std::string bad = check_dir(dir, kind); !bad.empty()) return bad;
        out->push_back(dir);
      }
      return "";
    };
    std::vector<std::string> runpath, rpath;
    if (std::string bad = directories(dyn.runpath, "RUNPATH", &runpath); !bad.empty())
      return at(what, bad);
    if (!dyn.has_runpath) {
      if (std::string bad = directories(dyn.rpath, "RPATH", &rpath); !bad.empty())
        return at(what, bad);
      rpath.insert(rpath.end(), inherited.begin(), inherited.end());
    }
    for (const std::string& needed : dyn.needed) {
      if (seen.count(needed)) continue;
      if (const Dependency* d = preloaded_dependency(needed)) {
        seen.insert(needed);
        Dependency copy = *d;
        copy.memfd = -1;
        out->push_back(copy);
        continue;
      }
      if (already_loaded(needed)) continue;  // the dynamic loader uses that one, unsearched
      std::string found;
      bool system = false;
      if (needed.find('/') != std::string::npos) {
        if (needed[0] != '/')
          return at(what, "needs '" + needed + "', a relative path (the dynamic loader reads it " +
                              "against the working directory); hint: link it by soname");
        found = needed;
        system = is_system_dir(parent_of(needed));
      } else {
        std::vector<std::pair<std::string, bool>> dirs;  // directory, is LD_LIBRARY_PATH's
        for (const auto& d : rpath) dirs.push_back({d, false});
        if (const char* env = std::getenv("LD_LIBRARY_PATH"); env && *env) {
          std::string list = env;
          size_t start = 0;
          for (;;) {
            const size_t sep = list.find_first_of(":;", start);
            const std::string item = list.substr(start, sep == std::string::npos
                                                            ? std::string::npos : sep - start);
            if (item.empty() || item[0] != '/')
              return at(what, "needs " + needed + ", which the dynamic loader would look for " +
                                  "in the working directory: LD_LIBRARY_PATH has " +
                                  (item.empty() ? std::string("an empty entry")
                                                : "the relative entry '" + item + "'") +
                                  "; hint: remove it from LD_LIBRARY_PATH (a leading, trailing "
                                  "or doubled ':' is an empty entry)");
            dirs.push_back({fs::path(item).lexically_normal().string(), true});
            if (sep == std::string::npos) break;
            start = sep + 1;
          }
        }
        for (const auto& d : runpath) dirs.push_back({d, false});
        for (auto& [d, from_env] : dirs) {
          while (d.size() > 1 && d.back() == '/') d.pop_back();
          if (from_env && check_permissions) {
            std::error_code ec;
            std::string bad = fs::is_directory(d, ec) ? check_safe(d, "LD_LIBRARY_PATH")
                                                       : "LD_LIBRARY_PATH directory " + d +
                                                             " does not exist (another user "
                                                             "could create it later)";
            if (!bad.empty())
              return at(what, "needs " + needed + ", which the dynamic loader looks for in " +
                                  "LD_LIBRARY_PATH first, and the " + without_hint_text(bad) +
                                  "; hint: remove it from LD_LIBRARY_PATH, or make it safe");
          }
          const std::string candidate = joined(d, needed);
          struct stat st;
          if (stat(candidate.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
          found = candidate;
          system = is_system_dir(d);
          break;
        }
        if (found.empty()) {
          for (const auto& d : system_dirs()) {
            const std::string candidate = joined(d, needed);
            struct stat st;
            if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
              found = candidate;
              system = true;
              break;
            }
          }
        }
        // Not found: the dynamic loader's own search ends in root's cache and directories, or
        // fails and dlopen says so.
        if (found.empty()) continue;
      }
      const std::string dep_what = at(what, "its library " + needed + " (" + found + ")");
      if (check_permissions)
        if (std::string bad = unsafe_path(found, false); !bad.empty())
          return dep_what + " is not loaded: " + bad +
                 "; hint: chmod go-w it and every directory on its path, or set "
                 "KEEL_ALLOW_WRITABLE_PLUGINS=1 to load it anyway";
      if (system) continue;  // a system library, with what it needs
      seen.insert(needed);
      const int file = open(found.c_str(), O_RDONLY | O_CLOEXEC);
      if (file < 0) return dep_what + ": cannot open it: " + std::strerror(errno);
      std::string error;
      const int mfd = sealed_copy(file, needed, check_permissions, &error);
      close(file);
      if (mfd < 0) return dep_what + ": " + error;
      Dependency dep;
      dep.needed = needed;
      dep.path = found;
      dep.memfd = mfd;
      ElfDynamic own;
      std::string bad = elf_read_dynamic(mfd, &own);
      if (bad.empty() && own.soname != needed)
        bad = "its soname is " + (own.soname.empty() ? "missing" : "'" + own.soname + "'") +
              ", so the dynamic loader would not take the copy keel checked for '" + needed +
              "'; hint: link it with -Wl,-soname," + needed;
      if (bad.empty()) {
        try {
          dep.sha256 = sha256_hex(mfd, found);
        } catch (const std::exception& e) {
          bad = e.what();
        }
      }
      std::error_code ec;
      const std::string dep_origin = fs::canonical(found, ec).parent_path().string();
      if (bad.empty() && ec) bad = "cannot resolve its path: " + ec.message();
      if (bad.empty())
        bad = find(mfd, dep_origin, dyn.has_runpath ? std::vector<std::string>{} : rpath,
                   dep_what, depth + 1);
      if (!bad.empty()) {
        close(mfd);
        return bad.rfind(dep_what, 0) == 0 ? bad : at(dep_what, bad);
      }
      out->push_back(dep);
    }
    return "";
  }

  static std::string without_hint_text(const std::string& s) {
    return s.substr(0, s.find("; hint: "));
  }
};

}  // namespace

std::string find_dependencies(int fd, const std::string& origin, bool check_permissions,
                              std::vector<Dependency>* out) {
  Finder f{check_permissions, out, {}};
  std::vector<Dependency> found;
  f.out = &found;
  const std::string bad = f.find(fd, origin, {}, "", 0);
  if (!bad.empty()) {
    for (auto& d : found)
      if (d.memfd >= 0) close(d.memfd);
    return bad;
  }
  for (auto& d : found) out->push_back(std::move(d));
  return "";
}

std::string install_dependency_problem(int fd, const std::string& dir) {
  const char* allow = std::getenv("KEEL_ALLOW_WRITABLE_PLUGINS");
  std::vector<Dependency> deps;
  const std::string bad = find_dependencies(fd, dir, !(allow && std::string(allow) == "1"), &deps);
  for (auto& d : deps)
    if (d.memfd >= 0) close(d.memfd);
  return bad;
}

const Dependency* preloaded_dependency(const std::string& soname) {
  std::lock_guard<std::mutex> lock(g_preload_mutex);
  auto it = preloaded().find(soname);
  return it == preloaded().end() ? nullptr : &it->second.record;
}

std::string preload_dependency(Dependency& dep) {
  std::lock_guard<std::mutex> lock(g_preload_mutex);
  if (preloaded().count(dep.needed)) {
    if (dep.memfd >= 0) close(dep.memfd);
    dep.memfd = -1;
    return "";
  }
  if (dep.memfd < 0) return "no copy of it to load";
  const std::string name = "/proc/self/fd/" + std::to_string(dep.memfd);
  dlerror();
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    close(dep.memfd);
    dep.memfd = -1;
    return e ? e : "dlopen failed";
  }
  // Kept for the process's lifetime, like the descriptor its name points at.
  Preloaded p;
  p.record = dep;
  p.handle = h;
  preloaded().emplace(dep.needed, std::move(p));
  dep.memfd = -1;  // the record keeps it, open
  return "";
}

}  // namespace keel
