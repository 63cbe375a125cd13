/* The allocator's shared state: segments and blocks, the shared free trees,
 * stream records with their lock-free bins and epochs, and the counters.
 * Segment memory comes from the pool's segment source (source.h), which
 * deals only in address ranges; everything built over them is here.
 *
 * Lock order (the whole of it): the process-wide list of pools (stream_cache.c,
 * taken only when a thread exits), then gma__pool_t.lock, then
 * gma__pool_t.count_lock or gma__pool_t.trace_mu (gma_trace_start writes
 * the pool's state under the lock, then publishes the trace under
 * trace_mu), then a trace's own locks (trace.c).
 * Device calls are made while holding the pool lock; device backends take
 * only their own internal locks and never call back. The lock-free paths
 * (stream_cache.c) take no lock when a bin can serve them.
 *
 * Unless a field says otherwise it is guarded by gma__pool_t.lock. Fields
 * marked "atomic" are also touched by the lock-free paths. */
#ifndef GMA_POOL_H
#define GMA_POOL_H

#include <ck_stack.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/atomics.h"
#include "device/device.h"
#include "gma.h"
#include "core/pagemap.h"
#include "source/source.h"
#include "observe/trace.h"

#define GMA__MIN_SPLIT 512u   /* a split leaves a remainder at least this large */
#define GMA__EPOCH_EVENTS 16u /* outstanding epoch events per stream */
#define GMA__TL_SLOTS 8u      /* per-thread cache of (stream -> counters) */
#define GMA__TL_STREAMS 8u    /* per-thread cache of ((pool, stream key) -> record) */
#define GMA__MAX_TAGS 256u    /* tag ids fit a uint8_t; 0 is "untagged" */
#define GMA__DEFERRED_EVENTS 16u /* events kept from destruction while OOM waiters query them */
#define GMA__OOM_WAIT_EVENTS 64u /* streams whose events one OOM wait round queries */

/* Block states; see design.md's lifecycle. FREE: in the pool's free tree,
 * usable on any stream. LIVE: handed out. BINNED: freed into its stream's
 * lock-free bin, reusable there at once. CACHED: the same, but in the stream's
 * tree in the pool (bin full, drained, or too large for bins); FREE once its
 * epoch completes. PENDING: freed but used by other streams too, FREE once
 * every gate has passed. LIVE <-> BINNED transitions happen without the lock;
 * every other transition holds it. */
typedef enum gma__block_state {
  GMA__FREE = 0,
  GMA__LIVE = 1,
  GMA__CACHED = 2,
  GMA__PENDING = 3,
  GMA__BINNED = 4
} gma__block_state_t;

struct gma__stream;
struct gma__segment;

/* A gate is passed once stream->safe_epoch >= epoch. */
typedef struct gma__gate {
  struct gma__stream *stream;
  uint64_t epoch;
} gma__gate_t;

/* Invariants (checked by gma__pool_is_valid):
 *   addr == prev->addr + prev->size, and the blocks of a segment tile it;
 *   size % GMA__ROUND == 0 and addr % 512 == 0; the page map maps addr to it;
 *   two FREE neighbours never coexist (they are coalesced);
 *   FREE <=> in free_tree[seg->kind]; CACHED <=> in its stream's tree and FIFO;
 *   PENDING <=> in the pending list; BINNED <=> in one bin of its stream.
 * Block records are never freed while the allocator lives (recycled through
 * spare_blocks), so a lock-free reader may hold a stale pointer safely. */
typedef struct gma__block {
  /* Own cache lines: the lock-free paths write state, epoch and bin_link, and
   * records of blocks used by different threads must not share a line. */
  _Alignas(64) ck_stack_entry_t bin_link; /* BINNED: link in its bin (ck_stack, mpmc) */
  uintptr_t addr;
  uint64_t size;
  _Atomic uint64_t requested;    /* LIVE: bytes the caller asked for (atomic: the lock-free
                                    alloc writes it, reports read it under the lock) */
  struct gma__segment *seg;
  struct gma__block *prev, *next;  /* address neighbours in the segment */
  struct gma__block *left, *right; /* size tree, keyed by (size, addr) */
  struct gma__block *qprev, *qnext; /* CACHED: stream FIFO; PENDING: pending list */
  struct gma__stream *stream;    /* LIVE/BINNED/CACHED: owner stream; PENDING: freeing one */
  uint64_t epoch;                /* BINNED/CACHED/PENDING: owner's epoch when freed */
  gma__gate_t *gates;            /* LIVE: streams from record_stream; PENDING: gates */
  _Atomic uint32_t ngates;       /* atomic: read by the lock-free free path */
  uint32_t gates_cap;
  uint32_t prio;                 /* treap priority */
  _Atomic uint8_t state;         /* atomic: gma__block_state_t */
  _Atomic uint8_t future_held;   /* LIVE: a completed future got it and nobody collected it
                                    yet (gma_destroy frees it quietly, not as a leak) */
  _Atomic uint8_t arena;         /* LIVE: an arena (GMA__ALLOC_ARENA), whose memory the layer
                                    above sub-allocates (atomic: read by graph.c's lock-free
                                    test of a pointer; set and cleared under the lock) */
  uint64_t free_since_ns;        /* FREE in a growable segment: when a trim pass first saw
                                    it free (its idle clock); 0 otherwise */
  _Atomic uint8_t tag;           /* LIVE: its tag's id (0: untagged); atomic: set by the
                                    owner after the allocation, read by snapshots */
  _Atomic uint64_t born_ns;      /* LIVE: the pool's clock when it was handed out (atomic:
                                    written without the lock, read by age reports) */
} gma__block_t;

