/* gma-replay: replays traces (gma's CSV, or RMM's) and built-in synthetic
 * workloads on gma allocators, one or more configurations side by side, and
 * prints what gma did: peaks, the reserved/allocated ratio next to the
 * recording allocator's (PyTorch's for imported snapshots), failed
 * allocations (and the recorder's own failed requests, attempted again),
 * fragmentation, device allocations, hits by level, latency percentiles,
 * replay rate; with --min-capacity, the smallest simulated device each
 * configuration runs the trace in without a failed allocation; with --repeat,
 * the trace replayed N times in one allocator as the iterations of a loop
 * (gma_iteration_mark between them), and the figures of each repetition. */
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
          "                       ordinary=expandable_segments:false)\n"
          "  --workload NAME[:SCALE]  add a built-in synthetic workload (dp, pipeline, server)\n"
          "  --device sim|cuda    the device to replay on (default sim: the simulated device)\n"
          "  --json PATH          write every result as JSON\n"
          "  --timeline-dir DIR   write TRACE.CONFIG.timeline.csv (memory over time) per run\n"
          "  --snapshot-dir DIR   write TRACE.CONFIG.peak.json (gma_snapshot_json at the peak),\n"
          "                       from a second, untimed replay\n"
          "  --torch-snapshot OUT.pickle  write the end state and the events of a replay of\n"
          "                       the one TRACE under the first configuration, as a PyTorch\n"
          "                       memory snapshot (gma_snapshot_write GMA_SNAPSHOT_TORCH; for\n"
          "                       pytorch.org/memory_viz), from a second, untimed replay\n"
          "  --seed N             seed of the synthetic workloads (default 1)\n"
          "  --repeat N           replay each trace N times in one allocator, as the iterations\n"
          "                       of a loop: at the end of each repetition, free what the trace\n"
          "                       left live and call gma_iteration_mark (plan:on learns from\n"
          "                       it; a no-op under plan:off); prints each repetition's peak\n"
          "                       reserved and device allocations, and the plan statistics\n"
          "  --min-capacity       also find, per trace and configuration, the smallest simulated\n"
          "                       device capacity (sim_capacity) the trace replays in with no\n"
          "                       failed allocation, by bisection; prints a table per trace\n"
          "                       (with --repeat, every replay runs all the repetitions)\n"
          "  --precision PCT      the bisection's width, in percent (default 0.2)\n"
          "  --budget SECONDS     time per trace and configuration after which the bisection\n"
          "                       stops and reports the width it reached (default: none)\n"
          "  --confirm N          replays of the answer that must also succeed (default 1;\n"
          "                       0: none)\n"
          "  --verbose            a line per bisection replay (default: one progress line on a\n"
          "                       terminal)\n"
          "  --recorded-label S   what to call the recording allocator in tables (default\n"
          "                       \"recorded\"; tools/main.sh says PyTorch)\n"
          "  --quiet              no progress bar and no per-trace tables (the --min-capacity\n"
          "                       tables still print)\n"
          "Prints a table per trace and a summary table. Failed allocations are counted in\n"
          "every table; the allocated figures leave them out (marked *). The trace's oom rows\n"
          "(requests the recording allocator failed) are attempted, and freed at once when\n"
          "served. Memory that a trace leaves live is freed at its end.\n"
          "Exit status: 0 every input replayed; 1 an input could not be loaded (a bad row is\n"
          "named: file, line, action, column and value) or replayed, or an output could not\n"
          "be written; 2 bad usage.\n");
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

typedef struct cap_outcome {
  char trace[128];
  char config[64];
  replay_capacity_t m; /* steps freed; the figures stay */
} cap_outcome_t;

typedef struct outcome {
  char trace[128];
  char config[64];
  replay_result_t r;
  int has_recorded;
} outcome_t;

static const char *recorded_label = "recorded";

static void ratio(char *s, size_t n, uint64_t a, uint64_t b) {
  if (a && b) snprintf(s, n, "%.3fx", (double)a / (double)b);
  else snprintf(s, n, "-");
}

