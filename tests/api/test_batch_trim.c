/* gma_alloc_batch (contiguous placement, all or nothing under injected device
 * failures and real OOM, each block freed on its own), gma_trim (keeps at most
 * keep_bytes, never touches live or pending memory; the OOM retry's
 * give-back counts as trimmed) and gma_reserve (warm-up that makes the first
 * allocations bin hits). Public API only. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "simkit.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static void batch_is_contiguous(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  size_t sizes[64];
  for (int i = 0; i < 64; i++) sizes[i] = 1000 + (size_t)i * 300; /* 1000 .. 19900 bytes */
  void *ptrs[64];
  CHECK_OK(gma_alloc_batch(g, 64, sizes, NULL, ptrs));
  char *at = ptrs[0];
  for (int i = 0; i < 64; i++) {
    CHECK((uintptr_t)ptrs[i] % 256 == 0);
    CHECK((char *)ptrs[i] == at); /* one after another */
    at += (sizes[i] + 511) / 512 * 512;
  }
  gma_stats_t s = stats_of(g);
  CHECK(s.num_batches == 1 && s.num_batches_split == 0 && s.num_allocs == 64);
  CHECK(s.num_device_allocs == 1);
  CHECK(s.hits_bin + s.hits_stream + s.hits_pool + s.hits_device == s.num_allocs);
  uint64_t req = 0;
  for (int i = 0; i < 64; i++) req += sizes[i];
  CHECK(s.requested.current == req);
  /* Each block may be freed on its own, in any order. */
  for (int i = 0; i < 64; i += 2) CHECK_OK(gma_free(g, ptrs[i]));
  for (int i = 1; i < 64; i += 2) CHECK_OK(gma_free(g, ptrs[i]));
  CHECK_ST(gma_free(g, ptrs[5]), GMA_ERR_DOUBLE_FREE);
  s = stats_of(g);
  CHECK(s.allocated.current == 0 && s.num_frees == 64);
  CHECK_OK(gma_destroy(g));
}

/* A batch that needs a new segment, whose device allocation fails: nothing
 * stays allocated, the pointers are untouched, the allocator still works. */
static void batch_all_or_nothing_injected(void) {
  for (uint64_t fail_at = 1; fail_at <= 3; fail_at++) {
    char conf[64];
    snprintf(conf, sizeof conf, "sim_fail_alloc:%llu", (unsigned long long)fail_at);
    gma_t *g = sim_allocator_ordinary(conf);
    void *warm[2] = {NULL, NULL};
    for (uint64_t k = 1; k < fail_at; k++) CHECK_OK(gma_alloc(g, 30 * MiB, NULL, &warm[k - 1]));
    size_t sizes[3] = {8 * MiB, 8 * MiB, 8 * MiB};
    void *ptrs[3] = {(void *)1, (void *)2, (void *)3};
    gma_stats_t before = stats_of(g);
    CHECK_ST(gma_alloc_batch(g, 3, sizes, NULL, ptrs), GMA_ERR_DEVICE);
    CHECK(ptrs[0] == (void *)1 && ptrs[1] == (void *)2 && ptrs[2] == (void *)3);
    gma_stats_t after = stats_of(g);
    CHECK(after.allocated.current == before.allocated.current);
    CHECK(after.num_allocs == before.num_allocs && after.num_batches == 0);
    CHECK_OK(gma_alloc_batch(g, 3, sizes, NULL, ptrs)); /* the fault fired once */
    for (int i = 0; i < 3; i++) CHECK_OK(gma_free(g, ptrs[i]));
    for (int k = 0; k < 2; k++) CHECK_OK(gma_free(g, warm[k]));
    CHECK_OK(gma_destroy(g));
  }
}

/* Memory already held, but only in pieces: the batch goes into the pieces
 * rather than into a new segment (a training step's gradient batch would
 * otherwise leave a segment behind every step). */
