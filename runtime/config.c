/* Owns configuration: the table of GMA_CONF keys, parsing "key:value,..."
 * strings, defaults for zero fields, and range checks. */
#include "config.h"

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
  KIND_SIZE, KIND_COUNT, KIND_DEVICE, KIND_REUSE, KIND_ONOFF, KIND_BOOL, KIND_PATH, KIND_FALLBACK, KIND_DEFSTREAM,
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
    {"reuse", FIELD(reuse), KIND_REUSE, 0, 2},
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
    {"expandable_segments", FIELD(expandable_segments), KIND_BOOL, 0, 1},
    {"trace", FIELD(trace_path), KIND_PATH, 0, 0},
    {"fallback", FIELD(fallback_host), KIND_FALLBACK, 0, 1},
    {"host_release_threshold", FIELD(host_release_threshold), KIND_SIZE, 0, 1024 * TiB},
    {"oom_wait_ms", FIELD(oom_wait_ms), KIND_COUNT, 0, 86400000},
    {"default_stream", FIELD(per_thread_default_stream), KIND_DEFSTREAM, 0, 1},
    {"sim_alloc_ns", FIELD(sim_alloc_latency_ns), KIND_COUNT, 0, 10000000000ull},
    {"sim_free_ns", FIELD(sim_free_latency_ns), KIND_COUNT, 0, 10000000000ull},
    {"sim_event_ns", FIELD(sim_event_latency_ns), KIND_COUNT, 0, 10000000000ull},
    {"sim_fail_alloc", FIELD(sim_fail_alloc), KIND_COUNT, 0, UINT64_MAX},
    {"sim_fail_event", FIELD(sim_fail_event), KIND_COUNT, 0, UINT64_MAX},
};
#define NKEYS (sizeof keys / sizeof keys[0])

static uint64_t get_field(const gma_config_t *c, const key_spec_t *k) {
  const char *at = (const char *)c + k->offset;
  if (k->kind == KIND_DEVICE) return (uint64_t)*(const gma_device_kind_t *)at;
  if (k->kind == KIND_REUSE) return (uint64_t)*(const gma_reuse_t *)at;
  if (k->kind == KIND_ONOFF || k->kind == KIND_BOOL || k->kind == KIND_FALLBACK || k->kind == KIND_DEFSTREAM ||
      k->offset == FIELD(device_ordinal))
    return (uint64_t)(int64_t)*(const int *)at;
  return *(const uint64_t *)at;
}

static void set_field(gma_config_t *c, const key_spec_t *k, uint64_t v) {
  char *at = (char *)c + k->offset;
  if (k->kind == KIND_DEVICE)
    *(gma_device_kind_t *)at = (gma_device_kind_t)v;
  else if (k->kind == KIND_REUSE)
    *(gma_reuse_t *)at = (gma_reuse_t)v;
  else if (k->kind == KIND_ONOFF || k->kind == KIND_BOOL || k->kind == KIND_FALLBACK || k->kind == KIND_DEFSTREAM ||
      k->offset == FIELD(device_ordinal))
    *(int *)at = (int)v;
  else
    *(uint64_t *)at = v;
}

/* Parses a decimal count, or a size with an optional K/M/G/T suffix (powers of
 * 1024, optionally followed by "B" or "iB"). */
