/* Stress test of planned memory (plan:on, issue 18): several host threads,
 * each with its own stream, run a training-loop-shaped iteration, mark the
 * iterations together, and are served from the plan once it is active.
 *
 * The iteration (per thread, a fixed program drawn from the seed and the
 * current "shape"): a forward pass that keeps one activation per layer and
 * allocates and frees a temporary per layer, then a backward pass that
 * allocates a gradient per layer and frees the layer's activation; the last
 * gradient goes to a stream all threads share (comm, as an all-reduce before
 * the optimizer step would): gma_stream_wait_stream(comm, own) orders comm
 * after the owner's work, gma_record_stream tells gma, then a pattern kernel
 * runs on comm. Sizes are 512 B to 6 MiB with nested lifetimes. Every
 * buffer gets a pattern kernel (stress_kernel.h: fill, hold 0-50 us,
 * verify) and the host frees it right after queueing the kernel, as a
 * training loop does. At the end of an iteration each thread synchronizes
 * its stream, the threads meet at a barrier, one of them synchronizes comm
 * and calls gma_iteration_mark, and all meet again.
 *
 * While the plan is active, in a period of 6 iterations:
 *  0 one thread holds a block: its first activation (the first request of
 *    every iteration, so the same planned slot next time) goes to the
 *    thread's second stream, where a pattern kernel holds it behind a gate
 *    the thread opens only after the NEXT iteration's first request was
 *    served and its kernel ran. gma must not hand that planned address out
 *    while the held kernel uses it (the request misses the plan and takes
 *    the ordinary path);
 *  1 the iteration after it (that miss, and what overlaps the held cells);
 *  3 one thread deviates once: an extra allocation (freed at the iteration's
 *    end), a changed size, a free skipped until later (the iteration's end,
 *    or into the next iteration, across the mark), or a gradient sent to
 *    comm in the middle of the backward pass (later requests of the
 *    iteration cannot have its planned memory until comm's work is seen
 *    done);
 *  4 the iteration after it;
 *  2, 5 steady: nobody deviates or holds in them or the one before.
 * Half-way the shape changes: every request misses, the plan is dropped (a
 * re-plan), and the new shape gets a plan of its own. Shape 0 runs the
 * threads' iterations at once; shape 1 in turns (thread 0's whole
 * iteration, then thread 1's, ..., each synchronizing comm at its end: every
 * iteration has the interleaving the plan learned, while the kernels, the
 * worker and the second streams still run concurrently).
 *
 * What would show a bug: pattern kernels that find their pattern changed
 * (corruptions); an overlap checker on the host (every live block of every
 * thread, registered between gma_alloc's return and the gma_free call, under
 * a mutex; two live blocks that overlap are counted); any gma call that does
 * not return GMA_OK; and at the end: the plan became active after each
 * shape (plan_hits > 0), was re-planned, shape 1's steady iterations were
 * served from the plan (19 in 20 requests at least, the plan never
 * dropped; shape 0's figures are printed), and the statistics add up: reserved == allocated + stream_cached + pending
 * + free + plan_arena_bytes whenever nothing is live (at every mark, and at
 * the end), the hit levels and plan_hits sum to num_allocs, and after
 * gma_empty_cache only the arena's segment stays reserved.
 *
 * --plant removes the plan's cross-stream gate once the plan is active
 * (GMA__TEST_NO_EPOCH_GATING in pool.h, set at the mark that activates it:
 * plan.c's claim then skips the check of earlier users on other streams;
 * the pool also frees without epochs from then on). Every thread holds its
 * first activation in every iteration, so the next iteration's first
 * request is handed the held planned address at once: the run must DETECT
 * it in a held kernel (it stops at the first such detection and exits 0;
 * exit 1 if the bug went unnoticed). Planted runs go without the worker, so
 * no timed trim unmaps memory under a kernel the bug let run late.
 *
 * STRESS_PLAN_VERBOSE=1 prints the plan's state, hits and misses at every
 * mark.
 *
 * Usage: stress_plan [seed] [iterations] [threads] [--plant] [--conf k:v,...]
 * Internal test: includes pool.h only for gma__pool_of and the switch. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/allocator.h"
#include "core/internal.h"
#include "rng.h"
#include "simkit.h"
#include "stress_kernel.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

enum {
  MAXT = 8,            /* threads */
  LAYERS = 6,          /* per thread: activations kept for the backward pass */
  MAX_HOLD_US = 50,    /* ordinary pattern kernels hold 0..50 us */
  GATE_LIMIT_US = 10 * 1000 * 1000
};

