/* The pool: segments taken from the device, the blocks they are cut into, the
 * shared free trees, the stream records with their epochs, and the counters.
 *
 * Lock order (the whole of it, for now): gma__pool_t.lock is the only lock in
 * the allocator; device calls are made while holding it, and device backends
 * take only their own internal locks, never calling back into the pool.
 * Everything in this header is guarded by gma__pool_t.lock unless a field says
 * otherwise. */
#ifndef GMA_POOL_H
#define GMA_POOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "device/device.h"
#include "gma.h"
#include "ptrmap.h"

#define GMA__ROUND 512u       /* every block size is a multiple of this */
#define GMA__MIN_SPLIT 512u   /* a split leaves a remainder at least this large */
#define GMA__EPOCH_EVENTS 16u /* outstanding epoch events per stream */

enum { GMA__SMALL = 0, GMA__LARGE = 1, GMA__NKINDS = 2 };

/* Block states; see design.md's lifecycle. FREE: in the pool's free tree,
 * usable on any stream. LIVE: handed out. CACHED: freed on its stream, usable
 * there at once, FREE once its epoch completes. PENDING: freed but used by
 * other streams too, FREE once every gate has passed. */
typedef enum gma__block_state {
  GMA__FREE = 0,
  GMA__LIVE = 1,
  GMA__CACHED = 2,
  GMA__PENDING = 3
} gma__block_state_t;

struct gma__stream;
struct gma__segment;

/* A gate is passed once stream->safe_epoch >= epoch: all work queued on the
 * stream before the block was freed has finished. */
typedef struct gma__gate {
  struct gma__stream *stream;
  uint64_t epoch;
} gma__gate_t;

/* Invariants (checked by gma__pool_is_valid):
 *   addr == prev->addr + prev->size, and the blocks of a segment tile it;
 *   size % GMA__ROUND == 0 and addr % 512 == 0;
 *   two FREE neighbours never coexist (they are coalesced);
 *   state FREE <=> in free_tree[seg->kind]; CACHED <=> in stream's tree and FIFO;
 *   PENDING <=> in pool pending list; LIVE <=> in the live map. */
typedef struct gma__block {
  uintptr_t addr;
  uint64_t size;
  uint64_t requested;            /* LIVE: bytes the caller asked for */
  struct gma__segment *seg;
  struct gma__block *prev, *next;  /* address neighbours in the segment */
  struct gma__block *left, *right; /* size tree, keyed by (size, addr) */
  struct gma__block *qprev, *qnext; /* CACHED: stream FIFO; PENDING: pending list */
  struct gma__stream *stream;    /* LIVE/CACHED: owner stream; PENDING: freeing stream */
  uint64_t epoch;                /* CACHED: owner's epoch when freed */
  gma__gate_t *gates;            /* LIVE: streams from record_stream; PENDING: gates */
  uint32_t ngates, gates_cap;
  uint32_t prio;                 /* treap priority */
  uint8_t state;                 /* gma__block_state_t */
} gma__block_t;

typedef struct gma__segment {
  uintptr_t base;
  uint64_t size;
  int kind; /* GMA__SMALL or GMA__LARGE */
  gma__block_t *first;
} gma__segment_t;

/* A stream record: what the pool knows of one stream. Epoch k is the span of
 * frees between the (k-1)th and kth event recorded on the stream; when the kth
 * event completes every block freed in epochs <= k is safe for every stream.
 * Invariants: safe_epoch < epoch; ev_epoch[] increasing from ev_head; the FIFO
 * holds this stream's CACHED blocks with nondecreasing epoch. */
typedef struct gma__stream {
  gma_stream_t handle; /* as passed to the device */
  uintptr_t key;       /* key in the stream map (see streams.c) */
  uint64_t owner_tid;  /* per-thread default stream: the thread that owns it, else 0 */
  uint64_t epoch;      /* the open epoch: blocks freed now carry this number */
  uint64_t safe_epoch; /* every epoch <= this has completed */
  bool dirty;          /* something was freed in the open epoch */
  bool retired;        /* destroyed: everything done, record kept for gates */
  gma__event_t ev[GMA__EPOCH_EVENTS];
  uint64_t ev_epoch[GMA__EPOCH_EVENTS];
  unsigned ev_head, ev_count;
  gma__block_t *cached_tree[GMA__NKINDS];
  gma__block_t *fifo_head, *fifo_tail;
  uint64_t cached_bytes;
  struct gma__stream *next_all;
} gma__stream_t;

/* Counters. Invariant: reserved = allocated + stream_cached + pending + free,
 * and each equals the sum of its blocks' sizes. */
typedef struct gma__counters {
  gma_stat_t allocated, requested, reserved, active, cached;
  uint64_t stream_cached, pending, free;
  uint64_t allocs, frees, device_allocs, device_frees, ooms, oom_retries;
  uint64_t hits_stream, hits_pool, hits_device;
  uint64_t device_errors; /* event failures absorbed while polling epochs */
} gma__counters_t;

