// Dynamic loss scaling (fp16): the scale backs off on overflow, grows after a run of clean
// steps, and unscaling restores the true gradients.
#include <ATen/ATen.h>

#include "loss_scaler.hpp"
#include "support.hpp"

namespace unit_loss_scaler {  // keel_units is one unity build: each file's names stay its own

TEST_CASE("unscale restores the gradient and detects overflow") {
  keel::LossScaler scaler(1024.0);
  at::Tensor w = at::ones({3}, at::kFloat).set_requires_grad(true);
  scaler.scale_loss((w * w).sum()).backward();  // d/dw = 2w, scaled by 1024
  CHECK(w.grad()[0].item<double>() == 2048.0);
  CHECK(scaler.unscale({w}));
  CHECK(w.grad()[0].item<double>() == 2.0);

  w.mutable_grad().fill_(INFINITY);
  CHECK_FALSE(scaler.unscale({w}));
}

TEST_CASE("the scale backs off on overflow and grows after growth_interval clean steps") {
  keel::LossScaler scaler(1024.0, 2.0, 0.5, 3);
  scaler.update(false);
  CHECK(scaler.scale() == 512.0);
  scaler.update(true);
  scaler.update(true);
  CHECK(scaler.scale() == 512.0);
  scaler.update(true);
  CHECK(scaler.scale() == 1024.0);
  scaler.update(true);
  scaler.update(false);  // an overflow resets the clean run
  scaler.update(true);
  scaler.update(true);
  CHECK(scaler.scale() == 512.0);
}

}  // namespace unit_loss_scaler
