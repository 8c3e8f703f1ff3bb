/* The quality of large-small collaboration (CE-LSLM Table II's "score" column at this scale),
 * measured in this process with no network: a small edge model (SLM) decodes a continuation
 * over context K/V that a large cloud model (LLM) computed, adapted to the SLM's layers
 * (clients/e2e/adapter.h), and is compared with the LLM itself, with the SLM on its own context
 * and with the SLM given no context at all.
 *
 * Per document (the first ctx_tokens tokens are the context, the next cont_tokens positions
 * are scored with teacher forcing: position i's logits score token ctx + i + 1), the rows:
 *  - cloud-only: the LLM over context and continuation (its context K/V from its own prefill,
 *    fp32); its greedy choices are the reference of every row's agreement and KL;
 *  - edge-only: the SLM computing its own context K/V, fp32;
 *  - peer-int8: the SLM's own context K/V after an int8 block round trip (what a peer edge node
 *    would store and serve: kvedge_block_encode, kvedge_block_check, kvedge_block_decode);
 *  - for each adapter, at lossless (fp32), int8 and int4 (group 32): the LLM's context K/V of
 *    the mapped cloud layers after a block round trip at that precision, adapted with
 *    kvedge_adapter_apply into the SLM's layers and handed to the SLM's session through the
 *    provider; an edge layer the adapter does not map (or whose adapted K/V is not finite) is
 *    computed by the SLM itself, and the row says how many were;
 *  - no-context: the SLM over the continuation alone, positions from 0 (the floor: what the
 *    context is worth).
 * docs/benchmarks.md ("Large-small: the paper's Table II at this scale") has the figures of
 * models/kjv. */
#ifndef KVEDGE_CLIENTS_LSEVAL_H
#define KVEDGE_CLIENTS_LSEVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "clients/e2e/adapter.h"
#include "clients/decoder/decoder.h"
#include "access/codec/block.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Adapters one run compares at most. */
#define KVEDGE_LSEVAL_MAX_ADAPTERS 4
/* Rows: cloud-only, edge-only, peer-int8, 3 per adapter, no-context. */
#define KVEDGE_LSEVAL_MAX_ROWS (4 + 3 * KVEDGE_LSEVAL_MAX_ADAPTERS)
/* Bytes of a row's name, with its NUL ("ce-lslm heads int4-g32" is 23). */
#define KVEDGE_LSEVAL_NAME_BYTES 48
/* Group of the int4 rows (KIVI, the codec's default). */
#define KVEDGE_LSEVAL_INT4_GROUP 32
/* Context tokens per block, as the cloud prefill cuts them (KVEDGE_E2E_CHUNK_TOKENS_DEFAULT). */
#define KVEDGE_LSEVAL_CHUNK_TOKENS_DEFAULT 256

/* What a row's context is. */
typedef enum {
    KVEDGE_LSEVAL_CLOUD_ONLY = 0, /* the LLM, its own context K/V */
    KVEDGE_LSEVAL_EDGE_ONLY = 1,  /* the SLM, its own context K/V, fp32 */
    KVEDGE_LSEVAL_PEER = 2,       /* the SLM, its own context K/V through int8 blocks */
    KVEDGE_LSEVAL_CE_LSLM = 3,    /* the SLM, the LLM's context K/V adapted */
    KVEDGE_LSEVAL_NO_CONTEXT = 4, /* the SLM, no context */
} kvedge_lseval_kind_t;

/* "cloud-only", "edge-only", "peer", "ce-lslm", "no-context"; "?" otherwise. */
const char *kvedge_lseval_kind_name(kvedge_lseval_kind_t kind);

/* Called after each document (from the thread that runs kvedge_lseval_run). */
typedef void (*kvedge_lseval_progress_fn)(void *arg, size_t done, size_t doc_index,
                                          double elapsed_s);

typedef struct {
    const kvedge_decoder_t *cloud; /* the LLM, loaded */
    const kvedge_decoder_t *edge;  /* the SLM, loaded; same vocabulary as the LLM */
    /* Adapters from the LLM to the SLM (kvedge_lseval_adapter_check must accept each); 0 ..
     * KVEDGE_LSEVAL_MAX_ADAPTERS. names[i] labels adapter i's rows (NULL or NULL entries: how
     * the adapter was fitted, kvedge_adapter_fit_name: "least-squares", "distilled", "heads"). */
    const kvedge_adapter_t *const *adapters;
    const char *const *adapter_names;
    size_t n_adapters;
    /* Documents: docs[i] holds doc_len[i] token ids; a document shorter than ctx_tokens +
     * cont_tokens + 1 is skipped, a longer one is measured on its first that many tokens. */
    const int32_t *const *docs;
    const size_t *doc_len;
    size_t n_docs;
    uint32_t ctx_tokens;                /* >= 1 */
    uint32_t cont_tokens;               /* >= 1 */
    uint32_t chunk_tokens;              /* tokens per block of the round trips; 0 = the default */
    size_t max_docs;                    /* stop after this many documents measured; 0 = all */
    kvedge_lseval_progress_fn progress; /* may be NULL */
    void *progress_arg;
} kvedge_lseval_opts_t;

