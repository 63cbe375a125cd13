/* The CUDA backend: the device boundary on the CUDA driver API.
 *
 * The driver is loaded at run time (dlopen of libcuda.so.1, or of the file
 * named by GMA_CUDA_DRIVER, which is how the tests load a driver built on the
 * simulated device), and every entry point comes from cuGetProcAddress, so
 * libgma loads and runs on machines without a driver. gma works in the
 * primary context of its device, the one the CUDA runtime uses, so streams
 * made with cudaStreamCreate or cuStreamCreate work alike. Each call makes
 * that context current only when it is not already, and puts the caller's
 * back afterwards: gma never changes which context a thread has.
 *
 * Every CUresult becomes a gma status, and the message carries the driver's
 * error name and text. */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "base/lock.h"
#include "base/atomics.h"

#ifndef GMA_HAVE_CUDA

static gma_status_t no_backend(void) {
  return gma__set_error(GMA_ERR_NO_DEVICE,
                        "this build of gma has no CUDA backend (it was built without the CUDA "
                        "Toolkit headers); rebuild with the toolkit installed, or use device:sim");
}
gma_status_t gma__cuda_create(const gma_config_t *config, gma__device_t **out) {
  (void)config;
  (void)out;
  return no_backend();
}
gma_status_t gma__cuda_device_count(int *count) {
  *count = 0;
  return no_backend();
}
gma_status_t gma__cuda_device_mem(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes) {
  (void)ordinal;
  (void)free_bytes;
  (void)total_bytes;
  return no_backend();
}

#else

#include "device/cuda_internal.h"

/* One stream's entry in the table of stream ids ("Stream ids, also during a
 * capture"). */
typedef struct id_entry {
  uint64_t drv; /* the driver's id + 1 when last asked outside a capture; 0: not known */
  uint64_t gma; /* what stream_id answers; 0: no entry (never met, or destroyed) */
} id_entry_t;

typedef struct cuda_device {
  gma__device_t base; /* must stay first: the device boundary passes &base */
  /* Immutable after creation. */
  int ordinal;
  CUdevice cudev;
  CUcontext ctx; /* the device's primary context, retained */
  bool vmm;      /* virtual memory management supported */
  bool vmm_rdma; /* growable chunks can be GPUDirect RDMA capable (for NICs, NCCL) */
  bool vmm_posix_fd; /* growable chunks can be exported as POSIX file descriptors (IPC) */
  /* The legacy stream's entry in the table of stream ids (under ids_lock). */
  id_entry_t legacy;
} cuda_device_t;

static cuda_device_t *cuda_of(gma__device_t *d) { return (cuda_device_t *)d; }

/* Makes the device's context current on this thread for one call if it is
 * not already; *pushed says whether leave must pop it. */
static CUresult ctx_enter(const cuda_device_t *dev, bool *pushed) {
  CUcontext cur = NULL;
  *pushed = false;
  CUresult r = gma__cuda_drv.cuCtxGetCurrent(&cur);
  if (r != CUDA_SUCCESS || cur == dev->ctx) return r;
  r = gma__cuda_drv.cuCtxPushCurrent(dev->ctx);
  *pushed = r == CUDA_SUCCESS;
  return r;
}

static void ctx_leave(bool pushed) {
  CUcontext popped;
  if (pushed) gma__cuda_drv.cuCtxPopCurrent(&popped);
}

/* Runs one driver call in the device's context; returns from the calling
 * function with the mapped status when the call (or the context switch)
 * fails. */
#define CU_CALL(dev, what, call)                                         \
  do {                                                                   \
    bool pushed_;                                                        \
    CUresult r_ = ctx_enter((dev), &pushed_);                            \
    if (r_ != CUDA_SUCCESS) return gma__cuda_fail(r_, "cuCtxPushCurrent");      \
    r_ = (call);                                                         \
    ctx_leave(pushed_);                                                  \
    if (r_ != CUDA_SUCCESS) return gma__cuda_fail(r_, (what));                  \
  } while (0)

/* The same for a call on a stream: a created stream knows its context, so
 * only the special handles (NULL, legacy 0x1, per-thread 0x2), which name
 * the current context's streams, need the switch. */
#define CU_STREAM_CALL(dev, stream, what, call)                          \
  do {                                                                   \
    if ((uintptr_t)(stream) > 2) {                                       \
      CUresult r_ = (call);                                              \
      if (r_ != CUDA_SUCCESS) return gma__cuda_fail(r_, (what));                \
    } else {                                                             \
      CU_CALL(dev, what, call);                                          \
    }                                                                    \
  } while (0)

/* ---- Memory ---------------------------------------------------------------- */