/* A segment: device memory the pool owns, tiled by blocks, from the pool's
 * segment source (source.h). An ordinary one is one device allocation; one
 * with a range is a run of adjacent memory of one growable range, extended,
 * merged and split by the pool (segments.c) as the source maps and gives
 * back chunks. */
typedef struct gma__segment {
  uintptr_t base;
  uint64_t size;
  int kind; /* GMA__SMALL or GMA__LARGE */
  gma__block_t *first, *last;
  const void *range;      /* the source's range (compared, never read); NULL: ordinary */
  uint64_t free_since_ns; /* ordinary: when a trim pass first saw it wholly free; 0: not free */
  uint64_t home;          /* serial of the stream whose request made it, whose searches
                             prefer it under reuse:auto (find_fit); 0: none (the worker's
                             growth ahead). Growable memory of two homes is never one
                             segment (gma__segs_adopt), so it never coalesces */
} gma__segment_t;

/* One lock-free bin: blocks of one size class freed on one stream.
 * ck_stack in mpmc mode (push_mpmc / pop_mpmc / batch_pop_mpmc): any thread
 * pushes and pops, and pop_mpmc's generation counter makes a block popped and
 * pushed again safe (ABA). The 16-byte CAS needs 16-byte alignment.
 * count is a soft bound on the depth, updated with a relaxed load and store
 * (no locked instruction on the hot path): when two threads share a stream an
 * update can be lost, so the bound is approximate; every drain resets it. It
 * only decides when a free overflows into the stream's tree in the pool. */
typedef struct gma__bin {
  _Alignas(16) ck_stack_t stack;
  _Atomic int32_t count;
} gma__bin_t;

/* Counters of one (stream, thread) pair. Only the owning thread writes them
 * (gma__counter_add_owner: no locked instruction); readers sum all of a
 * stream's with relaxed loads. All are totals that only grow, so currents are
 * differences: allocated = alloc_bytes - free_bytes. */
typedef struct gma__tcount {
  /* Own cache lines: counters of threads running side by side must not share. */
  _Alignas(64) _Atomic uint64_t allocs;
  _Atomic uint64_t frees, hits;
  _Atomic uint64_t alloc_bytes, free_bytes, req_bytes, req_freed;
  _Atomic uint64_t bin_in, bin_out; /* bytes pushed into / taken out of bins */
  /* Bytes of allocations placed inside arenas (planned blocks, graph pools'
   * blocks), handed out and freed: also in alloc_bytes / free_bytes. */
  _Atomic uint64_t inner_bytes, inner_freed;
  uint64_t owner_tid;
  struct gma__tcount *_Atomic next; /* atomic: append-only list, read lock-free */
} gma__tcount_t;

/* A stream record. Epoch k is the span of frees between the (k-1)th and kth
 * event recorded on the stream; when the kth event completes every block freed
 * in epochs <= k is safe for every stream.
 * Invariants: safe_epoch < epoch unless retired; ev_epoch[] increasing from
 * ev_head; the FIFO holds this stream's CACHED blocks by nondecreasing epoch.
 * Records are freed only at destroy (lock-free readers may hold them). */
typedef struct gma__stream {
  _Alignas(64) gma_stream_t handle; /* as passed to the device (own cache lines: see block) */
  uintptr_t key;             /* key in the stream table (see stream_cache.c) */
  uint64_t id;               /* the device's unique stream id */
  uint64_t serial;           /* never reused: validates per-thread caches */
  uint64_t owner_tid;        /* per-thread default stream: its thread, else 0 */
  bool foreign;              /* immutable: of another context than the device's (CUDA):
                                its events are its own, made for it, never pooled */
  _Atomic uint64_t epoch;    /* atomic: the open epoch, read by the lock-free free */
  _Atomic bool dirty;        /* atomic: something was freed in the open epoch */
  _Atomic bool retired;      /* atomic: retired or orphaned; lock-free paths stay away */
  uint64_t free_epoch;       /* retired: the epoch later frees carry */
  uint64_t safe_epoch;       /* every epoch <= this has completed */
  gma__event_t ev[GMA__EPOCH_EVENTS];
  uint64_t ev_epoch[GMA__EPOCH_EVENTS];
  unsigned ev_head, ev_count;
  gma__block_t *cached_tree[GMA__NKINDS];
  gma__block_t *fifo_head, *fifo_tail;
  uint64_t cached_bytes;     /* CACHED bytes (bins not included) */
  gma__bin_t *bins;          /* nbins bins, or NULL when bins are off */
  uint32_t captures;         /* captures gma was told of with this stream as origin
                                (gma__pool_capture_mark): no epoch event while nonzero */
  bool referenced;           /* scratch of the retired-record sweep (streams.c) */
  bool swept;                /* moved to the graveyard (retired, nothing referenced it) */
  gma__tcount_t *_Atomic counts; /* atomic: per-thread counters, append-only */
  gma__tcount_t buried;      /* swept: the totals already added to graveyard_counts */
  struct gma__stream *next_all;
} gma__stream_t;

