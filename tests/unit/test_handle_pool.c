/* The handle pool of growable segments (runtime/source/vmm.c, core/segments.c),
 * white-box: when an allocation finds no room, the OOM retry unmaps free
 * chunks from between live blocks and keeps their physical memory; the retry's
 * growth maps those chunks again at a new address, creating nothing; a trim
 * frees what is left of them. A chunk is unmapped only under a FREE block,
 * whose streams' work has completed: a kernel still reading a freed
 * neighbour keeps its memory. The planted run turns epoch gating off, so the
 * retry takes the chunk from under that kernel; in a child process, it must
 * crash (or a sanitizer report the fault) or see its pattern overwritten. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/allocator.h"
#include "core/internal.h"
#include "source/vmm.h"
#include "simkit.h"

#define MiB ((uint64_t)1 << 20)
#define NBLOCKS 13

static void check_valid(gma_t *g) {
  gma__pool_t *p = gma__pool_of(g);
  pthread_mutex_lock(&p->lock);
  CHECK(gma__pool_is_valid(p) && gma__segs_is_valid(p));
  pthread_mutex_unlock(&p->lock);
}

/* The device holds exactly what the pool says it holds, its segments and
 * its kept chunks, and other users' bytes. */
static void check_device_bytes(gma_t *g, uint64_t others) {
  gma_stats_t s = stats_of(g);
  gma__sim_live_t live;
  gma__sim_live(gma__pool_of(g)->dev, &live);
  CHECK(live.device_bytes == s.reserved.current + s.kept_bytes + others);
}

/* Thirteen 3 MiB blocks fill a 40 MiB limit, mapped a granule (2 MiB) per
 * chunk; each block holds its index. r[4] is freed on stream s behind a
 * kernel that holds it until *gate (stream order: s's work still uses it);
 * r[1], r[7], r[10] and r[12] are freed and their work is done. Then an
 * 8 MiB request: no room below the limit, so the OOM retry keeps the whole
 * chunks under the FREE holes (10 MiB) and the growth maps 8 MiB of them.
 * Returns the corruptions the kernel saw. */
