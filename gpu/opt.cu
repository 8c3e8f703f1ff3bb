/* The GPU OPT decoder of gpu/opt.h: weights in one device arena, cuBLAS GEMMs with fp32 outputs
 * and fp32 compute, and simple grid-stride kernels for everything between them. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "gpu/blas.cuh"
#include "gpu/common.cuh"
#include "gpu/opt.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"

#define S_THREADS 256
/* Attention scores held at once (fp32, plus as many probabilities in dtype): queries are taken
 * in chunks of rows so that heads * rows * keys stays under this (one row at least). */
#define S_SCORE_ELEMS (32u << 20)
#define S_ALIGN_BYTES 256
#define S_LN_EPS      1e-5f
/* Host staging for the fp16/bf16 conversion of weights: elements per chunk. */
#define S_STAGE_ELEMS (1u << 20)

typedef struct {
    void *wqkv;  /* [3 hidden][hidden] dtype: q, k, v rows stacked */
    float *bqkv; /* [3 hidden] */
    void *wo;    /* [hidden][hidden] dtype */
    float *bo;   /* [hidden] */
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    void *fc1, *fc2; /* [ffn][hidden], [hidden][ffn] dtype */
    float *fc1_b, *fc2_b;
} s_layer_t;

/* Scratch of one session: grown on demand, kept. */
typedef struct {
    void *buf;     /* one device allocation */
    size_t bytes;  /* its size */
    void *ln;      /* [n][hidden] dtype: LayerNorm output, GEMM input */
    float *qkv;    /* [n][3 hidden] fp32: projections */
    void *q;       /* [n][hidden] dtype: scaled queries */
    void *attn;    /* [n][hidden] dtype */
    float *tmp;    /* [n][hidden] fp32: out_proj / fc2 outputs */
    float *f32;    /* [n][ffn] fp32: fc1 output */
    void *act;     /* [n][ffn] dtype: ReLU output */
    float *logits; /* [vocab] fp32 */
} s_work_t;

struct kvedge_gpu_opt_session_s {
    kvedge_gpu_opt_t *model; /* not owned */
    cudaStream_t stream;     /* owned */
    cublasHandle_t blas;     /* owned, bound to stream */
    s_work_t work;
    float *logits_host; /* [vocab] pinned: last logits */
    bool ready;         /* a begin succeeded, nothing failed since */
    /* Context */
    uint32_t ctx_len;
    const void **ctx_k, **ctx_v; /* [layers] device K/V in use per layer */
    size_t *ctx_stride;          /* [layers] rows per head of ctx_k/ctx_v */
    void **own_k, **own_v;       /* [layers] session-owned K/V of missed layers */
    size_t *own_bytes;           /* [layers] bytes of each of own_k[l], own_v[l] */
    void *tmp_k, *tmp_v;         /* one layer's K/V of a fetched layer rerun */
    size_t tmp_bytes;
    float *ctx_h; /* [ctx_len][hidden] fp32 context hidden state */
    size_t ctx_h_bytes;
    bool ctx_h_live; /* ctx_h holds the input of layer ctx_layer */
    uint32_t ctx_layer;
    /* Local tokens */
    int32_t *tokens; /* device: context tokens, then local ones */
    size_t tok_bytes;
    uint32_t loc_len, loc_cap; /* local tokens cached, capacity (the stride of loc_k/v) */
    void *loc_k, *loc_v;       /* [layers][heads][loc_cap][head_dim] dtype */
    size_t loc_bytes;          /* allocated bytes of each of loc_k, loc_v */
    float *x;                  /* [loc_cap][hidden] fp32 hidden of the tokens in flight */
    float *sc;                 /* attention scores of a chunk of queries, fp32 */
    void *pr;                  /* their probabilities, dtype */
    size_t sc_bytes, pr_bytes;
    size_t score_elems; /* chunk budget: S_SCORE_ELEMS or the environment's */
    size_t x_bytes;
};

struct kvedge_gpu_opt_s {
    kvedge_gpu_opt_config_t cfg;
    kvedge_dtype_t dtype;
    void *arena;              /* every weight, one cudaMalloc */
    void *embed, *pos, *head; /* dtype; head may alias embed */
    float *lnf_w, *lnf_b;
    s_layer_t *layer;     /* [layers], host array of device pointers */
    pthread_mutex_t lock; /* prefill's session */
    bool lock_ok;
    kvedge_gpu_opt_session_t *own; /* the session prefill runs on */
};

/* ---------------------------------------------------------------------------------------- */
/* Kernels                                                                                   */

__device__ __forceinline__ void s_d_store(int dt, void *p, size_t i, float f)
{
    if (dt == KVEDGE_DTYPE_FP16)
        ((uint16_t *)p)[i] = kvedge_d_f32_to_fp16(f);
    else if (dt == KVEDGE_DTYPE_BF16)
        ((uint16_t *)p)[i] = kvedge_d_f32_to_bf16(f);
    else
        ((float *)p)[i] = f;
}

