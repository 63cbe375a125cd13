/* Owns the worker thread (see worker.h): its lifecycle, its timer, pressure
 * levels and the policy of timed trimming. The trimming itself is
 * gma__pool_release, which gives memory back to the device outside the pool
 * lock, so a tick never holds up callers for the duration of device frees. */
#include "worker.h"

#include <time.h>

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Pressure from the pool's reserved bytes against memory_limit and from the
 * device's used memory against its total, whichever is higher. */
static gma_pressure_t pressure(gma__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t reserved = p->c.reserved.current;
  pthread_mutex_unlock(&p->lock);
  double use = p->limit ? (double)reserved / (double)p->limit : 0.0;
  uint64_t dev_free = 0, dev_total = 0;
  if (p->dev->ops->mem_info(p->dev, &dev_free, &dev_total) == GMA_OK && dev_total) {
    double dev_use = (double)(dev_total - dev_free) / (double)dev_total;
    if (dev_use > use) use = dev_use;
  }
  return use > 0.95 ? GMA_PRESSURE_CRITICAL
         : use > 0.80 ? GMA_PRESSURE_HIGH
         : use >= 0.60 ? GMA_PRESSURE_MEDIUM
                       : GMA_PRESSURE_LOW;
}

/* One tick: report a level change, trim (harder under pressure), top up the
 * free pool to grow_ahead when there is room. Worker thread only. */
static void tick(gma__worker_t *w) {
  gma__pool_t *p = w->p;
  gma_pressure_t level = pressure(p);
  pthread_mutex_lock(&w->mu);
  bool changed = (int)level != w->level || w->report;
  w->level = (int)level;
  w->report = false;
  gma_pressure_callback_t cb = w->cb;
  void *user = w->cb_user;
  pthread_mutex_unlock(&w->mu);
  if (changed) {
    pthread_mutex_lock(&p->lock);
    p->c.pressure_level = (int)level;
    pthread_mutex_unlock(&p->lock);
    if (cb) cb(w->g, level, user); /* no gma lock held: it may call gma */
  }
  gma__release_t r = {.keep = w->release_threshold, .idle_ns = w->idle_ns, .now_ns = now_ns(),
                      .timed = true, .pressured = level >= GMA_PRESSURE_HIGH};
  if (level == GMA_PRESSURE_HIGH) r.keep /= 4;
  if (level == GMA_PRESSURE_CRITICAL) r.keep = 0;
  gma__pool_release(p, &r); /* a failed device free keeps the segment: retried next tick */
  if (w->grow_ahead && level < GMA_PRESSURE_HIGH) gma__pool_grow_ahead(p, w->grow_ahead);
}

static void *worker_main(void *arg) {
  gma__worker_t *w = arg;
  pthread_mutex_lock(&w->mu);
  while (!w->stop) {
    uint64_t due = now_ns() + w->interval_ns;
    struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
    while (!w->stop && pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0) {
    } /* woken early only to stop: otherwise sleep out the interval */
    if (w->stop) break;
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&w->p->lock);
    w->p->c.worker_wakeups++;
    pthread_mutex_unlock(&w->p->lock);
    tick(w);
    pthread_mutex_lock(&w->mu);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

gma_status_t gma__worker_start(gma__worker_t *w, gma_t *g, gma__pool_t *p,
                               const gma_config_t *cfg) {
  *w = (gma__worker_t){.g = g, .p = p};
  w->interval_ns = cfg->trim_interval_ms * 1000000u;
  w->release_threshold = cfg->release_threshold;
  w->idle_ns = cfg->idle_ms * 1000000u;
  w->grow_ahead = cfg->grow_ahead;
  if (cfg->worker_off) return GMA_OK;
  pthread_condattr_t attr;
  if (pthread_mutex_init(&w->mu, NULL) != 0 || pthread_condattr_init(&attr) != 0)
    return gma__set_error(GMA_ERR_INTERNAL, "worker: pthread init failed");
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&w->cv, &attr);
  pthread_condattr_destroy(&attr);
  if (rc != 0 || pthread_create(&w->thread, NULL, worker_main, w) != 0) {
    if (rc == 0) pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    return gma__set_error(GMA_ERR_INTERNAL, "worker: cannot start the worker thread");
  }
  w->started = true;
  return GMA_OK;
}

void gma__worker_stop(gma__worker_t *w) {
  if (!w->started) return;
  pthread_mutex_lock(&w->mu);
  w->stop = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  w->started = false;
}

gma_status_t gma__worker_set_callback(gma__worker_t *w, gma_pressure_callback_t cb, void *user) {
  if (!w->started)
    return gma__set_error(GMA_ERR_UNSUPPORTED, "gma_set_pressure_callback: the worker is off "
                                               "(worker:off), so pressure is never observed");
  pthread_mutex_lock(&w->mu);
  w->cb = cb;
  w->cb_user = user;
  w->report = true; /* tell the new callback the current level at the next tick */
  pthread_mutex_unlock(&w->mu);
  return GMA_OK;
}
