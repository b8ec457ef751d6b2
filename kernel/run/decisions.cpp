// The decision table and its walk (decisions.hpp). Read kTable: its rows in order are what a
// hook sees after a step and at an epoch's end; each row's `due` owns its period (record_due:
// run/metrics.cpp, evaluation_due: run/evaluate.cpp, save_due: run/checkpointing.cpp).
#include "run/decisions.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "run/checkpointing.hpp"
#include "run/evaluate.hpp"
#include "run/metrics.hpp"
#include "run/run.hpp"

namespace keel {

namespace {

// One decision: the events hooks see when it acts (as abi.h's pseudocode names them), the
// moments at which it is considered (bits of Moment), whether it is due, and what it does.
struct Row {
  const char* events;
  unsigned moments;
  bool (*due)(Run&, const MomentInfo&);
  void (*act)(Run&, const MomentInfo&);
};

constexpr unsigned at(Moment m) { return 1u << static_cast<unsigned>(m); }
constexpr unsigned kStart = at(Moment::kStart), kStepEnd = at(Moment::kStepEnd),
                   kEpochOver = at(Moment::kEpochOver), kEpochEnd = at(Moment::kEpochEnd),
                   kFinish = at(Moment::kFinish);

bool record_is_due(Run& run, const MomentInfo&) { return record_due(run); }
// A record that does not directly follow the step's agreement agrees on its times itself.
void record(Run& run, const MomentInfo&) { record_train(run); }
// The asynchronous save in flight, waited for and announced (CHECKPOINT_SAVED) once committed.
void commit_async_save(Run& run, const MomentInfo&) { finish_async_save(run, /*block=*/true); }

// The rows, in the order they run at each moment. A train record is due every log_every steps
// and, once the run has ended, for the steps since the last record; it has three rows because
// the run can end at three points of a walk: with the step or the epoch (the first), or by a
// stop that the hooks of an evaluation or a save requested.
const Row kTable[] = {
    // A background save that every rank has committed: its CHECKPOINT_SAVED (and the requests
    // its hooks set) belong to this step.
    {"CHECKPOINT_SAVED (async)", kStepEnd,
     [](Run&, const MomentInfo& m) { return m.async_saved; }, commit_async_save},
    {"METRICS (split \"train\")", kStepEnd | kEpochOver, record_is_due,
     [](Run& run, const MomentInfo& m) { record_train(run, m.slowest); }},
    {"EVAL_START, EVAL_END, METRICS (split = each evaluation set's name)",
     kStart | kStepEnd | kEpochEnd,
     [](Run& run, const MomentInfo& m) {
       return evaluation_due(run, m.moment, m.epoch_complete);
     },
     [](Run& run, const MomentInfo&) { evaluate(run); }},
    {"METRICS (split \"train\")", kEpochEnd, record_is_due, record},
    {"CHECKPOINT_SAVED", kStart | kStepEnd | kEpochEnd | kFinish,
     [](Run& run, const MomentInfo& m) { return save_due(run, m.moment); },
     [](Run& run, const MomentInfo&) { save_checkpoint(run); }},
    {"METRICS (split \"train\")", kStepEnd | kEpochEnd, record_is_due, record},
    // The save still in flight at the run's end, once committed (the kernel waits for it).
    {"CHECKPOINT_SAVED (async)", kFinish, [](Run&, const MomentInfo&) { return true; },
     commit_async_save},
};

// The moments in the loop's order, as describe_decisions names them.
const std::pair<Moment, const char*> kMoments[] = {
    {Moment::kStart, "start"},
    {Moment::kStepEnd, "step end"},
    {Moment::kEpochOver, "epoch over"},
    {Moment::kEpochEnd, "epoch end"},
    {Moment::kFinish, "finish"},
};

// A stop target the run has reached: the reason the run ends, and the key and value of the
// target (reason "" when none is reached).
struct StopTarget {
  std::string reason;
  const char* key = "";
  int64_t value = 0;
};

// Whether the run has reached max_steps, max_samples or max_tokens.
StopTarget stop_target_reached(const Run& run) {
  const RunConfig& c = run.config;
  const keel_trainer_state& p = run.progress;
  if (c.train.max_steps > 0 && p.step >= c.train.max_steps)
    return {"max_steps reached", "train.max_steps", c.train.max_steps};
  if (c.train.max_samples > 0 && p.samples >= c.train.max_samples)
    return {"max_samples reached", "train.max_samples", c.train.max_samples};
  if (c.train.max_tokens > 0 && p.tokens >= c.train.max_tokens)
    return {"max_tokens reached", "train.max_tokens", c.train.max_tokens};
  return {};
}

}  // namespace

void decide_end(Run& run, Moment moment) {
  if (run.end.decided()) return;
  const RunConfig& c = run.config;
  StopTarget target;
  if (moment == Moment::kStart || moment == Moment::kStepEnd) target = stop_target_reached(run);
  std::string reason = target.reason;
  if (run.end.stop_signal)
    reason = std::string("stopped by ") + (run.end.stop_signal == SIGTERM ? "SIGTERM" : "SIGINT");
  // A stream's epoch that ended without a batch: the stream has no more windows.
  if (reason.empty() && moment == Moment::kEpochOver && run.plan.stream && run.epoch.batches == 0)
    reason = fmt::format("the stream ended (epoch {} had no batch)", run.progress.epoch);
  const bool epochs_done =
      c.train.epochs > 0 && (moment == Moment::kStart ? run.progress.epoch >= c.train.epochs
                       : moment == Moment::kEpochOver ? run.progress.epoch + 1 >= c.train.epochs
                                                      : false);
  if (reason.empty() && epochs_done) reason = "epochs done";
  if (reason.empty() && (moment == Moment::kStepEnd || moment == Moment::kEpochEnd) &&
      run.requests.stop())
    reason = "stop requested by a hook";
  if (reason.empty()) return;
  if (moment == Moment::kStart) {
    // The stop target it reached (else epochs), and twice its value: a --set that trains on
    // from here.
    const bool by_target = !target.reason.empty() && reason == target.reason;
    const char* key = by_target ? target.key : "train.epochs";
    const int64_t value = by_target ? target.value : c.train.epochs;
    spdlog::warn("--resume: the run had already reached its end at step {} ({}): nothing left to "
                 "train; hint: to train on from its checkpoint, raise {} (e.g. --resume --set "
                 "{}={})",
                 run.progress.step, reason, key, key, value * 2);
  }
  run.end.reason = reason;
}

void walk_decisions(Run& run, const MomentInfo& m) {
  decide_end(run, m.moment);
  for (const Row& row : kTable) {
    if (!(row.moments & at(m.moment)) || !row.due(run, m)) continue;
    row.act(run, m);
    decide_end(run, m.moment);
  }
  if (m.moment == Moment::kStepEnd || m.moment == Moment::kEpochEnd) run.requests.clear();
}

std::vector<std::string> describe_decisions() {
  std::vector<std::string> lines;
  for (const auto& [moment, name] : kMoments) {
    std::string line = std::string(name) + ":";
    const char* sep = " ";
    for (const Row& row : kTable) {
      if (!(row.moments & at(moment))) continue;
      line += sep + std::string(row.events);
      sep = ", ";
    }
    lines.push_back(line);
    if (moment == Moment::kEpochOver) lines.emplace_back("EPOCH_END");
  }
  return lines;
}

}  // namespace keel