static void print_trace_table(const replay_trace_t *t, const config_t *cfg, int ncfg,
                              const replay_result_t *res) {
  char a[48];
  printf("\n%s: %zu events (%zu allocations, %zu frees, %zu oom)", t->name, t->n,
         t->count[RA_ALLOCATE], t->count[RA_FREE], t->count[RA_OOM]);
  if (ncfg && res[0].repeat)
    printf(", replayed %" PRIu64 " times in one allocator", res[0].repeat);
  printf("\n");
  printf("  %-26s", "");
  for (int c = 0; c < ncfg; c++) printf(" %16s", cfg[c].name);
  if (t->has_recorded || t->count[RA_OOM]) printf(" %16s", recorded_label);
  printf("\n");
  int any_failed = 0;
  for (int c = 0; c < ncfg; c++) any_failed |= res[c].failed_allocs > 0;
#define ROW(label, expr, rec)                                        \
  do {                                                               \
    printf("  %-26s", label);                                        \
    for (int c = 0; c < ncfg; c++) {                                 \
      const replay_result_t *r = &res[c];                            \
      (void)r;                                                       \
      printf(" %16s", expr);                                         \
    }                                                                \
    if (t->has_recorded || t->count[RA_OOM]) printf(" %16s", rec);   \
    printf("\n");                                                    \
  } while (0)
  char b[32];
  /* A failed request never became live: the replay's allocated figures
   * leave it out, and say so with a star. */
#define STAR(r) ((r)->failed_allocs ? "*" : "")
  ROW("trace peak live", human(a, sizeof a, t->peak_live), human(b, sizeof b, t->peak_live));
  ROW("peak requested",
      (human(b, sizeof b, r->peak_requested), snprintf(a, sizeof a, "%s%s", b, STAR(r)), a), "");
  ROW("peak allocated (blocks)",
      (human(b, sizeof b, r->peak_allocated), snprintf(a, sizeof a, "%s%s", b, STAR(r)), a), "");
  ROW("peak reserved", human(a, sizeof a, r->peak_reserved),
      t->has_recorded ? human(b, sizeof b, t->recorded_peak) : "-");
  ROW("reserved / allocated",
      (snprintf(a, sizeof a, "%.3fx",
                r->peak_allocated ? (double)r->peak_reserved / (double)r->peak_allocated : 0),
       a),
      t->has_recorded ? (ratio(b, sizeof b, t->recorded_peak, t->peak_live), b) : "-");
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
  ROW("failed allocations", (snprintf(a, sizeof a, "%" PRIu64, r->failed_allocs), a), "");
  if (t->count[RA_OOM])
    ROW("oom rows: failed / served",
        (snprintf(a, sizeof a, "%" PRIu64 " / %" PRIu64, r->oom_attempts - r->oom_served,
                  r->oom_served),
         a),
        (snprintf(b, sizeof b, "%zu / 0", t->count[RA_OOM]), b));
  ROW("unmatched frees", (snprintf(a, sizeof a, "%" PRIu64, r->unmatched), a), "");
  ROW("replay rate (events/s)", (snprintf(a, sizeof a, "%.2fM", r->events_per_s / 1e6), a), "");
  if (ncfg && res[0].repeat) {
    /* --repeat: the figures above cover every repetition; these, each one. */
    ROW("repetitions completed", (snprintf(a, sizeof a, "%" PRIu64, r->reps_completed), a), "");
    ROW("peak reserved rep 1", human(a, sizeof a, r->peak_reserved_first_rep), "");
    ROW("peak reserved last rep", human(a, sizeof a, r->peak_reserved_last_rep), "");
    ROW("  max of reps 2..N",
        r->reps_completed > 1 ? human(a, sizeof a, r->peak_reserved_max_after_first_rep) : "-",
        "");
    ROW("device allocs rep 1", (snprintf(a, sizeof a, "%" PRIu64, r->device_allocs_first_rep), a),
        "");
    ROW("device allocs after rep 1",
        (snprintf(a, sizeof a, "%" PRIu64, r->device_allocs_after_first_rep), a), "");
    ROW("plan active after rep",
        r->plan_active_rep ? (snprintf(a, sizeof a, "%" PRIu64, r->plan_active_rep), a) : "never",
        "");
    ROW("device allocs after that",
        r->plan_active_rep
            ? (snprintf(a, sizeof a, "%" PRIu64, r->device_allocs_after_plan_active), a)
            : "-",
        "");
    ROW("plan hits / misses",
        (snprintf(a, sizeof a, "%" PRIu64 " / %" PRIu64, r->plan_hits, r->plan_misses), a), "");
    ROW("plan replans / slots",
        (snprintf(a, sizeof a, "%" PRIu64 " / %" PRIu64, r->plan_replans, r->plan_slots), a), "");
    ROW("plan arena", r->plan_arena_bytes ? human(a, sizeof a, r->plan_arena_bytes) : "-", "");
    ROW("plan lower bound", r->plan_lower_bound ? human(a, sizeof a, r->plan_lower_bound) : "-",
        "");
    ROW("marks failed",
        (snprintf(a, sizeof a, "%" PRIu64 " / %" PRIu64, r->mark_failures, r->marks), a), "");
    ROW("left live, freed at ends",
        (snprintf(a, sizeof a, "%" PRIu64, r->rep_end_frees + r->rep_end_futures), a), "");
  }
#undef ROW
  if (any_failed)
    printf("  * leaves out the failed allocations: a failed request never became live\n");
  if (t->count[RA_OOM])
    for (int c = 0; c < ncfg; c++)
      printf("  %s: %s failed %zu request%s (oom rows), gma failed %" PRIu64 " of them\n",
             cfg[c].name, recorded_label, t->count[RA_OOM], t->count[RA_OOM] == 1 ? "" : "s",
             res[c].oom_attempts - res[c].oom_served);
}

