/* Layer matching between a large (cloud) and a small (edge) model, CE-LSLM section V-A: both
 * models run over the same calibration tokens, every edge layer's output hidden states are
 * compared with every cloud layer's by linear CKA (gpu/cka.h, Eq. 11-13) and RSA (gpu/rsa.h,
 * Eq. 14-15), and each edge layer gets the cloud layer the rule of Eq. 16 selects, or none.
 * The result is a layer map, a small text file with a strict reader. docs/largesmall.md has
 * the rule, the format and the map of the trained pair. */
#ifndef KVEDGE_CLIENTS_LAYERMAP_H
#define KVEDGE_CLIENTS_LAYERMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/kvmsg.h"
#include "clients/decoder/decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Token positions (rows) compared per layer, by default. */
#define KVEDGE_LAYERMAP_SAMPLES_DEFAULT 2048u
/* Longest window the calibration tokens are run in (also capped by each model's positions). */
#define KVEDGE_LAYERMAP_WINDOW_TOKENS_MAX 256u
/* Thresholds of Eq. 16, from the score distribution of models/kjv (docs/largesmall.md). */
#define KVEDGE_LAYERMAP_CKA_MIN_DEFAULT 0.5
#define KVEDGE_LAYERMAP_RSA_MIN_DEFAULT 0.5
/* Candidates whose alignment is within this of the best count as tied: the shallowest wins. */
#define KVEDGE_LAYERMAP_NEAR_TIE 0.02
/* Bounds of a map file: layers per side, model id bytes, line bytes. */
#define KVEDGE_LAYERMAP_LAYERS_MAX     1024u
#define KVEDGE_LAYERMAP_ID_MAX_BYTES   127u
#define KVEDGE_LAYERMAP_LINE_MAX_BYTES 512u
/* An edge layer with no cloud layer. */
#define KVEDGE_LAYERMAP_NONE (-1)
/* A why buffer of this size holds any reason in full. */
#define KVEDGE_LAYERMAP_WHY_BYTES 512u

/* One edge layer's entry. */
typedef struct {
    int32_t cloud; /* the selected cloud layer, or KVEDGE_LAYERMAP_NONE */
    double cka;    /* scores of the selected pair; with none, of the best-aligned cloud layer */
    double rsa;
} kvedge_layermap_entry_t;

/* A layer map. Plain data: fill it by hand, by kvedge_layermap_build or kvedge_layermap_read. */
typedef struct {
    char cloud_id[KVEDGE_LAYERMAP_ID_MAX_BYTES + 1]; /* no whitespace, non-empty */
    char edge_id[KVEDGE_LAYERMAP_ID_MAX_BYTES + 1];
    uint32_t cloud_layers;
    uint32_t cloud_hidden;
    uint32_t edge_layers;
    uint32_t edge_hidden;
    uint32_t samples; /* token positions the scores were measured on */
    double cka_min;   /* thresholds the selection used */
    double rsa_min;
    kvedge_layermap_entry_t *entry; /* [edge_layers], owned */
} kvedge_layermap_t;

/* Whether id can name a model in a map or an adapter: 1..KVEDGE_LAYERMAP_ID_MAX_BYTES
 * printable bytes, no whitespace. */
bool kvedge_layermap_id_ok(const char *id);

/* The model pair a map or an adapter is for: both ids valid (kvedge_layermap_id_ok) and both
 * layer counts 1..KVEDGE_LAYERMAP_LAYERS_MAX. Returns 0, or KVEDGE_ECORRUPT with why (may be
 * NULL) saying which. */
int kvedge_layermap_pair_check(const char *cloud_id, const char *edge_id, uint32_t cloud_layers,
                               uint32_t edge_layers, char *why, size_t why_len);

/* The alignment of a pair, the quantity Eq. 16 maximizes: the mean of CKA and RSA. */
double kvedge_layermap_alignment(double cka, double rsa);

/* Eq. 16 for one edge layer e, given its scores against every cloud layer (cka[c], rsa[c] for
 * c in 0..cloud_layers-1): the candidates are the cloud layers with cka >= cka_min and rsa >=
 * rsa_min (NaN passes nothing); among them, the shallowest whose alignment is within tie of the
 * best candidate's. Returns that layer, or KVEDGE_LAYERMAP_NONE when no layer passes. */
int32_t kvedge_layermap_select(const double *cka, const double *rsa, uint32_t cloud_layers,
                               double cka_min, double rsa_min, double tie);

/* Hidden states of every layer of md over samples token positions: tokens[0..samples) run in
 * consecutive windows of window tokens (positions 0..window-1 each; the last may be shorter),
 * and out [layers][samples][hidden] receives each layer's output rows. Errors: KVEDGE_EINVAL
 * (NULL, zero samples or window, window over the model's positions), those of
 * kvedge_decoder_prefill_trace (a token outside the vocabulary). */
