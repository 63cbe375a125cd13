/* Owns stream epochs: closing them with events, observing their completion
 * (through epoch marks where the device writes them, else event queries),
 * the spare-event pool, draining the lock-free bins into the pool, moving
 * blocks whose epochs completed to the shared free pool, the device-side wait
 * of reuse:wait, retiring streams (and rescuing frees that raced a retire),
 * the epochs a synchronize through gma completes, and the OOM path's host
 * wait for device work. Every function here runs under the pool lock. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/internal.h"
#include "base/lock.h"
#include "base/tsan.h"

/* Event queries per stream when the slow path settles pending blocks or
 * makes room for an epoch event: the newest event, the oldest and one
 * halving step. A poll before the pool grows asks without bound. */
#define SETTLE_QUERIES 3u

/* An event to record on s: from the spare pool, or made for s when s is of
 * another context (foreign) and takes only its own. */
static gma__event_t event_get(gma__pool_t *p, const gma__stream_t *s) {
  if (!s->foreign && p->nspare) return p->spare_events[--p->nspare];
  gma__event_t ev = NULL;
  gma_status_t st = s->foreign ? p->dev->ops->event_create_for(p->dev, s->handle, &ev)
                               : p->dev->ops->event_create(p->dev, &ev);
  if (st != GMA_OK) {
    gma__pool_device_error(p, NULL);
    return NULL;
  }
  return ev;
}

/* Destroys an event gma no longer needs. An OOM waiter may be querying it
 * without the lock (gma__streams_wait_begin pinned the events it copied):
 * then destroy it only once the waiters are done, and if even that list is
 * full, leak the event rather than destroy a handle in use. */
static void event_discard(gma__pool_t *p, gma__event_t ev) {
  if (!p->event_pins)
    p->dev->ops->event_destroy(p->dev, ev);
  else if (p->ndeferred < GMA__DEFERRED_EVENTS)
    p->deferred[p->ndeferred++] = ev;
}

/* Gives back an event of s: to the spare pool, unless s's events are its own
 * (foreign) or there is no host memory to keep it. */
static void event_put(gma__pool_t *p, const gma__stream_t *s, gma__event_t ev) {
  if (s->foreign) {
    event_discard(p, ev);
    return;
  }
  if (p->nspare == p->spare_cap) {
    size_t cap = p->spare_cap ? p->spare_cap * 2 : 16;
    gma__event_t *a = realloc(p->spare_events, cap * sizeof *a);
    if (!a) {
      event_discard(p, ev);
      return;
    }
    p->spare_events = a;
    p->spare_cap = cap;
  }
  p->spare_events[p->nspare++] = ev;
}

/* A retired stream's bins are drained too (a free that raced with its
 * retire may have pushed after the retire's own drain; see
 * gma__stream_rescue): such a block counts as freed after the retire, as a
 * slow-path free then would, so its epoch is at most free_epoch. Its own
 * epoch may be the one opened after the closing event, which no event will
 * ever close: kept, it would strand the block until gma_destroy. */
void gma__stream_drain_bins(gma__pool_t *p, gma__stream_t *s) {
  if (!s->bins) return;
  bool retired = gma__load_relaxed(&s->retired); /* written under the lock we hold */
  gma__tcount_t *c = gma__tcount(p, s);
  for (unsigned i = 0; i < p->nbins; i++) {
    if (ck_pr_load_ptr(&s->bins[i].stack.head) == NULL) continue; /* not the soft count */
    /* One swap takes the whole stack; frees racing with it push onto the
     * now empty stack and are drained next time. */
    ck_stack_entry_t *e = ck_stack_batch_pop_mpmc(&s->bins[i].stack);
    gma__tsan_acquire(&s->bins[i].stack); /* pairs with gma__bin_free's release after its push */
    gma__store_relaxed(&s->bins[i].count, 0); /* empty now: resets the soft bound */
    while (e) {
      gma__block_t *b = (gma__block_t *)((char *)e - offsetof(gma__block_t, bin_link));
      e = e->next;
      gma__tsan_acquire(b); /* pairs with gma__bin_free's release */
      gma__counter_add_owner(&c->bin_out, b->size);
      if (retired && b->epoch > s->free_epoch) b->epoch = s->free_epoch;
      gma__store_relaxed(&b->state, GMA__CACHED);
      gma__cache_block(p, b);
    }
  }
}

