/* gma-estimate: the memory a transformer needs, before it runs, from its
 * dimensions (gma_estimate_transformer), with the device that has room for it
 * (gma_select_device); or, for a recorded trace, the smallest simulated device
 * it replays in under gma's default (growable) and ordinary-segment configurations (the
 * search of gma-replay --min-capacity, from tools/replay/replay.c). Prints a
 * table; --json writes the same as JSON. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gma.h"
#include "replay.h"

#define MAX_TRACES 32

static void usage(FILE *f) {
  fprintf(f,
          "usage: gma-estimate --hidden N --layers N --vocab N --heads N --seq-len N [options]\n"
          "       gma-estimate --trace TRACE.csv [--trace ...] [--precision PCT] [--budget S]\n"
          "The model (a decoder-only, pre-norm transformer; docs/estimate.md):\n"
          "  --hidden N           d_model (a multiple of --heads)\n"
          "  --intermediate N     feed-forward inner size (default 4 x hidden)\n"
          "  --layers N           transformer layers\n"
          "  --vocab N            vocabulary size\n"
          "  --heads N            attention heads\n"
          "  --kv-heads N         key/value heads (default: --heads; fewer: grouped-query)\n"
          "  --seq-len N          tokens per sequence in one forward pass\n"
          "  --batch N            sequences per forward pass (default 1)\n"
          "  --dtype T            parameters and gradients: fp32, bf16, fp16, fp8, fp64 or\n"
          "                       bytes (default fp32)\n"
          "  --act-dtype T        activations (default: --dtype; bf16 with fp32 is autocast)\n"
          "  --mode M             inference (default), forward (autograd on, no backward) or\n"
          "                       training (forward, backward, optimizer step)\n"
          "  --attention A        eager (default: scores materialized, softmax output kept),\n"
          "                       eager-exp (a softmax written out: exp and quotient kept) or\n"
          "                       fused (FlashAttention/SDPA: no score matrix)\n"
          "  --optimizer O        adam (default: torch.optim, moments in the parameters' dtype),\n"
          "                       adam-master (fp32 master and moments), sgd-momentum or sgd\n"
          "  --plain-ffn          two feed-forward matrices (GELU) instead of three (SwiGLU)\n"
          "  --tied               the output head is the token embedding\n"
          "  --grads-released     training: gradients freed before each forward\n"
          "  --foreach            training: the step's temporaries are a copy of the parameters\n"
          "  --kv-cache N         inference: tokens per sequence the KV cache holds\n"
          "  --select-device      also pick the CUDA device with room for the estimate\n"
          "                       (gma_select_device)\n"
          "Traces (gma's trace CSV; tools/gma-import-torch converts PyTorch snapshots):\n"
          "  --trace FILE         the smallest simulated capacity FILE replays in, under the\n"
          "                       configurations default (growable segments) and\n"
          "                       ordinary (expandable_segments:false)\n"
          "  --precision PCT      the search's width in percent (default 0.2)\n"
          "  --budget SECONDS     time per trace and configuration (default: none)\n"
          "Both:\n"
          "  --json PATH          write the result as JSON ('-': standard output)\n"
          "Exit status: 0 done; 1 the estimate or a trace failed (the message says why);\n"
          "2 bad usage.\n");
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

/* A dtype name or a byte count; 0 for neither. */
static uint64_t parse_dtype(const char *s) {
  static const struct { const char *name; uint64_t bytes; } names[] = {
      {"fp32", 4}, {"float32", 4}, {"bf16", 2}, {"bfloat16", 2}, {"fp16", 2},
      {"float16", 2}, {"fp8", 1}, {"fp64", 8}, {"float64", 8}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(s, names[i].name) == 0) return names[i].bytes;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  return *s && !*end ? v : 0;
}

static int parse_u64(const char *opt, const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (!*s || *end || errno || *s == '-') {
    fprintf(stderr, "gma-estimate: %s takes a whole number, not '%s'\n", opt, s);
    return 0;
  }
  *out = v;
  return 1;
}

static int pick(const char *opt, const char *s, const char *const *names, int n, int *out) {
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) return *out = i, 1;
  fprintf(stderr, "gma-estimate: %s takes", opt);
  for (int i = 0; i < n; i++) fprintf(stderr, "%s %s", i ? (i == n - 1 ? " or" : ",") : "", names[i]);
  fprintf(stderr, ", not '%s'\n", s);
  return 0;
}

static const char *const MODES[] = {"inference", "forward", "training"};
static const char *const ATTENTIONS[] = {"eager", "eager-exp", "fused"};
static const char *const OPTIMIZERS[] = {"adam", "adam-master", "sgd-momentum", "sgd"};
static const char *const PHASES[] = {"inside a layer", "the output head", "the end of forward",
                                     "the start of backward", "the optimizer step"};

typedef struct opts {
  gma_transformer_t m;
  const char *json;
  const char *traces[MAX_TRACES];
  int ntraces, select_device, model_given;
  double precision, budget;
} opts_t;

/* The options that take a number: their field in the model. */
static uint64_t *number_field(opts_t *o, const char *a) {
  static const char *const names[] = {"--hidden", "--intermediate", "--layers", "--vocab",
                                      "--heads", "--kv-heads", "--seq-len", "--batch",
                                      "--kv-cache"};
  uint64_t *fields[] = {&o->m.hidden, &o->m.intermediate, &o->m.layers, &o->m.vocab,
                        &o->m.heads, &o->m.kv_heads, &o->m.seq_len, &o->m.batch,
                        &o->m.kv_cache_tokens};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(a, names[i]) == 0) return fields[i];
  return NULL;
}

static int parse_flag(opts_t *o, const char *a) {
  if (strcmp(a, "--plain-ffn") == 0) o->m.plain_ffn = 1;
  else if (strcmp(a, "--tied") == 0) o->m.tied_embeddings = 1;
  else if (strcmp(a, "--grads-released") == 0) o->m.grads_released = 1;
  else if (strcmp(a, "--foreach") == 0) o->m.step_foreach = 1;
  else if (strcmp(a, "--select-device") == 0) o->select_device = 1;
  else return 0;
  return 1;
}

/* One option that takes a value; 0 on a bad value (said on stderr), -1 when
 * the option is not one of these. */
static int parse_valued(opts_t *o, const char *a, const char *v) {
  uint64_t *field = number_field(o, a);
  int k;
  if (field) return o->model_given = 1, parse_u64(a, v, field);
  if (strcmp(a, "--dtype") == 0 || strcmp(a, "--act-dtype") == 0) {
    uint64_t b = parse_dtype(v);
    if (!b) fprintf(stderr, "gma-estimate: %s takes fp32, bf16, fp16, fp8, fp64 or bytes, not '%s'\n", a, v);
    if (a[2] == 'd') o->m.dtype_bytes = b;
    else o->m.act_dtype_bytes = b;
    return b != 0;
  }
  if (strcmp(a, "--mode") == 0) return pick(a, v, MODES, 3, &k) && (o->m.mode = k, 1);
  if (strcmp(a, "--attention") == 0) return pick(a, v, ATTENTIONS, 3, &k) && (o->m.attention = k, 1);
  if (strcmp(a, "--optimizer") == 0) return pick(a, v, OPTIMIZERS, 4, &k) && (o->m.optimizer = k, 1);
  if (strcmp(a, "--json") == 0) return o->json = v, 1;
  if (strcmp(a, "--precision") == 0 || strcmp(a, "--budget") == 0) {
    char *end;
    double x = strtod(v, &end);
    int ok = *v && !*end && x >= 0 && (a[2] == 'b' || x > 0);
    if (!ok) fprintf(stderr, "gma-estimate: %s takes a %s number, not '%s'\n", a,
                     a[2] == 'b' ? "non-negative" : "positive", v);
    if (a[2] == 'p') o->precision = x / 100;
    else o->budget = x;
    return ok;
  }
  if (strcmp(a, "--trace") == 0) {
    if (o->ntraces == MAX_TRACES) {
      fprintf(stderr, "gma-estimate: at most %d --trace options\n", MAX_TRACES);
      return 0;
    }
    o->traces[o->ntraces++] = v;
    return 1;
  }
  return -1;
}

