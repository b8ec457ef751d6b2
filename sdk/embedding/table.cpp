// keel::EmbeddingTable's rows: creation (admission), eviction (ttl), gradients of the step,
// checkpoint entries, and the keel_sparse_table slots over them.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_put.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/List.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "impl.hpp"
#include "keel/embedding.hpp"
#include "keel/plugin.hpp"  // detail::guard: the keel_sparse_table slots catch as the trampolines do
#include "keel/tensor.hpp"
#include "mix.hpp"

namespace keel {

namespace {

// Entries save() puts, in order. counters: rows, admitted, evicted, step (the last end_step),
// rank and world size of the saving rank.
constexpr const char* kEntries[] = {"ids",         "values",         "slots",
                                    "last_seen",   "pending_ids",    "pending_counts",
                                    "pending_last_seen",             "counters"};
constexpr int64_t kCounters = 6;

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() >= KEEL_NAME_CAPACITY) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

void check_options(const TableOptions& o) {
  const std::string who = "embedding table '" + o.name + "': ";
  if (!valid_name(o.name))
    throw std::invalid_argument(who + "the name must be 1 to " +
                                std::to_string(KEEL_NAME_CAPACITY - 1) +
                                " letters, digits, '_', '.' or '-'");
  if (o.dim < 1)
    throw std::invalid_argument(who + "dim must be >= 1, not " + std::to_string(o.dim));
  if (o.min_count < 1)
    throw std::invalid_argument(who + "min_count must be >= 1, not " + std::to_string(o.min_count));
  if (o.ttl_steps < 0)
    throw std::invalid_argument(who + "ttl_steps must be >= 0 (0: never evict), not " +
                                std::to_string(o.ttl_steps));
  if (o.max_rows < 0)
    throw std::invalid_argument(who + "max_rows must be >= 0 (0: unlimited), not " +
                                std::to_string(o.max_rows));
  if (o.max_pending < 0)
    throw std::invalid_argument(who + "max_pending must be >= 0 (0: 4 x max_rows, or " +
                                std::to_string(TableOptions::kDefaultMaxPending) +
                                " without max_rows), not " + std::to_string(o.max_pending));
  if (!(o.init_std >= 0.0) || !std::isfinite(o.init_std))
    throw std::invalid_argument(who + "init_std must be a finite value >= 0");
  if (!o.device.is_cpu() && !o.device.is_cuda())
    throw std::invalid_argument(who + "device must be the CPU or a CUDA device, not " +
                                o.device.str());
}

EmbeddingTable::Impl* of(void* self) { return static_cast<EmbeddingTable::Impl*>(self); }

using embedding::longs;
using embedding::put_rows;

}  // namespace

at::Tensor embedding::longs(const std::vector<int64_t>& v, const at::Device& on) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  if (!v.empty()) std::memcpy(t.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t.to(on);
}

void embedding::put_rows(at::Tensor& dst, const at::Tensor& index, const at::Tensor& src,
                         bool accumulate) {
  c10::List<c10::optional<at::Tensor>> indices;
  indices.push_back(index);
  dst.index_put_(indices, src, accumulate);
}

EmbeddingTable::Impl::Impl(TableOptions options, const keel_comm* c)
    : opt(std::move(options)), comm(c) {
  check_options(opt);
  if (comm != nullptr) {
    rank = comm->rank;
    world = comm->world_size;
    if (world < 1 || rank < 0 || rank >= world)
      throw std::invalid_argument(where() + ": the comm's rank " + std::to_string(rank) +
                                  " of world size " + std::to_string(world) + " is out of range");
  }
  table_hash = embedding::name_hash(opt.name);
  tensor_ops = opt.tensor_ops || !opt.device.is_cpu();
  device_name = opt.device.str();
  stride = opt.dim;
  floats = at::TensorOptions().dtype(at::kFloat).device(opt.device);
  grads = at::zeros({0, opt.dim}, floats);
}

std::string EmbeddingTable::Impl::where() const { return "embedding table '" + opt.name + "'"; }

// --- rows ------------------------------------------------------------------------------------

