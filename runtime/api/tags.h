/* Allocation tags (api/tags.c). */
#ifndef GMA_API_TAGS_H
#define GMA_API_TAGS_H

#include "core/types.h"

/* tags.c: the id of tag (added if new; lock-free when known), or -1 with the
 * error set (bad name, table full). The name of an id. */
int gma__tag_intern(gma__pool_t *p, const char *tag);
const char *gma__tag_name(gma__pool_t *p, unsigned id);
/* A tag's name (at most 31 characters) escaped for a JSON string ('"' and
 * '\\'), written to out and returned. */
#define GMA__TAG_JSON 64
const char *gma__tag_json(const char *name, char out[GMA__TAG_JSON]);

#endif /* GMA_API_TAGS_H */
