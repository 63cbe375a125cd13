/* Owns the offline placement of a planned iteration (plan_place.h).
 * Greedy by size: the largest item first, each at the lowest offset where
 * it overlaps no placed item live at the same time. O(n^2 log n): a first
 * version, to be replaced by a faster one. */
#include "plan_place.h"

#include <stdlib.h>

static const gma__plan_item_t *sort_items;

static int by_size_desc(const void *a, const void *b) {
  const gma__plan_item_t *x = &sort_items[*(const size_t *)a], *y = &sort_items[*(const size_t *)b];
  if (x->size != y->size) return x->size < y->size ? 1 : -1;
  return x->start < y->start ? -1 : x->start > y->start;
}

typedef struct span {
  uint64_t lo, hi;
} span_t;

static int by_lo(const void *a, const void *b) {
  const span_t *x = a, *y = b;
  return (x->lo > y->lo) - (x->lo < y->lo);
}

static bool live_together(const gma__plan_item_t *a, const gma__plan_item_t *b) {
  return a->start < b->end && b->start < a->end;
}

static uint64_t peak_live(const gma__plan_item_t *items, size_t n) {
  uint64_t best = 0;
  for (size_t i = 0; i < n; i++) { /* the peak is at some item's start */
    uint64_t live = 0;
    for (size_t j = 0; j < n; j++)
      if (items[j].start <= items[i].start && items[i].start < items[j].end) live += items[j].size;
    if (live > best) best = live;
  }
  return best;
}

bool gma__plan_place(const gma__plan_item_t *items, size_t n, uint64_t *offsets,
                     uint64_t *arena, uint64_t *lower_bound) {
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  span_t *spans = malloc((n ? n : 1) * sizeof *spans);
  bool *placed = calloc(n ? n : 1, sizeof *placed);
  if (!order || !spans || !placed) {
    free(order), free(spans), free(placed);
    return false;
  }
  for (size_t i = 0; i < n; i++) order[i] = i;
  sort_items = items; /* not reentrant: this version is */
  qsort(order, n, sizeof *order, by_size_desc);
  uint64_t top = 0;
  for (size_t k = 0; k < n; k++) {
    size_t i = order[k], m = 0;
    for (size_t j = 0; j < n; j++)
      if (placed[j] && live_together(&items[i], &items[j]))
        spans[m++] = (span_t){offsets[j], offsets[j] + items[j].size};
    qsort(spans, m, sizeof *spans, by_lo);
    uint64_t at = 0;
    for (size_t s = 0; s < m; s++) {
      if (spans[s].lo >= at + items[i].size) break;
      if (spans[s].hi > at) at = spans[s].hi;
    }
    offsets[i] = at;
    placed[i] = true;
    if (at + items[i].size > top) top = at + items[i].size;
  }
  *arena = top;
  *lower_bound = peak_live(items, n);
  free(order), free(spans), free(placed);
  return true;
}

bool gma__plan_place_is_valid(const gma__plan_item_t *items, size_t n, const uint64_t *offsets,
                              uint64_t arena) {
  for (size_t i = 0; i < n; i++) {
    if (offsets[i] % 512 || items[i].size % 512 || !items[i].size ||
        items[i].start >= items[i].end || offsets[i] + items[i].size > arena)
      return false;
    for (size_t j = i + 1; j < n; j++)
      if (live_together(&items[i], &items[j]) && offsets[i] < offsets[j] + items[j].size &&
          offsets[j] < offsets[i] + items[i].size)
        return false;
  }
  return true;
}
