/* gma-bench-worker: what the worker thread costs while nothing happens, and
 * how quickly timed trimming gives a burst's cache back.
 *
 * 1. Idle CPU: an allocator (with its worker and the simulated device's
 *    default stream thread) sits idle for a second; CPU time of the whole
 *    process over that second, from getrusage, against the same second with
 *    no allocator at all (the baseline, measured in the same run). Goal: at
 *    most 1 ms per second of idleness.
 * 2. Timed trim: after a burst of 300 MiB is freed, the time until reserved
 *    memory is at most the release threshold, with no caller call, for a few
 *    trim intervals.
 * Prints a table, writes JSON (--json PATH, default bench_worker.json). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "gma.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double cpu_ms(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static gma_t *make(const char *conf) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  gma_status_t st = conf ? gma_config_parse(&c, conf) : GMA_OK;
  gma_t *g = NULL;
  if (st == GMA_OK) st = gma_create(&c, &g);
  if (st != GMA_OK) {
    fprintf(stderr, "gma-bench-worker: %s\n", gma_last_error());
    exit(1);
  }
  return g;
}

/* CPU ms the process uses over one idle second, with an allocator made from
 * conf (NULL: no allocator, the baseline). */
static double idle_cpu(const char *conf, int with_allocator) {
  gma_t *g = with_allocator ? make(conf) : NULL;
  sleep_ms(50); /* let start-up work finish */
  double c0 = cpu_ms();
  sleep_ms(1000);
  double used = cpu_ms() - c0;
  if (g) gma_destroy(g);
  return used;
}

static double trim_ms(int interval_ms) {
  char conf[128];
  snprintf(conf, sizeof conf, "trim_interval_ms:%d,release_threshold:8M,idle_ms:3600000",
           interval_ms);
  gma_t *g = make(conf);
  void *p[10];
  for (int i = 0; i < 10; i++) gma_alloc(g, 30u << 20, NULL, &p[i]);
  for (int i = 0; i < 10; i++) gma_free(g, p[i]);
  uint64_t t0 = now_ns();
  gma_stats_t s = GMA_STATS_INIT;
  do {
    sleep_ms(1);
    gma_stats(g, &s);
  } while (s.reserved.current > (8u << 20) && now_ns() - t0 < 10000000000ull);
  double ms = (double)(now_ns() - t0) / 1e6;
  gma_destroy(g);
  return ms;
}

int main(int argc, char **argv) {
  const char *json = "bench_worker.json";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else {
      fprintf(stderr, "usage: gma-bench-worker [--json PATH]\n");
      return 2;
    }
  }
  printf("gma-bench-worker: gma %s, simulated device\n\n", gma_version());
  double base = idle_cpu(NULL, 0);
  double idle_default = idle_cpu(NULL, 1);
  double idle_fast = idle_cpu("trim_interval_ms:10", 1);
  printf("1. CPU time over 1 s of idleness (getrusage, whole process; goal <= 1 ms above baseline)\n");
  printf("%-44s %10s %12s\n", "", "CPU ms", "above base");
  printf("%-44s %10.3f %12s\n", "no allocator (baseline)", base, "-");
  printf("%-44s %10.3f %12.3f\n", "allocator, worker tick 1000 ms (default)", idle_default,
         idle_default - base);
  printf("%-44s %10.3f %12.3f\n", "allocator, worker tick 10 ms", idle_fast, idle_fast - base);

  int intervals[3] = {50, 200, 1000};
  double took[3];
  printf("\n2. timed trim: 300 MiB freed, time until reserved <= release_threshold (8 MiB)\n");
  printf("%-20s %12s %16s\n", "trim interval ms", "took ms", "took / interval");
  for (int i = 0; i < 3; i++) {
    took[i] = trim_ms(intervals[i]);
    printf("%-20d %12.1f %15.2fx\n", intervals[i], took[i], took[i] / intervals[i]);
  }

  FILE *f = fopen(json, "w");
  if (!f) {
    perror(json);
    return 1;
  }
  fprintf(f, "{\"benchmark\": \"gma-bench-worker\", \"gma_version\": \"%s\",\n", gma_version());
  fprintf(f, " \"idle_cpu_ms_per_s\": {\"baseline\": %.3f, \"worker_1000ms\": %.3f, "
             "\"worker_10ms\": %.3f},\n", base, idle_default, idle_fast);
  fprintf(f, " \"timed_trim_ms\": [");
  for (int i = 0; i < 3; i++)
    fprintf(f, "%s{\"interval_ms\": %d, \"took_ms\": %.1f}", i ? ", " : "", intervals[i], took[i]);
  fprintf(f, "]}\n");
  fclose(f);
  printf("\nwrote %s\n", json);
  return 0;
}