void EmbeddingTable::Impl::lru_unlink(int64_t r) {
  const int64_t p = prev[r], n = next[r];
  (p >= 0 ? next[p] : lru_head) = n;
  (n >= 0 ? prev[n] : lru_tail) = p;
  prev[r] = next[r] = -1;
}

void EmbeddingTable::Impl::lru_append(int64_t r) {
  prev[r] = lru_tail;
  next[r] = -1;
  (lru_tail >= 0 ? next[lru_tail] : lru_head) = r;
  lru_tail = r;
}

void EmbeddingTable::Impl::touch_row(int64_t r) {
  last_seen[r] = step + 1;
  if (opt.ttl_steps > 0 && lru_tail != r) {  // without eviction the order is never read
    lru_unlink(r);
    lru_append(r);
  }
}

int64_t EmbeddingTable::Impl::create_row(int64_t id) {
  if (opt.max_rows > 0 && live() >= opt.max_rows)
    throw std::runtime_error(
        where() + ": a row for id " + std::to_string(id) + " would exceed max_rows = " +
        std::to_string(opt.max_rows) + " rows on rank " + std::to_string(rank) + " of " +
        std::to_string(world) + "; hint: raise max_rows, evict unused rows with ttl_steps, " +
        "admit fewer ids with min_count, or shard the table over more ranks");
  int64_t r;
  if (!free_rows.empty()) {
    r = free_rows.back();
    free_rows.pop_back();
  } else {
    r = used++;
    grow(used);
    for (auto* v : {&row_id, &last_seen, &prev, &next, &grad_at}) v->push_back(-1);
  }
  row_id[r] = id;
  if (tensor_ops) {
    fresh.push_back(r);  // its values: write_fresh(), with the lookup's other new rows
  } else {
    float* values = row(r);
    embedding::init_row(embedding::row_key(opt.seed, table_hash, id), opt.init_std, values,
                        opt.dim);
    std::fill(values + opt.dim, values + stride, 0.0f);
  }
  last_seen[r] = step + 1;
  grad_at[r] = -1;
  lru_append(r);
  index.emplace(id, r);
  ++admitted;
  return r;
}

void EmbeddingTable::Impl::evict_row(int64_t r) {
  index.erase(row_id[r]);
  lru_unlink(r);
  row_id[r] = -1;
  free_rows.push_back(r);
  ++evicted;
}

void EmbeddingTable::Impl::rebuild_lru() {
  std::vector<int64_t> rows;
  rows.reserve(index.size());
  for (const auto& kv : index) rows.push_back(kv.second);
  // Oldest first; ties by id, so the order is the same whatever the map's.
  std::sort(rows.begin(), rows.end(), [&](int64_t a, int64_t b) {
    return last_seen[a] != last_seen[b] ? last_seen[a] < last_seen[b] : row_id[a] < row_id[b];
  });
  lru_head = lru_tail = -1;
  for (int64_t r : rows) lru_append(r);
}

// New row layout with `width` slot floats: keeps the rows' values, zeroes their slots.
void EmbeddingTable::Impl::relayout(size_t width) {
  for (size_t k = 0; k < blocks.size(); ++k) {
    const at::Tensor values = blocks[k].narrow(1, 0, opt.dim);
    blocks[k] = at::cat({values, at::zeros({values.size(0), static_cast<int64_t>(width)},
                                           floats)}, 1);
    if (floats.device().is_cpu()) block_data[k] = blocks[k].data_ptr<float>();
  }
  stride = opt.dim + static_cast<int64_t>(width);
  slot_width = width;
}

void EmbeddingTable::Impl::grow(int64_t rows) {
  while (base_of(static_cast<int>(blocks.size())) < rows) {
    blocks.push_back(at::empty({kFirstBlockRows << blocks.size(), stride}, floats));
    block_data.push_back(floats.device().is_cpu() ? blocks.back().data_ptr<float>() : nullptr);
  }
}

