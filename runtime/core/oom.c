/* Owns the OOM path: the host wait for device work that gates freed memory, the
 * release of free segments before a retry, and the OOM message. Every function
 * here runs under gma__pool_t.lock (core/types.h) unless it says otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/round.h"
#include "base/lock.h"
#include "base/sizeclass.h"
#include "core/internal.h"

/* The OOM retry's release, counted: completed work polled (its blocks FREE),
 * then what growth of need bytes lacks given back (gma__release_free_segments).
 * Never waits for device work;
 * drops the lock while the device frees, and then returns true: blocks the
 * caller found before may have changed. */
bool gma__oom_release(gma__pool_t *p, uint64_t need) {
  p->c.oom_retries++;
  gma__streams_poll(p, true);
  gma__stats_sample(p); /* cached's peak, before the cache goes */
  return gma__release_free_segments(p, need);
}

/* What the OOM message cites: the last device failure, if one happened
 * during this call. */
static const char *failed_meanwhile(const gma__pool_t *p, const gma__oom_waiting_t *w) {
  return p->c.device_errors > w->device_errors ? p->last_device_error : NULL;
}

static uint64_t oom_waited_ns(const gma__oom_waiting_t *w) {
  return w->start_ns ? gma__now_ns() - w->start_ns : 0;
}

/* The OOM message: what was asked, where the memory is, and which of three
 * causes it is, with advice that fits it; counted in num_ooms and traced
 * (not under GMA__ALLOC_UNCOUNTED: the caller has another plan). Under
 * GMA__ALLOC_ATTEMPT, an async request's attempt, which waits and tries
 * again (every millisecond): a short message, no trace row, no device call;
 * the request's final failure is reported by gma__pool_oom_report. */
/* Lock held: one failed call, counted in num_ooms and traced. */
static void count_oom(gma__pool_t *p, size_t requested, gma_stream_t stream, uint64_t size) {
  p->c.ooms++;
  GMA__TRACE(p, GMA__TR_OOM, 0, requested, stream, size, 0, 0, 0);
}

/* The cause of an OOM that the wait decided was a shortage (not what is
 * gated now: another thread's free since is not why); false for others. */
static bool shortage_cause(const gma__pool_t *p, const gma__oom_waiting_t *w, uint64_t size,
                           char *cause, size_t n) {
  if (w && w->stop == GMA__OOM_SHORT)
    snprintf(cause, n,
             "a real shortage: live allocations held %" PRIu64 " bytes of memory_limit / device "
             "capacity %" PRIu64 " when this call looked, so %" PRIu64 " more could not fit "
             "even once all device work finished; free memory, ask for less, or raise "
             "memory_limit",
             w->live, p->limit, size);
  else if (w && w->stop == GMA__OOM_OUTSIDE)
    snprintf(cause, n,
             "not enough device memory, even once gma's device work finishes: the device had "
             "%" PRIu64 " bytes free and gma held %" PRIu64 " beyond its %" PRIu64 " live "
             "bytes, so the rest is in use outside this allocator (another process or "
             "allocator); free memory there, or ask for less",
             w->dev_free, p->c.reserved.current > w->live ? p->c.reserved.current - w->live : 0,
             w->live);
  else
    return false;
  return true;
}

