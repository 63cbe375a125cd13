/* The one device boundary: a table of functions every backend fills in.
 *
 * Everything above this line is device-neutral; only runtime/device/cuda.c
 * talks to CUDA and only runtime/device/sim.c simulates. Each function returns
 * a gma_status_t and, on failure, sets the thread's last-error message (via
 * gma__set_error) with the backend's own words. Device addresses are uintptr_t
 * (a CUdeviceptr on CUDA, a host address on the simulated device).
 *
 * Threads: every function may be called from any thread concurrently, unless
 * its comment says otherwise. None of them takes an allocator lock. */
#ifndef GMA_DEVICE_H
#define GMA_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "gma.h"

typedef struct gma__device gma__device_t;
typedef void *gma__event_t; /* a backend's event handle (CUevent on CUDA) */

typedef struct gma__device_ops {
  /* Memory. alloc returns GMA_ERR_OOM when the device (or, on the simulated
   * device, its capacity) is exhausted, GMA_ERR_DEVICE on other failures. The
   * address is aligned to at least 512 bytes. free is not stream-ordered: the
   * caller makes sure no device work still uses the range (CUDA's cuMemFree
   * also synchronizes). */
  gma_status_t (*mem_alloc)(gma__device_t *dev, uint64_t size, uintptr_t *out);
  gma_status_t (*mem_free)(gma__device_t *dev, uintptr_t addr, uint64_t size);
  /* Bytes free on the device now and its total capacity. */
  gma_status_t (*mem_info)(gma__device_t *dev, uint64_t *free_bytes, uint64_t *total_bytes);

  /* Events. A created event that was never recorded counts as complete, as in
   * CUDA. record captures all work queued on stream before the call; query
   * sets *done when that work has finished (never blocks); synchronize blocks
   * until it has. Recording again re-arms the event. */
  gma_status_t (*event_create)(gma__device_t *dev, gma__event_t *out);
  /* An event that can be recorded on stream, made in the stream's context
   * (CUDA: an event and a stream of different contexts do not mix; a stream
   * of a context other than the device's primary one, cuCtxCreate or a green
   * context, takes only events made in its own). stream_foreign sets
   * *foreign when event_create's events cannot be recorded on stream. Both
   * NULL on a backend with one context (then every event fits every stream). */
  gma_status_t (*event_create_for)(gma__device_t *dev, gma_stream_t stream, gma__event_t *out);
  gma_status_t (*stream_foreign)(gma__device_t *dev, gma_stream_t stream, bool *foreign);
  gma_status_t (*event_destroy)(gma__device_t *dev, gma__event_t ev);
  gma_status_t (*event_record)(gma__device_t *dev, gma__event_t ev, gma_stream_t stream);
  gma_status_t (*event_query)(gma__device_t *dev, gma__event_t ev, bool *done);
  gma_status_t (*event_synchronize)(gma__device_t *dev, gma__event_t ev);

  /* Work queued on stream after this call starts only once ev's recorded work
   * has finished; the host does not block. */
  gma_status_t (*stream_wait_event)(gma__device_t *dev, gma_stream_t stream, gma__event_t ev);
  /* Work queued on waiter after this call starts only once the work queued
   * on waitee before the call has finished; the host does not block
   * (gma_stream_wait_stream). GMA_ERR_INVALID_ARGUMENT when the two are one
   * stream. */
  gma_status_t (*stream_wait_stream)(gma__device_t *dev, gma_stream_t waiter,
                                     gma_stream_t waitee);

  /* Streams. NULL (and 0x1) is the default stream and always exists; 0x2 is
   * the calling thread's per-thread default stream. destroy returns at once,
   * as cuStreamDestroy does: queued work still runs, and the handle value may
   * be handed to the next stream created. */
  gma_status_t (*stream_create)(gma__device_t *dev, gma_stream_t *out);
  gma_status_t (*stream_destroy)(gma__device_t *dev, gma_stream_t stream);
  /* A nonzero id that no other stream of this device ever has, even one that
   * later gets the same handle value (cuStreamGetId on CUDA). For 0x2 it is
   * the calling thread's per-thread stream's id. Called on every allocation:
   * must be fast and must not block (no lock shared with stream threads). */
  gma_status_t (*stream_id)(gma__device_t *dev, gma_stream_t stream, uint64_t *id);
  gma_status_t (*stream_synchronize)(gma__device_t *dev, gma_stream_t stream);
  /* Stream capture (CUDA graphs): *capturing is true while stream is being
   * captured into a graph (its work is recorded, not run), and *id then names
   * the capture sequence (nonzero, unique in the process; 0 when the driver
   * cannot say, as for the legacy stream while a blocking stream captures,
   * which counts as capturing). Legal during any capture (it is how gma
   * stays out of one). NULL on a backend without capture (the simulated
   * device): then no stream ever captures. */
  gma_status_t (*stream_capture)(gma__device_t *dev, gma_stream_t stream, bool *capturing,
                                 uint64_t *id);
  /* Blocks until every stream's queued work has finished. */
  gma_status_t (*device_synchronize)(gma__device_t *dev);
  /* Queues on stream a write of value to the 8-byte word at dev_addr, the
   * device address of host_alloc memory: it happens once the work queued on
   * stream before it has finished, and the host then sees it with a plain
   * load (cuStreamWriteValue64). The host does not block. NULL where the
   * device cannot (CUDA without 64-bit stream memory operations). */
  gma_status_t (*stream_write_value)(gma__device_t *dev, gma_stream_t stream, uintptr_t dev_addr,
                                     uint64_t value);

  /* Virtual memory, for growable segments (expandable_segments:true); all
   * five are NULL on a backend without it. Sizes and addresses are multiples
   * of the granularity.
   * vm_granularity: size and alignment of one physical chunk.
   * vm_reserve: size bytes of address space, aligned to the granularity, with
   *   no memory behind it.
   * vm_map: creates size bytes of physical memory and maps it at addr (inside
   *   a reservation, not mapped), readable and writable by the device; counts
   *   against the device's memory like mem_alloc (GMA_ERR_OOM when full).
   *   *handle names the physical memory for vm_unmap.
   * vm_unmap: unmaps exactly a range that one vm_map mapped and frees its
   *   physical memory. Not stream-ordered: the caller makes sure no device
   *   work still uses the range.
   * vm_release: gives a whole reservation back; nothing in it may be mapped.
   * The kept-memory calls (all three NULL on a backend without them; each may
   * be, like vm_unmap, a call the device does not stream-order):
   * vm_unmap_keep: unmaps exactly a range that one vm_map or vm_map_kept
   *   mapped, and keeps its physical memory (still the device's, still
   *   counted against its memory) under the same handle.
   * vm_map_kept: maps the kept memory handle, all size bytes of it, at addr
   *   (inside a reservation, not mapped), readable and writable by the
   *   device; no new memory.
   * vm_free_kept: frees kept memory that is mapped nowhere. */
  gma_status_t (*vm_granularity)(gma__device_t *dev, uint64_t *bytes);
  gma_status_t (*vm_reserve)(gma__device_t *dev, uint64_t size, uintptr_t *out);
  gma_status_t (*vm_release)(gma__device_t *dev, uintptr_t addr, uint64_t size);
  gma_status_t (*vm_map)(gma__device_t *dev, uintptr_t addr, uint64_t size, uint64_t *handle);
  gma_status_t (*vm_unmap)(gma__device_t *dev, uintptr_t addr, uint64_t size, uint64_t handle);
  gma_status_t (*vm_unmap_keep)(gma__device_t *dev, uintptr_t addr, uint64_t size,
                                uint64_t handle);
  gma_status_t (*vm_map_kept)(gma__device_t *dev, uintptr_t addr, uint64_t size, uint64_t handle);
  gma_status_t (*vm_free_kept)(gma__device_t *dev, uint64_t handle, uint64_t size);

  /* Pinned host memory, mapped for the device: *host is its host address,
   * *dev_addr the device's (the same value on CUDA with unified addressing
   * and on the simulated device). Host memory does not count against the
   * device's capacity. host_free is not stream-ordered. */
  gma_status_t (*host_alloc)(gma__device_t *dev, uint64_t size, void **host, uintptr_t *dev_addr);
  gma_status_t (*host_free)(gma__device_t *dev, void *host, uint64_t size);

  /* Simulated kernels; NULL on backends that cannot run them. */
  gma_status_t (*sim_launch)(gma__device_t *dev, gma_stream_t stream, gma_sim_kernel_fn fn,
                             void *arg);

  /* Stops the backend's threads and frees it. Memory still allocated from it
   * is released. Called once, with no other call in flight. */
  void (*destroy)(gma__device_t *dev);
  /* destroy for a child process after fork(), on a device the parent
   * created: frees what the child holds of it (on the simulated device, the
   * host memory behind its device and pinned allocations) and the backend's
   * struct, with no driver call (CUDA is not fork-safe), no wait for a stream
   * (the threads are the parent's) and no lock that a parent thread may have
   * held at fork time (what such a lock guards is leaked). One thread; dev
   * must not be used afterwards, and memory it handed out is gone. */
  void (*forget)(gma__device_t *dev);
} gma__device_ops_t;