static void batch_prefers_held_pieces(void) {
  gma_t *g = sim_allocator_ordinary("worker:off");
  void *x1, *x2, *y;
  CHECK_OK(gma_alloc(g, 8 * MiB, NULL, &x1)); /* one shared 20 MiB segment: [0, 8) */
  CHECK_OK(gma_alloc(g, 8 * MiB, NULL, &x2)); /* [8, 16) */
  CHECK_OK(gma_alloc(g, 4 * MiB, NULL, &y));  /* [16, 20) */
  CHECK_OK(gma_free(g, x1));
  CHECK_OK(gma_free(g, y)); /* 12 MiB held, in pieces of 8 and 4 */
  gma_stats_t before = stats_of(g);
  CHECK(before.num_device_allocs == 1);
  size_t sizes[2] = {6 * MiB, 4 * MiB}; /* 10 MiB: no contiguous room */
  void *ptrs[2];
  CHECK_OK(gma_alloc_batch(g, 2, sizes, NULL, ptrs));
  gma_stats_t after = stats_of(g);
  CHECK(after.num_device_allocs == 1 && after.reserved.current == before.reserved.current);
  CHECK(after.num_batches == 1 && after.num_batches_split == 1);
  CHECK(ptrs[0] == x1 && ptrs[1] == y);
  CHECK(after.hits_stream + after.hits_pool == before.hits_stream + before.hits_pool + 2);
  CHECK_OK(gma_free(g, ptrs[0]));
  CHECK_OK(gma_free(g, ptrs[1]));
  CHECK_OK(gma_free(g, x2));
  CHECK_OK(gma_destroy(g));
}

/* No contiguous room, but room block by block: the batch is placed one by
 * one. No room at all: OOM, and the blocks placed so far are given back. */
static void batch_split_and_oom(void) {
  /* Requests below 10 MiB share 20 MiB segments: a,b go in one, c,d in
   * another (each with a 2 MiB tail). Freeing a and c leaves two 9 MiB holes
   * in segments that stay (b and d are live), and the device has 4 MiB left:
   * 2 x 8 MiB has no contiguous room anywhere, but fits block by block. */
  gma_t *g = sim_allocator_ordinary("sim_capacity:44M,bins:off");
  void *a, *b, *c, *d;
  CHECK_OK(gma_alloc(g, 9 * MiB, NULL, &a));
  CHECK_OK(gma_alloc(g, 9 * MiB, NULL, &b));
  CHECK_OK(gma_alloc(g, 9 * MiB, NULL, &c));
  CHECK_OK(gma_alloc(g, 9 * MiB, NULL, &d));
  CHECK(stats_of(g).num_segments == 2);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, c));
  size_t sizes[2] = {8 * MiB, 8 * MiB};
  void *ptrs[2];
  CHECK_OK(gma_alloc_batch(g, 2, sizes, NULL, ptrs));
  gma_stats_t s = stats_of(g);
  CHECK(s.num_batches == 1 && s.num_batches_split == 1 && s.allocated.current == 34 * MiB);
  CHECK((ptrs[0] == a && ptrs[1] == c) || (ptrs[0] == c && ptrs[1] == a));
  /* No room at all for the third block: OOM, and the two placed before it
   * are given back. */
  size_t big[3] = {MiB, MiB, 30 * MiB};
  void *more[3] = {NULL, NULL, NULL};
  gma_stats_t before = stats_of(g);
  CHECK_ST(gma_alloc_batch(g, 3, big, NULL, more), GMA_ERR_OOM);
  CHECK(strstr(gma_last_error(), "cannot allocate") != NULL);
  s = stats_of(g);
  CHECK(s.allocated.current == before.allocated.current && s.num_allocs == before.num_allocs);
  CHECK(s.num_batches == 1 && more[0] == NULL && more[1] == NULL);
  void *e;
  CHECK_OK(gma_alloc(g, MiB, NULL, &e)); /* still usable */
  CHECK_OK(gma_free(g, e));
  CHECK_OK(gma_free(g, ptrs[0]));
  CHECK_OK(gma_free(g, ptrs[1]));
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, d));
  CHECK_OK(gma_destroy(g));
}

