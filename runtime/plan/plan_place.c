/* Owns the offline placement of a planned iteration (plan_place.h): the
 * greedy solver, its data structures, and the O(n log n) validity check.
 *
 * How it places. One greedy pass takes the items in a fixed order and puts
 * each at the lowest offset where it overlaps no item already placed that is
 * live at the same time (first fit in address over the item's lifetime).
 * Which order works best depends on the workload, so several are tried and
 * the smallest arena wins: longest lifetime first, largest first, "greedy by
 * breadth" (items of the busiest instants first; Pisarchyk and Lee, 2020),
 * and largest size x lifetime first. The passes stop as soon as one reaches
 * the lower bound, which no placement can beat. Every tie is broken by the
 * item's index, so the plan is a function of the input alone.
 *
 * How a pass is fast. Two items are live together exactly when one starts
 * while the other is live, so only the starts matter, and a run of starts
 * with no end between them is one instant (what is live at the first is live
 * at the others): these instants are the leaves of a segment tree, and each
 * item covers a range [lo, hi) of them. A range has O(log n) canonical nodes
 * (the maximal nodes inside it) and O(log n) straddling nodes (the nodes
 * that intersect it without lying inside it: the proper ancestors of the
 * canonical nodes). Each node v keeps two sets of address ranges, each a
 * sorted array of disjoint ranges merged where they touch:
 *   cover(v): the items that have v as a canonical node (live at every
 *             instant of v);
 *   under(v): the items that have v as a straddling node (live at some
 *             instant of v; together with cover of v and of its subtree's
 *             nodes, every item live at some instant of v).
 * So the placed items live together with a new one are exactly cover(c) and
 * under(c) for its canonical nodes c plus cover(p) for its straddling nodes p,
 * and first fit walks those O(log n) sorted sets upwards from offset 0 in
 * step, jumping over each range it hits, instead of visiting every item that
 * conflicts. The sets stay short where it matters: first fit puts an item at
 * 0 or at the end of a range it conflicts with, so near the root the sets
 * merge into a few runs. A pass costs O(n log n) set operations plus the
 * jumps, however many items each one overlaps; the jumps are capped per item
 * (first_fit) and the passes by a work budget, so that a pathological plan
 * costs seconds, not hours. Memory: O(n log n) ranges at worst; at 300k
 * items about 10 MB for a training-like plan, 80 MB for random lifetimes.
 *
 * Pure computation: no device, no locks, no globals; every state lives in
 * the call's own allocations, so any number of threads may call it at once.
 * Addresses are kept in 512-byte units inside the solver. */
#include "plan/plan_place.h"

#include <stdlib.h>
#include <string.h>

#define UNIT 512u

/* ---- sorting ------------------------------------------------------------ */

/* A record to sort: ascending by k, stably (records go in by index, so ties
 * keep index order and the plan is a function of the input alone). */
typedef struct rec {
  uint64_t k;
  uint32_t i;
} rec_t;

/* LSD radix sort, one byte a pass, skipping the passes where every key has
 * the same byte (the high bytes of most keys). Returns the sorted array: a
 * or tmp. */
static rec_t *radix_sort(rec_t *a, rec_t *tmp, size_t n) {
  if (n < 2) return a;
  size_t count[8][256] = {{0}};
  for (size_t j = 0; j < n; j++)
    for (unsigned b = 0; b < 8; b++) count[b][(a[j].k >> (8 * b)) & 0xff]++;
  for (unsigned b = 0; b < 8; b++) {
    size_t *c = count[b], sum = 0;
    if (c[(a[0].k >> (8 * b)) & 0xff] == n) continue; /* one value: nothing to reorder */
    for (unsigned d = 0; d < 256; d++) {
      size_t x = c[d];
      c[d] = sum, sum += x;
    }
    for (size_t j = 0; j < n; j++) tmp[c[(a[j].k >> (8 * b)) & 0xff]++] = a[j];
    rec_t *t = a;
    a = tmp, tmp = t;
  }
  return a;
}

/* The first index in the ascending v[0..n) whose value is >= x. */
static size_t lower_bound_u64(const uint64_t *v, size_t n, uint64_t x) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* ---- address range sets ---------------------------------------------------- */

typedef struct span {
  uint64_t lo, hi; /* [lo, hi) in units */
} span_t;

