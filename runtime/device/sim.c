/* The simulated device: owns its host memory (device allocations), its
 * simulated streams (one host thread each, executing queued kernels, event
 * records and event waits strictly in order), its events, and the latency and
 * fault-injection knobs from the sim_* config fields.
 *
 * Memory comes from mmap(MAP_NORESERVE), so untouched bytes cost nothing and a
 * trace of 37 GiB replays on a smaller machine; capacity is enforced by
 * accounting, so OOM happens for real. Events follow CUDA: a never-recorded
 * event is complete, and a record captures all work queued on the stream so
 * far. Each record creates a mark (a refcounted "done" flag) that becomes the
 * event's latest mark and is carried by a RECORD op in the stream's queue;
 * when the op runs, the mark is done. The event is complete when its latest
 * mark is done (or it has none). A WAIT op holds the mark that was latest at
 * enqueue time and blocks its stream's thread until that mark is done, so a
 * later re-record of the event, on any stream, cannot release it early (a
 * max-generation counter could, when the later record finishes first). Ops
 * reference marks, never the event, so destroying an event with queued ops is
 * safe.
 *
 * Lock order: stream->mu before dev->ev_mu. dev->streams_mu and dev->mem_mu are
 * leaves: no other lock is taken while holding them. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "device/device.h"

#if defined(GMA_DEBUG) && GMA_DEBUG >= 1
#include <assert.h>
#define SIM_ASSERT(x) assert(x)
#else
#define SIM_ASSERT(x) ((void)0)
#endif

#define SIM_DEFAULT_CAPACITY (80ull << 30)
#define SIM_LEGACY_STREAM ((gma_stream_t)(uintptr_t)0x1)     /* CU_STREAM_LEGACY */
#define SIM_PER_THREAD_STREAM ((gma_stream_t)(uintptr_t)0x2) /* CU_STREAM_PER_THREAD */

/* ---------------------------------------------------------------------------
 * An intrusive chained hash table from uintptr_t keys to links embedded as the
 * first member of the owning struct. Not thread-safe: the owner's lock guards it.
 * Invariant: count = number of links reachable from buckets; mask + 1 is a
 * power of two.
 * ------------------------------------------------------------------------- */
typedef struct sim_link {
  struct sim_link *next;
  uintptr_t key;
} sim_link_t;

typedef struct sim_table {
  sim_link_t **buckets;
  size_t mask;
  size_t count;
} sim_table_t;

/* Addresses are aligned and thread ids alike, so low bits need mixing in. */
static size_t sim_hash(uintptr_t k) {
  uint64_t x = ((uint64_t)k ^ ((uint64_t)k >> 33)) * 0xff51afd7ed558ccdull;
  return (size_t)(x ^ (x >> 33));
}

static bool table_init(sim_table_t *t) {
  t->mask = 63;
  t->count = 0;
  t->buckets = calloc(t->mask + 1, sizeof *t->buckets);
  return t->buckets != NULL;
}

/* Returns the address of the pointer that points at key's link, or of the
 * NULL that ends key's chain, so find and remove share one walk. */
static sim_link_t **table_slot(const sim_table_t *t, uintptr_t key) {
  sim_link_t **p = &t->buckets[sim_hash(key) & t->mask];
  while (*p && (*p)->key != key) p = &(*p)->next;
  return p;
}

static sim_link_t *table_find(const sim_table_t *t, uintptr_t key) { return *table_slot(t, key); }

static sim_link_t *table_remove(sim_table_t *t, uintptr_t key) {
  sim_link_t **p = table_slot(t, key), *l = *p;
  if (l) {
    *p = l->next;
    t->count--;
  }
  return l;
}

/* Inserts a link whose key is not in the table yet. Growing is best effort:
 * if memory for a bigger bucket array is lacking, chains just get longer. */
static void table_insert(sim_table_t *t, sim_link_t *l) {
  if (t->count > t->mask) {
    size_t nmask = t->mask * 2 + 1;
    sim_link_t **nb = calloc(nmask + 1, sizeof *nb);
    if (nb) {
      for (size_t i = 0; i <= t->mask; i++) {
        for (sim_link_t *c = t->buckets[i], *next; c; c = next) {
          next = c->next;
          c->next = nb[sim_hash(c->key) & nmask];
          nb[sim_hash(c->key) & nmask] = c;
        }
      }
      free(t->buckets);
      t->buckets = nb;
      t->mask = nmask;
    }
  }
  sim_link_t **head = &t->buckets[sim_hash(l->key) & t->mask];
  l->next = *head;
  *head = l;
  t->count++;
}

