/* gma-bench-alloc: the cost of an alloc+free pair on gma's pool against the
 * same pair made directly on the device with no caching (the device
 * boundary's mem_alloc/mem_free on a simulated device configured alike), both
 * measured in this process, interleaved batch by batch so drift in the
 * machine hits both sides alike.
 *
 * Scenarios: one size (4 KiB), one size (2 MiB), seeded random sizes from
 * 512 B to 8 MiB, and 4 streams used round-robin. Each side runs one warm-up
 * batch, then --reps timed batches of --pairs pairs; per side it reports the
 * median and p99 (nearest rank across batches) of ns per pair, and the ratio
 * baseline/gma of the medians. --device-latency-ns N makes every device
 * allocation and free take N ns on both sides, to model cudaMalloc's cost
 * (which is what a caching allocator exists to avoid); the default 0 measures
 * gma's own overhead against a bare mmap/munmap.
 *
 * It checks statuses only: correctness belongs to the tests. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/device.h"
#define BENCH_NAME "gma-bench-alloc"
#include "benchkit.h"
#include "gma.h"

#define MAX_STREAMS 4

typedef struct options {
  int pairs;              /* pairs per batch */
  int reps;               /* timed batches per side */
  uint64_t seed;          /* for the mixed sizes */
  uint64_t latency_ns;    /* device alloc and free latency, both sides */
  const char *json_path;
} options_t;

typedef struct scenario {
  const char *name;
  size_t fixed_size; /* 0: seeded random sizes */
  int nstreams;      /* 0: the default stream */
} scenario_t;

/* One side's measurements. */
typedef struct side {
  int pairs;          /* pairs per batch (the baseline may run fewer, see below) */
  double *ns_per_pair; /* one per batch */
  double median, p99;
} side_t;

typedef struct result {
  const scenario_t *sc;
  side_t pool, direct;
  double ratio; /* direct median / pool median */
  gma_stats_t stats;
} result_t;

/* Median and nearest-rank p99 of n values (sorts a copy). */
static void summarize(side_t *s, int n) {
  double *v = malloc((size_t)n * sizeof *v);
  if (!v) die("out of host memory", GMA_ERR_INTERNAL);
  memcpy(v, s->ns_per_pair, (size_t)n * sizeof *v);
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  s->median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  int rank = (int)((99 * (long)n + 99) / 100); /* ceil(0.99 n), 1-based */
  s->p99 = v[rank - 1];
  free(v);
}

static gma_config_t sim_config(const options_t *o) {
  gma_config_t c = {.size = sizeof(gma_config_t)};
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1; /* the run is described by its options alone */
  c.sim_capacity = 80ull << 30;
  c.sim_alloc_latency_ns = o->latency_ns;
  c.sim_free_latency_ns = o->latency_ns;
  return c;
}

/* One batch on the pool: n pairs, sizes[i] on streams[i % nstreams]. */
static uint64_t batch_pool(gma_t *g, const size_t *sizes, int n, gma_stream_t *streams,
                           int nstreams) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < n; i++) {
    void *p;
    gma_status_t st = gma_alloc(g, sizes[i], streams[i % nstreams], &p);
    if (st != GMA_OK) die("gma_alloc", st);
    st = gma_free(g, p);
    if (st != GMA_OK) die("gma_free", st);
  }
  return now_ns() - t0;
}

/* One batch straight on the device: what a program without a caching
 * allocator pays (cudaMalloc/cudaFree). Sizes are rounded to 512 as gma does,
 * so both sides ask the device for comparable amounts. */
static uint64_t batch_direct(gma__device_t *dev, const size_t *sizes, int n) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < n; i++) {
    uint64_t size = (sizes[i] + 511) / 512 * 512;
    uintptr_t addr;
    gma_status_t st = dev->ops->mem_alloc(dev, size, &addr);
    if (st != GMA_OK) die("device mem_alloc", st);
    st = dev->ops->mem_free(dev, addr, size);
    if (st != GMA_OK) die("device mem_free", st);
  }
  return now_ns() - t0;
}

