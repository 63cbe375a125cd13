/* Structs with a size field, as a program built against an older gma.h
 * passes them: gma reads and writes only the first size bytes. Each short
 * struct here ends where an inaccessible page begins (or, for a size that
 * is not a multiple of 8, where a canary begins), so a read or write past
 * size faults or shows, in a plain build as under ASan. Sizes no gma.h
 * ever had (below the size field, above this library's struct) are
 * refused with a message naming the INIT macro, and change nothing.
 * Covers gma_config_t (gma_config_parse, gma_create),
 * gma_async_options_t, gma_stats_t, gma_stream_stats_t,
 * gma_graph_pool_stats_t and gma_pointer_info_t. Public API only. */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "simkit.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static void on_fault(int sig) {
  (void)sig;
  static const char msg[] = "test_struct_sizes: gma touched memory past a struct's size field "
                            "(a fault on the guard page)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(1);
}

/* n bytes (a multiple of 8, so every field is aligned) that end where a
 * PROT_NONE page begins, zeroed. */
typedef struct guarded {
  char *map;
  size_t len;
  void *at;
} guarded_t;

static guarded_t guard_new(size_t n) {
  CHECK(n % 8 == 0);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t data = (n + page - 1) / page * page;
  guarded_t gd;
  gd.len = data + page;
  gd.map = mmap(NULL, gd.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(gd.map != MAP_FAILED);
  CHECK(mprotect(gd.map + data, page, PROT_NONE) == 0);
  gd.at = gd.map + data - n;
  return gd;
}

static void guard_free(guarded_t *gd) { CHECK(munmap(gd->map, gd->len) == 0); }

/* A config as a program built against an older gma.h has it: the first n
 * bytes, size = n, device sim where the struct reaches that far. */
static gma_config_t *short_config(guarded_t *gd, size_t n) {
  *gd = guard_new(n);
  gma_config_t *c = gd->at;
  c->size = n;
  if (n >= offsetof(gma_config_t, device) + sizeof c->device) c->device = GMA_DEVICE_SIM;
  if (n >= offsetof(gma_config_t, ignore_env) + sizeof c->ignore_env) c->ignore_env = 1;
  return c;
}

/* gma_config_parse reads and writes only config->size bytes, refuses keys
 * whose field lies past them (and changes nothing then), and gma_create
 * takes the short struct. */
static void config_parse_short(void) {
  static const size_t sizes[] = {sizeof(size_t), 16, offsetof(gma_config_t, sim_capacity),
                                 offsetof(gma_config_t, oom_wait_ms),
                                 offsetof(gma_config_t, per_thread_default_stream)};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    guarded_t gd;
    gma_config_t *c = short_config(&gd, n);
    CHECK_OK(gma_config_parse(c, ""));
    CHECK(c->size == n);
    if (n >= 16) {
      CHECK_OK(gma_config_parse(c, "device:sim,device_id:0"));
      CHECK(c->device == GMA_DEVICE_SIM && c->size == n);
    }
    if (n > offsetof(gma_config_t, ring_size)) {
      CHECK_OK(gma_config_parse(c, "small_size:64K,ring_size:8"));
      CHECK(c->small_size == 64 * KiB && c->ring_size == 8 && c->size == n);
    }
    if (n > offsetof(gma_config_t, oom_wait_ms)) {
      CHECK_OK(gma_config_parse(c, "oom_wait_ms:5"));
      CHECK(c->oom_wait_ms == 5);
    }
    /* A key whose field this struct does not have: refused, nothing set. */
    unsigned char before[sizeof(gma_config_t)];
    memcpy(before, c, n);
    const char *past = n > offsetof(gma_config_t, memory_limit) ? "memory_limit:1G,plan:on" : "plan:on";
    CHECK_ST(gma_config_parse(c, past), GMA_ERR_CONFIG);
    CHECK(strstr(gma_last_error(), "'plan'") && strstr(gma_last_error(), "gma.h"));
    CHECK(memcmp(before, c, n) == 0);
    if (n <= offsetof(gma_config_t, device)) {
      CHECK_ST(gma_config_parse(c, "device:sim"), GMA_ERR_CONFIG);
      CHECK(memcmp(before, c, n) == 0);
    }
    /* gma_create reads the same bytes (a struct without device asks for
     * the default device). */
    gma_t *g = NULL;
    CHECK_OK(gma_create(c, &g));
    if (n > offsetof(gma_config_t, device)) CHECK(strcmp(gma_device_name(g), "sim") == 0);
    CHECK_OK(gma_destroy(g));
    guard_free(&gd);
  }
}

/* 732 bytes: gma_config_t without its last field (plan). Not a multiple of
 * 8, so a canary, not the guard page, catches what lies past it: a parse
 * that read it would see plan = 0xa5a5a5a5 and refuse the config; one that
 * wrote it would change the canary. */
