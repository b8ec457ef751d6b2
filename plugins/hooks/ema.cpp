// ema: an exponential moving average of the model's weights (extension keel.hook.model/1), as
// torch.optim.swa_utils.AveragedModel(model, avg_fn=..., use_buffers=True) keeps one. After
// every optimizer step (STEP_END) each floating-point parameter and buffer e of the average
// becomes
//     e = d * e + (1 - d) * w        (w: the model's value after the step)
// with d = decay, or with warmup = true d = min(decay, (1 + n) / (10 + n)), where n counts the
// updates before this one; the first update copies the model (AveragedModel's n_averaged == 0).
// Integer buffers are copied at every update. With eval_with = "ema" every evaluation after the
// first update (and `keel evaluate` of a checkpoint that holds one) runs with the average.
//
// The average and n are the hook's checkpointed state (named_state: "updates" and one tensor per
// model entry, under the entry's name), so a resumed run continues it exactly, and `keel
// evaluate` of a checkpoint evaluates its average. A fresh run that starts from a checkpoint's
// weights ([checkpoint] init_from, step 0) starts its own average, as a new AveragedModel does.
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <string>
#include <vector>

#include "components.hpp"
#include "keel/plugin.hpp"

namespace {

constexpr auto kDecay = keel::opt_float(
    "decay", "0.999", "weight of the average kept at each update: e = d * e + (1 - d) * w", 0, 1);
constexpr auto kWarmup = keel::opt_bool(
    "warmup", "false",
    "use d = min(decay, (1 + n) / (10 + n)) at the update after n updates, so that early "
    "averages follow the model faster");
constexpr auto kEvalWith = keel::opt_string(
    "eval_with", "\"ema\"",
    "weights evaluations run with once the average exists: the average, or the model's own",
    "ema|model");

class Ema : public keel::Hook {
 public:
  explicit Ema(const keel::Context& ctx)
      : decay_(ctx.get(kDecay)),
        warmup_(ctx.get(kWarmup)),
        eval_with_ema_(ctx.get(kEvalWith) == "ema"),
        updates_(at::zeros({}, at::kLong)) {}

  void attach_model(keel::ModelView model) override {
    model_ = std::move(model);
    for (const auto& e : model_.entries()) average_.push_back(at::zeros_like(e.tensor));
  }

  keel::NamedTensors named_state() override {
    keel::NamedTensors state{{"updates", updates_}};
    for (size_t i = 0; i < average_.size(); ++i)
      state.emplace_back(model_.entries()[i].name, average_[i]);
    return state;
  }

  void on_event(keel_event& ev) override {
    if (ev.kind == KEEL_EVENT_STEP_END) {
      update();
      use_for_evaluation();
    } else if (ev.kind == KEEL_EVENT_CHECKPOINT_LOADED) {
      if (ev.state->step == 0)  // init_from for a fresh run: its own average, from its weights
        updates_.fill_(0);
      use_for_evaluation();  // a resumed run's, or `keel evaluate`'s, average
    }
  }

 private:
  void update() {
    const at::NoGradGuard no_grad;
    const int64_t n = updates_.item<int64_t>();
    const double d =
        warmup_ ? std::min(decay_, (1.0 + static_cast<double>(n)) / (10.0 + static_cast<double>(n)))
                : decay_;
    for (size_t i = 0; i < average_.size(); ++i) {
      const at::Tensor& w = model_.entries()[i].tensor;
      if (n == 0 || !at::isFloatingType(w.scalar_type()))
        average_[i].copy_(w);
      else
        average_[i].mul_(d).add_(w, 1.0 - d);
    }
    updates_.fill_(n + 1);
  }

  void use_for_evaluation() {
    if (eval_with_ema_ && !in_use_ && updates_.item<int64_t>() > 0) {
      model_.set_eval_weights(average_);
      in_use_ = true;
    }
  }

  double decay_;
  bool warmup_, eval_with_ema_;
  at::Tensor updates_;
  keel::ModelView model_;
  std::vector<at::Tensor> average_;
  bool in_use_ = false;
};

const keel_option_desc kOptions[] = {kDecay, kWarmup, kEvalWith};

}  // namespace

keel_component_desc keel_hooks::ema_component() {
  return keel::component<Ema>(
      "ema",
      "exponential moving average of the model's weights (AveragedModel with use_buffers), "
      "which evaluations use",
      kOptions);
}