/* ---- the overlap checker: every live block of every thread ---------------------- */

typedef struct range {
  uintptr_t start, end;
  int thread;
} range_t;

typedef struct checker {
  pthread_mutex_t mu;
  range_t v[MAXT * 64];
  int n;
  uint64_t overlaps; /* mu */
} checker_t;

/* ---- the run's shared state ------------------------------------------------------- */

typedef struct shared {
  gma_t *g;
  gma_stream_t comm;
  int nthreads, iters;
  uint64_t seed;
  bool plant;
  checker_t ck;
  pthread_barrier_t bar;
  atomic_ullong corruptions, kernels_run, failures, held_detections, held_reused;
  atomic_long backlog; /* unused by the checks; stress_kernel.h wants one */
  /* Written by the marking thread between the two barriers, read after. */
  int state_now;       /* plan_state after the last mark */
  bool stop;           /* planted: a corruption was seen, stop at this mark */
  int shape;           /* 0 until the shape change, then 1 */
  /* Per iteration, by the marking thread. */
  int *deviated;       /* threads that deviated or held in the iteration (or the one before) */
  uint64_t *hits, *misses;
  int *state_at_start, *state_at_end, *state_after;
  uint64_t steady_hits[2], steady_misses[2], steady_iters[2], steady_drops[2]; /* by shape */
  uint64_t quiet_checks; /* accounting equations checked with nothing live */
  atomic_int live_blocks; /* blocks the threads hold now */
  atomic_int cur_iter;    /* for messages */
  atomic_int turn;        /* shape 1: the thread whose iteration runs now */
} shared_t;

static shared_t sh;

static void note(gma_status_t st, const char *what) {
  if (st != GMA_OK) {
    atomic_fetch_add(&sh.failures, 1);
    fprintf(stderr, "%s: %s (%s)\n", what, gma_status_name(st), gma_last_error());
  }
}

static void checker_insert(int t, void *p, size_t size) {
  checker_t *c = &sh.ck;
  uintptr_t a = (uintptr_t)p, e = a + size;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < c->n; i++)
    if (a < c->v[i].end && c->v[i].start < e) {
      c->overlaps++;
      fprintf(stderr, "overlap: thread %d's [%#" PRIxPTR ", %#" PRIxPTR ") and thread %d's live [%#"
                      PRIxPTR ", %#" PRIxPTR ")\n",
              t, a, e, c->v[i].thread, c->v[i].start, c->v[i].end);
    }
  CHECK(c->n < (int)(sizeof c->v / sizeof c->v[0]));
  c->v[c->n++] = (range_t){a, e, t};
  pthread_mutex_unlock(&c->mu);
}

static void checker_remove(void *p) {
  checker_t *c = &sh.ck;
  pthread_mutex_lock(&c->mu);
  int i = 0;
  while (i < c->n && c->v[i].start != (uintptr_t)p) i++;
  CHECK(i < c->n);
  c->v[i] = c->v[--c->n];
  pthread_mutex_unlock(&c->mu);
}

/* ---- kernels ------------------------------------------------------------------------ */

static void launch_pattern(gma_stream_t s, void *p, size_t len, uint64_t *rng) {
  stress_pattern_t *a = malloc(sizeof *a);
  CHECK(a != NULL);
  *a = (stress_pattern_t){&sh.corruptions, &sh.kernels_run, &sh.backlog, (uintptr_t)p, len,
                          rnd(rng), (long)(rnd(rng) % (MAX_HOLD_US + 1))};
  atomic_fetch_add(&sh.backlog, 1);
  gma_status_t st = gma_sim_launch(sh.g, s, stress_pattern_kernel, a);
  note(st, "gma_sim_launch(pattern)");
  if (st != GMA_OK) {
    atomic_fetch_sub(&sh.backlog, 1);
    free(a);
  }
}

