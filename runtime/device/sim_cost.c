/* The presets of the simulated device's cost model and its clock (see
 * sim_cost.h; the figures' sources are in docs/gpu/cost-model.md). */
#include "device/sim_cost.h"
#include "base/lock.h"
#include "base/atomics.h"
#include "base/clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define US(x) ((uint64_t)((x) * 1000.0))

/* Hopper, driver 580: each line's base and slope fit gma-driver-probe's
 * medians over sizes on an idle device; the busy extras are the probe's
 * calls beside a running kernel less the idle price (64 MiB); the full
 * factors come from the GPU benchmark's calls at 89% fill (memory
 * pressure, H100 and H200). docs/gpu/cost-model.md names the runs and
 * compares each line with its source. */
#define HOPPER_LINES                                                                 \
  [GMA__SIM_COST_MEM_ALLOC] = {US(33), 72.0, US(100), 15.5},                         \
  [GMA__SIM_COST_MEM_FREE] = {US(30), 300.0, 0, 3.0},                                \
  [GMA__SIM_COST_MEM_INFO] = {US(4.3), 0, 0, 0},                                     \
  [GMA__SIM_COST_VM_RESERVE] = {US(1.0), 0, 0, 0},                                   \
  [GMA__SIM_COST_VM_RELEASE] = {US(1.0), 0, 0, 0},                                   \
  [GMA__SIM_COST_VM_MAP] = {US(35), 40.0, US(420), 1.0},                             \
  [GMA__SIM_COST_VM_UNMAP] = {US(22), 280.0, US(30), 3.0},                           \
  [GMA__SIM_COST_VM_UNMAP_KEEP] = {US(14), 12.0, US(55), 1.0},                       \
  [GMA__SIM_COST_VM_MAP_KEPT] = {US(20), 36.0, US(82), 1.0},                         \
  [GMA__SIM_COST_VM_FREE_KEPT] = {US(9), 267.0, 0, 3.0},                             \
  [GMA__SIM_COST_HOST_ALLOC] = {US(300), 350000.0, 0, 0},                            \
  [GMA__SIM_COST_HOST_FREE] = {US(200), 90000.0, 0, 0},                              \
  [GMA__SIM_COST_EVENT_CREATE] = {110, 0, 0, 0},                                     \
  [GMA__SIM_COST_EVENT_DESTROY] = {110, 0, 0, 0},                                    \
  [GMA__SIM_COST_EVENT_RECORD] = {190, 0, 0, 0},                                     \
  [GMA__SIM_COST_EVENT_QUERY] = {180, 0, 0, 0},                                      \
  [GMA__SIM_COST_EVENT_SYNCHRONIZE] = {330, 0, 0, 0},                                \
  [GMA__SIM_COST_STREAM_WAIT_EVENT] = {160, 0, 0, 0},                                \
  [GMA__SIM_COST_STREAM_CREATE] = {US(5), 0, 0, 0},                                  \
  [GMA__SIM_COST_STREAM_DESTROY] = {US(5), 0, 0, 0},                                 \
  [GMA__SIM_COST_STREAM_ID] = {44, 0, 0, 0},                                         \
  [GMA__SIM_COST_STREAM_CAPTURE] = {49, 0, 0, 0},                                    \
  [GMA__SIM_COST_STREAM_QUERY] = {US(1.3), 0, 0, 0},                                 \
  [GMA__SIM_COST_STREAM_SYNCHRONIZE] = {US(1.3), 0, 0, 0},                           \
  [GMA__SIM_COST_DEVICE_SYNCHRONIZE] = {US(1.3), 0, 0, 0},                           \
  [GMA__SIM_COST_STREAM_WRITE_VALUE] = {872, 0, 0, 0},                               \
  [GMA__SIM_COST_CTX_CURRENT] = {39, 0, 0, 0},                                       \
  [GMA__SIM_COST_LAUNCH] = {US(3.1), 0, 0, 0},                                       \
  [GMA__SIM_COST_POOL_ALLOC] = {286, 0, 0, 0},                                       \
  [GMA__SIM_COST_POOL_FREE] = {373, 0, 0, 0}

static const gma__sim_costs_t presets[] = {
    {.name = "h100", .op = {HOPPER_LINES}, .fill_knee = 0.64, .fill_top = 0.90, .event_latency_ns = US(2),
     .free_waits = true, .one_lock = true},
    {.name = "h200", .op = {HOPPER_LINES}, .fill_knee = 0.64, .fill_top = 0.90, .event_latency_ns = US(2),
     .free_waits = true, .one_lock = true},
};

