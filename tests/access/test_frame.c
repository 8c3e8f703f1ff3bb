/* Wire codec: header and record round trips, and kvedge_wire_validate against every row of
 * docs/protocol.md's opcode table, request and reply, with each rule broken once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/frame.h"
#include "access/codec/error.h"
#include "access/codec/errwire.h"

/* One zeroed buffer one byte past the largest frame, for size boundaries. */
static uint8_t *s_big;

/* ---- messages under test ---- */

#define T_MAX_FRAMES (KVEDGE_WIRE_MAX_FRAMES + 2)

/* A message: header, payload frames (owning copies one byte longer than the frame, so a
 * frame can be grown by one byte), and each frame's valid length range. */
typedef struct {
    kvedge_wire_header_t h;
    kvedge_wire_frame_t f[T_MAX_FRAMES];
    size_t min[T_MAX_FRAMES], max[T_MAX_FRAMES];
    size_t n;
    uint8_t *own[T_MAX_FRAMES];
    size_t nown;
} t_msg_t;

enum { T_PLAIN, T_DATA_HIT, T_DATA_MISS, T_END };

typedef struct {
    const char *name;
    uint8_t op;
    bool reply;
    int variant;      /* GET_LAYER replies: which stream message */
    uint32_t count;   /* the default message's count */
    uint32_t lo, hi;  /* the valid counts */
    bool bare_err_ok; /* a failed reply (status < 0, no payload, count 0) is valid */
} t_case_t;

#define T_STREAM_MAX ((uint32_t)KVEDGE_WIRE_MAX_CHUNKS * KVEDGE_MODEL_MAX_HEADS)

static const t_case_t s_cases[] = {
    {"HELLO", KVEDGE_OP_HELLO, false, T_PLAIN, 0, 0, 0, false},
    {"PING", KVEDGE_OP_PING, false, T_PLAIN, 0, 0, 0, false},
    {"PUT", KVEDGE_OP_PUT, false, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_ITEMS, false},
    {"GET", KVEDGE_OP_GET, false, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_ITEMS, false},
    {"GET_LAYER", KVEDGE_OP_GET_LAYER, false, T_PLAIN, 2, 1, KVEDGE_WIRE_MAX_CHUNKS, false},
    {"LOOKUP", KVEDGE_OP_LOOKUP, false, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_CHUNKS, false},
    {"LIST", KVEDGE_OP_LIST, false, T_PLAIN, 0, 0, 0, false},
    {"STAT", KVEDGE_OP_STAT, false, T_PLAIN, 0, 0, 0, false},
    {"DELETE", KVEDGE_OP_DELETE, false, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_CHUNKS, false},
    {"PIN", KVEDGE_OP_PIN, false, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_CHUNKS, false},
    {"UNPIN", KVEDGE_OP_UNPIN, false, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_CHUNKS, false},
    {"CREDIT", KVEDGE_OP_CREDIT, false, T_PLAIN, 0, 0, 0, false},
    {"CANCEL", KVEDGE_OP_CANCEL, false, T_PLAIN, 0, 0, 0, false},
    {"MODEL", KVEDGE_OP_MODEL, false, T_PLAIN, 0, 0, 0, false},
    {"EVICT", KVEDGE_OP_EVICT, false, T_PLAIN, 0, 0, 0, false},
    {"MONITOR", KVEDGE_OP_MONITOR, false, T_PLAIN, 0, 0, 0, false},
    {"HELLO", KVEDGE_OP_HELLO, true, T_PLAIN, 0, 0, 0, true},
    {"PING", KVEDGE_OP_PING, true, T_PLAIN, 0, 0, 0, true},
    {"PUT", KVEDGE_OP_PUT, true, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_ITEMS, true},
    {"GET", KVEDGE_OP_GET, true, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_ITEMS, true},
    {"GET_LAYER data", KVEDGE_OP_GET_LAYER, true, T_DATA_HIT, 1, 1, 1, false},
    {"GET_LAYER miss", KVEDGE_OP_GET_LAYER, true, T_DATA_MISS, 1, 1, 1, false},
    {"GET_LAYER end", KVEDGE_OP_GET_LAYER, true, T_END, 8, 0, T_STREAM_MAX, true},
    {"LOOKUP", KVEDGE_OP_LOOKUP, true, T_PLAIN, 2, 0, KVEDGE_WIRE_MAX_CHUNKS, true},
    {"LIST", KVEDGE_OP_LIST, true, T_PLAIN, 2, 0, KVEDGE_WIRE_MAX_LIST, true},
    {"STAT", KVEDGE_OP_STAT, true, T_PLAIN, 0, 0, 0, true},
    {"DELETE", KVEDGE_OP_DELETE, true, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_CHUNKS, true},
    {"PIN", KVEDGE_OP_PIN, true, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_CHUNKS, true},
    {"UNPIN", KVEDGE_OP_UNPIN, true, T_PLAIN, 3, 1, KVEDGE_WIRE_MAX_CHUNKS, true},
    {"MODEL", KVEDGE_OP_MODEL, true, T_PLAIN, 0, 0, 0, true},
    {"EVICT", KVEDGE_OP_EVICT, true, T_PLAIN, 0, 0, 0, true},
};
#define T_NCASES (sizeof s_cases / sizeof s_cases[0])

