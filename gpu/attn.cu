/* CUDA kernels of gpu/attn.h: partial attention as one CUDA block per (query, head) running
 * an online softmax over key tiles, and the log-sum-exp merge as one warp per row. */
#include <math.h>

#include "gpu/attn.h"
#include "gpu/common.cuh"

#define S_THREADS   128
#define S_KEY_TILE  64
#define S_MAX_PER_T (KVEDGE_BLOCK_MAX_HEAD_DIM / S_THREADS) /* channels per thread */

__global__ void s_partial_kernel(kvedge_attn_partial_args_t a, uint32_t group)
{
    __shared__ float q_s[KVEDGE_BLOCK_MAX_HEAD_DIM];
    __shared__ float p_s[S_KEY_TILE];
    const uint32_t i = blockIdx.x, h = blockIdx.y, D = a.head_dim, kvh = h / group;
    const int dt = (int)a.dtype;
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x)
        q_s[d] = kvedge_d_load(dt, a.q, ((size_t)h * a.nq + i) * D + d);
    uint32_t lim = a.n;
    if (a.causal) {
        const int64_t l = (int64_t)i + a.causal_offset + 1;
        lim = l <= 0 ? 0 : (l >= (int64_t)a.n ? a.n : (uint32_t)l);
    }
    __syncthreads();
    float acc[S_MAX_PER_T];
    for (int r = 0; r < S_MAX_PER_T; r++)
        acc[r] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const size_t kv0 = (size_t)kvh * a.n;
    for (uint32_t j0 = 0; j0 < lim; j0 += S_KEY_TILE) {
        const uint32_t jt = min((uint32_t)S_KEY_TILE, lim - j0);
        for (uint32_t jj = warp; jj < jt; jj += nwarps) {
            float dot = 0.0f;
            for (uint32_t d = lane; d < D; d += 32)
                dot += q_s[d] * kvedge_d_load(dt, a.k, (kv0 + j0 + jj) * D + d);
            for (int off = 16; off > 0; off /= 2)
                dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (lane == 0)
                p_s[jj] = dot * a.scale;
        }
        __syncthreads();
        float tm = -INFINITY;
        for (uint32_t jj = 0; jj < jt; jj++)
            tm = fmaxf(tm, p_s[jj]);
        const float m_new = fmaxf(m, tm);
        const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
        __syncthreads(); /* every thread has read the raw scores */
        if (threadIdx.x < jt)
            p_s[threadIdx.x] = expf(p_s[threadIdx.x] - m_new);
        __syncthreads();
        float ps = 0.0f;
        for (uint32_t jj = 0; jj < jt; jj++)
            ps += p_s[jj];
        l = l * corr + ps;
        for (int r = 0; r < S_MAX_PER_T; r++) {
            const uint32_t d = threadIdx.x + r * S_THREADS;
            if (d >= D)
                break;
            float x = acc[r] * corr;
            for (uint32_t jj = 0; jj < jt; jj++)
                x += p_s[jj] * kvedge_d_load(dt, a.v, (kv0 + j0 + jj) * D + d);
            acc[r] = x;
        }
        m = m_new;
        __syncthreads(); /* p_s is rewritten by the next tile */
    }
    float *o = a.o + ((size_t)h * a.nq + i) * D;
    const float inv = lim ? 1.0f / l : 0.0f;
    for (int r = 0; r < S_MAX_PER_T; r++) {
        const uint32_t d = threadIdx.x + r * S_THREADS;
        if (d < D)
            o[d] = acc[r] * inv;
    }
    if (threadIdx.x == 0)
        a.lse[(size_t)h * a.nq + i] = lim ? m + logf(l) : -INFINITY;
}

extern "C" int kvedge_gpu_attn_partial(const kvedge_attn_partial_args_t *a, kvedge_gpu_stream_t s)
{
    int rc = kvedge_attn_partial_check(a);
    if (rc != KVEDGE_OK || a->nq == 0)
        return rc;
    if (a->nq > 0x7FFFFFFFu || a->heads > 65535u)
        return KVEDGE_EINVAL;
    const uint32_t kvh = a->kv_heads ? a->kv_heads : a->heads;
    dim3 grid(a->nq, a->heads);
    s_partial_kernel<<<grid, S_THREADS, 0, (cudaStream_t)s>>>(*a, a->heads / kvh);
    return kvedge_gpu_launch_err();
}

/* One warp per row: every lane reads lse1/lse2 before lane 0 writes lse, so lse may alias. */
__global__ void s_merge_kernel(kvedge_attn_merge_args_t a)
{
    const uint32_t warps = blockDim.x / 32;
    const uint32_t r = blockIdx.x * warps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= a.rows)
        return;
    const float l1 = a.lse1[r], l2 = a.lse2[r];
    const float m = fmaxf(l1, l2);
    __syncwarp();
    const size_t base = (size_t)r * a.head_dim;
    if (m == -INFINITY) {
        for (uint32_t c = lane; c < a.head_dim; c += 32)
            a.o[base + c] = 0.0f;
        if (lane == 0)
            a.lse[r] = -INFINITY;
        return;
    }
    const float w1 = expf(l1 - m), w2 = expf(l2 - m), sum = w1 + w2;
    const float a1 = w1 / sum, a2 = w2 / sum;
    for (uint32_t c = lane; c < a.head_dim; c += 32)
        a.o[base + c] = a1 * a.o1[base + c] + a2 * a.o2[base + c];
    if (lane == 0)
        a.lse[r] = m + logf(sum);
}

extern "C" int kvedge_gpu_attn_merge(const kvedge_attn_merge_args_t *a, kvedge_gpu_stream_t s)
{
    int rc = kvedge_attn_merge_check(a);
    if (rc != KVEDGE_OK || a->rows == 0)
        return rc;
    const uint32_t threads = 256, rows_per = threads / 32;
    s_merge_kernel<<<(a->rows + rows_per - 1) / rows_per, threads, 0, (cudaStream_t)s>>>(*a);
    return kvedge_gpu_launch_err();
}
