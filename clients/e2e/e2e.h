/* End to end: the two roles of a cloud-edge deployment around the reference decoder
 * (clients/decoder.h), and the two baselines they are measured against.
 *
 *  - Cloud prefill (kvedge_e2e_prefill): the cloud model computes a shared context's K/V and
 *    puts it to a cloud store node, one block per (chunk, layer, head), quantized as asked.
 *  - Edge decode (kvedge_e2e_decode, KVEDGE_E2E_KVEDGE): the edge asks its proxy for the
 *    context's layers (one FETCH, via the pipelined loader), runs decoder layer l as soon as
 *    layer l is resident, computes itself every layer that comes back as a miss, and decodes
 *    the user's prompt on top. The only request the edge sends is the FETCH: model id, the
 *    context's chunk ids (hashes of the shared context, computed on the edge), layer range,
 *    token count and the decoder's time estimates. The prompt never leaves the process.
 *  - Large–small ("ce-lslm": KVEDGE_E2E_KVEDGE with a mapped model and an adapter, CE-LSLM
 *    section V-A, docs/largesmall.md "Serving: the edge client"): the same, but the FETCH also
 *    names a cloud model and its chunk chain over the same context; the proxy may deliver an
 *    edge layer as the cloud layer its registered layer map gives, which the adapter turns
 *    into the edge layer's K/V before the decoder uses it.
 *  - Edge-only (KVEDGE_E2E_LOCAL): the edge recomputes context and prompt itself.
 *  - Cloud-only (KVEDGE_E2E_CLOUD_ONLY): the user's prompt goes to the cloud model, which holds
 *    the context's K/V in memory (prefix caching, the strongest cloud baseline) and sends the
 *    generated tokens back one by one. The cloud service is emulated in this process
 *    (kvedge_e2e_cloud_t): the same decoder on this machine's CPU, one request at a time (a
 *    single cloud model instance serves every edge), behind an emulated link (access/shaper.h)
 *    that the prompt's upload and each token's reply wait on.
 *
 * Tokens: the roles take token ids. The kvedge command makes them from text with the byte-level
 * BPE tokenizer (clients/decoder/tokenizer.h, `--tokenizer DIR`), else with a stand-in byte
 * tokenizer (kvedge_e2e_byte_tokens). */
#ifndef KVEDGE_CLIENTS_E2E_H
#define KVEDGE_CLIENTS_E2E_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "clients/e2e/adapter.h"
#include "clients/decoder/decoder.h"
#include "clients/lib/kvedge.h"
#include "clients/e2e/prune.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Byte b of a text is token b + this (OPT's ids 0..3 are pad, bos/eos and unk). */
#define KVEDGE_E2E_BYTE_TOKEN_BASE 4
/* Context tokens per chunk when the caller leaves it 0. */
#define KVEDGE_E2E_CHUNK_TOKENS_DEFAULT 256
/* Bytes the cloud-only request sends per prompt token (an int32 id) and per reply token. */
#define KVEDGE_E2E_TOKEN_WIRE_BYTES 4
/* Fixed header bytes of every cloud-only message (framing, ids). */
#define KVEDGE_E2E_MSG_OVERHEAD_BYTES 64

typedef enum {
    KVEDGE_E2E_KVEDGE = 0,     /* context K/V through the proxy, prompt decoded on the edge */
    KVEDGE_E2E_LOCAL = 1,      /* edge-only: recompute context and prompt on the edge */
    KVEDGE_E2E_CLOUD_ONLY = 2, /* the prompt goes to the cloud model (emulated) */
} kvedge_e2e_mode_t;

/* "kvedge", "edge-only", "cloud-only"; "?" otherwise. */
const char *kvedge_e2e_mode_name(kvedge_e2e_mode_t mode);

/* Text to token ids with the stand-in byte tokenizer: writes min(len, max) ids to out and
 * their count to *n. Errors: KVEDGE_EINVAL (NULL argument, or vocab too small to hold byte
 * 255's id). */
int kvedge_e2e_byte_tokens(const char *text, size_t len, uint32_t vocab, int32_t *out, size_t max,
                           size_t *n);

/* Writes len bytes of text as a JSON string literal: valid UTF-8 as it is (quotes, backslashes
 * and control characters escaped), each byte that is not part of valid UTF-8 as U+FFFD, since a
 * tokenizer's ids may split a character. */
void kvedge_e2e_json_text(FILE *f, const char *text, size_t len);

/* Bytes of the rotary suffix of a model id: "@rope-" and 8 lowercase hex digits. */
#define KVEDGE_E2E_ROPE_SUFFIX_BYTES KVEDGE_MODEL_ROPE_SUFFIX_BYTES

/* The store's model record for a loaded decoder: layers, kv_heads (the decoder's KV heads,
 * kvedge_decoder_kv_heads: fewer than its query heads under grouped-query attention),
 * head_dim, dtype fp16, and the id. For a rotary model (kvedge_decoder_rope_fingerprint not 0)
 * the id is id followed by "@rope-XXXXXXXX", its fingerprint in hex (kept as it is when id
 * already ends with that suffix): the stored record and its wire form have no field for rotary
 * settings, so they go into the id and from there into every chunk id. A context prefilled by
 * one model is then found only under a model id whose rotary settings are the same, and
 * kvedge_e2e_prefill / kvedge_e2e_decode refuse a record whose fingerprint is not their
 * decoder's. OPT's id is id unchanged. Errors: KVEDGE_EINVAL (not loaded, bad id; a rotary
 * model's id over KVEDGE_MODEL_ID_MAX_BYTES - KVEDGE_E2E_ROPE_SUFFIX_BYTES bytes),
 * KVEDGE_ESHAPE (id carries another model's rotary suffix), KVEDGE_ETOOBIG (outside the
 * store's limits). */
int kvedge_e2e_model(const kvedge_decoder_t *d, const char *id, kvedge_model_t *out);

/* The rotary fingerprint a model record's id carries (kvedge_e2e_model), 0 when none. */
uint32_t kvedge_e2e_model_rope(const kvedge_model_t *m);

/* The chunk chain of a context (access/codec/chunk.h, no salt): ceil(n / chunk_tokens) ids written
 * to ids (room for max; chunk_tokens 0 = KVEDGE_E2E_CHUNK_TOKENS_DEFAULT). The edge computes the
 * same ids from the same shared context. Errors: KVEDGE_EINVAL (a negative token id,
 * chunk_tokens over KVEDGE_CHUNK_TOKENS_MAX), KVEDGE_ENOSPACE (max too small), KVEDGE_ENOMEM. */
int kvedge_e2e_chunks(const kvedge_model_t *m, const int32_t *ctx, uint32_t n,
                      uint32_t chunk_tokens, kvedge_chunk_id_t *ids, size_t max, size_t *n_ids);

/* How the cloud stores a context. */
typedef struct {
    kvedge_scheme_t scheme; /* lossless, int8 or int4 */
    kvedge_dtype_t dtype;   /* element type of lossless blocks and of the source: fp16 or fp32 */
    uint16_t group_size;    /* int4 groups; 0 = the codec's default */
    uint16_t keep_channels; /* ThinK: key channels kept per head (0 = all) */
    bool compress;          /* lz4 on bodies where it helps */
    bool pin;
    uint32_t ttl_s; /* 0 = node default */
    /* Pruning (docs/largesmall.md, "Pruning unmapped layers"): the layers to put; the others
     * are computed (the deeper layers need them) but not stored. NULL: every layer. Its
     * `layers` must be the model's and it must hold at least one layer. Borrowed. */
    const kvedge_prune_set_t *layers;
} kvedge_e2e_quant_t;

/* Smallest int4 group_size prefill accepts (0, the default, is fine): the edge's staging
 * ring (kvedge_e2e_decode) is sized for lossless fp32/fp16, int8, and int4 groups of this or
 * more. */
#define KVEDGE_E2E_GROUP_MIN 4

/* Ring slots kvedge_e2e_decode gives its pipeline when the request leaves ring_slots 0 (at
 * most the decoder's layers). Its loader runs on the CPU (the destination is the session's
 * host K/V): 2 slots double-buffer, the I/O thread staging layer l + 1 while the loader
 * dequantizes layer l, which takes less than receiving a layer, so the pipeline's 4
 * (KVEDGE_PIPELINE_RING_DEFAULT) only held memory: docs/benchmarks.md, "Fetched K/V in place"
 * (4 slots until then: the same TTFT; kvedge's K/V 1.26 / 1.27x edge-only's -> 1.11 / 1.12x). */
#define KVEDGE_E2E_RING_DEFAULT 2

/* Bytes one pipeline ring slot needs for a whole layer of an n-token context cut into chunks
 * of ct, whatever the cloud stored: lossless fp32, fp16, int8, int4 with groups of
 * KVEDGE_E2E_GROUP_MIN or more (the sizing kvedge_e2e_decode uses). */
size_t kvedge_e2e_slot_bytes(uint32_t n, uint32_t ct, uint32_t kv_heads, uint32_t head_dim);

/* Defaults: int8, fp16, group 0, all channels, lz4 on, not pinned, node TTL, every layer. */
void kvedge_e2e_quant_default(kvedge_e2e_quant_t *q);

typedef struct {
    double prefill_us; /* the decoder's prefill of the context */
    double encode_us;  /* quantizing and encoding blocks */
    double put_us;     /* putting them to the node */
    uint64_t blocks;
    uint64_t bytes;      /* encoded block bytes put */
    uint64_t fp16_bytes; /* the same K/V in fp16 */
    size_t n_chunks;
    /* Layers put (all of them without q->layers), and what the layers pruning left out
     * would have been (encoded with the same settings to count them, never put). */
    uint32_t layers_put;
    uint64_t pruned_blocks, pruned_bytes, pruned_fp16_bytes;
} kvedge_e2e_prefill_stats_t;

/* Cloud prefill: runs the context through the decoder (kvedge_decoder_prefill), registers m
 * on the node (kvedge_client_put_model), and puts every (chunk, layer, KV head) block, encoded
 * with q, in batches; with q->layers only the blocks of those layers. m must match the
 * decoder (kvedge_e2e_model). ids (room for max) receives the chunk chain. Errors:
 * KVEDGE_EINVAL (bad arguments, m's shape not the decoder's, q->layers of another layer count
 * or empty), KVEDGE_ESHAPE (m's rotary fingerprint is not the decoder's),
 * KVEDGE_ENOSPACE (max too small), the decoder's, the codec's and the client's errors (the
 * first failed put's status). stats may be NULL. */
int kvedge_e2e_prefill(kvedge_client_t *cloud, const kvedge_decoder_t *d, const kvedge_model_t *m,
                       const int32_t *ctx, uint32_t n, uint32_t chunk_tokens,
                       const kvedge_e2e_quant_t *q, kvedge_chunk_id_t *ids, size_t max,
                       kvedge_e2e_prefill_stats_t *stats);

/* kvedge_e2e_prefill to the replicas of a placed writer (clients/lib/placed.h), made for this
 * context (its key the chain's root chunk id) and connected: the model is registered and every
 * layer's blocks put on each replica at once, and the write stands while W replicas have all
 * of them (kvedge_placed_replica says what each did). Errors: those of kvedge_e2e_prefill,
 * KVEDGE_EINVAL for a writer placed for another context; a put that fewer than W replicas
 * acknowledged returns the first failed replica's code. */
int kvedge_e2e_prefill_placed(kvedge_placed_t *placed, const kvedge_decoder_t *d,
                              const kvedge_model_t *m, const int32_t *ctx, uint32_t n,
                              uint32_t chunk_tokens, const kvedge_e2e_quant_t *q,
                              kvedge_chunk_id_t *ids, size_t max,
                              kvedge_e2e_prefill_stats_t *stats);

/* kvedge_e2e_prefill with the context's K/V computed elsewhere (a GPU cloud model, gpu/opt.h):
 * k and v hold layers * kvedge_decoder_kv_floats(d, n) floats each,
 * [layers][kv_heads][n][head_dim]
 * (what kvedge_decoder_prefill writes); d gives the shape only and is not run (stats'
 * prefill_us is 0). Errors: those of kvedge_e2e_prefill; KVEDGE_EINVAL for a NULL k or v. */
int kvedge_e2e_prefill_kv(kvedge_client_t *cloud, const kvedge_decoder_t *d,
                          const kvedge_model_t *m, const int32_t *ctx, uint32_t n,
                          uint32_t chunk_tokens, const kvedge_e2e_quant_t *q, const float *k,
                          const float *v, kvedge_chunk_id_t *ids, size_t max,
                          kvedge_e2e_prefill_stats_t *stats);

/* kvedge_e2e_prefill_kv for K/V computed by another engine (the llama.cpp bridge,
 * clients/llamacpp/bridge.h): no decoder, the model record m is the shape (layers, kv_heads,
 * head_dim; a rotary model is one whose id carries a rotary suffix, whose K channels ThinK
 * keeps in rotate-half pairs). k and v: [layers][kv_heads][n][head_dim] floats, K post-rotary
 * in Hugging Face's layout. Errors: those of kvedge_e2e_prefill_kv; KVEDGE_EINVAL for an
 * invalid record (kvedge_model_check). */
int kvedge_e2e_prefill_model_kv(kvedge_client_t *cloud, const kvedge_model_t *m, const int32_t *ctx,
                                uint32_t n, uint32_t chunk_tokens, const kvedge_e2e_quant_t *q,
                                const float *k, const float *v, kvedge_chunk_id_t *ids, size_t max,
                                kvedge_e2e_prefill_stats_t *stats);

/* The emulated cloud model service of the cloud-only baseline: holds the context's K/V (its
 * prefix cache) and serves one request at a time behind an emulated link. */
typedef struct kvedge_e2e_cloud_t kvedge_e2e_cloud_t;

/* Prefills ctx once (not part of any request's time) and keeps its K/V. link: "RATE,LATENCY"
 * of the edge-cloud link, both directions (access/shaper.h), NULL = unshaped. Errors:
 * KVEDGE_EINVAL (bad arguments or link spec), KVEDGE_ENOMEM, the decoder's errors. */
int kvedge_e2e_cloud_new(const kvedge_decoder_t *d, const int32_t *ctx, uint32_t n,
                         const char *link, kvedge_e2e_cloud_t **out);
void kvedge_e2e_cloud_destroy(kvedge_e2e_cloud_t **self_p);

/* One layer of a decode, as it went. */
typedef struct {
    char source[64]; /* the source that delivered it ("" when none); "local" when computed */
    int kind;        /* kvedge_fetch_source_t kind of that source; -1 when computed */
    int reason;      /* kvedge_fetch_reason_t (kvedge_fetch_reason_name) */
    bool computed;   /* the decoder computed this layer's context K/V itself */
    /* Large–small: the cloud (mapped) model's layer whose K/V, adapted, the decoder used for
     * this layer; -1 when it used its own model's (fetched or computed). A mapped layer whose
     * adaptation failed is computed (-1, adapt_failed). */
    int from_layer;
    bool adapt_failed;
    double ready_us; /* since the request started: the decoder's wait for the layer returned
                      * (resident or reported missing; not before the previous layer ran) */
    double done_us;  /* since the request started: decoder layer finished (prompt) */
    /* The BLAS threads the decoder computed this layer on (0 in cloud-only mode); yielded:
     * fewer than the process's, because it was ahead of the fetch (the next layer had not
     * arrived) and left the fetch path those cores (kvedge_decoder_share_cores). A yielded
     * layer's time is not fed back as the decoder's speed. */
    int blas_threads;
    bool yielded;
} kvedge_e2e_layer_t;

typedef struct {
    kvedge_e2e_mode_t mode;
    /* Required in every mode. */
    const kvedge_decoder_t *decoder;
    const int32_t *ctx;
    uint32_t ctx_len; /* >= 1 */
    const int32_t *prompt;
    uint32_t prompt_len; /* >= 1 */
    uint32_t max_new;    /* tokens to generate, >= 1; the first comes from the prompt's logits */
    /* > 1: the greedy pick penalizes tokens of the prompt and of what it generated
     * (kvedge_decoder_pick); 0 or 1: plain greedy. The same in every mode. */
    float repetition_penalty;
    /* KVEDGE_E2E_KVEDGE: a client of the edge proxy (role proxy; a store node also works:
     * GET_LAYER streams, no plan), the model record, and the chunking used at prefill. */
    kvedge_client_t *proxy;
    const kvedge_model_t *model;
    uint32_t chunk_tokens; /* 0 = KVEDGE_E2E_CHUNK_TOKENS_DEFAULT */
    /* Give the proxy the decoder's time estimates (kvedge_decoder_estimate, corrected by the
     * layer times of earlier decodes, see kvedge_e2e_decode) so it may plan layers as
     * "recompute"; false: fetch only, only layers nobody has are computed. */
    bool plan_recompute;
    /* Pipeline ring slots (each sized by kvedge_e2e_slot_bytes); 0 = KVEDGE_E2E_RING_DEFAULT. */
    uint32_t ring_slots;
    int deadline_ms; /* the fetch's deadline; 0 = the client's default */
    /* Large–small (KVEDGE_E2E_KVEDGE only; both or neither): the cloud model whose layers may
     * stand in for the decoder's (its record: id as the proxy knows it, layers, its KV
     * heads, head_dim), and the adapter from it (clients/e2e/adapter.h; its cloud_id must be
     * mapped_model->id and its shapes the two models', kvedge_adapter_check). The chunk chain
     * of mapped_model over ctx goes in the FETCH beside the decoder's; a layer the proxy
     * delivers as the cloud's goes through kvedge_adapter_apply (a delivered cloud layer
     * other than kvedge_adapter_from's, or a failed adaptation, makes it computed here).
     * Needs a proxy (not a store node). Borrowed. */
    const kvedge_model_t *mapped_model;
    const kvedge_adapter_t *adapter;
    /* The cache optimizer (KVEDGE_E2E_KVEDGE through a proxy): the precisions the edge
     * accepts (best first) and its quality budget (kvedge_fetch_req_t). accept NULL: the
     * blocks as stored. */
    const kvedge_prec_t *accept;
    size_t n_accept;
    kvedge_quality_metric_t quality_metric;
    double quality_budget;
    /* KVEDGE_E2E_CLOUD_ONLY. */
    kvedge_e2e_cloud_t *cloud;
    /* Optional, any mode: receives the logits (vocab floats) the first token was taken from
     * (the prompt's last position), as the decoder that ran computed them. NULL: not wanted. */
    float *logits;
} kvedge_e2e_request_t;

typedef struct {
    kvedge_e2e_mode_t mode;
    double ttft_us;  /* request start to the first generated token known at the edge */
    double total_us; /* request start to the last generated token known at the edge */
    double queue_us; /* cloud-only: time waiting for the cloud model to be free */
    uint32_t generated;
    /* Bytes the edge sent and received for this request over the network. kvedge mode: the
     * FETCH (or GET_LAYER) requests and the stream messages as the protocol encodes them
     * (kvedge_pipeline_stats_t sent_bytes, msg_bytes; flow-control CREDIT headers not
     * counted); cloud-only: the emulated messages. */
    uint64_t sent_bytes, received_bytes;
    /* Bytes of the user's prompt (token ids, KVEDGE_E2E_TOKEN_WIRE_BYTES each) that left the
     * edge: prompt_len * 4 for cloud-only, 0 otherwise. */
    uint64_t prompt_bytes_sent;
    uint64_t weights_bytes; /* the edge decoder's weights (0 for cloud-only: the edge runs none) */
    uint64_t kv_bytes;      /* context + local K/V and staging the edge held for the request */
    uint32_t layers;        /* the decoder's layers; kvedge and edge-only modes fill layer[] */
    uint32_t fetched, computed; /* layers fetched / computed locally (edge-only: all computed) */
    /* Large–small: the request named a mapped model (printed as mode "ce-lslm"), its id, and
     * how many of the fetched layers were the cloud's, adapted. */
    bool large_small;
    char mapped_model[KVEDGE_MODEL_ID_MAX_BYTES + 1];
    uint32_t adapted;
    bool have_plan; /* kvedge mode through a proxy: plan is the proxy's plan */
    kvedge_fetch_plan_t plan;
    kvedge_e2e_layer_t layer[KVEDGE_FETCH_MAX_LAYERS];
} kvedge_e2e_result_t;

/* The mode a result ran in: "ce-lslm" for a large-small request, else
 * kvedge_e2e_mode_name(res->mode). */
const char *kvedge_e2e_result_mode(const kvedge_e2e_result_t *res);

/* Runs one request in req->mode and fills *res (about 100 KiB: allocate it) and tokens
 * (max_new ids, greedy: the first from the prompt's logits, then max_new - 1 decoder steps).
 * Errors: KVEDGE_EINVAL (a field missing for the mode, bad sizes, a model record whose shape
 * is not the decoder's, a cloud holding another context than ctx; mapped_model without adapter or
 * the reverse, either outside KVEDGE_E2E_KVEDGE, an adapter whose cloud_id is not mapped_model->id,
 * a store-node client), KVEDGE_ESHAPE (an adapter whose shapes are not the two models', or a model
 * record whose rotary fingerprint is not the decoder's: a context prefilled with other rotary
 * settings), KVEDGE_ETOOBIG (ctx_len + prompt_len + max_new over the decoder's positions),
 * KVEDGE_ENOMEM, the pipeline's and the decoder's errors (a layer that failed rather than missed,
 * e.g. KVEDGE_ETIMEDOUT, or KVEDGE_ENOMODEL from a proxy that knows the model neither built in nor
 * from its master). Thread-safe for distinct requests (each uses its own session); several threads
 * may share a decoder, a cloud, but not a proxy client. Learning the decoder's speed: after a
 * successful kvedge or edge-only decode, the decoder's measured time on each layer but the last
 * (done_us - max(ready_us, the previous layer's done_us): its wait for the layer left out) goes
 * back to the model through kvedge_decoder_observe: a fetched layer's as compute time; a computed
 * layer's extra time over the request's median fetched layer, per context layer it ran, as
 * recompute time (with no fetched layer, edge-only, split between the two in the proportion of the
 * estimates). So the next request on the same model in this process gives the proxy estimates
 * corrected by what the decoder really did while layers arrived (kvedge_decoder_forget drops them).
 */
int kvedge_e2e_decode(const kvedge_e2e_request_t *req, int32_t *tokens, kvedge_e2e_result_t *res);

/* Prints the request's result for people: per-layer source and reason (kvedge mode; for
 * ce-lslm also a line per layer saying which cloud layer fed it, "layer 2 <- cloud kjv-cloud
 * layer 4 via cloud1 (planned)"), TTFT, total, bytes; or as one JSON object when json (ce-lslm
 * adds "mapped_model", "adapted" and per layer "from_layer", null when its own). */
void kvedge_e2e_print(FILE *f, const kvedge_e2e_result_t *res, bool json);

#ifdef __cplusplus
}
#endif
#endif
