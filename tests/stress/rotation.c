/* Stream rotation: 64 streams used in turn, round after round, as a server
 * that hands each request to the next stream of a pool does. Each turn
 * allocates one working set of mixed-size buffers on its stream, runs short
 * kernels on them and frees them (stream-ordered, no synchronization), so
 * every stream ends its turn with a working set cached on it and then sits
 * idle for 63 turns. The test never calls gma_empty_cache.
 *
 * What it catches: memory stranded in idle streams. If blocks cached on a
 * stream (in its lock-free bins or its pool cache) never go back to the
 * shared pool once the stream's work is done, each of the 64 streams keeps a
 * working set and reserved memory grows to about 64 working sets. A correct
 * allocator reuses the idle streams' blocks once their epochs complete and
 * stays within a few working sets (the bound is justified in main).
 *
 * At the end it retires half the streams with gma_stream_retire and destroys
 * all with gma_stream_destroy: retired streams are forgotten (stream stats
 * give GMA_ERR_INVALID_ARGUMENT, num_streams falls to 0), and every segment
 * can then be given back. Public API only. Usage: rotation [seed] [rounds]. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "gma.h"
#include "simkit.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)

enum {
  NSTREAMS = 64,
  NBUF = 24,    /* buffers in one working set */
  LAG = 2,      /* the host runs at most this many turns ahead of the device */
  MAX_HOLD_US = 20
};

/* A short kernel: fills one word per 256 bytes of its buffer with a pattern
 * unique to the buffer and turn, holds a few microseconds, verifies. gma's
 * pointers are 256-byte aligned, so any overlap of two buffers shares a
 * sampled word; sampling keeps the turns cheap under TSan. */
typedef struct rot_kernel {
  uintptr_t base;
  size_t len;
  uint64_t pattern;
  long hold_us;
  atomic_int *corruptions;
} rot_kernel_t;

static void rot_kernel_run(void *arg) {
  rot_kernel_t *k = arg;
  for (size_t off = 0; off + 8 <= k->len; off += 256)
    __atomic_store_n((uint64_t *)(k->base + off), k->pattern ^ off, __ATOMIC_RELAXED);
  if (k->hold_us) sleep_us(k->hold_us);
  for (size_t off = 0; off + 8 <= k->len; off += 256)
    if (__atomic_load_n((uint64_t *)(k->base + off), __ATOMIC_RELAXED) != (k->pattern ^ off)) {
      atomic_fetch_add(k->corruptions, 1);
      break;
    }
}