/* A node's two sets, each a run of disjoint, non-touching spans sorted by
 * address in the pool: cover at pool[cover_off, + cover_len), under
 * likewise. A set's room is implied by its length (room_for), so a node
 * takes 16 bytes and a pass touches one cache line per node. */
typedef struct node {
  uint32_t cover_off, cover_len, under_off, under_len;
} node_t;

typedef struct solver {
  uint32_t leaves; /* a power of two >= the number of leaves in use */
  unsigned depth;  /* log2(leaves) */
  node_t *node;    /* 1 .. 2 * leaves - 1 */
  span_t *pool;    /* every set's spans; a set that outgrows its room moves to the end */
  size_t used, room;
} solver_t;

/* The room a set of len spans has: the next power of two (at least 2). A
 * set that shrinks by merging may have more, which is only wasted. */
static inline uint32_t room_for(uint32_t len) {
  uint32_t r = 2;
  while (r < len) r *= 2;
  return r;
}

/* Adds [lo, hi) to the set at *off, *len, merging it with the spans it
 * overlaps or touches. False when memory ran out. */
static bool set_add(solver_t *s, uint32_t *off, uint32_t *len, uint64_t lo, uint64_t hi) {
  span_t *v = s->pool ? s->pool + *off : NULL; /* no pool yet: n is 0, it moves up below */
  uint32_t n = *len, a = 0, b = n;
  while (a < b) { /* a: the first span ending at or above lo */
    uint32_t mid = a + (b - a) / 2;
    if (v[mid].hi < lo) a = mid + 1;
    else b = mid;
  }
  for (b = a; b < n && v[b].lo <= hi; b++) {
  }
  if (b > a) { /* spans a .. b-1 merge with it into one */
    if (v[a].lo < lo) lo = v[a].lo;
    if (v[b - 1].hi > hi) hi = v[b - 1].hi;
    v[a] = (span_t){lo, hi};
    memmove(v + a + 1, v + b, (n - b) * sizeof *v);
    *len = n - (b - a - 1);
    return true;
  }
  if (n == 0 || (n >= 2 && room_for(n) == n)) { /* full (or never given room): move up */
    uint32_t room = room_for(n + 1);
    if (s->used + room > s->room) {
      size_t want = s->room ? s->room : 4096;
      while (want < s->used + room) want *= 2;
      if (want > UINT32_MAX) return false; /* offsets are 32 bits: 64 GiB of spans */
      span_t *p = realloc(s->pool, want * sizeof *p);
      if (!p) return false;
      s->pool = p, s->room = want;
    }
    memcpy(s->pool + s->used, s->pool + *off, n * sizeof *v);
    *off = (uint32_t)s->used;
    s->used += room;
    v = s->pool + *off;
  }
  memmove(v + a + 1, v + a, (n - a) * sizeof *v);
  v[a] = (span_t){lo, hi};
  *len = n + 1;
  return true;
}

/* One set as first fit walks it: the cursor only moves up, as the candidate
 * offset does. */
typedef struct probe {
  const span_t *v;
  uint32_t len, cur;
} probe_t;

/* The first span at or after c ending above at, given that v[c] ends at or
 * below it: gallop, then binary search. */
static uint32_t skip_below(const span_t *v, uint32_t c, uint32_t len, uint64_t at) {
  uint32_t lo = c, step = 1;
  while (lo + step < len && v[lo + step].hi <= at) lo += step, step *= 2;
  uint32_t hi = lo + step < len ? lo + step : len;
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (v[mid].hi <= at) lo = mid;
    else hi = mid;
  }
  return hi;
}

/* The lowest offset where size units fit between the spans of all probes.
 * A candidate moves only to the end of a span it hits, and it is accepted
 * once every set has been checked against it in a row. *steps grows by the
 * checks made. When the sets' spans interleave (many items live together,
 * placed in a mixed order), the candidate can creep up one item at a time;
 * after STEP_LIMIT checks the search gives up on the gaps and returns the
 * top of every probe, which is free too, so that no plan's cost grows
 * quadratically. */
#define STEP_LIMIT 2048u