/* Fails naming the case and the check, so a table-driven failure says which row broke. */
#define T_EXPECT(c, what, got, want)                                                               \
    do {                                                                                           \
        int got_ = (got), want_ = (want);                                                          \
        if (got_ != want_) {                                                                       \
            print_error("%s %s: %s: got %d, want %d\n", (c)->name,                                 \
                        (c)->reply ? "reply" : "request", (what), got_, want_);                    \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

static void t_add(t_msg_t *m, const void *data, size_t len, size_t min, size_t max)
{
    assert_true(m->n < T_MAX_FRAMES);
    uint8_t *buf = calloc(1, len + 1);
    assert_non_null(buf);
    if (data && len)
        memcpy(buf, data, len);
    m->own[m->nown++] = buf;
    m->f[m->n] = (kvedge_wire_frame_t){buf, len};
    m->min[m->n] = min;
    m->max[m->n] = max;
    m->n++;
}

static void t_add_fixed(t_msg_t *m, const void *data, size_t len)
{
    t_add(m, data, len, len, len);
}

static void t_add_block(t_msg_t *m)
{
    static const uint8_t block[10] = "KVEB-block";
    t_add(m, block, sizeof block, 1, KVEDGE_WIRE_MAX_FRAME_BYTES);
}

static void t_free(t_msg_t *m)
{
    for (size_t i = 0; i < m->nown; i++)
        free(m->own[i]);
    free(m);
}

static void t_fill_chunk(kvedge_chunk_info_t *c, uint32_t i)
{
    memset(c, 0, sizeof *c);
    for (int b = 0; b < KVEDGE_CHUNK_ID_BYTES; b++) {
        c->id.bytes[b] = (uint8_t)(i * 7 + b + 1);
        c->parent.bytes[b] = i ? (uint8_t)(i * 7 + b - 6) : 0;
    }
    c->has_parent = i > 0;
    snprintf(c->model_id, sizeof c->model_id, "opt-1.3b");
    c->index = i;
    c->tokens = 256;
}

/* The valid message of a case, with count items where the opcode has any. */
static t_msg_t *t_build(const t_case_t *c, uint32_t count)
{
    t_msg_t *m = calloc(1, sizeof *m);
    assert_non_null(m);
    bool credit = !c->reply && (c->op == KVEDGE_OP_GET_LAYER || c->op == KVEDGE_OP_CREDIT);
    m->h = (kvedge_wire_header_t){.version = KVEDGE_WIRE_VERSION,
                                  .opcode = c->op,
                                  .flags = c->reply ? KVEDGE_WIRE_FLAG_REPLY : 0,
                                  .request_id = 0x0102030405060708ull + c->op,
                                  .count = count,
                                  .credit = credit ? 8 : 0,
                                  .deadline_ms = c->reply ? 0 : 5000};
    uint8_t *arr = calloc((size_t)count + 1, 4 + KVEDGE_WIRE_CHUNK_ENTRY_BYTES);
    assert_non_null(arr);
    uint8_t rec[KVEDGE_WIRE_PUT_ITEM_BYTES];
    kvedge_model_t model = {"opt-1.3b", 24, 32, 64, KVEDGE_DTYPE_FP16};
    if (!c->reply) {
        switch (c->op) {
        case KVEDGE_OP_HELLO:
            t_add(m, "client", 6, 1, KVEDGE_WIRE_MAX_NAME_BYTES);
            break;
        case KVEDGE_OP_PING:
            t_add(m, "0123456789", 10, 0, KVEDGE_WIRE_MAX_PING_BYTES);
            break;
        case KVEDGE_OP_PUT:
            for (uint32_t i = 0; i < count; i++) {
                kvedge_wire_put_item_t item = {.layer = 1, .head = (uint16_t)i, .ttl_s = 60};
                t_fill_chunk(&item.chunk, i);
                assert_int_equal(kvedge_wire_put_item_pack(&item, rec), 0);
                t_add_fixed(m, rec, sizeof rec);
                t_add_block(m);
            }
            break;
        case KVEDGE_OP_GET:
            for (uint32_t i = 0; i < count; i++) {
                kvedge_block_key_t key = {.layer = 2, .head = (uint16_t)i};
                key.chunk.bytes[0] = (uint8_t)i;
                kvedge_wire_key_pack(&key, arr + (size_t)i * KVEDGE_WIRE_KEY_BYTES);
            }
            t_add_fixed(m, arr, (size_t)count * KVEDGE_WIRE_KEY_BYTES);
            break;
        case KVEDGE_OP_GET_LAYER:
            arr[0] = 3; /* layer 3, reserved 0, then zero chunk ids will do */
            t_add_fixed(m, arr, 4 + (size_t)count * KVEDGE_CHUNK_ID_BYTES);
            break;
        case KVEDGE_OP_LOOKUP:
        case KVEDGE_OP_DELETE:
        case KVEDGE_OP_PIN:
        case KVEDGE_OP_UNPIN:
            memset(arr, 0xA5, (size_t)count * KVEDGE_CHUNK_ID_BYTES);
            t_add_fixed(m, arr, (size_t)count * KVEDGE_CHUNK_ID_BYTES);
            break;
        case KVEDGE_OP_LIST:
            memset(arr, 0x5A, KVEDGE_CHUNK_ID_BYTES);
            t_add_fixed(m, arr, KVEDGE_CHUNK_ID_BYTES);
            kvedge_le_put32(arr, 100);
            t_add_fixed(m, arr, 4);
            break;
        case KVEDGE_OP_MODEL:
            assert_int_equal(kvedge_wire_model_pack(&model, rec), 0);
            t_add_fixed(m, rec, KVEDGE_WIRE_MODEL_BYTES);
            break;
        case KVEDGE_OP_EVICT:
            memset(rec, 0, 8);
            rec[2] = 1; /* 64 KiB */
            t_add_fixed(m, rec, 8);
            break;
        case KVEDGE_OP_MONITOR:
            memset(rec, 0, 4);
            rec[0] = 10; /* top 10 */
            t_add_fixed(m, rec, 4);
            break;
        default: /* STAT, CREDIT, CANCEL: no payload */
            break;
        }
        free(arr);
        return m;
    }
    switch (c->op) {
    case KVEDGE_OP_HELLO: {
        kvedge_wire_node_info_t info = {KVEDGE_ROLE_EDGE, {1, 2, 3}, 1u << 20, 64, 256, 16, 8};
        kvedge_wire_node_info_pack(&info, rec);
        t_add_fixed(m, rec, KVEDGE_WIRE_NODE_INFO_BYTES);
        t_add(m, "node-a", 6, 1, KVEDGE_WIRE_MAX_NAME_BYTES);
        break;
    }
    case KVEDGE_OP_PING:
        t_add(m, "0123456789", 10, 0, KVEDGE_WIRE_MAX_PING_BYTES);
        break;
    case KVEDGE_OP_PUT:
        for (uint32_t i = 0; i < count; i++)
            kvedge_le_put32(arr + 4 * i, (uint32_t)kvedge_err_to_wire(i % 2 ? KVEDGE_ESHAPE : 0));
        t_add_fixed(m, arr, 4 * (size_t)count);
        break;
    case KVEDGE_OP_GET:
        for (uint32_t i = 0; i < count; i++)
            kvedge_le_put32(arr + 4 * i,
                            (uint32_t)kvedge_err_to_wire(i % 3 == 1 ? KVEDGE_ENOTFOUND : 0));
        t_add_fixed(m, arr, 4 * (size_t)count);
        for (uint32_t i = 0; i < count; i++)
            if (i % 3 != 1)
                t_add_block(m);
        break;
    case KVEDGE_OP_GET_LAYER:
        m->h.flags |= c->variant == T_END ? KVEDGE_WIRE_FLAG_END : KVEDGE_WIRE_FLAG_MORE;
        if (c->variant != T_END) {
            kvedge_wire_stream_hdr_t s = {1, 2, c->variant == T_DATA_HIT ? 0 : KVEDGE_ENOTFOUND};
            kvedge_wire_stream_hdr_pack(&s, rec);
            t_add_fixed(m, rec, KVEDGE_WIRE_STREAM_HDR_BYTES);
            if (c->variant == T_DATA_HIT)
                t_add_block(m);
        }
        break;
    case KVEDGE_OP_LOOKUP:
    case KVEDGE_OP_DELETE:
    case KVEDGE_OP_PIN:
    case KVEDGE_OP_UNPIN:
        for (uint32_t i = 0; i < count; i++)
            kvedge_le_put32(arr + 4 * i, 10 + i);
        t_add_fixed(m, arr, 4 * (size_t)count);
        break;
    case KVEDGE_OP_LIST:
        for (uint32_t i = 0; i < count; i++) {
            kvedge_wire_chunk_entry_t e = {.blocks = 3, .bytes = 3000, .fp16_bytes = 6000};
            t_fill_chunk(&e.chunk, i);
            assert_int_equal(
                kvedge_wire_chunk_entry_pack(&e, arr + (size_t)i * KVEDGE_WIRE_CHUNK_ENTRY_BYTES),
                0);
        }
        t_add_fixed(m, arr, (size_t)count * KVEDGE_WIRE_CHUNK_ENTRY_BYTES);
        break;
    case KVEDGE_OP_STAT: {
        kvedge_engine_stats_t st = {.blocks = 5, .bytes = 500};
        kvedge_wire_stats_pack(&st, rec);
        t_add_fixed(m, rec, KVEDGE_WIRE_STATS_BYTES);
        break;
    }
    case KVEDGE_OP_MODEL:
        assert_int_equal(kvedge_wire_model_pack(&model, rec), 0);
        t_add_fixed(m, rec, KVEDGE_WIRE_MODEL_BYTES);
        break;
    case KVEDGE_OP_EVICT:
        memset(rec, 0, 16);
        rec[0] = 3;
        rec[8] = 7;
        t_add_fixed(m, rec, 16);
        break;
    default:
        fail();
    }
    free(arr);
    return m;
}

static int t_validate(const t_msg_t *m)
{
    return kvedge_wire_validate(&m->h, m->n ? m->f : NULL, m->n);
}

/* ---- header ---- */

/* Field by field: the struct has padding. */
static void t_header_equal(const kvedge_wire_header_t *a, const kvedge_wire_header_t *b)
{
    assert_int_equal(a->version, b->version);
    assert_int_equal(a->opcode, b->opcode);
    assert_int_equal(a->flags, b->flags);
    assert_int_equal(a->request_id, b->request_id);
    assert_int_equal(a->status, b->status);
    assert_int_equal(a->count, b->count);
    assert_int_equal(a->credit, b->credit);
    assert_int_equal(a->deadline_ms, b->deadline_ms);
}

/* FETCH: the spec record, the optional times frame, the three stream message kinds and
 * their records; every reserved byte and range. */
static void test_fetch_messages(void **state)
{
    (void)state;
    kvedge_wire_fetch_spec_t spec = {.first_layer = 2, .layers = 10, .tokens = 512};
    strcpy(spec.model_id, "opt-125m");
    uint8_t sb[KVEDGE_WIRE_FETCH_SPEC_BYTES];
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, sb), 0);
    kvedge_wire_fetch_spec_t back;
    assert_int_equal(kvedge_wire_fetch_spec_parse(sb, sizeof sb, &back), 0);
    assert_string_equal(back.model_id, "opt-125m");
    assert_int_equal(back.first_layer, 2);
    assert_int_equal(back.layers, 10);
    assert_int_equal(back.tokens, 512);
    assert_int_equal(kvedge_wire_fetch_spec_parse(sb, sizeof sb - 1, &back), KVEDGE_EPROTO);
    uint8_t bad[KVEDGE_WIRE_FETCH_SPEC_BYTES];
    memcpy(bad, sb, sizeof bad);
    bad[133] = 1; /* flags: an unknown bit */
    assert_int_equal(kvedge_wire_fetch_spec_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
    memcpy(bad, sb, sizeof bad);
    bad[126] = 0, bad[127] = 0; /* zero layers */
    assert_int_equal(kvedge_wire_fetch_spec_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
    spec.layers = KVEDGE_WIRE_FETCH_MAX_LAYERS + 1;
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, sb), KVEDGE_EINVAL);
    spec.layers = 10;
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, sb), 0);

    /* The request: spec, N chunk ids, optional per-layer times; credit 1 ... 1024. */
    uint8_t ids[2 * KVEDGE_CHUNK_ID_BYTES] = {0}, times[10 * 8] = {0};
    kvedge_wire_frame_t f[3] = {{sb, sizeof sb}, {ids, sizeof ids}, {times, sizeof times}};
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION, KVEDGE_OP_FETCH, 0, 7, 0, 2, 8, 1000};
    assert_int_equal(kvedge_wire_validate(&h, f, 2), 0);
    assert_int_equal(kvedge_wire_validate(&h, f, 3), 0);
    f[2].len = 8;
    assert_int_equal(kvedge_wire_validate(&h, f, 3), KVEDGE_EPROTO);
    f[2].len = sizeof times;
    h.credit = 0;
    assert_int_equal(kvedge_wire_validate(&h, f, 2), KVEDGE_EPROTO);
    h.credit = 8;
    h.count = 3;
    assert_int_equal(kvedge_wire_validate(&h, f, 2), KVEDGE_EPROTO);

    /* Stream messages. */
    kvedge_wire_fetch_block_t b = {3, 7, 1, 11, 0}, bb;
    uint8_t rb[KVEDGE_WIRE_FETCH_BLOCK_BYTES], blk[4] = {1, 2, 3, 4};
    kvedge_wire_fetch_block_pack(&b, rb);
    assert_int_equal(kvedge_wire_fetch_block_parse(rb, sizeof rb, &bb), 0);
    assert_true(bb.source == 3 && bb.layer == 7 && bb.chunk_index == 1 && bb.head == 11 &&
                bb.status == 0);
    kvedge_wire_header_t r = {KVEDGE_WIRE_VERSION,
                              KVEDGE_OP_FETCH,
                              KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE,
                              7,
                              0,
                              1,
                              0,
                              0};
    kvedge_wire_frame_t m[3] = {{rb, sizeof rb}, {blk, sizeof blk}};
    assert_int_equal(kvedge_wire_validate(&r, m, 2), 0);
    assert_int_equal(kvedge_wire_validate(&r, m, 1), KVEDGE_EPROTO); /* status 0 needs a block */
    b.status = KVEDGE_ENOTFOUND;
    kvedge_wire_fetch_block_pack(&b, rb);
    assert_int_equal(kvedge_wire_validate(&r, m, 1), 0);
    b.status = KVEDGE_EIO; /* not a per-head status */
    kvedge_wire_fetch_block_pack(&b, rb);
    assert_int_equal(kvedge_wire_validate(&r, m, 1), KVEDGE_EPROTO);

    kvedge_wire_fetch_layer_t l = {KVEDGE_FETCH_FALLBACK_FAILED, 7, 1, 0, 24, 2,
                                   KVEDGE_WIRE_FETCH_OWN_LAYER,  0},
                              lb;
    uint8_t rl[KVEDGE_WIRE_FETCH_LAYER_BYTES];
    kvedge_wire_fetch_layer_pack(&l, rl);
    assert_int_equal(kvedge_wire_fetch_layer_parse(rl, sizeof rl, &lb), 0);
    assert_true(lb.reason == KVEDGE_FETCH_FALLBACK_FAILED && lb.layer == 7 && lb.source == 1 &&
                lb.status == 0 && lb.heads == 24 && lb.attempts == 2 &&
                lb.from_layer == KVEDGE_WIRE_FETCH_OWN_LAYER);
    m[0] = (kvedge_wire_frame_t){rl, sizeof rl};
    assert_int_equal(kvedge_wire_validate(&r, m, 1), 0);
    l.source = -1; /* delivered without a source */
    kvedge_wire_fetch_layer_pack(&l, rl);
    assert_int_equal(kvedge_wire_validate(&r, m, 1), KVEDGE_EPROTO);
    l.status = KVEDGE_ENOTFOUND; /* a miss: fine without one */
    l.heads = 0;
    l.reason = KVEDGE_FETCH_MISS;
    kvedge_wire_fetch_layer_pack(&l, rl);
    assert_int_equal(kvedge_wire_validate(&r, m, 1), 0);
    l.reason = 99;
    kvedge_wire_fetch_layer_pack(&l, rl);
    assert_int_equal(kvedge_wire_validate(&r, m, 1), KVEDGE_EPROTO);
    assert_string_equal(kvedge_fetch_reason_name(KVEDGE_FETCH_MISS_DEADLINE), "miss:deadline");
    assert_string_equal(kvedge_fetch_reason_name(0), "?");

    kvedge_wire_fetch_plan_t p = {2, 10, 4, 1.5, 1.0, 3.0, 9.0, 4.0}, pb;
    uint8_t rp[KVEDGE_WIRE_FETCH_PLAN_BYTES], srcs[2 * KVEDGE_WIRE_FETCH_SOURCE_BYTES],
        pls[10 * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES];
    kvedge_wire_fetch_plan_pack(&p, rp);
    assert_int_equal(kvedge_wire_fetch_plan_parse(rp, sizeof rp, &pb), 0);
    assert_true(pb.sources == 2 && pb.layers == 10 && pb.split == 4 && pb.total_us == 1.5 &&
                pb.bound_us == 1.0 && pb.cloud_only_us == 3.0 && pb.recompute_all_us == 9.0 &&
                pb.load_then_compute_us == 4.0);
    kvedge_wire_fetch_source_t so = {"cloud1", 2, true, 40000.0f, 1.25e7}, sob;
    kvedge_wire_fetch_source_pack(&so, srcs);
    kvedge_wire_fetch_source_pack(&so, srcs + KVEDGE_WIRE_FETCH_SOURCE_BYTES);
    assert_int_equal(kvedge_wire_fetch_source_parse(srcs, KVEDGE_WIRE_FETCH_SOURCE_BYTES, &sob), 0);
    assert_string_equal(sob.name, "cloud1");
    assert_true(sob.up && sob.kind == 2 && sob.bw_bytes_per_s == 1.25e7);
    for (int i = 0; i < 10; i++) {
        kvedge_wire_fetch_plan_layer_t pl = {
            (int16_t)(i % 2), 1, 100.0 * i, false, KVEDGE_WIRE_FETCH_OWN_LAYER, 0, 0};
        kvedge_wire_fetch_plan_layer_pack(&pl, pls + i * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    }
    m[0] = (kvedge_wire_frame_t){rp, sizeof rp};
    m[1] = (kvedge_wire_frame_t){srcs, sizeof srcs};
    m[2] = (kvedge_wire_frame_t){pls, sizeof pls};
    assert_int_equal(kvedge_wire_validate(&r, m, 3), 0);
    m[2].len -= KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES; /* fewer layers than it says */
    assert_int_equal(kvedge_wire_validate(&r, m, 3), KVEDGE_EPROTO);
    p.split = 11; /* past the layers */
    kvedge_wire_fetch_plan_pack(&p, rp);
    assert_int_equal(kvedge_wire_fetch_plan_parse(rp, sizeof rp, &pb), KVEDGE_EPROTO);
    p.split = 4;
    p.total_us = -1;
    kvedge_wire_fetch_plan_pack(&p, rp);
    assert_int_equal(kvedge_wire_fetch_plan_parse(rp, sizeof rp, &pb), KVEDGE_EPROTO);
    uint8_t unknown_kind[4] = {9, 0, 0, 0};
    m[0] = (kvedge_wire_frame_t){unknown_kind, sizeof unknown_kind};
    assert_int_equal(kvedge_wire_validate(&r, m, 1), KVEDGE_EPROTO);
    /* END: no payload; neither MORE nor END: refused. */
    r.flags = KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END;
    r.count = 25;
    assert_int_equal(kvedge_wire_validate(&r, m, 0), 0);
    r.flags = KVEDGE_WIRE_FLAG_REPLY;
    assert_int_equal(kvedge_wire_validate(&r, m, 0), KVEDGE_EPROTO);
}

/* Large-small: the spec's flags (MAPPED, unknown bits), the mapped frame, the plan layer
 * record's mapped/from_layer and the LAYER record's from_layer, round trips and refusals. */
