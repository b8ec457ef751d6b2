#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Model FLOPs utilisation against a fixed hardware peak: the achieved FLOP/s (the model's
 * training FLOPs per sample times samples per second) divided by peak_tflops * 1e12. 0 when the
 * model does not report its FLOPs. */
typedef struct mfu {
  keel_mfu vt; /* first, so that the instance and its slots share one address */
  double peak_flops;
} mfu;

static void destroy(void* self) { free(self); }

static double compute(void* self, double flops_per_sample, double samples_per_second) {
  if (flops_per_sample == 0.0) return 0.0;
  return flops_per_sample * samples_per_second / ((const mfu*)self)->peak_flops;
}

static keel_status create(const keel_create_context* ctx, void** out, keel_error* err) {
  mfu* m = (mfu*)calloc(1, sizeof *m);
  double peak_tflops = 0;
  if (m == NULL) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "out of memory");
    return KEEL_ERR;
  }
  /* Options arrive checked against `options` below (peak_tflops is required). */
  if (!ctx->host->option_float(ctx->options, "peak_tflops", &peak_tflops)) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "option 'peak_tflops' is not a float in the schema");
    free(m);
    return KEEL_ERR;
  }
  m->peak_flops = peak_tflops * 1e12;
  m->vt.struct_size = sizeof m->vt;
  m->vt.self = m;
  m->vt.destroy = destroy;
  m->vt.compute = compute;
  *out = &m->vt;
  return KEEL_OK;
}

/* The option schema: what `keel plugins show @{component}` lists and a manifest may set. Each
 * entry: key, type, default (TOML; NULL: required), help, min, max (inclusive), choices. */
static const keel_option_desc options[] = {
    {"peak_tflops", KEEL_OPT_FLOAT, NULL,
     "peak TFLOP/s of the whole job's hardware (all devices together)", 1e-9, HUGE_VAL, NULL},
};
static const keel_component_desc components[] = {
    {KEEL_KIND_MFU, "@{component}", "@{summary}", options, sizeof options / sizeof options[0],
     sizeof(keel_option_desc), create},
};
