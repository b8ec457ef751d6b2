#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/relu.h>

// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kLayers = keel::opt_int_list(
    "layers", "[784, 256, 10]", "sizes of the layers, inputs first and classes last", 1, 1e9);

// A multi-layer perceptron: linear layers of the sizes `layers` lists (inputs first, outputs
// last), a ReLU between two of them; each sample is flattened first. Parameters "fc<i>.weight"
// [out, in] and "fc<i>.bias" [out] start uniform in [-1/sqrt(in), 1/sqrt(in)], as PyTorch's
// nn.Linear, drawn from LibTorch's default generator (keel seeds it from the run's seed).
class @{Class} final : public keel::Model {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx) {
    const std::vector<int64_t> sizes = ctx.get(kLayers);
    if (sizes.size() < 2)
      throw std::invalid_argument("layers needs at least two sizes (inputs, outputs); hint: "
                                  "layers = [784, 10]");
    for (size_t i = 0; i + 1 < sizes.size(); ++i) {
      const int64_t in = sizes[i], out = sizes[i + 1];
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      const std::string fc = "fc" + std::to_string(i);
      params_.emplace_back(fc + ".weight", (at::rand({out, in}) * 2 - 1).mul_(bound).requires_grad_());
      params_.emplace_back(fc + ".bias", (at::rand({out}) * 2 - 1).mul_(bound).requires_grad_());
      flops_ += 6.0 * static_cast<double>(in * out);
    }
  }
  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor x = input.flatten(1);
    for (size_t i = 0; i < params_.size(); i += 2) {
      if (i > 0) x = at::relu(x);
      x = at::linear(x, params_[i].second, params_[i + 1].second);
    }
    return x;
  }
  keel::NamedTensors named_parameters() override { return params_; }
  // Training FLOPs per sample: a multiply-add is 2 FLOPs, the backward pass twice the forward.
  double flops_per_sample() override { return flops_; }

 private:
  keel::NamedTensors params_;  // fc0.weight, fc0.bias, fc1.weight, ...
  double flops_ = 0;
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kLayers};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
