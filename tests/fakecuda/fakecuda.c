/* The fake CUDA driver for tests (libgma_fakecuda.so): owns the fake
 * driver's state: its devices and their primary contexts, each thread's
 * context stack and stream capture mode, the bookkeeping of device memory
 * (cuMemAlloc allocations, VMM reservations, physical handles and
 * mappings), the event-to-device table, stream captures and graphs, the
 * per-entry call counters and the armed faults.
 *
 * Each fake GPU is one of gma's simulated devices (runtime/device/sim.c and
 * runtime/base/error.c are compiled into this library, hidden and bound with
 * -Bsymbolic, so these copies never interpose with libgma's). Streams are the
 * sim's stream handles, events the sim's event handles, device pointers the
 * sim's host addresses. What the sim cannot know, the fake keeps: which
 * device an event or a pointer belongs to, how much memory is in use (the
 * fake's own accounting, so cuMemCreate holds memory before it is mapped, as
 * on a GPU), which ranges are mapped and accessible.
 *
 * Faithful where gma depends on it: cuInit first; a current context for the
 * calls that need one; primary contexts refcounted, and reset (every
 * allocation, mapping, reservation, handle, event and stream of the device
 * freed) when the last reference goes, with the context staying current but
 * destroyed (CUDA_ERROR_CONTEXT_IS_DESTROYED) as on a GPU; the real error
 * names and strings; cuEventQuery's CUDA_ERROR_NOT_READY; an event recorded
 * on a stream completes only once the work queued before it on that stream
 * has run on the stream's thread (the sim's marks; it is complete at record
 * time only when the stream is idle, i.e. that work has already run); a
 * device fault (a copy touching memory that is no longer device memory) is
 * sticky: every later call on the device returns CUDA_ERROR_ILLEGAL_ADDRESS
 * until reset; cuMemcpyDtoHAsync into pageable host memory (anything not
 * from cuMemHostAlloc) returns only once the copy completed, into
 * cuMemHostAlloc memory it is asynchronous; cuEventRecord with an event and
 * a stream of different devices returns CUDA_ERROR_INVALID_HANDLE, as
 * documented.
 *
 * Stream capture, as CUDA 13's driver API documents it (fakecuda.h lists
 * the rules and the fake's list of potentially unsafe calls): work queued
 * on a capturing stream (fakecuda_launch kernels, memsets, copies,
 * cuStreamWaitValue32, graph launches) becomes a node of the capture's
 * graph instead of running; an event recorded there is a captured event,
 * and a stream waiting on it joins the capture (fork and join across
 * streams, checked at cuStreamEndCapture: UNJOINED); each thread has a
 * capture mode (cuThreadExchangeStreamCaptureMode) that decides which
 * potentially unsafe calls the captures underway prohibit; a call that
 * breaks a rule gets CUDA's error and invalidates the capture where CUDA
 * does. cuGraphLaunch queues the graph's work, in capture order, as one
 * piece of work on the launch stream, with the device pointers it was
 * captured with. Capture ids are unique for the process.
 *
 * Stricter than a GPU where a GPU's behaviour is undefined (fakecuda.h,
 * FAKECUDA_STRICT_*; GMA_FAKECUDA_STRICT or fakecuda_strict switch the
 * checks, all on by default): the process aborts with a message naming the
 * entry point and the handle or range when
 * - a stream or event handle is not live: destroyed by cuStreamDestroy /
 *   cuEventDestroy or by its primary context's reset, or never created
 *   ("handles"; a destroyed handle whose value a new stream or event got is
 *   live again, as on a GPU, and cannot be told apart);
 * - cuStreamWaitEvent waits on another device's event ("handles": legal in
 *   CUDA but not simulated, so a test relying on it must not pass on an
 *   error code);
 * - cuMemFree or cuMemUnmap gives back device memory that a queued or
 *   running memset/copy of the fake still touches ("pending": every such
 *   copy is on fc_inflight from queueing until it ran). Kernels queued with
 *   fakecuda_launch are opaque and not tracked.
 * Without a check the call returns CUDA_ERROR_INVALID_HANDLE, or (pending)
 * succeeds and the copy later sets the sticky fault. One more check is not
 * about undefined behaviour: a call that breaks a stream capture rule
 * ("capture": it invalidates a capture or gets CUDA_ERROR_CAPTURED_EVENT,
 * _STREAM_CAPTURE_UNSUPPORTED, _ISOLATION, _IMPLICIT, _MERGE, _UNMATCHED or
 * _WRONG_THREAD) aborts too, since gma must never make one; every such call
 * counts in fakecuda_capture_violations either way.
 *
 * cuMemFreeHost synchronizes the device, as a GPU's does: a test that frees
 * pinned memory while one of its streams is held hangs, as on a GPU.
 *
 * Deliberate differences, each documented where it matters:
 * - cuMemFree and cuMemUnmap do not synchronize the device. gma must not rely
 *   on that (device.h: the caller makes sure no work still uses the range);
 *   the "pending" check reports a premature free at the call, and without it
 *   the premature free shows up as a sticky fault instead of being hidden.
 * - The legacy default stream does not implicitly synchronize with other
 *   streams, so code that relies on that is caught too.
 * - cuMemcpyHtoDAsync reads pageable host memory when the stream reaches the
 *   copy (the driver stages it at the call): the buffer must stay valid
 *   until then, stricter than a GPU.
 * - A physical handle can be mapped once at a time; reservations, handles and
 *   mappings belong to one device and live with its primary context; a
 *   stream can wait only on an event of its own device.
 * - Capture: a graph launch runs its whole graph in capture order on the
 *   launch stream (a valid schedule, with less concurrency than a GPU's);
 *   a graph launched on a capturing stream is captured as its nodes, not
 *   as a child graph node; the graph API beyond capture, instantiate,
 *   launch and destroy (adding or editing nodes, updates, uploads, memory
 *   nodes, conditional nodes, cuStreamBeginCaptureToGraph,
 *   cuStreamUpdateCaptureDependencies) is not implemented. Where CUDA does
 *   not say, the fake chooses the strict answer: cuStreamWaitEvent on an
 *   event of an ended capture is CUDA_ERROR_CAPTURED_EVENT (from a capturing
 *   stream, _ISOLATION), cuStreamDestroy of a capturing stream is refused
 *   (_UNSUPPORTED, invalidating), and WRONG_THREAD does not invalidate.
 *
 * Locks, in order: a device's `life` (read: a call uses the device's sim;
 * write: retain/release switch the sim on or off), then `fc.mem_rw` (read: a
 * copy kernel touches device memory; write: memory is added or removed), then
 * `fc.mu` (all bookkeeping), then `fault_mu` (a leaf). `init_mu` is taken
 * alone. Stream threads of a sim run copy kernels (and graph launches),
 * which take mem_rw and mu but never life, so a reset can drain them while
 * holding life. Stream capture adds no lock: its state is under fc.mu, and
 * the sim is asked for a stream's id before mu is taken.
 *
 * Test controls: see fakecuda.h. */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every cu* function cuda.h declares gets default visibility, so the
 * definitions below are exported while the sim and everything else in this
 * library (-fvisibility=hidden) stays private. */
#pragma GCC visibility push(default)
#include <cuda.h>
#pragma GCC visibility pop

#include "device/cuda_entries.h"
#include "device/device.h"
#include "device/sim_cost.h"
#include "fakecuda.h"

#define FC_API __attribute__((visibility("default")))
#define FC_MAX_DEVICES 16
#define FC_CTX_STACK 32 /* contexts one thread may push */
#define FC_DEFAULT_MEM (8ull << 30)
#define FC_DEFAULT_GRANULARITY (2ull << 20)

_Static_assert(sizeof(uintptr_t) == sizeof(CUdeviceptr), "device pointers are host addresses");
_Static_assert(sizeof(uintptr_t) == sizeof(CUmemGenericAllocationHandle), "handles are keys");
_Static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "stream ids are keys");

/* ---------------------------------------------------------------------------
 * Entry points: the list gma uses (cuda_entries.h), the extra ones the GPU
 * tests call, and cuGetProcAddress itself. The X-macro makes the lookup
 * table, the call counters and the fault table from one list.
 * ------------------------------------------------------------------------- */
/* Stream capture and graphs come last (see "Stream capture");
 * cuThreadExchangeStreamCaptureMode is in GMA_CUDA_ENTRIES (gma's runtime
 * calls it), and cuStreamGetCaptureInfo, which gma asks for by its 12.0
 * ABI, is here: nothing else in the fake depends on which list names an
 * entry point, and none may be named by both. */
#define FC_EXTRA_ENTRIES(X)             \
  X(cuDeviceGetName)                    \
  X(cuDeviceTotalMem)                   \
  X(cuCtxSetCurrent)                    \
  X(cuCtxCreate)                        \
  X(cuCtxDestroy)                       \
  X(cuMemsetD32Async)                   \
  X(cuMemcpyDtoHAsync)                  \
  X(cuMemcpyHtoDAsync)                  \
  X(cuStreamWaitValue32)                \
  X(cuStreamQuery)                      \
  X(cuStreamBeginCapture)               \
  X(cuStreamEndCapture)                 \
  X(cuStreamGetCaptureInfo)             \
  X(cuGraphInstantiate)                 \
  X(cuGraphLaunch)                      \
  X(cuGraphExecDestroy)                 \
  X(cuGraphDestroy)                     \
  X(cuStreamIsCapturing)
#define FC_ALL_ENTRIES(X) X(cuGetProcAddress) GMA_CUDA_ENTRIES(X) FC_EXTRA_ENTRIES(X)

enum {
#define FC_ENUM_(name) FC_##name,
  FC_ALL_ENTRIES(FC_ENUM_)
#undef FC_ENUM_
  FC_NUM_ENTRIES
};

/* ---------------------------------------------------------------------------
 * Call counters and faults
 * ------------------------------------------------------------------------- */
/* Calls per entry; relaxed: each increment only needs a unique ticket. */
static _Atomic unsigned long long fc_calls[FC_NUM_ENTRIES];

typedef struct fc_fault {
  int entry;
  unsigned long long at; /* the call number (fc_calls ticket) that fails */
  CUresult result;
} fc_fault_t;

/* Armed faults, one-shot. Invariant: faults_armed == nfaults (the count is
 * read without the lock to keep unarmed calls lock-free). */
static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static fc_fault_t *faults;      /* fault_mu */
static size_t nfaults, capfaults; /* fault_mu */
static _Atomic size_t faults_armed;

/* Counts one call of entry e; true (with *r set) when an armed fault makes
 * this call fail. Any thread; lock-free unless a fault is armed. */
static bool fc_enter(int e, CUresult *r) {
  unsigned long long n = atomic_fetch_add_explicit(&fc_calls[e], 1, memory_order_relaxed) + 1;
  if (atomic_load_explicit(&faults_armed, memory_order_relaxed) == 0) return false;
  bool hit = false;
  pthread_mutex_lock(&fault_mu);
  for (size_t i = 0; i < nfaults; i++) {
    if (faults[i].entry == e && faults[i].at == n) {
      *r = faults[i].result;
      faults[i] = faults[--nfaults];
      atomic_store_explicit(&faults_armed, nfaults, memory_order_relaxed);
      hit = true;
      break;
    }
  }
  pthread_mutex_unlock(&fault_mu);
  return hit;
}

/* ---------------------------------------------------------------------------
 * Strictness: misuse whose outcome on a GPU is undefined stops the process
 * (fakecuda.h: FAKECUDA_STRICT_*), so a test cannot pass on an error code a
 * real driver need not return.
 * ------------------------------------------------------------------------- */
/* The checks in force; set when the library loads (GMA_FAKECUDA_STRICT) and
 * by fakecuda_strict. Relaxed: a test changes it between its own calls. */
static _Atomic unsigned fc_strict_flags = FAKECUDA_STRICT_ALL;

/* Reads GMA_FAKECUDA_STRICT (fakecuda.h). A malformed value is reported and
 * leaves every check on: a typo must not quietly make the fake forgiving. */
__attribute__((constructor)) static void fc_strict_from_env(void) {
  const char *e = getenv("GMA_FAKECUDA_STRICT");
  if (!e || !*e || strcmp(e, "1") == 0 || strcmp(e, "all") == 0) return;
  if (strcmp(e, "0") == 0 || strcmp(e, "none") == 0) {
    atomic_store_explicit(&fc_strict_flags, 0, memory_order_relaxed);
    return;
  }
  unsigned flags = 0;
  for (const char *p = e; *p;) {
    size_t n = strcspn(p, ",");
    if (n == 7 && strncmp(p, "handles", n) == 0) {
      flags |= FAKECUDA_STRICT_HANDLES;
    } else if (n == 7 && strncmp(p, "pending", n) == 0) {
      flags |= FAKECUDA_STRICT_PENDING;
    } else if (n == 7 && strncmp(p, "capture", n) == 0) {
      flags |= FAKECUDA_STRICT_CAPTURE;
    } else {
      fprintf(stderr,
              "fakecuda: GMA_FAKECUDA_STRICT=%s: expected all, none, or a list of handles, "
              "pending and capture; every check stays on\n",
              e);
      return;
    }
    p += n;
    if (*p) p++;
  }
  atomic_store_explicit(&fc_strict_flags, flags, memory_order_relaxed);
}

static bool fc_strict(unsigned check) {
  return (atomic_load_explicit(&fc_strict_flags, memory_order_relaxed) & check) != 0;
}

/* Stops the process on a misuse: the message (entry point first), then why,
 * then abort(), so the test fails where the misuse happened, with its stack. */
__attribute__((noreturn, format(printf, 2, 3))) static void fc_misuse(const char *check,
                                                                       const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("fakecuda: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr,
          "\nfakecuda: undefined on a GPU, so the fake driver aborts (check \"%s\"; "
          "GMA_FAKECUDA_STRICT or fakecuda_strict turn it off for a test that expects the "
          "error code)\n",
          check);
  fflush(stderr);
  abort();
}

/* The answer to a stream or event handle that is not live: abort when
 * strict, else CUDA_ERROR_INVALID_HANDLE. kind: "stream" or "event". */
static CUresult bad_handle(const char *entry, const char *kind, const char *destroyer,
                           const void *h) {
  if (fc_strict(FAKECUDA_STRICT_HANDLES))
    fc_misuse("handles",
              "%s: %s %p is not a live %s of any device (destroyed by %s or by its primary "
              "context's reset, or never created)",
              entry, kind, h, kind, destroyer);
  return CUDA_ERROR_INVALID_HANDLE;
}

static CUresult bad_stream(const char *entry, CUstream s) {
  return bad_handle(entry, "stream", "cuStreamDestroy", (const void *)s);
}

static CUresult bad_event(const char *entry, CUevent ev) {
  return bad_handle(entry, "event", "cuEventDestroy", (const void *)ev);
}

/* ---------------------------------------------------------------------------
 * Sorted vectors: the bookkeeping tables. Every element starts with a
 * uintptr_t key; keys are unique and ascending. Guarded by their owner's lock.
 * ------------------------------------------------------------------------- */
typedef struct fc_vec {
  unsigned char *data;
  size_t n, cap, elem;
} fc_vec_t;

static void *vec_at(const fc_vec_t *v, size_t i) { return v->data + i * v->elem; }

static uintptr_t vec_key(const fc_vec_t *v, size_t i) {
  uintptr_t k;
  memcpy(&k, vec_at(v, i), sizeof k);
  return k;
}

