/* Owns the public entry points: argument checks, clear error messages, the
 * allocator object, device selection, and routing each call to its owner. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/allocator.h"
#include "base/lock.h"
#include "base/config.h"

#define CHECK_ARG(cond, ...) \
  do {                       \
    if (!(cond)) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

/* device:auto falls back to the simulated device when CUDA has no device to
 * offer (no driver, no GPU, or a build without the backend), and says so once
 * per process on stderr so nobody mistakes simulated figures for GPU ones. */
static void note_fallback(void) {
  static _Atomic bool said;
  /* Relaxed: the flag only picks the one caller that prints; it publishes nothing. */
  if (gma__exchange_relaxed(&said, true)) return;
  fprintf(stderr, "gma: no CUDA device (%s); device:auto uses the simulated device\n",
          gma__error_detail(gma_last_error()));
}

static gma_status_t open_device(const gma_config_t *cfg, gma__device_t **out) {
  gma_status_t st;
  switch (cfg->device) {
    case GMA_DEVICE_CUDA:
      return gma__cuda_create(cfg, out);
    case GMA_DEVICE_AUTO:
      st = gma__cuda_create(cfg, out);
      if (st != GMA_ERR_NO_DEVICE) return st;
      note_fallback();
      return gma__sim_create(cfg, out);
    case GMA_DEVICE_SIM:
      return gma__sim_create(cfg, out);
  }
  return gma__set_error(GMA_ERR_CONFIG, "unknown device kind %d", (int)cfg->device);
}

gma_status_t gma_device_count(int *count) {
  CHECK_ARG(count, "gma_device_count: count is NULL");
  gma_status_t st = gma__cuda_device_count(count);
  if (st == GMA_OK && *count == 0)
    return gma__set_error(GMA_ERR_NO_DEVICE, "the CUDA driver reports no device");
  return st;
}

gma_status_t gma_select_device(size_t size, int *device) {
  CHECK_ARG(device, "gma_select_device: device is NULL");
  *device = -1;
  int n = 0;
  gma_status_t st = gma_device_count(&n);
  if (st != GMA_OK) return st;
  uint64_t best_free = 0, most_free = 0;
  for (int i = 0; i < n; i++) {
    uint64_t f = 0, t = 0;
    if ((st = gma__cuda_device_mem(i, &f, &t)) != GMA_OK) return st;
    if (f > most_free) most_free = f;
    if (f >= size && (*device < 0 || f > best_free)) {
      *device = i;
      best_free = f;
    }
  }
  if (*device < 0)
    return gma__set_error(GMA_ERR_OOM,
                          "gma_select_device: none of the %d CUDA devices has %zu bytes free "
                          "(the most free is %" PRIu64 ")",
                          n, size, most_free);
  return GMA_OK;
}

/* The worker's tick hooks (worker.h): an idle plan's arena is cache, unused
 * for idle_ms or outside the working set under pressure, and goes back to
 * the pool before the pool's release; the host pool trims after it. */
static void worker_reclaim(void *arg, uint64_t unused_ns) {
  gma_t *g = arg;
  if (g->cfg.plan) gma__plan_reclaim_timed(&g->plan, unused_ns);
}

static void worker_after(void *arg, int level) {
  gma_t *g = arg;
  gma__host_trim(&g->host, level == GMA_PRESSURE_CRITICAL ? 0 : g->cfg.host_release_threshold);
}

gma_status_t gma_create(const gma_config_t *config, gma_t **out) {
  CHECK_ARG(out, "gma_create: out is NULL");
  *out = NULL;
  gma_t *g = calloc(1, sizeof *g);
  if (!g) return gma__set_error(GMA_ERR_OOM, "gma_create: no host memory for the allocator");
  g->magic = GMA__MAGIC_LIVE; /* gma_create's own calls (gma_trace_start) check it */
  gma__oom_observer_init(&g->oom);
  gma_status_t st = gma__config_resolve(config, &g->cfg);
  if (st == GMA_OK) st = open_device(&g->cfg, &g->dev);
  if (st != GMA_OK) {
    gma__oom_observer_fini(&g->oom);
    free(g);
    return st;
  }
  uint64_t dev_free = 0, dev_total = 0;
  st = g->dev->ops->mem_info(g->dev, &dev_free, &dev_total);
  if (st == GMA_OK) {
    if (!g->cfg.memory_limit || g->cfg.memory_limit > dev_total) g->cfg.memory_limit = dev_total;
    st = gma__pool_init(&g->pool, g->dev, &g->cfg);
  }
  if (st == GMA_OK && (st = gma__host_init(&g->host, g->dev)) != GMA_OK) gma__pool_fini(&g->pool);
  if (st == GMA_OK && (st = gma__plan_init(&g->plan, &g->pool, &g->worker, &g->cfg)) != GMA_OK) {
    uint64_t n, bytes;
    gma__host_fini(&g->host, &n, &bytes);
    gma__pool_fini(&g->pool);
  }
  bool started = st == GMA_OK; /* pool, host pool and planner exist */
  if (started) gma__graphs_init(&g->graphs, &g->pool, g->dev);
  if (st == GMA_OK && g->cfg.trace_path[0]) st = gma_trace_start(g, g->cfg.trace_path);
  gma__worker_hooks_t hooks = {worker_reclaim, worker_after, g};
  if (st == GMA_OK) st = gma__futures_start(g, &hooks);
  if (st != GMA_OK && started) {
    uint64_t n, bytes;
    gma__trace_t *traces = g->pool.traces;
    gma__plan_release(&g->plan, &bytes);
    gma__host_fini(&g->host, &n, &bytes);
    gma__pool_fini(&g->pool);
    gma__plan_fini(&g->plan);
    gma__graphs_fini(&g->graphs, &n, &bytes);
    gma__trace_free(traces);
  }
  if (st != GMA_OK) {
    g->dev->ops->destroy(g->dev);
    gma__oom_observer_fini(&g->oom);
    free(g);
    return st;
  }
  gma__fork_register(g); /* a child of fork() must know it was inherited */
  *out = g;
  return GMA_OK;
}

