/* Owns the trace recorder (see base/trace.h): binary records buffered under a
 * short lock, formatted to CSV by the thread that fills a buffer. Every layer
 * records through it; starting and stopping a trace is observe/trace.c. */
#include "base/trace.h"
#include "base/lock.h"
#include "base/error.h"
#include "base/clock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


#define TRACE_BUF_RECORDS 16384

static const char *const action_names[GMA__TR_NACTIONS] = {
    [GMA__TR_ALLOCATE] = "allocate",
    [GMA__TR_ALLOCATE_FAILURE] = "allocate failure",
    [GMA__TR_FREE] = "free",
    [GMA__TR_RECORD_STREAM] = "record_stream",
    [GMA__TR_ASYNC_SUBMIT] = "async_submit",
    [GMA__TR_ASYNC_COMPLETE] = "async_complete",
    [GMA__TR_BATCH] = "batch",
    [GMA__TR_SEGMENT_ALLOC] = "segment_alloc",
    [GMA__TR_SEGMENT_FREE] = "segment_free",
    [GMA__TR_SEGMENT_MAP] = "segment_map",
    [GMA__TR_SEGMENT_UNMAP] = "segment_unmap",
    [GMA__TR_TRIM] = "trim",
    [GMA__TR_OOM] = "oom",
};

static _Atomic uint64_t next_serial = 1;

uint64_t gma__trace_now(void) { return gma__now_ns(); }

/* The calling thread's small number in t: assigned on its first event,
 * cached per thread for the last few traces it recorded into. */
#define THREAD_SLOTS 4
static _Thread_local struct {
  uint64_t serial;
  uint32_t index;
} thread_slots[THREAD_SLOTS];

static uint32_t thread_index(gma__trace_t *t) {
  for (int i = 0; i < THREAD_SLOTS; i++)
    if (thread_slots[i].serial == t->serial) return thread_slots[i].index;
  uint32_t idx = gma__faa_relaxed(&t->next_thread, 1);
  int victim = (int)(t->serial % THREAD_SLOTS);
  thread_slots[victim].serial = t->serial;
  thread_slots[victim].index = idx;
  return idx;
}

static const char *status_text(const gma__trace_rec_t *r) {
  if (r->action == GMA__TR_TRIM)
    return r->status == GMA__TRIM_TIMED      ? "timed"
           : r->status == GMA__TRIM_PRESSURE ? "pressure"
                                             : "explicit";
  return r->status ? gma_status_name((gma_status_t)r->status) : "";
}

/* Events are appended nearly in time order; insertion sort is linear then. */
static void sort_by_time(gma__trace_rec_t *v, size_t n) {
  for (size_t i = 1; i < n; i++) {
    if (v[i].t_ns >= v[i - 1].t_ns) continue;
    gma__trace_rec_t x = v[i];
    size_t j = i;
    while (j > 0 && v[j - 1].t_ns > x.t_ns) {
      v[j] = v[j - 1];
      j--;
    }
    v[j] = x;
  }
}

/* Decimal and hex digits by hand: fprintf cost ~200 ns a row, this ~30. */
static char *put_dec(char *o, uint64_t v) {
  char tmp[20];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n) *o++ = tmp[--n];
  return o;
}

static char *put_hex(char *o, uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  char tmp[16];
  int n = 0;
  do {
    tmp[n++] = digits[v & 15];
    v >>= 4;
  } while (v);
  *o++ = '0';
  *o++ = 'x';
  while (n) *o++ = tmp[--n];
  return o;
}

static char *put_str(char *o, const char *s) {
  while (*s) *o++ = *s++;
  return o;
}

