// Hooks that steer the run. early_stopping: asks the kernel to stop when a metric of one split
// has not improved for more than `patience` evaluations in a row.
//
// Its state (best value, the step it was seen at, evaluations without improvement) lives in
// tensors published through named_state(): the kernel saves them with every checkpoint and
// loads them back in place, and the hook always reads the tensors, so a resumed run continues
// counting where the checkpoint left off.
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "components.hpp"
#include "keel/plugin.hpp"

namespace {

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kMetric = keel::opt_string(
    "metric", "\"loss\"", "key of the metric record to watch");
constexpr auto kSplit = keel::opt_string(
    "split", "\"test\"",
    "split whose METRICS records are watched: test, or NAME of a [data.eval.NAME] set");
constexpr auto kMode = keel::opt_string(
    "mode", "\"min\"", "whether lower or higher values are better", "min|max");
constexpr auto kPatience = keel::opt_int(
    "patience", "3", "evaluations without improvement tolerated before stopping", 0, 1e12);
constexpr auto kMinDelta = keel::opt_float(
    "min_delta", "0.0", "smallest change that counts as an improvement", 0, keel::kInf);

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

class EarlyStopping : public keel::Hook {
 public:
  explicit EarlyStopping(const keel::Context& ctx)
      : log_(ctx),
        metric_(ctx.get(kMetric)),
        split_(ctx.get(kSplit)),
        maximize_(ctx.get(kMode) == "max"),
        patience_(ctx.get(kPatience)),
        min_delta_(ctx.get(kMinDelta)),
        best_(at::full({}, maximize_ ? -keel::kInf : keel::kInf, at::kDouble)),
        best_step_(at::full({}, -1, at::kLong)),
        bad_evals_(at::zeros({}, at::kLong)) {}

  keel::NamedTensors named_state() override {
    return {{"best", best_}, {"best_step", best_step_}, {"bad_evals", bad_evals_}};
  }

  void on_event(keel_event& ev) override {
    check_split_recorded(ev);
    if (ev.kind != KEEL_EVENT_METRICS || ev.split == nullptr || split_ != ev.split) return;
    const double value = lookup(ev);
    if (improves(value)) {
      best_.fill_(value);
      best_step_.fill_(ev.state ? ev.state->step : 0);
      bad_evals_.fill_(0);
      return;
    }
    const int64_t bad = bad_evals_.item<int64_t>() + 1;
    bad_evals_.fill_(bad);
    if (bad <= patience_) return;
    ev.requests |= KEEL_REQUEST_STOP;
    const std::string why =
        "stopping: " + split_ + " " + metric_ + " has not improved on " +
        number(best_.item<double>()) + " (step " + std::to_string(best_step_.item<int64_t>()) +
        ") for " + std::to_string(bad) + (bad == 1 ? " evaluation" : " evaluations") +
        " (patience " + std::to_string(patience_) + ", min_delta " + number(min_delta_) + ")";
    log_(KEEL_LOG_INFO, why);
  }

 private:
  double lookup(const keel_event& ev) const {
    std::string keys;
    for (size_t i = 0; i < ev.metric_count; ++i) {
      if (metric_ == ev.metrics[i].key) return ev.metrics[i].value;
      keys += (i ? ", " : "") + std::string(ev.metrics[i].key);
    }
    throw std::runtime_error("metric '" + metric_ + "' is not in the '" + split_ +
                             "' record (it has: " + keys + "); hint: set metric to one of these");
  }

  // A split that no evaluation set of the run has would never stop the run: refused at the
  // first event after an evaluation (its EVAL_START, EVAL_END and METRICS of each set, in a row)
  // whose sets did not include it, naming the ones it had. ("train" records come every
  // log_every steps, not from evaluations.)
  void check_split_recorded(const keel_event& ev) {
    if (split_ == "train") return;
    if (ev.kind == KEEL_EVENT_EVAL_START) {
      if (!evaluating_) evaluated_.clear();
      evaluating_ = true;
      evaluated_.emplace_back(ev.split ? ev.split : "");
      return;
    }
    if (!evaluating_ || ev.kind == KEEL_EVENT_EVAL_END || ev.kind == KEEL_EVENT_METRICS ||
        ev.kind == KEEL_EVENT_EXCEPTION)  // the run is failing already: its error stands
      return;
    evaluating_ = false;
    std::string sets;
    for (const std::string& name : evaluated_) {
      if (name == split_) return;
      sets += (sets.empty() ? "'" : ", '") + name + "'";
    }
    throw std::runtime_error("split '" + split_ + "' has no records: the run's evaluations "
                             "record " + sets + "; hint: set split to one of these, or \"train\"");
  }

  // A NaN never improves; the first finite value always does (best starts at -+infinity).
  bool improves(double value) const {
    const double best = best_.item<double>();
    return maximize_ ? value > best + min_delta_ : value < best - min_delta_;
  }

  keel::Logger log_;
  std::string metric_, split_;
  bool maximize_;
  int64_t patience_;
  double min_delta_;
  at::Tensor best_, best_step_, bad_evals_;
  bool evaluating_ = false;             // between an evaluation's first EVAL_START and its end
  std::vector<std::string> evaluated_;  // the splits of the latest evaluation
};

const keel_option_desc kEarlyStoppingOptions[] = {kMetric, kSplit, kMode, kPatience, kMinDelta};

}  // namespace

keel_component_desc keel_hooks::early_stopping_component() {
  return keel::component<EarlyStopping>("early_stopping",
                                        "stops the run when a metric stops improving",
                                        kEarlyStoppingOptions);
}
