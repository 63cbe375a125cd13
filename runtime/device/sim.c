/* The simulated device: owns its host memory (device allocations), its
 * simulated streams (one host thread each, executing queued kernels, event
 * records and event waits strictly in order), the stream handle slots, its
 * events, and the latency and fault-injection knobs from the sim_* config
 * fields.
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
 * Fault injection (gma__sim_fault, device.h): every device call is a site
 * with its own call counter; the armed call of a site fails before it changes
 * anything, so the device stays consistent: a failed free frees nothing, a
 * failed map maps nothing, a failed record records nothing, a failed stream
 * destroy leaves the stream alive. It fails with GMA_ERR_DEVICE (a driver
 * error such as CUDA_ERROR_UNKNOWN or an ECC error) unless the test asks for
 * another status, such as GMA_ERR_OOM on the allocating sites (mem_alloc,
 * vm_map, host_alloc, vm_reserve: CUDA_ERROR_OUT_OF_MEMORY). Counting starts
 * with the first gma__sim_fault, so stream_id, called on every allocation,
 * pays one load of a flag otherwise. The older sim_fail_alloc (mem_alloc and
 * vm_map) and sim_fail_event (event calls) keys keep their own counters.
 *
 * Lock order: dev->streams_mu before stream->mu before dev->ev_mu. dev->mem_mu
 * is a leaf. A stream thread holds no lock while it runs an op, so a kernel
 * may call into the device. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "device/device.h"
#include "device/sim_cost.h"

#if defined(GMA_DEBUG) && GMA_DEBUG >= 1
#include <assert.h>
#define SIM_ASSERT(x) assert(x)
#else
#define SIM_ASSERT(x) ((void)0)
#endif

#define SIM_DEFAULT_CAPACITY (80ull << 30)
#define SIM_LEGACY_STREAM ((gma_stream_t)(uintptr_t)0x1)     /* CU_STREAM_LEGACY */
#define SIM_PER_THREAD_STREAM ((gma_stream_t)(uintptr_t)0x2) /* CU_STREAM_PER_THREAD */
#define SIM_FIRST_CHUNK_SLOTS 64 /* slots in the first chunk; each next one doubles */
#define SIM_PTDS_CACHE 4         /* devices a thread remembers its per-thread stream for */

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

/* One live device allocation; link.key is its address. vm: made by vm_map
 * inside a reservation (only vm_unmap frees it), else by mem_alloc. */
typedef struct sim_alloc {
  sim_link_t link;
  uint64_t size;
  bool vm;
} sim_alloc_t;

/* One reserved address range (vm_reserve); link.key is its base.
 * Invariant: mapped[i] != 0 <=> granule i lies in a vm mapping (a sim_alloc_t
 * with vm set), and nmapped counts them. */
typedef struct sim_reserve {
  sim_link_t link;
  uint64_t size;
  uint8_t *mapped; /* one byte per granule */
  uint64_t nmapped;
} sim_reserve_t;

/* Physical chunk size and alignment of growable segments, as on CUDA GPUs. */
#define SIM_VM_GRANULARITY (2ull << 20)

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

/* A simulated stream: the legacy default stream (dev->legacy), a per-thread
 * default stream (in dev->ptds, link.key = the owning host thread's pthread_t),
 * or a user stream (named by a slot; link unused). Every stream whose thread
 * runs is on dev->all.
 *
 * Lifetime (refs, all_prev/all_next guarded by dev->streams_mu): refs = 1 for
 * the stream's thread until it exits + callers between stream_get and
 * stream_put; whoever drops refs to 0 frees the stream. The thread exits once
 * stop is set and the queue is empty, so the stream outlives its slot exactly
 * as long as its queued work and its callers need it.
 *
 * Queue (fields below mu, guarded by mu). Invariant: the stream is idle iff
 * head == NULL && !busy. stop goes from false to true only; once it is set no
 * op is queued (stream_push checks it under mu), so the thread's last look at
 * an empty queue with stop set is final. */
typedef struct sim_stream {
  sim_link_t link;
  sim_device_t *dev;
  uint64_t id; /* immutable; unique in the process, never reused */
  unsigned refs;
  struct sim_stream *all_prev, *all_next;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* signalled when an op is queued or stop is set */
  pthread_cond_t idle_cv; /* broadcast when the stream becomes idle */
  sim_op_t *head, *tail;
  bool busy; /* the thread is running an op it popped */
  sim_op_t *running; /* that op, for sim_forget (the thread's own after a fork) */
  bool stop;
} sim_stream_t;

/* A user stream handle points at one of these. id is read without a lock by
 * stream_id (acquire, pairing with the release stores in stream_create and
 * stream_destroy); the other fields are guarded by dev->streams_mu.
 * Invariant: id == 0 iff stream == NULL iff the slot is free (on the free
 * list, or never handed out); otherwise id == stream->id. The slot's size is a
 * power of two so validating a handle's alignment is a mask. */
typedef struct sim_slot {
  _Atomic uint64_t id;
  sim_stream_t *stream;
  struct sim_slot *next_free;
  uint64_t pad_;
} sim_slot_t;
_Static_assert((sizeof(sim_slot_t) & (sizeof(sim_slot_t) - 1)) == 0,
               "slot size must be a power of two");

/* Slots are carved from chunks that are never freed before the device, so a
 * destroyed stream's handle stays a readable address that can be checked.
 * next and n are immutable once the chunk is published on dev->chunks. */
typedef struct sim_chunk {
  struct sim_chunk *next; /* the previously published (smaller) chunk */
  size_t n;
  sim_slot_t slots[];
} sim_chunk_t;

/* One thread's memory of its per-thread stream on one device. serial is the
 * device's never-reused serial number: an entry left behind by a destroyed
 * device can never match a later one at the same address. Thread-local, so
 * no synchronization; stream stays valid while its device lives. */
typedef struct sim_ptds_entry {
  uint64_t serial; /* 0: empty */
  sim_stream_t *stream;
  uint64_t id;
} sim_ptds_entry_t;

static _Thread_local sim_ptds_entry_t ptds_cache[SIM_PTDS_CACHE];
/* Process-wide counters; relaxed is enough, each only hands out unique tickets. */
static _Atomic uint64_t sim_next_stream_id = 1;
static _Atomic uint64_t sim_next_serial = 1;