gma_status_t gma_abandon(gma_t *g) {
  if (!g) return GMA_OK;
  if (g->magic == GMA__MAGIC_FORKED) return gma__fork_destroy(g);
  GMA__CHECK(g, "gma_abandon");
  gma__fork_unregister(g);
  gma__futures_stop(g); /* no tick may touch the device after this */
  gma_status_t st = gma_trace_stop(g); /* the file is complete */
  /* Everything else stays: the device, its memory and every record, so
   * device work still running keeps valid memory until the process exits. */
  g->magic = GMA__MAGIC_ABANDONED;
  return st;
}

/* Destroyed allocators' structs, kept so a stale handle fails cleanly (see
 * allocator.h): the last DEAD_KEPT of them; older ones are freed, so a
 * program that creates and destroys allocators in a loop stays bounded
 * (each is about 55 KiB; the fuzzer found the unbounded list growing). */
#define DEAD_KEPT 64
static pthread_mutex_t dead_mu = PTHREAD_MUTEX_INITIALIZER;
static gma_t *dead_list; /* newest first */
static size_t dead_count;

gma_status_t gma_destroy(gma_t *g) {
  if (!g) return GMA_OK;
  /* A copy inherited across fork(): its threads do not exist here (fork.c). */
  if (g->magic == GMA__MAGIC_FORKED) return gma__fork_destroy(g);
  GMA__CHECK(g, "gma_destroy");
  gma__fork_unregister(g);
  gma__futures_stop(g); /* first: it touches the pool */
  /* Device work may still use cached blocks; let it finish before the memory
   * goes back, so the device never touches memory it no longer owns. */
  g->dev->ops->device_synchronize(g->dev);
  /* Graph pools and planned memory first: their chunks and arenas are live
   * blocks to the pool. */
  uint64_t graph_leaks, graph_leaked;
  gma__graphs_fini(&g->graphs, &graph_leaks, &graph_leaked);
  if (graph_leaks)
    fprintf(stderr, "gma: leak report at gma_destroy: %" PRIu64 " live allocations of graph "
                    "pools (%" PRIu64 " bytes) were never freed\n", graph_leaks, graph_leaked);
  uint64_t plan_leaked, plan_leaks = gma__plan_release(&g->plan, &plan_leaked);
  if (plan_leaks)
    fprintf(stderr, "gma: leak report at gma_destroy: %" PRIu64 " live planned allocations (%"
                    PRIu64 " bytes, plan:on) were never freed\n", plan_leaks, plan_leaked);
  /* The leak report: what was never freed, by tag, the oldest first. */
  char report[4096];
  gma_status_t rst = gma_live_report(g, 10, report, sizeof report);
  if ((rst == GMA_OK || rst == GMA_ERR_INVALID_SIZE) && strncmp(report, "0 live", 6) != 0)
    fprintf(stderr, "gma: leak report at gma_destroy: %s", report);
  gma__trace_t *traces = g->pool.traces; /* recording until the pool is gone */
  uint64_t host_leaks, host_leaked;
  gma__host_fini(&g->host, &host_leaks, &host_leaked);
  gma_status_t st = gma__pool_fini(&g->pool);
  gma__plan_fini(&g->plan);
  /* A planned allocation never freed is a leak as any other (its arena went
   * back to the pool above, so the pool saw none). */
  if (graph_leaks && st == GMA_OK)
    st = gma__set_error(GMA_ERR_LEAK, "gma_destroy: %" PRIu64 " live allocations of graph pools (%"
                        PRIu64 " bytes) were never freed; gma freed them",
                        graph_leaks, graph_leaked);
  if (plan_leaks && st == GMA_OK)
    st = gma__set_error(GMA_ERR_LEAK, "gma_destroy: %" PRIu64 " live planned allocations (%" PRIu64
                        " bytes, plan:on) were never freed; gma freed them",
                        plan_leaks, plan_leaked);
  gma__trace_free(traces);
  if (host_leaks) {
    fprintf(stderr, "gma: destroyed with %" PRIu64 " live host allocations (%" PRIu64
                    " bytes, pinned or CPU fallback); freed\n", host_leaks, host_leaked);
    if (st == GMA_OK)
      st = gma__set_error(GMA_ERR_LEAK, "gma_destroy: %" PRIu64 " live host allocations (%" PRIu64
                          " bytes) were never freed; gma freed them", host_leaks, host_leaked);
  }
  g->dev->ops->destroy(g->dev);
  gma__oom_observer_fini(&g->oom);
  g->magic = GMA__MAGIC_DEAD; /* the rest of the struct is dead memory now */
  gma_t *oldest = NULL;
  gma__lock(&dead_mu, GMA__RANK_DEAD);
  g->next_dead = dead_list;
  dead_list = g;
  if (++dead_count > DEAD_KEPT) { /* drop the oldest: walk to the last */
    gma_t **pp = &dead_list;
    while ((*pp)->next_dead) pp = &(*pp)->next_dead;
    oldest = *pp;
    *pp = NULL;
    dead_count--;
  }
  gma__unlock(&dead_mu);
  free(oldest);
  return st;
}

