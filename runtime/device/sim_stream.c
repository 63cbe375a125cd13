/* The simulated device's streams: their threads, queued ops (kernels,
 * event records, event waits), the handle slots, the per-thread default
 * streams, and synchronization.
 *
 * Streams behave like CUDA's, including the case gma must survive: destroy
 * returns at once, the stream's queued work still runs on its thread, and the
 * handle VALUE goes to the next stream created (LIFO), possibly while the old
 * stream's work is still running. A user stream's handle is the address of a
 * slot: slots live in chunks that are freed only with the device, so an old
 * handle always points at readable memory and is validated by a range check,
 * never by dereferencing a stream that may be gone. The slot carries its
 * current stream and that stream's id; ids come from a process-wide 64-bit
 * counter and are never reused, so stream_id tells a recycled handle's new
 * stream from the old one without a lock. A stream object is freed by its own
 * thread once it was stopped (destroy), drained its queue and no caller holds
 * a reference. Per-thread default streams (0x2) are found through a small
 * thread-local cache keyed by the device's never-reused serial number.
 *
 * A stream thread holds no lock while it runs an op, so a kernel may call
 * into the device. */
#include <sched.h>

#include "device/sim_internal.h"
#include "base/clock.h"
#include "base/lock.h"

static _Thread_local sim_ptds_entry_t ptds_cache[SIM_PTDS_CACHE];
/* Hands out stream ids; relaxed is enough, each only needs a unique ticket. */
static _Atomic uint64_t sim_next_stream_id = 1;
/* The stream whose thread is the calling thread, NULL on other threads. */
static _Thread_local const struct sim_stream *sim_self;

/* ---------------------------------------------------------------------------
 * Streams
 * ------------------------------------------------------------------------- */
/* Under a cost preset, how long a WAIT polls its mark before it blocks. */
#define WAIT_POLL_NS 200000u

/* Caller holds ev_mu. A GPU resumes a stream that waits on an event within
 * a microsecond or two of the record; a stream thread woken through ev_cv
 * may take tens of microseconds to run again when the machine's cores are
 * busy with other streams' kernels, and a bounded lead (memory reused
 * behind device-side waits) would pay that at every wait. So, under a
 * preset, the waiting stream first looks again and again, giving its core
 * away between looks, for up to WAIT_POLL_NS. */
static void poll_mark(sim_device_t *dev, const sim_mark_t *m) {
  uint64_t t0 = gma__now_ns();
  while (!m->done && gma__now_ns() - t0 < WAIT_POLL_NS) {
    gma__unlock(&dev->ev_mu);
    sched_yield();
    gma__lock(&dev->ev_mu, GMA__RANK_SIM_EVENTS);
  }
}

/* Runs one op on the stream's thread. */
static void op_run(sim_device_t *dev, sim_op_t *op) {
  if (op->kind == SIM_OP_KERNEL) {
    op->fn(op->arg);
    return;
  }
  /* Under a preset, an event or a write behind work completes a little
   * after it. */
  if (op->kind != SIM_OP_WAIT && dev->costs) gma__sim_spin_ns(dev->costs->event_latency_ns);
  if (op->kind == SIM_OP_WRITE) {
    atomic_store_explicit(op->word, op->value, memory_order_release);
    return;
  }
  gma__lock(&dev->ev_mu, GMA__RANK_SIM_EVENTS);
  if (op->kind == SIM_OP_RECORD) {
    op->mark->done = true;
    pthread_cond_broadcast(&dev->ev_cv);
  } else {
    /* No cycle can block this forever: the RECORD of this mark was queued
     * before this WAIT, so by induction on queueing time it eventually runs. */
    if (dev->costs) poll_mark(dev, op->mark);
    while (!op->mark->done) pthread_cond_wait(&dev->ev_cv, &dev->ev_mu);
  }
  gma__sim_mark_unref(op->mark);
  op->mark = NULL; /* dropped: sim_forget must not drop it again */
  gma__unlock(&dev->ev_mu);
}

/* Frees a stream nobody references any more (or whose thread never started). */
static void stream_fini(sim_stream_t *s) {
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->work_cv);
  pthread_cond_destroy(&s->idle_cv);
  free(s);
}

