/* The built-in synthetic workloads of tools/gma-replay (see synth.h): each is
 * a small simulation of a program driving a GPU caching allocator, written as
 * gma trace CSV rows.
 *
 * This file owns the simulations and the row writer. A workload calls the
 * s_* emitters (allocate, free, record_stream, async submit/complete, batch,
 * idle) with a simulated time; rows go to a buffer that is sorted by (time,
 * emission order) and written out up to a watermark no later row can precede.
 * dp and server have one timeline, so their rows come out in emission order;
 * pipeline has one timeline per stage and needs the sort. Simulated time
 * advances with kernel durations estimated from bytes moved and flops at
 * roughly current-GPU rates, so the Time column looks like a real trace.
 *
 * Pointers come from a bump counter (unique, 512-aligned, never reused), and
 * every emitter keeps counts of live blocks and pending futures, so a
 * workload that forgets a free is reported as an internal error rather than
 * written as a leaking trace. */
#include "synth.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define KIB 1024ull
#define MIB (1024ull * 1024ull)
#define US 1000ull
#define MS 1000000ull
static const uint64_t NS_PER_S = 1000000000;

const char *const gma_synth_names[] = {"dp", "pipeline", "server", NULL};

/* --------------------------------------------------------------------------
 * Events and the row writer
 * ------------------------------------------------------------------------ */
enum { EV_ALLOC, EV_FREE, EV_RECORD, EV_SUBMIT, EV_COMPLETE, EV_BATCH, EV_IDLE };
static const char *const ev_names[] = {"allocate",       "free",  "record_stream", "async_submit",
                                       "async_complete", "batch", "idle"};

typedef struct ev {
  uint64_t t, seq; /* simulated ns; emission order breaks ties */
  uint64_t ptr, size, stream, id, count;
  uint32_t thread, action;
} ev_t;

/* A live block as the workload sees it; ptr 0 once freed. */
typedef struct blk {
  uint64_t ptr, size, stream;
} blk_t;

/* An async request not yet completed; id 0 once completed. */
typedef struct fut {
  uint64_t id, size, stream;
} fut_t;

typedef struct syn {
  FILE *out;
  uint64_t rng;
  uint64_t next_ptr; /* the bump counter behind every pointer */
  uint64_t seq;
  uint64_t next_id;  /* futures and batches share one id sequence */
  ev_t *ev;          /* rows not yet written */
  size_t n, cap;
  uint64_t live;     /* allocations not yet freed */
  uint64_t pending;  /* futures submitted and not yet completed */
  uint64_t last_t;   /* time of the last row written */
  int failed;
  char msg[256];
} syn_t;

static void fail(syn_t *s, const char *fmt, ...) {
  if (s->failed) return;
  s->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->msg, sizeof s->msg, fmt, ap);
  va_end(ap);
}

static void emit(syn_t *s, uint32_t thread, uint64_t t, uint32_t action, uint64_t ptr,
                 uint64_t size, uint64_t stream, uint64_t id, uint64_t count) {
  if (s->failed) return;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 4096;
    ev_t *ev = realloc(s->ev, cap * sizeof *ev);
    if (!ev) {
      fail(s, "out of memory buffering %zu trace rows", cap);
      return;
    }
    s->ev = ev;
    s->cap = cap;
  }
  s->ev[s->n++] = (ev_t){.t = t, .seq = s->seq++, .ptr = ptr, .size = size, .stream = stream,
                         .id = id, .count = count, .thread = thread, .action = action};
}

