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
  uint8_t timed;    /* its Time column held a time (else time is the row's index in us) */
  uint32_t line;    /* its line in the file, for messages (UINT32_MAX: that line or later) */
} replay_event_t;

typedef struct replay_trace {
  char name[256];
  replay_event_t *ev;
  size_t n;
  size_t count[RA_NACTIONS];
  int has_recorded;          /* it has segment rows: the recording allocator's reserved curve */
  int has_time;              /* some row has a Time; a trace without (an imported snapshot
                                without time_us) writes its timeline with an empty Time */
  uint64_t recorded_peak;    /* peak of that curve */
  uint64_t peak_live;        /* the trace's own peak of live requested bytes: every request it
                                records as served (allocate rows, async completions), whatever
                                a replay serves; no allocator can run the trace in less */
} replay_trace_t;

/* Parses a trace from f (rows sorted by time, stably, after loading).
 * Returns 0, or -1 with a message naming the line in err. A row is refused
 * when a number column (Pointer, Size, Stream, Block, Id, Count) is empty or
 * is not digits alone (no sign or spaces; Pointer and Stream hex, with or
 * without 0x) from 0 to 2^64-1, its Time is NaN or infinite, an async row's
 * Id is 0 (none), a batch row's or a served async_complete row's Count is
 * more than the rows after it, a segment row's Size passes 2^63-1 or the
 * segment rows' running sum leaves -2^63..2^63-1, or the trace's live bytes
 * pass 2^64-1. */
int replay_parse(FILE *f, const char *name, replay_trace_t **out, char *err, size_t errlen);
int replay_load(const char *path, replay_trace_t **out, char *err, size_t errlen);
void replay_trace_free(replay_trace_t *t);

typedef struct replay_options {
  const char *device;       /* "sim" (default) or "cuda" */
  FILE *timeline;           /* if set: Event,Time,Allocated,Reserved,RecordedReserved rows;
                               Allocated is the highest live (requested) bytes since the
                               previous row, so peaks survive the downsampling; Time is
                               empty when the trace has none (has_time) */
  size_t samples;           /* timeline points (default 2000) */
  const char *snapshot_path; /* if set: gma_snapshot_json at the sampled peak reserved */
  const char *torch_snapshot_path; /* if set: the replay runs with a gma trace recording (to
                               PATH.trace.tmp, removed after) and at its end, before what the
                               trace left live is freed, writes gma_snapshot_write(...,
                               GMA_SNAPSHOT_TORCH) to PATH: the end state and every event */
  int progress;             /* draw a progress bar on stderr */
  const char *label;        /* for the progress bar */
  double max_idle_s;        /* cap on one idle row's sleep (default 1 s) */
  uint64_t capacity;        /* nonzero: the simulated device's capacity in bytes, set in the
                               config after CONF is parsed (so it overrides a sim_capacity
                               there); "sim" device only */
  int fast;                 /* no latency timing and no sampling (no timeline, snapshot or
                               fragmentation figure): for the many replays of --min-capacity */
  int stop_on_failure;      /* stop at the first failed allocation of a request the trace
                               records as served (an oom row's attempt does not count) */
  uint64_t repeat;          /* 0: one plain replay. N >= 1 (gma-replay --repeat N): the trace N
                               times in one allocator, as the iterations of a training loop: at
                               the end of each repetition the replay frees every pointer it
                               still holds live (allocations the trace never freed) and releases
                               every uncollected future, then calls gma_iteration_mark (a no-op
                               under plan:off). Pointer and future keys are per repetition;
                               streams are kept. */
} replay_options_t;

typedef struct replay_latency {
  uint64_t n, p50, p99, p999, max; /* nanoseconds */
} replay_latency_t;

/* The most repetitions replay_result_t lists one by one (the whole-run and
 * first/last figures cover every repetition). */
#define REPLAY_REP_LIST 128

/* One repetition of --repeat. Reserved and allocated memory are read with
 * gma_stats at the repetition's start, after every allocation call (gma_alloc,
 * a batch, an async submit and its completion, an oom row's attempt) and at its
 * end; memory only grows inside allocation calls (and the worker's growth
 * ahead, seen at the next sample), so these samples find the peak unless the
 * worker grew and trimmed between two of them. When the repetition raised
 * gma's global reserved.peak, or a sample reached it, peak_reserved is that
 * peak itself (exact), and likewise allocated when it raised allocated.peak.
 * A gma_stats call costs about 0.3 us (opt125m_zo_finetune, 10 repetitions:
 * 25 ms of samples in a 50 ms run); their time is left out of wall_s. In fast mode (--min-capacity) only the start and the
 * end are sampled. */
