/* Owns gma_estimate_transformer: the argument checks and the arithmetic of a
 * transformer's peak memory (docs/estimate.md lists what is counted and why).
 * It is arithmetic on the caller's numbers alone: no allocator, no device.
 *
 * Notation: d hidden, f intermediate, L layers, V vocab, h heads, dkv the
 * key/value width (d / h x kv_heads), b batch, s seq_len, T = b x s tokens,
 * w bytes of a parameter, a bytes of an activation. */
#include <inttypes.h>
#include <string.h>

#include "base/error.h"

#define FN "gma_estimate_transformer"
#define FP32 4u /* the loss's log-softmax, its gradient and fused attention's logsumexp */

typedef struct est {
  gma_transformer_t m; /* the caller's fields, defaults applied */
  uint64_t dkv, tokens, ffn_mats;
  int overflow;        /* some product or sum passed 2^64 - 1 */
} est_t;

static uint64_t mul(est_t *e, uint64_t x, uint64_t y) {
  uint64_t r;
  if (__builtin_mul_overflow(x, y, &r)) {
    e->overflow = 1;
    return UINT64_MAX;
  }
  return r;
}

static uint64_t mul3(est_t *e, uint64_t x, uint64_t y, uint64_t z) {
  return mul(e, mul(e, x, y), z);
}

static uint64_t add(est_t *e, uint64_t x, uint64_t y) {
  uint64_t r;
  if (__builtin_add_overflow(x, y, &r)) {
    e->overflow = 1;
    return UINT64_MAX;
  }
  return r;
}

static uint64_t max2(uint64_t x, uint64_t y) { return x > y ? x : y; }

static int dtype_ok(uint64_t n) { return n == 1 || n == 2 || n == 4 || n == 8; }

/* A divisor of n near want, to suggest in a message. */
static uint64_t near_divisor(uint64_t n, uint64_t want) {
  for (uint64_t k = 0; k <= want && k < (1u << 20); k++) {
    if (want > k && n % (want - k) == 0) return want - k;
    if (want + k <= n && n % (want + k) == 0) return want + k;
  }
  return 1;
}

static gma_status_t bad(const char *fmt_field, uint64_t v, const char *help) {
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT, FN ": model->%s is %" PRIu64 "; %s", fmt_field,
                        v, help);
}

/* The fields that must be set, and the dtypes. */
static gma_status_t check_sizes(const gma_transformer_t *m) {
  static const char need[] = "set it to 1 or more (GMA_TRANSFORMER_INIT leaves it 0)";
  if (!m->hidden) return bad("hidden", 0, need);
  if (!m->layers) return bad("layers", 0, need);
  if (!m->vocab) return bad("vocab", 0, need);
  if (!m->heads) return bad("heads", 0, need);
  if (!m->seq_len) return bad("seq_len", 0, need);
  if (!dtype_ok(m->dtype_bytes))
    return bad("dtype_bytes", m->dtype_bytes,
               "a parameter's bytes must be 1, 2, 4 or 8 (4 for fp32, 2 for bf16/fp16)");
  if (m->act_dtype_bytes && !dtype_ok(m->act_dtype_bytes))
    return bad("act_dtype_bytes", m->act_dtype_bytes,
               "an activation's bytes must be 1, 2, 4 or 8, or 0 for dtype_bytes");
  return GMA_OK;
}

