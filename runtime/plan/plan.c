/* Owns planned memory (plan.h): learning iterations, checking that they
 * repeat, building a plan from the worker's placement, the arena, and the
 * lock-free serving of planned addresses with their reuse gates.
 *
 * Safety of a planned address. The arena is cut into cells at every
 * planned block's start and end. A cell has an owner (the live planned
 * block on it, or none) and a last user (the planned block that used it
 * last, or none since the arena was made). A request takes every cell of
 * its block with a CAS from "none", so two live planned blocks can never
 * overlap, whatever order requests come in. Then, for each cell's last
 * user, the stamp of its free (stream, epoch, record_stream streams) must
 * be ordered before the new use: the same stream and no other stream
 * (stream order, checked without a lock), or every gate passed, observed
 * under the pool lock (gma__gate_settle; with reuse:wait a device-side wait
 * counts too). Otherwise the cells go back and the request takes the
 * ordinary path. A free writes the stamp, sets its cells' last user, and
 * releases each cell with a release store that the next taker's CAS
 * acquires, so the taker sees the stamp. The arena itself is safe for every
 * stream when it is published: it was taken after a settle, on the legacy
 * stream, which was then synchronized. */
#include "plan/plan.h"
#include "cache/cache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_place.h"
#include "base/sizeclass.h"
#include "worker/worker.h"

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

static uint64_t round512(uint64_t n) { return (n + 511) / 512 * 512; }

/* ---- Plans ------------------------------------------------------------------------ */

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

static void plan_free(gma__memplan_t *P) {
  if (!P) return;
  for (uint32_t j = 0; j < P->nslots; j++) {
    free(P->slots[j].users);
    free(P->slots[j].stamp.gates);
  }
  for (uint32_t i = 0; i < P->nstreams; i++) {
    free(P->streams[i].size);
    free(P->streams[i].slot);
  }
  free(P->streams);
  free(P->slots);
  free(P->cells);
  free(P->cell_lo);
  free(P->items);
  free(P->offsets);
  free(P->group);
  free(P);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* The cell whose range holds off (off < arena). */
static uint32_t cell_at(const gma__memplan_t *P, uint64_t off) {
  uint32_t lo = 0, hi = P->ncells; /* cell_lo[lo] <= off < cell_lo[hi] */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (P->cell_lo[mid] <= off) lo = mid; else hi = mid;
  }
  return lo;
}

/* Sets xnext: walks the slots in start order, remembering each cell's last
 * user, wrapping around to the next iteration's first users at the end. If
 * that would take too long (slots spanning very many cells), every slot
 * gets xnext, which costs an event per free but is never wrong. */
static void mark_cross_stream(gma__memplan_t *P) {
  uint64_t work = 0;
  for (uint32_t j = 0; j < P->nslots; j++) work += P->slots[j].c1 - P->slots[j].c0;
  /* The slots by start: (start << 32 | index), sorted. */
  uint64_t *order = work <= 64u * 1024 * 1024 ? malloc(P->nslots * sizeof *order) : NULL;
  uint32_t *last = malloc(P->ncells * sizeof *last), *first = malloc(P->ncells * sizeof *first);
  if (!order || !last || !first) {
    for (uint32_t j = 0; j < P->nslots; j++) P->slots[j].xnext = true;
    free(order), free(last), free(first);
    return;
  }
  for (uint32_t j = 0; j < P->nslots; j++) order[j] = (uint64_t)P->items[j].start << 32 | j;
  qsort(order, P->nslots, sizeof *order, cmp_u64);
  memset(last, 0xff, P->ncells * sizeof *last);
  memset(first, 0xff, P->ncells * sizeof *first);
  for (uint32_t k = 0; k < P->nslots; k++) {
    uint32_t j = (uint32_t)order[k];
    slot_t *sk = &P->slots[j];
    for (uint32_t c = sk->c0; c < sk->c1; c++) {
      if (last[c] != UINT32_MAX && P->slots[last[c]].ps != sk->ps) P->slots[last[c]].xnext = true;
      if (first[c] == UINT32_MAX) first[c] = j;
      last[c] = j;
    }
  }
  for (uint32_t c = 0; c < P->ncells; c++) /* the next iteration's first user */
    if (last[c] != UINT32_MAX && P->slots[last[c]].ps != P->slots[first[c]].ps)
      P->slots[last[c]].xnext = true;
  free(order), free(last), free(first);
}

static int cmp_event(const void *a, const void *b) {
  const uint64_t *x = a, *y = b; /* {time << 1 | is_start, size} */
  return (x[0] > y[0]) - (x[0] < y[0]);
}

/* The most bytes live at once over all items (ends before starts at the
 * same time, as lifetimes are half-open); UINT64_MAX without host memory. */
static uint64_t peak_live(const gma__plan_item_t *items, size_t n) {
  uint64_t *ev = malloc((2 * n + 1) * 2 * sizeof *ev), live = 0, peak = 0;
  if (!ev) return UINT64_MAX;
  for (size_t i = 0; i < n; i++) {
    ev[4 * i] = (uint64_t)items[i].start << 1 | 1, ev[4 * i + 1] = items[i].size;
    ev[4 * i + 2] = (uint64_t)items[i].end << 1, ev[4 * i + 3] = items[i].size;
  }
  qsort(ev, 2 * n, 2 * sizeof *ev, cmp_event);
  for (size_t k = 0; k < 2 * n; k++) {
    if (ev[2 * k] & 1) live += ev[2 * k + 1]; else live -= ev[2 * k + 1];
    if (live > peak) peak = live;
  }
  free(ev);
  return peak;
}

/* Places each thread's items on its own (plan_place.c), one group above
 * the other: blocks of different threads never share memory, since their
 * interleaving differs from one iteration to the next. The lower bound is
 * the peak over all items. */
static bool place_groups(gma__memplan_t *P) {
  if (P->ngroups <= 1)
    return gma__plan_place(P->items, P->nslots, P->offsets, &P->arena, &P->lower_bound);
  gma__plan_item_t *sub = malloc(P->nslots * sizeof *sub);
  uint64_t *off = malloc(P->nslots * sizeof *off);
  uint32_t *idx = malloc(P->nslots * sizeof *idx);
  bool ok = sub && off && idx;
  P->arena = 0;
  for (uint32_t g = 0; ok && g < P->ngroups; g++) {
    uint32_t m = 0;
    for (uint32_t j = 0; j < P->nslots; j++)
      if (P->group[j] == g) idx[m] = j, sub[m++] = P->items[j];
    uint64_t arena = 0, lb = 0;
    ok = gma__plan_place(sub, m, off, &arena, &lb);
    for (uint32_t k = 0; ok && k < m; k++) P->offsets[idx[k]] = P->arena + off[k];
    P->arena += arena;
  }
  P->lower_bound = ok ? peak_live(P->items, P->nslots) : 0;
  ok = ok && P->lower_bound != UINT64_MAX;
  free(sub), free(off), free(idx);
  return ok;
}