typedef struct replay_rep {
  uint64_t peak_reserved;   /* highest reserved in the repetition (see above) */
  uint64_t peak_allocated;  /* highest allocated (block bytes), the same way */
  uint64_t reserved_end;    /* reserved after its end-of-repetition frees and its mark */
  uint64_t device_allocs;   /* device allocations made during it, its mark included */
  uint64_t plan_hits, plan_misses; /* made during it */
  int plan_state;           /* gma's plan_state after its mark */
  int peak_exact;           /* peak_reserved is exact: the repetition set gma's reserved.peak,
                               or a sample of it reached that peak */
} replay_rep_t;

typedef struct replay_result {
  uint64_t events, replayed;         /* rows replayed (the trace's rows x repetitions); calls made
                                        on gma (not counting --repeat's end-of-repetition frees
                                        and marks) */
  uint64_t peak_requested;           /* bytes live (as the trace asked) at their peak */
  uint64_t peak_allocated;           /* gma's allocated.peak (block bytes) */
  uint64_t peak_reserved;            /* gma's reserved.peak */
  uint64_t recorded_peak_reserved;   /* from the trace's segment rows; 0 if none */
  double fragmentation_at_peak;      /* gma's fragmentation at the sample of peak reserved */
  uint64_t device_allocs, device_frees;
  /* Physical memory. gma's reserved bytes are the bytes mapped (ordinary
   * segments, or the chunks mapped into growable ranges; address space
   * reserved but not mapped is not counted), so mapped_peak is gma's
   * reserved.peak; kept chunks (the handle pool, held unmapped during an
   * OOM retry) are not in it. The vm_* counts are the growable ranges'
   * successful device calls, read from gma_stats: vm_maps the chunks mapped
   * (num_device_allocs), vm_unmaps those unmapped (num_device_frees), and
   * vm_creates the physical chunks created (the maps less those of kept
   * chunks, num_device_remaps). With ordinary segments (growable 0) the
   * three are 0: their device calls are device_allocs and device_frees. */
  uint64_t mapped_peak;
  uint64_t vm_maps, vm_unmaps, vm_creates;
  int growable;                      /* the configuration had expandable_segments:true */
  uint64_t hits_bin, hits_stream, hits_pool, hits_device;
  uint64_t trace_peak_live;          /* the trace's peak live bytes (replay_trace_t.peak_live) */
  uint64_t failed_allocs;            /* requests the trace records as served that failed in the
                                        replay; peak_requested and the allocated figures leave
                                        them out (they never became live) */
  uint64_t first_failed_event;       /* row index of the first of those (valid if failed_allocs) */
  uint64_t first_failed_rep;         /* its repetition, 1-based (0 without --repeat) */
  char first_error[320];             /* gma_last_error() of the first of those */
  uint64_t recorded_failed;          /* the trace's oom rows: requests the recording allocator
                                        could not serve (PyTorch's OOMs in an imported trace) */
  uint64_t oom_attempts, oom_served; /* of those, attempted in the replay, and served by gma
                                        (each served one is freed at once: see replay.c) */
  int stopped;                       /* stop_on_failure ended the replay early */
  uint64_t capacity;                 /* options' capacity, or the config's sim_capacity (0: the
                                        device's default) */
  uint64_t unmatched;                /* frees/record_streams of pointers not live in the replay */
  uint64_t oom_retries;
  replay_latency_t alloc, free;
  double wall_s, events_per_s;       /* wall_s leaves out idle rows' sleeps and --repeat's
                                        per-allocation gma_stats samples */
  /* --repeat (options' repeat >= 1; all 0 otherwise). The figures above cover
   * the whole run: every repetition in one allocator. */
  uint64_t repeat;                   /* options' repeat: the repetitions asked for */
  uint64_t reps_completed;           /* repetitions replayed to their end and marked (fewer than
                                        repeat when stop_on_failure stopped the run) */
  uint64_t trace_events;             /* rows of the trace */
  uint64_t rep_end_frees;            /* pointers live at a repetition's end, freed by the replay */
  uint64_t rep_end_futures;          /* futures never collected, released at a repetition's end */
  uint64_t marks, mark_failures;     /* gma_iteration_mark calls, and those that did not return
                                        GMA_OK (counted; the replay goes on) */
  char mark_error[320];              /* gma_last_error() of the first failed mark */
  int rep_samples_per_alloc;         /* 1: the per-repetition peaks sampled after every allocation
                                        call; 0 (fast mode): at repetition ends only */
  uint64_t peak_reserved_first_rep;  /* reps[0].peak_reserved */
  uint64_t peak_reserved_last_rep;   /* the last repetition's peak_reserved */
  uint64_t peak_reserved_max_after_first_rep; /* the highest peak_reserved of repetitions
                                                    2..N */
  uint64_t device_allocs_first_rep;  /* device allocations made in repetition 1 (its mark too) */
  uint64_t device_allocs_after_first_rep; /* made in repetitions 2..N */
  uint64_t plan_active_rep;          /* the first repetition after whose mark gma reported
                                        plan_state 4 (active), 1-based; 0: never */
  uint64_t device_allocs_after_plan_active; /* device allocations made after that mark (0 when
                                        plan_active_rep is 0) */
  /* gma_stats' plan fields at the end of the run (after the last mark). */
  int plan_state;
  uint64_t plan_hits, plan_misses, plan_replans, plan_arena_bytes, plan_lower_bound, plan_slots,
      plan_iterations;
  size_t nreps;                      /* entries in reps: min(repeat, REPLAY_REP_LIST) */
  replay_rep_t reps[REPLAY_REP_LIST];
} replay_result_t;

