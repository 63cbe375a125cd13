/* Owns configuration: the table of GMA_CONF keys, parsing "key:value,..."
 * strings, defaults for zero fields, and range checks. */
#include "base/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "device/device.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

typedef enum {
  KIND_SIZE, KIND_COUNT, KIND_DEVICE, KIND_REUSE, KIND_ONOFF, KIND_SEGMENTS, KIND_PATH, KIND_FALLBACK, KIND_DEFSTREAM, KIND_PLAN, KIND_SIMCOSTS,
  KIND_THRESHOLD /* a size; "auto" is 0 (the default), "0" is GMA_RELEASE_ALL */
} value_kind_t;

/* One row per key: where it lives in gma_config_t and its allowed range
 * (checked after defaults are applied; 0 in a config means "default"). */
typedef struct key_spec {
  const char *key;
  size_t offset;
  value_kind_t kind;
  uint64_t min, max;
} key_spec_t;

#define FIELD(f) offsetof(gma_config_t, f)
static const key_spec_t keys[] = {
    {"device", FIELD(device), KIND_DEVICE, 0, 2},
    {"device_id", FIELD(device_ordinal), KIND_COUNT, 0, 1023},
    {"memory_limit", FIELD(memory_limit), KIND_SIZE, 1 * MiB, 1024 * TiB},
    {"small_size", FIELD(small_size), KIND_SIZE, 512, 64 * MiB},
    {"small_segment", FIELD(small_segment_size), KIND_SIZE, 512, 1 * GiB},
    {"large_segment", FIELD(large_segment_size), KIND_SIZE, 2 * MiB, 64 * GiB},
    {"reuse", FIELD(reuse), KIND_REUSE, 0, 3},
    {"bin_max", FIELD(bin_max), KIND_SIZE, 512, 1 * GiB},
    {"bin_depth", FIELD(bin_depth), KIND_COUNT, 1, 65536},
    {"bins", FIELD(bins_off), KIND_ONOFF, 0, 1},
    {"sim_capacity", FIELD(sim_capacity), KIND_SIZE, 1 * MiB, 1024 * TiB},
    {"trim_interval_ms", FIELD(trim_interval_ms), KIND_COUNT, 1, 3600000},
    {"release_threshold", FIELD(release_threshold), KIND_THRESHOLD, 512, 1024 * TiB},
    {"idle_ms", FIELD(idle_ms), KIND_COUNT, 1, 86400000},
    {"grow_ahead", FIELD(grow_ahead), KIND_SIZE, 0, 1024 * TiB},
    {"worker", FIELD(worker_off), KIND_ONOFF, 0, 1},
    {"ring_size", FIELD(ring_size), KIND_COUNT, 2, 1048576},
    {"future_timeout_ms", FIELD(future_timeout_ms), KIND_COUNT, 1, 86400000},
    {"expandable_segments", FIELD(expandable_segments), KIND_SEGMENTS, 0, 2},
    {"trace", FIELD(trace_path), KIND_PATH, 0, 0},
    {"fallback", FIELD(fallback_host), KIND_FALLBACK, 0, 1},
    {"host_release_threshold", FIELD(host_release_threshold), KIND_SIZE, 0, 1024 * TiB},
    {"oom_wait_ms", FIELD(oom_wait_ms), KIND_COUNT, 0, 86400000},
    {"default_stream", FIELD(per_thread_default_stream), KIND_DEFSTREAM, 0, 1},
    {"plan", FIELD(plan), KIND_PLAN, 0, 1},
    {"sim_alloc_ns", FIELD(sim_alloc_latency_ns), KIND_COUNT, 0, 10000000000ull},
    {"sim_free_ns", FIELD(sim_free_latency_ns), KIND_COUNT, 0, 10000000000ull},
    {"sim_event_ns", FIELD(sim_event_latency_ns), KIND_COUNT, 0, 10000000000ull},
    {"sim_fail_alloc", FIELD(sim_fail_alloc), KIND_COUNT, 0, UINT64_MAX},
    {"sim_fail_event", FIELD(sim_fail_event), KIND_COUNT, 0, UINT64_MAX},
    {"sim_costs", FIELD(sim_costs), KIND_SIMCOSTS, 0, 2},
};
#define NKEYS (sizeof keys / sizeof keys[0])