/* The stream table: open addressing, keys and records published with release
 * stores, read lock-free; inserts and removals under the pool lock. Grown by
 * copying into a new table; old tables are kept until destroy so a reader
 * still probing one is safe. */
#define GMA__KEY_EMPTY ((uintptr_t)0)
#define GMA__KEY_TOMB ((uintptr_t)0x8)
typedef struct gma__stable_slot {
  _Atomic uintptr_t key;
  gma__stream_t *_Atomic rec;
} gma__stable_slot_t;
typedef struct gma__stable {
  size_t capacity, used; /* used counts tombstones too */
  struct gma__stable *older;
  gma__stable_slot_t slots[];
} gma__stable_t;

/* Counters kept under the lock. Invariant (pool side, exact at all times):
 * reserved = (LIVE + BINNED bytes) + stream_cached + pending + free. */
typedef struct gma__counters {
  gma_stat_t reserved;
  gma_stat_t allocated, requested, active, cached; /* peaks sampled, see stats.c */
  uint64_t stream_cached, pending, free;
  uint64_t device_allocs, device_frees, ooms, oom_retries, oom_waits;
  uint64_t hits_stream, hits_pool, hits_device;
  uint64_t cross_stream_waits, epoch_events;
  uint64_t batches, batches_split, bytes_trimmed, trims_explicit;
  uint64_t trims_timed, trims_idle, trims_pressure, grows_worker, grows_inline;
  uint64_t worker_wakeups;
  int pressure_level;
  uint64_t device_errors; /* event failures absorbed while polling epochs */
  /* Arenas (GMA__ALLOC_ARENA: planned memory's, plan.c, and graph pools'
   * chunks, graph.c) are LIVE blocks of the pool; gma_stats shows the
   * allocations inside them instead, so stats.c takes these out: bytes held
   * now, bytes ever taken, arenas taken and given back. */
  uint64_t arena, arena_total, arena_allocs, arena_frees;
  /* Of allocated.current, the bytes inside arenas (sampled with it): the
   * memory that stays in use whatever device work completes is
   * allocated.current - inner_live + arena. */
  uint64_t inner_live;
} gma__counters_t;

/* Test-only switches that plant bugs, so tests can show their detectors work. */
enum {
  GMA__TEST_NO_RECORD_GATING = 1u << 0, /* free ignores record_stream users */
  GMA__TEST_NO_EPOCH_GATING = 1u << 1,  /* freed blocks become FREE at once */
  GMA__TEST_NO_SERVE_CLAIM = 1u << 2,   /* a waiter serves a request without claiming it
                                           from the worker (future.c: both serve it) */
  GMA__TEST_NO_CAPTURE_CHECK = 1u << 3, /* epoch events are recorded on capturing streams */
  GMA__TEST_NO_CONSUMER_WAIT = 1u << 4  /* reuse:auto hands a consumer a pending block
                                           without making it wait for the block's stream,
                                           and an owner its own (reclaim_own_pending)
                                           without waiting for the streams that used them,
                                           and reuse:wait another stream's cached block
                                           joined with FREE memory (wait_join_fit) without
                                           waiting for that stream */
};

