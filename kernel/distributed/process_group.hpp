// The job's process group, on PyTorch's distributed engine (c10d): rendezvous through a
// TCPStore at MASTER_ADDR:MASTER_PORT, collectives on Gloo (CPU tensors) or NCCL (CUDA tensors,
// when keel is built against a CUDA LibTorch that has it), and gradient synchronisation through
// c10d::Reducer (grad_sync.hpp). Every c10d call of keel is in this folder.
//
// Collectives are blocking and every rank must call the same ones in the same order (the loop
// agrees every decision that changes the sequence: run/requests.hpp). A failure (a rank died,
// or did not arrive within [distributed] timeout_s) throws keel::Error naming the operation and
// the rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "distributed/launch.hpp"
#include "error.hpp"

namespace keel {

class Collectives;  // distributed/collectives.hpp

// A sum issued but not yet waited for (ProcessGroup::sum_async). wait() returns it, or throws
// the keel::Error sum() would; call it once. Every rank issued the collective, so one that is
// destroyed unwaited (a step that failed meanwhile) still completes in the background.
class PendingSum {
 public:
  PendingSum();
  PendingSum(PendingSum&&) noexcept;
  PendingSum& operator=(PendingSum&&) noexcept;
  ~PendingSum();

  bool issued() const { return state_ != nullptr; }
  std::vector<double> wait();

 private:
  friend class ProcessGroup;
  struct State;
  std::unique_ptr<State> state_;
};

struct DistributedOptions {
  std::chrono::seconds timeout{300};  // [distributed] timeout_s
  std::string backend = "auto";       // "auto" (NCCL for CUDA, else Gloo), "gloo", "nccl"
  int64_t bucket_bytes = 25 << 20;    // [distributed] bucket_cap_mb
};

class ProcessGroup {
 public:
  // Rendezvous with every other rank of `launch`; collectives then run on `device`'s backend.
  // Throws keel::Error when the store cannot be reached within the timeout, or the backend
  // cannot be created. Sets SIGPIPE to ignored for the whole process, for good (a peer's closed
  // socket then fails the write with EPIPE instead of killing this rank silently).
  ProcessGroup(const Launch& launch, const DistributedOptions& options, const at::Device& device);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  const DistributedOptions& options() const { return options_; }
  const std::string& backend_name() const;

  // Reduce-scatter, all-gather and exchange over this group (distributed/collectives.hpp).
  Collectives& collectives();
  // Collectives issued so far by this process: sum, max, any, all, broadcast, verify_same and
  // Collectives' operations (not the gradient reducer's all-reduces, nor share and gather,
  // which go through the store).
  int64_t collectives_issued() const;

  // Element-wise sum / max of `values` over all ranks. `what` names the operation in errors.
  std::vector<double> sum(std::vector<double> values, const std::string& what);
  std::vector<double> max(std::vector<double> values, const std::string& what);
  // sum() issued now and waited for later: the ranks' work between the two (a forward, a
  // backward) hides the collective's latency and their skew. It counts in the same order as a
  // blocking one: every rank must issue it at the same point of its sequence of collectives.
  PendingSum sum_async(std::vector<double> values, std::string what);
  // True on every rank when `flag` is true on any (all) rank.
  bool any(bool flag, const std::string& what);
  bool all(bool flag, const std::string& what) { return !any(!flag, what); }
  // Copies rank 0's tensors into every other rank's (same names, shapes and dtypes).
  void broadcast(const std::vector<at::Tensor>& tensors, const std::string& what);
  // Checks that every rank has tensors of the same count, shapes and dtypes as rank 0's.
  void verify_same(const std::vector<at::Tensor>& tensors, const std::string& what);
  // Rank 0's `value` on every rank (through the store; other ranks' `value` is ignored).
  std::string share(const std::string& value, const std::string& what);
  // On rank 0: every rank's `value`, by rank (through the store); on the others: {}. Rank 0
  // waits for each of them, up to the timeout.
  std::vector<std::string> gather(const std::string& value, const std::string& what);

  // The error of a failed collective `what` (the engine's message `why`, first line): names
  // this rank and the timeout, and hints at the other ranks.
  Error failure(const std::string& what, const std::string& why) const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  Launch launch_;
  DistributedOptions options_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Collectives> collectives_;
};

}  // namespace keel
