/* The simulated device: owns its host memory (device allocations), its
 * simulated streams (one host thread each, executing queued kernels, event
 * records and event waits strictly in order), the stream handle slots, its
 * events, and the latency and fault-injection knobs from the sim_* config
 * fields.
 *
 * Its files, one job each: sim.c (this one: the hash table they share, latency and
 * fault injection, creation, destruction, fork's forget, the ops table and
 * the test hooks), sim_memory.c (device memory, address reservations and
 * mappings, pinned host memory), sim_event.c (events and their marks),
 * sim_stream.c (streams, their threads and queued ops, the handle slots),
 * sim_cost.c (the GPU cost presets) and sim_internal.h (the structures they
 * share, with their invariants and the lock order).
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
 */
#include <errno.h>
#include <time.h>

#include "device/sim_internal.h"
#include "base/lock.h"

/* ---------------------------------------------------------------------------
 * An intrusive chained hash table from uintptr_t keys to links embedded as the
 * first member of the owning struct. Not thread-safe: the owner's lock guards it.
 * Invariant: count = number of links reachable from buckets; mask + 1 is a
 * power of two.
 * ------------------------------------------------------------------------- */
/* Addresses are aligned and thread ids alike, so low bits need mixing in. */
static size_t sim_hash(uintptr_t k) {
  uint64_t x = ((uint64_t)k ^ ((uint64_t)k >> 33)) * 0xff51afd7ed558ccdull;
  return (size_t)(x ^ (x >> 33));
}

