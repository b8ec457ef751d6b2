#include "run/model_calls.hpp"

#include <fmt/format.h>

#include "keel/tensor.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

// The extension `id` of `instance`, refused when its struct_size does not cover `Ext`.
// `required`: whether the extension's required slot is set.
template <class Ext, class Abi>
const Ext* batch_extension(const Instance<Abi>& instance, const char* id,
                           bool (*required)(const Ext&), const char* slot) {
  const auto* ext = static_cast<const Ext*>(instance.extension(id));
  if (ext && ext->struct_size < sizeof(Ext))
    throw instance.error(fmt::format("{}: its struct_size {} is smaller than the extension's {}",
                                     id, ext->struct_size, sizeof(Ext)));
  if (ext && !required(*ext))
    throw instance.error(fmt::format("{}: its {} is NULL; hint: the extension's {} is required "
                                     "(keel/ext/batch.h)", id, slot, slot));
  return ext;
}

// Calls a slot that fills a TensorWriter; a refused put fails naming the slot and the reason.
template <class Abi, class... Slot, class... Args>
void call_writing(const Instance<Abi>& instance, const char* what, TensorWriter& out,
                  keel_status (*slot)(void*, Slot...), Args&&... args) {
  try {
    instance.call(what, slot, std::forward<Args>(args)...);
  } catch (const Error&) {
    if (out.refusal.empty()) throw;
  }
  if (!out.refusal.empty())
    throw instance.error(fmt::format("{}: {}; hint: each tensor once, under a non-empty name "
                                     "shorter than {} bytes (keel/ext/tensors.h)", what,
                                     out.refusal, KEEL_NAME_CAPACITY));
}

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

// A batch's checks (keel/ext/batch.h), naming the dataset and the tensor.
void check_batch(const Instance<keel_dataset>& data, const MicroBatch& mb,
                 const at::Device& device) {
  if (mb.tensors.empty())
    throw data.error("next (" KEEL_EXT_DATASET_BATCH ") returned a batch without tensors");
  for (const auto& [name, t] : mb.tensors)
    if (!t.defined())
      throw data.error("next returned a batch without " + name + " (a NULL tensor)");
  if (mb.samples <= 0 || mb.tokens < 0)
    throw data.error(fmt::format("next returned a batch with samples = {} and tokens = {}; a "
                                 "batch holds samples >= 1 and tokens >= 0", mb.samples,
                                 mb.tokens));
  const auto& [first, t0] = mb.tensors.front();
  for (const auto& [name, t] : mb.tensors) {
    if (!t.is_cpu() && t.device() != device)
      throw data.error(fmt::format("next returned '{}' on {}; a dataset gives tensors on the "
                                   "CPU (or the run's device, {}), which the kernel moves to "
                                   "the run's device", name, t.device().str(), device.str()));
    if (t.dim() == 0)
      throw data.error(fmt::format("next returned '{}' as a 0-dim tensor; the first dimension "
                                   "of every tensor of a batch is the batch", name));
    if (t.size(0) != t0.size(0))
      throw data.error(fmt::format("next returned {} {} and {} {} whose first dimension differs; "
                                   "the first dimension of every tensor is the batch", first,
                                   text::shape(t0.sizes()), name, text::shape(t.sizes())));
  }
}

}  // namespace

DataSource with_batches(const Instance<keel_dataset>& data) {
  return {&data, batch_extension<keel_dataset_batch>(
                     data, KEEL_EXT_DATASET_BATCH,
                     [](const keel_dataset_batch& e) { return e.next != nullptr; }, "next")};
}
ModelCalls with_batches(const Instance<keel_model>& model) {
  return {&model, batch_extension<keel_model_batch>(
                      model, KEEL_EXT_MODEL_BATCH,
                      [](const keel_model_batch& e) { return e.forward != nullptr; }, "forward")};
}
LossCalls with_batches(const Instance<keel_loss>& loss) {
  return {&loss, batch_extension<keel_loss_batch>(
                     loss, KEEL_EXT_LOSS_BATCH,
                     [](const keel_loss_batch& e) { return e.compute != nullptr; }, "compute")};
}

const at::Tensor& MicroBatch::need(const char* name, const std::string& who,
                                   const char* hint) const {
  if (const at::Tensor* t = find(tensors, name)) return *t;
  throw Error(fmt::format("{} reads the batch's '{}', which {} does not give (its batch holds: "
                          "{}); hint: {}", who, name,
                          source ? source->label() : std::string("the dataset"),
                          names_of(tensors), hint));
}

NextResult next_batch(const DataSource& source, const at::Device& device, MicroBatch* out) {
  const Instance<keel_dataset>& data = *source.data;
  MicroBatch mb;
  mb.source = &data;
  int has = 0;
  if (source.named) {
    TensorWriter w;
    call_writing(data, "next (" KEEL_EXT_DATASET_BATCH ")", w, source.named->next, &w.abi,
                 &mb.samples, &mb.tokens, &has);
    const NextResult result = next_result(data, has);
    if (result != NextResult::kBatch) return result;
    mb.tensors = std::move(w.tensors);
  } else {
    keel_batch b{};
    data.call("next", data->next, &b, &has);
    const NextResult result = next_result(data, has);
    if (result != NextResult::kBatch) return result;
    mb.tensors = {{"inputs", adopt(b.inputs)}, {"targets", adopt(b.targets)}};
    mb.samples = b.samples;
    mb.tokens = b.tokens;
  }
  check_batch(data, mb, device);
  if (!device.is_cpu())
    for (auto& kv : mb.tensors) kv.second = kv.second.to(device, /*non_blocking=*/true);
  *out = std::move(mb);
  return NextResult::kBatch;
}

