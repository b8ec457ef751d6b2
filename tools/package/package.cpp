// Plugin packages: install and remove (package.hpp), and the file helpers the package tools
// share (detail.hpp).
#include "package/package.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <system_error>
#include <vector>

#include "error.hpp"
#include "files/files.hpp"
#include "keel/abi.h"
#include "loader/dependencies.hpp"
#include "loader/digest.hpp"
#include "loader/elf.hpp"
#include "loader/registry.hpp"  // kernel_torch_version(), kernel_cxx11_abi()
#include "package/detail.hpp"
#include "text/text.hpp"
#include "unique_fd.hpp"

namespace fs = std::filesystem;

namespace keel {

using namespace package_text;

namespace package_detail {

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
  add_hint([&] {
    read_chunks(in.get(), from, [&](const char* data, size_t n) {
      sha.update(data, n);
      write_data(out.get(), data, n, to);
    });
  }, file_hint);
  finish_file(out, to, 0644);
  return sha.hex();
}

ScratchDir::ScratchDir(const std::string& dir, const std::string& prefix) {
  std::string tmpl = dir + "/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) sys_fail("creating a directory in", dir, errno);
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  if (path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

bool lexists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace package_detail

using namespace package_detail;

namespace {

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

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ------------------------------------------------------------------------------------------
// Checking a package directory


// Checks the package directory `dir` completely, naming it `shown` in messages; returns its
// metadata. Only reads: nothing of it is loaded.
LocatedPackageInfo verify_package_dir(const std::string& dir, const std::string& shown) {
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
  LocatedPackageInfo l =
      read_package_info(dir + "/" + kPackageMetadataFile, toml_shown, PackageInfoKeys::kFull);
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
// Installed packages

std::string installed_toml(const std::string& source, const std::string& when) {
  return "# Written by `keel plugins install`.\nsource = " + toml_quoted(source) +
         "\ninstalled = " + toml_quoted(when) + "\n";
}

// Renames the staging directory to `target` (where nothing is) or swaps it in for the package
// there; `already` is the error for a package installed meanwhile.
void move_into_place(ScratchDir& staging, const std::string& target, const std::string& root,
                     const std::string& already, bool* replaced) {
  if (!lexists(target)) {
    // Where RENAME_NOREPLACE is missing, rename() still refuses a non-empty existing directory.
    if (!durable_rename_new(staging.path(), target)) throw Error(already);  // installed meanwhile
    staging.release();
    return;
  }
  // The old package then sits in the staging directory, which goes away with `staging`.
  if (!durable_exchange(staging.path(), target)) {
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
  }
  if (replaced) *replaced = true;
}

}  // namespace

namespace {

// Whether `package` (`source`, made absolute) is a package directory, else a file (a .tar.gz);
// an error when it is missing or neither.
bool is_package_dir(const std::string& package, const std::string& source) {
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
  return is_dir;
}

// Copies the package directory `source`, or extracts the tarball `source`, into `staging`.
// Returns the staged package's name for messages: `named`, or `named:TOP` for a tarball whose
// top-level directory is TOP.
std::string stage_package(const std::string& package, const std::string& source, bool is_dir,
                          const std::string& staging, const std::string& named) {
  if (!is_dir) return named + ":" + extract_package(source, staging, named);
  std::error_code ec;
  for (auto it = fs::directory_iterator(source, ec); !ec && it != fs::end(it); it.increment(ec))
    copy_file(it->path().string(), staging + "/" + it->path().filename().string());
  if (ec)
    throw Error(package + ": cannot read it: " + ec.message() + "; hint: check its permissions");
  return named;
}

// Each plugin's own libraries, found as the loader will find them (loader/dependencies.hpp): a
// RUNPATH that is relative, leaves the package through $ORIGIN, or names a directory that is
// missing or that another user can write would let that user's code in later.
void check_plugin_libraries(const PackageInfo& info, const std::string& staging,
                            const std::string& shown) {
  for (const auto& [file, sha256] : info.files) {
    UniqueFd fd(::open((staging + "/" + file).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) sys_fail("opening", shown + "/" + file, errno);
    const std::string bad = install_dependency_problem(fd.get(), staging);
    if (!bad.empty()) throw Error(text::one_line(shown + "/" + file + ": not installed: " + bad));
  }
}

InstalledPackage install(const std::string& package, const std::string& root_in, bool force,
                         bool* replaced) {
  if (replaced) *replaced = false;
  const std::string source = absolute_path(package);
  const std::string root = absolute_path(root_in);
  const bool is_dir = is_package_dir(package, source);
  // A directory package is checked where it is, before anything is created or copied (and its
  // copy again, below).
  std::string named = package;  // as the user named it, for messages
  while (named.size() > 1 && named.back() == '/') named.pop_back();
  if (is_dir) verify_package_dir(source, named);

  CreatedDirs created;
  make_dirs(root, created);
  ScratchDir staging(root, ".keel-install-");
  const std::string shown = stage_package(package, source, is_dir, staging.path(), named);
  const LocatedPackageInfo l = verify_package_dir(staging.path(), shown);
  const PackageInfo& info = l.info;
  check_plugin_libraries(info, staging.path(), shown);
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

  move_into_place(staging, target, root, already, replaced);
  fsync_path(name_dir);
  fsync_path(root);
  created.keep();
  return result;
}

std::string remove(const std::string& root_in, const std::string& name,
                   const std::optional<std::string>& version) {
  const std::string root = absolute_path(root_in);
  const std::vector<std::string> names = package_subdirs(root);
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw Error(
        name + ": no package of that name is installed in " + root +
        (names.empty() ? " (none is)" : " (installed: " + text::join(names) + ")") + "; hint: " +
        text::did_you_mean_or(name, names, "`keel plugins --prefix " + root +
                                               "` lists the installed packages"));
  }
  const std::string name_dir = root + "/" + name;
  const std::vector<std::string> versions = [&] {
    std::vector<std::string> out;
    for (const auto& p : installed_versions(name_dir, name)) out.push_back(fs::path(p.dir).filename().string());
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
                root + " (" + text::join(versions) + "); hint: name one, e.g. `keel plugins remove " +
                name + "@" + versions.back() + "`");
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

}  // namespace

// The file-system layer's errors get the packages' hint (file_hint).
InstalledPackage install_package(const std::string& package, const std::string& root, bool force,
                                 bool* replaced) {
  return add_hint([&] { return install(package, root, force, replaced); }, file_hint);
}

std::string remove_package(const std::string& root, const std::string& name,
                           const std::optional<std::string>& version) {
  return add_hint([&] { return remove(root, name, version); }, file_hint);
}

}  // namespace keel