/* x[i][j] = embed[tokens[i]][j] + pos[pos0 + i + 2][j] (fp32). Tokens were checked on the host. */
__global__ void s_embed_kernel(int dt, const int32_t *tokens, uint32_t n, uint32_t hidden,
                               const void *embed, const void *pos, uint32_t pos0, float *x)
{
    const size_t total = (size_t)n * hidden;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / hidden, j = e % hidden;
        const size_t t = (size_t)tokens[i];
        const size_t p = (size_t)pos0 + i + KVEDGE_GPU_OPT_POSITION_OFFSET;
        x[e] = kvedge_d_load(dt, embed, t * hidden + j) + kvedge_d_load(dt, pos, p * hidden + j);
    }
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
__device__ float s_block_sum(float v, float *sh)
{
    for (int off = 16; off > 0; off /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads(); /* sh may still be read from an earlier call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (unsigned w = 0; w < nw; w++)
        s += sh[w];
    return s;
}

/* One block per row: y = (x - mean) / sqrt(var + eps) * w + b, statistics in fp32 (two passes). */
__global__ void s_layer_norm_kernel(int dt, const float *x, uint32_t d, const float *w,
                                    const float *b, void *y)
{
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * d;
    float s = 0.0f;
    for (uint32_t j = threadIdx.x; j < d; j += blockDim.x)
        s += xr[j];
    const float mean = s_block_sum(s, sh) / (float)d;
    float v = 0.0f;
    for (uint32_t j = threadIdx.x; j < d; j += blockDim.x)
        v += (xr[j] - mean) * (xr[j] - mean);
    const float var = s_block_sum(v, sh) / (float)d;
    const float inv = rsqrtf(var + S_LN_EPS);
    for (uint32_t j = threadIdx.x; j < d; j += blockDim.x)
        s_d_store(dt, y, (size_t)blockIdx.x * d + j, (xr[j] - mean) * inv * w[j] + b[j]);
}

/* qkv [n][3H] fp32 from the GEMM: adds the bias, writes q scaled to q ([n][H], dtype) and k and
 * v to the layer's local cache at rows past + i of each head ([heads][stride][head_dim]). */
__global__ void s_qkv_kernel(int dt, const float *qkv, const float *bias, uint32_t n,
                             uint32_t hidden, uint32_t head_dim, float scale, void *q, void *k,
                             void *v, size_t stride, uint32_t past)
{
    const size_t w3 = 3 * (size_t)hidden, total = (size_t)n * w3;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / w3, c = e % w3;
        const float val = qkv[e] + bias[c];
        if (c < hidden) {
            s_d_store(dt, q, i * hidden + c, val * scale);
            continue;
        }
        const size_t cc = (c - hidden) % hidden, h = cc / head_dim, d = cc % head_dim;
        const size_t dst = (h * stride + past + i) * head_dim + d;
        s_d_store(dt, c < 2 * (size_t)hidden ? k : v, dst, val);
    }
}

/* Block maximum, as s_block_sum. */
__device__ float s_block_max(float v, float *sh)
{
    for (int off = 16; off > 0; off /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    float m = -INFINITY;
    for (unsigned w = 0; w < nw; w++)
        m = fmaxf(m, sh[w]);
    return m;
}

/* One block per score row r = h * rows + ii (query q0 + ii of head h): p[r][j] = softmax over the
 * visible keys j < base + q0 + ii + 1 (all context keys, then the causal local ones), 0 for the
 * rest of the row's ld columns. Scores fp32 (already scaled), p in dtype; max, sum in fp32. */
__global__ void s_softmax_kernel(int dt, const float *sc, void *p, uint32_t rows, uint32_t ld,
                                 uint32_t base, uint32_t q0)
{
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const uint32_t ii = (uint32_t)(r % rows);
    const uint32_t vis = min(base + q0 + ii + 1, ld); /* >= 1: the query sees itself */
    const float *sr = sc + r * ld;
    float m = -INFINITY;
    for (uint32_t j = threadIdx.x; j < vis; j += blockDim.x)
        m = fmaxf(m, sr[j]);
    m = s_block_max(m, sh);
    float sum = 0.0f;
    for (uint32_t j = threadIdx.x; j < vis; j += blockDim.x)
        sum += expf(sr[j] - m);
    const float inv = 1.0f / s_block_sum(sum, sh); /* >= 1: the maximum contributes exp(0) */
    for (uint32_t j = threadIdx.x; j < ld; j += blockDim.x)
        s_d_store(dt, p, r * ld + j, j < vis ? expf(sr[j] - m) * inv : 0.0f);
}

/* out[e] = x[e] in dtype. */
__global__ void s_convert_kernel(int dt, const float *x, size_t total, void *out)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x)
        s_d_store(dt, out, e, x[e]);
}

/* x[e] += y[e] + b[e % width] (the residual add after a projection). */
__global__ void s_residual_kernel(float *x, const float *y, const float *b, size_t total,
                                  uint32_t width)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x)
        x[e] += y[e] + b[e % width];
}

/* out[e] = max(y[e] + b[e % width], 0) in dtype. */
__global__ void s_bias_relu_kernel(int dt, const float *y, const float *b, size_t total,
                                   uint32_t width, void *out)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const float v = y[e] + b[e % width];
        s_d_store(dt, out, e, v > 0.0f ? v : 0.0f);
    }
}

