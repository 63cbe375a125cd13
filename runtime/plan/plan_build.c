/* Making a plan (plan.h): from two recorded iterations, the plan's streams,
 * slots and placement items (gma__memplan_from); the worker's placement job,
 * which places the items (plan_place.c) and cuts the arena into cells
 * (gma__memplan_place_job); freeing a plan. */
#include <inttypes.h>

#include "plan/plan_internal.h"

/* ---- Plans ------------------------------------------------------------------------ */

void gma__memplan_free(gma__memplan_t *P) {
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
void gma__memplan_place_job(void *arg) {
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

/* The index of key in keys (it is there). */
static uint32_t key_index(const uintptr_t *keys, uintptr_t key) {
  uint32_t s = 0;
  while (keys[s] != key) s++;
  return s;
}

/* True when ka and kb hold the same keys (in any order). */
static bool same_keys(const uintptr_t *ka, uint32_t na, const uintptr_t *kb, uint32_t nb) {
  bool same = ka && kb && na == nb;
  for (uint32_t i = 0; same && i < na; i++) {
    uint32_t j = 0;
    while (j < nb && kb[j] != ka[i]) j++;
    same = j < nb;
  }
  return same;
}

/* Makes P's streams, one per key of kb, from iteration b: each stream's
 * request sizes by seq, and in pos[s] each request's index in b. False
 * without host memory. */
static bool streams_from(gma__memplan_t *P, const gma__plan_iter_t *b, const uintptr_t *kb,
                         uint32_t nb, uint32_t **pos) {
  if (!(P->streams = calloc(nb, sizeof *P->streams))) return false;
  P->nstreams = nb;
  for (size_t i = 0; i < b->n; i++) P->streams[key_index(kb, b->v[i].key)].n++;
  for (uint32_t s = 0; s < nb; s++) {
    pstream_t *ps = &P->streams[s];
    ps->key = kb[s];
    ps->size = malloc((ps->n ? ps->n : 1) * sizeof *ps->size);
    ps->slot = malloc((ps->n ? ps->n : 1) * sizeof *ps->slot);
    pos[s] = malloc((ps->n ? ps->n : 1) * sizeof *pos[s]);
    if (!ps->size || !ps->slot || !pos[s]) return false;
  }
  for (size_t i = 0; i < b->n; i++) {
    uint32_t s = key_index(kb, b->v[i].key);
    pos[s][b->v[i].seq] = (uint32_t)i;
    P->streams[s].size[b->v[i].seq] = b->v[i].size;
  }
  return true;
}

/* Checks that a's requests, stream by stream, match b's, and numbers the
 * planned ones (freed before the mark in both) as slots. The number of
 * planned requests; 0 when they differ or none is planned. */
static uint32_t number_slots(gma__memplan_t *P, const gma__plan_iter_t *a,
                             const gma__plan_iter_t *b, const uintptr_t *kb, uint32_t **pos) {
  uint32_t planned = 0;
  for (size_t i = 0; i < a->n; i++) {
    const gma__plan_rec_t *r = &a->v[i];
    uint32_t s = key_index(kb, r->key);
    pstream_t *ps = &P->streams[s];
    if (r->seq >= ps->n || ps->size[r->seq] != r->size) return 0;
    const gma__plan_rec_t *q = &b->v[pos[s][r->seq]];
    bool plan_it = r->end != UINT32_MAX && q->end != UINT32_MAX;
    ps->slot[r->seq] = plan_it ? planned++ : NO_SLOT;
  }
  return planned;
}

/* Fills the placement items of P's slots (lifetimes covering both
 * iterations) and their groups. Threads interleave differently every
 * iteration: blocks of different threads get apart places (groups), only
 * one thread's blocks share. False without host memory. */
static bool items_from(gma__memplan_t *P, const gma__plan_iter_t *a, const gma__plan_iter_t *b,
                       const uintptr_t *kb, uint32_t **pos) {
  uint64_t *tids = NULL; /* the threads seen, by group number */
  uint32_t ntids_cap = 0;
  for (size_t i = 0; i < a->n; i++) {
    const gma__plan_rec_t *r = &a->v[i];
    uint32_t s = key_index(kb, r->key);
    uint32_t j = P->streams[s].slot[r->seq];
    if (j == NO_SLOT) continue;
    const gma__plan_rec_t *q = &b->v[pos[s][r->seq]];
    P->items[j] = (gma__plan_item_t){r->size, r->start < q->start ? r->start : q->start,
                                     r->end > q->end ? r->end : q->end};
    P->slots[j].ps = s;
    uint32_t g = 0;
    while (g < P->ngroups && tids[g] != q->tid) g++;
    if (g == P->ngroups) {
      if (g == ntids_cap) {
        uint64_t *t = realloc(tids, (ntids_cap = ntids_cap ? 2 * ntids_cap : 4) * sizeof *t);
        if (!t) {
          free(tids);
          return false;
        }
        tids = t;
      }
      tids[P->ngroups++] = q->tid;
    }
    P->group[j] = g;
  }
  free(tids);
  return true;
}

/* A plan when iterations a and b asked for the same sizes in the same order
 * on every stream; NULL otherwise (or without host memory). An allocation
 * is planned when both iterations freed it before their marks; its lifetime
 * covers both. */
gma__memplan_t *gma__memplan_from(const gma__plan_iter_t *a, const gma__plan_iter_t *b) {
  if (a->n != b->n || a->n == 0) return NULL;
  uint32_t na = 0, nb = 0;
  uintptr_t *ka = stream_keys(a, &na), *kb = stream_keys(b, &nb);
  gma__memplan_t *P = NULL;
  uint32_t **pos = NULL; /* per stream of b: its requests' indices in b, by seq */
  if (!same_keys(ka, na, kb, nb)) goto out;
  P = calloc(1, sizeof *P);
  pos = calloc(nb, sizeof *pos);
  if (!P || !pos || !streams_from(P, b, kb, nb, pos)) goto fail;
  uint32_t planned = number_slots(P, a, b, kb, pos);
  if (!planned) goto fail; /* they differ, or nothing the iteration frees itself */
  P->nslots = planned;
  P->slots = calloc(planned, sizeof *P->slots);
  P->items = malloc(planned * sizeof *P->items);
  P->offsets = malloc(planned * sizeof *P->offsets);
  P->group = malloc(planned * sizeof *P->group);
  if (!P->slots || !P->items || !P->offsets || !P->group) goto fail;
  if (items_from(P, a, b, kb, pos)) goto out;
fail:
  gma__memplan_free(P);
  P = NULL;
out:
  for (uint32_t s = 0; pos && s < nb; s++) free(pos[s]);
  free(pos);
  free(ka);
  free(kb);
  return P;
}

