// [step] (ABI 1.13, keel/step.h): a plugin computes each training micro-batch's loss from the
// run's models, [model] and the frozen [models.NAME], which it runs through the kernel's
// services. The kernel does the rest of the step as without one (run/step.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <string>

#include "components.hpp"
#include "keel/step.h"
#include "run/model_calls.hpp"

namespace keel {

struct Run;

// A [models.NAME]: loaded from its init_from checkpoint, on the run's device, in evaluation
// mode, its parameters without requires_grad; never given to an optimizer, never saved.
struct FrozenModel {
  std::string name;
  Instance<keel_model> model;
  ModelCalls calls;  // over `model`
};

struct OwnStep {
  Instance<keel_step> step;  // null: the kernel's step (forward of [model], then [loss])
  std::deque<FrozenModel> models;  // in the order of their names (a deque: `calls` point in)

  explicit operator bool() const { return static_cast<bool>(step); }
};

// Creates the [models.NAME] (loading each from its init_from, which needs the run's
// [checkpoint] backend) and the [step], when the manifest has one. [setup]
void create_own_step(Run& run);

// The loss of micro-batch `mb` from the step's compute, checked: a 0-dim floating tensor that
// requires grad. Errors name the step (and the model, for a failed forward).
at::Tensor own_step_loss(Run& run, const MicroBatch& mb);

}  // namespace keel