static gma_status_t cuda_mem_alloc_now(gma__device_t *d, uint64_t size, uintptr_t *out) {
  CUdeviceptr p = 0;
  CU_CALL(cuda_of(d), "cuMemAlloc", gma__cuda_drv.cuMemAlloc(&p, (size_t)size));
  if (p % 512) { /* the boundary promises 512; the driver documents "suitably aligned" */
    CU_CALL(cuda_of(d), "cuMemFree", gma__cuda_drv.cuMemFree(p));
    return gma__set_error(GMA_ERR_DEVICE, "the CUDA driver's cuMemAlloc returned 0x%llx, not "
                          "512-byte aligned", (unsigned long long)p);
  }
  *out = (uintptr_t)p;
  return GMA_OK;
}

static gma_status_t cuda_mem_free_now(gma__device_t *d, uintptr_t addr, uint64_t size) {
  (void)size;
  CU_CALL(cuda_of(d), "cuMemFree", gma__cuda_drv.cuMemFree((CUdeviceptr)addr));
  return GMA_OK;
}

static gma_status_t cuda_mem_info(gma__device_t *d, uint64_t *free_bytes, uint64_t *total_bytes) {
  size_t f = 0, t = 0;
  CU_CALL(cuda_of(d), "cuMemGetInfo", gma__cuda_drv.cuMemGetInfo(&f, &t));
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
  return GMA_OK;
}

/* ---- Events and streams ----------------------------------------------------- */

/* Events carry no timing: cheaper to record, and gma only orders work. The
 * pool keeps created events for reuse (gma__pool_t.spare_events), so a
 * steady workload creates none. */
static gma_status_t cuda_event_create(gma__device_t *d, gma__event_t *out) {
  CUevent e = NULL;
  CU_CALL(cuda_of(d), "cuEventCreate", gma__cuda_drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  *out = e;
  return GMA_OK;
}

/* The context stream belongs to: the device's primary context for the
 * special handles, which gma always names with it current (CU_STREAM_CALL). */
static CUresult stream_ctx(const cuda_device_t *dev, gma_stream_t stream, CUcontext *ctx) {
  if ((uintptr_t)stream <= 2) {
    *ctx = dev->ctx;
    return CUDA_SUCCESS;
  }
  return gma__cuda_drv.cuStreamGetCtx((CUstream)stream, ctx);
}

static gma_status_t cuda_stream_foreign(gma__device_t *d, gma_stream_t stream, bool *foreign) {
  CUcontext c = NULL;
  CUresult r = stream_ctx(cuda_of(d), stream, &c);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, "cuStreamGetCtx");
  *foreign = c != cuda_of(d)->ctx;
  return GMA_OK;
}

/* An event made with the stream's own context current (pushed for the one
 * call when it is not the primary context). */
static gma_status_t cuda_event_create_for(gma__device_t *d, gma_stream_t stream,
                                          gma__event_t *out) {
  cuda_device_t *dev = cuda_of(d);
  CUcontext c = NULL;
  CUresult r = stream_ctx(dev, stream, &c);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, "cuStreamGetCtx");
  if (c == dev->ctx) return cuda_event_create(d, out);
  r = gma__cuda_drv.cuCtxPushCurrent(c);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, "cuCtxPushCurrent");
  CUevent e = NULL;
  r = gma__cuda_drv.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  CUcontext popped;
  gma__cuda_drv.cuCtxPopCurrent(&popped);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, "cuEventCreate");
  *out = e;
  return GMA_OK;
}

static gma_status_t cuda_event_destroy(gma__device_t *d, gma__event_t ev) {
  (void)d; /* an event knows its context */
  CUresult r = gma__cuda_drv.cuEventDestroy((CUevent)ev);
  return r == CUDA_SUCCESS ? GMA_OK : gma__cuda_fail(r, "cuEventDestroy");
}

static gma_status_t cuda_event_record(gma__device_t *d, gma__event_t ev, gma_stream_t stream) {
  CU_STREAM_CALL(cuda_of(d), stream, "cuEventRecord",
                 gma__cuda_drv.cuEventRecord((CUevent)ev, (CUstream)stream));
  return GMA_OK;
}

/* Flags 0: the write follows the work queued before it, with a memory
 * barrier, as an event record would. */
static gma_status_t cuda_stream_write_value(gma__device_t *d, gma_stream_t stream,
                                            uintptr_t dev_addr, uint64_t value) {
  CU_STREAM_CALL(cuda_of(d), stream, "cuStreamWriteValue64",
                 gma__cuda_drv.cuStreamWriteValue64((CUstream)stream, (CUdeviceptr)dev_addr,
                                                    (cuuint64_t)value, 0));
  return GMA_OK;
}

static gma_status_t cuda_event_query_now(gma__device_t *d, gma__event_t ev, bool *done) {
  (void)d;
  /* An event belongs to its context: no switch needed to query it. */
  CUresult r = gma__cuda_drv.cuEventQuery((CUevent)ev);
  *done = r == CUDA_SUCCESS;
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY) return GMA_OK;
  return gma__cuda_fail(r, "cuEventQuery");
}

