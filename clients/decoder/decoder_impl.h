/* Internal to the kvedge_decoder library: what clients/decoder_model.c needs of the model's
 * private state (clients/decoder.c). Not installed and not for callers of the library. */
#ifndef KVEDGE_CLIENTS_DECODER_DECODER_IMPL_H
#define KVEDGE_CLIENTS_DECODER_DECODER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clients/decoder/decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of the model's fp32 weight arrays, the stored lm_head included; 0 before load. */
uint64_t kvedge_decoder_impl_weight_bytes(const kvedge_decoder_t *self);

/* A prefill cut short: tokens (positions 0..n-1) through layers 0..layers-1 only, no logits,
 * K/V discarded; for timing layer work. Errors: KVEDGE_EINVAL (layers 0 or over the model's),
 * and those of kvedge_decoder_prefill. */
int kvedge_decoder_impl_prefill_layers(const kvedge_decoder_t *self, const int32_t *tokens,
                                       uint32_t n, uint32_t layers);

/* What a layer costs on this machine, for kvedge_decoder_estimate: a pass of n tokens over a
 * layer takes fixed_s + dense_flops / dense_rate + scores * score_s, where dense_flops are
 * those of the projections and FFN and scores the attention scores computed (query-key pairs
 * over all heads), each with its share of Q K^T, softmax and P V. */
typedef struct {
    double fixed_s;    /* per pass: streaming the layer's weights, call overheads */
    double dense_rate; /* flops per second of the projections and FFN */
    double score_s;    /* seconds per attention score */
} kvedge_decoder_impl_cost_t;

/* Measures the costs on a model; 0 or an error code. */
typedef int (*kvedge_decoder_impl_measure_fn)(const kvedge_decoder_t *model,
                                              kvedge_decoder_impl_cost_t *cost);

/* The costs kept on the model: the first call runs measure under the model's lock and keeps a
 * result with a positive finite dense_rate and finite non-negative times; concurrent callers
 * wait for it, later ones read it. A failed measurement is not kept. Errors: KVEDGE_EINVAL (not
 * loaded, NULL argument, a result out of range), or measure's own code; *cost is then zero. */
int kvedge_decoder_impl_costs(const kvedge_decoder_t *self, kvedge_decoder_impl_measure_fn measure,
                              kvedge_decoder_impl_cost_t *cost);

/* What kvedge_decoder_observe has learned on a model (decoder_model.c owns the rule): per kind
 * (0 compute, 1 recompute) the log of the factor on the calibrated estimate and the samples
 * folded in. Zero on a new model: nothing learned. */
#define KVEDGE_DECODER_IMPL_KINDS 2
typedef struct {
    double log_f[KVEDGE_DECODER_IMPL_KINDS];
    uint64_t samples[KVEDGE_DECODER_IMPL_KINDS];
} kvedge_decoder_impl_learn_t;

/* Runs fn on the model's learned state under the model's learning lock (fn may read and
 * write it; it must not call back into the model). Errors: KVEDGE_EINVAL (NULL). */
int kvedge_decoder_impl_learned(const kvedge_decoder_t *self,
                                void (*fn)(void *arg, kvedge_decoder_impl_learn_t *learn),
                                void *arg);

/* What a Hugging Face config.json says of a model (kvedge_decoder_impl_parse_config). */
typedef struct {
    char model_type[16];         /* "opt", "llama", "mistral" or "qwen2" */
    kvedge_decoder_config_t cfg; /* shape; for OPT only heads and layers are read */
    uint32_t kv_heads;           /* num_key_value_heads (num_attention_heads when absent) */
    double norm_eps;             /* rms_norm_eps (Llama family) */
    double rope_theta;           /* rotary base; 10000 when not given */
    bool rope_llama3;            /* rope_scaling of rope_type "llama3" */
    double rope_factor, rope_low, rope_high; /* its factor, low_freq_factor, high_freq_factor */
    double rope_orig_max;                    /* its original_max_position_embeddings */
    bool tie_embeddings;                     /* tie_word_embeddings: the head is embed_tokens */
    bool attention_bias; /* Llama's attention_bias: q/k/v/o projections carry biases */
} kvedge_decoder_impl_hf_config_t;

/* Parses len bytes of config.json. Refuses, naming the field and its value in err, an
 * unsupported model_type or feature: sliding-window attention in use, MLA (kv_lora_rank,
 * q_lora_rank), partial_rotary_factor other than 1, soft-capping (attn_logit_softcapping,
 * final_logit_softcapping), MoE (num_experts, num_local_experts), a rope_scaling other than
 * llama3's, an activation other than silu (ReLU for OPT), mlp_bias; and missing or
 * out-of-range sizes. Errors: KVEDGE_EINVAL (NULL argument, or a refusal above),
 * KVEDGE_ECORRUPT (not JSON, a field missing or of the wrong type or range). */
int kvedge_decoder_impl_parse_config(const char *json, size_t len,
                                     kvedge_decoder_impl_hf_config_t *out, char *err,
                                     size_t err_bytes);

#ifdef __cplusplus
}
#endif
#endif
