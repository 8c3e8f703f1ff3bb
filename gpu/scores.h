/* Attention scores against channel-pruned keys without widening them: the kept channels of q
 * dot the compact key rows, which equals q . k_expanded since dropped channels are zero. */
#ifndef KVEDGE_GPU_SCORES_H
#define KVEDGE_GPU_SCORES_H

#include <stdint.h>

#include "gpu/gpu.h"
#include "access/codec/block.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GPU against CPU (different summation order): |diff| <= this * scale * sum_c |q_c k_c|. */
#define KVEDGE_SCORES_GPU_TOL_REL 1e-5

typedef struct {
    const float *q; /* [nq][head_dim] fp32, full width */
    kvedge_dtype_t k_dtype;
    const void *k; /* [tokens][key_channels] compact keys in k_dtype */
    uint32_t nq;
    uint32_t tokens;
    uint32_t head_dim;
    uint32_t key_channels;
    /* Kept channels, head_dim bits LSB-first (HOST memory on both paths); NULL = all kept. */
    const uint8_t *key_mask;
    float scale;
    float *scores; /* [nq][tokens] fp32: scale * sum over kept c of q[c] * k[t][j(c)] */
} kvedge_scores_args_t;

/* The argument check both paths run first; 0 or KVEDGE_EINVAL. */
int kvedge_scores_check(const kvedge_scores_args_t *a);

/* Returns 0, KVEDGE_EINVAL (NULL, zero or oversized head_dim, popcount(mask) != key_channels,
 * mask bits past head_dim, unknown dtype) or KVEDGE_ENOMEM. */
int kvedge_cpu_masked_scores(const kvedge_scores_args_t *a);
/* Device q, k and scores; asynchronous on s; plus the CUDA errors of gpu/gpu.h. */
int kvedge_gpu_masked_scores(const kvedge_scores_args_t *a, kvedge_gpu_stream_t s);

#ifdef __cplusplus
}
#endif
#endif
