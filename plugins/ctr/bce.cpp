// loss `bce`: binary cross-entropy with logits, for click-through-rate models (dlrm).
//
// compute: output = logits [B] (or [B, 1]), target = labels [B] (any numeric dtype, converted
// to the output's); the loss is at::binary_cross_entropy_with_logits with reduction mean, count
// (and count_items, no host sync) = B.
//
// Evaluation metrics (abi.h "Evaluation metrics of a loss", ABI 1.6), in this order:
//   auc      the exact area under the ROC curve of the logits against the labels (pairs of
//            a positive and a negative ranked correctly count 1, tied scores count 1/2), over
//            every sample of the evaluation on every rank; left out without a positive or
//            without a negative; NaN when a score is NaN.
//   logloss  the mean over those samples of -[y log p + (1 - y) log(1 - p)], p = sigmoid(logit),
//            computed per sample in float64 from the logit (softplus form) and summed.
// The summed state is {positives, negatives, sum of logloss}: counts and a sum, which the kernel
// adds up over the ranks. AUC is not a sum, so the loss instance itself keeps every (score,
// label) pair of the evaluation (16 bytes per sample, in float64) as metric_update sees them;
// metric_finish gathers the pairs of every rank with keel::Comm::all_gather (world 1 without a
// kernel comm: the rank's own pairs) and computes the AUC by sorting them. The kept pairs are
// cleared when an evaluation starts (metric_update called with a state whose counts are 0: the
// kernel zeroes the state before every evaluation) and after metric_finish.
// Labels must be 0 or 1 in evaluation (one error line otherwise); training accepts soft labels.
#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "components.hpp"
#include "keel/comm.hpp"
#include "keel/plugin.hpp"
#include "keel/tensor.hpp"

namespace keel_ctr {
namespace {

// The exact AUC of `scores` against 0/1 `labels`, ties counting half: sorts by score and walks
// the groups of equal scores, adding for each the pairs of its positives with the negatives
// below it plus half the pairs within it. NaN without a positive or a negative, or with a NaN
// score.
double exact_auc(std::vector<std::pair<double, double>> pairs) {
  double positives = 0, negatives = 0;
  for (const auto& p : pairs) {
    if (std::isnan(p.first)) return std::nan("");
    (p.second > 0.5 ? positives : negatives) += 1;
  }
  if (positives == 0 || negatives == 0) return std::nan("");
  std::sort(pairs.begin(), pairs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  double below = 0, area = 0;  // negatives with a lower score; correctly ranked pairs (x2)
  for (size_t i = 0; i < pairs.size();) {
    size_t j = i;
    double pos = 0, neg = 0;
    for (; j < pairs.size() && pairs[j].first == pairs[i].first; ++j)
      (pairs[j].second > 0.5 ? pos : neg) += 1;
    area += pos * (2 * below + neg);  // twice (pos * below + pos * neg / 2), exact in doubles
    below += neg;
    i = j;
  }
  return area / (2 * positives * negatives);
}

namespace text = keel::text;

class Bce : public keel::Loss {
 public:
  explicit Bce(const keel::Context& ctx) : comm_(ctx.comm()) {}

  at::Tensor compute(const at::Tensor& output, const at::Tensor& target, int64_t* count) override {
    const at::Tensor logits = check(output, target);
    *count = target.numel();
    return at::binary_cross_entropy_with_logits(logits, target.to(logits.scalar_type()));
  }
  int64_t count_items(const at::Tensor& target) override { return target.numel(); }

  size_t metric_state_size() override { return 3; }
  void metric_update(const at::Tensor& output, const at::Tensor& target, double /*loss*/,
                     int64_t /*count*/, keel::MetricState state) override {
    if (state[0] == 0 && state[1] == 0) pairs_.clear();  // the first batch of an evaluation
    const at::Tensor z = check(output, target).detach().to(at::kCPU, at::kDouble).contiguous();
    const at::Tensor y = target.detach().reshape({-1}).to(at::kCPU, at::kDouble).contiguous();
    const double* zs = z.data_ptr<double>();
    const double* ys = y.data_ptr<double>();
    const int64_t n = z.numel();
    double positives = 0, logloss = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (ys[i] != 0 && ys[i] != 1)
        throw std::invalid_argument("bce: evaluation label " + std::to_string(ys[i]) +
                                    " (sample " + std::to_string(i) + " of the batch) is not 0 "
                                    "or 1; hint: AUC needs click labels, check the dataset's "
                                    "targets");
      positives += ys[i];
      // -[y log p + (1 - y) log(1 - p)] = softplus(z) - y z, softplus(z) = max(z, 0) +
      // log1p(exp(-|z|)).
      logloss += std::max(zs[i], 0.0) + std::log1p(std::exp(-std::abs(zs[i]))) - ys[i] * zs[i];
    }
    state[0] += positives;
    state[1] += static_cast<double>(n) - positives;
    state[2] += logloss;
    pairs_.push_back(at::stack({z, y}, 1));
  }
  keel::Metrics metric_finish(const std::vector<double>& state) override {
    at::Tensor local = pairs_.empty() ? at::empty({0, 2}, at::kDouble) : at::cat(pairs_, 0);
    pairs_.clear();
    const keel::Comm comm(comm_);
    const at::Tensor all = comm.all_gather(local).rows.contiguous();
    const double samples = state[0] + state[1];
    if (static_cast<double>(all.size(0)) != samples)
      throw std::runtime_error("bce: the ranks kept " + std::to_string(all.size(0)) +
                               " (score, label) pairs for this evaluation but counted " +
                               std::to_string(static_cast<int64_t>(samples)) +
                               " samples; hint: every evaluation must start with a zeroed "
                               "metric state (abi.h)");
    keel::Metrics out;
    if (samples <= 0) return out;
    std::vector<std::pair<double, double>> pairs(static_cast<size_t>(all.size(0)));
    const double* p = all.data_ptr<double>();
    for (size_t i = 0; i < pairs.size(); ++i) pairs[i] = {p[2 * i], p[2 * i + 1]};
    if (state[0] > 0 && state[1] > 0) out.emplace_back("auc", exact_auc(std::move(pairs)));
    out.emplace_back("logloss", state[2] / samples);
    return out;
  }

 private:
  // The logits as [B] (from [B] or [B, 1]) after checking them against the target [B].
  static at::Tensor check(const at::Tensor& output, const at::Tensor& target) {
    const bool column = output.dim() == 2 && output.size(1) == 1;
    if ((output.dim() != 1 && !column) || target.dim() != 1 || target.size(0) != output.size(0))
      throw std::invalid_argument("bce: model output " + text::shape(output.sizes()) +
                                  " and target " + text::shape(target.sizes()) +
                                  " do not match: expected logits [B] (or [B, 1]) and labels "
                                  "[B]; hint: use a model with one logit per sample (dlrm)");
    if (!output.is_floating_point())
      throw std::invalid_argument("bce: model output is not floating-point logits");
    return column ? output.reshape({-1}) : output;
  }

  const keel_comm* comm_;
  std::vector<at::Tensor> pairs_;  // [b, 2] float64 (score, label) per evaluation batch
};

}  // namespace

keel_component_desc bce_component() {
  return keel::component<Bce>(
      "bce",
      "binary cross-entropy with logits (mean over the batch); evaluation metrics: exact AUC "
      "(every rank's scores gathered and sorted, ties count half) and log loss");
}

}  // namespace keel_ctr
