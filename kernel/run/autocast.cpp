#include "run/autocast.hpp"

#include <ATen/autocast_mode.h>  // includes <ATen/ATen.h>

#include "compat/torch.hpp"

namespace keel {

Autocast::Autocast(Precision precision, const c10::Device& device)
    : on_(precision != Precision::kFp32), device_(device.type()) {
  if (!on_) return;
  const at::ScalarType type = precision == Precision::kFp16 ? at::kHalf : at::kBFloat16;
  prev_enabled_ = compat::autocast_enabled(device_);
  prev_dtype_ = compat::autocast_dtype(device_);
  compat::set_autocast_enabled(device_, true);
  compat::set_autocast_dtype(device_, type);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_, prev_enabled_);
  compat::set_autocast_dtype(device_, prev_dtype_);
}

}  // namespace keel