/* Heads against hidden, the enums, and the fields that belong to one mode. */
static gma_status_t check_shape(const gma_transformer_t *m) {
  if (m->hidden % m->heads)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          FN ": model->heads %" PRIu64 " does not divide model->hidden %" PRIu64
                             ": each head takes hidden / heads features; use a head count that "
                             "divides it (%" PRIu64 " does) or change hidden",
                          m->heads, m->hidden, near_divisor(m->hidden, m->heads));
  if (m->kv_heads > m->heads || m->heads % m->kv_heads)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          FN ": model->kv_heads %" PRIu64 " does not divide model->heads %" PRIu64
                             ": each key/value head serves heads / kv_heads query heads; use a "
                             "divisor of heads (%" PRIu64 " is one), or 0 for kv_heads = heads",
                          m->kv_heads, m->heads, near_divisor(m->heads, m->kv_heads));
  if ((unsigned)m->mode > GMA_ESTIMATE_TRAINING)
    return bad("mode", (uint64_t)m->mode,
               "use GMA_ESTIMATE_INFERENCE, GMA_ESTIMATE_FORWARD or GMA_ESTIMATE_TRAINING");
  if ((unsigned)m->attention > GMA_ATTENTION_FUSED)
    return bad("attention", (uint64_t)m->attention,
               "use GMA_ATTENTION_EAGER, GMA_ATTENTION_EAGER_EXP or GMA_ATTENTION_FUSED");
  if ((unsigned)m->optimizer > GMA_OPTIMIZER_SGD)
    return bad("optimizer", (uint64_t)m->optimizer,
               "use GMA_OPTIMIZER_ADAM, GMA_OPTIMIZER_ADAM_MASTER, GMA_OPTIMIZER_SGD_MOMENTUM "
               "or GMA_OPTIMIZER_SGD");
  if (m->kv_cache_tokens && m->mode != GMA_ESTIMATE_INFERENCE)
    return bad("kv_cache_tokens", m->kv_cache_tokens,
               "a KV cache is counted for GMA_ESTIMATE_INFERENCE only; set it to 0");
  if (m->kv_cache_tokens && m->kv_cache_tokens < m->seq_len)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          FN ": model->kv_cache_tokens %" PRIu64 " is below model->seq_len %" PRIu64
                             ": the cache holds the new tokens too; set it to seq_len or more",
                          m->kv_cache_tokens, m->seq_len);
  return GMA_OK;
}

/* Copies the caller's first size bytes and applies the defaults. */
static gma_status_t load_model(const gma_transformer_t *model, est_t *e) {
  gma_status_t st = gma__struct_size_check(model->size, sizeof(gma_transformer_t), FN, "model",
                                           "GMA_TRANSFORMER_INIT");
  if (st != GMA_OK) return st;
  memset(e, 0, sizeof *e);
  memcpy(&e->m, model, model->size);
  gma_transformer_t *m = &e->m;
  if ((st = check_sizes(m)) != GMA_OK) return st;
  if (!m->kv_heads) m->kv_heads = m->heads;
  if (!m->intermediate) m->intermediate = mul(e, 4, m->hidden);
  if (!m->batch) m->batch = 1;
  if (!m->act_dtype_bytes) m->act_dtype_bytes = m->dtype_bytes;
  if ((st = check_shape(m)) != GMA_OK) return st;
  e->dkv = m->hidden / m->heads * m->kv_heads;
  e->tokens = mul(e, m->batch, m->seq_len);
  e->ffn_mats = m->plain_ffn ? 2 : 3;
  return GMA_OK;
}

/* Elements of one layer's matrices: q and o (d x d), k and v (d x dkv), the
 * feed-forward block's (d x f each). */
static uint64_t layer_matrix_elems(est_t *e) {
  const gma_transformer_t *m = &e->m;
  uint64_t attn = add(e, mul3(e, 2, m->hidden, m->hidden), mul3(e, 2, m->hidden, e->dkv));
  return add(e, attn, mul3(e, e->ffn_mats, m->hidden, m->intermediate));
}

/* Parameters: L x (matrices + two norm vectors), the embedding, the head
 * unless tied, the final norm. */
static uint64_t param_count(est_t *e) {
  const gma_transformer_t *m = &e->m;
  uint64_t layer = add(e, layer_matrix_elems(e), mul(e, 2, m->hidden));
  uint64_t embed = mul3(e, m->vocab, m->hidden, m->tied_embeddings ? 1 : 2);
  return add(e, add(e, mul(e, m->layers, layer), embed), m->hidden);
}

/* Score-sized tensors attention keeps for backward in one layer. */
static uint64_t saved_scores(est_t *e) {
  const gma_transformer_t *m = &e->m;
  uint64_t bh = mul(e, m->batch, m->heads);
  if (m->attention == GMA_ATTENTION_FUSED) return mul3(e, bh, m->seq_len, FP32);
  uint64_t one = mul3(e, mul(e, bh, m->seq_len), m->seq_len, m->act_dtype_bytes);
  return m->attention == GMA_ATTENTION_EAGER_EXP ? mul(e, 2, one) : one;
}

/* What one layer keeps for backward: T x d tensors for the first norm's input
 * and output, q, the attention's output before its projection, the residual
 * after attention and the second norm's output (6), k and v (T x dkv each);
 * the feed-forward block's inner tensors (T x f: the projection and its
 * activation, and the up projection when gated); the scores. */