struct sim_device {
  gma__device_t base; /* must stay first: the device boundary passes &base */
  /* Immutable after creation. */
  uint64_t capacity, alloc_ns, free_ns, event_ns, fail_alloc, fail_event;
  uint64_t serial;    /* never reused by another device in this process */
  uint64_t legacy_id; /* the NULL / 0x1 stream's id */
  const gma__sim_costs_t *costs; /* sim_costs: NULL, or the GPU cost preset */
  bool unpriced; /* the preset's behaviour without its prices (the fake driver) */
  /* Calls so far, for fault injection; written concurrently, relaxed is
   * enough because each only needs a unique ticket number. */
  _Atomic uint64_t alloc_calls, event_calls;
  /* Per-site fault injection (gma__sim_fault). counting goes from false to
   * true only; its release store (sim_create, gma__sim_fault) pairs with the
   * acquire load in site_fault, which then sees the settings made before it.
   * Settings changed later are relaxed: a racing call may miss them. */
  _Atomic bool counting;
  _Atomic uint64_t site_calls[GMA__SIM_NSITES]; /* tickets, relaxed */
  _Atomic uint64_t site_nth[GMA__SIM_NSITES];   /* 0: not armed */
  _Atomic int site_status[GMA__SIM_NSITES];
  /* Invariant: used = sum of sizes in allocs + reserving <= capacity;
   * host_bytes = sum of sizes in hosts (host memory is not capacity). */
  pthread_mutex_t mem_mu;
  sim_table_t allocs; /* mem_mu */
  sim_table_t reserves; /* mem_mu: sim_reserve_t by base */
  sim_table_t hosts;  /* mem_mu: host_alloc memory (sim_alloc_t) by address */
  uint64_t used;      /* mem_mu */
  uint64_t reserving; /* mem_mu: bytes of mem_alloc calls between reserve and mmap */
  uint64_t host_bytes; /* mem_mu */
  pthread_mutex_t streams_mu;
  pthread_cond_t streams_cv; /* broadcast when threads reaches 0 */
  sim_stream_t *all;         /* streams_mu: every stream whose thread runs */
  unsigned threads;          /* streams_mu: stream threads not yet exited */
  sim_table_t ptds;          /* streams_mu: per-thread default streams by pthread_t */
  sim_stream_t *legacy;      /* the NULL / 0x1 stream; immutable after creation */
  /* Slot chunks, newest (largest) first. Written under streams_mu with a
   * release store; read without a lock with an acquire load (slot_find),
   * which makes the chunk's next and n visible. */
  _Atomic(sim_chunk_t *) chunks;
  size_t chunk_used;      /* streams_mu: slots of the newest chunk handed out */
  sim_slot_t *free_slots; /* streams_mu: destroyed streams' slots, reused LIFO */
  uint64_t user_streams;  /* streams_mu: user streams created and not destroyed */
  pthread_mutex_t ev_mu;
  pthread_cond_t ev_cv; /* broadcast whenever any mark becomes done */
  sim_table_t events;   /* ev_mu: live event handles */
};

static sim_device_t *sim_of(gma__device_t *d) { return (sim_device_t *)d; }

/* The stream whose thread is the calling thread, NULL on other threads. */
static _Thread_local const struct sim_stream *sim_self;

/* Takes the host time op on bytes costs under the cost preset; nothing
 * without one. Any thread. */
static void sim_pay(const sim_device_t *dev, gma__sim_cost_op_t op, uint64_t bytes) {
  if (dev->costs && !dev->unpriced) gma__sim_cost_pay(dev->costs, op, bytes);
}

static gma_status_t device_wait_all(sim_device_t *dev);

/* Under a preset whose frees wait for the device (cuMemFree,
 * cuMemHostAlloc and cuMemFreeHost do): waits until every stream has run
 * the work queued on it, the calling stream's own thread excepted. */
static void sim_wait_device(sim_device_t *dev) {
  if (dev->costs && dev->costs->free_waits) (void)device_wait_all(dev);
}

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
  return gma__set_error(GMA_ERR_DEVICE, "injected failure of event call #%llu (%s) on the simulated device",
                        (unsigned long long)t, what);
}

static const char *const site_names[GMA__SIM_NSITES] = {
#define SIM_SITE_NAME_(NAME, name) #name,
    GMA__SIM_SITES(SIM_SITE_NAME_)
#undef SIM_SITE_NAME_
};

/* Counts one call of site and fails it, with its armed status, if it is the
 * armed one. Called first thing, before the call changes anything. Any
 * thread; wait-free (one load of a flag while counting is off). */
static gma_status_t site_fault(sim_device_t *dev, gma__sim_site_t site) {
  /* Acquire pairs with the release stores of counting. */
  if (!atomic_load_explicit(&dev->counting, memory_order_acquire)) return GMA_OK;
  uint64_t n = atomic_load_explicit(&dev->site_nth[site], memory_order_relaxed), t;
  bool sticky = n & GMA__SIM_STICKY;
  n &= ~GMA__SIM_STICKY;
  if (!fault_fires(&dev->site_calls[site], n, &t) && !(sticky && n && t >= n)) return GMA_OK;
  gma_status_t st = (gma_status_t)atomic_load_explicit(&dev->site_status[site],
                                                        memory_order_relaxed);
  return gma__set_error(st, "injected failure of %s call #%llu on the simulated device (%s)", site_names[site],
                        (unsigned long long)t,
                        st == GMA_ERR_OOM ? "out of device memory" : "device error");
}

/* The process-wide plan for sim devices created later (gma__sim_fault with
 * dev NULL), and what the last destroyed device still held. plan_mu guards
 * all of it; a device copies the plan once, at creation. */
static pthread_mutex_t plan_mu = PTHREAD_MUTEX_INITIALIZER;
static bool plan_on;                           /* plan_mu */
static uint64_t plan_nth[GMA__SIM_NSITES];     /* plan_mu */
static gma_status_t plan_status[GMA__SIM_NSITES]; /* plan_mu */
static gma__sim_live_t last_leftovers;         /* plan_mu */
static uint64_t last_calls[GMA__SIM_NSITES];   /* plan_mu: the last destroyed device's counts */

