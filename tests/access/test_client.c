/* Client library against an in-process node: HELLO, ping, put/get for every scheme, PUT
 * batching, misses, GET_LAYER (sync, async, a 16 MiB layer), lookup, list/stat/pin/delete,
 * ENOSPACE, deadlines when the node dies, CURVE, malformed replies from a fake node, 16
 * concurrent clients, a stream whose consumer holds its credit and gives it back later, and
 * packed GET_LAYER and FETCH messages (bit-identical layers, the fallback, hostile packs). */
#define _GNU_SOURCE /* nftw */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "access/client_credit.h"
#include "access/frame.h"
#include "access/transport.h"
#include "runtime/log.h"
#include "store/engine/engine_debug.h"
#include "store/node/server.h"
#include "clients/lib/kvedge.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "tests/common/testutil.h"

#define MODEL     "opt-125m" /* built in: 12 layers, 12 KV heads, head dim 64, fp16 */
#define LAYERS    12
#define HEADS     12
#define HEAD_DIM  64
#define TOKENS    32  /* tokens per chunk unless a test says otherwise */
#define SHORT_MS  400 /* deadline of calls that are meant to time out */
#define N_THREADS 16

/* ---------------------------------------------------------------- fixture */

typedef struct {
    char dir[64];
    kvedge_engine_t *e;
    kvedge_server_t *s;
    kvedge_client_t *c;
} fx_t;

static int s_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int64_t s_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* bind NULL: an ephemeral loopback TCP port. no_pack: the node refuses packed GET_LAYER
 * streams as a node from before packing does. */
static void s_start_server_pack(fx_t *fx, const char *bind, bool no_pack)
{
    kvedge_server_opts_t so;
    memset(&so, 0, sizeof so);
    so.no_pack = no_pack;
    so.role = KVEDGE_ROLE_CLOUD;
    so.name = "test-node";
    so.bind = bind ? bind : "tcp://127.0.0.1:*";
    so.insecure = true;
    so.engine = fx->e;
    char why[256] = "";
    int rc = kvedge_server_start(&so, &fx->s, why, sizeof why);
    if (rc != 0)
        fail_msg("server: %s: %s", kvedge_errname(rc), why);
}

static void s_start_server(fx_t *fx, const char *bind)
{
    s_start_server_pack(fx, bind, false);
}

/* A client of the fixture's node; credit and deadline 0 take the defaults. */
static kvedge_client_t *s_connect_pack(fx_t *fx, uint32_t credit, int deadline_ms, bool no_pack)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = kvedge_server_endpoint(fx->s);
    o.no_pack = no_pack;
    if (credit) { /* exactly this credit: no widening past it */
        o.credit = credit;
        o.window_bytes = 1;
    }
    if (deadline_ms)
        o.deadline_ms = deadline_ms;
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    if (rc != 0)
        fail_msg("connect: %s", kvedge_errname(rc));
    return c;
}

static kvedge_client_t *s_connect(fx_t *fx, uint32_t credit, int deadline_ms)
{
    return s_connect_pack(fx, credit, deadline_ms, false);
}

/* A fresh directory and engine, no node. */
static int setup_bare(void **state)
{
    fx_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    strcpy(fx->dir, "/tmp/kvedge-test-client-XXXXXX");
    if (!mkdtemp(fx->dir)) {
        free(fx);
        return -1;
    }
    char path[128], why[256];
    snprintf(path, sizeof path, "%s/store", fx->dir);
    kvedge_engine_opts_t eo;
    kvedge_engine_opts_default(&eo);
    if (kvedge_engine_open(path, &eo, &fx->e, why, sizeof why) != 0) {
        nftw(fx->dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

/* A node over the engine and one connected client. */
static int setup(void **state)
{
    if (setup_bare(state) != 0)
        return -1;
    fx_t *fx = *state;
    s_start_server(fx, NULL);
    fx->c = s_connect(fx, 0, 0);
    return 0;
}

/* The same on an IPC endpoint in the test's directory: once the node is gone, nothing else
 * (another test process reusing an ephemeral port) can answer in its place. */
static int setup_ipc(void **state)
{
    if (setup_bare(state) != 0)
        return -1;
    fx_t *fx = *state;
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/node.ipc", fx->dir);
    s_start_server(fx, ep);
    fx->c = s_connect(fx, 0, 0);
    return 0;
}

static int teardown(void **state)
{
    fx_t *fx = *state;
    kvedge_client_destroy(&fx->c);
    kvedge_server_destroy(&fx->s);
    kvedge_engine_destroy(&fx->e);
    nftw(fx->dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
    free(fx);
    return 0;
}

/* ---------------------------------------------------------------- data */

/* Ids of a chain of n chunks of `tokens` tokens; seed picks the token values. */
static void s_chain(const char *model, uint32_t seed, size_t n, uint32_t tokens,
                    kvedge_chunk_id_t *ids)
{
    uint32_t *t = malloc(n * tokens * sizeof *t);
    assert_non_null(t);
    for (size_t i = 0; i < n * tokens; i++)
        t[i] = seed * 7919u + (uint32_t)i;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, model, t, n * tokens, tokens, ids, n), (int)n);
    free(t);
}

static kvedge_chunk_info_t s_info(const kvedge_chunk_id_t *ids, uint32_t i, const char *model,
                                  uint32_t tokens)
{
    kvedge_chunk_info_t c;
    memset(&c, 0, sizeof c);
    c.id = ids[i];
    if (i > 0) {
        c.parent = ids[i - 1];
        c.has_parent = true;
    }
    snprintf(c.model_id, sizeof c.model_id, "%s", model);
    c.index = i;
    c.tokens = tokens;
    return c;
}

/* An encoded block of synthetic K/V. */
static uint8_t *s_block(kvedge_scheme_t scheme, uint32_t tokens, uint16_t head_dim, uint64_t seed,
                        size_t *len)
{
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16,
                                scheme,
                                tokens,
                                head_dim,
                                scheme == KVEDGE_SCHEME_INT4 ? KVEDGE_BLOCK_INT4_GROUP_DEFAULT : 0,
                                NULL,
                                false};
    uint8_t *b = kt_encode(&spec, seed, len);
    assert_non_null(b);
    return b;
}

/* A set of blocks to put, keeping the encoded bytes to compare with. */
typedef struct {
    kvedge_put_item_t *items;
    uint8_t **blocks;
    size_t n;
} set_t;

/* Blocks for `layers` x heads [0, heads) of chunks [0, n_chunks) of ids, skipping one
 * (skip_chunk, skip_head) when skip_chunk >= 0. */
static set_t s_set(const kvedge_chunk_id_t *ids, size_t n_chunks, const char *model,
                   uint32_t tokens, uint16_t head_dim, uint16_t layer0, uint16_t layers,
                   uint16_t heads, kvedge_scheme_t scheme, int skip_chunk, int skip_head)
{
    set_t s;
    size_t max = n_chunks * layers * heads;
    s.items = calloc(max, sizeof *s.items);
    s.blocks = calloc(max, sizeof *s.blocks);
    s.n = 0;
    assert_true(s.items && s.blocks);
    for (uint32_t c = 0; c < n_chunks; c++)
        for (uint16_t l = layer0; l < layer0 + layers; l++)
            for (uint16_t h = 0; h < heads; h++) {
                if ((int)c == skip_chunk && (int)h == skip_head)
                    continue;
                kvedge_put_item_t *it = &s.items[s.n];
                it->chunk = s_info(ids, c, model, tokens);
                it->layer = l;
                it->head = h;
                size_t len;
                s.blocks[s.n] = s_block(scheme, tokens, head_dim,
                                        ids[c].bytes[0] * 1000003u + l * 131u + h, &len);
                it->block = s.blocks[s.n];
                it->len = len;
                s.n++;
            }
    return s;
}

static void s_set_free(set_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->blocks[i]);
    free(s->blocks);
    free(s->items);
    memset(s, 0, sizeof *s);
}

static void s_put_ok(kvedge_client_t *c, const set_t *s)
{
    int *st = calloc(s->n, sizeof *st);
    assert_non_null(st);
    int rc = kvedge_client_put(c, s->items, s->n, st);
    for (size_t i = 0; i < s->n; i++)
        if (st[i] != 0)
            fail_msg("item %zu: %s", i, kvedge_errname(st[i]));
    assert_int_equal(rc, 0);
    free(st);
}

static kvedge_block_key_t s_key(const kvedge_put_item_t *it)
{
    kvedge_block_key_t k = {it->chunk.id, it->layer, it->head};
    return k;
}

/* Gets every block of s back and compares bytes. */
static void s_get_check(kvedge_client_t *c, const set_t *s)
{
    kvedge_block_key_t *keys = calloc(s->n, sizeof *keys);
    kvedge_fetched_t *out = calloc(s->n, sizeof *out);
    size_t cap = 0;
    for (size_t i = 0; i < s->n; i++) {
        keys[i] = s_key(&s->items[i]);
        cap += s->items[i].len;
    }
    uint8_t *buf = malloc(cap);
    assert_true(keys && out && buf);
    assert_int_equal(kvedge_client_get(c, keys, s->n, buf, cap, out), 0);
    size_t off = 0;
    for (size_t i = 0; i < s->n; i++) {
        assert_int_equal(out[i].status, 0);
        assert_int_equal(out[i].offset, off); /* one after the other */
        assert_int_equal(out[i].len, s->items[i].len);
        assert_memory_equal(buf + out[i].offset, s->blocks[i], out[i].len);
        off += out[i].len;
    }
    free(buf);
    free(out);
    free(keys);
}

/* ---------------------------------------------------------------- arguments and HELLO */

