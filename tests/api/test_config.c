/* API test of configuration, through gma.h alone: gma_config_parse (every key,
 * size suffixes, errors naming the key, the config left unchanged on error)
 * and GMA_CONF read by gma_create (overrides the struct, errors fail
 * gma_create, ignore_env skips it, device:cuda fails cleanly without a GPU).
 * The effect of a GMA_CONF setting is observed through behaviour (limits,
 * injected failures), since the merged config is not readable back. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gma.h"

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define TiB ((uint64_t)1 << 40)

static gma_config_t fresh(void) {
  gma_config_t c = GMA_CONFIG_INIT;
  return c;
}

static void test_parse_every_key(void) {
  gma_config_t c = fresh();
  CHECK_OK(gma_config_parse(&c,
                            "device:sim,device_id:3,memory_limit:1G,small_size:512K,"
                            "small_segment:4M,large_segment:32M,sim_capacity:2T,"
                            "sim_alloc_ns:100,sim_free_ns:200,sim_event_ns:300,"
                            "sim_fail_alloc:5,sim_fail_event:7"));
  CHECK(c.size == sizeof(gma_config_t));
  CHECK(c.device == GMA_DEVICE_SIM);
  CHECK(c.device_ordinal == 3);
  CHECK(c.memory_limit == GiB);
  CHECK(c.small_size == 512 * KiB);
  CHECK(c.small_segment_size == 4 * MiB);
  CHECK(c.large_segment_size == 32 * MiB);
  CHECK(c.sim_capacity == 2 * TiB);
  CHECK(c.sim_alloc_latency_ns == 100);
  CHECK(c.sim_free_latency_ns == 200);
  CHECK(c.sim_event_latency_ns == 300);
  CHECK(c.sim_fail_alloc == 5);
  CHECK(c.sim_fail_event == 7);
  CHECK(c.ignore_env == 0); /* not a GMA_CONF key: untouched */

  /* Keys not named keep their values; later text overrides earlier. */
  CHECK_OK(gma_config_parse(&c, "device:auto"));
  CHECK(c.device == GMA_DEVICE_AUTO && c.memory_limit == GiB);
  CHECK_OK(gma_config_parse(&c, "device:cuda"));
  CHECK(c.device == GMA_DEVICE_CUDA);
  CHECK(c.expandable_segments == GMA_SEGMENTS_AUTO);
  CHECK_OK(gma_config_parse(&c, "expandable_segments:true"));
  CHECK(c.expandable_segments == GMA_SEGMENTS_GROWABLE && c.expandable_segments == 1);
  CHECK_OK(gma_config_parse(&c, "expandable_segments:false"));
  CHECK(c.expandable_segments == GMA_SEGMENTS_ORDINARY);
  CHECK_OK(gma_config_parse(&c, "expandable_segments:auto"));
  CHECK(c.expandable_segments == GMA_SEGMENTS_AUTO);
  CHECK_ST(gma_config_parse(&c, "expandable_segments:yes"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "auto, true or false") != NULL);

  /* Empty text changes nothing (GMA_CONF= is the empty string). */
  gma_config_t before = c;
  CHECK_OK(gma_config_parse(&c, ""));
  CHECK(memcmp(&before, &c, sizeof c) == 0);
}

static uint64_t *limit_of(gma_config_t *c) { return &c->memory_limit; }
static uint64_t *small_of(gma_config_t *c) { return &c->small_size; }

