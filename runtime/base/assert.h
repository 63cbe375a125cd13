/* GMA__ASSERT: the cheap assertions of debug builds (GMA_DEBUG >= 1). */
#ifndef GMA_BASE_ASSERT_H
#define GMA_BASE_ASSERT_H

#if GMA_DEBUG >= 1
#include <stdio.h>
#include <stdlib.h>
#define GMA__ASSERT(cond)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "gma: assertion failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                         \
    }                                                                                  \
  } while (0)
#else
#define GMA__ASSERT(cond) ((void)0)
#endif


#endif /* GMA_BASE_ASSERT_H */
