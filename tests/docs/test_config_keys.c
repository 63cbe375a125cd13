/* The configuration reference (docs/config.md) and the parser agree: every
 * key gma_config_parse accepts (gma__config_keys) has a row in the first
 * table of the page's "## Keys" section, and every key of that table is
 * accepted by gma_config_parse (asked with "key:value"; an unknown key is the
 * one error it must not give). A key added to one and not the other, or
 * renamed in one, fails this test with the key named.
 *
 * Usage: test_config_keys docs/config.md            the check
 *        test_config_keys --planted docs/config.md  the check must fail on
 *            copies of the table with each row deleted in turn, with a row for
 *            a key the parser does not have, with a row twice, and against a
 *            parser that lacks one of its keys (a test that cannot fail
 *            proves nothing) */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "base/config.h"

#define MAX_KEYS 128

typedef struct table {
  char key[MAX_KEYS][64];
  size_t n;
} table_t;

/* The keys of the first table in the "## Keys" section: the first
 * `backticked` word of each row starting "| `". skip: a row to leave out
 * (its index among the rows), as if it were deleted; -1 for none. */
static table_t page_keys(const char *text, long skip) {
  table_t t = {.n = 0};
  const char *sec = strstr(text, "\n## Keys\n");
  CHECK(sec != NULL);
  sec += 1;
  const char *end = strstr(sec + 3, "\n## ");
  if (!end) end = sec + strlen(sec);
  long row = 0;
  bool in_table = false;
  for (const char *line = sec; line < end;) {
    const char *nl = memchr(line, '\n', (size_t)(end - line));
    size_t len = nl ? (size_t)(nl - line) : (size_t)(end - line);
    if (len > 3 && strncmp(line, "| `", 3) == 0) {
      in_table = true;
      const char *k = line + 3, *q = memchr(k, '`', len - 3);
      CHECK(q && (size_t)(q - k) < sizeof t.key[0]);
      if (row++ != skip) {
        CHECK(t.n < MAX_KEYS);
        memcpy(t.key[t.n], k, (size_t)(q - k));
        t.key[t.n][q - k] = '\0';
        t.n++;
      }
    } else if (in_table && (len == 0 || line[0] != '|')) {
      break; /* the end of the first table */
    }
    line += len + 1;
  }
  return t;
}

static bool parser_accepts(const char *key) {
  char text[128];
  snprintf(text, sizeof text, "%s:0", key);
  gma_config_t c = GMA_CONFIG_INIT;
  gma_status_t st = gma_config_parse(&c, text);
  return st == GMA_OK || !strstr(gma_last_error(), "unknown key");
}

/* The check: 0 when the two agree, else the number of disagreements (each
 * printed when loud). parser: the parser's keys (n of them). */
static int check(const table_t *t, const char *const *parser, size_t n, bool loud) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    bool found = false;
    for (size_t j = 0; j < t->n && !found; j++) found = strcmp(parser[i], t->key[j]) == 0;
    if (!found) {
      bad++;
      if (loud) printf("  gma_config_parse accepts '%s', which docs/config.md's table lacks\n", parser[i]);
    }
  }
  for (size_t j = 0; j < t->n; j++) {
    bool listed = false;
    for (size_t i = 0; i < n && !listed; i++) listed = strcmp(parser[i], t->key[j]) == 0;
    if (!listed || !parser_accepts(t->key[j])) {
      bad++;
      if (loud) printf("  docs/config.md's table has '%s', which gma_config_parse does not accept\n", t->key[j]);
    }
    for (size_t k = j + 1; k < t->n; k++)
      if (strcmp(t->key[j], t->key[k]) == 0) {
        bad++;
        if (loud) printf("  docs/config.md's table has '%s' twice\n", t->key[j]);
      }
  }
  return bad;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)size + 1);
  CHECK(buf && fread(buf, 1, (size_t)size, f) == (size_t)size);
  buf[size] = '\0';
  fclose(f);
  return buf;
}

int main(int argc, char **argv) {
  bool planted = argc == 3 && strcmp(argv[1], "--planted") == 0;
  if (argc != 2 && !planted) {
    fprintf(stderr, "usage: %s [--planted] docs/config.md\n", argv[0]);
    return 2;
  }
  char *text = slurp(argv[argc - 1]);
  const char *parser[MAX_KEYS];
  size_t n = gma__config_keys(parser, MAX_KEYS);
  CHECK(n > 0 && n <= MAX_KEYS);
  table_t t = page_keys(text, -1);
  if (!planted) {
    int bad = check(&t, parser, n, true);
    printf("%zu keys in gma_config_parse, %zu rows in docs/config.md's table: %s\n", n,
           t.n, bad ? "they disagree" : "they agree");
    free(text);
    return bad ? 1 : 0;
  }
  /* The planted variants: each must be caught. */
  CHECK(check(&t, parser, n, false) == 0); /* the real pair agrees */
  for (long row = 0; row < (long)t.n; row++) {
    table_t less = page_keys(text, row);
    CHECK(less.n == t.n - 1);
    if (check(&less, parser, n, false) == 0) {
      fprintf(stderr, "the check passed with docs/config.md's row for '%s' deleted\n", t.key[row]);
      return 1;
    }
  }
  table_t more = t;
  snprintf(more.key[more.n++], sizeof more.key[0], "no_such_key");
  CHECK(check(&more, parser, n, false) == 1);
  table_t twice = t;
  snprintf(twice.key[twice.n++], sizeof twice.key[0], "%s", t.key[0]);
  CHECK(check(&twice, parser, n, false) == 1);
  for (size_t drop = 0; drop < n; drop++) { /* a parser without one of its keys */
    const char *fewer[MAX_KEYS];
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      if (i != drop) fewer[m++] = parser[i];
    CHECK(check(&t, fewer, m, false) == 1);
  }
  printf("planted: the check failed with each of the %zu rows deleted, with a row for an unknown "
         "key, with a row twice, and with each of the parser's %zu keys missing\n", t.n, n);
  free(text);
  return 0;
}