/* The first index whose key is greater than key. */
static size_t vec_upper(const fc_vec_t *v, uintptr_t key) {
  size_t lo = 0, hi = v->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (vec_key(v, mid) <= key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

/* The index of key, or SIZE_MAX. */
static size_t vec_find(const fc_vec_t *v, uintptr_t key) {
  size_t i = vec_upper(v, key);
  return i > 0 && vec_key(v, i - 1) == key ? i - 1 : SIZE_MAX;
}

/* Inserts a copy of elem (whose key is not present); false when out of host memory. */
static bool vec_insert(fc_vec_t *v, const void *elem) {
  if (v->n == v->cap) {
    size_t ncap = v->cap ? v->cap * 2 : 16;
    unsigned char *nd = realloc(v->data, ncap * v->elem);
    if (!nd) return false;
    v->data = nd;
    v->cap = ncap;
  }
  uintptr_t key;
  memcpy(&key, elem, sizeof key);
  size_t i = vec_upper(v, key);
  memmove(vec_at(v, i + 1), vec_at(v, i), (v->n - i) * v->elem);
  memcpy(vec_at(v, i), elem, v->elem);
  v->n++;
  return true;
}

static void vec_remove(fc_vec_t *v, size_t i) {
  memmove(vec_at(v, i), vec_at(v, i + 1), (v->n - i - 1) * v->elem);
  v->n--;
}

/* ---------------------------------------------------------------------------
 * State
 * ------------------------------------------------------------------------- */
/* A context: each device's primary context (in fc_device_t), or one made by
 * cuCtxCreate (malloc'd, in fc.created until cuCtxDestroy). A created
 * context shares its device's simulated memory and holds a reference on the
 * primary context, so the device stays active while it lives; streams and
 * events remember the context they were made in (fc.stream_ctx, the event
 * table), and an event recorded on a stream of another context is misuse. */
struct CUctx_st {
  int ordinal;  /* immutable after cuInit (primary) or creation */
  bool created; /* made by cuCtxCreate */
};

typedef struct fc_device {
  struct CUctx_st ctx; /* immutable after cuInit */
  uint64_t capacity;   /* immutable after cuInit */
  /* sim and active are written with life held for writing (and fc.mu), read
   * with life held for reading (or fc.mu). Invariant: active == (refs > 0)
   * and sim != NULL iff active, outside a retain/release holding life. */
  pthread_rwlock_t life;
  gma__device_t *sim;
  bool active;
  /* A device fault (CUresult, 0 = none): set once by a copy kernel that
   * found its memory gone, cleared by the reset. Read by every call. */
  _Atomic int sticky;
  unsigned refs; /* fc.mu: primary context references */
  uint64_t used; /* fc.mu: bytes held by cuMemAlloc and cuMemCreate; <= capacity */
  /* fc.mu: how many times the device was reset; an executable graph made
   * before the last reset died with its context, as on a GPU. */
  uint64_t epoch;
} fc_device_t;

/* A stream-ordered memset or copy of the fake (see copy_launch), queued as a
 * kernel of its own or as one op of a graph launch. */
typedef enum fc_copy_kind { FC_MEMSET32, FC_DTOH, FC_HTOD } fc_copy_kind_t;

typedef struct fc_copy {
  fc_copy_kind_t kind;
  fc_device_t *dev;
  uintptr_t dptr;
  void *host;
  uint64_t bytes;
  uint32_t value;
  CUstream stream;                /* for messages only */
  const char *entry;              /* the entry point that queued it */
  struct fc_copy *prev, *next;    /* fc.mu: on fc_inflight while queued or running */
} fc_copy_t;

/* cuStreamWaitValue32's wait: the stream polls a word of pinned memory. */
typedef struct fc_wait_value {
  volatile uint32_t *word;
  uint32_t value;
  unsigned op; /* CU_STREAM_WAIT_VALUE_GEQ / EQ / AND / NOR */
} fc_wait_value_t;

/* One piece of stream work, as a capture records it and a graph launch
 * replays it: a kernel of fakecuda_launch, a memset or copy, or a wait on a
 * value. Device pointers stay as recorded: a replay touches whatever memory
 * is at that address then, as a real graph does. */
/* cuStreamWriteValue64's write: a 64-bit word of pinned memory. */
typedef struct fc_write_value {
  uint64_t *word;
  uint64_t value;
} fc_write_value_t;

typedef enum fc_op_kind { FC_OP_KERNEL, FC_OP_COPY, FC_OP_WAIT_VALUE, FC_OP_WRITE_VALUE } fc_op_kind_t;

typedef struct fc_op {
  fc_op_kind_t kind;
  union {
    struct {
      void (*fn)(void *);
      void *arg;
    } kernel;
    fc_copy_t copy;       /* prev/next unused until a launch queues a copy of it */
    fc_wait_value_t wait;
    fc_write_value_t write;
  } u;
} fc_op_t;

/* A node of a captured graph: one op and the nodes it depends on (edges
 * point backwards, so capture order is a topological order). The CUgraphNode
 * handle is its address. Owned by its graph. */
struct CUgraphNode_st {
  fc_op_t op;
  CUgraphNode *deps;
  size_t ndeps;
  bool mark; /* fc.mu: scratch of cuStreamEndCapture's reachability walk */
};

/* A set of nodes: what the next node captured on a stream depends on, or
 * what a captured event stands for. */
typedef struct fc_nodeset {
  CUgraphNode *v;
  size_t n, cap;
} fc_nodeset_t;

/* A physical allocation of cuMemCreate. Its bytes count in its device's used
 * from create until it is both released and unmapped. */
typedef struct fc_handle {
  int dev;
  uint64_t size;
  uintptr_t mapped_at; /* 0: not mapped */
  bool released;       /* cuMemRelease done; freed when unmapped */
} fc_handle_t;

/* Device memory: a cuMemAlloc allocation or one cuMemMap mapping. */
typedef struct fc_range {
  uintptr_t addr; /* key */
  uint64_t size;
  int dev;
  bool map;            /* made by cuMemMap */
  bool access;         /* map: cuMemSetAccess made it read-write for its device */
  fc_handle_t *h;      /* map: the handle mapped here */
  uint64_t simh;       /* map: the sim's handle of the mapping's memory */
} fc_range_t;

/* A VMM reservation. The sim's reservation may be larger, when the asked
 * alignment exceeds the sim's own. */
typedef struct fc_resv {
  uintptr_t addr; /* key */
  uint64_t size;
  int dev;
  uintptr_t sim_addr;
  uint64_t sim_size;
} fc_resv_t;

typedef struct fc_handle_entry {
  uintptr_t id; /* key: the CUmemGenericAllocationHandle value */
  fc_handle_t *h;
} fc_handle_entry_t;

typedef struct fc_event_entry {
  uintptr_t ev; /* key: the sim's event handle */
  int dev;
  CUcontext ctx; /* the context current at cuEventCreate */
  /* A captured event (last recorded on a capturing stream): the capture's
   * id (0: not captured) and the nodes it stands for. */
  uint64_t cap_id;
  fc_nodeset_t set;
} fc_event_entry_t;

/* A stream made while a created context was current (primary: no entry). */
typedef struct fc_stream_ctx {
  uintptr_t stream; /* key */
  CUcontext ctx;
} fc_stream_ctx_t;

/* A key alone, with the device it belongs to: a non-blocking stream (by
 * stream id), a graph or an executable graph (by address). */
typedef struct fc_stream_key {
  uintptr_t key;
  int dev;
} fc_stream_key_t;

/* A capturing stream, by its stream id (the sim's ids are never reused, so
 * a recycled handle value is another key). rec is heap-allocated so that
 * pointers to it survive the table's inserts. */
typedef struct fc_cap_stream_entry {
  uintptr_t sid; /* key */
  struct fc_cap_stream *rec;
} fc_cap_stream_entry_t;

#define FC_MAX_CREATED 64

static struct {
  pthread_mutex_t init_mu; /* serializes cuInit */
  /* Release store once everything below marked "immutable" is set; every
   * entry point's acquire load (fc_ready) pairs with it. */
  atomic_bool initialized;
  int ndev;      /* immutable after cuInit */
  uint64_t gran; /* immutable after cuInit: VMM granularity */
  uint64_t sim_gran; /* immutable after cuInit: the sim's granularity (divides gran) */
  bool vmm;      /* immutable after cuInit: the sim has vm ops */
  bool vmm_rdma, vmm_posix_fd; /* immutable after cuInit: GMA_FAKECUDA_VMM_FEATURES */
  bool vmm_off;  /* immutable after cuInit: GMA_FAKECUDA_VMM_FEATURES=off */
  bool memops;   /* immutable after cuInit: 64-bit stream memory operations
                    (GMA_FAKECUDA_STREAM_MEM_OPS) */
  /* immutable after cuInit: GMA_FAKECUDA_COSTS, the simulated device's cost
   * preset (NULL: none) and its sim_costs value */
  const gma__sim_costs_t *costs;
  int costs_preset;
  /* mu: what the last successful cuMemCreate asked for (fakecuda_last_create) */
  unsigned last_create_flags;
  fc_device_t dev[FC_MAX_DEVICES];
  pthread_rwlock_t mem_rw; /* writer-preferring: copy kernels never starve a free */
  pthread_mutex_t mu;
  fc_vec_t ranges;   /* mu: fc_range_t by address, never overlapping */
  fc_vec_t resv;     /* mu: fc_resv_t by address */
  fc_vec_t handles;  /* mu: fc_handle_entry_t by id */
  fc_vec_t events;   /* mu: fc_event_entry_t by event */
  fc_vec_t stream_ctx; /* mu: fc_stream_ctx_t by stream, streams of created contexts */
  CUcontext created[FC_MAX_CREATED]; /* mu: live contexts of cuCtxCreate */
  uintptr_t next_handle; /* mu */
  /* Stream capture (see "Stream capture: state and rules"), all under mu. */
  fc_vec_t nonblocking;  /* fc_stream_key_t by stream id: streams made with CU_STREAM_NON_BLOCKING */
  fc_vec_t cap_streams;  /* fc_cap_stream_entry_t by stream id: the streams capturing */
  fc_vec_t graphs;       /* fc_stream_key_t by address: graphs handed out by cuStreamEndCapture */
  fc_vec_t execs;        /* fc_stream_key_t by address: live executable graphs */
  struct fc_capture *captures; /* the captures begun and not ended */
  uint64_t next_capture_id;
} fc = {
    .init_mu = PTHREAD_MUTEX_INITIALIZER,
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .ranges = {NULL, 0, 0, sizeof(fc_range_t)},
    .resv = {NULL, 0, 0, sizeof(fc_resv_t)},
    .handles = {NULL, 0, 0, sizeof(fc_handle_entry_t)},
    .events = {NULL, 0, 0, sizeof(fc_event_entry_t)},
    .stream_ctx = {NULL, 0, 0, sizeof(fc_stream_ctx_t)},
    .next_handle = 0x100001,
    .nonblocking = {NULL, 0, 0, sizeof(fc_stream_key_t)},
    .cap_streams = {NULL, 0, 0, sizeof(fc_cap_stream_entry_t)},
    .graphs = {NULL, 0, 0, sizeof(fc_stream_key_t)},
    .execs = {NULL, 0, 0, sizeof(fc_stream_key_t)},
    .next_capture_id = 1,
};

/* The calling thread's context stack; only its thread touches it. */
static _Thread_local struct {
  CUcontext s[FC_CTX_STACK];
  int n;
} tls_ctx;

static bool fc_ready(void) { return atomic_load_explicit(&fc.initialized, memory_order_acquire); }

/* Counts the call, applies an armed fault, then requires cuInit. */
/* The cost preset's price of entry e, taken on the calling thread
 * (GMA_FAKECUDA_COSTS): the driver calls gma makes, each at its base price;
 * the sized ones (fc_price_bytes) are charged where their size is known. */
static gma__sim_cost_op_t fc_cost_op(int e) {
  switch (e) {
    case FC_cuMemFree: return GMA__SIM_COST_MEM_FREE;
    case FC_cuMemGetInfo: return GMA__SIM_COST_MEM_INFO;
    case FC_cuMemAddressReserve: return GMA__SIM_COST_VM_RESERVE;
    case FC_cuMemAddressFree: return GMA__SIM_COST_VM_RELEASE;
    case FC_cuMemFreeHost: return GMA__SIM_COST_HOST_FREE;
    case FC_cuEventCreate: return GMA__SIM_COST_EVENT_CREATE;
    case FC_cuEventDestroy: return GMA__SIM_COST_EVENT_DESTROY;
    case FC_cuEventRecord: return GMA__SIM_COST_EVENT_RECORD;
    case FC_cuEventQuery: return GMA__SIM_COST_EVENT_QUERY;
    case FC_cuEventSynchronize: return GMA__SIM_COST_EVENT_SYNCHRONIZE;
    case FC_cuStreamWaitEvent: return GMA__SIM_COST_STREAM_WAIT_EVENT;
    case FC_cuStreamCreate: return GMA__SIM_COST_STREAM_CREATE;
    case FC_cuStreamDestroy: return GMA__SIM_COST_STREAM_DESTROY;
    case FC_cuStreamGetId: return GMA__SIM_COST_STREAM_ID;
    case FC_cuStreamGetCaptureInfo:
    case FC_cuStreamIsCapturing: return GMA__SIM_COST_STREAM_CAPTURE;
    case FC_cuStreamQuery: return GMA__SIM_COST_STREAM_QUERY;
    case FC_cuStreamSynchronize: return GMA__SIM_COST_STREAM_SYNCHRONIZE;
    case FC_cuStreamWriteValue64: return GMA__SIM_COST_STREAM_WRITE_VALUE;
    case FC_cuCtxSynchronize: return GMA__SIM_COST_DEVICE_SYNCHRONIZE;
    case FC_cuCtxGetCurrent:
    case FC_cuCtxSetCurrent:
    case FC_cuCtxPushCurrent:
    case FC_cuCtxPopCurrent: return GMA__SIM_COST_CTX_CURRENT;
    default: return GMA__SIM_COST_NOPS;
  }
}

static void fc_price(int e) {
  gma__sim_cost_op_t op = fc.costs ? fc_cost_op(e) : GMA__SIM_COST_NOPS;
  if (op != GMA__SIM_COST_NOPS) gma__sim_cost_pay(fc.costs, op, 0);
}

static void fc_price_bytes(gma__sim_cost_op_t op, uint64_t bytes) {
  if (fc.costs) gma__sim_cost_pay(fc.costs, op, bytes);
}

#define FC_BEGIN(name)                                     \
  do {                                                     \
    CUresult fr_;                                          \
    if (fc_enter(FC_##name, &fr_)) return fr_;             \
    if (!fc_ready()) return CUDA_ERROR_NOT_INITIALIZED;    \
    fc_price(FC_##name);                                   \
  } while (0)

/* A potentially unsafe call during stream capture (fakecuda.h): refused,
 * doing nothing else, where the calling thread's capture mode prohibits it
 * (capture_unsafe). */
static CUresult capture_unsafe(const char *entry);
#define FC_UNSAFE(name)                                    \
  do {                                                     \
    CUresult cu_ = capture_unsafe(#name);                  \
    if (cu_ != CUDA_SUCCESS) return cu_;                   \
  } while (0)

/* Maps a sim status to a CUresult. The sim's GMA_ERR_DEVICE means host
 * resources ran out (threads, memory), which CUDA reports as out of memory;
 * invalid is the code for a handle or value the sim did not know. */
static CUresult from_sim(gma_status_t st, CUresult invalid) {
  switch (st) {
    case GMA_OK:
      return CUDA_SUCCESS;
    case GMA_ERR_OOM:
    case GMA_ERR_DEVICE:
      return CUDA_ERROR_OUT_OF_MEMORY;
    case GMA_ERR_INVALID_ARGUMENT:
      return invalid;
    case GMA_ERR_INVALID_SIZE:
      return CUDA_ERROR_INVALID_VALUE;
    default:
      return CUDA_ERROR_UNKNOWN;
  }
}

static bool is_default_stream(CUstream s);

static fc_device_t *ctx_device(CUcontext ctx) {
  if (!ctx) return NULL;
  for (int i = 0; i < fc.ndev; i++)
    if (ctx == &fc.dev[i].ctx) return &fc.dev[i];
  pthread_mutex_lock(&fc.mu);
  fc_device_t *d = NULL;
  for (int i = 0; i < FC_MAX_CREATED && !d; i++)
    if (fc.created[i] == ctx) d = &fc.dev[ctx->ordinal];
  pthread_mutex_unlock(&fc.mu);
  return d;
}

/* The context current on this thread (NULL: none). */
static CUcontext ctx_current(void) { return tls_ctx.n ? tls_ctx.s[tls_ctx.n - 1] : NULL; }

/* The context stream s was made in: the current one for the default
 * streams, else its entry in fc.stream_ctx, else its device's primary. */
static CUcontext stream_ctx_of(CUstream s, const fc_device_t *d) {
  if (is_default_stream(s)) return ctx_current();
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.stream_ctx, (uintptr_t)s);
  CUcontext c = i == SIZE_MAX ? NULL : ((fc_stream_ctx_t *)vec_at(&fc.stream_ctx, i))->ctx;
  pthread_mutex_unlock(&fc.mu);
  return c ? c : (CUcontext)&d->ctx;
}

/* The context event ev was made in (fc.mu not held). */
static CUcontext event_ctx_of(CUevent ev, const fc_device_t *d) {
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.events, (uintptr_t)ev);
  CUcontext c = i == SIZE_MAX ? NULL : ((fc_event_entry_t *)vec_at(&fc.events, i))->ctx;
  pthread_mutex_unlock(&fc.mu);
  return c ? c : (CUcontext)&d->ctx;
}

/* Takes d->life for reading and checks the device can be used; on success the
 * caller releases it with dev_exit. */
static CUresult dev_enter(fc_device_t *d, CUresult inactive) {
  pthread_rwlock_rdlock(&d->life);
  CUresult r = !d->active ? inactive : (CUresult)atomic_load(&d->sticky);
  if (r != CUDA_SUCCESS) pthread_rwlock_unlock(&d->life);
  return r;
}

static void dev_exit(fc_device_t *d) { pthread_rwlock_unlock(&d->life); }

/* The current context's device, entered (see dev_enter). */
static CUresult ctx_enter(fc_device_t **out) {
  if (tls_ctx.n == 0) return CUDA_ERROR_INVALID_CONTEXT;
  fc_device_t *d = ctx_device(tls_ctx.s[tls_ctx.n - 1]);
  CUresult r = dev_enter(d, CUDA_ERROR_CONTEXT_IS_DESTROYED);
  if (r == CUDA_SUCCESS) *out = d;
  return r;
}

static bool is_default_stream(CUstream s) {
  return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* The device of stream s, entered: the current context's for the default
 * streams, else the device whose sim knows the handle (the sim checks handles
 * by address range, never dereferencing them, so any value is safe). A
 * handle no device knows is misuse (bad_stream); entry names the caller. */
static CUresult stream_enter(const char *entry, CUstream s, fc_device_t **out) {
  if (is_default_stream(s)) return ctx_enter(out);
  for (int i = 0; i < fc.ndev; i++) {
    fc_device_t *d = &fc.dev[i];
    pthread_rwlock_rdlock(&d->life);
    uint64_t id;
    if (d->active && d->sim->ops->stream_id(d->sim, (gma_stream_t)s, &id) == GMA_OK) {
      /* The stream's device: a sticky fault there is this call's answer, as
       * on a GPU (it used to read as "not this device", so a stream whose
       * device faulted just before the call got CUDA_ERROR_INVALID_HANDLE:
       * a flaky fakecuda_driver under TSan's timing). */
      CUresult sticky = (CUresult)atomic_load(&d->sticky);
      if (sticky != CUDA_SUCCESS) {
        pthread_rwlock_unlock(&d->life);
        return sticky;
      }
      *out = d;
      return CUDA_SUCCESS;
    }
    pthread_rwlock_unlock(&d->life);
  }
  return bad_stream(entry, s);
}

/* The device of event ev, entered. The table is read twice because life must
 * be taken before mu: a reset in between purges the entry, and then the
 * handle is invalid. A handle not in the table is misuse (bad_event). */
static CUresult event_enter(const char *entry, CUevent ev, fc_device_t **out) {
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.events, (uintptr_t)ev);
  int di = i == SIZE_MAX ? -1 : ((fc_event_entry_t *)vec_at(&fc.events, i))->dev;
  pthread_mutex_unlock(&fc.mu);
  if (di < 0) return bad_event(entry, ev);
  fc_device_t *d = &fc.dev[di];
  CUresult r = dev_enter(d, CUDA_ERROR_INVALID_HANDLE);
  if (r == CUDA_ERROR_INVALID_HANDLE) return bad_event(entry, ev); /* reset meanwhile */
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&fc.mu);
  i = vec_find(&fc.events, (uintptr_t)ev);
  bool same = i != SIZE_MAX && ((fc_event_entry_t *)vec_at(&fc.events, i))->dev == di;
  pthread_mutex_unlock(&fc.mu);
  if (!same) {
    dev_exit(d);
    return bad_event(entry, ev); /* destroyed meanwhile: a race the caller lost */
  }
  *out = d;
  return CUDA_SUCCESS;
}

/* True when s is a live stream of a device other than d (whose life the
 * caller holds for reading; another device's life is taken for reading
 * only, which cannot deadlock with a retain/release, which write-lock only
 * their own device's). */
static bool stream_elsewhere(const fc_device_t *d, CUstream s) {
  for (int i = 0; i < fc.ndev; i++) {
    fc_device_t *o = &fc.dev[i];
    if (o == d) continue;
    pthread_rwlock_rdlock(&o->life);
    uint64_t id;
    bool live = o->active && o->sim->ops->stream_id(o->sim, (gma_stream_t)s, &id) == GMA_OK;
    pthread_rwlock_unlock(&o->life);
    if (live) return true;
  }
  return false;
}

/* Checks that stream s may be used with an event of the entered device d: a
 * default stream needs d's context current, any other must be d's. A live
 * stream of another device gets CUDA_ERROR_INVALID_HANDLE, as the driver
 * documents for cuEventRecord (event and stream of one context), unless
 * cross_device_is_legal (cuStreamWaitEvent, where CUDA allows it and the
 * fake cannot simulate it: misuse of the fake, an abort when strict); a
 * stream no device knows is misuse (bad_stream). */
static CUresult stream_on(const char *entry, fc_device_t *d, CUstream s,
                          bool cross_device_is_legal) {
  bool other;
  if (is_default_stream(s)) {
    if (tls_ctx.n == 0) return CUDA_ERROR_INVALID_CONTEXT;
    other = ctx_device(tls_ctx.s[tls_ctx.n - 1]) != d;
  } else {
    uint64_t id;
    if (d->sim->ops->stream_id(d->sim, (gma_stream_t)s, &id) == GMA_OK) return CUDA_SUCCESS;
    if (!stream_elsewhere(d, s)) return bad_stream(entry, s);
    other = true;
  }
  if (!other) return CUDA_SUCCESS;
  if (cross_device_is_legal && fc_strict(FAKECUDA_STRICT_HANDLES))
    fc_misuse("handles",
              "%s: stream %p and the event belong to different devices; CUDA allows this, the "
              "fake driver does not simulate it (a test that needs it cannot run on the fake)",
              entry, (void *)s);
  return CUDA_ERROR_INVALID_HANDLE;
}

/* The device-memory check of a copy: [p, p + n) lies in one cuMemAlloc
 * allocation, or in consecutive mappings all made accessible, of device di.
 * Caller holds fc.mu. */
static CUresult range_check(uintptr_t p, uint64_t n, int di) {
  if (n == 0) return CUDA_SUCCESS;
  if (p + n < p) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t end = p + n;
  size_t i = vec_upper(&fc.ranges, p);
  if (i == 0) return CUDA_ERROR_INVALID_VALUE;
  i--;
  for (uintptr_t cur = p;;) {
    const fc_range_t *r = vec_at(&fc.ranges, i);
    if (r->addr > cur || cur - r->addr >= r->size || r->dev != di) return CUDA_ERROR_INVALID_VALUE;
    if (r->map && !r->access) return CUDA_ERROR_ILLEGAL_ADDRESS;
    uintptr_t rend = r->addr + r->size;
    if (end <= rend) return CUDA_SUCCESS;
    /* Only mappings continue into a neighbour (a growable segment). */
    if (!r->map || ++i == fc.ranges.n) return CUDA_ERROR_INVALID_VALUE;
    if (!((const fc_range_t *)vec_at(&fc.ranges, i))->map) return CUDA_ERROR_INVALID_VALUE;
    cur = rend;
  }
}

/* ---------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------- */
/* The codes the fake can return, and a few more a caller may pass, with the
 * driver's own strings. */
#define FC_ERRORS(E)                                                                       \
  E(CUDA_SUCCESS, "no error")                                                              \
  E(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                          \
  E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                             \
  E(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                    \
  E(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                      \
  E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")                              \
  E(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable")    \
  E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                            \
  E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                   \
  E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                  \
  E(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                              \
  E(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed")                          \
  E(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                                  \
  E(CUDA_ERROR_NOT_MAPPED, "resource not mapped")                                          \
  E(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered")                   \
  E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS")   \
  E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                  \
  E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")    \
  E(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                        \
  E(CUDA_ERROR_NOT_READY, "device not ready")                                              \
  E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")                \
  E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")         \
  E(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")                  \
  E(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE,                                                     \
    "cannot set while device is active in this process")                                   \
  E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                               \
  E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                                \
  E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                   \
  E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                   \
  E(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized")                             \
  E(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,                                                     \
    "system has unsupported display driver / cuda driver combination")                     \
  E(CUDA_ERROR_TIMEOUT, "wait operation timed out")                                        \
  E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing") \
  E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,                                                 \
    "operation failed due to a previous error during capture")                             \
  E(CUDA_ERROR_STREAM_CAPTURE_MERGE,                                                       \
    "operation would result in a merge of separate capture sequences")                     \
  E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began") \
  E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work")              \
  E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,                                                   \
    "dependency created on uncaptured work in another stream")                             \
  E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,                                                    \
    "operation would make the legacy stream depend on a capturing blocking stream")        \
  E(CUDA_ERROR_CAPTURED_EVENT,                                                             \
    "operation not permitted on an event last recorded in a capturing stream")             \
  E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,                                                \
    "attempt to terminate a thread-local capture sequence from another thread")            \
  E(CUDA_ERROR_UNKNOWN, "unknown error")

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
  CUresult fr;
  if (fc_enter(FC_cuGetErrorName, &fr)) return fr;
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define FC_ERR_NAME_(code, text) \
  case code:                     \
    *pStr = #code;               \
    return CUDA_SUCCESS;
    FC_ERRORS(FC_ERR_NAME_)
#undef FC_ERR_NAME_
    default:
      break;
  }
  *pStr = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
  CUresult fr;
  if (fc_enter(FC_cuGetErrorString, &fr)) return fr;
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define FC_ERR_TEXT_(code, text) \
  case code:                     \
    *pStr = text;                \
    return CUDA_SUCCESS;
    FC_ERRORS(FC_ERR_TEXT_)
#undef FC_ERR_TEXT_
    default:
      break;
  }
  *pStr = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

/* The name of a code FC_ERRORS lists, for messages. */
static const char *err_name(CUresult r) {
  const char *s = NULL;
  switch (r) {
#define FC_ERR_STR_(code, text) \
  case code:                    \
    s = #code;                  \
    break;
    FC_ERRORS(FC_ERR_STR_)
#undef FC_ERR_STR_
    default:
      s = "an error";
  }
  return s;
}

/* ---------------------------------------------------------------------------
 * Stream capture: state and rules
 *
 * A capture (fc_capture_t) is begun on one stream (its origin) and grows
 * into a graph: the streams taking part (the origin, and each stream that
 * waited on one of its captured events) are in fc.cap_streams, each with the
 * set of nodes its next captured work depends on. Work queued on such a
 * stream becomes a node of the graph and does not run. An event recorded on
 * it becomes a captured event (it stands for the stream's set), and a stream
 * waiting on that event joins the capture. cuStreamEndCapture on the origin
 * hands the graph out and ends the capture for every stream of it.
 *
 * The rules (cuda.h: cuStreamBeginCapture, cuThreadExchangeStreamCaptureMode,
 * cuStreamEndCapture, cuStreamIsCapturing, cuStreamGetCaptureInfo; the CUDA
 * programming guide on prohibited and unhandled operations): a call that
 * breaks one returns its error and, where CUDA says so, invalidates the
 * capture. Such a call counts in fc_capture_violations, and with the
 * "capture" check on it aborts the process (capture_violation): gma must
 * never make one. Everything here is under fc.mu; fc_live_captures lets the
 * calls that only need "no capture anywhere" skip the lock.
 * ------------------------------------------------------------------------- */
typedef struct fc_capture {
  uint64_t id;             /* unique over the process lifetime, from 1 */
  int dev;
  uint64_t origin;         /* the stream id of the stream that began it */
  CUstream origin_handle;  /* for messages */
  CUstreamCaptureMode mode;
  uint64_t thread;         /* thread_serial() of the thread that began it */
  const char *invalidated_by; /* NULL while valid; else the entry point that broke it */
  CUgraph graph;
  struct fc_capture *next;
} fc_capture_t;

/* A stream taking part in a capture. */
typedef struct fc_cap_stream {
  uint64_t sid;
  CUstream handle; /* as the call that made it capture named it; for messages */
  int dev;
  bool blocking;   /* not made with CU_STREAM_NON_BLOCKING */
  fc_capture_t *cap;
  fc_nodeset_t deps;      /* what its next captured node depends on */
  CUgraphEdgeData *edges; /* cuStreamGetCaptureInfo's edge data (all default) */
  size_t edges_cap;
} fc_cap_stream_t;

struct CUgraph_st {
  int dev;
  CUgraphNode *nodes; /* in capture order */
  size_t n, cap;
};

/* An executable graph: its graph's ops in capture order (a valid schedule:
 * every node comes after what it depends on), copied, so the graph may be
 * destroyed at once. */
struct CUgraphExec_st {
  int dev;
  uint64_t epoch; /* its device's epoch at instantiation */
  fc_op_t *ops;
  size_t n;
};

/* Calls that broke a capture rule (fakecuda_capture_violations). */
static _Atomic unsigned long long fc_capture_violations_n;
/* Captures begun and not ended: written under fc.mu; read without it only to
 * skip the capture checks when it is 0 (a capture begun by another thread
 * concurrently with a call is a race of the caller's either way). */
static _Atomic unsigned fc_live_captures;
static _Atomic uint64_t fc_next_thread_serial = 1;

/* The calling thread's capture interaction mode (CU_STREAM_CAPTURE_MODE_GLOBAL,
 * 0, by default) and its serial number (0: not assigned yet); only its
 * thread touches them. */
static _Thread_local CUstreamCaptureMode tls_capture_mode;
static _Thread_local uint64_t tls_thread_serial;

/* A number for the calling thread, never reused, so that a capture's
 * beginning thread is told apart from a later thread at the same address. */
static uint64_t thread_serial(void) {
  if (tls_thread_serial == 0)
    tls_thread_serial = atomic_fetch_add_explicit(&fc_next_thread_serial, 1, memory_order_relaxed);
  return tls_thread_serial;
}

static const char *mode_name(CUstreamCaptureMode m) {
  switch (m) {
    case CU_STREAM_CAPTURE_MODE_GLOBAL: return "GLOBAL";
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: return "THREAD_LOCAL";
    case CU_STREAM_CAPTURE_MODE_RELAXED: return "RELAXED";
    default: return "unknown";
  }
}

/* The legacy default stream, as the non-per-thread entry points read it. */
static bool is_legacy(CUstream s) { return s == NULL || s == CU_STREAM_LEGACY; }

/* How a message names the legacy stream s. */
static const char *legacy_name(CUstream s) { return s ? "CU_STREAM_LEGACY" : "NULL"; }

static bool captures_live(void) {
  return atomic_load_explicit(&fc_live_captures, memory_order_relaxed) != 0;
}

/* The stream id of stream s of the entered device d. */
static CUresult stream_sid(fc_device_t *d, CUstream s, uint64_t *sid) {
  return from_sim(d->sim->ops->stream_id(d->sim, (gma_stream_t)s, sid), CUDA_ERROR_INVALID_HANDLE);
}

/* Counts a call that broke a capture rule and, with the "capture" check on,
 * stops the process with fmt (which names the entry point, the stream or
 * event, and the capture). Otherwise returns code, the call's answer. fc.mu
 * may be held: aborting with it held is harmless. */
__attribute__((format(printf, 2, 3))) static CUresult capture_violation(CUresult code,
                                                                        const char *fmt, ...) {
  atomic_fetch_add_explicit(&fc_capture_violations_n, 1, memory_order_relaxed);
  if (!fc_strict(FAKECUDA_STRICT_CAPTURE)) return code;
  va_list ap;
  va_start(ap, fmt);
  fputs("fakecuda: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr,
          " (%s)\nfakecuda: a call that breaks a stream capture is a failure, not an error code "
          "for gma to handle, so the fake driver aborts (check \"capture\"; GMA_FAKECUDA_STRICT "
          "or fakecuda_strict turn it off for a test that expects the error code)\n",
          err_name(code));
  fflush(stderr);
  abort();
}

/* Marks capture c invalidated (the first breaker is kept for messages). */
static void capture_invalidate(fc_capture_t *c, const char *entry) {
  if (!c->invalidated_by) c->invalidated_by = entry;
}

/* ---- node sets and graphs (fc.mu held, or objects no other thread sees) */
static bool set_reserve(fc_nodeset_t *s, size_t n) {
  if (n <= s->cap) return true;
  size_t ncap = s->cap ? s->cap : 4;
  while (ncap < n) ncap *= 2;
  CUgraphNode *v = realloc(s->v, ncap * sizeof *v);
  if (!v) return false;
  s->v = v;
  s->cap = ncap;
  return true;
}

static bool set_has(const fc_nodeset_t *s, CUgraphNode node) {
  for (size_t i = 0; i < s->n; i++)
    if (s->v[i] == node) return true;
  return false;
}

/* dst becomes dst ∪ src; false (dst unchanged) when out of host memory. */
static bool set_union(fc_nodeset_t *dst, const fc_nodeset_t *src) {
  if (!set_reserve(dst, dst->n + src->n)) return false;
  for (size_t i = 0; i < src->n; i++)
    if (!set_has(dst, src->v[i])) dst->v[dst->n++] = src->v[i];
  return true;
}

static bool set_assign(fc_nodeset_t *dst, const fc_nodeset_t *src) {
  if (!set_reserve(dst, src->n)) return false;
  if (src->n) memcpy(dst->v, src->v, src->n * sizeof *src->v); /* v may be NULL when empty */
  dst->n = src->n;
  return true;
}

static void set_free(fc_nodeset_t *s) {
  free(s->v);
  *s = (fc_nodeset_t){0};
}

static void graph_free(CUgraph g) {
  if (!g) return;
  for (size_t i = 0; i < g->n; i++) {
    free(g->nodes[i]->deps);
    free(g->nodes[i]);
  }
  free(g->nodes);
  free(g);
}

/* Appends ops[0..n) to capture stream rec's graph as a chain behind rec's
 * dependency set, and makes the last one rec's set. All or nothing: false
 * (nothing changed) when out of host memory. */
static bool graph_append(fc_cap_stream_t *rec, const fc_op_t *ops, size_t n) {
  CUgraph g = rec->cap->graph;
  if (n == 0) return true;
  if (!set_reserve(&rec->deps, 1)) return false;
  if (g->n + n > g->cap) {
    size_t ncap = g->cap ? g->cap : 16;
    while (ncap < g->n + n) ncap *= 2;
    CUgraphNode *v = realloc(g->nodes, ncap * sizeof *v);
    if (!v) return false;
    g->nodes = v;
    g->cap = ncap;
  }
  size_t made = 0;
  for (; made < n; made++) {
    CUgraphNode node = calloc(1, sizeof *node);
    size_t nd = made == 0 ? rec->deps.n : 1;
    CUgraphNode *deps = nd ? malloc(nd * sizeof *deps) : NULL;
    if (!node || (nd && !deps)) {
      free(node);
      free(deps);
      break;
    }
    node->op = ops[made];
    node->deps = deps;
    node->ndeps = nd;
    if (made == 0) {
      if (nd) memcpy(deps, rec->deps.v, nd * sizeof *deps);
    } else {
      deps[0] = g->nodes[g->n + made - 1];
    }
    g->nodes[g->n + made] = node;
  }
  if (made < n) { /* undo: the nodes made so far are not in g->n yet */
    for (size_t i = 0; i < made; i++) {
      free(g->nodes[g->n + i]->deps);
      free(g->nodes[g->n + i]);
    }
    return false;
  }
  g->n += n;
  rec->deps.v[0] = g->nodes[g->n - 1];
  rec->deps.n = 1;
  return true;
}

/* ---- lookups (fc.mu held) */
static fc_cap_stream_t *cap_stream_find(uint64_t sid) {
  size_t i = vec_find(&fc.cap_streams, (uintptr_t)sid);
  return i == SIZE_MAX ? NULL : ((fc_cap_stream_entry_t *)vec_at(&fc.cap_streams, i))->rec;
}

static fc_capture_t *capture_find(uint64_t id) {
  fc_capture_t *c = fc.captures;
  while (c && c->id != id) c = c->next;
  return c;
}

static fc_event_entry_t *event_entry(CUevent ev) {
  size_t i = vec_find(&fc.events, (uintptr_t)ev);
  return i == SIZE_MAX ? NULL : vec_at(&fc.events, i);
}

static bool stream_blocking(uint64_t sid) {
  return vec_find(&fc.nonblocking, (uintptr_t)sid) == SIZE_MAX;
}

/* Makes the stream (sid, handle) of device di take part in capture c with
 * dependency set deps; NULL when out of host memory. */
static fc_cap_stream_t *cap_stream_add(uint64_t sid, CUstream handle, int di, fc_capture_t *c,
                                       const fc_nodeset_t *deps) {
  fc_cap_stream_t *rec = calloc(1, sizeof *rec);
  if (!rec) return NULL;
  *rec = (fc_cap_stream_t){.sid = sid, .handle = handle, .dev = di,
                           .blocking = stream_blocking(sid), .cap = c};
  fc_cap_stream_entry_t e = {(uintptr_t)sid, rec};
  if ((deps && !set_assign(&rec->deps, deps)) || !vec_insert(&fc.cap_streams, &e)) {
    set_free(&rec->deps);
    free(rec);
    return NULL;
  }
  return rec;
}

static void cap_stream_free(fc_cap_stream_t *rec) {
  set_free(&rec->deps);
  free(rec->edges);
  free(rec);
}

/* Ends capture c: every stream of it stops capturing, c leaves the list and
 * is freed. Its graph is the caller's (handed out or freed). */
static void capture_end(fc_capture_t *c) {
  for (size_t i = fc.cap_streams.n; i-- > 0;) {
    fc_cap_stream_entry_t *e = vec_at(&fc.cap_streams, i);
    if (e->rec->cap != c) continue;
    cap_stream_free(e->rec);
    vec_remove(&fc.cap_streams, i);
  }
  fc_capture_t **pp = &fc.captures;
  while (*pp != c) pp = &(*pp)->next;
  *pp = c->next;
  atomic_fetch_sub_explicit(&fc_live_captures, 1, memory_order_relaxed);
  free(c);
}

/* Forgets the captures, capturing streams and non-blocking streams of
 * device di, whose sim is gone (device_reset); the graphs being built go
 * with them. */
static void capture_forget_device(int di) {
  for (fc_capture_t *c = fc.captures, *next; c; c = next) {
    next = c->next;
    if (c->dev != di) continue;
    graph_free(c->graph);
    capture_end(c);
  }
  for (size_t i = fc.nonblocking.n; i-- > 0;)
    if (((fc_stream_key_t *)vec_at(&fc.nonblocking, i))->dev == di) vec_remove(&fc.nonblocking, i);
}

/* ---- the rules */

/* Whether capture c prohibits a potentially unsafe call from a thread in
 * mode whose serial is me (cuThreadExchangeStreamCaptureMode): GLOBAL is
 * prohibited by its own non-relaxed captures and by any GLOBAL capture,
 * THREAD_LOCAL by its own non-relaxed captures only, RELAXED never. An
 * invalidated capture still prohibits: it is underway until ended. */
static bool capture_prohibits(const fc_capture_t *c, CUstreamCaptureMode mode, uint64_t me) {
  bool own = c->thread == me && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  switch (mode) {
    case CU_STREAM_CAPTURE_MODE_GLOBAL: return own || c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: return own;
    default: return false;
  }
}

/* The check of a potentially unsafe call (fakecuda.h lists them), made
 * before the call does anything: CUDA_SUCCESS, or
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED after invalidating every capture
 * that prohibits it. Any thread, no lock held (or only a device's life). */
static CUresult capture_unsafe(const char *entry) {
  if (!captures_live()) return CUDA_SUCCESS;
  CUstreamCaptureMode mode = tls_capture_mode;
  uint64_t me = thread_serial();
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&fc.mu);
  fc_capture_t *first = NULL;
  for (fc_capture_t *c = fc.captures; c; c = c->next) {
    if (!capture_prohibits(c, mode, me)) continue;
    capture_invalidate(c, entry);
    if (!first) first = c;
  }
  if (first)
    r = capture_violation(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                          "%s: a potentially unsafe call from a thread in %s capture mode while "
                          "capture %llu (begun on stream %p in %s mode by %s thread) is underway; "
                          "it is prohibited and invalidates the capture",
                          entry, mode_name(mode), (unsigned long long)first->id,
                          (void *)first->origin_handle, mode_name(first->mode),
                          first->thread == me ? "this" : "another");
  pthread_mutex_unlock(&fc.mu);
  return r;
}

/* The legacy stream s (NULL or CU_STREAM_LEGACY) while a blocking stream of
 * device d captures: every use of it would make it wait for the capture, so
 * it gets CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, and (invalidate: a use other
 * than a capture query) those captures are invalidated and the use counts
 * as a capture violation. CUDA_SUCCESS for
 * any other stream or state. fc.mu held. */
static CUresult capture_implicit(const char *entry, const fc_device_t *d, CUstream s,
                                 bool invalidate) {
  if (!is_legacy(s)) return CUDA_SUCCESS;
  const fc_cap_stream_t *first = NULL;
  for (size_t i = 0; i < fc.cap_streams.n; i++) {
    fc_cap_stream_t *rec = ((fc_cap_stream_entry_t *)vec_at(&fc.cap_streams, i))->rec;
    if (rec->dev != d->ctx.ordinal || !rec->blocking) continue;
    if (invalidate) capture_invalidate(rec->cap, entry);
    if (!first) first = rec;
  }
  if (!first) return CUDA_SUCCESS;
  /* A capture query answering so is how a caller learns it must stay off
   * the legacy stream (gma asks before it records an epoch event there): no
   * misuse, so neither counted nor stopped by the strict check. */
  if (!invalidate) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  return capture_violation(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                           "%s: the legacy stream (%s) used while blocking stream %p of the same "
                           "device captures (capture %llu)%s",
                           entry, legacy_name(s), (void *)first->handle,
                           (unsigned long long)first->cap->id,
                           invalidate ? "; the capture is invalidated" : "");
}

/* Puts ops[0..n), queued by entry on stream s of the entered device d, into
 * s's capture if s captures: *taken tells whether the capture (or a capture
 * rule) took the call, in which case the result is the call's and nothing
 * runs; otherwise the caller queues the work itself. */
static CUresult capture_ops(const char *entry, fc_device_t *d, CUstream s, const fc_op_t *ops,
                            size_t n, bool *taken) {
  *taken = false;
  if (!captures_live()) return CUDA_SUCCESS;
  uint64_t sid;
  CUresult r = stream_sid(d, s, &sid);
  if (r != CUDA_SUCCESS) {
    *taken = true;
    return r;
  }
  pthread_mutex_lock(&fc.mu);
  r = capture_implicit(entry, d, s, true);
  fc_cap_stream_t *rec = r == CUDA_SUCCESS ? cap_stream_find(sid) : NULL;
  if (r != CUDA_SUCCESS || rec) *taken = true;
  if (rec && rec->cap->invalidated_by) {
    r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  } else if (rec && !graph_append(rec, ops, n)) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_unlock(&fc.mu);
  return r;
}

/* A call that waits for stream s or ends it (cuStreamSynchronize,
 * cuStreamQuery, cuStreamDestroy), or asks its id (cuStreamGetId: an H100
 * with driver 580 refuses it on a capturing stream in every mode, measured
 * by gma's capture-rules probe): on a capturing stream
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the capture is invalidated, in
 * every mode; with implicit, on the legacy stream while a blocking stream
 * captures, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT. d entered. */
static CUresult capture_stream_check(const char *entry, fc_device_t *d, CUstream s,
                                     bool implicit) {
  if (!captures_live()) return CUDA_SUCCESS;
  uint64_t sid;
  CUresult r = stream_sid(d, s, &sid);
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&fc.mu);
  r = implicit ? capture_implicit(entry, d, s, true) : CUDA_SUCCESS;
  fc_cap_stream_t *rec = r == CUDA_SUCCESS ? cap_stream_find(sid) : NULL;
  if (rec) {
    capture_invalidate(rec->cap, entry);
    r = capture_violation(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                          "%s: stream %p is capturing (capture %llu, begun on stream %p); the "
                          "call is not permitted on a capturing stream (its work is not "
                          "scheduled); the capture is invalidated",
                          entry, (void *)s, (unsigned long long)rec->cap->id,
                          (void *)rec->cap->origin_handle);
  }
  pthread_mutex_unlock(&fc.mu);
  return r;
}
static CUresult capture_stream_use(const char *entry, fc_device_t *d, CUstream s) {
  return capture_stream_check(entry, d, s, true);
}

