// Evaluation metrics of a loss (abi.h, "Evaluation metrics of a loss", ABI 1.6) through the
// kernel's EvalMetrics (kernel/run/eval_metrics.hpp): an AUC written against the SDK (state: a
// histogram of positive and negative scores) summed over two simulated ranks equals the AUC of
// all their samples; the first-party losses' accuracy and bits_per_token; a loss of ABI 1.5
// reports no task metrics; the keys and slots the kernel refuses, naming the loss.
#include <ATen/Context.h>
#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/floor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "components.hpp"
#include "host.hpp"
#include "keel/plugin.hpp"
#include "options.hpp"
#include "run/eval_metrics.hpp"
#include "support.hpp"

namespace unit_eval_metrics {  // keel_units is one unity build: each file's names stay its own

namespace {

// Binary cross-entropy on logits, with the AUC of the predicted probabilities as its metric:
// state {positives[B], negatives[B]}, bucket min(B - 1, floor(p * B)) of each sample's p.
constexpr int64_t kBuckets = 1000;

class AucLoss : public keel::Loss {
 public:
  explicit AucLoss(const keel::Context&) {}
  at::Tensor compute(const at::Tensor& output, const at::Tensor& target, int64_t* count) override {
    *count = target.numel();
    return at::binary_cross_entropy_with_logits(output, target);
  }
  size_t metric_state_size() override { return 2 * kBuckets; }
  void metric_update(const at::Tensor& output, const at::Tensor& target, double, int64_t,
                     keel::MetricState state) override {
    const at::Tensor p = at::sigmoid(output.to(at::kDouble));
    const at::Tensor bucket = at::floor(p * kBuckets).clamp(0, kBuckets - 1).to(at::kLong);
    const at::Tensor positive = target.flatten().gt(0.5);
    add(bucket.flatten().masked_select(positive), state, 0);
    add(bucket.flatten().masked_select(positive.logical_not()), state, kBuckets);
  }
  // From the highest bucket down: each positive beats every negative in a lower bucket and ties
  // (counts half) with those in its own.
  keel::Metrics metric_finish(const std::vector<double>& state) override {
    double positives = 0, negatives = 0;
    for (int64_t b = 0; b < kBuckets; ++b) {
      positives += state[b];
      negatives += state[kBuckets + b];
    }
    if (positives == 0 || negatives == 0) return {};
    double below = negatives, area = 0;  // below: negatives in the buckets under bucket b
    for (int64_t b = kBuckets - 1; b >= 0; --b) {
      below -= state[kBuckets + b];
      area += state[b] * (below + 0.5 * state[kBuckets + b]);
    }
    return {{"auc", area / (positives * negatives)}};
  }

 private:
  static void add(const at::Tensor& buckets, keel::MetricState state, int64_t offset) {
    const at::Tensor counts = at::bincount(buckets, {}, kBuckets).to(at::kDouble).contiguous();
    const double* c = counts.data_ptr<double>();
    for (int64_t b = 0; b < kBuckets; ++b) state[offset + b] += c[b];
  }
};

// A loss whose metric_finish puts the keys `Keys` names (a case of the refusals below).
template <int Keys>
class KeysLoss : public keel::Loss {
 public:
  explicit KeysLoss(const keel::Context&) {}
  at::Tensor compute(const at::Tensor& output, const at::Tensor&, int64_t* count) override {
    *count = 1;
    return output.sum();
  }
  size_t metric_state_size() override { return Keys == 4 ? KEEL_METRIC_STATE_CAPACITY + 1 : 1; }
  void metric_update(const at::Tensor&, const at::Tensor&, double, int64_t,
                     keel::MetricState state) override {
    state[0] += 1;
  }
  keel::Metrics metric_finish(const std::vector<double>& state) override {
    switch (Keys) {
      case 0: return {{"batches", state[0]}, {"loss", 1.0}};
      case 1: return {{"top1", 0.5}, {"top1", 0.6}};
      case 2: return {{"top 1", 0.5}};
      default: return {{"batches", state[0]}};
    }
  }
};

// The instance of component `desc`, and a first-party loss (tests/unit/support.hpp).
keel::Instance<keel_loss> make(const keel_component_desc& desc) {
  return keel_test::instance<keel_loss>(desc, "loss", "loss");
}
keel::Instance<keel_loss> first_party(const std::string& type, const std::string& options,
                                      keel_options& values) {
  return keel_test::first_party<keel_loss>(KEEL_KIND_LOSS, type, "loss", options, values);
}

double value(const std::vector<keel_metric>& record, const char* key) {
  for (const keel_metric& m : record)
    if (std::strcmp(m.key, key) == 0) return m.value;
  return NAN;
}

std::vector<std::string> keys(const std::vector<keel_metric>& record) {
  std::vector<std::string> out;
  for (const keel_metric& m : record) out.emplace_back(m.key);
  return out;
}

// One evaluation batch through `metrics`, its loss computed by `loss`'s compute as the kernel
// computes it.
void evaluate_batch(keel::EvalMetrics& metrics, const keel::Instance<keel_loss>& loss,
                    const at::Tensor& output, const at::Tensor& target) {
  keel_tensor* l = nullptr;
  int64_t count = 0;
  loss.call("compute", loss->compute, keel::peek(output), keel::peek(target), &l, &count);
  keel::MicroBatch mb;
  mb.tensors = {{"inputs", output}, {"targets", target}};
  mb.samples = output.size(0);
  metrics.update({{"logits", output}}, mb, keel::adopt(l).item<double>(), count);
}

// The AUC of `scores` for `labels` over every (positive, negative) pair, a tie counting half.
double pairwise_auc(const std::vector<double>& scores, const std::vector<int>& labels) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i)
    for (size_t j = 0; j < scores.size(); ++j)
      if (labels[i] == 1 && labels[j] == 0) {
        pairs += 1;
        wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
      }
  return wins / pairs;
}

}  // namespace

