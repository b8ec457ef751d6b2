// keel::EmbeddingTable's state (private to libkeel-embedding): the id -> row map, the rows in
// blocks, admission counts, the LRU order eviction follows, and the step's gradients.
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

struct EmbeddingTable::Impl {
  // Rows per block: a table grows a block at a time and never moves a row.
  static constexpr int64_t kBlockRows = 4096;

  Impl(TableOptions options, const keel_comm* comm);

  TableOptions opt;
  const keel_comm* comm = nullptr;  // nullptr or world_size 1: alone
  int32_t rank = 0;
  int32_t world = 1;
  uint64_t table_hash = 0;
  keel_sparse_table abi{};
  bool training = true;
  int64_t step = 0;  // the last end_step's step; lookups belong to step + 1

  // --- rows: values (dim floats) then slots (slot_width floats), `stride` floats a row -----
  size_t slot_width = 0;
  bool slots_reserved = false;
  int64_t stride = 0;
  std::vector<std::unique_ptr<float[]>> blocks;
  int64_t used = 0;                // row indices handed out so far (live + free)
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
  std::vector<float> grads;  // dim floats per touched row
  // What touched() hands out (valid until the next slot call).
  std::vector<int64_t> out_ids;
  std::vector<float*> out_values;
  std::vector<const float*> out_grads;
  std::vector<float*> out_slots;

  // --- lookup ------------------------------------------------------------------------------
  absl::flat_hash_map<int64_t, int64_t> unique;  // scratch: id -> position among unique ids
  at::Tensor anchor;  // requires grad: makes a training lookup's output differentiable
  std::vector<float> zero_row;  // what an id without a row reads

  float* row(int64_t r) { return blocks[r / kBlockRows].get() + (r % kBlockRows) * stride; }
  const float* row(int64_t r) const {
    return blocks[r / kBlockRows].get() + (r % kBlockRows) * stride;
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
  // Owner side of a lookup: counts the sightings of (ids[i], counts[i]) in training (admitting
  // ids that reach min_count), then returns each id's row or -1.
  std::vector<int64_t> resolve(const int64_t* ids, const int64_t* counts, int64_t n);
  // Adds scale * grad (dim floats) to row r's gradient for the step.
  void add_grad(int64_t r, const float* grad, float scale);
  void end_step(int64_t new_step);
  void forget_pending();  // past opt.pending_limit(): the oldest steps' waiting ids go
  void fill_touched(keel_sparse_rows* out);
  std::vector<std::pair<std::string, at::Tensor>> save() const;
  void load(const std::vector<std::pair<std::string, at::Tensor>>& entries);
  // Throws naming the id when one is twice among ids[0 .. n) of the part's `entry`.
  void twice_in(const int64_t* ids, int64_t n, const char* entry) const;
};

}  // namespace keel