static void test_fetch_mapped(void **state)
{
    (void)state;
    kvedge_wire_fetch_spec_t spec = {
        .first_layer = 0, .layers = 3, .tokens = 512, .flags = KVEDGE_WIRE_FETCH_FLAG_MAPPED};
    strcpy(spec.model_id, "edge-m");
    uint8_t sb[KVEDGE_WIRE_FETCH_SPEC_BYTES], back_sb[KVEDGE_WIRE_FETCH_SPEC_BYTES];
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, sb), 0);
    assert_int_equal(kvedge_le_get32(sb + 132), KVEDGE_WIRE_FETCH_FLAG_MAPPED);
    kvedge_wire_fetch_spec_t back;
    assert_int_equal(kvedge_wire_fetch_spec_parse(sb, sizeof sb, &back), 0);
    assert_int_equal(back.flags, KVEDGE_WIRE_FETCH_FLAG_MAPPED);
    assert_int_equal(kvedge_wire_fetch_spec_pack(&back, back_sb), 0);
    assert_memory_equal(sb, back_sb, sizeof sb);
    spec.flags = 0x8; /* unknown: refused both ways */
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, back_sb), KVEDGE_EINVAL);
    for (int bit = 3; bit < 32; bit++) {
        uint8_t bad[KVEDGE_WIRE_FETCH_SPEC_BYTES];
        memcpy(bad, sb, sizeof bad);
        kvedge_le_put32(bad + 132, KVEDGE_WIRE_FETCH_FLAG_MAPPED | (1u << bit));
        assert_int_equal(kvedge_wire_fetch_spec_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
    }

    /* The mapped frame: id | reserved | N ids. */
    enum { N = 2 };
    uint8_t mf[KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES + N * KVEDGE_CHUNK_ID_BYTES];
    assert_int_equal(kvedge_wire_fetch_mapped_pack("cloud-m", mf), 0);
    for (size_t i = 0; i < N * KVEDGE_CHUNK_ID_BYTES; i++)
        mf[KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES + i] = (uint8_t)(i * 7 + 1);
    char mid[KVEDGE_WIRE_MODEL_ID_BYTES];
    const uint8_t *mids = NULL;
    assert_int_equal(kvedge_wire_fetch_mapped_parse(mf, sizeof mf, N, mid, &mids), 0);
    assert_string_equal(mid, "cloud-m");
    assert_ptr_equal(mids, mf + KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES);
    assert_int_equal(kvedge_wire_fetch_mapped_parse(mf, sizeof mf - 1, N, mid, &mids),
                     KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_fetch_mapped_parse(mf, sizeof mf, N + 1, mid, &mids),
                     KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_fetch_mapped_parse(mf, sizeof mf, 0, mid, &mids), KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_fetch_mapped_pack("", mf), KVEDGE_EINVAL);
    char longid[KVEDGE_WIRE_MODEL_ID_BYTES + 1];
    memset(longid, 'a', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    assert_int_equal(kvedge_wire_fetch_mapped_pack(longid, mf), KVEDGE_EINVAL);
    assert_int_equal(kvedge_wire_fetch_mapped_pack("cloud-m", mf), 0);
    uint8_t badm[sizeof mf];
    memcpy(badm, mf, sizeof badm);
    badm[KVEDGE_WIRE_MODEL_ID_BYTES + 2] = 1; /* reserved */
    assert_int_equal(kvedge_wire_fetch_mapped_parse(badm, sizeof badm, N, mid, &mids),
                     KVEDGE_EPROTO);
    memcpy(badm, mf, sizeof badm);
    badm[100] = 'x'; /* garbage in the padding */
    assert_int_equal(kvedge_wire_fetch_mapped_parse(badm, sizeof badm, N, mid, &mids),
                     KVEDGE_EPROTO);
    memset(badm, 0, KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES); /* empty id */
    assert_int_equal(kvedge_wire_fetch_mapped_parse(badm, sizeof badm, N, mid, &mids),
                     KVEDGE_EPROTO);

    /* Whole requests: f1 f2 fm, f1 f2 f3 fm; the mapped frame is required with MAPPED and
     * refused without it. */
    uint8_t ids[N * KVEDGE_CHUNK_ID_BYTES] = {0}, times[3 * 8] = {0};
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION, KVEDGE_OP_FETCH, 0, 9, 0, N, 8, 1000};
    kvedge_wire_frame_t f[4] = {{sb, sizeof sb}, {ids, sizeof ids}, {mf, sizeof mf}};
    assert_int_equal(kvedge_wire_validate(&h, f, 3), 0);
    f[2] = (kvedge_wire_frame_t){times, sizeof times};
    f[3] = (kvedge_wire_frame_t){mf, sizeof mf};
    assert_int_equal(kvedge_wire_validate(&h, f, 4), 0);
    assert_int_equal(kvedge_wire_validate(&h, f, 2), KVEDGE_EPROTO); /* MAPPED, no frame */
    assert_int_equal(kvedge_wire_validate(&h, f, 3), KVEDGE_EPROTO); /* times as the last */
    f[3].len -= 1;                                                   /* wrong size */
    assert_int_equal(kvedge_wire_validate(&h, f, 4), KVEDGE_EPROTO);
    f[3].len += 1;
    f[2].len = 8; /* times of the wrong size before it */
    assert_int_equal(kvedge_wire_validate(&h, f, 4), KVEDGE_EPROTO);
    f[2].len = sizeof times;
    kvedge_wire_frame_t f5[5] = {f[0], f[1], f[2], f[2], f[3]};
    assert_int_equal(kvedge_wire_validate(&h, f5, 5), KVEDGE_EPROTO); /* too many frames */
    h.count = N + 1; /* the mapped chain must have the same N */
    uint8_t ids3[(N + 1) * KVEDGE_CHUNK_ID_BYTES] = {0};
    f[1] = (kvedge_wire_frame_t){ids3, sizeof ids3};
    assert_int_equal(kvedge_wire_validate(&h, f, 4), KVEDGE_EPROTO);
    h.count = N;
    f[1] = (kvedge_wire_frame_t){ids, sizeof ids};
    assert_int_equal(kvedge_wire_fetch_mapped_pack("edge-m", mf), 0); /* the model itself */
    assert_int_equal(kvedge_wire_validate(&h, f, 4), KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_fetch_mapped_pack("cloud-m", mf), 0);
    spec.flags = 0; /* without MAPPED, a mapped frame is one frame too many */
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, sb), 0);
    kvedge_wire_frame_t g[3] = {{sb, sizeof sb}, {ids, sizeof ids}, {mf, sizeof mf}};
    assert_int_equal(kvedge_wire_validate(&h, g, 3), KVEDGE_EPROTO);

    /* Plan layer record: source i16 | reason u8 | mapped u8 | from u16 | reserved u16 | f64. */
    uint8_t rec[KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES];
    kvedge_wire_fetch_plan_layer_t pl = {1, 1, 250.0, true, 3, 0, 0}, plb;
    kvedge_wire_fetch_plan_layer_pack(&pl, rec);
    assert_int_equal(rec[3], 1);
    assert_int_equal(kvedge_le_get16(rec + 4), 3);
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(rec, sizeof rec, &plb), 0);
    assert_true(plb.source == 1 && plb.reason == 1 && plb.cost_us == 250.0 && plb.mapped &&
                plb.from_layer == 3);
    pl.mapped = false; /* own: from is always written 0xFFFF */
    kvedge_wire_fetch_plan_layer_pack(&pl, rec);
    assert_int_equal(kvedge_le_get16(rec + 4), KVEDGE_WIRE_FETCH_OWN_LAYER);
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(rec, sizeof rec, &plb), 0);
    assert_true(!plb.mapped && plb.from_layer == KVEDGE_WIRE_FETCH_OWN_LAYER);
    uint8_t badr[sizeof rec];
    memcpy(badr, rec, sizeof rec);
    kvedge_le_put16(badr + 4, 2); /* own, but names a layer */
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(badr, sizeof badr, &plb), KVEDGE_EPROTO);
    memcpy(badr, rec, sizeof rec);
    badr[3] = 2; /* mapped not 0/1 */
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(badr, sizeof badr, &plb), KVEDGE_EPROTO);
    memcpy(badr, rec, sizeof rec);
    badr[7] = 1; /* a precision reason without a precision */
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(badr, sizeof badr, &plb), KVEDGE_EPROTO);
    memcpy(badr, rec, sizeof rec);
    badr[3] = 1; /* mapped without a layer */
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(badr, sizeof badr, &plb), KVEDGE_EPROTO);
    pl = (kvedge_wire_fetch_plan_layer_t){-1, 5, 10.0, true, 2, 0, 0}; /* mapped recompute */
    kvedge_wire_fetch_plan_layer_pack(&pl, rec);
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(rec, sizeof rec, &plb), KVEDGE_EPROTO);

    /* LAYER record: from_layer where reserved u16 was. */
    kvedge_wire_fetch_layer_t l = {KVEDGE_FETCH_PLANNED, 2, 0, 0, 12, 1, 3, 0}, lb;
    uint8_t rl[KVEDGE_WIRE_FETCH_LAYER_BYTES];
    kvedge_wire_fetch_layer_pack(&l, rl);
    assert_int_equal(kvedge_le_get16(rl + 6), 3);
    assert_int_equal(kvedge_wire_fetch_layer_parse(rl, sizeof rl, &lb), 0);
    assert_int_equal(lb.from_layer, 3);
    l.from_layer = KVEDGE_WIRE_FETCH_OWN_LAYER;
    kvedge_wire_fetch_layer_pack(&l, rl);
    assert_int_equal(kvedge_wire_fetch_layer_parse(rl, sizeof rl, &lb), 0);
    assert_int_equal(lb.from_layer, KVEDGE_WIRE_FETCH_OWN_LAYER);
    l = (kvedge_wire_fetch_layer_t){KVEDGE_FETCH_MISS, 1, -1, KVEDGE_ENOTFOUND, 0, 0, 3, 0};
    kvedge_wire_fetch_layer_pack(&l, rl); /* a miss delivered nothing: no from layer */
    assert_int_equal(kvedge_wire_fetch_layer_parse(rl, sizeof rl, &lb), KVEDGE_EPROTO);
    l.from_layer = KVEDGE_WIRE_FETCH_OWN_LAYER;
    kvedge_wire_fetch_layer_pack(&l, rl);
    assert_int_equal(kvedge_wire_fetch_layer_parse(rl, sizeof rl, &lb), 0);
}

/* The precision frame of a FETCH (PREC), GET/GET_LAYER accept lists, and the precision
 * fields of the PLAN layer and LAYER records. */
