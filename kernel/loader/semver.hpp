// Semantic versions (semver.org 2.0) and version requirements, for plugin packages and a
// manifest's `[plugins] require`.
//
// A requirement is a comma-separated list of comparators, all of which a version must meet:
//   >=1.2.0  >1.2  <=1.2.3  <2  =1.2.3  1.2.3 (bare: exact, like =)  ^1.2  ~1.2.3  *
// with Cargo's meaning of a partial version (missing parts are wildcards):
//   =1.2   means >=1.2.0, <1.3.0        >1.2   means >=1.3.0       <=1.2  means <1.3.0
//   <2     means <2.0.0                 ~1.2.3 means >=1.2.3, <1.3.0
//   ^1.2.3 means >=1.2.3, <2.0.0        ^0.2.3 means >=0.2.3, <0.3.0   ^0.0.3 means =0.0.3
//   ^0.0   means <0.1.0                 ^0     means <1.0.0            ~1 and ^1 mean =1
// A pre-release (1.3.0-rc.1) meets a requirement only when one of its comparators names a
// pre-release of the same MAJOR.MINOR.PATCH (">=1.3.0-rc.0" admits 1.3.0-rc.1, not 1.4.0-rc.1);
// "*" and every other comparator leave pre-releases out. Build metadata (+...) is kept but
// ignored by every comparison. LibTorch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace keel {

struct Version {
  uint64_t major = 0, minor = 0, patch = 0;
  std::vector<std::string> pre;  // dot-separated pre-release identifiers ("rc", "1")
  std::string build;             // after '+', without it; "" when none

  // Parses MAJOR.MINOR.PATCH[-PRE][+BUILD] (no leading zeros in numbers, no spaces). Throws
  // keel::Error "'<text>': <what is wrong>" (the caller adds where the text came from).
  static Version parse(const std::string& text);
  // True when `text` parses.
  static bool valid(const std::string& text);
  // The version as written (canonical: semver admits one spelling of each version).
  std::string str() const;
};

// Semver precedence: <0, 0 or >0. Build metadata is ignored, so 1.0.0+a and 1.0.0+b compare 0.
int compare(const Version& a, const Version& b);
inline bool operator<(const Version& a, const Version& b) { return compare(a, b) < 0; }
inline bool operator>(const Version& a, const Version& b) { return compare(a, b) > 0; }
inline bool operator<=(const Version& a, const Version& b) { return compare(a, b) <= 0; }
inline bool operator>=(const Version& a, const Version& b) { return compare(a, b) >= 0; }
inline bool operator==(const Version& a, const Version& b) { return compare(a, b) == 0; }
inline bool operator!=(const Version& a, const Version& b) { return compare(a, b) != 0; }

class VersionRequirement {
 public:
  // "*": every version that is not a pre-release.
  VersionRequirement();
  // Parses a requirement (see the top of this file). Throws keel::Error "'<text>': <what is
  // wrong>", naming the comparator at fault when there are several.
  static VersionRequirement parse(const std::string& text);

  bool matches(const Version& v) const;
  // The requirement as given to parse() ("*" for the default one).
  const std::string& str() const { return text_; }

 private:
  enum class Op { eq, gt, ge, lt, le };
  struct Bound {
    Op op;
    Version v;
  };
  // Adds the bounds that one comparator stands for: `op` (">=", "^", ...; "" for a bare
  // version) applied to `v`, of which the first `parts` (1 to 3) were written.
  void add_bounds(const std::string& op, const Version& v, int parts);

  std::string text_;
  std::vector<Bound> bounds_;  // all must hold
  // MAJOR.MINOR.PATCH of each comparator that names a pre-release: a pre-release version
  // must share one of them.
  std::vector<Version> pre_allowed_;
};

}  // namespace keel
