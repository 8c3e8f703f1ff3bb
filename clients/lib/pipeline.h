/* The pipelined loader: streams layers of a cached context into the decoder's KV layout while
 * the decoder computes, so layer l can run while layers l+1.. are still on the wire.
 *
 * kvedge_pipeline_open starts a fetch of layers [first_layer, first_layer + layers) of a
 * context and returns at once. Blocks arrive on the client's I/O thread; each is verified
 * (kvedge_block_parse) and its decompressed body (kvedge_block_body) written straight into the
 * ring slot of its layer: pinned host memory (gpu/stage.h). On the CPU path a body stored
 * uncompressed (and 4-byte aligned, at least 4 KiB) is not copied at all: the verified block's
 * received frame is taken from the client (kvedge_client_block_take) and dequantized in
 * place, then freed with the slot (stats: zero_copy_blocks). A complete layer goes to the
 * pipeline's loader thread, which copies the slot to device memory on a copy stream, waits for
 * that copy on a compute stream, dequantizes the whole layer there in one kernel
 * (kvedge_gpu_dequant) and records the layer's event; without a device (or with a host
 * destination) it dequantizes on the CPU (kvedge_cpu_dequant), bit-identical. When the event
 * completes the layer is resident and its slot goes back to the ring.
 * kvedge_pipeline_wait(layer) returns when that layer is resident, or reports it as a miss
 * (the caller computes it), or the error that ended it.
 *
 * Source: a client connected to an edge proxy (HELLO role KVEDGE_ROLE_PROXY) makes one FETCH
 * (kvedge_client_fetch_async: planned, layers in order, a MISS record for every layer nobody
 * delivers, recomputation included when compute_us/recompute_us are given); a client of a
 * store node opens one GET_LAYER stream per layer, at most KVEDGE_PIPELINE_STREAMS_MAX at once,
 * and a head the node reports missing or corrupt makes its layer a miss.
 *
 * Bounded memory: ring_slots slots of slot_bytes pinned bytes (and as many device bytes on the
 * device path), whatever the number of layers, plus on the CPU path the received frames of
 * the zero-copy bodies a slot holds: at most one layer's blocks per slot (each frame its block
 * and ZeroMQ's few dozen bytes), freed when the layer is resident, missed or failed. A slot
 * still reserves a zero-copy body's room, so which layers fit slot_bytes does not depend on
 * it. Layer i always uses slot i % ring_slots and
 * cannot start until layer i - ring_slots has left it, so:
 *  - GET_LAYER: the stream of layer i is only opened once its slot is free; the I/O thread
 *    never waits.
 *  - FETCH: a block of layer i that comes before its slot is free is parked, never waited
 *    for: the pipeline keeps its received frame and holds back its credit (the client does
 *    not grant it back to the proxy), and every later message of the stream parks behind it
 *    in order. The loader stages parked blocks once the slot is free and then gives their
 *    credit back. The proxy therefore sends no more than the stream's credit window while
 *    the ring is full (parked memory is bounded by it; nothing is dropped), and the client's
 *    I/O thread goes on serving every other call and stream of the same client meanwhile.
 *    The slot frees through the loader alone (every earlier layer has fully arrived, since
 *    FETCH delivers in order), never through the network or the caller, so this cannot
 *    deadlock.
 *
 * Large–small (docs/largesmall.md, "Serving: the edge client"): with mapped_model the FETCH
 * also names another (cloud) model and its chunk chain; the proxy may deliver a layer as that
 * model's layer (the LAYER record's from_layer), whose blocks have its shape. Such a layer is
 * staged in that shape, dequantized on the CPU into an fp32 scratch, turned into this model's
 * K/V by the caller's adapt callback (on the loader thread) and copied into the destination;
 * an adaptation that fails makes the layer a miss.
 *
 * Threads: open, wait, stats and destroy may be called from any thread (wait from several);
 * never from a client callback. The pipeline runs one loader thread of its own.
 *
 * Memory: the destinations are the caller's and must stay valid until destroy returns; the
 * pipeline writes a layer's K and V only between open and that layer's wait returning 0, and
 * never after destroy returns. A layer reported as a miss or failed is not written at all.
 * The client must outlive the pipeline. */