static void test_fetch_prec(void **state)
{
    (void)state;
    const kvedge_prec_t int8 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 0),
                        int4 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, 0),
                        think = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50);
    kvedge_wire_fetch_prec_t pr = {KVEDGE_QUALITY_PPL_PCT, 3, {int8, int4, think}, 0.5}, pb;
    uint8_t pf[KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + KVEDGE_WIRE_MAX_ACCEPT + 1];
    size_t plen = 0;
    assert_int_equal(kvedge_wire_fetch_prec_pack(&pr, pf, &plen), 0);
    assert_int_equal(plen, KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + 3);
    assert_int_equal(pf[0], KVEDGE_QUALITY_PPL_PCT);
    assert_int_equal(pf[1], 3);
    assert_int_equal(pf[16], int8);
    assert_int_equal(pf[18], think);
    assert_int_equal(kvedge_wire_fetch_prec_parse(pf, plen, &pb), 0);
    assert_true(pb.metric == pr.metric && pb.n == 3 && pb.budget == 0.5 &&
                memcmp(pb.accept, pr.accept, 3) == 0);
    assert_int_equal(kvedge_wire_fetch_prec_check(&pb), 0);
    /* Structure: the length must be 16 + K, K <= 8, reserved bytes 0. */
    assert_int_equal(kvedge_wire_fetch_prec_parse(pf, plen - 1, &pb), KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_fetch_prec_parse(pf, plen + 1, &pb), KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_fetch_prec_parse(pf, 15, &pb), KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_fetch_prec_parse(NULL, plen, &pb), KVEDGE_EPROTO);
    for (int i = 2; i < 8; i++) {
        uint8_t bad[sizeof pf];
        memcpy(bad, pf, plen);
        bad[i] = 1;
        assert_int_equal(kvedge_wire_fetch_prec_parse(bad, plen, &pb), KVEDGE_EPROTO);
    }
    uint8_t nine[KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + 9] = {0};
    nine[1] = 9;
    assert_int_equal(kvedge_wire_fetch_prec_parse(nine, sizeof nine, &pb), KVEDGE_EPROTO);
    pr.n = 9;
    assert_int_equal(kvedge_wire_fetch_prec_pack(&pr, pf, &plen), KVEDGE_EINVAL);
    pr.n = 3;
    /* Meaning (the proxy answers KVEDGE_EINVAL): the list, the metric, the budget. */
    kvedge_wire_fetch_prec_t c = pr;
    c.n = 0; /* empty */
    assert_int_equal(kvedge_wire_fetch_prec_check(&c), KVEDGE_EINVAL);
    c = pr;
    c.accept[1] = int8; /* contradictory: a rung twice */
    assert_int_equal(kvedge_wire_fetch_prec_check(&c), KVEDGE_EINVAL);
    c = pr;
    c.accept[2] = 0x7F; /* unknown */
    assert_int_equal(kvedge_wire_fetch_prec_check(&c), KVEDGE_EINVAL);
    c = pr;
    c.accept[0] = KVEDGE_PREC_STORED; /* not a rung */
    assert_int_equal(kvedge_wire_fetch_prec_check(&c), KVEDGE_EINVAL);
    c = pr;
    c.metric = (kvedge_quality_metric_t)3;
    assert_int_equal(kvedge_wire_fetch_prec_check(&c), KVEDGE_EINVAL);
    double bad_budgets[] = {-0.1, 100.5, INFINITY, NAN};
    for (size_t i = 0; i < sizeof bad_budgets / sizeof *bad_budgets; i++) {
        c = pr;
        c.budget = bad_budgets[i];
        assert_int_equal(kvedge_wire_fetch_prec_check(&c), KVEDGE_EINVAL);
    }
    c = pr;
    c.metric = KVEDGE_QUALITY_KL;
    c.budget = 10.5; /* KL's bound is 10 nats */
    assert_int_equal(kvedge_wire_fetch_prec_check(&c), KVEDGE_EINVAL);
    c.budget = 10;
    assert_int_equal(kvedge_wire_fetch_prec_check(&c), 0);
    c.metric = KVEDGE_QUALITY_NONE; /* no budget: 0 only */
    assert_int_equal(kvedge_wire_fetch_prec_check(&c), KVEDGE_EINVAL);
    c.budget = 0;
    assert_int_equal(kvedge_wire_fetch_prec_check(&c), 0);
    /* Budgets as text (the CLI's --budget). */
    kvedge_quality_metric_t qm = KVEDGE_QUALITY_NONE;
    double qb = -1;
    assert_int_equal(kvedge_quality_budget_parse("ppl:0.5", &qm, &qb), 0);
    assert_true(qm == KVEDGE_QUALITY_PPL_PCT && qb == 0.5);
    assert_int_equal(kvedge_quality_budget_parse("ppl:3%", &qm, &qb), 0);
    assert_true(qm == KVEDGE_QUALITY_PPL_PCT && qb == 3);
    assert_int_equal(kvedge_quality_budget_parse("kl:1e-4", &qm, &qb), 0);
    assert_true(qm == KVEDGE_QUALITY_KL && qb == 1e-4);
    const char *bad_text[] = {"",        "ppl",     "ppl:",   "ppl:-1",   "ppl:101",
                              "kl:11",   "kl:nan",  "kl:inf", "ppl:0.5x", "kl:1%",
                              "PPL:0.5", "mse:0.1", "ppl: 1", "ppl:+1",   "ppl:0.5%%"};
    for (size_t i = 0; i < sizeof bad_text / sizeof *bad_text; i++) {
        qm = KVEDGE_QUALITY_NONE;
        qb = -1;
        assert_int_equal(kvedge_quality_budget_parse(bad_text[i], &qm, &qb), KVEDGE_EINVAL);
        assert_true(qm == KVEDGE_QUALITY_NONE && qb == -1); /* untouched */
    }
    assert_int_equal(kvedge_quality_budget_parse(NULL, &qm, &qb), KVEDGE_EINVAL);
    assert_string_equal(kvedge_quality_metric_name(KVEDGE_QUALITY_KL), "kl");
    assert_string_equal(kvedge_quality_metric_name((kvedge_quality_metric_t)9), "?");

    /* Whole requests: f1 f2 [times] prec [mapped]. */
    enum { N = 2 };
    kvedge_wire_fetch_spec_t spec = {
        .first_layer = 0, .layers = 3, .tokens = 512, .flags = KVEDGE_WIRE_FETCH_FLAG_PREC};
    strcpy(spec.model_id, "edge-m");
    uint8_t sb[KVEDGE_WIRE_FETCH_SPEC_BYTES];
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, sb), 0);
    assert_int_equal(kvedge_wire_fetch_prec_pack(&pr, pf, &plen), 0);
    uint8_t ids[N * KVEDGE_CHUNK_ID_BYTES] = {0}, times[3 * 8] = {0};
    uint8_t mf[KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES + N * KVEDGE_CHUNK_ID_BYTES] = {0};
    assert_int_equal(kvedge_wire_fetch_mapped_pack("cloud-m", mf), 0);
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION, KVEDGE_OP_FETCH, 0, 9, 0, N, 8, 1000};
    kvedge_wire_frame_t sf = {sb, sizeof sb}, idf = {ids, sizeof ids}, tf = {times, sizeof times},
                        prf = {pf, plen}, mff = {mf, sizeof mf};
    kvedge_wire_frame_t f[5] = {sf, idf, prf};
    assert_int_equal(kvedge_wire_validate(&h, f, 3), 0);
    assert_int_equal(kvedge_wire_validate(&h, f, 2), KVEDGE_EPROTO); /* PREC, no frame */
    f[2] = tf;
    f[3] = prf;
    assert_int_equal(kvedge_wire_validate(&h, f, 4), 0); /* times, then prec */
    f[2] = prf;
    f[3] = tf;
    assert_int_equal(kvedge_wire_validate(&h, f, 4), KVEDGE_EPROTO); /* the wrong order */
    f[2] = (kvedge_wire_frame_t){pf, plen - 1};
    assert_int_equal(kvedge_wire_validate(&h, f, 3), KVEDGE_EPROTO); /* a frame of bad size */
    spec.flags = KVEDGE_WIRE_FETCH_FLAG_PREC | KVEDGE_WIRE_FETCH_FLAG_MAPPED;
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, sb), 0);
    kvedge_wire_frame_t g[5] = {sf, idf, tf, prf, mff};
    assert_int_equal(kvedge_wire_validate(&h, g, 5), 0);
    g[2] = prf;
    g[3] = mff;
    assert_int_equal(kvedge_wire_validate(&h, g, 4), 0); /* no times */
    g[2] = mff;
    g[3] = prf;
    assert_int_equal(kvedge_wire_validate(&h, g, 4), KVEDGE_EPROTO); /* mapped not last */
    spec.flags = 0; /* without PREC the frame is one too many */
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, sb), 0);
    kvedge_wire_frame_t k[3] = {sf, idf, prf};
    assert_int_equal(kvedge_wire_validate(&h, k, 3), KVEDGE_EPROTO);

    /* Plan layer record: prec u8 | prec reason u8 where reserved u16 was. */
    uint8_t rec[KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES];
    kvedge_wire_fetch_plan_layer_t pl = {0, 1, 120.0, false, KVEDGE_WIRE_FETCH_OWN_LAYER, int4, 2},
                                   plb;
    kvedge_wire_fetch_plan_layer_pack(&pl, rec);
    assert_int_equal(rec[6], int4);
    assert_int_equal(rec[7], 2);
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(rec, sizeof rec, &plb), 0);
    assert_true(plb.prec == int4 && plb.prec_reason == 2);
    pl.prec = 0x7F; /* not a rung */
    kvedge_wire_fetch_plan_layer_pack(&pl, rec);
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(rec, sizeof rec, &plb), KVEDGE_EPROTO);
    pl = (kvedge_wire_fetch_plan_layer_t){-1, 5, 10.0, false, KVEDGE_WIRE_FETCH_OWN_LAYER, int8, 1};
    kvedge_wire_fetch_plan_layer_pack(&pl, rec); /* a rung on a recomputed layer */
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(rec, sizeof rec, &plb), KVEDGE_EPROTO);
    pl.prec = 0;
    pl.prec_reason = 0;
    kvedge_wire_fetch_plan_layer_pack(&pl, rec);
    assert_int_equal(kvedge_wire_fetch_plan_layer_parse(rec, sizeof rec, &plb), 0);

    /* LAYER record: prec u8 where the reserved u32 began. */
    kvedge_wire_fetch_layer_t l = {KVEDGE_FETCH_PLANNED,        2,    0, 0, 12, 1,
                                   KVEDGE_WIRE_FETCH_OWN_LAYER, think},
                              lb;
    uint8_t rl[KVEDGE_WIRE_FETCH_LAYER_BYTES];
    kvedge_wire_fetch_layer_pack(&l, rl);
    assert_int_equal(rl[20], think);
    assert_int_equal(kvedge_wire_fetch_layer_parse(rl, sizeof rl, &lb), 0);
    assert_int_equal(lb.prec, think);
    rl[21] = 1; /* still reserved */
    assert_int_equal(kvedge_wire_fetch_layer_parse(rl, sizeof rl, &lb), KVEDGE_EPROTO);
    l.prec = 0x7F;
    kvedge_wire_fetch_layer_pack(&l, rl);
    assert_int_equal(kvedge_wire_fetch_layer_parse(rl, sizeof rl, &lb), KVEDGE_EPROTO);
    l = (kvedge_wire_fetch_layer_t){KVEDGE_FETCH_MISS,           1,   -1, KVEDGE_ENOTFOUND, 0, 0,
                                    KVEDGE_WIRE_FETCH_OWN_LAYER, int8};
    kvedge_wire_fetch_layer_pack(&l, rl); /* a miss has no precision */
    assert_int_equal(kvedge_wire_fetch_layer_parse(rl, sizeof rl, &lb), KVEDGE_EPROTO);
}

static void test_op_names(void **state)
{
    (void)state;
    assert_string_equal(kvedge_wire_op_name(KVEDGE_OP_HELLO), "HELLO");
    assert_string_equal(kvedge_wire_op_name(KVEDGE_OP_GET_LAYER), "GET_LAYER");
    assert_string_equal(kvedge_wire_op_name(KVEDGE_OP_MODEL), "MODEL");
    for (int op = 1; op <= 17; op++)
        assert_non_null(kvedge_wire_op_name(op));
    assert_string_equal(kvedge_wire_op_name(KVEDGE_OP_FETCH), "FETCH");
    assert_string_equal(kvedge_wire_op_name(KVEDGE_OP_MONITOR), "MONITOR");
    assert_null(kvedge_wire_op_name(0));
    assert_null(kvedge_wire_op_name(18));
    assert_null(kvedge_wire_op_name(-1));
    assert_null(kvedge_wire_op_name(255));
}

static void test_header_round_trip(void **state)
{
    (void)state;
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION,
                              KVEDGE_OP_GET_LAYER,
                              KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END,
                              0xF1E2D3C4B5A69788ull,
                              KVEDGE_ECORRUPT,
                              0xA1B2C3D4u,
                              0x01020304u,
                              600000},
                         back;
    uint8_t buf[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, buf);
    /* Spot-check the layout of docs/protocol.md. */
    assert_memory_equal(buf, "KVEP\x01\x05\x05\x00\x88\x97\xA6\xB5\xC4\xD3\xE2\xF1", 16);
    assert_memory_equal(buf + 16, "\xFC\xFF\xFF\xFF\xD4\xC3\xB2\xA1\x04\x03\x02\x01", 12);
    assert_int_equal(kvedge_le_get32(buf + 28), 600000);
    assert_int_equal(kvedge_wire_header_parse(buf, sizeof buf, &back), 0);
    t_header_equal(&back, &h);
    /* Every case's header survives too. */
    for (size_t i = 0; i < T_NCASES; i++) {
        t_msg_t *m = t_build(&s_cases[i], s_cases[i].count);
        kvedge_wire_header_pack(&m->h, buf);
        memset(&back, 0xEE, sizeof back);
        T_EXPECT(&s_cases[i], "parse", kvedge_wire_header_parse(buf, sizeof buf, &back), 0);
        t_header_equal(&back, &m->h);
        t_free(m);
    }
}

static void test_header_errors(void **state)
{
    (void)state;
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION, KVEDGE_OP_PING, 0, 42, 0, 0, 0, 1000}, back;
    uint8_t buf[KVEDGE_WIRE_HEADER_BYTES + 1] = {0};
    kvedge_wire_header_pack(&h, buf);

    /* A message with no frames has no header; 31 and 33 bytes are not one. */
    assert_int_equal(kvedge_wire_header_parse(NULL, 0, &back), KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_header_parse(buf, 0, &back), KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_header_parse(buf, 31, &back), KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_header_parse(buf, 33, &back), KVEDGE_EPROTO);
    assert_int_equal(back.request_id, 0); /* unreadable: zeroed */

    for (int i = 0; i < 4; i++) {
        buf[i] ^= 0x20;
        assert_int_equal(kvedge_wire_header_parse(buf, 32, &back), KVEDGE_EPROTO);
        assert_int_equal(back.request_id, 0);
        buf[i] ^= 0x20;
    }

    /* Another version: EVERSION, with the rest readable so the node can answer. */
    const uint8_t versions[] = {0, 2, 255};
    for (size_t i = 0; i < sizeof versions; i++) {
        h.version = versions[i];
        h.flags = 0x8000; /* another version's flags are not judged */
        kvedge_wire_header_pack(&h, buf);
        assert_int_equal(kvedge_wire_header_parse(buf, 32, &back), KVEDGE_EVERSION);
        assert_int_equal(back.version, versions[i]);
        assert_int_equal(back.opcode, KVEDGE_OP_PING);
        assert_int_equal(back.request_id, 42);
        assert_int_equal(back.deadline_ms, 1000);
    }

    /* Unknown flag bits: EPROTO, header still filled. */
    h.version = KVEDGE_WIRE_VERSION;
    for (int bit = 3; bit < 16; bit++) {
        h.flags = (uint16_t)(1u << bit);
        kvedge_wire_header_pack(&h, buf);
        assert_int_equal(kvedge_wire_header_parse(buf, 32, &back), KVEDGE_EPROTO);
        assert_int_equal(back.request_id, 42);
    }
    /* The parser does not judge opcode-dependent fields. */
    h = (kvedge_wire_header_t){KVEDGE_WIRE_VERSION, 200, 7, 1, KVEDGE_EIO, 6, 7, 0};
    kvedge_wire_header_pack(&h, buf);
    assert_int_equal(kvedge_wire_header_parse(buf, 32, &back), 0);
    t_header_equal(&back, &h);
}

/* ---- validation, table-driven ---- */

static void test_valid_messages(void **state)
{
    (void)state;
    for (size_t i = 0; i < T_NCASES; i++) {
        const t_case_t *c = &s_cases[i];
        t_msg_t *m = t_build(c, c->count);
        T_EXPECT(c, "default", t_validate(m), 0);
        t_free(m);
        m = t_build(c, c->lo);
        T_EXPECT(c, "lowest count", t_validate(m), 0);
        t_free(m);
        m = t_build(c, c->hi);
        T_EXPECT(c, "highest count", t_validate(m), 0);
        t_free(m);
    }
}

