/* gma-plan-place-eval: the measuring driver for the planned-memory placement
 * (runtime/plan/plan_place.c). It places one set of items and prints the arena,
 * the lower bound (peak live bytes), their ratio, the CPU time taken and whether
 * gma__plan_place_is_valid accepts the result. The items come from standard
 * input, one "start end size" line each (tools/plan-place-eval extracts them
 * from the traces), or from a seeded synthetic generator:
 *   --dnn N     training-like: micro-steps of a deep model's forward and
 *               backward passes with gradient accumulation (a few thousand
 *               live at a time, most short, some for the whole run)
 *   --dense N   N items all live at once
 *   --overlap N N items live for long, staggered times: most pairs live
 *               together, yet starts and ends interleave (the solver's worst case)
 *   --random N  random lifetimes and sizes, no structure
 * --seed S picks the synthetic seed, --runs R repeats the placement and
 * reports the fastest run. Development tool: not installed, never asserts. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan/plan_place.h"

typedef struct vec {
  gma__plan_item_t *v;
  size_t n, cap;
} vec_t;

static size_t push(vec_t *x, uint64_t size, uint32_t start) {
  if (x->n == x->cap) {
    x->cap = x->cap ? 2 * x->cap : 1024;
    x->v = realloc(x->v, x->cap * sizeof *x->v);
    if (!x->v) exit(2);
  }
  x->v[x->n] = (gma__plan_item_t){(size + 511) / 512 * 512, start, 0};
  return x->n++;
}

static uint64_t rng(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}

/* A tensor-like size: a few dozen shapes from 512 B to tens of MiB. */
static uint64_t shape(uint64_t *s) {
  return (1 + rng(s) % 48) * (512ull << (rng(s) % 12));
}

static void gen_dnn(vec_t *x, size_t n, uint64_t seed) {
  enum { LAYERS = 1000 };
  size_t act[LAYERS], acc[LAYERS];
  uint64_t sz[LAYERS], s = seed * 2654435761u + 1;
  uint32_t t = 0;
  for (int l = 0; l < LAYERS; l++) sz[l] = shape(&s);
  for (int step = 0; x->n + 6 * LAYERS < n || step == 0; step++) {
    for (int l = 0; l < LAYERS; l++) { /* forward: keep the activation, drop the scratch */
      act[l] = push(x, sz[l], t++);
      size_t a = push(x, shape(&s), t++), b = push(x, sz[(l + 1) % LAYERS], t++);
      x->v[a].end = t++;
      if (rng(&s) % 4) x->v[b].end = t++;
      else act[l] = (x->v[act[l]].end = t++, b); /* in place: the output replaces it */
    }
    for (int l = LAYERS - 1; l >= 0; l--) { /* backward: gradients, then the activation goes */
      size_t g = push(x, sz[l], t++), w = push(x, shape(&s), t++);
      if (step == 0) acc[l] = push(x, sz[(l * 7) % LAYERS], t++);
      x->v[w].end = t++;
      x->v[act[l]].end = t++;
      x->v[g].end = t++;
    }
  }
  for (int l = 0; l < LAYERS; l++) x->v[acc[l]].end = t++;
}

static void gen_dense(vec_t *x, size_t n, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    size_t k = push(x, shape(&s), (uint32_t)i);
    x->v[k].end = (uint32_t)(n + rng(&s) % n + 1);
  }
}

static void gen_overlap(vec_t *x, size_t n, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    uint32_t start = (uint32_t)(rng(&s) % (4 * n));
    size_t k = push(x, shape(&s), start);
    x->v[k].end = start + (uint32_t)(2 * n + rng(&s) % (4 * n));
  }
}

static void gen_random(vec_t *x, size_t n, uint64_t seed) {
  uint64_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    uint32_t start = (uint32_t)(rng(&s) % (2 * n));
    size_t k = push(x, shape(&s), start);
    x->v[k].end = start + 1 + (uint32_t)(rng(&s) % (rng(&s) % 8 ? 64 : 4096));
  }
}

/* Thread CPU time: on a shared machine the wall clock mostly measures the
 * neighbours, so the figures are CPU milliseconds (the solver is single-threaded). */
static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
  vec_t x = {0};
  uint64_t seed = 1;
  int runs = 1;
  const char *gen = NULL;
  size_t n = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
    else if ((!strcmp(argv[i], "--dnn") || !strcmp(argv[i], "--dense") ||
              !strcmp(argv[i], "--overlap") ||
              !strcmp(argv[i], "--random")) && i + 1 < argc)
      gen = argv[i] + 2, n = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: %s [--dnn N | --dense N | --overlap N | --random N] [--seed S] [--runs R]\n"
                      "  (without a generator: \"start end size\" lines on standard input)\n",
              argv[0]);
      return 2;
    }
  }
  if (!gen) {
    unsigned long long a, b, c;
    while (scanf("%llu %llu %llu", &a, &b, &c) == 3) {
      size_t k = push(&x, c, (uint32_t)a);
      x.v[k].end = (uint32_t)b;
    }
  } else if (!strcmp(gen, "dnn")) {
    gen_dnn(&x, n, seed);
  } else if (!strcmp(gen, "overlap")) {
    gen_overlap(&x, n, seed);
  } else if (!strcmp(gen, "dense")) {
    gen_dense(&x, n, seed);
  } else {
    gen_random(&x, n, seed);
  }
  uint64_t *off = malloc((x.n ? x.n : 1) * sizeof *off), arena = 0, lb = 0;
  double best = 1e300;
  for (int r = 0; r < runs; r++) {
    double t0 = now_ms();
    if (!gma__plan_place(x.v, x.n, off, &arena, &lb)) {
      fprintf(stderr, "gma__plan_place: out of memory\n");
      return 1;
    }
    double t = now_ms() - t0;
    if (t < best) best = t;
  }
  double t0 = now_ms();
  bool valid = gma__plan_place_is_valid(x.v, x.n, off, arena);
  double tv = now_ms() - t0;
  printf("n=%zu arena=%" PRIu64 " lower_bound=%" PRIu64 " ratio=%.4f place_cpu_ms=%.1f valid=%s "
         "valid_cpu_ms=%.1f\n",
         x.n, arena, lb, lb ? (double)arena / (double)lb : 1.0, best, valid ? "yes" : "NO", tv);
  free(off), free(x.v);
  return valid ? 0 : 1;
}