static uint64_t layer_saved(est_t *e) {
  const gma_transformer_t *m = &e->m;
  uint64_t width = add(e, mul(e, 6, m->hidden), mul(e, 2, e->dkv));
  uint64_t hid = mul3(e, e->tokens, width, m->act_dtype_bytes);
  uint64_t ffn = mul3(e, mul(e, e->tokens, m->intermediate), e->ffn_mats, m->act_dtype_bytes);
  return add(e, add(e, hid, ffn), saved_scores(e));
}

/* One layer's working set without autograd, at its larger half. Attention:
 * the residual, the norm's output, q, k, v, the attention's output, and the
 * score-sized tensors alive at once: the scores and the softmax's output
 * (eager); the scores, the scores less their row maximum, exp's output and
 * the quotient (a softmax written out). Feed-forward: the residual, the
 * norm's output and the inner tensors. */
static uint64_t layer_working(est_t *e) {
  const gma_transformer_t *m = &e->m;
  uint64_t a = m->act_dtype_bytes;
  uint64_t keys = m->kv_cache_tokens ? m->kv_cache_tokens : m->seq_len;
  uint64_t width = add(e, mul(e, 4, m->hidden), mul(e, 2, e->dkv));
  uint64_t attn = mul3(e, e->tokens, width, a);
  uint64_t bh = mul(e, m->batch, m->heads);
  if (m->attention == GMA_ATTENTION_FUSED) attn = add(e, attn, mul3(e, bh, m->seq_len, FP32));
  else {
    uint64_t n = m->attention == GMA_ATTENTION_EAGER_EXP ? 4 : 2;
    attn = add(e, attn, mul3(e, mul3(e, n, bh, m->seq_len), keys, a));
  }
  uint64_t ffn = mul3(e, e->tokens, mul(e, 2, m->hidden), a);
  ffn = add(e, ffn, mul3(e, mul(e, e->tokens, m->intermediate), e->ffn_mats, a));
  return max2(attn, ffn);
}

static void estimate_inference(est_t *e, gma_estimate_t *r) {
  const gma_transformer_t *m = &e->m;
  uint64_t a = m->act_dtype_bytes;
  r->kv_cache_bytes =
      mul3(e, mul3(e, 2, m->layers, m->batch), mul(e, m->kv_cache_tokens, e->dkv), a);
  r->layer_activation_bytes = layer_working(e);
  uint64_t head_hidden = mul3(e, 2, e->tokens, mul(e, m->hidden, a));
  uint64_t logits = mul3(e, e->tokens, m->vocab, a);
  if (add(e, head_hidden, logits) > r->layer_activation_bytes) {
    r->phase = GMA_PHASE_HEAD;
    r->activation_bytes = head_hidden;
    r->logits_bytes = logits;
  } else {
    r->phase = GMA_PHASE_LAYER;
    r->activation_bytes = r->layer_activation_bytes;
  }
}

static uint64_t optimizer_state(est_t *e, uint64_t params) {
  switch (e->m.optimizer) {
    case GMA_OPTIMIZER_ADAM: return mul3(e, 2, params, e->m.dtype_bytes);
    case GMA_OPTIMIZER_ADAM_MASTER: return mul(e, 12, params);
    case GMA_OPTIMIZER_SGD_MOMENTUM: return mul(e, params, e->m.dtype_bytes);
    case GMA_OPTIMIZER_SGD: return 0;
  }
  return 0;
}

/* The optimizer step's temporaries: one copy of the parameters (foreach), or
 * two of the largest parameter tensor (a loop over tensors). Adam with fp32
 * masters computes in fp32. */
static uint64_t step_temps(est_t *e, uint64_t params) {
  const gma_transformer_t *m = &e->m;
  if (m->optimizer == GMA_OPTIMIZER_SGD) return 0;
  uint64_t bytes = m->optimizer == GMA_OPTIMIZER_ADAM_MASTER ? FP32 : m->dtype_bytes;
  if (m->step_foreach) return mul(e, params, bytes);
  uint64_t largest = max2(mul(e, m->vocab, m->hidden), mul(e, m->hidden, m->intermediate));
  largest = max2(largest, mul(e, m->hidden, m->hidden));
  return mul3(e, 2, largest, bytes);
}

