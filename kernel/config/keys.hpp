// The kernel's manifest keys, each declared once, in one row: its schema entry (type, default,
// help, bounds, choices), the member of the config it lands in, and whether changing it on
// --resume keeps the run exact. `keel options` (kernel_tables), validation, the copy into
// RunConfig, manifest.resolved.toml and the resume check (config/resume_changes.hpp) all read
// these rows (config/keys.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "config/sections.hpp"
#include "options.hpp"

namespace keel {

struct ComponentSpec;   // run_config.hpp: [[hooks]] priority and label land there
struct ParamGroupSpec;  // run_config.hpp: one [[optimizer.groups]] table
struct NamedModelSpec;  // run_config.hpp: one [models.NAME] table

// Whether a key may differ between a checkpoint's manifest and the run resuming it: kSafe keys
// do not change what training computes (names, cadences, stop targets, sinks), kBreaks ones do.
enum class OnResume { kSafe, kBreaks };

template <class Section>
struct Key {
  keel_option_desc option;  // the schema entry: key, type, default, help, bounds, choices
  OnResume on_resume;
  std::function<void(Section&, const KeelOptionValue&)> land;  // the validated value into it
  std::function<KeelOptionValue(const Section&)> read;         // and back (resolved manifest)
};

// One kernel table: a manifest section (or the kernel's keys of a component's section) and the
// struct its keys land in.
template <class Section>
struct KeyTable {
  const char* name;         // "train", "checkpoint", "hooks", "optimizer.groups"
  const char* description;  // `keel options`
  std::vector<Key<Section>> keys;
  Schema schema;  // the rows' schema entries, in row order

  KeyTable(const char* name, const char* description, std::vector<Key<Section>> keys);
  // Every key's validated value (validate_options against `schema`) into `into`.
  void land(const keel_options& values, Section& into) const;
  // `from`'s members as TOML, for manifest.resolved.toml.
  toml::table resolved(const Section& from) const;
  const Key<Section>* find(const std::string& key) const;
};

const KeyTable<RunKeys>& run_keys();
const KeyTable<TrainKeys>& train_keys();
const KeyTable<DistributedKeys>& distributed_keys();
const KeyTable<CheckpointKeys>& checkpoint_keys();  // beside the backend's options
const KeyTable<ComponentSpec>& hook_keys();         // of each [[hooks]] table, beside the hook's
// [[optimizer.groups]]: lr and weight_decay land as NaN when left out (the optimizer's own);
// manifest.resolved.toml holds the groups as written, so these rows have no `read`.
const KeyTable<ParamGroupSpec>& group_keys();
// Each [models.NAME]: frozen and init_from, beside the model's own options.
const KeyTable<NamedModelSpec>& named_model_keys();

// The kernel's own manifest tables and their keys, documented like a plugin's option schema
// (`keel options`): "run", "train", "distributed", "checkpoint" (the kernel keys of
// [checkpoint]), "hooks" (kernel keys of each [[hooks]] table), "optimizer.groups". ([plugins]
// has its own keys, `paths`, `require` and `locked`: run_config.hpp, PluginsTable.)
struct KernelTable {
  const char* name;
  const char* description;
  const Schema* schema;
};
const std::vector<KernelTable>& kernel_tables();

// Whether changing the flattened key `dotted` ("train.epochs", "optimizer.lr",
// "hooks[1].type", "data.test.limit") on --resume breaks an exact continuation: the row's
// answer for a kernel key; for a component's own options (and `type`), its section's (below);
// [plugins] keys are safe; anything else (a key no row declares) breaks.
OnResume on_resume(const std::string& dotted);

// The default (TOML text) of the kernel key `dotted` ("train.global_batch" -> "0"); null when
// no row declares it. A key that a checkpoint's manifest lacks (written by a keel before the key
// existed) and that now has its default changed nothing (config/resume_changes.cpp).
const char* row_default(const std::string& dotted);

}  // namespace keel
