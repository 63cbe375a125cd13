/* Model-based fuzzer of gma's public API on the simulated device.
 *
 * LLVMFuzzerTestOneInput decodes its bytes into a configuration and a
 * sequence of operations, runs them single-threaded against a fresh allocator
 * on the simulated device, and checks every answer against a reference model
 * kept here: the live allocations (address range, requested and block size,
 * stream, tag, kind), the pinned host blocks, the futures and the counters
 * gma must report. Any disagreement calls abort() with a message naming the
 * check, the operation number and gma's last error, so libFuzzer records the
 * input. The same source builds two drivers: the libFuzzer binary fuzz_gma
 * (clang, -fsanitize=fuzzer) and fuzz_replay (replay_main.c, any compiler),
 * which runs files and directories of inputs through this function; CTest's
 * fuzz_corpus replays the seed corpus and the regressions with it.
 *
 * INPUT ENCODING (tests/fuzz/make_corpus.py writes seeds in it)
 *   byte 0  configuration flags: bit0 worker on, bit1 expandable_segments,
 *           bit2 bins off, bits3-4 reuse (0 auto, 1 wait, 2 none, 3 query),
 *           bit5 fallback:host, bit6 trace to a temporary file (checked at the
 *           end: trace_check), bit7 fault injection
 *   byte 1  bits0-1 sim_capacity (32M, 64M, 64M, 128M), bits2-3 trim_interval_ms
 *           (1, 2, 5, 50), bit4 release_threshold 8M (else 512 B), bit5
 *           idle_ms 10000 (else 1), bit6 grow_ahead 4M, bit7 small knobs
 *           (bin_depth 2, ring_size 2, bin_max 64K)
 *   byte 2  bits0-2 sim_fail_alloc N, bits3-5 sim_fail_event 8*N (only with
 *           byte0 bit7), bit6 memory_limit = 3/4 of the capacity, bit7
 *           small_segment 1M + large_segment 4M
 *   byte 3  bits0-3 end mode: 6 futures released without waiting, 7 one
 *           block leaked on purpose (gma_destroy must say GMA_ERR_LEAK), 8
 *           futures kept across gma_destroy and released afterwards, other
 *           values normal (futures waited for and collected); bit4 a pressure
 *           callback (worker on); bit5 pinned host and CPU-fallback blocks may
 *           outlive their stream (else the fuzzer frees them before it
 *           destroys the stream; tests/fuzz/crashes/README.md, bug A); bit6
 *           plan:on (planned memory, issue 18: SLEEP's argument then also
 *           names PLAN_MARK, PLAN_LOOP and PLAN_REPEAT, see op_sleep)
 *   then operations until the bytes run out (at most MAX_OPS): one byte whose
 *   top two bits name the logical thread T (0-2 use user streams S0-S2, 3 the
 *   default stream, or its per-thread stream after OP_DEFAULT_MODE) and whose
 *   low six bits, modulo NOPS, the operation (the first 64 - 2*NOPS codes get
 *   a third slot), followed by the operation's argument bytes. Missing bytes
 *   read as 0. The logical threads' operations interleave as the bytes say;
 *   everything runs on the calling thread, so a run is as deterministic as the
 *   device's own threads allow, except for the operations with a helper
 *   thread below.
 *
 *   Operations added for issue 13 live inside existing codes, in argument
 *   values that older inputs hardly use, so that those inputs (corpus/ and
 *   campaign/) keep their meaning (23 of the 2,178 campaign inputs reach one):
 *   - RESERVE whose first argument byte is 0xE0-0xEF: adversarial gma_reserve
 *     arguments (op_reserve_bad; the low four bits pick the variant): counts
 *     whose sum wraps past SIZE_MAX ({SIZE_MAX, 2}, {2^63, 2^63}, {2,
 *     SIZE_MAX - 1, 1}), a count of SIZE_MAX, counts whose pointer array
 *     cannot exist, NULL sizes or counts with n > 0, a valid entry followed by
 *     size 0, SIZE_MAX or memory_limit + 1.
 *   - INTROSPECT with v = 8e + 3, e = 1..31 (v = 3 stays the device-name
 *     check): an operation with a short-lived helper pthread, (e - 1) % 4:
 *     0 RACE_DESTROY  blocks of a user stream freed on the helper while the
 *                     fuzzer's thread calls gma_stream_destroy on the stream
 *                     (both leave one barrier); the slot gets a new stream;
 *     1 PTDS_THREAD   the helper allocates, runs pattern kernels on and frees
 *                     blocks on GMA_STREAM_PER_THREAD, and exits;
 *     2 PRESSURE_CB   the pressure callback set, replaced or removed (worker
 *                     on) with a heap context the fuzzer frees as soon as the
 *                     call that replaced it returns (no helper thread: the
 *                     worker runs the callback);
 *     3 REPORTERS     gma_live_report, gma_find_old_allocations and
 *                     gma_snapshot_json on the helper beside lock-free
 *                     alloc/free pairs on the fuzzer's thread.
 *     Each helper is bounded and joined before its operation ends; the
 *     comments above op_race_destroy, op_ptds_thread, op_pressure and
 *     op_reporters give their argument bytes.
 *   - ASYNC and ASYNC_BATCH whose options byte has bits 3, 4, 5 and 7 all
 *     set (1 in 16 of older inputs' values): a chain. One more argument
 *     byte (chain_reserve) describes a second request that the first one's
 *     callback submits when it completes with GMA_OK: on the worker (whose
 *     submits must never wait for ring room, which only the worker makes:
 *     with ring_size 2 it would wait for itself), or on the fuzzer's thread
 *     inside the first submit when that completed at once.
 *   - With plan:on, SLEEP's argument 0x7C-0x7E (a mark's unused low bits:
 *     no campaign input used them): operations on planned memory under
 *     pressure, each with two more argument bytes (see
 *     op_plan_race_free and below): 0x7C PLAN_RACE_FREE, racing frees of
 *     one planned block used on more streams; 0x7D PLAN_IDLE, an idle
 *     plan's arena needed by a request (synchronous or async),
 *     gma_trim(g, 0) or gma_empty_cache, optionally beside a block cached
 *     on the legacy stream; 0x7E PLAN_OOM_BUSY, a request that fits once
 *     memory freed behind a kernel is safe, while a planned block is live.
 *
 * THE MODEL
 *   - live device (and CPU-fallback) blocks: pointer, requested size, block
 *     size (from gma_pointer_info, checked against the README's size classes),
 *     stream slot and that slot's generation (a retire or destroy starts a new
 *     gma record), tag, the last pattern a kernel wrote, whether another stream
 *     used it;
 *   - pinned host blocks (gma_host_alloc), with the pattern the host wrote;
 *   - streams: three user streams (destroyed and re-created, the handle value
 *     may be recycled), the default stream (NULL and GMA_STREAM_LEGACY
 *     alternate) and the per-thread default stream;
 *   - futures, with a completion callback that tells the model each outcome,
 *     so counts stay exact even for futures released before they completed,
 *     and that submits a chain's second request (a slot reserved for it,
 *     which becomes an ordinary future once the model sees the callback ran:
 *     chain_adopt);
 *   - expected counters: allocations and frees, host allocations and frees,
 *     fallbacks, futures submitted and completed by outcome;
 *   - the pressure callback installed now (none, the plain one, or one with a
 *     heap context) and the contexts given up.
 *
 * CHECKS after every operation: every new allocation is 256-byte aligned, does
 * not overlap any live block of the model (device, fallback or host), and
 * gma_pointer_info agrees with it; statistics agree with the model: exactly
 * (allocated, requested, active, num_allocs, num_frees, hits by level,
 * futures by outcome, queue depth, the accounting equation reserved =
 * allocated + stream_cached + pending + free, with plan:on reserved + planned
 * live = ... + plan_arena_bytes, and the hit levels plus plan_hits =
 * num_allocs) whenever no async request is in
 * flight, and as bounds otherwise; host statistics always exactly; misuse
 * (double free, interior and foreign pointers, destroyed streams, the default
 * streams given to gma_stream_destroy, bad sizes and tags) returns its status
 * and changes nothing; simulated pattern kernels (filled, held or gated, and
 * checked in stream order, also across streams after gma_record_stream) abort
 * at once when another user overwrote their memory. At the end of an input
 * every block is freed, every stream synchronized, gma_empty_cache must give
 * every byte back (reserved 0, host reserved 0), and gma_destroy must return
 * GMA_OK (GMA_ERR_LEAK in the leak mode).
 *
 * The issue-13 operations add: an adversarial gma_reserve fails with
 * INVALID_SIZE, INVALID_ARGUMENT or OOM (DEVICE with injected faults), never
 * crashes, and leaves allocated, requested, host memory and gma's count of
 * live allocations as they were; frees racing gma_stream_destroy and a
 * helper's per-thread work succeed, and what they cached must come back at
 * the end (the drain check above: nothing stranded in the bins of a retired
 * stream or of an exited thread's stream); a pressure callback checks its
 * context's magic value at its start and after a hold, so one still running
 * after the call that replaced it returned is a use after free (ASan) or a
 * poisoned value; the reports return GMA_OK (GMA_ERR_INVALID_SIZE for a
 * short buffer) with sane entries while the hot path runs (TSan sees their
 * reads race the lock-free writes), and with nothing running agree with the
 * model: the count and bytes of live device blocks, each entry's size, tag
 * and stream, oldest first; gma_find_old_allocations is called with cap > 0
 * also when nothing is live.
 *
 * Chains add: a submit from a callback on the worker succeeds whatever the
 * ring holds and nonblocking says (GMA_ERR_BUSY only on the fuzzer's own
 * thread, GMA_ERR_CANCELLED only during gma_destroy); futures_submitted
 * lies between the model's count and that plus the chains not yet seen;
 * and every callback runs on the worker, or on the fuzzer's thread only
 * inside a gma_alloc_async call (a wait never runs one).
 *
 * Planned memory under pressure adds: of two frees of one
 * planned block racing on two threads exactly one succeeds and the other
 * says GMA_ERR_DOUBLE_FREE; a gma_alloc that fails with GMA_ERR_OOM (or
 * falls back to host memory), gma_trim(g, 0) and gma_empty_cache with no
 * planned block live leave no arena held and the plan no longer active
 * (plan_replans rose), and so does a request that cannot fit beside the
 * arena once it is served or times out; with nothing else live and the
 * streams synchronized such a request succeeds; an OOM blamed on "a real
 * shortage" names as held exactly the model's live bytes outside arenas
 * plus the arena, and with the request they pass the limit (every input,
 * plan or not); the statistics, the accounting equation included, are
 * checked right after each of these operations, and after the final
 * gma_empty_cache allocated and requested are the model's.
 *
 * The trace check (byte 0 bit 6): the model logs every allocation and free
 * it knows of (pointer, bytes asked for, stream, block size from
 * gma_pointer_info); at the end each allocate and free row of a successful
 * call must be the next event the model logged for its pointer, with its
 * figures, planned and CPU-fallback blocks included; the only other rows
 * allowed are gma's own frees of futures' memory nobody collected and
 * gma_reserve's allocate/free pairs; and when the trace ran to the end,
 * every logged event has its row.
 *
 * Gated kernels hold their stream until an OP_GATE_OPEN (or any synchronize,
 * or the end) opens their gate: stream order then deterministically keeps
 * their memory from other streams. A gate that stays shut 10 s means a call
 * waited for the device while the fuzzer held a stream: that aborts too.
 *
 * Environment: FUZZ_GMA_VERBOSE=1 prints every operation; FUZZ_GMA_PROFILE=1
 * the time spent per operation kind. (While a bug is open, a variable like
 * the former FUZZ_GMA_SKIP_KNOWN, which steered runs clear of issue 13's
 * bugs until they were fixed, can steer a long run clear of it so that it
 * finds others; see tests/fuzz/README.md.) */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gma.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

enum {
  MAX_OPS = 400,    /* operations per input */
  MAX_LIVE = 40,    /* live device/fallback blocks in the model */
  MAX_HOST = 12,    /* live pinned host blocks */
  MAX_FUT = 24,     /* future slots (busy until released and settled) */
  MAX_UNRELEASED = 6,
  MAX_GATES = 4,
  NGRAVE = 16,      /* addresses of freed blocks, for double frees */
  NSLOTS = 5,       /* streams: 0-2 user, 3 default, 4 per-thread default */
  NDEAD = 8,        /* handles of destroyed streams */
  MAX_BATCH = 8,
  SETTLE_MS = 3000, /* how long in-flight work may take to settle */
  GATE_LIMIT_MS = 10000
};

/* ---- operations ----------------------------------------------------------- */
/* The order is the encoding: tests/fuzz/make_corpus.py mirrors it. */
#define OP_LIST(X)                                                              \
  X(ALLOC) X(FREE) X(K_HOLD) X(K_FILL) X(RECORD) X(ASYNC) /* these get 3 slots */ \
  X(ALLOC_TAGGED) X(MISUSE) X(K_CHECK) X(GATE_OPEN) X(ASYNC_BATCH)              \
  X(F_POLL) X(F_WAIT) X(F_RELEASE) X(BATCH) X(TRIM) X(EMPTY_CACHE) X(SYNC)      \
  X(RETIRE) X(DESTROY) X(HOST_ALLOC) X(HOST_FREE) X(HOST_KERNEL) X(PINFO)       \
  X(RESERVE) X(INTROSPECT) X(SLEEP) X(SYNC_ALL) X(DEFAULT_MODE)
enum {
#define X(name) OP_##name,
  OP_LIST(X)
#undef X
  NOPS
};
static const char *const op_names[] = {
#define X(name) #name,
    OP_LIST(X)
#undef X
};

/* ---- small helpers ---------------------------------------------------------- */

static uint64_t mix64(uint64_t x) { /* splitmix64 finalizer */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* The README's size classes, written from its text (not from sizeclass.h):
 * 512-byte steps up to 4 KiB, then each (2^k, 2^(k+1)] cut into 8 steps up
 * to 64 KiB, 16 up to 1 MiB, 32 above. */
static uint64_t class_round(uint64_t s) {
  if (s <= 4096) return round_up(s ? s : 1, 512);
  unsigned k = 63u - (unsigned)__builtin_clzll(s - 1); /* 2^k < s <= 2^(k+1) */
  uint64_t steps = k + 1 <= 16 ? 8 : k + 1 <= 20 ? 16 : 32;
  return round_up(s, ((uint64_t)1 << k) / steps);
}

/* ---- the kernels -------------------------------------------------------------- */
/* Kernels touch 8-byte words at absolute addresses that are multiples of a
 * power-of-two stride (>= 256, so at most about 512 words per kernel): two
 * kernels with strides a <= b share every sample point of the coarser one,
 * so two ranges overlapping by at least the larger stride share a word. Words
 * are relaxed atomics: when gma hands out memory too early two kernels touch
 * the same words, and the pattern check (not a data race report) is what
 * must catch it. */

typedef struct gate {
  _Atomic uint64_t opened; /* generations opened so far */
  uint64_t armed;          /* main thread: generation new kernels wait for */
} gate_t;

enum { K_FILL_ONLY = 0, K_CHECK_ONLY = 1, K_HOLD_ONE = 2 };

typedef struct kern {
  uintptr_t base;
  size_t len;
  uint64_t pattern;
  int mode;
  long hold_us;
  gate_t *gate;
  uint64_t gate_gen;
  uint64_t blk;   /* the model's id of the block, for messages */
  int opno;       /* the operation that launched it */
  _Atomic int *started; /* set once the pattern is written (gated kernels) */
} kern_t;

static _Atomic uint64_t g_kernels_done; /* process-wide: kernels that finished */

static size_t stride_for(size_t len) {
  size_t s = 256;
  while (len / s > 512) s *= 2;
  return s;
}

static uint64_t word_value(uint64_t pattern, uintptr_t addr) { return mix64(pattern ^ addr); }

static void pattern_write(uintptr_t base, size_t len, uint64_t pattern) {
  size_t s = stride_for(len);
  for (uintptr_t a = round_up(base, s); a + 8 <= base + len; a += s)
    __atomic_store_n((uint64_t *)a, word_value(pattern, a), __ATOMIC_RELAXED);
}

/* Returns how many sampled words differ; *first the first one's address. */
static size_t pattern_verify(uintptr_t base, size_t len, uint64_t pattern, uintptr_t *first) {
  size_t s = stride_for(len), bad = 0;
  for (uintptr_t a = round_up(base, s); a + 8 <= base + len; a += s)
    if (__atomic_load_n((uint64_t *)a, __ATOMIC_RELAXED) != word_value(pattern, a)) {
      if (!bad) *first = a;
      bad++;
    }
  return bad;
}

static void gate_wait(gate_t *g, uint64_t gen, const char *who, int opno) {
  uint64_t t0 = now_ns();
  while (atomic_load_explicit(&g->opened, memory_order_acquire) < gen) {
    if (now_ns() - t0 > (uint64_t)GATE_LIMIT_MS * 1000000u) {
      fprintf(stderr,
              "fuzz_gma: CHECK FAILED: a %s (launched by op %d) waited %d s for its gate: some call "
              "waited for the device while the fuzzer held a stream shut (a hang)\n",
              who, opno, GATE_LIMIT_MS / 1000);
      abort();
    }
    sleep_us(20);
  }
}

static void kern_run(void *arg) {
  kern_t *k = arg;
  if (k->mode != K_CHECK_ONLY) pattern_write(k->base, k->len, k->pattern);
  if (k->started) atomic_store_explicit(k->started, 1, memory_order_release);
  if (k->mode == K_HOLD_ONE) {
    if (k->gate) gate_wait(k->gate, k->gate_gen, "gated pattern kernel", k->opno);
    else if (k->hold_us) sleep_us(k->hold_us);
  }
  if (k->mode != K_FILL_ONLY) {
    uintptr_t first = 0;
    size_t bad = pattern_verify(k->base, k->len, k->pattern, &first);
    if (bad) {
      fprintf(stderr,
              "fuzz_gma: CHECK FAILED: corruption: %zu sampled words of block #%" PRIu64
              " [%#" PRIxPTR ", +%zu) changed while a kernel owned them (first at %#" PRIxPTR
              "; kernel launched by op %d): gma handed the memory to another user too early\n",
              bad, k->blk, k->base, k->len, first, k->opno);
      abort();
    }
  }
  free(k);
  atomic_fetch_add_explicit(&g_kernels_done, 1, memory_order_release);
}

/* Cross-stream ordering without events (the public API has none): a kernel on
 * the owner stream sets the flag, one on the other stream waits for it. The
 * setter's store is its last access; the waiter frees the flag. */
typedef struct xflag {
  _Atomic int set;
  int opno;
} xflag_t;

static void flag_set_kernel(void *arg) {
  xflag_t *f = arg;
  atomic_store_explicit(&f->set, 1, memory_order_release); /* pairs with flag_wait's acquire */
  atomic_fetch_add_explicit(&g_kernels_done, 1, memory_order_release);
}

static void flag_wait_kernel(void *arg) {
  xflag_t *f = arg;
  uint64_t t0 = now_ns();
  while (!atomic_load_explicit(&f->set, memory_order_acquire)) {
    if (now_ns() - t0 > (uint64_t)GATE_LIMIT_MS * 1000000u) {
      fprintf(stderr, "fuzz_gma: CHECK FAILED: a flag-wait kernel (op %d) waited %d s (a hang)\n",
              f->opno, GATE_LIMIT_MS / 1000);
      abort();
    }
    sleep_us(10);
  }
  free(f);
  atomic_fetch_add_explicit(&g_kernels_done, 1, memory_order_release);
}

/* ---- the model ---------------------------------------------------------------- */

typedef struct mstream {
  gma_stream_t h;     /* user streams: the handle; others: unused */
  bool live;          /* user streams: created and not destroyed */
  unsigned gen;       /* bumped by retire and destroy: gma's record starts over */
  int has_record;     /* 1 gma has a record, 0 it has none, -1 unknown */
  bool counts_exact;  /* this generation's counts are known exactly */
  uint64_t allocs, frees; /* this generation's, as gma_stream_stats counts them */
  uint64_t wait_gen[4];   /* the stream's queue waits for gate g's generation wait_gen[g] */
  unsigned incarnation;   /* bumped when the slot gets a new device stream (a recycled
                             handle value names another stream) */
} mstream_t;

typedef struct mblock {
  uintptr_t p;
  size_t size;
  uint64_t bsize;
  int si;
  unsigned gen;
  gma_stream_t h;     /* the handle it was allocated with */
  int thread;
  int tag;            /* -1 untagged */
  gma_memory_kind_t kind;
  uint64_t pat;       /* the pattern the last kernel left (0: none) */
  bool shared;        /* used on another stream: no more kernels of ours */
  bool planned;       /* served at a planned address (plan:on; plan_hits rose) */
  uint64_t id;
} mblock_t;

typedef struct mhost {
  uintptr_t p;
  size_t size;
  uint64_t bsize;
  int si;
  unsigned gen;
  gma_stream_t h;
  uint64_t pat;       /* the pattern the host or the last kernel left */
  bool dev_used;      /* a kernel was queued on it: the host no longer reads it */
  unsigned incarnation; /* its stream slot's incarnation at allocation */
  uint64_t id;
} mhost_t;

typedef struct mfut {
  bool used;          /* the slot holds a future not yet released, or not settled */
  gma_future_t *f;
  bool batch;
  size_t n;
  size_t sizes[MAX_BATCH];
  void *ptrs[MAX_BATCH]; /* a batch's result array (must outlive the request) */
  void *got[MAX_BATCH];  /* what the first collecting wait returned */
  int si;
  unsigned gen;
  gma_stream_t h;
  bool released, collected;
  _Atomic int cb_status; /* the status the callback saw */
  _Atomic int cb_runs;   /* times the callback ran (must end at 1) */
  bool accounted;        /* the model counted the callback's outcome */
  int seen;              /* the final status a poll or wait returned; GMA_PENDING: none */
  bool freed_counted;    /* release freed its memory (frees counted) */
  /* Chains: a request whose callback submits the next one (see op_async). */
  struct mfut *child;    /* the slot the callback submits into on GMA_OK (NULL: none) */
  bool awaiting;         /* a child slot whose parent's callback has not been observed */
  size_t child_size;     /* the child's request */
  bool child_worker_only, child_nonblocking;
  /* Written by the parent's callback before its cb_runs release (read after
   * the acquire that sees it): the child's submit and its result. */
  bool child_tried;
  gma_status_t child_st;
  gma_future_t *child_f;
  bool cb_on_fuzzer;     /* the callback ran on the fuzzer's thread */
  uint64_t fid;          /* the model's id of the request (the trace check's) */
} mfut_t;

static const char *const tag_names[] = {"weights", "kv-cache", "act", "grad", "tmp", "x", "",
                                        "this-tag-is-much-too-long-for-gma"};

typedef struct fuzz {
  gma_t *g;
  gma_config_t cfg;
  uint64_t capacity, limit, bin_max;
  bool worker, fallback, faults, grow_ahead;
  int end_mode;
  int opno;
  const char *opname;
  bool verbose;
  bool t3_ptds;         /* logical thread 3 uses the per-thread stream */
  bool orphaned;        /* a retire failed (fault): memory may stay reserved */
  bool reserve_unknown; /* a failed gma_reserve left counts to re-learn */
  bool lag;             /* the worker may be freeing a released future's memory */
  bool host_outlives;   /* pinned host blocks may outlive their stream (see configure) */
  mstream_t st[NSLOTS];
  gma_stream_t dead[NDEAD];
  int ndead;
  mblock_t live[MAX_LIVE];
  int nlive;
  mhost_t host[MAX_HOST];
  int nhost;
  uintptr_t grave[NGRAVE];
  int ngrave;
  uintptr_t host_grave[NGRAVE];
  int nhost_grave;
  mfut_t fut[MAX_FUT];
  gate_t gates[MAX_GATES];
  _Atomic int started[MAX_OPS + 1]; /* gated kernels' "pattern written" flags, by op */
  uint64_t next_id, next_pattern;
  uint64_t kernels_launched;
  /* expected counters */
  uint64_t n_allocs, n_frees, n_host_allocs, n_host_frees, n_fallbacks;
  uint64_t n_submitted, n_ready, n_failed, n_timed_out;
  uint64_t pressure_calls;
  pthread_t main_thread; /* the fuzzer's thread */
  bool in_submit;       /* the fuzzer's thread is inside gma_alloc_async or _batch_async */
  int stream_rr;        /* which stream the per-step check looks at */
  /* the threaded operations (INTROSPECT, see op_threaded) */
  struct pctx *pcb;     /* the context of the pressure callback installed now (NULL: none) */
  bool pcb_plain;       /* pressure_cb (no context) is installed */
  /* planned memory (plan:on, issue 18) */
  bool plan;            /* byte 3 bit 6 */
  bool next_planned;    /* add_block: the allocation it registers was planned */
  uint64_t plan_hits_seen; /* plan_hits when the last operation began or add_block looked */
  bool replaying;       /* PLAN_REPEAT is replaying earlier operations */
  int replayed;         /* operations replayed so far in this input */
  size_t hist[16];      /* start offsets of the last operations (a ring, by opno) */
  uint64_t marks;       /* gma_iteration_mark calls */
  const uint8_t *in;    /* the input (PLAN_REPEAT reads earlier operations' bytes) */
  /* The last PLAN_LOOP's requests (size and stream slot, in order): after a
   * mark, its first request on a stream is planned while its plan is active
   * (plan_take). */
  int loop_n;
  size_t loop_size[17];
  int loop_si[17];
  /* The trace check (byte 0 bit 6: a temporary file, read at the end). */
  char trace_file[256];
  bool trace_closed;      /* gma_trace_start or _stop closed the file early */
  struct tlog *tlog;      /* every allocation and free the model knows, in order */
  size_t ntlog, tlog_cap;
  struct tlog *tfut;      /* blocks of futures that completed with memory nobody collected:
                             gma frees them itself (free rows the model has no pointer for) */
  size_t ntfut, tfut_cap;
  uint64_t trace_unknown; /* allocations gma_reserve may have made (rows with unknown pointers) */
  uint64_t next_fid;
  bool collecting;        /* fut_collect registers a future's blocks (their rows are async ones) */
} fuzz_t;

static fuzz_t F;

#define FAIL(...)                                                                             \
  do {                                                                                        \
    fprintf(stderr, "fuzz_gma: CHECK FAILED at %s:%d (op %d, %s): ", __FILE__, __LINE__, F.opno, \
            F.opname ? F.opname : "-");                                                       \
    fprintf(stderr, __VA_ARGS__);                                                             \
    fprintf(stderr, "\n  gma_last_error: %s\n", gma_last_error());                            \
    abort();                                                                                  \
  } while (0)
#define EXPECT(cond, ...) \
  do {                    \
    if (!(cond)) FAIL(__VA_ARGS__); \
  } while (0)
#define EXPECT_ST(st, want, what) \
  EXPECT((st) == (want), "%s returned %s, expected %s", what, gma_status_name(st), gma_status_name(want))

static void vlog(const char *fmt, ...) {
  if (!F.verbose) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "  [%3d] %-12s ", F.opno, F.opname ? F.opname : "-");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ---- input reader ------------------------------------------------------------ */

typedef struct rd {
  const uint8_t *p;
  size_t n, i;
} rd_t;

static unsigned rd8(rd_t *r) { return r->i < r->n ? r->p[r->i++] : 0; }

/* Sizes: tiny to tens of MiB, a few that recur (so freed blocks are wanted
 * again), and edges (0, class bounds, the capacity, SIZE_MAX). */
static size_t pick_size(rd_t *r) {
  unsigned b = rd8(r), x = rd8(r);
  uint64_t v = ((uint64_t)(b & 31) << 8 | x); /* 0..8191 */
  static const size_t popular[8] = {512, 4096, 8292, 65536, 200000, 1 << 20, 3 << 20, 12 << 20};
  switch (b >> 5) {
    case 0: return 1 + v * 512 / 8192;
    case 1: return 512 + v * (4 * KiB - 512) / 8192;
    case 2: return 4 * KiB + v * (60 * KiB) / 8192;
    case 3: return 64 * KiB + v * (960 * KiB) / 8192;
    case 4: return 1 * MiB + v * (3 * MiB) / 8192;
    case 5: return 4 * MiB + v * (36 * MiB) / 8192;
    case 6: return popular[b & 7];
    default: break;
  }
  switch (b & 15) {
    case 0: return 0;
    case 1: return 1;
    case 2: return (size_t)F.bin_max ? (size_t)F.bin_max : MiB;
    case 3: return ((size_t)F.bin_max ? (size_t)F.bin_max : MiB) + 1;
    case 4: return 2 * MiB;
    case 5: return 10 * MiB;
    case 6: return 10 * MiB + 1;
    case 7: return 20 * MiB;
    case 8: return (size_t)F.limit;
    case 9: return (size_t)F.limit + 1;
    case 10: return (size_t)F.capacity / 2;
    case 11: return 4097;
    case 12: return 4096;
    case 13: return 511;
    case 14: return SIZE_MAX;
    default: return SIZE_MAX - 511;
  }
}

/* ---- streams ------------------------------------------------------------------- */

static gma_stream_t handle_of(int si) {
  if (si < 3) return F.st[si].h;
  if (si == 3) return (F.opno & 1) ? GMA_STREAM_LEGACY : NULL;
  return GMA_STREAM_PER_THREAD;
}

/* Logical thread t's stream; a thread whose stream was destroyed (and not
 * re-created) works on the default stream meanwhile. */
static int stream_of_thread(int t) {
  if (t < 3) return F.st[t].live ? t : 3;
  return F.t3_ptds ? 4 : 3;
}

static bool slot_live(int si) { return si >= 3 || F.st[si].live; }

/* A live stream slot chosen by a byte (user streams may be absent). */
static int pick_stream(unsigned b) {
  for (int k = 0; k < NSLOTS; k++) {
    int si = (int)((b + (unsigned)k) % NSLOTS);
    if (slot_live(si)) return si;
  }
  return 3;
}

static bool handle_is_live(gma_stream_t h) {
  for (int i = 0; i < 3; i++)
    if (F.st[i].live && F.st[i].h == h) return true;
  return false;
}

static void stream_new_gen(int si) {
  F.st[si].gen++;
  if (si < 3 && !F.st[si].live) memset(F.st[si].wait_gen, 0, sizeof F.st[si].wait_gen);
  F.st[si].has_record = 0;
  F.st[si].counts_exact = true;
  F.st[si].allocs = F.st[si].frees = 0;
}

static bool default_handle(gma_stream_t h) { return h == NULL || h == GMA_STREAM_LEGACY; }

/* ---- the trace check's log ------------------------------------------------------ */
/* With byte 0 bit 6 gma traces to a temporary file from gma_create on. The
 * model logs every allocation and free it knows of (pointer, bytes asked
 * for, stream, block size from gma_pointer_info; block 0: not known, e.g. a
 * lock-free pair beside the reports), and at the end of the input every
 * allocate and free row of a successful call must be one of them (see
 * trace_check). */

typedef struct tlog {
  uintptr_t p;
  uint64_t size, stream, block; /* stream: the handle, the default streams as 0 */
  uint64_t fid;                 /* tfut: the future's id */
  uint32_t seq;
  char act;                     /* 'A' allocate, 'F' free */
  bool used;
} tlog_t;

static uint64_t trace_stream(gma_stream_t h) { return default_handle(h) ? 0 : (uint64_t)(uintptr_t)h; }

static tlog_t *tlog_push(tlog_t **v, size_t *n, size_t *cap) {
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 256;
    *v = realloc(*v, *cap * sizeof **v);
    EXPECT(*v != NULL, "host memory");
  }
  tlog_t *e = &(*v)[(*n)++];
  memset(e, 0, sizeof *e);
  return e;
}

