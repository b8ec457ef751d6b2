// One training step: the micro-batches of one optimizer step, and the step over them.
#pragma once

#include <cstdint>
#include <vector>

#include "run/model_calls.hpp"

namespace keel {

struct Run;

// Fetches up to run.plan.grad_accum micro-batches ([train] grad_accum, or derived from [train]
// global_batch); fewer at the end of an epoch, none when it is over.
// With several ranks, every rank takes the same number: within the micro-batches agreed for
// the epoch (run.plan.epoch_batches) without asking the others (a rank whose data yields fewer
// sets run.epoch.missing, and the step then fails on every rank), past them as many as the
// rank with the fewest (run/agreement.hpp); on a stream every rank must have as many (else
// every rank throws, naming each rank's count).
std::vector<MicroBatch> fetch_micro_batches(Run& run);

// One optimizer step over `batches` (events STEP_START ... STEP_END, abi.h). Returns the step's
// loss (the mean over ranks). With run.epoch.missing set (several ranks) it throws once the
// ranks agreed on the step's loss, on every rank, before the optimizer step.
double train_step(Run& run, const std::vector<MicroBatch>& batches);

// Sets every optimizer group's learning rate for `step`: its base rate times the schedule's
// factor; the sparse optimizer's likewise (the same schedule, run/tables.hpp).
void set_lr_for(Run& run, int64_t step);

}  // namespace keel
