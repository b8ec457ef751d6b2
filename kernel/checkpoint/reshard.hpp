// Checkpoints that reshard (docs/checkpoints.md, "Chunks and resharding"): which rows of the
// model's parameters and of the optimizer's elementwise state a rank writes and reads, and the
// loader that reads any rows of a checkpoint's tensors from the chunks that hold them, at any
// world size and [distributed] shard mode.
//
// A parameter of `rows` rows (a 0-dim one counts as one row) is cut as distributed/sharding.hpp
// cuts it: this rank holds rows [begin, begin + count); without shards, all of them. An
// optimizer entry is elementwise over parameter p ("like" p) when its name is "<p>.<suffix>"
// (the longest such p), its dtype is p's and its shape is this rank's part of p; its rows are
// p's rows. Every other entry is the same on every rank (rank 0's is saved).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/commit.hpp"

namespace keel {

class CheckpointBackend;

// One parameter as this rank holds it.
struct ParamRows {
  std::string name;
  std::vector<int64_t> shape;  // global
  at::ScalarType dtype = at::kFloat;
  int64_t begin = 0, count = 0, rows = 0;
  // This rank's part's shape: `shape` with `count` rows (0-dim: [] on the owner, else [0]).
  std::vector<int64_t> local_shape() const;
};

// The index of the parameter that an optimizer entry (name, dtype, shape as this rank holds
// it) is elementwise over, or -1.
int64_t like_param(const std::vector<ParamRows>& params, const std::string& name,
                   at::ScalarType dtype, const std::vector<int64_t>& shape);
// The index of the parameter `name` is named after ("<p>.<suffix>", longest p), or -1.
int64_t named_after(const std::vector<ParamRows>& params, const std::string& name);

// An uninitialised tensor of `shape` and `dtype` for tensor `what` ("optimizer tensor 'x'") of
// checkpoint `dir`, allocated as a loader allocates what the commit record claims (its claims
// are bounded by its files' size: commit.hpp); an allocation that fails is keel::Error naming
// the tensor, its bytes and the checkpoint, not LibTorch's error.
at::Tensor allocate_claimed(const std::vector<int64_t>& shape, at::ScalarType dtype,
                            const std::string& what, const std::string& dir);

// Reads rows of a checkpoint's global tensors (CommitRecord::chunks) from the chunks that
// hold them. Each backend object is loaded once per read(), with only the names needed from
// it: every chunk overlapping the requested rows is read whole (as torch.distributed.checkpoint
// reads whole items) and its overlap copied.
class ChunkReader {
 public:
  ChunkReader(const CheckpointBackend& backend, std::string dir, const CommitRecord& record);

  struct Request {
    std::string group, name;  // "model" | "optimizer", the global tensor
    int64_t begin = 0;        // first row (0-dim: 0)
    at::Tensor into;          // its rows [begin, begin + into.size(0)) (0-dim: whole)
  };
  // Throws keel::Error naming the tensor when the checkpoint has no such tensor, its chunks do
  // not cover it, or the requested rows lie outside it.
  void read(const std::vector<Request>& requests) const;

  const CommitRecord& record() const { return record_; }
  // The global tensor `name` of `group`, or nullptr.
  const CommitRecord::Global* find(const std::string& group, const std::string& name) const;
  // Throws keel::Error "<dir>: tensor 'x' [96, 32] is not covered by its chunks (rows 48..95
  // missing); hint: ..." for the first tensor of `group` whose chunks leave a gap.
  void check_coverage(const std::string& group) const;

 private:
  const CheckpointBackend& backend_;
  std::string dir_;
  const CommitRecord& record_;
};

}  // namespace keel
