/* Owns graph pools and the captures gma was told of (graph.h says what a
 * graph pool guarantees and why). A graph pool sub-allocates chunks, each
 * one arena of the pool below, with a small best-fit allocator of its own:
 * captures are rare and short next to the hot path, so a linear search over
 * a pool's blocks under one mutex is simple and fast enough, and it keeps
 * graph memory out of the pool's trees, where stream order would let other
 * work reuse it. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/round.h"
#include "base/lock.h"
#include "graph/graph.h"
#include "cache/cache.h"

#define GRAPH_MAGIC 0x6c6f6f7068707267ull /* "grphpool" */
#define CHUNK_ROUND (2ull << 20)          /* chunks are whole 2 MiB pieces ... */
#define CHUNK_SMALL (1ull << 20)          /* ... and requests up to this share one */
#define ROUND 512u

/* A block of a chunk. FREE: reusable by any later request of the pool's
 * captures. LIVE: handed out. HELD: freed during a capture into the pool:
 * reusable only by that capture (serial) on the stream it was freed on,
 * unless gma_record_stream named another stream (crossed); FREE when the
 * capture ends. Invariant: a chunk's blocks tile it in address order, and
 * two FREE neighbours never coexist. */
enum { GFREE = 0, GLIVE = 1, GHELD = 2 };
typedef struct gblock {
  uintptr_t addr;
  uint64_t size, requested;
  struct gblock *prev, *next; /* address neighbours in the chunk */
  gma__stream_t *stream;      /* LIVE: allocated on; HELD: its capture's stream */
  uint64_t capture;           /* HELD: the serial of the capture it was freed in */
  uint8_t state;
  bool crossed;               /* LIVE/HELD: another stream used it (gma_record_stream) */
} gblock_t;

/* Invariant: live == the bytes of its LIVE and HELD blocks. */
struct gma__gchunk {
  uintptr_t base;
  uint64_t size;
  gma_graph_pool_t *pool;
  gblock_t *first;
  uint64_t live;
};

/* Invariant: bytes == the sizes of its chunks; live == their live bytes. */
struct gma_graph_pool {
  uint64_t magic;
  gma_graph_pool_t *next; /* gma__graphs_t.pools */
  uint64_t id;            /* 1, 2, ... in order of creation */
  bool released;          /* gma_graph_pool_release ran: no capture may use it any more */
  uint32_t captures;      /* captures into it underway */
  size_t nchunks;
  uint64_t bytes, live;
  uint64_t peak_bytes, allocs, frees;
};

struct gma__capture {
  gma_graph_pool_t *pool;
  gma_stream_t handle;    /* the stream gma_capture_begin named */
  gma__stream_t *origin;  /* its record */
  uint64_t id;            /* the device's capture id; 0 until the stream was seen capturing */
  uint64_t serial;        /* gma's own, never reused */
};


void gma__graphs_init(gma__graphs_t *gs, gma__pool_t *p, gma__device_t *dev) {
  memset(gs, 0, sizeof *gs);
  pthread_mutex_init(&gs->lock, NULL);
  gs->p = p;
  gs->dev = dev;
}

/* ---- Lookup ---------------------------------------------------------------- */

