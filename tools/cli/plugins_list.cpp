// keel plugins [show NAME] [--manifest MANIFEST]: the components found, the files refused, the
// directories searched and the installed packages; or one component's options. The other
// subcommands (new, install, ...) are plugins_commands.hpp's.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.hpp"
#include "error.hpp"
#include "loader/installed.hpp"
#include "loader/lock.hpp"
#include "loader/registry.hpp"
#include "manifest.hpp"
#include "run_config.hpp"
#include "text/text.hpp"

namespace keel::cli {
namespace {

using PluginsSubcommand = int (*)(const PluginsArgs&);
const std::pair<const char*, PluginsSubcommand> kPluginsSubcommands[] = {
    {"new", plugins_new},         {"install", plugins_install},
    {"remove", plugins_remove},   {"pack", plugins_pack},
    {"lock", plugins_lock},       {"reference", plugins_reference},
};

// Discovers the plugins where the listing looks; returns the directories searched. With
// --manifest: the run's search path and lock, so that nothing the lock refuses runs.
std::vector<std::string> discover(Registry& registry, const PluginsArgs& args) {
  std::vector<std::string> searched;
  if (args.manifest) {
    const Manifest m = load_manifest(*args.manifest, {});
    const PluginsTable plugins = manifest_plugins(m);
    if (std::optional<Lock> lock = manifest_lock(m, plugins)) {
      std::printf("lock: %s\n", lock->file.c_str());
      registry.use_lock(std::move(*lock));
    }
    searched = plugin_search_path(plugins.dirs, plugins.require);
  } else {
    searched = plugin_search_path({});
  }
  registry.discover(searched);
  log_registry(registry);
  return searched;
}

// Why `name` is neither a plugin nor a component: the error, with where to look instead.
[[noreturn]] void no_such_plugin(const Registry& registry, const std::string& name) {
  const std::string none = "keel plugins show " + name + ": no plugin or component named '" +
                           name + "'";
  const std::string table = table_name(name);
  for (const auto& t : kernel_tables())
    if (table == t.name)
      throw Error(none + "; hint: [" + table + "] is a kernel table: `keel options " + table +
                  "` lists its keys");
  if (table == "plugins")
    throw Error(none + "; hint: [plugins] is a kernel table: `keel options plugins` lists its "
                "keys");
  for (const auto& [section, kind] : component_sections())
    if (in_component_section(table, section))
      throw Error(none + "; hint: [" + table + "] names its " + kind_name(kind) +
                  " with `type`: `keel plugins show TYPE` (" + kind_name(kind) +
                  "s found: " + components_of_kind(kind) + ")");
  std::vector<std::string> names;
  for (const auto& c : registry.components()) {
    names.push_back(c->name);
    names.emplace_back(c->plugin->name);
  }
  const std::string refused = registry.refusal_summary();
  throw Error(none + (refused.empty() ? "" : " (" + refused + ")") + "; hint: " +
              text::did_you_mean(name, names) + "(`keel plugins` lists everything found)");
}

// keel plugins show NAME: every component NAME names (a component, a plugin, KIND:NAME).
int show(const Registry& registry, const std::vector<std::string>& args) {
  if (args.size() == 1)
    throw UsageError("keel plugins show: needs a NAME (a component or plugin); hint: keel "
                     "plugins show adamw",
                     "plugins");
  if (args.size() > 2)
    throw UsageError(args[2] + ": unexpected argument (`keel plugins show` takes one NAME); "
                               "hint: keel plugins show adamw",
                     "plugins");
  const std::string& name = args[1];
  call_state().activity = "while showing plugin " + name;
  bool found = false;
  for (const auto& c : registry.components()) {
    if (c->name != name && c->plugin->name != name && c->qualified_name() != name) continue;
    found = true;
    std::printf("%s %s  (plugin %s %s, %s)\n  %s\n", kind_name(c->kind), c->name.c_str(),
                c->plugin->name.c_str(), c->plugin->version.c_str(), c->plugin->path.c_str(),
                c->description.c_str());
    print_option_rows(c->options, "(no options)");
    std::printf("\n");
  }
  if (!found) no_such_plugin(registry, name);
  return 0;
}

// The components found (columns sized to their content), then the files refused and skipped.
void print_found(const Registry& registry) {
  std::vector<std::vector<std::string>> rows = {{"KIND", "NAME", "PLUGIN", "VERSION", "ABI",
                                                 "PATH"}};
  for (const auto& c : registry.components()) {
    const keel_plugin_descriptor* d = c->plugin->descriptor;
    rows.push_back({kind_name(c->kind), c->name, c->plugin->name, c->plugin->version,
                    std::to_string(d->abi_major) + "." + std::to_string(d->abi_minor),
                    c->plugin->path});
  }
  std::printf("%s", columns(rows).c_str());
  for (const bool plugins : {true, false}) {
    bool header = false;
    for (const auto& r : registry.refusals()) {
      if (r.is_plugin != plugins) continue;
      if (!header)
        std::printf(plugins ? "\nrefused:\n" : "\nnot plugins (skipped, never loaded):\n");
      header = true;
      std::printf("  %s: %s\n", r.path.c_str(), r.reason.c_str());
    }
  }
}

// The installed packages (keel plugins install), every version; the ones searched are marked.
void print_installed(const std::string& root, const std::vector<std::string>& searched) {
  const std::vector<InstalledPackage> installed = list_installed(root);
  std::printf("\ninstalled packages (%s):%s\n", root.c_str(), installed.empty() ? " none" : "");
  std::vector<std::vector<std::string>> rows;
  for (const auto& pkg : installed) {
    const bool searched_dir =
        std::find(searched.begin(), searched.end(), pkg.dir) != searched.end();
    rows.push_back({pkg.info.name, pkg.info.version, searched_dir ? "(searched)" : "",
                    "from " + (pkg.source.empty() ? "?" : pkg.source) + ", " +
                        (pkg.installed_at.empty() ? "?" : pkg.installed_at) +
                        (pkg.problem.empty() ? "" : "; unusable: " + pkg.problem)});
  }
  std::printf("%s", columns(rows, "  ").c_str());
}

}  // namespace

int plugins_command(const std::string& command, const Parsed& p) {
  for (const auto& [name, fn] : kPluginsSubcommands)
    if (p.plugins.subcommand == name) {
      call_state().activity = std::string("in keel plugins ") + name;
      return fn(p.plugins);
    }
  p.plugins.only_flags({"prefix", "manifest"});
  call_state().activity = "while listing plugins";
  const std::vector<std::string>& args = p.positional;
  Registry registry;
  const std::vector<std::string> searched = discover(registry, p.plugins);
  if (!args.empty() && args[0] == "show") return show(registry, args);
  if (!args.empty()) {
    std::vector<std::string> subcommands = {"show"};
    for (const auto& [name, fn] : kPluginsSubcommands) subcommands.emplace_back(name);
    throw UsageError(args[0] + ": unexpected argument to `keel plugins`; hint: " +
                         text::did_you_mean(args[0], subcommands) +
                         "keel plugins, keel plugins show NAME, or a subcommand (keel plugins "
                         "--help)",
                     command);
  }
  print_found(registry);
  std::printf("\nsearched: ");
  for (const auto& d : searched) std::printf("%s  ", d.c_str());
  std::printf("\n");
  print_installed(p.plugins.prefix ? *p.plugins.prefix : default_install_root(), searched);
  return 0;
}

}  // namespace keel::cli
