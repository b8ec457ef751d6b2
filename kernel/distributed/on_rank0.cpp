#include "distributed/on_rank0.hpp"

#include <exception>

#include "distributed/process_group.hpp"
#include "error.hpp"

namespace keel {

namespace {

// The outcome as ProcessGroup::share carries it: a status byte, then the value.
std::string encode(const RankZeroOutcome& o) {
  return (o.status == RankZeroOutcome::Status::kDone ? "D" : "F") + o.value;
}

RankZeroOutcome decode(const std::string& wire) {
  RankZeroOutcome o;
  o.status = !wire.empty() && wire[0] == 'D' ? RankZeroOutcome::Status::kDone
                                             : RankZeroOutcome::Status::kFailed;
  if (o.status == RankZeroOutcome::Status::kDone) o.value = wire.substr(1);
  return o;
}

}  // namespace

std::string on_rank0(ProcessGroup* group, int rank, const std::string& what,
                     const std::function<std::string()>& body) {
  if (group == nullptr) return body();
  if (rank != 0) {
    const RankZeroOutcome outcome = decode(group->share("", what));
    if (outcome.status == RankZeroOutcome::Status::kFailed)
      throw Error("rank 0 failed to " + what + " (its log says why)");
    return outcome.value;
  }
  RankZeroOutcome outcome;
  try {
    outcome.value = body();
  } catch (...) {
    try {
      group->share(encode({RankZeroOutcome::Status::kFailed, ""}), what);
    } catch (const std::exception&) {  // the error that ends the run is body's
    }
    throw;
  }
  group->share(encode(outcome), what);
  return outcome.value;
}

}  // namespace keel
