// optimizer components: sgd, adam and adamw, wrapping torch::optim over the model's parameters,
// in the parameter groups the kernel passes (group g overrides lr / weight_decay when given). Hyper-parameters are checked as PyTorch checks them, with a hint.
//
// zero_grad sets the gradients to None (undefined), like PyTorch's zero_grad(set_to_none=True),
// the default since PyTorch 2.0: the next backward allocates them afresh instead of adding into
// zeros, which gives identical values and saves a memset per parameter. (LibTorch 1.13's own
// Optimizer::zero_grad() zeroes them in place instead.)
#include <cmath>
#include <memory>
#include <string>

#include "keel/plugin.hpp"

namespace {

namespace optim = torch::optim;

void check(bool ok, const std::string& what, const std::string& hint) {
  if (!ok) throw std::invalid_argument(what + "; hint: " + hint);
}

// torch::optim parameter groups from the context: group g holds the parameters the kernel
// assigned to it, with `base` options and the group's lr / weight_decay overrides.
template <class Options>
std::vector<optim::OptimizerParamGroup> param_groups(const keel::Context& ctx,
                                                     const Options& base) {
  const std::vector<at::Tensor> params = ctx.params();
  check(!params.empty(), "the optimizer got an empty parameter list",
        "the model has no trainable parameters (are they all frozen?); check [model]");
  const std::vector<int> group_of = ctx.param_groups();
  std::vector<optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < ctx.group_count(); ++g) {
    std::vector<at::Tensor> members;
    for (size_t i = 0; i < params.size(); ++i)
      if (group_of[i] == static_cast<int>(g)) members.push_back(params[i]);
    auto options = std::make_unique<Options>(base);
    if (!std::isnan(ctx.group_lr(g))) options->lr(ctx.group_lr(g));
    if (!std::isnan(ctx.group_weight_decay(g))) options->weight_decay(ctx.group_weight_decay(g));
    groups.emplace_back(std::move(members), std::move(options));
  }
  return groups;
}

class TorchOptimizer : public keel::Optimizer {
 public:
  void step() override { opt_->step(); }
  void zero_grad() override {
    for (auto& group : opt_->param_groups())
      for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
  }
  size_t group_count() override { return opt_->param_groups().size(); }
  double get_lr(size_t g) override { return group(g).options().get_lr(); }
  void set_lr(size_t g, double lr) override { group(g).options().set_lr(lr); }

 protected:
  std::unique_ptr<optim::Optimizer> opt_;

 private:
  optim::OptimizerParamGroup& group(size_t g) {
    check(g < opt_->param_groups().size(),
          "parameter group " + std::to_string(g) + " does not exist",
          "this optimizer has " + std::to_string(opt_->param_groups().size()) + " group(s)");
    return opt_->param_groups()[g];
  }
};

class Sgd : public TorchOptimizer {
 public:
  explicit Sgd(const keel::Context& ctx) {
    const double momentum = ctx.get_float("momentum"), dampening = ctx.get_float("dampening");
    const bool nesterov = ctx.get_bool("nesterov");
    check(!nesterov || (momentum > 0 && dampening == 0),
          "sgd: nesterov momentum requires momentum > 0 and dampening = 0",
          c10::str("set [", ctx.section(),
                   "] momentum (e.g. 0.9) and dampening = 0, or nesterov = false"));
    const auto options = optim::SGDOptions(ctx.get_float("lr"))
                             .momentum(momentum)
                             .dampening(dampening)
                             .nesterov(nesterov)
                             .weight_decay(ctx.get_float("weight_decay"));
    opt_ = std::make_unique<optim::SGD>(param_groups(ctx, options), options);
  }
};

// Adam and AdamW share their options; only the weight-decay rule differs.
template <class Opt, class Options>
class AdamLike : public TorchOptimizer {
 public:
  explicit AdamLike(const keel::Context& ctx) {
    const double beta1 = ctx.get_float("beta1"), beta2 = ctx.get_float("beta2");
    check(beta1 < 1.0, c10::str("beta1 = ", beta1, " is not in [0, 1)"),
          c10::str("set [", ctx.section(), "] beta1 below 1, e.g. 0.9"));
    check(beta2 < 1.0, c10::str("beta2 = ", beta2, " is not in [0, 1)"),
          c10::str("set [", ctx.section(), "] beta2 below 1, e.g. 0.999"));
    const auto options = Options(ctx.get_float("lr"))
                             .betas(std::make_tuple(beta1, beta2))
                             .eps(ctx.get_float("eps"))
                             .weight_decay(ctx.get_float("weight_decay"))
                             .amsgrad(ctx.get_bool("amsgrad"));
    opt_ = std::make_unique<Opt>(param_groups(ctx, options), options);
  }
};
using Adam = AdamLike<optim::Adam, optim::AdamOptions>;
using AdamW = AdamLike<optim::AdamW, optim::AdamWOptions>;

// lr, momentum, betas, eps and weight_decay bounds (>= 0, betas <= 1) are enforced by the
// schema; beta < 1 and nesterov's requirements are checked in the constructors.
const keel_option_desc kSgdOptions[] = {
    keel::opt_float("lr", "0.01", "learning rate", 0, keel::kInf),
    keel::opt_float("momentum", "0.0", "momentum factor", 0, keel::kInf),
    keel::opt_float("dampening", "0.0", "dampening for momentum", 0, keel::kInf),
    keel::opt_bool("nesterov", "false", "Nesterov momentum (needs momentum > 0, dampening 0)"),
    keel::opt_float("weight_decay", "0.0", "L2 penalty added to the gradient", 0, keel::kInf),
};
// Adam and AdamW share every option but the weight-decay default and meaning.
constexpr keel_option_desc kAdamLr = keel::opt_float("lr", "0.001", "learning rate", 0, keel::kInf);
constexpr keel_option_desc kBeta1 =
    keel::opt_float("beta1", "0.9", "decay of the first-moment average, in [0, 1)", 0, 1);
constexpr keel_option_desc kBeta2 =
    keel::opt_float("beta2", "0.999", "decay of the second-moment average, in [0, 1)", 0, 1);
constexpr keel_option_desc kEps =
    keel::opt_float("eps", "1e-8", "term added to the denominator", 0, keel::kInf);
constexpr keel_option_desc kAmsgrad = keel::opt_bool("amsgrad", "false", "use the AMSGrad variant");
const keel_option_desc kAdamOptions[] = {
    kAdamLr, kBeta1, kBeta2, kEps,
    keel::opt_float("weight_decay", "0.0", "L2 penalty added to the gradient", 0, keel::kInf),
    kAmsgrad,
};
const keel_option_desc kAdamWOptions[] = {
    kAdamLr, kBeta1, kBeta2, kEps,
    keel::opt_float("weight_decay", "0.01", "decoupled weight decay", 0, keel::kInf),
    kAmsgrad,
};

const keel_component_desc kComponents[] = {
    keel::component<Sgd>("sgd", "stochastic gradient descent (momentum, Nesterov)", kSgdOptions),
    keel::component<Adam>("adam", "Adam (Kingma & Ba), optional AMSGrad", kAdamOptions),
    keel::component<AdamW>("adamw", "Adam with decoupled weight decay (Loshchilov & Hutter)",
                           kAdamWOptions),
};

}  // namespace

KEEL_PLUGIN("keel-optimizers", "0.1.0", "SGD, Adam and AdamW (torch::optim)", kComponents)