const char *gma_device_name(const gma_t *g) {
  return g && g->magic == GMA__MAGIC_LIVE ? g->dev->name : "none";
}

static gma_status_t alloc_now(gma_t *g, size_t size, gma_stream_t stream, unsigned flags,
                              bool *pooled, void **out);
static gma_status_t alloc_fallback(gma_t *g, size_t size, gma_stream_t stream, bool count,
                                   void **out);
static gma_status_t free_now(gma_t *g, void *ptr);

/* What trace rows say of the live allocation starting at ptr: its block
 * size, the bytes asked for and its stream, from the layer that holds it
 * (a graph pool, the plan, the pool, the host pool for a CPU fallback);
 * zeros when ptr is none. */
typedef struct live_facts {
  uint64_t block, requested;
  uintptr_t stream;
} live_facts_t;


static live_facts_t live_facts(gma_t *g, void *ptr) {
  live_facts_t f = {0, 0, 0};
  if (!ptr) return f;
  gma_pointer_info_t r = GMA_POINTER_INFO_INIT;
  int found = gma__graph_info(&g->graphs, ptr, &r);
  if (!found && g->cfg.plan) found = gma__plan_info(&g->plan, ptr, &r);
  if (found > 0 && r.base == ptr) {
    f = (live_facts_t){r.block_size, r.requested, (uintptr_t)r.stream};
  } else if (!found) { /* the pool's own block; an arena is no caller's allocation */
    gma_stream_t stream = NULL;
    if (gma__pool_block_facts(&g->pool, ptr, &f.block, &f.requested, &stream))
      f.stream = (uintptr_t)stream;
    else if (!gma__pagemap_get(&g->pool.pagemap, (uintptr_t)ptr) && g->cfg.fallback_host &&
             gma__host_pointer_info(&g->host, &g->pool, ptr, &r) &&
             r.kind == GMA_MEMORY_FALLBACK && r.base == ptr)
      f = (live_facts_t){r.block_size, r.requested, (uintptr_t)r.stream};
  }
  return f;
}

/* One try of gma_alloc; an OOM is counted when count. fallback:host: the
 * pool's OOM is neither said nor counted unless the fallback fails too. */
static gma_status_t alloc_once(gma_t *g, size_t size, gma_stream_t stream, bool count,
                               bool *pooled, void **out) {
  bool fallback = g->cfg.fallback_host;
  unsigned kept = fallback ? gma__error_keep() : 0;
  unsigned flags = fallback || !count ? GMA__ALLOC_UNCOUNTED : 0;
  gma_status_t st = alloc_now(g, size, stream, flags, pooled, out);
  if (fallback) {
    if (st == GMA_ERR_OOM && *pooled) st = alloc_fallback(g, size, stream, count, out);
    gma__error_done(kept, st);
  }
  return st;
}

gma_status_t gma_alloc(gma_t *g, size_t size, gma_stream_t stream, void **out) {
  GMA__CHECK(g, "gma_alloc");
  stream = gma__stream_arg(g, stream);
  CHECK_ARG(out, "gma_alloc: out is NULL");
  /* One load on the hot path; the observer file only when one is set. */
  bool observed = gma__load_relaxed(&g->oom.armed) && gma__oom_observed(g), pooled;
  unsigned kept = observed ? gma__error_keep() : 0;
  gma_status_t st = alloc_once(g, size, stream, !observed, &pooled, out);
  if (observed) { /* the observer's answer decides; the OOM counted once */
    if (st == GMA_ERR_OOM && pooled && gma__oom_observe(g, size, stream))
      st = alloc_once(g, size, stream, true, &pooled, out);
    else if (st == GMA_ERR_OOM && pooled)
      gma__pool_oom_count(&g->pool, size, stream);
    gma__error_done(kept, st);
  }
  gma__trace_t *t = gma__trace_on(&g->pool.trace);
  if (t) /* stamped after the allocation: its pointer exists from now on */
    gma__trace_emit(t, gma__trace_now(), st == GMA_OK ? GMA__TR_ALLOCATE : GMA__TR_ALLOCATE_FAILURE,
                    (uintptr_t)*out, size, (uintptr_t)stream, live_facts(g, *out).block, 0, 0, st);
  return st;
}

