/* Attention over one part of the keys, returning the output and its log-sum-exp, and the
 * exact merge of two such partials (EdgePrompt's O = a_cloud A_cloud + a_edge A_edge with
 * a_i = exp(lse_i - lse), as RelayAttention does): attention over a cached context and over
 * the local prompt, computed apart, merge into attention over their concatenation. */
#ifndef KVEDGE_GPU_ATTN_H
#define KVEDGE_GPU_ATTN_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/gpu.h"
#include "access/codec/block.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tolerance of the tests (docs/gpu.md): merge(partial(A), partial(B)) against attention over
 * A ++ B computed in double, and GPU against CPU: max abs error <= this * max |V|. */
#define KVEDGE_ATTN_TOL_REL     1e-5
#define KVEDGE_ATTN_GPU_TOL_REL 1e-4

typedef struct {
    kvedge_dtype_t dtype; /* of q, k and v: fp32, fp16 or bf16 */
    const void *q;        /* [heads][nq][head_dim] */
    const void *k;        /* [kv_heads][n][head_dim] */
    const void *v;        /* [kv_heads][n][head_dim] */
    uint32_t heads;       /* query heads */
    uint32_t kv_heads;    /* divides heads (grouped-query attention); 0 means = heads */
    uint32_t nq;
    uint32_t n; /* keys; 0 gives an empty partial: o = 0, lse = -inf */
    uint32_t head_dim;
    float scale; /* softmax scale, usually 1/sqrt(head_dim) */
    /* Causal: query i sees keys j <= i + causal_offset (for the local prompt: 0). A query that
     * sees no key gets o = 0, lse = -inf. */
    bool causal;
    int64_t causal_offset;
    float *o;   /* [heads][nq][head_dim] fp32 */
    float *lse; /* [heads][nq] fp32, natural log of sum exp(scale * q.k) */
} kvedge_attn_partial_args_t;

/* (o1, lse1) and (o2, lse2) -> (o, lse): lse = logaddexp(lse1, lse2), o = sum exp(lse_i - lse)
 * o_i; a side with lse = -inf contributes nothing; both -inf gives o = 0, lse = -inf. o/lse may
 * alias o1/lse1 or o2/lse2. */
typedef struct {
    const float *o1, *lse1;
    const float *o2, *lse2;
    float *o, *lse;
    uint32_t rows; /* heads * nq */
    uint32_t head_dim;
} kvedge_attn_merge_args_t;

/* Argument checks both paths run first; 0 or KVEDGE_EINVAL. */
int kvedge_attn_partial_check(const kvedge_attn_partial_args_t *a);
int kvedge_attn_merge_check(const kvedge_attn_merge_args_t *a);

/* Both return 0, KVEDGE_EINVAL (NULL pointer, zero head_dim/heads, heads not a multiple of
 * kv_heads, unknown dtype, non-finite scale) or KVEDGE_ENOMEM (CPU scratch). */
int kvedge_cpu_attn_partial(const kvedge_attn_partial_args_t *a);
int kvedge_cpu_attn_merge(const kvedge_attn_merge_args_t *a);

/* Device pointers, asynchronous on s; plus the CUDA errors of gpu/gpu.h. The partial kernel is
 * a plain one-block-per-query online softmax (decode-sized nq), not a tuned flash kernel. */
int kvedge_gpu_attn_partial(const kvedge_attn_partial_args_t *a, kvedge_gpu_stream_t s);
int kvedge_gpu_attn_merge(const kvedge_attn_merge_args_t *a, kvedge_gpu_stream_t s);

#ifdef __cplusplus
}
#endif
#endif
