// keel::EmbeddingTable's rows: creation (admission), eviction (ttl), gradients of the step,
// checkpoint entries, and the keel_sparse_table slots over them.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
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
}

EmbeddingTable::Impl* of(void* self) { return static_cast<EmbeddingTable::Impl*>(self); }

// A tensor of int64 values.
at::Tensor longs(const std::vector<int64_t>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  if (!v.empty()) std::memcpy(t.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

}  // namespace

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
  stride = opt.dim;
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
    if (r / kBlockRows >= static_cast<int64_t>(blocks.size()))
      blocks.emplace_back(new float[static_cast<size_t>(kBlockRows * stride)]);
    for (auto* v : {&row_id, &last_seen, &prev, &next, &grad_at}) v->push_back(-1);
  }
  float* values = row(r);
  embedding::init_row(embedding::row_key(opt.seed, table_hash, id), opt.init_std, values, opt.dim);
  std::fill(values + opt.dim, values + stride, 0.0f);
  row_id[r] = id;
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

// New row layout with `width` slot floats: copies the live rows' values, zeroes their slots.
void EmbeddingTable::Impl::relayout(size_t width) {
  const int64_t new_stride = opt.dim + static_cast<int64_t>(width);
  std::vector<std::unique_ptr<float[]>> fresh;
  for (size_t b = 0; b < blocks.size(); ++b) {
    fresh.emplace_back(new float[static_cast<size_t>(kBlockRows * new_stride)]);
    for (int64_t i = 0; i < kBlockRows; ++i) {
      const float* from = blocks[b].get() + i * stride;
      float* to = fresh[b].get() + i * new_stride;
      std::copy(from, from + opt.dim, to);
      std::fill(to + opt.dim, to + new_stride, 0.0f);
    }
  }
  blocks = std::move(fresh);
  stride = new_stride;
  slot_width = width;
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
  return rows;
}

// --- gradients and the end of a step --------------------------------------------------------

void EmbeddingTable::Impl::add_grad(int64_t r, const float* grad, float scale) {
  if (grad_at[r] < 0) {
    grad_at[r] = static_cast<int64_t>(touched_rows.size());
    touched_rows.push_back(r);
    grads.resize(grads.size() + static_cast<size_t>(opt.dim), 0.0f);
  }
  float* g = grads.data() + grad_at[r] * opt.dim;
  for (int64_t j = 0; j < opt.dim; ++j) g[j] += scale * grad[j];
}

void EmbeddingTable::Impl::fill_touched(keel_sparse_rows* out) {
  const size_t n = touched_rows.size();
  out_ids.resize(n);
  out_values.resize(n);
  out_grads.resize(n);
  out_slots.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t r = touched_rows[i];
    out_ids[i] = row_id[r];
    out_values[i] = row(r);
    out_grads[i] = grads.data() + i * static_cast<size_t>(opt.dim);
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
  for (int64_t r : touched_rows) grad_at[r] = -1;
  touched_rows.clear();
  grads.clear();
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
  at::Tensor values = at::empty({n, opt.dim}, at::kFloat);
  at::Tensor slots = at::empty({n, static_cast<int64_t>(slot_width)}, at::kFloat);
  float* v = values.data_ptr<float>();
  float* s = slots.data_ptr<float>();
  seen.reserve(ids.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = index.find(ids[i])->second;
    std::copy(row(r), row(r) + opt.dim, v + i * opt.dim);
    std::copy(row(r) + opt.dim, row(r) + stride, s + i * static_cast<int64_t>(slot_width));
    seen.push_back(last_seen[r]);
  }
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
  const float* values = p.values.data_ptr<float>();
  const int64_t* seen = p.last_seen.data_ptr<int64_t>();
  const float* slots = slot_width > 0 ? p.slots.data_ptr<float>() : nullptr;
  const int64_t admitted_before = admitted;
  for (int64_t i = 0; i < p.ids.size(0); ++i) {
    if (embedding::owner_of(ids[i], world) != rank) continue;
    const int64_t r = create_row(ids[i]);
    std::copy(values + i * opt.dim, values + (i + 1) * opt.dim, row(r));
    if (slots) std::copy(slots + i * slot_width, slots + (i + 1) * slot_width, row(r) + opt.dim);
    last_seen[r] = seen[i];
  }
  admitted = admitted_before;  // loading restores rows: not admissions
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
  m.anchor = at::zeros({1}, at::kFloat);
  m.anchor.set_requires_grad(true);
  keel_sparse_table& t = m.abi;
  t.struct_size = sizeof(keel_sparse_table);
  t.self = &m;
  t.name = m.opt.name.c_str();
  t.dim = m.opt.dim;
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
  const at::Tensor i = ids.to(at::kLong).contiguous().view({-1});
  at::Tensor out = at::zeros({i.numel(), m.opt.dim}, at::kFloat);
  const int64_t* p = i.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  for (int64_t k = 0; k < i.numel(); ++k) {
    auto it = m.index.find(p[k]);
    if (it != m.index.end()) std::copy(m.row(it->second), m.row(it->second) + m.opt.dim,
                                       o + k * m.opt.dim);
  }
  return out;
}

}  // namespace keel