typedef struct gma__pool {
  pthread_mutex_t lock;
  pthread_mutex_t count_lock;   /* guards appends to stream->counts */
  gma__device_t *dev;           /* immutable after init */
  uint64_t serial;              /* immutable: never reused (gma__pool_init), validates the
                                   per-thread stream cache (stream_cache.c) */
  uint64_t small_size;          /* immutable: largest request of the small pool */
  uint64_t segment_size[GMA__NKINDS];
  uint64_t limit;               /* immutable: most bytes to reserve */
  gma_reuse_t reuse;            /* immutable */
  uint64_t oom_wait_ns;         /* immutable: the OOM path's wait bound (UINT64_MAX: none) */
  uint64_t bin_max;             /* immutable: largest request the bins serve; 0 = bins off */
  uint32_t bin_depth;           /* immutable */
  unsigned nbins;               /* immutable: classes 0..nbins-1 */
  unsigned test_flags;          /* GMA__TEST_*; set by tests before use */
  gma__pagemap_t pagemap;       /* own synchronization (see pagemap.h) */
  gma__stable_t *_Atomic stable; /* atomic: the stream table */
  gma__block_t *free_tree[GMA__NKINDS];
  gma__block_t *pending_head;   /* PENDING blocks, linked by qnext/qprev */
  char last_device_error[256];  /* lock: what the last absorbed device failure said */
  gma__segment_t **segs;        /* sorted by base */
  size_t nsegs, segs_cap;
  gma__stream_t *stream_list;   /* live records, and retired ones still referenced */
  gma__stream_t *graveyard;     /* retired, unreferenced records: kept (lock-free readers
                                   may still hold them) but no longer walked; freed at destroy */
  gma__tcount_t graveyard_counts; /* the graveyard's counters, folded in */
  size_t retired_listed, sweep_at; /* retired records in stream_list; sweep threshold */
  gma__block_t *spare_blocks;   /* recycled block records (linked by next) */
  void **block_chunks;          /* every block chunk, freed at destroy */
  size_t nchunks, chunks_cap;
  gma__source_t *src;           /* where segments come from (source.h); its calls hold the
                                   lock except give_back */
  bool growable;                /* immutable: src is growable ranges (expandable_segments) */
  gma__tail_t *tails;           /* segments.c: a growth's offer to the source (scratch) */
  gma__block_t **tail_blocks;   /* the FREE blocks ending those segments */
  size_t tails_cap;
  gma__event_t *spare_events;   /* created, unused events for reuse */
  size_t nspare, spare_cap;
  uint32_t event_pins;          /* OOM waiters querying copied events without the lock */
  uint64_t leaving;             /* bytes a trim took out of reserved and is giving back to
                                   the device outside the lock; counted against the limit */
  pthread_cond_t settled;       /* broadcast (under lock) when a trim's give-back settled */
  bool inherited;               /* torn down in a fork() child (fork.c) */
  gma__event_t deferred[GMA__DEFERRED_EVENTS]; /* events to destroy once unpinned */
  size_t ndeferred;
  gma__counters_t c;
  uint32_t rng;                 /* treap priorities */
  gma__trace_t *_Atomic trace;  /* atomic: the recording trace or NULL (see trace.h) */
  gma__trace_t *traces;         /* trace_mu: every trace started, newest first (freed at
                                   destroy; older ones linked by ->older) */
  pthread_mutex_t trace_mu;     /* serializes gma_trace_start/stop */
  _Atomic uint64_t trace_ids;   /* atomic: ids of batches and futures in the trace */
  /* Tags (tags.c): names[1..ntags], published with a release store of ntags
   * and never changed after; appended under lock. names[0] is "untagged". */
  char tag_names[GMA__MAX_TAGS][32];
  _Atomic uint32_t ntags;
  /* A coarse clock for allocation ages: reading the real clock costs more
   * than a whole bin hit on some machines (85 ns on the CI VM), so the hot
   * path copies this instead. Set by the worker's ticks, age reports, and
   * the slow path when there is no worker. */
  _Atomic uint64_t clock_ns;
  bool clock_in_slow_path;      /* immutable: no worker ticks the clock */
  struct gma__pool *next_pool;  /* the process-wide list of pools (stream_cache.c) */
  bool listed;                  /* on that list (guarded by its mutex) */
} gma__pool_t;

/* CLOCK_MONOTONIC in ns; any thread. */
uint64_t gma__now_ns(void);
/* Sets the pool's coarse clock to now; any thread. */
void gma__pool_tick_clock(gma__pool_t *p);
/* Lock held: bytes that may still be reserved below memory_limit (what a
 * trim is giving back counts as held until it settles), rounded down to 512. */
uint64_t gma__pool_room(const gma__pool_t *p);

/* Records a pool event when a trace runs (one load and branch when not). */
#define GMA__TRACE(p, action, ptr, size, stream, block, id, count, status)                    \
  do {                                                                                      \
    gma__trace_t *t_ = gma__trace_on(&(p)->trace);                                          \
    if (t_)                                                                                 \
      gma__trace_emit(t_, gma__trace_now(), (action), (uint64_t)(ptr), (uint64_t)(size),    \
                      (uint64_t)(uintptr_t)(stream), (uint64_t)(block), (uint64_t)(id),     \
                      (uint64_t)(count), (int)(status));                                    \
  } while (0)

/* pool.c: public operations; each takes the lock itself. Any thread. */
gma_status_t gma__pool_init(gma__pool_t *p, gma__device_t *dev, const gma_config_t *cfg);
gma_status_t gma__pool_fini(gma__pool_t *p);
/* How a slow-path allocation may behave when memory is short. WAIT: a
 * synchronous caller, for whom the alternative is an OOM: wait on the host
 * for device work that gates freed memory (oom_wait_ms), then retry.
 * ATTEMPT: an async request's try, retried later: its failure is not counted
 * in num_ooms nor traced (gma__pool_oom_report does that when it gives up).
 * INLINE: an async request served on the submitting thread if that costs no
 * waiting: the lock only if it is free (GMA_ERR_BUSY if not), memory the pool
 * already holds only (no device allocation, no OOM wait), and GMA_ERR_OOM
 * without a message when that is not enough; the worker then serves it. */
/* ARENA: an arena (planned memory's, plan.c; a graph pool's chunk, graph.c),
 * a multiple of 512 bytes served at exactly that size: counted out of
 * gma_stats (see counters' arena), with the allocation's own counts in the
 * same locked step.
 * CAPTURE: for a graph pool while stream captures (graph.c): only memory no
 * device work can still use (FREE blocks, or a growth), never a block cached
 * on a stream, pending, or reached through a device-side wait: the graph
 * runs later, at its launches, where stream order no longer protects
 * anything, and a capturing stream may not wait on work outside its
 * capture. Without it a request on a capturing stream is refused (a graph
 * would keep using memory the pool hands out again). */
