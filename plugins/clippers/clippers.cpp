// grad_clipper components: norm (torch.nn.utils.clip_grad_norm_), value
// (torch.nn.utils.clip_grad_value_) and none. Each returns the global norm of the gradients
// before clipping (of order norm_type for `norm`, L2 otherwise); parameters without a gradient
// are skipped, and 0 is returned when none has one.
#include <cmath>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>

#include "keel/plugin.hpp"

namespace {

// Detached gradients of the parameters that have one.
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad().detach());
  return grads;
}

// The total norm as clip_grad_norm_ computes it: the vector norm of the per-gradient vector
// norms (torch.norm routes to linalg.vector_norm); for norm_type = inf, the largest absolute
// value. A 0-dim tensor on the gradients' device.
at::Tensor total_norm(const std::vector<at::Tensor>& grads, double norm_type) {
  std::vector<at::Tensor> norms;
  if (std::isinf(norm_type)) {
    for (const auto& g : grads) norms.push_back(g.abs().max());
    return norms.size() == 1 ? norms[0] : at::stack(norms).max();
  }
  for (const auto& g : grads) norms.push_back(at::linalg_vector_norm(g, norm_type));
  return at::linalg_vector_norm(at::stack(norms), norm_type);
}

class Norm : public keel::GradClipper {
 public:
  explicit Norm(const keel::Context& ctx)
      : params_(ctx.params()),
        max_norm_(ctx.get_float("max_norm")),
        norm_type_(ctx.get_float("norm_type")) {
    if (!(max_norm_ > 0))
      throw std::invalid_argument(c10::str("norm: max_norm must be > 0, got ", max_norm_,
                                           "; hint: set [", ctx.section(),
                                           "] max_norm (e.g. 1.0) or use type = \"none\""));
  }
  // As clip_grad_norm_: grads *= clamp(max_norm / (total + 1e-6), max = 1).
  double clip() override {
    const std::vector<at::Tensor> grads = grads_of(params_);
    if (grads.empty()) return 0.0;
    const at::Tensor total = total_norm(grads, norm_type_);
    // Python evaluates `max_norm / t` as t.reciprocal() * max_norm: the same two roundings
    // make keel's clipping bit-identical to PyTorch's.
    const at::Tensor coef = ((total + 1e-6).reciprocal() * max_norm_).clamp_max(1.0);
    // The norm is read anyway (one host sync). A coefficient of exactly 1 (the norm within
    // max_norm) leaves every gradient as it is (x * 1 == x), so that pass over them is skipped;
    // PyTorch's clip_grad_norm_ (Python and C++) always multiplies. A NaN coefficient still
    // multiplies, as there; the kernel's non-finite policy sees the NaN norm.
    const double norm = total.item<double>();
    if (!(coef.item<double>() >= 1.0))
      for (const auto& g : grads) g.mul_(coef);
    return norm;
  }

 private:
  std::vector<at::Tensor> params_;
  double max_norm_, norm_type_;
};

class Value : public keel::GradClipper {
 public:
  explicit Value(const keel::Context& ctx)
      : params_(ctx.params()), clip_value_(ctx.get_float("clip_value")) {}
  // As clip_grad_value_: every gradient element is clamped to [-clip_value, clip_value].
  double clip() override {
    const std::vector<at::Tensor> grads = grads_of(params_);
    if (grads.empty()) return 0.0;
    const at::Tensor total = total_norm(grads, 2.0);
    for (const auto& g : grads) g.clamp_(-clip_value_, clip_value_);
    return total.item<double>();
  }

 private:
  std::vector<at::Tensor> params_;
  double clip_value_;
};

class None : public keel::GradClipper {
 public:
  explicit None(const keel::Context& ctx) : params_(ctx.params()) {}
  double clip() override {
    const std::vector<at::Tensor> grads = grads_of(params_);
    return grads.empty() ? 0.0 : total_norm(grads, 2.0).item<double>();
  }

 private:
  std::vector<at::Tensor> params_;
};

const keel_option_desc kNormOptions[] = {
    keel::opt_float("max_norm", "1.0", "largest allowed total gradient norm (> 0)", 0, keel::kInf),
    keel::opt_float("norm_type", "2.0", "order of the norm (inf: max norm)", 0, keel::kInf),
};
const keel_option_desc kValueOptions[] = {
    keel::opt_float("clip_value", "1.0", "gradients are clamped to [-clip_value, clip_value]", 0,
                    keel::kInf),
};
const keel_component_desc kComponents[] = {
    keel::component<Norm>("norm", "scale gradients so their total norm is at most max_norm",
                          kNormOptions),
    keel::component<Value>("value", "clamp every gradient element to +-clip_value", kValueOptions),
    keel::component<None>("none", "leave gradients as they are (reports their L2 norm)"),
};

}  // namespace

KEEL_PLUGIN("keel-clippers", "0.1.0", "Gradient clipping", kComponents)
