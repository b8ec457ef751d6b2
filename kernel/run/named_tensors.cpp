#include "run/named_tensors.hpp"

#include <fmt/format.h>

#include <cstring>

#include "keel/tensor.hpp"

namespace keel {

LentSet::LentSet(const Named& named) : named_(named), view_(named) {
  for (const auto& kv : named) refs_.push_back(count(kv.second));
}

std::string LentSet::kept() const {
  for (size_t i = 0; i < named_.size(); ++i)
    if (count(named_[i].second) != refs_[i]) return named_[i].first;
  return "";
}

std::pair<size_t, size_t> LentSet::count(const at::Tensor& t) {
  return {t.use_count(), t.has_storage() ? t.storage().use_count() : 0};
}

TensorWriter::TensorWriter() {
  abi.struct_size = sizeof(abi);
  abi.host_data = this;
  abi.put = &TensorWriter::put;
}

int TensorWriter::put(keel_tensor_writer* w, const char* name, keel_tensor* tensor) noexcept {
  auto* self = static_cast<TensorWriter*>(w->host_data);
  auto refuse = [&](std::string why) {
    if (self->refusal.empty()) self->refusal = std::move(why);
    return 0;
  };
  try {
    const size_t len = name ? strnlen(name, KEEL_NAME_CAPACITY) : 0;
    if (len == 0) return refuse("a tensor put without a name (NULL or empty)");
    const std::string n(name, len);
    if (len == KEEL_NAME_CAPACITY)
      return refuse(fmt::format("the name '{}...' is {} bytes or longer (KEEL_NAME_CAPACITY)",
                                n.substr(0, 32), KEEL_NAME_CAPACITY));
    if (!tensor) return refuse("'" + n + "' put without a tensor (NULL)");
    if (find(self->tensors, n.c_str())) return refuse("'" + n + "' put twice");
    if (self->tensors.size() == KEEL_MAX_NAMED_TENSORS)
      return refuse(fmt::format("'{}' is one tensor more than {} (KEEL_MAX_NAMED_TENSORS)", n,
                                KEEL_MAX_NAMED_TENSORS));
    self->tensors.emplace_back(n, borrow(tensor));
    return 1;
  } catch (...) {  // out of memory: nothing crosses back into the plugin
    return refuse("the host could not keep a tensor (out of memory)");
  }
}

}  // namespace keel
