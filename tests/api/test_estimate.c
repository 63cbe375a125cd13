/* gma_estimate_transformer: exact bytes for small models computed by hand
 * (one per mode and per phase the peak can fall in), every refused input
 * with the field its message names, and the struct size rules (an older,
 * shorter struct is read and written only up to its size; impossible sizes
 * are refused and change nothing). Public API only; no allocator. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

/* hidden 8, intermediate 16, 2 layers, vocab 10, 2 heads, seq 4, batch 2. */
static gma_transformer_t small_model(void) {
  gma_transformer_t m = GMA_TRANSFORMER_INIT;
  m.hidden = 8;
  m.intermediate = 16;
  m.layers = 2;
  m.vocab = 10;
  m.heads = 2;
  m.seq_len = 4;
  m.batch = 2;
  m.dtype_bytes = 4;
  return m;
}

static gma_estimate_t estimate_of(const gma_transformer_t *m) {
  gma_estimate_t e = GMA_ESTIMATE_INIT;
  CHECK_OK(gma_estimate_transformer(m, &e));
  CHECK(e.size == sizeof e);
  uint64_t sum = e.weights_bytes + e.weight_copy_bytes + e.kv_cache_bytes + e.activation_bytes +
                 e.logits_bytes + e.gradient_bytes + e.optimizer_bytes + e.step_temp_bytes;
  CHECK(sum == e.total_bytes);
  return e;
}

/* Training, grouped-query (1 kv head: dkv 4), fp32, eager attention, Adam,
 * gradients live through the forward. Layer matrices 2*64 + 2*8*4 + 3*8*16 =
 * 576, +16 norm = 592; params 2*592 + 2*80 + 8 = 1352. One layer keeps
 * T(6d + 2dkv)a = 8*56*4 = 1792, 3Tfa = 1536, bhs^2a = 256: 3584; all layers
 * and the final norm 7168 + 512 = 7680. Logits 320 + fp32 log-softmax and its
 * gradient 640. Backward start: 7680 + 960 + 5408 = 14048 beats the step's
 * 5408 + 2*128*4. */
static void training_backward(void) {
  gma_transformer_t m = small_model();
  m.kv_heads = 1;
  m.mode = GMA_ESTIMATE_TRAINING;
  gma_estimate_t e = estimate_of(&m);
  CHECK(e.params == 1352);
  CHECK(e.weights_bytes == 5408);
  CHECK(e.layer_activation_bytes == 3584);
  CHECK(e.activation_bytes == 7680);
  CHECK(e.logits_bytes == 960);
  CHECK(e.gradient_bytes == 5408);
  CHECK(e.optimizer_bytes == 10816);
  CHECK(e.weight_copy_bytes == 0 && e.kv_cache_bytes == 0 && e.step_temp_bytes == 0);
  CHECK(e.phase == GMA_PHASE_BACKWARD);
  CHECK(e.total_bytes == 30272);
}

/* Inference with a 6-token KV cache, a written-out softmax, bf16 autocast.
 * Copy of the matrices (2*576 + 80)*2 = 2464; cache 2*2*2*6*4*2 = 384.
 * Attention: T(4d + 2dkv)a = 640 plus 4 score tensors b*h*s*6*a = 768: 1408;
 * feed-forward 256 + 768 = 1024; head 256 + 160. */
static void inference_layer(void) {
  gma_transformer_t m = small_model();
  m.kv_heads = 1;
  m.kv_cache_tokens = 6;
  m.attention = GMA_ATTENTION_EAGER_EXP;
  m.act_dtype_bytes = 2;
  gma_estimate_t e = estimate_of(&m);
  CHECK(e.weight_copy_bytes == 2464);
  CHECK(e.kv_cache_bytes == 384);
  CHECK(e.activation_bytes == 1408 && e.layer_activation_bytes == 1408);
  CHECK(e.logits_bytes == 0);
  CHECK(e.phase == GMA_PHASE_LAYER);
  CHECK(e.total_bytes == 5408 + 2464 + 384 + 1408);
}

/* Inference where the head is the peak: a large vocabulary. */
static void inference_head(void) {
  gma_transformer_t m = small_model();
  m.vocab = 1000;
  gma_estimate_t e = estimate_of(&m);
  CHECK(e.phase == GMA_PHASE_HEAD);
  CHECK(e.logits_bytes == 8 * 1000 * 4);
  CHECK(e.activation_bytes == 2 * 8 * 8 * 4);
}

/* Forward with autograd, fused attention, plain feed-forward, tied head,
 * bf16 parameters. Layer matrices 512, params 2*528 + 80 + 8 = 1144. One
 * layer keeps 8*64*2 + 2*8*16*2 + logsumexp 2*2*4*4 = 1600. */
static void forward_end(void) {
  gma_transformer_t m = small_model();
  m.mode = GMA_ESTIMATE_FORWARD;
  m.attention = GMA_ATTENTION_FUSED;
  m.plain_ffn = 1;
  m.tied_embeddings = 1;
  m.dtype_bytes = 2;
  gma_estimate_t e = estimate_of(&m);
  CHECK(e.params == 1144);
  CHECK(e.layer_activation_bytes == 1600);
  CHECK(e.activation_bytes == 3456);
  CHECK(e.logits_bytes == 160);
  CHECK(e.phase == GMA_PHASE_FORWARD_END);
  CHECK(e.total_bytes == 2288 + 3456 + 160);
}

/* Training whose peak is the step: bf16 parameters with fp32 masters and
 * moments (12 bytes a parameter), foreach temporaries in fp32, gradients
 * released before the forward. Params 1480. */
