#include "checkpoint/multi_rank.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <utility>
#include <vector>

#include "distributed/process_group.hpp"
#include "distributed/store_client.hpp"
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
      index = write_commit_record(store.write_part(staging, snap));
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
// it fails, it runs the rest of the protocol with "failed" answers so that the others fail now;
// not when the failure was a step of the protocol itself (another rank died or hangs): its
// remaining steps would only wait for that rank again, each up to the timeout.
std::string commit_save(CheckpointStore& store, ProcessGroup& group, const Snapshot& snap,
                        const std::string& at) {
  // kDone: rank 0 owes the others no more answers: it is in a step of the protocol (which
  // failed, if the save throws there), or the agreement has answered them.
  enum { kStart, kStaged, kAgreed, kDone } phase = kStart;
  SaveParts parts;
  parts.staged = [&](const std::string& staging) {
    phase = kDone;  // until the step returns
    group.share(staging, "sharing the staging directory of" + at);
    phase = kStaged;
  };
  parts.written = [&] {
    phase = kDone;  // until the step returns
    const std::vector<std::string> indexes = group.gather("", "collecting the parts of" + at);
    if (!group.all(true, "agreeing on the parts of" + at))
      throw Error("another rank failed to write its part of" + at +
                  " (its log says why); nothing was committed");
    phase = kAgreed;
    CommitRecord all;
    for (size_t r = 1; r < indexes.size(); ++r)
      merge_part(all, read_commit_record(indexes[r], "the index of rank " + std::to_string(r)));
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

// An asynchronous save's keys and where errors say it is.
struct AsyncSave {
  std::string key;  // "async/<serial>/"
  std::string at;   // " the checkpoint of step <N>"
  int rank, world;
};

constexpr const char* kFailed = "failed:";

bool failed(const std::string& value) { return value.rfind(kFailed, 0) == 0; }

// For tests only (docs/checkpoints.md): with KEEL_TEST_KILL_IN_SAVE=<N>, rank 1 kills its own
// process (SIGKILL) once its writer has written its part of the save of step N, before it
// reports the part.
void killed_for_tests(const AsyncSave& save, int64_t step) {
  const char* at = std::getenv("KEEL_TEST_KILL_IN_SAVE");
  if (save.rank == 1 && at && std::to_string(step) == at) ::kill(::getpid(), SIGKILL);
}

// Rank 0's writer: stages, collects every other part through the store, commits and sets the
// committed directory; when it fails, it sets its keys to the failure so that the other
// writers fail now.
std::string commit_async(CheckpointStore& store, StoreClient& client, const AsyncSave& save,
                         const Snapshot& snap) {
  bool staged = false;
  SaveParts parts;
  parts.staged = [&](const std::string& staging) {
    client.set(save.key + "staging", staging, "sharing the staging directory of" + save.at);
    staged = true;
  };
  parts.written = [&] {
    CommitRecord all;
    for (int r = 1; r < save.world; ++r) {
      const std::string rank = "rank " + std::to_string(r);
      const std::string index = client.get(save.key + "part" + std::to_string(r),
                                           "collecting the part of " + rank + " of" + save.at);
      if (failed(index))
        throw Error(rank + " failed to write its part of" + save.at + " (" +
                    index.substr(std::string(kFailed).size()) + "); nothing was committed");
      merge_part(all, read_commit_record(index, "the index of " + rank));
    }
    return all;
  };
  std::string dir;
  try {
    dir = store.save(snap, parts);
  } catch (const std::exception& e) {
    try {  // let the other writers fail now rather than at the timeout
      if (!staged) client.set(save.key + "staging", "", "failing" + save.at);
      client.set(save.key + "committed", kFailed + std::string(e.what()), "failing" + save.at);
    } catch (const std::exception&) {  // the error that ends the run is the save's
    }
    throw;
  }
  client.set(save.key + "committed", dir, "sharing the commit of" + save.at);
  return dir;
}

// Rank r > 0's writer: writes its part into rank 0's staging directory, reports it (or its
// failure) through the store and follows rank 0's commit.
std::string write_part_async(CheckpointStore& store, StoreClient& client, const AsyncSave& save,
                             const Snapshot& snap) {
  const std::string part = save.key + "part" + std::to_string(save.rank);
  std::string index;
  try {
    const std::string staging =
        client.get(save.key + "staging", "getting the staging directory of" + save.at);
    if (staging.empty())
      throw Error("rank 0 failed to stage" + save.at + " (its log says why)");
    index = write_commit_record(store.write_part(staging, snap));
    killed_for_tests(save, snap.meta.step);
  } catch (const std::exception& e) {
    try {
      client.set(part, kFailed + std::string(e.what()), "failing" + save.at);
    } catch (const std::exception&) {  // the error that ends the run is the save's
    }
    throw;
  }
  client.set(part, index, "reporting the part of" + save.at);
  const std::string dir = client.get(save.key + "committed", "waiting for the commit of" + save.at);
  if (failed(dir))
    throw Error("rank 0 failed to commit" + save.at + " (" +
                dir.substr(std::string(kFailed).size()) + ")");
  return dir;
}

}  // namespace

void save_async_on_every_rank(CheckpointStore& store, std::shared_ptr<StoreClient> client,
                              int rank, int world, int64_t serial, Snapshot snapshot) {
  AsyncSave save{"async/" + std::to_string(serial) + "/",
                 " the checkpoint of step " + std::to_string(snapshot.meta.step), rank, world};
  store.save_async(std::move(snapshot), [&store, client = std::move(client),
                                         save = std::move(save)](const Snapshot& snap) {
    return save.rank == 0 ? commit_async(store, *client, save, snap)
                          : write_part_async(store, *client, save, snap);
  });
}

std::string save_on_every_rank(CheckpointStore& store, ProcessGroup& group, int rank,
                               const Snapshot& snapshot) {
  const std::string at = " the checkpoint of step " + std::to_string(snapshot.meta.step);
  return rank == 0 ? commit_save(store, group, snapshot, at)
                   : write_part_of_save(store, group, snapshot, at);
}

}  // namespace keel
