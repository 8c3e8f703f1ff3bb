/* The reference decoder: a CPU, fp32 implementation of the OPT architecture (Hugging Face OPT
 * with do_layer_norm_before, as OPT-125m and OPT-1.3B) and of the Llama family (Llama, Mistral
 * without sliding windows, Qwen2: rotary positions, grouped-query attention, RMSNorm, SwiGLU) that
 * prefills a shared context into per-layer K/V and decodes a local prompt on top of context K/V it
 * is handed layer by layer. docs/decoder.md has the model details and the tolerances the tests hold
 * it to. */
#ifndef KVEDGE_CLIENTS_DECODER_DECODER_H
#define KVEDGE_CLIENTS_DECODER_DECODER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Head size every released OPT model uses; the default when a file names no head count. */
#define KVEDGE_DECODER_HEAD_DIM_DEFAULT 64
/* HF's OPTLearnedPositionalEmbedding: position p reads row p + 2 of embed_positions. */
#define KVEDGE_DECODER_POSITION_OFFSET 2
/* Returned by a kvedge_decoder_kv_fn for a layer the decoder must compute itself. */
#define KVEDGE_DECODER_MISS 1
/* Returned by a kvedge_decoder_kv_fn whose layer is already in the k and v it was handed:
 * written there by whoever the session lent its storage to (kvedge_decoder_session_ctx_kv).
 * Only a reserved session accepts it (else the decode fails with KVEDGE_EINVAL). */
#define KVEDGE_DECODER_IN_PLACE 2

/* The shape of a loaded model: an OPT model's derived from its tensors, a Llama-family model's
 * from its config.json (checked against the tensors). */
typedef struct {
    uint32_t layers;
    uint32_t heads;         /* query heads */
    uint32_t head_dim;      /* hidden / heads for OPT; config.json's head_dim where it says */
    uint32_t hidden;        /* embedding and residual width */
    uint32_t ffn;           /* fc1 (OPT) or gate_proj/up_proj (SwiGLU) output width */
    uint32_t vocab;         /* rows of embed_tokens, and logits per position */
    uint32_t max_positions; /* OPT: rows of embed_positions minus 2; else max_position_embeddings */
    uint32_t kv_heads;      /* K/V heads (grouped-query attention); 0 in a shape = heads */
} kvedge_decoder_config_t;

typedef struct _kvedge_decoder_t kvedge_decoder_t;
typedef struct _kvedge_decoder_session_t kvedge_decoder_session_t;

/* Provides the context's K and V of one layer. Called for layer l (0, 1, ... in order, once
 * each) right before layer l runs, so a pipelined loader may block in it until layer l is
 * resident. k and v each hold kv_heads * ctx_tokens * head_dim floats, laid out
 * [kv_heads][ctx_tokens][head_dim]; the callback fills both and returns 0, or returns
 * KVEDGE_DECODER_IN_PLACE when they already hold the layer complete (a reserved session whose
 * storage a loader wrote: no copy). It returns KVEDGE_DECODER_MISS when it has no copy of the
 * layer or the plan says to compute it locally (k and v are then left to the decoder, which
 * overwrites all of them: whatever a failed load left there is never read), or a negative
 * KVEDGE_E* code, which aborts the decode with that code. The buffers belong to the session;
 * they are not to be kept. */
typedef int (*kvedge_decoder_kv_fn)(void *arg, uint32_t layer, float *k, float *v);

/* Allocates an empty model; NULL when out of memory. Caller owns the return value. */
kvedge_decoder_t *kvedge_decoder_new(void);

/* Frees the model and its weights. Sessions of the model must be destroyed first. NULL-safe;
 * nulls *self_p. */
void kvedge_decoder_destroy(kvedge_decoder_t **self_p);

