/* Owns the PyTorch form of gma_snapshot_write (api/observe.c checks its
 * arguments; gma's JSON is snapshot.c's): torch.cuda.memory._snapshot()'s, a
 * pickle (pickle.h) of the segments and blocks and, when a trace is
 * running, its events read back from the trace file in PyTorch's trace-entry
 * form. gma.h documents the structure. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/allocator.h"
#include "observe/observe.h"
#include "observe/pickle.h"
#include "base/trace.h"

/* ---- Segments ------------------------------------------------------------------ */

static const char *torch_state(uint8_t st) {
  switch (st) {
    case GMA__LIVE: return "active_allocated";
    case GMA__PENDING: return "active_pending_free";
    default: return "inactive"; /* binned, cached, free: reusable without the program */
  }
}

/* A live block's size and requested bytes; a plan's arena is one block whose
 * requested bytes are its planned blocks'. */
static uint64_t block_requested(gma_t *g, gma__block_t *b) {
  uint64_t pl_live, pl_req;
  if (g->cfg.plan && gma__plan_snapshot(&g->plan, b->addr, NULL, true, &pl_live, &pl_req))
    return pl_req;
  return gma__load_relaxed(&b->requested);
}

/* Pool lock held. */
static void write_segment(gma__pk_t *w, gma_t *g, gma__segment_t *seg) {
  uint64_t allocated = 0, active = 0, requested = 0;
  uintptr_t stream = 0;
  for (gma__block_t *b = seg->first; b; b = b->next) {
    uint8_t st = gma__load_relaxed(&b->state);
    if (st == GMA__LIVE) {
      allocated += b->size;
      requested += block_requested(g, b);
    }
    if (st == GMA__LIVE || st == GMA__PENDING) active += b->size;
    if (!stream && st != GMA__FREE && b->stream) stream = (uintptr_t)b->stream->handle;
  }
  gma__pk_dict_begin(w);
  gma__pk_kv_int(w, "device", g->cfg.device_ordinal);
  gma__pk_kv_uint(w, "address", seg->base);
  gma__pk_kv_uint(w, "total_size", seg->size);
  gma__pk_kv_uint(w, "allocated_size", allocated);
  gma__pk_kv_uint(w, "active_size", active);
  gma__pk_kv_uint(w, "requested_size", requested);
  gma__pk_kv_uint(w, "stream", stream);
  gma__pk_kv_str(w, "segment_type", seg->kind == GMA__SMALL ? "small" : "large");
  gma__pk_str(w, "segment_pool_id");
  gma__pk_tuple_begin(w);
  gma__pk_uint(w, 0);
  gma__pk_uint(w, 0);
  gma__pk_tuple_end(w);
  gma__pk_str(w, "is_expandable");
  gma__pk_bool(w, seg->range != NULL);
  gma__pk_str(w, "frames");
  gma__pk_list_begin(w);
  gma__pk_list_end(w);
  gma__pk_str(w, "blocks");
  gma__pk_list_begin(w);
  for (gma__block_t *b = seg->first; b; b = b->next) {
    uint8_t st = gma__load_relaxed(&b->state);
    gma__pk_dict_begin(w);
    gma__pk_kv_uint(w, "address", b->addr);
    gma__pk_kv_uint(w, "size", b->size);
    gma__pk_kv_uint(w, "requested_size", st == GMA__LIVE ? block_requested(g, b) : 0);
    gma__pk_kv_str(w, "state", torch_state(st));
    gma__pk_str(w, "frames");
    gma__pk_list_begin(w);
    gma__pk_list_end(w);
    gma__pk_dict_end(w);
  }
  gma__pk_list_end(w);
  gma__pk_dict_end(w);
}

/* ---- Trace events ------------------------------------------------------------------ */

static void trace_entry(gma__pk_t *w, const char *action, uint64_t addr, uint64_t size,
                        uint64_t stream, uint64_t time_us) {
  gma__pk_dict_begin(w);
  gma__pk_kv_str(w, "action", action);
  gma__pk_kv_uint(w, strcmp(action, "oom") == 0 ? "device_free" : "addr", addr);
  gma__pk_kv_uint(w, "size", size);
  gma__pk_kv_uint(w, "stream", stream);
  gma__pk_kv_uint(w, "time_us", time_us);
  gma__pk_str(w, "frames");
  gma__pk_list_begin(w);
  gma__pk_list_end(w);
  gma__pk_dict_end(w);
}

