// commit.json, the commit record of a checkpoint directory (Orbax's commit marker): written
// last into the staging directory, after every other file was written, checksummed and
// fsync'd. A directory without a valid one is not a checkpoint: loaders ignore it.
//
//   {"format": "keel-checkpoint", "version": 1,
//    "run_id": "3f2a9c1e5b7d4e60", "step": 32, "committed_unix_ns": 1795000000000000000,
//    "files": [{"name": "model.safetensors", "size": 402128, "xxh3": "9c0f..."}, ...],
//    "tensors": {"optimizer": [{"name": "fc1.weight.exp_avg", "dtype": "F32",
//                               "shape": [256, 784]}, ...], ...},
//    "metrics": {"test.loss": 0.41, "train.loss": 0.38}}
//
// `files` lists every other file of the directory (trainer_state.toml and
// manifest.resolved.toml included) with its size and XXH3-64 checksum; `tensors` indexes each
// backend object so that a loader can allocate tensors before it reads them; `metrics` holds
// the latest record of each split (keep_best ranks by them). LibTorch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace keel {

struct CommitRecord {
  struct File {
    std::string name;
    uint64_t size = 0;
    uint64_t xxh3 = 0;
  };
  struct Tensor {
    std::string name;
    std::string dtype;  // F32, F64, F16, BF16, I64, I32, I8, U8, BOOL
    std::vector<int64_t> shape;
  };
  std::string run_id;
  int64_t step = 0;
  int64_t committed_unix_ns = 0;
  std::vector<File> files;
  std::map<std::string, std::vector<Tensor>> tensors;  // backend object -> its tensors
  std::map<std::string, double> metrics;               // "<split>.<key>" -> value
};

// The JSON text of a record.
std::string write_commit_record(const CommitRecord& record);

// Parses commit.json text; throws keel::Error "<path>: invalid commit record: <what>".
CommitRecord read_commit_record(std::string_view text, const std::string& path);

// Reads <dir>/commit.json and checks that every file it lists exists with its size and
// checksum, and that the directory holds no other file. Throws keel::Error naming the first
// file that fails (e.g. "<dir>/model.safetensors: checksum mismatch (...)").
CommitRecord verify_checkpoint(const std::string& dir);

// <dir>/commit.json parsed, without checking the files (for listing and retention); throws
// like read_commit_record, or when it cannot be read.
CommitRecord read_commit_file(const std::string& dir);

}  // namespace keel