/* write_mu held. Returns false on an I/O error. */
static bool write_records(gma__trace_t *t, gma__trace_rec_t *v, size_t n) {
  sort_by_time(v, n);
  char buf[256];
  for (size_t i = 0; i < n; i++) {
    const gma__trace_rec_t *r = &v[i];
    uint64_t dt = r->t_ns > t->t0_ns ? r->t_ns - t->t0_ns : 0, frac = dt % 1000000000u;
    char *o = put_dec(buf, r->thread);
    *o++ = ',';
    o = put_dec(o, dt / 1000000000u);
    *o++ = '.';
    for (uint64_t d = 100000000u; d; d /= 10) *o++ = (char)('0' + frac / d % 10);
    *o++ = ',';
    o = put_str(o, action_names[r->action]);
    *o++ = ',';
    o = put_hex(o, r->ptr);
    *o++ = ',';
    o = put_dec(o, r->size);
    *o++ = ',';
    o = put_hex(o, r->stream);
    *o++ = ',';
    o = put_dec(o, r->block);
    *o++ = ',';
    o = put_dec(o, r->id);
    *o++ = ',';
    o = put_dec(o, r->count);
    *o++ = ',';
    o = put_str(o, status_text(r));
    *o++ = '\n';
    if (fwrite(buf, 1, (size_t)(o - buf), t->f) != (size_t)(o - buf)) return false;
  }
  return true;
}

void gma__trace_emit(gma__trace_t *t, uint64_t t_ns, gma__trace_action_t action, uint64_t ptr,
                     uint64_t size, uint64_t stream, uint64_t block, uint64_t id, uint64_t count,
                     int status) {
  gma__trace_rec_t rec = {.t_ns = t_ns, .ptr = ptr, .size = size, .stream = stream,
                          .block = block, .id = id, .count = count,
                          .thread = thread_index(t), .status = (int16_t)status,
                          .action = (uint8_t)action};
  for (;;) {
    gma__lock(&t->rec_mu, GMA__RANK_TRACE_REC);
    if (t->closed) {
      gma__unlock(&t->rec_mu);
      return;
    }
    if (t->n < t->cap) {
      t->buf[t->n++] = rec;
      gma__unlock(&t->rec_mu);
      return;
    }
    gma__unlock(&t->rec_mu);
    /* Full: swap in the spare (under write_mu, so buffers are written in the
     * order they filled) and write the full one; others record meanwhile. */
    gma__lock(&t->write_mu, GMA__RANK_TRACE_WRITE);
    gma__lock(&t->rec_mu, GMA__RANK_TRACE_REC);
    gma__trace_rec_t *full = NULL;
    size_t n = 0;
    if (!t->closed && t->n == t->cap) {
      full = t->buf;
      n = t->n;
      t->buf = t->spare;
      t->n = 0;
    }
    gma__unlock(&t->rec_mu);
    if (full) {
      if (!write_records(t, full, n)) {
        gma__lock(&t->rec_mu, GMA__RANK_TRACE_REC);
        t->dropped += n;
        gma__unlock(&t->rec_mu);
      }
      t->spare = full;
    }
    gma__unlock(&t->write_mu);
  }
}

gma_status_t gma__trace_open(const char *path, gma__trace_t **out) {
  gma__trace_t *t = calloc(1, sizeof *t);
  if (!t) return gma__set_error(GMA_ERR_OOM, "no host memory for a trace");
  t->cap = TRACE_BUF_RECORDS;
  t->buf = malloc(t->cap * sizeof *t->buf);
  t->spare = malloc(t->cap * sizeof *t->spare);
  t->path = strdup(path);
  t->f = t->buf && t->spare && t->path ? fopen(path, "w") : NULL;
  if (!t->f) {
    int err = errno;
    gma_status_t st = t->buf && t->spare && t->path
                          ? gma__set_error(GMA_ERR_CONFIG, "cannot create '%s' for the trace: %s", path,
                                           strerror(err))
                          : gma__set_error(GMA_ERR_OOM, "no host memory for the trace's buffers");
    free(t->path);
    free(t->buf);
    free(t->spare);
    free(t);
    return st;
  }
  fputs("Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status\n", t->f);
  pthread_mutex_init(&t->rec_mu, NULL);
  pthread_mutex_init(&t->write_mu, NULL);
  t->t0_ns = gma__trace_now();
  t->serial = gma__faa_relaxed(&next_serial, 1);
  gma__atomic_init(&t->next_thread, 0);
  *out = t;
  return GMA_OK;
}

