// Installing, removing and listing the installed packages (ROOT/NAME/VERSION).
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <optional>
#include <vector>

#include "error.hpp"
#include "loader/digest.hpp"
#include "loader/trust.hpp"
#include "package/internal.hpp"
#include "text/text.hpp"
#include "unique_fd.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace package_detail {

std::string absolute_path(const std::string& path) {
  fs::path p = fs::absolute(path).lexically_normal();
  if (p.has_parent_path() && p.filename().empty()) p = p.parent_path();
  return p.string();
}

bool lexists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

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

ScratchDir::ScratchDir(const std::string& dir, const std::string& prefix) {
  std::string tmpl = dir + "/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) sys_fail("creating a directory in", dir, errno);
  path_ = tmpl;
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

// The package at `package` (absolute: `source`; a directory when `is_dir`, else a .tar.gz)
// copied or extracted into `staging` and checked there completely; `shown` becomes its name
// for messages (NAME:TOP for a .tar.gz).
Located stage(const std::string& package, const std::string& source, bool is_dir,
              const std::string& staging, std::string& shown) {
  const std::string named = shown;
  if (is_dir) {
    std::error_code ec;
    for (auto it = fs::directory_iterator(source, ec); !ec && it != fs::end(it); it.increment(ec))
      copy_file(it->path().string(), staging + "/" + it->path().filename().string());
    if (ec)
      throw Error(package + ": cannot read it: " + ec.message() + "; hint: check its permissions");
  } else {
    const std::string top = extract_package(source, staging, named);
    shown = named + ":" + top;
  }
  Located l = verify_package_dir(staging, shown);
  const PackageInfo& info = l.info;
  // Each plugin's own libraries, found as the loader will find them (loader/trust.hpp): a
  // RUNPATH that is relative, leaves the package through $ORIGIN, or names a directory that is
  // missing or that another user can write would let that user's code in later.
  for (const auto& [file, sha256] : info.files) {
    UniqueFd fd(::open((staging + "/" + file).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) sys_fail("opening", shown + "/" + file, errno);
    const std::string bad = install_dependency_problem(fd.get(), staging);
    if (!bad.empty()) throw Error(text::one_line(shown + "/" + file + ": not installed: " + bad));
  }
  const std::string expected_top = info.name + "-" + info.version;
  if (!is_dir && shown != named + ":" + expected_top)
    fail_at(named,
            "its top-level directory is " + toml_quoted(shown.substr(named.size() + 1) + "/") +
                ", not " + toml_quoted(expected_top + "/") +
                " as keel-plugin.toml's name and version say",
            kTarballHint);
  return l;
}

// Moves the staged package into `target`: renamed there when there is none (`already` is the
// error when one appeared meanwhile), else swapped in for the one there. Returns whether an
// installed package was replaced.
bool put_in_place(ScratchDir& staging, const std::string& root, const std::string& target,
                  const std::string& already) {
  if (!lexists(target)) {
    // Where RENAME_NOREPLACE is missing, rename() still refuses a non-empty existing directory.
    if (!durable_rename_new(staging.path(), target)) throw Error(already);  // installed meanwhile
    staging.release();
    return false;
  }
  // The old package then sits in the staging directory, which goes away with `staging`.
  if (durable_exchange(staging.path(), target)) return true;
  // No atomic exchange here: move the old one aside (onto an empty scratch directory), move
  // the new one in, and put the old one back if the new one did not get there.
  ScratchDir aside(root, ".keel-replaced-");
  try {
    durable_rename(target, aside.path());
    durable_rename(staging.path(), target);
  } catch (const FileError&) {
    if (!lexists(target) && ::rename(aside.path().c_str(), target.c_str()) == 0) aside.release();
    throw;
  }
  staging.release();
  return true;
}

InstalledPackage install(const std::string& package, const std::string& root_in, bool force,
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
  // copy again, in stage).
  std::string shown = package;  // as the user named it, for messages
  while (shown.size() > 1 && shown.back() == '/') shown.pop_back();
  if (is_dir) verify_package_dir(source, shown);

  CreatedDirs created;
  make_dirs(root, created);
  ScratchDir staging(root, ".keel-install-");
  const PackageInfo info = stage(package, source, is_dir, staging.path(), shown).info;

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
  const bool swapped = put_in_place(staging, root, target, already);
  if (replaced) *replaced = swapped;
  created.keep();
  return result;
}

std::string remove(const std::string& root_in, const std::string& name,
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

}  // namespace

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

InstalledPackage install_package(const std::string& package, const std::string& root, bool force,
                                 bool* replaced) {
  return add_hint([&] { return install(package, root, force, replaced); }, file_hint);
}

std::string remove_package(const std::string& root, const std::string& name,
                           const std::optional<std::string>& version) {
  return add_hint([&] { return remove(root, name, version); }, file_hint);
}

}  // namespace keel