Named forward(const ModelCalls& calls, const MicroBatch& mb) {
  const Instance<keel_model>& model = *calls.model;
  const int64_t batch = mb.tensors.front().second.size(0);
  Named outputs;
  if (calls.named) {
    TensorWriter w;
    const LentSet lent(mb.tensors);
    call_writing(model, "forward (" KEEL_EXT_MODEL_BATCH ")", w, calls.named->forward,
                 lent.abi(), &w.abi);
    outputs = std::move(w.tensors);
    if (outputs.size() == KEEL_MAX_NAMED_TENSORS)  // hooks get one more: the batch's "loss"
      throw model.error(fmt::format("forward (" KEEL_EXT_MODEL_BATCH ") put {} outputs; a model "
                                    "puts at most {} (KEEL_MAX_NAMED_TENSORS - 1)",
                                    outputs.size(), KEEL_MAX_NAMED_TENSORS - 1));
    if (!find(outputs, "logits"))
      throw model.error("forward (" KEEL_EXT_MODEL_BATCH ") put no 'logits' (it put: " +
                        names_of(outputs) + "); hint: 'logits' is the model's output for the "
                        "batch, which every loss reads");
  } else {
    const at::Tensor& x = mb.need("inputs", model.label() + ": forward (1.x)");
    keel_tensor* out = nullptr;
    model.call("forward", model->forward, peek(x), &out);
    outputs = {{"logits", adopt(out)}};
    if (!outputs[0].second.defined()) throw model.error("forward returned no tensor (NULL output)");
  }
  const at::Tensor& y = *find(outputs, "logits");
  if (y.dim() == 0 || y.size(0) != batch)
    throw model.error(fmt::format("forward returned logits of shape {} for a batch of {}; its "
                                  "first dimension must be the batch", text::shape(y.sizes()),
                                  batch));
  return outputs;
}

at::Tensor with_aux_losses(const ModelCalls& calls, const Named& outputs, at::Tensor loss) {
  for (const auto& [name, t] : outputs) {
    if (name != "aux_loss" && name.rfind("aux_loss.", 0) != 0) continue;
    if (t.dim() != 0 || !t.is_floating_point())
      throw calls.model->error(fmt::format(
          "forward ({}) put '{}' of shape {}; an auxiliary loss (aux_loss, aux_loss.NAME) is a "
          "0-dim floating-point tensor", calls.named ? KEEL_EXT_MODEL_BATCH : "1.x", name,
          text::shape(t.sizes())));
    loss = loss.add(t);
  }
  return loss;
}

at::Tensor compute_loss(const LossCalls& calls, const Named& outputs, const MicroBatch& mb,
                        int64_t* count, bool training) {
  const Instance<keel_loss>& loss = *calls.loss;
  keel_tensor* l = nullptr;
  *count = -1;
  if (calls.named) {
    const LentSet out(outputs), in(mb.tensors);
    loss.call("compute (" KEEL_EXT_LOSS_BATCH ")", calls.named->compute, out.abi(), in.abi(), &l,
              count);
  } else {
    const at::Tensor& y = mb.need("targets", loss.label() + ": compute (1.x)");
    loss.call("compute", loss->compute, peek(*find(outputs, "logits")), peek(y), &l, count);
  }
  return checked_loss(loss, adopt(l), *count, training, "compute");
}

bool counts_items(const LossCalls& calls) {
  return calls.named ? calls.named->count_items != nullptr
                     : KEEL_HAS_SLOT(*calls.loss, keel_loss, count_items);
}

int64_t count_items(const LossCalls& calls, const MicroBatch& mb) {
  const Instance<keel_loss>& loss = *calls.loss;
  if (!counts_items(calls)) return -1;
  if (calls.named) {
    const LentSet in(mb.tensors);
    return loss.get("count_items (" KEEL_EXT_LOSS_BATCH ")", calls.named->count_items, in.abi());
  }
  const at::Tensor& y = mb.need("targets", loss.label() + ": count_items (1.x)");
  return loss.get("count_items", loss->count_items, peek(y));
}

void metric_update(const LossCalls& calls, const Named& outputs, const MicroBatch& mb,
                   double batch_loss, int64_t count, double* state, size_t size) {
  const Instance<keel_loss>& loss = *calls.loss;
  if (calls.named && calls.named->metric_update) {
    const LentSet out(outputs), in(mb.tensors);
    loss.call("metric_update (" KEEL_EXT_LOSS_BATCH ")", calls.named->metric_update, out.abi(),
              in.abi(), batch_loss, count, state, size);
    return;
  }
  const at::Tensor& y = mb.need("targets", loss.label() + ": metric_update (1.x)");
  loss.call("metric_update", loss->metric_update, peek(*find(outputs, "logits")), peek(y),
            batch_loss, count, state, size);
}

at::Tensor linear_loss_of(const Instance<keel_model>& model, const Instance<keel_loss>& loss,
                          const MicroBatch& mb, int64_t* count) {
  // (The plan chose these slots for the model and loss at assembly, whatever the batches hold.)
  const char* hint = "forward_features and compute_linear read 1.x batches; use a loss without "
                     "compute_linear (token_cross_entropy instead of chunked_cross_entropy)";
  const at::Tensor& x = mb.need("inputs", model.label() + ": forward_features", hint);
  const at::Tensor& y = mb.need("targets", loss.label() + ": compute_linear", hint);
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
