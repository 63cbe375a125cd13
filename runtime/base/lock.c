/* The lock-order check of debug builds (lock.h): each thread keeps the locks
 * it holds, and an acquisition that breaks the rank order aborts. */
#include "base/lock.h"

#if GMA_DEBUG >= 1
#include <stdio.h>
#include <stdlib.h>


#define HELD_MAX 16 /* deeper nesting than the rank list allows is itself a bug */

static const char *const rank_names[GMA__RANK_COUNT] = {
    [GMA__RANK_REGISTRY] = "the registry of allocators",
    [GMA__RANK_DEAD] = "the destroyed handles",
    [GMA__RANK_OOM_OBSERVER] = "the OOM observer",
    [GMA__RANK_PLAN] = "a plan",
    [GMA__RANK_WORKER] = "a worker",
    [GMA__RANK_GRAPHS] = "the graph pools",
    [GMA__RANK_HOST] = "the pinned host pool",
    [GMA__RANK_POOLS] = "the list of pools",
    [GMA__RANK_POOL] = "a pool",
    [GMA__RANK_POOL_COUNT] = "a pool's counters",
    [GMA__RANK_POOL_TRACE] = "a pool's trace",
    [GMA__RANK_TRACE_WRITE] = "a trace file",
    [GMA__RANK_TRACE_REC] = "a trace buffer",
    [GMA__RANK_SIM_PLAN] = "the sim's fault plan",
    [GMA__RANK_SIM_STREAMS] = "the sim's stream list",
    [GMA__RANK_SIM_STREAM] = "a sim stream",
    [GMA__RANK_SIM_EVENTS] = "the sim's events",
    [GMA__RANK_SIM_MEM] = "the sim's memory",
    [GMA__RANK_SIM_DRIVER] = "the sim's priced driver",
    [GMA__RANK_CUDA_IDS] = "the CUDA stream ids",
};

typedef struct held {
  const pthread_mutex_t *mu;
  gma__rank_t rank;
} held_t;

/* The calling thread's locks, in the order taken. */
static _Thread_local held_t held[HELD_MAX];
static _Thread_local int n_held;

static const char *rank_name(gma__rank_t r) {
  return r > 0 && r < GMA__RANK_COUNT && rank_names[r] ? rank_names[r] : "an unranked lock";
}

static void order_broken(gma__rank_t taking, gma__rank_t holding) {
  fprintf(stderr,
          "gma: lock order broken: taking %s (rank %d) while holding %s (rank %d); "
          "runtime/base/lock.h lists the order\n",
          rank_name(taking), (int)taking, rank_name(holding), (int)holding);
  abort();
}

static void push(pthread_mutex_t *mu, gma__rank_t rank) {
  if (n_held == HELD_MAX) {
    fprintf(stderr, "gma: more than %d locks held by one thread\n", HELD_MAX);
    abort();
  }
  held[n_held++] = (held_t){mu, rank};
}

void gma__lock(pthread_mutex_t *mu, gma__rank_t rank) {
  for (int i = 0; i < n_held; i++)
    if (held[i].rank >= rank) order_broken(rank, held[i].rank);
  pthread_mutex_lock(mu);
  push(mu, rank);
}

bool gma__trylock(pthread_mutex_t *mu, gma__rank_t rank) {
  if (pthread_mutex_trylock(mu) != 0) return false;
  push(mu, rank);
  return true;
}

void gma__lock_forget(pthread_mutex_t *mu) {
  for (int i = n_held - 1; i >= 0; i--)
    if (held[i].mu == mu) {
      for (int j = i; j + 1 < n_held; j++) held[j] = held[j + 1];
      n_held--;
      return;
    }
  fprintf(stderr, "gma: releasing a lock this thread does not hold\n");
  abort();
}

void gma__unlock(pthread_mutex_t *mu) {
  gma__lock_forget(mu);
  pthread_mutex_unlock(mu);
}
#endif