/* Unlinks and returns any one link, or NULL when empty; used to drain tables. */
static sim_link_t *table_pop(sim_table_t *t) {
  for (size_t i = 0; t->buckets && i <= t->mask; i++) {
    if (t->buckets[i]) return table_remove(t, t->buckets[i]->key);
  }
  return NULL;
}

/* ---------------------------------------------------------------------------
 * Structures
 * ------------------------------------------------------------------------- */
typedef struct sim_device sim_device_t;

/* One live device allocation; link.key is its address. */
typedef struct sim_alloc {
  sim_link_t link;
  uint64_t size;
} sim_alloc_t;

/* One record of an event: the point in a stream's queue it captured. Guarded
 * by dev->ev_mu. Invariant: refs = (1 while it is its event's latest mark) +
 * queued RECORD/WAIT ops holding it + event_synchronize calls waiting on it;
 * it is freed when refs reaches 0. done goes from false to true only. */
typedef struct sim_mark {
  unsigned refs;
  bool done;
} sim_mark_t;

/* link.key is the handle (the struct's own address); the event is live iff it
 * is in dev->events. last is guarded by dev->ev_mu. Invariant: the event is
 * complete iff last == NULL || last->done; last is NULL when the event was
 * never recorded or its latest record completed at once. */
typedef struct sim_event {
  sim_link_t link;
  sim_mark_t *last;
} sim_event_t;

typedef enum sim_op_kind { SIM_OP_KERNEL, SIM_OP_RECORD, SIM_OP_WAIT } sim_op_kind_t;

/* A queued op. RECORD and WAIT hold a reference on mark until they have run. */
typedef struct sim_op {
  struct sim_op *next;
  sim_op_kind_t kind;
  gma_sim_kernel_fn fn; /* KERNEL */
  void *arg;            /* KERNEL */
  sim_mark_t *mark;     /* RECORD: the mark it completes; WAIT: the one it awaits */
} sim_op_t;

/* A simulated stream. link.key is the handle (the struct's address) for a
 * user stream in dev->streams, the owning host thread's id for a per-thread
 * default stream in dev->ptds; the legacy default stream is in no table.
 * Fields below mu are guarded by mu. Invariant: the stream is idle iff
 * head == NULL && !busy; stop is set only once no caller can reach the
 * stream, so nothing is queued after it, and the thread exits once idle.
 * refs (guarded by dev->streams_mu) counts callers using the stream outside
 * streams_mu; a stream removed from its table is freed only when refs = 0. */
typedef struct sim_stream {
  sim_link_t link;
  sim_device_t *dev;
  pthread_t thread;
  unsigned refs;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* signalled when an op is queued or stop is set */
  pthread_cond_t idle_cv; /* broadcast when the stream becomes idle */
  sim_op_t *head, *tail;
  bool busy; /* the thread is running an op it popped */
  bool stop;
} sim_stream_t;

struct sim_device {
  gma__device_t base; /* must stay first: the device boundary passes &base */
  /* Immutable after creation. */
  uint64_t capacity, alloc_ns, free_ns, event_ns, fail_alloc, fail_event;
  /* Calls so far, for fault injection; written concurrently, relaxed is
   * enough because each only needs a unique ticket number. */
  _Atomic uint64_t alloc_calls, event_calls;
  /* Invariant: used = sum of sizes in allocs + reserving <= capacity. */
  pthread_mutex_t mem_mu;
  sim_table_t allocs; /* mem_mu */
  uint64_t used;      /* mem_mu */
  uint64_t reserving; /* mem_mu: bytes of mem_alloc calls between reserve and mmap */
  pthread_mutex_t streams_mu;
  pthread_cond_t streams_cv; /* broadcast when a removed stream's refs reach 0 */
  sim_table_t streams;       /* streams_mu: user streams by handle */
  sim_table_t ptds;          /* streams_mu: per-thread default streams by thread id */
  sim_stream_t *legacy;      /* the NULL / 0x1 stream; immutable after creation */
  pthread_mutex_t ev_mu;
  pthread_cond_t ev_cv; /* broadcast whenever any mark becomes done */
  sim_table_t events;   /* ev_mu: live event handles */
};

static sim_device_t *sim_of(gma__device_t *d) { return (sim_device_t *)d; }

/* Takes ns nanoseconds, as a device call would; any thread. Waits shorter
 * than 200 us spin on the clock, because nanosleep overshoots them several
 * times over (timer slack and wake-up cost) and would distort benchmarks. */
static void sim_sleep(uint64_t ns) {
  if (ns == 0) return;
  if (ns < 200000) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
      clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((uint64_t)(t.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)t.tv_nsec -
                 (uint64_t)t0.tv_nsec < ns);
    return;
  }
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* True for exactly one call: the one whose ticket is the configured N.
 * Any thread; wait-free. */
static bool fault_fires(_Atomic uint64_t *calls, uint64_t n, uint64_t *ticket) {
  *ticket = atomic_fetch_add_explicit(calls, 1, memory_order_relaxed) + 1;
  return n != 0 && *ticket == n;
}

/* Counts one event call and fails it if it is the configured one. Any thread. */
static gma_status_t event_fault(sim_device_t *dev, const char *what) {
  uint64_t t;
  if (!fault_fires(&dev->event_calls, dev->fail_event, &t)) return GMA_OK;
  return gma__set_error(GMA_ERR_DEVICE, "sim: injected failure of event call #%llu (%s)",
                        (unsigned long long)t, what);
}

/* ---------------------------------------------------------------------------
 * Memory
 * ------------------------------------------------------------------------- */
#if defined(GMA_DEBUG) && GMA_DEBUG >= 2
/* Checks the memory invariant; caller holds mem_mu. */
static bool mem_is_valid(const sim_device_t *dev) {
  uint64_t sum = 0;
  size_t n = 0;
  for (size_t i = 0; i <= dev->allocs.mask; i++) {
    for (const sim_link_t *l = dev->allocs.buckets[i]; l; l = l->next, n++) {
      sum += ((const sim_alloc_t *)l)->size;
    }
  }
  return sum + dev->reserving == dev->used && n == dev->allocs.count && dev->used <= dev->capacity;
}
#define SIM_MEM_CHECK(dev) assert(mem_is_valid(dev))
#else
#define SIM_MEM_CHECK(dev) ((void)0)
#endif

/* Any thread. Blocks for the configured allocation latency. */
static gma_status_t sim_mem_alloc(gma__device_t *d, uint64_t size, uintptr_t *out) {
  sim_device_t *dev = sim_of(d);
  sim_sleep(dev->alloc_ns);
  uint64_t t;
  if (fault_fires(&dev->alloc_calls, dev->fail_alloc, &t)) {
    return gma__set_error(GMA_ERR_DEVICE, "sim: injected failure of device allocation #%llu",
                          (unsigned long long)t);
  }
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "sim: mem_alloc: out is NULL");
  if (size == 0) return gma__set_error(GMA_ERR_INVALID_SIZE, "sim: mem_alloc of 0 bytes");
  sim_alloc_t *a = malloc(sizeof *a);
  if (!a) return gma__set_error(GMA_ERR_DEVICE, "sim: out of host memory for allocation record");
  /* Capacity is reserved before mmap and given back on failure, so two
   * concurrent allocations can never both fit into the same free bytes. */
  pthread_mutex_lock(&dev->mem_mu);
  uint64_t used = dev->used;
  bool fits = size <= dev->capacity - used;
  if (fits) {
    dev->used += size;
    dev->reserving += size;
  }
  pthread_mutex_unlock(&dev->mem_mu);
  if (!fits) {
    free(a);
    return gma__set_error(GMA_ERR_OOM,
                          "sim: device out of memory: requested %llu bytes, %llu of %llu bytes "
                          "in use (%llu free)",
                          (unsigned long long)size, (unsigned long long)used,
                          (unsigned long long)dev->capacity,
                          (unsigned long long)(dev->capacity - used));
  }
  void *p = size > SIZE_MAX ? MAP_FAILED
                            : mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  int err = errno;
  pthread_mutex_lock(&dev->mem_mu);
  dev->reserving -= size;
  if (p == MAP_FAILED) {
    dev->used -= size;
  } else {
    a->link.key = (uintptr_t)p;
    a->size = size;
    table_insert(&dev->allocs, &a->link);
  }
  SIM_MEM_CHECK(dev);
  pthread_mutex_unlock(&dev->mem_mu);
  if (p == MAP_FAILED) {
    free(a);
    return gma__set_error(GMA_ERR_OOM, "sim: host mmap of %llu bytes failed: %s",
                          (unsigned long long)size, strerror(err));
  }
  *out = (uintptr_t)p;
  return GMA_OK;
}

