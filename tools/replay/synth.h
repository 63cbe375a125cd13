/* Built-in synthetic workloads for tools/gma-replay, written as gma trace CSV
 * (README: "Traces: the CSV format"): data-parallel training on a compute and
 * a communication stream ("dp"), a 4-stage 1F1B pipeline asking for the next
 * micro-batch's buffers with async allocations ("pipeline"), and an inference
 * server with bursts of requests and idle gaps between them ("server").
 *
 * Pointers in the traces are symbolic (unique, 512-aligned, never reused);
 * streams are 0x0 (the default stream) and small fake handles (0x1000, ...),
 * for which a replayer creates one stream each. Every allocation is freed by
 * the end of the trace. The output depends only on (name, scale, seed). */
#ifndef GMA_SYNTH_H
#define GMA_SYNTH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Names of the built-in workloads, NULL-terminated: "dp", "pipeline", "server". */
extern const char *const gma_synth_names[];

/* One-line description of a workload, or NULL if unknown. Any thread. */
const char *gma_synth_describe(const char *name);

/* Writes the workload `name` as a gma trace CSV (header included) to out.
 * scale multiplies the number of iterations/requests (1.0 = default size:
 * roughly 50k-200k events that replay in well under a second; at least one
 * iteration is always written; 0 < scale <= 1000); seed makes the random parts
 * repeatable (same name, scale and seed: byte-identical output). Returns 0, or
 * -1 with a message in err (unknown name, bad scale, out of memory, write
 * error); err may be NULL. Any thread, on distinct FILEs. */
int gma_synth_write(const char *name, FILE *out, double scale, uint64_t seed, char *err,
                    size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* GMA_SYNTH_H */
