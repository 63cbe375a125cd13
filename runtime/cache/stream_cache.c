/* Owns the lock-free hot path: the stream table (handle -> record, read
 * without a lock), the per-thread cache in front of it, the per-stream bins
 * (alloc pops, free pushes), and the per-(stream, thread) counters the hot
 * path writes.
 *
 * A bin hit costs: one probe of the calling thread's stream cache (no device
 * call: see "Per-thread stream cache" below), one ck_stack pop, and counter
 * stores that take no locked instruction. A free costs one page-map walk,
 * one CAS on the block's state (which is what catches a double free), one
 * ck_stack push and the same counter stores; it needs no stream lookup (the
 * block names its record). Anything unusual (record_stream users, a retired
 * stream, a full bin, a test switch) returns "miss" and the caller takes the
 * locked slow path in pool.c. It also owns the process-wide list of pools
 * that an exiting thread walks to retire its per-thread default streams. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "base/sizeclass.h"
#include "base/tsan.h"

/* "Take the slow path": never returned to users (the slow path answers). */
#define MISS GMA_ERR_OOM

/* ---- Thread identity --------------------------------------------------------
 * Ids are never reused, unlike pthread_t values or TLS addresses. TLS uses
 * the default model for a shared library, so libgma.so can be loaded with
 * dlopen into a process whose static TLS is spent (the initial-exec model
 * failed on a GPU machine: "cannot allocate memory in static TLS block"
 * when PyTorch's plug-in loaded it); CMake adds -mtls-dialect=gnu2 where
 * the compiler has it, which makes an access a descriptor call instead of
 * __tls_get_addr. */
#define GMA__TLS __thread

static _Atomic uint64_t next_thread_id = 1;
static GMA__TLS uint64_t thread_id;

uint64_t gma__thread_id(void) {
  if (thread_id == 0) thread_id = gma__faa_relaxed(&next_thread_id, 1);
  return thread_id;
}

/* ---- Stream keys and the stream table ----------------------------------------
 * Real stream handles are pointers aligned to 8 or more. The default stream
 * (NULL or legacy 0x1) has key 0x4; a thread's per-thread default stream
 * (0x2) has key (thread id << 4) | 2: the same handle value names a
 * different stream on each thread. 0 and 0x8 mark empty and removed slots. */
#define KEY_DEFAULT ((uintptr_t)0x4)

uintptr_t gma__stream_key(gma_stream_t handle, uint64_t *owner_tid) {
  *owner_tid = 0;
  if (handle == NULL || handle == GMA_STREAM_LEGACY) return KEY_DEFAULT;
  if (handle == GMA_STREAM_PER_THREAD) {
    *owner_tid = gma__thread_id();
    return (uintptr_t)(*owner_tid << 4) | 2;
  }
  return (uintptr_t)handle;
}

static size_t key_hash(uintptr_t key, size_t capacity) {
  return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20) & (capacity - 1);
}

/* Any thread, lock-free: a retired record may be returned (callers check). */
gma__stream_t *gma__stable_lookup(gma__pool_t *p, uintptr_t key) {
  gma__stable_t *t = gma__load_acquire(&p->stable); /* pairs with stable_publish */
  if (!t) return NULL;
  size_t mask = t->capacity - 1;
  for (size_t i = key_hash(key, t->capacity), n = 0; n < t->capacity; i = (i + 1) & mask, n++) {
    uintptr_t k = gma__load_acquire(&t->slots[i].key); /* pairs with insert's release */
    if (k == key) return gma__load_acquire(&t->slots[i].rec);
    if (k == GMA__KEY_EMPTY) return NULL;
  }
  return NULL;
}

/* Lock held. Inserts into t, which has room. The record is stored before the
 * key, both with release, so a reader that sees the key sees the record. */
