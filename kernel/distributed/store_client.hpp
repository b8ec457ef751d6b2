// A connection of its own to the job's store (the TCPStore the process group rendezvoused
// through, under the same key prefix), for a thread other than the training thread: an
// asynchronous checkpoint's writer (checkpoint/multi_rank.hpp). c10d's TCPStore client holds a
// lock for the whole of a get or wait, so a writer waiting on the training thread's client
// would hold up that thread's share and gather; with its own client it never does.
#pragma once

#include <memory>
#include <string>

namespace keel {

class ProcessGroup;

class StoreClient {
 public:
  // Connects to `group`'s store (on the calling thread). Throws keel::Error when the store
  // cannot be reached within [distributed] timeout_s.
  explicit StoreClient(ProcessGroup& group);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Sets `key` (under keel's prefix) to `value`. `what` names the operation in errors.
  void set(const std::string& key, const std::string& value, const std::string& what);
  // The value of `key` once some process has set it, waiting at most [distributed] timeout_s;
  // throws keel::Error (naming `what`, this rank and the timeout) when it is not set by then.
  std::string get(const std::string& key, const std::string& what);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel
