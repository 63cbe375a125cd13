/* Planned memory (config key plan): for workloads that repeat one iteration,
 * gma learns an iteration's allocations between gma_iteration_mark calls,
 * has the worker place them all in one arena (plan_place.c), and serves
 * later iterations' requests at their planned addresses without a search or
 * a lock. Everything here sits above the pool: the arena is one allocation
 * of the pool, and the safety of a planned address rests on the same stream
 * epochs as every other reuse (streams.c).
 *
 * Life of a plan (all transitions at marks, under gma__planner_t.mu):
 *   LEARNING   records one iteration: per stream, the sequence of request
 *              sizes, and each allocation's lifetime in the iteration's
 *              event order;
 *   VERIFYING  records the next ones; a plan is made only when three
 *              consecutive iterations asked for the same sizes in the same
 *              order on every stream (else it learns again, backing off);
 *   PLACING    the worker places the union of the last two lifetimes, each
 *              host thread's allocations in a range of their own;
 *   ACTIVE     from the next mark on: the mark settles the device work that
 *              gates cached memory, gives the cache back, takes the arena,
 *              and publishes the plan. An iteration whose requests miss the
 *              plan too often drops it: learned again at once if it served
 *              at least 4 iterations, else after a back-off (1, 2, 4 ... 256
 *              marks, reset once a plan lasts 4).
 * Allocations still live at the end of the learned iteration (weights,
 * optimizer state, buffers that cross an iteration boundary) are not
 * planned: their requests keep the ordinary path.
 *
 * Threads: gma__plan_alloc/free/record_stream from any thread, lock-free on
 * a planned hit (the record_stream and cross-stream cases take the pool
 * lock); marks and learning under mu. Plans are freed only at destroy, so a
 * reader holding one is always safe. */
#ifndef GMA_PLAN_H
#define GMA_PLAN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/internal.h"

enum {
  GMA__PLAN_OFF = 0,
  GMA__PLAN_LEARNING = 1,
  GMA__PLAN_VERIFYING = 2,
  GMA__PLAN_PLACING = 3,
  GMA__PLAN_ACTIVE = 4
};

typedef struct gma__memplan gma__memplan_t;
struct gma__worker;

/* One learned allocation. */
typedef struct gma__plan_rec {
  uintptr_t key;          /* its stream's key (stream_cache.c) */
  uint64_t size;          /* requested bytes rounded up to 512 */
  uint32_t start, end;    /* in the iteration's event order; end UINT32_MAX: live at the mark */
  uint32_t seq;           /* its index in its stream's sequence */
  uint64_t tid;           /* the thread that asked (gma__thread_id) */
} gma__plan_rec_t;

typedef struct gma__plan_iter {
  gma__plan_rec_t *v;
  size_t n, cap;
} gma__plan_iter_t;

typedef struct gma__planner {
  gma__pool_t *p;                 /* immutable */
  struct gma__worker *w;          /* immutable: places plans (NULL: placed at the mark) */
  bool on;                        /* immutable: cfg.plan */
  bool wait;                      /* immutable: device-side waits allowed (reuse not none) */
  pthread_mutex_t mu;             /* guards the fields below not marked atomic */
  _Atomic int state;              /* atomic: GMA__PLAN_*, read by the hot paths */
  gma__memplan_t *_Atomic active;    /* atomic: the plan serving requests, or NULL */
  gma__memplan_t *_Atomic retiring;  /* atomic: dropped, its arena held until its slots are free */
  gma__memplan_t *placing;           /* PLACING: the plan the worker is placing */
  gma__memplan_t *all;               /* every plan made, freed at destroy */
  gma__plan_iter_t learn, prev;   /* the iteration being recorded, and the one before */
  uintptr_t *map_key;             /* learning: live pointer -> index in learn */
  uint32_t *map_val;
  size_t map_cap, map_used;
  uint32_t clock;                 /* learning: the iteration's event counter */
  uintptr_t *seq_key;             /* learning: each stream's key and its next request's */
  uint32_t *seq_next;             /*   index in the iteration (nseqs of them) */
  uint32_t nseqs, seqs_cap;
  uint32_t skip;                  /* marks to let pass before learning again */
  uint32_t backoff;               /* the next skip after a failure (doubles, at most 256) */
  uint32_t failures;              /* verifications failed in a row */
  uint32_t matches;               /* verifications passed in a row */
  /* Totals (mu), folded from plans at marks. */
  uint64_t iterations, replans, hits, misses;
} gma__planner_t;

gma_status_t gma__plan_init(gma__planner_t *pl, gma__pool_t *p, struct gma__worker *w,
                            const gma_config_t *cfg);
/* After the worker stopped and before the pool goes: frees every plan. */
void gma__plan_fini(gma__planner_t *pl);

