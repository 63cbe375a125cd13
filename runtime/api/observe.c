/* Owns the entry points of reports, snapshots and tracing: the handle and
 * argument checks, then observe/'s functions do the work (observe.h). */
#include "api/allocator.h"
#include "observe/observe.h"

gma_status_t gma_find_old_allocations(gma_t *g, uint64_t min_age_ns, gma_allocation_info_t *out,
                                      size_t cap, size_t *count) {
  GMA__CHECK(g, "gma_find_old_allocations");
  if (!count || (cap && !out))
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "gma_find_old_allocations: count is NULL, or out is NULL with cap > 0");
  gma__find_old_allocations(g, min_age_ns, out, cap, count);
  return GMA_OK;
}

gma_status_t gma_live_report(gma_t *g, size_t rows, char *buf, size_t len) {
  GMA__CHECK(g, "gma_live_report");
  if (!buf || !len)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_live_report: NULL or empty buffer");
  return gma__live_report(g, rows, buf, len);
}

gma_status_t gma_snapshot_json(gma_t *g, const char *path) {
  GMA__CHECK(g, "gma_snapshot_json");
  if (!path || !*path)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_snapshot_json: NULL or empty path");
  return gma__snapshot_json(g, path);
}

gma_status_t gma_snapshot_write(gma_t *g, const char *path, gma_snapshot_format_t format) {
  GMA__CHECK(g, "gma_snapshot_write");
  if (!path || !*path)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_snapshot_write: NULL or empty path");
  switch (format) {
    case GMA_SNAPSHOT_JSON: return gma__snapshot_json(g, path);
    case GMA_SNAPSHOT_TORCH: return gma__snapshot_torch(g, path);
  }
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "gma_snapshot_write: unknown format %d (GMA_SNAPSHOT_JSON %d or "
                        "GMA_SNAPSHOT_TORCH %d)", (int)format, GMA_SNAPSHOT_JSON,
                        GMA_SNAPSHOT_TORCH);
}

gma_status_t gma_memory_summary(gma_t *g, char *buf, size_t len) {
  GMA__CHECK(g, "gma_memory_summary");
  if (!buf || !len)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_memory_summary: NULL or empty buffer");
  gma_stats_t s = GMA_STATS_INIT;
  gma_status_t st = gma_stats(g, &s);
  if (st != GMA_OK) return st;
  return gma__memory_summary(g, &s, buf, len);
}

gma_status_t gma_trace_start(gma_t *g, const char *path) {
  GMA__CHECK(g, "gma_trace_start");
  if (!path || !*path)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_trace_start: NULL or empty path");
  return gma__trace_start(g, path);
}

gma_status_t gma_trace_stop(gma_t *g) {
  GMA__CHECK(g, "gma_trace_stop");
  return gma__trace_stop(g);
}
