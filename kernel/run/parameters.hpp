// The model and its tensors as the run uses them: creation contexts, the parameters
// (deduplicated), the model state checkpoints hold, and the optimizer's parameter groups.
#pragma once

#include <cstdint>
#include <vector>

#include "components.hpp"
#include "run/plugin_state.hpp"
#include "run_config.hpp"

namespace keel {

struct Run;

// The creation context of a component (seed, ranks, run directory, resume step).
keel_create_context context(const Run& run, const ComponentSpec& spec);
// The context of a component that works on the model's parameters (optimizer, clipper, mfu).
keel_create_context param_context(const Run& run, const ComponentSpec& spec);
// The context of a component that updates or clips the parameters (optimizer, clipper): with
// [distributed] shard, this rank's shards and the keel_shard_group; otherwise param_context.
keel_create_context update_context(const Run& run, const ComponentSpec& spec);

template <class Abi>
Instance<Abi> make_instance(const Run& run, const ComponentSpec& spec) {
  return create_instance<Abi>(*spec.component, context(run, spec));
}

// Creates the model and collects its parameters and state (on the run's device), and its
// FLOPs per sample.
void create_model(Run& run);

// [distributed] shard: splits the parameters over the ranks (run.shards); with one process, a
// warning that the run holds everything, as with "none".
void shard_parameters(Run& run);

// Parameter groups from [[optimizer.groups]]: each parameter joins the first group whose regex
// matches its whole name, else group 0 (the optimizer's own settings, NaN lr and weight decay).
struct ParamGroups {
  std::vector<int32_t> of_param;  // the group of each parameter
  std::vector<double> lr, weight_decay;  // per group
};
ParamGroups assign_param_groups(const Run& run);

}  // namespace keel
