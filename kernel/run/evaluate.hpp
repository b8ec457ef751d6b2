// Evaluation on the evaluation sets ([data.test], [data.eval.NAME]): the model in eval mode, no
// gradients, and for each set the mean loss over every item (exact over the ranks' shards) and
// the task metrics.
#pragma once

namespace keel {

struct Run;
enum class Moment;

// Whether an evaluation is due at `moment`: at the start of a fresh run with eval_at_start;
// every eval_every_steps steps and on a hook's request after a step; after an epoch's end when
// eval_each_epoch is set and the epoch was complete, when the run has ended, and on request.
bool evaluation_due(Run& run, Moment moment, bool epoch_complete = false);

// Evaluates the model at the current step on each evaluation set in turn (once per step:
// nothing when it already did, or when the run has no evaluation set); for each set the events
// EVAL_START, EVAL_END and METRICS, with split = the set's name.
void evaluate(Run& run);

}  // namespace keel
