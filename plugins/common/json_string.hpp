// Shared by first-party plugins that write JSON (not part of the SDK): a string as a quoted
// JSON literal, with quotes, backslashes and control characters escaped.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace keel_plugins {

inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace keel_plugins