/* Index of the first chunk whose base is above addr. */
static size_t chunk_upper(const gma__graphs_t *gs, uintptr_t addr) {
  size_t lo = 0, hi = gma__load_relaxed(&gs->nchunks);
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (gs->chunks[mid]->base <= addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static gma__gchunk_t *chunk_containing(const gma__graphs_t *gs, uintptr_t addr) {
  size_t i = chunk_upper(gs, addr);
  if (!i) return NULL;
  gma__gchunk_t *c = gs->chunks[i - 1];
  return addr < c->base + c->size ? c : NULL;
}

static gblock_t *block_containing(const gma__gchunk_t *c, uintptr_t addr) {
  for (gblock_t *b = c->first; b; b = b->next)
    if (addr >= b->addr && addr < b->addr + b->size) return b;
  return NULL;
}

/* The live pool at handle, or NULL (a handle is only compared until found:
 * a stale or foreign one is never read). */
static gma_graph_pool_t *pool_find(const gma__graphs_t *gs, const gma_graph_pool_t *handle) {
  for (gma_graph_pool_t *q = gs->pools; q; q = q->next)
    if (q == handle && !q->released) return q;
  return NULL;
}

/* The capture with the device's capture id, binding the captures whose id
 * is not known yet by asking about their streams (one was told of before
 * cuStreamBeginCapture ran). */
static gma__capture_t *capture_by_id(gma__graphs_t *gs, uint64_t id) {
  for (size_t i = 0; i < gs->ncaps; i++) {
    gma__capture_t *c = &gs->caps[i];
    if (!c->id) {
      bool on = false;
      uint64_t cid = 0;
      if (gs->dev->ops->stream_capture(gs->dev, c->handle, &on, &cid) == GMA_OK && on) c->id = cid;
    }
    if (c->id && c->id == id) return c;
  }
  return NULL;
}

/* ---- Chunks and blocks ------------------------------------------------------- */

static void chunk_insert(gma__graphs_t *gs, gma__gchunk_t *c) {
  size_t n = gma__load_relaxed(&gs->nchunks), i = chunk_upper(gs, c->base);
  memmove(&gs->chunks[i + 1], &gs->chunks[i], (n - i) * sizeof *gs->chunks);
  gs->chunks[i] = c;
  gma__store_relaxed(&gs->nchunks, (uint32_t)(n + 1));
}

static void chunk_remove(gma__graphs_t *gs, gma__gchunk_t *c) {
  size_t n = gma__load_relaxed(&gs->nchunks), i = chunk_upper(gs, c->base) - 1;
  GMA__ASSERT(gs->chunks[i] == c);
  memmove(&gs->chunks[i], &gs->chunks[i + 1], (n - i - 1) * sizeof *gs->chunks);
  gma__store_relaxed(&gs->nchunks, (uint32_t)(n - 1));
}

/* Takes a chunk for want bytes from the pool below: only memory no device
 * work can still use (GMA__ALLOC_CAPTURE), 2 MiB pieces (small requests share
 * one), or exactly what is asked when the rounding does not fit. */
static gma_status_t chunk_add(gma__graphs_t *gs, gma_graph_pool_t *pool, gma_stream_t stream,
                              uint64_t sid, uint64_t want, gblock_t **out) {
  size_t n = gma__load_relaxed(&gs->nchunks);
  if (n == gs->chunks_cap) {
    size_t cap = gs->chunks_cap ? 2 * gs->chunks_cap : 16;
    gma__gchunk_t **grown = realloc(gs->chunks, cap * sizeof *grown);
    if (!grown) return gma__set_error(GMA_ERR_OOM, "host memory for a graph pool's chunk table");
    gs->chunks = grown;
    gs->chunks_cap = cap;
  }
  gma__gchunk_t *c = calloc(1, sizeof *c);
  gblock_t *b = calloc(1, sizeof *b);
  if (!c || !b) {
    free(c);
    free(b);
    return gma__set_error(GMA_ERR_OOM, "host memory for a graph pool's chunk");
  }
  uint64_t size = want <= CHUNK_SMALL ? CHUNK_ROUND : gma__round_up(want, CHUNK_ROUND);
  unsigned flags = GMA__ALLOC_WAIT | GMA__ALLOC_ARENA | GMA__ALLOC_CAPTURE;
  void *ptr = NULL;
  /* The rounded size first, then exactly what is asked: only the last
   * attempt's OOM counts (num_ooms) or is said. */
  unsigned kept = gma__error_keep();
  gma_status_t st = gma__pool_alloc_slow(gs->p, size, stream, sid,
                                         flags | (size > want ? GMA__ALLOC_UNCOUNTED : 0), &ptr);
  if (st == GMA_ERR_OOM && size > want) {
    size = want;
    st = gma__pool_alloc_slow(gs->p, size, stream, sid, flags, &ptr);
  }
  gma__error_done(kept, st);
  if (st != GMA_OK) {
    free(c);
    free(b);
    return st;
  }
  *b = (gblock_t){.addr = (uintptr_t)ptr, .size = size, .state = GFREE};
  *c = (gma__gchunk_t){.base = (uintptr_t)ptr, .size = size, .pool = pool, .first = b};
  chunk_insert(gs, c);
  pool->nchunks++;
  pool->bytes += size;
  if (pool->bytes > pool->peak_bytes) pool->peak_bytes = pool->bytes;
  *out = b;
  return GMA_OK;
}

/* Gives a chunk with nothing live back to the pool below: stream-ordered on
 * the stream it was taken on, behind any gma_record_stream on its memory. */
/* Frees a chunk's host records (its blocks and itself). */
static void chunk_free(gma__gchunk_t *c) {
  for (gblock_t *b = c->first, *next; b; b = next) {
    next = b->next;
    free(b);
  }
  free(c);
}

static void chunk_give_back(gma__graphs_t *gs, gma__gchunk_t *c) {
  GMA__ASSERT(!c->live);
  chunk_remove(gs, c);
  c->pool->nchunks--;
  c->pool->bytes -= c->size;
  if (gma__pool_free_after(gs->p, (void *)c->base, NULL, 0) != GMA_OK)
    gma__set_error(GMA_ERR_INTERNAL, "a graph pool's chunk at %p was not the pool's",
                   (void *)c->base);
  chunk_free(c);
}

static void pool_unlink_free(gma__graphs_t *gs, gma_graph_pool_t *pool) {
  for (gma_graph_pool_t **pp = &gs->pools; *pp; pp = &(*pp)->next)
    if (*pp == pool) {
      *pp = pool->next;
      break;
    }
  pool->magic = 0;
  free(pool);
}

/* A released pool gives back each chunk as its last block is freed, and
 * goes when its last chunk went. */
static void released_tidy(gma__graphs_t *gs, gma__gchunk_t *c) {
  gma_graph_pool_t *pool = c->pool;
  if (!pool->released || c->live) return;
  chunk_give_back(gs, c);
  if (!pool->nchunks) pool_unlink_free(gs, pool);
}

/* Merges every run of FREE neighbours of c into one block. */
static void coalesce_all(gma__gchunk_t *c) {
  for (gblock_t *b = c->first; b; b = b->next)
    while (b->state == GFREE && b->next && b->next->state == GFREE) {
      gblock_t *n = b->next;
      b->size += n->size;
      b->next = n->next;
      if (n->next) n->next->prev = b;
      free(n);
    }
}

static void mark_free(gblock_t *b) {
  b->state = GFREE;
  b->stream = NULL;
  b->crossed = false;
  b->capture = 0;
}

static void make_free(gma__gchunk_t *c, gblock_t *b) {
  mark_free(b);
  coalesce_all(c);
}

/* Best fit among the pool's blocks a request of size bytes on stream s in
 * capture serial may take: FREE ones, and HELD ones that this capture freed
 * on s and no other stream used. */
static gblock_t *best_fit(gma__graphs_t *gs, gma_graph_pool_t *pool, uint64_t size,
                          const gma__stream_t *s, uint64_t serial, gma__gchunk_t **in) {
  gblock_t *best = NULL;
  size_t n = gma__load_relaxed(&gs->nchunks);
  for (size_t i = 0; i < n; i++) {
    gma__gchunk_t *c = gs->chunks[i];
    if (c->pool != pool) continue;
    for (gblock_t *b = c->first; b; b = b->next) {
      bool usable = b->state == GFREE ||
                    (b->state == GHELD && b->capture == serial && b->stream == s && !b->crossed);
      if (usable && b->size >= size && (!best || b->size < best->size)) {
        best = b;
        *in = c;
      }
    }
  }
  return best;
}

/* Cuts b down to size; the rest, in b's state, follows it. */
static gma_status_t split(gblock_t *b, uint64_t size) {
  if (b->size - size < ROUND) return GMA_OK;
  gblock_t *r = malloc(sizeof *r);
  if (!r) return gma__set_error(GMA_ERR_OOM, "host memory for a graph pool's block");
  *r = *b;
  r->addr = b->addr + size;
  r->size = b->size - size;
  r->prev = b;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  return GMA_OK;
}

/* One request of the capture cap on stream record s (lock held). */
static gma_status_t alloc_one(gma__graphs_t *gs, gma__capture_t *cap, gma__stream_t *s,
                              gma_stream_t stream, uint64_t sid, size_t requested, void **out) {
  uint64_t size = gma__round_up(requested ? requested : 1, ROUND);
  gma__gchunk_t *c = NULL;
  gblock_t *b = best_fit(gs, cap->pool, size, s, cap->serial, &c);
  if (!b) {
    gma_status_t st = chunk_add(gs, cap->pool, stream, sid, size, &b);
    if (st != GMA_OK) return st;
    c = gs->chunks[chunk_upper(gs, b->addr) - 1];
  }
  gma_status_t st = split(b, size);
  if (st != GMA_OK) return st;
  uint64_t held = b->state == GHELD ? b->size : 0; /* already counted in live */
  b->state = GLIVE;
  b->stream = s;
  b->crossed = false;
  b->requested = requested;
  c->live += b->size - held;
  cap->pool->live += b->size - held;
  cap->pool->allocs++;
  gma__tcount_t *tc = gma__tcount(gs->p, s);
  gma__counter_add_owner(&tc->allocs, 1);
  gma__counter_add_owner(&tc->alloc_bytes, b->size);
  gma__counter_add_owner(&tc->inner_bytes, b->size);
  gma__counter_add_owner(&tc->req_bytes, requested);
  *out = (void *)b->addr;
  return GMA_OK;
}

/* Frees the LIVE block b of chunk c (lock held); see gblock_t for where it goes. */
static void free_block(gma__graphs_t *gs, gma__gchunk_t *c, gblock_t *b) {
  gma_graph_pool_t *pool = c->pool;
  gma__tcount_t *tc = gma__tcount(gs->p, b->stream);
  gma__counter_add_owner(&tc->frees, 1);
  gma__counter_add_owner(&tc->free_bytes, b->size);
  gma__counter_add_owner(&tc->inner_freed, b->size);
  gma__counter_add_owner(&tc->req_freed, b->requested);
  pool->frees++;
  /* During a capture into the pool the block may be reused only by that
   * capture's later work on its own stream; the newest capture is the one a
   * free during capture belongs to (captures into one pool are sequential
   * by the pool's rule). */
  uint64_t serial = 0;
  for (size_t i = 0; i < gs->ncaps; i++)
    if (gs->caps[i].pool == pool && gs->caps[i].serial > serial) serial = gs->caps[i].serial;
  if (serial) {
    b->state = GHELD;
    b->capture = serial;
    return; /* still counted in live until the capture ends */
  }
  c->live -= b->size;
  pool->live -= b->size;
  make_free(c, b);
  released_tidy(gs, c);
}

/* ---- Requests ------------------------------------------------------------------ */

gma_status_t gma__graph_alloc(gma__graphs_t *gs, size_t n, const size_t *sizes, size_t size,
                              gma_stream_t stream, void **ptrs) {
  if (!gs->dev->ops->stream_capture) return GMA_PENDING;
  bool on = false;
  uint64_t id = 0, sid = 0;
  gma_status_t st = gs->dev->ops->stream_capture(gs->dev, stream, &on, &id);
  if (st != GMA_OK) return st;
  if (!on) return GMA_PENDING;
  if ((st = gs->dev->ops->stream_id(gs->dev, stream, &sid)) != GMA_OK) return st;
  gma__stream_t *s = NULL;
  if ((st = gma__pool_capture_mark(gs->p, stream, sid, 0, &s)) != GMA_OK) return st;
  gma__lock(&gs->lock, GMA__RANK_GRAPHS);
  gma__capture_t *cap = id ? capture_by_id(gs, id) : NULL;
  if (!cap) {
    gma__unlock(&gs->lock);
    st = gma__pool_refuse_capture(gs->p, stream, sizes ? "gma_alloc_batch" : "gma_alloc");
    return st != GMA_OK ? st : GMA_PENDING; /* the capture ended meanwhile */
  }
  size_t got = 0;
  for (; got < n && st == GMA_OK; got++) {
    st = alloc_one(gs, cap, s, stream, sid, sizes ? sizes[got] : size, &ptrs[got]);
    if (st != GMA_OK) break;
  }
  if (st != GMA_OK) /* all or none: the ones served go back as if freed at once */
    for (size_t i = 0; i < got; i++) {
      gma__gchunk_t *c = chunk_containing(gs, (uintptr_t)ptrs[i]);
      gblock_t *b = block_containing(c, (uintptr_t)ptrs[i]);
      free_block(gs, c, b);
      ptrs[i] = NULL;
    }
  gma__unlock(&gs->lock);
  return st;
}

/* Whether ptr may be a graph pool's: lock-free, so that frees of the pool's
 * own blocks stay cheap while graph pools exist. A block start the pool
 * knows that is no arena is not a graph pool's; anything else (an arena's
 * start, an address inside one, or an unknown one) is looked up. */
static bool maybe_graph(gma__graphs_t *gs, uintptr_t addr) {
  if (!gma__load_relaxed(&gs->nchunks)) return false;
  gma__block_t *b = gma__pagemap_get(&gs->p->pagemap, addr);
  return !b || gma__load_relaxed(&b->arena);
}

/* Takes the lock and returns the chunk holding addr; NULL, with the lock
 * released, when no graph pool holds it. */
static gma__gchunk_t *lock_chunk(gma__graphs_t *gs, uintptr_t addr) {
  gma__lock(&gs->lock, GMA__RANK_GRAPHS);
  gma__gchunk_t *c = chunk_containing(gs, addr);
  if (!c) gma__unlock(&gs->lock);
  return c;
}

gma_status_t gma__graph_free(gma__graphs_t *gs, void *ptr) {
  uintptr_t addr = (uintptr_t)ptr;
  gma__gchunk_t *c = maybe_graph(gs, addr) ? lock_chunk(gs, addr) : NULL;
  if (!c) return GMA_PENDING;
  gblock_t *b = block_containing(c, addr);
  gma_status_t st = GMA_OK;
  if (b && b->addr == addr && b->state == GLIVE)
    free_block(gs, c, b);
  else if (b && b->addr == addr)
    st = gma__set_error(GMA_ERR_DOUBLE_FREE,
                        "gma_free(%p): double free of graph pool memory (freed before and not "
                        "allocated again since)",
                        ptr);
  else
    st = gma__set_error(GMA_ERR_INVALID_POINTER,
                        "gma_free(%p): not the start of an allocation: it lies %" PRIu64
                        " bytes into a graph pool's %s block at %p; pass the pointer gma_alloc "
                        "returned",
                        ptr, b ? (uint64_t)(addr - b->addr) : 0,
                        b && b->state == GLIVE ? "live" : "free", b ? (void *)b->addr : NULL);
  gma__unlock(&gs->lock);
  return st;
}

int gma__graph_info(gma__graphs_t *gs, const void *ptr, gma_pointer_info_t *r) {
  uintptr_t addr = (uintptr_t)ptr;
  gma__gchunk_t *c = gma__load_relaxed(&gs->nchunks) ? lock_chunk(gs, addr) : NULL;
  if (!c) return 0;
  gblock_t *b = block_containing(c, addr);
  int found = b && b->state == GLIVE ? 1 : -1;
  if (found > 0) {
    r->kind = GMA_MEMORY_DEVICE;
    r->base = (void *)b->addr;
    r->requested = b->requested;
    r->block_size = b->size;
    r->stream = b->stream ? b->stream->handle : NULL;
    r->tag = NULL;
  }
  gma__unlock(&gs->lock);
  return found;
}

gma_status_t gma__graph_record_stream(gma__graphs_t *gs, void *ptr, gma_stream_t stream,
                                      void **base) {
  uintptr_t addr = (uintptr_t)ptr;
  gma__gchunk_t *c = gma__load_relaxed(&gs->nchunks) ? lock_chunk(gs, addr) : NULL;
  if (!c) return GMA_PENDING;
  gblock_t *b = block_containing(c, addr);
  gma_status_t st;
  if (!b || b->state != GLIVE || addr - b->addr >= (b->requested ? b->requested : 1)) {
    st = gma__set_error(GMA_ERR_INVALID_POINTER,
                        "gma_record_stream(%p): graph pool memory that is not allocated (or "
                        "past the bytes asked for, in gma's rounding)", ptr);
  } else {
    /* The chunk carries the gate in the pool below, so it goes back only
     * after that stream's work; and the block is not reused inside the
     * capture, whose stream order does not cover the other stream. */
    void *chunk_base = NULL;
    st = gma__pool_record_stream(gs->p, (void *)c->base, stream, &chunk_base);
    if (st == GMA_OK) {
      if (b->stream && stream != b->stream->handle) b->crossed = true;
      *base = (void *)b->addr;
    }
  }
  gma__unlock(&gs->lock);
  return st;
}

/* ---- Pools and captures ---------------------------------------------------- */

gma_status_t gma__graph_pool_create(gma__graphs_t *gs, gma_graph_pool_t **out) {
  gma_graph_pool_t *pool = calloc(1, sizeof *pool);
  if (!pool) return gma__set_error(GMA_ERR_OOM, "host memory for a graph pool");
  gma__lock(&gs->lock, GMA__RANK_GRAPHS);
  pool->magic = GRAPH_MAGIC;
  pool->id = ++gs->pools_made;
  pool->next = gs->pools;
  gs->pools = pool;
  gma__unlock(&gs->lock);
  *out = pool;
  return GMA_OK;
}

static gma_status_t no_pool(const char *fn, const gma_graph_pool_t *pool) {
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "%s: %p is not a graph pool of this allocator (not made by "
                        "gma_graph_pool_create on it, or released already)",
                        fn, (const void *)pool);
}

gma_status_t gma__graph_pool_release(gma__graphs_t *gs, gma_graph_pool_t *pool) {
  gma__lock(&gs->lock, GMA__RANK_GRAPHS);
  gma_graph_pool_t *q = pool_find(gs, pool);
  gma_status_t st = GMA_OK;
  if (!q) st = no_pool("gma_graph_pool_release", pool);
  else if (q->captures)
    st = gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "gma_graph_pool_release: %u capture%s into graph pool %" PRIu64
                        " %s not ended; call gma_capture_end first",
                        q->captures, q->captures == 1 ? "" : "s", q->id,
                        q->captures == 1 ? "has" : "have");
  if (st != GMA_OK) {
    gma__unlock(&gs->lock);
    return st;
  }
  /* Graphs launched before now may still run on any stream: once the device
   * finished them, the free chunks go back; the rest as they are freed. */
  if (q->nchunks && (st = gs->dev->ops->device_synchronize(gs->dev)) != GMA_OK) {
    gma__unlock(&gs->lock);
    return st;
  }
  q->released = true;
  for (size_t i = gma__load_relaxed(&gs->nchunks); i-- > 0;) {
    gma__gchunk_t *c = gs->chunks[i];
    if (c->pool == q && !c->live) chunk_give_back(gs, c);
  }
  if (!q->nchunks) pool_unlink_free(gs, q);
  gma__unlock(&gs->lock);
  return GMA_OK;
}

