#include "loader/semver.hpp"

#include <algorithm>
#include <cctype>
#include <limits>
#include <optional>

#include "error.hpp"

namespace keel {
namespace {

constexpr const char* kNotAVersion = "not a version (MAJOR.MINOR.PATCH, e.g. 1.2.0)";
constexpr const char* kNotAComparator =
    "not a version (MAJOR.MINOR.PATCH, or MAJOR.MINOR or MAJOR after an operator, e.g. >=1.2)";

// The largest number a version may hold: one more still fits (a bound like <1.3.0 for ~1.2).
constexpr uint64_t kMaxNumber = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// What went wrong in one version text, as a phrase (the callers add the quoted text).
struct Bad {
  std::string why;
};

bool all_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

uint64_t number(const std::string& s, const char* generic) {
  if (!all_digits(s)) throw Bad{generic};
  if (s.size() > 1 && s[0] == '0') throw Bad{"a number must not have a leading zero ('" + s + "')"};
  uint64_t v = 0;
  for (char c : s) {
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (kMaxNumber - d) / 10)
      throw Bad{"the number " + s + " is too large (at most 2^63 - 1)"};
    v = v * 10 + d;
  }
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

void check_identifiers(const std::string& part, const char* what, bool numeric_rule) {
  for (const auto& id : split(part, '.')) {
    if (id.empty()) throw Bad{std::string("empty ") + what + " identifier"};
    for (unsigned char c : id)
      if (!std::isalnum(c) && c != '-')
        throw Bad{std::string(what) + " identifier '" + id +
                  "' may hold only 0-9, A-Z, a-z and '-'"};
    if (numeric_rule && all_digits(id) && id.size() > 1 && id[0] == '0')
      throw Bad{std::string("numeric ") + what + " identifier '" + id +
                "' must not have a leading zero"};
  }
}

// A version whose MINOR and PATCH may be missing (`parts` says how many were given: 1 to 3).
struct Partial {
  Version v;
  int parts = 3;
};

Partial parse_partial(const std::string& text, bool allow_partial) {
  const char* generic = allow_partial ? kNotAComparator : kNotAVersion;
  Partial p;
  std::string core = text;
  const size_t plus = core.find('+');
  if (plus != std::string::npos) {
    p.v.build = core.substr(plus + 1);
    core.resize(plus);
    check_identifiers(p.v.build, "build metadata", false);
  }
  const size_t dash = core.find('-');
  std::string pre;
  if (dash != std::string::npos) {
    pre = core.substr(dash + 1);
    core.resize(dash);
    check_identifiers(pre, "pre-release", true);
  }
  const auto nums = split(core, '.');
  if (nums.size() > 3 || (!allow_partial && nums.size() != 3)) throw Bad{generic};
  p.parts = static_cast<int>(nums.size());
  p.v.major = number(nums[0], generic);
  if (nums.size() > 1) p.v.minor = number(nums[1], generic);
  if (nums.size() > 2) p.v.patch = number(nums[2], generic);
  if (!pre.empty() || dash != std::string::npos) {
    if (p.parts != 3) throw Bad{"a pre-release needs all of MAJOR.MINOR.PATCH"};
    p.v.pre = split(pre, '.');
  }
  if ((plus != std::string::npos) && p.parts != 3)
    throw Bad{"build metadata needs all of MAJOR.MINOR.PATCH"};
  return p;
}

int compare_identifier(const std::string& a, const std::string& b) {
  const bool na = all_digits(a), nb = all_digits(b);
  if (na && nb) {
    if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
    return a.compare(b) < 0 ? -1 : (a == b ? 0 : 1);
  }
  if (na != nb) return na ? -1 : 1;  // numeric identifiers have lower precedence
  return a.compare(b) < 0 ? -1 : (a == b ? 0 : 1);
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

Version plain(uint64_t major, uint64_t minor, uint64_t patch) {
  Version v;
  v.major = major;
  v.minor = minor;
  v.patch = patch;
  return v;
}

// The comparator's operator (">=", "<=", ">", "<", "=", "^" or "~"), "" for a bare version.
std::string leading_operator(const std::string& comparator) {
  for (const char* o : {">=", "<=", ">", "<", "=", "^", "~"})
    if (comparator.rfind(o, 0) == 0) return o;
  return "";
}

}  // namespace

Version Version::parse(const std::string& text) {
  try {
    return parse_partial(text, false).v;
  } catch (const Bad& b) {
    throw Error("'" + text + "': " + b.why);
  }
}

bool Version::valid(const std::string& text) {
  try {
    parse_partial(text, false);
    return true;
  } catch (const Bad&) {
    return false;
  }
}

std::string Version::str() const {
  std::string s = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  for (size_t i = 0; i < pre.size(); ++i) s += (i == 0 ? "-" : ".") + pre[i];
  if (!build.empty()) s += "+" + build;
  return s;
}

int compare(const Version& a, const Version& b) {
  if (a.major != b.major) return a.major < b.major ? -1 : 1;
  if (a.minor != b.minor) return a.minor < b.minor ? -1 : 1;
  if (a.patch != b.patch) return a.patch < b.patch ? -1 : 1;
  if (a.pre.empty() || b.pre.empty()) {
    if (a.pre.empty() == b.pre.empty()) return 0;
    return a.pre.empty() ? 1 : -1;  // a pre-release comes before its release
  }
  for (size_t i = 0; i < a.pre.size() && i < b.pre.size(); ++i)
    if (const int c = compare_identifier(a.pre[i], b.pre[i])) return c;
  if (a.pre.size() == b.pre.size()) return 0;
  return a.pre.size() < b.pre.size() ? -1 : 1;
}

VersionRequirement::VersionRequirement() : text_("*") {}

VersionRequirement VersionRequirement::parse(const std::string& text) {
  VersionRequirement r;
  r.text_ = text;
  const auto comparators = split(text, ',');
  if (trim(text).empty())
    throw Error("'" + text + "': an empty requirement; hint: write \"*\" for any version");
  for (const auto& raw : comparators) {
    const std::string c = trim(raw);
    auto fail = [&](const std::string& why) {
      const std::string where =
          comparators.size() > 1 ? "'" + text + "': in '" + c + "'" : "'" + c + "'";
      throw Error(where + ": " + why);
    };
    if (c.empty()) fail("an empty comparator (two commas, or a comma at an end)");
    if (c == "*") continue;
    const std::string op = leading_operator(c);
    Partial p;
    try {
      p = parse_partial(trim(c.substr(op.size())), true);
    } catch (const Bad& b) {
      fail(b.why);
    }
    const Version& v = p.v;
    if (!v.pre.empty()) r.pre_allowed_.push_back(plain(v.major, v.minor, v.patch));
    r.add_bounds(op, v, p.parts);
  }
  return r;
}

void VersionRequirement::add_bounds(const std::string& op, const Version& v, int parts) {
  const uint64_t M = v.major, m = v.minor;
  auto add = [&](Op o, Version b) { bounds_.push_back({o, std::move(b)}); };
  // The versions that share the parts given: [M.0.0, M+1.0.0) or [M.m.0, M.m+1.0).
  auto range = [&](int given) {
    add(Op::ge, plain(M, given >= 2 ? m : 0, 0));
    add(Op::lt, given >= 2 ? plain(M, m + 1, 0) : plain(M + 1, 0, 0));
  };
  // The first version past the parts given (>1.2 means >=1.3.0, <=1.2 means <1.3.0).
  auto next = [&](int given) { return given == 2 ? plain(M, m + 1, 0) : plain(M + 1, 0, 0); };
  if (op.empty() || op == "=") {
    if (parts == 3)
      add(Op::eq, v);
    else
      range(parts);
  } else if (op == ">") {
    if (parts == 3)
      add(Op::gt, v);
    else
      add(Op::ge, next(parts));
  } else if (op == ">=") {
    add(Op::ge, parts == 3 ? v : plain(M, m, 0));
  } else if (op == "<") {
    add(Op::lt, parts == 3 ? v : plain(M, m, 0));
  } else if (op == "<=") {
    if (parts == 3)
      add(Op::le, v);
    else
      add(Op::lt, next(parts));
  } else if (op == "~") {
    if (parts == 3) {
      add(Op::ge, v);
      add(Op::lt, plain(M, m + 1, 0));
    } else {
      range(parts);
    }
  } else {  // ^: may change everything right of the leftmost non-zero part given
    if (parts == 1) {
      range(1);
    } else if (M > 0) {
      add(Op::ge, parts == 3 ? v : plain(M, m, 0));
      add(Op::lt, plain(M + 1, 0, 0));
    } else if (parts == 2 || m > 0) {
      add(Op::ge, parts == 3 ? v : plain(0, m, 0));
      add(Op::lt, plain(0, m + 1, 0));
    } else {  // ^0.0.K: only 0.0.K (and, when v is a pre-release, 0.0.K's from v on)
      add(Op::ge, v);
      add(Op::lt, plain(0, 0, v.patch + 1));
    }
  }
}

bool VersionRequirement::matches(const Version& v) const {
  for (const auto& b : bounds_) {
    const int c = compare(v, b.v);
    const bool ok = b.op == Op::eq   ? c == 0
                    : b.op == Op::gt ? c > 0
                    : b.op == Op::ge ? c >= 0
                    : b.op == Op::lt ? c < 0
                                     : c <= 0;
    if (!ok) return false;
  }
  if (v.pre.empty()) return true;
  const Version core = plain(v.major, v.minor, v.patch);
  for (const auto& allowed : pre_allowed_)
    if (compare(allowed, core) == 0) return true;
  return false;
}

}  // namespace keel