static int ev_cmp(const void *a, const void *b) {
  const ev_t *x = a, *y = b;
  if (x->t != y->t) return x->t < y->t ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Writes, in (time, emission) order, every buffered row at or before
 * watermark: the caller promises that no row emitted later is earlier. */
static void flush(syn_t *s, uint64_t watermark) {
  if (s->failed) return;
  qsort(s->ev, s->n, sizeof *s->ev, ev_cmp);
  size_t i = 0;
  for (; i < s->n && s->ev[i].t <= watermark; i++) {
    const ev_t *e = &s->ev[i];
    if (e->t < s->last_t) {
      fail(s, "internal error: %s row at %" PRIu64 " ns after a row at %" PRIu64 " ns",
           ev_names[e->action], e->t, s->last_t);
      return;
    }
    s->last_t = e->t;
    if (fprintf(s->out,
                "%" PRIu32 ",%" PRIu64 ".%09" PRIu64 ",%s,0x%" PRIx64 ",%" PRIu64 ",0x%" PRIx64
                ",0,%" PRIu64 ",%" PRIu64 ",\n",
                e->thread, e->t / NS_PER_S, e->t % NS_PER_S, ev_names[e->action],
                e->ptr, e->size, e->stream, e->id, e->count) < 0) {
      fail(s, "write error: %s", strerror(errno ? errno : EIO));
      return;
    }
  }
  memmove(s->ev, s->ev + i, (s->n - i) * sizeof *s->ev);
  s->n -= i;
}

/* --------------------------------------------------------------------------
 * Randomness (xorshift64*, seeded through splitmix64 so any seed works)
 * ------------------------------------------------------------------------ */
static uint64_t rnd(syn_t *s) {
  uint64_t x = s->rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  s->rng = x;
  return x * 0x2545f4914f6cdd1dull;
}

static uint64_t rnd_below(syn_t *s, uint64_t n) { return n ? (rnd(s) >> 11) % n : 0; }

/* Uniform in [lo, hi]. */
static uint64_t rnd_between(syn_t *s, uint64_t lo, uint64_t hi) {
  return lo + rnd_below(s, hi - lo + 1);
}

/* ns give or take 5%: kernels never take exactly the same time twice. */
static uint64_t jit(syn_t *s, uint64_t ns) { return ns - ns / 20 + rnd_below(s, ns / 10 + 1); }

/* A heavy-tailed length: base * 2^k * U[1, 2), with k geometric (each
 * doubling taken with probability cont_pct%), capped. The tail of such a
 * length falls like a power law with exponent log2(100 / cont_pct), about
 * 1.15 for 45%: most prompts are short, a few are very long. */
static uint64_t heavy(syn_t *s, uint64_t base, unsigned cont_pct, uint64_t cap) {
  uint64_t v = base;
  while (v < cap && rnd_below(s, 100) < cont_pct) v *= 2;
  v += rnd_below(s, v);
  return v < cap ? v : cap;
}

static uint64_t rup512(uint64_t x) { return x ? (x + 511) & ~511ull : 512; }

static uint64_t scaled(uint64_t base, double scale) {
  double v = (double)base * scale + 0.5;
  return v < 1.0 ? 1 : (uint64_t)v;
}

/* --------------------------------------------------------------------------
 * A host thread's timeline and the emitters
 * ------------------------------------------------------------------------ */
typedef struct tl {
  syn_t *s;
  uint32_t thread;
  uint64_t now; /* simulated ns */
} tl_t;

/* Time one kernel takes: launch overhead, memory traffic at about 2 TB/s,
 * math at about 150 TFLOP/s; the timeline advances by it. */
static void kern(tl_t *c, uint64_t bytes, uint64_t flops) {
  c->now += jit(c->s, 4 * US + bytes / 2000 + flops / 150000);
}

static blk_t new_block(syn_t *s, uint64_t size, uint64_t stream) {
  blk_t b = {s->next_ptr, rup512(size), stream};
  s->next_ptr += b.size;
  s->live++;
  return b;
}

static blk_t s_alloc_id(tl_t *c, uint64_t size, uint64_t stream, uint64_t id) {
  blk_t b = new_block(c->s, size, stream);
  emit(c->s, c->thread, c->now, EV_ALLOC, b.ptr, b.size, b.stream, id, 0);
  return b;
}

static blk_t s_alloc(tl_t *c, uint64_t size, uint64_t stream) {
  return s_alloc_id(c, size, stream, 0);
}

/* Frees b on its allocation's stream (stream-ordered) and forgets it. */
static void s_free(tl_t *c, blk_t *b) {
  if (!b->ptr) {
    fail(c->s, "internal error: a workload freed a block that is not live");
    return;
  }
  emit(c->s, c->thread, c->now, EV_FREE, b->ptr, b->size, b->stream, 0, 0);
  c->s->live--;
  b->ptr = 0;
}

/* Frees b if it is live (for blocks a workload keeps only sometimes). */
static void s_free_if(tl_t *c, blk_t *b) {
  if (b->ptr) s_free(c, b);
}

/* b is also used on stream: its free must wait for that stream's work. */
static void s_record(tl_t *c, const blk_t *b, uint64_t stream) {
  if (!b->ptr) {
    fail(c->s, "internal error: record_stream of a block that is not live");
    return;
  }
  emit(c->s, c->thread, c->now, EV_RECORD, b->ptr, 0, stream, 0, 0);
}

static fut_t s_submit(tl_t *c, uint64_t size, uint64_t stream) {
  fut_t f = {++c->s->next_id, rup512(size), stream};
  c->s->pending++;
  emit(c->s, c->thread, c->now, EV_SUBMIT, 0, f.size, f.stream, f.id, 0);
  return f;
}

static blk_t s_complete(tl_t *c, fut_t *f) {
  if (!f->id) {
    fail(c->s, "internal error: a workload collected a future twice");
    return (blk_t){0, 0, 0};
  }
  blk_t b = new_block(c->s, f->size, f->stream);
  emit(c->s, c->thread, c->now, EV_COMPLETE, b.ptr, b.size, b.stream, f->id, 0);
  c->s->pending--;
  f->id = 0;
  return b;
}

/* A batch row (Size = the batch's bytes) followed by its n allocate rows. */
static void s_batch(tl_t *c, size_t n, const uint64_t *sizes, uint64_t stream, blk_t *out) {
  uint64_t id = ++c->s->next_id, total = 0;
  for (size_t i = 0; i < n; i++) total += rup512(sizes[i]);
  emit(c->s, c->thread, c->now, EV_BATCH, 0, total, stream, id, n);
  for (size_t i = 0; i < n; i++) out[i] = s_alloc_id(c, sizes[i], stream, id);
}

/* Nothing happens for ns nanoseconds (the replayer sleeps). */
static void s_idle(tl_t *c, uint64_t ns) {
  emit(c->s, c->thread, c->now, EV_IDLE, 0, ns, 0, 0, 0);
  c->now += ns;
}

/* --------------------------------------------------------------------------
 * A transformer layer's forward and backward, shared by dp and pipeline
 * ------------------------------------------------------------------------ */
typedef struct dims {
  uint64_t h, heads, seq, tok; /* hidden size, heads, sequence length, tokens (batch * seq) */
} dims_t;

/* What one layer's forward saves for its backward (fp16 activations). */
typedef struct layer_acts {
  blk_t ln1, ln1_mean, ln1_rstd, cast[4], qkv, attn, lse, rng, mask1, x1;
  blk_t ln2, ln2_mean, ln2_rstd, fc1, gelu, mask2, x2;
} layer_acts_t;

/* Parameters of one layer, in order: ln1 w/b, qkv w/b, proj w/b, ln2 w/b,
 * fc1 w/b, fc2 w/b. elem is the parameter's bytes per element. */
enum { LAYER_PARAMS = 12 };
static void layer_param_sizes(uint64_t h, uint64_t elem, uint64_t *sz) {
  const uint64_t n[LAYER_PARAMS] = {h,         h, 3 * h * h, 3 * h, h * h, h, h, h,
                                    4 * h * h, 4 * h, 4 * h * h, h};
  for (int j = 0; j < LAYER_PARAMS; j++) sz[j] = rup512(n[j] * elem);
}
/* Indices of the four weight matrices (qkv, proj, fc1, fc2). */
static const int layer_weights[4] = {2, 4, 8, 10};

/* Forward of one pre-LN transformer layer with flash attention. casts (or
 * NULL): bytes of fp16 copies of the four weight matrices autocast makes and
 * keeps for the backward. fc1 (or NULL): a block the caller got for the fc1
 * output already. */
static void layer_fwd(tl_t *c, uint64_t stream, const dims_t *d, layer_acts_t *L,
                      const uint64_t *casts, const blk_t *fc1) {
  const uint64_t th = d->tok * d->h * 2, hh = d->h * d->h;
  memset(L, 0, sizeof *L);
  L->ln1 = s_alloc(c, th, stream);
  L->ln1_mean = s_alloc(c, d->tok * 4, stream);
  L->ln1_rstd = s_alloc(c, d->tok * 4, stream);
  kern(c, 2 * th, 0);
  if (casts)
    for (int j = 0; j < 4; j++) {
      L->cast[j] = s_alloc(c, casts[j], stream);
      kern(c, casts[j] * 3, 0);
    }
  L->qkv = s_alloc(c, 3 * th, stream);
  kern(c, 4 * th, 6 * d->tok * hh);
  L->attn = s_alloc(c, th, stream);
  L->lse = s_alloc(c, d->heads * d->tok * 4, stream);
  L->rng = s_alloc(c, 512, stream);
  kern(c, 5 * th, 4 * d->tok * d->seq * d->h);
  blk_t proj = s_alloc(c, th, stream);
  kern(c, 2 * th, 2 * d->tok * hh);
  L->mask1 = s_alloc(c, th / 2, stream);
  L->x1 = s_alloc(c, th, stream);
  kern(c, 4 * th, 0);
  s_free(c, &proj);
  L->ln2 = s_alloc(c, th, stream);
  L->ln2_mean = s_alloc(c, d->tok * 4, stream);
  L->ln2_rstd = s_alloc(c, d->tok * 4, stream);
  kern(c, 2 * th, 0);
  L->fc1 = fc1 ? *fc1 : s_alloc(c, 4 * th, stream);
  kern(c, 5 * th, 8 * d->tok * hh);
  L->gelu = s_alloc(c, 4 * th, stream);
  kern(c, 8 * th, 0);
  blk_t fc2 = s_alloc(c, th, stream);
  kern(c, 5 * th, 8 * d->tok * hh);
  L->mask2 = s_alloc(c, th / 2, stream);
  L->x2 = s_alloc(c, th, stream);
  kern(c, 4 * th, 0);
  s_free(c, &fc2);
}

/* Called when the gradient of the layer's parameter j is computed. */
typedef void (*wgrad_fn)(void *ctx, tl_t *c, int j);

/* Backward of one layer: *g is the gradient of its output on entry and of
 * its input on return (the old block is freed). Frees everything the
 * forward saved, each as soon as the backward no longer needs it. */
static void layer_bwd(tl_t *c, uint64_t stream, const dims_t *d, layer_acts_t *L, blk_t *g,
                      wgrad_fn wgrad, void *ctx) {
  const uint64_t th = d->tok * d->h * 2, hh = d->h * d->h;
  s_free(c, &L->x2);
  blk_t dfc2 = s_alloc(c, th, stream);
  kern(c, 2 * th, 0);
  s_free(c, &L->mask2);
  wgrad(ctx, c, 10);
  wgrad(ctx, c, 11);
  blk_t dgelu = s_alloc(c, 4 * th, stream);
  kern(c, 5 * th, 8 * d->tok * hh);
  s_free(c, &dfc2);
  s_free(c, &L->gelu);
  blk_t dfc1 = s_alloc(c, 4 * th, stream);
  kern(c, 12 * th, 0);
  s_free(c, &dgelu);
  s_free(c, &L->fc1);
  wgrad(ctx, c, 8);
  wgrad(ctx, c, 9);
  blk_t dln2 = s_alloc(c, th, stream);
  kern(c, 5 * th, 8 * d->tok * hh);
  s_free(c, &dfc1);
  wgrad(ctx, c, 6);
  wgrad(ctx, c, 7);
  blk_t dx1 = s_alloc(c, th, stream);
  kern(c, 4 * th, 0);
  s_free(c, &dln2);
  s_free(c, &L->ln2);
  s_free(c, &L->ln2_mean);
  s_free(c, &L->ln2_rstd);
  s_free(c, &L->x1);
  blk_t dproj = s_alloc(c, th, stream);
  kern(c, 2 * th, 0);
  s_free(c, &L->mask1);
  wgrad(ctx, c, 4);
  wgrad(ctx, c, 5);
  blk_t dattn = s_alloc(c, th, stream);
  kern(c, 2 * th, 2 * d->tok * hh);
  s_free(c, &dproj);
  blk_t dqkv = s_alloc(c, 3 * th, stream);
  kern(c, 8 * th, 10 * d->tok * d->seq * d->h);
  s_free(c, &dattn);
  s_free(c, &L->attn);
  s_free(c, &L->lse);
  s_free(c, &L->rng);
  s_free(c, &L->qkv);
  wgrad(ctx, c, 2);
  wgrad(ctx, c, 3);
  blk_t dln1 = s_alloc(c, th, stream);
  kern(c, 4 * th, 6 * d->tok * hh);
  s_free(c, &dqkv);
  wgrad(ctx, c, 0);
  wgrad(ctx, c, 1);
  blk_t dx = s_alloc(c, th, stream);
  kern(c, 4 * th, 0);
  s_free(c, &dln1);
  s_free(c, &L->ln1);
  s_free(c, &L->ln1_mean);
  s_free(c, &L->ln1_rstd);
  s_free(c, &dx1);
  for (int j = 0; j < 4; j++) s_free_if(c, &L->cast[j]);
  s_free(c, g);
  *g = dx;
}

/* --------------------------------------------------------------------------
 * dp: data-parallel training with DDP-style gradient buckets
 * ------------------------------------------------------------------------ */
enum { DP_LAYERS = 12, DP_NP = 2 + LAYER_PARAMS * DP_LAYERS + 2, DP_MAX_BUCKETS = 128 };
#define DP_COMPUTE 0x1000ull
#define DP_COMM 0x2000ull

typedef struct dp {
  dims_t d;
  uint64_t psz[DP_NP];
  blk_t param[DP_NP], grad[DP_NP], exp_avg[DP_NP], exp_avg_sq[DP_NP];
  int layer; /* whose gradients layer_bwd is producing */
  uint64_t bucket_bytes, bucket_cap;
  blk_t bucket[DP_MAX_BUCKETS];
  int nbuckets;
  blk_t comm[2]; /* the comm stream's buffers for the last all-reduce */
} dp_t;

/* The current bucket is full (or backward is done): copy its gradients into
 * one flat buffer on the compute stream, hand it to the comm stream for the
 * all-reduce (record_stream), and let the comm stream take its buffers. */
static void dp_launch_bucket(dp_t *w, tl_t *c) {
  if (!w->bucket_bytes) return;
  if (w->nbuckets == DP_MAX_BUCKETS) {
    fail(c->s, "internal error: too many gradient buckets");
    return;
  }
  blk_t *b = &w->bucket[w->nbuckets++];
  *b = s_alloc(c, w->bucket_bytes, DP_COMPUTE);
  kern(c, 2 * w->bucket_bytes, 0);
  s_record(c, b, DP_COMM);
  /* The previous all-reduce is done by now: its buffers go back. */
  s_free_if(c, &w->comm[0]);
  s_free_if(c, &w->comm[1]);
  w->comm[0] = s_alloc(c, w->bucket_bytes / 2, DP_COMM);  /* fp16-compressed copy */
  w->comm[1] = s_alloc(c, w->bucket_bytes / 16, DP_COMM); /* reduce-scatter chunk, 8 ranks */
  c->now += jit(c->s, 3 * US);
  w->bucket_bytes = 0;
}

static void dp_grad_ready(dp_t *w, tl_t *c, int i) {
  w->bucket_bytes += w->psz[i];
  if (w->bucket_bytes >= w->bucket_cap) dp_launch_bucket(w, c);
}

/* A parameter's gradient under autocast: an fp16 gradient for weight
 * matrices, cast to the fp32 .grad that lives until zero_grad. */
static void dp_make_grad(dp_t *w, tl_t *c, int i, int half_first) {
  const uint64_t flops = 2 * w->d.tok * (w->psz[i] / 4);
  if (half_first) {
    blk_t g16 = s_alloc(c, w->psz[i] / 2, DP_COMPUTE);
    kern(c, w->psz[i], flops);
    w->grad[i] = s_alloc(c, w->psz[i], DP_COMPUTE);
    kern(c, w->psz[i] * 3 / 2, 0);
    s_free(c, &g16);
  } else {
    w->grad[i] = s_alloc(c, w->psz[i], DP_COMPUTE);
    kern(c, w->psz[i] + w->d.tok * w->d.h * 2, 0);
  }
  dp_grad_ready(w, c, i);
}

static void dp_wgrad(void *ctx, tl_t *c, int j) {
  dp_t *w = ctx;
  int big = j == 2 || j == 4 || j == 8 || j == 10;
  dp_make_grad(w, c, 2 + LAYER_PARAMS * w->layer + j, big);
}

static void gen_dp(syn_t *s, double scale) {
  dp_t *w = calloc(1, sizeof *w);
  layer_acts_t *acts = calloc(DP_LAYERS, sizeof *acts);
  if (!w || !acts) {
    fail(s, "out of memory");
    free(w);
    free(acts);
    return;
  }
  /* GPT-2 medium-ish: 12 layers, hidden 1024, 6 x 512 tokens per rank. */
  w->d = (dims_t){.h = 1024, .heads = 16, .seq = 512, .tok = 6 * 512};
  w->bucket_cap = 25 * MIB;
  const uint64_t h = w->d.h, tok = w->d.tok, seq = w->d.seq, V = 50257, th = tok * h * 2;
  const uint64_t iters = scaled(80, scale);
  const int lnf = DP_NP - 2;
  tl_t c = {s, 0, 0};

  /* fp32 parameters: wte, wpe, the layers, the final layer norm. */
  w->psz[0] = rup512(V * h * 4);
  w->psz[1] = rup512(1024 * h * 4);
  for (int l = 0; l < DP_LAYERS; l++) layer_param_sizes(h, 4, w->psz + 2 + LAYER_PARAMS * l);
  w->psz[lnf] = w->psz[lnf + 1] = rup512(h * 4);

  /* model.to("cuda"): the parameters arrive on the default stream. */
  for (int i = 0; i < DP_NP; i++) {
    w->param[i] = s_alloc(&c, w->psz[i], 0);
    c.now += jit(s, 10 * US + w->psz[i] / 20000);
  }
  flush(s, c.now);

  for (uint64_t it = 0; it < iters && !s->failed; it++) {
    /* Forward. */
    blk_t ids = s_alloc(&c, tok * 8, DP_COMPUTE), labels = s_alloc(&c, tok * 8, DP_COMPUTE);
    c.now += jit(s, 40 * US);
    blk_t emb = s_alloc(&c, th, DP_COMPUTE), pos = s_alloc(&c, seq * h * 2, DP_COMPUTE);
    kern(&c, 2 * th, 0);
    blk_t x = s_alloc(&c, th, DP_COMPUTE), xmask = s_alloc(&c, th / 2, DP_COMPUTE);
    kern(&c, 4 * th, 0);
    s_free(&c, &emb);
    s_free(&c, &pos);
    for (int l = 0; l < DP_LAYERS; l++) {
      uint64_t casts[4];
      for (int j = 0; j < 4; j++) casts[j] = w->psz[2 + LAYER_PARAMS * l + layer_weights[j]] / 2;
      layer_fwd(&c, DP_COMPUTE, &w->d, &acts[l], casts, NULL);
    }
    blk_t lnf_out = s_alloc(&c, th, DP_COMPUTE), lnf_mean = s_alloc(&c, tok * 4, DP_COMPUTE),
          lnf_rstd = s_alloc(&c, tok * 4, DP_COMPUTE);
    kern(&c, 2 * th, 0);
    blk_t wte16 = s_alloc(&c, w->psz[0] / 2, DP_COMPUTE);
    kern(&c, w->psz[0] * 3 / 2, 0);
    blk_t logits = s_alloc(&c, tok * V * 2, DP_COMPUTE);
    kern(&c, tok * V * 2, 2 * tok * h * V);
    blk_t loss_lse = s_alloc(&c, tok * 4, DP_COMPUTE), loss = s_alloc(&c, 4, DP_COMPUTE);
    kern(&c, tok * V * 2, 0);

    /* Backward: the head, then the layers in reverse; gradients fill
     * buckets that go to the comm stream as they fill. */
    blk_t gloss = s_alloc(&c, 4, DP_COMPUTE);
    blk_t dlogits = s_alloc(&c, tok * V * 2, DP_COMPUTE);
    kern(&c, 2 * tok * V * 2, 0);
    s_free(&c, &logits);
    s_free(&c, &loss_lse);
    dp_make_grad(w, &c, 0, 1);
    s_free(&c, &wte16);
    blk_t dlnf = s_alloc(&c, th, DP_COMPUTE);
    kern(&c, tok * V * 2, 2 * tok * h * V);
    s_free(&c, &dlogits);
    dp_make_grad(w, &c, lnf, 0);
    dp_make_grad(w, &c, lnf + 1, 0);
    blk_t g = s_alloc(&c, th, DP_COMPUTE);
    kern(&c, 4 * th, 0);
    s_free(&c, &dlnf);
    s_free(&c, &lnf_out);
    s_free(&c, &lnf_mean);
    s_free(&c, &lnf_rstd);
    for (int l = DP_LAYERS - 1; l >= 0; l--) {
      w->layer = l;
      layer_bwd(&c, DP_COMPUTE, &w->d, &acts[l], &g, dp_wgrad, w);
    }
    s_free(&c, &xmask);
    dp_make_grad(w, &c, 1, 0);
    kern(&c, th + w->psz[0], 0); /* embedding gradient scattered into wte's */
    s_free(&c, &g);
    s_free(&c, &x);
    s_free(&c, &ids);
    s_free(&c, &labels);
    s_free(&c, &gloss);
    s_free(&c, &loss);
    dp_launch_bucket(w, &c);
    /* DDP waits for the last all-reduce and copies the buckets back into
     * the gradients; then the buckets and comm buffers go. */
    c.now += jit(s, 500 * US);
    s_free_if(&c, &w->comm[0]);
    s_free_if(&c, &w->comm[1]);
    for (int b = 0; b < w->nbuckets; b++) {
      kern(&c, 2 * w->bucket[b].size, 0);
      s_free(&c, &w->bucket[b]);
    }
    w->nbuckets = 0;

    /* Optimizer: Adam's state on the first step, clip_grad_norm_, a foreach
     * Adam step per layer (temporaries as large as the weights), then
     * zero_grad(set_to_none=True). */
    if (it == 0)
      for (int i = 0; i < DP_NP; i++) {
        w->exp_avg[i] = s_alloc(&c, w->psz[i], DP_COMPUTE);
        w->exp_avg_sq[i] = s_alloc(&c, w->psz[i], DP_COMPUTE);
        kern(&c, 2 * w->psz[i], 0);
      }
    blk_t norms = s_alloc(&c, DP_NP * 4, DP_COMPUTE);
    kern(&c, 700 * MIB, 0);
    blk_t total = s_alloc(&c, 4, DP_COMPUTE);
    kern(&c, 0, 0);
    s_free(&c, &norms);
    blk_t coef = s_alloc(&c, 4, DP_COMPUTE);
    kern(&c, 1400 * MIB, 0);
    s_free(&c, &total);
    s_free(&c, &coef);
    for (int chunk = 0; chunk <= DP_LAYERS; chunk++) {
      int idx[4], n = 0;
      if (chunk < DP_LAYERS)
        for (int j = 0; j < 4; j++) idx[n++] = 2 + LAYER_PARAMS * chunk + layer_weights[j];
      else
        idx[n++] = 0, idx[n++] = 1;
      blk_t tmp[8];
      for (int k = 0; k < n; k++) {
        tmp[2 * k] = s_alloc(&c, w->psz[idx[k]], DP_COMPUTE);
        tmp[2 * k + 1] = s_alloc(&c, w->psz[idx[k]], DP_COMPUTE);
        kern(&c, 6 * w->psz[idx[k]], 0);
      }
      for (int k = 0; k < 2 * n; k++) s_free(&c, &tmp[k]);
    }
    for (int i = 0; i < DP_NP; i++) s_free(&c, &w->grad[i]);
    c.now += jit(s, 60 * US);
    flush(s, c.now);
  }
  for (int i = 0; i < DP_NP; i++) {
    s_free_if(&c, &w->exp_avg[i]);
    s_free_if(&c, &w->exp_avg_sq[i]);
  }
  for (int i = 0; i < DP_NP; i++) s_free(&c, &w->param[i]);
  flush(s, UINT64_MAX);
  free(acts);
  free(w);
}

/* --------------------------------------------------------------------------
 * pipeline: 1F1B pipeline parallelism, one stream (and host thread) per stage
 * ------------------------------------------------------------------------ */
enum { PP_STAGES = 4, PP_MICRO = 8, PP_LAYERS = 2, PP_MAXP = 3 + LAYER_PARAMS * PP_LAYERS + 2 };
#define PP_STREAM0 0x1000ull
#define PP_NOT_DONE UINT64_MAX

typedef struct pp_mb {
  blk_t ids, recv, act0; /* act0: layer 0's fc1 output, until layer_fwd owns it */
  layer_acts_t layer[PP_LAYERS];
  blk_t lnf, lnf_mean, lnf_rstd, logits, loss; /* last stage only */
} pp_mb_t;

typedef struct pp_stage {
  tl_t c;
  uint64_t stream;
  int nops, next_op;
  uint8_t op_bwd[2 * PP_MICRO], op_mb[2 * PP_MICRO];
  fut_t f_recv, f_act; /* the next micro-batch's buffers, asked for early */
  int np;
  uint64_t psz[PP_MAXP];
  blk_t param[PP_MAXP], grad[PP_MAXP];
  int have_grads;
  pp_mb_t mb[PP_MICRO];
} pp_stage_t;

typedef struct pp {
  dims_t d;
  uint64_t V;
  pp_stage_t st[PP_STAGES];
  uint64_t fwd_done[PP_STAGES][PP_MICRO], bwd_done[PP_STAGES][PP_MICRO];
} pp_t;

/* Megatron-style fused weight-gradient kernels accumulate straight into the
 * stage's gradient buffers: time, no allocation. */
static void pp_wgrad(void *ctx, tl_t *c, int j) {
  const dims_t *d = ctx;
  if (j == 2 || j == 4) kern(c, 0, 2 * d->tok * d->h * d->h * (j == 2 ? 3 : 1));
  if (j == 8 || j == 10) kern(c, 0, 8 * d->tok * d->h * d->h);
}

static void pp_forward(pp_t *p, int si, int m) {
  pp_stage_t *st = &p->st[si];
  tl_t *c = &st->c;
  pp_mb_t *mb = &st->mb[m];
  const dims_t *d = &p->d;
  const uint64_t th = d->tok * d->h * 2, S = st->stream;
  memset(mb, 0, sizeof *mb);
  if (m == 0) { /* nothing was asked for ahead of the step's first micro-batch */
    st->f_recv = s_submit(c, th, S);
    st->f_act = s_submit(c, 4 * th, S);
    c->now += jit(c->s, 5 * US);
  }
  mb->recv = s_complete(c, &st->f_recv);
  mb->act0 = s_complete(c, &st->f_act);
  if (m + 1 < PP_MICRO) { /* ask for the next micro-batch's buffers before computing */
    st->f_recv = s_submit(c, th, S);
    st->f_act = s_submit(c, 4 * th, S);
  }
  c->now += jit(c->s, 2 * US);
  if (si == 0) { /* the input: token ids, embedded into the receive buffer */
    mb->ids = s_alloc(c, d->tok * 8, S);
    kern(c, 3 * th, 0);
  } else { /* the previous stage's activations arrive in it */
    kern(c, th, 0);
  }
  for (int l = 0; l < PP_LAYERS; l++) {
    layer_fwd(c, S, d, &mb->layer[l], NULL, l == 0 ? &mb->act0 : NULL);
    if (l == 0) mb->act0.ptr = 0; /* owned by the layer now */
  }
  if (si == PP_STAGES - 1) {
    mb->lnf = s_alloc(c, th, S);
    mb->lnf_mean = s_alloc(c, d->tok * 4, S);
    mb->lnf_rstd = s_alloc(c, d->tok * 4, S);
    kern(c, 2 * th, 0);
    mb->logits = s_alloc(c, d->tok * p->V * 2, S);
    kern(c, d->tok * p->V * 2, 2 * d->tok * d->h * p->V);
    blk_t up = s_alloc(c, d->tok * p->V * 4, S); /* fp32 logits for the loss */
    kern(c, d->tok * p->V * 6, 0);
    mb->loss = s_alloc(c, 4, S);
    kern(c, d->tok * p->V * 4, 0);
    s_free(c, &up);
  } else {
    blk_t send = s_alloc(c, th, S);
    kern(c, 2 * th, 0);
    c->now += jit(c->s, th / 50000); /* p2p send at ~50 GB/s */
    s_free(c, &send);
  }
  p->fwd_done[si][m] = c->now;
}

static void pp_backward(pp_t *p, int si, int m) {
  pp_stage_t *st = &p->st[si];
  tl_t *c = &st->c;
  pp_mb_t *mb = &st->mb[m];
  const dims_t *d = &p->d;
  const uint64_t th = d->tok * d->h * 2, S = st->stream;
  if (!st->have_grads) { /* the step's first backward: all gradient buffers at once */
    s_batch(c, (size_t)st->np, st->psz, S, st->grad);
    kern(c, 0, 0);
    st->have_grads = 1;
  }
  blk_t g;
  if (si == PP_STAGES - 1) {
    blk_t dlogits = s_alloc(c, d->tok * p->V * 2, S);
    kern(c, 2 * d->tok * p->V * 2, 0);
    s_free(c, &mb->logits);
    s_free(c, &mb->loss);
    kern(c, 0, 2 * d->tok * d->h * p->V); /* lm head weight gradient */
    blk_t dlnf = s_alloc(c, th, S);
    kern(c, d->tok * p->V * 2, 2 * d->tok * d->h * p->V);
    s_free(c, &dlogits);
    g = s_alloc(c, th, S);
    kern(c, 4 * th, 0);
    s_free(c, &dlnf);
    s_free(c, &mb->lnf);
    s_free(c, &mb->lnf_mean);
    s_free(c, &mb->lnf_rstd);
  } else { /* the next stage's gradient arrives */
    g = s_alloc(c, th, S);
    kern(c, th, 0);
  }
  for (int l = PP_LAYERS - 1; l >= 0; l--)
    layer_bwd(c, S, d, &mb->layer[l], &g, pp_wgrad, (void *)d);
  if (si > 0) {
    blk_t send = s_alloc(c, th, S);
    kern(c, 2 * th, 0);
    c->now += jit(c->s, th / 50000);
    s_free(c, &send);
  } else {
    kern(c, th + st->psz[0], 0); /* embedding gradient */
    s_free(c, &mb->ids);
  }
  s_free(c, &g);
  s_free(c, &mb->recv);
  p->bwd_done[si][m] = c->now;
}

/* When op k of stage si may start, or PP_NOT_DONE if what it needs from a
 * neighbouring stage is not done yet. */
static uint64_t pp_ready(const pp_t *p, int si, int k) {
  const pp_stage_t *st = &p->st[si];
  int m = st->op_mb[k];
  uint64_t dep;
  if (!st->op_bwd[k])
    dep = si == 0 ? 0 : p->fwd_done[si - 1][m];
  else
    dep = si == PP_STAGES - 1 ? 0 : p->bwd_done[si + 1][m];
  if (dep == PP_NOT_DONE) return PP_NOT_DONE;
  return dep ? dep + 20 * US : 0; /* p2p latency */
}

static void gen_pipeline(syn_t *s, double scale) {
  pp_t *p = calloc(1, sizeof *p);
  if (!p) {
    fail(s, "out of memory");
    return;
  }
  /* A GPT-2-large-ish slice: hidden 1536, 2 layers per stage, micro-batch 1 x 1024. */
  p->d = (dims_t){.h = 1536, .heads = 12, .seq = 1024, .tok = 1024};
  p->V = 50257;
  const uint64_t h = p->d.h, steps = scaled(30, scale);

  for (int si = 0; si < PP_STAGES; si++) {
    pp_stage_t *st = &p->st[si];
    st->c = (tl_t){s, (uint32_t)si, 0};
    st->stream = PP_STREAM0 + (uint64_t)si;
    /* fp16 parameters: embeddings on the first stage, the head on the last. */
    if (si == 0) {
      st->psz[st->np++] = rup512(p->V * h * 2);
      st->psz[st->np++] = rup512(1024 * h * 2);
    }
    for (int l = 0; l < PP_LAYERS; l++, st->np += LAYER_PARAMS)
      layer_param_sizes(h, 2, st->psz + st->np);
    if (si == PP_STAGES - 1) {
      st->psz[st->np++] = rup512(h * 2);
      st->psz[st->np++] = rup512(h * 2);
      st->psz[st->np++] = rup512(p->V * h * 2);
    }
    for (int i = 0; i < st->np; i++) {
      st->param[i] = s_alloc(&st->c, st->psz[i], st->stream);
      st->c.now += jit(s, 10 * US + st->psz[i] / 20000);
    }
    /* 1F1B: warm-up forwards, then one forward and one backward in turn,
     * then the cool-down backwards. */
    int warm = PP_STAGES - si - 1 < PP_MICRO ? PP_STAGES - si - 1 : PP_MICRO, n = 0;
    for (int m = 0; m < warm; m++) st->op_bwd[n] = 0, st->op_mb[n++] = (uint8_t)m;
    for (int i = 0; i < PP_MICRO - warm; i++) {
      st->op_bwd[n] = 0, st->op_mb[n++] = (uint8_t)(warm + i);
      st->op_bwd[n] = 1, st->op_mb[n++] = (uint8_t)i;
    }
    for (int m = PP_MICRO - warm; m < PP_MICRO; m++) st->op_bwd[n] = 1, st->op_mb[n++] = (uint8_t)m;
    st->nops = n;
  }

  for (uint64_t step = 0; step < steps && !s->failed; step++) {
    for (int si = 0; si < PP_STAGES; si++) {
      p->st[si].next_op = 0;
      for (int m = 0; m < PP_MICRO; m++) p->fwd_done[si][m] = p->bwd_done[si][m] = PP_NOT_DONE;
    }
    for (;;) {
      int progress = 0, left = 0;
      for (int si = 0; si < PP_STAGES; si++) {
        pp_stage_t *st = &p->st[si];
        while (st->next_op < st->nops && !s->failed) {
          uint64_t ready = pp_ready(p, si, st->next_op);
          if (ready == PP_NOT_DONE) break;
          if (ready > st->c.now) st->c.now = ready;
          int k = st->next_op++, m = st->op_mb[k];
          if (st->op_bwd[k])
            pp_backward(p, si, m);
          else
            pp_forward(p, si, m);
          progress = 1;
        }
        left += st->nops - st->next_op;
      }
      if (!left || s->failed) break;
      if (!progress) {
        fail(s, "internal error: the 1F1B schedule deadlocked");
        break;
      }
    }
    /* Gradient clipping needs a global norm: every stage meets there, then
     * steps its optimizer and drops its gradients (zero_grad). */
    uint64_t barrier = 0;
    for (int si = 0; si < PP_STAGES; si++)
      if (p->st[si].c.now > barrier) barrier = p->st[si].c.now;
    barrier += 30 * US;
    uint64_t watermark = UINT64_MAX;
    for (int si = 0; si < PP_STAGES; si++) {
      pp_stage_t *st = &p->st[si];
      tl_t *c = &st->c;
      c->now = barrier + jit(s, 5 * US);
      blk_t norms = s_alloc(c, (uint64_t)st->np * 4, st->stream);
      kern(c, 300 * MIB, 0);
      blk_t total = s_alloc(c, 4, st->stream);
      kern(c, 0, 0);
      s_free(c, &norms);
      for (int l = 0; l < PP_LAYERS; l++) { /* fp32 master update per weight matrix */
        int base = (si == 0 ? 2 : 0) + LAYER_PARAMS * l;
        for (int j = 0; j < 4; j++) {
          uint64_t sz = st->psz[base + layer_weights[j]];
          blk_t up = s_alloc(c, 2 * sz, st->stream);
          kern(c, 8 * sz, 0);
          s_free(c, &up);
        }
      }
      s_free(c, &total);
      for (int i = 0; i < st->np; i++) s_free(c, &st->grad[i]);
      st->have_grads = 0;
      if (c->now < watermark) watermark = c->now;
    }
    flush(s, watermark);
  }
  for (int si = 0; si < PP_STAGES; si++) {
    pp_stage_t *st = &p->st[si];
    if (st->f_recv.id || st->f_act.id) fail(s, "internal error: a future was never collected");
    for (int i = 0; i < st->np; i++) s_free(&st->c, &st->param[i]);
  }
  flush(s, UINT64_MAX);
  free(p);
}

/* --------------------------------------------------------------------------
 * server: LLM inference with continuous batching, in bursts
 * ------------------------------------------------------------------------ */
enum { SV_LAYERS = 22, SV_MAX_BATCH = 16, SV_KV_CHUNK = 128, SV_MAX_CHUNKS = 32 };
#define SV_STREAM 0x1000ull

typedef struct sv_req {
  uint64_t arrive;
  uint32_t prompt, gen, out, nkv;
  blk_t kv[SV_MAX_CHUNKS]; /* KV-cache blocks, SV_KV_CHUNK tokens each */
} sv_req_t;

typedef struct sv {
  uint64_t h, heads, kv_heads, head_dim, inter, V, kv_chunk_bytes;
} sv_t;

static void sv_grow_kv(tl_t *c, const sv_t *m, sv_req_t *r, uint64_t tokens) {
  while ((uint64_t)r->nkv * SV_KV_CHUNK < tokens && r->nkv < SV_MAX_CHUNKS) {
    r->kv[r->nkv++] = s_alloc(c, m->kv_chunk_bytes, SV_STREAM);
    kern(c, 0, 0);
  }
}

/* The prompt's forward pass (eager attention, so [heads, P, P] scores), its
 * KV cache, and the first token's logits. */
static void sv_prefill(tl_t *c, const sv_t *m, sv_req_t *r) {
  const uint64_t P = r->prompt, ph = P * m->h * 2, S = SV_STREAM;
  const uint64_t qkv_cols = (m->heads + 2 * m->kv_heads) * m->head_dim;
  const uint64_t layer_flops = 2 * P * (m->h * qkv_cols + m->h * m->h + 3 * m->h * m->inter);
  blk_t ids = s_alloc(c, P * 8, S), hid = s_alloc(c, ph, S), res = s_alloc(c, ph, S);
  kern(c, 2 * ph, 0);
  sv_grow_kv(c, m, r, P);
  for (int l = 0; l < SV_LAYERS; l++) {
    blk_t norm = s_alloc(c, ph, S);
    kern(c, 2 * ph, 0);
    blk_t qkv = s_alloc(c, P * qkv_cols * 2, S);
    kern(c, P * qkv_cols * 2, 2 * P * m->h * qkv_cols);
    blk_t scores = s_alloc(c, m->heads * P * P * 2, S);
    kern(c, 2 * m->heads * P * P * 2, 4 * P * P * m->h);
    blk_t attn = s_alloc(c, ph, S);
    kern(c, m->heads * P * P * 2 + ph, 0);
    s_free(c, &scores);
    s_free(c, &qkv);
    s_free(c, &norm);
    blk_t gate_up = s_alloc(c, P * m->inter * 4, S);
    kern(c, P * m->inter * 4, layer_flops / 2);
    blk_t act = s_alloc(c, P * m->inter * 2, S);
    kern(c, P * m->inter * 6, 0);
    s_free(c, &gate_up);
    kern(c, 2 * ph, layer_flops / 4);
    s_free(c, &act);
    s_free(c, &attn);
  }
  blk_t logits = s_alloc(c, m->V * 4, S);
  kern(c, m->V * m->h * 2, 2 * m->V * m->h);
  blk_t tok = s_alloc(c, 8, S);
  kern(c, m->V * 4, 0);
  s_free(c, &logits);
  s_free(c, &tok);
  s_free(c, &res);
  s_free(c, &hid);
  s_free(c, &ids);
  r->out = 1;
}

/* One decode step for the n running requests: a token each. */
static void sv_decode(tl_t *c, const sv_t *m, uint64_t n, uint64_t weight_bytes,
                      uint64_t kv_bytes) {
  const uint64_t S = SV_STREAM, qkv_cols = (m->heads + 2 * m->kv_heads) * m->head_dim;
  blk_t ids = s_alloc(c, n * 8, S), hid = s_alloc(c, n * m->h * 2, S),
        res = s_alloc(c, n * m->h * 2, S);
  kern(c, n * m->h * 4, 0);
  blk_t qkv = s_alloc(c, n * qkv_cols * 2, S), attn = s_alloc(c, n * m->h * 2, S);
  blk_t mlp = s_alloc(c, n * m->inter * 4, S);
  /* Decoding is bound by reading the weights and the KV cache once a step. */
  kern(c, weight_bytes + kv_bytes, 2 * n * weight_bytes / 2);
  s_free(c, &mlp);
  s_free(c, &attn);
  s_free(c, &qkv);
  blk_t logits = s_alloc(c, n * m->V * 4, S);
  kern(c, m->V * m->h * 2, 2 * n * m->V * m->h);
  blk_t probs = s_alloc(c, n * m->V * 4, S);
  kern(c, 2 * n * m->V * 4, 0);
  s_free(c, &logits);
  blk_t next = s_alloc(c, n * 8, S);
  kern(c, n * m->V * 4, 0);
  s_free(c, &probs);
  s_free(c, &res);
  s_free(c, &hid);
  s_free(c, &ids);
  s_free(c, &next);
}

static void gen_server(syn_t *s, double scale) {
  /* A TinyLlama-like 1.1B model: hidden 2048, 22 layers, grouped-query
   * attention (32 heads, 4 KV heads of 64), MLP 5632, vocabulary 32000. */
  const sv_t m = {.h = 2048, .heads = 32, .kv_heads = 4, .head_dim = 64, .inter = 5632,
                  .V = 32000, .kv_chunk_bytes = SV_KV_CHUNK * SV_LAYERS * 2 * 4 * 64 * 2};
  const uint64_t per_burst = scaled(28, scale);
  const int bursts = 6 + (int)rnd_below(s, 3);
  enum { NW = 1 + 9 * SV_LAYERS + 2 };
  blk_t weight[NW];
  uint64_t weight_bytes = 0;
  tl_t c = {s, 0, 0};
  sv_req_t *req = calloc(per_burst + per_burst / 2 + 1, sizeof *req);
  uint32_t *active = calloc(SV_MAX_BATCH, sizeof *active);
  if (!req || !active) {
    fail(s, "out of memory");
    free(req);
    free(active);
    return;
  }

  /* Load the fp16 weights on the default stream. */
  {
    const uint64_t h = m.h, kvw = h * m.kv_heads * m.head_dim;
    uint64_t sz[NW];
    int n = 0;
    sz[n++] = m.V * h * 2;
    for (int l = 0; l < SV_LAYERS; l++) {
      const uint64_t lw[9] = {h * 2, h * h * 2, kvw * 2, kvw * 2, h * h * 2,
                              h * 2, h * m.inter * 2, h * m.inter * 2, m.inter * h * 2};
      for (int j = 0; j < 9; j++) sz[n++] = lw[j];
    }
    sz[n++] = h * 2;
    sz[n++] = m.V * h * 2;
    for (int i = 0; i < NW; i++) {
      weight[i] = s_alloc(&c, sz[i], 0);
      weight_bytes += weight[i].size;
      c.now += jit(s, 10 * US + sz[i] / 20000);
    }
  }
  c.now += jit(s, 2 * MS);

  for (int b = 0; b < bursts && !s->failed; b++) {
    /* Requests of this burst: +-25% around per_burst, arriving 0-3 ms apart. */
    uint64_t nreq = per_burst - per_burst / 4 + rnd_below(s, per_burst / 2 + 1), arr = c.now;
    for (uint64_t i = 0; i < nreq; i++) {
      memset(&req[i], 0, sizeof req[i]);
      arr += rnd_below(s, 3 * MS);
      req[i].arrive = arr;
      req[i].prompt = (uint32_t)heavy(s, 24, 45, 2048);
      req[i].gen = (uint32_t)heavy(s, 12, 40, 1024);
    }
    uint64_t next = 0, nact = 0;
    while ((next < nreq || nact) && !s->failed) {
      if (!nact && req[next].arrive > c.now) c.now = req[next].arrive;
      while (nact < SV_MAX_BATCH && next < nreq && req[next].arrive <= c.now) {
        sv_prefill(&c, &m, &req[next]);
        active[nact++] = (uint32_t)next++;
      }
      uint64_t kv_bytes = 0;
      for (uint64_t i = 0; i < nact; i++) kv_bytes += req[active[i]].nkv * m.kv_chunk_bytes;
      sv_decode(&c, &m, nact, weight_bytes, kv_bytes);
      for (uint64_t i = 0; i < nact;) {
        sv_req_t *r = &req[active[i]];
        r->out++;
        sv_grow_kv(&c, &m, r, (uint64_t)r->prompt + r->out);
        if (r->out >= r->gen) { /* finished: its KV cache goes */
          for (uint32_t k = 0; k < r->nkv; k++) s_free(&c, &r->kv[k]);
          r->nkv = 0;
          active[i] = active[--nact];
        } else {
          i++;
        }
      }
      flush(s, c.now);
    }
    if (b + 1 < bursts) s_idle(&c, rnd_between(s, 20, 100) * MS);
  }
  c.now += jit(s, 1 * MS);
  for (int i = 0; i < NW; i++) s_free(&c, &weight[i]);
  flush(s, UINT64_MAX);
  free(req);
  free(active);
}

/* --------------------------------------------------------------------------
 * The public entry points
 * ------------------------------------------------------------------------ */
typedef struct workload {
  const char *name, *what;
  void (*gen)(syn_t *s, double scale);
} workload_t;

static const workload_t workloads[] = {
    {"dp",
     "data-parallel training: a 12-layer transformer, activations and 25 MiB gradient "
     "buckets on compute stream 0x1000, all-reduce buffers on comm stream 0x2000 "
     "(record_stream), Adam; 80 iterations",
     gen_dp},
    {"pipeline",
     "1F1B pipeline parallelism: 4 stages on streams 0x1000-0x1003 (threads 0-3), 8 "
     "micro-batches per step, the next micro-batch's buffers asked for with async "
     "allocations, gradient buffers as batches; 30 steps",
     gen_pipeline},
    {"server",
     "LLM inference server: 6-8 bursts of about 28 requests (heavy-tailed prompt lengths), "
     "KV-cache blocks grown every 128 tokens, per-step temporaries, 20-100 ms idle gaps",
     gen_server},
};

static const workload_t *find(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < sizeof workloads / sizeof workloads[0]; i++)
    if (!strcmp(workloads[i].name, name)) return &workloads[i];
  return NULL;
}