/* fallback:host: device memory is exhausted even after releasing cache and
 * retrying; serve from pinned host memory the device can reach. */
static gma_status_t alloc_fallback(gma_t *g, size_t size, gma_stream_t stream, bool count,
                                   void **out) {
  char why[512];
  snprintf(why, sizeof why, "%s", gma__error_detail(gma_last_error()));
  gma_status_t st = gma__host_alloc(&g->host, size, stream, true, out);
  if (st == GMA_OK) return GMA_OK;
  if (count) gma__pool_oom_count(&g->pool, size, stream); /* the call fails: one OOM */
  return gma__set_error(GMA_ERR_OOM, "%s; the CPU fallback (fallback:host) failed too: %s", why,
                        gma__error_detail(gma_last_error()));
}

static gma_status_t alloc_pool(gma_t *g, size_t size, gma_stream_t stream, unsigned flags,
                               void **out);
static gma_status_t alloc_pool_or_arena(gma_t *g, size_t size, gma_stream_t stream,
                                        unsigned flags, void **out);

/* flags: extra GMA__ALLOC_ flags for the pool (GMA__ALLOC_UNCOUNTED); *pooled:
 * false when a capture's graph pool answered instead of the pool. */
static gma_status_t alloc_now(gma_t *g, size_t size, gma_stream_t stream, unsigned flags,
                              bool *pooled, void **out) {
  *out = NULL;
  *pooled = true;
  if (size == 0)
    return gma__set_error(GMA_ERR_INVALID_SIZE, "gma_alloc: size is 0; ask for 1 byte or more");
  if (size > g->cfg.memory_limit)
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "gma_alloc: %zu bytes is more than this allocator can ever hold "
                          "(memory_limit / device capacity %" PRIu64 " bytes)",
                          size, g->cfg.memory_limit);
  /* A capture gma was told of: its stream's requests come from its graph
   * pool (one load while none is underway). */
  if (gma__load_relaxed(&g->graphs.capturing)) {
    gma_status_t gst = gma__graph_alloc(&g->graphs, 1, NULL, size, stream, out);
    if (gst != GMA_PENDING) {
      *pooled = false; /* the graph pool's answer (an OOM there is counted there) */
      return gst;
    }
  }
  if (!g->cfg.plan) return alloc_pool(g, size, stream, flags, out);
  /* plan:on: the plan's address if it has one (lock-free), else the pool;
   * what the pool served is learned while a plan is being learned. */
  if (gma__plan_alloc(&g->plan, size, stream, out) == GMA_OK) return GMA_OK;
  gma_status_t st = alloc_pool_or_arena(g, size, stream, flags, out);
  if (st == GMA_OK) gma__plan_note_alloc(&g->plan, *out, size, stream);
  return st;
}

/* The pool's memory, and before an OOM an idle plan's arena too: it is
 * cache like any other, so the plan is dropped and the pool tries again.
 * The pool tries again too when the arena went back meanwhile (the
 * worker's timed trim gives an idle one back at any time). The first try's
 * OOM is counted only when no arena could go back. */
static gma_status_t alloc_pool_or_arena(gma_t *g, size_t size, gma_stream_t stream,
                                        unsigned flags, void **out) {
  if (!gma__plan_holds_arena(&g->plan)) return alloc_pool(g, size, stream, flags, out);
  gma_status_t st = alloc_pool(g, size, stream, flags | GMA__ALLOC_UNCOUNTED, out);
  if (st != GMA_ERR_OOM) return st;
  if (gma__plan_reclaim(&g->plan, 0) || !gma__plan_holds_arena(&g->plan))
    return alloc_pool(g, size, stream, flags, out);
  if (!(flags & GMA__ALLOC_UNCOUNTED)) gma__pool_oom_count(&g->pool, size, stream);
  return st;
}

static gma_status_t alloc_pool(gma_t *g, size_t size, gma_stream_t stream, unsigned flags,
                               void **out) {
  /* A bin hit through this thread's stream cache: no lock and no device
   * call (stream_cache.c; it relies on streams being retired before they
   * are destroyed). */
  bool binnable = size <= g->pool.bin_max;
  if (binnable && gma__bin_alloc_cached(&g->pool, size, stream, out) == GMA_OK) return GMA_OK;
  /* Otherwise the stream's id, from the same cache when it holds the
   * stream (no device call), else from the device, which tells a recycled
   * handle from the stream it used to name; asked once, for the bin (which
   * caches the record) and, on a miss, the pool. */
  uint64_t id;
  gma_status_t st = gma__stream_id(&g->pool, stream, &id);
  if (st != GMA_OK) return st;
  if (binnable && gma__bin_alloc(&g->pool, size, stream, id, out) == GMA_OK) return GMA_OK;
  return gma__pool_alloc_slow(&g->pool, size, stream, id, GMA__ALLOC_WAIT | flags, out);
}

