/* Representational similarity analysis (CE-LSLM Eq. 14-15) between two activation matrices
 * over the same n samples: the Pearson correlation of the strict lower triangles of their
 * cosine-similarity matrices. Beside gpu/cka.h, the other score of layer matching
 * (clients/e2e/layermap.h). Both paths spend n^2 (d1 + d2) flops in sgemm (OpenBLAS, cuBLAS) and
 * reduce the triangles in double. */
#ifndef KVEDGE_GPU_RSA_H
#define KVEDGE_GPU_RSA_H

#include <stdint.h>

#include "gpu/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tests: CPU (sgemm, float) against double loops, |diff| <= 1e-4 (RSA is in [-1, 1]); GPU
 * against CPU the same. */
#define KVEDGE_RSA_TOL 1e-4

typedef struct {
    const float *x; /* [n][d1] row-major: one sample a row */
    const float *y; /* [n][d2] row-major, the same samples */
    uint32_t n;
    uint32_t d1;
    uint32_t d2;
    /* Out: Pearson(lower(Sx), lower(Sy)) where S[i][j] = cos(row i, row j) and lower() the
     * n (n - 1) / 2 entries i > j in row-major order. A zero row has cosine 0 with every row;
     * 0 when either triangle is constant (n == 2 included). */
    double *rsa;
} kvedge_rsa_args_t;

/* Argument checks; 0 or KVEDGE_EINVAL (NULL, n < 2 or a zero dimension). */
int kvedge_rsa_check(const kvedge_rsa_args_t *a);

/* 0, KVEDGE_EINVAL (those of kvedge_rsa_check, n over KVEDGE_RSA_MAX_SAMPLES) or
 * KVEDGE_ENOMEM. Scratch: n (d1 + d2) + 2 n^2 floats. */
int kvedge_cpu_rsa(const kvedge_rsa_args_t *a);

/* x, y in device memory; cuBLAS sgemm; SYNCHRONOUS: waits for s and writes *a->rsa (host
 * memory). Creates a cuBLAS handle per call (an offline analysis op). Errors: as
 * kvedge_cpu_rsa, plus the CUDA errors of gpu/gpu.h; without a device KVEDGE_EINVAL. Device
 * scratch: n (d1 + d2) + 2 n^2 floats. */
int kvedge_gpu_rsa(const kvedge_rsa_args_t *a, kvedge_gpu_stream_t s);

/* Most samples kvedge_cpu_rsa takes: its two n x n matrices stay under 2 GiB. */
#define KVEDGE_RSA_MAX_SAMPLES 16384u

#ifdef __cplusplus
}
#endif
#endif
