/* Unit test of the simulated device's GPU cost model (sim_costs, runtime/
 * device/sim_cost.c): the config key, each call paying its price and
 * counting as a driver call, a device free waiting for the work queued on
 * another stream while the same free without a preset does not, an event
 * behind work completing only after that work, a stream thread that frees
 * not waiting for itself, the capture query the CUDA backend makes, and
 * memory calls priced by load: a busy extra beside a kernel and times the
 * fill factor on a nearly full device.
 * Kernels block on gates, so the waits are observed, not timed guesses. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "device/device.h"
#include "device/sim_cost.h"

#define MS 1000000ull

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static gma__device_t *make_dev(const char *conf) {
  gma_config_t cfg = GMA_CONFIG_INIT;
  CHECK_OK(gma_config_parse(&cfg, conf));
  gma__device_t *dev = NULL;
  CHECK_OK(gma__sim_create(&cfg, &dev));
  return dev;
}

/* A kernel that runs until its gate opens (10 s at most). */
static void k_gate(void *arg) {
  uint64_t end = now_ns() + 10000 * MS;
  while (!atomic_load((atomic_int *)arg) && now_ns() < end) sleep_ms(1);
}

static void test_config(void) {
  gma_config_t cfg = GMA_CONFIG_INIT;
  CHECK_OK(gma_config_parse(&cfg, "sim_costs:h100"));
  CHECK(cfg.sim_costs == 1 && gma__sim_costs_preset(cfg.sim_costs) == gma__sim_costs_find("h100"));
  CHECK_OK(gma_config_parse(&cfg, "sim_costs:none"));
  CHECK(cfg.sim_costs == 0 && gma__sim_costs_preset(0) == NULL);
  CHECK(gma_config_parse(&cfg, "sim_costs:a100") == GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "h100") != NULL); /* the message lists the presets */
  CHECK(cfg.sim_costs == 0);                       /* a refused string changes nothing */
}

/* Each priced call counts as a driver call of the calling thread, and an
 * allocation takes at least its base price. */
static void test_prices(void) {
  gma__device_t *dev = make_dev("sim_costs:h100");
  const gma__sim_costs_t *c = gma__sim_costs_find("h100");
  uint64_t calls = gma__sim_cost_thread_calls(), t0 = now_ns();
  uintptr_t p = 0;
  CHECK_OK(dev->ops->mem_alloc(dev, 4 << 20, &p));
  CHECK(now_ns() - t0 >= gma__sim_cost_ns(c, GMA__SIM_COST_MEM_ALLOC, 4 << 20));
  CHECK(gma__sim_cost_thread_calls() == calls + 1);
  uint64_t id = 0;
  CHECK_OK(dev->ops->stream_id(dev, NULL, &id)); /* capture query + id, as cuda.c makes them */
  CHECK(gma__sim_cost_thread_calls() == calls + 3);
  bool on = true;
  CHECK(dev->ops->stream_capture != NULL);
  CHECK_OK(dev->ops->stream_capture(dev, NULL, &on, &id));
  CHECK(!on && gma__sim_cost_thread_calls() == calls + 4);
  CHECK_OK(dev->ops->mem_free(dev, p, 4 << 20));
  CHECK(gma__sim_cost_thread_calls() == calls + 5);
  dev->ops->destroy(dev);

  gma__device_t *plain = make_dev("sim_costs:none");
  calls = gma__sim_cost_thread_calls();
  CHECK_OK(plain->ops->mem_alloc(plain, 4 << 20, &p));
  CHECK_OK(plain->ops->mem_free(plain, p, 4 << 20));
  CHECK(gma__sim_cost_thread_calls() == calls && plain->ops->stream_capture == NULL);
  plain->ops->destroy(plain);
}

/* The price under load: idle below the knee, plus the busy extra beside a
 * kernel, the fill factor rising in a line from the knee to fill_top and
 * flat above; calls that are not memory calls ignore the load. */
