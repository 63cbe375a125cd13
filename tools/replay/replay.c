/* The replay engine (see replay.h): CSV parsing, the replay loop, and the
 * measurements. Single-threaded: one thread issues every call, in trace
 * order, on one gma stream per trace stream; frees are stream-ordered by
 * gma itself, as they were in the recorded program. */
#define _GNU_SOURCE
#include "replay.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- Parsing ---------------------------------------------------------------------- */

static const char *const action_names[RA_NACTIONS] = {
    [RA_ALLOCATE] = "allocate",
    [RA_ALLOCATE_FAILURE] = "allocate failure",
    [RA_FREE] = "free",
    [RA_RECORD_STREAM] = "record_stream",
    [RA_ASYNC_SUBMIT] = "async_submit",
    [RA_ASYNC_COMPLETE] = "async_complete",
    [RA_BATCH] = "batch",
    [RA_SEGMENT_ALLOC] = "segment_alloc",
    [RA_SEGMENT_FREE] = "segment_free",
    [RA_SEGMENT_MAP] = "segment_map",
    [RA_SEGMENT_UNMAP] = "segment_unmap",
    [RA_TRIM] = "trim",
    [RA_OOM] = "oom",
    [RA_IDLE] = "idle",
};

static int action_of(const char *s, size_t len) {
  for (int a = 0; a < RA_NACTIONS; a++)
    if (strlen(action_names[a]) == len && memcmp(action_names[a], s, len) == 0) return a;
  /* RMM spells a failed allocation "allocate failure" too; anything else is unknown. */
  return -1;
}

/* Splits line at commas into at most max fields (in place); returns the count. */
static int split(char *line, char **f, size_t *len, int max) {
  int n = 0;
  char *s = line;
  for (;;) {
    char *c = strchr(s, ',');
    if (n < max) {
      f[n] = s;
      len[n] = c ? (size_t)(c - s) : strcspn(s, "\r\n");
    }
    n++;
    if (!c) break;
    s = c + 1;
  }
  return n;
}

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* Field s[0, len) as a number from 0 to 2^64-1: decimal digits (base 10), or
 * hex digits after an optional 0x (base 16), and nothing else. strtoull
 * would also take leading spaces, a '+', and a '-' (reading -n as 2^64 - n). */
static bool num(const char *s, size_t len, unsigned base, uint64_t *out) {
  size_t i = base == 16 && len > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') ? 2 : 0;
  if (i == len) return false; /* empty */
  uint64_t v = 0;
  for (; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    unsigned d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10u;
    else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10u;
    else return false;
    if (v > (UINT64_MAX - d) / base) return false; /* above 2^64-1 */
    v = v * base + d;
  }
  *out = v;
  return true;
}

/* s[0, len) for a message: at most 40 bytes, anything unprintable as '?'. */
static const char *shown(char *buf, size_t cap, const char *s, size_t len) {
  size_t n = 0;
  for (; n < len && n < 40 && n + 4 < cap; n++)
    buf[n] = (unsigned char)s[n] >= 0x20 && (unsigned char)s[n] < 0x7f ? s[n] : '?';
  if (n < len) {
    memcpy(buf + n, "...", 3);
    n += 3;
  }
  buf[n] = '\0';
  return buf;
}

static const char *const column_names[10] = {"Thread", "Time", "Action", "Pointer", "Size",
                                             "Stream", "Block", "Id", "Count", "Status"};

/* Parses one data row (its nf fields; the action is known: a) into e, index
 * its place among the rows. Returns 0, or -1 with err naming the line, the
 * row's action, the column and the value (written while the row's text is
 * still there). */
static int parse_row(const char *name, uint64_t lineno, size_t index, int a, char **fld,
                     const size_t *len, int nf, replay_event_t *e, char *err, size_t errlen) {
  char tmp[48];
  const char *an = action_names[a];
  memset(e, 0, sizeof *e);
  e->action = (uint8_t)a;
  e->line = lineno < UINT32_MAX ? (uint32_t)lineno : UINT32_MAX;
  size_t tl = len[1] < sizeof tmp - 1 ? len[1] : sizeof tmp - 1;
  memcpy(tmp, fld[1], tl);
  tmp[tl] = '\0';
  char *tend;
  e->time = strtod(tmp, &tend);
  if (tend == tmp) e->time = (double)index * 1e-6; /* no usable time: keep row order */
  else if (!isfinite(e->time))
    return fail(err, errlen, "%s:%" PRIu64 ": %s row: column Time is '%s', not a finite number "
                "of seconds", name, lineno, an, shown(tmp, sizeof tmp, fld[1], len[1]));
  else e->timed = 1;
  uint64_t block;
  uint64_t *const dst[9] = {[3] = &e->ptr, [4] = &e->size, [5] = &e->stream, [6] = &block,
                            [7] = &e->id, [8] = &e->count};
  for (int c = 3; c < (nf == 10 ? 9 : 6); c++) {
    bool hex = c == 3 || c == 5;
    if (num(fld[c], len[c], hex ? 16 : 10, dst[c])) continue;
    const char *want = hex ? "a hex number from 0x0 to 0xffffffffffffffff (0x optional)"
                           : "a decimal number from 0 to 18446744073709551615";
    if (len[c] == 0)
      return fail(err, errlen, "%s:%" PRIu64 ": %s row: column %s is empty, not %s", name, lineno,
                  an, column_names[c], want);
    return fail(err, errlen, "%s:%" PRIu64 ": %s row: column %s is '%s', not %s (digits only: "
                "no sign or spaces)", name, lineno, an, column_names[c],
                shown(tmp, sizeof tmp, fld[c], len[c]), want);
  }
  if (nf == 10) {
    if (a == RA_TRIM) e->explicit_trim = len[9] == 8 && memcmp(fld[9], "explicit", 8) == 0;
    else e->failed = len[9] > 0;
  }
  if (a == RA_ALLOCATE_FAILURE) e->failed = 1;
  if ((a == RA_ASYNC_SUBMIT || a == RA_ASYNC_COMPLETE) && e->id == 0)
    return fail(err, errlen, "%s:%" PRIu64 ": %s row: column Id is 0%s; an async row names its "
                "future by an Id from 1 to 18446744073709551615 (0 means none)", name, lineno, an,
                nf == 6 ? " (a row of 6 columns has none)" : "");
  return 0;
}

static int compute_peak_live(replay_trace_t *t, char *err, size_t errlen);

/* Stable sort by time; traces are nearly always sorted already. */
static void sort_events(replay_event_t *v, size_t n) {
  size_t i = 1;
  while (i < n && v[i].time >= v[i - 1].time) i++;
  if (i >= n) return;
  for (; i < n; i++) { /* insertion: rows out of order are few and close */
    if (v[i].time >= v[i - 1].time) continue;
    replay_event_t x = v[i];
    size_t j = i;
    while (j > 0 && v[j - 1].time > x.time) {
      v[j] = v[j - 1];
      j--;
    }
    v[j] = x;
  }
}

/* What the rows in time order must satisfy (see replay_parse); sets the
 * recording allocator's reserved curve's peak. The replay sums the segment
 * rows in this same order, so its sums cannot overflow either. */