TEST_CASE("eval metrics: an AUC summed over two ranks is the AUC of all their samples") {
  const keel_component_desc desc = keel::component<AucLoss>("auc_bce", "BCE with its AUC");
  const keel::Instance<keel_loss> loss = make(desc);
  // Scores on bucket centres (p = (k + 0.5) / B), so that the buckets are exact: two samples
  // share a bucket only when they have the same score, a tie either way.
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> bucket(0, kBuckets - 1);
  std::vector<double> all_p;
  std::vector<int> all_y;
  keel::EvalMetrics ranks[2] = {keel::EvalMetrics(loss), keel::EvalMetrics(loss)};
  double bce_sum = 0;
  for (auto& r : ranks) {
    r.begin();
    for (int batch = 0; batch < 3; ++batch) {
      std::vector<double> logits;
      std::vector<float> targets;
      for (int i = 0; i < 50; ++i) {
        const int k = i % 7 == 0 ? 500 : bucket(gen);  // some ties on purpose
        const double p = (k + 0.5) / kBuckets;
        const int y = std::uniform_real_distribution<double>(0, 1)(gen) < p ? 1 : 0;
        logits.push_back(std::log(p / (1 - p)));
        targets.push_back(static_cast<float>(y));
        all_p.push_back(p);
        all_y.push_back(y);
      }
      const at::Tensor out = at::tensor(logits, at::kDouble);
      const at::Tensor tgt = at::tensor(targets, at::kFloat).to(at::kDouble);
      bce_sum += at::binary_cross_entropy_with_logits(out, tgt).item<double>() * 50;
      evaluate_batch(r, loss, out, tgt);
    }
  }
  CHECK(ranks[0].state_size() == 2 * kBuckets);
  // The all-reduce, by hand: rank 1's sums join rank 0's.
  std::vector<double> rank1;
  ranks[1].reduce([&](std::vector<double> v) {
    rank1 = v;
    return v;
  });
  ranks[0].reduce([&](std::vector<double> v) {
    REQUIRE(v.size() == rank1.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] += rank1[i];
    return v;
  });
  const std::vector<keel_metric> record = ranks[0].finish(7, 1);
  CHECK(keys(record) == std::vector<std::string>{"step", "epoch", "loss", "auc", "samples"});
  CHECK(value(record, "step") == 7);
  CHECK(value(record, "epoch") == 1);
  CHECK(value(record, "samples") == 300);
  CHECK(value(record, "loss") == doctest::Approx(bce_sum / 300).epsilon(1e-12));
  const double exact = pairwise_auc(all_p, all_y);
  CHECK(exact > 0.6);  // the labels follow the scores: a meaningful AUC
  CHECK(value(record, "auc") == doctest::Approx(exact).epsilon(1e-12));
  // Another evaluation starts from zero: one batch of a single class defines no AUC.
  ranks[0].begin();
  evaluate_batch(ranks[0], loss, at::zeros({4}, at::kDouble), at::ones({4}, at::kDouble));
  CHECK(keys(ranks[0].finish(8, 1)) ==
        std::vector<std::string>{"step", "epoch", "loss", "samples"});
}

TEST_CASE("eval metrics: a loss of ABI 1.5 (struct without the metric slots) reports none") {
  const keel_component_desc desc = keel::component<AucLoss>("auc_bce", "BCE with its AUC");
  keel::Instance<keel_loss> loss = make(desc);
  loss->struct_size = offsetof(keel_loss, metric_state_size);  // as a 1.5 plugin declares it
  keel::EvalMetrics metrics(loss);
  CHECK(metrics.state_size() == 0);
  metrics.begin();
  evaluate_batch(metrics, loss, at::zeros({4}, at::kDouble), at::ones({4}, at::kDouble));
  const std::vector<keel_metric> record = metrics.finish(3, 0);
  CHECK(keys(record) == std::vector<std::string>{"step", "epoch", "loss", "samples"});
  CHECK(value(record, "loss") == doctest::Approx(std::log(2.0)).epsilon(1e-12));
}