static uint64_t num(const char *s, int base) {
  if (base == 16 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
  return strtoull(s, NULL, base);
}

/* "seconds.fraction" as microseconds. */
static uint64_t time_us(const char *s) {
  char *end;
  uint64_t us = strtoull(s, &end, 10) * 1000000u;
  if (*end == '.') {
    uint64_t scale = 100000;
    for (const char *p = end + 1; *p >= '0' && *p <= '9' && scale; p++, scale /= 10)
      us += (uint64_t)(*p - '0') * scale;
  }
  return us;
}

/* One CSV row of the trace (trace.c's columns: Thread,Time,Action,Pointer,
 * Size,Stream,Block,Id,Count,Status) as PyTorch trace entries. */
static void row_entries(gma__pk_t *w, char *line) {
  char *f[10];
  int n = 0;
  for (char *p = line; n < 10;) {
    f[n++] = p;
    char *c = strchr(p, ',');
    if (!c) break;
    *c = '\0';
    p = c + 1;
  }
  if (n < 10) return;
  const char *a = f[2];
  uint64_t ptr = num(f[3], 16), size = num(f[4], 10), stream = num(f[5], 16), t = time_us(f[1]);
  bool ok = f[9][0] == '\0';
  if (strcmp(a, "allocate") == 0) {
    trace_entry(w, "alloc", ptr, size, stream, t);
  } else if (strcmp(a, "async_complete") == 0) {
    if (ok && num(f[8], 10) == 0 && ptr) trace_entry(w, "alloc", ptr, size, stream, t);
  } else if (strcmp(a, "free") == 0) {
    trace_entry(w, "free_requested", ptr, size, stream, t);
    trace_entry(w, "free_completed", ptr, size, stream, t);
  } else if (strcmp(a, "segment_alloc") == 0 || strcmp(a, "segment_free") == 0 ||
             strcmp(a, "segment_map") == 0 || strcmp(a, "segment_unmap") == 0) {
    trace_entry(w, a, ptr, size, stream, t);
  } else if (strcmp(a, "oom") == 0) {
    trace_entry(w, "oom", 0, size, stream, t);
  }
}

/* The first `bytes` bytes of the trace file, row by row, as entries. Returns
 * 0 or an errno. */
static int write_events(gma__pk_t *w, const char *path, uint64_t bytes) {
  FILE *in = fopen(path, "r");
  if (!in) return errno ? errno : EIO;
  char *line = NULL;
  size_t cap = 0;
  uint64_t at = 0;
  ssize_t len;
  bool header = true;
  while (at < bytes && (len = getline(&line, &cap, in)) > 0) {
    at += (uint64_t)len;
    if (at > bytes || line[len - 1] != '\n') break; /* a row written after the flush */
    line[len - 1] = '\0';
    if (header) {
      header = false;
      continue;
    }
    row_entries(w, line);
  }
  int err = ferror(in) ? (errno ? errno : EIO) : 0;
  free(line);
  fclose(in);
  return err;
}

/* ---- The call ------------------------------------------------------------------------ */

/* Every segment, in one gma__pool_with_lock (lock held). */
typedef struct segments_walk {
  gma__pk_t *w;
  gma_t *g;
} segments_walk_t;
static void write_segments(void *arg) {
  segments_walk_t *sw = arg;
  gma__pool_t *p = &sw->g->pool;
  for (size_t i = 0; i < p->nsegs; i++) write_segment(sw->w, sw->g, p->segs[i]);
}

gma_status_t gma__snapshot_torch(gma_t *g, const char *path) {
  const char *fn = "gma_snapshot_write";
  /* The running trace's rows, up to now, into its file (before the pool
   * lock: the lock order is the pool's lock, then the trace's). The trace
   * object outlives a concurrent gma_trace_stop (trace.h). */
  gma__trace_t *t = gma__trace_on(&g->pool.trace);
  uint64_t trace_bytes = 0;
  if (t && gma__trace_flush(t, &trace_bytes) != GMA_OK) t = NULL; /* stopped meanwhile */
  FILE *f = fopen(path, "wb");
  if (!f)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "%s: cannot create '%s': %s", fn, path,
                          strerror(errno));
  struct stat sb;
  bool regular = fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode); /* removed on failure */
  gma__pk_t w;
  gma__pk_begin(&w, f);
  gma__pk_dict_begin(&w);
  gma__pk_str(&w, "segments");
  gma__pk_list_begin(&w);
  segments_walk_t sw = {&w, g};
  gma__pool_with_lock(&g->pool, write_segments, &sw);
  gma__pk_list_end(&w);
  gma__pk_str(&w, "device_traces");
  gma__pk_list_begin(&w);
  for (int d = 0; d < g->cfg.device_ordinal; d++) {
    gma__pk_list_begin(&w);
    gma__pk_list_end(&w);
  }
  gma__pk_list_begin(&w);
  int read_err = t ? write_events(&w, t->path, trace_bytes) : 0;
  gma__pk_list_end(&w);
  gma__pk_list_end(&w);
  gma__pk_dict_end(&w);
  int err = gma__pk_finish(&w);
  if (fclose(f) != 0 && !err) err = errno ? errno : EIO;
  if (err || read_err) {
    if (regular) remove(path);
    if (err)
      return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "%s: writing '%s' failed: %s", fn, path,
                            strerror(err));
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s: reading the running trace '%s' back failed: %s", fn, t->path,
                          strerror(read_err));
  }
  return GMA_OK;
}
