/* Allocators across fork() (fork.c): the process-wide registry of live
 * allocators, the pthread_atfork handlers that mark every one of them
 * inherited in a child process, and the teardown of an inherited allocator.
 *
 * Why: after fork() the child has a copy of each allocator's memory but none
 * of its threads (the worker, the simulated device's stream threads), and a
 * lock another parent thread held at fork time stays locked forever in the
 * child; CUDA contexts do not survive fork() at all. So an inherited
 * allocator cannot work in the child. Every call on it fails at once (magic
 * GMA__MAGIC_FORKED, see allocator.h), its futures are cancelled (the anchor's
 * forked flag, future.h), and gma_destroy gives back the host memory the child
 * holds for it without a thread, a device call or a lock that may be held. */
#ifndef GMA_FORK_H
#define GMA_FORK_H

#include "gma.h"

/* gma_create, once g is complete: g is live from now on. The first call
 * registers the atfork handlers. Any thread; takes the registry lock. */
void gma__fork_register(gma_t *g);
/* gma_destroy, before the teardown begins: g is no longer live. Any thread. */
void gma__fork_unregister(gma_t *g);
/* gma_destroy of an inherited allocator (magic GMA__MAGIC_FORKED): releases
 * what the child holds for it, leaves g DEAD, and returns GMA_OK. Never
 * blocks: no join, no device wait, no lock a parent thread may have held. */
gma_status_t gma__fork_destroy(gma_t *g);
/* The status (GMA_ERR_CANCELLED, with fn and fork() in the message) of every
 * future call on a future of an inherited allocator. */
gma_status_t gma__fork_future_error(const char *fn);

#endif /* GMA_FORK_H */
