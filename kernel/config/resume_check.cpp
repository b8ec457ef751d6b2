#include "config/resume_check.hpp"

#include "config/keys.hpp"

namespace keel {

ResumeChanges resume_changes(const std::string& saved, const std::string& now) {
  ResumeChanges out;
  for (ManifestChange& c : manifest_changes(saved, now))
    (on_resume(c.key) == OnResume::kSafe ? out.safe : out.breaking).push_back(std::move(c));
  return out;
}

}  // namespace keel
