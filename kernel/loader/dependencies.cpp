#include "dependencies.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "digest.hpp"
#include "elf.hpp"
#include "files/files.hpp"
#include "safe_path.hpp"
#include "sealed_copy.hpp"
#include "unique_fd.hpp"

namespace fs = std::filesystem;

namespace keel {
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

bool is_regular_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

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

std::string without_hint_text(const std::string& s) { return s.substr(0, s.find("; hint: ")); }

bool already_loaded(const std::string& name) {
  void* h = dlopen(name.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return false;
  dlclose(h);
  return true;
}

constexpr const char* kRunpathHint =
    "; hint: link it with absolute RUNPATH entries, or $ORIGIN ones inside its own directory, "
    "naming directories that exist and that only you or root can write";

// A directory the dynamic loader searches for a name, in its order.
struct SearchDir {
  std::string dir;
  bool from_env = false;  // an LD_LIBRARY_PATH entry
};

// Where a DT_NEEDED name resolves to.
struct Located {
  std::string path;     // "" when not found (the dynamic loader's own search ends it)
  bool system = false;  // in a system directory: trusted with what it needs
};

struct Finder {
  bool check_permissions;
  std::vector<Dependency>* out;
  std::set<std::string> seen;

  // Appends the dependencies of the object at `fd` (in `origin`; `inherited`: the RPATH entries
  // of the objects that need it) to `out`; "" or why not, prefixed with `what`.
  std::string find(int fd, const std::string& origin, const std::vector<std::string>& inherited,
                   const std::string& what, int depth) {
    if (depth > 16) return at(what, "dependencies nested too deep (more than 16 levels)");
    ElfDynamic dyn;
    if (std::string bad = elf_read_dynamic(fd, &dyn); !bad.empty())
      return at(what, "cannot read its dynamic section: " + bad);
    std::vector<std::string> runpath, rpath;
    if (std::string bad = directories(dyn.runpath, origin, "RUNPATH", &runpath); !bad.empty())
      return at(what, bad);
    if (!dyn.has_runpath) {
      if (std::string bad = directories(dyn.rpath, origin, "RPATH", &rpath); !bad.empty())
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
      Located found;
      if (std::string bad = locate(needed, rpath, runpath, what, &found); !bad.empty()) return bad;
      // Not found: the dynamic loader's own search ends in root's cache and directories, or
      // fails and dlopen says so.
      if (found.path.empty()) continue;
      const std::vector<std::string> passed_on =
          dyn.has_runpath ? std::vector<std::string>{} : rpath;
      if (std::string bad = take(needed, found, passed_on, what, depth); !bad.empty()) return bad;
    }
    return "";
  }

 private:
  // One RUNPATH/RPATH entry of an object in `origin`, as an absolute directory, or why not.
  static std::string expand(const std::string& entry, const std::string& origin, const char* tag,
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

  std::string check_safe(const std::string& dir, const std::string& what) const {
    if (check_permissions)
      if (std::string bad = unsafe_path(dir, true); !bad.empty())
        return what + " directory " + dir + " is not safe: " + bad + kRunpathHint;
    return "";
  }

  // Each RUNPATH or RPATH entry expanded ($ORIGIN) and checked (it must exist and, with the
  // checks, be safe), into `out`; "" or why not.
  std::string directories(const std::vector<std::string>& entries, const std::string& origin,
                          const char* kind, std::vector<std::string>* out) const {
    for (const auto& e : entries) {
      std::string dir;
      if (std::string bad = expand(e, origin, kind, &dir); !bad.empty()) return bad;
      std::error_code ec;
      if (!fs::is_directory(dir, ec))
        return std::string(kind) + " directory " + dir + " does not exist (another user could " +
               "create it later)" + kRunpathHint;
      if (std::string bad = check_safe(dir, kind); !bad.empty()) return bad;
      out->push_back(dir);
    }
    return "";
  }

  // LD_LIBRARY_PATH's entries, appended to `dirs`; "" or why `needed` cannot be searched for.
  static std::string ld_library_path(const std::string& needed, const std::string& what,
                                     std::vector<SearchDir>* dirs) {
    const char* env = std::getenv("LD_LIBRARY_PATH");
    if (!env || !*env) return "";
    const std::string list = env;
    for (size_t start = 0;;) {
      const size_t sep = list.find_first_of(":;", start);
      const std::string item =
          list.substr(start, sep == std::string::npos ? std::string::npos : sep - start);
      if (item.empty() || item[0] != '/')
        return at(what, "needs " + needed + ", which the dynamic loader would look for " +
                            "in the working directory: LD_LIBRARY_PATH has " +
                            (item.empty() ? std::string("an empty entry")
                                          : "the relative entry '" + item + "'") +
                            "; hint: remove it from LD_LIBRARY_PATH (a leading, trailing "
                            "or doubled ':' is an empty entry)");
      dirs->push_back({fs::path(item).lexically_normal().string(), true});
      if (sep == std::string::npos) return "";
      start = sep + 1;
    }
  }

  // Where the dynamic loader finds `needed`; "" or why it may not be searched for.
  std::string locate(const std::string& needed, const std::vector<std::string>& rpath,
                     const std::vector<std::string>& runpath, const std::string& what,
                     Located* found) const {
    if (needed.find('/') != std::string::npos) {
      if (needed[0] != '/')
        return at(what, "needs '" + needed + "', a relative path (the dynamic loader reads it " +
                            "against the working directory); hint: link it by soname");
      *found = {needed, is_system_dir(parent_of(needed))};
      return "";
    }
    std::vector<SearchDir> dirs;
    for (const auto& d : rpath) dirs.push_back({d, false});
    if (std::string bad = ld_library_path(needed, what, &dirs); !bad.empty()) return bad;
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
      if (is_regular_file((fs::path(d) / needed).string())) {
        *found = {(fs::path(d) / needed).string(), is_system_dir(d)};
        return "";
      }
    }
    for (const auto& d : system_dirs())
      if (is_regular_file((fs::path(d) / needed).string())) {
        *found = {(fs::path(d) / needed).string(), true};
        return "";
      }
    return "";
  }

  // Checks the library `found` for `needed`; a non-system one is copied, hashed, its own
  // dependencies found (`rpath`: the RPATH entries it inherits), and appended to `out`.
  std::string take(const std::string& needed, const Located& found,
                   const std::vector<std::string>& rpath, const std::string& what, int depth) {
    const std::string dep_what = at(what, "its library " + needed + " (" + found.path + ")");
    if (check_permissions)
      if (std::string bad = unsafe_path(found.path, false); !bad.empty())
        return dep_what + " is not loaded: " + bad +
               "; hint: chmod go-w it and every directory on its path, or set "
               "KEEL_ALLOW_WRITABLE_PLUGINS=1 to load it anyway";
    if (found.system) return "";  // a system library, with what it needs
    seen.insert(needed);
    UniqueFd mfd;
    {
      const UniqueFd file(open(found.path.c_str(), O_RDONLY | O_CLOEXEC));
      if (file.get() < 0) return dep_what + ": cannot open it: " + std::strerror(errno);
      std::string error;
      mfd.reset(sealed_copy(file.get(), needed, check_permissions, &error));
      if (mfd.get() < 0) return dep_what + ": " + error;
    }
    Dependency dep;
    dep.needed = needed;
    dep.path = found.path;
    std::string bad = checked_copy(mfd.get(), needed, found.path, &dep.sha256);
    std::error_code ec;
    const std::string dep_origin = fs::canonical(found.path, ec).parent_path().string();
    if (bad.empty() && ec) bad = "cannot resolve its path: " + ec.message();
    if (bad.empty()) bad = find(mfd.get(), dep_origin, rpath, dep_what, depth + 1);
    if (!bad.empty()) return bad.rfind(dep_what, 0) == 0 ? bad : at(dep_what, bad);
    dep.memfd = mfd.release();
    out->push_back(dep);
    return "";
  }

  // The copy of `needed` has that soname; its SHA-256 into `*sha256`; "" or why not.
  static std::string checked_copy(int mfd, const std::string& needed, const std::string& path,
                                  std::string* sha256) {
    ElfDynamic own;
    std::string bad = elf_read_dynamic(mfd, &own);
    if (bad.empty() && own.soname != needed)
      return "its soname is " + (own.soname.empty() ? "missing" : "'" + own.soname + "'") +
             ", so the dynamic loader would not take the copy keel checked for '" + needed +
             "'; hint: link it with -Wl,-soname," + needed;
    if (!bad.empty()) return bad;
    try {
      *sha256 = sha256_hex(mfd, path);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace

std::string find_dependencies(int fd, const std::string& origin, bool check_permissions,
                              std::vector<Dependency>* out) {
  std::vector<Dependency> found;
  Finder f{check_permissions, &found, {}};
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