static uint64_t get_field(const gma_config_t *c, const key_spec_t *k) {
  const char *at = (const char *)c + k->offset;
  if (k->kind == KIND_DEVICE) return (uint64_t)*(const gma_device_kind_t *)at;
  if (k->kind == KIND_REUSE) return (uint64_t)*(const gma_reuse_t *)at;
  if (k->kind == KIND_ONOFF || k->kind == KIND_SEGMENTS || k->kind == KIND_FALLBACK || k->kind == KIND_DEFSTREAM ||
      k->kind == KIND_PLAN || k->kind == KIND_SIMCOSTS ||
      k->offset == FIELD(device_ordinal))
    return (uint64_t)(int64_t)*(const int *)at;
  return *(const uint64_t *)at;
}

/* The bytes k's field takes in gma_config_t (the types get_field reads). */
static size_t field_width(const key_spec_t *k) {
  if (k->kind == KIND_PATH) return sizeof ((gma_config_t *)0)->trace_path;
  if (k->kind == KIND_DEVICE) return sizeof(gma_device_kind_t);
  if (k->kind == KIND_REUSE) return sizeof(gma_reuse_t);
  if (k->kind == KIND_ONOFF || k->kind == KIND_SEGMENTS || k->kind == KIND_FALLBACK || k->kind == KIND_DEFSTREAM ||
      k->kind == KIND_PLAN || k->kind == KIND_SIMCOSTS || k->offset == FIELD(device_ordinal))
    return sizeof(int);
  return sizeof(uint64_t);
}

static void set_field(gma_config_t *c, const key_spec_t *k, uint64_t v) {
  char *at = (char *)c + k->offset;
  if (k->kind == KIND_DEVICE)
    *(gma_device_kind_t *)at = (gma_device_kind_t)v;
  else if (k->kind == KIND_REUSE)
    *(gma_reuse_t *)at = (gma_reuse_t)v;
  else if (k->kind == KIND_ONOFF || k->kind == KIND_SEGMENTS || k->kind == KIND_FALLBACK || k->kind == KIND_DEFSTREAM ||
      k->kind == KIND_PLAN || k->kind == KIND_SIMCOSTS ||
      k->offset == FIELD(device_ordinal))
    *(int *)at = (int)v;
  else
    *(uint64_t *)at = v;
}

/* Parses a decimal count, or a size in exactly the README's forms: decimal
 * digits, then optionally K, M, G or T (powers of 1024, either case), then
 * optionally B or iB after that letter (either case): 512, 64K, 2m, 1GB,
 * 1GiB. Nothing else: no sign, fraction, hex, exponent, space inside, bare
 * "B" or other unit ("512B" is not 512 bytes). */
static bool parse_number(const char *s, size_t len, bool size, uint64_t *out) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < len && s[i] >= '0' && s[i] <= '9') {
    unsigned d = (unsigned)(s[i++] - '0');
    if (v > (UINT64_MAX - d) / 10) return false; /* beyond 64 bits */
    v = v * 10 + d;
  }
  if (i == 0) return false; /* no digits, or a sign, a space, a dot first */
  uint64_t mult = 1;
  if (size && i < len) {
    switch (s[i]) {
      case 'K': case 'k': mult = KiB; break;
      case 'M': case 'm': mult = MiB; break;
      case 'G': case 'g': mult = GiB; break;
      case 'T': case 't': mult = TiB; break;
      default: return false;
    }
    i++;
    size_t rest = len - i;
    if (!(rest == 0 || (rest == 1 && strncasecmp(s + i, "B", 1) == 0) ||
          (rest == 2 && strncasecmp(s + i, "iB", 2) == 0)))
      return false;
    i = len;
  }
  if (i != len) return false;
  if (v > UINT64_MAX / mult) return false;
  *out = v * mult;
  return true;
}

/* What a size value may look like, for messages refusing one. */
#define SIZE_FORMS                                                                     \
  "a size: decimal digits, optionally followed by K, M, G or T (powers of 1024, either " \
  "case) and then optionally B or iB, e.g. 512, 64K, 2M, 1G, 1GB, 1GiB; no space "    \
  "inside, no sign, fraction or other unit"

