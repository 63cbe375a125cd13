/* Owns the PyTorch plug-in: libgma_torch.so, the two functions
 * torch.cuda.memory.CUDAPluggableAllocator loads (gma_torch_alloc and
 * gma_torch_free), one gma allocator per device created on first use, their
 * teardown at process exit, and the exports Python reads gma's statistics
 * through (PyTorch's own memory_stats does not work with plug-ins).
 *
 * No CUDA or torch header is needed: cudaStream_t is a pointer, and gma takes
 * the driver's stream handles as they are.
 *
 * Threads: every export may be called from any number of threads at once,
 * including gma_torch_shutdown (the atexit handler) against late frees. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "gma_torch.h"

#define GMA_TORCH_API __attribute__((visibility("default")))

typedef void *cudaStream_t; /* as CUDA declares it: a pointer to an opaque struct */

/* device_id's range in GMA_CONF (0..1023): one slot per possible device. */
#define GMA_TORCH_MAX_DEVICES 1024

/* allocators[d] is written once, under create_lock, with release ordering
 * (pairs with the acquire loads), and cleared only by gma_torch_shutdown
 * once no call is in flight. */
static _Atomic(gma_t *) allocators[GMA_TORCH_MAX_DEVICES];
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER; /* guards creation, destruction */

/* The OOM observer gma.torch installs (gma_torch_set_oom_observer): called
 * with the device, the request, the device's allocated bytes and its free
 * memory, as PyTorch's OOM observers are; nonzero asks gma to try again.
 * Written under create_lock; every allocator created gets it. */
typedef int (*gma_torch_oom_fn)(int device, uint64_t requested, uint64_t allocated,
                                uint64_t device_free);
static _Atomic(gma_torch_oom_fn) oom_fn;

static int on_oom(gma_t *g, const gma_oom_info_t *info, void *user) {
  (void)g;
  gma_torch_oom_fn fn = atomic_load_explicit(&oom_fn, memory_order_acquire);
  if (!fn) return GMA_OOM_FAIL;
  return fn((int)(intptr_t)user, info->requested, info->allocated, info->device_free)
             ? GMA_OOM_RETRY
             : GMA_OOM_FAIL;
}
static bool atexit_registered;                                  /* guarded by create_lock */

/* Shutdown against late calls. PyTorch can free tensors after our atexit
 * handler ran (static tensors in C++ destructors, daemon threads), so every
 * export counts itself in flight, then checks `closed`; shutdown sets
 * `closed`, then waits for the in-flight count to drain before destroying.
 * All four operations are seq_cst, so either the call sees `closed` (and does
 * nothing) or shutdown sees the call in flight (and waits for it): the
 * Dekker pattern. The count is striped over cache lines, one stripe per
 * thread (round robin), so threads do not contend on one counter (design.md,
 * convention 7). */
#define STRIPES 32
typedef struct stripe {
  _Alignas(64) atomic_long n;
} stripe_t;
static stripe_t inflight[STRIPES];
static atomic_bool closed;
static atomic_uint next_stripe;
static _Thread_local int my_stripe = -1;

/* The plug-in's own message of the calling thread's last failure (it cannot
 * set libgma's thread-local error). */
static _Thread_local char last_msg[1024];
/* The status of the calling thread's last allocator_of that gave NULL. */
static _Thread_local gma_status_t no_allocator_status;

static void set_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_msg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
}

/* gma_last_error() with the status name in front, unless it has it already. */
static void set_gma_msg(gma_status_t st, const char *what) {
  const char *name = gma_status_name(st), *detail = gma_last_error();
  if (strncmp(detail, name, strlen(name)) == 0)
    set_msg("%s: %s", what, detail);
  else
    set_msg("%s: %s: %s", what, name, detail);
}

/* One line on stderr per failure: PyTorch only sees NULL. */
static void log_msg(void) { fprintf(stderr, "gma_torch: %s\n", last_msg); }