static void test_frame_count(void **state)
{
    (void)state;
    for (size_t i = 0; i < T_NCASES; i++) {
        const t_case_t *c = &s_cases[i];
        t_msg_t *m = t_build(c, c->count);
        size_t n = m->n;
        /* GET and GET_LAYER requests take an optional last frame: the accept list, 0 ... 8
         * bytes (its meaning is the node's to check). */
        bool accept = !c->reply && (c->op == KVEDGE_OP_GET || c->op == KVEDGE_OP_GET_LAYER);
        t_add(m, "x", 1, 1, 1);
        T_EXPECT(c, "one frame more", t_validate(m), accept ? 0 : KVEDGE_EPROTO);
        m->n = n;
        t_add(m, NULL, 0, 0, 0);
        T_EXPECT(c, "one empty frame more", t_validate(m), accept ? 0 : KVEDGE_EPROTO);
        m->n = n;
        if (accept) {
            t_add(m, "123456789", 9, 9, 9);
            T_EXPECT(c, "an accept list over 8 bytes", t_validate(m), KVEDGE_EPROTO);
            m->n = n;
            t_add(m, "x", 1, 1, 1);
            t_add(m, "x", 1, 1, 1);
            T_EXPECT(c, "two frames more", t_validate(m), KVEDGE_EPROTO);
            m->n = n;
        }
        if (n > 0) {
            m->n = n - 1;
            T_EXPECT(c, "one frame less", t_validate(m), KVEDGE_EPROTO);
            m->n = 0;
            T_EXPECT(c, "no payload frames", t_validate(m), KVEDGE_EPROTO);
        }
        m->n = n;
        T_EXPECT(c, "restored", t_validate(m), 0);
        t_free(m);
    }
    /* More than KVEDGE_WIRE_MAX_FRAMES, whatever the opcode says. */
    t_msg_t *m = t_build(&s_cases[2], KVEDGE_WIRE_MAX_ITEMS); /* PUT: 2048 frames */
    assert_int_equal(t_validate(m), 0);
    t_add(m, "x", 1, 1, 1);
    t_add(m, "x", 1, 1, 1);
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    t_free(m);
}

/* MONITOR: the request's top and reserved field; the reply's document (a JSON object, 2 ...
 * 1 MiB, no NUL), which the table cannot vary like fixed records. */
static void test_monitor(void **state)
{
    (void)state;
    uint8_t req[4] = {64, 0, 0, 0};
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION, KVEDGE_OP_MONITOR, 0, 9, 0, 0, 0, 1000};
    kvedge_wire_frame_t f = {req, sizeof req};
    assert_int_equal(kvedge_wire_validate(&h, &f, 1), 0);
    req[0] = 65; /* more hot prefixes than a document carries */
    assert_int_equal(kvedge_wire_validate(&h, &f, 1), KVEDGE_EPROTO);
    req[0] = 0;
    req[3] = 1; /* reserved */
    assert_int_equal(kvedge_wire_validate(&h, &f, 1), KVEDGE_EPROTO);
    assert_int_equal(kvedge_wire_validate(&h, NULL, 0), KVEDGE_EPROTO);
    kvedge_wire_header_t r = {
        KVEDGE_WIRE_VERSION, KVEDGE_OP_MONITOR, KVEDGE_WIRE_FLAG_REPLY, 9, 0, 0, 0, 0};
    const char *doc = "{\"kind\":\"node\"}";
    kvedge_wire_frame_t d = {(const uint8_t *)doc, strlen(doc)};
    assert_int_equal(kvedge_wire_validate(&r, &d, 1), 0);
    d.len = 1; /* "{": too short */
    assert_int_equal(kvedge_wire_validate(&r, &d, 1), KVEDGE_EPROTO);
    const char *nul = "{\"a\":\"\0\"}";
    d = (kvedge_wire_frame_t){(const uint8_t *)nul, 9};
    assert_int_equal(kvedge_wire_validate(&r, &d, 1), KVEDGE_EPROTO);
    const char *arr = "[1,2]";
    d = (kvedge_wire_frame_t){(const uint8_t *)arr, 5};
    assert_int_equal(kvedge_wire_validate(&r, &d, 1), KVEDGE_EPROTO);
    uint8_t *big = malloc(KVEDGE_WIRE_MAX_MONITOR_BYTES + 1);
    assert_non_null(big);
    memset(big, ' ', KVEDGE_WIRE_MAX_MONITOR_BYTES + 1);
    big[0] = '{';
    d = (kvedge_wire_frame_t){big, KVEDGE_WIRE_MAX_MONITOR_BYTES};
    assert_int_equal(kvedge_wire_validate(&r, &d, 1), 0);
    d.len++;
    assert_int_equal(kvedge_wire_validate(&r, &d, 1), KVEDGE_EPROTO);
    free(big);
    r.status = KVEDGE_ENOMEM; /* a failed MONITOR carries nothing */
    assert_int_equal(kvedge_wire_validate(&r, NULL, 0), 0);
}

static void test_frame_sizes(void **state)
{
    (void)state;
    for (size_t i = 0; i < T_NCASES; i++) {
        const t_case_t *c = &s_cases[i];
        t_msg_t *m = t_build(c, c->count);
        for (size_t k = 0; k < m->n; k++) {
            char what[64];
            kvedge_wire_frame_t saved = m->f[k];
            if (m->min[k] == m->max[k]) { /* exact size: one byte either way is wrong */
                m->f[k].len = saved.len + 1;
                snprintf(what, sizeof what, "frame %zu one byte longer", k + 1);
                T_EXPECT(c, what, t_validate(m), KVEDGE_EPROTO);
                if (saved.len > 0) {
                    m->f[k].len = saved.len - 1;
                    snprintf(what, sizeof what, "frame %zu one byte shorter", k + 1);
                    T_EXPECT(c, what, t_validate(m), KVEDGE_EPROTO);
                }
            } else { /* a range: its ends pass, one past them fails */
                m->f[k] = (kvedge_wire_frame_t){s_big, m->max[k]};
                snprintf(what, sizeof what, "frame %zu at its maximum", k + 1);
                T_EXPECT(c, what, t_validate(m), 0);
                m->f[k].len = m->max[k] + 1;
                snprintf(what, sizeof what, "frame %zu one byte over", k + 1);
                T_EXPECT(c, what, t_validate(m), KVEDGE_EPROTO);
                m->f[k].len = m->min[k];
                snprintf(what, sizeof what, "frame %zu at its minimum", k + 1);
                T_EXPECT(c, what, t_validate(m), 0);
                if (m->min[k] > 0) {
                    m->f[k].len = m->min[k] - 1;
                    snprintf(what, sizeof what, "frame %zu one byte under", k + 1);
                    T_EXPECT(c, what, t_validate(m), KVEDGE_EPROTO);
                }
            }
            m->f[k] = saved;
        }
        T_EXPECT(c, "restored", t_validate(m), 0);
        t_free(m);
    }
}

static void test_count_limits(void **state)
{
    (void)state;
    for (size_t i = 0; i < T_NCASES; i++) {
        const t_case_t *c = &s_cases[i];
        t_msg_t *m = t_build(c, c->hi + 1); /* frames sized for the count: only the limit fails */
        T_EXPECT(c, "count over its limit", t_validate(m), KVEDGE_EPROTO);
        t_free(m);
        if (c->lo > 0) {
            m = t_build(c, c->lo - 1);
            T_EXPECT(c, "count under its minimum", t_validate(m), KVEDGE_EPROTO);
            t_free(m);
        }
        m = t_build(c, c->count);
        m->h.count = UINT32_MAX;
        T_EXPECT(c, "count UINT32_MAX", t_validate(m), KVEDGE_EPROTO);
        t_free(m);
    }
}

/* Which MORE/END combinations a case's direction and opcode allow. */
static bool t_stream_flags_ok(const t_case_t *c, uint16_t stream)
{
    if (!c->reply)
        return stream == 0;
    if (c->op == KVEDGE_OP_GET_LAYER)
        return stream == (c->variant == T_END ? KVEDGE_WIRE_FLAG_END : KVEDGE_WIRE_FLAG_MORE);
    if (c->op == KVEDGE_OP_LIST)
        return stream == 0 || stream == KVEDGE_WIRE_FLAG_END;
    return stream == 0;
}

static void test_flags(void **state)
{
    (void)state;
    const uint16_t streams[] = {0, KVEDGE_WIRE_FLAG_MORE, KVEDGE_WIRE_FLAG_END,
                                KVEDGE_WIRE_FLAG_MORE | KVEDGE_WIRE_FLAG_END};
    const uint16_t unknown[] = {0, 0x0008, 0x0100, 0x8000};
    for (size_t i = 0; i < T_NCASES; i++) {
        const t_case_t *c = &s_cases[i];
        t_msg_t *m = t_build(c, c->count);
        uint16_t dir = c->reply ? KVEDGE_WIRE_FLAG_REPLY : 0;
        for (size_t s = 0; s < 4; s++)
            for (size_t u = 0; u < 4; u++) {
                char what[64];
                m->h.flags = (uint16_t)(dir | streams[s] | unknown[u]);
                snprintf(what, sizeof what, "flags 0x%04x", m->h.flags);
                bool ok = unknown[u] == 0 && t_stream_flags_ok(c, streams[s]);
                T_EXPECT(c, what, t_validate(m), ok ? 0 : KVEDGE_EPROTO);
            }
        t_free(m);
        m = t_build(c, c->count);
        m->h.flags ^= KVEDGE_WIRE_FLAG_REPLY;
        T_EXPECT(c, c->reply ? "REPLY missing" : "REPLY on a request", t_validate(m),
                 KVEDGE_EPROTO);
        t_free(m);
    }
}

static void test_status(void **state)
{
    (void)state;
    for (size_t i = 0; i < T_NCASES; i++) {
        const t_case_t *c = &s_cases[i];
        t_msg_t *m = t_build(c, c->count);
        m->h.status = 1;
        T_EXPECT(c, "positive status", t_validate(m), KVEDGE_EPROTO);
        m->h.status = KVEDGE_EBUSY;
        if (!c->reply) {
            T_EXPECT(c, "non-zero status on a request", t_validate(m), KVEDGE_EPROTO);
        } else {
            /* A failed request carries no payload: only the end message may have status
             * and count together, data messages keep per-head status in f1. */
            bool ok = c->variant == T_END || (m->n == 0 && m->h.count == 0);
            T_EXPECT(c, "non-zero status with payload", t_validate(m), ok ? 0 : KVEDGE_EPROTO);
            m->n = 0;
            m->h.count = 0;
            T_EXPECT(c, "failed reply, no payload", t_validate(m),
                     c->bare_err_ok ? 0 : KVEDGE_EPROTO);
            m->h.status = INT32_MIN;
            T_EXPECT(c, "failed reply, INT32_MIN", t_validate(m),
                     c->bare_err_ok ? 0 : KVEDGE_EPROTO);
            m->h.count = 1;
            T_EXPECT(c, "failed reply with a count", t_validate(m),
                     c->variant == T_END ? 0 : KVEDGE_EPROTO);
        }
        t_free(m);
    }
}

/* Every code crosses the wire as its small number -n (docs/protocol.md, "Status codes") and
 * comes back as itself, in the header and in every record that carries a status. */
static void test_status_wire_round_trip(void **state)
{
    (void)state;
    for (int n = 0; n < KVEDGE_ERR_COUNT; n++) {
        int code = n ? KVEDGE_ERR_BASE - n : KVEDGE_OK;
        assert_string_not_equal(kvedge_errname(code), "KVEDGE_EUNKNOWN");
        assert_int_equal(kvedge_err_index(code), n);
        assert_int_equal(kvedge_err_to_wire(code), -n);
        assert_int_equal(kvedge_err_from_wire(-n), code);

        kvedge_wire_header_t
            h = {KVEDGE_WIRE_VERSION, KVEDGE_OP_GET, KVEDGE_WIRE_FLAG_REPLY, 9, code, 0, 0, 0},
            back;
        uint8_t buf[KVEDGE_WIRE_HEADER_BYTES];
        kvedge_wire_header_pack(&h, buf);
        assert_int_equal((int32_t)kvedge_le_get32(buf + 16), -n);
        assert_int_equal(kvedge_wire_header_parse(buf, sizeof buf, &back), 0);
        assert_int_equal(back.status, code);
    }
    /* The wire values are the protocol's, unchanged: a few by name. */
    assert_int_equal(kvedge_err_to_wire(KVEDGE_EINVAL), -1);
    assert_int_equal(kvedge_err_to_wire(KVEDGE_ENOTFOUND), -3);
    assert_int_equal(kvedge_err_to_wire(KVEDGE_EBUSY), -9);
    assert_int_equal(kvedge_err_to_wire(KVEDGE_EPROTO), -18);
    assert_int_equal(kvedge_err_to_wire(KVEDGE_ENOSPC), -23);
    /* The records that carry a head's or a layer's status. */
    const int miss[] = {KVEDGE_OK, KVEDGE_ENOTFOUND, KVEDGE_ECORRUPT};
    for (size_t i = 0; i < 3; i++) {
        kvedge_wire_stream_hdr_t s = {3, 1, miss[i]}, sb;
        uint8_t sbuf[KVEDGE_WIRE_STREAM_HDR_BYTES];
        kvedge_wire_stream_hdr_pack(&s, sbuf);
        assert_int_equal((int32_t)kvedge_le_get32(sbuf + 8), kvedge_err_to_wire(miss[i]));
        assert_int_equal(kvedge_wire_stream_hdr_parse(sbuf, sizeof sbuf, &sb), 0);
        assert_int_equal(sb.status, miss[i]);
        kvedge_wire_fetch_block_t b = {0, 2, 3, 1, miss[i]}, bb;
        uint8_t bbuf[KVEDGE_WIRE_FETCH_BLOCK_BYTES];
        kvedge_wire_fetch_block_pack(&b, bbuf);
        assert_int_equal((int32_t)kvedge_le_get32(bbuf + 12), kvedge_err_to_wire(miss[i]));
        assert_int_equal(kvedge_wire_fetch_block_parse(bbuf, sizeof bbuf, &bb), 0);
        assert_int_equal(bb.status, miss[i]);
    }
}

/* A status this library does not know (a code a newer peer added, a positive value) reads as
 * KVEDGE_EPROTO; a value that is no kvedge code (a -errno) is sent as KVEDGE_EIO's number. */
