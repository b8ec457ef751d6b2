// Plugin packages: install, remove and pack (the tools of `keel plugins`; the loader reads what
// they install: loader/installed.hpp).
//
// A package is a directory, or a .tar.gz holding exactly one top-level directory NAME-VERSION/,
// that contains keel-plugin.toml (its keys: loader/package_info.hpp) and the plugin .so files it
// lists under [files], nothing else (no subdirectories, no symbolic links, no other file types).
// Installed, it lives in ROOT/NAME/VERSION/ beside installed.toml (loader/installed.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "loader/installed.hpp"
#include "loader/package_info.hpp"

namespace keel {

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