/* Whether the event of s's i-th outstanding epoch (0: the oldest) has
 * completed; false, with the error counted, when the query failed. */
static bool event_done(gma__pool_t *p, const gma__stream_t *s, unsigned i, bool *failed) {
  bool done = false;
  if (p->dev->ops->event_query(p->dev, s->ev[(s->ev_head + i) % GMA__EPOCH_EVENTS], &done) !=
      GMA_OK) {
    gma__pool_device_error(p, NULL);
    *failed = true;
    return false;
  }
  return done;
}

/* Gives back s's n oldest epoch events, completed: safe_epoch passes them. */
static void retire_events(gma__pool_t *p, gma__stream_t *s, unsigned n) {
  unsigned last = (s->ev_head + n - 1) % GMA__EPOCH_EVENTS;
  /* A synchronize through gma may have advanced it further already. */
  if (n && s->ev_epoch[last] > s->safe_epoch) s->safe_epoch = s->ev_epoch[last];
  for (; n; n--) {
    event_put(p, s, s->ev[s->ev_head]);
    s->ev_head = (s->ev_head + 1) % GMA__EPOCH_EVENTS;
    s->ev_count--;
  }
}

/* Epoch marks. Where the device can write a word of pinned memory in
 * stream order (stream_write_value), each close queues, right after its
 * event, a write of the epoch it closed into the stream's mark: once the
 * word says epoch k, the event closing k and every one before it has
 * completed. Observing a stream is then a load, not a driver call per
 * event: what the slow path and the worker ask most costs nothing. The
 * events stay, for the device-side waits and the OOM path. A stream of
 * another context, one whose write failed, and the records beyond
 * GMA__MARKS have no mark: their events are queried. */
void gma__streams_init(gma__pool_t *p) {
  const gma__device_ops_t *ops = p->dev->ops;
  if (!ops->stream_write_value || !ops->host_alloc) return;
  void *host = NULL;
  uintptr_t dev_addr = 0;
  uint32_t *idx = malloc(GMA__MARKS * sizeof *idx);
  if (!idx || ops->host_alloc(p->dev, GMA__MARKS * sizeof(uint64_t), &host, &dev_addr) != GMA_OK) {
    free(idx); /* no marks: events are queried, which is correct too */
    return;
  }
  p->marks = host;
  p->marks_dev = dev_addr;
  p->marks_free = idx;
  for (uint32_t i = 0; i < GMA__MARKS; i++) idx[i] = GMA__MARKS - 1 - i;
  p->nmarks_free = GMA__MARKS;
}

void gma__stream_mark_take(gma__pool_t *p, gma__stream_t *s) {
  if (!p->nmarks_free || s->foreign) return;
  uint32_t i = p->marks_free[--p->nmarks_free];
  s->mark = &p->marks[i];
  gma__store_relaxed(s->mark, 0); /* no device write is queued to it (see mark_give) */
  s->mark_written = 0;
}

/* Gives s's mark back for another record, once no write to it is still
 * queued on the device (else it stays s's, unused). */
static void mark_give(gma__pool_t *p, gma__stream_t *s) {
  if (!s->mark || gma__load_acquire(s->mark) < s->mark_written) return;
  p->marks_free[p->nmarks_free++] = (uint32_t)(s->mark - p->marks);
  s->mark = NULL;
}

/* Queues the write of closing into s's mark after the event that closed
 * it; without it (a failed write) s's events are queried from now on. */
