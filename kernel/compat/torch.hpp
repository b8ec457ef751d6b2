// The differences of LibTorch's C++ API between the releases keel builds against (Debian 12's
// 1.13.1 and PyTorch 2.11; meson.build refuses others) that the kernel meets: c10d's process
// groups and Reducer, autocast, allocators, the CUDA generator. Those a plugin meets (optimizer
// state keys, Kineto's event times) are in sdk/include/keel/torch_compat.hpp; the two headers
// together hold every difference keel knows (docs/torch.md). Each is decided by what compiles (a
// trait over the declarations the headers have), never by a version number, so a later release
// that keeps 2.11's API builds unchanged. One entry per difference, each saying which release
// changed it; tests/unit/test_torch_compat.cpp checks each against the LibTorch the build links.
// The rest of keel calls these and tests no version. A release named below comes from the
// issue's survey or PyTorch's history; "after 1.13": in 2.11, release not looked up.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace keel::compat {

// --- Autocast: per-device calls (2.4) -------------------------------------------------------
// 1.13 has one pair of calls per device kind (at::autocast::set_enabled for CUDA,
// set_cpu_enabled for the CPU, set_autocast_gpu_dtype, ...); 2.4 made them take the device type
// (set_autocast_enabled(DeviceType, bool), ...) and the old names warn on every call.
namespace detail {
using namespace at::autocast;  // unqualified names below: found here, or not at all
template <class D>
auto per_device_autocast(D d) -> decltype(set_autocast_enabled(d, true), std::true_type{});
std::false_type per_device_autocast(...);
}  // namespace detail
inline constexpr bool kPerDeviceAutocast =
    decltype(detail::per_device_autocast(c10::DeviceType::CPU))::value;

namespace detail {
// The 1.13 branches below name calls that 2.4 deprecated; clang looks them up (and warns) even
// where `if constexpr` discards them, so their warning is off for these few lines.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
template <class D>
bool autocast_enabled(D device) {
  if constexpr (decltype(per_device_autocast(device))::value) return is_autocast_enabled(device);
  else return device == D::CUDA ? is_enabled() : is_cpu_enabled();
}
template <class D>
void set_autocast(D device, bool on) {
  if constexpr (decltype(per_device_autocast(device))::value) set_autocast_enabled(device, on);
  else if (device == D::CUDA) set_enabled(on);
  else set_cpu_enabled(on);
}
template <class D>
c10::ScalarType autocast_dtype(D device) {
  if constexpr (decltype(per_device_autocast(device))::value) return get_autocast_dtype(device);
  else return device == D::CUDA ? get_autocast_gpu_dtype() : get_autocast_cpu_dtype();
}
template <class D>
void set_autocast_type(D device, c10::ScalarType type) {
  if constexpr (decltype(per_device_autocast(device))::value) set_autocast_dtype(device, type);
  else if (device == D::CUDA) set_autocast_gpu_dtype(type);
  else set_autocast_cpu_dtype(type);
}
#pragma GCC diagnostic pop
}  // namespace detail

// Whether autocast is on for `device` (CPU or CUDA), and its lower-precision type.
inline bool autocast_enabled(c10::DeviceType device) { return detail::autocast_enabled(device); }
inline void set_autocast_enabled(c10::DeviceType device, bool on) {
  detail::set_autocast(device, on);
}
inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
  return detail::autocast_dtype(device);
}
inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType type) {
  detail::set_autocast_type(device, type);
}

// --- Process groups: backends inside a ProcessGroup (2.0; ProcessGroup(store, rank, size) 2.5) -
// In 1.13 ProcessGroupGloo and ProcessGroupNCCL are process groups. Since 2.0 they are
// c10d::Backends that a ProcessGroup dispatches to, per device type: the group is made with the
// store, its default backend named and the backend set for its device (what
// torch.distributed's _new_process_group_helper does).
template <class Backend>
c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    c10::intrusive_ptr<Backend> backend, c10::DeviceType device, bool nccl) {
  if constexpr (std::is_base_of_v<c10d::ProcessGroup, Backend>) {
    (void)store, (void)rank, (void)size, (void)device, (void)nccl;
    return backend;
  } else {
    // PG is c10d::ProcessGroup, named through Backend so that 1.13 never looks inside it here.
    using PG = std::conditional_t<true, c10d::ProcessGroup, Backend>;
    auto pg = c10::make_intrusive<PG>(store, rank, size);
    const auto type = nccl ? PG::BackendType::NCCL : PG::BackendType::GLOO;
    pg->setDefaultBackend(type);
    pg->setBackend(device, type, backend);
    return pg;
  }
}