gma_status_t gma_free(gma_t *g, void *ptr) {
  GMA__CHECK(g, "gma_free");
  if (!ptr) return GMA_OK; /* like free(NULL) and cudaFree(NULL) */
  gma__trace_t *t = gma__trace_on(&g->pool.trace);
  uint64_t t_ns = 0;
  live_facts_t f = {0, 0, 0};
  if (t) {
    /* Stamped before the free: once freed, the block may be handed out again
     * (and recorded) by another thread. Read while the block is still ours. */
    t_ns = gma__trace_now();
    f = live_facts(g, ptr);
  }
  gma_status_t st = free_now(g, ptr);
  if (t)
    gma__trace_emit(t, t_ns, GMA__TR_FREE, (uintptr_t)ptr, f.requested, f.stream, f.block, 0, 0, st);
  return st;
}

/* Says what a pointer that is not device memory of g is, when it is host
 * memory of g: gma_free was given pinned host memory (the message
 * said it was not gma's at all), or a pointer inside a CPU fallback's
 * allocation. Keeps the pool's message otherwise. */
static gma_status_t not_device_memory(gma_t *g, void *ptr, gma_status_t st) {
  void *base = NULL;
  int kind = gma__host_contains(&g->host, ptr, &base);
  if (kind == GMA_MEMORY_HOST_PINNED)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_free(%p): the pointer is pinned host memory from gma_host_alloc, "
                          "not device memory; free it with gma_host_free",
                          ptr);
  if (kind == GMA_MEMORY_FALLBACK) /* not its start: gma__host_free took that */
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_free(%p): interior pointer, %zu bytes into the allocation at %p "
                          "(served from pinned host memory by fallback:host); pass the pointer "
                          "gma_alloc returned",
                          ptr, (size_t)((char *)ptr - (char *)base), base);
  return st;
}

static gma_status_t free_now(gma_t *g, void *ptr) {
  gma_status_t st;
  /* A graph pool's memory is an arena's to the pool (one load while no
   * graph pool holds memory). */
  if (gma__load_relaxed(&g->graphs.nchunks) && (st = gma__graph_free(&g->graphs, ptr)) != GMA_PENDING)
    return st;
  if (g->cfg.plan) {
    /* Planned memory first: an arena is one live block to the pool. Learned
     * before the free, while nobody can be handed the pointer again. */
    if ((st = gma__plan_free(&g->plan, ptr)) != GMA_ERR_OOM) return st;
    gma__plan_note_free(&g->plan, ptr);
  }
  st = gma__bin_free(&g->pool, ptr);
  if (st != GMA_OK) {
    unsigned kept = gma__error_keep(); /* a CPU fallback's free is said nothing about */
    bool pended;
    st = gma__pool_free_slow(&g->pool, ptr, &pended);
    /* The block now waits for other streams' work: a worker asleep until
     * its tick starts watching it now. */
    /* seq_cst: the other half of a Dekker pair with the worker, which says
     * unwatched before it looks at pending memory (worker.c). */
    if (pended && gma__load_seq_cst(&g->worker.unwatched)) gma__worker_kick(&g->worker);
    /* Not device memory of ours: a CPU fallback's host memory, perhaps, or
     * pinned host memory given to the wrong free. */
    if (st == GMA_ERR_INVALID_POINTER && gma__host_owns_fallback(&g->host, ptr))
      st = gma__host_free(&g->host, ptr, true);
    else if (st == GMA_ERR_INVALID_POINTER)
      st = not_device_memory(g, ptr, st);
    gma__error_done(kept, st);
  }
  /* An async request waits for memory: let the worker try again. */
  /* Relaxed: a hint; a free that misses the flag's store is followed by the
   * worker's own look at least every millisecond while requests wait. */
  if (st == GMA_OK && gma__load_relaxed(&g->worker.memory_wanted))
    gma__worker_kick(&g->worker);
  return st;
}

