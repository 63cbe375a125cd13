/* Configuration resolution: caller's struct, then GMA_CONF, then defaults. */
#ifndef GMA_CONFIG_H
#define GMA_CONFIG_H

#include "gma.h"

/* Copies in (NULL = all defaults; an older, smaller struct is fine), applies
 * GMA_CONF unless in->ignore_env, fills defaults for zero fields and checks
 * every range. *out is complete on GMA_OK. Any thread. */
gma_status_t gma__config_resolve(const gma_config_t *in, gma_config_t *out);

/* The keys gma_config_parse accepts, in its table's order: fills out[0 ..
 * min(cap, n) - 1] and returns n. For tests (the README table check). */
size_t gma__config_keys(const char **out, size_t cap);

#endif /* GMA_CONFIG_H */
