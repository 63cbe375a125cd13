/* Errors (base/error.c): the calling thread's last-error message, struct size
 * checks, and keeping a message across a failure that was recovered. */
#ifndef GMA_BASE_ERROR_H
#define GMA_BASE_ERROR_H

#include <stddef.h>

#include "gma.h"

/* Sets the calling thread's last-error message (printf format) and returns
 * status, so a failure path reads: return gma__set_error(GMA_ERR_OOM, "..."). */
gma_status_t gma__set_error(gma_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A caller's struct that starts with a size field (gma_config_t,
 * gma_async_options_t, the stats and info structs): GMA_OK when size is one
 * some gma.h gives it, from the size field alone (sizeof(size_t)) to this
 * library's struct (ours); the caller then reads and writes only its first
 * size bytes, older headers having only a prefix of today's fields.
 * Otherwise GMA_ERR_INVALID_ARGUMENT with a message naming fn, the argument
 * (arg, as "config" or "out") and the macro that sets size (init). */
gma_status_t gma__struct_size_check(size_t size, size_t ours, const char *fn, const char *arg,
                                    const char *init);
/* A message without its leading "GMA_...: " status name, to quote it in
 * another message (gma__set_error may quote gma_last_error() itself). */
const char *gma__error_detail(const char *msg);
/* A call that may fail inside and still succeed (a segment the device
 * refused before a retry found memory) keeps gma_last_error() as it was:
 * kept = gma__error_keep() before, gma__error_done(kept, status) on every
 * way out; a status of GMA_OK puts the message back. The message the first
 * failure replaces is copied aside then (failures are rare; nothing is
 * copied on the way in). Nested keeps are free: only the outermost one
 * (the call the caller made) restores. */
unsigned gma__error_keep(void);
void gma__error_done(unsigned kept, gma_status_t st);

#endif /* GMA_BASE_ERROR_H */
