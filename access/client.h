/* The protocol client (libkvedge's core): the client API of a kvedge store node and of an
 * edge proxy. Installed as <kvedge/client.h>, included by <kvedge/kvedge.h>.
 *
 * Threads: a kvedge_client_t is thread-safe. It owns one I/O thread and one ZeroMQ DEALER
 * socket; asynchronous calls and streams from any thread are queued to it. Synchronous calls
 * block the calling thread until the reply or the deadline; up to 4 at a time each run on a
 * DEALER of its own to the same node (same key, options and heartbeats, opened on first use
 * and kept), which spares the handoffs to and from the I/O thread; more, and every call of a
 * client with an emulated link (opts.link), are queued to the I/O thread too. Asynchronous calls
 * return at once and complete through a callback that runs on the client's I/O thread (keep it
 * short; never call the client's synchronous functions from inside it).
 *
 * Errors: every function returns 0 or a negative KVEDGE_E* code (kvedge_strerror() gives the
 * text); kvedge_client_last_error() then says, where there is more to say, what exactly was
 * wrong and what to do (the endpoint's form, the file that is missing, which daemon answers
 * the request). Every call has a deadline (the options' deadline_ms unless the call takes one);
 * when the node dies or stalls, the call returns KVEDGE_ETIMEDOUT within it. If a function that
 * takes a callback fails, the callback is never called.
 *
 * The library never logs and never exits. It turns off czmq's process-wide SIGINT/SIGTERM
 * handlers (zsys_handler_set(NULL)) so the application keeps its own signal behaviour. */
#ifndef KVEDGE_ACCESS_CLIENT_H
#define KVEDGE_ACCESS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/proto.h"
#include "access/codec/block.h"
#include "access/codec/chunk.h"
#include "access/codec/error.h"
#include "access/codec/model.h"
#include "access/codec/prec.h"
#include "access/codec/stats.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_CLIENT_DEADLINE_MS_DEFAULT 5000
#define KVEDGE_CLIENT_CREDIT_DEFAULT      8
#define KVEDGE_CLIENT_WINDOW_DEFAULT      (4u << 20)
/* A GET_LAYER stream's pack frame: at most this many heads and block bytes per data
 * message (within the node's max frame). */
#define KVEDGE_CLIENT_PACK_BLOCKS 64
#define KVEDGE_CLIENT_PACK_BYTES  (1u << 20)
#define KVEDGE_CLIENT_WINDOW_MAX  (256u << 20)

typedef struct kvedge_client_t kvedge_client_t;

/* The longest message kvedge_client_last_error returns, its NUL included. */
#define KVEDGE_CLIENT_ERROR_BYTES 512

/* What the latest kvedge_client_* call on this thread said when it failed, beyond its code:
 * e.g. 'endpoint "127.0.0.1:7400" has no transport: an endpoint is tcp://HOST:PORT ... or
 * ipc://PATH', 'client certificate /k/me_secret: no such file ...', 'tcp://... is an edge
 * proxy ("p1", as its HELLO says): STAT is answered by store nodes ...'. "" when that call
 * succeeded or its code says it all. Every kvedge_client_* call but destroy, node and
 * opts_default resets it. The string belongs to the calling thread: valid until its next
 * kvedge_client_* call. Never NULL. (A FETCH stream's own errors arrive in on_done, on the
 * I/O thread: they carry no message.) */
const char *kvedge_client_last_error(void);

/* Structs a caller fills and passes in start with `size`: sizeof the struct as the caller
 * compiled it, set by their _default function (or `.size = sizeof(T)` in an initializer).
 * The library checks it: fields appended by a newer library take their defaults for a caller
 * built against older headers, and a size the library does not know (0: never set; larger
 * than its own: headers newer than the library) fails with KVEDGE_EINVAL and a message for
 * kvedge_client_last_error. Other fields keep their place; new ones are only appended. */