static void mark_write(gma__pool_t *p, gma__stream_t *s, uint64_t closing) {
  if (!s->mark) return;
  uintptr_t dev_addr = p->marks_dev + (uintptr_t)(s->mark - p->marks) * sizeof(uint64_t);
  gma_status_t st = p->test_flags & GMA__TEST_MARK_EARLY
                        ? (gma__store_release(s->mark, closing), GMA_OK)
                        : p->dev->ops->stream_write_value(p->dev, s->handle, dev_addr, closing);
  if (st == GMA_OK) {
    s->mark_written = closing;
    return;
  }
  gma__pool_device_error(p, NULL);
  s->mark = NULL; /* a write may still be queued: the word is not used again */
}

/* Gives back the events of s whose epochs its mark says completed. */
static void observe_mark(gma__pool_t *p, gma__stream_t *s) {
  uint64_t done = gma__load_acquire(s->mark);
  unsigned n = 0;
  while (n < s->ev_count && s->ev_epoch[(s->ev_head + n) % GMA__EPOCH_EVENTS] <= done) n++;
  retire_events(p, s, n);
}

/* Advances safe_epoch past every completed epoch event, spending at most
 * *budget queries (UINT_MAX: no bound). Events of one stream complete in the
 * order they were recorded, so the completed ones are a prefix: the newest
 * is asked first (complete: all are), then the oldest (not complete: none
 * is), then the boundary is found by halving. A stream with a mark asks
 * nothing: a load says how far it got. */
static void observe_within(gma__pool_t *p, gma__stream_t *s, unsigned *budget) {
  if (s->mark) {
    observe_mark(p, s);
    return;
  }
  if (!s->ev_count || !*budget) return;
  bool failed = false;
  unsigned hi = s->ev_count; /* not complete (or past the end) */
  if (hi > 1) {
    (*budget)--;
    if (event_done(p, s, hi - 1, &failed)) {
      retire_events(p, s, hi);
      return;
    }
    if (failed || !*budget) return;
    hi--;
  }
  (*budget)--;
  if (!event_done(p, s, 0, &failed)) return;
  unsigned lo = 0; /* known complete */
  while (!failed && hi - lo > 1 && *budget) {
    unsigned mid = lo + (hi - lo) / 2;
    (*budget)--;
    if (event_done(p, s, mid, &failed)) lo = mid; else hi = mid;
  }
  retire_events(p, s, lo + 1);
}

static void observe_epochs(gma__pool_t *p, gma__stream_t *s) {
  unsigned unbounded = UINT_MAX;
  observe_within(p, s, &unbounded);
}

/* Whether s is capturing a CUDA graph now: a capture gma was told of
 * (gma_capture_begin), or one the device reports (a stream that joined a
 * capture through an event, or a capture begun without telling gma). An
 * event recorded there would be part of the graph: it would never complete
 * outside it (CUDA answers CUDA_ERROR_CAPTURED_EVENT to its queries), and
 * another stream waiting on it would join the capture. A failed query
 * counts as capturing: the epoch stays open, which is always safe. */
static bool capturing(gma__pool_t *p, const gma__stream_t *s) {
  if (p->test_flags & GMA__TEST_NO_CAPTURE_CHECK) return false;
  if (s->captures) return true;
  if (!p->dev->ops->stream_capture) return false;
  if (s == p->uncaptured) return false; /* asked by this locked call already */
  bool on = false;
  uint64_t id = 0;
  return p->dev->ops->stream_capture(p->dev, s->handle, &on, &id) != GMA_OK || on;
}

/* The legacy default stream (NULL, CU_STREAM_LEGACY): an event recorded there
 * waits for every blocking stream, and a blocking stream's later work waits
 * for it, so a record the program did not make could hold its streams up. */
static bool is_legacy(gma_stream_t h) { return h == NULL || h == (gma_stream_t)(uintptr_t)0x1; }

