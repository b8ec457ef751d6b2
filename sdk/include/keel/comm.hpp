// keel::Comm: the C++ side of ABI 1.9's keel_comm (abi.h "(1.9) Collectives for components"),
// the run's ranks for components that exchange data themselves (a model whose embedding tables
// are sharded over the ranks, a loss whose metric needs every rank's predictions).
//
//   keel::Comm comm(ctx.comm());                 // in the component's constructor
//   auto got = comm.all_to_all(ids, per_rank);   // per_rank[r]: rows of `ids` for rank r
//   // got.rows: what every rank sent this one, in rank order; got.counts[r]: rows from rank r
//
// Every call is a collective: every rank calls it equally often, in the same order, and only
// from the slots abi.h names (model forward / forward_features and the backward of their
// outputs, loss metric_update / metric_finish, sparse optimizer step). Tensors must be CPU
// tensors with at least one dimension (rows are the entries of dimension 0); a non-contiguous
// one is made contiguous first. A failure (bad arguments, a rank that failed or did not arrive
// within [distributed] timeout_s) is thrown as std::runtime_error with the kernel's message,
// which the SDK's slot trampolines turn into KEEL_ERR.
//
// Without a kernel comm (nullptr: a kernel older than ABI 1.9, or a unit test of the component
// alone) the Comm is alone: rank 0 of world 1, and each call returns a copy of `send`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "keel/abi.h"
#include "keel/tensor.hpp"

namespace keel {

class Comm {
 public:
  // What a call returns: the rows received, and counts[r] (world_size() entries) how many of
  // them came from rank r (they lie in rank order).
  struct Exchanged {
    at::Tensor rows;
    std::vector<int64_t> counts;
  };

  // `comm` (borrowed; the kernel's lives as long as the component) or nullptr: alone.
  explicit Comm(const keel_comm* comm = nullptr) : comm_(comm) {}

  // The kernel's keel_comm, or nullptr when alone.
  const keel_comm* raw() const { return comm_; }
  int rank() const { return comm_ ? comm_->rank : 0; }
  int world_size() const { return comm_ ? comm_->world_size : 1; }

  // Sends the first send_rows[0] rows of `send` to rank 0, the next send_rows[1] to rank 1,
  // and so on (world_size() counts, summing to send.size(0)); returns the rows every rank sent
  // this one, in rank order, with send's dtype and trailing shape.
  Exchanged all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_rows) const {
    const at::Tensor data = checked(send, "all_to_all");
    if (send_rows.size() != static_cast<size_t>(world_size()))
      throw std::runtime_error("keel::Comm::all_to_all: " + std::to_string(send_rows.size()) +
                               " send_rows for a world of " + std::to_string(world_size()) +
                               " ranks; hint: give one count per rank");
    int64_t total = 0;
    for (int64_t n : send_rows) {
      if (n < 0)
        throw std::runtime_error("keel::Comm::all_to_all: a negative count in send_rows");
      total += n;
    }
    if (total != data.size(0))
      throw std::runtime_error("keel::Comm::all_to_all: send_rows sum to " +
                               std::to_string(total) + " but send has " +
                               std::to_string(data.size(0)) + " rows");
    return exchange(data, "all_to_all", [&](keel_tensor** recv, int64_t* counts, keel_error* e) {
      return comm_->all_to_all(comm_, peek(data), send_rows.data(), recv, counts, e);
    });
  }

  // Every rank's `send` (the same dtype and trailing shape on every rank, any number of rows)
  // concatenated along dimension 0 in rank order; counts[r] is rank r's number of rows.
  Exchanged all_gather(const at::Tensor& send) const {
    const at::Tensor data = checked(send, "all_gather");
    return exchange(data, "all_gather", [&](keel_tensor** recv, int64_t* counts, keel_error* e) {
      return comm_->all_gather(comm_, peek(data), recv, counts, e);
    });
  }

 private:
  static at::Tensor checked(const at::Tensor& send, const char* what) {
    if (!send.defined() || send.dim() < 1)
      throw std::runtime_error(std::string("keel::Comm::") + what +
                               ": send must be a tensor with at least one dimension");
    if (!send.device().is_cpu())
      throw std::runtime_error(std::string("keel::Comm::") + what +
                               ": send must be a CPU tensor; hint: .cpu() it first");
    return send.contiguous();
  }
  // One call of the kernel's slot (`call(&recv, counts, &err)`), or alone: a copy of `data`,
  // all of it from rank 0. A failure throws the kernel's message.
  template <class Call>
  Exchanged exchange(const at::Tensor& data, const char* what, Call call) const {
    Exchanged out;
    out.counts.assign(static_cast<size_t>(world_size()), 0);
    if (!comm_) {
      out.rows = data.clone();
      out.counts[0] = data.size(0);
      return out;
    }
    keel_error err;
    err.message[0] = '\0';
    keel_tensor* recv = nullptr;
    if (call(&recv, out.counts.data(), &err) != KEEL_OK) {
      err.message[KEEL_ERROR_CAPACITY - 1] = '\0';
      throw std::runtime_error(err.message[0] ? std::string(err.message)
                                              : std::string("keel_comm ") + what + " failed");
    }
    out.rows = adopt(recv);
    return out;
  }
  const keel_comm* comm_;
};

}  // namespace keel