/* Drops a reference (a stream_get's or the thread's own); true when it was
 * the last, and the caller then frees the stream after releasing streams_mu.
 * Caller holds streams_mu. */
static bool stream_unref_locked(sim_stream_t *s) {
  SIM_ASSERT(s->refs > 0);
  return --s->refs == 0;
}

/* Called by the stream's thread as its last act: leaves dev->all, drops the
 * thread's reference, and lets sim_destroy go on when it was the last thread.
 * After streams_mu is released nothing of dev is touched, because sim_destroy
 * may free it from then on. */
static void stream_exit(sim_stream_t *s) {
  sim_device_t *dev = s->dev;
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  *(s->all_prev ? &s->all_prev->all_next : &dev->all) = s->all_next;
  if (s->all_next) s->all_next->all_prev = s->all_prev;
  bool last = stream_unref_locked(s);
  if (--dev->threads == 0) pthread_cond_broadcast(&dev->streams_cv);
  gma__unlock(&dev->streams_mu);
  if (last) stream_fini(s);
}

/* The stream's own thread (detached): runs ops in queue order until stopped
 * and idle, then retires the stream. */
static void *stream_main(void *arg) {
  sim_stream_t *s = arg;
  sim_self = s;
  gma__lock(&s->mu, GMA__RANK_SIM_STREAM);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
    sim_op_t *op = s->head;
    if (!op) break; /* stopped and idle: stream_push queues nothing more */
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->busy = true;
    s->running = op;
    gma__unlock(&s->mu);
    op_run(s->dev, op);
    if (op->kind == SIM_OP_KERNEL) gma__fas_relaxed(&s->dev->kernels, 1);
    gma__lock(&s->mu, GMA__RANK_SIM_STREAM);
    s->busy = false;
    s->running = NULL;
    free(op); /* after running is cleared: sim_forget never sees a freed op */
    if (!s->head) pthread_cond_broadcast(&s->idle_cv);
  }
  gma__unlock(&s->mu);
  stream_exit(s);
  return NULL;
}

/* Allocates a stream with a fresh id, starts its (detached) thread and puts it
 * on dev->all; NULL if memory or the thread is lacking. Any thread. The thread
 * cannot exit before it is on dev->all: it exits only after stop, and stop is
 * set only on streams that callers can reach. */
sim_stream_t *gma__sim_stream_new(sim_device_t *dev) {
  sim_stream_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->dev = dev;
  s->id = gma__faa_relaxed(&sim_next_stream_id, 1);
  s->refs = 1; /* the thread's */
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->idle_cv, NULL);
  pthread_attr_t attr;
  pthread_t th;
  int rc = pthread_attr_init(&attr);
  if (rc == 0) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&th, &attr, stream_main, s);
    pthread_attr_destroy(&attr);
  }
  if (rc != 0) {
    stream_fini(s);
    return NULL;
  }
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  s->all_next = dev->all;
  if (dev->all) dev->all->all_prev = s;
  dev->all = s;
  dev->threads++;
  gma__unlock(&dev->streams_mu);
  return s;
}

/* Lets the stream's thread finish the queued work and exit; returns at once.
 * The caller makes sure s is still alive (its thread cannot exit before this). */
void gma__sim_stream_stop(sim_stream_t *s) {
  gma__lock(&s->mu, GMA__RANK_SIM_STREAM);
  s->stop = true;
  pthread_cond_signal(&s->work_cv);
  gma__unlock(&s->mu);
}

/* Blocks until the stream is idle. Any thread but the stream's own. */
static void stream_wait_idle(sim_stream_t *s) {
  gma__lock(&s->mu, GMA__RANK_SIM_STREAM);
  while (s->head || s->busy) pthread_cond_wait(&s->idle_cv, &s->mu);
  gma__unlock(&s->mu);
}

/* Maps a handle to its slot, or NULL when it is not a slot of this device.
 * Only chunk addresses are compared, nothing is dereferenced but the chunk
 * headers, so any value is safe. Any thread; lock-free (the chunk list only
 * grows, and each chunk is immutable once published). */
