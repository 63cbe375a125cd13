/* The driver pool model (pool_model.h). Ranges tile [base, base + end) of
 * the reservation in address order; mapped runs (one vm_map each) tile the
 * mapped part, which may have holes where runs were unmapped. */
#include "pool_model.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "device/sim_cost.h"

enum { MAX_GATES = 8 };

typedef struct gate {
  gma_stream_t stream;
  gma__event_t ev;
} gate_t;

typedef struct range {
  uint64_t off, size;
  int free;
  gate_t gates[MAX_GATES]; /* free: the frees' events, one per stream */
  int ngates;
  struct range *prev, *next;
} range_t;

typedef struct run {
  uint64_t off, size, handle;
  struct run *next;
} run_t;

struct pool_model {
  gma__device_t *dev;
  const gma__sim_costs_t *costs; /* the pool's own calls' prices (NULL: free) */
  uintptr_t base;
  uint64_t va, end; /* reserved bytes; bytes tiled by ranges */
  uint64_t threshold;
  range_t *head;
  run_t *runs;
  gma__event_t *spare; /* events for reuse */
  size_t nspare, spare_cap;
  pthread_mutex_t mu;
  pool_model_stats_t st;
};

static uint64_t round_chunk(uint64_t n) {
  return (n + POOL_MODEL_CHUNK - 1) / POOL_MODEL_CHUNK * POOL_MODEL_CHUNK;
}

static gma__event_t event_get(pool_model_t *m) {
  if (m->nspare) return m->spare[--m->nspare];
  gma__event_t ev = NULL;
  if (m->dev->ops->event_create(m->dev, &ev) != GMA_OK) return NULL;
  return ev;
}

static void event_put(pool_model_t *m, gma__event_t ev) {
  if (m->nspare == m->spare_cap) {
    size_t cap = m->spare_cap ? 2 * m->spare_cap : 64;
    gma__event_t *a = realloc(m->spare, cap * sizeof *a);
    if (!a) {
      m->dev->ops->event_destroy(m->dev, ev);
      return;
    }
    m->spare = a, m->spare_cap = cap;
  }
  m->spare[m->nspare++] = ev;
}

static void gates_clear(pool_model_t *m, range_t *r) {
  for (int i = 0; i < r->ngates; i++) event_put(m, r->gates[i].ev);
  r->ngates = 0;
}

/* Orders stream's next work after every gate of r (waits for those of
 * other streams whose work is not done). */
static void gates_order(pool_model_t *m, range_t *r, gma_stream_t stream) {
  for (int i = 0; i < r->ngates; i++) {
    if (r->gates[i].stream == stream) continue;
    bool done = false;
    m->dev->ops->event_query(m->dev, r->gates[i].ev, &done);
    if (!done) {
      m->dev->ops->stream_wait_event(m->dev, stream, r->gates[i].ev);
      m->st.waits++;
    }
  }
}

/* Adds b's gates to a's (merged ranges); when there are too many, the
 * device is synchronized and none are needed. */
static void gates_merge(pool_model_t *m, range_t *a, range_t *b) {
  for (int i = 0; i < b->ngates; i++) {
    int k = 0;
    while (k < a->ngates && a->gates[k].stream != b->gates[i].stream) k++;
    if (k < a->ngates) { /* one stream: the later free's event covers both */
      event_put(m, a->gates[k].ev);
      a->gates[k].ev = b->gates[i].ev;
    } else if (a->ngates < MAX_GATES) {
      a->gates[a->ngates++] = b->gates[i];
    } else {
      m->dev->ops->device_synchronize(m->dev);
      event_put(m, b->gates[i].ev);
      gates_clear(m, a);
    }
  }
  b->ngates = 0;
}

static range_t *range_new(uint64_t off, uint64_t size, int free_) {
  range_t *r = calloc(1, sizeof *r);
  if (r) r->off = off, r->size = size, r->free = free_;
  return r;
}

/* Merges free r with free neighbours; returns the merged range. */
static range_t *coalesce(pool_model_t *m, range_t *r) {
  range_t *n = r->next;
  if (n && n->free) {
    gates_merge(m, r, n);
    r->size += n->size;
    r->next = n->next;
    if (n->next) n->next->prev = r;
    free(n);
  }
  range_t *p = r->prev;
  if (p && p->free) {
    gates_merge(m, p, r);
    p->size += r->size;
    p->next = r->next;
    if (r->next) r->next->prev = p;
    free(r);
    r = p;
  }
  return r;
}

