#include "run/eval_metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include "error.hpp"
#include "keel/tensor.hpp"
#include "run/metric_writer.hpp"

namespace keel {
namespace {

// The keys an evaluation record has whatever the loss reports.
constexpr const char* kRecordKeys[] = {"step", "epoch", "loss", "samples"};

}  // namespace

EvalMetrics::EvalMetrics(const LossCalls& calls) : loss_(calls) {
  const Instance<keel_loss>& loss = *calls.loss;
  const bool size = KEEL_HAS_SLOT(loss, keel_loss, metric_state_size);
  const bool update = KEEL_HAS_SLOT(loss, keel_loss, metric_update);
  const bool finish = KEEL_HAS_SLOT(loss, keel_loss, metric_finish);
  if (!size && !update && !finish) return;
  if (!size || !update || !finish)
    throw loss.error("offers only some of the evaluation-metric slots (metric_state_size " +
                     std::string(size ? "set" : "NULL") + ", metric_update " +
                     (update ? "set" : "NULL") + ", metric_finish " + (finish ? "set" : "NULL") +
                     "); hint: a loss offers all three or none (abi.h, \"Evaluation metrics of "
                     "a loss\")");
  const size_t n = loss.get("metric_state_size", loss->metric_state_size);
  if (n > KEEL_METRIC_STATE_CAPACITY)
    throw loss.error(fmt::format("metric_state_size returned {}; the state of a loss's "
                                 "evaluation metrics holds at most {} doubles "
                                 "(KEEL_METRIC_STATE_CAPACITY)", n, KEEL_METRIC_STATE_CAPACITY));
  state_.assign(n, 0.0);
}

void EvalMetrics::begin() {
  loss_sum_ = items_ = samples_ = 0;
  std::fill(state_.begin(), state_.end(), 0.0);
}

void EvalMetrics::update(const Named& outputs, const MicroBatch& mb, double loss,
                         int64_t count) {
  loss_sum_ += loss * static_cast<double>(count);
  items_ += static_cast<double>(count);
  samples_ += static_cast<double>(mb.samples);
  if (state_.empty()) return;
  metric_update(loss_, outputs, mb, loss, count, state_.data(), state_.size());
}

void EvalMetrics::reduce(const SumOverRanks& sum) {
  std::vector<double> v = {loss_sum_, items_, samples_};
  v.insert(v.end(), state_.begin(), state_.end());
  const std::vector<double> total = sum(std::move(v));
  if (total.size() != 3 + state_.size())
    throw Error(fmt::format("evaluation: the sum over ranks has {} values, expected {}",
                            total.size(), 3 + state_.size()));
  loss_sum_ = total[0];
  items_ = total[1];
  samples_ = total[2];
  std::copy(total.begin() + 3, total.end(), state_.begin());
}

double EvalMetrics::loss() const { return items_ > 0 ? loss_sum_ / items_ : NAN; }

std::vector<keel_metric> EvalMetrics::finish(int64_t step, int64_t epoch) {
  std::vector<keel_metric> record = {{"step", static_cast<double>(step)},
                                     {"epoch", static_cast<double>(epoch)},
                                     {"loss", loss()}};
  keys_.clear();
  if (!state_.empty()) {
    MetricWriter w({std::begin(kRecordKeys), std::end(kRecordKeys)}, "the evaluation record",
                   " (step, epoch, loss and samples are the kernel's)");
    const Instance<keel_loss>& loss = *loss_.loss;
    try {
      loss.call("metric_finish", loss->metric_finish, state_.data(), state_.size(), &w.abi);
    } catch (const Error&) {
      if (w.refusal.empty()) throw;
      throw loss.error("metric_finish failed: " + w.refusal);
    }
    if (!w.refusal.empty()) throw loss.error("metric_finish: " + w.refusal);
    keys_.reserve(w.metrics.size());
    for (const auto& kv : w.metrics) keys_.push_back(kv.first);
    for (size_t i = 0; i < keys_.size(); ++i)
      record.push_back({keys_[i].c_str(), w.metrics[i].second});
  }
  record.push_back({"samples", samples_});
  return record;
}

}  // namespace keel
