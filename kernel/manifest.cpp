#include "manifest.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include "error.hpp"

namespace fs = std::filesystem;

namespace keel {
namespace {

constexpr const char* kSetPrefix = "--set ";

// A component table whose `type` the overlay changes is replaced whole: options of the
// base's plugin mean nothing to another plugin.
bool changes_type(const toml::table& base, const toml::table& overlay) {
  const toml::node* a = base.get("type");
  const toml::node* b = overlay.get("type");
  return a && b && a->is_string() && b->is_string() &&
         a->as_string()->get() != b->as_string()->get();
}

// Moves `overlay` into `base`: tables merge key by key, anything else replaces.
void merge(toml::table& base, toml::table& overlay) {
  for (auto&& [k, v] : overlay) {
    toml::node* existing = base.get(k.str());
    if (existing && existing->is_table() && v.is_table() &&
        !changes_type(*existing->as_table(), *v.as_table())) {
      merge(*existing->as_table(), *v.as_table());
      continue;
    }
    toml::key key(k.str(), k.source());
    base.erase(k.str());
    base.insert(std::move(key), std::move(v));
  }
}

toml::table parse_file(const fs::path& file, std::vector<fs::path>& chain) {
  const fs::path canonical = fs::weakly_canonical(file);
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end())
    throw Error(file.string() + ": `extends` cycle through this file; hint: a manifest "
                "may extend a base, but bases cannot extend each other in a loop");
  if (!fs::exists(file))
    throw Error(file.string() + ": manifest not found" +
                (chain.empty() ? std::string()
                               : " (extended by " + chain.back().string() + ")") +
                "; hint: check the path");
  chain.push_back(canonical);

  toml::table table;
  try {
    table = toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    throw Error(where(e.source()) + ": invalid TOML: " + std::string(e.description()));
  }

  if (toml::node* ext = table.get("extends")) {
    const auto* base_name = ext->as_string();
    if (!base_name)
      throw Error(where(ext->source()) + ": `extends` must be a string (a path to the "
                  "base manifest, relative to this file)");
    const fs::path base_path = file.parent_path() / base_name->get();
    toml::table base = parse_file(base_path, chain);
    table.erase("extends");
    merge(base, table);
    table = std::move(base);
  }
  chain.pop_back();
  return table;
}

// Parses "a.b[1].c=value" into path segments and the value node.
void apply_override(toml::table& root, const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(kSetPrefix + text + ": expected KEY=VALUE, e.g. --set optimizer.lr=3e-4");
  const std::string dotted = text.substr(0, eq);
  const std::string value_text = text.substr(eq + 1);
  const auto source_name = std::make_shared<const std::string>(kSetPrefix + text);

  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value_text, std::string_view(*source_name));
  } catch (const toml::parse_error&) {
    // Not a TOML value: take the text as a string (so --set run.name=foo works unquoted).
    parsed = toml::parse("v = \"\"", std::string_view(*source_name));
    *parsed.get("v")->as_string() = value_text;
  }

  // Walk the dotted path, creating tables as needed.
  toml::table* table = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    std::string segment = dotted.substr(start, dot == std::string::npos ? std::string::npos
                                                                        : dot - start);
    if (segment.empty())
      throw Error(kSetPrefix + text + ": empty segment in key '" + dotted + "'");
    long index = -1;
    const auto bracket = segment.find('[');
    if (bracket != std::string::npos && segment.back() == ']') {
      index = std::stol(segment.substr(bracket + 1, segment.size() - bracket - 2));
      segment = segment.substr(0, bracket);
    }
    if (dot == std::string::npos && index < 0) {
      toml::source_region region;
      region.path = source_name;
      region.begin = region.end = {1, 1};
      table->erase(segment);
      table->insert(toml::key(segment, region), std::move(*parsed.get("v")));
      return;
    }
    toml::node* next = table->get(segment);
    if (index >= 0) {
      auto* array = next ? next->as_array() : nullptr;
      if (!array || index >= static_cast<long>(array->size()) || !(*array)[index].is_table())
        throw Error(kSetPrefix + text + ": '" + segment + "[" + std::to_string(index) +
                    "]' is not a table in the manifest; hint: only existing array entries can "
                    "be overridden");
      table = (*array)[index].as_table();
      if (dot == std::string::npos)
        throw Error(kSetPrefix + text + ": cannot replace a whole array entry");
    } else {
      if (!next) next = &table->insert(segment, toml::table{}).first->second;
      if (!next->is_table())
        throw Error(kSetPrefix + text + ": '" + segment + "' is a value, not a table");
      table = next->as_table();
    }
    start = dot + 1;
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string where(const toml::source_region& source) {
  const std::string path = source.path ? *source.path : std::string("<manifest>");
  if (path.rfind(kSetPrefix, 0) == 0) return path;
  return path + ":" + std::to_string(source.begin.line) + ":" +
         std::to_string(source.begin.column);
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;  // exclusive bound
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

Manifest load_manifest(const std::string& path, const std::vector<std::string>& overrides) {
  Manifest m;
  m.path = path;
  std::vector<fs::path> chain;
  m.root = parse_file(path, chain);
  for (const auto& o : overrides) apply_override(m.root, o);
  return m;
}

}  // namespace keel