static void test_load_prices(void) {
  const gma__sim_costs_t *c = gma__sim_costs_find("h100");
  const uint64_t b = 256ull << 20;
  const gma__sim_cost_op_t a = GMA__SIM_COST_MEM_ALLOC, f = GMA__SIM_COST_MEM_FREE;
  double idle = (double)gma__sim_cost_ns(c, a, b);
  CHECK(c->fill_knee > 0.5 && c->fill_top > c->fill_knee && c->fill_top < 1.0);
  CHECK(gma__sim_cost_ns_at(c, a, b, (gma__sim_load_t){0.0, false}) == (uint64_t)idle);
  CHECK(gma__sim_cost_ns_at(c, a, b, (gma__sim_load_t){0.5, false}) == (uint64_t)idle);
  double busy = (double)gma__sim_cost_ns_at(c, a, b, (gma__sim_load_t){0.5, true});
  CHECK(c->op[a].busy_extra_ns > 0 && busy == idle + (double)c->op[a].busy_extra_ns);
  double mid = (double)gma__sim_cost_ns_at(
      c, a, b, (gma__sim_load_t){(c->fill_knee + c->fill_top) / 2, false});
  double top = (double)gma__sim_cost_ns_at(c, a, b, (gma__sim_load_t){c->fill_top, false});
  CHECK(top > 15.0 * idle && top < 16.0 * idle);
  CHECK(mid > 0.99 * (1 + top / idle) / 2 * idle && mid < 1.01 * (1 + top / idle) / 2 * idle);
  CHECK(gma__sim_cost_ns_at(c, a, b, (gma__sim_load_t){1.0, false}) == (uint64_t)top);
  uint64_t both = gma__sim_cost_ns_at(c, a, b, (gma__sim_load_t){c->fill_top, true});
  CHECK((double)both > 0.99 * top * busy / idle && (double)both < 1.01 * top * busy / idle);
  /* A free waits for the device first: no busy extra; its fill factor is smaller. */
  double free_idle = (double)gma__sim_cost_ns(c, f, b);
  CHECK(gma__sim_cost_ns_at(c, f, b, (gma__sim_load_t){0.0, true}) == (uint64_t)free_idle);
  double free_top = (double)gma__sim_cost_ns_at(c, f, b, (gma__sim_load_t){0.95, false});
  CHECK(free_top > 2.9 * free_idle && free_top < 3.1 * free_idle);
  CHECK(gma__sim_cost_ns_at(c, GMA__SIM_COST_EVENT_RECORD, 0, (gma__sim_load_t){0.95, true}) ==
        gma__sim_cost_ns(c, GMA__SIM_COST_EVENT_RECORD, 0));
  CHECK(gma__sim_cost_ns_at(NULL, a, b, (gma__sim_load_t){0.95, true}) == 0);
}

/* The device prices its own memory calls by its load: an allocation that
 * fills it to 94% takes the fill factor's time, one beside a running
 * kernel the busy extra's; both are far above the idle price. */
static void test_device_load(void) {
  gma__device_t *dev = make_dev("sim_costs:h100,sim_capacity:67108864");
  const gma__sim_costs_t *c = gma__sim_costs_find("h100");
  const uint64_t big = 60ull << 20, small = 2ull << 20;
  uintptr_t p = 0, q = 0;
  uint64_t t0 = now_ns();
  CHECK_OK(dev->ops->mem_alloc(dev, big, &p)); /* 94% full after it */
  uint64_t took = now_ns() - t0;
  uint64_t full = gma__sim_cost_ns_at(c, GMA__SIM_COST_MEM_ALLOC, big, (gma__sim_load_t){0.94, false});
  CHECK(full > 10 * gma__sim_cost_ns(c, GMA__SIM_COST_MEM_ALLOC, big) && took >= full);
  CHECK_OK(dev->ops->mem_free(dev, p, big));

  gma_stream_t s = NULL;
  CHECK_OK(dev->ops->stream_create(dev, &s));
  atomic_int gate = 0;
  CHECK_OK(dev->ops->sim_launch(dev, s, k_gate, &gate));
  t0 = now_ns();
  CHECK_OK(dev->ops->mem_alloc(dev, small, &q)); /* 3% full, beside the kernel */
  took = now_ns() - t0;
  uint64_t busy = gma__sim_cost_ns_at(c, GMA__SIM_COST_MEM_ALLOC, small, (gma__sim_load_t){0.03, true});
  CHECK(busy > 3 * gma__sim_cost_ns(c, GMA__SIM_COST_MEM_ALLOC, small) && took >= busy);
  atomic_store(&gate, 1);
  CHECK_OK(dev->ops->stream_synchronize(dev, s));
  CHECK_OK(dev->ops->mem_free(dev, q, small));
  CHECK_OK(dev->ops->stream_destroy(dev, s));
  dev->ops->destroy(dev);
}