/* Any thread. Blocks for the configured free latency. An unknown address or a
 * size other than the allocated one changes nothing and returns GMA_ERR_DEVICE,
 * as a real driver would refuse it. */
static gma_status_t sim_mem_free(gma__device_t *d, uintptr_t addr, uint64_t size) {
  sim_device_t *dev = sim_of(d);
  sim_sleep(dev->free_ns);
  pthread_mutex_lock(&dev->mem_mu);
  sim_alloc_t *a = (sim_alloc_t *)table_find(&dev->allocs, addr);
  uint64_t real = a ? a->size : 0;
  if (a && real == size) {
    table_remove(&dev->allocs, addr);
    dev->used -= size;
  }
  SIM_MEM_CHECK(dev);
  pthread_mutex_unlock(&dev->mem_mu);
  if (!a) {
    return gma__set_error(GMA_ERR_DEVICE,
                          "sim: mem_free of 0x%llx (%llu bytes): not a live device allocation",
                          (unsigned long long)addr, (unsigned long long)size);
  }
  if (real != size) {
    return gma__set_error(GMA_ERR_DEVICE,
                          "sim: mem_free of 0x%llx with size %llu, but it was allocated with "
                          "%llu bytes; nothing freed",
                          (unsigned long long)addr, (unsigned long long)size,
                          (unsigned long long)real);
  }
  munmap((void *)addr, (size_t)size);
  free(a);
  return GMA_OK;
}

/* Any thread; never blocks beyond mem_mu. */
static gma_status_t sim_mem_info(gma__device_t *d, uint64_t *free_bytes, uint64_t *total_bytes) {
  sim_device_t *dev = sim_of(d);
  pthread_mutex_lock(&dev->mem_mu);
  uint64_t used = dev->used;
  pthread_mutex_unlock(&dev->mem_mu);
  if (free_bytes) *free_bytes = dev->capacity - used;
  if (total_bytes) *total_bytes = dev->capacity;
  return GMA_OK;
}

/* ---------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------- */
/* Drops one reference (NULL is a no-op); caller holds ev_mu. */
static void mark_unref(sim_mark_t *m) {
  SIM_ASSERT(!m || m->refs > 0);
  if (m && --m->refs == 0) free(m);
}

/* Finds a live event; caller holds ev_mu. Unknown handles are looked up, never
 * dereferenced, so a stale handle gives an error instead of a crash. */
static sim_event_t *event_find(sim_device_t *dev, gma__event_t h, const char *what) {
  sim_event_t *ev = (sim_event_t *)table_find(&dev->events, (uintptr_t)h);
  if (!ev) {
    gma__set_error(GMA_ERR_INVALID_ARGUMENT, "sim: %s: event %p is not a live event", what, h);
  }
  return ev;
}

/* Any thread. */
static gma_status_t sim_event_create(gma__device_t *d, gma__event_t *out) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "event_create");
  if (st != GMA_OK) return st;
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "sim: event_create: out is NULL");
  sim_event_t *ev = calloc(1, sizeof *ev);
  if (!ev) return gma__set_error(GMA_ERR_DEVICE, "sim: out of host memory for an event");
  ev->link.key = (uintptr_t)ev;
  pthread_mutex_lock(&dev->ev_mu);
  table_insert(&dev->events, &ev->link);
  pthread_mutex_unlock(&dev->ev_mu);
  *out = ev;
  return GMA_OK;
}

/* Any thread. Queued RECORD/WAIT ops keep their marks alive until they run. */
static gma_status_t sim_event_destroy(gma__device_t *d, gma__event_t h) {
  sim_device_t *dev = sim_of(d);
  pthread_mutex_lock(&dev->ev_mu);
  sim_event_t *ev = event_find(dev, h, "event_destroy");
  if (ev) {
    table_remove(&dev->events, ev->link.key);
    mark_unref(ev->last);
    free(ev);
  }
  pthread_mutex_unlock(&dev->ev_mu);
  return ev ? GMA_OK : GMA_ERR_INVALID_ARGUMENT;
}