/* The worker's job (or the mark's, without a worker): places the items and
 * cuts the arena into cells. */
static void place_job(void *arg) {
  gma__memplan_t *P = arg;
  bool ok = place_groups(P);
#if GMA_DEBUG >= 1
  GMA__ASSERT(!ok || gma__plan_place_is_valid(P->items, P->nslots, P->offsets, P->arena));
#endif
  uint64_t *b = ok ? malloc((2 * (size_t)P->nslots + 1) * sizeof *b) : NULL;
  ok = b != NULL;
  size_t nb = 0;
  if (ok) {
    b[nb++] = 0;
    for (uint32_t j = 0; j < P->nslots; j++) {
      b[nb++] = P->offsets[j];
      b[nb++] = P->offsets[j] + P->items[j].size;
    }
    qsort(b, nb, sizeof *b, cmp_u64);
    size_t u = 1;
    for (size_t i = 1; i < nb; i++)
      if (b[i] != b[u - 1]) b[u++] = b[i];
    nb = u; /* boundaries, the last one the arena's end */
    P->cell_lo = b;
    P->ncells = (uint32_t)(nb - 1);
    P->cells = calloc(P->ncells ? P->ncells : 1, sizeof *P->cells);
    ok = P->cells != NULL;
  }
  for (uint32_t j = 0; ok && j < P->nslots; j++) {
    slot_t *sl = &P->slots[j];
    sl->offset = P->offsets[j];
    sl->size = P->items[j].size;
    sl->c0 = cell_at(P, sl->offset);
    sl->c1 = sl->offset + sl->size == P->arena ? P->ncells : cell_at(P, sl->offset + sl->size);
    GMA__ASSERT(P->cell_lo[sl->c0] == sl->offset && sl->c1 > sl->c0);
  }
  if (ok) mark_cross_stream(P);
  P->ok = ok;
  gma__store_release(&P->placed, true); /* pairs with the mark's acquire */
}

/* ---- Learning ----------------------------------------------------------------------- */

