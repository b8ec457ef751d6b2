// The training loop. Read Trainer::train first: it steps, then walks the decision table
// (run/decisions.cpp: the train records, evaluations and checkpoints, each row owning its period,
// and the one decision that the run is over) after each step and at each epoch's end; the ranks
// agree on hooks' requests underneath (run/requests.hpp).
#include "run/trainer.hpp"

#include <c10/util/Exception.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "log.hpp"
#include "run/agreement.hpp"
#include "run/assemble.hpp"
#include "run/checkpointing.hpp"
#include "run/decisions.hpp"
#include "run/evaluate.hpp"
#include "run/events.hpp"
#include "run/fetch.hpp"
#include "run/metrics.hpp"
#include "run/resume.hpp"
#include "run/run.hpp"
#include "run/signals.hpp"
#include "run/step.hpp"

namespace keel {

namespace {

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

// TRAIN_START, and the initial checkpoint of a fresh run; the log window starts.
void start_training(Run& run) {
  run.components.model.run("set_training", run.components.model->set_training, 1);
  set_lr_for(run, run.progress.step);
  emit(run, KEEL_EVENT_TRAIN_START);
  walk_decisions(run, {Moment::kStart});  // the initial checkpoint; a resumed run at its end
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
  walk_decisions(run, {Moment::kEpochOver});  // the final epoch's last, partial window
  if (complete) {
    emit(run, KEEL_EVENT_EPOCH_END);
    run.epoch.finished = true;  // a checkpoint from here on starts the next epoch
  }
  walk_decisions(run, {Moment::kEpochEnd, complete});
}

// The at_end checkpoint, the last asynchronous save, TRAIN_END; then every rank leaves together
// (none takes the store it may serve with it while another still needs it). Logs why the run
// ended, as one line "run finished at step N: <reason>" (`keel report` reads that prefix).
void finish_training(Run& run) {
  walk_decisions(run, {Moment::kFinish});  // the at_end checkpoint, the last asynchronous save
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
        run.summary.last_loss = train_step(run, micro_batches(run, batches));
        // Decide, then act: each row of the decision table on its own period, on a hook's
        // request, or at the run's end. The ranks agree first on the requests, the signals, the
        // window's times and whether every rank's asynchronous save has finished.
        std::vector<double> slowest = window_times(run);
        bool saved = async_save_done(run);
        stop_on_signal(run,
                       run.requests.agree_at_step_end(StopSignals::received(), slowest, saved));
        run.collectives.step_ended(run);
        walk_decisions(run, {Moment::kStepEnd, false, saved, &slowest});
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