static sim_slot_t *slot_find(sim_device_t *dev, gma_stream_t h) {
  /* Acquire pairs with the release store in slot_take. */
  for (sim_chunk_t *c = gma__load_acquire(&dev->chunks); c; c = c->next) {
    uintptr_t off = (uintptr_t)h - (uintptr_t)c->slots;
    if (off < c->n * sizeof(sim_slot_t)) {
      return off & (sizeof(sim_slot_t) - 1) ? NULL : &c->slots[off / sizeof(sim_slot_t)];
    }
  }
  return NULL;
}

#if defined(GMA_DEBUG) && GMA_DEBUG >= 2
/* Checks the slot invariant (see sim_slot_t) over every handed-out slot and
 * that the free list holds only free slots; caller holds streams_mu. */
static bool slots_are_valid(sim_device_t *dev) {
  size_t n_free = 0, n_unused = 0;
  for (sim_slot_t *f = dev->free_slots; f; f = f->next_free, n_free++) {
    if (f->stream || gma__load_relaxed(&f->id) != 0) return false;
  }
  sim_chunk_t *newest = gma__load_relaxed(&dev->chunks);
  for (sim_chunk_t *c = newest; c; c = c->next) {
    size_t used = c == newest ? dev->chunk_used : c->n;
    for (size_t i = 0; i < c->n; i++) {
      const sim_slot_t *sl = &c->slots[i];
      uint64_t id = gma__load_relaxed(&sl->id);
      if (i >= used && (sl->stream || id != 0)) return false;
      if (sl->stream ? id != sl->stream->id : id != 0) return false;
      n_unused += i < used && !sl->stream;
    }
  }
  return n_free == n_unused;
}
#define SIM_SLOTS_CHECK(dev) assert(slots_are_valid(dev))
#else
#define SIM_SLOTS_CHECK(dev) ((void)0)
#endif

/* Takes a free slot: the most recently freed one (so a destroyed stream's
 * handle value is the next one created, as with CUDA), else a fresh one, from
 * a new chunk twice the size of the last when needed. NULL when out of host
 * memory. Caller holds streams_mu. */
static sim_slot_t *slot_take(sim_device_t *dev) {
  sim_slot_t *slot = dev->free_slots;
  if (slot) {
    dev->free_slots = slot->next_free;
    return slot;
  }
  sim_chunk_t *c = gma__load_relaxed(&dev->chunks);
  if (!c || dev->chunk_used == c->n) {
    size_t n = c ? c->n * 2 : SIM_FIRST_CHUNK_SLOTS;
    sim_chunk_t *nc = calloc(1, sizeof *nc + n * sizeof(sim_slot_t));
    if (!nc) return NULL;
    nc->next = c;
    nc->n = n;
    for (size_t i = 0; i < n; i++) gma__atomic_init(&nc->slots[i].id, 0);
    /* Release: a slot_find that sees nc also sees its next, n and zero ids. */
    gma__store_release(&dev->chunks, nc);
    dev->chunk_used = 0;
    c = nc;
  }
  return &c->slots[dev->chunk_used++];
}

/* Finds (or creates, on the thread's first use) the calling thread's
 * per-thread default stream. The thread-local cache answers without a lock;
 * a miss looks the thread up in dev->ptds. Keying that table by pthread_t
 * means a new thread may inherit an exited thread's stream (at worst behind
 * work the old thread queued, which stream order handles) and keeps the
 * number of these streams bounded by the threads alive at once. A stream
 * found here lives until the device is destroyed. Any thread. */
static gma_status_t ptds_get(sim_device_t *dev, sim_stream_t **out) {
  sim_ptds_entry_t *e = &ptds_cache[dev->serial % SIM_PTDS_CACHE];
  if (e->serial == dev->serial) {
    *out = e->stream;
    return GMA_OK;
  }
  uintptr_t tid = (uintptr_t)pthread_self();
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  sim_stream_t *s = (sim_stream_t *)gma__sim_table_find(&dev->ptds, tid);
  gma__unlock(&dev->streams_mu);
  if (!s) {
    /* Only this thread inserts under its own pthread_t, so nobody can add
     * the key between the find above and the insert below. */
    s = gma__sim_stream_new(dev);
    if (!s) {
      return gma__set_error(GMA_ERR_DEVICE, "the simulated device cannot start this thread's per-thread default "
                            "stream");
    }
    s->link.key = tid;
    gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
    gma__sim_table_insert(&dev->ptds, &s->link);
    gma__unlock(&dev->streams_mu);
  }
  *e = (sim_ptds_entry_t){dev->serial, s, s->id};
  *out = s;
  return GMA_OK;
}

