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
  CHECK_OK(gma_config_parse(&c, "expandable_segments:true"));
  CHECK(c.expandable_segments == 1);
  CHECK_OK(gma_config_parse(&c, "expandable_segments:false"));
  CHECK(c.expandable_segments == 0);
  CHECK_ST(gma_config_parse(&c, "expandable_segments:yes"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "true or false") != NULL);

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
                          {"sim_capacity:64M,device:tpu", "device"}};
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
  test_parse_errors();
  test_env();
  printf("test_config: ok\n");
  return 0;
}
