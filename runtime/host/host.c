/* Owns the pinned host memory pool and the CPU fallback's allocations (see
 * host.h). One mutex: host allocations are for copies and fallbacks, far
 * from the device hot path. Device calls (allocating pinned memory can take
 * milliseconds) are made outside the mutex. */
#include "host/host.h"
#include "base/lock.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "base/sizeclass.h"

/* The address a block is known by: what its caller got. */
static uintptr_t key_of(const gma__hblock_t *b) {
  return b->fallback ? b->dptr : (uintptr_t)b->ptr;
}

static size_t bucket_of(const gma__host_t *h, uintptr_t key) {
  uint64_t x = (uint64_t)key * 0x9e3779b97f4a7c15ull;
  return (size_t)(x >> 32) & (h->nbuckets - 1);
}

/* mu held. */
static gma__hblock_t *find(gma__host_t *h, uintptr_t key) {
  for (gma__hblock_t *b = h->buckets[bucket_of(h, key)]; b; b = b->hnext)
    if (key_of(b) == key) return b;
  return NULL;
}

/* mu held; false without host memory for a bigger table (the block is then
 * not added and the caller gives it back). */
static bool insert(gma__host_t *h, gma__hblock_t *b) {
  if (h->count + 1 > h->nbuckets) {
    size_t n = h->nbuckets * 2;
    gma__hblock_t **nb = calloc(n, sizeof *nb);
    if (!nb) return false;
    gma__hblock_t **old = h->buckets;
    size_t oldn = h->nbuckets;
    h->buckets = nb;
    h->nbuckets = n;
    for (size_t i = 0; i < oldn; i++)
      for (gma__hblock_t *x = old[i], *next; x; x = next) {
        next = x->hnext;
        size_t k = bucket_of(h, key_of(x));
        x->hnext = nb[k];
        nb[k] = x;
      }
    free(old);
  }
  size_t k = bucket_of(h, key_of(b));
  b->hnext = h->buckets[k];
  h->buckets[k] = b;
  h->count++;
  return true;
}

/* mu held: puts b back in the table without growing it (cannot fail). */
static void link_hash(gma__host_t *h, gma__hblock_t *b) {
  size_t k = bucket_of(h, key_of(b));
  b->hnext = h->buckets[k];
  h->buckets[k] = b;
  h->count++;
}

static void unlink_hash(gma__host_t *h, gma__hblock_t *b) {
  gma__hblock_t **pp = &h->buckets[bucket_of(h, key_of(b))];
  while (*pp != b) pp = &(*pp)->hnext;
  *pp = b->hnext;
  h->count--;
}

gma_status_t gma__host_init(gma__host_t *h, gma__device_t *dev) {
  memset(h, 0, sizeof *h);
  h->dev = dev;
  h->nbuckets = 64;
  h->buckets = calloc(h->nbuckets, sizeof *h->buckets);
  if (!h->buckets) return gma__set_error(GMA_ERR_OOM, "host memory for the host pool");
  pthread_mutex_init(&h->mu, NULL);
  return GMA_OK;
}

/* mu held: whether every event recorded at b's free (its stream's and those
 * of the streams it was recorded on) completed. */
static gma_status_t events_done(gma__host_t *h, gma__hblock_t *b, bool *done) {
  *done = true;
  gma_status_t st = b->own.ev ? h->dev->ops->event_query(h->dev, b->own.ev, done) : GMA_OK;
  for (uint32_t i = 0; st == GMA_OK && *done && i < b->nxuse; i++)
    if (b->xuse[i].ev) st = h->dev->ops->event_query(h->dev, b->xuse[i].ev, done);
  return st;
}

/* Whether u names stream (of device id id) and it has not gone. */
static bool names(const gma__huse_t *u, gma_stream_t stream, uint64_t id) {
  return !u->gone && u->stream == stream && u->id == id;
}

/* mu held: an event recorded on u's stream now (created on first use), or,
 * when that fails, a wait for the stream, after which u->ev is dropped
 * (nothing left to wait for). */
