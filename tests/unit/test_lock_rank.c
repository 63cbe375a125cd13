/* The lock-order check of debug builds (runtime/base/lock.h): locks taken in
 * rank order pass, and each way of breaking the order aborts with a message
 * that names both locks. Each planted break runs in a child process, whose
 * abort and stderr the parent checks; a check that let one through would
 * fail this test. Every other test of a debug build runs with the check on,
 * so the whole suite is the check's positive side. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/lock.h"
#include "child.h"
#include "simkit.h"

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t pool2_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t plan_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;

/* Runs body in a child with stderr in a pipe; true when the child aborted
 * and its stderr holds want. */
static void run_body(void *body) { ((void (*)(void))body)(); }

static bool aborts_saying(void (*body)(void), const char *want) {
  char out[1024];
  /* A child that returns was let through by the check. */
  int status = child_run(run_body, (void *)body, out, sizeof out);
  bool aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  if (!aborted || !strstr(out, want))
    fprintf(stderr, "expected an abort saying \"%s\"; the child %s and said: %s\n", want,
            aborted ? "aborted" : "did not abort", out);
  return aborted && strstr(out, want);
}

static void lower_under_higher(void) { /* a plan's lock under a pool's */
  gma__lock(&pool_mu, GMA__RANK_POOL);
  gma__lock(&plan_mu, GMA__RANK_PLAN);
}

static void two_of_one_rank(void) { /* two pools' locks at once */
  gma__lock(&pool_mu, GMA__RANK_POOL);
  gma__lock(&pool2_mu, GMA__RANK_POOL);
}

static void after_trylock(void) { /* a trylock holds its lock like any other */
  CHECK(gma__trylock(&sim_mu, GMA__RANK_SIM_MEM));
  gma__lock(&pool_mu, GMA__RANK_POOL);
}

static void unlock_unheld(void) { gma__unlock(&pool_mu); }

int main(void) {
#if GMA_DEBUG < 1
  printf("lock ranks are checked in debug builds only (GMA_DEBUG >= 1)\n");
  return 77;
#else
  /* In order: plan, pool, sim; released in any order; then again. */
  for (int round = 0; round < 2; round++) {
    gma__lock(&plan_mu, GMA__RANK_PLAN);
    gma__lock(&pool_mu, GMA__RANK_POOL);
    CHECK(gma__trylock(&sim_mu, GMA__RANK_SIM_MEM));
    CHECK(!gma__trylock(&sim_mu, GMA__RANK_SIM_MEM)); /* held: not taken twice */
    gma__unlock(&pool_mu);
    gma__unlock(&sim_mu);
    gma__unlock(&plan_mu);
  }
  /* A lock released may be taken again under a lower one. */
  gma__lock(&pool_mu, GMA__RANK_POOL);
  gma__unlock(&pool_mu);
  gma__lock(&plan_mu, GMA__RANK_PLAN);
  gma__lock(&pool_mu, GMA__RANK_POOL);
  gma__unlock(&pool_mu);
  gma__unlock(&plan_mu);

  CHECK(aborts_saying(lower_under_higher, "taking a plan (rank"));
  CHECK(aborts_saying(lower_under_higher, "while holding a pool (rank"));
  CHECK(aborts_saying(two_of_one_rank, "taking a pool (rank"));
  CHECK(aborts_saying(after_trylock, "while holding the sim's memory"));
  CHECK(aborts_saying(unlock_unheld, "releasing a lock this thread does not hold"));
  printf("lock ranks: ok\n");
  return 0;
#endif
}