static bool parse_number(const char *s, size_t len, bool size, uint64_t *out) {
  char buf[64];
  if (len == 0 || len >= sizeof buf) return false;
  memcpy(buf, s, len);
  buf[len] = '\0';
  if (!isdigit((unsigned char)buf[0])) return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(buf, &end, 10);
  if (errno) return false;
  uint64_t mult = 1;
  if (size && *end) {
    switch (toupper((unsigned char)*end)) {
      case 'K': mult = KiB; break;
      case 'M': mult = MiB; break;
      case 'G': mult = GiB; break;
      case 'T': mult = TiB; break;
      case 'B': mult = 1; end--; break;
      default: return false;
    }
    end++;
    if (strcasecmp(end, "") != 0 && strcasecmp(end, "B") != 0 && strcasecmp(end, "iB") != 0)
      return false;
  } else if (*end) {
    return false;
  }
  if (v > UINT64_MAX / mult) return false;
  *out = (uint64_t)v * mult;
  return true;
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
static const char *const reuse_names[] = {"query", "wait", "none"};
/* "bins" sets bins_off: index 0 is "on" (bins_off = 0). */
static const char *const onoff_names[] = {"on", "off"};
static const char *const bool_names[] = {"false", "true"};
static const char *const fallback_names[] = {"none", "host"};
static const char *const defstream_names[] = {"legacy", "per_thread"};

static void trim(const char **s, size_t *len) {
  while (*len && isspace((unsigned char)**s)) (*s)++, (*len)--;
  while (*len && isspace((unsigned char)(*s)[*len - 1])) (*len)--;
}

static void list_keys(char *buf, size_t len) {
  size_t at = 0;
  for (size_t i = 0; i < NKEYS && at < len; i++) {
    int n = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", keys[i].key);
    if (n < 0) break;
    at += (size_t)n;
  }
}

/* Keys whose values contradict each other. Zero fields are defaults, which
 * gma_create fits to the limit (a default segment larger than memory_limit
 * is shrunk to it); only explicit values can conflict. */
static gma_status_t check_pairs(const gma_config_t *c, const char *where) {
  if (!c->memory_limit) return GMA_OK;
  if (c->small_segment_size > c->memory_limit || c->large_segment_size > c->memory_limit)
    return gma__set_error(GMA_ERR_CONFIG,
                          "%s%s (%" PRIu64 ") is larger than memory_limit (%" PRIu64 "): no such "
                          "segment could ever be made; lower it, or leave it unset (the default "
                          "shrinks to the limit)",
                          where,
                          c->small_segment_size > c->memory_limit ? "small_segment"
                                                                  : "large_segment",
                          c->small_segment_size > c->memory_limit ? c->small_segment_size
                                                                  : c->large_segment_size,
                          c->memory_limit);
  return GMA_OK;
}

gma_status_t gma_config_parse(gma_config_t *config, const char *text) {
  if (!config || !text)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_config_parse: NULL %s",
                          config ? "text" : "config");
  gma_config_t work = *config; /* applied only when every entry is valid */
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
    const char *colon = memchr(entry, ':', len);
    if (!colon)
      return gma__set_error(GMA_ERR_CONFIG, "'%.*s' has no ':'; write key:value", (int)len, entry);
    const char *key = entry, *val = colon + 1;
    size_t klen = (size_t)(colon - entry), vlen = len - klen - 1;
    trim(&key, &klen);
    trim(&val, &vlen);
    const key_spec_t *k = NULL;
    for (size_t i = 0; i < NKEYS; i++)
      if (strlen(keys[i].key) == klen && strncmp(keys[i].key, key, klen) == 0) k = &keys[i];
    if (!k) {
      char known[512];
      list_keys(known, sizeof known);
      return gma__set_error(GMA_ERR_CONFIG, "unknown key '%.*s'; known keys: %s", (int)klen, key,
                            known);
    }
    /* A key given twice in one string is a mistake (which value was meant?),
     * not an override: GMA_CONF and a later string may each set it once. */
    uint64_t bit = 1ull << (k - keys);
    if (seen & bit)
      return gma__set_error(GMA_ERR_CONFIG, "key '%s' appears twice; give each key once", k->key);
    seen |= bit;
    if (k->kind == KIND_PATH) {
      if (vlen == 0 || vlen >= sizeof work.trace_path)
        return gma__set_error(GMA_ERR_CONFIG, "key '%s': the path must have 1 to %zu characters",
                              k->key, sizeof work.trace_path - 1);
      char *at = (char *)&work + k->offset;
      memcpy(at, val, vlen);
      at[vlen] = '\0';
      continue;
    }
    uint64_t v;
    bool ok;
    const char *expected;
    switch (k->kind) {
      case KIND_DEVICE:
        ok = parse_name(val, vlen, device_names, 3, &v);
        expected = "auto, sim or cuda";
        break;
      case KIND_REUSE:
        ok = parse_name(val, vlen, reuse_names, 3, &v);
        expected = "query, wait or none";
        break;
      case KIND_ONOFF:
        ok = parse_name(val, vlen, onoff_names, 2, &v);
        expected = "on or off";
        break;
      case KIND_BOOL:
        ok = parse_name(val, vlen, bool_names, 2, &v);
        expected = "true or false";
        break;
      case KIND_FALLBACK:
        ok = parse_name(val, vlen, fallback_names, 2, &v);
        expected = "none or host";
        break;
      case KIND_DEFSTREAM:
        ok = parse_name(val, vlen, defstream_names, 2, &v);
        expected = "legacy or per_thread";
        break;
      case KIND_SIZE:
        ok = parse_number(val, vlen, true, &v);
        expected = "a size such as 512, 64K, 2M, 1G";
        break;
      case KIND_THRESHOLD:
        /* "auto" is the default (0 in the struct); "0" keeps nothing. */
        if (vlen == 4 && strncasecmp(val, "auto", 4) == 0) {
          ok = true, v = 0;
        } else {
          ok = parse_number(val, vlen, true, &v);
          if (ok && v == 0) v = GMA_RELEASE_ALL;
        }
        expected = "auto, 0 (keep nothing) or a size such as 64M";
        break;
      default:
        ok = parse_number(val, vlen, false, &v);
        expected = "a non-negative integer";
        break;
    }
    if (!ok)
      return gma__set_error(GMA_ERR_CONFIG, "key '%s': bad value '%.*s' (expected %s)", k->key,
                            (int)vlen, val, expected);
    /* For sizes, 0 asks for the default, as it does in gma_config_t. */
    if (!in_range(k, v))
      return gma__set_error(GMA_ERR_CONFIG,
                            "key '%s': %" PRIu64 " is out of range [%" PRIu64 ", %" PRIu64 "]",
                            k->key, v, k->min, k->max);
    set_field(&work, k, v);
  }
  gma_status_t st = check_pairs(&work, "");
  if (st != GMA_OK) return st;
  *config = work;
  return GMA_OK;
}

