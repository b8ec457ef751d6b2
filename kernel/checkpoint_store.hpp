// The checkpoint commit protocol (owned by the kernel; backends only write files).
//
//   <run>/checkpoints/.step-<N>.tmp/   staging: the backend writes model.<ext> (and hooks.<ext>
//                                      when hooks keep state) here, the kernel writes
//                                      trainer_state.toml (step, epoch, samples, tokens, the
//                                      objects written)
//   rename(.step-<N>.tmp, step-<N>)     the commit: a checkpoint directory either exists
//                                      complete or not at all
//   prune                              keep_last > 0 removes the oldest committed ones
//
// A failure while staging removes the staging directory and reports the error; committed
// checkpoints are never touched by a failed save.
#pragma once

#include <string>
#include <vector>

#include "components.hpp"
#include "keel/abi.h"

namespace keel {

struct CheckpointMeta {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
};

class CheckpointStore {
 public:
  CheckpointStore(std::string root, const Instance<keel_checkpoint>* backend, int64_t keep_last)
      : root_(std::move(root)), backend_(backend), keep_last_(keep_last) {}

  // Stages, commits and prunes; returns the committed directory.
  std::string save(const std::vector<keel_named_tensor>& model_state,
                   const std::vector<keel_named_tensor>& hook_state, const CheckpointMeta& meta);
  // Loads the checkpoint in `dir` into the model's tensors, and into the hooks' tensors when it
  // holds hook state.
  void load(const std::string& dir, const std::vector<keel_named_tensor>& model_state,
            const std::vector<keel_named_tensor>& hook_state) const;
  // Committed checkpoint directories, oldest first.
  std::vector<std::string> committed() const;

 private:
  std::string root_;
  const Instance<keel_checkpoint>* backend_;
  int64_t keep_last_;
};

}  // namespace keel