/* A successful allocation (act 'A') or free ('F') the trace must show. */
static void tlog_add(char act, uintptr_t p, uint64_t size, gma_stream_t h, uint64_t block) {
  if (!F.trace_file[0]) return;
  tlog_t *e = tlog_push(&F.tlog, &F.ntlog, &F.tlog_cap);
  *e = (tlog_t){.p = p, .size = size, .stream = trace_stream(h), .block = block,
                .seq = (uint32_t)(F.ntlog - 1), .act = act};
}

/* A future completed with memory nobody collected yet: if it is never
 * collected, gma frees its blocks itself (a free row of a pointer the model
 * never saw). */
static void tfut_add(const mfut_t *m) {
  if (!F.trace_file[0]) return;
  for (size_t k = 0; k < m->n; k++) {
    tlog_t *e = tlog_push(&F.tfut, &F.ntfut, &F.tfut_cap);
    *e = (tlog_t){.size = m->sizes[k], .stream = trace_stream(m->h), .fid = m->fid, .act = 'F'};
  }
}

static void tfut_collected(uint64_t fid) {
  for (size_t i = 0; i < F.ntfut; i++)
    if (F.tfut[i].fid == fid) F.tfut[i].used = true;
}

/* ---- stats ------------------------------------------------------------------------ */

static gma_stats_t stats_now(void) {
  gma_stats_t s = GMA_STATS_INIT;
  gma_status_t st = gma_stats(F.g, &s);
  EXPECT_ST(st, GMA_OK, "gma_stats");
  return s;
}

/* Futures whose outcome the model does not know yet (callback not run). */
static int futures_in_flight(void) {
  int n = 0;
  for (int i = 0; i < MAX_FUT; i++)
    if (F.fut[i].used && !F.fut[i].accounted) n++;
  return n;
}

/* Completed with memory nobody collected and not released: live in gma,
 * unknown to the model's byte sums. */
static int futures_uncollected(void) {
  int n = 0;
  for (int i = 0; i < MAX_FUT; i++) {
    mfut_t *m = &F.fut[i];
    if (m->used && !m->released && !m->collected &&
        (!m->accounted || atomic_load(&m->cb_status) == GMA_OK))
      n++;
  }
  return n;
}

static void fut_free_slot(mfut_t *m) { m->used = false; }

/* Requests on slot si the worker may still serve (it resolves the stream
 * when it serves them). */
static bool slot_in_flight(int si) {
  for (int i = 0; i < MAX_FUT; i++)
    if (F.fut[i].used && !F.fut[i].accounted && F.fut[i].si == si) return true;
  return false;
}

/* Child slots of chains whose parent's callback the model has not seen. */
static int chains_awaiting(void) {
  int n = 0;
  for (int i = 0; i < MAX_FUT; i++) n += F.fut[i].used && F.fut[i].awaiting;
  return n;
}

/* The parent m's callback has run (the model saw its cb_runs, or gma_destroy
 * joined the worker: after_destroy). Its child slot becomes an ordinary
 * future if the callback submitted it, else it is free again. A submit on
 * the worker never waits for ring room, so it is never GMA_ERR_BUSY; on the
 * fuzzer's thread (the parent complete at once) a nonblocking one may be.
 * While gma_destroy cancels what is left, callbacks' submits are refused
 * with GMA_ERR_CANCELLED (only cancelled parents' callbacks run then, and
 * those do not submit: a child is submitted on GMA_OK only). End mode 8
 * destroys the user streams with requests still in flight: a parent served
 * after that submits on a dead stream, GMA_ERR_INVALID_ARGUMENT. */
static void chain_adopt(mfut_t *m, bool after_destroy) {
  mfut_t *c = m->child;
  m->child = NULL;
  if (!c) return;
  c->awaiting = false;
  if (!m->child_tried) { /* the parent did not complete with memory */
    fut_free_slot(c);
    return;
  }
  gma_status_t st = m->child_st;
  vlog("chain: future %ld's callback (on the %s thread) submitted future %ld -> %s",
       (long)(m - F.fut), m->cb_on_fuzzer ? "fuzzer's" : "worker's", (long)(c - F.fut),
       gma_status_name(st));
  if (st != GMA_OK) {
    EXPECT((st == GMA_ERR_BUSY && m->cb_on_fuzzer && m->child_nonblocking) ||
               (st == GMA_ERR_CANCELLED && after_destroy) ||
               (st == GMA_ERR_INVALID_ARGUMENT && after_destroy && c->si < 3 && !F.st[c->si].live),
           "a callback's gma_alloc_async (on the %s thread%s) returned %s",
           m->cb_on_fuzzer ? "fuzzer's" : "worker's", m->child_nonblocking ? ", nonblocking" : "",
           gma_status_name(st));
    EXPECT(m->child_f == NULL, "a refused gma_alloc_async left *out = %p", (void *)m->child_f);
    EXPECT(atomic_load(&c->cb_runs) == 0, "the callback of a refused request ran");
    fut_free_slot(c);
    return;
  }
  c->f = m->child_f;
  F.n_submitted++;
  F.st[c->si].has_record = F.st[c->si].has_record == 1 ? 1 : -1; /* the worker may resolve it */
  F.st[c->si].counts_exact = false;
}

/* Counts outcomes the callbacks reported since the last look. A parent
 * comes before its child in F.fut (see op_async), so a child adopted here
 * is looked at in the same pass. */
static void observe_futures(void) {
  for (int i = 0; i < MAX_FUT; i++) {
    mfut_t *m = &F.fut[i];
    if (!m->used || m->accounted || m->awaiting) continue;
    if (atomic_load_explicit(&m->cb_runs, memory_order_acquire) == 0) continue;
    EXPECT(atomic_load(&m->cb_runs) == 1, "future callback ran %d times", atomic_load(&m->cb_runs));
    m->accounted = true;
    chain_adopt(m, false);
    int s = atomic_load(&m->cb_status);
    if (s == GMA_OK) {
      F.n_ready++;
      F.n_allocs += m->n;
      tfut_add(m);
      if (m->released) { /* released before it completed: gma frees it, maybe on the worker */
        F.n_frees += m->n;
        F.lag = true;
      }
    } else if (s == GMA_ERR_TIMEOUT) {
      F.n_timed_out++;
    } else {
      F.n_failed++;
      EXPECT(s == GMA_ERR_CANCELLED ? m->released : s == GMA_ERR_DEVICE && F.faults,
             "future completed with %s", gma_status_name((gma_status_t)s));
    }
    if (m->released) fut_free_slot(m);
  }
}

typedef struct sums {
  uint64_t dev_bytes, dev_req, fb_bytes, host_bytes;
  uint64_t dev_count;
  uint64_t planned_bytes; /* of dev_bytes: planned blocks (inside an arena) */
} sums_t;

static sums_t model_sums(void) {
  sums_t s = {0};
  for (int i = 0; i < F.nlive; i++) {
    mblock_t *b = &F.live[i];
    if (b->kind == GMA_MEMORY_DEVICE) {
      s.dev_bytes += b->bsize;
      s.dev_req += b->size;
      s.dev_count++;
      if (b->planned) s.planned_bytes += b->bsize;
    } else {
      s.fb_bytes += b->bsize;
    }
  }
  for (int i = 0; i < F.nhost; i++) s.host_bytes += F.host[i].bsize;
  return s;
}

/* The accounting equation. plan:on: a plan's arena is one live block of the
 * pool (in reserved, not in allocated), and the planned blocks inside it are
 * in allocated: reserved + planned live = allocated + stream_cached +
 * pending + free + plan_arena_bytes. */
static bool accounting_holds(const gma_stats_t *s, uint64_t planned_live) {
  return s->reserved.current + planned_live == s->allocated.current + s->stream_cached_bytes +
                                                   s->pending_bytes + s->free_bytes +
                                                   s->plan_arena_bytes;
}

/* The checks that hold at every step, exact when nothing runs on the worker
 * on the model's behalf. A released future's free can trail its callback by
 * a moment, so exact counts get a short while to settle. */
static void check_stats(void) {
  observe_futures();
  sums_t m = model_sums();
  bool inflight = futures_in_flight() > 0;
  gma_stats_t s = stats_now();
  if (!inflight && !F.reserve_unknown) {
    /* The worker's free of a released future's block updates its counters
     * one by one without the lock: give it a moment to finish. */
    for (uint64_t t0 = now_ns(); s.num_allocs != F.n_allocs || s.num_frees != F.n_frees ||
                                 (F.lag && !accounting_holds(&s, m.planned_bytes));) {
      if (now_ns() - t0 > (uint64_t)SETTLE_MS * 1000000u)
        FAIL("num_allocs %" PRIu64 " / num_frees %" PRIu64 ", the model expects %" PRIu64
             " / %" PRIu64 " (no request in flight)",
             s.num_allocs, s.num_frees, F.n_allocs, F.n_frees);
      sleep_us(50);
      s = stats_now();
    }
    F.lag = false;
  }
  if (F.reserve_unknown && !inflight) {
    /* A failed gma_reserve allocated and freed an unknown number of blocks;
     * it must have freed all it allocated (give a released future's free on
     * the worker its moment, as above). */
    for (uint64_t t0 = now_ns(); s.num_allocs - F.n_allocs != s.num_frees - F.n_frees &&
                                 now_ns() - t0 < (uint64_t)SETTLE_MS * 1000000u;
         s = stats_now())
      sleep_us(50);
    EXPECT(s.num_allocs - F.n_allocs == s.num_frees - F.n_frees,
           "a failed gma_reserve kept blocks: allocs +%" PRIu64 ", frees +%" PRIu64,
           s.num_allocs - F.n_allocs, s.num_frees - F.n_frees);
    F.n_allocs = s.num_allocs;
    F.n_frees = s.num_frees;
    F.reserve_unknown = false;
    return; /* exact again from the next step on */
  }
  /* Always. */
  EXPECT(s.allocated.peak >= s.allocated.current && s.requested.peak >= s.requested.current &&
             s.reserved.peak >= s.reserved.current,
         "a peak below its current value");
  EXPECT(s.reserved.current >= s.allocated.current,
         "reserved %" PRIu64 " < allocated %" PRIu64, s.reserved.current, s.allocated.current);
  EXPECT(s.cached.current == s.reserved.current - s.allocated.current,
         "cached %" PRIu64 " != reserved - allocated %" PRIu64, s.cached.current,
         s.reserved.current - s.allocated.current);
  EXPECT(s.fragmentation >= 0.0 && s.fragmentation <= 1.0, "fragmentation %f", s.fragmentation);
  EXPECT(s.reserved.current <= F.limit, "reserved %" PRIu64 " above the limit %" PRIu64,
         s.reserved.current, F.limit);
  EXPECT(s.allocated.current >= m.dev_bytes && s.requested.current >= m.dev_req,
         "allocated %" PRIu64 " / requested %" PRIu64 " below the model's live %" PRIu64 " / %" PRIu64,
         s.allocated.current, s.requested.current, m.dev_bytes, m.dev_req);
  EXPECT(s.num_allocs >= F.n_allocs || F.reserve_unknown, "num_allocs %" PRIu64 " < model %" PRIu64,
         s.num_allocs, F.n_allocs);
  EXPECT(s.host_allocated.current == m.host_bytes + m.fb_bytes,
         "host_allocated %" PRIu64 ", the model has %" PRIu64 " pinned + %" PRIu64 " fallback",
         s.host_allocated.current, m.host_bytes, m.fb_bytes);
  EXPECT(s.host_reserved.current >= s.host_allocated.current, "host_reserved below host_allocated");
  EXPECT(s.num_host_allocs == F.n_host_allocs && s.num_host_frees == F.n_host_frees,
         "host allocs/frees %" PRIu64 "/%" PRIu64 ", model %" PRIu64 "/%" PRIu64, s.num_host_allocs,
         s.num_host_frees, F.n_host_allocs, F.n_host_frees);
  EXPECT(s.num_fallbacks == F.n_fallbacks && s.fallback_bytes == m.fb_bytes,
         "fallbacks %" PRIu64 " (%" PRIu64 " bytes), model %" PRIu64 " (%" PRIu64 ")",
         s.num_fallbacks, s.fallback_bytes, F.n_fallbacks, m.fb_bytes);
  /* A chain's callback may have submitted requests the model has not seen. */
  EXPECT(s.futures_submitted >= F.n_submitted &&
             s.futures_submitted <= F.n_submitted + (uint64_t)chains_awaiting(),
         "futures_submitted %" PRIu64 ", model %" PRIu64 " (+ up to %d from callbacks)",
         s.futures_submitted, F.n_submitted, chains_awaiting());
  if (inflight || F.reserve_unknown) return;
  /* Nothing in flight: exact. */
  EXPECT(s.futures_ready == F.n_ready && s.futures_failed == F.n_failed &&
             s.futures_timed_out == F.n_timed_out && s.queue_depth == 0,
         "futures ready/failed/timed out/queued %" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64
         ", model %" PRIu64 "/%" PRIu64 "/%" PRIu64 "/0",
         s.futures_ready, s.futures_failed, s.futures_timed_out, s.queue_depth, F.n_ready,
         F.n_failed, F.n_timed_out);
  EXPECT(s.hits_bin + s.hits_stream + s.hits_pool + s.hits_device + s.plan_hits +
                 s.num_fallbacks == s.num_allocs,
         "hits by level, plan_hits and num_fallbacks sum to %" PRIu64 ", num_allocs %" PRIu64,
         s.hits_bin + s.hits_stream + s.hits_pool + s.hits_device + s.plan_hits + s.num_fallbacks,
         s.num_allocs);
  EXPECT(accounting_holds(&s, m.planned_bytes),
           "accounting: reserved %" PRIu64 " + planned live %" PRIu64 " != allocated %" PRIu64
           " + stream_cached %" PRIu64 " + pending %" PRIu64 " + free %" PRIu64
           " + plan arena %" PRIu64,
           s.reserved.current, m.planned_bytes, s.allocated.current, s.stream_cached_bytes,
           s.pending_bytes, s.free_bytes, s.plan_arena_bytes);
  EXPECT(F.plan || (s.plan_state == 0 && s.plan_hits == 0 && s.plan_arena_bytes == 0 &&
                    s.plan_iterations == 0),
         "plan:off, yet plan_state %d, plan_hits %" PRIu64, s.plan_state, s.plan_hits);
  EXPECT(s.plan_iterations == F.marks, "plan_iterations %" PRIu64 ", the model made %" PRIu64
         " marks", s.plan_iterations, F.marks);
  EXPECT(s.active.current == s.allocated.current + s.pending_bytes,
         "active %" PRIu64 " != allocated + pending", s.active.current);
  if (futures_uncollected() == 0)
    EXPECT(s.allocated.current == m.dev_bytes && s.requested.current == m.dev_req,
           "allocated %" PRIu64 " / requested %" PRIu64 ", the model's live blocks hold %" PRIu64
           " / %" PRIu64 " (%" PRIu64 " blocks)",
           s.allocated.current, s.requested.current, m.dev_bytes, m.dev_req, m.dev_count);
}

/* One stream per step: gma_stream_stats against the model's generation. */
static void check_stream_stats(void) {
  int si = F.stream_rr++ % NSLOTS;
  if (!slot_live(si) || si == 4) return; /* the per-thread stream: covered via alloc checks */
  mstream_t *ms = &F.st[si];
  gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
  gma_status_t st = gma_stream_stats(F.g, handle_of(si), &ss);
  if (ms->has_record == 0) {
    EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_stream_stats of a stream gma has no record of");
    return;
  }
  if (ms->has_record == 1) EXPECT_ST(st, GMA_OK, "gma_stream_stats");
  if (st != GMA_OK) return;
  EXPECT(ss.hits + ss.misses == ss.allocs, "stream hits + misses != allocs");
  EXPECT(ss.safe_epoch < ss.epoch, "stream safe_epoch %" PRIu64 " >= epoch %" PRIu64, ss.safe_epoch,
         ss.epoch);
  /* plan:on: a plan's arena is an allocation of the legacy stream (an open
   * quirk, see the README): the default stream's counts are not exact. */
  if (ms->counts_exact && futures_in_flight() == 0 && !(F.plan && si == 3)) {
    EXPECT(ss.allocs == ms->allocs && ss.frees == ms->frees,
           "stream %d allocs/frees %" PRIu64 "/%" PRIu64 ", model %" PRIu64 "/%" PRIu64, si,
           ss.allocs, ss.frees, ms->allocs, ms->frees);
    uint64_t bytes = 0;
    for (int i = 0; i < F.nlive; i++)
      if (F.live[i].kind == GMA_MEMORY_DEVICE && F.live[i].si == si && F.live[i].gen == ms->gen)
        bytes += F.live[i].bsize;
    EXPECT(ss.allocated_bytes == bytes, "stream %d allocated_bytes %" PRIu64 ", model %" PRIu64, si,
           ss.allocated_bytes, bytes);
  }
}

/* What a failed call must leave as it was. */
typedef struct snap {
  bool valid;
  gma_stats_t s;
} snap_t;

static snap_t snap_take(void) {
  snap_t n = {0};
  observe_futures();
  if (futures_in_flight() || F.reserve_unknown) return n; /* the worker may change them */
  /* The worker may still be freeing a released future's memory. */
  n.s = stats_now();
  for (uint64_t t0 = now_ns();
       F.lag && (n.s.num_frees != F.n_frees || !accounting_holds(&n.s, model_sums().planned_bytes));
       n.s = stats_now()) {
    if (now_ns() - t0 > (uint64_t)SETTLE_MS * 1000000u) return n; /* check_stats will say */
    sleep_us(50);
  }
  F.lag = false;
  n.valid = true;
  return n;
}

static void snap_same(const snap_t *a, const char *what) {
  if (!a->valid) return;
  gma_stats_t b = stats_now();
  EXPECT(a->s.allocated.current == b.allocated.current &&
             a->s.requested.current == b.requested.current && a->s.num_allocs == b.num_allocs &&
             a->s.num_frees == b.num_frees && a->s.host_allocated.current == b.host_allocated.current &&
             a->s.num_host_allocs == b.num_host_allocs && a->s.num_host_frees == b.num_host_frees &&
             a->s.num_fallbacks == b.num_fallbacks && a->s.num_batches == b.num_batches,
         "%s changed the allocator: allocated %" PRIu64 " -> %" PRIu64 ", requested %" PRIu64
         " -> %" PRIu64 ", allocs %" PRIu64 " -> %" PRIu64 ", frees %" PRIu64 " -> %" PRIu64
         ", host allocated %" PRIu64 " -> %" PRIu64,
         what, a->s.allocated.current, b.allocated.current, a->s.requested.current,
         b.requested.current, a->s.num_allocs, b.num_allocs, a->s.num_frees, b.num_frees,
         a->s.host_allocated.current, b.host_allocated.current);
}

/* Nothing runs on the model's behalf and every byte gma holds for callers is
 * a live block of the model: no request in flight, no future's memory
 * uncollected, no released future's free trailing on the worker, no failed
 * gma_reserve to re-learn. */
static bool model_exact(void) {
  observe_futures();
  return !futures_in_flight() && !futures_uncollected() && !F.reserve_unknown && !F.lag;
}

static int planned_live(void) {
  int n = 0;
  for (int i = 0; i < F.nlive; i++) n += F.live[i].planned;
  return n;
}

/* gma_alloc of size said GMA_ERR_OOM. When its message blames "a real
 * shortage", the bytes it says stay in use whatever device work completes
 * are the allocations outside arenas plus the arenas whole, and with the
 * request they pass the limit. Under plan:on a planned block lies inside the
 * arena: counted on its own as well, a request that fits once freed memory
 * behind running kernels completes failed at once. When the model is exact,
 * those bytes are its live blocks less the planned ones plus
 * plan_arena_bytes (then, or before the call: arena_before; the worker may
 * give an idle arena back meanwhile). */
static void check_oom_cause(size_t size, uint64_t arena_before) {
  const char *e = gma_last_error();
  const char *k = strstr(e, "a real shortage: live allocations held ");
  if (!k) return;
  uint64_t held = 0, limit = 0, need = 0;
  EXPECT(sscanf(k, "a real shortage: live allocations held %" SCNu64 " bytes of memory_limit / "
                   "device capacity %" SCNu64 " when this call looked, so %" SCNu64,
                &held, &limit, &need) == 3,
         "an OOM message not as expected: %s", e);
  EXPECT(need >= size && limit == F.limit && (held >= limit || limit - held < need),
         "gma_alloc(%zu): a real shortage with %" PRIu64 " bytes held of %" PRIu64 ", %" PRIu64
         " more (the limit is %" PRIu64 ")", size, held, limit, need, F.limit);
  if (!model_exact()) return;
  sums_t m = model_sums();
  uint64_t arena = stats_now().plan_arena_bytes, want = m.dev_bytes - m.planned_bytes + arena;
  if (held == want - arena + arena_before) return;
  EXPECT(held == want,
         "gma_alloc(%zu) failed as a real shortage with %" PRIu64 " bytes held; the model's live "
         "blocks outside arenas (%" PRIu64 " of %" PRIu64 ", %" PRIu64 " planned) and the arena (%"
         PRIu64 ") make %" PRIu64 "%s", size, held, m.dev_bytes - m.planned_bytes, m.dev_bytes,
         m.planned_bytes, arena, want,
         want + need <= limit ? ": the request fits once device work completes" : "");
}

