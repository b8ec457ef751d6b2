// Kernel-side handles to plugin instances.
//
// Instance<Abi> owns one instance created by a plugin factory: it checks the instance struct
// (struct_size covers every v1 slot of the kind and no slot is NULL) once at creation, turns a
// KEEL_ERR from any slot into keel::Error prefixed with the component's label, and calls the
// plugin's `destroy` exactly once.
#pragma once

#include <string>
#include <utility>

#include "error.hpp"
#include "keel/abi.h"
#include "registry.hpp"

namespace keel {

template <class Abi>
class Instance {
 public:
  Instance() = default;
  Instance(Abi* vt, std::string label) : vt_(vt), label_(std::move(label)) {}
  Instance(Instance&& o) noexcept : vt_(std::exchange(o.vt_, nullptr)), label_(std::move(o.label_)) {}
  Instance& operator=(Instance&& o) noexcept {
    reset();
    vt_ = std::exchange(o.vt_, nullptr);
    label_ = std::move(o.label_);
    return *this;
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  ~Instance() { reset(); }

  explicit operator bool() const { return vt_ != nullptr; }
  Abi* operator->() const { return vt_; }
  void* self() const { return vt_->self; }
  const std::string& label() const { return label_; }

  // Calls a slot that reports errors: slot(self, args..., &err). Throws keel::Error on KEEL_ERR.
  template <class... Slot, class... Args>
  void call(const char* what, keel_status (*slot)(void*, Slot...), Args&&... args) const {
    keel_error err;
    err.message[0] = '\0';
    if (slot(vt_->self, std::forward<Args>(args)..., &err) != KEEL_OK)
      throw Error(label_ + ": " + what + " failed: " + err.message);
  }

  void reset() {
    if (vt_) vt_->destroy(vt_->self);
    vt_ = nullptr;
  }

 private:
  Abi* vt_ = nullptr;
  std::string label_;
};

// Size of each instance struct in ABI 1.0: the slots every plugin must provide. Slots
// appended later are optional; use has_slot() before calling one.
template <class Abi>
constexpr size_t required_size() {
  return sizeof(Abi);
}
template <>
constexpr size_t required_size<keel_loss>() {
  return offsetof(keel_loss, count_items);
}
template <>
constexpr size_t required_size<keel_hook>() {
  return offsetof(keel_hook, state_count);
}
#define KEEL_HAS_SLOT(instance, type, slot) \
  (KEEL_HAS_FIELD((instance).operator->(), type, slot) && (instance)->slot != nullptr)

// Runs the component's factory and checks the struct it returns. `Abi` must match the
// component's kind (keel_model for KEEL_KIND_MODEL, ...).
template <class Abi>
Instance<Abi> create_instance(const Component& c, keel_create_context ctx) {
  keel_error err;
  err.message[0] = '\0';
  void* out = nullptr;
  ctx.struct_size = sizeof(keel_create_context);
  if (c.create(&ctx, &out, &err) != KEEL_OK)
    throw Error("[" + std::string(ctx.section) + "] " + c.label() + ": creation failed: " +
                err.message);
  if (!out)
    throw Error("[" + std::string(ctx.section) + "] " + c.label() +
                ": factory returned no instance");
  auto* vt = static_cast<Abi*>(out);
  // Instance structs hold only pointers after struct_size (abi.h): every 1.0 slot must be set.
  if (vt->struct_size < required_size<Abi>() || !vt->destroy)
    throw Error(c.label() + ": instance struct is " + std::to_string(vt->struct_size) +
                " bytes, ABI " + std::to_string(KEEL_ABI_MAJOR) + " needs at least " +
                std::to_string(required_size<Abi>()) +
                "; hint: rebuild the plugin against this SDK");
  Instance<Abi> inst(vt, c.label());
  const auto* slots = reinterpret_cast<void* const*>(&vt->destroy);
  const size_t n = (required_size<Abi>() - offsetof(Abi, destroy)) / sizeof(void*);
  for (size_t i = 0; i < n; ++i)
    if (!slots[i])
      throw Error(c.label() + ": instance leaves slot " + std::to_string(i) +
                  " empty; every v1 slot of a " + kind_name(c.kind) + " is required");
  return inst;
}

}  // namespace keel