static void test_status_wire_unknown(void **state)
{
    (void)state;
    const int32_t unknown[] = {-KVEDGE_ERR_COUNT, -99, -30701, 1, 5, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_int_equal(kvedge_err_from_wire(unknown[i]), KVEDGE_EPROTO);
        uint8_t buf[KVEDGE_WIRE_HEADER_BYTES];
        kvedge_wire_header_t
            h = {KVEDGE_WIRE_VERSION, KVEDGE_OP_GET, KVEDGE_WIRE_FLAG_REPLY, 9, 0, 0, 0, 0},
            back;
        kvedge_wire_header_pack(&h, buf);
        kvedge_le_put32(buf + 16, (uint32_t)unknown[i]);
        assert_int_equal(kvedge_wire_header_parse(buf, sizeof buf, &back), 0);
        assert_int_equal(back.status, KVEDGE_EPROTO);
        assert_string_equal(kvedge_errname(back.status), "KVEDGE_EPROTO");
    }
    assert_int_equal(kvedge_err_index(-22), -1); /* -EINVAL is no kvedge code */
    assert_int_equal(kvedge_err_to_wire(-22), kvedge_err_to_wire(KVEDGE_EIO));
    assert_int_equal(kvedge_err_to_wire(7), kvedge_err_to_wire(KVEDGE_EIO));
    assert_int_equal(kvedge_err_to_wire(KVEDGE_ERR_BASE - KVEDGE_ERR_COUNT),
                     kvedge_err_to_wire(KVEDGE_EIO));
}

static void test_deadline_and_credit(void **state)
{
    (void)state;
    for (size_t i = 0; i < T_NCASES; i++) {
        const t_case_t *c = &s_cases[i];
        t_msg_t *m = t_build(c, c->count);
        if (c->reply) {
            m->h.deadline_ms = 1;
            T_EXPECT(c, "deadline on a reply", t_validate(m), KVEDGE_EPROTO);
            m->h.deadline_ms = 0;
            m->h.credit = 1;
            T_EXPECT(c, "credit on a reply", t_validate(m), KVEDGE_EPROTO);
            t_free(m);
            continue;
        }
        const uint32_t deadlines[] = {0, 1, KVEDGE_WIRE_MAX_DEADLINE_MS,
                                      KVEDGE_WIRE_MAX_DEADLINE_MS + 1, UINT32_MAX};
        for (size_t d = 0; d < 5; d++) {
            char what[64];
            m->h.deadline_ms = deadlines[d];
            snprintf(what, sizeof what, "deadline %u", deadlines[d]);
            bool ok = deadlines[d] >= 1 && deadlines[d] <= KVEDGE_WIRE_MAX_DEADLINE_MS;
            T_EXPECT(c, what, t_validate(m), ok ? 0 : KVEDGE_EPROTO);
        }
        m->h.deadline_ms = 5000;
        bool credited = c->op == KVEDGE_OP_GET_LAYER || c->op == KVEDGE_OP_CREDIT;
        const uint32_t credits[] = {0, 1, KVEDGE_WIRE_MAX_CREDIT, KVEDGE_WIRE_MAX_CREDIT + 1};
        for (size_t k = 0; k < 4; k++) {
            char what[64];
            m->h.credit = credits[k];
            snprintf(what, sizeof what, "credit %u", credits[k]);
            bool ok = credited ? credits[k] >= 1 && credits[k] <= KVEDGE_WIRE_MAX_CREDIT
                               : credits[k] == 0;
            T_EXPECT(c, what, t_validate(m), ok ? 0 : KVEDGE_EPROTO);
        }
        t_free(m);
    }
}

static void test_opcode_and_version(void **state)
{
    (void)state;
    const uint8_t unknown[] = {0, 18, 19, 200, 255};
    for (size_t i = 0; i < T_NCASES; i++) {
        const t_case_t *c = &s_cases[i];
        t_msg_t *m = t_build(c, c->count);
        for (size_t k = 0; k < sizeof unknown; k++) {
            m->h.opcode = unknown[k];
            T_EXPECT(c, "unknown opcode", t_validate(m), KVEDGE_EPROTO);
        }
        m->h.opcode = c->op;
        m->h.version = 2;
        T_EXPECT(c, "version 2", t_validate(m), KVEDGE_EPROTO);
        /* The header parser says EVERSION and still fills the header. */
        uint8_t buf[KVEDGE_WIRE_HEADER_BYTES];
        kvedge_wire_header_t back;
        kvedge_wire_header_pack(&m->h, buf);
        T_EXPECT(c, "parse version 2", kvedge_wire_header_parse(buf, sizeof buf, &back),
                 KVEDGE_EVERSION);
        assert_int_equal(back.request_id, m->h.request_id);
        assert_int_equal(back.opcode, c->op);
        buf[0] = 'X';
        T_EXPECT(c, "wrong magic", kvedge_wire_header_parse(buf, sizeof buf, &back), KVEDGE_EPROTO);
        m->h.version = KVEDGE_WIRE_VERSION;
        kvedge_wire_header_pack(&m->h, buf);
        T_EXPECT(c, "31-byte header", kvedge_wire_header_parse(buf, 31, &back), KVEDGE_EPROTO);
        t_free(m);
    }
}

/* ---- validation, opcode-specific rules ---- */

static const t_case_t *t_find(uint8_t op, bool reply, int variant)
{
    for (size_t i = 0; i < T_NCASES; i++)
        if (s_cases[i].op == op && s_cases[i].reply == reply && s_cases[i].variant == variant)
            return &s_cases[i];
    fail();
    return NULL;
}

static void t_set_status(t_msg_t *m, size_t frame, uint32_t i, int32_t status)
{
    kvedge_le_put32((uint8_t *)m->f[frame].data + 4 * (size_t)i, (uint32_t)status);
}

static void test_get_reply_items(void **state)
{
    (void)state;
    const t_case_t *c = t_find(KVEDGE_OP_GET, true, T_PLAIN);
    t_msg_t *m = t_build(c, 3); /* statuses 0, ENOTFOUND, 0 and two blocks */
    assert_int_equal(m->n, 3);
    assert_int_equal(t_validate(m), 0);
    t_set_status(m, 0, 1, 0); /* three hits but two blocks */
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    t_set_status(m, 0, 1, KVEDGE_ETOOBIG);
    assert_int_equal(t_validate(m), 0);
    t_set_status(m, 0, 1, 7); /* a positive status is no status */
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    t_set_status(m, 0, 0, KVEDGE_ECORRUPT);
    t_set_status(m, 0, 1, KVEDGE_ENOTFOUND);
    t_set_status(m, 0, 2, KVEDGE_ENOTFOUND);
    m->n = 1; /* all missed: the statuses alone */
    assert_int_equal(t_validate(m), 0);
    m->n = 2;
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    t_free(m);

    /* The reply's block bytes: 4 largest-but-one frames of 64 MiB pass (256 MiB in all),
     * one byte more fails. */
    m = t_build(c, 4);
    for (uint32_t i = 0; i < 4; i++)
        t_set_status(m, 0, i, 0);
    m->n = 1;
    for (int i = 0; i < 4; i++)
        m->f[m->n++] = (kvedge_wire_frame_t){s_big, 64u << 20};
    assert_int_equal(t_validate(m), 0);
    m->f[4].len++;
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    t_free(m);

    /* PUT reply statuses are statuses too. */
    m = t_build(t_find(KVEDGE_OP_PUT, true, T_PLAIN), 3);
    t_set_status(m, 0, 2, 1);
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    t_free(m);
}

static void test_get_layer_stream(void **state)
{
    (void)state;
    t_msg_t *m = t_build(t_find(KVEDGE_OP_GET_LAYER, true, T_DATA_HIT), 1);
    uint8_t *f1 = (uint8_t *)m->f[0].data;
    assert_int_equal(t_validate(m), 0);
    /* A miss carries no block, a hit always one. */
    kvedge_le_put32(f1 + 8, (uint32_t)kvedge_err_to_wire(KVEDGE_ENOTFOUND));
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    m->n = 1;
    assert_int_equal(t_validate(m), 0);
    kvedge_le_put32(f1 + 8, (uint32_t)kvedge_err_to_wire(KVEDGE_ECORRUPT));
    assert_int_equal(t_validate(m), 0);
    kvedge_le_put32(f1 + 8, 0);
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    /* Other head statuses end the stream instead. */
    kvedge_le_put32(f1 + 8, (uint32_t)kvedge_err_to_wire(KVEDGE_EIO));
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    m->n = 2;
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    kvedge_le_put32(f1 + 8, 0);
    assert_int_equal(t_validate(m), 0);
    f1[6] = 1; /* reserved */
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    f1[6] = 0;
    f1[7] = 0x80;
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    t_free(m);

    /* Request: reserved u16 after the layer must be zero. */
    m = t_build(t_find(KVEDGE_OP_GET_LAYER, false, T_PLAIN), 2);
    uint8_t *r = (uint8_t *)m->f[0].data;
    r[0] = 0xFF;
    r[1] = 0xFF; /* any layer is fine here */
    assert_int_equal(t_validate(m), 0);
    r[2] = 1;
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    r[2] = 0;
    r[3] = 1;
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    t_free(m);
}

/* Packed GET_LAYER data messages: count k heads in f1 (k x 12 bytes), one block frame per
 * head whose status is 0; k within 1 ... KVEDGE_WIRE_MAX_PACK; and the request's pack frame. */
static void test_get_layer_packed(void **state)
{
    (void)state;
    uint8_t recs[(KVEDGE_WIRE_MAX_PACK + 1) * KVEDGE_WIRE_STREAM_HDR_BYTES];
    for (uint32_t i = 0; i <= KVEDGE_WIRE_MAX_PACK; i++) {
        kvedge_wire_stream_hdr_t sh = {0, (uint16_t)i, i == 1 ? KVEDGE_ENOTFOUND : 0};
        kvedge_wire_stream_hdr_pack(&sh, recs + i * KVEDGE_WIRE_STREAM_HDR_BYTES);
    }
    static uint8_t block[64];
    kvedge_wire_frame_t f[KVEDGE_WIRE_MAX_PACK + 2];
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION,
                              KVEDGE_OP_GET_LAYER,
                              KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE,
                              7,
                              0,
                              3,
                              0,
                              0};
    f[0] = (kvedge_wire_frame_t){recs, 3 * KVEDGE_WIRE_STREAM_HDR_BYTES};
    for (size_t i = 1; i < KVEDGE_WIRE_MAX_PACK + 2; i++)
        f[i] = (kvedge_wire_frame_t){block, sizeof block};
    assert_int_equal(kvedge_wire_validate(&h, f, 3), 0); /* hit, miss, hit: two blocks */
    assert_int_equal(kvedge_wire_validate(&h, f, 2), KVEDGE_EPROTO); /* a block short */
    assert_int_equal(kvedge_wire_validate(&h, f, 4), KVEDGE_EPROTO); /* a block too many */
    h.count = 2;                                                     /* count vs f1's records */
    assert_int_equal(kvedge_wire_validate(&h, f, 3), KVEDGE_EPROTO);
    h.count = KVEDGE_WIRE_MAX_PACK; /* the most heads a message may carry */
    f[0].len = KVEDGE_WIRE_MAX_PACK * KVEDGE_WIRE_STREAM_HDR_BYTES;
    assert_int_equal(kvedge_wire_validate(&h, f, KVEDGE_WIRE_MAX_PACK), 0);
    h.count = KVEDGE_WIRE_MAX_PACK + 1; /* one more */
    f[0].len = (KVEDGE_WIRE_MAX_PACK + 1) * KVEDGE_WIRE_STREAM_HDR_BYTES;
    assert_int_equal(kvedge_wire_validate(&h, f, KVEDGE_WIRE_MAX_PACK + 1), KVEDGE_EPROTO);
    h.count = 0;
    f[0].len = 0;
    assert_int_equal(kvedge_wire_validate(&h, f, 1), KVEDGE_EPROTO);

    /* The request's pack frame, after the accept list (empty or not). */
    uint8_t pk[KVEDGE_WIRE_PACK_BYTES];
    kvedge_wire_pack_t p = {KVEDGE_WIRE_MAX_PACK, 1u << 20}, back;
    kvedge_wire_pack_pack(&p, pk);
    assert_int_equal(kvedge_wire_pack_parse(pk, sizeof pk, &back), 0);
    assert_int_equal(back.max_blocks, KVEDGE_WIRE_MAX_PACK);
    assert_int_equal(back.max_bytes, 1u << 20);
    assert_int_equal(kvedge_wire_pack_parse(pk, sizeof pk - 1, &back), KVEDGE_EPROTO);
    const kvedge_wire_pack_t bad[] = {{1, 1}, {KVEDGE_WIRE_MAX_PACK + 1, 1}, {2, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t b[KVEDGE_WIRE_PACK_BYTES];
        kvedge_wire_pack_pack(&bad[i], b);
        assert_int_equal(kvedge_wire_pack_parse(b, sizeof b, &back), KVEDGE_EPROTO);
    }
    uint8_t reserved[KVEDGE_WIRE_PACK_BYTES];
    memcpy(reserved, pk, sizeof pk);
    reserved[2] = 1;
    assert_int_equal(kvedge_wire_pack_parse(reserved, sizeof reserved, &back), KVEDGE_EPROTO);
    uint8_t gl[4 + KVEDGE_CHUNK_ID_BYTES] = {0};
    kvedge_wire_header_t rq = {KVEDGE_WIRE_VERSION, KVEDGE_OP_GET_LAYER, 0, 8, 0, 1, 4, 1000};
    kvedge_wire_frame_t q[3] = {{gl, sizeof gl}, {NULL, 0}, {pk, sizeof pk}};
    assert_int_equal(kvedge_wire_validate(&rq, q, 3), 0);
    q[2].data = reserved;
    assert_int_equal(kvedge_wire_validate(&rq, q, 3), KVEDGE_EPROTO);

    /* FETCH BLOCK messages packed the same way (16-byte BLOCK records); PLAN and LAYER stay
     * count 1. */
    uint8_t frec[3 * KVEDGE_WIRE_FETCH_BLOCK_BYTES];
    for (uint16_t i = 0; i < 3; i++) {
        kvedge_wire_fetch_block_t fb = {0, 1, 0, i, i == 1 ? KVEDGE_ENOTFOUND : 0};
        kvedge_wire_fetch_block_pack(&fb, frec + i * KVEDGE_WIRE_FETCH_BLOCK_BYTES);
    }
    kvedge_wire_header_t fh = {KVEDGE_WIRE_VERSION,
                               KVEDGE_OP_FETCH,
                               KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE,
                               9,
                               0,
                               3,
                               0,
                               0};
    kvedge_wire_frame_t ff[4] = {{frec, sizeof frec}, {block, 8}, {block, 8}, {block, 8}};
    assert_int_equal(kvedge_wire_validate(&fh, ff, 3), 0);
    assert_int_equal(kvedge_wire_validate(&fh, ff, 4), KVEDGE_EPROTO);
    fh.count = 2;
    assert_int_equal(kvedge_wire_validate(&fh, ff, 3), KVEDGE_EPROTO);
    fh.count = KVEDGE_WIRE_MAX_PACK + 1;
    assert_int_equal(kvedge_wire_validate(&fh, ff, 3), KVEDGE_EPROTO);
}

