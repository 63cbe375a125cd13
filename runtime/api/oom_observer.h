/* The OOM observer of one allocator (gma_set_oom_observer; oom_observer.c). */
#ifndef GMA_API_OOM_OBSERVER_H
#define GMA_API_OOM_OBSERVER_H

#include <pthread.h>
#include <stdbool.h>

#include "base/atomics.h"
#include "gma.h"

/* Invariant: running = observer calls under way; armed == (cb != NULL),
 * written under mu, read without it (a stale read only makes one call
 * skip or look for an observer that is gone: both harmless). */
typedef struct gma__oom_observer {
  pthread_mutex_t mu;
  pthread_cond_t idle; /* broadcast when running drops to 0 */
  gma_oom_observer_t cb;
  void *user;
  unsigned running;
  _Atomic bool armed;
} gma__oom_observer_t;

void gma__oom_observer_init(gma__oom_observer_t *o);
void gma__oom_observer_fini(gma__oom_observer_t *o);
/* Whether a failing allocation of g on this thread would call an observer
 * (not from inside g's own observer). One load. */
bool gma__oom_observed(const gma_t *g);
/* Calls the observer (none: false), no lock held; true when it asks for a
 * retry. gma_last_error() is the OOM's message again afterwards. */
bool gma__oom_observe(gma_t *g, size_t requested, gma_stream_t stream);

#endif /* GMA_API_OOM_OBSERVER_H */