static void test_args(void **state)
{
    fx_t *fx = *state;
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    assert_int_equal(o.deadline_ms, KVEDGE_CLIENT_DEADLINE_MS_DEFAULT);
    assert_int_equal(o.credit, KVEDGE_CLIENT_CREDIT_DEFAULT);
    assert_null(o.endpoint);
    kvedge_client_opts_default(NULL);

    kvedge_client_t *c = (kvedge_client_t *)&o; /* must be reset to NULL on failure */
    assert_int_equal(kvedge_client_connect(NULL, &c), KVEDGE_EINVAL);
    assert_null(c);
    assert_int_equal(kvedge_client_connect(&o, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL); /* no endpoint */
    o.endpoint = kvedge_server_endpoint(fx->s);
    o.server_key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"; /* without client_cert */
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    o.server_key = NULL;
    o.deadline_ms = -1;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    o.deadline_ms = 0;
    o.credit = KVEDGE_WIRE_MAX_CREDIT + 1;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    o.credit = 0;
    o.window_bytes = KVEDGE_CLIENT_WINDOW_MAX + 1;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    o.window_bytes = 0;
    o.name = "";
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    o.name = NULL;
    o.endpoint = "not an endpoint";
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);

    kvedge_client_destroy(NULL);
    c = NULL;
    kvedge_client_destroy(&c);
    assert_null(kvedge_client_node(NULL));

    kvedge_chunk_id_t id;
    memset(&id, 1, sizeof id);
    kvedge_block_key_t key = {id, 0, 0};
    kvedge_fetched_t f;
    uint8_t buf[16];
    size_t n, hit;
    bool more;
    kvedge_engine_stats_t st;
    kvedge_model_t m = {"m", 1, 1, 64, KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_client_ping(NULL, 0, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_ping(fx->c, KVEDGE_WIRE_MAX_PING_BYTES + 1, NULL, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_put_model(NULL, &m), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_put_model(fx->c, NULL), KVEDGE_EINVAL);
    m.layers = 0;
    assert_int_equal(kvedge_client_put_model(fx->c, &m), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_put(NULL, NULL, 0, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_put(fx->c, NULL, 1, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_put(fx->c, NULL, 0, NULL), 0);
    assert_int_equal(kvedge_client_get(fx->c, NULL, 1, buf, sizeof buf, &f), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_get(fx->c, &key, 1, NULL, 16, &f), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_get(fx->c, &key, 0, NULL, 0, NULL), 0);
    assert_int_equal(kvedge_client_get_layer_async(fx->c, &id, 0, 0, 0, NULL, NULL, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_get_layer_async(fx->c, &id, KVEDGE_WIRE_MAX_CHUNKS + 1, 0, 0,
                                                   NULL, NULL, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_get_layer_async(fx->c, &id, 1, 0, -1, NULL, NULL, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_get_layer(fx->c, &id, 0, 0, buf, sizeof buf, &f, 1, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_lookup(fx->c, &id, 1, NULL), KVEDGE_EINVAL);
    hit = 7;
    assert_int_equal(kvedge_client_lookup(fx->c, NULL, 0, &hit), 0);
    assert_int_equal(hit, 0);
    kvedge_chunk_entry_t e;
    assert_int_equal(kvedge_client_list(fx->c, NULL, &e, 0, &n, &more), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_list(fx->c, NULL, NULL, 1, &n, &more), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_stat(fx->c, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_stat(NULL, &st), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_delete(fx->c, NULL, 1, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_delete(fx->c, NULL, 0, NULL), 0);
    assert_int_equal(kvedge_client_pin(NULL, &id, 1, true, NULL), KVEDGE_EINVAL);

    /* Items that cannot be sent fail alone; the others are stored. */
    size_t len;
    uint8_t *b = s_block(KVEDGE_SCHEME_LOSSLESS, TOKENS, HEAD_DIM, 1, &len);
    kvedge_chunk_id_t ids[1];
    s_chain(MODEL, 1, 1, TOKENS, ids);
    kvedge_put_item_t items[3];
    memset(items, 0, sizeof items);
    for (int i = 0; i < 3; i++) {
        items[i].chunk = s_info(ids, 0, MODEL, TOKENS);
        items[i].head = (uint16_t)i;
        items[i].block = b;
        items[i].len = len;
    }
    items[0].block = NULL;             /* no block */
    items[2].chunk.model_id[0] = '\0'; /* no model id */
    int sts[3];
    assert_int_equal(kvedge_client_put(fx->c, items, 3, sts), KVEDGE_EINVAL);
    assert_int_equal(sts[0], KVEDGE_EINVAL);
    assert_int_equal(sts[1], 0);
    assert_int_equal(sts[2], KVEDGE_EINVAL);
    /* Node-side failures come back per item: a head outside the model's shape. */
    items[0].block = b;
    items[0].head = HEADS;
    assert_int_equal(kvedge_client_put(fx->c, items, 2, sts), KVEDGE_ESHAPE);
    assert_int_equal(sts[0], KVEDGE_ESHAPE);
    assert_int_equal(sts[1], 0);
    free(b);
}

static void test_hello(void **state)
{
    fx_t *fx = *state;
    const kvedge_node_info_t *n = kvedge_client_node(fx->c);
    assert_non_null(n);
    assert_int_equal(n->role, KVEDGE_ROLE_CLOUD);
    assert_string_equal(n->name, "test-node");
    assert_int_equal(n->max_items, KVEDGE_WIRE_MAX_ITEMS);
    assert_int_equal(n->max_chunks, KVEDGE_WIRE_MAX_CHUNKS);
    uint8_t tag[16];
    kvedge_tenant_tag(KVEDGE_LOOPBACK_TENANT, tag);
    assert_memory_equal(n->tenant_tag, tag, 16);
}

static void test_ping(void **state)
{
    fx_t *fx = *state;
    double rtt = -1, bw = -1;
    assert_int_equal(kvedge_client_ping(fx->c, 0, &rtt, &bw), 0);
    assert_true(rtt > 0 && rtt < 1e6);
    assert_true(bw == 0);
    assert_int_equal(kvedge_client_ping(fx->c, 1u << 20, &rtt, &bw), 0);
    assert_true(rtt > 0);
    assert_true(bw > 1e6); /* loopback moves more than 1 MB/s */
    assert_int_equal(kvedge_client_ping(fx->c, KVEDGE_WIRE_MAX_PING_BYTES, NULL, &bw), 0);
    assert_true(bw > 0);
    assert_int_equal(kvedge_client_ping(fx->c, 1, NULL, NULL), 0);
}

/* ---------------------------------------------------------------- put and get */

static void test_put_get_schemes(void **state)
{
    fx_t *fx = *state;
    const kvedge_scheme_t schemes[] = {KVEDGE_SCHEME_LOSSLESS, KVEDGE_SCHEME_INT8,
                                       KVEDGE_SCHEME_INT4};
    for (size_t i = 0; i < 3; i++) {
        kvedge_chunk_id_t ids[1];
        s_chain(MODEL, 100 + (uint32_t)i, 1, TOKENS, ids);
        set_t s = s_set(ids, 1, MODEL, TOKENS, HEAD_DIM, 0, 2, HEADS, schemes[i], -1, -1);
        assert_int_equal(s.n, 2 * HEADS);
        s_put_ok(fx->c, &s);
        s_get_check(fx->c, &s);
        /* Putting again is idempotent. */
        s_put_ok(fx->c, &s);
        s_get_check(fx->c, &s);
        s_set_free(&s);
    }
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_client_stat(fx->c, &st), 0);
    assert_int_equal(st.blocks, 3 * 2 * HEADS);
}

/* More items than one PUT or GET message carries: batched transparently. */
static void test_put_batches(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[8];
    s_chain(MODEL, 7, 8, 16, ids);
    set_t s = s_set(ids, 8, MODEL, 16, HEAD_DIM, 0, LAYERS, HEADS, KVEDGE_SCHEME_INT8, -1, -1);
    assert_true(s.n > KVEDGE_WIRE_MAX_ITEMS);
    s_put_ok(fx->c, &s);
    s_get_check(fx->c, &s);
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_client_stat(fx->c, &st), 0);
    assert_int_equal(st.blocks, s.n);
    s_set_free(&s);
}

static void test_get_missing(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[2];
    s_chain(MODEL, 3, 2, TOKENS, ids);
    set_t s = s_set(ids, 1, MODEL, TOKENS, HEAD_DIM, 5, 1, 1, KVEDGE_SCHEME_LOSSLESS, -1, -1);
    s_put_ok(fx->c, &s);
    kvedge_block_key_t keys[3] = {{ids[0], 5, 1}, s_key(&s.items[0]), {ids[1], 5, 0}};
    kvedge_fetched_t out[3];
    uint8_t *buf = malloc(s.items[0].len);
    assert_int_equal(kvedge_client_get(fx->c, keys, 3, buf, s.items[0].len, out), 0);
    assert_int_equal(out[0].status, KVEDGE_ENOTFOUND);
    assert_int_equal(out[0].len, 0);
    assert_int_equal(out[1].status, 0);
    assert_int_equal(out[1].offset, 0);
    assert_memory_equal(buf, s.blocks[0], s.items[0].len);
    assert_int_equal(out[2].status, KVEDGE_ENOTFOUND);
    free(buf);
    s_set_free(&s);
}

/* ---------------------------------------------------------------- GET_LAYER */

/* Layer 3 of a 2-chunk prefix, every head but (chunk 1, head 5). */
static set_t s_layer_set(fx_t *fx, kvedge_chunk_id_t ids[2])
{
    s_chain(MODEL, 11, 2, TOKENS, ids);
    set_t s = s_set(ids, 2, MODEL, TOKENS, HEAD_DIM, 3, 1, HEADS, KVEDGE_SCHEME_LOSSLESS, 1, 5);
    assert_int_equal(s.n, 2 * HEADS - 1);
    s_put_ok(fx->c, &s);
    return s;
}

/* The put item for (chunk, head) of a layer set, or NULL for the missing one. */
static const kvedge_put_item_t *s_item_of(const set_t *s, uint32_t chunk, uint16_t head,
                                          const uint8_t **block)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->items[i].chunk.index == chunk && s->items[i].head == head) {
            *block = s->blocks[i];
            return &s->items[i];
        }
    return NULL;
}

static void test_get_layer(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[2];
    set_t s = s_layer_set(fx, ids);
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    kvedge_fetched_t out[2 * HEADS];
    uint32_t heads = 0;
    assert_int_equal(kvedge_client_get_layer(fx->c, ids, 2, 3, buf, cap, out, 2 * HEADS, &heads),
                     0);
    assert_int_equal(heads, HEADS);
    size_t off = 0;
    for (uint32_t c = 0; c < 2; c++)
        for (uint16_t h = 0; h < HEADS; h++) {
            const kvedge_fetched_t *o = &out[c * HEADS + h];
            const uint8_t *block;
            const kvedge_put_item_t *it = s_item_of(&s, c, h, &block);
            if (!it) {
                assert_int_equal(o->status, KVEDGE_ENOTFOUND); /* a miss, not a failure */
                continue;
            }
            assert_int_equal(o->status, 0);
            assert_int_equal(o->offset, off);
            assert_int_equal(o->len, it->len);
            assert_memory_equal(buf + o->offset, block, it->len);
            off += it->len;
        }
    /* A layer with nothing stored: every head is a miss. */
    assert_int_equal(kvedge_client_get_layer(fx->c, ids, 2, 4, buf, cap, out, 2 * HEADS, &heads),
                     0);
    assert_int_equal(heads, HEADS);
    for (size_t i = 0; i < 2 * HEADS; i++)
        assert_int_equal(out[i].status, KVEDGE_ENOTFOUND);
    /* Chunks the node does not know: the stream ends with that status. */
    kvedge_chunk_id_t unknown[2];
    s_chain(MODEL, 12, 2, TOKENS, unknown);
    assert_int_equal(
        kvedge_client_get_layer(fx->c, unknown, 2, 3, buf, cap, out, 2 * HEADS, &heads),
        KVEDGE_ENOTFOUND);
    /* A layer outside the model. */
    assert_int_equal(
        kvedge_client_get_layer(fx->c, ids, 2, LAYERS, buf, cap, out, 2 * HEADS, &heads),
        KVEDGE_ESHAPE);
    free(buf);
    s_set_free(&s);
}

/* The engine's key of a put item: its chunk id namespaced for the loopback tenant, as the node
 * stores what a plaintext loopback client puts. */
static kvedge_block_key_t s_engine_key(const kvedge_put_item_t *it)
{
    uint8_t tag[16];
    kvedge_tenant_tag(KVEDGE_LOOPBACK_TENANT, tag);
    kvedge_block_key_t k = {.layer = it->layer, .head = it->head};
    kvedge_tenant_chunk_id(tag, &it->chunk.id, &k.chunk);
    return k;
}

/* Layer `layer` of ids through client c, with head (1, 7) made corrupt in the store first (it
 * is quarantined once read, so each fetch corrupts it again). */
static void s_layer_corrupt(fx_t *fx, kvedge_client_t *c, const set_t *s,
                            const kvedge_chunk_id_t *ids, uint16_t layer, uint8_t *buf, size_t cap,
                            kvedge_fetched_t *out)
{
    const uint8_t *block = NULL;
    const kvedge_put_item_t *it = s_item_of(s, 1, 7, &block);
    assert_non_null(it);
    uint8_t *bad = malloc(it->len);
    memcpy(bad, block, it->len);
    bad[it->len / 2] ^= 0x01;
    kvedge_block_key_t k = s_engine_key(it);
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k, bad, it->len), 0);
    free(bad);
    uint32_t heads = 0;
    memset(buf, 0, cap);
    assert_int_equal(kvedge_client_get_layer(c, ids, 2, layer, buf, cap, out, 2 * HEADS, &heads),
                     0);
    assert_int_equal(heads, HEADS);
    assert_int_equal(out[HEADS + 7].status, KVEDGE_ECORRUPT);
    assert_int_equal(out[HEADS + 5].status, KVEDGE_ENOTFOUND);
}

/* Packed data messages (the default) and one head per message (no_pack) deliver the same
 * layer, lossless and int8, misses and a corrupt head inside the packs included; and a node
 * that refuses packing (as nodes before it do) still serves a packing client, which falls back
 * to unpacked streams. */
static void test_get_layer_packed(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[2];
    s_chain(MODEL, 13, 2, TOKENS, ids);
    const kvedge_scheme_t schemes[] = {KVEDGE_SCHEME_LOSSLESS, KVEDGE_SCHEME_INT8};
    set_t sets[2];
    for (int i = 0; i < 2; i++) {
        sets[i] =
            s_set(ids, 2, MODEL, TOKENS, HEAD_DIM, (uint16_t)(3 + i), 1, HEADS, schemes[i], 1, 5);
        s_put_ok(fx->c, &sets[i]);
    }
    kvedge_client_t *unpacked = s_connect_pack(fx, 0, 0, true);
    size_t cap = 1 << 20;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    kvedge_fetched_t oa[2 * HEADS], ob[2 * HEADS];
    for (int round = 0; round < 2; round++) {
        if (round == 1) { /* the same against a node that does not pack */
            kvedge_client_destroy(&fx->c);
            kvedge_server_destroy(&fx->s);
            s_start_server_pack(fx, NULL, true);
            fx->c = s_connect(fx, 0, 0);
            kvedge_client_destroy(&unpacked);
            unpacked = s_connect_pack(fx, 0, 0, true);
        }
        for (int i = 0; i < 2; i++) {
            uint16_t layer = (uint16_t)(3 + i);
            s_layer_corrupt(fx, fx->c, &sets[i], ids, layer, a, cap, oa);
            s_layer_corrupt(fx, unpacked, &sets[i], ids, layer, b, cap, ob);
            size_t bytes = 0;
            for (int h = 0; h < 2 * HEADS; h++) {
                assert_int_equal(oa[h].status, ob[h].status);
                assert_int_equal(oa[h].offset, ob[h].offset);
                assert_int_equal(oa[h].len, ob[h].len);
                bytes = oa[h].offset + oa[h].len > bytes ? oa[h].offset + oa[h].len : bytes;
            }
            assert_true(bytes > 0);
            assert_memory_equal(a, b, bytes);
            /* and a second stream on the same connection (which, refused once, asks no more) */
            s_layer_corrupt(fx, fx->c, &sets[i], ids, layer, b, cap, ob);
            assert_memory_equal(a, b, bytes);
        }
    }
    kvedge_client_destroy(&unpacked);
    free(a);
    free(b);
    for (int i = 0; i < 2; i++)
        s_set_free(&sets[i]);
}

/* A node started while the last one's internal job queue name is still taken (libzmq releases
 * a closed socket's inproc names on its reaper thread, a moment later; here the test holds the
 * name) binds a name of its own and serves. A node that named its queue after its address,
 * where the new one is often allocated, bound nothing then: its workers never got a read and
 * every stream waited out the client's deadline (KVEDGE_ETIMEDOUT). */
static void test_restart_taken_queue(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[2];
    set_t s = s_layer_set(fx, ids);
    char old[128];
    assert_non_null(kvedge_server_jobs_endpoint(fx->s));
    snprintf(old, sizeof old, "%s", kvedge_server_jobs_endpoint(fx->s));
    assert_true(strncmp(old, "inproc://", 9) == 0);
    kvedge_client_destroy(&fx->c);
    kvedge_server_destroy(&fx->s);
    zsock_t *held = zsock_new(ZMQ_PULL);
    assert_non_null(held);
    kt_wait_for(zsock_bind(held, "%s", old) == 0, KT_WAIT_MS); /* once the reaper let go */
    s_start_server(fx, NULL);
    fx->c = s_connect(fx, 0, 0);
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    kvedge_fetched_t out[2 * HEADS];
    uint32_t heads = 0;
    int64_t t0 = kvedge_mono_ms();
    int rc = kvedge_client_get_layer(fx->c, ids, 2, 3, buf, cap, out, 2 * HEADS, &heads);
    if (rc != 0)
        fail_msg("%s after %lld ms", kvedge_errname(rc), (long long)(kvedge_mono_ms() - t0));
    assert_int_equal(heads, HEADS);
    assert_int_equal(out[HEADS + 5].status, KVEDGE_ENOTFOUND);
    assert_string_not_equal(kvedge_server_jobs_endpoint(fx->s), old);
    zsock_destroy(&held);
    free(buf);
    s_set_free(&s);
}

/* A node started right after another one stopped serves its streams at once, cycle after
 * cycle. A new node is often allocated where the last one was, while libzmq may still hold the
 * old node's internal endpoints for a moment: a node that named them after its address bound
 * nothing then, and every stream it opened waited out the client's deadline
 * (KVEDGE_ETIMEDOUT) for reads its workers never got. */
static void test_restart_streams(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[2];
    set_t s = s_layer_set(fx, ids);
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    kvedge_fetched_t out[2 * HEADS];
    for (int cycle = 0; cycle < 200; cycle++) {
        kvedge_client_destroy(&fx->c);
        kvedge_server_destroy(&fx->s);
        s_start_server(fx, NULL);
        fx->c = s_connect(fx, 0, 0);
        uint32_t heads = 0;
        int64_t t0 = kvedge_mono_ms();
        int rc = kvedge_client_get_layer(fx->c, ids, 2, 3, buf, cap, out, 2 * HEADS, &heads);
        if (rc != 0)
            fail_msg("cycle %d: %s after %lld ms", cycle, kvedge_errname(rc),
                     (long long)(kvedge_mono_ms() - t0));
        assert_int_equal(heads, HEADS);
        assert_int_equal(out[HEADS + 5].status, KVEDGE_ENOTFOUND);
    }
    free(buf);
    s_set_free(&s);
}

/* What the async callbacks saw. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const set_t *set;
    uint32_t blocks, bad, done_calls, heads;
    int status;
    int64_t done_ms;
    /* Gate: on_block waits for `open` after signalling `entered`. */
    bool gate, entered, open;
    /* When set, on_done starts another stream on this client and keeps the result. */
    kvedge_client_t *chain;
    const kvedge_chunk_id_t *chain_ids;
    int chain_rc;
} seen_t;

static void seen_init(seen_t *v, const set_t *set)
{
    memset(v, 0, sizeof *v);
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->cv, NULL);
    v->set = set;
}

static void seen_fini(seen_t *v)
{
    pthread_cond_destroy(&v->cv);
    pthread_mutex_destroy(&v->mu);
}

static void on_block(void *ctx, uint32_t chunk, uint16_t head, int status, const uint8_t *data,
                     size_t len)
{
    seen_t *v = ctx;
    pthread_mutex_lock(&v->mu);
    if (v->gate && !v->entered) {
        v->entered = true;
        pthread_cond_broadcast(&v->cv);
        while (!v->open)
            pthread_cond_wait(&v->cv, &v->mu);
    }
    uint32_t seq = v->blocks++;
    if (chunk != seq / HEADS || head != seq % HEADS)
        v->bad++; /* out of order */
    if (v->set) {
        const uint8_t *block = NULL;
        const kvedge_put_item_t *it = s_item_of(v->set, chunk, head, &block);
        if (it ? status != 0 || len != it->len || memcmp(data, block, len) != 0
               : status != KVEDGE_ENOTFOUND || data != NULL)
            v->bad++;
    }
    pthread_mutex_unlock(&v->mu);
}

static void on_done(void *ctx, int status, uint32_t heads)
{
    seen_t *v = ctx;
    int chain_rc = 0;
    if (v->chain) /* a client closing refuses new work, without deadlock and callback */
        chain_rc =
            kvedge_client_get_layer_async(v->chain, v->chain_ids, 1, 0, 0, on_block, on_done, v);
    pthread_mutex_lock(&v->mu);
    v->chain_rc = chain_rc;
    v->done_calls++;
    v->status = status;
    v->heads = heads;
    v->done_ms = s_ms();
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
}

static void seen_wait(seen_t *v)
{
    pthread_mutex_lock(&v->mu);
    while (v->done_calls == 0)
        pthread_cond_wait(&v->cv, &v->mu);
    pthread_mutex_unlock(&v->mu);
}

/* Zero-copy receive: every block of a GET_LAYER stream taken in its callback as a
 * kvedge_block_ref_t, read after the stream ended. */
typedef struct {
    pthread_mutex_t mu;
    kvedge_block_ref_t *ref[2 * HEADS];
    const uint8_t *data[2 * HEADS];
    size_t len[2 * HEADS];
    uint32_t chunk[2 * HEADS];
    uint16_t head[2 * HEADS];
    uint32_t n;
    int twice; /* a second take in the same callback returned something */
    bool done;
} refs_t;

static void on_block_take(void *ctx, uint32_t chunk, uint16_t head, int status, const uint8_t *data,
                          size_t len)
{
    refs_t *r = ctx;
    pthread_mutex_lock(&r->mu);
    if (status == 0 && r->n < 2 * HEADS) {
        r->ref[r->n] = kvedge_client_block_take();
        r->twice += kvedge_client_block_take() != NULL;
        r->data[r->n] = data;
        r->len[r->n] = len;
        r->chunk[r->n] = chunk;
        r->head[r->n] = head;
        r->n++;
    }
    pthread_mutex_unlock(&r->mu);
}

static void on_done_take(void *ctx, int status, uint32_t heads)
{
    (void)status, (void)heads;
    refs_t *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->done = true;
    pthread_mutex_unlock(&r->mu);
}

static bool s_refs_done(void *ctx)
{
    refs_t *r = ctx;
    pthread_mutex_lock(&r->mu);
    bool done = r->done;
    pthread_mutex_unlock(&r->mu);
    return done;
}

static void test_block_ref(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[2];
    set_t s = s_layer_set(fx, ids);
    refs_t r;
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.mu, NULL);
    assert_null(kvedge_client_block_take()); /* outside a callback */
    assert_int_equal(
        kvedge_client_get_layer_async(fx->c, ids, 2, 3, 0, on_block_take, on_done_take, &r), 0);
    kt_wait_until(s_refs_done, &r, 10000);
    uint32_t hits = 0; /* the set leaves some heads out: those are misses, nothing to take */
    for (uint32_t i = 0; i < 2 * HEADS; i++) {
        const uint8_t *block;
        hits += s_item_of(&s, i / HEADS, (uint16_t)(i % HEADS), &block) != NULL;
    }
    assert_true(hits > 0);
    assert_int_equal(r.n, hits);
    assert_int_equal(r.twice, 0);
    for (uint32_t i = 0; i < r.n; i++) {
        /* The bytes the callback was given, still there after the stream ended. */
        assert_non_null(r.ref[i]);
        size_t len = 0;
        assert_ptr_equal(kvedge_block_ref_data(r.ref[i], &len), r.data[i]);
        assert_int_equal(len, r.len[i]);
        const uint8_t *block = NULL;
        const kvedge_put_item_t *it = s_item_of(&s, r.chunk[i], r.head[i], &block);
        assert_non_null(it);
        assert_int_equal(len, it->len);
        assert_memory_equal(r.data[i], block, len);
        kvedge_client_block_free(r.ref[i]);
    }
    size_t len = 1;
    assert_null(kvedge_block_ref_data(NULL, &len));
    assert_int_equal(len, 0);
    kvedge_client_block_free(NULL);
    pthread_mutex_destroy(&r.mu);
    s_set_free(&s);
}

static void test_get_layer_async(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[2];
    set_t s = s_layer_set(fx, ids);
    seen_t v;
    seen_init(&v, &s);
    assert_int_equal(kvedge_client_get_layer_async(fx->c, ids, 2, 3, 0, on_block, on_done, &v), 0);
    seen_wait(&v);
    assert_int_equal(v.status, 0);
    assert_int_equal(v.heads, 2 * HEADS);
    assert_int_equal(v.blocks, 2 * HEADS);
    assert_int_equal(v.bad, 0);
    /* Several streams at once, with a small credit. */
    kvedge_client_t *c2 = s_connect(fx, 2, 0);
    seen_t w[4];
    for (int i = 0; i < 4; i++) {
        seen_init(&w[i], &s);
        assert_int_equal(kvedge_client_get_layer_async(c2, ids, 2, 3, 0, on_block, on_done, &w[i]),
                         0);
    }
    for (int i = 0; i < 4; i++) {
        seen_wait(&w[i]);
        assert_int_equal(w[i].status, 0);
        assert_int_equal(w[i].blocks, 2 * HEADS);
        assert_int_equal(w[i].bad, 0);
        seen_fini(&w[i]);
    }
    kvedge_client_destroy(&c2);
    kt_pause_ms(50);                   /* a window for a second done call to show up: none may */
    assert_int_equal(v.done_calls, 1); /* exactly once */
    seen_fini(&v);
    s_set_free(&s);
}

/* One layer of one chunk of 16 MiB: 8 heads of 2 MiB blocks. */
static void test_big_layer(void **state)
{
    fx_t *fx = *state;
    kvedge_model_t m = {"test-big", 2, 8, 128, KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_client_put_model(fx->c, &m), 0);
    assert_int_equal(kvedge_client_put_model(fx->c, &m), 0); /* idempotent */
    kvedge_model_t other = m;
    other.kv_heads = 4;
    assert_int_equal(kvedge_client_put_model(fx->c, &other), KVEDGE_ESHAPE);

    const uint32_t tokens = 4096; /* 4096 x 128 x fp16 x (K + V) = 2 MiB per head */
    kvedge_chunk_id_t ids[1];
    s_chain(m.id, 5, 1, tokens, ids);
    set_t s = s_set(ids, 1, m.id, tokens, 128, 1, 1, 8, KVEDGE_SCHEME_LOSSLESS, -1, -1);
    size_t total = 0;
    for (size_t i = 0; i < s.n; i++)
        total += s.items[i].len;
    assert_true(total >= 16u << 20);
    s_put_ok(fx->c, &s);

    uint8_t *buf = malloc(total);
    kvedge_fetched_t out[8];
    uint32_t credits[] = {0, 2, 1};
    for (size_t k = 0; k < 3; k++) {
        kvedge_client_t *c = credits[k] ? s_connect(fx, credits[k], 0) : fx->c;
        uint32_t heads = 0;
        memset(buf, 0, total);
        assert_int_equal(kvedge_client_get_layer(c, ids, 1, 1, buf, total, out, 8, &heads), 0);
        assert_int_equal(heads, 8);
        for (size_t i = 0; i < 8; i++) {
            assert_int_equal(out[i].status, 0);
            assert_int_equal(out[i].len, s.items[i].len);
            assert_memory_equal(buf + out[i].offset, s.blocks[i], out[i].len);
        }
        if (c != fx->c)
            kvedge_client_destroy(&c);
    }
    free(buf);
    s_set_free(&s);
}

/* ---------------------------------------------------------------- held credit */

typedef struct {
    atomic_uint got;
    atomic_uint holds; /* messages whose credit is held: one per message, packed or not */
    atomic_uint_fast64_t stream;
    atomic_int done, status;
} hold_t;

/* Holds every message's credit (access/client_credit.h), as the loader does for a block it
 * has no slot for yet. */
static void s_hold_block(void *ctx, uint32_t chunk, uint16_t head, int status, const uint8_t *data,
                         size_t len)
{
    (void)chunk, (void)head, (void)status, (void)data, (void)len;
    hold_t *h = ctx;
    uint64_t id = kvedge_client_credit_hold();
    if (id) {
        atomic_store(&h->stream, id);
        atomic_fetch_add(&h->holds, 1);
    }
    atomic_fetch_add(&h->got, 1);
}

static void s_hold_done(void *ctx, int status, uint32_t heads)
{
    (void)heads;
    hold_t *h = ctx;
    atomic_store(&h->status, status);
    atomic_store(&h->done, 1);
}

/* One stream of the layer set whose consumer holds every message's credit, through a client of
 * credit 2: no more than 2 data messages come (2 heads unpacked; packed, each message may
 * carry many, but one credit is held per message, not per head) until credit is given back
 * from this thread, which lets it finish. */
static void s_credit_held_run(fx_t *fx, const kvedge_chunk_id_t *ids, size_t n, bool no_pack)
{
    kvedge_client_t *c = s_connect_pack(fx, 2, 10000, no_pack);
    hold_t h;
    memset(&h, 0, sizeof h);
    assert_int_equal(kvedge_client_get_layer_async(c, ids, n, 3, 0, s_hold_block, s_hold_done, &h),
                     0);
    kt_wait_for(atomic_load(&h.holds) >= 2, KT_WAIT_MS);
    assert_int_equal(atomic_load(&h.holds), 2);
    unsigned first = atomic_load(&h.got);
    if (no_pack)
        assert_int_equal(first, 2);
    uint64_t stream = atomic_load(&h.stream);
    assert_true(stream > 0);
    kt_pause_ms(200); /* a bounded look: nothing more may come while the credit is held */
    assert_int_equal(atomic_load(&h.holds), 2);
    assert_int_equal(atomic_load(&h.got), first);
    assert_int_equal(atomic_load(&h.done), 0);

    unsigned returned = 0;
    /* Gives back each message's credit as it comes, until the stream ends. */
    for (int64_t until = s_ms() + KT_WAIT_MS; !atomic_load(&h.done) && s_ms() < until;) {
        unsigned held = atomic_load(&h.holds);
        if (held > returned) {
            assert_int_equal(kvedge_client_credit_return(c, stream, held - returned), 0);
            returned = held;
        }
        kt_pause_ms(KT_POLL_MS);
    }
    assert_int_equal(atomic_load(&h.done), 1);
    assert_int_equal(atomic_load(&h.status), 0);
    assert_int_equal(atomic_load(&h.got), n * HEADS); /* a missing head's status too */
    if (no_pack)
        assert_int_equal(atomic_load(&h.holds), n * HEADS);
    else
        assert_true(atomic_load(&h.holds) < n * HEADS);             /* it did pack */
    assert_int_equal(kvedge_client_credit_return(c, stream, 1), 0); /* ended: ignored */
    double rtt = 0;
    assert_int_equal(kvedge_client_ping(c, 0, &rtt, NULL), 0);
    kvedge_client_destroy(&c);
}

/* A stream whose consumer holds its credit gets no more than the credit it started with; the
 * credit given back later (from another thread) lets it finish, with one head per data message
 * and packed. Credit for a stream that has ended is ignored; hold outside a callback holds
 * nothing. */
static void test_credit_held(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[2];
    set_t s = s_layer_set(fx, ids);
    assert_int_equal(kvedge_client_credit_hold(), 0);
    assert_int_equal(kvedge_client_credit_return(NULL, 1, 1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_credit_return(fx->c, 0, 1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_credit_return(fx->c, 1, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_credit_return(fx->c, 1, KVEDGE_WIRE_MAX_CREDIT + 1),
                     KVEDGE_EINVAL);
    s_credit_held_run(fx, ids, 2, true);
    /* Packed: enough heads that credit 2 cannot carry them all (a worker reads 16 at a time). */
    kvedge_chunk_id_t many[16];
    s_chain(MODEL, 17, 16, TOKENS, many);
    set_t m = s_set(many, 16, MODEL, TOKENS, HEAD_DIM, 3, 1, HEADS, KVEDGE_SCHEME_INT8, -1, -1);
    s_put_ok(fx->c, &m);
    s_credit_held_run(fx, many, 16, false);
    s_set_free(&m);
    s_set_free(&s);
}

/* ---------------------------------------------------------------- chunk operations */

static void test_lookup(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[3];
    s_chain(MODEL, 21, 3, TOKENS, ids);
    /* LOOKUP counts a chunk only when every layer and head of its model is there. */
    set_t s = s_set(ids, 2, MODEL, TOKENS, HEAD_DIM, 0, LAYERS, HEADS, KVEDGE_SCHEME_INT4, -1, -1);
    s_put_ok(fx->c, &s);
    size_t hit = 99;
    assert_int_equal(kvedge_client_lookup(fx->c, ids, 3, &hit), 0);
    assert_int_equal(hit, 2);
    assert_int_equal(kvedge_client_lookup(fx->c, ids, 1, &hit), 0);
    assert_int_equal(hit, 1);
    assert_int_equal(kvedge_client_lookup(fx->c, ids + 2, 1, &hit), 0);
    assert_int_equal(hit, 0);
    kvedge_chunk_id_t rev[3] = {ids[2], ids[0], ids[1]};
    assert_int_equal(kvedge_client_lookup(fx->c, rev, 3, &hit), 0);
    assert_int_equal(hit, 0);
    s_set_free(&s);
}

static int s_id_cmp(const void *a, const void *b)
{
    return memcmp(a, b, KVEDGE_CHUNK_ID_BYTES);
}

static void test_list_stat_pin_delete(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[2];
    s_chain(MODEL, 31, 2, TOKENS, ids);
    set_t s = s_set(ids, 2, MODEL, TOKENS, HEAD_DIM, 0, 1, 3, KVEDGE_SCHEME_INT8, -1, -1);
    s_put_ok(fx->c, &s);
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_client_stat(fx->c, &st), 0);
    assert_int_equal(st.blocks, 6);
    assert_true(st.puts >= 6);

    kvedge_chunk_entry_t e[10];
    size_t n = 0;
    bool more = true;
    assert_int_equal(kvedge_client_list(fx->c, NULL, e, 10, &n, &more), 0);
    assert_int_equal(n, 2);
    assert_false(more);
    kvedge_chunk_id_t sorted[2] = {ids[0], ids[1]};
    qsort(sorted, 2, sizeof sorted[0], s_id_cmp);
    for (size_t i = 0; i < 2; i++) {
        assert_memory_equal(e[i].chunk.id.bytes, sorted[i].bytes, KVEDGE_CHUNK_ID_BYTES);
        bool second = memcmp(e[i].chunk.id.bytes, ids[1].bytes, KVEDGE_CHUNK_ID_BYTES) == 0;
        assert_int_equal(e[i].chunk.has_parent, second);
        if (second)
            assert_memory_equal(e[i].chunk.parent.bytes, ids[0].bytes, KVEDGE_CHUNK_ID_BYTES);
        assert_int_equal(e[i].chunk.index, second ? 1 : 0);
        assert_int_equal(e[i].chunk.tokens, TOKENS);
        assert_string_equal(e[i].chunk.model_id, MODEL);
        assert_int_equal(e[i].blocks, 3);
        assert_int_equal(e[i].pinned_blocks, 0);
        assert_true(e[i].bytes > 0 && e[i].fp16_bytes == 3 * 2ull * TOKENS * HEAD_DIM * 2);
    }
    /* Paging. */
    assert_int_equal(kvedge_client_list(fx->c, NULL, e, 1, &n, &more), 0);
    assert_int_equal(n, 1);
    assert_true(more);
    kvedge_chunk_id_t cursor = e[0].chunk.id;
    assert_int_equal(kvedge_client_list(fx->c, &cursor, e, 1, &n, &more), 0);
    assert_int_equal(n, 1);
    assert_false(more);
    assert_memory_equal(e[0].chunk.id.bytes, sorted[1].bytes, KVEDGE_CHUNK_ID_BYTES);

    uint32_t changed[2] = {99, 99};
    assert_int_equal(kvedge_client_pin(fx->c, ids, 1, true, changed), 0);
    assert_int_equal(changed[0], 3);
    assert_int_equal(kvedge_client_pin(fx->c, ids, 1, true, changed), 0);
    assert_int_equal(changed[0], 0);
    assert_int_equal(kvedge_client_stat(fx->c, &st), 0);
    assert_int_equal(st.pinned_blocks, 3);
    assert_int_equal(kvedge_client_pin(fx->c, ids, 2, false, changed), 0);
    assert_int_equal(changed[0], 3);
    assert_int_equal(changed[1], 0);
    assert_int_equal(kvedge_client_pin(fx->c, ids, 2, true, NULL), 0);

    /* Deleting the first chunk takes the one chained below it too. */
    assert_int_equal(kvedge_client_delete(fx->c, ids, 1, changed), 0);
    assert_int_equal(changed[0], 6);
    assert_int_equal(kvedge_client_stat(fx->c, &st), 0);
    assert_int_equal(st.blocks, 0);
    size_t hit = 9;
    assert_int_equal(kvedge_client_lookup(fx->c, ids, 2, &hit), 0);
    assert_int_equal(hit, 0);
    assert_int_equal(kvedge_client_list(fx->c, NULL, e, 10, &n, &more), 0);
    assert_int_equal(n, 0);
    assert_false(more);
    s_set_free(&s);
}

/* ---------------------------------------------------------------- ENOSPACE */

static void test_enospace(void **state)
{
    fx_t *fx = *state;
    kvedge_chunk_id_t ids[1];
    s_chain(MODEL, 41, 1, TOKENS, ids);
    set_t s = s_set(ids, 1, MODEL, TOKENS, HEAD_DIM, 0, 1, HEADS, KVEDGE_SCHEME_LOSSLESS, -1, -1);
    s_put_ok(fx->c, &s);
    size_t len = s.items[0].len; /* lossless: every block has the same size */
    kvedge_block_key_t keys[3] = {s_key(&s.items[0]), s_key(&s.items[1]), {ids[0], 9, 0}};
    kvedge_fetched_t out[HEADS];
    uint8_t *buf = malloc(len * HEADS);
    assert_int_equal(kvedge_client_get(fx->c, keys, 3, buf, len + len / 2, out), KVEDGE_ENOSPACE);
    assert_int_equal(out[0].status, 0);
    assert_int_equal(out[0].offset, 0);
    assert_memory_equal(buf, s.blocks[0], len);
    assert_int_equal(out[1].status, KVEDGE_ENOSPACE);
    assert_int_equal(out[1].len, len); /* what it would need */
    assert_int_equal(out[2].status, KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_client_get(fx->c, keys, 1, NULL, 0, out), KVEDGE_ENOSPACE);
    assert_int_equal(out[0].status, KVEDGE_ENOSPACE);

    /* GET_LAYER: buffer for one head. */
    uint32_t heads = 0;
    assert_int_equal(kvedge_client_get_layer(fx->c, ids, 1, 0, buf, len, out, HEADS, &heads),
                     KVEDGE_ENOSPACE);
    assert_int_equal(heads, HEADS);
    assert_int_equal(out[0].status, 0);
    assert_memory_equal(buf, s.blocks[0], len);
    for (size_t i = 1; i < HEADS; i++)
        assert_int_equal(out[i].status, KVEDGE_ENOSPACE);
    /* GET_LAYER: room for 4 entries of 12. */
    assert_int_equal(kvedge_client_get_layer(fx->c, ids, 1, 0, buf, len * HEADS, out, 4, &heads),
                     KVEDGE_ENOSPACE);
    assert_int_equal(heads, HEADS);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(out[i].status, 0);
        assert_memory_equal(buf + out[i].offset, s.blocks[i], len);
    }
    free(buf);
    s_set_free(&s);
}

/* ---------------------------------------------------------------- deadlines */

static void test_deadline(void **state)
{
    fx_t *fx = *state;
    const int deadline = 1000;
    /* One head per data message: a gated first block leaves the stream mid-way (packed, the
     * node may have sent the whole layer already). */
    kvedge_client_t *c = s_connect_pack(fx, 0, deadline, true);
    kvedge_chunk_id_t ids[2];
    s_chain(MODEL, 51, 2, TOKENS, ids);
    set_t s = s_set(ids, 2, MODEL, TOKENS, HEAD_DIM, 0, 1, HEADS, KVEDGE_SCHEME_LOSSLESS, -1, -1);
    s_put_ok(c, &s);

    /* Mid-stream: the first block holds the I/O thread while the node goes away. */
    seen_t v;
    seen_init(&v, &s);
    v.gate = true;
    int64_t t0 = s_ms();
    assert_int_equal(kvedge_client_get_layer_async(c, ids, 2, 0, 0, on_block, on_done, &v), 0);
    pthread_mutex_lock(&v.mu);
    while (!v.entered)
        pthread_cond_wait(&v.cv, &v.mu);
    pthread_mutex_unlock(&v.mu);
    kvedge_server_destroy(&fx->s);
    pthread_mutex_lock(&v.mu);
    v.open = true;
    pthread_cond_broadcast(&v.cv);
    pthread_mutex_unlock(&v.mu);
    seen_wait(&v);
    /* The node ends its streams with ECLOSED as it shuts down; a client that misses that
     * end message (it may already be gone) times out. Either way: by the deadline. */
    if (v.status != KVEDGE_ECLOSED && v.status != KVEDGE_ETIMEDOUT)
        fail_msg("stream ended with %d, want ECLOSED or ETIMEDOUT", v.status);
    assert_true(v.blocks < 2 * HEADS);
    assert_int_equal(v.bad, 0);
    assert_true(v.done_ms - t0 <= deadline + KT_SLACK_MS);

    /* Calls on a dead node return by their deadline. */
    kvedge_block_key_t key = s_key(&s.items[0]);
    kvedge_fetched_t out;
    uint8_t buf[64];
    t0 = s_ms();
    assert_int_equal(kvedge_client_get(c, &key, 1, buf, sizeof buf, &out), KVEDGE_ETIMEDOUT);
    int64_t took = s_ms() - t0;
    assert_true(took >= deadline - 10 && took <= deadline + KT_SLACK_MS);
    assert_int_equal(out.status, KVEDGE_ETIMEDOUT);
    int st[1];
    t0 = s_ms();
    assert_int_equal(kvedge_client_put(c, s.items, 1, st), KVEDGE_ETIMEDOUT);
    assert_int_equal(st[0], KVEDGE_ETIMEDOUT);
    assert_true(s_ms() - t0 <= deadline + KT_SLACK_MS);
    uint32_t heads;
    kvedge_fetched_t lo[2 * HEADS];
    t0 = s_ms();
    assert_int_equal(kvedge_client_get_layer(c, ids, 2, 0, buf, sizeof buf, lo, 2 * HEADS, &heads),
                     KVEDGE_ETIMEDOUT);
    assert_true(s_ms() - t0 <= deadline + KT_SLACK_MS);

    /* Destroy with a stream in flight: it ends with KVEDGE_ECLOSED, once. */
    seen_t w;
    seen_init(&w, NULL);
    w.chain = c;
    w.chain_ids = ids;
    assert_int_equal(kvedge_client_get_layer_async(c, ids, 2, 0, 60000, on_block, on_done, &w), 0);
    kvedge_client_destroy(&c);
    pthread_mutex_lock(&w.mu);
    assert_int_equal(w.done_calls, 1);
    assert_int_equal(w.status, KVEDGE_ECLOSED);
    assert_int_equal(w.chain_rc, KVEDGE_ECLOSED);
    pthread_mutex_unlock(&w.mu);

    /* Connecting to nothing. */
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = "tcp://127.0.0.1:1";
    o.deadline_ms = SHORT_MS;
    t0 = s_ms();
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_ETIMEDOUT);
    assert_null(c);
    assert_true(s_ms() - t0 <= SHORT_MS + KT_SLACK_MS);
    seen_fini(&v);
    seen_fini(&w);
    s_set_free(&s);
}

/* ---------------------------------------------------------------- CURVE */

static void test_curve(void **state)
{
    fx_t *fx = *state;
    char server_cert[128], clients[128], client_cert[128], stranger_cert[128], pub_only[128],
        allowed[160];
    snprintf(server_cert, sizeof server_cert, "%s/server.cert", fx->dir);
    snprintf(clients, sizeof clients, "%s/clients", fx->dir);
    snprintf(client_cert, sizeof client_cert, "%s/client.cert", fx->dir);
    snprintf(stranger_cert, sizeof stranger_cert, "%s/stranger.cert", fx->dir);
    snprintf(pub_only, sizeof pub_only, "%s/public-only.cert", fx->dir);
    snprintf(allowed, sizeof allowed, "%s/client.cert", clients);
    assert_int_equal(mkdir(clients, 0700), 0);
    zcert_t *sc = zcert_new(), *cc = zcert_new(), *xc = zcert_new(), *other = zcert_new();
    assert_int_equal(zcert_save(sc, server_cert), 0);
    assert_int_equal(zcert_save(cc, client_cert), 0);
    assert_int_equal(zcert_save_public(cc, allowed), 0);
    assert_int_equal(zcert_save(xc, stranger_cert), 0);
    assert_int_equal(zcert_save_public(xc, pub_only), 0);

    kvedge_server_opts_t so;
    memset(&so, 0, sizeof so);
    so.role = KVEDGE_ROLE_EDGE;
    so.bind = "tcp://127.0.0.1:*";
    so.cert = server_cert;
    so.clients_dir = clients;
    so.engine = fx->e;
    char why[256] = "";
    int rc = kvedge_server_start(&so, &fx->s, why, sizeof why);
    if (rc != 0)
        fail_msg("server: %s: %s", kvedge_errname(rc), why);
    const char *key = kvedge_server_public_key(fx->s);
    assert_non_null(key);

    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = kvedge_server_endpoint(fx->s);
    o.server_key = key;
    o.client_cert = client_cert;
    o.deadline_ms = 2000;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    assert_int_equal(kvedge_client_node(c)->role, KVEDGE_ROLE_EDGE);
    uint8_t tag[16];
    kvedge_tenant_tag(zcert_public_txt(cc), tag); /* no tenant metadata: the key itself */
    assert_memory_equal(kvedge_client_node(c)->tenant_tag, tag, 16);
    assert_int_equal(kvedge_client_ping(c, 1000, NULL, NULL), 0);
    kvedge_client_destroy(&c);

    /* The node's key as a certificate file. */
    o.server_key = server_cert;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    kvedge_client_destroy(&c);

    /* Refusals are silent: no answer within the deadline. */
    o.deadline_ms = SHORT_MS;
    o.server_key = key;
    o.client_cert = stranger_cert;
    int64_t t0 = s_ms();
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_ETIMEDOUT);
    assert_true(s_ms() - t0 <= SHORT_MS + KT_SLACK_MS);
    o.client_cert = client_cert;
    o.server_key = zcert_public_txt(other);
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_ETIMEDOUT);

    /* Unusable key material. */
    o.server_key = key;
    o.client_cert = pub_only; /* no secret key */
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EIO);
    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.cert", fx->dir);
    o.client_cert = missing;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EIO);
    o.client_cert = client_cert;
    o.server_key = missing;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EIO);
    o.server_key = "0123456789012345678901234567890123456789\x01";
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EIO);
    assert_null(c);
    zcert_destroy(&sc);
    zcert_destroy(&cc);
    zcert_destroy(&xc);
    zcert_destroy(&other);
}