static bool is_sim(const gma__device_t *d) { return d && strcmp(d->name, "sim") == 0; }

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
    return gma__set_error(GMA_ERR_DEVICE, "injected failure of device allocation #%llu on the simulated device",
                          (unsigned long long)t);
  }
  sim_pay(dev, GMA__SIM_COST_MEM_ALLOC, size);
  gma_status_t fst = site_fault(dev, GMA__SIM_MEM_ALLOC);
  if (fst != GMA_OK) return fst;
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked to allocate without an address to return");
  if (size == 0) return gma__set_error(GMA_ERR_INVALID_SIZE, "the simulated device cannot allocate 0 bytes");
  sim_alloc_t *a = malloc(sizeof *a);
  if (!a) return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for an allocation record");
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
                          "the simulated device is out of memory: requested %llu bytes, %llu of %llu "
                          "bytes in use (%llu free)",
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
    a->vm = false;
    a->size = size;
    table_insert(&dev->allocs, &a->link);
  }
  SIM_MEM_CHECK(dev);
  pthread_mutex_unlock(&dev->mem_mu);
  if (p == MAP_FAILED) {
    free(a);
    return gma__set_error(GMA_ERR_OOM, "the simulated device could not map %llu bytes of host memory: %s",
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
  sim_wait_device(dev);
  sim_pay(dev, GMA__SIM_COST_MEM_FREE, size);
  gma_status_t fst = site_fault(dev, GMA__SIM_MEM_FREE);
  if (fst != GMA_OK) return fst;
  pthread_mutex_lock(&dev->mem_mu);
  sim_alloc_t *a = (sim_alloc_t *)table_find(&dev->allocs, addr);
  if (a && a->vm) {
    pthread_mutex_unlock(&dev->mem_mu);
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot free 0x%llx as an allocation: it is a mapping of a "
                          "growable segment",
                          (unsigned long long)addr);
  }
  uint64_t real = a ? a->size : 0;
  if (a && real == size) {
    table_remove(&dev->allocs, addr);
    dev->used -= size;
  }
  SIM_MEM_CHECK(dev);
  pthread_mutex_unlock(&dev->mem_mu);
  if (!a) {
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot free 0x%llx (%llu bytes): not a live device "
                          "allocation",
                          (unsigned long long)addr, (unsigned long long)size);
  }
  if (real != size) {
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot free 0x%llx with size %llu: it was allocated "
                          "with %llu bytes; nothing freed",
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
  sim_pay(dev, GMA__SIM_COST_MEM_INFO, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_MEM_INFO);
  if (fst != GMA_OK) return fst;
  pthread_mutex_lock(&dev->mem_mu);
  uint64_t used = dev->used;
  pthread_mutex_unlock(&dev->mem_mu);
  if (free_bytes) *free_bytes = dev->capacity - used;
  if (total_bytes) *total_bytes = dev->capacity;
  return GMA_OK;
}

/* ---------------------------------------------------------------------------
 * Virtual memory (growable segments): a reservation is PROT_NONE address
 * space; vm_map maps read-write pages over part of it (MAP_FIXED) and charges
 * the capacity; vm_unmap puts PROT_NONE back, which drops the pages, so a
 * kernel still touching unmapped memory faults as it would on a GPU.
 * ------------------------------------------------------------------------- */
static gma_status_t sim_vm_granularity(gma__device_t *d, uint64_t *bytes) {
  sim_device_t *dev = sim_of(d);
  gma_status_t fst = site_fault(dev, GMA__SIM_VM_GRANULARITY);
  if (fst != GMA_OK) return fst;
  if (!bytes) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked for its granularity without a place for it");
  *bytes = SIM_VM_GRANULARITY;
  return GMA_OK;
}

static bool vm_aligned(uint64_t x) { return x % SIM_VM_GRANULARITY == 0; }

/* Any thread. */
static gma_status_t sim_vm_reserve(gma__device_t *d, uint64_t size, uintptr_t *out) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_VM_RESERVE, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_VM_RESERVE);
  if (fst != GMA_OK) return fst;
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked to reserve without an address to return");
  if (size == 0 || !vm_aligned(size) || size > (1ull << 46))
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "the simulated device cannot reserve %llu bytes of address space: not a "
                          "nonzero multiple of the granularity (%llu) below 64 TiB",
                          (unsigned long long)size, SIM_VM_GRANULARITY);
  sim_reserve_t *r = calloc(1, sizeof *r);
  uint8_t *mapped = calloc((size_t)(size / SIM_VM_GRANULARITY), 1);
  size_t span = (size_t)(size + SIM_VM_GRANULARITY);
  void *p = r && mapped ? mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                               -1, 0)
                        : MAP_FAILED;
  if (p == MAP_FAILED) {
    free(r);
    free(mapped);
    return gma__set_error(GMA_ERR_OOM, "the simulated device cannot reserve %llu bytes of address space",
                          (unsigned long long)size);
  }
  /* Keep the aligned part; give the slop on either side back. */
  uintptr_t raw = (uintptr_t)p, base = (raw + SIM_VM_GRANULARITY - 1) & ~(SIM_VM_GRANULARITY - 1);
  if (base > raw) munmap(p, base - raw);
  if (raw + span > base + size) munmap((void *)(base + size), raw + span - (base + size));
  r->link.key = base;
  r->size = size;
  r->mapped = mapped;
  pthread_mutex_lock(&dev->mem_mu);
  table_insert(&dev->reserves, &r->link);
  pthread_mutex_unlock(&dev->mem_mu);
  *out = base;
  return GMA_OK;
}

/* The reservation holding [addr, addr + size), or NULL; caller holds mem_mu.
 * Reservations are few (one per pool), so a scan is fine. */
static sim_reserve_t *reserve_of(const sim_device_t *dev, uintptr_t addr, uint64_t size) {
  for (size_t i = 0; i <= dev->reserves.mask; i++)
    for (sim_link_t *l = dev->reserves.buckets[i]; l; l = l->next) {
      sim_reserve_t *r = (sim_reserve_t *)l;
      if (addr >= l->key && size <= r->size && addr - l->key <= r->size - size) return r;
    }
  return NULL;
}

/* Any thread. */
static gma_status_t sim_vm_release(gma__device_t *d, uintptr_t addr, uint64_t size) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_VM_RELEASE, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_VM_RELEASE);
  if (fst != GMA_OK) return fst;
  pthread_mutex_lock(&dev->mem_mu);
  sim_reserve_t *r = (sim_reserve_t *)table_find(&dev->reserves, addr);
  bool ok = r && r->size == size && r->nmapped == 0;
  if (ok) table_remove(&dev->reserves, addr);
  pthread_mutex_unlock(&dev->mem_mu);
  if (!ok)
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot release the range 0x%llx (%llu bytes): %s", (unsigned long long)addr,
                          (unsigned long long)size,
                          !r ? "not a reservation"
                             : r->size != size ? "size differs from the reservation's"
                                               : "parts of it are still mapped");
  munmap((void *)addr, (size_t)size);
  free(r->mapped);
  free(r);
  return GMA_OK;
}

/* Any thread. Blocks for the configured allocation latency; counts as a
 * device allocation for fault injection. */
