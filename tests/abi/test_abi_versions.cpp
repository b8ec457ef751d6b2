// The current ABI against the frozen 1.0, 1.1, 1.5, 1.6, 1.7, 1.8, 1.9, 1.10, 1.11 and 1.12
// headers (tests/abi/),
// asserted at compile time:
// a plugin built against an older minor keeps finding every field where it was, and the kernel
// keeps asking it for no more than that minor had. This is a compile-time test: the executable
// only builds when every static_assert holds, and main() has nothing left to check.
//
// The frozen headers are included under other names: the build generates keel10_abi.h,
// keel11_abi.h, keel15_abi.h, keel16_abi.h, keel17_abi.h, keel18_abi.h, keel19_abi.h,
// keel110_abi.h, keel111_abi.h and keel112_abi.h from them, with keel_ -> keel10_ / keel11_ /
// keel15_ / ... / keel112_ and KEEL_ -> KEEL10_ / ... / KEEL112_.
#include <cstddef>

#include "components.hpp"  // keel::required_size; includes the current <keel/abi.h>
#include "keel10_abi.h"
#include "keel11_abi.h"
#include "keel15_abi.h"
#include "keel16_abi.h"
#include "keel17_abi.h"
#include "keel18_abi.h"
#include "keel19_abi.h"
#include "keel110_abi.h"
#include "keel111_abi.h"
#include "keel112_abi.h"

static_assert(sizeof(void*) == 8, "test_abi_versions.cpp is written for LP64");
static_assert(KEEL10_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL10_ABI_MINOR == 0 &&
                  KEEL11_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL11_ABI_MINOR == 1 &&
                  KEEL15_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL15_ABI_MINOR == 5 &&
                  KEEL16_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL16_ABI_MINOR == 6 &&
                  KEEL17_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL17_ABI_MINOR == 7 &&
                  KEEL18_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL18_ABI_MINOR == 8 &&
                  KEEL19_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL19_ABI_MINOR == 9 &&
                  KEEL110_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL110_ABI_MINOR == 10 &&
                  KEEL111_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL111_ABI_MINOR == 11 &&
                  KEEL112_ABI_MAJOR == KEEL_ABI_MAJOR && KEEL112_ABI_MINOR == 12,
              "tests/abi/1.0, 1.1 and 1.5 to 1.12 must hold the frozen headers of those "
              "minors");