#include "rng.h" /* rnd(): xorshift64* */

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 1;
  int rounds = argc > 2 ? atoi(argv[2]) : 4;
  CHECK(rounds >= 1);
  printf("rotation: seed %" PRIu64 ", %d rounds of %d streams (rerun: rotation %" PRIu64 " %d)\n",
         seed, rounds, NSTREAMS, seed, rounds);

  /* One working set, the same sizes every turn (a request's shapes), in a
   * seeded mix: 16 buffers from 512 B to 1 MiB (small pool), 6 from 1 to
   * 4 MiB (large pool, still in the bins' range), 2 from 4 to 12 MiB (above
   * bin_max: pool only; those over 10 MiB get a segment of their own). */
  uint64_t rng = seed * 0x9e3779b97f4a7c15ull | 1;
  size_t sizes[NBUF];
  uint64_t working_set = 0; /* bytes after gma's rounding to 512 */
  for (int i = 0; i < NBUF; i++) {
    if (i < 16) {
      unsigned bits = 9 + (unsigned)(rnd(&rng) % 11); /* 512 B .. 1 MiB */
      sizes[i] = ((size_t)1 << bits) + (size_t)(rnd(&rng) % ((size_t)1 << bits));
      if (sizes[i] > MiB) sizes[i] = MiB;
    } else if (i < 22) {
      sizes[i] = MiB + 1 + (size_t)(rnd(&rng) % (3 * MiB));
    } else {
      sizes[i] = 4 * MiB + 1 + (size_t)(rnd(&rng) % (8 * MiB));
    }
    sizes[i] &= ~(size_t)7; /* whole words for the pattern kernels */
    working_set += (sizes[i] + 511) / 512 * 512;
  }

  gma_t *g = sim_allocator(NULL);
  gma_stream_t streams[NSTREAMS];
  for (int i = 0; i < NSTREAMS; i++) CHECK_OK(gma_stream_create(g, &streams[i]));

  /* Kernel arguments must outlive their kernels: turn t's are reused at turn
   * t + LAG + 1, after turn t's stream was synchronized at the start of turn
   * t + LAG. */
  static rot_kernel_t kernels[LAG + 1][NBUF];
  atomic_int corruptions = 0;
  void *bufs[NBUF];
  uint64_t bound = 0, first_turn_reserved = 0, worst_current = 0;
  int turns = rounds * NSTREAMS;
  for (int t = 0; t < turns; t++) {
    gma_stream_t s = streams[t % NSTREAMS];
    rot_kernel_t *k = kernels[t % (LAG + 1)];
    /* Bound the device lag, as a program that waits for old results does:
     * when turn t starts, all work of turns <= t - LAG has finished. */
    if (t >= LAG) CHECK_OK(gma_stream_synchronize(g, streams[(t - LAG) % NSTREAMS]));
    for (int i = 0; i < NBUF; i++) CHECK_OK(gma_alloc(g, sizes[i], s, &bufs[i]));
    for (int i = 0; i < NBUF; i++) {
      k[i] = (rot_kernel_t){(uintptr_t)bufs[i], sizes[i],
                            rnd(&rng), (long)(rnd(&rng) % (MAX_HOLD_US + 1)), &corruptions};
      CHECK_OK(gma_sim_launch(g, s, rot_kernel_run, &k[i]));
    }
    /* Freed right after queueing the kernels: gma must not reuse them
     * elsewhere until the kernels are done, and may reuse them on s at once. */
    for (int i = 0; i < NBUF; i++) CHECK_OK(gma_free(g, bufs[i]));

    gma_stats_t st = stats_of(g);
    if (t == 0) {
      first_turn_reserved = st.reserved.current;
      /* The bound. While turn t allocates, three working sets may be
       * legitimately unavailable for reuse: turn t's own (live), turn t-1's
       * (its kernels may still run: only turn t-2's stream was synchronized),
       * and turn t-2's (its work is done, but gma never waits for the device,
       * so it may not have seen that stream's epoch event complete yet).
       * Older turns were synchronized before turn t-1 began, so gma has had
       * a whole turn of misses to see them done, and must reuse them. Each working
       * set needs at most what the first turn reserved from an empty pool
       * (its blocks plus the rounding of its segments), and two more large
       * segments (20 MiB each) cover fragmentation between generations: with
       * one, TSan's slow timing (epochs seen complete a turn late) went 2 MiB
       * over in 2 of 16 runs, at 166 MiB, both before and after issue 18's
       * changes. A stream that strands its cache would instead hold one
       * working set per stream: about 64 of them. */
      bound = 3 * first_turn_reserved + 40 * MiB;
      printf("  working set %.1f MiB in %d buffers; first turn reserved %.1f MiB; bound %.1f MiB "
             "(64 stranded sets would be %.0f MiB)\n",
             (double)working_set / MiB, NBUF, (double)first_turn_reserved / MiB,
             (double)bound / MiB, 64.0 * (double)first_turn_reserved / MiB);
    }
    if (st.reserved.current > worst_current) worst_current = st.reserved.current;
    if (st.reserved.current > bound) {
      fprintf(stderr,
              "turn %d (stream %d, round %d): reserved %.1f MiB exceeds the bound %.1f MiB; "
              "stream-cached %.1f MiB, pending %.1f MiB, free %.1f MiB, streams %" PRIu64 "\n",
              t, t % NSTREAMS, t / NSTREAMS, (double)st.reserved.current / MiB,
              (double)bound / MiB, (double)st.stream_cached_bytes / MiB,
              (double)st.pending_bytes / MiB, (double)st.free_bytes / MiB, st.num_streams);
      CHECK(st.reserved.current <= bound);
    }
  }
  for (int i = 0; i < NSTREAMS; i++) CHECK_OK(gma_stream_synchronize(g, streams[i]));

  gma_stats_t st = stats_of(g);
  printf("  %d turns: peak reserved %.1f MiB (%.2f first-turn sets), device allocs %" PRIu64
         ", hits bin/stream/pool/device %" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64
         ", epoch events %" PRIu64 "\n",
         turns, (double)st.reserved.peak / MiB, (double)st.reserved.peak / (double)first_turn_reserved,
         st.num_device_allocs, st.hits_bin, st.hits_stream, st.hits_pool, st.hits_device,
         st.num_epoch_events);
  CHECK(atomic_load(&corruptions) == 0);
  CHECK(st.reserved.peak <= bound);
  CHECK(st.num_allocs == (uint64_t)turns * NBUF && st.num_frees == st.num_allocs);
  CHECK(st.allocated.current == 0);
  CHECK(st.reserved.current ==
        st.allocated.current + st.stream_cached_bytes + st.pending_bytes + st.free_bytes);
  CHECK(st.hits_bin + st.hits_stream + st.hits_pool + st.hits_device == st.num_allocs);
  CHECK(st.num_streams == NSTREAMS);

  /* Retire the even streams explicitly, then destroy every stream (destroy
   * retires the odd ones itself). A retired stream is forgotten at once. */
  for (int i = 0; i < NSTREAMS; i += 2) {
    CHECK_OK(gma_stream_retire(g, streams[i]));
    gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
    CHECK_ST(gma_stream_stats(g, streams[i], &ss), GMA_ERR_INVALID_ARGUMENT);
  }
  CHECK(stats_of(g).num_streams == NSTREAMS / 2);
  for (int i = 0; i < NSTREAMS; i++) CHECK_OK(gma_stream_destroy(g, streams[i]));
  st = stats_of(g);
  CHECK(st.num_streams == 0);

  /* All work is done and every stream retired: nothing may stay stranded in
   * a forgotten stream record. gma_empty_cache never waits for the device,
   * so give the retirement events a moment to be seen. */
  for (int tries = 0; tries < 2000 && st.reserved.current != 0; tries++) {
    CHECK_OK(gma_empty_cache(g));
    st = stats_of(g);
    if (st.reserved.current) sleep_us(1000);
  }
  printf("  after retiring all streams and gma_empty_cache: reserved %" PRIu64 " bytes\n",
         st.reserved.current);
  CHECK(st.reserved.current == 0);
  CHECK_OK(gma_destroy(g));
  printf("rotation: ok\n");
  return 0;
}
