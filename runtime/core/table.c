/* Owns the stream table (inserts and removals under the pool lock; the
 * lock-free lookup is in core/table.h), stream records' creation, thread
 * ids, the per-(stream, thread) counters' lists, and the process-wide list of
 * pools that an exiting thread walks to retire its per-thread default
 * streams. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "base/lock.h"
#include "core/table.h"

static _Atomic uint64_t next_thread_id = 1;
GMA__TLS uint64_t gma__tl_thread_id;
GMA__TLS bool gma__tl_background;

uint64_t gma__thread_id_new(void) {
  gma__tl_thread_id = gma__faa_relaxed(&next_thread_id, 1);
  return gma__tl_thread_id;
}

/* Lock held. Inserts into t, which has room. The record is stored before the
 * key, both with release, so a reader that sees the key sees the record. */
static void stable_insert(gma__stable_t *t, uintptr_t key, gma__stream_t *s) {
  size_t mask = t->capacity - 1, i = gma__key_hash(key, t->capacity);
  for (;;) {
    uintptr_t k = gma__load_relaxed(&t->slots[i].key);
    if (k == GMA__KEY_EMPTY || k == GMA__KEY_TOMB) {
      if (k == GMA__KEY_EMPTY) t->used++;
      gma__store_release(&t->slots[i].rec, s);
      gma__store_release(&t->slots[i].key, key);
      return;
    }
    i = (i + 1) & mask;
  }
}

/* Lock held. Makes room for one more key: a new table twice as large when
 * live keys fill half, else a rebuild that drops tombstones. The old table is
 * kept (linked by older) because readers may still be probing it. */
static bool stable_reserve(gma__pool_t *p) {
  gma__stable_t *t = gma__load_relaxed(&p->stable);
  if (t && (t->used + 1) * 4 < t->capacity * 3) return true;
  size_t live = 0;
  for (size_t i = 0; t && i < t->capacity; i++) {
    uintptr_t k = gma__load_relaxed(&t->slots[i].key);
    live += k != GMA__KEY_EMPTY && k != GMA__KEY_TOMB;
  }
  size_t cap = 16;
  while (cap < (live + 1) * 4) cap *= 2;
  gma__stable_t *n = calloc(1, sizeof *n + cap * sizeof n->slots[0]);
  if (!n) return false;
  n->capacity = cap;
  n->older = t;
  for (size_t i = 0; t && i < t->capacity; i++) {
    uintptr_t k = gma__load_relaxed(&t->slots[i].key);
    if (k != GMA__KEY_EMPTY && k != GMA__KEY_TOMB)
      stable_insert(n, k, gma__load_relaxed(&t->slots[i].rec));
  }
  gma__store_release(&p->stable, n); /* pairs with stable_lookup's acquire */
  return true;
}

/* Lock held: the key of s stops resolving (readers who already found s see
 * s->retired). */
void gma__stable_remove(gma__pool_t *p, gma__stream_t *s) {
  gma__stable_t *t = gma__load_relaxed(&p->stable);
  size_t mask = t->capacity - 1;
  for (size_t i = gma__key_hash(s->key, t->capacity);; i = (i + 1) & mask) {
    uintptr_t k = gma__load_relaxed(&t->slots[i].key);
    if (k == GMA__KEY_EMPTY) return;
    if (k == s->key && gma__load_relaxed(&t->slots[i].rec) == s) {
      gma__store_release(&t->slots[i].key, GMA__KEY_TOMB);
      return;
    }
  }
}