/* A gma_alloc that went past the pool (GMA_ERR_OOM, or the CPU fallback)
 * while a plan held an arena and no planned block was live took the arena
 * back first: an idle plan's arena is cache. pre: gma_stats before the call;
 * idle: the model had no planned block live then. */
static void check_arena_went(const gma_stats_t *pre, bool idle, const char *what) {
  if (!F.plan || !idle || !pre->plan_arena_bytes) return;
  gma_stats_t s = stats_now();
  EXPECT(s.plan_arena_bytes == 0 && s.plan_state != 4 &&
             (pre->plan_state != 4 || s.plan_replans > pre->plan_replans),
         "%s with an idle plan (state %d, arena %" PRIu64 ", no planned block live): state %d, arena %"
         PRIu64 ", re-plans %" PRIu64 " -> %" PRIu64, what, pre->plan_state, pre->plan_arena_bytes,
         s.plan_state, s.plan_arena_bytes, pre->plan_replans, s.plan_replans);
}

/* ---- registering allocations ---------------------------------------------------- */

/* [p, p + len) against every live range of the model. */
static void check_no_overlap(uintptr_t p, size_t len, const char *what) {
  uintptr_t e = p + (len ? len : 1);
  for (int i = 0; i < F.nlive; i++) {
    mblock_t *b = &F.live[i];
    if (p < b->p + b->size && b->p < e)
      FAIL("%s [%#" PRIxPTR ", +%zu) overlaps live block #%" PRIu64 " [%#" PRIxPTR ", +%zu)", what,
           p, len, b->id, b->p, b->size);
  }
  for (int i = 0; i < F.nhost; i++) {
    mhost_t *h = &F.host[i];
    if (p < h->p + h->size && h->p < e)
      FAIL("%s [%#" PRIxPTR ", +%zu) overlaps live host block #%" PRIu64 " [%#" PRIxPTR ", +%zu)",
           what, p, len, h->id, h->p, h->size);
  }
}

static void grave_remove(uintptr_t *grave, int *n, uintptr_t p) {
  for (int i = 0; i < *n; i++)
    if (grave[i] == p) grave[i] = grave[--*n];
}

static void grave_add(uintptr_t *grave, int *n, uintptr_t p) {
  if (*n < NGRAVE) grave[(*n)++] = p;
  else grave[F.next_id % NGRAVE] = p;
}

/* gma_alloc and friends returned ptr for size on slot si: check and add it.
 * how: 0 a single allocation (class-sized), 1 a batch block (512-rounded). */
static mblock_t *add_block(void *ptr, size_t size, int si, unsigned gen, gma_stream_t h, int thread,
                           int tag, int how) {
  uintptr_t p = (uintptr_t)ptr;
  bool planned = F.next_planned;
  F.next_planned = false;
  if (F.plan) { /* any allocation path: plan_hits rose since the last look */
    uint64_t hits = stats_now().plan_hits;
    planned |= hits > F.plan_hits_seen;
    F.plan_hits_seen = hits;
  }
  EXPECT(p != 0, "a successful allocation returned NULL");
  EXPECT(p % 256 == 0, "pointer %#" PRIxPTR " is not 256-byte aligned", p);
  check_no_overlap(p, size, "new allocation");
  EXPECT(F.nlive < MAX_LIVE, "model full");
  gma_pointer_info_t info = GMA_POINTER_INFO_INIT;
  gma_status_t st = gma_pointer_info(F.g, ptr, &info);
  EXPECT_ST(st, GMA_OK, "gma_pointer_info of a new allocation");
  EXPECT((uintptr_t)info.base == p, "pointer_info base %p for %#" PRIxPTR, info.base, p);
  EXPECT(info.requested == size, "pointer_info requested %zu, asked for %zu", info.requested, size);
  EXPECT(info.block_size >= size, "block_size %zu < size %zu", info.block_size, size);
  if (info.kind == GMA_MEMORY_DEVICE) {
    EXPECT(info.block_size % 512 == 0, "block_size %zu not a multiple of 512", info.block_size);
    if (how == 1 || planned || size > F.bin_max) { /* planned: its learned request, 512-rounded */
      EXPECT(info.block_size == round_up(size, 512),
             "block_size %zu for %zu bytes; expected them 512-rounded (%" PRIu64 ")",
             info.block_size, size, round_up(size, 512));
    } else {
      uint64_t c = class_round(size), next = class_round(c + 1);
      EXPECT(info.block_size >= c && info.block_size < next,
             "block_size %zu for %zu bytes; its size class is [%" PRIu64 ", %" PRIu64 ")",
             info.block_size, size, c, next);
    }
  } else {
    EXPECT(info.kind == GMA_MEMORY_FALLBACK && F.fallback, "pointer_info kind %d", (int)info.kind);
    EXPECT(info.block_size == class_round(size), "fallback block_size %zu for %zu bytes",
           info.block_size, size);
  }
  if (default_handle(h))
    EXPECT(default_handle(info.stream), "pointer_info stream %p, allocated on the default stream",
           info.stream);
  else
    EXPECT(info.stream == h, "pointer_info stream %p, allocated on %p", info.stream, h);
  const char *want_tag = tag >= 0 ? tag_names[tag] : "untagged";
  EXPECT(info.tag && strcmp(info.tag, want_tag) == 0, "pointer_info tag '%s', expected '%s'",
         info.tag ? info.tag : "(null)", want_tag);
  /* An interior byte names the same allocation. */
  if (size > 1) {
    gma_pointer_info_t in = GMA_POINTER_INFO_INIT;
    EXPECT_ST(gma_pointer_info(F.g, (char *)ptr + size - 1, &in), GMA_OK, "gma_pointer_info(last byte)");
    EXPECT(in.base == ptr, "pointer_info of the last byte gives base %p, not %p", in.base, ptr);
  }
  mblock_t *b = &F.live[F.nlive++];
  *b = (mblock_t){.p = p, .size = size, .bsize = info.block_size, .si = si, .gen = gen, .h = h,
                  .thread = thread, .tag = tag, .kind = info.kind, .planned = planned,
                  .id = ++F.next_id};
  grave_remove(F.grave, &F.ngrave, p);
  if (!F.collecting) tlog_add('A', p, size, h, info.block_size);
  if (info.kind == GMA_MEMORY_DEVICE) {
    if (F.st[si].gen == gen) F.st[si].allocs++;
  } else { /* a successful gma_alloc too: num_allocs counts it (callers count device blocks) */
    F.n_fallbacks++;
    F.n_allocs++;
  }
  return b;
}

static void remove_block(int i) {
  mblock_t *b = &F.live[i];
  grave_add(F.grave, &F.ngrave, b->p);
  F.live[i] = F.live[--F.nlive];
}

/* A live block of thread t (or any thread when t < 0), chosen by a byte. */
static int pick_block(int t, unsigned byte) {
  int idx[MAX_LIVE], n = 0;
  for (int i = 0; i < F.nlive; i++)
    if (t < 0 || F.live[i].thread == t) idx[n++] = i;
  if (!n) return -1;
  return idx[byte % (unsigned)n];
}

/* Kernels may use a block only on its own stream while that stream is the
 * one it was allocated on (not destroyed, not retired since). */
static bool block_usable(const mblock_t *b) {
  return !b->shared && slot_live(b->si) && F.st[b->si].gen == b->gen &&
         (b->si >= 3 || F.st[b->si].h == b->h);
}

/* ---- kernels ------------------------------------------------------------------ */

static void launch(int si, gma_stream_t h, gma_sim_kernel_fn fn, void *arg) {
  gma_status_t st = gma_sim_launch(F.g, h, fn, arg);
  EXPECT(st == GMA_OK, "gma_sim_launch on stream slot %d (%p) returned %s", si, h,
         gma_status_name(st));
  F.kernels_launched++;
}

static gate_t *gate_arm(unsigned which, uint64_t *gen) {
  gate_t *g = &F.gates[which % MAX_GATES];
  uint64_t opened = atomic_load(&g->opened);
  if (g->armed <= opened) g->armed = opened + 1;
  *gen = g->armed;
  return g;
}

/* Whether work queued on slot si now may wait for a gate still shut. */
static bool slot_blocked(int si) {
  for (int g = 0; g < MAX_GATES; g++)
    if (F.st[si].wait_gen[g] > atomic_load(&F.gates[g].opened)) return true;
  return false;
}

static void gates_open_all(void) {
  for (int i = 0; i < MAX_GATES; i++)
    if (F.gates[i].armed > atomic_load(&F.gates[i].opened))
      atomic_store_explicit(&F.gates[i].opened, F.gates[i].armed, memory_order_release);
}

/* Queues a pattern kernel over [base, base + len) on stream h.
 * arg byte: bit7 gated (bits 0-1 the gate), else hold (bits 0-5) microseconds. */
static uint64_t launch_pattern(int si, gma_stream_t h, uintptr_t base, size_t len, int mode,
                               uint64_t pattern, unsigned arg, uint64_t blk) {
  kern_t *k = malloc(sizeof *k);
  EXPECT(k != NULL, "host memory");
  *k = (kern_t){.base = base, .len = len, .mode = mode, .blk = blk, .opno = F.opno};
  k->pattern = pattern ? pattern : mix64(++F.next_pattern ^ 0x5eed);
  int k_gate_index = -1;
  uint64_t k_gate_gen = 0;
  if (mode == K_HOLD_ONE) {
    if (arg & 0x80) {
      k->gate = gate_arm(arg, &k->gate_gen);
      k_gate_index = (int)(k->gate - F.gates);
      k_gate_gen = k->gate_gen;
    } else {
      k->hold_us = (long)(arg & 63);
    }
  }
  uint64_t pat = k->pattern;
  _Atomic int *started = k->gate && F.opno <= MAX_OPS ? &F.started[F.opno] : NULL;
  if (started) atomic_store(started, 0);
  k->started = started;
  bool blocked = slot_blocked(si);
  launch(si, h, kern_run, k);
  /* A gated kernel is meant to own its memory from now on: unless its stream
   * waits for another gate first, let it write its pattern before going on,
   * so that whoever overwrites the memory too early does so after it (and
   * the kernel sees it at its check). Bounded, for a loaded machine. */
  uint64_t limit = (blocked || F.cfg.reuse == GMA_REUSE_WAIT ? 1 : 200) * 1000000ull;
  for (uint64_t t0 = now_ns(); started && !atomic_load_explicit(started, memory_order_acquire) &&
                               now_ns() - t0 < limit;)
    sleep_us(10);
  if (k_gate_index >= 0 && F.st[si].wait_gen[k_gate_index] < k_gate_gen)
    F.st[si].wait_gen[k_gate_index] = k_gate_gen;
  return pat;
}

/* ---- operations ------------------------------------------------------------------ */

static void op_host_free(rd_t *r);
static void free_block(int i, const char *what);
static void forget_freed(int i);

static void op_alloc(rd_t *r, int t, bool tagged) {
  int si = stream_of_thread(t);
  gma_stream_t h = handle_of(si);
  int tag = tagged ? (int)(rd8(r) % 8) : -1;
  size_t size = pick_size(r);
  if (F.nlive >= MAX_LIVE) { /* keep the model bounded: free one instead */
    free_block(pick_block(-1, (unsigned)size), "gma_free (model full)");
    return;
  }
  uint64_t fb_live = model_sums().fb_bytes;
  if (F.fallback && fb_live > 192 * MiB && size > MiB) size = MiB; /* bound host memory */
  snap_t before = snap_take();
  gma_stats_t pre = F.plan ? stats_now() : (gma_stats_t){0};
  bool idle = F.plan && planned_live() == 0;
  void *p = (void *)1;
  gma_status_t st = tagged ? gma_alloc_tagged(F.g, size, h, tag_names[tag], &p)
                           : gma_alloc(F.g, size, h, &p);
  F.next_planned = F.plan && st == GMA_OK && stats_now().plan_hits > pre.plan_hits;
  vlog("T%d slot %d size %zu tag %d -> %s %p%s", t, si, size, tag, gma_status_name(st), p,
       F.next_planned ? " (planned)" : "");
  bool bad_tag = tag >= 6;
  if (bad_tag) {
    EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_alloc_tagged with a bad tag");
  } else if (size == 0 || size > F.limit) {
    EXPECT_ST(st, GMA_ERR_INVALID_SIZE, "gma_alloc of a size never possible");
  } else {
    F.st[si].has_record = 1; /* the bins or the slow path: gma knows the stream now */
    EXPECT(st == GMA_OK || st == GMA_ERR_OOM || (st == GMA_ERR_DEVICE && F.faults),
           "gma_alloc(%zu) returned %s", size, gma_status_name(st));
  }
  if (st == GMA_OK) {
    mblock_t *b = add_block(p, size, si, F.st[si].gen, h, t, tagged ? tag : -1, 0);
    if (b->kind == GMA_MEMORY_DEVICE) F.n_allocs++;
    else check_arena_went(&pre, idle, "a CPU-fallback allocation");
    return;
  }
  EXPECT(p == NULL, "a failed gma_alloc left *out = %p", p);
  snap_same(&before, "a failed gma_alloc");
  if (st == GMA_ERR_OOM) {
    check_oom_cause(size, pre.plan_arena_bytes);
    check_arena_went(&pre, idle, "an OOM");
  }
}

static void free_block(int i, const char *what) {
  mblock_t *b = &F.live[i];
  /* A CPU-fallback block is host memory: when its event cannot be recorded
   * (injected faults) the free waits for its stream (host.c), as
   * gma_host_free does. */
  if (b->kind == GMA_MEMORY_FALLBACK && F.faults) gates_open_all();
  gma_status_t st = gma_free(F.g, (void *)b->p);
  vlog("%s block #%" PRIu64 " %#" PRIxPTR " (%zu) -> %s", what, b->id, b->p, b->size,
       gma_status_name(st));
  EXPECT_ST(st, GMA_OK, what);
  forget_freed(i);
}

/* Block i was freed (by gma_free that returned GMA_OK): the model follows. */
static void forget_freed(int i) {
  mblock_t *b = &F.live[i];
  tlog_add('F', b->p, b->size, b->h, b->bsize);
  F.n_frees++; /* a CPU-fallback block's free counts in num_frees too */
  if (b->kind == GMA_MEMORY_DEVICE && F.st[b->si].gen == b->gen) F.st[b->si].frees++;
  remove_block(i);
}

static void op_free(rd_t *r, int t) {
  int i = pick_block(t, rd8(r));
  if (i < 0) i = pick_block(-1, F.opno);
  if (i < 0) return;
  free_block(i, "gma_free");
}

/* An address in no live model block, or interior to one (*inside set). */
static bool in_live_block(uintptr_t a, bool *start) {
  for (int i = 0; i < F.nlive; i++)
    if (a >= F.live[i].p && a < F.live[i].p + F.live[i].size) {
      *start = a == F.live[i].p;
      return true;
    }
  for (int i = 0; i < F.nhost; i++)
    if (a >= F.host[i].p && a < F.host[i].p + F.host[i].size) {
      *start = a == F.host[i].p;
      return true;
    }
  *start = false;
  return false;
}

static bool any_future_busy(void) {
  for (int i = 0; i < MAX_FUT; i++)
    if (F.fut[i].used) return true;
  return false;
}

static void op_misuse(rd_t *r, int t) {
  unsigned v = rd8(r), a = rd8(r), x = rd8(r); /* always three bytes */
  static char not_ours[64];
  snap_t before = snap_take();
  gma_status_t st;
  const char *what = "misuse";
  switch (v % 16) {
    case 0: { /* double free of a freed address */
      if (!F.ngrave || any_future_busy()) return; /* an uncollected future may own it */
      uintptr_t p = F.grave[a % (unsigned)F.ngrave];
      bool start, in = in_live_block(p, &start);
      if (in && start) return; /* reused: it is live again */
      st = gma_free(F.g, (void *)p);
      what = "double free";
      if (in) EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_free of an address inside a live block");
      else
        EXPECT(st == GMA_ERR_DOUBLE_FREE || st == GMA_ERR_INVALID_POINTER,
               "double free of %#" PRIxPTR " returned %s", p, gma_status_name(st));
      break;
    }
    case 1: { /* interior pointer */
      int i = pick_block(-1, a);
      if (i < 0 || F.live[i].bsize <= 256 || F.live[i].size <= 256) return;
      mblock_t *b = &F.live[i];
      uintptr_t p = b->p + 256 * (1 + x % ((b->size - 1) / 256));
      if (p >= b->p + b->size) p = b->p + 256;
      st = gma_free(F.g, (void *)p);
      what = "interior free";
      EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_free of an interior pointer");
      /* record_stream names the whole allocation from any pointer inside it
       * (issue 17), as op_record does from its start. */
      int ui = pick_stream(a);
      st = gma_record_stream(F.g, (void *)p, handle_of(ui));
      EXPECT_ST(st, GMA_OK, "gma_record_stream of an interior pointer");
      if (b->kind == GMA_MEMORY_DEVICE) F.st[ui].has_record = 1;
      break;
    }
    case 2: /* foreign: static memory, then a small integer */
      st = gma_free(F.g, not_ours + 32);
      what = "foreign free";
      EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_free of a foreign pointer");
      st = gma_free(F.g, (void *)(uintptr_t)(0x1000 + 256 * (a % 16)));
      EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_free of a small integer");
      st = gma_host_free(F.g, not_ours);
      EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_host_free of a foreign pointer");
      break;
    case 3: { /* the wrong free for the memory */
      if (F.nhost) {
        st = gma_free(F.g, (void *)F.host[a % (unsigned)F.nhost].p);
        EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_free of pinned host memory");
      }
      int i = pick_block(-1, a);
      if (i >= 0) {
        st = gma_host_free(F.g, (void *)F.live[i].p);
        EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_host_free of gma_alloc memory");
      }
      what = "wrong free";
      break;
    }
    case 4: { /* record_stream of a freed address */
      if (!F.ngrave || any_future_busy()) return;
      uintptr_t p = F.grave[a % (unsigned)F.ngrave];
      bool start;
      if (in_live_block(p, &start)) return;
      st = gma_record_stream(F.g, (void *)p, handle_of(pick_stream(a)));
      what = "record_stream of a freed pointer";
      EXPECT_ST(st, GMA_ERR_INVALID_POINTER, what);
      st = gma_record_stream(F.g, NULL, NULL);
      EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_record_stream(NULL)");
      break;
    }
    case 5: /* NULL is a no-op */
      EXPECT_ST(gma_free(F.g, NULL), GMA_OK, "gma_free(NULL)");
      EXPECT_ST(gma_host_free(F.g, NULL), GMA_OK, "gma_host_free(NULL)");
      what = "free(NULL)";
      break;
    case 6: /* the default streams cannot be destroyed */
      EXPECT_ST(gma_stream_destroy(F.g, NULL), GMA_ERR_INVALID_ARGUMENT, "gma_stream_destroy(NULL)");
      EXPECT_ST(gma_stream_destroy(F.g, GMA_STREAM_LEGACY), GMA_ERR_INVALID_ARGUMENT,
                "gma_stream_destroy(LEGACY)");
      EXPECT_ST(gma_stream_destroy(F.g, GMA_STREAM_PER_THREAD), GMA_ERR_INVALID_ARGUMENT,
                "gma_stream_destroy(PER_THREAD)");
      what = "destroy default streams";
      break;
    case 7: { /* a destroyed stream's handle (unless a new stream got it) */
      if (!F.ndead) return;
      gma_stream_t h = F.dead[a % (unsigned)F.ndead];
      if (handle_is_live(h)) return;
      void *p = (void *)1;
      st = gma_alloc(F.g, 4096, h, &p);
      EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_alloc on a destroyed stream");
      EXPECT(p == NULL, "failed gma_alloc left *out set");
      kern_t *k = calloc(1, sizeof *k);
      st = gma_sim_launch(F.g, h, kern_run, k);
      EXPECT(st != GMA_OK, "gma_sim_launch on a destroyed stream succeeded");
      free(k);
      int i = pick_block(-1, a);
      if (i >= 0) {
        st = gma_record_stream(F.g, (void *)F.live[i].p, h);
        EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_record_stream to a destroyed stream");
      }
      size_t one = 512;
      void *ptrs[1] = {(void *)7};
      st = gma_alloc_batch(F.g, 1, &one, h, ptrs);
      EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_alloc_batch on a destroyed stream");
      EXPECT(ptrs[0] == (void *)7, "a failed batch wrote its pointers");
      what = "destroyed stream";
      break;
    }
    case 8: { /* async on the per-thread stream, and without a worker */
      gma_future_t *f = (gma_future_t *)1;
      st = gma_alloc_async(F.g, 4096, GMA_STREAM_PER_THREAD, NULL, &f);
      EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_alloc_async(PER_THREAD)");
      EXPECT(f == NULL, "failed gma_alloc_async left *out set");
      gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
      o.size = 3; /* not made with GMA_ASYNC_OPTIONS_INIT */
      st = gma_alloc_async(F.g, 4096, NULL, &o, &f);
      EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_alloc_async with a bad options size");
      what = "async misuse";
      break;
    }
    case 9: { /* bad batches */
      size_t sizes[3] = {4096, 0, 512};
      void *ptrs[3] = {(void *)7, (void *)7, (void *)7};
      st = gma_alloc_batch(F.g, 3, sizes, handle_of(stream_of_thread(t)), ptrs);
      EXPECT_ST(st, GMA_ERR_INVALID_SIZE, "gma_alloc_batch with a 0 size");
      st = gma_alloc_batch(F.g, 0, sizes, NULL, ptrs);
      EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_alloc_batch(n = 0)");
      sizes[1] = (size_t)F.limit;
      st = gma_alloc_batch(F.g, 3, sizes, NULL, ptrs);
      EXPECT_ST(st, GMA_ERR_INVALID_SIZE, "gma_alloc_batch above the limit");
      EXPECT(ptrs[0] == (void *)7 && ptrs[1] == (void *)7, "a failed batch wrote its pointers");
      what = "bad batch";
      break;
    }
    case 10: { /* structs not made with their INIT macros */
      gma_stats_t s = GMA_STATS_INIT;
      s.size = 1;
      EXPECT_ST(gma_stats(F.g, &s), GMA_ERR_INVALID_ARGUMENT, "gma_stats with a bad size");
      gma_pointer_info_t pi = GMA_POINTER_INFO_INIT;
      pi.size = sizeof pi + 8;
      EXPECT_ST(gma_pointer_info(F.g, not_ours, &pi), GMA_ERR_INVALID_ARGUMENT,
                "gma_pointer_info with a bad size");
      gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
      ss.size = 0;
      EXPECT_ST(gma_stream_stats(F.g, NULL, &ss), GMA_ERR_INVALID_ARGUMENT,
                "gma_stream_stats with a bad size");
      what = "bad struct sizes";
      break;
    }
    case 11: { /* host double free */
      if (!F.nhost_grave) return;
      uintptr_t p = F.host_grave[a % (unsigned)F.nhost_grave];
      bool start;
      if (in_live_block(p, &start)) return;
      st = gma_host_free(F.g, (void *)p);
      what = "host double free";
      EXPECT(st == GMA_ERR_DOUBLE_FREE || st == GMA_ERR_INVALID_POINTER,
             "host double free returned %s", gma_status_name(st));
      break;
    }
    case 12: { /* a fallback block through gma_host_free, an interior host pointer */
      for (int i = 0; i < F.nlive; i++)
        if (F.live[i].kind == GMA_MEMORY_FALLBACK) {
          st = gma_host_free(F.g, (void *)F.live[i].p);
          EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_host_free of a CPU-fallback block");
          break;
        }
      if (F.nhost && F.host[a % (unsigned)F.nhost].size > 256) {
        st = gma_host_free(F.g, (void *)(F.host[a % (unsigned)F.nhost].p + 256));
        EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_host_free of an interior pointer");
      }
      what = "host misuse";
      break;
    }
    case 13: { /* pointer info of freed and foreign addresses */
      gma_pointer_info_t pi = GMA_POINTER_INFO_INIT;
      st = gma_pointer_info(F.g, not_ours, &pi);
      EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_pointer_info of a foreign pointer");
      if (F.ngrave && !any_future_busy()) {
        uintptr_t p = F.grave[a % (unsigned)F.ngrave];
        bool start;
        if (!in_live_block(p, &start)) {
          st = gma_pointer_info(F.g, (void *)p, &pi);
          /* The model knows requested sizes; gma's blocks are rounded up, so
           * a freed address can lie in the rounding tail of a live block that
           * starts below it. Then gma must name that block. */
          bool in_tail = false;
          for (int i = 0; st == GMA_OK && i < F.nlive; i++)
            if ((uintptr_t)pi.base == F.live[i].p && p < F.live[i].p + pi.block_size) in_tail = true;
          for (int i = 0; st == GMA_OK && i < F.nhost; i++)
            if ((uintptr_t)pi.base == F.host[i].p && p < F.host[i].p + pi.block_size) in_tail = true;
          if (!in_tail)
            EXPECT_ST(st, GMA_ERR_INVALID_POINTER, "gma_pointer_info of a freed pointer");
        }
      }
      what = "pointer info misuse";
      break;
    }
    case 14: { /* bad sizes for the other calls */
      void *p = (void *)1;
      EXPECT_ST(gma_host_alloc(F.g, 0, NULL, &p), GMA_ERR_INVALID_SIZE, "gma_host_alloc(0)");
      gma_future_t *f = (gma_future_t *)1;
      st = gma_alloc_async(F.g, 0, NULL, NULL, &f);
      EXPECT_ST(st, F.worker ? GMA_ERR_INVALID_SIZE : GMA_ERR_UNSUPPORTED, "gma_alloc_async(0)");
      EXPECT(f == NULL, "failed gma_alloc_async left *out set");
      size_t big = (size_t)F.limit + 1;
      st = gma_reserve(F.g, NULL, 1, &big, &(size_t){1});
      EXPECT_ST(st, GMA_ERR_INVALID_SIZE, "gma_reserve above the limit");
      what = "bad sizes";
      break;
    }
    default: /* NULL allocator and out-parameters */
      EXPECT_ST(gma_alloc(NULL, 512, NULL, &(void *){0}), GMA_ERR_INVALID_ARGUMENT, "gma_alloc(NULL g)");
      EXPECT_ST(gma_alloc(F.g, 512, NULL, NULL), GMA_ERR_INVALID_ARGUMENT, "gma_alloc(NULL out)");
      EXPECT_ST(gma_free(NULL, not_ours), GMA_ERR_INVALID_ARGUMENT, "gma_free(NULL g)");
      EXPECT_ST(gma_future_poll(NULL), GMA_ERR_INVALID_ARGUMENT, "gma_future_poll(NULL)");
      EXPECT_ST(gma_future_release(NULL), GMA_OK, "gma_future_release(NULL)");
      what = "NULL arguments";
      break;
  }
  vlog("%s (variant %u)", what, v % 16);
  snap_same(&before, what);
}

