/* gma-replay's capacity measurements (tools/replay): failed allocations
 * counted and left out of the allocated figures, the trace's oom rows
 * attempted, and replay_min_capacity's bisection on traces whose answer is
 * known.
 *
 * The known answer: one small request (1000 bytes: the small pool's 2 MiB
 * segment) live throughout, three 16 MiB requests live together (each its own
 * 16 MiB segment), all freed, then one of 40 MiB (it fits only after the three
 * cached segments go back to the device, which gma does before an OOM). Peak
 * live is 48 MiB + 1000 bytes; the smallest capacity is 2 + 48 = 50 MiB, with
 * ordinary segments and with growable ones (2 MiB chunks on the simulated
 * device). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "replay.h"

#define MiB (1ull << 20)
#define HEADER "Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status\n"

static const char known[] = HEADER
    "0,0.000001,allocate,0x1000,1000,0x0,0,0,0,\n"
    "0,0.000002,allocate,0x100000,16777216,0x0,0,0,0,\n"
    "0,0.000003,allocate,0x2000000,16777216,0x0,0,0,0,\n"
    "0,0.000004,allocate,0x4000000,16777216,0x0,0,0,0,\n"
    "0,0.000005,free,0x100000,16777216,0x0,0,0,0,\n"
    "0,0.000006,free,0x2000000,16777216,0x0,0,0,0,\n"
    "0,0.000007,free,0x4000000,16777216,0x0,0,0,0,\n"
    "0,0.000008,allocate,0x6000000,41943040,0x0,0,0,0,\n"
    "0,0.000009,free,0x6000000,41943040,0x0,0,0,0,\n"
    "0,0.000010,free,0x1000,1000,0x0,0,0,0,\n";

/* Two 8 MiB requests around a 64 MiB request
 * the recording allocator failed: an oom row, as gma-import-torch writes
 * PyTorch's. Without the oom row it is the same trace. */
static const char with_oom[] = HEADER
    "0,0.000001,allocate,0x1000000,8388608,0x0,0,0,0,\n"
    "0,0.000002,oom,0x0,67108864,0x0,0,0,0,\n"
    "0,0.000003,allocate,0x2000000,8388608,0x0,0,0,0,\n"
    "0,0.000004,free,0x1000000,8388608,0x0,0,0,0,\n"
    "0,0.000005,free,0x2000000,8388608,0x0,0,0,0,\n";
static const char without_oom[] = HEADER
    "0,0.000001,allocate,0x1000000,8388608,0x0,0,0,0,\n"
    "0,0.000003,allocate,0x2000000,8388608,0x0,0,0,0,\n"
    "0,0.000004,free,0x1000000,8388608,0x0,0,0,0,\n"
    "0,0.000005,free,0x2000000,8388608,0x0,0,0,0,\n";

/* Every allocator the tests create: no timed trimming during a replay. */
#define BASE "trim_interval_ms:3600000"