/* Blocks for a grid-stride loop over total elements. */
static unsigned s_blocks(size_t total)
{
    const size_t b = (total + S_THREADS - 1) / S_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* ---------------------------------------------------------------------------------------- */
/* Host helpers                                                                              */

static size_t s_dsize(kvedge_dtype_t dt)
{
    return dt == KVEDGE_DTYPE_FP32 ? 4 : 2;
}

static cudaDataType_t s_cuda_type(kvedge_dtype_t dt)
{
    return dt == KVEDGE_DTYPE_FP16   ? CUDA_R_16F
           : dt == KVEDGE_DTYPE_BF16 ? CUDA_R_16BF
                                     : CUDA_R_32F;
}

/* Y [n][out] fp32 = X [n][in] W^T, W [out][in] row-major, X in the model's dtype.
 * cuBLAS is column-major: W row-major is the column-major in x out matrix W^T (ld in), X is
 * in x n (ld in), so op(A) = (W^T)^T = W (out x in) times B = X^T (in x n) gives the column-major
 * out x n matrix W X^T (ld out), which read row-major is [n][out] = X W^T.
 * Worked example: out 2, in 3, n 1, W = [[1,2,3],[4,5,6]], X = [1,1,1]: A's memory is 1..6 with
 * lda 3, so A's columns are (1,2,3) and (4,5,6); op(A) = A^T has rows (1,2,3), (4,5,6) = W, and
 * Y = (6, 15) = X W^T. */
static int s_gemm(cublasHandle_t h, kvedge_dtype_t dt, const void *w, uint32_t out, uint32_t in,
                  const void *x, uint32_t n, float *y)
{
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = s_cuda_type(dt);
    return kvedge_gpu_blas_err(cublasGemmEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)n, (int)in, &one, w, t, (int)in, x, t, (int)in,
        &zero, y, CUDA_R_32F, (int)out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* C = alpha op(A) op(B) + beta C for heads batches, column-major as cuBLAS sees it (A, B in the
 * model's dtype, C fp32): the attention products of s_attention. */
static int s_gemm_heads(cublasHandle_t h, kvedge_dtype_t dt, cublasOperation_t ta, uint32_t m,
                        uint32_t n, uint32_t k, const void *a, size_t lda, size_t sa, const void *b,
                        size_t ldb, size_t sb, float beta, float *c, size_t ldc, size_t sc,
                        uint32_t batch)
{
    const float one = 1.0f;
    const cudaDataType_t t = s_cuda_type(dt);
    return kvedge_gpu_blas_err(cublasGemmStridedBatchedEx(
        h, ta, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, a, t, (int)lda, (long long)sa, b, t,
        (int)ldb, (long long)sb, &beta, c, CUDA_R_32F, (int)ldc, (long long)sc, (int)batch,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* Converts n fp32 host elements to dtype and copies them to dev (synchronous). */
static int s_upload(void *dev, const float *src, size_t n, kvedge_dtype_t dt, void *stage)
{
    if (dt == KVEDGE_DTYPE_FP32)
        return kvedge_gpu_err(cudaMemcpy(dev, src, n * 4, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < n; i += S_STAGE_ELEMS) {
        const size_t c = n - i < S_STAGE_ELEMS ? n - i : S_STAGE_ELEMS;
        kvedge_convert_from_f32((int)dt, src + i, c, stage);
        int rc =
            kvedge_gpu_err(cudaMemcpy((char *)dev + i * 2, stage, c * 2, cudaMemcpyHostToDevice));
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

static int s_upload_f32(void *dev, const float *src, size_t n)
{
    return kvedge_gpu_err(cudaMemcpy(dev, src, n * 4, cudaMemcpyHostToDevice));
}

static bool s_config_ok(const kvedge_gpu_opt_config_t *c)
{
    const uint32_t M = KVEDGE_GPU_OPT_DIM_MAX;
    return c->layers >= 1 && c->layers <= KVEDGE_GPU_OPT_LAYERS_MAX && c->heads >= 1 &&
           c->head_dim >= 1 && c->head_dim <= KVEDGE_BLOCK_MAX_HEAD_DIM && c->hidden >= 1 &&
           c->hidden <= M && (uint64_t)c->heads * c->head_dim == c->hidden && c->heads <= 65535 &&
           c->ffn >= 1 && c->ffn <= M && c->vocab >= 1 && c->vocab <= M && c->max_positions >= 1 &&
           c->max_positions <= M;
}

static bool s_weights_ok(const kvedge_gpu_opt_weights_t *w)
{
    if (!w->embed_tokens || !w->embed_positions || !w->final_ln_w || !w->final_ln_b ||
        !w->lm_head || !w->layer)
        return false;
    for (uint32_t l = 0; l < w->cfg.layers; l++) {
        const kvedge_gpu_opt_layer_t *L = &w->layer[l];
        if (!L->ln1_w || !L->ln1_b || !L->wq || !L->bq || !L->wk || !L->bk || !L->wv || !L->bv ||
            !L->wo || !L->bo || !L->ln2_w || !L->ln2_b || !L->fc1_w || !L->fc1_b || !L->fc2_w ||
            !L->fc2_b)
            return false;
    }
    return true;
}

/* Bumps *off by bytes rounded up to S_ALIGN_BYTES; returns the old offset. */
static size_t s_take(size_t *off, size_t bytes)
{
    const size_t o = *off;
    *off += (bytes + S_ALIGN_BYTES - 1) / S_ALIGN_BYTES * S_ALIGN_BYTES;
    return o;
}

/* Lays the weights out in the arena at base (0: only sizes it); returns the total bytes.
 * Sizes fit in 64 bits by s_config_ok's limits (under 2^56 bytes). */
static size_t s_layout(kvedge_gpu_opt_t *g, uintptr_t base, bool tied)
{
    const kvedge_gpu_opt_config_t *c = &g->cfg;
    const size_t es = s_dsize(g->dtype), H = c->hidden, F = c->ffn;
    size_t off = 0;
    /* Offsets from base as integers: with base 0 the pointers are only sizes, never used. */
#define S_AT(bytes) ((void *)(base + s_take(&off, (bytes))))
    g->embed = S_AT((size_t)c->vocab * H * es);
    g->pos = S_AT(((size_t)c->max_positions + KVEDGE_GPU_OPT_POSITION_OFFSET) * H * es);
    g->head = tied ? g->embed : S_AT((size_t)c->vocab * H * es);
    g->lnf_w = (float *)S_AT(H * 4);
    g->lnf_b = (float *)S_AT(H * 4);
    for (uint32_t l = 0; l < c->layers; l++) {
        s_layer_t *L = &g->layer[l];
        L->wqkv = S_AT(3 * H * H * es);
        L->bqkv = (float *)S_AT(3 * H * 4);
        L->wo = S_AT(H * H * es);
        L->bo = (float *)S_AT(H * 4);
        L->ln1_w = (float *)S_AT(H * 4);
        L->ln1_b = (float *)S_AT(H * 4);
        L->ln2_w = (float *)S_AT(H * 4);
        L->ln2_b = (float *)S_AT(H * 4);
        L->fc1 = S_AT(F * H * es);
        L->fc1_b = (float *)S_AT(F * 4);
        L->fc2 = S_AT(H * F * es);
        L->fc2_b = (float *)S_AT(H * 4);
    }
#undef S_AT
    return off;
}

static int s_upload_all(kvedge_gpu_opt_t *g, const kvedge_gpu_opt_weights_t *w, bool tied,
                        void *stage)
{
    const kvedge_gpu_opt_config_t *c = &g->cfg;
    const kvedge_dtype_t dt = g->dtype;
    const size_t es = s_dsize(dt), H = c->hidden, F = c->ffn;
    int rc = s_upload(g->embed, w->embed_tokens, (size_t)c->vocab * H, dt, stage);
    if (rc == KVEDGE_OK)
        rc = s_upload(g->pos, w->embed_positions,
                      ((size_t)c->max_positions + KVEDGE_GPU_OPT_POSITION_OFFSET) * H, dt, stage);
    if (rc == KVEDGE_OK && !tied)
        rc = s_upload(g->head, w->lm_head, (size_t)c->vocab * H, dt, stage);
    if (rc == KVEDGE_OK)
        rc = s_upload_f32(g->lnf_w, w->final_ln_w, H);
    if (rc == KVEDGE_OK)
        rc = s_upload_f32(g->lnf_b, w->final_ln_b, H);
    for (uint32_t l = 0; rc == KVEDGE_OK && l < c->layers; l++) {
        const kvedge_gpu_opt_layer_t *S = &w->layer[l];
        s_layer_t *L = &g->layer[l];
        char *wqkv = (char *)L->wqkv;
        rc = s_upload(wqkv, S->wq, H * H, dt, stage);
        if (rc == KVEDGE_OK)
            rc = s_upload(wqkv + H * H * es, S->wk, H * H, dt, stage);
        if (rc == KVEDGE_OK)
            rc = s_upload(wqkv + 2 * H * H * es, S->wv, H * H, dt, stage);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->bqkv, S->bq, H);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->bqkv + H, S->bk, H);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->bqkv + 2 * H, S->bv, H);
        if (rc == KVEDGE_OK)
            rc = s_upload(L->wo, S->wo, H * H, dt, stage);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->bo, S->bo, H);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->ln1_w, S->ln1_w, H);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->ln1_b, S->ln1_b, H);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->ln2_w, S->ln2_w, H);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->ln2_b, S->ln2_b, H);
        if (rc == KVEDGE_OK)
            rc = s_upload(L->fc1, S->fc1_w, F * H, dt, stage);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->fc1_b, S->fc1_b, F);
        if (rc == KVEDGE_OK)
            rc = s_upload(L->fc2, S->fc2_w, H * F, dt, stage);
        if (rc == KVEDGE_OK)
            rc = s_upload_f32(L->fc2_b, S->fc2_b, H);
    }
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Model                                                                                     */

extern "C" int kvedge_gpu_opt_new(const kvedge_gpu_opt_weights_t *w, kvedge_dtype_t dtype,
                                  kvedge_gpu_opt_t **out)
{
    if (out)
        *out = NULL;
    if (!w || !out || !s_config_ok(&w->cfg) || !s_weights_ok(w) ||
        (dtype != KVEDGE_DTYPE_FP16 && dtype != KVEDGE_DTYPE_BF16 && dtype != KVEDGE_DTYPE_FP32))
        return KVEDGE_EINVAL;
    if (kvedge_gpu_device_count() == 0)
        return KVEDGE_EINVAL;
    kvedge_gpu_opt_t *g = (kvedge_gpu_opt_t *)calloc(1, sizeof *g);
    if (!g)
        return KVEDGE_ENOMEM;
    g->cfg = w->cfg;
    g->dtype = dtype;
    g->layer = (s_layer_t *)calloc(w->cfg.layers, sizeof *g->layer);
    int rc = g->layer ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK) {
        g->lock_ok = pthread_mutex_init(&g->lock, NULL) == 0;
        rc = g->lock_ok ? KVEDGE_OK : KVEDGE_ENOMEM;
    }
    const bool tied = w->lm_head == w->embed_tokens;
    void *stage = NULL;
    if (rc == KVEDGE_OK) {
        /* Ask before trying: a model far over the free memory fails at once. */
        const size_t bytes = s_layout(g, 0, tied);
        size_t free_b = 0, total_b = 0;
        rc = kvedge_gpu_err(cudaMemGetInfo(&free_b, &total_b));
        if (rc == KVEDGE_OK && bytes > free_b)
            rc = KVEDGE_ENOMEM;
        void *arena = NULL;
        if (rc == KVEDGE_OK)
            rc = kvedge_gpu_err(cudaMalloc(&arena, bytes));
        g->arena = rc == KVEDGE_OK ? arena : NULL;
        if (rc == KVEDGE_OK)
            s_layout(g, (uintptr_t)g->arena, tied);
    }
    if (rc == KVEDGE_OK && dtype != KVEDGE_DTYPE_FP32) {
        stage = malloc((size_t)S_STAGE_ELEMS * 2);
        rc = stage ? KVEDGE_OK : KVEDGE_ENOMEM;
    }
    if (rc == KVEDGE_OK)
        rc = s_upload_all(g, w, tied, stage);
    free(stage);
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_opt_session_new(g, &g->own);
    if (rc != KVEDGE_OK) {
        kvedge_gpu_opt_destroy(&g);
        return rc;
    }
    *out = g;
    return KVEDGE_OK;
}