/* cuCtxSynchronize on device d while a stream of d captures: a device-wide
 * wait would include the capturing streams, which the programming guide
 * prohibits in every mode; CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and those
 * captures are invalidated. d entered. */
static CUresult capture_device_sync(const char *entry, const fc_device_t *d) {
  if (!captures_live()) return CUDA_SUCCESS;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&fc.mu);
  const fc_cap_stream_t *first = NULL;
  for (size_t i = 0; i < fc.cap_streams.n; i++) {
    fc_cap_stream_t *rec = ((fc_cap_stream_entry_t *)vec_at(&fc.cap_streams, i))->rec;
    if (rec->dev != d->ctx.ordinal) continue;
    capture_invalidate(rec->cap, entry);
    if (!first) first = rec;
  }
  if (first)
    r = capture_violation(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                          "%s: stream %p of device %d is capturing (capture %llu); a device-wide "
                          "synchronize cannot wait for it; the capture is invalidated",
                          entry, (void *)first->handle, d->ctx.ordinal,
                          (unsigned long long)first->cap->id);
  pthread_mutex_unlock(&fc.mu);
  return r;
}

/* cuEventQuery / cuEventSynchronize on a captured event: it stands for graph
 * nodes, not for scheduled work, so CUDA_ERROR_CAPTURED_EVENT in every mode
 * (the call "necessarily conflicts" with capture); the capture is not
 * invalidated. */
