// keel options [TABLE]: the keys of the kernel's own tables; and what `keel plugins show`
// shares with it (the option rows, the component sections).
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.hpp"
#include "error.hpp"
#include "loader/registry.hpp"
#include "options.hpp"
#include "run_config.hpp"  // kernel_tables()
#include "text/text.hpp"

namespace keel::cli {

void print_option_rows(const Schema& schema, const char* none) {
  if (schema.empty()) std::printf("  %s\n", none);
  std::vector<std::vector<std::string>> rows;
  for (const auto& o : schema)
    rows.push_back({o.key, describe(o),
                    std::string("default ") + (o.default_toml ? o.default_toml : "(required)"),
                    o.help ? o.help : ""});
  std::printf("%s", columns(rows, "  ").c_str());
}

namespace {

void print_options(const std::string& title, const std::string& description,
                   const Schema& schema) {
  std::printf("%s  (kernel)\n  %s\n", title.c_str(), description.c_str());
  print_option_rows(schema, "(no keys)");
}

}  // namespace

const std::vector<std::pair<std::string, keel_kind>>& component_sections() {
  static const std::vector<std::pair<std::string, keel_kind>> sections = {
    {"model", KEEL_KIND_MODEL},
    {"data", KEEL_KIND_DATASET},
    {"data.train", KEEL_KIND_DATASET},
    {"data.test", KEEL_KIND_DATASET},
    {"data.eval", KEEL_KIND_DATASET},  // and each [data.eval.NAME] (in_component_section)
    {"optimizer", KEEL_KIND_OPTIMIZER},
    {"sparse_optimizer", KEEL_KIND_SPARSE_OPTIMIZER},
    {"lr_scheduler", KEEL_KIND_LR_SCHEDULER},
    {"loss", KEEL_KIND_LOSS},
    {"grad_clipper", KEEL_KIND_GRAD_CLIPPER},
    {"mfu", KEEL_KIND_MFU},
    {"profiler", KEEL_KIND_PROFILER},
    {"checkpoint", KEEL_KIND_CHECKPOINT},
    {"hooks", KEEL_KIND_HOOK},
    {"step", KEEL_KIND_STEP},
    {"models", KEEL_KIND_MODEL},  // each [models.NAME] (in_component_section)
  };
  return sections;
}

bool in_component_section(const std::string& table, const std::string& section) {
  return table == section || (section == "data.eval" && table.rfind("data.eval.", 0) == 0) ||
         (section == "models" && table.rfind("models.", 0) == 0);
}

std::string components_of_kind(keel_kind kind) {
  Registry registry;
  registry.discover(plugin_search_path({}));
  std::vector<std::string> names;
  for (const Component* c : registry.of_kind(kind)) names.push_back(c->name);
  return names.empty() ? "none found" : text::join(names);
}

std::string table_name(std::string s) {
  while (!s.empty() && s.front() == '[') s.erase(0, 1);
  while (!s.empty() && s.back() == ']') s.pop_back();
  return s;
}

int options_command(const std::string& command, const Parsed& p) {
  if (p.positional.size() > 1)
    throw UsageError(p.positional[1] + ": unexpected argument (`keel options` takes one "
                                       "TABLE); hint: keel options train",
                     command);
  call_state().activity = "while listing the kernel's options";
  const std::string want = p.positional.empty() ? "" : table_name(p.positional[0]);
  bool found = false;
  bool plugins_table = false;
  for (const auto& t : kernel_tables()) {
    if (std::string(t.name) == "plugins") plugins_table = true;
    if (!want.empty() && want != t.name) continue;
    found = true;
    const std::string name = t.name;
    const std::string title = (name == "hooks" || name == "optimizer.groups")
                                  ? "[[" + name + "]]" : "[" + name + "]";
    print_options(title, t.description, *t.schema);
    if (name == "checkpoint" || name == "hooks")
      std::printf("%s", with_program(std::string("  (beside these, the options of the plugin "
                                                 "`type` names: `keel plugins show ") +
                                     (name == "checkpoint" ? "safetensors" : "console") + "`)\n")
                            .c_str());
    std::printf("\n");
  }
  if (!plugins_table && (want.empty() || want == "plugins")) {
    found = true;
    std::printf("[plugins]  (kernel)\n  where plugins are searched first, and the versions the "
                "run needs\n");
    std::printf(
        "%s\n",
        columns({{"paths", "list of strings", "default []",
                  "directories (relative to the manifest; each must exist) searched before "
                  "KEEL_PLUGIN_PATH"},
                 {"require", "table of strings", "default {}",
                  "plugin name = version requirement, e.g. { \"acme-losses\" = \">=1.2, <2\" }: "
                  "a missing plugin or another version is an error"},
                 {"locked", "bool", "default false",
                  "true: running without a lock (`keel plugins lock MANIFEST`, here or along the "
                  "extends chain) is an error"}},
                "  ")
            .c_str());
  }
  if (found) return 0;
  for (const auto& [section, kind] : component_sections())
    if (in_component_section(want, section))
      throw Error(
          "keel options " + want + ": [" + want + "] takes the options of the plugin its " +
          "`type` names, not kernel keys; hint: `keel plugins show NAME` lists them (" +
          kind_name(kind) + "s found: " + components_of_kind(kind) + ")");
  std::vector<std::string> names;
  for (const auto& t : kernel_tables()) names.emplace_back(t.name);
  if (!plugins_table) names.emplace_back("plugins");
  const std::string all = text::join(names);
  throw Error("keel options " + p.positional[0] + ": no kernel table named '" + want +
              "'; hint: " + text::did_you_mean(want, names) + "tables: " + all +
              " (`keel options` lists them all)");
}

}  // namespace keel::cli
