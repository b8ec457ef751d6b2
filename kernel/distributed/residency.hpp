// Where the whole parameters live with [distributed] shard = "parameters" (FSDP-style): between
// uses nowhere. Each rank keeps its rows of every parameter in the shard's own storage (the
// "home": the leaf the optimizer updates in place, ShardedParams' layout), and a parameter's
// whole values exist only while its unit (abi.h "Model units") is computed with:
//
//   enter(u)       (the model, before unit u's forward) all-gathers u's rows from every rank
//                  into the parameters' storage
//   leave(u, out)  (the model, after it) hooks `out` when they carry gradients, then frees the
//                  parameters' storage
//   hook on out    (autograd, before u's backward) all-gathers them again
//   unit u's gradients complete: reduce-scattered (GradReduceScatter, one group per unit, sent
//                  in descending unit order, the root last), then the storage freed again
//
// The root (parameters outside every unit: embeddings, a final norm, a tied output layer; a
// model without units is all root) is gathered before each micro-batch's forward and freed
// after its backward. There is no all-gather after the optimizer step: the next forward gathers
// the updated rows.
//
// Freeing keeps each parameter's TensorImpl and StorageImpl (sizes, strides, autograd metadata,
// version counter) and drops only the StorageImpl's memory (StorageImpl::reset, as FSDP's
// free_storage); gathering allocates it again (alloc_storage). Behind the C ABI this is the way
// that works: the views of a weight that autograd saved in forward (weight.t() inside a linear)
// share the StorageImpl, so they see the gathered values again in backward. The all-gather
// writes through a separate tensor over the same storage (the padded buffer), so the
// parameter's version counter never changes and autograd's saved-version checks pass.
//
// Evaluation gathers the whole model for its duration (gather_all, free_all); enter and leave
// do nothing meanwhile. Checkpoint saves read each rank's rows from the shards (their homes),
// so they gather nothing.
//
// Accounting (the train records' param_mb_* keys): the bytes of parameter values this rank
// holds, the homes (1/W of every parameter, padded to whole chunks) plus whatever is gathered,
// sampled in training steps at every gather and before every free (not during gather_all);
// "outside" leaves out the units being computed (entered and not left, or gathered for their
// backward and not yet freed) and the root.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "keel/abi.h"

namespace keel {

class Collectives;
class ShardedParams;

class Residency {
 public:
  // `unit_of`: per parameter of `shards`, its unit (-1: the root), each < `units`. Takes
  // `shards`' group-sent callback.
  Residency(Collectives& collectives, ShardedParams& shards, std::vector<int32_t> unit_of,
            int32_t units);
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;

  // The groups GradReduceScatter reduces (parameter indices): one per unit with parameters, in
  // descending unit order, then the root (when it has parameters).
  static std::vector<std::vector<size_t>> groups_of(const std::vector<int32_t>& unit_of,
                                                    int32_t units);
  // What the model's set_unit_calls gets (valid while this object lives).
  const keel_unit_calls* abi_calls() const { return &calls_; }

  // Once the parameters hold their starting values on every rank (after the broadcast from
  // rank 0 or a resume): each rank's rows into the homes, then every whole parameter freed.
  void start();
  // Before each micro-batch's forward: the root gathered (a no-op while already).
  void before_forward(const std::string& what);
  // After each backward (the unit groups were reduce-scattered and freed): the root, and
  // anything else still gathered, freed.
  void after_backward();
  // GradReduceScatter sent group g: its unit's whole parameters are not needed any more.
  void group_sent(size_t group);
  // The whole model gathered until free_all (evaluation).
  void gather_all(const std::string& what);
  void free_all();

  // Collectives issued so far (all-gathers).
  int64_t issued() const { return issued_; }
  // "U unit(s) and a root of X MiB" for the log.
  std::string describe() const;
  // The peaks since the last call, in MiB: {outside the units being computed and the root,
  // everything resident}; then restarts both from what is resident now.
  std::pair<double, double> take_peaks();

 private:
  static keel_status enter(const keel_unit_calls* calls, int32_t unit, keel_error* err);
  static keel_status leave(const keel_unit_calls* calls, int32_t unit,
                           keel_tensor* const* outputs, size_t count, keel_error* err);
  size_t slot(int32_t unit) const;  // index into members_ (the root last)
  void gather(size_t s, const std::string& what);
  void release(size_t s);  // after a sample, unless pinned
  void drop(size_t s);     // the storage freed
  void pre_backward(size_t s);
  void sample();

  Collectives& collectives_;
  ShardedParams& shards_;
  int32_t units_;
  std::vector<std::vector<size_t>> members_;  // per unit, then the root
  std::vector<int64_t> bytes_;                // per slot: the whole parameters' bytes (padded)
  std::vector<bool> gathered_, active_;       // per slot
  std::vector<size_t> group_slot_;  // per reduce-scatter group
  int32_t entered_ = -2;  // the unit between enter and leave (-2: none)
  bool pinned_ = false;   // gather_all: everything stays until free_all
  int64_t issued_ = 0;
  int64_t home_bytes_ = 0, gathered_bytes_ = 0, active_bytes_ = 0;
  int64_t peak_outside_ = 0, peak_resident_ = 0;
  keel_unit_calls calls_{};
};

}  // namespace keel
