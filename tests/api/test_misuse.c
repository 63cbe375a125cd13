/* Misuse gets a clear error, never a crash or a silent success: a destroyed
 * allocator's handle, a stale pointer whose memory now belongs to an async
 * request nobody collected, record_stream on a freed pointer, interior and
 * foreign pointers, out-of-range configuration; and the age and leak reports
 * (gma_find_old_allocations, gma_live_report). Public API only. Calling into
 * an allocator while another thread destroys it is not allowed, except on
 * its futures (test_destroy_waiters.c tests that); other calls are detected
 * only after gma_destroy returned. */
#include <stdint.h>
#include <string.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)

static void destroyed_handle(void) {
  gma_t *g = sim_allocator(NULL);
  void *p = NULL;
  CHECK_OK(gma_alloc(g, 4096, NULL, &p));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
  /* Every kind of call on the stale handle: an error that says so. */
  CHECK_ST(gma_alloc(g, 4096, NULL, &p), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "gma_alloc: the allocator was destroyed") != NULL);
  CHECK_ST(gma_free(g, p), GMA_ERR_INVALID_ARGUMENT);
  gma_stats_t s = GMA_STATS_INIT;
  CHECK_ST(gma_stats(g, &s), GMA_ERR_INVALID_ARGUMENT);
  gma_future_t *f = NULL;
  CHECK_ST(gma_alloc_async(g, 4096, NULL, NULL, &f), GMA_ERR_INVALID_ARGUMENT);
  CHECK(f == NULL);
  CHECK_ST(gma_trim(g, 0), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_host_alloc(g, 64, NULL, &p), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_trace_start(g, "/tmp/x.csv"), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_destroy(g), GMA_ERR_INVALID_ARGUMENT); /* twice */
  CHECK(strstr(gma_last_error(), "gma_destroy: the allocator was destroyed") != NULL);
  CHECK(strcmp(gma_device_name(g), "none") == 0);
  /* Something that was never an allocator. */
  static _Alignas(64) uint64_t junk[8192]; /* as large and aligned as an allocator */
  CHECK_ST(gma_alloc((gma_t *)junk, 64, NULL, &p), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "is not an allocator gma_create made") != NULL);
}

/* A pointer freed and then handed to an async request (whose future nobody
 * waited for yet) must not be freed again through the stale copy: that would
 * free the request's memory under it. */
static void stale_pointer_held_by_future(void) {
  gma_t *g = sim_allocator(NULL);
  void *p = NULL;
  CHECK_OK(gma_alloc(g, 8 * MiB, NULL, &p)); /* above bin_max: the worker serves the request */
  CHECK_OK(gma_free(g, p));
  gma_future_t *f = NULL;
  CHECK_OK(gma_alloc_async(g, 8 * MiB, NULL, NULL, &f));
  for (int i = 0; i < 5000 && gma_future_poll(f) == GMA_PENDING; i++) sleep_us(200);
  CHECK_OK(gma_future_poll(f)); /* complete, not collected */
  gma_stats_t s = stats_of(g);
  CHECK(s.allocated.current == 8 * MiB);
  CHECK_ST(gma_free(g, p), GMA_ERR_INVALID_POINTER); /* the same block, held by the future */
  CHECK(strstr(gma_last_error(), "belongs to an async request") != NULL);
  CHECK(stats_of(g).allocated.current == 8 * MiB); /* nothing changed */
  CHECK_OK(gma_future_release(f)); /* frees it */
  CHECK(stats_of(g).allocated.current == 0);
  /* Collected, the memory is the caller's: freeing it is fine. */
  void *q = NULL;
  CHECK_OK(gma_alloc_async(g, 8 * MiB, NULL, NULL, &f));
  CHECK_OK(gma_future_wait(f, 5000000000ull, &q));
  CHECK_OK(gma_future_release(f)); /* does not free what was collected */
  CHECK_OK(gma_free(g, q));
  CHECK_ST(gma_free(g, q), GMA_ERR_DOUBLE_FREE);
  CHECK_OK(gma_destroy(g));
}