gma_status_t gma__capture_begin(gma__graphs_t *gs, gma_stream_t stream, gma_graph_pool_t *pool) {
  if (!gs->dev->ops->stream_capture)
    return gma__set_error(GMA_ERR_UNSUPPORTED,
                          "gma_capture_begin: the %s device has no stream capture (CUDA graphs "
                          "need device:cuda)",
                          gs->dev->name);
  uint64_t sid = 0, id = 0;
  bool on = false;
  gma_status_t st = gs->dev->ops->stream_id(gs->dev, stream, &sid);
  if (st == GMA_OK) st = gs->dev->ops->stream_capture(gs->dev, stream, &on, &id);
  if (st != GMA_OK) return st;
  gma__lock(&gs->lock, GMA__RANK_GRAPHS);
  gma_graph_pool_t *q = pool_find(gs, pool);
  for (size_t i = 0; q && i < gs->ncaps && st == GMA_OK; i++)
    if (gs->caps[i].handle == stream && gs->caps[i].origin->id == sid)
      st = gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "gma_capture_begin: stream %p already has a capture gma was told of; "
                          "call gma_capture_end first",
                          stream);
  if (!q) st = no_pool("gma_capture_begin", pool);
  if (st == GMA_OK && gs->ncaps == gs->caps_cap) {
    size_t cap = gs->caps_cap ? 2 * gs->caps_cap : 4;
    gma__capture_t *grown = realloc(gs->caps, cap * sizeof *grown);
    if (!grown) st = gma__set_error(GMA_ERR_OOM, "host memory for a capture record");
    else {
      gs->caps = grown;
      gs->caps_cap = cap;
    }
  }
  gma__stream_t *s = NULL;
  if (st == GMA_OK) st = gma__pool_capture_mark(gs->p, stream, sid, 1, &s);
  if (st == GMA_OK) {
    gs->caps[gs->ncaps++] = (gma__capture_t){
        .pool = q, .handle = stream, .origin = s, .id = on ? id : 0, .serial = ++gs->serial};
    q->captures++;
    gma__faa_relaxed(&gs->capturing, 1);
  }
  gma__unlock(&gs->lock);
  return st;
}