static void batch_bad_input(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:16M");
  size_t sizes[2] = {MiB, 0};
  void *ptrs[2];
  CHECK_ST(gma_alloc_batch(g, 2, sizes, NULL, ptrs), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_alloc_batch(g, 0, sizes, NULL, ptrs), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_alloc_batch(g, 1, NULL, NULL, ptrs), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_alloc_batch(NULL, 1, sizes, NULL, ptrs), GMA_ERR_INVALID_ARGUMENT);
  size_t huge[2] = {10 * MiB, 10 * MiB}; /* each fits, together they never can */
  CHECK_ST(gma_alloc_batch(g, 2, huge, NULL, ptrs), GMA_ERR_INVALID_SIZE);
  CHECK(stats_of(g).num_allocs == 0);
  CHECK_OK(gma_destroy(g));
}

/* gma_trim keeps at most keep_bytes of cache; live memory and memory a
 * stream may still use (a held kernel) stays. */
static void trim_keeps(void) {
  gma_t *g = sim_allocator_ordinary("bins:off");
  void *p[4];
  for (int i = 0; i < 4; i++) CHECK_OK(gma_alloc(g, 30 * MiB, NULL, &p[i])); /* own segments */
  for (int i = 0; i < 3; i++) CHECK_OK(gma_free(g, p[i]));
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 120 * MiB && s.allocated.current == 30 * MiB);
  CHECK_OK(gma_trim(g, 40 * MiB)); /* 90 MiB cached: two segments go, 30 stay */
  s = stats_of(g);
  CHECK(s.reserved.current == 60 * MiB && s.bytes_trimmed == 60 * MiB && s.trims_explicit == 1);
  CHECK_OK(gma_trim(g, 0));
  s = stats_of(g);
  CHECK(s.reserved.current == 30 * MiB && s.allocated.current == 30 * MiB);

  /* A block freed while its stream's kernel still runs is not trimmed. */
  gma_stream_t st;
  CHECK_OK(gma_stream_create(g, &st));
  atomic_int gate = 0, corruptions = 0;
  void *q;
  CHECK_OK(gma_alloc(g, 30 * MiB, st, &q));
  pattern_kernel_t k = {q, 64 * KiB, 0x5a, &gate, 0, &corruptions, 0};
  CHECK_OK(gma_sim_launch(g, st, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_trim(g, 0));
  s = stats_of(g);
  CHECK(s.reserved.current == 60 * MiB); /* q's segment is still in use on st */
  atomic_store(&gate, 1);
  CHECK_OK(gma_stream_synchronize(g, st));
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_trim(g, 0));
  s = stats_of(g);
  CHECK(s.reserved.current == 30 * MiB);
  CHECK_OK(gma_free(g, p[3]));
  CHECK_OK(gma_empty_cache(g));
  CHECK(stats_of(g).reserved.current == 0);
  CHECK_OK(gma_stream_destroy(g, st));
  CHECK_OK(gma_destroy(g));
}

/* gma_reserve fills the bins: the workload's first allocations are bin hits
 * and need no device allocation. */
static void reserve_warms_bins(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  gma_stream_t st;
  CHECK_OK(gma_stream_create(g, &st));
  size_t sizes[3] = {4 * KiB, 64 * KiB, MiB};
  size_t counts[3] = {8, 4, 2};
  CHECK_OK(gma_reserve(g, st, 3, sizes, counts));
  gma_stats_t before = stats_of(g);
  CHECK(before.allocated.current == 0 && before.stream_cached_bytes >= 8 * 4 * KiB);
  void *p[14];
  int n = 0;
  for (int i = 0; i < 3; i++)
    for (size_t k = 0; k < counts[i]; k++) CHECK_OK(gma_alloc(g, sizes[i], st, &p[n++]));
  gma_stats_t after = stats_of(g);
  CHECK(after.hits_bin - before.hits_bin == 14);
  CHECK(after.num_device_allocs == before.num_device_allocs);
  for (int i = 0; i < n; i++) CHECK_OK(gma_free(g, p[i]));
  CHECK_ST(gma_reserve(g, st, 1, sizes, NULL), GMA_ERR_INVALID_ARGUMENT);
  size_t too_big[1] = {(size_t)1 << 50};
  size_t one[1] = {1};
  CHECK_ST(gma_reserve(g, st, 1, too_big, one), GMA_ERR_INVALID_SIZE);
  CHECK(strstr(gma_last_error(), "nothing was kept") != NULL);
  CHECK_OK(gma_stream_destroy(g, st));
  CHECK_OK(gma_destroy(g));
}

