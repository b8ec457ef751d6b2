#include "config/toml_text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>
#include <vector>

namespace keel {
namespace {

std::string formatted(const toml::node& n, toml::format_flags flags) {
  std::ostringstream s;
  s << toml::toml_formatter{n, flags};
  return s.str();
}

// A key as TOML writes it: bare when it can be, else quoted as a string.
std::string key_text(std::string_view key, toml::format_flags flags) {
  const bool bare = !key.empty() && key.find_first_not_of(
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") == std::string::npos;
  return bare ? std::string(key) : formatted(toml::value<std::string>(std::string(key)), flags);
}

bool array_of_tables(const toml::node& n) {
  const toml::array* a = n.as_array();
  return a && !a->empty() && a->is_array_of_tables();
}

// Whether a table's header can be left out: it holds tables or arrays of tables and nothing
// else, so that their headers create it.
bool implicit(const toml::table& t) {
  if (t.empty()) return false;
  for (const auto& [k, v] : t)
    if (!v.is_table() && !array_of_tables(v)) return false;
  return true;
}

// `table`'s values, then its tables and arrays of tables under `path` (its dotted header
// name, "" for the document).
void write_table(std::string& out, const toml::table& table, const std::string& path) {
  const auto flags = toml::toml_formatter::default_flags;
  for (const auto& [k, v] : table)
    if (!v.is_table() && !array_of_tables(v))
      out += key_text(k.str(), flags) + " = " + value_text_of(v, flags) + "\n";
  const auto child = [&](std::string_view k) {
    return (path.empty() ? "" : path + ".") + key_text(k, flags);
  };
  for (const auto& [k, v] : table) {
    const toml::table* t = v.as_table();
    if (!t) continue;
    if (!implicit(*t)) {
      if (!out.empty()) out += "\n";
      out += "[" + child(k.str()) + "]\n";
    }
    write_table(out, *t, child(k.str()));
  }
  for (const auto& [k, v] : table) {
    if (!array_of_tables(v)) continue;
    for (const toml::node& e : *v.as_array()) {
      if (!out.empty()) out += "\n";
      out += "[[" + child(k.str()) + "]]\n";
      write_table(out, *e.as_table(), child(k.str()));
    }
  }
}

}  // namespace

std::string float_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  // The fewest significant digits that read back as v (17 always do), in scientific form.
  char buf[64];
  std::to_chars_result r{};
  int digits = 1;
  for (;; ++digits) {
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific, digits - 1);
    double back = 0;
    std::from_chars(buf, r.ptr, back);
    if (back == v || digits == 17) break;
  }
  std::string s(buf, r.ptr);
  // As Python's repr: positional for exponents -4 .. 15 ("0.0003", "100.0"), else scientific
  // ("1e-05", "1.5e+20").
  const int exponent = std::stoi(s.substr(s.find('e') + 1));
  if (exponent >= -4 && exponent < 16) {
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed,
                      std::max(0, digits - 1 - exponent));
    s.assign(buf, r.ptr);
    if (s.find('.') == std::string::npos) s += ".0";
  }
  return s;
}

std::string value_text_of(const toml::node& value, toml::format_flags flags) {
  if (const auto* f = value.as_floating_point()) return float_text(f->get());
  if (const toml::array* a = value.as_array()) {
    if (a->empty()) return "[]";
    std::string s = "[ ";
    for (size_t i = 0; i < a->size(); ++i)
      s += (i ? ", " : "") + value_text_of(*a->get(i), flags);
    return s + " ]";
  }
  if (const toml::table* t = value.as_table()) {  // an inline table (inside an array)
    if (t->empty()) return "{}";
    std::string s = "{ ";
    bool first = true;
    for (const auto& [k, v] : *t) {
      s += (first ? "" : ", ") + key_text(k.str(), flags) + " = " + value_text_of(v, flags);
      first = false;
    }
    return s + " }";
  }
  return formatted(value, flags);
}

std::string toml_text(const toml::table& table) {
  std::string out;
  write_table(out, table, "");
  return out;
}

}  // namespace keel
