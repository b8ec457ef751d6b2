#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Stops the run at the first step whose training loss falls below target_loss (0: never). */
typedef struct hook {
  keel_hook vt; /* first, so that the instance and its slots share one address */
  const keel_host* host;
  double target_loss;
} hook;

static void destroy(void* self) { free(self); }

/* Sees every event of the run (keel/abi.h lists them in order); acts on STEP_END only. */
static keel_status on_event(void* self, keel_event* event, keel_error* err) {
  const hook* h = (const hook*)self;
  char line[160];
  (void)err; /* this hook cannot fail */
  if (event->kind != KEEL_EVENT_STEP_END || !(h->target_loss > 0)) return KEEL_OK;
  if (!(event->state->loss < h->target_loss)) return KEEL_OK;
  event->requests |= KEEL_REQUEST_STOP; /* the kernel ends the run after this step */
  snprintf(line, sizeof line, "step %lld: loss %f is below target_loss %f, stopping",
           (long long)event->state->step, event->state->loss, h->target_loss);
  h->host->log(KEEL_LOG_INFO, "@{component}", line);
  return KEEL_OK;
}

static keel_status create(const keel_create_context* ctx, void** out, keel_error* err) {
  hook* h = (hook*)calloc(1, sizeof *h);
  if (h == NULL) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "out of memory");
    return KEEL_ERR;
  }
  /* Options arrive checked against `options` below, with defaults filled in. */
  if (!ctx->host->option_float(ctx->options, "target_loss", &h->target_loss)) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "option 'target_loss' is not a float in the schema");
    free(h);
    return KEEL_ERR;
  }
  h->host = ctx->host;
  h->vt.struct_size = sizeof h->vt;
  h->vt.self = h;
  h->vt.destroy = destroy;
  h->vt.on_event = on_event;
  *out = &h->vt;
  return KEEL_OK;
}

/* The option schema: what `keel plugins show @{component}` lists and a manifest may set. Each
 * entry: key, type, default (TOML), help, min, max (inclusive; none when min > max), choices. */
static const keel_option_desc options[] = {
    {"target_loss", KEEL_OPT_FLOAT, "0.0",
     "stop once a step's training loss is below this (0: never)", 0.0, HUGE_VAL, NULL},
};
static const keel_component_desc components[] = {
    {KEEL_KIND_HOOK, "@{component}", "@{summary}", options, sizeof options / sizeof options[0],
     sizeof(keel_option_desc), create},
};
