#include <cmath>

#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>

// Parameters a = [1, 1] and b = [1] with gradients [3, 0] and [4]: global norm 5.
keel::testing::Setup with_gradients() {
  const at::Tensor a = at::ones({2}, at::kDouble).requires_grad_();
  const at::Tensor b = at::ones({1}, at::kDouble).requires_grad_();
  a.mutable_grad() = at::tensor({3.0, 0.0}, at::kDouble);
  b.mutable_grad() = at::tensor({4.0}, at::kDouble);
  keel::testing::Setup setup;
  setup.params = {{"a", a}, {"b", b}};
  return setup;
}

TEST_CASE("@{component}: gradients above max_norm are scaled down to it") {
  const double max_norm = 1.0;
  const keel::testing::Setup setup = with_gradients();
  auto clipper = keel::testing::Plugin(keel_plugin_entry())
                     .create<keel_grad_clipper>("@{component}", {{"max_norm", max_norm}}, setup);
  double norm = -1;
  clipper.call(clipper->clip, &norm);
  CHECK(norm == doctest::Approx(std::sqrt(3.0 * 3.0 + 4.0 * 4.0)));
  const at::Tensor a = setup.params[0].second.grad(), b = setup.params[1].second.grad();
  CHECK(a[0].item<double>() == doctest::Approx(3.0 * max_norm / norm));
  CHECK(a[1].item<double>() == 0.0);
  CHECK(b[0].item<double>() == doctest::Approx(4.0 * max_norm / norm));
}

TEST_CASE("@{component}: gradients within max_norm stay as they are") {
  const keel::testing::Setup setup = with_gradients();
  auto clipper = keel::testing::Plugin(keel_plugin_entry())
                     .create<keel_grad_clipper>("@{component}", {{"max_norm", 10.0}}, setup);
  double norm = -1;
  clipper.call(clipper->clip, &norm);
  CHECK(norm == doctest::Approx(5.0));
  CHECK(setup.params[0].second.grad()[0].item<double>() == 3.0);
  CHECK(setup.params[1].second.grad()[0].item<double>() == 4.0);
}