static void test_size_suffixes(void) {
  static const struct {
    const char *text;
    uint64_t value;
    uint64_t *(*field)(gma_config_t *);
  } cases[] = {
      /* 0 asks for the default, as it does in the struct. */
      {"memory_limit:0", 0, limit_of},
      {"memory_limit:1048576", MiB, limit_of},
      {"memory_limit:1024K", MiB, limit_of},
      {"memory_limit:1M", MiB, limit_of},
      {"memory_limit:20M", 20 * MiB, limit_of},
      {"memory_limit:1G", GiB, limit_of},
      {"memory_limit:80G", 80 * GiB, limit_of},
      {"memory_limit:1T", TiB, limit_of},
      {"memory_limit:16T", 16 * TiB, limit_of},
      {"small_size:512", 512, small_of},
      {"small_size:4096", 4096, small_of},
      {"small_size:1K", KiB, small_of},
      {"small_size:3K", 3 * KiB, small_of},
      {"small_size:2M", 2 * MiB, small_of},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gma_config_t c = fresh();
    gma_status_t st = gma_config_parse(&c, cases[i].text);
    uint64_t got = *cases[i].field(&c);
    if (st != GMA_OK || got != cases[i].value) {
      fprintf(stderr, "\"%s\": %s, value %llu, expected %llu\n", cases[i].text,
              gma_status_name(st), (unsigned long long)got,
              (unsigned long long)cases[i].value);
      exit(1);
    }
  }
  /* Every size key takes suffixes, not only memory_limit. */
  gma_config_t c = fresh();
  CHECK_OK(gma_config_parse(&c, "small_size:2M,small_segment:8M,large_segment:1G,sim_capacity:3G"));
  CHECK(c.small_size == 2 * MiB && c.small_segment_size == 8 * MiB);
  CHECK(c.large_segment_size == GiB && c.sim_capacity == 3 * GiB);
}

/* An error returns GMA_ERR_CONFIG, names the key in gma_last_error(), and
 * leaves the whole config as it was, even when earlier keys were valid. */