gma_status_t gma_record_stream(gma_t *g, void *ptr, gma_stream_t stream) {
  GMA__CHECK(g, "gma_record_stream");
  stream = gma__stream_arg(g, stream);
  CHECK_ARG(ptr, "gma_record_stream: ptr is NULL");
  /* Anywhere inside a live allocation names the whole allocation; the
   * trace records its start. */
  void *named = ptr;
  gma_status_t st = gma__graph_record_stream(&g->graphs, ptr, stream, &named);
  if (st != GMA_PENDING) goto done;
  unsigned kept = gma__error_keep(); /* a CPU fallback's record is said nothing about */
  st = g->cfg.plan ? gma__plan_record_stream(&g->plan, ptr, stream, &named) : GMA_ERR_OOM;
  if (st == GMA_ERR_OOM) st = gma__pool_record_stream(&g->pool, ptr, stream, &named);
  if (st == GMA_ERR_INVALID_POINTER) {
    void *hbase = NULL;
    int kind = gma__host_contains(&g->host, ptr, &hbase);
    if (kind == GMA_MEMORY_FALLBACK) { /* CPU-fallback memory: the host pool orders it */
      named = hbase;
      st = gma__host_record_stream(&g->host, hbase, stream);
    } else if (kind == GMA_MEMORY_HOST_PINNED) {
      st = gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_record_stream(%p): the pointer is pinned host memory from "
                          "gma_host_alloc, whose free is ordered on the stream it was allocated "
                          "on; gma_record_stream applies to gma_alloc's memory",
                          ptr);
    }
  }
  gma__error_done(kept, st);
done:
  if (st == GMA_OK)
    GMA__TRACE(&g->pool, GMA__TR_RECORD_STREAM, (uintptr_t)named, 0, stream, 0, 0, 0, 0);
  return st;
}

/* Cache as callers see it: reserved less allocated (an idle plan's arena
 * included). */
static uint64_t cached_now(gma_t *g) {
  gma_stats_t st = GMA_STATS_INIT;
  gma__pool_stats(&g->pool, &st);
  return st.cached.current;
}

/* The pool's cache down to keep; an idle plan's arena is cache too, given
 * back when the rest is not enough. */
static gma_status_t trim_to(gma_t *g, uint64_t keep) {
  gma_status_t st = gma__pool_trim(&g->pool, keep);
  if (st == GMA_OK && gma__plan_holds_arena(&g->plan) && cached_now(g) > keep &&
      gma__plan_reclaim(&g->plan, 0))
    st = gma__pool_trim(&g->pool, keep);
  return st;
}

gma_status_t gma_empty_cache(gma_t *g) {
  GMA__CHECK(g, "gma_empty_cache");
  gma__host_trim(&g->host, 0);
  return trim_to(g, 0);
}

gma_status_t gma_host_alloc(gma_t *g, size_t size, gma_stream_t stream, void **out) {
  GMA__CHECK(g, "gma_host_alloc");
  stream = gma__stream_arg(g, stream);
  CHECK_ARG(out, "gma_host_alloc: out is NULL");
  *out = NULL;
  return gma__host_alloc(&g->host, size, stream, false, out);
}

gma_status_t gma_host_free(gma_t *g, void *ptr) {
  GMA__CHECK(g, "gma_host_free");
  if (!ptr) return GMA_OK;
  gma_status_t st = gma__host_free(&g->host, ptr, false);
  if (st == GMA_ERR_INVALID_POINTER) { /* device memory given to the wrong free? */
    if (gma__pool_owns(&g->pool, ptr))
      st = gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_host_free(%p): the pointer is device memory of this allocator "
                          "(from gma_alloc), not pinned host memory; free it with gma_free",
                          ptr);
  }
  return st;
}

gma_status_t gma_trim(gma_t *g, uint64_t keep_bytes) {
  GMA__CHECK(g, "gma_trim");
  return trim_to(g, keep_bytes);
}

void gma__trace_batch(gma_t *g, gma__trace_t *t, gma_status_t st, size_t n,
                      const size_t *sizes, gma_stream_t stream, void *const *ptrs) {
  gma__pool_t *p = &g->pool;
  uint64_t now = gma__trace_now(), total = 0;
  for (size_t i = 0; i < n; i++) total += sizes[i];
  if (st != GMA_OK) {
    gma__trace_emit(t, now, GMA__TR_ALLOCATE_FAILURE, 0, total, (uintptr_t)stream, 0, 0, n, st);
    return;
  }
  /* Relaxed: an id only needs to be unique; it orders nothing. */
  uint64_t bid = gma__faa_relaxed(&p->trace_ids, 1) + 1;
  gma__trace_emit(t, now, GMA__TR_BATCH, 0, total, (uintptr_t)stream, 0, bid, n, 0);
  for (size_t i = 0; i < n; i++) {
    gma__trace_emit(t, now, GMA__TR_ALLOCATE, (uintptr_t)ptrs[i], sizes[i], (uintptr_t)stream,
                    live_facts(g, ptrs[i]).block, bid, 0, 0);
  }
}

gma_status_t gma_set_pressure_callback(gma_t *g, gma_pressure_callback_t cb, void *user) {
  GMA__CHECK(g, "gma_set_pressure_callback");
  return gma__worker_set_callback(&g->worker, cb, user);
}

