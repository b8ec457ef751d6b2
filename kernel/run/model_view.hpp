// The host's side of the extension "keel.hook.model/1" (sdk/include/keel/ext/hook_model.h):
// hooks that read the model's parameters and buffers, and one hook's weights that evaluations
// run with (an exponential moving average, ...).
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <string>
#include <vector>

#include "components.hpp"
#include "keel/abi.h"
#include "keel/ext/hook_model.h"

namespace keel {

class ModelViews {
 public:
  // Over the model's checkpointed state (Parameters::model_state); `trainable` are the
  // parameters among them.
  ModelViews(const std::vector<keel_named_tensor>& state, const std::vector<at::Tensor>& trainable);

  // Gives `hook` its view when it offers the extension. `sharded_as`: the shard mode under which
  // ranks hold only shards ("" when every rank holds whole parameters), which refuses such a
  // hook. [setup]
  void attach(const Instance<keel_hook>& hook, const std::string& sharded_as);

  // Whether a hook set weights for evaluations.
  bool has_eval_weights() const { return !eval_weights_.empty(); }

  // Copies the weights a hook set into the model, and the model's own values back at restore()
  // (nothing when none are set). Checks them again first: a hook that resized one since it set
  // them ends the run, naming the hook. Destroyed without restore() (an evaluation that
  // failed), it restores them itself, and logs a failure to restore.
  class ForEvaluation {
   public:
    explicit ForEvaluation(const ModelViews* views);
    void restore();
    ~ForEvaluation();
    ForEvaluation(const ForEvaluation&) = delete;
    ForEvaluation& operator=(const ForEvaluation&) = delete;

   private:
    const ModelViews* views_;
    std::vector<at::Tensor> saved_;
  };

 private:
  struct Entry {
    std::string name;
    keel_tensor* handle;
    at::Tensor tensor;
    bool is_parameter;
  };
  struct View {  // one per hook: host_data of its keel_model_view
    keel_model_view abi;
    ModelViews* owner;
    std::string hook;  // the hook's label, for messages
  };
  static size_t count(const keel_model_view* v);
  static keel_status entry(const keel_model_view* v, size_t index, const char** name,
                           keel_tensor** tensor, int32_t* is_parameter, keel_error* err);
  static keel_status set_eval_weights(const keel_model_view* v, keel_tensor* const* tensors,
                                      size_t count, keel_error* err);
  // "" or why `weights` cannot stand for the model's entries.
  std::string mismatch(const std::vector<at::Tensor>& weights) const;

  std::vector<Entry> entries_;
  std::deque<View> views_;  // stable addresses
  std::vector<at::Tensor> eval_weights_;
  std::string eval_owner_;  // the label of the hook that set them
};

}  // namespace keel