/* ---- --min-capacity -------------------------------------------------------------- */

typedef struct cap_progress {
  const char *label;
  int verbose, tty;
} cap_progress_t;

static void on_cap_step(void *arg, const replay_capacity_step_t *s, uint64_t lo, uint64_t hi) {
  const cap_progress_t *p = arg;
  char a[32], b[32], c[32], d[32];
  if (p->verbose && s->ok) {
    fprintf(stderr, "  %s: %s%s ok (reserved %s, %.2f s); bracket (%s, %s]\n", p->label,
            human(a, sizeof a, s->capacity), s->confirm ? " (confirm)" : "",
            human(b, sizeof b, s->peak_reserved), s->wall_s, human(c, sizeof c, lo),
            human(d, sizeof d, hi));
  } else if (p->verbose) {
    char where[48] = "";
    if (s->first_failed_rep)
      snprintf(where, sizeof where, " of repetition %" PRIu64, s->first_failed_rep);
    fprintf(stderr, "  %s: %s%s FAILED at event %" PRIu64 "%s (%.2f s); bracket (%s, %s]\n    %s\n",
            p->label, human(a, sizeof a, s->capacity), s->confirm ? " (confirm)" : "",
            s->first_failed_event, where, s->wall_s, human(c, sizeof c, lo),
            human(d, sizeof d, hi), s->first_error);
  } else if (p->tty) {
    fprintf(stderr, "\r\033[K  min capacity %s: %s %s; bracket (%s, %s]", p->label,
            human(a, sizeof a, s->capacity), s->ok ? "ok" : "failed", human(c, sizeof c, lo),
            human(d, sizeof d, hi));
  }
}


static void print_capacity_table(const replay_trace_t *t, const char *name, const config_t *cfg,
                                 int ncfg, const replay_capacity_t *cap, const int *ok,
                                 double precision) {
  char a[32], b[32], c[32];
  printf("\n%s: smallest simulated capacity with no failed allocation (bisection to %.2g%%)\n",
         name, precision * 100);
  printf("  trace peak live %s (the floor)", human(a, sizeof a, t->peak_live));
  if (t->has_recorded)
    printf(", %s peak reserved %s", recorded_label, human(b, sizeof b, t->recorded_peak));
  printf("\n");
  printf("  %-12s %13s %13s %12s %14s %8s %8s\n", "config", "min capacity", "/ recorded",
         "/ peak live", "reserved at it", "replays", "time");
  for (int k = 0; k < ncfg; k++) {
    if (!ok[k]) {
      printf("  %-12.12s %13s\n", cfg[k].name, "(error)");
      continue;
    }
    const replay_capacity_t *m = &cap[k];
    char note[160] = "";
    if (!m->min_capacity)
      snprintf(note, sizeof note, "  none up to %s", human(c, sizeof c, m->failing));
    else if (m->budget_hit)
      snprintf(note, sizeof note, "  budget: only to %.2f%%", m->width * 100);
    if (m->unstable)
      snprintf(note + strlen(note), sizeof note - strlen(note),
               "  UNSTABLE: a capacity failed at or above one that succeeded");
    ratio(b, sizeof b, m->min_capacity, m->recorded_peak_reserved);
    ratio(c, sizeof c, m->min_capacity, m->lower_bound);
    char r[32];
    if (m->min_capacity) human(r, sizeof r, m->at_min.peak_reserved);
    else snprintf(r, sizeof r, "-");
    printf("  %-12.12s %13s %13s %12s %14s %8d %7.1fs%s\n", cfg[k].name,
           m->min_capacity ? human(a, sizeof a, m->min_capacity) : "-", b, c, r, m->replays,
           m->wall_s, note);
    if (t->count[RA_OOM] && m->min_capacity)
      printf("  %-12s at it: %s failed %zu request%s (oom rows), gma failed %" PRIu64 "\n", "",
             recorded_label, t->count[RA_OOM], t->count[RA_OOM] == 1 ? "" : "s",
             m->at_min.oom_attempts - m->at_min.oom_served);
  }
}