static void run_scenario(const options_t *o, const scenario_t *sc, result_t *r) {
  size_t *sizes = malloc((size_t)o->pairs * sizeof *sizes);
  if (!sizes) die("out of host memory", GMA_ERR_INTERNAL);
  uint64_t rng = o->seed ? o->seed : 1;
  for (int i = 0; i < o->pairs; i++) {
    if (sc->fixed_size) {
      sizes[i] = sc->fixed_size;
    } else {
      /* Log-uniform over 512 B .. 8 MiB: most requests small, a few large,
       * as in a model's activations. */
      unsigned bits = 9 + (unsigned)(xorshift(&rng) % 14); /* 2^9 .. 2^22 */
      size_t lo = (size_t)1 << bits;
      sizes[i] = lo + (size_t)(xorshift(&rng) % lo); /* [lo, 2 lo) */
    }
  }

  gma_config_t c = sim_config(o);
  gma_t *g = NULL;
  gma_status_t st = gma_create(&c, &g);
  if (st != GMA_OK) die("gma_create", st);
  gma_stream_t streams[MAX_STREAMS] = {NULL};
  int nstreams = sc->nstreams ? sc->nstreams : 1;
  for (int i = 0; i < sc->nstreams; i++) {
    st = gma_stream_create(g, &streams[i]);
    if (st != GMA_OK) die("gma_stream_create", st);
  }
  gma__device_t *dev = NULL;
  st = gma__sim_create(&c, &dev);
  if (st != GMA_OK) die("gma__sim_create", st);

  /* The baseline can cost far more per pair than the pool (with a device
   * latency, about 2*latency plus the host's sleep overshoot): a probe sizes
   * its batches to about 100 ms so the default run stays short. Per-pair
   * numbers are comparable across batch sizes. */
  r->sc = sc;
  r->pool.pairs = o->pairs;
  int probe = o->pairs < 32 ? o->pairs : 32;
  double probe_ns = (double)batch_direct(dev, sizes, probe) / probe;
  double fit = 100e6 / (probe_ns > 1 ? probe_ns : 1);
  r->direct.pairs = fit >= o->pairs ? o->pairs : fit < 16 ? 16 : (int)fit;
  r->pool.ns_per_pair = calloc((size_t)o->reps, sizeof(double));
  r->direct.ns_per_pair = calloc((size_t)o->reps, sizeof(double));
  if (!r->pool.ns_per_pair || !r->direct.ns_per_pair) die("out of host memory", GMA_ERR_INTERNAL);

  /* Warm-up: the pool grows its segments, the host maps its pages. */
  batch_pool(g, sizes, o->pairs, streams, nstreams);
  batch_direct(dev, sizes, r->direct.pairs);
  for (int rep = 0; rep < o->reps; rep++) {
    r->pool.ns_per_pair[rep] =
        (double)batch_pool(g, sizes, o->pairs, streams, nstreams) / o->pairs;
    r->direct.ns_per_pair[rep] =
        (double)batch_direct(dev, sizes, r->direct.pairs) / r->direct.pairs;
  }
  summarize(&r->pool, o->reps);
  summarize(&r->direct, o->reps);
  r->ratio = r->pool.median > 0 ? r->direct.median / r->pool.median : 0;

  r->stats = (gma_stats_t){.size = sizeof(gma_stats_t)};
  st = gma_stats(g, &r->stats);
  if (st != GMA_OK) die("gma_stats", st);

  dev->ops->destroy(dev);
  for (int i = 0; i < sc->nstreams; i++) {
    st = gma_stream_destroy(g, streams[i]);
    if (st != GMA_OK) die("gma_stream_destroy", st);
  }
  st = gma_destroy(g);
  if (st != GMA_OK) die("gma_destroy", st);
  free(sizes);
}

