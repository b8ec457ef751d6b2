// The training data's micro-batches for each optimizer step.
#pragma once

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

// [train] micro_batch_size: each batch of `batches` split along dimension 0 into micro-batches
// of at most `rows` rows (views of its tensors, in order; the last may be smaller), its samples
// and tokens shared out in proportion to the rows (they sum to the batch's); `rows` <= 0, or a
// batch of at most `rows` rows, stays whole.
std::vector<MicroBatch> split_rows(std::vector<MicroBatch> batches, int64_t rows);

// The micro-batches of a step's batches: split_rows by [train] micro_batch_size. With several
// ranks every rank runs as many micro-batches (the modes' collectives pair up per micro-batch):
// one all-reduce agrees on the most any rank's split makes, and a rank with fewer halves its
// largest micro-batch until it has as many. When a rank's batches hold fewer rows than that,
// every rank throws one error naming both counts. (A rank whose data gave no batch takes no
// part: the step's agreement reports it.)
std::vector<MicroBatch> micro_batches(Run& run, const std::vector<MicroBatch>& batches);

}  // namespace keel