/* Closes the open epoch of s by recording one event, if anything was freed
 * in it; true when it did. The epoch is raised before the record (see
 * gma__bin_free for why). When all GMA__EPOCH_EVENTS slots hold events that
 * have not completed, the newest one is recorded again and takes the new
 * epoch: a later record covers all earlier work, so its older epoch is still
 * covered (only later). A failed device call leaves blocks where they are
 * (safe); the next poll tries again. Another thread's per-thread stream
 * cannot be named from here. */
static bool close_epoch(gma__pool_t *p, gma__stream_t *s) {
  if (!gma__load_relaxed(&s->dirty)) return false;
  if (s->owner_tid && s->owner_tid != gma__thread_id()) return false;
  if (gma__tl_background && is_legacy(s->handle)) return false; /* the program's own calls close it */
  if (capturing(p, s)) return false; /* closed by the first poll after the capture */
  unsigned budget = SETTLE_QUERIES;
  if (s->ev_count == GMA__EPOCH_EVENTS) observe_within(p, s, &budget);
  bool reuse_newest = s->ev_count == GMA__EPOCH_EVENTS;
  unsigned slot = (s->ev_head + s->ev_count - (reuse_newest ? 1 : 0)) % GMA__EPOCH_EVENTS;
  gma__event_t ev = reuse_newest ? s->ev[slot] : event_get(p, s);
  if (!ev) return false;
  gma__store_relaxed(&s->dirty, false);
  uint64_t closing = gma__faa_relaxed(&s->epoch, 1);
  if (p->dev->ops->event_record(p->dev, ev, s->handle) != GMA_OK) {
    /* The epoch stays raised: blocks of `closing` are merely not yet gated by
     * an event; the next close covers them, since it covers all earlier work. */
    gma__pool_device_error(p, NULL);
    gma__store_relaxed(&s->dirty, true);
    if (!reuse_newest) event_put(p, s, ev);
    return false;
  }
  s->ev[slot] = ev;
  s->ev_epoch[slot] = closing;
  if (!reuse_newest) s->ev_count++;
  p->c.epoch_events++;
  mark_write(p, s, closing);
  return true;
}

/* Moves the stream's cached blocks whose epoch completed to the free pool. */
static void release_safe_cached(gma__pool_t *p, gma__stream_t *s) {
  while (s->fifo_head && s->fifo_head->epoch <= s->safe_epoch) {
    gma__block_t *b = s->fifo_head;
    gma__cached_unlink(p, b);
    gma__block_make_free(p, b);
  }
}

/* Marks s as one a pending block waits for until epoch (2: that epoch is
 * still open, so no event covers it yet). */
static void mark_gating(gma__stream_t *s, uint64_t epoch) {
  if (s->safe_epoch >= epoch) return;
  uint8_t g = gma__load_relaxed(&s->epoch) <= epoch ? 2 : 1;
  if (g > s->gating) s->gating = g;
}

/* Only the streams a pending block waits for are asked: a gate's epoch was
 * closed by the free, so it is observed, and closed here only where the
 * free could not close it. The asking stream's own blocks need only
 * their gates (gma__pending_poll), so its own open epoch is left alone;
 * another owner's epoch is closed and observed as a gate's is. */
void gma__streams_settle_pending(gma__pool_t *p, const gma__stream_t *asking) {
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) s->gating = 0;
  for (gma__block_t *b = p->pending_head; b; b = b->qnext) {
    if (b->stream != asking || gma__load_relaxed(&b->stream->retired))
      mark_gating(b->stream, b->epoch);
    uint32_t n = gma__load_relaxed(&b->ngates);
    for (uint32_t i = 0; i < n; i++) mark_gating(b->gates[i].stream, b->gates[i].epoch);
  }
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) {
    if (!s->gating) continue;
    /* With every event slot busy the device is far behind: re-recording the
     * newest event would only add a call (the next close covers it). */
    if (s->gating == 2 && s->ev_count < GMA__EPOCH_EVENTS && !gma__load_relaxed(&s->retired))
      close_epoch(p, s);
    unsigned budget = SETTLE_QUERIES;
    observe_within(p, s, &budget);
  }
  gma__pending_poll(p, asking);
}

