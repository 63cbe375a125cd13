/* API test of planned memory (plan:on, gma_iteration_mark), through gma.h.
 *
 * Every allocation gets a simulated kernel that writes a pattern unique to
 * it, holds, and checks it; the host frees right after queueing the kernel,
 * as a training loop does. A planned address handed out while earlier work
 * still uses it shows up as a corruption; two live allocations that overlap
 * are caught directly. Cases: a steady loop gets a plan and is then served
 * from it with no device allocation; deviations fall back without harm and
 * a changed workload re-plans; iterations that differ never get a plan; a
 * block used by a second stream (record_stream) and held there by a gated
 * kernel is not handed out again until that work is done; bad frees get
 * clear errors; the statistics add up. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "simkit.h"

enum { MAXLIVE = 64 };

/* One iteration's driver: the kernels (kept until the stream is
 * synchronized) and the live allocations, checked for overlap. */
typedef struct iter {
  gma_t *g;
  gma_stream_t s;
  pattern_kernel_t k[256];
  int nk;
  void *live[MAXLIVE];
  size_t live_len[MAXLIVE];
  atomic_int corruptions;
  uint8_t value;
} iter_t;

static void *take(iter_t *it, size_t len) {
  void *p = NULL;
  CHECK_OK(gma_alloc(it->g, len, it->s, &p));
  CHECK(p != NULL);
  int free_slot = -1;
  for (int i = 0; i < MAXLIVE; i++) {
    if (!it->live[i]) {
      if (free_slot < 0) free_slot = i;
      continue;
    }
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)it->live[i];
    CHECK(a + len <= b || b + it->live_len[i] <= a); /* two live allocations never overlap */
  }
  CHECK(free_slot >= 0);
  it->live[free_slot] = p;
  it->live_len[free_slot] = len;
  CHECK(it->nk < 256);
  pattern_kernel_t *k = &it->k[it->nk++];
  memset(k, 0, sizeof *k);
  k->buf = p;
  k->len = len < 65536 ? len : 65536; /* the start is enough to see an overlap */
  k->value = ++it->value ? it->value : ++it->value;
  k->hold_us = 50;
  k->corruptions = &it->corruptions;
  CHECK_OK(gma_sim_launch(it->g, it->s, pattern_kernel_run, k));
  return p;
}

static void give(iter_t *it, void *p) {
  for (int i = 0; i < MAXLIVE; i++)
    if (it->live[i] == p) it->live[i] = NULL;
  CHECK_OK(gma_free(it->g, p));
}

/* The end of an iteration: the host synchronizes (the kernels' records can
 * go), then marks. */
static void end_iteration(iter_t *it) {
  CHECK_OK(gma_stream_synchronize(it->g, it->s));
  CHECK(atomic_load(&it->corruptions) == 0);
  it->nk = 0;
  CHECK_OK(gma_iteration_mark(it->g));
}

/* A forward/backward-like iteration: activations kept for the backward
 * pass, temporaries, gradients; scale changes every size (a new shape). */
static void training_step(iter_t *it, size_t scale) {
  void *act[6];
  static const size_t act_size[6] = {3 << 20, 1 << 20, 5 << 20, 768 << 10, 2 << 20, 4096};
  for (int i = 0; i < 6; i++) {
    act[i] = take(it, act_size[i] * scale);
    void *tmp = take(it, (1 << 20) * scale + 512 * (size_t)i);
    give(it, tmp);
  }
  for (int i = 5; i >= 0; i--) {
    void *grad = take(it, act_size[i] * scale);
    give(it, act[i]);
    give(it, grad);
  }
}

static gma_t *plan_allocator(const char *extra) {
  char conf[256];
  snprintf(conf, sizeof conf, "plan:on,sim_capacity:1G%s%s", extra ? "," : "", extra ? extra : "");
  return sim_allocator(conf);
}

/* Runs steady iterations until the plan is active (at most 20). */
static void until_active(iter_t *it, size_t scale) {
  for (int i = 0; i < 20 && stats_of(it->g).plan_state != 4; i++) {
    training_step(it, scale);
    end_iteration(it);
    if (stats_of(it->g).plan_state == 3) sleep_us(2000); /* let the worker place it */
  }
  CHECK(stats_of(it->g).plan_state == 4);
}

/* An allocator with a plan active for training_step on one stream. */
static void open_active(iter_t *it, const char *conf) {
  memset(it, 0, sizeof *it);
  it->g = plan_allocator(conf);
  CHECK_OK(gma_stream_create(it->g, &it->s));
  until_active(it, 1);
}

static void close_iter(iter_t *it) {
  CHECK_OK(gma_stream_destroy(it->g, it->s));
  CHECK_OK(gma_destroy(it->g));
}

static void test_steady_loop(void) {
  iter_t it = {.g = plan_allocator(NULL)};
  CHECK_OK(gma_stream_create(it.g, &it.s));
  void *weights = NULL; /* lives across iterations: never planned */
  CHECK_OK(gma_alloc(it.g, 6 << 20, it.s, &weights));
  until_active(&it, 1);
  gma_stats_t a = stats_of(it.g);
  CHECK(a.plan_slots == 18);
  CHECK(a.plan_arena_bytes >= a.plan_lower_bound && a.plan_lower_bound > 0);
  CHECK(a.plan_arena_bytes <= a.plan_lower_bound + a.plan_lower_bound / 4);
  for (int i = 0; i < 5; i++) {
    training_step(&it, 1);
    end_iteration(&it);
  }
  gma_stats_t b = stats_of(it.g);
  CHECK(b.plan_state == 4);
  CHECK(b.plan_hits - a.plan_hits == 5 * 18); /* every request planned */
  CHECK(b.plan_misses == a.plan_misses);
  CHECK(b.num_device_allocs == a.num_device_allocs); /* nothing new from the device */
  CHECK(b.num_allocs - a.num_allocs == 5 * 18);
  /* Reserved is the weights' segment and the arena (the cache went back). */
  CHECK(b.reserved.current <= b.plan_arena_bytes + (20 << 20));
  /* The statistics show what callers hold, not the arena. */
  CHECK(b.allocated.current == 6 << 20);
  CHECK(b.reserved.current == b.allocated.current + b.stream_cached_bytes + b.pending_bytes +
                                  b.free_bytes + b.plan_arena_bytes);
  char summary[8192];
  CHECK_OK(gma_memory_summary(it.g, summary, sizeof summary));
  CHECK(strstr(summary, "active") != NULL);
  /* Its live rows count what the program holds too: the weights, not the
   * arena (no planned block is live between iterations). */
  CHECK(strstr(summary, "(1 live)") != NULL);
  CHECK(strstr(summary, "untagged                 | 6.00 MiB in 1 allocations") != NULL);
  /* With a planned block live, it counts among the live allocations. */
  uint64_t hits = stats_of(it.g).plan_hits;
  void *a0 = take(&it, 3 << 20); /* the iteration's first request: planned */
  CHECK(stats_of(it.g).plan_hits == hits + 1);
  CHECK_OK(gma_memory_summary(it.g, summary, sizeof summary));
  CHECK(strstr(summary, "(2 live)") != NULL);
  CHECK(strstr(summary, "untagged                 | 9.00 MiB in 2 allocations") != NULL);
  give(&it, a0);
  CHECK_OK(gma_stream_synchronize(it.g, it.s));
  CHECK_OK(gma_free(it.g, weights));
  close_iter(&it);
}

static void test_deviations(void) {
  iter_t it;
  open_active(&it, NULL);
  gma_stats_t a = stats_of(it.g);
  /* A few deviations: an extra request and a larger one in the middle. */
  void *extra = take(&it, 12345);
  training_step(&it, 1);
  void *odd = take(&it, 7 << 20);
  give(&it, odd);
  give(&it, extra);
  end_iteration(&it);
  gma_stats_t b = stats_of(it.g);
  CHECK(b.plan_state == 4 && b.plan_replans == 0);
  CHECK(b.plan_hits - a.plan_hits == 18);
  /* A new shape: every request misses; the plan is dropped, and the new
   * shape gets its own plan. */
  training_step(&it, 2);
  end_iteration(&it);
  gma_stats_t c = stats_of(it.g);
  CHECK(c.plan_replans == 1);
  CHECK(c.plan_state == 0 || c.plan_state == 1); /* served 1 iteration: a back-off first */
  until_active(&it, 2);
  gma_stats_t d = stats_of(it.g);
  training_step(&it, 2);
  end_iteration(&it);
  CHECK(stats_of(it.g).plan_hits - d.plan_hits == 18);
  close_iter(&it);
}

