/* Channel and layer statistics for cache reuse: linear CKA between two activation matrices
 * (layer matching, CE-LSLM Eq. 11-16) and ThinK's query-driven key-channel scores with the
 * top-k keep-mask they select (Eq. 17-18), in the block format's bitmap. */
#ifndef KVEDGE_GPU_CKA_H
#define KVEDGE_GPU_CKA_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tests: CPU (sgemm, float) against double loops, |diff| <= 1e-4 (CKA is in [0, 1]); GPU
 * against CPU the same. ThinK scores: relative 1e-5 CPU, 1e-4 GPU. */
#define KVEDGE_CKA_TOL       1e-4
#define KVEDGE_THINK_TOL_REL 1e-5

typedef struct {
    const float *x; /* [n][d1] row-major */
    const float *y; /* [n][d2] row-major */
    uint32_t n;
    uint32_t d1;
    uint32_t d2;
    /* Out (host memory on both paths): ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F) with
     * columns centered; 0 when either side is constant. */
    double *cka;
} kvedge_cka_args_t;

/* Argument checks both paths run first; 0 or KVEDGE_EINVAL. */
int kvedge_cka_check(const kvedge_cka_args_t *a);

/* 0, KVEDGE_EINVAL (NULL, n < 2 or a zero dimension) or KVEDGE_ENOMEM. Scratch:
 * (n (d1 + d2) + d1^2 + d2^2 + d1 d2) floats. */
int kvedge_cpu_cka(const kvedge_cka_args_t *a);
/* x, y in device memory; cuBLAS sgemm; SYNCHRONOUS: waits for s and writes *a->cka. Creates a
 * cuBLAS handle per call (an offline analysis op). Plus the CUDA errors of gpu/gpu.h. */
int kvedge_gpu_cka(const kvedge_cka_args_t *a, kvedge_gpu_stream_t s);

typedef struct {
    const float *q; /* [heads][nq][head_dim]: the observation window's queries */
    const float *k; /* [heads][n][head_dim] */
    uint32_t heads;
    uint32_t nq;
    uint32_t n;
    uint32_t head_dim;
    float *scores; /* [heads][head_dim]: ||Q[:,c]||_2 * ||K[:,c]||_2, the Frobenius norm of the
                      channel's rank-1 contribution Q[:,c] K[:,c]^T */
} kvedge_think_args_t;

int kvedge_think_check(const kvedge_think_args_t *a);

/* 0 or KVEDGE_EINVAL (NULL, zero heads or head_dim, head_dim > 1024). nq or n 0: scores 0. */
int kvedge_cpu_think_scores(const kvedge_think_args_t *a);
/* Device pointers, asynchronous on s; plus the CUDA errors of gpu/gpu.h. */
int kvedge_gpu_think_scores(const kvedge_think_args_t *a, kvedge_gpu_stream_t s);

/* The `keep` channels of highest score (ties: lower channel first; NaN ranks lowest) as a
 * head_dim-bit LSB-first bitmap in mask[0 .. (head_dim + 7) / 8), padding bits zero, ready
 * for kvedge_block_spec_t.key_mask. Returns 0, KVEDGE_EINVAL (NULL, keep == 0, keep >
 * head_dim, head_dim > 1024) or KVEDGE_ENOSPACE (mask_cap too small), writing nothing then. */
int kvedge_think_keep_mask(const float *scores, uint32_t head_dim, uint32_t keep, uint8_t *mask,
                           size_t mask_cap);

#ifdef __cplusplus
}
#endif
#endif