static gma_status_t record_or_wait(gma__host_t *h, gma__huse_t *u) {
  const gma__device_ops_t *o = h->dev->ops;
  gma_status_t st = u->ev                ? GMA_OK
                    : o->event_create_for ? o->event_create_for(h->dev, u->stream, &u->ev)
                                          : o->event_create(h->dev, &u->ev);
  if (st == GMA_OK && o->event_record(h->dev, u->ev, u->stream) == GMA_OK) return GMA_OK;
  st = o->stream_synchronize(h->dev, u->stream);
  if (st == GMA_OK && u->ev) {
    o->event_destroy(h->dev, u->ev);
    u->ev = NULL;
  }
  return st;
}

/* mu held: orders the free of a block after the work queued on u's stream so
 * far. A stream that went was dealt with then (gma__host_stream_gone). Any
 * other handle is alive by the rule (retire before destroy), so the event
 * goes on it without asking the driver first: asking about a handle that may
 * be destroyed is itself undefined on CUDA. The one handle that can name
 * another stream now is GMA_STREAM_PER_THREAD, valid on every thread but
 * naming each thread's own stream: when the freeing thread's is not the one
 * the block was used on, wait for the whole device instead. */
static gma_status_t order_free(gma__host_t *h, gma__huse_t *u) {
  if (u->gone) return GMA_OK;
  const gma__device_ops_t *o = h->dev->ops;
  uint64_t id = 0;
  if (u->stream != GMA_STREAM_PER_THREAD ||
      (o->stream_id(h->dev, u->stream, &id) == GMA_OK && id == u->id))
    return record_or_wait(h, u);
  gma_status_t st = o->device_synchronize(h->dev);
  if (st == GMA_OK && u->ev) {
    o->event_destroy(h->dev, u->ev);
    u->ev = NULL;
  }
  return st;
}

/* mu held: whether u's stream is capturing a CUDA graph (or, the legacy
 * stream, would join another stream's capture): an event recorded there
 * would be part of the graph (its query fails for ever) and a wait for the
 * stream would invalidate the capture. The graph may use the block at every
 * launch, which gma cannot see, so such a free is refused. A failed query
 * counts as capturing: refusing is always safe. */
static bool use_capturing(gma__host_t *h, const gma__huse_t *u) {
  const gma__device_ops_t *o = h->dev->ops;
  if (u->gone || !o->stream_capture) return false;
  bool on = false;
  uint64_t id = 0;
  return o->stream_capture(h->dev, u->stream, &on, &id) != GMA_OK || on;
}

/* Forgets the other streams of a block whose work on them is done. */
static void drop_xuse(gma__host_t *h, gma__hblock_t *b) {
  for (uint32_t i = 0; i < b->nxuse; i++)
    if (b->xuse[i].ev) h->dev->ops->event_destroy(h->dev, b->xuse[i].ev);
  b->nxuse = 0;
}

/* mu held: PENDING blocks whose events completed become FREE, in FIFO order
 * (a block behind one still running waits its turn: cheap and fair). */
static void poll_pending(gma__host_t *h) {
  while (h->pending_head) {
    gma__hblock_t *b = h->pending_head;
    bool done = false;
    if (events_done(h, b, &done) != GMA_OK) {
      h->device_errors++; /* stays pending: never reused on a guess */
      return;
    }
    if (!done) return;
    drop_xuse(h, b);
    h->pending_head = b->next;
    if (!h->pending_head) h->pending_tail = NULL;
    h->pending_bytes -= b->size;
    b->state = GMA__HOST_FREE;
    b->free_since_ns = gma__now_ns();
    unsigned c = gma__class_of(b->size);
    b->next = h->free_list[c];
    h->free_list[c] = b;
    h->free_bytes += b->size;
  }
}

static uint64_t class_size(size_t size) {
  unsigned c = gma__class_of(size);
  return c < GMA__HOST_CLASSES ? gma__class_size(c) : (size + 4095) / 4096 * 4096;
}