/* Drains every stream's bins (with drain), closes each open epoch that
 * holds frees, and observes which epochs completed (never waits). */
static void close_all(gma__pool_t *p, bool drain) {
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) {
    if (drain) gma__stream_drain_bins(p, s);
    if (!gma__load_relaxed(&s->retired)) close_epoch(p, s);
    observe_epochs(p, s);
  }
}

/* Every stream's epochs are observed and pending blocks settled before any
 * stream's safe cached blocks are released: under reuse:none a pending block
 * whose gates passed goes back to its stream's cache, and a forced poll
 * (gma_empty_cache) must then release it in the same call. */
static void settle_all(gma__pool_t *p, bool drain, bool force) {
  close_all(p, drain);
  gma__pending_poll(p, NULL);
  if (!force && p->reuse == GMA_REUSE_NONE) return;
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) release_safe_cached(p, s);
}

void gma__streams_poll(gma__pool_t *p, bool force) { settle_all(p, true, force); }

void gma__streams_observe(gma__pool_t *p) { settle_all(p, false, false); }

void gma__streams_drain(gma__pool_t *p) {
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) gma__stream_drain_bins(p, s);
  if (p->reuse == GMA_REUSE_NONE) return;
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) release_safe_cached(p, s);
}

uint64_t gma__stream_sync_begin(gma__pool_t *p, gma__stream_t *s) {
  /* Something was freed in the open epoch: close it with an event, as a
   * poll would, so that another thread's OOM wait has that event to wait
   * on while this one waits for the whole stream (without it, the wait
   * found nothing gated by an event and failed, though the memory was free
   * as soon as this synchronize returned). The lock is held: the epoch the
   * event closed is the one before the open one. */
  if (gma__load_relaxed(&s->dirty) && !gma__load_relaxed(&s->retired) && close_epoch(p, s))
    return gma__load_relaxed(&s->epoch) - 1;
  /* Else as in close_epoch: dirty is cleared and the epoch raised before the
   * device call, so a free racing with it either lands in the closed epoch
   * (its work was queued before the synchronize began) or in the new one. */
  gma__store_relaxed(&s->dirty, false);
  return gma__faa_relaxed(&s->epoch, 1);
}

void gma__stream_sync_end(gma__pool_t *p, gma__stream_t *s, uint64_t closed) {
  /* A stream retired meanwhile (and perhaps destroyed, its handle given to
   * a new stream that was synchronized instead): its closing event covers
   * the closed epoch; let that event say when. */
  if (closed > s->safe_epoch && !gma__load_relaxed(&s->retired)) s->safe_epoch = closed;
  observe_epochs(p, s); /* events of epochs <= closed completed too: reuse them */
  gma__pending_poll(p, NULL);
  if (p->reuse != GMA_REUSE_NONE || gma__load_relaxed(&s->retired)) release_safe_cached(p, s);
}

/* Sleeps about us microseconds (the OOM wait's polling). */
static void nap_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000};
  nanosleep(&ts, NULL);
}

size_t gma__streams_wait_begin(gma__pool_t *p, gma__event_t *evs, size_t cap) {
  close_all(p, true);
  if (p->c.stream_cached == 0 && p->c.pending == 0) return 0; /* nothing is gated */
  size_t n = 0;
  for (gma__stream_t *s = p->stream_list; s && n < cap; s = s->next_all)
    if (s->ev_count) evs[n++] = s->ev[s->ev_head]; /* the oldest: the first to free something */
  if (n) p->event_pins++;
  return n;
}

