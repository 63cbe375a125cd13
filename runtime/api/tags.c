/* Owns what a caller can learn about one allocation: its tag (gma_alloc_tagged;
 * names interned per allocator by core/tags.c, ids stored on the block) and where it lives
 * (gma_pointer_info: device memory, pinned host memory, or host memory given
 * as a CPU fallback). */
#include <inttypes.h>
#include <string.h>

#include "api/allocator.h"

gma_status_t gma_alloc_tagged(gma_t *g, size_t size, gma_stream_t stream, const char *tag,
                              void **out) {
  GMA__CHECK(g, "gma_alloc_tagged");
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_alloc_tagged: out is NULL");
  *out = NULL;
  int id = gma__tag_intern(&g->pool, tag);
  if (id < 0) return GMA_ERR_INVALID_ARGUMENT;
  gma_status_t st = gma_alloc(g, size, stream, out);
  if (st != GMA_OK) return st;
  /* Planned memory first: the arena's own block starts where a planned one may. */
  if (g->cfg.plan && gma__plan_set_tag(&g->plan, *out, (uint8_t)id)) return GMA_OK;
  gma__block_t *b = gma__pagemap_get(&g->pool.pagemap, (uintptr_t)*out);
  if (b && gma__load_relaxed(&b->arena)) return GMA_OK; /* a graph pool's: untagged */
  if (b) gma__store_relaxed(&b->tag, (uint8_t)id); /* ours: LIVE, handed to us */
  else gma__host_set_tag(&g->host, *out, (uint8_t)id); /* a CPU fallback */
  return GMA_OK;
}

gma_status_t gma_pointer_info(gma_t *g, const void *ptr, gma_pointer_info_t *info) {
  GMA__CHECK(g, "gma_pointer_info");
  if (!info) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_pointer_info: info is NULL");
  gma_status_t st = gma__struct_size_check(info->size, sizeof(gma_pointer_info_t),
                                           "gma_pointer_info", "info", "GMA_POINTER_INFO_INIT");
  if (st != GMA_OK) return st;
  gma_pointer_info_t r = {.size = info->size};
  gma__pool_t *p = &g->pool;
  uintptr_t a = (uintptr_t)ptr;
  int graphed = gma__graph_info(&g->graphs, ptr, &r);
  if (graphed < 0) /* a chunk is one live block to the pool: not what the caller has */
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_pointer_info(%p): the pointer lies in a graph pool's memory that "
                          "no live allocation holds now", ptr);
  int planned = !graphed && g->cfg.plan ? gma__plan_info(&g->plan, ptr, &r) : 0;
  if (planned < 0) /* the arena is one live block to the pool: not what the caller has */
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_pointer_info(%p): the pointer lies in planned memory (plan:on) "
                          "that no live allocation holds now", ptr);
  bool found = planned > 0 || graphed > 0;
  if (!found) found = gma__pool_live_info(p, ptr, &r);
  if (!found && !gma__host_pointer_info(&g->host, p, ptr, &r))
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_pointer_info(%p): the pointer lies in no live allocation of this "
                          "allocator (device or host)", ptr);
  /* The allocation is the bytes asked for; the block's rounding after them
   * is gma's (gma_free and gma_record_stream refuse a pointer there too). */
  uintptr_t off = a - (uintptr_t)r.base;
  if (off && off >= r.requested)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_pointer_info(%p): the pointer lies past the end of the live "
                          "allocation at %p (%zu bytes asked for; the %zu bytes after them are "
                          "gma's rounding, not part of it)",
                          ptr, r.base, r.requested, r.block_size - r.requested);
  memcpy(info, &r, info->size);
  return GMA_OK;
}