extern "C" void kvedge_gpu_opt_destroy(kvedge_gpu_opt_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_gpu_opt_t *g = *self_p;
    kvedge_gpu_opt_session_destroy(&g->own);
    if (g->arena)
        cudaFree(g->arena);
    if (g->lock_ok)
        pthread_mutex_destroy(&g->lock);
    free(g->layer);
    free(g);
    *self_p = NULL;
}

extern "C" const kvedge_gpu_opt_config_t *kvedge_gpu_opt_config(const kvedge_gpu_opt_t *self)
{
    return self ? &self->cfg : NULL;
}

extern "C" kvedge_dtype_t kvedge_gpu_opt_dtype(const kvedge_gpu_opt_t *self)
{
    return self ? self->dtype : (kvedge_dtype_t)0;
}

/* ---------------------------------------------------------------------------------------- */
/* Sessions                                                                                  */

/* cudaFree of a pointer that may be NULL, then NULL. */
static void s_free(void **p)
{
    if (*p)
        cudaFree(*p);
    *p = NULL;
}

/* Makes *a (and *b when b is set: the two always have the same size) hold at least bytes of
 * device memory, contents not kept. Before freeing a buffer it waits for the session's stream,
 * which may still be using it. On failure both are freed and *have is 0. */
static int s_grow(cudaStream_t st, void **a, void **b, size_t *have, size_t bytes)
{
    if (*a && (!b || *b) && *have >= bytes)
        return KVEDGE_OK;
    if (*a || (b && *b))
        cudaStreamSynchronize(st);
    s_free(a);
    if (b)
        s_free(b);
    *have = 0;
    void *na = NULL, *nb = NULL;
    int rc = kvedge_gpu_err(cudaMalloc(&na, bytes ? bytes : 1));
    if (rc == KVEDGE_OK && b) {
        rc = kvedge_gpu_err(cudaMalloc(&nb, bytes ? bytes : 1));
        if (rc != KVEDGE_OK)
            cudaFree(na);
    }
    if (rc != KVEDGE_OK)
        return rc;
    *a = na;
    if (b)
        *b = nb;
    *have = bytes;
    return KVEDGE_OK;
}

