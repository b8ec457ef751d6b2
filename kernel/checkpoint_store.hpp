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
// checkpoints are never touched by a failed save, except that saving a step that already has
// a committed directory (a rerun in the same run directory) removes the old one before the
// rename.
#pragma once

#include <string>
#include <vector>

#include "checkpoint_meta.hpp"
#include "components.hpp"
#include "keel/abi.h"

namespace keel {

class CheckpointStore {
 public:
  CheckpointStore(std::string root, const Instance<keel_checkpoint>* backend, int64_t keep_last)
      : root_(std::move(root)), backend_(backend), keep_last_(keep_last) {}

  // Stages, commits and prunes; returns the committed directory. meta.objects is ignored: the
  // kernel lists what it saved ("model", and "hooks" when hook_state is not empty).
  std::string save(const std::vector<keel_named_tensor>& model_state,
                   const std::vector<keel_named_tensor>& hook_state, const CheckpointMeta& meta);
  // Loads the checkpoint in `dir` into the model's tensors, and into the hooks' tensors when it
  // holds hook state; returns its trainer_state.toml (all zero and no objects when the
  // directory has none: a model-only directory loads when no hook keeps state).
  CheckpointMeta load(const std::string& dir, const std::vector<keel_named_tensor>& model_state,
            const std::vector<keel_named_tensor>& hook_state) const;
  // Committed checkpoint directories, oldest first.
  std::vector<std::string> committed() const;

 private:
  std::string root_;
  const Instance<keel_checkpoint>* backend_;
  int64_t keep_last_;
};

}  // namespace keel