gma_status_t gma__config_resolve(const gma_config_t *in, gma_config_t *out) {
  gma_config_t c;
  memset(&c, 0, sizeof c);
  if (in) {
    if (in->size < sizeof(size_t) || in->size > sizeof c)
      return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                            "gma_create: config.size is %zu; initialize the config with "
                            "GMA_CONFIG_INIT (this library's size is %zu)",
                            in->size, sizeof c);
    memcpy(&c, in, in->size);
  }
  c.size = sizeof c;
  gma_status_t pst = check_pairs(&c, "gma_create: ");
  if (pst != GMA_OK) return pst;
  if (!c.ignore_env) {
    const char *env = getenv("GMA_CONF");
    if (env && *env) {
      gma_status_t st = gma_config_parse(&c, env);
      if (st != GMA_OK) {
        char detail[768];
        snprintf(detail, sizeof detail, "%s", gma_last_error());
        return gma__set_error(st, "in GMA_CONF=\"%s\": %s", env, detail);
      }
    }
  }
  if (!c.small_size) c.small_size = 1 * MiB;
  if (!c.small_segment_size) c.small_segment_size = 2 * MiB;
  if (!c.large_segment_size) c.large_segment_size = 20 * MiB;
  if (!c.sim_capacity) c.sim_capacity = 80 * GiB;
  if (!c.bin_max) c.bin_max = 1 * MiB; /* why not more: README, "The hot path" */
  if (!c.bin_depth) c.bin_depth = 64;
  if (!c.trim_interval_ms) c.trim_interval_ms = 1000;
  /* release_threshold 0 stays 0: "auto" (the worker keeps the working set). */
  if (!c.idle_ms) c.idle_ms = 10000;
  if (!c.ring_size) c.ring_size = 1024;
  if (!c.future_timeout_ms) c.future_timeout_ms = 1000;
  if (!c.host_release_threshold) c.host_release_threshold = 64 * MiB;
  /* Range checks again: the struct may have been filled without the parser. */
  for (size_t i = 0; i < NKEYS; i++) {
    if (keys[i].kind == KIND_PATH) continue;
    uint64_t v = get_field(&c, &keys[i]);
    bool defaulted_zero = v == 0 && (keys[i].offset == FIELD(memory_limit));
    if (!defaulted_zero && !in_range(&keys[i], v))
      return gma__set_error(GMA_ERR_CONFIG,
                            "%s = %" PRIu64 " is out of range [%" PRIu64 ", %" PRIu64 "]",
                            keys[i].key, v, keys[i].min, keys[i].max);
  }
  c.small_size = (c.small_size + 511) / 512 * 512;
  if (c.small_segment_size < c.small_size || c.small_segment_size % 512)
    return gma__set_error(GMA_ERR_CONFIG,
                          "small_segment (%" PRIu64 ") must be a multiple of 512 and at least "
                          "small_size (%" PRIu64 ")",
                          c.small_segment_size, c.small_size);
  if (memchr(c.trace_path, '\0', sizeof c.trace_path) == NULL)
    return gma__set_error(GMA_ERR_CONFIG, "trace: the path is not NUL-terminated");
  if (c.ring_size & (c.ring_size - 1))
    return gma__set_error(GMA_ERR_CONFIG, "ring_size (%" PRIu64 ") must be a power of 2",
                          c.ring_size);
  if (c.large_segment_size % (2 * MiB))
    return gma__set_error(GMA_ERR_CONFIG, "large_segment (%" PRIu64 ") must be a multiple of 2M",
                          c.large_segment_size);
  *out = c;
  return GMA_OK;
}
