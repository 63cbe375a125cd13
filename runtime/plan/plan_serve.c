/* Serving planned memory (plan.h): the lock-free serving of planned
 * addresses with their reuse gates, their frees and record_stream, pointer
 * info, tags and the walks of live planned blocks.
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
#include <inttypes.h>

#include "plan/plan_internal.h"
#include "base/lock.h"
#include "cache/cache.h"
#include "base/sizeclass.h"

/* ---- Serving ---------------------------------------------------------------------------- */

static void unclaim(gma__memplan_t *P, uint32_t c0, uint32_t c1) {
  for (uint32_t c = c0; c < c1; c++) gma__store_release(&P->cells[c].owner, 0);
}

/* A step of this file's that runs under the pool lock (gma__pool_with_lock):
 * its inputs and its result. */
typedef struct locked_step {
  gma__planner_t *pl;
  gma__memplan_t *P;
  slot_t *sl;
  gma__stream_t *s;
  uint32_t nusers;
  gma_stream_t stream;
  uint64_t id;
  bool ok;
  gma_status_t st;
} locked_step_t;

/* users_settled's locked part. */
static void users_settled_locked(void *arg) {
  locked_step_t *a = arg;
  gma__planner_t *pl = a->pl;
  gma__memplan_t *P = a->P;
  const slot_t *sl = a->sl;
  gma__stream_t *s = a->s;
  gma__pool_t *p = pl->p;
  bool ok = true;
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
  a->ok = ok;
}

/* Pool lock taken here: whether every earlier user of slot j's cells is
 * ordered before stream s's next work (see the top). */
static bool users_settled(gma__planner_t *pl, gma__memplan_t *P, slot_t *sl, gma__stream_t *s) {
  locked_step_t a = {.pl = pl, .P = P, .sl = sl, .s = s};
  gma__pool_with_lock(pl->p, users_settled_locked, &a);
  return a.ok;
}

/* Hands out slot j on s, or MISS. */
static gma_status_t claim(gma__planner_t *pl, gma__memplan_t *P, uint32_t j, gma__stream_t *s,
                          size_t size, void **out) {
  slot_t *sl = &P->slots[j];
  uint32_t c = sl->c0;
  for (; c < sl->c1; c++) {
    uint32_t none = 0;
    if (!gma__cas_seq_cst(&P->cells[c].owner, &none, j + 1)) break;
  }
  if (c < sl->c1 || gma__load_seq_cst(&P->dropped)) { /* overlap with a live block, or dropped */
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
    if (!gma__cas_weak_relaxed(&ps->cursor, &c, k + 1))
      continue; /* another thread of this stream took an entry: look again */
    uint32_t j = ps->slot[k];
    if (j == NO_SLOT) return MISS; /* the plan leaves this one to the ordinary path */
    gma__pool_t *p = pl->p;
    gma__stream_t *s = gma__stream_cached(p, stream);
    uint64_t id;
    if (!s && p->dev->ops->stream_id(p->dev, stream, &id) == GMA_OK)
      s = gma__stream_live(p, stream, id);
    if (s && claim(pl, P, j, s, size, out) == GMA_OK) {
      gma__faa_relaxed(&ps->hits, 1);
      return GMA_OK;
    }
    break;
  }
  gma__faa_relaxed(&ps->misses, 1);
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

/* gma__plan_free's stamp of slot sl, read under the pool lock when other
 * streams are involved (see there). */
static void stamp_locked(void *arg) {
  locked_step_t *a = arg;
  gma__pool_t *p = a->pl->p;
  slot_t *sl = a->sl;
  stamp_t *t = &sl->stamp;
  gma__stream_t *s = sl->stream;
  uint32_t nusers = a->nusers;
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
  if (!gma__cas_seq_cst(&sl->live, &one, 0)) return double_free(ptr);
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
    locked_step_t ls = {.pl = pl, .sl = sl, .nusers = nusers};
    gma__pool_with_lock(pl->p, stamp_locked, &ls);
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

/* gma__plan_record_stream's locked part: adds the stream to the slot's
 * users. */
static void record_locked(void *arg) {
  locked_step_t *a = arg;
  gma__pool_t *p = a->pl->p;
  slot_t *sl = a->sl;
  gma_status_t st = GMA_OK;
  gma__stream_t *u = gma__stream_resolve(p, a->stream, a->id);
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
  a->st = st;
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
  locked_step_t ls = {.pl = pl, .sl = sl, .stream = stream, .id = id, .st = GMA_OK};
  gma__pool_with_lock(p, record_locked, &ls);
  return ls.st;
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

/* The plan whose arena starts at addr, or NULL. The worker may unpublish
 * it at any moment (a drop, a release), so a caller looks it up once. */
static gma__memplan_t *plan_at(gma__planner_t *pl, uintptr_t addr) {
  gma__memplan_t *P = plan_of(pl, addr);
  return P && P->base == addr ? P : NULL;
}

/* Calls fn for each live block of plan P, in address order. */
static void each_live_in(gma__planner_t *pl, gma__memplan_t *P,
                         bool (*fn)(void *arg, const gma_allocation_info_t *info, uint64_t born),
                         void *arg) {
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
}

bool gma__plan_each_live(gma__planner_t *pl, uintptr_t addr,
                         bool (*fn)(void *arg, const gma_allocation_info_t *info, uint64_t born),
                         void *arg) {
  gma__memplan_t *P = plan_at(pl, addr);
  if (P) each_live_in(pl, P, fn, arg);
  return P != NULL;
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

bool gma__plan_snapshot(gma__planner_t *pl, uintptr_t addr, FILE *f, bool first, uint64_t *live,
                        uint64_t *requested) {
  snap_walk_t w = {.f = f, .at = addr, .first = first};
  gma__memplan_t *P = plan_at(pl, addr);
  if (!P) return false;
  each_live_in(pl, P, snap_block, &w);
  snap_run(&w, addr + P->arena);
  *live = w.live, *requested = w.requested;
  return true;
}


