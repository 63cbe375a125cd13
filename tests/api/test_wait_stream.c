/* gma_stream_wait_stream on the simulated device, through gma.h alone:
 *
 *   producer_consumer  a producer kernel on A writes a buffer slowly; after
 *                      gma_stream_wait_stream(B, A) a consumer kernel on B
 *                      reads it and sees every word written. The same run
 *                      without the call (the planted variant) must see the
 *                      consumer read too early, or the test could not fail.
 *   only_earlier_work  work queued on the waitee after the call is not
 *                      waited for; work queued on the waiter before the call
 *                      does not wait.
 *   default_streams    the legacy and per-thread default streams as waiter
 *                      and waitee; an idle waitee makes nothing wait.
 *   both_ways          A waits for B and B for A, repeatedly: no deadlock,
 *                      every kernel runs in the order the waits imply.
 *   errors             NULL or destroyed allocator, the same stream twice
 *                      (NULL and GMA_STREAM_LEGACY are one), a destroyed
 *                      stream and a retired one in either role, each with a
 *                      message naming the problem; a retired stream used
 *                      with gma again is accepted.
 *
 * Run one case with `api_test_wait_stream NAME`. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "simkit.h"

#define WORDS 4096

/* The producer: writes WORDS words of value, slowly (the whole write takes
 * about 40 ms), as a kernel would that the consumer must not overtake. */
typedef struct producer {
  _Atomic uint64_t *buf;
  uint64_t value;
} producer_t;

static void producer_run(void *arg) {
  producer_t *p = arg;
  for (int i = 0; i < WORDS; i++) {
    if (i % 512 == 0) sleep_us(5000);
    atomic_store_explicit(&p->buf[i], p->value, memory_order_relaxed);
  }
}

/* The consumer: counts the words that hold the producer's value. */
typedef struct consumer {
  _Atomic uint64_t *buf;
  uint64_t value;
  int seen;
  atomic_int done;
} consumer_t;

static void consumer_run(void *arg) {
  consumer_t *c = arg;
  int n = 0;
  for (int i = 0; i < WORDS; i++)
    n += atomic_load_explicit(&c->buf[i], memory_order_relaxed) == c->value;
  c->seen = n;
  atomic_store(&c->done, 1);
}

/* One run: the words the consumer saw written (WORDS when ordered). */
static int produce_then_consume(bool wait) {
  gma_t *g = sim_allocator(NULL);
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  void *buf = NULL;
  CHECK_OK(gma_alloc(g, WORDS * sizeof(uint64_t), a, &buf));
  memset(buf, 0, WORDS * sizeof(uint64_t));
  producer_t p = {buf, 0x5eed5eed5eed5eedull};
  consumer_t c = {buf, p.value, -1, 0};
  CHECK_OK(gma_sim_launch(g, a, producer_run, &p));
  if (wait) CHECK_OK(gma_stream_wait_stream(g, b, a));
  CHECK_OK(gma_sim_launch(g, b, consumer_run, &c));
  CHECK_OK(gma_record_stream(g, buf, b)); /* the consumer reads it on b */
  CHECK_OK(gma_stream_synchronize(g, b));
  CHECK(atomic_load(&c.done));
  CHECK_OK(gma_free(g, buf));
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
  return c.seen;
}

static void producer_consumer(void) {
  for (int round = 0; round < 3; round++) CHECK(produce_then_consume(true) == WORDS);
  int early = produce_then_consume(false);
  printf("  with gma_stream_wait_stream: all %d words seen; without it (planted): %d\n", WORDS,
         early);
  CHECK(early < WORDS); /* the detector works: unordered, the consumer reads too early */
}

/* Appends its tag to a shared log when it runs. */
typedef struct logger {
  atomic_int *log, *n;
  int tag;
} logger_t;

static void logger_run(void *arg) {
  logger_t *l = arg;
  l->log[atomic_fetch_add(l->n, 1)] = l->tag;
}

/* Holds its stream until the gate opens (at most 5 s). */
static void gate_run(void *arg) {
  atomic_int *gate = arg;
  for (int i = 0; i < 50000 && !atomic_load(gate); i++) sleep_us(100);
}

