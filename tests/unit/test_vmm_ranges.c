/* Growable segments' address ranges (runtime/source/vmm.c), white-box: the first
 * range of a kind spans several times the memory limit, and a growth that
 * finds no unmapped run in any range reserves another instead of failing.
 * Filling a range that large takes a pathological workload, so the test
 * makes the pool believe its first range is 8 MiB (the reservation itself
 * is untouched and restored before destroy). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "api/allocator.h"
#include "core/internal.h"
#include "source/vmm.h"
#include "simkit.h"

#define MiB ((uint64_t)1 << 20)

static bool in_range(const gma__region_t *r, const void *ptr, uint64_t size) {
  uintptr_t a = (uintptr_t)ptr;
  return a >= r->base && a + size <= r->base + r->size;
}

/* A large growth maps equal chunks of at least 1/256 of the memory limit,
 * so a smaller block that later takes its place leaves
 * whole chunks free that go back; a growth whose third map fails unmaps
 * the two before it and leaves nothing. Under a limit 4x larger, the same
 * growth maps a quarter as many chunks. */
static void growth_in_pieces(void) {
  gma_t *g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:4G");
  gma__pool_t *p = gma__pool_of(g);
  gma__region_t *r = gma__vm_ranges(p->src, GMA__LARGE);
  gma_stats_t s0 = stats_of(g);
  void *a = NULL, *b = NULL;
  gma__sim_fault(p->dev, GMA__SIM_VM_MAP, 3, GMA_ERR_DEVICE);
  gma_status_t st = gma_alloc(g, 1024 * MiB, NULL, &a);
  gma__sim_live_t live;
  gma__sim_live(p->dev, &live);
  gma_stats_t s1 = stats_of(g);
  printf("third map failed: %s; mapped %" PRIu64 " MiB, device bytes %" PRIu64 "\n",
         gma_status_name(st), r->mapped / MiB, live.device_bytes / MiB);
  CHECK(st == GMA_ERR_DEVICE && strstr(gma_last_error(), "vm_map") != NULL);
  CHECK(r->mapped == 0 && r->nchunks == 0 && live.device_bytes == 0);
  CHECK(s1.reserved.current == 0 && s1.num_device_allocs == s0.num_device_allocs);
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_empty_cache(g));
  s0 = stats_of(g);
  CHECK_OK(gma_alloc(g, 1024 * MiB, NULL, &a)); /* 64 chunks of 4 GiB / 256 */
  s1 = stats_of(g);
  CHECK(s1.num_device_allocs - s0.num_device_allocs == 64 && r->nchunks == 64);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_alloc(g, 384 * MiB, NULL, &b)); /* the first 24 chunks */
  CHECK_OK(gma_trim(g, 0));                    /* the other 40 go back */
  gma_stats_t s2 = stats_of(g);
  CHECK(s2.reserved.current == 384 * MiB && r->mapped == 384 * MiB);
  pthread_mutex_lock(&p->lock);
  CHECK(gma__segs_is_valid(p));
  pthread_mutex_unlock(&p->lock);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_destroy(g));
  gma__sim_live(NULL, &live);
  CHECK(live.device_bytes == 0);
  g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:16G");
  s0 = stats_of(g);
  CHECK_OK(gma_alloc(g, 1024 * MiB, NULL, &a)); /* chunks of 16 GiB / 256 */
  CHECK(stats_of(g).num_device_allocs - s0.num_device_allocs == 16);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_destroy(g));
  printf("growth in pieces: 64 maps for 1 GiB under a 4 GiB limit, 16 under 16 GiB; 640 MiB "
         "went back under a 384 MiB block\n");
}

/* A growth of several chunks that the device cannot hold (memory used
 * outside gma) is refused before any map, not mapped part way and unmapped
 * again under the pool lock. */
static void short_device_maps_nothing(void) {
  gma_t *g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:1G,large_segment:64M");
  gma__pool_t *p = gma__pool_of(g);
  uintptr_t outside = 0;
  CHECK_OK(p->dev->ops->mem_alloc(p->dev, 512 * MiB, &outside)); /* another user's */
  uint64_t maps = gma__sim_calls(p->dev, GMA__SIM_VM_MAP);
  void *a = NULL;
  CHECK_ST(gma_alloc(g, 768 * MiB, NULL, &a), GMA_ERR_OOM);
  uint64_t tried = gma__sim_calls(p->dev, GMA__SIM_VM_MAP) - maps;
  gma__sim_live_t live;
  gma__sim_live(p->dev, &live);
  printf("768 MiB growth with 512 MiB free: %" PRIu64 " maps tried, device bytes %" PRIu64
         " MiB\n", tried, live.device_bytes / MiB);
  CHECK(tried == 0 && live.device_bytes == 512 * MiB);
  CHECK_OK(p->dev->ops->mem_free(p->dev, outside, 512 * MiB));
  /* Now it fits: pieces of 1 GiB / 256 would be 192, so 64 (the most) of 12 MiB. */
  CHECK_OK(gma_alloc(g, 768 * MiB, NULL, &a));
  CHECK(stats_of(g).num_device_allocs == 64);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_destroy(g));
}

/* The default (expandable_segments:auto) falls back to ordinary segments
 * when the device will not reserve the address range (as a sanitizer's
 * runtime refuses 16 TiB); expandable_segments:true fails there, saying
 * why. */
