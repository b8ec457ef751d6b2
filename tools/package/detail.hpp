// What the package tools' files (package.cpp: install and remove; archive.cpp: reading a
// package .tar.gz; pack.cpp: pack) share. They write through the file-system layer
// (files/files.hpp, whose FileErrors install_package, remove_package and pack_package give the
// packages' hint, file_hint); their own failed calls throw keel::Error naming the operation and
// the path (package_text::sys_fail, loader/package_info.hpp).
#pragma once

#include <cstddef>
#include <string>

namespace keel::package_detail {

inline constexpr const char* kTarballHint =
    "a package .tar.gz holds one directory NAME-VERSION/ with keel-plugin.toml and the plugin "
    ".so files; make one with `keel plugins pack BUILD_DIR`";

// `path` made absolute and normal, without a trailing '/' ("pkg/" -> "/cwd/pkg").
std::string absolute_path(const std::string& path);
// Copies the regular file `from` (not through a link) to the new file `to` (mode 0644,
// fsync'd); returns the SHA-256 of the bytes copied.
std::string copy_file(const std::string& from, const std::string& to);
// Whether anything (a dangling link too) is at `path`.
bool lexists(const std::string& path);

// A directory removed (with everything in it) when this goes out of scope, unless released.
class ScratchDir {
 public:
  // Creates a fresh directory `<dir>/<prefix>XXXXXX` (mode 0700 until chmod'ed).
  ScratchDir(const std::string& dir, const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  std::string path_;
};

// Extracts the package tarball's files into the empty directory `dest` (files only, mode 0644,
// each fsync'd); returns the name of its one top-level directory. The archive is read twice:
// first its headers and keel-plugin.toml (no data is written), then, with the [files] that
// keel-plugin.toml lists, again to write keel-plugin.toml and exactly those files. An entry
// that the checks refuse (archive.cpp: paths, links, entry types, names, the bounds of
// package.hpp), or a file that [files] does not list, is refused before any of its data is
// written; keel-plugin.toml must read the same both times. `named` is the package as the user
// named it, for messages about keel-plugin.toml.
std::string extract_package(const std::string& tarball, const std::string& dest,
                            const std::string& named);

}  // namespace keel::package_detail
