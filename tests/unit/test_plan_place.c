/* The offline placement of planned memory (runtime/plan/plan_place.c): seeded
 * random workloads of several shapes, each placement checked three ways (the
 * solver's own gma__plan_place_is_valid, an independent O(n^2) checker
 * written here, and the arena and lower bound recomputed by brute force);
 * the edge cases (no item, one item, identical lifetimes, lifetimes that
 * meet end to start, sizes near 2^40); a planted bug that both checkers must
 * reject; determinism; and several threads placing at once (the solver must
 * be reentrant). */
#include <inttypes.h>
#include <pthread.h>

#include "check.h"
#include "plan/plan_place.h"
#include "rng.h"

typedef gma__plan_item_t item_t;

static bool live_together(const item_t *a, const item_t *b) {
  return a->start < b->end && b->start < a->end;
}

/* The independent checker: every pair, no cleverness. Reports the first
 * overlap it finds. */
static bool brute_valid(const item_t *x, size_t n, const uint64_t *off, uint64_t arena) {
  for (size_t i = 0; i < n; i++) {
    if (off[i] % 512 || x[i].size % 512 || x[i].size == 0 || x[i].start >= x[i].end ||
        off[i] > arena || x[i].size > arena - off[i])
      return false;
    for (size_t j = i + 1; j < n; j++)
      if (live_together(&x[i], &x[j]) && off[i] < off[j] + x[j].size && off[j] < off[i] + x[i].size)
        return false;
  }
  return true;
}

/* The peak of live bytes, by brute force: the peak is at some item's start. */
static uint64_t brute_peak(const item_t *x, size_t n) {
  uint64_t best = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t live = 0;
    for (size_t j = 0; j < n; j++)
      if (x[j].start <= x[i].start && x[i].start < x[j].end) live += x[j].size;
    if (live > best) best = live;
  }
  return best;
}

/* Places x[0..n) and checks everything; brute forces only up to brute_n
 * items. Returns the arena. */
static uint64_t place_checked(const item_t *x, size_t n, uint64_t *off, size_t brute_n,
                              uint64_t *lb_out) {
  uint64_t arena = 12345, lb = 12345;
  CHECK(gma__plan_place(x, n, off, &arena, &lb));
  uint64_t top = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK(off[i] % 512 == 0);
    if (off[i] + x[i].size > top) top = off[i] + x[i].size;
  }
  CHECK(arena == top);
  CHECK(arena >= lb);
  CHECK(gma__plan_place_is_valid(x, n, off, arena));
  if (n <= brute_n) {
    CHECK(brute_valid(x, n, off, arena));
    CHECK(lb == brute_peak(x, n));
  }
  if (lb_out) *lb_out = lb;
  return arena;
}

/* Random workloads. shape 0: short lifetimes over a long timeline (a few
 * live at a time); 1: a mix of short and whole-run lifetimes (training-like);
 * 2: heavy overlap (most items live together); 3: few distinct times (many
 * equal starts and ends, lifetimes meeting end to start). */
static void random_workload(uint64_t seed, int shape, size_t n, size_t brute_n) {
  uint64_t s = mix64(seed) | 1;
  item_t *x = malloc(n * sizeof *x);
  uint64_t *off = malloc(n * sizeof *off), *again = malloc(n * sizeof *again);
  CHECK(x && off && again);
  uint32_t span = shape == 3 ? 16 : (uint32_t)(4 * n);
  for (size_t i = 0; i < n; i++) {
    uint32_t start = (uint32_t)(rnd(&s) % span), len;
    switch (shape) {
    case 0: len = 1 + (uint32_t)(rnd(&s) % 40); break;
    case 1: len = rnd(&s) % 10 ? 1 + (uint32_t)(rnd(&s) % 30) : 1 + (uint32_t)(rnd(&s) % span); break;
    case 2: len = (uint32_t)(span / 2 + rnd(&s) % span); break;
    default: len = 1 + (uint32_t)(rnd(&s) % 4); break;
    }
    uint64_t units = rnd(&s) % 4 ? 1 + rnd(&s) % 64 : 1 + rnd(&s) % 8192;
    x[i] = (item_t){units * 512, start, start + len};
  }
  uint64_t lb, arena = place_checked(x, n, off, brute_n, &lb);
  /* The same input gives the same plan: it may be recorded and compared. */
  uint64_t arena2, lb2;
  CHECK(gma__plan_place(x, n, again, &arena2, &lb2));
  CHECK(arena2 == arena && lb2 == lb && memcmp(off, again, n * sizeof *off) == 0);
  free(x), free(off), free(again);
}

