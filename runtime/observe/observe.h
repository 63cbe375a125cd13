/* What observe/ offers the entry points (api/observe.c): reports, snapshots
 * and tracing of an allocator whose handle and arguments the caller already
 * checked (g live; pointers and buffers not NULL, lengths not 0). Each
 * reads the pool through core's locked steps (core/inspect.c). */
#ifndef GMA_OBSERVE_H
#define GMA_OBSERVE_H

#include "gma.h"

/* report.c: gma_find_old_allocations and gma_live_report. */
void gma__find_old_allocations(gma_t *g, uint64_t min_age_ns, gma_allocation_info_t *out,
                               size_t cap, size_t *count);
gma_status_t gma__live_report(gma_t *g, size_t rows, char *buf, size_t len);

/* snapshot.c: gma_snapshot_json, and gma_memory_summary of the statistics s
 * (gma_stats' full struct). */
gma_status_t gma__snapshot_json(gma_t *g, const char *path);
gma_status_t gma__memory_summary(gma_t *g, const gma_stats_t *s, char *buf, size_t len);

/* snapshot_torch.c: gma_snapshot_write's GMA_SNAPSHOT_TORCH. */
gma_status_t gma__snapshot_torch(gma_t *g, const char *path);

/* trace.c: gma_trace_start (path not empty) and gma_trace_stop. */
gma_status_t gma__trace_start(gma_t *g, const char *path);
gma_status_t gma__trace_stop(gma_t *g);

#endif /* GMA_OBSERVE_H */
