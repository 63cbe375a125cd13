/* Owns allocators across fork() (see fork.h): the registry of live
 * allocators, the pthread_atfork handlers, and the teardown of an allocator
 * a child process inherited.
 *
 * The registry is a list under reg_mu. The atfork handlers keep reg_mu
 * consistent across fork(): prepare takes it (so no thread is changing the
 * list when fork() runs), the parent releases it, and the child, whose copy
 * is locked by the forking thread, initializes it afresh and then marks every
 * registered allocator FORKED and its futures' anchor forked. That is all the
 * child handler does: a few stores, no allocation, so it is safe in a child
 * of a multithreaded process.
 *
 * Tearing an inherited allocator down (gma__fork_destroy) follows one rule:
 * nothing may block, because the parent's threads are gone, and a lock one
 * of them held at fork time stays locked forever here. So no thread is
 * joined, no stream waited for, and every lock is only tried: a lock that
 * was free at fork time guards consistent state, which is freed; what a lock
 * held then guards may be half changed and is leaked. The device memory goes
 * back through the backend's forget op (the simulated device's mmaps; on
 * CUDA nothing, no driver call being fork-safe); then the pool's and the host
 * pool's own teardown runs against a stand-in device whose release calls do
 * nothing, which frees the segments' and blocks' host records, the stream
 * records and the page map. Leaked by design, besides what a held lock
 * guards: futures that only the parent's worker still referenced (released
 * by their caller before fork(), or queued in the ring), and the worker's
 * mutex and condition variables, which are never destroyed (a waiter that
 * died with the parent could make destroying one block). */
#include "api/fork.h"
#include "base/lock.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "api/allocator.h"

static pthread_once_t handlers_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static gma_t *live; /* reg_mu: allocators between gma_create and gma_destroy */
/* reg_mu: inherited allocators gma_destroy tore down in this process. Their
 * structs are kept (magic DEAD, on a list so leak checkers see them
 * reachable) so that a later call on such a handle fails cleanly, like
 * api.c's list of destroyed allocators; there are at most as many as this
 * process inherited. */
static gma_t *buried;

static void on_prepare(void) { gma__lock(&reg_mu, GMA__RANK_REGISTRY); }

static void on_parent(void) { gma__unlock(&reg_mu); }

/* The child: one thread, the forking one, which holds reg_mu (prepare). */
static void on_child(void) {
  gma__lock_forget(&reg_mu);
  pthread_mutex_init(&reg_mu, NULL);
  for (gma_t *g = live; g; g = g->fork_next) {
    g->magic = GMA__MAGIC_FORKED;
    gma__futures_forked(g);
  }
}

/* If this fails (no memory), children are not told: their inherited
 * allocators behave as before this file existed. Nothing better can be done
 * from gma_create, which has no reason to fail for it. */
static void handlers_register(void) { pthread_atfork(on_prepare, on_parent, on_child); }

void gma__fork_register(gma_t *g) {
  pthread_once(&handlers_once, handlers_register);
  gma__lock(&reg_mu, GMA__RANK_REGISTRY);
  g->fork_prev = NULL;
  g->fork_next = live;
  if (live) live->fork_prev = g;
  live = g;
  gma__unlock(&reg_mu);
}

/* reg_mu held. */
static void unlink_locked(gma_t *g) {
  *(g->fork_prev ? &g->fork_prev->fork_next : &live) = g->fork_next;
  if (g->fork_next) g->fork_next->fork_prev = g->fork_prev;
  g->fork_prev = g->fork_next = NULL;
}

void gma__fork_unregister(gma_t *g) {
  gma__lock(&reg_mu, GMA__RANK_REGISTRY);
  unlink_locked(g);
  gma__unlock(&reg_mu);
}

gma_status_t gma__fork_future_error(const char *fn) {
  return gma__set_error(GMA_ERR_CANCELLED,
                        "%s: the future's allocator was created by the parent process before "
                        "fork(), and its worker does not exist in the child; the request is "
                        "cancelled (create a new allocator in the child)",
                        fn);
}

/* ---- The stand-in device ---------------------------------------------------------
 * What the pool's and the host pool's teardown calls once the real device
 * was forgotten: its memory is already gone, so every release succeeds and
 * does nothing. Only release calls can reach it (the allocator is no longer
 * LIVE), so the other entries stay NULL. */
static gma_status_t none_mem_free(gma__device_t *d, uintptr_t addr, uint64_t size) {
  return GMA_OK;
}
static gma_status_t none_event_destroy(gma__device_t *d, gma__event_t ev) { return GMA_OK; }
static gma_status_t none_vm_release(gma__device_t *d, uintptr_t addr, uint64_t size) {
  return GMA_OK;
}
static gma_status_t none_vm_unmap(gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t h) {
  return GMA_OK;
}
static gma_status_t none_host_free(gma__device_t *d, void *host, uint64_t size) {
  return GMA_OK;
}
static void none_destroy(gma__device_t *d) {}

static const gma__device_ops_t forgotten_ops = {
    .mem_free = none_mem_free,
    .event_destroy = none_event_destroy,
    .vm_release = none_vm_release,
    .vm_unmap = none_vm_unmap,
    .host_free = none_host_free,
    .destroy = none_destroy,
    .forget = none_destroy,
};
static gma__device_t forgotten = {&forgotten_ops, "forgotten"};

/* ---- Teardown --------------------------------------------------------------------- */

/* Takes every lock in mus, or none: true when all were free at fork time
 * (they are released again at once; nobody else can take them here). */
static bool all_free(pthread_mutex_t *const *mus, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (pthread_mutex_trylock(mus[i]) != 0) {
      while (i-- > 0) pthread_mutex_unlock(mus[i]);
      return false;
    }
  for (size_t i = 0; i < n; i++) pthread_mutex_unlock(mus[i]);
  return true;
}

gma_status_t gma__fork_destroy(gma_t *g) {
  /* reg_mu was initialized afresh in this process: taking it cannot block
   * on a parent thread. */
  gma__fork_unregister(g);
  gma__futures_forget(g);
  /* The traces are the parent's: nothing is written from here. */
  gma__pool_t *p = &g->pool;
  gma__store_relaxed(&p->trace, NULL);
  if (all_free((pthread_mutex_t *const[]){&p->trace_mu}, 1)) gma__trace_abandon(p->traces);
  p->traces = NULL;
  /* The device memory, then the host records of it. */
  g->dev->ops->forget(g->dev);
  g->dev = p->dev = g->host.dev = &forgotten;
  if (p->src) p->src->dev = &forgotten; /* the segment source keeps its own device pointer */
  uint64_t host_leaks, host_leaked;
  if (all_free((pthread_mutex_t *const[]){&g->host.mu}, 1))
    gma__host_fini(&g->host, &host_leaks, &host_leaked);
  p->inherited = true; /* condition variables with dead waiters are left alone */
  if (gma__pool_fork_unlocked(p))
    gma__pool_fini(p); /* GMA_ERR_LEAK for live blocks: expected here, not returned */
  /* Graph pools' host records (their chunks were device memory, forgotten above). */
  if (all_free((pthread_mutex_t *const[]){&g->graphs.lock}, 1)) gma__graphs_forget(&g->graphs);
  /* The planner's host memory (its arena was device memory, forgotten above). */
  if (all_free((pthread_mutex_t *const[]){&g->plan.mu}, 1)) gma__plan_fini(&g->plan);
  g->magic = GMA__MAGIC_DEAD;
  gma__lock(&reg_mu, GMA__RANK_REGISTRY);
  g->fork_next = buried;
  buried = g;
  gma__unlock(&reg_mu);
  return GMA_OK;
}