extern "C" int kvedge_gpu_opt_session_new(kvedge_gpu_opt_t *model, kvedge_gpu_opt_session_t **out)
{
    if (out)
        *out = NULL;
    if (!model || !out)
        return KVEDGE_EINVAL;
    kvedge_gpu_opt_session_t *s = (kvedge_gpu_opt_session_t *)calloc(1, sizeof *s);
    if (!s)
        return KVEDGE_ENOMEM;
    s->model = model;
    s->score_elems = S_SCORE_ELEMS;
    const char *env = getenv(KVEDGE_GPU_OPT_SCORE_ELEMS_ENV); /* tests: force small chunks */
    if (env && strtoull(env, NULL, 10) > 0)
        s->score_elems = (size_t)strtoull(env, NULL, 10);
    const uint32_t L = model->cfg.layers;
    s->ctx_k = (const void **)calloc(L, sizeof(void *));
    s->ctx_v = (const void **)calloc(L, sizeof(void *));
    s->ctx_stride = (size_t *)calloc(L, sizeof(size_t));
    s->own_k = (void **)calloc(L, sizeof(void *));
    s->own_v = (void **)calloc(L, sizeof(void *));
    s->own_bytes = (size_t *)calloc(L, sizeof(size_t));
    int rc = (s->ctx_k && s->ctx_v && s->ctx_stride && s->own_k && s->own_v && s->own_bytes)
                 ? KVEDGE_OK
                 : KVEDGE_ENOMEM;
    /* Handles through locals: a failed create leaves its output undefined. */
    if (rc == KVEDGE_OK) {
        cudaStream_t st = NULL;
        rc = kvedge_gpu_err(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        s->stream = rc == KVEDGE_OK ? st : NULL;
    }
    if (rc == KVEDGE_OK) {
        cublasHandle_t h = NULL;
        rc = kvedge_gpu_blas_err(cublasCreate(&h));
        s->blas = rc == KVEDGE_OK ? h : NULL;
    }
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_blas_err(cublasSetStream(s->blas, s->stream));
    if (rc == KVEDGE_OK) /* fp32 compute with no TF32: the fp32 model is exact up to order */
        rc = kvedge_gpu_blas_err(cublasSetMathMode(s->blas, CUBLAS_DEFAULT_MATH));
    if (rc == KVEDGE_OK) {
        void *h = NULL;
        rc = kvedge_gpu_err(cudaMallocHost(&h, (size_t)model->cfg.vocab * sizeof(float)));
        s->logits_host = rc == KVEDGE_OK ? (float *)h : NULL;
    }
    if (rc != KVEDGE_OK) {
        kvedge_gpu_opt_session_destroy(&s);
        return rc;
    }
    *out = s;
    return KVEDGE_OK;
}

extern "C" void kvedge_gpu_opt_session_destroy(kvedge_gpu_opt_session_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_gpu_opt_session_t *s = *self_p;
    if (s->stream)
        cudaStreamSynchronize(s->stream);
    for (uint32_t l = 0; l < s->model->cfg.layers; l++) {
        if (s->own_k)
            s_free(&s->own_k[l]);
        if (s->own_v)
            s_free(&s->own_v[l]);
    }
    s_free(&s->tmp_k);
    s_free(&s->tmp_v);
    s_free((void **)&s->ctx_h);
    s_free((void **)&s->tokens);
    s_free(&s->loc_k);
    s_free(&s->loc_v);
    s_free((void **)&s->x);
    s_free(&s->work.buf);
    s_free((void **)&s->sc);
    s_free(&s->pr);
    if (s->logits_host)
        cudaFreeHost(s->logits_host);
    if (s->blas)
        cublasDestroy(s->blas);
    if (s->stream)
        cudaStreamDestroy(s->stream);
    free(s->own_bytes);
    free(s->own_v);
    free(s->own_k);
    free(s->ctx_stride);
    free(s->ctx_v);
    free(s->ctx_k);
    free(s);
    *self_p = NULL;
}

extern "C" kvedge_gpu_stream_t kvedge_gpu_opt_session_stream(const kvedge_gpu_opt_session_t *self)
{
    return self ? (kvedge_gpu_stream_t)self->stream : NULL;
}

/* Makes the scratch hold a pass of n rows. */
static int s_work_reserve(kvedge_gpu_opt_session_t *s, uint32_t n)
{
    const kvedge_gpu_opt_config_t *c = &s->model->cfg;
    const size_t es = s_dsize(s->model->dtype), H = c->hidden, F = c->ffn;
    size_t off = 0;
    const size_t o_ln = s_take(&off, n * H * es), o_qkv = s_take(&off, n * 3 * H * 4);
    const size_t o_q = s_take(&off, n * H * es);
    const size_t o_attn = s_take(&off, n * H * es), o_tmp = s_take(&off, n * H * 4);
    const size_t o_f32 = s_take(&off, n * F * 4), o_act = s_take(&off, n * F * es);
    const size_t o_log = s_take(&off, (size_t)c->vocab * 4);
    s_work_t *w = &s->work;
    int rc = s_grow(s->stream, &w->buf, NULL, &w->bytes, off);
    if (rc != KVEDGE_OK)
        return rc;
    char *b = (char *)w->buf;
    w->ln = b + o_ln;
    w->qkv = (float *)(b + o_qkv);
    w->q = b + o_q;
    w->attn = b + o_attn;
    w->tmp = (float *)(b + o_tmp);
    w->f32 = (float *)(b + o_f32);
    w->act = b + o_act;
    w->logits = (float *)(b + o_log);
    return KVEDGE_OK;
}

/* Attention of the n queries in s->work.q ([n][hidden], scaled) over the c_len context keys
 * (ck/cv, [heads][c_stride][head_dim]) and causally over the local keys (lk/lv, stride l_stride,
 * query i sees local rows 0..past+i), into s->work.attn ([n][hidden], dtype). By cuBLAS, per
 * chunk of query rows: scores S = Q K^T of the context and of the visible local keys side by
 * side in one fp32 row per query and head, a masked softmax to P (dtype), then O = P V as two
 * products accumulated in fp32 (s->work.tmp), converted to dtype at the end.
 * In cuBLAS's column-major terms, for head h: S_h^T (keys x rows, ld kc) = K_h (op T of the
 * column-major D x keys array, ld D) times Q_h^T (D x rows, ld hidden); O_h^T (D x rows, ld
 * hidden) = V_h (D x keys, ld D, op N) times P_h^T (keys x rows, ld kc). */
static int s_attention(kvedge_gpu_opt_session_t *s, uint32_t n, const void *ck, const void *cv,
                       uint32_t c_len, size_t c_stride, const void *lk, const void *lv,
                       size_t l_stride, uint32_t past)
{
    const kvedge_gpu_opt_t *g = s->model;
    const kvedge_gpu_opt_config_t *c = &g->cfg;
    const kvedge_dtype_t dt = g->dtype;
    const size_t es = s_dsize(dt), H = c->hidden, D = c->head_dim, heads = c->heads;
    const size_t keys_max = (size_t)c_len + past + n;
    size_t rows = s->score_elems / (heads * keys_max);
    rows = rows < 1 ? 1 : rows > n ? n : rows;
    const size_t elems = heads * rows * keys_max;
    int rc = s_grow(s->stream, (void **)&s->sc, NULL, &s->sc_bytes, elems * 4);
    if (rc == KVEDGE_OK)
        rc = s_grow(s->stream, &s->pr, NULL, &s->pr_bytes, elems * es);
    s_work_t *w = &s->work;
    for (size_t q0 = 0; rc == KVEDGE_OK && q0 < n; q0 += rows) {
        const size_t m = n - q0 < rows ? n - q0 : rows;
        const size_t kc = (size_t)c_len + past + q0 + m; /* keys the chunk's last row sees */
        const size_t kl = kc - c_len;                    /* of them local, >= 1 */
        const char *q = (const char *)w->q + q0 * H * es;
        const char *p = (const char *)s->pr;
        if (c_len)
            rc = s_gemm_heads(s->blas, dt, CUBLAS_OP_T, c_len, (uint32_t)m, (uint32_t)D, ck, D,
                              c_stride * D, q, H, D, 0.0f, s->sc, kc, m * kc, (uint32_t)heads);
        if (rc == KVEDGE_OK)
            rc = s_gemm_heads(s->blas, dt, CUBLAS_OP_T, (uint32_t)kl, (uint32_t)m, (uint32_t)D, lk,
                              D, l_stride * D, q, H, D, 0.0f, s->sc + c_len, kc, m * kc,
                              (uint32_t)heads);
        if (rc == KVEDGE_OK) {
            s_softmax_kernel<<<(unsigned)(heads * m), S_THREADS, 0, s->stream>>>(
                (int)dt, s->sc, s->pr, (uint32_t)m, (uint32_t)kc, c_len + past, (uint32_t)q0);
            rc = kvedge_gpu_launch_err();
        }
        if (rc == KVEDGE_OK && c_len)
            rc = s_gemm_heads(s->blas, dt, CUBLAS_OP_N, (uint32_t)D, (uint32_t)m, c_len, cv, D,
                              c_stride * D, p, kc, m * kc, 0.0f, w->tmp + q0 * H, H, D,
                              (uint32_t)heads);
        if (rc == KVEDGE_OK)
            rc = s_gemm_heads(s->blas, dt, CUBLAS_OP_N, (uint32_t)D, (uint32_t)m, (uint32_t)kl, lv,
                              D, l_stride * D, p + (size_t)c_len * es, kc, m * kc,
                              c_len ? 1.0f : 0.0f, w->tmp + q0 * H, H, D, (uint32_t)heads);
    }
    if (rc == KVEDGE_OK) {
        s_convert_kernel<<<s_blocks((size_t)n * H), S_THREADS, 0, s->stream>>>(
            (int)dt, w->tmp, (size_t)n * H, w->attn);
        rc = kvedge_gpu_launch_err();
    }
    return rc;
}

/* Queues layer l on the hidden states x [n][hidden] (fp32, in place). The n tokens attend to the
 * c_len context rows of ck/cv (stride c_stride) and causally to the local rows of lk/lv (stride
 * l_stride), the first past of which are earlier tokens; their own K/V goes to rows past.. */
static int s_layer(kvedge_gpu_opt_session_t *s, uint32_t l, float *x, uint32_t n, const void *ck,
                   const void *cv, uint32_t c_len, size_t c_stride, void *lk, void *lv,
                   size_t l_stride, uint32_t past)
{
    const kvedge_gpu_opt_t *g = s->model;
    const kvedge_gpu_opt_config_t *c = &g->cfg;
    const s_layer_t *L = &g->layer[l];
    const kvedge_dtype_t dt = g->dtype;
    const int dti = (int)dt;
    const uint32_t H = c->hidden, F = c->ffn;
    const size_t nh = (size_t)n * H, nf = (size_t)n * F;
    s_work_t *w = &s->work;
    cudaStream_t st = s->stream;

    s_layer_norm_kernel<<<n, S_THREADS, 0, st>>>(dti, x, H, L->ln1_w, L->ln1_b, w->ln);
    int rc = kvedge_gpu_launch_err();
    if (rc == KVEDGE_OK)
        rc = s_gemm(s->blas, dt, L->wqkv, 3 * H, H, w->ln, n, w->qkv);
    if (rc == KVEDGE_OK) {
        /* HF scales q after its bias: q_proj(x) * head_dim^-0.5, as the CPU decoder. */
        const float scale = 1.0f / sqrtf((float)c->head_dim);
        s_qkv_kernel<<<s_blocks(3 * nh), S_THREADS, 0, st>>>(
            dti, w->qkv, L->bqkv, n, H, c->head_dim, scale, w->q, lk, lv, l_stride, past);
        rc = kvedge_gpu_launch_err();
    }
    if (rc == KVEDGE_OK)
        rc = s_attention(s, n, ck, cv, c_len, c_stride, lk, lv, l_stride, past);
    if (rc == KVEDGE_OK)
        rc = s_gemm(s->blas, dt, L->wo, H, H, w->attn, n, w->tmp);
    if (rc == KVEDGE_OK) {
        s_residual_kernel<<<s_blocks(nh), S_THREADS, 0, st>>>(x, w->tmp, L->bo, nh, H);
        rc = kvedge_gpu_launch_err();
    }
    if (rc == KVEDGE_OK) {
        s_layer_norm_kernel<<<n, S_THREADS, 0, st>>>(dti, x, H, L->ln2_w, L->ln2_b, w->ln);
        rc = kvedge_gpu_launch_err();
    }
    if (rc == KVEDGE_OK)
        rc = s_gemm(s->blas, dt, L->fc1, F, H, w->ln, n, w->f32);
    if (rc == KVEDGE_OK) {
        s_bias_relu_kernel<<<s_blocks(nf), S_THREADS, 0, st>>>(dti, w->f32, L->fc1_b, nf, F,
                                                               w->act);
        rc = kvedge_gpu_launch_err();
    }
    if (rc == KVEDGE_OK)
        rc = s_gemm(s->blas, dt, L->fc2, H, F, w->act, n, w->tmp);
    if (rc == KVEDGE_OK) {
        s_residual_kernel<<<s_blocks(nh), S_THREADS, 0, st>>>(x, w->tmp, L->fc2_b, nh, H);
        rc = kvedge_gpu_launch_err();
    }
    return rc;
}

/* Queues the embedding of n tokens (device, already uploaded) at positions pos0.. into x. */
static int s_embed(kvedge_gpu_opt_session_t *s, const int32_t *tokens, uint32_t n, uint32_t pos0,
                   float *x)
{
    const kvedge_gpu_opt_t *g = s->model;
    const uint32_t H = g->cfg.hidden;
    s_embed_kernel<<<s_blocks((size_t)n * H), S_THREADS, 0, s->stream>>>(
        (int)g->dtype, tokens, n, H, g->embed, g->pos, pos0, x);
    return kvedge_gpu_launch_err();
}

/* Runs the context's hidden state forward until layer l has run, leaving layer l's K/V in the
 * session's own buffers for l (as the CPU session's lazy recompute): fetched layers before l are
 * rerun only for their hidden output, into the scratch pair. */
static int s_ctx_advance(kvedge_gpu_opt_session_t *s, uint32_t l)
{
    const kvedge_gpu_opt_t *g = s->model;
    const uint32_t n = s->ctx_len, H = g->cfg.hidden;
    const size_t kv_bytes = (size_t)g->cfg.heads * n * g->cfg.head_dim * s_dsize(g->dtype);
    int rc = s_work_reserve(s, n);
    if (rc != KVEDGE_OK)
        return rc;
    if (!s->ctx_h_live) {
        rc = s_grow(s->stream, (void **)&s->ctx_h, NULL, &s->ctx_h_bytes, (size_t)n * H * 4);
        if (rc == KVEDGE_OK)
            rc = s_embed(s, s->tokens, n, 0, s->ctx_h);
        if (rc != KVEDGE_OK)
            return rc;
        s->ctx_h_live = true;
        s->ctx_layer = 0;
    }
    while (s->ctx_layer <= l) {
        const uint32_t j = s->ctx_layer;
        void **k = j == l ? &s->own_k[l] : &s->tmp_k, **v = j == l ? &s->own_v[l] : &s->tmp_v;
        rc = s_grow(s->stream, k, v, j == l ? &s->own_bytes[l] : &s->tmp_bytes, kv_bytes);
        if (rc == KVEDGE_OK)
            rc = s_layer(s, j, s->ctx_h, n, NULL, NULL, 0, 0, *k, *v, n, 0);
        if (rc != KVEDGE_OK)
            return rc;
        s->ctx_layer++;
    }
    s->ctx_k[l] = s->own_k[l];
    s->ctx_v[l] = s->own_v[l];
    s->ctx_stride[l] = n;
    return KVEDGE_OK;
}

/* Runs n local tokens (already embedded in s->x) through every layer, asking provider for the
 * context K/V on the way when set, then computes the logits and copies them to the host. */
static int s_run(kvedge_gpu_opt_session_t *s, uint32_t n, const kvedge_gpu_opt_ctx_t *ctx)
{
    const kvedge_gpu_opt_t *g = s->model;
    const kvedge_gpu_opt_config_t *c = &g->cfg;
    const size_t lkv = (size_t)c->heads * s->loc_cap * c->head_dim * s_dsize(g->dtype);
    int rc = s_work_reserve(s, n);
    for (uint32_t l = 0; rc == KVEDGE_OK && l < c->layers; l++) {
        if (ctx) {
            const void *k = NULL, *v = NULL;
            rc = ctx->provider(ctx->arg, l, &k, &v);
            if (rc == 0) {
                if (!k || !v)
                    rc = KVEDGE_EINVAL;
                s->ctx_k[l] = k;
                s->ctx_v[l] = v;
                s->ctx_stride[l] = ctx->cap ? ctx->cap : ctx->len;
            } else if (rc == KVEDGE_GPU_OPT_MISS) {
                rc = s_ctx_advance(s, l);
                if (rc == KVEDGE_OK) /* the context pass may have grown the scratch */
                    rc = s_work_reserve(s, n > s->ctx_len ? n : s->ctx_len);
            } else if (rc > 0) {
                rc = KVEDGE_EINVAL; /* a provider must say 0, MISS or an error */
            }
            if (rc != KVEDGE_OK)
                break;
        }
        char *lk = (char *)s->loc_k + l * lkv, *lv = (char *)s->loc_v + l * lkv;
        rc = s_layer(s, l, s->x, n, s->ctx_k[l], s->ctx_v[l], s->ctx_len, s->ctx_stride[l], lk, lv,
                     s->loc_cap, s->loc_len);
    }
    if (rc == KVEDGE_OK) {
        s_layer_norm_kernel<<<1, S_THREADS, 0, s->stream>>>(
            (int)g->dtype, s->x + (size_t)(n - 1) * c->hidden, c->hidden, g->lnf_w, g->lnf_b,
            s->work.ln);
        rc = kvedge_gpu_launch_err();
    }
    if (rc == KVEDGE_OK)
        rc = s_gemm(s->blas, g->dtype, g->head, c->vocab, c->hidden, s->work.ln, 1, s->work.logits);
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_err(cudaMemcpyAsync(s->logits_host, s->work.logits,
                                            (size_t)c->vocab * sizeof(float),
                                            cudaMemcpyDeviceToHost, s->stream));
    /* Always drain: on an error, nothing queued may still be using the buffers. */
    const int rs = kvedge_gpu_err(cudaStreamSynchronize(s->stream));
    if (rc == KVEDGE_OK)
        rc = rs;
    if (rc == KVEDGE_OK)
        s->loc_len += n;
    return rc;
}

static bool s_tokens_ok(const kvedge_gpu_opt_config_t *c, const int32_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (t[i] < 0 || (uint32_t)t[i] >= c->vocab)
            return false;
    return true;
}

extern "C" int kvedge_gpu_opt_session_begin(kvedge_gpu_opt_session_t *self,
                                            const kvedge_gpu_opt_ctx_t *ctx, const int32_t *prompt,
                                            uint32_t prompt_len, uint32_t max_new, float *logits)
{
    if (!self)
        return KVEDGE_EINVAL;
    self->ready = false;
    const kvedge_gpu_opt_t *g = self->model;
    const kvedge_gpu_opt_config_t *c = &g->cfg;
    if (!prompt || prompt_len == 0)
        return KVEDGE_EINVAL;
    if (ctx &&
        (ctx->len == 0 || !ctx->tokens || !ctx->provider || (ctx->cap != 0 && ctx->cap < ctx->len)))
        return KVEDGE_EINVAL;
    const uint32_t clen = ctx ? ctx->len : 0;
    if ((uint64_t)clen + prompt_len + max_new > c->max_positions)
        return KVEDGE_ETOOBIG;
    if ((ctx && !s_tokens_ok(c, ctx->tokens, clen)) || !s_tokens_ok(c, prompt, prompt_len))
        return KVEDGE_EINVAL;

    const uint32_t loc_cap = prompt_len + max_new;
    const size_t lkv = (size_t)c->layers * c->heads * loc_cap * c->head_dim * s_dsize(g->dtype);
    cudaStream_t st = self->stream;
    int rc = s_grow(st, &self->loc_k, &self->loc_v, &self->loc_bytes, lkv);
    if (rc == KVEDGE_OK)
        rc = s_grow(st, (void **)&self->x, NULL, &self->x_bytes, (size_t)loc_cap * c->hidden * 4);
    if (rc == KVEDGE_OK)
        rc = s_grow(st, (void **)&self->tokens, NULL, &self->tok_bytes,
                    ((size_t)clen + loc_cap) * 4);
    if (rc != KVEDGE_OK)
        return rc;
    self->ctx_len = clen;
    self->loc_cap = loc_cap;
    self->loc_len = 0;
    self->ctx_h_live = false;
    self->ctx_layer = 0;
    for (uint32_t l = 0; l < c->layers; l++) {
        self->ctx_k[l] = self->ctx_v[l] = NULL;
        self->ctx_stride[l] = 0;
    }
    /* Pageable copies: the host arrays may be reused as soon as these return. */
    if (clen)
        rc = kvedge_gpu_err(cudaMemcpyAsync(self->tokens, ctx->tokens, (size_t)clen * 4,
                                            cudaMemcpyHostToDevice, self->stream));
    if (rc == KVEDGE_OK)
        rc = kvedge_gpu_err(cudaMemcpyAsync(self->tokens + clen, prompt, (size_t)prompt_len * 4,
                                            cudaMemcpyHostToDevice, self->stream));
    if (rc == KVEDGE_OK)
        rc = s_embed(self, self->tokens + clen, prompt_len, clen, self->x);
    if (rc == KVEDGE_OK)
        rc = s_run(self, prompt_len, ctx);
    else
        cudaStreamSynchronize(self->stream);
    if (rc != KVEDGE_OK)
        return rc;
    self->ctx_h_live = false; /* only needed while a layer may still MISS */
    self->ready = true;
    if (logits)
        memcpy(logits, self->logits_host, (size_t)c->vocab * sizeof(float));
    return KVEDGE_OK;
}

extern "C" int kvedge_gpu_opt_session_step(kvedge_gpu_opt_session_t *self, int32_t token,
                                           float *logits)
{
    if (!self || !self->ready || !s_tokens_ok(&self->model->cfg, &token, 1))
        return KVEDGE_EINVAL;
    if (self->loc_len >= self->loc_cap)
        return KVEDGE_ENOSPACE;
    const uint32_t slot = self->ctx_len + self->loc_len;
    float *x = self->x; /* row 0 holds the one token in flight */
    int rc = kvedge_gpu_err(cudaMemcpyAsync(self->tokens + slot, &token, sizeof token,
                                            cudaMemcpyHostToDevice, self->stream));
    if (rc == KVEDGE_OK)
        rc = s_embed(self, self->tokens + slot, 1, slot, x);
    if (rc == KVEDGE_OK)
        rc = s_run(self, 1, NULL);
    else
        cudaStreamSynchronize(self->stream);
    if (rc != KVEDGE_OK) {
        self->ready = false;
        return rc;
    }
    if (logits)
        memcpy(logits, self->logits_host, (size_t)self->model->cfg.vocab * sizeof(float));
    return KVEDGE_OK;
}

/* The arg-max, lowest id on a tie (kvedge_decoder_argmax). */
static int32_t s_argmax(const float *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t j = 1; j < n; j++)
        if (v[j] > v[best])
            best = j;
    return (int32_t)best;
}

