/* reuse:auto (the default): a block freed after gma_record_stream(x, U) for
 * one stream U, its work not yet seen complete, serves U before the pool
 * grows, behind a device-side wait on the event of x's own stream; and
 * segments, ordinary or growable, serve the stream that made them first.
 *
 *   consumer_waits      U gets x while x's stream A still runs a kernel on
 *                       it; U's next kernel on x must start only after A's
 *                       ends. The planted variant (GMA__TEST_NO_CONSUMER_WAIT)
 *                       hands x over without the wait, and A's kernel must
 *                       see U's kernel overwrite its pattern.
 *   only_the_consumer   the owner A and a third stream C do not get x early;
 *                       nor does U when C used x too; nor under reuse:query.
 *   home_segment_first  with two FREE segments that fit, a stream takes the
 *                       one it made (reuse:query: the smaller one), and
 *                       takes another stream's when none of its own fits,
 *                       without growing.
 *   owner_reclaims      under reuse:wait, a stream whose freed blocks all
 *                       wait for held consumers (two streams, eight epochs:
 *                       the host far ahead of the device) takes them back
 *                       behind one device-side wait per consumer instead of
 *                       growing, once they hold as much as is allocated;
 *                       its next kernel there starts only after the
 *                       consumer's. The planted variant hands them back
 *                       without the wait, and the consumer's kernel must
 *                       see its pattern overwritten. Below the bound (more
 *                       live than pending) the owner grows and never waits;
 *                       reuse:auto reclaims as reuse:wait does, reuse:query
 *                       always grows. A request that one pending block
 *                       holds takes the oldest freed alone, behind a wait
 *                       on its own consumer only (planted: without it).
 *   wait_joins          under reuse:wait, a stream's request that only the
 *                       joint of another stream's cached block and the FREE
 *                       memory beside it holds takes that place instead of
 *                       growing, behind a device-side wait; its kernel
 *                       starts only after the other stream's. The planted
 *                       variant takes it without the wait, and the other
 *                       stream's kernel must see its pattern overwritten;
 *                       under reuse:auto the request grows, with no wait.
 *   growable_homes      the same with growable segments: memory mapped for
 *                       two streams' requests stays two segments (never one
 *                       coalesced FREE block), each stream takes its own
 *                       first, a third stream extends neither, and the
 *                       worker's growth ahead (no home) merges with either.
 *
 * Run one case with `unit_test_consumer_reuse NAME`. */
#include <inttypes.h>

#include "api/allocator.h"
#include "core/internal.h"
#include "simkit.h"

#define MiB ((size_t)1 << 20)

/* A writes a pattern into x and holds it (until *gate) as a kernel still
 * reading x would; u used x too (recorded), and so did also when not NULL;
 * then x is freed. Returns x. */
static void *consumed_block(gma_t *g, gma_stream_t a, gma_stream_t u, gma_stream_t *also,
                            pattern_kernel_t *ka, atomic_int *gate, atomic_int *corruptions) {
  void *x;
  CHECK_OK(gma_alloc(g, 4 * MiB, a, &x));
  *ka = (pattern_kernel_t){x, 4 * MiB, 0xA1, gate, 0, corruptions, 0};
  CHECK_OK(gma_sim_launch(g, a, pattern_kernel_run, ka));
  pattern_kernel_wait_started(ka);
  CHECK_OK(gma_record_stream(g, x, u));
  if (also) CHECK_OK(gma_record_stream(g, x, *also));
  CHECK_OK(gma_free(g, x));
  return x;
}

/* Stream s got y (size bytes) while a kernel held on *gate still checks
 * the old contents: s's kernel writes y, and must wait for the held one
 * had gma made s wait; after long enough for it to run otherwise, the gate
 * opens (the held kernel then checks its pattern) and s is synchronized. */
static void write_then_open(gma_t *g, gma_stream_t s, void *y, size_t size, uint8_t pattern,
                            atomic_int *gate, atomic_int *corruptions) {
  pattern_kernel_t k = {y, size, pattern, NULL, 1000, corruptions, 0};
  CHECK_OK(gma_sim_launch(g, s, pattern_kernel_run, &k));
  sleep_us(20000); /* long enough for s's kernel to run, had it not waited */
  atomic_store(gate, 1);
  CHECK_OK(gma_stream_synchronize(g, s));
}