#define ABI_10 "1.0"
#define ABI_11 "1.1"
#define ABI_15 "1.5"
#define ABI_16 "1.6"
#define ABI_17 "1.7"
#define ABI_18 "1.8"
#define ABI_19 "1.9"
#define ABI_110 "1.10"
#define ABI_111 "1.11"
#define ABI_112 "1.12"
// A field of minor V (10: 1.0, 11: 1.1, 15: 1.5, ..., 19: 1.9, 110: 1.10, ..., 112: 1.12) keeps its
// offset and size.
#define SAME(V, T, field)                                                                    \
  static_assert(offsetof(keel_##T, field) == offsetof(keel##V##_##T, field) &&               \
                    sizeof(keel_##T::field) == sizeof(keel##V##_##T::field),                 \
                "keel_" #T "." #field " moved or changed size since ABI " ABI_##V)
// A field added after minor V lies at or beyond the end of the struct as V had it, so a
// struct_size from a plugin or kernel of minor V never covers it.
#define APPENDED(T, field, V)                                                                \
  static_assert(offsetof(keel_##T, field) >= sizeof(keel##V##_##T),                          \
                "keel_" #T "." #field " was added after ABI " ABI_##V " but lies inside it")
// A struct only grows.
#define GROWN(T) \
  static_assert(sizeof(keel_##T) >= sizeof(keel10_##T), "keel_" #T " shrank since ABI 1.0")
// Structs without a struct_size, and the descriptor, have not grown since 1.0. When one does
// (abi.h allows it in a new minor), the kernel must keep accepting and handing plugins of older
// minors the layout of their minor; today Registry::check refuses a descriptor, component table
// or option table smaller than the current struct. Replace this assert with a test of that code.
#define UNCHANGED_SIZE(T)                                                                    \
  static_assert(sizeof(keel_##T) == sizeof(keel10_##T),                                      \
                "keel_" #T " changed size since ABI 1.0; see UNCHANGED_SIZE")

// keel_error
GROWN(error);
UNCHANGED_SIZE(error);
SAME(10, error, message);

// keel_host
GROWN(host);
SAME(10, host, struct_size);
SAME(10, host, abi_major);
SAME(10, host, abi_minor);
SAME(10, host, torch_version);
SAME(10, host, tensor_dtype);
SAME(10, host, tensor_ndim);
SAME(10, host, tensor_size);
SAME(10, host, tensor_numel);
SAME(10, host, tensor_cpu_data);
SAME(10, host, tensor_contiguous_cpu);
SAME(10, host, tensor_from_buffer);
SAME(10, host, tensor_retain);
SAME(10, host, tensor_release);
SAME(10, host, option_bool);
SAME(10, host, option_int);
SAME(10, host, option_float);
SAME(10, host, option_string);
SAME(10, host, option_list_size);
SAME(10, host, option_list_int);
SAME(10, host, option_list_float);
SAME(10, host, log);
APPENDED(host, report_error, 11);
APPENDED(host, stop_requested, 19);
APPENDED(table_stats, pending, 19);
APPENDED(sparse_rows, row_values, 110);
APPENDED(sparse_rows, row_grads, 110);
APPENDED(sparse_rows, row_slots, 110);
APPENDED(sparse_table, rows_as_tensors, 110);
APPENDED(sparse_table, device, 110);
APPENDED(create_context, device, 110);
APPENDED(model, get_extension, 111);
APPENDED(dataset, get_extension, 111);
APPENDED(optimizer, get_extension, 111);
APPENDED(sparse_optimizer, get_extension, 111);
APPENDED(lr_scheduler, get_extension, 111);
APPENDED(loss, get_extension, 111);
APPENDED(grad_clipper, get_extension, 111);
APPENDED(mfu, get_extension, 111);
APPENDED(profiler, get_extension, 111);
APPENDED(checkpoint, get_extension, 111);
APPENDED(hook, get_extension, 111);

// keel_option_desc
GROWN(option_desc);
UNCHANGED_SIZE(option_desc);
SAME(10, option_desc, key);
SAME(10, option_desc, type);
SAME(10, option_desc, default_toml);
SAME(10, option_desc, help);
SAME(10, option_desc, min);
SAME(10, option_desc, max);
SAME(10, option_desc, choices);

// keel_named_tensor
GROWN(named_tensor);
UNCHANGED_SIZE(named_tensor);
SAME(10, named_tensor, name);
SAME(10, named_tensor, tensor);

// keel_state_writer: new in 1.3, nothing to compare.

// keel_create_context
GROWN(create_context);
SAME(10, create_context, struct_size);
SAME(10, create_context, host);
SAME(10, create_context, options);
SAME(10, create_context, section);
SAME(10, create_context, seed);
SAME(10, create_context, rank);
SAME(10, create_context, world_size);
SAME(10, create_context, run_dir);
SAME(10, create_context, params);
SAME(10, create_context, param_names);
SAME(10, create_context, param_count);
SAME(10, create_context, total_steps);
SAME(11, create_context, param_group);
APPENDED(create_context, param_group, 10);
SAME(11, create_context, group_count);
APPENDED(create_context, group_count, 10);
SAME(11, create_context, group_lr);
APPENDED(create_context, group_lr, 10);
SAME(11, create_context, group_weight_decay);
APPENDED(create_context, group_weight_decay, 10);
APPENDED(create_context, resume_step, 11);
APPENDED(create_context, shards, 16);
APPENDED(create_context, comm, 18);
APPENDED(create_context, tables, 18);
APPENDED(create_context, table_count, 18);

// keel_model
GROWN(model);
SAME(10, model, struct_size);
SAME(10, model, self);
SAME(10, model, destroy);
SAME(10, model, forward);
SAME(10, model, set_training);
SAME(10, model, param_count);
SAME(10, model, param);
SAME(10, model, state_count);
SAME(10, model, state);
SAME(10, model, flops_per_sample);
APPENDED(model, state_save, 11);
APPENDED(model, state_load, 11);
APPENDED(model, forward_features, 11);
APPENDED(model, export_state, 16);
APPENDED(model, param_unit, 17);
APPENDED(model, set_unit_calls, 17);
APPENDED(model, table_count, 18);
APPENDED(model, table, 18);

// keel_batch
GROWN(batch);
UNCHANGED_SIZE(batch);
SAME(10, batch, inputs);
SAME(10, batch, targets);
SAME(10, batch, samples);
SAME(10, batch, tokens);

// keel_dataset
GROWN(dataset);
SAME(10, dataset, struct_size);
SAME(10, dataset, self);
SAME(10, dataset, destroy);
SAME(10, dataset, size);
SAME(10, dataset, batches_per_epoch);
SAME(10, dataset, start_epoch);
SAME(10, dataset, next);
APPENDED(dataset, seek, 11);
APPENDED(dataset, state_save, 11);
APPENDED(dataset, state_load, 11);
APPENDED(dataset, tokens_per_sample, 11);

// keel_optimizer
GROWN(optimizer);
SAME(10, optimizer, struct_size);
SAME(10, optimizer, self);
SAME(10, optimizer, destroy);
SAME(10, optimizer, step);
SAME(10, optimizer, zero_grad);
SAME(10, optimizer, group_count);
SAME(10, optimizer, get_lr);
SAME(10, optimizer, set_lr);
APPENDED(optimizer, state_save, 11);
APPENDED(optimizer, state_load, 11);

// keel_lr_scheduler
GROWN(lr_scheduler);
SAME(10, lr_scheduler, struct_size);
SAME(10, lr_scheduler, self);
SAME(10, lr_scheduler, destroy);
SAME(10, lr_scheduler, factor);

// keel_loss
GROWN(loss);
SAME(10, loss, struct_size);
SAME(10, loss, self);
SAME(10, loss, destroy);
SAME(10, loss, compute);
SAME(11, loss, count_items);
APPENDED(loss, count_items, 10);
APPENDED(loss, compute_linear, 11);
APPENDED(loss, metric_state_size, 15);
APPENDED(loss, metric_update, 15);
APPENDED(loss, metric_finish, 15);

// keel_grad_clipper
GROWN(grad_clipper);
SAME(10, grad_clipper, struct_size);
SAME(10, grad_clipper, self);
SAME(10, grad_clipper, destroy);
SAME(10, grad_clipper, clip);

// keel_mfu
GROWN(mfu);
SAME(10, mfu, struct_size);
SAME(10, mfu, self);
SAME(10, mfu, destroy);
SAME(10, mfu, compute);
APPENDED(mfu, peak_flops, 11);

// keel_profiler
GROWN(profiler);
SAME(10, profiler, struct_size);
SAME(10, profiler, self);
SAME(10, profiler, destroy);
SAME(10, profiler, begin);
SAME(10, profiler, end);
SAME(10, profiler, flush);

// keel_checkpoint
GROWN(checkpoint);
SAME(10, checkpoint, struct_size);
SAME(10, checkpoint, self);
SAME(10, checkpoint, destroy);
SAME(10, checkpoint, save);
SAME(10, checkpoint, load);

// keel_metric
GROWN(metric);
UNCHANGED_SIZE(metric);
SAME(10, metric, key);
SAME(10, metric, value);

// keel_trainer_state
GROWN(trainer_state);
SAME(10, trainer_state, struct_size);
SAME(10, trainer_state, step);
SAME(10, trainer_state, epoch);
SAME(10, trainer_state, samples);
SAME(10, trainer_state, tokens);
SAME(10, trainer_state, max_steps);
SAME(10, trainer_state, epochs);
SAME(10, trainer_state, lr);
SAME(10, trainer_state, loss);
SAME(11, trainer_state, skipped_steps);
APPENDED(trainer_state, skipped_steps, 10);
SAME(11, trainer_state, grad_norm);
APPENDED(trainer_state, grad_norm, 10);
SAME(11, trainer_state, train_metrics);
APPENDED(trainer_state, train_metrics, 10);
SAME(11, trainer_state, train_metric_count);
APPENDED(trainer_state, train_metric_count, 10);
SAME(11, trainer_state, eval_metrics);
APPENDED(trainer_state, eval_metrics, 10);
SAME(11, trainer_state, eval_metric_count);
APPENDED(trainer_state, eval_metric_count, 10);

// keel_event
GROWN(event);
SAME(10, event, struct_size);
SAME(10, event, kind);
SAME(10, event, state);
SAME(10, event, split);
SAME(10, event, metrics);
SAME(10, event, metric_count);
SAME(10, event, path);
SAME(10, event, requests);
SAME(11, event, micro_batch);
APPENDED(event, micro_batch, 10);
SAME(11, event, message);
APPENDED(event, message, 10);

// keel_hook
GROWN(hook);
SAME(10, hook, struct_size);
SAME(10, hook, self);
SAME(10, hook, destroy);
SAME(10, hook, on_event);
SAME(11, hook, state_count);
APPENDED(hook, state_count, 10);
SAME(11, hook, state);
APPENDED(hook, state, 10);

// keel_component_desc
GROWN(component_desc);
UNCHANGED_SIZE(component_desc);
SAME(10, component_desc, kind);
SAME(10, component_desc, name);
SAME(10, component_desc, description);
SAME(10, component_desc, options);
SAME(10, component_desc, option_count);
SAME(10, component_desc, option_size);
SAME(10, component_desc, create);

// keel_build_fingerprint
GROWN(build_fingerprint);
UNCHANGED_SIZE(build_fingerprint);
SAME(10, build_fingerprint, torch_version);
SAME(10, build_fingerprint, compiler);
SAME(10, build_fingerprint, cxx11_abi);

// keel_plugin_descriptor
GROWN(plugin_descriptor);
UNCHANGED_SIZE(plugin_descriptor);
SAME(10, plugin_descriptor, abi_major);
SAME(10, plugin_descriptor, abi_minor);
SAME(10, plugin_descriptor, struct_size);
SAME(10, plugin_descriptor, name);
SAME(10, plugin_descriptor, version);
SAME(10, plugin_descriptor, description);
SAME(10, plugin_descriptor, fingerprint);
SAME(10, plugin_descriptor, components);
SAME(10, plugin_descriptor, component_count);
SAME(10, plugin_descriptor, component_size);

// Every field of ABI 1.5 keeps its offset and size, in every
// struct of that header (the list is test_abi_layout.c's fields, less those appended in 1.6).
// keel_error
SAME(15, error, message);

// keel_host
SAME(15, host, struct_size);
SAME(15, host, abi_major);
SAME(15, host, abi_minor);
SAME(15, host, torch_version);
SAME(15, host, tensor_dtype);
SAME(15, host, tensor_ndim);
SAME(15, host, tensor_size);
SAME(15, host, tensor_numel);
SAME(15, host, tensor_cpu_data);
SAME(15, host, tensor_contiguous_cpu);
SAME(15, host, tensor_from_buffer);
SAME(15, host, tensor_retain);
SAME(15, host, tensor_release);
SAME(15, host, option_bool);
SAME(15, host, option_int);
SAME(15, host, option_float);
SAME(15, host, option_string);
SAME(15, host, option_list_size);
SAME(15, host, option_list_int);
SAME(15, host, option_list_float);
SAME(15, host, log);
SAME(15, host, report_error);

// keel_option_desc
SAME(15, option_desc, key);
SAME(15, option_desc, type);
SAME(15, option_desc, default_toml);
SAME(15, option_desc, help);
SAME(15, option_desc, min);
SAME(15, option_desc, max);
SAME(15, option_desc, choices);

// keel_named_tensor
SAME(15, named_tensor, name);
SAME(15, named_tensor, tensor);

// keel_state_writer
SAME(15, state_writer, struct_size);
SAME(15, state_writer, host_data);
SAME(15, state_writer, put);

// keel_create_context
SAME(15, create_context, struct_size);
SAME(15, create_context, host);
SAME(15, create_context, options);
SAME(15, create_context, section);
SAME(15, create_context, seed);
SAME(15, create_context, rank);
SAME(15, create_context, world_size);
SAME(15, create_context, run_dir);
SAME(15, create_context, params);
SAME(15, create_context, param_names);
SAME(15, create_context, param_count);
SAME(15, create_context, total_steps);
SAME(15, create_context, param_group);
SAME(15, create_context, group_count);
SAME(15, create_context, group_lr);
SAME(15, create_context, group_weight_decay);
SAME(15, create_context, resume_step);

// keel_model
SAME(15, model, struct_size);
SAME(15, model, self);
SAME(15, model, destroy);
SAME(15, model, forward);
SAME(15, model, set_training);
SAME(15, model, param_count);
SAME(15, model, param);
SAME(15, model, state_count);
SAME(15, model, state);
SAME(15, model, flops_per_sample);
SAME(15, model, state_save);
SAME(15, model, state_load);
SAME(15, model, forward_features);

// keel_batch
SAME(15, batch, inputs);
SAME(15, batch, targets);
SAME(15, batch, samples);
SAME(15, batch, tokens);

// keel_dataset
SAME(15, dataset, struct_size);
SAME(15, dataset, self);
SAME(15, dataset, destroy);
SAME(15, dataset, size);
SAME(15, dataset, batches_per_epoch);
SAME(15, dataset, start_epoch);
SAME(15, dataset, next);
SAME(15, dataset, seek);
SAME(15, dataset, state_save);
SAME(15, dataset, state_load);
SAME(15, dataset, tokens_per_sample);

// keel_optimizer
SAME(15, optimizer, struct_size);
SAME(15, optimizer, self);
SAME(15, optimizer, destroy);
SAME(15, optimizer, step);
SAME(15, optimizer, zero_grad);
SAME(15, optimizer, group_count);
SAME(15, optimizer, get_lr);
SAME(15, optimizer, set_lr);
SAME(15, optimizer, state_save);
SAME(15, optimizer, state_load);

// keel_lr_scheduler
SAME(15, lr_scheduler, struct_size);
SAME(15, lr_scheduler, self);
SAME(15, lr_scheduler, destroy);
SAME(15, lr_scheduler, factor);

// keel_loss
SAME(15, loss, struct_size);
SAME(15, loss, self);
SAME(15, loss, destroy);
SAME(15, loss, compute);
SAME(15, loss, count_items);
SAME(15, loss, compute_linear);

// keel_grad_clipper
SAME(15, grad_clipper, struct_size);
SAME(15, grad_clipper, self);
SAME(15, grad_clipper, destroy);
SAME(15, grad_clipper, clip);

// keel_mfu
SAME(15, mfu, struct_size);
SAME(15, mfu, self);
SAME(15, mfu, destroy);
SAME(15, mfu, compute);
SAME(15, mfu, peak_flops);

// keel_profiler
SAME(15, profiler, struct_size);
SAME(15, profiler, self);
SAME(15, profiler, destroy);
SAME(15, profiler, begin);
SAME(15, profiler, end);
SAME(15, profiler, flush);

// keel_checkpoint
SAME(15, checkpoint, struct_size);
SAME(15, checkpoint, self);
SAME(15, checkpoint, destroy);
SAME(15, checkpoint, save);
SAME(15, checkpoint, load);

// keel_metric
SAME(15, metric, key);
SAME(15, metric, value);

// keel_trainer_state
SAME(15, trainer_state, struct_size);
SAME(15, trainer_state, step);
SAME(15, trainer_state, epoch);
SAME(15, trainer_state, samples);
SAME(15, trainer_state, tokens);
SAME(15, trainer_state, max_steps);
SAME(15, trainer_state, epochs);
SAME(15, trainer_state, lr);
SAME(15, trainer_state, loss);
SAME(15, trainer_state, skipped_steps);
SAME(15, trainer_state, grad_norm);
SAME(15, trainer_state, train_metrics);
SAME(15, trainer_state, train_metric_count);
SAME(15, trainer_state, eval_metrics);
SAME(15, trainer_state, eval_metric_count);

// keel_event
SAME(15, event, struct_size);
SAME(15, event, kind);
SAME(15, event, state);
SAME(15, event, split);
SAME(15, event, metrics);
SAME(15, event, metric_count);
SAME(15, event, path);
SAME(15, event, requests);
SAME(15, event, micro_batch);
SAME(15, event, message);

// keel_hook
SAME(15, hook, struct_size);
SAME(15, hook, self);
SAME(15, hook, destroy);
SAME(15, hook, on_event);
SAME(15, hook, state_count);
SAME(15, hook, state);

// keel_component_desc
SAME(15, component_desc, kind);
SAME(15, component_desc, name);
SAME(15, component_desc, description);
SAME(15, component_desc, options);
SAME(15, component_desc, option_count);
SAME(15, component_desc, option_size);
SAME(15, component_desc, create);

// keel_build_fingerprint
SAME(15, build_fingerprint, torch_version);
SAME(15, build_fingerprint, compiler);
SAME(15, build_fingerprint, cxx11_abi);

// keel_plugin_descriptor
SAME(15, plugin_descriptor, abi_major);
SAME(15, plugin_descriptor, abi_minor);
SAME(15, plugin_descriptor, struct_size);
SAME(15, plugin_descriptor, name);
SAME(15, plugin_descriptor, version);
SAME(15, plugin_descriptor, description);
SAME(15, plugin_descriptor, fingerprint);
SAME(15, plugin_descriptor, components);
SAME(15, plugin_descriptor, component_count);
SAME(15, plugin_descriptor, component_size);

// Every field of ABI 1.6 keeps its offset and size, in every
// struct of that header (the list is test_abi_layout.c's fields, less those appended in 1.7).
// keel_error
SAME(16, error, message);

// keel_host
SAME(16, host, struct_size);
SAME(16, host, abi_major);
SAME(16, host, abi_minor);
SAME(16, host, torch_version);
SAME(16, host, tensor_dtype);
SAME(16, host, tensor_ndim);
SAME(16, host, tensor_size);
SAME(16, host, tensor_numel);
SAME(16, host, tensor_cpu_data);
SAME(16, host, tensor_contiguous_cpu);
SAME(16, host, tensor_from_buffer);
SAME(16, host, tensor_retain);
SAME(16, host, tensor_release);
SAME(16, host, option_bool);
SAME(16, host, option_int);
SAME(16, host, option_float);
SAME(16, host, option_string);
SAME(16, host, option_list_size);
SAME(16, host, option_list_int);
SAME(16, host, option_list_float);
SAME(16, host, log);
SAME(16, host, report_error);

// keel_option_desc
SAME(16, option_desc, key);
SAME(16, option_desc, type);
SAME(16, option_desc, default_toml);
SAME(16, option_desc, help);
SAME(16, option_desc, min);
SAME(16, option_desc, max);
SAME(16, option_desc, choices);

// keel_named_tensor
SAME(16, named_tensor, name);
SAME(16, named_tensor, tensor);

// keel_state_writer
SAME(16, state_writer, struct_size);
SAME(16, state_writer, host_data);
SAME(16, state_writer, put);

// keel_metric_writer
SAME(16, metric_writer, struct_size);
SAME(16, metric_writer, host_data);
SAME(16, metric_writer, put);

// keel_create_context
SAME(16, create_context, struct_size);
SAME(16, create_context, host);
SAME(16, create_context, options);
SAME(16, create_context, section);
SAME(16, create_context, seed);
SAME(16, create_context, rank);
SAME(16, create_context, world_size);
SAME(16, create_context, run_dir);
SAME(16, create_context, params);
SAME(16, create_context, param_names);
SAME(16, create_context, param_count);
SAME(16, create_context, total_steps);
SAME(16, create_context, param_group);
SAME(16, create_context, group_count);
SAME(16, create_context, group_lr);
SAME(16, create_context, group_weight_decay);
SAME(16, create_context, resume_step);

// keel_model
SAME(16, model, struct_size);
SAME(16, model, self);
SAME(16, model, destroy);
SAME(16, model, forward);
SAME(16, model, set_training);
SAME(16, model, param_count);
SAME(16, model, param);
SAME(16, model, state_count);
SAME(16, model, state);
SAME(16, model, flops_per_sample);
SAME(16, model, state_save);
SAME(16, model, state_load);
SAME(16, model, forward_features);

// keel_batch
SAME(16, batch, inputs);
SAME(16, batch, targets);
SAME(16, batch, samples);
SAME(16, batch, tokens);

// keel_dataset
SAME(16, dataset, struct_size);
SAME(16, dataset, self);
SAME(16, dataset, destroy);
SAME(16, dataset, size);
SAME(16, dataset, batches_per_epoch);
SAME(16, dataset, start_epoch);
SAME(16, dataset, next);
SAME(16, dataset, seek);
SAME(16, dataset, state_save);
SAME(16, dataset, state_load);
SAME(16, dataset, tokens_per_sample);

// keel_optimizer
SAME(16, optimizer, struct_size);
SAME(16, optimizer, self);
SAME(16, optimizer, destroy);
SAME(16, optimizer, step);
SAME(16, optimizer, zero_grad);
SAME(16, optimizer, group_count);
SAME(16, optimizer, get_lr);
SAME(16, optimizer, set_lr);
SAME(16, optimizer, state_save);
SAME(16, optimizer, state_load);

// keel_lr_scheduler
SAME(16, lr_scheduler, struct_size);
SAME(16, lr_scheduler, self);
SAME(16, lr_scheduler, destroy);
SAME(16, lr_scheduler, factor);

// keel_loss
SAME(16, loss, struct_size);
SAME(16, loss, self);
SAME(16, loss, destroy);
SAME(16, loss, compute);
SAME(16, loss, count_items);
SAME(16, loss, compute_linear);
SAME(16, loss, metric_state_size);
SAME(16, loss, metric_update);
SAME(16, loss, metric_finish);

// keel_grad_clipper
SAME(16, grad_clipper, struct_size);
SAME(16, grad_clipper, self);
SAME(16, grad_clipper, destroy);
SAME(16, grad_clipper, clip);

// keel_mfu
SAME(16, mfu, struct_size);
SAME(16, mfu, self);
SAME(16, mfu, destroy);
SAME(16, mfu, compute);
SAME(16, mfu, peak_flops);

// keel_profiler
SAME(16, profiler, struct_size);
SAME(16, profiler, self);
SAME(16, profiler, destroy);
SAME(16, profiler, begin);
SAME(16, profiler, end);
SAME(16, profiler, flush);

// keel_checkpoint
SAME(16, checkpoint, struct_size);
SAME(16, checkpoint, self);
SAME(16, checkpoint, destroy);
SAME(16, checkpoint, save);
SAME(16, checkpoint, load);

// keel_metric
SAME(16, metric, key);
SAME(16, metric, value);

// keel_trainer_state
SAME(16, trainer_state, struct_size);
SAME(16, trainer_state, step);
SAME(16, trainer_state, epoch);
SAME(16, trainer_state, samples);
SAME(16, trainer_state, tokens);
SAME(16, trainer_state, max_steps);
SAME(16, trainer_state, epochs);
SAME(16, trainer_state, lr);
SAME(16, trainer_state, loss);
SAME(16, trainer_state, skipped_steps);
SAME(16, trainer_state, grad_norm);
SAME(16, trainer_state, train_metrics);
SAME(16, trainer_state, train_metric_count);
SAME(16, trainer_state, eval_metrics);
SAME(16, trainer_state, eval_metric_count);

// keel_event
SAME(16, event, struct_size);
SAME(16, event, kind);
SAME(16, event, state);
SAME(16, event, split);
SAME(16, event, metrics);
SAME(16, event, metric_count);
SAME(16, event, path);
SAME(16, event, requests);
SAME(16, event, micro_batch);
SAME(16, event, message);

// keel_hook
SAME(16, hook, struct_size);
SAME(16, hook, self);
SAME(16, hook, destroy);
SAME(16, hook, on_event);
SAME(16, hook, state_count);
SAME(16, hook, state);

// keel_component_desc
SAME(16, component_desc, kind);
SAME(16, component_desc, name);
SAME(16, component_desc, description);
SAME(16, component_desc, options);
SAME(16, component_desc, option_count);
SAME(16, component_desc, option_size);
SAME(16, component_desc, create);

// keel_build_fingerprint
SAME(16, build_fingerprint, torch_version);
SAME(16, build_fingerprint, compiler);
SAME(16, build_fingerprint, cxx11_abi);

// keel_plugin_descriptor
SAME(16, plugin_descriptor, abi_major);
SAME(16, plugin_descriptor, abi_minor);
SAME(16, plugin_descriptor, struct_size);
SAME(16, plugin_descriptor, name);
SAME(16, plugin_descriptor, version);
SAME(16, plugin_descriptor, description);
SAME(16, plugin_descriptor, fingerprint);
SAME(16, plugin_descriptor, components);
SAME(16, plugin_descriptor, component_count);
SAME(16, plugin_descriptor, component_size);

// Every field of ABI 1.7 keeps its offset and size, in every
// struct of that header (the list is test_abi_layout.c's fields, less those appended in 1.8).
// keel_error
SAME(17, error, message);

// keel_host
SAME(17, host, struct_size);
SAME(17, host, abi_major);
SAME(17, host, abi_minor);
SAME(17, host, torch_version);
SAME(17, host, tensor_dtype);
SAME(17, host, tensor_ndim);
SAME(17, host, tensor_size);
SAME(17, host, tensor_numel);
SAME(17, host, tensor_cpu_data);
SAME(17, host, tensor_contiguous_cpu);
SAME(17, host, tensor_from_buffer);
SAME(17, host, tensor_retain);
SAME(17, host, tensor_release);
SAME(17, host, option_bool);
SAME(17, host, option_int);
SAME(17, host, option_float);
SAME(17, host, option_string);
SAME(17, host, option_list_size);
SAME(17, host, option_list_int);
SAME(17, host, option_list_float);
SAME(17, host, log);
SAME(17, host, report_error);

// keel_option_desc
SAME(17, option_desc, key);
SAME(17, option_desc, type);
SAME(17, option_desc, default_toml);
SAME(17, option_desc, help);
SAME(17, option_desc, min);
SAME(17, option_desc, max);
SAME(17, option_desc, choices);

// keel_named_tensor
SAME(17, named_tensor, name);
SAME(17, named_tensor, tensor);

// keel_state_writer
SAME(17, state_writer, struct_size);
SAME(17, state_writer, host_data);
SAME(17, state_writer, put);

// keel_shard_group
SAME(17, shard_group, struct_size);
SAME(17, shard_group, host_data);
SAME(17, shard_group, all_reduce);

// keel_metric_writer
SAME(17, metric_writer, struct_size);
SAME(17, metric_writer, host_data);
SAME(17, metric_writer, put);

// keel_create_context
SAME(17, create_context, struct_size);
SAME(17, create_context, host);
SAME(17, create_context, options);
SAME(17, create_context, section);
SAME(17, create_context, seed);
SAME(17, create_context, rank);
SAME(17, create_context, world_size);
SAME(17, create_context, run_dir);
SAME(17, create_context, params);
SAME(17, create_context, param_names);
SAME(17, create_context, param_count);
SAME(17, create_context, total_steps);
SAME(17, create_context, param_group);
SAME(17, create_context, group_count);
SAME(17, create_context, group_lr);
SAME(17, create_context, group_weight_decay);
SAME(17, create_context, resume_step);
SAME(17, create_context, shards);

// keel_model
SAME(17, model, struct_size);
SAME(17, model, self);
SAME(17, model, destroy);
SAME(17, model, forward);
SAME(17, model, set_training);
SAME(17, model, param_count);
SAME(17, model, param);
SAME(17, model, state_count);
SAME(17, model, state);
SAME(17, model, flops_per_sample);
SAME(17, model, state_save);
SAME(17, model, state_load);
SAME(17, model, forward_features);
SAME(17, model, export_state);

// keel_batch
SAME(17, batch, inputs);
SAME(17, batch, targets);
SAME(17, batch, samples);
SAME(17, batch, tokens);

// keel_dataset
SAME(17, dataset, struct_size);
SAME(17, dataset, self);
SAME(17, dataset, destroy);
SAME(17, dataset, size);
SAME(17, dataset, batches_per_epoch);
SAME(17, dataset, start_epoch);
SAME(17, dataset, next);
SAME(17, dataset, seek);
SAME(17, dataset, state_save);
SAME(17, dataset, state_load);
SAME(17, dataset, tokens_per_sample);

// keel_optimizer
SAME(17, optimizer, struct_size);
SAME(17, optimizer, self);
SAME(17, optimizer, destroy);
SAME(17, optimizer, step);
SAME(17, optimizer, zero_grad);
SAME(17, optimizer, group_count);
SAME(17, optimizer, get_lr);
SAME(17, optimizer, set_lr);
SAME(17, optimizer, state_save);
SAME(17, optimizer, state_load);

// keel_lr_scheduler
SAME(17, lr_scheduler, struct_size);
SAME(17, lr_scheduler, self);
SAME(17, lr_scheduler, destroy);
SAME(17, lr_scheduler, factor);

// keel_loss
SAME(17, loss, struct_size);
SAME(17, loss, self);
SAME(17, loss, destroy);
SAME(17, loss, compute);
SAME(17, loss, count_items);
SAME(17, loss, compute_linear);
SAME(17, loss, metric_state_size);
SAME(17, loss, metric_update);
SAME(17, loss, metric_finish);

// keel_grad_clipper
SAME(17, grad_clipper, struct_size);
SAME(17, grad_clipper, self);
SAME(17, grad_clipper, destroy);
SAME(17, grad_clipper, clip);

// keel_mfu
SAME(17, mfu, struct_size);
SAME(17, mfu, self);
SAME(17, mfu, destroy);
SAME(17, mfu, compute);
SAME(17, mfu, peak_flops);

// keel_profiler
SAME(17, profiler, struct_size);
SAME(17, profiler, self);
SAME(17, profiler, destroy);
SAME(17, profiler, begin);
SAME(17, profiler, end);
SAME(17, profiler, flush);

// keel_checkpoint
SAME(17, checkpoint, struct_size);
SAME(17, checkpoint, self);
SAME(17, checkpoint, destroy);
SAME(17, checkpoint, save);
SAME(17, checkpoint, load);

// keel_metric
SAME(17, metric, key);
SAME(17, metric, value);

// keel_trainer_state
SAME(17, trainer_state, struct_size);
SAME(17, trainer_state, step);
SAME(17, trainer_state, epoch);
SAME(17, trainer_state, samples);
SAME(17, trainer_state, tokens);
SAME(17, trainer_state, max_steps);
SAME(17, trainer_state, epochs);
SAME(17, trainer_state, lr);
SAME(17, trainer_state, loss);
SAME(17, trainer_state, skipped_steps);
SAME(17, trainer_state, grad_norm);
SAME(17, trainer_state, train_metrics);
SAME(17, trainer_state, train_metric_count);
SAME(17, trainer_state, eval_metrics);
SAME(17, trainer_state, eval_metric_count);

// keel_event
SAME(17, event, struct_size);
SAME(17, event, kind);
SAME(17, event, state);
SAME(17, event, split);
SAME(17, event, metrics);
SAME(17, event, metric_count);
SAME(17, event, path);
SAME(17, event, requests);
SAME(17, event, micro_batch);
SAME(17, event, message);

// keel_hook
SAME(17, hook, struct_size);
SAME(17, hook, self);
SAME(17, hook, destroy);
SAME(17, hook, on_event);
SAME(17, hook, state_count);
SAME(17, hook, state);

// keel_component_desc
SAME(17, component_desc, kind);
SAME(17, component_desc, name);
SAME(17, component_desc, description);
SAME(17, component_desc, options);
SAME(17, component_desc, option_count);
SAME(17, component_desc, option_size);
SAME(17, component_desc, create);

// keel_build_fingerprint
SAME(17, build_fingerprint, torch_version);
SAME(17, build_fingerprint, compiler);
SAME(17, build_fingerprint, cxx11_abi);

// keel_plugin_descriptor
SAME(17, plugin_descriptor, abi_major);
SAME(17, plugin_descriptor, abi_minor);
SAME(17, plugin_descriptor, struct_size);
SAME(17, plugin_descriptor, name);
SAME(17, plugin_descriptor, version);
SAME(17, plugin_descriptor, description);
SAME(17, plugin_descriptor, fingerprint);
SAME(17, plugin_descriptor, components);
SAME(17, plugin_descriptor, component_count);
SAME(17, plugin_descriptor, component_size);

// Every field of ABI 1.8 (the minor before the current one) keeps its offset and size, in every
// struct of that header (the list is test_abi_layout.c's fields, less those appended in 1.9).
// keel_error
SAME(18, error, message);

// keel_host
SAME(18, host, struct_size);
SAME(18, host, abi_major);
SAME(18, host, abi_minor);
SAME(18, host, torch_version);
SAME(18, host, tensor_dtype);
SAME(18, host, tensor_ndim);
SAME(18, host, tensor_size);
SAME(18, host, tensor_numel);
SAME(18, host, tensor_cpu_data);
SAME(18, host, tensor_contiguous_cpu);
SAME(18, host, tensor_from_buffer);
SAME(18, host, tensor_retain);
SAME(18, host, tensor_release);
SAME(18, host, option_bool);
SAME(18, host, option_int);
SAME(18, host, option_float);
SAME(18, host, option_string);
SAME(18, host, option_list_size);
SAME(18, host, option_list_int);
SAME(18, host, option_list_float);
SAME(18, host, log);
SAME(18, host, report_error);

// keel_option_desc
SAME(18, option_desc, key);
SAME(18, option_desc, type);
SAME(18, option_desc, default_toml);
SAME(18, option_desc, help);
SAME(18, option_desc, min);
SAME(18, option_desc, max);
SAME(18, option_desc, choices);

// keel_named_tensor
SAME(18, named_tensor, name);
SAME(18, named_tensor, tensor);

// keel_state_writer
SAME(18, state_writer, struct_size);
SAME(18, state_writer, host_data);
SAME(18, state_writer, put);

// keel_shard_group
SAME(18, shard_group, struct_size);
SAME(18, shard_group, host_data);
SAME(18, shard_group, all_reduce);

// keel_unit_calls
SAME(18, unit_calls, struct_size);
SAME(18, unit_calls, host_data);
SAME(18, unit_calls, enter);
SAME(18, unit_calls, leave);

// keel_metric_writer
SAME(18, metric_writer, struct_size);
SAME(18, metric_writer, host_data);
SAME(18, metric_writer, put);

// keel_create_context
SAME(18, create_context, struct_size);
SAME(18, create_context, host);
SAME(18, create_context, options);
SAME(18, create_context, section);
SAME(18, create_context, seed);
SAME(18, create_context, rank);
SAME(18, create_context, world_size);
SAME(18, create_context, run_dir);
SAME(18, create_context, params);
SAME(18, create_context, param_names);
SAME(18, create_context, param_count);
SAME(18, create_context, total_steps);
SAME(18, create_context, param_group);
SAME(18, create_context, group_count);
SAME(18, create_context, group_lr);
SAME(18, create_context, group_weight_decay);
SAME(18, create_context, resume_step);
SAME(18, create_context, shards);

// keel_model
SAME(18, model, struct_size);
SAME(18, model, self);
SAME(18, model, destroy);
SAME(18, model, forward);
SAME(18, model, set_training);
SAME(18, model, param_count);
SAME(18, model, param);
SAME(18, model, state_count);
SAME(18, model, state);
SAME(18, model, flops_per_sample);
SAME(18, model, state_save);
SAME(18, model, state_load);
SAME(18, model, forward_features);
SAME(18, model, export_state);
SAME(18, model, param_unit);
SAME(18, model, set_unit_calls);

// keel_batch
SAME(18, batch, inputs);
SAME(18, batch, targets);
SAME(18, batch, samples);
SAME(18, batch, tokens);

// keel_dataset
SAME(18, dataset, struct_size);
SAME(18, dataset, self);
SAME(18, dataset, destroy);
SAME(18, dataset, size);
SAME(18, dataset, batches_per_epoch);
SAME(18, dataset, start_epoch);
SAME(18, dataset, next);
SAME(18, dataset, seek);
SAME(18, dataset, state_save);
SAME(18, dataset, state_load);
SAME(18, dataset, tokens_per_sample);

// keel_optimizer
SAME(18, optimizer, struct_size);
SAME(18, optimizer, self);
SAME(18, optimizer, destroy);
SAME(18, optimizer, step);
SAME(18, optimizer, zero_grad);
SAME(18, optimizer, group_count);
SAME(18, optimizer, get_lr);
SAME(18, optimizer, set_lr);
SAME(18, optimizer, state_save);
SAME(18, optimizer, state_load);

// keel_lr_scheduler
SAME(18, lr_scheduler, struct_size);
SAME(18, lr_scheduler, self);
SAME(18, lr_scheduler, destroy);
SAME(18, lr_scheduler, factor);

// keel_loss
SAME(18, loss, struct_size);
SAME(18, loss, self);
SAME(18, loss, destroy);
SAME(18, loss, compute);
SAME(18, loss, count_items);
SAME(18, loss, compute_linear);
SAME(18, loss, metric_state_size);
SAME(18, loss, metric_update);
SAME(18, loss, metric_finish);

// keel_grad_clipper
SAME(18, grad_clipper, struct_size);
SAME(18, grad_clipper, self);
SAME(18, grad_clipper, destroy);
SAME(18, grad_clipper, clip);

// keel_mfu
SAME(18, mfu, struct_size);
SAME(18, mfu, self);
SAME(18, mfu, destroy);
SAME(18, mfu, compute);
SAME(18, mfu, peak_flops);

// keel_profiler
SAME(18, profiler, struct_size);
SAME(18, profiler, self);
SAME(18, profiler, destroy);
SAME(18, profiler, begin);
SAME(18, profiler, end);
SAME(18, profiler, flush);

// keel_checkpoint
SAME(18, checkpoint, struct_size);
SAME(18, checkpoint, self);
SAME(18, checkpoint, destroy);
SAME(18, checkpoint, save);
SAME(18, checkpoint, load);

// keel_metric
SAME(18, metric, key);
SAME(18, metric, value);

// keel_trainer_state
SAME(18, trainer_state, struct_size);
SAME(18, trainer_state, step);
SAME(18, trainer_state, epoch);
SAME(18, trainer_state, samples);
SAME(18, trainer_state, tokens);
SAME(18, trainer_state, max_steps);
SAME(18, trainer_state, epochs);
SAME(18, trainer_state, lr);
SAME(18, trainer_state, loss);
SAME(18, trainer_state, skipped_steps);
SAME(18, trainer_state, grad_norm);
SAME(18, trainer_state, train_metrics);
SAME(18, trainer_state, train_metric_count);
SAME(18, trainer_state, eval_metrics);
SAME(18, trainer_state, eval_metric_count);

// keel_event
SAME(18, event, struct_size);
SAME(18, event, kind);
SAME(18, event, state);
SAME(18, event, split);
SAME(18, event, metrics);
SAME(18, event, metric_count);
SAME(18, event, path);
SAME(18, event, requests);
SAME(18, event, micro_batch);
SAME(18, event, message);

// keel_hook
SAME(18, hook, struct_size);
SAME(18, hook, self);
SAME(18, hook, destroy);
SAME(18, hook, on_event);
SAME(18, hook, state_count);
SAME(18, hook, state);

// keel_component_desc
SAME(18, component_desc, kind);
SAME(18, component_desc, name);
SAME(18, component_desc, description);
SAME(18, component_desc, options);
SAME(18, component_desc, option_count);
SAME(18, component_desc, option_size);
SAME(18, component_desc, create);

// keel_build_fingerprint
SAME(18, build_fingerprint, torch_version);
SAME(18, build_fingerprint, compiler);
SAME(18, build_fingerprint, cxx11_abi);

// keel_plugin_descriptor
SAME(18, plugin_descriptor, abi_major);
SAME(18, plugin_descriptor, abi_minor);
SAME(18, plugin_descriptor, struct_size);
SAME(18, plugin_descriptor, name);
SAME(18, plugin_descriptor, version);
SAME(18, plugin_descriptor, description);
SAME(18, plugin_descriptor, fingerprint);
SAME(18, plugin_descriptor, components);
SAME(18, plugin_descriptor, component_count);
SAME(18, plugin_descriptor, component_size);

// Every field of ABI 1.9 keeps its offset and size, in every struct of that header (the list
// is test_abi_layout.c's fields, less those appended in 1.10 and 1.11).
// keel_error
SAME(19, error, message);

// keel_host
SAME(19, host, struct_size);
SAME(19, host, abi_major);
SAME(19, host, abi_minor);
SAME(19, host, torch_version);
SAME(19, host, tensor_dtype);
SAME(19, host, tensor_ndim);
SAME(19, host, tensor_size);
SAME(19, host, tensor_numel);
SAME(19, host, tensor_cpu_data);
SAME(19, host, tensor_contiguous_cpu);
SAME(19, host, tensor_from_buffer);
SAME(19, host, tensor_retain);
SAME(19, host, tensor_release);
SAME(19, host, option_bool);
SAME(19, host, option_int);
SAME(19, host, option_float);
SAME(19, host, option_string);
SAME(19, host, option_list_size);
SAME(19, host, option_list_int);
SAME(19, host, option_list_float);
SAME(19, host, log);
SAME(19, host, report_error);

// keel_option_desc
SAME(19, option_desc, key);
SAME(19, option_desc, type);
SAME(19, option_desc, default_toml);
SAME(19, option_desc, help);
SAME(19, option_desc, min);
SAME(19, option_desc, max);
SAME(19, option_desc, choices);

// keel_named_tensor
SAME(19, named_tensor, name);
SAME(19, named_tensor, tensor);

// keel_state_writer
SAME(19, state_writer, struct_size);
SAME(19, state_writer, host_data);
SAME(19, state_writer, put);

// keel_create_context
SAME(19, create_context, struct_size);
SAME(19, create_context, host);
SAME(19, create_context, options);
SAME(19, create_context, section);
SAME(19, create_context, seed);
SAME(19, create_context, rank);
SAME(19, create_context, world_size);
SAME(19, create_context, run_dir);
SAME(19, create_context, params);
SAME(19, create_context, param_names);
SAME(19, create_context, param_count);
SAME(19, create_context, total_steps);
SAME(19, create_context, param_group);
SAME(19, create_context, group_count);
SAME(19, create_context, group_lr);
SAME(19, create_context, group_weight_decay);
SAME(19, create_context, resume_step);
SAME(19, create_context, shards);
SAME(19, create_context, comm);
SAME(19, create_context, tables);
SAME(19, create_context, table_count);

// keel_shard_group
SAME(19, shard_group, struct_size);
SAME(19, shard_group, host_data);
SAME(19, shard_group, all_reduce);

// keel_comm
SAME(19, comm, struct_size);
SAME(19, comm, host_data);
SAME(19, comm, rank);
SAME(19, comm, world_size);
SAME(19, comm, all_to_all);
SAME(19, comm, all_gather);

// keel_sparse_rows
SAME(19, sparse_rows, struct_size);
SAME(19, sparse_rows, count);
SAME(19, sparse_rows, ids);
SAME(19, sparse_rows, values);
SAME(19, sparse_rows, grads);
SAME(19, sparse_rows, slots);
SAME(19, sparse_rows, slot_width);

// keel_table_stats
SAME(19, table_stats, struct_size);
SAME(19, table_stats, rows);
SAME(19, table_stats, admitted);
SAME(19, table_stats, evicted);

// keel_sparse_table
SAME(19, sparse_table, struct_size);
SAME(19, sparse_table, self);
SAME(19, sparse_table, name);
SAME(19, sparse_table, dim);
SAME(19, sparse_table, reserve_slots);
SAME(19, sparse_table, touched);
SAME(19, sparse_table, end_step);
SAME(19, sparse_table, stats);
SAME(19, sparse_table, save);
SAME(19, sparse_table, load);

// keel_unit_calls
SAME(19, unit_calls, struct_size);
SAME(19, unit_calls, host_data);
SAME(19, unit_calls, enter);
SAME(19, unit_calls, leave);

// keel_model
SAME(19, model, struct_size);
SAME(19, model, self);
SAME(19, model, destroy);
SAME(19, model, forward);
SAME(19, model, set_training);
SAME(19, model, param_count);
SAME(19, model, param);
SAME(19, model, state_count);
SAME(19, model, state);
SAME(19, model, flops_per_sample);
SAME(19, model, state_save);
SAME(19, model, state_load);
SAME(19, model, forward_features);
SAME(19, model, export_state);
SAME(19, model, param_unit);
SAME(19, model, set_unit_calls);
SAME(19, model, table_count);
SAME(19, model, table);

// keel_batch
SAME(19, batch, inputs);
SAME(19, batch, targets);
SAME(19, batch, samples);
SAME(19, batch, tokens);

// keel_dataset
SAME(19, dataset, struct_size);
SAME(19, dataset, self);
SAME(19, dataset, destroy);
SAME(19, dataset, size);
SAME(19, dataset, batches_per_epoch);
SAME(19, dataset, start_epoch);
SAME(19, dataset, next);
SAME(19, dataset, seek);
SAME(19, dataset, state_save);
SAME(19, dataset, state_load);
SAME(19, dataset, tokens_per_sample);

// keel_optimizer
SAME(19, optimizer, struct_size);
SAME(19, optimizer, self);
SAME(19, optimizer, destroy);
SAME(19, optimizer, step);
SAME(19, optimizer, zero_grad);
SAME(19, optimizer, group_count);
SAME(19, optimizer, get_lr);
SAME(19, optimizer, set_lr);
SAME(19, optimizer, state_save);
SAME(19, optimizer, state_load);

// keel_sparse_optimizer
SAME(19, sparse_optimizer, struct_size);
SAME(19, sparse_optimizer, self);
SAME(19, sparse_optimizer, destroy);
SAME(19, sparse_optimizer, step);
SAME(19, sparse_optimizer, get_lr);
SAME(19, sparse_optimizer, set_lr);
SAME(19, sparse_optimizer, state_save);
SAME(19, sparse_optimizer, state_load);

// keel_lr_scheduler
SAME(19, lr_scheduler, struct_size);
SAME(19, lr_scheduler, self);
SAME(19, lr_scheduler, destroy);
SAME(19, lr_scheduler, factor);

// keel_metric_writer
SAME(19, metric_writer, struct_size);
SAME(19, metric_writer, host_data);
SAME(19, metric_writer, put);

// keel_loss
SAME(19, loss, struct_size);
SAME(19, loss, self);
SAME(19, loss, destroy);
SAME(19, loss, compute);
SAME(19, loss, count_items);
SAME(19, loss, compute_linear);
SAME(19, loss, metric_state_size);
SAME(19, loss, metric_update);
SAME(19, loss, metric_finish);

// keel_grad_clipper
SAME(19, grad_clipper, struct_size);
SAME(19, grad_clipper, self);
SAME(19, grad_clipper, destroy);
SAME(19, grad_clipper, clip);

// keel_mfu
SAME(19, mfu, struct_size);
SAME(19, mfu, self);
SAME(19, mfu, destroy);
SAME(19, mfu, compute);
SAME(19, mfu, peak_flops);

// keel_profiler
SAME(19, profiler, struct_size);
SAME(19, profiler, self);
SAME(19, profiler, destroy);
SAME(19, profiler, begin);
SAME(19, profiler, end);
SAME(19, profiler, flush);

// keel_checkpoint
SAME(19, checkpoint, struct_size);
SAME(19, checkpoint, self);
SAME(19, checkpoint, destroy);
SAME(19, checkpoint, save);
SAME(19, checkpoint, load);

// keel_metric
SAME(19, metric, key);
SAME(19, metric, value);

// keel_trainer_state
SAME(19, trainer_state, struct_size);
SAME(19, trainer_state, step);
SAME(19, trainer_state, epoch);
SAME(19, trainer_state, samples);
SAME(19, trainer_state, tokens);
SAME(19, trainer_state, max_steps);
SAME(19, trainer_state, epochs);
SAME(19, trainer_state, lr);
SAME(19, trainer_state, loss);
SAME(19, trainer_state, skipped_steps);
SAME(19, trainer_state, grad_norm);
SAME(19, trainer_state, train_metrics);
SAME(19, trainer_state, train_metric_count);
SAME(19, trainer_state, eval_metrics);
SAME(19, trainer_state, eval_metric_count);

// keel_event
SAME(19, event, struct_size);
SAME(19, event, kind);
SAME(19, event, state);
SAME(19, event, split);
SAME(19, event, metrics);
SAME(19, event, metric_count);
SAME(19, event, path);
SAME(19, event, requests);
SAME(19, event, micro_batch);
SAME(19, event, message);

// keel_hook
SAME(19, hook, struct_size);
SAME(19, hook, self);
SAME(19, hook, destroy);
SAME(19, hook, on_event);
SAME(19, hook, state_count);
SAME(19, hook, state);

// keel_component_desc
SAME(19, component_desc, kind);
SAME(19, component_desc, name);
SAME(19, component_desc, description);
SAME(19, component_desc, options);
SAME(19, component_desc, option_count);
SAME(19, component_desc, option_size);
SAME(19, component_desc, create);

// keel_build_fingerprint
SAME(19, build_fingerprint, torch_version);
SAME(19, build_fingerprint, compiler);
SAME(19, build_fingerprint, cxx11_abi);

// keel_plugin_descriptor
SAME(19, plugin_descriptor, abi_major);
SAME(19, plugin_descriptor, abi_minor);
SAME(19, plugin_descriptor, struct_size);
SAME(19, plugin_descriptor, name);
SAME(19, plugin_descriptor, version);
SAME(19, plugin_descriptor, description);
SAME(19, plugin_descriptor, fingerprint);
SAME(19, plugin_descriptor, components);
SAME(19, plugin_descriptor, component_count);
SAME(19, plugin_descriptor, component_size);

// Every field of ABI 1.10 (the minor before the current one) keeps its offset and size, in
// every struct of that header (the list is test_abi_layout.c's fields, less those appended in
// 1.11).
// keel_error
SAME(110, error, message);

// keel_host
SAME(110, host, struct_size);
SAME(110, host, abi_major);
SAME(110, host, abi_minor);
SAME(110, host, torch_version);
SAME(110, host, tensor_dtype);
SAME(110, host, tensor_ndim);
SAME(110, host, tensor_size);
SAME(110, host, tensor_numel);
SAME(110, host, tensor_cpu_data);
SAME(110, host, tensor_contiguous_cpu);
SAME(110, host, tensor_from_buffer);
SAME(110, host, tensor_retain);
SAME(110, host, tensor_release);
SAME(110, host, option_bool);
SAME(110, host, option_int);
SAME(110, host, option_float);
SAME(110, host, option_string);
SAME(110, host, option_list_size);
SAME(110, host, option_list_int);
SAME(110, host, option_list_float);
SAME(110, host, log);
SAME(110, host, report_error);
SAME(110, host, stop_requested);

// keel_option_desc
SAME(110, option_desc, key);
SAME(110, option_desc, type);
SAME(110, option_desc, default_toml);
SAME(110, option_desc, help);
SAME(110, option_desc, min);
SAME(110, option_desc, max);
SAME(110, option_desc, choices);

// keel_named_tensor
SAME(110, named_tensor, name);
SAME(110, named_tensor, tensor);

// keel_state_writer
SAME(110, state_writer, struct_size);
SAME(110, state_writer, host_data);
SAME(110, state_writer, put);

// keel_create_context
SAME(110, create_context, struct_size);
SAME(110, create_context, host);
SAME(110, create_context, options);
SAME(110, create_context, section);
SAME(110, create_context, seed);
SAME(110, create_context, rank);
SAME(110, create_context, world_size);
SAME(110, create_context, run_dir);
SAME(110, create_context, params);
SAME(110, create_context, param_names);
SAME(110, create_context, param_count);
SAME(110, create_context, total_steps);
SAME(110, create_context, param_group);
SAME(110, create_context, group_count);
SAME(110, create_context, group_lr);
SAME(110, create_context, group_weight_decay);
SAME(110, create_context, resume_step);
SAME(110, create_context, shards);
SAME(110, create_context, comm);
SAME(110, create_context, tables);
SAME(110, create_context, table_count);

// keel_shard_group
SAME(110, shard_group, struct_size);
SAME(110, shard_group, host_data);
SAME(110, shard_group, all_reduce);

// keel_comm
SAME(110, comm, struct_size);
SAME(110, comm, host_data);
SAME(110, comm, rank);
SAME(110, comm, world_size);
SAME(110, comm, all_to_all);
SAME(110, comm, all_gather);

// keel_sparse_rows
SAME(110, sparse_rows, struct_size);
SAME(110, sparse_rows, count);
SAME(110, sparse_rows, ids);
SAME(110, sparse_rows, values);
SAME(110, sparse_rows, grads);
SAME(110, sparse_rows, slots);
SAME(110, sparse_rows, slot_width);

// keel_table_stats
SAME(110, table_stats, struct_size);
SAME(110, table_stats, rows);
SAME(110, table_stats, admitted);
SAME(110, table_stats, evicted);
SAME(110, table_stats, pending);

// keel_sparse_table
SAME(110, sparse_table, struct_size);
SAME(110, sparse_table, self);
SAME(110, sparse_table, name);
SAME(110, sparse_table, dim);
SAME(110, sparse_table, reserve_slots);
SAME(110, sparse_table, touched);
SAME(110, sparse_table, end_step);
SAME(110, sparse_table, stats);
SAME(110, sparse_table, save);
SAME(110, sparse_table, load);

// keel_unit_calls
SAME(110, unit_calls, struct_size);
SAME(110, unit_calls, host_data);
SAME(110, unit_calls, enter);
SAME(110, unit_calls, leave);

// keel_model
SAME(110, model, struct_size);
SAME(110, model, self);
SAME(110, model, destroy);
SAME(110, model, forward);
SAME(110, model, set_training);
SAME(110, model, param_count);
SAME(110, model, param);
SAME(110, model, state_count);
SAME(110, model, state);
SAME(110, model, flops_per_sample);
SAME(110, model, state_save);
SAME(110, model, state_load);
SAME(110, model, forward_features);
SAME(110, model, export_state);
SAME(110, model, param_unit);
SAME(110, model, set_unit_calls);
SAME(110, model, table_count);
SAME(110, model, table);

// keel_batch
SAME(110, batch, inputs);
SAME(110, batch, targets);
SAME(110, batch, samples);
SAME(110, batch, tokens);

// keel_dataset
SAME(110, dataset, struct_size);
SAME(110, dataset, self);
SAME(110, dataset, destroy);
SAME(110, dataset, size);
SAME(110, dataset, batches_per_epoch);
SAME(110, dataset, start_epoch);
SAME(110, dataset, next);
SAME(110, dataset, seek);
SAME(110, dataset, state_save);
SAME(110, dataset, state_load);
SAME(110, dataset, tokens_per_sample);

// keel_optimizer
SAME(110, optimizer, struct_size);
SAME(110, optimizer, self);
SAME(110, optimizer, destroy);
SAME(110, optimizer, step);
SAME(110, optimizer, zero_grad);
SAME(110, optimizer, group_count);
SAME(110, optimizer, get_lr);
SAME(110, optimizer, set_lr);
SAME(110, optimizer, state_save);
SAME(110, optimizer, state_load);

// keel_sparse_optimizer
SAME(110, sparse_optimizer, struct_size);
SAME(110, sparse_optimizer, self);
SAME(110, sparse_optimizer, destroy);
SAME(110, sparse_optimizer, step);
SAME(110, sparse_optimizer, get_lr);
SAME(110, sparse_optimizer, set_lr);
SAME(110, sparse_optimizer, state_save);
SAME(110, sparse_optimizer, state_load);

// keel_lr_scheduler
SAME(110, lr_scheduler, struct_size);
SAME(110, lr_scheduler, self);
SAME(110, lr_scheduler, destroy);
SAME(110, lr_scheduler, factor);

// keel_metric_writer
SAME(110, metric_writer, struct_size);
SAME(110, metric_writer, host_data);
SAME(110, metric_writer, put);

// keel_loss
SAME(110, loss, struct_size);
SAME(110, loss, self);
SAME(110, loss, destroy);
SAME(110, loss, compute);
SAME(110, loss, count_items);
SAME(110, loss, compute_linear);
SAME(110, loss, metric_state_size);
SAME(110, loss, metric_update);
SAME(110, loss, metric_finish);

// keel_grad_clipper
SAME(110, grad_clipper, struct_size);
SAME(110, grad_clipper, self);
SAME(110, grad_clipper, destroy);
SAME(110, grad_clipper, clip);

// keel_mfu
SAME(110, mfu, struct_size);
SAME(110, mfu, self);
SAME(110, mfu, destroy);
SAME(110, mfu, compute);
SAME(110, mfu, peak_flops);

// keel_profiler
SAME(110, profiler, struct_size);
SAME(110, profiler, self);
SAME(110, profiler, destroy);
SAME(110, profiler, begin);
SAME(110, profiler, end);
SAME(110, profiler, flush);

// keel_checkpoint
SAME(110, checkpoint, struct_size);
SAME(110, checkpoint, self);
SAME(110, checkpoint, destroy);
SAME(110, checkpoint, save);
SAME(110, checkpoint, load);

// keel_metric
SAME(110, metric, key);
SAME(110, metric, value);

// keel_trainer_state
SAME(110, trainer_state, struct_size);
SAME(110, trainer_state, step);
SAME(110, trainer_state, epoch);
SAME(110, trainer_state, samples);
SAME(110, trainer_state, tokens);
SAME(110, trainer_state, max_steps);
SAME(110, trainer_state, epochs);
SAME(110, trainer_state, lr);
SAME(110, trainer_state, loss);
SAME(110, trainer_state, skipped_steps);
SAME(110, trainer_state, grad_norm);
SAME(110, trainer_state, train_metrics);
SAME(110, trainer_state, train_metric_count);
SAME(110, trainer_state, eval_metrics);
SAME(110, trainer_state, eval_metric_count);

// keel_event
SAME(110, event, struct_size);
SAME(110, event, kind);
SAME(110, event, state);
SAME(110, event, split);
SAME(110, event, metrics);
SAME(110, event, metric_count);
SAME(110, event, path);
SAME(110, event, requests);
SAME(110, event, micro_batch);
SAME(110, event, message);

// keel_hook
SAME(110, hook, struct_size);
SAME(110, hook, self);
SAME(110, hook, destroy);
SAME(110, hook, on_event);
SAME(110, hook, state_count);
SAME(110, hook, state);

// keel_component_desc
SAME(110, component_desc, kind);
SAME(110, component_desc, name);
SAME(110, component_desc, description);
SAME(110, component_desc, options);
SAME(110, component_desc, option_count);
SAME(110, component_desc, option_size);
SAME(110, component_desc, create);

// keel_build_fingerprint
SAME(110, build_fingerprint, torch_version);
SAME(110, build_fingerprint, compiler);
SAME(110, build_fingerprint, cxx11_abi);

// keel_plugin_descriptor
SAME(110, plugin_descriptor, abi_major);
SAME(110, plugin_descriptor, abi_minor);
SAME(110, plugin_descriptor, struct_size);
SAME(110, plugin_descriptor, name);
SAME(110, plugin_descriptor, version);
SAME(110, plugin_descriptor, description);
SAME(110, plugin_descriptor, fingerprint);
SAME(110, plugin_descriptor, components);
SAME(110, plugin_descriptor, component_count);
SAME(110, plugin_descriptor, component_size);

// Every field of ABI 1.11 keeps its offset and size, in every struct of that header (the list
// is test_abi_layout.c's fields, less get_extension, appended in 1.12).
// keel_error
SAME(111, error, message);
// keel_host
SAME(111, host, struct_size);
SAME(111, host, abi_major);
SAME(111, host, abi_minor);
SAME(111, host, torch_version);
SAME(111, host, tensor_dtype);
SAME(111, host, tensor_ndim);
SAME(111, host, tensor_size);
SAME(111, host, tensor_numel);
SAME(111, host, tensor_cpu_data);
SAME(111, host, tensor_contiguous_cpu);
SAME(111, host, tensor_from_buffer);
SAME(111, host, tensor_retain);
SAME(111, host, tensor_release);
SAME(111, host, option_bool);
SAME(111, host, option_int);
SAME(111, host, option_float);
SAME(111, host, option_string);
SAME(111, host, option_list_size);
SAME(111, host, option_list_int);
SAME(111, host, option_list_float);
SAME(111, host, log);
SAME(111, host, report_error);
SAME(111, host, stop_requested);
// keel_option_desc
SAME(111, option_desc, key);
SAME(111, option_desc, type);
SAME(111, option_desc, default_toml);
SAME(111, option_desc, help);
SAME(111, option_desc, min);
SAME(111, option_desc, max);
SAME(111, option_desc, choices);
// keel_named_tensor
SAME(111, named_tensor, name);
SAME(111, named_tensor, tensor);
// keel_state_writer
SAME(111, state_writer, struct_size);
SAME(111, state_writer, host_data);
SAME(111, state_writer, put);
// keel_create_context
SAME(111, create_context, struct_size);
SAME(111, create_context, host);
SAME(111, create_context, options);
SAME(111, create_context, section);
SAME(111, create_context, seed);
SAME(111, create_context, rank);
SAME(111, create_context, world_size);
SAME(111, create_context, run_dir);
SAME(111, create_context, params);
SAME(111, create_context, param_names);
SAME(111, create_context, param_count);
SAME(111, create_context, total_steps);
SAME(111, create_context, param_group);
SAME(111, create_context, group_count);
SAME(111, create_context, group_lr);
SAME(111, create_context, group_weight_decay);
SAME(111, create_context, resume_step);
SAME(111, create_context, shards);
SAME(111, create_context, comm);
SAME(111, create_context, tables);
SAME(111, create_context, table_count);
SAME(111, create_context, device);
// keel_shard_group
SAME(111, shard_group, struct_size);
SAME(111, shard_group, host_data);
SAME(111, shard_group, all_reduce);
// keel_comm
SAME(111, comm, struct_size);
SAME(111, comm, host_data);
SAME(111, comm, rank);
SAME(111, comm, world_size);
SAME(111, comm, all_to_all);
SAME(111, comm, all_gather);
// keel_sparse_rows
SAME(111, sparse_rows, struct_size);
SAME(111, sparse_rows, count);
SAME(111, sparse_rows, ids);
SAME(111, sparse_rows, values);
SAME(111, sparse_rows, grads);
SAME(111, sparse_rows, slots);
SAME(111, sparse_rows, slot_width);
SAME(111, sparse_rows, row_values);
SAME(111, sparse_rows, row_grads);
SAME(111, sparse_rows, row_slots);
// keel_table_stats
SAME(111, table_stats, struct_size);
SAME(111, table_stats, rows);
SAME(111, table_stats, admitted);
SAME(111, table_stats, evicted);
SAME(111, table_stats, pending);
// keel_sparse_table
SAME(111, sparse_table, struct_size);
SAME(111, sparse_table, self);
SAME(111, sparse_table, name);
SAME(111, sparse_table, dim);
SAME(111, sparse_table, reserve_slots);
SAME(111, sparse_table, touched);
SAME(111, sparse_table, end_step);
SAME(111, sparse_table, stats);
SAME(111, sparse_table, save);
SAME(111, sparse_table, load);
SAME(111, sparse_table, rows_as_tensors);
SAME(111, sparse_table, device);
// keel_unit_calls
SAME(111, unit_calls, struct_size);
SAME(111, unit_calls, host_data);
SAME(111, unit_calls, enter);
SAME(111, unit_calls, leave);
// keel_model
SAME(111, model, struct_size);
SAME(111, model, self);
SAME(111, model, destroy);
SAME(111, model, forward);
SAME(111, model, set_training);
SAME(111, model, param_count);
SAME(111, model, param);
SAME(111, model, state_count);
SAME(111, model, state);
SAME(111, model, flops_per_sample);
SAME(111, model, state_save);
SAME(111, model, state_load);
SAME(111, model, forward_features);
SAME(111, model, export_state);
SAME(111, model, param_unit);
SAME(111, model, set_unit_calls);
SAME(111, model, table_count);
SAME(111, model, table);
// keel_batch
SAME(111, batch, inputs);
SAME(111, batch, targets);
SAME(111, batch, samples);
SAME(111, batch, tokens);
// keel_dataset
SAME(111, dataset, struct_size);
SAME(111, dataset, self);
SAME(111, dataset, destroy);
SAME(111, dataset, size);
SAME(111, dataset, batches_per_epoch);
SAME(111, dataset, start_epoch);
SAME(111, dataset, next);
SAME(111, dataset, seek);
SAME(111, dataset, state_save);
SAME(111, dataset, state_load);
SAME(111, dataset, tokens_per_sample);
// keel_optimizer
SAME(111, optimizer, struct_size);
SAME(111, optimizer, self);
SAME(111, optimizer, destroy);
SAME(111, optimizer, step);
SAME(111, optimizer, zero_grad);
SAME(111, optimizer, group_count);
SAME(111, optimizer, get_lr);
SAME(111, optimizer, set_lr);
SAME(111, optimizer, state_save);
SAME(111, optimizer, state_load);
// keel_sparse_optimizer
SAME(111, sparse_optimizer, struct_size);
SAME(111, sparse_optimizer, self);
SAME(111, sparse_optimizer, destroy);
SAME(111, sparse_optimizer, step);
SAME(111, sparse_optimizer, get_lr);
SAME(111, sparse_optimizer, set_lr);
SAME(111, sparse_optimizer, state_save);
SAME(111, sparse_optimizer, state_load);
// keel_lr_scheduler
SAME(111, lr_scheduler, struct_size);
SAME(111, lr_scheduler, self);
SAME(111, lr_scheduler, destroy);
SAME(111, lr_scheduler, factor);
// keel_metric_writer
SAME(111, metric_writer, struct_size);
SAME(111, metric_writer, host_data);
SAME(111, metric_writer, put);
// keel_loss
SAME(111, loss, struct_size);
SAME(111, loss, self);
SAME(111, loss, destroy);
SAME(111, loss, compute);
SAME(111, loss, count_items);
SAME(111, loss, compute_linear);
SAME(111, loss, metric_state_size);
SAME(111, loss, metric_update);
SAME(111, loss, metric_finish);
// keel_grad_clipper
SAME(111, grad_clipper, struct_size);
SAME(111, grad_clipper, self);
SAME(111, grad_clipper, destroy);
SAME(111, grad_clipper, clip);
// keel_mfu
SAME(111, mfu, struct_size);
SAME(111, mfu, self);
SAME(111, mfu, destroy);
SAME(111, mfu, compute);
SAME(111, mfu, peak_flops);
// keel_profiler
SAME(111, profiler, struct_size);
SAME(111, profiler, self);
SAME(111, profiler, destroy);
SAME(111, profiler, begin);
SAME(111, profiler, end);
SAME(111, profiler, flush);
// keel_checkpoint
SAME(111, checkpoint, struct_size);
SAME(111, checkpoint, self);
SAME(111, checkpoint, destroy);
SAME(111, checkpoint, save);
SAME(111, checkpoint, load);
// keel_metric
SAME(111, metric, key);
SAME(111, metric, value);
// keel_trainer_state
SAME(111, trainer_state, struct_size);
SAME(111, trainer_state, step);
SAME(111, trainer_state, epoch);
SAME(111, trainer_state, samples);
SAME(111, trainer_state, tokens);
SAME(111, trainer_state, max_steps);
SAME(111, trainer_state, epochs);
SAME(111, trainer_state, lr);
SAME(111, trainer_state, loss);
SAME(111, trainer_state, skipped_steps);
SAME(111, trainer_state, grad_norm);
SAME(111, trainer_state, train_metrics);
SAME(111, trainer_state, train_metric_count);
SAME(111, trainer_state, eval_metrics);
SAME(111, trainer_state, eval_metric_count);
// keel_event
SAME(111, event, struct_size);
SAME(111, event, kind);
SAME(111, event, state);
SAME(111, event, split);
SAME(111, event, metrics);
SAME(111, event, metric_count);
SAME(111, event, path);
SAME(111, event, requests);
SAME(111, event, micro_batch);
SAME(111, event, message);
// keel_hook
SAME(111, hook, struct_size);
SAME(111, hook, self);
SAME(111, hook, destroy);
SAME(111, hook, on_event);
SAME(111, hook, state_count);
SAME(111, hook, state);
// keel_component_desc
SAME(111, component_desc, kind);
SAME(111, component_desc, name);
SAME(111, component_desc, description);
SAME(111, component_desc, options);
SAME(111, component_desc, option_count);
SAME(111, component_desc, option_size);
SAME(111, component_desc, create);
// keel_build_fingerprint
SAME(111, build_fingerprint, torch_version);
SAME(111, build_fingerprint, compiler);
SAME(111, build_fingerprint, cxx11_abi);
// keel_plugin_descriptor
SAME(111, plugin_descriptor, abi_major);
SAME(111, plugin_descriptor, abi_minor);
SAME(111, plugin_descriptor, struct_size);
SAME(111, plugin_descriptor, name);
SAME(111, plugin_descriptor, version);
SAME(111, plugin_descriptor, description);
SAME(111, plugin_descriptor, fingerprint);
SAME(111, plugin_descriptor, components);
SAME(111, plugin_descriptor, component_count);
SAME(111, plugin_descriptor, component_size);

// Every field of ABI 1.12 (the minor before the current one) keeps its offset and size, in
// every struct of that header (test_abi_layout.c's fields of those structs, get_extension
// included; 1.13 added an enumerator and <keel/step.h>, no field).
// keel_error
SAME(112, error, message);
// keel_host
SAME(112, host, struct_size);
SAME(112, host, abi_major);
SAME(112, host, abi_minor);
SAME(112, host, torch_version);
SAME(112, host, tensor_dtype);
SAME(112, host, tensor_ndim);
SAME(112, host, tensor_size);
SAME(112, host, tensor_numel);
SAME(112, host, tensor_cpu_data);
SAME(112, host, tensor_contiguous_cpu);
SAME(112, host, tensor_from_buffer);
SAME(112, host, tensor_retain);
SAME(112, host, tensor_release);
SAME(112, host, option_bool);
SAME(112, host, option_int);
SAME(112, host, option_float);
SAME(112, host, option_string);
SAME(112, host, option_list_size);
SAME(112, host, option_list_int);
SAME(112, host, option_list_float);
SAME(112, host, log);
SAME(112, host, report_error);
SAME(112, host, stop_requested);
// keel_option_desc
SAME(112, option_desc, key);
SAME(112, option_desc, type);
SAME(112, option_desc, default_toml);
SAME(112, option_desc, help);
SAME(112, option_desc, min);
SAME(112, option_desc, max);
SAME(112, option_desc, choices);
// keel_named_tensor
SAME(112, named_tensor, name);
SAME(112, named_tensor, tensor);
// keel_state_writer
SAME(112, state_writer, struct_size);
SAME(112, state_writer, host_data);
SAME(112, state_writer, put);
// keel_create_context
SAME(112, create_context, struct_size);
SAME(112, create_context, host);
SAME(112, create_context, options);
SAME(112, create_context, section);
SAME(112, create_context, seed);
SAME(112, create_context, rank);
SAME(112, create_context, world_size);
SAME(112, create_context, run_dir);
SAME(112, create_context, params);
SAME(112, create_context, param_names);
SAME(112, create_context, param_count);
SAME(112, create_context, total_steps);
SAME(112, create_context, param_group);
SAME(112, create_context, group_count);
SAME(112, create_context, group_lr);
SAME(112, create_context, group_weight_decay);
SAME(112, create_context, resume_step);
SAME(112, create_context, shards);
SAME(112, create_context, comm);
SAME(112, create_context, tables);
SAME(112, create_context, table_count);
SAME(112, create_context, device);
// keel_shard_group
SAME(112, shard_group, struct_size);
SAME(112, shard_group, host_data);
SAME(112, shard_group, all_reduce);
// keel_comm
SAME(112, comm, struct_size);
SAME(112, comm, host_data);
SAME(112, comm, rank);
SAME(112, comm, world_size);
SAME(112, comm, all_to_all);
SAME(112, comm, all_gather);
// keel_sparse_rows
SAME(112, sparse_rows, struct_size);
SAME(112, sparse_rows, count);
SAME(112, sparse_rows, ids);
SAME(112, sparse_rows, values);
SAME(112, sparse_rows, grads);
SAME(112, sparse_rows, slots);
SAME(112, sparse_rows, slot_width);
SAME(112, sparse_rows, row_values);
SAME(112, sparse_rows, row_grads);
SAME(112, sparse_rows, row_slots);
// keel_table_stats
SAME(112, table_stats, struct_size);
SAME(112, table_stats, rows);
SAME(112, table_stats, admitted);
SAME(112, table_stats, evicted);
SAME(112, table_stats, pending);
// keel_sparse_table
SAME(112, sparse_table, struct_size);
SAME(112, sparse_table, self);
SAME(112, sparse_table, name);
SAME(112, sparse_table, dim);
SAME(112, sparse_table, reserve_slots);
SAME(112, sparse_table, touched);
SAME(112, sparse_table, end_step);
SAME(112, sparse_table, stats);
SAME(112, sparse_table, save);
SAME(112, sparse_table, load);
SAME(112, sparse_table, rows_as_tensors);
SAME(112, sparse_table, device);
// keel_unit_calls
SAME(112, unit_calls, struct_size);
SAME(112, unit_calls, host_data);
SAME(112, unit_calls, enter);
SAME(112, unit_calls, leave);
// keel_model
SAME(112, model, struct_size);
SAME(112, model, self);
SAME(112, model, destroy);
SAME(112, model, forward);
SAME(112, model, set_training);
SAME(112, model, param_count);
SAME(112, model, param);
SAME(112, model, state_count);
SAME(112, model, state);
SAME(112, model, flops_per_sample);
SAME(112, model, state_save);
SAME(112, model, state_load);
SAME(112, model, forward_features);
SAME(112, model, export_state);
SAME(112, model, param_unit);
SAME(112, model, set_unit_calls);
SAME(112, model, table_count);
SAME(112, model, table);
SAME(112, model, get_extension);
// keel_batch
SAME(112, batch, inputs);
SAME(112, batch, targets);
SAME(112, batch, samples);
SAME(112, batch, tokens);
// keel_dataset
SAME(112, dataset, struct_size);
SAME(112, dataset, self);
SAME(112, dataset, destroy);
SAME(112, dataset, size);
SAME(112, dataset, batches_per_epoch);
SAME(112, dataset, start_epoch);
SAME(112, dataset, next);
SAME(112, dataset, seek);
SAME(112, dataset, state_save);
SAME(112, dataset, state_load);
SAME(112, dataset, tokens_per_sample);
SAME(112, dataset, get_extension);
// keel_optimizer
SAME(112, optimizer, struct_size);
SAME(112, optimizer, self);
SAME(112, optimizer, destroy);
SAME(112, optimizer, step);
SAME(112, optimizer, zero_grad);
SAME(112, optimizer, group_count);
SAME(112, optimizer, get_lr);
SAME(112, optimizer, set_lr);
SAME(112, optimizer, state_save);
SAME(112, optimizer, state_load);
SAME(112, optimizer, get_extension);
// keel_sparse_optimizer
SAME(112, sparse_optimizer, struct_size);
SAME(112, sparse_optimizer, self);
SAME(112, sparse_optimizer, destroy);
SAME(112, sparse_optimizer, step);
SAME(112, sparse_optimizer, get_lr);
SAME(112, sparse_optimizer, set_lr);
SAME(112, sparse_optimizer, state_save);
SAME(112, sparse_optimizer, state_load);
SAME(112, sparse_optimizer, get_extension);
// keel_lr_scheduler
SAME(112, lr_scheduler, struct_size);
SAME(112, lr_scheduler, self);
SAME(112, lr_scheduler, destroy);
SAME(112, lr_scheduler, factor);
SAME(112, lr_scheduler, get_extension);
// keel_metric_writer
SAME(112, metric_writer, struct_size);
SAME(112, metric_writer, host_data);
SAME(112, metric_writer, put);
// keel_loss
SAME(112, loss, struct_size);
SAME(112, loss, self);
SAME(112, loss, destroy);
SAME(112, loss, compute);
SAME(112, loss, count_items);
SAME(112, loss, compute_linear);
SAME(112, loss, metric_state_size);
SAME(112, loss, metric_update);
SAME(112, loss, metric_finish);
SAME(112, loss, get_extension);
// keel_grad_clipper
SAME(112, grad_clipper, struct_size);
SAME(112, grad_clipper, self);
SAME(112, grad_clipper, destroy);
SAME(112, grad_clipper, clip);
SAME(112, grad_clipper, get_extension);
// keel_mfu
SAME(112, mfu, struct_size);
SAME(112, mfu, self);
SAME(112, mfu, destroy);
SAME(112, mfu, compute);
SAME(112, mfu, peak_flops);
SAME(112, mfu, get_extension);
// keel_profiler
SAME(112, profiler, struct_size);
SAME(112, profiler, self);
SAME(112, profiler, destroy);
SAME(112, profiler, begin);
SAME(112, profiler, end);
SAME(112, profiler, flush);
SAME(112, profiler, get_extension);
// keel_checkpoint
SAME(112, checkpoint, struct_size);
SAME(112, checkpoint, self);
SAME(112, checkpoint, destroy);
SAME(112, checkpoint, save);
SAME(112, checkpoint, load);
SAME(112, checkpoint, get_extension);
// keel_metric
SAME(112, metric, key);
SAME(112, metric, value);
// keel_trainer_state
SAME(112, trainer_state, struct_size);
SAME(112, trainer_state, step);
SAME(112, trainer_state, epoch);
SAME(112, trainer_state, samples);
SAME(112, trainer_state, tokens);
SAME(112, trainer_state, max_steps);
SAME(112, trainer_state, epochs);
SAME(112, trainer_state, lr);
SAME(112, trainer_state, loss);
SAME(112, trainer_state, skipped_steps);
SAME(112, trainer_state, grad_norm);
SAME(112, trainer_state, train_metrics);
SAME(112, trainer_state, train_metric_count);
SAME(112, trainer_state, eval_metrics);
SAME(112, trainer_state, eval_metric_count);
// keel_event
SAME(112, event, struct_size);
SAME(112, event, kind);
SAME(112, event, state);
SAME(112, event, split);
SAME(112, event, metrics);
SAME(112, event, metric_count);
SAME(112, event, path);
SAME(112, event, requests);
SAME(112, event, micro_batch);
SAME(112, event, message);
// keel_hook
SAME(112, hook, struct_size);
SAME(112, hook, self);
SAME(112, hook, destroy);
SAME(112, hook, on_event);
SAME(112, hook, state_count);
SAME(112, hook, state);
SAME(112, hook, get_extension);
// keel_component_desc
SAME(112, component_desc, kind);
SAME(112, component_desc, name);
SAME(112, component_desc, description);
SAME(112, component_desc, options);
SAME(112, component_desc, option_count);
SAME(112, component_desc, option_size);
SAME(112, component_desc, create);
// keel_build_fingerprint
SAME(112, build_fingerprint, torch_version);
SAME(112, build_fingerprint, compiler);
SAME(112, build_fingerprint, cxx11_abi);
// keel_plugin_descriptor
SAME(112, plugin_descriptor, abi_major);
SAME(112, plugin_descriptor, abi_minor);
SAME(112, plugin_descriptor, struct_size);
SAME(112, plugin_descriptor, name);
SAME(112, plugin_descriptor, version);
SAME(112, plugin_descriptor, description);
SAME(112, plugin_descriptor, fingerprint);
SAME(112, plugin_descriptor, components);
SAME(112, plugin_descriptor, component_count);
SAME(112, plugin_descriptor, component_size);

// The slots the kernel requires of every instance (components.hpp: a smaller struct_size or a
// NULL slot among them refuses the instance) are exactly the 1.0 struct: a 1.0 plugin is never
// refused for lacking a slot that came later.
#define REQUIRED(T)                                                                          \
  static_assert(keel::required_size<keel_##T>() == sizeof(keel10_##T),                       \
                "required_size<keel_" #T ">() differs from sizeof(keel_" #T ") in ABI 1.0")
REQUIRED(model);
REQUIRED(dataset);
REQUIRED(optimizer);
REQUIRED(lr_scheduler);
REQUIRED(loss);
REQUIRED(grad_clipper);
REQUIRED(mfu);
REQUIRED(profiler);
REQUIRED(checkpoint);
REQUIRED(hook);
// keel_sparse_optimizer (1.9): the slots before state_save (optional, both or neither).
static_assert(keel::required_size<keel_sparse_optimizer>() ==
                  offsetof(keel_sparse_optimizer, state_save),
              "required_size<keel_sparse_optimizer>() asks for more than step, get_lr, set_lr");
static_assert(KEEL_KIND_SPARSE_OPTIMIZER == KEEL18_KIND_HOOK + 1,
              "KEEL_KIND_SPARSE_OPTIMIZER (1.9) follows the kinds of ABI 1.8");
static_assert(KEEL_KIND_STEP == KEEL112_KIND_SPARSE_OPTIMIZER + 1,
              "KEEL_KIND_STEP (1.13) follows the kinds of ABI 1.12");
// keel_step (1.13): compute is required, get_extension optional.
static_assert(keel::required_size<keel_step>() == offsetof(keel_step, get_extension),
              "required_size<keel_step>() asks for more than compute");

int main() { return 0; }