/* Resolves a handle to a stream and takes a reference; release it with
 * stream_put. NULL and 0x1 are the legacy default stream, 0x2 the calling
 * thread's own default stream. A user handle is checked against the slot
 * chunks, never dereferenced blindly, so a stale or made-up handle gives an
 * error instead of a crash. Any thread. */
static gma_status_t stream_get(sim_device_t *dev, gma_stream_t h, sim_stream_t **out) {
  sim_stream_t *s = NULL;
  if (h == NULL || h == SIM_LEGACY_STREAM) {
    s = dev->legacy;
  } else if (h == SIM_PER_THREAD_STREAM) {
    gma_status_t st = ptds_get(dev, &s);
    if (st != GMA_OK) return st;
  }
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  if (!s) {
    sim_slot_t *slot = slot_find(dev, h);
    s = slot ? slot->stream : NULL;
  }
  if (s) s->refs++;
  gma__unlock(&dev->streams_mu);
  *out = s;
  if (s) return GMA_OK;
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "stream %p is not a live stream of the simulated device (never created "
                        "on it, or already destroyed)",
                        h);
}

/* Drops a reference taken by stream_get. Any thread. */
static void stream_put(sim_device_t *dev, sim_stream_t *s) {
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  bool last = stream_unref_locked(s);
  gma__unlock(&dev->streams_mu);
  if (last) stream_fini(s);
}

/* Queues op on stream h, taking ownership of op (freed if not queued). For
 * RECORD and WAIT, the event evh is resolved and its mark taken under s->mu,
 * so "the stream is idle at record time" is decided atomically with queueing;
 * an op with nothing left to do (a record on an idle stream, a wait on a
 * complete event) is not queued at all. A stream destroyed between the lookup
 * and s->mu refuses the op, so nothing is queued behind its thread's exit.
 * Any thread. */
static gma_status_t stream_push(sim_device_t *dev, gma_stream_t h, sim_op_t *op,
                                gma__event_t evh) {
  sim_stream_t *s;
  gma_status_t st = stream_get(dev, h, &s);
  if (st != GMA_OK) {
    free(op);
    return st;
  }
  gma__lock(&s->mu, GMA__RANK_SIM_STREAM);
  bool idle = !s->head && !s->busy;
  if (s->stop) {
    st = gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "stream %p was destroyed while the call was queueing work on it", h);
  } else if (op->kind == SIM_OP_WRITE) {
    /* An idle stream has no work the write must follow: it happens now. */
    if (idle) atomic_store_explicit(op->word, op->value, memory_order_release);
  } else if (op->kind != SIM_OP_KERNEL) {
    gma__lock(&dev->ev_mu, GMA__RANK_SIM_EVENTS);
    sim_event_t *ev = gma__sim_event_find(dev, evh);
    if (!ev) {
      st = GMA_ERR_INVALID_ARGUMENT;
    } else if (op->kind == SIM_OP_RECORD) {
      /* An idle stream has no work the record could wait for: the event is
       * complete now (last = NULL), which is cheap and keeps single-threaded
       * tests deterministic. Otherwise a fresh mark is held by the event and
       * by the op. */
      sim_mark_t *m = idle ? NULL : calloc(1, sizeof *m);
      if (!idle && !m) {
        st = gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for an event record");
      } else {
        if (m) m->refs = 2;
        gma__sim_mark_unref(ev->last);
        ev->last = m;
        op->mark = m;
      }
    } else if (ev->last && !ev->last->done) {
      op->mark = ev->last; /* WAIT: the record made before this call */
      op->mark->refs++;
    }
    gma__unlock(&dev->ev_mu);
  }
  bool queue = st == GMA_OK && (op->kind == SIM_OP_KERNEL || op->mark ||
                                (op->kind == SIM_OP_WRITE && !idle));
  if (queue) {
    op->next = NULL;
    *(s->tail ? &s->tail->next : &s->head) = op;
    s->tail = op;
    if (op->kind == SIM_OP_KERNEL) gma__faa_relaxed(&dev->kernels, 1);
    pthread_cond_signal(&s->work_cv);
  }
  gma__unlock(&s->mu);
  stream_put(dev, s);
  if (!queue) free(op);
  return st;
}

