// Batches of named tensors (keel/ext/batch.h, kernel/run/model_calls.cpp) with the fixture
// plugin test-named (tests/fixtures/named_batch.cpp: dataset weighted_points, model affine, loss
// weighted_mse, all three through their extensions): a run with 2 micro-batches per step
// trains as the same computation written here directly with LibTorch's ATen operations
// (the per-step losses and the evaluation's loss and metric within 1e-6 relative); bad batches
// and names a plugin needs but the batch lacks stop the run with one error naming the plugin and
// the tensor; 1.x models and losses read the conventional names.
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

#include "support.hpp"

namespace unit_named_batches {

using keel_test::TempDir;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int64_t kBatch = 4, kAccum = 2, kTrainCount = 64, kEvalCount = 16;
constexpr double kLr = 0.05;

std::string manifest(const fs::path& run_dir, const std::string& extra = "") {
  return "[run]\nname = \"named\"\noutput_dir = \"" + run_dir.string() +
         "\"\nseed = 3\n"
         "[train]\nepochs = 1\nlog_every = 1\ngrad_accum = " + std::to_string(kAccum) + "\n"
         "[model]\ntype = \"affine\"\n"
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
  s.label = (0.5 * s.features.to(at::kDouble).sum(1, true) + at::cos(i).unsqueeze(1)).to(at::kFloat);
  s.weight = (1 + at::arange(first, first + n, at::kLong) % 3).to(at::kFloat);
  return s;
}

at::Tensor weighted_mse(const at::Tensor& w, const at::Tensor& b, const Samples& s) {
  const at::Tensor d = at::matmul(s.features, w.t()) + b - s.label;
  return (s.weight * (d * d).squeeze(1)).mean();
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b)); }

}  // namespace

TEST_CASE("named batches train as the same computation written with LibTorch") {
  TempDir d;
  keel_test::train(d.write("m.toml", manifest(d.path / "run")));

  // The reference: the fixture's model, loss and data; two micro-batches per step, each loss
  // weighted by its share of the step's items (4 of 8), then SGD.
  at::Tensor w = at::tensor({0.3f, -0.2f, 0.1f, 0.05f}).reshape({1, 4}).requires_grad_();
  at::Tensor b = at::tensor({0.02f}).requires_grad_();
  std::vector<double> losses;
  const int64_t steps = kTrainCount / (kBatch * kAccum);
  for (int64_t step = 0; step < steps; ++step) {
    double step_loss = 0;
    for (int64_t m = 0; m < kAccum; ++m) {
      const at::Tensor l = weighted_mse(w, b, samples((step * kAccum + m) * kBatch, kBatch)) *
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

}  // namespace unit_named_batches