static gma_status_t sim_vm_map(gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t *handle) {
  sim_device_t *dev = sim_of(d);
  sim_sleep(dev->alloc_ns);
  uint64_t t;
  if (fault_fires(&dev->alloc_calls, dev->fail_alloc, &t))
    return gma__set_error(GMA_ERR_DEVICE, "injected failure of device allocation #%llu "
                                          "(vm_map) on the simulated device", (unsigned long long)t);
  sim_pay(dev, GMA__SIM_COST_VM_MAP, size);
  gma_status_t fst = site_fault(dev, GMA__SIM_VM_MAP);
  if (fst != GMA_OK) return fst;
  if (!handle) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked to map memory without a place for its handle");
  if (size == 0 || !vm_aligned(size) || !vm_aligned(addr))
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "the simulated device cannot map %llu bytes at 0x%llx: not aligned to its "
                          "granularity",
                          (unsigned long long)size, (unsigned long long)addr);
  sim_alloc_t *a = calloc(1, sizeof *a);
  if (!a) return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for a mapping record");
  pthread_mutex_lock(&dev->mem_mu);
  sim_reserve_t *r = reserve_of(dev, addr, size);
  uint64_t g0 = r ? (addr - r->link.key) / SIM_VM_GRANULARITY : 0, n = size / SIM_VM_GRANULARITY;
  bool free_range = r != NULL;
  for (uint64_t i = 0; free_range && i < n; i++) free_range = !r->mapped[g0 + i];
  uint64_t used = dev->used;
  bool fits = size <= dev->capacity - used;
  if (free_range && fits) {
    /* The map happens under mem_mu, so a concurrent unmap of a neighbour
     * (also under mem_mu) cannot interleave with it. */
    void *p = mmap((void *)addr, (size_t)size, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fits = false;
    } else {
      memset(r->mapped + g0, 1, (size_t)n);
      r->nmapped += n;
      dev->used += size;
      a->link.key = addr;
      a->size = size;
      a->vm = true;
      table_insert(&dev->allocs, &a->link);
    }
  }
  SIM_MEM_CHECK(dev);
  pthread_mutex_unlock(&dev->mem_mu);
  if (!free_range) {
    free(a);
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot map 0x%llx (%llu bytes): %s", (unsigned long long)addr,
                          (unsigned long long)size,
                          r ? "part of the range is already mapped" : "not inside a reservation");
  }
  if (!fits) {
    free(a);
    return gma__set_error(GMA_ERR_OOM,
                          "the simulated device is out of memory: mapping %llu bytes, %llu of %llu "
                          "bytes in use",
                          (unsigned long long)size, (unsigned long long)used,
                          (unsigned long long)dev->capacity);
  }
  *handle = addr; /* the mapping's own address names its physical memory */
  return GMA_OK;
}

/* Any thread. Blocks for the configured free latency. */
static gma_status_t sim_vm_unmap(gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t handle) {
  sim_device_t *dev = sim_of(d);
  sim_sleep(dev->free_ns);
  sim_pay(dev, GMA__SIM_COST_VM_UNMAP, size);
  gma_status_t fst = site_fault(dev, GMA__SIM_VM_UNMAP);
  if (fst != GMA_OK) return fst;
  pthread_mutex_lock(&dev->mem_mu);
  sim_alloc_t *a = (sim_alloc_t *)table_find(&dev->allocs, addr);
  bool ok = a && a->vm && a->size == size && handle == addr;
  if (ok) {
    sim_reserve_t *r = reserve_of(dev, addr, size);
    SIM_ASSERT(r);
    memset(r->mapped + (addr - r->link.key) / SIM_VM_GRANULARITY, 0,
           (size_t)(size / SIM_VM_GRANULARITY));
    r->nmapped -= size / SIM_VM_GRANULARITY;
    table_remove(&dev->allocs, addr);
    dev->used -= size;
    /* PROT_NONE again, pages dropped; still under mem_mu (see vm_map). */
    mmap((void *)addr, (size_t)size, PROT_NONE,
         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  SIM_MEM_CHECK(dev);
  pthread_mutex_unlock(&dev->mem_mu);
  if (!ok)
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot unmap 0x%llx (%llu bytes): not exactly one "
                          "earlier mapping",
                          (unsigned long long)addr, (unsigned long long)size);
  free(a);
  return GMA_OK;
}

/* ---------------------------------------------------------------------------
 * Host memory: ordinary anonymous memory (the simulated device reads host
 * memory anyway), so the device address is the host address. Each block is
 * recorded in dev->hosts, so a free of anything else is refused (as a driver
 * would) and destroy gives back what is left.
 * ------------------------------------------------------------------------- */
static gma_status_t sim_host_alloc(gma__device_t *d, uint64_t size, void **host,
                                   uintptr_t *dev_addr) {
  sim_device_t *dev = sim_of(d);
  sim_wait_device(dev);
  sim_pay(dev, GMA__SIM_COST_HOST_ALLOC, size);
  gma_status_t fst = site_fault(dev, GMA__SIM_HOST_ALLOC);
  if (fst != GMA_OK) return fst;
  sim_alloc_t *a = malloc(sizeof *a);
  void *p = a && size && size <= SIZE_MAX
                ? mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0)
                : MAP_FAILED;
  if (p == MAP_FAILED) {
    free(a);
    return gma__set_error(GMA_ERR_OOM, "the simulated device has no host memory for %llu pinned bytes",
                          (unsigned long long)size);
  }
  a->link.key = (uintptr_t)p;
  a->size = size;
  a->vm = false;
  pthread_mutex_lock(&dev->mem_mu);
  table_insert(&dev->hosts, &a->link);
  dev->host_bytes += size;
  pthread_mutex_unlock(&dev->mem_mu);
  *host = p;
  *dev_addr = (uintptr_t)p;
  return GMA_OK;
}

/* Any thread. An unknown address or another size changes nothing. */
static gma_status_t sim_host_free(gma__device_t *d, void *host, uint64_t size) {
  sim_device_t *dev = sim_of(d);
  sim_wait_device(dev);
  sim_pay(dev, GMA__SIM_COST_HOST_FREE, size);
  gma_status_t fst = site_fault(dev, GMA__SIM_HOST_FREE);
  if (fst != GMA_OK) return fst;
  pthread_mutex_lock(&dev->mem_mu);
  sim_alloc_t *a = (sim_alloc_t *)table_find(&dev->hosts, (uintptr_t)host);
  bool ok = a && a->size == size;
  if (ok) {
    table_remove(&dev->hosts, (uintptr_t)host);
    dev->host_bytes -= size;
  }
  pthread_mutex_unlock(&dev->mem_mu);
  if (!ok)
    return gma__set_error(GMA_ERR_DEVICE, "the simulated device cannot free pinned memory %p (%llu bytes): %s", host,
                          (unsigned long long)size,
                          a ? "size differs from the allocation's; nothing freed"
                            : "not a live host allocation");
  munmap(host, (size_t)size);
  free(a);
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
static sim_event_t *event_find(sim_device_t *dev, gma__event_t h) {
  sim_event_t *ev = (sim_event_t *)table_find(&dev->events, (uintptr_t)h);
  if (!ev) {
    gma__set_error(GMA_ERR_INVALID_ARGUMENT, "event %p is not a live event of the simulated device",
                   h);
  }
  return ev;
}

/* Any thread. */
static gma_status_t sim_event_create(gma__device_t *d, gma__event_t *out) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "event_create");
  sim_pay(dev, GMA__SIM_COST_EVENT_CREATE, 0);
  if (st == GMA_OK) st = site_fault(dev, GMA__SIM_EVENT_CREATE);
  if (st != GMA_OK) return st;
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked for an event without a place for it");
  sim_event_t *ev = calloc(1, sizeof *ev);
  if (!ev) return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for an event");
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
  sim_pay(dev, GMA__SIM_COST_EVENT_DESTROY, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_EVENT_DESTROY);
  if (fst != GMA_OK) return fst;
  pthread_mutex_lock(&dev->ev_mu);
  sim_event_t *ev = event_find(dev, h);
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
  sim_pay(dev, GMA__SIM_COST_EVENT_QUERY, 0);
  if (st == GMA_OK) st = site_fault(dev, GMA__SIM_EVENT_QUERY);
  if (st != GMA_OK) return st;
  if (!done) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked to query an event without a place for the answer");
  sim_sleep(dev->event_ns);
  pthread_mutex_lock(&dev->ev_mu);
  sim_event_t *ev = event_find(dev, h);
  if (ev) *done = !ev->last || ev->last->done;
  pthread_mutex_unlock(&dev->ev_mu);
  return ev ? GMA_OK : GMA_ERR_INVALID_ARGUMENT;
}

