#include "package/package.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "error.hpp"
#include "keel/abi.h"
#include "loader/bounded.hpp"
#include "loader/digest.hpp"
#include "loader/elf.hpp"
#include "loader/registry.hpp"
#include "loader/trust.hpp"
#include "files/files.hpp"
#include "text/text.hpp"
#include "unique_fd.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

#define KEEL_PKG_STR2(x) #x
#define KEEL_PKG_STR(x) KEEL_PKG_STR2(x)
// This keel's plugin ABI as "MAJOR.MINOR".
#define KEEL_PKG_ABI KEEL_PKG_STR(KEEL_ABI_MAJOR) "." KEEL_PKG_STR(KEEL_ABI_MINOR)

constexpr size_t kMaxNameBytes = 64;
constexpr const char* kLayoutHint =
    "a package holds only keel-plugin.toml and the plugin .so files its [files] table lists, "
    "with no subdirectories or links; make one with `keel plugins pack BUILD_DIR`";
constexpr const char* kTarballHint =
    "a package .tar.gz holds one directory NAME-VERSION/ with keel-plugin.toml and the plugin "
    ".so files; make one with `keel plugins pack BUILD_DIR`";

// ------------------------------------------------------------------------------------------
// Small file-system helpers, on top of files/files.hpp. Each failure throws keel::FileError
// naming the operation and path; the public functions add file_hint's hint to it.

[[noreturn]] void sys_fail(const std::string& what, const std::string& path, int err) {
  throw FileError(what, path, err);
}

std::string file_hint(int err) {
  return err == ENOSPC || err == EDQUOT
             ? "free some space on that file system"
             : "check that its directory exists and that you may write there";
}

// `path` made absolute and normal, without a trailing '/' ("pkg/" -> "/cwd/pkg").
std::string absolute_path(const std::string& path) {
  fs::path p = fs::absolute(path).lexically_normal();
  if (p.has_parent_path() && p.filename().empty()) p = p.parent_path();
  return p.string();
}

// Copies the regular file `from` (not through a link) to the new file `to` (mode 0644,
// fsync'd); returns the SHA-256 of the bytes copied.
std::string copy_file(const std::string& from, const std::string& to) {
  UniqueFd in(::open(from.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (in.get() < 0) sys_fail("opening", from, errno);
  UniqueFd out = create_file(to);
  Sha256 sha;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) sys_fail("reading", from, errno);
    if (n == 0) break;
    sha.update(buf.data(), static_cast<size_t>(n));
    write_data(out.get(), buf.data(), static_cast<size_t>(n), to);
  }
  finish_file(out, to, 0644);
  return sha.hex();
}

// A directory removed (with everything in it) when this goes out of scope, unless released.
class ScratchDir {
 public:
  // Creates a fresh directory `<dir>/<prefix>XXXXXX` (mode 0700 until chmod'ed).
  ScratchDir(const std::string& dir, const std::string& prefix) {
    std::string tmpl = dir + "/" + prefix + "XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) sys_fail("creating a directory in", dir, errno);
    path_ = tmpl;
  }
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  std::string path_;
};

// The directories made by make_dirs(), removed again (when still empty) unless kept.
class CreatedDirs {
 public:
  ~CreatedDirs() {
    if (keep_) return;
    for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) ::rmdir(it->c_str());
  }
  void add(const std::string& d) { dirs_.push_back(d); }
  void keep() { keep_ = true; }

 private:
  std::vector<std::string> dirs_;
  bool keep_ = false;
};

// mkdir -p `dir` (mode 0755), recording each directory it creates.
void make_dirs(const std::string& dir, CreatedDirs& created) {
  std::vector<fs::path> missing;
  fs::path p = dir;
  struct stat st;
  while (::stat(p.c_str(), &st) != 0) {  // a link to a directory will do
    if (errno != ENOENT) sys_fail("checking", p.string(), errno);
    missing.push_back(p);
    p = p.parent_path();
  }
  if (!S_ISDIR(st.st_mode))
    throw Error(p.string() +
                ": not a directory; hint: choose a plugin directory (--prefix) "
                "whose path holds no files in the way");
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0755) != 0) {
      if (errno == EEXIST && fs::is_directory(*it)) continue;
      sys_fail("creating the directory", it->string(), errno);
    }
    created.add(it->string());
  }
}

bool lexists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ------------------------------------------------------------------------------------------
// keel-plugin.toml

using text::located;

// A TOML basic string ("..." with escapes).
std::string toml_quoted(const std::string& s) {
  std::ostringstream out;
  out << toml::toml_formatter{toml::value<std::string>(s), toml::format_flags::none};
  return out.str();
}

[[noreturn]] void fail_at(const std::string& where, const std::string& what,
                          const std::string& hint) {
  throw Error(text::one_line(where + ": " + what + "; hint: " + hint));
}

