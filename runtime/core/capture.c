/* Owns the pool's stream operations: capture marks, the capture refusal, retiring
 * a stream and synchronizing one through gma. Every function here runs under
 * gma__pool_t.lock (core/types.h) unless it says otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/round.h"
#include "base/lock.h"
#include "base/sizeclass.h"
#include "core/internal.h"

gma_status_t gma__pool_refuse_capture(gma__pool_t *p, gma_stream_t stream, const char *fn) {
  if (!p->dev->ops->stream_capture) return GMA_OK;
  bool capturing = false;
  uint64_t id = 0;
  gma_status_t st = p->dev->ops->stream_capture(p->dev, stream, &capturing, &id);
  if (st != GMA_OK || !capturing) return st;
  if (!id)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s: stream %p is the legacy default stream while a blocking stream "
                          "captures a CUDA graph: its work would join that capture; use another "
                          "stream, or allocate before or after the capture",
                          fn, stream);
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "%s: stream %p is capturing a CUDA graph (capture id %" PRIu64
                        ") that gma was not told of: memory gma handed out here would be "
                        "reused while the graph still uses it; call gma_capture_begin(g, "
                        "stream, pool) before cuStreamBeginCapture (gma.torch does this for "
                        "torch.cuda.graph)",
                        fn, stream, id);
}

gma_status_t gma__pool_capture_mark(gma__pool_t *p, gma_stream_t stream, uint64_t stream_id,
                                    int delta, gma__stream_t **rec) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__stream_t *s = gma__stream_resolve(p, stream, stream_id);
  gma_status_t st = GMA_OK;
  if (!s) {
    st = gma__set_error(GMA_ERR_OOM, "host memory for a stream record");
  } else if (delta > 0) {
    /* Before the capture: its frees so far get an event outside it (a
     * stream already capturing is skipped by close_epoch itself). */
    if (!s->captures) gma__stream_close_epoch(p, s);
    s->captures++;
  } else if (delta < 0 && s->captures) {
    s->captures--;
  }
  if (rec) *rec = s;
  GMA__VALIDATE(p);
  gma__unlock(&p->lock);
  return st;
}

gma_status_t gma__pool_stream_retire(gma__pool_t *p, gma_stream_t stream) {
  gma_status_t st = GMA_OK;
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__stream_t *s = gma__stream_find(p, stream);
  if (s) st = gma__stream_retire(p, s, false);
  GMA__VALIDATE(p);
  gma__unlock(&p->lock);
  return st;
}

gma_status_t gma__pool_stream_synchronize(gma__pool_t *p, gma_stream_t stream) {
  uint64_t id;
  gma_status_t st = p->dev->ops->stream_id(p->dev, stream, &id);
  if (st != GMA_OK) return st;
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__stream_t *s = gma__stream_find(p, stream);
  if (s && s->id != id) s = NULL; /* a recycled handle: the record names a stream that is gone */
  uint64_t closed = s ? gma__stream_sync_begin(p, s) : 0;
  gma__unlock(&p->lock);
  /* Outside the lock: the wait may be long, and nobody else waits for it. */
  st = p->dev->ops->stream_synchronize(p->dev, stream);
  if (s) { /* records are never freed, so s is still readable */
    gma__lock(&p->lock, GMA__RANK_POOL);
    if (st == GMA_OK)
      gma__stream_sync_end(p, s, closed);
    else /* the closed epoch has no event: the next poll must record one */
      gma__store_relaxed(&s->dirty, true);
    GMA__VALIDATE(p);
    gma__unlock(&p->lock);
  }
  return st;
}