/* Any thread except a stream thread of this device (it could wait on itself).
 * Blocks until the record made before the call has completed. */
static gma_status_t sim_event_synchronize(gma__device_t *d, gma__event_t h) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "event_synchronize");
  sim_pay(dev, GMA__SIM_COST_EVENT_SYNCHRONIZE, 0);
  if (st == GMA_OK) st = site_fault(dev, GMA__SIM_EVENT_SYNCHRONIZE);
  if (st != GMA_OK) return st;
  pthread_mutex_lock(&dev->ev_mu);
  sim_event_t *ev = event_find(dev, h);
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
  /* Under a preset, an event behind work completes a little after it. */
  if (op->kind == SIM_OP_RECORD && dev->costs) gma__sim_spin_ns(dev->costs->event_latency_ns);
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
  op->mark = NULL; /* dropped: sim_forget must not drop it again */
  pthread_mutex_unlock(&dev->ev_mu);
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
  pthread_mutex_lock(&dev->streams_mu);
  *(s->all_prev ? &s->all_prev->all_next : &dev->all) = s->all_next;
  if (s->all_next) s->all_next->all_prev = s->all_prev;
  bool last = stream_unref_locked(s);
  if (--dev->threads == 0) pthread_cond_broadcast(&dev->streams_cv);
  pthread_mutex_unlock(&dev->streams_mu);
  if (last) stream_fini(s);
}

/* The stream's own thread (detached): runs ops in queue order until stopped
 * and idle, then retires the stream. */
static void *stream_main(void *arg) {
  sim_stream_t *s = arg;
  sim_self = s;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
    sim_op_t *op = s->head;
    if (!op) break; /* stopped and idle: stream_push queues nothing more */
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->busy = true;
    s->running = op;
    pthread_mutex_unlock(&s->mu);
    op_run(s->dev, op);
    pthread_mutex_lock(&s->mu);
    s->busy = false;
    s->running = NULL;
    free(op); /* after running is cleared: sim_forget never sees a freed op */
    if (!s->head) pthread_cond_broadcast(&s->idle_cv);
  }
  pthread_mutex_unlock(&s->mu);
  stream_exit(s);
  return NULL;
}

/* Allocates a stream with a fresh id, starts its (detached) thread and puts it
 * on dev->all; NULL if memory or the thread is lacking. Any thread. The thread
 * cannot exit before it is on dev->all: it exits only after stop, and stop is
 * set only on streams that callers can reach. */
static sim_stream_t *stream_new(sim_device_t *dev) {
  sim_stream_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->dev = dev;
  s->id = atomic_fetch_add_explicit(&sim_next_stream_id, 1, memory_order_relaxed);
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
  pthread_mutex_lock(&dev->streams_mu);
  s->all_next = dev->all;
  if (dev->all) dev->all->all_prev = s;
  dev->all = s;
  dev->threads++;
  pthread_mutex_unlock(&dev->streams_mu);
  return s;
}

/* Lets the stream's thread finish the queued work and exit; returns at once.
 * The caller makes sure s is still alive (its thread cannot exit before this). */
static void stream_stop(sim_stream_t *s) {
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
}

/* Blocks until the stream is idle. Any thread but the stream's own. */
static void stream_wait_idle(sim_stream_t *s) {
  pthread_mutex_lock(&s->mu);
  while (s->head || s->busy) pthread_cond_wait(&s->idle_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

/* Maps a handle to its slot, or NULL when it is not a slot of this device.
 * Only chunk addresses are compared, nothing is dereferenced but the chunk
 * headers, so any value is safe. Any thread; lock-free (the chunk list only
 * grows, and each chunk is immutable once published). */
static sim_slot_t *slot_find(sim_device_t *dev, gma_stream_t h) {
  /* Acquire pairs with the release store in slot_take. */
  for (sim_chunk_t *c = atomic_load_explicit(&dev->chunks, memory_order_acquire); c; c = c->next) {
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
    if (f->stream || atomic_load_explicit(&f->id, memory_order_relaxed) != 0) return false;
  }
  sim_chunk_t *newest = atomic_load_explicit(&dev->chunks, memory_order_relaxed);
  for (sim_chunk_t *c = newest; c; c = c->next) {
    size_t used = c == newest ? dev->chunk_used : c->n;
    for (size_t i = 0; i < c->n; i++) {
      const sim_slot_t *sl = &c->slots[i];
      uint64_t id = atomic_load_explicit(&sl->id, memory_order_relaxed);
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
  sim_chunk_t *c = atomic_load_explicit(&dev->chunks, memory_order_relaxed);
  if (!c || dev->chunk_used == c->n) {
    size_t n = c ? c->n * 2 : SIM_FIRST_CHUNK_SLOTS;
    sim_chunk_t *nc = calloc(1, sizeof *nc + n * sizeof(sim_slot_t));
    if (!nc) return NULL;
    nc->next = c;
    nc->n = n;
    for (size_t i = 0; i < n; i++) atomic_init(&nc->slots[i].id, 0);
    /* Release: a slot_find that sees nc also sees its next, n and zero ids. */
    atomic_store_explicit(&dev->chunks, nc, memory_order_release);
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
  pthread_mutex_lock(&dev->streams_mu);
  sim_stream_t *s = (sim_stream_t *)table_find(&dev->ptds, tid);
  pthread_mutex_unlock(&dev->streams_mu);
  if (!s) {
    /* Only this thread inserts under its own pthread_t, so nobody can add
     * the key between the find above and the insert below. */
    s = stream_new(dev);
    if (!s) {
      return gma__set_error(GMA_ERR_DEVICE, "the simulated device cannot start this thread's per-thread default "
                            "stream");
    }
    s->link.key = tid;
    pthread_mutex_lock(&dev->streams_mu);
    table_insert(&dev->ptds, &s->link);
    pthread_mutex_unlock(&dev->streams_mu);
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
  pthread_mutex_lock(&dev->streams_mu);
  if (!s) {
    sim_slot_t *slot = slot_find(dev, h);
    s = slot ? slot->stream : NULL;
  }
  if (s) s->refs++;
  pthread_mutex_unlock(&dev->streams_mu);
  *out = s;
  if (s) return GMA_OK;
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "stream %p is not a live stream of the simulated device (never created "
                        "on it, or already destroyed)",
                        h);
}

/* Drops a reference taken by stream_get. Any thread. */
static void stream_put(sim_device_t *dev, sim_stream_t *s) {
  pthread_mutex_lock(&dev->streams_mu);
  bool last = stream_unref_locked(s);
  pthread_mutex_unlock(&dev->streams_mu);
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
  pthread_mutex_lock(&s->mu);
  bool idle = !s->head && !s->busy;
  if (s->stop) {
    st = gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "stream %p was destroyed while the call was queueing work on it", h);
  } else if (op->kind != SIM_OP_KERNEL) {
    pthread_mutex_lock(&dev->ev_mu);
    sim_event_t *ev = event_find(dev, evh);
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
  if (!op) gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for a queued operation");
  if (op) op->kind = kind;
  return op;
}

/* Any thread. Blocks for the configured event latency only. */
static gma_status_t sim_event_record(gma__device_t *d, gma__event_t ev, gma_stream_t stream) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "event_record");
  sim_pay(dev, GMA__SIM_COST_EVENT_RECORD, 0);
  if (st == GMA_OK) st = site_fault(dev, GMA__SIM_EVENT_RECORD);
  if (st != GMA_OK) return st;
  sim_sleep(dev->event_ns);
  sim_op_t *op = op_new(SIM_OP_RECORD);
  return op ? stream_push(dev, stream, op, ev) : GMA_ERR_DEVICE;
}

/* Any thread; the host never blocks, only the stream's thread does. */
static gma_status_t sim_stream_wait_event(gma__device_t *d, gma_stream_t stream, gma__event_t ev) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "stream_wait_event");
  sim_pay(dev, GMA__SIM_COST_STREAM_WAIT_EVENT, 0);
  if (st == GMA_OK) st = site_fault(dev, GMA__SIM_STREAM_WAIT_EVENT);
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
static gma_status_t sim_stream_wait_stream(gma__device_t *d, gma_stream_t waiter,
                                           gma_stream_t waitee) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = event_fault(dev, "stream_wait_stream");
  sim_pay(dev, GMA__SIM_COST_STREAM_WAIT_EVENT, 0);
  if (st == GMA_OK) st = site_fault(dev, GMA__SIM_STREAM_WAIT_STREAM);
  if (st != GMA_OK) return st;
  sim_sleep(dev->event_ns);
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
    pthread_mutex_lock(&e->mu);
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
    pthread_mutex_unlock(&e->mu);
  }
  if (m) {
    pthread_mutex_lock(&w->mu);
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
    pthread_mutex_unlock(&w->mu);
  }
  if (m) { /* the waiter refused the WAIT: drop its reference */
    pthread_mutex_lock(&dev->ev_mu);
    mark_unref(m);
    pthread_mutex_unlock(&dev->ev_mu);
  }
  free(rec);
  free(wait);
  stream_put(dev, e);
  stream_put(dev, w);
  return st;
}

