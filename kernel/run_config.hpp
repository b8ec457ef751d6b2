// The typed configuration of one run, resolved from a Manifest and validated against the
// kernel's own schemas and every component's published option schema before step 1.
//
// Manifest layout (see README "Manifest"):
//   [run]          name, output_dir, seed, threads
//   [plugins]      paths
//   [train]        epochs, max_steps, log_every, eval_each_epoch, eval_max_batches
//   [model] [data.train] [data.test] [optimizer] [lr_scheduler] [loss] [grad_clipper]
//   [mfu] [profiler] [checkpoint] [[hooks]]   -- each names its plugin with `type`
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "manifest.hpp"
#include "options.hpp"
#include "registry.hpp"

namespace keel {

struct ComponentSpec {
  std::string section;  // "optimizer", "data.train", "hooks[0]"
  const Component* component = nullptr;
  keel_options options;
};

struct RunConfig {
  std::string manifest_path;
  // [run]
  std::string name;
  std::string output_dir;
  uint64_t seed = 0;
  int64_t threads = 0;  // 0: every core
  // [plugins]
  std::vector<std::string> plugin_paths;
  // [train]
  int64_t epochs = 1;
  int64_t max_steps = 0;  // 0: no limit
  int64_t log_every = 50;
  bool eval_each_epoch = true;
  int64_t eval_max_batches = 0;  // 0: the whole split
  // [checkpoint] kernel keys
  int64_t checkpoint_every_steps = 0;
  int64_t checkpoint_keep_last = 0;  // 0: keep all
  bool checkpoint_at_end = true;
  bool checkpoint_initial = false;
  std::string init_from;  // checkpoint directory whose model weights start the run

  ComponentSpec model, train_data, optimizer, loss;
  std::optional<ComponentSpec> test_data, lr_scheduler, grad_clipper, mfu, profiler, checkpoint;
  std::vector<ComponentSpec> hooks;

  // Everything above as TOML, defaults filled in: written to manifest.resolved.toml.
  toml::table resolved;
};

// Validates the manifest; loads plugins from [plugins] paths plus the default search path into
// `registry` first. Throws keel::Error (file:line:col, dotted key, hint) on the first problem.
RunConfig resolve(const Manifest& manifest, Registry& registry);

// Plugin search directories named by the manifest's [plugins] paths (relative to its file).
std::vector<std::string> manifest_plugin_dirs(const Manifest& manifest);

}  // namespace keel