/* 0 parsed, 1 --help, 2 bad usage. */
static int parse_args(int argc, char **argv, opts_t *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
    if (parse_flag(o, a)) continue;
    if (i + 1 >= argc) {
      fprintf(stderr, "gma-estimate: %s: unknown option, or its value is missing\n", a);
      return 2;
    }
    int rc = parse_valued(o, a, argv[i + 1]);
    if (rc < 0) fprintf(stderr, "gma-estimate: unknown option %s\n", a);
    if (rc <= 0) return 2;
    i++;
  }
  if (!o->ntraces == !o->model_given) {
    fprintf(stderr, "gma-estimate: give the model's dimensions or --trace FILE (not both)\n");
    return 2;
  }
  return 0;
}

/* One part of the peak; parts that are zero are left out. */
static void row(const char *what, uint64_t bytes, uint64_t total) {
  if (!bytes) return;
  printf("  %-22s %17" PRIu64 " %10.3f %6.1f%%\n", what, bytes, gib(bytes),
         total ? 100.0 * (double)bytes / (double)total : 0.0);
}

static void print_estimate(const gma_transformer_t *m, const gma_estimate_t *e) {
  printf("model: hidden %" PRIu64 ", intermediate %" PRIu64 " (%s), %" PRIu64 " layers, vocab %" PRIu64
         ", %" PRIu64 " heads (%" PRIu64 " kv), seq %" PRIu64 ", batch %" PRIu64 ", %" PRIu64
         "-byte parameters, %" PRIu64 "-byte activations\n",
         m->hidden, m->intermediate ? m->intermediate : 4 * m->hidden,
         m->plain_ffn ? "plain" : "gated", m->layers, m->vocab, m->heads,
         m->kv_heads ? m->kv_heads : m->heads, m->seq_len, m->batch ? m->batch : 1,
         m->dtype_bytes, m->act_dtype_bytes ? m->act_dtype_bytes : m->dtype_bytes);
  printf("%s, %s attention%s%s: %.3f billion parameters; the peak is at %s\n\n",
         MODES[m->mode], ATTENTIONS[m->attention],
         m->mode == GMA_ESTIMATE_TRAINING ? ", optimizer " : "",
         m->mode == GMA_ESTIMATE_TRAINING ? OPTIMIZERS[m->optimizer] : "",
         (double)e->params / 1e9, PHASES[e->phase]);
  printf("  %-22s %17s %10s %7s\n", "part of the peak", "bytes", "GiB", "share");
  uint64_t t = e->total_bytes;
  row("weights", e->weights_bytes, t);
  row("weight copy (autocast)", e->weight_copy_bytes, t);
  row("KV cache", e->kv_cache_bytes, t);
  row("activations", e->activation_bytes, t);
  row("logits and loss", e->logits_bytes, t);
  row("gradients", e->gradient_bytes, t);
  row("optimizer state", e->optimizer_bytes, t);
  row("step temporaries", e->step_temp_bytes, t);
  row("total (peak)", t, t);
  printf("\n  one layer's activations: %" PRIu64 " bytes (%.3f GiB)\n", e->layer_activation_bytes,
         gib(e->layer_activation_bytes));
}