/* One row, over every scored position of every measured document. */
typedef struct {
    char name[KVEDGE_LSEVAL_NAME_BYTES]; /* "cloud-only", "ce-lslm linear int8", ... */
    kvedge_lseval_kind_t kind;
    int adapter;            /* index in opts->adapters (ce-lslm rows); -1 otherwise */
    kvedge_scheme_t scheme; /* the context's precision in blocks (peer, ce-lslm) */
    uint64_t positions;     /* continuation positions scored */
    double nll;             /* mean negative log-likelihood of the true next tokens (nats) */
    double ppl;             /* exp(nll) */
    double agree_cloud;     /* share of positions whose arg-max is the cloud-only row's */
    double agree_edge;      /* the same against the edge-only row */
    double kl;              /* mean KL(cloud-only || this), nats */
    /* Bytes of the context's K/V this row needs from somewhere else, per document (mean):
     * the encoded blocks of the round trip (peer: every SLM layer; ce-lslm: the mapped cloud
     * layers only); 0 for the rows that compute their own context or have none. */
    double bytes;
    double fp16_bytes;        /* the same K/V as fp16 */
    uint32_t layers_adapted;  /* ce-lslm: SLM layers whose context came from the LLM (per doc) */
    uint64_t layers_computed; /* ce-lslm: SLM layers computed instead, summed over documents */
} kvedge_lseval_row_t;

typedef struct {
    uint32_t cloud_layers, edge_layers; /* the models' */
    uint32_t ctx_tokens, cont_tokens;   /* as run */
    size_t n_docs;                      /* documents measured */
    size_t n_short;                     /* documents skipped as too short */
    double seconds;                     /* wall time of the run */
    size_t n_rows;
    kvedge_lseval_row_t row[KVEDGE_LSEVAL_MAX_ROWS];
} kvedge_lseval_result_t;

/* Checks that adapter a is for these two models: its cloud layers, KV heads and head size are
 * the LLM's, its edge ones the SLM's, and every mapped edge layer has a cloud layer of the
 * LLM. Errors: KVEDGE_EINVAL (NULL), KVEDGE_ESHAPE (a mismatch; why, when given, says which:
 * "the adapter is for a cloud model of 6 layers x 6 KV heads x 32, not 4 x 4 x 16"). */
int kvedge_lseval_adapter_check(const kvedge_adapter_t *a, const kvedge_decoder_t *cloud,
                                const kvedge_decoder_t *edge, char *why, size_t why_len);

/* Round trip of context K/V through blocks: k and v [layers][heads][tokens][head_dim] fp32,
 * each (chunk of chunk_tokens, layer, head) encoded as one block in scheme (int4: group
 * KVEDGE_LSEVAL_INT4_GROUP; source and lossless element type fp32; lz4 where it pays), as the
 * cloud prefill stores it, verified (kvedge_block_check) and decoded into k_out, v_out (same
 * layout; may be k and v). Only layers whose use[l] is true (use NULL: all) go through blocks;
 * the others are copied unchanged and count no bytes. *bytes and *fp16_bytes (may be NULL)
 * receive the encoded block bytes and those of the same K/V as fp16. chunk_tokens 0: the
 * default. Errors: KVEDGE_EINVAL (bad arguments, non-finite K/V), those of the codec,
 * KVEDGE_ENOMEM. */
int kvedge_lseval_roundtrip(const float *k, const float *v, uint32_t layers, uint32_t heads,
                            uint32_t tokens, uint32_t head_dim, const bool *use,
                            kvedge_scheme_t scheme, uint32_t chunk_tokens, float *k_out,
                            float *v_out, uint64_t *bytes, uint64_t *fp16_bytes);

/* Runs the evaluation (above) into *out (caller owns it; free()). Errors: KVEDGE_EINVAL (a
 * missing field, the two models' vocabularies differ, too many adapters, no document long
 * enough, a token outside the vocabulary), KVEDGE_ESHAPE (an adapter not for these models:
 * kvedge_lseval_adapter_check), KVEDGE_ETOOBIG (ctx_tokens + cont_tokens over either model's
 * positions), KVEDGE_ENOMEM, and the errors of the decoder, the codec and the adapter. */
int kvedge_lseval_run(const kvedge_lseval_opts_t *opts, kvedge_lseval_result_t **out);

/* Prints the result as a table for people, or as one JSON object when json. */
void kvedge_lseval_print(FILE *f, const kvedge_lseval_result_t *r, bool json);

/* A data file for plots (scripts/plot_largesmall.gp): one row a line, "index name ppl
 * agree_cloud agree_edge kl bytes", the name with spaces as '_'. Comment lines start with '#'. */
void kvedge_lseval_print_dat(FILE *f, const kvedge_lseval_result_t *r);

#ifdef __cplusplus
}
#endif
#endif