/* gma_record_stream, with or without a kernel on the other stream. */
static void op_record(rd_t *r, int t) {
  int i = pick_block(t, rd8(r));
  unsigned u_byte = rd8(r), mode = rd8(r);
  if (i < 0) return;
  mblock_t *b = &F.live[i];
  int ui = pick_stream(u_byte);
  gma_stream_t uh = handle_of(ui);
  /* CPU-fallback blocks too: the host pool records an event on each stream
   * named, and their reuse waits for all of them. */
  bool cross = (mode & 1) && block_usable(b) && ui != b->si;
  if (cross) {
    /* Whatever the owner queued is checked first, then the other stream
     * waits for the owner's work (a flag) and runs its own kernel. */
    gma_stream_t sh = handle_of(b->si);
    if (b->pat) launch_pattern(b->si, sh, b->p, b->size, K_CHECK_ONLY, b->pat, 0, b->id);
    xflag_t *f = calloc(1, sizeof *f);
    EXPECT(f != NULL, "host memory");
    f->opno = F.opno;
    launch(b->si, sh, flag_set_kernel, f);
    launch(ui, uh, flag_wait_kernel, f);
    for (int g = 0; g < MAX_GATES; g++) /* u now waits for whatever the owner waits for */
      if (F.st[ui].wait_gen[g] < F.st[b->si].wait_gen[g]) F.st[ui].wait_gen[g] = F.st[b->si].wait_gen[g];
    launch_pattern(ui, uh, b->p, b->size, K_HOLD_ONE, 0, mode >> 1 | ((mode & 2) ? 0x80 : 0),
                   b->id);
    b->shared = true;
  }
  gma_status_t st = gma_record_stream(F.g, (void *)b->p, uh);
  vlog("block #%" PRIu64 " (slot %d) used on slot %d%s -> %s", b->id, b->si, ui,
       cross ? " by a kernel" : "", gma_status_name(st));
  EXPECT_ST(st, GMA_OK, "gma_record_stream");
  if (b->kind == GMA_MEMORY_DEVICE) /* the pool resolved it as the block's user (a fallback */
    F.st[ui].has_record = 1;         /* block's streams are the host pool's business) */
}

static void op_kernel(rd_t *r, int t, int mode) {
  int i = pick_block(t, rd8(r));
  unsigned arg = rd8(r);
  if (i < 0) return;
  mblock_t *b = &F.live[i];
  if (!block_usable(b)) return;
  if (mode == K_CHECK_ONLY && !b->pat) return;
  uint64_t pat = launch_pattern(b->si, handle_of(b->si), b->p, b->size, mode,
                                mode == K_CHECK_ONLY ? b->pat : 0, arg, b->id);
  b->pat = pat;
  vlog("%s on block #%" PRIu64 " (slot %d, %zu bytes)%s", mode == K_FILL_ONLY ? "fill"
                                                        : mode == K_CHECK_ONLY ? "check" : "hold",
       b->id, b->si, b->size, mode == K_HOLD_ONE && (arg & 0x80) ? " gated" : "");
}

static void op_gate_open(rd_t *r) {
  gate_t *g = &F.gates[rd8(r) % MAX_GATES];
  if (g->armed > atomic_load(&g->opened)) atomic_store_explicit(&g->opened, g->armed, memory_order_release);
  vlog("gate %ld", (long)(g - F.gates));
}

/* ---- futures ------------------------------------------------------------------ */

static void future_cb(gma_future_t *f, gma_status_t status, void *user);

/* A chain's next request, from the parent m's callback (on the worker, or
 * on the fuzzer's thread inside the parent's submit): results in m's
 * child_* fields, published by the callback's cb_runs release. */
static void chain_submit(mfut_t *m) {
  mfut_t *c = m->child;
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.timeout_ns = 2000000;
  o.nonblocking = m->child_nonblocking;
  o.worker_only = m->child_worker_only;
  o.callback = future_cb;
  o.user = c;
  gma_future_t *f = NULL;
  m->child_st = gma_alloc_async(F.g, m->child_size, c->h, &o, &f);
  m->child_f = f;
  m->child_tried = true;
}

static void future_cb(gma_future_t *f, gma_status_t status, void *user) {
  mfut_t *m = user;
  gma_status_t now = gma_future_status(f);
  if (now != status) {
    fprintf(stderr, "fuzz_gma: CHECK FAILED: a future's callback saw %s but gma_future_status "
                    "says %s\n", gma_status_name(status), gma_status_name(now));
    abort();
  }
  /* A callback runs on the worker, or on the submitting thread inside the
   * submit that completed it at once: never on a thread waiting on it. */
  m->cb_on_fuzzer = pthread_equal(pthread_self(), F.main_thread);
  if (m->cb_on_fuzzer && !F.in_submit) {
    fprintf(stderr, "fuzz_gma: CHECK FAILED: a future's callback (%s) ran on the fuzzer's "
                    "thread outside the submit (a wait served it)\n", gma_status_name(status));
    abort();
  }
  if (m->child && status == GMA_OK) chain_submit(m);
  atomic_store_explicit(&m->cb_status, (int)status, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->cb_runs, 1, memory_order_release); /* pairs with observe's acquire */
}

static mfut_t *fut_slot(void) {
  int unreleased = 0;
  for (int i = 0; i < MAX_FUT; i++) unreleased += F.fut[i].used && !F.fut[i].released;
  if (unreleased >= MAX_UNRELEASED) return NULL;
  for (int i = 0; i < MAX_FUT; i++)
    if (!F.fut[i].used) return &F.fut[i];
  return NULL;
}

/* A fresh future slot for a request of n blocks on slot si. */
static void fut_init(mfut_t *m, int si, bool batch, size_t n, const size_t *sizes) {
  memset(m, 0, sizeof *m);
  atomic_init(&m->cb_status, GMA_PENDING);
  atomic_init(&m->cb_runs, 0);
  m->seen = GMA_PENDING;
  m->batch = batch;
  m->n = n;
  memcpy(m->sizes, sizes, n * sizeof *sizes);
  for (size_t k = 0; k < MAX_BATCH; k++) m->ptrs[k] = (void *)7;
  m->si = si;
  m->gen = F.st[si].gen;
  m->h = handle_of(si);
  m->fid = ++F.next_fid;
}

/* Makes m the head of a chain: its callback, on GMA_OK, submits one more
 * request on the same stream into a slot reserved now (so it comes after
 * m in F.fut: m took the first free one). Argument byte b: bits 0-5 the
 * size (512 B .. 32 KiB), bit 6 worker_only, bit 7 nonblocking. NULL when
 * no slot is free. */
static mfut_t *chain_reserve(mfut_t *m, unsigned b) {
  m->used = true; /* so fut_slot passes it by; op_async settles it */
  mfut_t *c = fut_slot();
  m->used = false;
  if (!c) return NULL;
  size_t size = 512 * (1 + (b & 63));
  fut_init(c, m->si, false, 1, &size);
  c->used = true;
  c->awaiting = true;
  m->child = c;
  m->child_size = size;
  m->child_worker_only = (b >> 6) & 1;
  m->child_nonblocking = (b >> 7) & 1;
  return c;
}

static void op_async(rd_t *r, int t, bool batch) {
  int si = stream_of_thread(t);
  if (rd8(r) & 1) si = pick_stream(rd8(r)); /* any stream, per-thread included */
  unsigned ob = rd8(r);
  size_t n = batch ? 1 + rd8(r) % MAX_BATCH : 1;
  size_t sizes[MAX_BATCH];
  uint64_t total = 0;
  bool bad_size = false;
  for (size_t k = 0; k < n; k++) {
    sizes[k] = pick_size(r);
    if (sizes[k] > 4 * MiB && (ob & 0x40)) sizes[k] %= 4 * MiB; /* keep some batches small */
    if (sizes[k] == 0 || sizes[k] > F.limit) bad_size = true;
    else total += round_up(sizes[k], 512);
  }
  if (total > F.limit) bad_size = true;
  bool chain = (ob & 0xb8) == 0xb8;
  unsigned chain_arg = chain ? rd8(r) : 0;
  mfut_t *m = fut_slot();
  if (!m) return;
  fut_init(m, si, batch, n, sizes);
  mfut_t *child = chain ? chain_reserve(m, chain_arg) : NULL;
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  static const uint64_t timeouts[4] = {0, 50000, 2000000, 20000000};
  o.timeout_ns = timeouts[ob & 3];
  o.nonblocking = (ob >> 2) & 1;
  o.callback = future_cb;
  o.user = m;
  snap_t before = snap_take();
  gma_future_t *f = (gma_future_t *)1;
  F.in_submit = true; /* a callback may run here (complete at once), and submit */
  gma_status_t st = batch ? gma_alloc_batch_async(F.g, n, sizes, m->h, m->ptrs, &o, &f)
                          : gma_alloc_async(F.g, sizes[0], m->h, &o, &f);
  F.in_submit = false;
  if (F.verbose) {
    char list[256] = "";
    for (size_t k = 0, at = 0; k < n && at < sizeof list; k++)
      at += (size_t)snprintf(list + at, sizeof list - at, "%s%zu", k ? "," : "", sizes[k]);
    vlog("%s sizes %s slot %d timeout %" PRIu64 " nb %d -> %s", batch ? "batch" : "single", list, si,
         o.timeout_ns, o.nonblocking, gma_status_name(st));
  }
  if (si == 4) {
    EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_alloc_async on the per-thread stream");
  } else if (!F.worker) {
    EXPECT_ST(st, GMA_ERR_UNSUPPORTED, "gma_alloc_async without a worker");
  } else if (bad_size) {
    EXPECT_ST(st, GMA_ERR_INVALID_SIZE, "gma_alloc_async of a size never possible");
  } else {
    EXPECT(st == GMA_OK || (st == GMA_ERR_BUSY && o.nonblocking), "gma_alloc_async returned %s",
           gma_status_name(st));
  }
  if (st != GMA_OK) {
    EXPECT(f == NULL, "a failed gma_alloc_async left *out = %p", (void *)f);
    for (size_t k = 0; k < MAX_BATCH; k++) EXPECT(m->ptrs[k] == (void *)7, "a failed batch wrote ptrs");
    EXPECT(atomic_load(&m->cb_runs) == 0, "the callback of a refused request ran");
    snap_same(&before, "a refused gma_alloc_async");
    m->used = false;
    m->child = NULL;
    if (child) fut_free_slot(child);
    return;
  }
  if (child)
    vlog("chain: future %ld submits future %ld (%zu bytes%s%s) when it completes", (long)(m - F.fut),
         (long)(child - F.fut), m->child_size, m->child_worker_only ? ", worker_only" : "",
         m->child_nonblocking ? ", nonblocking" : "");
  m->used = true;
  m->f = f;
  F.n_submitted++;
  F.st[si].has_record = F.st[si].has_record == 1 ? 1 : -1; /* the worker may resolve it */
  F.st[si].counts_exact = false;
}

static mfut_t *pick_future(unsigned b, bool unreleased) {
  int idx[MAX_FUT], n = 0;
  for (int i = 0; i < MAX_FUT; i++)
    if (F.fut[i].used && !F.fut[i].awaiting && (!unreleased || !F.fut[i].released)) idx[n++] = i;
  return n ? &F.fut[idx[b % (unsigned)n]] : NULL;
}

static void fut_seen(mfut_t *m, gma_status_t st, const char *what) {
  if (st == GMA_PENDING) {
    EXPECT(m->seen == GMA_PENDING, "%s: PENDING after the future was seen complete (%s)", what,
           gma_status_name((gma_status_t)m->seen));
    return;
  }
  EXPECT(st == GMA_OK || st == GMA_ERR_TIMEOUT || (st == GMA_ERR_DEVICE && F.faults),
         "%s returned %s", what, gma_status_name(st));
  if (m->seen != GMA_PENDING)
    EXPECT(m->seen == (int)st, "%s: %s, earlier %s", what, gma_status_name(st),
           gma_status_name((gma_status_t)m->seen));
  m->seen = st;
  if (atomic_load_explicit(&m->cb_runs, memory_order_acquire))
    EXPECT(atomic_load(&m->cb_status) == (int)st, "%s: %s, the callback saw %s", what,
           gma_status_name(st), gma_status_name((gma_status_t)atomic_load(&m->cb_status)));
}

static void op_poll(rd_t *r) {
  mfut_t *m = pick_future(rd8(r), true);
  if (!m) return;
  gma_status_t st = gma_future_poll(m->f);
  vlog("future %ld -> %s", (long)(m - F.fut), gma_status_name(st));
  fut_seen(m, st, "gma_future_poll");
  EXPECT(gma_future_status(m->f) == st || st == GMA_PENDING, "gma_future_status disagrees with poll");
}

/* Collects a completed future's memory into the model (first time only). */
static void fut_collect(mfut_t *m, void *first) {
  void *ptrs[MAX_BATCH];
  if (m->batch) memcpy(ptrs, m->ptrs, m->n * sizeof *ptrs);
  else ptrs[0] = first;
  if (m->collected) {
    for (size_t k = 0; k < m->n; k++)
      EXPECT(ptrs[k] == m->got[k], "a second wait returned %p, the first %p", ptrs[k], m->got[k]);
    return;
  }
  m->collected = true;
  tfut_collected(m->fid);
  for (size_t k = 0; k < m->n; k++) {
    m->got[k] = ptrs[k];
    if (F.nlive >= MAX_LIVE) { /* no room in the model: give it back at once */
      EXPECT_ST(gma_free(F.g, ptrs[k]), GMA_OK, "gma_free of a future's block");
      tlog_add('F', (uintptr_t)ptrs[k], m->sizes[k], m->h, 0);
      F.n_frees++;
      if (F.st[m->si].gen == m->gen) F.st[m->si].frees++;
      continue;
    }
    F.collecting = true; /* its rows are async_complete (a batch's: allocate rows with Block 0) */
    add_block(ptrs[k], m->sizes[k], m->si, m->gen, m->h, (int)(F.opno & 3), -1, m->batch ? 1 : 0);
    F.collecting = false;
  }
  if (m->batch && m->n > 1) {
    /* All or nothing, and each pointer distinct (add_block checked overlaps). */
  }
}

static void op_wait(rd_t *r) {
  mfut_t *m = pick_future(rd8(r), true);
  unsigned w = rd8(r);
  if (!m) return;
  static const uint64_t waits[4] = {0, 100000, 5000000, UINT64_MAX};
  uint64_t timeout = waits[w & 3];
  bool want_ptr = !(w & 4) || m->batch;
  void *p = (void *)1;
  gma_status_t st = gma_future_wait(m->f, timeout, want_ptr ? &p : NULL);
  vlog("future %ld timeout %" PRIu64 " -> %s %p", (long)(m - F.fut), timeout, gma_status_name(st),
       want_ptr ? p : NULL);
  if (m->collected && want_ptr) { /* one wait collects; every later one is told so */
    EXPECT_ST(st, GMA_ERR_ALREADY_COLLECTED, "a second collecting gma_future_wait");
    EXPECT(p == NULL, "a second wait handed out %p", p);
    return;
  }
  if (timeout == UINT64_MAX) EXPECT(st != GMA_PENDING, "an unlimited wait returned PENDING");
  fut_seen(m, st, "gma_future_wait");
  if (st == GMA_PENDING) return;
  /* The callback has run before a wait returns a final status. */
  EXPECT(atomic_load_explicit(&m->cb_runs, memory_order_acquire) == 1,
         "gma_future_wait returned %s before the callback ran", gma_status_name(st));
  observe_futures();
  if (st == GMA_OK && want_ptr) {
    if (!m->batch) EXPECT(p != NULL && p != (void *)1, "wait gave no pointer");
    fut_collect(m, p);
  }
}

static void op_release(rd_t *r) {
  mfut_t *m = pick_future(rd8(r), true);
  if (!m) return;
  observe_futures();
  bool done_ok = m->accounted && atomic_load(&m->cb_status) == GMA_OK;
  gma_status_t st = gma_future_release(m->f);
  vlog("future %ld (%s, %scollected) -> %s", (long)(m - F.fut),
       m->accounted ? gma_status_name((gma_status_t)atomic_load(&m->cb_status)) : "pending",
       m->collected ? "" : "not ", gma_status_name(st));
  EXPECT_ST(st, GMA_OK, "gma_future_release");
  m->released = true;
  m->f = NULL;
  if (done_ok && !m->collected) F.n_frees += m->n; /* the release frees what nobody collected */
  if (done_ok && !m->collected && F.st[m->si].gen == m->gen) F.st[m->si].frees += m->n;
  if (m->accounted) fut_free_slot(m);
}

/* ---- batches, trims, streams ---------------------------------------------------- */

static void op_batch(rd_t *r, int t) {
  int si = stream_of_thread(t);
  gma_stream_t h = handle_of(si);
  size_t n = 1 + rd8(r) % MAX_BATCH;
  unsigned shape = rd8(r);
  size_t sizes[MAX_BATCH];
  uint64_t total = 0;
  bool bad = false;
  for (size_t k = 0; k < n; k++) {
    sizes[k] = pick_size(r);
    if ((shape & 1) && sizes[k] > 2 * MiB) sizes[k] %= 2 * MiB; /* mostly small batches */
    if (sizes[k] == 0 || sizes[k] > F.limit) bad = true;
    else total += round_up(sizes[k], 512);
  }
  if (total > F.limit) bad = true;
  if (F.nlive + (int)n > MAX_LIVE) return;
  void *ptrs[MAX_BATCH];
  for (size_t k = 0; k < MAX_BATCH; k++) ptrs[k] = (void *)7;
  snap_t before = snap_take();
  gma_status_t st = gma_alloc_batch(F.g, n, sizes, h, ptrs);
  vlog("T%d slot %d n %zu total %" PRIu64 " -> %s", t, si, n, total, gma_status_name(st));
  if (bad) {
    EXPECT_ST(st, GMA_ERR_INVALID_SIZE, "gma_alloc_batch of sizes never possible");
  } else {
    F.st[si].has_record = 1;
    EXPECT(st == GMA_OK || st == GMA_ERR_OOM || (st == GMA_ERR_DEVICE && F.faults),
           "gma_alloc_batch returned %s", gma_status_name(st));
  }
  if (st != GMA_OK) {
    for (size_t k = 0; k < MAX_BATCH; k++) EXPECT(ptrs[k] == (void *)7, "a failed batch wrote ptrs");
    snap_same(&before, "a failed gma_alloc_batch");
    return;
  }
  for (size_t k = n; k < MAX_BATCH; k++) EXPECT(ptrs[k] == (void *)7, "a batch wrote past n");
  for (size_t k = 0; k < n; k++) {
    add_block(ptrs[k], sizes[k], si, F.st[si].gen, h, t, -1, 1);
    F.n_allocs++;
  }
  /* Not split: the blocks lie one after another (front to back). */
  if (before.valid) {
    gma_stats_t s = stats_now();
    EXPECT(s.num_batches == before.s.num_batches + 1, "num_batches did not count the batch");
    if (s.num_batches_split == before.s.num_batches_split)
      for (size_t k = 0; k + 1 < n; k++)
        EXPECT((uintptr_t)ptrs[k + 1] == (uintptr_t)ptrs[k] + round_up(sizes[k], 512),
               "an unsplit batch is not contiguous: block %zu at %p, block %zu at %p", k, ptrs[k],
               k + 1, ptrs[k + 1]);
  }
}

static void op_trim(rd_t *r, bool empty) {
  static const uint64_t keeps[4] = {0, MiB, 16 * MiB, UINT64_MAX};
  uint64_t keep = keeps[rd8(r) & 3];
  snap_t before = snap_take();
  gma_stats_t pre = F.plan ? stats_now() : (gma_stats_t){0};
  bool idle = F.plan && planned_live() == 0;
  gma_status_t st = empty ? gma_empty_cache(F.g) : gma_trim(F.g, keep);
  vlog("%s keep %" PRIu64 " -> %s", empty ? "empty_cache" : "trim", keep, gma_status_name(st));
  EXPECT(st == GMA_OK || (st == GMA_ERR_DEVICE && F.faults), "%s returned %s",
         empty ? "gma_empty_cache" : "gma_trim", gma_status_name(st));
  /* An idle plan's arena is cache: all of it goes with the rest. */
  if (st == GMA_OK && (empty || keep == 0))
    check_arena_went(&pre, idle, empty ? "gma_empty_cache" : "gma_trim(g, 0)");
  if (before.valid) {
    gma_stats_t s = stats_now();
    EXPECT(s.allocated.current == before.s.allocated.current && s.num_allocs == before.s.num_allocs,
           "a trim changed what is allocated");
    EXPECT(s.bytes_trimmed >= before.s.bytes_trimmed, "bytes_trimmed went down");
  }
}

static void sync_stream(int si) {
  gma_status_t st = gma_stream_synchronize(F.g, handle_of(si));
  EXPECT_ST(st, GMA_OK, "gma_stream_synchronize");
}

static void op_sync(int t) {
  gates_open_all(); /* a gated kernel would hold the stream forever */
  int si = stream_of_thread(t);
  if (!slot_live(si)) return;
  sync_stream(si);
  vlog("slot %d", si);
}

static void sync_all(void) {
  gates_open_all();
  for (int si = 0; si < NSLOTS; si++)
    if (slot_live(si)) sync_stream(si);
}

static void op_retire(int t) {
  int si = stream_of_thread(t);
  if (!slot_live(si)) return;
  /* When the closing event cannot be recorded (injected event faults), the
   * retire waits for the stream on the host instead (streams.c). */
  if (F.faults) gates_open_all();
  gma_status_t st = gma_stream_retire(F.g, handle_of(si));
  vlog("slot %d -> %s", si, gma_status_name(st));
  EXPECT(st == GMA_OK || (st == GMA_ERR_DEVICE && F.faults), "gma_stream_retire returned %s",
         gma_status_name(st));
  if (st != GMA_OK) F.orphaned = true;
  stream_new_gen(si);
  if (slot_in_flight(si)) { /* the worker may make the new record */
    F.st[si].has_record = -1;
    F.st[si].counts_exact = false;
  }
}

static void stream_create_slot(int si) {
  gma_stream_t h = NULL;
  gma_status_t st = gma_stream_create(F.g, &h);
  EXPECT_ST(st, GMA_OK, "gma_stream_create");
  EXPECT(h != NULL && h != GMA_STREAM_LEGACY && h != GMA_STREAM_PER_THREAD, "stream handle %p", h);
  for (int i = 0; i < 3; i++)
    EXPECT(i == si || !F.st[i].live || F.st[i].h != h, "a new stream got a live stream's handle %p", h);
  F.st[si].h = h;
  F.st[si].live = true;
  F.st[si].incarnation++;
  stream_new_gen(si);
}

/* Before user stream si (handle old) is destroyed: without host_outlives its
 * pinned host and CPU-fallback blocks are freed first (see configure). */
static void destroy_prepare(int si, gma_stream_t old) {
  if (F.faults) gates_open_all(); /* see op_retire */
  if (!F.host_outlives) /* free the stream's pinned host blocks first (see configure) */
    for (int i = F.nhost; i-- > 0;)
      if (F.host[i].si == si && F.host[i].h == old) {
        rd_t pick = {&(uint8_t){(uint8_t)i}, 1, 0};
        op_host_free(&pick);
      }
  if (!F.host_outlives) /* and its CPU-fallback blocks (host memory too) */
    for (int i = F.nlive; i-- > 0;)
      if (F.live[i].kind == GMA_MEMORY_FALLBACK && F.live[i].si == si && F.live[i].h == old)
        free_block(i, "gma_free of a fallback block before its stream is destroyed");
}

/* gma_stream_destroy(old) of user slot si returned st: the model follows. */
static void destroy_done(int si, gma_stream_t old, gma_status_t st) {
  EXPECT(st == GMA_OK || (st == GMA_ERR_DEVICE && F.faults), "gma_stream_destroy returned %s",
         gma_status_name(st));
  if (st != GMA_OK) F.orphaned = true;
  F.st[si].live = false;
  stream_new_gen(si);
  if (F.ndead < NDEAD) F.dead[F.ndead++] = old;
  else F.dead[F.opno % NDEAD] = old;
}

static void op_destroy(int t) {
  int si = t < 3 ? t : stream_of_thread(t); /* a dead user slot is re-created */
  if (si >= 3) { /* the default streams: refused, nothing changes */
    gma_status_t st = gma_stream_destroy(F.g, handle_of(si));
    EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_stream_destroy of a default stream");
    return;
  }
  observe_futures();
  if (slot_in_flight(si)) return; /* a request on it is pending: destroying is the caller's bug */
  if (!F.st[si].live) {
    stream_create_slot(si);
    vlog("slot %d created %p", si, F.st[si].h);
    return;
  }
  gma_stream_t old = F.st[si].h;
  destroy_prepare(si, old);
  gma_status_t st = gma_stream_destroy(F.g, old);
  destroy_done(si, old, st);
  /* Every other time a new stream takes the slot at once (and likely the
   * destroyed stream's handle value). */
  if (F.opno & 1) stream_create_slot(si);
  if (F.st[si].live) vlog("slot %d destroyed %p, new stream %p", si, old, F.st[si].h);
  else vlog("slot %d destroyed %p", si, old);
}

/* ---- pinned host memory ----------------------------------------------------------- */