static bool enter(void) {
  if (my_stripe < 0)
    my_stripe = (int)(atomic_fetch_add_explicit(&next_stripe, 1, memory_order_relaxed) % STRIPES);
  atomic_fetch_add(&inflight[my_stripe].n, 1); /* seq_cst: see the comment on inflight */
  if (atomic_load(&closed)) {
    atomic_fetch_sub(&inflight[my_stripe].n, 1);
    return false;
  }
  return true;
}

static void leave(void) { atomic_fetch_sub(&inflight[my_stripe].n, 1); }

static bool valid_device(int device) {
  if (device >= 0 && device < GMA_TORCH_MAX_DEVICES) return true;
  no_allocator_status = GMA_ERR_INVALID_ARGUMENT;
  set_msg("device %d is out of range (0..%d)", device, GMA_TORCH_MAX_DEVICES - 1);
  return false;
}

GMA_TORCH_API void gma_torch_shutdown(void);

/* Creates device's allocator: GMA_CONF from the environment, then
 * device_ordinal = device (so a device_id in GMA_CONF does not send every
 * device's memory to one GPU), ignore_env so GMA_CONF is not applied twice.
 * The device is CUDA unless GMA_CONF names one (device:sim, for tests): with
 * device:auto a machine whose driver does not load would hand PyTorch
 * simulated host addresses as CUDA memory. Caller holds create_lock. */
static gma_t *create_locked(int device) {
  gma_config_t cfg = GMA_CONFIG_INIT;
  const char *env = getenv("GMA_CONF");
  gma_status_t st = GMA_OK;
  if (env && *env && (st = gma_config_parse(&cfg, env)) != GMA_OK) {
    char what[600];
    snprintf(what, sizeof what, "GMA_CONF=\"%s\" is invalid", env);
    set_gma_msg(st, what);
    no_allocator_status = st;
    return NULL;
  }
  if (cfg.device == GMA_DEVICE_AUTO) cfg.device = GMA_DEVICE_CUDA;
  cfg.device_ordinal = device;
  cfg.ignore_env = 1;
  gma_t *g = NULL;
  if ((st = gma_create(&cfg, &g)) != GMA_OK) {
    char what[96];
    snprintf(what, sizeof what, "creating the allocator of device %d failed", device);
    set_gma_msg(st, what);
    no_allocator_status = st;
    return NULL;
  }
  gma_set_oom_observer(g, on_oom, (void *)(intptr_t)device);
  if (!atexit_registered) {
    /* Registered after the first allocator exists, hence after PyTorch set up
     * CUDA: handlers run in reverse order, so ours runs before the CUDA
     * runtime's teardown and gma_destroy still has a working driver. */
    atexit(gma_torch_shutdown);
    atexit_registered = true;
  }
  return g;
}

/* The allocator of device, created on first use when create is set. NULL
 * with last_msg and no_allocator_status set when there is none. Call between enter() and leave(). */
static gma_t *allocator_of(int device, bool create) {
  if (!valid_device(device)) return NULL;
  gma_t *g = atomic_load_explicit(&allocators[device], memory_order_acquire);
  if (g) return g;
  if (!create) {
    no_allocator_status = GMA_ERR_INVALID_ARGUMENT;
    set_msg("device %d has no allocator yet (nothing was allocated on it)", device);
    return NULL;
  }
  pthread_mutex_lock(&create_lock);
  g = atomic_load_explicit(&allocators[device], memory_order_relaxed);
  if (!g && (g = create_locked(device)) != NULL) /* release: pairs with the acquire above */
    atomic_store_explicit(&allocators[device], g, memory_order_release);
  pthread_mutex_unlock(&create_lock);
  return g;
}

/* ---- fork() --------------------------------------------------------------------- *
 * A child of fork() has only the forking thread. libgma marks the allocators
 * it inherits as unusable (runtime/api/fork.c), so the child drops them and makes
 * its own on first use (on the simulated device that works; CUDA itself is
 * not fork-safe, and then creation fails with the driver's message). Around
 * the fork create_lock is held, so no other parent thread holds it in the
 * child, and the in-flight counts of parent threads, which do not exist in
 * the child, are cleared (its exit handler would wait for them). The dropped
 * copies are left to the child's exit: they hold host memory only. */