/* Loads a model. path is either an OPT safetensors file (below) or a Hugging Face model
 * directory: config.json (its model_type picks the architecture: "opt", "llama" (Llama 2/3,
 * SmolLM2), "mistral" (without sliding-window attention), "qwen2") and model.safetensors or
 * model.safetensors.index.json with its shards, with HF's tensor names; docs/decoder.md lists
 * what is supported and what is refused. A directory's errors start with the file they are
 * about. For a directory, heads must be 0 or config.json's num_attention_heads.
 * An OPT file: weights from a safetensors file with the Hugging Face names (with or without the
 * leading "model."), converting F16/BF16 to fp32. Sizes come from the tensors; the head count
 * is heads when non-zero, else __metadata__'s "num_attention_heads", else hidden / 64. Every
 * tensor's shape is checked against that config. Errors: those of kvedge_safetensors_open,
 * KVEDGE_ENOTFOUND (a tensor is missing), KVEDGE_ESHAPE (a tensor's shape does not fit the
 * config, or the heads do not divide hidden), KVEDGE_EINVAL (already loaded, or an
 * unsupported OPT variant such as project_in/out), KVEDGE_ENOMEM. kvedge_decoder_error() says
 * which tensor. */
int kvedge_decoder_load(kvedge_decoder_t *self, const char *path, uint32_t heads);

/* Detail of the last load failure ("" when none); static to the model. */
const char *kvedge_decoder_error(const kvedge_decoder_t *self);

/* The config of a loaded model (all zero before load). Valid while the model lives. */
const kvedge_decoder_config_t *kvedge_decoder_config(const kvedge_decoder_t *self);

/* K/V heads of a loaded model: heads for OPT; config.json's num_key_value_heads for the Llama
 * family (grouped-query attention: query head h reads KV head h / (heads / kv_heads)). 0
 * before load. */
uint32_t kvedge_decoder_kv_heads(const kvedge_decoder_t *self);

/* ---- Rotary settings (clients/decoder/rope.c) ----
 * What a model's K rotation is made of: config.json's rope_theta and Llama 3's rope_scaling.
 * Two models whose settings are equal (kvedge_decoder_rope_equal) rotate K the same way. */
#define KVEDGE_DECODER_ROPE_HEAD_DIM_MAX 4096u
typedef struct {
    bool rotary;             /* false: learned positions (OPT), every other field 0 */
    double theta;            /* rope_theta, the frequency base */
    bool llama3;             /* rope_scaling of rope_type "llama3" */
    double factor;           /* its factor */
    double low_freq_factor;  /* its low_freq_factor */
    double high_freq_factor; /* its high_freq_factor */
    double original_max;     /* its original_max_position_embeddings */
} kvedge_decoder_rope_t;

/* The rotary settings of a loaded model (rotary false for OPT and before load). Errors:
 * KVEDGE_EINVAL (NULL). */
int kvedge_decoder_rope(const kvedge_decoder_t *self, kvedge_decoder_rope_t *out);

/* Whether a and b rotate K alike: both not rotary, or the same theta and scaling. */
bool kvedge_decoder_rope_equal(const kvedge_decoder_rope_t *a, const kvedge_decoder_rope_t *b);

/* 0 when r is usable: not rotary, or theta in [1, 1e12] and, with llama3, a positive factor,
 * 0 < low_freq_factor < high_freq_factor and a positive original_max, all finite; else
 * KVEDGE_EINVAL. */
int kvedge_decoder_rope_check(const kvedge_decoder_rope_t *r);

/* The head_dim / 2 rotary frequencies of r (Llama 3's scaling applied), exactly those the
 * decoder's forward uses. Errors: KVEDGE_EINVAL (NULL, r not rotary or not usable, head_dim
 * odd, 0 or over KVEDGE_DECODER_ROPE_HEAD_DIM_MAX). */
int kvedge_decoder_rope_freqs(const kvedge_decoder_rope_t *r, uint32_t head_dim, float *inv_freq);

/* Rotates x, [heads][tokens][head_dim] (a layer of K as the decoder stores it), in place as the
 * forward rotates K at positions pos0..pos0 + tokens - 1 (Hugging Face's rotate-half layout:
 * channels j and j + head_dim / 2 turn together), or, with inverse, takes that rotation off
 * (the same angles, turned back): un-rotating then rotating with the same settings gives x
 * back to fp32 rounding. r not rotary: x is left as it is. Errors: KVEDGE_EINVAL (NULL, heads
 * or tokens 0, r not usable, positions past 2^32, head_dim as kvedge_decoder_rope_freqs),
 * KVEDGE_ENOMEM. */
