// The run's "train" records: the METRICS event of split "train" that sinks write
// (metrics.jsonl, the console), over the steps since the previous record.
#pragma once

namespace keel {

struct Run;

// Whether a train record is due now: steps ran since the last one, and the step is a log_every
// boundary or the run has ended (the last, partial window).
bool record_due(const Run& run);

// Sends the train record of the steps since the last one (events METRICS "train"), the window's
// loss, throughput, times and the rest, and restarts the window at log_every boundaries.
void record_train(Run& run);

}  // namespace keel