static void op_host_alloc(rd_t *r, int t) {
  int si = stream_of_thread(t);
  gma_stream_t h = handle_of(si);
  size_t size = pick_size(r);
  if (size > 4 * MiB && size < F.limit) size %= 4 * MiB; /* host memory is real memory */
  if (F.nhost >= MAX_HOST) return;
  void *p = (void *)1;
  gma_status_t st = gma_host_alloc(F.g, size, h, &p);
  vlog("T%d slot %d size %zu -> %s %p", t, si, size, gma_status_name(st), p);
  if (size == 0) {
    EXPECT_ST(st, GMA_ERR_INVALID_SIZE, "gma_host_alloc(0)");
    return;
  }
  if (size > 64 * MiB) { /* SIZE_MAX and friends: no host memory for them */
    EXPECT(st == GMA_OK || st == GMA_ERR_OOM || st == GMA_ERR_INVALID_SIZE,
           "gma_host_alloc(%zu) returned %s", size, gma_status_name(st));
    if (st != GMA_OK) return;
  }
  EXPECT(st == GMA_OK || (st == GMA_ERR_DEVICE && F.faults), "gma_host_alloc returned %s",
         gma_status_name(st));
  if (st != GMA_OK) return;
  uintptr_t a = (uintptr_t)p;
  EXPECT(a && a % 256 == 0, "host pointer %p", p);
  check_no_overlap(a, size, "new host allocation");
  gma_pointer_info_t info = GMA_POINTER_INFO_INIT;
  EXPECT_ST(gma_pointer_info(F.g, p, &info), GMA_OK, "gma_pointer_info of a host block");
  EXPECT(info.kind == GMA_MEMORY_HOST_PINNED && info.base == p && info.requested == size &&
             info.block_size == class_round(size),
         "host pointer_info: kind %d base %p requested %zu block %zu for %zu", (int)info.kind,
         info.base, info.requested, info.block_size, size);
  if (!default_handle(h)) EXPECT(info.stream == h, "host pointer_info stream %p, not %p", info.stream, h);
  mhost_t *m = &F.host[F.nhost++];
  *m = (mhost_t){.p = a, .size = size, .bsize = info.block_size, .si = si, .gen = F.st[si].gen,
                 .h = h, .id = ++F.next_id, .incarnation = F.st[si].incarnation};
  /* The host fills it at once, as a program filling a staging buffer does:
   * a copy still reading the block's previous life would see it change. */
  m->pat = mix64(++F.next_pattern ^ 0x4057);
  pattern_write(a, size, m->pat);
  grave_remove(F.host_grave, &F.nhost_grave, a);
  F.n_host_allocs++;
}

static void op_host_free(rd_t *r) {
  if (!F.nhost) return;
  int i = (int)(rd8(r) % (unsigned)F.nhost);
  mhost_t *m = &F.host[i];
  if (!m->dev_used) { /* nothing but the host touched it: its pattern is intact */
    uintptr_t first = 0;
    size_t bad = pattern_verify(m->p, m->size, m->pat, &first);
    EXPECT(bad == 0, "host block #%" PRIu64 " changed under the host (%zu words, first %#" PRIxPTR ")",
           m->id, bad, first);
  }
  /* With event faults the free may synchronize the stream instead. */
  if (F.faults) gates_open_all();
  gma_status_t st = gma_host_free(F.g, (void *)m->p);
  vlog("host block #%" PRIu64 " -> %s", m->id, gma_status_name(st));
  EXPECT_ST(st, GMA_OK, "gma_host_free");
  grave_add(F.host_grave, &F.nhost_grave, m->p);
  F.host[i] = F.host[--F.nhost];
  F.n_host_frees++;
}

/* A copy on the host block's own stream (a pattern kernel). */
static void op_host_kernel(rd_t *r) {
  unsigned b = rd8(r), arg = rd8(r);
  if (!F.nhost) return;
  mhost_t *m = &F.host[b % (unsigned)F.nhost];
  /* Only on the stream it was allocated on: a re-created slot may have the
   * same handle value but is another stream, not ordered after the old one.
   * And not after a retire: retiring orders the block's free after the work
   * queued so far (its event is recorded then, so that a free after the
   * stream's destroy names no dead handle), as for device blocks. */
  if (!slot_live(m->si) || F.st[m->si].incarnation != m->incarnation ||
      F.st[m->si].gen != m->gen)
    return;
  int mode = (arg & 0x40) ? K_CHECK_ONLY : K_HOLD_ONE;
  m->pat = launch_pattern(m->si, m->h, m->p, m->size, mode, mode == K_CHECK_ONLY ? m->pat : 0, arg,
                          m->id);
  m->dev_used = true;
  vlog("host block #%" PRIu64 " on slot %d", m->id, m->si);
}

/* ---- introspection ------------------------------------------------------------- */

static void op_pinfo(rd_t *r) {
  unsigned a = rd8(r), off = rd8(r);
  int i = pick_block(-1, a);
  if (i < 0) return;
  mblock_t *b = &F.live[i];
  uintptr_t p = b->p + (b->size > 1 ? (off * 977u) % b->size : 0);
  gma_pointer_info_t info = GMA_POINTER_INFO_INIT;
  gma_status_t st = gma_pointer_info(F.g, (void *)p, &info);
  vlog("block #%" PRIu64 " + %" PRIuPTR " -> %s", b->id, p - b->p, gma_status_name(st));
  EXPECT_ST(st, GMA_OK, "gma_pointer_info inside a live block");
  EXPECT((uintptr_t)info.base == b->p && info.requested == b->size && info.block_size == b->bsize &&
             info.kind == b->kind,
         "pointer_info inside block #%" PRIu64 ": base %p requested %zu block %zu kind %d", b->id,
         info.base, info.requested, info.block_size, (int)info.kind);
  const char *want_tag = b->tag >= 0 ? tag_names[b->tag] : "untagged";
  EXPECT(info.tag && strcmp(info.tag, want_tag) == 0, "pointer_info tag '%s', expected '%s'",
         info.tag ? info.tag : "(null)", want_tag);
}

/* Live device allocations as gma's reports count them (cap 0: count only). */
static size_t live_count_reported(void) {
  size_t count = SIZE_MAX;
  gma_status_t st = gma_find_old_allocations(F.g, 0, NULL, 0, &count);
  EXPECT_ST(st, GMA_OK, "gma_find_old_allocations(cap 0)");
  return count;
}

/* gma_reserve with arguments no caller should get past the checks (issue 13):
 * counts whose sum wraps past SIZE_MAX, a count of SIZE_MAX or one whose
 * pointer array cannot be allocated, NULL arrays with n > 0, sizes never
 * possible (0, SIZE_MAX, above memory_limit) after a valid entry. Each must
 * fail with INVALID_SIZE, INVALID_ARGUMENT or OOM (DEVICE with injected
 * faults) and leave nothing behind: allocated, requested and host memory as
 * they were, as many frees as allocations, no new live block in gma's report. */
static void op_reserve_bad(rd_t *r, int t, unsigned variant) {
  int si = stream_of_thread(t);
  unsigned x = rd8(r);
  size_t sizes[3] = {4096, 4096, 512}, counts[3] = {1, 1, 1}, n = 2;
  const size_t *sp = sizes, *cp = counts;
  const char *what;
  bool may_alloc = false; /* a valid entry comes first: blocks are made and given back */
  variant %= 10;
  switch (variant) {
    case 0: /* the probe's call: the sum wraps to 1 */
      counts[0] = SIZE_MAX, counts[1] = 2;
      what = "counts {SIZE_MAX, 2}";
      break;
    case 1:
      n = 1, counts[0] = SIZE_MAX;
      what = "a count of SIZE_MAX";
      break;
    case 2: /* the sum wraps to 0 */
      sizes[0] = sizes[1] = 512, counts[0] = counts[1] = SIZE_MAX / 2 + 1;
      what = "counts {2^63, 2^63}";
      break;
    case 3: /* wraps to 0 and then to 1 */
      n = 3, counts[0] = 2, counts[1] = SIZE_MAX - 1, counts[2] = 1;
      what = "counts {2, SIZE_MAX - 1, 1}";
      break;
    case 4: /* no wrap, but count * sizeof(void *) overflows */
      n = 1, counts[0] = SIZE_MAX / sizeof(void *) + 1 + x;
      what = "a count whose pointer array overflows";
      break;
    case 5: /* far more blocks than memory_limit holds */
      n = 1, counts[0] = (size_t)1 << (32 + x % 16);
      what = "a count of 2^32 or more";
      break;
    case 6:
      n = 1 + x % 3, sp = NULL;
      what = "sizes NULL with n > 0";
      break;
    case 7:
      n = 1 + x % 3, cp = NULL;
      what = "counts NULL with n > 0";
      break;
    case 8:
      n = 1 + x % 3, sp = NULL, cp = NULL;
      what = "both arrays NULL with n > 0";
      break;
    default: { /* a valid entry, then a size never possible */
      size_t bad[4] = {0, SIZE_MAX, (size_t)F.limit + 1, SIZE_MAX - 511};
      counts[0] = x % 3;
      sizes[1] = bad[(x >> 2) & 3];
      counts[1] = 1 + (x >> 4) % 3;
      may_alloc = counts[0] > 0;
      what = "a size never possible";
      break;
    }
  }
  observe_futures();
  snap_t before = snap_take();
  size_t live_before = before.valid ? live_count_reported() : 0;
  gma_status_t st = gma_reserve(F.g, handle_of(si), n, sp, cp);
  vlog("bad reserve slot %d: %s (n %zu) -> %s", si, what, n, gma_status_name(st));
  EXPECT(st == GMA_ERR_INVALID_SIZE || st == GMA_ERR_INVALID_ARGUMENT || st == GMA_ERR_OOM ||
             (st == GMA_ERR_DEVICE && F.faults),
         "gma_reserve with %s returned %s", what, gma_status_name(st));
  if (sp == NULL || cp == NULL)
    EXPECT_ST(st, GMA_ERR_INVALID_ARGUMENT, "gma_reserve with a NULL array");
  if (may_alloc) F.st[si].has_record = F.st[si].has_record == 1 ? 1 : -1;
  if (may_alloc) F.trace_unknown += counts[0];
  /* How many blocks it made and gave back (and from where) is gma's
   * business: re-learn the counters (check_stats requires allocs == frees). */
  F.reserve_unknown = true;
  F.st[si].counts_exact = false;
  if (F.fallback) {
    gma_stats_t s = stats_now();
    EXPECT(s.fallback_bytes == model_sums().fb_bytes, "a failed gma_reserve left fallback memory");
    F.n_fallbacks = s.num_fallbacks;
  }
  if (!before.valid) return;
  gma_stats_t s = stats_now();
  EXPECT(s.allocated.current == before.s.allocated.current &&
             s.requested.current == before.s.requested.current &&
             s.host_allocated.current == before.s.host_allocated.current,
         "a failed gma_reserve (%s) changed memory: allocated %" PRIu64 " -> %" PRIu64
         ", requested %" PRIu64 " -> %" PRIu64 ", host %" PRIu64 " -> %" PRIu64,
         what, before.s.allocated.current, s.allocated.current, before.s.requested.current,
         s.requested.current, before.s.host_allocated.current, s.host_allocated.current);
  size_t live_after = live_count_reported();
  EXPECT(live_after == live_before, "a failed gma_reserve (%s): %zu live allocations before, %zu after",
         what, live_before, live_after);
}

static void op_reserve(rd_t *r, int t) {
  unsigned nb = rd8(r);
  /* First byte 0xE0-0xEF: adversarial arguments. (A range the merged
   * campaign corpus hardly uses, so its inputs keep their meaning.) */
  if ((nb & 0xF0) == 0xE0) {
    op_reserve_bad(r, t, nb & 15);
    return;
  }
  int si = stream_of_thread(t);
  size_t n = 1 + nb % 3, sizes[3], counts[3], total = 0;
  bool bad = false;
  uint64_t bytes = 0; /* at least what the blocks take: more than the limit is refused up front */
  for (size_t k = 0; k < n; k++) {
    sizes[k] = pick_size(r);
    if (sizes[k] > 4 * MiB && sizes[k] <= F.limit) sizes[k] %= 4 * MiB;
    counts[k] = rd8(r) % 5;
    total += counts[k];
    if (counts[k] && (sizes[k] == 0 || sizes[k] > F.limit)) bad = true;
    else bytes += counts[k] * (((uint64_t)sizes[k] + 511) / 512 * 512);
  }
  if (bytes > F.limit) bad = true;
  F.trace_unknown += total; /* its allocate and free rows name pointers the model never sees */
  snap_t before = snap_take();
  gma_status_t st = gma_reserve(F.g, handle_of(si), n, sizes, counts);
  vlog("slot %d n %zu blocks %zu -> %s", si, n, total, gma_status_name(st));
  if (bad) {
    EXPECT(st == GMA_ERR_INVALID_SIZE || st == GMA_ERR_OOM || (st == GMA_ERR_DEVICE && F.faults),
           "gma_reserve with an impossible size returned %s", gma_status_name(st));
  } else {
    EXPECT(st == GMA_OK || st == GMA_ERR_OOM || (st == GMA_ERR_DEVICE && F.faults),
           "gma_reserve returned %s", gma_status_name(st));
  }
  if (total) F.st[si].has_record = st == GMA_OK ? 1 : F.st[si].has_record == 1 ? 1 : -1;
  if (F.fallback && total) {
    /* Blocks the device could not hold came from the CPU fallback (and went
     * back): how many of each is unknown, but none may stay. */
    gma_stats_t s = stats_now();
    EXPECT(s.fallback_bytes == model_sums().fb_bytes, "gma_reserve left fallback memory allocated");
    F.n_fallbacks = s.num_fallbacks;
    F.reserve_unknown = true;
    F.st[si].counts_exact = false;
    return;
  }
  if (st == GMA_OK) {
    F.n_allocs += total;
    F.n_frees += total;
    F.st[si].allocs += total;
    F.st[si].frees += total;
  } else {
    /* It allocated some before failing and freed them: how many is unknown. */
    F.reserve_unknown = true;
    F.st[si].counts_exact = false;
    if (before.valid) {
      gma_stats_t s = stats_now();
      EXPECT(s.allocated.current == before.s.allocated.current, "a failed gma_reserve kept memory");
    }
  }
}

/* GMA_CONF-style text built from the input: real keys and values, bogus
 * ones, missing separators. gma_config_parse must accept it or say
 * GMA_ERR_CONFIG and leave the config as it was; an accepted config (made
 * safe to run: simulated device, short latencies, no trace file but
 * /dev/null) must make gma_create succeed or fail cleanly, and an allocator
 * it makes must allocate, free and go away without a leak. */
static void op_config(rd_t *r) {
  static const char *const keys[] = {
      "device", "device_id", "memory_limit", "small_size", "small_segment", "large_segment",
      "reuse", "bin_max", "bin_depth", "bins", "sim_capacity", "trim_interval_ms",
      "release_threshold", "idle_ms", "grow_ahead", "worker", "ring_size", "future_timeout_ms",
      "expandable_segments", "trace", "fallback", "host_release_threshold", "sim_alloc_ns",
      "sim_free_ns", "sim_event_ns", "sim_fail_alloc", "sim_fail_event", "no_such_key", "", "DEVICE"};
  static const char *const values[] = {
      "0", "1", "2", "on", "off", "true", "false", "sim", "cuda", "auto", "query", "wait", "none",
      "host", "512", "1K", "2M", "64M", "1G", "3T", "2048T", "7", "65536", "1048577", "-1", "",
      "18446744073709551615", "18446744073709551616", "1.5", "0x10", "/dev/null", "12abc"};
  char text[512] = "";
  size_t at = 0, n = rd8(r) % 6;
  for (size_t i = 0; i < n && at < sizeof text - 64; i++) {
    unsigned k = rd8(r), v = rd8(r);
    const char *sep = (k & 0x80) ? "" : (v & 0x80) ? ";" : ",";
    at += (size_t)snprintf(text + at, sizeof text - at, "%s%s%s%s", i ? sep : "",
                           keys[k % (sizeof keys / sizeof *keys)], (k & 0x40) ? "=" : ":",
                           values[v % (sizeof values / sizeof *values)]);
  }
  gma_config_t c = GMA_CONFIG_INIT, before;
  c.device = GMA_DEVICE_SIM;
  c.sim_capacity = 64 * MiB;
  before = c;
  gma_status_t st = gma_config_parse(&c, text);
  vlog("gma_config_parse(\"%s\") -> %s", text, gma_status_name(st));
  EXPECT(st == GMA_OK || st == GMA_ERR_CONFIG, "gma_config_parse(\"%s\") returned %s", text,
         gma_status_name(st));
  if (st != GMA_OK) {
    EXPECT(memcmp(&c, &before, sizeof c) == 0, "a refused gma_config_parse(\"%s\") changed the config",
           text);
    return;
  }
  if (!F.worker) return; /* the allocator below only in some inputs: it costs threads */
  c.ignore_env = 1;
  c.device = GMA_DEVICE_SIM;
  if (c.sim_capacity > 256 * MiB || !c.sim_capacity) c.sim_capacity = 256 * MiB;
  c.sim_alloc_latency_ns = c.sim_alloc_latency_ns % 10000;
  c.sim_free_latency_ns = c.sim_free_latency_ns % 10000;
  c.sim_event_latency_ns = c.sim_event_latency_ns % 10000;
  if (c.trace_path[0] && strcmp(c.trace_path, "/dev/null") != 0) c.trace_path[0] = '\0';
  if (c.future_timeout_ms > 100) c.future_timeout_ms = 100;
  gma_t *g2 = NULL;
  st = gma_create(&c, &g2);
  vlog("gma_create of it -> %s", gma_status_name(st));
  /* gma_config_parse checks everything that does not depend on the device
   * (issue 17), so gma_create refuses a config it accepted only for the
   * device's reasons: growable segments map the simulated device's 2 MiB
   * chunks, more than a smaller limit. */
  uint64_t lim = c.memory_limit && c.memory_limit < c.sim_capacity ? c.memory_limit : c.sim_capacity;
  bool device_refuses = c.expandable_segments == GMA_SEGMENTS_GROWABLE && lim < 2 * MiB;
  EXPECT(st == GMA_OK || (st == GMA_ERR_CONFIG && device_refuses) ||
             (st == GMA_ERR_DEVICE && c.sim_fail_alloc),
         "gma_create of a parsed config (\"%s\") returned %s: %s", text, gma_status_name(st),
         gma_last_error());
  if (st != GMA_OK) {
    EXPECT(g2 == NULL, "a failed gma_create left *out set");
    return;
  }
  void *p = NULL;
  st = gma_alloc(g2, 4096, NULL, &p);
  EXPECT(st == GMA_OK || st == GMA_ERR_OOM || (st == GMA_ERR_DEVICE && c.sim_fail_alloc),
         "gma_alloc on a config from \"%s\" returned %s", text, gma_status_name(st));
  if (st == GMA_OK) EXPECT_ST(gma_free(g2, p), GMA_OK, "gma_free on the parsed config's allocator");
  st = gma_destroy(g2);
  EXPECT_ST(st, GMA_OK, "gma_destroy of the parsed config's allocator");
}

static void op_threaded(rd_t *r, int t, unsigned e);

static void op_introspect(rd_t *r, int t) {
  unsigned v = rd8(r);
  switch (v % 4) {
    case 0: {
      static const size_t lens[4] = {1, 100, 1024, 1 << 16};
      size_t len = lens[(v >> 2) & 3];
      char *buf = malloc(len);
      EXPECT(buf != NULL, "host memory");
      memset(buf, 'x', len);
      gma_status_t st = gma_memory_summary(F.g, buf, len);
      vlog("summary len %zu -> %s", len, gma_status_name(st));
      EXPECT(st == GMA_OK || (st == GMA_ERR_INVALID_SIZE && len < (1 << 16)),
             "gma_memory_summary(%zu) returned %s", len, gma_status_name(st));
      EXPECT(memchr(buf, '\0', len) != NULL, "gma_memory_summary left no NUL in %zu bytes", len);
      free(buf);
      break;
    }
    case 1: {
      gma_status_t st = gma_snapshot_json(F.g, "/dev/null");
      vlog("snapshot -> %s", gma_status_name(st));
      EXPECT_ST(st, GMA_OK, "gma_snapshot_json");
      break;
    }
    case 2: {
      gma_status_t st = (v >> 2) & 1 ? gma_trace_start(F.g, "/dev/null") : gma_trace_stop(F.g);
      vlog("trace %s -> %s", (v >> 2) & 1 ? "start" : "stop", gma_status_name(st));
      EXPECT_ST(st, GMA_OK, "gma_trace_start/stop");
      F.trace_closed = true; /* either closes the trace of byte 0 bit 6 */
      break;
    }
    default:
      if ((v >> 2) & 1) {
        op_config(r);
        break;
      }
      if (v >> 3) { /* v = 8e + 3 with e = 1..31: an operation with a helper thread */
        op_threaded(r, t, v >> 3);
        break;
      }
      EXPECT(strcmp(gma_device_name(F.g), "sim") == 0, "device name %s", gma_device_name(F.g));
      for (int s = -15; s <= 1; s++) {
        EXPECT(gma_status_name((gma_status_t)s) && gma_strerror((gma_status_t)s),
               "no name or text for status %d", s);
      }
      break;
  }
}

/* ---- planned memory (plan:on, issue 18) -------------------------------------------
 * With byte 3 bit 6 (plan:on) SLEEP's argument byte a names, by its top two
 * bits: 0 the sleep (a % 64 units of 8 us, as without a plan), 1 PLAN_MARK
 * (gma_iteration_mark; 0x7C-0x7E name three more operations, see
 * op_plan_race_free), 2 PLAN_LOOP (a synthetic training loop repeated
 * with marks), 3 PLAN_REPEAT (the last operations repeated with marks).
 * Inputs without the bit decode as before. What the model checks of
 * planned blocks is what it checks of any block (no overlap, patterns,
 * counts, the accounting equation with plan_arena_bytes, the hit levels
 * with plan_hits, pointer info, tags and the live reports); only the
 * default stream's gma_stream_stats, which count the arena, are not checked
 * exactly under plan:on (see the README). */

static void run_op(rd_t *r);

static void plan_mark(void) {
  gma_stats_t a = stats_now();
  /* The mark that activates a plan waits for the device's queued work (as
   * gma.h says): a kernel held behind a gate only the fuzzer opens would
   * wait for the fuzzer itself. */
  if (a.plan_state == 3) gates_open_all();
  gma_status_t st = gma_iteration_mark(F.g);
  EXPECT_ST(st, GMA_OK, "gma_iteration_mark");
  F.marks++;
  gma_stats_t b = stats_now();
  /* A plan takes its arena on the legacy stream: gma may have a record of
   * the default stream from an activating mark on (even a failed one). */
  if ((a.plan_state == 3 || b.plan_arena_bytes) && F.st[3].has_record == 0)
    F.st[3].has_record = -1;
  vlog("mark %" PRIu64 ": plan state %d -> %d, hits %" PRIu64 ", misses %" PRIu64 ", re-plans %"
       PRIu64 ", arena %" PRIu64, F.marks, a.plan_state, b.plan_state, b.plan_hits, b.plan_misses,
       b.plan_replans, b.plan_arena_bytes);
  EXPECT(b.plan_state >= 0 && b.plan_state <= 4, "plan_state %d", b.plan_state);
  EXPECT(b.plan_hits >= a.plan_hits && b.plan_misses >= a.plan_misses &&
             b.plan_replans >= a.plan_replans,
         "a plan counter went back at a mark");
  EXPECT(b.plan_state != 4 || (b.plan_arena_bytes >= b.plan_lower_bound && b.plan_slots > 0),
         "active plan: arena %" PRIu64 ", lower bound %" PRIu64 ", slots %" PRIu64,
         b.plan_arena_bytes, b.plan_lower_bound, b.plan_slots);
  if (getenv("FUZZ_GMA_PLAN_STATS") && b.plan_hits)
    fprintf(stderr, "fuzz_gma: plan hits %" PRIu64 " (+%" PRIu64 "), misses %" PRIu64 "\n",
            b.plan_hits, b.plan_hits - a.plan_hits, b.plan_misses);
}

/* gma_alloc of size on stream slot si for logical thread t (plan:on): the
 * model's index of the new block, or -1 (OOM, or a device error with
 * faults). An OOM's message and what it did to an idle plan are checked. */
static int plan_alloc_on(int si, int t, size_t size, const char *what) {
  gma_stream_t h = handle_of(si);
  if (F.nlive >= MAX_LIVE) return -1;
  gma_stats_t pre = stats_now();
  bool idle = planned_live() == 0;
  void *p = (void *)1;
  gma_status_t st = gma_alloc(F.g, size, h, &p);
  F.st[si].has_record = 1;
  EXPECT(st == GMA_OK || st == GMA_ERR_OOM || (st == GMA_ERR_DEVICE && F.faults),
         "gma_alloc(%zu) %s returned %s", size, what, gma_status_name(st));
  if (st != GMA_OK) {
    vlog("  %s: T%d slot %d size %zu -> %s", what, t, si, size, gma_status_name(st));
    EXPECT(p == NULL, "a failed gma_alloc left *out = %p", p);
    if (st == GMA_ERR_OOM) {
      check_oom_cause(size, pre.plan_arena_bytes);
      check_arena_went(&pre, idle, what);
    }
    return -1;
  }
  F.next_planned = stats_now().plan_hits > pre.plan_hits;
  vlog("  %s: T%d slot %d size %zu -> %p%s", what, t, si, size, p,
       F.next_planned ? " (planned)" : "");
  mblock_t *b = add_block(p, size, si, F.st[si].gen, h, t, -1, 0);
  if (b->kind == GMA_MEMORY_DEVICE) F.n_allocs++;
  else check_arena_went(&pre, idle, what);
  return F.nlive - 1;
}

/* One allocation of a plan loop on logical thread t, with a short pattern
 * kernel on it: the model's index of the new block, or -1. */
static int plan_loop_alloc(int t, size_t size, unsigned hold_us) {
  int si = stream_of_thread(t);
  int i = plan_alloc_on(si, t, size, "in a plan loop");
  if (i < 0) return -1;
  mblock_t *b = &F.live[i];
  if (block_usable(b) && size >= 8)
    b->pat = launch_pattern(si, b->h, b->p, b->size, K_HOLD_ONE, 0, hold_us & 63, b->id);
  return i;
}