gma_status_t gma__capture_end(gma__graphs_t *gs, gma_stream_t stream) {
  uint64_t sid = 0;
  gma_status_t st = gs->dev->ops->stream_id(gs->dev, stream, &sid);
  if (st != GMA_OK) return st;
  gma__lock(&gs->lock, GMA__RANK_GRAPHS);
  size_t i = 0;
  while (i < gs->ncaps && !(gs->caps[i].handle == stream && gs->caps[i].origin->id == sid)) i++;
  if (i == gs->ncaps) {
    gma__unlock(&gs->lock);
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "gma_capture_end: stream %p has no capture gma was told of "
                          "(gma_capture_begin)",
                          stream);
  }
  gma__capture_t cap = gs->caps[i];
  gs->caps[i] = gs->caps[--gs->ncaps];
  cap.pool->captures--;
  /* What this capture freed is free for the pool's later captures now. */
  for (size_t k = 0; k < gma__load_relaxed(&gs->nchunks); k++) {
    gma__gchunk_t *c = gs->chunks[k];
    if (c->pool != cap.pool) continue;
    bool freed = false;
    for (gblock_t *b = c->first; b; b = b->next)
      if (b->state == GHELD && b->capture == cap.serial) {
        c->live -= b->size;
        cap.pool->live -= b->size;
        mark_free(b);
        freed = true;
      }
    if (freed) coalesce_all(c);
  }
  gma__pool_capture_mark(gs->p, stream, sid, -1, NULL);
  gma__faa_relaxed(&gs->capturing, (uint32_t)-1);
  gma__unlock(&gs->lock);
  return GMA_OK;
}

