// Conversions between keel_tensor handles and at::Tensor; keel's dtypes; a shape as text;
// named tensors (a batch, a model's outputs: keel/ext/batch.h).
//
// A keel_tensor* is an at::TensorImpl* that carries one reference count when it is "new" and
// none when it is "borrowed" (see abi.h). These conversions are only valid between binaries
// built against the same LibTorch with the same C++ ABI, which is what the build fingerprint
// check at load time guarantees. Plain C plugins never see at::Tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "keel/abi.h"
#include "keel/ext/tensors.h"

namespace keel {

using TensorImplPtr = c10::intrusive_ptr<at::TensorImpl, c10::UndefinedTensorImpl>;

// A new at::Tensor sharing the handle's storage; the handle keeps its own reference.
inline at::Tensor borrow(const keel_tensor* handle) {
  if (handle == nullptr) return at::Tensor();
  auto* impl = reinterpret_cast<at::TensorImpl*>(const_cast<keel_tensor*>(handle));
  return at::Tensor(TensorImplPtr::reclaim_copy(impl));
}

// Takes over the handle's reference (the handle must be "new"); the handle is spent.
inline at::Tensor adopt(keel_tensor* handle) {
  if (handle == nullptr) return at::Tensor();
  return at::Tensor(TensorImplPtr::reclaim(reinterpret_cast<at::TensorImpl*>(handle)));
}

// Hands one reference to the receiver: the result is a "new" handle (NULL for undefined).
inline keel_tensor* give(at::Tensor tensor) {
  if (!tensor.defined()) return nullptr;
  return reinterpret_cast<keel_tensor*>(tensor.unsafeReleaseTensorImpl());
}

// A borrowed handle to `tensor`, valid while `tensor` (or another owner of it) lives.
inline keel_tensor* peek(const at::Tensor& tensor) {
  if (!tensor.defined()) return nullptr;
  return reinterpret_cast<keel_tensor*>(tensor.unsafeGetTensorImpl());
}

// The dtypes a keel_tensor may have: the ABI's keel_dtype, LibTorch's scalar type, and the
// name the safetensors format gives it (which keel's checkpoint commit record uses too).
struct Dtype {
  keel_dtype keel;
  at::ScalarType torch;
  const char* name;
};
inline constexpr Dtype kDtypes[] = {
    {KEEL_DTYPE_F32, at::kFloat, "F32"}, {KEEL_DTYPE_F64, at::kDouble, "F64"},
    {KEEL_DTYPE_F16, at::kHalf, "F16"},  {KEEL_DTYPE_BF16, at::kBFloat16, "BF16"},
    {KEEL_DTYPE_I64, at::kLong, "I64"},  {KEEL_DTYPE_I32, at::kInt, "I32"},
    {KEEL_DTYPE_I8, at::kChar, "I8"},    {KEEL_DTYPE_U8, at::kByte, "U8"},
    {KEEL_DTYPE_BOOL, at::kBool, "BOOL"},
};

// The row of kDtypes for a LibTorch scalar type, a keel_dtype or a name; nullptr for none.
inline const Dtype* dtype_of(at::ScalarType type) {
  for (const Dtype& d : kDtypes)
    if (d.torch == type) return &d;
  return nullptr;
}
inline const Dtype* dtype_of(keel_dtype type) {
  for (const Dtype& d : kDtypes)
    if (d.keel == type) return &d;
  return nullptr;
}
inline const Dtype* dtype_named(const std::string& name) {
  for (const Dtype& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

// Tensors by name, in order (a batch, a model's outputs, state).
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The tensor named `name` in `set`, or nullptr.
inline const at::Tensor* find(const NamedTensors& set, const std::string& name) {
  for (const auto& kv : set)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

// The tensors of a keel_tensor_set lent to this side, as new at::Tensor references (valid after
// the call that lent them, as the at::Tensors hold their own references).
inline NamedTensors to_named(const keel_tensor_set* set) {
  NamedTensors out;
  out.reserve(set->count);
  for (size_t i = 0; i < set->count; ++i) out.emplace_back(set->names[i], borrow(set->tensors[i]));
  return out;
}

// A keel_tensor_set lending `tensors` (which must outlive it) for one call: a batch or a model's
// outputs handed across the boundary (keel/ext/tensors.h).
class TensorSetView {
 public:
  explicit TensorSetView(const NamedTensors& tensors) {
    for (const auto& kv : tensors) {
      names_.push_back(kv.first.c_str());
      handles_.push_back(peek(kv.second));
    }
    set_.struct_size = static_cast<uint32_t>(sizeof(keel_tensor_set));
    set_.count = handles_.size();
    set_.names = names_.data();
    set_.tensors = handles_.data();
  }
  TensorSetView(const TensorSetView&) = delete;
  TensorSetView& operator=(const TensorSetView&) = delete;
  const keel_tensor_set* abi() const { return &set_; }

 private:
  std::vector<const char*> names_;
  std::vector<keel_tensor*> handles_;
  keel_tensor_set set_{};
};

// "a, b, c": the names of `set` ("none" when empty), for messages.
inline std::string names_of(const NamedTensors& set) {
  std::string out;
  for (const auto& kv : set) out += (out.empty() ? "" : ", ") + kv.first;
  return out.empty() ? "none" : out;
}

namespace text {

// A shape as text: "[2, 3]" ("[]" for a scalar), as LibTorch prints sizes.
inline std::string shape(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

}  // namespace text

}  // namespace keel