static void write_json(const options_t *o, const result_t *res, int n) {
  FILE *f = fopen(o->json_path, "w");
  if (!f) {
    perror(o->json_path);
    exit(1);
  }
  fprintf(f, "{\n  \"benchmark\": \"gma-bench-alloc\",\n");
  fprintf(f,
          "  \"config\": {\"gma_version\": \"%s\", \"build_type\": \"%s\", \"gma_debug\": %d, "
          "\"device\": \"sim\", \"pairs_per_batch\": %d, \"reps\": %d, \"seed\": %" PRIu64
          ", \"device_latency_ns\": %" PRIu64 ", \"sim_capacity\": %llu, "
          "\"baseline\": \"device mem_alloc/mem_free, no caching\", "
          "\"p99\": \"nearest rank across batches\"},\n",
          gma_version(), GMA_BENCH_BUILD_TYPE, GMA_DEBUG, o->pairs, o->reps, o->seed,
          o->latency_ns, 80ull << 30);
  fprintf(f, "  \"scenarios\": [\n");
  for (int i = 0; i < n; i++) {
    const result_t *r = &res[i];
    fprintf(f, "    {\"name\": \"%s\", \"size\": %zu, \"streams\": %d,\n", r->sc->name,
            r->sc->fixed_size, r->sc->nstreams ? r->sc->nstreams : 1);
    const side_t *sides[2] = {&r->pool, &r->direct};
    const char *names[2] = {"gma", "direct"};
    for (int s = 0; s < 2; s++) {
      fprintf(f, "     \"%s\": {\"pairs_per_batch\": %d, \"median_ns_per_pair\": %.1f, "
                 "\"p99_ns_per_pair\": %.1f, \"batches_ns_per_pair\": [",
              names[s], sides[s]->pairs, sides[s]->median, sides[s]->p99);
      for (int k = 0; k < o->reps; k++)
        fprintf(f, "%s%.1f", k ? ", " : "", sides[s]->ns_per_pair[k]);
      fprintf(f, "]},\n");
    }
    const gma_stats_t *st = &r->stats;
    fprintf(f,
            "     \"gma_stats\": {\"num_allocs\": %" PRIu64 ", \"hits_bin\": %" PRIu64
            ", \"hits_stream\": %" PRIu64
            ", \"hits_pool\": %" PRIu64 ", \"hits_device\": %" PRIu64
            ", \"num_device_allocs\": %" PRIu64 ", \"reserved_peak\": %" PRIu64 "},\n",
            st->num_allocs, st->hits_bin, st->hits_stream, st->hits_pool, st->hits_device,
            st->num_device_allocs, st->reserved.peak);
    fprintf(f, "     \"ratio_direct_over_gma\": %.2f}%s\n", r->ratio, i + 1 < n ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
}

static void usage(void) {
  fprintf(stderr,
          "usage: gma-bench-alloc [--pairs N] [--reps N] [--seed N] [--device-latency-ns N]\n"
          "                       [--json PATH]\n"
          "  --pairs N              alloc+free pairs per batch (default 10000)\n"
          "  --reps N               timed batches per side (default 15)\n"
          "  --seed N               seed of the mixed sizes (default 42)\n"
          "  --device-latency-ns N  cost of each device alloc and free, both sides (default 0)\n"
          "  --json PATH            where to write the results (default bench_alloc.json)\n");
  exit(2);
}

static uint64_t parse_u64(const char *s) {
  char *end;
  unsigned long long v = strtoull(s, &end, 0);
  if (*s == '\0' || *s == '-' || *end != '\0') usage();
  return v;
}

int main(int argc, char **argv) {
  options_t o = {.pairs = 10000, .reps = 15, .seed = 42, .json_path = "bench_alloc.json"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc) usage();
    if (strcmp(a, "--pairs") == 0)
      o.pairs = (int)parse_u64(argv[++i]);
    else if (strcmp(a, "--reps") == 0)
      o.reps = (int)parse_u64(argv[++i]);
    else if (strcmp(a, "--seed") == 0)
      o.seed = parse_u64(argv[++i]);
    else if (strcmp(a, "--device-latency-ns") == 0)
      o.latency_ns = parse_u64(argv[++i]);
    else if (strcmp(a, "--json") == 0)
      o.json_path = argv[++i];
    else
      usage();
  }
  if (o.pairs < 1 || o.reps < 1) usage();

  static const scenario_t scenarios[] = {
      {"same size 4 KiB", 4 * KiB, 0},
      {"same size 2 MiB", 2 * MiB, 0},
      {"mixed 512 B - 8 MiB", 0, 0},
      {"4 streams round-robin 64 KiB", 64 * KiB, 4},
  };
  enum { NSC = sizeof scenarios / sizeof scenarios[0] };
  result_t res[NSC];
  memset(res, 0, sizeof res);

  printf("gma-bench-alloc: gma %s, %s build (GMA_DEBUG=%d), simulated device\n", gma_version(),
         GMA_BENCH_BUILD_TYPE, GMA_DEBUG);
  printf("  %d pairs per batch, %d batches, seed %" PRIu64 ", device latency %" PRIu64
         " ns per alloc and per free\n",
         o.pairs, o.reps, o.seed, o.latency_ns);
  if (GMA_DEBUG > 0)
    printf("  note: GMA_DEBUG>0 validates the pool on every call; use a Release build for "
           "numbers to quote\n");
  for (int i = 0; i < NSC; i++) run_scenario(&o, &scenarios[i], &res[i]);

  printf("\n%-30s %10s %10s %12s %12s %11s %9s\n", "scenario (ns per alloc+free)", "gma med",
         "gma p99", "direct med", "direct p99", "direct/gma", "direct n");
  for (int i = 0; i < NSC; i++) {
    const result_t *r = &res[i];
    printf("%-30s %10.0f %10.0f %12.0f %12.0f %10.1fx %9d\n", r->sc->name, r->pool.median,
           r->pool.p99, r->direct.median, r->direct.p99, r->ratio, r->direct.pairs);
  }
  printf("(median and p99 across %d batches; direct n: pairs per baseline batch, sized to "
         "~100 ms)\n",
         o.reps);
  printf("\n%-30s %10s %10s %10s %10s %12s\n", "gma hits (incl. warm-up)", "bin", "stream", "pool",
         "device", "device allocs");
  for (int i = 0; i < NSC; i++) {
    const gma_stats_t *s = &res[i].stats;
    printf("%-30s %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %12" PRIu64 "\n",
           res[i].sc->name, s->hits_bin, s->hits_stream, s->hits_pool, s->hits_device,
           s->num_device_allocs);
  }
  write_json(&o, res, NSC);
  printf("\nwrote %s\n", o.json_path);
  for (int i = 0; i < NSC; i++) {
    free(res[i].pool.ns_per_pair);
    free(res[i].direct.ns_per_pair);
  }
  return 0;
}