static size_t ptr_hash(uintptr_t k, size_t cap) {
  return (size_t)(((uint64_t)k * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}
#define MAP_EMPTY ((uintptr_t)0)
#define MAP_TOMB ((uintptr_t)1)

static bool map_put(gma__planner_t *pl, uintptr_t k, uint32_t v);

static bool map_rebuild(gma__planner_t *pl, size_t cap) {
  uintptr_t *ok = pl->map_key;
  uint32_t *ov = pl->map_val;
  size_t ocap = pl->map_cap;
  pl->map_key = calloc(cap, sizeof *pl->map_key);
  pl->map_val = malloc(cap * sizeof *pl->map_val);
  if (!pl->map_key || !pl->map_val) {
    free(pl->map_key);
    free(pl->map_val);
    pl->map_key = ok, pl->map_val = ov;
    return false;
  }
  pl->map_cap = cap;
  pl->map_used = 0;
  for (size_t i = 0; i < ocap; i++)
    if (ok[i] != MAP_EMPTY && ok[i] != MAP_TOMB) map_put(pl, ok[i], ov[i]);
  free(ok);
  free(ov);
  return true;
}

static bool map_put(gma__planner_t *pl, uintptr_t k, uint32_t v) {
  if ((pl->map_used + 1) * 2 > pl->map_cap && !map_rebuild(pl, pl->map_cap ? pl->map_cap * 2 : 1024))
    return false;
  size_t m = pl->map_cap - 1;
  for (size_t i = ptr_hash(k, pl->map_cap);; i = (i + 1) & m) {
    if (pl->map_key[i] == MAP_EMPTY || pl->map_key[i] == MAP_TOMB || pl->map_key[i] == k) {
      if (pl->map_key[i] == MAP_EMPTY) pl->map_used++;
      pl->map_key[i] = k;
      pl->map_val[i] = v;
      return true;
    }
  }
}

/* Removes k; its value, or UINT32_MAX when absent. */
static uint32_t map_take(gma__planner_t *pl, uintptr_t k) {
  if (!pl->map_cap) return UINT32_MAX;
  size_t m = pl->map_cap - 1;
  for (size_t i = ptr_hash(k, pl->map_cap);; i = (i + 1) & m) {
    if (pl->map_key[i] == MAP_EMPTY) return UINT32_MAX;
    if (pl->map_key[i] == k) {
      pl->map_key[i] = MAP_TOMB;
      return pl->map_val[i];
    }
  }
}

static void learn_reset(gma__planner_t *pl) {
  pl->learn.n = 0;
  pl->clock = 0;
  pl->nseqs = 0;
  if (pl->map_cap) memset(pl->map_key, 0, pl->map_cap * sizeof *pl->map_key);
  pl->map_used = 0;
}

/* Drops what learning holds (mu). */
static void learn_free(gma__planner_t *pl) {
  free(pl->learn.v);
  free(pl->prev.v);
  free(pl->map_key);
  free(pl->map_val);
  memset(&pl->learn, 0, sizeof pl->learn);
  memset(&pl->prev, 0, sizeof pl->prev);
  pl->map_key = NULL, pl->map_val = NULL;
  pl->map_cap = pl->map_used = 0;
  pl->clock = 0;
  free(pl->seq_key);
  free(pl->seq_next);
  pl->seq_key = NULL, pl->seq_next = NULL;
  pl->nseqs = pl->seqs_cap = 0;
}

/* Stops learning for a while (mu): the workload does not repeat, is too
 * large to learn, or its plan could not be made. */
static void back_off(gma__planner_t *pl) {
  learn_reset(pl); /* the buffers stay for the next attempt */
  pl->prev.n = 0;
  pl->skip = pl->backoff;
  pl->matches = 0;
  pl->backoff = pl->backoff * 2 > MAX_BACKOFF ? MAX_BACKOFF : pl->backoff * 2;
  pl->failures = 0;
  gma__store_relaxed(&pl->state, GMA__PLAN_OFF);
}

void gma__plan_note_alloc(gma__planner_t *pl, void *ptr, size_t size, gma_stream_t stream) {
  int st = gma__load_relaxed(&pl->state);
  if (st != GMA__PLAN_LEARNING && st != GMA__PLAN_VERIFYING) return;
  uint64_t owner;
  uintptr_t key = gma__stream_key(stream, &owner);
  pthread_mutex_lock(&pl->mu);
  st = gma__load_relaxed(&pl->state);
  if (st == GMA__PLAN_LEARNING || st == GMA__PLAN_VERIFYING) {
    gma__plan_iter_t *it = &pl->learn;
    if (it->n == it->cap) {
      size_t cap = it->cap ? it->cap * 2 : 1024;
      gma__plan_rec_t *v = cap <= MAX_RECS ? realloc(it->v, cap * sizeof *v) : NULL;
      if (!v) {
        back_off(pl); /* too many to learn, or no host memory: try later */
        pthread_mutex_unlock(&pl->mu);
        return;
      }
      it->v = v, it->cap = cap;
    }
    uint32_t k = 0; /* this stream's requests so far (a handful of streams: a scan) */
    while (k < pl->nseqs && pl->seq_key[k] != key) k++;
    if (k == pl->nseqs) {
      if (k == pl->seqs_cap) {
        uint32_t cap = k ? 2 * k : 8;
        uintptr_t *a = realloc(pl->seq_key, cap * sizeof *a);
        uint32_t *b = a ? realloc(pl->seq_next, cap * sizeof *b) : NULL;
        if (a) pl->seq_key = a;
        if (!b) {
          back_off(pl);
          pthread_mutex_unlock(&pl->mu);
          return;
        }
        pl->seq_next = b, pl->seqs_cap = cap;
      }
      pl->seq_key[k] = key, pl->seq_next[k] = 0, pl->nseqs++;
    }
    uint32_t seq = pl->seq_next[k]++;
    it->v[it->n] =
        (gma__plan_rec_t){key, round512(size), pl->clock++, UINT32_MAX, seq, gma__thread_id()};
    if (!map_put(pl, (uintptr_t)ptr, (uint32_t)it->n)) back_off(pl);
    else it->n++;
  }
  pthread_mutex_unlock(&pl->mu);
}

void gma__plan_note_free(gma__planner_t *pl, void *ptr) {
  int st = gma__load_relaxed(&pl->state);
  if (st != GMA__PLAN_LEARNING && st != GMA__PLAN_VERIFYING) return;
  pthread_mutex_lock(&pl->mu);
  st = gma__load_relaxed(&pl->state);
  if (st == GMA__PLAN_LEARNING || st == GMA__PLAN_VERIFYING) {
    uint32_t i = map_take(pl, (uintptr_t)ptr);
    if (i != UINT32_MAX) pl->learn.v[i].end = pl->clock++;
  }
  pthread_mutex_unlock(&pl->mu);
}

/* ---- Making a plan from two iterations --------------------------------------------- */

/* The distinct stream keys of it, in first-request order (n_out of them). */
static uintptr_t *stream_keys(const gma__plan_iter_t *it, uint32_t *n_out) {
  uintptr_t *keys = NULL;
  uint32_t n = 0, cap = 0;
  for (size_t i = 0; i < it->n; i++) {
    if (it->v[i].seq != 0) continue; /* a stream's first request names it */
    if (n == cap) {
      cap = cap ? cap * 2 : 8;
      uintptr_t *k = realloc(keys, cap * sizeof *k);
      if (!k) {
        free(keys);
        return NULL;
      }
      keys = k;
    }
    keys[n++] = it->v[i].key;
  }
  *n_out = n;
  return keys;
}

/* A plan when iterations a and b asked for the same sizes in the same order
 * on every stream; NULL otherwise (or without host memory). An allocation
 * is planned when both iterations freed it before their marks; its lifetime
 * covers both. */
static gma__memplan_t *plan_from(const gma__plan_iter_t *a, const gma__plan_iter_t *b) {
  if (a->n != b->n || a->n == 0) return NULL;
  uint32_t na = 0, nb = 0;
  uintptr_t *ka = stream_keys(a, &na), *kb = stream_keys(b, &nb);
  gma__memplan_t *P = NULL;
  uint32_t **pos = NULL; /* per stream of b: its requests' indices in b, by seq */
  uint64_t *tids = NULL; /* the threads seen, by group number */
  uint32_t ntids_cap = 0;
  bool same = ka && kb && na == nb;
  for (uint32_t i = 0; same && i < na; i++) {
    uint32_t j = 0;
    while (j < nb && kb[j] != ka[i]) j++;
    same = j < nb;
  }
  if (!same) goto out;
  P = calloc(1, sizeof *P);
  pos = calloc(nb, sizeof *pos);
  if (!P || !pos || !(P->streams = calloc(nb, sizeof *P->streams))) goto fail;
  P->nstreams = nb;
  for (size_t i = 0; i < b->n; i++) { /* count each stream's requests */
    uint32_t s = 0;
    while (kb[s] != b->v[i].key) s++;
    P->streams[s].n++;
  }
  for (uint32_t s = 0; s < nb; s++) {
    pstream_t *ps = &P->streams[s];
    ps->key = kb[s];
    ps->size = malloc((ps->n ? ps->n : 1) * sizeof *ps->size);
    ps->slot = malloc((ps->n ? ps->n : 1) * sizeof *ps->slot);
    pos[s] = malloc((ps->n ? ps->n : 1) * sizeof *pos[s]);
    if (!ps->size || !ps->slot || !pos[s]) goto fail;
  }
  for (size_t i = 0; i < b->n; i++) {
    uint32_t s = 0;
    while (kb[s] != b->v[i].key) s++;
    pos[s][b->v[i].seq] = (uint32_t)i;
    P->streams[s].size[b->v[i].seq] = b->v[i].size;
  }
  /* a's requests, stream by stream, must match b's; count planned ones. */
  uint32_t planned = 0;
  for (size_t i = 0; i < a->n; i++) {
    const gma__plan_rec_t *r = &a->v[i];
    uint32_t s = 0;
    while (kb[s] != r->key) s++;
    pstream_t *ps = &P->streams[s];
    if (r->seq >= ps->n || ps->size[r->seq] != r->size) goto fail;
    const gma__plan_rec_t *q = &b->v[pos[s][r->seq]];
    bool plan_it = r->end != UINT32_MAX && q->end != UINT32_MAX;
    ps->slot[r->seq] = plan_it ? planned++ : NO_SLOT;
  }
  if (!planned) goto fail; /* nothing the iteration frees itself */
  P->nslots = planned;
  P->slots = calloc(planned, sizeof *P->slots);
  P->items = malloc(planned * sizeof *P->items);
  P->offsets = malloc(planned * sizeof *P->offsets);
  P->group = malloc(planned * sizeof *P->group);
  if (!P->slots || !P->items || !P->offsets || !P->group) goto fail;
  for (size_t i = 0; i < a->n; i++) {
    const gma__plan_rec_t *r = &a->v[i];
    uint32_t s = 0;
    while (kb[s] != r->key) s++;
    uint32_t j = P->streams[s].slot[r->seq];
    if (j == NO_SLOT) continue;
    const gma__plan_rec_t *q = &b->v[pos[s][r->seq]];
    P->items[j] = (gma__plan_item_t){r->size, r->start < q->start ? r->start : q->start,
                                     r->end > q->end ? r->end : q->end};
    P->slots[j].ps = s;
    /* Threads interleave differently every iteration: blocks of different
     * threads get apart places (groups), only one thread's blocks share. */
    uint32_t g = 0;
    while (g < P->ngroups && tids[g] != q->tid) g++;
    if (g == P->ngroups) {
      if (g == ntids_cap) {
        uint64_t *t = realloc(tids, (ntids_cap = ntids_cap ? 2 * ntids_cap : 4) * sizeof *t);
        if (!t) goto fail;
        tids = t;
      }
      tids[P->ngroups++] = q->tid;
    }
    P->group[j] = g;
  }
  goto out;
fail:
  plan_free(P);
  P = NULL;
out:
  for (uint32_t s = 0; pos && s < nb; s++) free(pos[s]);
  free(pos);
  free(tids);
  free(ka);
  free(kb);
  return P;
}

/* ---- Activating, dropping, releasing -------------------------------------------------- */

static void fold_counts(gma__planner_t *pl, gma__memplan_t *P) {
  for (uint32_t i = 0; i < P->nstreams; i++) {
    pl->hits += atomic_exchange_explicit(&P->streams[i].hits, 0, memory_order_relaxed);
    pl->misses += atomic_exchange_explicit(&P->streams[i].misses, 0, memory_order_relaxed);
  }
}

/* mu held. Gives P's arena back to the pool once none of its blocks is
 * live, gated on every stream its blocks were freed on or used by. The
 * store of dropped (by the caller, before) and the loads of owners here are
 * seq_cst, as are a taker's CAS and its load of dropped (claim): either
 * this scan sees the taker's cell, or the taker sees dropped. */
static bool try_release(gma__planner_t *pl, gma__memplan_t *P) {
  if (!P->held) return true;
  for (uint32_t c = 0; c < P->ncells; c++)
    if (atomic_load(&P->cells[c].owner)) return false;
  size_t n = 0, cap = 8;
  gma__stream_t **users = malloc(cap * sizeof *users);
  if (!users) return false;
  for (uint32_t j = 0; j < P->nslots; j++) {
    const stamp_t *t = &P->slots[j].stamp;
    for (uint32_t g = 0; g <= t->ngates; g++) {
      gma__stream_t *u = g == 0 ? t->stream : t->gates[g - 1].stream;
      size_t k = 0;
      while (k < n && users[k] != u) k++;
      if (!u || k < n) continue;
      if (n == cap) {
        gma__stream_t **a = realloc(users, 2 * cap * sizeof *a);
        if (!a) {
          free(users);
          return false;
        }
        users = a, cap *= 2;
      }
      users[n++] = u;
    }
  }
  /* Nobody may find P by address once the pool can hand the memory out
   * again (a free of such a block must not land here): unpublished first,
   * and the pool lock orders this before any later allocation of it. */
  if (gma__load_relaxed(&pl->retiring) == P) gma__store_release(&pl->retiring, NULL);
  gma_status_t st = gma__pool_free_after(pl->p, P->arena_ptr, users, n);
  free(users);
  if (st != GMA_OK) { /* no host memory for the gates: kept, tried again at the next mark */
    gma__store_release(&pl->retiring, P);
    return false;
  }
  fold_counts(pl, P); /* a hit counted after the drop's fold (its block is free now) */
  P->held = false;
  return true;
}

/* mu held: the active plan P stops serving; its arena goes back when its
 * blocks are free (now, or at a later mark). */
static void drop(gma__planner_t *pl, gma__memplan_t *P) {
  atomic_store(&P->dropped, true);
  /* Published as retiring before it stops being active, so a free (or
   * gma_pointer_info) of a block claimed just before the drop always finds
   * it; try_release unpublishes it once the arena goes back. */
  if (!gma__load_relaxed(&pl->retiring)) gma__store_release(&pl->retiring, P);
  gma__store_release(&pl->active, NULL);
  fold_counts(pl, P);
  pl->replans++;
  if (!try_release(pl, P)) gma__store_release(&pl->retiring, P);
}

/* mu held: settles and gives back the learning iterations' cache, takes the
 * arena on the legacy stream, and makes it safe for every stream. */
static bool activate(gma__planner_t *pl, gma__memplan_t *P) {
  gma__pool_t *p = pl->p;
  gma__pool_settle(p, gma__now_ns() + SETTLE_NS);
  gma__pool_trim(p, 0);
  /* A size the pool hands out as is (a bin-sized one gets its class size). */
  if (P->arena <= p->bin_max) P->arena = gma__class_size(gma__class_of(P->arena));
  uint64_t id;
  void *ptr = NULL;
  if (p->dev->ops->stream_id(p->dev, NULL, &id) != GMA_OK ||
      gma__pool_alloc_slow(p, P->arena, NULL, id, GMA__ALLOC_WAIT | GMA__ALLOC_ARENA, &ptr) !=
          GMA_OK)
    return false;
  P->arena_ptr = ptr;
  P->base = (uintptr_t)ptr;
  P->held = true;
  /* The arena was FREE (safe for all), new, or cached on the legacy stream;
   * once that stream's work is done it is safe for every stream. */
  if (gma__pool_stream_synchronize(p, NULL) != GMA_OK) {
    atomic_store(&P->dropped, true);
    try_release(pl, P);
    return false;
  }
  free(P->items), P->items = NULL;
  free(P->offsets), P->offsets = NULL;
  gma__store_release(&pl->active, P); /* pairs with the hot paths' acquire */
  return true;
}

/* An iteration misses its plan when more than one request in 8 of the
 * plan's streams went elsewhere. */
static bool iteration_missed(gma__memplan_t *P) {
  uint64_t h = 0, m = 0;
  for (uint32_t i = 0; i < P->nstreams; i++) {
    h += gma__load_relaxed(&P->streams[i].hits);
    m += gma__load_relaxed(&P->streams[i].misses);
  }
  return m > 4 && m * 8 > h + m;
}

gma_status_t gma__plan_mark(gma__planner_t *pl) {
  if (!pl->on) return GMA_OK;
  pthread_mutex_lock(&pl->mu);
  pl->iterations++;
  gma__memplan_t *R = gma__load_relaxed(&pl->retiring);
  if (R && try_release(pl, R)) gma__store_release(&pl->retiring, NULL);
  switch (gma__load_relaxed(&pl->state)) {
    case GMA__PLAN_OFF:
      if (pl->skip) {
        pl->skip--;
        break;
      }
      learn_reset(pl);
      gma__store_relaxed(&pl->state, GMA__PLAN_LEARNING);
      break;
    case GMA__PLAN_LEARNING: { /* one iteration learned: learn the next to compare */
      gma__plan_iter_t t = pl->prev;
      pl->prev = pl->learn;
      pl->learn = t;
      learn_reset(pl);
      gma__store_relaxed(&pl->state, GMA__PLAN_VERIFYING);
      break;
    }
    case GMA__PLAN_VERIFYING: {
      gma__memplan_t *P = plan_from(&pl->prev, &pl->learn);
      if (P && ++pl->matches < MATCHES) { /* repeated, but not yet often enough */
        plan_free(P);
        P = NULL;
      } else if (!P) {
        pl->matches = 0;
        if (++pl->failures >= 3) {
          back_off(pl);
          break;
        }
      }
      if (!P) { /* compare the next iteration with this one */
        gma__plan_iter_t t = pl->prev;
        pl->prev = pl->learn;
        pl->learn = t;
        learn_reset(pl);
        break;
      }
      pl->matches = 0;
      learn_free(pl);
      pl->failures = 0;
      P->next = pl->all;
      pl->all = P;
      pl->placing = P;
      gma__store_relaxed(&pl->state, GMA__PLAN_PLACING);
      if (!pl->w || !gma__worker_run_job(pl->w, place_job, P)) place_job(P);
      break;
    }
    case GMA__PLAN_PLACING: {
      gma__memplan_t *P = pl->placing;
      if (!gma__load_acquire(&P->placed)) break; /* pairs with place_job's release */
      if (gma__load_relaxed(&pl->retiring)) break; /* one arena at a time */
      pl->placing = NULL;
      if (P->ok && activate(pl, P)) {
        gma__store_relaxed(&pl->state, GMA__PLAN_ACTIVE);
      } else {
        back_off(pl);
      }
      break;
    }
    case GMA__PLAN_ACTIVE: {
      gma__memplan_t *P = gma__load_relaxed(&pl->active);
      if (iteration_missed(P)) {
        drop(pl, P);
        if (P->served < SERVED_OK) { /* a plan that did not last: as a failed attempt */
          back_off(pl);
        } else {
          learn_reset(pl); /* learn this workload again from now */
          gma__store_relaxed(&pl->state, GMA__PLAN_LEARNING);
        }
        break;
      }
      if (++P->served == SERVED_OK) pl->backoff = 1; /* plans pay off here again */
      fold_counts(pl, P);
      for (uint32_t i = 0; i < P->nstreams; i++) gma__store_relaxed(&P->streams[i].cursor, 0);
      break;
    }
  }
  pthread_mutex_unlock(&pl->mu);
  return GMA_OK;
}

/* mu held: no planned block of P is live, and none was handed out in the
 * last unused_ns (0: whenever), by the pool's clock. */
static bool plan_idle(gma__planner_t *pl, const gma__memplan_t *P, uint64_t unused_ns) {
  for (uint32_t c = 0; c < P->ncells; c++)
    if (atomic_load(&P->cells[c].owner)) return false;
  uint64_t now = gma__load_relaxed(&pl->p->clock_ns);
  for (uint32_t j = 0; unused_ns && j < P->nslots; j++) {
    uint64_t born = gma__load_relaxed(&P->slots[j].born_ns);
    if (born && now - born < unused_ns) return false;
  }
  return true;
}

/* mu held: the body of gma__plan_reclaim. */
static bool reclaim_locked(gma__planner_t *pl, uint64_t unused_ns) {
  bool gave = false;
  gma__memplan_t *R = gma__load_relaxed(&pl->retiring);
  if (R && try_release(pl, R)) {
    gma__store_release(&pl->retiring, NULL);
    gave = true;
  }
  gma__memplan_t *A = gma__load_relaxed(&pl->active);
  if (A && !gma__load_relaxed(&pl->retiring) && plan_idle(pl, A, unused_ns)) {
    drop(pl, A); /* a claim racing with this is settled by drop's dropped flag */
    learn_reset(pl);
    gma__store_relaxed(&pl->state, GMA__PLAN_LEARNING);
    gave = !gma__load_relaxed(&pl->retiring); /* else a claim won the race: kept for later */
  }
  return gave;
}

bool gma__plan_reclaim(gma__planner_t *pl, uint64_t unused_ns) {
  if (!pl->on || !gma__plan_holds_arena(pl)) return false;
  pthread_mutex_lock(&pl->mu);
  bool gave = reclaim_locked(pl, unused_ns);
  pthread_mutex_unlock(&pl->mu);
  return gave;
}

bool gma__plan_reclaim_timed(gma__planner_t *pl, uint64_t unused_ns) {
  if (!pl->on || !gma__plan_holds_arena(pl) || pthread_mutex_trylock(&pl->mu) != 0)
    return false;
  bool gave = reclaim_locked(pl, unused_ns);
  pthread_mutex_unlock(&pl->mu);
  return gave;
}

bool gma__plan_holds_arena(gma__planner_t *pl) {
  return gma__load_acquire(&pl->active) || gma__load_acquire(&pl->retiring);
}

void gma__plan_empty(gma__planner_t *pl) { gma__plan_reclaim(pl, 0); }

/* ---- Serving ---------------------------------------------------------------------------- */

static void unclaim(gma__memplan_t *P, uint32_t c0, uint32_t c1) {
  for (uint32_t c = c0; c < c1; c++) gma__store_release(&P->cells[c].owner, 0);
}

/* Pool lock taken here: whether every earlier user of slot j's cells is
 * ordered before stream s's next work (see the top). */
static bool users_settled(gma__planner_t *pl, gma__memplan_t *P, const slot_t *sl,
                          gma__stream_t *s) {
  gma__pool_t *p = pl->p;
  bool ok = true;
  pthread_mutex_lock(&p->lock);
  uint32_t seen = 0;
  for (uint32_t c = sl->c0; ok && c < sl->c1; c++) {
    uint32_t last = gma__load_relaxed(&P->cells[c].last);
    if (!last || last == seen) continue;
    seen = last;
    const stamp_t *t = &P->slots[last - 1].stamp;
    if (t->stream != s) {
      gma__gate_t g = {t->stream, t->epoch};
      ok = gma__gate_settle(p, &g, s, pl->wait);
    }
    for (uint32_t i = 0; ok && i < t->ngates; i++)
      if (t->gates[i].stream != s) ok = gma__gate_settle(p, &t->gates[i], s, pl->wait);
  }
  pthread_mutex_unlock(&p->lock);
  return ok;
}

/* Hands out slot j on s, or MISS. */
static gma_status_t claim(gma__planner_t *pl, gma__memplan_t *P, uint32_t j, gma__stream_t *s,
                          size_t size, void **out) {
  slot_t *sl = &P->slots[j];
  uint32_t c = sl->c0;
  for (; c < sl->c1; c++) {
    uint32_t none = 0;
    if (!atomic_compare_exchange_strong(&P->cells[c].owner, &none, j + 1)) break;
  }
  if (c < sl->c1 || atomic_load(&P->dropped)) { /* overlap with a live block, or dropped */
    unclaim(P, sl->c0, c);
    return MISS;
  }
  bool slow = false;
  uint32_t seen = 0;
  for (c = sl->c0; !slow && c < sl->c1; c++) {
    uint32_t last = gma__load_relaxed(&P->cells[c].last);
    if (!last || last == seen) continue;
    seen = last;
    const stamp_t *t = &P->slots[last - 1].stamp;
    slow = t->stream != s || t->ngates;
  }
  if (slow && ((pl->p->test_flags & GMA__TEST_NO_EPOCH_GATING) == 0) &&
      !users_settled(pl, P, sl, s)) {
    unclaim(P, sl->c0, sl->c1);
    return MISS;
  }
  sl->stream = s;
  sl->requested = size;
  gma__store_relaxed(&sl->tag, 0);
  gma__store_relaxed(&sl->born_ns, gma__load_relaxed(&pl->p->clock_ns));
  gma__store_relaxed(&sl->nusers, 0);
  gma__store_release(&sl->live, 1);
  gma__tcount_t *tc = gma__tcount(pl->p, s);
  gma__counter_add_owner(&tc->allocs, 1);
  gma__counter_add_owner(&tc->alloc_bytes, sl->size);
  gma__counter_add_owner(&tc->inner_bytes, sl->size);
  gma__counter_add_owner(&tc->req_bytes, size);
  *out = (void *)(P->base + sl->offset);
  return GMA_OK;
}

gma_status_t gma__plan_alloc(gma__planner_t *pl, size_t size, gma_stream_t stream, void **out) {
  gma__memplan_t *P = gma__load_acquire(&pl->active); /* pairs with activate's release */
  if (!P) return MISS;
  uint64_t owner;
  uintptr_t key = gma__stream_key(stream, &owner);
  pstream_t *ps = NULL;
  for (uint32_t i = 0; i < P->nstreams && !ps; i++)
    if (P->streams[i].key == key) ps = &P->streams[i];
  if (!ps) return MISS;
  uint64_t want = round512(size);
  for (;;) {
    uint32_t c = gma__load_relaxed(&ps->cursor), k = c;
    uint32_t lim = ps->n - c > LOOKAHEAD ? c + LOOKAHEAD : ps->n;
    while (k < lim && ps->size[k] != want) k++;
    if (k >= lim) break; /* another size, or past the iteration's end */
    if (!atomic_compare_exchange_weak_explicit(&ps->cursor, &c, k + 1, memory_order_relaxed,
                                               memory_order_relaxed))
      continue; /* another thread of this stream took an entry: look again */
    uint32_t j = ps->slot[k];
    if (j == NO_SLOT) return MISS; /* the plan leaves this one to the ordinary path */
    gma__pool_t *p = pl->p;
    gma__stream_t *s = gma__stream_cached(p, stream);
    uint64_t id;
    if (!s && p->dev->ops->stream_id(p->dev, stream, &id) == GMA_OK)
      s = gma__stream_live(p, stream, id);
    if (s && claim(pl, P, j, s, size, out) == GMA_OK) {
      atomic_fetch_add_explicit(&ps->hits, 1, memory_order_relaxed);
      return GMA_OK;
    }
    break;
  }
  atomic_fetch_add_explicit(&ps->misses, 1, memory_order_relaxed);
  return MISS;
}

static gma_status_t double_free(void *ptr) {
  return gma__set_error(GMA_ERR_DOUBLE_FREE,
                        "gma_free(%p): the pointer is not live: it lies in planned memory that "
                        "was already freed (double free or use after free?)",
                        ptr);
}

/* The plan whose arena holds ptr, or NULL. */
static gma__memplan_t *plan_of(gma__planner_t *pl, uintptr_t a) {
  gma__memplan_t *P = gma__load_acquire(&pl->active);
  if (P && a - P->base < P->arena) return P;
  P = gma__load_acquire(&pl->retiring);
  if (P && a - P->base < P->arena) return P;
  return NULL;
}

gma_status_t gma__plan_free(gma__planner_t *pl, void *ptr) {
  uintptr_t a = (uintptr_t)ptr;
  gma__memplan_t *P = plan_of(pl, a);
  if (!P) return MISS;
  uint64_t off = a - P->base;
  uint32_t c = cell_at(P, off);
  uint32_t o = gma__load_acquire(&P->cells[c].owner); /* pairs with claim's CAS */
  slot_t *sl = o ? &P->slots[o - 1] : NULL;
  if (sl && sl->offset != off)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_free(%p): interior pointer, %" PRIu64 " bytes into the live "
                          "allocation at %p; pass the pointer gma_alloc returned",
                          ptr, off - sl->offset, (void *)(P->base + sl->offset));
  if (!sl || !gma__load_relaxed(&sl->live))
    return double_free(ptr);
  /* Two frees of one block may race: the compare-and-swap decides which one
   * is the free, and the other touches nothing. */
  uint8_t one = 1;
  if (!atomic_compare_exchange_strong(&sl->live, &one, 0)) return double_free(ptr);
  stamp_t *t = &sl->stamp;
  uint32_t nusers = gma__load_relaxed(&sl->nusers);
  if (nusers > t->gates_cap) {
    gma__gate_t *g = realloc(t->gates, nusers * sizeof *g);
    if (!g) { /* the block stays live: its cells were never let go */
      gma__store_release(&sl->live, 1);
      return gma__set_error(GMA_ERR_OOM, "gma_free(%p): no host memory for the gates of "
                            "record_stream's streams; the allocation stays live, try again",
                            ptr);
    }
    t->gates = g, t->gates_cap = nusers;
  }
  gma__stream_t *s = sl->stream;
  t->stream = s;
  t->ngates = 0;
  if (nusers || sl->xnext || gma__load_relaxed(&s->retired)) {
    /* Other streams used it, or will use its memory next, or its stream
     * was retired: their epochs (a retired stream's free_epoch) are read
     * under the lock, as pool.c does, and closed at once when another
     * stream is to reuse the memory: its wait then covers only the work
     * queued before this free. */
    gma__pool_t *p = pl->p;
    pthread_mutex_lock(&p->lock);
    bool r = gma__load_relaxed(&s->retired);
    t->epoch = r ? s->free_epoch : gma__load_relaxed(&s->epoch);
    if (!r) gma__store_relaxed(&s->dirty, true);
    for (uint32_t i = 0; i < nusers; i++) {
      gma__stream_t *u = sl->users[i];
      bool ur = gma__load_relaxed(&u->retired);
      t->gates[t->ngates++] = (gma__gate_t){u, ur ? u->free_epoch : gma__load_relaxed(&u->epoch)};
      if (!ur) gma__store_relaxed(&u->dirty, true);
      if (!ur) gma__stream_close_epoch(p, u);
    }
    if (!r && (sl->xnext || nusers)) gma__stream_close_epoch(p, s);
    pthread_mutex_unlock(&p->lock);
  } else {
    /* As gma__bin_free: read after the caller queued its last work on s. */
    t->epoch = gma__load_relaxed(&s->epoch);
    if (!gma__load_relaxed(&s->dirty)) gma__store_relaxed(&s->dirty, true);
  }
  gma__tcount_t *tc = gma__tcount(pl->p, s);
  gma__counter_add_owner(&tc->frees, 1);
  gma__counter_add_owner(&tc->free_bytes, sl->size);
  gma__counter_add_owner(&tc->inner_freed, sl->size);
  gma__counter_add_owner(&tc->req_freed, sl->requested);
  uint32_t j = (uint32_t)(sl - P->slots);
  for (uint32_t k = sl->c0; k < sl->c1; k++) {
    gma__store_relaxed(&P->cells[k].last, j + 1);
    gma__store_release(&P->cells[k].owner, 0); /* pairs with the next taker's CAS */
  }
  return GMA_OK;
}

gma_status_t gma__plan_record_stream(gma__planner_t *pl, void *ptr, gma_stream_t stream,
                                     void **base) {
  uintptr_t a = (uintptr_t)ptr;
  gma__memplan_t *P = plan_of(pl, a);
  if (!P) return MISS;
  uint32_t o = gma__load_acquire(&P->cells[cell_at(P, a - P->base)].owner);
  if (!o)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_record_stream(%p): the pointer is not live: it lies in planned "
                          "memory that was already freed (use after free?)",
                          ptr);
  slot_t *sl = &P->slots[o - 1];
  *base = (void *)(P->base + sl->offset);
  gma__pool_t *p = pl->p;
  uint64_t id;
  gma_status_t st = p->dev->ops->stream_id(p->dev, stream, &id);
  if (st != GMA_OK) return st;
  pthread_mutex_lock(&p->lock);
  gma__stream_t *u = gma__stream_resolve(p, stream, id);
  uint32_t n = gma__load_relaxed(&sl->nusers), i = 0;
  while (u && i < n && sl->users[i] != u) i++;
  if (!u) {
    st = gma__set_error(GMA_ERR_OOM, "host memory for a stream record");
  } else if (u != sl->stream && i == n) {
    if (n == sl->users_cap) {
      uint32_t cap = n ? 2 * n : 2;
      gma__stream_t **v = realloc(sl->users, cap * sizeof *v);
      if (!v) st = gma__set_error(GMA_ERR_OOM, "host memory for record_stream");
      else sl->users = v, sl->users_cap = cap;
    }
    if (st == GMA_OK) {
      sl->users[n] = u;
      gma__store_relaxed(&sl->nusers, n + 1);
    }
  }
  pthread_mutex_unlock(&p->lock);
  return st;
}