/* gma_alloc of size on s into *y; *grew: whether it made a device
 * allocation; *waits: the device-side cross-stream waits it made. */
static void alloc_counted(gma_t *g, size_t size, gma_stream_t s, void **y, bool *grew,
                          uint64_t *waits) {
  gma_stats_t s0 = stats_of(g);
  CHECK_OK(gma_alloc(g, size, s, y));
  gma_stats_t s1 = stats_of(g);
  *grew = s1.num_device_allocs > s0.num_device_allocs;
  *waits = s1.num_cross_stream_waits - s0.num_cross_stream_waits;
}

/* Returns the corruptions seen; *same says whether U got x. */
static int consumer_run(unsigned flags, bool *same, uint64_t *waits) {
  gma_t *g = sim_allocator_ordinary(NULL);
  gma__pool_of(g)->test_flags = flags;
  gma_stream_t a, u;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &u));
  atomic_int gate = 0, corruptions = 0;
  pattern_kernel_t ka;
  void *x = consumed_block(g, a, u, NULL, &ka, &gate, &corruptions), *y;
  bool grew;
  alloc_counted(g, 4 * MiB, u, &y, &grew, waits);
  *same = x == y;
  write_then_open(g, u, y, 4 * MiB, 0xB2, &gate, &corruptions);
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_free(g, y));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, u));
  CHECK_OK(gma_destroy(g));
  return atomic_load(&corruptions);
}

static void consumer_waits(void) {
  bool same;
  uint64_t waits;
  int c = consumer_run(0, &same, &waits);
  printf("gated: U got x %d, waits %" PRIu64 ", corruptions %d\n", same, waits, c);
  CHECK(same && waits == 1 && c == 0);
  c = consumer_run(GMA__TEST_NO_CONSUMER_WAIT, &same, &waits);
  printf("planted (no wait): U got x %d, corruptions %d\n", same, c);
  CHECK(same && c > 0);
}

/* x as in consumer_waits; then the stream given asks for x's size. */
static bool early(const char *conf, int who, bool second_user) {
  gma_t *g = sim_allocator_ordinary(conf);
  gma_stream_t s[3];
  for (int i = 0; i < 3; i++) CHECK_OK(gma_stream_create(g, &s[i]));
  atomic_int gate = 0, corruptions = 0;
  pattern_kernel_t ka;
  void *x = consumed_block(g, s[0], s[1], second_user ? &s[2] : NULL, &ka, &gate, &corruptions);
  void *y;
  CHECK_OK(gma_alloc(g, 4 * MiB, s[who], &y));
  bool got = x == y;
  CHECK(got || stats_of(g).num_cross_stream_waits == 0);
  atomic_store(&gate, 1);
  CHECK_OK(gma_free(g, y));
  for (int i = 0; i < 3; i++) CHECK_OK(gma_stream_destroy(g, s[i]));
  CHECK_OK(gma_destroy(g));
  CHECK(atomic_load(&corruptions) == 0);
  return got;
}

static void only_the_consumer(void) {
  CHECK(early(NULL, 1, false));           /* the consumer: yes (consumer_waits) */
  CHECK(early(NULL, 0, false));           /* the owner: its own block back in stream
                                             order once the consumer's gate passed,
                                             with no wait (x is not the consumer's) */
  CHECK(!early(NULL, 2, false));          /* a stream that never used x */
  CHECK(!early(NULL, 1, true));           /* two users: not the consumer's alone */
  CHECK(!early("reuse:query", 1, false)); /* never a device-side wait */
  printf("only the one consumer gets x early\n");
}