static void test_list_request(void **state)
{
    (void)state;
    t_msg_t *m = t_build(t_find(KVEDGE_OP_LIST, false, T_PLAIN), 0);
    m->f[0].len = 0; /* no cursor: from the start */
    assert_int_equal(t_validate(m), 0);
    m->f[0].len = 1;
    assert_int_equal(t_validate(m), KVEDGE_EPROTO);
    m->f[0].len = KVEDGE_CHUNK_ID_BYTES;
    uint8_t *max = (uint8_t *)m->f[1].data;
    const uint32_t maxes[] = {0, 1, KVEDGE_WIRE_MAX_LIST, KVEDGE_WIRE_MAX_LIST + 1, UINT32_MAX};
    for (size_t i = 0; i < 5; i++) {
        kvedge_le_put32(max, maxes[i]);
        assert_int_equal(t_validate(m),
                         maxes[i] >= 1 && maxes[i] <= KVEDGE_WIRE_MAX_LIST ? 0 : KVEDGE_EPROTO);
    }
    t_free(m);
}

static void test_no_reply_opcodes(void **state)
{
    (void)state;
    /* CREDIT and CANCEL have no reply, not even a bare error one; nor has opcode 0. */
    const uint8_t ops[] = {KVEDGE_OP_CREDIT, KVEDGE_OP_CANCEL, 0};
    for (size_t i = 0; i < sizeof ops; i++) {
        kvedge_wire_header_t h = {
            KVEDGE_WIRE_VERSION, ops[i], KVEDGE_WIRE_FLAG_REPLY, 9, 0, 0, 0, 0};
        assert_int_equal(kvedge_wire_validate(&h, NULL, 0), KVEDGE_EPROTO);
        h.status = KVEDGE_EPROTO;
        assert_int_equal(kvedge_wire_validate(&h, NULL, 0), KVEDGE_EPROTO);
    }
}

/* ---- records ---- */

typedef int (*t_parse_fn)(const uint8_t *in, size_t len, void *out);

static int t_parse_put_item(const uint8_t *in, size_t len, void *out)
{
    return kvedge_wire_put_item_parse(in, len, out);
}

static int t_parse_model(const uint8_t *in, size_t len, void *out)
{
    return kvedge_wire_model_parse(in, len, out);
}

static int t_parse_chunk_entry(const uint8_t *in, size_t len, void *out)
{
    return kvedge_wire_chunk_entry_parse(in, len, out);
}

static int t_parse_node_info(const uint8_t *in, size_t len, void *out)
{
    return kvedge_wire_node_info_parse(in, len, out);
}

static int t_parse_stream_hdr(const uint8_t *in, size_t len, void *out)
{
    return kvedge_wire_stream_hdr_parse(in, len, out);
}

static int t_parse_stats(const uint8_t *in, size_t len, void *out)
{
    return kvedge_wire_stats_parse(in, len, out);
}

/* A valid record: parses; one byte shorter or longer does not; neither does any byte of
 * [lo, hi) made non-zero (reserved fields). */
static void t_record_errors(t_parse_fn parse, const uint8_t *rec, size_t len, const size_t *zero,
                            size_t nzero)
{
    uint8_t buf[512] = {0};
    union {
        kvedge_wire_put_item_t p;
        kvedge_model_t m;
        kvedge_wire_chunk_entry_t e;
        kvedge_wire_node_info_t n;
        kvedge_wire_stream_hdr_t s;
        kvedge_engine_stats_t st;
    } out;
    memcpy(buf, rec, len);
    assert_int_equal(parse(buf, len, &out), 0);
    assert_int_equal(parse(buf, len - 1, &out), KVEDGE_EPROTO);
    assert_int_equal(parse(buf, len + 1, &out), KVEDGE_EPROTO);
    assert_int_equal(parse(buf, 0, &out), KVEDGE_EPROTO);
    assert_int_equal(parse(NULL, 0, &out), KVEDGE_EPROTO);
    for (size_t r = 0; r < nzero; r += 2)
        for (size_t i = zero[r]; i < zero[r + 1]; i++) {
            buf[i] = 0x01;
            if (parse(buf, len, &out) != KVEDGE_EPROTO) {
                print_error("reserved byte %zu accepted\n", i);
                fail();
            }
            buf[i] = 0x80;
            assert_int_equal(parse(buf, len, &out), KVEDGE_EPROTO);
            buf[i] = rec[i];
        }
    assert_int_equal(parse(buf, len, &out), 0);
}

/* The 124-byte model id field at off: 1 ... 123 bytes, no NUL inside, NUL-padded. */
static void t_model_id_errors(t_parse_fn parse, const uint8_t *rec, size_t len, size_t off)
{
    uint8_t buf[512];
    union {
        kvedge_wire_put_item_t p;
        kvedge_model_t m;
        kvedge_wire_chunk_entry_t e;
    } out;
    uint8_t *id = buf + off;
    memcpy(buf, rec, len);
    memset(id, 0, KVEDGE_WIRE_MODEL_ID_BYTES);
    assert_int_equal(parse(buf, len, &out), KVEDGE_EPROTO); /* empty */
    memcpy(id, "ab\0cd", 5);
    assert_int_equal(parse(buf, len, &out), KVEDGE_EPROTO); /* embedded NUL */
    memset(id, 0, KVEDGE_WIRE_MODEL_ID_BYTES);
    id[0] = 'a';
    id[KVEDGE_WIRE_MODEL_ID_BYTES - 1] = 'z';
    assert_int_equal(parse(buf, len, &out), KVEDGE_EPROTO); /* garbage in the padding */
    memset(id, 'm', KVEDGE_WIRE_MODEL_ID_BYTES);
    assert_int_equal(parse(buf, len, &out), KVEDGE_EPROTO); /* 124 bytes: no room for NUL */
    id[KVEDGE_WIRE_MODEL_ID_BYTES - 1] = 0;
    assert_int_equal(parse(buf, len, &out), 0); /* 123 bytes: the longest */
    id[0] = 0;
    assert_int_equal(parse(buf, len, &out), KVEDGE_EPROTO); /* NUL first, text after */
}

static void test_key_round_trip(void **state)
{
    (void)state;
    kvedge_block_key_t key = {.layer = 0x0102, .head = 0xA0B0}, back;
    for (int i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++)
        key.chunk.bytes[i] = (uint8_t)(0xC0 + i);
    uint8_t buf[KVEDGE_WIRE_KEY_BYTES];
    kvedge_wire_key_pack(&key, buf);
    assert_memory_equal(buf, key.chunk.bytes, KVEDGE_CHUNK_ID_BYTES);
    assert_memory_equal(buf + 32, "\x01\x02\xA0\xB0", 4); /* big-endian, as the store's key */
    kvedge_wire_key_parse(buf, &back);
    assert_memory_equal(back.chunk.bytes, key.chunk.bytes, KVEDGE_CHUNK_ID_BYTES);
    assert_int_equal(back.layer, 0x0102);
    assert_int_equal(back.head, 0xA0B0);
}

