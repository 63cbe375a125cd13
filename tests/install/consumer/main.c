/* A program that uses an installed gma, built by tests/install/test_install.sh
 * through find_package(gma CONFIG) and through pkg-config. Prints "ok" last
 * when every call succeeded. */
#include <gma.h>
#include <stdio.h>
#include <string.h>

static int check(gma_status_t s, const char *what) {
  if (s != GMA_OK) {
    fprintf(stderr, "%s: %s (%s)\n", what, gma_status_name(s), gma_last_error());
    return 1;
  }
  return 0;
}

int main(void) {
  /* The header the consumer compiled against and the library it runs with
   * must be the same release. */
  if (strcmp(gma_version(), GMA_VERSION_STRING) != 0) {
    fprintf(stderr, "gma.h says %s but the library says %s\n", GMA_VERSION_STRING, gma_version());
    return 1;
  }
  gma_config_t config = GMA_CONFIG_INIT;
  config.ignore_env = 1;
  if (check(gma_config_parse(&config, "device:sim,sim_capacity:64M"), "gma_config_parse")) return 1;
  gma_t *g = NULL;
  if (check(gma_create(&config, &g), "gma_create")) return 1;
  void *p = NULL;
  if (check(gma_alloc(g, 1 << 20, NULL, &p), "gma_alloc")) return 1;
  memset(p, 0xab, 1 << 20); /* simulated device memory is host memory */
  if (check(gma_free(g, p), "gma_free")) return 1;
  printf("gma %s on %s\n", gma_version(), gma_device_name(g));
  if (check(gma_destroy(g), "gma_destroy")) return 1;
  printf("ok\n");
  return 0;
}