static CUresult capture_event_check(const char *entry, CUevent ev) {
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&fc.mu);
  const fc_event_entry_t *e = event_entry(ev);
  if (e && e->cap_id) {
    const fc_capture_t *c = capture_find(e->cap_id);
    r = capture_violation(CUDA_ERROR_CAPTURED_EVENT,
                          "%s: event %p was last recorded in capture %llu (%s)", entry, (void *)ev,
                          (unsigned long long)e->cap_id, c ? "underway" : "ended since");
  }
  pthread_mutex_unlock(&fc.mu);
  return r;
}

/* cuEventRecord's capture part: on a capturing stream the event becomes a
 * captured event standing for the stream's dependency set, and nothing is
 * recorded on the device (*taken). */
static CUresult capture_record(fc_device_t *d, CUstream s, CUevent ev, bool *taken) {
  *taken = false;
  if (!captures_live()) return CUDA_SUCCESS;
  uint64_t sid;
  CUresult r = stream_sid(d, s, &sid);
  if (r != CUDA_SUCCESS) {
    *taken = true;
    return r;
  }
  pthread_mutex_lock(&fc.mu);
  r = capture_implicit("cuEventRecord", d, s, true);
  fc_cap_stream_t *rec = r == CUDA_SUCCESS ? cap_stream_find(sid) : NULL;
  fc_event_entry_t *e = event_entry(ev);
  if (r != CUDA_SUCCESS || rec) *taken = true;
  if (rec && rec->cap->invalidated_by) {
    r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  } else if (rec && e) {
    if (set_assign(&e->set, &rec->deps)) {
      e->cap_id = rec->cap->id;
    } else {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  pthread_mutex_unlock(&fc.mu);
  return r;
}

/* After a record outside any capture: the event stands for device work
 * again. */
static void event_uncapture(CUevent ev) {
  pthread_mutex_lock(&fc.mu);
  fc_event_entry_t *e = event_entry(ev);
  if (e && e->cap_id) {
    e->cap_id = 0;
    e->set.n = 0;
  }
  pthread_mutex_unlock(&fc.mu);
}

/* cuStreamWaitEvent with a captured event e of live capture c, on stream s
 * (rec: its capture record or NULL). fc.mu held. */
static CUresult capture_wait_captured(fc_device_t *d, CUstream s, uint64_t sid,
                                      fc_cap_stream_t *rec, fc_event_entry_t *e, fc_capture_t *c) {
  if (c->invalidated_by || (rec && rec->cap->invalidated_by))
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (rec && rec->cap != c) {
    capture_invalidate(c, "cuStreamWaitEvent");
    capture_invalidate(rec->cap, "cuStreamWaitEvent");
    return capture_violation(CUDA_ERROR_STREAM_CAPTURE_MERGE,
                             "cuStreamWaitEvent: stream %p of capture %llu waits on event %p of "
                             "capture %llu; both captures are invalidated",
                             (void *)s, (unsigned long long)rec->cap->id, (void *)e->ev,
                             (unsigned long long)c->id);
  }
  if (rec) return set_union(&rec->deps, &e->set) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  if (is_legacy(s)) {
    capture_invalidate(c, "cuStreamWaitEvent");
    return capture_violation(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                             "cuStreamWaitEvent: the legacy stream (%s) cannot join capture %llu "
                             "(event %p); the capture is invalidated",
                             legacy_name(s), (unsigned long long)c->id, (void *)e->ev);
  }
  /* The fork: s joins the capture, its next work depending on the event's nodes. */
  return cap_stream_add(sid, s, d->ctx.ordinal, c, &e->set) ? CUDA_SUCCESS
                                                            : CUDA_ERROR_OUT_OF_MEMORY;
}

/* cuStreamWaitEvent's capture part, for stream s of the entered device d
 * and event ev of d: *taken when the wait is a capture's (a join, a merge
 * of dependencies) or breaks a rule; otherwise the caller waits on the
 * device. A capturing stream may wait only on an event captured in its own
 * capture (else CUDA_ERROR_STREAM_CAPTURE_ISOLATION, or _MERGE for another
 * capture's, invalidating); a stream that does not capture and waits on a
 * captured event joins its capture, or, when that capture has ended, gets
 * CUDA_ERROR_CAPTURED_EVENT (the event stands for no scheduled work). */
static CUresult capture_wait(fc_device_t *d, CUstream s, CUevent ev, bool *taken) {
  uint64_t sid;
  CUresult r = stream_sid(d, s, &sid);
  *taken = r != CUDA_SUCCESS;
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&fc.mu);
  fc_event_entry_t *e = event_entry(ev);
  fc_cap_stream_t *rec = cap_stream_find(sid);
  fc_capture_t *c = e && e->cap_id ? capture_find(e->cap_id) : NULL;
  r = capture_implicit("cuStreamWaitEvent", d, s, true);
  if (r != CUDA_SUCCESS || rec || (e && e->cap_id)) *taken = true;
  if (r != CUDA_SUCCESS) {
    /* the legacy stream: answered */
  } else if (c) {
    r = capture_wait_captured(d, s, sid, rec, e, c);
  } else if (rec && rec->cap->invalidated_by) {
    r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  } else if (rec) {
    capture_invalidate(rec->cap, "cuStreamWaitEvent");
    r = capture_violation(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                          "cuStreamWaitEvent: capturing stream %p (capture %llu) waits on event "
                          "%p, which %s; the capture is invalidated",
                          (void *)s, (unsigned long long)rec->cap->id, (void *)ev,
                          e && e->cap_id ? "was captured in a capture that has ended"
                                         : "was not recorded in this capture");
  } else if (e && e->cap_id) {
    r = capture_violation(CUDA_ERROR_CAPTURED_EVENT,
                          "cuStreamWaitEvent: stream %p waits on event %p, last recorded in "
                          "capture %llu, which has ended",
                          (void *)s, (void *)ev, (unsigned long long)e->cap_id);
  }
  pthread_mutex_unlock(&fc.mu);
  return r;
}

/* ---------------------------------------------------------------------------
 * Initialization and devices
 * ------------------------------------------------------------------------- */
/* Parses a size with an optional K, M, G or T suffix (powers of 1024); the
 * text ends at end (exclusive). False on a malformed or zero size. */
static bool parse_size(const char *s, const char *end, uint64_t *out) {
  uint64_t v = 0;
  const char *p = s;
  for (; p < end && isdigit((unsigned char)*p); p++) {
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  if (p == s) return false;
  unsigned shift = 0;
  if (p < end) {
    switch (toupper((unsigned char)*p)) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: return false;
    }
    p++;
  }
  if (p != end || v == 0 || v > (UINT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

/* Reads GMA_FAKECUDA_DEVICES, _MEM and _GRANULARITY into fc; prints what is
 * wrong and returns false on a bad value. Caller holds init_mu. */
static bool read_env(void) {
  const char *e = getenv("GMA_FAKECUDA_DEVICES");
  long n = 1;
  if (e && *e) {
    char *endp;
    errno = 0;
    n = strtol(e, &endp, 10);
    if (errno || *endp || n < 0 || n > FC_MAX_DEVICES) {
      fprintf(stderr, "fakecuda: GMA_FAKECUDA_DEVICES=%s: expected 0..%d\n", e, FC_MAX_DEVICES);
      return false;
    }
  }
  fc.ndev = (int)n;
  uint64_t mem = FC_DEFAULT_MEM;
  e = getenv("GMA_FAKECUDA_MEM");
  const char *p = e && *e ? e : NULL;
  for (int i = 0; i < fc.ndev; i++) {
    if (p) {
      const char *comma = strchr(p, ',');
      const char *end = comma ? comma : p + strlen(p);
      if (!parse_size(p, end, &mem)) {
        fprintf(stderr, "fakecuda: GMA_FAKECUDA_MEM=%s: expected sizes like 8G,512M\n", e);
        return false;
      }
      p = comma ? comma + 1 : NULL; /* the last size repeats */
    }
    fc.dev[i].capacity = mem;
  }
  fc.vmm_rdma = fc.vmm_posix_fd = true; /* as an H100 with a current driver */
  fc.vmm_off = false;
  e = getenv("GMA_FAKECUDA_VMM_FEATURES");
  if (e && *e) {
    if (strcmp(e, "none") == 0 || strcmp(e, "off") == 0) {
      fc.vmm_rdma = fc.vmm_posix_fd = false;
      fc.vmm_off = strcmp(e, "off") == 0;
    } else if (strcmp(e, "all") != 0) {
      fprintf(stderr, "fakecuda: GMA_FAKECUDA_VMM_FEATURES=%s: expected all, none or off\n", e);
      return false;
    }
  }
  e = getenv("GMA_FAKECUDA_STREAM_MEM_OPS");
  fc.memops = !e || !*e || strcmp(e, "on") == 0;
  if (e && *e && strcmp(e, "on") != 0 && strcmp(e, "off") != 0) {
    fprintf(stderr, "fakecuda: GMA_FAKECUDA_STREAM_MEM_OPS=%s: expected on or off\n", e);
    return false;
  }
  e = getenv("GMA_FAKECUDA_COSTS");
  fc.costs = e && *e && strcmp(e, "none") != 0 ? gma__sim_costs_find(e) : NULL;
  if (e && *e && strcmp(e, "none") != 0 && !fc.costs) {
    fprintf(stderr, "fakecuda: GMA_FAKECUDA_COSTS=%s: expected one of %s\n", e,
            gma__sim_costs_names());
    return false;
  }
  fc.costs_preset = 0;
  for (int i = 1; fc.costs && gma__sim_costs_preset(i); i++)
    if (gma__sim_costs_preset(i) == fc.costs) fc.costs_preset = i;
  fc.gran = FC_DEFAULT_GRANULARITY;
  e = getenv("GMA_FAKECUDA_GRANULARITY");
  if (e && *e && !parse_size(e, e + strlen(e), &fc.gran)) {
    fprintf(stderr, "fakecuda: GMA_FAKECUDA_GRANULARITY=%s: expected a size like 2M\n", e);
    return false;
  }
  return true;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
  CUresult fr;
  if (fc_enter(FC_cuInit, &fr)) return fr;
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fc.init_mu);
  CUresult r = CUDA_SUCCESS;
  if (fc_ready()) goto out;
  if (!read_env()) {
    r = CUDA_ERROR_INVALID_VALUE;
    goto out;
  }
  if (fc.ndev == 0) {
    r = CUDA_ERROR_NO_DEVICE;
    goto out;
  }
  /* The sim's granularity is a constant of its ops; a short-lived sim asks. */
  gma_config_t cfg = GMA_CONFIG_INIT;
  cfg.sim_capacity = 1ull << 30;
  gma__device_t *probe;
  if (gma__sim_create(&cfg, &probe) != GMA_OK) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
    goto out;
  }
  fc.vmm = probe->ops->vm_granularity && probe->ops->vm_reserve && probe->ops->vm_map &&
           probe->ops->vm_unmap && probe->ops->vm_release &&
           probe->ops->vm_granularity(probe, &fc.sim_gran) == GMA_OK && !fc.vmm_off;
  probe->ops->destroy(probe);
  /* A granularity the sim cannot map in whole granules is refused rather
   * than emulated: the sim's pieces would not line up with the fake's. */
  if (fc.vmm && (fc.gran % fc.sim_gran != 0 || (fc.gran & (fc.gran - 1)) != 0)) {
    fprintf(stderr,
            "fakecuda: GMA_FAKECUDA_GRANULARITY=%llu: must be a power of two multiple of the "
            "simulated device's granularity (%llu)\n",
            (unsigned long long)fc.gran, (unsigned long long)fc.sim_gran);
    r = CUDA_ERROR_INVALID_VALUE;
    goto out;
  }
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&fc.mem_rw, &ra);
  pthread_rwlockattr_destroy(&ra);
  for (int i = 0; i < fc.ndev; i++) {
    fc.dev[i].ctx.ordinal = i;
    pthread_rwlock_init(&fc.dev[i].life, NULL);
    atomic_init(&fc.dev[i].sticky, 0);
  }
  /* Release pairs with the acquire in fc_ready. */
  atomic_store_explicit(&fc.initialized, true, memory_order_release);
out:
  pthread_mutex_unlock(&fc.init_mu);
  return r;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
  CUresult fr;
  if (fc_enter(FC_cuDriverGetVersion, &fr)) return fr;
  if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = CUDA_VERSION; /* the headers the fake was built with */
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
  FC_BEGIN(cuDeviceGetCount);
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = fc.ndev;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  FC_BEGIN(cuDeviceGet);
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= fc.ndev) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

/* For gma-driver-probe, which names the device it measured. */
CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
  FC_BEGIN(cuDeviceGetName);
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= fc.ndev) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "gma fake CUDA device %d (simulated)", (int)dev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  FC_BEGIN(cuDeviceTotalMem);
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= fc.ndev) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = (size_t)fc.dev[dev].capacity;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  FC_BEGIN(cuDeviceGetAttribute);
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= fc.ndev) return CUDA_ERROR_INVALID_DEVICE;
  int v;
  /* An H100-like device; features the fake does not implement say 0. */
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 2; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 50 << 20; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = CU_COMPUTEMODE_DEFAULT; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x18 + dev; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = fc.vmm; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = fc.vmm_posix_fd; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: v = fc.vmm_rdma; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: v = fc.memops; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  *pi = v;
  return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------------------
 * Primary contexts and the context stack
 * ------------------------------------------------------------------------- */
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  FC_BEGIN(cuDevicePrimaryCtxRetain);
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= fc.ndev) return CUDA_ERROR_INVALID_DEVICE;
  fc_device_t *d = &fc.dev[dev];
  /* Fast path: an active context only gains a reference. */
  pthread_mutex_lock(&fc.mu);
  bool done = d->refs > 0;
  if (done) d->refs++;
  pthread_mutex_unlock(&fc.mu);
  if (done) {
    *pctx = &d->ctx;
    return CUDA_SUCCESS;
  }
  /* 0 -> 1 starts the device, with life held for writing. */
  pthread_rwlock_wrlock(&d->life);
  CUresult r = CUDA_SUCCESS;
  if (!d->active) {
    gma_config_t cfg = GMA_CONFIG_INIT;
    cfg.sim_capacity = d->capacity;
    cfg.sim_costs = fc.costs_preset;
    gma__device_t *sim;
    if (gma__sim_create(&cfg, &sim) != GMA_OK) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      gma__sim_costs_unpriced(sim); /* fc_price charges each entry point */
      pthread_mutex_lock(&fc.mu);
      d->sim = sim;
      d->active = true;
      pthread_mutex_unlock(&fc.mu);
    }
  }
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&fc.mu);
    d->refs++;
    pthread_mutex_unlock(&fc.mu);
    *pctx = &d->ctx;
  }
  pthread_rwlock_unlock(&d->life);
  return r;
}

/* Resets device d: drains and destroys its sim (every allocation, mapping,
 * reservation, event and stream goes with it) and forgets its bookkeeping.
 * Caller holds d->life for writing, refs is 0, active still true. Resources
 * left are reported on stderr: not an error for CUDA, but a hint when a test
 * expected gma to have given everything back. */