/* Any thread; never blocks beyond ev_mu (plus the configured latency). */
static gma_status_t sim_event_query(gma__device_t *d, gma__event_t h, bool *done) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "event_query");
  if (st != GMA_OK) return st;
  if (!done) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "sim: event_query: done is NULL");
  sim_sleep(dev->event_ns);
  pthread_mutex_lock(&dev->ev_mu);
  sim_event_t *ev = event_find(dev, h, "event_query");
  if (ev) *done = !ev->last || ev->last->done;
  pthread_mutex_unlock(&dev->ev_mu);
  return ev ? GMA_OK : GMA_ERR_INVALID_ARGUMENT;
}

/* Any thread except a stream thread of this device (it could wait on itself).
 * Blocks until the record made before the call has completed. */
static gma_status_t sim_event_synchronize(gma__device_t *d, gma__event_t h) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "event_synchronize");
  if (st != GMA_OK) return st;
  pthread_mutex_lock(&dev->ev_mu);
  sim_event_t *ev = event_find(dev, h, "event_synchronize");
  sim_mark_t *m = ev ? ev->last : NULL;
  if (m) {
    /* Holding the mark, not the event, lets a concurrent event_destroy or
     * re-record go ahead while this call waits for the record it saw. */
    m->refs++;
    while (!m->done) pthread_cond_wait(&dev->ev_cv, &dev->ev_mu);
    mark_unref(m);
  }
  pthread_mutex_unlock(&dev->ev_mu);
  return ev ? GMA_OK : GMA_ERR_INVALID_ARGUMENT;
}

/* ---------------------------------------------------------------------------
 * Streams
 * ------------------------------------------------------------------------- */
/* Runs one op on the stream's thread. */
static void op_run(sim_device_t *dev, sim_op_t *op) {
  if (op->kind == SIM_OP_KERNEL) {
    op->fn(op->arg);
    return;
  }
  pthread_mutex_lock(&dev->ev_mu);
  if (op->kind == SIM_OP_RECORD) {
    op->mark->done = true;
    pthread_cond_broadcast(&dev->ev_cv);
  } else {
    /* No cycle can block this forever: the RECORD of this mark was queued
     * before this WAIT, so by induction on queueing time it eventually runs. */
    while (!op->mark->done) pthread_cond_wait(&dev->ev_cv, &dev->ev_mu);
  }
  mark_unref(op->mark);
  pthread_mutex_unlock(&dev->ev_mu);
}

/* The stream's own thread: runs ops in queue order until stopped and idle. */
static void *stream_main(void *arg) {
  sim_stream_t *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
    sim_op_t *op = s->head;
    if (!op) break; /* stopped and idle */
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->busy = true;
    pthread_mutex_unlock(&s->mu);
    op_run(s->dev, op);
    free(op);
    pthread_mutex_lock(&s->mu);
    s->busy = false;
    if (!s->head) pthread_cond_broadcast(&s->idle_cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Frees a stream whose thread has exited or never started. */
static void stream_fini(sim_stream_t *s) {
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->work_cv);
  pthread_cond_destroy(&s->idle_cv);
  free(s);
}

/* Allocates a stream and starts its thread; NULL if either fails. Any thread. */
static sim_stream_t *stream_new(sim_device_t *dev, uintptr_t key) {
  sim_stream_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->dev = dev;
  s->link.key = key ? key : (uintptr_t)s;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->idle_cv, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) == 0) return s;
  stream_fini(s);
  return NULL;
}