/* Training: the larger of the start of backward (every layer's saved tensors,
 * the logits, the fp32 log-softmax and its gradient, and the gradients then
 * live: all of them, or the head's alone when they were released) and the
 * optimizer step (every gradient and the step's temporaries). */
static void estimate_training(est_t *e, uint64_t params, uint64_t acts, uint64_t copy,
                              gma_estimate_t *r) {
  const gma_transformer_t *m = &e->m;
  uint64_t grads = mul(e, params, m->dtype_bytes);
  uint64_t head_grad = mul3(e, m->vocab, m->hidden, m->dtype_bytes);
  uint64_t loss = mul3(e, 2, mul(e, e->tokens, m->vocab), FP32);
  uint64_t logits = add(e, mul3(e, e->tokens, m->vocab, m->act_dtype_bytes), loss);
  uint64_t bwd_grads = m->grads_released ? head_grad : grads;
  uint64_t bwd = add(e, add(e, acts, copy), add(e, logits, bwd_grads));
  uint64_t temps = step_temps(e, params);
  if (add(e, grads, temps) > bwd) {
    r->phase = GMA_PHASE_STEP;
    r->gradient_bytes = grads;
    r->step_temp_bytes = temps;
  } else {
    r->phase = GMA_PHASE_BACKWARD;
    r->activation_bytes = acts;
    r->weight_copy_bytes = copy;
    r->logits_bytes = logits;
    r->gradient_bytes = bwd_grads;
  }
  r->optimizer_bytes = optimizer_state(e, params);
}

static void estimate(est_t *e, gma_estimate_t *r) {
  const gma_transformer_t *m = &e->m;
  uint64_t a = m->act_dtype_bytes;
  r->params = param_count(e);
  r->weights_bytes = mul(e, r->params, m->dtype_bytes);
  /* Autocast holds every matrix cast to the activations' dtype, the head
   * included (an embedding lookup casts nothing). */
  uint64_t copy = 0;
  if (a < m->dtype_bytes)
    copy = mul(e, add(e, mul(e, m->layers, layer_matrix_elems(e)), mul(e, m->vocab, m->hidden)), a);
  if (m->mode == GMA_ESTIMATE_INFERENCE) {
    r->weight_copy_bytes = copy;
    estimate_inference(e, r);
  } else {
    r->layer_activation_bytes = layer_saved(e);
    uint64_t acts = add(e, mul(e, m->layers, r->layer_activation_bytes),
                        mul3(e, 2, e->tokens, mul(e, m->hidden, a)));
    if (m->mode == GMA_ESTIMATE_FORWARD) {
      r->phase = GMA_PHASE_FORWARD_END;
      r->activation_bytes = acts;
      r->weight_copy_bytes = copy;
      r->logits_bytes = mul3(e, e->tokens, m->vocab, a);
    } else {
      estimate_training(e, r->params, acts, copy, r);
    }
  }
  uint64_t t = add(e, r->weights_bytes, r->weight_copy_bytes);
  t = add(e, t, add(e, r->kv_cache_bytes, r->activation_bytes));
  t = add(e, t, add(e, r->logits_bytes, r->gradient_bytes));
  r->total_bytes = add(e, t, add(e, r->optimizer_bytes, r->step_temp_bytes));
}

gma_status_t gma_estimate_transformer(const gma_transformer_t *model, gma_estimate_t *out) {
  if (!model) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, FN ": model is NULL");
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, FN ": out is NULL");
  gma_status_t st =
      gma__struct_size_check(out->size, sizeof(gma_estimate_t), FN, "out", "GMA_ESTIMATE_INIT");
  if (st != GMA_OK) return st;
  est_t e;
  if ((st = load_model(model, &e)) != GMA_OK) return st;
  gma_estimate_t r = GMA_ESTIMATE_INIT;
  estimate(&e, &r);
  if (e.overflow)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          FN ": the estimate passes 2^64 - 1 bytes (hidden %" PRIu64
                             ", intermediate %" PRIu64 ", layers %" PRIu64 ", vocab %" PRIu64
                             ", batch %" PRIu64 ", seq_len %" PRIu64
                             "); the dimensions are counts, not bytes: check them",
                          e.m.hidden, e.m.intermediate, e.m.layers, e.m.vocab, e.m.batch,
                          e.m.seq_len);
  size_t n = out->size;
  r.size = n;
  memcpy(out, &r, n);
  return GMA_OK;
}