/* The live planned block holding a, or NULL (lock-free; a racing free may
 * end it at any time, as for any pointer a caller asks about). */
static slot_t *live_slot(gma__planner_t *pl, uintptr_t a, gma__memplan_t **out) {
  gma__memplan_t *P = plan_of(pl, a);
  if (!P) return NULL;
  uint32_t o = gma__load_acquire(&P->cells[cell_at(P, a - P->base)].owner);
  *out = P;
  /* live's acquire pairs with claim's release: stream, requested are set. */
  return o && gma__load_acquire(&P->slots[o - 1].live) ? &P->slots[o - 1] : NULL;
}

int gma__plan_info(gma__planner_t *pl, const void *ptr, gma_pointer_info_t *r) {
  gma__memplan_t *P = NULL;
  slot_t *sl = live_slot(pl, (uintptr_t)ptr, &P);
  if (!sl) return P ? -1 : 0;
  r->kind = GMA_MEMORY_DEVICE;
  r->base = (void *)(P->base + sl->offset);
  r->requested = sl->requested;
  r->block_size = sl->size;
  r->stream = sl->stream->handle;
  r->tag = gma__tag_name(pl->p, gma__load_relaxed(&sl->tag));
  return 1;
}

bool gma__plan_set_tag(gma__planner_t *pl, void *ptr, uint8_t id) {
  gma__memplan_t *P = NULL;
  slot_t *sl = live_slot(pl, (uintptr_t)ptr, &P);
  if (!sl) return false;
  gma__store_relaxed(&sl->tag, id);
  return true;
}

