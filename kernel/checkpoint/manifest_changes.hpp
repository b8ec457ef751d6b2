// What changed between the manifest a checkpoint was saved with and the one resuming it.
// LibTorch-free.
#pragma once

#include <string>
#include <vector>

namespace keel {

inline constexpr const char* kAbsent = "(absent)";  // a side of a change without the key

struct ManifestChange {
  std::string key;       // dotted key: "optimizer.lr", "hooks[1].type"
  std::string before;    // TOML text of the value (kAbsent when there was none)
  std::string after;
};

// Every key whose value differs between two resolved manifests (manifest.resolved.toml
// texts), in key order. Which of them break an exact continuation is the keys' rows' to say
// (config/resume_changes.hpp).
std::vector<ManifestChange> manifest_changes(const std::string& saved, const std::string& now);

// A TOML value ("0", "\"auto\"", "0.001") as manifest_changes writes it (floats in their
// shortest form); "" when it is not one.
std::string value_text(const std::string& toml_value);

}  // namespace keel
