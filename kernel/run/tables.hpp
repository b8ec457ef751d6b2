// The model's sparse embedding tables (ABI 1.9, abi.h "Sparse embedding tables") and the
// [sparse_optimizer] that updates their rows, as the run uses them: checked and handed to the
// sparse optimizer at assembly; in every step their gradients checked and measured (before the
// ranks agree on the step), their touched rows updated (unless the step is skipped), and the
// step ended (always); their counters in the train records; their rows in every checkpoint.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "components.hpp"
#include "keel/abi.h"

namespace keel {

struct Run;
struct Snapshot;
struct CommitRecord;
class ProcessGroup;

struct SparseTables {
  std::vector<const keel_sparse_table*> tables;  // the model's, in its order; checked
  std::string owner;        // the model's label, which a message about a table starts with
  double base_lr = 0;       // the sparse optimizer's get_lr after its factory
  double grad_norm = NAN;   // the latest step's sparse_grad_norm (over every rank)
  bool any() const { return !tables.empty(); }
};

// Reads the model's tables (keel_model.table_count/table) and checks them; creates the
// [sparse_optimizer] over them. A model with tables needs a [sparse_optimizer], and a
// [sparse_optimizer] needs a model with tables: either mismatch is an error.
void create_sparse_optimizer(Run& run);

// This rank's sum of squares of the step's row gradients (touched), over every table; NaN or
// Inf when a gradient is not finite.
double sparse_grad_squares(const SparseTables& sparse);

// The sparse optimizer's step (a finite step only).
void sparse_update(const Instance<keel_sparse_optimizer>& optimizer);

// Every table's end_step(step), after every step, skipped ones included.
void end_sparse_step(const SparseTables& sparse, int64_t step);

// The sparse optimizer's learning rate: its base times the schedule's factor.
void set_sparse_lr(const Instance<keel_sparse_optimizer>& optimizer, const SparseTables& sparse,
                   double factor);

// table_rows, admitted, evicted (sums over the tables and, with several ranks, over the ranks:
// one all-reduce over `group` on every rank, when it is not null) and sparse_grad_norm; nothing
// when the model has no tables.
void add_table_metrics(const SparseTables& sparse, ProcessGroup* group,
                       std::vector<keel_metric>& record);

// Every table's save entries as "<table>.<entry>" in object "tables" (rank 0) or
// "rank<r>.tables", and the sparse optimizer's state_save (when offered) in "sparse_optimizer"
// (rank 0).
void add_tables(const Run& run, Snapshot& snap);

// A resumed run's tables and sparse optimizer state: at the saved number of ranks each rank
// loads its own part; at another, every saved part in turn (each table keeps the rows it owns).
void load_tables(Run& run, const CommitRecord& rec, const std::string& dir);

// [checkpoint] init_from (and `keel evaluate`): every saved part of the tables of `rec` in turn,
// rows and slots (each table keeps the ids it owns); a warning when there are none (or no
// record, `rec` null).
void load_init_tables(Run& run, const CommitRecord* rec, const std::string& dir);

}  // namespace keel
