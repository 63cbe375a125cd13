/* gma-demo: a short, realistic use of gma on the simulated device, written
 * against gma.h alone.
 *
 * It "trains" a small model for a few iterations over three streams, the way
 * a framework would: a data stream loads each input batch, the compute stream
 * runs the forward pass (activations of mixed sizes, short-lived workspaces)
 * and the backward pass (gradients, activations freed in reverse), and a
 * communication stream "all-reduces" each gradient. A consumer stream waits
 * for its producer on the device with gma_stream_wait_stream (compute for
 * the loaded batch, comm for each gradient), and buffers used on a stream
 * other than their own are declared with gma_record_stream before they are
 * freed, so gma will not reuse them while that stream may still touch them.
 * Kernels are host functions run in stream order by the simulated device.
 *
 * It prints one line per iteration and then a table of the statistics.
 * GMA_CONF is honoured (e.g. GMA_CONF=sim_alloc_ns:50000 to make device
 * allocations as slow as cudaMalloc). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gma.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

enum { ITERATIONS = 6, LAYERS = 8 };
enum { DATA, COMPUTE, COMM, NSTREAMS };
static const char *const stream_names[NSTREAMS] = {"data", "compute", "comm"};

static void fail(const char *what, gma_status_t st) {
  fprintf(stderr, "gma-demo: %s failed: %s\n  %s\n  %s\n", what, gma_status_name(st),
          gma_strerror(st), gma_last_error());
  exit(1);
}
#define TRY(call)                             \
  do {                                        \
    gma_status_t st_ = (call);                \
    if (st_ != GMA_OK) fail(#call, st_);      \
  } while (0)

/* A simulated kernel: writes the start of its buffer (as a real kernel would
 * write its output) and takes some time. */
typedef struct kernel {
  void *buf;
  size_t bytes;
  long us;
} kernel_t;

static void run_kernel(void *arg) {
  kernel_t *k = arg;
  memset(k->buf, 0x3c, k->bytes < 64 * KiB ? k->bytes : 64 * KiB);
  struct timespec ts = {0, k->us * 1000L};
  nanosleep(&ts, NULL);
  free(k);
}

static void launch(gma_t *g, gma_stream_t s, void *buf, size_t bytes, long us) {
  kernel_t *k = malloc(sizeof *k);
  if (!k) {
    fprintf(stderr, "gma-demo: out of host memory\n");
    exit(1);
  }
  *k = (kernel_t){buf, bytes, us};
  TRY(gma_sim_launch(g, s, run_kernel, k));
}

static void *alloc(gma_t *g, size_t bytes, gma_stream_t s) {
  void *p = NULL;
  TRY(gma_alloc(g, bytes, s, &p));
  return p;
}

static double mib(uint64_t b) { return (double)b / (double)MiB; }

