// Batches of named tensors (keel/ext/batch.h, kernel/run/model_calls.cpp) with the fixture
// plugin test-named (tests/fixtures/named_batch.cpp: dataset weighted_points, model affine, loss
// weighted_mse, all three through their extensions): a run with 2 micro-batches per step
// trains as the same computation written here directly with LibTorch's ATen operations
// (the per-step losses and the evaluation's loss and metric within 1e-6 relative); bad batches
// and names a plugin needs but the batch lacks stop the run with one error naming the plugin and
// the tensor; 1.x models and losses read the conventional names. Components written with the
// SDK's named methods alone offer the extensions, and their 1.x slots (which a kernel that
// predates the extensions calls) give the same tensors through the conventional names.
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <string>
#include <vector>

#include "keel/plugin.hpp"
#include "run/model_calls.hpp"
#include "support.hpp"

namespace unit_named_batches {

using keel_test::TempDir;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int64_t kBatch = 4, kAccum = 2, kTrainCount = 64, kEvalCount = 16;
constexpr double kLr = 0.05;

std::string manifest(const fs::path& run_dir, const std::string& extra = "",
                     const std::string& model = "") {
  return "[run]\nname = \"named\"\noutput_dir = \"" + run_dir.string() +
         "\"\nseed = 3\n"
         "[train]\nepochs = 1\nlog_every = 1\ngrad_accum = " + std::to_string(kAccum) + "\n"
         "[model]\ntype = \"affine\"\n" + model +
         "[data.train]\ntype = \"weighted_points\"\ncount = " + std::to_string(kTrainCount) +
         "\nbatch_size = " + std::to_string(kBatch) + "\n"
         "[data.test]\ntype = \"weighted_points\"\noffset = " + std::to_string(kTrainCount) +
         "\ncount = " + std::to_string(kEvalCount) + "\nbatch_size = 8\n"
         "[optimizer]\ntype = \"sgd\"\nlr = " + std::to_string(kLr) + "\n"
         "[loss]\ntype = \"weighted_mse\"\n"
         "[plugins]\npaths = [\"" KEEL_FIXTURE_DIR "\"]\n"
         "[[hooks]]\ntype = \"jsonl\"\n" + extra;
}

// The fixture's samples [first, first + n), as its header comment defines them.
struct Samples {
  at::Tensor features, label, weight;
};
Samples samples(int64_t first, int64_t n) {
  const at::Tensor i = at::arange(first, first + n, at::kDouble);
  const at::Tensor j = at::arange(1, 5, at::kDouble);
  Samples s;
  s.features = at::sin(0.1 * (4 * i.unsqueeze(1) + j)).to(at::kFloat);
  s.label =
      (0.5 * s.features.to(at::kDouble).sum(1, true) + at::cos(i).unsqueeze(1)).to(at::kFloat);
  s.weight = (1 + at::arange(first, first + n, at::kLong) % 3).to(at::kFloat);
  return s;
}

at::Tensor weighted_mse(const at::Tensor& w, const at::Tensor& b, const Samples& s) {
  const at::Tensor d = at::matmul(s.features, w.t()) + b - s.label;
  return (s.weight * (d * d).squeeze(1)).mean();
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b)); }

}  // namespace