static void device_reset(fc_device_t *d) {
  int di = d->ctx.ordinal;
  pthread_mutex_lock(&fc.mu);
  d->active = false;
  gma__device_t *sim = d->sim;
  pthread_mutex_unlock(&fc.mu);
  /* Copy kernels still queued run to completion against the old bookkeeping. */
  sim->ops->destroy(sim);
  size_t nalloc = 0, nmap = 0, nresv = 0, nhandle = 0, nevent = 0;
  pthread_mutex_lock(&fc.mu);
  for (size_t i = 0; i < fc.ranges.n;) {
    fc_range_t *r = vec_at(&fc.ranges, i);
    if (r->dev != di) {
      i++;
      continue;
    }
    if (r->map) {
      nmap++;
      if (r->h->released) free(r->h); /* else freed with the handle table below */
      else r->h->mapped_at = 0;
    } else {
      nalloc++;
    }
    vec_remove(&fc.ranges, i);
  }
  for (size_t i = 0; i < fc.resv.n;) {
    if (((fc_resv_t *)vec_at(&fc.resv, i))->dev == di) {
      nresv++;
      vec_remove(&fc.resv, i);
    } else {
      i++;
    }
  }
  for (size_t i = 0; i < fc.handles.n;) {
    fc_handle_entry_t *e = vec_at(&fc.handles, i);
    if (e->h->dev == di) {
      nhandle++;
      free(e->h);
      vec_remove(&fc.handles, i);
    } else {
      i++;
    }
  }
  for (size_t i = 0; i < fc.events.n;) {
    if (((fc_event_entry_t *)vec_at(&fc.events, i))->dev == di) {
      nevent++;
      set_free(&((fc_event_entry_t *)vec_at(&fc.events, i))->set);
      vec_remove(&fc.events, i);
    } else {
      i++;
    }
  }
  /* Captures on the device's streams end with them; executable graphs made
   * in the context die with it (the epoch). */
  capture_forget_device(di);
  d->epoch++;
  uint64_t used = d->used;
  d->used = 0;
  d->sim = NULL;
  pthread_mutex_unlock(&fc.mu);
  atomic_store(&d->sticky, 0);
  if (nalloc + nmap + nresv + nhandle + nevent) {
    fprintf(stderr,
            "fakecuda: device %d: primary context reset with %zu allocations, %zu mappings, "
            "%zu reservations, %zu handles (%llu bytes in all) and %zu events still live; "
            "freed them\n",
            di, nalloc, nmap, nresv, nhandle, (unsigned long long)used, nevent);
  }
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  FC_BEGIN(cuDevicePrimaryCtxRelease);
  if (dev < 0 || dev >= fc.ndev) return CUDA_ERROR_INVALID_DEVICE;
  fc_device_t *d = &fc.dev[dev];
  pthread_mutex_lock(&fc.mu);
  unsigned refs = d->refs;
  if (refs > 1) d->refs--;
  pthread_mutex_unlock(&fc.mu);
  if (refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (refs > 1) return CUDA_SUCCESS;
  /* Possibly the last reference: decide again with life held for writing,
   * since another thread may have retained or released meanwhile. */
  pthread_rwlock_wrlock(&d->life);
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&fc.mu);
  if (d->refs == 0) {
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else {
    d->refs--;
  }
  bool reset = r == CUDA_SUCCESS && d->refs == 0;
  pthread_mutex_unlock(&fc.mu);
  if (reset) device_reset(d);
  pthread_rwlock_unlock(&d->life);
  return r;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
  FC_BEGIN(cuCtxGetCurrent);
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = tls_ctx.n ? tls_ctx.s[tls_ctx.n - 1] : NULL;
  return CUDA_SUCCESS;
}

/* Replaces the top of the stack; NULL pops (a no-op on an empty stack). */
CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  FC_BEGIN(cuCtxSetCurrent);
  if (!ctx) {
    if (tls_ctx.n) tls_ctx.n--;
    return CUDA_SUCCESS;
  }
  if (!ctx_device(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (tls_ctx.n == 0) tls_ctx.n = 1;
  tls_ctx.s[tls_ctx.n - 1] = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
  FC_BEGIN(cuCtxPushCurrent);
  if (!ctx_device(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (tls_ctx.n == FC_CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
  tls_ctx.s[tls_ctx.n++] = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) {
  FC_BEGIN(cuCtxPopCurrent);
  if (tls_ctx.n == 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext c = tls_ctx.s[--tls_ctx.n];
  if (pctx) *pctx = c;
  return CUDA_SUCCESS;
}

/* A context of its own on dev (the CUDA 12.5+ signature cuda.h names
 * cuCtxCreate); made current, as the driver does. It holds a reference on
 * the device's primary context, which keeps the simulated device alive. */
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                             CUdevice dev) {
  FC_BEGIN(cuCtxCreate);
  if (!pctx || params || dev < 0 || dev >= fc.ndev) return CUDA_ERROR_INVALID_VALUE;
  (void)flags;
  if (tls_ctx.n == FC_CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
  CUcontext primary;
  CUresult r = cuDevicePrimaryCtxRetain(&primary, dev);
  if (r != CUDA_SUCCESS) return r;
  CUcontext c = calloc(1, sizeof *c);
  int slot = -1;
  pthread_mutex_lock(&fc.mu);
  for (int i = 0; c && i < FC_MAX_CREATED && slot < 0; i++)
    if (!fc.created[i]) slot = i;
  if (slot >= 0) {
    c->ordinal = dev;
    c->created = true;
    fc.created[slot] = c;
  }
  pthread_mutex_unlock(&fc.mu);
  if (slot < 0) {
    free(c);
    cuDevicePrimaryCtxRelease(dev);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  tls_ctx.s[tls_ctx.n++] = c;
  *pctx = c;
  return CUDA_SUCCESS;
}

/* Destroys a context of cuCtxCreate: popped if current on this thread, its
 * reference on the primary context released. Streams made in it must be
 * destroyed first (the fake does not track them further). */
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) {
  FC_BEGIN(cuCtxDestroy);
  int slot = -1;
  pthread_mutex_lock(&fc.mu);
  for (int i = 0; ctx && i < FC_MAX_CREATED && slot < 0; i++)
    if (fc.created[i] == ctx) slot = i;
  if (slot >= 0) fc.created[slot] = NULL;
  for (size_t i = fc.stream_ctx.n; slot >= 0 && i-- > 0;) /* its streams name it no more */
    if (((fc_stream_ctx_t *)vec_at(&fc.stream_ctx, i))->ctx == ctx) vec_remove(&fc.stream_ctx, i);
  pthread_mutex_unlock(&fc.mu);
  if (slot < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (tls_ctx.n && tls_ctx.s[tls_ctx.n - 1] == ctx) tls_ctx.n--;
  int dev = ctx->ordinal;
  free(ctx);
  return cuDevicePrimaryCtxRelease(dev);
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  FC_BEGIN(cuCtxSynchronize);
  fc_device_t *d;
  CUresult r = ctx_enter(&d);
  if (r != CUDA_SUCCESS) return r;
  r = capture_device_sync("cuCtxSynchronize", d);
  if (r == CUDA_SUCCESS) r = capture_unsafe("cuCtxSynchronize");
  if (r != CUDA_SUCCESS) {
    dev_exit(d);
    return r;
  }
  r = from_sim(d->sim->ops->device_synchronize(d->sim), CUDA_ERROR_INVALID_CONTEXT);
  if (r == CUDA_SUCCESS) r = (CUresult)atomic_load(&d->sticky);
  dev_exit(d);
  return r;
}

/* ---------------------------------------------------------------------------
 * Linear memory
 * ------------------------------------------------------------------------- */
static void pending_check(const char *entry, uintptr_t p, uint64_t n, int di);

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  FC_BEGIN(cuMemAlloc);
  fc_price_bytes(GMA__SIM_COST_MEM_ALLOC, bytesize);
  FC_UNSAFE(cuMemAlloc);
  fc_device_t *d;
  CUresult r = ctx_enter(&d);
  if (r != CUDA_SUCCESS) return r;
  if (!dptr || bytesize == 0) {
    dev_exit(d);
    return CUDA_ERROR_INVALID_VALUE;
  }
  /* The bytes are taken from the fake's accounting first, so the sim (whose
   * capacity is the same) never holds more than the fake admitted. */
  pthread_mutex_lock(&fc.mu);
  bool fits = bytesize <= d->capacity - d->used;
  if (fits) d->used += bytesize;
  pthread_mutex_unlock(&fc.mu);
  if (!fits) {
    dev_exit(d);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  uintptr_t addr = 0;
  pthread_rwlock_wrlock(&fc.mem_rw);
  r = from_sim(d->sim->ops->mem_alloc(d->sim, bytesize, &addr), CUDA_ERROR_INVALID_VALUE);
  if (r == CUDA_SUCCESS) {
    fc_range_t rec = {.addr = addr, .size = bytesize, .dev = d->ctx.ordinal};
    pthread_mutex_lock(&fc.mu);
    bool ok = vec_insert(&fc.ranges, &rec);
    pthread_mutex_unlock(&fc.mu);
    if (!ok) {
      d->sim->ops->mem_free(d->sim, addr, bytesize);
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  pthread_rwlock_unlock(&fc.mem_rw);
  if (r != CUDA_SUCCESS) {
    pthread_mutex_lock(&fc.mu);
    d->used -= bytesize;
    pthread_mutex_unlock(&fc.mu);
  } else {
    *dptr = addr;
  }
  dev_exit(d);
  return r;
}

/* ---------------------------------------------------------------------------
 * Pinned host memory (cuMemHostAlloc): the simulated device's host memory.
 * The device address equals the host address (unified addressing). Blocks
 * are kept in a list under fc.mu so bad frees and lookups are refused, as
 * by the driver. Not registered as device ranges: the GPU tests never touch
 * host memory from simulated device work.
 * ------------------------------------------------------------------------- */
typedef struct fc_host {
  void *ptr;
  size_t size;
  int dev;
  struct fc_host *next;
} fc_host_t;
static fc_host_t *fc_hosts; /* fc.mu */

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
  FC_BEGIN(cuMemHostAlloc);
  fc_price_bytes(GMA__SIM_COST_HOST_ALLOC, bytesize);
  FC_UNSAFE(cuMemHostAlloc);
  fc_device_t *d;
  CUresult r = ctx_enter(&d);
  if (r != CUDA_SUCCESS) return r;
  if (!pp || bytesize == 0 ||
      (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                           CU_MEMHOSTALLOC_WRITECOMBINED))) {
    dev_exit(d);
    return CUDA_ERROR_INVALID_VALUE;
  }
  fc_host_t *h = calloc(1, sizeof *h);
  uintptr_t dummy;
  r = h ? from_sim(d->sim->ops->host_alloc(d->sim, bytesize, &h->ptr, &dummy),
                   CUDA_ERROR_INVALID_VALUE)
        : CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS) {
    h->size = bytesize;
    h->dev = d->ctx.ordinal;
    pthread_mutex_lock(&fc.mu);
    h->next = fc_hosts;
    fc_hosts = h;
    pthread_mutex_unlock(&fc.mu);
    *pp = h->ptr;
  } else {
    free(h);
  }
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int flags) {
  FC_BEGIN(cuMemHostGetDevicePointer);
  fc_device_t *d;
  CUresult r = ctx_enter(&d);
  if (r != CUDA_SUCCESS) return r;
  r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fc.mu);
  for (fc_host_t *h = fc_hosts; h && pdptr && flags == 0; h = h->next)
    if ((char *)p >= (char *)h->ptr && (char *)p < (char *)h->ptr + h->size) {
      *pdptr = (CUdeviceptr)(uintptr_t)p;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&fc.mu);
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuMemFreeHost(void *p) {
  FC_BEGIN(cuMemFreeHost);
  FC_UNSAFE(cuMemFreeHost);
  fc_device_t *d;
  CUresult r = ctx_enter(&d);
  if (r != CUDA_SUCCESS) return r;
  /* It synchronizes the device first, as on a GPU (an H100 with driver 580
   * waited there for a stream held by cuStreamWaitValue32, and the other
   * threads' calls waited behind it): a caller that frees pinned memory
   * while a stream it has yet to release is held hangs here too. No lock of
   * the fake is held while it waits. */
  (void)d->sim->ops->device_synchronize(d->sim);
  pthread_mutex_lock(&fc.mu);
  fc_host_t **pp = &fc_hosts;
  while (*pp && (*pp)->ptr != p) pp = &(*pp)->next;
  fc_host_t *h = *pp;
  if (h) *pp = h->next;
  pthread_mutex_unlock(&fc.mu);
  if (h) {
    fc_device_t *owner = &fc.dev[h->dev];
    owner->sim->ops->host_free(owner->sim, h->ptr, h->size);
    free(h);
  }
  dev_exit(d);
  return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Frees a cuMemAlloc allocation of any device (unified addressing); a
 * current context is required, as by the driver. */
CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
  FC_BEGIN(cuMemFree);
  FC_UNSAFE(cuMemFree);
  fc_device_t *cur;
  CUresult r = ctx_enter(&cur);
  if (r != CUDA_SUCCESS) return r;
  dev_exit(cur);
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.ranges, (uintptr_t)dptr);
  const fc_range_t *rec = i == SIZE_MAX ? NULL : vec_at(&fc.ranges, i);
  int di = rec && !rec->map ? rec->dev : -1;
  pthread_mutex_unlock(&fc.mu);
  if (di < 0) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d = &fc.dev[di];
  r = dev_enter(d, CUDA_ERROR_INVALID_VALUE);
  if (r != CUDA_SUCCESS) return r;
  pthread_rwlock_wrlock(&fc.mem_rw);
  pthread_mutex_lock(&fc.mu);
  i = vec_find(&fc.ranges, (uintptr_t)dptr);
  rec = i == SIZE_MAX ? NULL : vec_at(&fc.ranges, i);
  uint64_t size = 0;
  if (rec && !rec->map && rec->dev == di) {
    size = rec->size;
    pending_check("cuMemFree", (uintptr_t)dptr, size, di);
    vec_remove(&fc.ranges, i);
  }
  pthread_mutex_unlock(&fc.mu);
  if (size == 0) {
    r = CUDA_ERROR_INVALID_VALUE; /* freed by another thread meanwhile */
  } else if (d->sim->ops->mem_free(d->sim, (uintptr_t)dptr, size) != GMA_OK) {
    /* The bookkeeping and the sim disagree: a bug in the fake. */
    fprintf(stderr, "fakecuda: cuMemFree(0x%llx): the simulated device refused the free\n",
            (unsigned long long)dptr);
    r = CUDA_ERROR_UNKNOWN;
  } else {
    pthread_mutex_lock(&fc.mu);
    d->used -= size;
    pthread_mutex_unlock(&fc.mu);
  }
  pthread_rwlock_unlock(&fc.mem_rw);
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  FC_BEGIN(cuMemGetInfo);
  fc_device_t *d;
  CUresult r = ctx_enter(&d);
  if (r != CUDA_SUCCESS) return r;
  if (!free_bytes || !total_bytes) {
    dev_exit(d);
    return CUDA_ERROR_INVALID_VALUE;
  }
  pthread_mutex_lock(&fc.mu);
  *free_bytes = (size_t)(d->capacity - d->used);
  *total_bytes = (size_t)d->capacity;
  pthread_mutex_unlock(&fc.mu);
  dev_exit(d);
  return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------- */
CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  FC_BEGIN(cuEventCreate);
  fc_device_t *d;
  CUresult r = ctx_enter(&d);
  if (r != CUDA_SUCCESS) return r;
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!phEvent || (Flags & ~known) ||
      ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))) {
    dev_exit(d);
    return CUDA_ERROR_INVALID_VALUE;
  }
  gma__event_t ev;
  r = from_sim(d->sim->ops->event_create(d->sim, &ev), CUDA_ERROR_INVALID_VALUE);
  if (r == CUDA_SUCCESS) {
    CUcontext cur = ctx_current();
    fc_event_entry_t e = {.ev = (uintptr_t)ev, .dev = d->ctx.ordinal,
                          .ctx = cur && cur->created ? cur : NULL};
    pthread_mutex_lock(&fc.mu);
    bool ok = vec_insert(&fc.events, &e);
    pthread_mutex_unlock(&fc.mu);
    if (ok) {
      *phEvent = (CUevent)ev;
    } else {
      d->sim->ops->event_destroy(d->sim, ev);
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent) {
  FC_BEGIN(cuEventDestroy);
  fc_device_t *d;
  CUresult r = event_enter("cuEventDestroy", hEvent, &d);
  if (r != CUDA_SUCCESS) return r;
  /* Whoever removes the entry destroys the event, so two racing destroys
   * cannot both reach the sim. */
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.events, (uintptr_t)hEvent);
  if (i != SIZE_MAX) {
    set_free(&((fc_event_entry_t *)vec_at(&fc.events, i))->set);
    vec_remove(&fc.events, i);
  }
  pthread_mutex_unlock(&fc.mu);
  if (i == SIZE_MAX) {
    r = bad_event("cuEventDestroy", hEvent); /* destroyed by another thread meanwhile */
  } else {
    r = from_sim(d->sim->ops->event_destroy(d->sim, (gma__event_t)hEvent),
                 CUDA_ERROR_INVALID_HANDLE);
  }
  dev_exit(d);
  return r;
}

static CUresult event_record(CUevent hEvent, CUstream hStream) {
  fc_device_t *d;
  CUresult r = event_enter("cuEventRecord", hEvent, &d);
  if (r != CUDA_SUCCESS) return r;
  r = stream_on("cuEventRecord", d, hStream, false);
  /* The driver documents CUDA_ERROR_INVALID_HANDLE for an event and a stream
   * of different contexts; on a GPU that leaves the work unordered, so the
   * strict fake treats it as the misuse it is. */
  if (r == CUDA_SUCCESS && stream_ctx_of(hStream, d) != event_ctx_of(hEvent, d)) {
    if (fc_strict(FAKECUDA_STRICT_HANDLES))
      fc_misuse("handles",
                "cuEventRecord: event %p and stream %p belong to different contexts (make the "
                "event in the stream's context: cuStreamGetCtx)",
                (void *)hEvent, (void *)hStream);
    r = CUDA_ERROR_INVALID_HANDLE;
  }
  bool taken = false;
  if (r == CUDA_SUCCESS) r = capture_record(d, hStream, hEvent, &taken);
  if (r == CUDA_SUCCESS && !taken) {
    r = from_sim(d->sim->ops->event_record(d->sim, (gma__event_t)hEvent, (gma_stream_t)hStream),
                 CUDA_ERROR_INVALID_HANDLE);
    if (r == CUDA_SUCCESS) event_uncapture(hEvent);
  }
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  FC_BEGIN(cuEventRecord);
  return event_record(hEvent, hStream);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  FC_BEGIN(cuEventQuery);
  fc_device_t *d;
  CUresult r = event_enter("cuEventQuery", hEvent, &d);
  if (r != CUDA_SUCCESS) return r;
  r = capture_event_check("cuEventQuery", hEvent);
  if (r == CUDA_SUCCESS) r = capture_unsafe("cuEventQuery");
  if (r != CUDA_SUCCESS) {
    dev_exit(d);
    return r;
  }
  bool done = false;
  r = from_sim(d->sim->ops->event_query(d->sim, (gma__event_t)hEvent, &done),
               CUDA_ERROR_INVALID_HANDLE);
  if (r == CUDA_SUCCESS && !done) r = CUDA_ERROR_NOT_READY;
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  FC_BEGIN(cuEventSynchronize);
  fc_device_t *d;
  CUresult r = event_enter("cuEventSynchronize", hEvent, &d);
  if (r != CUDA_SUCCESS) return r;
  r = capture_event_check("cuEventSynchronize", hEvent);
  if (r == CUDA_SUCCESS) r = capture_unsafe("cuEventSynchronize");
  if (r != CUDA_SUCCESS) {
    dev_exit(d);
    return r;
  }
  r = from_sim(d->sim->ops->event_synchronize(d->sim, (gma__event_t)hEvent),
               CUDA_ERROR_INVALID_HANDLE);
  if (r == CUDA_SUCCESS) r = (CUresult)atomic_load(&d->sticky);
  dev_exit(d);
  return r;
}

/* Only waits on an event of the stream's own device are simulated; the real
 * driver also allows other devices' events (see stream_on). */
static CUresult stream_wait_event(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = event_enter("cuStreamWaitEvent", hEvent, &d);
  if (r != CUDA_SUCCESS) return r;
  r = stream_on("cuStreamWaitEvent", d, hStream, true);
  bool taken = false;
  if (r == CUDA_SUCCESS) r = capture_wait(d, hStream, hEvent, &taken);
  if (r == CUDA_SUCCESS && !taken) {
    r = from_sim(
        d->sim->ops->stream_wait_event(d->sim, (gma_stream_t)hStream, (gma__event_t)hEvent),
        CUDA_ERROR_INVALID_HANDLE);
  }
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  FC_BEGIN(cuStreamWaitEvent);
  return stream_wait_event(hStream, hEvent, Flags);
}

/* ---------------------------------------------------------------------------
 * Streams
 * ------------------------------------------------------------------------- */
/* Forgets what the fake keeps of stream s (id sid): its context, and
 * whether it is non-blocking. */
static void stream_forget(CUstream s, uint64_t sid) {
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.stream_ctx, (uintptr_t)s);
  if (i != SIZE_MAX) vec_remove(&fc.stream_ctx, i);
  i = vec_find(&fc.nonblocking, (uintptr_t)sid);
  if (i != SIZE_MAX) vec_remove(&fc.nonblocking, i);
  pthread_mutex_unlock(&fc.mu);
}

/* Notes what the fake keeps of new stream s of the entered device d: the
 * created context current at its creation (a primary context's streams
 * need no entry), and, by its id, whether it is non-blocking (which capture
 * needs: the legacy stream conflicts only with blocking streams' captures). */
static CUresult stream_note(fc_device_t *d, CUstream s, unsigned flags) {
  uint64_t sid;
  CUresult r = stream_sid(d, s, &sid);
  if (r != CUDA_SUCCESS) return r;
  CUcontext cur = ctx_current();
  fc_stream_ctx_t e = {(uintptr_t)s, cur};
  fc_stream_key_t k = {(uintptr_t)sid, d->ctx.ordinal};
  pthread_mutex_lock(&fc.mu);
  bool ok = !cur->created || vec_insert(&fc.stream_ctx, &e);
  bool ok2 = ok && (!(flags & CU_STREAM_NON_BLOCKING) || vec_insert(&fc.nonblocking, &k));
  pthread_mutex_unlock(&fc.mu);
  if (ok && !ok2) stream_forget(s, sid);
  return ok2 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  FC_BEGIN(cuStreamCreate);
  fc_device_t *d;
  CUresult r = ctx_enter(&d);
  if (r != CUDA_SUCCESS) return r;
  if (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) {
    dev_exit(d);
    return CUDA_ERROR_INVALID_VALUE;
  }
  gma_stream_t s;
  r = from_sim(d->sim->ops->stream_create(d->sim, &s), CUDA_ERROR_INVALID_VALUE);
  if (r == CUDA_SUCCESS) {
    r = stream_note(d, (CUstream)s, Flags);
    if (r != CUDA_SUCCESS) d->sim->ops->stream_destroy(d->sim, s);
  }
  if (r == CUDA_SUCCESS) *phStream = (CUstream)s;
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream) {
  FC_BEGIN(cuStreamDestroy);
  if (is_default_stream(hStream)) return CUDA_ERROR_INVALID_HANDLE;
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamDestroy", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  /* A capturing stream is not destroyed: its capture is invalidated. */
  uint64_t sid = 0;
  r = capture_stream_use("cuStreamDestroy", d, hStream);
  if (r == CUDA_SUCCESS) r = stream_sid(d, hStream, &sid);
  if (r == CUDA_SUCCESS)
    r = from_sim(d->sim->ops->stream_destroy(d->sim, (gma_stream_t)hStream),
                 CUDA_ERROR_INVALID_HANDLE);
  if (r == CUDA_SUCCESS) stream_forget(hStream, sid);
  /* A destroy racing with another destroy of the same handle lost. */
  if (r == CUDA_ERROR_INVALID_HANDLE) r = bad_stream("cuStreamDestroy", hStream);
  dev_exit(d);
  return r;
}

static CUresult stream_get_id(CUstream hStream, unsigned long long *streamId) {
  if (!streamId) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamGetId", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  r = capture_stream_check("cuStreamGetId", d, hStream, false);
  if (r != CUDA_SUCCESS) {
    dev_exit(d);
    return r;
  }
  uint64_t id = 0;
  r = from_sim(d->sim->ops->stream_id(d->sim, (gma_stream_t)hStream, &id),
               CUDA_ERROR_INVALID_HANDLE);
  if (r == CUDA_SUCCESS) *streamId = id;
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuStreamGetId(CUstream hStream, unsigned long long *streamId) {
  FC_BEGIN(cuStreamGetId);
  return stream_get_id(hStream, streamId);
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
  FC_BEGIN(cuStreamGetCtx);
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamGetCtx", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  *pctx = stream_ctx_of(hStream, d);
  dev_exit(d);
  return CUDA_SUCCESS;
}

static CUresult stream_synchronize(CUstream hStream) {
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamSynchronize", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  r = capture_stream_use("cuStreamSynchronize", d, hStream);
  if (r == CUDA_SUCCESS) r = capture_unsafe("cuStreamSynchronize");
  if (r != CUDA_SUCCESS) {
    dev_exit(d);
    return r;
  }
  r = from_sim(d->sim->ops->stream_synchronize(d->sim, (gma_stream_t)hStream),
               CUDA_ERROR_INVALID_HANDLE);
  if (r == CUDA_SUCCESS) r = (CUresult)atomic_load(&d->sticky);
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  FC_BEGIN(cuStreamSynchronize);
  return stream_synchronize(hStream);
}

/* Whether the work queued on the stream so far has run: a sim event recorded
 * now and queried (the sim's own calls, so no call counter moves).
 * CUDA_ERROR_NOT_READY while it has not. */
static CUresult stream_query(CUstream hStream) {
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamQuery", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  r = capture_stream_use("cuStreamQuery", d, hStream);
  if (r == CUDA_SUCCESS) r = capture_unsafe("cuStreamQuery");
  gma__device_t *sim = d->sim;
  gma__event_t ev;
  bool done = false;
  if (r == CUDA_SUCCESS) r = from_sim(sim->ops->event_create(sim, &ev), CUDA_ERROR_OUT_OF_MEMORY);
  if (r == CUDA_SUCCESS) {
    r = from_sim(sim->ops->event_record(sim, ev, (gma_stream_t)hStream), CUDA_ERROR_INVALID_HANDLE);
    if (r == CUDA_SUCCESS) r = from_sim(sim->ops->event_query(sim, ev, &done), CUDA_ERROR_INVALID_HANDLE);
    sim->ops->event_destroy(sim, ev);
  }
  if (r == CUDA_SUCCESS) r = (CUresult)atomic_load(&d->sticky);
  if (r == CUDA_SUCCESS && !done) r = CUDA_ERROR_NOT_READY;
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  FC_BEGIN(cuStreamQuery);
  return stream_query(hStream);
}

/* ---------------------------------------------------------------------------
 * Stream-ordered copies and memsets: a heap closure run as a kernel on the
 * stream, which frees it. The range is checked when queued (a clear error at
 * once) and again when the kernel runs, under mem_rw held for reading, so a
 * free of the memory in between cannot pull it away mid-copy: the kernel
 * then finds it gone and sets the device's sticky CUDA_ERROR_ILLEGAL_ADDRESS,
 * as a GPU would fault, instead of crashing the process.
 *
 * Every copy is on fc.inflight from the moment it is queued until it has
 * run, so cuMemFree and cuMemUnmap can tell that memory they are asked to
 * give back is still to be touched by a stream (pending_check), at the call
 * that is wrong rather than at a later sticky fault.
 * ------------------------------------------------------------------------- */
/* fc.mu: every copy queued and not yet finished, on any stream of any device. */
static fc_copy_t *fc_inflight;

static void inflight_add(fc_copy_t *k) {
  k->prev = NULL;
  k->next = fc_inflight;
  if (fc_inflight) fc_inflight->prev = k;
  fc_inflight = k;
}

static void inflight_remove(fc_copy_t *k) {
  *(k->prev ? &k->prev->next : &fc_inflight) = k->next;
  if (k->next) k->next->prev = k->prev;
}

/* Aborts (when strict) if a queued or running copy touches [p, p + n) on
 * device di, which entry is about to give back. Caller holds fc.mem_rw for
 * writing (so no copy is mid-run: a copy on the list has not started) and
 * fc.mu. */
static void pending_check(const char *entry, uintptr_t p, uint64_t n, int di) {
  if (!fc_strict(FAKECUDA_STRICT_PENDING)) return;
  for (const fc_copy_t *k = fc_inflight; k; k = k->next) {
    if (k->dev->ctx.ordinal != di || k->bytes == 0) continue;
    if (k->dptr < p + n && p < k->dptr + k->bytes) {
      fc_misuse("pending",
                "%s(0x%llx, %llu bytes) on device %d: a %s of %llu bytes at 0x%llx queued by %s "
                "on stream %p has not run yet; the memory must not be given back before the "
                "stream work that uses it completed",
                entry, (unsigned long long)p, (unsigned long long)n, di,
                k->kind == FC_MEMSET32 ? "memset" : k->kind == FC_DTOH ? "copy to host"
                                                                        : "copy to device",
                (unsigned long long)k->bytes, (unsigned long long)k->dptr, k->entry,
                (void *)k->stream);
    }
  }
}

/* Runs copy k (queued on its own or as an op of a graph launch) and takes it
 * off fc_inflight. */
static void copy_exec(fc_copy_t *k) {
  pthread_rwlock_rdlock(&fc.mem_rw);
  pthread_mutex_lock(&fc.mu);
  CUresult r = range_check(k->dptr, k->bytes, k->dev->ctx.ordinal);
  pthread_mutex_unlock(&fc.mu);
  if (r == CUDA_SUCCESS) {
    switch (k->kind) {
      case FC_MEMSET32: {
        uint32_t *w = (uint32_t *)k->dptr;
        for (uint64_t i = 0; i < k->bytes / 4; i++) w[i] = k->value;
        break;
      }
      case FC_DTOH:
        memcpy(k->host, (const void *)k->dptr, (size_t)k->bytes);
        break;
      case FC_HTOD:
        memcpy((void *)k->dptr, k->host, (size_t)k->bytes);
        break;
    }
  } else {
    int expected = 0;
    if (atomic_compare_exchange_strong(&k->dev->sticky, &expected, CUDA_ERROR_ILLEGAL_ADDRESS)) {
      fprintf(stderr,
              "fakecuda: device %d: a queued %s of %llu bytes at 0x%llx ran after the memory "
              "stopped being device memory (freed or unmapped while in use); the context is "
              "now faulted (CUDA_ERROR_ILLEGAL_ADDRESS)\n",
              k->dev->ctx.ordinal,
              k->kind == FC_MEMSET32 ? "memset" : k->kind == FC_DTOH ? "copy to host"
                                                                      : "copy to device",
              (unsigned long long)k->bytes, (unsigned long long)k->dptr);
    }
  }
  /* Off the list before mem_rw is released: a free that gets mem_rw next
   * must not see this finished copy as pending. */
  pthread_mutex_lock(&fc.mu);
  inflight_remove(k);
  pthread_mutex_unlock(&fc.mu);
  pthread_rwlock_unlock(&fc.mem_rw);
}

static void copy_kernel(void *arg) {
  copy_exec(arg);
  free(arg);
}

/* True when [p, p + n) lies in one cuMemHostAlloc block; fc.mu held. */
static bool host_is_pinned(const void *p, uint64_t n) {
  for (const fc_host_t *h = fc_hosts; h; h = h->next)
    if ((const char *)p >= (const char *)h->ptr && (const char *)p < (const char *)h->ptr + h->size &&
        n <= h->size - (size_t)((const char *)p - (const char *)h->ptr))
      return true;
  return false;
}

/* Waits, on the calling thread, until the work queued on hStream so far has
 * run: a sim event recorded now and synchronized (the sim's own calls, not
 * the fake's entry points, so no call counter moves). Caller has d entered. */
static CUresult wait_queued(fc_device_t *d, CUstream hStream) {
  gma__device_t *sim = d->sim;
  gma__event_t ev;
  gma_status_t st = sim->ops->event_create(sim, &ev);
  if (st == GMA_OK) {
    st = sim->ops->event_record(sim, ev, (gma_stream_t)hStream);
    if (st == GMA_OK) st = sim->ops->event_synchronize(sim, ev);
    sim->ops->event_destroy(sim, ev);
  }
  if (st != GMA_OK) st = sim->ops->stream_synchronize(sim, (gma_stream_t)hStream);
  return from_sim(st, CUDA_ERROR_INVALID_HANDLE);
}

/* The copy's capture part: on a capturing stream the checked copy becomes a
 * node of the capture (*taken) and does not run; a copy into pageable host
 * memory is then asynchronous like any other captured copy. */
static CUresult copy_capture(const fc_copy_t *tmpl, fc_device_t *d, bool *taken) {
  *taken = false;
  if (!captures_live()) return CUDA_SUCCESS;
  pthread_mutex_lock(&fc.mu);
  CUresult r = range_check(tmpl->dptr, tmpl->bytes, d->ctx.ordinal);
  pthread_mutex_unlock(&fc.mu);
  if (r != CUDA_SUCCESS) {
    *taken = true;
    return r;
  }
  fc_op_t op = {.kind = FC_OP_COPY, .u.copy = *tmpl};
  return capture_ops(tmpl->entry, d, tmpl->stream, &op, 1, taken);
}

/* Queues copy *tmpl on its stream; into pageable host memory it waits for the
 * copy, and is then a potentially unsafe call (a synchronous copy). */
static CUresult copy_queue(const fc_copy_t *tmpl, fc_device_t *d) {
  bool pageable = false;
  if (tmpl->kind == FC_DTOH && tmpl->bytes) {
    pthread_mutex_lock(&fc.mu);
    pageable = !host_is_pinned(tmpl->host, tmpl->bytes);
    pthread_mutex_unlock(&fc.mu);
  }
  CUresult r = pageable ? capture_unsafe(tmpl->entry) : CUDA_SUCCESS;
  if (r != CUDA_SUCCESS) return r;
  fc_copy_t *k = malloc(sizeof *k);
  bool sync = false;
  pthread_mutex_lock(&fc.mu);
  r = range_check(tmpl->dptr, tmpl->bytes, d->ctx.ordinal);
  if (r == CUDA_SUCCESS && !k) r = CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS) {
    *k = *tmpl;
    inflight_add(k);
    /* A copy into pageable host memory is synchronous, as on a GPU. */
    sync = tmpl->kind == FC_DTOH && tmpl->bytes && !host_is_pinned(tmpl->host, tmpl->bytes);
  }
  pthread_mutex_unlock(&fc.mu);
  if (r == CUDA_SUCCESS) {
    r = from_sim(d->sim->ops->sim_launch(d->sim, (gma_stream_t)tmpl->stream, copy_kernel, k),
                 CUDA_ERROR_INVALID_HANDLE);
    if (r != CUDA_SUCCESS) { /* not queued: the sim did not take it */
      pthread_mutex_lock(&fc.mu);
      inflight_remove(k);
      pthread_mutex_unlock(&fc.mu);
    } else {
      k = NULL; /* the kernel frees it */
    }
  }
  free(k);
  if (r == CUDA_SUCCESS && sync) {
    r = wait_queued(d, tmpl->stream);
    if (r == CUDA_SUCCESS) r = (CUresult)atomic_load(&d->sticky);
  }
  return r;
}

static CUresult copy_launch(const char *entry, fc_copy_kind_t kind, CUdeviceptr dptr, void *host,
                            uint64_t bytes, uint32_t value, CUstream hStream) {
  if ((kind != FC_MEMSET32 && !host && bytes) || (kind == FC_MEMSET32 && dptr % 4))
    return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = stream_enter(entry, hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  fc_copy_t tmpl = {kind, d, (uintptr_t)dptr, host, bytes, value, hStream, entry, NULL, NULL};
  bool taken;
  r = copy_capture(&tmpl, d, &taken);
  if (!taken) r = copy_queue(&tmpl, d);
  dev_exit(d);
  return r;
}

/* cuStreamWaitValue32: the stream waits, in stream order, until the 32-bit
 * word at addr satisfies the condition; the host goes on. The fake's kernel
 * polls the word (a device pointer of pinned host memory is its host
 * address here). Only pinned host memory is accepted: what tests hold
 * streams with. */
static void wait_value_exec(const fc_wait_value_t *w) {
  for (;;) {
    uint32_t v = __atomic_load_n(w->word, __ATOMIC_ACQUIRE);
    bool ok = w->op == CU_STREAM_WAIT_VALUE_GEQ ? (int32_t)(v - w->value) >= 0
              : w->op == CU_STREAM_WAIT_VALUE_EQ ? v == w->value
              : w->op == CU_STREAM_WAIT_VALUE_AND ? (v & w->value) != 0
                                                  : ~(v | w->value) != 0;
    if (ok) break;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

static void wait_value_kernel(void *arg) {
  wait_value_exec(arg);
  free(arg);
}

CUresult CUDAAPI cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                     unsigned int flags) {
  FC_BEGIN(cuStreamWaitValue32);
  unsigned op = flags & 0x3u;
  if (addr % 4 || (flags & ~(0x3u | CU_STREAM_WAIT_VALUE_FLUSH))) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamWaitValue32", stream, &d);
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&fc.mu);
  bool pinned = host_is_pinned((const void *)(uintptr_t)addr, 4);
  pthread_mutex_unlock(&fc.mu);
  fc_wait_value_t *w = pinned ? malloc(sizeof *w) : NULL;
  if (!pinned) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (!w) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    *w = (fc_wait_value_t){(volatile uint32_t *)(uintptr_t)addr, value, op};
    fc_op_t cop = {.kind = FC_OP_WAIT_VALUE, .u.wait = *w};
    bool taken;
    r = capture_ops("cuStreamWaitValue32", d, stream, &cop, 1, &taken);
    if (!taken)
      r = from_sim(d->sim->ops->sim_launch(d->sim, (gma_stream_t)stream, wait_value_kernel, w),
                   CUDA_ERROR_INVALID_HANDLE);
    if (r == CUDA_SUCCESS && !taken) w = NULL; /* the kernel frees it */
  }
  free(w);
  dev_exit(d);
  return r;
}

/* cuStreamWriteValue64: the 64-bit word at addr gets value once the work
 * queued on the stream before it has run; the host goes on. Only pinned
 * host memory is accepted (what gma writes), and only where the device says
 * it can (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS). */
static CUresult stream_write_value(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                   unsigned int flags) {
  if (addr % 8 || (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER))
    return CUDA_ERROR_INVALID_VALUE;
  if (!fc.memops) return CUDA_ERROR_NOT_SUPPORTED;
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamWriteValue64", stream, &d);
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&fc.mu);
  bool pinned = host_is_pinned((const void *)(uintptr_t)addr, 8);
  pthread_mutex_unlock(&fc.mu);
  if (!pinned) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else {
    fc_op_t cop = {.kind = FC_OP_WRITE_VALUE,
                   .u.write = {(uint64_t *)(uintptr_t)addr, (uint64_t)value}};
    bool taken;
    r = capture_ops("cuStreamWriteValue64", d, stream, &cop, 1, &taken);
    if (!taken)
      r = from_sim(d->sim->ops->stream_write_value(d->sim, (gma_stream_t)stream, (uintptr_t)addr,
                                                   value),
                   CUDA_ERROR_INVALID_HANDLE);
  }
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                      unsigned int flags) {
  FC_BEGIN(cuStreamWriteValue64);
  return stream_write_value(stream, addr, value, flags);
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                  CUstream hStream) {
  FC_BEGIN(cuMemsetD32Async);
  if (N > UINT64_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
  return copy_launch("cuMemsetD32Async", FC_MEMSET32, dstDevice, NULL, (uint64_t)N * 4, ui,
                     hStream);
}

/* Into memory from cuMemHostAlloc the copy is asynchronous: the host buffer
 * must stay valid until the stream reaches the copy. Into any other
 * (pageable) host memory it returns only once the copy has completed, as the
 * driver does. */
CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream) {
  FC_BEGIN(cuMemcpyDtoHAsync);
  return copy_launch("cuMemcpyDtoHAsync", FC_DTOH, srcDevice, dstHost, ByteCount, 0, hStream);
}

/* Asynchronous whatever the host memory: the source is read when the stream
 * reaches the copy (the driver stages pageable memory at the call, so the
 * fake is stricter: the buffer must stay valid until the copy ran). */
CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                   CUstream hStream) {
  FC_BEGIN(cuMemcpyHtoDAsync);
  return copy_launch("cuMemcpyHtoDAsync", FC_HTOD, dstDevice, (void *)srcHost, ByteCount, 0,
                     hStream);
}

