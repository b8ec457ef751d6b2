#include "checkpoint/multi_rank.hpp"

#include <exception>
#include <vector>

#include "distributed/process_group.hpp"
#include "error.hpp"

namespace keel {

namespace {

// Rank r > 0: writes its part into rank 0's staging directory and follows rank 0's commit.
std::string write_part_of_save(CheckpointStore& store, ProcessGroup& group,
                               const Snapshot& snap, const std::string& at) {
  const std::string staging = group.share("", "sharing the staging directory of" + at);
  std::string index, failure;
  if (!staging.empty()) {
    try {
      CommitRecord part;
      part.tensors = store.write_part(staging, snap.objects);
      index = write_commit_record(part);
    } catch (const std::exception& e) {  // reported after the agreement, not instead of it
      failure = e.what();
    }
  }
  group.gather(index, "collecting the parts of" + at);
  if (!group.all(!staging.empty() && failure.empty(), "agreeing on the parts of" + at))
    throw Error(failure.empty() ? "another rank failed to write its part of" + at +
                                      " (its log says why); nothing was committed"
                                : failure);
  const std::string dir = group.share("", "committing" + at);
  if (dir.empty()) throw Error("rank 0 failed to commit" + at + " (its log says why)");
  return dir;
}

// Rank 0: stages, collects the other parts, commits and shares the committed directory. When
// it fails, it runs the rest of the protocol with "failed" answers so that the others fail now.
std::string commit_save(CheckpointStore& store, ProcessGroup& group, const Snapshot& snap,
                        const std::string& at) {
  enum { kStart, kStaged, kAgreed, kRefused } phase = kStart;
  SaveParts parts;
  parts.staged = [&](const std::string& staging) {
    group.share(staging, "sharing the staging directory of" + at);
    phase = kStaged;
  };
  parts.written = [&] {
    const std::vector<std::string> indexes = group.gather("", "collecting the parts of" + at);
    phase = kRefused;
    if (!group.all(true, "agreeing on the parts of" + at))
      throw Error("another rank failed to write its part of" + at +
                  " (its log says why); nothing was committed");
    phase = kAgreed;
    TensorIndex all;
    for (size_t r = 1; r < indexes.size(); ++r)
      for (auto& [stem, index] :
           read_commit_record(indexes[r], "the index of rank " + std::to_string(r)).tensors)
        all[stem] = std::move(index);
    return all;
  };
  std::string dir;
  try {
    dir = store.save(snap, parts);
  } catch (...) {
    try {  // let the other ranks fail now rather than wait for the timeout
      if (phase == kStart) group.share("", "sharing the staging directory of" + at);
      if (phase == kStart || phase == kStaged) {
        group.gather("", "collecting the parts of" + at);
        group.all(false, "agreeing on the parts of" + at);
      }
      if (phase == kAgreed) group.share("", "committing" + at);
    } catch (const std::exception&) {  // the error that ends the run is the save's
    }
    throw;
  }
  return group.share(dir, "committing" + at);
}

}  // namespace

std::string save_on_every_rank(CheckpointStore& store, ProcessGroup& group, int rank,
                               const Snapshot& snapshot) {
  const std::string at = " the checkpoint of step " + std::to_string(snapshot.meta.step);
  return rank == 0 ? commit_save(store, group, snapshot, at)
                   : write_part_of_save(store, group, snapshot, at);
}

}  // namespace keel
