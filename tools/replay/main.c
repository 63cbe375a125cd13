/* gma-replay: replays traces (gma's CSV, or RMM's) and built-in synthetic
 * workloads on gma allocators, one or more configurations side by side, and
 * prints what gma did: peaks, the reserved/allocated ratio next to the
 * recording allocator's (PyTorch's for imported snapshots), fragmentation,
 * device allocations, hits by level, latency percentiles, replay rate. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "replay.h"
#include "synth.h"

#define MAX_CONFIGS 8
#define MAX_INPUTS 64

typedef struct config {
  char name[64];
  const char *conf;
} config_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: gma-replay [options] [TRACE.csv ...]\n"
          "  --config NAME=CONF   a gma configuration to replay under (GMA_CONF syntax); repeat\n"
          "                       to compare side by side (default: default= and\n"
          "                       expandable=expandable_segments:true)\n"
          "  --workload NAME[:SCALE]  add a built-in synthetic workload (dp, pipeline, server)\n"
          "  --device sim|cuda    the device to replay on (default sim: the simulated device)\n"
          "  --json PATH          write every result as JSON\n"
          "  --timeline-dir DIR   write TRACE.CONFIG.timeline.csv (memory over time) per run\n"
          "  --snapshot-dir DIR   write TRACE.CONFIG.peak.json (gma_snapshot_json at the peak),\n"
          "                       from a second, untimed replay\n"
          "  --seed N             seed of the synthetic workloads (default 1)\n"
          "  --quiet              no progress bar and no per-trace tables\n"
          "Prints a table per trace and a summary table. Memory that a trace leaves live is\n"
          "freed at its end.\n");
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

/* Short human figure for tables: MiB below 10 GiB, GiB above. */
static const char *human(char *s, size_t n, uint64_t b) {
  if (b >= 10ull << 30) snprintf(s, n, "%.2f GiB", gib(b));
  else snprintf(s, n, "%.1f MiB", (double)b / (1 << 20));
  return s;
}

static void base_name(const char *path, char *out, size_t n) {
  const char *b = strrchr(path, '/');
  snprintf(out, n, "%.*s", (int)(n - 1), b ? b + 1 : path);
  char *dot = strrchr(out, '.');
  if (dot && strcmp(dot, ".csv") == 0) *dot = '\0';
}

typedef struct outcome {
  char trace[128];
  char config[64];
  replay_result_t r;
  int has_recorded;
} outcome_t;

static void print_trace_table(const replay_trace_t *t, const config_t *cfg, int ncfg,
                              const replay_result_t *res) {
  char a[32];
  printf("\n%s: %zu events (%zu allocations, %zu frees)\n", t->name, t->n,
         t->count[RA_ALLOCATE], t->count[RA_FREE]);
  printf("  %-26s", "");
  for (int c = 0; c < ncfg; c++) printf(" %16s", cfg[c].name);
  if (t->has_recorded) printf(" %16s", "recorded");
  printf("\n");
#define ROW(label, expr, rec)                                        \
  do {                                                               \
    printf("  %-26s", label);                                        \
    for (int c = 0; c < ncfg; c++) {                                 \
      const replay_result_t *r = &res[c];                            \
      printf(" %16s", expr);                                         \
    }                                                                \
    if (t->has_recorded) printf(" %16s", rec);                       \
    printf("\n");                                                    \
  } while (0)
  char b[32];
  ROW("peak requested", human(a, sizeof a, r->peak_requested), "");
  ROW("peak allocated (blocks)", human(a, sizeof a, r->peak_allocated), "");
  ROW("peak reserved", human(a, sizeof a, r->peak_reserved),
      human(b, sizeof b, t->recorded_peak));
  ROW("reserved / allocated",
      (snprintf(a, sizeof a, "%.3fx",
                r->peak_allocated ? (double)r->peak_reserved / (double)r->peak_allocated : 0),
       a),
      (snprintf(b, sizeof b, "%.3fx",
                res[0].peak_requested ? (double)t->recorded_peak / (double)res[0].peak_requested
                                      : 0),
       b));
  if (t->has_recorded)
    ROW("reserved / recorded",
        (snprintf(a, sizeof a, "%.3fx",
                  t->recorded_peak ? (double)r->peak_reserved / (double)t->recorded_peak : 0),
         a),
        "1.000x");
  ROW("fragmentation at peak", (snprintf(a, sizeof a, "%.1f%%", 100 * r->fragmentation_at_peak), a),
      "");
  ROW("device allocs / frees",
      (snprintf(a, sizeof a, "%" PRIu64 " / %" PRIu64, r->device_allocs, r->device_frees), a), "");
  ROW("hits bin/stream/pool/dev",
      (snprintf(a, sizeof a, "%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64, r->hits_bin,
                r->hits_stream, r->hits_pool, r->hits_device),
       a),
      "");
  ROW("alloc ns p50/p99/p99.9",
      (snprintf(a, sizeof a, "%" PRIu64 "/%" PRIu64 "/%" PRIu64, r->alloc.p50, r->alloc.p99,
                r->alloc.p999),
       a),
      "");
  ROW("free ns p50/p99/p99.9",
      (snprintf(a, sizeof a, "%" PRIu64 "/%" PRIu64 "/%" PRIu64, r->free.p50, r->free.p99,
                r->free.p999),
       a),
      "");
  ROW("failed allocs / unmatched",
      (snprintf(a, sizeof a, "%" PRIu64 " / %" PRIu64, r->failed_allocs, r->unmatched), a), "");
  ROW("replay rate (events/s)", (snprintf(a, sizeof a, "%.2fM", r->events_per_s / 1e6), a), "");
#undef ROW
}

