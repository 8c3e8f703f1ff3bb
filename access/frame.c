/* The kvedge wire codec (docs/protocol.md): the 32-byte header, the payload records, and the
 * strict per-opcode validation of whole messages. Pure functions on bytes: no ZeroMQ here.
 *
 * Where docs/protocol.md is ambiguous or contradicts itself, this file takes the stricter
 * reading; each such choice is marked "Spec:" below. */
#include "access/frame.h"

#include <assert.h>
#include <stddef.h>
#include <string.h>

#include "access/codec/byteorder.h"
#include "access/codec/error.h"
#include "access/codec/errwire.h"

#define S_MAGIC        "KVEP"
#define S_FLAGS_KNOWN  (KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE | KVEDGE_WIRE_FLAG_END)
#define S_FLAGS_STREAM (KVEDGE_WIRE_FLAG_MORE | KVEDGE_WIRE_FLAG_END)
/* A GET_LAYER end message counts the data messages sent: at most N chunks x H heads. */
#define S_MAX_STREAM_MESSAGES ((uint32_t)KVEDGE_WIRE_MAX_CHUNKS * KVEDGE_MODEL_MAX_HEADS)
#define S_STATUS_BYTES        4

static const char *const s_op_names[] = {
    NULL,     "HELLO", "PING",  "PUT",    "GET",    "GET_LAYER", "LOOKUP", "LIST",  "STAT",
    "DELETE", "PIN",   "UNPIN", "CREDIT", "CANCEL", "MODEL",     "EVICT",  "FETCH", "MONITOR",
};

static bool s_all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return false;
    return true;
}

/* Model id field: 1 ... 123 bytes, no NUL inside, NUL-padded to 124. An id that does not fit
 * is the caller's error (KVEDGE_EINVAL): truncating it would name another model. */
static int s_model_id_pack(const char *id, uint8_t out[KVEDGE_WIRE_MODEL_ID_BYTES])
{
    size_t n = strnlen(id, KVEDGE_WIRE_MODEL_ID_BYTES);
    if (n == 0 || n >= KVEDGE_WIRE_MODEL_ID_BYTES)
        return KVEDGE_EINVAL;
    memset(out, 0, KVEDGE_WIRE_MODEL_ID_BYTES);
    memcpy(out, id, n);
    return KVEDGE_OK;
}

/* out holds at least KVEDGE_WIRE_MODEL_ID_BYTES chars (every id buffer we fill holds 129). */
static int s_model_id_parse(const uint8_t in[KVEDGE_WIRE_MODEL_ID_BYTES], char *out)
{
    const uint8_t *nul = memchr(in, 0, KVEDGE_WIRE_MODEL_ID_BYTES);
    if (!nul || nul == in)
        return KVEDGE_EPROTO; /* 124 bytes without a terminator, or empty */
    size_t n = (size_t)(nul - in);
    if (!s_all_zero(nul, KVEDGE_WIRE_MODEL_ID_BYTES - n))
        return KVEDGE_EPROTO; /* a NUL inside the id, or garbage in the padding */
    memcpy(out, in, n);
    out[n] = '\0';
    return KVEDGE_OK;
}

/* The same bounds the engine keeps for a registered chunk. */
static bool s_tokens_ok(uint32_t tokens)
{
    return tokens >= 1 && tokens <= KVEDGE_CHUNK_TOKENS_MAX;
}

/* Chunk id, parent (zeros when none) and has-parent byte, as in the put item and the LIST
 * entry. A parent with has_parent false is not written: the field says "zeros when none". */
static void s_chain_pack(const kvedge_chunk_info_t *c, uint8_t *id, uint8_t *parent,
                         uint8_t *has_parent)
{
    memcpy(id, c->id.bytes, KVEDGE_CHUNK_ID_BYTES);
    if (c->has_parent)
        memcpy(parent, c->parent.bytes, KVEDGE_CHUNK_ID_BYTES);
    *has_parent = c->has_parent ? 1 : 0;
}

static int s_chain_parse(const uint8_t *id, const uint8_t *parent, uint8_t has_parent,
                         kvedge_chunk_info_t *c)
{
    if (has_parent > 1 || (!has_parent && !s_all_zero(parent, KVEDGE_CHUNK_ID_BYTES)))
        return KVEDGE_EPROTO;
    memcpy(c->id.bytes, id, KVEDGE_CHUNK_ID_BYTES);
    memcpy(c->parent.bytes, parent, KVEDGE_CHUNK_ID_BYTES);
    c->has_parent = has_parent == 1;
    return KVEDGE_OK;
}

/* ---- header ---- */

const char *kvedge_wire_op_name(int opcode)
{
    if (opcode < 1 || opcode >= (int)(sizeof s_op_names / sizeof s_op_names[0]))
        return NULL;
    return s_op_names[opcode];
}

void kvedge_wire_header_pack(const kvedge_wire_header_t *h, uint8_t out[KVEDGE_WIRE_HEADER_BYTES])
{
    memcpy(out, S_MAGIC, 4);
    out[4] = h->version;
    out[5] = h->opcode;
    kvedge_le_put16(out + 6, h->flags);
    kvedge_le_put64(out + 8, h->request_id);
    kvedge_le_put32(out + 16, (uint32_t)kvedge_err_to_wire(h->status));
    kvedge_le_put32(out + 20, h->count);
    kvedge_le_put32(out + 24, h->credit);
    kvedge_le_put32(out + 28, h->deadline_ms);
}

/* Once length and magic hold, *h is filled even when the version or the flags are wrong, so
 * that a node can answer with the request's opcode and id; otherwise *h is zeroed (the spec's
 * "request id ... else 0"). Another version's flags are not judged: their meaning may differ. */
int kvedge_wire_header_parse(const uint8_t *buf, size_t len, kvedge_wire_header_t *h)
{
    assert(h);
    memset(h, 0, sizeof *h);
    if (!buf || len != KVEDGE_WIRE_HEADER_BYTES || memcmp(buf, S_MAGIC, 4) != 0)
        return KVEDGE_EPROTO;
    h->version = buf[4];
    h->opcode = buf[5];
    h->flags = kvedge_le_get16(buf + 6);
    h->request_id = kvedge_le_get64(buf + 8);
    h->status = kvedge_err_from_wire((int32_t)kvedge_le_get32(buf + 16));
    h->count = kvedge_le_get32(buf + 20);
    h->credit = kvedge_le_get32(buf + 24);
    h->deadline_ms = kvedge_le_get32(buf + 28);
    if (h->version != KVEDGE_WIRE_VERSION)
        return KVEDGE_EVERSION;
    if (h->flags & ~S_FLAGS_KNOWN)
        return KVEDGE_EPROTO;
    return KVEDGE_OK;
}

/* ---- validation ---- */

static int s_check(bool ok)
{
    return ok ? KVEDGE_OK : KVEDGE_EPROTO;
}

static bool s_len_in(const kvedge_wire_frame_t *f, size_t lo, size_t hi)
{
    return f->len >= lo && f->len <= hi;
}

