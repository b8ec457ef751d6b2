// commit.json, the commit record of a checkpoint directory (Orbax's commit marker): written
// last into the staging directory, after every other file was written, checksummed and
// fsync'd. A directory without a valid one is not a checkpoint: loaders ignore it.
//
//   {"format": "keel-checkpoint", "version": 2,
//    "run_id": "3f2a9c1e5b7d4e60", "step": 32, "committed_unix_ns": 1795000000000000000,
//    "files": [{"name": "model.safetensors", "size": 402128, "xxh3": "9c0f..."}, ...],
//    "tensors": {"rank1.optimizer": [{"name": "fc1.weight.exp_avg", "dtype": "F32",
//                                     "shape": [128, 784]}, ...], ...},
//    "chunks": {"optimizer": {"fc1.weight.exp_avg": {"dtype": "F32", "shape": [256, 784],
//                 "like": "fc1.weight",
//                 "chunks": [{"offset": [0, 0], "size": [128, 784], "object": "rank0.optimizer",
//                             "file": "rank0.optimizer.safetensors"},
//                            {"offset": [128, 0], "size": [128, 784],
//                             "object": "rank1.optimizer", ...}]}, ...},
//               "model": {...}},
//    "metrics": {"test.loss": 0.41, "train.loss": 0.38}}
//
// `files` lists every other file of the directory (trainer_state.toml and
// manifest.resolved.toml included) with its size and XXH3-64 checksum; `tensors` indexes each
// backend object as written (local shapes) so that a loader can allocate tensors before it
// reads them; `chunks` indexes the model's and the optimizer's tensors globally (as
// torch.distributed.checkpoint does): each tensor's global dtype and shape, the parameter an
// elementwise optimizer entry is `like` (its rows are that parameter's rows), and the chunks
// that hold it: where in the global tensor (offset, size: whole rows of dim 0) and in which
// backend object (and the file the backend wrote it to, when it wrote one named after the
// object). A chunk's object holds it under the tensor's global name with shape `size`.
// `metrics` holds the latest record of each split (keep_best ranks by them). LibTorch-free.
//
// Version 1 records (no `chunks`) still read: their chunks are synthesised from `tensors`
// (read_commit_record), so old checkpoints keep resuming.
//
// Beside it, commit.json.xxh3 holds its checksum ("xxh3:<16 lowercase hex digits>\n" of
// commit.json's bytes), written with it before the commit, so that a damaged record is caught
// as a damaged file is. Records written before issue 43 have none: verify_checkpoint accepts
// them with a warning (their names and claims are checked all the same).
//
// What a record names is checked before anything is opened (issue 43): every file name, every
// backend object (`tensors`' keys, a chunk's `object`) and a chunk's `file` is a plain name (no
// '/', no leading '.', no control byte, at most 255 bytes), so that "<dir>/<object>.<ext>" is a
// file of the checkpoint directory itself; verify_checkpoint then opens every listed file
// without following links, requires each object a chunk names to have a listed file, and
// bounds what the record claims: no shape's byte count overflows 64 bits, and the tensors an
// object holds claim no more bytes than its files ("<object>.*") hold, so that a loader
// allocating tensors from these shapes allocates no more than the checkpoint's size.
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
    // The file as verify_checkpoint hashed it in this process (all 0 otherwise: not written or
    // read as JSON): which inode, and its status change time, which any write to it, a rename
    // onto it or of it moves; check_unchanged compares them after a load.
    uint64_t dev = 0, ino = 0;
    int64_t ctime_ns = 0;
  };
  struct Tensor {
    std::string name;
    std::string dtype;  // F32, F64, F16, BF16, I64, I32, I8, U8, BOOL
    std::vector<int64_t> shape;
  };
  // One piece of a tensor, held by a backend object under the tensor's name.
  struct Chunk {
    std::vector<int64_t> offset, size;  // in the global tensor; rank = the tensor's
    std::string object;                 // the backend object (stem) holding it
    std::string file;                   // the file it was written to ("": not known)
    bool operator==(const Chunk& o) const {
      return offset == o.offset && size == o.size && object == o.object && file == o.file;
    }
  };
  struct Global {
    std::string dtype;
    std::vector<int64_t> shape;
    std::string like;  // optimizer entries: the parameter whose rows these are ("": replicated)
    std::vector<Chunk> chunks;
    bool operator==(const Global& o) const {
      return dtype == o.dtype && shape == o.shape && like == o.like && chunks == o.chunks;
    }
  };
  // "model" | "optimizer" -> tensor name -> its global description (== compares all of it).
  using ChunkIndex = std::map<std::string, std::map<std::string, Global>>;

  std::string run_id;
  int64_t step = 0;
  int64_t committed_unix_ns = 0;
  std::vector<File> files;
  std::map<std::string, std::vector<Tensor>> tensors;  // backend object -> its tensors
  ChunkIndex chunks;
  std::map<std::string, double> metrics;               // "<split>.<key>" -> value
  int version = 2;  // as read (write_commit_record always writes 2)
};