static int check_in_order(replay_trace_t *t, char *err, size_t errlen) {
  int64_t recorded = 0;
  for (size_t i = 0; i < t->n; i++) {
    const replay_event_t *e = &t->ev[i];
    const char *an = action_names[e->action];
    size_t after = t->n - i - 1;
    if ((e->action == RA_BATCH || (e->action == RA_ASYNC_COMPLETE && !e->failed)) &&
        e->count > after)
      return fail(err, errlen, "%s:%" PRIu32 ": %s row: its Count %" PRIu64 " is more than the "
                  "%zu rows after it in time order (the %s's allocate rows follow it)", t->name,
                  e->line, an, e->count, after,
                  e->action == RA_BATCH ? "batch" : "served async batch");
    bool up = e->action == RA_SEGMENT_ALLOC || e->action == RA_SEGMENT_MAP;
    if (!up && e->action != RA_SEGMENT_FREE && e->action != RA_SEGMENT_UNMAP) continue;
    if (e->size > INT64_MAX)
      return fail(err, errlen, "%s:%" PRIu32 ": %s row: column Size is %" PRIu64 ", more than a "
                  "segment row's 2^63-1 bytes", t->name, e->line, an, e->size);
    if (up ? __builtin_add_overflow(recorded, (int64_t)e->size, &recorded)
           : __builtin_sub_overflow(recorded, (int64_t)e->size, &recorded))
      return fail(err, errlen, "%s:%" PRIu32 ": %s row: the segment rows' bytes %s here (Size %"
                  PRIu64 ")", t->name, e->line, an, up ? "pass 2^63-1" : "fall below -2^63",
                  e->size);
    t->has_recorded = 1;
    if (recorded > 0 && (uint64_t)recorded > t->recorded_peak) t->recorded_peak = (uint64_t)recorded;
  }
  return 0;
}

/* replay_parse, with the file's path for a message that names a command to
 * run on it (name, in the other messages, is its base name). */
static int parse_file(FILE *f, const char *name, const char *path, replay_trace_t **out, char *err,
                      size_t errlen) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t got = getline(&line, &cap, f);
  if (got <= 0) {
    free(line);
    return fail(err, errlen, "%s: empty file (no header)", name);
  }
  static const char *const want[] = {"Thread", "Time", "Action", "Pointer", "Size", "Stream"};
  char *fld[16];
  size_t len[16];
  int nf = split(line, fld, len, 16);
  for (int i = 0; i < 6; i++)
    if (nf < 6 || len[i] != strlen(want[i]) || memcmp(fld[i], want[i], len[i]) != 0) {
      const unsigned char *b = (const unsigned char *)line;
      bool gz = got >= 2 && b[0] == 0x1f && b[1] == 0x8b;
      /* Pickle protocols 2 and later start with PROTO (0x80) and the
       * protocol number; torch.cuda.memory._dump_snapshot writes one. */
      int pickle = got >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5 ? b[1] : 0;
      free(line);
      if (gz)
        return fail(err, errlen, "%s is gzip-compressed: decompress it first (gunzip -k)", name);
      if (pickle)
        return fail(err, errlen,
                    "%s is a Python pickle (protocol %d), not a trace CSV; if it is a "
                    "PyTorch memory snapshot (torch.cuda.memory._dump_snapshot), convert it "
                    "first and replay TRACE.csv: tools/gma-import-torch %s -o TRACE.csv",
                    name, pickle, path);
      return fail(err, errlen,
                  "%s: line 1 is not a trace header: it must start with "
                  "Thread,Time,Action,Pointer,Size,Stream (RMM's columns)",
                  name);
    }
  replay_trace_t *t = calloc(1, sizeof *t);
  if (!t) {
    free(line);
    return fail(err, errlen, "out of host memory");
  }
  snprintf(t->name, sizeof t->name, "%s", name);
  size_t evcap = 0;
  uint64_t lineno = 1;
  int rc = 0;
  while ((got = getline(&line, &cap, f)) > 0) {
    lineno++;
    if (line[0] == '\n' || line[0] == '\r') continue;
    nf = split(line, fld, len, 16);
    int a = nf == 6 || nf == 10 ? action_of(fld[2], len[2]) : -1;
    if (nf != 6 && nf != 10) {
      rc = fail(err, errlen, "%s:%" PRIu64 ": %d fields; a row has 6 (RMM) or 10 (gma)", name,
                lineno, nf);
    } else if (a < 0) {
      char tmp[48];
      rc = fail(err, errlen, "%s:%" PRIu64 ": unknown action '%s'", name, lineno,
                shown(tmp, sizeof tmp, fld[2], len[2]));
    } else if (t->n == evcap) {
      evcap = evcap ? evcap * 2 : 4096;
      replay_event_t *v = realloc(t->ev, evcap * sizeof *v);
      if (v) t->ev = v;
      else rc = fail(err, errlen, "out of host memory for %zu events", evcap);
    }
    if (rc == 0)
      rc = parse_row(name, lineno, t->n, a, fld, len, nf, &t->ev[t->n], err, errlen);
    if (rc != 0) break;
    if (t->ev[t->n].timed) t->has_time = 1;
    t->count[a]++;
    t->n++;
  }
  free(line);
  if (rc == 0 && ferror(f)) rc = fail(err, errlen, "%s: read error", name);
  if (rc == 0) {
    sort_events(t->ev, t->n);
    rc = check_in_order(t, err, errlen);
  }
  if (rc == 0) rc = compute_peak_live(t, err, errlen);
  if (rc != 0) {
    replay_trace_free(t);
    return -1;
  }
  *out = t;
  return 0;
}

int replay_parse(FILE *f, const char *name, replay_trace_t **out, char *err, size_t errlen) {
  return parse_file(f, name, name, out, err, errlen);
}

int replay_load(const char *path, replay_trace_t **out, char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return fail(err, errlen, "%s is a directory, not a trace file", path);
  FILE *f = fopen(path, "r");
  if (!f) return fail(err, errlen, "cannot open %s: %s", path, strerror(errno));
  const char *base = strrchr(path, '/');
  int rc = parse_file(f, base ? base + 1 : path, path, out, err, errlen);
  fclose(f);
  return rc;
}

void replay_trace_free(replay_trace_t *t) {
  if (!t) return;
  free(t->ev);
  free(t);
}

/* ---- Maps: trace pointer -> replay allocation; id -> future ----------------------- */

/* A slot's state is its own field, so every key (a trace's pointer or Id,
 * 0 and 2^64-1 included) can be stored. A map always keeps at least half of
 * its slots empty (used counts live and deleted ones), so a probe ends. */
enum { SLOT_EMPTY, SLOT_LIVE, SLOT_DELETED };

typedef struct slot {
  uint64_t key;
  void *ptr;
  uint64_t size;
  uint8_t state; /* SLOT_* */
} slot_t;

typedef struct map {
  slot_t *s;
  size_t mask, used, live;
} map_t;

static uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  return k ^ (k >> 33);
}

static bool map_init(map_t *m, size_t want) {
  size_t cap = 1024;
  while (cap < want * 2) cap *= 2;
  m->s = calloc(cap, sizeof *m->s); /* every slot SLOT_EMPTY */
  m->mask = cap - 1;
  m->used = m->live = 0;
  return m->s != NULL;
}

static slot_t *map_find(map_t *m, uint64_t key) {
  for (size_t i = mix(key) & m->mask;; i = (i + 1) & m->mask) {
    if (m->s[i].state == SLOT_EMPTY) return NULL;
    if (m->s[i].state == SLOT_LIVE && m->s[i].key == key) return &m->s[i];
  }
}

static bool map_grow(map_t *m) {
  map_t n;
  if (!map_init(&n, (m->live + 1) * 2)) return false;
  for (size_t i = 0; i <= m->mask; i++)
    if (m->s[i].state == SLOT_LIVE) {
      size_t j = mix(m->s[i].key) & n.mask;
      while (n.s[j].state != SLOT_EMPTY) j = (j + 1) & n.mask;
      n.s[j] = m->s[i];
      n.used++;
      n.live++;
    }
  free(m->s);
  *m = n;
  return true;
}