static void json_estimate(FILE *f, const gma_transformer_t *m, const gma_estimate_t *e) {
  fprintf(f,
          "{\"model\": {\"hidden\": %" PRIu64 ", \"intermediate\": %" PRIu64 ", \"layers\": %" PRIu64
          ", \"vocab\": %" PRIu64 ", \"heads\": %" PRIu64 ", \"kv_heads\": %" PRIu64
          ", \"seq_len\": %" PRIu64 ", \"batch\": %" PRIu64 ", \"dtype_bytes\": %" PRIu64
          ", \"act_dtype_bytes\": %" PRIu64 ", \"kv_cache_tokens\": %" PRIu64
          ", \"mode\": \"%s\", \"attention\": \"%s\", \"optimizer\": \"%s\", \"plain_ffn\": %s"
          ", \"tied_embeddings\": %s, \"grads_released\": %s, \"step_foreach\": %s},\n",
          m->hidden, m->intermediate ? m->intermediate : 4 * m->hidden, m->layers, m->vocab,
          m->heads, m->kv_heads ? m->kv_heads : m->heads, m->seq_len, m->batch ? m->batch : 1,
          m->dtype_bytes, m->act_dtype_bytes ? m->act_dtype_bytes : m->dtype_bytes,
          m->kv_cache_tokens, MODES[m->mode], ATTENTIONS[m->attention], OPTIMIZERS[m->optimizer],
          m->plain_ffn ? "true" : "false", m->tied_embeddings ? "true" : "false",
          m->grads_released ? "true" : "false", m->step_foreach ? "true" : "false");
  fprintf(f,
          " \"estimate\": {\"total_bytes\": %" PRIu64 ", \"weights_bytes\": %" PRIu64
          ", \"weight_copy_bytes\": %" PRIu64 ", \"kv_cache_bytes\": %" PRIu64
          ", \"activation_bytes\": %" PRIu64 ", \"logits_bytes\": %" PRIu64
          ", \"gradient_bytes\": %" PRIu64 ", \"optimizer_bytes\": %" PRIu64
          ", \"step_temp_bytes\": %" PRIu64 ", \"params\": %" PRIu64
          ", \"layer_activation_bytes\": %" PRIu64 ", \"phase\": \"%s\"}",
          e->total_bytes, e->weights_bytes, e->weight_copy_bytes, e->kv_cache_bytes,
          e->activation_bytes, e->logits_bytes, e->gradient_bytes, e->optimizer_bytes,
          e->step_temp_bytes, e->params, e->layer_activation_bytes, PHASES[e->phase]);
}

static FILE *open_json(const char *path) {
  if (!path) return NULL;
  if (strcmp(path, "-") == 0) return stdout;
  FILE *f = fopen(path, "w");
  if (!f) fprintf(stderr, "gma-estimate: cannot create %s: %s\n", path, strerror(errno));
  return f;
}

static int close_json(FILE *f, const char *path) {
  if (!f) return 0;
  fputs("}\n", f);
  int bad = f == stdout ? fflush(f) != 0 : fclose(f) != 0;
  if (bad) fprintf(stderr, "gma-estimate: writing %s failed\n", path);
  return bad;
}

static int run_estimate(const opts_t *o) {
  gma_estimate_t e = GMA_ESTIMATE_INIT;
  if (gma_estimate_transformer(&o->m, &e) != GMA_OK) {
    fprintf(stderr, "gma-estimate: %s\n", gma_last_error());
    return 1;
  }
  FILE *jf = NULL;
  if (o->json && !(jf = open_json(o->json))) return 1;
  if (jf != stdout) print_estimate(&o->m, &e);
  if (jf) json_estimate(jf, &o->m, &e);
  int rc = 0;
  if (o->select_device) {
    int dev = -1;
    gma_status_t st = gma_select_device(e.total_bytes, &dev);
    if (jf != stdout) {
      if (st == GMA_OK) printf("  device with room for it: CUDA device %d\n", dev);
      else printf("  device with room for it: none (%s)\n", gma_last_error());
    }
    if (jf) fprintf(jf, ",\n \"device\": %d, \"device_status\": \"%s\"", dev, gma_status_name(st));
  }
  if (close_json(jf, o->json)) rc = 1;
  return rc;
}

