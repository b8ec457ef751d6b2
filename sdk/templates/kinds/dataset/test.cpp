#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

using Instance = keel::testing::Instance<keel_dataset>;
using Sample = std::tuple<float, float, int64_t>;  // x, y, target

// The 256 samples the dataset documents: a 16 x 16 grid in [-1, 1]^2, target x * y > 0.
std::multiset<Sample> grid() {
  std::multiset<Sample> out;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      const float x = (2 * i + 1) / 16.0f - 1, y = (2 * j + 1) / 16.0f - 1;
      out.insert({x, y, x * y > 0 ? 1 : 0});
    }
  return out;
}

// The samples of one epoch in the order they came, after checking every batch's shapes: full
// batches of batch_size, the last one the rest, as many as batches_per_epoch says.
std::vector<Sample> epoch(const Instance& data, int64_t epoch, int64_t batch_size) {
  data.call(data->start_epoch, epoch);
  const int64_t size = data.call(data->size), batches = data.call(data->batches_per_epoch);
  std::vector<Sample> out;
  for (int64_t b = 0;; ++b) {
    keel_batch batch{};
    int has_batch = 0;
    data.call(data->next, &batch, &has_batch);
    if (!has_batch) {
      CHECK(b == batches);
      break;
    }
    const at::Tensor x = keel::adopt(batch.inputs), y = keel::adopt(batch.targets);
    const int64_t n = std::min(batch_size, size - b * batch_size);
    REQUIRE(x.sizes() == at::IntArrayRef{n, 2});
    REQUIRE(y.sizes() == at::IntArrayRef{n});
    REQUIRE((x.scalar_type() == at::kFloat));
    REQUIRE((y.scalar_type() == at::kLong));
    CHECK(batch.samples == n);
    for (int64_t i = 0; i < n; ++i)
      out.emplace_back(x[i][0].item<float>(), x[i][1].item<float>(), y[i].item<int64_t>());
  }
  CHECK(static_cast<int64_t>(out.size()) == size);
  return out;
}

TEST_CASE("@{component}: an epoch covers the grid once, in batches of batch_size") {
  const int64_t batch_size = 50;
  auto data = keel::testing::Plugin(keel_plugin_entry())
                  .create<keel_dataset>("@{component}", {{"batch_size", batch_size}});
  CHECK(data.call(data->size) == 256);
  CHECK(data.call(data->batches_per_epoch) == (256 + batch_size - 1) / batch_size);
  const std::vector<Sample> samples = epoch(data, 0, batch_size);
  // (( )): doctest compares without printing the samples.
  CHECK((std::multiset<Sample>(samples.begin(), samples.end()) == grid()));
}

TEST_CASE("@{component}: the order depends on the seed and the epoch only") {
  keel::testing::Plugin plugin(keel_plugin_entry());
  keel::testing::Setup seed7, seed8;
  seed7.seed = 7;
  seed8.seed = 8;
  auto a = plugin.create<keel_dataset>("@{component}", {}, seed7);
  auto b = plugin.create<keel_dataset>("@{component}", {}, seed7);
  auto c = plugin.create<keel_dataset>("@{component}", {}, seed8);
  const std::vector<Sample> first = epoch(a, 1, 32);
  CHECK((epoch(b, 1, 32) == first));  // same seed, same epoch
  CHECK((epoch(a, 2, 32) != first));  // another epoch
  CHECK((epoch(c, 1, 32) != first));  // another seed
  CHECK((epoch(a, 1, 32) == first));  // back to epoch 1
}

TEST_CASE("@{component}: two ranks share the grid out between them") {
  keel::testing::Plugin plugin(keel_plugin_entry());
  std::multiset<Sample> both;
  for (int32_t rank : {0, 1}) {
    keel::testing::Setup setup;
    setup.rank = rank;
    setup.world_size = 2;
    auto data = plugin.create<keel_dataset>("@{component}", {{"batch_size", 40}}, setup);
    CHECK(data.call(data->size) == 128);
    for (const Sample& s : epoch(data, 0, 40)) both.insert(s);
  }
  CHECK((both == grid()));
}
