// The collectives that sharded data parallelism needs beyond ProcessGroup's all-reduces:
// reduce-scatter, all-gather and an exchange of a few doubles, each behind one function so that
// a backend with the native collective swaps it in here and nowhere else.
//
// Gloo in LibTorch 1.13 has no reduce_scatter, _reduce_scatter_base or _allgather_base (they
// throw). So on Gloo reduce-scatter is alltoall_base followed by a local sum in rank order
// 0, 1, ..., W-1 (every rank computes its chunk with the same additions, whatever the
// transport's order), and all-gather is allgather_coalesced. Under KEEL_WITH_NCCL, with the
// "nccl" backend, they are _reduce_scatter_base and _allgather_base (plus a copy out of the flat
// buffer); that path is compiled only in a CUDA build and is not exercised by the CPU tests.
//
// Every rank must issue the same collectives in the same order with the same shapes (as for
// ProcessGroup). Errors (a rank died, or did not arrive within [distributed] timeout_s) are
// keel::Error naming `what` and this rank, thrown by Pending::wait.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.hpp"

namespace keel {

// A collective in flight. wait() blocks until it is done, then runs its local epilogue (the
// sum in rank order, the scaling, the copy into the caller's tensors); only after wait() do
// the outputs hold the result. Waiting again does nothing. A Pending dropped without wait()
// leaves the transfer to finish in the background (the engine keeps its buffers) and its
// outputs unwritten.
class Pending {
 public:
  Pending() = default;
  void wait();
  // True until wait() returned (false for a default-constructed or already waited Pending).
  bool active() const;

 private:
  friend class Collectives;
  struct State;
  std::shared_ptr<State> state_;
};

class Collectives {
 public:
  explicit Collectives(ProcessGroup& group);
  ~Collectives();
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  int rank() const;
  int world() const;

  // Reduce-scatter of `packed`, this rank's contribution laid out by destination rank:
  // [for rank 0: chunk 0, chunk 1, ..., chunk k-1 | for rank 1: the same layout | ...], W * C
  // elements where C = the summed numel of `out` (each chunk k has out[k]'s numel, which may be
  // 0; every rank passes the same shapes). On wait(): out[k] = (the sum over ranks q, in rank
  // order, of rank q's chunk k for this rank) / divide_by, or out[k] += that when `accumulate`.
  // `packed` and `out` share one dtype; `packed` must not change until wait() returns.
  Pending reduce_scatter(at::Tensor packed, std::vector<at::Tensor> out, double divide_by,
                         bool accumulate, const std::string& what);

  // All-gather: on wait(), outputs[q][k] holds rank q's inputs[k] (every rank passes the same
  // count and shapes; outputs[q][k] has inputs[k]'s shape and may be a view, e.g. into one
  // padded buffer). Empty tensors are allowed (nothing moves for them).
  Pending all_gather(std::vector<at::Tensor> inputs,
                     std::vector<std::vector<at::Tensor>> outputs, const std::string& what);

  // Every rank's `values` (the same count on every rank), by rank: [W][n]. The caller reduces
  // each field with its own operation in rank order, so that every rank gets bit-identical
  // results. Blocking.
  std::vector<std::vector<double>> exchange(const std::vector<double>& values,
                                            const std::string& what);

 private:
  // A Pending of this group for the collective `what`, with nothing in flight yet.
  Pending pending(const std::string& what) const;

  ProcessGroup::Impl* group_;
};

}  // namespace keel
