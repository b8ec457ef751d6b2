#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>

using Instance = keel::testing::Instance<keel_optimizer>;

// A parameter w = [1, 2] with gradient [0.5, -1], and one without a gradient.
keel::testing::Setup parameters() {
  const at::Tensor w = at::tensor({1.0, 2.0}, at::kDouble).requires_grad_();
  w.mutable_grad() = at::tensor({0.5, -1.0}, at::kDouble);
  keel::testing::Setup setup;
  setup.params = {{"w", w}, {"frozen", at::ones({3}, at::kDouble).requires_grad_()}};
  return setup;
}

TEST_CASE("@{component}: a step takes lr times the gradient off each parameter") {
  const double lr = 0.1;
  const keel::testing::Setup setup = parameters();
  const at::Tensor w = setup.params[0].second, frozen = setup.params[1].second;
  const at::Tensor w0 = w.detach().clone(), grad = w.grad().clone();
  auto opt = keel::testing::Plugin(keel_plugin_entry())
                 .create<keel_optimizer>("@{component}", {{"lr", lr}}, setup);
  CHECK(opt.call(opt->group_count) == 1);
  CHECK(opt.call(opt->get_lr, size_t{0}) == lr);

  opt.call(opt->step);
  CHECK(at::allclose(w, w0 - lr * grad));
  CHECK(at::equal(frozen, at::ones({3}, at::kDouble)));  // no gradient: unchanged

  opt.call(opt->set_lr, size_t{0}, 1.0);  // as the kernel does for the lr_scheduler
  opt.call(opt->step);
  CHECK(at::allclose(w, w0 - (lr + 1.0) * grad));

  opt.call(opt->zero_grad);
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("@{component}: state_save and state_load carry the learning rate") {
  keel::testing::Plugin plugin(keel_plugin_entry());
  auto saved = plugin.create<keel_optimizer>("@{component}", {}, parameters());
  saved.call(saved->set_lr, size_t{0}, 0.25);
  const keel::testing::NamedTensors state = keel::testing::save_state(saved);

  auto resumed = plugin.create<keel_optimizer>("@{component}", {}, parameters());
  CHECK(resumed.call(resumed->get_lr, size_t{0}) == 0.01);  // the default
  keel::testing::load_state(resumed, state);
  CHECK(resumed.call(resumed->get_lr, size_t{0}) == 0.25);
}