static void plan_loop_free(uintptr_t p) {
  for (int i = 0; i < F.nlive; i++)
    if (F.live[i].p == p) {
      free_block(i, "gma_free (plan loop)");
      return;
    }
}

/* PLAN_LOOP: n = 2 + (a & 15) allocations (sizes and logical threads from
 * args b and c), some freed at once and the rest at the iteration's end in
 * reverse order (nested lifetimes), each with a short pattern kernel; then a
 * mark; the whole repeated 4 + 2 * ((a >> 4) & 3) times: a plan is learned,
 * made and used. Args: b (threads: 2 bits per allocation, cycled; logical
 * thread 3 only when its stream is a user stream's or the default), c
 * (sizes and which allocations are temporaries). */
static void op_plan_loop(rd_t *r, unsigned a) {
  unsigned b = rd8(r), c = rd8(r);
  int n = 2 + (int)(a & 15), reps = 4 + 2 * (int)((a >> 4) & 3);
  size_t size[17];
  int thr[17];
  bool temp[17];
  uint64_t x = mix64(((uint64_t)b << 8 | c) ^ 0x9e37);
  for (int i = 0; i < n; i++) {
    x = mix64(x + (uint64_t)i);
    /* 512 B .. 2 MiB, log-uniform, and a few odd sizes. */
    unsigned bits = 9 + (unsigned)(x % 12);
    size[i] = ((size_t)1 << bits) + (size_t)((x >> 8) % ((uint64_t)1 << bits)) * ((x >> 40) & 1);
    thr[i] = (int)((b >> (2 * (i % 4))) & 3);
    temp[i] = (x >> 50) & 1;
    F.loop_size[i] = size[i];
    F.loop_si[i] = stream_of_thread(thr[i]);
  }
  F.loop_n = n;
  vlog("plan loop: %d allocations x %d iterations", n, reps);
  for (int rep = 0; rep < reps; rep++) {
    uintptr_t kept[17];
    int nk = 0;
    for (int i = 0; i < n; i++) {
      int k = plan_loop_alloc(thr[i], size[i], (unsigned)(x >> (i % 32)) & 31);
      if (k < 0) continue;
      if (temp[i]) free_block(k, "gma_free (plan loop temporary)");
      else kept[nk++] = F.live[k].p;
    }
    while (nk > 0) plan_loop_free(kept[--nk]);
    plan_mark();
    check_stats();
  }
}

/* PLAN_REPEAT: the last k = 1 + (a & 15) operations (at most 15, only
 * those already run), replayed reps = 3 + 2 * ((a >> 4) & 3) times from
 * their bytes, a mark after each round and the checks after each
 * operation. Inside a replay, PLAN_REPEAT is a mark; an input replays at
 * most 1,200 operations in all. */
static void op_plan_repeat(unsigned a) {
  int k = 1 + (int)(a & 15), reps = 3 + 2 * (int)((a >> 4) & 3);
  if (F.replaying) {
    plan_mark();
    return;
  }
  if (k > 15) k = 15;
  if (k > F.opno - 1) k = F.opno - 1;
  vlog("repeat the last %d operations %d times", k, reps);
  int opno = F.opno;
  const char *name = F.opname;
  F.replaying = true;
  for (int rep = 0; rep < reps && F.replayed + k <= 1200; rep++) {
    for (int j = opno - k; j < opno; j++) {
      size_t start = F.hist[j % 16], end = F.hist[(j + 1) % 16];
      rd_t sub = {F.in, end, start};
      run_op(&sub);
      F.replayed++;
      check_stats();
      check_stream_stats();
    }
    F.opname = name;
    plan_mark();
    check_stats();
  }
  F.replaying = false;
  F.opname = name;
}

static void spin_for(unsigned n);
static void meet(_Atomic int *arrived);
static void start_thread(pthread_t *th, void *(*fn)(void *), void *arg);
static void join_thread(pthread_t th);

/* ---- planned memory under pressure, racing frees ----------------------------------
 * PLAN_MARK's argument 0x7C-0x7E (a mark is any of 0x40-0x7F; the
 * campaign's inputs never used these three) names three more operations
 * of the plan, each with two argument bytes b, c:
 *   0x7C PLAN_RACE_FREE  a live planned block used on 1-4 more streams
 *                        (gma_record_stream), then freed by the fuzzer's
 *                        thread and a helper thread at once, 1-4 rounds;
 *   0x7D PLAN_IDLE       nothing planned live, optionally a block of the
 *                        legacy stream cached beside the arena, then the
 *                        idle plan's arena is needed: by a request that
 *                        fits only without it (synchronous or async),
 *                        gma_trim(g, 0) or gma_empty_cache;
 *   0x7E PLAN_OOM_BUSY   a planned block live, memory freed behind a kernel
 *                        on another stream, then a request that fits once
 *                        that kernel completes.
 * A planned block comes from the model when one is live, else from
 * plan_take. */

static int thread_of_slot(int si) { return si < 3 ? si : 3; }

/* The model's index of the live planned block k picks, or -1. */
static int pick_planned(unsigned k) {
  int idx[MAX_LIVE], n = 0;
  for (int i = 0; i < F.nlive; i++)
    if (F.live[i].planned) idx[n++] = i;
  return n ? idx[k % (unsigned)n] : -1;
}

/* A planned block now: a mark starts an iteration (twice when the plan is
 * being placed, so that it becomes active), then the last PLAN_LOOP's
 * first request on one of its streams (k picks which) is served at its
 * planned address while the plan that loop made is active. The model's
 * index of the new block when it was planned; else -1 (an ordinary block
 * it got stays live in the model). */
static int plan_take(unsigned k) {
  if (!F.loop_n || F.nlive >= MAX_LIVE) return -1;
  plan_mark();
  if (stats_now().plan_state == 3) {
    sleep_us(200); /* the worker places it */
    plan_mark();
  }
  if (stats_now().plan_state != 4) return -1;
  int si = F.loop_si[k % (unsigned)F.loop_n], i = 0;
  if (!slot_live(si)) return -1;
  while (F.loop_si[i] != si) i++;
  int b = plan_alloc_on(si, thread_of_slot(si), F.loop_size[i], "the first request after a mark");
  return b >= 0 && F.live[b].planned ? b : -1;
}

typedef struct free_racer {
  _Atomic int bar;
  gma_t *g;
  void *p;
  unsigned spin;
  gma_status_t st;
} free_racer_t;

static void *race_planned_main(void *arg) {
  free_racer_t *a = arg;
  meet(&a->bar);
  spin_for(a->spin);
  a->st = gma_free(a->g, a->p);
  return NULL;
}

/* PLAN_RACE_FREE: a live planned block (the model's, or plan_take's) is
 * used on more streams (gma_record_stream, no kernel there), then the
 * fuzzer's thread and a helper free it at once (one spinning barrier):
 * exactly one free returns GMA_OK, the other GMA_ERR_DOUBLE_FREE
 * (GMA_ERR_INVALID_POINTER only if the plan was dropped in between, its
 * arena no longer planned memory); the model frees it once. Each round
 * after the first takes a new planned block (often the same slot) and
 * names one more stream, so the slot's record of its users grows.
 *   arg b: bits0-1 rounds - 1, bits2-3 streams named in the first round
 *          (1 + value % 3), bit4 the helper spins before it frees (else the
 *          fuzzer's thread), bit5 a pattern kernel on the block on its own
 *          stream first, bits6-7 which live planned block the first round
 *          takes
 *   arg c: the spin (c * 8 iterations), the first stream named, the
 *          kernel's hold (c & 63 us), which stream plan_take uses */
static void op_plan_race_free(rd_t *r) {
  unsigned b = rd8(r), c = rd8(r);
  int rounds = 1 + (int)(b & 3), n0 = 1 + (int)((b >> 2) & 3) % 3;
  for (int round = 0; round < rounds; round++) {
    int i = round == 0 ? pick_planned(b >> 6) : -1;
    if (i < 0) i = plan_take(c + (unsigned)round);
    if (i < 0) return;
    mblock_t *blk = &F.live[i];
    if ((b & 0x20) && block_usable(blk) && blk->size >= 8)
      blk->pat = launch_pattern(blk->si, blk->h, blk->p, blk->size, K_HOLD_ONE, 0, c & 63, blk->id);
    int want = n0 + round < 4 ? n0 + round : 4, named = 0;
    for (int k = 0; k < NSLOTS && named < want; k++) {
      int ui = (int)((c + (unsigned)k) % NSLOTS);
      if (ui == blk->si || !slot_live(ui)) continue;
      gma_status_t st = gma_record_stream(F.g, (void *)blk->p, handle_of(ui));
      EXPECT_ST(st, GMA_OK, "gma_record_stream of a planned block");
      F.st[ui].has_record = 1;
      named++;
    }
    gma_stats_t pre = stats_now();
    uintptr_t p = blk->p;
    vlog("round %d: planned block #%" PRIu64 " %#" PRIxPTR " (%zu, slot %d) used on %d more "
         "streams, freed by two threads", round, blk->id, p, blk->size, blk->si, named);
    forget_freed(i); /* the model frees it once */
    free_racer_t fr = {.g = F.g, .p = (void *)p, .spin = (b & 0x10) ? c * 8 : 0};
    atomic_init(&fr.bar, 0);
    pthread_t th;
    start_thread(&th, race_planned_main, &fr);
    meet(&fr.bar);
    if (!(b & 0x10)) spin_for(c * 8);
    gma_status_t st = gma_free(F.g, (void *)p);
    join_thread(th);
    vlog("  the fuzzer's free -> %s, the helper's -> %s", gma_status_name(st), gma_status_name(fr.st));
    EXPECT((st == GMA_OK) + (fr.st == GMA_OK) == 1,
           "two racing frees of planned block %#" PRIxPTR ": %s and %s (exactly one must succeed)",
           p, gma_status_name(st), gma_status_name(fr.st));
    gma_status_t lost = st == GMA_OK ? fr.st : st;
    EXPECT(lost == GMA_ERR_DOUBLE_FREE ||
               (lost == GMA_ERR_INVALID_POINTER && stats_now().plan_replans > pre.plan_replans),
           "the losing free of a planned block returned %s", gma_status_name(lost));
    check_stats();
  }
}

/* PLAN_IDLE's async request (worker on): the worker gives an idle plan's
 * arena back before it waits for memory, so when the request needs the
 * arena (check) and is served, the arena went back. */
static void plan_idle_async(int si, size_t size, const gma_stats_t *pre, bool check) {
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.timeout_ns = 200000000;
  gma_stream_t h = handle_of(si);
  gma_future_t *f = NULL;
  F.in_submit = true;
  gma_status_t st = gma_alloc_async(F.g, size, h, &o, &f);
  F.in_submit = false;
  EXPECT_ST(st, GMA_OK, "gma_alloc_async of a request that needs the idle arena");
  F.n_submitted++;
  F.st[si].has_record = F.st[si].has_record == 1 ? 1 : -1; /* the worker may resolve it */
  F.st[si].counts_exact = false;
  void *p = NULL;
  st = gma_future_wait(f, UINT64_MAX, &p);
  vlog("async request of %zu on slot %d -> %s %p", size, si, gma_status_name(st), p);
  EXPECT(st == GMA_OK || st == GMA_ERR_TIMEOUT || (st == GMA_ERR_DEVICE && F.faults),
         "a request that needs the idle arena: gma_future_wait returned %s", gma_status_name(st));
  /* Served, or timed out (after at least one try, which met the OOM). */
  if (check && (st == GMA_OK || st == GMA_ERR_TIMEOUT))
    check_arena_went(pre, true, st == GMA_OK ? "an async request that needs the arena"
                                             : "an async request that needs the arena (timed out)");
  if (st == GMA_OK) {
    F.n_ready++;
    F.n_allocs++;
    F.collecting = true; /* its rows are async ones */
    add_block(p, size, si, F.st[si].gen, h, thread_of_slot(si), -1, 0);
    F.collecting = false;
  } else if (st == GMA_ERR_TIMEOUT) {
    F.n_timed_out++;
  } else {
    F.n_failed++;
  }
  EXPECT_ST(gma_future_release(f), GMA_OK, "gma_future_release");
}

/* Gives every block of the model back (PLAN_IDLE with bit 4): nothing else
 * holds memory then, once the streams are synchronized. */
static void free_everything(void) {
  while (F.nlive) free_block(F.nlive - 1, "gma_free of every block (PLAN_IDLE)");
}

/* PLAN_IDLE: the plan's arena is needed while no planned block is live
 * (the model's planned blocks are freed first; a plan being placed is
 * activated by a mark). The arena is cache then:
 * a synchronous request that cannot fit beside it (the model's live bytes
 * outside arenas + the arena + the request pass the limit), an async one
 * (worker on), gma_trim(g, 0) or gma_empty_cache must give it back: after
 * it, no arena is held, the plan left ACTIVE and plan_replans rose. With
 * every block freed first and the streams synchronized (bit 4, no fault
 * injection, no growth ahead, no future busy), the synchronous request
 * must also succeed (after a synchronize and a retry at most, since the
 * OOM path waits 2 ms for device work). Before that, optionally, a block of
 * the legacy stream (the arena's) is allocated and freed, so that the
 * arena goes back beside a cached block: the counts must stay exact (the
 * stats are checked right after).
 *   arg b: bits0-1 how (0 a synchronous request, 1 gma_trim(g, 0), 2
 *          gma_empty_cache, 3 an async request, synchronous without a
 *          worker), bit2 the legacy stream's cached block first, bit3 a
 *          fill kernel on it, bit4 free every block first, bit5 the request
 *          on the legacy stream (else on logical thread t's), bits6-7 the
 *          request's slack below the limit (MiB)
 *   arg c: the legacy block's size: (1 + (c & 7)) MiB less (c >> 3) * 4 KiB */
static void op_plan_idle(rd_t *r, int t) {
  unsigned b = rd8(r), c = rd8(r);
  int how = (int)(b & 3);
  if (how == 3 && !F.worker) how = 0;
  for (int i = F.nlive; i-- > 0;)
    if (F.live[i].planned) free_block(i, "gma_free of a planned block (PLAN_IDLE)");
  if (stats_now().plan_state == 3) { /* placed by now, most likely: the mark activates it */
    sleep_us(200);
    plan_mark();
  }
  bool all = (b >> 4) & 1;
  if (all) {
    free_everything();
    sync_all();
  }
  if ((b & 4) && F.nlive < MAX_LIVE) { /* beside the arena, cached on the legacy stream */
    size_t size = (1 + (c & 7)) * MiB - (c >> 3) * 4 * KiB;
    int i = plan_alloc_on(3, 3, size, "a legacy block beside the arena");
    if (i >= 0 && (b & 8) && block_usable(&F.live[i]))
      F.live[i].pat = launch_pattern(3, F.live[i].h, F.live[i].p, F.live[i].size, K_FILL_ONLY, 0, 0,
                                     F.live[i].id);
    if (i >= 0) free_block(i, "gma_free of the legacy block beside the arena");
  }
  observe_futures();
  sums_t m = model_sums();
  gma_stats_t pre = stats_now();
  bool idle = planned_live() == 0;
  uint64_t outside = m.dev_bytes - m.planned_bytes, slack = (b >> 6) * MiB;
  const char *what = how == 1 ? "gma_trim(g, 0)" : how == 2 ? "gma_empty_cache" : "a request";
  vlog("plan state %d, arena %" PRIu64 ", %s; the model holds %" PRIu64 " outside arenas",
       pre.plan_state, pre.plan_arena_bytes, what, outside);
  if (how == 1 || how == 2) {
    gma_status_t st = how == 1 ? gma_trim(F.g, 0) : gma_empty_cache(F.g);
    EXPECT(st == GMA_OK || (st == GMA_ERR_DEVICE && F.faults), "%s returned %s", what,
           gma_status_name(st));
    if (st == GMA_OK) check_arena_went(&pre, idle, what);
    check_stats();
    return;
  }
  if (outside + slack + 512 > F.limit || F.nlive >= MAX_LIVE) return;
  size_t size = (size_t)(F.limit - outside - slack);
  int si = (b & 0x20) ? 3 : stream_of_thread(t);
  bool needs_arena = size + outside + pre.plan_arena_bytes > F.limit;
  if (how == 3 && si != 4) {
    plan_idle_async(si, size, &pre, idle && needs_arena);
    check_stats();
    return;
  }
  int i = plan_alloc_on(si, thread_of_slot(si), size, "a request that needs the idle arena");
  /* Everything freed and every stream synchronized: nothing holds memory
   * but the arena, which is cache. */
  bool must = all && !F.faults && !F.grow_ahead && !F.orphaned && !any_future_busy() &&
              F.nlive == 0;
  for (int k = 0; i < 0 && must && k < 20; k++) {
    sync_all();
    sleep_us(1000);
    i = plan_alloc_on(si, thread_of_slot(si), size, "a request with nothing else live");
  }
  EXPECT(i >= 0 || !must,
         "gma_alloc(%zu) with nothing live, the streams synchronized and the idle arena cache "
         "failed 20 times: %s", size, gma_last_error());
  if (i >= 0 && !F.live[i].planned && idle && needs_arena)
    check_arena_went(&pre, true, "a request that needs the arena");
  check_stats();
}

/* PLAN_OOM_BUSY: a planned block is live (the model's, or plan_take's); a
 * block Y of the rest of the room is allocated on another stream, a
 * pattern kernel is queued on it (held behind a gate, or for up to 63 us)
 * and Y is freed; then a request of Y's size on a third stream (or the
 * planned block's) fits once that kernel completes: the model's live bytes
 * outside arenas + the arena + the request are within the limit. It may
 * succeed (another stream waits on the device under reuse:wait, or the
 * kernel completed) or fail (the OOM path waits at most 2 ms, and a gate
 * stays shut until the input opens it), but not as "a real shortage":
 * check_oom_cause checks the figures of that message against the model.
 *   arg b: bits0-2 where Y goes (the first live slot from there that is not
 *          the planned block's), bit3 the kernel gated (else held c >> 2
 *          us), bit4 the request on the planned block's stream (else the
 *          legacy stream's), bits5-6 Y's slack below the room (MiB)
 *   arg c: bits0-1 the gate; which live planned block (or which stream
 *          plan_take uses) */
static void op_plan_oom_busy(rd_t *r) {
  unsigned b = rd8(r), c = rd8(r);
  int i = pick_planned(c);
  if (i < 0) i = plan_take(c);
  if (i < 0 || F.nlive + 2 > MAX_LIVE) return;
  int psi = F.live[i].si, ysi = -1, rsi = -1;
  for (int k = 0; k < NSLOTS && ysi < 0; k++) {
    int x = (int)((b + (unsigned)k) % NSLOTS);
    if (x != psi && slot_live(x)) ysi = x;
  }
  if (ysi < 0) return;
  rsi = (b & 0x10) ? psi : 3;
  for (int k = 0; k < NSLOTS && rsi == ysi; k++)
    if (k != ysi && slot_live(k)) rsi = k;
  sums_t m = model_sums();
  uint64_t used = m.dev_bytes - m.planned_bytes + stats_now().plan_arena_bytes;
  uint64_t slack = ((b >> 5) & 3) * MiB;
  if (used + slack + MiB > F.limit) return;
  size_t ysize = (size_t)((F.limit - used - slack) / 512 * 512);
  int y = plan_alloc_on(ysi, thread_of_slot(ysi), ysize, "a block to free behind a kernel");
  if (y < 0) return;
  mblock_t *yb = &F.live[y];
  if (yb->kind != GMA_MEMORY_DEVICE || yb->planned || !block_usable(yb)) {
    free_block(y, "gma_free of a block not for the kernel");
    return;
  }
  yb->pat = launch_pattern(ysi, yb->h, yb->p, yb->size, K_HOLD_ONE, 0,
                           (b & 8) ? 0x80u | (c & 3) : (c >> 2) & 63, yb->id);
  free_block(y, "gma_free of the block behind a kernel");
  vlog("planned block #%" PRIu64 " live (slot %d); %zu bytes freed on slot %d behind a %s kernel; "
       "the same again on slot %d", F.live[i].id, psi, ysize, ysi, (b & 8) ? "gated" : "held", rsi);
  plan_alloc_on(rsi, thread_of_slot(rsi), ysize, "a request that fits once a kernel completes");
}


static void op_sleep(rd_t *r, int t) {
  unsigned a = rd8(r);
  if (F.plan && a >= 0x7C && a <= 0x7E) { /* see op_plan_race_free */
    static const char *const names[3] = {"PLAN_RACE_FREE", "PLAN_IDLE", "PLAN_OOM_BUSY"};
    F.opname = names[a - 0x7C];
    if (a == 0x7C) op_plan_race_free(r);
    else if (a == 0x7D) op_plan_idle(r, t);
    else op_plan_oom_busy(r);
    return;
  }
  if (F.plan && (a >> 6) == 1) {
    F.opname = "PLAN_MARK";
    plan_mark();
    return;
  }
  if (F.plan && (a >> 6) == 2) {
    F.opname = "PLAN_LOOP";
    op_plan_loop(r, a);
    return;
  }
  if (F.plan && (a >> 6) == 3) {
    F.opname = "PLAN_REPEAT";
    op_plan_repeat(a);
    return;
  }
  long us = (long)(a % 64) * 8; /* up to 0.5 ms: lets the worker tick */
  vlog("%ld us", us);
  sleep_us(us);
}

/* ---- configuration and the run --------------------------------------------------- */

static void pressure_cb(gma_t *g, gma_pressure_t level, void *user) {
  (void)user;
  gma_stats_t s = GMA_STATS_INIT;
  if (gma_stats(g, &s) != GMA_OK || (int)level < 0 || level > GMA_PRESSURE_CRITICAL) {
    fprintf(stderr, "fuzz_gma: CHECK FAILED: pressure callback level %d\n", (int)level);
    abort();
  }
  __atomic_fetch_add(&F.pressure_calls, 1, __ATOMIC_RELAXED);
}

/* ---- operations with a helper thread (issue 13) ---------------------------------
 * INTROSPECT with v = 8e + 3, e = 1..31, runs one of these ((e - 1) % 4 says
 * which; their arguments follow). Each starts one short-lived pthread, bounds
 * what it does and joins it before the operation ends. Only the fuzzer's
 * thread changes the model; a helper may read it while the fuzzer's thread
 * waits in pthread_join, and reports back through its own struct. A failed
 * check on a helper aborts there (gma_last_error is then the helper's). */

enum { TH_RACE_DESTROY = 0, TH_PTDS_THREAD = 1, TH_PRESSURE = 2, TH_REPORTERS = 3 };
enum { MAX_RACE = 16, MAX_PTDS = 8 };

static void start_thread(pthread_t *th, void *(*fn)(void *), void *arg) {
  int rc = pthread_create(th, NULL, fn, arg);
  EXPECT(rc == 0, "pthread_create: %d", rc);
}

static void join_thread(pthread_t th) {
  int rc = pthread_join(th, NULL);
  EXPECT(rc == 0, "pthread_join: %d", rc);
}

/* A few hundred nanoseconds to a few microseconds: shifts one side of a race. */
static void spin_for(unsigned n) {
  for (unsigned i = 0; i < n; i++) atomic_signal_fence(memory_order_seq_cst);
}

/* Two threads meet here and leave together, both running (a pthread barrier
 * would leave one of them waiting to be woken, tens of microseconds late).
 * Bounded: on a busy machine the other thread may need to be scheduled. */
static void meet(_Atomic int *arrived) {
  atomic_fetch_add_explicit(arrived, 1, memory_order_acq_rel);
  uint64_t t0 = now_ns();
  for (unsigned i = 0; atomic_load_explicit(arrived, memory_order_acquire) < 2; i++) {
    if (i > 2000) sched_yield();
    if (now_ns() - t0 > (uint64_t)GATE_LIMIT_MS * 1000000u) {
      fprintf(stderr, "fuzz_gma: CHECK FAILED: a helper thread did not reach its barrier in %d s\n",
              GATE_LIMIT_MS / 1000);
      abort();
    }
  }
}

/* -- 1. frees racing gma_stream_destroy -- */

typedef struct racer {
  _Atomic int bar;
  gma_t *g;
  void *ptrs[MAX_RACE];
  int n;
  unsigned spin;
  gma_status_t st[MAX_RACE];
} racer_t;

static void *race_free_main(void *arg) {
  racer_t *a = arg;
  meet(&a->bar);
  spin_for(a->spin);
  for (int k = 0; k < a->n; k++) a->st[k] = gma_free(a->g, a->ptrs[k]);
  return NULL;
}

/* Allocates up to 16 bin-sized blocks on user stream S (with a short hold
 * kernel on each, optionally), then a helper frees them while the fuzzer's
 * thread calls gma_stream_destroy(S); one barrier starts both. 1-4 rounds,
 * each on the slot's next stream. The frees and the destroy must succeed;
 * the blocks leave the model and the slot gets a new stream (a new
 * generation). What the race can break shows at the end of the input: a
 * block freed into the bin of a stream being retired must still reach the
 * pool, so that gma_empty_cache gives every byte back.
 *   arg a: bits0-3 blocks - 1, bits4-5 rounds - 1, bit6 a hold kernel on each
 *          block, bit7 the fuzzer's thread spins before it destroys (else the
 *          helper spins before it frees)
 *   arg b: bits0-1 size (4 KiB, 512, 8 KiB, 64 KiB), bits2-7 the kernels' hold (us)
 *   arg c: the spin (c * 32 iterations); logical thread 3 takes slot c % 3 */
