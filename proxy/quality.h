/* The quality profile of a model: for each layer and precision-ladder rung, what storing only
 * that layer at that rung (every other layer lossless) costs in quality, as `kvedge eval
 * --profile-out` measures it; the edge proxy's planner reads it to choose per layer the
 * precision it fetches under a quality budget ("ppl:0.5%", "kl:1e-4").
 *
 * The file (JSON, version 1; unknown fields are ignored, so later writers may add some):
 *
 *   {
 *     "kvedge_quality_profile": 1,          required: the format version, exactly 1
 *     "model": "kjv-cloud",                 required: base model id, 1..128 bytes
 *     "layers": 6,                          required: 1..KVEDGE_QUALITY_MAX_LAYERS
 *     "context_tokens": 256,                optional provenance (non-negative integers):
 *     "continuation_tokens": 128,             the eval's shared context, scored continuation,
 *     "documents": 54,                        documents measured and positions scored
 *     "positions": 6912,
 *     "lossless_ppl": 55.76,                optional, ignored here: lossless perplexity
 *     "rungs": ["int8", "int4-g32"],        required: 1..16 ladder rungs (kvedge_prec_name's
 *                                             names, "int4" alone is int4-g32; "tc"), none twice
 *     "per_layer": [                        required: exactly `layers` rows, row i layer i
 *       {"layer": 0,
 *        "ppl_pct":   [0.0004, 0.0010],     perplexity change vs lossless, percent (> -100)
 *        "kl":        [8e-8, 8.4e-6],       mean KL(lossless-context reference || rung), nats
 *        "agreement": [0.9999, 0.9975]},    greedy next-token agreement with it, 0..1
 *       ...],                               each array one entry per rung, in "rungs" order
 *     "whole_model": [                      optional: every layer at the rung at once
 *       {"rung": "int8", "ppl_pct": 0.00016, "kl": 8.3e-8, "agreement": 0.9997,
 *        "bytes_over_fp16": 0.536}]         (bytes_over_fp16 optional, >= 0)
 *   }
 *
 * Every number must be finite (JSON null is refused). A row for lossless may be listed; its
 * cost is 0 whatever the file says. */
#ifndef KVEDGE_PROXY_QUALITY_H
#define KVEDGE_PROXY_QUALITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/proto.h"
#include "access/codec/prec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The format version this code reads and kvedge eval writes. */
#define KVEDGE_QUALITY_VERSION 1
/* Hard limits on a profile: file size, layers, rungs (the whole ladder has 16: five bases at
 * three ThinK levels, and tc). */
#define KVEDGE_QUALITY_MAX_FILE_BYTES (4u << 20)
#define KVEDGE_QUALITY_MAX_LAYERS     1024
#define KVEDGE_QUALITY_MAX_RUNGS      16
/* The metric (kvedge_quality_metric_t), its names (kvedge_quality_metric_name), the budget
 * bounds (KVEDGE_QUALITY_PPL_PCT_MAX, KVEDGE_QUALITY_KL_MAX) and the budget syntax
 * (kvedge_quality_budget_parse: "ppl:0.5%", "kl:1e-4", "none") are the wire's, in
 * access/proto.h, so clients parse budgets without the proxy. */

typedef struct kvedge_quality_profile_t kvedge_quality_profile_t;

/* One measurement as the file holds it (no clamping). */
typedef struct {
    double ppl_pct;   /* perplexity change against lossless, percent; may be negative */
    double kl;        /* mean KL, nats; >= 0 */
    double agreement; /* greedy agreement, 0..1 */
} kvedge_quality_figures_t;

/* Reads and checks a profile file (format above). *out is the caller's (free with
 * kvedge_quality_destroy); it is NULL on any failure, and why (when given) names the path and
 * what is wrong with it. Errors: KVEDGE_EINVAL (NULL arguments, a malformed or invalid
 * profile), KVEDGE_EVERSION (a version other than KVEDGE_QUALITY_VERSION), KVEDGE_EIO (the
 * file cannot be opened or read, or is not a regular file), KVEDGE_ETOOBIG (over
 * KVEDGE_QUALITY_MAX_FILE_BYTES, or over the layer or rung limits), KVEDGE_ENOMEM. */