static void stable_insert(gma__stable_t *t, uintptr_t key, gma__stream_t *s) {
  size_t mask = t->capacity - 1, i = key_hash(key, t->capacity);
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
  for (size_t i = key_hash(s->key, t->capacity);; i = (i + 1) & mask) {
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
 * (issue 13: 8 exited threads left 350-436 MB reserved). So a thread that
 * gets a per-thread stream record arms a thread-exit hook, and the hook
 * retires that thread's per-thread stream in every pool, from the exiting
 * thread itself, which can still name it: the closing event then covers all
 * its work, and polls release the memory as the event completes.
 *
 * pools_mu guards the list (pool->next_pool, pool->listed); it comes before
 * every pool's lock (pool.h). gma__pools_remove runs first in
 * gma__pool_fini, so a hook never touches a pool being torn down. Across
 * fork() the child starts with an empty list: the parent's pools are not
 * usable there, and their locks may be held by threads that do not exist. */
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static gma__pool_t *pools;
static pthread_key_t exit_key;
static bool exit_key_ok; /* pthread_key_create worked; never arm a key we do not own */
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static GMA__TLS bool exit_armed;

static void pools_prefork(void) { pthread_mutex_lock(&pools_mu); }
static void pools_postfork_parent(void) { pthread_mutex_unlock(&pools_mu); }
static void pools_postfork_child(void) {
  pthread_mutex_init(&pools_mu, NULL);
  pools = NULL;
}

/* The hook: runs as the thread exits (a pthread key destructor). */
static void thread_exit_hook(void *unused) {
  (void)unused;
  /* Disarmed first: a per-thread record made by a later destructor of this
   * thread arms the hook again, and glibc then runs it again. */
  exit_armed = false;
  if (thread_id == 0) return;
  uintptr_t key = (uintptr_t)(thread_id << 4) | 2;
  pthread_mutex_lock(&pools_mu);
  for (gma__pool_t *p = pools; p; p = p->next_pool) {
    if (!gma__stable_lookup(p, key)) continue;
    /* The device's id of this thread's stream now: if it is not the
     * record's, the stream the record names is gone, and nothing can be
     * recorded on it (the record is orphaned, as for a recycled handle). */
    uint64_t id = 0;
    bool gone = p->dev->ops->stream_id(p->dev, GMA_STREAM_PER_THREAD, &id) != GMA_OK;
    pthread_mutex_lock(&p->lock);
    gma__stream_t *s = gma__stable_lookup(p, key);
    if (s && !gma__load_relaxed(&s->retired)) gma__stream_retire(p, s, gone || id != s->id);
    GMA__VALIDATE(p);
    pthread_mutex_unlock(&p->lock);
  }
  pthread_mutex_unlock(&pools_mu);
}

static void exit_key_make(void) {
  exit_key_ok = pthread_key_create(&exit_key, thread_exit_hook) == 0;
  pthread_atfork(pools_prefork, pools_postfork_parent, pools_postfork_child);
}

void gma__pools_add(gma__pool_t *p) {
  pthread_once(&exit_once, exit_key_make);
  pthread_mutex_lock(&pools_mu);
  p->next_pool = pools;
  pools = p;
  p->listed = true;
  pthread_mutex_unlock(&pools_mu);
}

void gma__pools_remove(gma__pool_t *p) {
  pthread_mutex_lock(&pools_mu);
  for (gma__pool_t **link = &pools; *link; link = &(*link)->next_pool)
    if (*link == p) {
      *link = p->next_pool;
      break;
    }
  p->listed = false;
  pthread_mutex_unlock(&pools_mu);
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
      atomic_init(&s->bins[c].count, 0);
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
  s->serial = gma__faa_relaxed(&next_serial, 1);
  atomic_init(&s->epoch, 1); /* epochs start at 1: safe_epoch 0 means "none yet" */
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

/* ---- Per-(stream, thread) counters ------------------------------------------*/

typedef struct tl_count {
  const gma__stream_t *stream;
  uint64_t serial; /* the record's: a record at a reused address has another */
  gma__tcount_t *count;
} tl_count_t;
static GMA__TLS tl_count_t tl_counts[GMA__TL_SLOTS];

gma__tcount_t *gma__tcount(gma__pool_t *p, gma__stream_t *s) {
  tl_count_t *slot = &tl_counts[((uintptr_t)s >> 6) % GMA__TL_SLOTS];
  if (slot->stream == s && slot->serial == s->serial) return slot->count;
  uint64_t tid = gma__thread_id();
  gma__tcount_t *c;
  for (c = gma__load_acquire(&s->counts); c; c = gma__load_acquire(&c->next))
    if (c->owner_tid == tid) break;
  if (!c) {
    c = aligned_alloc(64, sizeof *c); /* sizeof is a multiple of 64 (see gma__tcount_t) */
    if (!c) abort(); /* 128 bytes once per thread and stream */
    memset(c, 0, sizeof *c);
    c->owner_tid = tid;
    pthread_mutex_lock(&p->count_lock);
    c->next = gma__load_relaxed(&s->counts);
    gma__store_release(&s->counts, c); /* pairs with the acquire walk above */
    pthread_mutex_unlock(&p->count_lock);
  }
  *slot = (tl_count_t){s, s->serial, c};
  return c;
}

/* ---- Per-thread stream cache -------------------------------------------------
 * Telling a recycled handle value from the stream it used to name takes a
 * device call (cuStreamGetId, plus a context push and pop for the default
 * handles on CUDA). Issue 16: a bin hit must make none. So each thread keeps
 * a few (pool, stream key) -> record entries, filled after a lookup that did
 * ask the device (gma__bin_alloc), and a bin hit through an entry asks
 * nothing. What that relies on is the documented rule: a stream is retired
 * (gma_stream_retire, or gma_stream_destroy through gma) before it is
 * destroyed, so a handle value is never given to a new stream while a
 * record of the old one is live. A thread's next bin miss still asks the
 * device, which catches a stream destroyed behind gma's back there.
 *
 * Invariant (checked by tl_stream_get in debug builds): an entry e is used
 * only when e->pool == p and e->pool_serial == p->serial and e->rec->retired
 * is false; then
 *     gma__stable_lookup(p, e->key) == e->rec   and   e->rec->key == e->key,
 * and e->rec->id is the device's id of the stream the handle names (by the
 * rule above). Why each part holds:
 *   - pool serials are never reused (gma__pool_init), so an allocator
 *     destroyed and re-created at the same address, or one made in a child
 *     after fork() next to inherited ones (which fail GMA__CHECK before they
 *     get here), never matches an old entry; and e->rec is dereferenced only
 *     after the match, when it is still allocated: records are freed only by
 *     the pool's teardown;
 *   - only gma__stream_retire takes a key out of the stream table (and it
 *     sets retired first, for good), so a record that is not retired still
 *     owns its key. Retiring a stream thus invalidates exactly its entries,
 *     in every thread, with no per-allocator generation to bump: the flag
 *     every lock-free path already checks is the generation.
 * Memory order: the cache is thread-local (plain fields). retired is read
 * relaxed, as gma__bin_alloc always has: a thread that allocates on a handle
 * after another thread retired (and destroyed, and re-created) its stream
 * learned the new handle through some synchronization, which orders the
 * retire's store before this load. The record's fields read here (key, id,
 * bins) were published before the key (stable_insert's release) and this
 * thread acquired them in the lookup that filled the entry. */
typedef struct tl_stream {
  const gma__pool_t *pool; /* the pool that filled it (compared, never read); NULL: empty */
  uint64_t pool_serial;    /* that pool's serial */
  uintptr_t key;           /* the stream key (gma__stream_key) */
  gma__stream_t *rec;      /* what the key resolved to; rec->id is the stream's device id */
} tl_stream_t;
/* Searched from the key's hashed slot on, all of them before a miss: a
 * direct-mapped table put two of a thread's three streams in one slot in a
 * third of the runs of fakecuda_backend_hotpath, and each then asked the
 * device every time. A hit is usually found at the first slot. */
static GMA__TLS tl_stream_t tl_streams[GMA__TL_STREAMS];
static GMA__TLS unsigned tl_stream_victim; /* round-robin eviction when all slots are taken */

static unsigned tl_stream_home(const gma__pool_t *p, uintptr_t key) {
  uint64_t h = ((uint64_t)key ^ (p->serial << 40)) * 0x9E3779B97F4A7C15ull;
  return (unsigned)(h >> 32) % GMA__TL_STREAMS;
}

/* The calling thread's record for key in p, or NULL (look it up, asking the
 * device). Wait-free: a few loads, no device call. */
static gma__stream_t *tl_stream_get(gma__pool_t *p, uintptr_t key) {
  unsigned i = tl_stream_home(p, key);
  for (unsigned n = 0; n < GMA__TL_STREAMS; n++, i = (i + 1) % GMA__TL_STREAMS) {
    const tl_stream_t *e = &tl_streams[i];
    if (e->pool != p || e->pool_serial != p->serial || e->key != key) continue;
    gma__stream_t *s = e->rec;
    if (gma__load_relaxed(&s->retired)) return NULL;
    /* The invariant above; retired is read again because a racing retire
     * may have removed the key since (a misuse: allocating on a stream while
     * retiring it, but not one to abort on). */
    GMA__ASSERT(s->key == key &&
                (gma__stable_lookup(p, key) == s || gma__load_relaxed(&s->retired)));
    return s;
  }
  return NULL;
}

/* Records that key in p resolved to s, a live record whose id the device
 * just confirmed: in the slot that holds key already (a retired record's),
 * else the first slot from the key's home that is empty, another pool's
 * (perhaps a destroyed one) or a retired record's, else a round-robin
 * victim. */
static void tl_stream_put(gma__pool_t *p, uintptr_t key, gma__stream_t *s) {
  unsigned home = tl_stream_home(p, key), i = home, free_slot = GMA__TL_STREAMS;
  for (unsigned n = 0; n < GMA__TL_STREAMS; n++, i = (i + 1) % GMA__TL_STREAMS) {
    const tl_stream_t *e = &tl_streams[i];
    bool ours = e->pool == p && e->pool_serial == p->serial;
    if (ours && e->key == key) {
      free_slot = i;
      break;
    }
    if (free_slot == GMA__TL_STREAMS && (!ours || gma__load_relaxed(&e->rec->retired)))
      free_slot = i;
  }
  if (free_slot == GMA__TL_STREAMS) free_slot = tl_stream_victim++ % GMA__TL_STREAMS;
  tl_streams[free_slot] = (tl_stream_t){p, p->serial, key, s};
}

gma__stream_t *gma__stream_cached(gma__pool_t *p, gma_stream_t handle) {
  uint64_t owner;
  return tl_stream_get(p, gma__stream_key(handle, &owner));
}

/* ---- The bins -----------------------------------------------------------------*/

static gma_status_t bin_pop(gma__pool_t *p, gma__stream_t *s, size_t size, void **out) {
  gma__bin_t *bin = &s->bins[gma__class_of(size)];
  ck_stack_entry_t *e = ck_stack_pop_mpmc(&bin->stack);
  if (!e) return MISS;
  gma__store_relaxed(&bin->count, gma__load_relaxed(&bin->count) - 1); /* soft: see gma__bin_t */
  gma__block_t *b = (gma__block_t *)((char *)e - offsetof(gma__block_t, bin_link));
  gma__tsan_acquire(b); /* pairs with gma__bin_free's release before the push */
  gma__store_relaxed(&b->future_held, 0);
  gma__store_relaxed(&b->tag, 0);
  gma__store_relaxed(&b->born_ns, gma__load_relaxed(&p->clock_ns));
  gma__store_relaxed(&b->requested, size);
  gma__store_release(&b->state, GMA__LIVE); /* pairs with gma__bin_free's acquire */
  gma__tcount_t *c = gma__tcount(p, s);
  gma__counter_add_owner(&c->allocs, 1);
  gma__counter_add_owner(&c->hits, 1);
  gma__counter_add_owner(&c->alloc_bytes, b->size);
  gma__counter_add_owner(&c->req_bytes, size);
  gma__counter_add_owner(&c->bin_out, b->size);
  *out = (void *)b->addr;
  return GMA_OK;
}

gma_status_t gma__bin_alloc_cached(gma__pool_t *p, size_t size, gma_stream_t stream,
                                   void **out) {
  uint64_t owner;
  gma__stream_t *s = tl_stream_get(p, gma__stream_key(stream, &owner));
  return s ? bin_pop(p, s, size, out) : MISS;
}

gma__stream_t *gma__stream_live(gma__pool_t *p, gma_stream_t stream, uint64_t id) {
  uint64_t owner;
  uintptr_t key = gma__stream_key(stream, &owner);
  gma__stream_t *s = gma__stable_lookup(p, key);
  if (!s || gma__load_relaxed(&s->retired) || id != s->id) return NULL;
  /* id was read from the device before this lookup: s is the record of the
   * stream the handle names now, and stays so until it is retired. */
  tl_stream_put(p, key, s);
  return s;
}

gma_status_t gma__bin_alloc(gma__pool_t *p, size_t size, gma_stream_t stream, uint64_t id,
                           void **out) {
  gma__stream_t *s = gma__stream_live(p, stream, id);
  return s ? bin_pop(p, s, size, out) : MISS;
}

gma_status_t gma__bin_free(gma__pool_t *p, void *ptr) {
  gma__block_t *b = gma__pagemap_get(&p->pagemap, (uintptr_t)ptr);
  if (!b) return MISS;
  /* The state first, and nothing but atomics before it says LIVE: a double
   * free finds the block cached, pending or free, and the worker may be
   * moving it under the lock right now (writing stream, size, links). LIVE
   * is stored with release after the block's fields were set, so the reads
   * below see them. (Found by TSan replaying the fuzzer's corpus.) The
   * address check matters only for a buggy double free racing with a
   * coalesce that recycled this record for another block: records are never
   * unmapped, and their addr changes only under the lock. */
  if (gma__load_acquire(&b->state) != GMA__LIVE) return MISS; /* the slow path says why */
  if (b->addr != (uintptr_t)ptr || gma__load_relaxed(&b->ngates) || p->test_flags ||
      gma__load_relaxed(&b->future_held))
    return MISS; /* held by an uncollected future: the slow path refuses it */
  unsigned cls = gma__class_floor(b->size);
  gma__stream_t *s = b->stream;
  if (cls >= p->nbins || !s || gma__load_relaxed(&s->retired)) return MISS;
  gma__bin_t *bin = &s->bins[cls];
  int32_t depth = gma__load_relaxed(&bin->count);
  if (depth >= (int32_t)p->bin_depth) return MISS; /* full: the slow path caches it in the tree */
  uint8_t live = GMA__LIVE;
  if (!gma__cas_acq_rel(&b->state, &live, GMA__BINNED))
    return MISS; /* not live: the slow path says double free or foreign */
  gma__store_relaxed(&bin->count, depth + 1); /* soft: see gma__bin_t */
  /* The epoch is read after the caller queued its last work on s (program
   * order). The poller raises the epoch before it records the event that
   * closes it, and the device orders that record against this stream's
   * queued work: so either the record comes after our work, or it came
   * before and the raise happened-before this read, which then sees the
   * newer epoch. Either way the block's epoch event covers its work. */
  b->epoch = gma__load_relaxed(&s->epoch);
  if (!gma__load_relaxed(&s->dirty)) gma__store_relaxed(&s->dirty, true);
  gma__tcount_t *c = gma__tcount(p, s);
  gma__counter_add_owner(&c->frees, 1);
  gma__counter_add_owner(&c->free_bytes, b->size);
  gma__counter_add_owner(&c->req_freed, gma__load_relaxed(&b->requested));
  gma__counter_add_owner(&c->bin_in, b->size);
  gma__tsan_release(b); /* pairs with the acquire after a pop or drain */
  ck_stack_push_mpmc(&bin->stack, &b->bin_link);
  /* The push wrote b->bin_link.next after that release (inside ck's asm, which
   * TSan cannot see ordering); a drain reads it. Release on the stack too:
   * the drain acquires it after its batch pop. */
  gma__tsan_release(&bin->stack);
  /* The other half of the Dekker pair with gma__stream_retire (store
   * retired, fence, drain): the push above and this load are ordered by a
   * full fence, so either the retire's second drain sees the block, or this
   * load sees retired and the block is drained here (gma__stream_rescue). */
  gma__fence_after_locked_rmw();
  if (__builtin_expect(atomic_load_explicit(&s->retired, memory_order_relaxed), 0)) {
    pthread_mutex_lock(&p->lock);
    gma__stream_rescue(p, s);
    GMA__VALIDATE(p);
    pthread_mutex_unlock(&p->lock);
  }
  return GMA_OK;
}

void gma__stream_cache_fini(gma__pool_t *p) {
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
