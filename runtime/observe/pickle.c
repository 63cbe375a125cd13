/* Owns the pickle writer (pickle.h): protocol 2 opcodes, written directly. */
#include "observe/pickle.h"

#include <errno.h>
#include <string.h>

/* The opcodes used (Python's Lib/pickletools.py documents each). */
enum {
  OP_PROTO = 0x80,
  OP_STOP = '.',
  OP_NONE = 'N',
  OP_NEWTRUE = 0x88,
  OP_NEWFALSE = 0x89,
  OP_BININT1 = 'K', /* 1-byte unsigned */
  OP_BININT2 = 'M', /* 2-byte unsigned, little-endian */
  OP_BININT = 'J',  /* 4-byte signed, little-endian */
  OP_LONG1 = 0x8a,  /* 1-byte length, then little-endian two's complement */
  OP_BINFLOAT = 'G', /* 8-byte IEEE double, big-endian */
  OP_BINUNICODE = 'X', /* 4-byte length, then UTF-8 */
  OP_MARK = '(',
  OP_EMPTY_DICT = '}',
  OP_SETITEMS = 'u',
  OP_EMPTY_LIST = ']',
  OP_APPENDS = 'e',
  OP_TUPLE = 't',
};

static void put(gma__pk_t *w, const void *p, size_t n) {
  if (w->err) return;
  if (fwrite(p, 1, n, w->f) != n) w->err = errno ? errno : EIO;
}

static void op(gma__pk_t *w, int code) {
  unsigned char c = (unsigned char)code;
  put(w, &c, 1);
}

void gma__pk_begin(gma__pk_t *w, FILE *f) {
  w->f = f;
  w->err = 0;
  unsigned char h[2] = {OP_PROTO, 2};
  put(w, h, 2);
}

int gma__pk_finish(gma__pk_t *w) {
  op(w, OP_STOP);
  if (!w->err && fflush(w->f) != 0) w->err = errno ? errno : EIO;
  return w->err;
}

void gma__pk_none(gma__pk_t *w) { op(w, OP_NONE); }
void gma__pk_bool(gma__pk_t *w, bool v) { op(w, v ? OP_NEWTRUE : OP_NEWFALSE); }

/* v as LONG1: the fewest little-endian bytes whose two's complement is v
 * (sign taken from negative; magnitude bits from v's 64 bits). */
static void long1(gma__pk_t *w, uint64_t bits, bool negative) {
  unsigned char b[11];
  int n = 0;
  uint64_t x = bits;
  for (int i = 0; i < 8; i++) b[2 + i] = (unsigned char)(x >> (8 * i));
  n = 8;
  /* Trim bytes that only repeat the sign. */
  while (n > 1) {
    unsigned char top = b[2 + n - 1], next = b[2 + n - 2];
    if (!negative && top == 0 && !(next & 0x80)) n--;
    else if (negative && top == 0xff && (next & 0x80)) n--;
    else break;
  }
  if (!negative && (b[2 + n - 1] & 0x80)) b[2 + n++] = 0; /* a positive value needs a 0 on top */
  b[0] = OP_LONG1;
  b[1] = (unsigned char)n;
  put(w, b, (size_t)n + 2);
}

void gma__pk_int(gma__pk_t *w, int64_t v) {
  if (v >= 0) {
    gma__pk_uint(w, (uint64_t)v);
  } else if (v >= INT32_MIN) {
    uint32_t u = (uint32_t)(int32_t)v;
    unsigned char b[5] = {OP_BININT, (unsigned char)u, (unsigned char)(u >> 8),
                          (unsigned char)(u >> 16), (unsigned char)(u >> 24)};
    put(w, b, 5);
  } else {
    long1(w, (uint64_t)v, true);
  }
}

void gma__pk_uint(gma__pk_t *w, uint64_t v) {
  if (v < 0x100) {
    unsigned char b[2] = {OP_BININT1, (unsigned char)v};
    put(w, b, 2);
  } else if (v < 0x10000) {
    unsigned char b[3] = {OP_BININT2, (unsigned char)v, (unsigned char)(v >> 8)};
    put(w, b, 3);
  } else if (v <= INT32_MAX) {
    unsigned char b[5] = {OP_BININT, (unsigned char)v, (unsigned char)(v >> 8),
                          (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    put(w, b, 5);
  } else {
    long1(w, v, false);
  }
}

void gma__pk_float(gma__pk_t *w, double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  unsigned char b[9];
  b[0] = OP_BINFLOAT;
  for (int i = 0; i < 8; i++) b[1 + i] = (unsigned char)(bits >> (8 * (7 - i)));
  put(w, b, 9);
}

void gma__pk_strn(gma__pk_t *w, const char *s, size_t n) {
  uint32_t len = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
  unsigned char b[5] = {OP_BINUNICODE, (unsigned char)len, (unsigned char)(len >> 8),
                        (unsigned char)(len >> 16), (unsigned char)(len >> 24)};
  put(w, b, 5);
  put(w, s, len);
}

void gma__pk_str(gma__pk_t *w, const char *s) { gma__pk_strn(w, s, strlen(s)); }

void gma__pk_dict_begin(gma__pk_t *w) {
  op(w, OP_EMPTY_DICT);
  op(w, OP_MARK);
}
void gma__pk_dict_end(gma__pk_t *w) { op(w, OP_SETITEMS); }
void gma__pk_list_begin(gma__pk_t *w) {
  op(w, OP_EMPTY_LIST);
  op(w, OP_MARK);
}
void gma__pk_list_end(gma__pk_t *w) { op(w, OP_APPENDS); }
void gma__pk_tuple_begin(gma__pk_t *w) { op(w, OP_MARK); }
void gma__pk_tuple_end(gma__pk_t *w) { op(w, OP_TUPLE); }