/* Every backend's device struct starts with this header. */
struct gma__device {
  const gma__device_ops_t *ops;
  const char *name; /* "sim" or "cuda" */
};

/* Creates the simulated device from the sim_* fields of config (already merged
 * with GMA_CONF and defaults). One thread. */
gma_status_t gma__sim_create(const gma_config_t *config, gma__device_t **out);

/* Fault injection on the simulated device, for tests (sim.c; tests/fault).
 * Every device call is a site, X(NAME, name). gma__sim_fault makes the nth
 * call of site on dev fail once with status (GMA_OK means GMA_ERR_DEVICE)
 * before it changes anything (a failed free frees nothing, a failed map maps
 * nothing); nth 0 disarms; site GMA__SIM_NSITES means every site. Calls are
 * counted from the first gma__sim_fault on dev. dev NULL sets the plan of the
 * sim devices created later in this process (they count from creation);
 * gma__sim_fault(NULL, GMA__SIM_NSITES, 0, 0) clears it. gma__sim_calls: calls
 * of site counted so far; gma__sim_live: what dev holds now (memory, events,
 * user streams); with dev NULL both tell of the last sim device destroyed, as
 * it was when its destroy began. Any thread; no-ops on other backends. The
 * sim_fail_alloc / sim_fail_event config keys keep their own counters.
 * nth | GMA__SIM_STICKY fails the nth call and every later one, as a CUDA
 * context does after a sticky error. */