/* ---------------------------------------------------------------------------
 * Virtual memory management
 * ------------------------------------------------------------------------- */
/* Checks an allocation property; *dev gets its device. */
/* A handle type or the RDMA flag the device does not support is refused,
 * as the driver refuses it. */
static CUresult prop_check(const CUmemAllocationProp *prop, int *dev) {
  if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
       prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_INVALID_VALUE;
  if ((prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
       !fc.vmm_posix_fd) ||
      (prop->allocFlags.gpuDirectRDMACapable && !fc.vmm_rdma))
    return CUDA_ERROR_NOT_SUPPORTED;
  if (prop->location.id < 0 || prop->location.id >= fc.ndev) return CUDA_ERROR_INVALID_DEVICE;
  *dev = prop->location.id;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity,
                                               const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
  FC_BEGIN(cuMemGetAllocationGranularity);
  if (!fc.vmm) return CUDA_ERROR_NOT_SUPPORTED;
  int dev;
  CUresult r = prop_check(prop, &dev);
  if (r != CUDA_SUCCESS) return r;
  if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                       option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = (size_t)fc.gran;
  return CUDA_SUCCESS;
}

static bool is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

/* The reservation lives on the current context's device (the sim reserves
 * per device; the real driver's address space is process-wide). The address
 * hint is ignored, as the driver may. */
CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags) {
  FC_BEGIN(cuMemAddressReserve);
  FC_UNSAFE(cuMemAddressReserve);
  (void)addr;
  if (!fc.vmm) return CUDA_ERROR_NOT_SUPPORTED;
  if (!ptr || size == 0 || size % fc.gran || flags != 0 || (alignment && !is_pow2(alignment)))
    return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = ctx_enter(&d);
  if (r != CUDA_SUCCESS) return r;
  uint64_t align = alignment > fc.gran ? alignment : fc.gran;
  uint64_t extra = align > fc.sim_gran ? align - fc.sim_gran : 0;
  uintptr_t base = 0;
  pthread_rwlock_wrlock(&fc.mem_rw);
  r = from_sim(d->sim->ops->vm_reserve(d->sim, size + extra, &base), CUDA_ERROR_INVALID_VALUE);
  if (r == CUDA_SUCCESS) {
    fc_resv_t rec = {(base + align - 1) & ~(uintptr_t)(align - 1), size, d->ctx.ordinal, base,
                     size + extra};
    pthread_mutex_lock(&fc.mu);
    bool ok = vec_insert(&fc.resv, &rec);
    pthread_mutex_unlock(&fc.mu);
    if (ok) {
      *ptr = rec.addr;
    } else {
      d->sim->ops->vm_release(d->sim, base, size + extra);
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  pthread_rwlock_unlock(&fc.mem_rw);
  dev_exit(d);
  return r;
}

/* True when [addr, addr + size) overlaps a range of device memory; fc.mu held. */
static bool ranges_overlap(uintptr_t addr, uint64_t size) {
  size_t i = vec_upper(&fc.ranges, addr);
  if (i > 0) {
    const fc_range_t *p = vec_at(&fc.ranges, i - 1);
    if (p->addr + p->size > addr) return true;
  }
  return i < fc.ranges.n && vec_key(&fc.ranges, i) < addr + size;
}

/* Refused (CUDA_ERROR_INVALID_VALUE) while anything inside is still mapped: a
 * mapping may not outlive its reservation. */
CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FC_BEGIN(cuMemAddressFree);
  FC_UNSAFE(cuMemAddressFree);
  if (!fc.vmm) return CUDA_ERROR_NOT_SUPPORTED;
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.resv, (uintptr_t)ptr);
  int di = i == SIZE_MAX ? -1 : ((fc_resv_t *)vec_at(&fc.resv, i))->dev;
  pthread_mutex_unlock(&fc.mu);
  if (di < 0) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d = &fc.dev[di];
  CUresult r = dev_enter(d, CUDA_ERROR_INVALID_VALUE);
  if (r != CUDA_SUCCESS) return r;
  pthread_rwlock_wrlock(&fc.mem_rw);
  pthread_mutex_lock(&fc.mu);
  i = vec_find(&fc.resv, (uintptr_t)ptr);
  fc_resv_t rec = {0};
  if (i != SIZE_MAX) rec = *(fc_resv_t *)vec_at(&fc.resv, i);
  if (i == SIZE_MAX || rec.dev != di || rec.size != size || ranges_overlap(rec.addr, rec.size)) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else {
    vec_remove(&fc.resv, i);
  }
  pthread_mutex_unlock(&fc.mu);
  if (r == CUDA_SUCCESS && d->sim->ops->vm_release(d->sim, rec.sim_addr, rec.sim_size) != GMA_OK) {
    fprintf(stderr, "fakecuda: cuMemAddressFree(0x%llx): the simulated device refused it\n",
            (unsigned long long)ptr);
    r = CUDA_ERROR_UNKNOWN;
  }
  pthread_rwlock_unlock(&fc.mem_rw);
  dev_exit(d);
  return r;
}

