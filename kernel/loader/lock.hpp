// MANIFEST.lock: the plugin files a run may load, by SHA-256, and the libraries of their own
// they load with them.
//
// A lock belongs to a manifest file by its canonical path: `keel plugins lock MANIFEST` writes
// REAL.lock beside REAL, the file MANIFEST names once every symlink is resolved. `keel
// train|evaluate|validate MANIFEST` and `keel plugins [show NAME] --manifest MANIFEST` look for
// a lock along the manifest's `extends` chain: MANIFEST's own, else its base's, else the base's
// base, ...: the first that exists applies (so a manifest that extends a locked one runs under
// that lock until it has its own). `[plugins] locked = true` makes a missing lock an error.
// With a lock, discovery hashes each candidate file in the sealed copy it will load from and
// loads only files whose hash the lock lists (see Registry::use_lock), and only with the
// non-system libraries listed under that entry ([[plugin.dependencies]]: name, path, sha256)
// with those hashes: a file whose hash differs is refused before any of its code runs.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace keel {

// A library of the plugin's own that it loads with it (registry.hpp: a non-system dependency).
struct LockDependency {
  std::string name;    // the soname the plugin's DT_NEEDED names
  std::string path;    // where it was found when locked
  std::string sha256;  // 64 lowercase hex digits
};

struct LockEntry {
  std::string name;     // the plugin's descriptor name
  std::string version;  // its descriptor version
  std::string path;     // where it was found when locked (absolute)
  std::string sha256;   // 64 lowercase hex digits
  std::vector<std::string> components;  // "kind:name" of each component the manifest uses
  // Its non-system dependencies ([[plugin.dependencies]] tables), each of which must have this
  // hash for the plugin to load.
  std::vector<LockDependency> dependencies;
};

struct Lock {
  std::string file;      // the lock file's path
  std::string manifest;  // the manifest file it belongs to (canonical)
  std::vector<LockEntry> entries;

  const LockEntry* by_sha256(const std::string& sha256) const;
  const LockEntry* by_path(const std::string& path) const;
};

// "<canonical manifest path>.lock".
std::string lock_path_for(const std::string& manifest_path);

// The lock of the manifest file `manifest_path` (its canonical path's), or nothing when there
// is none. Throws keel::Error (file:line:col, with a hint) when it exists but is malformed.
std::optional<Lock> read_lock(const std::string& manifest_path);

// The first lock along `manifest_files` (a Manifest's `files`: the file named, then its bases),
// or nothing when none of them has one.
std::optional<Lock> find_lock(const std::vector<std::string>& manifest_files);

// Writes `lock` to lock.file (a temporary file, fsync'd, then renamed over it durably).
// `manifest` is named in the file's header comment.
void write_lock(const Lock& lock, const std::string& manifest);

}  // namespace keel
