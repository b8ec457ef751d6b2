// Evaluation on the test split: the model in eval mode, no gradients, the mean loss over every
// item (exact over the ranks' shards), and the task metrics.
#pragma once

namespace keel {

struct Run;
enum class Moment;

// Whether an evaluation is due at `moment`: every eval_every_steps steps and on a hook's
// request after a step; after an epoch's end when eval_each_epoch is set and the epoch was
// complete, when the run has ended, and on request.
bool evaluation_due(Run& run, Moment moment, bool epoch_complete = false);

// Evaluates the model at the current step (once per step: nothing when it already did, or
// when the run has no test split), events EVAL_START, EVAL_END and METRICS "test".
void evaluate(Run& run);

}  // namespace keel
