// The run's periodic decisions in one ordered table (decisions.cpp): each row is an action
// (the async save's commit, a train record, an evaluation, a checkpoint), the moments at which
// it is considered, and `due`, which owns the row's period. The loop (trainer.cpp) walks the
// table at each moment; the order of the rows is the order of the events hooks see (abi.h,
// above keel_event_kind, and docs/loop.md, "The decision table": tests/unit/test_decisions.cpp
// checks both against describe_decisions()).
#pragma once

#include <string>
#include <vector>

namespace keel {

struct Run;

// The points of the loop at which the table is walked (trainer.cpp, Trainer::train).
enum class Moment {
  kStart,      // training starts (a resumed run may have reached its end already)
  kStepEnd,    // a step was taken
  kEpochOver,  // the epoch's last step was taken (its end events not sent yet)
  kEpochEnd,   // the epoch's end events were sent
  kFinish,     // the run is over
};

// What a walk knows beyond the run.
struct MomentInfo {
  Moment moment;
  bool epoch_complete = false;  // kEpochEnd: the epoch was complete (its EPOCH_END was sent)
  // kStepEnd: the ranks agreed (Requests::agree_at_step_end) that every rank's asynchronous
  // save has committed, and the slowest rank's window times at this step (window_times).
  bool async_saved = false;
  const std::vector<double>* slowest = nullptr;
};

// The one place that decides the run is over, and why (run.end.reason; the trainer logs it at
// the end). Considers the stop targets (at kStart and kStepEnd), a stop signal, a stream's
// epoch without a batch (kEpochOver), the epochs done (kStart, kEpochOver) and a hook's stop
// request (kStepEnd, kEpochEnd). Does nothing once decided.
void decide_end(Run& run, Moment moment);

// Walks the table at `at`: decides whether the run is over, then, in the table's order, runs
// each row considered at that moment whose `due` holds, and decides again after each row that
// ran (its events' hooks may have asked the run to stop). After the walks at kStepEnd and
// kEpochEnd the requests (those of the step, or of the epoch's end events) are cleared.
void walk_decisions(Run& run, const MomentInfo& at);

// The table in words, one line per moment in the loop's order: "<moment>: <event>, <event>".
// The line of kEpochOver is followed by "EPOCH_END", which the loop sends between the two
// walks of an epoch's end when the epoch was complete.
std::vector<std::string> describe_decisions();

}  // namespace keel