/* Bytes of [off, off + size) that no mapped run covers. */
static uint64_t unmapped_in(const pool_model_t *m, uint64_t off, uint64_t size) {
  uint64_t covered = 0;
  for (const run_t *u = m->runs; u; u = u->next) {
    uint64_t lo = u->off > off ? u->off : off;
    uint64_t hi = u->off + u->size < off + size ? u->off + u->size : off + size;
    if (hi > lo) covered += hi - lo;
  }
  return size - covered;
}

/* Maps every chunk of [off, off + size) that is not mapped, one run per gap. */
static gma_status_t map_range(pool_model_t *m, uint64_t off, uint64_t size) {
  uint64_t lo = off / POOL_MODEL_CHUNK * POOL_MODEL_CHUNK, hi = round_chunk(off + size);
  for (uint64_t c = lo; c < hi;) {
    if (!unmapped_in(m, c, POOL_MODEL_CHUNK)) {
      c += POOL_MODEL_CHUNK;
      continue;
    }
    uint64_t e = c;
    while (e < hi && unmapped_in(m, e, POOL_MODEL_CHUNK)) e += POOL_MODEL_CHUNK;
    run_t *u = calloc(1, sizeof *u);
    if (!u) return GMA_ERR_OOM;
    gma_status_t st = m->dev->ops->vm_map(m->dev, m->base + c, e - c, &u->handle);
    if (st != GMA_OK) {
      free(u);
      return st;
    }
    u->off = c, u->size = e - c, u->next = m->runs;
    m->runs = u;
    m->st.mapped += e - c;
    m->st.maps += (e - c) / POOL_MODEL_CHUNK;
    if (m->st.mapped > m->st.mapped_peak) m->st.mapped_peak = m->st.mapped;
    c = e;
  }
  return GMA_OK;
}

/* Whether [off, off + size) lies wholly in free ranges. */
static int all_free(const pool_model_t *m, uint64_t off, uint64_t size) {
  for (const range_t *r = m->head; r; r = r->next)
    if (!r->free && r->off < off + size && off < r->off + r->size) return 0;
  return 1;
}

/* Unmaps runs that lie wholly in free memory, after their work (a device
 * synchronize), until want bytes went (UINT64_MAX: all of them). */
static uint64_t unmap_free(pool_model_t *m, uint64_t want) {
  uint64_t gone = 0;
  int synced = 0;
  for (run_t **pu = &m->runs; *pu && gone < want;) {
    run_t *u = *pu;
    if (!all_free(m, u->off, u->size)) {
      pu = &u->next;
      continue;
    }
    if (!synced++) m->dev->ops->device_synchronize(m->dev);
    if (m->dev->ops->vm_unmap(m->dev, m->base + u->off, u->size, u->handle) != GMA_OK) {
      pu = &u->next;
      continue;
    }
    gone += u->size;
    m->st.mapped -= u->size;
    m->st.unmaps += u->size / POOL_MODEL_CHUNK;
    *pu = u->next;
    free(u);
  }
  return gone;
}

static range_t *best_fit(pool_model_t *m, uint64_t size) {
  range_t *best = NULL;
  for (range_t *r = m->head; r; r = r->next)
    if (r->free && r->size >= size && (!best || r->size < best->size)) best = r;
  return best;
}

/* A new free range of size bytes (rounded to chunks) at the end of what is
 * tiled. A free range already at the end is not extended in place: the
 * growth maps the whole request, and the two merge once both are free. */
static range_t *grow(pool_model_t *m, uint64_t size) {
  range_t *last = m->head;
  while (last && last->next) last = last->next;
  uint64_t add = round_chunk(size);
  if (m->end + add > m->va) return NULL;
  range_t *r = range_new(m->end, add, 1);
  if (!r) return NULL;
  r->prev = last;
  if (last) last->next = r; else m->head = r;
  m->end += add;
  return r;
}

/* Cuts the first size bytes of free r off as a live range; the rest keeps
 * the gates (its memory may still be in use by the same work). */
static range_t *take(pool_model_t *m, range_t *r, uint64_t size) {
  if (r->size > size) {
    range_t *rest = range_new(r->off + size, r->size - size, 1);
    if (!rest) return NULL;
    memcpy(rest->gates, r->gates, sizeof r->gates);
    rest->ngates = r->ngates;
    r->ngates = 0;
    rest->prev = r, rest->next = r->next;
    if (r->next) r->next->prev = rest;
    r->next = rest;
    r->size = size;
  }
  gates_clear(m, r);
  r->free = 0;
  return r;
}

