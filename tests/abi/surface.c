/* The ABI's types as a library's interface, for libabigail: one exported function per struct,
 * function-pointer type and enum of <keel/abi.h>, so that the library's debug info describes
 * every one of them (libabigail only sees types reachable from exported functions).
 * test_abi_diff.sh compares what `abidw` reads from it with the committed baseline
 * keel-abi-1.3.abi (see tests/abi/README.md). The functions do nothing; nothing calls them. */
#include "keel/abi.h"
#include "keel/ext/batch.h"
#include "keel/ext/hook_model.h"
#include "keel/ext/hook_observe.h"
#include "keel/ext/tensors.h"
#include "keel/step.h"

#define SURFACE(type) \
  KEEL_EXPORT void keel_abi_surface_##type(const type* p) { (void)p; }

/* The host interface the kernel exports to plugins, and the structs it hands them. */
SURFACE(keel_host)
SURFACE(keel_error)
SURFACE(keel_create_context)
SURFACE(keel_state_writer)
SURFACE(keel_shard_group)
SURFACE(keel_unit_calls)
SURFACE(keel_comm)
SURFACE(keel_sparse_rows)
SURFACE(keel_table_stats)
SURFACE(keel_sparse_table)
SURFACE(keel_metric_writer)
SURFACE(keel_named_tensor)
SURFACE(keel_trainer_state)
SURFACE(keel_event)
SURFACE(keel_metric)

/* What a plugin hands the kernel. */
SURFACE(keel_plugin_entry_fn)
SURFACE(keel_plugin_descriptor)
SURFACE(keel_build_fingerprint)
SURFACE(keel_component_desc)
SURFACE(keel_factory_fn)
SURFACE(keel_option_desc)

/* Instance structs, one per kind, and the batch a dataset fills. */
SURFACE(keel_model)
SURFACE(keel_dataset)
SURFACE(keel_batch)
SURFACE(keel_optimizer)
SURFACE(keel_sparse_optimizer)
SURFACE(keel_lr_scheduler)
SURFACE(keel_loss)
SURFACE(keel_grad_clipper)
SURFACE(keel_mfu)
SURFACE(keel_profiler)
SURFACE(keel_checkpoint)
SURFACE(keel_hook)

/* Enums (their values are part of the ABI) and the opaque handles. */
SURFACE(keel_status)
SURFACE(keel_dtype)
SURFACE(keel_log_level)
SURFACE(keel_reduce_op)
SURFACE(keel_option_type)
SURFACE(keel_kind)
SURFACE(keel_event_kind)
SURFACE(keel_tensor)
SURFACE(keel_options)

/* (1.12) Extensions: the slot's type and each extension's structs (keel/ext/NAME.h). */
SURFACE(keel_get_extension_fn)
SURFACE(keel_model_view)
SURFACE(keel_hook_model)
SURFACE(keel_tensor_set)
SURFACE(keel_hook_observe)
SURFACE(keel_tensor_writer)
SURFACE(keel_dataset_batch)
SURFACE(keel_step_services)
SURFACE(keel_step)
SURFACE(keel_model_batch)
SURFACE(keel_loss_batch)
