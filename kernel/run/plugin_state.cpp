#include "run/plugin_state.hpp"

#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <cstring>

#include "keel/tensor.hpp"

namespace keel {

StateWriter::StateWriter() {
  abi.struct_size = sizeof(abi);
  abi.host_data = this;
  abi.put = &put;
}

int StateWriter::put(keel_state_writer* w, const char* name, keel_tensor* tensor) {
  auto* self = static_cast<StateWriter*>(w->host_data);
  const size_t n = name ? strnlen(name, KEEL_NAME_CAPACITY) : 0;
  const std::string shown = n ? std::string(name, n) : std::string();
  if (n == 0) return self->refuse("an entry with a NULL or empty name");
  if (n == KEEL_NAME_CAPACITY)
    return self->refuse(fmt::format("entry '{}...': the name is longer than {} bytes",
                                    shown.substr(0, 40), KEEL_NAME_CAPACITY - 1));
  if (tensor == nullptr) return self->refuse("entry '" + shown + "' has a NULL tensor");
  const at::Tensor t = borrow(tensor);
  if (dtype_of_name(dtype_name(t.scalar_type())) == at::ScalarType::Undefined)
    return self->refuse("entry '" + shown + "' has dtype " + dtype_name(t.scalar_type()) +
                        ", which checkpoints cannot hold");
  if (!self->names.insert(shown).second)
    return self->refuse("entry '" + shown + "' was put twice");
  self->entries.emplace_back(shown, t.detach());
  return 1;
}

int StateWriter::refuse(std::string why) {
  if (refusal.empty()) refusal = std::move(why);
  return 0;
}

TensorList allocate(const CommitRecord& record, const std::string& stem) {
  TensorList out;
  auto it = record.tensors.find(stem);
  if (it == record.tensors.end()) return out;
  for (const auto& t : it->second) {
    const at::ScalarType type = dtype_of_name(t.dtype);
    if (type == at::ScalarType::Undefined)
      throw Error("checkpoint tensor '" + t.name + "' has unknown dtype '" + t.dtype + "'");
    out.emplace_back(t.name, at::empty(t.shape, at::TensorOptions().dtype(type)));
  }
  return out;
}

std::vector<keel_named_tensor> as_named(const TensorList& list) {
  std::vector<keel_named_tensor> out;
  for (const auto& [name, t] : list) out.push_back({name.c_str(), peek(t)});
  return out;
}

}  // namespace keel
