// optimizer components: sgd, adam and adamw, wrapping torch::optim over the model's parameters,
// in the parameter groups the kernel passes (group g overrides lr / weight_decay when given). Hyper-parameters are checked as PyTorch checks them, with a hint.
//
// zero_grad sets the gradients to None (undefined), like PyTorch's zero_grad(set_to_none=True),
// the default since PyTorch 2.0: the next backward allocates them afresh instead of adding into
// zeros, which gives identical values and saves a memset per parameter. (LibTorch 1.13's own
// Optimizer::zero_grad() zeroes them in place instead.)
//
// State for exact resume (state_save / state_load, abi.h): per parameter, under the parameter's
// name, "<name>.momentum_buffer" (sgd, once momentum has made one) or "<name>.step" (I64),
// "<name>.exp_avg", "<name>.exp_avg_sq" and, with amsgrad, "<name>.max_exp_avg_sq" (adam,
// adamw; once the parameter has taken a step); per group g, "param_groups.<g>.<option>" (F64)
// for every hyper-parameter of the group. Loading restores them all, as PyTorch's
// Optimizer.load_state_dict does.
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include <ATen/ops/scalar_tensor.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "keel/plugin.hpp"
#include "keel/torch_compat.hpp"

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

// The entries of a state_load, taken one by one; whatever is left unused is an error.
class Entries {
 public:
  explicit Entries(const keel::NamedTensors& state) {
    for (const auto& [name, t] : state) left_[name] = t;
  }
  // A copy of entry `name`, or an undefined tensor when there is none.
  at::Tensor take(const std::string& name) {
    auto it = left_.find(name);
    if (it == left_.end()) return at::Tensor();
    at::Tensor t = it->second.detach().clone();
    left_.erase(it);
    return t;
  }
  double number(const std::string& name) {
    const at::Tensor t = take(name);
    check(t.defined() && t.numel() == 1, "optimizer state has no scalar '" + name + "'",
          "resume from a checkpoint saved by the same optimizer type");
    return t.item<double>();
  }
  void check_all_used() const {
    if (!left_.empty())
      check(false, "optimizer state entry '" + left_.begin()->first + "' belongs to no parameter "
            "or option of this optimizer", "resume with the optimizer and model the checkpoint "
            "was saved with");
  }

 private:
  std::map<std::string, at::Tensor> left_;
};

at::Tensor scalar(double v) { return at::scalar_tensor(v, at::kDouble); }

class TorchOptimizer : public keel::Optimizer {
 public:
  explicit TorchOptimizer(const keel::Context& ctx) {
    const std::vector<at::Tensor> params = ctx.params();
    const std::vector<std::string> names = ctx.param_names();
    for (size_t i = 0; i < params.size(); ++i)
      index_.emplace_back(keel::compat::optimizer_state_key(params[i]), names[i]);
  }
  void step() override { opt_->step(); }
  void zero_grad() override {
    for (auto& group : opt_->param_groups())
      for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
  }
  size_t group_count() override { return opt_->param_groups().size(); }
  double get_lr(size_t g) override { return group(g).options().get_lr(); }
  void set_lr(size_t g, double lr) override { group(g).options().set_lr(lr); }

  keel::NamedTensors state_save() override {
    keel::NamedTensors out;
    const auto index = param_index();
    for (const auto& [impl, name] : index) {
      auto it = opt_->state().find(impl);
      if (it != opt_->state().end()) save_param(*it->second, name, out);
    }
    for (size_t g = 0; g < opt_->param_groups().size(); ++g)
      for (const auto& [key, v] : hyper(opt_->param_groups()[g].options()))
        out.emplace_back("param_groups." + std::to_string(g) + "." + key, scalar(v));
    return out;
  }
  void state_load(const keel::NamedTensors& state) override {
    Entries entries(state);
    opt_->state().clear();
    for (const auto& [impl, name] : param_index())
      if (auto st = load_param(name, entries)) opt_->state()[impl] = std::move(st);
    for (size_t g = 0; g < opt_->param_groups().size(); ++g)
      set_hyper(opt_->param_groups()[g].options(), "param_groups." + std::to_string(g) + ".",
                entries);
    entries.check_all_used();
  }

 protected:
  std::unique_ptr<optim::Optimizer> opt_;
  // One parameter's state, under "<name>.<field>".
  virtual void save_param(const optim::OptimizerParamState& st, const std::string& name,
                          keel::NamedTensors& out) = 0;
  virtual std::unique_ptr<optim::OptimizerParamState> load_param(const std::string& name,
                                                                 Entries& entries) = 0;
  virtual std::vector<std::pair<std::string, double>> hyper(
      const optim::OptimizerOptions& o) const = 0;
  virtual void set_hyper(optim::OptimizerOptions& o, const std::string& prefix,
                         Entries& entries) = 0;

