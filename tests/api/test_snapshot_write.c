/* gma_snapshot_write: GMA_SNAPSHOT_JSON is gma_snapshot_json's file;
 * GMA_SNAPSHOT_TORCH is a protocol-2 pickle with PyTorch's keys, the live
 * block's state and, with a trace running, one entry per event (and none
 * without); error paths (NULL allocator or path, unknown format, a file that
 * cannot be created) return GMA_ERR_INVALID_ARGUMENT with a message naming
 * the file, and leave no file behind (the sanitizer builds check that
 * nothing leaks). tests/replay/test_torch_snapshot.py reads the pickle in
 * Python. Public API only. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "simkit.h"

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  CHECK(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  rewind(f);
  unsigned char *s = malloc((size_t)len + 1);
  CHECK(s && fread(s, 1, (size_t)len, f) == (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return s;
}

/* Occurrences of the pickled string s (BINUNICODE: 'X', 4-byte length, bytes). */
static int count_str(const unsigned char *buf, size_t n, const char *s) {
  size_t len = strlen(s);
  unsigned char pat[64];
  CHECK(len + 5 <= sizeof pat);
  pat[0] = 'X';
  pat[1] = (unsigned char)len;
  pat[2] = pat[3] = pat[4] = 0;
  memcpy(pat + 5, s, len);
  int c = 0;
  for (const unsigned char *p = buf; (p = memmem(p, n - (size_t)(p - buf), pat, len + 5));
       p += len + 5)
    c++;
  return c;
}

static void tmp_path(char *buf, const char *suffix) {
  snprintf(buf, 128, "/tmp/gma-snapwrite-%d-XXXXXX%s", (int)getpid(), suffix);
  int fd = mkstemps(buf, (int)strlen(suffix));
  CHECK(fd >= 0);
  close(fd);
}

int main(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  char trace[128], snap[128], json[128];
  tmp_path(trace, ".csv");
  tmp_path(snap, ".pickle");
  tmp_path(json, ".json");

  /* Without a trace: segments only, an empty event list. */
  void *a = NULL, *b = NULL;
  CHECK_OK(gma_alloc(g, 3 << 20, NULL, &a));
  CHECK_OK(gma_snapshot_write(g, snap, GMA_SNAPSHOT_TORCH));
  size_t n;
  unsigned char *s = slurp(snap, &n);
  CHECK(n > 3 && s[0] == 0x80 && s[1] == 2 && s[n - 1] == '.');
  CHECK(count_str(s, n, "segments") == 1 && count_str(s, n, "device_traces") == 1);
  CHECK(count_str(s, n, "active_allocated") == 1);
  CHECK(count_str(s, n, "total_size") >= 1 && count_str(s, n, "segment_type") >= 1);
  CHECK(count_str(s, n, "alloc") == 0 && count_str(s, n, "action") == 0);
  free(s);

  /* With a trace: its start rows (the segment, the live block) and every event since. */
  CHECK_OK(gma_trace_start(g, trace));
  CHECK_OK(gma_alloc(g, 1000, NULL, &b));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_snapshot_write(g, snap, GMA_SNAPSHOT_TORCH));
  s = slurp(snap, &n);
  CHECK(count_str(s, n, "alloc") == 2);          /* a (start row) and b */
  CHECK(count_str(s, n, "free_requested") == 1 && count_str(s, n, "free_completed") == 1);
  CHECK(count_str(s, n, "segment_alloc") >= 1);
  CHECK(count_str(s, n, "time_us") == count_str(s, n, "action"));
  CHECK(count_str(s, n, "active_allocated") == 1); /* b */
  free(s);
  /* The trace goes on after the snapshot, and a second snapshot sees the new events. */
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_snapshot_write(g, snap, GMA_SNAPSHOT_TORCH));
  s = slurp(snap, &n);
  CHECK(count_str(s, n, "free_requested") == 2 && count_str(s, n, "active_allocated") == 0);
  free(s);
  CHECK_OK(gma_trace_stop(g));
  CHECK_OK(gma_snapshot_write(g, snap, GMA_SNAPSHOT_TORCH));
  s = slurp(snap, &n);
  CHECK(count_str(s, n, "action") == 0); /* stopped: no events */
  free(s);

  /* JSON: gma_snapshot_json's file. */
  CHECK_OK(gma_snapshot_write(g, json, GMA_SNAPSHOT_JSON));
  s = slurp(json, &n);
  CHECK(n > 0 && s[0] == '{' && memmem(s, n, "\"segments\"", 10));
  free(s);

  /* Errors: nothing written, a message that names the file. */
  const char *bad = "/nonexistent-gma-dir/x.pickle";
  CHECK_ST(gma_snapshot_write(g, bad, GMA_SNAPSHOT_TORCH), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), bad) && strstr(gma_last_error(), "gma_snapshot_write"));
  CHECK(access(bad, F_OK) != 0);
  CHECK_ST(gma_snapshot_write(g, bad, GMA_SNAPSHOT_JSON), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_snapshot_write(g, NULL, GMA_SNAPSHOT_TORCH), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_snapshot_write(g, "", GMA_SNAPSHOT_TORCH), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_snapshot_write(g, snap, (gma_snapshot_format_t)7), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "unknown format 7"));
  CHECK_ST(gma_snapshot_write(NULL, snap, GMA_SNAPSHOT_TORCH), GMA_ERR_INVALID_ARGUMENT);
  /* A trace file removed under a running trace: the snapshot fails, says why, leaves nothing. */
  CHECK_OK(gma_trace_start(g, trace));
  CHECK(unlink(trace) == 0);
  remove(snap);
  CHECK_ST(gma_snapshot_write(g, snap, GMA_SNAPSHOT_TORCH), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "reading the running trace"));
  CHECK(access(snap, F_OK) != 0);
  CHECK_OK(gma_trace_stop(g));

  gma_destroy(g);
  remove(trace);
  remove(snap);
  remove(json);
  printf("ok\n");
  return 0;
}