static void test_put_item(void **state)
{
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        kvedge_wire_put_item_t item = {.layer = 0x0304,
                                       .head = 0x0506,
                                       .pin = variant == 1,
                                       .ttl_s = variant ? KVEDGE_TTL_NEVER : 0},
                               back;
        t_fill_chunk(&item.chunk, (uint32_t)variant * 5); /* first chunk, then a child */
        item.chunk.tokens = variant ? KVEDGE_CHUNK_TOKENS_MAX : 1;
        item.chunk.created_ms = 12345; /* not on the wire */
        uint8_t buf[KVEDGE_WIRE_PUT_ITEM_BYTES];
        assert_int_equal(kvedge_wire_put_item_pack(&item, buf), 0);
        assert_int_equal(buf[64], variant);
        assert_int_equal(buf[65], variant);
        assert_memory_equal(buf + 66, "\x04\x03\x06\x05\0\0", 6);
        assert_int_equal(kvedge_le_get32(buf + 72), item.chunk.index);
        assert_string_equal((const char *)buf + 84, "opt-1.3b");
        assert_int_equal(kvedge_wire_put_item_parse(buf, sizeof buf, &back), 0);
        assert_memory_equal(back.chunk.id.bytes, item.chunk.id.bytes, KVEDGE_CHUNK_ID_BYTES);
        assert_memory_equal(back.chunk.parent.bytes, item.chunk.parent.bytes,
                            KVEDGE_CHUNK_ID_BYTES);
        assert_int_equal(back.chunk.has_parent, item.chunk.has_parent);
        assert_string_equal(back.chunk.model_id, "opt-1.3b");
        assert_int_equal(back.chunk.index, item.chunk.index);
        assert_int_equal(back.chunk.tokens, item.chunk.tokens);
        assert_int_equal(back.chunk.created_ms, 0);
        assert_int_equal(back.layer, item.layer);
        assert_int_equal(back.head, item.head);
        assert_int_equal(back.pin, item.pin);
        assert_int_equal(back.ttl_s, item.ttl_s);

        const size_t reserved[] = {70, 72};
        t_record_errors(t_parse_put_item, buf, sizeof buf, reserved, 2);
        t_model_id_errors(t_parse_put_item, buf, sizeof buf, 84);
        uint8_t bad[KVEDGE_WIRE_PUT_ITEM_BYTES];
        memcpy(bad, buf, sizeof bad);
        bad[65] = 2; /* unknown item flag */
        assert_int_equal(kvedge_wire_put_item_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
        memcpy(bad, buf, sizeof bad);
        bad[64] = 2; /* has parent is 0 or 1 */
        assert_int_equal(kvedge_wire_put_item_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
        memcpy(bad, buf, sizeof bad);
        kvedge_le_put32(bad + 76, 0); /* no tokens */
        assert_int_equal(kvedge_wire_put_item_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
        kvedge_le_put32(bad + 76, KVEDGE_CHUNK_TOKENS_MAX + 1);
        assert_int_equal(kvedge_wire_put_item_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
    }
    /* No parent, yet parent bytes. */
    kvedge_wire_put_item_t item = {0}, back;
    t_fill_chunk(&item.chunk, 0);
    uint8_t buf[KVEDGE_WIRE_PUT_ITEM_BYTES];
    item.chunk.parent.bytes[5] = 9; /* ignored when has_parent is false */
    assert_int_equal(kvedge_wire_put_item_pack(&item, buf), 0);
    assert_int_equal(buf[32 + 5], 0);
    buf[32 + 31] = 1;
    assert_int_equal(kvedge_wire_put_item_parse(buf, sizeof buf, &back), KVEDGE_EPROTO);

    /* Pack refuses what parse would refuse. */
    memset(item.chunk.model_id, 'x', 123);
    item.chunk.model_id[123] = 0;
    assert_int_equal(kvedge_wire_put_item_pack(&item, buf), 0);
    assert_int_equal(kvedge_wire_put_item_parse(buf, sizeof buf, &back), 0);
    assert_int_equal(strlen(back.chunk.model_id), 123);
    memset(item.chunk.model_id, 'x', 124);
    item.chunk.model_id[124] = 0;
    assert_int_equal(kvedge_wire_put_item_pack(&item, buf), KVEDGE_EINVAL);
    memset(item.chunk.model_id, 'x', KVEDGE_MODEL_ID_MAX_BYTES);
    item.chunk.model_id[KVEDGE_MODEL_ID_MAX_BYTES] = 0;
    assert_int_equal(kvedge_wire_put_item_pack(&item, buf), KVEDGE_EINVAL);
    item.chunk.model_id[0] = 0;
    assert_int_equal(kvedge_wire_put_item_pack(&item, buf), KVEDGE_EINVAL);
    snprintf(item.chunk.model_id, sizeof item.chunk.model_id, "m");
    item.chunk.tokens = 0;
    assert_int_equal(kvedge_wire_put_item_pack(&item, buf), KVEDGE_EINVAL);
}

static void test_model_record(void **state)
{
    (void)state;
    for (int d = KVEDGE_DTYPE_FP16; d <= KVEDGE_DTYPE_FP32; d++) {
        kvedge_model_t m = {"llama-2-7b", 32, 0x0102, 128, (kvedge_dtype_t)d}, back;
        uint8_t buf[KVEDGE_WIRE_MODEL_BYTES];
        assert_int_equal(kvedge_wire_model_pack(&m, buf), 0);
        assert_string_equal((const char *)buf, "llama-2-7b");
        assert_memory_equal(buf + 124, "\x20\x00\x02\x01\x80\x00", 6);
        assert_int_equal(buf[130], d);
        assert_int_equal(kvedge_wire_model_parse(buf, sizeof buf, &back), 0);
        assert_string_equal(back.id, m.id);
        assert_int_equal(back.layers, m.layers);
        assert_int_equal(back.kv_heads, m.kv_heads);
        assert_int_equal(back.head_dim, m.head_dim);
        assert_int_equal(back.dtype, m.dtype);

        const size_t reserved[] = {131, 136};
        t_record_errors(t_parse_model, buf, sizeof buf, reserved, 2);
        t_model_id_errors(t_parse_model, buf, sizeof buf, 0);
        uint8_t bad[KVEDGE_WIRE_MODEL_BYTES];
        const uint8_t dtypes[] = {0, 4, 255};
        for (size_t i = 0; i < sizeof dtypes; i++) {
            memcpy(bad, buf, sizeof bad);
            bad[130] = dtypes[i];
            assert_int_equal(kvedge_wire_model_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
        }
        for (int f = 0; f < 3; f++) { /* zero layers, heads, head dim */
            memcpy(bad, buf, sizeof bad);
            bad[124 + 2 * f] = bad[125 + 2 * f] = 0;
            assert_int_equal(kvedge_wire_model_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
            bad[124 + 2 * f] = bad[125 + 2 * f] = 0xFF; /* past the store's limits */
            assert_int_equal(kvedge_wire_model_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
        }
    }
    kvedge_model_t m = {"", 1, 1, 1, KVEDGE_DTYPE_FP16};
    uint8_t buf[KVEDGE_WIRE_MODEL_BYTES];
    assert_int_equal(kvedge_wire_model_pack(&m, buf), KVEDGE_EINVAL);
    memset(m.id, 'q', 124);
    assert_int_equal(kvedge_wire_model_pack(&m, buf), KVEDGE_EINVAL);
    m.id[123] = 0;
    assert_int_equal(kvedge_wire_model_pack(&m, buf), 0);
    m.dtype = (kvedge_dtype_t)9;
    assert_int_equal(kvedge_wire_model_pack(&m, buf), KVEDGE_EINVAL);
}

static void test_chunk_entry(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 2; i++) {
        kvedge_wire_chunk_entry_t e = {.blocks = 0x11223344,
                                       .bytes = 0x0102030405060708ull,
                                       .pinned_blocks = 0x55667788,
                                       .fp16_bytes = 0xF0E0D0C0B0A09080ull},
                                  back;
        t_fill_chunk(&e.chunk, i * 3);
        e.chunk.created_ms = 99; /* not on the wire */
        uint8_t buf[KVEDGE_WIRE_CHUNK_ENTRY_BYTES];
        assert_int_equal(kvedge_wire_chunk_entry_pack(&e, buf), 0);
        assert_int_equal(buf[64], i);
        assert_int_equal(kvedge_le_get32(buf + 68), e.chunk.index);
        assert_int_equal(kvedge_le_get32(buf + 72), 256);
        assert_int_equal(kvedge_le_get32(buf + 76), 0x11223344);
        assert_memory_equal(buf + 80, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
        assert_int_equal(kvedge_le_get32(buf + 88), 0x55667788);
        assert_memory_equal(buf + 92, "\x80\x90\xA0\xB0\xC0\xD0\xE0\xF0", 8);
        assert_string_equal((const char *)buf + 104, "opt-1.3b");
        assert_int_equal(kvedge_wire_chunk_entry_parse(buf, sizeof buf, &back), 0);
        e.chunk.created_ms = 0;
        assert_memory_equal(back.chunk.id.bytes, e.chunk.id.bytes, KVEDGE_CHUNK_ID_BYTES);
        assert_memory_equal(back.chunk.parent.bytes, e.chunk.parent.bytes, KVEDGE_CHUNK_ID_BYTES);
        assert_int_equal(back.chunk.has_parent, e.chunk.has_parent);
        assert_string_equal(back.chunk.model_id, e.chunk.model_id);
        assert_int_equal(back.chunk.index, e.chunk.index);
        assert_int_equal(back.chunk.tokens, e.chunk.tokens);
        assert_int_equal(back.chunk.created_ms, 0);
        assert_int_equal(back.blocks, e.blocks);
        assert_int_equal(back.bytes, e.bytes);
        assert_int_equal(back.pinned_blocks, e.pinned_blocks);
        assert_int_equal(back.fp16_bytes, e.fp16_bytes);

        const size_t reserved[] = {65, 68, 100, 104, 228, 232};
        t_record_errors(t_parse_chunk_entry, buf, sizeof buf, reserved, 6);
        t_model_id_errors(t_parse_chunk_entry, buf, sizeof buf, 104);
        buf[64] = 3;
        assert_int_equal(kvedge_wire_chunk_entry_parse(buf, sizeof buf, &back), KVEDGE_EPROTO);
        if (i == 0) {
            buf[64] = 0;
            buf[40] = 1; /* parent bytes without a parent */
            assert_int_equal(kvedge_wire_chunk_entry_parse(buf, sizeof buf, &back), KVEDGE_EPROTO);
        }
    }
    kvedge_wire_chunk_entry_t e = {0};
    uint8_t buf[KVEDGE_WIRE_CHUNK_ENTRY_BYTES];
    t_fill_chunk(&e.chunk, 0);
    memset(e.chunk.model_id, 'x', KVEDGE_MODEL_ID_MAX_BYTES); /* the engine's longest */
    assert_int_equal(kvedge_wire_chunk_entry_pack(&e, buf), KVEDGE_EINVAL);
}

static void test_stats(void **state)
{
    (void)state;
    kvedge_engine_stats_t s, back;
    uint64_t *fields = (uint64_t *)&s; /* 17 u64 and nothing else */
    assert_int_equal(sizeof s, KVEDGE_WIRE_STATS_BYTES);
    for (int i = 0; i < 17; i++)
        fields[i] = 0x0101010101010101ull * (uint64_t)(i + 1) + ((uint64_t)i << 56);
    uint8_t buf[KVEDGE_WIRE_STATS_BYTES];
    kvedge_wire_stats_pack(&s, buf);
    assert_int_equal(buf[0], 1);
    assert_int_equal(buf[8 * 16], 17); /* bytes read last */
    assert_true(kvedge_le_get32(buf + 8 * 3) == (uint32_t)s.pinned_blocks);
    assert_true(kvedge_le_get32(buf + 8 * 13) == (uint32_t)s.evicted_bytes);
    assert_int_equal(kvedge_wire_stats_parse(buf, sizeof buf, &back), 0);
    assert_memory_equal(&back, &s, sizeof s);
    t_record_errors(t_parse_stats, buf, sizeof buf, NULL, 0);
}

static void test_node_info(void **state)
{
    (void)state;
    kvedge_wire_node_info_t n = {KVEDGE_ROLE_CLOUD,
                                 {0},
                                 KVEDGE_WIRE_MAX_FRAME_BYTES,
                                 KVEDGE_WIRE_MAX_ITEMS,
                                 KVEDGE_WIRE_MAX_CHUNKS,
                                 KVEDGE_WIRE_MAX_CREDIT,
                                 8},
                            back;
    for (int i = 0; i < 16; i++)
        n.tenant_tag[i] = (uint8_t)(0xF0 + i);
    uint8_t buf[KVEDGE_WIRE_NODE_INFO_BYTES];
    kvedge_wire_node_info_pack(&n, buf);
    assert_int_equal(buf[0], 1);
    assert_memory_equal(buf + 8, n.tenant_tag, 16);
    assert_int_equal(kvedge_le_get32(buf + 24), KVEDGE_WIRE_MAX_FRAME_BYTES);
    assert_int_equal(kvedge_le_get32(buf + 40), 8);
    assert_int_equal(kvedge_wire_node_info_parse(buf, sizeof buf, &back), 0);
    assert_memory_equal(&back, &n, sizeof n);

    const size_t reserved[] = {1, 8, 44, 64};
    t_record_errors(t_parse_node_info, buf, sizeof buf, reserved, 4);
    uint8_t bad[KVEDGE_WIRE_NODE_INFO_BYTES];
    const uint8_t roles[] = {0, 4, 255};
    for (size_t i = 0; i < sizeof roles; i++) {
        memcpy(bad, buf, sizeof bad);
        bad[0] = roles[i];
        assert_int_equal(kvedge_wire_node_info_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
    }
    /* Each limit: 0 and one past the protocol's are out of range. */
    const uint32_t limits[] = {KVEDGE_WIRE_MAX_FRAME_BYTES, KVEDGE_WIRE_MAX_ITEMS,
                               KVEDGE_WIRE_MAX_CHUNKS, KVEDGE_WIRE_MAX_CREDIT};
    for (int f = 0; f < 4; f++) {
        memcpy(bad, buf, sizeof bad);
        kvedge_le_put32(bad + 24 + 4 * f, 0);
        assert_int_equal(kvedge_wire_node_info_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
        kvedge_le_put32(bad + 24 + 4 * f, limits[f] + 1);
        assert_int_equal(kvedge_wire_node_info_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
    }
    memcpy(bad, buf, sizeof bad);
    kvedge_le_put32(bad + 40, 0); /* default credit 1 ... max credit */
    assert_int_equal(kvedge_wire_node_info_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
    kvedge_le_put32(bad + 36, 4);
    kvedge_le_put32(bad + 40, 5);
    assert_int_equal(kvedge_wire_node_info_parse(bad, sizeof bad, &back), KVEDGE_EPROTO);
    kvedge_le_put32(bad + 40, 4);
    assert_int_equal(kvedge_wire_node_info_parse(bad, sizeof bad, &back), 0);
}

static void test_stream_hdr(void **state)
{
    (void)state;
    const int32_t statuses[] = {0, KVEDGE_ENOTFOUND, KVEDGE_ECORRUPT};
    for (size_t i = 0; i < 3; i++) {
        kvedge_wire_stream_hdr_t s = {0xA1B2C3D4u, 0xE5F6, statuses[i]}, back;
        uint8_t buf[KVEDGE_WIRE_STREAM_HDR_BYTES];
        kvedge_wire_stream_hdr_pack(&s, buf);
        assert_memory_equal(buf, "\xD4\xC3\xB2\xA1\xF6\xE5\0\0", 8);
        assert_int_equal(kvedge_wire_stream_hdr_parse(buf, sizeof buf, &back), 0);
        assert_int_equal(back.chunk_index, s.chunk_index);
        assert_int_equal(back.head, s.head);
        assert_int_equal(back.status, s.status);
        const size_t reserved[] = {6, 8};
        t_record_errors(t_parse_stream_hdr, buf, sizeof buf, reserved, 2);
    }
    const int32_t bad[] = {1, KVEDGE_EINVAL, KVEDGE_EIO, KVEDGE_EPROTO, INT32_MIN};
    for (size_t i = 0; i < 5; i++) {
        kvedge_wire_stream_hdr_t s = {0, 0, bad[i]}, back;
        uint8_t buf[KVEDGE_WIRE_STREAM_HDR_BYTES];
        kvedge_wire_stream_hdr_pack(&s, buf);
        assert_int_equal(kvedge_wire_stream_hdr_parse(buf, sizeof buf, &back), KVEDGE_EPROTO);
    }
}

static int t_setup(void **state)
{
    (void)state;
    s_big = calloc(1, (size_t)KVEDGE_WIRE_MAX_FRAME_BYTES + 1);
    return s_big ? 0 : -1;
}

static int t_teardown(void **state)
{
    (void)state;
    free(s_big);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_names),
        cmocka_unit_test(test_fetch_messages),
        cmocka_unit_test(test_fetch_mapped),
        cmocka_unit_test(test_fetch_prec),
        cmocka_unit_test(test_header_round_trip),
        cmocka_unit_test(test_header_errors),
        cmocka_unit_test(test_valid_messages),
        cmocka_unit_test(test_frame_count),
        cmocka_unit_test(test_frame_sizes),
        cmocka_unit_test(test_monitor),
        cmocka_unit_test(test_count_limits),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_status),
        cmocka_unit_test(test_status_wire_round_trip),
        cmocka_unit_test(test_status_wire_unknown),
        cmocka_unit_test(test_deadline_and_credit),
        cmocka_unit_test(test_opcode_and_version),
        cmocka_unit_test(test_get_reply_items),
        cmocka_unit_test(test_get_layer_stream),
        cmocka_unit_test(test_get_layer_packed),
        cmocka_unit_test(test_list_request),
        cmocka_unit_test(test_no_reply_opcodes),
        cmocka_unit_test(test_key_round_trip),
        cmocka_unit_test(test_put_item),
        cmocka_unit_test(test_model_record),
        cmocka_unit_test(test_chunk_entry),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_node_info),
        cmocka_unit_test(test_stream_hdr),
    };
    return cmocka_run_group_tests(tests, t_setup, t_teardown);
}
