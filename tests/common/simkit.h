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

/* An allocator on the simulated device with segments as given, then conf
 * applied (conf may name expandable_segments itself). */
static inline gma_t *sim_allocator_with(gma_segments_t segments, const char *conf) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  c.expandable_segments = segments;
  if (conf) CHECK_OK(gma_config_parse(&c, conf));
  gma_t *g = NULL;
  CHECK_OK(gma_create(&c, &g));
  return g;
}

static inline gma_t *sim_allocator(const char *conf) {
  return sim_allocator_with(GMA_SEGMENTS_AUTO, conf);
}

/* Ordinary segments unless conf says otherwise: for tests whose figures
 * count ordinary segments (one device allocation each, a small segment's
 * 2 MiB, segment_alloc trace rows); the default grows by mapping chunks
 * (expandable_segments:auto). */
static inline gma_t *sim_allocator_ordinary(const char *conf) {
  return sim_allocator_with(GMA_SEGMENTS_ORDINARY, conf);
}


static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* A kernel that writes a pattern over a buffer, optionally waits for a gate
 * (or a fixed time), then checks the pattern is intact. Memory is accessed as
 * relaxed atomic words: when a test plants a reuse bug, two kernels touch the
 * same bytes on purpose, and the pattern check (not TSan) is the detector. */
typedef struct pattern_kernel {
  void *buf;
  size_t len;              /* bytes; the kernel touches len / 8 whole words */
  uint8_t value;
  atomic_int *gate;        /* if set, hold until *gate != 0 (at most 5 s) */
  long hold_us;            /* else hold this long */
  atomic_int *corruptions; /* incremented when the pattern was overwritten */
  atomic_int started;      /* set once the pattern is written */
} pattern_kernel_t;

static inline void pattern_kernel_run(void *arg) {
  pattern_kernel_t *k = arg;
  uint64_t *w = k->buf, v = 0x0101010101010101ull * k->value;
  size_t n = k->len / 8;
  for (size_t i = 0; i < n; i++) __atomic_store_n(&w[i], v, __ATOMIC_RELAXED);
  atomic_store(&k->started, 1);
  if (k->gate) {
    for (int i = 0; i < 50000 && !atomic_load(k->gate); i++) sleep_us(100);
  } else if (k->hold_us) {
    sleep_us(k->hold_us);
  }
  for (size_t i = 0; i < n; i++)
    if (__atomic_load_n(&w[i], __ATOMIC_RELAXED) != v) {
      atomic_fetch_add(k->corruptions, 1);
      break;
    }
}

/* Waits (at most 5 s) until a launched pattern kernel has written its pattern. */
static inline void pattern_kernel_wait_started(pattern_kernel_t *k) {
  for (int i = 0; i < 50000 && !atomic_load(&k->started); i++) sleep_us(100);
  CHECK(atomic_load(&k->started));
}

#endif /* GMA_TEST_SIMKIT_H */
