/* The page map (runtime/core/pagemap.h): its contents against a model
 * through sparse leaves, pairs reused and the turn to a dense leaf; and
 * lock-free readers that must always find the blocks that stay while the
 * writer churns their region and turns it dense. A planted map that
 * publishes the dense leaf before filling it must be caught by the same
 * readers (a copy of pagemap.c compiled with GMA__PM_PLANTED_EARLY_DENSE,
 * its functions renamed). */
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "rng.h"

#define GMA__PM_PLANTED_EARLY_DENSE 1
#define gma__pagemap_set planted_pagemap_set
#define gma__pagemap_free planted_pagemap_free
#include "core/pagemap.c"
#undef gma__pagemap_set
#undef gma__pagemap_free
bool gma__pagemap_set(gma__pagemap_t *pm, uintptr_t addr, struct gma__block *b);
void gma__pagemap_free(gma__pagemap_t *pm);

typedef bool (*set_fn)(gma__pagemap_t *, uintptr_t, struct gma__block *);

#define BASE ((uintptr_t)0x7f0000000000ull)
#define REGION ((uintptr_t)16 << 20)

static struct gma__block *fake(uintptr_t addr) { return (struct gma__block *)(addr + 0x10); }

static gma__pagemap_t *map_new(void) {
  gma__pagemap_t *pm = calloc(1, sizeof *pm);
  CHECK(pm);
  return pm;
}

/* Edges: bad addresses, clearing what is not there, one region's sparse
 * leaf up to its 32 pairs, the 33rd start turning it dense with every
 * pair kept. */
static void test_edges(void) {
  gma__pagemap_t *pm = map_new();
  CHECK(gma__pagemap_get(pm, BASE) == NULL);
  CHECK(gma__pagemap_set(pm, BASE, NULL)); /* clearing an empty map */
  CHECK(!gma__pagemap_set(pm, (uintptr_t)1 << 48, fake(0)));
  CHECK(gma__pagemap_set(pm, BASE, fake(BASE)));
  CHECK(gma__pagemap_get(pm, BASE + 256) == NULL); /* not a block boundary */
  CHECK(gma__pagemap_get(pm, BASE + 512) == NULL);
  CHECK(gma__pagemap_set(pm, BASE + REGION - 512, NULL)); /* a slot never set */
  for (uintptr_t i = 1; i < GMA__PM_SPARSE; i++)
    CHECK(gma__pagemap_set(pm, BASE + i * 512 * 1000, fake(BASE + i * 512 * 1000)));
  CHECK(pm->sparse_leaves == 1 && pm->dense_leaves == 0);
  CHECK(gma__pagemap_set(pm, BASE + REGION - 512, fake(BASE + REGION - 512)));
  CHECK(pm->dense_leaves == 1);
  for (uintptr_t i = 0; i < GMA__PM_SPARSE; i++)
    CHECK(gma__pagemap_get(pm, BASE + i * 512 * 1000) == fake(BASE + i * 512 * 1000));
  CHECK(gma__pagemap_get(pm, BASE + REGION - 512) == fake(BASE + REGION - 512));
  CHECK(gma__pagemap_get(pm, BASE + REGION) == NULL); /* the next region */
  gma__pagemap_free(pm);
  free(pm);
}

/* Random sets, replacements and clears over four regions, each checked
 * against an array: the regions pass through full sparse leaves with
 * pairs reused, and some turn dense. */
#define MODEL_SLOTS 64
static void test_model(void) {
  gma__pagemap_t *pm = map_new();
  struct gma__block *model[4][MODEL_SLOTS] = {{NULL}};
  uint64_t seed = 0x9a9e3a9;
  for (int step = 0; step < 20000; step++) {
    /* region 3 keeps at most 24 starts: it stays sparse */
    int r = (int)(rnd(&seed) % 4), s = (int)(rnd(&seed) % (r == 3 ? 24 : MODEL_SLOTS));
    uintptr_t addr = BASE + (uintptr_t)r * REGION + (uintptr_t)s * 512 * 509;
    struct gma__block *b = rnd(&seed) % 3 ? fake(addr + (uintptr_t)step * 16) : NULL;
    CHECK(gma__pagemap_set(pm, addr, b));
    model[r][s] = b;
    for (int t = 0; t < MODEL_SLOTS; t++)
      CHECK(gma__pagemap_get(pm, BASE + (uintptr_t)r * REGION + (uintptr_t)t * 512 * 509) ==
            model[r][t]);
  }
  CHECK(pm->sparse_leaves == 4 && pm->dense_leaves == 3);
  gma__pagemap_free(pm);
  free(pm);
}

