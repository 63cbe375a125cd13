/* Unit test of the simulated device (runtime/device/sim.c) through the device
 * boundary: stream order, stream concurrency, event semantics, cross-stream
 * waits, memory capacity and bad frees, fault injection, latencies, the
 * per-thread default stream, bad handles, teardown with work pending, and
 * CUDA-like stream destroy: it returns at once, queued work still runs, the
 * handle value is recycled, and stream_id tells the old stream from the new.
 * Kernels block on gates instead of sleeping wherever order matters, so the
 * test is deterministic and fast even under TSan. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "device/device.h"

#define LEGACY ((gma_stream_t)(uintptr_t)0x1)
#define PER_THREAD ((gma_stream_t)(uintptr_t)0x2)
#define MS 1000000ull

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  nanosleep(&ts, NULL);
}

/* Waits until *flag is nonzero; fails the test after 10 s instead of hanging. */
static bool wait_flag(atomic_int *flag, uint64_t timeout_ns) {
  uint64_t end = now_ns() + timeout_ns;
  while (!atomic_load(flag)) {
    if (now_ns() > end) return false;
    sleep_ns(100000);
  }
  return true;
}

static gma__device_t *make_dev(gma_config_t *cfg) {
  gma__device_t *dev = NULL;
  CHECK_OK(gma__sim_create(cfg, &dev));
  CHECK(dev && dev->ops && strcmp(dev->name, "sim") == 0 && dev->ops->sim_launch);
  return dev;
}

/* ---- kernels ---------------------------------------------------------------- */
static void k_gate(void *arg) { CHECK(wait_flag(arg, 10000 * MS)); }
static void k_set(void *arg) { atomic_store((atomic_int *)arg, 1); }
static void k_count(void *arg) { atomic_fetch_add((atomic_int *)arg, 1); }
static void k_tid(void *arg) { *(pthread_t *)arg = pthread_self(); }
static void k_sleep_set(void *arg) {
  sleep_ns(30 * MS);
  atomic_store((atomic_int *)arg, 1);
}

typedef struct order_arg {
  int *log, *n, v;
} order_arg_t;
/* Plain (non-atomic) accesses: only stream order and synchronization make
 * them race-free, which is what TSan then checks. */
static void k_append(void *arg) {
  order_arg_t *a = arg;
  if (a->v % 17 == 0) sleep_ns(200000);
  a->log[(*a->n)++] = a->v;
}

typedef struct meet_arg {
  atomic_int *mine, *other;
  int met;
} meet_arg_t;
static void k_meet(void *arg) {
  meet_arg_t *m = arg;
  atomic_store(m->mine, 1);
  m->met = wait_flag(m->other, 5000 * MS);
}

static int shared_value;
static void k_write42(void *arg) { shared_value = 42; }
static void k_read(void *arg) { *(int *)arg = shared_value; }

/* ---- tests ------------------------------------------------------------------ */
static void test_in_order(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t s;
  CHECK_OK(o->stream_create(dev, &s));
  enum { N = 200 };
  static int log[N];
  int n = 0;
  static order_arg_t args[N];
  for (int i = 0; i < N; i++) {
    args[i] = (order_arg_t){log, &n, i};
    CHECK_OK(o->sim_launch(dev, s, k_append, &args[i]));
  }
  CHECK_OK(o->stream_synchronize(dev, s));
  CHECK(n == N);
  for (int i = 0; i < N; i++) CHECK(log[i] == i);

  /* NULL and 0x1 name the same stream, which is not the caller's thread nor s's. */
  pthread_t t_null, t_legacy, t_user;
  CHECK_OK(o->sim_launch(dev, NULL, k_tid, &t_null));
  CHECK_OK(o->sim_launch(dev, LEGACY, k_tid, &t_legacy));
  CHECK_OK(o->sim_launch(dev, s, k_tid, &t_user));
  CHECK_OK(o->device_synchronize(dev));
  CHECK(pthread_equal(t_null, t_legacy));
  CHECK(!pthread_equal(t_null, pthread_self()) && !pthread_equal(t_null, t_user));
  CHECK_OK(o->stream_destroy(dev, s));
  o->destroy(dev);
}

static void test_concurrency(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t a, b;
  CHECK_OK(o->stream_create(dev, &a));
  CHECK_OK(o->stream_create(dev, &b));
  atomic_int fa = 0, fb = 0;
  /* Each kernel waits to see the other one running: both succeed only if
   * the two streams execute at the same time. */
  meet_arg_t ma = {&fa, &fb, 0}, mb = {&fb, &fa, 0};
  CHECK_OK(o->sim_launch(dev, a, k_meet, &ma));
  CHECK_OK(o->sim_launch(dev, b, k_meet, &mb));
  CHECK_OK(o->stream_synchronize(dev, a));
  CHECK_OK(o->stream_synchronize(dev, b));
  CHECK(ma.met && mb.met);
  CHECK_OK(o->stream_destroy(dev, a));
  CHECK_OK(o->stream_destroy(dev, b));
  o->destroy(dev);
}