// Trains the fixture (its model with auxiliary loss weight `aux`) and checks it against the same
// computation written with ATen: two micro-batches per step, each loss (the weighted mse plus
// aux * sum(w^2), the model's "aux_loss.l2") weighted by its share of the step's items (4 of
// 8), then SGD; the evaluation's loss is the weighted mse alone.
void trains_as_reference(double aux) {
  TempDir d;
  keel_test::train(d.write("m.toml", manifest(d.path / "run", "",
                                              "aux = " + std::to_string(aux) + "\n")));

  at::Tensor w = at::tensor({0.3f, -0.2f, 0.1f, 0.05f}).reshape({1, 4}).requires_grad_();
  at::Tensor b = at::tensor({0.02f}).requires_grad_();
  std::vector<double> losses;
  const int64_t steps = kTrainCount / (kBatch * kAccum);
  for (int64_t step = 0; step < steps; ++step) {
    double step_loss = 0;
    for (int64_t m = 0; m < kAccum; ++m) {
      const at::Tensor l =
          (weighted_mse(w, b, samples((step * kAccum + m) * kBatch, kBatch)) + (w * w).sum() * aux) *
          (1.0 / static_cast<double>(kAccum));
      step_loss += l.item<double>();
      l.backward();
    }
    losses.push_back(step_loss);
    const at::NoGradGuard no_grad;
    w.sub_(w.grad() * kLr);
    b.sub_(b.grad() * kLr);
    w.mutable_grad().zero_();
    b.mutable_grad().zero_();
  }
  const at::NoGradGuard no_grad;
  double eval_loss = 0, abs_error = 0, weights = 0;
  for (int64_t first = kTrainCount; first < kTrainCount + kEvalCount; first += 8) {
    const Samples s = samples(first, 8);
    eval_loss += weighted_mse(w, b, s).item<double>() / 2;  // two batches of 8 items
    const at::Tensor diff = (at::matmul(s.features, w.t()) + b - s.label).squeeze(1);
    abs_error += (s.weight * at::abs(diff)).sum().item<double>();
    weights += s.weight.sum().item<double>();
  }

  std::vector<double> keel_losses;
  int evals = 0;
  for (const json& r : keel_test::jsonl(d.path / "run" / "metrics.jsonl")) {
    CAPTURE(r.dump());
    if (r["split"] == "train") {
      keel_losses.push_back(r["loss"].get<double>());
      // samples so far: each step's two micro-batches of 4
      CHECK(r["samples"].get<double>() == r["step"].get<double>() * kBatch * kAccum);
    } else {
      ++evals;
      CHECK(close(r["loss"].get<double>(), eval_loss));
      CHECK(close(r["weighted_abs_error"].get<double>(), abs_error / weights));
      CHECK(r["samples"].get<double>() == static_cast<double>(kEvalCount));
    }
  }
  CHECK(evals == 1);
  REQUIRE(keel_losses.size() == losses.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    CAPTURE(i);
    CHECK(close(keel_losses[i], losses[i]));
  }
  CHECK(keel_losses.back() < keel_losses.front());  // it learns: the reference is not trivial
}

TEST_CASE("named batches train as the same computation written with LibTorch") {
  trains_as_reference(0);
}

TEST_CASE("a model's aux_loss outputs are added to the training loss, not to evaluation's") {
  trains_as_reference(0.5);
}

