// The training loop. Read Trainer::train first: it steps, decides and acts; every decision has
// one owner that knows its own period (record_due: run/metrics.cpp, evaluation_due:
// run/evaluate.cpp, save_due: run/checkpointing.cpp, decide_end: here), and the ranks agree on
// hooks' requests underneath (run/requests.hpp).
#include "run/trainer.hpp"

#include <c10/util/Exception.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <string>
#include <utility>
#include <vector>

#include "log.hpp"
#include "run/agreement.hpp"
#include "run/assemble.hpp"
#include "run/checkpointing.hpp"
#include "run/evaluate.hpp"
#include "run/events.hpp"
#include "run/metrics.hpp"
#include "run/resume.hpp"
#include "run/run.hpp"
#include "run/signals.hpp"
#include "run/step.hpp"

namespace keel {

namespace {

// Whether the run has reached max_steps, max_samples or max_tokens: its reason, or "".
std::string stop_target_reached(const Run& run) {
  const RunConfig& c = run.config;
  const keel_trainer_state& p = run.progress;
  if (c.train.max_steps > 0 && p.step >= c.train.max_steps) return "max_steps reached";
  if (c.train.max_samples > 0 && p.samples >= c.train.max_samples) return "max_samples reached";
  if (c.train.max_tokens > 0 && p.tokens >= c.train.max_tokens) return "max_tokens reached";
  return "";
}

// A SIGTERM / SIGINT that arrived during the step just taken (agreed by the ranks), or while
// the training data waited for data and gave up (`waiting`, KEEL_BATCH_STOPPED): stop after
// the last step taken, with a checkpoint.
void stop_on_signal(Run& run, int sig, bool waiting = false) {
  if (sig == 0 || run.end.stop_signal) return;
  run.end.stop_signal = sig;
  spdlog::warn("{} received{}: stopping after step {}{}", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               waiting ? " while " + run.components.train_data.label() + " waited for data" : "",
               run.progress.step,
               run.components.store ? " and saving a checkpoint" : " (no [checkpoint]: nothing saved)");
  run.requests.add_agreed(KEEL_REQUEST_STOP | (run.components.store ? KEEL_REQUEST_CHECKPOINT : 0u));
}

// The one place that decides the run is over, and why (run.end.reason; finish_training logs
// it). At the start (a resumed run may have reached its end), after each step (a stop signal, a
// stop target, a hook's stop request), when an epoch's last step was taken (the epochs are
// done, or a stream's epoch had no batch at all), and after the events of an epoch's end (a
// hook's stop request).
void decide_end(Run& run, Moment moment) {
  if (run.end.decided()) return;
  const RunConfig& c = run.config;
  std::string reason;
  if (moment == Moment::kStart || moment == Moment::kStepEnd) reason = stop_target_reached(run);
  if (run.end.stop_signal)
    reason = std::string("stopped by ") + (run.end.stop_signal == SIGTERM ? "SIGTERM" : "SIGINT");
  // A stream's epoch that ended without a batch: the stream has no more windows.
  if (reason.empty() && moment == Moment::kEpochOver && run.plan.stream && run.epoch.batches == 0)
    reason = "the stream ended (epoch " + std::to_string(run.progress.epoch) + " had no batch)";
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
    // The stop target it reached, and twice its value: a --set that trains on from here.
    std::pair<std::string, int64_t> target{"train.epochs", c.train.epochs};
    if (reason == "max_steps reached") target = {"train.max_steps", c.train.max_steps};
    if (reason == "max_samples reached") target = {"train.max_samples", c.train.max_samples};
    if (reason == "max_tokens reached") target = {"train.max_tokens", c.train.max_tokens};
    const auto& [key, value] = target;
    spdlog::warn("--resume: the run had already reached its end at step {} ({}): nothing left to "
                 "train; hint: to train on from its checkpoint, raise {} (e.g. --resume --set "
                 "{}={})",
                 run.progress.step, reason, key, key, value * 2);
  }
  run.end.reason = reason;
}

// TRAIN_START, and the initial checkpoint of a fresh run; the log window starts.
void start_training(Run& run) {
  run.components.model.run("set_training", run.components.model->set_training, 1);
  set_lr_for(run, run.progress.step);
  emit(run, KEEL_EVENT_TRAIN_START);
  if (save_due(run, Moment::kStart)) save_checkpoint(run);
  if (!run.resume.active()) run.window = Window();  // a resumed run continues its window
  run.window.start = Clock::now();
}

// EPOCH_START, and the training data at the epoch's start (or at a resumed run's position).
void start_epoch(Run& run, int64_t epoch) {
  run.progress.epoch = epoch;
  run.epoch = EpochPosition();
  emit(run, KEEL_EVENT_EPOCH_START);
  const CheckpointMeta& saved = run.resume.meta;
  if (run.resume.active() && epoch == saved.epoch && saved.epoch_batches > 0) {
    seek_train_data(run, epoch, saved.epoch_batches);
    run.epoch.batches = saved.epoch_batches;  // counted from the start of the epoch
  } else {
    run.components.train_data.call("start_epoch", run.components.train_data->start_epoch, epoch);
  }
}

// The end of an epoch (its last step taken, or the run ended inside it): EPOCH_END when the
// epoch was complete, then what it decides and asks for. Its hooks' requests and the
// evaluation's may end the run; the record of the steps since the last one comes before
// EPOCH_END in the final epoch, else after the epoch's evaluation.
void end_epoch(Run& run, bool complete) {
  decide_end(run, Moment::kEpochOver);
  if (record_due(run)) record_train(run);  // the final epoch's last, partial window
  if (complete) {
    emit(run, KEEL_EVENT_EPOCH_END);
    run.epoch.finished = true;  // a checkpoint from here on starts the next epoch
  }
  decide_end(run, Moment::kEpochEnd);
  if (evaluation_due(run, Moment::kEpochEnd, complete)) evaluate(run);
  decide_end(run, Moment::kEpochEnd);  // e.g. early stopping on that evaluation
  if (record_due(run)) record_train(run);
  if (save_due(run, Moment::kEpochEnd)) save_checkpoint(run);
  decide_end(run, Moment::kEpochEnd);  // a stop requested by that CHECKPOINT_SAVED
  if (record_due(run)) record_train(run);
  run.requests.clear();
}

// The at_end checkpoint, the last asynchronous save, TRAIN_END; then every rank leaves together
// (none takes the store it may serve with it while another still needs it). Logs why the run
// ended, as one line "run finished at step N: <reason>" (`keel report` reads that prefix).
void finish_training(Run& run) {
  if (save_due(run, Moment::kFinish)) save_checkpoint(run);
  finish_async_save(run, /*block=*/true);
  emit(run, KEEL_EVENT_TRAIN_END);
  if (run.components.profiler)
    run.components.profiler.call("flush", run.components.profiler->flush);
  if (run.ranks.group) run.ranks.group->any(false, "finishing the run");
  log_collectives(run);
  spdlog::info("run finished at step {}: {}", run.progress.step, run.end.reason);
}

// A run that fails: a save in flight is finished first (its checkpoint may be what a resume
// needs), then the hooks hear why (their own failures here cannot be reported any better).
void report_failure(Run& run, const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string message = c10_error ? c10_error->what_without_backtrace() : e.what();
  CheckpointStore* store = run.components.store.get();
  if (store && store->in_flight()) {
    try {
      spdlog::info("checkpoint committed: {}", store->wait());
    } catch (const std::exception& save_error) {
      spdlog::error("asynchronous checkpoint save failed: {}", save_error.what());
    }
  }
  try {
    emit(run, KEEL_EVENT_EXCEPTION, nullptr, nullptr, nullptr, 0, message.c_str());
  } catch (...) {
  }
}

// What train() returns: the counters, and the signal that stopped the run.
RunSummary summary_of(Run& run) {
  RunSummary& summary = run.summary;
  summary.steps = run.progress.step;
  summary.samples = run.progress.samples;
  summary.skipped_steps = run.progress.skipped_steps;
  // A signal that arrived after the last step (during the final evaluation or save) did not
  // change the run, which ended anyway; the exit status still reports it.
  summary.stop_signal = run.end.stop_signal ? run.end.stop_signal : StopSignals::received();
  return summary;
}

// `keel evaluate`: one evaluation between TRAIN_START and TRAIN_END.
RunSummary evaluate_only(Run& run) {
  if (run.config.checkpointing.init_from.empty())
    spdlog::warn("evaluating freshly initialised weights: set [checkpoint] init_from to a "
                 "checkpoint directory to evaluate trained ones");
  try {
    emit(run, KEEL_EVENT_TRAIN_START);
    evaluate(run);
    emit(run, KEEL_EVENT_TRAIN_END);
  } catch (const std::exception& e) {
    report_failure(run, e);
    throw;
  }
  return run.summary;
}

}  // namespace