/* ---------------------------------------------------------------- a misbehaving node */

enum {
    FAKE_GOOD,        /* STAT: a correct reply */
    FAKE_NO_PAYLOAD,  /* STAT without its frame */
    FAKE_VERSION,     /* version 2 header */
    FAKE_OTHER_ID,    /* a reply to nobody */
    FAKE_NOT_REPLY,   /* REPLY flag missing */
    FAKE_OPCODE,      /* a PING reply to a STAT */
    FAKE_STATUS,      /* EBUSY */
    FAKE_GARBAGE,     /* a short header frame */
    FAKE_MISORDER,    /* GET_LAYER: head 1 first */
    FAKE_BAD_COUNT,   /* GET_LAYER: END counts 2 after 1 */
    FAKE_STREAM_OK,   /* GET_LAYER: 1 chunk, 2 heads */
    FAKE_BAD_MISS,    /* GET_LAYER: a data message whose status is not a miss */
    FAKE_PACK_OK,     /* GET_LAYER: one packed message of heads 0 (hit) and 1 (miss) */
    FAKE_PACK_ORDER,  /* GET_LAYER: a packed message of heads 0 and 2 */
    FAKE_PACK_FRAMES, /* GET_LAYER: a packed message of two hits with one block frame */
    FAKE_PACK_BIG,    /* GET_LAYER: a packed message of KVEDGE_WIRE_MAX_PACK + 1 heads */
    FAKE_PACK_REFUSE, /* GET_LAYER: a packed request gets EPROTO (an older node); else OK */
};