static void fork_prepare(void) { pthread_mutex_lock(&create_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&create_lock); }
static void fork_child(void) {
  for (int d = 0; d < GMA_TORCH_MAX_DEVICES; d++)
    atomic_store_explicit(&allocators[d], NULL, memory_order_relaxed);
  for (int i = 0; i < STRIPES; i++) atomic_store(&inflight[i].n, 0);
  pthread_mutex_unlock(&create_lock);
}
__attribute__((constructor)) static void register_fork_handlers(void) {
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* ---- What CUDAPluggableAllocator loads ----------------------------------------- */

/* The allocation both entry points share: GMA_OK with *out set (NULL for
 * size 0), or the failure's status with last_msg set and *out NULL. Logs
 * nothing. */
static gma_status_t torch_alloc(ssize_t size, int device, cudaStream_t stream, void **out) {
  *out = NULL;
  if (size <= 0) {
    if (size == 0) return GMA_OK;
    set_msg("alloc: negative size %zd", size);
    return GMA_ERR_INVALID_SIZE;
  }
  if (!enter()) {
    set_msg("alloc of %zd bytes on device %d after gma_torch_shutdown (process exit)", size,
            device);
    return GMA_ERR_CANCELLED;
  }
  gma_status_t st;
  gma_t *g = allocator_of(device, true);
  if (!g) {
    st = no_allocator_status;
  } else {
    st = gma_alloc(g, (size_t)size, stream, out);
    if (st != GMA_OK) {
      char what[160];
      snprintf(what, sizeof what, "alloc of %zd bytes on device %d, stream %p failed", size,
               device, stream);
      set_gma_msg(st, what);
      *out = NULL;
    } else if (!*out) { /* never expected: a success must give memory */
      set_msg("alloc of %zd bytes on device %d: gma_alloc gave NULL", size, device);
      st = GMA_ERR_INTERNAL;
    }
  }
  leave();
  return st;
}

/* PyTorch asks for size 0 (empty tensors): NULL without an error. A failure
 * returns NULL and logs one line; what PyTorch then does with NULL depends on
 * its version (the versions read use it as the tensor's address). The C++
 * shim (gma_torch_shim.cpp) throws instead, through gma_torch_try_alloc. */
GMA_TORCH_API void *gma_torch_alloc(ssize_t size, int device, cudaStream_t stream) {
  void *p = NULL;
  if (torch_alloc(size, device, stream, &p) != GMA_OK) log_msg();
  return p;
}

/* gma_torch_alloc without the stderr line: the status, *out. */
GMA_TORCH_API int gma_torch_try_alloc(ssize_t size, int device, cudaStream_t stream,
                                      void **out) {
  if (!out) {
    set_msg("gma_torch_try_alloc: out is NULL");
    return GMA_ERR_INVALID_ARGUMENT;
  }
  return torch_alloc(size, device, stream, out);
}

/* Frees through device's allocator; gma_free is ordered on the stream the
 * block was allocated on, which is the stream PyTorch passes back. A pointer
 * the device's allocator does not know is looked for in the others before it
 * is reported. After shutdown, a no-op: the process's exit gives the memory back. */
GMA_TORCH_API void gma_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream) {
  (void)size;
  (void)stream;
  if (!ptr || !enter()) return;
  gma_status_t st = GMA_ERR_INVALID_POINTER;
  gma_t *g = valid_device(device) ? atomic_load_explicit(&allocators[device], memory_order_acquire)
                                  : NULL;
  if (g) st = gma_free(g, ptr);
  if (st == GMA_ERR_INVALID_POINTER) {
    for (int d = 0; d < GMA_TORCH_MAX_DEVICES && st == GMA_ERR_INVALID_POINTER; d++) {
      gma_t *o = atomic_load_explicit(&allocators[d], memory_order_acquire);
      if (o && o != g) st = gma_free(o, ptr);
    }
  }
  if (st != GMA_OK) {
    char what[96];
    snprintf(what, sizeof what, "free of %p (device %d) failed", ptr, device);
    if (st == GMA_ERR_INVALID_POINTER && !g)
      set_msg("%s: GMA_ERR_INVALID_POINTER: no gma allocator knows this pointer", what);
    else
      set_gma_msg(st, what);
    log_msg();
  }
  leave();
}

