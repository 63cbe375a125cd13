/* Owns the status table (names and texts generated from GMA_STATUS_MAP) and
 * the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "device/device.h"
#include "gma.h"

/* Written only by the owning thread, read only by it: no synchronization. */
static _Thread_local char last_error[1024];

const char *gma_status_name(gma_status_t status) {
  switch (status) {
#define GMA_STATUS_NAME_(name, value, text) \
  case name:                                \
    return #name;
    GMA_STATUS_MAP(GMA_STATUS_NAME_)
#undef GMA_STATUS_NAME_
  }
  return "GMA_UNKNOWN_STATUS";
}

const char *gma_strerror(gma_status_t status) {
  switch (status) {
#define GMA_STATUS_TEXT_(name, value, text) \
  case name:                                \
    return text;
    GMA_STATUS_MAP(GMA_STATUS_TEXT_)
#undef GMA_STATUS_TEXT_
  }
  return "unknown status: not a value gma returns";
}

const char *gma_last_error(void) { return last_error; }

const char *gma_version(void) { return GMA_VERSION_STRING; }

/* Formats into a scratch buffer first: a message may quote the previous one
 * (gma_last_error() as an argument), which must not be overwritten while it
 * is being read. */
const char *gma__error_detail(const char *msg) {
  const char *colon = strncmp(msg, "GMA_", 4) == 0 ? strstr(msg, ": ") : NULL;
  return colon ? colon + 2 : msg;
}

gma_status_t gma__set_error(gma_status_t status, const char *fmt, ...) {
  char msg[sizeof last_error];
  int n = snprintf(msg, sizeof msg, "%s: ", gma_status_name(status));
  if (n < 0 || (size_t)n >= sizeof msg) return status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof msg);
  return status;
}
