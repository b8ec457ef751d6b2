// Plugins' tensors as the run sees them: the named entries a model or hook lists (param,
// state), the entries a component's state_save puts, and tensors to load a checkpoint into.
#pragma once

#include <ATen/core/Tensor.h>

#include <set>
#include <string>
#include <vector>

#include "checkpoint/store.hpp"
#include "components.hpp"
#include "keel/abi.h"
#include "bounded.hpp"

namespace keel {

// Entry `i` of a model's or hook's named tensors (param, state), checked: a name and a tensor.
template <class Abi>
keel_named_tensor named_entry(const Instance<Abi>& inst, const char* slot_name,
                              keel_status (*slot)(void*, size_t, const char**, keel_tensor**,
                                                  keel_error*),
                              size_t i) {
  keel_named_tensor nt{};
  inst.call(slot_name, slot, i, &nt.name, &nt.tensor);
  if (!nt.name || !*nt.name || !nt.tensor)
    throw inst.error(std::string(slot_name) + "(" + std::to_string(i) + ") returned a NULL " +
                     (nt.tensor ? "or empty name" : "tensor"));
  if (!terminated_within(nt.name, KEEL_NAME_CAPACITY))
    throw inst.error(std::string(slot_name) + "(" + std::to_string(i) + ") returned a name that "
                     "does not end within " + std::to_string(KEEL_NAME_CAPACITY - 1) +
                     " bytes (\"" + bounded(nt.name, 40) + "...\")");
  return nt;
}

// keel_state_writer of one state_save call: collects the entries, remembers a refusal.
struct StateWriter {
  keel_state_writer abi{};
  TensorList entries;
  std::set<std::string> names;
  std::string refusal;

  StateWriter();
  static int put(keel_state_writer* w, const char* name, keel_tensor* tensor);
  int refuse(std::string why);
};

// The entries of a component's state_save.
template <class Abi>
TensorList save_state(const Instance<Abi>& inst) {
  StateWriter w;
  try {
    inst.call("state_save", inst->state_save, &w.abi);
  } catch (const Error&) {
    if (w.refusal.empty()) throw;
    throw inst.error("state_save failed: " + w.refusal);
  }
  if (!w.refusal.empty()) throw inst.error("state_save: " + w.refusal);
  return std::move(w.entries);
}

// Empty tensors shaped as a commit record's index of object `stem`, to load into.
TensorList allocate(const CommitRecord& record, const std::string& stem);

// The list as the ABI passes it (names and tensors borrowed from `list`).
std::vector<keel_named_tensor> as_named(const TensorList& list);

}  // namespace keel
