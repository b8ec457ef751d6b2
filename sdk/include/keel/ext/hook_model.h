/*
 * keel extension "keel.hook.model/1" (ABI 1.12): a hook that sees the model's weights and may
 * have evaluations use weights of its own (an exponential moving average, ...).
 *
 * A hook offers it through its get_extension (see "Extensions" in <keel/abi.h>). The kernel
 * then calls `attach` once, right after the hook's factory and before the hook's state_count,
 * with a view of the model that stays valid for the hook's life.
 *
 * The view lists the model's checkpointed state (keel_model.state: parameters and buffers, in
 * that order and with those names) on the run's device. Its handles are the model's own tensors,
 * borrowed: reading them copies nothing, and a hook never writes them (the optimizer and the
 * kernel own their values). A hook that wants other values in an evaluation hands the kernel its
 * own tensors with set_eval_weights.
 *
 * Only where every rank holds the whole parameters after each step: [distributed] shard =
 * "none" (alone or data parallel), "optimizer" or "gradients". Under shard = "parameters",
 * where ranks hold only their shards, the kernel refuses the hook before step 1, naming it.
 */
#ifndef KEEL_EXT_HOOK_MODEL_H
#define KEEL_EXT_HOOK_MODEL_H

#include "keel/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_EXT_HOOK_MODEL "keel.hook.model/1"

/* The host's view of the model; the host's, valid for the hook's life. */
typedef struct keel_model_view {
  uint32_t struct_size;
  void* host_data; /* the host's; do not touch */
  /* Entries: the model's parameters and buffers. [setup|train] */
  size_t (*count)(const struct keel_model_view* view);
  /* Entry `index` < count: its name (valid for the hook's life), its tensor (borrowed, valid
   * for the hook's life; read only) and whether it is a trainable parameter (1) or a buffer
   * (0). [setup|train] */
  keel_status (*entry)(const struct keel_model_view* view, size_t index, const char** name,
                       keel_tensor** tensor, int32_t* is_parameter, keel_error* err);
  /* From now on every evaluation (periodic, at the run's end, `keel evaluate`) runs the model
   * with these values: `tensors[i]` for entry i, each of the entry's shape, dtype and device,
   * `count` equal to the view's count. The kernel keeps its own reference to each tensor and
   * reads their values when an evaluation starts (the hook may go on updating them in place),
   * copies them into the model for the evaluation and restores the model's values after it.
   * count 0 (tensors may be NULL): evaluations use the model's own values again. A mismatch
   * returns KEEL_ERR naming the entry, and changes nothing. One hook of a run at a time may set
   * them. [setup|train] (from attach or on_event) */
  keel_status (*set_eval_weights)(const struct keel_model_view* view, keel_tensor* const* tensors,
                                  size_t count, keel_error* err);
} keel_model_view;

/* What the hook offers for KEEL_EXT_HOOK_MODEL. */
typedef struct keel_hook_model {
  uint32_t struct_size;
  /* Receives the view (above). An error ends the run's setup, naming the hook. [setup] */
  keel_status (*attach)(void* self, const keel_model_view* view, keel_error* err);
} keel_hook_model;

#ifdef __cplusplus
}
#endif

#endif /* KEEL_EXT_HOOK_MODEL_H */