/* v as the README writes sizes: "64K", "1024T", or plain bytes. */
static const char *size_text(uint64_t v, char *buf, size_t len) {
  static const struct {
    uint64_t unit;
    char suffix;
  } units[] = {{TiB, 'T'}, {GiB, 'G'}, {MiB, 'M'}, {KiB, 'K'}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (v && v % units[i].unit == 0) {
      snprintf(buf, len, "%" PRIu64 "%c", v / units[i].unit, units[i].suffix);
      return buf;
    }
  snprintf(buf, len, "%" PRIu64, v);
  return buf;
}

/* A value a key accepts: in its range, or a size's 0 (the default), or a
 * release threshold's "keep nothing". */
static bool in_range(const key_spec_t *k, uint64_t v) {
  if (v == 0 && (k->kind == KIND_SIZE || k->kind == KIND_THRESHOLD)) return true;
  if (v == GMA_RELEASE_ALL && k->kind == KIND_THRESHOLD) return true;
  return v >= k->min && v <= k->max;
}

/* Parses one of a key's names; the value is the name's index. */
static bool parse_name(const char *s, size_t len, const char *const *names, uint64_t n,
                       uint64_t *out) {
  for (uint64_t i = 0; i < n; i++)
    if (strlen(names[i]) == len && strncasecmp(s, names[i], len) == 0) {
      *out = i;
      return true;
    }
  return false;
}

static const char *const device_names[] = {"auto", "sim", "cuda"};
static const char *const reuse_names[] = {"auto", "wait", "none", "query"};
/* "bins" sets bins_off: index 0 is "on" (bins_off = 0). */
static const char *const onoff_names[] = {"on", "off"};
/* expandable_segments: gma_segments_t. */
static const char *const segments_names[] = {"auto", "true", "false"};
static const char *const fallback_names[] = {"none", "host"};
static const char *const defstream_names[] = {"legacy", "per_thread"};
static const char *const plan_names[] = {"off", "on"};
static const char *const simcosts_names[] = {"none", "h100", "h200"};

static void trim(const char **s, size_t *len) {
  while (*len && isspace((unsigned char)**s)) (*s)++, (*len)--;
  while (*len && isspace((unsigned char)(*s)[*len - 1])) (*len)--;
}

static void list_keys(char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < NKEYS && at < len; i++) {
    int n = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", keys[i].key);
    if (n < 0) break;
    at += (size_t)n;
  }
}

/* The names a named key takes, in value order; NULL for numeric keys. */
static const char *const *names_of(const key_spec_t *k, uint64_t *n) {
  switch (k->kind) {
    case KIND_DEVICE: *n = 3; return device_names;
    case KIND_REUSE: *n = 4; return reuse_names;
    case KIND_ONOFF: *n = 2; return onoff_names;
    case KIND_SEGMENTS: *n = 3; return segments_names;
    case KIND_FALLBACK: *n = 2; return fallback_names;
    case KIND_DEFSTREAM: *n = 2; return defstream_names;
    case KIND_PLAN: *n = 2; return plan_names;
    case KIND_SIMCOSTS: *n = 3; return simcosts_names;
    default: *n = 0; return NULL;
  }
}

/* Refuses key k's value v, which in_range rejected. parsed: v came from a
 * string (the message names the key as gma_config_parse does), else from
 * the struct, and where says which one. */
static gma_status_t range_error(const char *where, bool parsed, const key_spec_t *k, uint64_t v) {
  char what[160], range[160] = "";
  uint64_t n;
  const char *const *names = names_of(k, &n);
  if (names) { /* only a struct filled in C can hold a number here */
    for (uint64_t i = 0, at = 0; i < n && at < sizeof range; i++)
      at += (size_t)snprintf(range + at, sizeof range - at, "%s%s (%" PRIu64 ")",
                             i ? ", " : "one of ", names[i], i);
    snprintf(what, sizeof what, "%" PRId64, (int64_t)v);
  } else if (k->kind == KIND_SIZE || k->kind == KIND_THRESHOLD) {
    char vb[32], lo[32], hi[32];
    size_text(v, vb, sizeof vb);
    if (strchr("KMGT", vb[strlen(vb) - 1]))
      snprintf(what, sizeof what, "%s (%" PRIu64 " bytes)", vb, v);
    else
      snprintf(what, sizeof what, "%" PRIu64 " bytes", v);
    snprintf(range, sizeof range, "%s..%s%s", size_text(k->min, lo, sizeof lo),
             size_text(k->max, hi, sizeof hi),
             k->kind == KIND_THRESHOLD ? ", auto or 0 (keep nothing)" : ", or 0 for the default");
  } else {
    if (k->offset == FIELD(device_ordinal))
      snprintf(what, sizeof what, "%" PRId64, (int64_t)v);
    else
      snprintf(what, sizeof what, "%" PRIu64, v);
    snprintf(range, sizeof range, "%" PRIu64 "..%" PRIu64, k->min, k->max);
  }
  if (parsed)
    return gma__set_error(GMA_ERR_CONFIG, "%skey '%s': %s is out of range; it takes %s", where,
                          k->key, what, range);
  return gma__set_error(GMA_ERR_CONFIG, "%s%s is %s, out of range; it takes %s", where, k->key,
                        what, range);
}