gma_status_t gma__host_alloc(gma__host_t *h, size_t size, gma_stream_t stream, bool fallback,
                             void **out) {
  if (size == 0) return gma__set_error(GMA_ERR_INVALID_SIZE, "gma_host_alloc: size is 0");
  /* Sizes above the largest class round up to 4 KiB pages: one that close
   * to SIZE_MAX would wrap to a tiny block (SIZE_MAX became 0). No
   * machine has that much host memory anyway. */
  if (size > (SIZE_MAX >> 1))
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "gma_host_alloc: %zu bytes is more host memory than any machine can "
                          "pin; ask for less",
                          size);
  uint64_t sid;
  gma_status_t sst = h->dev->ops->stream_id(h->dev, stream, &sid);
  if (sst != GMA_OK) return sst; /* not a stream of this device: its message says so */
  uint64_t csize = class_size(size);
  unsigned c = gma__class_of(csize);
  gma__lock(&h->mu, GMA__RANK_HOST);
  poll_pending(h);
  gma__hblock_t *b = c < GMA__HOST_CLASSES ? h->free_list[c] : NULL;
  if (b) {
    h->free_list[c] = b->next;
    h->free_bytes -= b->size;
    unlink_hash(h, b); /* its key may change with the fallback flag */
  }
  gma__unlock(&h->mu);
  if (!b) {
    b = calloc(1, sizeof *b);
    if (!b) return gma__set_error(GMA_ERR_OOM, "host memory for a host block record");
    gma_status_t st = h->dev->ops->host_alloc(h->dev, csize, &b->ptr, &b->dptr);
    if (st != GMA_OK) {
      free(b);
      return st;
    }
    b->size = csize;
    gma__lock(&h->mu, GMA__RANK_HOST);
    gma__stat_add(&h->reserved, csize);
    gma__unlock(&h->mu);
  }
  b->requested = size;
  b->own.stream = stream;
  b->own.id = sid;
  b->own.gone = 0;
  b->fallback = fallback;
  b->tag = 0;
  b->nxuse = 0;
  b->state = GMA__HOST_LIVE;
  b->next = NULL;
  gma__lock(&h->mu, GMA__RANK_HOST);
  bool ok = insert(h, b);
  if (ok) {
    h->live_bytes += b->size;
    gma__stat_add(&h->allocated, b->size);
    if (fallback) {
      h->fallback_live += b->size;
      h->fallbacks++;
    } else {
      h->allocs++;
    }
  } else {
    gma__stat_sub(&h->reserved, b->size);
  }
  gma__unlock(&h->mu);
  if (!ok) {
    if (b->own.ev) h->dev->ops->event_destroy(h->dev, b->own.ev);
    h->dev->ops->host_free(h->dev, b->ptr, b->size);
    free(b->xuse);
    free(b);
    return gma__set_error(GMA_ERR_OOM, "host memory for the host pool's table");
  }
  *out = fallback ? (void *)b->dptr : b->ptr;
  return GMA_OK;
}

/* mu held: GMA_OK when b (the block at ptr, or NULL) may be freed by
 * gma_free (fallback) or gma_host_free; else the error, set. */
static gma_status_t free_check(const gma__hblock_t *b, void *ptr, bool fallback) {
  if (b && b->fallback && !fallback)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_host_free(%p): the pointer came from gma_alloc (device memory ran "
                          "out and fallback:host served it from pinned host memory); free it "
                          "with gma_free",
                          ptr);
  if (b && !b->fallback && fallback)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_free(%p): the pointer is pinned host memory from gma_host_alloc; "
                          "free it with gma_host_free",
                          ptr);
  if (!b)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "%s(%p): not memory gma_host_alloc returned; pass exactly its pointer",
                          fallback ? "gma_free" : "gma_host_free", ptr);
  if (b->state != GMA__HOST_LIVE)
    return gma__set_error(GMA_ERR_DOUBLE_FREE, "%s(%p): already freed",
                          fallback ? "gma_free" : "gma_host_free", ptr);
  return GMA_OK;
}

/* mu held: orders the free of b after the work queued so far on its own
 * stream (a copy from or to the block) and on the streams gma_record_stream
 * named: until those events complete the block is not handed out again. A
 * failure leaves the block live (free it again). */
