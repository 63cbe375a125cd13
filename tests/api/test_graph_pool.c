/* API test of graph pools (gma.h's "CUDA graphs") on the simulated device,
 * which has no stream capture: pools can be made, read and released, a
 * capture is refused with GMA_ERR_UNSUPPORTED naming the device, and bad
 * handles and arguments get clear errors. Capture itself is tested on the
 * CUDA backend (tests/gpu/test_gpu_capture.c, on the fake driver in CI). */
#include <string.h>

#include "check.h"
#include "simkit.h"

int main(void) {
  gma_t *g = sim_allocator(NULL);
  gma_graph_pool_t *pool = NULL, *second = NULL;
  CHECK_OK(gma_graph_pool_create(g, &pool));
  CHECK_OK(gma_graph_pool_create(g, &second));
  CHECK(pool && second && pool != second);
  gma_graph_pool_stats_t ps = GMA_GRAPH_POOL_STATS_INIT;
  CHECK_OK(gma_graph_pool_stats(g, pool, &ps));
  CHECK(ps.id == 1 && ps.reserved_bytes == 0 && ps.chunks == 0 && ps.captures == 0);
  CHECK_OK(gma_graph_pool_stats(g, second, &ps));
  CHECK(ps.id == 2);
  gma_stats_t st = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &st));
  CHECK(st.graph_pools == 2 && st.graph_pool_bytes == 0 && st.graph_captures == 0);

  /* No capture on this device. */
  CHECK_ST(gma_capture_begin(g, NULL, pool), GMA_ERR_UNSUPPORTED);
  CHECK(strstr(gma_last_error(), "sim") && strstr(gma_last_error(), "device:cuda"));
  CHECK_ST(gma_capture_end(g, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "gma_capture_begin"));

  /* Bad arguments. */
  CHECK_ST(gma_graph_pool_create(g, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_graph_pool_create(NULL, &pool), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_capture_begin(g, NULL, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_graph_pool_stats(g, pool, NULL), GMA_ERR_INVALID_ARGUMENT);
  gma_graph_pool_stats_t tiny = {.size = 1};
  CHECK_ST(gma_graph_pool_stats(g, pool, &tiny), GMA_ERR_INVALID_ARGUMENT);
  int not_a_pool = 0;
  CHECK_ST(gma_graph_pool_release(g, (gma_graph_pool_t *)&not_a_pool), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "not a graph pool of this allocator"));

  /* A pool belongs to its allocator. */
  gma_t *other = sim_allocator(NULL);
  CHECK_ST(gma_graph_pool_release(other, pool), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(gma_destroy(other));

  /* Ordinary allocations are unaffected by pools existing. */
  void *p = NULL;
  CHECK_OK(gma_alloc(g, 4096, NULL, &p));
  CHECK_OK(gma_free(g, p));
  CHECK_ST(gma_free(g, p), GMA_ERR_DOUBLE_FREE);

  /* Released: gone, and refused afterwards. */
  CHECK_OK(gma_graph_pool_release(g, pool));
  CHECK_ST(gma_graph_pool_release(g, pool), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_graph_pool_stats(g, pool, &ps), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(gma_stats(g, &st));
  CHECK(st.graph_pools == 1);
  /* One left at destroy: freed with the allocator, no leak (nothing in it). */
  CHECK_OK(gma_destroy(g));
  return 0;
}