static void test_parse_errors(void) {
  static const struct {
    const char *text;
    const char *key; /* must appear in gma_last_error() */
  } cases[] = {
      {"bogus_key:1", "bogus_key"},
      {"device:sim,no_such_thing:4", "no_such_thing"},
      {"memory_limit", "memory_limit"},           /* missing ':' */
      {"memory_limit=1G", "memory_limit"},        /* wrong separator */
      {"memory_limit:", "memory_limit"},          /* no value */
      {"memory_limit:abc", "memory_limit"},
      {"memory_limit:12X", "memory_limit"},       /* unknown suffix */
      {"memory_limit:1GG", "memory_limit"},       /* trailing garbage */
      {"memory_limit:-1", "memory_limit"},        /* negative size */
      {"memory_limit:99999999999T", "memory_limit"}, /* overflows 64 bits */
      {"memory_limit:18446744073709551616", "memory_limit"}, /* 2^64 */
      {"memory_limit:18446744073709551615", "memory_limit"}, /* beyond any device */
      {"device:gpu", "device"},
      {"device:", "device"},
      {"device_id:abc", "device_id"},
      {"sim_capacity:1.5G", "sim_capacity"},
      {"sim_alloc_ns:fast", "sim_alloc_ns"},
      {"sim_fail_alloc:x", "sim_fail_alloc"},
      {"small_size:1Q", "small_size"},
      {"device:sim,large_segment:lots", "large_segment"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gma_config_t c = fresh();
    c.memory_limit = 12345;
    c.device = GMA_DEVICE_CUDA;
    c.small_size = 777;
    gma_config_t before = c;
    gma_status_t st = gma_config_parse(&c, cases[i].text);
    if (st != GMA_ERR_CONFIG) {
      fprintf(stderr, "\"%s\": %s, expected GMA_ERR_CONFIG\n", cases[i].text,
              gma_status_name(st));
      exit(1);
    }
    if (strstr(gma_last_error(), cases[i].key) == NULL) {
      fprintf(stderr, "\"%s\": last error \"%s\" does not name \"%s\"\n", cases[i].text,
              gma_last_error(), cases[i].key);
      exit(1);
    }
    if (memcmp(&before, &c, sizeof c) != 0) {
      fprintf(stderr, "\"%s\": the config changed although parsing failed\n", cases[i].text);
      exit(1);
    }
  }
}

/* Sizes take exactly the README's forms (issue 17): digits, then optionally
 * K, M, G or T in either case, then optionally B or iB; whitespace around
 * the value is trimmed. Anything else is refused with a message listing the
 * forms, the config unchanged. */
static void test_size_forms(void) {
  static const struct {
    const char *value;
    uint64_t bytes;
  } good[] = {
      {"512", 512},           {"64K", 64 * KiB},      {"64k", 64 * KiB},
      {"2M", 2 * MiB},        {"2m", 2 * MiB},        {"1G", GiB},
      {"1g", GiB},            {"1T", TiB},            {"1GB", GiB},
      {"1gb", GiB},           {"1Gb", GiB},           {"1GiB", GiB},
      {"1gib", GiB},          {"512MB", 512 * MiB},   {"512MiB", 512 * MiB},
      {" 512M", 512 * MiB},   {"512M ", 512 * MiB},   {"\t512M\n", 512 * MiB},
      {"0", 0},               {"0512", 512},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    char text[64];
    snprintf(text, sizeof text, "bin_max:%s", good[i].value);
    gma_config_t c = fresh();
    gma_status_t st = gma_config_parse(&c, text);
    if (good[i].bytes > 1 * GiB || (good[i].bytes && good[i].bytes < 512)) { /* bin_max's range */
      CHECK_ST(st, GMA_ERR_CONFIG);
      CHECK(strstr(gma_last_error(), "out of range"));
      snprintf(text, sizeof text, "sim_capacity:%s", good[i].value);
      c = fresh();
      st = gma_config_parse(&c, text);
      if (st != GMA_OK || c.sim_capacity != good[i].bytes) {
        fprintf(stderr, "\"%s\": %s (%s)\n", text, gma_status_name(st), gma_last_error());
        exit(1);
      }
      continue;
    }
    if (st != GMA_OK || c.bin_max != good[i].bytes) {
      fprintf(stderr, "\"%s\": %s, %llu bytes (%s)\n", text, gma_status_name(st),
              (unsigned long long)c.bin_max, gma_last_error());
      exit(1);
    }
  }
  static const char *const bad[] = {
      "512B", "512b",  "1.5G",      "+1G",   "-1G", "1e9", "0x100000", "512 M", "1 G",
      "1GiBB", "1Gi",  "1KB2",      "1 MB",  "MB",  "K",   "1KK",      "1P",    "1GBi",
      "1iB",   "one",  "１G" /* a full-width digit */,
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[64];
    snprintf(text, sizeof text, "memory_limit:%s", bad[i]);
    gma_config_t c = fresh();
    gma_config_t before = c;
    gma_status_t st = gma_config_parse(&c, text);
    const char *m = gma_last_error();
    if (st != GMA_ERR_CONFIG || !strstr(m, "memory_limit") || !strstr(m, "K, M, G or T") ||
        !strstr(m, "B or iB") || !strstr(m, "1GiB") || memcmp(&before, &c, sizeof c) != 0) {
      fprintf(stderr, "\"%s\": %s, message \"%s\"\n", text, gma_status_name(st), m);
      exit(1);
    }
  }
  /* Counts take no suffix; the message says so. */
  gma_config_t c = fresh();
  CHECK_ST(gma_config_parse(&c, "bin_depth:1K"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "bin_depth") && strstr(gma_last_error(), "no suffix"));
  /* Out of range, said in the units the README uses. */
  CHECK_ST(gma_config_parse(&c, "memory_limit:512K"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "512K (524288 bytes)") && strstr(gma_last_error(), "1M..1024T"));
}

/* Everything gma_create checks on configuration values that does not depend
 * on the device is checked by gma_config_parse (issue 17: ring_size:1000
 * passed it and failed only at gma_create), against the config as gma_create
 * will see it (zero fields are the defaults); a struct filled in by hand
 * meets the same checks at gma_create. */
static void test_checked_when_parsed(void) {
  static const struct {
    const char *text;
    const char *says[2]; /* in gma_last_error() */
  } cases[] = {
      {"ring_size:1000", {"ring_size", "power of 2"}},
      {"large_segment:3M", {"large_segment", "multiple of 2M"}},
      {"small_segment:1000", {"small_segment", "multiple of 512"}},
      {"small_size:4M", {"small_segment (2M, the default)", "small_size (4M)"}},
      {"small_size:2M,small_segment:1M", {"small_segment (1M)", "small_size (2M)"}},
      {"memory_limit:4M,large_segment:8M", {"large_segment", "memory_limit"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gma_config_t c = fresh();
    gma_config_t before = c;
    gma_status_t st = gma_config_parse(&c, cases[i].text);
    const char *m = gma_last_error();
    if (st != GMA_ERR_CONFIG || !strstr(m, cases[i].says[0]) || !strstr(m, cases[i].says[1]) ||
        memcmp(&before, &c, sizeof c) != 0) {
      fprintf(stderr, "\"%s\": %s, message \"%s\"\n", cases[i].text, gma_status_name(st), m);
      exit(1);
    }
  }
  /* In range at both ends; a rule met across two strings. */
  gma_config_t c = fresh();
  CHECK_OK(gma_config_parse(&c, "ring_size:2"));
  CHECK_OK(gma_config_parse(&c, "ring_size:1048576,small_size:2M"));
  CHECK_OK(gma_config_parse(&c, "small_segment:8M"));
  CHECK_OK(gma_config_parse(&c, "small_size:4M")); /* small_segment is 8M now */

  /* The same values in a struct filled in C: gma_create refuses them, saying
   * the struct is where they came from. */
  gma_config_t s[8];
  const char *key[8];
  int n = 0;
  s[n] = fresh(), s[n].ring_size = 1000, key[n++] = "ring_size";
  s[n] = fresh(), s[n].large_segment_size = 3 * MiB, key[n++] = "large_segment";
  s[n] = fresh(), s[n].small_size = 4 * MiB, key[n++] = "small_segment";
  s[n] = fresh(), s[n].memory_limit = 4 * MiB, s[n].small_segment_size = 8 * MiB,
  key[n++] = "small_segment";
  s[n] = fresh(), s[n].device = (gma_device_kind_t)7, key[n++] = "device";
  s[n] = fresh(), s[n].reuse = (gma_reuse_t)9, key[n++] = "reuse";
  s[n] = fresh(), s[n].device_ordinal = -1, key[n++] = "device_id";
  s[n] = fresh(), s[n].bin_depth = 100000, key[n++] = "bin_depth";
  for (int i = 0; i < n; i++) {
    s[i].ignore_env = 1;
    gma_t *g = NULL;
    gma_status_t st = gma_create(&s[i], &g);
    const char *m = gma_last_error();
    if (st != GMA_ERR_CONFIG || g || !strstr(m, key[i]) || !strstr(m, "gma_create: gma_config_t")) {
      fprintf(stderr, "struct case %d (%s): %s, message \"%s\"\n", i, key[i],
              gma_status_name(st), m);
      exit(1);
    }
  }
  CHECK(strstr(gma_last_error(), "1..65536"));
  gma_t *g = NULL;
  s[4].device = (gma_device_kind_t)7;
  CHECK_ST(gma_create(&s[4], &g), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "auto (0), sim (1), cuda (2)"));
}

/* Creates an allocator on the simulated device with GMA_CONF as given (NULL:
 * unset). */
static gma_status_t create_with_env(const char *env, gma_config_t *c, gma_t **g) {
  if (env)
    CHECK(setenv("GMA_CONF", env, 1) == 0);
  else
    CHECK(unsetenv("GMA_CONF") == 0);
  *g = NULL;
  return gma_create(c, g);
}

/* Whether one request of size bytes can be served (and frees it). */
static gma_status_t try_alloc(gma_t *g, uint64_t size) {
  void *p = NULL;
  gma_status_t st = gma_alloc(g, (size_t)size, NULL, &p);
  if (st == GMA_OK) CHECK_OK(gma_free(g, p));
  return st;
}

static void test_env(void) {
  gma_config_t c = fresh();
  c.device = GMA_DEVICE_SIM;
  c.sim_capacity = 256 * MiB;
  gma_t *g = NULL;

  /* GMA_CONF overrides the struct: the limit of 32M makes 33M invalid. */
  CHECK_OK(create_with_env("memory_limit:32M", &c, &g));
  CHECK(strcmp(gma_device_name(g), "sim") == 0);
  CHECK_ST(try_alloc(g, 33 * MiB), GMA_ERR_INVALID_SIZE);
  CHECK_OK(try_alloc(g, 30 * MiB));
  CHECK_OK(gma_destroy(g));

  c.memory_limit = 200 * MiB;
  CHECK_OK(create_with_env("memory_limit:32M", &c, &g));
  CHECK_ST(try_alloc(g, 33 * MiB), GMA_ERR_INVALID_SIZE);
  CHECK_OK(gma_destroy(g));
  c.memory_limit = 0;

  /* The struct alone, with GMA_CONF unset or empty. */
  CHECK_OK(create_with_env(NULL, &c, &g));
  CHECK_OK(try_alloc(g, 33 * MiB));
  CHECK_ST(try_alloc(g, 257 * MiB), GMA_ERR_INVALID_SIZE);
  CHECK_OK(gma_destroy(g));
  CHECK_OK(create_with_env("", &c, &g));
  CHECK_OK(try_alloc(g, 33 * MiB));
  CHECK_OK(gma_destroy(g));

  /* Sizes with suffixes and several keys from the environment. */
  CHECK_OK(create_with_env("sim_capacity:64M,sim_fail_alloc:1", &c, &g));
  CHECK_ST(try_alloc(g, 65 * MiB), GMA_ERR_INVALID_SIZE);
  CHECK_ST(try_alloc(g, 4096), GMA_ERR_DEVICE); /* the injected first failure */
  CHECK_OK(try_alloc(g, 4096));
  CHECK_OK(gma_destroy(g));

  /* ignore_env: the same GMA_CONF has no effect. */
  c.ignore_env = 1;
  CHECK_OK(create_with_env("sim_capacity:64M,sim_fail_alloc:1", &c, &g));
  CHECK_OK(try_alloc(g, 4096));
  CHECK_OK(try_alloc(g, 100 * MiB));
  CHECK_OK(gma_destroy(g));
  CHECK_OK(create_with_env("bogus:1", &c, &g)); /* not even parsed */
  CHECK_OK(gma_destroy(g));
  c.ignore_env = 0;

  /* Errors in GMA_CONF fail gma_create with the key named; nothing is created. */
  const char *bad[][2] = {{"bogus:1", "bogus"},
                          {"memory_limit", "memory_limit"},
                          {"memory_limit:lots", "memory_limit"},
                          {"sim_capacity:64M,device:tpu", "device"},
                          {"ring_size:1000", "ring_size"},
                          {"small_size:4M", "small_segment"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    gma_status_t st = create_with_env(bad[i][0], &c, &g);
    if (st != GMA_ERR_CONFIG || strstr(gma_last_error(), bad[i][1]) == NULL) {
      fprintf(stderr, "GMA_CONF=\"%s\": %s, last error \"%s\"\n", bad[i][0],
              gma_status_name(st), gma_last_error());
      exit(1);
    }
    CHECK(g == NULL);
  }

  /* device:cuda, from GMA_CONF or the struct, is NO_DEVICE with the reason
   * when there is no usable GPU (no driver, no device); on a GPU machine it
   * opens the GPU. */
  gma_status_t cst = create_with_env("device:cuda", &c, &g);
  if (cst == GMA_OK) {
    CHECK(strcmp(gma_device_name(g), "cuda") == 0);
    CHECK_OK(gma_destroy(g));
    g = NULL;
  } else {
    CHECK_ST(cst, GMA_ERR_NO_DEVICE);
    CHECK(g == NULL && strstr(gma_last_error(), "CUDA") != NULL);
  }
  CHECK(gma_last_error()[0] != '\0');
  gma_config_t cu = fresh();
  cu.device = GMA_DEVICE_CUDA;
  cu.ignore_env = 1;
  if (cst != GMA_OK) {
    CHECK_ST(create_with_env(NULL, &cu, &g), GMA_ERR_NO_DEVICE);
    CHECK(g == NULL);
  }

  /* device:sim from GMA_CONF overrides a CUDA request in the struct. */
  cu.ignore_env = 0;
  CHECK_OK(create_with_env("device:sim,sim_capacity:128M", &cu, &g));
  CHECK(strcmp(gma_device_name(g), "sim") == 0);
  CHECK_OK(gma_destroy(g));

  /* device:auto falls back to the simulated device without a GPU; a NULL
   * config means all defaults plus GMA_CONF. */
  if (cst != GMA_OK) {
    CHECK_OK(create_with_env("device:auto,sim_capacity:128M", NULL, &g));
    CHECK(strcmp(gma_device_name(g), "sim") == 0);
    CHECK_ST(try_alloc(g, 129 * MiB), GMA_ERR_INVALID_SIZE);
    CHECK_OK(gma_destroy(g));
  }

  CHECK(unsetenv("GMA_CONF") == 0);
}

int main(void) {
  test_parse_every_key();
  test_size_suffixes();
  test_size_forms();
  test_parse_errors();
  test_checked_when_parsed();
  test_env();
  printf("test_config: ok\n");
  return 0;
}
