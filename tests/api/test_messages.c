/* Error messages say what happened once, in the user's terms (issue 17):
 * gma_last_error() starts with the status name and holds no other, and names
 * no internal function of gma or of its device backends ("sim: stream_id:",
 * "gma__..."). Representative failures: a bad GMA_CONF key and value (the
 * message used to read "GMA_ERR_CONFIG: in GMA_CONF=...: GMA_ERR_CONFIG:
 * ..."), a config string refused by the parser, streams that no longer exist
 * on the simulated device (each entry point that takes one), an injected
 * device failure, and a gma_reserve that quotes the failure inside it.
 * Public API only. */
#include <stdlib.h>
#include <string.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)

/* Names of gma's internals and of the device boundary's functions, which a
 * user has no use for. */
static const char *const internal[] = {
    "sim: ",          "cuda: ",      "gma__",          "stream_id",  "event_record",
    "event_query",    "event_create", "stream_wait_event", "mem_alloc", "mem_free",
    "stream_push",    "stream_get",  "worker: ",       "trace: ",    "ptds",
};

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

/* The message of the failure just returned: its status, said once at the
 * start; no internal name; and the words the user needs (each of says). */
static void check_message(int line, gma_status_t st, gma_status_t expected, const char *says1,
                          const char *says2) {
  const char *m = gma_last_error();
  const char *name = gma_status_name(expected);
  if (st != expected) {
    fprintf(stderr, "line %d: returned %s, expected %s (%s)\n", line, gma_status_name(st), name,
            m);
    exit(1);
  }
  int bad = strncmp(m, name, strlen(name)) != 0 || strncmp(m + strlen(name), ": ", 2) != 0;
  bad |= count(m, "GMA_ERR_") != 1; /* no second (or doubled) status name */
  for (size_t i = 0; i < sizeof internal / sizeof internal[0]; i++)
    if (strstr(m, internal[i])) {
      fprintf(stderr, "line %d: the message names \"%s\"\n", line, internal[i]);
      bad = 1;
    }
  if ((says1 && !strstr(m, says1)) || (says2 && !strstr(m, says2))) {
    fprintf(stderr, "line %d: the message lacks \"%s\" / \"%s\"\n", line, says1 ? says1 : "",
            says2 ? says2 : "");
    bad = 1;
  }
  if (bad) {
    fprintf(stderr, "line %d: bad message: %s\n", line, m);
    exit(1);
  }
}
#define MESSAGE(call, expected, says1, says2) \
  check_message(__LINE__, (call), (expected), (says1), (says2))

static gma_status_t create_with_env(const char *env, gma_t **g) {
  CHECK(setenv("GMA_CONF", env, 1) == 0);
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  *g = NULL;
  gma_status_t st = gma_create(&c, g);
  CHECK(unsetenv("GMA_CONF") == 0);
  return st;
}

static void config_messages(void) {
  gma_t *g = NULL;
  MESSAGE(create_with_env("device:sim,bogus:1", &g), GMA_ERR_CONFIG, "GMA_CONF", "'bogus'");
  CHECK(g == NULL);
  MESSAGE(create_with_env("memory_limit:lots", &g), GMA_ERR_CONFIG, "GMA_CONF", "memory_limit");
  MESSAGE(create_with_env("ring_size:1000", &g), GMA_ERR_CONFIG, "GMA_CONF", "power of 2");
  MESSAGE(create_with_env("small_size:4M", &g), GMA_ERR_CONFIG, "small_segment", "small_size");
  gma_config_t c = GMA_CONFIG_INIT;
  MESSAGE(gma_config_parse(&c, "bin_depth:lots"), GMA_ERR_CONFIG, "bin_depth", NULL);
  MESSAGE(gma_config_parse(&c, "memory_limit:512 M"), GMA_ERR_CONFIG, "memory_limit", "1GiB");
  /* A struct filled in C: the same check, said to come from the struct. */
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  c.ring_size = 1000;
  MESSAGE(gma_create(&c, &g), GMA_ERR_CONFIG, "gma_create", "ring_size");
}

static void no_op(void *arg) { (void)arg; }

static void stream_messages(void) {
  gma_t *g = sim_allocator(NULL);
  gma_stream_t s, live;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_create(g, &live));
  void *p = NULL;
  CHECK_OK(gma_alloc(g, 4096, NULL, &p));
  CHECK_OK(gma_stream_destroy(g, s));
  void *q = NULL;
  MESSAGE(gma_alloc(g, 4096, s, &q), GMA_ERR_INVALID_ARGUMENT, "not a live stream", NULL);
  MESSAGE(gma_alloc(g, 8 * MiB, s, &q), GMA_ERR_INVALID_ARGUMENT, "not a live stream", NULL);
  MESSAGE(gma_stream_synchronize(g, s), GMA_ERR_INVALID_ARGUMENT, "not a live stream", NULL);
  MESSAGE(gma_sim_launch(g, s, no_op, NULL), GMA_ERR_INVALID_ARGUMENT, "not a live stream",
          NULL);
  MESSAGE(gma_record_stream(g, p, s), GMA_ERR_INVALID_ARGUMENT, "not a live stream", NULL);
  MESSAGE(gma_stream_destroy(g, s), GMA_ERR_INVALID_ARGUMENT, "not a live stream", NULL);
  MESSAGE(gma_stream_wait_stream(g, live, s), GMA_ERR_INVALID_ARGUMENT, "waitee",
          "not a live stream");
  MESSAGE(gma_stream_wait_stream(g, live, live), GMA_ERR_INVALID_ARGUMENT, "same stream", NULL);
  MESSAGE(gma_host_free(g, p), GMA_ERR_INVALID_POINTER, "gma_free", NULL);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_stream_destroy(g, live));
  CHECK_OK(gma_destroy(g));
}

/* A device failure, and a call that quotes it inside its own message. */
static void device_messages(void) {
  gma_t *g = sim_allocator("sim_fail_alloc:1");
  void *p = NULL;
  MESSAGE(gma_alloc(g, 4096, NULL, &p), GMA_ERR_DEVICE, "injected failure", "simulated device");
  CHECK_OK(gma_destroy(g));
  g = sim_allocator("sim_fail_alloc:1");
  size_t sizes[1] = {4096}, counts[1] = {4};
  MESSAGE(gma_reserve(g, NULL, 1, sizes, counts), GMA_ERR_DEVICE, "gma_reserve",
          "nothing was kept");
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  CHECK(unsetenv("GMA_CONF") == 0);
  config_messages();
  stream_messages();
  device_messages();
  printf("test_messages: ok\n");
  return 0;
}