RunSummary Trainer::train() {
  log_setup_done();  // a rank N > 0 kept its setup lines off the console (log.hpp)
  Run& run = *run_;
  if (run.config.run.mode == RunMode::kEvaluate) return evaluate_only(run);
  const StopSignals signals;
  try {
    start_training(run);
    decide_end(run, Moment::kStart);
    for (int64_t epoch = run.progress.epoch; !run.end.decided(); ++epoch) {
      start_epoch(run, epoch);
      bool epoch_complete = false;
      while (!run.end.decided()) {
        // Step.
        run.collectives.step_starts(run);
        const std::vector<MicroBatch> batches = fetch_micro_batches(run);
        if (batches.empty() && run.epoch.stopped) {
          // The data stopped while waiting for data (KEEL_BATCH_STOPPED): no step; the run ends
          // after the last one taken, as for a signal received during it. (With micro-batches
          // fetched before it, they make a step, after which the signal stops the run.)
          stop_on_signal(run, run.epoch.stopped, /*waiting=*/true);
          decide_end(run, Moment::kStepEnd);
          break;
        }
        epoch_complete = batches.empty() && run.epoch.missing == 0;
        if (epoch_complete) {
          // A stream's window without a batch is no epoch: the stream ended (decide_end).
          if (run.plan.stream && run.epoch.batches == 0) epoch_complete = false;
          break;
        }
        run.epoch.batches += static_cast<int64_t>(batches.size());
        run.summary.last_loss = train_step(run, batches);
        // Decide, then act: each on its own period, on a hook's request, or at the run's end.
        // The ranks agree on the requests, the signals, the window's times and whether every
        // rank's asynchronous save has finished at once; a finished one is announced then, at
        // the same step on every rank.
        std::vector<double> slowest = window_times(run);
        bool saved = async_save_done(run);
        stop_on_signal(run,
                       run.requests.agree_at_step_end(StopSignals::received(), slowest, saved));
        run.collectives.step_ended(run);
        if (saved) finish_async_save(run, /*block=*/true);
        decide_end(run, Moment::kStepEnd);
        if (record_due(run)) record_train(run, &slowest);
        if (evaluation_due(run, Moment::kStepEnd)) evaluate(run);
        if (save_due(run, Moment::kStepEnd)) save_checkpoint(run);
        decide_end(run, Moment::kStepEnd);  // a stop requested by that evaluation or save
        if (record_due(run)) record_train(run);
        run.requests.clear();
        if (!run.end.decided()) set_lr_for(run, run.progress.step);
      }
      end_epoch(run, epoch_complete);
    }
    finish_training(run);
  } catch (const std::exception& e) {
    report_failure(run, e);
    throw;
  }
  return summary_of(run);
}

