/* What gma says about itself: gma_snapshot_json (every segment and block,
 * consistent with the statistics), gma_memory_summary (the table, its size
 * check), and trace recording (the header, one row per call with the right
 * action, thread numbering, failures with their status, bad paths). Public
 * API only. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  CHECK(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char *s = malloc((size_t)n + 1);
  CHECK(s && fread(s, 1, (size_t)n, f) == (size_t)n);
  s[n] = '\0';
  fclose(f);
  return s;
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static void tmp_path(char *buf, const char *suffix) {
  snprintf(buf, 128, "/tmp/gma-observe-%d-XXXXXX%s", (int)getpid(), suffix);
  int fd = mkstemps(buf, (int)strlen(suffix));
  CHECK(fd >= 0);
  close(fd);
}

static void snapshot(void) {
  gma_t *g = sim_allocator_ordinary("worker:off");
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  void *a, *b, *c;
  CHECK_OK(gma_alloc(g, 1000, NULL, &a));
  CHECK_OK(gma_alloc(g, 3 * MiB, s, &b));
  CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &c));
  CHECK_OK(gma_free(g, c));
  char path[128];
  tmp_path(path, ".json");
  CHECK_OK(gma_snapshot_json(g, path));
  char *j = slurp(path);
  gma_stats_t st = stats_of(g);
  unsigned long long reserved = 0, allocated = 0, requested = 0;
  CHECK(sscanf(j, "{\"version\":1,\"device\":\"sim\",\"reserved\":%llu,\"allocated\":%llu,"
                  "\"requested\":%llu",
               &reserved, &allocated, &requested) == 3);
  CHECK(reserved == st.reserved.current && allocated == st.allocated.current);
  CHECK(requested == 1000 + 3 * MiB);
  CHECK(count(j, "\"state\":\"live\"") == 2);
  CHECK(count(j, "\"pool\":") == (int)st.num_segments);
  char needle[256];
  snprintf(needle, sizeof needle, "{\"address\":\"%p\",\"size\":%zu,\"state\":\"live\",\"stream\":\"%p\","
           "\"requested\":%zu,\"tag\":\"untagged\"}", b, 3 * MiB, (void *)s, 3 * MiB);
  CHECK(strstr(j, needle) != NULL);
  snprintf(needle, sizeof needle, "\"address\":\"%p\",\"size\":1024,\"state\":\"live\"", a);
  CHECK(strstr(j, needle) != NULL);
  CHECK(strstr(j, "\"state\":\"cached\"") || strstr(j, "\"state\":\"free\"")); /* c */
  CHECK(j[strlen(j) - 2] == '}');
  free(j);
  unlink(path);
  CHECK_ST(gma_snapshot_json(g, "/nonexistent-dir/x.json"), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "/nonexistent-dir/x.json") != NULL);
  CHECK_ST(gma_snapshot_json(NULL, path), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
}

static void summary(void) {
  gma_t *g = sim_allocator_ordinary("worker:off");
  void *a;
  CHECK_OK(gma_alloc(g, 5 * MiB, NULL, &a));
  char buf[8192];
  CHECK_OK(gma_memory_summary(g, buf, sizeof buf));
  CHECK(strstr(buf, "gma memory summary: device sim") != NULL);
  CHECK(strstr(buf, "| allocated                  |     5.00 MiB |     5.00 MiB |     5.00 MiB |"));
  CHECK(strstr(buf, "| reserved                   |    20.00 MiB |") != NULL);
  CHECK(strstr(buf, "| allocations / frees        | 1 / 0 (1 live)") != NULL);
  CHECK(strstr(buf, "OOMs / OOM retries") && strstr(buf, "futures: submitted/at once"));
  /* Every line the same width: a table. */
  int lines = 0;
  for (char *l = buf, *e; (e = strchr(l, '\n')); l = e + 1, lines++) CHECK(e - l == 75);
  CHECK(lines > 20);
  char small[64];
  memset(small, 'x', sizeof small);
  CHECK_ST(gma_memory_summary(g, small, sizeof small), GMA_ERR_INVALID_SIZE);
  CHECK(strstr(gma_last_error(), "has 64 bytes; the summary needs") != NULL);
  CHECK(small[sizeof small - 1] == '\0' && strncmp(small, "+====", 5) == 0);
  CHECK_ST(gma_memory_summary(g, NULL, 10), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_memory_summary(g, buf, 0), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_destroy(g));
}

typedef struct other {
  gma_t *g;
  void *p;
} other_t;

static void *other_thread(void *arg) {
  other_t *o = arg;
  CHECK_OK(gma_alloc(o->g, 2048, NULL, &o->p));
  return NULL;
}