/* A pattern kernel held behind a gate (one per thread, reused): fills, tells
 * the host it has, waits for the gate (at most GATE_LIMIT_US), verifies. */
typedef struct held {
  uintptr_t base;
  size_t len;
  uint64_t pattern;
  int iter, state;     /* the iteration that held it, and the plan's state then */
  atomic_int gate, started, done;
} held_t;

static void held_kernel(void *arg) {
  held_t *h = arg;
  for (size_t off = 0; off + 8 <= h->len; off += STRESS_GRID)
    __atomic_store_n((uint64_t *)(h->base + off), stress_word(h->pattern, off), __ATOMIC_RELAXED);
  atomic_store(&h->started, 1);
  for (long w = 0; !atomic_load(&h->gate) && w < GATE_LIMIT_US; w += 50) sleep_us(50);
  uint64_t bad = 0;
  for (size_t off = 0; off + 8 <= h->len; off += STRESS_GRID)
    if (__atomic_load_n((uint64_t *)(h->base + off), __ATOMIC_RELAXED) !=
        stress_word(h->pattern, off))
      bad++;
  if (bad) {
    atomic_fetch_add(&sh.corruptions, 1);
    atomic_fetch_add(&sh.held_detections, 1);
    fprintf(stderr, "corruption: %" PRIu64 " sampled words of the held block [%#" PRIxPTR
                    ", +%zu) (held in iteration %d, plan state %d) changed while a second "
                    "stream's gated kernel held it (now iteration %d)\n",
            bad, h->base, h->len, h->iter, h->state, atomic_load(&sh.cur_iter));
  }
  atomic_store(&h->done, 1);
}

/* ---- one thread's iteration ------------------------------------------------------------ */

typedef struct thr {
  int index;
  gma_stream_t s;
  gma_stream_t side;   /* this thread's second stream: held kernels */
  uint64_t rng;        /* sizes of the program: reseeded per shape */
  uint64_t krng;       /* kernels' patterns and holds */
  size_t act[LAYERS], tmp[LAYERS];
  void *deferred;      /* a free skipped until later (next iteration) */
  held_t held;
  bool holding;        /* held.gate shut: the side stream holds the last iteration's act[0] */
} thr_t;

/* 512 B .. 6 MiB, log-uniform, multiples of 8 (kernels' words stay inside). */
static size_t draw_size(uint64_t *r) {
  unsigned bits = 9 + (unsigned)(rnd(r) % 13); /* 2^9 .. 2^21 */
  size_t lo = (size_t)1 << bits;
  size_t s = lo + rnd(r) % (lo + (bits == 21 ? 2 * lo : 0));
  return (s & ~(size_t)7) ? s & ~(size_t)7 : 512;
}

static void make_program(thr_t *T, int shape) {
  uint64_t r = mix64(sh.seed ^ mix64((uint64_t)T->index * 131 + (uint64_t)shape + 1)) | 1;
  for (int l = 0; l < LAYERS; l++) {
    T->act[l] = draw_size(&r);
    T->tmp[l] = draw_size(&r);
  }
}

static void *take(thr_t *T, size_t size) {
  void *p = NULL;
  gma_status_t st = gma_alloc(sh.g, size, T->s, &p);
  note(st, "gma_alloc");
  if (st != GMA_OK) return NULL;
  checker_insert(T->index, p, size);
  atomic_fetch_add(&sh.live_blocks, 1);
  launch_pattern(T->s, p, size, &T->krng);
  return p;
}

static void give(void *p) {
  if (!p) return;
  checker_remove(p);
  atomic_fetch_sub(&sh.live_blocks, 1);
  note(gma_free(sh.g, p), "gma_free");
}

