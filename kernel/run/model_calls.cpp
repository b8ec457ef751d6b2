#include "run/model_calls.hpp"

#include <fmt/format.h>

#include "keel/tensor.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

// What the loss's `call` (compute or compute_linear) returned, checked.
at::Tensor checked_loss(const Instance<keel_loss>& loss, at::Tensor v, int64_t count,
                        bool training, const std::string& call) {
  if (!v.defined()) throw loss.error(call + " returned no loss tensor (NULL)");
  if (v.dim() != 0)
    throw loss.error(call + " returned a tensor of shape " + text::shape(v.sizes()) +
                     "; expected a scalar loss (a 0-dim tensor, the mean over the batch)");
  if (!v.is_floating_point())
    throw loss.error(call + " returned a loss of dtype " + c10::toString(v.scalar_type()) +
                     "; a loss must be a floating-point tensor");
  if (training && !v.requires_grad())
    throw loss.error(call + " returned a loss that does not require grad, so backward cannot "
                     "reach the model (was it detached, or computed under no_grad?)");
  if (count < 0)
    throw loss.error(fmt::format("{} reported count = {}; it must set the number of items it "
                                 "averaged over (>= 0)", call, count));
  return v;
}

}  // namespace

MicroBatch checked_batch(const Instance<keel_dataset>& data, const keel_batch& b) {
  MicroBatch mb{adopt(b.inputs), adopt(b.targets), b.samples, b.tokens};
  if (!mb.inputs.defined() || !mb.targets.defined())
    throw data.error(std::string("next returned a batch without ") +
                     (mb.inputs.defined() ? "targets" : "inputs") + " (a NULL tensor)");
  if (b.samples <= 0 || b.tokens < 0)
    throw data.error(fmt::format("next returned a batch with samples = {} and tokens = {}; a "
                                 "batch holds samples >= 1 and tokens >= 0", b.samples,
                                 b.tokens));
  if (mb.inputs.dim() == 0 || mb.targets.dim() == 0 || mb.inputs.size(0) != mb.targets.size(0))
    throw data.error("next returned inputs " + text::shape(mb.inputs.sizes()) + " and targets " +
                     text::shape(mb.targets.sizes()) +
                     " whose first dimension differs; the first dimension is the batch");
  return mb;
}

MicroBatch on_device(const at::Device& device, MicroBatch mb) {
  if (device.is_cpu()) return mb;
  mb.inputs = mb.inputs.to(device, /*non_blocking=*/true);
  mb.targets = mb.targets.to(device, /*non_blocking=*/true);
  return mb;
}

at::Tensor forward(const Instance<keel_model>& model, const at::Tensor& x) {
  keel_tensor* out = nullptr;
  model.call("forward", model->forward, peek(x), &out);
  at::Tensor y = adopt(out);
  if (!y.defined()) throw model.error("forward returned no tensor (NULL output)");
  if (y.dim() == 0 || y.size(0) != x.size(0))
    throw model.error(fmt::format("forward returned shape {} for inputs {}; its first dimension "
                                  "must be the batch ({})", text::shape(y.sizes()),
                                  text::shape(x.sizes()), x.size(0)));
  return y;
}

at::Tensor compute_loss(const Instance<keel_loss>& loss, const at::Tensor& out,
                        const at::Tensor& y, int64_t* count, bool training) {
  keel_tensor* l = nullptr;
  *count = -1;
  loss.call("compute", loss->compute, peek(out), peek(y), &l, count);
  return checked_loss(loss, adopt(l), *count, training, "compute");
}

at::Tensor linear_loss_of(const Instance<keel_model>& model, const Instance<keel_loss>& loss,
                          const at::Tensor& x, const at::Tensor& y, int64_t* count) {
  keel_tensor* f = nullptr;
  keel_tensor* w = nullptr;
  model.call("forward_features", model->forward_features, peek(x), &f, &w);
  const at::Tensor features = adopt(f), weight = adopt(w);
  if (!features.defined() || !weight.defined())
    throw model.error(std::string("forward_features returned no ") +
                      (features.defined() ? "weight" : "features") + " (a NULL tensor)");
  if (features.dim() < 2 || features.size(0) != x.size(0) || weight.dim() != 2 ||
      weight.size(1) != features.size(-1))
    throw model.error(fmt::format("forward_features returned features {} and weight {} for "
                                  "inputs {}; expected features [batch ({}), ..., F] and weight "
                                  "[V, F]", text::shape(features.sizes()),
                                  text::shape(weight.sizes()), text::shape(x.sizes()), x.size(0)));
  keel_tensor* l = nullptr;
  *count = -1;
  loss.call("compute_linear", loss->compute_linear, peek(features), peek(weight), peek(y), &l,
            count);
  return checked_loss(loss, adopt(l), *count, true, "compute_linear");
}

}  // namespace keel