enum {
  GMA__ALLOC_WAIT = 1u << 0,
  GMA__ALLOC_ATTEMPT = 1u << 1,
  GMA__ALLOC_INLINE = 1u << 2,
  GMA__ALLOC_ARENA = 1u << 3,
  GMA__ALLOC_CAPTURE = 1u << 4,
  /* The caller has another plan if this fails (the CPU fallback, a smaller
   * size): GMA_ERR_OOM with the full message, not counted in num_ooms nor
   * traced; the caller reports its own failure (gma__pool_oom_count). */
  GMA__ALLOC_UNCOUNTED = 1u << 5,
  /* oom_error only: the failure of an async request at its deadline (its
   * advice names the deadline, not oom_wait_ms). */
  GMA__ALLOC_FUTURE = 1u << 6
};
gma_status_t gma__pool_alloc_slow(gma__pool_t *p, size_t size, gma_stream_t stream,
                                  uint64_t stream_id, unsigned flags, void **out);
/* A call whose GMA__ALLOC_UNCOUNTED attempt failed and whose other plan
 * failed too: counts the OOM in num_ooms and traces it. */
void gma__pool_oom_count(gma__pool_t *p, size_t requested, gma_stream_t stream);
/* An async request gives up: counts it in num_ooms, traces it and sets the
 * full OOM message (what is where, and why) as the last error. */
gma_status_t gma__pool_oom_report(gma__pool_t *p, uint64_t bytes, gma_stream_t stream);
/* *pended: the block now waits for other streams' work (gma_record_stream). */
gma_status_t gma__pool_free_slow(gma__pool_t *p, void *ptr, bool *pended);
/* Lock held: a device call failed and gma goes on without it (an event
 * query, create or record while polling epochs): counts it in device_errors
 * and keeps its message (said, or this thread's last error when NULL),
 * which an OOM of the same call then cites. */
void gma__pool_device_error(gma__pool_t *p, const char *said);
/* ptr may lie anywhere inside a live allocation; *base gets its start. */
gma_status_t gma__pool_record_stream(gma__pool_t *p, void *ptr, gma_stream_t stream,
                                     void **base);
/* Frees the arena (GMA__ALLOC_ARENA) at ptr as gma_free would, after adding
 * gates for streams[0..n-1] as gma_record_stream would: it is reused only
 * once their work queued before now completed (planned memory gives back an
 * arena that several streams used). */
gma_status_t gma__pool_free_after(gma__pool_t *p, void *ptr, gma__stream_t *const *streams,
                                  size_t n);
/* Waits on the host, until deadline_ns at the latest, for the device work
 * that gates cached and pending memory, and makes what completed free (the
 * OOM path's wait, without an allocation behind it). Takes the lock. */
void gma__pool_settle(gma__pool_t *p, uint64_t deadline_ns);
/* Marks (or unmarks) the live block at ptr as held by an uncollected future. */
void gma__pool_hold(gma__pool_t *p, void *ptr, bool held);
/* What a trim releases, in two passes over free memory (whole free
 * segments; for growable ones, the whole chunks inside free blocks):
 *   pass 0: all of it unused for at least idle_ns (0: none by age);
 *   pass 1: then, largest first, memory unused for at least unused_ns (0:
 *           any), until at most keep bytes of cache (reserved - allocated)
 *           stay or want bytes went back in this pass.
 * "Unused since" restarts whenever a block of the memory is handed out, so
 * memory a loop uses every iteration never ages. */
typedef struct gma__release {
  uint64_t now_ns, idle_ns;
  uint64_t keep;      /* pass 1 stops at this much cache (UINT64_MAX: no pass 1) */
  uint64_t want;      /* ... or after this many bytes (0: no bound) */
  uint64_t unused_ns; /* pass 1 takes only memory unused this long (0: any) */
  bool timed;         /* the worker's timer (counted as timed/idle), else explicit */
  bool pressured;     /* pass 1 was asked for by memory pressure */
} gma__release_t;
/* Pass 1's running account, shared by ordinary and growable segments. */
typedef struct gma__trim_budget {
  uint64_t keep, want; /* from gma__release_t */
  uint64_t cached;     /* cache that stays if what was picked so far goes */
  uint64_t taken;      /* bytes pass 1 picked */
} gma__trim_budget_t;
static inline bool gma__trim_done(const gma__trim_budget_t *b) {
  return b->cached <= b->keep || (b->want && b->taken >= b->want);
}
/* The bytes pass 1 still has to give back. */
static inline uint64_t gma__trim_need(const gma__trim_budget_t *b) {
  uint64_t need = b->cached > b->keep ? b->cached - b->keep : 0;
  uint64_t left = b->want > b->taken ? b->want - b->taken : 0;
  return b->want && left < need ? left : need;
}
/* Whether pass 1 should pick a candidate of size x over one of size best
 * (0: none yet), to finish with the least given back beyond what it needs:
 * of those that finish it alone, the smallest; while none does, the
 * largest. Taking the largest first gave back a 280 MiB chunk for a trim
 * to keep 200 MiB of 288 MiB cached. */