/* Any thread. */
static gma_status_t sim_launch(gma__device_t *d, gma_stream_t stream, gma_sim_kernel_fn fn,
                               void *arg) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_LAUNCH, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_SIM_LAUNCH);
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
static gma_status_t sim_stream_create(gma__device_t *d, gma_stream_t *out) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_STREAM_CREATE, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_STREAM_CREATE);
  if (fst != GMA_OK) return fst;
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked for a stream without a place for it");
  sim_stream_t *s = stream_new(dev);
  if (!s) return gma__set_error(GMA_ERR_DEVICE, "the simulated device cannot start a thread for a new stream");
  pthread_mutex_lock(&dev->streams_mu);
  sim_slot_t *slot = slot_take(dev);
  if (slot) {
    dev->user_streams++;
    slot->stream = s;
    /* Release pairs with the acquire in sim_stream_id. */
    atomic_store_explicit(&slot->id, s->id, memory_order_release);
  }
  SIM_SLOTS_CHECK(dev);
  pthread_mutex_unlock(&dev->streams_mu);
  if (!slot) {
    stream_stop(s); /* nobody else can reach s; its thread frees it */
    return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for a new stream");
  }
  *out = slot;
  return GMA_OK;
}

/* Any thread, the stream's own included; returns at once. The slot is freed
 * first, so the next stream_create may reuse the handle value while this
 * stream's queued work still runs; the stream frees itself after that. */
static gma_status_t sim_stream_destroy(gma__device_t *d, gma_stream_t h) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_STREAM_DESTROY, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_STREAM_DESTROY);
  if (fst != GMA_OK) return fst;
  if (h == NULL || h == SIM_LEGACY_STREAM || h == SIM_PER_THREAD_STREAM) {
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "stream %p is a default stream, which cannot be destroyed",
                          h);
  }
  pthread_mutex_lock(&dev->streams_mu);
  sim_slot_t *slot = slot_find(dev, h);
  sim_stream_t *s = slot ? slot->stream : NULL;
  if (s) {
    dev->user_streams--;
    slot->stream = NULL;
    /* Release pairs with the acquire in sim_stream_id (0: destroyed). */
    atomic_store_explicit(&slot->id, 0, memory_order_release);
    slot->next_free = dev->free_slots;
    dev->free_slots = slot;
  }
  SIM_SLOTS_CHECK(dev);
  pthread_mutex_unlock(&dev->streams_mu);
  if (!s) {
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "stream %p is not a live stream of the simulated device (never created "
                          "on it, or already destroyed)", h);
  }
  /* s is still alive: its thread exits only after this stop. */
  stream_stop(s);
  return GMA_OK;
}

/* Any thread; wait-free on a hit of the slot chunks or the per-thread cache
 * (a few loads), takes streams_mu only on a thread's first use of 0x2 on this
 * device (or a cache collision between devices). Never waits for a stream. */
static gma_status_t sim_stream_id(gma__device_t *d, gma_stream_t h, uint64_t *id) {
  sim_device_t *dev = sim_of(d);
  /* cuda.c's stream_id asks the capture state first, then the id. */
  sim_pay(dev, GMA__SIM_COST_STREAM_CAPTURE, 0);
  sim_pay(dev, GMA__SIM_COST_STREAM_ID, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_STREAM_ID);
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
  uint64_t v = slot ? atomic_load_explicit(&slot->id, memory_order_acquire) : 0;
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
static gma_status_t sim_stream_synchronize(gma__device_t *d, gma_stream_t h) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_STREAM_SYNCHRONIZE, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_STREAM_SYNCHRONIZE);
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
static gma_status_t sim_device_synchronize(gma__device_t *d) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_DEVICE_SYNCHRONIZE, 0);
  gma_status_t fst = site_fault(dev, GMA__SIM_DEVICE_SYNCHRONIZE);
  if (fst != GMA_OK) return fst;
  return device_wait_all(dev);
}

/* Waits until every stream with a running thread (but the caller's own) has
 * run the work queued on it. Any thread. */