bool gma__plan_each_live(gma__planner_t *pl, uintptr_t addr,
                         bool (*fn)(void *arg, const gma_allocation_info_t *info, uint64_t born),
                         void *arg) {
  gma__memplan_t *P = plan_of(pl, addr);
  if (!P || P->base != addr) return false;
  for (uint32_t c = 0; c < P->ncells;) {
    uint32_t o = gma__load_acquire(&P->cells[c].owner);
    const slot_t *sl = o ? &P->slots[o - 1] : NULL;
    if (!sl || sl->c0 != c || !gma__load_acquire(&sl->live)) {
      c++;
      continue;
    }
    gma_allocation_info_t info = {
        .ptr = (void *)(P->base + sl->offset),
        .requested = sl->requested,
        .block_size = sl->size,
        .stream = sl->stream->handle,
        .tag = gma__tag_name(pl->p, gma__load_relaxed(&sl->tag))};
    if (!fn(arg, &info, gma__load_relaxed(&sl->born_ns))) break;
    c = sl->c1;
  }
  return true;
}

/* gma__plan_snapshot's walk over the live planned blocks, in address
 * order: the run before each one (state "planned"), then the block. */
typedef struct snap_walk {
  FILE *f;        /* NULL: count only */
  uintptr_t at;   /* where the next run starts */
  bool first;     /* nothing written yet */
  uint64_t live, requested;
} snap_walk_t;