static inline bool gma__trim_prefer(const gma__trim_budget_t *b, uint64_t x, uint64_t best) {
  uint64_t need = gma__trim_need(b);
  if (!best) return true;
  if (x >= need && best >= need) return x < best;
  if (x >= need || best >= need) return x >= need;
  return x > best;
}
static inline void gma__trim_took(gma__trim_budget_t *b, uint64_t size, bool pass1) {
  b->cached -= size < b->cached ? size : b->cached;
  if (pass1) b->taken += size;
}
gma_status_t gma__pool_release(gma__pool_t *p, const gma__release_t *r);
gma_status_t gma__pool_trim(gma__pool_t *p, uint64_t keep_bytes);
/* Grows the large pool until at least want_free bytes are free (one segment). */
gma_status_t gma__pool_grow_ahead(gma__pool_t *p, uint64_t want_free);
gma_status_t gma__pool_alloc_batch(gma__pool_t *p, size_t n, const size_t *sizes,
                                   gma_stream_t stream, uint64_t stream_id, unsigned flags,
                                   void **ptrs);
gma_status_t gma__pool_stream_retire(gma__pool_t *p, gma_stream_t stream);
/* Stream capture. gma__pool_capture_mark counts one capture gma was told of
 * (gma_capture_begin, delta 1) or its end (delta -1) on stream's record,
 * made if new (delta 0 only finds or makes it): while the count is nonzero
 * no epoch event is recorded on the stream (streams.c), and at the first
 * mark, when the stream is not yet capturing, its open epoch is closed
 * first, so what it freed before the capture is gated by an event outside
 * it. *rec (if not NULL) gets the record. */
gma_status_t gma__pool_capture_mark(gma__pool_t *p, gma_stream_t stream, uint64_t stream_id,
                                    int delta, gma__stream_t **rec);
/* GMA_OK when stream is not capturing (or the device has no capture), else
 * GMA_ERR_INVALID_ARGUMENT saying that the request on it needs a
 * gma_capture_begin; fn names the call. Any thread; no lock. */
gma_status_t gma__pool_refuse_capture(gma__pool_t *p, gma_stream_t stream, const char *fn);
/* Synchronizes stream on the device, then marks every epoch of it that was
 * closed by then complete: what it freed is reusable without waiting for a
 * poll to see an event complete. */
gma_status_t gma__pool_stream_synchronize(gma__pool_t *p, gma_stream_t stream);
void gma__pool_stats(gma__pool_t *p, gma_stats_t *out);
gma_status_t gma__pool_stream_stats(gma__pool_t *p, gma_stream_t stream, gma_stream_stats_t *out);
/* Full structural and accounting check; returns false and sets the last error
 * on the first violation. Caller holds the lock. */
bool gma__pool_is_valid(gma__pool_t *p);

/* pool.c helpers shared with streams.c (lock held). */
void gma__block_make_free(gma__pool_t *p, gma__block_t *b);
void gma__cached_unlink(gma__pool_t *p, gma__block_t *b);
gma__block_t *gma__cache_block(gma__pool_t *p, gma__block_t *b);
void gma__pending_poll(gma__pool_t *p);
uint64_t gma__pool_largest_idle(const gma__pool_t *p);

/* pool.c helpers shared with segments.c (lock held). */
gma__block_t *gma__block_new(gma__pool_t *p);
void gma__block_recycle(gma__pool_t *p, gma__block_t *b);
void gma__free_link(gma__pool_t *p, gma__block_t *b);
void gma__free_unlink(gma__pool_t *p, gma__block_t *b);
/* The segment containing addr, or NULL. */
gma__segment_t *gma__seg_find(const gma__pool_t *p, uintptr_t addr);
/* Adds seg to / removes it from the sorted segment table (insert can fail
 * for lack of host memory). */
gma_status_t gma__segs_insert(gma__pool_t *p, gma__segment_t *seg);
void gma__segs_remove(gma__pool_t *p, gma__segment_t *seg);

/* segments.c: the pool's side of growable segments (p->growable). Lock held. */
/* Gives the source's memory [addr, addr + size) of range, made for the
 * stream of serial home (0: none), to the pool as one FREE block: appended
 * to the segment of range ending at addr (or a new one of kind), then the
 * segment starting right after is merged in, each only when its home is
 * the same or none; FREE neighbours coalesce. On failure (host memory)
 * nothing changed. */
gma_status_t gma__segs_adopt(gma__pool_t *p, const void *range, int kind, uintptr_t addr,
                             uint64_t size, uint64_t home);
/* Grows kind so that its free tree holds a block of at least size bytes,
 * for the stream of serial home (0: none): offers the source the segments
 * of that home (or none) ending in FREE blocks, then, if that finds no room,
 * those of any home; has it map one chunk (at least its minimum chunk,
 * vmm.c) and adopts it, merged with its neighbours of the same home. Free
 * chunks elsewhere stay mapped: growth never unmaps (the OOM retry gives
 * them back, then grows again). */
