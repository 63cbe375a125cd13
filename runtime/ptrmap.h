/* A map from uintptr_t keys to pointers: open addressing, linear probing,
 * backward-shift deletion (no tombstones). Not thread-safe: its owner's lock
 * guards it. Key 0 is reserved for "empty"; callers remap a real 0 key. */
#ifndef GMA_PTRMAP_H
#define GMA_PTRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gma__ptrmap_slot {
  uintptr_t key; /* 0 = empty */
  void *value;
} gma__ptrmap_slot_t;

/* Invariant: count < capacity * 3/4; capacity is a power of two or 0. */
typedef struct gma__ptrmap {
  gma__ptrmap_slot_t *slots;
  size_t capacity;
  size_t count;
} gma__ptrmap_t;

/* Returns the value for key, or NULL. */
void *gma__ptrmap_get(const gma__ptrmap_t *m, uintptr_t key);
/* Inserts or replaces; false only when memory for growth is lacking. */
bool gma__ptrmap_put(gma__ptrmap_t *m, uintptr_t key, void *value);
/* Removes key; returns the old value or NULL. */
void *gma__ptrmap_remove(gma__ptrmap_t *m, uintptr_t key);
void gma__ptrmap_free(gma__ptrmap_t *m);

#endif /* GMA_PTRMAP_H */
