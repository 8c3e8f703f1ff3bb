/* The GPU counterpart of the reference OPT decoder (clients/decoder/decoder.h): the same model
 * (pre-LayerNorm, ReLU FFN, learned positions with an offset of 2) with cuBLAS GEMMs and small
 * kernels, weights in fp16, bf16 or fp32; a recompute prefill and a decode session over context
 * K/V that is already on the device, delivered layer by layer. docs/gpu.md, "GPU decoder". */
#ifndef KVEDGE_GPU_OPT_H
#define KVEDGE_GPU_OPT_H

#include <stdint.h>

#include "gpu/gpu.h"
#include "access/codec/block.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returned by a kvedge_gpu_opt_kv_fn for a layer the session must compute itself (the value
 * of KVEDGE_DECODER_MISS). */
#define KVEDGE_GPU_OPT_MISS 1
/* HF's OPTLearnedPositionalEmbedding: position p reads row p + 2 of embed_positions. */
#define KVEDGE_GPU_OPT_POSITION_OFFSET 2
/* Largest accepted sizes (checked by kvedge_gpu_opt_new): they keep every byte count in 64
 * bits and every GEMM dimension in a cuBLAS int. */
#define KVEDGE_GPU_OPT_DIM_MAX    (1u << 20) /* hidden, ffn, vocab, max_positions */
#define KVEDGE_GPU_OPT_LAYERS_MAX 1024u

/* Environment variable: when set to a positive count, sessions made afterwards hold at most
 * that many attention scores at once (default 32 Mi), so that tests reach the chunked path with
 * small models. Not needed in production. */
#define KVEDGE_GPU_OPT_SCORE_ELEMS_ENV "KVEDGE_GPU_OPT_SCORE_ELEMS"

typedef struct {
    uint32_t layers;
    uint32_t heads;
    uint32_t head_dim; /* hidden / heads, at most KVEDGE_BLOCK_MAX_HEAD_DIM */
    uint32_t hidden;
    uint32_t ffn;
    uint32_t vocab;
    uint32_t max_positions; /* rows of embed_positions minus the offset of 2 */
} kvedge_gpu_opt_config_t;

/* One decoder layer, HOST fp32, Hugging Face layout: matrices [out][in] row-major. */
typedef struct {
    const float *ln1_w, *ln1_b;                 /* self_attn_layer_norm [hidden] */
    const float *wq, *bq, *wk, *bk, *wv, *bv;   /* [hidden][hidden], [hidden] */
    const float *wo, *bo;                       /* out_proj [hidden][hidden], [hidden] */
    const float *ln2_w, *ln2_b;                 /* final_layer_norm of the block [hidden] */
    const float *fc1_w, *fc1_b, *fc2_w, *fc2_b; /* [ffn][hidden], [ffn], [hidden][ffn], [hidden] */
} kvedge_gpu_opt_layer_t;

/* The weights kvedge_gpu_opt_new uploads; only read during that call. */
typedef struct {
    kvedge_gpu_opt_config_t cfg;
    const float *embed_tokens;    /* [vocab][hidden] */
    const float *embed_positions; /* [max_positions + 2][hidden] */
    const float *final_ln_w, *final_ln_b;
    const float *lm_head;                /* [vocab][hidden]; may equal embed_tokens (tied) */
    const kvedge_gpu_opt_layer_t *layer; /* [layers] */
} kvedge_gpu_opt_weights_t;

typedef struct kvedge_gpu_opt_s kvedge_gpu_opt_t;
typedef struct kvedge_gpu_opt_session_s kvedge_gpu_opt_session_t;

/* Provides the context's K and V of one layer ON THE DEVICE. Called for layer 0, 1, ... in
 * order, once each, right before the session queues that layer's work (it may block on the host,
 * e.g. in kvedge_pipeline_wait; work queued for earlier layers keeps the GPU busy meanwhile).
 * Returns 0 and sets *k and *v to device memory laid out as the dequantizer's KVEDGE_KV_CONTIG
 * destination: [heads][ctx.cap][head_dim] in the model's dtype, rows 0..ctx.len-1 of each head
 * valid. The data must be complete for work queued on the session's stream after the call
 * returns (already complete, or the provider made kvedge_gpu_opt_session_stream wait on an
 * event), and must stay valid and unchanged until the session is begun again or destroyed:
 * step and generate read it. Or returns KVEDGE_GPU_OPT_MISS: the session computes the layer
 * itself (running the context through the layers it needs, keeping the context's hidden state
 * on the device), or a negative KVEDGE_E* code, which aborts the begin with that code. */
typedef int (*kvedge_gpu_opt_kv_fn)(void *arg, uint32_t layer, const void **k, const void **v);

/* A shared context of a decode: tokens 0..len-1 at positions 0..len-1. */
typedef struct {
    const int32_t *tokens;         /* [len]: only read when a layer is a MISS */
    uint32_t len;                  /* context tokens, >= 1 */
    uint32_t cap;                  /* rows per head in the provider's K/V; 0 means len */
    kvedge_gpu_opt_kv_fn provider; /* required */
    void *arg;
} kvedge_gpu_opt_ctx_t;

