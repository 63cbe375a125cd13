/* Owns planned memory (plan.h): the planner's life, its marks (checking
 * that iterations repeat, activating, dropping and releasing plans and
 * their arenas) and its figures. Its other files: plan_learn.c (recording
 * iterations), plan_build.c (making a plan, the placement job), plan_serve.c
 * (serving planned addresses; the safety argument is at its top),
 * plan_place.c (the placement), plan_internal.h (the structures). */
#include <inttypes.h>

#include "plan/plan_internal.h"
#include "base/lock.h"
#include "cache/cache.h"
#include "base/sizeclass.h"
#include "worker/worker.h"

/* ---- Activating, dropping, releasing -------------------------------------------------- */

static void fold_counts(gma__planner_t *pl, gma__memplan_t *P) {
  for (uint32_t i = 0; i < P->nstreams; i++) {
    pl->hits += gma__exchange_relaxed(&P->streams[i].hits, 0);
    pl->misses += gma__exchange_relaxed(&P->streams[i].misses, 0);
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
    if (gma__load_seq_cst(&P->cells[c].owner)) return false;
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
  gma__store_seq_cst(&P->dropped, true);
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
    gma__store_seq_cst(&P->dropped, true);
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

/* mu held: the iteration just recorded becomes the one to compare the next
 * with, and recording starts again. */
static void learn_next(gma__planner_t *pl) {
  gma__plan_iter_t t = pl->prev;
  pl->prev = pl->learn;
  pl->learn = t;
  gma__plan_learn_reset(pl);
}

/* The mark of a VERIFYING planner (mu held): a plan once the last iterations
 * repeated often enough, handed to the worker to place; else compare the
 * next iteration, or back off after 3 failures. */
static void mark_verifying(gma__planner_t *pl) {
  gma__memplan_t *P = gma__memplan_from(&pl->prev, &pl->learn);
  if (P && ++pl->matches < MATCHES) { /* repeated, but not yet often enough */
    gma__memplan_free(P);
    P = NULL;
  } else if (!P) {
    pl->matches = 0;
    if (++pl->failures >= 3) {
      gma__plan_back_off(pl);
      return;
    }
  }
  if (!P) { /* compare the next iteration with this one */
    learn_next(pl);
    return;
  }
  pl->matches = 0;
  gma__plan_learn_free(pl);
  pl->failures = 0;
  P->next = pl->all;
  pl->all = P;
  pl->placing = P;
  gma__store_relaxed(&pl->state, GMA__PLAN_PLACING);
  if (!pl->w || !gma__worker_run_job(pl->w, gma__memplan_place_job, P)) gma__memplan_place_job(P);
}

/* The mark of a PLACING planner (mu held): activates the plan once placed
 * and no other arena is still retiring. */
static void mark_placing(gma__planner_t *pl) {
  gma__memplan_t *P = pl->placing;
  if (!gma__load_acquire(&P->placed)) return; /* pairs with gma__memplan_place_job's release */
  if (gma__load_relaxed(&pl->retiring)) return; /* one arena at a time */
  pl->placing = NULL;
  if (P->ok && activate(pl, P)) {
    gma__store_relaxed(&pl->state, GMA__PLAN_ACTIVE);
  } else {
    gma__plan_back_off(pl);
  }
}

/* The mark of an ACTIVE planner (mu held): drops a plan the iteration
 * missed, else folds its counts and rewinds its streams. */
static void mark_active(gma__planner_t *pl) {
  gma__memplan_t *P = gma__load_relaxed(&pl->active);
  if (iteration_missed(P)) {
    drop(pl, P);
    if (P->served < SERVED_OK) { /* a plan that did not last: as a failed attempt */
      gma__plan_back_off(pl);
    } else {
      gma__plan_learn_reset(pl); /* learn this workload again from now */
      gma__store_relaxed(&pl->state, GMA__PLAN_LEARNING);
    }
    return;
  }
  if (++P->served == SERVED_OK) pl->backoff = 1; /* plans pay off here again */
  fold_counts(pl, P);
  for (uint32_t i = 0; i < P->nstreams; i++) gma__store_relaxed(&P->streams[i].cursor, 0);
}

gma_status_t gma__plan_mark(gma__planner_t *pl) {
  if (!pl->on) return GMA_OK;
  gma__lock(&pl->mu, GMA__RANK_PLAN);
  pl->iterations++;
  gma__memplan_t *R = gma__load_relaxed(&pl->retiring);
  if (R && try_release(pl, R)) gma__store_release(&pl->retiring, NULL);
  switch (gma__load_relaxed(&pl->state)) {
    case GMA__PLAN_OFF:
      if (pl->skip) {
        pl->skip--;
        break;
      }
      gma__plan_learn_reset(pl);
      gma__store_relaxed(&pl->state, GMA__PLAN_LEARNING);
      break;
    case GMA__PLAN_LEARNING: /* one iteration learned: learn the next to compare */
      learn_next(pl);
      gma__store_relaxed(&pl->state, GMA__PLAN_VERIFYING);
      break;
    case GMA__PLAN_VERIFYING: mark_verifying(pl); break;
    case GMA__PLAN_PLACING: mark_placing(pl); break;
    case GMA__PLAN_ACTIVE: mark_active(pl); break;
  }
  gma__unlock(&pl->mu);
  return GMA_OK;
}

/* mu held: no planned block of P is live, and none was handed out in the
 * last unused_ns (0: whenever), by the pool's clock. */
static bool plan_idle(gma__planner_t *pl, const gma__memplan_t *P, uint64_t unused_ns) {
  for (uint32_t c = 0; c < P->ncells; c++)
    if (gma__load_seq_cst(&P->cells[c].owner)) return false;
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
    gma__plan_learn_reset(pl);
    gma__store_relaxed(&pl->state, GMA__PLAN_LEARNING);
    gave = !gma__load_relaxed(&pl->retiring); /* else a claim won the race: kept for later */
  }
  return gave;
}

bool gma__plan_reclaim(gma__planner_t *pl, uint64_t unused_ns) {
  if (!pl->on || !gma__plan_holds_arena(pl)) return false;
  gma__lock(&pl->mu, GMA__RANK_PLAN);
  bool gave = reclaim_locked(pl, unused_ns);
  gma__unlock(&pl->mu);
  return gave;
}

bool gma__plan_reclaim_timed(gma__planner_t *pl, uint64_t unused_ns) {
  if (!pl->on || !gma__plan_holds_arena(pl) || !gma__trylock(&pl->mu, GMA__RANK_PLAN))
    return false;
  bool gave = reclaim_locked(pl, unused_ns);
  gma__unlock(&pl->mu);
  return gave;
}

bool gma__plan_holds_arena(gma__planner_t *pl) {
  return gma__load_acquire(&pl->active) || gma__load_acquire(&pl->retiring);
}

void gma__plan_empty(gma__planner_t *pl) { gma__plan_reclaim(pl, 0); }


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
  gma__lock(&pl->mu, GMA__RANK_PLAN);
  gma__memplan_t *A = gma__load_relaxed(&pl->active);
  if (A) {
    gma__store_seq_cst(&A->dropped, true);
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
  gma__unlock(&pl->mu);
  return n;
}

void gma__plan_fini(gma__planner_t *pl) {
  for (gma__memplan_t *P = pl->all, *next; P; P = next) {
    next = P->next;
    gma__memplan_free(P);
  }
  pl->all = NULL;
  gma__plan_learn_free(pl);
  pthread_mutex_destroy(&pl->mu);
}

void gma__plan_stats(gma__planner_t *pl, gma_stats_t *st) {
  if (!pl->on) {
    gma__pool_stats(pl->p, st);
    return;
  }
  gma__lock(&pl->mu, GMA__RANK_PLAN); /* before the pool's lock, as marks and reclaims take them */
  gma__pool_stats(pl->p, st);
  st->plan_state = gma__load_relaxed(&pl->state);
  st->plan_hits = pl->hits;
  st->plan_misses = pl->misses;
  /* Every plan's unfolded counts, not only the active one's: a serve that
   * claimed its block just before a drop counts its hit after the drop's
   * fold, and that plan's next fold may be much later (try_release). */
  for (gma__memplan_t *Q = pl->all; Q; Q = Q->next)
    for (uint32_t i = 0; i < Q->nstreams; i++) {
      st->plan_hits += gma__load_relaxed(&Q->streams[i].hits);
      st->plan_misses += gma__load_relaxed(&Q->streams[i].misses);
    }
  gma__memplan_t *P = gma__load_relaxed(&pl->active);
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
  gma__unlock(&pl->mu);
}
