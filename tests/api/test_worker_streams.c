/* The worker's timed trimming closes the open epochs of streams that hold
 * freed memory by recording events on them, but never on the legacy default
 * stream: an event there waits for every blocking stream, work the program
 * never queued. Memory freed on the legacy stream is gated by the program's
 * own next call instead. A user stream's epoch is closed by the worker
 * (the control). Public API only. */
#include <stdint.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)

/* Frees a block on `on` while a gated kernel holds the stream, then lets
 * the worker tick (every 2 ms) for 100 ms with no call from this thread:
 * returns the epoch events recorded meanwhile. */
static uint64_t worker_records(gma_t *g, gma_stream_t on) {
  void *p;
  CHECK_OK(gma_alloc(g, 1 * MiB, on, &p));
  atomic_int gate = 0, corruptions = 0;
  pattern_kernel_t k = {.buf = p, .len = 1 * MiB, .value = 9, .gate = &gate,
                        .corruptions = &corruptions};
  CHECK_OK(gma_sim_launch(g, on, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  CHECK_OK(gma_free(g, p));
  uint64_t before = stats_of(g).num_epoch_events;
  sleep_us(100000);
  uint64_t recorded = stats_of(g).num_epoch_events - before;
  atomic_store(&gate, 1);
  CHECK_OK(gma_stream_synchronize(g, on));
  CHECK(atomic_load(&corruptions) == 0);
  return recorded;
}

int main(void) {
  gma_t *g = sim_allocator("trim_interval_ms:2,bins:off");
  gma_stream_t user;
  CHECK_OK(gma_stream_create(g, &user));
  CHECK(worker_records(g, user) >= 1); /* the control: the worker closes a user stream's epoch */
  CHECK(worker_records(g, NULL) == 0); /* never on the legacy stream */
  CHECK(worker_records(g, (gma_stream_t)(uintptr_t)0x1) == 0);
  CHECK_OK(gma_stream_destroy(g, user));
  CHECK_OK(gma_destroy(g));
  printf("test_worker_streams: ok\n");
  return 0;
}
