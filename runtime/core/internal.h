/* The core's functions, grouped by the file that owns them. Unless a
 * declaration says otherwise the caller holds gma__pool_t.lock; the functions
 * that take the lock themselves say so. The pool lock is taken only inside
 * core/. */
#ifndef GMA_CORE_INTERNAL_H
#define GMA_CORE_INTERNAL_H

#include "base/clock.h"
#include "base/assert.h"
#include "core/table.h"
#include "core/types.h"

/* Records a pool event when a trace runs (one load and branch when not). */
#define GMA__TRACE(p, action, ptr, size, stream, block, id, count, status)                    \
  do {                                                                                      \
    gma__trace_t *t_ = gma__trace_on(&(p)->trace);                                          \
    if (t_)                                                                                 \
      gma__trace_emit(t_, gma__trace_now(), (action), (uint64_t)(ptr), (uint64_t)(size),    \
                      (uint64_t)(uintptr_t)(stream), (uint64_t)(block), (uint64_t)(id),     \
                      (uint64_t)(count), (int)(status));                                    \
  } while (0)


/* ---- pool.c: lifecycle and clock ---------------------------------------------- */
/* Init and fini; any thread. */
gma_status_t gma__pool_init(gma__pool_t *p, gma__device_t *dev, const gma_config_t *cfg);
gma_status_t gma__pool_fini(gma__pool_t *p);
/* Sets the pool's coarse clock to now; any thread. */
void gma__pool_tick_clock(gma__pool_t *p);
/* Lock held: bytes that may still be reserved below memory_limit (what a
 * trim is giving back counts as held until it settles), rounded down to 512. */
uint64_t gma__pool_room(const gma__pool_t *p);


/* ---- Block records -------------------------------------------------------------
 * Records come from chunks and are recycled, never freed before destroy: the
 * lock-free free path and ck_stack's pop may still read a record that was just
 * recycled, and must find mapped memory there. */

#define GMA__BLOCK_CHUNK 256

/* ---- blocks.c: block records, trees, lists, segment table --------------------- */

/* ---- Size trees: treaps keyed by (size, addr) -------------------------------
 * A best fit is the lowest key with size >= request: the smallest block that
 * fits, lowest address first, which keeps memory packed toward segment starts. */

