/* Offline placement for planned memory (plan.c): given the allocations of
 * one learned iteration, each with a size and a lifetime in the iteration's
 * event order, choose an offset for each inside one arena so that no two
 * allocations live at the same time share a byte, keeping the arena close to
 * the lower bound (the peak of live bytes). This is the offline
 * dynamic-storage-allocation problem; plan_place.c solves it heuristically.
 * Pure computation: no device, no locks, no globals. Any thread. */
#ifndef GMA_PLAN_PLACE_H
#define GMA_PLAN_PLACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gma__plan_item {
  uint64_t size;       /* bytes: a multiple of 512, > 0 */
  uint32_t start, end; /* live during [start, end) of the iteration's events; start < end */
} gma__plan_item_t;

/* Places n items: offsets[i] (a multiple of 512) for each, such that two
 * items whose [start, end) intersect never overlap in [offset, offset +
 * size). *arena gets max(offset + size) (0 for n == 0) and *lower_bound the
 * most bytes live at one time, which no placement can beat. Returns false
 * only when host memory for the work is lacking (outputs then undefined). */
bool gma__plan_place(const gma__plan_item_t *items, size_t n, uint64_t *offsets,
                     uint64_t *arena, uint64_t *lower_bound);

/* True when offsets is a valid placement of the items in arena bytes (as
 * described above); for tests and debug builds. O(n log n). False as well
 * when host memory for the check is lacking. */
bool gma__plan_place_is_valid(const gma__plan_item_t *items, size_t n, const uint64_t *offsets,
                              uint64_t arena);

#endif /* GMA_PLAN_PLACE_H */
