/* A small streaming writer of Python pickles (protocol 2), for the data a
 * memory snapshot holds: dicts, lists, tuples, strings, integers of any
 * 64-bit value, floats, None and bools. It writes no memo (nothing is
 * shared) and names no global, so Python's pickle.load, or an unpickler that
 * refuses every global, reads it back as plain builtins.
 *
 * Containers are written as they are filled: gma__pk_dict_begin ... keys and
 * values in turn ... gma__pk_dict_end. Errors are sticky: after a failed
 * write every call does nothing and gma__pk_finish reports the first
 * errno. */
#ifndef GMA_OBSERVE_PICKLE_H
#define GMA_OBSERVE_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct gma__pk {
  FILE *f;
  int err; /* errno of the first failed write; 0 while all went well */
} gma__pk_t;

/* Writes the protocol header. */
void gma__pk_begin(gma__pk_t *w, FILE *f);
/* Writes STOP (the end of the one top-level object) and flushes; 0 or the
 * first errno. Does not close f. */
int gma__pk_finish(gma__pk_t *w);

void gma__pk_none(gma__pk_t *w);
void gma__pk_bool(gma__pk_t *w, bool v);
void gma__pk_int(gma__pk_t *w, int64_t v);
void gma__pk_uint(gma__pk_t *w, uint64_t v);
void gma__pk_float(gma__pk_t *w, double v);
void gma__pk_str(gma__pk_t *w, const char *s); /* UTF-8 */
void gma__pk_strn(gma__pk_t *w, const char *s, size_t n);

void gma__pk_dict_begin(gma__pk_t *w);
void gma__pk_dict_end(gma__pk_t *w);
void gma__pk_list_begin(gma__pk_t *w);
void gma__pk_list_end(gma__pk_t *w);
/* A tuple of the values written between the two calls. */
void gma__pk_tuple_begin(gma__pk_t *w);
void gma__pk_tuple_end(gma__pk_t *w);

/* A key and a value in a dict, in one call. */
static inline void gma__pk_kv_uint(gma__pk_t *w, const char *k, uint64_t v) {
  gma__pk_str(w, k);
  gma__pk_uint(w, v);
}
static inline void gma__pk_kv_int(gma__pk_t *w, const char *k, int64_t v) {
  gma__pk_str(w, k);
  gma__pk_int(w, v);
}
static inline void gma__pk_kv_str(gma__pk_t *w, const char *k, const char *v) {
  gma__pk_str(w, k);
  gma__pk_str(w, v);
}

#endif /* GMA_OBSERVE_PICKLE_H */