static inline bool gma__key_less(const gma__block_t *a, const gma__block_t *b) {
  return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static inline uint8_t gma__state_of(gma__block_t *b) { return gma__load_relaxed(&b->state); }
void gma__block_make_free(gma__pool_t *p, gma__block_t *b);
void gma__cached_unlink(gma__pool_t *p, gma__block_t *b);
gma__block_t *gma__cache_block(gma__pool_t *p, gma__block_t *b);
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

gma__block_t *gma__treap_best_fit(gma__block_t *n, uint64_t size);
uint64_t gma__treap_max_size(const gma__block_t *n);
void gma__cached_link(gma__pool_t *p, gma__block_t *b, gma__block_t *after);
void gma__pending_link(gma__pool_t *p, gma__block_t *b);
void gma__pending_unlink(gma__pool_t *p, gma__block_t *b);
gma__block_t *gma__absorb_free_neighbours(gma__pool_t *p, gma__block_t *b);
size_t gma__seg_index_at_or_before(const gma__pool_t *p, uintptr_t addr);

/* ---- alloc.c: slow-path allocation (each takes the lock itself) ---------------- */
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
gma_status_t gma__pool_alloc_batch(gma__pool_t *p, size_t n, const size_t *sizes,
                                   gma_stream_t stream, uint64_t stream_id, unsigned flags,
                                   void **ptrs);

/* ---- grow.c: fit and grow ------------------------------------------------------ */
#define GMA__SEGMENT_ROUND (2ull << 20)
gma_status_t gma__seg_adopt(gma__pool_t *p, int kind, uintptr_t base, uint64_t size,
                              uint64_t home, gma__block_t **out);
gma_status_t gma__seg_create(gma__pool_t *p, int kind, uint64_t size, uint64_t home,
                               gma__block_t **out);
gma_status_t gma__find_or_grow(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size,
                                 gma__block_t **out, uint64_t **level, bool may_grow,
                                 bool capture);

/* ---- oom.c: wait, release, message ---------------------------------------------- */
/* A call whose GMA__ALLOC_UNCOUNTED attempt failed and whose other plan
 * failed too: counts the OOM in num_ooms and traces it. */
void gma__pool_oom_count(gma__pool_t *p, size_t requested, gma_stream_t stream);
/* An async request gives up: counts it in num_ooms, traces it and sets the
 * full OOM message (what is where, and why) as the last error. */
gma_status_t gma__pool_oom_report(gma__pool_t *p, uint64_t bytes, gma_stream_t stream);
/* Lock held: a device call failed and gma goes on without it (an event
 * query, create or record while polling epochs): counts it in device_errors
 * and keeps its message (said, or this thread's last error when NULL),
 * which an OOM of the same call then cites. */
void gma__pool_device_error(gma__pool_t *p, const char *said);
bool gma__oom_release(gma__pool_t *p, uint64_t need);
gma_status_t gma__oom_error(gma__pool_t *p, uint64_t size, size_t requested,
                              gma_stream_t stream, unsigned flags, const gma__oom_waiting_t *w);
bool gma__oom_wait(gma__pool_t *p, gma__oom_waiting_t *w, uint64_t need);

/* ---- free.c: slow-path free (the gma__pool_* take the lock themselves) ----------- */
/* *pended: the block now waits for other streams' work (gma_record_stream). */
gma_status_t gma__pool_free_slow(gma__pool_t *p, void *ptr, bool *pended);
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
void gma__pending_poll(gma__pool_t *p, const gma__stream_t *asking);

/* ---- trim.c: release, trim, growth ahead ------------------------------------------ */
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
uint64_t gma__pool_largest_idle(const gma__pool_t *p);
bool gma__release_free_segments(gma__pool_t *p, uint64_t need);
void gma__release_whole(gma__pool_t *p, gma__segment_t *seg);

/* ---- capture.c: stream operations (each takes the lock itself) -------------------- */
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

/* ---- stats.c: counters and the snapshots of gma_stats --------------------------- */
void gma__pool_stats(gma__pool_t *p, gma_stats_t *out);
gma_status_t gma__pool_stream_stats(gma__pool_t *p, gma_stream_t stream, gma_stream_stats_t *out);
void gma__stat_add(gma_stat_t *s, uint64_t bytes);
void gma__stat_sub(gma_stat_t *s, uint64_t bytes);
/* Sums the per-thread counters of every stream; updates sampled peaks. Lock held. */
void gma__stats_sample(gma__pool_t *p);
/* Adds s's counters to *into (relaxed loads). */
void gma__stats_sum(const gma__stream_t *s, gma__tcount_t *into);
/* Lock held: adds to *into what s counted since it was last buried (the
 * retired-record sweep, and a late free into a swept record's bin). */
void gma__stats_bury(gma__stream_t *s, gma__tcount_t *into);


/* ---- tags.c: tag names --------------------------------------------------------- */
/* The id of tag (added if new; lock-free when known), or -1 with the
 * error set (bad name, table full). The name of an id. */
int gma__tag_intern(gma__pool_t *p, const char *tag);
const char *gma__tag_name(gma__pool_t *p, unsigned id);
/* A tag's name (at most 31 characters) escaped for a JSON string ('"' and
 * '\\'), written to out and returned. */
#define GMA__TAG_JSON 64
const char *gma__tag_json(const char *name, char out[GMA__TAG_JSON]);


/* ---- inspect.c: the locked steps the layers above ask for (each takes the lock) -- */
/* Runs fn(arg) with the pool lock held: for a caller above core/ whose
 * locked step calls back into its own layer (an observer's walk of p->segs
 * and their blocks, asking the planner about each arena). fn may call the
 * core's lock-held functions; it must not call one that takes the lock. */
void gma__pool_with_lock(gma__pool_t *p, void (*fn)(void *arg), void *arg);
/* Whether ptr lies in one of the pool's segments. */
bool gma__pool_owns(gma__pool_t *p, const void *ptr);
/* Fills kind, base, requested, block_size, stream and tag of *r from the
 * LIVE block containing ptr; false (r untouched) when there is none. */
bool gma__pool_live_info(gma__pool_t *p, const void *ptr, gma_pointer_info_t *r);
/* The size, bytes asked for and stream of the LIVE block that starts at
 * ptr (an arena is none), under the lock: ptr may be a caller's stale
 * pointer, whose block record a trim may be recycling meanwhile. */
bool gma__pool_block_facts(gma__pool_t *p, const void *ptr, uint64_t *size,
                           uint64_t *requested, gma_stream_t *stream);
/* The worker's reads and notes: reserved bytes now; the pressure level it
 * reported; one wake-up. */
uint64_t gma__pool_reserved(gma__pool_t *p);
void gma__pool_note_pressure(gma__pool_t *p, int level);
void gma__pool_note_wakeup(gma__pool_t *p);
/* The worker's look at pending memory, lock-free of the callers: observes
 * device work that completed, so pending memory it gated goes back to its
 * stream's cache (and the statistics say so) without waiting for a caller's
 * slow path; true while some still waits. Stream caches stay with their
 * streams (an allocation that misses polls for itself). */
bool gma__pool_poll_pending(gma__pool_t *p);
/* gma_trace_start: in one locked step, rows(arg, t) writes t's first rows
 * (lock held), then t becomes the recording trace; returns the one it
 * replaces (NULL if none), for the caller to close. A segment or a locked
 * allocation changes either before (in the rows) or after (its own row). */
gma__trace_t *gma__pool_trace_publish(gma__pool_t *p, gma__trace_t *t,
                                      void (*rows)(void *arg, gma__trace_t *t), void *arg);
/* gma_trace_stop: no trace records any more; returns the one that did. */
gma__trace_t *gma__pool_trace_withdraw(gma__pool_t *p);
/* A child process after fork(): whether the pool's locks (lock, count_lock,
 * trace_mu) were free when it forked, so that its records are whole. */
bool gma__pool_fork_unlocked(gma__pool_t *p);

/* ---- validate.c ------------------------------------------------------------------ */
/* Full structural and accounting check; returns false and sets the last error
 * on the first violation. Caller holds the lock. */
bool gma__pool_is_valid(gma__pool_t *p);
/* Level 2 validates the whole pool after every locked operation. */
#if GMA_DEBUG >= 2
#define GMA__VALIDATE(p) GMA__ASSERT(gma__pool_is_valid(p))
#else
#define GMA__VALIDATE(p) ((void)0)
#endif

/* ---- segments.c ------------------------------------------------------------------ */
/* The pool's side of growable segments (p->growable). Lock held. */
/* Gives the source's memory [addr, addr + size) of range, made for the
 * stream of serial home (0: none), to the pool as one FREE block: appended
 * to the segment of range ending at addr (or a new one of kind), then the
 * segment starting right after is merged in, each only when its home is
 * the same or none; FREE neighbours coalesce. On failure (host memory)
 * nothing changed. */
gma_status_t gma__segs_adopt(gma__pool_t *p, const void *range, int kind, uintptr_t addr,
                             uint64_t size, uint64_t home);
/* Grows kind so that it holds a block of at least size bytes, for stream
 * own (NULL: none; its serial is the home): offers the source the segments
 * of that home (or none) ending in free memory (FREE, or cached on own), then, if
 * that finds no room, those of any home; has it map one chunk (at least its
 * minimum chunk, vmm.c) and adopts it, merged with its neighbours of the
 * same home. When the growth extended a segment whose end was own's cached
 * block, *joined is that block (still cached: joined with the FREE memory
 * after it, it holds size bytes); else NULL and the free tree holds the
 * fit. Free chunks elsewhere stay mapped: growth never unmaps (the OOM retry
 * gives them back, then grows again). */
gma_status_t gma__segs_grow(gma__pool_t *p, int kind, uint64_t size, const gma__stream_t *own,
                            gma__block_t **joined);
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
/* Unmaps every releasable free chunk now, under the lock (the OOM retry),
 * keeping its physical memory in the source's handle pool where the device
 * can (else freeing it). */
void gma__segs_release_free(gma__pool_t *p);
/* Frees the source's kept chunks (the handle pool) on the device, under the
 * lock (a release does not wait for device work); the bytes freed. */
uint64_t gma__segs_free_kept(gma__pool_t *p);
/* Checks the source's ranges against the growable segments. */
bool gma__segs_is_valid(gma__pool_t *p);

/* ---- streams.c ------------------------------------------------------------------- */
/* Epochs and gates (lock held). */
/* Moves every binned block of s into its stream tree in the pool. */
void gma__stream_drain_bins(gma__pool_t *p, gma__stream_t *s);
/* Drains bins, closes dirty epochs by recording events, advances safe epochs,
 * and moves blocks whose gates passed to FREE (unless reuse is none and
 * force is false). Never waits for the device. */
void gma__streams_poll(gma__pool_t *p, bool force);
/* As gma__streams_poll(p, false), but leaves the streams' bins alone: the
 * slow path's look before a small request takes a hole of the large pool
 * (draining the bins at every miss would leave them nothing to hit). */
void gma__streams_observe(gma__pool_t *p);
/* Drains every stream's bins and, unless reuse:none, moves the cached
 * blocks whose epochs are already known complete to the free pool: the
 * part of gma__streams_poll(p, false) that makes no device call. */
void gma__streams_drain(gma__pool_t *p);
/* Moves PENDING blocks whose gates (and, but for the asking stream's own,
 * owner epochs) passed back to their owners' caches, without draining
 * bins: lets a block used by other streams return to its place before the
 * slow path searches. Asks only the streams those blocks wait for, and
 * with epoch marks asks the device nothing. asking: the slow path's
 * stream, or NULL. */
void gma__streams_settle_pending(gma__pool_t *p, const gma__stream_t *asking);
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
/* The pool's epoch marks (streams.c), where the device writes them: at
 * init; a new stream record takes one (none left, or a foreign stream:
 * its events are queried). Lock held for take. */
void gma__streams_init(gma__pool_t *p);
void gma__stream_mark_take(gma__pool_t *p, gma__stream_t *s);
/* A lock-free free pushed into a bin of s and then saw s retired: the
 * retire may have drained before the push, so drain again (lock held). */
void gma__stream_rescue(gma__pool_t *p, gma__stream_t *s);
/* The same for the lock-free free: takes the pool lock itself. */
void gma__pool_stream_rescue(gma__pool_t *p, gma__stream_t *s);
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


#endif /* GMA_CORE_INTERNAL_H */
