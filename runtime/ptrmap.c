/* Owns the open-addressing pointer map used for the live-block index and the
 * stream table (see ptrmap.h). */
#include "ptrmap.h"

#include <stdlib.h>

/* Fibonacci hashing spreads 512-byte aligned addresses and small handles. */
static size_t slot_of(uintptr_t key, size_t capacity) {
  return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 17) & (capacity - 1);
}

void *gma__ptrmap_get(const gma__ptrmap_t *m, uintptr_t key) {
  if (m->capacity == 0) return NULL;
  for (size_t i = slot_of(key, m->capacity);; i = (i + 1) & (m->capacity - 1)) {
    if (m->slots[i].key == key) return m->slots[i].value;
    if (m->slots[i].key == 0) return NULL;
  }
}

static bool grow(gma__ptrmap_t *m) {
  size_t cap = m->capacity ? m->capacity * 2 : 64;
  gma__ptrmap_slot_t *slots = calloc(cap, sizeof *slots);
  if (!slots) return false;
  for (size_t j = 0; j < m->capacity; j++) {
    if (m->slots[j].key == 0) continue;
    size_t i = slot_of(m->slots[j].key, cap);
    while (slots[i].key != 0) i = (i + 1) & (cap - 1);
    slots[i] = m->slots[j];
  }
  free(m->slots);
  m->slots = slots;
  m->capacity = cap;
  return true;
}

bool gma__ptrmap_put(gma__ptrmap_t *m, uintptr_t key, void *value) {
  if ((m->count + 1) * 4 >= m->capacity * 3 && !grow(m)) return false;
  size_t i = slot_of(key, m->capacity);
  while (m->slots[i].key != 0 && m->slots[i].key != key) i = (i + 1) & (m->capacity - 1);
  if (m->slots[i].key == 0) m->count++;
  m->slots[i].key = key;
  m->slots[i].value = value;
  return true;
}

void *gma__ptrmap_remove(gma__ptrmap_t *m, uintptr_t key) {
  if (m->capacity == 0) return NULL;
  size_t mask = m->capacity - 1, i = slot_of(key, m->capacity);
  while (m->slots[i].key != key) {
    if (m->slots[i].key == 0) return NULL;
    i = (i + 1) & mask;
  }
  void *value = m->slots[i].value;
  /* Backward-shift: move later entries of the probe run into the hole when
   * their home slot is at or before it, so lookups never stop early. */
  for (size_t j = (i + 1) & mask; m->slots[j].key != 0; j = (j + 1) & mask) {
    size_t home = slot_of(m->slots[j].key, m->capacity);
    if (((j - home) & mask) >= ((j - i) & mask)) {
      m->slots[i] = m->slots[j];
      i = j;
    }
  }
  m->slots[i].key = 0;
  m->slots[i].value = NULL;
  m->count--;
  return value;
}

void gma__ptrmap_free(gma__ptrmap_t *m) {
  free(m->slots);
  m->slots = NULL;
  m->capacity = m->count = 0;
}
