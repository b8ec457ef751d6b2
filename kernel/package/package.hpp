// Plugin packages: keel-plugin.toml, install, remove, pack, and the installed packages.
//
// A package is a directory, or a .tar.gz holding exactly one top-level directory NAME-VERSION/,
// that contains keel-plugin.toml and the plugin .so files it lists under [files], nothing else
// (no subdirectories, no symbolic links, no other file types):
//
//   name = "acme-losses"        # [a-z0-9][a-z0-9._-]*, at most 64 bytes
//   version = "1.2.0"           # semver 2.0
//   description = "..."
//   license = "MIT"             # SPDX identifier (any non-empty string)
//   abi = "1.3"                 # the highest plugin ABI MAJOR.MINOR its descriptors declare
//   torch_version = "1.13.1"    # C++ plugins: the LibTorch they were built with; absent for C
//   cxx11_abi = 1               # C++ plugins: _GLIBCXX_USE_CXX11_ABI; absent for C
//   components = ["loss:my_ce"] # KIND:NAME of every component
//   [files]
//   "libacme-losses.so" = "<sha256, 64 lowercase hex digits>"
//
// Installed packages live side by side in ROOT/NAME/VERSION/ (VERSION as the package writes
// it), each holding the package's files plus installed.toml (`source`: the absolute path of
// the package installed; `installed`: when, UTC). Directories are mode 0755 and files 0644, as
// the loader wants them. Entries of ROOT whose names start with '.' are install and remove
// scratch directories, never packages. LibTorch-free.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loader/semver.hpp"

namespace keel {

inline constexpr const char* kPackageMetadataFile = "keel-plugin.toml";
inline constexpr const char* kInstalledMetadataFile = "installed.toml";

// Bounds on a package .tar.gz, checked from each entry's header before any of its data is
// written (and each file's bytes again as they are written): at most kMaxPackageEntries entries
// (directories included), each file at most kMaxPackageFileBytes, all files together at most
// kMaxPackageBytes, keel-plugin.toml at most kMaxPackageInfoBytes (it is read into memory).
// keel's own plugins are under 400 KiB each; the bounds leave room for plugins with large
// embedded kernels while keeping a crafted archive from filling the disk. Sparse entries are
// refused outright.
inline constexpr uint64_t kMaxPackageEntries = 256;
inline constexpr uint64_t kMaxPackageFileBytes = uint64_t{1} << 30;  // 1 GiB
inline constexpr uint64_t kMaxPackageBytes = uint64_t{4} << 30;      // 4 GiB
inline constexpr uint64_t kMaxPackageInfoBytes = uint64_t{1} << 20;  // 1 MiB

struct PackageInfo {
  std::string name;
  std::string version;  // semver text, as written
  std::string description;
  std::string license;
  uint32_t abi_major = 0, abi_minor = 0;
  std::optional<std::string> torch_version;  // both set (C++ plugins) or both unset (plain C)
  std::optional<int> cxx11_abi;
  std::vector<std::string> components;       // "kind:name", in the file's order
  std::map<std::string, std::string> files;  // file name -> sha256 (lowercase hex)
};

// Why `name` is not a valid package name, or "" when it is.
std::string package_name_problem(const std::string& name);

// Reads and validates a complete keel-plugin.toml: every key present and of its type, no
// unknown key. Throws keel::Error "<path>:line:col: <what>; hint: <what to do>".
PackageInfo read_package_info(const std::string& path);

// The keel-plugin.toml text for `info`: keys in the order above, components in their order,
// [files] sorted by name; the same info always gives the same bytes.
std::string package_info_toml(const PackageInfo& info);

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

// Installs the package at `package` (a directory or a .tar.gz) into ROOT/NAME/VERSION: checks
// it completely (metadata, every file's sha256, no unlisted file, every .so a keel plugin by
// its ELF symbol table, plugin ABI and LibTorch build compatible with this keel) in a staging
// directory inside ROOT, then renames it into place. A .tar.gz is read twice: once for its
// headers and keel-plugin.toml, writing nothing, then to extract exactly the files
// keel-plugin.toml lists (within the bounds above). Nothing is ever loaded or run. The same
// NAME/VERSION already installed is an error unless `force`, which swaps the new directory in
// for the old one atomically (renameat2 RENAME_EXCHANGE; where the file system lacks it, the
// old directory is moved aside first, so for a moment neither is there). On any failure the
// staging directory, and every directory install created, is removed: ROOT is as it was.
// `*replaced` (when given) tells whether an installed package was replaced. Throws keel::Error.
InstalledPackage install_package(const std::string& package, const std::string& root, bool force,
                                 bool* replaced = nullptr);

// Removes ROOT/NAME/VERSION (moved aside atomically first, then deleted), and ROOT/NAME when
// no version is left. Without `version`, NAME must have exactly one version installed.
// Returns the version removed. Throws keel::Error naming the installed names or versions when
// the package is not installed or the version is ambiguous.
std::string remove_package(const std::string& root, const std::string& name,
                           const std::optional<std::string>& version);

// Makes a package from a plugin's build directory: BUILD_DIR/keel-plugin.toml gives name,
// version, description and license (only these); the regular files BUILD_DIR/*.so whose ELF
// symbol table exports keel_plugin_entry are the plugins (other .so files are skipped). Each is
// loaded (keel::Registry::load) to read its descriptor, whose version must equal the toml's;
// abi (the highest minor declared), torch_version/cxx11_abi (from the C++ plugins'
// fingerprints, which must agree; absent when every plugin is plain C), components and [files]
// are filled in. `output` ending in ".tar.gz" (default: NAME-VERSION.tar.gz in the working
// directory) gets a gzip'd tar holding NAME-VERSION/ (replacing an existing file); any other
// `output` becomes a package directory, which must not exist yet. Either is written under a
// temporary name and renamed into place. Returns the path written. Throws keel::Error.
std::string pack_package(const std::string& build_dir, const std::optional<std::string>& output,
                         PackageInfo* packed = nullptr);

}  // namespace keel
