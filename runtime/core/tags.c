/* Owns the pool's tag names: interning a name (checked: printable UTF-8, at
 * most 31 bytes), an id's name, and a name escaped for JSON. Names are
 * published before the count, so known tags are found without the lock. */
#include <string.h>

#include "core/internal.h"
#include "base/lock.h"

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
  gma__lock(&p->lock, GMA__RANK_POOL);
  n = gma__load_relaxed(&p->ntags);
  int id = -1;
  for (uint32_t i = 1; i <= n && id < 0; i++)
    if (strcmp(p->tag_names[i], tag) == 0) id = (int)i;
  if (id < 0 && n + 1 < GMA__MAX_TAGS) {
    id = (int)(n + 1);
    memcpy(p->tag_names[id], tag, len + 1);
    gma__store_release(&p->ntags, n + 1);
  }
  gma__unlock(&p->lock);
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
