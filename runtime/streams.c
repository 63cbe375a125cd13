/* Owns the stream records: the stream table (handle -> record), stream epochs
 * and their events, the spare-event pool, and moving blocks whose epochs have
 * completed from the stream caches and the pending list to the free pool.
 * Every function here runs under gma__pool_t.lock. */
#include <stdatomic.h>
#include <stdlib.h>

#include "pool.h"

/* Handle values with a meaning of their own, as in CUDA. */
#define STREAM_LEGACY ((gma_stream_t)0x1)
#define STREAM_PER_THREAD ((gma_stream_t)0x2)
/* Keys: real stream handles are pointers aligned to 8 or more, so keys with
 * low bits set cannot collide with them. The default stream (NULL or legacy)
 * maps to KEY_DEFAULT; a thread's per-thread stream to (thread id << 3) | 2. */
#define KEY_DEFAULT ((uintptr_t)0x4)

/* Thread ids are never reused, unlike pthread_t values or TLS addresses. */
static atomic_uint_fast64_t next_thread_id = 1;
static _Thread_local uint64_t thread_id;

static uint64_t my_thread_id(void) {
  if (thread_id == 0) thread_id = atomic_fetch_add_explicit(&next_thread_id, 1, memory_order_relaxed);
  return thread_id;
}

gma__stream_t *gma__stream_find(gma__pool_t *p, gma_stream_t handle, bool create) {
  uintptr_t key = (uintptr_t)handle;
  uint64_t owner = 0;
  if (handle == NULL || handle == STREAM_LEGACY) {
    key = KEY_DEFAULT;
  } else if (handle == STREAM_PER_THREAD) {
    owner = my_thread_id();
    key = (uintptr_t)(owner << 3) | 2;
  }
  gma__stream_t *s = gma__ptrmap_get(&p->streams, key);
  if (s || !create) return s;
  s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->handle = handle;
  s->key = key;
  s->owner_tid = owner;
  s->epoch = 1; /* epochs start at 1 so that safe_epoch 0 means "none yet" */
  if (!gma__ptrmap_put(&p->streams, key, s)) {
    free(s);
    return NULL;
  }
  s->next_all = p->stream_list;
  p->stream_list = s;
  return s;
}

static gma__event_t event_get(gma__pool_t *p) {
  if (p->nspare) return p->spare_events[--p->nspare];
  gma__event_t ev = NULL;
  if (p->dev->ops->event_create(p->dev, &ev) != GMA_OK) {
    p->c.device_errors++;
    return NULL;
  }
  return ev;
}

static void event_put(gma__pool_t *p, gma__event_t ev) {
  if (p->nspare == p->spare_cap) {
    size_t cap = p->spare_cap ? p->spare_cap * 2 : 16;
    gma__event_t *a = realloc(p->spare_events, cap * sizeof *a);
    if (!a) {
      p->dev->ops->event_destroy(p->dev, ev);
      return;
    }
    p->spare_events = a;
    p->spare_cap = cap;
  }
  p->spare_events[p->nspare++] = ev;
}

/* Closes the open epoch of s by recording an event, if anything was freed in
 * it. A failed device call leaves the epoch open: blocks then stay where they
 * are (safe), and the next poll tries again. */
static void close_epoch(gma__pool_t *p, gma__stream_t *s) {
  if (!s->dirty || s->ev_count == GMA__EPOCH_EVENTS) return;
  gma__event_t ev = event_get(p);
  if (!ev) return;
  if (p->dev->ops->event_record(p->dev, ev, s->handle) != GMA_OK) {
    p->c.device_errors++;
    event_put(p, ev);
    return;
  }
  unsigned slot = (s->ev_head + s->ev_count) % GMA__EPOCH_EVENTS;
  s->ev[slot] = ev;
  s->ev_epoch[slot] = s->epoch;
  s->ev_count++;
  s->epoch++;
  s->dirty = false;
}

/* Advances safe_epoch past every completed epoch event, oldest first. */
static void observe_epochs(gma__pool_t *p, gma__stream_t *s) {
  while (s->ev_count) {
    bool done = false;
    if (p->dev->ops->event_query(p->dev, s->ev[s->ev_head], &done) != GMA_OK) {
      p->c.device_errors++;
      return;
    }
    if (!done) return;
    s->safe_epoch = s->ev_epoch[s->ev_head];
    event_put(p, s->ev[s->ev_head]);
    s->ev_head = (s->ev_head + 1) % GMA__EPOCH_EVENTS;
    s->ev_count--;
  }
}

/* Moves the stream's cached blocks whose epoch completed to the free pool. */
static void release_safe_cached(gma__pool_t *p, gma__stream_t *s) {
  while (s->fifo_head && s->fifo_head->epoch <= s->safe_epoch) {
    gma__block_t *b = s->fifo_head;
    gma__cached_unlink(p, b);
    gma__block_make_free(p, b);
  }
}

void gma__streams_poll(gma__pool_t *p) {
  uint64_t me = my_thread_id();
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) {
    /* Another thread's per-thread stream cannot be named from this thread:
     * its blocks wait until that thread polls. */
    if (s->retired || (s->owner_tid && s->owner_tid != me)) continue;
    close_epoch(p, s);
    observe_epochs(p, s);
    release_safe_cached(p, s);
  }
  gma__pending_poll(p);
}

void gma__stream_retire(gma__pool_t *p, gma__stream_t *s) {
  /* The caller synchronized the stream: every epoch, open ones included, is
   * complete. The record stays (pending blocks' gates point at it) but leaves
   * the table, so a new stream reusing the handle value gets a fresh record. */
  while (s->ev_count) {
    event_put(p, s->ev[s->ev_head]);
    s->ev_head = (s->ev_head + 1) % GMA__EPOCH_EVENTS;
    s->ev_count--;
  }
  s->safe_epoch = UINT64_MAX;
  s->retired = true;
  s->dirty = false;
  gma__ptrmap_remove(&p->streams, s->key);
  release_safe_cached(p, s);
  gma__pending_poll(p);
}

void gma__streams_fini(gma__pool_t *p) {
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