int gma__streams_wait_any(gma__pool_t *p, const gma__event_t *evs, size_t n,
                          uint64_t deadline_ns) {
  for (uint64_t nap = 10;; nap = nap < 1000 ? nap * 2 : 1000) {
    for (size_t i = 0; i < n; i++) {
      bool done = false;
      /* A device error ends the wait too: the caller observes under the
       * lock, where the error is counted, and decides again. */
      if (p->dev->ops->event_query(p->dev, evs[i], &done) != GMA_OK) return -1;
      if (done) return 1;
    }
    if (gma__now_ns() >= deadline_ns) return 0;
    nap_us(nap);
  }
}

void gma__streams_wait_end(gma__pool_t *p) {
  if (--p->event_pins == 0) { /* destroy what event_put could not keep meanwhile */
    for (size_t i = 0; i < p->ndeferred; i++) p->dev->ops->event_destroy(p->dev, p->deferred[i]);
    p->ndeferred = 0;
  }
  gma__streams_poll(p, true); /* what the completed work gated becomes free */
}

/* The place (0: the oldest) of s's first event recorded at or after the
 * close of epoch, which covers every block freed on s up to it; ev_count
 * when none does yet. */
static unsigned covering(const gma__stream_t *s, uint64_t epoch) {
  unsigned i = 0;
  while (i < s->ev_count && s->ev_epoch[(s->ev_head + i) % GMA__EPOCH_EVENTS] < epoch) i++;
  return i;
}

/* Makes u wait on the device for s's i-th event; false when the wait failed. */
static bool wait_on(gma__pool_t *p, gma__stream_t *u, gma__stream_t *s, unsigned i) {
  if (p->dev->ops->stream_wait_event(p->dev, u->handle,
                                     s->ev[(s->ev_head + i) % GMA__EPOCH_EVENTS]) != GMA_OK) {
    gma__pool_device_error(p, NULL);
    return false;
  }
  p->c.cross_stream_waits++;
  return true;
}

bool gma__stream_close_epoch(gma__pool_t *p, gma__stream_t *s) {
  return !gma__load_relaxed(&s->retired) && close_epoch(p, s);
}

bool gma__gate_settle(gma__pool_t *p, const gma__gate_t *g, gma__stream_t *u, bool wait) {
  gma__stream_t *s = g->stream;
  if (s->safe_epoch >= g->epoch) return true;
  /* The epoch that holds the free may still be open: close it (one event)
   * so that completion can be seen at all. */
  if (!gma__load_relaxed(&s->retired) && gma__load_relaxed(&s->epoch) <= g->epoch)
    close_epoch(p, s);
  /* Not closed (another thread's per-thread stream) or its event failed:
   * no event to wait on. */
  unsigned i = covering(s, g->epoch);
  if (i == s->ev_count) return false;
  /* A device-side wait costs what a query does and holds either way: a
   * completed event's wait is nothing to the device. */
  if (wait && s != u) return wait_on(p, u, s, i);
  if (s->mark) {
    observe_mark(p, s);
    return s->safe_epoch >= g->epoch;
  }
  bool failed = false;
  if (!event_done(p, s, i, &failed)) return false;
  retire_events(p, s, i + 1);
  return true;
}

/* Best fit for size among the CACHED blocks of streams other than u; its
 * stream's epoch is closed now if still open (one event), then u waits for
 * that event on the device (gma__gate_settle). */
gma__block_t *gma__streams_wait_fit(gma__pool_t *p, gma__stream_t *u, int kind, uint64_t size) {
  gma__block_t *best = NULL;
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) {
    if (s == u) continue;
    for (gma__block_t *n = s->cached_tree[kind]; n;) { /* best fit in s's tree */
      if (n->size >= size) {
        if (!best || n->size < best->size) best = n;
        n = n->left;
      } else {
        n = n->right;
      }
    }
  }
  if (!best) return NULL;
  gma__gate_t g = {best->stream, best->epoch};
  return gma__gate_settle(p, &g, u, true) ? best : NULL;
}