typedef struct cap_config {
  const char *name, *conf;
} cap_config_t;

static const cap_config_t CAP_CONFIGS[] = {{"default", ""},
                                           {"ordinary", "expandable_segments:false"}};

/* One trace: its floor and the smallest capacity under each configuration,
 * as a table on tf and, when jf is set, JSON. */
static int run_trace(const opts_t *o, const char *path, FILE *tf, FILE *jf, int first) {
  char err[1024];
  replay_trace_t *t = NULL;
  if (replay_load(path, &t, err, sizeof err) != 0) {
    fprintf(stderr, "gma-estimate: %s\n", err);
    return 1;
  }
  fprintf(tf, "%s: peak live %" PRIu64 " bytes (%.3f GiB), the floor", t->name, t->peak_live,
          gib(t->peak_live));
  if (t->has_recorded) fprintf(tf, "; recorded peak reserved %.3f GiB", gib(t->recorded_peak));
  fprintf(tf, "\n  %-12s %17s %10s %10s %8s\n", "config", "min capacity", "GiB", "/ live", "replays");
  if (jf)
    fprintf(jf, "%s\n  {\"trace\": \"%s\", \"peak_live_bytes\": %" PRIu64 ", \"configs\": [",
            first ? "" : ",", t->name, t->peak_live);
  int rc = 0;
  for (size_t c = 0; c < sizeof CAP_CONFIGS / sizeof CAP_CONFIGS[0]; c++) {
    replay_capacity_options_t co = {.precision = o->precision, .budget_s = o->budget,
                                    .confirm = 1};
    replay_capacity_t cap;
    if (replay_min_capacity(t, CAP_CONFIGS[c].conf, &co, &cap, err, sizeof err) != 0) {
      fprintf(stderr, "gma-estimate: %s under %s: %s\n", t->name, CAP_CONFIGS[c].name, err);
      rc = 1;
      continue;
    }
    fprintf(tf, "  %-12s %17" PRIu64 " %10.3f %9.3fx %8d%s\n", CAP_CONFIGS[c].name,
            cap.min_capacity, gib(cap.min_capacity),
            t->peak_live ? (double)cap.min_capacity / (double)t->peak_live : 0.0, cap.replays,
            cap.unstable ? "  (unstable)" : "");
    if (jf) {
      fprintf(jf, "%s{\"config\": \"%s\", \"conf\": \"%s\", \"search\": ", c ? ", " : "",
              CAP_CONFIGS[c].name, CAP_CONFIGS[c].conf);
      replay_capacity_json(jf, &cap);
      fputc('}', jf);
    }
    replay_capacity_free(&cap);
  }
  if (jf) fputs("]}", jf);
  replay_trace_free(t);
  return rc;
}

static int run_traces(const opts_t *o) {
  FILE *jf = NULL;
  if (o->json && !(jf = open_json(o->json))) return 1;
  if (jf) fputs("{\"traces\": [", jf);
  int rc = 0;
  FILE *tf = jf == stdout ? stderr : stdout; /* JSON on standard output: the table aside */
  for (int i = 0; i < o->ntraces; i++) rc |= run_trace(o, o->traces[i], tf, jf, i == 0);
  if (jf) fputs("]", jf);
  if (close_json(jf, o->json)) rc = 1;
  return rc;
}

int main(int argc, char **argv) {
  opts_t o = {.m = GMA_TRANSFORMER_INIT, .precision = 0.002};
  o.m.dtype_bytes = 4;
  int rc = parse_args(argc, argv, &o);
  if (rc == 1) {
    usage(stdout);
    return 0;
  }
  if (rc) {
    fprintf(stderr, "gma-estimate: --help lists the options\n");
    return 2;
  }
  return o.ntraces ? run_traces(&o) : run_estimate(&o);
}