/* Blocks until the stream is idle. Any thread but the stream's own. */
static void stream_wait_idle(sim_stream_t *s) {
  pthread_mutex_lock(&s->mu);
  while (s->head || s->busy) pthread_cond_wait(&s->idle_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

/* Lets the thread finish the queued work, joins it and frees the stream. The
 * caller has made sure nobody else references s. */
static void stream_free(sim_stream_t *s) {
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  stream_fini(s);
}

/* Resolves a handle to a stream and takes a reference; release it with
 * stream_put. NULL and 0x1 are the legacy default stream, 0x2 the calling
 * thread's own default stream (created on first use, kept until device
 * destroy). Unknown handles are looked up, never dereferenced. Any thread. */
static gma_status_t stream_get(sim_device_t *dev, gma_stream_t h, const char *what,
                               sim_stream_t **out) {
  sim_stream_t *s;
  gma_status_t st = GMA_OK;
  pthread_mutex_lock(&dev->streams_mu);
  if (h == NULL || h == SIM_LEGACY_STREAM) {
    s = dev->legacy;
  } else if (h == SIM_PER_THREAD_STREAM) {
    /* Keyed by pthread_t, which is recycled only after a thread exits: a new
     * thread may inherit a dead one's stream (at worst behind work the dead
     * thread queued, which stream order handles), and the number of these
     * streams stays bounded by the number of threads alive at once. */
    uintptr_t tid = (uintptr_t)pthread_self();
    s = (sim_stream_t *)table_find(&dev->ptds, tid);
    if (!s) {
      s = stream_new(dev, tid);
      if (s) {
        table_insert(&dev->ptds, &s->link);
      } else {
        st = gma__set_error(GMA_ERR_DEVICE, "sim: %s: cannot start the per-thread stream", what);
      }
    }
  } else {
    s = (sim_stream_t *)table_find(&dev->streams, (uintptr_t)h);
    if (!s) {
      st = gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "sim: %s: stream %p is not a live stream of this device (never "
                          "created here, or already destroyed)",
                          what, h);
    }
  }
  if (s) s->refs++;
  pthread_mutex_unlock(&dev->streams_mu);
  *out = s;
  return st;
}

/* Drops a reference taken by stream_get. Any thread. */
static void stream_put(sim_device_t *dev, sim_stream_t *s) {
  pthread_mutex_lock(&dev->streams_mu);
  if (--s->refs == 0) pthread_cond_broadcast(&dev->streams_cv);
  pthread_mutex_unlock(&dev->streams_mu);
}

/* Queues op on stream h, taking ownership of op (freed if not queued). For
 * RECORD and WAIT, the event evh is resolved and its mark taken under s->mu,
 * so "the stream is idle at record time" is decided atomically with queueing;
 * an op with nothing left to do (a record on an idle stream, a wait on a
 * complete event) is not queued at all. Any thread. */
static gma_status_t stream_push(sim_device_t *dev, gma_stream_t h, const char *what, sim_op_t *op,
                                gma__event_t evh) {
  sim_stream_t *s;
  gma_status_t st = stream_get(dev, h, what, &s);
  if (st != GMA_OK) {
    free(op);
    return st;
  }
  pthread_mutex_lock(&s->mu);
  bool idle = !s->head && !s->busy;
  if (op->kind != SIM_OP_KERNEL) {
    pthread_mutex_lock(&dev->ev_mu);
    sim_event_t *ev = event_find(dev, evh, what);
    if (!ev) {
      st = GMA_ERR_INVALID_ARGUMENT;
    } else if (op->kind == SIM_OP_RECORD) {
      /* An idle stream has no work the record could wait for: the event is
       * complete now (last = NULL), which is cheap and keeps single-threaded
       * tests deterministic. Otherwise a fresh mark is held by the event and
       * by the op. */
      sim_mark_t *m = idle ? NULL : calloc(1, sizeof *m);
      if (!idle && !m) {
        st = gma__set_error(GMA_ERR_DEVICE, "sim: %s: out of host memory", what);
      } else {
        if (m) m->refs = 2;
        mark_unref(ev->last);
        ev->last = m;
        op->mark = m;
      }
    } else if (ev->last && !ev->last->done) {
      op->mark = ev->last; /* WAIT: the record made before this call */
      op->mark->refs++;
    }
    pthread_mutex_unlock(&dev->ev_mu);
  }
  bool queue = st == GMA_OK && (op->kind == SIM_OP_KERNEL || op->mark);
  if (queue) {
    op->next = NULL;
    *(s->tail ? &s->tail->next : &s->head) = op;
    s->tail = op;
    pthread_cond_signal(&s->work_cv);
  }
  pthread_mutex_unlock(&s->mu);
  stream_put(dev, s);
  if (!queue) free(op);
  return st;
}

/* Any thread. */
static sim_op_t *op_new(sim_op_kind_t kind) {
  sim_op_t *op = calloc(1, sizeof *op);
  if (!op) gma__set_error(GMA_ERR_DEVICE, "sim: out of host memory for a queued operation");
  if (op) op->kind = kind;
  return op;
}

/* Any thread. Blocks for the configured event latency only. */
static gma_status_t sim_event_record(gma__device_t *d, gma__event_t ev, gma_stream_t stream) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "event_record");
  if (st != GMA_OK) return st;
  sim_sleep(dev->event_ns);
  sim_op_t *op = op_new(SIM_OP_RECORD);
  return op ? stream_push(dev, stream, "event_record", op, ev) : GMA_ERR_DEVICE;
}

