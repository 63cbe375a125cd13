/* The simulated device's GPU cost model (config key sim_costs).
 *
 * Off (the default, sim_costs:none), device calls cost nothing beyond the
 * sim_*_ns knobs, which unit tests rely on. A preset makes each driver call
 * take the host time it takes on a GPU, and the device behave as a GPU does
 * where that changes a policy's cost:
 *   - a call costs base_ns + ns_per_mib * MiB of the memory it concerns,
 *     plus busy_extra_ns when a kernel is queued or running on the device,
 *     all times a fill factor that rises from 1 at fill_knee (the device's used
 *     fraction) in a straight line to full_factor at fill_top, and stays
 *     there above it (no GPU figure was measured above);
 *   - device frees (and pinned host allocations and frees) first wait for
 *     all work queued on the device, as cuMemFree and cuMemHostAlloc do;
 *   - an event recorded behind queued work completes event_latency_ns after
 *     that work has run (on an idle stream it is complete at once);
 *   - a stream waiting on an event resumes as soon as the event completes,
 *     as a GPU's does, not after a thread wake-up (sim_stream.c polls);
 *   - driver calls from different threads serialize on one process-wide
 *     lock, held for the call's cost (not for a free's wait).
 * Every figure and its source is in docs/gpu/cost-model.md; the presets
 * are compared there with what the driver probe measured.
 *
 * Any thread. The presets are immutable. */
#ifndef GMA_SIM_COST_H
#define GMA_SIM_COST_H

#include <stdbool.h>
#include <stdint.h>

/* The priced calls: the device boundary's, then the driver calls the CUDA
 * backend makes that have no sim equivalent, then a driver pool's (the
 * benchmark's model of cudaMallocAsync). */
#define GMA__SIM_COST_OPS(X)                                                              \
  X(MEM_ALLOC) X(MEM_FREE) X(MEM_INFO) X(VM_RESERVE) X(VM_RELEASE) X(VM_MAP) X(VM_UNMAP) \
  X(VM_UNMAP_KEEP) X(VM_MAP_KEPT) X(VM_FREE_KEPT) X(HOST_ALLOC) X(HOST_FREE) X(EVENT_CREATE) X(EVENT_DESTROY) X(EVENT_RECORD)           \
  X(EVENT_QUERY) X(EVENT_SYNCHRONIZE) X(STREAM_WAIT_EVENT) X(STREAM_CREATE)             \
  X(STREAM_DESTROY) X(STREAM_ID) X(STREAM_CAPTURE) X(STREAM_QUERY)                       \
  X(STREAM_SYNCHRONIZE) X(DEVICE_SYNCHRONIZE) X(STREAM_WRITE_VALUE) X(CTX_CURRENT)        \
  X(LAUNCH) X(POOL_ALLOC) X(POOL_FREE)
typedef enum gma__sim_cost_op {
#define GMA__SIM_COST_ENUM_(NAME) GMA__SIM_COST_##NAME,
  GMA__SIM_COST_OPS(GMA__SIM_COST_ENUM_)
#undef GMA__SIM_COST_ENUM_
  GMA__SIM_COST_NOPS
} gma__sim_cost_op_t;

typedef struct gma__sim_cost_line {
  uint64_t base_ns;
  double ns_per_mib;
  uint64_t busy_extra_ns; /* added while a kernel is queued or running */
  double full_factor; /* at fill_top and above, fill_knee's 1 rising to it (0: 1) */
} gma__sim_cost_line_t;

/* What the device is doing when a call is made. */
typedef struct gma__sim_load {
  double fill; /* used bytes / capacity, after an allocation's own bytes */
  bool busy;   /* a kernel is queued or running on some stream */
} gma__sim_load_t;

typedef struct gma__sim_costs {
  const char *name;
  gma__sim_cost_line_t op[GMA__SIM_COST_NOPS];
  double fill_knee;          /* fill below which a call costs its idle price */
  double fill_top;           /* fill from which it costs full_factor times that */
  uint64_t event_latency_ns; /* after the work an event follows has run */
  bool free_waits;           /* MEM_FREE, HOST_ALLOC, HOST_FREE wait for the device first */
  bool one_lock;             /* driver calls of all threads serialize */
} gma__sim_costs_t;

/* The preset called name ("h100", "h200"), or NULL ("none", or unknown). */
const gma__sim_costs_t *gma__sim_costs_find(const char *name);
/* The preset of gma_config_t.sim_costs (1: h100, 2: h200), NULL for 0. */
const gma__sim_costs_t *gma__sim_costs_preset(int preset);
/* The names of the presets, for messages: "none, h100, h200". */
const char *gma__sim_costs_names(void);
/* The host time one call of op on bytes takes under c on an idle, empty
 * device (0 when c is NULL). */
uint64_t gma__sim_cost_ns(const gma__sim_costs_t *c, gma__sim_cost_op_t op, uint64_t bytes);
/* The same under load: plus op's busy extra, times its fill factor. */
uint64_t gma__sim_cost_ns_at(const gma__sim_costs_t *c, gma__sim_cost_op_t op, uint64_t bytes,
                             gma__sim_load_t load);
/* Takes gma__sim_cost_ns's time on the calling thread, holding the
 * process-wide driver lock meanwhile when c->one_lock. No-op when c is NULL. */
void gma__sim_cost_pay(const gma__sim_costs_t *c, gma__sim_cost_op_t op, uint64_t bytes);
/* The same with gma__sim_cost_ns_at's time. */
void gma__sim_cost_pay_at(const gma__sim_costs_t *c, gma__sim_cost_op_t op, uint64_t bytes,
                          gma__sim_load_t load);
/* Driver calls paid on the calling thread so far (every op, NULL c
 * excluded): the benchmark's "driver calls per gma_alloc". */
uint64_t gma__sim_cost_thread_calls(void);
/* How many of the calling thread's latest calls gma__sim_cost_thread_op
 * still knows. */
#define GMA__SIM_COST_LOG 64
/* The kind of the calling thread's n-th priced call (n counts from 0, as
 * gma__sim_cost_thread_calls does), for one of its last GMA__SIM_COST_LOG
 * calls; GMA__SIM_COST_NOPS for any other n. */
gma__sim_cost_op_t gma__sim_cost_thread_op(uint64_t n);
/* op's name as the X-macro spells it ("STREAM_CAPTURE"); "?" past the end. */
const char *gma__sim_cost_op_name(gma__sim_cost_op_t op);
/* Priced calls of op made so far in the process, all threads and devices. */
uint64_t gma__sim_cost_total(gma__sim_cost_op_t op);
/* Takes ns nanoseconds on the calling thread: spins below 200 us (nanosleep
 * overshoots short waits several times over), sleeps above. */
void gma__sim_spin_ns(uint64_t ns);

#endif /* GMA_SIM_COST_H */
