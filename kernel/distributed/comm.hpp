// keel_comm (abi.h "(1.9) Collectives for components"): the run's ranks as components see them,
// for those that exchange data themselves (a model whose embedding tables are sharded over the
// ranks, a loss whose evaluation metric needs every rank's predictions). Every component's
// creation context gets the run's one ComponentComm (run/parameters.cpp, context()).
//
// With several ranks each call first exchanges every rank's row counts, dtype and trailing shape
// (one all-gather of a few int64), so that a rank need not know what it will receive and a rank
// that sends another dtype or row shape fails with one line naming both; then the rows move
// with one alltoall_base with split sizes (Gloo's alltoallv), as bytes, so any dtype moves:
// all_to_all sends each rank its block, all_gather sends every rank the whole tensor (each rank
// receives exactly every rank's rows: no padding to the longest). Calls fail after
// [distributed] timeout_s like every collective of the run (the process group's). With the
// NCCL backend the bytes go through the backend's device and back (compiled, not exercised by
// the CPU tests). Alone (no process group) each call copies `send`.
//
// These collectives are not in the run's `collectives:` line (run/agreement.hpp): calls()
// counts them apart.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "keel/abi.h"

namespace keel {

class ProcessGroup;

class ComponentComm {
 public:
  // `group`: the run's process group (it must outlive this), or nullptr: alone (rank 0 of 1).
  explicit ComponentComm(ProcessGroup* group);
  ComponentComm(const ComponentComm&) = delete;
  ComponentComm& operator=(const ComponentComm&) = delete;

  // The struct every component's creation context gets; valid while this lives.
  const keel_comm* abi() const { return &abi_; }
  int rank() const { return abi_.rank; }
  int world() const { return abi_.world_size; }
  // Calls made so far (each a collective with several ranks).
  int64_t calls() const { return calls_; }

  // The calls behind the slots, as abi.h describes them; recv_rows / rows get world() counts.
  // Throw keel::Error on bad arguments or when the ranks cannot agree.
  at::Tensor all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_rows,
                        std::vector<int64_t>& recv_rows);
  at::Tensor all_gather(const at::Tensor& send, std::vector<int64_t>& rows);

 private:
  static keel_status all_to_all_slot(const keel_comm* comm, keel_tensor* send,
                                     const int64_t* send_rows, keel_tensor** recv,
                                     int64_t* recv_rows, keel_error* err);
  static keel_status all_gather_slot(const keel_comm* comm, keel_tensor* send,
                                     keel_tensor** recv, int64_t* rows, keel_error* err);
  // Every rank's `counts` (world() entries) after checking that every rank sends `send`'s dtype
  // and trailing shape: [rank][entry].
  std::vector<std::vector<int64_t>> exchange_counts(const at::Tensor& send,
                                                    const std::vector<int64_t>& counts,
                                                    const char* what);
  // alltoall_base of `send`'s rows (send_rows[q] to rank q) into a new tensor of
  // sum(recv_rows) rows.
  at::Tensor move_rows(const at::Tensor& send, const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows, const char* what);

  ProcessGroup* group_;
  keel_comm abi_{};
  int64_t calls_ = 0;
};

}  // namespace keel
