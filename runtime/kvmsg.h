/* Storage Master messages (docs/master.md), pure functions on bytes that every participant
 * needs: the kvmsg codec of the zguide Clone pattern, the registry's key space, and the
 * record formats (node, health, model, layer map, block directory, link). */
#ifndef KVEDGE_ACCESS_KVMSG_H
#define KVEDGE_ACCESS_KVMSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/frame.h"
#include "access/codec/chunk.h"
#include "access/codec/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_MASTER_BIND_DEFAULT "tcp://127.0.0.1:7410"
#define KVEDGE_MASTER_PUB_DEFAULT  "tcp://127.0.0.1:7411"

/* Message limits (docs/master.md, "Limits"). */
#define KVEDGE_KVMSG_MAX_KEY_BYTES    255
#define KVEDGE_KVMSG_MAX_BODY_BYTES   65536
#define KVEDGE_KVMSG_MAX_REASON_BYTES 255
#define KVEDGE_KVMSG_MAX_FRAMES       5 /* command, key, seq, body, request id */
#define KVEDGE_KVMSG_MAX_FRAME_BYTES  (KVEDGE_KVMSG_MAX_BODY_BYTES + 4096) /* ZMQ_MAXMSGSIZE */
#define KVEDGE_KVMSG_KTHXBAI_BYTES    16
#define KVEDGE_KVMSG_HUGZ_BYTES       8

/* Registry limits: the master refuses new keys past them (KVEDGE_EFULL), and a view refuses
 * a snapshot past them, so no peer can make another hold unbounded memory. */
#define KVEDGE_MASTER_MAX_RECORDS     (1u << 18)
#define KVEDGE_MASTER_MAX_TOTAL_BYTES (256ull << 20) /* keys + bodies */
#define KVEDGE_MASTER_MAX_HEALTH      65536          /* heartbeat ids tracked */

/* Timing. Health: a node is up while it heartbeats, suspect after SUSPECT_MS of silence, down
 * after DOWN_MS. Nodes heartbeat every HEARTBEAT_IVL_MS; the PUB sends HUGZ every HUGZ_MS. */
#define KVEDGE_MASTER_HUGZ_MS          1000
#define KVEDGE_MASTER_HEARTBEAT_IVL_MS 1000
#define KVEDGE_MASTER_SUSPECT_MS       3000
#define KVEDGE_MASTER_DOWN_MS          10000
#define KVEDGE_MASTER_PUB_HWM          100000 /* updates queued per subscriber, then dropped */

/* Key components. */
#define KVEDGE_MASTER_MAX_ID_BYTES       64  /* node ids, regions */
#define KVEDGE_MASTER_MAX_MODEL_ID_BYTES 123 /* as on the store wire */
#define KVEDGE_MASTER_MAX_ENDPOINT_BYTES 255
#define KVEDGE_MASTER_KEY_Z85_BYTES      40
#define KVEDGE_MASTER_CHUNK_HEX_BYTES    (2 * KVEDGE_CHUNK_ID_BYTES)

/* Records. */
#define KVEDGE_MASTER_RECORD_VERSION 1
/* The largest record: an adapter digest of KVEDGE_MODEL_MAX_LAYERS edge layers. */
#define KVEDGE_MASTER_RECORD_MAX_BYTES                                                             \
    (KVEDGE_MASTER_ADAPTER_FIXED_BYTES + 2 * KVEDGE_MODEL_MAX_LAYERS +                             \
     2 * KVEDGE_MASTER_ROPE_MAX_BYTES)
#define KVEDGE_MASTER_NODE_FIXED_BYTES    28
#define KVEDGE_MASTER_HEALTH_BYTES        20
#define KVEDGE_MASTER_MODEL_BYTES         (4 + KVEDGE_WIRE_MODEL_BYTES)
#define KVEDGE_MASTER_MAP_FIXED_BYTES     8
#define KVEDGE_MASTER_DIR_FIXED_BYTES     8
#define KVEDGE_MASTER_LINK_BYTES          32
#define KVEDGE_MASTER_MAP_NONE            0xFFFFu /* edge layer computed locally */
#define KVEDGE_MASTER_ADAPTER_FIXED_BYTES 52
#define KVEDGE_MASTER_DIGEST_BYTES        32 /* crypto_generichash (BLAKE2b-256) */
#define KVEDGE_MASTER_ROPE_MAX_BYTES      255
#define KVEDGE_MASTER_ADAPTER_MAX_SIZE    (1ull << 40) /* bytes of an adapter file */

/* ---------------------------------------------------------------- kvmsg */