/* a makes a 14 MiB segment, b an 18 MiB one; both FREE; b asks for 12 MiB. */
static void home_case(const char *conf, bool want_own) {
  gma_t *g = sim_allocator_ordinary(conf);
  gma_stream_t a, b, c;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  CHECK_OK(gma_stream_create(g, &c));
  void *pa, *pb, *y, *z, *w;
  CHECK_OK(gma_alloc(g, 14 * MiB, a, &pa));
  CHECK_OK(gma_alloc(g, 18 * MiB, b, &pb));
  CHECK_OK(gma_free(g, pa));
  CHECK_OK(gma_free(g, pb));
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_stream_synchronize(g, b));
  CHECK_OK(gma_alloc(g, 12 * MiB, b, &y));
  CHECK(y == (want_own ? pb : pa));
  CHECK_OK(gma_free(g, y));
  CHECK_OK(gma_stream_synchronize(g, b));
  /* c made nothing: it takes the best fit, a's; then b, none of whose own
   * fits 17 MiB now... b's 18 MiB does: the same place again. */
  CHECK_OK(gma_alloc(g, 13 * MiB, c, &z));
  CHECK(z == pa);
  CHECK_OK(gma_alloc(g, 17 * MiB, b, &w));
  CHECK(w == pb);
  CHECK_OK(gma_free(g, z));
  CHECK_OK(gma_free(g, w));
  CHECK_OK(gma_stream_synchronize(g, b));
  CHECK_OK(gma_stream_synchronize(g, c));
  /* a's own segment is taken (z freed on c, synchronized: FREE); a asks
   * for 16 MiB: none of a's fits, b's does, and nothing grows. */
  CHECK_OK(gma_alloc(g, 16 * MiB, a, &z));
  CHECK(z == pb && stats_of(g).num_device_allocs == 2);
  CHECK_OK(gma_free(g, z));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_stream_destroy(g, c));
  CHECK_OK(gma_destroy(g));
}

/* Growable segments: a's and b's growths are mapped side by side in one
 * range; before homes, they formed one segment, their FREE memory one
 * block, and b's request took a's place at its start. */
static void growable_homes(void) {
  gma_t *g = sim_allocator_ordinary("expandable_segments:true,reuse:auto");
  gma__pool_t *p = gma__pool_of(g);
  gma_stream_t a, b, c;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  CHECK_OK(gma_stream_create(g, &c));
  void *pa, *pb, *y, *z;
  CHECK_OK(gma_alloc(g, 14 * MiB, a, &pa));
  CHECK_OK(gma_alloc(g, 30 * MiB, b, &pb));
  CHECK(stats_of(g).num_segments == 2); /* adjacent in the range, not merged */
  CHECK_OK(gma_free(g, pa));
  CHECK_OK(gma_free(g, pb));
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_stream_synchronize(g, b));
  CHECK(stats_of(g).num_segments == 2);
  CHECK_OK(gma_alloc(g, 12 * MiB, b, &y)); /* a's fits better; b's own comes first */
  CHECK(y == pb);
  CHECK_OK(gma_alloc(g, 12 * MiB, a, &z));
  CHECK(z == pa);
  CHECK_OK(gma_free(g, y));
  CHECK_OK(gma_free(g, z));
  /* c made nothing: a request larger than any free block maps new memory
   * and extends neither a's nor b's segment. */
  uint64_t segs = stats_of(g).num_segments;
  CHECK_OK(gma_alloc(g, 40 * MiB, c, &y));
  CHECK(stats_of(g).num_segments == segs + 1);
  pthread_mutex_lock(&p->lock);
  for (size_t i = 0; i < p->nsegs; i++)
    CHECK(!p->segs[i]->range || p->segs[i]->home); /* every growth has a stream */
  pthread_mutex_unlock(&p->lock);
  CHECK_OK(gma_free(g, y));
  /* The worker's growth ahead has no home and extends a segment's free end
   * (c's, the last): no new segment. */
  CHECK_OK(gma_stream_synchronize(g, c));
  uint64_t reserved = stats_of(g).reserved.current;
  pthread_mutex_lock(&p->lock);
  uint64_t want = p->c.free + 64 * MiB;
  pthread_mutex_unlock(&p->lock);
  CHECK_OK(gma__pool_grow_ahead(p, want));
  CHECK(stats_of(g).reserved.current > reserved && stats_of(g).num_segments == segs + 1);
  pthread_mutex_lock(&p->lock);
  CHECK(gma__pool_is_valid(p));
  pthread_mutex_unlock(&p->lock);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_stream_destroy(g, c));
  CHECK_OK(gma_destroy(g));
  printf("growable memory of two streams stays two segments; each takes its own first\n");
}

static void home_segment_first(void) {
  home_case(NULL, true);
  home_case("reuse:query", false);
  printf("a stream's own FREE segment first (reuse:query: best fit)\n");
}

/* a allocates 8 blocks of 4 MiB; held kernels on u (even blocks) and v
 * (odd ones) use each (recorded), and a frees them all, a poll after each
 * free closing u's and v's epochs, so the gates name 8 epochs of two
 * streams: 32 MiB pending, allocated `live` bytes on a. Then a asks for `want`
 * bytes, which nothing FREE holds. Returns the corruptions seen;
 * *grew: whether that request made a device allocation; *waits: the
 * device-side waits it made; *first: whether it got the first block's place. */