gma_status_t gma__oom_error(gma__pool_t *p, uint64_t size, size_t requested,
                            gma_stream_t stream, unsigned flags, const gma__oom_waiting_t *w) {
  uint64_t waited_ns = w ? oom_waited_ns(w) : 0;
  const char *device_failure = w ? failed_meanwhile(p, w) : NULL;
  int stop = w ? w->stop : GMA__OOM_GOING;
  if (flags & GMA__ALLOC_ATTEMPT)
    return gma__set_error(GMA_ERR_OOM, "cannot allocate %zu bytes on stream %p yet (the "
                          "request waits for memory)", requested, stream);
  uint64_t dev_free = 0, dev_total = 0;
  p->dev->ops->mem_info(p->dev, &dev_free, &dev_total);
  if (!(flags & GMA__ALLOC_UNCOUNTED)) count_oom(p, requested, stream, size);
  gma__stats_sample(p);
  uint64_t gated = p->c.stream_cached + p->c.pending, largest = gma__pool_largest_idle(p);
  uint64_t room = gma__pool_room(p);
  if (room > dev_free) room = dev_free;
  char cause[400];
  if (shortage_cause(p, w, size, cause, sizeof cause)) {
    /* the wait decided it */
  } else if (gated >= size && (flags & GMA__ALLOC_FUTURE))
    snprintf(cause, sizeof cause,
             "%" PRIu64 " bytes are freed but still in use by device work that has not finished "
             "by the request's deadline (its timeout_ns, or future_timeout_ms); synchronize "
             "the streams, or give the request a longer deadline", gated);
  else if (gated >= size && stop == GMA__OOM_DEADLINE)
    snprintf(cause, sizeof cause,
             "%" PRIu64 " bytes are freed but still in use by device work that has not finished "
             "(waited %.1f ms; oom_wait_ms bounds it); synchronize the streams, or raise "
             "oom_wait_ms", gated, (double)waited_ns / 1e6);
  else if (gated >= size)
    snprintf(cause, sizeof cause,
             "%" PRIu64 " bytes are freed but still in use by device work gma could not wait "
             "for (waited %.1f ms; %s); synchronize the streams that used them", gated,
             (double)waited_ns / 1e6,
             stop == GMA__OOM_ERRORS ? "the device failed every event query"
             : stop == GMA__OOM_NOTHING ? "no event covers that work: another thread's per-thread "
                                     "stream, or a capture"
                                   : "this call does not wait");
  else if (p->c.free + room >= size)
    /* Growable segments coalesce already: what is left is free memory
     * between live blocks, in chunks that can only go back whole. */
    snprintf(cause, sizeof cause,
             "fragmentation: %" PRIu64 " bytes are free in the pool, but the largest free "
             "block is %" PRIu64 " bytes and only %" PRIu64 " more can be reserved; %s",
             p->c.free, largest, room,
             p->growable ? "the free pieces lie between live blocks, and memory goes back to "
                           "the device only in whole chunks (near the limit, single granules): "
                           "free or shrink long-lived allocations, or set a smaller minimum "
                           "chunk (large_segment, small_segment) for what is mapped while "
                           "memory is plentiful"
                         : "expandable_segments:true lets free chunks coalesce");
  else
    snprintf(cause, sizeof cause,
             "a real shortage: live allocations hold %" PRIu64 " bytes; free memory, ask for "
             "less, or raise memory_limit", p->c.allocated.current);
  return gma__set_error(
                        GMA_ERR_OOM,
                        "cannot allocate %zu bytes (%" PRIu64 " rounded) on stream %p: %s. In the pool: allocated %" PRIu64
                        ", reserved %" PRIu64 " (%" PRIu64 " cached in stream trees, %" PRIu64
                        " pending other streams' work, %" PRIu64 " free), device free %" PRIu64 " of %" PRIu64
                        ", memory_limit %" PRIu64 "%s%s",
                        requested, size, stream, cause, p->c.allocated.current, p->c.reserved.current,
                        p->c.stream_cached, p->c.pending, p->c.free, dev_free, dev_total, p->limit,
                        device_failure ? ". A device call failed meanwhile, so completed work may not have been "
                        "seen: "
                        : "",
                        device_failure ? device_failure : "");
}

/* Before an OOM, wait (called and returning with the lock held, which it
 * drops while the host waits): until some device work that still uses freed
 * memory finishes, then what it gated is released, whole free segments go
 * back, and the caller searches again. True when something completed, so a
 * retry may succeed; false when nothing freed waits for device work, or the
 * oom_wait_ms deadline passed, or when need bytes cannot fit even once all
 * that work is done: the limit less the bytes allocated now is less than
 * need, so a real shortage fails at once instead of waiting for unrelated
 * kernels. Each round needs some work to complete. Rounds in which work
 * completed have no cap (a cap of 64 rounds in all made a call fail after
 * 0.2 s under oom_wait_ms:60000 with everything reserved pending, three
 * threads taking turns at what completed; a round may free nothing while a
 * block still waits for a second stream). OOM_ERROR_ROUNDS rounds in a row
 * that ended on a failed event query end it: after a sticky device error
 * the same round would otherwise repeat forever. */
