// trainer_state.toml, the kernel's metadata file in every checkpoint directory: everything a
// resumed run needs besides tensors. `keel train --resume` parses it whole (run/resume.cpp,
// adopt_resume_point) and uses every field but objects, keel_version and manifest_hash, which
// are there for people and tools reading a checkpoint:
//
//   run_id = "3f2a9c1e5b7d4e60"   # the run that saved it (a resumed run keeps its run_id)
//   step = 32                     # optimizer steps taken (skipped ones included)
//   epoch = 3                     # the epoch (0-based) the next batch comes from
//   epoch_batches = 12            # micro-batches of that epoch already consumed (per rank)
//   epoch_samples = 384           # the global sample cursor: sample positions of that epoch
//                                 # consumed over every rank (epoch_batches x batch_size x
//                                 # world_size; optional when reading: 0, unknown)
//   global_batch = 32             # samples per step over every rank (optional: 0, unknown)
//   samples = 1024                # training samples consumed
//   tokens = 1024
//   skipped_steps = 0
//   last_eval_step = 30           # step of the latest evaluation (-1: none yet)
//   world_size = 2                # ranks that saved it (optional when reading: default 1)
//   objects = ["model", "optimizer", "rng"]   # backend objects written (<stem>.<ext>)
//   keel_version = "0.3.0"
//   manifest_hash = "xxh3:0123456789abcdef"    # of manifest.resolved.toml beside it
//   loss_scale = 65536.0          # fp16 loss scaler (0.0 when the run does not scale)
//   loss_scale_clean_steps = 17
//   [window]                      # sums of the log_every window in progress
//   loss = 1.25
//   grad_norm = 3.5
//   steps = 2
//   norms = 2
//   samples = 128
//   tokens = 128
//   [plugins]                     # name = version of every plugin a component came from
//   "keel-optimizers" = "0.1.0"
//   [metrics.train]               # the latest records hooks see in keel_trainer_state
//   keys = ["step", "loss"]
//   values = [32.0, 0.61]
//   [metrics.test]
//   keys = []
//   values = []
//
// The scheduler's position is `step` (a schedule is a pure function of the step). Floats are
// written with 17 significant digits, so they read back to the same double. Reading and
// writing it needs no LibTorch (tests/fuzz/fuzz_checkpoint_meta.cpp uses it alone).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace keel {

using MetricList = std::vector<std::pair<std::string, double>>;

struct CheckpointMeta {
  std::string run_id;
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t epoch_batches = 0;
  int64_t epoch_samples = 0;
  int64_t global_batch = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t skipped_steps = 0;
  int64_t last_eval_step = -1;
  int64_t world_size = 1;
  std::vector<std::string> objects = {};
  std::string keel_version;
  std::string manifest_hash;
  double loss_scale = 0;
  int64_t loss_scale_clean_steps = 0;
  struct Window {
    double loss = 0, grad_norm = 0;
    int64_t steps = 0, norms = 0, samples = 0, tokens = 0;
  } window;
  std::vector<std::pair<std::string, std::string>> plugins;  // name, version
  MetricList train_metrics;
  // Each evaluation set's latest record, by split name, in the run's order of the sets.
  std::vector<std::pair<std::string, MetricList>> eval_metrics;
};

// Field by field; two NaNs compare equal.
bool operator==(const CheckpointMeta& a, const CheckpointMeta& b);

// Parses the text of a trainer_state.toml; `path` names it in messages. Every key above must be
// present with its type (counts >= 0, last_eval_step >= -1, world_size >= 1; world_size may be
// absent: 1; epoch_samples and global_batch may be absent: 0), nothing else. Throws keel::Error
// "path:line:col: invalid checkpoint metadata: <what>" on anything wrong.
CheckpointMeta read_checkpoint_meta(std::string_view text, const std::string& path);

// The text of trainer_state.toml for `meta` (read_checkpoint_meta reads it back equal).
std::string write_checkpoint_meta(const CheckpointMeta& meta);

}  // namespace keel
