// The checkpoint commit protocol (owned by the kernel; backends only write files).
//
//   <run>/checkpoints/.step-<N>-<token>.lock  flock'd by the saving process for the whole save
//   <run>/checkpoints/.step-<N>-<token>.tmp/  staging: the backend writes one file per object
//                                   (model, optimizer, hooks, rng, state), the kernel writes
//                                   trainer_state.toml and manifest.resolved.toml
//   checksum + fsync every file      XXH3-64 of each file (read back from the page cache)
//                                   while a second thread fsyncs them
//   commit.json                      the commit record, written last and fsync'd, with its
//                                   checksum beside it (commit.json.xxh3)
//   fsync the staging directory
//   rename(staging, step-<N>)        the commit (renameat2 RENAME_NOREPLACE), then fsync of
//                                   checkpoints/ (durable_rename_new); a committed step-<N> of
//                                   this run is replaced atomically (RENAME_EXCHANGE), one of
//                                   another run is left alone and this one is named
//                                   step-<N>-<run_id> instead (also when another run takes the
//                                   name between the check and the rename)
//   retention                        keep_last / keep_best over this run's checkpoints only;
//                                   never the one just committed. A checkpoint is deleted by
//                                   renaming it to .trash-<token> first, then removing it.
//
// A failed save removes its staging directory and reports the error; committed checkpoints are
// never touched by it. Staging directories of killed saves (their lock no longer held), lock
// files no process holds, and trash are removed by remove_stale() at the start of the next run.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/backend.hpp"
#include "checkpoint/commit.hpp"
#include "checkpoint/meta.hpp"
#include "config/sections.hpp"
#include "error.hpp"

namespace keel {

using TensorList = std::vector<std::pair<std::string, at::Tensor>>;

// Where a tensor of a snapshot's object lies in the checkpoint's chunk index (commit.hpp): in
// global tensor <its name> of `group` ("model" | "optimizer"), of global `shape`, from row
// `begin` on (0-dim: whole). `like`: the parameter an elementwise optimizer entry follows.
struct Placement {
  std::string group;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  std::string like;
};

// Everything one checkpoint holds, gathered on the training thread at a step boundary.
struct Snapshot {
  std::vector<std::pair<std::string, TensorList>> objects;  // backend stem -> tensors
  // object -> tensor name -> its place in the chunk index (tensors without one are indexed
  // only by object, as rng, state and hooks are).
  std::map<std::string, std::map<std::string, Placement>> placements;
  CheckpointMeta meta;                 // meta.objects is filled by the store
  std::string manifest;                // text of manifest.resolved.toml
  std::map<std::string, double> metrics;  // "<split>.<key>", for keep_best
  // Tensors (by TensorImpl) that only the optimizer step changes (parameters, optimizer
  // state): an asynchronous save copies them on its writer thread, and the training thread
  // waits for that copy before its next optimizer step (wait_copied).
  std::set<const void*> deferred;
  // Replaces each tensor in `deferred` (deferred_ones = true) or each one not in it (false) by
  // a CPU copy that training cannot change. A CUDA tensor's copy goes to pinned host memory,
  // asynchronously; the call returns once each device it copied from has synchronised.
  void copy_tensors(bool deferred_ones);
};

// A save that other processes add files to (data parallelism: each rank writes its own part
// into the staging directory; see checkpoint/multi_rank.hpp).
struct SaveParts {
  // Called once the staging directory exists, before this process writes into it.
  std::function<void(const std::string& staging)> staged;
  // Called after this process wrote its objects, before anything is checksummed: waits until
  // every other part is written and returns their index (its `tensors` and `chunks`, merged
  // into the commit record); throws when a part failed, which abandons the save.
  std::function<CommitRecord()> written;
};

class CheckpointStore {
 public:
  // Retention, once a new checkpoint is committed, by [checkpoint]'s keys: the newest keep_last
  // of this run's checkpoints by step, the best keep_best by best_metric ("test.loss": the
  // latest record of split "test" when saved; best_mode), and always the new one. Both 0: keep
  // everything. The store reads no other key. `backend` writes and reads the objects' files;
  // it outlives the store.
  CheckpointStore(std::string root, const CheckpointBackend* backend, CheckpointKeys retention,
                  std::string run_id);
  ~CheckpointStore();  // waits for an asynchronous save still in flight
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  // Removes staging directories whose lock no process holds, lock files no process holds
  // (of saves killed before their staging directory existed or after it was renamed), and
  // trash. Returns how many.
  int remove_stale();

  // Stages, checksums, commits and applies retention; returns the committed directory.
  // `parts`: other processes write into the staging directory too. Not while an asynchronous
  // save is in flight, except from that save's own thread (its `finish`).
  std::string save(const Snapshot& snapshot, const SaveParts& parts = {});

  // Writes the objects of `snapshot` into `staging` with the backend (one file set per object;
  // empty objects are skipped) and returns their index (`tensors`, and `chunks` of the placed
  // ones): another rank's part of a save.
  CommitRecord write_part(const std::string& staging, const Snapshot& snapshot) const;

  // Asynchronous save: the tensors of `snapshot` not in `deferred` are copied now, the deferred
  // ones on a background thread, which then runs `finish` on the copy: it writes (and commits)
  // it and returns the committed directory. Without `finish`, save(copy) (several ranks:
  // checkpoint/multi_rank.hpp gives one, which may call save from that thread). At most one
  // is in flight: call wait() first (save_async refuses otherwise).
  using Finish = std::function<std::string(const Snapshot&)>;
  void save_async(Snapshot snapshot, Finish finish = {});
  // Waits until the save in flight has copied its deferred tensors (at once when none is in
  // flight): after it, they may change again.
  void wait_copied();
  bool in_flight() const { return worker_.joinable(); }
  // True when the save in flight has finished (wait() then returns at once).
  bool ready() const;
  // Waits for the save in flight; returns its committed directory, or throws its error.
  std::string wait();

  struct Entry {
    std::string dir;
    CommitRecord record;
  };
  // Checkpoint directories under `root` with a readable commit record (files not verified),
  // oldest commit first.
  static std::vector<Entry> list(const std::string& root);
  // The newest of list(root) whose files verify (verify_checkpoint; `record` is the verified
  // one), or nullopt when none does. `skipped` (when given) hears of each newer one that does
  // not, with why. `keel train --resume` and `keel evaluate` without init_from start from it.
  static std::optional<Entry> newest_verified(
      const std::string& root,
      const std::function<void(const std::string& dir, const Error& why)>& skipped = {});

  // Reads backend object `stem` of checkpoint `dir` into `into` (same names and shapes).
  void load(const std::string& dir, const std::string& stem, const TensorList& into) const;

 private:
  std::string commit(const Snapshot& snapshot, const SaveParts& parts);
  void prune(const std::string& committed);

  std::string root_;
  const CheckpointBackend* backend_;
  CheckpointKeys retention_;
  std::string run_id_;
  std::thread worker_;
  std::shared_ptr<struct AsyncResult> result_;
};

// A random 16-hex-digit token (run ids, staging names).
std::string random_token();

// "F32", "I64", ... for a tensor's dtype, and back (at::ScalarType::Undefined when unknown).
std::string dtype_name(at::ScalarType type);
at::ScalarType dtype_of_name(const std::string& name);

}  // namespace keel
