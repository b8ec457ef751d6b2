// The parameters split over the ranks on dim 0 ([distributed] shard, abi.h "Sharded
// parameters"), as FSDP2 lays them out: parameter k of R_k rows is cut into chunks of
// c_k = ceil(R_k / W) rows, and rank r holds rows [r c_k, min((r + 1) c_k, R_k)) (possibly none;
// a 0-dim parameter counts as one row). The optimizer and the gradient clipper get these shards
// instead of the whole parameters, so each rank keeps the optimizer state of its rows only.
//
// Layout. Every parameter's values move once, at setup, into a storage of c_k x W rows (the
// rows past R_k are padding, so every rank's chunk has the same size), and the model's tensor
// becomes a view of its first R_k rows (set_data: the same tensor, as the model, the gradient
// reducer and checkpoints see it). A shard is a separate leaf tensor over the same storage (its
// own autograd metadata and version counter), so the optimizer's in-place update of a shard is
// an update of the model's rows, with no copy.
//
// Per optimizer step (the step mode ShardedParameters, run/step_modes.cpp), with shard =
// "optimizer" (ZeRO-1) or "gradients" (ZeRO-2):
//   clear_gradients()    before the first forward: the whole parameters' gradients dropped (the
//                        optimizer's zero_grad drops only the shards'); "gradients": the shards'
//                        gradient accumulators zeroed
//   forward, backward    "optimizer": gradients all-reduced whole, as without shards (GradSync);
//   after_backward()     "gradients": reduce-scattered into the accumulators as backward
//                        produces them, whole gradients freed (distributed/grad_reduce.hpp);
//                        after_backward waits for them (after each micro-batch's backward)
//   bind_gradients()     each shard's gradient: its rows of the whole (averaged) gradient, or
//                        its accumulator
//   clip, optimizer step on the shards (the clipper combines its norm over the ranks through
//                        abi_group(), the kernel's keel_shard_group)
//   gather_parameters()  after a step taken: every rank's updated rows to every rank, in
//                        all-gathers of at most [distributed] bucket_cap_mb each
// With shard = "parameters" the same, less the gather after each step: see
// distributed/residency.hpp (gather_parameters serves only a resume, before Residency::start).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "keel/abi.h"

namespace keel {

class GradReduceScatter;
class ProcessGroup;

class ShardedParams {
 public:
  // Splits `params` (the model's trainable tensors, each once, named by `names`) over the
  // group's ranks. `model_state`: every tensor a checkpoint holds of the model; one that shares
  // a parameter's storage without being that parameter (a tie through a view) is refused, since
  // the parameter's values move to a new storage. Throws keel::Error naming the tensor.
  // `mode`: kOptimizer (ZeRO-1), kGradients (ZeRO-2: the gradients are reduce-scattered by
  // this object, in buckets of at most bucket_bytes, and no GradSync runs) or kParameters
  // (FSDP-style, distributed/residency.hpp: as kGradients, by the `groups` given (parameter
  // indices, sent in that order), and each shard has a storage of its own, so that the whole
  // parameters' storage can be freed between uses; gather_parameters only after a resume
  // loaded the shards, while the whole parameters still have their storage).
  enum class Mode { kOptimizer, kGradients, kParameters };
  ShardedParams(ProcessGroup& group, const std::vector<at::Tensor>& params,
                const std::vector<std::string>& names, const std::vector<at::Tensor>& model_state,
                int64_t bucket_bytes, Mode mode, std::vector<std::vector<size_t>> groups = {});
  ~ShardedParams();
  ShardedParams(const ShardedParams&) = delete;
  ShardedParams& operator=(const ShardedParams&) = delete;

  // Borrowed handles to this rank's shards, in parameter order, for the optimizer's and the
  // clipper's keel_create_context (valid while this object lives).
  const std::vector<keel_tensor*>& handles() const { return handles_; }
  // The keel_shard_group those contexts get (valid while this object lives).
  const keel_shard_group* abi_group() const { return &abi_group_; }

  // Parameter i's rows that this rank holds, which checkpoints write and read: its shard (a
  // leaf over the parameter's rows [begin, begin + count) of `rows`; a 0-dim parameter has one
  // row, rank 0's).
  struct Rows {
    at::Tensor shard;
    int64_t begin = 0, count = 0, rows = 0;
  };
  Rows rows_of(size_t i) const {
    const Param& p = params_.at(i);
    return {p.shard, p.begin, p.count, p.rows};
  }

  // Whether this object reduces the gradients (shard = "gradients"): no GradSync then.
  bool reduces_gradients() const { return reducer_ != nullptr; }
  // This rank's shards as tensors (what the loss scaler unscales).
  std::vector<at::Tensor> tensors() const;

  void clear_gradients();
  void after_backward(const std::string& what);
  void bind_gradients();
  // Every rank's rows of every parameter into every rank's whole parameters (kParameters:
  // from each shard's own storage, so only while the whole parameters hold storage).
  void gather_parameters(const std::string& what);

  // The collectives this object issued so far: all-gathers, reduce-scatters and the
  // keel_shard_group's all-reduces (each also counted by ProcessGroup::collectives_issued).
  int64_t collectives_issued() const;

  // kParameters: called with the group's index once its gradients were sent (packed) in a
  // backward (distributed/residency.hpp frees the unit's parameters).
  void on_group_sent(std::function<void(size_t group)> f);
  // A collective issued for these shards by another object (distributed/residency.hpp), so
  // that collectives_issued counts it.
  void count_issued() { issued_ += 1; }

  struct Param {
    at::Tensor full;     // the model's tensor: rows [0, rows) of `padded`
    at::Tensor padded;   // flat, chunk x W x row_numel elements
    at::Tensor shard;    // this rank's rows: a leaf over `padded`'s storage (kParameters: over
                         // `home`'s)
    at::Tensor home;     // kParameters: flat, chunk x row_numel, this rank's rows, then padding
    at::Tensor accum;    // "gradients": flat, chunk x row_numel, the shard's summed gradient
    int64_t rows = 0, row_numel = 1, chunk = 0, begin = 0, count = 0;
  };
  const std::vector<Param>& params() const { return params_; }

  // Bytes of this rank's shards and of the whole parameters (without padding), for the log.
  int64_t shard_bytes() const;
  int64_t param_bytes() const;
  // "N parameters in M all-gather bucket(s); this rank holds X of Y MiB" for the log.
  std::string describe() const;

 private:
  static keel_status all_reduce(const keel_shard_group* group, double* values, size_t count,
                                keel_reduce_op op, keel_error* err);

  ProcessGroup& group_;
  int rank_ = 0, world_ = 1;
  Mode mode_;
  std::vector<Param> params_;
  std::vector<keel_tensor*> handles_;
  std::vector<std::vector<size_t>> buckets_;  // parameter indices per all-gather
  int64_t issued_ = 0;                        // all-gathers and all-reduces
  keel_shard_group abi_group_{};
  std::unique_ptr<GradReduceScatter> reducer_;  // "gradients" and "parameters" only
};

}  // namespace keel