static gma_status_t free_order(gma__host_t *h, gma__hblock_t *b, void *ptr, bool fallback) {
  gma__huse_t *captured = use_capturing(h, &b->own) ? &b->own : NULL;
  for (uint32_t i = 0; !captured && i < b->nxuse; i++)
    if (use_capturing(h, &b->xuse[i])) captured = &b->xuse[i];
  if (captured)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s(%p): stream %p is capturing a CUDA graph (or is the legacy "
                          "stream while another stream captures), and the graph may use this "
                          "block at every launch; the block stays allocated: free it after "
                          "the capture ended and the graph's last launch completed",
                          fallback ? "gma_free" : "gma_host_free", ptr, captured->stream);
  gma__huse_t *failed = NULL;
  for (uint32_t i = 0; !failed && i < b->nxuse; i++)
    if (order_free(h, &b->xuse[i]) != GMA_OK) failed = &b->xuse[i];
  if (!failed && order_free(h, &b->own) != GMA_OK) failed = &b->own;
  if (failed)
    return gma__set_error(GMA_ERR_DEVICE, "%s(%p): could not order the free after the work of "
                          "stream %p (%s); the block stays allocated, free it again",
                          fallback ? "gma_free" : "gma_host_free", ptr, failed->stream,
                          gma__error_detail(gma_last_error()));
  return GMA_OK;
}

/* mu held: b, its free ordered, leaves the live figures and waits on the
 * pending list for its events, or goes straight to its class's free list. */
static void free_retire(gma__host_t *h, gma__hblock_t *b) {
  h->live_bytes -= b->size;
  gma__stat_sub(&h->allocated, b->size);
  if (b->fallback) {
    h->fallback_live -= b->size;
    h->fallback_frees++;
  } else {
    h->frees++;
  }
  bool recorded = b->own.ev != NULL;
  for (uint32_t i = 0; i < b->nxuse; i++) recorded = recorded || b->xuse[i].ev;
  if (!recorded) drop_xuse(h, b);
  if (recorded) {
    b->state = GMA__HOST_PENDING;
    if (h->pending_tail) h->pending_tail->next = b;
    else h->pending_head = b;
    h->pending_tail = b;
    h->pending_bytes += b->size;
  } else {
    b->state = GMA__HOST_FREE;
    b->free_since_ns = gma__now_ns();
    unsigned c = gma__class_of(b->size);
    b->next = h->free_list[c];
    h->free_list[c] = b;
    h->free_bytes += b->size;
  }
}

gma_status_t gma__host_free(gma__host_t *h, void *ptr, bool fallback) {
  gma__lock(&h->mu, GMA__RANK_HOST);
  gma__hblock_t *b = find(h, (uintptr_t)ptr);
  gma_status_t st = free_check(b, ptr, fallback);
  if (st == GMA_OK) st = free_order(h, b, ptr, fallback);
  if (st == GMA_OK) free_retire(h, b);
  gma__unlock(&h->mu);
  return st;
}

/* mu held: u's stream is about to be destroyed (it still exists): its work
 * is covered now, by an event or a wait, and the free will not name it. */
static void mark_gone(gma__host_t *h, gma__huse_t *u) {
  if (record_or_wait(h, u) != GMA_OK) {
    h->device_errors++; /* neither: its free finds the handle changed and waits for the device */
    return;
  }
  u->gone = 1;
}

/* mu held: whether a live block names the handle value (not gone). */
static bool handle_in_use(gma__host_t *h, gma_stream_t stream) {
  for (size_t i = 0; i < h->nbuckets; i++)
    for (gma__hblock_t *b = h->buckets[i]; b; b = b->hnext) {
      if (b->state != GMA__HOST_LIVE) continue;
      if (!b->own.gone && b->own.stream == stream) return true;
      for (uint32_t k = 0; k < b->nxuse; k++)
        if (!b->xuse[k].gone && b->xuse[k].stream == stream) return true;
    }
  return false;
}