typedef struct freer {
  gma__device_t *dev;
  uintptr_t p;
  atomic_int done;
} freer_t;

static void *free_thread(void *arg) {
  freer_t *f = arg;
  CHECK_OK(f->dev->ops->mem_free(f->dev, f->p, 1 << 20));
  atomic_store(&f->done, 1);
  return NULL;
}

/* Under the preset a free waits for a kernel on another stream, as cuMemFree
 * does; without it the same free returns while the kernel runs. */
static void check_free_waits(const char *conf, bool waits) {
  gma__device_t *dev = make_dev(conf);
  gma_stream_t s = NULL;
  CHECK_OK(dev->ops->stream_create(dev, &s));
  atomic_int gate = 0;
  CHECK_OK(dev->ops->sim_launch(dev, s, k_gate, &gate));
  freer_t f = {.dev = dev};
  atomic_init(&f.done, 0);
  CHECK_OK(dev->ops->mem_alloc(dev, 1 << 20, &f.p));
  pthread_t th;
  CHECK(pthread_create(&th, NULL, free_thread, &f) == 0);
  uint64_t end = now_ns() + 2000 * MS;
  while (!atomic_load(&f.done) && now_ns() < end) sleep_ms(1);
  CHECK(atomic_load(&f.done) == !waits); /* 2 s: a free that does not wait is long done */
  atomic_store(&gate, 1);
  CHECK(pthread_join(th, NULL) == 0);
  CHECK(atomic_load(&f.done) == 1);
  CHECK_OK(dev->ops->stream_destroy(dev, s));
  dev->ops->destroy(dev);
}

/* An event recorded behind a kernel is not complete until the kernel ran. */
static void test_event_after_work(void) {
  gma__device_t *dev = make_dev("sim_costs:h100");
  gma_stream_t s = NULL;
  CHECK_OK(dev->ops->stream_create(dev, &s));
  gma__event_t ev = NULL;
  CHECK_OK(dev->ops->event_create(dev, &ev));
  bool done = false;
  CHECK_OK(dev->ops->event_record(dev, ev, s)); /* idle stream: complete at once */
  CHECK_OK(dev->ops->event_query(dev, ev, &done));
  CHECK(done);
  atomic_int gate = 0;
  CHECK_OK(dev->ops->sim_launch(dev, s, k_gate, &gate));
  CHECK_OK(dev->ops->event_record(dev, ev, s));
  sleep_ms(20);
  CHECK_OK(dev->ops->event_query(dev, ev, &done));
  CHECK(!done);
  atomic_store(&gate, 1);
  CHECK_OK(dev->ops->event_synchronize(dev, ev));
  CHECK_OK(dev->ops->event_query(dev, ev, &done));
  CHECK(done);
  CHECK_OK(dev->ops->event_destroy(dev, ev));
  CHECK_OK(dev->ops->stream_destroy(dev, s));
  dev->ops->destroy(dev);
}

typedef struct self_free {
  gma__device_t *dev;
  uintptr_t p;
  atomic_int done;
} self_free_t;

static void k_free(void *arg) {
  self_free_t *f = arg;
  CHECK_OK(f->dev->ops->mem_free(f->dev, f->p, 1 << 20));
  atomic_store(&f->done, 1);
}

/* A kernel that frees device memory does not wait for its own stream. */
static void test_free_on_stream_thread(void) {
  gma__device_t *dev = make_dev("sim_costs:h100");
  gma_stream_t s = NULL;
  CHECK_OK(dev->ops->stream_create(dev, &s));
  self_free_t f = {.dev = dev};
  atomic_init(&f.done, 0);
  CHECK_OK(dev->ops->mem_alloc(dev, 1 << 20, &f.p));
  CHECK_OK(dev->ops->sim_launch(dev, s, k_free, &f));
  CHECK_OK(dev->ops->stream_synchronize(dev, s));
  CHECK(atomic_load(&f.done) == 1);
  CHECK_OK(dev->ops->stream_destroy(dev, s));
  dev->ops->destroy(dev);
}

int main(void) {
  test_config();
  test_prices();
  test_load_prices();
  test_device_load();
  check_free_waits("sim_costs:h100", true);
  check_free_waits("sim_costs:none", false);
  test_event_after_work();
  test_free_on_stream_thread();
  printf("test_sim_costs: ok\n");
  return 0;
}
