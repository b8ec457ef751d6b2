// Kernel-side handles to plugin instances.
//
// Instance<Abi> owns one instance created by a plugin factory: it checks the instance struct
// (struct_size covers every required 1.0 slot of the kind and none of them is NULL; a refused
// struct is destroyed when its struct_size covers the destroy slot) once at creation, turns a
// KEEL_ERR from any slot into keel::Error prefixed with the component's label, and calls the
// plugin's `destroy` exactly once.
#pragma once

#include <cstddef>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

#include "error.hpp"
#include "host.hpp"
#include "keel/abi.h"
#include "keel/step.h"
#include "loader/registry.hpp"

namespace keel {

template <class Abi>
class Instance {
 public:
  Instance() = default;
  Instance(Abi* vt, std::string label, uint32_t abi_minor = KEEL_ABI_MINOR)
      : vt_(vt), label_(std::move(label)), abi_minor_(abi_minor) {}
  Instance(Instance&& o) noexcept
      : vt_(std::exchange(o.vt_, nullptr)), label_(std::move(o.label_)), abi_minor_(o.abi_minor_) {}
  Instance& operator=(Instance&& o) noexcept {
    reset();
    vt_ = std::exchange(o.vt_, nullptr);
    label_ = std::move(o.label_);
    abi_minor_ = o.abi_minor_;
    return *this;
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  ~Instance() { reset(); }

  explicit operator bool() const { return vt_ != nullptr; }
  Abi* operator->() const { return vt_; }
  void* self() const { return vt_->self; }
  // "[optimizer] optimizer 'adamw' (plugin keel-optimizers)", the prefix of its errors.
  const std::string& label() const { return label_; }
  // The ABI minor its plugin declares: what it knows of the ABI (events, request bits).
  uint32_t abi_minor() const { return abi_minor_; }

  // Calls a slot that reports errors: slot(self, args..., &err). Throws keel::Error on KEEL_ERR
  // (or on a report_error during the call), as "<label>: <what> failed: <message>".
  template <class... Slot, class... Args>
  void call(const char* what, keel_status (*slot)(void*, Slot...), Args&&... args) const {
    keel_error err;
    err.message[0] = '\0';
    const keel_status st = slot(vt_->self, std::forward<Args>(args)..., &err);
    err.message[KEEL_ERROR_CAPACITY - 1] = '\0';  // bounded, whatever the plugin wrote
    const std::string reported = take_reported_error();
    if (st != KEEL_OK) {
      if (err.message[0] == '\0' && reported.empty())
        throw Error(label_ + ": " + what + " failed without a message (the plugin returned "
                    "KEEL_ERR and left keel_error empty)");
      throw Error(label_ + ": " + what + " failed: " + (err.message[0] ? err.message : reported));
    }
    if (!reported.empty()) throw Error(label_ + ": " + what + " failed: " + reported);
  }

  // Calls a slot without an error channel that returns a value, and throws when the plugin
  // reported an error through keel_host.report_error during the call.
  template <class R, class... Slot, class... Args>
  R get(const char* what, R (*slot)(void*, Slot...), Args&&... args) const {
    static_assert(!std::is_void_v<R>, "a slot that returns nothing: use run()");
    R r = slot(vt_->self, std::forward<Args>(args)...);
    check_reported(what);
    return r;
  }

  // Calls a slot without an error channel that returns nothing (set_training, zero_grad, a
  // profiler's begin and end), and throws when the plugin reported an error through
  // keel_host.report_error during the call.
  template <class... Slot, class... Args>
  void run(const char* what, void (*slot)(void*, Slot...), Args&&... args) const {
    slot(vt_->self, std::forward<Args>(args)...);
    check_reported(what);
  }

  // (1.12) The extension `id` the instance offers through get_extension (abi.h, "Extensions"),
  // or nullptr when it offers none or predates the slot.
  const void* extension(const char* id) const {
    if (!KEEL_HAS_FIELD(vt_, Abi, get_extension) || !vt_->get_extension) return nullptr;
    const void* ext = vt_->get_extension(vt_->self, id);
    check_reported("get_extension");
    return ext;
  }

  // An error about what the plugin did: "<label>: <what>".
  Error error(const std::string& what) const { return Error(label_ + ": " + what); }

  void reset() {
    if (vt_) vt_->destroy(vt_->self);
    vt_ = nullptr;
    take_reported_error();
  }

 private:
  void check_reported(const char* what) const {
    const std::string reported = take_reported_error();
    if (!reported.empty()) throw Error(label_ + ": " + what + " failed: " + reported);
  }

  Abi* vt_ = nullptr;
  std::string label_;
  uint32_t abi_minor_ = KEEL_ABI_MINOR;
};

// Size of each instance struct in ABI 1.0: the slots every plugin must provide. Slots
// appended later are optional; use KEEL_HAS_SLOT before calling one. A kind that had not grown
// before 1.12 ends its 1.0 slots where get_extension (1.12) begins.
template <class Abi>
constexpr size_t required_size() {
  return offsetof(Abi, get_extension);
}
template <>
constexpr size_t required_size<keel_loss>() {
  return offsetof(keel_loss, count_items);
}
template <>
constexpr size_t required_size<keel_hook>() {
  return offsetof(keel_hook, state_count);
}
template <>
constexpr size_t required_size<keel_model>() {
  return offsetof(keel_model, state_save);
}
template <>
constexpr size_t required_size<keel_dataset>() {
  return offsetof(keel_dataset, seek);
}
template <>
constexpr size_t required_size<keel_optimizer>() {
  return offsetof(keel_optimizer, state_save);
}
template <>
constexpr size_t required_size<keel_sparse_optimizer>() {
  return offsetof(keel_sparse_optimizer, state_save);
}
template <>
constexpr size_t required_size<keel_mfu>() {
  return offsetof(keel_mfu, peak_flops);
}
// Names of the required slots of each kind, in struct order from `destroy` (for messages);
// the static_assert in create_instance keeps them in step with abi.h.
template <class Abi>
struct SlotNames;
#define KEEL_SLOT_NAMES(ABI, ...)                                     \
  template <>                                                         \
  struct SlotNames<ABI> {                                             \
    static constexpr const char* names[] = {"destroy", __VA_ARGS__}; \
  }
KEEL_SLOT_NAMES(keel_model, "forward", "set_training", "param_count", "param", "state_count",
                "state", "flops_per_sample");
KEEL_SLOT_NAMES(keel_dataset, "size", "batches_per_epoch", "start_epoch", "next");
KEEL_SLOT_NAMES(keel_optimizer, "step", "zero_grad", "group_count", "get_lr", "set_lr");
KEEL_SLOT_NAMES(keel_sparse_optimizer, "step", "get_lr", "set_lr");
KEEL_SLOT_NAMES(keel_lr_scheduler, "factor");
KEEL_SLOT_NAMES(keel_loss, "compute");
KEEL_SLOT_NAMES(keel_grad_clipper, "clip");
KEEL_SLOT_NAMES(keel_mfu, "compute");
KEEL_SLOT_NAMES(keel_profiler, "begin", "end", "flush");
KEEL_SLOT_NAMES(keel_checkpoint, "save", "load");
KEEL_SLOT_NAMES(keel_hook, "on_event");
KEEL_SLOT_NAMES(keel_step, "compute");
#undef KEEL_SLOT_NAMES

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
  const std::string label = "[" + std::string(ctx.section) + "] " + c.label();
  const keel_status st = c.create(&ctx, &out, &err);
  err.message[KEEL_ERROR_CAPACITY - 1] = '\0';
  const std::string reported = take_reported_error();
  if (st != KEEL_OK)
    throw Error(label + ": creation failed" +
                (err.message[0] ? std::string(": ") + err.message
                 : reported.empty()
                     ? std::string(" without a message (the factory returned KEEL_ERR and "
                                   "left keel_error empty)")
                     : ": " + reported));
  if (!out) throw Error(label + ": creation failed: the factory returned KEEL_OK but no instance");
  auto* vt = static_cast<Abi*>(out);
  // Instance structs hold only pointers after struct_size (abi.h): every 1.0 slot must be set.
  // A struct too small to use is still destroyed when it holds a destroy slot (the header).
  if (vt->struct_size < required_size<Abi>() || !vt->destroy) {
    const bool destroyable = KEEL_HAS_FIELD(vt, Abi, destroy) && vt->destroy;
    const Error refused(label + ": creation failed: instance struct is " +
                        std::to_string(vt->struct_size) + " bytes" +
                        (destroyable ? "" : " with no destroy slot") + ", ABI " +
                        std::to_string(KEEL_ABI_MAJOR) + " needs at least " +
                        std::to_string(required_size<Abi>()) +
                        "; hint: rebuild the plugin against this SDK");
    if (destroyable) vt->destroy(vt->self);  // vt is gone after this
    throw refused;
  }
  Instance<Abi> inst(vt, label, c.plugin->descriptor->abi_minor);
  if (!reported.empty()) throw Error(label + ": creation failed: " + reported);
  const auto* slots = reinterpret_cast<void* const*>(&vt->destroy);
  constexpr size_t n = (required_size<Abi>() - offsetof(Abi, destroy)) / sizeof(void*);
  static_assert(n == std::size(SlotNames<Abi>::names), "SlotNames out of step with abi.h");
  for (size_t i = 0; i < n; ++i)
    if (!slots[i])
      throw Error(label + ": creation failed: the instance's slot '" +
                  SlotNames<Abi>::names[i] + "' is NULL; every required slot of the " +
                  kind_name(c.kind) + " struct must be set");
  return inst;
}

}  // namespace keel