std::string file_name_problem(const std::string& n) {
  if (n.empty()) return "an empty file name";
  if (n.find('/') != std::string::npos || n.find('\0') != std::string::npos)
    return "a file name must not contain '/'";
  if (n[0] == '.') return "a file name must not start with '.'";
  if (n.size() < 4 || n.compare(n.size() - 3, 3, ".so") != 0)
    return "a plugin file name must end in .so";
  if (n.size() > 255) return "a file name must be at most 255 bytes";
  return "";
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

enum class Keys { full, build };

struct Key {
  const char* name;
  bool in_build;  // read by `keel plugins pack` from BUILD_DIR/keel-plugin.toml
  bool optional;
  const char* example;  // for "add it" hints
};
constexpr Key kKeys[] = {
    {"name", true, false, "name = \"acme-losses\""},
    {"version", true, false, "version = \"1.2.0\""},
    {"description", true, false, "description = \"what the plugin provides\""},
    {"license", true, false, "license = \"MIT\" (an SPDX identifier)"},
    {"abi", false, false, "abi = \"" KEEL_PKG_ABI "\""},
    {"torch_version", false, true, ""},
    {"cxx11_abi", false, true, ""},
    {"components", false, false, "components = [\"loss:my_ce\"]"},
    {"files", false, false, "[files] \"libacme.so\" = \"<sha256>\""},
};

// keel-plugin.toml's content, and where each value sits ("path:line:col"; [files] entries
// under "files.<name>").
struct Located {
  PackageInfo info;
  std::map<std::string, std::string> where;
};

Located parse_info(const std::string& text, const std::string& shown, Keys keys) {
  toml::table t;
  try {
    t = toml::parse(text, shown);
  } catch (const toml::parse_error& e) {
    fail_at(located(shown, e.source()), "not valid TOML: " + std::string(e.description()),
            "fix the TOML syntax at that place");
  }
  std::vector<std::string> names;
  for (const Key& k : kKeys)
    if (keys == Keys::full || k.in_build) names.push_back(k.name);
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (std::find(names.begin(), names.end(), key) != names.end()) continue;
    if (keys == Keys::build)
      for (const Key& known : kKeys)
        if (key == known.name)
          fail_at(located(shown, k.source()), "'" + key + "' is filled in by `keel plugins pack`",
                  "remove it: the build directory's keel-plugin.toml holds only name, version, "
                  "description and license");
    fail_at(located(shown, k.source()), "unknown key " + toml_quoted(key),
            text::did_you_mean_or(key, names, "keel-plugin.toml holds " + text::join(names)));
  }
  Located out;
  PackageInfo& info = out.info;
  auto node = [&](const Key& k) -> const toml::node* {
    const toml::node* n = t.get(k.name);
    if (n == nullptr && !k.optional)
      fail_at(shown, std::string("no '") + k.name + "'",
              std::string("add ") + k.example +
                  (k.in_build ? "" : " (`keel plugins pack BUILD_DIR` fills it in)"));
    if (n) out.where[k.name] = located(shown, n->source());
    return n;
  };
  auto str = [&](const Key& k) -> std::optional<std::string> {
    const toml::node* n = node(k);
    if (!n) return std::nullopt;
    const auto* s = n->as_string();
    if (!s)
      fail_at(
          located(shown, n->source()), std::string("'") + k.name + "' must be a string",
          std::string("write it quoted") + (*k.example ? std::string(", e.g. ") + k.example : ""));
    return s->get();
  };
  for (const Key& k : kKeys) {
    if (keys == Keys::build && !k.in_build) continue;
    const std::string key = k.name;
    if (key == "name") {
      info.name = *str(k);
      const std::string bad = package_name_problem(info.name);
      if (!bad.empty())
        fail_at(out.where["name"], bad, "use lowercase letters, digits, '.', '_' and '-'");
    } else if (key == "version") {
      info.version = *str(k);
      try {
        Version::parse(info.version);
      } catch (const Error& e) {
        fail_at(out.where["version"], std::string("version ") + e.what(),
                "write a semantic version, e.g. version = \"1.2.0\"");
      }
    } else if (key == "description") {
      info.description = *str(k);
    } else if (key == "license") {
      info.license = *str(k);
      if (info.license.empty())
        fail_at(out.where["license"], "'license' is empty",
                "name an SPDX identifier, e.g. \"MIT\"");
    } else if (key == "abi") {
      const std::string abi = *str(k);
      const size_t dot = abi.find('.');
      auto digits = [](const std::string& s) {
        return !s.empty() && s.size() <= 9 &&
               std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
      };
      if (dot == std::string::npos || !digits(abi.substr(0, dot)) || !digits(abi.substr(dot + 1)))
        fail_at(out.where["abi"], "'abi' is " + toml_quoted(abi) + ", not MAJOR.MINOR",
                std::string("write the plugin ABI the plugins were built for, e.g. abi = \"") +
                    KEEL_PKG_ABI + "\"");
      info.abi_major = static_cast<uint32_t>(std::stoul(abi.substr(0, dot)));
      info.abi_minor = static_cast<uint32_t>(std::stoul(abi.substr(dot + 1)));
    } else if (key == "torch_version") {
      info.torch_version = str(k);
      if (info.torch_version && info.torch_version->empty())
        fail_at(out.where[key], "'torch_version' is empty",
                "leave it out for plain C plugins, else write the LibTorch version, e.g. \"" +
                    std::string(kernel_torch_version()) + "\"");
    } else if (key == "cxx11_abi") {
      if (const toml::node* n = node(k)) {
        const auto* i = n->as_integer();
        if (!i || (i->get() != 0 && i->get() != 1))
          fail_at(located(shown, n->source()), "'cxx11_abi' must be 0 or 1",
                  "write the _GLIBCXX_USE_CXX11_ABI the plugins were built with");
        info.cxx11_abi = static_cast<int>(i->get());
      }
    } else if (key == "components") {
      const toml::node* n = node(k);
      const auto* a = n->as_array();
      if (!a)
        fail_at(located(shown, n->source()), "'components' must be a list of strings",
                "write it as components = [\"loss:my_ce\"]");
      std::set<std::string> seen;
      for (const toml::node& e : *a) {
        const auto* s = e.as_string();
        std::string c = s ? s->get() : "";
        const size_t colon = c.find(':');
        keel_kind kind;
        if (!s || colon == std::string::npos || colon + 1 == c.size() ||
            c.find(':', colon + 1) != std::string::npos ||
            !kind_from_name(c.substr(0, colon), &kind))
          fail_at(located(shown, e.source()),
                  "a component must be a string KIND:NAME with a known kind" +
                      (s ? " (got " + toml_quoted(c) + ")" : std::string()),
                  "KIND is model, dataset, optimizer, lr_scheduler, loss, grad_clipper, mfu, "
                  "profiler, checkpoint or hook, e.g. \"loss:my_ce\"");
        if (!seen.insert(c).second)
          fail_at(located(shown, e.source()), "component " + toml_quoted(c) + " is listed twice",
                  "list each component once");
        info.components.push_back(c);
      }
    } else if (key == "files") {
      const toml::node* n = node(k);
      const auto* ft = n->as_table();
      if (!ft)
        fail_at(located(shown, n->source()), "'files' must be a table",
                "write it as a [files] header followed by \"FILE.so\" = \"<sha256>\" lines");
      if (ft->empty())
        fail_at(located(shown, n->source()), "[files] lists no file",
                "list each plugin .so with its sha256 (`keel plugins pack` does)");
      for (const auto& [fk, fv] : *ft) {
        const std::string file(fk.str());
        const std::string bad = file_name_problem(file);
        if (!bad.empty())
          fail_at(located(shown, fk.source()), "[files] " + toml_quoted(file) + ": " + bad,
                  "list only the plugin .so files at the package's top level");
        const auto* s = fv.as_string();
        if (!s || !is_sha256_hex(s->get()))
          fail_at(located(shown, fv.source()),
                  "[files] " + toml_quoted(file) + " must be a sha256: 64 lowercase hex digits",
                  "`sha256sum FILE` prints it; `keel plugins pack` fills [files] in");
        info.files[file] = s->get();
        out.where["files." + file] = located(shown, fk.source());
      }
    }
  }
  if (keys == Keys::full && info.torch_version.has_value() != info.cxx11_abi.has_value())
    fail_at(shown,
            std::string("'") + (info.torch_version ? "torch_version" : "cxx11_abi") +
                "' is given without '" + (info.torch_version ? "cxx11_abi" : "torch_version") + "'",
            "C++ plugins give both; plain C plugins neither");
  return out;
}