namespace {

// rows[i] >= 0 grouped by block: the positions i, and the rows' indices within the block.
struct BlockRows {
  std::vector<std::vector<int64_t>> at, local;  // per block
};
BlockRows by_block(const std::vector<int64_t>& rows, size_t blocks) {
  BlockRows g;
  g.at.resize(blocks);
  g.local.resize(blocks);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0) continue;
    const int k = EmbeddingTable::Impl::block_of(rows[i]);
    g.at[k].push_back(static_cast<int64_t>(i));
    g.local[k].push_back(rows[i] - EmbeddingTable::Impl::base_of(k));
  }
  return g;
}

}  // namespace

void EmbeddingTable::Impl::write_fresh() {
  if (fresh.empty()) return;
  const int64_t n = static_cast<int64_t>(fresh.size());
  at::Tensor init = at::zeros({n, stride}, at::kFloat);  // slots start at zero
  float* p = init.data_ptr<float>();
  for (int64_t k = 0; k < n; ++k)
    embedding::init_row(embedding::row_key(opt.seed, table_hash, row_id[fresh[k]]), opt.init_std,
                        p + k * stride, opt.dim);
  scatter(fresh, init);
  fresh.clear();
}

at::Tensor EmbeddingTable::Impl::gather(const std::vector<int64_t>& rows, int64_t width) const {
  at::Tensor out = at::zeros({static_cast<int64_t>(rows.size()), width}, floats);
  const BlockRows g = by_block(rows, blocks.size());
  for (size_t k = 0; k < blocks.size(); ++k) {
    if (g.at[k].empty()) continue;
    const at::Tensor got = blocks[k].index_select(0, longs(g.local[k], floats.device()));
    put_rows(out, longs(g.at[k], floats.device()), got.narrow(1, 0, width));
  }
  return out;
}

void EmbeddingTable::Impl::scatter(const std::vector<int64_t>& rows, const at::Tensor& values) {
  const at::Tensor v = values.to(floats.device());
  const BlockRows g = by_block(rows, blocks.size());
  for (size_t k = 0; k < blocks.size(); ++k) {
    if (g.at[k].empty()) continue;
    put_rows(blocks[k], longs(g.local[k], floats.device()),
             v.index_select(0, longs(g.at[k], floats.device())));
  }
}

std::vector<int64_t> EmbeddingTable::Impl::resolve(const int64_t* ids, const int64_t* counts,
                                                   int64_t n) {
  std::vector<int64_t> rows(static_cast<size_t>(n), -1);
  bool unresolved = false;  // an id still pending (it may be admitted by a later entry)
  constexpr int64_t kAhead = 8;  // the map's memory for the id kAhead on is fetched meanwhile
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) index.prefetch(ids[i + kAhead]);
    auto it = index.find(ids[i]);
    if (it != index.end()) {
      rows[i] = it->second;
    } else if (!training) {
      continue;
    } else if (opt.min_count <= 1) {
      rows[i] = create_row(ids[i]);
    } else {
      Pending& p = pending[ids[i]];
      p.count += counts[i];
      p.last_seen = step + 1;
      if (p.count >= opt.min_count) {
        pending.erase(ids[i]);
        rows[i] = create_row(ids[i]);
      } else {
        unresolved = true;
      }
    }
  }
  // The rows looked up: their last training lookup is now (rows created above already are,
  // and sit at the end of the eviction order with every other row of this step).
  if (training)
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n && rows[i + kAhead] >= 0) __builtin_prefetch(&last_seen[rows[i + kAhead]]);
      if (rows[i] >= 0 && last_seen[rows[i]] != step + 1) touch_row(rows[i]);
    }
  // Every sighting of this lookup counts before any value is read: an id that several ranks
  // sent reads its row on all of them once their sightings together admit it.
  if (unresolved)
    for (int64_t i = 0; i < n; ++i)
      if (rows[i] < 0) {
        auto it = index.find(ids[i]);
        if (it != index.end()) rows[i] = it->second;
      }
  write_fresh();
  return rows;
}

// --- gradients and the end of a step --------------------------------------------------------

