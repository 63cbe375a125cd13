/* Premature-reuse detection, and proof that the detector works: each scenario
 * runs once with gma's gating (no corruption allowed) and once with the gate
 * removed by a test-only switch (the corruption must be caught). A scenario
 * whose planted-bug run stays clean would be a test that cannot fail. */
#include "api/allocator.h"
#include "core/internal.h"
#include "simkit.h"

typedef struct outcome {
  int corruptions;
  int reused_same_address;
} outcome_t;

/* One premature-reuse scenario on streams A, B, C (0, 1, 2): X is allocated
 * on A and used by a held kernel on holder; record_stream names X + offset
 * for stream recorded (none when -1), whose work is then finished if
 * recorded_done; X is freed; then taker allocates len bytes and writes
 * them. Gating must keep X away from taker until the held kernel finished. */
typedef struct scenario {
  int holder, recorded, taker;
  bool recorded_done;
  size_t len, offset;
  uint8_t pattern; /* the held kernel's; taker writes pattern ^ 0x10 */
} scenario_t;

static outcome_t run_scenario(const scenario_t *sc, unsigned test_flags) {
  gma_t *g = sim_allocator_ordinary(NULL);
  gma__pool_of(g)->test_flags = test_flags;
  gma_stream_t st[3];
  for (int i = 0; i < 3; i++) CHECK_OK(gma_stream_create(g, &st[i]));
  atomic_int gate = 0, corruptions = 0;
  void *x, *y;
  CHECK_OK(gma_alloc(g, sc->len, st[0], &x));
  pattern_kernel_t kh = {x, sc->len, sc->pattern, &gate, 0, &corruptions, 0};
  CHECK_OK(gma_sim_launch(g, st[sc->holder], pattern_kernel_run, &kh));
  pattern_kernel_wait_started(&kh);
  if (sc->recorded >= 0) CHECK_OK(gma_record_stream(g, (char *)x + sc->offset, st[sc->recorded]));
  CHECK_OK(gma_free(g, x));
  if (sc->recorded >= 0 && sc->recorded_done) CHECK_OK(gma_stream_synchronize(g, st[sc->recorded]));

  CHECK_OK(gma_alloc(g, sc->len, st[sc->taker], &y));
  pattern_kernel_t kt = {y, sc->len, (uint8_t)(sc->pattern ^ 0x10), NULL, 0, &corruptions, 0};
  CHECK_OK(gma_sim_launch(g, st[sc->taker], pattern_kernel_run, &kt));
  CHECK_OK(gma_stream_synchronize(g, st[sc->taker]));
  atomic_store(&gate, 1);
  CHECK_OK(gma_stream_synchronize(g, st[sc->holder]));

  outcome_t o = {atomic_load(&corruptions), x == y};
  CHECK_OK(gma_free(g, y));
  for (int i = 0; i < 3; i++) CHECK_OK(gma_stream_destroy(g, st[i]));
  CHECK_OK(gma_destroy(g));
  return o;
}

/* B uses X (held kernel, record_stream), A frees it and allocates again.
 * record_stream names X by X + offset: any pointer inside a live
 * allocation records the whole allocation (issue 17; PyTorch records a
 * view's storage, whose data pointer may lie inside the block). */
static outcome_t record_stream_scenario(unsigned test_flags, size_t offset) {
  scenario_t sc = {.holder = 1, .recorded = 1, .taker = 0, .len = 64 << 10, .offset = offset,
                   .pattern = 0xB0};
  return run_scenario(&sc, test_flags);
}

/* A's own held kernel uses X; B allocates: epoch gating keeps X cached on
 * A until A's work is done. */
static outcome_t epoch_scenario(unsigned test_flags) {
  scenario_t sc = {.holder = 0, .recorded = -1, .taker = 1, .len = 256 << 10, .pattern = 0xA1};
  return run_scenario(&sc, test_flags);
}

/* A's held kernel uses X, and B too (record_stream), whose work is done;
 * C allocates: its slow path settles pending blocks (B's gate has passed)
 * and must not hand X to C while A's kernel still runs. */
static outcome_t owner_busy_scenario(unsigned test_flags) {
  scenario_t sc = {.holder = 0, .recorded = 1, .recorded_done = true, .taker = 2,
                   .len = 256 << 10, .pattern = 0xA2};
  return run_scenario(&sc, test_flags);
}