/* ---- Per-thread default streams of exiting threads ------------------------------
 * Only its own thread can name a per-thread default stream
 * (GMA_STREAM_PER_THREAD means "mine"), so only that thread can close the
 * stream's epochs. Once it exits, what it freed in the open epoch would stay
 * cached until gma_destroy, beyond the reach of any poll or gma_empty_cache
 * (8 exited threads left 350-436 MB reserved). So a thread that
 * gets a per-thread stream record arms a thread-exit hook, and the hook
 * retires that thread's per-thread stream in every pool, from the exiting
 * thread itself, which can still name it: the closing event then covers all
 * its work, and polls release the memory as the event completes.
 *
 * pools_mu guards the list (pool->next_pool, pool->listed); it comes before
 * every pool's lock (core/types.h). gma__pools_remove runs first in
 * gma__pool_fini, so a hook never touches a pool being torn down. Across
 * fork() the child starts with an empty list: the parent's pools are not
 * usable there, and their locks may be held by threads that do not exist. */
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static gma__pool_t *pools;
static pthread_key_t exit_key;
static bool exit_key_ok; /* pthread_key_create worked; never arm a key we do not own */
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static GMA__TLS bool exit_armed;

static void pools_prefork(void) { gma__lock(&pools_mu, GMA__RANK_POOLS); }
static void pools_postfork_parent(void) { gma__unlock(&pools_mu); }
static void pools_postfork_child(void) {
  gma__lock_forget(&pools_mu);
  pthread_mutex_init(&pools_mu, NULL);
  pools = NULL;
}

/* The hook: runs as the thread exits (a pthread key destructor). */
static void thread_exit_hook(void *unused) {
  (void)unused;
  /* Disarmed first: a per-thread record made by a later destructor of this
   * thread arms the hook again, and glibc then runs it again. */
  exit_armed = false;
  if (gma__tl_thread_id == 0) return;
  uintptr_t key = (uintptr_t)(gma__tl_thread_id << 4) | 2;
  gma__lock(&pools_mu, GMA__RANK_POOLS);
  for (gma__pool_t *p = pools; p; p = p->next_pool) {
    if (!gma__stable_lookup(p, key)) continue;
    /* The device's id of this thread's stream now: if it is not the
     * record's, the stream the record names is gone, and nothing can be
     * recorded on it (the record is orphaned, as for a recycled handle). */
    uint64_t id = 0;
    bool gone = p->dev->ops->stream_id(p->dev, GMA_STREAM_PER_THREAD, &id) != GMA_OK;
    gma__lock(&p->lock, GMA__RANK_POOL);
    gma__stream_t *s = gma__stable_lookup(p, key);
    if (s && !gma__load_relaxed(&s->retired)) gma__stream_retire(p, s, gone || id != s->id);
    GMA__VALIDATE(p);
    gma__unlock(&p->lock);
  }
  gma__unlock(&pools_mu);
}

static void exit_key_make(void) {
  exit_key_ok = pthread_key_create(&exit_key, thread_exit_hook) == 0;
  pthread_atfork(pools_prefork, pools_postfork_parent, pools_postfork_child);
}

void gma__pools_add(gma__pool_t *p) {
  pthread_once(&exit_once, exit_key_make);
  gma__lock(&pools_mu, GMA__RANK_POOLS);
  p->next_pool = pools;
  pools = p;
  p->listed = true;
  gma__unlock(&pools_mu);
}

void gma__pools_remove(gma__pool_t *p) {
  gma__lock(&pools_mu, GMA__RANK_POOLS);
  for (gma__pool_t **link = &pools; *link; link = &(*link)->next_pool)
    if (*link == p) {
      *link = p->next_pool;
      break;
    }
  p->listed = false;
  gma__unlock(&pools_mu);
}

static _Atomic uint64_t next_serial = 1;

