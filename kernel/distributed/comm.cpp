#include "distributed/comm.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "distributed/impl.hpp"
#include "error.hpp"
#include "keel/tensor.hpp"

namespace keel {

namespace {

// Fields after the counts in each rank's part of the exchange: what its rows look like.
enum Field { kDtype, kDims, kRowElements, kShapeHash, kFields };

int64_t row_elements(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

int64_t shape_hash(const at::Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t d = 1; d < t.dim(); ++d) h = (h ^ static_cast<uint64_t>(t.size(d))) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

// "Double rows of 2 dimension(s) with 3 element(s) each": an exchange's fields, for errors.
std::string described(const std::vector<int64_t>& f) {
  return fmt::format("{} rows of {} dimension(s) with {} element(s) each",
                     c10::toString(static_cast<at::ScalarType>(f[kDtype])), f[kDims],
                     f[kRowElements]);
}

// `send` checked against abi.h's rules (a CPU tensor with at least one dimension), contiguous.
at::Tensor checked_send(const at::Tensor& send, const char* what) {
  if (!send.defined()) throw Error(std::string("keel_comm ") + what + ": send is NULL");
  if (send.dim() < 1)
    throw Error(std::string("keel_comm ") + what + ": send is a scalar; rows are the entries "
                "of dimension 0, so send needs at least one dimension");
  if (!send.device().is_cpu())
    throw Error(std::string("keel_comm ") + what + ": send is on " + send.device().str() +
                "; keel_comm takes CPU tensors (hint: .cpu() it first)");
  return send.contiguous();
}

// A [rows, bytes] byte view of `t`'s storage; for no rows, a view into a 1-row buffer, so that
// the engine never sees a null data pointer.
at::Tensor byte_rows(const at::Tensor& t, int64_t rows, int64_t bytes, const at::Device& on) {
  if (rows == 0) return at::empty({1, bytes}, at::TensorOptions().dtype(at::kByte).device(on)).narrow(0, 0, 0);
  at::Tensor b = t.reshape({rows, -1}).view(at::kByte);
  return on.is_cpu() ? b : b.to(on);
}

// Runs a slot's body: KEEL_OK, or KEEL_ERR with the exception's message in `err`.
template <class F>
keel_status guarded(keel_error* err, F&& body) noexcept {
  try {
    body();
    return KEEL_OK;
  } catch (const c10::Error& e) {
    if (err) std::snprintf(err->message, KEEL_ERROR_CAPACITY, "%s", e.what_without_backtrace());
  } catch (const std::exception& e) {
    if (err) std::snprintf(err->message, KEEL_ERROR_CAPACITY, "%s", e.what());
  }
  return KEEL_ERR;
}

}  // namespace

ComponentComm::ComponentComm(ProcessGroup* group) : group_(group) {
  abi_.struct_size = sizeof(abi_);
  abi_.host_data = this;
  abi_.rank = group ? group->impl().launch.rank : 0;
  abi_.world_size = group ? group->impl().launch.world_size : 1;
  abi_.all_to_all = &ComponentComm::all_to_all_slot;
  abi_.all_gather = &ComponentComm::all_gather_slot;
}

std::vector<std::vector<int64_t>> ComponentComm::exchange_counts(
    const at::Tensor& send, const std::vector<int64_t>& counts, const char* what) {
  ProcessGroup::Impl& g = group_->impl();
  std::vector<int64_t> mine = counts;
  mine.push_back(static_cast<int64_t>(send.scalar_type()));
  mine.push_back(send.dim());
  mine.push_back(row_elements(send));
  mine.push_back(shape_hash(send));
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  std::vector<at::Tensor> in{at::tensor(mine, i64).to(g.comm)};
  std::vector<std::vector<at::Tensor>> all(1);
  for (int q = 0; q < world(); ++q)
    all[0].push_back(at::empty({static_cast<int64_t>(mine.size())}, in[0].options()));
  g.guarded(std::string("keel_comm ") + what + " (exchanging the row counts)", [&] {
    g.pg->allgather(all, in, c10d::AllgatherOptions())->wait();
  });
  const size_t n = counts.size();
  std::vector<std::vector<int64_t>> out;
  std::vector<std::vector<int64_t>> fields;
  for (int q = 0; q < world(); ++q) {
    const at::Tensor t = all[0][q].cpu();
    const int64_t* v = t.data_ptr<int64_t>();
    out.emplace_back(v, v + n);
    fields.emplace_back(v + n, v + n + kFields);
  }
  // Every rank compares each rank's rows with rank 0's, so all name the same rank.
  for (int q = 1; q < world(); ++q)
    if (fields[q] != fields[0])
      throw Error(fmt::format(
          "keel_comm {}: rank {} sends {} and rank 0 {}{} (this is rank {}); hint: every rank "
          "must send the same dtype and trailing shape (abi.h, keel_comm)",
          what, q, described(fields[q]), described(fields[0]),
          described(fields[q]) == described(fields[0]) ? " of another shape" : "", rank()));
  return out;
}

at::Tensor ComponentComm::move_rows(const at::Tensor& send, const std::vector<int64_t>& send_rows,
                                    const std::vector<int64_t>& recv_rows, const char* what) {
  ProcessGroup::Impl& g = group_->impl();
  const int64_t sent = send.size(0);
  const int64_t received = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  std::vector<int64_t> shape = send.sizes().vec();
  shape[0] = received;
  at::Tensor out = at::empty(shape, send.options());
  const int64_t bytes = row_elements(send) * static_cast<int64_t>(send.element_size());
  if (bytes == 0) return out;  // every rank's rows are empty (same trailing shape): nothing moves
  at::Tensor in_bytes = byte_rows(send, sent, bytes, g.comm);
  at::Tensor out_bytes = byte_rows(out, received, bytes, g.comm);
  std::vector<int64_t> out_splits = recv_rows, in_splits = send_rows;
  g.guarded(std::string("keel_comm ") + what + " (moving the rows)", [&] {
    g.pg->alltoall_base(out_bytes, in_bytes, out_splits, in_splits, c10d::AllToAllOptions())
        ->wait();
  });
  if (!g.comm.is_cpu() && received > 0) out.reshape({received, -1}).view(at::kByte).copy_(out_bytes);
  return out;
}

at::Tensor ComponentComm::all_to_all(const at::Tensor& send_in,
                                     const std::vector<int64_t>& send_rows,
                                     std::vector<int64_t>& recv_rows) {
  const at::NoGradGuard no_grad;
  const at::Tensor send = checked_send(send_in, "all_to_all");
  if (send_rows.size() != static_cast<size_t>(world()))
    throw Error(fmt::format(
        "keel_comm all_to_all: {} send_rows for {} rank(s); hint: one count per rank",
        send_rows.size(), world()));
  int64_t total = 0;
  for (size_t q = 0; q < send_rows.size(); ++q) {
    if (send_rows[q] < 0)
      throw Error(fmt::format("keel_comm all_to_all: send_rows[{}] = {}; counts are >= 0", q,
                              send_rows[q]));
    total += send_rows[q];
  }
  if (total != send.size(0))
    throw Error(fmt::format("keel_comm all_to_all: send_rows sum to {} but send has {} rows; "
                            "hint: the counts split send's rows among the ranks, in rank order",
                            total, send.size(0)));
  calls_ += 1;
  if (!group_) {
    recv_rows.assign(1, send.size(0));
    return send.clone();
  }
  const std::vector<std::vector<int64_t>> counts = exchange_counts(send, send_rows, "all_to_all");
  recv_rows.assign(static_cast<size_t>(world()), 0);
  for (int q = 0; q < world(); ++q) recv_rows[q] = counts[q][rank()];
  return move_rows(send, send_rows, recv_rows, "all_to_all");
}

at::Tensor ComponentComm::all_gather(const at::Tensor& send_in, std::vector<int64_t>& rows) {
  const at::NoGradGuard no_grad;
  const at::Tensor send = checked_send(send_in, "all_gather");
  calls_ += 1;
  if (!group_) {
    rows.assign(1, send.size(0));
    return send.clone();
  }
  const int64_t n = send.size(0);
  const std::vector<std::vector<int64_t>> counts = exchange_counts(send, {n}, "all_gather");
  rows.assign(static_cast<size_t>(world()), 0);
  for (int q = 0; q < world(); ++q) rows[q] = counts[q][0];
  // Every rank's whole tensor to every rank: send's rows once per rank.
  std::vector<int64_t> times(static_cast<size_t>(send.dim()), 1);
  times[0] = world();
  const at::Tensor repeated = send.repeat(times);
  return move_rows(repeated, std::vector<int64_t>(world(), n), rows, "all_gather");
}

keel_status ComponentComm::all_to_all_slot(const keel_comm* comm, keel_tensor* send,
                                           const int64_t* send_rows, keel_tensor** recv,
                                           int64_t* recv_rows, keel_error* err) {
  return guarded(err, [&] {
    if (recv) *recv = nullptr;
    if (!comm || !comm->host_data || !send_rows || !recv || !recv_rows)
      throw Error("keel_comm all_to_all: called with a NULL comm, send_rows, recv or recv_rows");
    auto* self = static_cast<ComponentComm*>(comm->host_data);
    const std::vector<int64_t> rows(send_rows, send_rows + self->world());
    std::vector<int64_t> got;
    at::Tensor out = self->all_to_all(borrow(send), rows, got);
    std::copy(got.begin(), got.end(), recv_rows);
    *recv = give(std::move(out));
  });
}

keel_status ComponentComm::all_gather_slot(const keel_comm* comm, keel_tensor* send,
                                           keel_tensor** recv, int64_t* rows, keel_error* err) {
  return guarded(err, [&] {
    if (recv) *recv = nullptr;
    if (!comm || !comm->host_data || !recv || !rows)
      throw Error("keel_comm all_gather: called with a NULL comm, recv or rows");
    auto* self = static_cast<ComponentComm*>(comm->host_data);
    std::vector<int64_t> got;
    at::Tensor out = self->all_gather(borrow(send), got);
    std::copy(got.begin(), got.end(), rows);
    *recv = give(std::move(out));
  });
}

}  // namespace keel
