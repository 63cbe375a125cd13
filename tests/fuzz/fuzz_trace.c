/* fuzz_trace: gma-replay's trace reader and replay engine
 * (tools/replay/replay.c) under fuzzing. An input is the bytes of a trace
 * file (README: "Traces: the CSV format"). It is parsed with replay_parse; a
 * trace that loads is replayed with replay_run on a small simulated device
 * (fast mode: no timing or sampling; idle rows sleep at most 1 us; futures
 * time out after 10 ms), once and, when it is short, as two repetitions.
 *
 * Checks (a failed one calls abort(), which libFuzzer and fuzz_replay
 * record): replay_parse returns 0 with a trace, or -1 with no trace and a
 * message; replay_run succeeds (only gma_create can make it fail, and the
 * configuration is fixed); the result counts every row. What the sanitizer
 * builds add: no crash, no out-of-bounds access, no undefined behaviour, no
 * leak (the ASan build checks leaks at exit). A hang shows as a timeout.
 *
 * The seeds are tests/fuzz/trace_corpus: well-formed traces of every action
 * (gma's 10 columns and RMM's 6), and hostile ones that crashed, leaked,
 * hung or were misread before replay_parse refused them (hostile_*). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "replay.h"

static void check(int ok, const char *what, const char *err) {
  if (ok) return;
  fprintf(stderr, "fuzz_trace: check failed: %s (%s)\n", what, err ? err : "");
  abort();
}

static void replay(const replay_trace_t *t, uint64_t repeat) {
  replay_options_t o = {.device = "sim", .capacity = 64ull << 20, .fast = 1,
                        .max_idle_s = 1e-6, .repeat = repeat};
  replay_result_t *r = malloc(sizeof *r);
  char err[512] = "";
  check(r != NULL, "out of host memory", NULL);
  int rc = replay_run(t, "future_timeout_ms:10,trim_interval_ms:3600000", &o, r, err, sizeof err);
  check(rc == 0, "replay_run failed", err);
  check(r->events == t->n * (repeat ? repeat : 1), "replay_run skipped rows", NULL);
  free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* fmemopen of 0 bytes fails on older C libraries: an empty file then. */
  FILE *f = size ? fmemopen((void *)data, size, "r") : fopen("/dev/null", "r");
  if (!f) return 0;
  replay_trace_t *t = NULL;
  char err[512] = "";
  int rc = replay_parse(f, "input.csv", &t, err, sizeof err);
  fclose(f);
  if (rc != 0) {
    check(rc == -1 && t == NULL && err[0], "a refused trace without a message", err);
    return 0;
  }
  check(t != NULL, "replay_parse returned 0 without a trace", NULL);
  if (t->n <= 20000) replay(t, 0);
  if (t->n <= 2000) replay(t, 2);
  replay_trace_free(t);
  return 0;
}