gma_status_t gma__segs_grow(gma__pool_t *p, int kind, uint64_t size, uint64_t home);
/* Takes what the source can give back inside FREE block b of a growable
 * segment out of the pool (want > 0: only its last chunks that hold want
 * bytes, see the source's releasable), splitting its segment, and has the
 * source take it (out, for give_back without the lock); false when there is
 * none or host memory for the split is lacking (nothing changed). */
bool gma__segs_detach(gma__pool_t *p, gma__block_t *b, uint64_t want, gma__span_t *out);
/* After give_back: the source settles, the pool counts device frees and
 * bytes trimmed and adopts again what the device refused. */
void gma__segs_finish(gma__pool_t *p, gma__span_t *x);
/* A trim's choice (see gma__pool_release): detaches what can go back inside
 * FREE blocks, idle ones first, then the largest while bud allows;
 * returns the spans (malloc'd, the first *n_idle for idleness) to give back. */
struct gma__release;
size_t gma__segs_pick(gma__pool_t *p, const struct gma__release *rel, gma__trim_budget_t *bud,
                      gma__span_t **out, size_t *n_idle);
/* Gives back every releasable free chunk now, under the lock (the OOM retry). */
void gma__segs_release_free(gma__pool_t *p);
/* Checks the source's ranges against the growable segments. */
bool gma__segs_is_valid(gma__pool_t *p);

/* stream_cache.c: the lock-free paths and the stream table. */
/* Serves size from the stream's bin without a lock; GMA_OK with *out set, or
 * GMA_ERR_OOM meaning "miss: take the slow path" (never reported as such).
 * id is the device's id of the stream (the caller asked once, for both paths);
 * a record found with that id goes into the calling thread's stream cache.
 * Any thread; lock-free. */
gma_status_t gma__bin_alloc(gma__pool_t *p, size_t size, gma_stream_t stream, uint64_t id,
                           void **out);
/* The live record of the stream handle names, whose device id is id (the
 * caller asked the device), put in the calling thread's stream cache; NULL
 * when gma has none yet (the slow path makes it) or it was retired. Any
 * thread; lock-free. */
gma__stream_t *gma__stream_live(gma__pool_t *p, gma_stream_t stream, uint64_t id);
/* The same without the device's id: only through the calling thread's stream
 * cache (stream_cache.c), so it makes no device call; a miss when the cache
 * has no live entry for the stream (ask the device, then gma__bin_alloc).
 * Relies on streams being retired before they are destroyed. Any thread;
 * wait-free apart from the ck_stack pop. */
gma_status_t gma__bin_alloc_cached(gma__pool_t *p, size_t size, gma_stream_t stream,
                                   void **out);
/* The record the calling thread's stream cache holds for handle in p, or
 * NULL when it has none that may be used (for tests: what a bin hit would
 * pop from, without popping). */
gma__stream_t *gma__stream_cached(gma__pool_t *p, gma_stream_t handle);
gma_status_t gma__bin_free(gma__pool_t *p, void *ptr);
uintptr_t gma__stream_key(gma_stream_t handle, uint64_t *owner_tid);
gma__stream_t *gma__stable_lookup(gma__pool_t *p, uintptr_t key);
/* Lock held: the live record for handle whose device id is id, made (and a
 * stale record with a recycled handle orphaned) as needed; NULL without host
 * memory. */
gma__stream_t *gma__stream_resolve(gma__pool_t *p, gma_stream_t handle, uint64_t id);
gma__stream_t *gma__stream_find(gma__pool_t *p, gma_stream_t handle);
void gma__stable_remove(gma__pool_t *p, gma__stream_t *s);
/* Puts p on / takes it off the process-wide list of pools that a thread's
 * exit walks to retire its per-thread default streams. */
void gma__pools_add(gma__pool_t *p);
void gma__pools_remove(gma__pool_t *p);
/* The calling thread's counters for stream s (made on first use). */
gma__tcount_t *gma__tcount(gma__pool_t *p, gma__stream_t *s);
uint64_t gma__thread_id(void);
void gma__stream_cache_fini(gma__pool_t *p);

/* streams.c: epochs (lock held). */
/* Moves every binned block of s into its stream tree in the pool. */
void gma__stream_drain_bins(gma__pool_t *p, gma__stream_t *s);
/* Drains bins, closes dirty epochs by recording events, advances safe epochs,
 * and moves blocks whose gates passed to FREE (unless reuse is none and
 * force is false). Never waits for the device. */
void gma__streams_poll(gma__pool_t *p, bool force);
/* As gma__streams_poll(p, false), but leaves the streams' bins alone: the
 * worker's periodic look while freed memory waits for device work (draining
 * the bins every few milliseconds would leave them nothing to hit). */
void gma__streams_observe(gma__pool_t *p);
/* Closes epochs and moves PENDING blocks whose gates passed, without
 * draining bins: lets a block used by other streams return to its place
 * before the slow path searches (cheap: O(streams)). */
