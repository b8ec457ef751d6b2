// keel::EmbeddingTable::lookup: ids to their distinct values, the exchange with the owner
// ranks (keel_comm.all_to_all), pooling into bags, and the backward that hands each row's
// gradient to the table that owns it.
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "impl.hpp"
#include "keel/embedding.hpp"
#include "keel/tensor.hpp"
#include "mix.hpp"

namespace keel {

namespace {

using Impl = EmbeddingTable::Impl;

using embedding::longs;
using embedding::put_rows;

// What the backward of one training lookup needs, on every rank: this rank's bags (as the
// requester) and the rows it resolved for the ids other ranks sent it (as the owner).
struct LookupState : torch::CustomClassHolder {
  Impl* table = nullptr;
  Pooling pooling = Pooling::kSum;
  int64_t dim = 0;
  std::vector<int64_t> inv;      // per position of ids: its distinct id's index, -1 if ignored
  std::vector<int64_t> offsets;  // bag starts, then N
  int64_t distinct = 0;
  // Tensor operations only (the table's tensor_ops): the positions that count (inv >= 0), in
  // order: their bag and distinct id, and per bag the factor of its rows (1, or 1 / count for a
  // mean over more than one), on the table's device.
  at::Tensor bag_of, pick;
  at::Tensor scale;  // float [bags, 1]; undefined when every factor is 1
  // Requester: send position k carries distinct id order[k]; send_rows[r] of them go to rank r.
  std::vector<int64_t> order;
  std::vector<int64_t> send_rows;
  // Owner: the ids received (in receive order), their rows here (-1: none), counts per rank.
  std::vector<int64_t> recv_ids;
  std::vector<int64_t> recv_rows;
  std::vector<int64_t> recv_counts;
  at::Tensor output;  // handed over by LookupFunction::forward
};

struct Exchanged {
  at::Tensor tensor;
  std::vector<int64_t> rows;
};

// keel_comm.all_to_all as a C++ call (world_size 1 or no comm: `send` comes back).
Exchanged all_to_all(const Impl& m, const at::Tensor& send, const std::vector<int64_t>& rows,
                     const char* what) {
  if (m.comm == nullptr || m.world == 1) return {send, rows};
  const at::Tensor s = send.contiguous();
  keel_error err;
  err.message[0] = '\0';
  keel_tensor* recv = nullptr;
  std::vector<int64_t> recv_rows(static_cast<size_t>(m.world), 0);
  if (m.comm->all_to_all(m.comm, peek(s), rows.data(), &recv, recv_rows.data(), &err) !=
      KEEL_OK) {
    err.message[KEEL_ERROR_CAPACITY - 1] = '\0';
    throw std::runtime_error(m.where() + ": exchanging " + what + " with the other ranks " +
                             "failed: " + (err.message[0] ? err.message : "no message"));
  }
  return {adopt(recv), std::move(recv_rows)};
}

// Checks ids and offsets; fills st.inv, st.offsets and the distinct ids with their counts.
void prepare(Impl& m, const at::Tensor& ids, const at::Tensor& offsets, LookupState& st,
             std::vector<int64_t>& distinct, std::vector<int64_t>& counts) {
  const std::string w = m.where() + ": lookup: ";
  if (ids.dim() != 1 || offsets.dim() != 1)
    throw std::invalid_argument(w + "ids and offsets must be 1-D, not " + text::shape(ids.sizes()) +
                                " and " + text::shape(offsets.sizes()));
  if (!at::isIntegralType(ids.scalar_type(), false) ||
      !at::isIntegralType(offsets.scalar_type(), false))
    throw std::invalid_argument(w + "ids and offsets must be integer tensors");
  const at::Tensor i = ids.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor o = offsets.to(at::kCPU, at::kLong).contiguous();
  const int64_t n = i.numel(), bags = o.numel();
  const int64_t* op = o.data_ptr<int64_t>();
  st.offsets.assign(op, op + bags);
  st.offsets.push_back(n);
  for (int64_t b = 0; b < bags; ++b)
    if ((b == 0 && op[0] != 0) || st.offsets[b] > st.offsets[b + 1] || st.offsets[b] < 0)
      throw std::invalid_argument(w + "offsets must start at 0, never decrease and stay <= " +
                                  std::to_string(n) + " (the number of ids); offsets[" +
                                  std::to_string(b) + "] = " + std::to_string(op[b]));
  const int64_t* ip = i.data_ptr<int64_t>();
  st.inv.resize(static_cast<size_t>(n));
  m.unique.clear();
  m.unique.reserve(static_cast<size_t>(n));
  distinct.reserve(static_cast<size_t>(n));
  counts.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    if (ip[k] < 0) {
      st.inv[k] = -1;
      continue;
    }
    auto ins = m.unique.try_emplace(ip[k], static_cast<int64_t>(distinct.size()));
    if (ins.second) {
      distinct.push_back(ip[k]);
      counts.push_back(0);
    }
    st.inv[k] = ins.first->second;
    ++counts[ins.first->second];
  }
  st.distinct = static_cast<int64_t>(distinct.size());
}

// The distinct ids' values (zeros for an id without a row). The host path points at each one's
// dim floats (valid until the table's next lookup or end_step; `hold` keeps the rows received
// from other ranks); with tensor operations they are float [distinct, dim] in `tensor`, on the
// table's device.
struct Values {
  std::vector<const float*> rows;
  at::Tensor hold;
  at::Tensor tensor;
};

// The distinct ids' values: resolves them at their owners (counting sightings in training) and
// records both sides in `st`.
Values fetch(Impl& m, const std::vector<int64_t>& distinct, const std::vector<int64_t>& counts,
             LookupState& st) {
  const int64_t n = st.distinct, dim = m.opt.dim;
  Values out;
  st.order.resize(static_cast<size_t>(n));
  if (m.comm == nullptr || m.world == 1) {  // alone: this rank owns every id, nothing to send
    std::iota(st.order.begin(), st.order.end(), int64_t{0});
    st.send_rows.assign(1, n);
    st.recv_counts.assign(1, n);
    st.recv_ids = distinct;
    st.recv_rows = m.resolve(distinct.data(), counts.data(), n);
    if (m.tensor_ops) {
      out.tensor = m.gather(st.recv_rows, dim);
      return out;
    }
    m.zero_row.assign(static_cast<size_t>(dim), 0.0f);
    out.rows.resize(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k)
      out.rows[k] = st.recv_rows[k] >= 0 ? m.row(st.recv_rows[k]) : m.zero_row.data();
    return out;
  }
  st.send_rows.assign(static_cast<size_t>(m.world), 0);
  std::vector<int32_t> owner(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    owner[k] = embedding::owner_of(distinct[k], m.world);
    ++st.send_rows[owner[k]];
  }
  std::vector<int64_t> at(static_cast<size_t>(m.world), 0);  // first send position per rank
  for (int32_t r = 1; r < m.world; ++r) at[r] = at[r - 1] + st.send_rows[r - 1];
  at::Tensor send = at::empty({n, 2}, at::kLong);  // (id, sightings) in owner order
  int64_t* sp = send.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t pos = at[owner[k]]++;
    st.order[pos] = k;
    sp[2 * pos] = distinct[k];
    sp[2 * pos + 1] = counts[k];
  }
  const Exchanged got = all_to_all(m, send, st.send_rows, "ids");
  const at::Tensor recv = got.tensor.contiguous();
  const int64_t m_recv = recv.size(0);
  const int64_t* rp = recv.data_ptr<int64_t>();
  st.recv_ids.resize(static_cast<size_t>(m_recv));
  std::vector<int64_t> sightings(static_cast<size_t>(m_recv));
  for (int64_t k = 0; k < m_recv; ++k) {
    st.recv_ids[k] = rp[2 * k];
    sightings[k] = rp[2 * k + 1];
  }
  st.recv_counts = got.rows;
  st.recv_rows = m.resolve(st.recv_ids.data(), sightings.data(), m_recv);
  at::Tensor rows;
  if (m.tensor_ops) {
    rows = m.gather(st.recv_rows, dim).cpu();  // keel_comm moves CPU tensors
  } else {
    rows = at::zeros({m_recv, dim}, at::kFloat);
    float* to = rows.data_ptr<float>();
    for (int64_t k = 0; k < m_recv; ++k)
      if (st.recv_rows[k] >= 0)
        std::copy(m.row(st.recv_rows[k]), m.row(st.recv_rows[k]) + dim, to + k * dim);
  }
  out.hold = all_to_all(m, rows, st.recv_counts, "rows").tensor.contiguous();  // in send order
  if (m.tensor_ops) {
    std::vector<int64_t> pos_of(static_cast<size_t>(n));
    for (int64_t pos = 0; pos < n; ++pos) pos_of[st.order[pos]] = pos;
    out.tensor = out.hold.index_select(0, longs(pos_of, at::kCPU)).to(m.floats.device());
    return out;
  }
  const float* bp = out.hold.data_ptr<float>();
  out.rows.resize(static_cast<size_t>(n));
  for (int64_t pos = 0; pos < n; ++pos) out.rows[st.order[pos]] = bp + pos * dim;
  return out;
}

