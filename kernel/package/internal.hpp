// What the package sources share; not part of package.hpp's interface. package.cpp reads and
// checks keel-plugin.toml and package directories, archive.cpp reads and writes package
// .tar.gz files, install.cpp installs, removes and lists packages, pack.cpp makes them.
// LibTorch-free.
#pragma once

#include <cerrno>
#include <map>
#include <string>
#include <system_error>
#include <filesystem>
#include <vector>

#include "files/files.hpp"
#include "keel/abi.h"
#include "package/package.hpp"

#define KEEL_PKG_STR2(x) #x
#define KEEL_PKG_STR(x) KEEL_PKG_STR2(x)
// This keel's plugin ABI as "MAJOR.MINOR".
#define KEEL_PKG_ABI KEEL_PKG_STR(KEEL_ABI_MAJOR) "." KEEL_PKG_STR(KEEL_ABI_MINOR)

namespace keel::package_detail {

inline constexpr const char* kLayoutHint =
    "a package holds only keel-plugin.toml and the plugin .so files its [files] table lists, "
    "with no subdirectories or links; make one with `keel plugins pack BUILD_DIR`";
inline constexpr const char* kTarballHint =
    "a package .tar.gz holds one directory NAME-VERSION/ with keel-plugin.toml and the plugin "
    ".so files; make one with `keel plugins pack BUILD_DIR`";

// ------------------------------------------------------------------------------------------
// Small file-system helpers, on top of files/files.hpp (install.cpp). Each failure throws
// keel::FileError naming the operation and path; the public functions of package.hpp add
// file_hint's hint to it (add_hint).

[[noreturn]] inline void sys_fail(const std::string& what, const std::string& path, int err) {
  throw FileError(what, path, err);
}

inline std::string file_hint(int err) {
  return err == ENOSPC || err == EDQUOT
             ? "free some space on that file system"
             : "check that its directory exists and that you may write there";
}

// `path` made absolute and normal, without a trailing '/' ("pkg/" -> "/cwd/pkg").
std::string absolute_path(const std::string& path);

// Whether `path` exists (lstat: a symbolic link counts).
bool lexists(const std::string& path);

// Copies the regular file `from` (not through a link) to the new file `to` (mode 0644,
// fsync'd); returns the SHA-256 of the bytes copied.
std::string copy_file(const std::string& from, const std::string& to);

// A directory removed (with everything in it) when this goes out of scope, unless released.
class ScratchDir {
 public:
  // Creates a fresh directory `<dir>/<prefix>XXXXXX` (mode 0700 until chmod'ed).
  ScratchDir(const std::string& dir, const std::string& prefix);
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  std::string path_;
};

// ------------------------------------------------------------------------------------------
// keel-plugin.toml and package directories (package.cpp)

// A TOML basic string ("..." with escapes).
std::string toml_quoted(const std::string& s);

// Throws keel::Error "<where>: <what>; hint: <hint>", on one line.
[[noreturn]] void fail_at(const std::string& where, const std::string& what,
                          const std::string& hint);

// Which keys a keel-plugin.toml holds: all of them (a package's), or those a plugin's build
// directory gives `keel plugins pack` (name, version, description, license).
enum class Keys { full, build };

// keel-plugin.toml's content, and where each value sits ("path:line:col"; [files] entries
// under "files.<name>").
struct Located {
  PackageInfo info;
  std::map<std::string, std::string> where;
};

// keel-plugin.toml's `text`, named `shown` in messages, checked.
Located parse_info(const std::string& text, const std::string& shown, Keys keys);

// The content of the file `path` (not read through a link), named `shown` in messages.
std::string read_regular(const std::string& path, const std::string& shown);

// The keel-plugin.toml at `path`, named `shown` in messages, read and checked.
Located read_info(const std::string& path, const std::string& shown, Keys keys);

// "MAJOR.MINOR".
std::string abi_text(uint32_t major, uint32_t minor);

// Checks the package directory `dir` completely, naming it `shown` in messages; returns its
// metadata. Only reads: nothing of it is loaded.
Located verify_package_dir(const std::string& dir, const std::string& shown);

// ------------------------------------------------------------------------------------------
// Package .tar.gz files (archive.cpp)

// Extracts the package tarball's files into the empty directory `dest` (files only, mode 0644,
// each fsync'd); returns the name of its one top-level directory. The archive is read twice:
// first its headers and keel-plugin.toml (no data is written), then, with the [files] that
// keel-plugin.toml lists, again to write keel-plugin.toml and exactly those files. An entry
// that walk_package refuses, or a file that [files] does not list, is refused before any of
// its data is written; keel-plugin.toml must read the same both times. `named` is the package
// as the user named it, for messages about keel-plugin.toml.
std::string extract_package(const std::string& tarball, const std::string& dest,
                            const std::string& named);

// A plugin file of a package being packed.
struct PackFile {
  std::string name;    // in the package
  std::string path;    // in the build directory
  std::string sha256;  // what the loader hashed
};

// Writes the package .tar.gz `out` (NAME-VERSION/ with keel-plugin.toml and `files`) under a
// temporary name, then renames it into place.
void write_tarball(const std::string& out, const PackageInfo& info,
                   const std::vector<PackFile>& files);

}  // namespace keel::package_detail
