// Calls into the model, the loss and the datasets over batches of named tensors, each checking
// what the plugin returned (names, shapes, dtypes, counts) and naming the component when it is
// wrong. A plugin that offers its kind's extension of <keel/ext/batch.h> is called through it;
// one that does not through its 1.x slots, with the batch's "inputs" and "targets" and the
// model's output as "logits".
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "components.hpp"
#include "keel/ext/batch.h"
#include "run/named_tensors.hpp"
#include "run/signals.hpp"

namespace keel {

// A dataset, and its keel.dataset.batch/1 when it offers it (asked once: with_batches).
struct DataSource {
  const Instance<keel_dataset>* data = nullptr;
  const keel_dataset_batch* named = nullptr;
};
// A model or a loss, and its extension of <keel/ext/batch.h> (nullptr: the 1.x slots).
struct ModelCalls {
  const Instance<keel_model>* model = nullptr;
  const keel_model_batch* named = nullptr;
};
struct LossCalls {
  const Instance<keel_loss>* loss = nullptr;
  const keel_loss_batch* named = nullptr;
};
// Asks each instance for its extension, once [setup]; a struct_size smaller than the
// extension's is refused, naming the plugin. The instance must outlive the result.
DataSource with_batches(const Instance<keel_dataset>& data);
ModelCalls with_batches(const Instance<keel_model>& model);
LossCalls with_batches(const Instance<keel_loss>& loss);

// One batch of a dataset's `next`, on the run's device.
struct MicroBatch {
  Named tensors;  // in the dataset's order; each with the same first (batch) dimension
  int64_t samples = 0, tokens = 0;
  const Instance<keel_dataset>* source = nullptr;  // the dataset that gave it, for messages

  // The tensor `name`, which `who` (a label, for the message) needs: throws keel::Error naming
  // `who`, the name, the dataset, the names the batch has and `hint` when it lacks it.
  const at::Tensor& need(const char* name, const std::string& who,
                         const char* hint = "a plugin that reads other names offers its kind's "
                                            "extension of keel/ext/batch.h") const;
};

// The next batch of `source`, checked (see <keel/ext/batch.h>: at least one tensor, the same
// first dimension in all, on the CPU or `device`, samples > 0, tokens >= 0) and moved to
// `device`, in *out when the result is kBatch.
NextResult next_batch(const DataSource& source, const at::Device& device, MicroBatch* out);

// The model's outputs for `mb`, in the order put: "logits" among them (its first dimension the
// batch's), at most KEEL_MAX_NAMED_TENSORS - 1.
Named forward(const ModelCalls& model, const MicroBatch& mb);
// `loss` plus every auxiliary loss among the model's `outputs`: the outputs named "aux_loss" or
// "aux_loss.NAME", each a 0-dim floating-point tensor (else an error naming the model and the
// output). The kernel's training step adds them; evaluation's loss is the loss plugin's alone.
at::Tensor with_aux_losses(const ModelCalls& model, const Named& outputs, at::Tensor loss);
// The loss of `outputs` for `mb`; `count`: the items it averaged over. `training`: the loss
// must carry a gradient (under autograd).
at::Tensor compute_loss(const LossCalls& loss, const Named& outputs, const MicroBatch& mb,
                        int64_t* count, bool training);
// Whether the loss reports item counts (count_items), and the count for `mb` (-1: not reported).
bool counts_items(const LossCalls& loss);
int64_t count_items(const LossCalls& loss, const MicroBatch& mb);
// The loss's metric_update for one evaluation batch (the loss offers the evaluation-metric
// slots, run/eval_metrics.hpp).
void metric_update(const LossCalls& loss, const Named& outputs, const MicroBatch& mb,
                   double batch_loss, int64_t count, double* state, size_t size);
// The loss of a micro-batch from the model's features and output-layer weight (training steps
// with forward_features and compute_linear, which read "inputs" and "targets"): the
// [batch, ..., V] output is never made whole.
at::Tensor linear_loss_of(const Instance<keel_model>& model, const Instance<keel_loss>& loss,
                          const MicroBatch& mb, int64_t* count);

}  // namespace keel