/* ---- Readers against a churning writer ------------------------------------------ */

#define KEEP 4 /* starts per region that stay while the writer churns it */
static uintptr_t kept_addr(uintptr_t r, int i) {
  return BASE + r * REGION + (uintptr_t)i * (REGION / KEEP);
}

typedef struct shared {
  gma__pagemap_t *pm;
  _Atomic(uintptr_t) ready; /* 1 + the newest region whose kept starts are set */
  _Atomic(uintptr_t) fresh; /* a start the writer set after the kept ones, not cleared */
  atomic_int stop;
  atomic_long misses, looks;
} shared_t;

static void *reader(void *arg) {
  shared_t *sh = arg;
  uint64_t seed = (uintptr_t)arg;
  while (!atomic_load(&sh->stop)) {
    uintptr_t f = gma__load_acquire(&sh->fresh);
    if (f && gma__pagemap_get(sh->pm, f) != fake(f)) atomic_fetch_add(&sh->misses, 1);
    uintptr_t n = gma__load_acquire(&sh->ready);
    if (!n) continue;
    /* the newest region, whose leaf is turning dense now, and an older one */
    uintptr_t rs[2] = {n - 1, rnd(&seed) % n};
    for (int j = 0; j < 2; j++)
      for (int i = 0; i < KEEP; i++) {
        uintptr_t a = kept_addr(rs[j], i);
        if (gma__pagemap_get(sh->pm, a) != fake(a)) atomic_fetch_add(&sh->misses, 1);
        atomic_fetch_add(&sh->looks, 1);
      }
  }
  return NULL;
}

/* regions regions, each: its kept starts set and published, then 48
 * starts set in its first page (reusing pairs as 16 of them are cleared
 * on the way), which turns it dense; each of those that stays is
 * published as it is set, and the reader must find it too. Returns the
 * readers' misses. */
static long churn(set_fn set, int regions) {
  shared_t sh = {.pm = map_new()};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, reader, &sh) == 0);
  for (uintptr_t r = 0; r < (uintptr_t)regions; r++) {
    for (int i = 0; i < KEEP; i++) CHECK(set(sh.pm, kept_addr(r, i), fake(kept_addr(r, i))));
    gma__store_release(&sh.ready, r + 1);
    for (uintptr_t j = 1; j <= 48; j++) {
      uintptr_t a = BASE + r * REGION + j * 512;
      CHECK(set(sh.pm, a, fake(a)));
      if (j % 3 == 0) CHECK(set(sh.pm, a - 512, NULL));
      if ((j + 1) % 3) gma__store_release(&sh.fresh, a); /* one the next step keeps */
    }
  }
  atomic_store(&sh.stop, 1);
  CHECK(pthread_join(th, NULL) == 0);
  CHECK(sh.pm->dense_leaves == (uint64_t)regions && atomic_load(&sh.looks) > 0);
  long misses = atomic_load(&sh.misses);
  planted_pagemap_free(sh.pm); /* the same code as gma__pagemap_free */
  free(sh.pm);
  return misses;
}

static void test_readers(void) {
  int regions = GMA_TEST_SANITIZED ? 1500 : 4000;
  for (int round = 0; round < 3; round++) CHECK(churn(gma__pagemap_set, regions) == 0);
}

static void test_planted_early_dense(void) {
  long misses = 0;
  for (int round = 0; round < 20 && !misses; round++) misses = churn(planted_pagemap_set, 1500);
  printf("planted: the readers missed %ld kept starts\n", misses);
  CHECK(misses > 0);
}

int main(int argc, char **argv) {
  static const test_case_t cases[] = {
      {"edges", test_edges},
      {"model", test_model},
      {"readers", test_readers},
      {"planted_early_dense", test_planted_early_dense},
  };
  return run_cases(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