typedef enum {
    KVEDGE_KVMSG_ICANHAZ = 1, /* client -> master: snapshot of a key prefix */
    KVEDGE_KVMSG_KVSYNC,      /* master -> client: one record of a snapshot */
    KVEDGE_KVMSG_KTHXBAI,     /* master -> client: end of a snapshot, its seq */
    KVEDGE_KVMSG_SET,         /* client -> master: update (empty body = delete) */
    KVEDGE_KVMSG_HEARTBEAT,   /* client -> master: a node or proxy is alive */
    KVEDGE_KVMSG_OK,          /* master -> client: SET or HEARTBEAT done */
    KVEDGE_KVMSG_ERR,         /* master -> client: request refused, nothing applied */
    KVEDGE_KVMSG_KVPUB,       /* master PUB: a sequenced update */
    KVEDGE_KVMSG_HUGZ,        /* master PUB: alive, and the current seq */
    KVEDGE_KVMSG_STATUS,      /* client -> master: its role and cluster (OK "status" + JSON) */
} kvedge_kvmsg_cmd_t;

/* The key of the OK that answers STATUS, the one OK that carries a body (a JSON document,
 * docs/master.md "STATUS"). Every master answers STATUS, leader or not. */
#define KVEDGE_KVMSG_STATUS_KEY "status"

/* One message. Pointers point into the frames it was parsed from (or, for pack, into the
 * caller's memory). Fields a command does not use are zero. */
typedef struct {
    kvedge_kvmsg_cmd_t cmd;
    const uint8_t *key; /* ICANHAZ, KTHXBAI: the prefix (may be empty) */
    size_t key_len;
    uint64_t seq;
    const uint8_t *body; /* SET, KVSYNC, KVPUB: the record; ERR: the reason text */
    size_t body_len;
    uint64_t rid;      /* request id: chosen by the client, echoed by the master */
    int32_t status;    /* ERR: a negative kvedge error code */
    uint32_t count;    /* KTHXBAI: KVSYNC messages sent before it */
    uint64_t registry; /* KTHXBAI, HUGZ: the registry's id */
} kvedge_kvmsg_t;

/* Scratch memory for the fixed-size frames pack produces. */
typedef struct {
    uint8_t seq[8];
    uint8_t rid[8];
    uint8_t body[4 + KVEDGE_KVMSG_MAX_REASON_BYTES];
} kvedge_kvmsg_buf_t;

/* "ICANHAZ", ...; NULL for anything else. */
const char *kvedge_kvmsg_cmd_name(int cmd);

/* True when the message travels on the PUB (4 frames), false for ROUTER traffic (5). */
bool kvedge_kvmsg_is_pub(kvedge_kvmsg_cmd_t cmd);

/* Parses and validates a whole message (docs/master.md, "Messages"): the command, the exact
 * frame count, every frame's size and the per-command rules. Reads only the frames given.
 * Returns 0 or KVEDGE_EPROTO. On failure *m may be partly filled; m->rid holds the request id
 * whenever frame 4 is 8 bytes long, so the master can echo it in ERR. */
int kvedge_kvmsg_parse(const kvedge_wire_frame_t *frames, size_t n, kvedge_kvmsg_t *m);

/* Lays a message out as frames (out has KVEDGE_KVMSG_MAX_FRAMES entries; *n receives the
 * count); out points into m's memory and into buf. Returns 0, or KVEDGE_EINVAL when the
 * message would not pass kvedge_kvmsg_parse. */
int kvedge_kvmsg_pack(const kvedge_kvmsg_t *m, kvedge_kvmsg_buf_t *buf,
                      kvedge_wire_frame_t out[KVEDGE_KVMSG_MAX_FRAMES], size_t *n);

/* True for 1 … 255 bytes of printable ASCII without space (0x21 … 0x7E). */
bool kvedge_kvmsg_key_ok(const uint8_t *key, size_t len);

/* ---------------------------------------------------------------- key space */

typedef enum {
    KVEDGE_MASTER_SPACE_NODE = 1, /* node/<id> */
    KVEDGE_MASTER_SPACE_HEALTH,   /* health/<id> (written by the master) */
    KVEDGE_MASTER_SPACE_MODEL,    /* model/<model id> */
    KVEDGE_MASTER_SPACE_MAP,      /* map/<cloud model>/<edge model> */
    KVEDGE_MASTER_SPACE_DIR,      /* dir/<node id>/<chunk id, 64 lowercase hex> */
    KVEDGE_MASTER_SPACE_LINK,     /* link/<from node>/<to node> */
    KVEDGE_MASTER_SPACE_TMODEL,   /* tmodel/<tenant tag, 32 lowercase hex>/<model id> */
    KVEDGE_MASTER_SPACE_ADAPTER,  /* adapter/<cloud model>/<edge model> */
} kvedge_master_space_t;