void EmbeddingTable::Impl::reserve_grads(int64_t rows) {
  if (grads.size(0) >= rows) return;
  // Doubling (touched rows of one step: a copy is cheap); the new rows are zero.
  at::Tensor bigger = at::zeros({std::max(rows, 2 * grads.size(0)), opt.dim}, floats);
  bigger.narrow(0, 0, grads.size(0)).copy_(grads);
  grads = std::move(bigger);
}

void EmbeddingTable::Impl::add_grad(int64_t r, const float* grad, float scale) {
  if (grad_at[r] < 0) {
    grad_at[r] = static_cast<int64_t>(touched_rows.size());
    touched_rows.push_back(r);
    reserve_grads(grad_at[r] + 1);
  }
  float* g = grads.data_ptr<float>() + grad_at[r] * opt.dim;
  for (int64_t j = 0; j < opt.dim; ++j) g[j] += scale * grad[j];
}

void EmbeddingTable::Impl::add_grads(const std::vector<int64_t>& rows,
                                     const std::vector<bool>& keep, const at::Tensor& g,
                                     float scale) {
  std::vector<int64_t> from, to;  // g's row from[i] adds to grads' row to[i]
  for (size_t k = 0; k < rows.size(); ++k) {
    if (!keep[k]) continue;
    const int64_t r = rows[k];
    if (grad_at[r] < 0) {
      grad_at[r] = static_cast<int64_t>(touched_rows.size());
      touched_rows.push_back(r);
    }
    from.push_back(static_cast<int64_t>(k));
    to.push_back(grad_at[r]);
  }
  if (from.empty()) return;
  reserve_grads(static_cast<int64_t>(touched_rows.size()));
  const at::Device on = floats.device();
  at::Tensor add = g.to(on, at::kFloat);
  if (static_cast<size_t>(add.size(0)) != from.size()) add = add.index_select(0, longs(from, on));
  put_rows(grads, longs(to, on), add.mul(scale), /*accumulate=*/true);
}

void EmbeddingTable::Impl::fill_touched(keel_sparse_rows* out) {
  const size_t n = touched_rows.size();
  if (tensor_ops) {  // copies of the rows (values, then slots), written back at end_step
    out_ids.resize(n);
    for (size_t i = 0; i < n; ++i) out_ids[i] = row_id[touched_rows[i]];
    handed = gather(touched_rows, stride);
    out_rows = handed.narrow(1, 0, opt.dim);
    out_slot_rows = handed.narrow(1, opt.dim, static_cast<int64_t>(slot_width));
    out_grad_rows = grads.narrow(0, 0, static_cast<int64_t>(n));
    if (KEEL_HAS_FIELD(out, keel_sparse_rows, count)) out->count = n;
    if (KEEL_HAS_FIELD(out, keel_sparse_rows, ids)) out->ids = out_ids.data();
    if (KEEL_HAS_FIELD(out, keel_sparse_rows, values)) out->values = nullptr;
    if (KEEL_HAS_FIELD(out, keel_sparse_rows, grads)) out->grads = nullptr;
    if (KEEL_HAS_FIELD(out, keel_sparse_rows, slots)) out->slots = nullptr;
    if (KEEL_HAS_FIELD(out, keel_sparse_rows, slot_width)) out->slot_width = slot_width;
    if (KEEL_HAS_FIELD(out, keel_sparse_rows, row_values)) out->row_values = peek(out_rows);
    if (KEEL_HAS_FIELD(out, keel_sparse_rows, row_grads)) out->row_grads = peek(out_grad_rows);
    if (KEEL_HAS_FIELD(out, keel_sparse_rows, row_slots))
      out->row_slots = slot_width > 0 ? peek(out_slot_rows) : nullptr;
    return;
  }
  out_ids.resize(n);
  out_values.resize(n);
  out_grads.resize(n);
  out_slots.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t r = touched_rows[i];
    out_ids[i] = row_id[r];
    out_values[i] = row(r);
    out_grads[i] = grads.data_ptr<float>() + i * static_cast<size_t>(opt.dim);
    out_slots[i] = slot_width > 0 ? row(r) + opt.dim : nullptr;
  }
  if (KEEL_HAS_FIELD(out, keel_sparse_rows, count)) out->count = n;
  if (KEEL_HAS_FIELD(out, keel_sparse_rows, ids)) out->ids = out_ids.data();
  if (KEEL_HAS_FIELD(out, keel_sparse_rows, values)) out->values = out_values.data();
  if (KEEL_HAS_FIELD(out, keel_sparse_rows, grads)) out->grads = out_grads.data();
  if (KEEL_HAS_FIELD(out, keel_sparse_rows, slots))
    out->slots = slot_width > 0 ? out_slots.data() : nullptr;
  if (KEEL_HAS_FIELD(out, keel_sparse_rows, slot_width)) out->slot_width = slot_width;
}