static int reclaim_run(const char *conf, unsigned flags, size_t live, size_t want, bool *grew,
                       uint64_t *waits, bool *first) {
  gma_t *g = sim_allocator_ordinary(conf);
  gma__pool_of(g)->test_flags = flags;
  gma_stream_t a, u, v;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &u));
  CHECK_OK(gma_stream_create(g, &v));
  atomic_int gate = 0, corruptions = 0;
  void *held = NULL, *x[8], *y;
  if (live) CHECK_OK(gma_alloc(g, live, a, &held));
  pattern_kernel_t ku[8];
  for (int i = 0; i < 8; i++) CHECK_OK(gma_alloc(g, 4 * MiB, a, &x[i]));
  /* A request smaller than the second segment's FREE 8 MiB takes that
   * first: a live filler holds it. */
  void *filler = NULL;
  if (want < 8 * MiB) CHECK_OK(gma_alloc(g, 8 * MiB, a, &filler));
  for (int i = 0; i < 8; i++) {
    ku[i] = (pattern_kernel_t){x[i], 4 * MiB, (uint8_t)(0x10 + i), &gate, 0, &corruptions, 0};
    gma_stream_t user = i % 2 ? v : u;
    CHECK_OK(gma_sim_launch(g, user, pattern_kernel_run, &ku[i]));
    CHECK_OK(gma_record_stream(g, x[i], user));
    CHECK_OK(gma_free(g, x[i]));
    CHECK_OK(gma_empty_cache(g)); /* closes the epochs; nothing completes */
  }
  pattern_kernel_wait_started(&ku[0]);
  pattern_kernel_wait_started(&ku[1]);
  gma_stats_t s0 = stats_of(g);
  CHECK(s0.pending_bytes == 32 * MiB);
  alloc_counted(g, want, a, &y, grew, waits);
  *first = y == x[0];
  write_then_open(g, a, y, want, 0xEE, &gate, &corruptions);
  CHECK_OK(gma_stream_synchronize(g, u));
  CHECK_OK(gma_stream_synchronize(g, v));
  CHECK_OK(gma_free(g, y));
  if (held) CHECK_OK(gma_free(g, held));
  if (filler) CHECK_OK(gma_free(g, filler));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, u));
  CHECK_OK(gma_stream_destroy(g, v));
  CHECK_OK(gma_destroy(g));
  return atomic_load(&corruptions);
}

static void owner_reclaims(void) {
  bool grew, first;
  uint64_t waits;
  int c = reclaim_run("reuse:wait", 0, 0, 16 * MiB, &grew, &waits, &first);
  printf("host ahead: grew %d, waits %" PRIu64 ", first place %d, corruptions %d\n", grew, waits,
         first, c);
  CHECK(!grew && waits == 2 && first && c == 0); /* one wait per using stream */
  c = reclaim_run("reuse:wait", GMA__TEST_NO_CONSUMER_WAIT, 0, 16 * MiB, &grew, &waits, &first);
  printf("planted (no wait): grew %d, first place %d, corruptions %d\n", grew, first, c);
  CHECK(!grew && first && c > 0);
  /* 40 MiB live on a, 32 MiB pending: a short lead; a grows, no wait. */
  c = reclaim_run("reuse:wait", 0, 40 * MiB, 16 * MiB, &grew, &waits, &first);
  printf("short lead: grew %d, waits %" PRIu64 ", corruptions %d\n", grew, waits, c);
  CHECK(grew && waits == 0 && !first && c == 0);
  /* reuse:auto (the default) reclaims as reuse:wait does; reuse:query
   * never makes the owner wait for its consumers: it grows. */
  c = reclaim_run(NULL, 0, 0, 16 * MiB, &grew, &waits, &first);
  printf("reuse:auto: grew %d, waits %" PRIu64 ", first place %d, corruptions %d\n", grew, waits,
         first, c);
  CHECK(!grew && waits == 2 && first && c == 0);
  c = reclaim_run(NULL, GMA__TEST_NO_CONSUMER_WAIT, 0, 16 * MiB, &grew, &waits, &first);
  CHECK(!grew && first && c > 0);
  c = reclaim_run("reuse:query", 0, 0, 16 * MiB, &grew, &waits, &first);
  CHECK(grew && waits == 0 && c == 0);
  /* A request one pending block holds: the oldest freed (x[0]) comes back
   * alone, behind a wait on its one consumer (u), not on v. */
  c = reclaim_run(NULL, 0, 0, 4 * MiB, &grew, &waits, &first);
  printf("oldest fit: grew %d, waits %" PRIu64 ", first place %d, corruptions %d\n", grew, waits,
         first, c);
  CHECK(!grew && waits == 1 && first && c == 0);
  c = reclaim_run(NULL, GMA__TEST_NO_CONSUMER_WAIT, 0, 4 * MiB, &grew, &waits, &first);
  printf("planted oldest fit (no wait): grew %d, first place %d, corruptions %d\n", grew, first,
         c);
  CHECK(!grew && first && c > 0);
  /* More live on a than pending: a grows, no wait. */
  c = reclaim_run(NULL, 0, 40 * MiB, 4 * MiB, &grew, &waits, &first);
  CHECK(grew && waits == 0 && !first && c == 0);
}