static void trace(void) {
  char path[128], path2[128];
  tmp_path(path, ".csv");
  tmp_path(path2, ".csv");
  gma_t *g = sim_allocator_ordinary("worker:off");
  CHECK_ST(gma_trace_start(g, "/nonexistent-dir/t.csv"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "cannot create '/nonexistent-dir/t.csv'") != NULL);
  CHECK_OK(gma_trace_stop(g)); /* none running: fine */
  CHECK_OK(gma_trace_start(g, path));
  void *a, *bad;
  CHECK_OK(gma_alloc(g, 1000, NULL, &a));
  CHECK_ST(gma_alloc(g, 0, NULL, &bad), GMA_ERR_INVALID_SIZE);
  other_t o = {g, NULL};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, other_thread, &o) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK_OK(gma_free(g, a));
  CHECK_ST(gma_free(g, a), GMA_ERR_DOUBLE_FREE);
  CHECK_OK(gma_trace_start(g, path2)); /* replaces the first: it is closed */
  CHECK_OK(gma_free(g, o.p));
  CHECK_OK(gma_trace_stop(g));
  void *after;
  CHECK_OK(gma_alloc(g, 512, NULL, &after)); /* not recorded */
  CHECK_OK(gma_free(g, after));
  CHECK_OK(gma_destroy(g));

  char *t1 = slurp(path), *t2 = slurp(path2);
  const char *hdr = "Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status\n";
  CHECK(strncmp(t1, hdr, strlen(hdr)) == 0 && strncmp(t2, hdr, strlen(hdr)) == 0);
  char row[160];
  snprintf(row, sizeof row, ",allocate,%p,1000,0x0,1024,0,0,\n", a);
  CHECK(strstr(t1, row) && strncmp(strstr(t1, row) - 14, "\n0,", 3) == 0); /* thread 0 */
  CHECK(strstr(t1, ",allocate failure,0x0,0,0x0,0,0,0,GMA_ERR_INVALID_SIZE\n") != NULL);
  snprintf(row, sizeof row, ",allocate,%p,2048,0x0,2048,0,0,\n", o.p);
  CHECK(strstr(t1, row) && strncmp(strstr(t1, row) - 14, "\n1,", 3) == 0); /* thread 1 */
  snprintf(row, sizeof row, ",free,%p,1000,0x0,1024,0,0,\n", a);
  CHECK(strstr(t1, row) != NULL);
  snprintf(row, sizeof row, ",free,%p,0,0x0,0,0,0,GMA_ERR_DOUBLE_FREE\n", a);
  CHECK(strstr(t1, row) != NULL);
  CHECK(count(t1, ",segment_alloc,") == 1);
  CHECK(count(t1, "\n") == 7); /* header + segment, 3 allocates (one failed), 2 frees */
  snprintf(row, sizeof row, ",free,%p,2048,0x0,2048,0,0,\n", o.p);
  CHECK(strstr(t2, row) != NULL);
  /* The second trace starts on an allocator in use: first its state (the
   * segment, o.p live), then what happened. */
  snprintf(row, sizeof row, ",allocate,%p,2048,0x0,2048,0,0,\n", o.p);
  CHECK(strstr(t2, row) != NULL && strstr(t2, row) < strstr(t2, ",free,"));
  CHECK(count(t2, ",segment_alloc,") == 1 && count(t2, "\n") == 4);
  free(t1);
  free(t2);
  unlink(path);
  unlink(path2);

  /* gma_record_stream of a pointer inside an allocation is traced with the
   * allocation's start, which is what a replay knows it by. */
  g = sim_allocator_ordinary("worker:off");
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_trace_start(g, path));
  CHECK_OK(gma_alloc(g, 4096, NULL, &a));
  CHECK_OK(gma_record_stream(g, (char *)a + 1000, s));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_trace_stop(g));
  t1 = slurp(path);
  snprintf(row, sizeof row, ",record_stream,%p,0,%p,", a, s);
  CHECK(strstr(t1, row) != NULL);
  free(t1);
  unlink(path);
  CHECK_OK(gma_stream_synchronize(g, s));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));

  /* The config key: trace:PATH starts recording at gma_create. */
  char conf[200];
  snprintf(conf, sizeof conf, "worker:off,trace:%s", path);
  g = sim_allocator_ordinary(conf);
  CHECK_OK(gma_alloc(g, 100, NULL, &a));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_destroy(g)); /* closes the trace */
  t1 = slurp(path);
  CHECK(count(t1, ",allocate,") == 1 && count(t1, ",free,") == 1 &&
        count(t1, ",segment_free,") == 1);
  free(t1);
  unlink(path);
  gma_config_t c = GMA_CONFIG_INIT;
  CHECK_ST(gma_config_parse(&c, "trace:"), GMA_ERR_CONFIG);
  c.ignore_env = 1;
  c.device = GMA_DEVICE_SIM;
  CHECK_OK(gma_config_parse(&c, "trace:/nonexistent-dir/t.csv"));
  CHECK_ST(gma_create(&c, &g), GMA_ERR_CONFIG);
}

/* Tags are one line of printable text, ASCII or UTF-8; a quote or
 * backslash in one stays valid JSON in a snapshot. */