static uint64_t first_fit(probe_t *p, unsigned np, uint64_t size, uint64_t *steps) {
  uint64_t at = 0, n = 0;
  unsigned clean = 0, k = 0;
  for (; clean < np; n++) {
    if (n == STEP_LIMIT) {
      for (unsigned j = 0; j < np; j++)
        if (p[j].v[p[j].len - 1].hi > at) at = p[j].v[p[j].len - 1].hi;
      break;
    }
    probe_t *q = &p[k];
    if (q->cur < q->len && q->v[q->cur].hi <= at) q->cur = skip_below(q->v, q->cur, q->len, at);
    if (q->cur < q->len && q->v[q->cur].lo < at + size) {
      at = q->v[q->cur].hi; /* recheck this set: its next span may still be in the way */
      clean = 0;
      continue;
    }
    clean++;
    k = k + 1 == np ? 0 : k + 1;
  }
  *steps += n;
  return at;
}

/* The canonical and straddling nodes of the leaf range [lo, hi): at most
 * 2 * depth of each. */
static void nodes_of(const solver_t *s, uint32_t lo, uint32_t hi, uint32_t *canon, unsigned *nc,
                     uint32_t *strad, unsigned *ns) {
  uint32_t l = lo + s->leaves, r = hi + s->leaves;
  unsigned c = 0, t = 0;
  for (uint32_t a = l, b = r; a < b; a >>= 1, b >>= 1) {
    if (a & 1) canon[c++] = a++;
    if (b & 1) canon[c++] = --b;
  }
  /* A node on the path above leaf l straddles the range when it also holds
   * leaves left of l; one above leaf r - 1, when it holds leaves from r on. */
  for (unsigned h = 1; h <= s->depth; h++) {
    bool left = (l >> h) << h != l, right = (r >> h) << h != r;
    if (left) strad[t++] = l >> h;
    if (right && (!left || (r - 1) >> h != l >> h)) strad[t++] = (r - 1) >> h;
  }
  *nc = c, *ns = t;
}

/* Places the items ord[0..m) in that order at offsets cur[] (in bytes);
 * returns the arena in bytes, or UINT64_MAX when memory ran out. *work
 * grows by the set operations done, the measure of the pass's cost. */
static uint64_t place_pass(solver_t *s, const uint64_t *units, const uint32_t *lo,
                           const uint32_t *hi, const rec_t *ord, size_t m, uint64_t *cur,
                           uint64_t *work) {
  memset(s->node, 0, 2 * (size_t)s->leaves * sizeof *s->node);
  s->used = 0;
  uint64_t top = 0, ops = 0;
  for (size_t k = 0; k < m; k++) {
    uint32_t i = ord[k].i, canon[64], strad[64];
    unsigned nc, ns, np = 0;
    probe_t probe[192];
    nodes_of(s, lo[i], hi[i], canon, &nc, strad, &ns);
    for (unsigned j = 0; j < nc; j++) {
      const node_t *v = &s->node[canon[j]];
      if (v->cover_len) probe[np++] = (probe_t){s->pool + v->cover_off, v->cover_len, 0};
      if (v->under_len) probe[np++] = (probe_t){s->pool + v->under_off, v->under_len, 0};
    }
    for (unsigned j = 0; j < ns; j++) {
      const node_t *v = &s->node[strad[j]];
      if (v->cover_len) probe[np++] = (probe_t){s->pool + v->cover_off, v->cover_len, 0};
    }
    uint64_t at = first_fit(probe, np, units[i], &ops), end = at + units[i];
    cur[i] = at * UNIT;
    if (end > top) top = end;
    for (unsigned j = 0; j < nc; j++) {
      node_t *v = &s->node[canon[j]];
      if (!set_add(s, &v->cover_off, &v->cover_len, at, end)) return UINT64_MAX;
    }
    for (unsigned j = 0; j < ns; j++) {
      node_t *v = &s->node[strad[j]];
      if (!set_add(s, &v->under_off, &v->under_len, at, end)) return UINT64_MAX;
    }
    ops += nc + ns;
  }
  *work += ops;
  return top * UNIT;
}

/* ---- the orders ----------------------------------------------------------------- */

enum { ORDER_LIFETIME, ORDER_SIZE, ORDER_BREADTH, ORDER_AREA, ORDERS };

/* The smallest rank within [lo, hi) of a min segment tree over the leaves. */
static uint32_t range_min(const uint32_t *t, uint32_t leaves, uint32_t lo, uint32_t hi) {
  uint32_t best = UINT32_MAX;
  for (uint32_t a = lo + leaves, b = hi + leaves; a < b; a >>= 1, b >>= 1) {
    if (a & 1 && t[a] < best) best = t[a];
    a += a & 1;
    if (b & 1 && t[b - 1] < best) best = t[b - 1];
  }
  return best;
}

