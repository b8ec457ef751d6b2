/* The plugin ABI's layout on LP64 (64-bit Linux), asserted at compile time: the size of
 * every struct in <keel/abi.h>, and the offset and size of every field. This is a compile-time
 * test: the executable only builds when every _Static_assert holds, and main() has nothing left
 * to check (it returns 0). A failing assert names the field that moved.
 *
 * A change here is a change of the ABI. Within major 1 only additions are allowed (docs/abi.md):
 * a field appended to a struct (a new AT line after the struct's last one, and a larger SIZE), a
 * new struct, a new enumerator. test_abi_versions.cpp compares with the frozen headers
 * (tests/abi/1.*). */
#include <stddef.h>

#include "keel/abi.h"
#include "keel/ext/batch.h"
#include "keel/ext/hook_model.h"
#include "keel/ext/hook_observe.h"
#include "keel/ext/tensors.h"
#include "keel/step.h"

_Static_assert(sizeof(void*) == 8 && sizeof(long) == 8 && sizeof(int) == 4,
               "test_abi_layout.c states the LP64 layout; this target is not LP64");

#define SIZE(type, bytes) _Static_assert(sizeof(type) == (bytes), #type " is not " #bytes " bytes")
#define AT(type, field, offset, bytes)                                             \
  _Static_assert(offsetof(type, field) == (offset) &&                              \
                     sizeof(((type*)0)->field) == (bytes),                         \
                 #type "." #field " is not at offset " #offset " with " #bytes " bytes")
#define VALUE(name, value) _Static_assert((name) == (value), #name " is not " #value)

VALUE(KEEL_ABI_MAJOR, 1);

/* Structs, in the order of abi.h. */
SIZE(keel_error, 1024);
AT(keel_error, message, 0, 1024);

SIZE(keel_host, 176);
AT(keel_host, struct_size, 0, 4);
AT(keel_host, abi_major, 4, 4);
AT(keel_host, abi_minor, 8, 4);
AT(keel_host, torch_version, 16, 8);
AT(keel_host, tensor_dtype, 24, 8);
AT(keel_host, tensor_ndim, 32, 8);
AT(keel_host, tensor_size, 40, 8);
AT(keel_host, tensor_numel, 48, 8);
AT(keel_host, tensor_cpu_data, 56, 8);
AT(keel_host, tensor_contiguous_cpu, 64, 8);
AT(keel_host, tensor_from_buffer, 72, 8);
AT(keel_host, tensor_retain, 80, 8);
AT(keel_host, tensor_release, 88, 8);
AT(keel_host, option_bool, 96, 8);
AT(keel_host, option_int, 104, 8);
AT(keel_host, option_float, 112, 8);
AT(keel_host, option_string, 120, 8);
AT(keel_host, option_list_size, 128, 8);
AT(keel_host, option_list_int, 136, 8);
AT(keel_host, option_list_float, 144, 8);
AT(keel_host, log, 152, 8);
AT(keel_host, report_error, 160, 8);
AT(keel_host, stop_requested, 168, 8);

SIZE(keel_option_desc, 56);
AT(keel_option_desc, key, 0, 8);
AT(keel_option_desc, type, 8, 4);
AT(keel_option_desc, default_toml, 16, 8);
AT(keel_option_desc, help, 24, 8);
AT(keel_option_desc, min, 32, 8);
AT(keel_option_desc, max, 40, 8);
AT(keel_option_desc, choices, 48, 8);

SIZE(keel_named_tensor, 16);
AT(keel_named_tensor, name, 0, 8);
AT(keel_named_tensor, tensor, 8, 8);

SIZE(keel_state_writer, 24);
AT(keel_state_writer, struct_size, 0, 4);
AT(keel_state_writer, host_data, 8, 8);
AT(keel_state_writer, put, 16, 8);

SIZE(keel_create_context, 168);
AT(keel_create_context, struct_size, 0, 4);
AT(keel_create_context, host, 8, 8);
AT(keel_create_context, options, 16, 8);
AT(keel_create_context, section, 24, 8);
AT(keel_create_context, seed, 32, 8);
AT(keel_create_context, rank, 40, 4);
AT(keel_create_context, world_size, 44, 4);
AT(keel_create_context, run_dir, 48, 8);
AT(keel_create_context, params, 56, 8);
AT(keel_create_context, param_names, 64, 8);
AT(keel_create_context, param_count, 72, 8);
AT(keel_create_context, total_steps, 80, 8);
AT(keel_create_context, param_group, 88, 8);
AT(keel_create_context, group_count, 96, 8);
AT(keel_create_context, group_lr, 104, 8);
AT(keel_create_context, group_weight_decay, 112, 8);
AT(keel_create_context, resume_step, 120, 8);
AT(keel_create_context, shards, 128, 8);
AT(keel_create_context, comm, 136, 8);
AT(keel_create_context, tables, 144, 8);
AT(keel_create_context, table_count, 152, 8);
AT(keel_create_context, device, 160, 8);

SIZE(keel_shard_group, 24);
AT(keel_shard_group, struct_size, 0, 4);
AT(keel_shard_group, host_data, 8, 8);
AT(keel_shard_group, all_reduce, 16, 8);

SIZE(keel_comm, 40);
AT(keel_comm, struct_size, 0, 4);
AT(keel_comm, host_data, 8, 8);
AT(keel_comm, rank, 16, 4);
AT(keel_comm, world_size, 20, 4);
AT(keel_comm, all_to_all, 24, 8);
AT(keel_comm, all_gather, 32, 8);

SIZE(keel_sparse_rows, 80);
AT(keel_sparse_rows, struct_size, 0, 4);
AT(keel_sparse_rows, count, 8, 8);
AT(keel_sparse_rows, ids, 16, 8);
AT(keel_sparse_rows, values, 24, 8);
AT(keel_sparse_rows, grads, 32, 8);
AT(keel_sparse_rows, slots, 40, 8);
AT(keel_sparse_rows, slot_width, 48, 8);
AT(keel_sparse_rows, row_values, 56, 8);
AT(keel_sparse_rows, row_grads, 64, 8);
AT(keel_sparse_rows, row_slots, 72, 8);

SIZE(keel_table_stats, 40);
AT(keel_table_stats, struct_size, 0, 4);
AT(keel_table_stats, rows, 8, 8);
AT(keel_table_stats, admitted, 16, 8);
AT(keel_table_stats, evicted, 24, 8);
AT(keel_table_stats, pending, 32, 8);

SIZE(keel_sparse_table, 96);
AT(keel_sparse_table, struct_size, 0, 4);
AT(keel_sparse_table, self, 8, 8);
AT(keel_sparse_table, name, 16, 8);
AT(keel_sparse_table, dim, 24, 8);
AT(keel_sparse_table, reserve_slots, 32, 8);
AT(keel_sparse_table, touched, 40, 8);
AT(keel_sparse_table, end_step, 48, 8);
AT(keel_sparse_table, stats, 56, 8);
AT(keel_sparse_table, save, 64, 8);
AT(keel_sparse_table, load, 72, 8);
AT(keel_sparse_table, rows_as_tensors, 80, 4);
AT(keel_sparse_table, device, 88, 8);

SIZE(keel_unit_calls, 32);
AT(keel_unit_calls, struct_size, 0, 4);
AT(keel_unit_calls, host_data, 8, 8);
AT(keel_unit_calls, enter, 16, 8);
AT(keel_unit_calls, leave, 24, 8);

SIZE(keel_model, 152);
AT(keel_model, struct_size, 0, 4);
AT(keel_model, self, 8, 8);
AT(keel_model, destroy, 16, 8);
AT(keel_model, forward, 24, 8);
AT(keel_model, set_training, 32, 8);
AT(keel_model, param_count, 40, 8);
AT(keel_model, param, 48, 8);
AT(keel_model, state_count, 56, 8);
AT(keel_model, state, 64, 8);
AT(keel_model, flops_per_sample, 72, 8);
AT(keel_model, state_save, 80, 8);
AT(keel_model, state_load, 88, 8);
AT(keel_model, forward_features, 96, 8);
AT(keel_model, export_state, 104, 8);
AT(keel_model, param_unit, 112, 8);
AT(keel_model, set_unit_calls, 120, 8);
AT(keel_model, table_count, 128, 8);
AT(keel_model, table, 136, 8);
AT(keel_model, get_extension, 144, 8); /* 1.12 */

SIZE(keel_batch, 32);
AT(keel_batch, inputs, 0, 8);
AT(keel_batch, targets, 8, 8);
AT(keel_batch, samples, 16, 8);
AT(keel_batch, tokens, 24, 8);

SIZE(keel_dataset, 96);
AT(keel_dataset, struct_size, 0, 4);
AT(keel_dataset, self, 8, 8);
AT(keel_dataset, destroy, 16, 8);
AT(keel_dataset, size, 24, 8);
AT(keel_dataset, batches_per_epoch, 32, 8);
AT(keel_dataset, start_epoch, 40, 8);
AT(keel_dataset, next, 48, 8);
AT(keel_dataset, seek, 56, 8);
AT(keel_dataset, state_save, 64, 8);
AT(keel_dataset, state_load, 72, 8);
AT(keel_dataset, tokens_per_sample, 80, 8);
AT(keel_dataset, get_extension, 88, 8); /* 1.12 */

SIZE(keel_optimizer, 88);
AT(keel_optimizer, struct_size, 0, 4);
AT(keel_optimizer, self, 8, 8);
AT(keel_optimizer, destroy, 16, 8);
AT(keel_optimizer, step, 24, 8);
AT(keel_optimizer, zero_grad, 32, 8);
AT(keel_optimizer, group_count, 40, 8);
AT(keel_optimizer, get_lr, 48, 8);
AT(keel_optimizer, set_lr, 56, 8);
AT(keel_optimizer, state_save, 64, 8);
AT(keel_optimizer, state_load, 72, 8);
AT(keel_optimizer, get_extension, 80, 8); /* 1.12 */

SIZE(keel_sparse_optimizer, 72);
AT(keel_sparse_optimizer, struct_size, 0, 4);
AT(keel_sparse_optimizer, self, 8, 8);
AT(keel_sparse_optimizer, destroy, 16, 8);
AT(keel_sparse_optimizer, step, 24, 8);
AT(keel_sparse_optimizer, get_lr, 32, 8);
AT(keel_sparse_optimizer, set_lr, 40, 8);
AT(keel_sparse_optimizer, state_save, 48, 8);
AT(keel_sparse_optimizer, state_load, 56, 8);
AT(keel_sparse_optimizer, get_extension, 64, 8); /* 1.12 */

SIZE(keel_lr_scheduler, 40);
AT(keel_lr_scheduler, struct_size, 0, 4);
AT(keel_lr_scheduler, self, 8, 8);
AT(keel_lr_scheduler, destroy, 16, 8);
AT(keel_lr_scheduler, factor, 24, 8);
AT(keel_lr_scheduler, get_extension, 32, 8); /* 1.12 */

SIZE(keel_metric_writer, 24);
AT(keel_metric_writer, struct_size, 0, 4);
AT(keel_metric_writer, host_data, 8, 8);
AT(keel_metric_writer, put, 16, 8);

SIZE(keel_loss, 80);
AT(keel_loss, struct_size, 0, 4);
AT(keel_loss, self, 8, 8);
AT(keel_loss, destroy, 16, 8);
AT(keel_loss, compute, 24, 8);
AT(keel_loss, count_items, 32, 8);
AT(keel_loss, compute_linear, 40, 8);
AT(keel_loss, metric_state_size, 48, 8);
AT(keel_loss, metric_update, 56, 8);
AT(keel_loss, metric_finish, 64, 8);
AT(keel_loss, get_extension, 72, 8); /* 1.12 */

SIZE(keel_grad_clipper, 40);
AT(keel_grad_clipper, struct_size, 0, 4);
AT(keel_grad_clipper, self, 8, 8);
AT(keel_grad_clipper, destroy, 16, 8);
AT(keel_grad_clipper, clip, 24, 8);
AT(keel_grad_clipper, get_extension, 32, 8); /* 1.12 */

SIZE(keel_mfu, 48);
AT(keel_mfu, struct_size, 0, 4);
AT(keel_mfu, self, 8, 8);
AT(keel_mfu, destroy, 16, 8);
AT(keel_mfu, compute, 24, 8);
AT(keel_mfu, peak_flops, 32, 8);
AT(keel_mfu, get_extension, 40, 8); /* 1.12 */

SIZE(keel_profiler, 56);
AT(keel_profiler, struct_size, 0, 4);
AT(keel_profiler, self, 8, 8);
AT(keel_profiler, destroy, 16, 8);
AT(keel_profiler, begin, 24, 8);
AT(keel_profiler, end, 32, 8);
AT(keel_profiler, flush, 40, 8);
AT(keel_profiler, get_extension, 48, 8); /* 1.12 */

SIZE(keel_checkpoint, 48);
AT(keel_checkpoint, struct_size, 0, 4);
AT(keel_checkpoint, self, 8, 8);
AT(keel_checkpoint, destroy, 16, 8);
AT(keel_checkpoint, save, 24, 8);
AT(keel_checkpoint, load, 32, 8);
AT(keel_checkpoint, get_extension, 40, 8); /* 1.12 */

SIZE(keel_metric, 16);
AT(keel_metric, key, 0, 8);
AT(keel_metric, value, 8, 8);

SIZE(keel_trainer_state, 120);
AT(keel_trainer_state, struct_size, 0, 4);
AT(keel_trainer_state, step, 8, 8);
AT(keel_trainer_state, epoch, 16, 8);
AT(keel_trainer_state, samples, 24, 8);
AT(keel_trainer_state, tokens, 32, 8);
AT(keel_trainer_state, max_steps, 40, 8);
AT(keel_trainer_state, epochs, 48, 8);
AT(keel_trainer_state, lr, 56, 8);
AT(keel_trainer_state, loss, 64, 8);
AT(keel_trainer_state, skipped_steps, 72, 8);
AT(keel_trainer_state, grad_norm, 80, 8);
AT(keel_trainer_state, train_metrics, 88, 8);
AT(keel_trainer_state, train_metric_count, 96, 8);
AT(keel_trainer_state, eval_metrics, 104, 8);
AT(keel_trainer_state, eval_metric_count, 112, 8);

SIZE(keel_event, 72);
AT(keel_event, struct_size, 0, 4);
AT(keel_event, kind, 4, 4);
AT(keel_event, state, 8, 8);
AT(keel_event, split, 16, 8);
AT(keel_event, metrics, 24, 8);
AT(keel_event, metric_count, 32, 8);
AT(keel_event, path, 40, 8);
AT(keel_event, requests, 48, 4);
AT(keel_event, micro_batch, 56, 8);
AT(keel_event, message, 64, 8);

SIZE(keel_hook, 56);
AT(keel_hook, struct_size, 0, 4);
AT(keel_hook, self, 8, 8);
AT(keel_hook, destroy, 16, 8);
AT(keel_hook, on_event, 24, 8);
AT(keel_hook, state_count, 32, 8);
AT(keel_hook, state, 40, 8);
AT(keel_hook, get_extension, 48, 8); /* 1.12 */

SIZE(keel_component_desc, 48);
AT(keel_component_desc, kind, 0, 4);
AT(keel_component_desc, name, 8, 8);
AT(keel_component_desc, description, 16, 8);
AT(keel_component_desc, options, 24, 8);
AT(keel_component_desc, option_count, 32, 4);
AT(keel_component_desc, option_size, 36, 4);
AT(keel_component_desc, create, 40, 8);

SIZE(keel_build_fingerprint, 24);
AT(keel_build_fingerprint, torch_version, 0, 8);
AT(keel_build_fingerprint, compiler, 8, 8);
AT(keel_build_fingerprint, cxx11_abi, 16, 4);

SIZE(keel_plugin_descriptor, 80);
AT(keel_plugin_descriptor, abi_major, 0, 4);
AT(keel_plugin_descriptor, abi_minor, 4, 4);
AT(keel_plugin_descriptor, struct_size, 8, 4);
AT(keel_plugin_descriptor, name, 16, 8);
AT(keel_plugin_descriptor, version, 24, 8);
AT(keel_plugin_descriptor, description, 32, 8);
AT(keel_plugin_descriptor, fingerprint, 40, 24);
AT(keel_plugin_descriptor, components, 64, 8);
AT(keel_plugin_descriptor, component_count, 72, 4);
AT(keel_plugin_descriptor, component_size, 76, 4);

/* Enumerators: their values travel across the boundary. */
VALUE(KEEL_OK, 0);
VALUE(KEEL_ERR, 1);

VALUE(KEEL_DTYPE_UNKNOWN, 0);
VALUE(KEEL_DTYPE_F32, 1);
VALUE(KEEL_DTYPE_F64, 2);
VALUE(KEEL_DTYPE_F16, 3);
VALUE(KEEL_DTYPE_BF16, 4);
VALUE(KEEL_DTYPE_I64, 5);
VALUE(KEEL_DTYPE_I32, 6);
VALUE(KEEL_DTYPE_U8, 7);
VALUE(KEEL_DTYPE_I8, 8);
VALUE(KEEL_DTYPE_BOOL, 9);

VALUE(KEEL_LOG_DEBUG, 0);
VALUE(KEEL_LOG_INFO, 1);
VALUE(KEEL_LOG_WARN, 2);
VALUE(KEEL_LOG_ERROR, 3);

VALUE(KEEL_OPT_BOOL, 1);
VALUE(KEEL_OPT_INT, 2);
VALUE(KEEL_OPT_FLOAT, 3);
VALUE(KEEL_OPT_STRING, 4);
VALUE(KEEL_OPT_INT_LIST, 5);
VALUE(KEEL_OPT_FLOAT_LIST, 6);
VALUE(KEEL_OPT_PATH, 7);

VALUE(KEEL_KIND_MODEL, 1);
VALUE(KEEL_KIND_DATASET, 2);
VALUE(KEEL_KIND_OPTIMIZER, 3);
VALUE(KEEL_KIND_LR_SCHEDULER, 4);
VALUE(KEEL_KIND_LOSS, 5);
VALUE(KEEL_KIND_GRAD_CLIPPER, 6);
VALUE(KEEL_KIND_MFU, 7);
VALUE(KEEL_KIND_PROFILER, 8);
VALUE(KEEL_KIND_CHECKPOINT, 9);
VALUE(KEEL_KIND_HOOK, 10);
VALUE(KEEL_KIND_SPARSE_OPTIMIZER, 11);
VALUE(KEEL_KIND_STEP, 12); /* 1.13 */

VALUE(KEEL_EVENT_TRAIN_START, 1);
VALUE(KEEL_EVENT_TRAIN_END, 2);
VALUE(KEEL_EVENT_EPOCH_START, 3);
VALUE(KEEL_EVENT_EPOCH_END, 4);
VALUE(KEEL_EVENT_STEP_START, 5);
VALUE(KEEL_EVENT_STEP_END, 6);
VALUE(KEEL_EVENT_EVAL_START, 7);
VALUE(KEEL_EVENT_EVAL_END, 8);
VALUE(KEEL_EVENT_METRICS, 9);
VALUE(KEEL_EVENT_CHECKPOINT_SAVED, 10);
VALUE(KEEL_EVENT_AFTER_DATA, 11);
VALUE(KEEL_EVENT_AFTER_BACKWARD, 12);
VALUE(KEEL_EVENT_BEFORE_OPTIMIZER_STEP, 13);
VALUE(KEEL_EVENT_CHECKPOINT_LOADED, 14);
VALUE(KEEL_EVENT_EXCEPTION, 15);

/* Request bits a hook sets in keel_event.requests. */
VALUE(KEEL_REQUEST_STOP, 1u);
VALUE(KEEL_REQUEST_EVAL, 2u);
VALUE(KEEL_REQUEST_CHECKPOINT, 4u);
VALUE(KEEL_BATCH_STOPPED, 2);

/* (1.12) Extensions (<keel/ext/hook_model.h>, <keel/ext/hook_observe.h>, <keel/ext/tensors.h>,
 * <keel/ext/batch.h>). */
SIZE(keel_model_view, 40);
AT(keel_model_view, struct_size, 0, 4);
AT(keel_model_view, host_data, 8, 8);
AT(keel_model_view, count, 16, 8);
AT(keel_model_view, entry, 24, 8);
AT(keel_model_view, set_eval_weights, 32, 8);
SIZE(keel_hook_model, 16);
AT(keel_hook_model, struct_size, 0, 4);
AT(keel_hook_model, attach, 8, 8);
SIZE(keel_tensor_set, 32);
AT(keel_tensor_set, struct_size, 0, 4);
AT(keel_tensor_set, count, 8, 8);
AT(keel_tensor_set, names, 16, 8);
AT(keel_tensor_set, tensors, 24, 8);
SIZE(keel_hook_observe, 32);
AT(keel_hook_observe, struct_size, 0, 4);
AT(keel_hook_observe, on_batch, 8, 8);
AT(keel_hook_observe, on_eval_batch, 16, 8);
AT(keel_hook_observe, put_metrics, 24, 8);
VALUE(KEEL_MAX_NAMED_TENSORS, 64);
SIZE(keel_tensor_writer, 24);
AT(keel_tensor_writer, struct_size, 0, 4);
AT(keel_tensor_writer, host_data, 8, 8);
AT(keel_tensor_writer, put, 16, 8);

/* <keel/step.h> (1.13) */
SIZE(keel_step_services, 24);
AT(keel_step_services, struct_size, 0, 4);
AT(keel_step_services, host_data, 8, 8);
AT(keel_step_services, forward, 16, 8);
SIZE(keel_step, 40);
AT(keel_step, struct_size, 0, 4);
AT(keel_step, self, 8, 8);
AT(keel_step, destroy, 16, 8);
AT(keel_step, compute, 24, 8);
AT(keel_step, get_extension, 32, 8);
SIZE(keel_dataset_batch, 16);
AT(keel_dataset_batch, struct_size, 0, 4);
AT(keel_dataset_batch, next, 8, 8);
SIZE(keel_model_batch, 16);
AT(keel_model_batch, struct_size, 0, 4);
AT(keel_model_batch, forward, 8, 8);
SIZE(keel_loss_batch, 32);
AT(keel_loss_batch, struct_size, 0, 4);
AT(keel_loss_batch, compute, 8, 8);
AT(keel_loss_batch, count_items, 16, 8);
AT(keel_loss_batch, metric_update, 24, 8);

int main(void) { return 0; }
