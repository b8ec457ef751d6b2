// What changed between the manifest a checkpoint was saved with and the one resuming it.
// LibTorch-free.
#pragma once

#include <string>
#include <vector>

namespace keel {

struct ManifestChange {
  std::string key;       // dotted key: "optimizer.lr", "hooks[1].type"
  std::string before;    // TOML text of the value ("(absent)" when there was none)
  std::string after;
};

// Every key whose value differs between two resolved manifests (manifest.resolved.toml
// texts), in key order. Which of them break an exact continuation is the keys' rows' to say
// (config/resume_check.hpp).
std::vector<ManifestChange> manifest_changes(const std::string& saved, const std::string& now);

}  // namespace keel
