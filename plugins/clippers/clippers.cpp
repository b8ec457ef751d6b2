// grad_clipper components: norm (torch.nn.utils.clip_grad_norm_), value
// (torch.nn.utils.clip_grad_value_) and none. Each returns the global norm of the gradients
// before clipping (of order norm_type for `norm`, L2 otherwise); parameters without a gradient
// are skipped, and 0 is returned when none has one. With sharded parameters (ABI 1.7,
// [distributed] shard) each rank holds some rows of every gradient: the norm is combined over
// the ranks (the sum of every rank's sum of |g|^p, or the maximum), so every rank clips by the
// norm of the whole gradients.
#include <cmath>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>

#include "keel/plugin.hpp"

namespace {

// Options, each declared once: the schemas below list them, the components read them as
// the types they declare (ctx.get).
constexpr auto kMaxNorm = keel::opt_float(
    "max_norm", "1.0", "largest allowed total gradient norm", keel::above(0), keel::kInf);
constexpr auto kNormType = keel::opt_float(
    "norm_type", "2.0", "order of the norm (inf: max norm)", 0, keel::kInf);
constexpr auto kClipValue = keel::opt_float(
    "clip_value", "1.0", "gradients are clamped to [-clip_value, clip_value]", 0, keel::kInf);

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

// The norm of the whole gradients from this rank's shards of them: every rank's sum of
// |g|^norm_type (largest |g| for inf) combined over the ranks. A 0-dim tensor of the gradients'
// dtype (float when this rank holds none). Every rank calls it, with or without gradients.
at::Tensor sharded_norm(const std::vector<at::Tensor>& grads, double norm_type,
                        const keel::Shards& shards) {
  std::vector<at::Tensor> norms;
  for (const auto& g : grads)
    if (g.numel() > 0) norms.push_back(at::linalg_vector_norm(g, norm_type));
  std::vector<double> v{0.0};
  if (!norms.empty()) {
    const at::Tensor n = at::stack(norms);
    v[0] = (std::isinf(norm_type) ? n.max() : n.pow(norm_type).sum()).item<double>();
  }
  if (std::isinf(norm_type))
    shards.max(v);
  else
    shards.sum(v);
  const double total = std::isinf(norm_type) ? v[0] : std::pow(v[0], 1.0 / norm_type);
  return at::scalar_tensor(total, grads.empty() ? at::TensorOptions()
                                                : grads.front().options());
}

// The norm clipping and reporting use: over this rank's gradients, or the shards' combined.
at::Tensor norm_of(const std::vector<at::Tensor>& grads, double norm_type,
                   const keel::Shards& shards) {
  return shards.active() ? sharded_norm(grads, norm_type, shards) : total_norm(grads, norm_type);
}

class Norm : public keel::GradClipper {
 public:
  explicit Norm(const keel::Context& ctx)
      : params_(ctx.params()),
        shards_(ctx.shards()),
        max_norm_(ctx.get(kMaxNorm)),
        norm_type_(ctx.get(kNormType)) {}  // max_norm > 0: the schema's bound
  // As clip_grad_norm_: grads *= clamp(max_norm / (total + 1e-6), max = 1).
  double clip() override {
    const std::vector<at::Tensor> grads = grads_of(params_);
    if (grads.empty() && !shards_.active()) return 0.0;
    const at::Tensor total = norm_of(grads, norm_type_, shards_);
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
  keel::Shards shards_;
  double max_norm_, norm_type_;
};

class Value : public keel::GradClipper {
 public:
  explicit Value(const keel::Context& ctx)
      : params_(ctx.params()), shards_(ctx.shards()), clip_value_(ctx.get(kClipValue)) {}
  // As clip_grad_value_: every gradient element is clamped to [-clip_value, clip_value].
  double clip() override {
    const std::vector<at::Tensor> grads = grads_of(params_);
    if (grads.empty() && !shards_.active()) return 0.0;
    const at::Tensor total = norm_of(grads, 2.0, shards_);
    for (const auto& g : grads) g.clamp_(-clip_value_, clip_value_);
    return total.item<double>();
  }

 private:
  std::vector<at::Tensor> params_;
  keel::Shards shards_;
  double clip_value_;
};

class None : public keel::GradClipper {
 public:
  explicit None(const keel::Context& ctx) : params_(ctx.params()), shards_(ctx.shards()) {}
  double clip() override {
    const std::vector<at::Tensor> grads = grads_of(params_);
    if (grads.empty() && !shards_.active()) return 0.0;
    return norm_of(grads, 2.0, shards_).item<double>();
  }

 private:
  std::vector<at::Tensor> params_;
  keel::Shards shards_;
};

const keel_option_desc kNormOptions[] = {kMaxNorm, kNormType};
const keel_option_desc kValueOptions[] = {kClipValue};
const keel_component_desc kComponents[] = {
    keel::component<Norm>("norm", "scale gradients so their total norm is at most max_norm",
                          kNormOptions),
    keel::component<Value>("value", "clamp every gradient element to +-clip_value", kValueOptions),
    keel::component<None>("none", "leave gradients as they are (reports their L2 norm)"),
};

}  // namespace

KEEL_PLUGIN("keel-clippers", "0.1.0", "Gradient clipping", kComponents)