/* Retiring a stream whose closing event could not be created or recorded
 * (a device error) must not orphan it, which would strand its cached and
 * pending memory until gma_destroy. Instead, wait for the stream on the host (on this error path
 * only; the caller holds the pool lock, as host.c's free does for its own
 * fallback): all work queued on it has then finished, so every epoch up to
 * the open one is complete, and so are its events. True when that worked;
 * false, with the device's message set, when the wait failed too or the
 * stream is another thread's per-thread stream, which this thread cannot
 * name. */
static bool close_by_sync(gma__pool_t *p, gma__stream_t *s) {
  if (s->owner_tid && s->owner_tid != gma__thread_id()) {
    gma__set_error(GMA_ERR_DEVICE, "another thread's per-thread stream");
    return false;
  }
  /* Raised before the wait, as before a record (see close_epoch). */
  uint64_t closing = gma__faa_relaxed(&s->epoch, 1);
  if (p->dev->ops->stream_synchronize(p->dev, s->handle) != GMA_OK) return false;
  for (; s->ev_count; s->ev_count--) { /* recorded before the wait: complete */
    event_put(p, s, s->ev[s->ev_head]);
    s->ev_head = (s->ev_head + 1) % GMA__EPOCH_EVENTS;
  }
  s->safe_epoch = closing;
  gma__store_relaxed(&s->dirty, false);
  return true;
}

gma_status_t gma__stream_retire(gma__pool_t *p, gma__stream_t *s, bool orphan) {
  gma_status_t st = GMA_OK;
  gma__stream_drain_bins(p, s);
  if (!orphan) {
    gma__store_relaxed(&s->dirty, true); /* close even an empty epoch: one last event */
    if (!close_epoch(p, s)) {
      /* Still an error (the device failed), but see close_by_sync. */
      char why[400];
      snprintf(why, sizeof why, "%s", gma__error_detail(gma_last_error()));
      bool synced = close_by_sync(p, s);
      if (synced)
        st = gma__set_error(GMA_ERR_DEVICE, "gma_stream_retire(%p): could not record the closing "
                            "event (%s); waited for the stream instead, so its cached memory "
                            "is reusable", s->handle, why);
      else
        st = gma__set_error(GMA_ERR_DEVICE, "gma_stream_retire(%p): could not record the closing "
                            "event (%s), nor wait for the stream (%s); the stream's cached "
                            "memory stays reserved until gma_destroy", s->handle, why,
                            gma__error_detail(gma_last_error()));
      orphan = !synced;
    }
  }
  /* Later frees of blocks allocated on s carry free_epoch: the closed epoch,
   * or, for an orphan, one that never completes. */
  s->free_epoch = orphan ? UINT64_MAX : gma__load_relaxed(&s->epoch) - 1;
  /* Sequentially consistent, then drain again: the other half of a Dekker
   * pair with gma__bin_free (push, fence, load retired). Either that free
   * sees retired and drains the bin itself (gma__stream_rescue), or this
   * drain sees its block: a free pushing between the first drain and this
   * store would otherwise strand its block in a bin nobody drains. */
  gma__store_seq_cst(&s->retired, true);
  gma__fence_seq_cst(); /* before the drain's loads of the stacks */
  gma__stream_drain_bins(p, s);
  gma__stable_remove(p, s);
  observe_epochs(p, s);
  release_safe_cached(p, s);
  gma__pending_poll(p, NULL);
  if (++p->retired_listed >= p->sweep_at) gma__streams_sweep_retired(p);
  return st;
}

bool gma__stream_was_retired(gma__pool_t *p, gma_stream_t handle, uint64_t id) {
  /* The default streams always exist; a per-thread stream's id may even be
   * an exited thread's (the simulated device gives its stream to a new
   * thread), whose record was retired at that thread's exit. */
  if ((uintptr_t)handle <= 2) return false;
  bool retired = false;
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__stream_t *live = gma__stream_find(p, handle);
  if (!live || live->id != id) /* used again since the retire: a live record */
    for (int l = 0; l < 2 && !retired; l++)
      for (gma__stream_t *s = l ? p->graveyard : p->stream_list; s && !retired; s = s->next_all)
        retired = s->id == id && gma__load_relaxed(&s->retired);
  gma__unlock(&p->lock);
  return retired;
}