/* The defaults of zero fields (the README's table). */
static void apply_defaults(gma_config_t *c) {
  if (!c->small_size) c->small_size = 1 * MiB;
  if (!c->small_segment_size) c->small_segment_size = 2 * MiB;
  if (!c->large_segment_size) c->large_segment_size = 20 * MiB;
  if (!c->sim_capacity) c->sim_capacity = 80 * GiB;
  if (!c->bin_max) c->bin_max = 1 * MiB; /* why not more: README, "The hot path" */
  if (!c->bin_depth) c->bin_depth = 64;
  if (!c->trim_interval_ms) c->trim_interval_ms = 1000;
  /* release_threshold 0 stays 0: "auto" (the worker keeps the working set). */
  if (!c->idle_ms) c->idle_ms = 10000;
  if (!c->ring_size) c->ring_size = 1024;
  if (!c->future_timeout_ms) c->future_timeout_ms = 1000;
  if (!c->host_release_threshold) c->host_release_threshold = 64 * MiB;
}

/* Every check on configuration values that does not depend on the device:
 * each key's range, and the rules that tie keys together. One place for both
 * gma_config_parse (a string is refused at once, not at gma_create) and
 * gma_create (a struct filled in by hand in C). Zero fields are defaults and
 * are checked as such: small_size:4M alone is refused, because the default
 * small_segment (2M) would be smaller. where prefixes each message. What
 * needs the device (expandable_segments against its granularity, a CUDA
 * device_id that does not exist) is checked at gma_create. */
static gma_status_t config_check(const gma_config_t *in, const char *where) {
  gma_config_t c = *in;
  /* Explicit values that contradict each other. Zero fields are defaults,
   * which gma_create fits to the limit (a default segment larger than
   * memory_limit is shrunk to it); only explicit values can conflict. */
  if (c.memory_limit &&
      (c.small_segment_size > c.memory_limit || c.large_segment_size > c.memory_limit)) {
    bool small = c.small_segment_size > c.memory_limit;
    char sb[32], lb[32];
    return gma__set_error(GMA_ERR_CONFIG,
                          "%s%s (%s) is larger than memory_limit (%s): no such segment could "
                          "ever be made; lower it, or leave it unset (the default shrinks to "
                          "the limit)",
                          where, small ? "small_segment" : "large_segment",
                          size_text(small ? c.small_segment_size : c.large_segment_size, sb,
                                    sizeof sb),
                          size_text(c.memory_limit, lb, sizeof lb));
  }
  if (memchr(c.trace_path, '\0', sizeof c.trace_path) == NULL)
    return gma__set_error(GMA_ERR_CONFIG, "%strace: the path is not NUL-terminated", where);
  bool small_segment_default = !c.small_segment_size;
  apply_defaults(&c);
  for (size_t i = 0; i < NKEYS; i++) {
    if (keys[i].kind == KIND_PATH) continue;
    uint64_t v = get_field(&c, &keys[i]);
    if (!in_range(&keys[i], v)) return range_error(where, false, &keys[i], v);
  }
  char a[32], b[32];
  uint64_t small_size = (c.small_size + 511) / 512 * 512; /* as the pool rounds it */
  if (c.small_segment_size % 512)
    return gma__set_error(GMA_ERR_CONFIG, "%ssmall_segment is %" PRIu64 " bytes; it must be a "
                          "multiple of 512", where, c.small_segment_size);
  if (c.small_segment_size < small_size)
    return gma__set_error(GMA_ERR_CONFIG,
                          "%ssmall_segment (%s%s) is smaller than small_size (%s): a small "
                          "request must fit one small segment; %s",
                          where, size_text(c.small_segment_size, a, sizeof a),
                          small_segment_default ? ", the default" : "",
                          size_text(small_size, b, sizeof b),
                          small_segment_default ? "set small_segment too, at least as large"
                                                : "raise small_segment or lower small_size");
  if (c.large_segment_size % (2 * MiB))
    return gma__set_error(GMA_ERR_CONFIG, "%slarge_segment is %s; it must be a multiple of 2M",
                          where, size_text(c.large_segment_size, a, sizeof a));
  if (c.ring_size & (c.ring_size - 1))
    return gma__set_error(GMA_ERR_CONFIG,
                          "%sring_size is %" PRIu64 "; it must be a power of 2 (such as 1024)",
                          where, c.ring_size);
  return GMA_OK;
}

