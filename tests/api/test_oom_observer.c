/* gma_set_oom_observer: the observer is called before gma_alloc or
 * gma_alloc_batch reports GMA_ERR_OOM; it may free memory and ask for one
 * more try. Covered: an observer that frees and retries (the call succeeds,
 * no OOM counted, gma_last_error() unchanged), one that declines (the OOM
 * is reported once, with the message the observer saw), batches, an
 * observer that allocates (its own allocation fails at once, without a
 * nested call), unsetting from inside the observer, and unsetting from
 * another thread while it runs (the unset waits for it to return). Public
 * API only. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)

typedef struct obs {
  int calls;
  void *spare; /* a buffer the program can give up */
  int answer;
  size_t requested;
  char message[1024];
  bool allocate; /* try an allocation from inside */
  gma_status_t inner;
  bool unset_inside;
} obs_t;

static int observer(gma_t *g, const gma_oom_info_t *info, void *user) {
  obs_t *o = user;
  o->calls++;
  o->requested = info->requested;
  CHECK(info->size == sizeof *info && info->message && info->reserved >= info->allocated);
  snprintf(o->message, sizeof o->message, "%s", info->message);
  if (o->allocate) {
    void *p = NULL;
    o->inner = gma_alloc(g, 40 * MiB, NULL, &p);
    if (o->inner == GMA_OK) CHECK_OK(gma_free(g, p));
  }
  if (o->unset_inside) CHECK_OK(gma_set_oom_observer(g, NULL, NULL));
  if (o->spare) {
    CHECK_OK(gma_free(g, o->spare));
    o->spare = NULL;
  }
  return o->answer;
}

static gma_t *full_allocator(void **held, obs_t *o) {
  gma_t *g = sim_allocator("memory_limit:64M,worker:off");
  CHECK_OK(gma_alloc(g, 32 * MiB, NULL, held));
  CHECK_OK(gma_alloc(g, 24 * MiB, NULL, &o->spare));
  CHECK_OK(gma_set_oom_observer(g, observer, o));
  return g;
}

static void frees_and_retries(void) {
  obs_t o = {.answer = GMA_OOM_RETRY};
  void *held, *p;
  gma_t *g = full_allocator(&held, &o);
  CHECK_ST(gma_alloc(g, 0, NULL, &p), GMA_ERR_INVALID_SIZE); /* a message to keep */
  char before[256];
  snprintf(before, sizeof before, "%s", gma_last_error());
  CHECK_OK(gma_alloc(g, 24 * MiB, NULL, &p)); /* fits once the observer freed the spare */
  CHECK(o.calls == 1 && o.requested == 24 * MiB && strstr(o.message, "GMA_ERR_OOM"));
  CHECK(stats_of(g).num_ooms == 0 && strcmp(gma_last_error(), before) == 0);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_free(g, held));
  CHECK_OK(gma_destroy(g));
}

static void declines(void) {
  obs_t o = {.answer = GMA_OOM_FAIL};
  void *held, *p;
  gma_t *g = full_allocator(&held, &o);
  void *spare = o.spare;
  o.spare = NULL; /* it frees nothing */
  CHECK_ST(gma_alloc(g, 24 * MiB, NULL, &p), GMA_ERR_OOM);
  CHECK(o.calls == 1 && stats_of(g).num_ooms == 1);
  CHECK(strcmp(o.message, gma_last_error()) == 0); /* what it saw is what the call says */
  /* A retry that fails too: reported once, the observer called once. */
  o.answer = GMA_OOM_RETRY;
  CHECK_ST(gma_alloc(g, 24 * MiB, NULL, &p), GMA_ERR_OOM);
  CHECK(o.calls == 2 && stats_of(g).num_ooms == 2);
  CHECK_OK(gma_free(g, spare));
  CHECK_OK(gma_free(g, held));
  CHECK_OK(gma_destroy(g));
}

static void batches(void) {
  obs_t o = {.answer = GMA_OOM_RETRY};
  void *held, *ptrs[3];
  gma_t *g = full_allocator(&held, &o);
  size_t sizes[3] = {8 * MiB, 8 * MiB, 8 * MiB};
  CHECK_OK(gma_alloc_batch(g, 3, sizes, NULL, ptrs));
  CHECK(o.calls == 1 && o.requested == 24 * MiB && stats_of(g).num_ooms == 0);
  for (int i = 0; i < 3; i++) CHECK_OK(gma_free(g, ptrs[i]));
  CHECK_OK(gma_free(g, held));
  CHECK_OK(gma_destroy(g));
}

static void allocates_inside(void) {
  obs_t o = {.answer = GMA_OOM_RETRY, .allocate = true, .unset_inside = true};
  void *held, *p;
  gma_t *g = full_allocator(&held, &o);
  CHECK_OK(gma_alloc(g, 24 * MiB, NULL, &p)); /* the spare goes after the inner try */
  CHECK(o.calls == 1 && o.inner == GMA_ERR_OOM); /* no nested call: it failed at once */
  CHECK_OK(gma_free(g, p));
  /* It unset itself: the next OOM is reported without it. */
  CHECK_ST(gma_alloc(g, 40 * MiB, NULL, &p), GMA_ERR_OOM);
  CHECK(o.calls == 1);
  CHECK_OK(gma_free(g, held));
  CHECK_OK(gma_destroy(g));
}

/* Unset from another thread while the observer runs: the unset returns only
 * after the observer did, so its user data may be freed then. */
static atomic_int inside, release_it, unset_done;
static int slow_observer(gma_t *g, const gma_oom_info_t *info, void *user) {
  (void)g, (void)info, (void)user;
  atomic_store(&inside, 1);
  for (int i = 0; i < 5000 && !atomic_load(&release_it); i++) sleep_us(1000);
  CHECK(!atomic_load(&unset_done)); /* the unset is still waiting for this call */
  return GMA_OOM_FAIL;
}

static void *unsetter(void *arg) {
  for (int i = 0; i < 5000 && !atomic_load(&inside); i++) sleep_us(1000);
  CHECK_OK(gma_set_oom_observer(arg, NULL, NULL));
  atomic_store(&unset_done, 1);
  return NULL;
}

static void *releaser(void *arg) {
  (void)arg;
  for (int i = 0; i < 5000 && !atomic_load(&inside); i++) sleep_us(1000);
  sleep_us(50000); /* the unsetter is waiting by now */
  atomic_store(&release_it, 1);
  return NULL;
}

static void unset_while_running(void) {
  gma_t *g = sim_allocator("memory_limit:64M,worker:off");
  void *held, *p;
  CHECK_OK(gma_alloc(g, 48 * MiB, NULL, &held));
  CHECK_OK(gma_set_oom_observer(g, slow_observer, NULL));
  pthread_t u, r;
  CHECK(pthread_create(&u, NULL, unsetter, g) == 0);
  CHECK(pthread_create(&r, NULL, releaser, NULL) == 0);
  CHECK_ST(gma_alloc(g, 32 * MiB, NULL, &p), GMA_ERR_OOM);
  pthread_join(u, NULL);
  pthread_join(r, NULL);
  CHECK(atomic_load(&unset_done));
  CHECK_ST(gma_set_oom_observer(NULL, NULL, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(gma_free(g, held));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  frees_and_retries();
  declines();
  batches();
  allocates_inside();
  unset_while_running();
  printf("test_oom_observer: ok\n");
  return 0;
}
