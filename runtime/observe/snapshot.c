/* Owns the two pictures of an allocator's memory a person reads: the JSON
 * snapshot of every segment and block (gma_snapshot_json) and the memory
 * summary table (gma_memory_summary); api/observe.c checks their arguments.
 * Both read the pool in one gma__pool_with_lock (under the pool lock). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/allocator.h"
#include "observe/observe.h"

static const char *state_name(uint8_t st) {
  switch (st) {
    case GMA__LIVE: return "live";
    case GMA__BINNED: return "binned";
    case GMA__CACHED: return "cached";
    case GMA__PENDING: return "pending";
    default: return "free";
  }
}

/* The JSON snapshot's walk (gma__pool_with_lock: lock held). */
typedef struct json_walk {
  gma_t *g;
  FILE *f;
} json_walk_t;

/* One segment's blocks: a plan's arena as the planned blocks in it. */
static void json_segment(gma_t *g, FILE *f, gma__segment_t *seg) {
  gma__pool_t *p = &g->pool;
  for (gma__block_t *b = seg->first; b; b = b->next) {
    uint8_t st = gma__load_relaxed(&b->state);
    uint64_t pl_live, pl_req;
    if (st == GMA__LIVE && g->cfg.plan && /* a plan's arena: its blocks, not one */
        gma__plan_snapshot(&g->plan, b->addr, f, b == seg->first, &pl_live, &pl_req))
      continue;
    /* A FREE block belongs to no stream (its record may be stale). */
    uintptr_t stream = st != GMA__FREE && b->stream ? (uintptr_t)b->stream->handle : 0;
    char tag[GMA__TAG_JSON];
    fprintf(f,
            "%s{\"address\":\"0x%" PRIxPTR "\",\"size\":%" PRIu64
            ",\"state\":\"%s\",\"stream\":\"0x%" PRIxPTR "\",\"requested\":%" PRIu64
            ",\"tag\":\"%s\"}",
            b == seg->first ? "" : ",", b->addr, b->size, state_name(st), stream,
            st == GMA__LIVE ? gma__load_relaxed(&b->requested) : 0,
            st == GMA__LIVE ? gma__tag_json(gma__tag_name(p, gma__load_relaxed(&b->tag)), tag)
                            : "");
  }
}

static void json_locked(void *arg) {
  json_walk_t *j = arg;
  gma_t *g = j->g;
  FILE *f = j->f;
  gma__pool_t *p = &g->pool;
  gma__stats_sample(p);
  uint64_t live = 0, requested = 0;
  for (size_t i = 0; i < p->nsegs; i++)
    for (gma__block_t *b = p->segs[i]->first; b; b = b->next)
      if (gma__load_relaxed(&b->state) == GMA__LIVE) {
        uint64_t pl_live, pl_req; /* a plan's arena: the planned blocks live in it */
        bool arena =
            g->cfg.plan && gma__plan_snapshot(&g->plan, b->addr, NULL, true, &pl_live, &pl_req);
        live += arena ? pl_live : b->size;
        requested += arena ? pl_req : gma__load_relaxed(&b->requested);
      }
  fprintf(f,
          "{\"version\":1,\"device\":\"%s\",\"reserved\":%" PRIu64 ",\"allocated\":%" PRIu64
          ",\"requested\":%" PRIu64 ",\"kept\":%" PRIu64 ",\"segments\":[",
          g->dev->name, p->c.reserved.current, live, requested, p->src->kept_bytes);
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    /* A growable segment names its address range (an id, 0 for none):
     * between two segments of one range the addresses are unmapped. */
    uintptr_t range = (uintptr_t)seg->range;
    fprintf(f,
            "%s\n{\"address\":\"0x%" PRIxPTR "\",\"size\":%" PRIu64
            ",\"pool\":\"%s\",\"growable\":%s,\"range\":\"0x%" PRIxPTR "\",\"blocks\":[",
            i ? "," : "", seg->base, seg->size, seg->kind == GMA__SMALL ? "small" : "large",
            seg->range ? "true" : "false", range);
    json_segment(g, f, seg);
    fputs("]}", f);
  }
}

gma_status_t gma__snapshot_json(gma_t *g, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_snapshot_json: cannot create '%s': %s",
                          path, strerror(errno));
  json_walk_t j = {g, f};
  gma__pool_with_lock(&g->pool, json_locked, &j);
  fputs("\n]}\n", f);
  if (ferror(f) | (fclose(f) != 0))
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_snapshot_json: writing '%s' failed",
                          path);
  return GMA_OK;
}

/* ---- The summary -------------------------------------------------------------- */

typedef struct out {
  char *buf;
  size_t len, at; /* at may pass len: the size needed */
} out_t;

static void put(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_t *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(o->at < o->len ? o->buf + o->at : NULL, o->at < o->len ? o->len - o->at : 0,
                    fmt, ap);
  va_end(ap);
  if (n > 0) o->at += (size_t)n;
}

/* Bytes as a short human figure: "512 B", "3.5 MiB", "37.12 GiB". */
static const char *human(char *s, size_t n, uint64_t b) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  if (u == 0) snprintf(s, n, "%" PRIu64 " B", b);
  else snprintf(s, n, "%.2f %s", v, unit[u]);
  return s;
}