static atomic_int s_fake_mode;
static atomic_int s_fake_cancels;
static atomic_int s_fake_pings;  /* PINGs the fake node got (and never answers) */
static atomic_int s_fake_layers; /* GET_LAYER requests it got */
static atomic_int s_fake_packed; /* of those, with the pack frame */
static int s_fake_port;

/* A GET_LAYER data message of k heads 0 ... k-1 of chunk 0 (head `skip` is given as head
 * k instead), each a hit but head 1, a miss; `blocks` block frames follow f1. */
static void s_fake_pack(zsock_t *router, zframe_t *route, uint64_t id, uint32_t k, int skip,
                        uint32_t blocks)
{
    uint8_t *recs = calloc(k, KVEDGE_WIRE_STREAM_HDR_BYTES), block[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (uint32_t i = 0; i < k; i++) {
        kvedge_wire_stream_hdr_t sh = {0, (uint16_t)((int)i == skip ? k : i),
                                       i == 1 ? KVEDGE_ENOTFOUND : 0};
        kvedge_wire_stream_hdr_pack(&sh, recs + (size_t)i * KVEDGE_WIRE_STREAM_HDR_BYTES);
    }
    kvedge_wire_header_t h = {
        1, KVEDGE_OP_GET_LAYER, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE, id, 0, k, 0, 0};
    uint8_t hb[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, hb);
    zmsg_t *m = zmsg_new();
    zframe_t *r = zframe_dup(route);
    zmsg_append(m, &r);
    zmsg_addmem(m, hb, sizeof hb);
    zmsg_addmem(m, recs, (size_t)k * KVEDGE_WIRE_STREAM_HDR_BYTES);
    for (uint32_t i = 0; i < blocks; i++)
        zmsg_addmem(m, block, sizeof block);
    zmsg_send(&m, router);
    free(recs);
}

static void s_fake_send(zsock_t *router, zframe_t *route, uint8_t version, uint8_t op,
                        uint16_t flags, uint64_t id, int32_t status, uint32_t count, const void *f1,
                        size_t l1, const void *f2, size_t l2)
{
    kvedge_wire_header_t h = {version, op, flags, id, status, count, 0, 0};
    uint8_t hb[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, hb);
    zmsg_t *m = zmsg_new();
    zframe_t *r = zframe_dup(route);
    zmsg_append(m, &r);
    zmsg_addmem(m, hb, sizeof hb);
    if (f1)
        zmsg_addmem(m, f1, l1);
    if (f2)
        zmsg_addmem(m, f2, l2);
    zmsg_send(&m, router);
}

static void s_fake_data(zsock_t *router, zframe_t *route, uint64_t id, uint32_t chunk,
                        uint16_t head, int32_t status)
{
    uint8_t sh[KVEDGE_WIRE_STREAM_HDR_BYTES], block[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvedge_wire_stream_hdr_t s = {chunk, head, status};
    kvedge_wire_stream_hdr_pack(&s, sh);
    s_fake_send(router, route, 1, KVEDGE_OP_GET_LAYER,
                KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE, id, 0, 1, sh, sizeof sh,
                status == 0 ? block : NULL, sizeof block);
}

/* A fake peer's HELLO answer: a peer of that role with the protocol's limits and these
 * credits. */
static void s_fake_hello_as(zsock_t *router, zframe_t *route, uint64_t id, kvedge_role_t role,
                            const char *name, uint32_t max_credit, uint32_t default_credit)
{
    kvedge_wire_node_info_t info = {role,
                                    {0},
                                    KVEDGE_WIRE_MAX_FRAME_BYTES,
                                    KVEDGE_WIRE_MAX_ITEMS,
                                    KVEDGE_WIRE_MAX_CHUNKS,
                                    max_credit,
                                    default_credit};
    uint8_t ib[KVEDGE_WIRE_NODE_INFO_BYTES];
    kvedge_wire_node_info_pack(&info, ib);
    s_fake_send(router, route, 1, KVEDGE_OP_HELLO, KVEDGE_WIRE_FLAG_REPLY, id, 0, 0, ib, sizeof ib,
                name, strlen(name));
}

/* A fake node's HELLO answer: an edge node. */
static void s_fake_hello(zsock_t *router, zframe_t *route, uint64_t id, const char *name,
                         uint32_t max_credit, uint32_t default_credit)
{
    s_fake_hello_as(router, route, id, KVEDGE_ROLE_EDGE, name, max_credit, default_credit);
}

/* A fake node's ROUTER on a free port, which the actor's pipe is told (s_fake_connect). */
static zsock_t *s_fake_router(zsock_t *pipe)
{
    zsock_t *router = zsock_new(ZMQ_ROUTER);
    zsock_set_linger(router, 0);
    int port = zsock_bind(router, "tcp://127.0.0.1:*");
    zsock_signal(pipe, 0);
    zsock_send(pipe, "i", port);
    return router;
}

/* A client of the fake node run by actor node (deadline_ms 0: the default). */
static kvedge_client_t *s_fake_connect(zactor_t *node, int deadline_ms, uint32_t window_bytes)
{
    int port = 0;
    assert_int_equal(zsock_recv(node, "i", &port), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    if (deadline_ms)
        o.deadline_ms = deadline_ms;
    o.window_bytes = window_bytes;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    s_fake_port = port;
    return c;
}

/* Another client of the last fake node s_fake_connect reached, with opts.no_pack as given. */
static kvedge_client_t *s_fake_connect_again(int deadline_ms, bool no_pack)
{
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", s_fake_port);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = deadline_ms;
    o.no_pack = no_pack;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    return c;
}

static void s_fake_node(zsock_t *pipe, void *args)
{
    (void)args;
    zsock_t *router = s_fake_router(pipe);
    zpoller_t *poller = zpoller_new(pipe, router, NULL);
    while (true) {
        void *which = zpoller_wait(poller, -1);
        if (which != router)
            break;
        zmsg_t *m = zmsg_recv(router);
        zframe_t *route = zmsg_pop(m), *hf = zmsg_pop(m);
        kvedge_wire_header_t h;
        kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h);
        uint64_t id = h.request_id;
        const uint16_t R = KVEDGE_WIRE_FLAG_REPLY,
                       END = KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END;
        int mode = atomic_load(&s_fake_mode);
        uint8_t stats[KVEDGE_WIRE_STATS_BYTES];
        memset(stats, 0, sizeof stats);
        if (h.opcode == KVEDGE_OP_HELLO) {
            s_fake_hello(router, route, id, "fake", KVEDGE_WIRE_MAX_CREDIT, 8);
        } else if (h.opcode == KVEDGE_OP_CANCEL) {
            atomic_fetch_add(&s_fake_cancels, 1);
        } else if (h.opcode == KVEDGE_OP_PING) {
            atomic_fetch_add(&s_fake_pings, 1);
        } else if (h.opcode == KVEDGE_OP_STAT) {
            switch (mode) {
            case FAKE_GOOD:
                s_fake_send(router, route, 1, h.opcode, R, id, 0, 0, stats, sizeof stats, NULL, 0);
                break;
            case FAKE_NO_PAYLOAD:
                s_fake_send(router, route, 1, h.opcode, R, id, 0, 0, NULL, 0, NULL, 0);
                break;
            case FAKE_VERSION:
                s_fake_send(router, route, 2, h.opcode, R, id, 0, 0, stats, sizeof stats, NULL, 0);
                break;
            case FAKE_OTHER_ID:
                s_fake_send(router, route, 1, h.opcode, R, id + 1000, 0, 0, stats, sizeof stats,
                            NULL, 0);
                break;
            case FAKE_NOT_REPLY:
                s_fake_send(router, route, 1, h.opcode, 0, id, 0, 0, stats, sizeof stats, NULL, 0);
                break;
            case FAKE_OPCODE:
                s_fake_send(router, route, 1, KVEDGE_OP_PING, R, id, 0, 0, "x", 1, NULL, 0);
                break;
            case FAKE_STATUS:
                s_fake_send(router, route, 1, h.opcode, R, id, KVEDGE_EBUSY, 0, NULL, 0, NULL, 0);
                break;
            case FAKE_GARBAGE: {
                zmsg_t *g = zmsg_new();
                zframe_t *r = zframe_dup(route);
                zmsg_append(g, &r);
                zmsg_addstr(g, "KVEP");
                zmsg_send(&g, router);
                break;
            }
            default:
                break;
            }
        } else if (h.opcode == KVEDGE_OP_GET_LAYER) {
            bool packed = zmsg_size(m) == 3; /* layer and ids, accept list, pack frame */
            atomic_fetch_add(&s_fake_layers, 1);
            atomic_fetch_add(&s_fake_packed, packed);
            if (mode == FAKE_PACK_REFUSE)
                mode = packed ? -1 : FAKE_STREAM_OK;
            if (mode == -1) /* the answer of a node that cannot parse the pack frame */
                s_fake_send(router, route, 1, h.opcode, END, id, KVEDGE_EPROTO, 0, NULL, 0, NULL,
                            0);
            switch (mode) {
            case FAKE_PACK_OK:
                s_fake_pack(router, route, id, 2, -1, 1);
                s_fake_send(router, route, 1, h.opcode, END, id, 0, 1, NULL, 0, NULL, 0);
                break;
            case FAKE_PACK_ORDER:
                s_fake_pack(router, route, id, 3, 2, 2);
                break;
            case FAKE_PACK_FRAMES:
                s_fake_pack(router, route, id, 3, -1, 1);
                break;
            case FAKE_PACK_BIG:
                s_fake_pack(router, route, id, KVEDGE_WIRE_MAX_PACK + 1, -1, KVEDGE_WIRE_MAX_PACK);
                break;
            case FAKE_MISORDER:
                s_fake_data(router, route, id, 0, 1, 0);
                break;
            case FAKE_BAD_COUNT:
                s_fake_data(router, route, id, 0, 0, 0);
                s_fake_send(router, route, 1, h.opcode, END, id, 0, 2, NULL, 0, NULL, 0);
                break;
            case FAKE_STREAM_OK:
                s_fake_data(router, route, id, 0, 0, 0);
                s_fake_data(router, route, id, 0, 1, KVEDGE_ENOTFOUND);
                s_fake_send(router, route, 1, h.opcode, END, id, 0, 2, NULL, 0, NULL, 0);
                break;
            case FAKE_BAD_MISS:
                s_fake_data(router, route, id, 0, 0, KVEDGE_EIO);
                break;
            default:
                break;
            }
        }
        zframe_destroy(&route);
        zframe_destroy(&hf);
        zmsg_destroy(&m);
    }
    zpoller_destroy(&poller);
    zsock_destroy(&router);
}

/* Against the fake node in mode ok (one block, one miss) a layer completes; in each cases[i][0]
 * the stream fails with cases[i][1]. */
static void s_fake_layer_modes(kvedge_client_t *c, int ok, const int cases[][2], size_t n)
{
    kvedge_chunk_id_t id;
    memset(&id, 3, sizeof id);
    uint8_t buf[64];
    kvedge_fetched_t out[4];
    uint32_t heads = 0;
    atomic_store(&s_fake_mode, ok);
    memset(out, 0, sizeof out);
    assert_int_equal(kvedge_client_get_layer(c, &id, 1, 0, buf, sizeof buf, out, 4, &heads), 0);
    assert_int_equal(heads, 2);
    assert_int_equal(out[0].status, 0);
    assert_int_equal(out[0].len, 8);
    assert_int_equal(out[1].status, KVEDGE_ENOTFOUND);
    for (size_t i = 0; i < n; i++) {
        atomic_store(&s_fake_mode, cases[i][0]);
        assert_int_equal(kvedge_client_get_layer(c, &id, 1, 0, buf, sizeof buf, out, 4, &heads),
                         cases[i][1]);
    }
}

static void test_malformed(void **state)
{
    (void)state;
    atomic_store(&s_fake_mode, FAKE_GOOD);
    zactor_t *fake = zactor_new(s_fake_node, NULL);
    kvedge_client_t *c = s_fake_connect(fake, SHORT_MS, 0);
    assert_string_equal(kvedge_client_node(c)->name, "fake");

    kvedge_engine_stats_t st;
    const struct {
        int mode, want;
    } cases[] = {
        {FAKE_GOOD, 0},
        {FAKE_NO_PAYLOAD, KVEDGE_EPROTO},
        {FAKE_VERSION, KVEDGE_EVERSION},
        {FAKE_OTHER_ID, KVEDGE_ETIMEDOUT},
        {FAKE_NOT_REPLY, KVEDGE_EPROTO},
        {FAKE_OPCODE, KVEDGE_EPROTO},
        {FAKE_STATUS, KVEDGE_EBUSY},
        {FAKE_GARBAGE, KVEDGE_ETIMEDOUT},
        {FAKE_GOOD, 0}, /* and the client is still fine */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        atomic_store(&s_fake_mode, cases[i].mode);
        int64_t t0 = s_ms();
        int rc = kvedge_client_stat(c, &st);
        if (rc != cases[i].want)
            fail_msg("case %zu: %s, want %s", i, kvedge_errname(rc), kvedge_errname(cases[i].want));
        assert_true(s_ms() - t0 <= SHORT_MS + KT_SLACK_MS);
    }

    kvedge_chunk_id_t id;
    memset(&id, 3, sizeof id);
    uint8_t buf[64];
    kvedge_fetched_t out[4];
    uint32_t heads = 0;
    const int stream_cases[][2] = {{FAKE_MISORDER, KVEDGE_EPROTO},
                                   {FAKE_BAD_COUNT, KVEDGE_EPROTO},
                                   {FAKE_BAD_MISS, KVEDGE_EPROTO}};
    s_fake_layer_modes(c, FAKE_STREAM_OK, stream_cases, 3);
    /* The streams the client gave up on were cancelled (not the one the node ended). */
    kt_wait_for(atomic_load(&s_fake_cancels) >= 2, KT_WAIT_MS);
    assert_int_equal(atomic_load(&s_fake_cancels), 2);

    /* Packed data messages: one the client asked for is delivered head by head; hostile ones
     * (a head out of order, a block frame short, more heads than a message may carry) fail
     * the stream before any of their heads is delivered; a client that did not ask for packing
     * refuses a packed message. */
    const int pack_cases[][2] = {{FAKE_PACK_ORDER, KVEDGE_EPROTO},
                                 {FAKE_PACK_FRAMES, KVEDGE_EPROTO},
                                 {FAKE_PACK_BIG, KVEDGE_EPROTO}};
    s_fake_layer_modes(c, FAKE_PACK_OK, pack_cases, 3);
    kvedge_client_t *plain = s_fake_connect_again(SHORT_MS, true);
    atomic_store(&s_fake_mode, FAKE_PACK_OK);
    assert_int_equal(kvedge_client_get_layer(plain, &id, 1, 0, buf, sizeof buf, out, 4, &heads),
                     KVEDGE_EPROTO);
    kvedge_client_destroy(&plain);
    kvedge_client_destroy(&c);

    /* A node that refuses the pack frame (EPROTO, as older nodes answer it): the stream is
     * sent again unpacked and completes, and the connection asks for packing no more. */
    c = s_fake_connect_again(SHORT_MS, false);
    atomic_store(&s_fake_mode, FAKE_PACK_REFUSE);
    atomic_store(&s_fake_layers, 0);
    atomic_store(&s_fake_packed, 0);
    for (int i = 0; i < 2; i++) {
        memset(out, 0, sizeof out);
        assert_int_equal(kvedge_client_get_layer(c, &id, 1, 0, buf, sizeof buf, out, 4, &heads), 0);
        assert_int_equal(heads, 2);
        assert_int_equal(out[0].status, 0);
        assert_int_equal(out[1].status, KVEDGE_ENOTFOUND);
    }
    assert_int_equal(atomic_load(&s_fake_layers), 3); /* packed, unpacked, then unpacked */
    assert_int_equal(atomic_load(&s_fake_packed), 1);
    kvedge_client_destroy(&c);
    zactor_destroy(&fake);
}

/* ---------------------------------------------------------------- packed FETCH */

/* A fake edge proxy: every FETCH gets a plan of one source and one layer, then, by
 * s_fake_mode, one BLOCK message of heads 0 and 1 (FAKE_PACK_OK) or 0 and 2 (FAKE_PACK_ORDER)
 * of chunk 0, packed, with their two blocks, the LAYER record and the end message. */
static void s_fake_proxy(zsock_t *pipe, void *args)
{
    (void)args;
    zsock_t *router = s_fake_router(pipe);
    zpoller_t *poller = zpoller_new(pipe, router, NULL);
    const uint16_t MORE = KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE,
                   END = KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END;
    while (zpoller_wait(poller, -1) == router) {
        zmsg_t *m = zmsg_recv(router);
        zframe_t *route = zmsg_pop(m), *hf = zmsg_pop(m);
        kvedge_wire_header_t h;
        kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h);
        if (h.opcode == KVEDGE_OP_HELLO) {
            s_fake_hello_as(router, route, h.request_id, KVEDGE_ROLE_PROXY, "fakeproxy",
                            KVEDGE_WIRE_MAX_CREDIT, 8);
        } else if (h.opcode == KVEDGE_OP_FETCH) {
            uint64_t id = h.request_id;
            kvedge_wire_fetch_plan_t plan = {1, 1, 0, 1, 1, 1, 1, 1};
            kvedge_wire_fetch_source_t src = {"cloud", 2, true, 100, 1e9};
            kvedge_wire_fetch_plan_layer_t pl = {0, 1, 1, false, KVEDGE_WIRE_FETCH_OWN_LAYER, 0, 0};
            uint8_t pb[KVEDGE_WIRE_FETCH_PLAN_BYTES], sb[KVEDGE_WIRE_FETCH_SOURCE_BYTES],
                lb[KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES];
            kvedge_wire_fetch_plan_pack(&plan, pb);
            kvedge_wire_fetch_source_pack(&src, sb);
            kvedge_wire_fetch_plan_layer_pack(&pl, lb);
            zmsg_t *pm = zmsg_new();
            zframe_t *r = zframe_dup(route);
            zmsg_append(pm, &r);
            kvedge_wire_header_t ph = {1, KVEDGE_OP_FETCH, MORE, id, 0, 1, 0, 0};
            uint8_t hb[KVEDGE_WIRE_HEADER_BYTES];
            kvedge_wire_header_pack(&ph, hb);
            zmsg_addmem(pm, hb, sizeof hb);
            zmsg_addmem(pm, pb, sizeof pb);
            zmsg_addmem(pm, sb, sizeof sb);
            zmsg_addmem(pm, lb, sizeof lb);
            zmsg_send(&pm, router);
            uint8_t recs[2 * KVEDGE_WIRE_FETCH_BLOCK_BYTES], block[8] = {1, 2, 3, 4, 5, 6, 7, 8};
            for (uint16_t i = 0; i < 2; i++) {
                uint16_t head = atomic_load(&s_fake_mode) == FAKE_PACK_ORDER ? 2 * i : i;
                kvedge_wire_fetch_block_t b = {0, 0, 0, head, 0};
                kvedge_wire_fetch_block_pack(&b, recs + i * KVEDGE_WIRE_FETCH_BLOCK_BYTES);
            }
            zmsg_t *bm = zmsg_new();
            r = zframe_dup(route);
            zmsg_append(bm, &r);
            kvedge_wire_header_t bh = {1, KVEDGE_OP_FETCH, MORE, id, 0, 2, 0, 0};
            kvedge_wire_header_pack(&bh, hb);
            zmsg_addmem(bm, hb, sizeof hb);
            zmsg_addmem(bm, recs, sizeof recs);
            zmsg_addmem(bm, block, sizeof block);
            zmsg_addmem(bm, block, sizeof block);
            zmsg_send(&bm, router);
            kvedge_wire_fetch_layer_t l = {KVEDGE_FETCH_PLANNED,        0, 0, 0, 2, 1,
                                           KVEDGE_WIRE_FETCH_OWN_LAYER, 0};
            uint8_t lr[KVEDGE_WIRE_FETCH_LAYER_BYTES];
            kvedge_wire_fetch_layer_pack(&l, lr);
            s_fake_send(router, route, 1, KVEDGE_OP_FETCH, MORE, id, 0, 1, lr, sizeof lr, NULL, 0);
            s_fake_send(router, route, 1, KVEDGE_OP_FETCH, END, id, 0, 3, NULL, 0, NULL, 0);
        }
        zframe_destroy(&route);
        zframe_destroy(&hf);
        zmsg_destroy(&m);
    }
    zpoller_destroy(&poller);
    zsock_destroy(&router);
}

typedef struct {
    atomic_int blocks, done, status;
} s_fx_seen_t;

static void s_fx_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source,
                       int status, const uint8_t *data, size_t len)
{
    (void)layer, (void)ci, (void)head, (void)source, (void)data;
    s_fx_seen_t *v = ctx;
    if (status == 0 && len == 8)
        atomic_fetch_add(&v->blocks, 1);
}

