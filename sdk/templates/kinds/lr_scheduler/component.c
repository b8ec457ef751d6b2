#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Exponential decay: the learning rate of every parameter group is its base rate times
 * gamma^step. */
typedef struct scheduler {
  keel_lr_scheduler vt; /* first, so that the instance and its slots share one address */
  double gamma;
} scheduler;

static void destroy(void* self) { free(self); }

/* The multiplier at optimizer step `step` (0-based): a pure function of the step. */
static double factor(void* self, int64_t step) {
  return pow(((const scheduler*)self)->gamma, (double)step);
}

static keel_status create(const keel_create_context* ctx, void** out, keel_error* err) {
  scheduler* s = (scheduler*)calloc(1, sizeof *s);
  if (s == NULL) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "out of memory");
    return KEEL_ERR;
  }
  /* Options arrive checked against `options` below, with defaults filled in. */
  if (!ctx->host->option_float(ctx->options, "gamma", &s->gamma)) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "option 'gamma' is not a float in the schema");
    free(s);
    return KEEL_ERR;
  }
  s->vt.struct_size = sizeof s->vt;
  s->vt.self = s;
  s->vt.destroy = destroy;
  s->vt.factor = factor;
  *out = &s->vt;
  return KEEL_OK;
}

/* The option schema: what `keel plugins show @{component}` lists and a manifest may set. Each
 * entry: key, type, default (TOML), help, min, max (inclusive; none when min > max), choices. */
static const keel_option_desc options[] = {
    {"gamma", KEEL_OPT_FLOAT, "0.999",
     "the learning rate is multiplied by gamma after every optimizer step", 0.0, 1.0, NULL},
};
static const keel_component_desc components[] = {
    {KEEL_KIND_LR_SCHEDULER, "@{component}", "@{summary}", options,
     sizeof options / sizeof options[0], sizeof(keel_option_desc), create},
};