/* The sort keys of one order (ascending) over the m placed items idx[]:
 * size_rank ranks the distinct sizes upwards, leaf_min is the min tree of
 * the leaves' ranks by bytes live (the busiest leaf has rank 0). */
static void order_keys(int order, const uint32_t *idx, size_t m, const gma__plan_item_t *items,
                       const uint64_t *units, const uint32_t *size_rank, const uint32_t *lo,
                       const uint32_t *hi, const uint32_t *leaf_min, uint32_t leaves, rec_t *r) {
  for (size_t k = 0; k < m; k++) {
    uint32_t i = idx[k];
    uint64_t life = (uint64_t)items[i].end - items[i].start, key;
    switch (order) {
    case ORDER_LIFETIME: key = life << 32 | size_rank[i]; break;
    case ORDER_SIZE: key = (uint64_t)size_rank[i] << 32 | life; break;
    case ORDER_AREA: key = life && units[i] > UINT64_MAX / life ? UINT64_MAX : units[i] * life; break;
    default: /* greedy by breadth: the busiest instant first, then its items by size */
      key = ~((uint64_t)range_min(leaf_min, leaves, lo[i], hi[i]) << 32 | (UINT32_MAX - size_rank[i]));
    }
    r[k] = (rec_t){~key, i}; /* the largest key first */
  }
}

/* No further pass starts once the next would take the work (set operations
 * and first-fit steps) past this budget, about a second of one core: a pass
 * on 300k training-like items does about 22 million, so every order is tried
 * on plans of ordinary size and the first two on huge ones. */
#define WORK_BUDGET 50000000u
#define EXTRA_PASSES 16384
/* ... and their work together at most this (tens of milliseconds): many
 * passes for a plan of a few dozen buffers, a handful for thousands. */
#define EXTRA_WORK 2000000u

/* ---- the entry point -------------------------------------------------------------- */

/* One call of gma__plan_place: its input, its arrays (each n long unless
 * said) and the figures its phases hand on. */
typedef struct place {
  const gma__plan_item_t *items;
  size_t n;
  size_t m;                 /* items live at some instant: idx[0, m) */
  uint32_t nleaves;
  rec_t *rec, *tmp;         /* sort buffers */
  uint32_t *lo, *hi;        /* each item's range of leaves [lo, hi) */
  uint32_t *idx, *size_rank;
  uint32_t *leaf_of;        /* n + 1: each start's leaf */
  uint32_t *leaf_min;       /* 2 x leaves: the min tree of leaf ranks by bytes live */
  uint64_t *starts, *units, *cur;
  uint64_t *live;           /* leaves + 1: bytes live at each leaf */
  rec_t *bestord, *trial;   /* m: the best order so far, the one being tried */
  solver_t s;
  uint64_t lb, best, work;  /* the lower bound, the best arena so far, the work spent */
} place_t;

static bool place_alloc(place_t *P) {
  size_t n = P->n;
  P->rec = malloc(n * sizeof *P->rec), P->tmp = malloc(n * sizeof *P->tmp);
  P->lo = malloc(n * sizeof *P->lo), P->hi = malloc(n * sizeof *P->hi);
  P->idx = malloc(n * sizeof *P->idx), P->size_rank = malloc(n * sizeof *P->size_rank);
  P->leaf_of = malloc((n + 1) * sizeof *P->leaf_of);
  P->starts = malloc(n * sizeof *P->starts), P->units = malloc(n * sizeof *P->units);
  P->cur = malloc(n * sizeof *P->cur);
  P->bestord = malloc(n * sizeof *P->bestord), P->trial = malloc(n * sizeof *P->trial);
  return P->rec && P->tmp && P->lo && P->hi && P->idx && P->size_rank && P->leaf_of &&
         P->starts && P->units && P->cur && P->bestord && P->trial;
}

static void place_free(place_t *P) {
  free(P->rec), free(P->tmp), free(P->lo), free(P->hi), free(P->idx), free(P->size_rank);
  free(P->leaf_of), free(P->leaf_min), free(P->starts), free(P->units), free(P->cur);
  free(P->live), free(P->s.node), free(P->s.pool), free(P->bestord), free(P->trial);
}

