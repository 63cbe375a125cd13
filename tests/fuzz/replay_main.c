/* fuzz_replay: runs fuzzer inputs through LLVMFuzzerTestOneInput without
 * libFuzzer, so every build (any compiler, any sanitizer) can replay the seed
 * corpus and the regression inputs.
 *
 * Usage: fuzz_replay FILE|DIR...   (a directory: every regular file in it,
 * in name order; files whose name starts with '.' or ends in ".md" are
 * skipped). Prints one line per input when FUZZ_GMA_VERBOSE is set, and a
 * summary; a failing check aborts inside the input that broke it.
 *
 * Quiet unless something fails: what an input writes to stderr (gma's leak
 * reports for the inputs that leak on purpose, its error messages) goes to a
 * scratch file that the next input overwrites. When an input fails (an
 * abort, a crash, or a sanitizer report that ends the process), the input's
 * name and its whole output go to the real stderr, so a CI log that shows
 * only the start of the output still shows the failure. Sanitizer reports
 * themselves always go to the real stderr, as they happen.
 * FUZZ_GMA_VERBOSE=1 writes everything to stderr as it happens instead. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* The sanitizers' hooks (absent in builds without a sanitizer): one called
 * before a report ends the process, one that sends their reports to a file
 * descriptor (the real stderr: a report that does not end the process, as
 * under TSan without halt_on_error, must not land in the scratch file). */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));
extern void __sanitizer_set_report_fd(void *fd) __attribute__((weak));

static unsigned long runs;
static double slowest;
static char slowest_name[512];

/* The quiet mode's state: the real stderr, the scratch file, the input now
 * running. Read by the failure path, which may run in a signal handler. */
static int real_err = -1, scratch = -1;
static char current[512];
static volatile sig_atomic_t dumped;

/* write(2) until all n bytes went or it fails (async-signal-safe). */
static void put_n(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t w = write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

static void put(int fd, const char *s) { put_n(fd, s, strlen(s)); }

/* Async-signal-safe: the failing input's name and output, to the real stderr. */
static void dump_failure(void) {
  if (real_err < 0 || !current[0] || dumped) return;
  dumped = 1;
  put(real_err, "fuzz_replay: FAILED on ");
  put(real_err, current);
  put(real_err, "; what it wrote to stderr:\n");
  char buf[4096];
  ssize_t n;
  for (off_t off = 0; (n = pread(scratch, buf, sizeof buf, off)) > 0; off += n)
    put_n(real_err, buf, (size_t)n);
  put(real_err, "fuzz_replay: (end of the output of ");
  put(real_err, current);
  put(real_err, ")\n");
}

static void on_fatal_signal(int sig) {
  dump_failure();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Sets up the quiet mode (its scratch file and the failure hooks); without
 * a scratch file everything goes to stderr as in verbose mode. */
static void quiet_setup(void) {
  char name[] = "/tmp/fuzz_replay_XXXXXX";
  scratch = mkstemp(name);
  if (scratch < 0) return;
  unlink(name);
  real_err = dup(2);
  if (real_err < 0) {
    close(scratch);
    scratch = -1;
    return;
  }
  /* A sanitizer reports crashes itself and then calls dump_failure; its
   * SEGV handler stays. An abort() (a failed check) comes here in any build. */
  signal(SIGABRT, on_fatal_signal);
  if (__sanitizer_set_report_fd) __sanitizer_set_report_fd((void *)(intptr_t)real_err);
  if (__sanitizer_set_death_callback) {
    __sanitizer_set_death_callback(dump_failure);
  } else {
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], on_fatal_signal);
  }
}

/* Before an input: stderr to the emptied scratch file. False: not quiet. */
static int quiet_begin(const char *path) {
  if (scratch < 0) return 0;
  fflush(stderr);
  if (ftruncate(scratch, 0) != 0 || lseek(scratch, 0, SEEK_SET) != 0 || dup2(scratch, 2) < 0)
    return 0;
  snprintf(current, sizeof current, "%s", path);
  return 1;
}

/* After it passed: stderr back (what the input wrote is dropped). */
static void quiet_end(void) {
  fflush(stderr);
  dup2(real_err, 2);
  current[0] = 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return 1;
  }
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) {
      uint8_t *nb = realloc(buf, cap *= 2);
      if (!nb) free(buf);
      buf = nb;
    }
  }
  fclose(f);
  if (!buf) {
    fprintf(stderr, "%s: out of memory\n", path);
    return 1;
  }
  if (getenv("FUZZ_GMA_VERBOSE")) fprintf(stderr, "fuzz_replay: %s (%zu bytes)\n", path, n);
  int quiet = quiet_begin(path);
  double t0 = now_s();
  LLVMFuzzerTestOneInput(buf, n);
  double dt = now_s() - t0;
  if (quiet) quiet_end();
  if (dt > slowest) {
    slowest = dt;
    snprintf(slowest_name, sizeof slowest_name, "%s", path);
  }
  free(buf);
  runs++;
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    perror(path);
    return 1;
  }
  if (!S_ISDIR(st.st_mode)) return run_file(path);
  DIR *d = opendir(path);
  if (!d) {
    perror(path);
    return 1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (e->d_name[0] == '.' || (len > 3 && strcmp(e->d_name + len - 3, ".md") == 0)) continue;
    if (n == cap) {
      char **nn = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
      if (!nn) break;
      names = nn;
    }
    size_t plen = strlen(path) + len + 2;
    names[n] = malloc(plen);
    if (names[n]) snprintf(names[n++], plen, "%s/%s", path, e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    struct stat fs;
    if (stat(names[i], &fs) == 0 && S_ISREG(fs.st_mode)) rc |= run_file(names[i]);
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fuzz_replay FILE|DIR...\n");
    return 2;
  }
  if (!getenv("FUZZ_GMA_VERBOSE")) quiet_setup();
  double t0 = now_s();
  int rc = 0;
  for (int i = 1; i < argc; i++) rc |= run_path(argv[i]);
  printf("fuzz_replay: %lu inputs in %.2f s (slowest %.3f s: %s)%s\n", runs, now_s() - t0, slowest,
         slowest_name, rc ? "; some paths could not be read" : "");
  if (runs == 0) {
    fprintf(stderr, "fuzz_replay: no inputs found\n");
    return 1;
  }
  return rc;
}
