// The run manifest: a TOML file, its `extends` chain and `--set` overrides, merged into one
// table that keeps every value's source (file:line:col, or the --set argument).
#pragma once

#include <string>
#include <vector>

#include <toml++/toml.h>

#include "source.hpp"  // where(), kSetPrefix: the places its messages name

namespace keel {

struct Manifest {
  std::string path;  // the file named on the command line
  toml::table root;  // merged: bases first, then the file, then --set overrides
  // Every file read, by canonical path: the file named first, then the base it extends, then
  // that base's base, and so on (a lock is looked up along this chain: loader/lock.hpp).
  std::vector<std::string> files;
  // An array of tables of a base that an including file's value for the same key replaced
  // (`extends` merges tables key by key, but an array replaces the base's whole array):
  // `key` ("hooks", "optimizer.groups"), `where` the including file's value (file:line:col),
  // `base` the base's array and `base_types` the `type` of each of its entries ("console,
  // jsonl"), for the warning about a run left without metric sinks.
  struct Replaced {
    std::string key, where, base, base_types;
  };
  std::vector<Replaced> replaced;
};

// Reads `path`, resolves `extends = "base.toml"` (relative to the including file, recursively)
// and applies each "dotted.key=value" override (the value is parsed as TOML, and taken as a
// string when it is not valid TOML). Throws keel::Error naming file:line:col.
Manifest load_manifest(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace keel