static void print_stats(const gma_stats_t *s) {
  printf("\n%-12s %12s %12s %14s\n", "bytes (MiB)", "current", "peak", "total ever");
  const struct {
    const char *name;
    const gma_stat_t *st;
  } rows[] = {{"allocated", &s->allocated}, {"requested", &s->requested},
              {"reserved", &s->reserved},   {"active", &s->active},
              {"cached", &s->cached}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    printf("%-12s %12.2f %12.2f %14.2f\n", rows[i].name, mib(rows[i].st->current),
           mib(rows[i].st->peak), mib(rows[i].st->total));
  printf("  of the cache: %.2f MiB stream-cached, %.2f MiB pending, %.2f MiB free\n",
         mib(s->stream_cached_bytes), mib(s->pending_bytes), mib(s->free_bytes));
  printf("  (gma learns that a stream's work finished when it next polls its events,\n"
         "  on a cache miss or gma_empty_cache: until then freed blocks stay stream-cached\n"
         "  or pending, and pending bytes count as active, even after a synchronize)\n");

  double n = s->num_allocs ? (double)s->num_allocs : 1.0;
  printf("\n%-28s %10s %8s\n", "allocations served from", "count", "share");
  printf("%-28s %10" PRIu64 " %7.1f%%\n", "the stream's lock-free bin", s->hits_bin,
         100.0 * (double)s->hits_bin / n);
  printf("%-28s %10" PRIu64 " %7.1f%%\n", "the stream's cache in the pool", s->hits_stream,
         100.0 * (double)s->hits_stream / n);
  printf("%-28s %10" PRIu64 " %7.1f%%\n", "the shared free pool", s->hits_pool,
         100.0 * (double)s->hits_pool / n);
  printf("%-28s %10" PRIu64 " %7.1f%%\n", "a new device segment", s->hits_device,
         100.0 * (double)s->hits_device / n);
  printf("\nallocs %" PRIu64 ", frees %" PRIu64 ", device allocs %" PRIu64 ", device frees %" PRIu64
         ", segments held %" PRIu64 ", OOMs %" PRIu64 "\n",
         s->num_allocs, s->num_frees, s->num_device_allocs, s->num_device_frees,
         s->num_segments, s->num_ooms);
  printf("largest free block %.2f MiB, fragmentation %.3f\n", mib(s->largest_free_block),
         s->fragmentation);
}

int main(void) {
  gma_config_t c = {.size = sizeof(gma_config_t)};
  c.device = GMA_DEVICE_SIM;
  c.sim_capacity = 4ull << 30; /* a small "GPU" of 4 GiB */
  gma_t *g = NULL;
  TRY(gma_create(&c, &g));
  printf("gma-demo: gma %s on the \"%s\" device (%s)\n", gma_version(), gma_device_name(g),
         strcmp(gma_device_name(g), "sim") == 0
             ? "simulated device: host memory, host-thread streams"
             : "not the simulated device");

  gma_stream_t s[NSTREAMS];
  for (int i = 0; i < NSTREAMS; i++) TRY(gma_stream_create(g, &s[i]));
  printf("streams: %s, %s, %s; %d layers, %d iterations\n\n", stream_names[DATA],
         stream_names[COMPUTE], stream_names[COMM], LAYERS, ITERATIONS);

  /* Sizes of the model: activations vary by layer as in a small CNN
   * (large early, small late), gradients are the size of each layer's weights. */
  size_t act_size[LAYERS], grad_size[LAYERS];
  for (int l = 0; l < LAYERS; l++) {
    act_size[l] = (8 * MiB >> (l / 2)) + (size_t)l * 3 * KiB + 100;
    grad_size[l] = (64 * KiB << (l % 4)) + 512 * (size_t)l;
  }

  printf("%-5s %8s %8s %8s %8s %18s %14s\n", "iter", "allocs", "stream", "pool", "device",
         "live after fwd MiB", "reserved MiB");
  gma_stats_t prev = {.size = sizeof(gma_stats_t)};
  TRY(gma_stats(g, &prev));
  int record_streams = 0;
  for (int it = 0; it < ITERATIONS; it++) {
    /* The data stream loads the batch; compute reads it. The batch size
     * jitters a little, as the last batch of an epoch would. */
    size_t batch_bytes = 6 * MiB + (size_t)(it % 3) * 256 * KiB;
    void *input = alloc(g, batch_bytes, s[DATA]);
    launch(g, s[DATA], input, batch_bytes, 300);
    /* Compute reads the batch: its work from here on waits for the load. */
    TRY(gma_stream_wait_stream(g, s[COMPUTE], s[DATA]));
    TRY(gma_record_stream(g, input, s[COMPUTE]));
    record_streams++;

    /* Forward: keep every activation for the backward pass; workspaces
     * live for one layer only. */
    void *act[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
      act[l] = alloc(g, act_size[l], s[COMPUTE]);
      void *workspace = alloc(g, 512 * KiB + (size_t)l * 4 * KiB, s[COMPUTE]);
      launch(g, s[COMPUTE], act[l], act_size[l], 150);
      TRY(gma_free(g, workspace)); /* stream order: reusable by the next layer at once */
    }
    TRY(gma_free(g, input));
    /* The high-water mark of an iteration: every activation is live. */
    gma_stats_t mid = {.size = sizeof(gma_stats_t)};
    TRY(gma_stats(g, &mid));
    void *loss = alloc(g, 4, s[COMPUTE]);
    launch(g, s[COMPUTE], loss, 4, 20);

    /* Backward: each gradient goes to the comm stream for its all-reduce,
     * then is freed; gma holds it until the comm stream is done with it. */
    for (int l = LAYERS - 1; l >= 0; l--) {
      void *grad = alloc(g, grad_size[l], s[COMPUTE]);
      launch(g, s[COMPUTE], grad, grad_size[l], 150);
      TRY(gma_free(g, act[l]));
      /* The all-reduce rewrites the gradient in place, after the kernel
       * that computed it: comm waits for compute's work so far. */
      TRY(gma_stream_wait_stream(g, s[COMM], s[COMPUTE]));
      launch(g, s[COMM], grad, grad_size[l], 100);
      TRY(gma_record_stream(g, grad, s[COMM]));
      record_streams++;
      TRY(gma_free(g, grad));
    }
    TRY(gma_free(g, loss));
    /* The host reads the loss back and the optimizer step waits for the
     * all-reduces, as a real loop does every iteration. Without such a sync
     * the host runs ahead of the streams without bound, and so does memory:
     * blocks freed while their kernels are still queued cannot be reused on
     * other streams until those kernels have run. */
    for (int i = 0; i < NSTREAMS; i++) TRY(gma_stream_synchronize(g, s[i]));

    gma_stats_t now = {.size = sizeof(gma_stats_t)};
    TRY(gma_stats(g, &now));
    printf("%-5d %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %18.2f %14.2f\n", it,
           now.num_allocs - prev.num_allocs,
           (now.hits_bin + now.hits_stream) - (prev.hits_bin + prev.hits_stream),
           now.hits_pool - prev.hits_pool, now.hits_device - prev.hits_device,
           mib(mid.allocated.current), mib(now.reserved.current));
    prev = now;
  }
  for (int i = 0; i < NSTREAMS; i++) TRY(gma_stream_synchronize(g, s[i]));
  printf("\n%d buffers were used on a second stream (gma_record_stream)\n", record_streams);

  gma_stats_t st = {.size = sizeof(gma_stats_t)};
  TRY(gma_stats(g, &st));
  print_stats(&st);

  TRY(gma_empty_cache(g));
  TRY(gma_stats(g, &st));
  printf("\nafter gma_empty_cache: reserved %.2f MiB in %" PRIu64 " segments\n",
         mib(st.reserved.current), st.num_segments);

  for (int i = 0; i < NSTREAMS; i++) TRY(gma_stream_destroy(g, s[i]));
  TRY(gma_destroy(g));
  printf("gma-demo: done on the simulated device\n");
  return 0;
}
