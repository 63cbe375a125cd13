/* Trace recording and replay, end to end: a workload runs with trace:PATH;
 * the trace must hold one row per call, and replaying it under the same
 * configuration must reproduce the recorded allocator's peaks.
 *
 * Freed memory becomes reusable by other streams when simulated device work
 * completes, on the device's own threads, which no replay can time
 * identically. So the exact check runs a workload with no such transition
 * (one stream, reuse:none: a freed block is reused by its stream at once and
 * never moves on its own): peaks and device allocations must be equal. The
 * full workload (two streams, record_stream, an explicit trim) must come
 * within 2%. Both have batches and async requests. A trace started mid-run
 * begins with the allocator's segments and live allocations. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "replay.h"
#include "rng.h"

#define CONF "device:sim,sim_capacity:4G,trim_interval_ms:3600000"

typedef struct counts {
  uint64_t alloc, free, record, batch, submit, complete, trim;
} counts_t;

static gma_t *make(const char *extra) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.ignore_env = 1;
  CHECK_OK(gma_config_parse(&c, CONF));
  if (extra) CHECK_OK(gma_config_parse(&c, extra));
  gma_t *g = NULL;
  CHECK_OK(gma_create(&c, &g));
  return g;
}

/* Single-threaded and waiting for each future at once, so a replay makes the
 * same calls in the same order. */
static void workload(gma_t *g, counts_t *n, gma_stats_t *out, int multi) {
  gma_stream_t s1, s2;
  CHECK_OK(gma_stream_create(g, &s1));
  CHECK_OK(gma_stream_create(g, &s2));
  void *live[256] = {0};
  uint64_t rng = 12345;
  for (int i = 0; i < 4000; i++) {
    int k = (int)(rnd(&rng) % 256);
    if (live[k]) {
      if (multi && rnd(&rng) % 8 == 0) {
        CHECK_OK(gma_record_stream(g, live[k], s2));
        n->record++;
      }
      CHECK_OK(gma_free(g, live[k]));
      n->free++;
      live[k] = NULL;
      continue;
    }
    size_t size = rnd(&rng) % 4 ? 512 + rnd(&rng) % (256 << 10) : (1 << 20) + rnd(&rng) % (24 << 20);
    CHECK_OK(gma_alloc(g, size, !multi ? NULL : k % 2 ? s1 : s2, &live[k]));
    n->alloc++;
    if (i % 500 == 250) {
      size_t sizes[4] = {1000, 70000, 3 << 20, 512};
      void *b[4];
      CHECK_OK(gma_alloc_batch(g, 4, sizes, multi ? s1 : NULL, b));
      n->batch++;
      n->alloc += 4;
      for (int j = 0; j < 4; j++) CHECK_OK(gma_free(g, b[j]));
      n->free += 4;
    }
    if (i % 300 == 100) {
      gma_future_t *f;
      void *p;
      CHECK_OK(gma_alloc_async(g, 8 << 20, multi ? s2 : NULL, NULL, &f));
      CHECK_OK(gma_future_wait(f, 5000000000ull, &p));
      CHECK_OK(gma_future_release(f));
      n->submit++;
      n->complete++;
      CHECK_OK(gma_free(g, p));
      n->free++;
    }
    if (multi && i == 2000) {
      CHECK_OK(gma_stream_synchronize(g, s1));
      CHECK_OK(gma_stream_synchronize(g, s2));
      CHECK_OK(gma_trim(g, 64 << 20));
      n->trim++;
    }
  }
  for (int k = 0; k < 256; k++)
    if (live[k]) {
      CHECK_OK(gma_free(g, live[k]));
      n->free++;
    }
  CHECK_OK(gma_stats(g, out));
  CHECK_OK(gma_stream_destroy(g, s1));
  CHECK_OK(gma_stream_destroy(g, s2));
}

static int within(uint64_t a, uint64_t b, double tol) {
  double d = (double)a - (double)b;
  return (d < 0 ? -d : d) <= tol * (double)b;
}