/* Refuses key k when the caller's struct (size bytes, from an older gma.h)
 * ends before k's field: the value would have nowhere to go. */
static gma_status_t field_missing(const key_spec_t *k, size_t size) {
  return gma__set_error(GMA_ERR_CONFIG,
                        "key '%s': this gma_config_t has no such field (config->size is %zu: the "
                        "program was built against an older gma.h, whose struct ends before "
                        "it); build against this libgma's gma.h (%zu bytes) to set it",
                        k->key, size, sizeof(gma_config_t));
}

/* Parses val as a value of k's kind into *v; false, with *expected set to
 * the forms k takes, when it is none of them. */
static bool parse_value(const key_spec_t *k, const char *val, size_t vlen, uint64_t *v,
                        const char **expected) {
  switch (k->kind) {
    case KIND_DEVICE:
      *expected = "auto, sim or cuda";
      return parse_name(val, vlen, device_names, 3, v);
    case KIND_REUSE:
      *expected = "auto, query, wait or none";
      return parse_name(val, vlen, reuse_names, 4, v);
    case KIND_ONOFF:
      *expected = "on or off";
      return parse_name(val, vlen, onoff_names, 2, v);
    case KIND_SEGMENTS:
      *expected = "auto, true or false";
      return parse_name(val, vlen, segments_names, 3, v);
    case KIND_FALLBACK:
      *expected = "none or host";
      return parse_name(val, vlen, fallback_names, 2, v);
    case KIND_DEFSTREAM:
      *expected = "legacy or per_thread";
      return parse_name(val, vlen, defstream_names, 2, v);
    case KIND_PLAN:
      *expected = "off or on";
      return parse_name(val, vlen, plan_names, 2, v);
    case KIND_SIMCOSTS:
      *expected = "none, h100 or h200";
      return parse_name(val, vlen, simcosts_names, 3, v);
    case KIND_SIZE:
      *expected = SIZE_FORMS;
      return parse_number(val, vlen, true, v);
    case KIND_THRESHOLD: {
      /* "auto" is the default (0 in the struct); "0" keeps nothing. */
      *expected = "auto, 0 (keep nothing) or " SIZE_FORMS;
      if (vlen == 4 && strncasecmp(val, "auto", 4) == 0) {
        *v = 0;
        return true;
      }
      bool ok = parse_number(val, vlen, true, v);
      if (ok && *v == 0) *v = GMA_RELEASE_ALL;
      return ok;
    }
    default:
      *expected = "a whole number in decimal digits, no suffix";
      return parse_number(val, vlen, false, v);
  }
}

/* The key named key[0, klen), or NULL with the error set. */
static const key_spec_t *find_key(const char *key, size_t klen) {
  for (size_t i = 0; i < NKEYS; i++)
    if (strlen(keys[i].key) == klen && strncmp(keys[i].key, key, klen) == 0) return &keys[i];
  char known[768];
  list_keys(known, sizeof known);
  gma__set_error(GMA_ERR_CONFIG, "unknown key '%.*s'; known keys: %s", (int)klen, key, known);
  return NULL;
}

/* Applies one "key:value" entry (len > 0, trimmed) to work, whose caller's
 * struct has size bytes; *seen holds the keys given so far in the string. */
