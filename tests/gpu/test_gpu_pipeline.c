/* A 4-stage pipeline on the CUDA backend, one thread and one gma stream per
 * stage. For each micro-batch a stage asks gma_alloc_async for the NEXT
 * micro-batch's output buffer before it waits for the current one, so the
 * worker serves that request while the current batch "computes" (a fill of
 * the output with the stage's pattern on the stage's stream). A stage's
 * output goes to the next stage with its stream ordered after the fill
 * (gma_stream_wait_stream: an event and cuStreamWaitEvent); the next stage reads a sample of it on its own stream, declares
 * that use with gma_record_stream and frees it at once. The last stage
 * samples its own output. Every sample must hold the pattern its producer
 * wrote: a buffer handed out again while a previous owner's fill or a
 * consumer's read was still queued would break one.
 *
 * The race window is held open on purpose: before a consuming stage queues
 * its read of the input, it holds its own stream (cuStreamWaitValue32 on a
 * pinned word, drv_hold) and lets it go only after the worker has served its
 * next micro-batch's buffer, so the read (and, in the last stage, the read
 * of its own output) has surely not run when the buffer is freed and while
 * every stage allocates. On a GPU the copies finish in microseconds, and
 * without the hold the read would usually be done before anyone could get
 * the buffer again. Samples go to pinned memory, so the copies are
 * asynchronous there too.
 *
 * Built with GMA_PIPELINE_PLANT (fakecuda_pipeline_planted, an internal
 * test), gma's epoch gating is switched off (GMA__TEST_NO_EPOCH_GATING) and
 * the run passes only if it finds corruption: proof that this test sees the
 * window it holds open.
 *
 * Usage: test_gpu_pipeline [seed [micro_batches]] (defaults 2 64).
 * Skips (77) without a CUDA device. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "drv.h"
#include "rng.h"
#ifdef GMA_PIPELINE_PLANT
#include "api/allocator.h"
#include "core/internal.h" /* gma__pool_of and the planted switch */
#endif

#define STAGES 4
#define QCAP 4
#define SAMPLE 4096
#define VERIFY_EVERY 8

static gma_t *g;
static uint64_t seed = 2;
static unsigned batches = 64;
static gma_stream_t streams[STAGES];
static atomic_ullong corruptions, samples_checked, held;

/* Output size of micro-batch m: the same for every stage, 64 KiB .. 4 MiB. */
static size_t batch_size(unsigned m) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + m + 1;
  return ((size_t)64 << 10) + (size_t)(rnd(&s) % (((size_t)4 << 20) - ((size_t)64 << 10)));
}

static uint32_t pattern(unsigned stage, unsigned m) {
  return (0x11111111u * (stage + 1)) ^ (m * 2654435761u) ^ (uint32_t)seed;
}

typedef struct msg {
  void *buf;
  size_t bytes;
  unsigned batch;
} msg_t;

/* A bounded queue from stage k to stage k + 1. */
typedef struct queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  msg_t m[QCAP];
  unsigned head, n; /* mu */
} queue_t;
static queue_t queues[STAGES - 1];

