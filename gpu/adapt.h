/* An affine map of row vectors, y = [x, 1] W: how an adapter (clients/e2e/adapter.h) turns a
 * cloud model's K or V, one token's heads concatenated, into the edge model's shape. One sgemm
 * (OpenBLAS on the CPU, cuBLAS on the GPU) after the bias row is broadcast into y. */
#ifndef KVEDGE_GPU_ADAPT_H
#define KVEDGE_GPU_ADAPT_H

#include <stdint.h>

#include "gpu/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tests: CPU against double loops, |diff| <= 1e-4 (1 + |y|) on unit-scale inputs; GPU against
 * CPU the same (both sum in fp32; cuBLAS runs without TF32). */
#define KVEDGE_ADAPT_TOL 1e-4

typedef struct {
    const float *x; /* [tokens][din] row-major */
    const float *w; /* [din + 1][dout] row-major; row din is the bias */
    uint32_t tokens;
    uint32_t din;
    uint32_t dout;
    float *y; /* out: [tokens][dout], y[t] = x[t] W[0..din) + W[din] */
} kvedge_adapt_args_t;

/* Argument checks both paths run first: 0, or KVEDGE_EINVAL (NULL, a zero size, a size or a
 * leading dimension over INT32_MAX, which BLAS cannot take). */
int kvedge_adapt_check(const kvedge_adapt_args_t *a);

/* CPU reference (cblas_sgemm); thread-safe. Errors: those of check. */
int kvedge_cpu_adapt(const kvedge_adapt_args_t *a);

/* x, w and y in device memory; asynchronous on s (a bias kernel, then cublasSgemm). Uses one
 * cuBLAS handle per calling thread and device, made on first use and kept for the thread's
 * life (destroying a handle synchronizes the device). Errors: those of check, the CUDA errors
 * of gpu/gpu.h (KVEDGE_EINVAL in a build without CUDA). */
int kvedge_gpu_adapt(const kvedge_adapt_args_t *a, kvedge_gpu_stream_t s);

#ifdef __cplusplus
}
#endif
#endif
