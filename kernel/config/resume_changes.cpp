#include "config/resume_changes.hpp"

#include "config/keys.hpp"

namespace keel {

ResumeChanges resume_changes(const std::string& saved, const std::string& now) {
  ResumeChanges out;
  for (ManifestChange& c : manifest_changes(saved, now)) {
    // A key added to keel after the checkpoint was written, at its default, or one that keel
    // no longer writes and that was at its default (train.grad_accum beside global_batch, which
    // derives it): nothing changed.
    const char* dflt = row_default(c.key);
    if (c.before == kAbsent && dflt && c.after == value_text(dflt)) continue;
    if (c.after == kAbsent && dflt && c.before == value_text(dflt)) continue;
    (on_resume(c.key) == OnResume::kSafe ? out.safe : out.breaking).push_back(std::move(c));
  }
  return out;
}

}  // namespace keel
