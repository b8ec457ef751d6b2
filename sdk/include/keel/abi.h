/*
 * keel plugin ABI, version 1.
 *
 * This header is the whole contract between the keel kernel and a plugin. It is plain C99
 * (it compiles with -std=c99 -pedantic) so that a plugin may be written in any language that
 * can export a C symbol. C++ plugins normally use <keel/plugin.hpp>, which builds these
 * structs for them and catches every exception before it could cross the boundary.
 *
 * What the ABI promises across versions (which plugins a kernel loads, what a minor version may
 * add and what needs a new major, how structs with and without a struct_size are versioned, how
 * strings are bounded) is stated once, in docs/abi.md of keel's source tree. In short: a
 * minor version only appends, and a plugin built against an older minor of the same major keeps
 * loading and working.
 *
 * Rules that hold for everything below:
 *  - A plugin exports exactly one symbol, `keel_plugin_entry` (KEEL_ENTRY_SYMBOL), returning a
 *    pointer to a constant keel_plugin_descriptor that lives as long as the library.
 *  - Every struct that may grow starts with (or carries) a `struct_size`; a reader never
 *    touches a field that lies beyond the size the writer declared (see KEEL_HAS_FIELD).
 *  - Strings a plugin hands the kernel are read with a bound (KEEL_NAME_CAPACITY,
 *    KEEL_ERROR_CAPACITY, KEEL_STRING_CAPACITY below), never past it.
 *  - No exception, no C++ type and no ownership crosses the boundary implicitly. A function
 *    that can fail returns keel_status and, on KEEL_ERR, writes a NUL-terminated message into
 *    the caller's keel_error. The kernel reports it prefixed with the plugin and component.
 *  - Objects a plugin creates are destroyed by that plugin (the `destroy` slot). Tensor handles
 *    are reference counted by the host (see "Tensors").
 *  - Threading: unless a tag says otherwise, the kernel calls every slot of one instance from
 *    one thread (the training thread) and never concurrently. Tags used below:
 *      [load]   called while the library is being loaded, before any run exists;
 *      [setup]  called while the run is being assembled, before step 1;
 *      [train]  called from the training thread during the run;
 *      [any]    may be called from any thread (host functions only; they are thread safe).
 */
#ifndef KEEL_ABI_H
#define KEEL_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_ABI_MAJOR 1
#define KEEL_ABI_MINOR 13

/* The one exported symbol. Its type is keel_plugin_entry_fn. */
#define KEEL_ENTRY_SYMBOL "keel_plugin_entry"

#if defined(_WIN32)
#define KEEL_EXPORT __declspec(dllexport)
#else
#define KEEL_EXPORT __attribute__((visibility("default")))
#endif

/* True when `ptr`, a struct of type `type` that declares its own struct_size, holds `field`.
 * Fields marked "(1.1)" to "(1.13)" below were appended in that minor version: check them with
 * this macro (and for NULL) before use, since an older plugin or kernel does not have them. */
#define KEEL_HAS_FIELD(ptr, type, field) \
  ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* ------------------------------------------------------------------------------------------
 * Status and errors
 * ---------------------------------------------------------------------------------------- */

typedef enum keel_status { KEEL_OK = 0, KEEL_ERR = 1 } keel_status;

#define KEEL_ERROR_CAPACITY 1024
/* Longest name (with its NUL) the kernel reads from a plugin: plugin, component, option key,
 * parameter and state entry names. */
#define KEEL_NAME_CAPACITY 256
/* Longest other string (with its NUL) the kernel reads from a plugin. */
#define KEEL_STRING_CAPACITY 4096

/* Caller-owned buffer for one error message. The caller zeroes `message[0]` before a call;
 * the callee writes at most KEEL_ERROR_CAPACITY bytes, NUL-terminated, and only on KEEL_ERR.
 * The kernel reads at most KEEL_ERROR_CAPACITY - 1 bytes (it terminates the buffer itself), and
 * reports a KEEL_ERR with an empty message as "failed without a message". */
typedef struct keel_error {
  char message[KEEL_ERROR_CAPACITY];
} keel_error;

/* ------------------------------------------------------------------------------------------
 * Tensors
 *
 * keel_tensor is an opaque, reference-counted handle owned by the host. Two kinds of handle
 * appear in signatures:
 *  - borrowed: valid for the duration of the call (arguments), or, for handles a plugin
 *    reports about its own tensors (keel_model.param/state), as long as the instance lives.
 *    Do not release a borrowed handle.
 *  - new reference: returned through a `keel_tensor**` out parameter documented as "new"; the
 *    receiver owns it and must give it back with keel_host.tensor_release (or hand it on).
 * Plain C plugins read and create tensors through the host functions. C++ plugins whose build
 * fingerprint matches the kernel's LibTorch may convert handles to at::Tensor directly
 * (keel::borrow / keel::give in <keel/plugin.hpp>).
 * ---------------------------------------------------------------------------------------- */

typedef struct keel_tensor keel_tensor;

typedef enum keel_dtype {
  KEEL_DTYPE_UNKNOWN = 0,
  KEEL_DTYPE_F32 = 1,
  KEEL_DTYPE_F64 = 2,
  KEEL_DTYPE_F16 = 3,
  KEEL_DTYPE_BF16 = 4,
  KEEL_DTYPE_I64 = 5,
  KEEL_DTYPE_I32 = 6,
  KEEL_DTYPE_U8 = 7,
  KEEL_DTYPE_I8 = 8,
  KEEL_DTYPE_BOOL = 9
} keel_dtype;

/* Opaque, host-owned view of one component's validated options. */
typedef struct keel_options keel_options;

/* Log levels for keel_host.log. */
typedef enum keel_log_level {
  KEEL_LOG_DEBUG = 0,
  KEEL_LOG_INFO = 1,
  KEEL_LOG_WARN = 2,
  KEEL_LOG_ERROR = 3
} keel_log_level;

/* Services the kernel offers to plugins. One instance lives for the whole process; every
 * function is thread safe. [any] */
typedef struct keel_host {
  uint32_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  /* LibTorch version the kernel was built with, e.g. "1.13.0". */
  const char* torch_version;

  /* Element type of `t`. */
  keel_dtype (*tensor_dtype)(const keel_tensor* t);
  /* Number of dimensions of `t`. */
  int32_t (*tensor_ndim)(const keel_tensor* t);
  /* Extent of dimension `dim` (0 <= dim < ndim), or -1 when out of range. */
  int64_t (*tensor_size)(const keel_tensor* t, int32_t dim);
  /* Number of elements. */
  int64_t (*tensor_numel)(const keel_tensor* t);
  /* Pointer to the elements when `t` lives on the CPU and is contiguous, else NULL. The data
   * stays valid while the handle is held. Use tensor_contiguous_cpu to get such a tensor.
   * With [run] device = "cuda" the model's parameters, batches and outputs live on the GPU:
   * this returns NULL for them, and tensor_contiguous_cpu copies them to the CPU. */
  void* (*tensor_cpu_data)(const keel_tensor* t);
  /* New reference to a contiguous CPU tensor with the values of `t` (t itself if it already
   * is one). */
  keel_tensor* (*tensor_contiguous_cpu)(const keel_tensor* t);
  /* New reference to a fresh CPU tensor of `dtype` and `shape` (ndim entries) holding a copy
   * of `data` (numel * element size bytes, may be NULL for zeros). NULL on bad arguments. */
  keel_tensor* (*tensor_from_buffer)(keel_dtype dtype, const int64_t* shape, int32_t ndim,
                                     const void* data);
  /* Adds a reference: returns `t` as a new reference. */
  keel_tensor* (*tensor_retain)(keel_tensor* t);
  /* Drops one reference. NULL is ignored. */
  void (*tensor_release)(keel_tensor* t);

  /* Option accessors. Options were validated against the component's schema before the
   * factory runs, and every declared key has a value (its default when the manifest left it
   * out), so these fail only on a key the schema does not declare, a type mismatch or a
   * list index out of range (return 0; option_string returns NULL and option_list_size -1).
   * Strings are valid until the factory returns: copy what you keep. [setup] */
  int (*option_bool)(const keel_options* o, const char* key, int* out);
  int (*option_int)(const keel_options* o, const char* key, int64_t* out);
  int (*option_float)(const keel_options* o, const char* key, double* out);
  const char* (*option_string)(const keel_options* o, const char* key);
  /* Lists: size, then elements. An INT_LIST element can be read with option_list_float too. */
  int64_t (*option_list_size)(const keel_options* o, const char* key);
  int (*option_list_int)(const keel_options* o, const char* key, int64_t index, int64_t* out);
  int (*option_list_float)(const keel_options* o, const char* key, int64_t index, double* out);

  /* Writes one line to the run's log, prefixed with "[origin] " (normally the component's
   * section; under keel, a hook's section is shown as its label, else its type, when no other
   * hook of the run has that label); NULL reads as "plugin".
   * (1.6) An empty `origin` writes the line without a prefix (a sink whose lines are the run's
   * own output). */
  void (*log)(keel_log_level level, const char* origin, const char* message);

  /* (1.2) Reports that the slot now running failed, for slots that have no keel_error (e.g.
   * set_training, zero_grad, set_lr, profiler marks, and slots returning a value). The kernel
   * ends the run with `message` once the slot returns, naming the component; the slot should
   * return at once (any value). Only the first report per slot call counts. Call it only
   * from inside a slot, on the thread that called the slot. `message` is read up to
   * KEEL_ERROR_CAPACITY - 1 bytes. [train|setup] */
  void (*report_error)(const char* message);

  /* (1.10) Nonzero once the run has been asked to stop by a signal (the first SIGTERM or SIGINT
   * that `keel train` received during its loop; the kernel's signal handler sets a flag that
   * this reads), else 0; it stays nonzero until that run ends, and is 0 outside a training
   * run (keel evaluate, keel export). One atomic load: cheap, and async-signal-safe. A slot that
   * waits for something that may never come (a dataset's next waiting for data to arrive) polls
   * it, every 10 to 100 ms, and gives up when it turns nonzero (see KEEL_BATCH_STOPPED); a slot
   * that does not wait needs no check, since the kernel stops after the current step. [any] */
  int (*stop_requested)(void);
} keel_host;

/* ------------------------------------------------------------------------------------------
 * Option schema: what a component accepts in its manifest table.
 * ---------------------------------------------------------------------------------------- */

typedef enum keel_option_type {
  KEEL_OPT_BOOL = 1,
  KEEL_OPT_INT = 2,
  KEEL_OPT_FLOAT = 3, /* an integer literal is accepted too */
  KEEL_OPT_STRING = 4,
  KEEL_OPT_INT_LIST = 5,
  KEEL_OPT_FLOAT_LIST = 6,
  /* (1.2) A filesystem path, read with option_string. The kernel makes a relative path
   * absolute before the factory runs: relative to the directory of the manifest file that sets
   * it, or to the working directory when it comes from --set or the default. */
  KEEL_OPT_PATH = 7
} keel_option_type;

typedef struct keel_option_desc {
  const char* key;
  keel_option_type type;
  /* Default as a TOML value ("0.9", "true", "\"relu\"", "[256, 128]"); NULL = required. */
  const char* default_toml;
  const char* help;
  /* Inclusive bounds for INT/FLOAT values and list elements; ignored when min > max. */
  double min;
  double max;
  /* STRING only: allowed values separated by '|' ("mean|sum"), or NULL for any string. */
  const char* choices;
} keel_option_desc;

/* ------------------------------------------------------------------------------------------
 * (1.3) Component state for exact resume
 *
 * A component that keeps state a checkpoint must hold beyond its tensors the kernel already
 * knows (an optimizer's moments, a generator a model or dataset draws from) offers a pair of
 * optional slots, `state_save` and `state_load`, with these contracts:
 *
 *   keel_status (*state_save)(void* self, keel_state_writer* out, keel_error* err);
 *     Called on the training thread at a step boundary when a checkpoint is saved. Hands every
 *     state entry to out->put, once per name. The host takes its own reference to each tensor
 *     (and copies it when the save is asynchronous), so the plugin may change its state after
 *     the slot returns. [train]
 *   keel_status (*state_load)(void* self, const keel_named_tensor* state, size_t count,
 *                             keel_error* err);
 *     Called once while a run resumes ([setup], before step 1 of the resumed run), with exactly
 *     the entries state_save put (same names, dtypes and shapes; CPU tensors, borrowed for the
 *     call). The plugin copies what it needs; an entry it cannot use is an error naming it.
 *
 * A component without them resumes with whatever its constructor set up; for an optimizer that
 * is refused (keel train --resume fails naming the plugin) rather than training on silently
 * with fresh moments.
 * ---------------------------------------------------------------------------------------- */

/* A name and a borrowed tensor (state entries, checkpoint objects). */
typedef struct keel_named_tensor {
  const char* name;
  keel_tensor* tensor; /* borrowed */
} keel_named_tensor;

/* Collects state entries for a checkpoint; built by the host for one state_save call. */
typedef struct keel_state_writer {
  uint32_t struct_size;
  void* host_data; /* the host's; do not touch */
  /* Adds `tensor` (borrowed for the call; any dtype, any device) under `name` (copied; non-empty,
   * at most KEEL_NAME_CAPACITY - 1 bytes, unique within this call). Returns 1, or 0 when the
   * entry is refused (the kernel then fails the save, or the export, naming the entry and the
   * reason); return KEEL_ERR from state_save (export_state) after a 0 (any message). [train]
   * ([setup] in keel_model.export_state) */
  int (*put)(struct keel_state_writer* writer, const char* name, keel_tensor* tensor);
} keel_state_writer;


/* ------------------------------------------------------------------------------------------
 * Components
 * ---------------------------------------------------------------------------------------- */

typedef enum keel_kind {
  KEEL_KIND_MODEL = 1,
  KEEL_KIND_DATASET = 2,
  KEEL_KIND_OPTIMIZER = 3,
  KEEL_KIND_LR_SCHEDULER = 4,
  KEEL_KIND_LOSS = 5,
  KEEL_KIND_GRAD_CLIPPER = 6,
  KEEL_KIND_MFU = 7,
  KEEL_KIND_PROFILER = 8,
  KEEL_KIND_CHECKPOINT = 9,
  /* Hooks observe the loop; metric sinks are hooks that act on KEEL_EVENT_METRICS. */
  KEEL_KIND_HOOK = 10,
  /* (1.9) Updates the rows of a model's sparse embedding tables ([sparse_optimizer]). */
  KEEL_KIND_SPARSE_OPTIMIZER = 11,
  /* (1.13) Computes each training micro-batch's loss from the run's models ([step]); its
   * instance struct, keel_step, is in <keel/step.h>. */
  KEEL_KIND_STEP = 12
} keel_kind;

/* ------------------------------------------------------------------------------------------
 * (1.7) Sharded parameters
 *
 * With [distributed] shard = "optimizer", "gradients" or "parameters" and several ranks, the
 * optimizer and the gradient clipper get shards instead of whole parameters: params[i] is this
 * rank's rows of parameter i split on dim 0 into chunks of ceil(rows / world_size) rows (rank r
 * holds rows [r * chunk, min((r + 1) * chunk, rows)): the last ranks may hold fewer rows, or
 * none, as a tensor with 0 rows; a 0-dim parameter is held by rank 0, the others get an empty
 * tensor of shape [0]), under the parameter's own name, group and options. Its gradient holds
 * the same rows of the whole gradient (averaged over the ranks, as without shards). An update
 * that works element by element (SGD, Adam, AdamW) needs nothing more; a value computed over
 * whole parameters (a gradient norm, a per-tensor trust ratio) is combined over the ranks with
 * keel_shard_group.all_reduce.
 * ---------------------------------------------------------------------------------------- */

typedef enum keel_reduce_op { KEEL_REDUCE_SUM = 1, KEEL_REDUCE_MAX = 2 } keel_reduce_op;

/* The ranks that hold the shards; the host's, valid for the instance's life. */
typedef struct keel_shard_group {
  uint32_t struct_size;
  void* host_data; /* the host's; do not touch */
  /* Replaces each of values[0 .. count) by its sum (or maximum) over the ranks, the same on
   * every rank. A collective: every rank calls it the same number of times, in the same order,
   * with the same count and op, and only from inside the optimizer's step or the clipper's
   * clip (which the kernel calls on every rank at once). Returns KEEL_ERR with `err` filled when
   * the ranks cannot agree (a rank failed or did not arrive within [distributed] timeout_s);
   * the slot then returns KEEL_ERR too. [train] */
  keel_status (*all_reduce)(const struct keel_shard_group* group, double* values, size_t count,
                            keel_reduce_op op, keel_error* err);
} keel_shard_group;

/* ------------------------------------------------------------------------------------------
 * (1.9) Collectives for components
 *
 * Components that exchange data between the ranks of a data-parallel run themselves (a model
 * whose embedding tables are sharded over the ranks, a loss whose evaluation metric needs every
 * rank's predictions) get the run's ranks as a keel_comm. With one process, world_size is 1 and
 * each call copies `send` to its result.
 *
 * Every call is a collective: every rank calls it the same number of times, in the same order,
 * and only from a slot that the kernel calls on every rank at once: keel_model.forward and
 * forward_features (and the backward of their outputs, which runs inside the kernel's backward
 * on the training thread), keel_loss.metric_update and metric_finish, and keel_sparse_optimizer
 * .step. In an evaluation, forward and metric_update run once per batch of each rank's test
 * split, so a component that calls from them there needs test data that yields as many batches
 * on every rank (metric_finish runs once on every rank). Tensors are contiguous CPU tensors of any dtype with at least one dimension; rows are
 * the entries of dimension 0. A call returns KEEL_ERR with `err` filled on bad arguments or when
 * the ranks cannot agree (a rank failed, or did not arrive within [distributed] timeout_s); the
 * slot calling it then returns KEEL_ERR too.
 * ---------------------------------------------------------------------------------------- */

/* The run's ranks; the host's, valid for the instance's life. */
typedef struct keel_comm {
  uint32_t struct_size;
  void* host_data; /* the host's; do not touch */
  int32_t rank;
  int32_t world_size;
  /* Sends the first send_rows[0] rows of `send` (borrowed) to rank 0, the next send_rows[1]
   * rows to rank 1, and so on (world_size counts, summing to send's rows); *recv (new) receives
   * the rows every rank sent this one, in rank order, with send's dtype and trailing shape, and
   * recv_rows[r] (world_size entries, written) how many came from rank r. The ranks exchange the
   * counts first, so a rank need not know what it will receive. [train] */
  keel_status (*all_to_all)(const struct keel_comm* comm, keel_tensor* send,
                            const int64_t* send_rows, keel_tensor** recv, int64_t* recv_rows,
                            keel_error* err);
  /* Every rank's `send` (borrowed; the same dtype and trailing shape on every rank, any number of
   * rows) concatenated along dimension 0 in rank order into *recv (new); rows[r] (world_size
   * entries, written) is rank r's number of rows. [train] */
  keel_status (*all_gather)(const struct keel_comm* comm, keel_tensor* send, keel_tensor** recv,
                            int64_t* rows, keel_error* err);
} keel_comm;

/* ------------------------------------------------------------------------------------------
 * (1.9) Sparse embedding tables
 *
 * A model whose embeddings are hash tables (int64 ids mapped to rows of `dim` floats, rows
 * created as ids arrive and evicted when unused, as in click-through-rate models) keeps them
 * outside its dense parameters and shows each to the kernel as a keel_sparse_table
 * (keel_model.table_count / table). The kernel hands the tables to the [sparse_optimizer],
 * checks and records their gradients, tells them when a step ends, and saves and loads their
 * rows with every checkpoint. The model owns the tables; the SDK's keel::EmbeddingTable
 * (<keel/embedding.hpp>) implements this struct.
 *
 * A step, as the kernel runs it: the model's forward (in training) looks up ids and records
 * which rows it used; the backward of its outputs leaves each row's gradient with the table (a
 * table sharded over the ranks sends it to the rank that owns the row); gradients of the step's
 * micro-batches add up. After the dense gradients are complete, the kernel reads `touched` to
 * check the gradients for NaN/Inf (a non-finite value makes the step non-finite, as a dense
 * one does) and to record their norm; then, unless the step is skipped, the sparse optimizer's
 * step updates the touched rows; then `end_step` forgets the gradients (and evicts unused rows).
 * ---------------------------------------------------------------------------------------- */

/* The rows of one table that the current step touched, with their gradients; filled in by the
 * table's `touched` slot. Pointers stay valid until the next call of any slot of the table or
 * of its model; distinct rows never share memory, so an optimizer may update them from several
 * threads. */
typedef struct keel_sparse_rows {
  uint32_t struct_size; /* set by the caller: the table fills only fields within it */
  size_t count;         /* touched rows (those this rank owns, when sharded) */
  const int64_t* ids;   /* count distinct ids */
  /* count pointers to each row's dim floats, which the sparse optimizer updates in place */
  float* const* values;
  /* count pointers to dim floats: the row's gradient, summed over the step's micro-batches and
   * over the ranks that looked it up, scaled as dense gradients are (averaged over the ranks) */
  const float* const* grads;
  /* count pointers to the row's `slot_width` floats of optimizer state (see reserve_slots), zero
   * before the row's first update; NULL when slot_width is 0 */
  float* const* slots;
  size_t slot_width;
  /* (1.11) The same rows as tensors, on the device that holds the table's rows, filled instead
   * of values, grads and slots (which then stay NULL; ids and count do not change) by a table
   * whose keel_sparse_table.rows_as_tensors is nonzero: float [count, dim] values and grads and
   * float [count, slot_width] slots (NULL when slot_width is 0), row i for ids[i]. row_values
   * and row_slots are the table's copies of those rows: a sparse optimizer updates them in
   * place, and the table writes them back into its rows at end_step; row_grads is read-only.
   * Borrowed, valid as the pointers are. */
  keel_tensor* row_values;
  keel_tensor* row_grads;
  keel_tensor* row_slots;
} keel_sparse_rows;

/* A table's counters, for the training metrics; filled in by the table's `stats` slot. */
typedef struct keel_table_stats {
  uint32_t struct_size; /* set by the caller */
  int64_t rows;         /* live rows now (this rank's, when sharded) */
  int64_t admitted;     /* rows created since the run began (a resumed run continues the count) */
  int64_t evicted;      /* rows evicted since the run began (likewise) */
  /* (1.10) Ids waiting for admission now (sighted fewer than the table's admission count; this
   * rank's, when sharded). A table of 1.9 or older leaves it 0. */
  int64_t pending;
} keel_table_stats;

/* One table; the model's, valid for the model's life. Slots are called on the training thread,
 * [setup] or [train] as marked, never concurrently with the model's own slots. */
typedef struct keel_sparse_table {
  uint32_t struct_size;
  void* self; /* the table's; passed back as each slot's first argument */
  /* Unique among the model's tables: 1 to KEEL_NAME_CAPACITY - 1 bytes of letters, digits, '_',
   * '.' and '-'. Checkpoints store the table's entries under it. */
  const char* name;
  int64_t dim; /* floats per row, >= 1 */
  /* Keeps `width` floats of optimizer state beside every row, present and future, zeroed for a
   * new row and evicted with it. Called by the sparse optimizer's factory, at most once per
   * table. [setup] */
  keel_status (*reserve_slots)(void* self, size_t width, keel_error* err);
  /* The rows the step touched so far and their gradients (see keel_sparse_rows). [train] */
  keel_status (*touched)(void* self, keel_sparse_rows* out, keel_error* err);
  /* The step ended (updated or skipped): forgets its gradients and touched rows, then evicts the
   * rows the table's own policy retires (such as rows not looked up for a number of steps);
   * `step` counts the optimizer steps taken, skipped ones included. [train] */
  keel_status (*end_step)(void* self, int64_t step, keel_error* err);
  void (*stats)(void* self, keel_table_stats* out);
  /* Puts the table's live state to `out` as entries of the table's own naming (ids, values,
   * slots, counters, ...; no prefix: the kernel stores them under the table's name). Called on
   * every rank when a checkpoint is saved, at a step boundary; a sharded table puts its own
   * rows. [train] */
  keel_status (*save)(void* self, keel_state_writer* out, keel_error* err);
  /* Adds the rows of one saved part (the entries one rank's save put, named as save named
   * them; CPU tensors borrowed for the call) and keeps those this rank owns. A resumed run calls
   * it after the sparse optimizer was created: at the same number of ranks once, with this
   * rank's own part; at another number, once for every saved part, so that each rank ends up
   * with the rows that hash to it. An entry the table cannot use is an error naming it. [setup] */
  keel_status (*load)(void* self, const keel_named_tensor* entries, size_t count,
                      keel_error* err);
  /* (1.11) Nonzero: `touched` hands the rows as tensors (keel_sparse_rows.row_values, ...), not
   * as host pointers, as a table whose rows live in device memory must. With such a table the
   * kernel refuses a sparse optimizer built against ABI 1.10 or older (it reads the pointers):
   * the run ends after the optimizer's factory, before any step. 0 (and a table of 1.10 or
   * older): host pointers. */
  int32_t rows_as_tensors;
  /* (1.11) Where the rows live, as LibTorch names a device ("cpu", "cuda:0"); NULL means "cpu".
   * For messages and logs. */
  const char* device;
} keel_sparse_table;

/* What a factory gets. Fields that do not apply to the component's kind are zero/NULL. */
typedef struct keel_create_context {
  uint32_t struct_size;
  const keel_host* host;
  const keel_options* options;
  /* Manifest section the component comes from ("optimizer", "data.train", "hooks[1]"). */
  const char* section;
  /* The run's seed; a component that draws random numbers derives its streams from it. */
  uint64_t seed;
  /* Data parallelism: this process's rank (0-based) and the number of ranks (1 when running
   * alone). Every rank creates every component; a dataset reads its own shard of the data (the
   * same number of batches on every rank), and a component that writes files writes them on
   * rank 0, or names them by rank. */
  int32_t rank;
  int32_t world_size;
  /* The run directory (exists before any factory runs). */
  const char* run_dir;
  /* optimizer, grad_clipper: the model's trainable parameters, borrowed for the run. */
  keel_tensor* const* params;
  const char* const* param_names;
  size_t param_count;
  /* lr_scheduler: optimizer steps the run plans to take (0 when unknown). */
  int64_t total_steps;
  /* (1.1) optimizer: parameter groups. param_group[i] is the group of params[i] (0 is the
   * default group); group_lr[g] and group_weight_decay[g] override the optimizer's own lr and
   * weight_decay for group g when not NaN (group 0 never overrides). */
  const int32_t* param_group;
  size_t group_count;
  const double* group_lr;
  const double* group_weight_decay;
  /* (1.3) The step a resumed run continues from (`keel train --resume`), 0 for a fresh run.
   * A component that writes files into run_dir keeps what it wrote up to that step. */
  int64_t resume_step;
  /* (1.7) optimizer, grad_clipper: non-NULL when `params` are shards (see "Sharded
   * parameters"), NULL when they are the whole parameters. */
  const keel_shard_group* shards;
  /* (1.9) Every kind: the run's ranks, for components that exchange data themselves (see
   * "Collectives for components"); never NULL for a plugin of 1.9 or later. */
  const keel_comm* comm;
  /* (1.9) sparse_optimizer: the model's embedding tables (table_count >= 1), borrowed for the
   * run. */
  const keel_sparse_table* const* tables;
  size_t table_count;
  /* (1.11) Every kind: the run's device for this rank, as LibTorch names it ("cpu", "cuda:0"):
   * where the kernel puts the model's parameters and the batches after the factories ran. A
   * model may create state of its own there (the SDK's embedding tables: TableOptions::device). */
  const char* device;
} keel_create_context;

/* Every instance struct begins with these three fields and holds nothing but function
 * pointers after them. Slots of ABI 1.0 are required (never NULL); slots marked (1.1) are
 * optional: NULL, or beyond a 1.0 plugin's struct_size, means "not provided". */

/* Every instance struct begins with these three fields. `destroy` frees `self` and everything
 * the instance owns; the kernel calls it exactly once for every instance a factory returns
 * (also for one it refuses as too small, when struct_size covers `destroy`). [setup|train] */
#define KEEL_INSTANCE_HEADER \
  uint32_t struct_size;      \
  void* self;                \
  void (*destroy)(void* self)

/* (1.12) Extensions: optional capabilities found by id.
 *
 * Every instance struct ends with an optional slot `get_extension` (1.12) through which the
 * instance offers capabilities beyond its kind's struct, each a struct defined in a header of its
 * own under <keel/ext/> and named by a versioned id such as "keel.hook.model/1" (the header's
 * KEEL_EXT_* macro). The kernel asks an instance for each id it can use, once, right after the
 * factory returned it:
 *   const void* ext = hook->get_extension(hook->self, KEEL_EXT_HOOK_MODEL);
 * NULL means "not offered". Otherwise the result points to that id's struct, which begins with a
 * uint32_t struct_size (read as every struct_size is: KEEL_HAS_FIELD) and stays valid, unchanged,
 * for the instance's life. An id names one layout forever: a change that is not an append gets a
 * new number ("/2"), and an instance may offer several. The kernel passes ids shorter than
 * KEEL_NAME_CAPACITY, NUL-terminated. [setup] */
typedef const void* (*keel_get_extension_fn)(void* self, const char* id);

/* ------------------------------------------------------------------------------------------
 * (1.8) Model units
 *
 * With [distributed] shard = "parameters" and several ranks, each rank keeps only its shard of
 * every parameter between uses (see "Sharded parameters"); a model's whole parameters exist
 * only while they are computed with. A model that declares units (keel_model.param_unit and
 * set_unit_calls, both or neither) lets the kernel hold one unit's whole parameters at a time
 * instead of the whole model's:
 *  - param_unit(i) gives the unit of param(i): 0 <= unit < KEEL_MAX_UNITS, or -1 for the root
 *    (parameters used outside every unit, such as embeddings, a final norm and a tied output
 *    layer: gathered for the whole step). A parameter belongs to one unit; a tied weight used by
 *    two units belongs to the root. The kernel asks once per parameter at setup and refuses a
 *    value out of range, naming the plugin.
 *  - set_unit_calls(calls) is called once at setup, only when the run shards parameters (never
 *    otherwise: a model that never receives it runs as without units). From then on, every
 *    forward and forward_features calls calls->enter(calls, u, err) right before the
 *    computation of unit u and calls->leave(calls, u, outputs, count, err) right after it,
 *    with every tensor computed inside the unit that is used outside it, each time the unit
 *    runs (the unit's parameters are not touched outside enter ... leave). A slot that returns
 *    KEEL_ERR makes the model's slot return KEEL_ERR with that message.
 * Between leave and the unit's backward, and after its gradients were reduce-scattered, the
 * parameters of the unit hold no storage: a model must not keep tensors derived from its
 * weights across calls, or read a weight of a unit outside enter ... leave (the autograd graph
 * may: the kernel gathers the weights again before the unit's backward). A model without units
 * is one unit under shard = "parameters" (the kernel warns, naming the model).
 * ---------------------------------------------------------------------------------------- */

/* Units are numbered 0 .. KEEL_MAX_UNITS - 1. */
#define KEEL_MAX_UNITS 65536

/* The host's calls around a model's units; the host's, valid for the instance's life. */
typedef struct keel_unit_calls {
  uint32_t struct_size;
  void* host_data; /* the host's; do not touch */
  /* Before the computation of unit `unit`: returns once the unit's parameters hold their whole
   * values (the kernel all-gathers their shards; nothing to do when they are held already, as
   * during an evaluation, which gathers the whole model). A collective: every rank's model
   * enters the same units in the same order. Returns KEEL_ERR with `err` filled for a unit
   * out of range or when the ranks cannot agree. [train], on the thread calling forward or
   * forward_features, from inside that call. */
  keel_status (*enter)(const struct keel_unit_calls* calls, int32_t unit, keel_error* err);
  /* Right after the computation of unit `unit` (entered last), with `outputs` (count of them,
   * borrowed for the call): the unit's tensors used outside it. When they carry gradients the
   * kernel hooks them so that backward gathers the unit's parameters again before the unit's
   * backward runs; then it frees the unit's whole parameters. Returns KEEL_ERR with `err`
   * filled for a unit other than the one entered. [train], as enter. */
  keel_status (*leave)(const struct keel_unit_calls* calls, int32_t unit,
                       keel_tensor* const* outputs, size_t count, keel_error* err);
} keel_unit_calls;