static void config_parse_732(void) {
  size_t n = offsetof(gma_config_t, plan);
  CHECK(n == 732);
  _Alignas(8) unsigned char buf[sizeof(gma_config_t) + 16];
  memset(buf, 0, n);
  memset(buf + n, 0xa5, sizeof buf - n);
  gma_config_t *c = (gma_config_t *)buf;
  c->size = n;
  c->device = GMA_DEVICE_SIM;
  c->ignore_env = 1;
  CHECK_OK(gma_config_parse(c, "small_size:64K,default_stream:per_thread"));
  CHECK(c->small_size == 64 * KiB && c->per_thread_default_stream == 1 && c->size == n);
  for (size_t i = n; i < sizeof buf; i++) CHECK(buf[i] == 0xa5);
  CHECK_ST(gma_config_parse(c, "plan:on"), GMA_ERR_CONFIG);
  for (size_t i = n; i < sizeof buf; i++) CHECK(buf[i] == 0xa5);
  gma_t *g = NULL;
  CHECK_OK(gma_create(c, &g));
  CHECK_OK(gma_destroy(g));
  for (size_t i = n; i < sizeof buf; i++) CHECK(buf[i] == 0xa5);
}

/* The text of a message after "what.size is" (the part both calls share). */
static const char *after_size(const char *msg, char *out, size_t len) {
  const char *at = strstr(msg, "size is ");
  CHECK(at != NULL);
  snprintf(out, len, "%s", at);
  return out;
}

/* Sizes no gma.h ever gave the struct: gma_config_parse refuses them as
 * gma_create does, with the same status and words, and writes nothing. */
static void config_size_refused(void) {
  static const size_t sizes[] = {0, 3, sizeof(size_t) - 1, sizeof(gma_config_t) + 1,
                                 sizeof(gma_config_t) + 64};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    gma_config_t c = GMA_CONFIG_INIT, copy;
    c.size = sizes[i];
    copy = c;
    CHECK_ST(gma_config_parse(&c, "small_size:64K"), GMA_ERR_INVALID_ARGUMENT);
    char parse_msg[1024], create_msg[1024];
    after_size(gma_last_error(), parse_msg, sizeof parse_msg);
    CHECK(strstr(gma_last_error(), "gma_config_parse") && strstr(parse_msg, "GMA_CONFIG_INIT"));
    CHECK(memcmp(&c, &copy, sizeof c) == 0);
    gma_t *g = (gma_t *)1;
    CHECK_ST(gma_create(&c, &g), GMA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(gma_last_error(), "gma_create"));
    after_size(gma_last_error(), create_msg, sizeof create_msg);
    CHECK(strcmp(parse_msg, create_msg) == 0);
  }
}

static gma_t *test_allocator(void) { return sim_allocator("trim_interval_ms:3600000"); }

typedef struct cb_count {
  int calls;
} cb_count_t;

static void count_cb(gma_future_t *f, gma_status_t st, void *user) {
  (void)f;
  (void)st;
  __atomic_fetch_add(&((cb_count_t *)user)->calls, 1, __ATOMIC_SEQ_CST);
}

/* One request of each kind with options of size n: a bin hit (complete at
 * once), one the worker serves, and a batch. */
static void async_with(gma_t *g, gma_async_options_t *o, size_t n, cb_count_t *seen) {
  void *p;
  CHECK_OK(gma_alloc(g, 64 * KiB, NULL, &p));
  CHECK_OK(gma_free(g, p)); /* in the default stream's bin now */
  gma_future_t *f;
  CHECK_OK(gma_alloc_async(g, 64 * KiB, NULL, o, &f));
  CHECK_OK(gma_future_take(f, UINT64_MAX, &p));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_alloc_async(g, 8 * MiB, NULL, o, &f));
  CHECK_OK(gma_future_take(f, UINT64_MAX, &p));
  CHECK_OK(gma_free(g, p));
  size_t sizes[2] = {4 * MiB, 4 * MiB};
  void *ptrs[2];
  CHECK_OK(gma_alloc_batch_async(g, 2, sizes, NULL, ptrs, o, &f));
  CHECK_OK(gma_future_take(f, UINT64_MAX, NULL));
  CHECK_OK(gma_free(g, ptrs[0]));
  CHECK_OK(gma_free(g, ptrs[1]));
  int want = n >= offsetof(gma_async_options_t, user) + sizeof(void *) ? 3 : 0;
  CHECK(__atomic_load_n(&seen->calls, __ATOMIC_SEQ_CST) == want);
  CHECK(o->size == n);
}

/* gma_async_options_t from older headers: only the fields within size are
 * read (a callback past it is never called, and never read). */
