#include "run/model_view.hpp"

#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <exception>
#include <utility>

#include "error.hpp"
#include "keel/tensor.hpp"

namespace keel {

namespace {

void fail(keel_error* err, const std::string& message) {
  if (!err) return;
  std::strncpy(err->message, message.c_str(), KEEL_ERROR_CAPACITY - 1);
  err->message[KEEL_ERROR_CAPACITY - 1] = '\0';
}

std::string describe(const at::Tensor& t) {
  return std::string(at::toString(t.scalar_type())) + " " + text::shape(t.sizes()) + " on " +
         t.device().str();
}

}  // namespace

ModelViews::ModelViews(const std::vector<keel_named_tensor>& state,
                       const std::vector<at::Tensor>& trainable) {
  for (const keel_named_tensor& nt : state) {
    at::Tensor t = borrow(nt.tensor);
    bool is_parameter = false;
    for (const at::Tensor& p : trainable) is_parameter = is_parameter || p.is_same(t);
    entries_.push_back({nt.name, nt.tensor, std::move(t), is_parameter});
  }
}

void ModelViews::attach(const Instance<keel_hook>& hook, const std::string& sharded_as) {
  const auto* ext = static_cast<const keel_hook_model*>(hook.extension(KEEL_EXT_HOOK_MODEL));
  if (!ext) return;
  if (!KEEL_HAS_FIELD(ext, keel_hook_model, attach) || !ext->attach)
    throw hook.error(std::string(KEEL_EXT_HOOK_MODEL) + " offered without its attach slot");
  if (!sharded_as.empty())
    throw hook.error("reads the model's weights (" KEEL_EXT_HOOK_MODEL "), which ranks hold "
                     "only in shards under [distributed] shard = \"" + sharded_as + "\"; hint: "
                     "use shard = \"none\", \"gradients\" or \"optimizer\" with this hook");
  View& v = views_.emplace_back();
  v.abi.struct_size = sizeof(keel_model_view);
  v.abi.host_data = &v;
  v.abi.count = &ModelViews::count;
  v.abi.entry = &ModelViews::entry;
  v.abi.set_eval_weights = &ModelViews::set_eval_weights;
  v.owner = this;
  v.hook = hook.label();
  hook.call("attach (" KEEL_EXT_HOOK_MODEL ")", ext->attach, &v.abi);
}

size_t ModelViews::count(const keel_model_view* v) {
  return static_cast<const View*>(v->host_data)->owner->entries_.size();
}

keel_status ModelViews::entry(const keel_model_view* v, size_t index, const char** name,
                              keel_tensor** tensor, int32_t* is_parameter, keel_error* err) {
  const ModelViews& self = *static_cast<const View*>(v->host_data)->owner;
  if (index >= self.entries_.size()) {
    fail(err, "model view: entry " + std::to_string(index) + " asked, the model has " +
                  std::to_string(self.entries_.size()));
    return KEEL_ERR;
  }
  const Entry& e = self.entries_[index];
  if (name) *name = e.name.c_str();
  if (tensor) *tensor = e.handle;
  if (is_parameter) *is_parameter = e.is_parameter ? 1 : 0;
  return KEEL_OK;
}

std::string ModelViews::mismatch(const std::vector<at::Tensor>& weights) const {
  if (weights.size() != entries_.size())
    return std::to_string(weights.size()) + " tensors for the model's " +
           std::to_string(entries_.size()) + " entries";
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    const at::Tensor& m = entries_[i].tensor;
    if (!w.defined()) return "entry " + std::to_string(i) + " ('" + entries_[i].name + "') is NULL";
    if (w.sizes() != m.sizes() || w.scalar_type() != m.scalar_type() || w.device() != m.device())
      return "entry " + std::to_string(i) + " ('" + entries_[i].name + "') is " + describe(w) +
             ", the model's is " + describe(m);
  }
  return "";
}

keel_status ModelViews::set_eval_weights(const keel_model_view* v, keel_tensor* const* tensors,
                                         size_t count, keel_error* err) {
  const View& view = *static_cast<const View*>(v->host_data);
  ModelViews& self = *view.owner;
  if (!self.eval_owner_.empty() && self.eval_owner_ != view.hook) {
    fail(err, "set_eval_weights: " + self.eval_owner_ + " set the evaluation's weights already; "
              "one hook of a run at a time may");
    return KEEL_ERR;
  }
  if (count == 0) {
    self.eval_weights_.clear();
    self.eval_owner_.clear();
    return KEEL_OK;
  }
  if (!tensors) {
    fail(err, "set_eval_weights: tensors is NULL with count " + std::to_string(count));
    return KEEL_ERR;
  }
  std::vector<at::Tensor> weights;
  for (size_t i = 0; i < count; ++i) weights.push_back(borrow(tensors[i]));
  if (std::string why = self.mismatch(weights); !why.empty()) {
    fail(err, "set_eval_weights: " + why);
    return KEEL_ERR;
  }
  self.eval_weights_ = std::move(weights);
  self.eval_owner_ = view.hook;
  return KEEL_OK;
}

ModelViews::ForEvaluation::ForEvaluation(const ModelViews* views) : views_(views) {
  if (!views_ || views_->eval_weights_.empty()) return;
  if (std::string why = views_->mismatch(views_->eval_weights_); !why.empty())
    throw Error(views_->eval_owner_ + ": its evaluation weights no longer fit the model: " + why);
  const at::NoGradGuard no_grad;
  for (size_t i = 0; i < views_->entries_.size(); ++i) {
    const at::Tensor& m = views_->entries_[i].tensor;
    saved_.push_back(m.clone());
    m.copy_(views_->eval_weights_[i]);
  }
}

void ModelViews::ForEvaluation::restore() {
  const at::NoGradGuard no_grad;
  for (size_t i = 0; i < saved_.size(); ++i) views_->entries_[i].tensor.copy_(saved_[i]);
  saved_.clear();
}

ModelViews::ForEvaluation::~ForEvaluation() {
  try {
    restore();
  } catch (const std::exception& e) {  // same shapes, same device: not expected
    spdlog::error("restoring the model's weights after a failed evaluation failed too: {}",
                  e.what());
  }
}

}  // namespace keel