static void snap_run(snap_walk_t *w, uintptr_t end) {
  if (end <= w->at) return;
  if (w->f)
    fprintf(w->f,
            "%s{\"address\":\"0x%" PRIxPTR "\",\"size\":%" PRIu64
            ",\"state\":\"planned\",\"stream\":\"0x0\",\"requested\":0,\"tag\":\"\"}",
            w->first ? "" : ",", w->at, (uint64_t)(end - w->at));
  w->first = false;
}

static bool snap_block(void *arg, const gma_allocation_info_t *info, uint64_t born) {
  (void)born;
  snap_walk_t *w = arg;
  snap_run(w, (uintptr_t)info->ptr);
  w->live += info->block_size;
  w->requested += info->requested;
  char tag[GMA__TAG_JSON];
  if (w->f)
    fprintf(w->f,
            "%s{\"address\":\"0x%" PRIxPTR "\",\"size\":%" PRIu64
            ",\"state\":\"live\",\"stream\":\"0x%" PRIxPTR "\",\"requested\":%zu"
            ",\"tag\":\"%s\"}",
            w->first ? "" : ",", (uintptr_t)info->ptr, (uint64_t)info->block_size,
            (uintptr_t)info->stream, info->requested, gma__tag_json(info->tag, tag));
  w->first = false;
  w->at = (uintptr_t)info->ptr + info->block_size;
  return true;
}