bool gma__sim_table_init(sim_table_t *t) {
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

sim_link_t *gma__sim_table_find(const sim_table_t *t, uintptr_t key) { return *table_slot(t, key); }

sim_link_t *gma__sim_table_remove(sim_table_t *t, uintptr_t key) {
  sim_link_t **p = table_slot(t, key), *l = *p;
  if (l) {
    *p = l->next;
    t->count--;
  }
  return l;
}

/* Inserts a link whose key is not in the table yet. Growing is best effort:
 * if memory for a bigger bucket array is lacking, chains just get longer. */
void gma__sim_table_insert(sim_table_t *t, sim_link_t *l) {
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
sim_link_t *gma__sim_table_pop(sim_table_t *t) {
  for (size_t i = 0; t->buckets && i <= t->mask; i++) {
    if (t->buckets[i]) return gma__sim_table_remove(t, t->buckets[i]->key);
  }
  return NULL;
}

/* Hands out device serial numbers; relaxed is enough, each only needs a unique ticket. */
static _Atomic uint64_t sim_next_serial = 1;

/* True for exactly one call: the one whose ticket is the configured N.
 * Any thread; wait-free. */
bool gma__sim_fault_fires(_Atomic uint64_t *calls, uint64_t n, uint64_t *ticket) {
  *ticket = gma__faa_relaxed(calls, 1) + 1;
  return n != 0 && *ticket == n;
}

/* Counts one event call and fails it if it is the configured one. Any thread. */
gma_status_t gma__sim_event_fault(sim_device_t *dev, const char *what) {
  uint64_t t;
  if (!gma__sim_fault_fires(&dev->event_calls, dev->fail_event, &t)) return GMA_OK;
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
gma_status_t gma__sim_site_fault(sim_device_t *dev, gma__sim_site_t site) {
  /* Acquire pairs with the release stores of counting. */
  if (!gma__load_acquire(&dev->counting)) return GMA_OK;
  uint64_t n = gma__load_relaxed(&dev->site_nth[site]), t;
  bool sticky = n & GMA__SIM_STICKY;
  n &= ~GMA__SIM_STICKY;
  if (!gma__sim_fault_fires(&dev->site_calls[site], n, &t) && !(sticky && n && t >= n)) return GMA_OK;
  gma_status_t st = (gma_status_t)gma__load_relaxed(&dev->site_status[site]);
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
  gma__lock(&plan_mu, GMA__RANK_SIM_PLAN);
  last_leftovers = left;
  for (int i = 0; i < GMA__SIM_NSITES; i++)
    last_calls[i] = gma__load_relaxed(&dev->site_calls[i]);
  gma__unlock(&plan_mu);
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  /* The per-thread streams are dropped from the table while still alive; the
   * table's links live in the streams, which free themselves below. */
  while (gma__sim_table_pop(&dev->ptds)) {
  }
  for (sim_stream_t *s = dev->all; s; s = s->all_next) gma__sim_stream_stop(s);
  while (dev->threads > 0) pthread_cond_wait(&dev->streams_cv, &dev->streams_mu);
  SIM_ASSERT(dev->all == NULL);
  gma__unlock(&dev->streams_mu);
  for (sim_chunk_t *c = gma__load_relaxed(&dev->chunks), *next; c;
       c = next) {
    next = c->next;
    free(c);
  }
  /* Every queued op has run, so each remaining mark is held by its event only. */
  sim_link_t *l;
  while ((l = gma__sim_table_pop(&dev->events))) {
    gma__sim_mark_unref(((sim_event_t *)l)->last);
    free(l);
  }
  gma__sim_release_memory(dev);
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
  if (gma__trylock(&dev->mem_mu, GMA__RANK_SIM_MEM)) {
    gma__sim_release_memory(dev);
    gma__unlock(&dev->mem_mu);
  }
  bool ev = gma__trylock(&dev->ev_mu, GMA__RANK_SIM_EVENTS); /* marks of queued ops may be freed */
  if (gma__trylock(&dev->streams_mu, GMA__RANK_SIM_STREAMS)) {
    for (sim_stream_t *s = dev->all, *next; s; s = next) {
      next = s->all_next;
      if (!gma__trylock(&s->mu, GMA__RANK_SIM_STREAM)) continue; /* its queue was changing: leaked */
      if (s->running) s->running->next = s->head; /* its thread was running it: ours now */
      for (sim_op_t *op = s->running ? s->running : s->head, *onext; op; op = onext) {
        onext = op->next;
        if (ev) gma__sim_mark_unref(op->mark);
        free(op);
      }
      gma__unlock(&s->mu);
      free(s);
    }
    for (sim_chunk_t *c = gma__load_relaxed(&dev->chunks), *next; c;
         c = next) {
      next = c->next;
      free(c);
    }
    free(dev->ptds.buckets); /* its links are in the streams */
    gma__unlock(&dev->streams_mu);
  }
  if (ev) {
    while ((l = gma__sim_table_pop(&dev->events))) {
      gma__sim_mark_unref(((sim_event_t *)l)->last);
      free(l);
    }
    free(dev->events.buckets);
    gma__unlock(&dev->ev_mu);
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
    .mem_alloc = gma__sim_mem_alloc, \
    .mem_free = gma__sim_mem_free, \
    .mem_info = gma__sim_mem_info, \
    .event_create = gma__sim_event_create, \
    .event_destroy = gma__sim_event_destroy, \
    .event_record = gma__sim_event_record, \
    .event_query = gma__sim_event_query, \
    .event_synchronize = gma__sim_event_synchronize, \
    .stream_wait_event = gma__sim_stream_wait_event, \
    .stream_wait_stream = gma__sim_stream_wait_stream, \
    .stream_create = gma__sim_stream_create, \
    .stream_destroy = gma__sim_stream_destroy, \
    .stream_id = gma__sim_stream_id, \
    .stream_synchronize = gma__sim_stream_synchronize, \
    .device_synchronize = gma__sim_device_synchronize, \
    .stream_write_value = gma__sim_stream_write_value, \
    .vm_granularity = gma__sim_vm_granularity, \
    .vm_reserve = gma__sim_vm_reserve, \
    .vm_release = gma__sim_vm_release, \
    .vm_map = gma__sim_vm_map, \
    .vm_unmap = gma__sim_vm_unmap, \
    .vm_unmap_keep = gma__sim_vm_unmap_keep, \
    .vm_map_kept = gma__sim_vm_map_kept, \
    .vm_free_kept = gma__sim_vm_free_kept, \
    .host_alloc = gma__sim_host_alloc, \
    .host_free = gma__sim_host_free, \
    .sim_launch = gma__sim_launch, \
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
  dev->serial = gma__faa_relaxed(&sim_next_serial, 1);
  gma__atomic_init(&dev->alloc_calls, 0);
  gma__atomic_init(&dev->event_calls, 0);
  gma__lock(&plan_mu, GMA__RANK_SIM_PLAN); /* the plan for devices created from now on */
  for (int i = 0; i < GMA__SIM_NSITES; i++) {
    gma__atomic_init(&dev->site_calls[i], 0);
    gma__atomic_init(&dev->site_nth[i], plan_nth[i]);
    gma__atomic_init(&dev->site_status[i], (int)plan_status[i]);
  }
  /* Release pairs with gma__sim_site_fault's acquire (the settings above before it). */
  gma__store_release(&dev->counting, plan_on);
  gma__unlock(&plan_mu);
  gma__atomic_init(&dev->chunks, NULL);
  pthread_mutex_init(&dev->mem_mu, NULL);
  pthread_mutex_init(&dev->streams_mu, NULL);
  pthread_cond_init(&dev->streams_cv, NULL);
  pthread_mutex_init(&dev->ev_mu, NULL);
  pthread_cond_init(&dev->ev_cv, NULL);
  bool ok = gma__sim_table_init(&dev->allocs) && gma__sim_table_init(&dev->ptds) && gma__sim_table_init(&dev->events) &&
            gma__sim_table_init(&dev->reserves) && gma__sim_table_init(&dev->hosts) &&
            gma__sim_table_init(&dev->kept);
  if (ok) dev->legacy = gma__sim_stream_new(dev);
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
    gma__lock(&plan_mu, GMA__RANK_SIM_PLAN);
    for (int i = lo; i < hi; i++) {
      plan_nth[i] = nth;
      plan_status[i] = status;
    }
    plan_on = !(site == GMA__SIM_NSITES && nth == 0);
    gma__unlock(&plan_mu);
    return;
  }
  sim_device_t *dev = sim_of(d);
  for (int i = lo; i < hi; i++) {
    gma__store_relaxed(&dev->site_status[i], (int)status);
    gma__store_relaxed(&dev->site_nth[i], nth);
  }
  /* Release pairs with gma__sim_site_fault's acquire. */
  gma__store_release(&dev->counting, true);
}

uint64_t gma__sim_calls(gma__device_t *d, gma__sim_site_t site) {
  if (site >= GMA__SIM_NSITES) return 0;
  if (!d) {
    gma__lock(&plan_mu, GMA__RANK_SIM_PLAN);
    uint64_t n = last_calls[site];
    gma__unlock(&plan_mu);
    return n;
  }
  if (!is_sim(d)) return 0;
  return gma__load_relaxed(&sim_of(d)->site_calls[site]);
}

void gma__sim_live(gma__device_t *d, gma__sim_live_t *out) {
  if (!d) {
    gma__lock(&plan_mu, GMA__RANK_SIM_PLAN);
    *out = last_leftovers;
    gma__unlock(&plan_mu);
    return;
  }
  *out = (gma__sim_live_t){0};
  if (!is_sim(d)) return;
  sim_device_t *dev = sim_of(d);
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  out->device_bytes = dev->used - dev->reserving;
  out->host_bytes = dev->host_bytes;
  out->reservations = dev->reserves.count;
  gma__unlock(&dev->mem_mu);
  gma__lock(&dev->ev_mu, GMA__RANK_SIM_EVENTS);
  out->events = dev->events.count;
  gma__unlock(&dev->ev_mu);
  gma__lock(&dev->streams_mu, GMA__RANK_SIM_STREAMS);
  out->streams = dev->user_streams;
  gma__unlock(&dev->streams_mu);
}