static bool map_put(map_t *m, uint64_t key, void *ptr, uint64_t size) {
  if ((m->used + 1) * 2 > m->mask + 1 && !map_grow(m)) return false;
  size_t i = mix(key) & m->mask;
  while (m->s[i].state == SLOT_LIVE) i = (i + 1) & m->mask;
  if (m->s[i].state == SLOT_EMPTY) m->used++;
  m->s[i] = (slot_t){key, ptr, size, SLOT_LIVE};
  m->live++;
  return true;
}

static void map_del(map_t *m, slot_t *s) {
  s->state = SLOT_DELETED;
  m->live--;
}

/* The trace's own peak of live requested bytes, from its rows alone: the
 * requests it records as served (allocate rows, a batch's or an async batch's
 * members among them, and single async completions) and the frees of them.
 * A pointer allocated again while live lost its free, as in the replay.
 * Returns 0, or -1 with err set (live bytes past 2^64-1, or no host memory). */
static int compute_peak_live(replay_trace_t *t, char *err, size_t errlen) {
  map_t m;
  if (!map_init(&m, 4096)) return fail(err, errlen, "out of host memory");
  uint64_t live = 0, peak = 0;
  int rc = 0;
  for (size_t i = 0; i < t->n && rc == 0; i++) {
    const replay_event_t *e = &t->ev[i];
    bool add = !e->failed && (e->action == RA_ALLOCATE ||
                              (e->action == RA_ASYNC_COMPLETE && e->count == 0));
    if (add) {
      slot_t *old = map_find(&m, e->ptr);
      if (old) {
        live -= old->size;
        map_del(&m, old);
      }
      if (e->size > UINT64_MAX - live)
        rc = fail(err, errlen, "%s:%" PRIu32 ": %s row: the trace's live bytes pass 2^64-1 here "
                  "(Size %" PRIu64 ")", t->name, e->line, action_names[e->action], e->size);
      else if (!map_put(&m, e->ptr, NULL, e->size))
        rc = fail(err, errlen, "out of host memory");
      live += rc == 0 ? e->size : 0;
      if (live > peak) peak = live;
    } else if (e->action == RA_FREE && !e->failed) {
      slot_t *s = map_find(&m, e->ptr);
      if (s) {
        live -= s->size;
        map_del(&m, s);
      }
    }
  }
  free(m.s);
  t->peak_live = peak;
  return rc;
}

/* ---- The replay ---------------------------------------------------------------------- */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* An async request in flight: its future, and a batch's pointer array. */
typedef struct pending {
  gma_future_t *f;
  void **ptrs;
  size_t n;
} pending_t;

typedef struct stream_entry {
  uint64_t key;
  gma_stream_t s;
} stream_entry_t;

typedef struct run {
  gma_t *g;
  const replay_trace_t *t;
  const replay_options_t *o;
  replay_result_t *r;
  map_t ptrs, futures;
  stream_entry_t *streams;
  size_t nstreams;
  uint32_t *alat, *flat; /* latencies, ns */
  size_t na, nf;
  uint64_t live;         /* requested bytes live */
  uint64_t window_max;   /* highest live since the last timeline row */
  int64_t recorded;      /* the recording allocator's reserved now */
  uint64_t best_reserved; /* at the samples */
  int stream_error;
  /* --repeat */
  uint64_t rep;           /* the repetition being replayed, 0-based */
  double time_offset;     /* added to row times in the timeline: rep x the trace's span */
  uint64_t rep_reserved, rep_allocated; /* highest samples of this repetition */
  uint64_t sample_ns;     /* time spent in those samples, left out of wall_s */
} run_t;

static gma_stream_t stream_of(run_t *x, uint64_t key) {
  if (key == 0) return NULL;
  for (size_t i = 0; i < x->nstreams; i++)
    if (x->streams[i].key == key) return x->streams[i].s;
  stream_entry_t *v = realloc(x->streams, (x->nstreams + 1) * sizeof *v);
  gma_stream_t s = NULL;
  if (!v || gma_stream_create(x->g, &s) != GMA_OK) {
    x->stream_error = 1; /* replay on the default stream rather than stop */
    if (v) x->streams = v;
    return NULL;
  }
  x->streams = v;
  x->streams[x->nstreams++] = (stream_entry_t){key, s};
  return s;
}

static void note_live(run_t *x, uint64_t req_add, uint64_t req_sub) {
  x->live = req_add > UINT64_MAX - x->live ? UINT64_MAX : x->live + req_add;
  x->live -= req_sub < x->live ? req_sub : x->live;
  if (x->live > x->r->peak_requested) x->r->peak_requested = x->live;
  if (x->live > x->window_max) x->window_max = x->live;
}

/* A request the trace records as served failed in the replay (n of them). */
static void note_failed(run_t *x, size_t i, uint64_t n) {
  if (!x->r->failed_allocs) {
    x->r->first_failed_event = i;
    x->r->first_failed_rep = x->o->repeat ? x->rep + 1 : 0;
    snprintf(x->r->first_error, sizeof x->r->first_error, "%s", gma_last_error());
  }
  x->r->failed_allocs = n > UINT64_MAX - x->r->failed_allocs ? UINT64_MAX : x->r->failed_allocs + n;
}

/* --repeat, not in fast mode: reserved and allocated after an allocation call,
 * for the repetition's peaks (replay_rep_t says why this finds them). */
static void rep_sample(run_t *x) {
  if (!x->o->repeat || x->o->fast) return;
  uint64_t a = now_ns();
  gma_stats_t s = GMA_STATS_INIT;
  if (gma_stats(x->g, &s) == GMA_OK) {
    if (s.reserved.current > x->rep_reserved) x->rep_reserved = s.reserved.current;
    if (s.allocated.current > x->rep_allocated) x->rep_allocated = s.allocated.current;
  }
  x->sample_ns += now_ns() - a;
}

static void do_alloc(run_t *x, size_t i, const replay_event_t *e) {
  void *p = NULL;
  gma_stream_t s = stream_of(x, e->stream);
  uint64_t t0 = x->o->fast ? 0 : now_ns();
  gma_status_t st = gma_alloc(x->g, e->size ? e->size : 1, s, &p);
  if (!x->o->fast) {
    uint64_t dt = now_ns() - t0;
    x->alat[x->na++] = (uint32_t)(dt > UINT32_MAX ? UINT32_MAX : dt);
  }
  x->r->replayed++;
  if (st != GMA_OK) {
    note_failed(x, i, 1);
    return;
  }
  rep_sample(x);
  slot_t *old = map_find(&x->ptrs, e->ptr);
  if (old) { /* the trace reused a live pointer: it lost a free; drop the old one */
    x->r->unmatched++;
    note_live(x, 0, old->size);
    gma_free(x->g, old->ptr);
    map_del(&x->ptrs, old);
  }
  map_put(&x->ptrs, e->ptr, p, e->size);
  note_live(x, e->size, 0);
}

static void do_free(run_t *x, const replay_event_t *e) {
  slot_t *s = map_find(&x->ptrs, e->ptr);
  if (!s) {
    x->r->unmatched++;
    return;
  }
  uint64_t t0 = x->o->fast ? 0 : now_ns();
  gma_free(x->g, s->ptr);
  if (!x->o->fast) {
    uint64_t dt = now_ns() - t0;
    x->flat[x->nf++] = (uint32_t)(dt > UINT32_MAX ? UINT32_MAX : dt);
  }
  x->r->replayed++;
  note_live(x, 0, s->size);
  map_del(&x->ptrs, s);
}