static void test_varying_never_plans(void) {
  iter_t it = {.g = plan_allocator(NULL)};
  CHECK_OK(gma_stream_create(it.g, &it.s));
  for (int i = 0; i < 30; i++) { /* a sequence length that changes every iteration */
    training_step(&it, 1 + (size_t)(i % 3));
    end_iteration(&it);
    CHECK(stats_of(it.g).plan_state != 3 && stats_of(it.g).plan_state != 4);
  }
  gma_stats_t s = stats_of(it.g);
  CHECK(s.plan_arena_bytes == 0 && s.plan_hits == 0);
  CHECK(s.plan_iterations == 30);
  close_iter(&it);
}

/* A block of the plan is used by a second stream (record_stream), whose
 * kernel is held by a gate past the next iteration's request for the same
 * planned address. By default that request gets the address behind a
 * device-side wait: the new user's kernel starts only once the held one is
 * done. Under reuse:none it takes the ordinary path instead. */
static void cross_stream_gate(const char *conf, bool waits) {
  iter_t it;
  open_active(&it, conf);
  gma_stream_t s2;
  CHECK_OK(gma_stream_create(it.g, &s2));
  for (int round = 0; round < 3; round++) {
    atomic_int gate = 0;
    void *p = take(&it, 3 << 20); /* the iteration's first request: act[0]'s slot */
    CHECK(p != NULL);
    pattern_kernel_t held = {.buf = p, .len = 65536, .value = 0xee, .gate = &gate,
                             .corruptions = &it.corruptions};
    CHECK_OK(gma_record_stream(it.g, (char *)p + 4096, s2)); /* an interior pointer names it */
    CHECK_OK(gma_stream_synchronize(it.g, it.s)); /* s2 may touch it only after s's kernel */
    CHECK_OK(gma_sim_launch(it.g, s2, pattern_kernel_run, &held));
    pattern_kernel_wait_started(&held);
    give(&it, p);
    void *tmp = take(&it, 1 << 20);
    give(&it, tmp);
    end_iteration(&it);
    gma_stats_t before = stats_of(it.g);
    training_step(&it, 1); /* its first request is p's slot again */
    gma_stats_t after = stats_of(it.g);
    sleep_us(20000);
    if (waits) {
      CHECK(after.num_cross_stream_waits > before.num_cross_stream_waits);
      CHECK(after.plan_misses == before.plan_misses);
      CHECK(!atomic_load(&it.k[0].started)); /* behind the held kernel */
    } else {
      CHECK(after.plan_misses > before.plan_misses);
      CHECK(after.num_cross_stream_waits == before.num_cross_stream_waits);
    }
    atomic_store(&gate, 1);
    CHECK_OK(gma_stream_synchronize(it.g, s2));
    CHECK_OK(gma_stream_synchronize(it.g, it.s));
    CHECK(atomic_load(&it.corruptions) == 0);
    end_iteration(&it);
  }
  CHECK_OK(gma_stream_destroy(it.g, s2));
  close_iter(&it);
}

static void test_cross_stream_gate(void) { cross_stream_gate(NULL, true); }
static void test_cross_stream_gate_none(void) { cross_stream_gate("reuse:none", false); }

static void test_bad_frees(void) {
  iter_t it;
  open_active(&it, NULL);
  void *p = take(&it, 3 << 20);
  CHECK(stats_of(it.g).plan_hits > 0);
  CHECK_ST(gma_free(it.g, (char *)p + 512), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "interior pointer") != NULL);
  give(&it, p);
  CHECK_ST(gma_free(it.g, p), GMA_ERR_DOUBLE_FREE);
  CHECK(strstr(gma_last_error(), "not live") != NULL);
  CHECK_ST(gma_record_stream(it.g, p, it.s), GMA_ERR_INVALID_POINTER);
  /* Still usable, and the plan still serves. */
  training_step(&it, 1);
  end_iteration(&it);
  CHECK(stats_of(it.g).plan_state == 4);
  close_iter(&it);
}