typedef struct {
    size_t size;             /* sizeof(kvedge_client_opts_t): kvedge_client_opts_default */
    const char *endpoint;    /* e.g. "tcp://10.0.0.5:7400" (required) */
    const char *server_key;  /* the node's public key, Z85 (40 chars) or a path to its public
                              * certificate; NULL = plaintext (the node must allow it) */
    const char *client_cert; /* path to this client's secret certificate (kvedge keygen);
                              * required with server_key */
    int deadline_ms;         /* default deadline of every call; 0 = default */
    uint32_t credit;         /* stream messages in flight, at least; 0 = default */
    const char *name;        /* sent in HELLO; NULL = "libkvedge" */
    /* Emulated link for tests and benchmarks on loopback, e.g. "100mbit,20ms": every message
     * in each direction waits as a link of that rate and one-way latency would make it
     * (access/shaper.h). NULL = none. A bad spec fails connect with KVEDGE_EINVAL. */
    const char *link;
    /* Block bytes a stream (GET_LAYER, FETCH) keeps in flight: when its blocks are small, the
     * client grants more than `credit` messages, up to about this many bytes (at most the
     * node's max credit; it never grants less than `credit`). 0 = default (4 MiB), at most
     * KVEDGE_CLIENT_WINDOW_MAX; 1 keeps every stream at `credit`. */
    uint32_t window_bytes;
    /* GET_LAYER streams ask the node for packed data messages (several heads per message,
     * docs/protocol.md "Packed data messages") unless this is set; a node that cannot pack
     * refuses the ask, and the client then repeats the stream unpacked and asks that
     * connection no more. Set it only to compare or diagnose: the blocks are the same. */
    bool no_pack;
} kvedge_client_opts_t;

/* What the node said in HELLO. */
typedef struct {
    kvedge_role_t role;
    char name[256];
    uint8_t tenant_tag[16];
    uint32_t max_items;
    uint32_t max_chunks;
} kvedge_node_info_t;

/* Fills *opts with the defaults (every field 0 or NULL, size set): set endpoint (and keys)
 * then connect. Never fails; opts NULL does nothing. */
void kvedge_client_opts_default(kvedge_client_opts_t *opts);

/* Connects and says HELLO within the deadline. Caller owns *out.
 * Errors: KVEDGE_EINVAL (an option: the endpoint is tcp://HOST:PORT or ipc://PATH),
 * KVEDGE_EIO (bad certificate or key file: the message names it), KVEDGE_ETIMEDOUT (no
 * answer: node down, wrong key, or key not allowlisted: CURVE refusals are silent),
 * KVEDGE_EVERSION, KVEDGE_EPROTO. */
int kvedge_client_connect(const kvedge_client_opts_t *opts, kvedge_client_t **out);

/* Cancels what is in flight (their callbacks run with KVEDGE_ECLOSED), closes. NULL-safe,
 * idempotent, nulls *self_p. Destroy every client before the process exits: czmq's exit-time
 * cleanup aborts when it finds a client's I/O thread still running. */
void kvedge_client_destroy(kvedge_client_t **self_p);

/* The node's HELLO answer, owned by the client: valid until kvedge_client_destroy. NULL for a
 * NULL client; never fails otherwise. */
const kvedge_node_info_t *kvedge_client_node(kvedge_client_t *c);

/* Round trip of `bytes` bytes of payload (0 = latency only). rtt_us and bw_bytes_per_s (may
 * be NULL) receive the measured round trip and payload bandwidth (both directions).
 * Errors: KVEDGE_EINVAL (c NULL, bytes over KVEDGE_WIRE_MAX_PING_BYTES), KVEDGE_ENOMEM,
 * KVEDGE_ETIMEDOUT, KVEDGE_ECLOSED, KVEDGE_EBACKLOG, KVEDGE_EPROTO. */
int kvedge_client_ping(kvedge_client_t *c, size_t bytes, double *rtt_us, double *bw_bytes_per_s);

/* What this client has measured of its link to the node: an EWMA over completed exchanges
 * (request to last byte; transfers of at least 64 KiB update the bandwidth, smaller ones the
 * round trip; access/meter.h). Zeros until measured. Any pointer may be NULL. Sends nothing.
 * Errors: KVEDGE_EINVAL (c NULL). */
int kvedge_client_link(kvedge_client_t *c, double *bw_bytes_per_s, double *rtt_us,
                       uint64_t *samples);

/* Registers a model shape on the node, in the client's tenant (built-in models need not be
 * registered; docs/protocol.md, "Model ids and tenants"). Errors: KVEDGE_ESHAPE (the id is
 * built in, node-wide or already this tenant's, with another shape), KVEDGE_EINVAL, transport
 * errors. */
