/* Tests the built-in synthetic workloads (tools/replay/synth.c): each one,
 * with two seeds, is written to memory and parsed back against the trace
 * format (README: "Traces: the CSV format") and the rules a replayer relies
 * on: pointers 512-aligned and unique while live, frees and record_streams of
 * live pointers on the allocation's stream, futures completed once after
 * their submit, batch rows followed by their allocates, nothing live at the
 * end, output repeatable per seed. Then the dp workload (allocate, free,
 * record_stream only) is replayed on a real gma allocator on the simulated
 * device, which must accept every call and end with nothing allocated. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* open_memstream */
#endif
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "synth.h"

static const char kHeader[] = "Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status";

/* --------------------------------------------------------------------------
 * A map from trace pointer (or future id) to what we know of it: linear
 * probing with backward-shift deletion, keys nonzero.
 * ------------------------------------------------------------------------ */
typedef struct ent {
  uint64_t key, size, stream;
  void *real;
} ent_t;

typedef struct map {
  ent_t *e;
  size_t cap, n;
} map_t;

static size_t hash64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return (size_t)k;
}

static ent_t *map_find(map_t *m, uint64_t key) {
  if (!m->cap) return NULL;
  for (size_t i = hash64(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (m->e[i].key == key) return &m->e[i];
    if (!m->e[i].key) return NULL;
  }
}

static ent_t *map_add(map_t *m, uint64_t key) {
  if (2 * (m->n + 1) > m->cap) {
    map_t bigger = {calloc(m->cap ? 2 * m->cap : 1024, sizeof(ent_t)), m->cap ? 2 * m->cap : 1024,
                    0};
    CHECK(bigger.e);
    for (size_t i = 0; i < m->cap; i++)
      if (m->e[i].key) *map_add(&bigger, m->e[i].key) = m->e[i];
    free(m->e);
    *m = bigger;
  }
  size_t i = hash64(key) & (m->cap - 1);
  while (m->e[i].key) i = (i + 1) & (m->cap - 1);
  m->e[i] = (ent_t){.key = key};
  m->n++;
  return &m->e[i];
}

static void map_del(map_t *m, ent_t *e) {
  size_t i = (size_t)(e - m->e), j = i;
  m->e[i].key = 0;
  m->n--;
  for (;;) {
    j = (j + 1) & (m->cap - 1);
    if (!m->e[j].key) return;
    size_t home = hash64(m->e[j].key) & (m->cap - 1);
    /* Move e[j] into the hole at i unless its home lies cyclically in (i, j]. */
    int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      m->e[i] = m->e[j];
      m->e[j].key = 0;
      i = j;
    }
  }
}

static void map_free(map_t *m) {
  free(m->e);
  *m = (map_t){0};
}

/* --------------------------------------------------------------------------
 * Rows
 * ------------------------------------------------------------------------ */
typedef struct row {
  uint64_t thread, t_ns, ptr, size, stream, block, id, count;
  char action[32];
} row_t;

static int parse_dec(const char *s, uint64_t *v) {
  if (!*s) return 0;
  uint64_t x = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return 0;
    x = x * 10 + (uint64_t)(*s - '0');
  }
  *v = x;
  return 1;
}

static int parse_hex(const char *s, uint64_t *v) {
  if (s[0] != '0' || s[1] != 'x' || !s[2]) return 0;
  uint64_t x = 0;
  for (s += 2; *s; s++) {
    int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
    if (d < 0) return 0;
    x = x * 16 + (uint64_t)d;
  }
  *v = x;
  return 1;
}

/* "S.NNNNNNNNN" with exactly 9 decimals. */
static int parse_time(const char *s, uint64_t *ns) {
  const char *dot = strchr(s, '.');
  if (!dot || strlen(dot + 1) != 9) return 0;
  char secs[32];
  size_t n = (size_t)(dot - s);
  if (n == 0 || n >= sizeof secs) return 0;
  memcpy(secs, s, n);
  secs[n] = 0;
  uint64_t a, b;
  if (!parse_dec(secs, &a) || !parse_dec(dot + 1, &b)) return 0;
  *ns = a * 1000000000ull + b;
  return 1;
}