// Sums (or averages) the distinct ids' values into the bags, on the host.
at::Tensor pool_host(const LookupState& st, const std::vector<const float*>& values) {
  const int64_t bags = static_cast<int64_t>(st.offsets.size()) - 1, dim = st.dim;
  at::Tensor out = at::zeros({bags, dim}, at::kFloat);
  float* o = out.data_ptr<float>();
  const int64_t n = static_cast<int64_t>(st.inv.size());
  constexpr int64_t kAhead = 8;
  for (int64_t b = 0; b < bags; ++b) {
    float* ob = o + b * dim;
    int64_t count = 0;
    for (int64_t p = st.offsets[b]; p < st.offsets[b + 1]; ++p) {
      const int64_t ahead = p + kAhead < n ? st.inv[p + kAhead] : -1;
      if (ahead >= 0) __builtin_prefetch(values[ahead]);  // rows lie scattered in memory
      if (st.inv[p] < 0) continue;
      ++count;
      const float* vr = values[st.inv[p]];
      for (int64_t j = 0; j < dim; ++j) ob[j] += vr[j];
    }
    if (st.pooling == Pooling::kMean && count > 1) {
      const float scale = 1.0f / static_cast<float>(count);
      for (int64_t j = 0; j < dim; ++j) ob[j] *= scale;
    }
  }
  return out;
}

// The same with tensor operations, adding each bag's rows in the order of its ids, so that the
// sums are those of pool_host; records in `st` what the backward needs.
at::Tensor pool_tensors(LookupState& st, const at::Tensor& values) {
  const int64_t bags = static_cast<int64_t>(st.offsets.size()) - 1;
  const at::Device on = values.device();
  std::vector<int64_t> bag_of, pick;
  std::vector<float> scale(static_cast<size_t>(bags), 1.0f);
  bool scaled = false;
  bag_of.reserve(st.inv.size());
  pick.reserve(st.inv.size());
  for (int64_t b = 0; b < bags; ++b) {
    int64_t count = 0;
    for (int64_t p = st.offsets[b]; p < st.offsets[b + 1]; ++p) {
      if (st.inv[p] < 0) continue;
      ++count;
      bag_of.push_back(b);
      pick.push_back(st.inv[p]);
    }
    if (st.pooling == Pooling::kMean && count > 1) {
      scale[b] = 1.0f / static_cast<float>(count);
      scaled = true;
    }
  }
  st.bag_of = longs(bag_of, on);
  st.pick = longs(pick, on);
  at::Tensor out = at::zeros({bags, st.dim}, values.options());
  if (!pick.empty())
    put_rows(out, st.bag_of, values.index_select(0, st.pick), /*accumulate=*/true);
  if (scaled) {
    st.scale = at::empty({bags, 1}, at::kFloat);
    std::memcpy(st.scale.data_ptr<float>(), scale.data(), scale.size() * sizeof(float));
    st.scale = st.scale.to(on);
    out.mul_(st.scale);
  }
  return out;
}