static void test_events(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t a, b;
  CHECK_OK(o->stream_create(dev, &a));
  CHECK_OK(o->stream_create(dev, &b));
  gma__event_t ev;
  bool done = false;
  CHECK_OK(o->event_create(dev, &ev));
  /* Never recorded: complete. */
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(done);
  CHECK_OK(o->event_synchronize(dev, ev));
  /* Recorded on an idle stream: complete at once. */
  CHECK_OK(o->event_record(dev, ev, a));
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(done);
  /* Recorded behind a blocked kernel: pending until it runs. */
  atomic_int gate = 0;
  CHECK_OK(o->sim_launch(dev, a, k_gate, &gate));
  CHECK_OK(o->event_record(dev, ev, a));
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(!done);
  sleep_ns(5 * MS);
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(!done);
  atomic_store(&gate, 1);
  CHECK_OK(o->event_synchronize(dev, ev));
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(done);
  /* synchronize really waits for the recorded work. */
  atomic_int flag = 0;
  CHECK_OK(o->sim_launch(dev, b, k_sleep_set, &flag));
  CHECK_OK(o->event_record(dev, ev, b));
  CHECK_OK(o->event_synchronize(dev, ev));
  CHECK(atomic_load(&flag) == 1);
  /* Re-recorded: the latest record counts, in both directions. */
  atomic_int gate2 = 0;
  CHECK_OK(o->sim_launch(dev, a, k_gate, &gate2));
  CHECK_OK(o->event_record(dev, ev, a));
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(!done);
  /* event_synchronize does not wait for b's thread to go idle; this does. */
  CHECK_OK(o->stream_synchronize(dev, b));
  CHECK_OK(o->event_record(dev, ev, b)); /* b is idle: complete at once */
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(done);
  atomic_int gate3 = 0;
  CHECK_OK(o->sim_launch(dev, b, k_gate, &gate3));
  CHECK_OK(o->event_record(dev, ev, b));
  atomic_store(&gate2, 1); /* a's older record completes; the event stays pending */
  CHECK_OK(o->stream_synchronize(dev, a));
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(!done);
  atomic_store(&gate3, 1);
  CHECK_OK(o->event_synchronize(dev, ev));
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(done);
  /* Unknown and destroyed event handles are errors, not crashes. */
  gma__event_t bogus = (gma__event_t)(uintptr_t)0xbad000;
  CHECK_ST(o->event_query(dev, bogus, &done), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "not a live event"));
  CHECK_ST(o->event_record(dev, bogus, a), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->event_synchronize(dev, bogus), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->stream_wait_event(dev, a, bogus), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(o->event_destroy(dev, ev));
  CHECK_ST(o->event_destroy(dev, ev), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->event_query(dev, ev, &done), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(o->stream_destroy(dev, a));
  CHECK_OK(o->stream_destroy(dev, b));
  o->destroy(dev);
}

static void test_wait_event(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t a, b;
  CHECK_OK(o->stream_create(dev, &a));
  CHECK_OK(o->stream_create(dev, &b));
  gma__event_t ev, never;
  CHECK_OK(o->event_create(dev, &ev));
  CHECK_OK(o->event_create(dev, &never));
  /* Waiting on a never-recorded event does not hold b up. */
  atomic_int ran0 = 0;
  CHECK_OK(o->stream_wait_event(dev, b, never));
  CHECK_OK(o->sim_launch(dev, b, k_set, &ran0));
  CHECK_OK(o->stream_synchronize(dev, b));
  CHECK(atomic_load(&ran0) == 1);

  atomic_int gate = 0, ran = 0;
  int seen = 0;
  shared_value = 0;
  CHECK_OK(o->sim_launch(dev, a, k_gate, &gate));
  CHECK_OK(o->sim_launch(dev, a, k_write42, NULL));
  CHECK_OK(o->event_record(dev, ev, a));
  /* The host returns from the wait while a is still blocked. */
  CHECK_OK(o->stream_wait_event(dev, b, ev));
  CHECK_OK(o->sim_launch(dev, b, k_read, &seen));
  CHECK_OK(o->sim_launch(dev, b, k_set, &ran));
  /* A later record of ev does not change what b waits for. */
  CHECK_OK(o->event_record(dev, ev, NULL));
  sleep_ns(20 * MS);
  CHECK(atomic_load(&ran) == 0);
  atomic_store(&gate, 1);
  CHECK_OK(o->stream_synchronize(dev, b));
  CHECK(seen == 42 && atomic_load(&ran) == 1);
  CHECK_OK(o->event_destroy(dev, ev));
  CHECK_OK(o->event_destroy(dev, never));
  CHECK_OK(o->stream_destroy(dev, a));
  CHECK_OK(o->stream_destroy(dev, b));
  o->destroy(dev);
}

static void test_memory(void) {
  gma_config_t cfg = GMA_CONFIG_INIT;
  cfg.sim_capacity = 1 << 20;
  gma__device_t *dev = make_dev(&cfg);
  const gma__device_ops_t *o = dev->ops;
  uint64_t fr, tot;
  uintptr_t a, b, c;
  CHECK_OK(o->mem_info(dev, &fr, &tot));
  CHECK(fr == 1 << 20 && tot == 1 << 20);
  CHECK_OK(o->mem_alloc(dev, 512 << 10, &a));
  CHECK_OK(o->mem_alloc(dev, 512 << 10, &b));
  CHECK(a % 512 == 0 && b % 512 == 0 && a != b);
  memset((void *)a, 0xab, 512 << 10);
  memset((void *)b, 0xcd, 512 << 10);
  CHECK(((unsigned char *)a)[1000] == 0xab);
  CHECK_ST(o->mem_alloc(dev, 1, &c), GMA_ERR_OOM);
  CHECK(strstr(gma_last_error(), "requested 1 bytes") && strstr(gma_last_error(), "1048576"));
  CHECK_ST(o->mem_alloc(dev, 0, &c), GMA_ERR_INVALID_SIZE);
  CHECK_OK(o->mem_info(dev, &fr, &tot));
  CHECK(fr == 0 && tot == 1 << 20);
  CHECK_OK(o->mem_free(dev, a, 512 << 10));
  CHECK_OK(o->mem_info(dev, &fr, NULL));
  CHECK(fr == 512 << 10);
  CHECK_OK(o->mem_alloc(dev, 256 << 10, &c));
  CHECK_ST(o->mem_alloc(dev, (256 << 10) + 1, &a), GMA_ERR_OOM);
  CHECK_OK(o->mem_free(dev, c, 256 << 10));
  /* Bad frees change nothing. */
  CHECK_ST(o->mem_free(dev, (uintptr_t)0x12340000, 4096), GMA_ERR_DEVICE);
  CHECK(strstr(gma_last_error(), "not a live device allocation"));
  CHECK_ST(o->mem_free(dev, b, 100), GMA_ERR_DEVICE);
  CHECK(strstr(gma_last_error(), "524288"));
  CHECK_OK(o->mem_info(dev, &fr, NULL));
  CHECK(fr == 512 << 10);
  CHECK_OK(o->mem_free(dev, b, 512 << 10));
  CHECK_ST(o->mem_free(dev, b, 512 << 10), GMA_ERR_DEVICE);
  CHECK_OK(o->mem_alloc(dev, 4096, &a)); /* left live: destroy releases it */
  o->destroy(dev);

  /* Default capacity is 80 GiB, and untouched memory costs nothing. */
  dev = make_dev(NULL);
  o = dev->ops;
  CHECK_OK(o->mem_info(dev, &fr, &tot));
  CHECK(tot == 80ull << 30 && fr == tot);
  CHECK_OK(o->mem_alloc(dev, 37ull << 30, &a));
  ((volatile char *)a)[(37ull << 30) - 1] = 1;
  CHECK_OK(o->mem_info(dev, &fr, NULL));
  CHECK(fr == 43ull << 30);
  CHECK_ST(o->mem_alloc(dev, 44ull << 30, &b), GMA_ERR_OOM);
  CHECK_OK(o->mem_free(dev, a, 37ull << 30));
  o->destroy(dev);
}

/* Virtual memory: reservations are address space only; chunks map under the
 * capacity, refuse overlaps and partial unmaps, and a reservation with
 * chunks still mapped cannot be released. */
static void test_vm(void) {
  gma_config_t cfg = GMA_CONFIG_INIT;
  cfg.sim_capacity = 8 << 20;
  gma__device_t *dev = make_dev(&cfg);
  const gma__device_ops_t *o = dev->ops;
  uint64_t g = 0, fr, h1, h2, h3;
  CHECK_OK(o->vm_granularity(dev, &g));
  CHECK(g == 2 << 20);
  uintptr_t r;
  CHECK_ST(o->vm_reserve(dev, g + 512, &r), GMA_ERR_INVALID_SIZE);
  CHECK_OK(o->vm_reserve(dev, 64 * g, &r)); /* far beyond the capacity: address space */
  CHECK(r % g == 0);
  CHECK_OK(o->mem_info(dev, &fr, NULL));
  CHECK(fr == 8 << 20);
  CHECK_OK(o->vm_map(dev, r, 2 * g, &h1));
  memset((void *)r, 0x11, 2 * g);
  CHECK_OK(o->vm_map(dev, r + 3 * g, g, &h2));
  memset((void *)(r + 3 * g), 0x22, g);
  CHECK_OK(o->mem_info(dev, &fr, NULL));
  CHECK(fr == 2 << 20);
  CHECK_ST(o->vm_map(dev, r + g, g, &h3), GMA_ERR_DEVICE); /* overlaps the first */
  CHECK(strstr(gma_last_error(), "already mapped"));
  CHECK_ST(o->vm_map(dev, r + 5 * g, 2 * g, &h3), GMA_ERR_OOM); /* capacity */
  CHECK_ST(o->vm_map(dev, r - 4 * g, g, &h3), GMA_ERR_DEVICE); /* outside */
  CHECK_ST(o->vm_map(dev, r + 512, g, &h3), GMA_ERR_INVALID_SIZE);
  CHECK_ST(o->vm_unmap(dev, r, g, h1), GMA_ERR_DEVICE); /* only half of a mapping */
  CHECK_ST(o->mem_free(dev, r, 2 * g), GMA_ERR_DEVICE); /* not a mem_alloc */
  CHECK_ST(o->vm_release(dev, r, 64 * g), GMA_ERR_DEVICE); /* still mapped */
  CHECK(strstr(gma_last_error(), "still mapped"));
  CHECK(((unsigned char *)r)[g + 5] == 0x11);
  CHECK_OK(o->vm_unmap(dev, r, 2 * g, h1));
  CHECK_OK(o->mem_info(dev, &fr, NULL));
  CHECK(fr == 6 << 20);
  /* Mapped again, the chunk is fresh zeroed memory. */
  CHECK_OK(o->vm_map(dev, r + g, g, &h3));
  CHECK(((unsigned char *)r)[g + 5] == 0);
  CHECK(((unsigned char *)r)[3 * g + 5] == 0x22);
  CHECK_OK(o->vm_unmap(dev, r + g, g, h3));
  CHECK_OK(o->vm_unmap(dev, r + 3 * g, g, h2));
  CHECK_OK(o->vm_release(dev, r, 64 * g));
  CHECK_ST(o->vm_release(dev, r, 64 * g), GMA_ERR_DEVICE);
  /* Destroy unmaps and releases whatever is left. */
  CHECK_OK(o->vm_reserve(dev, 4 * g, &r));
  CHECK_OK(o->vm_map(dev, r, g, &h1));
  o->destroy(dev);
}

static void test_faults(void) {
  gma_config_t cfg = GMA_CONFIG_INIT;
  cfg.sim_fail_alloc = 3;
  cfg.sim_fail_event = 4;
  gma__device_t *dev = make_dev(&cfg);
  const gma__device_ops_t *o = dev->ops;
  uintptr_t p[8];
  int failed = 0;
  for (int i = 0; i < 8; i++) {
    gma_status_t st = o->mem_alloc(dev, 4096, &p[i]);
    if (i == 2) {
      CHECK(st == GMA_ERR_DEVICE && strstr(gma_last_error(), "device allocation #3"));
      failed++;
      p[i] = 0;
    } else {
      CHECK(st == GMA_OK);
    }
  }
  CHECK(failed == 1);
  for (int i = 0; i < 8; i++) {
    if (p[i]) CHECK_OK(o->mem_free(dev, p[i], 4096));
  }
  /* Event calls 1..3 succeed, call 4 (event_synchronize) fails, later ones succeed. */
  gma__event_t ev;
  bool done;
  CHECK_OK(o->event_create(dev, &ev));                     /* 1 */
  CHECK_OK(o->event_record(dev, ev, NULL));                /* 2 */
  CHECK_OK(o->event_query(dev, ev, &done));                /* 3 */
  CHECK_ST(o->event_synchronize(dev, ev), GMA_ERR_DEVICE); /* 4 */
  CHECK(strstr(gma_last_error(), "event call #4"));
  for (int i = 0; i < 4; i++) {
    CHECK_OK(o->stream_wait_event(dev, NULL, ev));
    CHECK_OK(o->event_record(dev, ev, NULL));
    CHECK_OK(o->event_query(dev, ev, &done));
    CHECK_OK(o->event_synchronize(dev, ev));
  }
  CHECK_OK(o->event_destroy(dev, ev));
  o->destroy(dev);
}

static void test_latency(void) {
  gma_config_t cfg = GMA_CONFIG_INIT;
  cfg.sim_alloc_latency_ns = 20 * MS;
  cfg.sim_free_latency_ns = 10 * MS;
  cfg.sim_event_latency_ns = 15 * MS;
  gma__device_t *dev = make_dev(&cfg);
  const gma__device_ops_t *o = dev->ops;
  uintptr_t p;
  gma__event_t ev;
  bool done;
  uint64_t t0 = now_ns();
  CHECK_OK(o->mem_alloc(dev, 4096, &p));
  uint64_t t1 = now_ns();
  CHECK_OK(o->mem_free(dev, p, 4096));
  uint64_t t2 = now_ns();
  CHECK_OK(o->event_create(dev, &ev));
  uint64_t t3 = now_ns();
  CHECK_OK(o->event_record(dev, ev, NULL));
  uint64_t t4 = now_ns();
  CHECK_OK(o->event_query(dev, ev, &done));
  uint64_t t5 = now_ns();
  CHECK(t1 - t0 >= 20 * MS && t1 - t0 < 2000 * MS);
  CHECK(t2 - t1 >= 10 * MS && t2 - t1 < 2000 * MS);
  CHECK(t4 - t3 >= 15 * MS && t4 - t3 < 2000 * MS);
  CHECK(t5 - t4 >= 15 * MS && t5 - t4 < 2000 * MS);
  CHECK_OK(o->event_destroy(dev, ev));
  o->destroy(dev);
}

typedef struct ptds_arg {
  gma__device_t *dev;
  atomic_int *gate, *launched, *t2_done;
  pthread_t tid;
} ptds_arg_t;

/* T1 blocks its own per-thread stream and stays alive (so its pthread_t is
 * not recycled for T2) until T2 has finished. */
static void *ptds_t1(void *arg) {
  ptds_arg_t *a = arg;
  CHECK_OK(a->dev->ops->sim_launch(a->dev, PER_THREAD, k_gate, a->gate));
  CHECK_OK(a->dev->ops->sim_launch(a->dev, PER_THREAD, k_tid, &a->tid));
  atomic_store(a->launched, 1);
  CHECK(wait_flag(a->t2_done, 10000 * MS));
  return NULL;
}

/* T2's per-thread stream runs although T1's is blocked: they are distinct. */
static void *ptds_t2(void *arg) {
  ptds_arg_t *a = arg;
  CHECK(wait_flag(a->launched, 10000 * MS));
  CHECK_OK(a->dev->ops->sim_launch(a->dev, PER_THREAD, k_tid, &a->tid));
  CHECK_OK(a->dev->ops->stream_synchronize(a->dev, PER_THREAD));
  atomic_store(a->t2_done, 1);
  return NULL;
}

static void test_per_thread_stream(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  pthread_t m1, m2, legacy;
  CHECK_OK(o->sim_launch(dev, PER_THREAD, k_tid, &m1));
  CHECK_OK(o->sim_launch(dev, PER_THREAD, k_tid, &m2));
  CHECK_OK(o->sim_launch(dev, NULL, k_tid, &legacy));
  CHECK_OK(o->stream_synchronize(dev, PER_THREAD));
  CHECK_OK(o->stream_synchronize(dev, NULL));
  CHECK(pthread_equal(m1, m2) && !pthread_equal(m1, legacy));
  CHECK_ST(o->stream_destroy(dev, PER_THREAD), GMA_ERR_INVALID_ARGUMENT);

  atomic_int gate = 0, launched = 0, t2_done = 0;
  ptds_arg_t a1 = {dev, &gate, &launched, &t2_done, 0}, a2 = a1;
  pthread_t th1, th2;
  CHECK(pthread_create(&th1, NULL, ptds_t1, &a1) == 0);
  CHECK(pthread_create(&th2, NULL, ptds_t2, &a2) == 0);
  pthread_join(th2, NULL);
  pthread_join(th1, NULL);
  atomic_store(&gate, 1);
  CHECK_OK(o->device_synchronize(dev)); /* drains T1's stream, whose thread exited */
  CHECK(!pthread_equal(a1.tid, a2.tid) && !pthread_equal(a1.tid, m1) &&
        !pthread_equal(a2.tid, m1) && !pthread_equal(a1.tid, legacy) &&
        !pthread_equal(a2.tid, legacy));
  o->destroy(dev);
}

static void test_bad_streams(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t bogus = (gma_stream_t)(uintptr_t)0xdead0, s;
  gma__event_t ev;
  atomic_int flag = 0;
  CHECK_OK(o->event_create(dev, &ev));
  CHECK_ST(o->sim_launch(dev, bogus, k_set, &flag), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "not a live stream"));
  CHECK_ST(o->event_record(dev, ev, bogus), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->stream_wait_event(dev, bogus, ev), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->stream_synchronize(dev, bogus), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->stream_destroy(dev, bogus), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->sim_launch(dev, NULL, NULL, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->stream_destroy(dev, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->stream_destroy(dev, LEGACY), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->stream_destroy(dev, PER_THREAD), GMA_ERR_INVALID_ARGUMENT);
  /* A destroyed stream is unknown at once; its queued work still runs, and
   * device_synchronize waits for it. */
  CHECK_OK(o->stream_create(dev, &s));
  CHECK_OK(o->sim_launch(dev, s, k_sleep_set, &flag));
  CHECK_OK(o->stream_destroy(dev, s));
  CHECK_ST(o->sim_launch(dev, s, k_set, &flag), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->stream_synchronize(dev, s), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->stream_destroy(dev, s), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(o->event_record(dev, ev, s), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(o->device_synchronize(dev));
  CHECK(atomic_load(&flag) == 1);
  CHECK_OK(o->event_destroy(dev, ev));
  o->destroy(dev);
}

static void test_event_destroy_queued(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t a, b;
  CHECK_OK(o->stream_create(dev, &a));
  CHECK_OK(o->stream_create(dev, &b));
  gma__event_t ev;
  CHECK_OK(o->event_create(dev, &ev));
  atomic_int gate = 0, ran = 0;
  bool done;
  CHECK_OK(o->sim_launch(dev, a, k_gate, &gate));
  CHECK_OK(o->event_record(dev, ev, a));      /* a RECORD op holds ev's mark */
  CHECK_OK(o->stream_wait_event(dev, b, ev)); /* a WAIT op holds ev's mark */
  CHECK_OK(o->sim_launch(dev, b, k_set, &ran));
  CHECK_OK(o->event_destroy(dev, ev));
  CHECK_ST(o->event_query(dev, ev, &done), GMA_ERR_INVALID_ARGUMENT);
  sleep_ns(5 * MS);
  CHECK(atomic_load(&ran) == 0); /* the wait still holds b */
  atomic_store(&gate, 1);
  CHECK_OK(o->stream_synchronize(dev, b));
  CHECK(atomic_load(&ran) == 1);
  CHECK_OK(o->stream_destroy(dev, a));
  CHECK_OK(o->stream_destroy(dev, b));
  o->destroy(dev);
}

static void test_destroy_pending(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t a, b;
  CHECK_OK(o->stream_create(dev, &a));
  CHECK_OK(o->stream_create(dev, &b));
  gma__event_t ev;
  CHECK_OK(o->event_create(dev, &ev));
  atomic_int count = 0, flag = 0;
  uintptr_t p;
  CHECK_OK(o->mem_alloc(dev, 1 << 20, &p));
  /* b waits on a's slow kernel; everything is left queued and alive. */
  CHECK_OK(o->sim_launch(dev, a, k_sleep_set, &flag));
  CHECK_OK(o->event_record(dev, ev, a));
  CHECK_OK(o->stream_wait_event(dev, b, ev));
  for (int i = 0; i < 10; i++) {
    CHECK_OK(o->sim_launch(dev, a, k_count, &count));
    CHECK_OK(o->sim_launch(dev, b, k_count, &count));
    CHECK_OK(o->sim_launch(dev, NULL, k_count, &count));
    CHECK_OK(o->sim_launch(dev, PER_THREAD, k_count, &count));
  }
  CHECK_OK(o->event_record(dev, ev, b));
  o->destroy(dev);
  CHECK(atomic_load(&flag) == 1 && atomic_load(&count) == 40);
}

/* Several host threads hammer shared streams, their per-thread streams,
 * events and memory at once; TSan checks the locking. */
enum { MT_THREADS = 4, MT_ITERS = 150 };
typedef struct mt_arg {
  gma__device_t *dev;
  gma_stream_t *streams;
  gma__event_t *events;
  atomic_int *count;
  int id;
} mt_arg_t;

static void *mt_main(void *arg) {
  mt_arg_t *m = arg;
  const gma__device_ops_t *o = m->dev->ops;
  unsigned seed = (unsigned)m->id * 2654435761u + 1;
  for (int i = 0; i < MT_ITERS; i++) {
    seed = seed * 1103515245u + 12345u;
    gma_stream_t s = (seed >> 8) % 4 == 3 ? PER_THREAD : m->streams[(seed >> 8) % 3];
    gma__event_t other = m->events[(seed >> 12) % MT_THREADS];
    bool done;
    uintptr_t p;
    CHECK_OK(o->sim_launch(m->dev, s, k_count, m->count));
    CHECK_OK(o->event_record(m->dev, m->events[m->id], s));
    CHECK_OK(o->stream_wait_event(m->dev, s, other));
    CHECK_OK(o->event_query(m->dev, other, &done));
    if (i % 16 == 0) CHECK_OK(o->event_synchronize(m->dev, m->events[m->id]));
    if (i % 8 == 0) {
      CHECK_OK(o->mem_alloc(m->dev, 8192, &p));
      CHECK_OK(o->mem_free(m->dev, p, 8192));
    }
  }
  CHECK_OK(o->stream_synchronize(m->dev, PER_THREAD));
  return NULL;
}

static void test_threads(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t streams[3];
  gma__event_t events[MT_THREADS];
  atomic_int count = 0;
  for (int i = 0; i < 3; i++) CHECK_OK(o->stream_create(dev, &streams[i]));
  for (int i = 0; i < MT_THREADS; i++) CHECK_OK(o->event_create(dev, &events[i]));
  pthread_t th[MT_THREADS];
  mt_arg_t args[MT_THREADS];
  for (int i = 0; i < MT_THREADS; i++) {
    args[i] = (mt_arg_t){dev, streams, events, &count, i};
    CHECK(pthread_create(&th[i], NULL, mt_main, &args[i]) == 0);
  }
  for (int i = 0; i < MT_THREADS; i++) pthread_join(th[i], NULL);
  CHECK_OK(o->device_synchronize(dev));
  CHECK(atomic_load(&count) == MT_THREADS * MT_ITERS);
  for (int i = 0; i < MT_THREADS; i++) CHECK_OK(o->event_destroy(dev, events[i]));
  for (int i = 0; i < 3; i++) CHECK_OK(o->stream_destroy(dev, streams[i]));
  o->destroy(dev);
}

/* ---- stream destroy, handle recycling, stream ids ---------------------------- */
#define INVALID GMA_ERR_INVALID_ARGUMENT

typedef struct self_destroy_arg {
  gma__device_t *dev;
  gma_stream_t stream;
  gma_status_t st;
} self_destroy_arg_t;
/* A kernel may destroy its own stream: destroy never waits. */
static void k_destroy_self(void *arg) {
  self_destroy_arg_t *a = arg;
  a->st = a->dev->ops->stream_destroy(a->dev, a->stream);
}

/* destroy returns at once while the stream's kernel is blocked; the blocked
 * kernel and the work queued behind it still run; the next stream_create
 * returns the same handle value with a different id, and that new stream runs
 * independently of the old one's blocked work. */
static void test_destroy_async(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t s, s2, s3, x, y, h1, h2;
  uint64_t id1, id2, id3, dummy;
  atomic_int gate = 0, after = 0, ran2 = 0;
  CHECK_OK(o->stream_create(dev, &s));
  CHECK_OK(o->stream_id(dev, s, &id1));
  CHECK_OK(o->sim_launch(dev, s, k_gate, &gate));
  CHECK_OK(o->sim_launch(dev, s, k_set, &after));
  uint64_t t0 = now_ns();
  CHECK_OK(o->stream_destroy(dev, s));
  uint64_t t1 = now_ns();
  CHECK(t1 - t0 < 500 * MS); /* a waiting destroy would take until the gate opens */
  CHECK(atomic_load(&after) == 0);
  CHECK_ST(o->stream_id(dev, s, &dummy), INVALID);
  CHECK_ST(o->sim_launch(dev, s, k_set, &ran2), INVALID);
  CHECK_ST(o->stream_synchronize(dev, s), INVALID);

  /* Same handle value, new stream, while the old kernel is still blocked. */
  CHECK_OK(o->stream_create(dev, &s2));
  CHECK(s2 == s);
  CHECK_OK(o->stream_id(dev, s2, &id2));
  CHECK(id2 != 0 && id2 != id1);
  CHECK_OK(o->sim_launch(dev, s2, k_set, &ran2));
  CHECK_OK(o->stream_synchronize(dev, s2));
  CHECK(atomic_load(&ran2) == 1 && atomic_load(&after) == 0);
  /* An event on the new stream is not held up by the old stream's work. */
  gma__event_t ev;
  bool done = false;
  atomic_int gate_b = 0;
  CHECK_OK(o->event_create(dev, &ev));
  CHECK_OK(o->sim_launch(dev, s2, k_gate, &gate_b));
  CHECK_OK(o->event_record(dev, ev, s2));
  CHECK_OK(o->event_query(dev, ev, &done));
  CHECK(!done);
  atomic_store(&gate_b, 1);
  CHECK_OK(o->event_synchronize(dev, ev));
  CHECK(atomic_load(&after) == 0);

  /* Recycled again (LIFO), still while the first stream is blocked. */
  CHECK_OK(o->stream_destroy(dev, s2));
  CHECK_OK(o->stream_create(dev, &s3));
  CHECK(s3 == s);
  CHECK_OK(o->stream_id(dev, s3, &id3));
  CHECK(id3 != id1 && id3 != id2);
  CHECK_OK(o->stream_create(dev, &x));
  CHECK_OK(o->stream_create(dev, &y));
  CHECK(x != s3 && y != s3 && x != y);
  CHECK_OK(o->stream_destroy(dev, x));
  CHECK_OK(o->stream_destroy(dev, y));
  CHECK_OK(o->stream_create(dev, &h1));
  CHECK_OK(o->stream_create(dev, &h2));
  CHECK(h1 == y && h2 == x);

  /* The old stream finishes its blocked kernel and the work behind it. */
  atomic_store(&gate, 1);
  CHECK(wait_flag(&after, 10000 * MS));
  CHECK_OK(o->device_synchronize(dev));

  /* A kernel destroying its own stream. */
  self_destroy_arg_t sd = {dev, h1, GMA_ERR_DEVICE};
  atomic_int behind = 0, gate_c = 0;
  CHECK_OK(o->sim_launch(dev, h1, k_gate, &gate_c)); /* holds the self-destroy back */
  CHECK_OK(o->sim_launch(dev, h1, k_destroy_self, &sd));
  CHECK_OK(o->sim_launch(dev, h1, k_set, &behind));
  atomic_store(&gate_c, 1);
  CHECK_OK(o->device_synchronize(dev));
  CHECK(sd.st == GMA_OK && atomic_load(&behind) == 1);
  CHECK_ST(o->stream_id(dev, h1, &dummy), INVALID);

  CHECK_OK(o->event_destroy(dev, ev));
  CHECK_OK(o->stream_destroy(dev, s3));
  CHECK_OK(o->stream_destroy(dev, h2));
  o->destroy(dev);
}

enum { ID_THREADS = 3 };
typedef struct id_thread_arg {
  gma__device_t *dev;
  atomic_int *arrived;
  uint64_t id;
  pthread_t tid, stream_tid;
} id_thread_arg_t;

/* Each thread's 0x2 id is stable within the thread; all threads stay alive
 * until every one has its id, so no pthread_t (and no stream) is inherited. */
static void *id_thread(void *arg) {
  id_thread_arg_t *a = arg;
  const gma__device_ops_t *o = a->dev->ops;
  uint64_t again;
  CHECK_OK(o->stream_id(a->dev, PER_THREAD, &a->id));
  CHECK_OK(o->sim_launch(a->dev, PER_THREAD, k_tid, &a->stream_tid));
  CHECK_OK(o->stream_synchronize(a->dev, PER_THREAD));
  CHECK_OK(o->stream_id(a->dev, PER_THREAD, &again));
  CHECK(a->id != 0 && again == a->id);
  atomic_fetch_add(a->arrived, 1);
  while (atomic_load(a->arrived) < ID_THREADS) sleep_ns(100000);
  return NULL;
}

static void test_stream_id(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t sa, sb;
  uint64_t a, a2, b, n, l, p1, p2, dummy;
  CHECK_OK(o->stream_create(dev, &sa));
  CHECK_OK(o->stream_create(dev, &sb));
  CHECK_OK(o->stream_id(dev, sa, &a));
  CHECK_OK(o->stream_id(dev, sa, &a2));
  CHECK_OK(o->stream_id(dev, sb, &b));
  CHECK(a != 0 && b != 0 && a == a2 && a != b);
  CHECK_OK(o->stream_id(dev, NULL, &n));
  CHECK_OK(o->stream_id(dev, LEGACY, &l));
  CHECK(n != 0 && n == l && n != a && n != b);
  CHECK_OK(o->stream_id(dev, PER_THREAD, &p1));
  CHECK_OK(o->stream_id(dev, PER_THREAD, &p2));
  CHECK(p1 != 0 && p1 == p2 && p1 != n && p1 != a && p1 != b);

  /* Per-thread streams: one id per thread, each its own stream. */
  atomic_int arrived = 0;
  id_thread_arg_t args[ID_THREADS];
  pthread_t th[ID_THREADS];
  for (int i = 0; i < ID_THREADS; i++) {
    args[i] = (id_thread_arg_t){dev, &arrived, 0, 0, 0};
    CHECK(pthread_create(&th[i], NULL, id_thread, &args[i]) == 0);
  }
  for (int i = 0; i < ID_THREADS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < ID_THREADS; i++) {
    CHECK(args[i].id != p1 && args[i].id != n && args[i].id != a && args[i].id != b);
    for (int j = 0; j < i; j++) {
      CHECK(args[i].id != args[j].id);
      CHECK(!pthread_equal(args[i].stream_tid, args[j].stream_tid));
    }
  }
  CHECK_OK(o->stream_id(dev, PER_THREAD, &p2));
  CHECK(p2 == p1);

  /* A recycled handle value never repeats an id. */
  enum { CYCLES = 100 };
  uint64_t ids[CYCLES];
  gma_stream_t first = NULL;
  for (int i = 0; i < CYCLES; i++) {
    gma_stream_t s;
    CHECK_OK(o->stream_create(dev, &s));
    if (i == 0) first = s;
    CHECK(s == first); /* LIFO: the slot just freed comes back */
    CHECK_OK(o->stream_id(dev, s, &ids[i]));
    CHECK(ids[i] != 0 && ids[i] != a && ids[i] != b && ids[i] != n && ids[i] != p1);
    for (int j = 0; j < i; j++) CHECK(ids[i] != ids[j]);
    CHECK_OK(o->stream_destroy(dev, s));
    CHECK_ST(o->stream_id(dev, s, &dummy), INVALID);
  }

  /* Unknown handles are errors, never crashes. */
  int local;
  gma_stream_t bad[] = {(gma_stream_t)(uintptr_t)0xdead0, (gma_stream_t)&local,
                        (gma_stream_t)((char *)sa + 1), (gma_stream_t)((char *)sa + 8),
                        (gma_stream_t)((char *)sb + ((char *)sb - (char *)sa)),
                        (gma_stream_t)(uintptr_t)0x3, (gma_stream_t)UINTPTR_MAX, first};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (bad[i] == sa || bad[i] == sb) continue;
    CHECK_ST(o->stream_id(dev, bad[i], &dummy), INVALID);
    CHECK(strstr(gma_last_error(), "not a live stream"));
  }
  CHECK_ST(o->stream_id(dev, sa, NULL), INVALID);

  /* Another device's handle is unknown here. */
  gma__device_t *dev2 = make_dev(NULL);
  gma_stream_t t;
  atomic_int flag = 0;
  CHECK_OK(dev2->ops->stream_create(dev2, &t));
  CHECK_ST(o->stream_id(dev, t, &dummy), INVALID);
  CHECK_ST(o->sim_launch(dev, t, k_set, &flag), INVALID);
  CHECK_ST(dev2->ops->stream_id(dev2, sa, &dummy), INVALID);
  CHECK_OK(dev2->ops->stream_destroy(dev2, t));
  dev2->ops->destroy(dev2);

  CHECK_OK(o->stream_destroy(dev, sa));
  CHECK_OK(o->stream_destroy(dev, sb));
  o->destroy(dev);
}

/* More devices at once than a thread's cache holds: each device keeps its own
 * per-thread stream for this thread. A cache entry left by a destroyed device
 * never matches a new device, even one at the same address. */
static void test_stream_id_many_devices(void) {
  enum { ND = 7 };
  gma__device_t *devs[ND];
  uint64_t ids[ND], again;
  pthread_t tids[ND];
  for (int i = 0; i < ND; i++) {
    devs[i] = make_dev(NULL);
    CHECK_OK(devs[i]->ops->stream_id(devs[i], PER_THREAD, &ids[i]));
    CHECK(ids[i] != 0);
    for (int j = 0; j < i; j++) CHECK(ids[i] != ids[j]);
  }
  for (int round = 0; round < 3; round++) {
    for (int i = ND - 1; i >= 0; i--) {
      CHECK_OK(devs[i]->ops->stream_id(devs[i], PER_THREAD, &again));
      CHECK(again == ids[i]);
      CHECK_OK(devs[i]->ops->sim_launch(devs[i], PER_THREAD, k_tid, &tids[i]));
      CHECK_OK(devs[i]->ops->stream_synchronize(devs[i], PER_THREAD));
    }
  }
  for (int i = 0; i < ND; i++) {
    for (int j = 0; j < i; j++) CHECK(!pthread_equal(tids[i], tids[j]));
  }
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < ND; i++) devs[i]->ops->destroy(devs[i]);
    for (int i = 0; i < ND; i++) {
      devs[i] = make_dev(NULL);
      uint64_t id;
      pthread_t tid;
      CHECK_OK(devs[i]->ops->stream_id(devs[i], PER_THREAD, &id));
      for (int j = 0; j < ND; j++) CHECK(id != ids[j]);
      CHECK_OK(devs[i]->ops->sim_launch(devs[i], PER_THREAD, k_tid, &tid));
      CHECK_OK(devs[i]->ops->stream_synchronize(devs[i], PER_THREAD));
      ids[i] = id;
    }
  }
  for (int i = 0; i < ND; i++) devs[i]->ops->destroy(devs[i]);
}

typedef struct opener_arg {
  atomic_int *gate;
  uint64_t delay_ns;
} opener_arg_t;
static void *open_later(void *arg) {
  opener_arg_t *a = arg;
  sleep_ns(a->delay_ns);
  atomic_store(a->gate, 1);
  return NULL;
}

/* Device destroy with a destroyed stream's work still queued behind a blocked
 * kernel: destroy waits until it is unblocked (from another thread) and every
 * queued op has run, including a wait on an event recorded on that stream. */
static void test_destroy_device_dead_stream_pending(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  gma_stream_t s, s2;
  gma__event_t ev;
  atomic_int gate = 0, count = 0;
  CHECK_OK(o->event_create(dev, &ev));
  CHECK_OK(o->stream_create(dev, &s));
  CHECK_OK(o->sim_launch(dev, s, k_gate, &gate));
  for (int i = 0; i < 3; i++) CHECK_OK(o->sim_launch(dev, s, k_count, &count));
  CHECK_OK(o->event_record(dev, ev, s));
  CHECK_OK(o->stream_destroy(dev, s));
  CHECK_OK(o->stream_create(dev, &s2)); /* the recycled handle, with work of its own */
  CHECK(s2 == s);
  CHECK_OK(o->stream_wait_event(dev, s2, ev));
  CHECK_OK(o->sim_launch(dev, s2, k_count, &count));
  CHECK_OK(o->sim_launch(dev, NULL, k_count, &count));
  CHECK_OK(o->event_destroy(dev, ev));
  opener_arg_t oa = {&gate, 50 * MS};
  pthread_t opener;
  CHECK(pthread_create(&opener, NULL, open_later, &oa) == 0);
  uint64_t t0 = now_ns();
  o->destroy(dev);
  uint64_t t1 = now_ns();
  pthread_join(opener, NULL);
  CHECK(t1 - t0 >= 40 * MS);
  CHECK(atomic_load(&count) == 5);
}

/* Streams created and destroyed with work in flight release everything (ASan
 * checks leaks), and every kernel runs. */
static void test_stream_churn(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  enum { N = 300 };
  atomic_int count = 0;
  gma_stream_t live[8];
  for (int i = 0; i < N; i++) {
    gma_stream_t s;
    CHECK_OK(o->stream_create(dev, &s));
    CHECK_OK(o->sim_launch(dev, s, k_count, &count));
    if (i % 37 < 8) {
      live[i % 37] = s; /* a few stay, so slots of several chunks get used */
      if (i >= 37) CHECK_OK(o->stream_destroy(dev, live[i % 37]));
    } else {
      CHECK_OK(o->stream_destroy(dev, s));
    }
  }
  CHECK_OK(o->device_synchronize(dev));
  CHECK(atomic_load(&count) == N);
  o->destroy(dev); /* the last 8 streams are destroyed with the device */
}

/* Threads create, use and destroy streams while a prober launches on and asks
 * the ids of handles that are being destroyed and recycled at the same time:
 * every call either works or reports INVALID_ARGUMENT, and every accepted
 * kernel runs. TSan checks the lock-free stream_id path. */
enum { CH_THREADS = 3, CH_ITERS = 60 };
typedef struct churn_arg {
  gma__device_t *dev;
  _Atomic(gma_stream_t) *handles;
  atomic_int *count, *accepted, *stop;
  int id;
} churn_arg_t;

static void *churn_main(void *arg) {
  churn_arg_t *c = arg;
  const gma__device_ops_t *o = c->dev->ops;
  gma__event_t ev;
  uint64_t p0, p, id;
  CHECK_OK(o->event_create(c->dev, &ev));
  CHECK_OK(o->stream_id(c->dev, PER_THREAD, &p0));
  for (int i = 0; i < CH_ITERS; i++) {
    gma_stream_t s;
    CHECK_OK(o->stream_create(c->dev, &s));
    atomic_store(&c->handles[c->id], s);
    CHECK_OK(o->stream_id(c->dev, s, &id));
    CHECK(id != 0 && id != p0);
    CHECK_OK(o->sim_launch(c->dev, s, k_count, c->count));
    atomic_fetch_add(c->accepted, 1);
    CHECK_OK(o->event_record(c->dev, ev, s));
    CHECK_OK(o->stream_wait_event(c->dev, PER_THREAD, ev));
    CHECK_OK(o->stream_destroy(c->dev, s));
    CHECK_OK(o->stream_id(c->dev, PER_THREAD, &p));
    CHECK(p == p0);
    if (i % 10 == 0) CHECK_OK(o->stream_synchronize(c->dev, PER_THREAD));
  }
  CHECK_OK(o->stream_synchronize(c->dev, PER_THREAD));
  CHECK_OK(o->event_destroy(c->dev, ev));
  return NULL;
}

static void *prober_main(void *arg) {
  churn_arg_t *c = arg;
  const gma__device_ops_t *o = c->dev->ops;
  unsigned i = 0;
  while (!atomic_load(c->stop)) {
    gma_stream_t h = atomic_load(&c->handles[i++ % CH_THREADS]);
    uint64_t id;
    gma_status_t st = o->stream_id(c->dev, h, &id);
    CHECK(st == GMA_OK || st == INVALID);
    CHECK(st != GMA_OK || id != 0);
    st = o->sim_launch(c->dev, h, k_count, c->count);
    CHECK(st == GMA_OK || st == INVALID);
    if (st == GMA_OK) atomic_fetch_add(c->accepted, 1);
    st = o->stream_synchronize(c->dev, h);
    CHECK(st == GMA_OK || st == INVALID);
  }
  return NULL;
}

static void test_stream_churn_threads(void) {
  gma__device_t *dev = make_dev(NULL);
  atomic_int count = 0, accepted = 0, stop = 0;
  _Atomic(gma_stream_t) handles[CH_THREADS];
  for (int i = 0; i < CH_THREADS; i++) atomic_init(&handles[i], (gma_stream_t)(uintptr_t)0xdead0);
  churn_arg_t args[CH_THREADS + 1];
  pthread_t th[CH_THREADS + 1];
  for (int i = 0; i <= CH_THREADS; i++) {
    args[i] = (churn_arg_t){dev, handles, &count, &accepted, &stop, i};
    CHECK(pthread_create(&th[i], NULL, i < CH_THREADS ? churn_main : prober_main, &args[i]) == 0);
  }
  for (int i = 0; i < CH_THREADS; i++) pthread_join(th[i], NULL);
  atomic_store(&stop, 1);
  pthread_join(th[CH_THREADS], NULL);
  CHECK_OK(dev->ops->device_synchronize(dev));
  CHECK(atomic_load(&count) == atomic_load(&accepted));
  CHECK(atomic_load(&accepted) >= CH_THREADS * CH_ITERS);
  dev->ops->destroy(dev);
}

/* Not asserted: stream_id sits on every allocation, so show what it costs. */
static void test_stream_id_cost(void) {
  gma__device_t *dev = make_dev(NULL);
  const gma__device_ops_t *o = dev->ops;
  enum { NS = 200, ITERS = 1000000 };
  static gma_stream_t s[NS];
  for (int i = 0; i < NS; i++) CHECK_OK(o->stream_create(dev, &s[i]));
  /* s[NS - 1] is in the newest chunk (found first), s[0] in the oldest. */
  struct {
    const char *name;
    gma_stream_t h;
  } cases[] = {{"newest user stream", s[NS - 1]},
               {"oldest user stream (3 chunks)", s[0]},
               {"default (NULL)", NULL},
               {"per-thread (0x2)", PER_THREAD}};
  volatile uint64_t sink = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    uint64_t id;
    CHECK_OK(o->stream_id(dev, cases[c].h, &id)); /* warm the per-thread cache */
    uint64_t t0 = now_ns();
    for (int i = 0; i < ITERS; i++) {
      o->stream_id(dev, cases[c].h, &id);
      sink += id;
    }
    uint64_t t1 = now_ns();
    printf("test_sim: stream_id %-30s %6.2f ns/call\n", cases[c].name, (double)(t1 - t0) / ITERS);
  }
  CHECK(sink != 0);
  for (int i = 0; i < NS; i++) CHECK_OK(o->stream_destroy(dev, s[i]));
  o->destroy(dev);
}

int main(void) {
  test_in_order();
  test_concurrency();
  test_events();
  test_wait_event();
  test_memory();
  test_vm();
  test_faults();
  test_latency();
  test_per_thread_stream();
  test_bad_streams();
  test_event_destroy_queued();
  test_destroy_pending();
  test_threads();
  test_destroy_async();
  test_stream_id();
  test_stream_id_many_devices();
  test_destroy_device_dead_stream_pending();
  test_stream_churn();
  test_stream_churn_threads();
  test_stream_id_cost();
  printf("test_sim: ok\n");
  return 0;
}