static gma_status_t device_wait_all(sim_device_t *dev) {
  pthread_mutex_lock(&dev->streams_mu);
  size_t n = 0;
  sim_stream_t **all = malloc((dev->threads + 1) * sizeof *all);
  if (!all) {
    pthread_mutex_unlock(&dev->streams_mu);
    return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory to synchronize");
  }
  for (sim_stream_t *s = dev->all; s; s = s->all_next) {
    if (s == sim_self) continue; /* a stream thread cannot wait for itself */
    s->refs++;
    all[n++] = s;
  }
  pthread_mutex_unlock(&dev->streams_mu);
  for (size_t i = 0; i < n; i++) stream_wait_idle(all[i]);
  for (size_t i = 0; i < n; i++) stream_put(dev, all[i]);
  free(all);
  return GMA_OK;
}

/* Unmaps the memory behind every device allocation, address reservation and
 * pinned host block, and frees their tables: the device's destroy, and its
 * forget in a fork() child. mem_mu held, or no other thread left. */
static void release_memory(sim_device_t *dev) {
  sim_link_t *l;
  while ((l = table_pop(&dev->allocs))) {
    munmap((void *)l->key, (size_t)((sim_alloc_t *)l)->size);
    free(l);
  }
  while ((l = table_pop(&dev->reserves))) {
    munmap((void *)l->key, (size_t)((sim_reserve_t *)l)->size);
    free(((sim_reserve_t *)l)->mapped);
    free(l);
  }
  while ((l = table_pop(&dev->hosts))) {
    munmap((void *)l->key, (size_t)((sim_alloc_t *)l)->size);
    free(l);
  }
  free(dev->allocs.buckets);
  free(dev->reserves.buckets);
  free(dev->hosts.buckets);
}

/* ---------------------------------------------------------------------------
 * Lifecycle
 * ------------------------------------------------------------------------- */
/* One thread, with no other call in flight. Every stream is told to stop at
 * once and drains its queue concurrently with the others, so a WAIT on
 * another stream's record can still be satisfied, and work left on streams
 * destroyed earlier finishes too. Blocks until every stream thread has
 * exited; each frees its own stream (no caller holds a reference now). */
static void sim_destroy(gma__device_t *d) {
  sim_device_t *dev = sim_of(d);
  gma__sim_live_t left;
  gma__sim_live(d, &left);
  pthread_mutex_lock(&plan_mu);
  last_leftovers = left;
  for (int i = 0; i < GMA__SIM_NSITES; i++)
    last_calls[i] = atomic_load_explicit(&dev->site_calls[i], memory_order_relaxed);
  pthread_mutex_unlock(&plan_mu);
  pthread_mutex_lock(&dev->streams_mu);
  /* The per-thread streams are dropped from the table while still alive; the
   * table's links live in the streams, which free themselves below. */
  while (table_pop(&dev->ptds)) {
  }
  for (sim_stream_t *s = dev->all; s; s = s->all_next) stream_stop(s);
  while (dev->threads > 0) pthread_cond_wait(&dev->streams_cv, &dev->streams_mu);
  SIM_ASSERT(dev->all == NULL);
  pthread_mutex_unlock(&dev->streams_mu);
  for (sim_chunk_t *c = atomic_load_explicit(&dev->chunks, memory_order_relaxed), *next; c;
       c = next) {
    next = c->next;
    free(c);
  }
  /* Every queued op has run, so each remaining mark is held by its event only. */
  sim_link_t *l;
  while ((l = table_pop(&dev->events))) {
    mark_unref(((sim_event_t *)l)->last);
    free(l);
  }
  release_memory(dev);
  free(dev->ptds.buckets);
  free(dev->events.buckets);
  pthread_mutex_destroy(&dev->mem_mu);
  pthread_mutex_destroy(&dev->streams_mu);
  pthread_cond_destroy(&dev->streams_cv);
  pthread_mutex_destroy(&dev->ev_mu);
  pthread_cond_destroy(&dev->ev_cv);
  free(dev);
}

/* The child of a fork() (device.h, forget). The stream threads are the
 * parent's and do not exist here, and any lock of the device may have been
 * held by one of them when fork() ran; so nothing is joined or waited for,
 * and each lock is only tried. A lock that was free at fork time guards
 * consistent state, which is freed; what a lock held then guards is leaked,
 * because a parent thread was in the middle of changing it. What counts is
 * the memory behind device allocations, reservations and pinned blocks (all
 * under mem_mu); streams, their queued ops and events are small. The mutexes
 * and condition variables are not destroyed (a dead waiter could make
 * destroying a condition variable wait forever); their memory is freed. */
static void sim_forget(gma__device_t *d) {
  sim_device_t *dev = sim_of(d);
  sim_link_t *l;
  if (pthread_mutex_trylock(&dev->mem_mu) == 0) {
    release_memory(dev);
    pthread_mutex_unlock(&dev->mem_mu);
  }
  bool ev = pthread_mutex_trylock(&dev->ev_mu) == 0; /* marks of queued ops may be freed */
  if (pthread_mutex_trylock(&dev->streams_mu) == 0) {
    for (sim_stream_t *s = dev->all, *next; s; s = next) {
      next = s->all_next;
      if (pthread_mutex_trylock(&s->mu) != 0) continue; /* its queue was changing: leaked */
      if (s->running) s->running->next = s->head; /* its thread was running it: ours now */
      for (sim_op_t *op = s->running ? s->running : s->head, *onext; op; op = onext) {
        onext = op->next;
        if (ev) mark_unref(op->mark);
        free(op);
      }
      pthread_mutex_unlock(&s->mu);
      free(s);
    }
    for (sim_chunk_t *c = atomic_load_explicit(&dev->chunks, memory_order_relaxed), *next; c;
         c = next) {
      next = c->next;
      free(c);
    }
    free(dev->ptds.buckets); /* its links are in the streams */
    pthread_mutex_unlock(&dev->streams_mu);
  }
  if (ev) {
    while ((l = table_pop(&dev->events))) {
      mark_unref(((sim_event_t *)l)->last);
      free(l);
    }
    free(dev->events.buckets);
    pthread_mutex_unlock(&dev->ev_mu);
  }
  free(dev);
}

/* Under a cost preset the CUDA backend's capture query is priced as well:
 * the sim then answers it (never capturing) so that gma makes the calls it
 * makes on a GPU. */
static gma_status_t sim_stream_capture(gma__device_t *d, gma_stream_t stream, bool *capturing,
                                       uint64_t *id) {
  (void)stream;
  sim_pay(sim_of(d), GMA__SIM_COST_STREAM_CAPTURE, 0);
  if (capturing) *capturing = false;
  if (id) *id = 0;
  return GMA_OK;
}

