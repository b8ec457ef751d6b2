/*
 * Named tensors passed between the kernel and a plugin in the extensions' calls (ABI 1.12):
 * a set the caller lends for one call, and a writer the callee puts tensors into.
 * Used by <keel/ext/batch.h> (named batches, a model's named outputs) and
 * <keel/ext/hook_observe.h> (what hooks see).
 */
#ifndef KEEL_EXT_TENSORS_H
#define KEEL_EXT_TENSORS_H

#include "keel/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most tensors in one set or one writer's call (a batch, a model's outputs). */
#define KEEL_MAX_NAMED_TENSORS 64

/* Named tensors lent for one call: the names and handles are valid only until the callee
 * returns. Names are unique, non-empty and shorter than KEEL_NAME_CAPACITY; count <=
 * KEEL_MAX_NAMED_TENSORS. */
typedef struct keel_tensor_set {
  uint32_t struct_size;
  size_t count;
  const char* const* names;    /* count names */
  keel_tensor* const* tensors; /* count borrowed handles */
} keel_tensor_set;

/* Collects named tensors from a callee; built by the caller for one call. */
typedef struct keel_tensor_writer {
  uint32_t struct_size;
  void* host_data; /* the caller's; do not touch */
  /* Adds `tensor` (borrowed for the call: the caller takes its own reference, so the callee
   * keeps, or releases, its handle as it likes) under `name` (copied). Returns 1, or 0 when the
   * entry is refused: a NULL tensor, an empty name, a name of KEEL_NAME_CAPACITY bytes or more,
   * a name put before in this call, more than KEEL_MAX_NAMED_TENSORS entries. The caller then
   * fails the run naming the plugin, the entry and the reason; the callee returns KEEL_ERR after
   * a 0 (any message). */
  int (*put)(struct keel_tensor_writer* writer, const char* name, keel_tensor* tensor);
} keel_tensor_writer;

#ifdef __cplusplus
}
#endif

#endif /* KEEL_EXT_TENSORS_H */