/* Each item's range of leaves [lo, hi), its size in units, the live items
 * in idx[0, m), and the solver's tree shape. */
static void place_leaves(place_t *P, uint64_t *offsets) {
  const gma__plan_item_t *items = P->items;
  size_t n = P->n;
  /* The distinct starts, ascending; lo[i] indexes item i's. */
  for (size_t i = 0; i < n; i++) P->rec[i] = (rec_t){items[i].start, (uint32_t)i};
  const rec_t *sorted = radix_sort(P->rec, P->tmp, n);
  size_t t = 0;
  for (size_t k = 0; k < n; k++) {
    if (t == 0 || P->starts[t - 1] != sorted[k].k) P->starts[t++] = sorted[k].k;
    P->lo[sorted[k].i] = (uint32_t)(t - 1);
  }
  /* hi[i]: the first start at or after item i's end. An item that is never
   * live (start >= end, outside the contract) gets hi = lo, covers nothing
   * and stays at offset 0, where it overlaps nothing live. */
  memset(P->leaf_of, 0, (t + 1) * sizeof *P->leaf_of);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    size_t h = lower_bound_u64(P->starts, t, items[i].end);
    P->hi[i] = h > P->lo[i] ? (uint32_t)h : P->lo[i];
    P->units[i] = items[i].size / UNIT + (items[i].size % UNIT != 0);
    offsets[i] = P->cur[i] = 0;
    if (P->hi[i] > P->lo[i]) P->idx[m++] = (uint32_t)i, P->leaf_of[P->hi[i]] = 1;
  }
  /* Leaves: consecutive starts with no end between them are one instant as
   * far as conflicts go (whatever is live at the first is live at the
   * next), so a leaf is a run of starts that an end cuts. */
  uint32_t nleaves = 0;
  for (size_t j = 0; j < t; j++) {
    if (j == 0 || P->leaf_of[j]) nleaves++;
    P->leaf_of[j] = nleaves - 1;
  }
  P->leaf_of[t] = nleaves;
  for (size_t k = 0; k < m; k++) {
    uint32_t i = P->idx[k];
    P->lo[i] = P->leaf_of[P->lo[i]], P->hi[i] = P->leaf_of[P->hi[i]];
  }
  P->m = m, P->nleaves = nleaves;
  P->s.leaves = 1, P->s.depth = 0;
  while (P->s.leaves < nleaves) P->s.leaves *= 2, P->s.depth++;
}

/* Bytes live at each leaf (at its last start, where they peak), from the
 * differences at each item's ends; the lower bound is their maximum. Then
 * the ranks: of each item's size among the distinct sizes, upwards; of each
 * leaf by bytes live, downwards (ties: the earlier leaf first), kept in a
 * min tree for greedy by breadth. False without memory. */
static bool place_ranks(place_t *P) {
  const gma__plan_item_t *items = P->items;
  uint32_t leaves = P->s.leaves;
  P->live = calloc(leaves + 1, sizeof *P->live);
  P->leaf_min = malloc(2 * (size_t)leaves * sizeof *P->leaf_min);
  P->s.node = malloc(2 * (size_t)leaves * sizeof *P->s.node);
  if (!P->live || !P->leaf_min || !P->s.node) return false;
  for (size_t k = 0; k < P->m; k++) {
    uint32_t i = P->idx[k];
    P->live[P->lo[i]] += items[i].size;
    P->live[P->hi[i]] -= items[i].size; /* wraps; the running sum unwraps it */
  }
  uint64_t run = 0;
  P->lb = 0;
  for (size_t j = 0; j < P->nleaves; j++) {
    run += P->live[j];
    P->live[j] = run;
    if (run > P->lb) P->lb = run;
  }
  for (size_t i = 0; i < P->n; i++) P->rec[i] = (rec_t){items[i].size, (uint32_t)i};
  const rec_t *sorted = radix_sort(P->rec, P->tmp, P->n);
  for (size_t k = 0, r = 0; k < P->n; k++) {
    if (k && sorted[k].k != sorted[k - 1].k) r++;
    P->size_rank[sorted[k].i] = (uint32_t)r;
  }
  for (uint32_t j = 0; j < P->nleaves; j++) P->rec[j] = (rec_t){~P->live[j], j};
  sorted = radix_sort(P->rec, P->tmp, P->nleaves);
  for (uint32_t v = 0; v < leaves; v++) P->leaf_min[leaves + v] = UINT32_MAX;
  for (uint32_t k = 0; k < P->nleaves; k++) P->leaf_min[leaves + sorted[k].i] = k;
  for (uint32_t v = leaves - 1; v >= 1; v--) {
    uint32_t a = P->leaf_min[2 * v], b = P->leaf_min[2 * v + 1];
    P->leaf_min[v] = a < b ? a : b;
  }
  return true;
}

