/* Private to runtime/device/sim*.c: the simulated device's structures, with
 * their invariants, and the functions its files share. Nothing outside the
 * simulated device includes it (device.h is the boundary).
 *
 * Locks, in base/lock.h's rank order: dev->streams_mu, a stream's mu,
 * dev->ev_mu, dev->mem_mu. A stream thread holds no lock while it runs an op, so a kernel
 * may call into the device. */
#ifndef GMA_DEVICE_SIM_INTERNAL_H
#define GMA_DEVICE_SIM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "device/sim_cost.h"
#include "base/atomics.h"
#include "base/lock.h"

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


/* Any thread holding the table's owner's lock. */
bool gma__sim_table_init(sim_table_t *t);
sim_link_t *gma__sim_table_find(const sim_table_t *t, uintptr_t key);
sim_link_t *gma__sim_table_remove(sim_table_t *t, uintptr_t key);
void gma__sim_table_insert(sim_table_t *t, sim_link_t *l);
sim_link_t *gma__sim_table_pop(sim_table_t *t);

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
  uint64_t handle; /* vm: the handle of the physical memory mapped here */
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

typedef enum sim_op_kind { SIM_OP_KERNEL, SIM_OP_RECORD, SIM_OP_WAIT, SIM_OP_WRITE } sim_op_kind_t;

