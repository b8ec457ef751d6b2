#include "run/observers.hpp"

#include <string>

#include "error.hpp"
#include "keel/tensor.hpp"
#include "run/metric_writer.hpp"

namespace keel {

namespace {

void check_returned(const Instance<keel_hook>& hook, const char* slot, const LentSet& lent) {
  if (const std::string name = lent.kept(); !name.empty())
    throw hook.error(std::string(slot) + " kept a reference to the lent tensor '" + name +
                     "' (or its storage) after returning; hint: lent tensors are valid only "
                     "during the call: copy what the hook needs (.clone())");
}

}  // namespace

void Observers::add(const Instance<keel_hook>& hook) {
  const auto* ext = static_cast<const keel_hook_observe*>(hook.extension(KEEL_EXT_HOOK_OBSERVE));
  if (!ext) return;
  if (!KEEL_HAS_FIELD(ext, keel_hook_observe, put_metrics))
    throw hook.error(std::string(KEEL_EXT_HOOK_OBSERVE) + ": its struct_size " +
                     std::to_string(ext->struct_size) + " is smaller than the extension's " +
                     std::to_string(sizeof(keel_hook_observe)));
  hooks_.push_back({&hook, ext});
}

void Observers::batch(int64_t index, const Named& batch) const {
  for (const Hook& h : hooks_) {
    if (!h.ext->on_batch) continue;
    const LentSet lent(batch);
    h.hook->call("on_batch (" KEEL_EXT_HOOK_OBSERVE ")", h.ext->on_batch, index, lent.abi());
    check_returned(*h.hook, "on_batch", lent);
  }
}

void Observers::eval_batch(const char* split, const Named& batch, const Named& outputs) const {
  for (const Hook& h : hooks_) {
    if (!h.ext->on_eval_batch) continue;
    const LentSet in(batch), out(outputs);
    h.hook->call("on_eval_batch (" KEEL_EXT_HOOK_OBSERVE ")", h.ext->on_eval_batch, split,
                 in.abi(), out.abi());
    check_returned(*h.hook, "on_eval_batch", in);
    check_returned(*h.hook, "on_eval_batch", out);
  }
}

void Observers::metrics(const char* split,
                        std::vector<std::pair<std::string, double>>& record) const {
  for (const Hook& h : hooks_) {
    if (!h.ext->put_metrics) continue;
    std::vector<std::string> taken;
    for (const auto& kv : record) taken.push_back(kv.first);
    MetricWriter w(taken, std::string("the ") + split + " record");
    try {
      h.hook->call("put_metrics (" KEEL_EXT_HOOK_OBSERVE ")", h.ext->put_metrics, split, &w.abi);
    } catch (const Error&) {
      if (w.refusal.empty()) throw;
      throw h.hook->error("put_metrics failed: " + w.refusal);
    }
    if (!w.refusal.empty()) throw h.hook->error("put_metrics: " + w.refusal);
    record.insert(record.end(), w.metrics.begin(), w.metrics.end());
  }
}

}  // namespace keel
