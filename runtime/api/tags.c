/* Owns what a caller can learn about one allocation: its tag (gma_alloc_tagged;
 * names interned per allocator, ids stored on the block) and where it lives
 * (gma_pointer_info: device memory, pinned host memory, or host memory given
 * as a CPU fallback). */
#include <inttypes.h>
#include <string.h>

#include "api/allocator.h"

/* The length of the UTF-8 sequence at s (at most left bytes), or 0 when it
 * is not one: a stray continuation byte, a truncated or overlong sequence,
 * a surrogate or a code point past U+10FFFF. */
static size_t utf8_seq(const unsigned char *s, size_t left) {
  if (s[0] < 0x80) return 1;
  size_t n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
  if (n == 0 || s[0] > 0xf4 || n > left) return 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (n == 3 && s[0] == 0xe0 && s[1] < 0xa0) return 0; /* overlong */
  if (n == 3 && s[0] == 0xed && s[1] >= 0xa0) return 0; /* surrogate */
  if (n == 4 && s[0] == 0xf0 && s[1] < 0x90) return 0; /* overlong */
  if (n == 4 && s[0] == 0xf4 && s[1] >= 0x90) return 0; /* past U+10FFFF */
  return n;
}

int gma__tag_intern(gma__pool_t *p, const char *tag) {
  size_t len = tag ? strlen(tag) : 0;
  if (len == 0 || len >= sizeof p->tag_names[0]) {
    gma__set_error(GMA_ERR_INVALID_ARGUMENT, "tag '%s': a tag has 1 to %zu characters",
                   tag ? tag : "(null)", sizeof p->tag_names[0] - 1);
    return -1;
  }
  /* A tag is one line of text: reports print it in table rows, traces and
   * snapshots in fields, where a control character would break the line,
   * and snapshots are JSON, which must be UTF-8. */
  const unsigned char *u = (const unsigned char *)tag;
  for (size_t i = 0, n; i < len; i += n) {
    if (u[i] < 0x20 || u[i] == 0x7f) {
      gma__set_error(GMA_ERR_INVALID_ARGUMENT, "tag with a control character (byte 0x%02x at "
                     "offset %zu): a tag is printable text", u[i], i);
      return -1;
    }
    if ((n = utf8_seq(u + i, len - i)) == 0) {
      gma__set_error(GMA_ERR_INVALID_ARGUMENT, "tag that is not UTF-8 (byte 0x%02x at offset "
                     "%zu): a tag is printable text, ASCII or UTF-8", u[i], i);
      return -1;
    }
  }
  /* Known tags are found without a lock: names are published before ntags. */
  uint32_t n = gma__load_acquire(&p->ntags);
  for (uint32_t i = 1; i <= n; i++)
    if (strcmp(p->tag_names[i], tag) == 0) return (int)i;
  pthread_mutex_lock(&p->lock);
  n = gma__load_relaxed(&p->ntags);
  int id = -1;
  for (uint32_t i = 1; i <= n && id < 0; i++)
    if (strcmp(p->tag_names[i], tag) == 0) id = (int)i;
  if (id < 0 && n + 1 < GMA__MAX_TAGS) {
    id = (int)(n + 1);
    memcpy(p->tag_names[id], tag, len + 1);
    gma__store_release(&p->ntags, n + 1);
  }
  pthread_mutex_unlock(&p->lock);
  if (id < 0)
    gma__set_error(GMA_ERR_INVALID_ARGUMENT, "tag '%s': this allocator already has %u tags, the "
                   "most it keeps; reuse tags", tag, GMA__MAX_TAGS - 1);
  return id;
}

const char *gma__tag_name(gma__pool_t *p, unsigned id) {
  return id == 0 || id > gma__load_acquire(&p->ntags) ? "untagged" : p->tag_names[id];
}

const char *gma__tag_json(const char *name, char out[GMA__TAG_JSON]) {
  size_t n = 0;
  for (; *name; name++) { /* interned tags hold no control characters */
    if (*name == '"' || *name == '\\') out[n++] = '\\';
    out[n++] = *name;
  }
  out[n] = '\0';
  return out;
}