static void s_fx_done(void *ctx, int status)
{
    s_fx_seen_t *v = ctx;
    atomic_store(&v->status, status);
    atomic_store(&v->done, 1);
}

/* One FETCH of a one-chunk, one-layer context from the fake proxy: its status and blocks. */
static int s_fx_run(kvedge_client_t *c, int *blocks)
{
    kvedge_chunk_id_t id;
    memset(&id, 4, sizeof id);
    kvedge_fetch_req_t req;
    kvedge_fetch_req_default(&req);
    req.model_id = MODEL;
    req.chunks = &id;
    req.n = 1;
    req.layers = 1;
    kvedge_fetch_cbs_t cbs = {NULL, s_fx_block, NULL, s_fx_done};
    s_fx_seen_t v;
    atomic_init(&v.blocks, 0);
    atomic_init(&v.done, 0);
    atomic_init(&v.status, 0);
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, &v), 0);
    kt_wait_for(atomic_load(&v.done), KT_WAIT_MS);
    assert_int_equal(atomic_load(&v.done), 1);
    *blocks = atomic_load(&v.blocks);
    return atomic_load(&v.status);
}

/* Packed FETCH BLOCK messages: a pack the client asked for is delivered block by block; one
 * whose heads are out of order fails the stream before any of its blocks is delivered; a
 * client that did not ask (no_pack) refuses a packed message. */
