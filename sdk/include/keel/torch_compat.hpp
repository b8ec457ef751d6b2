// The differences of LibTorch's C++ API between the releases keel builds against (Debian 12's
// 1.13.1 and PyTorch 2.11) that a plugin meets, each decided by what compiles, never by a
// version number: a plugin built against either LibTorch calls these and tests no version.
// The kernel's own differences (c10d's process groups and Reducer, autocast, allocators, the
// CUDA generator) are in kernel/compat/torch.hpp; the two together hold every difference keel
// knows (docs/torch.md). One entry per difference, each saying which
// release changed it; tests/unit/test_torch_compat.cpp checks each.
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace keel::compat {

// --- torch::optim::Optimizer::state()'s key: a parameter's TensorImpl pointer as text (1.13:
// c10::guts::to_string, gone in 2.11) became the pointer itself (after 1.13) ------------------
using OptimizerStateKey =
    typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
namespace detail {
template <class Key, class Impl>
Key optimizer_state_key(Impl* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // what c10::guts::to_string wrote: operator<< of the pointer
    text << impl;
    return text.str();
  } else {
    return static_cast<Key>(impl);
  }
}
}  // namespace detail
// The key of `param`'s entry in an optimizer's state().
inline OptimizerStateKey optimizer_state_key(const at::Tensor& param) {
  return detail::optimizer_state_key<OptimizerStateKey>(param.unsafeGetTensorImpl());
}

// --- Kineto events' times: microseconds (1.13: startUs, durationUs) became nanoseconds (after
// 1.13: startNs, durationNs; 2.11 has no microsecond calls) ----------------------------------
namespace detail {
template <class E>
auto event_start_ns(const E& e, int) -> decltype(static_cast<int64_t>(e.startNs())) {
  return static_cast<int64_t>(e.startNs());
}
template <class E>
auto event_start_ns(const E& e, long) -> decltype(static_cast<int64_t>(e.startUs())) {
  return static_cast<int64_t>(e.startUs()) * 1000;
}
template <class E>
auto event_duration_ns(const E& e, int) -> decltype(static_cast<int64_t>(e.durationNs())) {
  return static_cast<int64_t>(e.durationNs());
}
template <class E>
auto event_duration_ns(const E& e, long) -> decltype(static_cast<int64_t>(e.durationUs())) {
  return static_cast<int64_t>(e.durationUs()) * 1000;
}
}  // namespace detail
// When a profiler event started (ns since the epoch of the profiler's clock), and for how long.
inline int64_t event_start_ns(const torch::autograd::profiler::KinetoEvent& e) {
  return detail::event_start_ns(e, 0);
}
inline int64_t event_duration_ns(const torch::autograd::profiler::KinetoEvent& e) {
  return detail::event_duration_ns(e, 0);
}

}  // namespace keel::compat