/* Physical memory is held from here (used grows), as on a GPU, though the
 * sim only creates it when it is mapped. The device's primary context must
 * be active: the handle lives with it. */
CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags) {
  FC_BEGIN(cuMemCreate);
  fc_price_bytes(GMA__SIM_COST_VM_MAP, size); /* the VM_MAP line: create, map and access */
  FC_UNSAFE(cuMemCreate);
  if (!fc.vmm) return CUDA_ERROR_NOT_SUPPORTED;
  int di;
  CUresult r = prop_check(prop, &di);
  if (r != CUDA_SUCCESS) return r;
  if (!handle || size == 0 || size % fc.gran || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d = &fc.dev[di];
  r = dev_enter(d, CUDA_ERROR_INVALID_CONTEXT);
  if (r != CUDA_SUCCESS) return r;
  fc_handle_t *h = calloc(1, sizeof *h);
  pthread_mutex_lock(&fc.mu);
  if (!h) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else if (size > d->capacity - d->used) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    *h = (fc_handle_t){.dev = di, .size = size};
    fc_handle_entry_t e = {fc.next_handle, h};
    if (vec_insert(&fc.handles, &e)) {
      fc.next_handle += 2; /* odd, never 0, never reused */
      d->used += size;
      *handle = e.id;
      h = NULL;
      fc.last_create_flags =
          (prop->allocFlags.gpuDirectRDMACapable ? FAKECUDA_CREATE_RDMA : 0u) |
          (prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
               ? FAKECUDA_CREATE_POSIX_FD
               : 0u);
    } else {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  pthread_mutex_unlock(&fc.mu);
  free(h); /* NULL unless it failed */
  dev_exit(d);
  return r;
}

/* Allowed while mapped, as in CUDA: the unmap then frees the memory. */
CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  FC_BEGIN(cuMemRelease);
  FC_UNSAFE(cuMemRelease);
  if (!fc.vmm) return CUDA_ERROR_NOT_SUPPORTED;
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.handles, (uintptr_t)handle);
  fc_handle_t *h = i == SIZE_MAX ? NULL : ((fc_handle_entry_t *)vec_at(&fc.handles, i))->h;
  if (h) {
    vec_remove(&fc.handles, i);
    if (h->mapped_at) {
      h->released = true; /* the mapping's range still points at it */
      h = NULL;
    } else {
      fc.dev[h->dev].used -= h->size;
    }
  }
  pthread_mutex_unlock(&fc.mu);
  free(h);
  return i == SIZE_MAX ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* The device of the reservation holding [p, p + n), or -1; fc.mu held. */
static int resv_device(uintptr_t p, uint64_t n) {
  size_t i = vec_upper(&fc.resv, p);
  if (i == 0) return -1;
  const fc_resv_t *r = vec_at(&fc.resv, i - 1);
  return p - r->addr <= r->size && n <= r->size - (p - r->addr) ? r->dev : -1;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  FC_BEGIN(cuMemMap);
  FC_UNSAFE(cuMemMap);
  if (!fc.vmm) return CUDA_ERROR_NOT_SUPPORTED;
  if (offset != 0 || flags != 0 || size == 0 || size % fc.gran || ptr % fc.gran)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.handles, (uintptr_t)handle);
  int di = i == SIZE_MAX ? -1 : ((fc_handle_entry_t *)vec_at(&fc.handles, i))->h->dev;
  pthread_mutex_unlock(&fc.mu);
  if (di < 0) return CUDA_ERROR_INVALID_HANDLE;
  fc_device_t *d = &fc.dev[di];
  CUresult r = dev_enter(d, CUDA_ERROR_INVALID_HANDLE);
  if (r != CUDA_SUCCESS) return r;
  /* mem_rw held for writing makes check, map and record one step for every
   * other memory operation. */
  pthread_rwlock_wrlock(&fc.mem_rw);
  pthread_mutex_lock(&fc.mu);
  i = vec_find(&fc.handles, (uintptr_t)handle);
  fc_handle_t *h = i == SIZE_MAX ? NULL : ((fc_handle_entry_t *)vec_at(&fc.handles, i))->h;
  if (!h || h->dev != di) {
    r = CUDA_ERROR_INVALID_HANDLE;
  } else if (h->mapped_at) {
    fprintf(stderr, "fakecuda: cuMemMap: handle 0x%llx is already mapped at 0x%llx; the fake "
                    "maps a handle once at a time\n",
            (unsigned long long)handle, (unsigned long long)h->mapped_at);
    r = CUDA_ERROR_NOT_SUPPORTED;
  } else if (size > h->size || resv_device((uintptr_t)ptr, size) != di ||
             ranges_overlap((uintptr_t)ptr, size)) {
    r = CUDA_ERROR_INVALID_VALUE;
  }
  pthread_mutex_unlock(&fc.mu);
  uint64_t simh = 0;
  if (r == CUDA_SUCCESS)
    r = from_sim(d->sim->ops->vm_map(d->sim, (uintptr_t)ptr, size, &simh),
                 CUDA_ERROR_INVALID_VALUE);
  if (r == CUDA_SUCCESS) {
    fc_range_t rec = {.addr = (uintptr_t)ptr, .size = size, .dev = di, .map = true, .h = h,
                      .simh = simh};
    pthread_mutex_lock(&fc.mu);
    bool ok = vec_insert(&fc.ranges, &rec);
    if (ok) h->mapped_at = (uintptr_t)ptr;
    pthread_mutex_unlock(&fc.mu);
    if (!ok) {
      d->sim->ops->vm_unmap(d->sim, (uintptr_t)ptr, size, simh);
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  pthread_rwlock_unlock(&fc.mem_rw);
  dev_exit(d);
  return r;
}

/* The mappings exactly covering [p, p + n) of device di (consecutive,
 * adjacent), as the index of the first and a count; false when the range
 * cuts a mapping or has a hole. fc.mu held. */
static bool mapped_span(uintptr_t p, uint64_t n, int di, size_t *first, size_t *count) {
  size_t i = vec_find(&fc.ranges, p);
  if (i == SIZE_MAX || n == 0 || p + n < p) return false;
  *first = i;
  for (uintptr_t cur = p; cur < p + n; i++) {
    if (i == fc.ranges.n) return false;
    const fc_range_t *r = vec_at(&fc.ranges, i);
    if (!r->map || r->dev != di || r->addr != cur || r->size > p + n - cur) return false;
    cur += r->size;
  }
  *count = i - *first;
  return true;
}

/* Unmaps whole mappings (one or several adjacent ones); the memory of a
 * released handle is freed. */
CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FC_BEGIN(cuMemUnmap);
  fc_price_bytes(GMA__SIM_COST_VM_UNMAP, size);
  FC_UNSAFE(cuMemUnmap);
  if (!fc.vmm) return CUDA_ERROR_NOT_SUPPORTED;
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.ranges, (uintptr_t)ptr);
  const fc_range_t *first = i == SIZE_MAX ? NULL : vec_at(&fc.ranges, i);
  int di = first && first->map ? first->dev : -1;
  pthread_mutex_unlock(&fc.mu);
  if (di < 0) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d = &fc.dev[di];
  CUresult r = dev_enter(d, CUDA_ERROR_INVALID_VALUE);
  if (r != CUDA_SUCCESS) return r;
  pthread_rwlock_wrlock(&fc.mem_rw);
  pthread_mutex_lock(&fc.mu);
  size_t at = 0, n = 0;
  fc_range_t *gone = NULL;
  if (!mapped_span((uintptr_t)ptr, size, di, &at, &n)) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (!(gone = malloc(n * sizeof *gone))) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    pending_check("cuMemUnmap", (uintptr_t)ptr, size, di);
    memcpy(gone, vec_at(&fc.ranges, at), n * sizeof *gone);
    for (size_t k = 0; k < n; k++) vec_remove(&fc.ranges, at);
  }
  pthread_mutex_unlock(&fc.mu);
  for (size_t k = 0; k < n && gone; k++) {
    if (d->sim->ops->vm_unmap(d->sim, gone[k].addr, gone[k].size, gone[k].simh) != GMA_OK) {
      fprintf(stderr, "fakecuda: cuMemUnmap(0x%llx): the simulated device refused it\n",
              (unsigned long long)gone[k].addr);
      r = CUDA_ERROR_UNKNOWN;
    }
  }
  pthread_mutex_lock(&fc.mu);
  for (size_t k = 0; k < n && gone; k++) {
    fc_handle_t *h = gone[k].h;
    h->mapped_at = 0;
    if (h->released) {
      d->used -= h->size;
      free(h);
    }
  }
  pthread_mutex_unlock(&fc.mu);
  free(gone);
  pthread_rwlock_unlock(&fc.mem_rw);
  dev_exit(d);
  return r;
}

/* The range must be exactly covered by mappings; the access flag recorded is
 * the one given for the mappings' own device. */
CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                size_t count) {
  FC_BEGIN(cuMemSetAccess);
  FC_UNSAFE(cuMemSetAccess);
  if (!fc.vmm) return CUDA_ERROR_NOT_SUPPORTED;
  if (!desc || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t k = 0; k < count; k++) {
    if (desc[k].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[k].location.id < 0 || desc[k].location.id >= fc.ndev) return CUDA_ERROR_INVALID_DEVICE;
    if (desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
        desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.ranges, (uintptr_t)ptr);
  int di = i == SIZE_MAX ? -1 : ((fc_range_t *)vec_at(&fc.ranges, i))->dev;
  size_t at = 0, n = 0;
  if (di < 0 || !mapped_span((uintptr_t)ptr, size, di, &at, &n)) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else {
    for (size_t k = 0; k < count; k++) {
      if (desc[k].location.id != di) continue; /* peer access: not simulated */
      for (size_t j = at; j < at + n; j++)
        ((fc_range_t *)vec_at(&fc.ranges, j))->access =
            desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
  }
  pthread_mutex_unlock(&fc.mu);
  return r;
}

/* ---------------------------------------------------------------------------
 * Stream capture: entry points, graphs and their launches (the state and the
 * rules are above, under "Stream capture: state and rules").
 * ------------------------------------------------------------------------- */
static CUresult stream_begin_capture(CUstream hStream, CUstreamCaptureMode mode) {
  if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamBeginCapture", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  uint64_t sid = 0;
  if (is_legacy(hStream)) {
    r = capture_violation(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                          "cuStreamBeginCapture: capture on the legacy stream (%s) is not "
                          "supported",
                          legacy_name(hStream));
  } else {
    r = stream_sid(d, hStream, &sid);
  }
  fc_capture_t *c = r == CUDA_SUCCESS ? calloc(1, sizeof *c) : NULL;
  CUgraph g = c ? calloc(1, sizeof *g) : NULL;
  if (r == CUDA_SUCCESS && !g) r = CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&fc.mu);
    if (cap_stream_find(sid)) {
      r = CUDA_ERROR_ILLEGAL_STATE; /* already capturing */
    } else {
      g->dev = d->ctx.ordinal;
      *c = (fc_capture_t){.id = fc.next_capture_id, .dev = d->ctx.ordinal, .origin = sid,
                          .origin_handle = hStream, .mode = mode, .thread = thread_serial(),
                          .graph = g, .next = fc.captures};
      if (cap_stream_add(sid, hStream, d->ctx.ordinal, c, NULL)) {
        fc.next_capture_id++;
        fc.captures = c;
        atomic_fetch_add_explicit(&fc_live_captures, 1, memory_order_relaxed);
        c = NULL;
        g = NULL;
      } else {
        r = CUDA_ERROR_OUT_OF_MEMORY;
      }
    }
    pthread_mutex_unlock(&fc.mu);
  }
  free(g);
  free(c);
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode) {
  FC_BEGIN(cuStreamBeginCapture);
  return stream_begin_capture(hStream, mode);
}

/* Marks the nodes of set and every node they depend on, directly or not
 * (iteratively: a long capture is a long chain); false when out of host
 * memory. fc.mu held. */
static bool mark_ancestors(const fc_nodeset_t *set) {
  fc_nodeset_t todo = {0};
  bool ok = set_assign(&todo, set);
  while (ok && todo.n > 0) {
    CUgraphNode n = todo.v[--todo.n];
    if (n->mark) continue;
    n->mark = true;
    ok = set_reserve(&todo, todo.n + n->ndeps);
    if (ok && n->ndeps) { /* deps is NULL when there are none */
      memcpy(todo.v + todo.n, n->deps, n->ndeps * sizeof *n->deps);
      todo.n += n->ndeps;
    }
  }
  set_free(&todo);
  return ok;
}

/* Whether every stream of capture c rejoined its origin: the last work
 * captured on each (its dependency set) is waited on by the origin's.
 * CUDA_SUCCESS, CUDA_ERROR_STREAM_CAPTURE_UNJOINED, or out of memory.
 * fc.mu held. */
static CUresult capture_joined(const fc_capture_t *c, const fc_cap_stream_t *origin) {
  bool joined = true;
  bool ok = mark_ancestors(&origin->deps);
  for (size_t i = 0; ok && i < fc.cap_streams.n && joined; i++) {
    const fc_cap_stream_t *rec = ((fc_cap_stream_entry_t *)vec_at(&fc.cap_streams, i))->rec;
    if (rec->cap != c) continue;
    for (size_t k = 0; k < rec->deps.n && joined; k++) joined = rec->deps.v[k]->mark;
  }
  for (size_t i = 0; i < c->graph->n; i++) c->graph->nodes[i]->mark = false;
  if (!ok) return CUDA_ERROR_OUT_OF_MEMORY;
  return joined ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
}

/* Ends capture c from its origin stream (origin: its record): the graph
 * when it was valid and joined, else the error and no graph. fc.mu held. */
static CUresult capture_finish(fc_capture_t *c, const fc_cap_stream_t *origin, CUgraph *out) {
  CUresult r = c->invalidated_by ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                 : capture_joined(c, origin);
  if (r == CUDA_SUCCESS) {
    fc_stream_key_t k = {(uintptr_t)c->graph, c->dev};
    if (!vec_insert(&fc.graphs, &k)) r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    *out = c->graph;
  } else {
    graph_free(c->graph);
    *out = NULL;
  }
  capture_end(c);
  return r;
}

static CUresult stream_end_capture(CUstream hStream, CUgraph *phGraph) {
  if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamEndCapture", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  uint64_t sid = 0;
  r = stream_sid(d, hStream, &sid);
  pthread_mutex_lock(&fc.mu);
  fc_cap_stream_t *rec = r == CUDA_SUCCESS ? cap_stream_find(sid) : NULL;
  fc_capture_t *c = rec ? rec->cap : NULL;
  if (r != CUDA_SUCCESS) {
    /* answered */
  } else if (!c) {
    r = CUDA_ERROR_ILLEGAL_STATE; /* not capturing */
  } else if (c->origin != sid) {
    capture_invalidate(c, "cuStreamEndCapture");
    r = capture_violation(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
                          "cuStreamEndCapture: stream %p joined capture %llu but did not begin "
                          "it (stream %p did); the capture is invalidated",
                          (void *)hStream, (unsigned long long)c->id, (void *)c->origin_handle);
  } else if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != thread_serial()) {
    r = capture_violation(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                          "cuStreamEndCapture: capture %llu on stream %p was begun in %s mode by "
                          "another thread, which must end it",
                          (unsigned long long)c->id, (void *)hStream, mode_name(c->mode));
  } else {
    r = capture_finish(c, rec, phGraph);
  }
  pthread_mutex_unlock(&fc.mu);
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  FC_BEGIN(cuStreamEndCapture);
  return stream_end_capture(hStream, phGraph);
}

/* What cuStreamIsCapturing and cuStreamGetCaptureInfo report. */
typedef struct fc_capture_info {
  CUstreamCaptureStatus status;
  cuuint64_t id;
  CUgraph graph;
  const CUgraphNode *deps;
  const CUgraphEdgeData *edges;
  size_t ndeps;
} fc_capture_info_t;

/* Fills *info for stream s of the entered device d; the arrays stay valid
 * until the next call on the stream, as documented. The legacy stream while
 * a blocking stream captures gets CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, and the
 * capture stays valid. Only an active capture's data is reported; otherwise
 * it reads 0. fc.mu taken. */
static CUresult capture_info(const char *entry, fc_device_t *d, CUstream s,
                             fc_capture_info_t *info) {
  *info = (fc_capture_info_t){CU_STREAM_CAPTURE_STATUS_NONE, 0, NULL, NULL, NULL, 0};
  uint64_t sid;
  CUresult r = stream_sid(d, s, &sid);
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&fc.mu);
  r = capture_implicit(entry, d, s, false);
  fc_cap_stream_t *rec = r == CUDA_SUCCESS ? cap_stream_find(sid) : NULL;
  if (rec && rec->cap->invalidated_by) {
    info->status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  } else if (rec) {
    if (rec->edges_cap < rec->deps.n) { /* default edges: all zero */
      CUgraphEdgeData *e = calloc(rec->deps.n, sizeof *e);
      if (e) {
        free(rec->edges);
        rec->edges = e;
        rec->edges_cap = rec->deps.n;
      }
    }
    if (rec->edges_cap >= rec->deps.n) {
      *info = (fc_capture_info_t){CU_STREAM_CAPTURE_STATUS_ACTIVE, rec->cap->id, rec->cap->graph,
                                  rec->deps.v, rec->edges, rec->deps.n};
    } else {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  pthread_mutex_unlock(&fc.mu);
  return r;
}

static CUresult stream_is_capturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  if (!captureStatus) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamIsCapturing", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  fc_capture_info_t info;
  r = capture_info("cuStreamIsCapturing", d, hStream, &info);
  if (r == CUDA_SUCCESS) *captureStatus = info.status;
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  FC_BEGIN(cuStreamIsCapturing);
  return stream_is_capturing(hStream, captureStatus);
}

/* Both ABIs of cuStreamGetCaptureInfo: v3 has the edge data (edges_out
 * non-NULL needs deps_out too), v2 has not (v3 = false). */
static CUresult stream_get_capture_info(CUstream hStream, CUstreamCaptureStatus *status_out,
                                        cuuint64_t *id_out, CUgraph *graph_out,
                                        const CUgraphNode **deps_out,
                                        const CUgraphEdgeData **edges_out, size_t *num_out) {
  if (!status_out || (edges_out && !deps_out)) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = stream_enter("cuStreamGetCaptureInfo", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  fc_capture_info_t info;
  r = capture_info("cuStreamGetCaptureInfo", d, hStream, &info);
  if (r == CUDA_SUCCESS) {
    *status_out = info.status;
    if (id_out) *id_out = info.id;
    if (graph_out) *graph_out = info.graph;
    if (deps_out) *deps_out = info.deps;
    if (edges_out) *edges_out = info.edges;
    if (num_out) *num_out = info.ndeps;
  }
  dev_exit(d);
  return r;
}

/* cuda.h's cuStreamGetCaptureInfo is the v3 ABI (CUDA 12.3). */
CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                        cuuint64_t *id_out, CUgraph *graph_out,
                                        const CUgraphNode **dependencies_out,
                                        const CUgraphEdgeData **edgeData_out,
                                        size_t *numDependencies_out) {
  FC_BEGIN(cuStreamGetCaptureInfo);
  return stream_get_capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out,
                                 edgeData_out, numDependencies_out);
}

/* The v2 ABI (CUDA 11.3 to 12.2), which cuGetProcAddress gives for a
 * cudaVersion below 12030. */
static CUresult CUDAAPI fc_stream_get_capture_info_v2(CUstream hStream,
                                                      CUstreamCaptureStatus *captureStatus_out,
                                                      cuuint64_t *id_out, CUgraph *graph_out,
                                                      const CUgraphNode **dependencies_out,
                                                      size_t *numDependencies_out) {
  FC_BEGIN(cuStreamGetCaptureInfo);
  return stream_get_capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out,
                                 NULL, numDependencies_out);
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  FC_BEGIN(cuThreadExchangeStreamCaptureMode);
  if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = tls_capture_mode;
  tls_capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

/* Whether key is in table (fc.graphs or fc.execs); fc.mu held. */
static bool key_live(const fc_vec_t *table, const void *key) {
  return vec_find(table, (uintptr_t)key) != SIZE_MAX;
}