#define OOM_ERROR_ROUNDS 64
bool gma__oom_wait(gma__pool_t *p, gma__oom_waiting_t *w, uint64_t need) {
  gma__stats_sample(p); /* allocated.current, with the bins' traffic */
  /* What stays in use whatever device work completes: the allocations
   * outside arenas, and the arenas whole (their allocations are in them). */
  uint64_t live = p->c.allocated.current - p->c.inner_live + p->c.arena;
  if (live >= p->limit || p->limit - live < need) {
    w->stop = GMA__OOM_SHORT;
    w->live = live;
    return false;
  }
  /* Memory used outside gma (another process, another allocator) does not
   * come back when gma's device work completes: what gma can ever get is
   * the device's free memory plus what it holds beyond the live bytes. */
  uint64_t dev_free = 0, dev_total = 0, held = p->c.reserved.current + p->leaving;
  if (p->dev->ops->mem_info(p->dev, &dev_free, &dev_total) == GMA_OK &&
      dev_free + (held > live ? held - live : 0) < need) {
    w->stop = GMA__OOM_OUTSIDE;
    w->live = live;
    w->dev_free = dev_free;
    return false;
  }
  if (w->errors >= OOM_ERROR_ROUNDS) {
    w->stop = GMA__OOM_ERRORS;
    return false;
  }
  if (!w->start_ns) w->start_ns = gma__now_ns();
  if (p->leaving) { /* a trim is giving memory back to the device right now */
    p->c.oom_waits += w->rounds++ == 0;
    p->uncaptured = NULL; /* the lock is dropped: a capture may begin meanwhile */
    while (p->leaving) pthread_cond_wait(&p->settled, &p->lock);
    return true;
  }
  uint64_t deadline = p->oom_wait_ns == UINT64_MAX ? UINT64_MAX : w->start_ns + p->oom_wait_ns;
  if (deadline != UINT64_MAX && gma__now_ns() >= deadline) {
    w->stop = GMA__OOM_DEADLINE;
    return false;
  }
  gma__event_t evs[GMA__OOM_WAIT_EVENTS];
  uint64_t gated = p->c.pending + p->c.stream_cached;
  size_t n = gma__streams_wait_begin(p, evs, GMA__OOM_WAIT_EVENTS);
  if (!n) {
    /* Every event that gated freed memory may have completed since the
     * caller's search (wait_begin observed them): what they gated is
     * settled now, and the caller searches again. Each such round frees
     * gated bytes, so the rounds end. */
    gma__streams_poll(p, false);
    if (p->c.pending + p->c.stream_cached < gated) return true;
    w->stop = GMA__OOM_NOTHING;
    return false;
  }
  p->c.oom_waits += w->rounds++ == 0; /* one per call that waited */
  p->uncaptured = NULL; /* the lock is dropped: a capture may begin meanwhile */
  gma__unlock(&p->lock);
  /* 0: the deadline; the next call says so. */
  int got = gma__streams_wait_any(p, evs, n, deadline);
  char why[sizeof p->last_device_error];
  if (got < 0) snprintf(why, sizeof why, "%s", gma__error_detail(gma_last_error()));
  gma__lock(&p->lock, GMA__RANK_POOL);
  if (got < 0) gma__pool_device_error(p, why);
  gma__streams_wait_end(p);
  (void)gma__release_free_segments(p, need);
  w->errors = got < 0 ? w->errors + 1 : 0;
  return true; /* search once more: work may have completed even at the deadline */
}

void gma__pool_device_error(gma__pool_t *p, const char *said) {
  p->c.device_errors++;
  snprintf(p->last_device_error, sizeof p->last_device_error, "%s",
           said ? said : gma__error_detail(gma_last_error()));
}

void gma__pool_oom_count(gma__pool_t *p, size_t requested, gma_stream_t stream) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  count_oom(p, requested, stream, gma__round_up(requested, GMA__ROUND));
  gma__unlock(&p->lock);
}

gma_status_t gma__pool_oom_report(gma__pool_t *p, uint64_t bytes, gma_stream_t stream) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma_status_t st =
      gma__oom_error(p, gma__round_up(bytes, GMA__ROUND), (size_t)bytes, stream, GMA__ALLOC_FUTURE, NULL);
  gma__unlock(&p->lock);
  return st;
}