/* Splits line (modified in place) into a row; 0 with a reason on a bad one. */
static int parse_row(char *line, row_t *r, const char **why) {
  char *f[11];
  int n = 0;
  f[n++] = line;
  for (char *p = line; *p; p++)
    if (*p == ',') {
      *p = 0;
      if (n == 11) break;
      f[n++] = p + 1;
    }
  if (n != 10) return *why = "row does not have 10 fields", 0;
  if (!parse_dec(f[0], &r->thread)) return *why = "bad Thread", 0;
  if (!parse_time(f[1], &r->t_ns)) return *why = "bad Time (want seconds with 9 decimals)", 0;
  if (strlen(f[2]) >= sizeof r->action) return *why = "bad Action", 0;
  strcpy(r->action, f[2]);
  if (!parse_hex(f[3], &r->ptr)) return *why = "bad Pointer", 0;
  if (!parse_dec(f[4], &r->size)) return *why = "bad Size", 0;
  if (!parse_hex(f[5], &r->stream)) return *why = "bad Stream", 0;
  if (!parse_dec(f[6], &r->block)) return *why = "bad Block", 0;
  if (!parse_dec(f[7], &r->id)) return *why = "bad Id", 0;
  if (!parse_dec(f[8], &r->count)) return *why = "bad Count", 0;
  if (*f[9]) return *why = "Status not empty in a synthetic trace", 0;
  return 1;
}

/* --------------------------------------------------------------------------
 * Writing and checking a workload
 * ------------------------------------------------------------------------ */
typedef struct trace {
  char *buf;
  size_t len;
} trace_t;

static trace_t gen(const char *name, double scale, uint64_t seed) {
  trace_t t = {0};
  FILE *f = open_memstream(&t.buf, &t.len);
  CHECK(f);
  char err[256] = "";
  int rc = gma_synth_write(name, f, scale, seed, err, sizeof err);
  if (rc != 0) fprintf(stderr, "gma_synth_write(%s): %s\n", name, err);
  CHECK(rc == 0);
  CHECK(fclose(f) == 0);
  return t;
}

typedef struct summary {
  uint64_t rows, allocs, frees, records, submits, completes, batches, batch_allocs, idles;
  uint64_t idle_ns, idle_min_ns, idle_max_ns, end_ns;
  uint64_t live_bytes, peak_live_bytes, max_size;
  uint64_t streams[16];
  int nstreams;
  uint64_t max_thread;
} summary_t;

#define TRACE_FAIL(why)                                                                       \
  do {                                                                                        \
    fprintf(stderr, "%s seed %" PRIu64 " line %zu: %s\n  row: %s\n", name, seed, lineno, why, \
            copy);                                                                            \
    exit(1);                                                                                  \
  } while (0)