/* Any thread; the host never blocks, only the stream's thread does. */
static gma_status_t sim_stream_wait_event(gma__device_t *d, gma_stream_t stream, gma__event_t ev) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "stream_wait_event");
  if (st != GMA_OK) return st;
  sim_op_t *op = op_new(SIM_OP_WAIT);
  return op ? stream_push(dev, stream, "stream_wait_event", op, ev) : GMA_ERR_DEVICE;
}

/* Any thread. */
static gma_status_t sim_launch(gma__device_t *d, gma_stream_t stream, gma_sim_kernel_fn fn,
                               void *arg) {
  if (!fn) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "sim: sim_launch: fn is NULL");
  sim_op_t *op = op_new(SIM_OP_KERNEL);
  if (!op) return GMA_ERR_DEVICE;
  op->fn = fn;
  op->arg = arg;
  return stream_push(sim_of(d), stream, "sim_launch", op, NULL);
}

/* Any thread. The handle is the stream struct's address. */
static gma_status_t sim_stream_create(gma__device_t *d, gma_stream_t *out) {
  sim_device_t *dev = sim_of(d);
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "sim: stream_create: out is NULL");
  sim_stream_t *s = stream_new(dev, 0);
  if (!s) return gma__set_error(GMA_ERR_DEVICE, "sim: stream_create: cannot start a stream thread");
  pthread_mutex_lock(&dev->streams_mu);
  table_insert(&dev->streams, &s->link);
  pthread_mutex_unlock(&dev->streams_mu);
  *out = s;
  return GMA_OK;
}

/* Any thread but the stream's own. Waits for the queued work first. */
static gma_status_t sim_stream_destroy(gma__device_t *d, gma_stream_t h) {
  sim_device_t *dev = sim_of(d);
  if (h == NULL || h == SIM_LEGACY_STREAM || h == SIM_PER_THREAD_STREAM) {
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "sim: stream_destroy: %p is a default stream, which cannot be destroyed",
                          h);
  }
  pthread_mutex_lock(&dev->streams_mu);
  sim_stream_t *s = (sim_stream_t *)table_remove(&dev->streams, (uintptr_t)h);
  /* Removed from the table, s gets no new users; wait for current ones. */
  while (s && s->refs > 0) pthread_cond_wait(&dev->streams_cv, &dev->streams_mu);
  pthread_mutex_unlock(&dev->streams_mu);
  if (!s) {
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "sim: stream_destroy: stream %p is not a live stream of this device", h);
  }
  stream_free(s);
  return GMA_OK;
}

/* Any thread but the stream's own. */
static gma_status_t sim_stream_synchronize(gma__device_t *d, gma_stream_t h) {
  sim_device_t *dev = sim_of(d);
  sim_stream_t *s;
  gma_status_t st = stream_get(dev, h, "stream_synchronize", &s);
  if (st != GMA_OK) return st;
  stream_wait_idle(s);
  stream_put(dev, s);
  return GMA_OK;
}

/* Any thread but a stream thread. Streams are snapshotted with references
 * held, so each is synchronized without holding streams_mu (a kernel may
 * itself call into the device). */
