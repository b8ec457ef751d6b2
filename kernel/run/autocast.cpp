#include "run/autocast.hpp"

#include <ATen/autocast_mode.h>  // includes <ATen/ATen.h>

namespace keel {

Autocast::Autocast(Precision precision, const c10::Device& device)
    : on_(precision != Precision::kFp32), cuda_(device.is_cuda()) {
  if (!on_) return;
  const at::ScalarType type = precision == Precision::kFp16 ? at::kHalf : at::kBFloat16;
  if (cuda_) {
    prev_enabled_ = at::autocast::is_enabled();
    prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(type);
  } else {
    prev_enabled_ = at::autocast::is_cpu_enabled();
    prev_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(type);
  }
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (cuda_) {
    at::autocast::set_enabled(prev_enabled_);
    at::autocast::set_autocast_gpu_dtype(prev_dtype_);
  } else {
    at::autocast::set_cpu_enabled(prev_enabled_);
    at::autocast::set_autocast_cpu_dtype(prev_dtype_);
  }
}

}  // namespace keel
