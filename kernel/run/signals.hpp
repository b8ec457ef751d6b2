// SIGTERM / SIGINT during training: the first one asks the loop to stop after the current step
// (saving a checkpoint when the run keeps them); a second one ends the process at once with
// 128 + its number.
#pragma once

#include <signal.h>

namespace keel {

// Installs the handlers for its lifetime (a training run) and restores the previous ones.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received since the handlers were installed (0: none).
  static int received();

 private:
  struct sigaction old_term_ {}, old_int_ {};
};

}  // namespace keel