/* Any thread. */
static sim_op_t *op_new(sim_op_kind_t kind) {
  sim_op_t *op = calloc(1, sizeof *op);
  if (!op) gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for a queued operation");
  if (op) op->kind = kind;
  return op;
}

/* Any thread. Blocks for the configured event latency only. */
gma_status_t gma__sim_event_record(gma__device_t *d, gma__event_t ev, gma_stream_t stream) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = gma__sim_event_fault(dev, "event_record");
  sim_pay(dev, GMA__SIM_COST_EVENT_RECORD, 0);
  if (st == GMA_OK) st = gma__sim_site_fault(dev, GMA__SIM_EVENT_RECORD);
  if (st != GMA_OK) return st;
  gma__sim_spin_ns(dev->event_ns);
  sim_op_t *op = op_new(SIM_OP_RECORD);
  return op ? stream_push(dev, stream, op, ev) : GMA_ERR_DEVICE;
}

/* Any thread; never blocks. The word is host memory (the device address of
 * host_alloc memory is its host address here). */
gma_status_t gma__sim_stream_write_value(gma__device_t *d, gma_stream_t stream, uintptr_t dev_addr,
                                         uint64_t value) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_STREAM_WRITE_VALUE, 0);
  gma_status_t st = gma__sim_site_fault(dev, GMA__SIM_STREAM_WRITE_VALUE);
  if (st != GMA_OK) return st;
  if (!dev_addr || dev_addr % 8)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "stream_write_value: address %p is not an 8-byte aligned word",
                          (void *)dev_addr);
  sim_op_t *op = op_new(SIM_OP_WRITE);
  if (!op) return GMA_ERR_DEVICE;
  op->word = (_Atomic uint64_t *)dev_addr;
  op->value = value;
  return stream_push(dev, stream, op, NULL);
}

/* Any thread; the host never blocks, only the stream's thread does. */
gma_status_t gma__sim_stream_wait_event(gma__device_t *d, gma_stream_t stream, gma__event_t ev) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = gma__sim_event_fault(dev, "stream_wait_event");
  sim_pay(dev, GMA__SIM_COST_STREAM_WAIT_EVENT, 0);
  if (st == GMA_OK) st = gma__sim_site_fault(dev, GMA__SIM_STREAM_WAIT_EVENT);
  if (st != GMA_OK) return st;
  sim_op_t *op = op_new(SIM_OP_WAIT);
  return op ? stream_push(dev, stream, op, ev) : GMA_ERR_DEVICE;
}

/* Any thread; the host never blocks, only the waiter's thread does. A
 * RECORD of a fresh mark (held by no event) is queued on waitee, then a WAIT
 * for that mark on waiter: the ops an event record and a stream wait queue,
 * so op_run's no-cycle argument (the RECORD is queued before its WAIT) and
 * sim_forget hold for them unchanged. An idle waitee has nothing to wait
 * for: nothing is queued, but both streams are checked. */