void EmbeddingTable::Impl::end_step(int64_t new_step) {
  if (handed.defined()) {  // the copies touched() handed out, updated by the sparse optimizer
    scatter(touched_rows, handed);
    handed = out_rows = out_slot_rows = out_grad_rows = at::Tensor();
  }
  for (int64_t r : touched_rows) grad_at[r] = -1;
  if (!touched_rows.empty()) grads.narrow(0, 0, static_cast<int64_t>(touched_rows.size())).zero_();
  touched_rows.clear();
  step = new_step;
  if (opt.ttl_steps > 0) {
    // Rows not looked up in training in the last ttl_steps steps (steps new_step - ttl + 1 ..
    // new_step): the LRU list holds the rows oldest first.
    while (lru_head >= 0 && last_seen[lru_head] <= new_step - opt.ttl_steps) evict_row(lru_head);
    // Pending sightings are forgotten likewise, checked every ttl_steps steps.
    if (opt.min_count > 1 && new_step % opt.ttl_steps == 0) {
      for (auto it = pending.begin(); it != pending.end();) {
        auto here = it++;
        if (here->second.last_seen <= new_step - opt.ttl_steps) pending.erase(here);
      }
    }
  }
  if (opt.min_count > 1) forget_pending();
}

// Past pending_limit() waiting ids, the ids of the oldest steps go, whole steps at a time,
// until at most half the limit wait: the rule depends on the waiting ids' last sightings alone
// (saved with them), so a resumed run forgets what the uninterrupted one does; forgetting down
// to half makes it one pass over the map per (limit / 2) new ids, not one every step.
void EmbeddingTable::Impl::forget_pending() {
  const int64_t limit = opt.pending_limit();
  if (static_cast<int64_t>(pending.size()) <= limit) return;
  const size_t keep = static_cast<size_t>(limit / 2);
  std::vector<int64_t> seen;
  seen.reserve(pending.size());
  for (const auto& kv : pending) seen.push_back(kv.second.last_seen);
  // The (keep + 1)-th newest sighting's step: it and every older step go, and at most `keep`
  // ids, all sighted later, stay.
  std::nth_element(seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(keep), seen.end(),
                   std::greater<int64_t>());
  const int64_t cut = seen[keep];
  for (auto it = pending.begin(); it != pending.end();) {
    auto here = it++;
    if (here->second.last_seen <= cut) pending.erase(here);
  }
}

// --- checkpoints ------------------------------------------------------------------------------