static void auto_falls_back(void) {
  for (int insist = 0; insist < 2; insist++) {
    gma__sim_fault(NULL, GMA__SIM_NSITES, 0, 0);
    gma__sim_fault(NULL, GMA__SIM_VM_RESERVE, 1 | GMA__SIM_STICKY, GMA_ERR_OOM); /* every call */
    gma_config_t c = GMA_CONFIG_INIT;
    c.device = GMA_DEVICE_SIM;
    c.ignore_env = 1;
    c.worker_off = 1;
    c.expandable_segments = insist ? GMA_SEGMENTS_GROWABLE : GMA_SEGMENTS_AUTO;
    gma_t *g = NULL;
    gma_status_t st = gma_create(&c, &g);
    gma__sim_fault(NULL, GMA__SIM_NSITES, 0, 0);
    if (insist) {
      CHECK(st == GMA_ERR_OOM && g == NULL && strstr(gma_last_error(), "vm_reserve") != NULL);
      continue;
    }
    CHECK_OK(st);
    void *p = NULL;
    CHECK_OK(gma_alloc(g, 3 * MiB, NULL, &p));
    gma_stats_t s = stats_of(g);
    CHECK(s.address_ranges == 0 && s.num_device_allocs == 1 && s.num_segments == 1);
    CHECK_OK(gma_free(g, p));
    CHECK_OK(gma_destroy(g));
  }
  printf("auto: ordinary segments when the range cannot be reserved; true: %s\n",
         "GMA_ERR_OOM");
}

/* A fresh run keeps clear of a segment end that another stream may still
 * extend: s1's 30 MiB segment ends in its own freed block when s2's 40 MiB
 * takes fresh memory, so s2's run starts halfway into the unmapped gap, and
 * s1's later 50 MiB extends its segment by 20 MiB in place (90 MiB in all;
 * with s2's run right behind s1's end, s1 needed 50 fresh: 120). */
static void fresh_run_leaves_room(void) {
  gma_t *g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:4G");
  gma_stream_t s1, s2;
  CHECK_OK(gma_stream_create(g, &s1));
  CHECK_OK(gma_stream_create(g, &s2));
  void *a = NULL, *b = NULL, *c = NULL;
  CHECK_OK(gma_alloc(g, 30 * MiB, s1, &a));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_alloc(g, 40 * MiB, s2, &b));
  CHECK_OK(gma_alloc(g, 50 * MiB, s1, &c));
  gma_stats_t s = stats_of(g);
  printf("fresh run: s2's run %s s1's end; s1's 50 MiB at %s; reserved %" PRIu64 " MiB\n",
         (uintptr_t)b == (uintptr_t)a + 30 * MiB ? "right at" : "away from",
         c == a ? "its segment" : "fresh memory", s.reserved.current / MiB);
  CHECK((uintptr_t)b != (uintptr_t)a + 30 * MiB && c == a && s.reserved.current == 90 * MiB);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_stream_destroy(g, s1));
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  growth_in_pieces();
  fresh_run_leaves_room();
  auto_falls_back();
  short_device_maps_nothing();
  gma_t *plain = sim_allocator("expandable_segments:false"); /* ordinary: no ranges */
  CHECK(stats_of(plain).address_ranges == 0 && stats_of(plain).address_reserved_bytes == 0);
  CHECK_OK(gma_destroy(plain));
  gma_t *g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:1G,"
                           "memory_limit:256M");
  gma__pool_t *p = gma__pool_of(g);
  gma__region_t *r = gma__vm_ranges(p->src, GMA__LARGE);
  CHECK(r && !r->next && r->size >= 4 * 256 * MiB); /* far more than the limit */
  gma_stats_t s0 = stats_of(g); /* one range per kind */
  gma__region_t *rs = gma__vm_ranges(p->src, GMA__SMALL);
  CHECK(s0.address_ranges == 2 && s0.address_reserved_bytes == r->size + rs->size);
  pthread_mutex_lock(&p->lock);
  uint64_t real = r->size;
  r->size = 8 * MiB; /* pretend: the first range holds 8 MiB */
  pthread_mutex_unlock(&p->lock);

  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  CHECK_OK(gma_alloc(g, 4 * MiB, NULL, &a));
  CHECK_OK(gma_alloc(g, 4 * MiB, NULL, &b));
  CHECK(in_range(r, a, 4 * MiB) && in_range(r, b, 4 * MiB));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_trim(g, 0)); /* a 4 MiB hole at the range's start */
  /* 6 MiB fits no run of the first range: a second range. Each growth here
   * maps one granule per call (1/256 of a 256 MiB limit is less). */
  CHECK_OK(gma_alloc(g, 6 * MiB, NULL, &c));
  gma_stats_t s;
  s = stats_of(g);
  CHECK(r->next && in_range(r->next, c, 6 * MiB) && !r->next->next);
  CHECK(r->next->size >= 4 * 256 * MiB);
  CHECK(s.address_ranges == 3 &&
        s.address_reserved_bytes == s0.address_reserved_bytes + r->next->size);
  CHECK(s.num_device_allocs == 7 && s.reserved.current == 10 * MiB);
  memset(c, 1, 6 * MiB);
  /* A request that fits the hole goes back to the first range. */
  CHECK_OK(gma_alloc(g, 3 * MiB, NULL, &d));
  CHECK(in_range(r, d, 3 * MiB));
  pthread_mutex_lock(&p->lock);
  CHECK(gma__segs_is_valid(p));
  pthread_mutex_unlock(&p->lock);

  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_free(g, d));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_empty_cache(g));
  s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.num_device_frees == 9 && s.num_device_allocs == 9);
  pthread_mutex_lock(&p->lock);
  r->size = real;
  pthread_mutex_unlock(&p->lock);
  CHECK_OK(gma_destroy(g)); /* releases both ranges */
  printf("test_vmm_ranges: ok\n");
  return 0;
}
