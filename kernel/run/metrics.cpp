#include "run/metrics.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include <spdlog/spdlog.h>

#include "run/events.hpp"
#include "run/run.hpp"
#include "run/tables.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

// Seconds of the window as the slowest rank saw them (window_times' order).
struct WindowTimes {
  double train_s, data_s, eval_s, checkpoint_s;
};

// `slowest`: agreed at the step's end; without it, with several ranks, one all-reduce here.
WindowTimes slowest_times(Run& run, const std::vector<double>* slowest) {
  std::vector<double> v = slowest ? *slowest : window_times(run);
  if (!slowest && run.ranks.group) v = run.ranks.group->max(v, "reducing step times");
  return {v.at(0), v.at(1), v.at(2), v.at(3)};
}

// The mfu's value for `samples_per_s` (of all ranks), and its peak. A value above 1 (more than
// the peak: the peak is too low, e.g. measured while other processes ran) is left out of the
// record, with one warning in the run.
void add_mfu(Run& run, double samples_per_s, std::vector<keel_metric>& record) {
  const Instance<keel_mfu>& mfu = run.components.mfu;
  if (!mfu) return;
  // Per device: the samples of all ranks over the devices of all ranks.
  const double v =
      mfu.get("compute", mfu->compute, run.plan.flops_per_sample, samples_per_s / run.ranks.world);
  if (!std::isfinite(v) || v < 0)
    throw mfu.error("compute returned " + text::number(v) +
                    "; an mfu must be a finite value >= 0 (a fraction of the peak)");
  if (v <= 1) {
    record.push_back({"mfu", v});
  } else if (!run.records.mfu_above_one && run.ranks.rank == 0) {
    const std::string type = run.config.mfu ? run.config.mfu->component->name : "";
    spdlog::warn(
        "{}: mfu {} at step {} is above 1, so the peak it divides by{} is too low; mfu is left "
        "out of the records while above 1; hint: give [mfu] the right peak (keel plugins show "
        "{}; keel-mfu: peak_tflops, or --set mfu.recalibrate=true to measure it again on an "
        "idle machine)",
        mfu.label(), text::number(v), run.progress.step,
        run.plan.mfu_peak > 0 ? " (" + text::number(run.plan.mfu_peak / 1e12) + " TFLOP/s)" : "",
        type);
  }
  if (v > 1) run.records.mfu_above_one = true;
  if (run.plan.mfu_peak > 0) record.push_back({"mfu_peak_tflops", run.plan.mfu_peak / 1e12});
}

}  // namespace

std::vector<double> window_times(const Run& run) {
  const Window& w = run.window;
  return {std::chrono::duration<double>(Clock::now() - w.start).count() - w.eval_s -
              w.checkpoint_s,
          w.data_s, w.eval_s, w.checkpoint_s};
}

bool record_due(const Run& run) {
  const bool unrecorded =
      run.window.steps > 0 && run.records.last_train_step != run.progress.step;
  return unrecorded && (run.progress.step % run.config.train.log_every == 0 || run.end.decided());
}

void record_train(Run& run, const std::vector<double>* slowest) {
  const keel_trainer_state& p = run.progress;
  const Window& w = run.window;
  const WindowTimes t = slowest_times(run, slowest);
  const double sps = w.samples / std::max(t.train_s, 1e-9);
  const double steps = std::max<int64_t>(w.steps, 1);
  std::vector<keel_metric>& record = run.records.train;
  record = {
      {"step", double(p.step)},
      {"epoch", double(p.epoch)},
      {"samples", double(p.samples)},
      {"tokens", double(p.tokens)},
      {"loss", w.loss / steps},
      {"loss_last", p.loss},
      {"lr", p.lr},
      {"samples_per_s", sps},
      {"tokens_per_s", w.tokens / std::max(t.train_s, 1e-9)},
      {"step_time_ms", 1e3 * t.train_s / steps},
      {"data_time_ms", 1e3 * t.data_s / steps},
  };
  if (!run.components.eval_sets.empty()) record.push_back({"eval_time_s", t.eval_s});
  if (run.components.store) record.push_back({"checkpoint_time_s", t.checkpoint_s});
  if (run.components.clipper) {
    record.push_back({"grad_norm", w.norms ? w.grad_norm / w.norms : NAN});
    record.push_back({"grad_norm_last", p.grad_norm});
  }
  if (run.config.train.nonfinite == NonFinite::kSkip || run.plan.scaler)
    record.push_back({"skipped_steps", double(p.skipped_steps)});
  if (run.plan.scaler) record.push_back({"loss_scale", run.plan.scaler->scale()});
  add_mfu(run, sps, record);
  add_table_metrics(run.sparse, run.ranks.group.get(), record);
  if (run.residency) {  // shard = "parameters": this rank's peaks over the window
    const auto [outside, resident] = run.residency->take_peaks();
    record.push_back({"param_mb_outside_unit", outside});
    record.push_back({"param_mb_resident", resident});
  }
  if (!run.components.observers.empty()) {  // hooks' own (keel.hook.observe/1)
    MetricList all;
    for (const keel_metric& m : record) all.emplace_back(m.key, m.value);
    run.components.observers.metrics("train", all);
    for (size_t i = record.size(); i < all.size(); ++i)
      record.push_back({run.records.hook_keys.insert(all[i].first).first->c_str(), all[i].second});
  }
  run.progress.train_metrics = record.data();
  run.progress.train_metric_count = record.size();
  emit(run, KEEL_EVENT_METRICS, "train", &record);
  run.records.last_train_step = p.step;
  // The window restarts at log_every boundaries only. A record between them is the last one
  // of a run that ends (a stop, a stop target, the final epoch): its sums stay, so that a run
  // resumed from the checkpoint saved after it reports the same window at the boundary as a
  // run that never stopped.
  if (p.step % run.config.train.log_every == 0) run.window = Window();
}

}  // namespace keel
