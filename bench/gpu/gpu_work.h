/* The GPU work gma-bench-gpu queues between allocations, behind C calls:
 * the kernels live in gpu_work.cu, which nvcc compiles (bench/gpu/
 * CMakeLists.txt), so the benchmark itself stays C like the others. Every
 * call returns a cudaError_t (cudaSuccess = 0) and only queues work: none
 * waits for the device. */
#ifndef GMA_BENCH_GPU_WORK_H
#define GMA_BENCH_GPU_WORK_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes between two touched bytes: a buffer of n bytes gets ceil(n / 256)
 * writes, so every buffer is written on the device without the kernel's
 * cost growing like a memset of the whole buffer. torch_bench.py touches
 * its tensors with the same stride (x[::256].fill_(1)). */
#define GMA_BENCH_TOUCH_STRIDE 256

/* Queues on s a kernel that writes one byte every GMA_BENCH_TOUCH_STRIDE
 * bytes of [p, p + bytes): the buffer is in use on s until it ran. */
int gma_bench_touch(void *p, size_t bytes, cudaStream_t s);

/* Queues on s a one-thread kernel that spins on the GPU's global timer for
 * ns nanoseconds: s (and whatever waits on it) stays busy that long. */
int gma_bench_spin(uint64_t ns, cudaStream_t s);

/* The architectures gpu_work.cu was compiled for, e.g. "-arch=all-major". */
const char *gma_bench_work_archs(void);

#ifdef __cplusplus
}
#endif

#endif /* GMA_BENCH_GPU_WORK_H */
