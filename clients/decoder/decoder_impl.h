/* Internal to the kvedge_decoder library: what clients/decoder_model.c needs of the model's
 * private state (clients/decoder.c). Not installed and not for callers of the library. */
#ifndef KVEDGE_CLIENTS_DECODER_DECODER_IMPL_H
#define KVEDGE_CLIENTS_DECODER_DECODER_IMPL_H

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

#ifdef __cplusplus
}
#endif
#endif