// The content of the file `path` (not read through a link), named `shown` in messages.
std::string read_regular(const std::string& path, const std::string& shown) {
  try {
    return read_file(path, /*follow_links=*/false);
  } catch (const FileError& e) {
    if (e.code() == ELOOP) fail_at(shown, "a symbolic link", kLayoutHint);
    if (path == shown) throw;
    sys_fail("reading", shown, e.code());
  }
}

Located read_info(const std::string& path, const std::string& shown, Keys keys) {
  return parse_info(read_regular(path, shown), shown, keys);
}

// ------------------------------------------------------------------------------------------
// Checking a package directory

std::string abi_text(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// Checks the package directory `dir` completely, naming it `shown` in messages; returns its
// metadata. Only reads: nothing of it is loaded.
Located verify_package_dir(const std::string& dir, const std::string& shown) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    const std::string where = shown + "/" + name;
    if (fs::is_symlink(st)) fail_at(where, "a symbolic link", kLayoutHint);
    if (fs::is_directory(st)) fail_at(where, "a subdirectory", kLayoutHint);
    if (!fs::is_regular_file(st)) fail_at(where, "not a regular file", kLayoutHint);
    names.push_back(name);
  }
  if (ec)
    throw Error(shown + ": cannot read it: " + ec.message() + "; hint: check its permissions");
  std::sort(names.begin(), names.end());
  const std::string toml_shown = shown + "/" + kPackageMetadataFile;
  if (std::find(names.begin(), names.end(), kPackageMetadataFile) == names.end())
    fail_at(shown, std::string("no ") + kPackageMetadataFile + " in it; not a plugin package",
            "make packages from a plugin's build with `keel plugins pack BUILD_DIR`");
  Located l = read_info(dir + "/" + kPackageMetadataFile, toml_shown, Keys::full);
  const PackageInfo& info = l.info;

  // Compatible with this keel?
  const std::string mine = abi_text(KEEL_ABI_MAJOR, KEEL_ABI_MINOR);
  const std::string theirs = abi_text(info.abi_major, info.abi_minor);
  if (info.abi_major != KEEL_ABI_MAJOR)
    fail_at(l.where["abi"],
            info.name + " " + info.version + " needs plugin ABI " + theirs + ", this keel speaks " +
                mine,
            "get a build of " + info.name + " made for plugin ABI " +
                std::to_string(KEEL_ABI_MAJOR) + " (this keel's SDK)");
  if (info.abi_minor > KEEL_ABI_MINOR)
    fail_at(l.where["abi"],
            info.name + " " + info.version + " needs plugin ABI " + theirs +
                ", newer than this keel's " + mine,
            "upgrade keel, or get a build of " + info.name + " made against this keel's SDK");
  if (info.torch_version &&
      (*info.torch_version != kernel_torch_version() || *info.cxx11_abi != kernel_cxx11_abi()))
    fail_at(l.where["torch_version"],
            info.name + " " + info.version + " was built with LibTorch " + *info.torch_version +
                " (_GLIBCXX_USE_CXX11_ABI=" + std::to_string(*info.cxx11_abi) +
                "), this keel uses LibTorch " + kernel_torch_version() +
                " (_GLIBCXX_USE_CXX11_ABI=" + std::to_string(kernel_cxx11_abi()) + ")",
            "get a build of " + info.name + " made against this keel's SDK");

  // Exactly the files listed, each the one hashed, each a keel plugin.
  for (const auto& name : names)
    if (name != kPackageMetadataFile && !info.files.count(name))
      fail_at(shown + "/" + name, std::string("not listed in [files] of ") + kPackageMetadataFile,
              kLayoutHint);
  for (const auto& [file, expected] : info.files) {
    const std::string where = shown + "/" + file;
    const std::string listed = l.where["files." + file];
    if (std::find(names.begin(), names.end(), file) == names.end())
      fail_at(listed, "[files] lists " + toml_quoted(file) + ", which the package does not hold",
              "get the package again from its source, or re-pack it with `keel plugins pack`");
    UniqueFd fd(::open((dir + "/" + file).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) sys_fail("opening", where, errno);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) sys_fail("checking", where, errno);
    if (!S_ISREG(st.st_mode)) fail_at(where, "not a regular file", kLayoutHint);
    const std::string actual = sha256_hex(fd.get(), where);
    if (actual != expected)
      fail_at(where,
              "sha256 " + actual.substr(0, 16) + "... differs from " + expected.substr(0, 16) +
                  "... listed at " + listed,
              "the file changed after the package was made: get the package again from its "
              "source, or re-pack it with `keel plugins pack`");
    const std::string not_plugin = elf_plugin_check(fd.get());
    if (!not_plugin.empty())
      fail_at(where, "not a keel plugin: " + not_plugin,
              "a package holds only keel plugin libraries (ones that export keel_plugin_entry)");
  }
  return l;
}

// ------------------------------------------------------------------------------------------
// Reading a package .tar.gz

using ReadArchive = std::unique_ptr<struct archive, decltype(&archive_read_free)>;
using WriteArchive = std::unique_ptr<struct archive, decltype(&archive_write_free)>;