bool gma__plan_snapshot(gma__planner_t *pl, uintptr_t addr, FILE *f, uint64_t *live,
                        uint64_t *requested) {
  snap_walk_t w = {.f = f, .at = addr, .first = true};
  if (!gma__plan_each_live(pl, addr, snap_block, &w)) return false;
  snap_run(&w, addr + plan_of(pl, addr)->arena);
  *live = w.live, *requested = w.requested;
  return true;
}


/* ---- Life and figures ------------------------------------------------------------------- */

gma_status_t gma__plan_init(gma__planner_t *pl, gma__pool_t *p, struct gma__worker *w,
                            const gma_config_t *cfg) {
  memset(pl, 0, sizeof *pl);
  pl->p = p;
  pl->w = w;
  pl->on = cfg->plan != 0;
  /* A plan reuses memory across streams by design (it was placed by the
   * host's order of requests, which runs ahead of the device), so a planned
   * address whose earlier user's work on another stream has not completed
   * is handed out behind a device-side wait on that work, as reuse:wait
   * does, rather than missed: the plan's memory figure holds. reuse:none
   * forbids it (such a request takes the ordinary path). */
  pl->wait = cfg->reuse != GMA_REUSE_NONE;
  pl->backoff = 1;
  if (pthread_mutex_init(&pl->mu, NULL) != 0)
    return gma__set_error(GMA_ERR_OOM, "gma_create: no mutex for planned memory");
  return GMA_OK;
}