static int scenario(unsigned flags, bool check) {
  gma_t *g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:1G,"
                           "memory_limit:40M,oom_wait_ms:0");
  gma__pool_of(g)->test_flags = flags;
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  char *r[NBLOCKS];
  for (int i = 0; i < NBLOCKS; i++) {
    CHECK_OK(gma_alloc(g, 3 * MiB, NULL, (void **)&r[i]));
    memset(r[i], i + 1, 3 * MiB);
  }
  CHECK_OK(gma_stream_synchronize(g, NULL));
  atomic_int gate = 0, corruptions = 0;
  pattern_kernel_t k = {.buf = r[4], .len = 3 * MiB, .value = 0x44, .gate = &gate,
                        .corruptions = &corruptions};
  CHECK_OK(gma_record_stream(g, r[4], s));
  CHECK_OK(gma_sim_launch(g, s, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  CHECK_OK(gma_free(g, r[4]));
  const int gone[] = {1, 7, 10, 12};
  for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++) CHECK_OK(gma_free(g, r[gone[i]]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  gma_stats_t s0 = stats_of(g);
  char *big = NULL;
  CHECK_OK(gma_alloc(g, 8 * MiB, NULL, (void **)&big));
  memset(big, 0x77, 8 * MiB); /* every byte mapped, and nobody else's */
  gma_stats_t s1 = stats_of(g);
  if (check) {
    printf("8 MiB with no room: %" PRIu64 " chunks kept, %" PRIu64 " mapped again, %" PRIu64
           " created; %" PRIu64 " MiB kept after, reserved %" PRIu64 " MiB\n",
           s1.num_device_keeps - s0.num_device_keeps,
           s1.num_device_remaps - s0.num_device_remaps,
           (s1.num_device_allocs - s0.num_device_allocs) -
               (s1.num_device_remaps - s0.num_device_remaps),
           s1.kept_bytes / MiB, s1.reserved.current / MiB);
    CHECK(s1.num_ooms == s0.num_ooms && s1.num_oom_retries > s0.num_oom_retries);
    /* Five 2 MiB chunks kept, four of them mapped again, nothing created. */
    CHECK(s1.num_device_keeps - s0.num_device_keeps == 5);
    CHECK(s1.num_device_remaps - s0.num_device_remaps == 4);
    CHECK(s1.num_device_allocs - s0.num_device_allocs == 4);
    CHECK(s1.kept_bytes == 2 * MiB && s1.kept_chunks == 1);
    CHECK(s1.reserved.current + s1.kept_bytes <= 40 * MiB);
    check_device_bytes(g, 0);
    check_valid(g);
    for (int i = 0; i < NBLOCKS; i++) {
      if (i == 4 || i == 1 || i == 7 || i == 10 || i == 12) continue;
      CHECK(big + 8 * MiB <= r[i] || r[i] + 3 * MiB <= big); /* no overlap */
      for (uint64_t o = 0; o < 3 * MiB; o += 4096) CHECK(r[i][o] == i + 1);
    }
  }
  atomic_store(&gate, 1);
  CHECK_OK(gma_stream_synchronize(g, s));
  int seen = atomic_load(&corruptions);
  if (check) {
    /* A trim frees the kept chunk; the device holds what the pool holds. */
    CHECK_OK(gma_trim(g, 0));
    gma_stats_t s2 = stats_of(g);
    CHECK(s2.kept_bytes == 0 && s2.kept_chunks == 0 && s2.num_kept_frees == 1);
    CHECK(s2.bytes_trimmed >= s1.bytes_trimmed + 2 * MiB);
    check_device_bytes(g, 0);
    check_valid(g);
  }
  CHECK_OK(gma_free(g, big));
  for (int i = 0; i < NBLOCKS; i++)
    if (i != 4 && i != 1 && i != 7 && i != 10 && i != 12) CHECK_OK(gma_free(g, r[i]));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
  return seen;
}

/* Kept chunks give way when the device is short of memory for new chunks
 * they cannot stand in for (larger than what is left to map). On an 8 GiB
 * device another user leaves 8 MiB free; a's 64 MiB (two 32 MiB chunks)
 * is freed, and 70 MiB asked for: the retry keeps both chunks, the growth
 * after b maps one and needs 26 MiB more, which only fits once the other
 * kept chunk is freed. */
static void kept_chunks_give_way(void) {
  gma_t *g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:8G,oom_wait_ms:0");
  gma__pool_t *p = gma__pool_of(g);
  void *a = NULL, *b = NULL, *c = NULL;
  CHECK_OK(gma_alloc(g, 64 * MiB, NULL, &a));
  CHECK_OK(gma_alloc(g, 8 * MiB, NULL, &b));
  uint64_t dev_free = 0, dev_total = 0;
  CHECK_OK(p->dev->ops->mem_info(p->dev, &dev_free, &dev_total));
  uintptr_t outside = 0; /* another user's */
  CHECK_OK(p->dev->ops->mem_alloc(p->dev, dev_free - 8 * MiB, &outside));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  gma_stats_t s0 = stats_of(g);
  CHECK_OK(gma_alloc(g, 70 * MiB, NULL, &c));
  memset(c, 1, 70 * MiB);
  gma_stats_t s = stats_of(g);
  printf("70 MiB with 8 MiB free on the device: %" PRIu64 " kept, %" PRIu64
         " mapped again, %" PRIu64 " kept freed, %" PRIu64 " maps in all\n",
         s.num_device_keeps - s0.num_device_keeps, s.num_device_remaps - s0.num_device_remaps,
         s.num_kept_frees - s0.num_kept_frees, s.num_device_allocs - s0.num_device_allocs);
  CHECK(s.num_device_keeps - s0.num_device_keeps == 2);
  CHECK(s.num_device_remaps - s0.num_device_remaps == 1);
  CHECK(s.num_kept_frees - s0.num_kept_frees == 1 && s.kept_bytes == 0);
  check_device_bytes(g, dev_free - 8 * MiB);
  check_valid(g);
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_empty_cache(g));
  s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.kept_bytes == 0);
  CHECK_OK(p->dev->ops->mem_free(p->dev, outside, dev_free - 8 * MiB));
  check_device_bytes(g, 0);
  CHECK_OK(gma_destroy(g));
  gma__sim_live_t live;
  gma__sim_live(NULL, &live);
  CHECK(live.device_bytes == 0);
}

/* The planted run in a child: epoch gating off makes r[4] FREE while its
 * kernel still reads it, so the retry unmaps its chunk. Detected when the
 * child dies (the kernel touched unmapped memory) or its kernel saw another
 * pattern. */
static void planted_unmaps_under_kernel(void) {
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    int seen = scenario(GMA__TEST_NO_EPOCH_GATING, false);
    _exit(seen ? 3 : 0);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  /* A fault kills the child, or a sanitizer's handler reports it and exits
   * with its own status (TSan: 66). */
  bool caught = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
  printf("planted (no epoch gating): %s\n",
         WIFSIGNALED(status) ? "the kernel faulted on an unmapped chunk"
         : !caught           ? "NOT caught"
         : WEXITSTATUS(status) == 3 ? "the kernel saw its pattern overwritten"
                                    : "the child failed (a sanitizer's report of the fault)");
  CHECK(caught);
}

int main(void) {
  planted_unmaps_under_kernel(); /* first: no threads of this process exist yet */
  CHECK(scenario(0, true) == 0);
  kept_chunks_give_way();
  printf("test_handle_pool: ok\n");
  return 0;
}