const gma__sim_costs_t *gma__sim_costs_find(const char *name) {
  for (size_t i = 0; name && i < sizeof presets / sizeof presets[0]; i++)
    if (strcmp(presets[i].name, name) == 0) return &presets[i];
  return NULL;
}

const gma__sim_costs_t *gma__sim_costs_preset(int preset) {
  if (preset <= 0 || (size_t)preset > sizeof presets / sizeof presets[0]) return NULL;
  return &presets[preset - 1];
}

const char *gma__sim_costs_names(void) { return "none, h100, h200"; }

uint64_t gma__sim_cost_ns(const gma__sim_costs_t *c, gma__sim_cost_op_t op, uint64_t bytes) {
  if (!c || op >= GMA__SIM_COST_NOPS) return 0;
  const gma__sim_cost_line_t *l = &c->op[op];
  return l->base_ns + (uint64_t)(l->ns_per_mib * ((double)bytes / (1024.0 * 1024.0)));
}

uint64_t gma__sim_cost_ns_at(const gma__sim_costs_t *c, gma__sim_cost_op_t op, uint64_t bytes,
                             gma__sim_load_t load) {
  uint64_t ns = gma__sim_cost_ns(c, op, bytes);
  if (!ns) return 0;
  const gma__sim_cost_line_t *l = &c->op[op];
  if (load.busy) ns += l->busy_extra_ns;
  double x = 1.0, fill = load.fill > c->fill_top ? c->fill_top : load.fill;
  if (l->full_factor > 1.0 && fill > c->fill_knee)
    x += (l->full_factor - 1.0) * (fill - c->fill_knee) / (c->fill_top - c->fill_knee);
  return (uint64_t)((double)ns * x);
}

void gma__sim_spin_ns(uint64_t ns) {
  if (ns == 0) return;
  if (ns < 200000) {
    uint64_t t0 = gma__now_ns();
    while (gma__now_ns() - t0 < ns) {
    }
    return;
  }
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The driver's own lock: calls of every thread (and device) take turns. */
static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread uint64_t thread_calls;
/* The calling thread's last GMA__SIM_COST_LOG calls, by kind: the n-th call
 * is at n % GMA__SIM_COST_LOG. */
static __thread uint8_t thread_ops[GMA__SIM_COST_LOG];
static _Atomic uint64_t totals[GMA__SIM_COST_NOPS];

void gma__sim_cost_pay(const gma__sim_costs_t *c, gma__sim_cost_op_t op, uint64_t bytes) {
  gma__sim_cost_pay_at(c, op, bytes, (gma__sim_load_t){0.0, false});
}

void gma__sim_cost_pay_at(const gma__sim_costs_t *c, gma__sim_cost_op_t op, uint64_t bytes,
                          gma__sim_load_t load) {
  if (!c) return;
  thread_ops[thread_calls % GMA__SIM_COST_LOG] = (uint8_t)op;
  thread_calls++;
  gma__faa_relaxed(&totals[op], 1);
  uint64_t ns = gma__sim_cost_ns_at(c, op, bytes, load);
  if (!c->one_lock) {
    gma__sim_spin_ns(ns);
    return;
  }
  gma__lock(&driver_lock, GMA__RANK_SIM_DRIVER);
  gma__sim_spin_ns(ns);
  gma__unlock(&driver_lock);
}

uint64_t gma__sim_cost_thread_calls(void) { return thread_calls; }

gma__sim_cost_op_t gma__sim_cost_thread_op(uint64_t n) {
  if (n >= thread_calls || thread_calls - n > GMA__SIM_COST_LOG) return GMA__SIM_COST_NOPS;
  return (gma__sim_cost_op_t)thread_ops[n % GMA__SIM_COST_LOG];
}

const char *gma__sim_cost_op_name(gma__sim_cost_op_t op) {
  static const char *const names[] = {
#define GMA__SIM_COST_NAME_(NAME) #NAME,
      GMA__SIM_COST_OPS(GMA__SIM_COST_NAME_)
#undef GMA__SIM_COST_NAME_
  };
  return op < GMA__SIM_COST_NOPS ? names[op] : "?";
}

uint64_t gma__sim_cost_total(gma__sim_cost_op_t op) {
  return op < GMA__SIM_COST_NOPS ? gma__load_relaxed(&totals[op]) : 0;
}