static void only_earlier_work(void) {
  gma_t *g = sim_allocator(NULL);
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  atomic_int gate1 = 0, gate2 = 0, gate_b = 0, log[8], n = 0;
  logger_t first = {log, &n, 1}, later = {log, &n, 3}, waiter = {log, &n, 2},
           before = {log, &n, 0};
  CHECK_OK(gma_sim_launch(g, b, gate_run, &gate_b)); /* b's work before the call */
  CHECK_OK(gma_sim_launch(g, b, logger_run, &before));
  CHECK_OK(gma_sim_launch(g, a, gate_run, &gate1));
  CHECK_OK(gma_sim_launch(g, a, logger_run, &first));
  CHECK_OK(gma_stream_wait_stream(g, b, a));
  CHECK_OK(gma_sim_launch(g, a, gate_run, &gate2)); /* after the call: not waited for */
  CHECK_OK(gma_sim_launch(g, a, logger_run, &later));
  CHECK_OK(gma_sim_launch(g, b, logger_run, &waiter));
  atomic_store(&gate_b, 1); /* b's earlier work runs: it did not wait for a */
  for (int i = 0; i < 50000 && atomic_load(&n) < 1; i++) sleep_us(100);
  sleep_us(20000);
  CHECK(atomic_load(&n) == 1 && log[0] == 0); /* b's later kernel waits for a's first */
  atomic_store(&gate1, 1);
  CHECK_OK(gma_stream_synchronize(g, b)); /* returns while gate2 still holds a */
  CHECK(atomic_load(&n) == 3 && log[1] == 1 && log[2] == 2);
  atomic_store(&gate2, 1);
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK(atomic_load(&n) == 4 && log[3] == 3);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
}

static void default_streams(void) {
  gma_t *g = sim_allocator(NULL);
  gma_stream_t a;
  CHECK_OK(gma_stream_create(g, &a));
  atomic_int gate = 0, log[8], n = 0;
  logger_t on_a = {log, &n, 1}, on_null = {log, &n, 2}, on_ptds = {log, &n, 3};
  /* The legacy stream waits for a, the per-thread stream for the legacy. */
  CHECK_OK(gma_sim_launch(g, a, gate_run, &gate));
  CHECK_OK(gma_sim_launch(g, a, logger_run, &on_a));
  CHECK_OK(gma_stream_wait_stream(g, NULL, a));
  CHECK_OK(gma_sim_launch(g, NULL, logger_run, &on_null));
  CHECK_OK(gma_stream_wait_stream(g, GMA_STREAM_PER_THREAD, GMA_STREAM_LEGACY));
  CHECK_OK(gma_sim_launch(g, GMA_STREAM_PER_THREAD, logger_run, &on_ptds));
  sleep_us(20000);
  CHECK(atomic_load(&n) == 0);
  atomic_store(&gate, 1);
  CHECK_OK(gma_stream_synchronize(g, GMA_STREAM_PER_THREAD));
  CHECK(atomic_load(&n) == 3 && log[0] == 1 && log[1] == 2 && log[2] == 3);
  /* An idle waitee: nothing to wait for, the waiter runs at once. */
  logger_t again = {log, &n, 4};
  CHECK_OK(gma_stream_wait_stream(g, a, NULL));
  CHECK_OK(gma_sim_launch(g, a, logger_run, &again));
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK(atomic_load(&n) == 4 && log[3] == 4);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_destroy(g));
}

static void both_ways(void) {
  gma_t *g = sim_allocator(NULL);
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  enum { ROUNDS = 50 };
  static atomic_int log[2 * ROUNDS];
  atomic_int n = 0;
  static logger_t k[2 * ROUNDS];
  for (int r = 0; r < ROUNDS; r++) { /* a, then b after a, then a after b, ... */
    gma_stream_t on = r % 2 ? b : a, other = r % 2 ? a : b;
    k[r] = (logger_t){log, &n, r};
    CHECK_OK(gma_sim_launch(g, on, logger_run, &k[r]));
    CHECK_OK(gma_stream_wait_stream(g, other, on));
  }
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_stream_synchronize(g, b));
  CHECK(atomic_load(&n) == ROUNDS);
  for (int r = 0; r < ROUNDS; r++) CHECK(log[r] == r);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
}