/* The OOM retry gives free segments back before it fails: bytes_trimmed
 * counts them, as it counts growable chunks given back there and every trim. */
static void oom_retry_counts_trimmed(void) {
  gma_t *g = sim_allocator_ordinary("bins:off,memory_limit:64M");
  void *a, *b, *c;
  CHECK_OK(gma_alloc(g, 30 * MiB, NULL, &a)); /* own segments */
  CHECK_OK(gma_alloc(g, 20 * MiB, NULL, &b));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &c)); /* 14 MiB of room: a's segment must go */
  gma_stats_t s = stats_of(g);
  CHECK(s.num_oom_retries == 1 && s.num_ooms == 0);
  CHECK(s.bytes_trimmed == 30 * MiB && s.reserved.current == 60 * MiB);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_destroy(g));
}

/* gma_trim gives back as little beyond keep_bytes as it can: of the free
 * segments that bring the cache to keep alone, the smallest (not the
 * largest, which gave back 80 MiB where 30 did); with growable segments,
 * only the last chunks of a free run (it gave back a whole 120 MiB run). */
static void trim_gives_back_least(void) {
  gma_t *g = sim_allocator_ordinary("bins:off");
  size_t sz[3] = {12 * MiB, 30 * MiB, 80 * MiB};
  void *p[3];
  for (int i = 0; i < 3; i++) CHECK_OK(gma_alloc(g, sz[i], NULL, &p[i])); /* own segments */
  for (int i = 0; i < 3; i++) CHECK_OK(gma_free(g, p[i]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK(stats_of(g).reserved.current == 122 * MiB);
  CHECK_OK(gma_trim(g, 100 * MiB)); /* 22 MiB to go: the 30 MiB segment */
  gma_stats_t s = stats_of(g);
  printf("ordinary: keep 100 of 122 MiB cached -> %" PRIu64 " MiB\n", s.reserved.current / MiB);
  CHECK(s.reserved.current == 92 * MiB);
  CHECK_OK(gma_destroy(g));

  g = sim_allocator_ordinary("bins:off,expandable_segments:true");
  for (int i = 0; i < 3; i++) CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &p[i])); /* a chunk each */
  for (int i = 0; i < 3; i++) CHECK_OK(gma_free(g, p[i]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  s = stats_of(g);
  CHECK(s.reserved.current == 120 * MiB && s.num_segments == 1);
  CHECK_OK(gma_trim(g, 70 * MiB)); /* 50 MiB to go: the last two chunks */
  s = stats_of(g);
  printf("growable: keep 70 of 120 MiB cached -> %" PRIu64 " MiB\n", s.reserved.current / MiB);
  CHECK(s.reserved.current == 40 * MiB && s.bytes_trimmed == 80 * MiB);
  void *q;
  CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &q)); /* what stayed serves a request */
  CHECK(stats_of(g).reserved.current == 40 * MiB);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  batch_is_contiguous();
  batch_all_or_nothing_injected();
  batch_prefers_held_pieces();
  batch_split_and_oom();
  batch_bad_input();
  trim_keeps();
  trim_gives_back_least();
  reserve_warms_bins();
  oom_retry_counts_trimmed();
  printf("test_batch_trim: ok\n");
  return 0;
}