TEST_CASE("a bad named batch, or a name a plugin needs and the batch lacks, stops the run") {
  struct Case {
    const char* sets;  // --set arguments, ';'-separated
    std::vector<const char*> parts;  // what the one error line holds
  };
  const Case cases[] = {
      {"data.train.bad=\"mismatch\"",
       {"dataset 'weighted_points' (plugin test-named): next returned features [4, 4] and "
        "weight [3] whose first dimension differs; the first dimension of every tensor is the "
        "batch"}},
      {"data.train.bad=\"meta\"",
       {"dataset 'weighted_points' (plugin test-named): next returned 'weight' on meta; a "
        "dataset gives tensors on the CPU (or the run's device, cpu)"}},
      {"data.train.bad=\"duplicate\"",
       {"dataset 'weighted_points' (plugin test-named): next (keel.dataset.batch/1): "
        "'features' put twice; hint:"}},
      {"data.train.bad=\"empty\"",
       {"dataset 'weighted_points' (plugin test-named): next (keel.dataset.batch/1) returned a "
        "batch without tensors"}},
      {"data.train.bad=\"missing\"",
       {"loss 'weighted_mse' (plugin test-named): count_items (keel.loss.batch/1) failed: ",
        "no tensor 'weight' (there are: features, label)"}},
      {"model.bad=\"no_logits\"",
       {"model 'affine' (plugin test-named): forward (keel.model.batch/1) put no 'logits' (it "
        "put: squared)"}},
      {"model.bad=\"bad_aux\"",
       {"model 'affine' (plugin test-named): forward (keel.model.batch/1) put 'aux_loss' of "
        "shape [4, 1]; an auxiliary loss (aux_loss, aux_loss.NAME) is a 0-dim floating-point "
        "tensor"}},
      // A 1.x model reads "inputs", a 1.x loss "targets": neither is in this batch.
      {"model.type=\"mlp\"",
       {"model 'mlp' (plugin keel-models", "): forward (1.x) reads the batch's 'inputs', which ",
        "dataset 'weighted_points' (plugin test-named) does not give (its batch holds: features, "
        "label, weight); hint: a plugin that reads other names offers its kind's extension of "
        "keel/ext/batch.h"}},
      {"loss.type=\"cross_entropy\"",
       {"loss 'cross_entropy' (plugin keel-losses", "): count_items (1.x) reads the batch's "
        "'targets', which ", "(its batch holds: features, label, weight)"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.sets);
    TempDir d;
    const fs::path m = d.write("m.toml", manifest(d.path / "run"));
    std::vector<std::string> sets;
    std::string s = c.sets;
    for (size_t at = 0; at != std::string::npos;) {
      const size_t semi = s.find(';', at);
      sets.push_back(s.substr(at, semi == std::string::npos ? semi : semi - at));
      at = semi == std::string::npos ? semi : semi + 1;
    }
    const std::string error = keel_test::error_of([&] { keel_test::train(m, sets); });
    CAPTURE(error);
    CHECK(error.find('\n') == std::string::npos);
    for (const char* part : c.parts) CHECK(error.find(part) != std::string::npos);
  }
}

namespace {

// Components that override only the SDK's named methods, over the conventional names.
class ConventionalData : public keel::Dataset {
 public:
  explicit ConventionalData(const keel::Context&) {}
  int64_t size() override { return 3; }
  int64_t batches_per_epoch() override { return 1; }
  void start_epoch(int64_t) override {}
  bool next_batch(keel::NamedBatch& out) override {
    out.tensors = {{"inputs", at::arange(6, at::kFloat).reshape({3, 2})},
                   {"targets", at::tensor({0.5f, -1.0f, 2.0f}).reshape({3, 1})},
                   {"extra", at::arange(3, at::kLong)}};
    out.samples = out.tokens = 3;
    return true;
  }
};
class ConventionalModel : public keel::Model {
 public:
  explicit ConventionalModel(const keel::Context&) {}
  keel::NamedTensors forward_batch(const keel::NamedTensors& batch) override {
    return {{"logits", at::matmul(keel::need(batch, "inputs"), w_.t())}};
  }
  keel::NamedTensors named_parameters() override { return {{"w", w_}}; }

 private:
  at::Tensor w_ = at::tensor({0.25f, -0.5f}).reshape({1, 2}).requires_grad_();
};
class ConventionalLoss : public keel::Loss {
 public:
  explicit ConventionalLoss(const keel::Context&) {}
  at::Tensor compute_batch(const keel::NamedTensors& outputs, const keel::NamedTensors& batch,
                           int64_t* count) override {
    const at::Tensor d = keel::need(outputs, "logits") - keel::need(batch, "targets");
    *count = d.size(0);
    return (d * d).mean();
  }
  int64_t count_items_batch(const keel::NamedTensors& batch) override {
    return keel::need(batch, "targets").size(0);
  }
};

// A named loss that counts items with the 1.x count_items (over the batch's "targets").
class CountsTargets : public keel::Loss {
 public:
  explicit CountsTargets(const keel::Context&) {}
  at::Tensor compute_batch(const keel::NamedTensors& outputs, const keel::NamedTensors&,
                           int64_t* count) override {
    *count = 1;
    return keel::need(outputs, "logits").sum();
  }
  int64_t count_items(const at::Tensor& target) override { return 10 * target.size(0); }
};

// An instance of component T, created as the kernel creates one (no options).
template <class Abi, class T>
keel::Instance<Abi> make(const char* section, const char* kind) {
  return keel_test::instance<Abi>(keel::component<T>("conventional", "test"), section, kind);
}

bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && a.equal(b); }

}  // namespace

