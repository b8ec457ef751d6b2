// keel export's sparse tables (abi.h "(1.9) Sparse embedding tables"): the rows a checkpoint
// holds, every rank's part merged, and the delta between two checkpoints.
//
// A checkpoint of a model with tables holds object `tables` (rank 0) and `rank<r>.tables` (rank
// r > 0), each with every table's entries under `<table>.<entry>` (the table's save slot names
// the entries; keel::EmbeddingTable puts `ids`, int64 [n], and `values`, float32 [n, dim], among
// others). read_tables reads `<table>.ids` and `<table>.values` of every part with the
// checkpoint's backend (shapes from the commit record) and merges them: rows sorted by id, an id
// held by two parts is an error. Other entries (optimizer slots, counters) are not exported.
//
// table_delta(old, new) is what serving needs to go from `old` to `new`: the rows of `new` that
// are not in `old` or whose values differ from `old`'s in any bit (`ids`, `values`), and the ids
// of `old` that `new` no longer holds (`removed_ids`: evicted rows). A table only in `new` is
// all changed rows; one only in `old` is all removed ids.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "checkpoint/backend.hpp"
#include "checkpoint/commit.hpp"

namespace keel::cli {

struct TableRows {
  at::Tensor ids;     // int64 [n], ascending
  at::Tensor values;  // float32 [n, dim]
};

struct TableDelta {
  at::Tensor ids;          // int64 [c], ascending: rows added or changed
  at::Tensor values;       // float32 [c, dim]
  at::Tensor removed_ids;  // int64 [r], ascending
};

// Table name -> its rows, from checkpoint `dir` (verified, `record` its commit record); empty
// when the checkpoint holds no tables. Throws keel::Error naming the checkpoint and the table.
std::map<std::string, TableRows> read_tables(const CheckpointBackend& backend,
                                             const std::string& dir, const CommitRecord& record);

// Table name -> the delta from `old_rows` to `new_rows` (both as read_tables returns them).
// Throws keel::Error when a table's row width differs between the two.
std::map<std::string, TableDelta> table_delta(const std::map<std::string, TableRows>& old_rows,
                                              const std::map<std::string, TableRows>& new_rows);

}  // namespace keel::cli