int main(int argc, char **argv) {
  config_t cfg[MAX_CONFIGS];
  int ncfg = 0;
  const char *inputs[MAX_INPUTS];
  int nin = 0;
  const char *json = NULL, *tl_dir = NULL, *snap_dir = NULL, *device = "sim";
  uint64_t seed = 1;
  int quiet = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool more = i + 1 < argc;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--config") == 0 && more) {
      const char *v = argv[++i], *eq = strchr(v, '=');
      if (!eq || eq == v || eq - v >= 64 || ncfg == MAX_CONFIGS) {
        fprintf(stderr, "gma-replay: --config wants NAME=CONF (at most %d): '%s'\n", MAX_CONFIGS,
                v);
        return 2;
      }
      snprintf(cfg[ncfg].name, sizeof cfg[ncfg].name, "%.*s", (int)(eq - v), v);
      cfg[ncfg++].conf = eq + 1;
    } else if (strcmp(a, "--workload") == 0 && more) {
      static char wl[MAX_INPUTS][80]; /* inputs named "workload:NAME[:SCALE]" */
      if (nin == MAX_INPUTS) return fprintf(stderr, "gma-replay: too many inputs\n"), 2;
      snprintf(wl[nin], sizeof wl[0], "workload:%s", argv[++i]);
      inputs[nin] = wl[nin];
      nin++;
    } else if (strcmp(a, "--device") == 0 && more) {
      device = argv[++i];
      if (strcmp(device, "sim") && strcmp(device, "cuda")) {
        fprintf(stderr, "gma-replay: --device is sim or cuda, not '%s'\n", device);
        return 2;
      }
    } else if (strcmp(a, "--json") == 0 && more) {
      json = argv[++i];
    } else if (strcmp(a, "--timeline-dir") == 0 && more) {
      tl_dir = argv[++i];
    } else if (strcmp(a, "--snapshot-dir") == 0 && more) {
      snap_dir = argv[++i];
    } else if (strcmp(a, "--seed") == 0 && more) {
      seed = strtoull(argv[++i], NULL, 0);
    } else if (strcmp(a, "--quiet") == 0) {
      quiet = 1;
    } else if (a[0] == '-') {
      fprintf(stderr, "gma-replay: unknown option '%s'\n", a);
      usage(stderr);
      return 2;
    } else {
      if (nin == MAX_INPUTS) return fprintf(stderr, "gma-replay: too many inputs\n"), 2;
      inputs[nin++] = a;
    }
  }
  if (nin == 0) {
    usage(stderr);
    return 2;
  }
  if (ncfg == 0) {
    snprintf(cfg[0].name, sizeof cfg[0].name, "default");
    cfg[0].conf = "";
    snprintf(cfg[1].name, sizeof cfg[1].name, "expandable");
    cfg[1].conf = "expandable_segments:true";
    ncfg = 2;
  }
  if (tl_dir) mkdir(tl_dir, 0777);
  if (snap_dir) mkdir(snap_dir, 0777);
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (json && !jf) {
    fprintf(stderr, "gma-replay: cannot create %s: %s\n", json, strerror(errno));
    return 1;
  }
  if (jf) fprintf(jf, "{\"device\": \"%s\", \"results\": [", device);
  outcome_t *all = calloc((size_t)nin * (size_t)ncfg, sizeof *all);
  int nall = 0, failures = 0;
  bool tty = isatty(2) && !quiet;
  for (int in = 0; in < nin; in++) {
    char err[512];
    replay_trace_t *t = NULL;
    char name[128];
    if (strncmp(inputs[in], "workload:", 9) == 0) {
      char wname[64];
      double scale = 1.0;
      snprintf(wname, sizeof wname, "%s", inputs[in] + 9);
      char *colon = strchr(wname, ':');
      if (colon) {
        *colon = '\0';
        scale = atof(colon + 1);
      }
      char *text = NULL;
      size_t len = 0;
      FILE *mem = open_memstream(&text, &len);
      int rc = mem ? gma_synth_write(wname, mem, scale, seed, err, sizeof err) : -1;
      if (mem) fclose(mem);
      if (rc == 0) {
        FILE *rf = fmemopen(text, len, "r");
        snprintf(name, sizeof name, "synthetic-%s", wname);
        rc = rf ? replay_parse(rf, name, &t, err, sizeof err) : -1;
        if (rf) fclose(rf);
      }
      free(text);
      if (rc != 0) {
        fprintf(stderr, "gma-replay: workload %s: %s\n", wname, err);
        failures++;
        continue;
      }
    } else if (replay_load(inputs[in], &t, err, sizeof err) != 0) {
      fprintf(stderr, "gma-replay: %s\n", err);
      failures++;
      continue;
    }
    base_name(t->name, name, sizeof name);
    replay_result_t res[MAX_CONFIGS];
    for (int c = 0; c < ncfg; c++) {
      char path[1024], label[224];
      snprintf(label, sizeof label, "%.120s [%.60s]", name, cfg[c].name);
      replay_options_t o = {.device = device, .progress = tty, .label = label};
      FILE *tl = NULL;
      if (tl_dir) {
        snprintf(path, sizeof path, "%s/%s.%s.timeline.csv", tl_dir, name, cfg[c].name);
        if ((tl = fopen(path, "w"))) fputs("Event,Time,Allocated,Reserved,RecordedReserved\n", tl);
        o.timeline = tl;
      }
      int rc = replay_run(t, cfg[c].conf, &o, &res[c], err, sizeof err);
      if (tl) fclose(tl);
      if (rc == 0 && snap_dir) { /* untimed second pass for the picture */
        replay_result_t scratch;
        snprintf(path, sizeof path, "%s/%s.%s.peak.json", snap_dir, name, cfg[c].name);
        replay_options_t so = {.device = device, .snapshot_path = path};
        rc = replay_run(t, cfg[c].conf, &so, &scratch, err, sizeof err);
      }
      if (rc != 0) {
        fprintf(stderr, "gma-replay: %s under %s: %s\n", name, cfg[c].name, err);
        failures++;
        memset(&res[c], 0, sizeof res[c]);
        continue;
      }
      outcome_t *oc = &all[nall++];
      snprintf(oc->trace, sizeof oc->trace, "%s", name);
      snprintf(oc->config, sizeof oc->config, "%.63s", cfg[c].name);
      oc->r = res[c];
      oc->has_recorded = t->has_recorded;
      if (jf) {
        fprintf(jf, "%s\n  {\"trace\": \"%s\", \"config\": \"%s\", \"conf\": \"%s\", \"result\": ",
                nall > 1 ? "," : "", name, cfg[c].name, cfg[c].conf);
        replay_result_json(jf, &res[c]);
        fputc('}', jf);
      }
    }
    if (!quiet) print_trace_table(t, cfg, ncfg, res);
    replay_trace_free(t);
  }
  if (jf) {
    fputs("\n]}\n", jf);
    fclose(jf);
  }
  /* The summary: one row per trace and configuration. */
  printf("\nsummary (%s device): peak reserved against peak allocated and against the recording "
         "allocator\n",
         strcmp(device, "sim") == 0 ? "simulated" : "CUDA");
  printf("%-34s %-11s %11s %11s %11s %8s %11s %8s %8s\n", "trace", "config", "allocated",
         "reserved", "recorded", "res/all", "res/rec", "frag", "Mev/s");
  for (int i = 0; i < nall; i++) {
    const replay_result_t *r = &all[i].r;
    char a[32], b[32], c[32], rr[16] = "-";
    if (all[i].has_recorded && r->recorded_peak_reserved)
      snprintf(rr, sizeof rr, "%.3fx", (double)r->peak_reserved / (double)r->recorded_peak_reserved);
    printf("%-34.34s %-11.11s %11s %11s %11s %7.3fx %11s %7.1f%% %8.2f\n", all[i].trace,
           all[i].config, human(a, sizeof a, r->peak_allocated),
           human(b, sizeof b, r->peak_reserved),
           all[i].has_recorded ? human(c, sizeof c, r->recorded_peak_reserved) : "-",
           r->peak_allocated ? (double)r->peak_reserved / (double)r->peak_allocated : 0, rr,
           100 * r->fragmentation_at_peak, r->events_per_s / 1e6);
  }
  free(all);
  return failures ? 1 : 0;
}
