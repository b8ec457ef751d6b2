// One training step over the micro-batches of one optimizer step (run/fetch.hpp fetches them);
// what several ranks, shards, sparse tables and fp16 add to it are its modes (run/step_modes.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "run/model_calls.hpp"

namespace keel {

struct Run;

// One optimizer step over `batches` (events STEP_START ... STEP_END, abi.h). Returns the step's
// loss (the mean over ranks). With run.epoch.missing set (several ranks) it throws once the
// ranks agreed on the step's loss, on every rank, before the optimizer step.
double train_step(Run& run, const std::vector<MicroBatch>& batches);

// Sets every optimizer group's learning rate for `step`: its base rate times the schedule's
// factor; the sparse optimizer's likewise (the same schedule, run/tables.hpp).
void set_lr_for(Run& run, int64_t step);

}  // namespace keel
