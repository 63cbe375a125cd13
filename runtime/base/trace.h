/* Trace recording: every allocation event of one allocator, written as gma's
 * trace CSV (see README, "Traces: the CSV format").
 *
 * Off, it costs each event one relaxed load and a predictable branch
 * (gma__trace_on). On, an event takes the clock and appends a 56-byte binary
 * record to a buffer under a short mutex; a full buffer is swapped for a
 * spare and formatted to the file by the thread that filled it, under a
 * second mutex that keeps buffers in order, so other threads go on
 * recording meanwhile. Rows are sorted by time within each buffer; an event
 * is timestamped when it takes effect (an allocation after it succeeded, a
 * free before it runs), so a row never precedes one it causally follows.
 *
 * A trace object stays allocated until gma_destroy once started: a thread
 * that loaded the pointer just before gma_trace_stop may still append (its
 * record is dropped once the trace is closed). */
#ifndef GMA_TRACE_H
#define GMA_TRACE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/atomics.h"
#include "gma.h"

typedef enum gma__trace_action {
  GMA__TR_ALLOCATE,
  GMA__TR_ALLOCATE_FAILURE,
  GMA__TR_FREE,
  GMA__TR_RECORD_STREAM,
  GMA__TR_ASYNC_SUBMIT,
  GMA__TR_ASYNC_COMPLETE,
  GMA__TR_BATCH,
  GMA__TR_SEGMENT_ALLOC,
  GMA__TR_SEGMENT_FREE,
  GMA__TR_SEGMENT_MAP,
  GMA__TR_SEGMENT_UNMAP,
  GMA__TR_TRIM,
  GMA__TR_OOM,
  GMA__TR_NACTIONS
} gma__trace_action_t;

/* trim rows' Status */
enum { GMA__TRIM_EXPLICIT = 1, GMA__TRIM_TIMED = 2, GMA__TRIM_PRESSURE = 3 };

typedef struct gma__trace_rec {
  uint64_t t_ns; /* CLOCK_MONOTONIC */
  uint64_t ptr, size, stream, block, id, count;
  uint32_t thread;
  int16_t status; /* gma_status_t for failures; GMA__TRIM_* for trim rows */
  uint8_t action;
} gma__trace_rec_t;

typedef struct gma__trace {
  pthread_mutex_t rec_mu;   /* guards buf, n, closed */
  pthread_mutex_t write_mu; /* guards f, spare; held while a full buffer is written */
  gma__trace_rec_t *buf, *spare;
  size_t n, cap;
  bool closed;
  FILE *f;
  uint64_t t0_ns;       /* immutable: Time 0 */
  uint64_t serial;      /* immutable: never reused, validates thread caches */
  _Atomic uint32_t next_thread;
  uint64_t dropped;     /* rec_mu: records that could not be written (I/O error) */
  struct gma__trace *older; /* traces stopped earlier, freed at destroy */
  char *path;           /* immutable: the file (gma_snapshot_write reads the rows back) */
} gma__trace_t;

/* The recording trace, or NULL: the only cost when tracing is off. */
static inline gma__trace_t *gma__trace_on(gma__trace_t *_Atomic const *slot) {
  gma__trace_t *t = gma__load_acquire((gma__trace_t *_Atomic *)slot);
  return __builtin_expect(t != NULL, 0) ? t : NULL;
}

uint64_t gma__trace_now(void);
/* Appends one event (t_ns from gma__trace_now, taken when it took effect). */
void gma__trace_emit(gma__trace_t *t, uint64_t t_ns, gma__trace_action_t action, uint64_t ptr,
                     uint64_t size, uint64_t stream, uint64_t block, uint64_t id, uint64_t count,
                     int status);
/* Opens path and writes the header; GMA_ERR_CONFIG if it cannot be created. */
gma_status_t gma__trace_open(const char *path, gma__trace_t **out);
/* Writes what is buffered and flushes the file, which stays open, so that
 * the file holds every row recorded before the call; *bytes (if not NULL) is
 * the file's length then. GMA_ERR_INVALID_ARGUMENT when the trace is closed,
 * GMA_ERR_DEVICE on an I/O error. */
gma_status_t gma__trace_flush(gma__trace_t *t, uint64_t *bytes);
/* Writes what is buffered and closes the file; the object stays (see above). */
gma_status_t gma__trace_close(gma__trace_t *t);
/* Closes (if open) and frees t and every older trace. No other thread may
 * use them any more. */
void gma__trace_free(gma__trace_t *t);
/* In a child process after fork(), for a trace inherited from the parent:
 * frees t and every older trace without writing anything (the records and
 * the file are the parent's) and without waiting for a lock a parent thread
 * may have held at fork time; a trace whose lock was held then is leaked. */
void gma__trace_abandon(gma__trace_t *t);

#endif /* GMA_TRACE_H */
