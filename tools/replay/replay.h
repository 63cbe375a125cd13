/* The replay engine behind tools/gma-replay: loads a trace in gma's CSV
 * format (README: "Traces: the CSV format"; RMM's six columns alone work
 * too) and replays it on a gma allocator, measuring what the allocator did.
 * Used by the gma-replay command and by the trace round-trip test. */
#ifndef GMA_REPLAY_H
#define GMA_REPLAY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gma.h"

typedef enum replay_action {
  RA_ALLOCATE,
  RA_ALLOCATE_FAILURE,
  RA_FREE,
  RA_RECORD_STREAM,
  RA_ASYNC_SUBMIT,
  RA_ASYNC_COMPLETE,
  RA_BATCH,
  RA_SEGMENT_ALLOC,
  RA_SEGMENT_FREE,
  RA_SEGMENT_MAP,
  RA_SEGMENT_UNMAP,
  RA_TRIM,
  RA_OOM,
  RA_IDLE,
  RA_NACTIONS
} replay_action_t;

typedef struct replay_event {
  double time;
  uint64_t ptr, size, stream, id, count;
  uint8_t action;   /* replay_action_t */
  uint8_t failed;   /* the Status column named a failure */
  uint8_t explicit_trim;
} replay_event_t;

typedef struct replay_trace {
  char name[256];
  replay_event_t *ev;
  size_t n;
  size_t count[RA_NACTIONS];
  int has_recorded;          /* it has segment rows: the recording allocator's reserved curve */
  uint64_t recorded_peak;    /* peak of that curve */
} replay_trace_t;

/* Parses a trace from f (rows sorted by time, stably, after loading).
 * Returns 0, or -1 with a message naming the line in err. */
int replay_parse(FILE *f, const char *name, replay_trace_t **out, char *err, size_t errlen);
int replay_load(const char *path, replay_trace_t **out, char *err, size_t errlen);
void replay_trace_free(replay_trace_t *t);

typedef struct replay_options {
  const char *device;       /* "sim" (default) or "cuda" */
  FILE *timeline;           /* if set: Event,Time,Allocated,Reserved,RecordedReserved rows;
                               Allocated is the highest live (requested) bytes since the
                               previous row, so peaks survive the downsampling */
  size_t samples;           /* timeline points (default 2000) */
  const char *snapshot_path; /* if set: gma_snapshot_json at the sampled peak reserved */
  int progress;             /* draw a progress bar on stderr */
  const char *label;        /* for the progress bar */
  double max_idle_s;        /* cap on one idle row's sleep (default 1 s) */
} replay_options_t;

typedef struct replay_latency {
  uint64_t n, p50, p99, p999, max; /* nanoseconds */
} replay_latency_t;

typedef struct replay_result {
  uint64_t events, replayed;         /* rows read; calls made on gma */
  uint64_t peak_requested;           /* bytes live (as the trace asked) at their peak */
  uint64_t peak_allocated;           /* gma's allocated.peak (block bytes) */
  uint64_t peak_reserved;            /* gma's reserved.peak */
  uint64_t recorded_peak_reserved;   /* from the trace's segment rows; 0 if none */
  double fragmentation_at_peak;      /* gma's fragmentation at the sample of peak reserved */
  uint64_t device_allocs, device_frees;
  uint64_t hits_bin, hits_stream, hits_pool, hits_device;
  uint64_t failed_allocs;            /* calls that failed in the replay (trace said success) */
  uint64_t unmatched;                /* frees/record_streams of pointers not live in the replay */
  uint64_t oom_retries;
  replay_latency_t alloc, free;
  double wall_s, events_per_s;
} replay_result_t;

/* Replays t on a new allocator configured by conf (GMA_CONF syntax; the
 * environment's GMA_CONF is ignored). Returns 0, or -1 with err set when
 * the allocator cannot be created (a device error in the replay is counted,
 * not fatal). */
int replay_run(const replay_trace_t *t, const char *conf, const replay_options_t *o,
               replay_result_t *r, char *err, size_t errlen);

/* Writes the result as a JSON object (no trailing newline). */
void replay_result_json(FILE *f, const replay_result_t *r);

#endif /* GMA_REPLAY_H */