/* A queued op. RECORD and WAIT hold a reference on mark until they have run. */
typedef struct sim_op {
  struct sim_op *next;
  sim_op_kind_t kind;
  gma_sim_kernel_fn fn; /* KERNEL */
  void *arg;            /* KERNEL */
  sim_mark_t *mark;     /* RECORD: the mark it completes; WAIT: the one it awaits */
  _Atomic uint64_t *word; /* WRITE: where value goes (host memory) */
  uint64_t value;         /* WRITE */
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
  /* Kernels queued or running on any stream (the cost model's busy
   * device); relaxed: a price needs no ordering with the work itself. */
  _Atomic uint64_t kernels;
  /* Per-site fault injection (gma__sim_fault). counting goes from false to
   * true only; its release store (sim_create, gma__sim_fault) pairs with the
   * acquire load in gma__sim_site_fault, which then sees the settings made before it.
   * Settings changed later are relaxed: a racing call may miss them. */
  _Atomic bool counting;
  _Atomic uint64_t site_calls[GMA__SIM_NSITES]; /* tickets, relaxed */
  _Atomic uint64_t site_nth[GMA__SIM_NSITES];   /* 0: not armed */
  _Atomic int site_status[GMA__SIM_NSITES];
  /* Invariant: used = sum of sizes in allocs and kept + reserving <=
   * capacity; host_bytes = sum of sizes in hosts (host memory is not
   * capacity); a handle names one physical allocation, mapped (in allocs)
   * or kept, never both. */
  pthread_mutex_t mem_mu;
  sim_table_t allocs; /* mem_mu */
  sim_table_t kept;   /* mem_mu: unmapped physical memory (vm_unmap_keep) by handle */
  uint64_t next_handle; /* mem_mu: the last handle handed out */
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

static inline sim_device_t *sim_of(gma__device_t *d) { return (sim_device_t *)d; }

/* sim.c */
bool gma__sim_fault_fires(_Atomic uint64_t *calls, uint64_t n, uint64_t *ticket);
gma_status_t gma__sim_event_fault(sim_device_t *dev, const char *what);
gma_status_t gma__sim_site_fault(sim_device_t *dev, gma__sim_site_t site);

/* sim_memory.c */
gma_status_t gma__sim_mem_alloc(gma__device_t *d, uint64_t size, uintptr_t *out);
gma_status_t gma__sim_mem_free(gma__device_t *d, uintptr_t addr, uint64_t size);
gma_status_t gma__sim_mem_info(gma__device_t *d, uint64_t *free_bytes, uint64_t *total_bytes);
gma_status_t gma__sim_vm_granularity(gma__device_t *d, uint64_t *bytes);
gma_status_t gma__sim_vm_reserve(gma__device_t *d, uint64_t size, uintptr_t *out);
gma_status_t gma__sim_vm_release(gma__device_t *d, uintptr_t addr, uint64_t size);
gma_status_t gma__sim_vm_map(gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t *handle);
gma_status_t gma__sim_vm_unmap(gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t handle);
gma_status_t gma__sim_vm_unmap_keep(gma__device_t *d, uintptr_t addr, uint64_t size,
                                    uint64_t handle);
gma_status_t gma__sim_vm_map_kept(gma__device_t *d, uintptr_t addr, uint64_t size,
                                  uint64_t handle);
gma_status_t gma__sim_vm_free_kept(gma__device_t *d, uint64_t handle, uint64_t size);
gma_status_t gma__sim_host_alloc(gma__device_t *d, uint64_t size, void **host, uintptr_t *dev_addr);
gma_status_t gma__sim_host_free(gma__device_t *d, void *host, uint64_t size);
void gma__sim_release_memory(sim_device_t *dev);

/* sim_event.c */
void gma__sim_mark_unref(sim_mark_t *m);
sim_event_t *gma__sim_event_find(sim_device_t *dev, gma__event_t h);
gma_status_t gma__sim_event_create(gma__device_t *d, gma__event_t *out);
gma_status_t gma__sim_event_destroy(gma__device_t *d, gma__event_t h);
gma_status_t gma__sim_event_query(gma__device_t *d, gma__event_t h, bool *done);
gma_status_t gma__sim_event_synchronize(gma__device_t *d, gma__event_t h);

/* sim_stream.c */
sim_stream_t *gma__sim_stream_new(sim_device_t *dev);
void gma__sim_stream_stop(sim_stream_t *s);
gma_status_t gma__sim_device_wait_all(sim_device_t *dev);
gma_status_t gma__sim_event_record(gma__device_t *d, gma__event_t ev, gma_stream_t stream);
gma_status_t gma__sim_stream_write_value(gma__device_t *d, gma_stream_t stream, uintptr_t dev_addr,
                                         uint64_t value);
gma_status_t gma__sim_stream_wait_event(gma__device_t *d, gma_stream_t stream, gma__event_t ev);
gma_status_t gma__sim_stream_wait_stream(gma__device_t *d, gma_stream_t waiter, gma_stream_t waitee);
gma_status_t gma__sim_launch(gma__device_t *d, gma_stream_t stream, gma_sim_kernel_fn fn, void *arg);
gma_status_t gma__sim_stream_create(gma__device_t *d, gma_stream_t *out);
gma_status_t gma__sim_stream_destroy(gma__device_t *d, gma_stream_t h);
gma_status_t gma__sim_stream_id(gma__device_t *d, gma_stream_t h, uint64_t *id);
gma_status_t gma__sim_stream_synchronize(gma__device_t *d, gma_stream_t h);
gma_status_t gma__sim_device_synchronize(gma__device_t *d);

/* Takes the host time op on bytes costs under the cost preset; nothing
 * without one. Any thread. */
static inline void sim_pay(const sim_device_t *dev, gma__sim_cost_op_t op, uint64_t bytes) {
  if (dev->costs && !dev->unpriced) gma__sim_cost_pay(dev->costs, op, bytes);
}

/* The same for a device memory call: priced at the device's fill (used
 * bytes plus `adding`, over the capacity) and whether a kernel is queued or
 * running. Any thread; takes mem_mu briefly, so not under it. */
static inline void sim_pay_mem(sim_device_t *dev, gma__sim_cost_op_t op, uint64_t bytes,
                               uint64_t adding) {
  if (!dev->costs || dev->unpriced) return;
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  uint64_t used = dev->used;
  gma__unlock(&dev->mem_mu);
  gma__sim_load_t load = {dev->capacity ? (double)(used + adding) / (double)dev->capacity : 0.0,
                          gma__load_relaxed(&dev->kernels) > 0};
  gma__sim_cost_pay_at(dev->costs, op, bytes, load);
}

/* Under a preset whose frees wait for the device (cuMemFree,
 * cuMemHostAlloc and cuMemFreeHost do): waits until every stream has run
 * the work queued on it, the calling stream's own thread excepted. */
static inline void sim_wait_device(sim_device_t *dev) {
  if (dev->costs && dev->costs->free_waits) (void)gma__sim_device_wait_all(dev);
}


#endif