/* Parses the whole trace and checks every rule; returns what it saw. */
static summary_t check_trace(const trace_t *t, const char *name, uint64_t seed) {
  summary_t s = {0};
  s.idle_min_ns = UINT64_MAX;
  map_t live = {0}, futures = {0}, ids_seen = {0};
  char *text = malloc(t->len + 1);
  CHECK(text);
  memcpy(text, t->buf, t->len);
  text[t->len] = 0;
  CHECK(t->len > 0 && text[t->len - 1] == '\n');

  uint64_t last_t = 0, batch_id = 0, batch_left = 0;
  size_t lineno = 0;
  char copy[512];
  for (char *line = text, *nl; *line; line = nl + 1) {
    nl = strchr(line, '\n');
    CHECK(nl);
    *nl = 0;
    lineno++;
    snprintf(copy, sizeof copy, "%s", line);
    if (lineno == 1) {
      if (strcmp(line, kHeader) != 0) TRACE_FAIL("header differs from the README's");
      continue;
    }
    row_t r;
    const char *why = NULL;
    if (!parse_row(line, &r, &why)) TRACE_FAIL(why);
    s.rows++;
    if (r.t_ns < last_t) TRACE_FAIL("Time goes backwards");
    last_t = r.t_ns;
    if (r.block != 0) TRACE_FAIL("Block is not 0");
    if (r.thread > s.max_thread) s.max_thread = r.thread;
    int known = 0;
    for (int i = 0; i < s.nstreams; i++) known |= s.streams[i] == r.stream;
    if (!known && strcmp(r.action, "idle") != 0) {
      if (s.nstreams == 16) TRACE_FAIL("more than 16 streams");
      s.streams[s.nstreams++] = r.stream;
    }
    if (batch_left && strcmp(r.action, "allocate") != 0)
      TRACE_FAIL("a batch is followed by fewer allocate rows than its Count");

    if (!strcmp(r.action, "allocate") || !strcmp(r.action, "async_complete")) {
      int complete = r.action[0] == 'a' && r.action[1] == 's';
      if (!r.ptr || r.ptr % 512) TRACE_FAIL("pointer is zero or not 512-aligned");
      if (!r.size || r.size % 512) TRACE_FAIL("size is zero or not a multiple of 512");
      if (map_find(&live, r.ptr)) TRACE_FAIL("pointer handed out while still live");
      if (r.count) TRACE_FAIL("Count set on an allocation");
      if (complete) {
        ent_t *f = map_find(&futures, r.id);
        if (!r.id || !f) TRACE_FAIL("async_complete of an Id not submitted (or completed twice)");
        if (f->size != r.size || f->stream != r.stream)
          TRACE_FAIL("async_complete's Size/Stream differ from its async_submit's");
        map_del(&futures, f);
        s.completes++;
      } else if (batch_left) {
        if (r.id != batch_id) TRACE_FAIL("batch allocate with another Id than its batch row");
        batch_left--;
        s.batch_allocs++;
      } else if (r.id) {
        TRACE_FAIL("Id set on an allocate outside a batch");
      }
      ent_t *e = map_add(&live, r.ptr);
      e->size = r.size;
      e->stream = r.stream;
      s.allocs++;
      s.live_bytes += r.size;
      if (s.live_bytes > s.peak_live_bytes) s.peak_live_bytes = s.live_bytes;
      if (r.size > s.max_size) s.max_size = r.size;
    } else if (!strcmp(r.action, "free")) {
      ent_t *e = map_find(&live, r.ptr);
      if (!e) TRACE_FAIL("free of a pointer that is not live");
      if (e->stream != r.stream) TRACE_FAIL("free's Stream is not the allocation's stream");
      if (e->size != r.size) TRACE_FAIL("free's Size is not the allocation's size");
      if (r.id || r.count) TRACE_FAIL("Id/Count set on a free");
      s.live_bytes -= e->size;
      map_del(&live, e);
      s.frees++;
    } else if (!strcmp(r.action, "record_stream")) {
      ent_t *e = map_find(&live, r.ptr);
      if (!e) TRACE_FAIL("record_stream of a pointer that is not live");
      if (e->stream == r.stream) TRACE_FAIL("record_stream names the allocation's own stream");
      s.records++;
    } else if (!strcmp(r.action, "async_submit")) {
      if (!r.id || map_find(&ids_seen, r.id)) TRACE_FAIL("async_submit Id zero or reused");
      if (r.ptr) TRACE_FAIL("async_submit with a Pointer");
      if (!r.size || r.size % 512) TRACE_FAIL("async_submit size zero or not a multiple of 512");
      map_add(&ids_seen, r.id);
      ent_t *f = map_add(&futures, r.id);
      f->size = r.size;
      f->stream = r.stream;
      s.submits++;
    } else if (!strcmp(r.action, "batch")) {
      if (!r.id || map_find(&ids_seen, r.id)) TRACE_FAIL("batch Id zero or reused");
      if (!r.count) TRACE_FAIL("batch with Count 0");
      map_add(&ids_seen, r.id);
      batch_id = r.id;
      batch_left = r.count;
      s.batches++;
    } else if (!strcmp(r.action, "idle")) {
      if (!r.size) TRACE_FAIL("idle of 0 ns");
      s.idles++;
      s.idle_ns += r.size;
      if (r.size < s.idle_min_ns) s.idle_min_ns = r.size;
      if (r.size > s.idle_max_ns) s.idle_max_ns = r.size;
    } else {
      TRACE_FAIL("unknown Action");
    }
  }
  if (batch_left) TRACE_FAIL("trace ends inside a batch");
  if (live.n) TRACE_FAIL("allocations still live at the end of the trace");
  if (futures.n) TRACE_FAIL("futures submitted and never completed");
  if (s.live_bytes) TRACE_FAIL("live bytes left at the end");
  s.end_ns = last_t;
  map_free(&live);
  map_free(&futures);
  map_free(&ids_seen);
  free(text);
  return s;
}

static int has_stream(const summary_t *s, uint64_t stream) {
  for (int i = 0; i < s->nstreams; i++)
    if (s->streams[i] == stream) return 1;
  return 0;
}

static void print_summary(const char *name, uint64_t seed, const summary_t *s) {
  printf("%-8s seed %-3" PRIu64 " %7" PRIu64 " rows  %6" PRIu64 " allocs (%" PRIu64
         " in %" PRIu64 " batches, %" PRIu64 " async)  %5" PRIu64 " record_stream  %d streams"
         "  peak live %.1f MiB  largest %.1f MiB  %.3f s simulated",
         name, seed, s->rows, s->allocs, s->batch_allocs, s->batches, s->completes, s->records,
         s->nstreams, s->peak_live_bytes / 1048576.0, s->max_size / 1048576.0, s->end_ns / 1e9);
  if (s->idles)
    printf("  %" PRIu64 " idle rows (%.0f-%.0f ms, %.0f ms in all)", s->idles, s->idle_min_ns / 1e6,
           s->idle_max_ns / 1e6, s->idle_ns / 1e6);
  printf("\n");
}