static gma_status_t cuda_event_synchronize_now(gma__device_t *d, gma__event_t ev) {
  (void)d;
  CUresult r = gma__cuda_drv.cuEventSynchronize((CUevent)ev);
  return r == CUDA_SUCCESS ? GMA_OK : gma__cuda_fail(r, "cuEventSynchronize");
}

static gma_status_t cuda_stream_wait_event(gma__device_t *d, gma_stream_t stream,
                                           gma__event_t ev) {
  CU_STREAM_CALL(cuda_of(d), stream, "cuStreamWaitEvent",
                 gma__cuda_drv.cuStreamWaitEvent((CUstream)stream, (CUevent)ev, 0));
  return GMA_OK;
}

/* An event recorded on waitee, then cuStreamWaitEvent on waiter, as
 * PyTorch's Stream.wait_stream does. The event is created for the call and
 * destroyed at once: the wait has captured the record, and the driver frees
 * a destroyed event only when its work completes. */
static gma_status_t cuda_stream_wait_stream(gma__device_t *d, gma_stream_t waiter,
                                            gma_stream_t waitee) {
  cuda_device_t *dev = cuda_of(d);
  gma__event_t made = NULL;
  gma_status_t st = cuda_event_create_for(d, waitee, &made); /* in the waitee's context */
  if (st != GMA_OK) return st;
  CUevent e = (CUevent)made;
  bool pushed = false;
  const char *what = "cuCtxPushCurrent";
  CUresult r = ctx_enter(dev, &pushed); /* for the default-stream handles */
  if (r == CUDA_SUCCESS) {
    what = "cuEventRecord";
    r = gma__cuda_drv.cuEventRecord(e, (CUstream)waitee);
  }
  if (r == CUDA_SUCCESS) {
    what = "cuStreamWaitEvent";
    r = gma__cuda_drv.cuStreamWaitEvent((CUstream)waiter, e, 0);
  }
  ctx_leave(pushed);
  CUresult dr = gma__cuda_drv.cuEventDestroy(e);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, what);
  if (dr != CUDA_SUCCESS) return gma__cuda_fail(dr, "cuEventDestroy");
  return GMA_OK;
}

/* Non-blocking: like the simulated device's streams (and PyTorch's), they do
 * not synchronize with the legacy default stream. */
static gma_status_t cuda_stream_create(gma__device_t *d, gma_stream_t *out) {
  CUstream s = NULL;
  CU_CALL(cuda_of(d), "cuStreamCreate", gma__cuda_drv.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  *out = s;
  return GMA_OK;
}

/* Whether stream captures, from cuStreamGetCaptureInfo (legal during any
 * capture), with the stream's context current for the special handles. The
 * legacy stream answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while a blocking
 * stream captures: work there would join that capture, so it counts as
 * capturing (with no id of its own). An invalidated capture is still one:
 * its stream's work is not run. */
static CUresult capture_query(CUstream stream, bool *capturing, uint64_t *id) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  CUresult r = gma__cuda_capture_info(stream, &status, &cid, NULL, NULL, NULL);
  *capturing = r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
               (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE);
  *id = r == CUDA_SUCCESS && *capturing ? (uint64_t)cid : 0;
  return r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ? CUDA_SUCCESS : r;
}

/* ---- Stream ids, also during a capture -------------------------------------
 * cuStreamGetId is refused on a capturing stream in every capture mode, and
 * the refused call invalidates the capture (docs/gpu/capture_rules.txt).
 * So gma never asks it about a
 * capturing stream (cuStreamGetCaptureInfo, which is allowed, comes first),
 * and the ids it hands up are kept here, one entry per stream handle:
 *   - outside a capture, the driver's id R (plus one: gma keeps 0 for "no
 *     stream") is what the entry is checked against: an entry with drv == R
 *     answers its gma id; one whose drv is not known yet (made during a
 *     capture) takes R and keeps its gma id; one with another drv means the
 *     handle now names a new stream, which gets gma id R;
 *   - during a capture, the entry's gma id; a stream gma never met (one
 *     made and forked into the capture without being named to gma) gets a
 *     new id from a range the driver's never reach (top bit set), so gma's
 *     records of it are as new as the stream.
 * Where entries live: a created stream's in a process-wide table under
 * ids_lock (open addressing, grown by doubling; cleared when gma destroys
 * the stream); the legacy stream's (NULL, 0x1) in its device; the
 * per-thread stream's (0x2) per thread and device. */
typedef struct id_slot {
  uintptr_t handle; /* 0: an empty slot */
  id_entry_t e;
} id_slot_t;
static pthread_mutex_t ids_lock = PTHREAD_MUTEX_INITIALIZER;
static id_slot_t *ids;
static size_t ids_cap, ids_n; /* slots (a power of two, or 0) and used ones */
static _Atomic uint64_t ids_synthetic; /* ids made during captures, counted */
#define IDS_PTDS 4
static __thread struct {
  const cuda_device_t *dev;
  id_entry_t e;
} ids_ptds[IDS_PTDS];

