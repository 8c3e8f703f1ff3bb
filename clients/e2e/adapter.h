/* Adapting a cloud model's context K/V to an edge model's shape (CE-LSLM section V-A/V-B,
 * docs/largesmall.md "Adapting the cloud's K/V"): for every edge layer a layer map
 * (clients/e2e/layermap.h) gives a cloud layer, an adapter turns that cloud layer's K and V,
 * [cloud_heads][tokens][cloud_head_dim], into what the edge layer attends over,
 * [edge_heads][tokens][edge_head_dim].
 *
 * Two kinds, both stored as one affine map per layer and per K and V, applied the same way
 * (gpu/adapt.h: y = [x, 1] W, x a token's cloud heads concatenated, y the edge's):
 *  - KVEDGE_ADAPT_HEADS, the paper's mechanism: each edge head takes the cloud head whose keys
 *    are most similar (linear CKA, one cloud head per edge head while there are enough), and
 *    ThinK's channel selection (Eq. 17) keeps the edge_head_dim channels of that cloud head
 *    that best preserve its query-key interaction; W is a 0/1 selection matrix.
 *  - KVEDGE_ADAPT_LINEAR: a least-squares linear map with a bias per mapped layer, fitted on
 *    calibration text (edge K/V ~ [cloud K/V, 1] W), ridge-regularised.
 *
 * Heads are KV heads throughout (grouped-query attention: a model's num_key_value_heads, not
 * its query heads). Rotary models (the Llama family) store K after the rotation, which a
 * per-token linear map or a channel selection does not commute with: fitting and applying work
 * on K with the rotation taken off (each model's own settings, recorded in the adapter), and a
 * channel selection keeps rotate-half pairs (j, j + head_dim / 2) together.
 *
 * An adapter is a safetensors file (format in docs/largesmall.md) written beside the map; its
 * metadata name both models and their shapes, rotary settings and the map's layer pairs, and
 * the reader checks them. */
#ifndef KVEDGE_CLIENTS_ADAPTER_H
#define KVEDGE_CLIENTS_ADAPTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clients/decoder/decoder.h"
#include "clients/e2e/layermap.h"
#include "access/codec/model.h"
#include "runtime/kvmsg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVEDGE_ADAPT_LINEAR = 1, /* least squares, the default (docs/largesmall.md says why) */
    KVEDGE_ADAPT_HEADS = 2,  /* head matching + ThinK channel selection */
} kvedge_adapt_kind_t;

/* "linear", "heads"; "?" otherwise. */
const char *kvedge_adapt_kind_name(kvedge_adapt_kind_t kind);
/* Parses "linear" or "heads". Errors: KVEDGE_EINVAL. */
int kvedge_adapt_kind_parse(const char *name, kvedge_adapt_kind_t *out);

/* Default ridge of the linear fit, relative to the mean diagonal of X^T X. */
#define KVEDGE_ADAPT_RIDGE_DEFAULT 1e-3
/* Bounds of an adapter file: heads and head size per side, input width heads * head_dim. */
#define KVEDGE_ADAPT_HEADS_MAX    1024u
#define KVEDGE_ADAPT_HEAD_DIM_MAX 1024u
#define KVEDGE_ADAPT_WIDTH_MAX    16384u
/* Longest "fit" metadata value (how the weights were fitted, when not by kvedge_adapter_fit). */
#define KVEDGE_ADAPT_FIT_MAX_BYTES 255u

typedef struct kvedge_adapter_t kvedge_adapter_t;

/* What an adapter is for. */
typedef struct {
    kvedge_adapt_kind_t kind;
    char cloud_id[KVEDGE_LAYERMAP_ID_MAX_BYTES + 1];
    char edge_id[KVEDGE_LAYERMAP_ID_MAX_BYTES + 1];
    uint32_t cloud_layers, cloud_heads, cloud_head_dim;
    uint32_t edge_layers, edge_heads, edge_head_dim;
    uint32_t samples; /* calibration token positions it was fitted on */
    double ridge;     /* linear: the relative ridge; heads: 0 */
    /* Rotary settings of each model (rotary false: learned positions, as OPT's, and what a file
     * that names none means). The map acts on un-rotated K: apply takes the cloud's rotation
     * off its K, maps, and puts the edge's on (V is never rotated). */
    kvedge_decoder_rope_t cloud_rope, edge_rope;
    /* How the weights were fitted when another tool trained them (the optional "fit" metadata,
     * printable ASCII; scripts/train_adapter.py writes "distilled: ..."); "" for an adapter of
     * kvedge_adapter_fit (least squares or head matching). */
    char fit[KVEDGE_ADAPT_FIT_MAX_BYTES + 1];
} kvedge_adapter_info_t;

