/* The runtime's mutexes and the one order they are taken in.
 *
 * Every lock the runtime takes has a rank below. A thread that holds a lock
 * takes only locks of a higher rank; two locks of one rank are never held
 * together. That order makes a deadlock between the runtime's locks
 * impossible. Debug builds (GMA_DEBUG >= 1) check it at every acquisition:
 * each thread keeps the locks it holds, and taking one out of order aborts
 * with both names (jemalloc's witness idea). Other builds compile the calls to
 * plain pthread calls.
 *
 * A condition wait gives its lock back and takes it again, so it needs no
 * wrapper: the thread holds the same locks before and after. A trylock never
 * blocks, so it is not checked, only recorded when it succeeds. */
#ifndef GMA_BASE_LOCK_H
#define GMA_BASE_LOCK_H

#include <pthread.h>
#include <stdbool.h>

typedef enum gma__rank {
  GMA__RANK_REGISTRY = 1, /* api/fork.c: the process's allocators */
  GMA__RANK_DEAD,         /* api/api.c: handles of destroyed allocators */
  GMA__RANK_OOM_OBSERVER, /* api/oom_observer.c: the observer and its flag */
  GMA__RANK_PLAN,         /* plan/: gma__plan_t.mu */
  GMA__RANK_WORKER,       /* worker/: gma__worker_t.mu */
  GMA__RANK_GRAPHS,       /* graph/: gma__graphs_t.lock */
  GMA__RANK_HOST,         /* host/: the pinned host pool */
  GMA__RANK_POOLS,        /* core/table.c: the process-wide list of pools */
  GMA__RANK_POOL,         /* core/: gma__pool_t.lock */
  GMA__RANK_POOL_COUNT,   /* core/: gma__pool_t.count_lock */
  GMA__RANK_POOL_TRACE,   /* core/: gma__pool_t.trace_mu */
  GMA__RANK_TRACE_WRITE,  /* base/trace.c: a trace's file */
  GMA__RANK_TRACE_REC,    /* base/trace.c: a trace's buffer */
  GMA__RANK_SIM_PLAN,     /* device/sim.c: the fault plan */
  GMA__RANK_SIM_STREAMS,  /* device/sim: the device's stream list */
  GMA__RANK_SIM_STREAM,   /* device/sim: one stream's queue */
  GMA__RANK_SIM_EVENTS,   /* device/sim: event marks */
  GMA__RANK_SIM_MEM,      /* device/sim: memory and its table */
  GMA__RANK_SIM_DRIVER,   /* device/sim_cost.c: the priced driver */
  GMA__RANK_CUDA_IDS,     /* device/cuda.c: stream ids */
  GMA__RANK_COUNT
} gma__rank_t;

#if GMA_DEBUG >= 1
void gma__lock(pthread_mutex_t *mu, gma__rank_t rank);
bool gma__trylock(pthread_mutex_t *mu, gma__rank_t rank);
void gma__unlock(pthread_mutex_t *mu);
/* Drops mu from the calling thread's held locks without unlocking it: for a
 * fork child's handler, which initializes the mutex again. */
void gma__lock_forget(pthread_mutex_t *mu);
#else
static inline void gma__lock(pthread_mutex_t *mu, gma__rank_t rank) {
  (void)rank;
  pthread_mutex_lock(mu);
}
static inline bool gma__trylock(pthread_mutex_t *mu, gma__rank_t rank) {
  (void)rank;
  return pthread_mutex_trylock(mu) == 0;
}
static inline void gma__unlock(pthread_mutex_t *mu) { pthread_mutex_unlock(mu); }
static inline void gma__lock_forget(pthread_mutex_t *mu) { (void)mu; }
#endif

#endif /* GMA_BASE_LOCK_H */