static size_t ids_slot(const id_slot_t *t, size_t cap, uintptr_t h) {
  size_t i = (size_t)(((uint64_t)h * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
  while (t[i].handle && t[i].handle != h) i = (i + 1) & (cap - 1);
  return i;
}

/* The table's entry for h, made (empty) if there is none; NULL without host
 * memory for a bigger table. ids_lock held. */
static id_entry_t *ids_entry(uintptr_t h) {
  if ((ids_n + 1) * 4 > ids_cap * 3) {
    size_t cap = ids_cap ? 2 * ids_cap : 64;
    id_slot_t *t = calloc(cap, sizeof *t);
    if (t) {
      for (size_t i = 0; i < ids_cap; i++)
        if (ids[i].handle) t[ids_slot(t, cap, ids[i].handle)] = ids[i];
      free(ids);
      ids = t;
      ids_cap = cap;
    }
  }
  if (!ids_cap) return NULL;
  id_slot_t *sl = &ids[ids_slot(ids, ids_cap, h)];
  if (!sl->handle) {
    if ((ids_n + 1) * 4 > ids_cap * 3) return NULL;
    sl->handle = h;
    ids_n++;
  }
  return &sl->e;
}

/* The rules above for one entry: r is the driver's id + 1, or 0 while the
 * stream captures. */
static uint64_t ids_resolve(id_entry_t *e, uint64_t r) {
  if (r == 0) {
    if (!e->gma) *e = (id_entry_t){0, (1ull << 63) | (gma__faa_seq_cst(&ids_synthetic, 1) + 1)};
  } else if (e->gma && e->drv == 0) {
    e->drv = r; /* met first during a capture; the same stream now */
  } else if (!e->gma || e->drv != r) {
    *e = (id_entry_t){r, r};
  }
  return e->gma;
}

/* stream's gma id; 0 only without host memory for the table. */
static uint64_t ids_lookup(cuda_device_t *dev, gma_stream_t stream, uint64_t r) {
  uintptr_t h = (uintptr_t)stream;
  if (h == 2) {
    unsigned k = 0;
    while (k + 1 < IDS_PTDS && ids_ptds[k].dev && ids_ptds[k].dev != dev) k++;
    if (ids_ptds[k].dev != dev) ids_ptds[k].e = (id_entry_t){0, 0}; /* the last slot is shared */
    ids_ptds[k].dev = dev;
    return ids_resolve(&ids_ptds[k].e, r);
  }
  gma__lock(&ids_lock, GMA__RANK_CUDA_IDS);
  id_entry_t *e = h < 2 ? &dev->legacy : ids_entry(h);
  uint64_t id = e ? ids_resolve(e, r) : r;
  gma__unlock(&ids_lock);
  return id;
}

static gma_status_t cuda_stream_destroy(gma__device_t *d, gma_stream_t stream) {
  CU_STREAM_CALL(cuda_of(d), stream, "cuStreamDestroy", gma__cuda_drv.cuStreamDestroy((CUstream)stream));
  if ((uintptr_t)stream > 2) {
    gma__lock(&ids_lock, GMA__RANK_CUDA_IDS);
    if (ids_cap) {
      id_slot_t *sl = &ids[ids_slot(ids, ids_cap, (uintptr_t)stream)];
      if (sl->handle) sl->e = (id_entry_t){0, 0};
    }
    gma__unlock(&ids_lock);
  }
  return GMA_OK;
}

/* Called on every allocation that misses the thread's stream cache: two
 * driver calls (is it capturing, its id) and the table, no context switch
 * for a created stream. */
static gma_status_t cuda_stream_id(gma__device_t *d, gma_stream_t stream, uint64_t *id) {
  cuda_device_t *dev = cuda_of(d);
  bool capturing = false;
  uint64_t cid = 0;
  unsigned long long v = 0;
  bool pushed = false;
  const char *what = "cuCtxPushCurrent";
  CUresult r = (uintptr_t)stream > 2 ? CUDA_SUCCESS : ctx_enter(dev, &pushed);
  if (r == CUDA_SUCCESS) {
    what = "cuStreamGetCaptureInfo";
    r = capture_query((CUstream)stream, &capturing, &cid);
  }
  if (r == CUDA_SUCCESS && !capturing) {
    what = "cuStreamGetId";
    r = gma__cuda_drv.cuStreamGetId((CUstream)stream, &v);
  }
  ctx_leave(pushed);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, what);
  /* The driver's ids start at 1, but make sure a 0 could never alias. */
  uint64_t got = ids_lookup(dev, stream, capturing ? 0 : (uint64_t)v + 1);
  if (!got)
    return gma__set_error(GMA_ERR_OOM, "host memory for gma's table of stream ids (stream %p "
                          "is capturing, and gma cannot ask the driver its id then)",
                          stream);
  *id = got;
  return GMA_OK;
}

static gma_status_t cuda_stream_synchronize_now(gma__device_t *d, gma_stream_t stream) {
  CU_STREAM_CALL(cuda_of(d), stream, "cuStreamSynchronize",
                 gma__cuda_drv.cuStreamSynchronize((CUstream)stream));
  return GMA_OK;
}

static gma_status_t cuda_device_synchronize_now(gma__device_t *d) {
  CU_CALL(cuda_of(d), "cuCtxSynchronize", gma__cuda_drv.cuCtxSynchronize());
  return GMA_OK;
}

/* ---- Virtual memory (growable segments) ---------------------------------------- */

static CUmemAllocationProp chunk_prop(const cuda_device_t *dev) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev->ordinal;
  /* As PyTorch's expandable segments: a chunk a NIC can read (GPUDirect
   * RDMA, for NCCL over InfiniBand) and one that can be shared with another
   * process, where the device supports it. */
  prop.allocFlags.gpuDirectRDMACapable = dev->vmm_rdma ? 1 : 0;
  prop.requestedHandleTypes =
      dev->vmm_posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

static gma_status_t cuda_vm_granularity(gma__device_t *d, uint64_t *bytes) {
  cuda_device_t *dev = cuda_of(d);
  if (!dev->vmm)
    return gma__set_error(GMA_ERR_UNSUPPORTED,
                          "CUDA device %d does not support virtual memory management, which "
                          "expandable_segments:true needs; use expandable_segments:false",
                          dev->ordinal);
  CUmemAllocationProp prop = chunk_prop(dev);
  size_t g = 0;
  CU_CALL(dev, "cuMemGetAllocationGranularity",
          gma__cuda_drv.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  *bytes = g;
  return GMA_OK;
}

static gma_status_t cuda_vm_reserve_now(gma__device_t *d, uint64_t size, uintptr_t *out) {
  CUdeviceptr p = 0;
  CU_CALL(cuda_of(d), "cuMemAddressReserve", gma__cuda_drv.cuMemAddressReserve(&p, (size_t)size, 0, 0, 0));
  *out = (uintptr_t)p;
  return GMA_OK;
}

static gma_status_t cuda_vm_release_now(gma__device_t *d, uintptr_t addr, uint64_t size) {
  CU_CALL(cuda_of(d), "cuMemAddressFree",
          gma__cuda_drv.cuMemAddressFree((CUdeviceptr)addr, (size_t)size));
  return GMA_OK;
}

/* Releases physical memory h in the device's context. */
static CUresult release_handle(cuda_device_t *dev, uint64_t h) {
  bool pushed;
  CUresult r = ctx_enter(dev, &pushed);
  if (r == CUDA_SUCCESS) r = gma__cuda_drv.cuMemRelease((CUmemGenericAllocationHandle)h);
  ctx_leave(pushed);
  return r;
}

/* Maps physical memory h at addr and makes it read-write for the device;
 * a failed access grant unmaps it again. */
static gma_status_t map_access(cuda_device_t *dev, uintptr_t addr, uint64_t size,
                               CUmemGenericAllocationHandle h) {
  bool pushed;
  const char *what = "cuMemMap";
  CUresult r = ctx_enter(dev, &pushed);
  if (r == CUDA_SUCCESS) r = gma__cuda_drv.cuMemMap((CUdeviceptr)addr, (size_t)size, 0, h, 0);
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev->ordinal;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    what = "cuMemSetAccess";
    r = gma__cuda_drv.cuMemSetAccess((CUdeviceptr)addr, (size_t)size, &access, 1);
    if (r != CUDA_SUCCESS) gma__cuda_drv.cuMemUnmap((CUdeviceptr)addr, (size_t)size);
  }
  ctx_leave(pushed);
  return r == CUDA_SUCCESS ? GMA_OK : gma__cuda_fail(r, what);
}

/* Create, map, grant access; each failure undoes the steps before it. */
static gma_status_t cuda_vm_map_now(gma__device_t *d, uintptr_t addr, uint64_t size,
                                uint64_t *handle) {
  cuda_device_t *dev = cuda_of(d);
  CUmemAllocationProp prop = chunk_prop(dev);
  CUmemGenericAllocationHandle h = 0;
  bool pushed_c;
  CUresult rc = ctx_enter(dev, &pushed_c);
  if (rc != CUDA_SUCCESS) return gma__cuda_fail(rc, "cuCtxPushCurrent");
  rc = gma__cuda_drv.cuMemCreate(&h, (size_t)size, &prop, 0);
  /* A device may report a feature a container or driver setting then
   * refuses: a plain chunk serves gma as well (only export and RDMA need
   * the extras). Out of memory is no such refusal. */
  if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_OUT_OF_MEMORY &&
      (prop.allocFlags.gpuDirectRDMACapable || prop.requestedHandleTypes)) {
    prop.allocFlags.gpuDirectRDMACapable = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    rc = gma__cuda_drv.cuMemCreate(&h, (size_t)size, &prop, 0);
  }
  ctx_leave(pushed_c);
  if (rc != CUDA_SUCCESS) return gma__cuda_fail(rc, "cuMemCreate");
  gma_status_t st = map_access(dev, addr, size, h);
  if (st == GMA_OK) *handle = (uint64_t)h;
  else release_handle(dev, (uint64_t)h);
  return st;
}

