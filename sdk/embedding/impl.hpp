// keel::EmbeddingTable's state (private to libkeel-embedding): the id -> row map, the rows in
// blocks of tensors, admission counts, the LRU order eviction follows, and the step's
// gradients. Everything about ids (the map, admission, eviction, which rows a step touched) is
// host bookkeeping. The rows' floats are read and written in one of two ways: on the host,
// through pointers into `blocks` and `grads` (a row at a time, as the lookup walks its ids), or
// with tensor operations on them, a lookup's rows at once (`tensor_ops`: what a table whose
// tensors live on a device needs; on the CPU it gives the same sums, in the same order, and
// costs more at small batches: TableOptions::tensor_ops).
#pragma once

#include <absl/container/flat_hash_map.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "keel/abi.h"
#include "keel/embedding.hpp"

namespace keel {

namespace embedding {
// A tensor of int64 values on `on`.
at::Tensor longs(const std::vector<int64_t>& v, const at::Device& on = at::kCPU);
// dst[index[i]] = src[i] for the rows of 2-d tensors (index: int64 on dst's device); with
// `accumulate`, dst[index[i]] += src[i], on the CPU in the order of i.
void put_rows(at::Tensor& dst, const at::Tensor& index, const at::Tensor& src,
              bool accumulate = false);
}  // namespace embedding

struct EmbeddingTable::Impl {
  Impl(TableOptions options, const keel_comm* comm);

  TableOptions opt;
  const keel_comm* comm = nullptr;  // nullptr or world_size 1: alone
  int32_t rank = 0;
  int32_t world = 1;
  uint64_t table_hash = 0;
  keel_sparse_table abi{};
  bool tensor_ops = false;  // rows read and written with tensor operations, not host loops
  std::string device_name;  // keel_sparse_table.device
  bool training = true;
  int64_t step = 0;  // the last end_step's step; lookups belong to step + 1

  // --- rows: values (dim floats) then slots (slot_width floats), `stride` floats a row -----
  size_t slot_width = 0;
  bool slots_reserved = false;
  int64_t stride = 0;
  // Block k is float [kFirstBlockRows << k, stride] and holds rows base(k) .. base(k + 1) - 1,
  // base(k) = kFirstBlockRows * (2^k - 1): a table grows a block at a time, each twice the
  // last (a handful of blocks for millions of rows, so that tensor operations take a few
  // calls), and never moves a row (reserve_slots alone rewrites the blocks).
  static constexpr int64_t kFirstBlockRows = 4096;
  at::TensorOptions floats;         // float32 on the table's device (the CPU for now)
  std::vector<at::Tensor> blocks;
  std::vector<float*> block_data;   // blocks[k]'s floats when they are in host memory
  int64_t used = 0;                // row indices handed out so far (live + free)
  std::vector<int64_t> fresh;      // tensor_ops: rows created, initial values not written yet
  std::vector<int64_t> free_rows;  // evicted rows, reused first
  absl::flat_hash_map<int64_t, int64_t> index;  // id -> row
  // Per row index: its id (-1 when free), last training lookup, LRU links, gradient slot.
  std::vector<int64_t> row_id, last_seen, prev, next, grad_at;
  int64_t lru_head = -1;  // least recently looked up (evicted first)
  int64_t lru_tail = -1;

  // --- admission: ids sighted fewer than min_count times -----------------------------------
  struct Pending {
    int64_t count = 0;
    int64_t last_seen = 0;
  };
  absl::flat_hash_map<int64_t, Pending> pending;
  int64_t admitted = 0;
  int64_t evicted = 0;

  // --- the step's gradients: touched rows in order of their first gradient -----------------
  std::vector<int64_t> touched_rows;
  // float [>= touched_rows.size(), dim], on the table's device: row i is touched_rows[i]'s
  // gradient, the rows after the touched ones are zero (it grows by doubling).
  at::Tensor grads;
  // What touched() hands out (valid until the next slot call).
  std::vector<int64_t> out_ids;
  std::vector<float*> out_values;
  std::vector<const float*> out_grads;
  std::vector<float*> out_slots;
  // tensor_ops: the touched rows' copies (values then slots, [count, stride]) that touched()
  // handed out as views, written back at end_step.
  at::Tensor handed, out_rows, out_slot_rows, out_grad_rows;

  // --- lookup ------------------------------------------------------------------------------
  absl::flat_hash_map<int64_t, int64_t> unique;  // scratch: id -> position among unique ids
  at::Tensor anchor;  // requires grad: makes a training lookup's output differentiable
  std::vector<float> zero_row;  // what an id without a row reads (host path)

  static int block_of(int64_t r) {
    return 63 - __builtin_clzll(static_cast<uint64_t>(r / kFirstBlockRows) + 1);
  }
  static int64_t base_of(int k) { return kFirstBlockRows * ((int64_t{1} << k) - 1); }
  // Row r's floats (blocks in host memory).
  float* row(int64_t r) {
    const int k = block_of(r);
    return block_data[k] + (r - base_of(k)) * stride;
  }
  int64_t live() const { return static_cast<int64_t>(index.size()); }
  std::string where() const;  // "embedding table 'NAME'"

  // Rows (table.cpp).
  int64_t create_row(int64_t id);
  void evict_row(int64_t r);
  void lru_unlink(int64_t r);
  void lru_append(int64_t r);
  void touch_row(int64_t r);
  void rebuild_lru();
  void relayout(size_t width);
  void grow(int64_t rows);  // the blocks hold at least `rows` rows
  void write_fresh();       // the rows in `fresh` get their initial values and zero slots
  // The first `width` floats of rows[i] (zeros where rows[i] < 0) as float [n, width].
  at::Tensor gather(const std::vector<int64_t>& rows, int64_t width) const;
  // Row rows[i] becomes values[i] (float [n, stride], on any device).
  void scatter(const std::vector<int64_t>& rows, const at::Tensor& values);
  // Owner side of a lookup: counts the sightings of (ids[i], counts[i]) in training (admitting
  // ids that reach min_count), then returns each id's row or -1.
  std::vector<int64_t> resolve(const int64_t* ids, const int64_t* counts, int64_t n);
  void reserve_grads(int64_t rows);  // grads holds at least `rows` rows
  // Adds scale * grad (dim floats) to row r's gradient for the step (host path).
  void add_grad(int64_t r, const float* grad, float scale);
  // Adds scale * g[k] (g: float [n, dim]) to the step's gradient of rows[k], for every k with
  // keep[k] (rows[k] a row that still holds the id it was looked up for); tensor operations.
  void add_grads(const std::vector<int64_t>& rows, const std::vector<bool>& keep,
                 const at::Tensor& g, float scale);
  void end_step(int64_t new_step);
  void forget_pending();  // past opt.pending_limit(): the oldest steps' waiting ids go
  void fill_touched(keel_sparse_rows* out);
  std::vector<std::pair<std::string, at::Tensor>> save() const;
  void load(const std::vector<std::pair<std::string, at::Tensor>>& entries);
  // Throws naming the id when one is twice among ids[0 .. n) of the part's `entry`.
  void twice_in(const int64_t* ids, int64_t n, const char* entry) const;
};

}  // namespace keel
