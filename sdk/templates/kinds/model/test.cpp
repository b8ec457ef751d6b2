#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>

using Instance = keel::testing::Instance<keel_model>;

// The parameters the model reports through its param slot.
keel::testing::NamedTensors parameters(const Instance& model) {
  keel::testing::NamedTensors out;
  for (size_t i = 0; i < model.call(model->param_count); ++i) {
    const char* name = nullptr;
    keel_tensor* tensor = nullptr;
    model.call(model->param, i, &name, &tensor);
    out.emplace_back(name, keel::borrow(tensor));
  }
  return out;
}

TEST_CASE("@{component}: layers = [4, 3, 2] gives two linear layers") {
  auto model = keel::testing::Plugin(keel_plugin_entry())
                   .create<keel_model>("@{component}", {{"layers", std::vector<int64_t>{4, 3, 2}}});
  const keel::testing::NamedTensors p = parameters(model);
  REQUIRE(p.size() == 4);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"fc0.weight", {3, 4}}, {"fc0.bias", {3}}, {"fc1.weight", {2, 3}}, {"fc1.bias", {2}}};
  for (size_t i = 0; i < p.size(); ++i) {
    CHECK(p[i].first == expected[i].first);
    CHECK(p[i].second.sizes() == at::IntArrayRef(expected[i].second));
    CHECK(p[i].second.requires_grad());
  }
  CHECK(model.call(model->flops_per_sample) == 6.0 * (4 * 3 + 3 * 2));

  // forward(x) = relu(x W0^T + b0) W1^T + b1, by hand, sample by sample.
  const at::Tensor x = at::randn({5, 4});
  keel_tensor* handle = nullptr;
  model.call(model->forward, keel::peek(x), &handle);
  const at::Tensor y = keel::adopt(handle);
  REQUIRE(y.sizes() == at::IntArrayRef{5, 2});
  const at::Tensor w0 = p[0].second, b0 = p[1].second, w1 = p[2].second, b1 = p[3].second;
  for (int64_t s = 0; s < 5; ++s)
    for (int64_t o = 0; o < 2; ++o) {
      double out = b1[o].item<double>();
      for (int64_t j = 0; j < 3; ++j) {
        double h = b0[j].item<double>();
        for (int64_t k = 0; k < 4; ++k) h += x[s][k].item<double>() * w0[j][k].item<double>();
        out += std::max(h, 0.0) * w1[o][j].item<double>();
      }
      CHECK(y[s][o].item<double>() == doctest::Approx(out).epsilon(1e-5));
    }

  // Gradients reach every parameter: d sum(y) / d b1 = the batch size.
  y.sum().backward();
  // (Not a structured binding: CHECK_MESSAGE captures its message in a lambda, which clang
  // before 16 refuses for a binding.)
  for (const auto& named : p) CHECK_MESSAGE(named.second.grad().defined(), named.first);
  CHECK(at::allclose(b1.grad(), at::full({2}, 5.0)));
}

TEST_CASE("@{component}: the run's seed decides the initial parameters") {
  keel::testing::Plugin plugin(keel_plugin_entry());
  keel::testing::Setup seed1, seed2;
  seed1.seed = 1;
  seed2.seed = 2;
  auto a = plugin.create<keel_model>("@{component}", {}, seed1);
  auto b = plugin.create<keel_model>("@{component}", {}, seed1);
  auto c = plugin.create<keel_model>("@{component}", {}, seed2);
  CHECK(at::equal(parameters(a)[0].second, parameters(b)[0].second));
  CHECK_FALSE(at::equal(parameters(a)[0].second, parameters(c)[0].second));
}

TEST_CASE("@{component}: fewer than two layer sizes are refused") {
  CHECK_THROWS_WITH(keel::testing::Plugin(keel_plugin_entry())
                        .create<keel_model>("@{component}", {{"layers", std::vector<int64_t>{4}}}),
                    doctest::Contains("layers needs at least two sizes"));
}
