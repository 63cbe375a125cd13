/* The stream table (handle -> record, read without a lock, changed under the
 * pool lock), thread identity, the per-(stream, thread) counters, and the
 * process-wide list of pools that an exiting thread walks. The lock-free
 * lookups are static inline here, so the hot path (cache/) pays no call for
 * them; the rest is core/table.c. */
#ifndef GMA_CORE_TABLE_H
#define GMA_CORE_TABLE_H

#include "core/types.h"

/* ---- Thread identity --------------------------------------------------------
 * Ids are never reused, unlike pthread_t values or TLS addresses. TLS uses
 * the default model for a shared library, so libgma.so can be loaded with
 * dlopen into a process whose static TLS is spent (the initial-exec model
 * failed on a GPU machine: "cannot allocate memory in static TLS block"
 * when PyTorch's plug-in loaded it); CMake adds -mtls-dialect=gnu2 where
 * the compiler has it, which makes an access a descriptor call instead of
 * __tls_get_addr. */
#define GMA__TLS __thread

/* The calling thread's id (0: none yet; core/table.c). Hidden, so an access
 * from the hot path costs what one of a file-static variable does. */
extern GMA__TLS uint64_t gma__tl_thread_id __attribute__((visibility("hidden")));
/* Gives the calling thread its id (first use). */
uint64_t gma__thread_id_new(void);
/* True on gma's own background thread (the worker sets it when it starts):
 * work it queues on an application stream is work the program never asked
 * for, so it stays off streams where that could hurt (core/streams.c). */
extern GMA__TLS bool gma__tl_background __attribute__((visibility("hidden")));

static inline uint64_t gma__thread_id(void) {
  uint64_t id = gma__tl_thread_id;
  return id ? id : gma__thread_id_new();
}

/* ---- Stream keys and the stream table ----------------------------------------
 * Real stream handles are pointers aligned to 8 or more. The default stream
 * (NULL or legacy 0x1) has key 0x4; a thread's per-thread default stream
 * (0x2) has key (thread id << 4) | 2: the same handle value names a
 * different stream on each thread. 0 and 0x8 mark empty and removed slots. */
#define KEY_DEFAULT ((uintptr_t)0x4)

static inline uintptr_t gma__stream_key(gma_stream_t handle, uint64_t *owner_tid) {
  *owner_tid = 0;
  if (handle == NULL || handle == GMA_STREAM_LEGACY) return KEY_DEFAULT;
  if (handle == GMA_STREAM_PER_THREAD) {
    *owner_tid = gma__thread_id();
    return (uintptr_t)(*owner_tid << 4) | 2;
  }
  return (uintptr_t)handle;
}

static inline size_t gma__key_hash(uintptr_t key, size_t capacity) {
  return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20) & (capacity - 1);
}

/* Any thread, lock-free: a retired record may be returned (callers check). */
static inline gma__stream_t *gma__stable_lookup(gma__pool_t *p, uintptr_t key) {
  gma__stable_t *t = gma__load_acquire(&p->stable); /* pairs with stable_publish */
  if (!t) return NULL;
  size_t mask = t->capacity - 1;
  for (size_t i = gma__key_hash(key, t->capacity), n = 0; n < t->capacity; i = (i + 1) & mask, n++) {
    uintptr_t k = gma__load_acquire(&t->slots[i].key); /* pairs with insert's release */
    if (k == key) return gma__load_acquire(&t->slots[i].rec);
    if (k == GMA__KEY_EMPTY) return NULL;
  }
  return NULL;
}

/* ---- Per-(stream, thread) counters ------------------------------------------
 * Each thread keeps a few (record -> counters) entries; a miss walks the
 * record's list and appends the thread's counters when it has none. */
typedef struct gma__tl_count {
  const gma__stream_t *stream;
  uint64_t serial; /* the record's: a record at a reused address has another */
  gma__tcount_t *count;
} gma__tl_count_t;
extern GMA__TLS gma__tl_count_t gma__tl_counts[GMA__TL_SLOTS] __attribute__((visibility("hidden")));
gma__tcount_t *gma__tcount_slow(gma__pool_t *p, gma__stream_t *s);

/* The calling thread's counters for stream s (made on first use). Any thread. */
static inline gma__tcount_t *gma__tcount(gma__pool_t *p, gma__stream_t *s) {
  gma__tl_count_t *slot = &gma__tl_counts[((uintptr_t)s >> 6) % GMA__TL_SLOTS];
  if (slot->stream == s && slot->serial == s->serial) return slot->count;
  return gma__tcount_slow(p, s);
}

/* Lock held: the live record for handle whose device id is id, made (and a
 * stale record with a recycled handle orphaned) as needed; NULL without host
 * memory. */
gma__stream_t *gma__stream_resolve(gma__pool_t *p, gma_stream_t handle, uint64_t id);
/* The live record of handle, or NULL (no device call). */
gma__stream_t *gma__stream_find(gma__pool_t *p, gma_stream_t handle);
/* Lock held: the key of s stops resolving. */
void gma__stable_remove(gma__pool_t *p, gma__stream_t *s);
/* Puts p on / takes it off the process-wide list of pools that a thread's
 * exit walks to retire its per-thread default streams. */
void gma__pools_add(gma__pool_t *p);
void gma__pools_remove(gma__pool_t *p);
/* Frees the records' counters and bins and the stream tables (pool fini). */
void gma__table_fini(gma__pool_t *p);

#endif /* GMA_CORE_TABLE_H */