static gma_status_t sim_device_synchronize(gma__device_t *d) {
  sim_device_t *dev = sim_of(d);
  pthread_mutex_lock(&dev->streams_mu);
  size_t n = 0, cap = dev->streams.count + dev->ptds.count + 1;
  sim_stream_t **all = malloc(cap * sizeof *all);
  if (!all) {
    pthread_mutex_unlock(&dev->streams_mu);
    return gma__set_error(GMA_ERR_DEVICE, "sim: device_synchronize: out of host memory");
  }
  all[n++] = dev->legacy;
  const sim_table_t *tables[2] = {&dev->streams, &dev->ptds};
  for (int t = 0; t < 2; t++) {
    for (size_t i = 0; i <= tables[t]->mask; i++) {
      for (sim_link_t *l = tables[t]->buckets[i]; l; l = l->next) all[n++] = (sim_stream_t *)l;
    }
  }
  for (size_t i = 0; i < n; i++) all[i]->refs++;
  pthread_mutex_unlock(&dev->streams_mu);
  for (size_t i = 0; i < n; i++) stream_wait_idle(all[i]);
  for (size_t i = 0; i < n; i++) stream_put(dev, all[i]);
  free(all);
  return GMA_OK;
}

/* ---------------------------------------------------------------------------
 * Lifecycle
 * ------------------------------------------------------------------------- */
/* One thread, with no other call in flight. Streams are stopped one by one;
 * the rest keep running meanwhile, so a WAIT on another stream's record can
 * still be satisfied while its own stream drains. */
static void sim_destroy(gma__device_t *d) {
  sim_device_t *dev = sim_of(d);
  sim_link_t *l;
  while ((l = table_pop(&dev->streams))) stream_free((sim_stream_t *)l);
  while ((l = table_pop(&dev->ptds))) stream_free((sim_stream_t *)l);
  if (dev->legacy) stream_free(dev->legacy);
  /* Every queued op has run, so each remaining mark is held by its event only. */
  while ((l = table_pop(&dev->events))) {
    mark_unref(((sim_event_t *)l)->last);
    free(l);
  }
  while ((l = table_pop(&dev->allocs))) {
    munmap((void *)l->key, (size_t)((sim_alloc_t *)l)->size);
    free(l);
  }
  free(dev->streams.buckets);
  free(dev->ptds.buckets);
  free(dev->events.buckets);
  free(dev->allocs.buckets);
  pthread_mutex_destroy(&dev->mem_mu);
  pthread_mutex_destroy(&dev->streams_mu);
  pthread_cond_destroy(&dev->streams_cv);
  pthread_mutex_destroy(&dev->ev_mu);
  pthread_cond_destroy(&dev->ev_cv);
  free(dev);
}

static const gma__device_ops_t sim_ops = {
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .mem_info = sim_mem_info,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_synchronize = sim_event_synchronize,
    .stream_wait_event = sim_stream_wait_event,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_synchronize = sim_stream_synchronize,
    .device_synchronize = sim_device_synchronize,
    .sim_launch = sim_launch,
    .destroy = sim_destroy,
};

gma_status_t gma__sim_create(const gma_config_t *config, gma__device_t **out) {
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "sim: create: out is NULL");
  gma_config_t defaults = GMA_CONFIG_INIT;
  const gma_config_t *c = config ? config : &defaults;
  sim_device_t *dev = calloc(1, sizeof *dev);
  if (!dev) return gma__set_error(GMA_ERR_DEVICE, "sim: out of host memory for the device");
  dev->base.ops = &sim_ops;
  dev->base.name = "sim";
  dev->capacity = c->sim_capacity ? c->sim_capacity : SIM_DEFAULT_CAPACITY;
  dev->alloc_ns = c->sim_alloc_latency_ns;
  dev->free_ns = c->sim_free_latency_ns;
  dev->event_ns = c->sim_event_latency_ns;
  dev->fail_alloc = c->sim_fail_alloc;
  dev->fail_event = c->sim_fail_event;
  atomic_init(&dev->alloc_calls, 0);
  atomic_init(&dev->event_calls, 0);
  pthread_mutex_init(&dev->mem_mu, NULL);
  pthread_mutex_init(&dev->streams_mu, NULL);
  pthread_cond_init(&dev->streams_cv, NULL);
  pthread_mutex_init(&dev->ev_mu, NULL);
  pthread_cond_init(&dev->ev_cv, NULL);
  bool ok = table_init(&dev->allocs) && table_init(&dev->streams) && table_init(&dev->ptds) &&
            table_init(&dev->events);
  if (ok) dev->legacy = stream_new(dev, 0);
  if (!ok || !dev->legacy) {
    sim_destroy(&dev->base);
    return gma__set_error(GMA_ERR_DEVICE, "sim: cannot create the device (host memory or threads)");
  }
  *out = &dev->base;
  return GMA_OK;
}