/* Flags that change nothing for the graphs the fake captures (no memory
 * nodes, one priority) are accepted; upload and device launch are not
 * simulated. */
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                    unsigned long long flags) {
  FC_BEGIN(cuGraphInstantiate);
  const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                   CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if (!phGraphExec || (flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  CUgraphExec x = calloc(1, sizeof *x);
  if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&fc.mu);
  if (!key_live(&fc.graphs, hGraph)) {
    r = CUDA_ERROR_INVALID_HANDLE;
  } else {
    x->dev = hGraph->dev;
    x->epoch = fc.dev[x->dev].epoch;
    x->n = hGraph->n;
    x->ops = x->n ? malloc(x->n * sizeof *x->ops) : NULL;
    fc_stream_key_t k = {(uintptr_t)x, x->dev};
    if ((x->n && !x->ops) || !vec_insert(&fc.execs, &k)) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      for (size_t i = 0; i < x->n; i++) x->ops[i] = hGraph->nodes[i]->op;
    }
  }
  pthread_mutex_unlock(&fc.mu);
  if (r != CUDA_SUCCESS) {
    free(x->ops);
    free(x);
    if (r == CUDA_ERROR_INVALID_HANDLE) r = bad_handle("cuGraphInstantiate", "graph", "cuGraphDestroy", hGraph);
    return r;
  }
  *phGraphExec = x;
  return CUDA_SUCCESS;
}

/* One graph launch: copies of the executable graph's ops, run in order by
 * one kernel on the launch stream (a valid schedule: capture order respects
 * every dependency), so an event recorded after the launch completes only
 * once all of it ran. It owns what it needs, so the graph and the executable
 * graph may be destroyed while it is queued. */
typedef struct fc_run {
  size_t n;
  fc_op_t ops[];
} fc_run_t;

static void copy_exec(fc_copy_t *k);
static void wait_value_exec(const fc_wait_value_t *w);

static void run_kernel(void *arg) {
  fc_run_t *run = arg;
  for (size_t i = 0; i < run->n; i++) {
    fc_op_t *op = &run->ops[i];
    switch (op->kind) {
      case FC_OP_KERNEL: op->u.kernel.fn(op->u.kernel.arg); break;
      case FC_OP_COPY: copy_exec(&op->u.copy); break;
      case FC_OP_WAIT_VALUE: wait_value_exec(&op->u.wait); break;
      case FC_OP_WRITE_VALUE:
        __atomic_store_n(op->u.write.word, op->u.write.value, __ATOMIC_RELEASE);
        break;
    }
  }
  free(run);
}

/* A copy of executable graph x's ops for a launch on stream s, or an error:
 * x not live, made before its device's reset, or of another device than d. */
static CUresult run_make(CUgraphExec x, fc_device_t *d, CUstream s, fc_run_t **out) {
  CUresult r = CUDA_SUCCESS;
  fc_run_t *run = NULL;
  pthread_mutex_lock(&fc.mu);
  if (!key_live(&fc.execs, x) || x->epoch != fc.dev[x->dev].epoch) {
    r = CUDA_ERROR_INVALID_HANDLE;
  } else if (x->dev != d->ctx.ordinal) {
    r = CUDA_ERROR_INVALID_VALUE; /* a stream of another device than the graph's */
  } else if (!(run = malloc(sizeof *run + x->n * sizeof(fc_op_t)))) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    run->n = x->n;
    if (x->n) memcpy(run->ops, x->ops, x->n * sizeof(fc_op_t)); /* ops is NULL when empty */
    for (size_t i = 0; i < run->n; i++)
      if (run->ops[i].kind == FC_OP_COPY) run->ops[i].u.copy.stream = s;
  }
  pthread_mutex_unlock(&fc.mu);
  if (r == CUDA_ERROR_INVALID_HANDLE)
    r = bad_handle("cuGraphLaunch", "executable graph", "cuGraphExecDestroy or its context's reset",
                   x);
  *out = run;
  return r;
}

static void inflight_add(fc_copy_t *k);
static void inflight_remove(fc_copy_t *k);

/* Puts every copy of run on fc_inflight (add) or takes them off. */
static void run_inflight(fc_run_t *run, bool add) {
  pthread_mutex_lock(&fc.mu);
  for (size_t i = 0; i < run->n; i++) {
    if (run->ops[i].kind != FC_OP_COPY) continue;
    if (add) {
      inflight_add(&run->ops[i].u.copy);
    } else {
      inflight_remove(&run->ops[i].u.copy);
    }
  }
  pthread_mutex_unlock(&fc.mu);
}

/* On a capturing stream the graph's ops are captured, in order, as nodes of
 * the capture (a child graph flattened). */
static CUresult graph_launch(CUgraphExec hGraphExec, CUstream hStream) {
  fc_device_t *d;
  CUresult r = stream_enter("cuGraphLaunch", hStream, &d);
  if (r != CUDA_SUCCESS) return r;
  fc_run_t *run = NULL;
  r = run_make(hGraphExec, d, hStream, &run);
  bool taken = false;
  if (r == CUDA_SUCCESS) r = capture_ops("cuGraphLaunch", d, hStream, run->ops, run->n, &taken);
  if (r == CUDA_SUCCESS && !taken) {
    run_inflight(run, true);
    r = from_sim(d->sim->ops->sim_launch(d->sim, (gma_stream_t)hStream, run_kernel, run),
                 CUDA_ERROR_INVALID_HANDLE);
    if (r == CUDA_SUCCESS) {
      run = NULL; /* the kernel frees it */
    } else {
      run_inflight(run, false);
    }
  }
  free(run);
  dev_exit(d);
  return r;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  FC_BEGIN(cuGraphLaunch);
  return graph_launch(hGraphExec, hStream);
}

/* Legal while a launch of it is queued or running: the launch has its own
 * copy of the ops. */
CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  FC_BEGIN(cuGraphExecDestroy);
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.execs, (uintptr_t)hGraphExec);
  if (i != SIZE_MAX) vec_remove(&fc.execs, i);
  pthread_mutex_unlock(&fc.mu);
  if (i == SIZE_MAX) return bad_handle("cuGraphExecDestroy", "executable graph", "cuGraphExecDestroy", hGraphExec);
  free(hGraphExec->ops);
  free(hGraphExec);
  return CUDA_SUCCESS;
}

/* Legal while an executable graph made from it lives or runs. A graph still
 * being captured is not the caller's to destroy (it is not in fc.graphs). */
CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  FC_BEGIN(cuGraphDestroy);
  pthread_mutex_lock(&fc.mu);
  size_t i = vec_find(&fc.graphs, (uintptr_t)hGraph);
  if (i != SIZE_MAX) vec_remove(&fc.graphs, i);
  pthread_mutex_unlock(&fc.mu);
  if (i == SIZE_MAX) return bad_handle("cuGraphDestroy", "graph", "cuGraphDestroy", hGraph);
  graph_free(hGraph);
  return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------------------
 * Per-thread-default-stream variants (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_
 * STREAM): the NULL stream means the calling thread's own default stream.
 * ------------------------------------------------------------------------- */
static CUstream ptds(CUstream s) { return s ? s : CU_STREAM_PER_THREAD; }

static CUresult CUDAAPI fc_event_record_ptsz(CUevent e, CUstream s) {
  FC_BEGIN(cuEventRecord);
  return event_record(e, ptds(s));
}
static CUresult CUDAAPI fc_stream_wait_event_ptsz(CUstream s, CUevent e, unsigned int f) {
  FC_BEGIN(cuStreamWaitEvent);
  return stream_wait_event(ptds(s), e, f);
}
static CUresult CUDAAPI fc_stream_get_id_ptsz(CUstream s, unsigned long long *id) {
  FC_BEGIN(cuStreamGetId);
  return stream_get_id(ptds(s), id);
}
static CUresult CUDAAPI fc_stream_synchronize_ptsz(CUstream s) {
  FC_BEGIN(cuStreamSynchronize);
  return stream_synchronize(ptds(s));
}
static CUresult CUDAAPI fc_stream_write_value_ptsz(CUstream s, CUdeviceptr a, cuuint64_t v,
                                                   unsigned int f) {
  FC_BEGIN(cuStreamWriteValue64);
  return stream_write_value(ptds(s), a, v, f);
}
static CUresult CUDAAPI fc_stream_query_ptsz(CUstream s) {
  FC_BEGIN(cuStreamQuery);
  return stream_query(ptds(s));
}
static CUresult CUDAAPI fc_stream_begin_capture_ptsz(CUstream s, CUstreamCaptureMode mode) {
  FC_BEGIN(cuStreamBeginCapture);
  return stream_begin_capture(ptds(s), mode);
}
static CUresult CUDAAPI fc_stream_end_capture_ptsz(CUstream s, CUgraph *g) {
  FC_BEGIN(cuStreamEndCapture);
  return stream_end_capture(ptds(s), g);
}
static CUresult CUDAAPI fc_stream_is_capturing_ptsz(CUstream s, CUstreamCaptureStatus *st) {
  FC_BEGIN(cuStreamIsCapturing);
  return stream_is_capturing(ptds(s), st);
}
static CUresult CUDAAPI fc_stream_get_capture_info_ptsz(CUstream s, CUstreamCaptureStatus *st,
                                                        cuuint64_t *id, CUgraph *g,
                                                        const CUgraphNode **deps,
                                                        const CUgraphEdgeData **edges,
                                                        size_t *n) {
  FC_BEGIN(cuStreamGetCaptureInfo);
  return stream_get_capture_info(ptds(s), st, id, g, deps, edges, n);
}
static CUresult CUDAAPI fc_stream_get_capture_info_v2_ptsz(CUstream s, CUstreamCaptureStatus *st,
                                                           cuuint64_t *id, CUgraph *g,
                                                           const CUgraphNode **deps, size_t *n) {
  FC_BEGIN(cuStreamGetCaptureInfo);
  return stream_get_capture_info(ptds(s), st, id, g, deps, NULL, n);
}
static CUresult CUDAAPI fc_graph_launch_ptsz(CUgraphExec x, CUstream s) {
  FC_BEGIN(cuGraphLaunch);
  return graph_launch(x, ptds(s));
}
static CUresult CUDAAPI fc_memset_d32_async_ptsz(CUdeviceptr d, unsigned int v, size_t n,
                                                 CUstream s) {
  FC_BEGIN(cuMemsetD32Async);
  if (n > UINT64_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
  return copy_launch("cuMemsetD32Async", FC_MEMSET32, d, NULL, (uint64_t)n * 4, v, ptds(s));
}
static CUresult CUDAAPI fc_memcpy_dtoh_async_ptsz(void *h, CUdeviceptr d, size_t n, CUstream s) {
  FC_BEGIN(cuMemcpyDtoHAsync);
  return copy_launch("cuMemcpyDtoHAsync", FC_DTOH, d, h, n, 0, ptds(s));
}
static CUresult CUDAAPI fc_memcpy_htod_async_ptsz(CUdeviceptr d, const void *h, size_t n,
                                                  CUstream s) {
  FC_BEGIN(cuMemcpyHtoDAsync);
  return copy_launch("cuMemcpyHtoDAsync", FC_HTOD, d, (void *)h, n, 0, ptds(s));
}

/* ---------------------------------------------------------------------------
 * cuGetProcAddress
 * ------------------------------------------------------------------------- */
FC_API CUresult CUDAAPI fc_get_proc_address_v1(const char *symbol, void **pfn, int cudaVersion,
                                               cuuint64_t flags) __asm__("cuGetProcAddress");

typedef struct fc_entry {
  const char *name;
  void *fn; /* the address cuda.h's macros make of the name: cuMemAlloc -> cuMemAlloc_v2 */
} fc_entry_t;

static const fc_entry_t fc_entries[FC_NUM_ENTRIES] = {
#define FC_TABLE_(name) {#name, (void *)name},
    FC_ALL_ENTRIES(FC_TABLE_)
#undef FC_TABLE_
};

/* The CUDA version that introduced the variant the fake implements: asking
 * with an older cudaVersion gets CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
 * as the driver answers for a variant it does not have for that version. */
static int entry_min_version(int e) {
  switch (e) {
    case FC_cuGetProcAddress: return 11030;
    case FC_cuStreamGetId: return 12000;
    case FC_cuCtxCreate: return 12050; /* the _v4 signature */
    case FC_cuStreamWaitValue32:
    case FC_cuStreamWriteValue64: return 11070; /* the _v2 entry points */
    case FC_cuStreamGetCtx: return 9020;
    case FC_cuGraphInstantiate: return 12000; /* the WithFlags signature the name has since 12.0 */
    case FC_cuStreamGetCaptureInfo: return 11030; /* v2 below 12030, v3 from it */
    case FC_cuStreamBeginCapture:
    case FC_cuThreadExchangeStreamCaptureMode: return 10010; /* the _v2 mode argument */
    case FC_cuStreamEndCapture:
    case FC_cuStreamIsCapturing:
    case FC_cuGraphLaunch:
    case FC_cuGraphExecDestroy:
    case FC_cuGraphDestroy: return 10000;
    case FC_cuCtxDestroy: return 4000;
    case FC_cuDevicePrimaryCtxRelease: return 11000;
    case FC_cuMemGetAllocationGranularity:
    case FC_cuMemAddressReserve:
    case FC_cuMemAddressFree:
    case FC_cuMemCreate:
    case FC_cuMemRelease:
    case FC_cuMemMap:
    case FC_cuMemUnmap:
    case FC_cuMemSetAccess: return 10020;
    case FC_cuDevicePrimaryCtxRetain: return 7000;
    case FC_cuGetErrorName:
    case FC_cuGetErrorString: return 6000;
    case FC_cuCtxPushCurrent:
    case FC_cuCtxPopCurrent:
    case FC_cuCtxSetCurrent:
    case FC_cuStreamDestroy:
    case FC_cuEventDestroy: return 4000;
    case FC_cuMemAlloc:
    case FC_cuMemFree:
    case FC_cuMemGetInfo:
    case FC_cuMemsetD32Async:
    case FC_cuMemcpyDtoHAsync:
    case FC_cuMemcpyHtoDAsync: return 3020;
    default: return 2000;
  }
}

static void *entry_ptsz(int e) {
  switch (e) {
    case FC_cuEventRecord: return (void *)fc_event_record_ptsz;
    case FC_cuStreamWaitEvent: return (void *)fc_stream_wait_event_ptsz;
    case FC_cuStreamGetId: return (void *)fc_stream_get_id_ptsz;
    case FC_cuStreamSynchronize: return (void *)fc_stream_synchronize_ptsz;
    case FC_cuStreamWriteValue64: return (void *)fc_stream_write_value_ptsz;
    case FC_cuMemsetD32Async: return (void *)fc_memset_d32_async_ptsz;
    case FC_cuMemcpyDtoHAsync: return (void *)fc_memcpy_dtoh_async_ptsz;
    case FC_cuMemcpyHtoDAsync: return (void *)fc_memcpy_htod_async_ptsz;
    case FC_cuStreamQuery: return (void *)fc_stream_query_ptsz;
    case FC_cuStreamBeginCapture: return (void *)fc_stream_begin_capture_ptsz;
    case FC_cuStreamEndCapture: return (void *)fc_stream_end_capture_ptsz;
    case FC_cuStreamIsCapturing: return (void *)fc_stream_is_capturing_ptsz;
    case FC_cuStreamGetCaptureInfo: return (void *)fc_stream_get_capture_info_ptsz;
    case FC_cuGraphLaunch: return (void *)fc_graph_launch_ptsz;
    default: return NULL;
  }
}

static int entry_index(const char *name) {
  for (int e = 0; name && e < FC_NUM_ENTRIES; e++)
    if (strcmp(fc_entries[e].name, name) == 0) return e;
  return -1;
}

/* Works before cuInit, as the driver's does (that is how cuInit is found). */
static CUresult get_proc_address(const char *symbol, void **pfn, int cudaVersion,
                                 cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
  const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if (!symbol || !pfn || (flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  *pfn = NULL;
  int e = entry_index(symbol);
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  if (e < 0) {
    st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  } else if (cudaVersion < entry_min_version(e)) {
    st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  } else if (e == FC_cuGetProcAddress && cudaVersion < 12000) {
    *pfn = (void *)fc_get_proc_address_v1; /* the 4-argument form */
  } else if (e == FC_cuStreamGetCaptureInfo && cudaVersion < 12030) {
    /* The v2 ABI (no edge data), as the driver answers an older caller. */
    *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
               ? (void *)fc_stream_get_capture_info_v2_ptsz
               : (void *)fc_stream_get_capture_info_v2;
  } else {
    void *p = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? entry_ptsz(e) : NULL;
    *pfn = p ? p : fc_entries[e].fn;
  }
  if (status) *status = st;
  return st == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                  cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus) {
  CUresult fr;
  if (fc_enter(FC_cuGetProcAddress, &fr)) return fr;
  return get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

FC_API CUresult CUDAAPI fc_get_proc_address_v1(const char *symbol, void **pfn, int cudaVersion,
                                               cuuint64_t flags) {
  CUresult fr;
  if (fc_enter(FC_cuGetProcAddress, &fr)) return fr;
  return get_proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

/* ---------------------------------------------------------------------------
 * Test controls (fakecuda.h)
 * ------------------------------------------------------------------------- */
FC_API int fakecuda_fail(const char *entry, unsigned long long nth, CUresult result) {
  int e = entry_index(entry);
  if (e < 0 || nth == 0) return -1;
  pthread_mutex_lock(&fault_mu);
  int rc = 0;
  if (nfaults == capfaults) {
    size_t ncap = capfaults ? capfaults * 2 : 8;
    fc_fault_t *nf = realloc(faults, ncap * sizeof *nf);
    if (nf) {
      faults = nf;
      capfaults = ncap;
    } else {
      rc = -1;
    }
  }
  if (rc == 0) {
    unsigned long long now = atomic_load_explicit(&fc_calls[e], memory_order_relaxed);
    faults[nfaults++] = (fc_fault_t){e, now + nth, result};
    atomic_store_explicit(&faults_armed, nfaults, memory_order_relaxed);
  }
  pthread_mutex_unlock(&fault_mu);
  return rc;
}

FC_API void fakecuda_clear_faults(void) {
  pthread_mutex_lock(&fault_mu);
  nfaults = 0;
  atomic_store_explicit(&faults_armed, 0, memory_order_relaxed);
  pthread_mutex_unlock(&fault_mu);
}

FC_API unsigned long long fakecuda_calls(const char *entry) {
  if (entry && strcmp(entry, "*") == 0) { /* every entry point together */
    unsigned long long total = 0;
    for (int e = 0; e < FC_NUM_ENTRIES; e++)
      total += atomic_load_explicit(&fc_calls[e], memory_order_relaxed);
    return total;
  }
  int e = entry_index(entry);
  return e < 0 ? 0 : atomic_load_explicit(&fc_calls[e], memory_order_relaxed);
}

FC_API CUresult fakecuda_launch(CUstream stream, void (*fn)(void *), void *arg) {
  if (!fc_ready()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  fc_device_t *d;
  CUresult r = stream_enter("fakecuda_launch", stream, &d);
  if (r != CUDA_SUCCESS) return r;
  fc_op_t op = {.kind = FC_OP_KERNEL, .u.kernel = {fn, arg}};
  bool taken;
  r = capture_ops("fakecuda_launch", d, stream, &op, 1, &taken);
  if (!taken)
    r = from_sim(d->sim->ops->sim_launch(d->sim, (gma_stream_t)stream, fn, arg),
                 CUDA_ERROR_INVALID_HANDLE);
  dev_exit(d);
  return r;
}

FC_API unsigned long long fakecuda_used(int device) {
  if (!fc_ready() || device < 0 || device >= fc.ndev) return 0;
  pthread_mutex_lock(&fc.mu);
  unsigned long long used = fc.dev[device].used;
  pthread_mutex_unlock(&fc.mu);
  return used;
}

FC_API unsigned fakecuda_last_create(void) {
  pthread_mutex_lock(&fc.mu);
  unsigned flags = fc.last_create_flags;
  pthread_mutex_unlock(&fc.mu);
  return flags;
}

FC_API unsigned fakecuda_strict(unsigned flags) {
  return atomic_exchange_explicit(&fc_strict_flags, flags & FAKECUDA_STRICT_ALL,
                                  memory_order_relaxed);
}

FC_API unsigned long long fakecuda_capture_violations(void) {
  return atomic_load_explicit(&fc_capture_violations_n, memory_order_relaxed);
}

/* The controls keep the types fakecuda.h gives tests for dlsym. */
_Static_assert(__builtin_types_compatible_p(__typeof__(&fakecuda_fail), fakecuda_fail_fn), "");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fakecuda_clear_faults),
                                            fakecuda_clear_faults_fn), "");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fakecuda_calls), fakecuda_calls_fn), "");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fakecuda_launch), fakecuda_launch_fn), "");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fakecuda_used), fakecuda_used_fn), "");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fakecuda_strict), fakecuda_strict_fn), "");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fakecuda_last_create),
                                            fakecuda_last_create_fn), "");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fakecuda_capture_violations),
                                            fakecuda_capture_violations_fn), "");
