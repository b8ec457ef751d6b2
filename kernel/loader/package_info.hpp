// keel-plugin.toml: the metadata of a plugin package (package/package.hpp describes the package
// around it), read by the loader for the installed packages and by the package tools:
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
// LibTorch-free.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace keel {

inline constexpr const char* kPackageMetadataFile = "keel-plugin.toml";

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

// Which keys a keel-plugin.toml holds: all of them (a package's), or only name, version,
// description and license (a plugin build directory's, which `keel plugins pack` completes).
enum class PackageInfoKeys { kFull, kBuild };

// keel-plugin.toml's content, and where each value sits ("path:line:col"; [files] entries
// under "files.<name>").
struct LocatedPackageInfo {
  PackageInfo info;
  std::map<std::string, std::string> where;
};

// Parses keel-plugin.toml's `text`, naming it `shown` in messages. Throws keel::Error.
LocatedPackageInfo parse_package_info(const std::string& text, const std::string& shown,
                                      PackageInfoKeys keys);
// The same for the regular file `path` (not read through a link).
LocatedPackageInfo read_package_info(const std::string& path, const std::string& shown,
                                     PackageInfoKeys keys);

// Message helpers the package code shares (loader/installed.cpp, package/).
namespace package_text {

inline constexpr const char* kLayoutHint =
    "a package holds only keel-plugin.toml and the plugin .so files its [files] table lists, "
    "with no subdirectories or links; make one with `keel plugins pack BUILD_DIR`";

// Throws keel::Error "<where>: <what>; hint: <hint>" on one line.
[[noreturn]] void fail_at(const std::string& where, const std::string& what,
                          const std::string& hint);
// The packages' hint for a failed file-system call with errno `err`.
std::string file_hint(int err);
// Throws "<what> <path> failed: <errno text>; hint: <file_hint>" (files/files.hpp's text).
[[noreturn]] void sys_fail(const std::string& what, const std::string& path, int err);
// The content of the regular file `path` (not read through a link), named `shown` in messages.
std::string read_regular(const std::string& path, const std::string& shown);
// A TOML basic string ("..." with escapes).
std::string toml_quoted(const std::string& s);
// "MAJOR.MINOR".
std::string abi_text(uint32_t major, uint32_t minor);

}  // namespace package_text

}  // namespace keel