/* Once A's and B's work is done, the same block is reused across streams:
 * gating must delay reuse, not forbid it. The block fills its segment, so
 * nothing else fits and the allocator must look at its pending blocks. */
static void reuse_after_completion(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  void *x, *y;
  const size_t len = 20u << 20;
  CHECK_OK(gma_alloc(g, len, a, &x));
  CHECK_OK(gma_record_stream(g, x, b));
  CHECK_OK(gma_free(g, x));
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_stream_synchronize(g, b));
  CHECK_OK(gma_alloc(g, len, b, &y));
  CHECK(y == x); /* idle streams: the epoch events complete at once */
  gma_stats_t s = stats_of(g);
  CHECK(s.hits_pool == 1 && s.num_device_allocs == 1);
  CHECK_OK(gma_free(g, y));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
}

/* A block freed after record_stream goes back to its owner once its gates
 * have passed: the slow path settles it before it searches, and another
 * stream's request that has another fit does not take its place; the
 * owner's next request of that size gets the same place (issue 15: settled
 * into the free pool, it went to whichever request searched first, and with
 * bins on a training loop polled once per iteration for good). Any stream
 * still gets it from a poll when nothing else fits. */
static void settled_block_returns_to_owner(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  gma_stream_t a, b, c;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  CHECK_OK(gma_stream_create(g, &c));
  const size_t mib = 1 << 20;
  void *x, *f1, *f2, *y, *z;
  /* Small segment 1 (2 MiB): x and f1, 1 MiB each. Segment 2: f2 (512 KiB),
   * and 1.5 MiB free. */
  CHECK_OK(gma_alloc(g, mib, a, &x));
  CHECK_OK(gma_alloc(g, mib, a, &f1));
  CHECK_OK(gma_alloc(g, 512 << 10, a, &f2));
  CHECK_OK(gma_record_stream(g, x, b));
  CHECK_OK(gma_free(g, x)); /* pending: b used it; the idle device completes it at once */
  /* c's request (600 KiB) settles x. In the free pool, x (1 MiB) would be
   * its best fit; in a's cache, c takes the 1.5 MiB in segment 2. */
  CHECK_OK(gma_alloc(g, 600 << 10, c, &y));
  CHECK(y != x);
  CHECK_OK(gma_alloc(g, mib, a, &z));
  CHECK(z == x); /* the same place, from a's cache */
  /* Nothing else fits a 1 MiB request on c now but a's cached 1 MiB after
   * it is freed: a poll gives it to c. */
  CHECK_OK(gma_free(g, z));
  void *w;
  CHECK_OK(gma_alloc(g, mib, c, &w));
  gma_stats_t st = stats_of(g);
  CHECK(w == x && st.num_device_allocs == 2);
  CHECK_OK(gma_free(g, w));
  CHECK_OK(gma_free(g, y));
  CHECK_OK(gma_free(g, f1));
  CHECK_OK(gma_free(g, f2));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  /* The start, a 512-aligned interior address (no block starts there) and
   * an unaligned one near the end of the 64 KiB block. */
  static const size_t offsets[] = {0, 4096, (64 << 10) - 3};
  outcome_t ok, bug;
  for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; i++) {
    ok = record_stream_scenario(0, offsets[i]);
    CHECK(ok.corruptions == 0 && !ok.reused_same_address);
    bug = record_stream_scenario(GMA__TEST_NO_RECORD_GATING, offsets[i]);
    CHECK(bug.reused_same_address && bug.corruptions > 0);
    printf("record_stream gating (pointer at +%zu): clean with gating; %d corruption(s) caught "
           "without it\n", offsets[i], bug.corruptions);
  }

  ok = epoch_scenario(0);
  CHECK(ok.corruptions == 0 && !ok.reused_same_address);
  bug = epoch_scenario(GMA__TEST_NO_EPOCH_GATING);
  CHECK(bug.reused_same_address && bug.corruptions > 0);
  printf("epoch gating: clean with gating; %d corruption(s) caught without it\n", bug.corruptions);

  ok = owner_busy_scenario(0);
  CHECK(ok.corruptions == 0 && !ok.reused_same_address);
  bug = owner_busy_scenario(GMA__TEST_NO_EPOCH_GATING);
  CHECK(bug.reused_same_address && bug.corruptions > 0);
  printf("a settled block's owner still busy: clean with gating; %d corruption(s) caught "
         "without it\n", bug.corruptions);

  reuse_after_completion();
  settled_block_returns_to_owner();
  printf("ok\n");
  return 0;
}