std::vector<std::pair<std::string, at::Tensor>> EmbeddingTable::Impl::save() const {
  std::vector<int64_t> ids, seen;
  ids.reserve(index.size());
  for (const auto& kv : index) ids.push_back(kv.first);
  std::sort(ids.begin(), ids.end());  // the same entries whatever the map's order
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> rows;
  rows.reserve(ids.size());
  seen.reserve(ids.size());
  for (int64_t i = 0; i < n; ++i) {
    rows.push_back(index.find(ids[i])->second);
    seen.push_back(last_seen[rows.back()]);
  }
  const at::Tensor saved = gather(rows, stride).cpu();
  const at::Tensor values = saved.narrow(1, 0, opt.dim).contiguous();
  const at::Tensor slots = saved.narrow(1, opt.dim, static_cast<int64_t>(slot_width)).contiguous();
  std::vector<int64_t> pids, pcounts, pseen;
  for (const auto& kv : pending) pids.push_back(kv.first);
  std::sort(pids.begin(), pids.end());
  for (int64_t id : pids) {
    const Pending& p = pending.find(id)->second;
    pcounts.push_back(p.count);
    pseen.push_back(p.last_seen);
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back("ids", longs(ids));
  out.emplace_back("values", values);
  if (slot_width > 0) out.emplace_back("slots", slots);
  out.emplace_back("last_seen", longs(seen));
  out.emplace_back("pending_ids", longs(pids));
  out.emplace_back("pending_counts", longs(pcounts));
  out.emplace_back("pending_last_seen", longs(pseen));
  out.emplace_back("counters", longs({n, admitted, evicted, step, rank, world}));
  return out;
}

namespace {

// The entries of one saved part, checked: every entry known, every shape consistent.
struct Part {
  at::Tensor ids, values, slots, last_seen, pending_ids, pending_counts, pending_last_seen,
      counters;
};

at::Tensor checked(const std::string& where, const std::string& name, const at::Tensor& t,
                   at::ScalarType type, std::vector<int64_t> shape) {
  if (!t.defined())
    throw std::runtime_error(where + ": the checkpoint has no entry '" + name + "'");
  if (t.scalar_type() != type || t.sizes() != at::IntArrayRef(shape))
    throw std::runtime_error(where + ": checkpoint entry '" + name + "' is " +
                             std::string(c10::toString(t.scalar_type())) + " " +
                             text::shape(t.sizes()) + ", expected " + c10::toString(type) + " " +
                             text::shape(shape) + "; hint: was it saved by another table?");
  return t.to(at::kCPU).contiguous();
}

Part read_part(const EmbeddingTable::Impl& m,
               const std::vector<std::pair<std::string, at::Tensor>>& entries) {
  Part p;
  at::Tensor* slot_of[] = {&p.ids,         &p.values,         &p.slots,
                           &p.last_seen,   &p.pending_ids,    &p.pending_counts,
                           &p.pending_last_seen, &p.counters};
  for (const auto& e : entries) {
    size_t k = 0;
    while (k < std::size(kEntries) && e.first != kEntries[k]) ++k;
    if (k == std::size(kEntries))
      throw std::runtime_error(m.where() + ": unknown checkpoint entry '" + e.first +
                               "'; hint: it was saved by another kind of table");
    *slot_of[k] = e.second;
  }
  const std::string w = m.where();
  const int64_t n = p.ids.defined() ? p.ids.size(0) : 0;
  const int64_t pn = p.pending_ids.defined() ? p.pending_ids.size(0) : 0;
  p.ids = checked(w, "ids", p.ids, at::kLong, {n});
  p.values = checked(w, "values", p.values, at::kFloat, {n, m.opt.dim});
  if (m.slot_width > 0 || p.slots.defined())
    p.slots = checked(w + " (with " + std::to_string(m.slot_width) +
                          " slot floats a row for its sparse optimizer)",
                      "slots", p.slots, at::kFloat, {n, static_cast<int64_t>(m.slot_width)});
  p.last_seen = checked(w, "last_seen", p.last_seen, at::kLong, {n});
  p.pending_ids = checked(w, "pending_ids", p.pending_ids, at::kLong, {pn});
  p.pending_counts = checked(w, "pending_counts", p.pending_counts, at::kLong, {pn});
  p.pending_last_seen = checked(w, "pending_last_seen", p.pending_last_seen, at::kLong, {pn});
  p.counters = checked(w, "counters", p.counters, at::kLong, {kCounters});
  return p;
}

}  // namespace

void EmbeddingTable::Impl::load(const std::vector<std::pair<std::string, at::Tensor>>& entries) {
  const Part p = read_part(*this, entries);
  const int64_t* ids = p.ids.data_ptr<int64_t>();
  const int64_t* pids = p.pending_ids.data_ptr<int64_t>();
  // Checked before anything changes, so that a refused part leaves the table as it was: an id
  // at most once in each list of the part, and not in a part loaded before.
  twice_in(ids, p.ids.size(0), "ids");
  twice_in(pids, p.pending_ids.size(0), "pending_ids");
  int64_t mine = 0;
  for (int64_t i = 0; i < p.ids.size(0); ++i) {
    if (embedding::owner_of(ids[i], world) != rank) continue;
    ++mine;
    if (index.count(ids[i]))
      throw std::runtime_error(where() + ": id " + std::to_string(ids[i]) +
                               " is in two loaded parts; hint: load each saved part once");
  }
  if (opt.max_rows > 0 && live() + mine > opt.max_rows)
    throw std::runtime_error(
        where() + ": the saved part's " + std::to_string(mine) + " rows of rank " +
        std::to_string(rank) + " of " + std::to_string(world) + " (with " +
        std::to_string(live()) + " loaded before) exceed max_rows = " +
        std::to_string(opt.max_rows) + "; hint: raise max_rows or resume at more ranks");
  const int64_t* c = p.counters.data_ptr<int64_t>();
  const int64_t saved_rank = c[4], saved_world = c[5];
  // The part's counters go to one rank (the one its saving rank maps to), so that their sums
  // over the ranks continue those of the saving run.
  if (saved_world >= 1 && saved_rank % world == rank) {
    admitted += c[1];
    evicted += c[2];
  }
  step = std::max(step, c[3]);
  const int64_t* seen = p.last_seen.data_ptr<int64_t>();
  const int64_t admitted_before = admitted;
  write_fresh();
  std::vector<int64_t> from, rows;  // the part's row from[k] becomes this table's rows[k]
  for (int64_t i = 0; i < p.ids.size(0); ++i) {
    if (embedding::owner_of(ids[i], world) != rank) continue;
    const int64_t r = create_row(ids[i]);
    last_seen[r] = seen[i];
    from.push_back(i);
    rows.push_back(r);
  }
  fresh.clear();  // their values come from the part
  admitted = admitted_before;  // loading restores rows: not admissions
  if (!rows.empty()) {
    const at::Tensor pick = longs(from);
    at::Tensor put = p.values.index_select(0, pick);
    if (slot_width > 0) put = at::cat({put, p.slots.index_select(0, pick)}, 1);
    scatter(rows, put);
  }
  const int64_t* pcounts = p.pending_counts.data_ptr<int64_t>();
  const int64_t* pseen = p.pending_last_seen.data_ptr<int64_t>();
  for (int64_t i = 0; i < p.pending_ids.size(0); ++i)
    if (embedding::owner_of(pids[i], world) == rank) pending[pids[i]] = {pcounts[i], pseen[i]};
  rebuild_lru();
}

// Throws when an id is twice among the n ids of the part's entry `entry`. Saved parts hold
// their ids sorted: then one pass; else a sorted copy.
void EmbeddingTable::Impl::twice_in(const int64_t* ids, int64_t n, const char* entry) const {
  const auto check = [&](const int64_t* sorted) {
    for (int64_t i = 1; i < n; ++i)
      if (sorted[i] == sorted[i - 1])
        throw std::runtime_error(where() + ": id " + std::to_string(sorted[i]) +
                                 " is twice in the part's " + entry + "; hint: the saved part is "
                                 "damaged or was not written by this table (it writes each id "
                                 "once)");
  };
  if (std::is_sorted(ids, ids + n)) {
    check(ids);
    return;
  }
  std::vector<int64_t> sorted(ids, ids + n);
  std::sort(sorted.begin(), sorted.end());
  check(sorted.data());
}

// --- the public class ---------------------------------------------------------------------------

EmbeddingTable::EmbeddingTable(TableOptions options, const keel_comm* comm)
    : impl_(std::make_unique<Impl>(std::move(options), comm)) {
  Impl& m = *impl_;
  m.anchor = at::zeros({1}, m.floats);
  m.anchor.set_requires_grad(true);
  keel_sparse_table& t = m.abi;
  t.struct_size = sizeof(keel_sparse_table);
  t.self = &m;
  t.name = m.opt.name.c_str();
  t.dim = m.opt.dim;
  t.rows_as_tensors = m.tensor_ops ? 1 : 0;
  t.device = m.device_name.c_str();
  t.reserve_slots = [](void* s, size_t width, keel_error* err) noexcept {
    return detail::guard(err, [&] {
      Impl& m = *of(s);
      if (m.slots_reserved)
        throw std::runtime_error(m.where() + ": reserve_slots called twice (it may be called " +
                                 "once, by the sparse optimizer's factory)");
      m.slots_reserved = true;
      m.relayout(width);
    });
  };
  t.touched = [](void* s, keel_sparse_rows* out, keel_error* err) noexcept {
    return detail::guard(err, [&] { of(s)->fill_touched(out); });
  };
  t.end_step = [](void* s, int64_t step, keel_error* err) noexcept {
    return detail::guard(err, [&] { of(s)->end_step(step); });
  };
  t.stats = [](void* s, keel_table_stats* out) noexcept {
    const Impl& m = *of(s);
    if (KEEL_HAS_FIELD(out, keel_table_stats, rows)) out->rows = m.live();
    if (KEEL_HAS_FIELD(out, keel_table_stats, admitted)) out->admitted = m.admitted;
    if (KEEL_HAS_FIELD(out, keel_table_stats, evicted)) out->evicted = m.evicted;
    if (KEEL_HAS_FIELD(out, keel_table_stats, pending))
      out->pending = static_cast<int64_t>(m.pending.size());
  };
  t.save = [](void* s, keel_state_writer* out, keel_error* err) noexcept {
    return detail::guard(err, [&] {
      const Impl& m = *of(s);
      for (const auto& e : m.save())
        if (!out->put(out, e.first.c_str(), peek(e.second)))
          throw std::runtime_error(m.where() + ": the checkpoint refused entry '" + e.first + "'");
    });
  };
  t.load = [](void* s, const keel_named_tensor* entries, size_t count, keel_error* err) noexcept {
    return detail::guard(err, [&] {
      std::vector<std::pair<std::string, at::Tensor>> named;
      for (size_t i = 0; i < count; ++i)
        named.emplace_back(entries[i].name, borrow(entries[i].tensor));
      of(s)->load(named);
    });
  };
}

EmbeddingTable::~EmbeddingTable() = default;
EmbeddingTable::EmbeddingTable(EmbeddingTable&&) noexcept = default;
EmbeddingTable& EmbeddingTable::operator=(EmbeddingTable&&) noexcept = default;

const keel_sparse_table* EmbeddingTable::abi() { return &impl_->abi; }
void EmbeddingTable::set_training(bool training) { impl_->training = training; }
bool EmbeddingTable::training() const { return impl_->training; }
const TableOptions& EmbeddingTable::options() const { return impl_->opt; }
int64_t EmbeddingTable::current_step() const { return impl_->step + 1; }
int64_t EmbeddingTable::pending() const { return static_cast<int64_t>(impl_->pending.size()); }

keel_table_stats EmbeddingTable::stats() const {
  keel_table_stats s{};
  s.struct_size = sizeof(s);
  impl_->abi.stats(impl_.get(), &s);
  return s;
}

int64_t EmbeddingTable::shared_id(int64_t feature, int64_t id) {
  if (id < 0) return id;
  const uint64_t h = embedding::mix64(embedding::mix64(static_cast<uint64_t>(feature)) ^
                                      static_cast<uint64_t>(id));
  return static_cast<int64_t>(h >> 1);  // 63 bits: >= 0
}

int32_t EmbeddingTable::owner(int64_t id, int32_t world_size) {
  return embedding::owner_of(id, world_size);
}

at::Tensor EmbeddingTable::read(const at::Tensor& ids) const {
  const Impl& m = *impl_;
  const at::Tensor i = ids.to(at::kCPU, at::kLong).contiguous().view({-1});
  const int64_t* p = i.data_ptr<int64_t>();
  std::vector<int64_t> rows(static_cast<size_t>(i.numel()), -1);
  for (int64_t k = 0; k < i.numel(); ++k) {
    auto it = m.index.find(p[k]);
    if (it != m.index.end()) rows[k] = it->second;
  }
  return m.gather(rows, m.opt.dim);
}

}  // namespace keel