// A regular file one level below the package's top-level directory, as its header says.
struct TarFile {
  std::string path;  // the entry's path, as written
  std::string name;  // its file name
  uint64_t size = 0;
};

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// Walks the archive's headers with every check that needs no data: absolute paths, '..',
// links, devices, anything but regular files one level below one top-level directory, names a
// package must not use, a name twice, sparse entries, and the bounds of package.hpp (entries,
// each file's size, all files' size). Calls `file` for each regular file, which may read its
// data (libarchive skips what it leaves unread). Returns the top-level directory's name.
template <class F>
std::string walk_package(struct archive* a, const std::string& tarball, F&& file) {
  std::string top;
  std::set<std::string> seen;
  uint64_t entries = 0, total = 0;
  for (;;) {
    struct archive_entry* e = nullptr;
    const int r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN)
      fail_at(tarball, std::string("cannot read it as a .tar.gz: ") + archive_error_string(a),
              kTarballHint);
    if (++entries > kMaxPackageEntries)
      fail_at(tarball,
              "more than " + std::to_string(kMaxPackageEntries) + " entries (a package holds "
              "keel-plugin.toml and its plugin files)",
              kTarballHint);
    const char* raw = archive_entry_pathname(e);
    if (raw == nullptr) fail_at(tarball, "an entry without a readable path", kTarballHint);
    const std::string path = raw;
    auto bad = [&](const std::string& why) {
      fail_at(tarball, "entry " + toml_quoted(path) + ": " + why, kTarballHint);
    };
    if (!path.empty() && path[0] == '/') bad("an absolute path");
    std::vector<std::string> parts;
    {
      std::string p = path;
      while (p.rfind("./", 0) == 0) p.erase(0, 2);
      size_t start = 0;
      while (start <= p.size()) {
        const size_t slash = p.find('/', start);
        const std::string part =
            p.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
        if (part == "..") bad("a path with '..'");
        if (!part.empty() && part != ".") parts.push_back(part);
        if (slash == std::string::npos) break;
        start = slash + 1;
      }
    }
    const mode_t type = archive_entry_filetype(e);
    if (archive_entry_hardlink(e) != nullptr) bad("a hard link");
    if (type == AE_IFLNK) bad("a symbolic link");
    if (type != AE_IFREG && type != AE_IFDIR) bad("not a regular file or directory");
    // A sparse entry's holes read back as zeros: a few bytes in the archive can stand for
    // gigabytes on disk. `keel plugins pack` writes none.
    if (archive_entry_sparse_count(e) > 0) bad("a sparse file; packages hold no sparse files");
    if (parts.empty()) {
      if (type == AE_IFDIR) continue;  // "./"
      bad("an empty path");
    }
    if (top.empty()) top = parts[0];
    if (parts[0] != top) bad("a second top-level entry beside " + toml_quoted(top + "/"));
    if (parts.size() == 1) {
      if (type != AE_IFDIR) bad("a file outside the package's top-level directory");
      continue;
    }
    if (parts.size() > 2 || type == AE_IFDIR) bad("a subdirectory");
    const std::string& name = parts[1];
    if (name == kInstalledMetadataFile || name[0] == '.') bad("a file name a package must not use");
    if (!seen.insert(name).second) bad("appears twice");
    if (!archive_entry_size_is_set(e) || archive_entry_size(e) < 0) bad("a file without a size");
    const uint64_t size = static_cast<uint64_t>(archive_entry_size(e));
    if (size > kMaxPackageFileBytes)
      bad(std::to_string(size) + " bytes, more than a package file may hold (" +
          mib(kMaxPackageFileBytes) + ")");
    total += size;
    if (total > kMaxPackageBytes)
      bad("the package's files add up to more than " + mib(kMaxPackageBytes));
    file(TarFile{path, name, size});
  }
  if (top.empty()) fail_at(tarball, "an empty archive", kTarballHint);
  return top;
}

// Reads the data of the entry `f` that walk_package just passed, in pieces, to `sink`; more
// bytes than its header said is an error (sink never sees them).
template <class Sink>
void read_entry(struct archive* a, const std::string& tarball, const TarFile& f, Sink&& sink) {
  char buf[1 << 16];
  uint64_t read = 0;
  for (;;) {
    const la_ssize_t n = archive_read_data(a, buf, sizeof buf);
    if (n < 0)
      fail_at(tarball, "entry " + toml_quoted(f.path) + ": cannot read it: " + archive_error_string(a),
              kTarballHint);
    if (n == 0) break;
    read += static_cast<uint64_t>(n);
    if (read > f.size)
      fail_at(tarball,
              "entry " + toml_quoted(f.path) + ": more data than the " + std::to_string(f.size) +
                  " bytes its header says",
              kTarballHint);
    sink(buf, static_cast<size_t>(n));
  }
}

// Runs `walk` over the archive open at `fd`, from its start.
template <class F>
std::string read_package_archive(int fd, const std::string& tarball, F&& file) {
  if (::lseek(fd, 0, SEEK_SET) != 0) sys_fail("reading", tarball, errno);
  ReadArchive a(archive_read_new(), archive_read_free);
  if (!a) throw Error("libarchive could not start reading " + tarball);
  archive_read_support_filter_gzip(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_fd(a.get(), fd, 1 << 16) != ARCHIVE_OK)
    fail_at(tarball, std::string("cannot read it as a .tar.gz: ") + archive_error_string(a.get()),
            kTarballHint);
  return walk_package(a.get(), tarball, [&](const TarFile& f) { file(a.get(), f); });
}