/* The members of a batch follow its row (or its async_complete row). */
static size_t do_batch(run_t *x, size_t i, const replay_event_t *head, void **got) {
  size_t n = (size_t)head->count;
  if (n > x->t->n - i - 1) n = x->t->n - i - 1; /* replay_parse refuses a Count beyond the rows */
  size_t *sizes = malloc((n ? n : 1) * sizeof *sizes);
  void **ptrs = got ? got : malloc((n ? n : 1) * sizeof *ptrs);
  if (!sizes || !ptrs) {
    free(sizes);
    if (!got) free(ptrs);
    return n;
  }
  for (size_t k = 0; k < n; k++) sizes[k] = x->t->ev[i + 1 + k].size ? x->t->ev[i + 1 + k].size : 1;
  gma_status_t st = GMA_OK;
  if (!got) {
    uint64_t t0 = now_ns();
    st = n ? gma_alloc_batch(x->g, n, sizes, stream_of(x, head->stream), ptrs) : GMA_OK;
    uint64_t dt = n ? (now_ns() - t0) / n : 0;
    for (size_t k = 0; k < n && !x->o->fast; k++)
      x->alat[x->na++] = (uint32_t)(dt > UINT32_MAX ? UINT32_MAX : dt);
    x->r->replayed++;
  }
  if (st != GMA_OK) {
    note_failed(x, i, n);
  } else {
    rep_sample(x);
    for (size_t k = 0; k < n; k++) {
      map_put(&x->ptrs, x->t->ev[i + 1 + k].ptr, ptrs[k], sizes[k]);
      note_live(x, sizes[k], 0);
    }
  }
  free(sizes);
  if (!got) free(ptrs);
  return n;
}

/* An oom row: a request the recording allocator could not serve. It is
 * attempted on its stream, so the replay shows whether gma serves it where
 * the recorder failed. The trace has no free for it (the program never got
 * the memory), so a served attempt is freed at once, stream-ordered on its
 * stream: the block is cached there like any freed block, and live bytes are
 * back to what the trace says before its next row. The attempt is in gma's own
 * peaks (allocated, reserved) when served, as it held that memory; it is not
 * in peak_requested, which follows the trace's live bytes. A failed attempt
 * is not a failed allocation of the replay: the recorder failed it too. */
static void do_oom_attempt(run_t *x, const replay_event_t *e) {
  void *p = NULL;
  x->r->oom_attempts++;
  x->r->replayed++;
  if (gma_alloc(x->g, e->size ? e->size : 1, stream_of(x, e->stream), &p) != GMA_OK) return;
  rep_sample(x);
  x->r->oom_served++;
  gma_free(x->g, p);
}

static void sample_now(run_t *x, size_t i);

/* A timeline sample: its time (gma_stats walks every block for the
 * fragmentation figure, and a snapshot may be written) is the tool's, left
 * out of wall_s like rep_sample's. */
static void sample(run_t *x, size_t i) {
  uint64_t a = now_ns();
  sample_now(x, i);
  x->sample_ns += now_ns() - a;
}

static void sample_now(run_t *x, size_t i) {
  gma_stats_t s = GMA_STATS_INIT;
  if (gma_stats(x->g, &s) != GMA_OK) return;
  if (s.reserved.current > x->best_reserved || i == 0) {
    x->best_reserved = s.reserved.current;
    x->r->fragmentation_at_peak = s.fragmentation;
    if (x->o->snapshot_path) gma_snapshot_json(x->g, x->o->snapshot_path);
  }
  if (x->o->timeline) {
    /* Allocated is the highest value since the previous row, so a short
     * spike between rows still shows (peak-preserving downsampling). */
    fprintf(x->o->timeline, "%" PRIu64 ",", (uint64_t)i + x->rep * (uint64_t)x->t->n);
    if (x->t->has_time) fprintf(x->o->timeline, "%.9f", x->t->ev[i].time + x->time_offset);
    fprintf(x->o->timeline, ",%" PRIu64 ",%" PRIu64 ",",
            x->window_max > x->live ? x->window_max : x->live, s.reserved.current);
    x->window_max = x->live;
    if (x->t->has_recorded) fprintf(x->o->timeline, "%" PRId64, x->recorded);
    fputc('\n', x->o->timeline);
  }
}

