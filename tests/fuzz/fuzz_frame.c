/* Fuzz target for the wire codec (access/frame.c): header parse, message validation and the
 * records of every valid message. Built with libFuzzer (KVEDGE_FUZZ=ON, clang) it fuzzes;
 * built normally it replays the committed corpus (tests/fuzz/corpus/frame).
 *
 * Input: byte 0 = number of frames (header included) % 8; then every frame but the last as
 * u16 little-endian length + bytes (cut short where the input ends); the rest is the last
 * frame. Each frame is copied into its own exact-size buffer so ASan sees any read past it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "access/frame.h"
#include "access/codec/byteorder.h"
#include "access/codec/error.h"
#include "access/codec/errwire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define S_MAX_FRAMES 8

/* The codec must hold its own contract: anything else is a bug worth a crash. */
static void s_require(bool ok)
{
    if (!ok)
        abort();
}

/* A record that parses is canonical: packing what was parsed gives the same bytes back. */
static void s_check_put_item(const uint8_t *p, size_t len)
{
    kvedge_wire_put_item_t item;
    uint8_t back[KVEDGE_WIRE_PUT_ITEM_BYTES];
    int rc = kvedge_wire_put_item_parse(p, len, &item);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EPROTO);
    if (rc == KVEDGE_OK)
        s_require(kvedge_wire_put_item_pack(&item, back) == KVEDGE_OK &&
                  memcmp(back, p, sizeof back) == 0);
}

static void s_check_model(const uint8_t *p, size_t len)
{
    kvedge_model_t m;
    uint8_t back[KVEDGE_WIRE_MODEL_BYTES];
    int rc = kvedge_wire_model_parse(p, len, &m);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EPROTO);
    if (rc == KVEDGE_OK)
        s_require(kvedge_wire_model_pack(&m, back) == KVEDGE_OK &&
                  memcmp(back, p, sizeof back) == 0);
}

static void s_check_chunk_entry(const uint8_t *p, size_t len)
{
    kvedge_wire_chunk_entry_t e;
    uint8_t back[KVEDGE_WIRE_CHUNK_ENTRY_BYTES];
    int rc = kvedge_wire_chunk_entry_parse(p, len, &e);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EPROTO);
    if (rc == KVEDGE_OK)
        s_require(kvedge_wire_chunk_entry_pack(&e, back) == KVEDGE_OK &&
                  memcmp(back, p, sizeof back) == 0);
}

static void s_check_stats(const uint8_t *p, size_t len)
{
    kvedge_engine_stats_t s;
    uint8_t back[KVEDGE_WIRE_STATS_BYTES];
    int rc = kvedge_wire_stats_parse(p, len, &s);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EPROTO);
    if (rc == KVEDGE_OK) {
        kvedge_wire_stats_pack(&s, back);
        s_require(memcmp(back, p, sizeof back) == 0);
    }
}

static void s_check_node_info(const uint8_t *p, size_t len)
{
    kvedge_wire_node_info_t n;
    uint8_t back[KVEDGE_WIRE_NODE_INFO_BYTES];
    int rc = kvedge_wire_node_info_parse(p, len, &n);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EPROTO);
    if (rc == KVEDGE_OK) {
        kvedge_wire_node_info_pack(&n, back);
        s_require(memcmp(back, p, sizeof back) == 0);
    }
}

static void s_check_stream_hdr(const uint8_t *p, size_t len)
{
    kvedge_wire_stream_hdr_t s;
    uint8_t back[KVEDGE_WIRE_STREAM_HDR_BYTES];
    int rc = kvedge_wire_stream_hdr_parse(p, len, &s);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EPROTO);
    if (rc == KVEDGE_OK) {
        kvedge_wire_stream_hdr_pack(&s, back);
        s_require(memcmp(back, p, sizeof back) == 0);
    }
}

static void s_check_key(const uint8_t *p)
{
    kvedge_block_key_t key;
    uint8_t back[KVEDGE_WIRE_KEY_BYTES];
    kvedge_wire_key_parse(p, &key);
    kvedge_wire_key_pack(&key, back);
    s_require(memcmp(back, p, sizeof back) == 0);
}

/* Every record parser on one frame of any message: each checks its own length. */
static void s_any_records(const kvedge_wire_frame_t *f)
{
    s_check_put_item(f->data, f->len);
    s_check_model(f->data, f->len);
    s_check_chunk_entry(f->data, f->len);
    s_check_stats(f->data, f->len);
    s_check_node_info(f->data, f->len);
    s_check_stream_hdr(f->data, f->len);
    if (f->len == KVEDGE_WIRE_KEY_BYTES)
        s_check_key(f->data);
}

/* FETCH: a valid message's records parse, and pack back to the same bytes. */
static void s_check_fetch(const kvedge_wire_header_t *h, const kvedge_wire_frame_t *f, size_t n,
                          bool reply)
{
    if (!reply) {
        kvedge_wire_fetch_spec_t spec;
        uint8_t back[KVEDGE_WIRE_FETCH_SPEC_BYTES];
        s_require(n >= 2 && kvedge_wire_fetch_spec_parse(f[0].data, f[0].len, &spec) == 0);
        s_require(kvedge_wire_fetch_spec_pack(&spec, back) == 0 &&
                  memcmp(back, f[0].data, sizeof back) == 0);
        /* MAPPED: the last frame is the mapped model's id and its chain of the same N. */
        bool mapped = (spec.flags & KVEDGE_WIRE_FETCH_FLAG_MAPPED) != 0;
        bool prec = (spec.flags & KVEDGE_WIRE_FETCH_FLAG_PREC) != 0;
        size_t extra = (size_t)mapped + (size_t)prec;
        s_require(n == 2 + extra || n == 3 + extra);
        if (prec) {
            /* PREC: the frame before the mapped one (or the last) parses and packs back; its
             * meaning is checked without crashing, whatever it says. */
            const kvedge_wire_frame_t *pf = &f[n - 1 - (size_t)mapped];
            kvedge_wire_fetch_prec_t pr;
            uint8_t pback[KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + KVEDGE_WIRE_MAX_ACCEPT];
            size_t plen = 0;
            s_require(kvedge_wire_fetch_prec_parse(pf->data, pf->len, &pr) == 0);
            s_require(kvedge_wire_fetch_prec_pack(&pr, pback, &plen) == 0 && plen == pf->len &&
                      memcmp(pback, pf->data, plen) == 0);
            int rc = kvedge_wire_fetch_prec_check(&pr);
            s_require(rc == 0 || rc == KVEDGE_EINVAL);
        }
        if (mapped) {
            char mid[KVEDGE_WIRE_MODEL_ID_BYTES];
            const uint8_t *ids = NULL;
            uint8_t mback[KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES];
            s_require(kvedge_wire_fetch_mapped_parse(f[n - 1].data, f[n - 1].len, h->count, mid,
                                                     &ids) == 0 &&
                      strcmp(mid, spec.model_id) != 0 &&
                      ids == f[n - 1].data + KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES);
            s_require(kvedge_wire_fetch_mapped_pack(mid, mback) == 0 &&
                      memcmp(mback, f[n - 1].data, sizeof mback) == 0);
        }
        return;
    }
    if (!(h->flags & KVEDGE_WIRE_FLAG_MORE))
        return;
    s_require(n >= 1 && f[0].len >= 1);
    if (f[0].data[0] == KVEDGE_FETCH_MSG_BLOCK) {
        /* count k BLOCK records (packed when k > 1), one block frame per record of status 0 */
        uint32_t k = h->count;
        s_require(k >= 1 && k <= KVEDGE_WIRE_MAX_PACK &&
                  f[0].len == (size_t)k * KVEDGE_WIRE_FETCH_BLOCK_BYTES);
        size_t zeros = 0;
        for (uint32_t i = 0; i < k; i++) {
            const uint8_t *rec = f[0].data + (size_t)i * KVEDGE_WIRE_FETCH_BLOCK_BYTES;
            kvedge_wire_fetch_block_t b;
            uint8_t back[KVEDGE_WIRE_FETCH_BLOCK_BYTES];
            s_require(kvedge_wire_fetch_block_parse(rec, KVEDGE_WIRE_FETCH_BLOCK_BYTES, &b) == 0);
            kvedge_wire_fetch_block_pack(&b, back);
            s_require(memcmp(back, rec, sizeof back) == 0);
            zeros += b.status == 0;
        }
        s_require(n == 1 + zeros);
    } else if (f[0].data[0] == KVEDGE_FETCH_MSG_LAYER) {
        kvedge_wire_fetch_layer_t l;
        uint8_t back[KVEDGE_WIRE_FETCH_LAYER_BYTES];
        s_require(kvedge_wire_fetch_layer_parse(f[0].data, f[0].len, &l) == 0);
        kvedge_wire_fetch_layer_pack(&l, back);
        s_require(memcmp(back, f[0].data, sizeof back) == 0);
    } else {
        kvedge_wire_fetch_plan_t p;
        s_require(f[0].data[0] == KVEDGE_FETCH_MSG_PLAN && n == 3 &&
                  kvedge_wire_fetch_plan_parse(f[0].data, f[0].len, &p) == 0);
        /* Source and layer records are parsed (and may fail) by the client, not validate. */
        for (uint32_t i = 0; i < p.sources; i++) {
            kvedge_wire_fetch_source_t src;
            int rc = kvedge_wire_fetch_source_parse(f[1].data + i * KVEDGE_WIRE_FETCH_SOURCE_BYTES,
                                                    KVEDGE_WIRE_FETCH_SOURCE_BYTES, &src);
            s_require(rc == 0 || rc == KVEDGE_EPROTO);
        }
        for (uint32_t i = 0; i < p.layers; i++) {
            kvedge_wire_fetch_plan_layer_t pl;
            const uint8_t *rec = f[2].data + i * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES;
            int rc =
                kvedge_wire_fetch_plan_layer_parse(rec, KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES, &pl);
            s_require(rc == 0 || rc == KVEDGE_EPROTO);
            if (rc == 0) { /* accepted: packs back to the same bytes (mapped, from, reserved) */
                uint8_t back[KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES];
                kvedge_wire_fetch_plan_layer_pack(&pl, back);
                s_require(memcmp(back, rec, sizeof back) == 0);
            }
        }
    }
}