int kvedge_layermap_collect(const kvedge_decoder_t *md, const int32_t *tokens, uint32_t samples,
                            uint32_t window, float *out);

/* Scores of every (edge layer, cloud layer) pair: cka and rsa [edge_layers][cloud_layers]
 * from the collected states edge [edge_layers][n][edge_hidden] and cloud likewise. On a
 * machine with a device, cuBLAS (kvedge_gpu_cka, kvedge_gpu_rsa; the CPU references if any
 * CUDA call fails), else OpenBLAS. Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM (those of
 * kvedge_cpu_cka and kvedge_cpu_rsa). */
int kvedge_layermap_scores(const float *edge, uint32_t edge_layers, uint32_t edge_hidden,
                           const float *cloud, uint32_t cloud_layers, uint32_t cloud_hidden,
                           uint32_t n, double *cka, double *rsa);

/* The whole analysis: both models over tokens[0..samples) (in windows of the smaller of the two
 * models' positions and KVEDGE_LAYERMAP_WINDOW_TOKENS_MAX), the scores (*cka_out and *rsa_out,
 * [edge_layers][cloud_layers], caller frees; either may be NULL) and the map in *map (caller
 * calls kvedge_layermap_clear), ids as given. Errors: KVEDGE_EINVAL (bad arguments, ids empty,
 * too long or with whitespace, thresholds not finite), KVEDGE_ETRUNCATED (ntokens < samples,
 * or samples < 3), KVEDGE_ETOOBIG (a side over KVEDGE_LAYERMAP_LAYERS_MAX layers or samples
 * over KVEDGE_RSA_MAX_SAMPLES), those of collect and scores. */
int kvedge_layermap_build(const kvedge_decoder_t *cloud, const char *cloud_id,
                          const kvedge_decoder_t *edge, const char *edge_id, const int32_t *tokens,
                          size_t ntokens, uint32_t samples, double cka_min, double rsa_min,
                          kvedge_layermap_t *map, double **cka_out, double **rsa_out);

/* Frees map->entry and zeroes the map. NULL-safe. */
void kvedge_layermap_clear(kvedge_layermap_t *map);

/* Checks a map as the reader does (why names the edge layer). Errors: KVEDGE_EINVAL (NULL),
 * KVEDGE_ECORRUPT. */
int kvedge_layermap_check(const kvedge_layermap_t *map, char *why, size_t why_len);

/* Writes the map in the text format of docs/largesmall.md to f. Errors: those of check,
 * KVEDGE_EIO. */
int kvedge_layermap_write(FILE *f, const kvedge_layermap_t *map);

/* Writes the map to path (a temporary file, renamed). Errors: those of write, KVEDGE_EIO
 * (errno holds the cause). */
int kvedge_layermap_save(const char *path, const kvedge_layermap_t *map);

/* Reads a map file strictly: the header, the two model lines, thresholds, one line per edge
 * layer in order, "end", nothing after. Refused with KVEDGE_ECORRUPT (a malformed line, an
 * unknown keyword, a layer count or hidden size out of 1..KVEDGE_LAYERMAP_LAYERS_MAX or 1..2^24,
 * a cloud layer out of range, an edge layer out of order or twice, a non-finite or out-of-range
 * score, a selected pair below the thresholds), KVEDGE_EVERSION (another format version),
 * KVEDGE_ETRUNCATED (fewer layer lines than edge layers, or no "end"), KVEDGE_EIO,
 * KVEDGE_ENOMEM; why receives "PATH:LINE: reason". On success the caller clears *map; on
 * failure *map is zeroed. */
int kvedge_layermap_read(const char *path, kvedge_layermap_t *map, char *why, size_t why_len);

/* The map as the Storage Master's layer map record (runtime/kvmsg.h, docs/master.md): the layer
 * counts, and from[e] = edge layer e's cloud layer or KVEDGE_MASTER_MAP_NONE; the ids and
 * scores stay behind (the record's key holds the ids). Checks the map first. Errors: those of
 * kvedge_layermap_check (why says which), KVEDGE_ETOOBIG (a side over
 * KVEDGE_MODEL_MAX_LAYERS). */
int kvedge_layermap_to_master(const kvedge_layermap_t *map, kvedge_master_map_t *out, char *why,
                              size_t why_len);

/* Prints the map as a table, or as JSON with the full score matrices when cka and rsa
 * ([edge_layers][cloud_layers]) are given. Errors: KVEDGE_EIO. */
int kvedge_layermap_print(FILE *f, const kvedge_layermap_t *map, bool json, const double *cka,
                          const double *rsa);

#ifdef __cplusplus
}
#endif
#endif