static void test_fetch_packed(void **state)
{
    (void)state;
    zactor_t *fake = zactor_new(s_fake_proxy, NULL);
    kvedge_client_t *c = s_fake_connect(fake, SHORT_MS, 0);
    int blocks = 0;
    atomic_store(&s_fake_mode, FAKE_PACK_OK);
    assert_int_equal(s_fx_run(c, &blocks), 0);
    assert_int_equal(blocks, 2);
    atomic_store(&s_fake_mode, FAKE_PACK_ORDER);
    assert_int_equal(s_fx_run(c, &blocks), KVEDGE_EPROTO);
    assert_int_equal(blocks, 0);
    kvedge_client_t *plain = s_fake_connect_again(SHORT_MS, true);
    atomic_store(&s_fake_mode, FAKE_PACK_OK);
    assert_int_equal(s_fx_run(plain, &blocks), KVEDGE_EPROTO);
    assert_int_equal(blocks, 0);
    kvedge_client_destroy(&plain);
    kvedge_client_destroy(&c);
    zactor_destroy(&fake);
}

/* ---------------------------------------------------------------- stream window */

/* A node that serves every GET_LAYER as one chunk of W_HEADS heads of W_BLOCK bytes each, sends
 * exactly what its credit allows, and records per stream the initial credit and the most credit
 * it held after a grant: what the client's window policy let it have in flight. */