void gma__host_stream_gone(gma__host_t *h, gma_stream_t stream) {
  /* No device call for a handle no live host block names: it may be one the
   * caller destroyed already (retired twice), and gma promises no call then. */
  gma__lock(&h->mu, GMA__RANK_HOST);
  bool used = handle_in_use(h, stream);
  gma__unlock(&h->mu);
  if (!used) return;
  uint64_t id;
  if (h->dev->ops->stream_id(h->dev, stream, &id) != GMA_OK) return; /* frees wait for the device */
  gma__lock(&h->mu, GMA__RANK_HOST);
  for (size_t i = 0; i < h->nbuckets; i++)
    for (gma__hblock_t *b = h->buckets[i]; b; b = b->hnext) {
      if (b->state != GMA__HOST_LIVE) continue;
      if (names(&b->own, stream, id)) mark_gone(h, &b->own);
      for (uint32_t k = 0; k < b->nxuse; k++)
        if (names(&b->xuse[k], stream, id)) mark_gone(h, &b->xuse[k]);
    }
  gma__unlock(&h->mu);
}

gma_status_t gma__host_record_stream(gma__host_t *h, void *ptr, gma_stream_t stream) {
  uint64_t id;
  gma_status_t st = h->dev->ops->stream_id(h->dev, stream, &id);
  if (st != GMA_OK) return st; /* not a stream of this device: its message says so */
  gma__lock(&h->mu, GMA__RANK_HOST);
  gma__hblock_t *b = find(h, (uintptr_t)ptr);
  if (!b || !b->fallback || b->state != GMA__HOST_LIVE) {
    gma__unlock(&h->mu);
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_record_stream(%p): not a live allocation of this allocator", ptr);
  }
  bool known = names(&b->own, stream, id);
  for (uint32_t i = 0; !known && i < b->nxuse; i++) known = names(&b->xuse[i], stream, id);
  if (!known && b->nxuse == b->xuse_cap) {
    uint32_t cap = b->xuse_cap ? 2 * b->xuse_cap : 4;
    gma__huse_t *nx = realloc(b->xuse, cap * sizeof *nx);
    if (!nx) {
      gma__unlock(&h->mu);
      return gma__set_error(GMA_ERR_OOM, "gma_record_stream(%p): host memory", ptr);
    }
    b->xuse = nx;
    b->xuse_cap = cap;
  }
  if (!known) b->xuse[b->nxuse++] = (gma__huse_t){.stream = stream, .id = id};
  gma__unlock(&h->mu);
  return GMA_OK;
}

int gma__host_contains(gma__host_t *h, const void *ptr, void **base) {
  uintptr_t a = (uintptr_t)ptr;
  int kind = 0;
  gma__lock(&h->mu, GMA__RANK_HOST);
  for (size_t i = 0; i < h->nbuckets && !kind; i++)
    for (gma__hblock_t *b = h->buckets[i]; b && !kind; b = b->hnext) {
      uintptr_t k = key_of(b);
      if (a < k || a >= k + b->size) continue;
      kind = b->fallback ? GMA_MEMORY_FALLBACK : GMA_MEMORY_HOST_PINNED;
      *base = (void *)k;
    }
  gma__unlock(&h->mu);
  return kind;
}

bool gma__host_owns_fallback(gma__host_t *h, void *ptr) {
  gma__lock(&h->mu, GMA__RANK_HOST);
  gma__hblock_t *b = find(h, (uintptr_t)ptr);
  bool yes = b && b->fallback;
  gma__unlock(&h->mu);
  return yes;
}

