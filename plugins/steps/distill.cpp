// step components (ABI 1.13, keel/step.h):
//   distill  knowledge distillation from a frozen teacher ([models.NAME], `teacher`) into the
//            trained [model], the student (Hinton et al. 2015):
//              loss = alpha * KL(softmax(t / T) || softmax(s / T)) * T^2
//                     + (1 - alpha) * cross_entropy(s, y)
//            over the rows of the logits ([N, C], or [batch, time, vocab] as batch x time rows),
//            s the student's logits, t the teacher's, y the batch's class indices ("labels" when
//            the batch has them, else "targets"); rows whose target is -100 count in neither
//            term. KL is summed over classes and averaged over the counted rows, as PyTorch's
//            F.kl_div(F.log_softmax(s / T), F.softmax(t / T), reduction="batchmean") computes
//            it; the cross entropy is the mean over the same rows.
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/kl_div.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/softmax.h>
#include <ATen/core/Reduction.h>

#include <stdexcept>
#include <string>

#include "keel/plugin.hpp"
#include "keel/tensor.hpp"

namespace {

constexpr int64_t kIgnored = -100;  // a target left out (the tokens plugin's padding labels)

constexpr auto kTeacher = keel::opt_string(
    "teacher", "\"teacher\"", "the [models.NAME] that teaches: NAME (a frozen model)");
constexpr auto kAlpha = keel::opt_float(
    "alpha", "0.5", "weight of the distillation term; 1 - alpha weighs the cross entropy", 0, 1);
constexpr auto kTemperature = keel::opt_float(
    "temperature", "2.0", "softmax temperature T of both models' logits in the distillation "
                          "term (scaled by T^2)", 1e-6, 1e6);

namespace text = keel::text;

class Distill : public keel::Step {
 public:
  explicit Distill(const keel::Context& ctx)
      : teacher_(ctx.get(kTeacher)), alpha_(ctx.get(kAlpha)), t_(ctx.get(kTemperature)) {}

  at::Tensor compute(keel::StepModels& models, const keel::NamedTensors& batch) override {
    const at::Tensor* labels = keel::find(batch, "labels");
    const at::Tensor& y = labels ? *labels : keel::need(batch, "targets");
    const at::Tensor s = logits_of(models.forward("model", batch), "model");
    const at::Tensor t = logits_of(models.forward(teacher_, batch), teacher_);
    if (s.sizes() != t.sizes())
      throw std::invalid_argument("the student's logits " + text::shape(s.sizes()) +
                                  " and the teacher's " + text::shape(t.sizes()) +
                                  " differ in shape; hint: both models must predict the same "
                                  "classes (vocabulary) for the same batch");
    const int64_t classes = s.size(-1);
    if (y.numel() * classes != s.numel())
      throw std::invalid_argument("targets " + text::shape(y.sizes()) + " do not match logits " +
                                  text::shape(s.sizes()) + ": one class index per row of the "
                                  "logits (classes along the last dimension)");
    at::Tensor rows_s = s.reshape({-1, classes});
    at::Tensor rows_t = t.reshape({-1, classes});
    at::Tensor ids = y.reshape({-1}).to(at::kLong);
    const at::Tensor ignored = ids.eq(kIgnored);
    if (ignored.any().item<bool>()) {
      const at::Tensor kept = ignored.logical_not().nonzero().reshape({-1});
      rows_s = rows_s.index_select(0, kept);
      rows_t = rows_t.index_select(0, kept);
      ids = ids.index_select(0, kept);
    }
    const int64_t n = ids.numel();
    if (n == 0) return s.sum().mul(0);  // nothing counted: loss 0, gradient 0
    const at::Tensor kd = at::kl_div(at::log_softmax(rows_s.div(t_), -1),
                                     at::softmax(rows_t.div(t_), -1), at::Reduction::Sum)
                              .div(static_cast<double>(n))
                              .mul(t_ * t_);
    const at::Tensor ce = at::cross_entropy_loss(rows_s, ids);
    return kd.mul(alpha_).add(ce.mul(1.0 - alpha_));
  }

 private:
  static at::Tensor logits_of(const keel::NamedTensors& outputs, const std::string& model) {
    const at::Tensor* logits = keel::find(outputs, "logits");
    if (!logits) throw std::invalid_argument("model '" + model + "' gave no logits");
    if (!logits->is_floating_point() || logits->dim() < 2)
      throw std::invalid_argument("model '" + model + "' gave logits " +
                                  text::shape(logits->sizes()) + "; distill needs floating-point "
                                  "logits with the classes along the last dimension");
    return *logits;
  }

  std::string teacher_;
  double alpha_, t_;
};

const keel_option_desc kOptions[] = {kTeacher, kAlpha, kTemperature};
const keel_component_desc kComponents[] = {
    keel::component<Distill>(
        "distill",
        "knowledge distillation from a frozen [models.NAME] teacher into [model]: alpha x "
        "KL(teacher || student at temperature T) x T^2 + (1 - alpha) x cross entropy",
        kOptions),
};

}  // namespace

KEEL_PLUGIN("keel-steps", "0.1.0", "Training steps of one's own", kComponents)
