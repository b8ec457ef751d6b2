#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>

// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kLr = keel::opt_float(
    "lr", "0.01", "learning rate (a parameter group may set its own)", 0.0, keel::kInf);

// Plain stochastic gradient descent: every parameter p with a gradient becomes p - lr * grad. A
// parameter group ([[optimizer.groups]]) may set its own lr; weight decay is not supported.
class @{Class} final : public keel::Optimizer {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx)
      : params_(ctx.params()), group_of_(ctx.param_groups()) {
    for (size_t g = 0; g < ctx.group_count(); ++g) {
      if (!std::isnan(ctx.group_weight_decay(g)))
        throw std::invalid_argument("parameter group " + std::to_string(g) +
                                    " sets weight_decay, which @{component} does not support; "
                                    "hint: remove weight_decay from [[optimizer.groups]]");
      lr_.push_back(std::isnan(ctx.group_lr(g)) ? ctx.get(kLr) : ctx.group_lr(g));
    }
  }
  void step() override {
    for (size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor& grad = params_[i].grad();
      // detach(): update the values in place, outside autograd.
      if (grad.defined()) params_[i].detach().sub_(grad, lr_.at(group_of_[i]));
    }
  }
  // Gradients become undefined, as with PyTorch's zero_grad(set_to_none=True).
  void zero_grad() override {
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  }
  size_t group_count() override { return lr_.size(); }
  double get_lr(size_t group) override { return lr_.at(group); }
  void set_lr(size_t group, double lr) override { lr_.at(group) = lr; }
  // For `keel train --resume`: "lr", each group's learning rate (float64).
  keel::NamedTensors state_save() override { return {{"lr", at::tensor(lr_, at::kDouble)}}; }
  void state_load(const keel::NamedTensors& state) override {
    for (const auto& [name, value] : state) {
      if (name != "lr" || value.numel() != static_cast<int64_t>(lr_.size()))
        throw std::invalid_argument("state entry '" + name + "' is not this optimizer's");
      const at::Tensor lr = value.to(at::kDouble).contiguous();
      for (size_t g = 0; g < lr_.size(); ++g) lr_[g] = lr.data_ptr<double>()[g];
    }
  }

 private:
  std::vector<at::Tensor> params_;  // the model's trainable parameters
  std::vector<int> group_of_;       // the group of each parameter
  std::vector<double> lr_;          // per group
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kLr};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
