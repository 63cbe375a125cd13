/* The OOM retry's release, on the simulated device with the GPU cost model
 * (sim_costs:h100: a device free waits for all work queued on the device,
 * as cuMemFree does). Public API only.
 *   - only_what_is_missing: four free 12 MiB segments and 22 MiB free on
 *     the device; a 40 MiB request lacks 18 MiB, so two segments go back
 *     (largest first), not four.
 *   - others_go_on: while one thread's release waits in a device free for
 *     a kernel held on another stream, a second thread allocates from the
 *     pool: it must not wait for that free (the pool lock is not held
 *     across it). A watchdog opens the kernel's gate after 5 s, so a
 *     release under the lock shows as a 5 s allocation, not a hang. */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void only_what_is_missing(void) {
  gma_t *g = sim_allocator_ordinary("sim_capacity:100M,sim_costs:h100,bins:off,worker:off");
  void *small[4], *live, *big;
  for (int i = 0; i < 4; i++) CHECK_OK(gma_alloc(g, 12 * MiB, NULL, &small[i]));
  CHECK_OK(gma_alloc(g, 30 * MiB, NULL, &live));
  for (int i = 0; i < 4; i++) CHECK_OK(gma_free(g, small[i]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  gma_stats_t s0 = stats_of(g);
  CHECK(s0.reserved.current == 78 * MiB && s0.num_device_frees == 0);
  CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &big));
  gma_stats_t s = stats_of(g);
  CHECK(s.num_device_frees == 2); /* 18 MiB missing: two of the 12s, not four */
  CHECK(s.reserved.current == 94 * MiB && s.num_ooms == 0);
  CHECK_OK(gma_free(g, big));
  CHECK_OK(gma_free(g, live));
  CHECK_OK(gma_destroy(g));
}

typedef struct {
  gma_t *g;
  gma_status_t st;
  uint64_t ms;
} grower_t;

static void *grow_40(void *arg) {
  grower_t *w = arg;
  void *p = NULL;
  uint64_t t0 = now_ms();
  w->st = gma_alloc(w->g, 40 * MiB, NULL, &p);
  w->ms = now_ms() - t0;
  if (w->st == GMA_OK) CHECK_OK(gma_free(w->g, p));
  return NULL;
}

static atomic_int gate;
static void *watchdog(void *arg) {
  (void)arg;
  for (int i = 0; i < 5000 && !atomic_load(&gate); i++) sleep_us(1000);
  atomic_store(&gate, 1);
  return NULL;
}

static void others_go_on(void) {
  gma_t *g = sim_allocator_ordinary("sim_capacity:56M,sim_costs:h100,bins:off,worker:off");
  gma_stream_t busy;
  CHECK_OK(gma_stream_create(g, &busy));
  void *seg, *held, *small;
  CHECK_OK(gma_alloc(g, 24 * MiB, NULL, &seg));
  CHECK_OK(gma_alloc(g, 1 * MiB, busy, &held));
  CHECK_OK(gma_alloc(g, 1 * MiB, NULL, &small));
  CHECK_OK(gma_free(g, small)); /* cached in the pool: the second thread's block */
  CHECK_OK(gma_free(g, seg));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  atomic_store(&gate, 0);
  atomic_int corruptions = 0;
  pattern_kernel_t k = {.buf = held, .len = 1 * MiB, .value = 3, .gate = &gate,
                        .corruptions = &corruptions};
  CHECK_OK(gma_sim_launch(g, busy, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  pthread_t dog, t;
  CHECK(pthread_create(&dog, NULL, watchdog, NULL) == 0);
  grower_t w = {g, GMA_PENDING, 0};
  CHECK(pthread_create(&t, NULL, grow_40, &w) == 0);
  /* Until the grower's release is inside its device free (it waits for
   * the held kernel there): one device free counted as leaving. */
  for (int i = 0; i < 5000 && stats_of(g).num_oom_retries == 0; i++) sleep_us(1000);
  sleep_us(20000);
  uint64_t t0 = now_ms();
  void *p;
  CHECK_OK(gma_alloc(g, 1 * MiB, NULL, &p));
  uint64_t took = now_ms() - t0;
  CHECK(!atomic_load(&gate)); /* served while the device free still waited */
  CHECK(took < 2500);
  CHECK_OK(gma_free(g, p));
  atomic_store(&gate, 1);
  pthread_join(t, NULL);
  pthread_join(dog, NULL);
  CHECK_OK(w.st);
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_free(g, held));
  CHECK_OK(gma_stream_destroy(g, busy));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  only_what_is_missing();
  others_go_on();
  printf("test_oom_release: ok\n");
  return 0;
}
