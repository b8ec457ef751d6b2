// Calls into the model, the loss and the datasets, each checking what the plugin returned
// (shapes, dtypes, counts) and naming the component when it is wrong.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "components.hpp"

namespace keel {

// One batch of a dataset's `next`, on the run's device.
struct MicroBatch {
  at::Tensor inputs, targets;
  int64_t samples = 0, tokens = 0;
};

// A batch from a dataset's `next`, checked: both tensors, samples > 0, tokens >= 0, and the
// same first (batch) dimension.
MicroBatch checked_batch(const Instance<keel_dataset>& data, const keel_batch& b);
// The batch on the run's device (the dataset made it on the CPU).
MicroBatch on_device(const at::Device& device, MicroBatch mb);

// The model's output for `x`: its first dimension is the batch.
at::Tensor forward(const Instance<keel_model>& model, const at::Tensor& x);
// The loss of `out` against targets `y`; `count`: the items it averaged over. `training`: the
// loss must carry a gradient (under autograd).
at::Tensor compute_loss(const Instance<keel_loss>& loss, const at::Tensor& out,
                        const at::Tensor& y, int64_t* count, bool training);
// The loss of a micro-batch from the model's features and output-layer weight (training steps
// with forward_features and compute_linear): the [batch, ..., V] output is never made whole.
at::Tensor linear_loss_of(const Instance<keel_model>& model, const Instance<keel_loss>& loss,
                          const at::Tensor& x, const at::Tensor& y, int64_t* count);

}  // namespace keel
