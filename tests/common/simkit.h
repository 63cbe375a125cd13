/* Helpers for tests on the simulated device: an allocator with a given
 * config, and kernels that fill, hold and verify patterns so a block handed out
 * while another stream still uses it shows up as a corruption. */
#ifndef GMA_TEST_SIMKIT_H
#define GMA_TEST_SIMKIT_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"

static inline gma_t *sim_allocator(const char *conf) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  if (conf) CHECK_OK(gma_config_parse(&c, conf));
  gma_t *g = NULL;
  CHECK_OK(gma_create(&c, &g));
  return g;
}

static inline gma_stats_t stats_of(gma_t *g) {
  gma_stats_t s = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &s));
  return s;
}

static inline void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* A kernel that writes a pattern over a buffer, optionally waits for a gate
 * (or a fixed time), then checks the pattern is intact. */
typedef struct pattern_kernel {
  uint8_t *buf;
  size_t len;
  uint8_t value;
  atomic_int *gate;        /* if set, hold until *gate != 0 (at most 5 s) */
  long hold_us;            /* else hold this long */
  atomic_int *corruptions; /* incremented when the pattern was overwritten */
} pattern_kernel_t;

static inline void pattern_kernel_run(void *arg) {
  pattern_kernel_t *k = arg;
  memset(k->buf, k->value, k->len);
  if (k->gate) {
    for (int i = 0; i < 50000 && !atomic_load(k->gate); i++) sleep_us(100);
  } else if (k->hold_us) {
    sleep_us(k->hold_us);
  }
  for (size_t i = 0; i < k->len; i++)
    if (k->buf[i] != k->value) {
      atomic_fetch_add(k->corruptions, 1);
      break;
    }
}

#endif /* GMA_TEST_SIMKIT_H */
