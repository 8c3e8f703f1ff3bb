/* The store node serving precisions (the cache optimizer's ladder, docs/protocol.md
 * "Precisions"): GET_LAYER and GET with an accept list get each block at the first rung the
 * node holds (the primary or a variant) or derives; a reader that accepts only lossless never
 * gets a quantized block; derivation can be turned off or kept; bad lists are refused with
 * KVEDGE_EINVAL and the node keeps serving. The transform-coded rung: a node with its
 * model's coding basis (setting basis) serves tc, one without serves the next accepted rung,
 * and a bad basis file refuses the start with the loader's reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/frame.h"
#include "access/transport.h"
#include "clients/lib/kvedge.h"
#include "store/engine/engine.h"
#include "store/node/node.h"
#include "access/codec/basis.h"
#include "access/codec/prec.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"
#include "tests/common/basis_fixture.h"
#include "tests/common/logcap.h"

#define S_MODEL  "opt-125m" /* built in: 12 layers x 12 heads x 64 */
#define S_HEADS  12
#define S_DIM    64
#define S_TOKENS 64
#define S_BUF    (4u << 20)

static const kvedge_prec_t S_LOSSLESS = KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 0);
static const kvedge_prec_t S_INT8 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 0);
static const kvedge_prec_t S_INT4 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, 0);
static const kvedge_prec_t S_INT4_THINK =
    KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50);

typedef struct {
    char dir[256];
    kvedge_node_t *node;
    kvedge_engine_t *engine;
    kvedge_client_t *client;
    kvedge_chunk_id_t id;
} s_env_t;

/* Starts the node; basis: its coding-basis directory (NULL: none). */
static int s_try_start(s_env_t *e, bool derive, bool keep, const char *basis, char *why,
                       size_t why_len)
{
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    assert_true(ns.derive);        /* the default */
    assert_false(ns.keep_derived); /* the default */
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    ns.derive = derive;
    ns.keep_derived = keep;
    snprintf(ns.data, sizeof ns.data, "%s", e->dir);
    snprintf(ns.bind, sizeof ns.bind, "tcp://127.0.0.1:*");
    if (basis)
        snprintf(ns.basis, sizeof ns.basis, "%s", basis);
    return kvedge_node_start(&ns, &e->node, why, why_len);
}

static void s_start_basis(s_env_t *e, bool derive, bool keep, const char *basis)
{
    char why[512] = "";
    if (s_try_start(e, derive, keep, basis, why, sizeof why) != 0)
        fail_msg("node start: %s", why);
    e->engine = kvedge_node_engine(e->node);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = kvedge_node_endpoint(e->node);
    o.deadline_ms = 5000;
    assert_int_equal(kvedge_client_connect(&o, &e->client), 0);
}

static void s_start(s_env_t *e, bool derive, bool keep)
{
    s_start_basis(e, derive, keep, NULL);
}

static void s_stop(s_env_t *e)
{
    kvedge_client_destroy(&e->client);
    kvedge_node_destroy(&e->node);
}

/* Puts layer 0 of one chunk of S_MODEL, every head encoded with `spec` (scheme, group). */
static void s_put(s_env_t *e, kvedge_scheme_t scheme, uint16_t group)
{
    uint32_t tok[S_TOKENS];
    for (uint32_t i = 0; i < S_TOKENS; i++)
        tok[i] = 7000 + i;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, 0, &e->id, 1), 1);
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, scheme, S_TOKENS, S_DIM, group, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blocks = malloc(cap * S_HEADS);
    uint16_t k[S_TOKENS * S_DIM], v[S_TOKENS * S_DIM];
    kvedge_put_item_t items[S_HEADS];
    for (uint32_t h = 0; h < S_HEADS; h++) {
        assert_int_equal(kvedge_synth_head(h + 1, 0, S_TOKENS, S_DIM, KVEDGE_DTYPE_FP16, k, v), 0);
        memset(&items[h], 0, sizeof items[h]);
        assert_int_equal(kvedge_block_encode(&spec, k, v, blocks + h * cap, cap, &items[h].len), 0);
        items[h].chunk.id = e->id;
        snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, S_MODEL);
        items[h].chunk.tokens = S_TOKENS;
        items[h].layer = 0;
        items[h].head = (uint16_t)h;
        items[h].block = blocks + h * cap;
    }
    assert_int_equal(kvedge_client_put(e->client, items, S_HEADS, NULL), 0);
    free(blocks);
}

static int s_setup(void **state)
{
    s_env_t *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    snprintf(e->dir, sizeof e->dir, "/tmp/kvedge-nodeprec-XXXXXX");
    if (!mkdtemp(e->dir)) {
        free(e);
        return -1;
    }
    *state = e;
    return 0;
}

static int s_teardown(void **state)
{
    s_env_t *e = *state;
    s_stop(e);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->dir);
    assert_int_equal(system(cmd), 0);
    free(e);
    return 0;
}

/* GET_LAYER of layer 0 with an accept list: every head's status, and the rung of each block
 * served (KVEDGE_PREC_STORED for a miss). Returns the call's status. */
static int s_layer(s_env_t *e, const kvedge_prec_t *accept, size_t n, int *st, kvedge_prec_t *rung,
                   uint8_t *buf, kvedge_fetched_t *out)
{
    uint32_t heads = 0;
    int rc = kvedge_client_get_layer_prec(e->client, &e->id, 1, 0, accept, n, buf, S_BUF, out,
                                          S_HEADS, &heads);
    if (rc != KVEDGE_OK)
        return rc;
    assert_int_equal(heads, S_HEADS);
    for (int h = 0; h < S_HEADS; h++) {
        st[h] = out[h].status;
        rung[h] = KVEDGE_PREC_STORED;
        if (out[h].status == KVEDGE_OK) {
            kvedge_block_info_t info;
            assert_int_equal(kvedge_block_parse(buf + out[h].offset, out[h].len, &info), 0);
            rung[h] = kvedge_prec_of_block(&info);
        }
    }
    return KVEDGE_OK;
}

static void s_expect_all(const int *st, const kvedge_prec_t *rung, int status, kvedge_prec_t r)
{
    for (int h = 0; h < S_HEADS; h++) {
        assert_int_equal(st[h], status);
        assert_int_equal(rung[h], r);
    }
}

/* The engine's key of head h of layer 0: the chunk id namespaced for the loopback tenant, as
 * the node stores what a plaintext loopback client puts. */
static kvedge_block_key_t s_key(const s_env_t *e, uint16_t h)
{
    uint8_t tag[16];
    kvedge_tenant_tag(KVEDGE_LOOPBACK_TENANT, tag);
    kvedge_block_key_t key = {.layer = 0, .head = h};
    kvedge_tenant_chunk_id(tag, &e->id, &key.chunk);
    return key;
}

/* Puts an int8 variant of every head of layer 0 next to the lossless primary. */
static void s_put_int8_variants(s_env_t *e)
{
    for (uint16_t h = 0; h < S_HEADS; h++) {
        kvedge_block_key_t key = s_key(e, h);
        kvedge_value_t v;
        assert_int_equal(kvedge_engine_get(e->engine, &key, &v), 0);
        kvedge_block_info_t info;
        assert_int_equal(kvedge_block_parse(v.data, v.len, &info), 0);
        uint8_t *d = NULL;
        size_t dl = 0;
        assert_int_equal(kvedge_block_transcode(&info, S_INT8, false, &d, &dl), 0);
        kvedge_value_release(&v);
        assert_int_equal(kvedge_engine_put_variant(e->engine, &key, S_INT8, d, dl), 0);
        free(d);
    }
}