/* gma_pointer_info and gma_alloc_tagged see planned blocks, not the arena. */
static void test_pointer_info(void) {
  iter_t it;
  open_active(&it, NULL);
  void *p = NULL;
  gma_stats_t a = stats_of(it.g);
  CHECK_OK(gma_alloc_tagged(it.g, 3 << 20, it.s, "activations", &p));
  CHECK(stats_of(it.g).plan_hits == a.plan_hits + 1); /* planned */
  gma_pointer_info_t info = GMA_POINTER_INFO_INIT;
  CHECK_OK(gma_pointer_info(it.g, (char *)p + 1000, &info));
  CHECK(info.kind == GMA_MEMORY_DEVICE && info.base == p);
  CHECK(info.requested == 3 << 20 && info.block_size == 3 << 20);
  CHECK(info.stream == it.s);
  CHECK(strcmp(info.tag, "activations") == 0);
  /* The snapshot shows the arena's blocks: the live planned one (tagged),
   * the rest "planned"; its allocated figure is the callers' live bytes. */
  char path[64];
  snprintf(path, sizeof path, "/tmp/gma-plan-snap-%d.json", (int)getpid());
  CHECK_OK(gma_snapshot_json(it.g, path));
  FILE *f = fopen(path, "r");
  CHECK(f);
  static char json[1 << 16];
  size_t n = fread(json, 1, sizeof json - 1, f);
  fclose(f);
  unlink(path);
  json[n] = 0;
  CHECK(strstr(json, "\"state\":\"planned\"") != NULL);
  CHECK(strstr(json, "\"tag\":\"activations\"") != NULL);
  char want[64];
  snprintf(want, sizeof want, "\"allocated\":%llu,", (unsigned long long)stats_of(it.g).allocated.current);
  CHECK(strstr(json, want) != NULL);
  /* The live reports list the planned block, not the arena. */
  gma_allocation_info_t old[4];
  size_t count = 0;
  CHECK_OK(gma_find_old_allocations(it.g, 0, old, 4, &count));
  CHECK(count == 1 && old[0].ptr == p && old[0].block_size == 3 << 20);
  CHECK(strcmp(old[0].tag, "activations") == 0);
  char report[1024];
  CHECK_OK(gma_live_report(it.g, 4, report, sizeof report));
  CHECK(strncmp(report, "1 live allocations, 3145728 bytes", 33) == 0);
  CHECK_OK(gma_free(it.g, p));
  CHECK_ST(gma_pointer_info(it.g, p, &info), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "planned memory") != NULL);
  close_iter(&it);
}

/* plan:off: the mark is a no-op and the plan fields stay 0. */
static void test_off(void) {
  gma_t *g = sim_allocator(NULL);
  for (int i = 0; i < 5; i++) CHECK_OK(gma_iteration_mark(g));
  gma_stats_t s = stats_of(g);
  CHECK(s.plan_state == 0 && s.plan_iterations == 0 && s.plan_arena_bytes == 0);
  CHECK_OK(gma_destroy(g));
  CHECK_ST(gma_iteration_mark(NULL), GMA_ERR_INVALID_ARGUMENT);
}

/* Threads share the plan: two threads, each its own stream and its own
 * iteration, mark together through a barrier. */
typedef struct worker_arg {
  gma_t *g;
  pthread_barrier_t *bar;
  int corrupt;
} worker_arg_t;

static void *thread_loop(void *arg) {
  worker_arg_t *w = arg;
  iter_t *it = calloc(1, sizeof *it);
  CHECK(it);
  it->g = w->g;
  CHECK_OK(gma_stream_create(it->g, &it->s));
  for (int i = 0; i < 16; i++) {
    training_step(it, 1);
    CHECK_OK(gma_stream_synchronize(it->g, it->s));
    it->nk = 0;
    pthread_barrier_wait(w->bar);
    if (pthread_barrier_wait(w->bar) == PTHREAD_BARRIER_SERIAL_THREAD) {
      CHECK_OK(gma_iteration_mark(it->g));
      sleep_us(1000);
    }
    pthread_barrier_wait(w->bar);
  }
  w->corrupt = atomic_load(&it->corruptions);
  CHECK_OK(gma_stream_destroy(it->g, it->s));
  free(it);
  return NULL;
}