#define W_HEADS   256
#define W_BLOCK   (64u << 10)
#define W_STREAMS 2

static struct {
    uint32_t max_credit; /* advertised in HELLO */
    uint32_t initial[W_STREAMS], most[W_STREAMS];
    int streams;
} s_win;

static void s_win_node(zsock_t *pipe, void *args)
{
    (void)args;
    zsock_t *router = s_fake_router(pipe);
    uint8_t *block = calloc(1, W_BLOCK);
    zframe_t *route = NULL;
    uint64_t id = 0;
    uint32_t sent = W_HEADS, allowed = 0;
    int k = -1;
    zpoller_t *poller = zpoller_new(pipe, router, NULL);
    while (zpoller_wait(poller, -1) == router) {
        zmsg_t *m = zmsg_recv(router);
        zframe_t *r = zmsg_pop(m), *hf = zmsg_pop(m);
        kvedge_wire_header_t h;
        kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h);
        if (h.opcode == KVEDGE_OP_HELLO) {
            s_fake_hello(router, r, h.request_id, "win", s_win.max_credit, 1);
        } else if (h.opcode == KVEDGE_OP_GET_LAYER && s_win.streams < W_STREAMS) {
            k = s_win.streams++;
            zframe_destroy(&route);
            route = zframe_dup(r);
            id = h.request_id;
            sent = 0;
            allowed = s_win.initial[k] = s_win.most[k] = h.credit;
        } else if (h.opcode == KVEDGE_OP_CREDIT && h.request_id == id && k >= 0) {
            allowed += h.credit;
            if (allowed > s_win.most[k])
                s_win.most[k] = allowed;
        }
        for (; route && sent < W_HEADS && allowed > 0; sent++, allowed--) {
            uint8_t sh[KVEDGE_WIRE_STREAM_HDR_BYTES];
            kvedge_wire_stream_hdr_t st = {0, (uint16_t)sent, 0};
            kvedge_wire_stream_hdr_pack(&st, sh);
            s_fake_send(router, route, 1, KVEDGE_OP_GET_LAYER,
                        KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE, id, 0, 1, sh, sizeof sh,
                        block, W_BLOCK);
            if (sent + 1 == W_HEADS)
                s_fake_send(router, route, 1, KVEDGE_OP_GET_LAYER,
                            KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END, id, 0, W_HEADS, NULL, 0,
                            NULL, 0);
        }
        zframe_destroy(&r);
        zframe_destroy(&hf);
        zmsg_destroy(&m);
    }
    zframe_destroy(&route);
    free(block);
    zpoller_destroy(&poller);
    zsock_destroy(&router);
}

static void s_win_block(void *ctx, uint32_t chunk, uint16_t head, int status, const uint8_t *data,
                        size_t len)
{
    (void)chunk, (void)head, (void)data;
    if (status == 0 && len == W_BLOCK)
        atomic_fetch_add((atomic_int *)ctx, 1);
}

static void s_win_done(void *ctx, int status, uint32_t heads)
{
    (void)heads;
    atomic_fetch_add((atomic_int *)ctx, status == 0 ? 1000 : 100000);
}

/* Two streams, one after the other, through the actor (asynchronous calls). */
static void s_win_run(uint32_t max_credit, uint32_t window_bytes)
{
    memset(&s_win, 0, sizeof s_win);
    s_win.max_credit = max_credit;
    zactor_t *node = zactor_new(s_win_node, NULL);
    kvedge_client_t *c = s_fake_connect(node, 0, window_bytes);
    kvedge_chunk_id_t id;
    memset(&id, 5, sizeof id);
    for (int i = 0; i < W_STREAMS; i++) {
        atomic_int got = 0;
        assert_int_equal(
            kvedge_client_get_layer_async(c, &id, 1, 0, 5000, s_win_block, s_win_done, &got), 0);
        kt_wait_for(atomic_load(&got) >= 1000, KT_WAIT_MS);  /* done */
        assert_int_equal(atomic_load(&got), 1000 + W_HEADS); /* every block, then done, OK */
    }
    kvedge_client_destroy(&c);
    zactor_destroy(&node);
}

/* Credit counts messages; with small blocks the client widens a stream to about window_bytes
 * in flight, never past the node's max credit, never below its own credit, and starts the next
 * stream at what the last one ran at. */
static void test_stream_window(void **state)
{
    (void)state;
    /* Default window (4 MiB) over 64 KiB blocks: 64 messages. */
    s_win_run(KVEDGE_WIRE_MAX_CREDIT, 0);
    assert_int_equal(s_win.initial[0], KVEDGE_CLIENT_CREDIT_DEFAULT);
    assert_true(s_win.most[0] > KVEDGE_CLIENT_CREDIT_DEFAULT);
    assert_true(s_win.most[0] <= KVEDGE_CLIENT_WINDOW_DEFAULT / W_BLOCK);
    assert_int_equal(s_win.initial[1], KVEDGE_CLIENT_WINDOW_DEFAULT / W_BLOCK);
    assert_true(s_win.most[1] <= KVEDGE_CLIENT_WINDOW_DEFAULT / W_BLOCK);
    /* The node's max credit caps it. */
    s_win_run(16, 0);
    assert_int_equal(s_win.initial[0], KVEDGE_CLIENT_CREDIT_DEFAULT);
    assert_true(s_win.most[0] > KVEDGE_CLIENT_CREDIT_DEFAULT && s_win.most[0] <= 16);
    assert_int_equal(s_win.initial[1], 16);
    /* A window of 1 byte keeps the credit fixed. */
    s_win_run(KVEDGE_WIRE_MAX_CREDIT, 1);
    for (int i = 0; i < W_STREAMS; i++) {
        assert_int_equal(s_win.initial[i], KVEDGE_CLIENT_CREDIT_DEFAULT);
        assert_true(s_win.most[i] <= KVEDGE_CLIENT_CREDIT_DEFAULT);
    }
    /* A larger window: 16 MiB over 64 KiB blocks is 256 messages, the whole layer. */
    s_win_run(KVEDGE_WIRE_MAX_CREDIT, 16u << 20);
    assert_true(s_win.most[0] > KVEDGE_CLIENT_WINDOW_DEFAULT / W_BLOCK);
    assert_int_equal(s_win.initial[1], 256);
}