gma_status_t gma__sim_stream_wait_stream(gma__device_t *d, gma_stream_t waiter,
                                           gma_stream_t waitee) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = gma__sim_event_fault(dev, "stream_wait_stream");
  sim_pay(dev, GMA__SIM_COST_STREAM_WAIT_EVENT, 0);
  if (st == GMA_OK) st = gma__sim_site_fault(dev, GMA__SIM_STREAM_WAIT_STREAM);
  if (st != GMA_OK) return st;
  gma__sim_spin_ns(dev->event_ns);
  sim_stream_t *w, *e;
  if ((st = stream_get(dev, waiter, &w)) != GMA_OK) return st;
  if ((st = stream_get(dev, waitee, &e)) != GMA_OK) {
    stream_put(dev, w);
    return st;
  }
  sim_op_t *rec = NULL, *wait = NULL;
  sim_mark_t *m = NULL;
  if (w == e) {
    st = gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "streams %p and %p are the same stream of the simulated device; its "
                        "work runs in order already", waiter, waitee);
  } else if (!(rec = op_new(SIM_OP_RECORD)) || !(wait = op_new(SIM_OP_WAIT))) {
    st = GMA_ERR_DEVICE;
  }
  if (st == GMA_OK) {
    gma__lock(&e->mu, GMA__RANK_SIM_STREAM);
    if (e->stop) {
      st = gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "stream %p was destroyed while the call was queueing work on it",
                          waitee);
    } else if (e->head || e->busy) {
      m = calloc(1, sizeof *m);
      if (!m) {
        st = gma__set_error(GMA_ERR_DEVICE,
                            "the simulated device ran out of host memory for a stream wait");
      } else {
        m->refs = 2; /* the RECORD's and the WAIT's (fresh: nobody else sees it yet) */
        rec->mark = m;
        rec->next = NULL;
        *(e->tail ? &e->tail->next : &e->head) = rec;
        e->tail = rec;
        rec = NULL;
        pthread_cond_signal(&e->work_cv);
      }
    }
    gma__unlock(&e->mu);
  }
  if (m) {
    gma__lock(&w->mu, GMA__RANK_SIM_STREAM);
    if (w->stop) {
      st = gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "stream %p was destroyed while the call was queueing work on it",
                          waiter);
    } else {
      wait->mark = m; /* the WAIT's reference */
      wait->next = NULL;
      *(w->tail ? &w->tail->next : &w->head) = wait;
      w->tail = wait;
      wait = NULL;
      m = NULL;
      pthread_cond_signal(&w->work_cv);
    }
    gma__unlock(&w->mu);
  }
  if (m) { /* the waiter refused the WAIT: drop its reference */
    gma__lock(&dev->ev_mu, GMA__RANK_SIM_EVENTS);
    gma__sim_mark_unref(m);
    gma__unlock(&dev->ev_mu);
  }
  free(rec);
  free(wait);
  stream_put(dev, e);
  stream_put(dev, w);
  return st;
}

/* Any thread. */
gma_status_t gma__sim_launch(gma__device_t *d, gma_stream_t stream, gma_sim_kernel_fn fn,
                               void *arg) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_LAUNCH, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_SIM_LAUNCH);
  if (fst != GMA_OK) return fst;
  if (!fn) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked to launch a kernel without a function");
  sim_op_t *op = op_new(SIM_OP_KERNEL);
  if (!op) return GMA_ERR_DEVICE;
  op->fn = fn;
  op->arg = arg;
  return stream_push(dev, stream, op, NULL);
}

/* Any thread. The handle is a slot's address: the most recently destroyed
 * stream's, if any (see slot_take). */
gma_status_t gma__sim_stream_create(gma__device_t *d, gma_stream_t *out) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_STREAM_CREATE, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_STREAM_CREATE);
  if (fst != GMA_OK) return fst;
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked for a stream without a place for it");
  sim_stream_t *s = gma__sim_stream_new(dev);
  if (!s) return gma__set_error(GMA_ERR_DEVICE, "the simulated device cannot start a thread for a new stream");
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  sim_slot_t *slot = slot_take(dev);
  if (slot) {
    dev->user_streams++;
    slot->stream = s;
    /* Release pairs with the acquire in gma__sim_stream_id. */
    gma__store_release(&slot->id, s->id);
  }
  SIM_SLOTS_CHECK(dev);
  gma__unlock(&dev->streams_mu);
  if (!slot) {
    gma__sim_stream_stop(s); /* nobody else can reach s; its thread frees it */
    return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for a new stream");
  }
  *out = slot;
  return GMA_OK;
}

/* Any thread, the stream's own included; returns at once. The slot is freed
 * first, so the next stream_create may reuse the handle value while this
 * stream's queued work still runs; the stream frees itself after that. */