TEST_CASE("the SDK's named methods offer the extensions and fill the 1.x slots with the same") {
  const auto data = make<keel_dataset, ConventionalData>("data.train", "dataset");
  const auto model = make<keel_model, ConventionalModel>("model", "model");
  const auto loss = make<keel_loss, ConventionalLoss>("loss", "loss");
  const keel::DataSource named_data = keel::with_batches(data);
  const keel::ModelCalls named_model = keel::with_batches(model);
  const keel::LossCalls named_loss = keel::with_batches(loss);
  REQUIRE(named_data.named != nullptr);
  REQUIRE(named_model.named != nullptr);
  REQUIRE(named_loss.named != nullptr);
  CHECK((named_loss.named->count_items != nullptr));
  CHECK((named_loss.named->metric_update == nullptr));  // not overridden: not offered
  CHECK(data->get_extension(data.self(), KEEL_EXT_MODEL_BATCH) == nullptr);  // not a model

  // The kernel's calls through the extensions, and through the 1.x slots (as a kernel that
  // predates them calls a plugin): the 1.x batch is the named one's inputs and targets.
  const at::Device cpu(at::kCPU);
  keel::MicroBatch named_mb, old_mb;
  REQUIRE(keel::next_batch(named_data, cpu, &named_mb) == keel::NextResult::kBatch);
  REQUIRE(keel::next_batch({&data, nullptr}, cpu, &old_mb) == keel::NextResult::kBatch);
  REQUIRE(named_mb.tensors.size() == 3);
  REQUIRE(old_mb.tensors.size() == 2);
  CHECK(same(old_mb.tensors[0].second, named_mb.tensors[0].second));
  CHECK(same(old_mb.tensors[1].second, named_mb.tensors[1].second));
  CHECK(old_mb.samples == 3);

  const keel::Named named_out = keel::forward(named_model, named_mb);
  const keel::Named old_out = keel::forward({&model, nullptr}, old_mb);
  CHECK(same(named_out.at(0).second, old_out.at(0).second));
  int64_t named_count = 0, old_count = 0;
  const at::Tensor named_loss_value =
      keel::compute_loss(named_loss, named_out, named_mb, &named_count, true);
  const at::Tensor old_loss_value =
      keel::compute_loss({&loss, nullptr}, old_out, old_mb, &old_count, true);
  CHECK(same(named_loss_value, old_loss_value));
  CHECK(named_count == 3);
  CHECK(old_count == 3);
  CHECK(keel::count_items(named_loss, named_mb) == 3);
  CHECK(keel::count_items({&loss, nullptr}, old_mb) == 3);
  // A loss that overrides compute_batch and the 1.x count_items reports counts through the
  // extension too.
  const auto counting = make<keel_loss, CountsTargets>("loss", "loss");
  const keel::LossCalls counting_calls = keel::with_batches(counting);
  CHECK(keel::counts_items(counting_calls));
  CHECK(keel::count_items(counting_calls, named_mb) == 30);
  // logits = inputs @ w^T, computed here
  const at::Tensor logits = at::matmul(at::arange(6, at::kFloat).reshape({3, 2}),
                                       at::tensor({0.25f, -0.5f}).reshape({2, 1}));
  CHECK(same(named_out.at(0).second.detach(), logits));
}

}  // namespace unit_named_batches