static void op_race_destroy(rd_t *r, int t) {
  unsigned a = rd8(r), b = rd8(r), c = rd8(r);
  static const size_t sizes[4] = {4096, 512, 8192, 65536};
  size_t size = sizes[b & 3];
  int si = t < 3 ? t : (int)(c % 3);
  int want = 1 + (int)(a & 15), rounds = 1 + (int)((a >> 4) & 3);
  for (int round = 0; round < rounds; round++) {
    observe_futures();
    if (slot_in_flight(si)) return; /* a request on it is pending (see op_destroy) */
    if (!F.st[si].live) stream_create_slot(si);
    gma_stream_t h = F.st[si].h;
    racer_t ra = {.g = F.g, .spin = (a & 0x80) ? 0 : c * 32};
    for (int k = 0; k < want && F.nlive < MAX_LIVE; k++) {
      void *p = (void *)1;
      gma_status_t st = gma_alloc(F.g, size, h, &p);
      F.st[si].has_record = 1;
      EXPECT(st == GMA_OK || st == GMA_ERR_OOM || (st == GMA_ERR_DEVICE && F.faults),
             "gma_alloc(%zu) before the race returned %s", size, gma_status_name(st));
      if (st != GMA_OK) break;
      mblock_t *blk = add_block(p, size, si, F.st[si].gen, h, si, -1, 0);
      if (blk->kind != GMA_MEMORY_DEVICE) { /* host memory: not part of this race */
        free_block((int)(blk - F.live), "gma_free of a CPU-fallback block before the race");
        break;
      }
      F.n_allocs++;
      if (a & 0x40)
        blk->pat = launch_pattern(si, h, blk->p, blk->size, K_HOLD_ONE, 0, (b >> 2) & 63, blk->id);
      ra.ptrs[ra.n++] = p;
    }
    /* The model forgets the blocks now; the helper frees them. */
    for (int k = 0; k < ra.n; k++) {
      for (int i = 0; i < F.nlive; i++)
        if (F.live[i].p == (uintptr_t)ra.ptrs[k]) {
          tlog_add('F', F.live[i].p, F.live[i].size, F.live[i].h, F.live[i].bsize);
          remove_block(i);
          break;
        }
      F.n_frees++;
    }
    destroy_prepare(si, h);
    atomic_init(&ra.bar, 0);
    pthread_t th;
    start_thread(&th, race_free_main, &ra);
    meet(&ra.bar);
    if (a & 0x80) spin_for(c * 32);
    gma_status_t st = gma_stream_destroy(F.g, h);
    join_thread(th);
    vlog("round %d: %d blocks of %zu freed on a helper while slot %d (%p) was destroyed -> %s", round,
         ra.n, size, si, h, gma_status_name(st));
    for (int k = 0; k < ra.n; k++)
      EXPECT_ST(ra.st[k], GMA_OK, "gma_free racing gma_stream_destroy of the block's stream");
    destroy_done(si, h, st);
    stream_create_slot(si);
  }
}

/* -- 2. per-thread default streams of threads that exit -- */

typedef struct ptds_job {
  gma_t *g;
  int n, rounds;
  size_t sizes[MAX_PTDS];
  bool kernels, sync_exit;
  long hold_us;
  uint64_t seed;
  uint64_t dev_allocs, fb_allocs, dev_frees, launched; /* what it did, for the model */
  struct {
    char act;
    uintptr_t p;
    size_t size;
    uint64_t block;
  } ev[2 * 3 * MAX_PTDS]; /* its allocations and frees, in order (the trace check's) */
  int nev;
} ptds_job_t;

static void *ptds_main(void *arg) {
  ptds_job_t *j = arg;
  for (int round = 0; round < j->rounds; round++) {
    void *p[MAX_PTDS];
    size_t len[MAX_PTDS];
    uint64_t blk[MAX_PTDS];
    gma_memory_kind_t kind[MAX_PTDS];
    int got = 0;
    for (int i = 0; i < j->n; i++) {
      size_t size = j->sizes[i];
      void *q = (void *)1;
      gma_status_t st = gma_alloc(j->g, size, GMA_STREAM_PER_THREAD, &q);
      EXPECT(st == GMA_OK || st == GMA_ERR_OOM || (st == GMA_ERR_DEVICE && F.faults),
             "gma_alloc(%zu, PER_THREAD) on a helper thread returned %s", size, gma_status_name(st));
      if (st != GMA_OK) {
        EXPECT(q == NULL, "a failed gma_alloc left *out = %p", q);
        continue;
      }
      uintptr_t a = (uintptr_t)q;
      EXPECT(a && a % 256 == 0, "pointer %p on a helper thread is not 256-byte aligned", q);
      check_no_overlap(a, size, "an allocation on a helper thread's per-thread stream");
      for (int k = 0; k < got; k++)
        EXPECT(a + size <= (uintptr_t)p[k] || (uintptr_t)p[k] + len[k] <= a,
               "a helper thread's allocations %p (+%zu) and %p (+%zu) overlap", q, size, p[k], len[k]);
      gma_pointer_info_t info = GMA_POINTER_INFO_INIT;
      EXPECT_ST(gma_pointer_info(j->g, q, &info), GMA_OK, "gma_pointer_info on a helper thread");
      EXPECT(info.base == q && info.requested == size && info.block_size >= size &&
                 info.stream == GMA_STREAM_PER_THREAD &&
                 (info.kind == GMA_MEMORY_DEVICE || (info.kind == GMA_MEMORY_FALLBACK && F.fallback)),
             "pointer_info on a helper thread: base %p requested %zu block %zu stream %p kind %d for "
             "%p (%zu bytes, PER_THREAD)", info.base, info.requested, info.block_size, info.stream,
             (int)info.kind, q, size);
      p[got] = q, len[got] = size, kind[got] = info.kind, blk[got] = info.block_size, got++;
      j->ev[j->nev].act = 'A', j->ev[j->nev].p = a, j->ev[j->nev].size = size;
      j->ev[j->nev++].block = info.block_size;
      if (info.kind == GMA_MEMORY_FALLBACK) {
        j->fb_allocs++;
        continue;
      }
      j->dev_allocs++;
      if (!j->kernels) continue;
      /* Writes a pattern, holds, checks it: whoever gets this memory before
       * the kernel is done corrupts it. */
      kern_t *k = malloc(sizeof *k);
      EXPECT(k != NULL, "host memory");
      *k = (kern_t){.base = a, .len = size, .mode = K_HOLD_ONE, .hold_us = j->hold_us,
                    .pattern = mix64(j->seed + (uint64_t)(round * MAX_PTDS + i)), .opno = F.opno};
      st = gma_sim_launch(j->g, GMA_STREAM_PER_THREAD, kern_run, k);
      EXPECT_ST(st, GMA_OK, "gma_sim_launch(PER_THREAD) on a helper thread");
      j->launched++;
    }
    for (int k = 0; k < got; k++) {
      EXPECT_ST(gma_free(j->g, p[k]), GMA_OK, "gma_free on a helper thread");
      j->ev[j->nev].act = 'F', j->ev[j->nev].p = (uintptr_t)p[k], j->ev[j->nev].size = len[k];
      j->ev[j->nev++].block = blk[k];
      if (kind[k] == GMA_MEMORY_DEVICE) j->dev_frees++;
    }
  }
  if (j->sync_exit)
    EXPECT_ST(gma_stream_synchronize(j->g, GMA_STREAM_PER_THREAD), GMA_OK,
              "gma_stream_synchronize(PER_THREAD) on a helper thread");
  return NULL;
}

/* A thread allocates, uses (pattern kernels on its per-thread stream) and
 * frees blocks on GMA_STREAM_PER_THREAD, 1-3 rounds (later rounds hit its
 * bins), and exits; the fuzzer joins it. Its stream is gone with it: what it
 * cached must become reusable, so gma_empty_cache at the end of the input
 * gives every byte back.
 *   arg a: bits0-2 blocks - 1, bits3-4 rounds (1 + value % 3), bit5 kernels,
 *          bit6 it synchronizes its stream before it exits, bit7 all blocks of
 *          one size (else the sizes step through the table)
 *   arg b: bits0-2 the first size (512, 1000, 4 KiB, 8292, 64 KiB, 200000,
 *          1 MiB, 3 MiB), bits3-7 the kernels' hold (4 us steps) */
static void op_ptds_thread(rd_t *r) {
  unsigned a = rd8(r), b = rd8(r);
  static const size_t table[8] = {512, 1000, 4096, 8292, 65536, 200000, 1 << 20, 3 << 20};
  ptds_job_t j = {.g = F.g, .n = 1 + (int)(a & 7), .rounds = 1 + (int)((a >> 3) & 3) % 3,
                  .kernels = (a >> 5) & 1, .sync_exit = (a >> 6) & 1,
                  .hold_us = (long)(b >> 3) * 4, .seed = mix64(++F.next_pattern ^ 0x7d5)};
  for (int i = 0; i < j.n; i++) j.sizes[i] = table[(b + ((a & 0x80) ? 0 : (unsigned)i)) & 7];
  pthread_t th;
  start_thread(&th, ptds_main, &j);
  join_thread(th);
  vlog("a thread used PER_THREAD: %d x %d blocks (%" PRIu64 " device, %" PRIu64 " fallback), %" PRIu64
       " kernels, and exited", j.rounds, j.n, j.dev_allocs, j.fb_allocs, j.launched);
  for (int k = 0; k < j.nev; k++)
    tlog_add(j.ev[k].act, j.ev[k].p, j.ev[k].size, GMA_STREAM_PER_THREAD, j.ev[k].block);
  F.n_allocs += j.dev_allocs + j.fb_allocs; /* a fallback is a gma_alloc call too */
  F.n_frees += j.dev_frees + j.fb_allocs;   /* and every block the thread got, it freed */
  F.n_fallbacks += j.fb_allocs;
  F.kernels_launched += j.launched;
}

/* -- 3. the pressure callback set, replaced and removed -- */

#define PCTX_LIVE 0x9e55c0de5afe0001ull
#define PCTX_DEAD 0xdeadc0dedeadc0deull

typedef struct pctx {
  uint64_t magic;         /* PCTX_LIVE until the fuzzer gives it up */
  _Atomic int entered;    /* the callback started with this context */
  _Atomic uint64_t calls; /* two per callback: at its start and at its end */
  long hold_us;           /* the callback holds the worker this long */
} pctx_t;

static void pctx_check(const pctx_t *c, const char *when) {
  if (c && c->magic == PCTX_LIVE) return;
  fprintf(stderr,
          "fuzz_gma: CHECK FAILED: the pressure callback %s with a context the fuzzer gave up (magic "
          "%#" PRIx64 "): gma_set_pressure_callback returned while the callback still ran\n",
          when, c ? c->magic : 0);
  abort();
}

/* Reads and writes its context at its start and after a hold: a callback
 * still running after the unset or replace returned (and the context was
 * freed) is a use after free under ASan, a poisoned magic value elsewhere. */
static void pctx_cb(gma_t *g, gma_pressure_t level, void *user) {
  pctx_t *c = user;
  pctx_check(c, "started");
  if ((int)level < 0 || level > GMA_PRESSURE_CRITICAL) {
    fprintf(stderr, "fuzz_gma: CHECK FAILED: pressure callback level %d\n", (int)level);
    abort();
  }
  atomic_fetch_add_explicit(&c->calls, 1, memory_order_relaxed);
  atomic_store_explicit(&c->entered, 1, memory_order_release); /* pairs with pctx_wait */
  if (c->hold_us) sleep_us(c->hold_us);
  gma_stats_t s = GMA_STATS_INIT;
  if (gma_stats(g, &s) != GMA_OK) {
    fprintf(stderr, "fuzz_gma: CHECK FAILED: gma_stats in the pressure callback\n");
    abort();
  }
  pctx_check(c, "went on");
  atomic_fetch_add_explicit(&c->calls, 1, memory_order_relaxed);
  __atomic_fetch_add(&F.pressure_calls, 1, __ATOMIC_RELAXED);
}

static pctx_t *pctx_new(long hold_us) {
  pctx_t *c = calloc(1, sizeof *c);
  EXPECT(c != NULL, "host memory");
  c->magic = PCTX_LIVE;
  c->hold_us = hold_us;
  return c;
}

/* gma_set_pressure_callback returned: the old context is the fuzzer's again.
 * Poisoned and freed at once (a callback still running would read it). */
static void pctx_give_up(pctx_t *c) {
  if (!c) return;
  c->magic = PCTX_DEAD;
  free(c);
}

/* The callback runs once at the worker's next tick after each set. After
 * 100 ms the gates open: the worker may be waiting for a stream (a closing
 * event that could not be recorded is waited for), and only the fuzzer's
 * thread, waiting here, could let the stream go on. */
static void pctx_wait(pctx_t *c) {
  for (uint64_t t0 = now_ns(); !atomic_load_explicit(&c->entered, memory_order_acquire);) {
    if (now_ns() - t0 > 100000000u) gates_open_all();
    if (now_ns() - t0 > (uint64_t)SETTLE_MS * 1000000u)
      FAIL("the pressure callback did not run within %d ms of gma_set_pressure_callback", SETTLE_MS);
    sleep_us(50);
  }
}

static void set_pressure(gma_pressure_callback_t cb, pctx_t *c, const char *what) {
  gma_status_t st = gma_set_pressure_callback(F.g, cb, c);
  EXPECT_ST(st, GMA_OK, what);
  pctx_t *old = F.pcb;
  F.pcb = cb == pctx_cb ? c : NULL;
  F.pcb_plain = cb == pressure_cb;
  pctx_give_up(old);
}

/* Sets, replaces or removes the pressure callback (worker on; without a
 * worker the call must say GMA_ERR_UNSUPPORTED). The contexts are heap
 * memory the fuzzer frees as soon as the call that replaced them returns.
 *   arg a: bits0-1 0 set or replace with a new context, 1 remove (NULL), 2
 *          back to the plain callback of byte 3 bit4, 3 set a new context,
 *          wait until its callback runs, and remove it while it holds;
 *          bit2 first wait until the current context's callback has started
 *          (then it likely still holds); bits3-7 the new context's hold
 *          (100 us steps; mode 3: at least 1 ms) */
static void op_pressure(rd_t *r) {
  unsigned a = rd8(r);
  int mode = (int)(a & 3);
  long hold = (long)(a >> 3) * 100;
  if (!F.worker) {
    pctx_t probe = {.magic = PCTX_LIVE};
    EXPECT_ST(gma_set_pressure_callback(F.g, pctx_cb, &probe), GMA_ERR_UNSUPPORTED,
              "gma_set_pressure_callback without a worker");
    return;
  }
  if ((a & 4) && F.pcb) pctx_wait(F.pcb);
  switch (mode) {
    case 0: set_pressure(pctx_cb, pctx_new(hold), "gma_set_pressure_callback (set or replace)"); break;
    case 1: set_pressure(NULL, NULL, "gma_set_pressure_callback(NULL)"); break;
    case 2: set_pressure(pressure_cb, NULL, "gma_set_pressure_callback (the plain callback)"); break;
    default: {
      pctx_t *c = pctx_new(hold > 1000 ? hold : 1000);
      set_pressure(pctx_cb, c, "gma_set_pressure_callback (set)");
      pctx_wait(c);
      set_pressure(NULL, NULL, "gma_set_pressure_callback(NULL) while the callback runs");
      break;
    }
  }
  vlog("pressure callback mode %d hold %ld us: now %s", mode, hold,
       F.pcb ? "a context" : F.pcb_plain ? "the plain one" : "none");
}

/* -- 4. the reports while the hot path runs -- */

typedef struct reporter {
  pthread_barrier_t bar;
  gma_t *g;
  _Atomic int stop;
  unsigned which; /* bit0 gma_live_report, bit1 gma_find_old_allocations, bit2 gma_snapshot_json */
  size_t cap, rows, len;
  int runs;
} reporter_t;

/* The answers any report must give, quiescent or not. */
static void check_found(const gma_allocation_info_t *out, size_t cap, size_t count) {
  for (size_t k = 0; k < count && k < cap; k++) {
    const gma_allocation_info_t *e = &out[k];
    EXPECT(e->ptr && (uintptr_t)e->ptr % 256 == 0 && e->block_size % 512 == 0 &&
               e->requested >= 1 && e->requested <= e->block_size && e->tag != NULL,
           "gma_find_old_allocations entry %zu: ptr %p requested %zu block %zu tag %s", k, e->ptr,
           e->requested, e->block_size, e->tag ? e->tag : "(null)");
    EXPECT(k == 0 || out[k - 1].age_ns >= e->age_ns,
           "gma_find_old_allocations: entry %zu (age %" PRIu64 ") after a younger one (%" PRIu64 ")",
           k, e->age_ns, out[k - 1].age_ns);
  }
}

static void *reporter_main(void *arg) {
  reporter_t *a = arg;
  char *buf = malloc(a->len);
  gma_allocation_info_t *out = calloc(a->cap ? a->cap : 1, sizeof *out);
  EXPECT(buf && out, "host memory");
  pthread_barrier_wait(&a->bar);
  for (int i = 0; i < 64 && (i == 0 || !atomic_load_explicit(&a->stop, memory_order_acquire)); i++) {
    if (a->which & 1) {
      gma_status_t st = gma_live_report(a->g, a->rows, buf, a->len);
      EXPECT(st == GMA_OK || (st == GMA_ERR_INVALID_SIZE && a->len < 65536),
             "gma_live_report(rows %zu, len %zu) on a helper thread returned %s", a->rows, a->len,
             gma_status_name(st));
      EXPECT(memchr(buf, '\0', a->len) != NULL, "gma_live_report left no NUL in %zu bytes", a->len);
      size_t n;
      EXPECT(st != GMA_OK || sscanf(buf, "%zu live allocations", &n) == 1,
             "gma_live_report begins '%.60s'", buf);
    }
    if (a->which & 2) {
      size_t count = SIZE_MAX;
      gma_status_t st = gma_find_old_allocations(a->g, 0, a->cap ? out : NULL, a->cap, &count);
      EXPECT_ST(st, GMA_OK, "gma_find_old_allocations on a helper thread");
      EXPECT(count != SIZE_MAX, "gma_find_old_allocations did not set *count");
      check_found(out, a->cap, count);
    }
    if (a->which & 4)
      EXPECT_ST(gma_snapshot_json(a->g, "/dev/null"), GMA_OK, "gma_snapshot_json on a helper thread");
    a->runs++;
  }
  free(buf);
  free(out);
  return NULL;
}

/* With nothing running: the reports agree with the model. cap > 0 also when
 * nothing is live. */
static void check_reports_quiet(size_t cap) {
  snap_t quiet = snap_take();
  bool exact = quiet.valid && !futures_in_flight() && !futures_uncollected();
  gma_allocation_info_t *out = calloc(cap, sizeof *out);
  EXPECT(out != NULL, "host memory");
  size_t count = SIZE_MAX;
  gma_status_t st = gma_find_old_allocations(F.g, 0, cap ? out : NULL, cap, &count);
  EXPECT_ST(st, GMA_OK, "gma_find_old_allocations");
  check_found(out, cap, count);
  if (exact) {
    sums_t m = model_sums();
    EXPECT(count == m.dev_count, "gma_find_old_allocations counts %zu live allocations, the model %" PRIu64,
           count, m.dev_count);
    for (size_t k = 0; k < count && k < cap; k++) {
      int i = 0;
      while (i < F.nlive && F.live[i].p != (uintptr_t)out[k].ptr) i++;
      EXPECT(i < F.nlive && F.live[i].kind == GMA_MEMORY_DEVICE,
             "gma_find_old_allocations names %p, no live device block of the model", out[k].ptr);
      mblock_t *b = &F.live[i];
      const char *want_tag = b->tag >= 0 ? tag_names[b->tag] : "untagged";
      EXPECT(out[k].requested == b->size && out[k].block_size == b->bsize &&
                 strcmp(out[k].tag, want_tag) == 0,
             "gma_find_old_allocations on block #%" PRIu64 ": requested %zu block %zu tag %s, the model "
             "%zu / %" PRIu64 " / %s", b->id, out[k].requested, out[k].block_size, out[k].tag,
             b->size, b->bsize, want_tag);
      if (slot_live(b->si) && F.st[b->si].gen == b->gen && (b->si >= 3 || F.st[b->si].h == b->h))
        EXPECT(default_handle(b->h) ? default_handle(out[k].stream) : out[k].stream == b->h,
               "gma_find_old_allocations: block #%" PRIu64 " on stream %p, allocated on %p", b->id,
               out[k].stream, b->h);
    }
    size_t len = 1 << 16;
    char *buf = malloc(len);
    EXPECT(buf != NULL, "host memory");
    st = gma_live_report(F.g, 5, buf, len);
    EXPECT_ST(st, GMA_OK, "gma_live_report with 64 KiB");
    size_t n = SIZE_MAX;
    uint64_t bytes = UINT64_MAX;
    EXPECT(sscanf(buf, "%zu live allocations, %" SCNu64 " bytes", &n, &bytes) == 2 &&
               n == m.dev_count && bytes == m.dev_bytes,
           "gma_live_report says '%.80s'; the model has %" PRIu64 " blocks, %" PRIu64 " bytes", buf,
           m.dev_count, m.dev_bytes);
    free(buf);
  }
  free(out);
  EXPECT_ST(gma_snapshot_json(F.g, "/dev/null"), GMA_OK, "gma_snapshot_json");
}

/* A helper runs gma_live_report, gma_find_old_allocations (cap > 0) and
 * gma_snapshot_json in a loop while the fuzzer's thread makes alloc/free
 * pairs of one size on its stream (bin hits after the first); then, with
 * nothing running, the reports must agree with the model.
 *   arg a: bits0-3 pairs - 1, bits4-6 which reports (1 + value % 7: bit0 live
 *          report, bit1 find_old, bit2 snapshot), bit7 the quiet check's cap
 *          is 1 (else the helper's)
 *   arg b: bits0-1 cap (1, 2, 8, 64), bits2-3 size (512, 4 KiB, 8292, 64 KiB),
 *          bits4-5 the live report's buffer (64 B, 512 B, 64 KiB, 64 KiB),
 *          bits6-7 its rows (0, 1, 5, 40) */
static void op_reporters(rd_t *r, int t) {
  unsigned a = rd8(r), b = rd8(r);
  static const size_t caps[4] = {1, 2, 8, 64}, sizes[4] = {512, 4096, 8292, 65536},
                      lens[4] = {64, 512, 1 << 16, 1 << 16}, rows[4] = {0, 1, 5, 40};
  int pairs = 1 + (int)(a & 15);
  int si = stream_of_thread(t);
  gma_stream_t h = handle_of(si);
  size_t size = sizes[(b >> 2) & 3];
  reporter_t rep = {.g = F.g, .which = 1 + ((a >> 4) & 7) % 7, .cap = caps[b & 3],
                    .len = lens[(b >> 4) & 3], .rows = rows[b >> 6]};
  atomic_init(&rep.stop, 0);
  EXPECT(pthread_barrier_init(&rep.bar, NULL, 2) == 0, "pthread_barrier_init");
  pthread_t th;
  start_thread(&th, reporter_main, &rep);
  pthread_barrier_wait(&rep.bar);
  int done = 0;
  for (int k = 0; k < pairs && F.nlive < MAX_LIVE; k++) {
    void *p = (void *)1;
    gma_status_t st = gma_alloc(F.g, size, h, &p);
    F.st[si].has_record = 1;
    EXPECT(st == GMA_OK || st == GMA_ERR_OOM || (st == GMA_ERR_DEVICE && F.faults),
           "gma_alloc(%zu) beside the reports returned %s", size, gma_status_name(st));
    if (st != GMA_OK) break;
    done++;
    if (F.fallback) { /* it may be host memory: gma_pointer_info says (it takes the pool lock) */
      mblock_t *blk = add_block(p, size, si, F.st[si].gen, h, t, -1, 0);
      if (blk->kind == GMA_MEMORY_DEVICE) F.n_allocs++;
      free_block((int)(blk - F.live), "gma_free beside the reports");
      continue;
    }
    /* Lock-free on a bin hit, as a hot loop is: no gma call between the
     * alloc and the free that would take the pool lock. */
    uintptr_t q = (uintptr_t)p;
    EXPECT(q && q % 256 == 0, "pointer %p is not 256-byte aligned", p);
    check_no_overlap(q, size, "an allocation beside the reports");
    tlog_add('A', q, size, h, 0);
    F.n_allocs++;
    F.st[si].allocs++;
    spin_for(64u * (unsigned)(k + 1)); /* live a moment: the reports may see it */
    st = gma_free(F.g, p);
    EXPECT_ST(st, GMA_OK, "gma_free beside the reports");
    tlog_add('F', q, size, h, 0);
    F.n_frees++;
    F.st[si].frees++;
    grave_add(F.grave, &F.ngrave, q);
  }
  atomic_store_explicit(&rep.stop, 1, memory_order_release);
  join_thread(th);
  pthread_barrier_destroy(&rep.bar);
  vlog("reports %u (cap %zu, len %zu, rows %zu) ran %d times beside %d alloc/free pairs of %zu on slot %d",
       rep.which, rep.cap, rep.len, rep.rows, rep.runs, done, size, si);
  check_reports_quiet((a & 0x80) ? 1 : caps[b & 3]);
}

static void op_threaded(rd_t *r, int t, unsigned e) {
  switch ((e - 1) % 4) {
    case TH_RACE_DESTROY: F.opname = "RACE_DESTROY"; op_race_destroy(r, t); break;
    case TH_PTDS_THREAD: F.opname = "PTDS_THREAD"; op_ptds_thread(r); break;
    case TH_PRESSURE: F.opname = "PRESSURE_CB"; op_pressure(r); break;
    default: F.opname = "REPORTERS"; op_reporters(r, t); break;
  }
}

