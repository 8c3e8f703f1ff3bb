/* Writes the seed corpus for fuzz_frame: one valid request and one valid reply per opcode
 * (three stream messages for GET_LAYER, none for CREDIT and CANCEL, which have no reply; FETCH
 * also with MAPPED and mapped plan and LAYER records), in
 * fuzz_frame's input format. Run: gen_frame_corpus DIR. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/frame.h"
#include "access/codec/error.h"
#include "access/codec/errwire.h"

#define S_MAX_FRAMES 8 /* fuzz_frame's limit, header included */

typedef struct {
    kvedge_wire_header_t h;
    kvedge_wire_frame_t f[S_MAX_FRAMES - 1];
    size_t n;
} s_msg_t;

static void s_add(s_msg_t *m, const void *data, size_t len)
{
    if (m->n == S_MAX_FRAMES - 1)
        exit(1);
    m->f[m->n++] = (kvedge_wire_frame_t){data, len};
}

/* Checks the message is valid, encodes it as fuzz_frame reads it, and writes it. */
static void s_write(const char *dir, const char *name, const s_msg_t *m)
{
    if (kvedge_wire_validate(&m->h, m->f, m->n) != KVEDGE_OK) {
        fprintf(stderr, "%s: not a valid message\n", name);
        exit(1);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *out = fopen(path, "wb");
    if (!out) {
        perror(path);
        exit(1);
    }
    uint8_t hdr[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&m->h, hdr);
    fputc((int)(m->n + 1), out);
    /* The header and every payload frame but the last get a length prefix. */
    for (size_t i = 0; i <= m->n; i++) {
        const uint8_t *p = i ? m->f[i - 1].data : hdr;
        size_t len = i ? m->f[i - 1].len : sizeof hdr;
        if (i < m->n) {
            fputc((int)(len & 0xFF), out);
            fputc((int)(len >> 8), out);
        }
        if (len && fwrite(p, 1, len, out) != len) {
            perror(path);
            exit(1);
        }
    }
    if (fclose(out) != 0) {
        perror(path);
        exit(1);
    }
}

static s_msg_t s_request(kvedge_op_t op, uint32_t count)
{
    s_msg_t m = {.h = {KVEDGE_WIRE_VERSION, (uint8_t)op, 0, 0x100 + op, 0, count, 0, 5000}};
    return m;
}

static s_msg_t s_reply(kvedge_op_t op, uint32_t count)
{
    s_msg_t m = {
        .h = {KVEDGE_WIRE_VERSION, (uint8_t)op, KVEDGE_WIRE_FLAG_REPLY, 0x100 + op, 0, count}};
    return m;
}

static void s_chunk(kvedge_chunk_info_t *c, uint32_t index)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++) {
        c->id.bytes[i] = (uint8_t)(index * 31 + i);
        c->parent.bytes[i] = index ? (uint8_t)((index - 1) * 31 + i) : 0;
    }
    c->has_parent = index > 0;
    strcpy(c->model_id, "opt-125m");
    c->index = index;
    c->tokens = 16;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    static const uint8_t block[12] = "KVEB\x01 block";
    uint8_t ids[3 * KVEDGE_CHUNK_ID_BYTES + 4], u32s[3 * 4];
    for (size_t i = 0; i < sizeof ids; i++)
        ids[i] = (uint8_t)(i * 7);
    kvedge_model_t model = {"opt-125m", 12, 12, 64, KVEDGE_DTYPE_FP16};
    uint8_t model_rec[KVEDGE_WIRE_MODEL_BYTES];
    if (kvedge_wire_model_pack(&model, model_rec) != 0)
        return 1;
    s_msg_t m;

    m = s_request(KVEDGE_OP_HELLO, 0);
    s_add(&m, "kvedge-cli", 10);
    s_write(dir, "req-hello", &m);
    m = s_reply(KVEDGE_OP_HELLO, 0);
    kvedge_wire_node_info_t info = {KVEDGE_ROLE_EDGE,
                                    {0xAB, 0xCD},
                                    KVEDGE_WIRE_MAX_FRAME_BYTES,
                                    KVEDGE_WIRE_MAX_ITEMS,
                                    KVEDGE_WIRE_MAX_CHUNKS,
                                    KVEDGE_WIRE_MAX_CREDIT,
                                    8};
    uint8_t info_rec[KVEDGE_WIRE_NODE_INFO_BYTES];
    kvedge_wire_node_info_pack(&info, info_rec);
    s_add(&m, info_rec, sizeof info_rec);
    s_add(&m, "edge-1", 6);
    s_write(dir, "rep-hello", &m);

    m = s_request(KVEDGE_OP_PING, 0);
    s_add(&m, "ping!", 5);
    s_write(dir, "req-ping", &m);
    m.h.flags = KVEDGE_WIRE_FLAG_REPLY;
    m.h.deadline_ms = 0;
    s_write(dir, "rep-ping", &m);

    m = s_request(KVEDGE_OP_PUT, 2);
    uint8_t items[2][KVEDGE_WIRE_PUT_ITEM_BYTES];
    for (uint32_t i = 0; i < 2; i++) {
        kvedge_wire_put_item_t item = {.layer = 1, .head = (uint16_t)i, .pin = i == 1};
        s_chunk(&item.chunk, i);
        if (kvedge_wire_put_item_pack(&item, items[i]) != 0)
            return 1;
        s_add(&m, items[i], sizeof items[i]);
        s_add(&m, block, sizeof block);
    }
    s_write(dir, "req-put", &m);
    m = s_reply(KVEDGE_OP_PUT, 2);
    kvedge_le_put32(u32s, 0);
    kvedge_le_put32(u32s + 4, (uint32_t)kvedge_err_to_wire(KVEDGE_ESHAPE));
    s_add(&m, u32s, 8);
    s_write(dir, "rep-put", &m);

    m = s_request(KVEDGE_OP_GET, 2);
    uint8_t keys[2 * KVEDGE_WIRE_KEY_BYTES];
    for (uint32_t i = 0; i < 2; i++) {
        kvedge_block_key_t key = {.layer = 1, .head = (uint16_t)i};
        memcpy(key.chunk.bytes, ids, KVEDGE_CHUNK_ID_BYTES);
        kvedge_wire_key_pack(&key, keys + i * KVEDGE_WIRE_KEY_BYTES);
    }
    s_add(&m, keys, sizeof keys);
    s_write(dir, "req-get", &m);
    static const uint8_t accept[] = {3, 2, 0x43}; /* int4-g32, int8, int4-g32+think-50 */
    s_add(&m, accept, 2);
    s_write(dir, "req-get-accept", &m);
    m = s_reply(KVEDGE_OP_GET, 3);
    uint8_t get_st[12];
    kvedge_le_put32(get_st, 0);
    kvedge_le_put32(get_st + 4, (uint32_t)kvedge_err_to_wire(KVEDGE_ENOTFOUND));
    kvedge_le_put32(get_st + 8, 0);
    s_add(&m, get_st, sizeof get_st);
    s_add(&m, block, sizeof block);
    s_add(&m, block, 5);
    s_write(dir, "rep-get", &m);

    m = s_request(KVEDGE_OP_GET_LAYER, 2);
    m.h.credit = 4;
    uint8_t gl[4 + 2 * KVEDGE_CHUNK_ID_BYTES] = {3, 0, 0, 0};
    memcpy(gl + 4, ids, 2 * KVEDGE_CHUNK_ID_BYTES);
    s_add(&m, gl, sizeof gl);
    s_write(dir, "req-get_layer", &m);
    s_add(&m, accept, sizeof accept);
    s_write(dir, "req-get_layer-accept", &m);
    uint8_t sh[2][KVEDGE_WIRE_STREAM_HDR_BYTES];
    kvedge_wire_stream_hdr_t hit = {0, 0, 0}, miss = {1, 3, KVEDGE_ECORRUPT};
    kvedge_wire_stream_hdr_pack(&hit, sh[0]);
    kvedge_wire_stream_hdr_pack(&miss, sh[1]);
    m = s_reply(KVEDGE_OP_GET_LAYER, 1);
    m.h.flags |= KVEDGE_WIRE_FLAG_MORE;
    s_add(&m, sh[0], sizeof sh[0]);
    s_add(&m, block, sizeof block);
    s_write(dir, "rep-get_layer-data", &m);
    m.n = 0;
    s_add(&m, sh[1], sizeof sh[1]);
    s_write(dir, "rep-get_layer-miss", &m);
    m = s_reply(KVEDGE_OP_GET_LAYER, 24);
    m.h.flags |= KVEDGE_WIRE_FLAG_END;
    s_write(dir, "rep-get_layer-end", &m);
    /* Packed: the request's pack frame after an empty accept list, and a data message of
     * three heads (hit, miss, hit). */
    m = s_request(KVEDGE_OP_GET_LAYER, 2);
    m.h.credit = 4;
    s_add(&m, gl, sizeof gl);
    s_add(&m, accept, 0);
    uint8_t pk[KVEDGE_WIRE_PACK_BYTES];
    kvedge_wire_pack_t pack = {KVEDGE_WIRE_MAX_PACK, 1u << 20};
    kvedge_wire_pack_pack(&pack, pk);
    s_add(&m, pk, sizeof pk);
    s_write(dir, "req-get_layer-pack", &m);
    uint8_t sh3[3 * KVEDGE_WIRE_STREAM_HDR_BYTES];
    const kvedge_wire_stream_hdr_t three[3] = {{0, 0, 0}, {0, 1, KVEDGE_ENOTFOUND}, {0, 2, 0}};
    for (int i = 0; i < 3; i++)
        kvedge_wire_stream_hdr_pack(&three[i], sh3 + i * KVEDGE_WIRE_STREAM_HDR_BYTES);
    m = s_reply(KVEDGE_OP_GET_LAYER, 3);
    m.h.flags |= KVEDGE_WIRE_FLAG_MORE;
    s_add(&m, sh3, sizeof sh3);
    s_add(&m, block, sizeof block);
    s_add(&m, block, sizeof block);
    s_write(dir, "rep-get_layer-pack", &m);

    const kvedge_op_t id_ops[] = {KVEDGE_OP_LOOKUP, KVEDGE_OP_DELETE, KVEDGE_OP_PIN,
                                  KVEDGE_OP_UNPIN};
    for (size_t i = 0; i < 4; i++) {
        char name[64];
        m = s_request(id_ops[i], 3);
        s_add(&m, ids, 3 * KVEDGE_CHUNK_ID_BYTES);
        snprintf(name, sizeof name, "req-%s", kvedge_wire_op_name(id_ops[i]));
        for (char *c = name; *c; c++)
            *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
        s_write(dir, name, &m);
        uint32_t k = id_ops[i] == KVEDGE_OP_LOOKUP ? 2 : 3;
        m = s_reply(id_ops[i], k);
        for (uint32_t j = 0; j < k; j++)
            kvedge_le_put32(u32s + 4 * j, 24 * (j + 1));
        s_add(&m, u32s, 4 * k);
        name[2] = 'p'; /* "req-" -> "rep-" */
        s_write(dir, name, &m);
    }

    m = s_request(KVEDGE_OP_LIST, 0);
    uint8_t max[4];
    kvedge_le_put32(max, 100);
    s_add(&m, ids, KVEDGE_CHUNK_ID_BYTES);
    s_add(&m, max, sizeof max);
    s_write(dir, "req-list", &m);
    m = s_reply(KVEDGE_OP_LIST, 2);
    m.h.flags |= KVEDGE_WIRE_FLAG_END;
    uint8_t entries[2 * KVEDGE_WIRE_CHUNK_ENTRY_BYTES];
    for (uint32_t i = 0; i < 2; i++) {
        kvedge_wire_chunk_entry_t e = {
            .blocks = 288, .bytes = 1u << 20, .pinned_blocks = i, .fp16_bytes = 4u << 20};
        s_chunk(&e.chunk, i);
        if (kvedge_wire_chunk_entry_pack(&e, entries + i * KVEDGE_WIRE_CHUNK_ENTRY_BYTES) != 0)
            return 1;
    }
    s_add(&m, entries, sizeof entries);
    s_write(dir, "rep-list", &m);

    m = s_request(KVEDGE_OP_STAT, 0);
    s_write(dir, "req-stat", &m);
    m = s_reply(KVEDGE_OP_STAT, 0);
    kvedge_engine_stats_t st = {.blocks = 10, .bytes = 10000, .capacity_bytes = 1u << 30};
    uint8_t st_rec[KVEDGE_WIRE_STATS_BYTES];
    kvedge_wire_stats_pack(&st, st_rec);
    s_add(&m, st_rec, sizeof st_rec);
    s_write(dir, "rep-stat", &m);

    m = s_request(KVEDGE_OP_CREDIT, 0);
    m.h.credit = 8;
    s_write(dir, "req-credit", &m);
    m = s_request(KVEDGE_OP_CANCEL, 0);
    s_write(dir, "req-cancel", &m);

    m = s_request(KVEDGE_OP_MODEL, 0);
    s_add(&m, model_rec, sizeof model_rec);
    s_write(dir, "req-model", &m);
    m.h.flags = KVEDGE_WIRE_FLAG_REPLY;
    m.h.deadline_ms = 0;
    s_write(dir, "rep-model", &m);

    uint8_t target[8] = {0, 0, 1}, evicted[16] = {3, 0, 0, 0, 0, 0, 0, 0, 7};
    m = s_request(KVEDGE_OP_EVICT, 0);
    s_add(&m, target, sizeof target);
    s_write(dir, "req-evict", &m);
    m = s_reply(KVEDGE_OP_EVICT, 0);
    s_add(&m, evicted, sizeof evicted);
    s_write(dir, "rep-evict", &m);

    /* FETCH (edge proxy): request with times, and each stream message kind. */
    m = s_request(KVEDGE_OP_FETCH, 2);
    m.h.credit = 8;
    static uint8_t spec_rec[KVEDGE_WIRE_FETCH_SPEC_BYTES];
    kvedge_wire_fetch_spec_t spec = {.first_layer = 0, .layers = 2, .tokens = 512};
    strcpy(spec.model_id, "opt-125m");
    kvedge_wire_fetch_spec_pack(&spec, spec_rec);
    static uint8_t times[2 * KVEDGE_WIRE_FETCH_TIMES_BYTES];
    s_add(&m, spec_rec, sizeof spec_rec);
    s_add(&m, ids, 2 * KVEDGE_CHUNK_ID_BYTES);
    s_add(&m, times, sizeof times);
    s_write(dir, "req-fetch", &m);
    /* PREC: a precision frame after the times. */
    static uint8_t prec_spec[KVEDGE_WIRE_FETCH_SPEC_BYTES];
    static uint8_t prec_rec[KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + KVEDGE_WIRE_MAX_ACCEPT];
    size_t prec_len = 0;
    kvedge_wire_fetch_spec_t pspec = spec;
    pspec.flags = KVEDGE_WIRE_FETCH_FLAG_PREC;
    kvedge_wire_fetch_spec_pack(&pspec, prec_spec);
    kvedge_wire_fetch_prec_t pr = {KVEDGE_QUALITY_PPL_PCT, 3, {1, 2, 3}, 0.5};
    kvedge_wire_fetch_prec_pack(&pr, prec_rec, &prec_len);
    m = s_request(KVEDGE_OP_FETCH, 2);
    m.h.credit = 8;
    s_add(&m, prec_spec, sizeof prec_spec);
    s_add(&m, ids, 2 * KVEDGE_CHUNK_ID_BYTES);
    s_add(&m, times, sizeof times);
    s_add(&m, prec_rec, prec_len);
    s_write(dir, "req-fetch-prec", &m);
    static uint8_t plan_rec[KVEDGE_WIRE_FETCH_PLAN_BYTES], src_rec[KVEDGE_WIRE_FETCH_SOURCE_BYTES],
        pl_rec[2 * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES];
    kvedge_wire_fetch_plan_t plan = {1, 2, 1, 10, 9, 20, 50, 30};
    kvedge_wire_fetch_plan_pack(&plan, plan_rec);
    kvedge_wire_fetch_source_t src = {"cloud1", 2, true, 40000.0f, 1.25e7};
    kvedge_wire_fetch_source_pack(&src, src_rec);
    kvedge_wire_fetch_plan_layer_t pls[2] = {
        {-1, 4, 25000, false, KVEDGE_WIRE_FETCH_OWN_LAYER, 0, 0},
        {0, 1, 60000, false, KVEDGE_WIRE_FETCH_OWN_LAYER, 0, 0}};
    kvedge_wire_fetch_plan_layer_pack(&pls[0], pl_rec);
    kvedge_wire_fetch_plan_layer_pack(&pls[1], pl_rec + KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    m = s_reply(KVEDGE_OP_FETCH, 1);
    m.h.flags |= KVEDGE_WIRE_FLAG_MORE;
    s_add(&m, plan_rec, sizeof plan_rec);
    s_add(&m, src_rec, sizeof src_rec);
    s_add(&m, pl_rec, sizeof pl_rec);
    s_write(dir, "rep-fetch-plan", &m);
    static uint8_t ppl_rec[2 * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES];
    kvedge_wire_fetch_plan_layer_t ppls[2] = {
        {-1, 4, 25000, false, KVEDGE_WIRE_FETCH_OWN_LAYER, 0, 0},
        {0, 1, 30000, false, KVEDGE_WIRE_FETCH_OWN_LAYER, 3, 2}};
    kvedge_wire_fetch_plan_layer_pack(&ppls[0], ppl_rec);
    kvedge_wire_fetch_plan_layer_pack(&ppls[1], ppl_rec + KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    m = s_reply(KVEDGE_OP_FETCH, 1);
    m.h.flags |= KVEDGE_WIRE_FLAG_MORE;
    s_add(&m, plan_rec, sizeof plan_rec);
    s_add(&m, src_rec, sizeof src_rec);
    s_add(&m, ppl_rec, sizeof ppl_rec);
    s_write(dir, "rep-fetch-plan-prec", &m);
    static uint8_t fb[KVEDGE_WIRE_FETCH_BLOCK_BYTES], fl[KVEDGE_WIRE_FETCH_LAYER_BYTES];
    kvedge_wire_fetch_block_t b = {0, 1, 0, 0, 0};
    kvedge_wire_fetch_block_pack(&b, fb);
    m = s_reply(KVEDGE_OP_FETCH, 1);
    m.h.flags |= KVEDGE_WIRE_FLAG_MORE;
    s_add(&m, fb, sizeof fb);
    s_add(&m, block, sizeof block);
    s_write(dir, "rep-fetch-block", &m);
    static uint8_t fb3[3 * KVEDGE_WIRE_FETCH_BLOCK_BYTES];
    for (uint16_t i = 0; i < 3; i++) {
        kvedge_wire_fetch_block_t pb = {0, 1, 0, i, i == 2 ? KVEDGE_ECORRUPT : 0};
        kvedge_wire_fetch_block_pack(&pb, fb3 + i * KVEDGE_WIRE_FETCH_BLOCK_BYTES);
    }
    m = s_reply(KVEDGE_OP_FETCH, 3); /* packed: two blocks and a corrupt head */
    m.h.flags |= KVEDGE_WIRE_FLAG_MORE;
    s_add(&m, fb3, sizeof fb3);
    s_add(&m, block, sizeof block);
    s_add(&m, block, sizeof block);
    s_write(dir, "rep-fetch-block-pack", &m);
    kvedge_wire_fetch_layer_t l = {KVEDGE_FETCH_PLANNED,        1, 0, 0, 24, 1,
                                   KVEDGE_WIRE_FETCH_OWN_LAYER, 0};
    kvedge_wire_fetch_layer_pack(&l, fl);
    m = s_reply(KVEDGE_OP_FETCH, 1);
    m.h.flags |= KVEDGE_WIRE_FLAG_MORE;
    s_add(&m, fl, sizeof fl);
    s_write(dir, "rep-fetch-layer", &m);
    m = s_reply(KVEDGE_OP_FETCH, 26);
    m.h.flags |= KVEDGE_WIRE_FLAG_END;
    s_write(dir, "rep-fetch-end", &m);

    /* Large-small: a MAPPED request (with and without times; the mapped frame last), a plan
     * with a mapped layer and the LAYER record of a mapped layer. */
    static uint8_t mspec_rec[KVEDGE_WIRE_FETCH_SPEC_BYTES];
    static uint8_t mapped[KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES + 2 * KVEDGE_CHUNK_ID_BYTES];
    spec.flags = KVEDGE_WIRE_FETCH_FLAG_MAPPED;
    strcpy(spec.model_id, "edge-m");
    kvedge_wire_fetch_spec_pack(&spec, mspec_rec);
    kvedge_wire_fetch_mapped_pack("cloud-m", mapped);
    memcpy(mapped + KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES, ids + KVEDGE_CHUNK_ID_BYTES,
           2 * KVEDGE_CHUNK_ID_BYTES);
    m = s_request(KVEDGE_OP_FETCH, 2);
    m.h.credit = 8;
    s_add(&m, mspec_rec, sizeof mspec_rec);
    s_add(&m, ids, 2 * KVEDGE_CHUNK_ID_BYTES);
    s_add(&m, times, sizeof times);
    s_add(&m, mapped, sizeof mapped);
    s_write(dir, "req-fetch-mapped", &m);
    m = s_request(KVEDGE_OP_FETCH, 2);
    m.h.credit = 8;
    s_add(&m, mspec_rec, sizeof mspec_rec);
    s_add(&m, ids, 2 * KVEDGE_CHUNK_ID_BYTES);
    s_add(&m, mapped, sizeof mapped);
    s_write(dir, "req-fetch-mapped-notimes", &m);
    static uint8_t mpl_rec[2 * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES];
    kvedge_wire_fetch_plan_layer_t mpls[2] = {
        {0, 1, 30000, true, 3, 0, 0}, {-1, 6, 1e300, false, KVEDGE_WIRE_FETCH_OWN_LAYER, 0, 0}};
    kvedge_wire_fetch_plan_layer_pack(&mpls[0], mpl_rec);
    kvedge_wire_fetch_plan_layer_pack(&mpls[1], mpl_rec + KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    m = s_reply(KVEDGE_OP_FETCH, 1);
    m.h.flags |= KVEDGE_WIRE_FLAG_MORE;
    s_add(&m, plan_rec, sizeof plan_rec);
    s_add(&m, src_rec, sizeof src_rec);
    s_add(&m, mpl_rec, sizeof mpl_rec);
    s_write(dir, "rep-fetch-plan-mapped", &m);
    static uint8_t mfl[KVEDGE_WIRE_FETCH_LAYER_BYTES];
    kvedge_wire_fetch_layer_t ml = {KVEDGE_FETCH_PLANNED, 0, 0, 0, 12, 1, 3, 0};
    kvedge_wire_fetch_layer_pack(&ml, mfl);
    m = s_reply(KVEDGE_OP_FETCH, 1);
    m.h.flags |= KVEDGE_WIRE_FLAG_MORE;
    s_add(&m, mfl, sizeof mfl);
    s_write(dir, "rep-fetch-layer-mapped", &m);

    /* A failed request: status, no payload. */
    m = s_reply(KVEDGE_OP_GET, 0);
    m.h.status = KVEDGE_EBUSY;
    s_write(dir, "rep-get-failed", &m);
    return 0;
}