int kvedge_decoder_rope_apply(const kvedge_decoder_rope_t *r, uint32_t head_dim, float *x,
                              uint32_t heads, uint32_t tokens, uint32_t pos0, bool inverse);

/* What makes a rotary model's stored K what it is: a 32-bit FNV-1a hash of its rotary
 * frequencies (rope_theta and Llama 3's rope_scaling, as the decoder computes them per
 * channel pair), never 0; 0 for a model with learned positions (OPT) or before load. Two
 * models of the same shape whose fingerprints differ rotate K differently: a context one
 * prefilled must not be decoded with the other (clients/e2e/e2e.h, kvedge_e2e_model). */
uint32_t kvedge_decoder_rope_fingerprint(const kvedge_decoder_t *self);

/* The same fingerprint from rotary settings alone: what kvedge_decoder_rope_fingerprint gives
 * for a loaded model with settings r and this head_dim (the hash of kvedge_decoder_rope_freqs);
 * 0 when r is not rotary or not usable. Lets an engine without the decoder (the llama.cpp
 * bridge, clients/llamacpp/bridge.h) name a context as the decoder does. */
uint32_t kvedge_decoder_rope_fingerprint_of(const kvedge_decoder_rope_t *r, uint32_t head_dim);

/* Floats in one layer of K (or V) for tokens tokens: kv_heads * tokens * head_dim. K is stored
 * as attention reads it: for rotary models after the rotation (Hugging Face's rotate-half
 * layout, unscaled), so a fetched layer is used as it is and a recomputed one is identical. */
size_t kvedge_decoder_kv_floats(const kvedge_decoder_t *self, uint32_t tokens);

/* Runs n tokens (positions 0..n-1) through the model: what a cloud node does with a shared
 * context. logits (vocab floats) receives the logits of the last position; k_out and v_out
 * (layers * kvedge_decoder_kv_floats(n) floats each, [layers][kv_heads][n][head_dim]) receive the
 * context's K and V. Each output may be NULL; k_out and v_out go together. The model is only
 * read, so threads may prefill on one model at once. Errors: KVEDGE_EINVAL (no model, n == 0,
 * a token outside the vocabulary, only one of k_out/v_out), KVEDGE_ETOOBIG (n over
 * max_positions), KVEDGE_ENOMEM. */
int kvedge_decoder_prefill(const kvedge_decoder_t *self, const int32_t *tokens, uint32_t n,
                           float *logits, float *k_out, float *v_out);

/* Receives the output of layer l of a traced prefill (kvedge_decoder_prefill_trace): hidden
 * holds the residual stream after the layer, [n][hidden] (before the final LayerNorm for the
 * last layer); q the layer's queries as attention uses them, SCALED (and rotated, for rotary
 * models): (LN(x) Wq^T + bq) * head_dim^-0.5, [heads][n][head_dim]; k and v the layer's K and V,
 * [kv_heads][n][head_dim]. Called for layers 0, 1, ... in order, once each. The buffers belong to
 * the prefill and are valid only during the call. Returns 0, or a negative KVEDGE_E* code, which
 * aborts the prefill with that code. */
typedef int (*kvedge_decoder_layer_fn)(void *arg, uint32_t layer, const float *hidden, uint32_t n,
                                       const float *q, const float *k, const float *v);

/* kvedge_decoder_prefill with no outputs but trace, called after every layer: how an analysis
 * (layer matching, clients/e2e/layermap.h) reads per-layer hidden states. The numbers are those of
 * kvedge_decoder_prefill to the bit; a plain prefill only tests a NULL pointer per layer.
 * Errors: those of kvedge_decoder_prefill, KVEDGE_EINVAL (trace NULL), or trace's own code. */
int kvedge_decoder_prefill_trace(const kvedge_decoder_t *self, const int32_t *tokens, uint32_t n,
                                 kvedge_decoder_layer_fn trace, void *arg);

/* Allocates a decode session on a loaded model, which must outlive it; NULL when out of memory
 * or the model is not loaded. A session is used by one thread at a time. Caller owns it. */
