/* The one hazard of the owner reclaim (docs/streams.md#the-one-hazard).
 *
 * Stream a hands eight 4 MiB blocks to stream u (gma_record_stream, then
 * gma_free on a) while u is held on the host: u's kernels, which use the
 * blocks, wait for a gate that only this thread opens. When a then asks for
 * 16 MiB, its pending blocks hold the request and more than it has
 * allocated, so under the default (reuse:auto) a takes them back behind a
 * device-side wait on u: no new device memory, and a's next kernel waits for
 * u's held work. This thread then synchronizes a before it opens the gate:
 * a program shaped like this waits for ever. Here a watchdog thread reports
 * that hang after HANG_MS and opens the gate, so the test ends either way.
 *
 * Checked: under reuse:auto the reclaim happens (no growth, one wait) and
 * the watchdog sees the hang, with no corruption; under reuse:query, the
 * mode for programs that hold streams on the host, a grows and nothing
 * hangs; and work queued on u after the frees does not hold a up (u's
 * epoch is closed at each free). */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "gma.h"
#include "simkit.h"

#define MiB ((size_t)1 << 20)
/* How long the watchdog waits: a hang that must happen is reported after
 * HANG_MS; where none may happen, only a real one outlasts NO_HANG_MS. */
#define HANG_MS 1000
#define NO_HANG_MS 30000
/* later_work_run's: below the 5 s a held pattern kernel gives up after,
 * far above what a's own work takes (milliseconds; under TSan well under
 * a second). */
#define LATER_MS 3000

typedef struct watch {
  int ms;           /* how long to wait before it opens the gate */
  atomic_int *gate; /* u's hold: opened by the watchdog on a hang */
  atomic_int done;  /* set by the main thread once a's synchronize returned */
  atomic_int hung;  /* set by the watchdog when it had to open the gate */
} watch_t;

static void *watchdog(void *arg) {
  watch_t *w = arg;
  for (int i = 0; i < w->ms && !atomic_load(&w->done); i++) sleep_us(1000);
  if (!atomic_load(&w->done)) {
    atomic_store(&w->hung, 1);
    fprintf(stderr, "watchdog: a's synchronize still waits after %d ms: it waits for u's held "
                    "work (the reclaim's hazard); opening u's hold\n",
            w->ms);
  }
  atomic_store(w->gate, 1);
  return NULL;
}

/* One run under conf. u's kernels read the eight blocks behind gate `use`;
 * with later, a kernel queued on u after the frees waits behind gate
 * `late`, and this thread opens `use` before it synchronizes a; without,
 * nothing opens `use` but the watchdog. *grew, *waits: whether a's 16 MiB
 * request made a device allocation, and the device-side waits it made;
 * *hung: whether the watchdog had to open the gate a waited behind.
 * Returns the corruptions seen. */
static int run(const char *conf, bool later, int watch_ms, bool *grew, uint64_t *waits,
               bool *hung) {
  gma_t *g = sim_allocator(conf);
  gma_stream_t a, u;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &u));
  atomic_int use = 0, late = 0, corruptions = 0;
  pattern_kernel_t ku[8], kl = {NULL, 0, 0, &late, 0, &corruptions, 0};
  void *x[8];
  for (int i = 0; i < 8; i++) CHECK_OK(gma_alloc(g, 4 * MiB, a, &x[i]));
  for (int i = 0; i < 8; i++) {
    ku[i] = (pattern_kernel_t){x[i], 4 * MiB, (uint8_t)(0x20 + i), &use, 0, &corruptions, 0};
    CHECK_OK(gma_sim_launch(g, u, pattern_kernel_run, &ku[i]));
    CHECK_OK(gma_record_stream(g, x[i], u));
    CHECK_OK(gma_free(g, x[i]));
  }
  if (later) CHECK_OK(gma_sim_launch(g, u, pattern_kernel_run, &kl)); /* after the frees */
  pattern_kernel_wait_started(&ku[0]); /* u is held from here on */
  gma_stats_t s0 = GMA_STATS_INIT, s1 = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &s0));
  CHECK(s0.pending_bytes == 32 * MiB);
  void *y;
  CHECK_OK(gma_alloc(g, 16 * MiB, a, &y));
  CHECK_OK(gma_stats(g, &s1));
  *grew = s1.num_device_allocs > s0.num_device_allocs;
  *waits = s1.num_cross_stream_waits - s0.num_cross_stream_waits;
  pattern_kernel_t ky = {y, 16 * MiB, 0xEE, NULL, 1000, &corruptions, 0};
  CHECK_OK(gma_sim_launch(g, a, pattern_kernel_run, &ky));
  if (later) atomic_store(&use, 1);
  watch_t w = {watch_ms, later ? &late : &use, 0, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, watchdog, &w) == 0);
  CHECK_OK(gma_stream_synchronize(g, a)); /* the program's wait, before it opens a gate */
  atomic_store(&w.done, 1);
  CHECK(pthread_join(t, NULL) == 0);
  *hung = atomic_load(&w.hung);
  CHECK_OK(gma_stream_synchronize(g, u));
  CHECK_OK(gma_free(g, y));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, u));
  gma_stats_t s2 = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &s2));
  CHECK(s2.allocated.current == 0 && s2.pending_bytes == 0);
  CHECK_OK(gma_destroy(g));
  return atomic_load(&corruptions);
}

int main(void) {
  bool grew, hung;
  uint64_t waits;
  /* worker:off: its timed epoch closes would close u's epoch at times of
   * their own. */
  int c = run("worker:off", false, HANG_MS, &grew, &waits, &hung);
  printf("reuse:auto: grew %d, waits %" PRIu64 ", hung %d, corruptions %d\n", grew, waits, hung, c);
  CHECK(!grew && waits == 1 && hung && c == 0);
  c = run("worker:off,reuse:query", false, NO_HANG_MS, &grew, &waits, &hung);
  printf("reuse:query: grew %d, waits %" PRIu64 ", hung %d, corruptions %d\n", grew, waits, hung,
         c);
  CHECK(grew && waits == 0 && !hung && c == 0);
  c = run("worker:off", true, LATER_MS, &grew, &waits, &hung);
  printf("work queued on u after the frees: grew %d, waits %" PRIu64 ", hung %d, "
         "corruptions %d\n", grew, waits, hung, c);
  CHECK(!grew && waits == 1 && !hung && c == 0);
  printf("ok\n");
  return 0;
}
