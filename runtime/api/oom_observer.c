/* Owns the OOM observer (gma_set_oom_observer): who is called before an
 * allocation reports GMA_ERR_OOM, and waiting for a running one when it is
 * replaced. */
#include "api/oom_observer.h"
#include "base/lock.h"

#include "api/allocator.h"

/* The allocator whose observer the calling thread is running, or NULL. */
static _Thread_local const gma_t *tl_observing;

void gma__oom_observer_init(gma__oom_observer_t *o) {
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->idle, NULL);
  gma__store_relaxed(&o->armed, false);
  o->cb = NULL;
  o->user = NULL;
  o->running = 0;
}

void gma__oom_observer_fini(gma__oom_observer_t *o) {
  pthread_cond_destroy(&o->idle);
  pthread_mutex_destroy(&o->mu);
}

bool gma__oom_observed(const gma_t *g) {
  return gma__load_relaxed(&g->oom.armed) && tl_observing != g;
}

bool gma__oom_observe(gma_t *g, size_t requested, gma_stream_t stream) {
  gma__oom_observer_t *o = &g->oom;
  gma__lock(&o->mu, GMA__RANK_OOM_OBSERVER);
  gma_oom_observer_t cb = o->cb;
  void *user = o->user;
  if (cb) o->running++;
  gma__unlock(&o->mu);
  if (!cb) return false;
  char message[1024];
  snprintf(message, sizeof message, "%s", gma_last_error());
  gma_oom_info_t info = {.size = sizeof info, .requested = requested, .stream = stream,
                         .message = message};
  gma_stats_t st = GMA_STATS_INIT;
  if (gma_stats(g, &st) == GMA_OK) {
    info.allocated = st.allocated.current;
    info.reserved = st.reserved.current;
  }
  g->dev->ops->mem_info(g->dev, &info.device_free, &info.device_total);
  const gma_t *outer = tl_observing;
  tl_observing = g;
  int answer = cb(g, &info, user);
  tl_observing = outer;
  gma__lock(&o->mu, GMA__RANK_OOM_OBSERVER);
  if (--o->running == 0) pthread_cond_broadcast(&o->idle);
  gma__unlock(&o->mu);
  gma__set_error(GMA_ERR_OOM, "%s", gma__error_detail(message)); /* the observer's calls' aside */
  return answer == GMA_OOM_RETRY;
}

gma_status_t gma_set_oom_observer(gma_t *g, gma_oom_observer_t cb, void *user) {
  GMA__CHECK(g, "gma_set_oom_observer");
  gma__oom_observer_t *o = &g->oom;
  gma__lock(&o->mu, GMA__RANK_OOM_OBSERVER);
  o->cb = cb;
  o->user = user;
  gma__store_relaxed(&o->armed, cb != NULL);
  /* From inside an observer the wait would be for this very call. */
  while (o->running && tl_observing != g) pthread_cond_wait(&o->idle, &o->mu);
  gma__unlock(&o->mu);
  return GMA_OK;
}