/* Unmapping is not stream-ordered; the pool unmaps only FREE memory, whose
 * streams' work has completed. Release after unmap frees the chunk. */
static gma_status_t cuda_vm_unmap_now(gma__device_t *d, uintptr_t addr, uint64_t size,
                                  uint64_t handle) {
  cuda_device_t *dev = cuda_of(d);
  CU_CALL(dev, "cuMemUnmap", gma__cuda_drv.cuMemUnmap((CUdeviceptr)addr, (size_t)size));
  /* Unmapped now: the range must count as given back whatever happens
   * next, or gma would hand out addresses that are no longer mapped. A
   * physical allocation the driver will not release is leaked (and said). */
  CUresult r = release_handle(dev, handle);
  if (r != CUDA_SUCCESS)
    fprintf(stderr, "gma: cuMemRelease of a chunk at %p failed after its unmap (error %d); "
                    "its physical memory stays allocated\n", (void *)addr, (int)r);
  return GMA_OK;
}

/* The handle pool's: unmap keeping the handle, map a kept one, release one. */
static gma_status_t cuda_vm_unmap_keep_now(gma__device_t *d, uintptr_t addr, uint64_t size,
                                       uint64_t handle) {
  (void)handle;
  CU_CALL(cuda_of(d), "cuMemUnmap", gma__cuda_drv.cuMemUnmap((CUdeviceptr)addr, (size_t)size));
  return GMA_OK;
}
static gma_status_t cuda_vm_map_kept_now(gma__device_t *d, uintptr_t addr, uint64_t size,
                                     uint64_t handle) {
  return map_access(cuda_of(d), addr, size, (CUmemGenericAllocationHandle)handle);
}
static gma_status_t cuda_vm_free_kept_now(gma__device_t *d, uint64_t handle, uint64_t size) {
  (void)size;
  CUresult r = release_handle(cuda_of(d), handle);
  return r == CUDA_SUCCESS ? GMA_OK : gma__cuda_fail(r, "cuMemRelease");
}

