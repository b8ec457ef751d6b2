/*
 * keel extensions "keel.dataset.batch/1", "keel.model.batch/1" and "keel.loss.batch/1"
 * (ABI 1.12): batches of named tensors. A dataset gives what it has (`input_ids`, `labels`,
 * `attention_mask`, `position_ids`; `dense`, `sparse_ids`, `sparse_offsets`; any name), the
 * model's forward receives the whole batch and gives named outputs, and the loss (with its
 * evaluation metrics) receives the outputs and the batch.
 *
 * Each is offered through the instance's get_extension (see "Extensions" in <keel/abi.h>); the
 * kernel asks once, right after the factory, and then calls the extension's slot instead of the
 * kind's 1.x slot. The three are independent; where one side has no extension the kernel
 * bridges with the conventional names:
 *   - a dataset without keel.dataset.batch/1: its keel_dataset.next gives {"inputs", "targets"};
 *   - a model without keel.model.batch/1: keel_model.forward gets the batch's "inputs" and its
 *     output is {"logits"};
 *   - a loss without keel.loss.batch/1: keel_loss.compute (count_items, metric_update) gets the
 *     outputs' "logits" and the batch's "targets".
 * A name such a bridge needs and the batch lacks stops the run with one line naming the plugin
 * that needs it, the name and the names the batch has. keel_model.forward_features and
 * keel_loss.compute_linear (1.5) read "inputs" and "targets" the same way.
 *
 * A plugin that offers one of them still fills the 1.x slot (a kernel older than the extension
 * calls only that): the C++ SDK's does it from the named call (a dataset's "inputs" and
 * "targets", a model's "logits").
 *
 * Conventional names (a plugin may use others; the kernel reads only those above):
 *   inputs, targets       what a 1.x model and loss read
 *   input_ids, labels     token ids and the ids to predict (-100: ignored), [batch, length]
 *   attention_mask        1 for a token to attend to, 0 for padding, [batch, length]
 *   position_ids          each token's position, restarting per packed document
 *   document_ids          which packed document each token belongs to (attention stays in it)
 *   dense                 a recommendation model's dense features, [batch, F]
 *   sparse_ids, sparse_offsets  multi-hot ids, ragged: sample i's ids of field f are
 *                         sparse_ids[i][sparse_offsets[i][f] .. sparse_offsets[i][f + 1])
 *   logits                the model's output for the batch (an output; required)
 *   aux_loss, aux_loss.NAME  auxiliary losses (outputs, 0-dim floating-point tensors): the
 *                         kernel's training step adds each to the loss plugin's loss of the
 *                         micro-batch; an evaluation's loss is the loss plugin's alone
 *
 * What the kernel checks of a dataset's batch: at least one tensor, each with a first dimension
 * and the same one in all (the batch), each on the CPU or the run's device (the kernel moves
 * it to the run's device), samples >= 1, tokens >= 0; a failed check stops the run with one
 * line naming the dataset and the tensor. Each `next` is one batch of [train] grad_accum, and
 * one micro-batch unless [train] micro_batch_size splits it along the first dimension.
 */
#ifndef KEEL_EXT_BATCH_H
#define KEEL_EXT_BATCH_H

#include "keel/abi.h"
#include "keel/ext/tensors.h" /* keel_tensor_set, keel_tensor_writer */

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_EXT_DATASET_BATCH "keel.dataset.batch/1"
#define KEEL_EXT_MODEL_BATCH "keel.model.batch/1"
#define KEEL_EXT_LOSS_BATCH "keel.loss.batch/1"

/* What a dataset offers for KEEL_EXT_DATASET_BATCH. */
typedef struct keel_dataset_batch {
  uint32_t struct_size;
  /* keel_dataset.next with the batch as named tensors: puts each of the batch's tensors with
   * out->put (the writer takes its own reference), sets *samples and *tokens and *has_batch = 1;
   * or *has_batch = 0 at the end of the epoch (nothing put), or KEEL_BATCH_STOPPED as for next.
   * Called instead of keel_dataset.next, everywhere the kernel reads the dataset (training,
   * evaluation, replaying batches to reach a resume position). [train] */
  keel_status (*next)(void* self, keel_tensor_writer* out, int64_t* samples, int64_t* tokens,
                      int* has_batch, keel_error* err);
} keel_dataset_batch;

/* What a model offers for KEEL_EXT_MODEL_BATCH. */
typedef struct keel_model_batch {
  uint32_t struct_size;
  /* keel_model.forward over the named batch (lent for the call, on the run's device; the
   * autograd graph may keep what it needs of them): puts the outputs with out->put, "logits"
   * required (first dimension the batch), others as the model likes, at most
   * KEEL_MAX_NAMED_TENSORS - 1 in all (hooks get the batch's "loss" beside them; a loss with
   * keel.loss.batch/1 and the hooks that see evaluation outputs receive them all). Called
   * instead of keel_model.forward, in training steps and evaluations. [train] */
  keel_status (*forward)(void* self, const keel_tensor_set* batch, keel_tensor_writer* out,
                         keel_error* err);
} keel_model_batch;

/* What a loss offers for KEEL_EXT_LOSS_BATCH. The metric state's size and metric_finish stay
 * keel_loss's (abi.h, "Evaluation metrics of a loss"). */
typedef struct keel_loss_batch {
  uint32_t struct_size;
  /* keel_loss.compute over the model's named outputs and the batch (both lent for the call):
   * *loss a new 0-dim floating-point tensor, the mean over *count items. Called instead of
   * keel_loss.compute. [train] */
  keel_status (*compute)(void* self, const keel_tensor_set* outputs, const keel_tensor_set* batch,
                         keel_tensor** loss, int64_t* count, keel_error* err);
  /* Optional: keel_loss.count_items for the batch (-1: not reported); NULL: the loss reports no
   * counts (keel_loss.count_items is not called either). [train] */
  int64_t (*count_items)(void* self, const keel_tensor_set* batch);
  /* Optional: keel_loss.metric_update over the outputs and the batch; NULL: the core's
   * metric_update with "logits" and "targets". [train] */
  keel_status (*metric_update)(void* self, const keel_tensor_set* outputs,
                               const keel_tensor_set* batch, double loss, int64_t count,
                               double* state, size_t size, keel_error* err);
} keel_loss_batch;

#ifdef __cplusplus
}
#endif

#endif /* KEEL_EXT_BATCH_H */