gma_status_t gma__graph_pool_stats(gma__graphs_t *gs, gma_graph_pool_t *pool,
                                   gma_graph_pool_stats_t *out) {
  gma__lock(&gs->lock, GMA__RANK_GRAPHS);
  gma_graph_pool_t *q = pool_find(gs, pool);
  if (!q) {
    gma__unlock(&gs->lock);
    return no_pool("gma_graph_pool_stats", pool);
  }
  gma_graph_pool_stats_t st;
  memset(&st, 0, sizeof st);
  st.size = out->size;
  st.id = q->id;
  st.reserved_bytes = q->bytes;
  st.peak_reserved_bytes = q->peak_bytes;
  st.allocated_bytes = q->live;
  st.chunks = q->nchunks;
  st.captures = q->captures;
  st.allocs = q->allocs;
  st.frees = q->frees;
  gma__unlock(&gs->lock);
  size_t n = out->size < sizeof st ? out->size : sizeof st;
  memcpy(out, &st, n);
  return GMA_OK;
}

void gma__graphs_totals(gma__graphs_t *gs, uint64_t *pools, uint64_t *bytes, uint64_t *live) {
  *pools = *bytes = *live = 0;
  gma__lock(&gs->lock, GMA__RANK_GRAPHS);
  for (gma_graph_pool_t *q = gs->pools; q; q = q->next) {
    *pools += !q->released;
    *bytes += q->bytes;
  }
  /* Live allocations only: a block freed during a capture is no longer
   * counted as allocated by gma_stats, though only its capture may reuse it. */
  for (size_t i = 0; i < gma__load_relaxed(&gs->nchunks); i++)
    for (const gblock_t *b = gs->chunks[i]->first; b; b = b->next)
      if (b->state == GLIVE) *live += b->size;
  gma__unlock(&gs->lock);
}