// Extracts the package tarball's files into the empty directory `dest` (files only, mode 0644,
// each fsync'd); returns the name of its one top-level directory. The archive is read twice:
// first its headers and keel-plugin.toml (no data is written), then, with the [files] that
// keel-plugin.toml lists, again to write keel-plugin.toml and exactly those files. An entry
// that walk_package refuses, or a file that [files] does not list, is refused before any of
// its data is written; keel-plugin.toml must read the same both times. `named` is the package
// as the user named it, for messages about keel-plugin.toml.
std::string extract_package(const std::string& tarball, const std::string& dest,
                            const std::string& named) {
  UniqueFd fd(::open(tarball.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) sys_fail("opening", tarball, errno);

  std::optional<std::string> meta;
  std::vector<std::string> names;
  const std::string top = read_package_archive(fd.get(), tarball, [&](struct archive* a, const TarFile& f) {
    names.push_back(f.name);
    if (f.name != kPackageMetadataFile) return;
    if (f.size > kMaxPackageInfoBytes)
      fail_at(tarball,
              "entry " + toml_quoted(f.path) + ": " + std::to_string(f.size) +
                  " bytes, more than a keel-plugin.toml may hold (" + mib(kMaxPackageInfoBytes) + ")",
              kTarballHint);
    meta.emplace();
    read_entry(a, tarball, f, [&](const char* p, size_t n) { meta->append(p, n); });
  });
  const std::string shown = named + ":" + top;
  if (!meta)
    fail_at(shown, std::string("no ") + kPackageMetadataFile + " in it; not a plugin package",
            "make packages from a plugin's build with `keel plugins pack BUILD_DIR`");
  const PackageInfo info =
      parse_info(*meta, shown + "/" + kPackageMetadataFile, Keys::full).info;
  for (const auto& name : names)
    if (name != kPackageMetadataFile && !info.files.count(name))
      fail_at(shown + "/" + name,
              std::string("not listed in [files] of ") + kPackageMetadataFile +
                  "; nothing of the package was extracted",
              kLayoutHint);

  std::set<std::string> first(names.begin(), names.end());
  const std::string again = read_package_archive(fd.get(), tarball, [&](struct archive* a, const TarFile& f) {
    const bool is_meta = f.name == kPackageMetadataFile;
    if (!first.count(f.name))
      fail_at(tarball, "entry " + toml_quoted(f.path) + " was not there when it was first read",
              "check that nothing rewrites the package file during the install");
    const std::string out = dest + "/" + f.name;
    UniqueFd w = create_file(out);
    std::string text;
    read_entry(a, tarball, f, [&](const char* p, size_t n) {
      if (is_meta) text.append(p, n);
      write_data(w.get(), p, n, out);
    });
    if (is_meta && text != *meta)
      fail_at(tarball, "entry " + toml_quoted(f.path) + " changed while it was read",
              "check that nothing rewrites the package file during the install");
    finish_file(w, out, 0644);
  });
  if (again != top)
    fail_at(tarball, "its top-level directory changed while it was read",
            "check that nothing rewrites the package file during the install");
  return top;
}

// ------------------------------------------------------------------------------------------
// Installed packages

std::string installed_toml(const std::string& source, const std::string& when) {
  return "# Written by `keel plugins install`.\nsource = " + toml_quoted(source) +
         "\ninstalled = " + toml_quoted(when) + "\n";
}

std::vector<std::string> subdirs(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code sec;
    if (fs::is_directory(it->symlink_status(sec))) out.push_back(name);
  }
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw Error(dir + ": cannot read it: " + ec.message() + "; hint: check its permissions");
  std::sort(out.begin(), out.end());
  return out;
}

InstalledPackage read_installed(const std::string& dir, const std::string& name,
                                const std::string& version) {
  InstalledPackage p;
  p.dir = dir;
  p.info.name = name;
  p.info.version = version;
  try {
    const std::string shown = dir + "/" + kPackageMetadataFile;
    p.info = read_info(shown, shown, Keys::full).info;
    if (p.info.name != name || p.info.version != version)
      p.problem = shown + " says " + p.info.name + " " + p.info.version +
                  ", not what its directory is named";
    const std::string ipath = dir + "/" + kInstalledMetadataFile;
    const toml::table t = toml::parse(read_regular(ipath, ipath), ipath);
    if (const auto s = t["source"].value<std::string>()) p.source = *s;
    if (const auto s = t["installed"].value<std::string>()) p.installed_at = *s;
    if (p.problem.empty() && (p.source.empty() || p.installed_at.empty()))
      p.problem = ipath + " lacks 'source' or 'installed'";
  } catch (const toml::parse_error& e) {
    p.problem = std::string(e.source().path ? e.source().path->c_str() : dir.c_str()) +
                ": not valid TOML: " + std::string(e.description());
  } catch (const std::exception& e) {
    p.problem = e.what();
  }
  return p;
}

void sort_by_version(std::vector<InstalledPackage>& v) {
  std::stable_sort(v.begin(), v.end(), [](const InstalledPackage& a, const InstalledPackage& b) {
    const bool va = Version::valid(a.info.version), vb = Version::valid(b.info.version);
    if (va != vb) return va;  // unparsable last
    if (!va) return a.dir < b.dir;
    const int c = compare(Version::parse(a.info.version), Version::parse(b.info.version));
    return c != 0 ? c < 0 : a.dir < b.dir;
  });
}

}  // namespace

// ------------------------------------------------------------------------------------------

std::string package_name_problem(const std::string& name) {
  const std::string q = "'" + name + "': ";
  if (name.empty()) return "an empty package name";
  if (name.size() > kMaxNameBytes)
    return q + "a package name is at most " + std::to_string(kMaxNameBytes) + " bytes";
  auto lower_or_digit = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!lower_or_digit(name[0]))
    return q + "a package name starts with a lowercase letter or a digit";
  for (char c : name)
    if (!lower_or_digit(c) && c != '.' && c != '_' && c != '-')
      return q + "a package name holds only a-z, 0-9, '.', '_' and '-'";
  return "";
}

PackageInfo read_package_info(const std::string& path) {
  return read_info(path, path, Keys::full).info;
}

std::string package_info_toml(const PackageInfo& info) {
  std::string s;
  s += "name = " + toml_quoted(info.name) + "\n";
  s += "version = " + toml_quoted(info.version) + "\n";
  s += "description = " + toml_quoted(info.description) + "\n";
  s += "license = " + toml_quoted(info.license) + "\n";
  s += "abi = " + toml_quoted(abi_text(info.abi_major, info.abi_minor)) + "\n";
  if (info.torch_version) s += "torch_version = " + toml_quoted(*info.torch_version) + "\n";
  if (info.cxx11_abi) s += "cxx11_abi = " + std::to_string(*info.cxx11_abi) + "\n";
  std::vector<std::string> comps;
  for (const auto& c : info.components) comps.push_back(toml_quoted(c));
  s += "components = [" + text::join(comps) + "]\n";
  s += "\n[files]\n";
  for (const auto& [file, sha] : info.files)
    s += toml_quoted(file) + " = " + toml_quoted(sha) + "\n";
  return s;
}

