#include <cmath>

#include <ATen/ops/tensor.h>

using keel::testing::NamedTensors;

// Two rows of logits over two classes, targets 0 and 1; the reference differs in one entry.
struct Case {
  at::Tensor logits = at::tensor({2.0, 0.0, 0.0, 1.0}, at::kDouble).reshape({2, 2});
  at::Tensor anchor = at::tensor({1.0, 0.0, 0.0, 1.0}, at::kDouble).reshape({2, 2});
  NamedTensors batch = {{"inputs", at::tensor({0.0, 0.0}, at::kDouble).reshape({2, 1})},
                        {"targets", at::tensor({int64_t{0}, int64_t{1}})}};
};

TEST_CASE("@{component}: cross entropy plus weight x the mean squared distance to the reference") {
  const Case c;
  keel::testing::StepModels models;
  models.add("model", [&](const NamedTensors&) { return NamedTensors{{"logits", c.logits}}; });
  models.add("reference", [&](const NamedTensors&) { return NamedTensors{{"logits", c.anchor}}; });
  auto step = keel::testing::Plugin(keel_plugin_entry())
                  .create<keel_step>("@{component}", {{"weight", 0.5}});
  keel_tensor* handle = nullptr;
  step.call(step->compute, models.abi(), keel::testing::TensorSet(c.batch).abi(), &handle);
  const at::Tensor loss = keel::adopt(handle);
  // -log softmax of the target class: log(1 + e^-2) and log(1 + e^-1); squared distances
  // 1, 0, 0, 0.
  const double ce = (std::log1p(std::exp(-2.0)) + std::log1p(std::exp(-1.0))) / 2;
  CHECK(loss.item<double>() == doctest::Approx(ce + 0.5 * 0.25));
  CHECK(models.calls() == std::vector<std::string>{"model", "reference"});
}

TEST_CASE("@{component}: a reference the run does not have fails the step, naming it") {
  const Case c;
  keel::testing::StepModels models;
  models.add("model", [&](const NamedTensors&) { return NamedTensors{{"logits", c.logits}}; });
  auto step = keel::testing::Plugin(keel_plugin_entry())
                  .create<keel_step>("@{component}", {{"reference", "teacher"}});
  keel_tensor* handle = nullptr;
  CHECK_THROWS_WITH(
      step.call(step->compute, models.abi(), keel::testing::TensorSet(c.batch).abi(), &handle),
      doctest::Contains("no model 'teacher'"));
}