kvedge_decoder_session_t *kvedge_decoder_session_new(const kvedge_decoder_t *model);

/* Frees the session. NULL-safe; nulls *self_p. */
void kvedge_decoder_session_destroy(kvedge_decoder_session_t **self_p);

/* Starts a decode: the shared context ctx_tokens[0..ctx_len) occupies positions 0..ctx_len-1
 * and its K/V comes from provider, one layer at a time; the local prompt (prompt_len >= 1
 * tokens) follows at ctx_len.., and room is kept for max_new more tokens. Attention of local
 * tokens is computed over the context K/V and over the local K/V separately and merged exactly
 * by their log-sum-exp weights. A layer the provider reports as MISS is recomputed: the
 * session keeps the context's hidden state and runs it lazily up to that layer, so a MISS at
 * layer l costs a prefill of the context through layers c..l, where c is the first layer the
 * context has not yet been run through (at most one full context prefill per decode). Context
 * tokens are needed only for that. With ctx_len == 0 the provider is not called (it may be
 * NULL). logits (vocab floats, may be NULL) receives the last prompt position's logits.
 * Errors: KVEDGE_EINVAL (bad arguments, a token outside the vocabulary), KVEDGE_ETOOBIG
 * (ctx_len + prompt_len + max_new over max_positions), KVEDGE_ENOMEM, or the provider's own
 * negative code. After an error the session must be begun again. On a reserved session
 * (kvedge_decoder_session_reserve) begin uses the reserved buffers and keeps them, on error
 * too; ctx_len must be the reserved one and prompt_len + max_new at most the reserved
 * (else KVEDGE_EINVAL). */
int kvedge_decoder_session_begin(kvedge_decoder_session_t *self, const int32_t *ctx_tokens,
                                 uint32_t ctx_len, kvedge_decoder_kv_fn provider, void *arg,
                                 const int32_t *prompt, uint32_t prompt_len, uint32_t max_new,
                                 float *logits);

/* Appends one token at the next position (its K/V joins the local cache) and writes the new
 * last-position logits (vocab floats, may be NULL). Errors: KVEDGE_EINVAL (not begun, token
 * outside the vocabulary), KVEDGE_ENOSPACE (max_new tokens already appended), KVEDGE_ENOMEM. */
int kvedge_decoder_session_step(kvedge_decoder_session_t *self, int32_t token, float *logits);

/* Greedy generation: n times, takes the arg-max of the current logits (lowest id on a tie),
 * writes it to tokens[i] and appends it with kvedge_decoder_session_step, so every generated
 * token is in the local cache afterwards. Errors: those of session_step. */
int kvedge_decoder_session_generate(kvedge_decoder_session_t *self, uint32_t n, int32_t *tokens);

/* The greedy pick: the arg-max of vocab logits, the lowest id on a tie (what
 * kvedge_decoder_session_generate takes). */
int32_t kvedge_decoder_argmax(const float *logits, uint32_t vocab);

/* The greedy pick with a repetition penalty (CTRL, Keskar et al. 2019, as Hugging Face's
 * repetition_penalty): every token id in seen[0..n) has its logit divided by penalty when
 * positive, multiplied when negative, before the arg-max. penalty <= 1 (or n == 0): the plain
 * arg-max. Deterministic, so every mode that decodes the same logits picks the same tokens.
 * logits are not changed. */
int32_t kvedge_decoder_pick(const float *logits, uint32_t vocab, const int32_t *seen, size_t n,
                            float penalty);

/* Logits of the last position decoded so far (vocab floats), or NULL before a successful begin.
 * Valid until the next call on the session. */
const float *kvedge_decoder_session_logits(const kvedge_decoder_session_t *self);

/* Tokens in the local cache (prompt plus appended tokens). */
uint32_t kvedge_decoder_session_local_tokens(const kvedge_decoder_session_t *self);

/* ---- Context K/V in place (docs/decoder.md, "Context K/V in place") ----
 * A loader may write the context K/V straight into the session instead of into buffers of
 * its own that the provider then copies: reserve the session's buffers for the decode's
 * shape, hand the loader the storage of each layer (kvedge_decoder_session_ctx_kv), and let
 * the provider return KVEDGE_DECODER_IN_PLACE for a layer the loader completed. A layer the
 * provider reports as MISS is computed into the same storage, so the loader must not write a
 * layer after reporting it missed (clients/lib/pipeline.h: a missed or failed layer is never
 * written, nothing is written after destroy). */