/* The passes: each order once, the best kept in offsets, until one reaches
 * the lower bound or the work budget is spent (then the orders left would
 * cost more than the plan is worth). False without memory. */
static bool place_orders(place_t *P, uint64_t *offsets) {
  P->best = UINT64_MAX, P->work = 0;
  for (int order = 0; order < ORDERS && P->best > P->lb; order++) {
    if (order > 0 && P->work / (uint64_t)order + P->work > WORK_BUDGET) break;
    order_keys(order, P->idx, P->m, P->items, P->units, P->size_rank, P->lo, P->hi, P->leaf_min,
               P->s.leaves, P->rec);
    const rec_t *sorted = radix_sort(P->rec, P->tmp, P->m);
    uint64_t got = place_pass(&P->s, P->units, P->lo, P->hi, sorted, P->m, P->cur, &P->work);
    if (got == UINT64_MAX) return false;
    if (got < P->best) {
      P->best = got;
      memcpy(offsets, P->cur, P->n * sizeof *offsets);
      memcpy(P->bestord, sorted, P->m * sizeof *P->bestord);
    }
  }
  return true;
}

/* Still more than 0.5% above the bound with work to spare (small plans:
 * a training step of a few dozen buffers): an iterated local search,
 * seeded: every other pass tries the best order so far with one to three
 * pairs swapped (kept if no worse), the others a whole random order.
 * False without memory. */
static bool place_search(place_t *P, uint64_t *offsets) {
  size_t m = P->m;
  uint64_t pass_work = P->work / ORDERS + 1, rng = 0x9e3779b97f4a7c15ull;
  uint64_t extra_end = P->work + EXTRA_WORK;
  for (int pass = 0; pass < EXTRA_PASSES && m > 1 && P->best > P->lb + P->lb / 200 &&
                     P->work + pass_work <= extra_end;
       pass++) { /* (within 0.5% of the bound, more passes are not worth their time) */
    memcpy(P->trial, P->bestord, m * sizeof *P->trial);
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    unsigned swaps = pass % 2 ? 1 + (unsigned)(rng % 3) : (unsigned)m;
    for (unsigned k = 0; k < swaps; k++) {
      rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
      size_t a = pass % 2 ? (size_t)(rng % m) : k, b = pass % 2 ? (size_t)((rng >> 32) % m)
                                                                : k + (size_t)((rng >> 16) % (m - k));
      rec_t x = P->trial[a];
      P->trial[a] = P->trial[b], P->trial[b] = x;
    }
    uint64_t before = P->work;
    uint64_t got = place_pass(&P->s, P->units, P->lo, P->hi, P->trial, m, P->cur, &P->work);
    if (got == UINT64_MAX) return false;
    pass_work = P->work - before + 1;
    if (got <= P->best) {
      if (got < P->best) memcpy(offsets, P->cur, P->n * sizeof *offsets);
      P->best = got;
      memcpy(P->bestord, P->trial, m * sizeof *P->bestord);
    }
  }
  return true;
}

bool gma__plan_place(const gma__plan_item_t *items, size_t n, uint64_t *offsets,
                     uint64_t *arena, uint64_t *lower_bound) {
  *arena = 0, *lower_bound = 0;
  if (n == 0) return true;
  if (n >= UINT32_MAX) return false; /* indices are 32 bits; no plan is that large */
  place_t P = {.items = items, .n = n};
  bool ok = place_alloc(&P);
  if (ok) place_leaves(&P, offsets);
  ok = ok && place_ranks(&P) && place_orders(&P, offsets) && place_search(&P, offsets);
  if (ok) *arena = P.best == UINT64_MAX ? 0 : P.best, *lower_bound = P.lb;
  place_free(&P);
  return ok;
}

/* ---- validity ------------------------------------------------------------------ */

/* A segment tree over elementary address slots with range add and range
 * max (no push-down: mx[v] is the max below v plus add[v]). */