gma_status_t gma_reserve(gma_t *g, gma_stream_t stream, size_t n, const size_t *sizes,
                         const size_t *counts) {
  GMA__CHECK(g, "gma_reserve");
  stream = gma__stream_arg(g, stream);
  CHECK_ARG(n == 0 || (sizes && counts), "gma_reserve: sizes or counts is NULL");
  /* Every size and the sums checked without wrapping before anything is
   * allocated (counts {SIZE_MAX, 2} summed to 1 and the blocks
   * were written past a one-entry array). The bytes bound the count: each
   * block takes at least 512 bytes, so no more than memory_limit / 512 of
   * them can ever be held. */
  uint64_t limit = g->cfg.memory_limit, bytes = 0;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (!counts[i]) continue;
    if (!gma__blocks_fit(&bytes, sizes[i], counts[i], limit))
      return gma__set_error(GMA_ERR_INVALID_SIZE,
                            "gma_reserve: entry %zu, %zu blocks of %zu bytes: each size must be "
                            "1 byte or more, and all blocks together at most memory_limit "
                            "(%" PRIu64 " bytes); nothing was kept",
                            i, counts[i], sizes[i], limit);
    total += counts[i]; /* at most limit / 512: cannot wrap */
  }
  void **held = total ? calloc(total, sizeof *held) : NULL;
  if (total && !held) return gma__set_error(GMA_ERR_OOM, "gma_reserve: host memory");
  /* Allocate everything, then free it: the frees land in the stream's bins
   * (up to bin_depth) in stream order, ready for the workload. */
  gma_status_t st = GMA_OK;
  size_t got = 0;
  for (size_t i = 0; i < n && st == GMA_OK; i++)
    for (size_t k = 0; k < counts[i] && st == GMA_OK; k++)
      if ((st = gma_alloc(g, sizes[i], stream, &held[got])) == GMA_OK) got++;
  char detail[1024] = "";
  if (st != GMA_OK) snprintf(detail, sizeof detail, "%s", gma__error_detail(gma_last_error()));
  for (size_t i = got; i-- > 0;) gma_free(g, held[i]);
  free(held);
  if (st != GMA_OK) return gma__set_error(st, "gma_reserve: %s; nothing was kept", detail);
  return GMA_OK;
}

gma_status_t gma_stats(gma_t *g, gma_stats_t *out) {
  GMA__CHECK(g, "gma_stats");
  CHECK_ARG(out, "gma_stats: out is NULL");
  gma_status_t st = gma__struct_size_check(out->size, sizeof(gma_stats_t), "gma_stats", "out",
                                           "GMA_STATS_INIT");
  if (st != GMA_OK) return st;
  gma_stats_t full = GMA_STATS_INIT;
  gma__plan_stats(&g->plan, &full); /* the pool's and the plan's in one step */
  gma__futures_stats(g, &full);
  gma__host_stats(&g->host, &full);
  uint64_t gpools, gbytes, glive;
  gma__graphs_totals(&g->graphs, &gpools, &gbytes, &glive);
  full.graph_pools = gpools;
  full.graph_pool_bytes = gbytes;
  full.graph_pool_cached_bytes = gbytes - glive;
  full.graph_captures = gma__load_relaxed(&g->graphs.capturing);
  /* Copy only what the caller's (possibly older, smaller) struct holds. */
  size_t n = out->size;
  full.size = n;
  memcpy(out, &full, n);
  return GMA_OK;
}

gma_status_t gma_stream_create(gma_t *g, gma_stream_t *out) {
  GMA__CHECK(g, "gma_stream_create");
  CHECK_ARG(out, "gma_stream_create: out is NULL");
  return g->dev->ops->stream_create(g->dev, out);
}

gma_status_t gma_stream_destroy(gma_t *g, gma_stream_t stream) {
  GMA__CHECK(g, "gma_stream_destroy");
  CHECK_ARG(stream != NULL && stream != GMA_STREAM_LEGACY && stream != GMA_STREAM_PER_THREAD,
            "gma_stream_destroy(%p): the default streams cannot be destroyed", stream);
  /* Forget the stream before its handle value can be reused by a new one. */
  gma__host_stream_gone(&g->host, stream);
  gma_status_t st = gma__pool_stream_retire(&g->pool, stream);
  gma_status_t dst = g->dev->ops->stream_destroy(g->dev, stream);
  return dst != GMA_OK ? dst : st;
}

gma_status_t gma_stream_retire(gma_t *g, gma_stream_t stream) {
  GMA__CHECK(g, "gma_stream_retire");
  stream = gma__stream_arg(g, stream);
  /* Host blocks used on the stream get their events now, while the handle
   * is alive: the caller may destroy it next, and a later free must not name
   * it (asking the driver about a destroyed handle is undefined). As for
   * device blocks, retiring means no more work on the stream uses them. */
  gma__host_stream_gone(&g->host, stream);
  return gma__pool_stream_retire(&g->pool, stream);
}

gma_status_t gma_stream_stats(gma_t *g, gma_stream_t stream, gma_stream_stats_t *out) {
  GMA__CHECK(g, "gma_stream_stats");
  stream = gma__stream_arg(g, stream);
  CHECK_ARG(out, "gma_stream_stats: out is NULL");
  gma_status_t st = gma__struct_size_check(out->size, sizeof(gma_stream_stats_t),
                                           "gma_stream_stats", "out", "GMA_STREAM_STATS_INIT");
  if (st != GMA_OK) return st;
  return gma__pool_stream_stats(&g->pool, stream, out);
}