 private:
  optim::OptimizerParamGroup& group(size_t g) {
    check(g < opt_->param_groups().size(),
          "parameter group " + std::to_string(g) + " does not exist",
          "this optimizer has " + std::to_string(opt_->param_groups().size()) + " group(s)");
    return opt_->param_groups()[g];
  }
  // torch::optim's state key of each parameter (its TensorImpl address: as text in 1.13, the
  // pointer in 2.x; keel/torch_compat.hpp) with the parameter's name, in the kernel's parameter
  // order.
  using Index = std::vector<std::pair<keel::compat::OptimizerStateKey, std::string>>;
  const Index& param_index() const { return index_; }
  Index index_;
};

// Options, each declared once: the schemas at the end list them, the optimizers read them as
// the types they declare (ctx.get). lr, momentum, betas, eps and weight_decay bounds (>= 0,
// betas in [0, 1)) are enforced by the schema, at validation; nesterov's requirements (two
// options together) in Sgd's constructor.
constexpr auto kSgdLr = keel::opt_float("lr", "0.01", "learning rate", 0, keel::kInf);
constexpr auto kMomentum = keel::opt_float("momentum", "0.0", "momentum factor", 0, keel::kInf);
constexpr auto kDampening =
    keel::opt_float("dampening", "0.0", "dampening for momentum", 0, keel::kInf);
constexpr auto kNesterov =
    keel::opt_bool("nesterov", "false", "Nesterov momentum (needs momentum > 0, dampening 0)");
constexpr auto kSgdWeightDecay =
    keel::opt_float("weight_decay", "0.0", "L2 penalty added to the gradient", 0, keel::kInf);
// Adam and AdamW share every option but the weight-decay default and meaning.
constexpr auto kAdamLr = keel::opt_float("lr", "0.001", "learning rate", 0, keel::kInf);
constexpr auto kBeta1 =
    keel::opt_float("beta1", "0.9", "decay of the first-moment average", 0, keel::below(1));
constexpr auto kBeta2 =
    keel::opt_float("beta2", "0.999", "decay of the second-moment average", 0, keel::below(1));
constexpr auto kEps =
    keel::opt_float("eps", "1e-8", "term added to the denominator", 0, keel::kInf);
constexpr auto kAmsgrad = keel::opt_bool("amsgrad", "false", "use the AMSGrad variant");
constexpr auto kAdamWeightDecay =
    keel::opt_float("weight_decay", "0.0", "L2 penalty added to the gradient", 0, keel::kInf);
constexpr auto kAdamWWeightDecay =
    keel::opt_float("weight_decay", "0.01", "decoupled weight decay", 0, keel::kInf);

class Sgd : public TorchOptimizer {
 public:
  explicit Sgd(const keel::Context& ctx) : TorchOptimizer(ctx) {
    const double momentum = ctx.get(kMomentum), dampening = ctx.get(kDampening);
    const bool nesterov = ctx.get(kNesterov);
    check(!nesterov || (momentum > 0 && dampening == 0),
          "sgd: nesterov momentum requires momentum > 0 and dampening = 0",
          c10::str("set [", ctx.section(),
                   "] momentum (e.g. 0.9) and dampening = 0, or nesterov = false"));
    const auto options = optim::SGDOptions(ctx.get(kSgdLr))
                             .momentum(momentum)
                             .dampening(dampening)
                             .nesterov(nesterov)
                             .weight_decay(ctx.get(kSgdWeightDecay));
    opt_ = std::make_unique<optim::SGD>(param_groups(ctx, options), options);
  }

 protected:
  void save_param(const optim::OptimizerParamState& st, const std::string& name,
                  keel::NamedTensors& out) override {
    const auto& s = static_cast<const optim::SGDParamState&>(st);
    if (s.momentum_buffer().defined()) out.emplace_back(name + ".momentum_buffer", s.momentum_buffer());
  }
  std::unique_ptr<optim::OptimizerParamState> load_param(const std::string& name,
                                                         Entries& entries) override {
    at::Tensor buf = entries.take(name + ".momentum_buffer");
    if (!buf.defined()) return nullptr;
    auto st = std::make_unique<optim::SGDParamState>();
    st->momentum_buffer(buf);
    return st;
  }
  std::vector<std::pair<std::string, double>> hyper(const optim::OptimizerOptions& base) const override {
    const auto& o = static_cast<const optim::SGDOptions&>(base);
    return {{"lr", o.lr()},           {"momentum", o.momentum()},
            {"dampening", o.dampening()}, {"weight_decay", o.weight_decay()},
            {"nesterov", o.nesterov() ? 1.0 : 0.0}};
  }
  void set_hyper(optim::OptimizerOptions& base, const std::string& prefix,
                 Entries& e) override {
    auto& o = static_cast<optim::SGDOptions&>(base);
    o.lr(e.number(prefix + "lr"));
    o.momentum(e.number(prefix + "momentum"));
    o.dampening(e.number(prefix + "dampening"));
    o.weight_decay(e.number(prefix + "weight_decay"));
    o.nesterov(e.number(prefix + "nesterov") != 0);
  }
};

