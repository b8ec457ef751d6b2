// Conversions between keel_tensor handles and at::Tensor.
//
// A keel_tensor* is an at::TensorImpl* that carries one reference count when it is "new" and
// none when it is "borrowed" (see abi.h). These conversions are only valid between binaries
// built against the same LibTorch with the same C++ ABI, which is what the build fingerprint
// check at load time guarantees. Plain C plugins never see at::Tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include "keel/abi.h"

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

}  // namespace keel