void gma__streams_settle_pending(gma__pool_t *p);
/* The OOM path's wait for device work, in three steps, so that the pool
 * lock is not held while the host waits (other callers, the worker, and a
 * free the awaited work may itself depend on go on meanwhile).
 * wait_begin (lock held): closes every open epoch that holds frees and
 * copies each stream's oldest outstanding event into evs (at most cap);
 * returns how many, 0 when no freed memory waits for device work (a real
 * shortage). When it returns more, the events are pinned: event_put defers
 * destroying them until wait_end. wait_any (no lock): polls the copies until
 * one completed (1), a query failed (-1), or deadline_ns (UINT64_MAX: none)
 * passed (0).
 * wait_end (lock held): unpins, then moves what completed to the free pool. */
size_t gma__streams_wait_begin(gma__pool_t *p, gma__event_t *evs, size_t cap);
int gma__streams_wait_any(gma__pool_t *p, const gma__event_t *evs, size_t n,
                          uint64_t deadline_ns);
void gma__streams_wait_end(gma__pool_t *p);
/* reuse:wait: the best-fitting CACHED block of another stream; closes that
 * stream's epoch if still open, makes u wait for it on the device and
 * returns the block, or NULL. (Pending blocks: pool.c's pending_wait_fit.) */
gma__block_t *gma__streams_wait_fit(gma__pool_t *p, gma__stream_t *u, int kind, uint64_t size);
/* Closes the open epoch of s now, with an event right after the work queued
 * so far, if something was freed in it (false otherwise, or when s is
 * retired or another thread's per-thread stream). Lock held. */
bool gma__stream_close_epoch(gma__pool_t *p, gma__stream_t *s);
/* Whether the work gate g covers is ordered before stream u's next work:
 * completed (its epoch is closed first if still open, and its events are
 * observed), or, with wait, u made to wait on the device for the event
 * covering it. Planned memory (plan.c) asks this of the previous users of a
 * planned address; reuse:wait of the owner and recorded users of a block it
 * hands to another stream (streams.c, pool.c). */
bool gma__gate_settle(gma__pool_t *p, const gma__gate_t *g, gma__stream_t *u, bool wait);
/* Retires s: closes its epoch (one event) unless orphan; later frees carry
 * the closed epoch, or never become safe when orphan (a recycled handle whose
 * old stream gma cannot name any more). */
gma_status_t gma__stream_retire(gma__pool_t *p, gma__stream_t *s, bool orphan);
/* Moves retired records that nothing references any more (no block, gate,
 * event or bin) from stream_list to the graveyard, so polls and stats stop
 * walking them. O(blocks); run when retired records have doubled. */
void gma__streams_sweep_retired(gma__pool_t *p);
void gma__streams_fini(gma__pool_t *p);
/* A lock-free free pushed into a bin of s and then saw s retired: the
 * retire may have drained before the push, so drain again (lock held). */
void gma__stream_rescue(gma__pool_t *p, gma__stream_t *s);
/* Whether the stream handle names, with device id id, was retired through
 * gma and has had no new record since (gma_stream_wait_stream refuses it).
 * Never true for the default streams. Takes the pool lock; walks the retired
 * records (error checks of stream calls only, never the hot path). */
bool gma__stream_was_retired(gma__pool_t *p, gma_stream_t handle, uint64_t id);
/* gma_stream_synchronize's two halves (lock held in each): begin closes the
 * open epoch of s without an event and returns it; end, once the device
 * synchronized s, marks every epoch up to it complete and moves what that
 * made safe (as a poll would). */
uint64_t gma__stream_sync_begin(gma__pool_t *p, gma__stream_t *s);
void gma__stream_sync_end(gma__pool_t *p, gma__stream_t *s, uint64_t closed);
static inline bool gma__gate_passed(const gma__gate_t *g) {
  return g->stream->safe_epoch >= g->epoch;
}

/* stats.c */
void gma__stat_add(gma_stat_t *s, uint64_t bytes);
void gma__stat_sub(gma_stat_t *s, uint64_t bytes);
/* Sums the per-thread counters of every stream; updates sampled peaks. Lock held. */
void gma__stats_sample(gma__pool_t *p);
/* Adds s's counters to *into (relaxed loads). */
void gma__stats_sum(const gma__stream_t *s, gma__tcount_t *into);
/* Lock held: adds to *into what s counted since it was last buried (the
 * retired-record sweep, and a late free into a swept record's bin). */
void gma__stats_bury(gma__stream_t *s, gma__tcount_t *into);

/* tags.c: the id of tag (added if new; lock-free when known), or -1 with the
 * error set (bad name, table full). The name of an id. */
int gma__tag_intern(gma__pool_t *p, const char *tag);
const char *gma__tag_name(gma__pool_t *p, unsigned id);
/* A tag's name (at most 31 characters) escaped for a JSON string ('"' and
 * '\\'), written to out and returned. */
#define GMA__TAG_JSON 64
const char *gma__tag_json(const char *name, char out[GMA__TAG_JSON]);

/* api.c: the pool behind an allocator, for internal tests. */
gma__pool_t *gma__pool_of(gma_t *g);

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

/* Level 2 validates the whole pool after every locked operation. */
#if GMA_DEBUG >= 2
#define GMA__VALIDATE(p) GMA__ASSERT(gma__pool_is_valid(p))
#else
#define GMA__VALIDATE(p) ((void)0)
#endif

#endif /* GMA_POOL_H */