/* A one-word label of how an adapter was fitted, for tables: "heads"; for a linear adapter
 * "least-squares" (no fit field), "distilled" (a fit that starts with "distilled"), or
 * "linear" (any other fit). NULL info gives "?". Static storage. */
const char *kvedge_adapter_fit_name(const kvedge_adapter_info_t *info);

/* Fits an adapter of the given kind for every mapped edge layer of map (entry[e].cloud !=
 * KVEDGE_LAYERMAP_NONE): both models run over tokens[0..samples) (windows as
 * kvedge_layermap_collect), collecting each mapped pair's K and V per KV head (and the cloud's
 * queries for ThinK; the decoder's scaled queries, which rank channels as unscaled ones would;
 * a KV head's queries are those of the query heads that read it). A rotary model's K (and
 * queries) are un-rotated with its own settings before the fit, which records both models'
 * settings. ridge:
 * linear only (< 0: the default; NaN or infinite: KVEDGE_EINVAL). The map's layer counts and
 * hidden sizes must be the models'; its ids become the adapter's. Errors: KVEDGE_EINVAL (bad
 * arguments, a map for other models, a singular linear system: ridge 0 with too few samples),
 * KVEDGE_ETRUNCATED (ntokens < samples, or samples < 2), KVEDGE_ETOOBIG (heads, head_dim or a
 * width over the bounds above, samples over 2^24), KVEDGE_ENOMEM, the decoder's errors.
 * Memory: both sides' K and V (and the cloud's Q) of every mapped pair, [heads][samples][dim]
 * fp32. Caller owns *out. */
int kvedge_adapter_fit(const kvedge_decoder_t *cloud, const kvedge_decoder_t *edge,
                       const kvedge_layermap_t *map, const int32_t *tokens, size_t ntokens,
                       uint32_t samples, kvedge_adapt_kind_t kind, double ridge,
                       kvedge_adapter_t **out);

/* Frees the adapter. NULL-safe; nulls *self_p. */
void kvedge_adapter_destroy(kvedge_adapter_t **self_p);

/* The adapter's models, shapes and kind. */
const kvedge_adapter_info_t *kvedge_adapter_info(const kvedge_adapter_t *a);

/* The cloud layer edge layer e is adapted from, or KVEDGE_LAYERMAP_NONE (not mapped, or e out
 * of range). */
int32_t kvedge_adapter_from(const kvedge_adapter_t *a, uint32_t edge_layer);

/* Adapts one mapped layer: k_src and v_src, [cloud_heads][tokens][cloud_head_dim] (the context
 * K/V of cloud layer kvedge_adapter_from(a, edge_layer), tokens at positions 0..tokens-1), into
 * k_dst and v_dst, [edge_heads][tokens][edge_head_dim]. With a rotary cloud model its K is
 * un-rotated (a copy; k_src is not written) before the map, with a rotary edge model the
 * result is rotated with the edge's settings after it. CPU (gpu/adapt.h's reference, which is
 * the bare map: kvedge_gpu_adapt does not rotate); thread-safe on one adapter. Errors:
 * KVEDGE_EINVAL (NULL, tokens 0, the layer not mapped), KVEDGE_ENOMEM, KVEDGE_ECORRUPT (an output
 * is not finite: the caller computes the layer itself). */
int kvedge_adapter_apply(const kvedge_adapter_t *a, uint32_t edge_layer, const float *k_src,
                         const float *v_src, uint32_t tokens, float *k_dst, float *v_dst);

/* Checks the adapter against a layer map (same ids, layer counts and layer pairs) and the two
 * models' records (layers, kv_heads, head_dim); each of map, cloud and edge may be NULL, and is
 * then not checked. (The records carry no rotary settings; kvedge_adapter_check_rope checks
 * those against loaded models.) Errors: KVEDGE_EINVAL (NULL a), KVEDGE_ESHAPE (a mismatch; why says
 * which). */
int kvedge_adapter_check(const kvedge_adapter_t *a, const kvedge_layermap_t *map,
                         const kvedge_model_t *cloud, const kvedge_model_t *edge, char *why,
                         size_t why_len);

/* Checks the adapter's rotary settings against two loaded models' (either may be NULL, and is
 * then not checked): an adapter fitted for other settings would un-rotate or re-rotate K with
 * the wrong angles. Errors: KVEDGE_EINVAL (NULL a), KVEDGE_ESHAPE (they differ; why says
 * which side). */