static void training_step(void) {
  gma_transformer_t m = small_model();
  m.mode = GMA_ESTIMATE_TRAINING;
  m.optimizer = GMA_OPTIMIZER_ADAM_MASTER;
  m.step_foreach = 1;
  m.grads_released = 1;
  m.dtype_bytes = 2;
  gma_estimate_t e = estimate_of(&m);
  CHECK(e.params == 1480);
  CHECK(e.phase == GMA_PHASE_STEP);
  CHECK(e.optimizer_bytes == 17760);
  CHECK(e.step_temp_bytes == 5920);
  CHECK(e.gradient_bytes == 2960 && e.activation_bytes == 0 && e.logits_bytes == 0);
  CHECK(e.total_bytes == 2960 + 2960 + 17760 + 5920);
  m.step_foreach = 0; /* two of the largest tensor (d x f) in fp32: the backward start wins */
  m.optimizer = GMA_OPTIMIZER_SGD;
  e = estimate_of(&m);
  CHECK(e.phase == GMA_PHASE_BACKWARD && e.optimizer_bytes == 0);
  CHECK(e.gradient_bytes == 10 * 8 * 2); /* the head's alone */
}

/* The call fails with GMA_ERR_INVALID_ARGUMENT and a message holding want. */
static void refused(const gma_transformer_t *m, const char *want) {
  gma_estimate_t e = GMA_ESTIMATE_INIT;
  e.total_bytes = 12345;
  CHECK_ST(gma_estimate_transformer(m, &e), GMA_ERR_INVALID_ARGUMENT);
  if (!strstr(gma_last_error(), want)) {
    fprintf(stderr, "message lacks '%s': %s\n", want, gma_last_error());
    exit(1);
  }
  CHECK(e.total_bytes == 12345); /* untouched */
}

static void bad_inputs(void) {
  gma_transformer_t m = small_model();
  gma_estimate_t e = GMA_ESTIMATE_INIT;
  CHECK_ST(gma_estimate_transformer(NULL, &e), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "model is NULL"));
  CHECK_ST(gma_estimate_transformer(&m, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(gma_last_error(), "out is NULL"));
  m.layers = 0;
  refused(&m, "model->layers is 0; set it to 1 or more");
  m = small_model(), m.hidden = 0;
  refused(&m, "model->hidden is 0");
  m = small_model(), m.heads = 3;
  refused(&m, "model->heads 3 does not divide model->hidden 8");
  m = small_model(), m.heads = 3;
  refused(&m, "(2 does)");
  m = small_model(), m.kv_heads = 3;
  refused(&m, "model->kv_heads 3 does not divide model->heads 2");
  m = small_model(), m.dtype_bytes = 3;
  refused(&m, "model->dtype_bytes is 3; a parameter's bytes must be 1, 2, 4 or 8");
  m = small_model(), m.act_dtype_bytes = 16;
  refused(&m, "act_dtype_bytes is 16");
  m = small_model(), m.mode = (gma_estimate_mode_t)7;
  refused(&m, "model->mode is 7");
  m = small_model(), m.attention = (gma_attention_t)9;
  refused(&m, "model->attention is 9");
  m = small_model(), m.optimizer = (gma_optimizer_t)4;
  refused(&m, "model->optimizer is 4");
  m = small_model(), m.mode = GMA_ESTIMATE_TRAINING, m.kv_cache_tokens = 8;
  refused(&m, "for GMA_ESTIMATE_INFERENCE only");
  m = small_model(), m.kv_cache_tokens = 2;
  refused(&m, "below model->seq_len 4");
  m = small_model(), m.hidden = (uint64_t)1 << 40, m.heads = 1, m.layers = 1 << 20;
  refused(&m, "passes 2^64 - 1 bytes");
  m = small_model(), m.vocab = UINT64_MAX;
  refused(&m, "the dimensions are counts, not bytes");
}

static void struct_sizes(void) {
  gma_transformer_t m = small_model();
  gma_estimate_t e = GMA_ESTIMATE_INIT;
  size_t bad[] = {0, sizeof(size_t) - 1, sizeof m + 8};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    m.size = bad[i];
    refused(&m, "GMA_TRANSFORMER_INIT");
  }
  m = small_model();
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    e.size = bad[i];
    CHECK_ST(gma_estimate_transformer(&m, &e), GMA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(gma_last_error(), "GMA_ESTIMATE_INIT"));
  }
  /* An older model struct that ends before mode: what follows counts as 0
   * (inference, eager, Adam), whatever the bytes past size hold. */
  gma_transformer_t full = small_model();
  full.mode = GMA_ESTIMATE_TRAINING;
  full.size = offsetof(gma_transformer_t, mode);
  gma_transformer_t plain = small_model();
  CHECK(estimate_of(&full).total_bytes == estimate_of(&plain).total_bytes);
  /* An older out struct: only its first size bytes are written. */
  struct {
    gma_estimate_t e;
    unsigned char canary[16];
  } box;
  memset(&box, 0xab, sizeof box);
  box.e.size = offsetof(gma_estimate_t, kv_cache_bytes);
  CHECK_OK(gma_estimate_transformer(&plain, &box.e));
  CHECK(box.e.total_bytes == estimate_of(&plain).total_bytes);
  const unsigned char *past = (const unsigned char *)&box.e + box.e.size;
  for (size_t i = 0; i < sizeof box.e - box.e.size; i++) CHECK(past[i] == 0xab);
}

int main(void) {
  training_backward();
  inference_layer();
  inference_head();
  forward_end();
  training_step();
  bad_inputs();
  struct_sizes();
  printf("test_estimate: ok\n");
  return 0;
}