/* ---- Statistics and control from Python ------------------------------------------ */

#define WITH_ALLOCATOR(device, create, fail_status)                                  \
  if (!enter()) {                                                                    \
    set_msg("gma_torch_shutdown already ran (process exit)");                        \
    return GMA_ERR_CANCELLED;                                                        \
  }                                                                                  \
  gma_t *g = allocator_of(device, create);                                           \
  if (!g) {                                                                          \
    leave();                                                                         \
    return fail_status;                                                              \
  }

/* The message of the calling thread's last failing gma_torch_* call. */
GMA_TORCH_API const char *gma_torch_last_error(void) { return last_msg; }

/* device's gma allocator (created now if needed), for calling libgma directly
 * (gma_pointer_info, gma_stream_stats, ...). NULL with gma_torch_last_error()
 * set if it cannot be had. Valid until gma_torch_shutdown. */
GMA_TORCH_API gma_t *gma_torch_allocator(int device) {
  if (!enter()) {
    set_msg("gma_torch_shutdown already ran (process exit)");
    return NULL;
  }
  gma_t *g = allocator_of(device, true);
  leave();
  return g;
}

/* gma_stats of device's allocator; out->size must be set (GMA_STATS_INIT).
 * A device nothing was allocated on reads as all zeros. */
GMA_TORCH_API int gma_torch_stats(int device, gma_stats_t *out) {
  if (!out || out->size < sizeof(size_t)) {
    set_msg("gma_torch_stats: out is NULL or its size field is not set");
    return GMA_ERR_INVALID_ARGUMENT;
  }
  if (!valid_device(device)) return GMA_ERR_INVALID_ARGUMENT;
  if (!enter()) {
    set_msg("gma_torch_shutdown already ran (process exit)");
    return GMA_ERR_CANCELLED;
  }
  gma_t *g = atomic_load_explicit(&allocators[device], memory_order_acquire);
  gma_status_t st = GMA_OK;
  if (g) {
    if ((st = gma_stats(g, out)) != GMA_OK)
      set_gma_msg(st, "gma_stats");
  } else {
    size_t n = out->size < sizeof(gma_stats_t) ? out->size : sizeof(gma_stats_t);
    size_t keep = out->size;
    memset(out, 0, n);
    out->size = keep;
  }
  leave();
  return st;
}

/* gma_memory_summary of device's allocator (created if needed) into buf. */
GMA_TORCH_API int gma_torch_summary(int device, char *buf, size_t len) {
  WITH_ALLOCATOR(device, true, GMA_ERR_INVALID_ARGUMENT)
  gma_status_t st = gma_memory_summary(g, buf, len);
  if (st != GMA_OK) set_gma_msg(st, "gma_memory_summary");
  leave();
  return st;
}

/* gma_snapshot_json of device's allocator (created if needed) to path. */
GMA_TORCH_API int gma_torch_snapshot(int device, const char *path) {
  WITH_ALLOCATOR(device, true, GMA_ERR_INVALID_ARGUMENT)
  gma_status_t st = gma_snapshot_json(g, path);
  if (st != GMA_OK) set_gma_msg(st, "gma_snapshot_json");
  leave();
  return st;
}

/* gma_snapshot_write of device's allocator (created if needed). */
GMA_TORCH_API int gma_torch_snapshot_write(int device, const char *path, int format) {
  WITH_ALLOCATOR(device, true, GMA_ERR_INVALID_ARGUMENT)
  gma_status_t st = gma_snapshot_write(g, path, (gma_snapshot_format_t)format);
  if (st != GMA_OK) set_gma_msg(st, "gma_snapshot_write");
  leave();
  return st;
}

/* Installs fn (NULL removes it) as every device's OOM observer, for the
 * allocators there are and those made later. When it returns, a previous
 * fn is not running on any allocator (gma_set_oom_observer waits), except
 * when called from inside fn. */