static void tag_text(void) {
  gma_t *g = sim_allocator_ordinary("worker:off");
  void *p = NULL, *q = NULL;
  CHECK_ST(gma_alloc_tagged(g, 1000, NULL, "two\nlines", &p), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "control character") != NULL && p == NULL);
  CHECK_ST(gma_alloc_tagged(g, 1000, NULL, "tab\there", &p), GMA_ERR_INVALID_ARGUMENT);
  /* JSON is UTF-8: a Latin-1 byte, a stray continuation byte, a truncated
   * sequence, an overlong one and a surrogate are refused; UTF-8 is kept. */
  const char *bad[] = {"caf\xe9", "x\x80y", "end\xc3", "\xc0\xafslash", "\xed\xa0\x80"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    CHECK_ST(gma_alloc_tagged(g, 1000, NULL, bad[i], &p), GMA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(gma_last_error(), "not UTF-8") != NULL && p == NULL);
  }
  CHECK_OK(gma_alloc_tagged(g, 1000, NULL, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", &q));
  CHECK_OK(gma_free(g, q));
  q = NULL;
  CHECK_OK(gma_alloc_tagged(g, 1000, NULL, "say \"hi\" \\o/", &p));
  char path[128];
  tmp_path(path, ".json");
  CHECK_OK(gma_snapshot_json(g, path));
  char *j = slurp(path);
  CHECK(strstr(j, "\"tag\":\"say \\\"hi\\\" \\\\o/\"}") != NULL);
  free(j);
  unlink(path);
  gma_pointer_info_t in = GMA_POINTER_INFO_INIT;
  CHECK_OK(gma_pointer_info(g, p, &in));
  CHECK(strcmp(in.tag, "say \"hi\" \\o/") == 0);
  /* The bytes asked for are the allocation; the rounding after them is not. */
  CHECK_OK(gma_pointer_info(g, (char *)p + 999, &in));
  CHECK_ST(gma_pointer_info(g, (char *)p + 1000, &in), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "past the end") != NULL);
  /* A pointer gma never returned: unaligned, inside free memory. */
  CHECK_OK(gma_alloc(g, 4096, NULL, &q));
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_empty_cache(g)); /* q's block is FREE, merged with the rest */
  CHECK_ST(gma_free(g, (char *)p + 65536 + 8), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "never returned") != NULL);
  CHECK_ST(gma_free(g, (char *)p + 65536), GMA_ERR_DOUBLE_FREE);
  /* The end of a live allocation that fills its block, where free memory
   * starts: the message says whose end it is. */
  void *r;
  CHECK_OK(gma_alloc(g, 2 * 1024 * 1024, NULL, &r));
  CHECK_ST(gma_record_stream(g, (char *)r + 2 * 1024 * 1024, NULL), GMA_ERR_INVALID_POINTER);
  char end_of[64];
  snprintf(end_of, sizeof end_of, "the end of the live allocation at %p", r);
  CHECK(strstr(gma_last_error(), end_of) != NULL);
  CHECK_OK(gma_free(g, r));
  CHECK_OK(gma_free(g, p));
  CHECK_ST(gma_free(g, p), GMA_ERR_DOUBLE_FREE);
  CHECK(strstr(gma_last_error(), "already freed") != NULL);
  CHECK_OK(gma_destroy(g));
}

/* cached.peak is the highest reserved - allocated seen, not reserved's peak;
 * a call that succeeds after failing inside leaves gma_last_error alone. */
static void cached_peak_and_last_error(void) {
  gma_t *g = sim_allocator_ordinary("worker:off,memory_limit:64M,oom_wait_ms:1");
  void *a = NULL, *b = NULL;
  CHECK_OK(gma_alloc(g, 30 * MiB, NULL, &a));
  gma_stats_t st = stats_of(g);
  CHECK(st.cached.current == 0 && st.cached.peak == 0 && st.reserved.peak == 30 * MiB);
  CHECK_OK(gma_free(g, a));
  st = stats_of(g);
  CHECK(st.cached.current == 30 * MiB && st.cached.peak == 30 * MiB);
  /* Nothing failed yet: the message is one we set ourselves. */
  CHECK_ST(gma_alloc(g, 0, NULL, &a), GMA_ERR_INVALID_SIZE);
  char before[1024];
  snprintf(before, sizeof before, "%s", gma_last_error());
  /* 40 MiB does not fit beside the cached 30 MiB segment under the 64 MiB
   * limit: the device refuses the first segment, the retry gives the cached
   * one back and succeeds. */
  CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &b));
  st = stats_of(g);
  CHECK(st.num_oom_retries >= 1 && st.num_ooms == 0);
  CHECK(strcmp(gma_last_error(), before) == 0);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  snapshot();
  summary();
  trace();
  tag_text();
  cached_peak_and_last_error();
  printf("test_observe: ok\n");
  return 0;
}