int kvedge_client_put_model(kvedge_client_t *c, const kvedge_model_t *model);

/* The shape of model id the client's tenant sees on the node (built in, its own, or
 * node-wide), registering nothing. Errors: KVEDGE_EINVAL (bad id), KVEDGE_ENOMODEL (none),
 * transport errors. */
int kvedge_client_get_model(kvedge_client_t *c, const char *id, kvedge_model_t *out);

/* One block to store: the chunk it belongs to (ids as computed by kvedge_chunk_chain with an
 * empty salt), layer, head, and the encoded block (kvedge_block_encode). */
typedef struct {
    kvedge_chunk_info_t chunk; /* id, parent, has_parent, model_id, index, tokens */
    uint16_t layer;
    uint16_t head;
    const uint8_t *block;
    size_t len;
    bool pin;
    uint32_t ttl_s; /* 0 = node default, KVEDGE_TTL_NEVER = never */
} kvedge_put_item_t;

/* Stores n items (batched into messages of at most the node's limit); the blocks are copied,
 * the caller keeps its memory. statuses (may be NULL; n entries, caller's memory) receives each
 * item's result. Returns 0 when every item was stored, else the first failing item's error
 * (KVEDGE_ENOMODEL, KVEDGE_ESHAPE, KVEDGE_ECORRUPT, KVEDGE_ENOSPC, ...: docs/protocol.md, "PUT
 * item statuses") or a transport error (KVEDGE_ETIMEDOUT, KVEDGE_ECLOSED, KVEDGE_EBACKLOG,
 * KVEDGE_EBUSY from an overloaded node, KVEDGE_EPROTO); KVEDGE_EINVAL for NULL items. */
int kvedge_client_put(kvedge_client_t *c, const kvedge_put_item_t *items, size_t n, int *statuses);

/* A block fetched into caller memory. */
typedef struct {
    int status;    /* 0, KVEDGE_ENOTFOUND / KVEDGE_ECORRUPT (a miss), or another error */
    size_t offset; /* into the caller's buffer */
    size_t len;
} kvedge_fetched_t;

/* Fetches blocks by key into buf (capacity cap), one after the other; out[i] says where key
 * i landed. Returns 0 if the call completed (per-key misses are in out[i].status),
 * KVEDGE_ENOSPACE if buf is too small (what fit is kept, the rest has status
 * KVEDGE_ENOSPACE), or a transport error. */
int kvedge_client_get(kvedge_client_t *c, const kvedge_block_key_t *keys, size_t n, uint8_t *buf,
                      size_t cap, kvedge_fetched_t *out);

/* Called for every head of a GET_LAYER stream as it arrives, in (chunk, head) order, on the
 * I/O thread. data is valid only during the call. status 0 with data, or a miss status. */
typedef void(kvedge_block_fn)(void *ctx, uint32_t chunk_index, uint16_t head, int status,
                              const uint8_t *data, size_t len);
/* Called once when the stream is over: status 0, or why it ended early. heads = data
 * messages received. */
typedef void(kvedge_done_fn)(void *ctx, int status, uint32_t heads);

/* Streams one layer of a prefix (n chunks) head by head with credit flow control; returns at
 * once. on_block and on_done run on the I/O thread; on_done always runs exactly once when
 * this returns 0. */
int kvedge_client_get_layer_async(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                                  uint16_t layer, int deadline_ms, kvedge_block_fn *on_block,
                                  kvedge_done_fn *on_done, void *ctx);

/* The synchronous form: blocks land one after the other in buf; out has n * heads entries in
 * (chunk, head) order (out_cap entries available); *heads receives the model's KV head count
 * as the node streamed it. Errors as kvedge_client_get, plus the stream's end status. */
int kvedge_client_get_layer(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                            uint16_t layer, uint8_t *buf, size_t cap, kvedge_fetched_t *out,
                            size_t out_cap, uint32_t *heads);

/* GET_LAYER at a precision (the cache optimizer): the node serves each head at the first
 * precision of accept (n_accept access/codec/prec.h rungs, best first) it holds, or derives it from
 * a finer block when its settings allow (docs/protocol.md, "Precisions"); a head it can serve
 * at none of them is a miss (KVEDGE_ENOTFOUND). The blocks say their own precision
 * (kvedge_prec_of_block). accept NULL and n_accept 0: the blocks as stored, exactly as
 * kvedge_client_get_layer_async / kvedge_client_get_layer. Errors: those of the plain forms;
 * KVEDGE_EINVAL for a list kvedge_prec_list_check refuses (empty, too long, unknown rung,
 * a rung twice). */
int kvedge_client_get_layer_prec_async(kvedge_client_t *c, const kvedge_chunk_id_t *chunks,
                                       size_t n, uint16_t layer, const kvedge_prec_t *accept,
                                       size_t n_accept, int deadline_ms, kvedge_block_fn *on_block,
                                       kvedge_done_fn *on_done, void *ctx);
int kvedge_client_get_layer_prec(kvedge_client_t *c, const kvedge_chunk_id_t *chunks, size_t n,
                                 uint16_t layer, const kvedge_prec_t *accept, size_t n_accept,
                                 uint8_t *buf, size_t cap, kvedge_fetched_t *out, size_t out_cap,
                                 uint32_t *heads);

/* A received block the caller holds on to (kvedge_client_block_take): opaque; its bytes are
 * those the on_block callback was given (kvedge_block_ref_data). */
typedef struct kvedge_block_ref kvedge_block_ref_t;

/* Zero-copy receive: takes ownership of the received message part that holds the block an
 * on_block callback (GET_LAYER's kvedge_block_fn, FETCH's kvedge_fetch_cbs_t.on_block) was
 * just given, so its `data` stays valid after the callback returns, until the reference is
 * freed. Call it only from inside such a callback, on the thread that runs it. Returns the
 * reference (caller owns it: kvedge_client_block_free), or NULL outside a callback, for a miss
 * (data NULL) or when already taken; it never fails otherwise. The bytes are exactly the
 * `data`, `len` of the call: verify them (kvedge_block_parse) as always. A held reference
 * keeps its receive buffer alive (at most its own size plus ZeroMQ's receive batch, 8 KiB by
 * default), so hold few, briefly. */
kvedge_block_ref_t *kvedge_client_block_take(void);

/* The bytes a reference holds: the block's first byte, *len (may be NULL) its length; valid
 * until the reference is freed. NULL (and *len 0) for a NULL reference. */
const uint8_t *kvedge_block_ref_data(const kvedge_block_ref_t *ref, size_t *len);

/* Frees a reference from kvedge_client_block_take, from any thread; NULL-safe. Its bytes are
 * gone after it. */
void kvedge_client_block_free(kvedge_block_ref_t *ref);

/* Longest cached prefix: *hit receives how many leading chunks of ids the node holds whole
 * (every layer and head of the chunk's model). Errors: KVEDGE_EINVAL (c or hit NULL, ids
 * NULL with n > 0), and transport errors as every call. */
int kvedge_client_lookup(kvedge_client_t *c, const kvedge_chunk_id_t *ids, size_t n, size_t *hit);

/* A chunk as LIST reports it (ids are the client's own). */
typedef struct {
    kvedge_chunk_info_t chunk;
    uint32_t blocks;
    uint64_t bytes;
    uint32_t pinned_blocks;
    uint64_t fp16_bytes;
} kvedge_chunk_entry_t;

/* Lists the tenant's chunks in id order after `after` (NULL = from the start), at most max,
 * into the caller's out. *n receives the count, *more whether more follow. Errors:
 * KVEDGE_EINVAL (c, out or n NULL; max 0), and transport errors as every call. */
int kvedge_client_list(kvedge_client_t *c, const kvedge_chunk_id_t *after,
                       kvedge_chunk_entry_t *out, size_t max, size_t *n, bool *more);

/* Every chunk of the tenant, in id order, paging through LIST. Caller frees *out (free).
 * Errors: those of kvedge_client_list, KVEDGE_ENOMEM; *out is NULL then. */
int kvedge_client_list_all(kvedge_client_t *c, kvedge_chunk_entry_t **out, size_t *n);

/* STAT: what the store node holds and has done (kvedge_store_stats_t, <kvedge/stats.h>:
 * blocks and bytes stored, pinned, quarantined, capacity, and the node's counters since it
 * opened its store), written into *out (caller's memory). Store nodes answer it, edge
 * proxies do not. Errors: KVEDGE_EINVAL (c or out NULL; the peer is an edge proxy, as its
 * HELLO said: kvedge_client_last_error says so), KVEDGE_ETIMEDOUT, KVEDGE_ECLOSED,
 * KVEDGE_EPROTO, and the node's own error as its reply says. */
int kvedge_client_stat(kvedge_client_t *c, kvedge_store_stats_t *out);

/* MONITOR: what the node or edge proxy has seen, as the JSON document of docs/protocol.md
 * ("MONITOR"), with at most `top` (0 ... KVEDGE_WIRE_MAX_MONITOR_TOP) hot prefixes. *json is
 * a malloc'd NUL-terminated copy (caller frees), *len its length (may be NULL). The
 * document comes from a peer: parse it as untrusted (it is bounded and NUL-free).
 * Errors: as every call; KVEDGE_EPROTO from a daemon that predates MONITOR. */
int kvedge_client_monitor(kvedge_client_t *c, uint32_t top, char **json, size_t *len);

/* Store-wide eviction of least-recently-used unpinned blocks down to target_bytes. Needs an
 * admin key (kvedge keygen --admin) or plaintext loopback: else KVEDGE_EDENIED. KVEDGE_EFULL:
 * pinned blocks alone exceed the target. blocks/bytes (may be NULL) receive what went. */
int kvedge_client_evict(kvedge_client_t *c, uint64_t target_bytes, uint64_t *blocks,
                        uint64_t *bytes);

/* DELETE (the chunk and every chunk chained below it), PIN, UNPIN of n chunks; changed[i]
 * (may be NULL; n entries, caller's memory) receives the blocks affected per chunk. A chunk
 * the node does not hold changes nothing and is no error. Errors: KVEDGE_EINVAL (a bad
 * argument), the node's store error, and transport errors as every call. */
int kvedge_client_delete(kvedge_client_t *c, const kvedge_chunk_id_t *ids, size_t n,
                         uint32_t *changed);
int kvedge_client_pin(kvedge_client_t *c, const kvedge_chunk_id_t *ids, size_t n, bool pin,
                      uint32_t *changed);

/* ---------------------------------------------------------------- fetch through a proxy */

/* A planned fetch of layers [first_layer, first_layer + layers) of a context from an edge
 * proxy (`kvedge proxy`), which picks a source per layer, streams them from several sources
 * at once and delivers them in layer order (docs/protocol.md, "FETCH"). */
typedef struct {
    size_t size;                     /* sizeof(kvedge_fetch_req_t): kvedge_fetch_req_default */
    const char *model_id;            /* the model the chunks were computed with */
    const kvedge_chunk_id_t *chunks; /* the context's chunk chain */
    size_t n;                        /* 1 ... 4096 */
    uint16_t first_layer;
    uint16_t layers; /* 1 ... 1024 */
    uint32_t tokens; /* context tokens over all chunks, for pricing; 0 = unknown */
    /* The decoder's time per layer (t_le,c) and its extra time to compute a layer's context
     * KV itself, in microseconds, `layers` entries each; both NULL: fetch only (the proxy
     * prices recomputation as never worth it). */
    const float *compute_us;
    const float *recompute_us;
    int deadline_ms; /* 0 = the client's default */
    /* large–small: the model whose layers may stand in for this one's (a layer map
     * mapped->this registered with the master); NULL: none */
    const char *mapped_model_id;
    const kvedge_chunk_id_t *mapped_chunks; /* its chain over the same tokens, n ids */
    /* The cache optimizer: the precisions (access/codec/prec.h rungs, best first, n_accept of them)
     * the client accepts for fetched layers, and a quality budget the proxy keeps the sum of
     * the chosen layers' costs under (the model's per-layer sensitivity profile, the metric's
     * unit; KVEDGE_QUALITY_NONE: no budget, budget 0). accept NULL: the blocks as stored. */
    const kvedge_prec_t *accept;
    size_t n_accept;
    kvedge_quality_metric_t quality_metric;
    double quality_budget;
} kvedge_fetch_req_t;

#define KVEDGE_FETCH_MAX_SOURCES 32
#define KVEDGE_FETCH_MAX_LAYERS  1024

typedef struct {
    char name[64];
    kvedge_plan_kind_t kind; /* kvedge_plan_kind_name */
    bool up;
    double rtt_us;
    double bw_bytes_per_s;
} kvedge_fetch_source_t;

/* The proxy's plan, as it sent it before the first block (about 30 KiB). */
typedef struct {
    uint32_t nsources;
    kvedge_fetch_source_t source[KVEDGE_FETCH_MAX_SOURCES];
    uint32_t layers;
    uint32_t split; /* m: layers below it were priced "near" (local, peer, history) */
    /* 1e300 means unpriced: a request without decoder times allows no recomputation, so
     * recompute-all (and cloud-only where the cloud lacks a layer) has no price. */
    double total_us, bound_us, cloud_only_us, recompute_all_us, load_then_compute_us;
    struct {
        int source;                  /* index into source[], -1: compute it locally */
        kvedge_plan_reason_t reason; /* kvedge_plan_reason_name */
        double cost_us;
        int from_layer;  /* -1: this model's own layer; else the mapped model's layer planned
                            for it */
        int prec;        /* the rung planned (access/codec/prec.h); 0 without a precision choice */
        int prec_reason; /* why (kvedge_plan_prec_reason_name); 0 with prec 0 */
    } layer[KVEDGE_FETCH_MAX_LAYERS];
} kvedge_fetch_plan_t;

/* A layer is complete: delivered from source, or not delivered (status KVEDGE_ENOTFOUND: the
 * caller computes it). */
typedef struct {
    uint16_t layer;
    int source;                   /* -1 when nobody delivered it */
    const char *source_name;      /* "" when none; valid during the callback */
    kvedge_fetch_reason_t reason; /* kvedge_fetch_reason_name */
    int status;
    uint32_t blocks; /* blocks delivered for the layer (chunks x heads) */
    uint32_t attempts;
    int from_layer; /* -1 own; else the mapped model's layer delivered (blocks have its heads
                       and head_dim) */
    int prec;       /* the rung planned for a delivered layer; 0 without a precision choice */
} kvedge_fetch_layer_t;

/* Callbacks run on the client's I/O thread, in stream order: on_plan once, then per layer its
 * blocks (chunk, head order; data valid during the call) and on_layer; on_done exactly once
 * when kvedge_client_fetch_async returned 0. Any may be NULL. With mapped_model_id, a layer
 * the proxy served from the mapped model comes as that model's blocks (its KV heads and
 * head_dim) under this model's layer number, and its on_layer says from_layer. */
typedef struct {
    void (*on_plan)(void *ctx, const kvedge_fetch_plan_t *plan);
    void (*on_block)(void *ctx, uint16_t layer, uint32_t chunk_index, uint16_t head, int source,
                     int status, const uint8_t *data, size_t len);
    void (*on_layer)(void *ctx, const kvedge_fetch_layer_t *layer);
    void (*on_done)(void *ctx, int status);
} kvedge_fetch_cbs_t;

/* Starts a FETCH on a proxy; returns at once. Errors: KVEDGE_EINVAL (bad request; compute_us
 * without recompute_us or the reverse; a time negative or not finite; mapped_model_id without
 * mapped_chunks or the reverse, empty, too long or equal to model_id; accept refused by
 * kvedge_prec_list_check, n_accept without accept, a metric or budget refused by
 * kvedge_quality_budget_check, a metric without accept), KVEDGE_EPROTO (the peer is a store
 * node, as its HELLO said: only edge proxies answer FETCH), KVEDGE_ENOMEM, KVEDGE_EBACKLOG,
 * KVEDGE_ECLOSED. The stream's own errors come in on_done: KVEDGE_ENOMODEL
 * (the proxy does not know the model), KVEDGE_ESHAPE (layers outside it), KVEDGE_ETIMEDOUT,
 * KVEDGE_EPROTO. */
int kvedge_client_fetch_async(kvedge_client_t *c, const kvedge_fetch_req_t *req,
                              const kvedge_fetch_cbs_t *cbs, void *ctx);

/* Fills *req with the defaults (every field 0 or NULL: no decoder times, no mapped model, the
 * blocks as stored, no budget; size set). Never fails; req NULL does nothing. */
void kvedge_fetch_req_default(kvedge_fetch_req_t *req);

#ifdef __cplusplus
}
#endif
#endif