#define GMA__SIM_STICKY ((uint64_t)1 << 63)
#define GMA__SIM_SITES(X)                                                                     \
  X(MEM_ALLOC, mem_alloc) X(MEM_FREE, mem_free) X(MEM_INFO, mem_info)                         \
  X(EVENT_CREATE, event_create) X(EVENT_DESTROY, event_destroy)                               \
  X(EVENT_RECORD, event_record) X(EVENT_QUERY, event_query)                                   \
  X(EVENT_SYNCHRONIZE, event_synchronize) X(STREAM_WAIT_EVENT, stream_wait_event)             \
  X(STREAM_WAIT_STREAM, stream_wait_stream)                                                   \
  X(STREAM_CREATE, stream_create) X(STREAM_DESTROY, stream_destroy) X(STREAM_ID, stream_id)  \
  X(STREAM_SYNCHRONIZE, stream_synchronize) X(DEVICE_SYNCHRONIZE, device_synchronize)         \
  X(STREAM_WRITE_VALUE, stream_write_value)                                                   \
  X(VM_GRANULARITY, vm_granularity) X(VM_RESERVE, vm_reserve) X(VM_RELEASE, vm_release)       \
  X(VM_MAP, vm_map) X(VM_UNMAP, vm_unmap) X(VM_UNMAP_KEEP, vm_unmap_keep)                    \
  X(VM_MAP_KEPT, vm_map_kept) X(VM_FREE_KEPT, vm_free_kept)                                   \
  X(HOST_ALLOC, host_alloc) X(HOST_FREE, host_free) X(SIM_LAUNCH, sim_launch)
typedef enum gma__sim_site {
#define GMA__SIM_SITE_ENUM_(NAME, name) GMA__SIM_##NAME,
  GMA__SIM_SITES(GMA__SIM_SITE_ENUM_)
#undef GMA__SIM_SITE_ENUM_
  GMA__SIM_NSITES
} gma__sim_site_t;
typedef struct gma__sim_live {
  uint64_t device_bytes; /* mem_alloc and vm_map memory not freed (kept memory too) */
  uint64_t host_bytes;   /* host_alloc memory not freed */
  uint64_t reservations, events, streams; /* vm_reserve ranges; events; user streams */
} gma__sim_live_t;
void gma__sim_fault(gma__device_t *dev, gma__sim_site_t site, uint64_t nth, gma_status_t status);
uint64_t gma__sim_calls(gma__device_t *dev, gma__sim_site_t site);

/* For the fake CUDA driver, which prices each driver entry point itself:
 * dev (created with a sim_costs preset) keeps the preset's behaviour (frees
 * wait for the device, events complete after their work) but charges no
 * call. Call it before dev is used. */
void gma__sim_costs_unpriced(gma__device_t *dev);
void gma__sim_live(gma__device_t *dev, gma__sim_live_t *out);

/* Opens the CUDA device config->device_ordinal through the driver (see
 * cuda.c). GMA_ERR_NO_DEVICE when no driver loads, the build has no CUDA
 * backend, or the ordinal does not exist; the message says which. */
gma_status_t gma__cuda_create(const gma_config_t *config, gma__device_t **out);
/* The driver's device count and one device's free/total memory, for
 * gma_device_count and gma_select_device. */
gma_status_t gma__cuda_device_count(int *count);
gma_status_t gma__cuda_device_mem(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes);

#endif /* GMA_DEVICE_H */