// Adam and AdamW share their options; only the weight-decay rule (and its option's default)
// differs.
template <class Opt, class Options, class ParamState, const keel::Option<double>& kWeightDecay>
class AdamLike : public TorchOptimizer {
 public:
  explicit AdamLike(const keel::Context& ctx) : TorchOptimizer(ctx) {
    const double beta1 = ctx.get(kBeta1), beta2 = ctx.get(kBeta2);
    const auto options = Options(ctx.get(kAdamLr))
                             .betas(std::make_tuple(beta1, beta2))
                             .eps(ctx.get(kEps))
                             .weight_decay(ctx.get(kWeightDecay))
                             .amsgrad(ctx.get(kAmsgrad));
    opt_ = std::make_unique<Opt>(param_groups(ctx, options), options);
  }

 protected:
  void save_param(const optim::OptimizerParamState& st, const std::string& name,
                  keel::NamedTensors& out) override {
    const auto& s = static_cast<const ParamState&>(st);
    out.emplace_back(name + ".step", at::scalar_tensor(s.step(), at::kLong));
    out.emplace_back(name + ".exp_avg", s.exp_avg());
    out.emplace_back(name + ".exp_avg_sq", s.exp_avg_sq());
    if (s.max_exp_avg_sq().defined()) out.emplace_back(name + ".max_exp_avg_sq", s.max_exp_avg_sq());
  }
  std::unique_ptr<optim::OptimizerParamState> load_param(const std::string& name,
                                                         Entries& entries) override {
    const at::Tensor step = entries.take(name + ".step");
    if (!step.defined()) return nullptr;
    auto st = std::make_unique<ParamState>();
    st->step(step.item<int64_t>());
    st->exp_avg(entries.take(name + ".exp_avg"));
    st->exp_avg_sq(entries.take(name + ".exp_avg_sq"));
    st->max_exp_avg_sq(entries.take(name + ".max_exp_avg_sq"));
    check(st->exp_avg().defined() && st->exp_avg_sq().defined(),
          "optimizer state of '" + name + "' has a step but no exp_avg / exp_avg_sq",
          "resume from a checkpoint saved by adam or adamw");
    return st;
  }
  std::vector<std::pair<std::string, double>> hyper(const optim::OptimizerOptions& base) const override {
    const auto& o = static_cast<const Options&>(base);
    return {{"lr", o.lr()},
            {"beta1", std::get<0>(o.betas())},
            {"beta2", std::get<1>(o.betas())},
            {"eps", o.eps()},
            {"weight_decay", o.weight_decay()},
            {"amsgrad", o.amsgrad() ? 1.0 : 0.0}};
  }
  void set_hyper(optim::OptimizerOptions& base, const std::string& prefix,
                 Entries& e) override {
    auto& o = static_cast<Options&>(base);
    o.lr(e.number(prefix + "lr"));
    const double b1 = e.number(prefix + "beta1"), b2 = e.number(prefix + "beta2");
    o.betas(std::make_tuple(b1, b2));
    o.eps(e.number(prefix + "eps"));
    o.weight_decay(e.number(prefix + "weight_decay"));
    o.amsgrad(e.number(prefix + "amsgrad") != 0);
  }
};
using Adam = AdamLike<optim::Adam, optim::AdamOptions, optim::AdamParamState, kAdamWeightDecay>;
using AdamW =
    AdamLike<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState, kAdamWWeightDecay>;

const keel_option_desc kSgdOptions[] = {kSgdLr, kMomentum, kDampening, kNesterov,
                                       kSgdWeightDecay};
const keel_option_desc kAdamOptions[] = {kAdamLr, kBeta1, kBeta2, kEps, kAdamWeightDecay, kAmsgrad};
const keel_option_desc kAdamWOptions[] = {kAdamLr, kBeta1, kBeta2, kEps, kAdamWWeightDecay,
                                          kAmsgrad};

const keel_component_desc kComponents[] = {
    keel::component<Sgd>("sgd", "stochastic gradient descent (momentum, Nesterov)", kSgdOptions),
    keel::component<Adam>("adam", "Adam (Kingma & Ba), optional AMSGrad", kAdamOptions),
    keel::component<AdamW>("adamw", "Adam with decoupled weight decay (Loshchilov & Hutter)",
                           kAdamWOptions),
};

}  // namespace

KEEL_PLUGIN("keel-optimizers", "0.1.0", "SGD, Adam and AdamW (torch::optim)", kComponents)