gma_status_t gma_stream_synchronize(gma_t *g, gma_stream_t stream) {
  GMA__CHECK(g, "gma_stream_synchronize");
  stream = gma__stream_arg(g, stream);
  return gma__pool_stream_synchronize(&g->pool, stream);
}

gma_status_t gma_stream_wait_stream(gma_t *g, gma_stream_t waiter, gma_stream_t waitee) {
  GMA__CHECK(g, "gma_stream_wait_stream");
  gma_stream_t s[2] = {gma__stream_arg(g, waiter), gma__stream_arg(g, waitee)};
  static const char *const role[2] = {"waiter", "waitee"};
  /* The device's ids tell whether two handles name one stream (NULL and
   * GMA_STREAM_LEGACY do) and find a retired stream even after its handle
   * was recycled; asking for them also checks that both streams are live. */
  uint64_t id[2];
  for (int i = 0; i < 2; i++) {
    gma_status_t st = g->dev->ops->stream_id(g->dev, s[i], &id[i]);
    if (st != GMA_OK)
      return gma__set_error(st, "gma_stream_wait_stream: the %s %s", role[i],
                            gma__error_detail(gma_last_error()));
  }
  CHECK_ARG(id[0] != id[1],
            "gma_stream_wait_stream: waiter %p and waitee %p are the same stream; work on one "
            "stream runs in order already",
            s[0], s[1]);
  for (int i = 0; i < 2; i++)
    CHECK_ARG(!gma__stream_was_retired(&g->pool, s[i], id[i]),
              "gma_stream_wait_stream: the %s, stream %p, was retired (gma_stream_retire or "
              "gma_stream_destroy) and must take no more work",
              role[i], s[i]);
  return g->dev->ops->stream_wait_stream(g->dev, s[0], s[1]);
}

gma_status_t gma_sim_launch(gma_t *g, gma_stream_t stream, gma_sim_kernel_fn fn, void *arg) {
  GMA__CHECK(g, "gma_sim_launch");
  stream = gma__stream_arg(g, stream);
  CHECK_ARG(fn, "gma_sim_launch: fn is NULL");
  if (!g->dev->ops->sim_launch)
    return gma__set_error(GMA_ERR_UNSUPPORTED, "gma_sim_launch: the %s device cannot run "
                                               "simulated kernels", g->dev->name);
  return g->dev->ops->sim_launch(g->dev, stream, fn, arg);
}

/* For internal tests: the pool behind an allocator. */
gma__pool_t *gma__pool_of(gma_t *g) { return &g->pool; }

gma_status_t gma_iteration_mark(gma_t *g) {
  GMA__CHECK(g, "gma_iteration_mark");
  return gma__plan_mark(&g->plan);
}

/* ---- CUDA graphs (graph.c) ------------------------------------------------------ */

gma_status_t gma_graph_pool_create(gma_t *g, gma_graph_pool_t **out) {
  GMA__CHECK(g, "gma_graph_pool_create");
  CHECK_ARG(out, "gma_graph_pool_create: out is NULL");
  *out = NULL;
  return gma__graph_pool_create(&g->graphs, out);
}

gma_status_t gma_graph_pool_release(gma_t *g, gma_graph_pool_t *pool) {
  GMA__CHECK(g, "gma_graph_pool_release");
  CHECK_ARG(pool, "gma_graph_pool_release: pool is NULL");
  return gma__graph_pool_release(&g->graphs, pool);
}

gma_status_t gma_capture_begin(gma_t *g, gma_stream_t stream, gma_graph_pool_t *pool) {
  GMA__CHECK(g, "gma_capture_begin");
  CHECK_ARG(pool, "gma_capture_begin: pool is NULL; make one with gma_graph_pool_create");
  return gma__capture_begin(&g->graphs, gma__stream_arg(g, stream), pool);
}

gma_status_t gma_capture_end(gma_t *g, gma_stream_t stream) {
  GMA__CHECK(g, "gma_capture_end");
  return gma__capture_end(&g->graphs, gma__stream_arg(g, stream));
}

gma_status_t gma_graph_pool_stats(gma_t *g, gma_graph_pool_t *pool, gma_graph_pool_stats_t *out) {
  GMA__CHECK(g, "gma_graph_pool_stats");
  CHECK_ARG(pool, "gma_graph_pool_stats: pool is NULL");
  CHECK_ARG(out, "gma_graph_pool_stats: out is NULL");
  gma_status_t st = gma__struct_size_check(out->size, sizeof(gma_graph_pool_stats_t),
                                           "gma_graph_pool_stats", "out",
                                           "GMA_GRAPH_POOL_STATS_INIT");
  if (st != GMA_OK) return st;
  return gma__graph_pool_stats(&g->graphs, pool, out);
}
