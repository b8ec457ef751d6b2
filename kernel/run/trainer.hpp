// The training loop's public entry points. Trainer assembles a run from a validated RunConfig
// (every component created before step 1; run/assemble.cpp) and runs it (run/trainer.cpp, the
// loop a reader starts with); see abi.h (keel_hook) for the event order. The process-wide
// settings are run/process_settings.cpp's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "run_config.hpp"

namespace keel {

struct Run;

struct RunSummary {
  int64_t steps = 0;
  int64_t samples = 0;
  int64_t skipped_steps = 0;
  double last_loss = 0;
  // The latest evaluation of the first evaluation set ([data.test], else the first
  // [data.eval.NAME]): its name, loss and accuracy.
  std::string eval_set;
  double eval_loss = -1;      // -1: no evaluation ran
  double eval_accuracy = -1;  // -1: no evaluation, or its loss reports no "accuracy"
  int stop_signal = 0;        // SIGTERM / SIGINT that stopped the run after a checkpoint
  std::string run_dir;
};

class Trainer {
 public:
  // Opens the run directory (kernel/files/owned_dir.hpp: created when missing, refused when another
  // user could change it, checked writable); a fresh training run (no --resume, no
  // --overwrite) refuses one holding an earlier run's records and claims it by creating
  // manifest.resolved.toml; an evaluation gets a new eval-<UTC time>/ inside it as its run
  // directory. Then creates and checks every component (loading [checkpoint] init_from),
  // writes plugins.json (and manifest.resolved.toml, when not written yet) and starts run.log
  // (appended to). Throws keel::Error naming the component on failure; then what this start
  // created is removed again, by device and inode (files/owned_dir.hpp: CreatedEntries), never what
  // another run put there. `validate_only` (check_run): components get a scratch run
  // directory instead, removed with the Trainer, and nothing is left in the run directory
  // (created when missing, probed with a file, its checkpoints/ and run.log checked as a start
  // opens them; what validation created is removed again).
  // Process-wide settings are not touched here: see apply_process_settings.
  explicit Trainer(const RunConfig& config, bool validate_only = false);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains (or, with run.mode = "evaluate", evaluates) the run to its end. A training run logs
  // why it ended as one line "run finished at step N: <reason>". Throws keel::Error when the run fails (the
  // hooks hear EXCEPTION first).
  RunSummary train();

 private:
  std::unique_ptr<Run> run_;
};

// Everything `keel train` does before step 1, without training (`keel validate`): checks that
// the run directory can be trusted, created and written, and, as the start of a training run
// with the same --resume or --overwrite would, refuses an earlier run's records (without
// either), an untrusted checkpoints/ and run files keel does not write (run_directory.hpp);
// reads the --resume checkpoint and checks that the run can continue it; creates every
// component with its options (datasets read their data, init_from or the resume checkpoint is
// loaded into the model), destroys them again, and removes every file and directory it added
// (missing parents of output_dir included). Throws keel::Error on the first problem, with the
// error line `keel train` would give.
void check_run(const RunConfig& config);

// The process-wide settings of a run, applied once at start-up by the program that runs it
// (keel's main, a test, an embedding program): LibTorch and BLAS threads (a launcher's local
// world size divides the cores), glibc allocator tuning ([run] malloc_tuning), and the seed of
// LibTorch's default generator. Throws keel::Error on malformed launcher variables.
void apply_process_settings(const RunConfig& config);

// Applies the run's thread policy: `threads` LibTorch intra-op threads (0: the cores divided
// by `local_processes`, the ranks on this machine, at least 1), and OpenBLAS's threads to
// match (its OpenMP build: the same threads; its pthread build: 1), so that the pools never
// oversubscribe the cores.
void configure_threads(int64_t threads, int local_processes = 1);

// Keeps large freed blocks in glibc's heap (no mmap/munmap and page faults for every step's
// temporaries); see run/process_settings.cpp for the measurement. [run] malloc_tuning = false turns it off.
void configure_allocator();

}  // namespace keel
