// One evaluation's record, accumulated batch by batch on each rank, summed over the ranks and
// turned into
//   step, epoch, loss, <the loss plugin's task metrics, in its order>, samples
// `loss` is the mean of the loss over the items of every batch and rank (sum of batch loss *
// item count over sum of item counts), `samples` the samples evaluated. The task metrics
// (accuracy, bits_per_token, AUC, ...) are the loss plugin's (abi.h, "Evaluation metrics of a
// loss", ABI 1.6): the kernel keeps their state, sums it over the ranks and records what the
// plugin makes of it; a loss without those slots (an older plugin) reports none.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "components.hpp"
#include "keel/abi.h"
#include "run/model_calls.hpp"

namespace keel {

class EvalMetrics {
 public:
  // Sums `values` elementwise over the ranks and returns the sums; every rank calls it with a
  // vector of the same length (ProcessGroup::sum).
  using SumOverRanks = std::function<std::vector<double>(std::vector<double>)>;

  // No loss: no task metrics (an empty record but for the kernel's keys).
  EvalMetrics() = default;
  // Reads `loss`'s metric_state_size once [setup]. `loss` must outlive this object. Throws
  // keel::Error naming the loss when it offers only some of the three metric slots, or a state
  // larger than KEEL_METRIC_STATE_CAPACITY.
  explicit EvalMetrics(const LossCalls& loss);
  explicit EvalMetrics(const Instance<keel_loss>& loss) : EvalMetrics(LossCalls{&loss, nullptr}) {}

  // Starts an evaluation: every sum and the task state back to zero.
  void begin();
  // Adds one evaluation batch: the model's outputs, the batch, and the mean loss and item count
  // the loss computed for them.
  void update(const Named& outputs, const MicroBatch& mb, double loss, int64_t count);
  // Replaces this rank's sums (and task state) by their sums over all ranks, in one call of
  // `sum`. Without it (one process) the record is this rank's.
  void reduce(const SumOverRanks& sum);
  // The record of the evaluation at `step` and `epoch`. The task metrics' keys point into this
  // object and stay valid until the next finish (or its destruction). Throws keel::Error naming
  // the loss for a metric key it may not use.
  std::vector<keel_metric> finish(int64_t step, int64_t epoch);

  // The mean loss (NaN when no item counted).
  double loss() const;
  // Values in the task state (0 without task metrics).
  size_t state_size() const { return state_.size(); }

 private:
  LossCalls loss_;
  double loss_sum_ = 0, items_ = 0, samples_ = 0;
  std::vector<double> state_;
  std::vector<std::string> keys_;  // the task metrics' keys of the latest finish
};

}  // namespace keel
