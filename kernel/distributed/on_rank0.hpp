// Work that one process does for all of them (prepare the run directory, choose the run id,
// choose the checkpoint to resume from): rank 0 runs it and shares its outcome, so that every
// rank continues with the same result, or every rank fails.
#pragma once

#include <functional>
#include <string>

namespace keel {

class ProcessGroup;

// What rank 0 shares: whether its work succeeded, and its result when it did.
struct RankZeroOutcome {
  enum class Status { kDone, kFailed };
  Status status = Status::kDone;
  std::string value;  // the result (kDone only)
};

// Runs `body` on rank 0 and returns its result on every rank (`group` null: this process runs
// alone and simply runs `body`). When `body` throws on rank 0, rank 0 tells the others
// (Status::kFailed) and rethrows; they throw keel::Error "rank 0 failed to <what> (its log says
// why)" instead of waiting for a result that never comes.
std::string on_rank0(ProcessGroup* group, int rank, const std::string& what,
                     const std::function<std::string()>& body);

}  // namespace keel