// The backward: the bags' gradients to the distinct ids, to their owners, into the rows.
void backward_host(LookupState& st, const at::Tensor& grad_output) {
  Impl& m = *st.table;
  const int64_t bags = static_cast<int64_t>(st.offsets.size()) - 1, dim = st.dim;
  const at::Tensor g = grad_output.to(at::kCPU, at::kFloat).contiguous();
  at::Tensor send = at::zeros({st.distinct, dim}, at::kFloat);  // in send order
  std::vector<int64_t> pos_of(static_cast<size_t>(st.distinct));
  for (int64_t pos = 0; pos < st.distinct; ++pos) pos_of[st.order[pos]] = pos;
  const float* gp = g.data_ptr<float>();
  float* sp = send.data_ptr<float>();
  for (int64_t b = 0; b < bags; ++b) {
    int64_t count = 0;
    for (int64_t p = st.offsets[b]; p < st.offsets[b + 1]; ++p) count += st.inv[p] >= 0;
    const float scale =
        st.pooling == Pooling::kMean && count > 0 ? 1.0f / static_cast<float>(count) : 1.0f;
    for (int64_t p = st.offsets[b]; p < st.offsets[b + 1]; ++p) {
      if (st.inv[p] < 0) continue;
      float* to = sp + pos_of[st.inv[p]] * dim;
      for (int64_t j = 0; j < dim; ++j) to[j] += scale * gp[b * dim + j];
    }
  }
  const at::Tensor recv = all_to_all(m, send, st.send_rows, "gradients").tensor.contiguous();
  const float* rp = recv.data_ptr<float>();
  const float scale = 1.0f / static_cast<float>(m.world);  // averaged over ranks, as dense ones
  for (size_t k = 0; k < st.recv_rows.size(); ++k) {
    const int64_t r = st.recv_rows[k];
    // A row evicted (and maybe reused) since the lookup takes no gradient.
    if (r >= 0 && m.row_id[r] == st.recv_ids[k]) m.add_grad(r, rp + k * dim, scale);
  }
}

// The same with tensor operations (the sums in the same order).
void backward_tensors(LookupState& st, const at::Tensor& grad_output) {
  Impl& m = *st.table;
  const at::Device on = m.floats.device();
  at::Tensor send = at::zeros({st.distinct, st.dim}, m.floats);  // in send order
  if (st.pick.numel() > 0) {
    at::Tensor g = grad_output.to(on, at::kFloat);
    if (st.scale.defined()) g = g.mul(st.scale);
    std::vector<int64_t> pos_of(static_cast<size_t>(st.distinct));
    for (int64_t pos = 0; pos < st.distinct; ++pos) pos_of[st.order[pos]] = pos;
    put_rows(send, longs(pos_of, on).index_select(0, st.pick), g.index_select(0, st.bag_of),
             /*accumulate=*/true);
  }
  const at::Tensor recv =
      all_to_all(m, send.cpu(), st.send_rows, "gradients").tensor;  // keel_comm: CPU tensors
  std::vector<bool> keep(st.recv_rows.size());
  for (size_t k = 0; k < st.recv_rows.size(); ++k) {
    const int64_t r = st.recv_rows[k];
    // A row evicted (and maybe reused) since the lookup takes no gradient.
    keep[k] = r >= 0 && m.row_id[r] == st.recv_ids[k];
  }
  m.add_grads(st.recv_rows, keep, recv, 1.0f / static_cast<float>(m.world));  // averaged, as
                                                                               // dense ones
}

struct LookupFunction : torch::autograd::Function<LookupFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& /*anchor*/,
                            c10::intrusive_ptr<LookupState> st) {
    at::Tensor out = std::move(st->output);
    st->output = at::Tensor();
    ctx->saved_data["state"] = at::IValue::make_capsule(std::move(st));
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = ctx->saved_data["state"].toCapsule();
    LookupState& st = *static_cast<LookupState*>(holder.get());
    // An undefined gradient is a zero one; the exchange still runs, as on the other ranks.
    const at::Tensor& given = grads.at(0);
    const at::Tensor g = given.defined()
                             ? given
                             : at::zeros({static_cast<int64_t>(st.offsets.size()) - 1, st.dim},
                                         st.table->floats);
    if (st.table->tensor_ops) backward_tensors(st, g);
    else backward_host(st, g);
    return {at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor EmbeddingTable::lookup(const at::Tensor& ids, const at::Tensor& offsets,
                                  Pooling pooling) {
  Impl& m = *impl_;
  auto st = c10::make_intrusive<LookupState>();
  st->table = &m;
  st->pooling = pooling;
  st->dim = m.opt.dim;
  std::vector<int64_t> distinct, counts;
  prepare(m, ids, offsets, *st, distinct, counts);
  const Values values = fetch(m, distinct, counts, *st);
  at::Tensor out = m.tensor_ops ? pool_tensors(*st, values.tensor) : pool_host(*st, values.rows);
  if (!m.training || !c10::GradMode::is_enabled()) return out;
  st->output = std::move(out);
  return LookupFunction::apply(m.anchor, std::move(st));
}

}  // namespace keel
