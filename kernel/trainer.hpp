// The training loop. Trainer assembles a run from a validated RunConfig (every component
// created before step 1) and runs it; see abi.h (keel_hook) for the event order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "run_config.hpp"

namespace keel {

struct RunSummary {
  int64_t steps = 0;
  int64_t samples = 0;
  int64_t skipped_steps = 0;
  double last_loss = 0;
  double eval_loss = -1;      // -1: no evaluation ran
  double eval_accuracy = -1;  // -1: not a classification task / no evaluation
  std::string run_dir;
};

class Trainer {
 public:
  // Creates the run directory, writes manifest.resolved.toml, seeds, and creates every
  // component. Throws keel::Error naming the component on failure.
  explicit Trainer(const RunConfig& config);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  RunSummary train();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Applies the run's thread policy: `threads` LibTorch intra-op threads (0: every core) and a
// single-threaded BLAS, so that the two pools never oversubscribe the cores.
void configure_threads(int64_t threads);

// Keeps large freed blocks in glibc's heap (no mmap/munmap and page faults for every step's
// temporaries); see trainer.cpp for the measurement. [run] malloc_tuning = false turns it off.
void configure_allocator();

}  // namespace keel
