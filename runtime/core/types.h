/* Every structure of the pool, with its invariants as equations next to the
 * data: segments and blocks, the stream records with their lock-free bins and
 * epochs, the stream table, the counters, and the pool itself. Functions are
 * declared in core/internal.h, grouped by the file that owns them.
 *
 * stream records with their lock-free bins and epochs, and the counters.
 * Segment memory comes from the pool's segment source (source.h), which
 * deals only in address ranges; everything built over them is here.
 *
 * Locks: gma__pool_t.lock, then count_lock or trace_mu, in the rank order
 * of base/lock.h (the one list of the runtime's locks, checked in debug
 * builds). gma_trace_start writes the pool's state under the lock, then
 * publishes the trace under trace_mu.
 * Device calls are made while holding the pool lock; device backends take
 * only their own internal locks and never call back. The lock-free paths
 * (stream_cache.c) take no lock when a bin can serve them.
 *
 * Unless a field says otherwise it is guarded by gma__pool_t.lock. Fields
 * marked "atomic" are also touched by the lock-free paths. */
#ifndef GMA_CORE_TYPES_H
#define GMA_CORE_TYPES_H

#include <ck_stack.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/atomics.h"
#include "core/pagemap.h"
#include "device/device.h"
#include "gma.h"
#include "base/trace.h"
#include "source/source.h"

#define GMA__MIN_SPLIT 512u   /* a split leaves a remainder at least this large */
#define GMA__EPOCH_EVENTS 64u /* outstanding epoch events per stream */
#define GMA__MARKS 512u       /* epoch marks per pool (one 4 KiB page) */
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
  /* The stream's epoch mark (streams.c): after each event recorded here,
   * the device writes the epoch that event closed into *mark, so every
   * event of an epoch <= *mark has completed. NULL: the events are queried. */
  _Atomic uint64_t *mark;
  uint64_t mark_written;     /* the epoch of the last write queued */
  gma__block_t *cached_tree[GMA__NKINDS];
  gma__block_t *fifo_head, *fifo_tail;
  uint64_t cached_bytes;     /* CACHED bytes (bins not included) */
  gma__bin_t *bins;          /* nbins bins, or NULL when bins are off */
  uint32_t captures;         /* captures gma was told of with this stream as origin
                                (gma__pool_capture_mark): no epoch event while nonzero */
  bool referenced;           /* scratch of the retired-record sweep (streams.c) */
  uint8_t gating;            /* scratch of gma__streams_settle_pending: 1 a pending block
                                waits for this stream, 2 in its open epoch */
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
  uint64_t device_remaps, device_keeps; /* of those: kept chunks mapped / unmapped and kept */
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
  GMA__TEST_KEEP_UNCAPTURED = 1u << 5,  /* the slow path's "not capturing" answer
                                           (p->uncaptured) outlives its call */
  GMA__TEST_MARK_EARLY = 1u << 6,       /* the host writes an epoch mark when the epoch
                                           closes, not the device after its work */
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
  /* The stream of the locked call running now whose capture state that call
   * asked just before it took the lock (gma__pool_refuse_capture said "not
   * capturing"): its epoch may be closed without asking again. Set after the
   * lock is taken, cleared before it is dropped (also where a call drops it
   * to wait), so no other call ever sees it. */
  gma__stream_t *uncaptured;
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
  gma__block_t **tail_blocks;   /* per tail, the growing stream's cached block it
                                   counts as free (NULL: none) */
  size_t tails_cap;
  /* Epoch marks (streams.c): GMA__MARKS words of pinned host memory, one
   * per stream record that has one, which the device sets to each epoch a
   * close ends once the work before it ran; NULL when the device cannot
   * write them. marks_free: the indices no record holds. */
  _Atomic uint64_t *marks;
  uintptr_t marks_dev;          /* their device address */
  uint32_t *marks_free;
  uint32_t nmarks_free;
  gma__event_t *spare_events;   /* created, unused events for reuse */
  size_t nspare, spare_cap;
  uint32_t event_pins;          /* OOM waiters querying copied events without the lock */
  uint64_t leaving;             /* bytes a trim took out of reserved and is giving back to
                                   the device outside the lock; counted against the limit */
  pthread_cond_t settled;       /* broadcast (under lock) when a trim's give-back settled */
  bool keep_lock;               /* a batch holds blocks it may put back where they were
                                   taken from: the OOM release gives back under the lock */
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

/* Why gma__oom_wait stopped: what the OOM message then says. One OOM call's
 * wait state, kept across its rounds. */
/* Why gma__oom_wait stopped: what the OOM message then says. */
enum { GMA__OOM_GOING = 0, GMA__OOM_SHORT /* live + need above the limit */, GMA__OOM_DEADLINE /* oom_wait_ms */,
       GMA__OOM_NOTHING /* no event to wait on */, GMA__OOM_ERRORS /* OOM_ERROR_ROUNDS failed queries */,
       GMA__OOM_OUTSIDE /* the device's free memory plus what gma could free is short */ };
typedef struct gma__oom_waiting {
  uint64_t start_ns; /* when the first round began (0: none yet) */
  uint64_t rounds;
  unsigned errors;   /* rounds in a row that ended on a failed event query */
  uint64_t device_errors; /* p->c.device_errors when the call began */
  int stop;          /* OOM_*: why the last gma__oom_wait returned false */
  uint64_t live;     /* GMA__OOM_SHORT, _OUTSIDE: the bytes that stayed in use then (arenas whole) */
  uint64_t dev_free; /* GMA__OOM_OUTSIDE: the device's free memory then */
} gma__oom_waiting_t;

#endif /* GMA_CORE_TYPES_H */
