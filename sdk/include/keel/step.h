/*
 * The step kind (ABI 1.13, KEEL_KIND_STEP): a plugin that computes the loss of each training
 * micro-batch itself, from the outputs of the run's models, in place of the kernel's forward of
 * [model] followed by [loss] ([step] in a manifest; without one, the kernel's step runs).
 *
 * The kernel still owns everything around it: it fetches and checks the batch, weights each
 * micro-batch's loss for accumulation (by the [loss]'s count_items when items are counted, see
 * [train] accum_normalization), runs backward under the precision and loss scaling of [train],
 * reduces gradients over ranks or shards them, clips, applies the non-finite policy, steps the
 * optimizer and checkpoints [model]. Evaluation does not call the step: it runs [model] and
 * [loss] as without one.
 *
 * Models a step can run: "model", the trained [model]; and each [models.NAME] of the manifest,
 * which is frozen (its parameters never reach an optimizer and carry no gradient; it runs
 * without autograd, in evaluation mode), loaded from its init_from checkpoint at every start
 * and not saved in checkpoints.
 *
 * Plain C99, like <keel/abi.h>. C++ plugins derive from keel::Step (<keel/plugin.hpp>).
 */
#ifndef KEEL_STEP_H
#define KEEL_STEP_H

#include "keel/ext/tensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the kernel offers a step during one compute call; valid only during that call. */
typedef struct keel_step_services {
  uint32_t struct_size;
  void* host_data; /* the kernel's; do not touch */
  /* Runs model `model` ("model", or the NAME of a [models.NAME]) on `batch` (any set: the
   * batch compute received, or one the step made; the model reads the names it reads from a
   * batch). On KEEL_OK, *outputs holds the model's named outputs, "logits" among them, lent
   * until compute returns; "model"'s carry autograd through the trained parameters, a frozen
   * model's none. KEEL_ERR, with a message naming the model, for an unknown name or a failed
   * forward: return KEEL_ERR from compute after it. [train] */
  keel_status (*forward)(struct keel_step_services* services, const char* model,
                         const keel_tensor_set* batch, const keel_tensor_set** outputs,
                         keel_error* err);
} keel_step_services;

typedef struct keel_step {
  KEEL_INSTANCE_HEADER;
  /* The loss of one training micro-batch `batch` (lent for the call): *loss is new, a 0-dim
   * floating tensor with autograd through the trained model's parameters, the mean over the
   * batch's items (the kernel weights it by the [loss]'s item counts when it counts items).
   * The kernel calls backward on it; compute must not. [train] */
  keel_status (*compute)(void* self, keel_step_services* services, const keel_tensor_set* batch,
                         keel_tensor** loss, keel_error* err);
  /* Optional: the instance's extensions (abi.h, "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_step;

#ifdef __cplusplus
}
#endif

#endif /* KEEL_STEP_H */
