// Gradient synchronisation of data parallelism: c10d::Reducer, the engine under PyTorch's
// DistributedDataParallel, with DDP's bucket layout (a first bucket of 1 MiB, then buckets of
// [distributed] bucket_cap_mb, in reverse parameter order). Its autograd hooks copy each
// gradient into its bucket as backward produces it and all-reduce a bucket (averaging over the
// ranks) as soon as it is full, overlapped with the rest of backward; backward returns once
// every bucket is reduced and copied back into the parameters' .grad.
//
// Per optimizer step (the trainer's loop), for each micro-batch:
//   before_forward()          only for the step's last micro-batch (the buckets are rebuilt
//                             once, in the order the first step produced the gradients)
//   forward, loss
//   before_backward(loss)     only for the step's last micro-batch: that backward all-reduces
//   loss.backward()           (earlier micro-batches accumulate locally, like DDP's no_sync)
//
// Every parameter must receive a gradient in each synchronising backward (no unused
// parameters), and all ranks must run the same number of synchronising backward passes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace keel {

class ProcessGroup;

class GradSync {
 public:
  GradSync(ProcessGroup& group, const std::vector<at::Tensor>& params,
           const std::vector<std::string>& names);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  void before_forward();
  void before_backward(const at::Tensor& loss);
  // "N buckets (sizes in MiB)" for the log.
  std::string describe() const;
  // The all-reduces the reducer issued so far (one per bucket of each synchronising backward
  // prepared with before_backward); ProcessGroup::collectives_issued does not count them.
  int64_t all_reduces() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel
