/* A third party's hook in plain C99 that sees the model: it is written against the core hook
 * struct plus one extension, keel.hook.model/1 (<keel/ext/hook_model.h>), and nothing else.
 *
 * Hook `c_model_reader` writes to the file `path`:
 *   attach COUNT                       when the kernel hands it the model's view,
 *   entry I NAME IS_PARAMETER NUMEL    for each of the view's entries,
 *   step S SUM                         at each STEP_END: the sum of every parameter's elements
 *                                      (float32), read through the view's borrowed handles.
 * With bad_eval_weights = true it hands set_eval_weights a tensor of the wrong shape at the
 * first STEP_END and returns the kernel's error: the run must end with one line naming it.
 * tests/sdk/test_sdk_install.sh builds it against the installed SDK and checks both. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/abi.h"
#include "keel/ext/hook_model.h"

typedef struct reader {
  keel_hook vt; /* first, so &r->vt == r */
  const keel_host* host;
  const keel_model_view* view;
  FILE* file;
  int bad_eval_weights;
} reader;

static void destroy(void* self) {
  reader* r = (reader*)self;
  if (r->file != NULL) fclose(r->file);
  free(r);
}

static keel_status attach(void* self, const keel_model_view* view, keel_error* err) {
  reader* r = (reader*)self;
  size_t i, n = view->count(view);
  r->view = view;
  fprintf(r->file, "attach %zu\n", n);
  for (i = 0; i < n; ++i) {
    const char* name = NULL;
    keel_tensor* t = NULL;
    int32_t is_parameter = 0;
    if (view->entry(view, i, &name, &t, &is_parameter, err) != KEEL_OK) return KEEL_ERR;
    fprintf(r->file, "entry %zu %s %d %lld\n", i, name, (int)is_parameter,
            (long long)r->host->tensor_numel(t));
  }
  return KEEL_OK;
}

static const keel_hook_model kModelExtension = {sizeof(keel_hook_model), attach};

static const void* get_extension(void* self, const char* id) {
  (void)self;
  return strcmp(id, KEEL_EXT_HOOK_MODEL) == 0 ? &kModelExtension : NULL;
}

static keel_status on_event(void* self, keel_event* ev, keel_error* err) {
  reader* r = (reader*)self;
  const keel_model_view* v = r->view;
  double sum = 0;
  size_t i, n;
  if (ev->kind != KEEL_EVENT_STEP_END) return KEEL_OK;
  if (v == NULL) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "no model view: attach was never called");
    return KEEL_ERR;
  }
  n = v->count(v);
  if (r->bad_eval_weights) {
    int64_t shape[1] = {1};
    keel_tensor* wrong = r->host->tensor_from_buffer(KEEL_DTYPE_F32, shape, 1, NULL);
    keel_tensor** all = (keel_tensor**)calloc(n, sizeof *all);
    keel_status st;
    for (i = 0; i < n; ++i) all[i] = wrong;
    st = v->set_eval_weights(v, all, n, err); /* KEEL_ERR, with the kernel's message */
    free(all);
    r->host->tensor_release(wrong);
    if (st != KEEL_OK) return st;
  }
  for (i = 0; i < n; ++i) {
    const char* name = NULL;
    keel_tensor* t = NULL;
    keel_tensor* cpu;
    const float* x;
    int32_t is_parameter = 0;
    int64_t k, numel;
    if (v->entry(v, i, &name, &t, &is_parameter, err) != KEEL_OK) return KEEL_ERR;
    if (!is_parameter || r->host->tensor_dtype(t) != KEEL_DTYPE_F32) continue;
    cpu = r->host->tensor_contiguous_cpu(t);
    x = (const float*)r->host->tensor_cpu_data(cpu);
    numel = r->host->tensor_numel(cpu);
    for (k = 0; k < numel; ++k) sum += x[k];
    r->host->tensor_release(cpu);
  }
  fprintf(r->file, "step %lld %.17g\n", (long long)ev->state->step, sum);
  fflush(r->file);
  return KEEL_OK;
}

static keel_status create(const keel_create_context* ctx, void** out, keel_error* err) {
  const char* path = ctx->host->option_string(ctx->options, "path");
  reader* r = (reader*)calloc(1, sizeof *r);
  if (r == NULL) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "out of memory");
    return KEEL_ERR;
  }
  r->host = ctx->host;
  ctx->host->option_bool(ctx->options, "bad_eval_weights", &r->bad_eval_weights);
  r->file = fopen(path, "w");
  if (r->file == NULL) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "cannot open '%s' for writing", path);
    free(r);
    return KEEL_ERR;
  }
  r->vt.struct_size = sizeof r->vt;
  r->vt.self = r;
  r->vt.destroy = destroy;
  r->vt.on_event = on_event;
  r->vt.get_extension = get_extension; /* (1.12) */
  *out = &r->vt;
  return KEEL_OK;
}

static const keel_option_desc options[] = {
    {"path", KEEL_OPT_STRING, NULL, "file the hook writes", 0, 0, NULL},
    {"bad_eval_weights", KEEL_OPT_BOOL, "false",
     "hand set_eval_weights a tensor of the wrong shape at the first step", 0, 0, NULL},
};
static const keel_component_desc components[] = {
    {KEEL_KIND_HOOK, "c_model_reader", "writes the model's entries and its parameters' sum",
     options, 2, sizeof(keel_option_desc), create},
};
static const keel_plugin_descriptor descriptor = {
    .abi_major = KEEL_ABI_MAJOR,
    .abi_minor = KEEL_ABI_MINOR,
    .struct_size = sizeof(keel_plugin_descriptor),
    .name = "test-model-reader",
    .version = "0.1.0",
    .description = "plain C hook that reads the model (extension keel.hook.model/1)",
    .fingerprint = {NULL, "c", -1},
    .components = components,
    .component_count = 1,
    .component_size = sizeof(keel_component_desc),
};

KEEL_EXPORT const keel_plugin_descriptor* keel_plugin_entry(void) { return &descriptor; }
