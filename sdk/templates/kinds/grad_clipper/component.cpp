#include <cmath>
#include <vector>

#include <ATen/core/Tensor.h>

// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kMaxNorm = keel::opt_float(
    "max_norm", "1.0", "largest global L2 norm the gradients keep", 0.0, keel::kInf);

// Clipping by global norm: when the L2 norm of all gradients together exceeds max_norm, every
// gradient is scaled by max_norm / norm. Returns the norm before clipping; parameters without a
// gradient are skipped.
class @{Class} final : public keel::GradClipper {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx)
      : params_(ctx.params()), max_norm_(ctx.get(kMaxNorm)) {}
  double clip() override {
    double sum = 0;
    for (const auto& p : params_)
      if (p.grad().defined()) sum += p.grad().to(at::kDouble).square().sum().item<double>();
    const double norm = std::sqrt(sum);
    if (norm > max_norm_)  // false for a NaN norm: the kernel's non-finite policy handles it
      for (const auto& p : params_)
        if (p.grad().defined()) p.grad().mul_(max_norm_ / norm);
    return norm;
  }

 private:
  std::vector<at::Tensor> params_;  // the model's trainable parameters
  double max_norm_;
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kMaxNorm};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