#define CHECK_SAYS(call, status, text)                    \
  do {                                                    \
    CHECK_ST(call, status);                               \
    CHECK(strstr(gma_last_error(), text) != NULL);        \
  } while (0)

static void errors(void) {
  gma_t *g = sim_allocator(NULL);
  gma_stream_t a, b, c, gone;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  CHECK_OK(gma_stream_create(g, &c));
  CHECK_SAYS(gma_stream_wait_stream(NULL, a, b), GMA_ERR_INVALID_ARGUMENT, "allocator is NULL");
  CHECK_SAYS(gma_stream_wait_stream(g, a, a), GMA_ERR_INVALID_ARGUMENT, "same stream");
  CHECK_SAYS(gma_stream_wait_stream(g, NULL, GMA_STREAM_LEGACY), GMA_ERR_INVALID_ARGUMENT,
             "same stream");
  CHECK_SAYS(gma_stream_wait_stream(g, GMA_STREAM_PER_THREAD, GMA_STREAM_PER_THREAD),
             GMA_ERR_INVALID_ARGUMENT, "same stream");
  /* Destroyed: the device knows no such stream. */
  CHECK_OK(gma_stream_create(g, &gone));
  CHECK_OK(gma_stream_destroy(g, gone));
  CHECK_SAYS(gma_stream_wait_stream(g, gone, a), GMA_ERR_INVALID_ARGUMENT, "waiter");
  CHECK(strstr(gma_last_error(), "not a live stream"));
  CHECK_SAYS(gma_stream_wait_stream(g, a, gone), GMA_ERR_INVALID_ARGUMENT, "waitee");
  /* Retired while still alive: it must take no more work, in either role. */
  void *p = NULL;
  CHECK_OK(gma_alloc(g, 4096, b, &p)); /* gma has a record of b */
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_stream_retire(g, b));
  CHECK_SAYS(gma_stream_wait_stream(g, a, b), GMA_ERR_INVALID_ARGUMENT, "retired");
  CHECK(strstr(gma_last_error(), "waitee"));
  CHECK_SAYS(gma_stream_wait_stream(g, b, a), GMA_ERR_INVALID_ARGUMENT, "retired");
  CHECK(strstr(gma_last_error(), "waiter"));
  /* Used with gma again, b has a new record: not retired any more. */
  CHECK_OK(gma_alloc(g, 4096, b, &p));
  CHECK_OK(gma_stream_wait_stream(g, a, b));
  CHECK_OK(gma_free(g, p));
  /* A destroyed stream's handle value given to a new stream: the new one is
   * fine although the old record with that handle was retired. */
  CHECK_OK(gma_alloc(g, 4096, c, &p));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_stream_destroy(g, c));
  gma_stream_t c2;
  CHECK_OK(gma_stream_create(g, &c2));
  CHECK(c2 == c); /* the simulated device hands the freed handle out again */
  CHECK_OK(gma_stream_wait_stream(g, c2, a));
  CHECK_OK(gma_stream_wait_stream(g, a, c2));
  /* Nothing above changed what gma holds. */
  gma_stats_t s = stats_of(g);
  CHECK(s.allocated.current == 0);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_stream_destroy(g, c2));
  CHECK_OK(gma_destroy(g));
  CHECK_SAYS(gma_stream_wait_stream(g, NULL, GMA_STREAM_PER_THREAD), GMA_ERR_INVALID_ARGUMENT,
             "destroyed");
}

int main(int argc, char **argv) {
  static const test_case_t cases[] = {
      {"producer_consumer", producer_consumer}, {"only_earlier_work", only_earlier_work},
      {"default_streams", default_streams},     {"both_ways", both_ways},
      {"errors", errors},
  };
  return run_cases(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
