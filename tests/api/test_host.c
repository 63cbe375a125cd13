/* The pinned host pool (reuse gated by the copy still running on the block's
 * stream, size classes, errors, trimming by the worker), the CPU fallback
 * (a capacity-limited simulated device runs out; the request is served from
 * host memory the device can reach, and freed correctly), tags (pointer
 * info, snapshot, summary, leak report) and gma_pointer_info. Public API. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "simkit.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static gma_pointer_info_t info_of(gma_t *g, const void *p) {
  gma_pointer_info_t i = GMA_POINTER_INFO_INIT;
  CHECK_OK(gma_pointer_info(g, p, &i));
  return i;
}

/* A "copy" holding the host block on its stream: the block freed meanwhile
 * must not be handed out again until the copy is done. */
static void host_reuse_waits_for_the_copy(void) {
  gma_t *g = sim_allocator("worker:off");
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  void *h = NULL;
  CHECK_OK(gma_host_alloc(g, 5000, s, &h));
  gma_pointer_info_t i = info_of(g, (char *)h + 100);
  CHECK(i.kind == GMA_MEMORY_HOST_PINNED && i.base == h && i.requested == 5000 &&
        i.block_size == 5120 && i.stream == s && strcmp(i.tag, "untagged") == 0);
  atomic_int gate = 0, corruptions = 0;
  pattern_kernel_t k = {.buf = h, .len = 5000, .value = 9, .gate = &gate,
                        .corruptions = &corruptions};
  CHECK_OK(gma_sim_launch(g, s, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  CHECK_OK(gma_host_free(g, h));
  CHECK_ST(gma_host_free(g, h), GMA_ERR_DOUBLE_FREE);
  void *h2 = NULL;
  CHECK_OK(gma_host_alloc(g, 5000, s, &h2));
  CHECK(h2 != h); /* the copy still runs: a new block */
  memset(h2, 0x55, 5000); /* the host writes the new block at once */
  atomic_store(&gate, 1);
  CHECK_OK(gma_stream_synchronize(g, s));
  CHECK(atomic_load(&corruptions) == 0);
  void *h3 = NULL;
  CHECK_OK(gma_host_alloc(g, 4800, s, &h3)); /* same class, copy done: reused */
  CHECK(h3 == h);
  gma_stats_t st = stats_of(g);
  CHECK(st.num_host_allocs == 3 && st.num_host_frees == 1);
  CHECK(st.host_allocated.current == 2 * 5120 && st.host_reserved.current == 2 * 5120);
  CHECK(st.host_allocated.peak == 2 * 5120);
  /* Errors: foreign pointers, the wrong kind, zero. */
  int local;
  CHECK_ST(gma_host_free(g, &local), GMA_ERR_INVALID_POINTER);
  void *d = NULL;
  CHECK_OK(gma_alloc(g, 4096, s, &d));
  CHECK_ST(gma_host_free(g, d), GMA_ERR_INVALID_POINTER);
  CHECK_ST(gma_free(g, h2), GMA_ERR_INVALID_POINTER);
  CHECK_ST(gma_host_alloc(g, 0, s, &h), GMA_ERR_INVALID_SIZE);
  CHECK_OK(gma_host_free(g, NULL));
  CHECK_OK(gma_free(g, d));
  CHECK_OK(gma_host_free(g, h2));
  CHECK_OK(gma_host_free(g, h3));
  CHECK_OK(gma_stream_synchronize(g, s));
  CHECK_OK(gma_empty_cache(g)); /* host cache too */
  CHECK(stats_of(g).host_reserved.current == 0);
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
}

static void worker_trims_host_cache(void) {
  gma_t *g = sim_allocator("trim_interval_ms:10,host_release_threshold:2M");
  void *h[8];
  for (int i = 0; i < 8; i++) CHECK_OK(gma_host_alloc(g, MiB, NULL, &h[i]));
  for (int i = 0; i < 8; i++) CHECK_OK(gma_host_free(g, h[i]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK(stats_of(g).host_reserved.current == 8 * MiB);
  uint64_t held = 0;
  for (int i = 0; i < 500; i++) { /* the worker ticks every 10 ms */
    held = stats_of(g).host_reserved.current;
    if (held <= 2 * MiB) break;
    sleep_us(2000);
  }
  CHECK(held == 2 * MiB);
  CHECK_OK(gma_destroy(g));
}

static void fallback_to_host(void) {
  gma_t *g = sim_allocator("worker:off,sim_capacity:16M");
  void *a = NULL, *b = NULL, *a2 = NULL;
  CHECK_OK(gma_alloc(g, 10 * MiB, NULL, &a));
  CHECK_ST(gma_alloc(g, 10 * MiB, NULL, &b), GMA_ERR_OOM); /* off by default */
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_destroy(g));

  g = sim_allocator("worker:off,sim_capacity:16M,fallback:host");
  CHECK_OK(gma_alloc(g, 10 * MiB, NULL, &a));
  CHECK_ST(gma_alloc(g, 0, NULL, &b), GMA_ERR_INVALID_SIZE); /* a known last error */
  CHECK_OK(gma_alloc_tagged(g, 10 * MiB, NULL, "activations", &b));
  gma_pointer_info_t i = info_of(g, b);
  CHECK(i.kind == GMA_MEMORY_FALLBACK && i.base == b && i.requested == 10 * MiB &&
        strcmp(i.tag, "activations") == 0);
  CHECK(info_of(g, a).kind == GMA_MEMORY_DEVICE);
  gma_stats_t st = stats_of(g);
  CHECK(st.num_fallbacks == 1 && st.fallback_bytes >= 10 * MiB);
  /* A fallback is a successful call: counted as an allocation, not an OOM. */
  CHECK(st.num_allocs == 2 && st.num_ooms == 0);
  CHECK(strstr(gma_last_error(), "GMA_ERR_INVALID_SIZE") == gma_last_error()); /* kept */
  CHECK(st.reserved.current <= 16 * MiB); /* the device is full; the rest is host */
  /* The device can use it: a simulated kernel writes and checks it. */
  atomic_int corruptions = 0;
  pattern_kernel_t k = {.buf = b, .len = 10 * MiB, .value = 3, .corruptions = &corruptions};
  CHECK_OK(gma_sim_launch(g, NULL, pattern_kernel_run, &k));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK(atomic_load(&corruptions) == 0 && ((unsigned char *)b)[12345] == 3);
  CHECK_ST(gma_alloc(g, 0, NULL, &a2), GMA_ERR_INVALID_SIZE); /* a known last error */
  CHECK_OK(gma_record_stream(g, b, NULL));
  CHECK_OK(gma_free(g, b)); /* host memory: the pool's "not mine" is not said */
  CHECK(strstr(gma_last_error(), "GMA_ERR_INVALID_SIZE") == gma_last_error());
  CHECK_ST(gma_free(g, b), GMA_ERR_DOUBLE_FREE);
  CHECK_ST(gma_host_free(g, a), GMA_ERR_INVALID_POINTER);
  st = stats_of(g);
  CHECK(st.fallback_bytes == 0 && st.num_fallbacks == 1);
  CHECK_OK(gma_free(g, a));
  st = stats_of(g);
  CHECK(st.num_frees == 2 && st.num_allocs == 2);
  CHECK_OK(gma_destroy(g));
}

/* Trace rows of a CPU-fallback block carry its own figures, as
 * gma_pointer_info says them: the allocate row its block size, the free
 * row the bytes asked for, its stream and its block size (they were 0:
 * the trace asked only the device pool). */
static void fallback_trace_rows(void) {
  char path[] = "/tmp/gma_fallback_trace_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  char conf[128];
  snprintf(conf, sizeof conf, "worker:off,sim_capacity:16M,fallback:host,trace:%s", path);
  gma_t *g = sim_allocator(conf);
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  void *a = NULL, *b = NULL;
  CHECK_OK(gma_alloc(g, 10 * MiB, s, &a));
  CHECK_OK(gma_alloc(g, 10 * MiB + 100, s, &b));
  gma_pointer_info_t i = info_of(g, b);
  CHECK(i.kind == GMA_MEMORY_FALLBACK);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  char text[8192];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  unlink(path);
  char row[200];
  snprintf(row, sizeof row, ",allocate,%p,%zu,%p,%zu,", b, 10 * MiB + 100, (void *)s, i.block_size);
  CHECK(strstr(text, row) != NULL);
  snprintf(row, sizeof row, ",free,%p,%zu,%p,%zu,", b, 10 * MiB + 100, (void *)s, i.block_size);
  CHECK(strstr(text, row) != NULL);
}

/* gma_record_stream of a CPU-fallback block: its free also waits for the
 * work on the recorded stream, so the block is not handed out again (nor
 * written by the host) while a kernel there still uses it; also when that
 * stream is destroyed before the free. */
static void fallback_record_stream(void) {
  gma_t *g = sim_allocator("worker:off,sim_capacity:16M,fallback:host,reuse:none");
  gma_stream_t s1, s2;
  CHECK_OK(gma_stream_create(g, &s1));
  CHECK_OK(gma_stream_create(g, &s2));
  void *dev = NULL, *fb = NULL;
  CHECK_OK(gma_alloc(g, 12 * MiB, s1, &dev)); /* fills the device */
  for (int round = 0; round < 2; round++) {
    CHECK_OK(gma_alloc(g, 8 * MiB, s1, &fb));
    CHECK(info_of(g, fb).kind == GMA_MEMORY_FALLBACK);
    atomic_int gate = 0, corruptions = 0;
    pattern_kernel_t k = {.buf = fb, .len = 8 * MiB, .value = 7, .gate = &gate,
                          .corruptions = &corruptions};
    CHECK_OK(gma_sim_launch(g, s2, pattern_kernel_run, &k)); /* s2 uses it, held */
    pattern_kernel_wait_started(&k);
    /* Round 1 names the block by a pointer inside it (issue 17: any pointer
     * into a live allocation records the whole allocation). */
    void *name = round ? (char *)fb + 4096 : fb;
    CHECK_OK(gma_record_stream(g, name, s2));
    CHECK_OK(gma_record_stream(g, name, s2)); /* twice: one entry */
    CHECK_OK(gma_record_stream(g, name, s1)); /* its own stream: nothing to add */
    if (round == 1) /* s2 goes before the free (the kernel still runs): gma records */
      CHECK_OK(gma_stream_destroy(g, s2)); /* an event on it first, and the free waits for it */
    CHECK_OK(gma_free(g, fb));
    void *again = NULL;
    CHECK_OK(gma_alloc(g, 8 * MiB, s1, &again)); /* s1 is idle: only s2 holds the block */
    CHECK(again != fb); /* the kernel on s2 still uses it: another block */
    memset(again, 0x5a, 8 * MiB);
    void *still = NULL; /* still held: not this block either */
    CHECK_OK(gma_alloc(g, 4 * MiB, s1, &still));
    CHECK(still != fb);
    CHECK_OK(gma_free(g, still));
    atomic_store(&gate, 1);
    void *reused = NULL;
    if (round == 0) {
      CHECK_OK(gma_stream_synchronize(g, s2));
      CHECK_OK(gma_alloc(g, 8 * MiB, s1, &reused)); /* s2's work done: the block comes back */
    } else { /* s2 is gone: wait for its last kernel by trying (at most 1.3 s); the
              * probes stay live so that each try can only find fb */
      void *probe[64];
      int n = 0;
      for (; n < 64; n++) {
        CHECK_OK(gma_alloc(g, 8 * MiB, s1, &reused));
        if (reused == fb) break;
        probe[n] = reused;
        sleep_us(20000);
      }
      while (n > 0) CHECK_OK(gma_free(g, probe[--n]));
    }
    CHECK(atomic_load(&corruptions) == 0);
    CHECK(reused == fb);
    CHECK_OK(gma_free(g, reused));
    CHECK_OK(gma_free(g, again));
    if (round == 1) CHECK_OK(gma_stream_create(g, &s2));
  }
  /* Errors: not a live allocation. */
  CHECK_ST(gma_record_stream(g, fb, s2), GMA_ERR_INVALID_POINTER); /* freed */
  CHECK_ST(gma_record_stream(g, (char *)fb + 4096, s2), GMA_ERR_INVALID_POINTER); /* inside it */
  CHECK_OK(gma_record_stream(g, (char *)dev + 4096, s2)); /* inside a live one: the whole */
  CHECK_OK(gma_free(g, dev));
  CHECK_OK(gma_stream_synchronize(g, s1));
  CHECK_OK(gma_empty_cache(g));
  gma_stats_t st = stats_of(g);
  /* Fallbacks for certain: fb, again and the reuse of fb in each round (6).
   * Round 1's probes add one per try before s2's kernel ends, which may be
   * none on a loaded machine: the bound read 7 until a fresh-clone ASan run
   * under load found fb at the first try (1 run in 20). */
  CHECK(st.host_reserved.current == 0 && st.reserved.current == 0 && st.num_fallbacks >= 6);
  CHECK_OK(gma_stream_destroy(g, s1));
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
}

static void tags_everywhere(void) {
  gma_t *g = sim_allocator("worker:off");
  void *w = NULL, *kv = NULL, *plain = NULL;
  CHECK_OK(gma_alloc_tagged(g, 3 * MiB, NULL, "weights", &w));
  CHECK_OK(gma_alloc_tagged(g, 64 * KiB, NULL, "kv-cache", &kv));
  CHECK_OK(gma_alloc(g, 64 * KiB, NULL, &plain));
  CHECK(strcmp(info_of(g, w).tag, "weights") == 0);
  gma_pointer_info_t i = info_of(g, (char *)kv + 1000); /* interior pointer */
  CHECK(i.kind == GMA_MEMORY_DEVICE && i.base == kv && strcmp(i.tag, "kv-cache") == 0 &&
        i.requested == 64 * KiB && i.block_size == 64 * KiB && i.stream == NULL);
  CHECK(strcmp(info_of(g, plain).tag, "untagged") == 0);
  /* A reused block loses its old tag. */
  CHECK_OK(gma_free(g, kv));
  void *again = NULL;
  CHECK_OK(gma_alloc(g, 64 * KiB, NULL, &again));
  CHECK(again == kv && strcmp(info_of(g, again).tag, "untagged") == 0);
  /* Snapshot and summary group by tag. */
  char path[] = "/tmp/gma-host-test-XXXXXX.json";
  int fd = mkstemps(path, 5);
  CHECK(fd >= 0);
  close(fd);
  CHECK_OK(gma_snapshot_json(g, path));
  FILE *f = fopen(path, "r");
  char buf[8192] = "";
  CHECK(f && fread(buf, 1, sizeof buf - 1, f) > 0);
  fclose(f);
  unlink(path);
  CHECK(strstr(buf, "\"tag\":\"weights\"") != NULL);
  char sum[8192];
  CHECK_OK(gma_memory_summary(g, sum, sizeof sum));
  CHECK(strstr(sum, "|   weights                  | 3.00 MiB in 1 allocations") != NULL);
  CHECK(strstr(sum, "|   untagged                 | 128.00 KiB in 2 allocations") != NULL);
  /* Bad tags. */
  void *x = NULL;
  CHECK_ST(gma_alloc_tagged(g, 512, NULL, "", &x), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_alloc_tagged(g, 512, NULL, "a-tag-name-well-over-31-characters", &x),
           GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_alloc_tagged(g, 512, NULL, NULL, &x), GMA_ERR_INVALID_ARGUMENT);
  CHECK(x == NULL);
  /* Pointer info errors. */
  gma_pointer_info_t bad = {.size = 3};
  CHECK_ST(gma_pointer_info(g, w, &bad), GMA_ERR_INVALID_ARGUMENT);
  int local;
  gma_pointer_info_t ok = GMA_POINTER_INFO_INIT;
  CHECK_ST(gma_pointer_info(g, &local, &ok), GMA_ERR_INVALID_POINTER);
  CHECK_OK(gma_free(g, again));
  CHECK_ST(gma_pointer_info(g, again, &ok), GMA_ERR_INVALID_POINTER); /* freed */
  /* 255 distinct tags at most. */
  for (int t = 0; t < 253; t++) { /* with weights and kv-cache: 255 */
    char name[16];
    snprintf(name, sizeof name, "t%d", t);
    void *p = NULL;
    CHECK_OK(gma_alloc_tagged(g, 512, NULL, name, &p));
    CHECK_OK(gma_free(g, p));
  }
  CHECK_OK(gma_alloc_tagged(g, 512, NULL, "t7", &x)); /* known: fine */
  CHECK_OK(gma_free(g, x));
  CHECK_ST(gma_alloc_tagged(g, 512, NULL, "one-too-many", &x), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "255 tags") != NULL);
  /* The leak report names the tags of what was never freed. */
  CHECK_ST(gma_destroy(g), GMA_ERR_LEAK);
  CHECK(strstr(gma_last_error(), "weights: 1 (3145728 bytes)") != NULL);
  CHECK(strstr(gma_last_error(), "untagged: 1 (65536 bytes)") != NULL);
}

/* Each free given the other kind of memory says which free to use (issue
 * 17: gma_free of pinned host memory said the pointer was not gma's at all),
 * changes nothing, and the right free still works. */
static void wrong_free_says_which(void) {
  gma_t *g = sim_allocator("worker:off,sim_capacity:16M,fallback:host");
  void *h = NULL, *d = NULL, *fb = NULL;
  CHECK_OK(gma_host_alloc(g, 5000, NULL, &h));
  CHECK_OK(gma_alloc(g, 12 * MiB, NULL, &d)); /* fills the device */
  CHECK_OK(gma_alloc(g, 8 * MiB, NULL, &fb)); /* served by the CPU fallback */
  CHECK(info_of(g, fb).kind == GMA_MEMORY_FALLBACK);
  gma_stats_t before = stats_of(g);
  /* Pinned host memory to gma_free, at its start and inside it. */
  CHECK_ST(gma_free(g, h), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "pinned host memory from gma_host_alloc") &&
        strstr(gma_last_error(), "free it with gma_host_free"));
  CHECK(!strstr(gma_last_error(), "not allocated by this allocator"));
  CHECK_ST(gma_free(g, (char *)h + 100), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "gma_host_free"));
  CHECK_ST(gma_record_stream(g, h, NULL), GMA_ERR_INVALID_POINTER); /* not for pinned memory */
  CHECK(strstr(gma_last_error(), "pinned host memory"));
  /* Device memory to gma_host_free, at its start and inside it. */
  CHECK_ST(gma_host_free(g, d), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "device memory") &&
        strstr(gma_last_error(), "free it with gma_free"));
  CHECK_ST(gma_host_free(g, (char *)d + 4096), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "free it with gma_free"));
  /* gma_alloc's CPU-fallback memory to gma_host_free; inside it to gma_free. */
  CHECK_ST(gma_host_free(g, fb), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "fallback:host") && strstr(gma_last_error(), "gma_free"));
  CHECK_ST(gma_free(g, (char *)fb + 4096), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "interior pointer") &&
        strstr(gma_last_error(), "fallback:host"));
  /* Memory of neither kind keeps the plain message. */
  int local;
  CHECK_ST(gma_free(g, &local), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "not allocated by this allocator"));
  CHECK_ST(gma_host_free(g, &local), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "not memory gma_host_alloc returned"));
  gma_stats_t after = stats_of(g);
  CHECK(after.num_frees == before.num_frees && after.num_host_frees == before.num_host_frees &&
        after.allocated.current == before.allocated.current &&
        after.host_allocated.current == before.host_allocated.current);
  CHECK_OK(gma_host_free(g, h));
  CHECK_OK(gma_free(g, fb));
  CHECK_OK(gma_free(g, d));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  wrong_free_says_which();
  host_reuse_waits_for_the_copy();
  worker_trims_host_cache();
  fallback_to_host();
  fallback_trace_rows();
  fallback_record_stream();
  tags_everywhere();
  printf("test_host: ok\n");
  return 0;
}
