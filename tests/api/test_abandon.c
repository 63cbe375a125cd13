/* gma_abandon, the exit handlers' way out (the PyTorch plug-in's atexit):
 * it returns at once while device work still runs (gma_destroy would wait
 * for it), reports no leak for allocations still live, finishes a trace
 * file, and every later call fails with a message saying so; the memory of
 * a kernel still running stays valid (its pattern check passes). Each case
 * runs in a child process that ends with _exit, as a process does after its
 * exit handlers, so the deliberately abandoned memory is not reported by
 * LeakSanitizer. Public API only. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)

/* Runs body in a child; the child's exit status must be 0. */
static void in_child(void (*body)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    body();
    fflush(NULL);
    _exit(0);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Named in the parent (the child's pid differs). */
static char trace_file[64];
static const char *trace_path(void) { return trace_file; }

static atomic_int gate;
static atomic_int corruptions;
static atomic_int done;
static pattern_kernel_t k;

static void run_then_done(void *arg) {
  pattern_kernel_run(arg);
  atomic_store(&done, 1);
}

static void abandon_while_busy(void) {
  char conf[160];
  snprintf(conf, sizeof conf, "trim_interval_ms:5,trace:%s", trace_path());
  gma_t *g = sim_allocator(conf);
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  void *busy = NULL, *live = NULL;
  CHECK_OK(gma_alloc(g, 4 * MiB, s, &busy));
  CHECK_OK(gma_alloc(g, 1 * MiB, NULL, &live)); /* alive at exit: no leak report */
  k = (pattern_kernel_t){.buf = busy, .len = 4 * MiB, .value = 5, .gate = &gate,
                         .corruptions = &corruptions};
  CHECK_OK(gma_sim_launch(g, s, run_then_done, &k));
  pattern_kernel_wait_started(&k);
  CHECK_OK(gma_free(g, busy)); /* stream-ordered: the kernel still owns it */
  uint64_t t0 = now_ns();
  CHECK_OK(gma_abandon(g));
  CHECK(now_ns() - t0 < 1000000000ull); /* the kernel holds 5 s: nothing waited */
  void *p = NULL;
  CHECK_ST(gma_alloc(g, 4096, NULL, &p), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "abandoned") != NULL);
  CHECK_ST(gma_free(g, live), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_abandon(g), GMA_ERR_INVALID_ARGUMENT);
  /* The kernel's memory is still there: its check passes when it ends. */
  atomic_store(&gate, 1);
  for (int i = 0; i < 5000 && !atomic_load(&done); i++) sleep_us(1000);
  CHECK(atomic_load(&done) && atomic_load(&corruptions) == 0);
}

int main(void) {
  snprintf(trace_file, sizeof trace_file, "/tmp/gma_abandon_%d.csv", (int)getpid());
  in_child(abandon_while_busy);
  /* The trace file is complete: the header, then rows, the last one whole. */
  FILE *f = fopen(trace_path(), "r");
  CHECK(f != NULL);
  char line[512];
  CHECK(fgets(line, sizeof line, f) != NULL && strncmp(line, "Thread,Time,Action", 18) == 0);
  int rows = 0, whole = 1;
  while (fgets(line, sizeof line, f)) {
    rows++;
    whole = strchr(line, '\n') != NULL;
  }
  fclose(f);
  CHECK(rows >= 2 && whole);
  unlink(trace_path());
  CHECK_OK(gma_abandon(NULL));
  printf("test_abandon: ok\n");
  return 0;
}