static gma_status_t alloc_locked(pool_model_t *m, uint64_t size, gma_stream_t stream,
                                 void **out) {
  size = (size + 511) / 512 * 512;
  range_t *r = best_fit(m, size);
  if (!r) r = grow(m, size);
  if (!r) return GMA_ERR_OOM;
  gma_status_t st = map_range(m, r->off, size);
  if (st == GMA_ERR_OOM && unmap_free(m, UINT64_MAX)) st = map_range(m, r->off, size);
  if (st != GMA_OK) return st;
  gates_order(m, r, stream);
  if (!take(m, r, size)) return GMA_ERR_OOM;
  m->st.live += size;
  if (m->st.live > m->st.live_peak) m->st.live_peak = m->st.live;
  m->st.allocs++;
  *out = (void *)(m->base + r->off);
  return GMA_OK;
}

gma_status_t pool_model_alloc(pool_model_t *m, uint64_t size, gma_stream_t stream, void **out) {
  pthread_mutex_lock(&m->mu);
  gma__sim_cost_pay(m->costs, GMA__SIM_COST_POOL_ALLOC, 0);
  gma_status_t st = alloc_locked(m, size, stream, out);
  if (st != GMA_OK) m->st.failures++;
  pthread_mutex_unlock(&m->mu);
  return st;
}

gma_status_t pool_model_free(pool_model_t *m, void *ptr, gma_stream_t stream) {
  pthread_mutex_lock(&m->mu);
  gma__sim_cost_pay(m->costs, GMA__SIM_COST_POOL_FREE, 0);
  uint64_t off = (uintptr_t)ptr - m->base;
  range_t *r = m->head;
  while (r && r->off != off) r = r->next;
  gma_status_t st = GMA_ERR_INVALID_POINTER;
  if (r && !r->free) {
    gma__event_t ev = event_get(m);
    if (ev && m->dev->ops->event_record(m->dev, ev, stream) == GMA_OK) {
      r->gates[0] = (gate_t){stream, ev};
      r->ngates = 1;
    } else if (ev) {
      event_put(m, ev);
    }
    r->free = 1;
    m->st.live -= r->size;
    m->st.frees++;
    coalesce(m, r);
    st = GMA_OK;
  }
  pthread_mutex_unlock(&m->mu);
  return st;
}

void pool_model_synchronized(pool_model_t *m) {
  pthread_mutex_lock(&m->mu);
  if (m->threshold != UINT64_MAX && m->st.mapped > m->st.live + m->threshold)
    unmap_free(m, m->st.mapped - m->st.live - m->threshold);
  pthread_mutex_unlock(&m->mu);
}

gma_status_t pool_model_create(gma__device_t *dev, const gma__sim_costs_t *costs, uint64_t va_bytes,
                               uint64_t release_threshold, pool_model_t **out) {
  pool_model_t *m = calloc(1, sizeof *m);
  if (!m) return GMA_ERR_OOM;
  m->dev = dev;
  m->costs = costs;
  m->va = round_chunk(va_bytes);
  m->threshold = release_threshold;
  pthread_mutex_init(&m->mu, NULL);
  gma_status_t st = dev->ops->vm_reserve ? dev->ops->vm_reserve(dev, m->va, &m->base)
                                         : GMA_ERR_UNSUPPORTED;
  if (st != GMA_OK) {
    pthread_mutex_destroy(&m->mu);
    free(m);
    return st;
  }
  *out = m;
  return GMA_OK;
}

void pool_model_destroy(pool_model_t *m) {
  if (!m) return;
  m->dev->ops->device_synchronize(m->dev);
  for (run_t *u = m->runs, *n; u; u = n) {
    n = u->next;
    m->dev->ops->vm_unmap(m->dev, m->base + u->off, u->size, u->handle);
    free(u);
  }
  for (range_t *r = m->head, *n; r; r = n) {
    n = r->next;
    for (int i = 0; i < r->ngates; i++) m->dev->ops->event_destroy(m->dev, r->gates[i].ev);
    free(r);
  }
  for (size_t i = 0; i < m->nspare; i++) m->dev->ops->event_destroy(m->dev, m->spare[i]);
  free(m->spare);
  m->dev->ops->vm_release(m->dev, m->base, m->va);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

void pool_model_stats(const pool_model_t *m, pool_model_stats_t *out) { *out = m->st; }