/* Hands p to a second stream (ordered after the owner's work so far) with a
 * pattern kernel: held behind the thread's gate on the thread's side stream,
 * or an ordinary one on the shared comm stream. */
static void to_comm(thr_t *T, void *p, size_t size, bool hold, int it) {
  gma_stream_t u = hold ? T->side : sh.comm;
  note(gma_record_stream(sh.g, p, u), "gma_record_stream");
  note(gma_stream_wait_stream(sh.g, u, T->s), "gma_stream_wait_stream");
  if (!hold) {
    launch_pattern(u, p, size, &T->krng);
    return;
  }
  held_t *h = &T->held;
  /* The last held kernel (its gate opened) may still be verifying. */
  for (long w = 0; h->base && !atomic_load(&h->done) && w < GATE_LIMIT_US; w += 20) sleep_us(20);
  CHECK(!h->base || atomic_load(&h->done));
  h->base = (uintptr_t)p;
  h->len = size;
  h->pattern = rnd(&T->krng);
  h->iter = it;
  h->state = sh.state_now;
  atomic_store(&h->gate, 0);
  atomic_store(&h->started, 0);
  atomic_store(&h->done, 0);
  gma_status_t st = gma_sim_launch(sh.g, u, held_kernel, h);
  note(st, "gma_sim_launch(held)");
  if (st != GMA_OK) return;
  T->holding = true;
  /* Its pattern is written before anyone can be handed the memory again:
   * whoever overwrites it too early does so while it waits. */
  for (long w = 0; !atomic_load(&h->started) && w < GATE_LIMIT_US; w += 20) sleep_us(20);
  CHECK(atomic_load(&h->started));
}

static void open_gate(thr_t *T) {
  if (!T->holding) return;
  atomic_store(&T->held.gate, 1);
  T->holding = false;
}

/* One iteration. active: the plan was active at its start (deviations and
 * holds only then). Returns whether this thread deviated or held. */
static bool iteration(thr_t *T, int it, bool active) {
  uint64_t dr = mix64(sh.seed ^ mix64(((uint64_t)it << 8) | (uint64_t)T->index)) | 1;
  /* Period 6: a thread holds (0), the next iteration misses its first
   * request (1), steady (2), a thread deviates (3), its late free (4),
   * steady (5). Planted: every thread holds every iteration. */
  int phase = it % 6, chosen = (int)(mix64(sh.seed ^ (uint64_t)it) % (uint64_t)sh.nthreads);
  int deviation = active && phase == 3 && T->index == chosen ? 1 + (int)(rnd(&dr) % 4) : 0;
  bool hold = active && (sh.plant || (phase == 0 && T->index == chosen));
  int at = (int)(rnd(&dr) % LAYERS);
  bool was_holding = T->holding;
  void *extra = NULL, *late = NULL;
  void *act[LAYERS];

  /* Forward. The first request is act[0]: the slot a held block had. */
  for (int l = 0; l < LAYERS; l++) {
    if (deviation == 1 && l == at) extra = take(T, 512 + 8 * (size_t)(rnd(&dr) % 100000));
    act[l] = take(T, T->act[l]);
    if (l == 0 && T->holding) {
      /* Let act[0]'s kernel run (and overwrite, were the address still
       * held), then let the held kernel verify. */
      if (sh.plant && act[0] == (void *)T->held.base) atomic_fetch_add(&sh.held_reused, 1);
      note(gma_stream_synchronize(sh.g, T->s), "gma_stream_synchronize");
      open_gate(T);
    }
    size_t ts = T->tmp[l] + (deviation == 2 && l == at ? 4096 : 0);
    void *tmp = take(T, ts);
    if (deviation == 3 && l == at) late = tmp;
    else give(tmp);
  }
  give(T->deferred); /* a free skipped in the last iteration */
  T->deferred = NULL;

  /* Backward. */
  for (int l = LAYERS - 1; l >= 0; l--) {
    void *grad = take(T, T->act[l]);
    launch_pattern(T->s, act[l], T->act[l], &T->krng); /* the backward pass reads it */
    if (l == 0 && hold && act[0]) {
      to_comm(T, act[0], T->act[0], true, it);
    }
    give(act[l]);
    /* The last gradient goes to comm (an all-reduce before the optimizer
     * step); deviation 4: one in the middle, whose planned memory later
     * requests of this iteration cannot have until comm's work is seen done. */
    if (grad && (l == 0 || (deviation == 4 && l == at))) to_comm(T, grad, T->act[l], false, it);
    give(grad);
  }
  give(extra);
  if (late) {
    if (rnd(&dr) % 2) give(late); /* at the iteration's end */
    else T->deferred = late;      /* in the next one, across the mark */
  }
  note(gma_stream_synchronize(sh.g, T->s), "gma_stream_synchronize");
  return deviation || hold || was_holding;
}