#define RULE "+----------------------------+--------------+--------------+--------------+\n"

static void row3(out_t *o, const char *name, uint64_t cur, uint64_t peak, uint64_t total,
                 bool bytes) {
  char a[32], b[32], c[32];
  if (bytes) {
    human(a, sizeof a, cur);
    human(b, sizeof b, peak);
    human(c, sizeof c, total);
  } else {
    snprintf(a, sizeof a, "%" PRIu64, cur);
    snprintf(b, sizeof b, "%" PRIu64, peak);
    snprintf(c, sizeof c, "%" PRIu64, total);
  }
  put(o, "| %-26s | %12s | %12s | %12s |\n", name, a, b, c);
}

static void row1(out_t *o, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void row1(out_t *o, const char *name, const char *fmt, ...) {
  char v[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof v, fmt, ap);
  va_end(ap);
  put(o, "| %-26s | %-42s |\n", name, v);
}

/* The summary's live figures: bytes and count per tag, and in all. */
typedef struct live_tally {
  gma__pool_t *p;
  uint64_t bytes, count, tag_bytes[GMA__MAX_TAGS], tag_count[GMA__MAX_TAGS];
} live_tally_t;

static void tally(live_tally_t *t, unsigned tag, uint64_t size) {
  t->bytes += size;
  t->count++;
  t->tag_bytes[tag] += size;
  t->tag_count[tag]++;
}

/* gma__plan_each_live's callback: a live planned block, its tag by name
 * (gma__tag_name's string: the id whose name it is; "untagged" is 0). */
static bool tally_planned(void *arg, const gma_allocation_info_t *info, uint64_t born) {
  (void)born;
  live_tally_t *t = arg;
  unsigned id = 0, n = gma__load_acquire(&t->p->ntags);
  if (info->tag != gma__tag_name(t->p, 0))
    for (unsigned i = 1; i <= n && i < GMA__MAX_TAGS && !id; i++)
      if (info->tag == gma__tag_name(t->p, i)) id = i;
  tally(t, id, info->block_size);
  return true;
}

/* The summary's walk of the pool: live bytes by pool kind (planned blocks
 * counted, not their arena), reserved bytes and segments by kind. */
typedef struct pool_walk {
  gma_t *g;
  live_tally_t *lt;
  uint64_t live[GMA__NKINDS], reserved[GMA__NKINDS], segs[GMA__NKINDS];
} pool_walk_t;

/* Walks g's segments into w and lt (gma__pool_with_lock: lock held). A plan's
 * arena (plan:on) is one live block to the pool; the planned blocks live in
 * it are what the program holds, and those are counted, as gma_live_report
 * does. */
static void walk_locked(void *arg) {
  pool_walk_t *w = arg;
  gma_t *g = w->g;
  live_tally_t *lt = w->lt;
  gma__pool_t *p = &g->pool;
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    w->reserved[seg->kind] += seg->size;
    w->segs[seg->kind]++;
    for (gma__block_t *b = seg->first; b; b = b->next) {
      if (gma__load_relaxed(&b->state) != GMA__LIVE) continue;
      uint64_t before = lt->bytes;
      if (!g->cfg.plan || !gma__plan_each_live(&g->plan, b->addr, tally_planned, lt))
        tally(lt, gma__load_relaxed(&b->tag), b->size);
      w->live[seg->kind] += lt->bytes - before;
    }
  }
}

/* The summary's title and its byte figures. */
static void summary_bytes(out_t *o, gma_t *g, const gma_stats_t *s, const pool_walk_t *w) {
  char a[32], b[32], c[32], title[80];
  put(o, "+=========================================================================+\n");
  snprintf(title, sizeof title, "gma memory summary: device %s%s", g->dev->name,
           g->pool.growable ? ", growable segments" : "");
  put(o, "| %-71s |\n", title);
  put(o, RULE);
  put(o, "| %-26s | %12s | %12s | %12s |\n", "metric", "current", "peak", "total");
  put(o, RULE);
  row3(o, "allocated", s->allocated.current, s->allocated.peak, s->allocated.total, true);
  row1(o, "  from small pool", "%s now", human(a, sizeof a, w->live[GMA__SMALL]));
  row1(o, "  from large pool", "%s now", human(a, sizeof a, w->live[GMA__LARGE]));
  row3(o, "requested", s->requested.current, s->requested.peak, s->requested.total, true);
  row3(o, "active (alloc + pending)", s->active.current, s->active.peak, s->active.total, true);
  row3(o, "reserved", s->reserved.current, s->reserved.peak, s->reserved.total, true);
  row1(o, "  small pool", "%s in %" PRIu64 " segments",
       human(a, sizeof a, w->reserved[GMA__SMALL]), w->segs[GMA__SMALL]);
  row1(o, "  large pool", "%s in %" PRIu64 " segments",
       human(a, sizeof a, w->reserved[GMA__LARGE]), w->segs[GMA__LARGE]);
  row3(o, "cached (reserved - alloc)", s->cached.current, s->cached.peak, s->cached.total, true);
  row1(o, "  stream / pending / free", "%s / %s / %s",
       human(a, sizeof a, s->stream_cached_bytes), human(b, sizeof b, s->pending_bytes),
       human(c, sizeof c, s->free_bytes));
  row1(o, "largest free block", "%s", human(a, sizeof a, s->largest_free_block));
  /* docs/stats.md: idle bytes in free regions below the median live block size */
  row1(o, "fragmentation", "%.1f%% of cache too small to reuse", 100.0 * s->fragmentation);
  put(o, RULE);
}