typedef struct slots {
  int32_t *mx, *add;
} slots_t;

static void slots_add(slots_t *t, size_t v, size_t nl, size_t nr, size_t l, size_t r, int32_t d) {
  if (r <= nl || nr <= l) return;
  if (l <= nl && nr <= r) {
    t->mx[v] += d, t->add[v] += d;
    return;
  }
  size_t mid = nl + (nr - nl) / 2;
  slots_add(t, 2 * v, nl, mid, l, r, d);
  slots_add(t, 2 * v + 1, mid, nr, l, r, d);
  int32_t a = t->mx[2 * v], b = t->mx[2 * v + 1];
  t->mx[v] = (a > b ? a : b) + t->add[v];
}

static int32_t slots_max(const slots_t *t, size_t v, size_t nl, size_t nr, size_t l, size_t r) {
  if (r <= nl || nr <= l) return 0;
  if (l <= nl && nr <= r) return t->mx[v];
  size_t mid = nl + (nr - nl) / 2;
  int32_t a = slots_max(t, 2 * v, nl, mid, l, r), b = slots_max(t, 2 * v + 1, mid, nr, l, r);
  return (a > b ? a : b) + t->add[v];
}

/* Sweeps time: at each instant the items that end leave before those that
 * start arrive, and an arriving item must find its slots empty. O(n log n).
 * Returns false as well when memory for the check is lacking. */
bool gma__plan_place_is_valid(const gma__plan_item_t *items, size_t n, const uint64_t *offsets,
                              uint64_t arena) {
  for (size_t i = 0; i < n; i++) {
    const gma__plan_item_t *x = &items[i];
    if (!x->size || x->size % UNIT || offsets[i] % UNIT || x->start >= x->end ||
        offsets[i] > arena || x->size > arena - offsets[i])
      return false;
  }
  if (n < 2) return true;
  if (n > UINT32_MAX / 2) return false;
  bool ok = false;
  rec_t *a = malloc(2 * n * sizeof *a), *b = malloc(2 * n * sizeof *b);
  uint64_t *coord = malloc(2 * n * sizeof *coord);
  uint32_t *slot = malloc(2 * n * sizeof *slot);
  slots_t t = {NULL, NULL};
  if (!a || !b || !coord || !slot) goto out;

  /* The elementary slots: between consecutive distinct range ends. */
  for (size_t i = 0; i < n; i++) {
    a[2 * i] = (rec_t){offsets[i], (uint32_t)(2 * i)};
    a[2 * i + 1] = (rec_t){offsets[i] + items[i].size, (uint32_t)(2 * i + 1)};
  }
  const rec_t *sorted = radix_sort(a, b, 2 * n);
  size_t m = 0;
  for (size_t k = 0; k < 2 * n; k++) {
    if (m == 0 || coord[m - 1] != sorted[k].k) coord[m++] = sorted[k].k;
    slot[sorted[k].i] = (uint32_t)(m - 1);
  }
  size_t cells = 1;
  while (cells < m) cells *= 2;
  t.mx = calloc(2 * cells, sizeof *t.mx);
  t.add = calloc(2 * cells, sizeof *t.add);
  if (!t.mx || !t.add) goto out;

  /* Starts ascending from the lower halves of a and b, ends from the upper
   * halves (the slots are in slot[] now, so both arrays are free again). */
  for (size_t i = 0; i < n; i++) {
    a[i] = (rec_t){items[i].start, (uint32_t)i};
    a[n + i] = (rec_t){items[i].end, (uint32_t)i};
  }
  const rec_t *starts = radix_sort(a, b, n), *ends = radix_sort(a + n, b + n, n);

  size_t j = 0, k = 0;
  while (j < n) {
    uint32_t s = starts[j].i;
    if (k < n && items[ends[k].i].end <= items[s].start) {
      uint32_t e = ends[k++].i;
      slots_add(&t, 1, 0, cells, slot[2 * e], slot[2 * e + 1], -1);
      continue;
    }
    if (slots_max(&t, 1, 0, cells, slot[2 * s], slot[2 * s + 1]) > 0) goto out;
    slots_add(&t, 1, 0, cells, slot[2 * s], slot[2 * s + 1], 1);
    j++;
  }
  ok = true;
out:
  free(a), free(b), free(coord), free(slot), free(t.mx), free(t.add);
  return ok;
}