int kvedge_quality_load(const char *path, kvedge_quality_profile_t **out, char *why,
                        size_t why_len);

/* The same from len bytes of JSON in memory (need not be NUL-terminated; nothing but
 * whitespace may follow the object). Errors as kvedge_quality_load's, less KVEDGE_EIO. */
int kvedge_quality_parse(const char *json, size_t len, kvedge_quality_profile_t **out, char *why,
                         size_t why_len);

/* Frees a profile. NULL-safe, idempotent; nulls *self_p. */
void kvedge_quality_destroy(kvedge_quality_profile_t **self_p);

/* The file's fields. Strings live as long as the profile. */
const char *kvedge_quality_model(const kvedge_quality_profile_t *self);
uint32_t kvedge_quality_layers(const kvedge_quality_profile_t *self);
uint32_t kvedge_quality_context_tokens(const kvedge_quality_profile_t *self);      /* 0: absent */
uint32_t kvedge_quality_continuation_tokens(const kvedge_quality_profile_t *self); /* 0: absent */
uint64_t kvedge_quality_documents(const kvedge_quality_profile_t *self);           /* 0: absent */
/* The rungs the file measures, in its order: i in 0 .. kvedge_quality_n_rungs - 1 (else
 * KVEDGE_PREC_STORED). */
size_t kvedge_quality_n_rungs(const kvedge_quality_profile_t *self);
kvedge_prec_t kvedge_quality_rung(const kvedge_quality_profile_t *self, size_t i);
/* True when kvedge_quality_cost can price the rung: lossless, or a rung the file measures. */
bool kvedge_quality_has(const kvedge_quality_profile_t *self, kvedge_prec_t rung);

/* The budgeting cost of storing `layer` alone at `rung`: the file's perplexity change in
 * percent (KVEDGE_QUALITY_PPL_PCT) or KL in nats (KVEDGE_QUALITY_KL). Lossless costs 0. A negative
 * perplexity change is returned as 0: it is measurement noise on a finite held-out set, or a lossy
 * scheme (ThinK) happening to suit that text, not a gain the planner may spend on another layer's
 * loss (KL, which cannot be negative, shows the distribution did move); clamping keeps a sum of
 * costs conservative. Errors: KVEDGE_EINVAL (NULL, layer >= layers, an invalid rung or
 * KVEDGE_PREC_STORED, a metric other than those two: KVEDGE_QUALITY_NONE has no cost),
 * KVEDGE_ENOTFOUND (a valid rung the profile does not measure: the planner treats it as unusable
 * unless its policy says otherwise). *cost is untouched on error. */
int kvedge_quality_cost(const kvedge_quality_profile_t *self, uint32_t layer, kvedge_prec_t rung,
                        kvedge_quality_metric_t metric, double *cost);

/* The figures as measured (unclamped) for one layer at a rung; lossless is all 0 with
 * agreement 1. Errors as kvedge_quality_cost's. */
int kvedge_quality_figures(const kvedge_quality_profile_t *self, uint32_t layer, kvedge_prec_t rung,
                           kvedge_quality_figures_t *out);

/* The whole-model figures (every layer at the rung), when the file has them: a check on how
 * far per-layer costs add up. Errors: KVEDGE_EINVAL (NULL, an invalid rung), KVEDGE_ENOTFOUND
 * (the file has no whole-model row for it). Lossless is all 0 with agreement 1. */
int kvedge_quality_whole(const kvedge_quality_profile_t *self, kvedge_prec_t rung,
                         kvedge_quality_figures_t *out);

#ifdef __cplusplus
}
#endif
#endif
