/* The kvedge wire protocol (docs/protocol.md): header and payload records, and the strict
 * validation of whole messages. Pure functions on bytes: no ZeroMQ in here. */
#ifndef KVEDGE_ACCESS_FRAME_H
#define KVEDGE_ACCESS_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/chunk.h"
#include "store/engine.h"
#include "store/model.h"

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
#define KVEDGE_WIRE_MAX_LIST        4096
#define KVEDGE_WIRE_MAX_NAME_BYTES  255
#define KVEDGE_WIRE_MAX_DEADLINE_MS 600000
#define KVEDGE_WIRE_MODEL_ID_BYTES  124 /* NUL-padded field; ids up to 123 bytes */

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

typedef enum { KVEDGE_ROLE_CLOUD = 1, KVEDGE_ROLE_EDGE = 2 } kvedge_role_t;

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

/* Little-endian helpers shared by the server and client. */
static inline void kvedge_wire_put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t kvedge_wire_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

#ifdef __cplusplus
}
#endif
#endif