static void configure(rd_t *r) {
  unsigned b0 = rd8(r), b1 = rd8(r), b2 = rd8(r);
  F.end_mode = (int)rd8(r);
  /* Bit 5 of the end-mode byte lets pinned host and CPU-fallback blocks
   * outlive the stream they were allocated on (destroyed while they are
   * live, then freed); without it a stream's host blocks are freed before
   * the stream is destroyed. Both are allowed; the first was bug A of
   * tests/fuzz/crashes/README.md. */
  F.host_outlives = (F.end_mode & 32) != 0;
  /* Bit 6: planned memory (plan:on, issue 18); SLEEP's argument then also
   * names the plan's operations (op_sleep). */
  F.plan = (F.end_mode & 64) != 0;
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  static const uint64_t caps[4] = {32 * MiB, 64 * MiB, 64 * MiB, 128 * MiB};
  static const uint64_t ticks[4] = {1, 2, 5, 50};
  c.sim_capacity = caps[b1 & 3];
  c.worker_off = !(b0 & 1);
  c.expandable_segments = (b0 >> 1) & 1 ? GMA_SEGMENTS_GROWABLE : GMA_SEGMENTS_ORDINARY;
  c.bins_off = (b0 >> 2) & 1;
  c.reuse = ((b0 >> 3) & 3) == 3 ? GMA_REUSE_QUERY : (gma_reuse_t)((b0 >> 3) & 3);
  c.fallback_host = (b0 >> 5) & 1;
  if ((b0 >> 6) & 1) { /* a temporary file, read by trace_check at the end */
    const char *dir = getenv("TMPDIR");
    snprintf(F.trace_file, sizeof F.trace_file, "%s/fuzz_gma_trace_XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(F.trace_file);
    EXPECT(fd >= 0, "mkstemp(%s) for the trace", F.trace_file);
    close(fd);
    snprintf(c.trace_path, sizeof c.trace_path, "%s", F.trace_file);
  }
  F.faults = (b0 >> 7) & 1;
  if (F.faults) {
    c.sim_fail_alloc = b2 & 7;
    c.sim_fail_event = 8 * ((b2 >> 3) & 7);
    F.faults = c.sim_fail_alloc || c.sim_fail_event;
  }
  c.trim_interval_ms = ticks[(b1 >> 2) & 3];
  c.release_threshold = (b1 >> 4) & 1 ? 8 * MiB : 512;
  c.idle_ms = (b1 >> 5) & 1 ? 10000 : 1;
  c.grow_ahead = (b1 >> 6) & 1 ? 4 * MiB : 0;
  if ((b1 >> 7) & 1) {
    c.bin_depth = 2;
    c.ring_size = 2;
    c.bin_max = 64 * KiB;
  }
  c.future_timeout_ms = 20;
  /* The OOM path waits for device work that gates freed memory; the fuzzer
   * holds kernels behind gates only it opens, so an unbounded wait would
   * wait for the fuzzer itself. 2 ms: short waits still succeed. */
  c.oom_wait_ms = 2;
  if ((b2 >> 6) & 1) c.memory_limit = c.sim_capacity / 4 * 3;
  c.plan = F.plan;
  if ((b2 >> 7) & 1) {
    c.small_segment_size = 1 * MiB;
    c.large_segment_size = 4 * MiB;
  }
  F.cfg = c;
  F.capacity = c.sim_capacity;
  F.limit = c.memory_limit ? c.memory_limit : c.sim_capacity;
  F.bin_max = c.bins_off ? 0 : class_round(c.bin_max ? c.bin_max : MiB);
  F.worker = !c.worker_off;
  F.fallback = c.fallback_host;
  F.grow_ahead = c.grow_ahead != 0 && F.worker;
}

static void open_streams(void) {
  for (int si = 0; si < 3; si++) stream_create_slot(si);
  for (int si = 3; si < NSLOTS; si++) {
    F.st[si].live = true;
    F.st[si].counts_exact = true;
  }
}

static void run_op(rd_t *r) {
  if (F.plan) F.plan_hits_seen = stats_now().plan_hits;
  unsigned b = rd8(r);
  int t = (int)(b >> 6);
  int op = (int)((b & 63) % NOPS);
  F.opname = op_names[op];
  switch (op) {
    case OP_ALLOC: op_alloc(r, t, false); break;
    case OP_ALLOC_TAGGED: op_alloc(r, t, true); break;
    case OP_FREE: op_free(r, t); break;
    case OP_MISUSE: op_misuse(r, t); break;
    case OP_RECORD: op_record(r, t); break;
    case OP_K_FILL: op_kernel(r, t, K_FILL_ONLY); break;
    case OP_K_CHECK: op_kernel(r, t, K_CHECK_ONLY); break;
    case OP_K_HOLD: op_kernel(r, t, K_HOLD_ONE); break;
    case OP_GATE_OPEN: op_gate_open(r); break;
    case OP_ASYNC: op_async(r, t, false); break;
    case OP_ASYNC_BATCH: op_async(r, t, true); break;
    case OP_F_POLL: op_poll(r); break;
    case OP_F_WAIT: op_wait(r); break;
    case OP_F_RELEASE: op_release(r); break;
    case OP_BATCH: op_batch(r, t); break;
    case OP_TRIM: op_trim(r, false); break;
    case OP_EMPTY_CACHE: op_trim(r, true); break;
    case OP_SYNC: op_sync(t); break;
    case OP_RETIRE: op_retire(t); break;
    case OP_DESTROY: op_destroy(t); break;
    case OP_HOST_ALLOC: op_host_alloc(r, t); break;
    case OP_HOST_FREE: op_host_free(r); break;
    case OP_HOST_KERNEL: op_host_kernel(r); break;
    case OP_PINFO: op_pinfo(r); break;
    case OP_RESERVE: op_reserve(r, t); break;
    case OP_INTROSPECT: op_introspect(r, t); break;
    case OP_SLEEP: op_sleep(r, t); break;
    case OP_SYNC_ALL:
      sync_all();
      vlog("all streams");
      break;
    case OP_DEFAULT_MODE:
      F.t3_ptds = !F.t3_ptds;
      vlog("thread 3 now on the %s stream", F.t3_ptds ? "per-thread" : "default");
      break;
  }
}

/* Every chain's head completes (its timeout is short, and the gates are
 * open), so each child slot is an ordinary future, or free, before the
 * futures are collected or released. */
static void chains_settle(void) {
  for (uint64_t t0 = now_ns(); chains_awaiting();) {
    observe_futures();
    if (now_ns() - t0 > (uint64_t)SETTLE_MS * 1000000u)
      FAIL("%d chains' first requests did not complete in %d ms", chains_awaiting(), SETTLE_MS);
    sleep_us(100);
  }
}

/* ---- the trace check ----------------------------------------------------------- */

typedef struct trow {
  uint64_t t_ns;
  uintptr_t p;
  uint64_t size, stream, block, id;
  int line;
  char act;
} trow_t;

static int trow_cmp(const void *x, const void *y) {
  const trow_t *a = x, *b = y;
  if (a->t_ns != b->t_ns) return a->t_ns < b->t_ns ? -1 : 1;
  return a->line - b->line;
}

static int tlog_cmp(const void *x, const void *y) {
  const tlog_t *a = *(const tlog_t *const *)x, *b = *(const tlog_t *const *)y;
  if (a->act != b->act) return a->act - b->act;
  if (a->p != b->p) return a->p < b->p ? -1 : 1;
  return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* One CSV row: Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status.
 * True for an allocate or free row of a successful call. */
static bool trace_row(char *line, trow_t *r) {
  char *f[10];
  int n = 0;
  for (char *q = line; n < 10;) {
    f[n++] = q;
    q = strchr(q, ',');
    if (!q) break;
    *q++ = '\0';
  }
  EXPECT(n == 10, "trace line %d has %d fields", r->line, n);
  f[9][strcspn(f[9], "\r\n")] = '\0';
  bool alloc = strcmp(f[2], "allocate") == 0, freed = strcmp(f[2], "free") == 0;
  if ((!alloc && !freed) || f[9][0]) return false;
  char *dot = strchr(f[1], '.');
  EXPECT(dot && strlen(dot + 1) == 9, "trace line %d: time '%s'", r->line, f[1]);
  r->t_ns = strtoull(f[1], NULL, 10) * 1000000000u + strtoull(dot + 1, NULL, 10);
  r->act = alloc ? 'A' : 'F';
  r->p = (uintptr_t)strtoull(f[3], NULL, 16);
  r->size = strtoull(f[4], NULL, 10);
  r->stream = strtoull(f[5], NULL, 16);
  if (r->stream == (uint64_t)(uintptr_t)GMA_STREAM_LEGACY) r->stream = 0;
  r->block = strtoull(f[6], NULL, 10);
  r->id = strtoull(f[7], NULL, 10);
  return true;
}

static bool trace_fits(const trow_t *r, const tlog_t *e) {
  return r->size == e->size && r->stream == e->stream &&
         (e->block ? r->block == e->block : r->block >= r->size);
}

/* The allocate and free rows of successful calls in byte 0 bit 6's trace
 * file, sorted by time (*n of them); the file is removed. */
static trow_t *trace_read(size_t *n) {
  FILE *f = fopen(F.trace_file, "r");
  EXPECT(f != NULL, "cannot open the trace %s", F.trace_file);
  char line[512];
  static const char header[] = "Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status";
  EXPECT(fgets(line, sizeof line, f) && strncmp(line, header, sizeof header - 1) == 0,
         "the trace's header is '%.80s'", line);
  trow_t *rows = NULL;
  size_t nrows = 0, cap = 0;
  for (int ln = 2; fgets(line, sizeof line, f); ln++) {
    trow_t r = {.line = ln};
    if (!trace_row(line, &r)) continue;
    if (nrows == cap) {
      cap = cap ? 2 * cap : 256;
      rows = realloc(rows, cap * sizeof *rows);
      EXPECT(rows != NULL, "host memory");
    }
    rows[nrows++] = r;
  }
  fclose(f);
  unlink(F.trace_file);
  if (nrows) qsort(rows, nrows, sizeof *rows, trow_cmp);
  *n = nrows;
  return rows;
}

/* The first logged event of r's action and pointer not matched yet (idx:
 * the log sorted by tlog_cmp), or NULL. */
static tlog_t *trace_next(tlog_t *const *idx, const trow_t *r) {
  size_t lo = 0, hi = F.ntlog;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (idx[mid]->act < r->act || (idx[mid]->act == r->act && idx[mid]->p < r->p)) lo = mid + 1;
    else hi = mid;
  }
  for (; lo < F.ntlog && idx[lo]->act == r->act && idx[lo]->p == r->p; lo++)
    if (!idx[lo]->used) return idx[lo];
  return NULL;
}

/* The model's last allocate event for r's pointer that a row already
 * took, or NULL. */
static tlog_t *trace_last_taken(tlog_t *const *idx, const trow_t *r) {
  tlog_t *last = NULL;
  for (size_t i = 0; i < F.ntlog; i++)
    if (idx[i]->act == 'A' && idx[i]->p == r->p && idx[i]->used &&
        (!last || idx[i]->seq > last->seq))
      last = idx[i];
  return last;
}

/* gma_reserve's allocations whose free row has not come yet. */
typedef struct tunknown {
  tlog_t v[64];
  int n;
} tunknown_t;

/* One row: the next event the model logged for its pointer, else one the
 * model cannot know (see trace_check), else a failure. */
static void trace_match(tlog_t *const *idx, const trow_t *r, tunknown_t *un) {
  if (r->act == 'A' && r->id && !r->block) return; /* an async batch's: Block 0 by design */
  tlog_t *e = trace_next(idx, r);
  int u = 0;
  while (u < un->n && un->v[u].p != r->p) u++;
  if (r->act == 'F' && u < un->n) { /* the free of one of gma_reserve's allocations */
    EXPECT(trace_fits(r, &un->v[u]),
           "trace line %d: free of %#" PRIxPTR " (Size %" PRIu64 ", Stream %#" PRIx64 ", Block %"
           PRIu64 "); its allocate row said %" PRIu64 " / %#" PRIx64 " / %" PRIu64, r->line, r->p,
           r->size, r->stream, r->block, un->v[u].size, un->v[u].stream, un->v[u].block);
    un->v[u] = un->v[--un->n];
    return;
  }
  if (e && trace_fits(r, e)) {
    e->used = true;
    return;
  }
  for (size_t k = 0; r->act == 'F' && k < F.ntfut; k++) /* a future's memory, freed by gma */
    if (!F.tfut[k].used && F.tfut[k].size == r->size && F.tfut[k].stream == r->stream &&
        r->block >= r->size) {
      F.tfut[k].used = true;
      return;
    }
  if (r->act == 'A' && F.trace_unknown && un->n < 64) { /* one of gma_reserve's */
    F.trace_unknown--;
    un->v[un->n++] = (tlog_t){.p = r->p, .size = r->size, .stream = r->stream, .block = r->block,
                              .act = 'A'};
    return;
  }
  if (r->act == 'F' && F.trace_unknown) {
    /* One of gma_reserve's blocks, at an address where a block of the model
     * (same size, stream and block) comes later: its allocate row took that
     * block's event. This free shows it was gma_reserve's: the event goes
     * back to the allocate row still to come. */
    trow_t a = *r;
    a.act = 'A';
    tlog_t *m = trace_last_taken(idx, &a);
    if (m && trace_fits(&a, m)) {
      m->used = false;
      F.trace_unknown--;
      return;
    }
  }
  if (e)
    FAIL("trace line %d: %s of %#" PRIxPTR " says Size %" PRIu64 ", Stream %#" PRIx64
         ", Block %" PRIu64 "; the model's (event %u) %" PRIu64 " / %#" PRIx64 " / %" PRIu64,
         r->line, r->act == 'A' ? "allocate" : "free", r->p, r->size, r->stream, r->block, e->seq,
         e->size, e->stream, e->block);
  FAIL("trace line %d: %s of %#" PRIxPTR " (Size %" PRIu64 ", Stream %#" PRIx64 ", Block %" PRIu64
       "), an event the model does not know", r->line, r->act == 'A' ? "allocate" : "free", r->p,
       r->size, r->stream, r->block);
}

/* The rows of byte 0 bit 6's trace (written from gma_create until gma_destroy,
 * or until gma_trace_start or _stop closed it) against the model's log, in
 * time order: each allocate and free row of a successful call is the next
 * event the model logged for its pointer, with the model's bytes asked for,
 * stream and block size (gma_pointer_info's), planned blocks included.
 * Other rows only where the model cannot know the pointer: a free of a
 * future's memory nobody collected (gma frees it; its bytes and stream
 * match that future), and gma_reserve's own allocate and free pairs (at
 * most as many as it was asked for; each free row agrees with its
 * allocate row). An async batch's allocate rows (Block 0) are left out.
 * When the trace ran to the end, every event the model logged has its row. */
static void trace_check(void) {
  if (!F.trace_file[0]) return;
  for (int i = 0; i < MAX_FUT; i++) { /* completed with memory the model has not counted yet */
    mfut_t *m = &F.fut[i];
    if (m->used && !m->accounted && !m->collected && atomic_load(&m->cb_runs) == 1 &&
        atomic_load(&m->cb_status) == GMA_OK)
      tfut_add(m);
  }
  size_t nrows = 0;
  trow_t *rows = trace_read(&nrows);
  tlog_t **idx = malloc((F.ntlog + 1) * sizeof *idx);
  EXPECT(idx != NULL, "host memory");
  for (size_t i = 0; i < F.ntlog; i++) idx[i] = &F.tlog[i];
  if (F.ntlog) qsort(idx, F.ntlog, sizeof *idx, tlog_cmp);
  tunknown_t un = {.n = 0};
  for (size_t i = 0; i < nrows; i++) trace_match(idx, &rows[i], &un);
  if (!F.trace_closed)
    for (size_t i = 0; i < F.ntlog; i++)
      EXPECT(F.tlog[i].used, "the model's %s of %#" PRIxPTR " (event %zu: %" PRIu64 " bytes, stream %#"
             PRIx64 ", block %" PRIu64 ") has no row in the trace",
             F.tlog[i].act == 'A' ? "allocation" : "free", F.tlog[i].p, i, F.tlog[i].size,
             F.tlog[i].stream, F.tlog[i].block);
  free(idx);
  free(rows);
}

static void trace_forget(void) {
  free(F.tlog);
  free(F.tfut);
  F.tlog = F.tfut = NULL;
  F.ntlog = F.ntfut = F.tlog_cap = F.tfut_cap = 0;
}

/* Frees everything, synchronizes, and checks that every byte goes back. */
static void finish(void) {
  F.opname = "END";
  gates_open_all();
  bool keep_futures = (F.end_mode & 15) == 8, leak_one = (F.end_mode & 15) == 7;
  if (!keep_futures) chains_settle();
  for (int i = 0; i < MAX_FUT; i++) {
    mfut_t *m = &F.fut[i];
    if (!m->used || m->released || keep_futures) continue;
    if ((F.end_mode & 15) == 6) {
      observe_futures();
      bool done_ok = m->accounted && atomic_load(&m->cb_status) == GMA_OK;
      gma_status_t st = gma_future_release(m->f);
      EXPECT_ST(st, GMA_OK, "gma_future_release at the end");
      m->released = true;
      m->f = NULL;
      if (done_ok && !m->collected) F.n_frees += m->n;
      if (m->accounted) fut_free_slot(m);
      continue;
    }
    if (!m->collected) { /* a collected one has nothing more to give */
      void *p = NULL;
      gma_status_t st = gma_future_wait(m->f, UINT64_MAX, &p);
      fut_seen(m, st, "gma_future_wait at the end");
      observe_futures();
      if (st == GMA_OK) fut_collect(m, p);
    }
    EXPECT_ST(gma_future_release(m->f), GMA_OK, "gma_future_release at the end");
    m->released = true;
    m->f = NULL;
    if (m->accounted) fut_free_slot(m);
  }
  while (F.nlive > (leak_one ? 1 : 0)) free_block(F.nlive - 1, "gma_free at the end");
  while (F.nhost) {
    rd_t none = {0};
    op_host_free(&none);
  }
  sync_all();
  /* Released futures settle (the worker frees what they got), then the
   * counts are exact. */
  for (uint64_t t0 = now_ns(); !keep_futures && futures_in_flight();) {
    observe_futures();
    if (now_ns() - t0 > (uint64_t)SETTLE_MS * 1000000u) FAIL("futures did not complete in %d ms", SETTLE_MS);
    sleep_us(100);
  }
  check_stats();
  gma_stats_t s = stats_now();
  if (!keep_futures) {
    sums_t m = model_sums();
    EXPECT(s.allocated.current == m.dev_bytes && s.requested.current == m.dev_req,
           "at the end allocated %" PRIu64 " requested %" PRIu64 ", model %" PRIu64 " / %" PRIu64,
           s.allocated.current, s.requested.current, m.dev_bytes, m.dev_req);
    EXPECT(s.host_allocated.current == m.fb_bytes && s.fallback_bytes == m.fb_bytes,
           "host memory still allocated at the end: %" PRIu64 " (fallback %" PRIu64 ")",
           s.host_allocated.current, s.fallback_bytes);
  }
  /* Every byte goes back: the last epochs' events complete on the device's
   * own threads, so allow a few rounds. */
  bool must_drain = !keep_futures && !leak_one && !F.orphaned;
  uint64_t t0 = now_ns();
  for (;;) {
    gma_status_t st = gma_empty_cache(F.g);
    EXPECT(st == GMA_OK || (st == GMA_ERR_DEVICE && F.faults), "gma_empty_cache at the end: %s",
           gma_status_name(st));
    s = stats_now();
    /* plan:on: an active plan keeps its arena (and the rest of the arena's
     * segment stays free); a dropped one's goes back at the next mark. */
    bool drained = F.grow_ahead || s.plan_arena_bytes
                       ? s.reserved.current == s.free_bytes + s.plan_arena_bytes &&
                             s.pending_bytes == 0 && s.stream_cached_bytes == 0
                       : s.reserved.current == 0;
    if (!must_drain || (drained && s.host_reserved.current == 0)) break;
    if (now_ns() - t0 > (uint64_t)SETTLE_MS * 1000000u)
      FAIL("memory not returned after everything was freed and synchronized: reserved %" PRIu64
           " (stream cached %" PRIu64 ", pending %" PRIu64 ", free %" PRIu64 ", segments %" PRIu64
           "), host reserved %" PRIu64,
           s.reserved.current, s.stream_cached_bytes, s.pending_bytes, s.free_bytes,
           s.num_segments, s.host_reserved.current);
    sleep_us(200);
  }
  if (must_drain && !F.grow_ahead)
    EXPECT(s.num_segments == (s.plan_arena_bytes ? 1u : 0u), "%" PRIu64 " segments left (plan arena %"
           PRIu64 ")", s.num_segments, s.plan_arena_bytes);
  if (!keep_futures) { /* a plan dropped by gma_empty_cache left the counts as they were */
    sums_t m = model_sums();
    s = stats_now();
    EXPECT(s.allocated.current == m.dev_bytes && s.requested.current == m.dev_req &&
               accounting_holds(&s, m.planned_bytes),
           "after gma_empty_cache at the end: allocated %" PRIu64 " requested %" PRIu64 " (model %"
           PRIu64 " / %" PRIu64 "), reserved %" PRIu64 " = stream cached %" PRIu64 " + pending %"
           PRIu64 " + free %" PRIu64 " + plan arena %" PRIu64 " ?",
           s.allocated.current, s.requested.current, m.dev_bytes, m.dev_req, s.reserved.current,
           s.stream_cached_bytes, s.pending_bytes, s.free_bytes, s.plan_arena_bytes);
  }
  for (int si = 0; si < 3; si++)
    if (F.st[si].live) {
      gma_status_t st = gma_stream_destroy(F.g, F.st[si].h);
      EXPECT(st == GMA_OK || (st == GMA_ERR_DEVICE && F.faults), "gma_stream_destroy at the end: %s",
             gma_status_name(st));
      F.st[si].live = false;
    }
  gma_status_t st = gma_destroy(F.g);
  F.g = NULL;
  if (leak_one && F.nlive && F.live[0].kind == GMA_MEMORY_DEVICE)
    EXPECT_ST(st, GMA_ERR_LEAK, "gma_destroy with a live allocation");
  else if (leak_one && F.nlive)
    EXPECT_ST(st, GMA_ERR_LEAK, "gma_destroy with a live fallback allocation");
  else
    EXPECT_ST(st, GMA_OK, "gma_destroy");
  /* The worker is gone: no pressure callback runs any more. */
  free(F.pcb);
  F.pcb = NULL;
  /* Every callback has run (gma_destroy joined the worker): chains the
   * model had not seen yet have their second request, or none. */
  for (int i = 0; i < MAX_FUT; i++)
    if (F.fut[i].used && F.fut[i].child) chain_adopt(&F.fut[i], true);
  /* Futures may be polled, waited on and given back after the allocator is
   * gone; one that had been served says GMA_ERR_CANCELLED then (its memory
   * went with the allocator) and a wait hands out no pointer. */
  for (int i = 0; i < MAX_FUT; i++)
    if (F.fut[i].used && !F.fut[i].released) {
      mfut_t *m = &F.fut[i];
      gma_status_t fs = gma_future_poll(m->f);
      EXPECT(fs != GMA_PENDING, "a future still pending after gma_destroy");
      EXPECT(fs != GMA_OK, "a future says GMA_OK after gma_destroy freed its memory");
      int outcome = atomic_load(&m->cb_status);
      if (atomic_load(&m->cb_runs) == 1 && (outcome == GMA_OK || outcome == GMA_ERR_CANCELLED))
        EXPECT_ST(fs, GMA_ERR_CANCELLED, "gma_future_poll after gma_destroy");
      void *p = (void *)m;
      gma_status_t ws = gma_future_wait(m->f, 0, &p);
      EXPECT(ws == fs, "gma_future_wait after gma_destroy says %s, poll %s", gma_status_name(ws),
             gma_status_name(fs));
      EXPECT(ws != GMA_ERR_CANCELLED || p == NULL, "a wait after gma_destroy handed out %p", p);
      EXPECT_ST(gma_future_release(m->f), GMA_OK, "gma_future_release after gma_destroy");
    }
  uint64_t done = atomic_load_explicit(&g_kernels_done, memory_order_acquire);
  EXPECT(done == F.kernels_launched, "%" PRIu64 " kernels launched, %" PRIu64 " ran", F.kernels_launched,
         done);
  F.opname = "TRACE";
  trace_check();
  trace_forget();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  memset(&F, 0, sizeof F);
  F.main_thread = pthread_self();
  F.verbose = getenv("FUZZ_GMA_VERBOSE") != NULL;
  atomic_store(&g_kernels_done, 0);
  rd_t r = {data, size, 0};
  F.in = data;
  configure(&r);
  F.opname = "gma_create";
  gma_status_t st = gma_create(&F.cfg, &F.g);
  EXPECT_ST(st, GMA_OK, "gma_create");
#ifdef FUZZ_GMA_AFTER_CREATE
  /* A test hook (e.g. to plant a bug through gma's test-only switches and see
   * the fuzzer catch it): void FUZZ_GMA_AFTER_CREATE(gma_t *). */
  void FUZZ_GMA_AFTER_CREATE(gma_t *);
  FUZZ_GMA_AFTER_CREATE(F.g);
#endif
  if (F.worker && (F.end_mode & 16)) {
    EXPECT_ST(gma_set_pressure_callback(F.g, pressure_cb, NULL), GMA_OK, "gma_set_pressure_callback");
    F.pcb_plain = true;
  } else if (!F.worker) {
    EXPECT_ST(gma_set_pressure_callback(F.g, pressure_cb, NULL), GMA_ERR_UNSUPPORTED,
              "gma_set_pressure_callback without a worker");
  }
  if (F.verbose)
    fprintf(stderr, "fuzz_gma: capacity %" PRIu64 " limit %" PRIu64 " worker %d expandable %d bins %s "
                    "reuse %d fallback %d faults %d (alloc %" PRIu64 ", event %" PRIu64 ") end mode %d\n",
            F.capacity, F.limit, F.worker, F.cfg.expandable_segments, F.cfg.bins_off ? "off" : "on",
            (int)F.cfg.reuse, F.fallback, F.faults, F.cfg.sim_fail_alloc, F.cfg.sim_fail_event,
            F.end_mode);
  open_streams();
  static uint64_t prof_ns[NOPS + 2], prof_n[NOPS + 2];
  bool prof = getenv("FUZZ_GMA_PROFILE") != NULL;
  for (F.opno = 1; F.opno <= MAX_OPS && r.i < r.n; F.opno++) {
    uint64_t t0 = prof ? now_ns() : 0;
    unsigned code = r.i < r.n ? (r.p[r.i] & 63) % NOPS : 0;
    F.hist[F.opno % 16] = r.i;
    run_op(&r);
    uint64_t t1 = prof ? now_ns() : 0;
    check_stats();
    check_stream_stats();
    if (prof) {
      prof_ns[code] += t1 - t0, prof_n[code]++;
      prof_ns[NOPS] += now_ns() - t1, prof_n[NOPS]++;
    }
  }
  uint64_t t_end = prof ? now_ns() : 0;
  finish();
  if (prof) {
    prof_ns[NOPS + 1] += now_ns() - t_end, prof_n[NOPS + 1]++;
    for (int i = 0; i < NOPS + 2; i++)
      if (prof_n[i])
        fprintf(stderr, "  %-14s %6" PRIu64 " x %8.1f us = %8.1f ms\n",
                i < NOPS ? op_names[i] : i == NOPS ? "(checks)" : "(finish)", prof_n[i],
                (double)prof_ns[i] / (double)prof_n[i] / 1e3, (double)prof_ns[i] / 1e6);
  }
  return 0;
}