/* A key split into its space and components (NUL-terminated). */
typedef struct {
    kvedge_master_space_t space;
    char a[KVEDGE_MASTER_MAX_MODEL_ID_BYTES + 1]; /* node id, model id, cloud model, from */
    char b[KVEDGE_MASTER_MAX_MODEL_ID_BYTES + 1]; /* edge model, chunk hex, to; else "" */
} kvedge_master_key_t;

/* Parses a key. Node ids and regions: 1 … 64 of [A-Za-z0-9._:@+-]; model ids: 1 … 123
 * printable ASCII without space or '/'. Returns 0 or KVEDGE_EINVAL. */
int kvedge_master_key_parse(const char *key, size_t len, kvedge_master_key_t *out);

/* Builds a key from components (b is ignored for node, health and model). Returns 0,
 * KVEDGE_EINVAL (a component is not allowed there), or KVEDGE_ENOSPACE. */
int kvedge_master_key_format(kvedge_master_space_t space, const char *a, const char *b, char *out,
                             size_t cap);

/* The 32 lowercase hex digits of a tenant tag (kvedge_tenant_tag), as tmodel keys use them. */
#define KVEDGE_MASTER_TENANT_HEX_BYTES 32
void kvedge_master_tenant_hex(const uint8_t tag[16], char out[KVEDGE_MASTER_TENANT_HEX_BYTES + 1]);

/* The 64 lowercase hex digits of a chunk id, as dir keys use them. */
void kvedge_master_chunk_hex(const kvedge_chunk_id_t *id,
                             char out[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1]);

/* True for a node id (1 … 64 of [A-Za-z0-9._:@+-]). */
bool kvedge_master_id_ok(const char *id);

/* Checks that body is a valid record for key (the master's SET rule; an empty body, a
 * delete, is valid for every writable key). Returns 0, KVEDGE_EINVAL (bad key),
 * KVEDGE_EDENIED (health/ is the master's: clients may only delete there), KVEDGE_EPROTO (the
 * body is not a valid record of the key's space, or names another id than the key),
 * KVEDGE_EVERSION (a record version this build does not know). */
int kvedge_master_check_set(const char *key, size_t key_len, const uint8_t *body, size_t len);

/* ---------------------------------------------------------------- records */

typedef enum {
    KVEDGE_MASTER_HEALTH_UP = 1,
    KVEDGE_MASTER_HEALTH_SUSPECT = 2,
    KVEDGE_MASTER_HEALTH_DOWN = 3,
} kvedge_master_health_state_t;

/* "up", "suspect", "down"; "?" otherwise. */
const char *kvedge_master_health_name(int state);

typedef struct {
    kvedge_role_t role;
    char region[KVEDGE_MASTER_MAX_ID_BYTES + 1];         /* may be empty */
    char endpoint[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1]; /* where clients reach it */
    char public_key[KVEDGE_MASTER_KEY_Z85_BYTES + 1];    /* Z85, or empty for plaintext */
    uint64_t capacity_bytes;
    uint64_t bandwidth_bytes_per_s; /* declared; 0 = unknown */
    uint32_t rtt_us;                /* declared; 0 = unknown */
} kvedge_master_node_t;

typedef struct {
    kvedge_master_health_state_t state;
    uint64_t last_seen_ms; /* wall clock, ms since the epoch: the last heartbeat */
    uint64_t changed_ms;   /* wall clock: when the state took this value */
} kvedge_master_health_t;

typedef struct {
    uint16_t cloud_layers;
    uint16_t edge_layers;
    uint16_t from[KVEDGE_MODEL_MAX_LAYERS]; /* per edge layer: a cloud layer, or MAP_NONE */
} kvedge_master_map_t;

/* How an adapter's weights were fitted (the file's "fit" metadata, kvedge_adapter_fit_name). */
typedef enum {
    KVEDGE_MASTER_FIT_LEAST_SQUARES = 1, /* kvedge layermap --adapter, linear */
    KVEDGE_MASTER_FIT_DISTILLED = 2,     /* scripts/train_adapter.py */
    KVEDGE_MASTER_FIT_HEADS = 3,         /* head matching + ThinK */
    KVEDGE_MASTER_FIT_LINEAR = 4,        /* linear, fitted by another tool */
} kvedge_master_fit_t;

/* "least-squares", "distilled", "heads", "linear"; "?" otherwise. */
const char *kvedge_master_fit_name(int fit);

/* The registered adapter of a pair (adapter/<cloud>/<edge>): not the file (67 KB to MBs), but
 * what identifies it. An edge that holds the file checks it against this record and the pair's
 * current map record (docs/largesmall.md, "Registering an adapter"). */
