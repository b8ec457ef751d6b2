// kernel/compat/torch.hpp and keel/torch_compat.hpp: one case per difference between the
// LibTorch releases keel builds against (1.13 and 2.11), each run against the LibTorch this
// build links: which form the trait picked (the new one on 2.x, the old one on 1.13, so that a
// 2.x build never calls a deprecated name that warns on every call) and that the call does what
// keel relies on.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/optim/adam.h>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "compat/torch.hpp"
#include "keel/torch_compat.hpp"

namespace unit_torch_compat {  // keel_units is one unity build: each file's names stay its own

constexpr bool kTwo = TORCH_VERSION_MAJOR >= 2;

TEST_CASE("autocast: per-device calls on 2.x, the per-kind names on 1.13") {
  CHECK(keel::compat::kPerDeviceAutocast == kTwo);
  const bool was = keel::compat::autocast_enabled(c10::DeviceType::CPU);
  const c10::ScalarType before = keel::compat::autocast_dtype(c10::DeviceType::CPU);
  keel::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
  keel::compat::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
  at::autocast::increment_nesting();
  CHECK(keel::compat::autocast_enabled(c10::DeviceType::CPU));
  CHECK((keel::compat::autocast_dtype(c10::DeviceType::CPU) == at::kBFloat16));
  // CUDA's setting is its own: turning the CPU's on leaves it off.
  CHECK_FALSE(keel::compat::autocast_enabled(c10::DeviceType::CUDA));
  const at::Tensor a = at::ones({4, 4});
  CHECK((at::mm(a, a).scalar_type() == at::kBFloat16));  // autocast applies to mm on the CPU
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  keel::compat::set_autocast_enabled(c10::DeviceType::CPU, was);
  keel::compat::set_autocast_dtype(c10::DeviceType::CPU, before);
  CHECK((at::mm(a, a).scalar_type() == at::kFloat));
}

TEST_CASE("process groups: a Gloo backend inside a ProcessGroup on 2.x, a ProcessGroup itself "
          "on 1.13") {
  CHECK(std::is_base_of_v<c10d::ProcessGroup, c10d::ProcessGroupGloo> == !kTwo);
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(10));
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto pg = keel::compat::as_process_group(
      store, 0, 1, c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options),
      c10::DeviceType::CPU, /*nccl=*/false);
  CHECK(pg->getRank() == 0);
  CHECK(pg->getSize() == 1);
  CHECK(pg->getBackendName() == "gloo");
  std::vector<at::Tensor> t{at::full({3}, 2.5)};
  pg->allreduce(t)->wait();
  CHECK(at::equal(t[0], at::full({3}, 2.5)));
}

TEST_CASE("c10d::Reducer: the constructor of the linked release, picked by what it accepts") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(10));
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto pg = keel::compat::as_process_group(
      store, 0, 1, c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options),
      c10::DeviceType::CPU, false);
  at::Tensor w = at::ones({2, 3}).requires_grad_(true);
  at::Tensor b = at::zeros({3}).requires_grad_(true);
  auto reducer = keel::compat::make_reducer({{w, b}, {{1, 0}}, {1 << 20}, pg, 1 << 20, 1 << 20,
                                             {{0, "w"}, {1, "b"}}});
  REQUIRE(reducer);
  reducer->prepare_for_forward();
  const at::Tensor loss = (at::ones({4, 2}).matmul(w) + b).pow(2).sum();
  reducer->prepare_for_backward({loss});
  loss.backward();
  // One rank: the all-reduced mean is the gradient itself. d/dw = sum over rows of 2*(x w + b)
  // with x = ones: each output is 2, so 4 rows * 2 * 2 = 16 per element of w, 16 per b.
  CHECK(at::allclose(w.grad(), at::full({2, 3}, 16.0)));
  CHECK(at::allclose(b.grad(), at::full({3}, 16.0)));
  CHECK(reducer->get_grad_buckets().size() == 1);
}

// Counts the bytes it hands out, through compat::Allocator.
struct Counting final : keel::compat::Allocator {
  mutable std::atomic<int64_t> bytes{0};
  c10::Allocator* base = c10::GetDefaultCPUAllocator();
  c10::DataPtr allocate_bytes(size_t n) const override {
    bytes += static_cast<int64_t>(n);
    return base->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base->raw_deleter(); }
};

TEST_CASE("allocators: allocate() const on 1.13, non-const with copy_data() on 2.x") {
  const bool const_allocate =
      std::is_same_v<decltype(&c10::Allocator::allocate),
                     c10::DataPtr (c10::Allocator::*)(size_t) const>;
  CHECK(const_allocate == !kTwo);
  static Counting counting;  // LibTorch keeps the pointer: it outlives the case
  c10::Allocator* before = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  at::Tensor t = at::empty({1000}, at::kFloat);
  t.fill_(3);
  const at::Tensor copy = t.clone();
  c10::SetCPUAllocator(before, 100);
  CHECK(counting.bytes >= 2 * 4000);
  CHECK(copy[999].item<float>() == 3);
}

TEST_CASE("the CUDA default generator: reached through the hooks' name of the linked release") {
  if (at::hasCUDA()) {
    CHECK(keel::compat::cuda_default_generator(0).device().is_cuda());
  } else {
    // Without a GPU (every build here) the hooks refuse, as LibTorch does without CUDA.
    CHECK_THROWS_AS(keel::compat::cuda_default_generator(0), c10::Error);
  }
}

TEST_CASE("torch::optim state keys: the TensorImpl pointer on 2.x, its text on 1.13") {
  CHECK(std::is_same_v<keel::compat::OptimizerStateKey, std::string> == !kTwo);
  at::Tensor p = at::ones({3}).requires_grad_(true);
  at::Tensor q = at::ones({2}).requires_grad_(true);
  torch::optim::Adam adam({p, q}, torch::optim::AdamOptions(0.1));
  (p.sum() * 2).backward();  // q gets no gradient: Adam keeps no state for it
  adam.step();
  CHECK(adam.state().count(keel::compat::optimizer_state_key(p)) == 1);
  CHECK(adam.state().count(keel::compat::optimizer_state_key(q)) == 0);
}

TEST_CASE("profiler events: nanoseconds on 2.x, microseconds on 1.13, both as ns since the epoch") {
  namespace impl = torch::profiler::impl;
  const auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const at::Tensor a = at::ones({256, 256});
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, {impl::ActivityType::CPU});
  const int64_t before = now_ns();
  torch::autograd::profiler::enableProfiler(config, {impl::ActivityType::CPU});
  (void)at::mm(a, a);
  const auto result = torch::autograd::profiler::disableProfiler();
  const int64_t after = now_ns();
  int found = 0;
  for (const auto& e : result->events()) {
    if (e.name() != "aten::mm") continue;
    ++found;
    const int64_t start = keel::compat::event_start_ns(e);
    const int64_t duration = keel::compat::event_duration_ns(e);
    CHECK(duration > 0);
    CHECK(duration <= after - before);
    // Within the window the wall clock saw, give or take the clocks' difference (1 ms).
    CHECK(start >= before - 1000000);
    CHECK(start + duration <= after + 1000000);
  }
  CHECK(found == 1);
  // LibTorch 2.11's Kineto starts a configuration thread with its first profiler; a process
  // that exits while that thread still builds its first Config deadlocks or aborts in
  // ~ConfigLoader (stopThread joins the thread, which waits on a lock; seen as a hang and as
  // "terminate called ... std::system_error: Invalid argument" in about 1 of 5 runs of this
  // executable's cases alone). Give the thread time to settle before this process goes on.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

}  // namespace unit_torch_compat