/* A number that is the whole of v (strtod), finite and in [lo, hi]. */
static bool whole_number(const char *v, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !(x >= lo && x <= hi)) return false;
  *out = x;
  return true;
}

/* Creates dir if missing; false, with a message, when it cannot be made or
 * is not a directory this process may write in. */
static bool output_dir(const char *opt, const char *dir) {
  struct stat st;
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "gma-replay: %s: cannot create %s: %s\n", opt, dir, strerror(errno));
    return false;
  }
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "gma-replay: %s: %s is not a directory\n", opt, dir);
    return false;
  }
  if (access(dir, W_OK | X_OK) != 0) {
    fprintf(stderr, "gma-replay: %s: cannot write in %s: %s\n", opt, dir, strerror(errno));
    return false;
  }
  return true;
}

int main(int argc, char **argv) {
  config_t cfg[MAX_CONFIGS];
  int ncfg = 0;
  const char *inputs[MAX_INPUTS];
  int nin = 0;
  const char *json = NULL, *tl_dir = NULL, *snap_dir = NULL, *torch_snap = NULL, *device = "sim";
  uint64_t seed = 1, repeat = 0;
  int quiet = 0, min_cap = 0, verbose = 0, confirm = 1;
  double precision = 0.002, budget = 0;
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
    } else if (strcmp(a, "--torch-snapshot") == 0 && more) {
      torch_snap = argv[++i];
    } else if (strcmp(a, "--seed") == 0 && more) {
      char *end;
      const char *v = argv[++i];
      errno = 0;
      seed = strtoull(v, &end, 0);
      if (errno || end == v || *end || strchr(v, '-')) {
        fprintf(stderr, "gma-replay: --seed wants a number from 0 to 2^64-1, not '%s'\n", v);
        return 2;
      }
    } else if (strcmp(a, "--repeat") == 0 && more) {
      char *end;
      const char *v = argv[++i];
      errno = 0;
      repeat = strtoull(v, &end, 10);
      if (errno || end == v || *end || *v == '-' || repeat < 1 || repeat > 1000000) {
        fprintf(stderr, "gma-replay: --repeat wants a count from 1 to 1000000, not '%s'\n", v);
        return 2;
      }
    } else if (strcmp(a, "--quiet") == 0) {
      quiet = 1;
    } else if (strcmp(a, "--min-capacity") == 0) {
      min_cap = 1;
    } else if (strcmp(a, "--precision") == 0 && more) {
      double pct = 0;
      if (!whole_number(argv[++i], 0, 100, &pct)) pct = 0;
      precision = pct / 100;
      if (!(precision > 0 && precision < 1)) {
        fprintf(stderr, "gma-replay: --precision is a percentage between 0 and 100\n");
        return 2;
      }
    } else if (strcmp(a, "--budget") == 0 && more) {
      const char *v = argv[++i];
      if (!whole_number(v, 0, 1e9, &budget) || budget <= 0) {
        fprintf(stderr, "gma-replay: --budget wants a number of seconds above 0, not '%s'\n", v);
        return 2;
      }
    } else if (strcmp(a, "--confirm") == 0 && more) {
      const char *v = argv[++i];
      double n = 0;
      if (!whole_number(v, 0, 1000, &n) || n != (double)(int)n) {
        fprintf(stderr, "gma-replay: --confirm wants a count from 0 to 1000, not '%s'\n", v);
        return 2;
      }
      confirm = n > 0 ? (int)n : -1; /* -1: none */
    } else if (strcmp(a, "--verbose") == 0) {
      verbose = 1;
    } else if (strcmp(a, "--recorded-label") == 0 && more) {
      recorded_label = argv[++i];
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
  if (min_cap && strcmp(device, "sim") != 0) {
    fprintf(stderr, "gma-replay: --min-capacity sets the simulated device's capacity; it needs "
                    "--device sim\n");
    return 2;
  }
  if (ncfg == 0) {
    snprintf(cfg[0].name, sizeof cfg[0].name, "default");
    cfg[0].conf = "";
    snprintf(cfg[1].name, sizeof cfg[1].name, "ordinary");
    cfg[1].conf = "expandable_segments:false";
    ncfg = 2;
  }
  if (torch_snap && (nin != 1 || min_cap)) {
    fprintf(stderr, "gma-replay: --torch-snapshot writes the replay of one trace; %s\n",
            min_cap ? "it does not go with --min-capacity" : "give exactly one TRACE");
    return 2;
  }
  if (tl_dir && !output_dir("--timeline-dir", tl_dir)) return 1;
  if (snap_dir && !output_dir("--snapshot-dir", snap_dir)) return 1;
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (json && !jf) {
    fprintf(stderr, "gma-replay: cannot create %s: %s\n", json, strerror(errno));
    return 1;
  }
  if (jf) fprintf(jf, "{\"device\": \"%s\", \"results\": [", device);
  outcome_t *all = calloc((size_t)nin * (size_t)ncfg, sizeof *all);
  int nall = 0, failures = 0;
  /* The --min-capacity results, written to the JSON after the replays. */
  char *capjson = NULL;
  size_t capjson_len = 0;
  FILE *cj = jf && min_cap ? open_memstream(&capjson, &capjson_len) : NULL;
  int ncap = 0, ncapall = 0;
  cap_outcome_t *capall = min_cap ? calloc((size_t)nin * (size_t)ncfg, sizeof *capall) : NULL;
  bool tty = isatty(2) && !quiet;
  for (int in = 0; in < nin; in++) {
    char err[1024];
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
    if (t->n == 0) fprintf(stderr, "gma-replay: %s has a header but no events\n", name);
    replay_result_t res[MAX_CONFIGS];
    for (int c = 0; c < ncfg; c++) {
      char path[1024], label[224];
      snprintf(label, sizeof label, "%.120s [%.60s]", name, cfg[c].name);
      replay_options_t o = {.device = device, .progress = tty, .label = label, .repeat = repeat};
      FILE *tl = NULL;
      int rc = 0;
      if (tl_dir) {
        snprintf(path, sizeof path, "%s/%s.%s.timeline.csv", tl_dir, name, cfg[c].name);
        if ((tl = fopen(path, "w"))) {
          fputs("Event,Time,Allocated,Reserved,RecordedReserved\n", tl);
          o.timeline = tl;
        } else {
          snprintf(err, sizeof err, "cannot create %.400s: %s", path, strerror(errno));
          rc = -1;
        }
      }
      if (rc == 0) rc = replay_run(t, cfg[c].conf, &o, &res[c], err, sizeof err);
      if (tl) fclose(tl);
      if (rc == 0 && snap_dir) { /* untimed second pass for the picture */
        replay_result_t scratch;
        snprintf(path, sizeof path, "%s/%s.%s.peak.json", snap_dir, name, cfg[c].name);
        replay_options_t so = {.device = device, .snapshot_path = path, .repeat = repeat};
        remove(path); /* what the pass writes, not an older file, must be there after it */
        rc = replay_run(t, cfg[c].conf, &so, &scratch, err, sizeof err);
        if (rc == 0 && access(path, R_OK) != 0) {
          snprintf(err, sizeof err, "the snapshot %.400s could not be written", path);
          rc = -1;
        }
      }
      if (rc == 0 && torch_snap && c == 0) { /* untimed: tracing costs time */
        replay_result_t scratch;
        replay_options_t so = {.device = device, .torch_snapshot_path = torch_snap,
                               .repeat = repeat};
        rc = replay_run(t, cfg[c].conf, &so, &scratch, err, sizeof err);
        if (rc == 0 && !quiet)
          fprintf(stderr, "gma-replay: %s under %s: PyTorch-format snapshot written to %s\n",
                  name, cfg[c].name, torch_snap);
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
    if (min_cap) {
      replay_capacity_t cap[MAX_CONFIGS];
      int ok[MAX_CONFIGS];
      for (int c = 0; c < ncfg; c++) {
        char label[224];
        snprintf(label, sizeof label, "%.120s [%.60s]", name, cfg[c].name);
        cap_progress_t pg = {.label = label, .verbose = verbose, .tty = isatty(2) && !quiet};
        replay_capacity_options_t co = {.precision = precision, .repeat = repeat,
                                        .budget_s = budget, .confirm = confirm,
                                        .on_step = on_cap_step, .arg = &pg};
        ok[c] = replay_min_capacity(t, cfg[c].conf, &co, &cap[c], err, sizeof err) == 0;
        if (pg.tty && !verbose) fprintf(stderr, "\r\033[K");
        if (!ok[c]) {
          fprintf(stderr, "gma-replay: min capacity of %s under %s: %s\n", name, cfg[c].name, err);
          failures++;
          continue;
        }
        if (cj) {
          fprintf(cj,
                  "%s\n  {\"trace\": \"%s\", \"config\": \"%s\", \"conf\": \"%s\", "
                  "\"search\": ",
                  ncap++ ? "," : "", name, cfg[c].name, cfg[c].conf);
          replay_capacity_json(cj, &cap[c]);
          fputc('}', cj);
        }
      }
      if (!quiet) print_capacity_table(t, name, cfg, ncfg, cap, ok, precision);
      for (int c = 0; c < ncfg; c++) {
        if (!ok[c]) continue;
        replay_capacity_free(&cap[c]);
        if (!capall) continue;
        cap_outcome_t *co = &capall[ncapall++];
        snprintf(co->trace, sizeof co->trace, "%s", name);
        snprintf(co->config, sizeof co->config, "%.63s", cfg[c].name);
        co->m = cap[c];
      }
    }
    replay_trace_free(t);
  }
  if (jf) {
    fputs("\n]", jf);
    if (cj) {
      fclose(cj);
      fprintf(jf, ", \"min_capacity\": [%.*s\n]", (int)capjson_len, capjson ? capjson : "");
      free(capjson);
    }
    fputs("}\n", jf);
    fclose(jf);
  }
  /* The summary: one row per trace and configuration (none when no input
   * could be replayed: the errors above say why). */
  if (nall > 0) {
    printf("\nsummary (%s device): peak reserved against peak allocated and against the recording "
           "allocator (%s)\n",
           strcmp(device, "sim") == 0 ? "simulated" : "CUDA", recorded_label);
    printf("%-40s %-11s %12s %11s %11s %8s %11s %8s %7s %9s %8s\n", "trace", "config", "allocated",
           "reserved", "recorded", "res/all", "res/rec", "frag", "failed", "oom r/g", "Mev/s");
    int starred = 0;
    for (int i = 0; i < nall; i++) {
      const replay_result_t *r = &all[i].r;
      char a[32], al[40], b[32], c[32], rr[16] = "-", oom[32] = "-";
      if (all[i].has_recorded && r->recorded_peak_reserved)
        snprintf(rr, sizeof rr, "%.3fx", (double)r->peak_reserved / (double)r->recorded_peak_reserved);
      if (r->recorded_failed)
        snprintf(oom, sizeof oom, "%" PRIu64 "/%" PRIu64, r->recorded_failed,
                 r->oom_attempts - r->oom_served);
      snprintf(al, sizeof al, "%s%s", human(a, sizeof a, r->peak_allocated),
               r->failed_allocs ? "*" : " ");
      starred |= r->failed_allocs > 0;
      printf("%-40.40s %-11.11s %12s %11s %11s %7.3fx %11s %7.1f%% %7" PRIu64 " %9s %8.2f\n",
             all[i].trace, all[i].config, al, human(b, sizeof b, r->peak_reserved),
             all[i].has_recorded ? human(c, sizeof c, r->recorded_peak_reserved) : "-",
             r->peak_allocated ? (double)r->peak_reserved / (double)r->peak_allocated : 0, rr,
             100 * r->fragmentation_at_peak, r->failed_allocs, oom, r->events_per_s / 1e6);
    }
    printf("failed: allocations the trace records as served that failed in the replay; "
           "oom r/g: requests the recording allocator failed (oom rows) / of them, failed by gma "
           "too\n");
    if (starred) printf("* leaves out the failed allocations: a failed request never became live\n");
  }
  if (repeat && nall > 0) {
    /* --repeat: each repetition's figures, next to the whole run's above. */
    printf("\nrepetitions (--repeat %" PRIu64 ", one allocator, gma_iteration_mark after each): "
           "peak reserved of the first and the last repetition, device allocations after "
           "repetition 1 and after the plan became active, plan statistics\n",
           repeat);
    printf("%-40s %-11s %5s %11s %11s %11s %8s %6s %6s %6s %6s %9s %9s %11s %7s\n", "trace",
           "config", "reps", "rep1 res", "last res", "max 2..N", "last/all", "dev1", "dev>1",
           "active", "dev>a", "hits", "misses", "arena", "marks!");
    for (int i = 0; i < nall; i++) {
      const replay_result_t *r = &all[i].r;
      char a[32], b[32], c[32], act[24] = "-", deva[24] = "-", ar[32] = "-";
      if (r->plan_active_rep) {
        snprintf(act, sizeof act, "%" PRIu64, r->plan_active_rep);
        snprintf(deva, sizeof deva, "%" PRIu64, r->device_allocs_after_plan_active);
      }
      if (r->plan_arena_bytes) human(ar, sizeof ar, r->plan_arena_bytes);
      printf("%-40.40s %-11.11s %5" PRIu64 " %11s %11s %11s %7.3fx %6" PRIu64 " %6" PRIu64
             " %6s %6s %9" PRIu64 " %9" PRIu64 " %11s %7" PRIu64 "\n",
             all[i].trace, all[i].config, r->reps_completed,
             human(a, sizeof a, r->peak_reserved_first_rep),
             human(b, sizeof b, r->peak_reserved_last_rep),
             r->reps_completed > 1 ? human(c, sizeof c, r->peak_reserved_max_after_first_rep) : "-",
             r->peak_allocated ? (double)r->peak_reserved_last_rep / (double)r->peak_allocated : 0,
             r->device_allocs_first_rep, r->device_allocs_after_first_rep, act, deva, r->plan_hits,
             r->plan_misses, ar, r->mark_failures);
    }
    printf("rep1 res / last res / max 2..N: peak reserved of repetition 1, of the last, and the "
           "highest of repetitions 2..N (sampled after every allocation call; exact when it "
           "reached gma's peak so far); last/all: the last repetition's peak reserved over the "
           "run's peak allocated; dev1 / dev>1: device allocations in repetition 1 / after it; "
           "active: the repetition after whose mark the plan was active (plan_state 4); dev>a: "
           "device allocations after that mark; marks!: gma_iteration_mark calls that failed\n");
    for (int i = 0; i < nall; i++)
      if (all[i].r.mark_failures)
        printf("%s [%s]: gma_iteration_mark failed %" PRIu64 " of %" PRIu64 " times: %s\n",
               all[i].trace, all[i].config, all[i].r.mark_failures, all[i].r.marks,
               all[i].r.mark_error);
  }
  free(all);
  if (min_cap) {
    printf("\nsmallest simulated capacity with no failed allocation (bisection to %.2g%%), against "
           "the recording allocator's (%s) peak reserved and the trace's peak live bytes\n",
           precision * 100, recorded_label);
    printf("%-40s %-11s %11s %11s %11s %9s %9s %7s %7s\n", "trace", "config", "min cap",
           "recorded", "peak live", "/ rec", "/ live", "replays", "time");
    int unstable = 0, budget_hit = 0;
    for (int i = 0; i < ncapall; i++) {
      const replay_capacity_t *m = &capall[i].m;
      char a[32], b[32], c[32], d[16], e[16];
      ratio(d, sizeof d, m->min_capacity, m->recorded_peak_reserved);
      ratio(e, sizeof e, m->min_capacity, m->lower_bound);
      printf("%-40.40s %-11.11s %11s %11s %11s %9s %9s %7d %6.1fs%s%s\n", capall[i].trace,
             capall[i].config, m->min_capacity ? human(a, sizeof a, m->min_capacity) : "none",
             m->recorded_peak_reserved ? human(b, sizeof b, m->recorded_peak_reserved) : "-",
             human(c, sizeof c, m->lower_bound), d, e, m->replays, m->wall_s,
             m->unstable ? "  unstable" : "", m->budget_hit ? "  budget" : "");
      unstable |= m->unstable;
      budget_hit |= m->budget_hit;
    }
    if (unstable)
      printf("unstable: a capacity failed at or above one that succeeded (frees that wait for "
             "simulated device work, or timed trimming, differ from run to run); the answer is "
             "the smallest capacity whose every replay succeeded\n");
    if (budget_hit) printf("budget: the time budget stopped the bisection before the precision\n");
    free(capall);
  }
  return failures ? 1 : 0;
}
