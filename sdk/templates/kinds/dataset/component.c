#include <stdio.h>
#include <stdlib.h>

/* 256 points on a 16 x 16 grid in [-1, 1]^2: inputs [x, y] (float32), target 1 where x * y > 0,
 * else 0 (int64). Each epoch visits them in an order shuffled from the run's seed and the epoch
 * alone, so a resumed run sees the same batches. With several ranks, rank r takes every
 * world_size-th sample of that order from position r: 256 / world_size samples each (rounded
 * down). Batches hold batch_size samples, the last of an epoch the rest. */
#define SAMPLES 256

typedef struct dataset {
  keel_dataset vt; /* first, so that the instance and its slots share one address */
  const keel_host* host;
  int64_t batch_size, rank, world_size, per_rank;
  uint64_t seed;
  int order[SAMPLES]; /* this epoch's order of the samples */
  int64_t cursor;     /* this rank's next sample: order[cursor * world_size + rank] */
} dataset;

static void destroy(void* self) { free(self); }

static int64_t size(void* self) { return ((const dataset*)self)->per_rank; }

static int64_t batches_per_epoch(void* self) {
  const dataset* d = (const dataset*)self;
  return (d->per_rank + d->batch_size - 1) / d->batch_size;
}

/* splitmix64: the next pseudo-random number of `state`. */
static uint64_t random_next(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static keel_status start_epoch(void* self, int64_t epoch, keel_error* err) {
  dataset* d = (dataset*)self;
  uint64_t state = d->seed * 1000003u + (uint64_t)epoch;
  int i;
  (void)err; /* cannot fail */
  for (i = 0; i < SAMPLES; ++i) d->order[i] = i;
  for (i = SAMPLES - 1; i > 0; --i) { /* Fisher-Yates shuffle */
    const int j = (int)(random_next(&state) % (uint64_t)(i + 1)), t = d->order[i];
    d->order[i] = d->order[j];
    d->order[j] = t;
  }
  d->cursor = 0;
  return KEEL_OK;
}

static keel_status next(void* self, keel_batch* out, int* has_batch, keel_error* err) {
  dataset* d = (dataset*)self;
  float x[2 * SAMPLES]; /* a batch never holds more than this rank's samples */
  int64_t y[SAMPLES], shape[2], n = d->per_rank - d->cursor, i;
  if (n <= 0) { /* the end of the epoch */
    *has_batch = 0;
    return KEEL_OK;
  }
  if (n > d->batch_size) n = d->batch_size;
  for (i = 0; i < n; ++i) {
    const int s = d->order[(d->cursor + i) * d->world_size + d->rank];
    x[2 * i] = (float)(2 * (s % 16) + 1) / 16 - 1;
    x[2 * i + 1] = (float)(2 * (s / 16) + 1) / 16 - 1;
    y[i] = x[2 * i] * x[2 * i + 1] > 0;
  }
  shape[0] = n;
  shape[1] = 2;
  /* The host copies the buffers into new tensors, which the kernel then owns. */
  out->inputs = d->host->tensor_from_buffer(KEEL_DTYPE_F32, shape, 2, x);
  out->targets = d->host->tensor_from_buffer(KEEL_DTYPE_I64, shape, 1, y);
  if (out->inputs == NULL || out->targets == NULL) {
    d->host->tensor_release(out->inputs);
    d->host->tensor_release(out->targets);
    snprintf(err->message, KEEL_ERROR_CAPACITY, "tensor_from_buffer failed");
    return KEEL_ERR;
  }
  out->samples = out->tokens = n;
  d->cursor += n;
  *has_batch = 1;
  return KEEL_OK;
}

static keel_status create(const keel_create_context* ctx, void** out, keel_error* err) {
  dataset* d = (dataset*)calloc(1, sizeof *d);
  if (d == NULL) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "out of memory");
    return KEEL_ERR;
  }
  /* Options arrive checked against `options` below, with defaults filled in. */
  if (!ctx->host->option_int(ctx->options, "batch_size", &d->batch_size)) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "option 'batch_size' is not an integer in the schema");
    free(d);
    return KEEL_ERR;
  }
  d->host = ctx->host;
  d->seed = ctx->seed;
  d->rank = ctx->rank;
  d->world_size = ctx->world_size;
  d->per_rank = SAMPLES / ctx->world_size;
  start_epoch(d, 0, err);
  d->vt.struct_size = sizeof d->vt;
  d->vt.self = d;
  d->vt.destroy = destroy;
  d->vt.size = size;
  d->vt.batches_per_epoch = batches_per_epoch;
  d->vt.start_epoch = start_epoch;
  d->vt.next = next;
  *out = &d->vt;
  return KEEL_OK;
}

/* The option schema: what `keel plugins show @{component}` lists and a manifest may set. Each
 * entry: key, type, default (TOML), help, min, max (inclusive; none when min > max), choices. */
static const keel_option_desc options[] = {
    {"batch_size", KEEL_OPT_INT, "32", "samples per batch", 1.0, 1e6, NULL},
};
static const keel_component_desc components[] = {
    {KEEL_KIND_DATASET, "@{component}", "@{summary}", options, sizeof options / sizeof options[0],
     sizeof(keel_option_desc), create},
};