/* Uploads w converted to dtype (KVEDGE_DTYPE_FP16, _BF16 or _FP32: fp32 is exact up to summation
 * order, for tests). Matrices and embeddings are stored in dtype, biases and LayerNorm
 * parameters in fp32; activations between kernels are dtype, the residual stream, GEMM outputs
 * and logits fp32 (cuBLAS with CUBLAS_COMPUTE_32F, no TF32). Caller owns *out.
 * Errors: KVEDGE_EINVAL (NULL, a zero or oversized dimension, heads * head_dim != hidden,
 * unsupported dtype, no device or a build without CUDA), KVEDGE_ENOMEM (host or device memory:
 * nothing is left allocated), KVEDGE_EIO (another CUDA or cuBLAS error). */
int kvedge_gpu_opt_new(const kvedge_gpu_opt_weights_t *w, kvedge_dtype_t dtype,
                       kvedge_gpu_opt_t **out);

/* Frees the device weights. Sessions of the model must be destroyed first. NULL-safe;
 * nulls *self_p. */
void kvedge_gpu_opt_destroy(kvedge_gpu_opt_t **self_p);

/* The model's config and dtype (NULL / 0 for NULL). Valid while the model lives. */
const kvedge_gpu_opt_config_t *kvedge_gpu_opt_config(const kvedge_gpu_opt_t *self);
kvedge_dtype_t kvedge_gpu_opt_dtype(const kvedge_gpu_opt_t *self);

/* Runs n tokens (positions 0..n-1) through the model with causal attention over themselves: the
 * recomputation baseline and the cloud side's producer of K/V. logits (vocab floats, host, may be
 * NULL) receives the last position's logits. k_out and v_out (both or neither) are arrays of
 * layers DEVICE pointers, each to heads * n * head_dim elements of the model's dtype, which
 * receive the layer's K and V as [heads][n][head_dim]. Synchronous: returns when the outputs
 * are written. Uses the model's own stream and scratch (kept between calls), under a lock: one
 * prefill at a time per model. Errors: KVEDGE_EINVAL (NULL, n 0, a token outside the vocabulary,
 * only one of k_out/v_out), KVEDGE_ETOOBIG (n over max_positions), KVEDGE_ENOMEM, KVEDGE_EIO. */
int kvedge_gpu_opt_prefill(kvedge_gpu_opt_t *self, const int32_t *tokens, uint32_t n, float *logits,
                           void *const *k_out, void *const *v_out);

/* A decode session: its own stream and cuBLAS handle, scratch grown on demand and kept. One
 * thread at a time. Caller owns *out. Errors: KVEDGE_EINVAL (NULL), KVEDGE_ENOMEM, KVEDGE_EIO. */
int kvedge_gpu_opt_session_new(kvedge_gpu_opt_t *model, kvedge_gpu_opt_session_t **out);

/* Waits for the session's work and frees it. NULL-safe; nulls *self_p. */
void kvedge_gpu_opt_session_destroy(kvedge_gpu_opt_session_t **self_p);

/* The session's stream (every kernel of the session runs on it), so that a caller can make it
 * wait on an event before a layer's K/V is read. NULL for NULL. */
kvedge_gpu_stream_t kvedge_gpu_opt_session_stream(const kvedge_gpu_opt_session_t *self);

/* Starts a decode: the context (ctx, may be NULL for none) at positions 0..ctx->len-1 with its
 * K/V from ctx->provider layer by layer, then the local prompt (prompt_len >= 1 tokens), with
 * room for max_new more tokens. Local tokens attend to all the context K/V and causally to the
 * local K/V (one softmax over both). logits (vocab floats, host, may be NULL) receives the
 * last prompt position's logits. Synchronous. Errors: KVEDGE_EINVAL (NULL, len 0 or cap < len,
 * no provider, a token outside the vocabulary, a provider result other than 0, MISS or a
 * negative code, or 0 with a NULL pointer), KVEDGE_ETOOBIG (ctx len + prompt_len + max_new over
 * max_positions), KVEDGE_ENOMEM, KVEDGE_EIO, or the provider's own negative code. After an error
 * the session must be begun again. */
int kvedge_gpu_opt_session_begin(kvedge_gpu_opt_session_t *self, const kvedge_gpu_opt_ctx_t *ctx,
                                 const int32_t *prompt, uint32_t prompt_len, uint32_t max_new,
                                 float *logits);

/* Appends one token at the next position and writes the new logits (may be NULL). Errors:
 * KVEDGE_EINVAL (not begun, token outside the vocabulary), KVEDGE_ENOSPACE (max_new tokens
 * already appended), KVEDGE_EIO. */
int kvedge_gpu_opt_session_step(kvedge_gpu_opt_session_t *self, int32_t token, float *logits);

/* Greedy: n times the arg-max of the current logits (lowest id on a tie, as
 * kvedge_decoder_argmax), written to tokens[i] and appended. Errors: those of step. */
int kvedge_gpu_opt_session_generate(kvedge_gpu_opt_session_t *self, uint32_t n, int32_t *tokens);

#ifdef __cplusplus
}
#endif
#endif