/* Frees the pools' records and the tables (the chunks are gone already). */
static void records_free(gma__graphs_t *gs) {
  while (gs->pools) pool_unlink_free(gs, gs->pools);
  free(gs->chunks);
  free(gs->caps);
  gs->chunks = NULL;
  gs->caps = NULL;
  gs->ncaps = gs->caps_cap = gs->chunks_cap = 0;
}

void gma__graphs_fini(gma__graphs_t *gs, uint64_t *leaks, uint64_t *leaked) {
  *leaks = *leaked = 0;
  for (size_t i = gma__load_relaxed(&gs->nchunks); i-- > 0;) {
    gma__gchunk_t *c = gs->chunks[i];
    for (gblock_t *b = c->first; b; b = b->next)
      if (b->state == GLIVE) {
        (*leaks)++;
        *leaked += b->size;
        gma__tcount_t *tc = gma__tcount(gs->p, b->stream);
        gma__counter_add_owner(&tc->frees, 1);
        gma__counter_add_owner(&tc->free_bytes, b->size);
        gma__counter_add_owner(&tc->inner_freed, b->size);
        gma__counter_add_owner(&tc->req_freed, b->requested);
      }
    c->live = 0;
    chunk_give_back(gs, c);
  }
  records_free(gs);
  pthread_mutex_destroy(&gs->lock);
}

void gma__graphs_forget(gma__graphs_t *gs) {
  for (size_t i = 0; i < gma__load_relaxed(&gs->nchunks); i++) chunk_free(gs->chunks[i]);
  gma__store_relaxed(&gs->nchunks, 0);
  records_free(gs);
}
