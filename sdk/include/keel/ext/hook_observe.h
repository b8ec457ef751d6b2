/*
 * keel extension "keel.hook.observe/1" (ABI 1.12): a hook that sees the training batches, every
 * evaluation batch with the model's outputs for it, and adds scalars of its own to the run's
 * records (RecIS's after_data, a per-batch evaluation output, a hook's own metric).
 *
 * A hook offers it through its get_extension (see "Extensions" in <keel/abi.h>); the kernel asks
 * once, right after the hook's factory. Each slot is optional (NULL: not wanted).
 *
 * Tensors are lent for one call. A keel_tensor_set's names and handles are valid only until the
 * slot returns; a hook copies what it needs (in C++ `.clone()`, in C the values behind
 * keel_host.tensor_cpu_data). A hook that still holds a reference to a lent tensor or its
 * storage when the slot returns (tensor_retain, an at::Tensor or a view it kept) ends the run
 * with one error naming the hook and the tensor. The tensors are on the run's device; none
 * requires grad; they must not be written.
 */
#ifndef KEEL_EXT_HOOK_OBSERVE_H
#define KEEL_EXT_HOOK_OBSERVE_H

#include "keel/abi.h"
#include "keel/ext/tensors.h" /* keel_tensor_set */

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_EXT_HOOK_OBSERVE "keel.hook.observe/1"

/* What the hook offers for KEEL_EXT_HOOK_OBSERVE. */
typedef struct keel_hook_observe {
  uint32_t struct_size;
  /* A training micro-batch as the step uses it, on the run's device: every tensor of the batch
   * ("inputs" and "targets" from a 1.x dataset; a named batch's names, keel/ext/batch.h).
   * Called for each micro-batch of a step right after its AFTER_DATA event (micro_batch is the
   * same index), before any forward. [train] */
  keel_status (*on_batch)(void* self, int64_t micro_batch, const keel_tensor_set* batch,
                          keel_error* err);
  /* One batch of the evaluation set `split` after the model's forward and the loss: the batch
   * (as on_batch) and the outputs (the model's: "logits", first dimension the batch, and any
   * others a keel.model.batch/1 model put; "loss": a 0-dim float64 tensor, the loss plugin's
   * mean loss of the batch, which replaces a model output of that name). Between
   * EVAL_START and EVAL_END of that set, gradients off, the model in evaluation mode. [train] */
  keel_status (*on_eval_batch)(void* self, const char* split, const keel_tensor_set* batch,
                               const keel_tensor_set* outputs, keel_error* err);
  /* Right before a METRICS record of `split` ("train", or an evaluation set's name) is sent to
   * the hooks: puts the hook's own scalars with out->put (abi.h, keel_metric_writer), which the
   * kernel appends to the record in the order put, after the record's own keys and those of
   * hooks called before (in hook order). A key the record holds already is an error naming the
   * hook. With several ranks every rank calls it and the record keeps rank 0's values (a hook
   * that wants a value over all ranks reduces it itself through keel_comm). [train] */
  keel_status (*put_metrics)(void* self, const char* split, keel_metric_writer* out,
                             keel_error* err);
} keel_hook_observe;

#ifdef __cplusplus
}
#endif

#endif /* KEEL_EXT_HOOK_OBSERVE_H */