static gma__stream_t *stream_new(gma__pool_t *p, gma_stream_t handle, uintptr_t key,
                                 uint64_t owner, uint64_t id) {
  if (!stable_reserve(p)) return NULL;
  gma__stream_t *s = aligned_alloc(64, sizeof *s);
  if (!s) return NULL;
  memset(s, 0, sizeof *s);
  if (p->nbins) {
    s->bins = aligned_alloc(64, ((p->nbins * sizeof(gma__bin_t) + 63) / 64) * 64);
    if (!s->bins) {
      free(s);
      return NULL;
    }
    for (unsigned c = 0; c < p->nbins; c++) {
      ck_stack_init(&s->bins[c].stack);
      gma__atomic_init(&s->bins[c].count, 0);
    }
  }
  s->handle = handle;
  s->key = key;
  s->owner_tid = owner;
  /* A stream of another context takes only events made in it. If the
   * driver cannot say, assume so: a needless own event costs a create,
   * a pooled one on a foreign stream would fail every record. */
  if (p->dev->ops->stream_foreign && p->dev->ops->stream_foreign(p->dev, handle, &s->foreign) != GMA_OK)
    s->foreign = true;
  s->id = id;
  gma__stream_mark_take(p, s);
  s->serial = gma__faa_relaxed(&next_serial, 1);
  gma__atomic_init(&s->epoch, 1); /* epochs start at 1: safe_epoch 0 means "none yet" */
  s->next_all = p->stream_list;
  p->stream_list = s;
  stable_insert(gma__load_relaxed(&p->stable), key, s);
  if (owner && !exit_armed && exit_key_ok) { /* this thread's per-thread stream: retire at exit */
    exit_armed = pthread_setspecific(exit_key, (void *)1) == 0;
  }
  return s;
}

gma__stream_t *gma__stream_find(gma__pool_t *p, gma_stream_t handle) {
  uint64_t owner;
  gma__stream_t *s = gma__stable_lookup(p, gma__stream_key(handle, &owner));
  return s && !gma__load_relaxed(&s->retired) ? s : NULL;
}

gma__stream_t *gma__stream_resolve(gma__pool_t *p, gma_stream_t handle, uint64_t id) {
  uint64_t owner;
  uintptr_t key = gma__stream_key(handle, &owner);
  gma__stream_t *s = gma__stable_lookup(p, key);
  if (s && !gma__load_relaxed(&s->retired)) {
    if (s->id == id) return s;
    /* The handle value now names another stream: the old one was destroyed
     * without gma_stream_retire. Its unclosed frees can never be proven safe
     * (gma cannot record on a stream that is gone), so they stay parked. */
    gma__stream_retire(p, s, true);
  }
  return stream_new(p, handle, key, owner, id);
}

GMA__TLS gma__tl_count_t gma__tl_counts[GMA__TL_SLOTS];

gma__tcount_t *gma__tcount_slow(gma__pool_t *p, gma__stream_t *s) {
  gma__tl_count_t *slot = &gma__tl_counts[((uintptr_t)s >> 6) % GMA__TL_SLOTS];
  uint64_t tid = gma__thread_id();
  gma__tcount_t *c;
  for (c = gma__load_acquire(&s->counts); c; c = gma__load_acquire(&c->next))
    if (c->owner_tid == tid) break;
  if (!c) {
    c = aligned_alloc(64, sizeof *c); /* sizeof is a multiple of 64 (see gma__tcount_t) */
    if (!c) abort(); /* 128 bytes once per thread and stream */
    memset(c, 0, sizeof *c);
    c->owner_tid = tid;
    gma__lock(&p->count_lock, GMA__RANK_POOL_COUNT);
    c->next = gma__load_relaxed(&s->counts);
    gma__store_release(&s->counts, c); /* pairs with the acquire walk above */
    gma__unlock(&p->count_lock);
  }
  *slot = (gma__tl_count_t){s, s->serial, c};
  return c;
}

void gma__table_fini(gma__pool_t *p) {
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) {
    for (gma__tcount_t *c = gma__load_relaxed(&s->counts), *next; c; c = next) {
      next = gma__load_relaxed(&c->next);
      free(c);
    }
    free(s->bins);
  }
  for (gma__stable_t *t = gma__load_relaxed(&p->stable), *older; t; t = older) {
    older = t->older;
    free(t);
  }
  gma__store_relaxed(&p->stable, NULL);
}