/* The records a valid message carries must all parse or fail cleanly, as a server or client
 * will parse them next. Validation guarantees the sizes used here. */
static void s_valid_records(const kvedge_wire_header_t *h, const kvedge_wire_frame_t *f, size_t n)
{
    bool reply = (h->flags & KVEDGE_WIRE_FLAG_REPLY) != 0;
    switch (h->opcode) {
    case KVEDGE_OP_PUT:
        if (!reply) {
            s_require(n == 2 * (size_t)h->count);
            for (size_t i = 0; i < n; i += 2)
                s_check_put_item(f[i].data, f[i].len);
        }
        break;
    case KVEDGE_OP_GET:
        if (!reply && n == 2) { /* an accept list: the node checks it (and may refuse it) */
            int rc = kvedge_prec_list_check(f[1].data, f[1].len);
            s_require(f[1].len <= KVEDGE_WIRE_MAX_ACCEPT && (rc == 0 || rc == KVEDGE_EINVAL));
        }
        if (!reply && (n == 1 || n == 2)) {
            s_require(f[0].len == (size_t)h->count * KVEDGE_WIRE_KEY_BYTES);
            for (size_t i = 0; i < h->count; i++)
                s_check_key(f[0].data + i * KVEDGE_WIRE_KEY_BYTES);
        }
        break;
    case KVEDGE_OP_MODEL:
        if (n == 1)
            s_check_model(f[0].data, f[0].len);
        break;
    case KVEDGE_OP_HELLO:
        if (reply && n == 2)
            s_check_node_info(f[0].data, f[0].len);
        break;
    case KVEDGE_OP_STAT:
        if (reply && n == 1)
            s_check_stats(f[0].data, f[0].len);
        break;
    case KVEDGE_OP_LIST:
        if (reply && n == 1) {
            s_require(f[0].len == (size_t)h->count * KVEDGE_WIRE_CHUNK_ENTRY_BYTES);
            for (size_t i = 0; i < h->count; i++)
                s_check_chunk_entry(f[0].data + i * KVEDGE_WIRE_CHUNK_ENTRY_BYTES,
                                    KVEDGE_WIRE_CHUNK_ENTRY_BYTES);
        }
        break;
    case KVEDGE_OP_GET_LAYER:
        if (!reply && n >= 2) {
            int rc = kvedge_prec_list_check(f[1].data, f[1].len);
            s_require(f[1].len <= KVEDGE_WIRE_MAX_ACCEPT && (rc == 0 || rc == KVEDGE_EINVAL));
        }
        if (!reply && n == 3) { /* the pack frame: in range and canonical */
            kvedge_wire_pack_t pk;
            uint8_t back[KVEDGE_WIRE_PACK_BYTES];
            s_require(kvedge_wire_pack_parse(f[2].data, f[2].len, &pk) == KVEDGE_OK &&
                      pk.max_blocks >= 2 && pk.max_blocks <= KVEDGE_WIRE_MAX_PACK &&
                      pk.max_bytes >= 1 && pk.max_bytes <= KVEDGE_WIRE_MAX_FRAME_BYTES);
            kvedge_wire_pack_pack(&pk, back);
            s_require(memcmp(back, f[2].data, sizeof back) == 0);
        }
        if (reply && (h->flags & KVEDGE_WIRE_FLAG_MORE)) {
            /* A data message of k heads (packed when k > 1): k records in f1, one block
             * frame per record whose status is 0. */
            uint32_t k = h->count;
            s_require(n >= 1 && k >= 1 && k <= KVEDGE_WIRE_MAX_PACK &&
                      f[0].len == (size_t)k * KVEDGE_WIRE_STREAM_HDR_BYTES);
            size_t zeros = 0;
            for (uint32_t i = 0; i < k; i++) {
                const uint8_t *p = f[0].data + (size_t)i * KVEDGE_WIRE_STREAM_HDR_BYTES;
                kvedge_wire_stream_hdr_t s;
                s_require(kvedge_wire_stream_hdr_parse(p, KVEDGE_WIRE_STREAM_HDR_BYTES, &s) == 0);
                s_check_stream_hdr(p, KVEDGE_WIRE_STREAM_HDR_BYTES);
                zeros += s.status == 0;
            }
            s_require(n == 1 + zeros);
        }
        break;
    case KVEDGE_OP_FETCH:
        s_check_fetch(h, f, n, reply);
        break;
    default:
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvedge_wire_header_t h;
    if (size == 0) { /* a message without frames has no header */
        s_require(kvedge_wire_header_parse(NULL, 0, &h) == KVEDGE_EPROTO);
        return 0;
    }
    size_t nf = data[0] % S_MAX_FRAMES, pos = 1;
    uint8_t *bufs[S_MAX_FRAMES] = {0};
    kvedge_wire_frame_t frames[S_MAX_FRAMES];
    for (size_t i = 0; i < nf; i++) {
        size_t len = size - pos;
        if (i + 1 < nf) {
            size_t want = size - pos >= 2 ? (size_t)(data[pos] | (data[pos + 1] << 8)) : 0;
            pos += size - pos >= 2 ? 2 : size - pos;
            len = want < size - pos ? want : size - pos;
        }
        bufs[i] = malloc(len); /* even 0 bytes: ASan flags any read of an empty frame */
        if (!bufs[i] && len)
            goto out;
        if (len)
            memcpy(bufs[i], data + pos, len);
        frames[i] = (kvedge_wire_frame_t){bufs[i], len};
        pos += len;
    }
    if (nf == 0) {
        s_require(kvedge_wire_header_parse(NULL, 0, &h) == KVEDGE_EPROTO);
        goto out;
    }

    int rc = kvedge_wire_header_parse(frames[0].data, frames[0].len, &h);
    s_require(rc == KVEDGE_OK || rc == KVEDGE_EPROTO || rc == KVEDGE_EVERSION);
    for (size_t i = 1; i < nf; i++)
        s_any_records(&frames[i]);
    if (rc == KVEDGE_EVERSION)
        s_require(h.version != KVEDGE_WIRE_VERSION);
    if (rc != KVEDGE_OK)
        goto out;
    /* Canonical up to the status: one this library does not know reads as KVEDGE_EPROTO and
     * is packed as EPROTO's wire value (access/codec/errwire.h). */
    uint8_t back[KVEDGE_WIRE_HEADER_BYTES], want[KVEDGE_WIRE_HEADER_BYTES];
    memcpy(want, frames[0].data, sizeof want);
    int32_t wire = (int32_t)kvedge_le_get32(want + 16);
    kvedge_le_put32(want + 16, (uint32_t)kvedge_err_to_wire(kvedge_err_from_wire(wire)));
    kvedge_wire_header_pack(&h, back);
    s_require(memcmp(back, want, sizeof back) == 0);

    int v = kvedge_wire_validate(&h, nf > 1 ? frames + 1 : NULL, nf - 1);
    s_require(v == KVEDGE_OK || v == KVEDGE_EPROTO);
    if (v == KVEDGE_OK)
        s_valid_records(&h, frames + 1, nf - 1);
out:
    for (size_t i = 0; i < nf; i++)
        free(bufs[i]);
    return 0;
}
