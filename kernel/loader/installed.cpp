#include "loader/installed.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "error.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

InstalledPackage read_installed(const std::string& dir, const std::string& name,
                                const std::string& version) {
  InstalledPackage p;
  p.dir = dir;
  p.info.name = name;
  p.info.version = version;
  try {
    const std::string shown = dir + "/" + kPackageMetadataFile;
    p.info = read_package_info(shown, shown, PackageInfoKeys::kFull).info;
    if (p.info.name != name || p.info.version != version)
      p.problem = shown + " says " + p.info.name + " " + p.info.version +
                  ", not what its directory is named";
    const std::string ipath = dir + "/" + kInstalledMetadataFile;
    const toml::table t = toml::parse(package_text::read_regular(ipath, ipath), ipath);
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

std::vector<std::string> package_subdirs(const std::string& dir) {
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

std::string default_install_root() {
  const char* xdg = std::getenv("XDG_DATA_HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/keel/plugins";
  const char* home = std::getenv("HOME");
  if (home && home[0] == '/') return std::string(home) + "/.local/share/keel/plugins";
  throw Error(
      "cannot tell the plugin directory: neither XDG_DATA_HOME nor HOME is set to an "
      "absolute path; hint: set HOME, or name the directory with --prefix DIR");
}

std::vector<InstalledPackage> installed_versions(const std::string& name_dir,
                                                 const std::string& name) {
  std::vector<InstalledPackage> versions;
  for (const auto& version : package_subdirs(name_dir))
    versions.push_back(read_installed(name_dir + "/" + version, name, version));
  sort_by_version(versions);
  return versions;
}

std::vector<InstalledPackage> list_installed(const std::string& root) {
  std::vector<InstalledPackage> out;
  for (const auto& name : package_subdirs(root))
    for (auto& v : installed_versions(root + "/" + name, name)) out.push_back(std::move(v));
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

}  // namespace keel