void gma__host_trim(gma__host_t *h, uint64_t keep) {
  gma__hblock_t *out = NULL;
  gma__lock(&h->mu, GMA__RANK_HOST);
  poll_pending(h);
  /* Largest classes first: fewest device calls per byte given back. Out of
   * the table before the device frees them: a later host_alloc may get the
   * same address back. */
  for (unsigned c = GMA__HOST_CLASSES; c-- > 0 && h->free_bytes > keep;) {
    while (h->free_list[c] && h->free_bytes > keep) {
      gma__hblock_t *b = h->free_list[c];
      h->free_list[c] = b->next;
      h->free_bytes -= b->size;
      unlink_hash(h, b);
      gma__stat_sub(&h->reserved, b->size);
      b->next = out;
      out = b;
    }
  }
  gma__unlock(&h->mu);
  /* Outside the lock. A block the device would not take back (host_free
   * failed) is still the device's: it goes back to its free list, and a
   * later trim tries again. */
  gma__hblock_t *kept = NULL;
  for (gma__hblock_t *b = out, *next; b; b = next) {
    next = b->next;
    if (h->dev->ops->host_free(h->dev, b->ptr, b->size) != GMA_OK) {
      b->next = kept;
      kept = b;
      continue;
    }
    if (b->own.ev) h->dev->ops->event_destroy(h->dev, b->own.ev);
    free(b->xuse);
    free(b);
  }
  if (!kept) return;
  gma__lock(&h->mu, GMA__RANK_HOST);
  for (gma__hblock_t *b = kept, *next; b; b = next) {
    next = b->next;
    link_hash(h, b);
    h->reserved.current += b->size; /* held all along: no new total or peak */
    unsigned c = gma__class_of(b->size);
    b->next = h->free_list[c];
    h->free_list[c] = b;
    h->free_bytes += b->size;
    h->device_errors++;
  }
  gma__unlock(&h->mu);
}

void gma__host_set_tag(gma__host_t *h, void *ptr, uint8_t tag) {
  gma__lock(&h->mu, GMA__RANK_HOST);
  gma__hblock_t *b = find(h, (uintptr_t)ptr);
  if (b && b->state == GMA__HOST_LIVE) b->tag = tag;
  gma__unlock(&h->mu);
}

bool gma__host_pointer_info(gma__host_t *h, struct gma__pool *p, const void *ptr,
                            gma_pointer_info_t *info) {
  uintptr_t a = (uintptr_t)ptr;
  bool found = false;
  gma__lock(&h->mu, GMA__RANK_HOST);
  /* Interior pointers too: a linear look over the live blocks (host blocks
   * are few and large). */
  for (size_t i = 0; i < h->nbuckets && !found; i++)
    for (gma__hblock_t *b = h->buckets[i]; b && !found; b = b->hnext) {
      uintptr_t k = key_of(b);
      if (b->state != GMA__HOST_LIVE || a < k || a >= k + b->size) continue;
      info->kind = b->fallback ? GMA_MEMORY_FALLBACK : GMA_MEMORY_HOST_PINNED;
      info->base = (void *)k;
      info->requested = b->requested;
      info->block_size = b->size;
      info->stream = b->own.stream;
      info->tag = gma__tag_name(p, b->tag);
      found = true;
    }
  gma__unlock(&h->mu);
  return found;
}

void gma__host_stats(gma__host_t *h, gma_stats_t *out) {
  gma__lock(&h->mu, GMA__RANK_HOST);
  out->host_allocated = h->allocated;
  out->host_reserved = h->reserved;
  out->num_host_allocs = h->allocs;
  out->num_host_frees = h->frees;
  out->num_fallbacks = h->fallbacks;
  /* A fallback is a successful gma_alloc, its free a successful gma_free. */
  out->num_allocs += h->fallbacks;
  out->num_frees += h->fallback_frees;
  out->fallback_bytes = h->fallback_live;
  gma__unlock(&h->mu);
}

void gma__host_fini(gma__host_t *h, uint64_t *leaked, uint64_t *leaked_bytes) {
  *leaked = *leaked_bytes = 0;
  for (size_t i = 0; i < h->nbuckets; i++)
    for (gma__hblock_t *b = h->buckets[i], *next; b; b = next) {
      next = b->hnext;
      if (b->state == GMA__HOST_LIVE) {
        (*leaked)++;
        *leaked_bytes += b->size;
      }
      if (b->own.ev) h->dev->ops->event_destroy(h->dev, b->own.ev);
      drop_xuse(h, b);
      free(b->xuse);
      h->dev->ops->host_free(h->dev, b->ptr, b->size);
      free(b);
    }
  free(h->buckets);
  h->buckets = NULL;
  pthread_mutex_destroy(&h->mu);
}