static replay_trace_t *parse(const char *text, const char *name) {
  FILE *f = fmemopen((void *)text, strlen(text), "r");
  CHECK(f != NULL);
  replay_trace_t *t = NULL;
  char err[256];
  if (replay_parse(f, name, &t, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  fclose(f);
  return t;
}

static void run_at(const replay_trace_t *t, const char *conf, uint64_t capacity, int stop,
                   replay_result_t *r) {
  char err[256];
  replay_options_t o = {.device = "sim", .capacity = capacity, .stop_on_failure = stop};
  if (replay_run(t, conf, &o, r, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
}

static void min_capacity(const replay_trace_t *t, const char *conf, double precision,
                         double budget, replay_capacity_t *c) {
  char err[256];
  replay_capacity_options_t o = {.precision = precision, .budget_s = budget};
  if (replay_min_capacity(t, conf, &o, c, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  printf("%s [%s]: min capacity %llu (failing %llu, floor %llu), %d replays, width %.4f%s%s\n",
         t->name, conf, (unsigned long long)c->min_capacity, (unsigned long long)c->failing,
         (unsigned long long)c->lower_bound, c->replays, c->width,
         c->unstable ? ", unstable" : "", c->budget_hit ? ", budget hit" : "");
}

static void failures_are_counted(void) {
  replay_trace_t *t = parse(known, "known");
  CHECK(t->peak_live == 48 * MiB + 1000);
  replay_result_t r;
  /* 44 MiB: the third 16 MiB request does not fit (2 + 16 + 16 used, 10
   * left); the 40 MiB one does once the two cached segments go back. */
  run_at(t, BASE, 44 * MiB, 0, &r);
  CHECK(r.capacity == 44 * MiB);
  CHECK(r.failed_allocs == 1 && r.first_failed_event == 3);
  CHECK(r.unmatched == 1); /* the failed request's free */
  CHECK(r.trace_peak_live == 48 * MiB + 1000);
  CHECK(r.peak_requested == 40 * MiB + 1000); /* the failed one is left out */
  CHECK(strstr(r.first_error, "GMA_ERR_OOM") != NULL);
  CHECK(!r.stopped);
  char *js = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&js, &len);
  replay_result_json(m, &r);
  fclose(m);
  CHECK(strstr(js, "\"failed_allocs\": 1,") != NULL);
  CHECK(strstr(js, "\"allocated_excludes_failed\": true") != NULL);
  CHECK(strstr(js, "\"trace_peak_live\": 50332648") != NULL);
  free(js);
  /* Stopping at the first failure. */
  run_at(t, BASE, 44 * MiB, 1, &r);
  CHECK(r.stopped && r.failed_allocs == 1 && r.first_failed_event == 3);
  /* A config string naming sim_capacity too: the option wins, no
   * duplicate-key error. */
  run_at(t, BASE ",sim_capacity:1G", 44 * MiB, 0, &r);
  CHECK(r.capacity == 44 * MiB && r.failed_allocs == 1);
  /* Enough: nothing fails, nothing is left out. */
  run_at(t, BASE, 0, 0, &r);
  CHECK(r.failed_allocs == 0 && r.unmatched == 0);
  CHECK(r.peak_requested == 48 * MiB + 1000);
  replay_trace_free(t);
}

static void known_answer(const char *conf) {
  replay_trace_t *t = parse(known, "known");
  replay_capacity_t c;
  min_capacity(t, conf, 0.002, 0, &c);
  CHECK(c.lower_bound == 48 * MiB + 1000);
  CHECK(c.recorded_peak_reserved == 0);
  CHECK(!c.unstable && !c.budget_hit);
  CHECK(c.min_capacity >= 50 * MiB);
  CHECK((double)c.min_capacity <= 50.0 * MiB / 0.998 + 1);
  CHECK(c.failing < 50 * MiB && c.failing >= c.lower_bound);
  CHECK((double)(c.min_capacity - c.failing) <= 0.002 * (double)c.min_capacity);
  CHECK(c.replays >= 5 && c.replays <= 20 && (size_t)c.replays == c.nsteps);
  CHECK(c.at_min.failed_allocs == 0 && c.at_min.capacity == c.min_capacity);
  /* The steps agree with the answer: failures below it, successes at or above. */
  for (size_t i = 0; i < c.nsteps; i++)
    CHECK(c.steps[i].ok == (c.steps[i].capacity >= c.min_capacity));
  CHECK(c.steps[c.nsteps - 1].confirm && c.steps[c.nsteps - 1].capacity == c.min_capacity);
  char *js = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&js, &len);
  replay_capacity_json(m, &c);
  fclose(m);
  char want[64];
  snprintf(want, sizeof want, "{\"min_capacity\": %llu,", (unsigned long long)c.min_capacity);
  CHECK(strncmp(js, want, strlen(want)) == 0);
  CHECK(strstr(js, "\"steps\": [{\"capacity\": ") != NULL);
  free(js);
  replay_capacity_free(&c);
  /* A coarser precision takes fewer replays; a budget already spent stops
   * the bisection at the first workable capacity and says so. */
  min_capacity(t, conf, 0.05, 0, &c);
  CHECK(c.min_capacity >= 50 * MiB && (double)c.min_capacity <= 50.0 * MiB / 0.95 + 1);
  int coarse = c.replays;
  replay_capacity_free(&c);
  min_capacity(t, conf, 0.002, 1e-9, &c);
  CHECK(c.budget_hit && c.min_capacity >= 50 * MiB && c.width > 0.002);
  CHECK(c.replays < coarse);
  replay_capacity_free(&c);
  replay_trace_free(t);
}

static void oom_rows(void) {
  replay_trace_t *t = parse(with_oom, "with_oom"), *u = parse(without_oom, "without_oom");
  CHECK(t->count[RA_OOM] == 1 && t->peak_live == 16 * MiB);
  replay_result_t r;
  /* Room for it: gma serves what the recorder failed, and frees it at once. */
  run_at(t, BASE, 1024 * MiB, 0, &r);
  CHECK(r.recorded_failed == 1 && r.oom_attempts == 1 && r.oom_served == 1);
  CHECK(r.failed_allocs == 0 && r.unmatched == 0);
  CHECK(r.peak_requested == 16 * MiB); /* the attempt is not the trace's live memory */
  /* No room: gma fails it too, which is not a failure of the replay. */
  run_at(t, BASE, 40 * MiB, 0, &r);
  CHECK(r.recorded_failed == 1 && r.oom_attempts == 1 && r.oom_served == 0);
  CHECK(r.failed_allocs == 0 && r.peak_requested == 16 * MiB);
  /* Served and freed at once: at 84 MiB (a 20 MiB segment shared by the two
   * 8 MiB requests, and 64 MiB), the second request still fits. */
  run_at(t, BASE, 84 * MiB, 0, &r);
  CHECK(r.oom_served == 1 && r.failed_allocs == 0);
  char *js = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&js, &len);
  replay_result_json(m, &r);
  fclose(m);
  CHECK(strstr(js, "\"recorded_failed\": 1, \"oom_attempts\": 1, \"oom_served\": 1, "
                   "\"oom_failed\": 0") != NULL);
  free(js);
  /* The oom row does not move the smallest capacity: 16 MiB, the floor
   * (near its capacity gma gives each 8 MiB request a segment of its own
   * rather than one shared 20 MiB segment), where gma fails the 64 MiB
   * request too. */
  replay_capacity_t a, b;
  min_capacity(t, BASE, 0.002, 0, &a);
  min_capacity(u, BASE, 0.002, 0, &b);
  CHECK(a.min_capacity == b.min_capacity);
  CHECK(a.min_capacity >= 16 * MiB && (double)a.min_capacity <= 16.0 * MiB / 0.998 + 1);
  CHECK(a.at_min.recorded_failed == 1 && a.at_min.oom_served == 0);
  replay_capacity_free(&a);
  replay_capacity_free(&b);
  replay_trace_free(t);
  replay_trace_free(u);
}

int main(void) {
  failures_are_counted();
  known_answer(BASE);
  known_answer(BASE ",expandable_segments:true");
  oom_rows();
  printf("ok\n");
  return 0;
}