/* The marking thread, between the barriers: every thread's stream is
 * synchronized and no call is in flight. */
static void mark(int it, bool held_any) {
  gma_stats_t a = stats_of(sh.g);
  note(gma_stream_synchronize(sh.g, sh.comm), "gma_stream_synchronize(comm)");
  if (atomic_load(&sh.live_blocks) == 0) {
    /* Nothing live: the accounting equation holds exactly. */
    if (a.reserved.current != a.allocated.current + a.stream_cached_bytes + a.pending_bytes +
                                  a.free_bytes + a.plan_arena_bytes)
      fprintf(stderr, "  iteration %d: reserved %" PRIu64 ", allocated %" PRIu64 ", stream_cached %"
              PRIu64 ", pending %" PRIu64 ", free %" PRIu64 ", plan arena %" PRIu64 ", state %d\n",
              it, a.reserved.current, a.allocated.current, a.stream_cached_bytes, a.pending_bytes,
              a.free_bytes, a.plan_arena_bytes, a.plan_state);
    CHECK(a.reserved.current == a.allocated.current + a.stream_cached_bytes + a.pending_bytes +
                                    a.free_bytes + a.plan_arena_bytes);
    sh.quiet_checks++;
  }
  note(gma_iteration_mark(sh.g), "gma_iteration_mark");
  atomic_store(&sh.cur_iter, it + 1);
  atomic_store(&sh.turn, 0);
  gma_stats_t b = stats_of(sh.g);
  sh.hits[it] = a.plan_hits;
  sh.misses[it] = a.plan_misses;
  sh.state_at_end[it] = a.plan_state;
  sh.state_now = b.plan_state;
  sh.state_after[it] = b.plan_state;
  if (it + 1 < sh.iters) sh.state_at_start[it + 1] = b.plan_state;
  if (getenv("STRESS_PLAN_VERBOSE"))
    fprintf(stderr, "  [%3d] %8.3f s state %d -> %d, hits +%" PRIu64 ", misses +%" PRIu64 ", held %d\n", it,
           (double)now_ns() / 1e9, a.plan_state, b.plan_state,
           a.plan_hits - (it ? sh.hits[it - 1] : 0), a.plan_misses - (it ? sh.misses[it - 1] : 0),
           held_any);
  if (b.plan_state == 3) sleep_us(2000); /* let the worker place it */
  /* Planted: the gate goes once the plan serves (the threads wait at the
   * barrier), so that what is detected is the plan's reuse; the run stops
   * once a held kernel saw it. */
  if (sh.plant && b.plan_state == 4) gma__pool_of(sh.g)->test_flags = GMA__TEST_NO_EPOCH_GATING;
  if (sh.plant && atomic_load(&sh.held_detections)) sh.stop = true;
}

typedef struct targ {
  thr_t T;
  pthread_t tid;
} targ_t;