static void test_served_in_accept_order(void **state)
{
    s_env_t *e = *state;
    s_start(e, true, false);
    s_put(e, KVEDGE_SCHEME_LOSSLESS, 0);
    s_put_int8_variants(e);
    uint8_t *buf = malloc(S_BUF);
    kvedge_fetched_t out[S_HEADS];
    int st[S_HEADS];
    kvedge_prec_t rung[S_HEADS];

    /* No list: the blocks as stored. */
    assert_int_equal(s_layer(e, NULL, 0, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_LOSSLESS);
    /* The first held rung of the list: the variant, then the primary. */
    kvedge_prec_t a1[] = {S_INT8, S_LOSSLESS};
    assert_int_equal(s_layer(e, a1, 2, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_INT8);
    kvedge_prec_t a2[] = {S_LOSSLESS, S_INT8};
    assert_int_equal(s_layer(e, a2, 2, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_LOSSLESS);
    /* Neither rung held: the first derived from the finest held block, the bytes
     * kvedge_block_transcode makes from the lossless primary. */
    kvedge_prec_t a3[] = {S_INT4_THINK, S_INT4};
    assert_int_equal(s_layer(e, a3, 2, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_INT4_THINK);
    for (uint16_t h = 0; h < S_HEADS; h++) {
        kvedge_block_key_t key = s_key(e, h);
        kvedge_value_t v;
        assert_int_equal(kvedge_engine_get(e->engine, &key, &v), 0);
        kvedge_block_info_t info;
        assert_int_equal(kvedge_block_parse(v.data, v.len, &info), 0);
        uint8_t *d = NULL;
        size_t dl = 0;
        assert_int_equal(kvedge_block_transcode(&info, S_INT4_THINK, true, &d, &dl), 0);
        assert_int_equal(out[h].len, dl);
        assert_memory_equal(buf + out[h].offset, d, dl);
        free(d);
        kvedge_value_release(&v);
        /* Not kept: keep_derived is off. */
        kvedge_prec_t held[KVEDGE_PREC_MAX_ACCEPT];
        size_t nh = 0;
        assert_int_equal(kvedge_engine_variants(e->engine, &key, held, KVEDGE_PREC_MAX_ACCEPT, &nh),
                         0);
        assert_int_equal(nh, 1);
        assert_int_equal(held[0], S_INT8);
    }
    free(buf);
}

static void test_lossless_only_never_quantized(void **state)
{
    s_env_t *e = *state;
    s_start(e, true, false);
    s_put(e, KVEDGE_SCHEME_INT8, 0);
    uint8_t *buf = malloc(S_BUF);
    kvedge_fetched_t out[S_HEADS];
    int st[S_HEADS];
    kvedge_prec_t rung[S_HEADS];
    /* Lossless cannot be derived from int8: every head is a miss, none is quantized. */
    kvedge_prec_t a1[] = {S_LOSSLESS};
    assert_int_equal(s_layer(e, a1, 1, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_ENOTFOUND, KVEDGE_PREC_STORED);
    /* int4 can: derived from the int8 primary. */
    kvedge_prec_t a2[] = {S_LOSSLESS, S_INT4};
    assert_int_equal(s_layer(e, a2, 2, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_INT4);
    free(buf);
}

static void test_derive_off_and_keep(void **state)
{
    s_env_t *e = *state;
    s_start(e, false, false);
    s_put(e, KVEDGE_SCHEME_LOSSLESS, 0);
    uint8_t *buf = malloc(S_BUF);
    kvedge_fetched_t out[S_HEADS];
    int st[S_HEADS];
    kvedge_prec_t rung[S_HEADS];
    kvedge_prec_t a[] = {S_INT4};
    /* derive off: only held rungs are served. */
    assert_int_equal(s_layer(e, a, 1, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_ENOTFOUND, KVEDGE_PREC_STORED);
    s_stop(e);
    /* keep_derived: the first request derives and stores, the second finds the variants. */
    s_start(e, true, true);
    assert_int_equal(s_layer(e, a, 1, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_INT4);
    uint64_t vblocks = 0, vbytes = 0;
    assert_int_equal(kvedge_engine_variant_stats(e->engine, &vblocks, &vbytes), 0);
    assert_int_equal(vblocks, S_HEADS);
    uint64_t sum = 0;
    for (int h = 0; h < S_HEADS; h++)
        sum += out[h].len;
    assert_int_equal(vbytes, sum);
    s_stop(e);
    /* Held now: served with derivation off. */
    s_start(e, false, false);
    assert_int_equal(s_layer(e, a, 1, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_INT4);
    free(buf);
}

/* ---- the transform-coded rung (tc): coding bases ----
 * The basis registry is the process's: these tests run in this order, the one that registers
 * S_MODEL's basis last. */

static const kvedge_prec_t S_TC = KVEDGE_PREC_MAKE(KVEDGE_PREC_TC, 0);
#define S_TC_STEP 0.125f /* the fixture basis's quantization step (an fp16 value) */

/* Writes a basis of model covering layer 0 (every head) as DIR/name, DIR (made when missing)
 * under e->dir; flip >= 0 damages that byte. Returns DIR in out. */
static void s_basis_dir(const s_env_t *e, const char *sub, const char *model, const char *name,
                        long flip, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", e->dir, sub);
    assert_true(mkdir(out, 0700) == 0 || errno == EEXIST);
    uint8_t *b = NULL;
    size_t len = 0;
    assert_int_equal(kt_basis_file(model, 1, S_HEADS, S_DIM, S_TC_STEP, 11, &b, &len), 0);
    if (flip >= 0)
        b[flip] ^= 0x40;
    char path[600];
    snprintf(path, sizeof path, "%s/%s", out, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    free(b);
}

/* Without a basis of the model, "tc,int8" is served at int8: tc is a rung this node cannot
 * give, as any rung it cannot derive, and the get does not fail. */
static void test_tc_without_basis_serves_next(void **state)
{
    s_env_t *e = *state;
    assert_null(kvedge_basis_find_model(S_MODEL)); /* see the order above */
    s_start(e, true, false);
    s_put(e, KVEDGE_SCHEME_LOSSLESS, 0);
    uint8_t *buf = malloc(S_BUF);
    kvedge_fetched_t out[S_HEADS];
    int st[S_HEADS];
    kvedge_prec_t rung[S_HEADS];
    kvedge_prec_t a[] = {S_TC, S_INT8};
    assert_int_equal(s_layer(e, a, 2, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_INT8);
    /* tc alone: every head a miss, the node still serving. */
    kvedge_prec_t only[] = {S_TC};
    assert_int_equal(s_layer(e, only, 1, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_ENOTFOUND, KVEDGE_PREC_STORED);
    kvedge_prec_t lossless[] = {S_LOSSLESS};
    assert_int_equal(s_layer(e, lossless, 1, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_LOSSLESS);
    free(buf);
}

/* The bases of the directory are registered at start, and the log names their models. */
static void test_bases_loaded_and_logged(void **state)
{
    s_env_t *e = *state;
    char dir[400];
    s_basis_dir(e, "log-bases", "kvedge-test-log-b", "b.kvb", -1, dir, sizeof dir);
    s_basis_dir(e, "log-bases", "kvedge-test-log-a", "a.kvb", -1, dir, sizeof dir);
    kt_log_t log = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kvedge_log_set_sink(kt_log_sink, &log);
    s_start_basis(e, true, false, dir);
    kvedge_log_set_sink(NULL, NULL);
    assert_int_equal(kt_log_count(&log, "2 coding bases loaded",
                                  "(models kvedge-test-log-a, kvedge-test-log-b)", NULL),
                     1);
    kt_log_clear(&log);
    assert_non_null(kvedge_basis_find_model("kvedge-test-log-a"));
    assert_non_null(kvedge_basis_find_model("kvedge-test-log-b"));
}

/* A basis file that does not load refuses the start with the loader's reason, naming the
 * file, before the store is opened. */
static void test_bad_basis_refuses_start(void **state)
{
    s_env_t *e = *state;
    char dir[400];
    s_basis_dir(e, "bad-bases", S_MODEL, "opt.kvb", 40, dir,
                sizeof dir); /* in the model id: digest */
    char data[sizeof e->dir];
    snprintf(data, sizeof data, "%s", e->dir);
    snprintf(e->dir, sizeof e->dir, "%.200s/store", data); /* not created by a refused start */
    char why[512] = "";
    int rc = s_try_start(e, true, false, dir, why, sizeof why);
    snprintf(e->dir, sizeof e->dir, "%s", data);
    assert_int_equal(rc, KVEDGE_ECORRUPT);
    assert_null(e->node);
    if (!strstr(why, "opt.kvb") || !strstr(why, "basis"))
        fail_msg("the reason does not name the file and the setting: %s", why);
    char store[400];
    snprintf(store, sizeof store, "%s/store", e->dir);
    assert_int_equal(access(store, F_OK), -1);
    assert_null(kvedge_basis_find_model(S_MODEL));
    /* A directory that cannot be read is refused too. */
    snprintf(dir, sizeof dir, "%s/no-such-dir", e->dir);
    assert_int_equal(s_try_start(e, true, false, dir, why, sizeof why), KVEDGE_EIO);
    assert_null(e->node);
}

/* With the basis, "tc,int8" is served at tc: the bytes kvedge_block_transcode_at makes of the
 * stored block for its model, layer and head, decoding within the basis's step of the
 * originals; the start logs the bases it loaded. */
static void test_tc_served_with_basis(void **state)
{
    s_env_t *e = *state;
    char dir[400];
    s_basis_dir(e, "bases", S_MODEL, "opt.kvb", -1, dir, sizeof dir);
    kt_log_t log = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kvedge_log_set_sink(kt_log_sink, &log);
    s_start_basis(e, true, false, dir);
    kvedge_log_set_sink(NULL, NULL);
    assert_int_equal(kt_log_count(&log, "1 coding bases loaded", "models " S_MODEL, NULL), 1);
    kt_log_clear(&log);
    assert_non_null(kvedge_basis_find_model(S_MODEL));
    s_put(e, KVEDGE_SCHEME_LOSSLESS, 0);
    uint8_t *buf = malloc(S_BUF);
    kvedge_fetched_t out[S_HEADS];
    int st[S_HEADS];
    kvedge_prec_t rung[S_HEADS];
    kvedge_prec_t a[] = {S_TC, S_INT8};
    assert_int_equal(s_layer(e, a, 2, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_TC);
    static uint16_t k0[S_TOKENS * S_DIM], v0[S_TOKENS * S_DIM];
    static float k[S_TOKENS * S_DIM], v[S_TOKENS * S_DIM], kr[S_TOKENS * S_DIM],
        vr[S_TOKENS * S_DIM];
    for (uint16_t h = 0; h < S_HEADS; h++) {
        kvedge_block_key_t key = s_key(e, h);
        kvedge_value_t sv;
        assert_int_equal(kvedge_engine_get(e->engine, &key, &sv), 0);
        kvedge_block_info_t info, tinfo;
        assert_int_equal(kvedge_block_parse(sv.data, sv.len, &info), 0);
        uint8_t *d = NULL;
        size_t dl = 0;
        assert_int_equal(kvedge_block_transcode_at(&info, S_TC, true, S_MODEL, 0, h, &d, &dl), 0);
        kvedge_value_release(&sv);
        assert_int_equal(out[h].len, dl);
        assert_memory_equal(buf + out[h].offset, d, dl);
        free(d);
        /* Within the tc error of what was put. */
        assert_int_equal(kvedge_block_parse(buf + out[h].offset, out[h].len, &tinfo), 0);
        assert_int_equal(kvedge_block_decode(&tinfo, KVEDGE_DTYPE_FP32, k, v), 0);
        assert_int_equal(kvedge_synth_head(h + 1, 0, S_TOKENS, S_DIM, KVEDGE_DTYPE_FP16, k0, v0),
                         0);
        kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, k0, S_TOKENS * S_DIM, kr);
        kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, v0, S_TOKENS * S_DIM, vr);
        for (size_t i = 0; i < S_TOKENS * S_DIM; i++) {
            float tol = S_TC_STEP / 2 + 2e-3f * (1 + fabsf(kr[i]) + fabsf(vr[i]));
            if (fabsf(k[i] - kr[i]) > tol || fabsf(v[i] - vr[i]) > tol)
                fail_msg("head %u value %zu: K %g vs %g, V %g vs %g", h, i, k[i], kr[i], v[i],
                         vr[i]);
        }
    }
    free(buf);
}

/* ---- a raw peer: lists the client library would refuse locally ---- */

static zframe_t *s_hdr(uint8_t op, uint64_t id, uint32_t count, uint32_t credit)
{
    kvedge_wire_header_t h = {1, op, 0, id, 0, count, credit, 5000};
    uint8_t b[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, b);
    return zframe_new(b, sizeof b);
}

/* Sends GET_LAYER (layer 0 of e->id) or GET (its 12 keys) with `acc` as the accept frame and
 * returns the status of the reply (GET_LAYER: of its END, skipping data messages). */
static int32_t s_raw(s_env_t *e, zsock_t *s, uint8_t op, const uint8_t *acc, size_t n)
{
    static uint64_t rid = 100;
    zmsg_t *m = zmsg_new();
    if (op == KVEDGE_OP_GET_LAYER) {
        zframe_t *h = s_hdr(op, ++rid, 1, 64); /* credit for every head: no CREDIT needed */
        zmsg_append(m, &h);
        uint8_t f1[4 + KVEDGE_CHUNK_ID_BYTES] = {0};
        memcpy(f1 + 4, e->id.bytes, KVEDGE_CHUNK_ID_BYTES);
        zmsg_addmem(m, f1, sizeof f1);
    } else {
        zframe_t *h = s_hdr(op, ++rid, S_HEADS, 0);
        zmsg_append(m, &h);
        uint8_t keys[S_HEADS * KVEDGE_WIRE_KEY_BYTES];
        for (uint16_t i = 0; i < S_HEADS; i++) {
            kvedge_block_key_t k = {e->id, 0, i};
            kvedge_wire_key_pack(&k, keys + i * KVEDGE_WIRE_KEY_BYTES);
        }
        zmsg_addmem(m, keys, sizeof keys);
    }
    zmsg_addmem(m, acc, n);
    assert_int_equal(zmsg_send(&m, s), 0);
    while (true) {
        zmsg_t *r = zmsg_recv(s);
        if (!r)
            fail_msg("no reply to %s with a %zu-byte accept list", kvedge_wire_op_name(op), n);
        zframe_t *f = zmsg_first(r);
        kvedge_wire_header_t h;
        assert_int_equal(kvedge_wire_header_parse(zframe_data(f), zframe_size(f), &h), 0);
        zmsg_destroy(&r);
        if (op != KVEDGE_OP_GET_LAYER || (h.flags & KVEDGE_WIRE_FLAG_END))
            return h.status;
    }
}

static void test_bad_lists_refused(void **state)
{
    s_env_t *e = *state;
    s_start(e, true, false);
    s_put(e, KVEDGE_SCHEME_LOSSLESS, 0);
    zsock_t *s = zsock_new(ZMQ_DEALER);
    zsock_set_linger(s, 0);
    zsock_set_rcvtimeo(s, 3000);
    assert_int_equal(zsock_connect(s, "%s", kvedge_node_endpoint(e->node)), 0);
    const uint8_t unknown[] = {0x7F}, stored[] = {0}, dup[] = {2, 3, 2}, good[] = {3, 2};
    const uint8_t nine[] = {1, 2, 3, 4, 5, 0x21, 0x22, 0x23, 0x24};
    uint8_t ops[] = {KVEDGE_OP_GET_LAYER, KVEDGE_OP_GET};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(s_raw(e, s, ops[i], NULL, 0), KVEDGE_EINVAL);    /* empty */
        assert_int_equal(s_raw(e, s, ops[i], unknown, 1), KVEDGE_EINVAL); /* unknown rung */
        assert_int_equal(s_raw(e, s, ops[i], stored, 1), KVEDGE_EINVAL);  /* 0 is no rung */
        assert_int_equal(s_raw(e, s, ops[i], dup, 3), KVEDGE_EINVAL);     /* contradictory */
        assert_int_equal(s_raw(e, s, ops[i], nine, 9), KVEDGE_EPROTO);    /* over the bound */
        assert_int_equal(s_raw(e, s, ops[i], good, 2), KVEDGE_OK);
    }
    zsock_destroy(&s);
    /* The library refuses the same lists before sending anything. */
    uint8_t *buf = malloc(S_BUF);
    kvedge_fetched_t out[S_HEADS];
    uint32_t heads;
    kvedge_prec_t bad[] = {S_INT8, S_INT8};
    assert_int_equal(kvedge_client_get_layer_prec(e->client, &e->id, 1, 0, bad, 2, buf, S_BUF, out,
                                                  S_HEADS, &heads),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_get_layer_prec(e->client, &e->id, 1, 0, bad, 0, buf, S_BUF, out,
                                                  S_HEADS, &heads),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_client_get_layer_prec(e->client, &e->id, 1, 0, NULL, 1, buf, S_BUF, out,
                                                  S_HEADS, &heads),
                     KVEDGE_EINVAL);
    /* And the node still serves a good client. */
    int st[S_HEADS];
    kvedge_prec_t rung[S_HEADS];
    kvedge_prec_t a[] = {S_INT8};
    assert_int_equal(s_layer(e, a, 1, st, rung, buf, out), 0);
    s_expect_all(st, rung, KVEDGE_OK, S_INT8);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_served_in_accept_order, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_lossless_only_never_quantized, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_derive_off_and_keep, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_bad_lists_refused, s_setup, s_teardown),
        /* In this order: the last registers S_MODEL's basis in this process. */
        cmocka_unit_test_setup_teardown(test_tc_without_basis_serves_next, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_bases_loaded_and_logged, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_bad_basis_refuses_start, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_tc_served_with_basis, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
