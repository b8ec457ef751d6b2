// MANIFEST.lock: the plugin files a run may load, by SHA-256.
//
// `keel plugins lock MANIFEST` writes it beside the manifest; `keel train|evaluate|validate
// MANIFEST` reads it when it exists. With a lock, discovery hashes each candidate file through
// the descriptor it will load from and loads only files whose hash the lock lists (see
// Registry::use_lock): a file whose hash differs is refused before any of its code runs.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace keel {

struct LockEntry {
  std::string name;     // the plugin's descriptor name
  std::string version;  // its descriptor version
  std::string path;     // where it was found when locked (absolute)
  std::string sha256;   // 64 lowercase hex digits
  std::vector<std::string> components;  // "kind:name" of each component the manifest uses
};

struct Lock {
  std::string file;  // the lock file's path
  std::vector<LockEntry> entries;

  const LockEntry* by_sha256(const std::string& sha256) const;
  const LockEntry* by_path(const std::string& path) const;
};

// "<manifest>.lock".
std::string lock_path_for(const std::string& manifest_path);

// The lock beside `manifest_path`, or nothing when there is none. Throws keel::Error
// (file:line:col, with a hint) when it exists but is malformed.
std::optional<Lock> read_lock(const std::string& manifest_path);

// Writes `lock` to lock.file (a temporary file, fsync'd, then renamed over it durably).
// `manifest` is named in the file's header comment.
void write_lock(const Lock& lock, const std::string& manifest);

}  // namespace keel