extern "C" int kvedge_gpu_opt_session_generate(kvedge_gpu_opt_session_t *self, uint32_t n,
                                               int32_t *tokens)
{
    if (!self || !self->ready || (n && !tokens))
        return KVEDGE_EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        tokens[i] = s_argmax(self->logits_host, self->model->cfg.vocab);
        int rc = kvedge_gpu_opt_session_step(self, tokens[i], NULL);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

extern "C" int kvedge_gpu_opt_prefill(kvedge_gpu_opt_t *self, const int32_t *tokens, uint32_t n,
                                      float *logits, void *const *k_out, void *const *v_out)
{
    if (!self || !tokens || n == 0 || (!k_out != !v_out))
        return KVEDGE_EINVAL;
    const kvedge_gpu_opt_config_t *c = &self->cfg;
    if (n > c->max_positions)
        return KVEDGE_ETOOBIG;
    if (k_out)
        for (uint32_t l = 0; l < c->layers; l++)
            if (!k_out[l] || !v_out[l])
                return KVEDGE_EINVAL;
    pthread_mutex_lock(&self->lock);
    kvedge_gpu_opt_session_t *s = self->own;
    int rc = kvedge_gpu_opt_session_begin(s, NULL, tokens, n, 0, logits);
    if (rc == KVEDGE_OK && k_out) {
        /* max_new 0: the local cache's stride is n, so each layer is one contiguous block. */
        const size_t lkv = (size_t)c->heads * n * c->head_dim * s_dsize(self->dtype);
        for (uint32_t l = 0; rc == KVEDGE_OK && l < c->layers; l++) {
            rc = kvedge_gpu_err(cudaMemcpyAsync(k_out[l], (char *)s->loc_k + l * lkv, lkv,
                                                cudaMemcpyDeviceToDevice, s->stream));
            if (rc == KVEDGE_OK)
                rc = kvedge_gpu_err(cudaMemcpyAsync(v_out[l], (char *)s->loc_v + l * lkv, lkv,
                                                    cudaMemcpyDeviceToDevice, s->stream));
        }
        const int rs = kvedge_gpu_err(cudaStreamSynchronize(s->stream));
        if (rc == KVEDGE_OK)
            rc = rs;
    }
    s->ready = false; /* the model's session is not for stepping */
    pthread_mutex_unlock(&self->lock);
    return rc;
}
