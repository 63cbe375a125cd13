/* Owns the status table (names and texts generated from GMA_STATUS_MAP) and
 * the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "gma.h"

/* Written only by the owning thread, read only by it: no synchronization.
 * kept_error: the message gma__error_keep's caller may restore; err_gen
 * counts messages set; keep_gen: err_gen when the keep began (or ~0u: none). */
static _Thread_local char last_error[1024], kept_error[1024];
static _Thread_local unsigned err_gen, keep_gen = ~0u;

unsigned gma__error_keep(void) {
  if (keep_gen != ~0u) return ~0u; /* inside a kept call: the outer one decides */
  keep_gen = err_gen;
  return err_gen;
}

void gma__error_done(unsigned kept, gma_status_t st) {
  if (kept == ~0u) return;
  if (st == GMA_OK && err_gen != kept) {
    memcpy(last_error, kept_error, sizeof last_error);
    err_gen = kept;
  }
  keep_gen = ~0u;
}

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

/* The length of a leading "GMA_...: " status name in msg (0 if none): only
 * names of the status map count, so a message that merely starts with "GMA_"
 * (a GMA_CONF quote) keeps its text. */
static size_t status_prefix_len(const char *msg) {
  if (strncmp(msg, "GMA_", 4) != 0) return 0;
#define GMA_STATUS_PREFIX_(name, value, text)                                  \
  if (strncmp(msg, #name ": ", sizeof #name + 1) == 0) return sizeof #name + 1;
  GMA_STATUS_MAP(GMA_STATUS_PREFIX_)
#undef GMA_STATUS_PREFIX_
  return 0;
}

const char *gma__error_detail(const char *msg) { return msg + status_prefix_len(msg); }

/* Formats into a scratch buffer first: a message may quote the previous one
 * (gma_last_error() as an argument), which must not be overwritten while it
 * is being read. A message is "STATUS_NAME: what happened", with one status
 * name: a quoted message should be passed through gma__error_detail, and a
 * whole message passed on as it is ("%s", gma_last_error()) does not get a
 * second name in front. */
gma_status_t gma__set_error(gma_status_t status, const char *fmt, ...) {
  char body[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  char msg[sizeof last_error];
  const char *name = gma_status_name(status);
  int room = (int)sizeof msg - (int)strlen(name) - 3; /* ": " and the terminator */
  snprintf(msg, sizeof msg, "%s: %.*s", name, room > 0 ? room : 0, gma__error_detail(body));
  if (err_gen == keep_gen) memcpy(kept_error, last_error, sizeof last_error);
  if (++err_gen == ~0u) err_gen = 0; /* ~0u: keep_gen's "none" */
  memcpy(last_error, msg, sizeof msg);
  return status;
}

gma_status_t gma__struct_size_check(size_t size, size_t ours, const char *fn, const char *arg,
                                    const char *init) {
  if (size >= sizeof(size_t) && size <= ours) return GMA_OK;
  if (size < sizeof(size_t))
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s: %s->size is %zu, smaller than the size field itself (%zu bytes): "
                          "no gma.h has such a struct; initialize it with %s",
                          fn, arg, size, sizeof(size_t), init);
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "%s: %s->size is %zu, larger than this library's struct (%zu bytes): the "
                        "program was built against a newer gma.h than the libgma it runs with; "
                        "initialize it with %s and build against this libgma's gma.h",
                        fn, arg, size, ours, init);
}