static void *thread_main(void *arg) {
  thr_t *T = &((targ_t *)arg)->T;
  note(gma_stream_create(sh.g, &T->s), "gma_stream_create");
  note(gma_stream_create(sh.g, &T->side), "gma_stream_create");
  int shape = -1;
  for (int it = 0; it < sh.iters; it++) {
    if (sh.shape != shape) make_program(T, shape = sh.shape);
    bool active = sh.state_now == 4;
    /* Shape 1 runs the threads' iterations in turns (see the top). */
    for (long w = 0; shape == 1 && atomic_load(&sh.turn) != T->index; w++) {
      CHECK(w < GATE_LIMIT_US / 20);
      sleep_us(20);
    }
    sh.deviated[it * MAXT + T->index] = iteration(T, it, active);
    /* The next thread's requests find the memory comm used seen done (in
     * reuse:query a planned block whose cells a busy stream used misses). */
    if (shape == 1) note(gma_stream_synchronize(sh.g, sh.comm), "gma_stream_synchronize(comm)");
    if (shape == 1) atomic_store(&sh.turn, T->index + 1);
    pthread_barrier_wait(&sh.bar);
    if (pthread_barrier_wait(&sh.bar) == PTHREAD_BARRIER_SERIAL_THREAD) {
      bool held_any = false;
      for (int i = 0; i < sh.nthreads; i++) held_any |= sh.deviated[it * MAXT + i] != 0;
      mark(it, held_any);
      if (it + 1 == sh.iters / 2) sh.shape = 1; /* the shape change: a re-plan */
    }
    pthread_barrier_wait(&sh.bar);
    if (sh.stop) break;
  }
  open_gate(T);
  give(T->deferred);
  T->deferred = NULL;
  note(gma_stream_synchronize(sh.g, T->s), "gma_stream_synchronize");
  note(gma_stream_synchronize(sh.g, T->side), "gma_stream_synchronize");
  return NULL;
}

static void usage(void) {
  fprintf(stderr, "usage: stress_plan [seed] [iterations] [threads] [--plant] [--conf k:v,...]\n");
  exit(2);
}

