// Gradients reduce-scattered into shards as backward produces them ([distributed] shard =
// "gradients", ZeRO-2): instead of all-reducing whole gradients (GradSync), each rank receives
// only the sum over ranks of its rows of every gradient, added into a per-parameter
// accumulator, and the whole gradients are freed as soon as their bucket is sent.
//
// An autograd post-hook on each parameter's gradient accumulator (the mechanism under
// c10d::Reducer) counts the parameters of a bucket whose gradient of this backward is complete;
// a complete bucket is packed by destination rank (rows [q c, min((q + 1) c, R)) of each of its
// gradients for rank q, zero padding to c rows), the whole gradients are released, and the
// packed buffer is reduce-scattered (distributed/collectives.hpp) into the accumulators,
// divided by the number of ranks; at most two buckets are in flight (sending a bucket waits for
// the one sent two before it). Buckets are sent in a fixed order (bucket 0 first; one
// completed early waits for its predecessors), so every rank issues the same collectives in the
// same order. Buckets hold the parameters in reverse order (backward produces the last
// parameters' gradients first), of at most [distributed] bucket_cap_mb each.
//
// Every backward reduce-scatters (with grad_accum > 1, once per micro-batch: the accumulators
// sum them), so every parameter must get a gradient in every backward.
//
// With shard = "parameters" the buckets are the model's units instead (given by
// distributed/residency.hpp: descending unit order, the root last), and on_sent tells the
// residency when a unit's gradients are sent, so that it frees the unit's whole parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/collectives.hpp"

namespace torch::autograd {
struct Node;
}

namespace keel {

class GradReduceScatter {
 public:
  struct Param {
    std::string name;
    at::Tensor full;   // the model's parameter (leaf)
    at::Tensor accum;  // flat, chunk x row_numel elements: this rank's rows, then padding
    int64_t rows = 0, row_numel = 1, chunk = 0;
  };
  GradReduceScatter(Collectives& collectives, std::vector<Param> params, int64_t bucket_bytes);
  // shard = "parameters" (distributed/residency.hpp): the buckets are `groups` (parameter
  // indices, each parameter in one, none empty), sent in that order. `mode` names the shard
  // value in errors.
  GradReduceScatter(Collectives& collectives, std::vector<Param> params,
                    std::vector<std::vector<size_t>> groups, std::string mode);
  ~GradReduceScatter();
  GradReduceScatter(const GradReduceScatter&) = delete;
  GradReduceScatter& operator=(const GradReduceScatter&) = delete;

  // After each loss.backward() returned: sends what is left, waits for every bucket, and checks
  // that every parameter got its gradient (else keel::Error naming the first that did not).
  // `what` names the backward in errors ("backward of step 3").
  void finish_backward(const std::string& what);
  // Number of buckets, for the log.
  size_t buckets() const { return buckets_.size(); }
  // Reduce-scatters issued so far (one per bucket and backward).
  int64_t issued() const { return issued_; }
  // Called with a bucket's index right after its gradients were packed and released (before
  // its reduce-scatter completes), on the thread running backward.
  std::function<void(size_t bucket)> on_sent;

 private:
  void hook_accumulators();  // the post-hooks on every parameter's gradient accumulator
  void ready(size_t param);  // the autograd hook: param's gradient is complete
  void launch(size_t bucket);

  Collectives& collectives_;
  std::vector<Param> params_;
  std::string mode_ = "gradients";  // the shard value, for errors
  std::vector<std::vector<size_t>> buckets_;  // parameter indices, in packing order
  std::vector<size_t> bucket_of_;             // per parameter
  std::vector<size_t> waiting_;               // per bucket: parameters not complete yet
  std::vector<bool> fired_;                   // per parameter, in this backward
  size_t next_ = 0;                           // the next bucket to send
  std::vector<Pending> pending_;              // sent this backward
  int64_t issued_ = 0;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive (held weakly)
  std::vector<uintptr_t> hook_keys_;
};

}  // namespace keel
