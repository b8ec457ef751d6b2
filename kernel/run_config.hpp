// The typed configuration of one run, resolved from a Manifest and validated against the
// kernel's own schemas and every component's published option schema before step 1.
//
// Manifest layout (see docs/manifest.md); the kernel's keys are declared in config/keys.cpp:
//   [run]          name, output_dir, seed, threads, device, mode, malloc_tuning
//   [plugins]      paths, require (and MANIFEST.lock beside the file, when present)
//   [train]        stop targets (epochs, max_steps, max_samples, max_tokens), grad_accum,
//                  precision, nonfinite policy, logging and evaluation cadence
//   [model] [data.train] [data.test] [data.eval.NAME] [optimizer] [sparse_optimizer]
//   [lr_scheduler] [loss]
//   [grad_clipper] [mfu] [profiler] [checkpoint] [[hooks]] [step] [models.NAME]
//                  -- each names its plugin with `type`
//   [distributed]  timeout_s, backend, bucket_cap_mb, shard (several processes)
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "config/keys.hpp"
#include "config/sections.hpp"
#include "manifest.hpp"
#include "options.hpp"
#include "loader/registry.hpp"

namespace keel {

struct ComponentSpec {
  std::string section;  // "optimizer", "data.train", "hooks[0]"
  const Component* component = nullptr;
  keel_options options;
  // [[hooks]]' kernel keys (config/keys.cpp, hook_keys):
  int64_t priority = 0;  // ascending order of calls, ties in manifest order
  std::string label;     // the key of its checkpointed state (default: its type)
};

// One evaluation set: the split name its records carry (METRICS events, metrics.jsonl,
// keep_best's "<split>.<key>") and its dataset.
struct EvalSetSpec {
  std::string name;
  ComponentSpec data;
};

// One [models.NAME] table: a model beside [model] that a [step] runs (keel/step.h). Its
// kernel keys (config/keys.cpp, named_model_keys) land in `frozen` and `init_from`.
struct NamedModelSpec {
  std::string name;    // NAME: what the step's services.forward calls it
  ComponentSpec model;  // section "models.NAME"
  bool frozen = true;   // only frozen models are supported (resolve refuses false)
  std::string init_from;  // the committed checkpoint its weights come from, at every start
};

// One [[optimizer.groups]] entry: parameters whose name matches `params` (ECMAScript regex,
// whole name) join this group; NaN keeps the optimizer's own value.
struct ParamGroupSpec {
  std::string params;
  std::string where;  // file:line:col (or --set argument) of `params`
  double lr = NAN;
  double weight_decay = NAN;
};

// The manifest's [plugins] table: `paths` (search directories, relative to the file that sets
// them; each must exist), `require` (plugin name -> version requirement, checked after
// discovery) and `locked` (a missing lock is an error).
struct PluginsTable {
  std::vector<std::string> dirs;
  std::vector<PluginRequirement> require;
  bool locked = false;
  std::string locked_where;  // file:line:col of `locked = true`
};

// One run's configuration, grouped by manifest section. The kernel's keys are declared in
// config/keys.cpp (type, default, help, resume rule); resolve fills these from them.
struct RunConfig {
  std::string manifest_path;
  RunKeys run;                  // [run]
  PluginsTable plugins;         // [plugins]
  std::string lock_file;        // the MANIFEST.lock in use, or ""
  DistributedKeys distributed;  // [distributed]
  TrainKeys train;              // [train]
  // [checkpoint]'s kernel keys (the declared defaults also when there is no [checkpoint]);
  // `checkpoint` below is its backend.
  CheckpointKeys checkpointing;
  std::vector<ParamGroupSpec> param_groups;  // [[optimizer.groups]]

  // Set by the command line, not the manifest: `keel train --resume [PATH]`.
  enum class Resume { kNo, kLatest, kPath } resume = Resume::kNo;
  std::string resume_path;
  bool resume_changed = false;  // --resume-changed: accept manifest changes that break exactness
  // --overwrite: train into a run directory that holds an earlier run's records (otherwise
  // refused): manifest.resolved.toml and plugins.json are replaced, the sinks start their files
  // afresh, run.log is appended to, and the earlier run's checkpoints stay.
  bool overwrite = false;

  ComponentSpec model, train_data, optimizer, loss;
  // The evaluation sets: [data.test] (named "test") first, then each [data.eval.NAME] in the
  // order of their names. `section` is "data.test" or "data.eval.NAME".
  std::vector<EvalSetSpec> eval_sets;
  std::optional<ComponentSpec> lr_scheduler, grad_clipper, mfu, profiler, checkpoint;
  // [sparse_optimizer]: updates the model's sparse embedding tables (ABI 1.9); required exactly
  // when the model has tables (checked at assembly, run/tables.cpp).
  std::optional<ComponentSpec> sparse_optimizer;
  std::vector<ComponentSpec> hooks;
  // [step] (ABI 1.13, keel/step.h): computes each training micro-batch's loss from the run's
  // models; and the [models.NAME] it may run beside [model], in the order of their names.
  std::optional<ComponentSpec> step;
  std::vector<NamedModelSpec> models;

  // Everything above as TOML, defaults filled in: written to manifest.resolved.toml.
  toml::table resolved;
};

// Validates the manifest; loads plugins from [plugins] paths plus the default search path into
// `registry` first. Throws keel::Error (file:line:col, dotted key, hint) on the first problem.
// With `use_lock`, the manifest's lock (manifest_lock) restricts discovery to the files it
// lists, and every file it lists must load. Without it, no lock is read: the caller may have
// given `registry` one (keel plugins lock does, to relock).
RunConfig resolve(const Manifest& manifest, Registry& registry, bool use_lock = true);

// manifest.resolved.toml's text: a comment naming config.manifest_path, then config.resolved,
// which resolves again to the same run (floats in their shortest form that reads back).
std::string resolved_text(const RunConfig& config);

// The manifest's [plugins] table, checked (PluginsTable above).
PluginsTable manifest_plugins(const Manifest& manifest);

// The lock a run of `manifest` uses: the first along its extends chain (loader/lock.hpp), or
// nothing. Throws keel::Error when there is none and [plugins] locked = true.
std::optional<Lock> manifest_lock(const Manifest& manifest, const PluginsTable& plugins);

// Every component the run uses (model, data, optimizer, loss, the optional ones, hooks).
std::vector<const ComponentSpec*> used_components(const RunConfig& config);

// The plugins a run uses, as the run directory's plugins.json: {"plugins": [{"name", "version",
// "sha256", "path", "components": ["<section>:<component>", ...]}, ...]}.
std::string used_plugins_json(const RunConfig& config);

}  // namespace keel