#define SIM_OPS_COMMON \
    .mem_alloc = sim_mem_alloc, \
    .mem_free = sim_mem_free, \
    .mem_info = sim_mem_info, \
    .event_create = sim_event_create, \
    .event_destroy = sim_event_destroy, \
    .event_record = sim_event_record, \
    .event_query = sim_event_query, \
    .event_synchronize = sim_event_synchronize, \
    .stream_wait_event = sim_stream_wait_event, \
    .stream_wait_stream = sim_stream_wait_stream, \
    .stream_create = sim_stream_create, \
    .stream_destroy = sim_stream_destroy, \
    .stream_id = sim_stream_id, \
    .stream_synchronize = sim_stream_synchronize, \
    .device_synchronize = sim_device_synchronize, \
    .vm_granularity = sim_vm_granularity, \
    .vm_reserve = sim_vm_reserve, \
    .vm_release = sim_vm_release, \
    .vm_map = sim_vm_map, \
    .vm_unmap = sim_vm_unmap, \
    .host_alloc = sim_host_alloc, \
    .host_free = sim_host_free, \
    .sim_launch = sim_launch, \
    .destroy = sim_destroy, \
    .forget = sim_forget,
static const gma__device_ops_t sim_ops = {SIM_OPS_COMMON};
static const gma__device_ops_t sim_ops_priced = {SIM_OPS_COMMON .stream_capture = sim_stream_capture};
#undef SIM_OPS_COMMON

gma_status_t gma__sim_create(const gma_config_t *config, gma__device_t **out) {
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was created without a place for it");
  gma_config_t defaults = GMA_CONFIG_INIT;
  const gma_config_t *c = config ? config : &defaults;
  sim_device_t *dev = calloc(1, sizeof *dev);
  if (!dev) return gma__set_error(GMA_ERR_DEVICE, "no host memory for the simulated device");
  dev->costs = gma__sim_costs_preset(c->sim_costs);
  dev->base.ops = dev->costs ? &sim_ops_priced : &sim_ops;
  dev->base.name = "sim";
  dev->capacity = c->sim_capacity ? c->sim_capacity : SIM_DEFAULT_CAPACITY;
  dev->alloc_ns = c->sim_alloc_latency_ns;
  dev->free_ns = c->sim_free_latency_ns;
  dev->event_ns = c->sim_event_latency_ns;
  dev->fail_alloc = c->sim_fail_alloc;
  dev->fail_event = c->sim_fail_event;
  dev->serial = atomic_fetch_add_explicit(&sim_next_serial, 1, memory_order_relaxed);
  atomic_init(&dev->alloc_calls, 0);
  atomic_init(&dev->event_calls, 0);
  pthread_mutex_lock(&plan_mu); /* the plan for devices created from now on */
  for (int i = 0; i < GMA__SIM_NSITES; i++) {
    atomic_init(&dev->site_calls[i], 0);
    atomic_init(&dev->site_nth[i], plan_nth[i]);
    atomic_init(&dev->site_status[i], (int)plan_status[i]);
  }
  /* Release pairs with site_fault's acquire (the settings above before it). */
  atomic_store_explicit(&dev->counting, plan_on, memory_order_release);
  pthread_mutex_unlock(&plan_mu);
  atomic_init(&dev->chunks, NULL);
  pthread_mutex_init(&dev->mem_mu, NULL);
  pthread_mutex_init(&dev->streams_mu, NULL);
  pthread_cond_init(&dev->streams_cv, NULL);
  pthread_mutex_init(&dev->ev_mu, NULL);
  pthread_cond_init(&dev->ev_cv, NULL);
  bool ok = table_init(&dev->allocs) && table_init(&dev->ptds) && table_init(&dev->events) &&
            table_init(&dev->reserves) && table_init(&dev->hosts);
  if (ok) dev->legacy = stream_new(dev);
  if (!ok || !dev->legacy) {
    sim_destroy(&dev->base);
    return gma__set_error(GMA_ERR_DEVICE, "the simulated device cannot be created (host memory or threads ran out)");
  }
  dev->legacy_id = dev->legacy->id;
  *out = &dev->base;
  return GMA_OK;
}

/* ---------------------------------------------------------------------------
 * The test hook (device.h)
 * ------------------------------------------------------------------------- */
void gma__sim_costs_unpriced(gma__device_t *d) {
  if (!is_sim(d)) return;
  sim_of(d)->unpriced = true;
  d->ops = &sim_ops; /* the fake answers capture queries itself */
}

void gma__sim_fault(gma__device_t *d, gma__sim_site_t site, uint64_t nth, gma_status_t status) {
  if (site > GMA__SIM_NSITES || (d && !is_sim(d))) return;
  if (status == GMA_OK) status = GMA_ERR_DEVICE;
  int lo = site == GMA__SIM_NSITES ? 0 : (int)site;
  int hi = site == GMA__SIM_NSITES ? GMA__SIM_NSITES : (int)site + 1;
  if (!d) {
    pthread_mutex_lock(&plan_mu);
    for (int i = lo; i < hi; i++) {
      plan_nth[i] = nth;
      plan_status[i] = status;
    }
    plan_on = !(site == GMA__SIM_NSITES && nth == 0);
    pthread_mutex_unlock(&plan_mu);
    return;
  }
  sim_device_t *dev = sim_of(d);
  for (int i = lo; i < hi; i++) {
    atomic_store_explicit(&dev->site_status[i], (int)status, memory_order_relaxed);
    atomic_store_explicit(&dev->site_nth[i], nth, memory_order_relaxed);
  }
  /* Release pairs with site_fault's acquire. */
  atomic_store_explicit(&dev->counting, true, memory_order_release);
}

uint64_t gma__sim_calls(gma__device_t *d, gma__sim_site_t site) {
  if (site >= GMA__SIM_NSITES) return 0;
  if (!d) {
    pthread_mutex_lock(&plan_mu);
    uint64_t n = last_calls[site];
    pthread_mutex_unlock(&plan_mu);
    return n;
  }
  if (!is_sim(d)) return 0;
  return atomic_load_explicit(&sim_of(d)->site_calls[site], memory_order_relaxed);
}

void gma__sim_live(gma__device_t *d, gma__sim_live_t *out) {
  if (!d) {
    pthread_mutex_lock(&plan_mu);
    *out = last_leftovers;
    pthread_mutex_unlock(&plan_mu);
    return;
  }
  *out = (gma__sim_live_t){0};
  if (!is_sim(d)) return;
  sim_device_t *dev = sim_of(d);
  pthread_mutex_lock(&dev->mem_mu);
  out->device_bytes = dev->used - dev->reserving;
  out->host_bytes = dev->host_bytes;
  out->reservations = dev->reserves.count;
  pthread_mutex_unlock(&dev->mem_mu);
  pthread_mutex_lock(&dev->ev_mu);
  out->events = dev->events.count;
  pthread_mutex_unlock(&dev->ev_mu);
  pthread_mutex_lock(&dev->streams_mu);
  out->streams = dev->user_streams;
  pthread_mutex_unlock(&dev->streams_mu);
}
