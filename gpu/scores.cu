/* CUDA kernel of gpu/scores.h: the block gathers q's kept channels into shared memory, then
 * one warp per key token dots them with the compact key row (coalesced along the row). */
#include <string.h>

#include "gpu/common.cuh"
#include "gpu/scores.h"

#define S_WARPS 4

typedef struct {
    uint64_t w[KVEDGE_BLOCK_MAX_HEAD_DIM / 64];
    uint32_t rank[KVEDGE_BLOCK_MAX_HEAD_DIM / 64];
    int masked;
} s_mask_t;

__global__ void s_scores_kernel(kvedge_scores_args_t a, s_mask_t mk)
{
    __shared__ float qc[KVEDGE_BLOCK_MAX_HEAD_DIM];
    const uint32_t i = blockIdx.y, D = a.head_dim, kc = a.key_channels;
    for (uint32_t c = threadIdx.x; c < D; c += blockDim.x) {
        const float x = a.q[(size_t)i * D + c];
        if (!mk.masked) {
            qc[c] = x;
        } else if ((mk.w[c >> 6] >> (c & 63)) & 1u) {
            qc[mk.rank[c >> 6] + __popcll(mk.w[c >> 6] & ((1ull << (c & 63)) - 1ull))] = x;
        }
    }
    __syncthreads();
    const uint32_t t = blockIdx.x * S_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t >= a.tokens)
        return;
    float dot = 0.0f;
    for (uint32_t j = lane; j < kc; j += 32)
        dot += qc[j] * kvedge_d_load((int)a.k_dtype, a.k, (size_t)t * kc + j);
    for (int off = 16; off > 0; off /= 2)
        dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (lane == 0)
        a.scores[(size_t)i * a.tokens + t] = dot * a.scale;
}

extern "C" int kvedge_gpu_masked_scores(const kvedge_scores_args_t *a, kvedge_gpu_stream_t s)
{
    int rc = kvedge_scores_check(a);
    if (rc != KVEDGE_OK || a->nq == 0 || a->tokens == 0)
        return rc;
    if (a->nq > 65535u)
        return KVEDGE_EINVAL;
    s_mask_t mk;
    memset(&mk, 0, sizeof mk);
    mk.masked = a->key_mask != NULL;
    uint32_t kept = 0;
    for (uint32_t w = 0; mk.masked && w < (a->head_dim + 63) / 64; w++) {
        for (uint32_t b = 0; b < 8 && w * 8 + b < (a->head_dim + 7) / 8; b++)
            mk.w[w] |= (uint64_t)a->key_mask[w * 8 + b] << (8 * b);
        mk.rank[w] = kept;
        kept += (uint32_t)__builtin_popcountll(mk.w[w]);
    }
    dim3 grid((a->tokens + S_WARPS - 1) / S_WARPS, a->nq);
    s_scores_kernel<<<grid, S_WARPS * 32, 0, (cudaStream_t)s>>>(*a, mk);
    return kvedge_gpu_launch_err();
}