static void bad_pointers_and_config(void) {
  gma_t *g = sim_allocator(NULL);
  void *p = NULL;
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_alloc(g, 64 * 1024, NULL, &p));
  CHECK_ST(gma_free(g, (char *)p + 512), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "interior pointer") != NULL);
  int local;
  CHECK_ST(gma_free(g, &local), GMA_ERR_INVALID_POINTER);
  CHECK_ST(gma_record_stream(g, &local, s), GMA_ERR_INVALID_POINTER);
  CHECK_OK(gma_free(g, p));
  CHECK_ST(gma_record_stream(g, p, s), GMA_ERR_INVALID_POINTER); /* freed */
  CHECK(strstr(gma_last_error(), "not live") != NULL);
  CHECK_ST(gma_free(g, p), GMA_ERR_DOUBLE_FREE);
  gma_stats_t st = stats_of(g);
  CHECK(st.allocated.current == 0 && st.num_frees == 1);
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
  /* Sizes near SIZE_MAX must not wrap when rounded (a fuzzer finding). */
  g = sim_allocator(NULL);
  size_t huge[2] = {4096, SIZE_MAX - 511}, one[1] = {SIZE_MAX};
  void *ptrs[2];
  gma_future_t *f = NULL;
  CHECK_ST(gma_alloc_batch_async(g, 1, one, NULL, ptrs, NULL, &f), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_alloc_batch_async(g, 2, huge, NULL, ptrs, NULL, &f), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_alloc_batch(g, 1, one, NULL, ptrs), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_alloc_batch(g, 2, huge, NULL, ptrs), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_alloc(g, SIZE_MAX, NULL, &p), GMA_ERR_INVALID_SIZE);
  CHECK(f == NULL && stats_of(g).allocated.current == 0);
  CHECK_OK(gma_destroy(g));
  /* Configuration is checked whole when it is parsed (issue 17: ring_size:3
   * used to pass gma_config_parse and fail only at gma_create), and the same
   * checks refuse a struct filled in by hand at gma_create. */
  gma_config_t c = GMA_CONFIG_INIT;
  CHECK_ST(gma_config_parse(&c, "bin_depth:0"), GMA_ERR_CONFIG);
  CHECK_ST(gma_config_parse(&c, "ring_size:3"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "ring_size") && strstr(gma_last_error(), "power of 2"));
  CHECK(c.ring_size == 0); /* unchanged */
  c.ignore_env = 1;
  c.device = GMA_DEVICE_SIM;
  c.ring_size = 3; /* the same value set in C */
  gma_t *bad = NULL;
  CHECK_ST(gma_create(&c, &bad), GMA_ERR_CONFIG);
  CHECK(bad == NULL && strstr(gma_last_error(), "ring_size") != NULL &&
        strstr(gma_last_error(), "power of 2") != NULL);
}

static void ages_and_live_report(void) {
  gma_t *g = sim_allocator("trim_interval_ms:5");
  void *old = NULL, *young = NULL;
  CHECK_OK(gma_alloc_tagged(g, 3 * MiB, NULL, "weights", &old));
  sleep_us(120000);
  CHECK_OK(gma_alloc(g, 1000, NULL, &young));
  gma_allocation_info_t v[4];
  size_t n = 99;
  CHECK_OK(gma_find_old_allocations(g, 60000000ull, v, 4, &n)); /* >= 60 ms */
  CHECK(n == 1 && v[0].ptr == old && v[0].requested == 3 * MiB && v[0].block_size == 3 * MiB &&
        strcmp(v[0].tag, "weights") == 0 && v[0].stream == NULL);
  CHECK(v[0].age_ns >= 60000000ull && v[0].age_ns < 10000000000ull);
  CHECK_OK(gma_find_old_allocations(g, 0, NULL, 0, &n)); /* count only */
  CHECK(n == 2);
  CHECK_OK(gma_find_old_allocations(g, 0, v, 4, &n));
  CHECK(n == 2 && v[0].ptr == old && v[1].ptr == young); /* oldest first */
  CHECK_ST(gma_find_old_allocations(g, 0, NULL, 4, &n), GMA_ERR_INVALID_ARGUMENT);
  char buf[2048];
  CHECK_OK(gma_live_report(g, 10, buf, sizeof buf));
  CHECK(strncmp(buf, "2 live allocations, 3146752 bytes\n", 34) == 0);
  CHECK(strstr(buf, "tag weights") && strstr(buf, "tag untagged") && strstr(buf, "oldest:"));
  CHECK(strstr(buf, "tag weights") < strstr(buf, "tag untagged"));
  char small[16];
  CHECK_ST(gma_live_report(g, 10, small, sizeof small), GMA_ERR_INVALID_SIZE);
  CHECK(strstr(gma_last_error(), "the report needs") != NULL);
  CHECK_OK(gma_free(g, old));
  CHECK_OK(gma_free(g, young));
  CHECK_OK(gma_live_report(g, 10, buf, sizeof buf));
  CHECK(strcmp(buf, "0 live allocations, 0 bytes\n") == 0);
  CHECK_OK(gma_destroy(g));
}

/* A double free of a block the worker is moving (cached -> free, coalesced)
 * meanwhile: the lock-free free path must read nothing but the block's state
 * before it knows the block is live, or it races with the worker's writes
 * under the pool lock. The main thread does not synchronize with the worker
 * between the worker's move and the second free, so TSan reports such a read
 * every time (found by TSan replaying the fuzzer's campaign corpus). */
static void double_free_while_worker_moves_block(void) {
  gma_t *g = sim_allocator("trim_interval_ms:1,release_threshold:1G");
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  for (int round = 0; round < 20; round++) {
    void *a, *b;
    CHECK_OK(gma_alloc(g, 2 * MiB, s, &a)); /* above bin_max: freed into the stream's cache */
    CHECK_OK(gma_alloc(g, 3 * MiB, s, &b));
    CHECK_OK(gma_free(g, a));
    CHECK_OK(gma_free(g, b));
    sleep_us(5000); /* the worker's ticks make them FREE and coalesce them */
    CHECK_ST(gma_free(g, a), GMA_ERR_DOUBLE_FREE);
    CHECK_ST(gma_free(g, b), GMA_ERR_DOUBLE_FREE);
  }
  gma_stats_t st = stats_of(g);
  CHECK(st.allocated.current == 0 && st.num_frees == 40);
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  double_free_while_worker_moves_block();
  destroyed_handle();
  stale_pointer_held_by_future();
  bad_pointers_and_config();
  ages_and_live_report();
  printf("test_misuse: ok\n");
  return 0;
}