// --- c10d::Reducer's constructor (per_bucket_size_limits dropped, then flags added, after 1.13) -
// 1.13: (params, buckets, per_bucket_size_limits, group, expect_sparse, cap, find_unused,
//        as_view, names, first_cap).
// 2.x before the flags: the same without per_bucket_size_limits.
// 2.11: that, then skip_all_reduce_unused_params, use_python_reducer and bucket_bytes_cap_list
//       (empty: the Reducer rebuilds buckets with first_cap and cap, as 1.13 does).
struct ReducerArgs {
  std::vector<at::Tensor> params;
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> per_bucket_limits;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  int64_t bucket_cap = 0, first_bucket_cap = 0;
  std::unordered_map<size_t, std::string> names;
};
template <class R = c10d::Reducer>
std::shared_ptr<R> make_reducer(ReducerArgs a) {
  using Params = std::vector<at::Tensor>;
  using Buckets = std::vector<std::vector<size_t>>;
  using Group = c10::intrusive_ptr<c10d::ProcessGroup>;
  using Names = std::unordered_map<size_t, std::string>;
  const std::vector<bool> sparse(a.params.size(), false);
  if constexpr (std::is_constructible_v<R, Params, Buckets, std::vector<size_t>, Group,
                                        std::vector<bool>, int64_t, bool, bool, Names, int64_t>) {
    return std::make_shared<R>(std::move(a.params), std::move(a.buckets),
                               std::move(a.per_bucket_limits), std::move(a.group), sparse,
                               a.bucket_cap, false, false, std::move(a.names), a.first_bucket_cap);
  } else if constexpr (std::is_constructible_v<R, Params, Buckets, Group, std::vector<bool>,
                                               int64_t, bool, bool, Names, int64_t, bool, bool,
                                               std::vector<int64_t>>) {
    return std::make_shared<R>(std::move(a.params), std::move(a.buckets), std::move(a.group),
                               sparse, a.bucket_cap, false, false, std::move(a.names),
                               a.first_bucket_cap, /*skip_all_reduce_unused_params=*/false,
                               /*use_python_reducer=*/false, std::vector<int64_t>{});
  } else {
    return std::make_shared<R>(std::move(a.params), std::move(a.buckets), std::move(a.group),
                               sparse, a.bucket_cap, false, false, std::move(a.names),
                               a.first_bucket_cap);
  }
}

// --- c10::Allocator: allocate() lost its const (2.3), copy_data() became pure virtual (after
// 1.13) ------------------------------------------------------------------------------------
// An allocator of keel derives from Allocator and defines `c10::DataPtr allocate_bytes(size_t)
// const`; this base declares allocate() as the linked LibTorch does, and copy_data() (memcpy,
// as LibTorch's CPU allocator does) where the release requires it.
namespace detail {
template <bool kConstAllocate, class Base = c10::Allocator>
struct AllocatorFor;
template <class Base>
struct AllocatorFor<true, Base> : Base {
  c10::DataPtr allocate(size_t n) const override { return allocate_bytes(n); }
  virtual c10::DataPtr allocate_bytes(size_t n) const = 0;
};
template <class Base>
struct AllocatorFor<false, Base> : Base {
  c10::DataPtr allocate(size_t n) override { return allocate_bytes(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }
  virtual c10::DataPtr allocate_bytes(size_t n) const = 0;
};
}  // namespace detail
using Allocator = detail::AllocatorFor<std::is_same_v<decltype(&c10::Allocator::allocate),
                                                      c10::DataPtr (c10::Allocator::*)(size_t)
                                                          const>>;

// --- The CUDA default generator: getDefaultCUDAGenerator renamed getDefaultGenerator (after
// 1.13, when the CUDA hooks became accelerator hooks) ----------------------------------------
namespace detail {
template <class H>
auto default_generator(const H& hooks, int device, int)
    -> decltype(hooks.getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(device))) {
  return hooks.getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(device));
}
template <class H>
auto default_generator(const H& hooks, int device, long)
    -> decltype(hooks.getDefaultGenerator(static_cast<c10::DeviceIndex>(device))) {
  return hooks.getDefaultGenerator(static_cast<c10::DeviceIndex>(device));
}
}  // namespace detail
// The default generator of CUDA device `device` (the process must have it: at::hasCUDA()).
inline at::Generator cuda_default_generator(int device) {
  return detail::default_generator(at::detail::getCUDAHooks(), device, 0);
}

}  // namespace keel::compat
