/* Private to runtime/plan/: the structures of a plan (its cells, slots
 * and streams, with what guards each field) and the functions the plan's
 * files share. plan.h is the rest of the runtime's view. */
#ifndef GMA_PLAN_INTERNAL_H
#define GMA_PLAN_INTERNAL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/round.h"
#include "plan/plan.h"
#include "plan/plan_place.h"

#define MISS GMA_ERR_OOM       /* "take the ordinary path" (never reported) */
#define NO_SLOT UINT32_MAX     /* a stream entry that the plan leaves to the ordinary path */
#define LOOKAHEAD 8u           /* entries a request may skip to find its size */
#define MAX_RECS (1u << 22)    /* allocations one learned iteration may hold */
#define MAX_BACKOFF 256u       /* most marks between attempts to learn */
#define SETTLE_NS 1000000000ull /* the activating mark's longest wait for device work */
#define SERVED_OK 4u           /* marks a plan must stay active through to count as a success */
#define MATCHES 2u             /* consecutive iterations equal to their predecessor a plan needs
                                  (three in a row: a workload whose lengths repeat by chance
                                  now and then seldom gets a plan it then drops) */

/* Sizes are planned in multiples of 512 bytes. */
static inline uint64_t round512(uint64_t n) { return gma__round_up(n, 512); }

typedef struct cell {
  _Atomic uint32_t owner; /* the live planned block on it, slot + 1; 0: none */
  _Atomic uint32_t last;  /* the block that used it last, slot + 1; 0: none since made */
} cell_t;

/* A free's stamp: what must be ordered before the next use of the memory. */
typedef struct stamp {
  gma__stream_t *stream;  /* the stream it was freed on */
  uint64_t epoch;         /* its epoch then */
  gma__gate_t *gates;     /* streams record_stream named, with their epochs then */
  uint32_t ngates, gates_cap;
} stamp_t;

typedef struct slot {
  uint64_t offset, size;       /* immutable */
  uint32_t c0, c1;             /* immutable: its cells [c0, c1) */
  uint32_t ps;                 /* immutable: its stream's index in the plan */
  bool xnext;                  /* immutable: the plan's next user of some of its memory is on
                                  another stream: its free closes the epoch at once, so that
                                  user waits for no more than the work before the free */
  _Atomic uint8_t live;        /* 1 while handed out (a second free finds 0) */
  gma__stream_t *stream;       /* live: the stream it was handed out on */
  uint64_t requested;          /* live: bytes asked for */
  _Atomic uint8_t tag;         /* live: gma_alloc_tagged's tag id (0: untagged) */
  _Atomic uint64_t born_ns;    /* live: the pool's clock when it was handed out (reports) */
  gma__stream_t **users;       /* live: record_stream streams (pool lock) */
  _Atomic uint32_t nusers;     /* atomic: read by the free without the lock */
  uint32_t users_cap;
  stamp_t stamp;               /* its last free (written by the freer, see the top) */
} slot_t;

/* One stream's sequence of requests in the plan. */
typedef struct pstream {
  uintptr_t key;
  uint32_t n;
  uint64_t *size;              /* the k-th request's size (rounded up to 512) */
  uint32_t *slot;              /* its slot, or NO_SLOT */
  _Atomic uint32_t cursor;     /* the next request's index in this iteration */
  _Atomic uint64_t hits, misses; /* this iteration's (folded at marks) */
} pstream_t;

struct gma__memplan {
  struct gma__memplan *next;      /* planner's list of every plan */
  /* The placement job's input and output (plan_place.h). */
  gma__plan_item_t *items;
  uint64_t *offsets;
  uint32_t *group;             /* each item's thread, numbered from 0 (ngroups of them) */
  uint32_t ngroups;
  _Atomic bool placed;         /* release: the job finished (ok tells how) */
  bool ok;
  /* Built by the job; immutable after placed. */
  uint64_t arena, lower_bound;
  slot_t *slots;
  uint32_t nslots;
  cell_t *cells;
  uint64_t *cell_lo;           /* cell c covers [cell_lo[c], cell_lo[c + 1]) */
  uint32_t ncells;
  pstream_t *streams;
  uint32_t nstreams;
  /* Set at activation (mu) and read by the hot paths after the acquire of
   * planner.active or planner.retiring. */
  void *arena_ptr;
  uintptr_t base;
  _Atomic bool dropped;        /* seq_cst: see claim and try_release */
  uint32_t served;             /* mu: marks it has stayed active through */
  bool held;                   /* mu: the arena is the pool's live block */
};


/* The cell whose range holds off (off < arena). */
static inline uint32_t cell_at(const gma__memplan_t *P, uint64_t off) {
  uint32_t lo = 0, hi = P->ncells; /* cell_lo[lo] <= off < cell_lo[hi] */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (P->cell_lo[mid] <= off) lo = mid; else hi = mid;
  }
  return lo;
}

/* plan_build.c: making a plan and the worker's placement job. */
void gma__memplan_free(gma__memplan_t *P);
gma__memplan_t *gma__memplan_from(const gma__plan_iter_t *a, const gma__plan_iter_t *b);
void gma__memplan_place_job(void *arg);

/* plan_learn.c: recording iterations (mu held). */
void gma__plan_learn_reset(gma__planner_t *pl);
void gma__plan_learn_free(gma__planner_t *pl);
void gma__plan_back_off(gma__planner_t *pl);

#endif /* GMA_PLAN_INTERNAL_H */