/* model ------------------------------------------------------------------------------------ */
typedef struct keel_model {
  KEEL_INSTANCE_HEADER;
  /* Computes the output for a batch of inputs; `output` is new. `input` must not be modified
   * in place: it may be a view of the dataset's own storage. [train] */
  keel_status (*forward)(void* self, keel_tensor* input, keel_tensor** output, keel_error* err);
  /* Switches between training (1) and evaluation (0) behaviour (dropout, batch norm). [train] */
  void (*set_training)(void* self, int training);
  /* Trainable parameters, in a fixed order; handles are borrowed for the instance's life.
   * At least one; each with a unique, non-empty name, a floating-point dtype and requires_grad
   * set (the kernel refuses anything else before step 1). The host functions cannot create
   * such tensors, so models are written against LibTorch (the C++ SDK). [setup] */
  size_t (*param_count)(void* self);
  keel_status (*param)(void* self, size_t index, const char** name, keel_tensor** tensor,
                       keel_error* err);
  /* Everything a checkpoint must hold (parameters and buffers); borrowed handles. */
  size_t (*state_count)(void* self);
  keel_status (*state)(void* self, size_t index, const char** name, keel_tensor** tensor,
                       keel_error* err);
  /* Training FLOPs (forward + backward) for one sample, or 0 when unknown. [setup] */
  double (*flops_per_sample)(void* self);
  /* (1.3) Optional (both or neither): state beyond state_count/state, such as a generator the
   * model draws from itself (see "Component state for exact resume"). Dropout through
   * LibTorch's default generator needs nothing here: the kernel saves that generator. */
  keel_status (*state_save)(void* self, keel_state_writer* out, keel_error* err);
  keel_status (*state_load)(void* self, const keel_named_tensor* state, size_t count,
                            keel_error* err);
  /* (1.5) Optional: forward's work less its output layer, for a loss that applies that layer
   * itself (keel_loss.compute_linear). `features` [batch, ..., F] and `weight` [V, F] are
   * such that forward's output is features @ weight^T, [batch, ..., V] (an output layer
   * without bias: a language model's head, the token embedding when tied); `weight` is the
   * parameter itself (gradients reaching it train the model), `features` a tensor of the
   * autograd graph as forward's output would be. Both handles are new. In a training step
   * the kernel calls it instead of forward when the loss has compute_linear (evaluation
   * calls forward). [train] */
  keel_status (*forward_features)(void* self, keel_tensor* input, keel_tensor** features,
                                  keel_tensor** weight, keel_error* err);
  /* (1.7) Optional: the model's weights as a Hugging Face `transformers` model names and lays
   * them out, for `keel export`. Puts every tensor of that model's state dict to `out` (values
   * of the model's current parameters and buffers; the plugin may put transposed or derived
   * copies; a weight tied to another, such as GPT-2's lm_head.weight, is put once, as
   * transformers' own safetensors files hold it), and writes the model's `config.json` into
   * config_json: at most `capacity` bytes with its NUL (keel export passes 1 MiB; the kernel
   * zeroes config_json[0] first; an empty string: no config). Called
   * once, on the calling thread, after a checkpoint's model state was loaded; no training
   * follows. [setup] */
  keel_status (*export_state)(void* self, keel_state_writer* out, char* config_json,
                              size_t capacity, keel_error* err);
  /* (1.8) Optional, both or neither: the model's units for [distributed] shard = "parameters"
   * (see "Model units"). param_unit: the unit of param(index), 0 <= unit < KEEL_MAX_UNITS, or
   * -1 for the root. [setup] set_unit_calls: the host's enter/leave calls (valid for the
   * instance's life), given once when the run shards parameters; forward and forward_features
   * call them around each unit from then on. [setup] */
  int32_t (*param_unit)(void* self, size_t index);
  void (*set_unit_calls)(void* self, const keel_unit_calls* calls);
  /* (1.9) Optional, both or neither: the model's sparse embedding tables (see "Sparse embedding
   * tables"), borrowed for the instance's life, in a fixed order. A model with tables needs a
   * [sparse_optimizer] to train them. [setup] */
  size_t (*table_count)(void* self);
  const keel_sparse_table* (*table)(void* self, size_t index);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_model;

/* dataset ---------------------------------------------------------------------------------- */

/* (1.10) A value of keel_dataset.next's *has_batch: "stopped while waiting". A dataset that
 * waits in next for data that has not arrived yet (a followed stream's next window) polls
 * keel_host.stop_requested while it waits, and when that turns nonzero returns KEEL_OK with
 * *has_batch = KEEL_BATCH_STOPPED instead of waiting on. It produced no batch (`out` is not
 * read; nothing is owned), and its position, the one state_save saves, is still after the last
 * batch it returned, so that the next call of next would continue there. The kernel then takes
 * no more micro-batches: those it already fetched for the step, if any, make the step (as at
 * an epoch's end), else none is taken; the run then ends as for a signal received during the
 * last finished step: the epoch's end events (no EPOCH_END), a checkpoint of that step, exit
 * status 128 + the signal (docs/loop.md, "Stopping"). Set it only after stop_requested returned
 * nonzero (the kernel fails the run naming the dataset otherwise). Only a plugin declaring ABI
 * 1.10 or later may set it: from an older plugin, any nonzero value means a batch, as before.
 * In an evaluation it ends the evaluated data early, with a warning. With several ranks only a
 * stream (batches_per_epoch -1) may set it, and the ranks agree on it with the step's count of
 * micro-batches: every rank must stop (a launcher sends the signal to every rank). */
#define KEEL_BATCH_STOPPED 2

typedef struct keel_batch {
  keel_tensor* inputs;  /* new */
  keel_tensor* targets; /* new */
  int64_t samples;      /* samples in this batch */
  int64_t tokens;       /* tokens in this batch (equal to samples for non-sequence data) */
} keel_batch;

typedef struct keel_dataset {
  KEEL_INSTANCE_HEADER;
  /* Samples in one epoch. */
  int64_t (*size)(void* self);
  /* Batches in one epoch. (1.9) -1: not known in advance, for a stream (a streaming dataset's
   * epochs are its windows, which end when `next` says so); `size` may then return -1 too. The
   * kernel then plans no run length (a schedule gets total_steps = max_steps, 0 without it) and,
   * with several ranks, requires every rank's data to end an epoch at the same step; an epoch
   * in which `next` yields no batch at all ends the run (the stream ended). */
  int64_t (*batches_per_epoch)(void* self);
  /* Rewinds to the first batch of epoch `epoch` (0-based; reshuffles when shuffling). [train] */
  keel_status (*start_epoch)(void* self, int64_t epoch, keel_error* err);
  /* Fills `out` with the next batch and sets *has_batch = 1, or sets *has_batch = 0 at the
   * end of the epoch. A batch has both tensors, the same first (batch) dimension in both,
   * samples >= 1 and tokens >= 0 (checked by the kernel). (1.10) Or sets *has_batch =
   * KEEL_BATCH_STOPPED: it was waiting for data and keel_host.stop_requested turned nonzero
   * (see there). [train] */
  keel_status (*next)(void* self, keel_batch* out, int* has_batch, keel_error* err);
  /* (1.3) Optional: positions the dataset exactly where start_epoch(epoch) followed by `batch`
   * calls of next would leave it (the same shuffle order), without producing those batches.
   * A resumed run calls it once instead of start_epoch for the epoch it resumes in. Without
   * it the kernel calls start_epoch(epoch) and next `batch` times, discarding the batches:
   * exact too, when start_epoch's order depends only on the seed and the epoch. [train] */
  keel_status (*seek)(void* self, int64_t epoch, int64_t batch, keel_error* err);
  /* (1.3) Optional (both or neither): state the data position does not capture, e.g. a
   * generator the dataset keeps across epochs (see "Component state for exact resume"). */
  keel_status (*state_save)(void* self, keel_state_writer* out, keel_error* err);
  keel_status (*state_load)(void* self, const keel_named_tensor* state, size_t count,
                            keel_error* err);
  /* (1.4) Optional: the tokens each sample holds (a language-model window of `context`
   * tokens: context), the same for every sample, so that the kernel can plan a run whose
   * target is [train] max_tokens (steps = max_tokens / tokens per step) before step 1. A
   * value <= 0 means "varies or unknown": then max_tokens still stops the run, but does not
   * plan its length. [setup] */
  int64_t (*tokens_per_sample)(void* self);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_dataset;

/* optimizer -------------------------------------------------------------------------------- */
typedef struct keel_optimizer {
  KEEL_INSTANCE_HEADER;
  /* Updates the parameters from their gradients. [train] */
  keel_status (*step)(void* self, keel_error* err);
  /* Clears the parameters' gradients. [train] */
  void (*zero_grad)(void* self);
  /* Parameter groups and their learning rates. [setup|train] */
  size_t (*group_count)(void* self);
  double (*get_lr)(void* self, size_t group);
  void (*set_lr)(void* self, size_t group, double lr);
  /* (1.3) Optional (both or neither), and needed for `keel train --resume`: every state tensor
   * (Adam's exp_avg, exp_avg_sq and step; SGD's momentum buffers) and each group's
   * hyper-parameters (see "Component state for exact resume"). state_load receives the state of
   * an optimizer built from the same manifest over the same parameters. */
  keel_status (*state_save)(void* self, keel_state_writer* out, keel_error* err);
  keel_status (*state_load)(void* self, const keel_named_tensor* state, size_t count,
                            keel_error* err);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_optimizer;

/* sparse_optimizer (1.9) --------------------------------------------------------------------- */
/* Updates the touched rows of the tables its factory got (keel_create_context.tables), beside
 * the dense [optimizer]; its factory reserves the per-row state it needs with reserve_slots. */
typedef struct keel_sparse_optimizer {
  KEEL_INSTANCE_HEADER;
  /* Updates every table's touched rows from their gradients (keel_sparse_table.touched); rows
   * not touched in the step keep their values and state. Not called for a skipped step. [train] */
  keel_status (*step)(void* self, keel_error* err);
  /* The learning rate: the kernel sets base * the schedule's factor before every step, as for
   * the dense optimizer's groups (get_lr, read once after the factory, is the base). [setup|train] */
  double (*get_lr)(void* self);
  void (*set_lr)(void* self, double lr);
  /* Optional (both or neither): state beyond the rows' slots, which the tables save themselves
   * (see "Component state for exact resume"). */
  keel_status (*state_save)(void* self, keel_state_writer* out, keel_error* err);
  keel_status (*state_load)(void* self, const keel_named_tensor* state, size_t count,
                            keel_error* err);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_sparse_optimizer;

/* lr_scheduler ----------------------------------------------------------------------------- */
typedef struct keel_lr_scheduler {
  KEEL_INSTANCE_HEADER;
  /* Multiplier of each group's base learning rate for optimizer step `step` (0-based). A pure
   * function of its arguments. [train] */
  double (*factor)(void* self, int64_t step);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_lr_scheduler;

/* loss ------------------------------------------------------------------------------------- */

/* (1.6) Evaluation metrics of a loss
 *
 * A loss may report the metrics of its task (accuracy, bits per token, AUC, ...) in every
 * evaluation record, beside the kernel's own `step`, `epoch`, `loss` and `samples`. A metric is
 * not a mean of per-batch values (AUC is not), so a loss describes it by sufficient statistics:
 * a state of a fixed number of doubles, which the kernel zeroes before an evaluation, which the
 * loss adds every evaluation batch to, which the kernel sums elementwise over the ranks, and
 * which the loss then turns into named values. Three optional slots of keel_loss, all three or
 * none (a loss of an older minor has none, and its evaluation records carry no task metrics):
 *
 *   size_t (*metric_state_size)(void* self);
 *     Doubles in the state, at most KEEL_METRIC_STATE_CAPACITY; 0: no task metrics. Called once
 *     after the factory; the size is fixed for the instance's life. [setup]
 *   keel_status (*metric_update)(void* self, keel_tensor* output, keel_tensor* target,
 *                                double loss, int64_t count, double* state, size_t size,
 *                                keel_error* err);
 *     One evaluation batch: `output` is the model's output for it, `target` the dataset's
 *     targets (both borrowed for the call, on the run's device), `loss` and `count` what compute
 *     returned for them (the mean loss as a double, and its item count). Adds the batch's
 *     statistics into `state` (`size` doubles: this rank's sums over the evaluation's earlier
 *     batches). The kernel sums states over ranks, so every entry must be a sum over items
 *     (counts, sums of values, histogram buckets): never a mean, a maximum or a ratio. Called
 *     with gradients off and the model in evaluation mode. [train]
 *   keel_status (*metric_finish)(void* self, const double* state, size_t size,
 *                                keel_metric_writer* out, keel_error* err);
 *     After the last batch, with the state summed over all ranks (every rank calls it with the
 *     same sums, so the values must depend on `state` alone): hands each metric to out->put, in
 *     the order the record should show them. A metric that the evaluated data cannot define (no
 *     class-index targets, no positive sample) is left out, not reported as NaN. [train]
 *
 * The kernel calls them only in evaluations (not in training steps), once per evaluation batch,
 * and records the values after `loss`, in the order put. Examples, as the first-party losses
 * and a recommendation loss would write them:
 *   accuracy        state {correct, counted}: update adds the targets whose argmax over the
 *                   classes equals them, and the targets that count; finish puts
 *                   correct / counted (none when counted is 0).
 *   bits_per_token  state {sum of loss * count, sum of count}: finish puts
 *                   sum / count / ln 2.
 *   AUC             state {positives[B], negatives[B]}: B buckets of the predicted probability
 *                   (bucket min(B - 1, floor(p * B))); update adds 1 to the bucket of each
 *                   sample in the positives or the negatives; finish walks the buckets from the
 *                   highest down and puts the area under the ROC curve of those counts, pairs
 *                   within one bucket counting half (exact up to the buckets' width; none
 *                   without positives or without negatives). Sums of counts, so the ranks'
 *                   shards add up exactly. tests/unit/test_eval_metrics.cpp holds one. */

/* Largest state a loss may declare for its evaluation metrics (doubles). */
#define KEEL_METRIC_STATE_CAPACITY 1048576

/* (1.6) Collects the metrics of one metric_finish call; built by the host. */
typedef struct keel_metric_writer {
  uint32_t struct_size;
  void* host_data; /* the host's; do not touch */
  /* Records metric `key` (copied; 1 to KEEL_NAME_CAPACITY - 1 bytes of letters, digits, '_',
   * '.' and '-', unique within the call, and none of the record's own keys: step, epoch, loss,
   * samples) with `value` (any double). Returns 1, or 0 when the metric is refused (the kernel
   * then fails the evaluation naming the key and the reason); return KEEL_ERR from
   * metric_finish after a 0 (any message). [train] */
  int (*put)(struct keel_metric_writer* writer, const char* key, double value);
} keel_metric_writer;

typedef struct keel_loss {
  KEEL_INSTANCE_HEADER;
  /* Mean loss over the items of a batch; `loss` (a 0-dim floating-point tensor that requires
   * grad in training) is new. `count` receives the number of items averaged over (>= 0, e.g.
   * targets not equal to ignore_index). The kernel checks all of this. [train] */
  keel_status (*compute)(void* self, keel_tensor* output, keel_tensor* target, keel_tensor** loss,
                         int64_t* count, keel_error* err);
  /* (1.1) Optional: the number of items `compute` will average over for `target`, without
   * computing the loss (-1: not reported). With it, gradient accumulation normalises each
   * optimizer step by the item count of all its micro-batches (unless [train]
   * accum_normalization = "mean"; with "auto", a -1 falls back to the mean). [train] */
  int64_t (*count_items)(void* self, keel_tensor* target);
  /* (1.5) Optional: compute's loss and count for the output features @ weight^T (features
   * [batch, ..., F], weight [V, F], from keel_model.forward_features), computed without that
   * [batch, ..., V] output existing whole at any time (MindSpeed-LLM's chunk loss: a chunk of
   * rows at a time). The contract of compute otherwise; gradients reach features and weight.
   * A training step calls it when the model has forward_features. [train] */
  keel_status (*compute_linear)(void* self, keel_tensor* features, keel_tensor* weight,
                                keel_tensor* target, keel_tensor** loss, int64_t* count,
                                keel_error* err);
  /* (1.6) Optional, all three or none: the loss's evaluation metrics (see "Evaluation metrics
   * of a loss" above). */
  size_t (*metric_state_size)(void* self);
  keel_status (*metric_update)(void* self, keel_tensor* output, keel_tensor* target, double loss,
                               int64_t count, double* state, size_t size, keel_error* err);
  keel_status (*metric_finish)(void* self, const double* state, size_t size,
                               keel_metric_writer* out, keel_error* err);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_loss;

/* grad_clipper ----------------------------------------------------------------------------- */
typedef struct keel_grad_clipper {
  KEEL_INSTANCE_HEADER;
  /* Clips the gradients of the parameters given at creation; writes the global norm of the
   * gradients before clipping to *total_norm (L2 unless the clipper is configured otherwise;
   * NaN/Inf go to the non-finite policy, a negative norm is an error). [train] */
  keel_status (*clip)(void* self, double* total_norm, keel_error* err);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_grad_clipper;

/* mfu -------------------------------------------------------------------------------------- */
typedef struct keel_mfu {
  KEEL_INSTANCE_HEADER;
  /* Model FLOPs utilisation (0..1) given the model's training FLOPs per sample and the
   * measured samples per second per device: the whole job's samples per second divided by
   * the number of ranks (one device each), so that MFU compares against one device's peak.
   * [train] */
  double (*compute)(void* self, double flops_per_sample, double samples_per_second);
  /* (1.4) Optional: the peak FLOP/s of one device that `compute` divides by (> 0), which the
   * kernel records in the metrics beside MFU (`mfu_peak_tflops`). [setup|train] */
  double (*peak_flops)(void* self);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_mfu;

/* profiler --------------------------------------------------------------------------------- */
typedef struct keel_profiler {
  KEEL_INSTANCE_HEADER;
  /* Marks the start and end of a phase ("data", "forward", "backward", "clip", "optimizer",
   * "hooks", "eval", "checkpoint") of optimizer step `step`. Must be cheap. [train] */
  void (*begin)(void* self, const char* phase, int64_t step);
  void (*end)(void* self, const char* phase, int64_t step);
  /* Writes what was recorded; called once, after TRAIN_END of a training run that did not
   * fail (not in evaluate mode). [train] */
  keel_status (*flush)(void* self, keel_error* err);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_profiler;

/* checkpoint backend ----------------------------------------------------------------------- */
typedef struct keel_checkpoint {
  KEEL_INSTANCE_HEADER;
  /* Writes `tensors` into directory `dir` (which exists) as the object `stem` ("model",
   * "optimizer", "hooks", "rng", "state"), in files named `<stem>.<anything>`. The kernel owns
   * the commit protocol: `dir` is a staging directory; the kernel checksums and fsyncs every
   * file in it, writes its commit record and renames it once every object is written, so the
   * backend only writes files (and reports a failed write or close as KEEL_ERR). Tensors are
   * CPU tensors of any dtype, 0-dim ones included. The object's files together hold at least
   * its tensors' bytes (store them uncompressed): a checkpoint whose record claims more bytes
   * than the object's files hold is refused before any load (docs/checkpoints.md), so that a
   * handed checkpoint cannot claim more memory than its size. [train] -- with [checkpoint]
   * async = true, on the kernel's checkpoint thread instead, never concurrently with another
   * slot of the instance. */
  keel_status (*save)(void* self, const char* dir, const char* stem,
                      const keel_named_tensor* tensors, size_t count, keel_error* err);
  /* Reads object `stem` from `dir` and copies each tensor of `into` from the stored tensor of
   * the same name (stored tensors not asked for are skipped); a missing name, a dtype or a
   * shape mismatch is an error naming the tensor. [setup] */
  keel_status (*load)(void* self, const char* dir, const char* stem,
                      const keel_named_tensor* into, size_t count, keel_error* err);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_checkpoint;

/* hook ------------------------------------------------------------------------------------- */

/* The call order, as the kernel runs it (train mode; `keel evaluate` sends CHECKPOINT_LOADED
 * (with init_from), TRAIN_START, EVAL_START, EVAL_END and METRICS for each evaluation set,
 * and TRAIN_END, or EXCEPTION). An evaluation evaluates each evaluation set in turn ([data.test]
 * first, named "test", then each [data.eval.NAME] in the order of the names), each with its
 * EVAL_START, EVAL_END and METRICS; `split` is the set's name:
 *
 *   CHECKPOINT_LOADED                          when [checkpoint] init_from is set, or the run
 *                                              resumes (keel train --resume)
 *   TRAIN_START
 *   EVAL_START, EVAL_END, METRICS (split = each evaluation set's name)
 *                                              step 0, when [train] eval_at_start = true (not
 *                                              in a resumed run)
 *   CHECKPOINT_SAVED                           step 0, when [checkpoint] initial = true (not
 *                                              in a resumed run)
 *   for each epoch (a resumed run starts with the epoch, the step and the position in the
 *   epoch it was saved at):
 *     EPOCH_START
 *     for each optimizer step:
 *       (fetch up to grad_accum micro-batches; none left: the epoch is complete, leave the
 *        step loop; (1.10) the dataset stopped while waiting (KEEL_BATCH_STOPPED) before the
 *        first: leave the step loop as for a stop after the last step, the epoch not complete)
 *       STEP_START
 *       AFTER_DATA, once per micro-batch       event.micro_batch = 0, 1, ... (all fetched)
 *       for each micro-batch: (forward, loss, backward); with the model's forward_features
 *                                              and the loss's compute_linear (1.5): those two
 *                                              instead of forward and compute
 *       AFTER_BACKWARD                         gradients complete, not clipped yet
 *       (clip, non-finite check)
 *       BEFORE_OPTIMIZER_STEP                  not sent when the step is skipped
 *       (optimizer step)
 *       STEP_END
 *       CHECKPOINT_SAVED                       [checkpoint] async = true: the background save
 *                                              started at an earlier step has committed
 *       METRICS (split "train")                every log_every steps, and at a step that
 *                                              reaches max_steps/max_samples/max_tokens or
 *                                              after which a stop was requested
 *       EVAL_START, EVAL_END, METRICS (split = each evaluation set's name)
 *                                              every eval_every_steps, or when requested
 *       CHECKPOINT_SAVED                       every every_steps, or when requested
 *       METRICS (split "train")                when the evaluation or checkpoint events
 *                                              requested a stop and steps ran since the last
 *                                              record
 *       (max_steps/max_samples/max_tokens reached, or a stop requested: leave the step loop;
 *        the rest of this epoch's events follow, then the run ends)
 *     METRICS (split "train")                  final epoch (`epochs`) only: the last, partial
 *                                              log window, when steps ran since the last record
 *     EPOCH_END                                when the epoch is complete (so not when the step
 *                                              loop was left for a stop, even at its last batch)
 *     EVAL_START, EVAL_END, METRICS (split = each evaluation set's name)
 *                                              after a complete epoch (eval_each_epoch), when
 *                                              the run ends (final epoch, the step loop left
 *                                              for a stop, or a stop requested by the events
 *                                              above), or when the events above requested an
 *                                              evaluation; unless that step was just evaluated
 *     METRICS (split "train")                  when the run ends and steps ran since the last
 *                                              record (the stop may come from the evaluation)
 *     CHECKPOINT_SAVED                         when requested by the events above, unless just
 *                                              saved
 *     METRICS (split "train")                  when that CHECKPOINT_SAVED requested a stop and
 *                                              steps ran since the last record
 *     (after the final epoch, or when a stop was requested, the epoch loop ends)
 *   CHECKPOINT_SAVED                           at the end (at_end), unless just saved
 *   CHECKPOINT_SAVED                           async = true: the save still in flight, once
 *                                              committed (the kernel waits for it)
 *   TRAIN_END
 *   EXCEPTION                                  instead of the rest, when the run fails
 *
 * The events after TRAIN_START, after STEP_END, at an epoch's end and before TRAIN_END are the
 * rows of the kernel's decision table, in its order (docs/loop.md, "The decision table"); a
 * unit test reads this pseudocode and checks it against that table.
 *
 * Hooks are called in ascending `priority` (a kernel key of each [[hooks]] table, default 0),
 * ties in manifest order. With async = true a save in flight is also waited for (and its
 * CHECKPOINT_SAVED sent) before the next save starts; the save copies the model's parameters
 * and the optimizer's state while the next step's forward and backward run, and that step
 * waits for the copy before BEFORE_OPTIMIZER_STEP, so a hook must not change parameters or
 * optimizer state from the save until then (buffers and everything else are copied at the
 * save). A SIGTERM or SIGINT acts as STOP and
 * CHECKPOINT requested at the STEP_END of the step during which it arrived, or (1.10), when
 * the training data was waiting for data and stopped (KEEL_BATCH_STOPPED), at once: after the
 * step made of the micro-batches fetched before it, or, with none, after the last finished step.
 * Any hook may set bits of `requests`; the kernel acts on them after
 * the current step, or after the epoch-end events when set during those (KEEL_REQUEST_STOP
 * ends the run, _EVAL evaluates, _CHECKPOINT saves); other bits are an error. Requests set
 * during the final events (the at_end checkpoint, TRAIN_END) are ignored, and so are EVAL and
 * CHECKPOINT requests set during a CHECKPOINT_SAVED event or the METRICS record after it
 * (STOP is honoured there), except during the asynchronous CHECKPOINT_SAVED that follows a
 * STEP_END: its requests count as that step's.
 *
 * With several ranks (data parallelism) every rank runs this same sequence: each rank's hooks
 * see every event, and before the kernel acts on requests it ORs them over all ranks, so that
 * a request from one rank's hook (or a signal to one rank) acts on every rank. */
typedef struct keel_metric {
  const char* key;
  double value;
} keel_metric;

typedef enum keel_event_kind {
  KEEL_EVENT_TRAIN_START = 1,
  KEEL_EVENT_TRAIN_END = 2,
  KEEL_EVENT_EPOCH_START = 3,
  KEEL_EVENT_EPOCH_END = 4,
  KEEL_EVENT_STEP_START = 5,
  KEEL_EVENT_STEP_END = 6,
  KEEL_EVENT_EVAL_START = 7,
  KEEL_EVENT_EVAL_END = 8,
  KEEL_EVENT_METRICS = 9,
  KEEL_EVENT_CHECKPOINT_SAVED = 10,
  /* (1.1) Sent only to hooks of plugins that declare ABI 1.1 or later. */
  KEEL_EVENT_AFTER_DATA = 11,             /* a micro-batch was fetched (event.micro_batch) */
  KEEL_EVENT_AFTER_BACKWARD = 12,         /* gradients accumulated, before clipping */
  KEEL_EVENT_BEFORE_OPTIMIZER_STEP = 13,  /* after clipping, before the update */
  KEEL_EVENT_CHECKPOINT_LOADED = 14,      /* event.path was loaded (before TRAIN_START) */
  KEEL_EVENT_EXCEPTION = 15               /* the run is failing: event.message says why */
} keel_event_kind;

#define KEEL_REQUEST_STOP 1u       /* end the run after the current step */
#define KEEL_REQUEST_EVAL 2u       /* (1.1) evaluate after the current step */
#define KEEL_REQUEST_CHECKPOINT 4u /* (1.1) save a checkpoint after the current step */

typedef struct keel_trainer_state {
  uint32_t struct_size;
  int64_t step;      /* optimizer steps taken, skipped ones included */
  int64_t epoch;     /* current epoch, 0-based */
  int64_t samples;   /* training samples consumed */
  int64_t tokens;    /* training tokens consumed */
  int64_t max_steps; /* planned optimizer steps (0 when unknown) */
  int64_t epochs;    /* planned epochs (0 when unknown) */
  double lr;         /* learning rate of group 0 */
  double loss;       /* loss of the latest step */
  /* (1.1) */
  int64_t skipped_steps;             /* optimizer steps skipped for non-finite values */
  double grad_norm;                  /* pre-clip global grad norm of the latest step (NaN: none) */
  const keel_metric* train_metrics;  /* latest "train" METRICS record (NULL before the first) */
  size_t train_metric_count;
  /* latest evaluation METRICS record, of the set evaluated last (NULL before the first) */
  const keel_metric* eval_metrics;
  size_t eval_metric_count;
} keel_trainer_state;

typedef struct keel_event {
  uint32_t struct_size;
  keel_event_kind kind;
  const keel_trainer_state* state;
  /* METRICS, EVAL_*: "train" or the evaluation set's name ("test" for [data.test], NAME for
   * [data.eval.NAME]); NULL otherwise. */
  const char* split;
  /* METRICS: the record, in a fixed order; NULL otherwise. */
  const keel_metric* metrics;
  size_t metric_count;
  /* CHECKPOINT_SAVED: the committed checkpoint directory; CHECKPOINT_LOADED: the loaded one;
   * NULL otherwise. */
  const char* path;
  /* Out: KEEL_REQUEST_* bits the hook asks for. */
  uint32_t requests;
  /* (1.1) AFTER_DATA: index of the micro-batch within the optimizer step (0-based). */
  int64_t micro_batch;
  /* (1.1) EXCEPTION: the error that ends the run. */
  const char* message;
} keel_event;

typedef struct keel_hook {
  KEEL_INSTANCE_HEADER;
  /* Observes one event; an error ends the run. [setup|train] (CHECKPOINT_LOADED is sent
   * while the run is assembled) */
  keel_status (*on_event)(void* self, keel_event* event, keel_error* err);
  /* (1.1) Optional: tensors holding the hook's state (early stopping's best value, ...), saved
   * with every checkpoint and loaded back into these same tensors, followed by
   * CHECKPOINT_LOADED. Borrowed handles, valid for the instance's life. [setup|train] */
  size_t (*state_count)(void* self);
  keel_status (*state)(void* self, size_t index, const char** name, keel_tensor** tensor,
                       keel_error* err);
  /* (1.12) Optional: the instance's extensions (see "Extensions"); NULL: none. */
  keel_get_extension_fn get_extension;
} keel_hook;

/* ------------------------------------------------------------------------------------------
 * The plugin descriptor
 * ---------------------------------------------------------------------------------------- */

/* Creates one instance. On KEEL_OK, *out_instance points to the kind's instance struct
 * (keel_model, keel_dataset, ...), which the instance's `destroy` frees. [setup] */
typedef keel_status (*keel_factory_fn)(const keel_create_context* ctx, void** out_instance,
                                       keel_error* err);

typedef struct keel_component_desc {
  keel_kind kind;
  const char* name; /* the `type` a manifest uses: unique per kind across loaded plugins */
  const char* description;
  const keel_option_desc* options; /* array of option_count entries, option_size bytes apart */
  uint32_t option_count;
  uint32_t option_size;
  keel_factory_fn create;
} keel_component_desc;

/* Identifies the C++ toolchain a plugin was built with. A plugin that uses LibTorch's C++ API
 * across the boundary (converting handles to at::Tensor) must match the kernel exactly; a
 * plain C plugin sets torch_version to NULL and uses only the host functions. */
typedef struct keel_build_fingerprint {
  const char* torch_version; /* TORCH_VERSION, or NULL for a plain C plugin */
  const char* compiler;      /* e.g. "gcc 12.2.0" (informational) */
  int32_t cxx11_abi;         /* _GLIBCXX_USE_CXX11_ABI, or -1 for a plain C plugin */
} keel_build_fingerprint;

typedef struct keel_plugin_descriptor {
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t struct_size;
  const char* name;
  const char* version;
  const char* description;
  keel_build_fingerprint fingerprint;
  const keel_component_desc* components; /* component_count entries, component_size apart */
  uint32_t component_count;
  uint32_t component_size;
} keel_plugin_descriptor;

/* The entry point. Called once per process, right after the library is loaded. [load] */
typedef const keel_plugin_descriptor* (*keel_plugin_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* KEEL_ABI_H */