uint64_t gma__plan_release(gma__planner_t *pl, uint64_t *bytes) {
  uint64_t n = 0;
  *bytes = 0;
  pthread_mutex_lock(&pl->mu);
  gma__memplan_t *A = gma__load_relaxed(&pl->active);
  if (A) {
    atomic_store(&A->dropped, true);
    fold_counts(pl, A);
  }
  gma__store_release(&pl->active, NULL);
  gma__store_release(&pl->retiring, NULL);
  for (gma__memplan_t *P = pl->all; P; P = P->next) {
    if (!P->held) continue;
    for (uint32_t j = 0; j < P->nslots; j++)
      if (gma__load_relaxed(&P->slots[j].live)) {
        n++;
        *bytes += P->slots[j].size;
        gma__store_relaxed(&P->slots[j].live, 0);
      }
    for (uint32_t c = 0; c < P->ncells; c++) gma__store_relaxed(&P->cells[c].owner, 0);
    try_release(pl, P);
  }
  pthread_mutex_unlock(&pl->mu);
  return n;
}

void gma__plan_fini(gma__planner_t *pl) {
  for (gma__memplan_t *P = pl->all, *next; P; P = next) {
    next = P->next;
    plan_free(P);
  }
  pl->all = NULL;
  learn_free(pl);
  pthread_mutex_destroy(&pl->mu);
}

void gma__plan_stats(gma__planner_t *pl, gma_stats_t *st) {
  if (!pl->on) {
    gma__pool_stats(pl->p, st);
    return;
  }
  pthread_mutex_lock(&pl->mu); /* before the pool's lock, as marks and reclaims take them */
  gma__pool_stats(pl->p, st);
  st->plan_state = gma__load_relaxed(&pl->state);
  st->plan_hits = pl->hits;
  st->plan_misses = pl->misses;
  gma__memplan_t *P = gma__load_relaxed(&pl->active);
  for (uint32_t i = 0; P && i < P->nstreams; i++) {
    st->plan_hits += gma__load_relaxed(&P->streams[i].hits);
    st->plan_misses += gma__load_relaxed(&P->streams[i].misses);
  }
  st->plan_replans = pl->replans;
  st->plan_iterations = pl->iterations;
  if (P) {
    st->plan_arena_bytes = P->arena;
    st->plan_lower_bound = P->lower_bound;
    st->plan_slots = P->nslots;
  }
  /* A dropped plan's arena stays reserved until its blocks are freed (the
   * next mark gives it back): it counts too, or reserved = allocated +
   * stream_cached + pending + free + plan_arena_bytes would not hold. */
  gma__memplan_t *R = gma__load_relaxed(&pl->retiring);
  if (R && R->held) st->plan_arena_bytes += R->arena;
  pthread_mutex_unlock(&pl->mu);
}
