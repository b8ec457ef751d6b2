// Autocast for the forward pass and the loss (master weights stay fp32).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "run_config.hpp"

namespace keel {

// While it lives: bf16 on the run's device (CPU or CUDA autocast), fp16 on CUDA (the loss
// scaler goes with it); nothing for fp32. Restores the previous autocast settings.
class Autocast {
 public:
  Autocast(Precision precision, const c10::Device& device);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool on_;
  c10::DeviceType device_;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::kBFloat16;
};

}  // namespace keel