static void check_workload(const char *name) {
  const uint64_t seeds[2] = {1, 42};
  trace_t first[2];
  uint64_t rows_seed1 = 0;
  CHECK(gma_synth_describe(name) != NULL && strlen(gma_synth_describe(name)) > 10);
  for (int k = 0; k < 2; k++) {
    uint64_t seed = seeds[k];
    first[k] = gen(name, 1.0, seed);
    summary_t s = check_trace(&first[k], name, seed);
    print_summary(name, seed, &s);
    if (k == 0) rows_seed1 = s.rows;
    /* Default size: roughly 50k-200k events. */
    CHECK(s.rows >= 50000 && s.rows <= 200000);
    CHECK(s.allocs == s.frees);
    CHECK(s.max_size >= 100 * 1048576ull); /* some tensors of hundreds of MiB */
    if (!strcmp(name, "dp")) {
      CHECK(s.records > 0);
      CHECK(s.nstreams == 3 && has_stream(&s, 0) && has_stream(&s, 0x1000) &&
            has_stream(&s, 0x2000));
      CHECK(s.submits == 0 && s.batches == 0 && s.idles == 0 && s.max_thread == 0);
    } else if (!strcmp(name, "pipeline")) {
      CHECK(s.submits > 0 && s.submits == s.completes);
      CHECK(s.batches > 0 && s.batch_allocs > s.batches);
      CHECK(s.nstreams == 4);
      for (uint64_t st = 0x1000; st < 0x1004; st++) CHECK(has_stream(&s, st));
      CHECK(s.max_thread == 3 && s.idles == 0);
    } else if (!strcmp(name, "server")) {
      CHECK(s.idles >= 5 && s.idles <= 8);
      CHECK(s.idle_min_ns >= 20000000ull && s.idle_max_ns <= 100000000ull);
      CHECK(s.idle_ns < 1000000000ull);
      CHECK(has_stream(&s, 0) && has_stream(&s, 0x1000));
      CHECK(s.submits == 0 && s.batches == 0 && s.max_thread == 0);
    }
    /* The same seed writes the same bytes. */
    trace_t again = gen(name, 1.0, seed);
    CHECK(again.len == first[k].len && memcmp(again.buf, first[k].buf, again.len) == 0);
    free(again.buf);
  }
  /* Another seed writes another trace. */
  CHECK(first[0].len != first[1].len || memcmp(first[0].buf, first[1].buf, first[0].len) != 0);

  /* scale shrinks the workload, and still writes a valid trace. */
  trace_t small = gen(name, 0.1, 7);
  summary_t ss = check_trace(&small, name, 7);
  CHECK(ss.rows > 0 && ss.rows < rows_seed1 / 4);
  print_summary(name, 7, &ss);
  free(small.buf);
  /* The smallest scale still writes one whole iteration (or request). */
  trace_t tiny = gen(name, 1e-6, 9);
  summary_t ts = check_trace(&tiny, name, 9);
  CHECK(ts.rows > 0 && ts.rows <= ss.rows);
  free(tiny.buf);
  free(first[0].buf);
  free(first[1].buf);
}

/* --------------------------------------------------------------------------
 * The dp workload on a real allocator
 * ------------------------------------------------------------------------ */
