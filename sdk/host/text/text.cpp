#include "text/text.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>

namespace keel::text {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string lower(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The first letters of the parts of a name of two or more parts ("learning_rate": "lr",
// "log-level": "ll"), lower case; "" for a name of one part.
std::string initials(const std::string& name) {
  std::string out;
  bool start = true;
  size_t parts = 0;
  for (char c : name) {
    if (c == '_' || c == '-') {
      start = true;
      continue;
    }
    if (start) {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      ++parts;
    }
    start = false;
  }
  return parts >= 2 ? out : "";
}

}  // namespace

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  for (const auto& c : candidates)
    if (lower(c) == w) return c;
  const std::string w_initials = initials(word);
  for (const auto& c : candidates)
    if ((!w_initials.empty() && lower(c) == w_initials) || initials(c) == w) return c;
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;  // exclusive bound
  for (const auto& c : candidates) {
    const size_t d = edit_distance(w, lower(c));
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string hint = did_you_mean_or(word, candidates, "");
  return hint.empty() ? "" : hint + " ";
}

std::string did_you_mean_or(const std::string& word, const std::vector<std::string>& candidates,
                            const std::string& otherwise, char quote) {
  const std::string near = closest(word, candidates);
  if (near.empty()) return otherwise;
  return "did you mean " + std::string(1, quote) + near + quote + "?";
}

std::string one_line(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == '\n' || c == '\r' || c == '\t') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

std::string printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto escape = [&out](unsigned char c) { out += fmt::format("\\x{:02x}", c); };
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) escape(c); else out += static_cast<char>(c);
      ++i;
      continue;
    }
    // The length of a well-formed UTF-8 sequence starting at i (RFC 3629: no overlong forms,
    // no surrogates, nothing above U+10FFFF), or 0.
    size_t len = 0;
    uint32_t cp = 0;
    if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
    if (len != 0 && i + len <= n) {
      for (size_t k = 1; k < len; ++k) {
        if ((p[i + k] & 0xc0) != 0x80) { len = 0; break; }
        cp = (cp << 6) | (p[i + k] & 0x3f);
      }
    } else {
      len = 0;
    }
    const bool valid = len != 0 && !(len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) &&
                       !(len == 4 && (cp < 0x10000 || cp > 0x10ffff));
    if (!valid || (cp >= 0x80 && cp <= 0x9f)) {
      // An invalid byte alone; a C1 control as its two bytes.
      const size_t bad = valid ? len : 1;
      for (size_t k = 0; k < bad; ++k) escape(p[i + k]);
      i += bad;
      continue;
    }
    out.append(s, i, len);
    i += len;
  }
  return out;
}

std::string number(double v) { return std::isnan(v) ? "nan" : fmt::format("{}", v); }

std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                          "0123456789_-.,/:=+@%") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (const char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace keel::text
