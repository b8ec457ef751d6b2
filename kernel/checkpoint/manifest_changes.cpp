#include "checkpoint/manifest_changes.hpp"

#include <map>

#include <toml++/toml.h>

#include "config/toml_text.hpp"
#include "error.hpp"

namespace keel {
namespace {

void flatten(const toml::node& n, const std::string& key, std::map<std::string, std::string>& out) {
  if (const auto* t = n.as_table()) {
    for (const auto& [k, v] : *t) flatten(v, key.empty() ? std::string(k.str()) : key + "." + std::string(k.str()), out);
  } else if (const auto* a = n.as_array(); a && !a->empty() && a->is_array_of_tables()) {
    for (size_t i = 0; i < a->size(); ++i) flatten(*a->get(i), key + "[" + std::to_string(i) + "]", out);
  } else {
    out[key] = value_text_of(n, toml::format_flags::none);  // floats in their shortest form
  }
}

std::map<std::string, std::string> parse(const std::string& text, const char* which) {
  std::map<std::string, std::string> out;
  try {
    flatten(toml::parse(text), "", out);
  } catch (const toml::parse_error& e) {
    throw Error(std::string(which) + " manifest.resolved.toml is not valid TOML: " +
                std::string(e.description()) + "; hint: the checkpoint is damaged");
  }
  return out;
}

}  // namespace

std::vector<ManifestChange> manifest_changes(const std::string& saved, const std::string& now) {
  const auto a = parse(saved, "the checkpoint's"), b = parse(now, "this run's");
  std::vector<ManifestChange> out;
  auto ia = a.begin();
  auto ib = b.begin();
  const std::string absent = kAbsent;
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
      out.push_back({ia->first, ia->second, absent});
      ++ia;
    } else if (ia == a.end() || ib->first < ia->first) {
      out.push_back({ib->first, absent, ib->second});
      ++ib;
    } else {
      if (ia->second != ib->second)
        out.push_back({ia->first, ia->second, ib->second});
      ++ia;
      ++ib;
    }
  }
  return out;
}

std::string value_text(const std::string& toml_value) {
  std::map<std::string, std::string> out;
  try {
    flatten(toml::parse("v = " + toml_value), "", out);
  } catch (const toml::parse_error&) {
    return "";
  }
  const auto v = out.find("v");
  return v == out.end() ? "" : v->second;
}

}  // namespace keel