/* The summary's counts of calls and events. */
static void summary_counts(out_t *o, const gma_stats_t *s, uint64_t blocks_live) {
  char a[32], b[32];
  row1(o, "allocations / frees", "%" PRIu64 " / %" PRIu64 " (%" PRIu64 " live)", s->num_allocs,
       s->num_frees, blocks_live);
  row1(o, "hits: bin/stream/pool/dev", "%" PRIu64 " / %" PRIu64 " / %" PRIu64 " / %" PRIu64,
       s->hits_bin, s->hits_stream, s->hits_pool, s->hits_device);
  row1(o, "device allocs / frees", "%" PRIu64 " / %" PRIu64, s->num_device_allocs,
       s->num_device_frees);
  row1(o, "OOMs / OOM retries", "%" PRIu64 " / %" PRIu64, s->num_ooms, s->num_oom_retries);
  row1(o, "batches (split)", "%" PRIu64 " (%" PRIu64 ")", s->num_batches, s->num_batches_split);
  row1(o, "futures: submitted/at once", "%" PRIu64 " / %" PRIu64, s->futures_submitted,
       s->futures_ready_at_once);
  row1(o, "futures: ready/failed/t-o", "%" PRIu64 " / %" PRIu64 " / %" PRIu64 " (%" PRIu64
       " queued)", s->futures_ready, s->futures_failed, s->futures_timed_out, s->queue_depth);
  row1(o, "trims: explicit/timed", "%" PRIu64 " / %" PRIu64 " (%s given back)",
       s->trims_explicit, s->trims_timed, human(a, sizeof a, s->bytes_trimmed));
  row1(o, "trims: idle/pressure", "%" PRIu64 " / %" PRIu64 " (pressure level %d)",
       s->trims_idle, s->trims_pressure, s->pressure_level);
  row1(o, "streams / epoch events", "%" PRIu64 " / %" PRIu64, s->num_streams,
       s->num_epoch_events);
  row1(o, "host pinned: live/held", "%s / %s", human(a, sizeof a, s->host_allocated.current),
       human(b, sizeof b, s->host_reserved.current));
  row1(o, "CPU fallbacks", "%" PRIu64 " (%s live)", s->num_fallbacks,
       human(a, sizeof a, s->fallback_bytes));
}

/* The summary's planned-memory rows (plan:on only) and its tags. */
static void summary_plan_tags(out_t *o, gma_t *g, const gma_stats_t *s, const live_tally_t *lt) {
  char a[32], b[32];
  if (g->cfg.plan) {
    static const char *const states[] = {"off", "learning", "verifying", "placing", "active"};
    row1(o, "plan", "%s, %" PRIu64 " allocations per iteration",
         states[s->plan_state < 0 || s->plan_state > 4 ? 0 : s->plan_state], s->plan_slots);
    row1(o, "  arena / lower bound", "%s / %s (one live block of the large pool)",
         human(a, sizeof a, s->plan_arena_bytes), human(b, sizeof b, s->plan_lower_bound));
    row1(o, "  hits / misses / re-plans", "%" PRIu64 " / %" PRIu64 " / %" PRIu64, s->plan_hits,
         s->plan_misses, s->plan_replans);
  }
  put(o, RULE);
  put(o, "| %-26s | %-42s |\n", "live device memory by tag", "");
  for (unsigned t = 0; t < GMA__MAX_TAGS; t++)
    if (lt->tag_count[t]) {
      char name[40];
      snprintf(name, sizeof name, "  %s", gma__tag_name(&g->pool, t));
      row1(o, name, "%s in %" PRIu64 " allocations", human(a, sizeof a, lt->tag_bytes[t]),
           lt->tag_count[t]);
    }
  put(o, "+=========================================================================+\n");
}

gma_status_t gma__memory_summary(gma_t *g, const gma_stats_t *s, char *buf, size_t len) {
  live_tally_t *lt = calloc(1, sizeof *lt);
  if (!lt) return gma__set_error(GMA_ERR_OOM, "gma_memory_summary: out of host memory");
  lt->p = &g->pool;
  pool_walk_t w = {.g = g, .lt = lt};
  gma__pool_with_lock(&g->pool, walk_locked, &w);
  out_t o = {buf, len, 0};
  summary_bytes(&o, g, s, &w);
  summary_counts(&o, s, lt->count);
  summary_plan_tags(&o, g, s, lt);
  free(lt);
  if (o.at >= len) {
    buf[len - 1] = '\0';
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "gma_memory_summary: the buffer has %zu bytes; the summary needs %zu",
                          len, o.at + 1);
  }
  return GMA_OK;
}
