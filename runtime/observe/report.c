/* Owns the reports on live allocations behind gma_find_old_allocations
 * (ages, for finding what a long-running program forgot) and gma_live_report
 * (a table by tag and the oldest allocations; gma_destroy prints it for
 * leaks); api/observe.c checks their arguments.
 * Memory an async request got that nobody collected is not the program's
 * yet, so it is left out. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/allocator.h"
#include "observe/observe.h"

static int by_age(const void *a, const void *b) {
  const gma_allocation_info_t *x = a, *y = b;
  return x->age_ns < y->age_ns ? 1 : x->age_ns > y->age_ns ? -1 : 0;
}

typedef struct found {
  gma_t *g;
  gma_allocation_info_t *v;
  size_t n, cap;
  uint64_t now, min_age;
  bool oom;
} found_t;

/* Adds info when it is old enough; false (and oom set) without host memory. */
static bool add(void *arg, const gma_allocation_info_t *info, uint64_t born) {
  found_t *f = arg;
  uint64_t age = f->now > born ? f->now - born : 0;
  if (age < f->min_age) return true;
  if (f->n == f->cap) {
    size_t cap = f->cap ? f->cap * 2 : 64;
    gma_allocation_info_t *w = realloc(f->v, cap * sizeof *w);
    if (!w) {
      f->oom = true;
      return false;
    }
    f->v = w, f->cap = cap;
  }
  f->v[f->n] = *info;
  f->v[f->n++].age_ns = age;
  return true;
}

/* collect's walk (gma__pool_with_lock: lock held). */
static void collect_locked(void *arg) {
  found_t *f = arg;
  gma_t *g = f->g;
  gma__pool_t *p = &g->pool;
  f->now = gma__load_relaxed(&p->clock_ns);
  for (size_t i = 0; i < p->nsegs && !f->oom; i++)
    for (gma__block_t *b = p->segs[i]->first; b && !f->oom; b = b->next) {
      if (gma__load_relaxed(&b->state) != GMA__LIVE || gma__load_relaxed(&b->future_held)) continue;
      if (g->cfg.plan && gma__plan_each_live(&g->plan, b->addr, add, f)) continue;
      gma_allocation_info_t info = {
          .ptr = (void *)b->addr,
          .requested = gma__load_relaxed(&b->requested),
          .block_size = b->size,
          .stream = b->stream ? b->stream->handle : NULL,
          .tag = gma__tag_name(p, gma__load_relaxed(&b->tag))};
      add(f, &info, gma__load_relaxed(&b->born_ns));
    }
}

/* The live blocks at least min_age old, into a malloc'd array sorted oldest
 * first (NULL with *n 0 when there are none or no memory), read under the
 * pool lock. A plan's arena (plan:on) is one live block to the pool; the
 * planned blocks in it are what the program holds, and those are listed. */
static gma_allocation_info_t *collect(gma_t *g, uint64_t min_age, size_t *n) {
  gma__pool_t *p = &g->pool;
  gma__pool_tick_clock(p);
  found_t f = {.g = g, .min_age = min_age};
  gma__pool_with_lock(p, collect_locked, &f);
  if (f.oom) {
    free(f.v);
    *n = 0;
    return NULL;
  }
  *n = f.n;
  if (f.n > 1) qsort(f.v, f.n, sizeof *f.v, by_age);
  return f.v;
}

void gma__find_old_allocations(gma_t *g, uint64_t min_age_ns, gma_allocation_info_t *out,
                               size_t cap, size_t *count) {
  size_t n;
  gma_allocation_info_t *v = collect(g, min_age_ns, &n);
  *count = n;
  if (cap && n) memcpy(out, v, (n < cap ? n : cap) * sizeof *out); /* v is NULL when n is 0 */
  free(v);
}

gma_status_t gma__live_report(gma_t *g, size_t rows, char *buf, size_t len) {
  size_t n;
  gma_allocation_info_t *v = collect(g, 0, &n);
  uint64_t bytes[GMA__MAX_TAGS] = {0}, count[GMA__MAX_TAGS] = {0}, total = 0;
  const char *names[GMA__MAX_TAGS] = {0};
  for (size_t i = 0; i < n; i++)
    for (unsigned t = 0; t < GMA__MAX_TAGS; t++)
      if (!names[t] || names[t] == v[i].tag) { /* tag names are interned: compare pointers */
        names[t] = v[i].tag;
        bytes[t] += v[i].block_size;
        count[t]++;
        total += v[i].block_size;
        break;
      }
  size_t at = 0;
#define PUT(...)                                                                      \
  do {                                                                                \
    int k_ = snprintf(at < len ? buf + at : NULL, at < len ? len - at : 0, __VA_ARGS__); \
    if (k_ > 0) at += (size_t)k_;                                                     \
  } while (0)
  PUT("%zu live allocations, %" PRIu64 " bytes\n", n, total);
  for (unsigned t = 0; t < GMA__MAX_TAGS && names[t]; t++)
    PUT("  tag %-31s %8" PRIu64 " allocations %14" PRIu64 " bytes\n", names[t], count[t], bytes[t]);
  if (n && rows) PUT("oldest:\n");
  for (size_t i = 0; i < n && i < rows; i++)
    PUT("  %p %12zu bytes (asked %zu) stream %p tag %s age %.3f s\n", v[i].ptr, v[i].block_size,
        v[i].requested, v[i].stream, v[i].tag, (double)v[i].age_ns / 1e9);
#undef PUT
  free(v);
  if (at >= len) {
    buf[len - 1] = '\0';
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "gma_live_report: the buffer has %zu bytes; the report needs %zu", len,
                          at + 1);
  }
  return GMA_OK;
}
