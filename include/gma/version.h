/* gma version numbers. Included by gma.h; kept apart so build scripts can read
 * the version without parsing the whole API. */
#ifndef GMA_VERSION_H
#define GMA_VERSION_H

#define GMA_VERSION_MAJOR 0
#define GMA_VERSION_MINOR 1
#define GMA_VERSION_PATCH 0
#define GMA_VERSION_STRING "0.1.0"

/* One integer that grows with every release: major*10000 + minor*100 + patch. */
#define GMA_VERSION_NUMBER \
  (GMA_VERSION_MAJOR * 10000 + GMA_VERSION_MINOR * 100 + GMA_VERSION_PATCH)

#endif /* GMA_VERSION_H */