Trainer::Trainer(const RunConfig& config, bool validate_only) : run_(std::make_unique<Run>()) {
  // `keel validate` checks one process's view, alone.
  const std::optional<Launch> launch = validate_only ? std::nullopt : detect_launch();
  // What this start creates (rank 0 alone prepares the run directory): removed again when it
  // fails, and after `keel validate`.
  CreatedEntries created;
  run_->directory.created = &created;
  // Files the components created and hold open join the list before they are closed.
  const auto undo = [&] {
    if (run_->directory.dir) created.add_open_files(*run_->directory.dir, run_->directory.before);
    run_.reset();  // closes every file the components opened
    return created.remove_all();
  };
  try {
    assemble(*run_, config, validate_only, launch);
  } catch (const Error& e) {
    const std::string left = undo();
    if (left.empty()) throw;
    throw Error(std::string(e.what()) + " (left behind: " + left + ")");
  } catch (...) {
    undo();
    throw;
  }
  run_->directory.created = nullptr;
  run_->summary.run_dir = run_->directory.path.string();
  if (validate_only) {
    const std::string left = created.remove_all();
    if (!left.empty()) throw Error("validation left files behind in the run directory: " + left);
  }
}

Trainer::~Trainer() = default;

void check_run(const RunConfig& config) { Trainer trainer(config, /*validate_only=*/true); }

}  // namespace keel