static void replay_on_gma(const char *name, double scale) {
  trace_t t = gen(name, scale, 3);
  gma_config_t cfg = GMA_CONFIG_INIT;
  cfg.device = GMA_DEVICE_SIM;
  cfg.ignore_env = 1;
  gma_t *g = NULL;
  CHECK_OK(gma_create(&cfg, &g));
  uint64_t trace_stream[8];
  gma_stream_t real_stream[8];
  int nstreams = 0;
  map_t ptrs = {0};

  char *text = malloc(t.len + 1);
  CHECK(text);
  memcpy(text, t.buf, t.len);
  text[t.len] = 0;
  uint64_t calls = 0;
  char *line = strchr(text, '\n') + 1; /* past the header */
  for (char *nl; *line; line = nl + 1) {
    nl = strchr(line, '\n');
    *nl = 0;
    row_t r;
    const char *why = NULL;
    CHECK(parse_row(line, &r, &why));
    gma_stream_t st = NULL;
    if (r.stream) {
      int i = 0;
      while (i < nstreams && trace_stream[i] != r.stream) i++;
      if (i == nstreams) {
        CHECK(nstreams < 8);
        trace_stream[i] = r.stream;
        CHECK_OK(gma_stream_create(g, &real_stream[i]));
        nstreams++;
      }
      st = real_stream[i];
    }
    if (!strcmp(r.action, "allocate")) {
      void *p = NULL;
      CHECK_OK(gma_alloc(g, (size_t)r.size, st, &p));
      CHECK(p != NULL);
      map_add(&ptrs, r.ptr)->real = p;
    } else if (!strcmp(r.action, "free")) {
      ent_t *e = map_find(&ptrs, r.ptr);
      CHECK(e);
      CHECK_OK(gma_free(g, e->real));
      map_del(&ptrs, e);
    } else if (!strcmp(r.action, "record_stream")) {
      ent_t *e = map_find(&ptrs, r.ptr);
      CHECK(e);
      CHECK_OK(gma_record_stream(g, e->real, st));
    } else {
      CHECK(!"the gma replay here handles allocate, free and record_stream only");
    }
    calls++;
  }
  CHECK(ptrs.n == 0);
  gma_stats_t stats = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &stats));
  CHECK(stats.allocated.current == 0);
  CHECK(stats.num_allocs == stats.num_frees && stats.num_allocs > 0);
  printf("%s x%.2f on gma (sim): %" PRIu64 " calls, peak allocated %.1f MiB, peak reserved "
         "%.1f MiB, %" PRIu64 " device allocs, hits bin/stream/pool/device %" PRIu64 "/%" PRIu64
         "/%" PRIu64 "/%" PRIu64 "\n",
         name, scale, calls, stats.allocated.peak / 1048576.0, stats.reserved.peak / 1048576.0,
         stats.num_device_allocs, stats.hits_bin, stats.hits_stream, stats.hits_pool,
         stats.hits_device);
  for (int i = 0; i < nstreams; i++) CHECK_OK(gma_stream_destroy(g, real_stream[i]));
  CHECK_OK(gma_destroy(g));
  map_free(&ptrs);
  free(text);
  free(t.buf);
}

/* --------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------ */
static void check_errors(void) {
  char err[256];
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK(f);

  err[0] = 0;
  CHECK(gma_synth_write("nope", f, 1.0, 1, err, sizeof err) == -1);
  CHECK(strstr(err, "nope") != NULL && strstr(err, "dp") != NULL);
  err[0] = 0;
  CHECK(gma_synth_write(NULL, f, 1.0, 1, err, sizeof err) == -1 && err[0]);
  CHECK(gma_synth_write("nope", f, 1.0, 1, NULL, 0) == -1); /* err may be NULL */
  err[0] = 0;
  CHECK(gma_synth_write("dp", f, 0.0, 1, err, sizeof err) == -1 && strstr(err, "scale"));
  CHECK(gma_synth_write("dp", f, -1.0, 1, err, sizeof err) == -1);
  CHECK(gma_synth_write("dp", f, NAN, 1, err, sizeof err) == -1);
  CHECK(gma_synth_write("dp", NULL, 1.0, 1, err, sizeof err) == -1);
  /* A tiny err buffer is filled, truncated and terminated. */
  char tiny[8];
  memset(tiny, 'x', sizeof tiny);
  CHECK(gma_synth_write("nope", f, 1.0, 1, tiny, sizeof tiny) == -1);
  CHECK(memchr(tiny, 0, sizeof tiny) != NULL);
  CHECK(fclose(f) == 0);
  CHECK(len == 0); /* nothing was written on any error above */
  free(buf);

  CHECK(gma_synth_describe("nope") == NULL);
  CHECK(gma_synth_describe(NULL) == NULL);

  /* A write error is reported. */
  FILE *full = fopen("/dev/full", "w");
  if (full) {
    err[0] = 0;
    CHECK(gma_synth_write("server", full, 0.05, 1, err, sizeof err) == -1);
    CHECK(strstr(err, "write error") != NULL);
    printf("write to /dev/full: %s\n", err);
    fclose(full);
  }
}

int main(void) {
  /* The list: exactly the three documented workloads. */
  CHECK(gma_synth_names[0] && !strcmp(gma_synth_names[0], "dp"));
  CHECK(gma_synth_names[1] && !strcmp(gma_synth_names[1], "pipeline"));
  CHECK(gma_synth_names[2] && !strcmp(gma_synth_names[2], "server"));
  CHECK(gma_synth_names[3] == NULL);

  check_errors();
  for (int i = 0; gma_synth_names[i]; i++) check_workload(gma_synth_names[i]);
  replay_on_gma("dp", 0.05);
  printf("test_synth: ok\n");
  return 0;
}
