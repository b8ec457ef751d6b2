#include <fstream>
#include <string>

#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

using Instance = keel::testing::Instance<keel_checkpoint>;

void save(const Instance& ckpt, const keel::testing::NamedTensors& tensors) {
  const keel::testing::NamedHandles handles(tensors);
  ckpt.call(ckpt->save, ckpt.run_dir().c_str(), "model", handles.data(), handles.size());
}

// Loads object "model" into zero tensors shaped like `like`, and returns them.
keel::testing::NamedTensors load(const Instance& ckpt, const keel::testing::NamedTensors& like) {
  keel::testing::NamedTensors into;
  for (const auto& [name, t] : like) into.emplace_back(name, at::zeros_like(t));
  const keel::testing::NamedHandles handles(into);
  ckpt.call(ckpt->load, ckpt.run_dir().c_str(), "model", handles.data(), handles.size());
  return into;
}

// Flips the bits of the last byte of object "model" (the last tensor's last byte).
void damage(const Instance& ckpt) {
  std::fstream f(ckpt.run_dir() + "/model.tensors", std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(-1, std::ios::end);
  const char last = static_cast<char>(f.get());
  f.seekp(-1, std::ios::end);
  f.put(static_cast<char>(~last));
}

TEST_CASE("@{component}: load gives back what save wrote") {
  auto ckpt = keel::testing::Plugin(keel_plugin_entry()).create<keel_checkpoint>("@{component}");
  const keel::testing::NamedTensors saved = {{"weight", at::randn({3, 4})},
                                             {"step", at::scalar_tensor(7, at::kLong)},
                                             {"mask", at::rand({5}).gt(0.5)},
                                             {"empty", at::zeros({0, 2}, at::kHalf)}};
  save(ckpt, saved);
  const keel::testing::NamedTensors loaded = load(ckpt, saved);
  for (size_t i = 0; i < saved.size(); ++i)
    CHECK_MESSAGE(at::equal(loaded[i].second, saved[i].second), saved[i].first);
}

TEST_CASE("@{component}: a missing tensor or another shape is an error naming it") {
  auto ckpt = keel::testing::Plugin(keel_plugin_entry()).create<keel_checkpoint>("@{component}");
  save(ckpt, {{"weight", at::randn({3, 4})}});
  CHECK_THROWS_WITH(load(ckpt, {{"bias", at::zeros({3})}}), doctest::Contains("no tensor 'bias'"));
  CHECK_THROWS_WITH(load(ckpt, {{"weight", at::zeros({4, 3})}}),
                    doctest::Contains("tensor 'weight' is stored as"));
}

TEST_CASE("@{component}: with checksum = true load finds a damaged file") {
  auto ckpt = keel::testing::Plugin(keel_plugin_entry())
                  .create<keel_checkpoint>("@{component}", {{"checksum", true}});
  const keel::testing::NamedTensors saved = {{"weight", at::randn({3, 4})}};
  save(ckpt, saved);
  damage(ckpt);
  CHECK_THROWS_WITH(load(ckpt, saved), doctest::Contains("does not match its checksum"));
}

TEST_CASE("@{component}: with checksum = false nothing is verified") {
  auto ckpt = keel::testing::Plugin(keel_plugin_entry())
                  .create<keel_checkpoint>("@{component}", {{"checksum", false}});
  const keel::testing::NamedTensors saved = {{"weight", at::randn({3, 4})}};
  save(ckpt, saved);
  damage(ckpt);
  const keel::testing::NamedTensors loaded = load(ckpt, saved);
  CHECK_FALSE(at::equal(loaded[0].second, saved[0].second));  // the damage came through
}