static void edge_cases(void) {
  uint64_t off[8], arena = 1, lb = 1;
  /* No items: an empty arena. */
  CHECK(gma__plan_place(NULL, 0, NULL, &arena, &lb));
  CHECK(arena == 0 && lb == 0);
  CHECK(gma__plan_place_is_valid(NULL, 0, NULL, 0));

  /* One item: at 0. */
  item_t one = {4096, 7, 9};
  CHECK(place_checked(&one, 1, off, 8, &lb) == 4096 && off[0] == 0 && lb == 4096);

  /* Identical lifetimes: all live together, the arena is their sum. */
  item_t same[5] = {{512, 3, 8}, {8192, 3, 8}, {1024, 3, 8}, {512, 3, 8}, {65536, 3, 8}};
  CHECK(place_checked(same, 5, off, 8, &lb) == 512 + 8192 + 1024 + 512 + 65536);
  CHECK(lb == 512 + 8192 + 1024 + 512 + 65536);

  /* End to start: an item ending at t and one starting at t are never live
   * together, so a chain fits in the largest of them. */
  item_t chain[4] = {{4096, 0, 1}, {8192, 1, 2}, {2048, 2, 5}, {8192, 5, 6}};
  CHECK(place_checked(chain, 4, off, 8, &lb) == 8192 && lb == 8192);
  for (int i = 0; i < 4; i++) CHECK(off[i] == 0);
  /* ... and the validity checks accept items sharing addresses there, but
   * not once their lifetimes overlap by one instant. */
  uint64_t zero[2] = {0, 0};
  item_t meet[2] = {{4096, 0, 3}, {4096, 3, 6}}, touch[2] = {{4096, 0, 4}, {4096, 3, 6}};
  CHECK(gma__plan_place_is_valid(meet, 2, zero, 4096) && brute_valid(meet, 2, zero, 4096));
  CHECK(!gma__plan_place_is_valid(touch, 2, zero, 4096) && !brute_valid(touch, 2, zero, 4096));

  /* Sizes near 2^40: no overflow in units, sums or the arena. */
  uint64_t big = (1ull << 40) - 512;
  item_t huge[5] = {{big, 0, 10}, {big, 5, 15}, {512, 0, 20}, {big, 10, 20}, {1ull << 40, 20, 21}};
  uint64_t a = place_checked(huge, 5, off, 8, &lb);
  CHECK(lb == 2 * big + 512 && a == lb);
  CHECK(off[4] == 0); /* alone at the end: at the bottom */

  /* Arena bounds: one byte short is invalid, a misaligned offset too. */
  item_t pair[2] = {{1024, 0, 2}, {512, 1, 3}};
  CHECK(place_checked(pair, 2, off, 8, &lb) == 1536);
  CHECK(!gma__plan_place_is_valid(pair, 2, off, 1535) && !brute_valid(pair, 2, off, 1535));
  uint64_t odd[2] = {0, 1024 + 256};
  CHECK(!gma__plan_place_is_valid(pair, 2, odd, 4096) && !brute_valid(pair, 2, odd, 4096));
}

/* A planted bug: a valid placement with one item moved onto another that is
 * live at the same time must be rejected by both checkers, and a harmless
 * change (moving an item up past the top, the arena grown to match) by
 * neither. */
static void planted_bug(uint64_t seed) {
  enum { N = 600 };
  uint64_t s = mix64(seed) | 1;
  item_t x[N];
  uint64_t off[N], bad[N];
  for (size_t i = 0; i < N; i++) {
    uint32_t start = (uint32_t)(rnd(&s) % 1000);
    x[i] = (item_t){(1 + rnd(&s) % 32) * 512, start, start + 1 + (uint32_t)(rnd(&s) % 100)};
  }
  uint64_t arena = place_checked(x, N, off, N, NULL);
  int planted = 0;
  for (size_t i = 0; i < N && planted < 20; i++) {
    size_t j = (size_t)(rnd(&s) % N);
    if (j == i || !live_together(&x[i], &x[j])) continue;
    memcpy(bad, off, sizeof bad);
    bad[i] = bad[j]; /* item i now overlaps item j at its first byte */
    uint64_t room = bad[i] + x[i].size > arena ? bad[i] + x[i].size : arena; /* only the overlap is wrong */
    CHECK(!brute_valid(x, N, bad, room));
    CHECK(!gma__plan_place_is_valid(x, N, bad, room));
    planted++;
  }
  CHECK(planted == 20);
  memcpy(bad, off, sizeof bad);
  bad[N / 2] = arena;
  CHECK(brute_valid(x, N, bad, arena + x[N / 2].size));
  CHECK(gma__plan_place_is_valid(x, N, bad, arena + x[N / 2].size));
}