/* i: rows done over all repetitions, of total. */
static void progress(run_t *x, uint64_t i, uint64_t total, uint64_t t0) {
  double frac = total ? (double)i / (double)total : 1;
  int w = 30, full = (int)(frac * w);
  double el = (double)(now_ns() - t0) / 1e9;
  fprintf(stderr, "\r  %-28.28s [%.*s%*s] %3d%%  %" PRIu64 " events  %.1f s",
          x->o->label ? x->o->label : "", full, "##############################", w - full, "",
          (int)(frac * 100), i, el);
  if (i == total) fputc('\n', stderr);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

static replay_latency_t latency(uint32_t *v, size_t n) {
  replay_latency_t l = {.n = n};
  if (!n) return l;
  qsort(v, n, sizeof *v, cmp_u32);
  l.p50 = v[(n - 1) / 2];
  l.p99 = v[(size_t)((double)(n - 1) * 0.99)];
  l.p999 = v[(size_t)((double)(n - 1) * 0.999)];
  l.max = v[n - 1];
  return l;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Gives back what the replay still holds: pointers the trace never freed and
 * futures it never collected (release frees a future's memory), and empties
 * both maps, so the next repetition starts with none. Counts them into
 * *nptrs and *nfut. */
static void release_held(run_t *x, uint64_t *nptrs, uint64_t *nfut) {
  for (size_t i = 0; i <= x->ptrs.mask; i++)
    if (x->ptrs.s[i].state == SLOT_LIVE) {
      gma_free(x->g, x->ptrs.s[i].ptr);
      note_live(x, 0, x->ptrs.s[i].size);
      (*nptrs)++;
    }
  for (size_t i = 0; i <= x->futures.mask; i++)
    if (x->futures.s[i].state == SLOT_LIVE) {
      pending_t *pd = x->futures.s[i].ptr;
      gma_future_release(pd->f);
      free(pd->ptrs);
      free(pd);
      (*nfut)++;
    }
  memset(x->ptrs.s, 0, (x->ptrs.mask + 1) * sizeof *x->ptrs.s);
  x->ptrs.used = x->ptrs.live = 0;
  memset(x->futures.s, 0, (x->futures.mask + 1) * sizeof *x->futures.s);
  x->futures.used = x->futures.live = 0;
}

/* The end of repetition x->rep (--repeat): what it still holds goes back, the
 * iteration is marked, and its figures are kept. *prev holds gma_stats at the
 * repetition's start and becomes the next one's start. */
static void end_rep(run_t *x, gma_stats_t *prev, uint64_t *dev_at_first, uint64_t *dev_at_active) {
  replay_result_t *r = x->r;
  uint64_t a = now_ns();
  gma_stats_t s = GMA_STATS_INIT;
  if (gma_stats(x->g, &s) == GMA_OK) { /* before the frees: the end's own sample */
    if (s.reserved.current > x->rep_reserved) x->rep_reserved = s.reserved.current;
    if (s.allocated.current > x->rep_allocated) x->rep_allocated = s.allocated.current;
  }
  x->sample_ns += now_ns() - a;
  release_held(x, &r->rep_end_frees, &r->rep_end_futures);
  r->marks++;
  if (gma_iteration_mark(x->g) != GMA_OK && !r->mark_failures++)
    snprintf(r->mark_error, sizeof r->mark_error, "%s", gma_last_error());
  a = now_ns();
  s = (gma_stats_t)GMA_STATS_INIT;
  gma_stats(x->g, &s); /* after the mark: it may give memory back or take an arena */
  /* A plan being placed (plan:on): the worker places it while the program
   * runs its next iteration. A replay runs an iteration in milliseconds, a
   * real program seldom does, so the replay gives the placement up to 5 s
   * here (not counted in wall_s), and repeated runs activate at the same
   * repetition. */
  for (int i = 0; i < 5000 && s.plan_state == 3; i++) {
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
    gma_stats(x->g, &s);
  }
  x->sample_ns += now_ns() - a;
  replay_rep_t rr = {
      .peak_reserved = x->rep_reserved > s.reserved.current ? x->rep_reserved : s.reserved.current,
      .peak_allocated = x->rep_allocated,
      .reserved_end = s.reserved.current,
      .device_allocs = s.num_device_allocs - prev->num_device_allocs,
      .plan_hits = s.plan_hits - prev->plan_hits,
      .plan_misses = s.plan_misses - prev->plan_misses,
      .plan_state = s.plan_state,
  };
  /* A repetition that raised gma's peak reached exactly that peak; one whose
   * sample reached the peak so far cannot have been higher. */
  if (s.reserved.peak > prev->reserved.peak || rr.peak_reserved == s.reserved.peak) {
    rr.peak_reserved = s.reserved.peak;
    rr.peak_exact = 1;
  }
  if (s.allocated.peak > prev->allocated.peak) rr.peak_allocated = s.allocated.peak;
  if (x->rep == 0) {
    r->peak_reserved_first_rep = rr.peak_reserved;
    r->device_allocs_first_rep = rr.device_allocs;
    *dev_at_first = s.num_device_allocs;
  } else if (rr.peak_reserved > r->peak_reserved_max_after_first_rep) {
    r->peak_reserved_max_after_first_rep = rr.peak_reserved;
  }
  r->peak_reserved_last_rep = rr.peak_reserved;
  if (!r->plan_active_rep && s.plan_state == 4) {
    r->plan_active_rep = x->rep + 1;
    *dev_at_active = s.num_device_allocs;
  }
  if (r->nreps < REPLAY_REP_LIST) r->reps[r->nreps++] = rr;
  r->reps_completed++;
  *prev = s;
  x->rep_reserved = s.reserved.current; /* the next repetition starts here */
  x->rep_allocated = s.allocated.current;
}

/* The run's figures that gma_stats gives, read at its end. */
static void result_from_stats(replay_result_t *r, const gma_stats_t *s, bool growable) {
  r->peak_allocated = s->allocated.peak;
  r->peak_reserved = s->reserved.peak;
  r->device_allocs = s->num_device_allocs;
  r->device_frees = s->num_device_frees;
  /* Reserved bytes are the bytes mapped; under growable ranges each device
   * allocation or free is one chunk's map (a create too, unless the chunk
   * was kept) or unmap (replay.h, replay_result_t). */
  r->mapped_peak = s->reserved.peak;
  r->growable = growable;
  if (growable) {
    r->vm_maps = s->num_device_allocs;
    r->vm_unmaps = s->num_device_frees;
    r->vm_creates = s->num_device_allocs - s->num_device_remaps;
  }
  r->hits_bin = s->hits_bin;
  r->hits_stream = s->hits_stream;
  r->hits_pool = s->hits_pool;
  r->hits_device = s->hits_device;
  r->oom_retries = s->num_oom_retries;
  r->plan_state = s->plan_state;
  r->plan_hits = s->plan_hits;
  r->plan_misses = s->plan_misses;
  r->plan_replans = s->plan_replans;
  r->plan_arena_bytes = s->plan_arena_bytes;
  r->plan_lower_bound = s->plan_lower_bound;
  r->plan_slots = s->plan_slots;
  r->plan_iterations = s->plan_iterations;
}

int replay_run(const replay_trace_t *t, const char *conf, const replay_options_t *o,
               replay_result_t *r, char *err, size_t errlen) {
  replay_options_t defaults = {0};
  if (!o) o = &defaults;
  memset(r, 0, sizeof *r);
  const uint64_t reps = o->repeat ? o->repeat : 1;
  if (t->n && reps > (SIZE_MAX / sizeof(uint32_t) - 1) / t->n)
    return fail(err, errlen, "%" PRIu64 " repetitions of %zu rows are too many", reps, t->n);
  const uint64_t total = (uint64_t)t->n * reps; /* rows over all repetitions */
  gma_config_t c = GMA_CONFIG_INIT;
  c.ignore_env = 1;
  c.device = o->device && strcmp(o->device, "cuda") == 0 ? GMA_DEVICE_CUDA : GMA_DEVICE_SIM;
  if (conf && *conf && gma_config_parse(&c, conf) != GMA_OK)
    return fail(err, errlen, "config '%s': %s", conf, gma_last_error());
  if (o->capacity) {
    /* Set in the struct, not appended to the string: a key given twice in
     * one config string is an error, and CONF may name sim_capacity. */
    if (c.device != GMA_DEVICE_SIM)
      return fail(err, errlen, "a replay capacity needs the simulated device (--device sim)");
    c.sim_capacity = o->capacity;
  }
  r->capacity = c.sim_capacity;
  r->trace_peak_live = t->peak_live;
  r->recorded_failed = t->count[RA_OOM];
  r->repeat = o->repeat;
  r->trace_events = t->n;
  r->rep_samples_per_alloc = o->repeat && !o->fast;
  run_t x = {.t = t, .o = o, .r = r};
  if (gma_create(&c, &x.g) != GMA_OK)
    return fail(err, errlen, "gma_create(%s): %s", conf ? conf : "", gma_last_error());
  char torch_trace[1100] = "";
  if (o->torch_snapshot_path) {
    snprintf(torch_trace, sizeof torch_trace, "%.1000s.trace.tmp", o->torch_snapshot_path);
    if (gma_trace_start(x.g, torch_trace) != GMA_OK) {
      fail(err, errlen, "recording the replay's events for --torch-snapshot: %s",
           gma_last_error());
      gma_destroy(x.g);
      return -1;
    }
  }
  x.alat = malloc((total + 1) * sizeof *x.alat);
  x.flat = malloc((total + 1) * sizeof *x.flat);
  if (!x.alat || !x.flat || !map_init(&x.ptrs, 4096) || !map_init(&x.futures, 64)) {
    free(x.alat);
    free(x.flat);
    free(x.ptrs.s);
    gma_destroy(x.g);
    if (*torch_trace) remove(torch_trace);
    return fail(err, errlen, "out of host memory");
  }
  uint64_t every = o->samples ? total / o->samples : total / 2000;
  if (every == 0) every = 1;
  uint64_t pstep = total / 100 ? total / 100 : 1;
  double span = t->n ? t->ev[t->n - 1].time - t->ev[0].time : 0;
  gma_stats_t at_start = GMA_STATS_INIT; /* of the repetition being replayed */
  uint64_t dev_at_first = 0, dev_at_active = 0;
  if (o->repeat) {
    gma_stats(x.g, &at_start);
    x.rep_reserved = at_start.reserved.current;
    x.rep_allocated = at_start.allocated.current;
  }
  uint64_t t0 = now_ns(), slept = 0;
  uint64_t done = total; /* rows replayed: fewer when stop_on_failure stopped it */
  for (x.rep = 0; x.rep < reps && !r->stopped; x.rep++) {
    x.time_offset = (double)x.rep * (span + 1e-6);
    /* Each repetition's segment rows draw the recording allocator's curve
     * again from 0, as replay_parse summed them (no overflow there). */
    x.recorded = 0;
    for (size_t i = 0; i < t->n; i++) {
      const replay_event_t *e = &t->ev[i];
      const uint64_t row = x.rep * (uint64_t)t->n + i; /* over all repetitions */
      switch (e->action) {
        case RA_ALLOCATE:
          if (!e->failed && e->id == 0) do_alloc(&x, i, e);
          break;
        case RA_OOM:
          do_oom_attempt(&x, e);
          break;
        case RA_FREE:
          if (!e->failed) do_free(&x, e);
          break;
        case RA_RECORD_STREAM: {
          slot_t *s = map_find(&x.ptrs, e->ptr);
          if (s) gma_record_stream(x.g, s->ptr, stream_of(&x, e->stream));
          else r->unmatched++;
          r->replayed++;
          break;
        }
        case RA_BATCH:
          i += do_batch(&x, i, e, NULL);
          break;
        case RA_ASYNC_SUBMIT: {
          /* A batch's sizes are the allocate rows after its completion. */
          pending_t *pd = calloc(1, sizeof *pd);
          gma_status_t st = GMA_ERR_OOM;
          if (pd && e->count == 0) {
            st = gma_alloc_async(x.g, e->size ? e->size : 1, stream_of(&x, e->stream), NULL,
                                 &pd->f);
          } else if (pd) {
            size_t k = i + 1, n = (size_t)e->count;
            while (k < t->n && !(t->ev[k].action == RA_ASYNC_COMPLETE && t->ev[k].id == e->id)) k++;
            size_t *sizes = k < t->n && n < t->n - k ? malloc(n * sizeof *sizes) : NULL;
            pd->ptrs = sizes ? calloc(n, sizeof *pd->ptrs) : NULL;
            pd->n = n;
            st = GMA_ERR_INVALID_ARGUMENT; /* the trace lacks the batch's rows */
            if (sizes && pd->ptrs) {
              for (size_t m = 0; m < n; m++)
                sizes[m] = t->ev[k + 1 + m].size ? t->ev[k + 1 + m].size : 1;
              st = gma_alloc_batch_async(x.g, n, sizes, stream_of(&x, e->stream), pd->ptrs, NULL,
                                         &pd->f);
            }
            free(sizes);
          }
          r->replayed++;
          if (st == GMA_OK) rep_sample(&x); /* served at once, perhaps */
          if (st == GMA_OK && map_put(&x.futures, e->id, pd, 0)) break;
          note_failed(&x, i, e->count ? e->count : 1);
          if (pd) {
            if (st == GMA_OK) gma_future_release(pd->f);
            free(pd->ptrs);
            free(pd);
          }
          break;
        }
        case RA_ASYNC_COMPLETE: {
          slot_t *s = map_find(&x.futures, e->id);
          /* A served batch's allocate rows follow; a failed one has none. */
          size_t n = (size_t)e->count, rows = e->failed ? 0 : n;
          if (rows > t->n - i - 1) rows = t->n - i - 1; /* replay_parse refuses it */
          if (!s) {
            i += rows;
            break;
          }
          pending_t *pd = s->ptr;
          void *one = NULL;
          gma_status_t st = gma_future_wait(pd->f, 10000000000ull, n ? NULL : &one);
          if (st == GMA_OK) rep_sample(&x);
          if (st == GMA_OK && !e->failed) {
            if (!n) {
              map_put(&x.ptrs, e->ptr, one, e->size);
              note_live(&x, e->size, 0);
            }
            for (size_t m = 0; m < n && m < pd->n && i + 1 + m < t->n; m++) {
              map_put(&x.ptrs, t->ev[i + 1 + m].ptr, pd->ptrs[m], t->ev[i + 1 + m].size);
              note_live(&x, t->ev[i + 1 + m].size, 0);
            }
          } else if (st == GMA_OK) { /* the recorded request failed: give it back */
            if (!n) gma_free(x.g, one);
            for (size_t m = 0; m < pd->n; m++) gma_free(x.g, pd->ptrs[m]);
          } else if (!e->failed) {
            note_failed(&x, i, n ? n : 1);
          }
          i += rows;
          gma_future_release(pd->f);
          free(pd->ptrs);
          free(pd);
          map_del(&x.futures, s);
          break;
        }
        case RA_SEGMENT_ALLOC:
        case RA_SEGMENT_MAP:
          x.recorded += (int64_t)e->size;
          break;
        case RA_SEGMENT_FREE:
        case RA_SEGMENT_UNMAP:
          x.recorded -= (int64_t)e->size;
          break;
        case RA_TRIM:
          if (e->explicit_trim) {
            gma_trim(x.g, e->count);
            r->replayed++;
          }
          break;
        case RA_IDLE: {
          double s = (double)e->size / 1e9, cap = o->max_idle_s > 0 ? o->max_idle_s : 1.0;
          if (s > cap) s = cap;
          uint64_t a = now_ns();
          sleep_s(s);
          slept += now_ns() - a;
          break;
        }
        default:
          break;
      }
      if (!o->fast && (row % every == 0 || row + 1 == total)) sample(&x, i);
      if (o->progress && (row % pstep == 0)) progress(&x, row, total, t0);
      if (o->stop_on_failure && r->failed_allocs) {
        r->stopped = 1;
        done = row + 1;
        break;
      }
    }
    if (o->repeat && !r->stopped) end_rep(&x, &at_start, &dev_at_first, &dev_at_active);
  }
  uint64_t t1 = now_ns();
  if (o->progress && !r->stopped) progress(&x, total, total, t0);
  r->events = total;
  r->wall_s = (double)(t1 - t0 - slept - x.sample_ns) / 1e9;
  r->events_per_s = r->wall_s > 0 ? (double)done / r->wall_s : 0;
  r->alloc = latency(x.alat, x.na);
  r->free = latency(x.flat, x.nf);
  r->recorded_peak_reserved = t->recorded_peak;
  gma_stats_t s = GMA_STATS_INIT;
  gma_stats(x.g, &s); /* with --repeat, after the last repetition's mark */
  result_from_stats(r, &s, s.address_ranges != 0);
  if (r->reps_completed) r->device_allocs_after_first_rep = s.num_device_allocs - dev_at_first;
  if (r->plan_active_rep) r->device_allocs_after_plan_active = s.num_device_allocs - dev_at_active;
  int torch_rc = 0;
  if (o->torch_snapshot_path) { /* the end state, before what is left live goes back */
    if (gma_snapshot_write(x.g, o->torch_snapshot_path, GMA_SNAPSHOT_TORCH) != GMA_OK)
      torch_rc = fail(err, errlen, "%s", gma_last_error());
    gma_trace_stop(x.g);
    remove(torch_trace);
  }
  /* What the trace left live (pre-live memory never freed) goes back now. */
  uint64_t nptrs = 0, nfut = 0;
  release_held(&x, &nptrs, &nfut);
  for (size_t i = 0; i < x.nstreams; i++) gma_stream_destroy(x.g, x.streams[i].s);
  gma_destroy(x.g);
  free(x.streams);
  free(x.ptrs.s);
  free(x.futures.s);
  free(x.alat);
  free(x.flat);
  if (x.stream_error) fprintf(stderr, "gma-replay: some streams could not be created; their "
                                      "events ran on the default stream\n");
  return torch_rc;
}

/* s as a JSON string, quoted and escaped. */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

void replay_result_json(FILE *f, const replay_result_t *r) {
  fprintf(f,
          "{\"events\": %" PRIu64 ", \"replayed_calls\": %" PRIu64 ", \"peak_requested\": %" PRIu64
          ", \"peak_allocated\": %" PRIu64 ", \"peak_reserved\": %" PRIu64
          ", \"recorded_peak_reserved\": %" PRIu64 ", \"fragmentation_at_peak\": %.4f"
          ", \"device_allocs\": %" PRIu64 ", \"device_frees\": %" PRIu64
          ", \"mapped_peak\": %" PRIu64 ", \"vm_maps\": %" PRIu64 ", \"vm_unmaps\": %" PRIu64
          ", \"vm_creates\": %" PRIu64 ", \"growable\": %s"
          ", \"hits\": {\"bin\": %" PRIu64 ", \"stream\": %" PRIu64 ", \"pool\": %" PRIu64
          ", \"device\": %" PRIu64 "}, \"failed_allocs\": %" PRIu64 ", \"unmatched\": %" PRIu64
          ", \"oom_retries\": %" PRIu64 ", \"trace_peak_live\": %" PRIu64
          ", \"allocated_excludes_failed\": %s"
          ", \"recorded_failed\": %" PRIu64 ", \"oom_attempts\": %" PRIu64
          ", \"oom_served\": %" PRIu64 ", \"oom_failed\": %" PRIu64
          ", \"stopped_at_first_failure\": %s, \"capacity\": %" PRIu64
          ", \"alloc_ns\": {\"p50\": %" PRIu64 ", \"p99\": %" PRIu64 ", \"p999\": %" PRIu64
          ", \"max\": %" PRIu64 "}, \"free_ns\": {\"p50\": %" PRIu64 ", \"p99\": %" PRIu64
          ", \"p999\": %" PRIu64 ", \"max\": %" PRIu64 "}, \"wall_s\": %.6f"
          ", \"events_per_s\": %.0f",
          r->events, r->replayed, r->peak_requested, r->peak_allocated, r->peak_reserved,
          r->recorded_peak_reserved, r->fragmentation_at_peak, r->device_allocs, r->device_frees,
          r->mapped_peak, r->vm_maps, r->vm_unmaps, r->vm_creates, r->growable ? "true" : "false",
          r->hits_bin, r->hits_stream, r->hits_pool, r->hits_device, r->failed_allocs,
          r->unmatched, r->oom_retries, r->trace_peak_live, r->failed_allocs ? "true" : "false",
          r->recorded_failed, r->oom_attempts, r->oom_served, r->oom_attempts - r->oom_served,
          r->stopped ? "true" : "false", r->capacity, r->alloc.p50, r->alloc.p99, r->alloc.p999,
          r->alloc.max,
          r->free.p50, r->free.p99, r->free.p999, r->free.max, r->wall_s, r->events_per_s);
  /* Planned memory: gma_stats' plan fields at the end (all 0 under plan:off). */
  fprintf(f,
          ", \"repeat\": %" PRIu64 ", \"trace_events\": %" PRIu64 ", \"plan_state\": %d"
          ", \"plan_hits\": %" PRIu64 ", \"plan_misses\": %" PRIu64 ", \"plan_replans\": %" PRIu64
          ", \"plan_arena_bytes\": %" PRIu64 ", \"plan_lower_bound\": %" PRIu64
          ", \"plan_slots\": %" PRIu64 ", \"plan_iterations\": %" PRIu64,
          r->repeat, r->trace_events, r->plan_state, r->plan_hits, r->plan_misses, r->plan_replans,
          r->plan_arena_bytes, r->plan_lower_bound, r->plan_slots, r->plan_iterations);
  if (r->repeat) {
    fprintf(f,
            ", \"repetitions\": {\"completed\": %" PRIu64 ", \"peak_sampling\": \"%s\""
            ", \"peak_reserved_first_rep\": %" PRIu64 ", \"peak_reserved_last_rep\": %" PRIu64
            ", \"peak_reserved_max_after_first_rep\": %" PRIu64
            ", \"device_allocs_first_rep\": %" PRIu64
            ", \"device_allocs_after_first_rep\": %" PRIu64,
            r->reps_completed,
            r->rep_samples_per_alloc ? "after every allocation call" : "at repetition ends",
            r->peak_reserved_first_rep, r->peak_reserved_last_rep,
            r->peak_reserved_max_after_first_rep,
            r->device_allocs_first_rep, r->device_allocs_after_first_rep);
    if (r->plan_active_rep)
      fprintf(f,
              ", \"plan_active_after_rep\": %" PRIu64
              ", \"device_allocs_after_plan_active\": %" PRIu64,
              r->plan_active_rep, r->device_allocs_after_plan_active);
    else
      fputs(", \"plan_active_after_rep\": null, \"device_allocs_after_plan_active\": null", f);
    fprintf(f,
            ", \"rep_end_frees\": %" PRIu64 ", \"rep_end_futures\": %" PRIu64
            ", \"marks\": %" PRIu64 ", \"mark_failures\": %" PRIu64 ", \"mark_error\": ",
            r->rep_end_frees, r->rep_end_futures, r->marks, r->mark_failures);
    json_string(f, r->mark_failures ? r->mark_error : "");
    fputs(", \"reps\": [", f);
    for (size_t i = 0; i < r->nreps; i++) {
      const replay_rep_t *p = &r->reps[i];
      fprintf(f,
              "%s{\"rep\": %zu, \"peak_reserved\": %" PRIu64 ", \"peak_reserved_exact\": %s"
              ", \"peak_allocated\": %" PRIu64 ", \"reserved_end\": %" PRIu64
              ", \"device_allocs\": %" PRIu64 ", \"plan_state\": %d, \"plan_hits\": %" PRIu64
              ", \"plan_misses\": %" PRIu64 "}",
              i ? ", " : "", i + 1, p->peak_reserved, p->peak_exact ? "true" : "false",
              p->peak_allocated, p->reserved_end, p->device_allocs, p->plan_state, p->plan_hits,
              p->plan_misses);
    }
    fputs("]}", f);
  }
  fputc('}', f);
}

/* ---- The smallest workable capacity ------------------------------------------------ */

static int try_capacity(const replay_trace_t *t, const char *conf, uint64_t cap, int confirm,
                        replay_capacity_t *c, const replay_capacity_options_t *o, uint64_t lo,
                        uint64_t hi_if_ok, uint64_t hi_if_fail, replay_result_t *res, char *err,
                        size_t errlen) {
  replay_options_t ro = {.device = "sim", .capacity = cap, .fast = 1, .stop_on_failure = 1,
                         .repeat = o->repeat};
  uint64_t t0 = now_ns();
  if (replay_run(t, conf, &ro, res, err, errlen) != 0) return -1;
  replay_capacity_step_t st = {
      .capacity = cap,
      .ok = res->failed_allocs == 0,
      .confirm = confirm,
      .failed_allocs = res->failed_allocs,
      .first_failed_event = res->first_failed_event,
      .first_failed_rep = res->first_failed_rep,
      .peak_reserved = res->peak_reserved,
      .wall_s = (double)(now_ns() - t0) / 1e9,
  };
  replay_capacity_step_t *v = realloc(c->steps, (c->nsteps + 1) * sizeof *v);
  if (!v) return fail(err, errlen, "out of host memory");
  c->steps = v;
  memcpy(st.first_error, res->first_error, sizeof st.first_error);
  c->steps[c->nsteps++] = st;
  c->replays++;
  if (o->on_step) o->on_step(o->arg, &st, st.ok ? lo : cap, st.ok ? hi_if_ok : hi_if_fail);
  return st.ok;
}

/* The smallest capacity that succeeded at every replay of it, above lo. */
static uint64_t smallest_clean_success(const replay_capacity_t *c, uint64_t lo) {
  uint64_t best = 0;
  for (size_t i = 0; i < c->nsteps; i++) {
    uint64_t cap = c->steps[i].capacity;
    if (!c->steps[i].ok || cap <= lo || (best && cap >= best)) continue;
    bool clean = true;
    for (size_t j = 0; j < c->nsteps; j++)
      if (c->steps[j].capacity == cap && !c->steps[j].ok) clean = false;
    if (clean) best = cap;
  }
  return best;
}

int replay_min_capacity(const replay_trace_t *t, const char *conf,
                        const replay_capacity_options_t *opt, replay_capacity_t *c, char *err,
                        size_t errlen) {
  replay_capacity_options_t o = opt ? *opt : (replay_capacity_options_t){0};
  if (o.precision <= 0) o.precision = 0.002;
  if (o.confirm == 0) o.confirm = 1;
  if (o.confirm < 0) o.confirm = 0;
  /* cap_min: one 2 MiB chunk, the least a growable pool maps (the simulated
   * device's granularity); below it expandable_segments:true cannot even be
   * configured, which would end the search with a config error. */
  const uint64_t MiB = 1ull << 20, cap_min = 2 * MiB, cap_max = 1024ull << 40;
  if (!o.max_capacity || o.max_capacity > cap_max) o.max_capacity = cap_max;
  memset(c, 0, sizeof *c);
  if (!t->peak_live) /* no capacity is the smallest: every one works */
    return fail(err, errlen, "%s allocates nothing: there is no smallest capacity to find", t->name);
  c->lower_bound = t->peak_live;
  c->recorded_peak_reserved = t->has_recorded ? t->recorded_peak : 0;
  uint64_t t0 = now_ns();
  replay_result_t res;
  /* The bracket: lo is not workable (or is the bound nothing beats), hi is. */
  uint64_t lo = t->peak_live > cap_min ? t->peak_live : cap_min - 1;
  uint64_t top = c->recorded_peak_reserved > t->peak_live ? c->recorded_peak_reserved
                                                           : t->peak_live;
  uint64_t hi = top > o.max_capacity / 2 ? o.max_capacity : 2 * top; /* 2 * top may wrap */
  if (hi < cap_min) hi = cap_min;
  if (hi > o.max_capacity) hi = o.max_capacity;
  int rc;
  /* Find a workable upper end, doubling. */
  for (;;) {
    rc = try_capacity(t, conf, hi, 0, c, &o, lo, hi, hi * 2, &res, err, errlen);
    if (rc < 0) goto out;
    if (rc) break;
    lo = hi;
    if (hi >= o.max_capacity) { /* nothing workable up to the cap */
      c->failing = lo;
      rc = 0;
      goto out;
    }
    hi = hi > o.max_capacity / 2 ? o.max_capacity : hi * 2;
  }
  c->at_min = res;
  for (int rounds = 0;; rounds++) {
    /* Bisect (lo, hi] down to the precision or the budget. */
    while ((double)(hi - lo) > o.precision * (double)hi && hi - lo > 1) {
      if (o.budget_s > 0 && (double)(now_ns() - t0) / 1e9 >= o.budget_s) {
        c->budget_hit = 1;
        break;
      }
      uint64_t mid = lo + (hi - lo) / 2;
      rc = try_capacity(t, conf, mid, 0, c, &o, lo, mid, hi, &res, err, errlen);
      if (rc < 0) goto out;
      if (rc) {
        hi = mid;
        c->at_min = res;
      } else {
        lo = mid;
      }
    }
    /* Confirm the answer: every replay of it must succeed. */
    int bad = 0;
    for (int k = 0; k < o.confirm && !bad; k++) {
      rc = try_capacity(t, conf, hi, 1, c, &o, lo, hi, hi, &res, err, errlen);
      if (rc < 0) goto out;
      if (rc) c->at_min = res;
      bad = !rc;
    }
    if (!bad) break;
    /* Not repeatable at hi: it is not workable. Go on above it, up to the
     * smallest capacity that never failed (doubling when there is none). */
    lo = hi;
    uint64_t next = smallest_clean_success(c, lo);
    while (!next && rounds < 4) {
      uint64_t up = hi > o.max_capacity / 2 ? o.max_capacity : hi * 2;
      if (up <= hi) break;
      hi = up;
      rc = try_capacity(t, conf, hi, 0, c, &o, lo, hi, hi * 2, &res, err, errlen);
      if (rc < 0) goto out;
      if (rc) {
        next = hi;
        c->at_min = res;
      } else {
        lo = hi;
      }
    }
    hi = next; /* 0: none */
    if (!hi || rounds >= 4) break; /* give up refining: report the smallest clean success */
  }
  c->min_capacity = hi;
  c->failing = lo;
  c->width = hi ? (double)(hi - lo) / (double)hi : 0;
  rc = 0;
out:
  /* Monotonicity: a capacity failed that is not below every success. */
  for (size_t i = 0; i < c->nsteps; i++)
    for (size_t j = 0; j < c->nsteps; j++)
      if (!c->steps[i].ok && c->steps[j].ok && c->steps[i].capacity >= c->steps[j].capacity)
        c->unstable = 1;
  c->wall_s = (double)(now_ns() - t0) / 1e9;
  return rc < 0 ? -1 : 0;
}

void replay_capacity_free(replay_capacity_t *c) {
  if (!c) return;
  free(c->steps);
  c->steps = NULL;
  c->nsteps = 0;
}

void replay_capacity_json(FILE *f, const replay_capacity_t *c) {
  fprintf(f,
          "{\"min_capacity\": %" PRIu64 ", \"failing_capacity\": %" PRIu64
          ", \"lower_bound_peak_live\": %" PRIu64 ", \"recorded_peak_reserved\": %" PRIu64
          ", \"min_over_recorded\": %.4f, \"min_over_peak_live\": %.4f, \"width\": %.5f"
          ", \"replays\": %d, \"unstable\": %s, \"budget_hit\": %s, \"wall_s\": %.3f"
          ", \"at_min\": {\"peak_reserved\": %" PRIu64 ", \"peak_allocated\": %" PRIu64
          ", \"recorded_failed\": %" PRIu64 ", \"oom_served\": %" PRIu64
          ", \"oom_failed\": %" PRIu64 "}, \"steps\": [",
          c->min_capacity, c->failing, c->lower_bound, c->recorded_peak_reserved,
          c->recorded_peak_reserved && c->min_capacity
              ? (double)c->min_capacity / (double)c->recorded_peak_reserved
              : 0,
          c->lower_bound && c->min_capacity ? (double)c->min_capacity / (double)c->lower_bound : 0,
          c->width, c->replays, c->unstable ? "true" : "false", c->budget_hit ? "true" : "false",
          c->wall_s, c->at_min.peak_reserved, c->at_min.peak_allocated, c->at_min.recorded_failed,
          c->at_min.oom_served, c->at_min.oom_attempts - c->at_min.oom_served);
  for (size_t i = 0; i < c->nsteps; i++) {
    const replay_capacity_step_t *s = &c->steps[i];
    fprintf(f, "%s{\"capacity\": %" PRIu64 ", \"ok\": %s, \"confirm\": %s", i ? ", " : "",
            s->capacity, s->ok ? "true" : "false", s->confirm ? "true" : "false");
    if (!s->ok)
      fprintf(f, ", \"first_failed_event\": %" PRIu64, s->first_failed_event);
    if (!s->ok && s->first_failed_rep)
      fprintf(f, ", \"first_failed_rep\": %" PRIu64, s->first_failed_rep);
    fprintf(f, ", \"peak_reserved\": %" PRIu64 ", \"wall_s\": %.4f}", s->peak_reserved, s->wall_s);
  }
  fputs("]}", f);
}