int kvedge_adapter_check_rope(const kvedge_adapter_t *a, const kvedge_decoder_t *cloud,
                              const kvedge_decoder_t *edge, char *why, size_t why_len);

/* Writes the adapter as a safetensors file (a temporary file, renamed). Errors: KVEDGE_EINVAL,
 * KVEDGE_EIO (errno holds the cause), KVEDGE_ENOMEM. */
int kvedge_adapter_save(const kvedge_adapter_t *a, const char *path);

/* Reads an adapter file strictly (the safetensors reader, then every metadata field, tensor
 * name, shape and value: finite weights, a selection matrix of 0/1 for heads). Errors: those
 * of the safetensors reader, KVEDGE_ECORRUPT (a field missing or malformed, a non-finite
 * weight), KVEDGE_EVERSION, KVEDGE_ESHAPE (a tensor of the wrong shape), KVEDGE_ENOMEM; why
 * receives "PATH: reason". Caller owns *out. */
int kvedge_adapter_load(const char *path, kvedge_adapter_t **out, char *why, size_t why_len);

/* ---- Registration with the Storage Master (clients/e2e/adapter_reg.c) ----
 * The master keeps, under adapter/<cloud>/<edge>, what identifies the pair's adapter file
 * (kvedge_master_adapter_t: its digest and size, how it was fitted, the layer map it was
 * fitted with, both rotary settings), not the file. docs/largesmall.md, "Registering an
 * adapter". */

/* Room for a registration check's reason. */
#define KVEDGE_ADAPTER_REG_WHY_BYTES 512

/* A model's rotary settings as an adapter file spells them ("none", "theta=10000", ...). */
void kvedge_adapter_rope_format(const kvedge_decoder_rope_t *r, char *out, size_t len);

/* Reads the adapter file at path strictly (kvedge_adapter_load) and the digest
 * (crypto_generichash, KVEDGE_MASTER_DIGEST_BYTES) and size of its bytes, read before and again
 * after the load: a file that changed in between is refused. Errors: those of
 * kvedge_adapter_load, KVEDGE_EIO (errno holds the cause), KVEDGE_ETOOBIG (over
 * KVEDGE_MASTER_ADAPTER_MAX_SIZE), KVEDGE_ECORRUPT (it changed while read); why receives the
 * reason. Caller owns *out. */
int kvedge_adapter_load_digest(const char *path, kvedge_adapter_t **out,
                               uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES], uint64_t *size,
                               char *why, size_t why_len);

/* The master's record of adapter a whose file has that digest and size. Errors: KVEDGE_EINVAL
 * (NULL, size 0), KVEDGE_ETOOBIG (more layers than a record holds, a file over the bound),
 * KVEDGE_ESHAPE (a rotary setting too long for the record). */
int kvedge_adapter_to_master(const kvedge_adapter_t *a,
                             const uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES], uint64_t size,
                             kvedge_master_adapter_t *out, char *why, size_t why_len);

/* Whether the adapter file (a, its digest and size) is the one registered for its pair: rec
 * the pair's adapter/ record, map the pair's map/ record (NULL: none registered). Errors:
 * KVEDGE_EINVAL (NULL a, digest), KVEDGE_ENOTFOUND (no adapter record), KVEDGE_ECORRUPT (the
 * file is not the registered one: size, digest, or a record that does not describe it),
 * KVEDGE_EEXPIRED (the record is stale: no map is registered for the pair, or the map is not
 * the one the adapter was fitted with); why says which. */
int kvedge_adapter_check_registered(const kvedge_adapter_t *a,
                                    const uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES], uint64_t size,
                                    const kvedge_master_adapter_t *rec,
                                    const kvedge_master_map_t *map, char *why, size_t why_len);

/* ---- Beyond fitting and files: measuring, the weights, and the pieces of the fit ---- */

/* Relative reconstruction error of the adapter on text: both models over tokens[0..samples)
 * (windows as kvedge_adapter_fit), and for every mapped edge layer e, err_k[e] =
 * ||K_edge - adapt(K_cloud)||_F / ||K_edge||_F over all heads and samples (err_v[e] likewise);
 * NaN for an unmapped layer. err_k and err_v hold edge_layers doubles. The models must have
 * the adapter's shapes. Errors: KVEDGE_EINVAL (bad arguments, other shapes), KVEDGE_ETRUNCATED
 * (ntokens < samples, samples < 2), KVEDGE_ENOMEM, the decoder's errors. */
