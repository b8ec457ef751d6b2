// The typed configuration of one run, resolved from a Manifest and validated against the
// kernel's own schemas and every component's published option schema before step 1.
//
// Manifest layout (see README "Manifest"):
//   [run]          name, output_dir, seed, threads, device, mode, malloc_tuning
//   [plugins]      paths, require (and MANIFEST.lock beside the file, when present)
//   [train]        stop targets (epochs, max_steps, max_samples, max_tokens), grad_accum,
//                  precision, nonfinite policy, logging and evaluation cadence
//   [model] [data.train] [data.test] [optimizer] [lr_scheduler] [loss] [grad_clipper]
//   [mfu] [profiler] [checkpoint] [[hooks]]   -- each names its plugin with `type`
//   [distributed]  timeout_s, backend, bucket_cap_mb (several processes)
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "manifest.hpp"
#include "options.hpp"
#include "loader/registry.hpp"

namespace keel {

struct ComponentSpec {
  std::string section;  // "optimizer", "data.train", "hooks[0]"
  const Component* component = nullptr;
  keel_options options;
  int64_t priority = 0;  // hooks: ascending order of calls, ties in manifest order
  std::string label;     // hooks: the key of its checkpointed state (default: its type)
};

// One [[optimizer.groups]] entry: parameters whose name matches `params` (ECMAScript regex,
// whole name) join this group; NaN keeps the optimizer's own value.
struct ParamGroupSpec {
  std::string params;
  std::string where;  // file:line:col (or --set argument) of `params`
  double lr = NAN;
  double weight_decay = NAN;
};

enum class RunMode { kTrainAndEvaluate, kTrain, kEvaluate };
enum class Precision { kFp32, kBf16, kFp16 };
enum class NonFinite { kError, kSkip };
enum class AccumNorm { kAuto, kMean, kItems };

struct RunConfig {
  std::string manifest_path;
  // [run]
  std::string name;
  std::string output_dir;
  uint64_t seed = 0;
  int64_t threads = 0;  // 0: the cores / the processes on this machine
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N", "auto" (validated)
  RunMode mode = RunMode::kTrainAndEvaluate;
  bool malloc_tuning = true;
  // [plugins]
  std::vector<std::string> plugin_paths;
  std::vector<PluginRequirement> plugin_requirements;
  std::string lock_file;  // the MANIFEST.lock in use, or ""
  // [distributed] (used when a launcher started several processes; see distributed/launch.hpp)
  int64_t dist_timeout_s = 300;
  std::string dist_backend = "auto";
  int64_t dist_bucket_cap_mb = 25;
  // [train]
  // Stop targets: whichever is reached first (0: no limit).
  int64_t epochs = 1;
  int64_t max_steps = 0;
  int64_t max_samples = 0;
  int64_t max_tokens = 0;
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  AccumNorm accum_normalization = AccumNorm::kAuto;
  Precision precision = Precision::kFp32;
  NonFinite nonfinite = NonFinite::kError;
  int64_t max_skips = 10;
  int64_t log_every = 50;
  bool eval_each_epoch = true;
  int64_t eval_every_steps = 0;   // 0: only per epoch / at the end
  int64_t eval_max_batches = 0;   // 0: the whole split
  std::vector<ParamGroupSpec> param_groups;  // [[optimizer.groups]]
  // [checkpoint] kernel keys
  int64_t checkpoint_every_steps = 0;
  int64_t checkpoint_keep_last = 0;  // 0 (and keep_best 0): keep all
  int64_t checkpoint_keep_best = 0;
  std::string checkpoint_best_metric;  // "<split>.<key>", e.g. "test.loss"
  bool checkpoint_best_max = false;
  bool checkpoint_at_end = true;
  bool checkpoint_initial = false;
  bool checkpoint_async = false;
  // Warm start: checkpoint directory whose model weights start the run, which of them
  // (ECMAScript regexes searched in the model's tensor names; "" = all / none), and
  // [checkpoint.init_rename] prefix rewrites (checkpoint prefix -> model prefix).
  std::string init_from;
  std::string init_include, init_exclude;
  std::vector<std::pair<std::string, std::string>> init_rename;
  // init_from of a directory without a commit record with a backend other than safetensors
  // (whose files hold no code and are checked against their size): only when the user says so.
  bool init_from_unverified = false;

  // Set by the command line, not the manifest: `keel train --resume [PATH]`.
  enum class Resume { kNo, kLatest, kPath } resume = Resume::kNo;
  std::string resume_path;
  bool resume_changed = false;  // --resume-changed: accept manifest changes that break exactness
  // --overwrite: train into a run directory that holds an earlier run's records (otherwise
  // refused): manifest.resolved.toml and plugins.json are replaced, the sinks start their files
  // afresh, run.log is appended to, and the earlier run's checkpoints stay.
  bool overwrite = false;

  ComponentSpec model, train_data, optimizer, loss;
  std::optional<ComponentSpec> test_data, lr_scheduler, grad_clipper, mfu, profiler, checkpoint;
  std::vector<ComponentSpec> hooks;

  // Everything above as TOML, defaults filled in: written to manifest.resolved.toml.
  toml::table resolved;
};

// The kernel's own manifest tables and their keys, documented like a plugin's option schema
// (`keel options`): "run", "train", "checkpoint" (the kernel keys of [checkpoint]), "hooks"
// (kernel keys of each [[hooks]] table), "optimizer.groups". ([plugins] has its own keys,
// `paths`, `require` and `locked`.)
struct KernelTable {
  const char* name;
  const char* description;
  const Schema* schema;
};
const std::vector<KernelTable>& kernel_tables();

// Validates the manifest; loads plugins from [plugins] paths plus the default search path into
// `registry` first. Throws keel::Error (file:line:col, dotted key, hint) on the first problem.
// With `use_lock`, the manifest's lock (manifest_lock) restricts discovery to the files it
// lists, and every file it lists must load. Without it, no lock is read: the caller may have
// given `registry` one (keel plugins lock does, to relock).
RunConfig resolve(const Manifest& manifest, Registry& registry, bool use_lock = true);

// The manifest's [plugins] table: `paths` (search directories, relative to the file that sets
// them; each must exist), `require` (plugin name -> version requirement, checked after
// discovery) and `locked` (a missing lock is an error).
struct PluginsTable {
  std::vector<std::string> dirs;
  std::vector<PluginRequirement> require;
  bool locked = false;
  std::string locked_where;  // file:line:col of `locked = true`
};
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
