/* Owns the pool's lifecycle (init, fini) and its clock. Every function here runs
 * under gma__pool_t.lock (core/types.h) unless it says otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/round.h"
#include "base/sizeclass.h"
#include "core/internal.h"

/* ---- Allocation ----------------------------------------------------------------*/

/* Pool serials: never reused in a process (nor across fork(): a child's
 * counter goes on from the parent's value), so a thread's cached entry of a
 * destroyed pool never matches a new one made at the same address. */
static _Atomic uint64_t next_pool_serial = 1;

gma_status_t gma__pool_init(gma__pool_t *p, gma__device_t *dev, const gma_config_t *cfg) {
  memset(p, 0, sizeof *p);
  p->serial = gma__faa_relaxed(&next_pool_serial, 1);
  if (pthread_mutex_init(&p->lock, NULL) != 0 || pthread_mutex_init(&p->count_lock, NULL) != 0 ||
      pthread_mutex_init(&p->trace_mu, NULL) != 0 || pthread_cond_init(&p->settled, NULL) != 0)
    return gma__set_error(GMA_ERR_INTERNAL, "pthread_mutex_init failed");
  p->dev = dev;
  p->small_size = cfg->small_size;
  p->segment_size[GMA__SMALL] = cfg->small_segment_size;
  p->segment_size[GMA__LARGE] = cfg->large_segment_size;
  p->limit = cfg->memory_limit;
  /* Segments no larger than the limit (here the device's capacity too): a
   * 2 MiB small segment under memory_limit:1M could never be made, so no
   * allocation could ever succeed. The parser rejects a segment
   * size set explicitly above an explicit memory_limit. */
  uint64_t room = p->limit / GMA__ROUND * GMA__ROUND;
  for (int k = 0; k < GMA__NKINDS; k++)
    if (p->segment_size[k] > room) p->segment_size[k] = room;
  p->reuse = cfg->reuse;
  p->oom_wait_ns = cfg->oom_wait_ms ? cfg->oom_wait_ms * 1000000u : UINT64_MAX;
  if (!cfg->bins_off) {
    p->nbins = gma__class_of(cfg->bin_max) + 1;
    p->bin_max = gma__class_size(p->nbins - 1);
    p->bin_depth = (uint32_t)cfg->bin_depth;
  }
  p->rng = 0x9E3779B9u;
  p->sweep_at = 64;
  p->clock_in_slow_path = cfg->worker_off;
  gma__pool_tick_clock(p);
  gma_status_t st = GMA_OK;
  /* Growable unless told otherwise: auto falls back to ordinary segments
   * wherever growable ones cannot be made (a device without virtual memory
   * management, a limit below one chunk, address space the device will not
   * reserve), so the default never fails where ordinary segments work. */
  if (cfg->expandable_segments != GMA_SEGMENTS_ORDINARY) {
    st = gma__vm_source_new(dev, &p->trace, p->limit, p->segment_size, &p->src);
    p->growable = st == GMA_OK;
    if (cfg->expandable_segments == GMA_SEGMENTS_AUTO) st = GMA_OK;
  }
  if (st == GMA_OK && !p->growable && !(p->src = gma__plain_source_new(dev, &p->trace)))
    st = gma__set_error(GMA_ERR_OOM, "host memory for the segment source");
  if (st == GMA_OK) gma__streams_init(p);
  if (st == GMA_OK) gma__pools_add(p); /* exiting threads retire their per-thread streams */
  return st;
}

void gma__pool_tick_clock(gma__pool_t *p) { gma__store_relaxed(&p->clock_ns, gma__now_ns()); }

uint64_t gma__pool_room(const gma__pool_t *p) {
  uint64_t held = p->c.reserved.current + p->leaving + p->src->kept_bytes;
  return p->limit > held ? (p->limit - held) / GMA__ROUND * GMA__ROUND : 0;
}

gma_status_t gma__pool_fini(gma__pool_t *p) {
  if (p->listed) gma__pools_remove(p); /* first: an exiting thread's hook may be inside */
  uint64_t leaked_bytes = 0, leaked = 0;
  uint64_t tag_bytes[GMA__MAX_TAGS] = {0}, tag_count[GMA__MAX_TAGS] = {0};
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    for (gma__block_t *b = seg->first; b; b = b->next) {
      if (gma__state_of(b) == GMA__LIVE && !gma__load_relaxed(&b->future_held)) {
        leaked++;
        leaked_bytes += b->size;
        tag_bytes[gma__load_relaxed(&b->tag)] += b->size;
        tag_count[gma__load_relaxed(&b->tag)]++;
      }
    }
    p->src->ops->drop(p->src, seg->range, seg->base, seg->size);
    free(seg);
  }
  free(p->segs);
  free(p->tails);
  free(p->tail_blocks);
  p->src->ops->fini(p->src);
  p->src = NULL;
  for (size_t i = 0; i < p->nchunks; i++) {
    gma__block_t *chunk = p->block_chunks[i];
    for (int j = 0; j < GMA__BLOCK_CHUNK; j++) free(chunk[j].gates);
    free(chunk);
  }
  free(p->block_chunks);
  gma__stream_t **tail = &p->stream_list; /* the graveyard is freed with the rest */
  while (*tail) tail = &(*tail)->next_all;
  *tail = p->graveyard;
  p->graveyard = NULL;
  gma__table_fini(p);
  gma__streams_fini(p);
  gma__pagemap_free(&p->pagemap);
  pthread_mutex_destroy(&p->count_lock);
  pthread_mutex_destroy(&p->lock);
  pthread_mutex_destroy(&p->trace_mu);
  /* In a fork() child a parent thread may have been waiting on it: then
   * destroying it could wait forever (fork.c); its memory goes anyway. */
  if (!p->inherited) pthread_cond_destroy(&p->settled);
  if (leaked == 0) return GMA_OK;
  /* The status's message, by tag (gma_destroy printed the full report). */
  char by_tag[512] = "";
  size_t at = 0;
  for (unsigned t = 0; t < GMA__MAX_TAGS && at < sizeof by_tag; t++)
    if (tag_count[t]) {
      int n = snprintf(by_tag + at, sizeof by_tag - at, "%s%s: %" PRIu64 " (%" PRIu64 " bytes)",
                       at ? ", " : "", gma__tag_name(p, t), tag_count[t], tag_bytes[t]);
      if (n > 0) at += (size_t)n;
    }
  return gma__set_error(GMA_ERR_LEAK,
                        "gma_destroy: %" PRIu64 " live allocations (%" PRIu64
                        " bytes) were never freed (by tag: %s); gma freed them",
                        leaked, leaked_bytes, by_tag);
}
