#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Times each phase of the training loop ("data", "forward", "backward", ...) and, at the end of
 * the run, writes one line per phase to `path`: its name, how often it ran and its total
 * seconds, tab-separated, after a header line. A relative path is taken in the run directory;
 * with several ranks, rank N > 0 writes PATH.rankN. It keeps up to MAX_PHASES phases (names up
 * to 31 bytes); further ones are not timed. */
#define MAX_PHASES 32

typedef struct phase {
  char name[32];
  long long calls;
  double seconds;
  double started; /* < 0 while the phase is not running */
} phase;

typedef struct profiler {
  keel_profiler vt; /* first, so that the instance and its slots share one address */
  char* path;
  phase phases[MAX_PHASES];
  int count;
} profiler;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The entry of phase `name`; a new one when `add` is set and the table has room, else NULL. */
static phase* find(profiler* p, const char* name, int add) {
  int i;
  for (i = 0; i < p->count; ++i)
    if (strncmp(p->phases[i].name, name, sizeof p->phases[i].name) == 0) return &p->phases[i];
  if (!add || p->count == MAX_PHASES) return NULL;
  snprintf(p->phases[p->count].name, sizeof p->phases[p->count].name, "%s", name);
  p->phases[p->count].started = -1;
  return &p->phases[p->count++];
}

static void destroy(void* self) {
  profiler* p = (profiler*)self;
  free(p->path);
  free(p);
}

/* begin and end run on every step: keep them cheap. */
static void begin(void* self, const char* name, int64_t step) {
  phase* ph = find((profiler*)self, name, 1);
  (void)step;
  if (ph != NULL) ph->started = now();
}

static void end(void* self, const char* name, int64_t step) {
  phase* ph = find((profiler*)self, name, 0);
  (void)step;
  if (ph == NULL || ph->started < 0) return; /* an end without its begin */
  ph->calls += 1;
  ph->seconds += now() - ph->started;
  ph->started = -1;
}

/* Called once, after a training run that did not fail. */
static keel_status flush(void* self, keel_error* err) {
  const profiler* p = (const profiler*)self;
  FILE* f = fopen(p->path, "w");
  int i, ok;
  if (f == NULL) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "cannot open '%s' for writing: %s", p->path,
             strerror(errno));
    return KEEL_ERR;
  }
  ok = fprintf(f, "phase\tcalls\tseconds\n") > 0;
  for (i = 0; i < p->count && ok; ++i)
    ok = fprintf(f, "%s\t%lld\t%.6f\n", p->phases[i].name, p->phases[i].calls,
                 p->phases[i].seconds) > 0;
  if (fclose(f) != 0 || !ok) {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "writing '%s' failed", p->path);
    return KEEL_ERR;
  }
  return KEEL_OK;
}

static keel_status create(const keel_create_context* ctx, void** out, keel_error* err) {
  /* Options arrive checked against `options` below, with defaults filled in. */
  const char* path = ctx->host->option_string(ctx->options, "path");
  profiler* p;
  size_t size;
  if (path == NULL || path[0] == '\0') {
    snprintf(err->message, KEEL_ERROR_CAPACITY, "path is empty; hint: path = \"phases.tsv\"");
    return KEEL_ERR;
  }
  p = (profiler*)calloc(1, sizeof *p);
  size = strlen(ctx->run_dir) + strlen(path) + 32; /* room for "/" and ".rankN" */
  if (p == NULL || (p->path = (char*)malloc(size)) == NULL) {
    free(p);
    snprintf(err->message, KEEL_ERROR_CAPACITY, "out of memory");
    return KEEL_ERR;
  }
  /* The option string lives only until this factory returns: p->path is a copy. */
  if (path[0] == '/')
    snprintf(p->path, size, "%s", path);
  else
    snprintf(p->path, size, "%s/%s", ctx->run_dir, path);
  if (ctx->rank > 0)
    snprintf(p->path + strlen(p->path), size - strlen(p->path), ".rank%d", (int)ctx->rank);
  p->vt.struct_size = sizeof p->vt;
  p->vt.self = p;
  p->vt.destroy = destroy;
  p->vt.begin = begin;
  p->vt.end = end;
  p->vt.flush = flush;
  *out = &p->vt;
  return KEEL_OK;
}

/* The option schema: what `keel plugins show @{component}` lists and a manifest may set. Each
 * entry: key, type, default (TOML), help, min, max (inclusive; none when min > max), choices. */
static const keel_option_desc options[] = {
    {"path", KEEL_OPT_STRING, "\"phases.tsv\"",
     "file the phase timings are written to (relative: in the run directory)", 1.0, 0.0, NULL},
};
static const keel_component_desc components[] = {
    {KEEL_KIND_PROFILER, "@{component}", "@{summary}", options, sizeof options / sizeof options[0],
     sizeof(keel_option_desc), create},
};