// Adds another rank's part (its `tensors` and `chunks`) to `into`: the chunks of a tensor
// both hold are joined, in offset order. Throws keel::Error when they disagree on a tensor's
// dtype, shape or `like`.
void merge_part(CommitRecord& into, const CommitRecord& part);

// "" when the chunks of `g` cover the whole tensor (their rows' union is [0, rows), each chunk
// spans the trailing dimensions whole, inside the shape), else what is missing or wrong:
// "rows 48..95 missing". A 0-dim tensor needs one chunk; a tensor of 0 rows none.
std::string coverage_gap(const CommitRecord::Global& g);

// The file beside commit.json that holds its checksum, and that file's text for record text
// `text` ("xxh3:<16 lowercase hex digits>\n").
inline constexpr const char* kRecordChecksumFile = "commit.json.xxh3";
std::string record_checksum_text(const std::string& text);

// True when `name` may name a file or backend object of a checkpoint: not empty, at most 255
// bytes, no '/', no leading '.', no control byte (below 0x20, or 0x7f).
bool plain_name(const std::string& name);

// The JSON text of a record.
std::string write_commit_record(const CommitRecord& record);

// Parses commit.json text; throws keel::Error "<path>: invalid commit record: <what>".
CommitRecord read_commit_record(std::string_view text, const std::string& path);

// What record `r` (of commit.json `path`) names and claims, against the files it lists: each
// object a chunk names has a listed file ("<object>.*"), each chunk's `file` is listed, no
// shape's byte count overflows 64 bits, and the tensors of each object (as `tensors` lists
// them, and as the chunks place them) claim no more bytes than its files hold. Throws
// keel::Error "<path>: <group> tensor 'x' of object 'o' claims ...; hint: ..." (one line).
void check_record_claims(const CommitRecord& r, const std::string& path);

// Reads <dir>/commit.json and checks it against commit.json.xxh3 (when there is one), that every
// file it lists is a regular file of the directory itself (opened without following a link)
// with its size and checksum, that the directory holds no other file, that each object a chunk
// names has a listed file, and that no tensor claims more bytes than 64 bits count or than its
// object's files hold. Throws keel::Error naming the first file that fails (e.g.
// "<dir>/model.safetensors: checksum mismatch (...)"), or the tensor and the record.
CommitRecord verify_checkpoint(const std::string& dir);

// Throws keel::Error naming the first file of `r` (of the files of backend object `object`,
// "<object>.*", or of all when it is "") that is no longer the file verify_checkpoint hashed:
// another inode under its name, or the same one written or renamed since (its status change
// time moved). Called after a load, so that the bytes a backend loaded by name are the bytes
// that were verified. Files that this process did not verify (rank r > 0 of --resume reads the
// record rank 0 verified) are not checked.
void check_unchanged(const std::string& dir, const CommitRecord& r, const std::string& object = "");

// <dir>/commit.json parsed (opened without following a link), without checking its checksum or
// the files (for listing and retention; --resume's ranks after the first, which read what rank
// 0 verified); throws like read_commit_record, or when it cannot be read.
CommitRecord read_commit_file(const std::string& dir);

}  // namespace keel