/* Allocates the session's buffers for a decode of ctx_len context tokens, a prompt of
 * prompt_len tokens and max_new more, and keeps them: the context K/V storage stays at the
 * same address until the session is destroyed or reserved again; begin (whether it succeeds
 * or fails) neither frees nor moves it, so a loader may write it before, during and after a
 * begin. A begin on a reserved session must have this ctx_len and prompt_len + max_new at
 * most this one's (else KVEDGE_EINVAL). Drops any earlier decode or reservation.
 * Errors: KVEDGE_EINVAL (NULL, prompt_len 0), KVEDGE_ETOOBIG (over max_positions),
 * KVEDGE_ENOMEM; the session is then unreserved. */
int kvedge_decoder_session_reserve(kvedge_decoder_session_t *self, uint32_t ctx_len,
                                   uint32_t prompt_len, uint32_t max_new);

/* The context K and V storage of one layer of a reserved session: *k and *v each hold
 * kvedge_decoder_kv_floats(ctx_len) fp32, [kv_heads][ctx_len][head_dim]: the buffers the provider
 * is handed for that layer. Valid until the session is destroyed or reserved again; the
 * session writes them only while computing a layer its provider reported as MISS.
 * Errors: KVEDGE_EINVAL (NULL argument, not reserved, ctx_len 0, layer out of range; *k and
 * *v are then NULL). */
int kvedge_decoder_session_ctx_kv(kvedge_decoder_session_t *self, uint32_t layer, float **k,
                                  float **v);

/* Bytes of K/V and context state the last begin held at its peak (and its session still holds
 * the K/V): context and local K/V (reserved sizes on a reserved session), plus the context's
 * hidden state ([ctx_len][hidden]) and one layer's K/V scratch when a MISS made it run the
 * context (the scratch only when a fetched layer came before the missed one). 0 before any
 * begin (on a reserved session: its reserved K/V); counts a failed begin up to its failure. */
uint64_t kvedge_decoder_session_kv_bytes(const kvedge_decoder_session_t *self);

/* ---- Model shapes, synthetic weights and cost estimates (clients/decoder_model.c) ---- */

/* The shape of a released model by name: "opt-125m" (12 layers, 12 heads, hidden 768,
 * ffn 3072), "opt-1.3b" (24, 32, 2048, 8192), "opt-2.7b" (32, 32, 2560, 10240); vocab 50272,
 * 2048 positions; "opt-tiny" (the shape of tests/fixtures/opt_tiny.safetensors); and the Llama
 * family's "llama-3.2-1b" (16 layers, 32 query / 8 KV heads of 64, hidden 2048, ffn 8192, vocab
 * 128256), "llama-3.2-3b" (28, 24 / 8 of 128, 3072, 8192), "qwen2.5-0.5b" (24, 14 / 2 of 64,
 * 896, 4864, vocab 151936), "qwen2.5-1.5b" (28, 12 / 2 of 128, 1536, 8960), "smollm2-360m"
 * (32, 15 / 5 of 64, 960, 2560, vocab 49152), from their published config.json. kv_heads is
 * filled for every shape. Returns 0 or KVEDGE_ENOMODEL. */
int kvedge_decoder_shape(const char *name, kvedge_decoder_config_t *out);

/* The Hugging Face model_type of a named shape ("opt", "llama", "qwen2"), or NULL for a name
 * kvedge_decoder_shape does not know. Static. */
const char *kvedge_decoder_shape_arch(const char *name);

/* The i-th name kvedge_decoder_shape knows (from 0), NULL past the last. Static. */
const char *kvedge_decoder_shape_name(size_t i);

