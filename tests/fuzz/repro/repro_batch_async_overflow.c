/* Reproducer of a fuzzer finding (tests/fuzz/crashes/README.md, bug B):
 * gma_alloc_batch_async accepts sizes near SIZE_MAX.
 *
 * runtime/worker/future.c, gma_alloc_batch_async: the check is
 *     total += ((uint64_t)sizes[i] + 511) / 512 * 512;
 *     if (sizes[i] == 0 || total > g->cfg.memory_limit) -> GMA_ERR_INVALID_SIZE
 * Both the rounding (SIZE_MAX + 511 wraps to 510, rounded to 0) and the sum
 * (SIZE_MAX - 511 rounds to 2^64 - 512, and the total wraps) overflow, and
 * there is no per-block `sizes[i] > memory_limit` test as gma_alloc_batch
 * has (runtime/api/api.c). So:
 *   1. n = 1, {SIZE_MAX}: accepted, and the future completes with GMA_OK and a
 *      block of 0 bytes (pool invariant "size > 0" broken; a debug build
 *      aborts in gma__pool_is_valid, a release build hands out a pointer for
 *      "SIZE_MAX bytes" that gma_destroy then reports as leaked);
 *   2. n = 2, {4096, SIZE_MAX - 511}: accepted, and the worker fails it with
 *      GMA_ERR_TIMEOUT about "3584 bytes" after the deadline.
 * Both must fail at once with GMA_ERR_INVALID_SIZE, as gma_alloc_async and
 * gma_alloc_batch do. Exits 0 when gma behaves, 1 while the bug is there. */
#include <stdint.h>
#include <stdio.h>

#include "gma.h"

static int one(gma_t *g, size_t n, const size_t *sizes, const char *what) {
  void *ptrs[2] = {0, 0};
  gma_future_t *f = NULL;
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.timeout_ns = 1000000; /* 1 ms: a request that waits for memory fails fast */
  gma_status_t st = gma_alloc_batch_async(g, n, sizes, NULL, ptrs, &o, &f);
  if (st == GMA_ERR_INVALID_SIZE) {
    printf("ok   %s: GMA_ERR_INVALID_SIZE at once\n", what);
    return 0;
  }
  gma_status_t done = st == GMA_OK ? gma_future_wait(f, UINT64_MAX, NULL) : st;
  printf("FAIL %s: gma_alloc_batch_async returned %s, the future %s (%s)\n", what,
         gma_status_name(st), gma_status_name(done), gma_last_error());
  if (f) gma_future_release(f);
  return 1;
}

int main(void) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  c.sim_capacity = 64u << 20;
  gma_t *g = NULL;
  if (gma_create(&c, &g) != GMA_OK) return 2;
  const size_t max[1] = {SIZE_MAX}, wrap[2] = {4096, SIZE_MAX - 511};
  int bad = one(g, 1, max, "{SIZE_MAX}") + one(g, 2, wrap, "{4096, SIZE_MAX - 511}");
  gma_status_t dst = gma_destroy(g);
  if (dst != GMA_OK) {
    printf("FAIL gma_destroy: %s\n", gma_status_name(dst));
    bad++;
  }
  return bad ? 1 : 0;
}
