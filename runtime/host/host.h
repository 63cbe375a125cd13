/* The pinned host memory pool (gma_host_alloc / gma_host_free) and the CPU
 * fallback's allocations, which come from it (see host.c).
 *
 * A host block is LIVE (handed out), PENDING (freed; an event recorded on its
 * stream at the free has not completed, so a copy queued before the free may
 * still read or write it) or FREE (in its size class's free list). Unlike
 * device memory, a freed host block is not reused at once even on its own
 * stream: the host itself writes it, outside any stream's order.
 *
 * A CPU-fallback block may also be used on other streams (gma_record_stream):
 * each such stream is an entry of xuse, and the free records an event on each
 * of them too; the block stays PENDING until all its events completed.
 *
 * Invariants (mu): every block is in the map; LIVE blocks are in no list;
 * PENDING ones are in the pending FIFO with at least one recorded event (own's
 * or an xuse entry's); FREE ones in the free list of class
 * gma__class_of(size), with no xuse entries;
 * reserved = live + pending + free bytes; fallback_live <= live. */
#ifndef GMA_HOST_H
#define GMA_HOST_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "device/device.h"
#include "gma.h"

struct gma__pool;

#define GMA__HOST_CLASSES 1024u

/* A stream that uses a host block: the one it was allocated on (own) and,
 * for a CPU-fallback block, those gma_record_stream named (xuse). A free
 * orders itself after each: an event recorded on it, or a wait for it. */
typedef struct gma__huse {
  gma_stream_t stream;
  uint64_t id;      /* the device's id of stream when named: a recycled handle value
                       names another stream (see device.h stream_id) */
  gma__event_t ev;  /* recorded at the free, or when the stream went; NULL: nothing to
                       wait for (own's is created once and reused) */
  uint8_t gone;     /* the stream was destroyed through gma while the block was live:
                       ev, if any, was recorded then; the free must not name it */
} gma__huse_t;

typedef struct gma__hblock {
  void *ptr;          /* host address */
  uintptr_t dptr;     /* the device's address of it (the fallback hands this out) */
  uint64_t size;      /* class size */
  uint64_t requested;
  gma__huse_t own;    /* the stream it was allocated on */
  uint8_t state;      /* GMA__HOST_* */
  uint8_t fallback;   /* handed out by gma_alloc as a CPU fallback */
  uint8_t tag;
  gma__huse_t *xuse;  /* fallback: other streams using it (gma_record_stream) */
  uint32_t nxuse, xuse_cap;
  uint64_t free_since_ns;
  struct gma__hblock *next; /* free list or pending FIFO */
  struct gma__hblock *hnext; /* hash chain */
} gma__hblock_t;

enum { GMA__HOST_LIVE = 1, GMA__HOST_PENDING = 2, GMA__HOST_FREE = 3 };

typedef struct gma__host {
  pthread_mutex_t mu;
  gma__device_t *dev;          /* immutable */
  gma__hblock_t **buckets;     /* by address: ptr (host) and dptr (device) both map */
  size_t nbuckets, count;
  gma__hblock_t *free_list[GMA__HOST_CLASSES];
  gma__hblock_t *pending_head, *pending_tail;
  uint64_t free_bytes, pending_bytes, live_bytes, fallback_live;
  gma_stat_t allocated, reserved;
  uint64_t allocs, frees, fallbacks, fallback_frees;
  uint64_t device_errors;
} gma__host_t;

gma_status_t gma__host_init(gma__host_t *h, gma__device_t *dev);
/* Frees every block (device work must be finished); returns the count and
 * bytes of LIVE ones (leaks) through the pointers. */
void gma__host_fini(gma__host_t *h, uint64_t *leaked, uint64_t *leaked_bytes);
/* fallback: a gma_alloc fallback; *out is then the device address. */
gma_status_t gma__host_alloc(gma__host_t *h, size_t size, gma_stream_t stream, bool fallback,
                             void **out);
/* GMA_ERR_INVALID_POINTER if ptr is not a block of h; GMA_ERR_DOUBLE_FREE if
 * not live; fallback says which kind of pointer the caller expects. */
gma_status_t gma__host_free(gma__host_t *h, void *ptr, bool fallback);
/* gma_record_stream of a CPU-fallback allocation: its free also waits for the
 * work queued on stream by then. GMA_ERR_INVALID_POINTER if ptr is not
 * (exactly) a live fallback allocation. */
gma_status_t gma__host_record_stream(gma__host_t *h, void *ptr, gma_stream_t stream);
/* Which of h's blocks (live or freed) ptr lies in, at its start or inside,
 * for error messages: GMA_MEMORY_HOST_PINNED (gma_host_alloc) or
 * GMA_MEMORY_FALLBACK (gma_alloc under fallback:host), with the block's
 * address in *base; 0 if none. A linear search: error paths only. Any
 * thread. */
int gma__host_contains(gma__host_t *h, const void *ptr, void **base);
/* Is ptr (exactly) a fallback allocation of h (live or freed)? Any thread. */
bool gma__host_owns_fallback(gma__host_t *h, void *ptr);
/* Moves completed PENDING blocks to FREE, then gives FREE blocks back to the
 * device (the oldest first) until at most keep bytes stay free. */
void gma__host_trim(gma__host_t *h, uint64_t keep);
void gma__host_set_tag(gma__host_t *h, void *ptr, uint8_t tag);
/* stream is about to be destroyed (gma_stream_destroy): each live block
 * allocated on it, or using it (xuse), gets an event recorded on it now (the
 * stream still exists), which its later free waits for. */
void gma__host_stream_gone(gma__host_t *h, gma_stream_t stream);
bool gma__host_pointer_info(gma__host_t *h, struct gma__pool *p, const void *ptr,
                            gma_pointer_info_t *info);
void gma__host_stats(gma__host_t *h, gma_stats_t *out);

#endif /* GMA_HOST_H */