gma_status_t gma__trace_flush(gma__trace_t *t, uint64_t *bytes) {
  gma__lock(&t->write_mu, GMA__RANK_TRACE_WRITE); /* as a full buffer's swap in gma__trace_emit */
  gma__lock(&t->rec_mu, GMA__RANK_TRACE_REC);
  bool open = !t->closed;
  gma__trace_rec_t *full = t->buf;
  size_t n = open ? t->n : 0;
  if (open) {
    t->buf = t->spare;
    t->n = 0;
  }
  gma__unlock(&t->rec_mu);
  gma_status_t st = GMA_OK;
  if (!open) {
    st = gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the trace was stopped");
  } else {
    bool ok = write_records(t, full, n);
    ok = fflush(t->f) == 0 && ok;
    t->spare = full;
    long at = ftell(t->f);
    if (bytes) *bytes = at > 0 ? (uint64_t)at : 0;
    if (!ok) {
      gma__lock(&t->rec_mu, GMA__RANK_TRACE_REC);
      t->dropped += n;
      gma__unlock(&t->rec_mu);
      st = gma__set_error(GMA_ERR_DEVICE, "writing the trace file '%s' failed: %s", t->path,
                          strerror(errno));
    }
  }
  gma__unlock(&t->write_mu);
  return st;
}

gma_status_t gma__trace_close(gma__trace_t *t) {
  gma__lock(&t->write_mu, GMA__RANK_TRACE_WRITE);
  gma__lock(&t->rec_mu, GMA__RANK_TRACE_REC);
  bool was_open = !t->closed;
  t->closed = true;
  size_t n = t->n;
  t->n = 0;
  gma__unlock(&t->rec_mu);
  gma_status_t st = GMA_OK;
  if (was_open) {
    bool ok = write_records(t, t->buf, n);
    ok = fclose(t->f) == 0 && ok;
    t->f = NULL;
    if (!ok || t->dropped)
      st = gma__set_error(GMA_ERR_DEVICE, "writing the trace file failed (%s); %" PRIu64
                          " events lost", strerror(errno), t->dropped + (ok ? 0 : n));
  }
  gma__unlock(&t->write_mu);
  return st;
}

/* Frees one closed trace object, its locks unheld. */
static void trace_release(gma__trace_t *t) {
  pthread_mutex_destroy(&t->rec_mu);
  pthread_mutex_destroy(&t->write_mu);
  free(t->buf);
  free(t->spare);
  free(t->path);
  free(t);
}

void gma__trace_free(gma__trace_t *t) {
  while (t) {
    gma__trace_t *older = t->older;
    gma__trace_close(t);
    trace_release(t);
    t = older;
  }
}

void gma__trace_abandon(gma__trace_t *t) {
  while (t) {
    gma__trace_t *older = t->older;
    /* A lock that cannot be taken was held by a parent thread when fork()
     * ran: buf, spare or f may be half swapped, so the trace is left alone. */
    if (gma__trylock(&t->write_mu, GMA__RANK_TRACE_WRITE)) {
      if (gma__trylock(&t->rec_mu, GMA__RANK_TRACE_REC)) {
        if (t->f) {
          /* The FILE's buffer holds bytes the parent writes too (at least
           * the header): drop them, then close the child's descriptor. */
          __fpurge(t->f);
          fclose(t->f);
        }
        gma__unlock(&t->rec_mu);
        gma__unlock(&t->write_mu);
        trace_release(t);
      } else {
        gma__unlock(&t->write_mu);
      }
    }
    t = older;
  }
}