TEST_CASE("eval metrics: cross_entropy's accuracy, the token losses' bits_per_token") {
  keel_options values;
  {
    const keel::Instance<keel_loss> ce = first_party("cross_entropy", "", values);
    keel::EvalMetrics m(ce);
    m.begin();
    // argmax per row: 0, 1, 2, 0; targets 0, 1, 1, 0: 3 of 4.
    const at::Tensor logits =
        at::tensor(std::vector<double>{3, 1, 0, 0, 2, 1, 0, 1, 5, 9, 1, 1}).reshape({4, 3});
    evaluate_batch(m, ce, logits, at::tensor(std::vector<int64_t>{0, 1, 1, 0}));
    // Class probabilities add nothing to the accuracy.
    evaluate_batch(m, ce, logits, at::full({4, 3}, 1.0 / 3, at::kDouble));
    const std::vector<keel_metric> r = m.finish(1, 0);
    CHECK(keys(r) == std::vector<std::string>{"step", "epoch", "loss", "accuracy", "samples"});
    CHECK(value(r, "accuracy") == 0.75);
  }
  {
    // Classes last, padding ignored: 3 targets count, 2 of them right.
    const keel::Instance<keel_loss> ce =
        first_party("cross_entropy", "class_dim = -1\nignore_index = -100", values);
    keel::EvalMetrics m(ce);
    m.begin();
    const at::Tensor logits =
        at::tensor(std::vector<double>{5, 0, 0, 0, 5, 0, 0, 0, 5, 5, 0, 0}).reshape({2, 2, 3});
    evaluate_batch(m, ce, logits,
                   at::tensor(std::vector<int64_t>{0, -100, 2, 1}).reshape({2, 2}));
    CHECK(value(m.finish(1, 0), "accuracy") == doctest::Approx(2.0 / 3));
  }
  {
    // Probabilities only: no accuracy at all.
    const keel::Instance<keel_loss> ce = first_party("cross_entropy", "", values);
    keel::EvalMetrics m(ce);
    m.begin();
    evaluate_batch(m, ce, at::zeros({2, 3}), at::full({2, 3}, 1.0 / 3));
    CHECK(keys(m.finish(1, 0)) == std::vector<std::string>{"step", "epoch", "loss", "samples"});
  }
  for (const std::string type : {"token_cross_entropy", "chunked_cross_entropy"}) {
    CAPTURE(type);
    const keel::Instance<keel_loss> lm = first_party(type, "", values);
    keel::EvalMetrics m(lm);
    m.begin();
    at::manual_seed(3);
    for (int batch = 0; batch < 2; ++batch)
      evaluate_batch(m, lm, at::randn({2, 3, 5}), at::randint(5, {2, 3}, at::kLong));
    const std::vector<keel_metric> r = m.finish(1, 0);
    CHECK(keys(r) ==
          std::vector<std::string>{"step", "epoch", "loss", "bits_per_token", "samples"});
    CHECK(std::fabs(value(r, "bits_per_token") - value(r, "loss") / std::log(2.0)) < 1e-12);
  }
}

TEST_CASE("eval metrics: keys and slots the kernel refuses, naming the loss") {
  const auto finish_error = [](const keel_component_desc& desc) {
    const keel::Instance<keel_loss> loss = make(desc);
    keel::EvalMetrics m(loss);
    m.begin();
    evaluate_batch(m, loss, at::ones({2}), at::ones({2}));
    return keel_test::error_of([&] { m.finish(1, 0); });
  };
  CHECK(finish_error(keel::component<KeysLoss<0>>("keys0", "")) ==
        "[loss] loss 'keys0' (test): metric_finish failed: metric 'loss': the evaluation record "
        "has its own 'loss' (step, epoch, loss and samples are the kernel's)");
  CHECK(finish_error(keel::component<KeysLoss<1>>("keys1", "")) ==
        "[loss] loss 'keys1' (test): metric_finish failed: metric 'top1' was put twice");
  CHECK(finish_error(keel::component<KeysLoss<2>>("keys2", "")) ==
        "[loss] loss 'keys2' (test): metric_finish failed: metric 'top 1': a key holds only "
        "letters, digits, '_', '.' and '-'");
  CHECK(finish_error(keel::component<KeysLoss<3>>("keys3", "")) == "<no error>");

  const keel::Instance<keel_loss> big = make(keel::component<KeysLoss<4>>("keys4", ""));
  CHECK(keel_test::error_of([&] { keel::EvalMetrics m(big); }) ==
        "[loss] loss 'keys4' (test): metric_state_size returned 1048577; the state of a loss's "
        "evaluation metrics holds at most 1048576 doubles (KEEL_METRIC_STATE_CAPACITY)");
  keel::Instance<keel_loss> partial = make(keel::component<KeysLoss<3>>("keys3", ""));
  partial->metric_update = nullptr;
  CHECK(keel_test::error_of([&] { keel::EvalMetrics m(partial); }) ==
        "[loss] loss 'keys3' (test): offers only some of the evaluation-metric slots "
        "(metric_state_size set, metric_update NULL, metric_finish set); hint: a loss offers all "
        "three or none (abi.h, \"Evaluation metrics of a loss\")");
}

}  // namespace unit_eval_metrics
