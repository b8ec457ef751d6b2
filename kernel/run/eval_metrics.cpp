#include "run/eval_metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <set>
#include <utility>

#include "error.hpp"
#include "keel/tensor.hpp"

namespace keel {
namespace {

// The keys an evaluation record has whatever the loss reports.
constexpr const char* kRecordKeys[] = {"step", "epoch", "loss", "samples"};

bool key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '.' || c == '-';
}

// keel_metric_writer of one metric_finish call: collects the metrics, remembers the first
// refusal (abi.h: keel_metric_writer.put).
struct MetricWriter {
  keel_metric_writer abi{};
  std::vector<std::pair<std::string, double>> metrics;
  std::set<std::string> keys;
  std::string refusal;

  MetricWriter() {
    abi.struct_size = sizeof(abi);
    abi.host_data = this;
    abi.put = &put;
  }
  static int put(keel_metric_writer* w, const char* key, double value) noexcept {
    auto* self = static_cast<MetricWriter*>(w->host_data);
    try {
      return self->add(key, value);
    } catch (const std::exception& e) {
      return self->refuse(std::string("metric could not be kept: ") + e.what());
    }
  }
  int add(const char* key, double value) {
    const size_t n = key ? strnlen(key, KEEL_NAME_CAPACITY) : 0;
    const std::string shown = n ? std::string(key, n) : std::string();
    if (n == 0) return refuse("a metric with a NULL or empty key");
    if (n == KEEL_NAME_CAPACITY)
      return refuse(fmt::format("metric '{}...': the key is longer than {} bytes",
                                shown.substr(0, 40), KEEL_NAME_CAPACITY - 1));
    for (const char c : shown)
      if (!key_char(c))
        return refuse("metric '" + shown + "': a key holds only letters, digits, '_', '.' "
                      "and '-'");
    for (const char* own : kRecordKeys)
      if (shown == own)
        return refuse("metric '" + shown + "': the evaluation record has its own '" + shown +
                      "' (step, epoch, loss and samples are the kernel's)");
    if (!keys.insert(shown).second) return refuse("metric '" + shown + "' was put twice");
    metrics.emplace_back(shown, value);
    return 1;
  }
  int refuse(std::string why) {
    if (refusal.empty()) refusal = std::move(why);
    return 0;
  }
};

}  // namespace

EvalMetrics::EvalMetrics(const Instance<keel_loss>& loss) : loss_(&loss) {
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

void EvalMetrics::update(const at::Tensor& output, const at::Tensor& target, double loss,
                         int64_t count, int64_t samples) {
  loss_sum_ += loss * static_cast<double>(count);
  items_ += static_cast<double>(count);
  samples_ += static_cast<double>(samples);
  if (state_.empty()) return;
  (*loss_).call("metric_update", (*loss_)->metric_update, peek(output), peek(target), loss,
                count, state_.data(), state_.size());
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
    MetricWriter w;
    const Instance<keel_loss>& loss = *loss_;
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
