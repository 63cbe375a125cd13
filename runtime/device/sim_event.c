/* The simulated device's events. They follow CUDA: a never-recorded
 * event is complete, and a record captures all work queued on the stream so
 * far. Each record creates a mark (a refcounted "done" flag) that becomes the
 * event's latest mark and is carried by a RECORD op in the stream's queue;
 * when the op runs, the mark is done. The event is complete when its latest
 * mark is done (or it has none). A WAIT op holds the mark that was latest at
 * enqueue time and blocks its stream's thread until that mark is done, so a
 * later re-record of the event, on any stream, cannot release it early (a
 * max-generation counter could, when the later record finishes first). Ops
 * reference marks, never the event, so destroying an event with queued ops is
 * safe. ev_mu guards the events and their marks. */
#include "device/sim_internal.h"
#include "base/lock.h"

/* ---------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------- */
/* Drops one reference (NULL is a no-op); caller holds ev_mu. */
void gma__sim_mark_unref(sim_mark_t *m) {
  SIM_ASSERT(!m || m->refs > 0);
  if (m && --m->refs == 0) free(m);
}

/* Finds a live event; caller holds ev_mu. Unknown handles are looked up, never
 * dereferenced, so a stale handle gives an error instead of a crash. */
sim_event_t *gma__sim_event_find(sim_device_t *dev, gma__event_t h) {
  sim_event_t *ev = (sim_event_t *)gma__sim_table_find(&dev->events, (uintptr_t)h);
  if (!ev) {
    gma__set_error(GMA_ERR_INVALID_ARGUMENT, "event %p is not a live event of the simulated device",
                   h);
  }
  return ev;
}

/* Any thread. */
gma_status_t gma__sim_event_create(gma__device_t *d, gma__event_t *out) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = gma__sim_event_fault(dev, "event_create");
  sim_pay(dev, GMA__SIM_COST_EVENT_CREATE, 0);
  if (st == GMA_OK) st = gma__sim_site_fault(dev, GMA__SIM_EVENT_CREATE);
  if (st != GMA_OK) return st;
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked for an event without a place for it");
  sim_event_t *ev = calloc(1, sizeof *ev);
  if (!ev) return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for an event");
  ev->link.key = (uintptr_t)ev;
  gma__lock(&dev->ev_mu, GMA__RANK_SIM_EVENTS);
  gma__sim_table_insert(&dev->events, &ev->link);
  gma__unlock(&dev->ev_mu);
  *out = ev;
  return GMA_OK;
}

/* Any thread. Queued RECORD/WAIT ops keep their marks alive until they run. */
gma_status_t gma__sim_event_destroy(gma__device_t *d, gma__event_t h) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_EVENT_DESTROY, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_EVENT_DESTROY);
  if (fst != GMA_OK) return fst;
  gma__lock(&dev->ev_mu, GMA__RANK_SIM_EVENTS);
  sim_event_t *ev = gma__sim_event_find(dev, h);
  if (ev) {
    gma__sim_table_remove(&dev->events, ev->link.key);
    gma__sim_mark_unref(ev->last);
    free(ev);
  }
  gma__unlock(&dev->ev_mu);
  return ev ? GMA_OK : GMA_ERR_INVALID_ARGUMENT;
}

/* Any thread; never blocks beyond ev_mu (plus the configured latency). */
gma_status_t gma__sim_event_query(gma__device_t *d, gma__event_t h, bool *done) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = gma__sim_event_fault(dev, "event_query");
  sim_pay(dev, GMA__SIM_COST_EVENT_QUERY, 0);
  if (st == GMA_OK) st = gma__sim_site_fault(dev, GMA__SIM_EVENT_QUERY);
  if (st != GMA_OK) return st;
  if (!done) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked to query an event without a place for the answer");
  gma__sim_spin_ns(dev->event_ns);
  gma__lock(&dev->ev_mu, GMA__RANK_SIM_EVENTS);
  sim_event_t *ev = gma__sim_event_find(dev, h);
  if (ev) *done = !ev->last || ev->last->done;
  gma__unlock(&dev->ev_mu);
  return ev ? GMA_OK : GMA_ERR_INVALID_ARGUMENT;
}

/* Any thread except a stream thread of this device (it could wait on itself).
 * Blocks until the record made before the call has completed. */
gma_status_t gma__sim_event_synchronize(gma__device_t *d, gma__event_t h) {
  sim_device_t *dev = sim_of(d);
  gma_status_t st = gma__sim_event_fault(dev, "event_synchronize");
  sim_pay(dev, GMA__SIM_COST_EVENT_SYNCHRONIZE, 0);
  if (st == GMA_OK) st = gma__sim_site_fault(dev, GMA__SIM_EVENT_SYNCHRONIZE);
  if (st != GMA_OK) return st;
  gma__lock(&dev->ev_mu, GMA__RANK_SIM_EVENTS);
  sim_event_t *ev = gma__sim_event_find(dev, h);
  sim_mark_t *m = ev ? ev->last : NULL;
  if (m) {
    /* Holding the mark, not the event, lets a concurrent event_destroy or
     * re-record go ahead while this call waits for the record it saw. */
    m->refs++;
    while (!m->done) pthread_cond_wait(&dev->ev_cv, &dev->ev_mu);
    gma__sim_mark_unref(m);
  }
  gma__unlock(&dev->ev_mu);
  return ev ? GMA_OK : GMA_ERR_INVALID_ARGUMENT;
}

