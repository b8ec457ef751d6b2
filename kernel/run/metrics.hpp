// The run's "train" records: the METRICS event of split "train" that sinks write
// (metrics.jsonl, the console), over the steps since the previous record.
#pragma once

#include <vector>

namespace keel {

struct Run;

// Whether a train record is due now: steps ran since the last one, and the step is a log_every
// boundary or the run has ended (the last, partial window).
bool record_due(const Run& run);

// This rank's seconds of the log window so far: training (wall time less evaluations and
// checkpoint saves, reported on their own so that throughput and MFU describe training steps),
// data loading, evaluation, checkpoint saving.
std::vector<double> window_times(const Run& run);

// Sends the train record of the steps since the last one (events METRICS "train"), the window's
// loss, throughput, times and the rest, and restarts the window at log_every boundaries. The
// times are the slowest rank's: `slowest`, window_times agreed at this step's end
// (Requests::agree_at_step_end), or without it (a record that does not follow that agreement
// directly) agreed here with one all-reduce when there are several ranks.
void record_train(Run& run, const std::vector<double>* slowest = nullptr);

}  // namespace keel