/* ---- Pinned host memory ---------------------------------------------------------- */

/* Portable (usable from every context) and mapped into the device's address
 * space: the CPU fallback hands the device address to kernels. */
static gma_status_t cuda_host_alloc_now(gma__device_t *d, uint64_t size, void **host,
                                    uintptr_t *dev_addr) {
  cuda_device_t *dev = cuda_of(d);
  void *p = NULL;
  CU_CALL(dev, "cuMemHostAlloc",
          gma__cuda_drv.cuMemHostAlloc(&p, (size_t)size,
                             CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  CUdeviceptr dp = 0;
  bool pushed;
  CUresult r = ctx_enter(dev, &pushed);
  if (r == CUDA_SUCCESS) r = gma__cuda_drv.cuMemHostGetDevicePointer(&dp, p, 0);
  if (r != CUDA_SUCCESS) gma__cuda_drv.cuMemFreeHost(p);
  ctx_leave(pushed);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, "cuMemHostGetDevicePointer");
  *host = p;
  *dev_addr = (uintptr_t)dp;
  return GMA_OK;
}

static gma_status_t cuda_host_free_now(gma__device_t *d, void *host, uint64_t size) {
  (void)size;
  CU_CALL(cuda_of(d), "cuMemFreeHost", gma__cuda_drv.cuMemFreeHost(host));
  return GMA_OK;
}


/* ---- Stream capture ------------------------------------------------------------ */

/* Capture-safe by construction. Every call CUDA counts as potentially unsafe
 * while a stream captures (allocation, free, mapping, synchronization, event
 * queries) runs with the calling thread's capture mode switched to RELAXED
 * for its duration, as PyTorch does around cudaMalloc during capture: a
 * capture begun in GLOBAL mode on any thread, or in THREAD_LOCAL mode on
 * this one, would otherwise make the call fail and invalidate that capture.
 * What relaxed mode still forbids, gma never does: it records no event on a
 * capturing stream (streams.c asks cuda_stream_capture first), so it never
 * queries a captured event, and it never waits from or synchronizes a
 * capturing stream on its own. Two thread-local driver calls per wrapped
 * call; none on the hot path. */
static CUstreamCaptureMode relax_begin(void) {
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (gma__cuda_drv.cuThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS) m = CU_STREAM_CAPTURE_MODE_RELAXED;
  return m;
}

static void relax_end(CUstreamCaptureMode prev) {
  if (prev != CU_STREAM_CAPTURE_MODE_RELAXED) gma__cuda_drv.cuThreadExchangeStreamCaptureMode(&prev);
}

#define CUDA_RELAXED(name, params, args)            \
  static gma_status_t name params {                 \
    CUstreamCaptureMode prev_ = relax_begin();      \
    gma_status_t st_ = name##_now args;             \
    relax_end(prev_);                               \
    return st_;                                     \
  }
CUDA_RELAXED(cuda_mem_alloc, (gma__device_t *d, uint64_t size, uintptr_t *out), (d, size, out))
CUDA_RELAXED(cuda_mem_free, (gma__device_t *d, uintptr_t addr, uint64_t size), (d, addr, size))
CUDA_RELAXED(cuda_event_query, (gma__device_t *d, gma__event_t ev, bool *done), (d, ev, done))
CUDA_RELAXED(cuda_event_synchronize, (gma__device_t *d, gma__event_t ev), (d, ev))
CUDA_RELAXED(cuda_stream_synchronize, (gma__device_t *d, gma_stream_t stream), (d, stream))
CUDA_RELAXED(cuda_device_synchronize, (gma__device_t *d), (d))
CUDA_RELAXED(cuda_vm_reserve, (gma__device_t *d, uint64_t size, uintptr_t *out), (d, size, out))
CUDA_RELAXED(cuda_vm_release, (gma__device_t *d, uintptr_t addr, uint64_t size), (d, addr, size))
CUDA_RELAXED(cuda_vm_map, (gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t *handle), (d, addr, size, handle))
CUDA_RELAXED(cuda_vm_unmap, (gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t handle), (d, addr, size, handle))
CUDA_RELAXED(cuda_vm_unmap_keep, (gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t handle), (d, addr, size, handle))
CUDA_RELAXED(cuda_vm_map_kept, (gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t handle), (d, addr, size, handle))
CUDA_RELAXED(cuda_vm_free_kept, (gma__device_t *d, uint64_t handle, uint64_t size), (d, handle, size))
CUDA_RELAXED(cuda_host_alloc, (gma__device_t *d, uint64_t size, void **host, uintptr_t *dev_addr), (d, size, host, dev_addr))
CUDA_RELAXED(cuda_host_free, (gma__device_t *d, void *host, uint64_t size), (d, host, size))

static gma_status_t cuda_stream_capture(gma__device_t *d, gma_stream_t stream, bool *capturing,
                                        uint64_t *id) {
  bool pushed = false;
  *capturing = false;
  *id = 0;
  CUresult r = (uintptr_t)stream > 2 ? CUDA_SUCCESS : ctx_enter(cuda_of(d), &pushed);
  if (r == CUDA_SUCCESS) r = capture_query((CUstream)stream, capturing, id);
  ctx_leave(pushed);
  return r == CUDA_SUCCESS ? GMA_OK : gma__cuda_fail(r, "cuStreamGetCaptureInfo");
}

/* ---- Lifetime -------------------------------------------------------------------- */

static void cuda_destroy(gma__device_t *d) {
  cuda_device_t *dev = cuda_of(d);
  gma__cuda_drv.cuDevicePrimaryCtxRelease(dev->cudev);
  free(dev);
}

/* The child of a fork() (device.h, forget): CUDA is not fork-safe, and the
 * context and every allocation belong to the parent's driver state, so no
 * driver call at all, not even releasing the primary context; only the host
 * struct is freed. */
static void cuda_forget(gma__device_t *d) { free(cuda_of(d)); }

#define CUDA_OPS_COMMON \
    .mem_alloc = cuda_mem_alloc, \
    .mem_free = cuda_mem_free, \
    .mem_info = cuda_mem_info, \
    .event_create = cuda_event_create, \
    .event_create_for = cuda_event_create_for, \
    .stream_foreign = cuda_stream_foreign, \
    .event_destroy = cuda_event_destroy, \
    .event_record = cuda_event_record, \
    .event_query = cuda_event_query, \
    .event_synchronize = cuda_event_synchronize, \
    .stream_wait_event = cuda_stream_wait_event, \
    .stream_wait_stream = cuda_stream_wait_stream, \
    .stream_create = cuda_stream_create, \
    .stream_destroy = cuda_stream_destroy, \
    .stream_id = cuda_stream_id, \
    .stream_synchronize = cuda_stream_synchronize, \
    .stream_capture = cuda_stream_capture, \
    .device_synchronize = cuda_device_synchronize, \
    .vm_granularity = cuda_vm_granularity, \
    .vm_reserve = cuda_vm_reserve, \
    .vm_release = cuda_vm_release, \
    .vm_map = cuda_vm_map, \
    .vm_unmap = cuda_vm_unmap, \
    .vm_unmap_keep = cuda_vm_unmap_keep, \
    .vm_map_kept = cuda_vm_map_kept, \
    .vm_free_kept = cuda_vm_free_kept, \
    .host_alloc = cuda_host_alloc, \
    .host_free = cuda_host_free, \
    .sim_launch = NULL, \
    .destroy = cuda_destroy, \
    .forget = cuda_forget,
static const gma__device_ops_t cuda_ops = {CUDA_OPS_COMMON};
/* With 64-bit stream memory operations (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS). */
static const gma__device_ops_t cuda_ops_memops = {CUDA_OPS_COMMON
                                                  .stream_write_value = cuda_stream_write_value};
#undef CUDA_OPS_COMMON

/* Loads the driver, initializes it, and checks the ordinal. */
static gma_status_t open_ordinal(int ordinal, CUdevice *out) {
  gma_status_t st = gma__cuda_driver();
  if (st != GMA_OK) return st;
  CUresult r = gma__cuda_drv.cuInit(0);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, "cuInit");
  int n = 0;
  if ((r = gma__cuda_drv.cuDeviceGetCount(&n)) != CUDA_SUCCESS) return gma__cuda_fail(r, "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= n)
    return gma__set_error(GMA_ERR_NO_DEVICE,
                          "device_id %d does not exist: the CUDA driver reports %d device%s",
                          ordinal, n, n == 1 ? "" : "s");
  if ((r = gma__cuda_drv.cuDeviceGet(out, ordinal)) != CUDA_SUCCESS) return gma__cuda_fail(r, "cuDeviceGet");
  return GMA_OK;
}

gma_status_t gma__cuda_create(const gma_config_t *config, gma__device_t **out) {
  CUdevice cudev;
  gma_status_t st = open_ordinal(config->device_ordinal, &cudev);
  if (st != GMA_OK) return st;
  cuda_device_t *dev = calloc(1, sizeof *dev);
  if (!dev) return gma__set_error(GMA_ERR_OOM, "no host memory for the CUDA device's record");
  dev->base.ops = &cuda_ops;
  dev->base.name = "cuda";
  dev->ordinal = config->device_ordinal;
  dev->cudev = cudev;
  CUresult r = gma__cuda_drv.cuDevicePrimaryCtxRetain(&dev->ctx, cudev);
  if (r != CUDA_SUCCESS) {
    free(dev);
    return gma__cuda_fail(r, "cuDevicePrimaryCtxRetain");
  }
  int vmm = 0;
  r = gma__cuda_drv.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                               cudev);
  dev->vmm = r == CUDA_SUCCESS && vmm;
  int rdma = 0, fd = 0;
  r = gma__cuda_drv.cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                               cudev);
  dev->vmm_rdma = r == CUDA_SUCCESS && rdma;
  r = gma__cuda_drv.cuDeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                               cudev);
  dev->vmm_posix_fd = r == CUDA_SUCCESS && fd;
  int memops = 0;
  r = gma__cuda_drv.cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                                         cudev);
  if (r == CUDA_SUCCESS && memops) dev->base.ops = &cuda_ops_memops;
  *out = &dev->base;
  return GMA_OK;
}