typedef struct {
    uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES]; /* crypto_generichash of the whole file */
    uint64_t size;                              /* the file's bytes, 1 ... ADAPTER_MAX_SIZE */
    kvedge_master_fit_t fit;
    uint16_t cloud_layers; /* the layer map it was fitted with: */
    uint16_t edge_layers;
    uint16_t from[KVEDGE_MODEL_MAX_LAYERS]; /* per edge layer: a cloud layer, or MAP_NONE */
    /* Each model's rotary settings as the file spells them ("none", "theta=10000", ...):
     * 1 ... ROPE_MAX_BYTES printable bytes without space. */
    char cloud_rope[KVEDGE_MASTER_ROPE_MAX_BYTES + 1];
    char edge_rope[KVEDGE_MASTER_ROPE_MAX_BYTES + 1];
} kvedge_master_adapter_t;

/* The precisions a directory entry says a node serves (the cache optimizer): bit i for
 * the ladder rung kvedge_master_rung_bit(i) held by every block of the chunk's held layers
 * (as put: the primary), and KVEDGE_MASTER_DIR_DERIVES when the node derives coarser rungs
 * from them. 0: not said (an older node): assume anything may be served. */
#define KVEDGE_MASTER_DIR_RUNGS   15
#define KVEDGE_MASTER_DIR_DERIVES 0x8000u

typedef struct {
    char model_id[KVEDGE_MASTER_MAX_MODEL_ID_BYTES + 1];
    uint16_t layers;                           /* bits of held that count */
    uint8_t held[KVEDGE_MODEL_MAX_LAYERS / 8]; /* bit l (LSB first) = layer l held */
    uint16_t rungs;                            /* precisions served, above; 0: unknown */
} kvedge_master_dir_t;

typedef struct {
    uint32_t rtt_us;
    uint64_t bw_bytes_per_s;
    uint32_t samples;    /* measurements folded in; 0 with declared */
    bool declared;       /* a prior from the node records, not a measurement */
    uint64_t updated_ms; /* wall clock of the last measurement */
} kvedge_master_link_t;

/* Each record type packs into at most KVEDGE_MASTER_RECORD_MAX_BYTES: pack returns 0 and its
 * length in *len, or KVEDGE_EINVAL for a field out of range. parse checks the exact length,
 * the type byte, reserved bytes and every field: 0, KVEDGE_EPROTO or KVEDGE_EVERSION. A record
 * that parses packs back to the same bytes. */
int kvedge_master_node_pack(const kvedge_master_node_t *r,
                            uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len);
int kvedge_master_node_parse(const uint8_t *in, size_t len, kvedge_master_node_t *r);

int kvedge_master_health_pack(const kvedge_master_health_t *r,
                              uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len);
int kvedge_master_health_parse(const uint8_t *in, size_t len, kvedge_master_health_t *r);

int kvedge_master_model_pack(const kvedge_model_t *m, uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES],
                             size_t *len);
int kvedge_master_model_parse(const uint8_t *in, size_t len, kvedge_model_t *m);

int kvedge_master_map_pack(const kvedge_master_map_t *r,
                           uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len);
int kvedge_master_map_parse(const uint8_t *in, size_t len, kvedge_master_map_t *r);

int kvedge_master_adapter_pack(const kvedge_master_adapter_t *r,
                               uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len);
int kvedge_master_adapter_parse(const uint8_t *in, size_t len, kvedge_master_adapter_t *r);

int kvedge_master_dir_pack(const kvedge_master_dir_t *r,
                           uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len);
int kvedge_master_dir_parse(const uint8_t *in, size_t len, kvedge_master_dir_t *r);
static inline bool kvedge_master_dir_has(const kvedge_master_dir_t *d, unsigned layer)
{
    return layer < d->layers && (d->held[layer / 8] >> (layer % 8)) & 1u;
}
static inline void kvedge_master_dir_set(kvedge_master_dir_t *d, unsigned layer)
{
    if (layer < d->layers)
        d->held[layer / 8] |= (uint8_t)(1u << (layer % 8));
}

/* The bit of a ladder rung in kvedge_master_dir_t.rungs: (base - 1) + 5 x ThinK level, 0 ...
 * 14 (an entropy-coded "+ec" rung has its plain rung's bit); -1 for tc (no bit: a node only
 * derives it) and anything that is not a rung. */
int kvedge_master_rung_bit(kvedge_prec_t rung);
/* Whether a directory entry says its node can serve `rung` (held, or derivable from a held
 * rung by a node that derives; a "+ec" rung and tc are never held, blocks are put plain: only
 * a node that derives serves them); true when the entry says nothing (rungs 0). */
bool kvedge_master_dir_serves(const kvedge_master_dir_t *d, kvedge_prec_t rung);

int kvedge_master_link_pack(const kvedge_master_link_t *r,
                            uint8_t out[KVEDGE_MASTER_RECORD_MAX_BYTES], size_t *len);
int kvedge_master_link_parse(const uint8_t *in, size_t len, kvedge_master_link_t *r);

#ifdef __cplusplus
}
#endif
#endif
