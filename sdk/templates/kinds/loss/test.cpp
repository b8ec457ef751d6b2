#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

TEST_CASE("@{component}: value and gradient match a hand computation") {
  const double eps = 0.2;
  const std::vector<std::vector<double>> z = {{1.0, -0.5, 2.0, 0.0},
                                              {0.3, 0.3, -1.0, 0.7},
                                              {-2.0, 1.5, 0.1, 0.4}};
  const std::vector<int64_t> y = {2, 0, 3};
  const size_t n = z.size(), c = z[0].size();
  auto loss = keel::testing::Plugin(keel_plugin_entry())
                  .create<keel_loss>("@{component}", {{"label_smoothing", eps}});

  at::Tensor logits = at::zeros({int64_t(n), int64_t(c)}, at::kDouble);
  for (size_t i = 0; i < n; ++i)
    for (size_t k = 0; k < c; ++k) logits[i][k] = z[i][k];
  logits.requires_grad_();
  const at::Tensor targets = at::tensor(y, at::kLong);
  keel_tensor* handle = nullptr;
  int64_t count = -1;
  loss.call(loss->compute, keel::peek(logits), keel::peek(targets), &handle, &count);
  const at::Tensor value = keel::adopt(handle);

  // By hand: p = softmax(z); q = (1 - eps) one_hot(y) + eps / C; loss = mean_i -sum_k q log p;
  // d loss / d z = (p - q) / N.
  double expected = 0;
  std::vector<std::vector<double>> grad(n, std::vector<double>(c));
  for (size_t i = 0; i < n; ++i) {
    double norm = 0;
    for (double v : z[i]) norm += std::exp(v);
    for (size_t k = 0; k < c; ++k) {
      const double p = std::exp(z[i][k]) / norm;
      const double q = (k == size_t(y[i]) ? 1 - eps : 0.0) + eps / c;
      expected -= q * std::log(p) / n;
      grad[i][k] = (p - q) / n;
    }
  }
  CHECK(count == int64_t(n));
  REQUIRE(value.dim() == 0);
  CHECK(value.item<double>() == doctest::Approx(expected));
  value.backward();
  for (size_t i = 0; i < n; ++i)
    for (size_t k = 0; k < c; ++k)
      CHECK(logits.grad()[i][k].item<double>() == doctest::Approx(grad[i][k]));
  CHECK(loss.call(loss->count_items, keel::peek(targets)) == int64_t(n));
}

TEST_CASE("@{component}: logits that are not [N, C] are an error") {
  auto loss = keel::testing::Plugin(keel_plugin_entry()).create<keel_loss>("@{component}");
  const at::Tensor logits = at::zeros({3}), targets = at::zeros({3}, at::kLong);
  keel_tensor* handle = nullptr;
  int64_t count = 0;
  CHECK_THROWS_WITH(
      loss.call(loss->compute, keel::peek(logits), keel::peek(targets), &handle, &count),
      doctest::Contains("expected logits [N, C]"));
}

TEST_CASE("@{component}: accuracy from the summed state of two batches") {
  auto loss = keel::testing::Plugin(keel_plugin_entry()).create<keel_loss>("@{component}");
  REQUIRE(loss.call(loss->metric_state_size) == 2);
  std::vector<double> state(2, 0.0);
  // argmax per row: 0, 1 (first batch; targets 0, 0), then 2 (second batch; target 2).
  const at::Tensor first = at::tensor(std::vector<double>{3, 1, 0, 0, 2, 1}).reshape({2, 3});
  const at::Tensor second = at::tensor(std::vector<double>{0, 1, 4}).reshape({1, 3});
  const at::Tensor first_y = at::tensor(std::vector<int64_t>{0, 0});
  const at::Tensor second_y = at::tensor(std::vector<int64_t>{2});
  loss.call(loss->metric_update, keel::peek(first), keel::peek(first_y), 0.0, int64_t{2},
            state.data(), state.size());
  loss.call(loss->metric_update, keel::peek(second), keel::peek(second_y), 0.0, int64_t{1},
            state.data(), state.size());
  CHECK(state == std::vector<double>{2, 3});
  // The writer the kernel hands metric_finish, collecting (key, value).
  struct Collected {
    keel_metric_writer abi{sizeof(keel_metric_writer), this, &put};
    std::vector<std::pair<std::string, double>> metrics;
    static int put(keel_metric_writer* w, const char* key, double value) {
      static_cast<Collected*>(w->host_data)->metrics.emplace_back(key, value);
      return 1;
    }
  } out;
  loss.call(loss->metric_finish, state.data(), state.size(), &out.abi);
  REQUIRE(out.metrics.size() == 1);
  CHECK(out.metrics[0].first == "accuracy");
  CHECK(out.metrics[0].second == doctest::Approx(2.0 / 3));
}
