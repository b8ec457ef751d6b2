// The installed plugin packages (`keel plugins install`, package/package.hpp), as the loader
// searches them and `keel plugins` lists them.
//
// Installed packages live side by side in ROOT/NAME/VERSION/ (VERSION as the package writes
// it), each holding the package's files plus installed.toml (`source`: the absolute path of
// the package installed; `installed`: when, UTC). Directories are mode 0755 and files 0644, as
// the loader wants them. Entries of ROOT whose names start with '.' are install and remove
// scratch directories, never packages. LibTorch-free.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "loader/package_info.hpp"
#include "loader/semver.hpp"

namespace keel {

inline constexpr const char* kInstalledMetadataFile = "installed.toml";

// $XDG_DATA_HOME/keel/plugins when XDG_DATA_HOME is set to an absolute path, else
// $HOME/.local/share/keel/plugins. Throws keel::Error when neither variable helps.
std::string default_install_root();

struct InstalledPackage {
  PackageInfo info;          // from its keel-plugin.toml (as far as it could be read)
  std::string dir;           // ROOT/NAME/VERSION
  std::string source;        // installed.toml's source ("" when unreadable)
  std::string installed_at;  // installed.toml's time, "YYYY-MM-DDTHH:MM:SSZ" ("" when unreadable)
  // "" for an intact installation; else why it cannot be used (its metadata is unreadable, or
  // names another NAME/VERSION than its directory). Files are not re-hashed here.
  std::string problem;
};

// Every ROOT/NAME/VERSION directory, sorted by name, then by version precedence (unparsable
// versions last). An absent ROOT holds none. Throws keel::Error when ROOT cannot be read.
std::vector<InstalledPackage> list_installed(const std::string& root);

// The versions of one name installed in ROOT/NAME (`name_dir`), sorted as list_installed sorts
// them. Throws keel::Error when `name_dir` cannot be read.
std::vector<InstalledPackage> installed_versions(const std::string& name_dir,
                                                 const std::string& name);

// The names of the directories in `dir` (links to directories not followed), sorted, without
// those starting with '.'; none when `dir` is absent. Throws keel::Error when it cannot be read.
std::vector<std::string> package_subdirs(const std::string& dir);

struct UnmetRequirement {
  std::string name;
  std::string requirement;         // as written
  std::vector<std::string> found;  // the intact installed versions of `name`, ascending
};

struct PackageSelection {
  std::vector<InstalledPackage> chosen;  // one per name, sorted by name
  std::vector<UnmetRequirement> unmet;   // in requirement name order
};

// One installed version per name: for a name in `requirements`, the highest intact version
// that meets its requirement (none, and an UnmetRequirement, when no installed version does,
// or the name is not installed); for every other installed name, its highest intact version.
// Packages with a problem are never chosen.
PackageSelection select_installed(const std::string& root,
                                  const std::map<std::string, VersionRequirement>& requirements);

}  // namespace keel
