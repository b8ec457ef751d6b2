// Which manifest changes --resume accepts: the keys that changed between the manifest a
// checkpoint was saved with and this run's, split by their rows' OnResume (config/keys.hpp).
// LibTorch-free.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/manifest_changes.hpp"

namespace keel {

struct ResumeChanges {
  std::vector<ManifestChange> safe;      // the run still continues exactly
  std::vector<ManifestChange> breaking;  // training would compute something else
};

// The changes from `saved` to `now` (manifest.resolved.toml texts), each list in key order.
// Throws keel::Error when either is not valid TOML.
ResumeChanges resume_changes(const std::string& saved, const std::string& now);

}  // namespace keel