int kvedge_adapter_eval(const kvedge_adapter_t *a, const kvedge_decoder_t *cloud,
                        const kvedge_decoder_t *edge, const int32_t *tokens, size_t ntokens,
                        uint32_t samples, double *err_k, double *err_v);

/* The weights of mapped edge layer e, K (v false) or V (v true): [din + 1][dout] fp32,
 * row-major, din = cloud_heads * cloud_head_dim, dout = edge_heads * edge_head_dim, row din the
 * bias: what kvedge_gpu_adapt takes once uploaded. NULL when e is not mapped. Valid while the
 * adapter lives. */
const float *kvedge_adapter_weights(const kvedge_adapter_t *a, uint32_t edge_layer, bool v);

/* An adapter from given weights (the loader's path; tests and tools): info, from
 * [edge_layers] (a cloud layer or KVEDGE_LAYERMAP_NONE) and, for every mapped e, w[2e] (K)
 * and w[2e + 1] (V), [din + 1][dout] each, copied. Checked as the loader checks a file.
 * Errors: KVEDGE_EINVAL (NULL), KVEDGE_ECORRUPT (a field out of bounds, a non-finite weight,
 * a heads adapter that is not a 0/1 selection), KVEDGE_ENOMEM; why says which. Caller owns
 * *out. */
int kvedge_adapter_make(const kvedge_adapter_info_t *info, const int32_t *from,
                        const float *const *w, kvedge_adapter_t **out, char *why, size_t why_len);

/* The linear fit alone: w [din + 1][dout] minimizing ||[x, 1] w - y||^2 + lambda ||w[0..din)||^2
 * with lambda = ridge * the mean diagonal of x^T x (the bias row is not penalized); normal
 * equations in double, Cholesky. x [n][din], y [n][dout]. Errors: KVEDGE_EINVAL (NULL, a zero
 * size, ridge negative or not finite, a singular system: ridge 0 with too few samples),
 * KVEDGE_ENOMEM. */
int kvedge_adapter_fit_linear(const float *x, const float *y, uint32_t n, uint32_t din,
                              uint32_t dout, double ridge, float *w);

/* Head matching alone: for the keys edge_k [edge_heads][n][edge_head_dim] and cloud_k
 * [cloud_heads][n][cloud_head_dim], match[h] receives the cloud head of edge head h: pairs
 * taken greedily by linear CKA, highest first (ties: lower edge head, then lower cloud head),
 * each cloud head once; only when cloud_heads < edge_heads, the edge heads left over take
 * their best cloud head again. cka ([edge_heads][cloud_heads]) may be NULL. Errors:
 * KVEDGE_EINVAL (NULL, zero sizes, n < 2), KVEDGE_ENOMEM. */
int kvedge_adapter_match_heads(const float *edge_k, uint32_t edge_heads, uint32_t edge_head_dim,
                               const float *cloud_k, uint32_t cloud_heads, uint32_t cloud_head_dim,
                               uint32_t n, uint32_t *match, double *cka);

/* ThinK's channel selection for a rotary head: the pairs (j, j + head_dim / 2) that rotate
 * together are kept or dropped together, a pair scored by the sum of its two channels' scores
 * ||Q[:,j]|| ||K[:,j]|| (which, summed, do not depend on the rotation). q [nq][head_dim] (all
 * queries that read the head), k [n][head_dim]; channels[0..keep) receives the keep / 2 pairs
 * of highest score (ties: the lower pair), first halves in channel order, then their partners
 * j + head_dim / 2 in the same order. Errors: KVEDGE_EINVAL (NULL, zero sizes, head_dim or keep
 * odd, keep > head_dim, head_dim > KVEDGE_ADAPT_HEAD_DIM_MAX). */
int kvedge_adapter_think_pairs(const float *q, uint32_t nq, const float *k, uint32_t n,
                               uint32_t head_dim, uint32_t keep, uint32_t *channels);

/* ThinK's channel selection (Eq. 17, its greedy criterion) for one head: q and k [n][head_dim]
 * (the head's queries and keys); channels[0..keep) receives the keep channels of highest
 * ||Q[:,j]|| ||K[:,j]|| (ties: the lower channel), in channel order. Errors: KVEDGE_EINVAL
 * (NULL, zero sizes, keep > head_dim, head_dim > KVEDGE_ADAPT_HEAD_DIM_MAX). */
int kvedge_adapter_think_channels(const float *q, const float *k, uint32_t n, uint32_t head_dim,
                                  uint32_t keep, uint32_t *channels);

#ifdef __cplusplus
}
#endif
#endif
