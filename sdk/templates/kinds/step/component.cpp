#include <string>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cross_entropy_loss.h>

// The options, each declared once: the schema below lists them, the constructor reads them as
// the types they declare (ctx.get).
constexpr auto kWeight = keel::opt_float(
    "weight", "0.1", "weight of the mean squared distance to the reference's logits", 0.0,
    keel::kInf);
constexpr auto kReference = keel::opt_string(
    "reference", "\"reference\"", "the [models.NAME] whose logits the model is kept close to");

// A training step of one's own: the cross entropy of [model]'s logits plus `weight` times
// their mean squared distance to the logits of a frozen reference model ([models.NAME] named
// by `reference`) on the same batch. The kernel runs backward, accumulation, clipping and the
// optimizer on the loss this returns; evaluation runs [model] and [loss] as without a step.
class @{Class} final : public keel::Step {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx)
      : weight_(ctx.get(kWeight)), reference_(ctx.get(kReference)) {}

  at::Tensor compute(keel::StepModels& models, const keel::NamedTensors& batch) override {
    // "model" is the trained [model] (under autograd); a frozen model runs without autograd.
    const at::Tensor logits = keel::need(models.forward("model", batch), "logits");
    const at::Tensor anchor = keel::need(models.forward(reference_, batch), "logits");
    const at::Tensor ce = at::cross_entropy_loss(logits, keel::need(batch, "targets"));
    return ce + (logits - anchor).square().mean() * weight_;
  }

 private:
  double weight_;
  std::string reference_;
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kWeight, kReference};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