#ifndef KVEDGE_CLIENTS_PIPELINE_H
#define KVEDGE_CLIENTS_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/client.h"
#include "gpu/dequant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ring slots when the options leave it 0. */
#define KVEDGE_PIPELINE_RING_DEFAULT 4
/* GET_LAYER streams open at once (store-node source): enough to keep a loopback or LAN link
 * busy while the loader works on earlier layers. */
#define KVEDGE_PIPELINE_STREAMS_MAX 4
/* Offset alignment of each block body in a slot (the dequantizer wants 4; 16 keeps SIMD
 * loads and DMA friendly). */
#define KVEDGE_PIPELINE_ALIGN_BYTES 16

typedef struct kvedge_pipeline_t kvedge_pipeline_t;

/* Large–small (docs/largesmall.md, "Serving: the edge client"): turns the context K/V of
 * layer from_layer of the mapped model, as delivered for this model's layer `layer`, into
 * this model's. k_src, v_src: [mapped kv_heads][tokens][mapped head_dim] fp32 (the context's
 * tokens, position 0 first); k_dst, v_dst: [kv_heads][tokens][head_dim] fp32 scratch to fill.
 * Runs on the pipeline's loader thread, one layer at a time. Returns 0, or a negative
 * KVEDGE_E* code: the layer then becomes a miss (the caller computes it). */
typedef int (*kvedge_pipeline_adapt_fn)(void *arg, uint16_t layer, uint16_t from_layer,
                                        const float *k_src, const float *v_src, uint32_t tokens,
                                        float *k_dst, float *v_dst);

/* Starts with `size` as every struct that can grow (access/client.h, kvedge_client_opts_t). */
typedef struct {
    size_t size;                     /* sizeof(kvedge_pipeline_opts_t): _opts_default sets it */
    kvedge_client_t *client;         /* borrowed; a store node or an edge proxy (required) */
    const kvedge_model_t *model;     /* id (FETCH) and shape: layers, kv_heads, head_dim */
    const kvedge_chunk_id_t *chunks; /* the context's chunk chain (copied) */
    size_t n_chunks;
    uint32_t chunk_tokens; /* tokens per chunk; the last chunk may hold fewer */
    uint32_t tokens;       /* context tokens over all chunks */
    uint16_t first_layer;
    uint16_t layers;
    /* Destinations: k[i] and v[i] receive layer first_layer + i (`layers` entries each; the
     * descriptors and page tables are copied at open, the memory they point to is not).
     * Each must have heads == model->kv_heads, head_dim == model->head_dim, dtype fp16, bf16
     * or fp32, and room for positions [token_offset, token_offset + tokens). */
    const kvedge_kv_dst_t *k;
    const kvedge_kv_dst_t *v;
    uint32_t token_offset; /* destination position of the context's token 0 */
    /* The destinations are device memory (kvedge_gpu_dev_alloc). With a device that selects
     * the GPU path; without one "device" memory is host memory and the CPU path runs, so the
     * same code works on both machines. false: host memory, CPU dequantize. */
    bool on_device;
    uint32_t ring_slots; /* 1 ... layers; 0 = KVEDGE_PIPELINE_RING_DEFAULT (at most layers) */
    /* Bytes of decompressed bodies one slot holds (a whole layer: chunks x heads). 0 = room
     * for fp16/bf16 lossless blocks and int8/int4 with groups of 4 or more; lossless fp32
     * needs 8 * tokens * head_dim per head and chunk. A layer that does not fit fails with
     * KVEDGE_ENOSPACE. */
    size_t slot_bytes;
    /* Proxy source only (kvedge_fetch_req_t): per layer, the decoder's time and its extra
     * time to recompute the layer's KV (microseconds, `layers` entries, copied), so the proxy
     * may plan a layer as "recompute" (it comes back as a miss). Both NULL: fetch only. */
    const float *compute_us;
    const float *recompute_us;
    /* The whole pipeline's deadline, from open; 0 = KVEDGE_CLIENT_DEADLINE_MS_DEFAULT.
     * Every layer is resident, missed or failed by then; wait returns by then (plus a
     * small margin) whatever the network does. */
    int deadline_ms;
    /* Large–small (docs/largesmall.md): a model whose layers may stand in for this one's, its
     * chunk chain over the same tokens (n_chunks ids, copied), and how a delivered layer of it
     * becomes this model's. The FETCH names both; the proxy may deliver a layer as the mapped
     * model's (its LAYER record's from_layer): its blocks are staged with the mapped shape,
     * dequantized to an fp32 scratch, adapted and written into the destination. A failed
     * adaptation (adapt's error, or a non-finite output) makes the layer a miss. NULL
     * mapped_model: none (mapped_chunks and adapt must be NULL too). Requires a proxy source,
     * on_device false and fp32 contiguous destinations (else KVEDGE_EINVAL); slot_bytes 0 then
     * sizes the slots for the larger of the two shapes. */
    const kvedge_model_t *mapped_model;
    const kvedge_chunk_id_t *mapped_chunks;
    kvedge_pipeline_adapt_fn adapt; /* required with mapped_model */
    void *adapt_arg;
    /* The cache optimizer (kvedge_fetch_req_t's fields, copied): the precisions accepted
     * (access/codec/prec.h rungs, best first) and the quality budget a proxy plans under. With a
     * store-node source each GET_LAYER carries the list (the node serves each head at the
     * first rung it holds or derives) and a budget is refused (KVEDGE_EINVAL: only a proxy
     * plans). accept NULL: the blocks as stored. Blocks are self-describing: a layer comes at
     * whatever rung was chosen and is dequantized as such; a transform-coded block ("tc") is
     * decoded on the host with this process's basis of the model (kvedge_basis_load_dir) into
     * the values of a lossless block of its dtype, which go on as that block would. */
    const kvedge_prec_t *accept;
    size_t n_accept;
    kvedge_quality_metric_t quality_metric;
    double quality_budget;
} kvedge_pipeline_opts_t;

/* One layer, as stats report it. Times are microseconds since open. */
typedef struct {
    uint16_t layer;
    bool done;           /* resident, missed or failed */
    int status;          /* 0 resident, KVEDGE_ENOTFOUND miss, else why it failed */
    uint32_t order;      /* 0-based rank among layers that became resident (done && status 0) */
    double arrived_us;   /* last block received and verified (layer complete on the wire) */
    double resident_us;  /* dequantized in place (its event completed), or reported */
    uint64_t wire_bytes; /* block bytes received */
    uint64_t raw_bytes;  /* decompressed body bytes staged */
    uint32_t blocks;
    /* Who delivered it, as the source said. FETCH: the layer's LAYER record (source name
     * from the plan, its kind, the record's reason). GET_LAYER: the node's HELLO name and
     * kind (a cloud node: cloud, an edge node: local), reason planned once resident; a miss
     * has reason miss, a timeout miss:deadline. */
    char source[64]; /* "" when none delivered it (a miss, a failure, no record yet) */
    int kind;        /* kvedge_fetch_source_t kind: 0 local, 1 peer, 2 cloud, 3 history; -1 none */
    int reason;      /* kvedge_fetch_reason_t (kvedge_fetch_reason_name); 0 when nothing said */
    /* Large–small: the mapped model's layer the source delivered for this one (its LAYER
     * record), -1 when its own layer (or none) was. adapt_failed: it was delivered but the
     * adaptation failed, so the layer is a miss (status KVEDGE_ENOTFOUND). */
    int from_layer;
    bool adapt_failed;
} kvedge_pipeline_layer_stats_t;

typedef struct {
    bool device;    /* GPU path (copy + kernel); false: CPU dequantize from the ring */
    bool via_proxy; /* FETCH through a proxy; false: GET_LAYER from a store node */
    uint32_t ring_slots;
    size_t slot_bytes;
    uint32_t resident, misses, failed; /* layers so far */
    uint64_t wire_bytes, raw_bytes;
    /* Bytes on the wire as the protocol encodes them (docs/protocol.md; ZeroMQ's own framing
     * not included). sent_bytes: the request messages (FETCH: header, spec, chunk ids and
     * the time estimates; GET_LAYER: header, layer and chunk ids per stream), but not the
     * CREDIT messages of flow control (a 32-byte header each, no payload; how many depends
     * on how the client's I/O thread drained its socket). msg_bytes: every stream message
     * received (headers, records, the plan, the blocks: wire_bytes is the blocks alone), and
     * the end message once a stream has ended normally (a FETCH's comes after its last
     * layer's record: a snapshot taken right after the last wait may not count it yet). */
    uint64_t sent_bytes, msg_bytes;
    double ring_wait_us; /* FETCH: time blocks were parked waiting for a free slot */
    double copy_us;      /* loader time issuing host-to-device copies */
    double dequant_us;   /* loader time dequantizing (CPU path) or launching (device path) */
    double done_us;      /* when the last layer was done, 0 while some are not */
    /* Large–small: layers delivered as the mapped model's and adapted (resident), and the
     * loader's time in the adapt callback (dequant_us includes it). */
    uint32_t adapted;
    double adapt_us;
    /* CPU path: blocks whose body was dequantized in place from the received frame instead
     * of being copied into the slot (stored uncompressed, aligned, at least 4 KiB), and their
     * body bytes (counted in raw_bytes too). Always 0 on the device path. */
    uint32_t zero_copy_blocks;
    uint64_t zero_copy_bytes;
} kvedge_pipeline_stats_t;

/* The ring pool. A destroyed pipeline gives its host slot buffers (pinned memory on the
 * device path) to a pool of this process, and the next pipeline takes them from it instead of
 * allocating: best fit among the held buffers of at least the slot's bytes and at most twice
 * them. At most 32 buffers and cap_bytes (KVEDGE_PIPELINE_POOL_BYTES_DEFAULT) are held; a
 * buffer that would exceed either is freed. Device staging buffers are still allocated per
 * pipeline. Thread-safe. */
#define KVEDGE_PIPELINE_POOL_BYTES_DEFAULT ((size_t)256 << 20)

typedef struct {
    size_t size;          /* sizeof(kvedge_pipeline_pool_stats_t), set by the caller */
    size_t cap_bytes;     /* the cap now */
    uint32_t held;        /* buffers held now */
    size_t held_bytes;    /* their bytes */
    uint64_t reused;      /* slot buffers a pipeline took from the pool */
    uint64_t allocated;   /* slot buffers allocated because none fitted */
    uint64_t kept, freed; /* buffers given back and kept; freed (over the caps, or trimmed) */
} kvedge_pipeline_pool_stats_t;

/* The smallest size kvedge_pipeline_pool_stats accepts: this first layout. */
#define KVEDGE_PIPELINE_POOL_STATS_SIZE_MIN (sizeof(kvedge_pipeline_pool_stats_t))

/* Sets the pool's byte cap (0: keep nothing, every buffer freed at destroy) and frees held
 * buffers down to it. */
void kvedge_pipeline_pool_set_cap(size_t bytes);
/* Frees every held buffer (the cap stays). */
void kvedge_pipeline_pool_trim(void);
/* The pool's counters into *out, whose size the caller sets (at least this layout's; a larger
 * struct keeps the fields this library does not know). KVEDGE_EINVAL: NULL or a smaller size. */
int kvedge_pipeline_pool_stats(kvedge_pipeline_pool_stats_t *out);

/* Validates everything, allocates the ring (pinned host memory, device staging on the device
 * path), starts the loader thread and the fetch, and returns at once. Caller owns *out.
 * Errors (nothing is fetched, *out untouched):
 *   KVEDGE_EINVAL: NULL or zero where a value is required; layers outside the model; tokens
 *     not matching n_chunks * chunk_tokens (the last chunk short or full); a destination with
 *     the wrong heads or head_dim, an unknown layout or dtype, a NULL base or page table, a
 *     page table entry outside [0, num_pages); ring_slots > layers; compute_us without
 *     recompute_us or the reverse; more chunks than one GET_LAYER stream may carry (the
 *     node's max_chunks); mapped_model without adapt or mapped_chunks, or not a valid model
 *     record, mapped_chunks or adapt without mapped_model, mapped_model with a store-node
 *     source, with on_device or with a destination that is not fp32 contiguous. (on_device
 *     with host memory cannot be detected: the caller's bug.)
 *   KVEDGE_ENOSPACE: a destination too small: cap_bytes below its tensor
 *     (kvedge_dequant_dst_bytes), contiguous tokens_cap < token_offset + tokens, or paged
 *     table_len * page_size < token_offset + tokens;
 *   KVEDGE_ENOBASIS: accept holds the tc rung but this process has no coding basis of the
 *     model registered (kvedge_basis_load_dir); kvedge_client_last_error says which;
 *   KVEDGE_ENOMEM; the errors of kvedge_client_fetch_async / get_layer_async and of
 *     gpu/stage.h (stream, event, pinned or device allocation). */
int kvedge_pipeline_open(const kvedge_pipeline_opts_t *opts, kvedge_pipeline_t **out);

/* Fills *opts with the defaults (every field 0 or NULL, size set): set client, model, chunks,
 * tokens, layers and the destinations, then open. Never fails; opts NULL does nothing. */
void kvedge_pipeline_opts_default(kvedge_pipeline_opts_t *opts);

/* Blocks until layer (a model layer number in [first_layer, first_layer + layers)) is done.
 * Returns 0: resident, K and V are in place (device path: its event completed); or
 * KVEDGE_ENOTFOUND: a miss (not on the node, a head missing or corrupt, planned as recompute
 * by the proxy, or a mapped layer whose adaptation failed): the caller computes it, its
 * destination is untouched; or why the layer failed: KVEDGE_ETIMEDOUT (deadline),
 * KVEDGE_ECLOSED (client destroyed), KVEDGE_ESHAPE (blocks not of the requested shape, or not
 * of the mapped model's for a layer delivered as that), KVEDGE_ENOSPACE (slot_bytes too
 * small), KVEDGE_EPROTO (also a from_layer outside the mapped model, or with none named), a
 * decode or GPU error. KVEDGE_EINVAL: layer out of range. */
int kvedge_pipeline_wait(kvedge_pipeline_t *p, uint16_t layer);

/* Whether layer is done (resident or a miss, as kvedge_pipeline_wait would return at once)
 * without blocking: 1 done, 0 not yet. A decoder asks it of the next layer to learn whether
 * it is ahead of the fetch (kvedge_decoder_share_cores). KVEDGE_EINVAL: NULL or a layer out of
 * range. */
int kvedge_pipeline_ready(kvedge_pipeline_t *p, uint16_t layer);

/* A snapshot of the counters; layers (may be NULL) receives up to max per-layer records, in
 * layer order. */
int kvedge_pipeline_stats(kvedge_pipeline_t *p, kvedge_pipeline_stats_t *out,
                          kvedge_pipeline_layer_stats_t *layers, size_t max);

/* The proxy's plan for this fetch (kvedge_client_fetch_async's on_plan), copied to *out.
 * The proxy sends it before the first block, so once any wait() has returned it is there;
 * before that this call blocks until it arrives, the stream ends without one, or the deadline
 * (plus the wait margin) passes. Errors: KVEDGE_EINVAL (NULL), KVEDGE_ENOTFOUND (no plan: a
 * store-node source, which has none, or a stream that ended or timed out before its plan). */
int kvedge_pipeline_plan(kvedge_pipeline_t *p, kvedge_fetch_plan_t *out);

/* Stops the loader (work already queued on the device finishes first), frees the ring and
 * returns; after it returns no destination is written. Streams still in flight end on the
 * client's I/O thread within their deadline and are dropped. NULL-safe, idempotent, nulls
 * *self_p. */
void kvedge_pipeline_destroy(kvedge_pipeline_t **self_p);

#ifdef __cplusplus
}
#endif
#endif