static void q_push(queue_t *q, msg_t m) {
  pthread_mutex_lock(&q->mu);
  while (q->n == QCAP) pthread_cond_wait(&q->cv, &q->mu);
  q->m[(q->head + q->n++) % QCAP] = m;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

static msg_t q_pop(queue_t *q) {
  pthread_mutex_lock(&q->mu);
  while (q->n == 0) pthread_cond_wait(&q->cv, &q->mu);
  msg_t m = q->m[q->head];
  q->head = (q->head + 1) % QCAP;
  q->n--;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return m;
}

typedef struct pending_sample {
  uint32_t host[SAMPLE / 4];
  uint32_t v;
  unsigned batch;
} pending_sample_t;

typedef struct stage {
  unsigned k;
  pending_sample_t *samples; /* filled on this stage's stream, checked after a sync */
  unsigned nsamples;
  unsigned long long futures_at_once;
  volatile uint32_t *flag; /* pinned: what the held stream waits for */
  uint32_t hold_seq;       /* the held stream waits for flag >= hold_seq + 1 */
  bool holding;
} stage_t;

/* Holds the stage's stream until release(): the work queued after this
 * waits, the host goes on. The driver may lack stream memory operations;
 * then nothing is held (drv_hold says so once). */
static void hold(stage_t *st) {
  if (drv_hold(streams[st->k], st->flag, st->hold_seq + 1)) {
    st->holding = true;
    atomic_fetch_add(&held, 1);
  }
}

/* Lets the held stream run. Flags only grow, so one release frees every
 * hold queued before it; a hold queued later waits for the next value. */
static void release(stage_t *st) {
  if (!st->holding) return;
  drv_release(st->flag, ++st->hold_seq);
  st->holding = false;
}

/* Queues a copy of the middle SAMPLE bytes of buf on the stage's stream. */
static void sample(stage_t *st, const void *buf, size_t bytes, uint32_t v, unsigned m) {
  pending_sample_t *x = &st->samples[st->nsamples++];
  x->v = v;
  x->batch = m;
  size_t off = (bytes / 2 - SAMPLE / 2) & ~(size_t)3;
  drv_to_host(x->host, (const char *)buf + off, SAMPLE, streams[st->k]);
}

static void verify(stage_t *st) {
  release(st); /* the sync below would wait for it forever */
  drv_sync(streams[st->k]);
  for (unsigned i = 0; i < st->nsamples; i++) {
    pending_sample_t *x = &st->samples[i];
    for (unsigned w = 0; w < SAMPLE / 4; w++) {
      if (x->host[w] != x->v) {
        atomic_fetch_add(&corruptions, 1);
        fprintf(stderr, "stage %u, micro-batch %u: word %u is %08x, expected %08x\n", st->k,
                x->batch, w, x->host[w], x->v);
        break;
      }
    }
    atomic_fetch_add(&samples_checked, 1);
  }
  st->nsamples = 0;
}

static gma_future_t *submit(unsigned k, unsigned m) {
  gma_future_t *f = NULL;
  CHECK_OK(gma_alloc_async(g, batch_size(m), streams[k], NULL, &f));
  return f;
}

static void *stage_main(void *arg) {
  stage_t *st = arg;
  unsigned k = st->k;
  gma_stream_t s = streams[k];
  drv_bind_thread();
  gma_future_t *next = submit(k, 0);
  for (unsigned m = 0; m < batches; m++) {
    msg_t in = {0};
    if (k > 0) in = q_pop(&queues[k - 1]);
    CHECK(k == 0 || in.batch == m);
    gma_future_t *f = next;
    /* Ask for the next micro-batch's buffer before waiting for this one. */
    next = m + 1 < batches ? submit(k, m + 1) : NULL;
    if (gma_future_poll(f) == GMA_OK) st->futures_at_once++;
    void *out = NULL;
    CHECK_OK(gma_future_wait(f, UINT64_MAX, &out));
    CHECK_OK(gma_future_release(f));
    /* The previous micro-batch's hold ends only now: the buffer just served
     * was chosen while the reads queued behind it had not run. */
    release(st);
    size_t bytes = batch_size(m) & ~(size_t)3;
    drv_memset32(out, pattern(k, m), bytes, s); /* the "compute" */
    /* The consumer's stream waits for the fill through an event recorded
     * here, before this micro-batch's hold: no other stage's stream ever
     * waits behind a hold, so a stage blocked on a queue while it holds its
     * stream cannot keep the others from finishing their syncs. */
    if (k + 1 < STAGES) CHECK_OK(gma_stream_wait_stream(g, streams[k + 1], s));
    if (k > 0) {
      /* Read the input on this stage's stream (ordered after its fill by the
       * producer), then free it: stream-ordered, gated by record_stream.
       * The stream is held first, so the read is still queued when the
       * buffer is freed and while every stage allocates. */
      hold(st);
      sample(st, in.buf, in.bytes, pattern(k - 1, m), m);
      CHECK_OK(gma_record_stream(g, in.buf, s));
      CHECK_OK(gma_free(g, in.buf));
    }
    if (k + 1 < STAGES) {
      q_push(&queues[k], (msg_t){out, bytes, m});
    } else {
      sample(st, out, bytes, pattern(k, m), m); /* behind the hold too */
      CHECK_OK(gma_free(g, out));
    }
    if (st->nsamples >= VERIFY_EVERY) verify(st);
  }
  verify(st);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) seed = strtoull(argv[1], NULL, 0);
  if (argc > 2) batches = (unsigned)strtoul(argv[2], NULL, 0);
  CHECK(batches > 0);
  printf("gpu pipeline: seed %llu, %u micro-batches x %d stages (rerun: %s %llu %u)\n",
         (unsigned long long)seed, batches, STAGES, argv[0], (unsigned long long)seed, batches);
  /* reuse:query: the stages hold their streams on the host until another
   * thread's buffer is served, which is the owner reclaim's one hazard
   * (docs/streams.md#the-one-hazard): under the default a producer could take
   * back a buffer behind a wait on a held consumer and then synchronize its
   * own stream. Skips without a CUDA device. */
  g = drv_cuda_allocator("reuse:query");
#ifdef GMA_PIPELINE_PLANT
  gma__pool_of(g)->test_flags = GMA__TEST_NO_EPOCH_GATING;
#endif
  drv_open();
  drv_bind_thread();
  stage_t st[STAGES];
  pthread_t th[STAGES];
  for (unsigned k = 0; k < STAGES; k++) {
    CHECK_OK(gma_stream_create(g, &streams[k]));
    volatile uint32_t *flag = drv_pinned(64);
    *flag = 0;
    /* Pinned: the sample copies are asynchronous on a GPU, as the race the
     * check looks for needs (into pageable memory they would be synchronous). */
    st[k] = (stage_t){.k = k, .samples = drv_pinned((VERIFY_EVERY + 2) * sizeof(pending_sample_t)),
                      .flag = flag};
    memset(st[k].samples, 0, (VERIFY_EVERY + 2) * sizeof(pending_sample_t));
  }
  for (unsigned k = 0; k + 1 < STAGES; k++) {
    pthread_mutex_init(&queues[k].mu, NULL);
    pthread_cond_init(&queues[k].cv, NULL);
  }
  for (unsigned k = 0; k < STAGES; k++)
    CHECK(pthread_create(&th[k], NULL, stage_main, &st[k]) == 0);
  unsigned long long at_once = 0;
  for (unsigned k = 0; k < STAGES; k++) {
    pthread_join(th[k], NULL);
    at_once += st[k].futures_at_once;
  }
  /* Only now: cuMemFreeHost synchronizes the device, so while a stage still
   * holds its stream it would wait for ever, and on a GPU it also blocks the
   * other threads' driver calls (seen on an H100: the stages stuck in
   * cuEventRecord and cuMemsetD32Async behind it, their holds never let go). */
  for (unsigned k = 0; k < STAGES; k++) {
    drv_pinned_free(st[k].samples);
    drv_pinned_free((void *)st[k].flag);
  }
  printf("%llu micro-batches read while their stream was held%s\n",
         (unsigned long long)atomic_load(&held),
         __atomic_load_n(&drv.cuStreamWaitValue32, __ATOMIC_RELAXED)
             ? ""
             : " (no stream held: the driver has no usable cuStreamWaitValue32)");
  gma_stats_t s = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &s));
  printf("futures: %llu submitted, %llu ready at submit, %llu already complete when waited on; "
         "p50 submit-to-ready %llu ns; %llu samples checked, %llu corruptions\n",
         (unsigned long long)s.futures_submitted, (unsigned long long)s.futures_ready_at_once,
         at_once, (unsigned long long)s.submit_to_ready_p50_ns,
         (unsigned long long)atomic_load(&samples_checked),
         (unsigned long long)atomic_load(&corruptions));
  CHECK(s.futures_submitted == (uint64_t)STAGES * batches);
  CHECK(s.futures_ready == s.futures_submitted && s.futures_failed == 0);
  CHECK(s.allocated.current == 0);
  CHECK(atomic_load(&samples_checked) == (uint64_t)STAGES * batches);
  unsigned long long c = atomic_load(&corruptions);
#ifndef GMA_PIPELINE_PLANT
  CHECK(c == 0);
#endif
  for (unsigned k = 0; k < STAGES; k++) CHECK_OK(gma_stream_destroy(g, streams[k]));
  for (unsigned k = 0; k + 1 < STAGES; k++) {
    pthread_mutex_destroy(&queues[k].mu);
    pthread_cond_destroy(&queues[k].cv);
  }
  CHECK_OK(gma_destroy(g));
  uint64_t used = drv_fake_used();
  CHECK(used == UINT64_MAX || used == 0);
#ifdef GMA_PIPELINE_PLANT
  printf("planted (no epoch gating): %s\n", c ? "detected, as it must be" : "NOT detected");
  return c ? 0 : 1;
#else
  return 0;
#endif
}
