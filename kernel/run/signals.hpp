// SIGTERM / SIGINT during training: the first one asks the loop to stop after the current step
// (saving a checkpoint when the run keeps them), or at once when the training data waits for
// data and gives up (keel_host.stop_requested and KEEL_BATCH_STOPPED, ABI 1.10); a second one
// ends the process at once with 128 + its number.
#pragma once

#include <signal.h>

#include "components.hpp"

namespace keel {

// Installs the handlers for its lifetime (a training run) and restores the previous ones.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received since the handlers were installed (0: none). Async-signal-safe: one
  // atomic load (keel_host.stop_requested reads it).
  static int received();

 private:
  struct sigaction old_term_ {}, old_int_ {};
};

// What a dataset's next reported in *has_batch (abi.h): the end of the epoch, a batch, or that
// it stopped waiting for data because a stop was requested (KEEL_BATCH_STOPPED, from a plugin
// of ABI 1.10 or later; from an older one any nonzero value is a batch). A KEEL_BATCH_STOPPED
// while no stop was requested fails naming the dataset.
enum class NextResult { kEnd, kBatch, kStopped };
NextResult next_result(const Instance<keel_dataset>& data, int has_batch);

}  // namespace keel
