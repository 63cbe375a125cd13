/* Owns the lock-free hot path: the per-thread cache in front of the stream
 * table (core/table.h), and the per-stream bins (alloc pops, free pushes),
 * counting in the per-(stream, thread) counters.
 *
 * A bin hit costs: one probe of the calling thread's stream cache (no device
 * call: see "Per-thread stream cache" below), one ck_stack pop, and counter
 * stores that take no locked instruction. A free costs one page-map walk,
 * one CAS on the block's state (which is what catches a double free), one
 * ck_stack push and the same counter stores; it needs no stream lookup (the
 * block names its record). Anything unusual (record_stream users, a retired
 * stream, a full bin, a test switch) returns "miss" and the caller takes the
 * locked slow path in core/. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "core/internal.h"
#include "core/table.h"
#include "base/sizeclass.h"
#include "base/tsan.h"

/* "Take the slow path": never returned to users (the slow path answers). */
#define MISS GMA_ERR_OOM
/* ---- Per-thread stream cache -------------------------------------------------
 * Telling a recycled handle value from the stream it used to name takes a
 * device call (cuStreamGetId, plus a context push and pop for the default
 * handles on CUDA), and a bin hit must make none. So each thread keeps
 * a few (pool, stream key) -> record entries, filled after a lookup that did
 * ask the device (gma__bin_alloc), and a bin hit through an entry asks
 * nothing. What that relies on is the documented rule: a stream is retired
 * (gma_stream_retire, or gma_stream_destroy through gma) before it is
 * destroyed, so a handle value is never given to a new stream while a
 * record of the old one is live. The slow path takes the id from the same
 * entry (gma__stream_id); the device is asked only when the thread has no
 * entry for the stream (its first allocation there, or after an eviction),
 * which is where a stream destroyed behind gma's back can be noticed.
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

gma_status_t gma__stream_id(gma__pool_t *p, gma_stream_t stream, uint64_t *id) {
  uint64_t owner;
  gma__stream_t *s = tl_stream_get(p, gma__stream_key(stream, &owner));
  if (s) { /* by the rule above, still the stream the handle names */
    *id = s->id;
    return GMA_OK;
  }
  gma_status_t st = p->dev->ops->stream_id(p->dev, stream, id);
  if (st == GMA_OK) gma__stream_live(p, stream, *id); /* cached, when gma has a record */
  return st;
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
  if (__builtin_expect(gma__load_relaxed(&s->retired), 0)) {
    gma__pool_stream_rescue(p, s);
  }
  return GMA_OK;
}
