// The parts of resolve (run_config.hpp) that live in other files: plugins and locks
// (config/plugins.cpp), component tables, [[optimizer.groups]], [checkpoint] and [[hooks]]
// (config/components.cpp). Internal to the config code.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "run_config.hpp"

namespace keel::resolve_parts {

// root[key] as a table (an empty one when absent); an error at it when it is not a table.
const toml::table& table_or_empty(const toml::table& root, const std::string& key,
                                  const std::string& where_label);

// Resolves one component table: `type` names the plugin component of `kind`; its options are
// validated against the component's schema. `kernel_keys` (with `kernel_values`): the kernel's
// own keys of the section, validated alike; `kernel_tables`: sub-tables the kernel reads
// ("groups", "init_rename"). `type_at`: where `type` is, for a table the user did not write
// ("" for one from the manifest: the place of its `type`).
ComponentSpec component(const Registry& registry, const toml::table& table,
                        const std::string& section, keel_kind kind,
                        const Schema& kernel_keys = {}, keel_options* kernel_values = nullptr,
                        const std::set<std::string>& kernel_tables = {},
                        const std::string& type_at = "");

// [[optimizer.groups]] of the [optimizer] table.
std::vector<ParamGroupSpec> param_groups(const toml::table& optimizer);

// [checkpoint]'s kernel keys (the declared defaults when `table` is empty), checked.
CheckpointKeys checkpoint_keys_of(const toml::table& table, const keel_options& values);

// [[hooks]], or keel's default hooks when the manifest has none.
std::vector<ComponentSpec> hooks(const Manifest& m, const Registry& registry);

// With a lock in use, every plugin it lists must have been loaded (by its hash).
void check_lock(const Registry& registry, const Lock& lock);
// Every [plugins] require entry is met by the plugin found.
void check_requirements(const Registry& registry, const std::vector<PluginRequirement>& reqs);

}  // namespace keel::resolve_parts