/* The two checkers agree on random, mostly invalid placements. */
static void checkers_agree(uint64_t seed) {
  uint64_t s = mix64(seed) | 1;
  for (int round = 0; round < 300; round++) {
    size_t n = 1 + (size_t)(rnd(&s) % 12);
    item_t x[12];
    uint64_t off[12], arena = 0;
    for (size_t i = 0; i < n; i++) {
      uint32_t start = (uint32_t)(rnd(&s) % 10);
      x[i] = (item_t){(1 + rnd(&s) % 4) * 512, start, start + 1 + (uint32_t)(rnd(&s) % 5)};
      off[i] = (rnd(&s) % 8) * 512;
      if (off[i] + x[i].size > arena) arena = off[i] + x[i].size;
    }
    CHECK(brute_valid(x, n, off, arena) == gma__plan_place_is_valid(x, n, off, arena));
  }
}

/* Several threads place at once (the allocators' workers do): each result
 * must be valid and equal to the plan the same input gets alone. */
typedef struct job {
  const item_t *x;
  size_t n;
  uint64_t *off, arena, lb;
  bool ok;
} job_t;

static void *place_job(void *arg) {
  job_t *j = arg;
  for (int r = 0; r < 2; r++) j->ok = gma__plan_place(j->x, j->n, j->off, &j->arena, &j->lb);
  return NULL;
}

static void concurrent(void) {
  enum { THREADS = 4, N = 5000 };
  uint64_t s = 99;
  item_t *x = malloc(THREADS * N * sizeof *x);
  uint64_t *off = malloc(THREADS * N * sizeof *off), *alone = malloc(N * sizeof *alone);
  CHECK(x && off && alone);
  for (size_t i = 0; i < THREADS * N; i++) {
    uint32_t start = (uint32_t)(rnd(&s) % (2 * N));
    x[i] = (item_t){(1 + rnd(&s) % 256) * 512, start, start + 1 + (uint32_t)(rnd(&s) % 200)};
  }
  pthread_t th[THREADS];
  job_t jobs[THREADS];
  for (int t = 0; t < THREADS; t++) {
    jobs[t] = (job_t){x + t * N, N, off + t * N, 0, 0, false};
    CHECK(pthread_create(&th[t], NULL, place_job, &jobs[t]) == 0);
  }
  for (int t = 0; t < THREADS; t++) CHECK(pthread_join(th[t], NULL) == 0);
  for (int t = 0; t < THREADS; t++) {
    uint64_t arena, lb;
    CHECK(jobs[t].ok);
    CHECK(gma__plan_place_is_valid(jobs[t].x, N, jobs[t].off, jobs[t].arena));
    CHECK(gma__plan_place(jobs[t].x, N, alone, &arena, &lb));
    CHECK(arena == jobs[t].arena && lb == jobs[t].lb);
    CHECK(memcmp(alone, jobs[t].off, N * sizeof *alone) == 0);
  }
  free(x), free(off), free(alone);
}

int main(void) {
  edge_cases();
  planted_bug(1), planted_bug(2);
  checkers_agree(3);
  uint64_t seed = 0x91a7;
  for (int shape = 0; shape < 4; shape++)
    for (int r = 0; r < 6; r++) {
      size_t n = r < 2 ? 1 + (size_t)r * 7 : (size_t)(50 << (r % 4));
      random_workload(seed + 10 * (uint64_t)shape + (uint64_t)r, shape, n, 1000);
    }
  /* Larger ones, checked by is_valid (the brute-force checker vouches for it
   * above); a fifth of the size under a sanitizer, which runs them 3-10x slower. */
  size_t big = GMA_TEST_SANITIZED ? 6000 : 30000;
  random_workload(seed + 100, 1, big, 0);
  random_workload(seed + 101, 2, big / 6, 0);
  concurrent();
  printf("ok\n");
  return 0;
}