/* Test-only switches that plant bugs, so tests can show their detectors work. */
enum {
  GMA__TEST_NO_RECORD_GATING = 1u << 0, /* free ignores record_stream users */
  GMA__TEST_NO_EPOCH_GATING = 1u << 1   /* CACHED blocks become FREE at once */
};

typedef struct gma__pool {
  pthread_mutex_t lock;
  gma__device_t *dev;          /* immutable after init */
  uint64_t small_size;         /* immutable: largest request of the small pool */
  uint64_t segment_size[GMA__NKINDS];
  uint64_t limit;              /* immutable: most bytes to reserve */
  gma__block_t *free_tree[GMA__NKINDS];
  gma__block_t *pending_head;  /* PENDING blocks, linked by qnext/qprev */
  gma__segment_t **segs;       /* sorted by base */
  size_t nsegs, segs_cap;
  gma__ptrmap_t live;          /* addr -> LIVE block */
  gma__ptrmap_t streams;       /* key -> stream record */
  gma__stream_t *stream_list;  /* every record, retired ones too */
  gma__event_t *spare_events;  /* created, unused events for reuse */
  size_t nspare, spare_cap;
  gma__counters_t c;
  uint32_t rng;                /* treap priorities */
  unsigned test_flags;         /* GMA__TEST_*; set by tests before use */
} gma__pool_t;

/* pool.c: all take the pool lock themselves, from any thread. */
gma_status_t gma__pool_init(gma__pool_t *p, gma__device_t *dev, const gma_config_t *cfg);
/* Frees every block and segment; counts and reports live blocks. */
gma_status_t gma__pool_fini(gma__pool_t *p);
gma_status_t gma__pool_alloc(gma__pool_t *p, size_t size, gma_stream_t stream, void **out);
gma_status_t gma__pool_free(gma__pool_t *p, void *ptr);
gma_status_t gma__pool_record_stream(gma__pool_t *p, void *ptr, gma_stream_t stream);
gma_status_t gma__pool_empty_cache(gma__pool_t *p);
/* Forgets a stream the caller has synchronized and is about to destroy. */
gma_status_t gma__pool_stream_retired(gma__pool_t *p, gma_stream_t stream);
void gma__pool_stats(gma__pool_t *p, gma_stats_t *out);
/* Full structural and accounting check; returns false and sets the last error
 * on the first violation. Caller holds the lock. */
bool gma__pool_is_valid(gma__pool_t *p);

/* Internal helpers shared between pool.c and streams.c (lock held). */
void gma__block_make_free(gma__pool_t *p, gma__block_t *b);
void gma__cached_unlink(gma__pool_t *p, gma__block_t *b);
/* PENDING -> FREE for every block whose gates have all passed. */
void gma__pending_poll(gma__pool_t *p);
/* Largest block in the stream caches and free trees. */
uint64_t gma__pool_largest_idle(const gma__pool_t *p);

/* streams.c (lock held). */
/* The record of a stream, made on first use (NULL only when host memory ran
 * out, or when create is false and the stream is unknown). */
gma__stream_t *gma__stream_find(gma__pool_t *p, gma_stream_t handle, bool create);
static inline gma__stream_t *gma__stream_get(gma__pool_t *p, gma_stream_t handle) {
  return gma__stream_find(p, handle, true);
}
/* Closes dirty epochs by recording events, advances safe epochs, and moves
 * blocks whose gates passed to FREE. Never waits for the device. */
void gma__streams_poll(gma__pool_t *p);
void gma__stream_retire(gma__pool_t *p, gma__stream_t *s);
void gma__streams_fini(gma__pool_t *p);
static inline bool gma__gate_passed(const gma__gate_t *g) {
  return g->stream->safe_epoch >= g->epoch;
}

/* api.c: the pool behind an allocator, for internal tests. */
gma__pool_t *gma__pool_of(gma_t *g);

/* stats.c */
void gma__stat_add(gma_stat_t *s, uint64_t bytes);
void gma__stat_sub(gma_stat_t *s, uint64_t bytes);

#if GMA_DEBUG >= 1
#include <stdio.h>
#include <stdlib.h>
#define GMA__ASSERT(cond)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "gma: assertion failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                         \
    }                                                                                  \
  } while (0)
#else
#define GMA__ASSERT(cond) ((void)0)
#endif

/* Level 2 validates the whole pool after every operation (lock held). */
#if GMA_DEBUG >= 2
#define GMA__VALIDATE(p) GMA__ASSERT(gma__pool_is_valid(p))
#else
#define GMA__VALIDATE(p) ((void)0)
#endif

#endif /* GMA_POOL_H */