int main(int argc, char **argv) {
  uint64_t seed = (uint64_t)time(NULL);
  int iters = 48, nthreads = 3, npos = 0;
  const char *conf = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--plant") == 0) sh.plant = true;
    else if (strcmp(argv[i], "--conf") == 0 && i + 1 < argc) conf = argv[++i];
    else if (npos == 0) seed = strtoull(argv[i], NULL, 0), npos++;
    else if (npos == 1) iters = atoi(argv[i]), npos++;
    else if (npos == 2) nthreads = atoi(argv[i]), npos++;
    else usage();
  }
  if (iters < 16 || nthreads < 1 || nthreads > MAXT) usage();
  printf("stress_plan: seed %" PRIu64 ", %d iterations, %d threads%s%s%s\n"
         "  rerun: stress_plan %" PRIu64 " %d %d%s%s%s\n",
         seed, iters, nthreads, sh.plant ? ", planted bug (no cross-stream gate)" : "",
         conf ? ", config " : "", conf ? conf : "", seed, iters, nthreads,
         sh.plant ? " --plant" : "", conf ? " --conf " : "", conf ? conf : "");
  sh.seed = seed;
  sh.iters = iters;
  sh.nthreads = nthreads;
  pthread_mutex_init(&sh.ck.mu, NULL);
  pthread_barrier_init(&sh.bar, NULL, (unsigned)nthreads);
  sh.deviated = calloc((size_t)iters * MAXT, sizeof *sh.deviated);
  sh.hits = calloc((size_t)iters, sizeof *sh.hits);
  sh.misses = calloc((size_t)iters, sizeof *sh.misses);
  sh.state_at_start = calloc((size_t)iters, sizeof *sh.state_at_start);
  sh.state_at_end = calloc((size_t)iters, sizeof *sh.state_at_end);
  sh.state_after = calloc((size_t)iters, sizeof *sh.state_after);
  CHECK(sh.deviated && sh.hits && sh.misses && sh.state_at_start && sh.state_at_end &&
        sh.state_after);
  char c[512];
  snprintf(c, sizeof c, "plan:on,sim_capacity:1G%s%s%s", sh.plant ? ",worker:off" : "",
           conf ? "," : "", conf ? conf : "");
  sh.g = sim_allocator(c);
  CHECK_OK(gma_stream_create(sh.g, &sh.comm));

  targ_t *th = calloc((size_t)nthreads, sizeof *th);
  CHECK(th);
  uint64_t t0 = now_ns();
  for (int i = 0; i < nthreads; i++) {
    th[i].T.index = i;
    th[i].T.krng = mix64(seed ^ (0x1234u + (uint64_t)i)) | 1;
    CHECK(pthread_create(&th[i].tid, NULL, thread_main, &th[i]) == 0);
  }
  for (int i = 0; i < nthreads; i++) CHECK(pthread_join(th[i].tid, NULL) == 0);
  note(gma_stream_synchronize(sh.g, sh.comm), "gma_stream_synchronize(comm)");
  for (int i = 0; i < nthreads; i++)
    for (int w = 0; w < GATE_LIMIT_US / 100 && th[i].T.held.base && !atomic_load(&th[i].T.held.done);
         w++)
      sleep_us(100);
  double secs = (double)(now_ns() - t0) / 1e9;

  /* Per-iteration figures: steady iterations are active at both marks, no
   * thread deviated or held in them or the one before, and no shape change
   * in them or the one before. */
  int first_active[2] = {-1, -1};
  for (int it = 1; it < iters; it++) {
    int shape = it <= iters / 2 ? 0 : 1; /* shape 1's plan comes after the old one's drop */
    if (first_active[shape] < 0 && sh.state_at_start[it] == 4 && sh.state_at_start[it - 1] != 4)
      first_active[shape] = it;
    bool quiet = sh.state_at_start[it] == 4 && sh.state_at_end[it] == 4 && it != iters / 2 &&
                 it != iters / 2 + 1 && sh.hits[it - 1] + sh.misses[it - 1] > 0;
    for (int i = 0; quiet && i < nthreads; i++)
      quiet = !sh.deviated[it * MAXT + i] && !sh.deviated[(it - 1) * MAXT + i];
    if (!quiet) continue;
    sh.steady_iters[shape]++;
    sh.steady_drops[shape] += sh.state_after[it] != 4; /* the plan was dropped at its mark */
    sh.steady_hits[shape] += sh.hits[it] - sh.hits[it - 1];
    sh.steady_misses[shape] += sh.misses[it] - sh.misses[it - 1];
  }
  gma_stats_t s = stats_of(sh.g);
  printf("  %.2f s; plan: state %d, hits %" PRIu64 ", misses %" PRIu64 ", re-plans %" PRIu64
         ", slots %" PRIu64 ", arena %.1f MiB (lower bound %.1f MiB), active from iteration %d "
         "(shape 0) and %d (shape 1)\n",
         secs, s.plan_state, s.plan_hits, s.plan_misses, s.plan_replans, s.plan_slots,
         (double)s.plan_arena_bytes / (double)MiB, (double)s.plan_lower_bound / (double)MiB,
         first_active[0], first_active[1]);
  for (int k = 0; k < 2; k++)
    printf("  shape %d (%s): steady iterations %" PRIu64 ", hits %" PRIu64 ", misses %" PRIu64
           ", plan dropped at %" PRIu64 " of them\n",
           k, k ? "threads in turns" : "threads at once", sh.steady_iters[k], sh.steady_hits[k],
           sh.steady_misses[k], sh.steady_drops[k]);
  printf("  corruptions %llu (held blocks %llu), overlaps %" PRIu64 ", failed calls %llu, "
         "accounting checked at %" PRIu64 " marks\n",
         (unsigned long long)sh.corruptions, (unsigned long long)sh.held_detections, sh.ck.overlaps,
         (unsigned long long)sh.failures, sh.quiet_checks);

  if (sh.plant) {
    bool seen = atomic_load(&sh.held_detections) > 0;
    for (int i = 0; i < nthreads; i++) {
      note(gma_stream_destroy(sh.g, th[i].T.s), "destroy");
      note(gma_stream_destroy(sh.g, th[i].T.side), "destroy");
    }
    CHECK_OK(gma_stream_destroy(sh.g, sh.comm));
    CHECK_OK(gma_destroy(sh.g));
    free(th);
    if (seen) {
      printf("stress_plan: planted bug DETECTED by held kernels (%llu corruption(s) in all, %llu "
             "by held kernels; %llu planned address(es) handed out again under a held kernel): "
             "ok\n",
             (unsigned long long)sh.corruptions, (unsigned long long)sh.held_detections,
             (unsigned long long)sh.held_reused);
      return 0;
    }
    printf("stress_plan: planted bug went UNNOTICED: the workload cannot catch it\n");
    return 1;
  }

  CHECK(atomic_load(&sh.corruptions) == 0);
  CHECK(sh.ck.overlaps == 0);
  CHECK(atomic_load(&sh.failures) == 0);
  CHECK(sh.ck.n == 0 && atomic_load(&sh.live_blocks) == 0);
  /* A plan for each shape, and a re-plan between. */
  CHECK(first_active[0] > 0 && first_active[0] < iters / 2);
  CHECK(first_active[1] > iters / 2);
  CHECK(s.plan_hits > 0 && s.plan_replans >= 1);
  /* Steady iterations of shape 1 (the learned interleaving of the threads,
   * comm's work seen done before the next thread's turn) are served from
   * the plan, and the plan stays. Shape 0's (threads at once) are only
   * reported: the plan places all streams' blocks by the one interleaving
   * it learned, so in another one a request misses where another thread's
   * block still owns a cell, or where comm, still busy, used the cells last
   * (reuse:query hands them out only once comm's work is seen done):
   * typically 0-10% of a steady iteration's requests, 30-60% with the worst
   * plans, which are then dropped and made again. */
  CHECK(sh.steady_iters[1] >= 2);
  CHECK(sh.steady_drops[1] == 0);
  CHECK(sh.steady_hits[1] * 20 >= 19 * (sh.steady_hits[1] + sh.steady_misses[1]));
  /* Quiescent: exact. */
  CHECK(s.allocated.current == 0 && s.requested.current == 0);
  CHECK(s.reserved.current ==
        s.allocated.current + s.stream_cached_bytes + s.pending_bytes + s.free_bytes +
            s.plan_arena_bytes);
  CHECK(s.num_allocs == s.num_frees);
  CHECK(s.hits_bin + s.hits_stream + s.hits_pool + s.hits_device + s.plan_hits == s.num_allocs);
  /* Everything freed and drained: the cache goes back, the arena stays. */
  gma_stats_t e = s;
  for (int tries = 0; tries < 2000; tries++) {
    CHECK_OK(gma_empty_cache(sh.g));
    e = stats_of(sh.g);
    if (e.stream_cached_bytes == 0 && e.pending_bytes == 0 &&
        e.num_segments == (e.plan_arena_bytes ? 1u : 0u))
      break;
    sleep_us(1000);
  }
  printf("  after gma_empty_cache: reserved %" PRIu64 ", arena %" PRIu64 ", stream_cached %" PRIu64
         ", pending %" PRIu64 ", free %" PRIu64 ", segments %" PRIu64 "\n",
         e.reserved.current, e.plan_arena_bytes, e.stream_cached_bytes, e.pending_bytes,
         e.free_bytes, e.num_segments);
  /* The arena's segment is all that stays: the arena, and the free rest of
   * its segment (a segment goes back whole). */
  CHECK(e.stream_cached_bytes == 0 && e.pending_bytes == 0);
  CHECK(e.num_segments == (e.plan_arena_bytes ? 1u : 0u));
  CHECK(e.reserved.current == e.plan_arena_bytes + e.free_bytes);
  for (int i = 0; i < nthreads; i++) {
    CHECK_OK(gma_stream_destroy(sh.g, th[i].T.s));
    CHECK_OK(gma_stream_destroy(sh.g, th[i].T.side));
  }
  CHECK_OK(gma_stream_destroy(sh.g, sh.comm));
  CHECK_OK(gma_destroy(sh.g));
  free(th);
  printf("stress_plan: ok\n");
  return 0;
}