GMA_TORCH_API int gma_torch_set_oom_observer(gma_torch_oom_fn fn) {
  pthread_mutex_lock(&create_lock);
  atomic_store_explicit(&oom_fn, fn, memory_order_release);
  for (int d = 0; d < GMA_TORCH_MAX_DEVICES; d++) {
    gma_t *g = atomic_load_explicit(&allocators[d], memory_order_acquire);
    if (g) gma_set_oom_observer(g, fn ? on_oom : NULL, (void *)(intptr_t)d);
  }
  pthread_mutex_unlock(&create_lock);
  return GMA_OK;
}

/* gma_empty_cache of device's allocator; GMA_OK when it has none yet.
 * (torch.cuda.empty_cache() does not reach plug-ins: call this instead.) */
GMA_TORCH_API int gma_torch_empty_cache(int device) {
  if (!valid_device(device)) return GMA_ERR_INVALID_ARGUMENT;
  WITH_ALLOCATOR(device, false, GMA_OK)
  gma_status_t st = gma_empty_cache(g);
  if (st != GMA_OK) set_gma_msg(st, "gma_empty_cache");
  leave();
  return st;
}

/* gma_iteration_mark of device's allocator; GMA_OK when it has none yet (no
 * allocation made: nothing to learn). PyTorch has no hook for iteration
 * boundaries, so the training loop calls this (gma.torch.iteration_mark). */
GMA_TORCH_API int gma_torch_iteration_mark(int device) {
  if (!valid_device(device)) return GMA_ERR_INVALID_ARGUMENT;
  WITH_ALLOCATOR(device, false, GMA_OK)
  gma_status_t st = gma_iteration_mark(g);
  if (st != GMA_OK) set_gma_msg(st, "gma_iteration_mark");
  leave();
  return st;
}

/* gma_record_stream on device's allocator: ptr is also used on stream, so its
 * free waits for that work too. PyTorch's Tensor.record_stream does not reach
 * plug-ins loaded from Python: call this (gma.torch.record_stream) instead. */
GMA_TORCH_API int gma_torch_record_stream(void *ptr, int device, cudaStream_t stream) {
  WITH_ALLOCATOR(device, false, GMA_ERR_INVALID_POINTER)
  gma_status_t st = gma_record_stream(g, ptr, stream);
  if (st != GMA_OK) {
    char what[128];
    snprintf(what, sizeof what, "gma_record_stream(%p, stream %p) on device %d", ptr, stream,
             device);
    set_gma_msg(st, what);
  }
  leave();
  return st;
}

/* ---- Teardown ---------------------------------------------------------------------- */

static long inflight_sum(void) {
  long n = 0;
  for (int i = 0; i < STRIPES; i++) n += atomic_load(&inflight[i].n);
  return n;
}

/* Abandons every allocator (gma_abandon: the worker stops and a trace file is
 * finished, but nothing waits for the device, which could hang at exit on a
 * collective whose peer is gone, and tensors alive at exit are not reported
 * as leaks: the process's exit gives their memory back). Registered with
 * atexit; may be called earlier, after which allocations fail, frees do
 * nothing and the memory stays reserved until exit. Idempotent. If calls stay
 * in flight for 2 s (a thread stuck inside gma), the allocators are left as
 * they are rather than abandoned under that call. */
GMA_TORCH_API void gma_torch_shutdown(void) {
  if (atomic_exchange(&closed, true)) return; /* seq_cst: see the comment on inflight */
  /* Not under create_lock: a call in flight may be waiting for it to create
   * an allocator, which it then stores, and the loop below destroys. */
  for (int i = 0; i < 2000 && inflight_sum() != 0; i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (inflight_sum() != 0) {
    fprintf(stderr, "gma_torch: calls still in flight at exit; allocators not destroyed\n");
    return;
  }
  pthread_mutex_lock(&create_lock);
  for (int d = 0; d < GMA_TORCH_MAX_DEVICES; d++) {
    gma_t *g = atomic_exchange(&allocators[d], NULL);
    if (g) gma_abandon(g);
  }
  pthread_mutex_unlock(&create_lock);
}
