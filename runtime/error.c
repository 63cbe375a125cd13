/* Owns the status table (names and texts generated from GMA_STATUS_MAP) and
 * the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>

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

gma_status_t gma__set_error(gma_status_t status, const char *fmt, ...) {
  int n = snprintf(last_error, sizeof last_error, "%s: ", gma_status_name(status));
  if (n < 0 || (size_t)n >= sizeof last_error) return status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
  va_end(ap);
  return status;
}
