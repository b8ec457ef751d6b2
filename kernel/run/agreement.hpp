// What the ranks of a data-parallel run agree on, and with which collectives: the one list of
// them. Every rank issues the same collectives in the same order (process_group.hpp); each
// agreement is one all-reduce of a few doubles with one operation for all its fields (a sum or
// a max, never mixed, so no field is encoded): flags are summed or maxed as 0/1, and a
// minimum is the max of negated values.
//
// Once, at setup: the micro-batches every rank takes per epoch and the run's planned length
// (agree_epoch_plan): the fewest batches_per_epoch and the shortest plan of any rank (max of
// the negated counts), so every rank's schedule learns the same total_steps; and that either
// every rank's training data is a stream (batches_per_epoch -1) or none is.
//
// Each training step (run/fetch.cpp, run/step.cpp and its modes in run/step_modes.cpp, then
// run/trainer.cpp) issues them in this order:
//   items    with item normalisation only, before the first forward: sum {items, unreported};
//            waited for after that forward, which hides it.
//   outcome  with no sparse tables and no [distributed] shard, before the last micro-batch's
//            backward: sum {loss, non-finite loss, samples, tokens, short data}; waited for
//            after clipping, so backward hides it. Every rank then clips the same all-reduced
//            gradients, so their finiteness (the clipper's norm, fp16's unscaling) is the same
//            on every rank without agreeing on it.
//   the last micro-batch's backward: the gradient all-reduce, one per bucket (c10d::Reducer,
//            distributed/grad_sync.hpp).
//   outcome  with sparse tables or [distributed] shard instead, after backward and clipping,
//            blocking: sum {loss, non-finite loss or gradients, samples, tokens, short data,
//            the sparse row gradients' sum of squares}: each rank knows only then what it
//            adds (its rows, the finiteness of its shards).
//   requests at the step's end (Requests::agree_at_step_end): max {stop, eval, checkpoint
//            requests, stop signal, an asynchronous checkpoint save still running, the
//            window's train, data, eval and checkpoint seconds}.
// So a step issues 2 agreements (3 with item normalisation) beside the gradient all-reduces,
// and waits with nothing to overlap it only at the step's end (and at the outcome with sparse
// tables or shards).
//
// A step fetches without asking the other ranks while its epoch is within the agreed count
// (run/fetch.cpp, fetch_micro_batches); past it (the fetch that finds an epoch's end, or data
// beyond the count) each fetch agrees its micro-batches: max {-micro-batches}. A rank whose
// data yields fewer than the agreed count says so in the outcome agreement, and every rank
// then fails.
// A stream has no agreed count: every fetch agrees, max {each rank's micro-batches} (rank r
// puts its count in field r, -1 in the others), and unequal counts fail every rank with one
// line naming each rank's; so a step on a stream issues one agreement more.
//
// Between steps, the requests are agreed again (max {stop, eval, checkpoint, 0, 0}) before they
// are read when hooks ran since the last agreement (a record's METRICS event, an evaluation, a
// save, an asynchronous save's CHECKPOINT_SAVED after the step's end), and a train record that does not follow a step's end agreement (one after an
// evaluation or a save, or at an epoch's end) agrees its window times itself (max).
// Evaluations, checkpoint saves and resumes, and the run's start and end agree in their own
// code (run/evaluate.cpp, checkpoint/multi_rank.cpp, run/resume.cpp, run/assemble.cpp,
// run/trainer.cpp); an asynchronous save's writers agree through the store only, never with a
// collective (checkpoint/multi_rank.hpp).
#pragma once

#include <cstdint>
#include <string>

namespace keel {

class ProcessGroup;
struct Run;

// The micro-batches every rank takes per epoch before it asks the others, and the run's
// planned length in steps: the fewest `batches` (this rank's batches_per_epoch) and the
// shortest `steps` (this rank's plan from its own batches and size; 0: unknown, then 0 for
// all, since every rank has the same stop targets) of any rank. One all-reduce. A stream
// (`batches` -1 on every rank) gets batches 0; -1 on some ranks only throws keel::Error
// naming `data` (the training data's label).
struct EpochPlan {
  int64_t batches = 0;
  int64_t steps = 0;
};
EpochPlan agree_epoch_plan(ProcessGroup& group, int64_t batches, int64_t steps,
                           const std::string& data);

// The collectives this process issued inside training steps, from the fetch of a step's
// micro-batches to the agreement at its end, for the `collectives:` line.
struct CollectiveTally {
  int64_t steps = 0;
  int64_t agreements = 0;    // ProcessGroup's collectives (collectives_issued) less the shards'
  int64_t all_reduces = 0;   // the gradient reducer's, one per bucket (GradSync::all_reduces)
  int64_t shard_ops = 0;     // [distributed] shard's (ShardedParams::collectives_issued)
  int64_t mark_agreements = 0, mark_all_reduces = 0, mark_shard_ops = 0;  // at the step's start

  void step_starts(const Run& run);
  void step_ended(const Run& run);
};

// With several ranks, on rank 0: one line "collectives: N in S steps (X per step: A
// agreements, B gradient bucket all-reduces[, C shard collectives (...)]); M outside steps
// (...); not counted: ...", the shard collectives only with [distributed] shard, at debug
// level (run.log), after its totals at info ("collectives: N in S steps (X per step), M
// outside steps; ...").
void log_collectives(const Run& run);

}  // namespace keel