/* Writes an OPT safetensors file of shape c with the Hugging Face tensor names and seeded
 * random weights (normal, std 0.02 as OPT's initializer; LayerNorm weight 1, bias 0; biases
 * 0), in fp16 (else fp32), with __metadata__ num_attention_heads, num_hidden_layers,
 * hidden_size, ffn_dim, vocab_size, max_position_embeddings. Same seed, same bytes. For demos
 * and benchmarks where the real weights are not at hand: the outputs are meaningless text but
 * every cost is that of the real model. Written to a temporary file and renamed. Errors:
 * KVEDGE_EINVAL (empty path, or bad shape: zero sizes, heads not dividing hidden, head_dim
 * other than hidden / heads, over 1024 layers or heads, a size over 2^24), KVEDGE_EIO (errno
 * holds the cause), KVEDGE_ENOMEM. */
int kvedge_decoder_synthesize(const char *path, const kvedge_decoder_config_t *c, uint64_t seed,
                              bool fp16);

/* Writes a Hugging Face model directory dir (created if missing) of a Llama-family model of
 * shape c: config.json (model_type "llama" or "qwen2", c's sizes with num_key_value_heads
 * c->kv_heads and head_dim c->head_dim, rope_theta, Llama 3.2's rope_scaling when
 * llama3_scaling, tied embeddings) and model.safetensors with HF's tensor names: matrices and
 * the embedding normal with std 0.02, RMSNorm weights 1, qwen2's Q/K/V biases 0; fp16 or fp32.
 * What kvedge_decoder_load reads back. Same seed, same bytes. Errors: KVEDGE_EINVAL (empty
 * dir, another model_type, rope_theta <= 1, a bad shape: a zero size, an odd head_dim,
 * kv_heads not dividing heads, sizes over the limits of kvedge_decoder_synthesize), KVEDGE_EIO
 * (errno holds the cause), KVEDGE_ENOMEM. */
int kvedge_decoder_synthesize_hf(const char *dir, const char *model_type,
                                 const kvedge_decoder_config_t *c, double rope_theta,
                                 bool llama3_scaling, uint64_t seed, bool fp16);

/* Synthetic weights of a named shape (kvedge_decoder_shape): an OPT shape as the safetensors
 * file out (kvedge_decoder_synthesize), a Llama-family one as the model directory out
 * (kvedge_decoder_synthesize_hf, with the model's published rope_theta and scaling).
 * Errors: KVEDGE_ENOMODEL (unknown name), those of the two writers. */
int kvedge_decoder_synthesize_shape(const char *name, const char *out, uint64_t seed, bool fp16);

/* The Hugging Face model_type of a loaded model ("opt", "llama", "mistral", "qwen2"); "" before
 * load. A safetensors file loads as "opt". Static. */
const char *kvedge_decoder_arch(const kvedge_decoder_t *self);

/* Bytes of the loaded fp32 weights. 0 before load. */
uint64_t kvedge_decoder_weights_bytes(const kvedge_decoder_t *self);

/* Floating-point operations of one layer: over prompt_len local tokens attending to ctx_len
 * context tokens (compute), and over the ctx_len context tokens themselves (recompute). */
void kvedge_decoder_layer_flops(const kvedge_decoder_config_t *c, uint32_t ctx_len,
                                uint32_t prompt_len, double *compute, double *recompute);

/* Estimated microseconds of layer work for a decode (the same for every layer of an OPT
 * model): *compute_us for the prompt's tokens over the context, *recompute_us for computing
 * the layer's context K/V. From kvedge_decoder_layer_flops and this machine's measured rate:
 * the first call on a model times a bare attention and two one-layer prefills (about 0.1 s on
 * opt-125m) and keeps the costs (the prior); each is then multiplied by its kind's learned
 * factor (kvedge_decoder_observe; 1 until something is observed). Thread-safe.
 * Errors: KVEDGE_EINVAL (not loaded, zero prompt_len), the prefill's errors. */
int kvedge_decoder_estimate(const kvedge_decoder_t *self, uint32_t ctx_len, uint32_t prompt_len,
                            float *compute_us, float *recompute_us);