gma_status_t gma__cuda_device_count(int *count) {
  *count = 0;
  gma_status_t st = gma__cuda_driver();
  if (st != GMA_OK) return st;
  CUresult r = gma__cuda_drv.cuInit(0);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, "cuInit");
  if ((r = gma__cuda_drv.cuDeviceGetCount(count)) != CUDA_SUCCESS) {
    *count = 0;
    return gma__cuda_fail(r, "cuDeviceGetCount");
  }
  return GMA_OK;
}

/* Needs a context: retains the device's primary context (the one the CUDA
 * runtime would create too) for the query. */
gma_status_t gma__cuda_device_mem(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes) {
  cuda_device_t dev = {.ordinal = ordinal};
  gma_status_t st = open_ordinal(ordinal, &dev.cudev);
  if (st != GMA_OK) return st;
  CUresult r = gma__cuda_drv.cuDevicePrimaryCtxRetain(&dev.ctx, dev.cudev);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, "cuDevicePrimaryCtxRetain");
  size_t f = 0, t = 0;
  bool pushed;
  r = ctx_enter(&dev, &pushed);
  if (r == CUDA_SUCCESS) r = gma__cuda_drv.cuMemGetInfo(&f, &t);
  ctx_leave(pushed);
  gma__cuda_drv.cuDevicePrimaryCtxRelease(dev.cudev);
  if (r != CUDA_SUCCESS) return gma__cuda_fail(r, "cuMemGetInfo");
  *free_bytes = f;
  *total_bytes = t;
  return GMA_OK;
}

#endif /* GMA_HAVE_CUDA */
