// resolve's component tables: `type` and options of each, [[optimizer.groups]], [checkpoint]'s
// kernel keys and [[hooks]] (with keel's default hooks).
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "config/resolve_parts.hpp"
#include "distributed/launch.hpp"
#include "error.hpp"
#include "text/text.hpp"

namespace keel::resolve_parts {
namespace {

// The plugin whose sinks are the default [[hooks]] (plugins/sinks).
constexpr const char* kDefaultHooksPlugin = "keel-sinks";

// What std::regex_error's code means, in words (its what() is implementation text).
std::string regex_problem(std::regex_constants::error_type code) {
  namespace rc = std::regex_constants;
  switch (code) {
    case rc::error_collate: return "invalid collating element name";
    case rc::error_ctype: return "invalid character class name";
    case rc::error_escape: return "invalid escape or trailing backslash";
    case rc::error_backref: return "invalid back reference";
    case rc::error_brack: return "unmatched [ or ]";
    case rc::error_paren: return "unmatched ( or )";
    case rc::error_brace: return "unmatched { or }";
    case rc::error_badbrace: return "invalid range in { }";
    case rc::error_range: return "invalid character range";
    case rc::error_space: return "out of memory";
    case rc::error_badrepeat: return "*, +, ? or { } repeats nothing";
    case rc::error_complexity: return "too complex";
    case rc::error_stack: return "too complex (stack)";
    default: return "invalid";
  }
}

// "a (path) and b (path)" / "type = \"a:x\" or type = \"b:x\"" for several providers.
std::string providers(const std::vector<const Component*>& found) {
  std::string which;
  for (const Component* c : found)
    which += std::string(which.empty() ? "" : " and ") + c->plugin->name + " (" + c->plugin->path +
             ")";
  return which;
}
std::string qualified_types(const std::vector<const Component*>& found) {
  std::string qualified;
  for (const Component* c : found)
    qualified += std::string(qualified.empty() ? "" : " or ") + "type = \"" + c->qualified_name() +
                 "\"";
  return qualified;
}

// The one component `name` picks, or an error at `at`.
const Component* pick(const Registry& registry, keel_kind kind, const std::string& section,
                      const std::string& name, const std::string& at) {
  std::vector<std::string> names;
  for (const Component* c : registry.of_kind(kind)) names.push_back(c->name);
  const std::string available = text::join(names);
  const std::vector<const Component*> found = registry.matches(kind, name);
  if (found.size() > 1)
    throw Error(fmt::format("{}: [{}].type: {} plugins provide {} '{}': {}; hint: name the one "
                            "you want as {}, or remove one of the files from the search path",
                            at, section, found.size(), kind_name(kind), name, providers(found),
                            qualified_types(found)));
  if (found.empty()) {
    const std::string refused = registry.refusal_summary();
    throw Error(at + ": [" + section + "].type: no " + kind_name(kind) + " named '" + name +
                "' (available: " + (available.empty() ? "none" : available) + ")" +
                (refused.empty() ? "" : "; " + refused) + "; hint: " + text::did_you_mean(name, names) +
                "`keel plugins` lists what was found and why files were refused");
  }
  const Component* c = found[0];
  // A second copy of its plugin, of another version, was refused: the run would silently use
  // whichever comes first on the search path.
  for (const Shadowed& other : registry.shadowed())
    if (other.used == c->plugin && other.version != other.used->version)
      throw Error(at + ": [" + section + "].type: " + kind_name(kind) + " '" + name +
                  "' comes from plugin " + other.name + " " + other.used->version + " (" +
                  other.used->path + "), and another version of that plugin, " + other.version +
                  " (" + other.path + "), is on the search path too; hint: remove the copy you "
                  "do not want from the search path (`keel plugins` lists both)");
  return c;
}

// No [[hooks]]: the console logger and the JSONL metrics file (the run directory contract),
// keel's own (kDefaultHooksPlugin) when another plugin provides a hook of the same name.
std::vector<ComponentSpec> default_hooks(const Registry& registry, const std::string& manifest) {
  const std::string at = manifest + ": [[hooks]] (left out, so the default hooks console and "
                         "jsonl)";
  std::vector<ComponentSpec> out;
  for (const std::string name : {"console", "jsonl"}) {
    const std::vector<const Component*> found = registry.matches(KEEL_KIND_HOOK, name);
    if (found.empty()) continue;
    const Component* own =
        registry.find(KEEL_KIND_HOOK, std::string(kDefaultHooksPlugin) + ":" + name);
    const Component* chosen = own ? own : found.size() == 1 ? found[0] : nullptr;
    if (!chosen)
      throw Error(fmt::format("{}: {} plugins provide hook '{}', none of them {}: {}; hint: "
                              "write the hooks you want as [[hooks]] tables, e.g. {}",
                              at, found.size(), name, kDefaultHooksPlugin, providers(found),
                              qualified_types(found)));
    for (const Component* other : found)
      if (other != chosen)
        spdlog::info("{} has no [[hooks]]: the default hook '{}' comes from plugin {}; plugin "
                     "{} ({}) provides one too ([[hooks]] type = \"{}\" uses that one)",
                     manifest, name, chosen->plugin->name, other->plugin->name,
                     other->plugin->path, other->qualified_name());
    for (const keel_option_desc& o : chosen->options)
      if (!o.default_toml)
        throw Error(at + ": hook '" + name + "' of plugin " + chosen->plugin->name +
                    " needs option '" + o.key + "'; hint: write it as a [[hooks]] table with "
                    "type = \"" + chosen->qualified_name() + "\" and " + o.key + " = ...");
    toml::table t;
    t.insert("type", chosen->qualified_name());
    out.push_back(component(registry, t, "hooks[" + std::to_string(out.size()) + "]",
                            KEEL_KIND_HOOK, {}, nullptr, {}, at));
  }
  return out;
}

}  // namespace

const toml::table& table_or_empty(const toml::table& root, const std::string& key,
                                  const std::string& where_label) {
  static const toml::table empty;
  const toml::node* n = root.get(key);
  if (!n) return empty;
  if (!n->is_table())
    throw Error(where(n->source()) + ": [" + where_label + "] must be a table; hint: write it "
                "as a [" + where_label + "] header followed by its keys");
  return *n->as_table();
}

ComponentSpec component(const Registry& registry, const toml::table& table,
                        const std::string& section, keel_kind kind, const Schema& kernel_keys,
                        keel_options* kernel_values, const std::set<std::string>& kernel_tables,
                        const std::string& type_at) {
  const toml::node* type = table.get("type");
  if (!type || !type->is_string()) {
    std::vector<std::string> names;
    for (const Component* c : registry.of_kind(kind)) names.push_back(c->name);
    const std::string available = text::join(names);
    throw Error(where(type ? type->source() : table.source()) + ": [" + section +
                "] needs type = \"<" + kind_name(kind) + ">\" (available: " +
                (available.empty() ? "none found" : available) +
                "); hint: `keel plugins` lists every component found");
  }
  const std::string name = type->as_string()->get();
  ComponentSpec spec;
  spec.section = section;
  spec.component =
      pick(registry, kind, section, name, type_at.empty() ? where(type->source()) : type_at);
  const Schema& schema = spec.component->options;
  std::set<std::string> reserved = kernel_tables;
  reserved.insert("type");
  for (const auto& k : kernel_keys) reserved.insert(k.key);
  // Sections with kernel keys are documented by two commands.
  const std::string docs =
      "keel plugins show " + name +
      (kernel_keys.empty() ? "" : "` and `keel options " + section.substr(0, section.find('[')));
  spec.options = validate_options(table, section, docs, schema, reserved);
  if (kernel_values) {
    // The kernel's own keys of this section, validated the same way.
    std::set<std::string> plugin_keys = kernel_tables;
    plugin_keys.insert("type");
    for (const auto& o : schema) plugin_keys.insert(o.key);
    *kernel_values = validate_options(table, section, docs, kernel_keys, plugin_keys);
  }
  return spec;
}

std::vector<ParamGroupSpec> param_groups(const toml::table& optimizer) {
  std::vector<ParamGroupSpec> out;
  const toml::node* groups = optimizer.get("groups");
  if (!groups) return out;
  const toml::array* a = groups->as_array();
  if (!a || !a->is_array_of_tables())
    throw Error(where(groups->source()) + ": optimizer.groups must be an array of tables; hint: "
                "write each as [[optimizer.groups]] with params = \"<regex>\"");
  for (size_t i = 0; i < a->size(); ++i) {
    const toml::table& t = *(*a)[i].as_table();
    const std::string section = "optimizer.groups[" + std::to_string(i) + "]";
    const keel_options o =
        validate_options(t, section, "keel options optimizer.groups", group_keys().schema);
    for (const char* key : {"lr", "weight_decay"}) {
      const toml::node* n = t.get(key);
      const double v = std::get<double>(o.values.at(key));
      if (n && v < 0)
        throw Error(fmt::format(
            "{}: {}.{}: must be >= 0, got {:f}; hint: leave it out to keep the optimizer's own "
            "value", where(n->source()), section, key, v));
    }
    ParamGroupSpec g;
    group_keys().land(o, g);
    g.where = where(t.get("params")->source());
    try {
      std::regex check(g.params);
    } catch (const std::regex_error& e) {
      throw Error(g.where + ": " + section + ".params: invalid regular expression (" +
                  regex_problem(e.code()) + "); hint: params is an ECMAScript regular expression "
                  "matched against whole parameter names, e.g. \"fc1\\\\..*\"");
    }
    out.push_back(std::move(g));
  }
  return out;
}

CheckpointKeys checkpoint_keys_of(const toml::table& ct, const keel_options& values) {
  CheckpointKeys k;
  checkpoint_keys().land(values, k);
  const std::string& bm = k.best_metric;
  if (k.keep_best > 0 &&
      (bm.find('.') == std::string::npos || bm.front() == '.' || bm.back() == '.'))
    throw Error((ct.get("best_metric") ? where(ct.get("best_metric")->source())
                                       : where(ct.source())) +
                ": checkpoint.best_metric = \"" + bm + "\" is not <split>.<key>; hint: e.g. "
                "\"test.loss\" or \"train.loss\" (keys as in metrics.jsonl)");
  for (const std::string* regex : {&k.init_include, &k.init_exclude}) {
    const char* key = regex == &k.init_include ? "init_include" : "init_exclude";
    try {
      std::regex check(*regex);
    } catch (const std::regex_error& e) {
      throw Error(where(ct.get(key)->source()) + ": checkpoint." + key +
                  ": invalid regular expression (" + regex_problem(e.code()) +
                  "); hint: an ECMAScript regex searched in tensor names, e.g. \"^encoder\\\\.\"");
    }
  }
  if (const toml::node* rn = ct.get("init_rename")) {
    const toml::table* t = rn->as_table();
    if (t == nullptr)
      throw Error(where(rn->source()) + ": checkpoint.init_rename must be a table of prefix "
                  "rewrites; hint: [checkpoint.init_rename] with \"old.\" = \"new.\"");
    for (const auto& [from, to] : *t) {
      if (!to.is_string())
        throw Error(where(to.source()) + ": checkpoint.init_rename.\"" + std::string(from.str()) +
                    "\" must be a string (the model's prefix); hint: \"trunk.\" = \"encoder.\"");
      k.init_rename.emplace_back(std::string(from.str()), to.as_string()->get());
    }
  }
  return k;
}

namespace {

// keel's metric sinks: the hooks of kDefaultHooksPlugin that write the metric records.
bool metric_sink(const ComponentSpec& hook) {
  const std::string& name = hook.component->name;
  return hook.component->plugin->name == kDefaultHooksPlugin &&
         (name == "console" || name == "jsonl" || name == "csv");
}

// Written [[hooks]] that hold hooks but none of keel's metric sinks: a run that prints no
// records and leaves `keel report` nothing to read, most often because one [[hooks]] table in
// a manifest that extends another replaced the base's console and jsonl. One warning line, on
// rank 0 (or alone). (`hooks = []`, which asks for no hooks at all, is not warned about.)
void warn_without_metric_sink(const Manifest& m, const toml::node& node,
                              const std::vector<ComponentSpec>& hooks) {
  if (hooks.empty()) return;
  for (const ComponentSpec& h : hooks)
    if (metric_sink(h)) return;
  try {
    if (const auto launch = detect_launch(); launch && launch->rank != 0) return;
  } catch (const std::exception&) {
    // A malformed launch fails after resolve with its own error; warn meanwhile.
  }
  std::vector<std::string> types;
  for (const ComponentSpec& h : hooks) types.push_back(h.component->name);
  const std::string at = where(node.source());
  const std::string add = "add [[hooks]] type = \"console\" and [[hooks]] type = \"jsonl\"";
  const std::string effect =
      "holds none of keel's metric sinks (console, jsonl, csv): keel prints no records and "
      "writes no metrics.jsonl (`keel report` reads it)";
  for (const Manifest::Replaced& r : m.replaced)
    if (r.key == "hooks" && r.where == at) {
      spdlog::warn("{}: [[hooks]] ({}) replaces the base's ({}; {}) and {}; hint: {} here too "
                   "(an array of tables replaces the base's whole array)",
                   at, text::join(types), r.base_types, r.base, effect, add);
      return;
    }
  spdlog::warn("{}: [[hooks]] ({}) {}; hint: {} (without [[hooks]] a run gets both)", at,
               text::join(types), effect, add);
}

std::vector<ComponentSpec> written_hooks(const toml::node& node, const Registry& registry) {
  const toml::array* a = node.as_array();
  if (!a || (!a->empty() && !a->is_array_of_tables()))
    throw Error(where(node.source()) + ": hooks must be an array of tables; hint: write "
                "each hook as [[hooks]] with type = \"<hook>\" (hooks = [] for none)");
  std::vector<ComponentSpec> out;
  for (size_t i = 0; i < a->size(); ++i) {
    keel_options kernel_values;
    out.push_back(component(registry, *(*a)[i].as_table(), "hooks[" + std::to_string(i) + "]",
                            KEEL_KIND_HOOK, hook_keys().schema, &kernel_values));
    hook_keys().land(kernel_values, out.back());
  }
  return out;
}

}  // namespace

std::vector<ComponentSpec> hooks(const Manifest& m, const Registry& registry) {
  const toml::node* node = m.root.get("hooks");
  std::vector<ComponentSpec> out =
      node ? written_hooks(*node, registry) : default_hooks(registry, m.path);
  if (node) warn_without_metric_sink(m, *node, out);
  for (ComponentSpec& h : out)
    if (h.label.empty()) h.label = h.component->name;  // label's default: the hook's type
  return out;
}

}  // namespace keel::resolve_parts