/* Replays t on a new allocator configured by conf (GMA_CONF syntax; the
 * environment's GMA_CONF is ignored). Returns 0, or -1 with err set when
 * the allocator cannot be created (a device error in the replay is counted,
 * not fatal). */
int replay_run(const replay_trace_t *t, const char *conf, const replay_options_t *o,
               replay_result_t *r, char *err, size_t errlen);

/* Writes the result as a JSON object (no trailing newline). */
void replay_result_json(FILE *f, const replay_result_t *r);

/* ---- The smallest capacity a trace replays in (gma-replay --min-capacity) ---------
 *
 * A capacity is workable when a replay at it has no failed allocation (of the
 * requests the trace records as served). The search brackets the answer in
 * (lo, hi]: lo starts at the trace's peak live bytes (nothing can run it in
 * less), hi at twice the recorded peak reserved (twice the peak live without
 * one), doubled while it fails. Then it bisects until hi - lo <= precision *
 * hi, and replays hi `confirm` more times. Replays on the simulated device are
 * not exactly repeatable when frees wait for simulated device work or the
 * worker trims on its own schedule, so a capacity is workable only if every
 * replay at it succeeded: a confirmation that fails makes that capacity the new
 * lo, marks the result unstable, and the bisection goes on above it. */

typedef struct replay_capacity_step {
  uint64_t capacity;
  int ok;                      /* no failed allocation */
  int confirm;                 /* a confirmation replay of the answer */
  uint64_t failed_allocs;      /* at least 1 when !ok (the replay stops at the first) */
  uint64_t first_failed_event; /* row index of the failure */
  uint64_t first_failed_rep;   /* its repetition, 1-based (0 without repeat) */
  char first_error[320];       /* and gma's message for it */
  uint64_t peak_reserved;      /* gma's peak reserved in this replay */
  double wall_s;
} replay_capacity_step_t;

typedef struct replay_capacity_options {
  double precision;       /* relative width to stop at (default 0.002: 0.2%) */
  uint64_t repeat;        /* replay_options_t.repeat of every replay: each capacity replays all
                             the repetitions (0: one plain replay) */
  double budget_s;        /* stop bisecting after this much time, reporting the width reached
                             (0: no budget) */
  int confirm;            /* more replays of the answer that must succeed too (default 1;
                             negative: none) */
  uint64_t max_capacity;  /* give up when hi would pass this (default 1024 TiB) */
  /* Called after each replay (progress); lo/hi are the bracket after it. */
  void (*on_step)(void *arg, const replay_capacity_step_t *s, uint64_t lo, uint64_t hi);
  void *arg;
} replay_capacity_options_t;

typedef struct replay_capacity {
  uint64_t min_capacity;    /* smallest workable capacity found (0: none up to max_capacity) */
  uint64_t failing;         /* largest capacity known not workable: the bracket's lo (the
                               lower bound itself when no replay below min_capacity failed) */
  uint64_t lower_bound;     /* the trace's peak live bytes */
  uint64_t recorded_peak_reserved; /* 0 when the trace has no segment rows */
  double width;             /* (min_capacity - failing) / min_capacity at the end */
  int replays;
  int unstable;             /* some capacity both succeeded and failed, or one failed above
                               one that succeeded (monotonicity violated) */
  int budget_hit;           /* the time budget ended the bisection before precision */
  replay_result_t at_min;   /* the last replay at min_capacity (fast: no latencies) */
  replay_capacity_step_t *steps;
  size_t nsteps;
  double wall_s;
} replay_capacity_t;

/* Finds the smallest workable sim_capacity for t under conf (see above).
 * Returns 0, or -1 with err set when no allocator can be created. */
int replay_min_capacity(const replay_trace_t *t, const char *conf,
                        const replay_capacity_options_t *o, replay_capacity_t *out, char *err,
                        size_t errlen);
void replay_capacity_free(replay_capacity_t *c);

/* Writes the search as a JSON object (no trailing newline), with every step. */
void replay_capacity_json(FILE *f, const replay_capacity_t *c);

#endif /* GMA_REPLAY_H */