static gma_status_t parse_entry(gma_config_t *work, size_t size, const char *entry, size_t len,
                                uint64_t *seen) {
  const char *colon = memchr(entry, ':', len);
  if (!colon)
    return gma__set_error(GMA_ERR_CONFIG, "'%.*s' has no ':'; write key:value", (int)len, entry);
  const char *key = entry, *val = colon + 1;
  size_t klen = (size_t)(colon - entry), vlen = len - klen - 1;
  trim(&key, &klen);
  trim(&val, &vlen);
  const key_spec_t *k = find_key(key, klen);
  if (!k) return GMA_ERR_CONFIG;
  /* A key given twice in one string is a mistake (which value was meant?),
   * not an override: GMA_CONF and a later string may each set it once. */
  uint64_t bit = 1ull << (k - keys);
  if (*seen & bit)
    return gma__set_error(GMA_ERR_CONFIG, "key '%s' appears twice; give each key once", k->key);
  *seen |= bit;
  if (k->offset + field_width(k) > size) return field_missing(k, size);
  if (k->kind == KIND_PATH) {
    if (vlen == 0 || vlen >= sizeof work->trace_path)
      return gma__set_error(GMA_ERR_CONFIG, "key '%s': the path must have 1 to %zu characters",
                            k->key, sizeof work->trace_path - 1);
    char *at = (char *)work + k->offset;
    memcpy(at, val, vlen);
    at[vlen] = '\0';
    return GMA_OK;
  }
  uint64_t v;
  const char *expected;
  if (!parse_value(k, val, vlen, &v, &expected))
    return gma__set_error(GMA_ERR_CONFIG, "key '%s': bad value '%.*s'; expected %s", k->key,
                          (int)vlen, val, expected);
  /* For sizes, 0 asks for the default, as it does in gma_config_t. */
  if (!in_range(k, v)) return range_error("", true, k, v);
  set_field(work, k, v);
  return GMA_OK;
}

gma_status_t gma_config_parse(gma_config_t *config, const char *text) {
  if (!config || !text)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_config_parse: NULL %s",
                          config ? "text" : "config");
  size_t size = config->size;
  gma_status_t st = gma__struct_size_check(size, sizeof(gma_config_t), "gma_config_parse",
                                           "config", "GMA_CONFIG_INIT");
  if (st != GMA_OK) return st;
  /* The caller's first size bytes (an older gma.h's struct is shorter),
   * the rest zero as for gma_create; applied only when every entry is valid,
   * and only those bytes. */
  gma_config_t work;
  memset(&work, 0, sizeof work);
  memcpy(&work, config, size);
  uint64_t seen = 0; /* keys given so far in this string, by index */
  _Static_assert(NKEYS <= 64, "seen is a 64-bit set");
  const char *p = text;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *entry = p;
    p += len + (comma ? 1 : 0);
    trim(&entry, &len);
    if (len == 0) continue; /* tolerate "a:1,,b:2" and a trailing comma */
    st = parse_entry(&work, size, entry, len, &seen);
    if (st != GMA_OK) return st;
  }
  /* The whole config, as gma_create will see it: the string is refused now
   * rather than the allocator later. */
  st = config_check(&work, "");
  if (st != GMA_OK) return st;
  memcpy(config, &work, size);
  return GMA_OK;
}

gma_status_t gma__config_resolve(const gma_config_t *in, gma_config_t *out) {
  gma_config_t c;
  memset(&c, 0, sizeof c);
  if (in) {
    gma_status_t st =
        gma__struct_size_check(in->size, sizeof c, "gma_create", "config", "GMA_CONFIG_INIT");
    if (st != GMA_OK) return st;
    memcpy(&c, in, in->size);
  }
  c.size = sizeof c;
  /* The struct as the program filled it, then GMA_CONF over it (which
   * gma_config_parse checks as a whole), each error saying which it was. */
  gma_status_t st = config_check(&c, "gma_create: gma_config_t: ");
  if (st != GMA_OK) return st;
  if (!c.ignore_env) {
    const char *env = getenv("GMA_CONF");
    if (env && *env && (st = gma_config_parse(&c, env)) != GMA_OK)
      return gma__set_error(st, "in GMA_CONF=\"%s\": %s", env,
                            gma__error_detail(gma_last_error()));
  }
  apply_defaults(&c);
  c.small_size = (c.small_size + 511) / 512 * 512;
  *out = c;
  return GMA_OK;
}

/* For tests and tools: the keys gma_config_parse accepts, in table order. */
size_t gma__config_keys(const char **out, size_t cap) {
  for (size_t i = 0; i < NKEYS && i < cap; i++) out[i] = keys[i].key;
  return NKEYS;
}