std::string default_install_root() {
  const char* xdg = std::getenv("XDG_DATA_HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/keel/plugins";
  const char* home = std::getenv("HOME");
  if (home && home[0] == '/') return std::string(home) + "/.local/share/keel/plugins";
  throw Error(
      "cannot tell the plugin directory: neither XDG_DATA_HOME nor HOME is set to an "
      "absolute path; hint: set HOME, or name the directory with --prefix DIR");
}

std::vector<InstalledPackage> list_installed(const std::string& root) {
  std::vector<InstalledPackage> out;
  for (const auto& name : subdirs(root)) {
    std::vector<InstalledPackage> versions;
    for (const auto& version : subdirs(root + "/" + name))
      versions.push_back(read_installed(root + "/" + name + "/" + version, name, version));
    sort_by_version(versions);
    for (auto& v : versions) out.push_back(std::move(v));
  }
  return out;
}

PackageSelection select_installed(const std::string& root,
                                  const std::map<std::string, VersionRequirement>& requirements) {
  std::map<std::string, std::vector<InstalledPackage>> by_name;  // intact, ascending
  for (auto& p : list_installed(root))
    if (p.problem.empty() && Version::valid(p.info.version))
      by_name[p.info.name].push_back(std::move(p));
  PackageSelection sel;
  for (const auto& [name, req] : requirements) {
    const auto it = by_name.find(name);
    bool met = false;
    if (it != by_name.end())
      for (auto v = it->second.rbegin(); v != it->second.rend() && !met; ++v)
        if (req.matches(Version::parse(v->info.version))) {
          sel.chosen.push_back(*v);
          met = true;
        }
    if (!met) {
      UnmetRequirement u{name, req.str(), {}};
      if (it != by_name.end())
        for (const auto& v : it->second) u.found.push_back(v.info.version);
      sel.unmet.push_back(std::move(u));
    }
  }
  for (const auto& [name, versions] : by_name)
    if (!requirements.count(name)) sel.chosen.push_back(versions.back());
  std::sort(sel.chosen.begin(), sel.chosen.end(),
            [](const InstalledPackage& a, const InstalledPackage& b) {
              return a.info.name < b.info.name;
            });
  return sel;
}

InstalledPackage install_package(const std::string& package, const std::string& root_in, bool force,
                                 bool* replaced) {
  if (replaced) *replaced = false;
  const std::string source = absolute_path(package);
  const std::string root = absolute_path(root_in);
  struct stat st;
  if (::stat(source.c_str(), &st) != 0) {
    if (errno == ENOENT)
      throw Error(package +
                  ": no such file or directory; hint: name a package directory or "
                  ".tar.gz made by `keel plugins pack`");
    sys_fail("checking", package, errno);
  }
  const bool is_dir = S_ISDIR(st.st_mode);
  if (!is_dir && !S_ISREG(st.st_mode))
    throw Error(package +
                ": neither a directory nor a file; hint: name a package directory or "
                ".tar.gz made by `keel plugins pack`");
  // A directory package is checked where it is, before anything is created or copied (and its
  // copy again, below).
  std::string shown = package;  // as the user named it, for messages
  while (shown.size() > 1 && shown.back() == '/') shown.pop_back();
  if (is_dir) verify_package_dir(source, shown);

  CreatedDirs created;
  make_dirs(root, created);
  ScratchDir staging(root, ".keel-install-");
  const std::string named = shown;
  if (is_dir) {
    std::error_code ec;
    for (auto it = fs::directory_iterator(source, ec); !ec && it != fs::end(it); it.increment(ec))
      copy_file(it->path().string(), staging.path() + "/" + it->path().filename().string());
    if (ec)
      throw Error(package + ": cannot read it: " + ec.message() + "; hint: check its permissions");
  } else {
    const std::string top = extract_package(source, staging.path(), named);
    shown = named + ":" + top;
  }
  const Located l = verify_package_dir(staging.path(), shown);
  const PackageInfo& info = l.info;
  // Each plugin's own libraries, found as the loader will find them (loader/trust.hpp): a
  // RUNPATH that is relative, leaves the package through $ORIGIN, or names a directory that is
  // missing or that another user can write would let that user's code in later.
  for (const auto& [file, sha256] : info.files) {
    UniqueFd fd(::open((staging.path() + "/" + file).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) sys_fail("opening", shown + "/" + file, errno);
    const std::string bad = install_dependency_problem(fd.get(), staging.path());
    if (!bad.empty()) throw Error(text::one_line(shown + "/" + file + ": not installed: " + bad));
  }
  const std::string expected_top = info.name + "-" + info.version;
  if (!is_dir && shown != named + ":" + expected_top)
    fail_at(named,
            "its top-level directory is " + toml_quoted(shown.substr(named.size() + 1) + "/") +
                ", not " + toml_quoted(expected_top + "/") +
                " as keel-plugin.toml's name and version say",
            kTarballHint);

  const std::string name_dir = root + "/" + info.name;
  const std::string target = name_dir + "/" + info.version;
  const std::string already = info.name + " " + info.version + " is already installed in " +
                              target +
                              "; hint: add --force to replace it, or `keel plugins remove " +
                              info.name + "@" + info.version + "` first";
  if (lexists(target) && !force) throw Error(already);

  InstalledPackage result;
  result.info = info;
  result.dir = target;
  result.source = source;
  result.installed_at = utc_now();
  write_file_durably(staging.path() + "/" + kInstalledMetadataFile,
                     installed_toml(result.source, result.installed_at), 0644);
  if (::chmod(staging.path().c_str(), 0755) != 0) sys_fail("chmod of", staging.path(), errno);
  fsync_path(staging.path());
  make_dirs(name_dir, created);

  if (!lexists(target)) {
    // Where RENAME_NOREPLACE is missing, rename() still refuses a non-empty existing directory.
    if (!durable_rename_new(staging.path(), target)) throw Error(already);  // installed meanwhile
    staging.release();
  } else if (durable_exchange(staging.path(), target)) {
    // The old package now sits in the staging directory, which goes away with `staging`.
    if (replaced) *replaced = true;
  } else {
    // No atomic exchange here: move the old one aside (onto an empty scratch directory), move
    // the new one in, and put the old one back if the new one did not get there.
    ScratchDir aside(root, ".keel-replaced-");
    try {
      durable_rename(target, aside.path());
      durable_rename(staging.path(), target);
    } catch (const FileError&) {
      if (!lexists(target) && ::rename(aside.path().c_str(), target.c_str()) == 0)
        aside.release();
      throw;
    }
    staging.release();
    if (replaced) *replaced = true;
  }
  created.keep();
  return result;
}

std::string remove_package(const std::string& root_in, const std::string& name,
                           const std::optional<std::string>& version) {
  const std::string root = absolute_path(root_in);
  const std::vector<std::string> names = subdirs(root);
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw Error(name + ": no package of that name is installed in " + root +
                (names.empty() ? " (none is)" : " (installed: " + text::join(names) + ")") +
                "; hint: " +
                text::did_you_mean_or(name, names, "`keel plugins --prefix " + root +
                                                       "` lists the installed packages"));
  }
  const std::string name_dir = root + "/" + name;
  const std::vector<std::string> versions = [&] {
    std::vector<InstalledPackage> v;
    for (const auto& d : subdirs(name_dir))
      v.push_back(read_installed(name_dir + "/" + d, name, d));
    sort_by_version(v);
    std::vector<std::string> out;
    for (const auto& p : v) out.push_back(fs::path(p.dir).filename().string());
    return out;
  }();
  std::string chosen;
  if (version) {
    if (std::find(versions.begin(), versions.end(), *version) == versions.end())
      throw Error(name + "@" + *version + ": that version is not installed in " + root +
                  " (installed: " + (versions.empty() ? "none" : text::join(versions)) + ")" +
                  (versions.empty() ? "; hint: nothing of " + name + " is left to remove"
                                    : "; hint: name one of these, e.g. `keel plugins remove " +
                                          name + "@" + versions.back() + "`"));
    chosen = *version;
  } else if (versions.size() == 1) {
    chosen = versions[0];
  } else if (versions.empty()) {
    throw Error(name + ": no version of it is installed in " + root + " (" + name_dir +
                " is empty); hint: remove that directory by hand");
  } else {
    throw Error(name + ": " + std::to_string(versions.size()) + " versions are installed in " +
                root + " (" + text::join(versions) +
                "); hint: name one, e.g. `keel plugins remove " + name + "@" + versions.back() +
                "`");
  }
  const std::string target = name_dir + "/" + chosen;
  // Moved out of sight in one step (onto an empty scratch directory), then deleted.
  ScratchDir trash(root, ".keel-remove-");
  durable_rename(target, trash.path());
  std::error_code ec;
  fs::remove_all(trash.path(), ec);
  if (ec)
    throw Error(name + " " + chosen + " is no longer installed, but deleting its files from " +
                trash.path() + " failed: " + ec.message() +
                "; hint: delete that directory by hand");
  trash.release();
  if (::rmdir(name_dir.c_str()) == 0) fsync_path(root);
  return chosen;
}

// ------------------------------------------------------------------------------------------
// pack

namespace {

struct PackFile {
  std::string name;    // in the package
  std::string path;    // in the build directory
  std::string sha256;  // what the loader hashed
};

// Streams `path` into the archive as the current entry's data; throws when its bytes no longer
// hash to `sha256`.
void write_entry_data(struct archive* a, const PackFile& f, const std::string& out) {
  UniqueFd fd(::open(f.path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) sys_fail("opening", f.path, errno);
  Sha256 sha;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) sys_fail("reading", f.path, errno);
    if (n == 0) break;
    sha.update(buf.data(), static_cast<size_t>(n));
    if (archive_write_data(a, buf.data(), static_cast<size_t>(n)) != n)
      throw Error("writing " + out + " failed: " + archive_error_string(a) +
                  "; hint: check that its directory is writable and has free space");
  }
  if (sha.hex() != f.sha256)
    throw Error(f.path +
                ": changed while it was packed; hint: pack again once the build has "
                "finished");
}

int64_t source_date() {
  const char* s = std::getenv("SOURCE_DATE_EPOCH");
  if (!s || !*s) return 0;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  return (*end == '\0' && v >= 0) ? static_cast<int64_t>(v) : 0;
}

void write_tarball(const std::string& out, const PackageInfo& info,
                   const std::vector<PackFile>& files) {
  const std::string dir = parent_of(out);
  std::string tmp = dir + "/." + fs::path(out).filename().string() + ".XXXXXX";
  UniqueFd fd(::mkstemp(tmp.data()));
  if (fd.get() < 0) sys_fail("creating a file in", dir, errno);
  struct Unlink {
    std::string path;
    ~Unlink() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } cleanup{tmp};
  if (::fchmod(fd.get(), 0644) != 0) sys_fail("chmod of", tmp, errno);

  WriteArchive a(archive_write_new(), archive_write_free);
  auto check = [&](int r) {
    if (r < ARCHIVE_WARN)
      throw Error("writing " + out + " failed: " + archive_error_string(a.get()) +
                  "; hint: check that its directory is writable and has free space");
  };
  if (!a) throw Error("libarchive could not start writing " + out);
  check(archive_write_add_filter_gzip(a.get()));
  check(archive_write_set_format_pax_restricted(a.get()));
  archive_write_set_options(a.get(), "gzip:!timestamp");  // reproducible: no time in the header
  check(archive_write_open_fd(a.get(), fd.get()));
  const std::string top = info.name + "-" + info.version;
  const int64_t mtime = source_date();
  auto header = [&](const std::string& path, mode_t type, mode_t perm, int64_t size) {
    std::unique_ptr<struct archive_entry, decltype(&archive_entry_free)> e(archive_entry_new(),
                                                                           archive_entry_free);
    archive_entry_set_pathname(e.get(), path.c_str());
    archive_entry_set_filetype(e.get(), type);
    archive_entry_set_perm(e.get(), perm);
    archive_entry_set_size(e.get(), size);
    archive_entry_set_mtime(e.get(), mtime, 0);
    archive_entry_set_uid(e.get(), 0);
    archive_entry_set_gid(e.get(), 0);
    check(archive_write_header(a.get(), e.get()));
  };
  header(top + "/", AE_IFDIR, 0755, 0);
  const std::string meta = package_info_toml(info);
  header(top + "/" + kPackageMetadataFile, AE_IFREG, 0644, static_cast<int64_t>(meta.size()));
  if (archive_write_data(a.get(), meta.data(), meta.size()) != static_cast<la_ssize_t>(meta.size()))
    check(ARCHIVE_FATAL);
  for (const auto& f : files) {
    struct stat st;
    if (::stat(f.path.c_str(), &st) != 0) sys_fail("checking", f.path, errno);
    header(top + "/" + f.name, AE_IFREG, 0644, st.st_size);
    write_entry_data(a.get(), f, out);
  }
  check(archive_write_close(a.get()));
  finish_file(fd, tmp);
  durable_rename(tmp, out);
  cleanup.path.clear();
}

void write_package_dir(const std::string& out, const PackageInfo& info,
                       const std::vector<PackFile>& files) {
  const std::string dir = parent_of(out);
  ScratchDir tmp(dir, "." + fs::path(out).filename().string() + ".");
  for (const auto& f : files)
    if (copy_file(f.path, tmp.path() + "/" + f.name) != f.sha256)
      throw Error(f.path +
                  ": changed while it was packed; hint: pack again once the build has "
                  "finished");
  write_file_durably(tmp.path() + "/" + kPackageMetadataFile, package_info_toml(info), 0644);
  if (::chmod(tmp.path().c_str(), 0755) != 0) sys_fail("chmod of", tmp.path(), errno);
  fsync_path(tmp.path());
  if (!durable_rename_new(tmp.path(), out))
    throw Error(out +
                ": already exists; hint: remove it, or write the package elsewhere with "
                "--output");
  tmp.release();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string pack_package(const std::string& build_dir, const std::optional<std::string>& output,
                         PackageInfo* packed) {
  const std::string bd = absolute_path(build_dir);
  if (!fs::is_directory(bd))
    throw Error(build_dir +
                ": not a directory; hint: name the plugin's build directory (the "
                "one `meson setup` made)");
  const std::string toml_path = bd + "/" + kPackageMetadataFile;
  if (!lexists(toml_path))
    throw Error(toml_path +
                ": not found; hint: the plugin's meson.build writes it into the "
                "build directory (`keel plugins new` sets that up); else write name, version, "
                "description and license there");
  const Located l = read_info(toml_path, toml_path, Keys::build);
  PackageInfo info = l.info;

  // The plugin libraries: regular *.so files at the top level that export the entry symbol.
  std::vector<std::string> candidates, skipped, plugins;
  std::error_code ec;
  for (auto it = fs::directory_iterator(bd, ec); !ec && it != fs::end(it); it.increment(ec)) {
    std::error_code sec;
    const std::string name = it->path().filename().string();
    if (fs::is_regular_file(it->symlink_status(sec)) && ends_with(name, ".so"))
      candidates.push_back(name);
  }
  if (ec)
    throw Error(build_dir + ": cannot read it: " + ec.message() + "; hint: check its permissions");
  std::sort(candidates.begin(), candidates.end());
  for (const auto& name : candidates) {
    UniqueFd fd(::open((bd + "/" + name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) sys_fail("opening", bd + "/" + name, errno);
    const std::string why = elf_plugin_check(fd.get());
    if (why.empty())
      plugins.push_back(name);
    else
      skipped.push_back(name + " (" + why + ")");
  }
  if (plugins.empty())
    throw Error(build_dir + ": no keel plugin .so in it" +
                (skipped.empty() ? "" : " (skipped: " + text::join(skipped, "; ") + ")") +
                "; hint: build the plugin first (`meson compile -C " + build_dir + "`)");

  Registry registry;
  std::vector<PackFile> files;
  const LoadedPlugin* cxx = nullptr;  // the first C++ plugin (with a LibTorch fingerprint)
  for (const auto& name : plugins) {
    const std::string path = bd + "/" + name;
    if (!registry.load(path))
      throw Error(text::one_line(path + ": cannot pack it: " + registry.refusals().back().reason));
    const LoadedPlugin& p = *registry.plugins().back();
    if (p.version != info.version)
      fail_at(l.where.at("version"),
              "says version " + info.version + ", but " + name + " declares " + p.version,
              "make them agree (the plugin's KEEL_PLUGIN(...) version and its meson.build "
              "project version), rebuild, and pack again");
    const keel_build_fingerprint& f = p.descriptor->fingerprint;
    if (f.torch_version != nullptr) {
      const std::string tv = bounded(f.torch_version);
      if (cxx && (tv != *info.torch_version || f.cxx11_abi != *info.cxx11_abi))
        throw Error(path + ": built with LibTorch " + tv +
                    " (_GLIBCXX_USE_CXX11_ABI=" + std::to_string(f.cxx11_abi) + "), but " +
                    cxx->path + " with LibTorch " + *info.torch_version +
                    " (_GLIBCXX_USE_CXX11_ABI=" + std::to_string(*info.cxx11_abi) +
                    "); hint: build every plugin of a package "
                    "against the same SDK");
      if (!cxx) {
        cxx = &p;
        info.torch_version = tv;
        info.cxx11_abi = f.cxx11_abi;
      }
    }
    info.abi_major = KEEL_ABI_MAJOR;  // the loader refuses every other major
    info.abi_minor = std::max(info.abi_minor, p.descriptor->abi_minor);
    info.files[name] = p.sha256;
    files.push_back({name, path, p.sha256});
  }
  for (const auto& c : registry.components())
    info.components.push_back(std::string(kind_name(c->kind)) + ":" + c->name);

  std::string out = output ? *output : info.name + "-" + info.version + ".tar.gz";
  out = absolute_path(out);
  if (ends_with(out, ".tar.gz")) {
    write_tarball(out, info, files);
  } else {
    if (lexists(out))
      throw Error(out +
                  ": already exists; hint: remove it, or write the package elsewhere with "
                  "--output");
    write_package_dir(out, info, files);
  }
  if (packed) *packed = info;
  return out;
}

}  // namespace keel
