// resolve's [plugins] table and lock, and the plugins a run uses (plugins.json).
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/resolve_parts.hpp"
#include "error.hpp"
#include "loader/installed.hpp"
#include "loader/lock.hpp"
#include "loader/semver.hpp"
#include "text/text.hpp"

namespace fs = std::filesystem;

namespace keel {

using resolve_parts::table_or_empty;

PluginsTable manifest_plugins(const Manifest& m) {
  const toml::table& t = table_or_empty(m.root, "plugins", "plugins");
  PluginsTable out;
  for (const auto& [k, v] : t)
    if (k.str() != "paths" && k.str() != "require" && k.str() != "locked")
      throw Error(where(k.source()) + ": unknown key '" + std::string(k.str()) +
                  "' in [plugins]; hint: " +
                  text::did_you_mean(std::string(k.str()), {"paths", "require", "locked"}) +
                  "its keys are paths, require and locked (`keel options plugins`)");
  if (const toml::node* locked = t.get("locked")) {
    if (!locked->is_boolean())
      throw Error(where(locked->source()) + ": plugins.locked: expected true or false; hint: "
                  "locked = true makes a missing lock an error");
    out.locked = locked->as_boolean()->get();
    out.locked_where = where(locked->source());
  }
  if (const toml::node* paths = t.get("paths")) {
    const toml::array* a = paths->as_array();
    if (!a)
      throw Error(where(paths->source()) + ": plugins.paths: expected a list of strings; hint: "
                  "e.g. paths = [\"my_plugins\"] (relative to this manifest)");
    for (const auto& e : *a) {
      if (!e.is_string())
        throw Error(where(e.source()) + ": plugins.paths: expected a list of strings; hint: "
                    "e.g. paths = [\"my_plugins\"] (relative to this manifest)");
      const std::string dir = e.as_string()->get();
      const std::string abs = absolute_path(e, dir.empty() ? "." : dir);  // "": the manifest's
      std::error_code ec;
      if (!fs::is_directory(abs, ec))
        throw Error(where(e.source()) + ": plugins.paths: " + abs +
                    (fs::exists(abs, ec) ? " is not a directory" : " does not exist") +
                    "; hint: paths are relative to the manifest that sets them; create the "
                    "directory or remove the entry");
      out.dirs.push_back(abs);
    }
  }
  if (const toml::node* require = t.get("require")) {
    const toml::table* r = require->as_table();
    if (!r)
      throw Error(where(require->source()) + ": plugins.require: expected a table of plugin "
                  "names and version requirements; hint: require = { \"acme-losses\" = "
                  "\">=1.2, <2\" }");
    for (const auto& [k, v] : *r) {
      const std::string name(k.str());
      if (!v.is_string())
        throw Error(where(v.source()) + ": plugins.require." + name + ": expected a version "
                    "requirement string; hint: \"" + name + "\" = \">=1.2, <2\"");
      PluginRequirement req{name, v.as_string()->get(), where(v.source())};
      try {
        (void)VersionRequirement::parse(req.requirement);
      } catch (const Error& e) {
        throw Error(req.where + ": plugins.require." + name + ": " + e.what() +
                    "; hint: comparators such as \">=1.2, <2\", \"^1.2\", \"~1.2.3\", "
                    "\"=1.2.3\" or \"*\", separated by commas");
      }
      out.require.push_back(std::move(req));
    }
  }
  return out;
}

std::optional<Lock> manifest_lock(const Manifest& m, const PluginsTable& plugins) {
  std::optional<Lock> lock = find_lock(m.files);
  if (!lock && plugins.locked) {
    std::vector<std::string> paths;
    for (const auto& f : m.files) paths.push_back(lock_path_for(f));
    const std::string looked = text::join(paths);
    throw Error(plugins.locked_where + ": plugins.locked = true, but there is no lock (looked "
                "for " + looked + "); hint: review the plugins the run uses, then `keel plugins "
                "lock " + m.path + "` writes one");
  }
  return lock;
}

std::vector<const ComponentSpec*> used_components(const RunConfig& cfg) {
  std::vector<const ComponentSpec*> specs = {&cfg.model, &cfg.train_data, &cfg.optimizer,
                                             &cfg.loss};
  for (const EvalSetSpec& set : cfg.eval_sets) specs.push_back(&set.data);
  for (const auto* o : {&cfg.sparse_optimizer, &cfg.lr_scheduler,
                        &cfg.grad_clipper, &cfg.mfu, &cfg.profiler, &cfg.checkpoint, &cfg.step})
    if (*o) specs.push_back(&**o);
  for (const auto& h : cfg.hooks) specs.push_back(&h);
  for (const NamedModelSpec& m : cfg.models) specs.push_back(&m.model);
  return specs;
}

std::string used_plugins_json(const RunConfig& cfg) {
  // One entry per plugin file, in the order of first use, with the components it provides.
  nlohmann::ordered_json plugins = nlohmann::ordered_json::array();
  std::map<const LoadedPlugin*, size_t> index;
  for (const ComponentSpec* spec : used_components(cfg)) {
    const LoadedPlugin* p = spec->component->plugin;
    if (!p) continue;
    auto [it, added] = index.emplace(p, plugins.size());
    if (added)
      plugins.push_back({{"name", p->name},
                         {"version", p->version},
                         {"sha256", p->sha256},
                         {"path", p->path},
                         {"components", nlohmann::ordered_json::array()}});
    plugins[it->second]["components"].push_back(spec->section + ":" + spec->component->name);
  }
  return nlohmann::ordered_json{{"plugins", plugins}}.dump(2) + "\n";
}

namespace resolve_parts {

void check_lock(const Registry& registry, const Lock& lock) {
  for (const LockEntry& e : lock.entries) {
    bool loaded = false;
    for (const auto& p : registry.plugins()) loaded |= p->sha256 == e.sha256;
    if (loaded) continue;
    std::string why = "no file with its sha256 was found on the search path";
    for (const Refusal& r : registry.refusals())
      if (lock.by_path(r.path) == &e) why = r.path + ": " + without_hint(r.reason);
    throw Error(lock.file + ": plugin " + e.name + " " + e.version + " (sha256 " +
                e.sha256.substr(0, 16) + "...) is locked but was not loaded: " + why +
                "; hint: restore the locked file, or review the new one and run `keel plugins "
                "lock " + lock.manifest + " --update " + e.name + "`");
  }
}

void check_requirements(const Registry& registry, const std::vector<PluginRequirement>& reqs) {
  for (const PluginRequirement& r : reqs) {
    const std::string what = r.where + ": plugins.require: " + r.name + " " + r.requirement;
    const LoadedPlugin* p = registry.plugin_named(r.name);
    if (!p) {
      // Installed versions that do not meet the requirement are not searched: name them.
      std::vector<std::string> versions;
      try {
        for (const auto& pkg : list_installed(default_install_root()))
          if (pkg.info.name == r.name && pkg.problem.empty()) versions.push_back(pkg.info.version);
      } catch (const Error&) {
      }
      const std::string installed = text::join(versions);
      const std::string refused = registry.refusal_summary();
      throw Error(what + ": " +
                  (installed.empty() ? "no plugin named '" + r.name + "' was found"
                                     : "no installed version meets it (installed: " +
                                           installed + ")") +
                  (refused.empty() ? "" : "; " + refused) + "; hint: install a version that "
                  "satisfies it (keel plugins install PACKAGE), or add its directory to "
                  "[plugins] paths; `keel plugins` lists what was found");
    }
    std::optional<Version> v;
    try {
      v = Version::parse(p->version);
    } catch (const Error& e) {
      throw Error(what + ": found " + r.name + " version '" + p->version + "' (" + p->path +
                  "), which is not a semantic version (" + e.what() + "); hint: ask its author "
                  "for a MAJOR.MINOR.PATCH version, or drop the requirement");
    }
    if (!VersionRequirement::parse(r.requirement).matches(*v))
      throw Error(what + ": found " + r.name + " " + p->version + " (" + p->path +
                  "), which does not satisfy it; hint: install a version that does (keel "
                  "plugins install PACKAGE; `keel plugins` lists installed versions), or change "
                  "the requirement");
  }
}

}  // namespace resolve_parts

}  // namespace keel