/* ---------------------------------------------------------------- concurrency */

typedef struct {
    fx_t *fx;
    uint32_t seed;
    int failures;
} worker_t;

static void *s_worker(void *arg)
{
    worker_t *w = arg;
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = kvedge_server_endpoint(w->fx->s);
    o.deadline_ms = 20000;
    kvedge_client_t *c = NULL;
    if (kvedge_client_connect(&o, &c) != 0) {
        w->failures++;
        return NULL;
    }
    kvedge_chunk_id_t ids[2];
    uint32_t *t = malloc(2 * TOKENS * sizeof *t);
    for (size_t i = 0; i < 2 * TOKENS; i++)
        t[i] = w->seed * 100003u + (uint32_t)i;
    kvedge_chunk_chain(NULL, 0, MODEL, t, 2 * TOKENS, TOKENS, ids, 2);
    free(t);
    for (int round = 0; round < 3; round++) {
        set_t s;
        size_t max = 2 * 2 * HEADS;
        s.items = calloc(max, sizeof *s.items);
        s.blocks = calloc(max, sizeof *s.blocks);
        s.n = 0;
        for (uint32_t ch = 0; ch < 2; ch++)
            for (uint16_t l = 0; l < 2; l++)
                for (uint16_t h = 0; h < HEADS; h++) {
                    kvedge_put_item_t *it = &s.items[s.n];
                    it->chunk = s_info(ids, ch, MODEL, TOKENS);
                    it->layer = (uint16_t)(round * 2 + l);
                    it->head = h;
                    kvedge_block_spec_t spec = {
                        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, TOKENS, HEAD_DIM, 0, NULL, false};
                    size_t len = 0;
                    s.blocks[s.n] =
                        kt_encode(&spec, w->seed * 977u + ch * 131u + l * 17u + h, &len);
                    it->block = s.blocks[s.n];
                    it->len = len;
                    s.n++;
                }
        if (kvedge_client_put(c, s.items, s.n, NULL) != 0)
            w->failures++;
        kvedge_block_key_t keys[2 * 2 * HEADS];
        kvedge_fetched_t out[2 * 2 * HEADS];
        size_t cap = 0;
        for (size_t i = 0; i < s.n; i++) {
            keys[i] = s_key(&s.items[i]);
            cap += s.items[i].len;
        }
        uint8_t *buf = malloc(cap);
        if (kvedge_client_get(c, keys, s.n, buf, cap, out) != 0)
            w->failures++;
        for (size_t i = 0; i < s.n; i++)
            if (out[i].status != 0 || out[i].len != s.items[i].len ||
                memcmp(buf + out[i].offset, s.blocks[i], out[i].len) != 0)
                w->failures++;
        /* And the same through a stream: layer round*2 of both chunks. */
        uint32_t heads = 0;
        if (kvedge_client_get_layer(c, ids, 2, (uint16_t)(round * 2), buf, cap, out, 2 * HEADS,
                                    &heads) != 0 ||
            heads != HEADS)
            w->failures++;
        for (uint32_t ch = 0; ch < 2; ch++)
            for (uint16_t h = 0; h < HEADS; h++) {
                size_t i = ch * 2 * HEADS + h; /* items: chunk, layer, head */
                const kvedge_fetched_t *f = &out[ch * HEADS + h];
                if (f->status != 0 || f->len != s.items[i].len ||
                    memcmp(buf + f->offset, s.blocks[i], f->len) != 0)
                    w->failures++;
            }
        free(buf);
        s_set_free(&s);
    }
    kvedge_client_destroy(&c);
    return NULL;
}

static void test_concurrent(void **state)
{
    fx_t *fx = *state;
    pthread_t th[N_THREADS];
    worker_t w[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (worker_t){fx, (uint32_t)i + 1, 0};
        assert_int_equal(pthread_create(&th[i], NULL, s_worker, &w[i]), 0);
    }
    int failures = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        failures += w[i].failures;
    }
    assert_int_equal(failures, 0);
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_client_stat(fx->c, &st), 0);
    assert_int_equal(st.blocks, N_THREADS * 3 * 2 * 2 * HEADS);
}

/* ---------------------------------------------------------------- one client, many callers */

#define SHARED_THREADS  7 /* more than the client's direct channels: both paths run */
#define SHARED_ROUNDS   25
#define SHARED_DEADLINE 1500 /* ms */

typedef struct {
    kvedge_client_t *c;
    const set_t *set;
    const kvedge_chunk_id_t *ids;
    int failures;
    int rc;          /* the deadline phase: what the call returned */
    int64_t took_ms; /* and how long it took */
} shared_t;

/* Synchronous calls of every kind on a client other threads use too, bytes checked. */
static void *s_shared_worker(void *arg)
{
    shared_t *w = arg;
    const set_t *s = w->set;
    size_t cap = 0;
    for (size_t i = 0; i < s->n; i++)
        cap += s->items[i].len;
    uint8_t *buf = malloc(cap);
    kvedge_fetched_t out[2 * HEADS];
    if (!buf)
        w->failures++;
    for (int round = 0; buf && round < SHARED_ROUNDS; round++) {
        double rtt = 0;
        if (kvedge_client_ping(w->c, round % 3 ? 0 : 4096, &rtt, NULL) != 0 || rtt <= 0)
            w->failures++;
        size_t k = (size_t)round % s->n;
        kvedge_block_key_t key = s_key(&s->items[k]);
        if (kvedge_client_get(w->c, &key, 1, buf, cap, out) != 0 || out[0].status != 0 ||
            out[0].len != s->items[k].len || memcmp(buf, s->blocks[k], out[0].len) != 0)
            w->failures++;
        uint32_t heads = 0;
        if (kvedge_client_get_layer(w->c, w->ids, 2, 3, buf, cap, out, 2 * HEADS, &heads) != 0 ||
            heads != HEADS)
            w->failures++;
        for (size_t i = 0; i < 2 * HEADS; i++)
            if (out[i].status != 0 || out[i].len != s->items[i].len ||
                memcmp(buf + out[i].offset, s->blocks[i], out[i].len) != 0)
                w->failures++;
        kvedge_engine_stats_t st;
        if (kvedge_client_stat(w->c, &st) != 0 || st.blocks != s->n)
            w->failures++;
    }
    free(buf);
    return NULL;
}

/* The deadline phase: one GET on a node that is gone. */
static void *s_shared_late(void *arg)
{
    shared_t *w = arg;
    const kvedge_put_item_t *it = &w->set->items[0];
    kvedge_block_key_t key = s_key(it);
    kvedge_fetched_t out;
    uint8_t buf[64];
    int64_t t0 = s_ms();
    w->rc = kvedge_client_get(w->c, &key, 1, buf, sizeof buf, &out);
    w->took_ms = s_ms() - t0;
    return NULL;
}

/* One PING on a node that is gone, with a long deadline: destroy ends it. */
static void *s_shared_ping(void *arg)
{
    shared_t *w = arg;
    int64_t t0 = s_ms();
    w->rc = kvedge_client_ping(w->c, 0, NULL, NULL);
    w->took_ms = s_ms() - t0;
    return NULL;
}

/* One client shared by threads: synchronous callers (direct channels and, past them, the I/O
 * actor) beside GET_LAYER streams in flight with a small credit, all correct; a PING goes
 * through while the I/O thread is held in a callback; then, the node gone, every call ends by
 * its deadline; destroy ends a call in flight. */
static void test_shared_callers(void **state)
{
    fx_t *fx = *state;
    kvedge_client_t *c = s_connect_pack(fx, 2, SHARED_DEADLINE, true); /* mid-stream: unpacked */
    kvedge_chunk_id_t ids[2];
    s_chain(MODEL, 61, 2, TOKENS, ids);
    set_t s = s_set(ids, 2, MODEL, TOKENS, HEAD_DIM, 3, 1, HEADS, KVEDGE_SCHEME_LOSSLESS, -1, -1);
    s_put_ok(c, &s);

    pthread_t th[SHARED_THREADS];
    shared_t w[SHARED_THREADS];
    for (int i = 0; i < SHARED_THREADS; i++) {
        w[i] = (shared_t){c, &s, ids, 0, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, s_shared_worker, &w[i]), 0);
    }
    /* Streams, one after the other, while the callers run. */
    bool joined[SHARED_THREADS] = {false};
    int streams = 0;
    for (bool running = true; running || streams < 3; streams++) {
        seen_t v;
        seen_init(&v, &s);
        assert_int_equal(kvedge_client_get_layer_async(c, ids, 2, 3, 0, on_block, on_done, &v), 0);
        seen_wait(&v);
        assert_int_equal(v.status, 0);
        assert_int_equal(v.blocks, 2 * HEADS);
        assert_int_equal(v.bad, 0);
        seen_fini(&v);
        running = false;
        for (int i = 0; i < SHARED_THREADS; i++) {
            joined[i] = joined[i] || pthread_tryjoin_np(th[i], NULL) == 0;
            running |= !joined[i];
        }
    }
    int failures = 0;
    for (int i = 0; i < SHARED_THREADS; i++)
        failures += w[i].failures;
    assert_int_equal(failures, 0);
    assert_true(streams >= 3);

    /* The I/O thread held in a stream's callback does not hold up a synchronous call. */
    seen_t g;
    seen_init(&g, &s);
    g.gate = true;
    assert_int_equal(kvedge_client_get_layer_async(c, ids, 2, 3, 0, on_block, on_done, &g), 0);
    pthread_mutex_lock(&g.mu);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    assert_int_equal(kvedge_client_ping(c, 0, NULL, NULL), 0);
    pthread_mutex_lock(&g.mu);
    g.open = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    seen_wait(&g);
    assert_int_equal(g.status, 0);
    assert_int_equal(g.bad, 0);
    seen_fini(&g);

    /* The node goes away with a stream in flight: every caller gets KVEDGE_ETIMEDOUT by its
     * deadline, and the stream ends by its own. */
    seen_t v;
    seen_init(&v, &s);
    v.gate = true;
    int64_t t0 = s_ms();
    assert_int_equal(kvedge_client_get_layer_async(c, ids, 2, 3, 0, on_block, on_done, &v), 0);
    pthread_mutex_lock(&v.mu);
    while (!v.entered)
        pthread_cond_wait(&v.cv, &v.mu);
    pthread_mutex_unlock(&v.mu);
    kvedge_server_destroy(&fx->s);
    pthread_mutex_lock(&v.mu);
    v.open = true;
    pthread_cond_broadcast(&v.cv);
    pthread_mutex_unlock(&v.mu);
    for (int i = 0; i < SHARED_THREADS; i++) {
        w[i] = (shared_t){c, &s, ids, 0, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, s_shared_late, &w[i]), 0);
    }
    for (int i = 0; i < SHARED_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].rc, KVEDGE_ETIMEDOUT);
        assert_true(w[i].took_ms >= SHARED_DEADLINE - 10);
        assert_true(w[i].took_ms <= SHARED_DEADLINE + KT_SLACK_MS);
    }
    seen_wait(&v);
    if (v.status != KVEDGE_ECLOSED && v.status != KVEDGE_ETIMEDOUT)
        fail_msg("stream ended with %d, want ECLOSED or ETIMEDOUT", v.status);
    assert_true(v.done_ms - t0 <= SHARED_DEADLINE + KT_SLACK_MS);
    seen_fini(&v);

    /* Destroy while a synchronous call waits (on a node that got its PING and never answers):
     * it ends with KVEDGE_ECLOSED, well before its 60 s deadline. */
    kvedge_client_destroy(&c);
    atomic_store(&s_fake_pings, 0);
    zactor_t *fake = zactor_new(s_fake_node, NULL);
    c = s_fake_connect(fake, 60000, 0);
    shared_t p = {c, &s, ids, 0, 0, 0};
    pthread_t pt;
    assert_int_equal(pthread_create(&pt, NULL, s_shared_ping, &p), 0);
    kt_wait_for(atomic_load(&s_fake_pings) >= 1, KT_WAIT_MS); /* the call is under way */
    kvedge_client_destroy(&c);
    pthread_join(pt, NULL);
    assert_int_equal(p.rc, KVEDGE_ECLOSED);
    assert_true(p.took_ms < KT_WAIT_MS + KT_SLACK_MS);
    zactor_destroy(&fake);
    s_set_free(&s);
}

int main(void)
{
    kvedge_log_set_level(KVEDGE_LOG_WARN); /* the node's lifecycle lines are noise here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hello, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_get_schemes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_batches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_layer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_layer_packed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_taken_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_layer_async, setup, teardown),
        cmocka_unit_test_setup_teardown(test_block_ref, setup, teardown),
        cmocka_unit_test_setup_teardown(test_big_layer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_credit_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_stat_pin_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enospace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline, setup_ipc, teardown),
        cmocka_unit_test_setup_teardown(test_curve, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_fetch_packed, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_stream_window, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_callers, setup_ipc, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