/* ---- Learning the decoder's speed (clients/decoder_model.c, docs/decoder.md) ----
 * The one-time calibration times the decoder alone; in a real decode it shares the cores with
 * the fetch path and runs slower (2.6x on a 2-core CPU edge). Observed layer times correct the
 * estimate: per kind (compute, recompute) a factor f, the observed time over the calibrated
 * estimate for the same ctx_len and prompt_len, learned as a moving average in log space with
 * a bounded step, so the flop model still carries the shape of a request and one outlier
 * cannot wreck it:
 *   r = clamp(observed / prior, LEARN_MIN, LEARN_MAX)
 *   log f += LEARN_WEIGHT * clamp(log r - log f, -LEARN_STEP_MAX, +LEARN_STEP_MAX)
 * A steady ratio k in [1/4, 4] is within 5 % after KVEDGE_DECODER_LEARN_SAMPLES samples (any k
 * in range: 22); one sample moves f by at most 2^0.25 = 1.19x; f never leaves
 * [LEARN_MIN, LEARN_MAX]. */
#define KVEDGE_DECODER_LEARN_MIN      0.125
#define KVEDGE_DECODER_LEARN_MAX      16.0
#define KVEDGE_DECODER_LEARN_WEIGHT   0.25
#define KVEDGE_DECODER_LEARN_STEP_MAX 0.69314718055994531 /* log 2 */
#define KVEDGE_DECODER_LEARN_SAMPLES  16

/* What a model has learned of its speed. */
typedef struct {
    double compute;   /* factor on the calibrated compute estimate; 1 when none observed */
    double recompute; /* factor on the calibrated recompute estimate; 1 when none observed */
    uint64_t compute_samples, recompute_samples; /* observations taken since the last forget */
} kvedge_decoder_speed_t;

/* Feeds one observed layer back: the decoder spent compute_us on one layer over prompt_len
 * prompt tokens attending to ctx_len context tokens, and recompute_us more computing one
 * layer's context K/V (the extra time of a computed layer, per layer the context was run
 * through). A negative value means not measured; a recompute_us with ctx_len 0 is ignored; 0
 * counts (it pulls the factor towards KVEDGE_DECODER_LEARN_MIN, no further). Measures the
 * prior first when kvedge_decoder_estimate has not. The learned factors live on the model (the
 * one state besides the cost cache that changes after load, under its own lock), for as long
 * as it does. Thread-safe.
 * Errors: KVEDGE_EINVAL (not loaded, zero prompt_len, a NaN or infinite time, nothing
 * measured), the calibration's errors. Nothing is learned on an error. */
int kvedge_decoder_observe(const kvedge_decoder_t *self, uint32_t ctx_len, uint32_t prompt_len,
                           double compute_us, double recompute_us);

/* The factors learned so far (1 and 0 samples for a model nothing was observed on).
 * Errors: KVEDGE_EINVAL (NULL argument, not loaded). Thread-safe. */
int kvedge_decoder_speed(const kvedge_decoder_t *self, kvedge_decoder_speed_t *out);

/* Drops what was learned: estimates are the calibration's again (the calibration is kept).
 * NULL-safe, thread-safe. */
void kvedge_decoder_forget(const kvedge_decoder_t *self);

/* ---- Sharing the cores with a fetch (clients/decoder_model.c, docs/decoder.md) ----
 * While a context's layers arrive, the receive path (the client's I/O thread, the loader's
 * verify and dequantize) runs on the same cores as the decoder's GEMMs. When the decoder is
 * ahead of the fetch (the layer after the one it computes has not arrived), its speed is not
 * on the critical path but the fetch's is: a decode that holds a share runs its BLAS on
 * KVEDGE_DECODER_FETCH_THREADS fewer threads (at least 1), leaving those cores to the fetch;
 * when the next layer is already there, it gives the share back and computes on all of them.
 * OpenBLAS keeps one thread count per process, so the shares are counted process-wide: the
 * count in use when the first share is taken is restored when the last one is given back
 * (an application that sets OpenBLAS's threads itself should do so with no decode running).
 * *held is the caller's own flag (false to start): taking a share held, or giving back one
 * not held, does nothing. Thread-safe. Returns the threads BLAS now runs on. */
#define KVEDGE_DECODER_FETCH_THREADS 2
int kvedge_decoder_share_cores(bool *held, bool share);

#ifdef __cplusplus
}
#endif
#endif