const char *gma_synth_describe(const char *name) {
  const workload_t *w = find(name);
  return w ? w->what : NULL;
}

static int set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

int gma_synth_write(const char *name, FILE *out, double scale, uint64_t seed, char *err,
                    size_t errlen) {
  const workload_t *w = find(name);
  if (!w)
    return set_err(err, errlen, "unknown synthetic workload '%s' (known: dp, pipeline, server)",
                 name ? name : "(null)");
  if (!out) return set_err(err, errlen, "synthetic workload '%s': no output stream", name);
  if (!(scale > 0.0 && scale <= 1000.0))
    return set_err(err, errlen, "synthetic workload '%s': scale %g is not in (0, 1000]", name,
                 scale);

  syn_t s = {.out = out, .next_ptr = 0x7f3a00000000ull};
  /* splitmix64 of the seed and the workload's name: any seed, even 0, gives
   * a good xorshift state, and workloads do not share random streams. */
  uint64_t z = seed;
  for (const char *p = name; *p; p++) z = z * 131 + (unsigned char)*p;
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  s.rng = z ? z : 0x2545f4914f6cdd1dull;

  errno = 0;
  if (fputs("Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status\n", out) == EOF)
    fail(&s, "write error: %s", strerror(errno ? errno : EIO));
  if (!s.failed) w->gen(&s, scale);
  if (!s.failed && (s.live || s.pending || s.n))
    fail(&s, "internal error: %" PRIu64 " allocations and %" PRIu64
             " futures still live at the end",
         s.live, s.pending);
  if (!s.failed && (fflush(out) == EOF || ferror(out)))
    fail(&s, "write error: %s", strerror(errno ? errno : EIO));
  free(s.ev);
  if (s.failed) return set_err(err, errlen, "synthetic workload '%s': %s", name, s.msg);
  return 0;
}
