/* fuzz_replay: runs fuzzer inputs through LLVMFuzzerTestOneInput without
 * libFuzzer, so every build (any compiler, any sanitizer) can replay the seed
 * corpus and the regression inputs.
 *
 * Usage: fuzz_replay FILE|DIR...   (a directory: every regular file in it,
 * in name order; files whose name starts with '.' or ends in ".md" are
 * skipped). Prints one line per input when FUZZ_GMA_VERBOSE is set, and a
 * summary; a failing check aborts inside the input that broke it. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long runs;
static double slowest;
static char slowest_name[512];

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
  double t0 = now_s();
  LLVMFuzzerTestOneInput(buf, n);
  double dt = now_s() - t0;
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