/* A block frame; its content is the block codec's business, checked later. */
static bool s_block_frame(const kvedge_wire_frame_t *f)
{
    return s_len_in(f, 1, KVEDGE_WIRE_MAX_FRAME_BYTES);
}

static bool s_count_in(uint32_t count, uint32_t lo, uint32_t hi)
{
    return count >= lo && count <= hi;
}

/* The block frames of a data message of k records, zeros of them with status 0: one frame per
 * such record after f[0], each a block frame, and a pack (k > 1) at most one frame in all. */
static int s_pack_frames(const kvedge_wire_frame_t *f, size_t n, uint32_t k, size_t zeros)
{
    if (n != 1 + zeros)
        return KVEDGE_EPROTO;
    uint64_t total = 0;
    for (size_t i = 1; i < n; i++) {
        if (!s_block_frame(&f[i]))
            return KVEDGE_EPROTO;
        total += f[i].len;
    }
    return s_check(k == 1 || total <= KVEDGE_WIRE_MAX_FRAME_BYTES);
}

/* One frame of count records of rec_bytes each (count already bounded, so no overflow). */
static bool s_one_array(const kvedge_wire_frame_t *f, size_t n, uint32_t count, size_t rec_bytes)
{
    return n == 1 && f[0].len == (size_t)count * rec_bytes;
}

/* count int32 statuses, each 0 or negative; *zeros receives how many are 0. */
static bool s_statuses(const uint8_t *p, uint32_t count, uint32_t *zeros)
{
    *zeros = 0;
    for (uint32_t i = 0; i < count; i++) {
        int32_t s = (int32_t)kvedge_le_get32(p + (size_t)i * S_STATUS_BYTES);
        if (s > 0)
            return false;
        *zeros += s == 0;
    }
    return true;
}

static int s_validate_request(const kvedge_wire_header_t *h, const kvedge_wire_frame_t *f, size_t n)
{
    /* Flags: requests carry none (REPLY, MORE, END are node -> client only). */
    if (h->flags != 0 || h->status != 0 || h->deadline_ms < 1 ||
        h->deadline_ms > KVEDGE_WIRE_MAX_DEADLINE_MS)
        return KVEDGE_EPROTO;
    uint32_t c = h->count;
    /* The credit field is used only by GET_LAYER and CREDIT requests: 0 everywhere else. */
    if (h->opcode != KVEDGE_OP_GET_LAYER && h->opcode != KVEDGE_OP_FETCH &&
        h->opcode != KVEDGE_OP_CREDIT && h->credit != 0)
        return KVEDGE_EPROTO;
    /* Spec: count is "the number of items the payload carries (per opcode)"; an opcode that
     * defines no count must send 0. */
    switch (h->opcode) {
    case KVEDGE_OP_HELLO:
        return s_check(c == 0 && n == 1 && s_len_in(&f[0], 1, KVEDGE_WIRE_MAX_NAME_BYTES));
    case KVEDGE_OP_PING:
        return s_check(c == 0 && n == 1 && f[0].len <= KVEDGE_WIRE_MAX_PING_BYTES);
    case KVEDGE_OP_PUT:
        if (!s_count_in(c, 1, KVEDGE_WIRE_MAX_ITEMS) || n != 2 * (size_t)c)
            return KVEDGE_EPROTO;
        for (size_t i = 0; i < n; i += 2)
            if (f[i].len != KVEDGE_WIRE_PUT_ITEM_BYTES || !s_block_frame(&f[i + 1]))
                return KVEDGE_EPROTO;
        return KVEDGE_OK;
    case KVEDGE_OP_GET:
        /* f1: keys; f2 (optional): the precisions accepted. */
        return s_check(s_count_in(c, 1, KVEDGE_WIRE_MAX_ITEMS) && (n == 1 || n == 2) &&
                       f[0].len == (size_t)c * KVEDGE_WIRE_KEY_BYTES &&
                       (n == 1 || f[1].len <= KVEDGE_WIRE_MAX_ACCEPT));
    case KVEDGE_OP_GET_LAYER: {
        /* f1: layer u16 | reserved u16 | N chunk ids; f2 (optional): the precisions
         * accepted; f3 (optional, after f2): the pack frame. */
        kvedge_wire_pack_t pk;
        if (!s_count_in(c, 1, KVEDGE_WIRE_MAX_CHUNKS) ||
            !s_count_in(h->credit, 1, KVEDGE_WIRE_MAX_CREDIT) || n < 1 || n > 3 ||
            f[0].len != 4 + (size_t)c * KVEDGE_CHUNK_ID_BYTES ||
            (n >= 2 && f[1].len > KVEDGE_WIRE_MAX_ACCEPT) ||
            (n == 3 && kvedge_wire_pack_parse(f[2].data, f[2].len, &pk) != KVEDGE_OK))
            return KVEDGE_EPROTO;
        return s_check(kvedge_le_get16(f[0].data + 2) == 0);
    }
    case KVEDGE_OP_LOOKUP:
    case KVEDGE_OP_DELETE:
    case KVEDGE_OP_PIN:
    case KVEDGE_OP_UNPIN:
        /* Spec: PIN/UNPIN state no count limit; they take chunk ids like DELETE, so the
         * chunk-id limit (1 ... 4096) applies. */
        return s_check(s_count_in(c, 1, KVEDGE_WIRE_MAX_CHUNKS) &&
                       s_one_array(f, n, c, KVEDGE_CHUNK_ID_BYTES));
    case KVEDGE_OP_LIST:
        /* f1: no cursor or a 32-byte chunk id; f2: u32 max entries. */
        if (c != 0 || n != 2 || (f[0].len != 0 && f[0].len != KVEDGE_CHUNK_ID_BYTES) ||
            f[1].len != 4)
            return KVEDGE_EPROTO;
        return s_check(s_count_in(kvedge_le_get32(f[1].data), 1, KVEDGE_WIRE_MAX_LIST));
    case KVEDGE_OP_STAT:
    case KVEDGE_OP_CANCEL:
        return s_check(c == 0 && n == 0);
    case KVEDGE_OP_CREDIT:
        return s_check(c == 0 && n == 0 && s_count_in(h->credit, 1, KVEDGE_WIRE_MAX_CREDIT));
    case KVEDGE_OP_MODEL:
        return s_check(c == 0 && n == 1 && f[0].len == KVEDGE_WIRE_MODEL_BYTES);
    case KVEDGE_OP_EVICT: /* f1: u64 target bytes */
        return s_check(c == 0 && n == 1 && f[0].len == 8);
    case KVEDGE_OP_MONITOR: /* f1: top u16 (0 ... MAX_MONITOR_TOP) | reserved u16 */
        return s_check(c == 0 && n == 1 && f[0].len == 4 &&
                       kvedge_le_get16(f[0].data) <= KVEDGE_WIRE_MAX_MONITOR_TOP &&
                       kvedge_le_get16(f[0].data + 2) == 0);
    case KVEDGE_OP_FETCH: {
        /* f1: spec; f2: N chunk ids; f3 (optional): per layer compute_us | recompute_us;
         * with MAPPED, last: the mapped frame (its model id, another, and its N chunk ids). */
        kvedge_wire_fetch_spec_t spec;
        if (!s_count_in(c, 1, KVEDGE_WIRE_MAX_CHUNKS) ||
            !s_count_in(h->credit, 1, KVEDGE_WIRE_MAX_CREDIT) || n < 2 ||
            kvedge_wire_fetch_spec_parse(f[0].data, f[0].len, &spec) != KVEDGE_OK ||
            f[1].len != (size_t)c * KVEDGE_CHUNK_ID_BYTES)
            return KVEDGE_EPROTO;
        size_t base = n;
        if (spec.flags & KVEDGE_WIRE_FETCH_FLAG_MAPPED) {
            char mid[KVEDGE_WIRE_MODEL_ID_BYTES];
            const uint8_t *ids;
            if (n < 3 ||
                kvedge_wire_fetch_mapped_parse(f[n - 1].data, f[n - 1].len, c, mid, &ids) !=
                    KVEDGE_OK ||
                strcmp(mid, spec.model_id) == 0)
                return KVEDGE_EPROTO;
            base = n - 1;
        }
        if (spec.flags & KVEDGE_WIRE_FETCH_FLAG_PREC) {
            kvedge_wire_fetch_prec_t pr;
            if (base < 3 ||
                kvedge_wire_fetch_prec_parse(f[base - 1].data, f[base - 1].len, &pr) != KVEDGE_OK)
                return KVEDGE_EPROTO;
            base--;
        }
        return s_check(base == 2 || (base == 3 && f[2].len == (size_t)spec.layers *
                                                                  KVEDGE_WIRE_FETCH_TIMES_BYTES));
    }
    default:
        return KVEDGE_EPROTO;
    }
}

/* FETCH stream messages: the kind is the first byte of f1. */
static int s_validate_fetch(const kvedge_wire_header_t *h, const kvedge_wire_frame_t *f, size_t n)
{
    if (h->flags & KVEDGE_WIRE_FLAG_END)
        return s_check(n == 0);
    if (h->status != 0 || n < 1 || f[0].len < 1 ||
        (h->count != 1 && f[0].data[0] != KVEDGE_FETCH_MSG_BLOCK))
        return KVEDGE_EPROTO;
    switch (f[0].data[0]) {
    case KVEDGE_FETCH_MSG_BLOCK: {
        /* k BLOCK records (k > 1: packed), one block frame per record of status 0. */
        uint32_t k = h->count;
        if (!s_count_in(k, 1, KVEDGE_WIRE_MAX_PACK) ||
            f[0].len != (size_t)k * KVEDGE_WIRE_FETCH_BLOCK_BYTES)
            return KVEDGE_EPROTO;
        size_t zeros = 0;
        for (uint32_t i = 0; i < k; i++) {
            kvedge_wire_fetch_block_t b;
            if (kvedge_wire_fetch_block_parse(f[0].data + (size_t)i * KVEDGE_WIRE_FETCH_BLOCK_BYTES,
                                              KVEDGE_WIRE_FETCH_BLOCK_BYTES, &b) != KVEDGE_OK)
                return KVEDGE_EPROTO;
            zeros += b.status == 0;
        }
        return s_pack_frames(f, n, k, zeros);
    }
    case KVEDGE_FETCH_MSG_LAYER: {
        kvedge_wire_fetch_layer_t l;
        return s_check(n == 1 && kvedge_wire_fetch_layer_parse(f[0].data, f[0].len, &l) == 0);
    }
    case KVEDGE_FETCH_MSG_PLAN: {
        kvedge_wire_fetch_plan_t p;
        if (n != 3 || kvedge_wire_fetch_plan_parse(f[0].data, f[0].len, &p) != KVEDGE_OK ||
            f[1].len != (size_t)p.sources * KVEDGE_WIRE_FETCH_SOURCE_BYTES ||
            f[2].len != (size_t)p.layers * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES)
            return KVEDGE_EPROTO;
        return KVEDGE_OK;
    }
    default:
        return KVEDGE_EPROTO;
    }
}

/* GET_LAYER stream messages. A data message carries k = count heads (1 unless the request
 * asked for packing): f1 holds their k 12-byte records (status in each, 0 in the header), then
 * one block frame per record whose status is 0, in order; k > 1 blocks total at most a frame.
 * An end message has no payload and counts the data messages sent, whatever its status. */
static int s_validate_stream(const kvedge_wire_header_t *h, const kvedge_wire_frame_t *f, size_t n)
{
    if (h->flags & KVEDGE_WIRE_FLAG_END)
        return s_check(n == 0 && h->count <= S_MAX_STREAM_MESSAGES);
    uint32_t k = h->count;
    if (h->status != 0 || !s_count_in(k, 1, KVEDGE_WIRE_MAX_PACK) || n < 1 ||
        f[0].len != (size_t)k * KVEDGE_WIRE_STREAM_HDR_BYTES)
        return KVEDGE_EPROTO;
    size_t zeros = 0;
    for (uint32_t i = 0; i < k; i++) {
        kvedge_wire_stream_hdr_t s;
        if (kvedge_wire_stream_hdr_parse(f[0].data + (size_t)i * KVEDGE_WIRE_STREAM_HDR_BYTES,
                                         KVEDGE_WIRE_STREAM_HDR_BYTES, &s) != KVEDGE_OK)
            return KVEDGE_EPROTO;
        zeros += s.status == 0;
    }
    return s_pack_frames(f, n, k, zeros);
}

static int s_validate_reply(const kvedge_wire_header_t *h, const kvedge_wire_frame_t *f, size_t n)
{
    /* Spec: a reply's status is 0 or negative; any negative value is accepted because
     * access/codec/error.h appends new codes and a newer node may send one (header_parse
     * reads a status this library does not know, positive ones too, as KVEDGE_EPROTO). */
    if (!(h->flags & KVEDGE_WIRE_FLAG_REPLY) || h->deadline_ms != 0 || h->credit != 0 ||
        h->status > 0)
        return KVEDGE_EPROTO;
    uint16_t stream = h->flags & S_FLAGS_STREAM;
    switch (h->opcode) {
    case KVEDGE_OP_GET_LAYER:
        /* Spec: every GET_LAYER reply is a data (MORE) or end (END) message, never both and
         * never neither; a failed request is answered with an end message. */
        if (stream != KVEDGE_WIRE_FLAG_MORE && stream != KVEDGE_WIRE_FLAG_END)
            return KVEDGE_EPROTO;
        return s_validate_stream(h, f, n);
    case KVEDGE_OP_FETCH:
        if (stream != KVEDGE_WIRE_FLAG_MORE && stream != KVEDGE_WIRE_FLAG_END)
            return KVEDGE_EPROTO;
        return s_validate_fetch(h, f, n);
    case KVEDGE_OP_LIST:
        /* Spec: rule 2 allows END only on GET_LAYER replies, the LIST row sets it when
         * nothing follows; END (never MORE) is accepted on LIST replies. */
        if (stream != 0 && stream != KVEDGE_WIRE_FLAG_END)
            return KVEDGE_EPROTO;
        break;
    case KVEDGE_OP_CREDIT:
    case KVEDGE_OP_CANCEL:
        /* Spec: "none". This includes the generic error answer to an unparsable CREDIT or
         * CANCEL (and to an unknown opcode, sent as opcode 0): a client treats such a
         * message as malformed, which fails the call with KVEDGE_EPROTO all the same. */
        return KVEDGE_EPROTO;
    default:
        if (!kvedge_wire_op_name(h->opcode) || stream != 0)
            return KVEDGE_EPROTO;
        break;
    }
    /* Spec: a failed request gets no payload and so carries no items (count 0). Per-item
     * failures (PUT and GET statuses, GET_LAYER heads) travel in the payload of a reply
     * whose header status is 0. */
    if (h->status != 0)
        return s_check(n == 0 && h->count == 0);

    uint32_t c = h->count, zeros;
    switch (h->opcode) {
    case KVEDGE_OP_HELLO:
        return s_check(c == 0 && n == 2 && f[0].len == KVEDGE_WIRE_NODE_INFO_BYTES &&
                       s_len_in(&f[1], 1, KVEDGE_WIRE_MAX_NAME_BYTES));
    case KVEDGE_OP_PING:
        return s_check(c == 0 && n == 1 && f[0].len <= KVEDGE_WIRE_MAX_PING_BYTES);
    case KVEDGE_OP_PUT:
        return s_check(s_count_in(c, 1, KVEDGE_WIRE_MAX_ITEMS) &&
                       s_one_array(f, n, c, S_STATUS_BYTES) && s_statuses(f[0].data, c, &zeros));
    case KVEDGE_OP_GET: {
        /* f1: N statuses; then one block frame per status 0, in order. Spec: the block
         * bytes of one reply are at most KVEDGE_WIRE_MAX_REPLY_BYTES in all. */
        if (!s_count_in(c, 1, KVEDGE_WIRE_MAX_ITEMS) || n < 1 ||
            f[0].len != (size_t)c * S_STATUS_BYTES || !s_statuses(f[0].data, c, &zeros) ||
            n != 1 + (size_t)zeros)
            return KVEDGE_EPROTO;
        uint64_t total = 0;
        for (size_t i = 1; i < n; i++) {
            if (!s_block_frame(&f[i]))
                return KVEDGE_EPROTO;
            total += f[i].len;
        }
        return s_check(total <= KVEDGE_WIRE_MAX_REPLY_BYTES);
    }
    case KVEDGE_OP_LOOKUP:
        /* K may be 0: nothing of the prefix is cached. */
        return s_check(c <= KVEDGE_WIRE_MAX_CHUNKS && s_one_array(f, n, c, 4));
    case KVEDGE_OP_LIST:
        return s_check(c <= KVEDGE_WIRE_MAX_LIST &&
                       s_one_array(f, n, c, KVEDGE_WIRE_CHUNK_ENTRY_BYTES));
    case KVEDGE_OP_STAT:
        return s_check(c == 0 && n == 1 && f[0].len == KVEDGE_WIRE_STATS_BYTES);
    case KVEDGE_OP_DELETE:
    case KVEDGE_OP_PIN:
    case KVEDGE_OP_UNPIN:
        return s_check(s_count_in(c, 1, KVEDGE_WIRE_MAX_CHUNKS) && s_one_array(f, n, c, 4));
    case KVEDGE_OP_MODEL:
        return s_check(c == 0 && n == 1 && f[0].len == KVEDGE_WIRE_MODEL_BYTES);
    case KVEDGE_OP_EVICT: /* f1: u64 blocks evicted | u64 bytes evicted */
        return s_check(c == 0 && n == 1 && f[0].len == 16);
    case KVEDGE_OP_MONITOR: /* f1: a JSON object, 2 ... MAX_MONITOR_BYTES bytes, no NUL */
        return s_check(c == 0 && n == 1 && s_len_in(&f[0], 2, KVEDGE_WIRE_MAX_MONITOR_BYTES) &&
                       f[0].data[0] == '{' && memchr(f[0].data, 0, f[0].len) == NULL);
    default:
        return KVEDGE_EPROTO;
    }
}

/* frames are the payload frames f1 ... fn (not the header frame, which h comes from). Every
 * length is checked before the few payload bytes read here (GET_LAYER's reserved field,
 * LIST's max, PUT and GET statuses, a GET_LAYER data message's status). */
int kvedge_wire_validate(const kvedge_wire_header_t *h, const kvedge_wire_frame_t *frames,
                         size_t nframes)
{
    assert(h && (frames || nframes == 0));
    if (h->version != KVEDGE_WIRE_VERSION || (h->flags & ~S_FLAGS_KNOWN) ||
        nframes > KVEDGE_WIRE_MAX_FRAMES)
        return KVEDGE_EPROTO;
    if (h->flags & KVEDGE_WIRE_FLAG_REPLY)
        return s_validate_reply(h, frames, nframes);
    return s_validate_request(h, frames, nframes);
}

/* ---- records ---- */

void kvedge_wire_key_pack(const kvedge_block_key_t *key, uint8_t out[KVEDGE_WIRE_KEY_BYTES])
{
    kvedge_block_key_pack(key, out); /* the store's own key bytes, by definition */
}

void kvedge_wire_key_parse(const uint8_t in[KVEDGE_WIRE_KEY_BYTES], kvedge_block_key_t *key)
{
    kvedge_block_key_unpack(in, key);
}

/* Put item: chunk id 32 | parent 32 | has parent u8 | flags u8 | layer u16 | head u16 |
 * reserved u16 | index u32 | tokens u32 | ttl u32 | model id 124. */
int kvedge_wire_put_item_pack(const kvedge_wire_put_item_t *item,
                              uint8_t out[KVEDGE_WIRE_PUT_ITEM_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_PUT_ITEM_BYTES);
    if (!s_tokens_ok(item->chunk.tokens) || s_model_id_pack(item->chunk.model_id, out + 84) != 0)
        return KVEDGE_EINVAL;
    s_chain_pack(&item->chunk, out, out + 32, out + 64);
    out[65] = item->pin ? 1 : 0;
    kvedge_le_put16(out + 66, item->layer);
    kvedge_le_put16(out + 68, item->head);
    kvedge_le_put32(out + 72, item->chunk.index);
    kvedge_le_put32(out + 76, item->chunk.tokens);
    kvedge_le_put32(out + 80, item->ttl_s);
    return KVEDGE_OK;
}

int kvedge_wire_put_item_parse(const uint8_t *in, size_t len, kvedge_wire_put_item_t *item)
{
    memset(item, 0, sizeof *item);
    if (!in || len != KVEDGE_WIRE_PUT_ITEM_BYTES || (in[65] & ~1u) != 0 ||
        kvedge_le_get16(in + 70) != 0 || s_chain_parse(in, in + 32, in[64], &item->chunk) != 0 ||
        s_model_id_parse(in + 84, item->chunk.model_id) != 0)
        return KVEDGE_EPROTO;
    item->pin = (in[65] & 1) != 0;
    item->layer = kvedge_le_get16(in + 66);
    item->head = kvedge_le_get16(in + 68);
    item->chunk.index = kvedge_le_get32(in + 72);
    item->chunk.tokens = kvedge_le_get32(in + 76);
    item->ttl_s = kvedge_le_get32(in + 80);
    item->chunk.created_ms = 0; /* not on the wire */
    return s_check(s_tokens_ok(item->chunk.tokens));
}

/* Model record: model id 124 | layers u16 | kv heads u16 | head dim u16 | dtype u8 |
 * reserved 5. Both directions hold the shape to kvedge_model_check. */
int kvedge_wire_model_pack(const kvedge_model_t *m, uint8_t out[KVEDGE_WIRE_MODEL_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_MODEL_BYTES);
    if (kvedge_model_check(m) != KVEDGE_OK || s_model_id_pack(m->id, out) != 0)
        return KVEDGE_EINVAL;
    kvedge_le_put16(out + 124, m->layers);
    kvedge_le_put16(out + 126, m->kv_heads);
    kvedge_le_put16(out + 128, m->head_dim);
    out[130] = (uint8_t)m->dtype;
    return KVEDGE_OK;
}

int kvedge_wire_model_parse(const uint8_t *in, size_t len, kvedge_model_t *m)
{
    memset(m, 0, sizeof *m);
    if (!in || len != KVEDGE_WIRE_MODEL_BYTES || !s_all_zero(in + 131, 5) ||
        s_model_id_parse(in, m->id) != 0)
        return KVEDGE_EPROTO;
    m->layers = kvedge_le_get16(in + 124);
    m->kv_heads = kvedge_le_get16(in + 126);
    m->head_dim = kvedge_le_get16(in + 128);
    m->dtype = (kvedge_dtype_t)in[130];
    return s_check(kvedge_model_check(m) == KVEDGE_OK);
}

int kvedge_wire_model_query_pack(const char *id, uint8_t out[KVEDGE_WIRE_MODEL_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_MODEL_BYTES);
    return id && s_model_id_pack(id, out) == 0 ? KVEDGE_OK : KVEDGE_EINVAL;
}

int kvedge_wire_model_query_parse(const uint8_t *in, size_t len,
                                  char id[KVEDGE_MODEL_ID_MAX_BYTES + 1])
{
    if (!in || len != KVEDGE_WIRE_MODEL_BYTES || !s_all_zero(in + 124, 12) ||
        s_model_id_parse(in, id) != 0)
        return KVEDGE_EPROTO;
    return KVEDGE_OK;
}

/* LIST entry: chunk id 32 @0 | parent 32 @32 | has parent u8 @64 | reserved 3 @65 |
 * index u32 @68 | tokens u32 @72 | blocks u32 @76 | bytes u64 @80 | pinned blocks u32 @88 |
 * fp16 bytes u64 @92 | reserved 4 @100 | model id 124 @104 | reserved 4 @228.
 * Spec: the listed fields add up to 240 bytes with "reserved 12" at the end, but the record
 * is stated (twice, and in frame.h) as 232 bytes; every named field keeps its offset and
 * the trailing reserved field is 4 bytes. */
int kvedge_wire_chunk_entry_pack(const kvedge_wire_chunk_entry_t *e,
                                 uint8_t out[KVEDGE_WIRE_CHUNK_ENTRY_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_CHUNK_ENTRY_BYTES);
    if (!s_tokens_ok(e->chunk.tokens) || s_model_id_pack(e->chunk.model_id, out + 104) != 0)
        return KVEDGE_EINVAL;
    s_chain_pack(&e->chunk, out, out + 32, out + 64);
    kvedge_le_put32(out + 68, e->chunk.index);
    kvedge_le_put32(out + 72, e->chunk.tokens);
    kvedge_le_put32(out + 76, e->blocks);
    kvedge_le_put64(out + 80, e->bytes);
    kvedge_le_put32(out + 88, e->pinned_blocks);
    kvedge_le_put64(out + 92, e->fp16_bytes);
    return KVEDGE_OK;
}

int kvedge_wire_chunk_entry_parse(const uint8_t *in, size_t len, kvedge_wire_chunk_entry_t *e)
{
    memset(e, 0, sizeof *e);
    if (!in || len != KVEDGE_WIRE_CHUNK_ENTRY_BYTES || !s_all_zero(in + 65, 3) ||
        !s_all_zero(in + 100, 4) || !s_all_zero(in + 228, 4) ||
        s_chain_parse(in, in + 32, in[64], &e->chunk) != 0 ||
        s_model_id_parse(in + 104, e->chunk.model_id) != 0)
        return KVEDGE_EPROTO;
    e->chunk.index = kvedge_le_get32(in + 68);
    e->chunk.tokens = kvedge_le_get32(in + 72);
    e->chunk.created_ms = 0; /* not on the wire */
    e->blocks = kvedge_le_get32(in + 76);
    e->bytes = kvedge_le_get64(in + 80);
    e->pinned_blocks = kvedge_le_get32(in + 88);
    e->fp16_bytes = kvedge_le_get64(in + 92);
    return s_check(s_tokens_ok(e->chunk.tokens));
}

/* Stats: 17 u64 in the order of docs/protocol.md (that of kvedge_engine_stats_t). */
#define S_STAT(field) offsetof(kvedge_engine_stats_t, field)
static const size_t s_stats_offsets[] = {
    S_STAT(blocks),         S_STAT(bytes),          S_STAT(fp16_bytes),  S_STAT(pinned_blocks),
    S_STAT(pinned_bytes),   S_STAT(capacity_bytes), S_STAT(quarantined), S_STAT(puts),
    S_STAT(gets),           S_STAT(hits),           S_STAT(misses),      S_STAT(corrupt),
    S_STAT(evicted_blocks), S_STAT(evicted_bytes),  S_STAT(expired),     S_STAT(bytes_written),
    S_STAT(bytes_read),
};
#undef S_STAT
_Static_assert(sizeof s_stats_offsets / sizeof s_stats_offsets[0] * 8 == KVEDGE_WIRE_STATS_BYTES,
               "the stats record is 17 u64");

void kvedge_wire_stats_pack(const kvedge_engine_stats_t *s, uint8_t out[KVEDGE_WIRE_STATS_BYTES])
{
    for (size_t i = 0; i < KVEDGE_WIRE_STATS_BYTES / 8; i++) {
        uint64_t v;
        memcpy(&v, (const char *)s + s_stats_offsets[i], sizeof v);
        kvedge_le_put64(out + 8 * i, v);
    }
}

int kvedge_wire_stats_parse(const uint8_t *in, size_t len, kvedge_engine_stats_t *s)
{
    memset(s, 0, sizeof *s);
    if (!in || len != KVEDGE_WIRE_STATS_BYTES)
        return KVEDGE_EPROTO;
    for (size_t i = 0; i < KVEDGE_WIRE_STATS_BYTES / 8; i++) {
        uint64_t v = kvedge_le_get64(in + 8 * i);
        memcpy((char *)s + s_stats_offsets[i], &v, sizeof v);
    }
    return KVEDGE_OK;
}

/* Node info: role u8 @0 | reserved 7 @1 | tenant tag 16 @8 | max frame u32 @24 |
 * max items u32 @28 | max chunks u32 @32 | max credit u32 @36 | default credit u32 @40 |
 * reserved @44.
 * Spec: the listed fields add up to 56 bytes with "reserved 12" at the end, but the record is
 * stated as 64 bytes; every named field keeps its offset and the trailing reserved field is
 * 20 bytes. */
void kvedge_wire_node_info_pack(const kvedge_wire_node_info_t *n,
                                uint8_t out[KVEDGE_WIRE_NODE_INFO_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_NODE_INFO_BYTES);
    out[0] = (uint8_t)n->role;
    memcpy(out + 8, n->tenant_tag, sizeof n->tenant_tag);
    kvedge_le_put32(out + 24, n->max_frame_bytes);
    kvedge_le_put32(out + 28, n->max_items);
    kvedge_le_put32(out + 32, n->max_chunks);
    kvedge_le_put32(out + 36, n->max_credit);
    kvedge_le_put32(out + 40, n->default_credit);
}

/* A node's advertised limits lie within the protocol's (a node may be stricter, never
 * looser), and its default credit within its own maximum. */
int kvedge_wire_node_info_parse(const uint8_t *in, size_t len, kvedge_wire_node_info_t *n)
{
    memset(n, 0, sizeof *n);
    if (!in || len != KVEDGE_WIRE_NODE_INFO_BYTES ||
        (in[0] < KVEDGE_ROLE_CLOUD || in[0] > KVEDGE_ROLE_PROXY) || !s_all_zero(in + 1, 7) ||
        !s_all_zero(in + 44, KVEDGE_WIRE_NODE_INFO_BYTES - 44))
        return KVEDGE_EPROTO;
    n->role = (kvedge_role_t)in[0];
    memcpy(n->tenant_tag, in + 8, sizeof n->tenant_tag);
    n->max_frame_bytes = kvedge_le_get32(in + 24);
    n->max_items = kvedge_le_get32(in + 28);
    n->max_chunks = kvedge_le_get32(in + 32);
    n->max_credit = kvedge_le_get32(in + 36);
    n->default_credit = kvedge_le_get32(in + 40);
    return s_check(s_count_in(n->max_frame_bytes, 1, KVEDGE_WIRE_MAX_FRAME_BYTES) &&
                   s_count_in(n->max_items, 1, KVEDGE_WIRE_MAX_ITEMS) &&
                   s_count_in(n->max_chunks, 1, KVEDGE_WIRE_MAX_CHUNKS) &&
                   s_count_in(n->max_credit, 1, KVEDGE_WIRE_MAX_CREDIT) &&
                   s_count_in(n->default_credit, 1, n->max_credit));
}

/* GET_LAYER data message f1: chunk index u32 | head u16 | reserved u16 | status int32.
 * Spec: a head is sent (0) or missed (ENOTFOUND, ECORRUPT); any other failure ends the
 * stream in the end message, so other statuses are rejected here. */
void kvedge_wire_stream_hdr_pack(const kvedge_wire_stream_hdr_t *s,
                                 uint8_t out[KVEDGE_WIRE_STREAM_HDR_BYTES])
{
    kvedge_le_put32(out, s->chunk_index);
    kvedge_le_put16(out + 4, s->head);
    kvedge_le_put16(out + 6, 0);
    kvedge_le_put32(out + 8, (uint32_t)kvedge_err_to_wire(s->status));
}

int kvedge_wire_stream_hdr_parse(const uint8_t *in, size_t len, kvedge_wire_stream_hdr_t *s)
{
    memset(s, 0, sizeof *s);
    if (!in || len != KVEDGE_WIRE_STREAM_HDR_BYTES || kvedge_le_get16(in + 6) != 0)
        return KVEDGE_EPROTO;
    s->chunk_index = kvedge_le_get32(in);
    s->head = kvedge_le_get16(in + 4);
    s->status = kvedge_err_from_wire((int32_t)kvedge_le_get32(in + 8));
    return s_check(s->status == KVEDGE_OK || s->status == KVEDGE_ENOTFOUND ||
                   s->status == KVEDGE_ECORRUPT);
}

/* GET_LAYER pack frame: max blocks u16 | reserved u16 | max bytes u32. */
void kvedge_wire_pack_pack(const kvedge_wire_pack_t *p, uint8_t out[KVEDGE_WIRE_PACK_BYTES])
{
    kvedge_le_put16(out, p->max_blocks);
    kvedge_le_put16(out + 2, 0);
    kvedge_le_put32(out + 4, p->max_bytes);
}

int kvedge_wire_pack_parse(const uint8_t *in, size_t len, kvedge_wire_pack_t *p)
{
    memset(p, 0, sizeof *p);
    if (!in || len != KVEDGE_WIRE_PACK_BYTES || kvedge_le_get16(in + 2) != 0)
        return KVEDGE_EPROTO;
    p->max_blocks = kvedge_le_get16(in);
    p->max_bytes = kvedge_le_get32(in + 4);
    return s_check(s_count_in(p->max_blocks, 2, KVEDGE_WIRE_MAX_PACK) &&
                   s_count_in(p->max_bytes, 1, KVEDGE_WIRE_MAX_FRAME_BYTES));
}

/* ---- FETCH records ---- */

static const char *const s_fetch_reasons[] = {
#define S_REASON_TEXT(name, value, text) [value] = text,
    KVEDGE_FETCH_REASON_MAP(S_REASON_TEXT)
#undef S_REASON_TEXT
};

const char *kvedge_fetch_reason_name(int reason)
{
    if (reason < 1 || reason >= (int)(sizeof s_fetch_reasons / sizeof s_fetch_reasons[0]))
        return "?";
    return s_fetch_reasons[reason];
}

static bool s_fetch_reason_ok(uint8_t r)
{
    return r >= 1 && r < sizeof s_fetch_reasons / sizeof s_fetch_reasons[0];
}

static void s_putd(uint8_t *p, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    kvedge_le_put64(p, u);
}

static double s_getd(const uint8_t *p)
{
    uint64_t u = kvedge_le_get64(p);
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* Times on the wire are finite and not negative. */
static bool s_time_ok(double v)
{
    return v >= 0 && v <= 1e300;
}

/* spec: model id (124) | first layer u16 | layers u16 | tokens u32 | flags u32 */
int kvedge_wire_fetch_spec_pack(const kvedge_wire_fetch_spec_t *s,
                                uint8_t out[KVEDGE_WIRE_FETCH_SPEC_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_FETCH_SPEC_BYTES);
    if (s->layers < 1 || s->layers > KVEDGE_WIRE_FETCH_MAX_LAYERS ||
        (uint32_t)s->first_layer + s->layers > 65536u ||
        (s->flags & ~KVEDGE_WIRE_FETCH_FLAGS_KNOWN))
        return KVEDGE_EINVAL;
    int rc = s_model_id_pack(s->model_id, out);
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_le_put16(out + 124, s->first_layer);
    kvedge_le_put16(out + 126, s->layers);
    kvedge_le_put32(out + 128, s->tokens);
    kvedge_le_put32(out + 132, s->flags);
    return KVEDGE_OK;
}

int kvedge_wire_fetch_spec_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_spec_t *s)
{
    memset(s, 0, sizeof *s);
    if (!in || len != KVEDGE_WIRE_FETCH_SPEC_BYTES ||
        (kvedge_le_get32(in + 132) & ~KVEDGE_WIRE_FETCH_FLAGS_KNOWN) ||
        s_model_id_parse(in, s->model_id) != KVEDGE_OK)
        return KVEDGE_EPROTO;
    s->first_layer = kvedge_le_get16(in + 124);
    s->layers = kvedge_le_get16(in + 126);
    s->tokens = kvedge_le_get32(in + 128);
    s->flags = kvedge_le_get32(in + 132);
    return s_check(s->layers >= 1 && s->layers <= KVEDGE_WIRE_FETCH_MAX_LAYERS &&
                   (uint32_t)s->first_layer + s->layers <= 65536u);
}

/* prec: metric u8 | K u8 | reserved u16 | reserved u32 | budget f64 | K rungs */
int kvedge_wire_fetch_prec_pack(const kvedge_wire_fetch_prec_t *p, uint8_t *out, size_t *len)
{
    if (!p || !out || !len || p->n > KVEDGE_WIRE_MAX_ACCEPT)
        return KVEDGE_EINVAL;
    memset(out, 0, KVEDGE_WIRE_FETCH_PREC_HDR_BYTES);
    out[0] = (uint8_t)p->metric;
    out[1] = p->n;
    s_putd(out + 8, p->budget);
    memcpy(out + KVEDGE_WIRE_FETCH_PREC_HDR_BYTES, p->accept, p->n);
    *len = KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + p->n;
    return KVEDGE_OK;
}

int kvedge_wire_fetch_prec_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_prec_t *p)
{
    memset(p, 0, sizeof *p);
    if (!in || len < KVEDGE_WIRE_FETCH_PREC_HDR_BYTES ||
        len != KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + (size_t)in[1] || in[1] > KVEDGE_WIRE_MAX_ACCEPT ||
        !s_all_zero(in + 2, 6))
        return KVEDGE_EPROTO;
    p->metric = (kvedge_quality_metric_t)in[0];
    p->n = in[1];
    p->budget = s_getd(in + 8);
    memcpy(p->accept, in + KVEDGE_WIRE_FETCH_PREC_HDR_BYTES, p->n);
    return KVEDGE_OK;
}

int kvedge_wire_fetch_prec_check(const kvedge_wire_fetch_prec_t *p)
{
    if (!p || kvedge_prec_list_check(p->accept, p->n) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    return kvedge_quality_budget_check(p->metric, p->budget);
}

/* mapped: model id (124) | reserved u32 | N chunk ids */
int kvedge_wire_fetch_mapped_pack(const char *model_id,
                                  uint8_t out[KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES);
    return model_id ? s_model_id_pack(model_id, out) : KVEDGE_EINVAL;
}

int kvedge_wire_fetch_mapped_parse(const uint8_t *in, size_t len, uint32_t n,
                                   char model_id[KVEDGE_WIRE_MODEL_ID_BYTES], const uint8_t **ids)
{
    model_id[0] = '\0';
    *ids = NULL;
    if (!in || n < 1 || n > KVEDGE_WIRE_MAX_CHUNKS ||
        len != KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES + (size_t)n * KVEDGE_CHUNK_ID_BYTES ||
        !s_all_zero(in + KVEDGE_WIRE_MODEL_ID_BYTES, 4) ||
        s_model_id_parse(in, model_id) != KVEDGE_OK) {
        model_id[0] = '\0';
        return KVEDGE_EPROTO;
    }
    *ids = in + KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES;
    return KVEDGE_OK;
}

/* block: kind u8 | source u8 | layer u16 | chunk index u32 | head u16 | reserved u16 |
 * status i32 */
void kvedge_wire_fetch_block_pack(const kvedge_wire_fetch_block_t *b,
                                  uint8_t out[KVEDGE_WIRE_FETCH_BLOCK_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_FETCH_BLOCK_BYTES);
    out[0] = KVEDGE_FETCH_MSG_BLOCK;
    out[1] = b->source;
    kvedge_le_put16(out + 2, b->layer);
    kvedge_le_put32(out + 4, b->chunk_index);
    kvedge_le_put16(out + 8, b->head);
    kvedge_le_put32(out + 12, (uint32_t)kvedge_err_to_wire(b->status));
}

int kvedge_wire_fetch_block_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_block_t *b)
{
    memset(b, 0, sizeof *b);
    if (!in || len != KVEDGE_WIRE_FETCH_BLOCK_BYTES || in[0] != KVEDGE_FETCH_MSG_BLOCK ||
        kvedge_le_get16(in + 10) != 0)
        return KVEDGE_EPROTO;
    b->source = in[1];
    b->layer = kvedge_le_get16(in + 2);
    b->chunk_index = kvedge_le_get32(in + 4);
    b->head = kvedge_le_get16(in + 8);
    b->status = kvedge_err_from_wire((int32_t)kvedge_le_get32(in + 12));
    return s_check(
        b->source < KVEDGE_WIRE_FETCH_MAX_SOURCES && b->chunk_index < KVEDGE_WIRE_MAX_CHUNKS &&
        (b->status == KVEDGE_OK || b->status == KVEDGE_ENOTFOUND || b->status == KVEDGE_ECORRUPT));
}

/* layer: kind u8 | reason u8 | layer u16 | source i16 | from_layer u16 | status i32 |
 * heads u32 | attempts u32 | reserved u32 */
void kvedge_wire_fetch_layer_pack(const kvedge_wire_fetch_layer_t *l,
                                  uint8_t out[KVEDGE_WIRE_FETCH_LAYER_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_FETCH_LAYER_BYTES);
    out[0] = KVEDGE_FETCH_MSG_LAYER;
    out[1] = l->reason;
    kvedge_le_put16(out + 2, l->layer);
    kvedge_le_put16(out + 4, (uint16_t)l->source);
    kvedge_le_put16(out + 6, l->from_layer);
    kvedge_le_put32(out + 8, (uint32_t)kvedge_err_to_wire(l->status));
    kvedge_le_put32(out + 12, l->heads);
    kvedge_le_put32(out + 16, l->attempts);
    out[20] = l->prec;
}

int kvedge_wire_fetch_layer_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_layer_t *l)
{
    memset(l, 0, sizeof *l);
    if (!in || len != KVEDGE_WIRE_FETCH_LAYER_BYTES || in[0] != KVEDGE_FETCH_MSG_LAYER ||
        !s_all_zero(in + 21, 3))
        return KVEDGE_EPROTO;
    l->prec = in[20];
    l->reason = in[1];
    l->layer = kvedge_le_get16(in + 2);
    l->source = (int16_t)kvedge_le_get16(in + 4);
    l->from_layer = kvedge_le_get16(in + 6);
    l->status = kvedge_err_from_wire((int32_t)kvedge_le_get32(in + 8));
    l->heads = kvedge_le_get32(in + 12);
    l->attempts = kvedge_le_get32(in + 16);
    bool delivered = l->status == KVEDGE_OK;
    return s_check(s_fetch_reason_ok(l->reason) && l->source >= -1 &&
                   l->source < KVEDGE_WIRE_FETCH_MAX_SOURCES &&
                   (delivered || l->status == KVEDGE_ENOTFOUND) && (!delivered || l->source >= 0) &&
                   l->attempts <= KVEDGE_WIRE_FETCH_MAX_SOURCES &&
                   (delivered || l->from_layer == KVEDGE_WIRE_FETCH_OWN_LAYER) &&
                   (l->prec == KVEDGE_PREC_STORED || (delivered && kvedge_prec_valid(l->prec))));
}

/* plan: kind u8 | reserved 3 | sources u32 | layers u32 | split u32 | 5 x f64 */
void kvedge_wire_fetch_plan_pack(const kvedge_wire_fetch_plan_t *p,
                                 uint8_t out[KVEDGE_WIRE_FETCH_PLAN_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_FETCH_PLAN_BYTES);
    out[0] = KVEDGE_FETCH_MSG_PLAN;
    kvedge_le_put32(out + 4, p->sources);
    kvedge_le_put32(out + 8, p->layers);
    kvedge_le_put32(out + 12, p->split);
    s_putd(out + 16, p->total_us);
    s_putd(out + 24, p->bound_us);
    s_putd(out + 32, p->cloud_only_us);
    s_putd(out + 40, p->recompute_all_us);
    s_putd(out + 48, p->load_then_compute_us);
}

int kvedge_wire_fetch_plan_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_plan_t *p)
{
    memset(p, 0, sizeof *p);
    if (!in || len != KVEDGE_WIRE_FETCH_PLAN_BYTES || in[0] != KVEDGE_FETCH_MSG_PLAN ||
        !s_all_zero(in + 1, 3))
        return KVEDGE_EPROTO;
    p->sources = kvedge_le_get32(in + 4);
    p->layers = kvedge_le_get32(in + 8);
    p->split = kvedge_le_get32(in + 12);
    p->total_us = s_getd(in + 16);
    p->bound_us = s_getd(in + 24);
    p->cloud_only_us = s_getd(in + 32);
    p->recompute_all_us = s_getd(in + 40);
    p->load_then_compute_us = s_getd(in + 48);
    return s_check(p->sources <= KVEDGE_WIRE_FETCH_MAX_SOURCES &&
                   s_count_in(p->layers, 1, KVEDGE_WIRE_FETCH_MAX_LAYERS) &&
                   p->split <= p->layers && s_time_ok(p->total_us) && s_time_ok(p->bound_us) &&
                   s_time_ok(p->cloud_only_us) && s_time_ok(p->recompute_all_us) &&
                   s_time_ok(p->load_then_compute_us));
}

/* source: name (64, NUL-padded) | kind u8 | up u8 | reserved u16 | rtt_us f32 | bw f64 */
void kvedge_wire_fetch_source_pack(const kvedge_wire_fetch_source_t *s,
                                   uint8_t out[KVEDGE_WIRE_FETCH_SOURCE_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_FETCH_SOURCE_BYTES);
    size_t n = strnlen(s->name, KVEDGE_WIRE_FETCH_NAME_BYTES - 1);
    memcpy(out, s->name, n);
    out[64] = s->kind;
    out[65] = s->up ? 1 : 0;
    uint32_t r;
    memcpy(&r, &s->rtt_us, sizeof r);
    kvedge_le_put32(out + 68, r);
    s_putd(out + 72, s->bw_bytes_per_s);
}

int kvedge_wire_fetch_source_parse(const uint8_t *in, size_t len, kvedge_wire_fetch_source_t *s)
{
    memset(s, 0, sizeof *s);
    if (!in || len != KVEDGE_WIRE_FETCH_SOURCE_BYTES || kvedge_le_get16(in + 66) != 0 || in[65] > 1)
        return KVEDGE_EPROTO;
    const uint8_t *nul = memchr(in, 0, KVEDGE_WIRE_FETCH_NAME_BYTES);
    if (!nul || !s_all_zero(nul, KVEDGE_WIRE_FETCH_NAME_BYTES - (size_t)(nul - in)))
        return KVEDGE_EPROTO;
    memcpy(s->name, in, (size_t)(nul - in));
    s->kind = in[64];
    s->up = in[65] == 1;
    uint32_t r = kvedge_le_get32(in + 68);
    memcpy(&s->rtt_us, &r, sizeof r);
    s->bw_bytes_per_s = s_getd(in + 72);
    return s_check(s->kind <= 4 && s_time_ok(s->rtt_us) && s_time_ok(s->bw_bytes_per_s));
}

/* plan layer: source i16 | reason u8 | mapped u8 | from_layer u16 | reserved u16 |
 * cost_us f64 */
void kvedge_wire_fetch_plan_layer_pack(const kvedge_wire_fetch_plan_layer_t *l,
                                       uint8_t out[KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES])
{
    memset(out, 0, KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    kvedge_le_put16(out, (uint16_t)l->source);
    out[2] = l->reason;
    out[3] = l->mapped ? 1 : 0;
    kvedge_le_put16(out + 4, l->mapped ? l->from_layer : KVEDGE_WIRE_FETCH_OWN_LAYER);
    out[6] = l->prec;
    out[7] = l->prec_reason;
    s_putd(out + 8, l->cost_us);
}

int kvedge_wire_fetch_plan_layer_parse(const uint8_t *in, size_t len,
                                       kvedge_wire_fetch_plan_layer_t *l)
{
    memset(l, 0, sizeof *l);
    if (!in || len != KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES || in[3] > 1)
        return KVEDGE_EPROTO;
    l->source = (int16_t)kvedge_le_get16(in);
    l->prec = in[6];
    l->prec_reason = in[7];
    l->reason = in[2];
    l->mapped = in[3] == 1;
    l->from_layer = kvedge_le_get16(in + 4);
    l->cost_us = s_getd(in + 8);
    /* The cost of a layer no up source holds is infinite: allowed here. A mapped layer comes
     * from a source and names a layer; an own one names none. */
    return s_check(l->source >= -1 && l->source < KVEDGE_WIRE_FETCH_MAX_SOURCES &&
                   l->reason <= 16 && (l->cost_us >= 0) &&
                   /* a rung only for a fetched layer; a reason only with a rung, but for a
                    * layer recomputed to stay within the budget */
                   (l->prec == KVEDGE_PREC_STORED
                        ? l->prec_reason == KVEDGE_PLAN_PREC_NONE ||
                              (l->source == -1 && l->prec_reason == KVEDGE_PLAN_PREC_BUDGET)
                        : l->source >= 0 && kvedge_prec_valid(l->prec) &&
                              l->prec_reason <= KVEDGE_PLAN_PREC_ONLY) &&
                   (l->mapped ? l->source >= 0 && l->from_layer != KVEDGE_WIRE_FETCH_OWN_LAYER
                              : l->from_layer == KVEDGE_WIRE_FETCH_OWN_LAYER));
}
