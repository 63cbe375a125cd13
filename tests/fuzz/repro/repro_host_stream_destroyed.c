/* Reproducer of a fuzzer finding (tests/fuzz/crashes/README.md, bug A):
 * pinned host memory (gma_host_alloc) and CPU-fallback memory (gma_alloc
 * with fallback:host) whose stream was destroyed before the free.
 *
 * runtime/host/host.c, gma__host_free: the free records an event on b->stream,
 * the raw handle saved at allocation, with no check that the handle still
 * names that stream (device memory checks the stream id, host memory does
 * not). So:
 *   1. stream destroyed: the record fails, the fallback synchronize fails
 *      too, and the free returns GMA_ERR_DEVICE ("free it again"): it fails
 *      the same way forever, the block can never be freed, and gma_destroy
 *      reports it as a leak (GMA_ERR_LEAK);
 *   2. the same for a CPU-fallback block freed with gma_free;
 *   3. handle recycled by a new stream: the event is recorded on the NEW
 *      stream, completes at once, and the block is handed out again while a
 *      copy queued on the old stream still uses it (premature reuse).
 * Exits 0 when gma behaves, 1 (with a line per failed case) while the bug is
 * there. API only. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "gma.h"

static gma_t *make(int fallback) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  c.worker_off = 1;
  c.sim_capacity = 32u << 20;
  c.fallback_host = fallback;
  gma_t *g = NULL;
  if (gma_create(&c, &g) != GMA_OK) {
    fprintf(stderr, "gma_create: %s\n", gma_last_error());
    return NULL;
  }
  return g;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static int case_destroyed(void) {
  gma_t *g = make(0);
  gma_stream_t s;
  void *p;
  if (!g || gma_stream_create(g, &s) || gma_host_alloc(g, 4096, s, &p)) return 1;
  gma_stream_destroy(g, s);
  gma_status_t st = gma_host_free(g, p);
  gma_status_t st2 = st == GMA_OK ? GMA_OK : gma_host_free(g, p); /* "free it again" */
  gma_status_t dst = gma_destroy(g);
  if (st != GMA_OK || dst != GMA_OK) {
    printf("FAIL host block, stream destroyed: gma_host_free %s, again %s, gma_destroy %s\n",
           gma_status_name(st), gma_status_name(st2), gma_status_name(dst));
    return 1;
  }
  printf("ok   host block, stream destroyed\n");
  return 0;
}

static int case_fallback(void) {
  gma_t *g = make(1);
  gma_stream_t s;
  void *d, *p;
  if (!g || gma_stream_create(g, &s)) return 1;
  if (gma_alloc(g, 20u << 20, NULL, &d) || gma_alloc(g, 20u << 20, s, &p)) return 1;
  gma_pointer_info_t info = GMA_POINTER_INFO_INIT;
  gma_pointer_info(g, p, &info);
  if (info.kind != GMA_MEMORY_FALLBACK) {
    printf("skip fallback: the second 20 MiB did not come from the CPU fallback\n");
    gma_free(g, p);
    gma_free(g, d);
    gma_stream_destroy(g, s);
    gma_destroy(g);
    return 0;
  }
  gma_stream_destroy(g, s);
  gma_status_t st = gma_free(g, p);
  gma_free(g, d);
  gma_status_t dst = gma_destroy(g);
  if (st != GMA_OK || dst != GMA_OK) {
    printf("FAIL fallback block, stream destroyed: gma_free %s, gma_destroy %s\n",
           gma_status_name(st), gma_status_name(dst));
    return 1;
  }
  printf("ok   fallback block, stream destroyed\n");
  return 0;
}

static atomic_int gate, started, corrupted;
static unsigned char *copy_buf;

static void copy_kernel(void *arg) { /* a copy still using the pinned buffer */
  (void)arg;
  memset(copy_buf, 0xAB, 4096);
  atomic_store(&started, 1);
  while (!atomic_load(&gate)) sleep_us(100);
  for (int i = 0; i < 4096; i++)
    if (copy_buf[i] != 0xAB) {
      atomic_store(&corrupted, 1);
      break;
    }
}

static int case_recycled(void) {
  gma_t *g = make(0);
  gma_stream_t s, s2;
  void *p, *q;
  if (!g || gma_stream_create(g, &s) || gma_host_alloc(g, 4096, s, &p)) return 1;
  copy_buf = p;
  gma_sim_launch(g, s, copy_kernel, NULL);
  while (!atomic_load(&started)) sleep_us(100);
  gma_stream_destroy(g, s); /* the copy keeps running, as on CUDA */
  gma_stream_create(g, &s2);
  gma_status_t st = gma_host_free(g, p);
  gma_host_alloc(g, 4096, s2, &q);
  bool same = q == p;
  if (same) memset(q, 0x11, 4096); /* the new owner fills its staging buffer */
  atomic_store(&gate, 1);
  gma_stream_synchronize(g, s2);
  gma_host_free(g, q);
  gma_stream_destroy(g, s2);
  gma_destroy(g); /* waits for the old stream's copy */
  if (atomic_load(&corrupted) || st != GMA_OK) {
    printf("FAIL host block, handle recycled (%s new stream %p, old %p): free %s, the block was "
           "handed out again %s, the copy saw its data %s\n",
           s2 == s ? "same handle:" : "other handle:", s2, s, gma_status_name(st),
           same ? "while the copy ran" : "later", atomic_load(&corrupted) ? "overwritten" : "intact");
    return 1;
  }
  printf("ok   host block, handle recycled\n");
  return 0;
}

int main(void) {
  int bad = case_destroyed() + case_fallback() + case_recycled();
  return bad ? 1 : 0;
}
