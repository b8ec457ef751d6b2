// keel::EmbeddingTable: a dynamic hash-table embedding for click-through-rate models, the
// SDK's implementation of the ABI's keel_sparse_table (abi.h, "(1.9) Sparse embedding tables").
//
// Built as the static library libkeel-embedding.a (pkg-config keel-embedding, meson
// keel_embedding_dep), which a plugin links into itself. A model owns its tables, looks ids up
// in forward and shows each table to the kernel through keel::Model::tables():
//
//   keel::EmbeddingTable table_{{"users", /*dim=*/16}, ctx.comm()};
//   std::vector<const keel_sparse_table*> tables() override { return {table_.abi()}; }
//   at::Tensor forward(...) { ... table_.lookup(ids, offsets, keel::Pooling::kSum) ... }
//
// Ids are arbitrary int64 values >= 0 (a negative id is "missing": it is ignored). A row is
// created when an id is admitted (its min_count-th sighting in training), starts as
// N(0, init_std^2) drawn from (seed, table name, id) alone, so it does not depend on the order
// in which ids arrive nor on the number of ranks, and is evicted after ttl_steps steps without a
// training lookup. With several ranks (a keel_comm of world_size > 1) every rank owns the rows of
// the ids with owner(id) == its rank; lookups and gradients travel with keel_comm.all_to_all,
// so every rank calls lookup (and runs its backward) the same number of times, in the same
// order. Not thread safe: one thread (the training thread) uses a table.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "keel/abi.h"

namespace keel {

// How lookup combines the rows of one bag.
//   kSum:  the sum of the rows of the bag's ids.
//   kMean: that sum divided by the number of the bag's ids that are >= 0 (an id not admitted
//          yet counts, as a zero row); a bag with no such id gives zeros.
enum class Pooling { kSum, kMean };

struct TableOptions {
  std::string name;          // keel_sparse_table.name: letters, digits, '_', '.', '-'
  int64_t dim = 16;          // floats per row, >= 1
  int64_t min_count = 1;     // admitted at the min_count-th sighting in training (1: at once)
  int64_t ttl_steps = 0;     // evict rows not looked up in training for this many steps (0: never)
  int64_t max_rows = 0;      // per rank; 0 = unlimited; exceeding it is an error naming the table
  // Per rank: most ids waiting for admission (sighted, fewer than min_count times) after a step;
  // past it the ids of the oldest steps are forgotten (TableOptions::pending_limit says how).
  // 0: 4 x max_rows, or kDefaultMaxPending without max_rows.
  int64_t max_pending = 0;
  double init_std = 0.01;    // rows start as N(0, init_std^2) drawn from (seed, name, id) only
  uint64_t seed = 0;         // the run's seed
  // Where the rows live: the CPU, or a CUDA device (Context::device() gives the run's). A table
  // on a device reads and writes its rows with tensor operations and hands them to the sparse
  // optimizer as tensors (ABI 1.11, keel_sparse_table.rows_as_tensors).
  at::Device device = at::kCPU;
  // On the CPU, do the same (tensor operations, a lookup's rows at once, and the rows handed as
  // tensors) instead of host loops over pointers into the rows. It gives the same values (the
  // same sums in the same order) and is slower at small batches, so the default is false; tests
  // set it to check that path against the host one.
  bool tensor_ops = false;

  static constexpr int64_t kDefaultMaxPending = int64_t{1} << 20;  // 1,048,576
  // The limit max_pending gives: at the end of a step (end_step) with more ids waiting than
  // this, the ids whose last sighting is oldest are forgotten, the ids of one step all at once
  // (oldest step first), until at most half of it wait. Forgotten ids count from 0 again.
  int64_t pending_limit() const {
    if (max_pending > 0) return max_pending;
    if (max_rows <= 0) return kDefaultMaxPending;
    return max_rows > std::numeric_limits<int64_t>::max() / 4 ? std::numeric_limits<int64_t>::max()
                                                              : 4 * max_rows;
  }
};

class EmbeddingTable {
 public:
  // comm may be nullptr (alone: world size 1). Throws std::invalid_argument on bad options.
  EmbeddingTable(TableOptions options, const keel_comm* comm);
  ~EmbeddingTable();
  EmbeddingTable(EmbeddingTable&&) noexcept;
  EmbeddingTable& operator=(EmbeddingTable&&) noexcept;
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  // The table as the ABI's struct, for Model::tables(); valid for the table's life.
  const keel_sparse_table* abi();
  // Training (the default) or evaluation. In evaluation a lookup counts no sightings, creates
  // no rows, records no gradients and reads zeros for ids without a row.
  void set_training(bool training);
  bool training() const;

  // ids int64 [N] (values < 0: ignored, contribute nothing), offsets int64 [bags] (bag b is
  // ids[offsets[b] .. offsets[b+1]) (last bag to N), like nn.EmbeddingBag with
  // include_last_offset=false: offsets[0] == 0, non-decreasing, <= N); returns float
  // [bags, dim] on the table's device (ids and offsets may lie anywhere); in training (with
  // gradients enabled) differentiable: the backward adds each row's gradient to the table.
  // Sightings in training count occurrences (an id twice in ids is sighted twice). Call it
  // once per step for all the features that use the table (concatenate their ids and offsets).
  // Throws std::invalid_argument on bad arguments and std::runtime_error when the rows
  // exceed max_rows or the ranks fail to exchange.
  at::Tensor lookup(const at::Tensor& ids, const at::Tensor& offsets, Pooling pooling);

  // One table shared by several features: the id a feature's value gets in it (a 64-bit mix
  // of (feature, id), >= 0). A negative (missing) id stays as it is, so it stays ignored.
  static int64_t shared_id(int64_t feature, int64_t id);
  // The rank that owns `id`'s row among world_size ranks (0 for world_size 1).
  static int32_t owner(int64_t id, int32_t world_size);

  keel_table_stats stats() const;

  // --- Extensions beyond DESIGN24's interface (for tests, exports and tools) ---------------
  const TableOptions& options() const;
  // The current values of this rank's rows of `ids` (int64 [n]) as float [n, dim] on the
  // table's device, zeros for ids without a row here; no sightings, no exchange between ranks.
  at::Tensor read(const at::Tensor& ids) const;
  // The step the next lookup belongs to: 1 + the last end_step's step (1 before any).
  int64_t current_step() const;
  // Ids of this rank waiting for admission (sighted fewer than min_count times), now.
  int64_t pending() const;

  struct Impl;  // the library's own (sdk/embedding/impl.hpp)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel
