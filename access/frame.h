/* The kvedge wire protocol (docs/protocol.md): header and payload records, and the strict
 * validation of whole messages. Pure functions on bytes: no ZeroMQ in here. */
#ifndef KVEDGE_ACCESS_FRAME_H
#define KVEDGE_ACCESS_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/codec/chunk.h"
#include "access/proto.h"
#include "access/codec/byteorder.h"
#include "access/codec/stats.h"
#include "access/codec/model.h"
#include "access/codec/prec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_WIRE_VERSION         1
#define KVEDGE_WIRE_HEADER_BYTES    32
#define KVEDGE_WIRE_MAX_FRAME_BYTES ((64u << 20) + 4096u)
#define KVEDGE_WIRE_MAX_FRAMES      2049
#define KVEDGE_WIRE_MAX_ITEMS       1024
#define KVEDGE_WIRE_MAX_CHUNKS      4096
#define KVEDGE_WIRE_MAX_REPLY_BYTES (256u << 20)
#define KVEDGE_WIRE_MAX_CREDIT      1024
#define KVEDGE_WIRE_MAX_PING_BYTES  (16u << 20)
/* MONITOR: the largest document a daemon sends, and the most hot prefixes one may ask for. */
#define KVEDGE_WIRE_MAX_MONITOR_BYTES (1u << 20)
#define KVEDGE_WIRE_MAX_MONITOR_TOP   64
#define KVEDGE_WIRE_MAX_LIST          4096
#define KVEDGE_WIRE_MAX_NAME_BYTES    255
#define KVEDGE_WIRE_MAX_DEADLINE_MS   600000
#define KVEDGE_WIRE_MODEL_ID_BYTES    124 /* NUL-padded field; ids up to 123 bytes */

#define KVEDGE_WIRE_FLAG_REPLY 0x0001u
#define KVEDGE_WIRE_FLAG_MORE  0x0002u
#define KVEDGE_WIRE_FLAG_END   0x0004u

/* Record sizes (docs/protocol.md, "Records used in payloads"). */
#define KVEDGE_WIRE_KEY_BYTES         36
#define KVEDGE_WIRE_PUT_ITEM_BYTES    208
#define KVEDGE_WIRE_MODEL_BYTES       136
#define KVEDGE_WIRE_CHUNK_ENTRY_BYTES 232
#define KVEDGE_WIRE_STATS_BYTES       136
#define KVEDGE_WIRE_NODE_INFO_BYTES   64
#define KVEDGE_WIRE_STREAM_HDR_BYTES  12
/* GET and GET_LAYER: an optional last frame lists the precisions (access/codec/prec.h rungs, one
 * byte each, best first) the reader accepts: at most this many bytes. The node checks the
 * list itself (kvedge_prec_list_check) and answers an empty, unknown or repeating one with
 * KVEDGE_EINVAL. */
#define KVEDGE_WIRE_MAX_ACCEPT KVEDGE_PREC_MAX_ACCEPT
/* GET_LAYER packing (docs/protocol.md, "Packed data messages"): the request's optional third
 * frame (after an accept list, empty or not) asks for data messages of up to max_blocks heads
 * and max_bytes block bytes; a data message's count is its heads (1 ... KVEDGE_WIRE_MAX_PACK). */
#define KVEDGE_WIRE_PACK_BYTES 8
#define KVEDGE_WIRE_MAX_PACK   64

typedef enum {
    KVEDGE_OP_HELLO = 1,
    KVEDGE_OP_PING = 2,
    KVEDGE_OP_PUT = 3,
    KVEDGE_OP_GET = 4,
    KVEDGE_OP_GET_LAYER = 5,
    KVEDGE_OP_LOOKUP = 6,
    KVEDGE_OP_LIST = 7,
    KVEDGE_OP_STAT = 8,
    KVEDGE_OP_DELETE = 9,
    KVEDGE_OP_PIN = 10,
    KVEDGE_OP_UNPIN = 11,
    KVEDGE_OP_CREDIT = 12,
    KVEDGE_OP_CANCEL = 13,
    KVEDGE_OP_MODEL = 14,
    KVEDGE_OP_EVICT = 15,
    KVEDGE_OP_FETCH = 16,   /* edge proxy: a planned, multi-source fetch of layers (a stream) */
    KVEDGE_OP_MONITOR = 17, /* what the daemon has seen: a JSON document (docs/protocol.md) */
} kvedge_op_t;

typedef struct {
    uint8_t version;
    uint8_t opcode;
    uint16_t flags;
    uint64_t request_id;
    int32_t status;
    uint32_t count;
    uint32_t credit;
    uint32_t deadline_ms;
} kvedge_wire_header_t;

/* One payload frame as bytes (frames[0] of a message is the header, not a payload frame). */
typedef struct {
    const uint8_t *data;
    size_t len;
} kvedge_wire_frame_t;

typedef struct {
    kvedge_role_t role;
    uint8_t tenant_tag[16];
    uint32_t max_frame_bytes;
    uint32_t max_items;
    uint32_t max_chunks;
    uint32_t max_credit;
    uint32_t default_credit;
} kvedge_wire_node_info_t;

/* A PUT item header (the block travels in the next frame). */
typedef struct {
    kvedge_chunk_info_t chunk; /* id, parent, has_parent, index, tokens, model_id */
    uint16_t layer;
    uint16_t head;
    bool pin;
    uint32_t ttl_s;
} kvedge_wire_put_item_t;

/* A LIST entry. */
typedef struct {
    kvedge_chunk_info_t chunk;
    uint32_t blocks;
    uint64_t bytes;
    uint32_t pinned_blocks;
    uint64_t fp16_bytes;
} kvedge_wire_chunk_entry_t;

/* The 12-byte first frame of a GET_LAYER data message. */
typedef struct {
    uint32_t chunk_index;
    uint16_t head;
    int32_t status;
} kvedge_wire_stream_hdr_t;

/* GET_LAYER's pack frame: max blocks u16 (2 ... KVEDGE_WIRE_MAX_PACK) | reserved u16 (0) |
 * max bytes u32 (1 ... KVEDGE_WIRE_MAX_FRAME_BYTES). */
typedef struct {
    uint16_t max_blocks;
    uint32_t max_bytes;
} kvedge_wire_pack_t;

/* FETCH (docs/protocol.md, "FETCH streams"): the request's spec record, and the three kinds
 * of stream data message, told apart by their first byte. */
#define KVEDGE_WIRE_FETCH_SPEC_BYTES       136
#define KVEDGE_WIRE_FETCH_TIMES_BYTES      8 /* per layer: compute_us f32 | recompute_us f32 */
#define KVEDGE_WIRE_FETCH_BLOCK_BYTES      16
#define KVEDGE_WIRE_FETCH_LAYER_BYTES      24
#define KVEDGE_WIRE_FETCH_PLAN_BYTES       56
#define KVEDGE_WIRE_FETCH_SOURCE_BYTES     80
#define KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES 16
#define KVEDGE_WIRE_FETCH_MAX_LAYERS       1024 /* layers per FETCH (the planner's limit) */
#define KVEDGE_WIRE_FETCH_MAX_SOURCES      32
#define KVEDGE_WIRE_FETCH_NAME_BYTES       64 /* source name field, NUL-padded */
/* The spec's flags: MAPPED (large-small) adds the mapped frame, always the last. Other bits
 * are refused. */
#define KVEDGE_WIRE_FETCH_FLAG_MAPPED 0x1u
/* PREC (the cache optimizer): a precision frame, after the times frame and before the
 * mapped frame: the precisions the client accepts and its quality budget. */
#define KVEDGE_WIRE_FETCH_FLAG_PREC 0x2u
/* PACK: BLOCK messages may carry several blocks (docs/protocol.md, "Packed data messages"):
 * count k (1 ... KVEDGE_WIRE_MAX_PACK), f1 k BLOCK records, one block frame per record of
 * status 0; a proxy puts at most KVEDGE_WIRE_FETCH_PACK_BYTES of blocks in one of k >= 2. */
#define KVEDGE_WIRE_FETCH_FLAG_PACK  0x4u
#define KVEDGE_WIRE_FETCH_PACK_BYTES (1u << 20)
#define KVEDGE_WIRE_FETCH_FLAGS_KNOWN                                                              \
    (KVEDGE_WIRE_FETCH_FLAG_MAPPED | KVEDGE_WIRE_FETCH_FLAG_PREC | KVEDGE_WIRE_FETCH_FLAG_PACK)
/* The precision frame: metric u8 | K u8 | reserved u16 | reserved u32 | budget f64 | K rungs
 * (16 + K bytes, K 0 ... KVEDGE_WIRE_MAX_ACCEPT). */
#define KVEDGE_WIRE_FETCH_PREC_HDR_BYTES 16
/* The mapped frame: mapped model id (124, NUL-padded) | reserved u32 | N chunk ids. */
#define KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES 128
/* from_layer of a layer that is the requested model's own (plan and LAYER records). */
#define KVEDGE_WIRE_FETCH_OWN_LAYER 0xFFFFu

typedef enum {
    KVEDGE_FETCH_MSG_BLOCK = 1, /* one head of one chunk of one layer */
    KVEDGE_FETCH_MSG_LAYER = 2, /* a layer is complete (or missed): which source, and why */
    KVEDGE_FETCH_MSG_PLAN = 3,  /* the plan, sent first */
} kvedge_fetch_msg_t;

typedef struct {
    char model_id[KVEDGE_WIRE_MODEL_ID_BYTES + 5];
    uint16_t first_layer;
    uint16_t layers; /* 1 ... KVEDGE_WIRE_FETCH_MAX_LAYERS; first + layers <= 65536 */
    uint32_t tokens; /* context tokens over all chunks (pricing); 0 = unknown */
    uint32_t flags;  /* KVEDGE_WIRE_FETCH_FLAG_*; only known bits */
} kvedge_wire_fetch_spec_t;

/* A FETCH's precision frame. parse checks the structure only (length, reserved bytes);
 * kvedge_wire_fetch_prec_check checks the meaning (the proxy answers KVEDGE_EINVAL). */
typedef struct {
    kvedge_quality_metric_t metric; /* what the budget bounds; NONE: no budget */
    uint8_t n;                      /* rungs in accept */
    kvedge_prec_t accept[KVEDGE_WIRE_MAX_ACCEPT];
    double budget; /* the most the request's layers may cost together, in the metric's unit */
} kvedge_wire_fetch_prec_t;

typedef struct {
    uint8_t source; /* index into the plan's sources */
    uint16_t layer;
    uint32_t chunk_index;
    uint16_t head;
    int32_t status; /* 0 (block follows), KVEDGE_ENOTFOUND or KVEDGE_ECORRUPT */
} kvedge_wire_fetch_block_t;

typedef struct {
    uint8_t reason; /* kvedge_fetch_reason_t */
    uint16_t layer;
    int16_t source;    /* index into the plan's sources; -1 when none delivered it */
    int32_t status;    /* 0 delivered; KVEDGE_ENOTFOUND: not delivered, the client computes it */
    uint32_t heads;    /* block messages sent for this layer */
    uint32_t attempts; /* sources tried */
    /* KVEDGE_WIRE_FETCH_OWN_LAYER: the requested model's own layer (always so when not
     * delivered); else the mapped model's layer whose blocks were delivered for it. */
    uint16_t from_layer;
    /* The precision the plan chose for it (a access/codec/prec.h rung), when the request had a
     * precision frame and the layer was delivered; else KVEDGE_PREC_STORED (0). */
    kvedge_prec_t prec;
} kvedge_wire_fetch_layer_t;

typedef struct {
    uint32_t sources;
    uint32_t layers;
    uint32_t split;
    double total_us, bound_us, cloud_only_us, recompute_all_us, load_then_compute_us;
} kvedge_wire_fetch_plan_t;

typedef struct {
    char name[KVEDGE_WIRE_FETCH_NAME_BYTES]; /* NUL-terminated */
    uint8_t kind;                            /* kvedge_plan_kind_t (proxy/plan.h) */
    bool up;
    float rtt_us;
    double bw_bytes_per_s;
} kvedge_wire_fetch_source_t;

typedef struct {
    int16_t source; /* -1: recompute */
    uint8_t reason; /* kvedge_plan_reason_t (proxy/plan.h) */
    double cost_us;
    bool mapped;         /* planned from the mapped model's layer from_layer (source >= 0) */
    uint16_t from_layer; /* mapped: that layer; else KVEDGE_WIRE_FETCH_OWN_LAYER */
    /* With a precision frame: the rung planned for a fetched layer and why
     * (kvedge_plan_prec_reason_t, proxy/plan.h); 0 and 0 otherwise. */
    kvedge_prec_t prec;
    uint8_t prec_reason;
} kvedge_wire_fetch_plan_layer_t;

int kvedge_wire_fetch_spec_pack(const kvedge_wire_fetch_spec_t *s,
                                uint8_t out[KVEDGE_WIRE_FETCH_SPEC_BYTES]);
int kvedge_wire_fetch_spec_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_spec_t *s);
/* The mapped frame's first 128 bytes (the N chunk ids follow it in the same frame). pack:
 * KVEDGE_EINVAL for an id that is empty or does not fit. parse: len must be exactly
 * 128 + n x 32; the id is NUL-padded and non-empty, reserved 0; *ids points into in. */
int kvedge_wire_fetch_mapped_pack(const char *model_id,
                                  uint8_t out[KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES]);
int kvedge_wire_fetch_mapped_parse(const uint8_t *in, size_t len, uint32_t n,
                                   char model_id[KVEDGE_WIRE_MODEL_ID_BYTES], const uint8_t **ids);
/* pack: KVEDGE_EINVAL when n > KVEDGE_WIRE_MAX_ACCEPT; writes 16 + n bytes into out (room
 * for KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + KVEDGE_WIRE_MAX_ACCEPT). parse: KVEDGE_EPROTO unless
 * len is 16 + K with K <= KVEDGE_WIRE_MAX_ACCEPT and the reserved bytes are 0. */
int kvedge_wire_fetch_prec_pack(const kvedge_wire_fetch_prec_t *p, uint8_t *out, size_t *len);
int kvedge_wire_fetch_prec_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_prec_t *p);
/* The meaning: a valid accept list (kvedge_prec_list_check), a known metric, and a budget
 * inside the metric's bounds (kvedge_quality_budget_check). 0 or KVEDGE_EINVAL. */
int kvedge_wire_fetch_prec_check(const kvedge_wire_fetch_prec_t *p);
void kvedge_wire_fetch_block_pack(const kvedge_wire_fetch_block_t *b,
                                  uint8_t out[KVEDGE_WIRE_FETCH_BLOCK_BYTES]);
int kvedge_wire_fetch_block_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_block_t *b);
void kvedge_wire_fetch_layer_pack(const kvedge_wire_fetch_layer_t *l,
                                  uint8_t out[KVEDGE_WIRE_FETCH_LAYER_BYTES]);
int kvedge_wire_fetch_layer_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_layer_t *l);
void kvedge_wire_fetch_plan_pack(const kvedge_wire_fetch_plan_t *p,
                                 uint8_t out[KVEDGE_WIRE_FETCH_PLAN_BYTES]);
int kvedge_wire_fetch_plan_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_plan_t *p);
void kvedge_wire_fetch_source_pack(const kvedge_wire_fetch_source_t *s,
                                   uint8_t out[KVEDGE_WIRE_FETCH_SOURCE_BYTES]);
int kvedge_wire_fetch_source_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_source_t *s);
void kvedge_wire_fetch_plan_layer_pack(const kvedge_wire_fetch_plan_layer_t *l,
                                       uint8_t out[KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES]);
int kvedge_wire_fetch_plan_layer_parse(const uint8_t *in, size_t len,
                                       kvedge_wire_fetch_plan_layer_t *l);

/* "HELLO", "PING", ...; NULL for an unknown opcode. */
const char *kvedge_wire_op_name(int opcode);

void kvedge_wire_header_pack(const kvedge_wire_header_t *h, uint8_t out[KVEDGE_WIRE_HEADER_BYTES]);

/* Parses frame 0: exact length, magic, version, known flag bits. Checks nothing that depends
 * on the opcode. Errors: KVEDGE_EPROTO, KVEDGE_EVERSION (the header was otherwise readable:
 * *h is filled so the caller can answer with the request id). */
int kvedge_wire_header_parse(const uint8_t *buf, size_t len, kvedge_wire_header_t *h);

/* Validates a whole message against the opcode's table in docs/protocol.md: direction (REPLY
 * flag), flags, status and deadline rules, the number of payload frames and every frame's
 * exact size, every count against its limit. Reads only lengths and the few payload fields
 * that sizes depend on (e.g. LIST's max). Returns 0 or KVEDGE_EPROTO. */
int kvedge_wire_validate(const kvedge_wire_header_t *h, const kvedge_wire_frame_t *frames,
                         size_t nframes);

/* Records. pack writes exactly the record size; parse checks reserved bytes are zero and
 * every field is in range, returning 0 or KVEDGE_EPROTO. */
void kvedge_wire_key_pack(const kvedge_block_key_t *key, uint8_t out[KVEDGE_WIRE_KEY_BYTES]);
void kvedge_wire_key_parse(const uint8_t in[KVEDGE_WIRE_KEY_BYTES], kvedge_block_key_t *key);

int kvedge_wire_put_item_pack(const kvedge_wire_put_item_t *item,
                              uint8_t out[KVEDGE_WIRE_PUT_ITEM_BYTES]);
int kvedge_wire_put_item_parse(const uint8_t *in, size_t len, kvedge_wire_put_item_t *item);

int kvedge_wire_model_pack(const kvedge_model_t *m, uint8_t out[KVEDGE_WIRE_MODEL_BYTES]);
int kvedge_wire_model_parse(const uint8_t *in, size_t len, kvedge_model_t *m);
/* A MODEL query: the model id with every shape field zero asks the node for its record of
 * that id, registering nothing. parse: KVEDGE_EPROTO when the record is not a query. */
int kvedge_wire_model_query_pack(const char *id, uint8_t out[KVEDGE_WIRE_MODEL_BYTES]);
int kvedge_wire_model_query_parse(const uint8_t *in, size_t len,
                                  char id[KVEDGE_MODEL_ID_MAX_BYTES + 1]);

/* Returns KVEDGE_EINVAL when the chunk's model id does not fit the wire's 123 bytes (the
 * engine allows 128). */
int kvedge_wire_chunk_entry_pack(const kvedge_wire_chunk_entry_t *e,
                                 uint8_t out[KVEDGE_WIRE_CHUNK_ENTRY_BYTES]);
int kvedge_wire_chunk_entry_parse(const uint8_t *in, size_t len, kvedge_wire_chunk_entry_t *e);

void kvedge_wire_stats_pack(const kvedge_engine_stats_t *s, uint8_t out[KVEDGE_WIRE_STATS_BYTES]);
int kvedge_wire_stats_parse(const uint8_t *in, size_t len, kvedge_engine_stats_t *s);

void kvedge_wire_node_info_pack(const kvedge_wire_node_info_t *n,
                                uint8_t out[KVEDGE_WIRE_NODE_INFO_BYTES]);
int kvedge_wire_node_info_parse(const uint8_t *in, size_t len, kvedge_wire_node_info_t *n);

void kvedge_wire_stream_hdr_pack(const kvedge_wire_stream_hdr_t *s,
                                 uint8_t out[KVEDGE_WIRE_STREAM_HDR_BYTES]);
int kvedge_wire_stream_hdr_parse(const uint8_t *in, size_t len, kvedge_wire_stream_hdr_t *s);

void kvedge_wire_pack_pack(const kvedge_wire_pack_t *p, uint8_t out[KVEDGE_WIRE_PACK_BYTES]);
/* KVEDGE_EPROTO for a frame of another size, a count or size out of range, reserved bytes. */
int kvedge_wire_pack_parse(const uint8_t *in, size_t len, kvedge_wire_pack_t *p);

#ifdef __cplusplus
}
#endif
#endif