static void roundtrip(const char *conf, int multi) {
  char path[] = "/tmp/gma-roundtrip-XXXXXX.csv";
  int fd = mkstemps(path, 4);
  CHECK(fd >= 0);
  close(fd);
  char tconf[512];
  snprintf(tconf, sizeof tconf, "%s,trace:%s", conf, path);
  gma_t *g = make(tconf);
  counts_t n = {0};
  gma_stats_t rec = GMA_STATS_INIT;
  workload(g, &n, &rec, multi);
  CHECK_OK(gma_trace_stop(g));
  CHECK_OK(gma_destroy(g));

  char err[512];
  replay_trace_t *t = NULL;
  int loaded = replay_load(path, &t, err, sizeof err);
  unlink(path); /* read: not needed any more, even when a check below fails */
  if (loaded != 0) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  /* One row per call. */
  CHECK(t->count[RA_ALLOCATE] == n.alloc);
  CHECK(t->count[RA_FREE] == n.free);
  CHECK(t->count[RA_RECORD_STREAM] == n.record);
  CHECK(t->count[RA_BATCH] == n.batch);
  CHECK(t->count[RA_ASYNC_SUBMIT] == n.submit && t->count[RA_ASYNC_COMPLETE] == n.complete);
  CHECK(t->count[RA_TRIM] >= n.trim);
  if (rec.address_ranges == 0) { /* ordinary segments: a row per device allocation */
    CHECK(t->count[RA_SEGMENT_ALLOC] == rec.num_device_allocs);
  } else { /* growable (the default): a row per growth, of one or more maps */
    CHECK(t->count[RA_SEGMENT_ALLOC] == 0 && t->count[RA_SEGMENT_MAP] > 0);
    CHECK(t->count[RA_SEGMENT_MAP] <= rec.num_device_allocs);
  }
  CHECK(t->has_recorded && t->recorded_peak == rec.reserved.peak);

  replay_result_t r;
  replay_options_t o = {.device = "sim"};
  if (replay_run(t, conf, &o, &r, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  printf("%s: recorded reserved peak %llu, allocated peak %llu, device allocs %llu\n",
         multi ? "two streams" : "one stream", (unsigned long long)rec.reserved.peak,
         (unsigned long long)rec.allocated.peak, (unsigned long long)rec.num_device_allocs);
  printf("%s: replayed reserved peak %llu, allocated peak %llu, device allocs %llu, %.2fM ev/s\n",
         multi ? "two streams" : "one stream", (unsigned long long)r.peak_reserved,
         (unsigned long long)r.peak_allocated, (unsigned long long)r.device_allocs,
         r.events_per_s / 1e6);
  CHECK(r.failed_allocs == 0 && r.unmatched == 0);
  CHECK(r.recorded_peak_reserved == rec.reserved.peak);
  if (!multi) {
    CHECK(r.peak_reserved == rec.reserved.peak);
    CHECK(r.peak_allocated == rec.allocated.peak);
    CHECK(r.device_allocs == rec.num_device_allocs);
  } else {
    CHECK(within(r.peak_reserved, rec.reserved.peak, 0.02));
    CHECK(within(r.peak_allocated, rec.allocated.peak, 0.02));
  }
  replay_trace_free(t);
}

/* A trace started on an allocator in use (gma_trace_start mid-run) begins
 * with the allocator's state: its segments and live allocations. Its replay
 * then frees no unknown pointer, its peak live bytes are the program's,
 * and the recorded reserved bytes are what the allocator held (before: 4
 * unmatched frees, peak live 8 MiB too low, recorded reserved 0). */
static void started_mid_run(void) {
  char path[] = "/tmp/gma-roundtrip-XXXXXX.csv";
  int fd = mkstemps(path, 4);
  CHECK(fd >= 0);
  close(fd);
  gma_t *g = make("");
  void *held[4], *p;
  for (int i = 0; i < 4; i++) CHECK_OK(gma_alloc(g, (size_t)(i + 1) << 20, NULL, &held[i]));
  CHECK_OK(gma_alloc(g, 3 << 20, NULL, &p));
  CHECK_OK(gma_free(g, p)); /* cached: reserved, not live */
  gma_stats_t before = stats_of(g);
  CHECK_OK(gma_trace_start(g, path));
  CHECK_OK(gma_alloc(g, 6 << 20, NULL, &p));
  for (int i = 0; i < 4; i++) CHECK_OK(gma_free(g, held[i]));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_trace_stop(g));
  CHECK_OK(gma_destroy(g));
  char err[512];
  replay_trace_t *t = NULL;
  int loaded = replay_load(path, &t, err, sizeof err);
  unlink(path);
  if (loaded != 0) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  CHECK(t->count[RA_ALLOCATE] == 5 && t->count[RA_FREE] == 5);
  CHECK(t->peak_live == before.allocated.current + (6 << 20));
  CHECK(t->has_recorded && t->recorded_peak >= before.reserved.current);
  replay_result_t r;
  replay_options_t o = {.device = "sim"};
  if (replay_run(t, CONF, &o, &r, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  printf("started mid-run: %" PRIu64 " unmatched, peak live %" PRIu64 " MiB, recorded reserved "
         "%" PRIu64 " MiB\n", r.unmatched, t->peak_live >> 20, r.recorded_peak_reserved >> 20);
  CHECK(r.unmatched == 0 && r.failed_allocs == 0);
  replay_trace_free(t);
}

int main(void) {
  started_mid_run();
  roundtrip(CONF ",reuse:none", 0);
  roundtrip(CONF, 1);
  printf("test_trace_roundtrip: ok\n");
  return 0;
}