void gma__stream_rescue(gma__pool_t *p, gma__stream_t *s) {
  gma__stream_drain_bins(p, s); /* clamps the blocks' epochs to free_epoch */
  observe_epochs(p, s);
  release_safe_cached(p, s);
  /* A swept record is no longer polled: what the late free counted must
   * reach the graveyard's totals, and what it cached must not wait for a
   * poll. A record is swept only when its events all completed, so every
   * block of a non-orphan record was released just now. */
  if (s->swept) gma__stats_bury(s, &p->graveyard_counts);
}

static bool bins_empty(const gma__pool_t *p, gma__stream_t *s) {
  for (unsigned i = 0; s->bins && i < p->nbins; i++)
    if (ck_pr_load_ptr(&s->bins[i].stack.head) != NULL) return false;
  return true;
}

void gma__streams_sweep_retired(gma__pool_t *p) {
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) s->referenced = false;
  for (size_t i = 0; i < p->nsegs; i++)
    for (gma__block_t *b = p->segs[i]->first; b; b = b->next) {
      if (gma__load_relaxed(&b->state) == GMA__FREE) continue;
      if (b->stream) b->stream->referenced = true;
      uint32_t n = gma__load_relaxed(&b->ngates);
      for (uint32_t k = 0; k < n; k++) b->gates[k].stream->referenced = true;
    }
  size_t kept_retired = 0;
  for (gma__stream_t **link = &p->stream_list; *link;) {
    gma__stream_t *s = *link;
    if (!gma__load_relaxed(&s->retired)) {
      link = &s->next_all;
      continue;
    }
    if (s->referenced || s->ev_count || s->fifo_head || !bins_empty(p, s)) {
      kept_retired++;
      link = &s->next_all;
      continue;
    }
    /* Only a free that raced with the retire can still add to its counters
     * (gma__stream_rescue buries those too). */
    *link = s->next_all;
    gma__stats_bury(s, &p->graveyard_counts);
    mark_give(p, s);
    s->swept = true;
    s->next_all = p->graveyard;
    p->graveyard = s;
  }
  p->retired_listed = kept_retired;
  p->sweep_at = kept_retired * 2 > 64 ? kept_retired * 2 : 64;
}

void gma__streams_fini(gma__pool_t *p) {
  /* A mark's write may still be queued (on a stream the program destroyed,
   * say): the page goes back only once the device has done it. A fork()
   * child's device is gone, and so is its copy of the page. */
  bool queued = false;
  for (gma__stream_t *s = p->stream_list; s && !p->inherited; s = s->next_all)
    queued = queued || (s->mark && gma__load_acquire(s->mark) < s->mark_written);
  if (queued) p->dev->ops->device_synchronize(p->dev);
  if (p->marks) p->dev->ops->host_free(p->dev, (void *)p->marks, GMA__MARKS * sizeof(uint64_t));
  free(p->marks_free);
  p->marks = NULL;
  p->marks_free = NULL;
  for (gma__stream_t *s = p->stream_list, *next; s; s = next) {
    next = s->next_all;
    for (unsigned i = 0; i < s->ev_count; i++)
      p->dev->ops->event_destroy(p->dev, s->ev[(s->ev_head + i) % GMA__EPOCH_EVENTS]);
    free(s);
  }
  p->stream_list = NULL;
  for (size_t i = 0; i < p->nspare; i++) p->dev->ops->event_destroy(p->dev, p->spare_events[i]);
  free(p->spare_events);
  p->spare_events = NULL;
  p->nspare = p->spare_cap = 0;
}

void gma__pool_stream_rescue(gma__pool_t *p, gma__stream_t *s) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__stream_rescue(p, s);
  GMA__VALIDATE(p);
  gma__unlock(&p->lock);
}