static void test_threads(void) {
  gma_t *g = plan_allocator(NULL);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  worker_arg_t w[2] = {{g, &bar, 0}, {g, &bar, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, thread_loop, &w[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&bar);
  CHECK(w[0].corrupt == 0 && w[1].corrupt == 0);
  gma_stats_t s = stats_of(g);
  CHECK(s.plan_state == 4);
  CHECK(s.plan_slots == 36);
  CHECK(s.plan_hits >= 36);
  CHECK_OK(gma_destroy(g));
}

/* gma_empty_cache with a plan active: kept while a planned block is live;
 * once none is, the arena goes back with the rest of the cache (reserved
 * 0), and the loop plans again later. */
static void test_empty_cache(void) {
  iter_t it;
  open_active(&it, NULL);
  void *p = take(&it, 3 << 20); /* the first planned request: a planned block */
  CHECK(stats_of(it.g).plan_hits > 0);
  CHECK_OK(gma_stream_synchronize(it.g, it.s));
  CHECK_OK(gma_empty_cache(it.g));
  gma_stats_t a = stats_of(it.g);
  CHECK(a.plan_state == 4 && a.plan_arena_bytes > 0 && a.reserved.current > 0);
  give(&it, p);
  it.nk = 0;
  CHECK_OK(gma_stream_synchronize(it.g, it.s));
  CHECK_OK(gma_empty_cache(it.g));
  gma_stats_t b = stats_of(it.g);
  CHECK(b.plan_state != 4 && b.plan_arena_bytes == 0);
  CHECK(b.reserved.current == 0 && b.allocated.current == 0);
  CHECK(b.plan_replans == a.plan_replans + 1);
  CHECK_OK(gma_iteration_mark(it.g)); /* the partial iteration ends */
  until_active(&it, 1);               /* and the loop is planned again */
  close_iter(&it);
}

/* An iteration of one request per size in sizes on it->s, freed in order:
 * a plan whose arena is small and on one stream. */
static void small_step(iter_t *it, const size_t *sizes, int n) {
  void *p[8];
  for (int i = 0; i < n; i++) p[i] = take(it, sizes[i]);
  for (int i = 0; i < n; i++) give(it, p[i]);
}

/* Runs small steps until one read of the stats finds the plan active (at
 * most 20): one read, since an arena with an idle time can go back between
 * two. */
static void until_active_small(iter_t *it, const size_t *sizes, int n) {
  int state = stats_of(it->g).plan_state;
  for (int i = 0; i < 20 && state != 4; i++) {
    small_step(it, sizes, n);
    end_iteration(it);
    state = stats_of(it->g).plan_state;
    if (state == 3) sleep_us(2000);
  }
  CHECK(state == 4);
}

typedef struct racer {
  gma_t *g;
  void *p;
  pthread_barrier_t *bar;
  gma_status_t st;
} racer_t;

static void *race_free(void *arg) {
  racer_t *r = arg;
  pthread_barrier_wait(r->bar);
  r->st = gma_free(r->g, r->p);
  return NULL;
}

/* Two threads free one planned block at once, after more streams used it
 * (gma_record_stream) than its slot ever had: exactly one free wins and the
 * other is told GMA_ERR_DOUBLE_FREE, with nothing touched before the
 * decision (the gates' buffer grows after it; ASan saw both threads
 * reallocate it). Each round names one more stream, so each one grows it. */
static void test_racing_frees(void) {
  iter_t it;
  open_active(&it, NULL);
  enum { ROUNDS = 12 };
  gma_stream_t users[ROUNDS];
  for (int i = 0; i < ROUNDS; i++) CHECK_OK(gma_stream_create(it.g, &users[i]));
  for (int round = 0; round < ROUNDS; round++) {
    uint64_t hits = stats_of(it.g).plan_hits;
    void *p = take(&it, 3 << 20); /* the iteration's first request: planned */
    CHECK(stats_of(it.g).plan_hits == hits + 1);
    for (int i = 0; i <= round; i++) CHECK_OK(gma_record_stream(it.g, p, users[i]));
    for (int i = 0; i < MAXLIVE; i++)
      if (it.live[i] == p) it.live[i] = NULL;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    racer_t r[2] = {{it.g, p, &bar, GMA_OK}, {it.g, p, &bar, GMA_OK}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, race_free, &r[i]) == 0);
    for (int i = 0; i < 2; i++) CHECK(pthread_join(t[i], NULL) == 0);
    pthread_barrier_destroy(&bar);
    CHECK((r[0].st == GMA_OK) + (r[1].st == GMA_OK) == 1);
    CHECK(r[0].st == GMA_ERR_DOUBLE_FREE || r[1].st == GMA_ERR_DOUBLE_FREE);
    for (int i = 0; i < ROUNDS; i++) CHECK_OK(gma_stream_synchronize(it.g, users[i]));
    end_iteration(&it);
  }
  gma_stats_t s = stats_of(it.g);
  CHECK(s.allocated.current == 0 && s.num_allocs == s.num_frees);
  for (int i = 0; i < ROUNDS; i++) CHECK_OK(gma_stream_destroy(it.g, users[i]));
  close_iter(&it);
}

/* Under memory_limit:64M, a 20 MiB planned block is live in its 20 MiB
 * arena and 30 MiB is freed behind a 300 ms kernel on another stream: a
 * 30 MiB request must wait for that kernel and succeed. The planned block
 * is inside the arena: counting both (40 MiB live) made it "a real
 * shortage" that failed at once. */
static void test_oom_wait_planned(void) {
  iter_t it = {.g = plan_allocator("memory_limit:64M")};
  CHECK_OK(gma_stream_create(it.g, &it.s));
  const size_t one[] = {20 << 20};
  until_active_small(&it, one, 1);
  void *p = take(&it, 20 << 20);
  CHECK(stats_of(it.g).plan_hits > 0);
  gma_stream_t s2;
  CHECK_OK(gma_stream_create(it.g, &s2));
  void *x = NULL;
  CHECK_OK(gma_alloc(it.g, 30 << 20, s2, &x));
  pattern_kernel_t k = {.buf = x, .len = 4096, .value = 7, .hold_us = 300000,
                        .corruptions = &it.corruptions};
  CHECK_OK(gma_sim_launch(it.g, s2, pattern_kernel_run, &k));
  CHECK_OK(gma_free(it.g, x));
  pattern_kernel_wait_started(&k);
  uint64_t t0 = now_ns();
  void *y = NULL;
  gma_status_t st = gma_alloc(it.g, 30 << 20, it.s, &y);
  if (st != GMA_OK) fprintf(stderr, "oom_wait_planned: %s\n", gma_last_error());
  CHECK(st == GMA_OK);
  CHECK(now_ns() - t0 >= 100000000u); /* it waited for the kernel */
  CHECK_OK(gma_free(it.g, y));
  give(&it, p);
  CHECK_OK(gma_stream_synchronize(it.g, s2));
  CHECK(atomic_load(&it.corruptions) == 0);
  CHECK_OK(gma_stream_destroy(it.g, s2));
  end_iteration(&it);
  close_iter(&it);
}

/* An active plan with nothing live holds its arena as cache: a request that
 * needs that memory drops the plan and succeeds (it failed, "live
 * allocations held" the arena, with nothing allocated); gma_trim(g, 0)
 * gives it back as gma_empty_cache does; a trim that can keep it keeps the
 * plan; and the worker's timed trim gives back an arena idle for idle_ms. */
static void test_idle_arena(void) {
  const size_t one[] = {36 << 20};
  iter_t it = {.g = plan_allocator("memory_limit:64M")};
  CHECK_OK(gma_stream_create(it.g, &it.s));
  until_active_small(&it, one, 1);
  gma_stats_t a = stats_of(it.g);
  CHECK(a.allocated.current == 0 && a.plan_arena_bytes >= (36 << 20));
  void *big = NULL;
  gma_status_t st = gma_alloc(it.g, 56 << 20, it.s, &big);
  if (st != GMA_OK) fprintf(stderr, "idle_arena: %s\n", gma_last_error());
  CHECK(st == GMA_OK);
  gma_stats_t b = stats_of(it.g);
  CHECK(b.plan_state != 4 && b.plan_replans == a.plan_replans + 1 && b.num_ooms == 0);
  CHECK_OK(gma_free(it.g, big));
  close_iter(&it);

  it = (iter_t){.g = plan_allocator(NULL)};
  CHECK_OK(gma_stream_create(it.g, &it.s));
  until_active_small(&it, one, 1);
  CHECK_OK(gma_trim(it.g, 1ull << 40)); /* room for it all: the plan stays */
  CHECK(stats_of(it.g).plan_state == 4);
  CHECK_OK(gma_trim(it.g, 0));
  gma_stats_t c = stats_of(it.g);
  CHECK(c.plan_state != 4 && c.plan_arena_bytes == 0 && c.reserved.current == 0);
  close_iter(&it);

  /* idle_ms well above a step's time under TSan on a loaded machine, so
   * the arena does not go back between the steps that plan it. */
  it = (iter_t){.g = plan_allocator("idle_ms:250,trim_interval_ms:10")};
  CHECK_OK(gma_stream_create(it.g, &it.s));
  until_active_small(&it, one, 1);
  for (int i = 0; i < 1000 && stats_of(it.g).plan_arena_bytes; i++) sleep_us(5000);
  gma_stats_t d = stats_of(it.g);
  CHECK(d.plan_state != 4 && d.plan_arena_bytes == 0);
  close_iter(&it);
}

/* A dropped plan's arena goes back next to a block cached on the same
 * stream and merges with it: the arena's count must come down by the
 * arena's own size (it came down by the merged size, leaving allocated at
 * the cached block's size for good). */
static void test_arena_merge_counts(void) {
  const size_t two[] = {1 << 20, 2 << 20};
  iter_t it = {.g = plan_allocator(NULL)};
  CHECK_OK(gma_stream_create(it.g, &it.s));
  until_active_small(&it, two, 2);
  void *x = NULL; /* on the arena's stream, beside it in its segment */
  CHECK_OK(gma_alloc(it.g, 6 << 20, NULL, &x));
  CHECK_OK(gma_free(it.g, x));
  CHECK_OK(gma_empty_cache(it.g));
  gma_stats_t s = stats_of(it.g);
  CHECK(s.plan_arena_bytes == 0 && s.allocated.current == 0 && s.requested.current == 0);
  CHECK(s.reserved.current == 0 && s.num_allocs == s.num_frees);
  close_iter(&it);
}

/* Trace rows of planned blocks carry the block's own figures: an allocate
 * row's Block is the planned block's size (not the arena's), a free row's
 * Size is the bytes asked for and its Stream the block's stream. */
static void test_trace_rows(void) {
  const size_t two[] = {1 << 20, 3 << 20};
  iter_t it = {.g = plan_allocator(NULL)};
  CHECK_OK(gma_stream_create(it.g, &it.s));
  until_active_small(&it, two, 2);
  char path[] = "/tmp/gma_plan_trace_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  CHECK_OK(gma_trace_start(it.g, path));
  uint64_t hits = stats_of(it.g).plan_hits;
  void *a = take(&it, (1 << 20) - 100), *b = take(&it, 3 << 20);
  CHECK(stats_of(it.g).plan_hits == hits + 2);
  give(&it, a);
  give(&it, b);
  CHECK_OK(gma_trace_stop(it.g));
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  char text[8192];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  unlink(path);
  char row[200];
  snprintf(row, sizeof row, ",allocate,%p,%d,%p,%d,", a, (1 << 20) - 100, it.s, 1 << 20);
  CHECK(strstr(text, row) != NULL);
  snprintf(row, sizeof row, ",free,%p,%d,%p,%d,", a, (1 << 20) - 100, it.s, 1 << 20);
  CHECK(strstr(text, row) != NULL);
  snprintf(row, sizeof row, ",free,%p,%d,%p,%d,", b, 3 << 20, it.s, 3 << 20);
  CHECK(strstr(text, row) != NULL);
  end_iteration(&it);
  close_iter(&it);
}

typedef struct watcher {
  gma_t *g;
  atomic_int quiet; /* the main thread makes no call now */
  atomic_int stop;
  atomic_long looks, broken;
} watcher_t;

/* gma_stats in a loop: whenever the main thread makes no call, nothing is
 * live and the accounting equation must hold exactly. */
static void *watch_stats(void *arg) {
  watcher_t *w = arg;
  while (!atomic_load(&w->stop)) {
    int quiet = atomic_load(&w->quiet);
    gma_stats_t s = stats_of(w->g);
    if (!quiet || !atomic_load(&w->quiet)) continue; /* a call began meanwhile */
    atomic_fetch_add(&w->looks, 1);
    if (s.reserved.current != s.allocated.current + s.stream_cached_bytes + s.pending_bytes +
                                  s.free_bytes + s.plan_arena_bytes &&
        atomic_fetch_add(&w->broken, 1) < 3)
      fprintf(stderr, "stats_while_reclaimed: reserved %" PRIu64 " != allocated %" PRIu64
              " + stream cached %" PRIu64 " + pending %" PRIu64 " + free %" PRIu64
              " + plan arena %" PRIu64 "\n", s.reserved.current, s.allocated.current,
              s.stream_cached_bytes, s.pending_bytes, s.free_bytes, s.plan_arena_bytes);
  }
  return NULL;
}

/* The worker's timed trim gives an idle plan's arena back while another
 * thread reads gma_stats, the caller making no call: the pool's figures and
 * the plan's are read in one step, so the arena is in both or in neither
 * (read apart, reserved still held it while plan_arena_bytes no longer
 * did, and the accounting equation broke). */
static void test_stats_while_reclaimed(void) {
  const size_t three[] = {1 << 20, 3 << 20, 2 << 20};
  iter_t it = {.g = plan_allocator("idle_ms:1,trim_interval_ms:1")};
  CHECK_OK(gma_stream_create(it.g, &it.s));
  watcher_t w = {.g = it.g};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, watch_stats, &w) == 0);
  uint64_t drops = 0;
  for (int round = 0; round < 40; round++) {
    /* Active again (the worker may drop it between iterations already). */
    for (int i = 0; i < 20 && stats_of(it.g).plan_state != 4; i++) {
      small_step(&it, three, 3);
      end_iteration(&it);
      if (stats_of(it.g).plan_state == 3) sleep_us(2000);
    }
    uint64_t replans = stats_of(it.g).plan_replans;
    if (stats_of(it.g).plan_state != 4) continue;
    atomic_store(&w.quiet, 1);
    for (int i = 0; i < 100 && stats_of(it.g).plan_replans == replans; i++) sleep_us(500);
    sleep_us(500);
    atomic_store(&w.quiet, 0);
    drops += stats_of(it.g).plan_replans > replans;
  }
  atomic_store(&w.stop, 1);
  CHECK(pthread_join(th, NULL) == 0);
  CHECK(drops > 0 && atomic_load(&w.looks) > 0);
  CHECK(atomic_load(&w.broken) == 0);
  close_iter(&it);
}

int main(int argc, char **argv) {
  static const test_case_t cases[] = {
      {"empty_cache", test_empty_cache},
      {"steady_loop", test_steady_loop},   {"deviations", test_deviations},
      {"varying_never_plans", test_varying_never_plans},
      {"cross_stream_gate", test_cross_stream_gate},
      {"cross_stream_gate_none", test_cross_stream_gate_none},
      {"bad_frees", test_bad_frees},       {"pointer_info", test_pointer_info},       {"off", test_off},
      {"threads", test_threads},
      {"racing_frees", test_racing_frees}, {"oom_wait_planned", test_oom_wait_planned},
      {"idle_arena", test_idle_arena},     {"arena_merge_counts", test_arena_merge_counts},
      {"trace_rows", test_trace_rows},     {"stats_while_reclaimed", test_stats_while_reclaimed},
  };
  return run_cases(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