static void async_options_short(void) {
  gma_t *g = test_allocator();
  static const size_t sizes[] = {sizeof(size_t), offsetof(gma_async_options_t, nonblocking),
                                 offsetof(gma_async_options_t, callback),
                                 offsetof(gma_async_options_t, worker_only),
                                 sizeof(gma_async_options_t)};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    guarded_t gd = guard_new(n);
    gma_async_options_t *o = gd.at;
    cb_count_t seen = {0};
    o->size = n;
    if (n > offsetof(gma_async_options_t, timeout_ns)) o->timeout_ns = 5000000000ull;
    if (n > offsetof(gma_async_options_t, user)) {
      o->callback = count_cb;
      o->user = &seen;
    }
    async_with(g, o, n, &seen);
    guard_free(&gd);
  }
  gma_async_options_t bad = GMA_ASYNC_OPTIONS_INIT;
  gma_future_t *f = (gma_future_t *)1;
  for (size_t s = 0; s < sizeof(size_t); s += 3) {
    bad.size = s;
    CHECK_ST(gma_alloc_async(g, 64 * KiB, NULL, &bad, &f), GMA_ERR_INVALID_ARGUMENT);
    CHECK(f == NULL && strstr(gma_last_error(), "GMA_ASYNC_OPTIONS_INIT"));
  }
  bad.size = sizeof bad + 8;
  CHECK_ST(gma_alloc_async(g, 64 * KiB, NULL, &bad, &f), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "GMA_ASYNC_OPTIONS_INIT"));
  CHECK_OK(gma_destroy(g));
}

/* An output struct of n bytes at the end of a guarded page: fill(out)
 * must succeed, keep size as it was and write nothing past it. Sizes no
 * gma.h had are refused and leave the struct untouched. */
typedef gma_status_t (*fill_fn)(gma_t *g, void *ctx, void *out);

static void out_struct(gma_t *g, void *ctx, fill_fn fill, size_t full, const char *init) {
  static const size_t fields[] = {sizeof(size_t), 16, 24, 32, 40, 48, 64};
  for (size_t i = 0; i <= sizeof fields / sizeof fields[0]; i++) {
    size_t n = i < sizeof fields / sizeof fields[0] ? fields[i] : full;
    if (n > full) continue;
    guarded_t gd = guard_new(n);
    memset(gd.at, 0x5a, n);
    *(size_t *)gd.at = n;
    CHECK_OK(fill(g, ctx, gd.at));
    CHECK(*(size_t *)gd.at == n);
    guard_free(&gd);
  }
  static const size_t bad[] = {0, 3, sizeof(size_t) - 1, 0 /* full + 1 */, 0 /* full + 64 */};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    _Alignas(8) unsigned char buf[1024], copy[1024];
    CHECK(full <= sizeof buf);
    memset(buf, 0x5a, sizeof buf);
    *(size_t *)buf = i < 3 ? bad[i] : full + (i == 3 ? 1 : 64);
    memcpy(copy, buf, sizeof buf);
    CHECK_ST(fill(g, ctx, buf), GMA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(gma_last_error(), init) != NULL);
    CHECK(memcmp(buf, copy, sizeof buf) == 0);
  }
}

static gma_status_t fill_stats(gma_t *g, void *ctx, void *out) {
  (void)ctx;
  return gma_stats(g, out);
}

static gma_status_t fill_stream_stats(gma_t *g, void *ctx, void *out) {
  (void)ctx;
  return gma_stream_stats(g, NULL, out);
}

static gma_status_t fill_pool_stats(gma_t *g, void *ctx, void *out) {
  return gma_graph_pool_stats(g, ctx, out);
}

static gma_status_t fill_pointer_info(gma_t *g, void *ctx, void *out) {
  return gma_pointer_info(g, ctx, out);
}

/* gma_stats, gma_stream_stats, gma_graph_pool_stats and gma_pointer_info
 * with structs from older headers. */
static void out_structs_short(void) {
  gma_t *g = test_allocator();
  void *p;
  CHECK_OK(gma_alloc(g, 64 * KiB, NULL, &p));
  out_struct(g, NULL, fill_stats, sizeof(gma_stats_t), "GMA_STATS_INIT");
  out_struct(g, NULL, fill_stream_stats, sizeof(gma_stream_stats_t), "GMA_STREAM_STATS_INIT");
  out_struct(g, p, fill_pointer_info, sizeof(gma_pointer_info_t), "GMA_POINTER_INFO_INIT");
  gma_graph_pool_t *pool;
  CHECK_OK(gma_graph_pool_create(g, &pool));
  out_struct(g, pool, fill_pool_stats, sizeof(gma_graph_pool_stats_t),
             "GMA_GRAPH_POOL_STATS_INIT");
  CHECK_OK(gma_graph_pool_release(g, pool));
  /* What a short struct holds is what the full one holds. */
  gma_stats_t full = GMA_STATS_INIT, part = {.size = offsetof(gma_stats_t, requested)};
  CHECK_OK(gma_stats(g, &full));
  CHECK_OK(gma_stats(g, &part));
  CHECK(part.allocated.current == full.allocated.current && part.allocated.current == 64 * KiB);
  CHECK(part.requested.current == 0);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
}

int main(int argc, char **argv) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fault;
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
  static const test_case_t cases[] = {
      {"config_parse_short", config_parse_short},
      {"config_parse_732", config_parse_732},
      {"config_size_refused", config_size_refused},
      {"async_options_short", async_options_short},
      {"out_structs_short", out_structs_short},
  };
  return run_cases(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