/* a allocates 6 MiB x (a 20 MiB segment: 14 MiB FREE after x), a held
 * kernel on a uses x, and a frees it (cached on a); then u asks for 16 MiB,
 * which neither x nor the FREE rest holds alone. Returns the corruptions
 * seen; *grew, *waits, *same: whether the request made a device
 * allocation, the device-side waits it made, whether it got x's place. */
static int join_run(const char *conf, unsigned flags, bool *grew, uint64_t *waits, bool *same) {
  gma_t *g = sim_allocator_ordinary(conf);
  gma__pool_of(g)->test_flags = flags;
  gma_stream_t a, u;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &u));
  atomic_int gate = 0, corruptions = 0;
  void *x, *y;
  CHECK_OK(gma_alloc(g, 6 * MiB, a, &x));
  pattern_kernel_t ka = {x, 6 * MiB, 0xA5, &gate, 0, &corruptions, 0};
  CHECK_OK(gma_sim_launch(g, a, pattern_kernel_run, &ka));
  pattern_kernel_wait_started(&ka);
  CHECK_OK(gma_free(g, x));
  CHECK(stats_of(g).num_device_allocs == 1);
  alloc_counted(g, 16 * MiB, u, &y, grew, waits);
  *same = y == x;
  write_then_open(g, u, y, 16 * MiB, 0x5A, &gate, &corruptions);
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_free(g, y));
  gma__pool_t *p = gma__pool_of(g);
  pthread_mutex_lock(&p->lock);
  CHECK(gma__pool_is_valid(p));
  pthread_mutex_unlock(&p->lock);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, u));
  CHECK_OK(gma_destroy(g));
  return atomic_load(&corruptions);
}

static void wait_joins(void) {
  bool grew, same;
  uint64_t waits;
  int c = join_run("reuse:wait", 0, &grew, &waits, &same);
  printf("reuse:wait: grew %d, waits %" PRIu64 ", x's place %d, corruptions %d\n", grew, waits,
         same, c);
  CHECK(!grew && waits == 1 && same && c == 0);
  c = join_run("reuse:wait", GMA__TEST_NO_CONSUMER_WAIT, &grew, &waits, &same);
  printf("planted (no wait): grew %d, x's place %d, corruptions %d\n", grew, same, c);
  CHECK(!grew && same && c > 0);
  c = join_run(NULL, 0, &grew, &waits, &same); /* reuse:auto: never a wait for this */
  printf("reuse:auto: grew %d, waits %" PRIu64 ", corruptions %d\n", grew, waits, c);
  CHECK(grew && waits == 0 && !same && c == 0);
}

int main(int argc, char **argv) {
  static const struct {
    const char *name;
    void (*fn)(void);
  } cases[] = {{"consumer_waits", consumer_waits},
               {"only_the_consumer", only_the_consumer},
               {"home_segment_first", home_segment_first},
               {"wait_joins", wait_joins},
               {"growable_homes", growable_homes},
               {"owner_reclaims", owner_reclaims}};
  int ran = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    if (argc < 2 || !strcmp(argv[1], cases[i].name)) {
      cases[i].fn();
      ran++;
    }
  CHECK(ran > 0);
  printf("ok\n");
  return 0;
}
