/* gma-crossings' driver: one slow-path gma_alloc on the simulated device,
 * recorded by -finstrument-functions hooks on the calling thread only. Every
 * function entry and exit between the marks is written to the file named by
 * argv[1] as "E offset" / "X offset" (offset: from the executable's start),
 * which tools/crossings.py maps to source files with addr2line. */
#include <stdio.h>
#include <stdlib.h>

#include "gma.h"

#define MAX_EVENTS (1u << 20)

static __thread int recording;
static struct { char kind; void *fn; } events[MAX_EVENTS];
static unsigned nevents;
extern char __executable_start;

__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void *fn, void *site) {
  (void)site;
  if (recording && nevents < MAX_EVENTS) events[nevents++] = (typeof(events[0])){'E', fn};
}

__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void *fn, void *site) {
  (void)site;
  if (recording && nevents < MAX_EVENTS) events[nevents++] = (typeof(events[0])){'X', fn};
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s OUT CONF\n", argv[0]);
    return 2;
  }
  gma_config_t cfg = GMA_CONFIG_INIT;
  gma_t *g = NULL;
  if (gma_config_parse(&cfg, argv[2]) != GMA_OK || gma_create(&cfg, &g) != GMA_OK) {
    fprintf(stderr, "gma: %s\n", gma_last_error());
    return 1;
  }
  /* Warm up: the stream's record, the thread's caches and one segment exist. */
  void *warm = NULL;
  if (gma_alloc(g, 4096, NULL, &warm) != GMA_OK) return 1;
  gma_free(g, warm);
  /* The measured call: a size no bin holds and no segment has room for, so
   * it takes the slow path and grows the pool. */
  void *p = NULL;
  recording = 1;
  gma_status_t st = gma_alloc(g, 64u << 20, NULL, &p);
  recording = 0;
  if (st != GMA_OK) {
    fprintf(stderr, "gma_alloc: %s\n", gma_last_error());
    return 1;
  }
  gma_free(g, p);
  gma_destroy(g);
  FILE *f = fopen(argv[1], "w");
  if (!f) return 1;
  for (unsigned i = 0; i < nevents; i++)
    fprintf(f, "%c %lx\n", events[i].kind,
            (unsigned long)((char *)events[i].fn - &__executable_start));
  fclose(f);
  return nevents < MAX_EVENTS ? 0 : 3;
}
