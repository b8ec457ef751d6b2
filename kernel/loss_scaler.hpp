// Dynamic loss scaling for fp16 training (the algorithm of torch.cuda.amp.GradScaler):
// the loss is multiplied by `scale` before backward; after backward the gradients are divided
// by it again; a step whose unscaled gradients hold Inf/NaN is skipped and the scale backs off,
// and after `growth_interval` clean steps in a row the scale grows.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include <vector>

namespace keel {

class LossScaler {
 public:
  explicit LossScaler(double init_scale = 65536.0, double growth = 2.0, double backoff = 0.5,
                      int64_t growth_interval = 2000)
      : scale_(init_scale), growth_(growth), backoff_(backoff), interval_(growth_interval) {}

  double scale() const { return scale_; }
  // Finite steps since the scale last changed; with scale(), all a checkpoint must restore.
  int64_t clean_steps() const { return clean_steps_; }
  void restore(double scale, int64_t clean_steps) {
    scale_ = scale;
    clean_steps_ = clean_steps;
  }
  at::Tensor scale_loss(const at::Tensor& loss) const { return loss.mul(scale_); }

  // Divides every defined gradient by the scale; returns false when one holds Inf/NaN.
  bool unscale(const std::vector<at::Tensor>& params) const {
    bool finite = true;
    at::NoGradGuard no_grad;
    for (const auto& p : params) {
      at::Tensor g = p.grad();
      if (!g.defined()) continue;
      g.mul_(1.0 / scale_);
      finite = finite && g.isfinite().all().item<bool>();
    }
    return finite;
  }

  // Adjusts the scale after a step (finite: the step was taken).
  void update(bool finite) {
    if (!finite) {
      scale_ *= backoff_;
      clean_steps_ = 0;
    } else if (++clean_steps_ >= interval_) {
      scale_ *= growth_;
      clean_steps_ = 0;
    }
  }

 private:
  double scale_, growth_, backoff_;
  int64_t interval_;
  int64_t clean_steps_ = 0;
};

}  // namespace keel