/* gma_iteration_mark. Any thread (one mark at a time is serialized). */
gma_status_t gma__plan_mark(gma__planner_t *pl);
/* An idle plan's arena is cache: an active plan none of whose blocks is
 * live, and none handed out in the last unused_ns (0: whenever), stops
 * serving and its arena goes back to the pool (then trimmed with the rest
 * once the streams that used it are done); gma learns the workload again
 * from now. A dropped plan's arena held back by a block freed since goes
 * back too. True when an arena went back. A plan with a live block is kept
 * (its arena could not go back). Any thread; the OOM path and gma_trim call
 * it, gma__plan_empty (gma_empty_cache) is gma__plan_reclaim(pl, 0). */
bool gma__plan_reclaim(gma__planner_t *pl, uint64_t unused_ns);
void gma__plan_empty(gma__planner_t *pl);
/* The worker's timed trim: the same, but it never waits for a mark in
 * progress (false then: the next tick looks again). */
bool gma__plan_reclaim_timed(gma__planner_t *pl, uint64_t unused_ns);
/* Whether a plan (active, or dropped and waiting for its blocks) holds an
 * arena now. One load each; any thread. */
bool gma__plan_holds_arena(gma__planner_t *pl);

/* A planned allocation of size on stream (already mapped by
 * gma__stream_arg): GMA_OK with *out set, or GMA_ERR_OOM meaning "not from
 * the plan: take the ordinary path" (no message set). */
gma_status_t gma__plan_alloc(gma__planner_t *pl, size_t size, gma_stream_t stream, void **out);
/* GMA_OK when ptr was planned memory and is freed now; an error with its
 * message when ptr lies in a plan's arena but is not a live planned start;
 * GMA_ERR_OOM (no message) when ptr is none of the plan's. */
gma_status_t gma__plan_free(gma__planner_t *pl, void *ptr);
/* As gma_record_stream for planned memory (ptr anywhere inside); the same
 * three outcomes as gma__plan_free. */
gma_status_t gma__plan_record_stream(gma__planner_t *pl, void *ptr, gma_stream_t stream,
                                     void **base);

/* gma_pointer_info for planned memory: 1 with r filled when ptr lies in a
 * live planned block; -1 when it lies in a plan's arena but in no live
 * block; 0 when it is not in a plan's arena. */
int gma__plan_info(gma__planner_t *pl, const void *ptr, gma_pointer_info_t *r);
/* gma_alloc_tagged: tags the live planned block starting at ptr (false: not
 * planned memory). */
bool gma__plan_set_tag(gma__planner_t *pl, void *ptr, uint8_t id);

/* gma_snapshot_json: when addr is the start of a plan's arena (one live
 * block to the pool), writes the arena's blocks instead, when f is not
 * NULL: each live planned block, and each run no live planned block holds
 * now (state "planned"), as JSON objects separated by commas (one before
 * the first too unless first); *live and *requested get the live planned
 * bytes. False (nothing written) for any other address. Read without the
 * planner's lock: a moving target, as a snapshot of bins is; the worker may
 * unpublish the plan between two calls, so a caller asks once. */
bool gma__plan_snapshot(gma__planner_t *pl, uintptr_t addr, FILE *f, bool first, uint64_t *live,
                        uint64_t *requested);

/* The live reports: when addr is the start of a plan's arena, calls fn
 * with each live planned block in it (its clock when handed out in born)
 * until fn returns false, and returns true; false for any other address. */
bool gma__plan_each_live(gma__planner_t *pl, uintptr_t addr,
                         bool (*fn)(void *arg, const gma_allocation_info_t *info, uint64_t born),
                         void *arg);

/* Learning: an ordinary allocation or free the caller made. Cheap when not
 * learning (one load). */
void gma__plan_note_alloc(gma__planner_t *pl, void *ptr, size_t size, gma_stream_t stream);
void gma__plan_note_free(gma__planner_t *pl, void *ptr);

/* Fills the pool's fields (gma__pool_stats) and the plan_* fields of a
 * full-size gma_stats_t in one step under mu, so that an arena taken or
 * given back meanwhile (a mark, the worker's timed trim) is in both or in
 * neither: reserved + planned live = allocated + stream_cached + pending +
 * free + plan_arena_bytes holds whenever no caller's call is in flight.
 * Any thread. */
void gma__plan_stats(gma__planner_t *pl, gma_stats_t *st);
/* gma_destroy, after the device finished its work and before the leak
 * report: gives the arenas back to the pool; returns the planned
 * allocations still live (the caller's leaks), *bytes their size. */
uint64_t gma__plan_release(gma__planner_t *pl, uint64_t *bytes);

#endif /* GMA_PLAN_H */