gma_status_t gma__sim_stream_destroy(gma__device_t *d, gma_stream_t h) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_STREAM_DESTROY, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_STREAM_DESTROY);
  if (fst != GMA_OK) return fst;
  if (h == NULL || h == SIM_LEGACY_STREAM || h == SIM_PER_THREAD_STREAM) {
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "stream %p is a default stream, which cannot be destroyed",
                          h);
  }
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  sim_slot_t *slot = slot_find(dev, h);
  sim_stream_t *s = slot ? slot->stream : NULL;
  if (s) {
    dev->user_streams--;
    slot->stream = NULL;
    /* Release pairs with the acquire in gma__sim_stream_id (0: destroyed). */
    gma__store_release(&slot->id, 0);
    slot->next_free = dev->free_slots;
    dev->free_slots = slot;
  }
  SIM_SLOTS_CHECK(dev);
  gma__unlock(&dev->streams_mu);
  if (!s) {
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "stream %p is not a live stream of the simulated device (never created "
                          "on it, or already destroyed)", h);
  }
  /* s is still alive: its thread exits only after this stop. */
  gma__sim_stream_stop(s);
  return GMA_OK;
}

/* Any thread; wait-free on a hit of the slot chunks or the per-thread cache
 * (a few loads), takes streams_mu only on a thread's first use of 0x2 on this
 * device (or a cache collision between devices). Never waits for a stream. */
gma_status_t gma__sim_stream_id(gma__device_t *d, gma_stream_t h, uint64_t *id) {
  sim_device_t *dev = sim_of(d);
  /* cuda.c's stream_id asks the capture state first, then the id. */
  sim_pay(dev, GMA__SIM_COST_STREAM_CAPTURE, 0);
  sim_pay(dev, GMA__SIM_COST_STREAM_ID, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_STREAM_ID);
  if (fst != GMA_OK) return fst;
  if (!id) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked for a stream id without a place for it");
  if (h == NULL || h == SIM_LEGACY_STREAM) {
    *id = dev->legacy_id;
    return GMA_OK;
  }
  if (h == SIM_PER_THREAD_STREAM) {
    const sim_ptds_entry_t *e = &ptds_cache[dev->serial % SIM_PTDS_CACHE];
    if (e->serial == dev->serial) {
      *id = e->id;
      return GMA_OK;
    }
    sim_stream_t *s;
    gma_status_t st = ptds_get(dev, &s);
    if (st == GMA_OK) *id = s->id;
    return st;
  }
  sim_slot_t *slot = slot_find(dev, h);
  /* Acquire pairs with the release stores in stream_create/stream_destroy. */
  uint64_t v = slot ? gma__load_acquire(&slot->id) : 0;
  if (v == 0) {
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "stream %p is not a live stream of the simulated device (never created "
                          "on it, or already destroyed)",
                          h);
  }
  *id = v;
  return GMA_OK;
}

/* Any thread but the stream's own. */
gma_status_t gma__sim_stream_synchronize(gma__device_t *d, gma_stream_t h) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_STREAM_SYNCHRONIZE, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_STREAM_SYNCHRONIZE);
  if (fst != GMA_OK) return fst;
  sim_stream_t *s;
  gma_status_t st = stream_get(dev, h, &s);
  if (st != GMA_OK) return st;
  stream_wait_idle(s);
  stream_put(dev, s);
  return GMA_OK;
}

/* Any thread but a stream thread. Every stream with a running thread counts,
 * destroyed ones still draining included, as on a real device. Streams are
 * snapshotted with references held, so each is synchronized without holding
 * streams_mu (a kernel may itself call into the device). */
gma_status_t gma__sim_device_synchronize(gma__device_t *d) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_DEVICE_SYNCHRONIZE, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_DEVICE_SYNCHRONIZE);
  if (fst != GMA_OK) return fst;
  return gma__sim_device_wait_all(dev);
}

/* Waits until every stream with a running thread (but the caller's own) has
 * run the work queued on it. Any thread. */
gma_status_t gma__sim_device_wait_all(sim_device_t *dev) {
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  size_t n = 0;
  sim_stream_t **all = malloc((dev->threads + 1) * sizeof *all);
  if (!all) {
    gma__unlock(&dev->streams_mu);
    return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory to synchronize");
  }
  for (sim_stream_t *s = dev->all; s; s = s->all_next) {
    if (s == sim_self) continue; /* a stream thread cannot wait for itself */
    s->refs++;
    all[n++] = s;
  }
  gma__unlock(&dev->streams_mu);
  for (size_t i = 0; i < n; i++) stream_wait_idle(all[i]);
  for (size_t i = 0; i < n; i++) stream_put(dev, all[i]);
  free(all);
  return GMA_OK;
}