gma_status_t gma_alloc_tagged(gma_t *g, size_t size, gma_stream_t stream, const char *tag,
                              void **out) {
  GMA__CHECK(g, "gma_alloc_tagged");
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_alloc_tagged: out is NULL");
  *out = NULL;
  int id = gma__tag_intern(&g->pool, tag);
  if (id < 0) return GMA_ERR_INVALID_ARGUMENT;
  gma_status_t st = gma_alloc(g, size, stream, out);
  if (st != GMA_OK) return st;
  /* Planned memory first: the arena's own block starts where a planned one may. */
  if (g->cfg.plan && gma__plan_set_tag(&g->plan, *out, (uint8_t)id)) return GMA_OK;
  gma__block_t *b = gma__pagemap_get(&g->pool.pagemap, (uintptr_t)*out);
  if (b && gma__load_relaxed(&b->arena)) return GMA_OK; /* a graph pool's: untagged */
  if (b) gma__store_relaxed(&b->tag, (uint8_t)id); /* ours: LIVE, handed to us */
  else gma__host_set_tag(&g->host, *out, (uint8_t)id); /* a CPU fallback */
  return GMA_OK;
}

gma_status_t gma_pointer_info(gma_t *g, const void *ptr, gma_pointer_info_t *info) {
  GMA__CHECK(g, "gma_pointer_info");
  if (!info) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_pointer_info: info is NULL");
  gma_status_t st = gma__struct_size_check(info->size, sizeof(gma_pointer_info_t),
                                           "gma_pointer_info", "info", "GMA_POINTER_INFO_INIT");
  if (st != GMA_OK) return st;
  gma_pointer_info_t r = {.size = info->size};
  gma__pool_t *p = &g->pool;
  uintptr_t a = (uintptr_t)ptr;
  int graphed = gma__graph_info(&g->graphs, ptr, &r);
  if (graphed < 0) /* a chunk is one live block to the pool: not what the caller has */
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_pointer_info(%p): the pointer lies in a graph pool's memory that "
                          "no live allocation holds now", ptr);
  int planned = !graphed && g->cfg.plan ? gma__plan_info(&g->plan, ptr, &r) : 0;
  if (planned < 0) /* the arena is one live block to the pool: not what the caller has */
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_pointer_info(%p): the pointer lies in planned memory (plan:on) "
                          "that no live allocation holds now", ptr);
  bool found = planned > 0 || graphed > 0;
  if (!found) {
    pthread_mutex_lock(&p->lock);
    gma__segment_t *seg = gma__seg_find(p, a);
    gma__block_t *b = seg ? seg->first : NULL;
    while (b && a >= b->addr + b->size) b = b->next; /* one segment's blocks */
    if (b && gma__load_relaxed(&b->state) == GMA__LIVE) {
      r.kind = GMA_MEMORY_DEVICE;
      r.base = (void *)b->addr;
      r.requested = gma__load_relaxed(&b->requested);
      r.block_size = b->size;
      r.stream = b->stream ? b->stream->handle : NULL;
      r.tag = gma__tag_name(p, gma__load_relaxed(&b->tag));
      found = true;
    }
    pthread_mutex_unlock(&p->lock);
  }
  if (!found && !gma__host_pointer_info(&g->host, p, ptr, &r))
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_pointer_info(%p): the pointer lies in no live allocation of this "
                          "allocator (device or host)", ptr);
  /* The allocation is the bytes asked for; the block's rounding after them
   * is gma's (gma_free and gma_record_stream refuse a pointer there too). */
  uintptr_t off = a - (uintptr_t)r.base;
  if (off && off >= r.requested)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_pointer_info(%p): the pointer lies past the end of the live "
                          "allocation at %p (%zu bytes asked for; the %zu bytes after them are "
                          "gma's rounding, not part of it)",
                          ptr, r.base, r.requested, r.block_size - r.requested);
  memcpy(info, &r, info->size);
  return GMA_OK;
}
