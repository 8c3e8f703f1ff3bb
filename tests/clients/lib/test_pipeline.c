/* The pipelined loader (clients/lib/pipeline.h) against an in-process store node and an
 * in-process edge proxy on ipc:// endpoints: every layer lands bit-identical to decoding the
 * same blocks with kvedge_block_decode into the same layout (contiguous and paged, int8 and
 * int4, lz4 and masked blocks, a short last chunk, a token offset), layers become resident in
 * layer order, a layer missing on the node is a miss while the others arrive, a destination
 * too small is refused before anything is fetched, a ring of 2 slots still delivers 12
 * layers, and a node that is gone gives an error within the deadline. On the CPU path bodies
 * stored uncompressed are dequantized in place from their received frames (zero-copy; lz4
 * bodies in the same layers are copied), still bit-identical; a block damaged on the wire
 * (a fake node) on that path is rejected as before: its layer is a miss, nothing written.
 * While a FETCH pipeline's ring is full (a fake proxy; the loader held inside an adaptation),
 * the client's I/O thread does not wait for a slot: another call on the same client completes
 * within its deadline, the proxy is held back by credit, and every layer still lands. The
 * transform-coded rung: with the model's basis loaded (the node's, registered in this process)
 * tc blocks are decoded on the host and land as kvedge_block_decode of them; without it, a
 * request accepting tc is refused with KVEDGE_ENOBASIS before anything is fetched.
 *
 * Built a second time with S_GPU_ONLY as test_pipeline_gpu: the same bit-identity checks with
 * device destinations on the device path; exits 77 where there is no device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "access/frame.h"
#include "store/node/node.h"
#include "clients/lib/kvedge.h"
#include "clients/lib/pipeline.h"
#include "gpu/gpu.h"
#include "gpu/stage.h"
#include "proxy/proxy.h"
#include "access/codec/basis.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"
#include "tests/common/basis_fixture.h"
#include "tests/common/testutil.h"

#define S_MODEL        "opt-125m" /* built in: 12 layers x 12 heads x 64 */
#define S_LAYERS       12
#define S_HEADS        12
#define S_HD           64
#define S_CHUNK_TOKENS 256
#define S_CHUNKS       2
#define S_TOKENS       (S_CHUNK_TOKENS + 100) /* a short last chunk */
#define S_OFFSET       3                      /* destination position of token 0 */
#define S_PAGE         16
#define S_MISSING      5 /* the layer the holey context lacks */

/* ---------------------------------------------------------------- contexts */

typedef struct {
    kvedge_chunk_id_t ids[S_CHUNKS];
    uint8_t *block[S_LAYERS][S_CHUNKS][S_HEADS];
    size_t len[S_LAYERS][S_CHUNKS][S_HEADS];
    uint32_t lz4_blocks, masked_blocks;
} s_ctx_t;

static s_ctx_t s_int8, s_int4, s_holey, s_lossless;

/* The coding basis of S_MODEL the node and this process load (the transform-coded rung). */
#define S_TC_STEP 0.125f

static uint32_t s_chunk_tokens(uint32_t ci)
{
    return ci + 1 < S_CHUNKS ? S_CHUNK_TOKENS : S_TOKENS - ci * S_CHUNK_TOKENS;
}

/* int8: every other token's V zeroed, so lz4 pays on some bodies. int4: groups of 32 and a
 * ThinK mask (every fourth key channel dropped) on odd heads. */
static void s_make(s_ctx_t *c, kvedge_scheme_t scheme, uint32_t salt)
{
    memset(c, 0, sizeof *c);
    uint32_t tok[S_TOKENS];
    for (uint32_t i = 0; i < S_TOKENS; i++)
        tok[i] = 7 * i + salt;
    assert_int_equal(
        kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, S_CHUNK_TOKENS, c->ids, S_CHUNKS),
        S_CHUNKS);
    uint8_t mask[S_HD / 8];
    memset(mask, 0x77, sizeof mask);
    static uint16_t k[S_CHUNK_TOKENS * S_HD], v[S_CHUNK_TOKENS * S_HD];
    for (uint32_t l = 0; l < S_LAYERS; l++)
        for (uint32_t ci = 0; ci < S_CHUNKS; ci++)
            for (uint32_t h = 0; h < S_HEADS; h++) {
                uint32_t t = s_chunk_tokens(ci);
                kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16,
                                            scheme,
                                            t,
                                            S_HD,
                                            (uint16_t)(scheme == KVEDGE_SCHEME_INT4 ? 32 : 0),
                                            scheme == KVEDGE_SCHEME_INT4 && h % 2 ? mask : NULL,
                                            true};
                assert_int_equal(kvedge_synth_head(salt * 100000 + l * 1000 + ci * 100 + h,
                                                   ci * S_CHUNK_TOKENS, t, S_HD, KVEDGE_DTYPE_FP16,
                                                   k, v),
                                 0);
                if (scheme == KVEDGE_SCHEME_INT8)
                    for (uint32_t i = 0; i < t; i += 2)
                        memset(v + (size_t)i * S_HD, 0, S_HD * 2);
                size_t cap = kvedge_block_encoded_bound(&spec);
                c->block[l][ci][h] = malloc(cap);
                assert_non_null(c->block[l][ci][h]);
                assert_int_equal(
                    kvedge_block_encode(&spec, k, v, c->block[l][ci][h], cap, &c->len[l][ci][h]),
                    0);
                kvedge_block_info_t info;
                assert_int_equal(kvedge_block_parse(c->block[l][ci][h], c->len[l][ci][h], &info),
                                 0);
                c->lz4_blocks += info.lz4;
                c->masked_blocks += info.key_mask != NULL;
            }
}

static void s_free_ctx(s_ctx_t *c)
{
    for (uint32_t l = 0; l < S_LAYERS; l++)
        for (uint32_t ci = 0; ci < S_CHUNKS; ci++)
            for (uint32_t h = 0; h < S_HEADS; h++)
                free(c->block[l][ci][h]);
}

static kvedge_client_t *s_client(const char *ep, int deadline_ms)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = deadline_ms;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    return c;
}

/* Puts every layer of a context but `skip` (-1: none). */
static void s_put(const char *ep, const s_ctx_t *ctx, int skip)
{
    kvedge_client_t *c = s_client(ep, 10000);
    kvedge_put_item_t items[S_HEADS];
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        if ((int)l == skip)
            continue;
        for (uint32_t ci = 0; ci < S_CHUNKS; ci++) {
            for (uint32_t h = 0; h < S_HEADS; h++) {
                memset(&items[h], 0, sizeof items[h]);
                items[h].chunk.id = ctx->ids[ci];
                items[h].chunk.has_parent = ci > 0;
                if (ci > 0)
                    items[h].chunk.parent = ctx->ids[ci - 1];
                snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, S_MODEL);
                items[h].chunk.index = ci;
                items[h].chunk.tokens = s_chunk_tokens(ci);
                items[h].layer = (uint16_t)l;
                items[h].head = (uint16_t)h;
                items[h].block = ctx->block[l][ci][h];
                items[h].len = ctx->len[l][ci][h];
            }
            assert_int_equal(kvedge_client_put(c, items, S_HEADS, NULL), 0);
        }
    }
    kvedge_client_destroy(&c);
}

/* ---------------------------------------------------------------- node and proxy */

typedef struct {
    char dir[200];
    char ep[250];
    kvedge_node_t *node;
} s_node_t;

/* The coding-basis directory the next node started gets (NULL: none). */
static const char *s_node_basis;

static void s_node_start(s_node_t *n, const char *root, const char *name)
{
    memset(n, 0, sizeof *n);
    snprintf(n->dir, sizeof n->dir, "%.120s/%.60s", root, name);
    snprintf(n->ep, sizeof n->ep, "ipc://%.200s.sock", n->dir);
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s", n->dir);
    snprintf(ns.bind, sizeof ns.bind, "%s", n->ep);
    snprintf(ns.name, sizeof ns.name, "%s", name);
    if (s_node_basis)
        snprintf(ns.basis, sizeof ns.basis, "%s", s_node_basis);
    char why[512];
    if (kvedge_node_start(&ns, &n->node, why, sizeof why) != 0)
        fail_msg("start %s: %s", name, why);
}

static void s_node_stop(s_node_t *n)
{
    kvedge_node_destroy(&n->node);
}

static void s_rmrf(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* One node with the three contexts and one proxy in front of it, for the whole group. */
static struct {
    char root[64];
    s_node_t node;
    kvedge_proxy_t *proxy;
    char proxy_ep[300];
} s_env;

static int s_setup(void **state)
{
    (void)state;
    s_make(&s_int8, KVEDGE_SCHEME_INT8, 1);
    s_make(&s_int4, KVEDGE_SCHEME_INT4, 2);
    s_make(&s_holey, KVEDGE_SCHEME_INT8, 3);
    s_make(&s_lossless, KVEDGE_SCHEME_LOSSLESS, 4);
    snprintf(s_env.root, sizeof s_env.root, "/tmp/kvedge-pipeline-XXXXXX");
    assert_non_null(mkdtemp(s_env.root));
    /* node1 loads S_MODEL's basis (and so registers it in this process, the client's too). */
    char bases[200], file[300];
    snprintf(bases, sizeof bases, "%s/bases", s_env.root);
    assert_int_equal(mkdir(bases, 0700), 0);
    snprintf(file, sizeof file, "%s/opt.kvb", bases);
    assert_int_equal(kt_basis_write(file, S_MODEL, S_LAYERS, S_HEADS, S_HD, S_TC_STEP, 5), 0);
    s_node_basis = bases;
    s_node_start(&s_env.node, s_env.root, "node1");
    s_node_basis = NULL;
    s_put(s_env.node.ep, &s_int8, -1);
    s_put(s_env.node.ep, &s_int4, -1);
    s_put(s_env.node.ep, &s_holey, S_MISSING);
    s_put(s_env.node.ep, &s_lossless, -1);

    kvedge_proxy_source_t src;
    char spec[600];
    snprintf(spec, sizeof spec, "cloud node1 %s bw=1000000000 rtt=200", s_env.node.ep);
    assert_int_equal(kvedge_proxy_source_parse(spec, &src), 0);
    snprintf(s_env.proxy_ep, sizeof s_env.proxy_ep, "ipc://%s/proxy.sock", s_env.root);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = s_env.proxy_ep;
    po.insecure = true;
    po.id = "proxy-t";
    po.sources = &src;
    po.nsources = 1;
    char why[256];
    if (kvedge_proxy_start(&po, &s_env.proxy, why, sizeof why) != 0)
        fail_msg("proxy: %s", why);
    assert_int_equal(kvedge_proxy_wait_sources(s_env.proxy, 1, 5000), 0);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    kvedge_proxy_destroy(&s_env.proxy);
    s_node_stop(&s_env.node);
    s_rmrf(s_env.root);
    s_free_ctx(&s_int8);
    s_free_ctx(&s_int4);
    s_free_ctx(&s_holey);
    s_free_ctx(&s_lossless);
    return 0;
}

/* ---------------------------------------------------------------- destinations */

#define S_FILL 0xA5 /* what every destination holds before the pipeline runs */

typedef struct {
    kvedge_kv_layout_t layout;
    kvedge_dtype_t dtype;
    bool on_device; /* kvedge_gpu_dev_alloc memory */
    kvedge_kv_dst_t k[S_LAYERS], v[S_LAYERS];
    int32_t table[64];
} s_dst_t;

static void s_dst_make(s_dst_t *d, kvedge_kv_layout_t layout, kvedge_dtype_t dtype, bool on_device)
{
    memset(d, 0, sizeof *d);
    d->layout = layout;
    d->dtype = dtype;
    d->on_device = on_device;
    uint32_t end = S_OFFSET + S_TOKENS, pages = (end + S_PAGE - 1) / S_PAGE;
    uint32_t num_pages = pages + 3;
    for (uint32_t i = 0; i < pages; i++)
        d->table[i] = (int32_t)(num_pages - 1 - i); /* reversed: logical != physical */
    kvedge_kv_dst_t t = {.layout = layout,
                         .dtype = dtype,
                         .heads = S_HEADS,
                         .head_dim = S_HD,
                         .tokens_cap = end + 5,
                         .page_size = S_PAGE,
                         .num_pages = num_pages,
                         .page_table = d->table,
                         .table_len = pages};
    if (layout == KVEDGE_KV_CONTIG) {
        t.page_table = NULL;
        t.table_len = 0;
        t.page_size = 0;
        t.num_pages = 0;
    }
    t.cap_bytes = (size_t)kvedge_dequant_dst_bytes(&t);
    uint8_t *fill = malloc(t.cap_bytes);
    assert_non_null(fill);
    memset(fill, S_FILL, t.cap_bytes);
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        kvedge_kv_dst_t *x[2] = {&d->k[l], &d->v[l]};
        for (int j = 0; j < 2; j++) {
            *x[j] = t;
            if (on_device) {
                assert_int_equal(kvedge_gpu_dev_alloc(t.cap_bytes, &x[j]->base), 0);
                assert_int_equal(kvedge_gpu_copy_h2d(x[j]->base, fill, t.cap_bytes, NULL), 0);
                assert_int_equal(kvedge_gpu_stream_sync(NULL), 0);
            } else {
                x[j]->base = malloc(t.cap_bytes);
                assert_non_null(x[j]->base);
                memcpy(x[j]->base, fill, t.cap_bytes);
            }
        }
    }
    free(fill);
}

static void s_dst_free(s_dst_t *d)
{
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        if (d->on_device) {
            kvedge_gpu_dev_free(d->k[l].base);
            kvedge_gpu_dev_free(d->v[l].base);
        } else {
            free(d->k[l].base);
            free(d->v[l].base);
        }
    }
}

/* A host copy of one destination tensor. Caller frees. */
static uint8_t *s_dst_host(const s_dst_t *d, const kvedge_kv_dst_t *x)
{
    uint8_t *h = malloc(x->cap_bytes);
    assert_non_null(h);
    if (d->on_device) {
        assert_int_equal(kvedge_gpu_copy_d2h(h, x->base, x->cap_bytes, NULL), 0);
        assert_int_equal(kvedge_gpu_stream_sync(NULL), 0);
    } else {
        memcpy(h, x->base, x->cap_bytes);
    }
    return h;
}

/* Where position p of head h lives in a destination laid out like x. */
static size_t s_row_off(const kvedge_kv_dst_t *x, uint32_t h, uint32_t p)
{
    size_t row = (size_t)x->head_dim * kvedge_dtype_size(x->dtype);
    if (x->layout == KVEDGE_KV_CONTIG)
        return ((size_t)h * x->tokens_cap + p) * row;
    size_t page = (size_t)x->page_table[p / x->page_size];
    return ((page * x->page_size + p % x->page_size) * x->heads + h) * row;
}

/* The rung the node is expected to serve the stored blocks at (0: as stored): s_expect
 * transcodes each to it first (kvedge_block_transcode_at, as the node derives it). */
static kvedge_prec_t s_expect_at;

/* The expected K and V of one layer: the fill, then every block decoded with
 * kvedge_block_decode and placed row by row. Caller frees both. */
static void s_expect(const s_ctx_t *ctx, uint32_t l, const kvedge_kv_dst_t *x, uint8_t **k_out,
                     uint8_t **v_out)
{
    uint8_t *k = malloc(x->cap_bytes), *v = malloc(x->cap_bytes);
    assert_true(k && v);
    memset(k, S_FILL, x->cap_bytes);
    memset(v, S_FILL, x->cap_bytes);
    size_t es = kvedge_dtype_size(x->dtype), row = (size_t)S_HD * es;
    uint8_t *bk = malloc(S_CHUNK_TOKENS * row), *bv = malloc(S_CHUNK_TOKENS * row);
    assert_true(bk && bv);
    for (uint32_t ci = 0; ci < S_CHUNKS; ci++)
        for (uint32_t h = 0; h < S_HEADS; h++) {
            kvedge_block_info_t info;
            assert_int_equal(kvedge_block_parse(ctx->block[l][ci][h], ctx->len[l][ci][h], &info),
                             0);
            uint8_t *at = NULL;
            size_t at_len = 0;
            if (s_expect_at) {
                assert_int_equal(kvedge_block_transcode_at(&info, s_expect_at, true, S_MODEL, l, h,
                                                           &at, &at_len),
                                 0);
                assert_int_equal(kvedge_block_parse(at, at_len, &info), 0);
            }
            assert_int_equal(kvedge_block_decode(&info, x->dtype, bk, bv), 0);
            free(at);
            for (uint32_t t = 0; t < info.tokens; t++) {
                uint32_t p = S_OFFSET + ci * S_CHUNK_TOKENS + t;
                memcpy(k + s_row_off(x, h, p), bk + t * row, row);
                memcpy(v + s_row_off(x, h, p), bv + t * row, row);
            }
        }
    free(bk);
    free(bv);
    *k_out = k;
    *v_out = v;
}

/* ---------------------------------------------------------------- running */

typedef struct {
    int status[S_LAYERS];
    kvedge_pipeline_stats_t st;
    kvedge_pipeline_layer_stats_t ls[S_LAYERS];
    double ms;
} s_run_t;

/* The accept list s_opts gives the pipeline (NULL: the blocks as stored). */
static const kvedge_prec_t *s_accept;
static size_t s_n_accept;

static void s_opts(kvedge_pipeline_opts_t *o, kvedge_client_t *c, const kvedge_model_t *m,
                   const s_ctx_t *ctx, const s_dst_t *d)
{
    kvedge_pipeline_opts_default(o);
    o->accept = s_accept;
    o->n_accept = s_n_accept;
    o->client = c;
    o->model = m;
    o->chunks = ctx->ids;
    o->n_chunks = S_CHUNKS;
    o->chunk_tokens = S_CHUNK_TOKENS;
    o->tokens = S_TOKENS;
    o->first_layer = 0;
    o->layers = S_LAYERS;
    o->k = d->k;
    o->v = d->v;
    o->token_offset = S_OFFSET;
    o->on_device = d->on_device;
    o->deadline_ms = 20000;
}

/* Opens a pipeline, waits for every layer in increasing order, records what each returned. */
static void s_run(const char *ep, const s_ctx_t *ctx, s_dst_t *d, uint32_t ring, s_run_t *r)
{
    memset(r, 0, sizeof *r);
    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    kvedge_client_t *c = s_client(ep, 20000);
    kvedge_pipeline_opts_t o;
    s_opts(&o, c, &m, ctx, d);
    o.ring_slots = ring;
    int64_t t0 = zclock_usecs();
    kvedge_pipeline_t *p = NULL;
    assert_int_equal(kvedge_pipeline_open(&o, &p), 0);
    assert_non_null(p);
    for (uint16_t l = 0; l < S_LAYERS; l++)
        r->status[l] = kvedge_pipeline_wait(p, l);
    r->ms = (double)(zclock_usecs() - t0) / 1e3;
    assert_int_equal(kvedge_pipeline_stats(p, &r->st, r->ls, S_LAYERS), 0);
    kvedge_pipeline_destroy(&p);
    assert_null(p);
    kvedge_pipeline_destroy(&p); /* idempotent */
    kvedge_client_destroy(&c);
}

/* Every layer but `missing` (-1: none) resident and bit-identical to kvedge_block_decode in
 * the same layout; `missing` reported as a miss and untouched; resident in layer order. */
static void s_check(const s_ctx_t *ctx, const s_dst_t *d, const s_run_t *r, int missing)
{
    uint32_t resident = 0;
    double last_us = 0;
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        const kvedge_pipeline_layer_stats_t *ls = &r->ls[l];
        assert_int_equal(ls->layer, l);
        assert_true(ls->done);
        uint8_t *gk = s_dst_host(d, &d->k[l]), *gv = s_dst_host(d, &d->v[l]);
        if ((int)l == missing) {
            assert_int_equal(r->status[l], KVEDGE_ENOTFOUND);
            assert_int_equal(ls->status, KVEDGE_ENOTFOUND);
            for (size_t i = 0; i < d->k[l].cap_bytes; i++)
                if (gk[i] != S_FILL || gv[i] != S_FILL)
                    fail_msg("layer %u: a missed layer's destination was written", l);
        } else {
            assert_int_equal(r->status[l], 0);
            assert_int_equal(ls->status, 0);
            assert_int_equal(ls->blocks, S_CHUNKS * S_HEADS);
            /* resident in layer order: each later than the one before, ranks increasing */
            assert_int_equal(ls->order, resident);
            assert_true(ls->resident_us >= last_us);
            assert_true(ls->resident_us >= ls->arrived_us);
            last_us = ls->resident_us;
            resident++;
            uint8_t *ek, *ev;
            s_expect(ctx, l, &d->k[l], &ek, &ev);
            if (memcmp(gk, ek, d->k[l].cap_bytes) != 0)
                fail_msg("layer %u: K differs from kvedge_block_decode", l);
            if (memcmp(gv, ev, d->v[l].cap_bytes) != 0)
                fail_msg("layer %u: V differs from kvedge_block_decode", l);
            free(ek);
            free(ev);
        }
        free(gk);
        free(gv);
    }
    assert_int_equal(r->st.resident, resident);
    assert_int_equal(r->st.misses, missing >= 0 ? 1 : 0);
    assert_int_equal(r->st.failed, 0);
    assert_true(r->st.done_us > 0);
    assert_true(r->st.wire_bytes > 0 && r->st.raw_bytes > 0);
}

/* A block the CPU path may stage in place: stored uncompressed, body of 4 KiB or more
 * (clients/lib/pipeline.c S_ZC_MIN_BYTES). Whether it is also depends on where ZeroMQ put it. */
static bool s_zc_candidate(const uint8_t *block, size_t len)
{
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(block, len, &info), 0);
    return !info.lz4 && info.raw_len >= 4096;
}

/* Zero-copy on the CPU path: some blocks, never more than the candidates (so every lz4 body
 * was copied, and the bit-identity check covered both paths in one layer); none on the
 * device path. */
static void s_check_zero_copy(const s_ctx_t *ctx, const s_run_t *r)
{
    if (r->st.device) {
        assert_int_equal(r->st.zero_copy_blocks, 0);
        return;
    }
    uint32_t cand = 0;
    uint64_t bytes = 0;
    for (uint32_t l = 0; l < S_LAYERS; l++)
        for (uint32_t ci = 0; ci < S_CHUNKS; ci++)
            for (uint32_t h = 0; h < S_HEADS; h++)
                if (s_zc_candidate(ctx->block[l][ci][h], ctx->len[l][ci][h])) {
                    kvedge_block_info_t info;
                    kvedge_block_parse(ctx->block[l][ci][h], ctx->len[l][ci][h], &info);
                    cand++;
                    bytes += info.raw_len;
                }
    assert_true(cand > 0 || r->st.zero_copy_blocks == 0); /* s_int8: every body is lz4 */
    assert_true(cand == 0 || r->st.zero_copy_blocks > 0);
    assert_true(r->st.zero_copy_blocks <= cand);
    assert_true(r->st.zero_copy_bytes <= bytes && r->st.zero_copy_bytes <= r->st.raw_bytes);
    assert_true(r->st.zero_copy_bytes >= 4096ull * r->st.zero_copy_blocks);
}

static void s_bit_identity(const char *ep, const s_ctx_t *ctx, kvedge_kv_layout_t layout,
                           kvedge_dtype_t dtype, bool on_device, bool via_proxy)
{
    s_dst_t d;
    s_dst_make(&d, layout, dtype, on_device);
    s_run_t r;
    s_run(ep, ctx, &d, 0, &r);
    s_check(ctx, &d, &r, -1);
    assert_int_equal(r.st.via_proxy, via_proxy);
    assert_int_equal(r.st.device, on_device && kvedge_gpu_stage_on_device() == 1);
    assert_int_equal(r.st.ring_slots, KVEDGE_PIPELINE_RING_DEFAULT);
    s_check_zero_copy(ctx, &r);
    printf("%s %s %s%s: 12 layers resident in %.1f ms (%.2f MB on the wire, %u blocks "
           "zero-copy)\n",
           via_proxy ? "proxy" : "node", layout == KVEDGE_KV_CONTIG ? "contiguous" : "paged",
           kvedge_dtype_name(dtype), on_device ? " on_device" : "", r.ms,
           (double)r.st.wire_bytes / 1e6, r.st.zero_copy_blocks);
    s_dst_free(&d);
}

/* ---------------------------------------------------------------- tests */

static void test_contexts_exercise_lz4_and_masks(void **state)
{
    (void)state;
    assert_true(s_int8.lz4_blocks > 0);    /* the zeroed V rows make lz4 pay */
    assert_true(s_int4.masked_blocks > 0); /* odd heads are channel-pruned */
}

#ifndef S_GPU_ONLY

static void test_node_contiguous_int8(void **state)
{
    (void)state;
    s_bit_identity(s_env.node.ep, &s_int8, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false, false);
}

/* Asked for int8+ec, the node codes each stored int8 block (the same codes, recoded) and the
 * loader decodes the rANS body into the slot: bit-identical to kvedge_block_decode of the
 * stored block, nothing staged in place (a coded body is never the raw body). */
static void test_node_coded_rung_decodes_identically(void **state)
{
    (void)state;
    static const kvedge_prec_t accept[] = {KVEDGE_PREC_INT8 | KVEDGE_PREC_EC};
    s_accept = accept;
    s_n_accept = 1;
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
    s_run_t r;
    s_run(s_env.node.ep, &s_int8, &d, 0, &r);
    s_accept = NULL;
    s_n_accept = 0;
    s_check(&s_int8, &d, &r, -1);
    assert_int_equal(r.st.zero_copy_blocks, 0);
    s_dst_free(&d);
    /* What the node streamed for that list: version-2 blocks of the stored rung, coded. */
    kvedge_client_t *c = s_client(s_env.node.ep, 20000);
    static uint8_t buf[1u << 20];
    kvedge_fetched_t got[S_CHUNKS * S_HEADS];
    uint32_t heads = 0;
    assert_int_equal(kvedge_client_get_layer_prec(c, s_int8.ids, S_CHUNKS, 0, accept, 1, buf,
                                                  sizeof buf, got, S_CHUNKS * S_HEADS, &heads),
                     0);
    assert_int_equal(heads, S_HEADS);
    for (uint32_t i = 0; i < S_CHUNKS * S_HEADS; i++) {
        kvedge_block_info_t info;
        assert_int_equal(got[i].status, 0);
        assert_int_equal(kvedge_block_check(buf + got[i].offset, got[i].len, &info), 0);
        assert_true(info.ec);
        assert_int_equal(kvedge_prec_of_block(&info), accept[0]);
    }
    kvedge_client_destroy(&c);
}

static void test_node_paged_int4(void **state)
{
    (void)state;
    s_bit_identity(s_env.node.ep, &s_int4, KVEDGE_KV_PAGED, KVEDGE_DTYPE_BF16, false, false);
}

/* Asked for "tc,int8" of a lossless context, a node with the model's basis serves tc and the
 * loader decodes each block on the host: every layer equal to kvedge_block_decode of
 * kvedge_block_transcode_at of the stored blocks, and within the tc error of the originals. */
static void test_node_tc_rung(void **state)
{
    (void)state;
    static const kvedge_prec_t accept[] = {KVEDGE_PREC_TC, KVEDGE_PREC_INT8};
    s_accept = accept;
    s_n_accept = 2;
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_PAGED, KVEDGE_DTYPE_FP16, false);
    s_run_t r;
    s_run(s_env.node.ep, &s_lossless, &d, 0, &r);
    s_accept = NULL;
    s_n_accept = 0;
    s_expect_at = KVEDGE_PREC_TC;
    s_check(&s_lossless, &d, &r, -1);
    s_expect_at = 0;
    assert_int_equal(r.st.zero_copy_blocks, 0);
    /* Against the values put (the stored lossless blocks decoded): within half the basis's
     * step (a signed permutation: each value is one component), plus fp16 rounding. */
    double worst = 0;
    float got[S_HD], want[S_HD];
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        uint8_t *ek, *ev;
        s_expect(&s_lossless, l, &d.k[l], &ek, &ev);
        const uint8_t *gk = d.k[l].base, *gv = d.v[l].base;
        for (uint32_t h = 0; h < S_HEADS; h++)
            for (uint32_t t = 0; t < S_TOKENS; t++) {
                size_t at = s_row_off(&d.k[l], h, S_OFFSET + t);
                for (int kv = 0; kv < 2; kv++) {
                    kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, (kv ? gv : gk) + at, S_HD, got);
                    kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, (kv ? ev : ek) + at, S_HD, want);
                    for (uint32_t c = 0; c < S_HD; c++) {
                        double e = fabs((double)got[c] - want[c]);
                        worst = e > worst ? e : worst;
                    }
                }
            }
        free(ek);
        free(ev);
    }
    printf("tc: 12 layers in %.1f ms, %.2f MB on the wire, largest error %.4f (step %.3f)\n", r.ms,
           (double)r.st.wire_bytes / 1e6, worst, S_TC_STEP);
    assert_true(worst <= S_TC_STEP / 2 + 1e-2);
    s_dst_free(&d);
}

/* Through the proxy, a tc-only list: the proxy plans tc (the only rung), the node derives it,
 * the loader decodes it: the same values as kvedge_block_decode of the transcoded blocks. */
static void test_proxy_tc_rung(void **state)
{
    (void)state;
    static const kvedge_prec_t accept[] = {KVEDGE_PREC_TC};
    s_accept = accept;
    s_n_accept = 1;
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
    s_run_t r;
    s_run(s_env.proxy_ep, &s_lossless, &d, 2, &r);
    s_accept = NULL;
    s_n_accept = 0;
    s_expect_at = KVEDGE_PREC_TC;
    s_check(&s_lossless, &d, &r, -1);
    s_expect_at = 0;
    assert_true(r.st.via_proxy);
    s_dst_free(&d);
}

/* A model whose basis this process has not loaded: a tc request is refused up front. */
static void test_tc_refused_without_basis(void **state)
{
    (void)state;
    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    snprintf(m.id, sizeof m.id, "%s", "opt-125m-no-basis");
    assert_null(kvedge_basis_find_model(m.id));
    kvedge_client_t *c = s_client(s_env.node.ep, 20000);
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
    static const kvedge_prec_t accept[] = {KVEDGE_PREC_INT8, KVEDGE_PREC_TC};
    s_accept = accept;
    s_n_accept = 2;
    kvedge_pipeline_opts_t o;
    s_opts(&o, c, &m, &s_lossless, &d);
    s_accept = NULL;
    s_n_accept = 0;
    kvedge_pipeline_t *p = NULL;
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_ENOBASIS);
    assert_null(p);
    if (!strstr(kvedge_client_last_error(), "opt-125m-no-basis") ||
        !strstr(kvedge_client_last_error(), "tc"))
        fail_msg("the message does not name the model and the rung: %s",
                 kvedge_client_last_error());
    /* Without tc in the list the same request opens. */
    o.n_accept = 1;
    assert_int_equal(kvedge_pipeline_open(&o, &p), 0);
    for (uint16_t l = 0; l < S_LAYERS; l++)
        assert_int_equal(kvedge_pipeline_wait(p, l), 0);
    kvedge_pipeline_destroy(&p);
    kvedge_client_destroy(&c);
    s_dst_free(&d);
}

static void test_node_paged_int8_fp32(void **state)
{
    (void)state;
    s_bit_identity(s_env.node.ep, &s_int8, KVEDGE_KV_PAGED, KVEDGE_DTYPE_FP32, false, false);
}

static void test_node_contiguous_int4(void **state)
{
    (void)state;
    s_bit_identity(s_env.node.ep, &s_int4, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false, false);
}

/* Destinations from kvedge_gpu_dev_alloc: on this machine host memory and the CPU path, the
 * same calls a GPU machine makes. */
static void test_node_device_memory_api(void **state)
{
    (void)state;
    s_bit_identity(s_env.node.ep, &s_int8, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, true, false);
}

static void test_proxy_contiguous_int8(void **state)
{
    (void)state;
    s_bit_identity(s_env.proxy_ep, &s_int8, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false, true);
}

static void test_proxy_paged_int4(void **state)
{
    (void)state;
    s_bit_identity(s_env.proxy_ep, &s_int4, KVEDGE_KV_PAGED, KVEDGE_DTYPE_BF16, false, true);
}

static void test_missing_layer_is_a_miss(void **state)
{
    (void)state;
    const char *eps[2] = {s_env.node.ep, s_env.proxy_ep};
    for (int i = 0; i < 2; i++) {
        s_dst_t d;
        s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
        s_run_t r;
        s_run(eps[i], &s_holey, &d, 0, &r);
        s_check(&s_holey, &d, &r, S_MISSING);
        s_dst_free(&d);
    }
}

/* Two slots, twelve layers: bounded memory, nothing dropped, from both sources (the FETCH
 * receiver waits for a slot on the I/O thread; GET_LAYER opens a layer only into a free
 * slot). */
static void test_ring_of_two_delivers_everything(void **state)
{
    (void)state;
    const char *eps[2] = {s_env.node.ep, s_env.proxy_ep};
    for (int i = 0; i < 2; i++) {
        s_dst_t d;
        s_dst_make(&d, KVEDGE_KV_PAGED, KVEDGE_DTYPE_FP16, false);
        s_run_t r;
        s_run(eps[i], &s_int8, &d, 2, &r);
        s_check(&s_int8, &d, &r, -1);
        assert_int_equal(r.st.ring_slots, 2);
        printf("ring of 2 (%s): %.1f ms, receiver waited %.1f ms for slots\n", i ? "proxy" : "node",
               r.ms, r.st.ring_wait_us / 1e3);
        s_dst_free(&d);
    }
    /* One slot is the degenerate ring: still everything, one layer at a time. */
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
    s_run_t r;
    s_run(s_env.proxy_ep, &s_int4, &d, 1, &r);
    s_check(&s_int4, &d, &r, -1);
    s_dst_free(&d);
}

/* The ring pool: a pipeline's slot buffers go back to the pool at destroy, and the next
 * pipeline of the same shape takes all of them (allocating none) and delivers the same
 * bit-identical layers; with the cap at 0 nothing is kept and every pipeline allocates. */
static void test_ring_pool_reuses_slots(void **state)
{
    (void)state;
    kvedge_pipeline_pool_trim();
    kvedge_pipeline_pool_stats_t a = {.size = sizeof a}, b = {.size = sizeof b};
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
    s_run_t r;
    s_run(s_env.node.ep, &s_int8, &d, 2, &r);
    s_check(&s_int8, &d, &r, -1);
    assert_int_equal(kvedge_pipeline_pool_stats(&a), 0);
    assert_int_equal(a.held, 2);
    assert_int_equal(a.held_bytes, 2 * r.st.slot_bytes);

    s_run(s_env.node.ep, &s_int8, &d, 2, &r);
    s_check(&s_int8, &d, &r, -1);
    assert_int_equal(kvedge_pipeline_pool_stats(&b), 0);
    assert_int_equal(b.allocated, a.allocated);
    assert_int_equal(b.reused, a.reused + 2);
    assert_int_equal(b.held, 2);

    /* Cap 0: the held buffers are freed, and a pipeline's are freed at its destroy. */
    kvedge_pipeline_pool_set_cap(0);
    assert_int_equal(kvedge_pipeline_pool_stats(&a), 0);
    assert_int_equal(a.held, 0);
    assert_int_equal(a.held_bytes, 0);
    s_run(s_env.node.ep, &s_int8, &d, 2, &r);
    s_check(&s_int8, &d, &r, -1);
    assert_int_equal(kvedge_pipeline_pool_stats(&b), 0);
    assert_int_equal(b.allocated, a.allocated + 2);
    assert_int_equal(b.reused, a.reused);
    assert_int_equal(b.held, 0);
    assert_int_equal(b.freed, a.freed + 2);
    kvedge_pipeline_pool_set_cap(KVEDGE_PIPELINE_POOL_BYTES_DEFAULT);
    assert_int_equal(kvedge_pipeline_pool_stats(&b), 0);
    assert_int_equal(b.cap_bytes, KVEDGE_PIPELINE_POOL_BYTES_DEFAULT);

    /* A struct of an unknown, smaller layout is refused. */
    kvedge_pipeline_pool_stats_t small = {.size = sizeof(size_t)};
    assert_int_equal(kvedge_pipeline_pool_stats(&small), KVEDGE_EINVAL);
    assert_int_equal(kvedge_pipeline_pool_stats(NULL), KVEDGE_EINVAL);
    s_dst_free(&d);
}

/* A destination too small is refused with KVEDGE_ENOSPACE before anything is fetched; a
 * wrong shape or bad argument with KVEDGE_EINVAL. */
static void test_bad_destination_refused(void **state)
{
    (void)state;
    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    kvedge_client_t *c = s_client(s_env.node.ep, 5000);
    s_dst_t d, pg;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
    s_dst_make(&pg, KVEDGE_KV_PAGED, KVEDGE_DTYPE_FP16, false);
    kvedge_pipeline_opts_t o;
    kvedge_pipeline_t *p = NULL;

    s_opts(&o, c, &m, &s_int8, &d);
    d.k[7].tokens_cap = S_OFFSET + S_TOKENS - 1; /* one position short */
    d.k[7].cap_bytes = (size_t)kvedge_dequant_dst_bytes(&d.k[7]);
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_ENOSPACE);
    assert_null(p);
    d.k[7].tokens_cap = S_OFFSET + S_TOKENS + 5;
    d.k[7].cap_bytes = (size_t)kvedge_dequant_dst_bytes(&d.k[7]);
    d.v[3].cap_bytes -= 1; /* the tensor does not fit its buffer */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_ENOSPACE);
    d.v[3].cap_bytes += 1;
    o.token_offset = 10; /* the context would run past tokens_cap */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_ENOSPACE);
    o.token_offset = S_OFFSET;

    s_opts(&o, c, &m, &s_int8, &pg);
    pg.k[0].table_len -= 1; /* the page table does not reach the last position */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_ENOSPACE);
    pg.k[0].table_len += 1;
    pg.table[0] = (int32_t)pg.k[0].num_pages; /* a page that does not exist */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    pg.table[0] = (int32_t)pg.k[0].num_pages - 1;

    s_opts(&o, c, &m, &s_int8, &d);
    d.v[0].heads = S_HEADS - 1; /* not the model's shape */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    d.v[0].heads = S_HEADS;
    o.first_layer = 1; /* layers 1..12 of a 12-layer model */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.first_layer = 0;
    o.tokens = S_CHUNK_TOKENS; /* two chunks cannot hold only one chunk's tokens */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.tokens = S_TOKENS;
    o.ring_slots = S_LAYERS + 1;
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.ring_slots = 0;
    float t[S_LAYERS] = {0};
    o.compute_us = t; /* without recompute_us */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.compute_us = NULL;
    assert_int_equal(kvedge_pipeline_open(NULL, &p), KVEDGE_EINVAL);
    assert_int_equal(kvedge_pipeline_open(&o, NULL), KVEDGE_EINVAL);
    assert_null(p);

    /* The untouched options work, and out-of-range waits are refused. */
    assert_int_equal(kvedge_pipeline_open(&o, &p), 0);
    assert_int_equal(kvedge_pipeline_wait(p, S_LAYERS), KVEDGE_EINVAL);
    assert_int_equal(kvedge_pipeline_wait(NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_pipeline_ready(p, S_LAYERS), KVEDGE_EINVAL);
    assert_int_equal(kvedge_pipeline_ready(NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_pipeline_wait(p, 0), 0);
    assert_int_equal(kvedge_pipeline_ready(p, 0), 1);
    kvedge_pipeline_destroy(&p); /* with layers still in flight */
    kvedge_pipeline_destroy(NULL);
    /* Nothing is written after destroy returns, though streams are still in flight. */
    uint8_t *snap[S_LAYERS];
    for (uint32_t l = 0; l < S_LAYERS; l++)
        snap[l] = s_dst_host(&d, &d.k[l]);
    kt_pause_ms(300); /* a bounded look: a late write would land within it */
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        assert_memory_equal(snap[l], d.k[l].base, d.k[l].cap_bytes);
        free(snap[l]);
    }
    s_dst_free(&d);
    s_dst_free(&pg);
    kvedge_client_destroy(&c);
}

/* ---------------------------------------------------------------- large–small */

/* An adapt callback that must never run (no map anywhere in this test's world). */
static int s_adapt_never(void *arg, uint16_t layer, uint16_t from_layer, const float *k_src,
                         const float *v_src, uint32_t tokens, float *k_dst, float *v_dst)
{
    (void)layer, (void)from_layer, (void)k_src, (void)v_src, (void)tokens, (void)k_dst, (void)v_dst;
    (*(int *)arg)++;
    return KVEDGE_EINVAL;
}

/* A mapped model is refused where the pipeline cannot adapt: without adapt or chain, with a
 * store-node source, on the device path, with destinations that are not fp32 contiguous; and
 * the mapped fields without a mapped model. */
static void test_mapped_refused(void **state)
{
    (void)state;
    kvedge_model_t m, mm;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    assert_int_equal(kvedge_model_builtin("opt-1.3b", &mm), 0);
    kvedge_client_t *node = s_client(s_env.node.ep, 5000);
    kvedge_client_t *proxy = s_client(s_env.proxy_ep, 5000);
    s_dst_t d, h, pg;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP32, false);
    s_dst_make(&h, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
    s_dst_make(&pg, KVEDGE_KV_PAGED, KVEDGE_DTYPE_FP32, false);
    int calls = 0;
    kvedge_pipeline_opts_t o;
    kvedge_pipeline_t *p = NULL;
    s_opts(&o, proxy, &m, &s_int8, &d);
    o.mapped_model = &mm;
    o.mapped_chunks = s_int4.ids; /* any chain of as many chunks */
    o.adapt = s_adapt_never;
    o.adapt_arg = &calls;

    o.adapt = NULL; /* required with mapped_model */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.adapt = s_adapt_never;
    o.mapped_chunks = NULL;
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.mapped_chunks = s_int4.ids;
    o.mapped_model = &m; /* itself */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.mapped_model = &mm;
    o.on_device = true;
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.on_device = false;
    o.client = node; /* only a proxy serves another model's layers */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    s_opts(&o, proxy, &m, &s_int8, &h); /* fp16 destinations */
    o.mapped_model = &mm;
    o.mapped_chunks = s_int4.ids;
    o.adapt = s_adapt_never;
    o.adapt_arg = &calls;
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.k = d.k; /* fp32 K, fp16 V */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.k = pg.k; /* paged */
    o.v = pg.v;
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    s_opts(&o, proxy, &m, &s_int8, &d);
    o.adapt = s_adapt_never; /* without a mapped model */
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    o.adapt = NULL;
    o.mapped_chunks = s_int4.ids;
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_EINVAL);
    assert_null(p);
    assert_int_equal(calls, 0);
    s_dst_free(&d);
    s_dst_free(&h);
    s_dst_free(&pg);
    kvedge_client_destroy(&node);
    kvedge_client_destroy(&proxy);
}

/* A FETCH naming a mapped model that no layer map pairs with this one (this proxy has no
 * master): every layer comes as this model's own, bit-identical to a plain fetch, from_layer
 * -1, the adapter never called, and the request carries the mapped frame. */
static void test_mapped_without_map_is_own(void **state)
{
    (void)state;
    kvedge_model_t m, mm;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    assert_int_equal(kvedge_model_builtin("opt-1.3b", &mm), 0);
    kvedge_client_t *c = s_client(s_env.proxy_ep, 20000);
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP32, false);
    int calls = 0;
    kvedge_pipeline_opts_t o;
    s_opts(&o, c, &m, &s_int8, &d);
    o.mapped_model = &mm;
    o.mapped_chunks = s_int4.ids;
    o.adapt = s_adapt_never;
    o.adapt_arg = &calls;
    kvedge_pipeline_t *p = NULL;
    assert_int_equal(kvedge_pipeline_open(&o, &p), 0);
    s_run_t r;
    memset(&r, 0, sizeof r);
    for (uint16_t l = 0; l < S_LAYERS; l++)
        r.status[l] = kvedge_pipeline_wait(p, l);
    assert_int_equal(kvedge_pipeline_stats(p, &r.st, r.ls, S_LAYERS), 0);
    kvedge_pipeline_destroy(&p);
    s_check(&s_int8, &d, &r, -1);
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        assert_int_equal(r.ls[l].from_layer, -1);
        assert_false(r.ls[l].adapt_failed);
    }
    assert_int_equal(r.st.adapted, 0);
    assert_int_equal(calls, 0);
    assert_int_equal(r.st.sent_bytes, KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_SPEC_BYTES +
                                          2ull * S_CHUNKS * KVEDGE_CHUNK_ID_BYTES +
                                          KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES);
    s_dst_free(&d);
    kvedge_client_destroy(&c);
}

/* ---------------------------------------------------------------- plan and sources */

/* Opens a pipeline on ctx through ep, asks for the plan before any wait (plan_rc, blocking
 * until it arrives), then waits for every layer and takes the stats. times: give the proxy
 * compute/recompute estimates (compute_us each, recompute_us each). */
static void s_run_plan(const char *ep, const s_ctx_t *ctx, const float *times, s_run_t *r,
                       kvedge_fetch_plan_t *plan, int *plan_rc)
{
    memset(r, 0, sizeof *r);
    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    kvedge_client_t *c = s_client(ep, 20000);
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
    kvedge_pipeline_opts_t o;
    s_opts(&o, c, &m, ctx, &d);
    o.compute_us = times;
    o.recompute_us = times ? times + S_LAYERS : NULL;
    kvedge_pipeline_t *p = NULL;
    assert_int_equal(kvedge_pipeline_open(&o, &p), 0);
    *plan_rc = kvedge_pipeline_plan(p, plan);
    for (uint16_t l = 0; l < S_LAYERS; l++)
        r->status[l] = kvedge_pipeline_wait(p, l);
    assert_int_equal(kvedge_pipeline_stats(p, &r->st, r->ls, S_LAYERS), 0);
    /* Asked again once everything is done: the same answer. */
    kvedge_fetch_plan_t *again = malloc(sizeof *again);
    assert_non_null(again);
    assert_int_equal(kvedge_pipeline_plan(p, again), *plan_rc);
    if (*plan_rc == 0)
        assert_memory_equal(again, plan, sizeof *plan);
    free(again);
    assert_int_equal(kvedge_pipeline_plan(NULL, plan), KVEDGE_EINVAL);
    assert_int_equal(kvedge_pipeline_plan(p, NULL), KVEDGE_EINVAL);
    kvedge_pipeline_destroy(&p);
    kvedge_client_destroy(&c);
    s_dst_free(&d);
}

/* The bytes a FETCH stream's data messages take as docs/protocol.md encodes them: the plan,
 * per block a header and a BLOCK record plus the block, per layer a header and a LAYER
 * record. */
static uint64_t s_fetch_msg_bytes(const kvedge_fetch_plan_t *plan, const s_run_t *r)
{
    uint64_t n = KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_PLAN_BYTES +
                 (uint64_t)plan->nsources * KVEDGE_WIRE_FETCH_SOURCE_BYTES +
                 (uint64_t)plan->layers * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES;
    for (uint32_t l = 0; l < S_LAYERS; l++)
        n +=
            (uint64_t)r->ls[l].blocks * (KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_BLOCK_BYTES) +
            KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_LAYER_BYTES;
    return n + r->st.wire_bytes;
}

/* msg_bytes is the stream's messages as encoded, the end message included once it has come:
 * it follows the last LAYER record, so a snapshot taken right after the last wait may be
 * ahead of it. */
static void s_check_fetch_msg_bytes(const kvedge_fetch_plan_t *plan, const s_run_t *r)
{
    uint64_t n = s_fetch_msg_bytes(plan, r);
    if (r->st.msg_bytes != n + KVEDGE_WIRE_HEADER_BYTES)
        assert_int_equal(r->st.msg_bytes, n);
}

/* Through the proxy: the plan is there (asked before any layer arrived), names the node as
 * the source of every layer, and every layer's stats name the source the plan chose, its
 * kind and reason "planned"; the holey context's missing layer has no source and a miss
 * reason. The byte counters follow the protocol's encoding. */
static void test_proxy_plan_and_layer_sources(void **state)
{
    (void)state;
    kvedge_fetch_plan_t *plan = malloc(sizeof *plan);
    assert_non_null(plan);
    const s_ctx_t *ctxs[2] = {&s_int8, &s_holey};
    for (int ci = 0; ci < 2; ci++) {
        int missing = ci == 1 ? S_MISSING : -1;
        s_run_t r;
        int plan_rc = -1;
        s_run_plan(s_env.proxy_ep, ctxs[ci], NULL, &r, plan, &plan_rc);
        assert_int_equal(plan_rc, 0);
        assert_int_equal(plan->layers, S_LAYERS);
        assert_int_equal(plan->nsources, 1);
        assert_string_equal(plan->source[0].name, "node1");
        assert_int_equal(plan->source[0].kind, 2); /* cloud */
        assert_true(plan->total_us > 0 && plan->bound_us > 0);
        for (uint32_t l = 0; l < S_LAYERS; l++) {
            const kvedge_pipeline_layer_stats_t *ls = &r.ls[l];
            /* Without a directory the proxy assumes its one source holds every layer; once
             * a fetch found a layer missing there it plans it as nobody's (-1). The client
             * then runs the context through every layer below it anyway (decoder.h), so the
             * planner may recompute those too rather than fetch them (plan.h, R(l)). */
            bool recomputed = missing >= 0 && (int)l < missing && plan->layer[l].source == -1;
            if ((int)l != missing && !recomputed)
                assert_int_equal(plan->layer[l].source, 0);
            if (recomputed) {
                assert_int_equal(r.status[l], KVEDGE_ENOTFOUND);
                assert_int_equal(ls->reason, KVEDGE_FETCH_RECOMPUTE);
            } else if ((int)l == missing) {
                assert_int_equal(r.status[l], KVEDGE_ENOTFOUND);
                assert_string_equal(ls->source, "");
                assert_int_equal(ls->kind, -1);
                assert_true(plan->layer[l].source == 0 || plan->layer[l].source == -1);
                assert_int_equal(ls->reason, KVEDGE_FETCH_MISS); /* no other source has it */
            } else {
                assert_int_equal(r.status[l], 0);
                assert_string_equal(ls->source, plan->source[plan->layer[l].source].name);
                assert_int_equal(ls->kind, plan->source[plan->layer[l].source].kind);
                assert_int_equal(ls->reason, KVEDGE_FETCH_PLANNED);
            }
        }
        assert_int_equal(r.st.sent_bytes, KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_SPEC_BYTES +
                                              S_CHUNKS * KVEDGE_CHUNK_ID_BYTES);
        s_check_fetch_msg_bytes(plan, &r);
        printf("proxy %s: T %.2f ms (bound %.2f ms), sent %llu B, received %llu B (%llu B of "
               "blocks)\n",
               ci ? "holey" : "int8", plan->total_us / 1e3, plan->bound_us / 1e3,
               (unsigned long long)r.st.sent_bytes, (unsigned long long)r.st.msg_bytes,
               (unsigned long long)r.st.wire_bytes);
    }
    free(plan);
}

/* With the decoder's estimates and recomputation for free, the plan computes at least layer 0
 * locally: every layer it plans as recompute comes back as a miss with reason "recompute", no
 * source and no block, every other one from the plan's source; the request carried the
 * estimates (8 bytes per layer). */
static void test_proxy_planned_recompute(void **state)
{
    (void)state;
    float times[2 * S_LAYERS];
    for (int l = 0; l < S_LAYERS; l++) {
        times[l] = 1000.0f;         /* compute_us */
        times[S_LAYERS + l] = 0.0f; /* recompute_us */
    }
    kvedge_fetch_plan_t *plan = malloc(sizeof *plan);
    assert_non_null(plan);
    s_run_t r;
    int plan_rc = -1;
    s_run_plan(s_env.proxy_ep, &s_int8, times, &r, plan, &plan_rc);
    assert_int_equal(plan_rc, 0);
    /* Layer 0 arrives no earlier than a round trip: recomputing it for free is strictly
     * faster. Later layers may go either way (their arrival hides behind the decoder). */
    assert_int_equal(plan->layer[0].source, -1);
    uint32_t recomputed = 0;
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        const kvedge_pipeline_layer_stats_t *ls = &r.ls[l];
        if (plan->layer[l].source < 0) {
            recomputed++;
            assert_int_equal(r.status[l], KVEDGE_ENOTFOUND);
            assert_string_equal(ls->source, "");
            assert_int_equal(ls->kind, -1);
            assert_int_equal(ls->reason, KVEDGE_FETCH_RECOMPUTE);
            assert_int_equal(ls->blocks, 0);
        } else {
            assert_int_equal(r.status[l], 0);
            assert_string_equal(ls->source, plan->source[plan->layer[l].source].name);
            assert_int_equal(ls->reason, KVEDGE_FETCH_PLANNED);
        }
    }
    printf("planned recompute: %u of %d layers (T %.1f ms, recompute-all %.1f ms)\n", recomputed,
           S_LAYERS, plan->total_us / 1e3, plan->recompute_all_us / 1e3);
    assert_int_equal(r.st.misses, recomputed);
    assert_int_equal(r.st.sent_bytes, KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_FETCH_SPEC_BYTES +
                                          S_CHUNKS * KVEDGE_CHUNK_ID_BYTES +
                                          S_LAYERS * KVEDGE_WIRE_FETCH_TIMES_BYTES);
    s_check_fetch_msg_bytes(plan, &r);
    free(plan);
}

/* A store node has no plan: KVEDGE_ENOTFOUND at once. Every resident layer names the node (its
 * HELLO name), kind cloud (its role), reason planned; the missing layer none, reason miss. */
static void test_node_no_plan_layer_sources(void **state)
{
    (void)state;
    kvedge_fetch_plan_t *plan = malloc(sizeof *plan);
    assert_non_null(plan);
    const s_ctx_t *ctxs[2] = {&s_int8, &s_holey};
    for (int ci = 0; ci < 2; ci++) {
        int missing = ci == 1 ? S_MISSING : -1;
        s_run_t r;
        int plan_rc = 0;
        s_run_plan(s_env.node.ep, ctxs[ci], NULL, &r, plan, &plan_rc);
        assert_int_equal(plan_rc, KVEDGE_ENOTFOUND);
        for (uint32_t l = 0; l < S_LAYERS; l++) {
            const kvedge_pipeline_layer_stats_t *ls = &r.ls[l];
            if ((int)l == missing) {
                assert_int_equal(r.status[l], KVEDGE_ENOTFOUND);
                assert_string_equal(ls->source, "");
                assert_int_equal(ls->kind, -1);
                assert_int_equal(ls->reason, KVEDGE_FETCH_MISS);
            } else {
                assert_int_equal(r.status[l], 0);
                assert_string_equal(ls->source, "node1");
                assert_int_equal(ls->kind, 2); /* a cloud node */
                assert_int_equal(ls->reason, KVEDGE_FETCH_PLANNED);
            }
        }
        /* One GET_LAYER per layer: header, layer and reserved u16, the chunk ids. */
        assert_int_equal(r.st.sent_bytes, S_LAYERS * (KVEDGE_WIRE_HEADER_BYTES + 4 +
                                                      S_CHUNKS * KVEDGE_CHUNK_ID_BYTES));
        uint64_t expect = r.st.wire_bytes;
        for (uint32_t l = 0; l < S_LAYERS; l++)
            expect += (uint64_t)r.ls[l].blocks *
                          (KVEDGE_WIRE_HEADER_BYTES + KVEDGE_WIRE_STREAM_HDR_BYTES) +
                      KVEDGE_WIRE_HEADER_BYTES;
        assert_int_equal(r.st.msg_bytes, expect);
    }
    free(plan);
}

/* The node goes away after connect: every wait returns an error within the deadline (plus
 * the client's margin), never hangs. */
static void test_node_gone_deadline(void **state)
{
    (void)state;
    s_node_t n;
    s_node_start(&n, s_env.root, "gone");
    kvedge_client_t *c = s_client(n.ep, 5000);
    s_node_stop(&n);
    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
    kvedge_pipeline_opts_t o;
    s_opts(&o, c, &m, &s_int8, &d);
    o.deadline_ms = 800;
    o.ring_slots = 2;
    int64_t t0 = zclock_usecs();
    kvedge_pipeline_t *p = NULL;
    assert_int_equal(kvedge_pipeline_open(&o, &p), 0);
    /* Nothing can arrive: no layer is ready before its wait fails, and each is after. */
    assert_int_equal(kvedge_pipeline_ready(p, 0), 0);
    assert_int_equal(kvedge_pipeline_ready(p, S_LAYERS - 1), 0);
    for (uint16_t l = 0; l < S_LAYERS; l++) {
        int rc = kvedge_pipeline_wait(p, l);
        assert_true(rc == KVEDGE_ETIMEDOUT || rc == KVEDGE_ECLOSED);
        assert_int_equal(kvedge_pipeline_ready(p, l), 1);
    }
    double ms = (double)(zclock_usecs() - t0) / 1e3;
    printf("node gone: every layer failed after %.0f ms (deadline 800 ms)\n", ms);
    assert_true(ms < 800 + 500);
    kvedge_pipeline_stats_t st;
    assert_int_equal(kvedge_pipeline_stats(p, &st, NULL, 0), 0);
    assert_int_equal(st.failed, S_LAYERS);
    kvedge_pipeline_destroy(&p);
    kvedge_client_destroy(&c);
    s_dst_free(&d);
}

/* ---------------------------------------------------------------- damaged on the wire */

/* A fake store node (ROUTER on ipc://) that serves s_int4 with a few blocks damaged in
 * transit: one bit of the body flipped after the checksum was computed, or the last byte cut
 * off, as a faulty link or a hostile node would deliver it. It answers HELLO and streams each
 * GET_LAYER in (chunk, head) order; the client's credit covers a whole layer, so CREDIT messages
 * are ignored. */
#define S_BAD_LAYERS 3
static const struct {
    uint32_t layer;
    bool cut;  /* cut the block's last byte off instead of flipping a bit of its body */
    bool last; /* the layer's last candidate, after others were staged in place; else first */
} s_bad[S_BAD_LAYERS] = {{3, false, true}, {7, false, false}, {9, true, false}};
static const s_ctx_t *s_served = &s_int4; /* uncompressed bodies: most are candidates */

static uint8_t *s_bad_block[S_BAD_LAYERS];
static uint32_t s_bad_ci[S_BAD_LAYERS], s_bad_h[S_BAD_LAYERS];

static void s_damage_pick(void)
{
    for (int b = 0; b < S_BAD_LAYERS; b++) {
        uint32_t l = s_bad[b].layer;
        bool found = false;
        for (uint32_t ci = 0; ci < S_CHUNKS; ci++)
            for (uint32_t h = 0; h < S_HEADS; h++) {
                const uint8_t *blk = s_served->block[l][ci][h];
                size_t len = s_served->len[l][ci][h];
                if (!s_zc_candidate(blk, len) || (found && !s_bad[b].last))
                    continue;
                found = true;
                s_bad_ci[b] = ci;
                s_bad_h[b] = h;
            }
        assert_true(found);
        size_t len = s_served->len[l][s_bad_ci[b]][s_bad_h[b]];
        const uint8_t *blk = s_served->block[l][s_bad_ci[b]][s_bad_h[b]];
        kvedge_block_info_t info;
        assert_int_equal(kvedge_block_parse(blk, len, &info), 0);
        s_bad_block[b] = malloc(len);
        assert_non_null(s_bad_block[b]);
        memcpy(s_bad_block[b], blk, len);
        size_t at = (size_t)(info.body - blk) + info.stored_len / 2;
        if (!s_bad[b].cut)
            s_bad_block[b][at] ^= 0x10; /* one bit, mid-body */
        assert_int_not_equal(kvedge_block_parse(s_bad_block[b], len - s_bad[b].cut, &info), 0);
    }
}

static void s_fake_msg(zsock_t *router, zframe_t *route, uint8_t op, uint16_t flags, uint64_t id,
                       uint32_t count, const void *f1, size_t l1, const void *f2, size_t l2)
{
    kvedge_wire_header_t h = {1, op, flags, id, 0, count, 0, 0};
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

static void s_fake_layer(zsock_t *router, zframe_t *route, uint64_t id, uint32_t l)
{
    uint32_t sent = 0;
    for (uint32_t ci = 0; ci < S_CHUNKS; ci++)
        for (uint32_t h = 0; h < S_HEADS; h++) {
            const uint8_t *blk = s_served->block[l][ci][h];
            size_t len = s_served->len[l][ci][h];
            for (int b = 0; b < S_BAD_LAYERS; b++)
                if (s_bad[b].layer == l && s_bad_ci[b] == ci && s_bad_h[b] == h) {
                    blk = s_bad_block[b];
                    len -= s_bad[b].cut;
                }
            uint8_t sh[KVEDGE_WIRE_STREAM_HDR_BYTES];
            kvedge_wire_stream_hdr_t st = {ci, (uint16_t)h, 0};
            kvedge_wire_stream_hdr_pack(&st, sh);
            s_fake_msg(router, route, KVEDGE_OP_GET_LAYER,
                       KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE, id, 1, sh, sizeof sh, blk,
                       len);
            sent++;
        }
    s_fake_msg(router, route, KVEDGE_OP_GET_LAYER, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END,
               id, sent, NULL, 0, NULL, 0);
}

static void s_fake_node(zsock_t *pipe, void *args)
{
    const char *ep = args;
    zsock_t *router = zsock_new(ZMQ_ROUTER);
    zsock_set_linger(router, 0);
    int rc = zsock_bind(router, "%s", ep);
    zsock_signal(pipe, rc < 0 ? 1 : 0);
    zpoller_t *poller = zpoller_new(pipe, router, NULL);
    while (zpoller_wait(poller, -1) == router) {
        zmsg_t *m = zmsg_recv(router);
        zframe_t *route = m ? zmsg_pop(m) : NULL, *hf = m ? zmsg_pop(m) : NULL;
        zframe_t *pf = m ? zmsg_first(m) : NULL;
        kvedge_wire_header_t h;
        if (hf && kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h) == 0) {
            if (h.opcode == KVEDGE_OP_HELLO) {
                kvedge_wire_node_info_t info = {KVEDGE_ROLE_CLOUD,
                                                {0},
                                                KVEDGE_WIRE_MAX_FRAME_BYTES,
                                                KVEDGE_WIRE_MAX_ITEMS,
                                                KVEDGE_WIRE_MAX_CHUNKS,
                                                KVEDGE_WIRE_MAX_CREDIT,
                                                8};
                uint8_t ib[KVEDGE_WIRE_NODE_INFO_BYTES];
                kvedge_wire_node_info_pack(&info, ib);
                s_fake_msg(router, route, KVEDGE_OP_HELLO, KVEDGE_WIRE_FLAG_REPLY, h.request_id, 0,
                           ib, sizeof ib, "fake", 4);
            } else if (h.opcode == KVEDGE_OP_GET_LAYER && pf && zframe_size(pf) >= 4) {
                const uint8_t *q = zframe_data(pf);
                uint32_t l = (uint32_t)q[0] | (uint32_t)q[1] << 8;
                if (l < S_LAYERS)
                    s_fake_layer(router, route, h.request_id, l);
            }
        }
        zframe_destroy(&route);
        zframe_destroy(&hf);
        zmsg_destroy(&m);
    }
    zpoller_destroy(&poller);
    zsock_destroy(&router);
}

/* Blocks damaged on the wire are rejected exactly as before the zero-copy path: verified
 * (kvedge_block_parse, xxh3) before anything reads them, whether their body would have been
 * staged in place (layers 3 and 7: the last candidate of a layer whose earlier bodies were
 * already held in place, and the first) or cut short (layer 9: a length that does not add up).
 * Each such layer is a miss with its destination untouched; every other layer is resident and
 * bit-identical, most of it through the zero-copy path. */
static void test_corrupt_block_on_zero_copy_path(void **state)
{
    (void)state;
    s_damage_pick();
    char ep[300];
    snprintf(ep, sizeof ep, "ipc://%s/fake.sock", s_env.root);
    zactor_t *fake = zactor_new(s_fake_node, ep);
    assert_non_null(fake);

    kvedge_model_t m;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    kvedge_client_opts_t co;
    kvedge_client_opts_default(&co);
    co.endpoint = ep;
    co.deadline_ms = 20000;
    co.credit = 2 * S_CHUNKS * S_HEADS; /* a whole layer: the fake ignores CREDIT */
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&co, &c), 0);
    for (int ring = 1; ring <= 4; ring += 3) {
        s_dst_t d;
        s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, false);
        kvedge_pipeline_opts_t o;
        s_opts(&o, c, &m, s_served, &d);
        o.ring_slots = (uint32_t)ring;
        kvedge_pipeline_t *p = NULL;
        assert_int_equal(kvedge_pipeline_open(&o, &p), 0);
        int status[S_LAYERS];
        for (uint16_t l = 0; l < S_LAYERS; l++)
            status[l] = kvedge_pipeline_wait(p, l);
        kvedge_pipeline_stats_t st;
        kvedge_pipeline_layer_stats_t ls[S_LAYERS];
        assert_int_equal(kvedge_pipeline_stats(p, &st, ls, S_LAYERS), 0);
        kvedge_pipeline_destroy(&p);
        for (uint32_t l = 0; l < S_LAYERS; l++) {
            bool bad = false;
            for (int b = 0; b < S_BAD_LAYERS; b++)
                bad = bad || s_bad[b].layer == l;
            uint8_t *gk = s_dst_host(&d, &d.k[l]), *gv = s_dst_host(&d, &d.v[l]);
            if (bad) {
                assert_int_equal(status[l], KVEDGE_ENOTFOUND);
                assert_int_equal(ls[l].status, KVEDGE_ENOTFOUND);
                assert_int_equal(ls[l].reason, KVEDGE_FETCH_MISS);
                for (size_t i = 0; i < d.k[l].cap_bytes; i++)
                    if (gk[i] != S_FILL || gv[i] != S_FILL)
                        fail_msg("layer %u: a layer with a damaged block was written", l);
            } else {
                assert_int_equal(status[l], 0);
                uint8_t *ek, *ev;
                s_expect(s_served, l, &d.k[l], &ek, &ev);
                if (memcmp(gk, ek, d.k[l].cap_bytes) != 0 || memcmp(gv, ev, d.v[l].cap_bytes))
                    fail_msg("layer %u differs from kvedge_block_decode", l);
                free(ek);
                free(ev);
            }
            free(gk);
            free(gv);
        }
        assert_int_equal(st.misses, S_BAD_LAYERS);
        assert_int_equal(st.resident, S_LAYERS - S_BAD_LAYERS);
        assert_int_equal(st.failed, 0);
        assert_false(st.device);
        assert_true(st.zero_copy_blocks > 0);
        printf("damaged blocks (ring %d): layers 3, 7, 9 missed, %u resident, %u blocks "
               "zero-copy\n",
               ring, st.resident, st.zero_copy_blocks);
        s_dst_free(&d);
    }
    kvedge_client_destroy(&c);
    zactor_destroy(&fake);
    for (int b = 0; b < S_BAD_LAYERS; b++) {
        free(s_bad_block[b]);
        s_bad_block[b] = NULL;
    }
}

/* ---------------------------------------------------------------- a full ring */

/* A fake edge proxy (ROUTER on ipc://) for the full-ring test: it answers HELLO (role proxy)
 * and PING, and streams a FETCH of s_int8's layers with layer 0 delivered as the mapped
 * model's layer 0 (the same blocks: the mapped model has this one's shape), honouring the
 * client's credit exactly as a proxy does: a message goes only while credit is left. */
typedef struct {
    char ep[300];
    atomic_int sent;    /* FETCH messages sent (the end not counted) */
    atomic_int credits; /* CREDIT messages received */
} s_fxp_t;

static zmsg_t *s_fxp_msg(uint8_t op, uint16_t flags, uint64_t id, uint32_t count)
{
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION, op, flags, id, 0, count, 0, 0};
    uint8_t hb[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, hb);
    zmsg_t *m = zmsg_new();
    zmsg_addmem(m, hb, sizeof hb);
    return m;
}

/* The whole FETCH reply but its end: the plan, then per layer its blocks and its record. */
static void s_fxp_fetch(zlist_t *q, uint64_t id, uint16_t layers)
{
    const uint16_t fl = KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE;
    zmsg_t *m = s_fxp_msg(KVEDGE_OP_FETCH, fl, id, 1);
    uint8_t pb[KVEDGE_WIRE_FETCH_PLAN_BYTES], sb[KVEDGE_WIRE_FETCH_SOURCE_BYTES];
    kvedge_wire_fetch_plan_t plan = {.sources = 1, .layers = layers};
    kvedge_wire_fetch_plan_pack(&plan, pb);
    kvedge_wire_fetch_source_t src = {.kind = 2, .up = true, .rtt_us = 100, .bw_bytes_per_s = 1e9};
    snprintf(src.name, sizeof src.name, "fake-cloud");
    kvedge_wire_fetch_source_pack(&src, sb);
    uint8_t lb[S_LAYERS * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES];
    for (uint16_t l = 0; l < layers; l++) {
        kvedge_wire_fetch_plan_layer_t pl = {
            .source = 0, .mapped = l == 0, .from_layer = l == 0 ? 0 : KVEDGE_WIRE_FETCH_OWN_LAYER};
        kvedge_wire_fetch_plan_layer_pack(&pl, lb + (size_t)l * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    }
    zmsg_addmem(m, pb, sizeof pb);
    zmsg_addmem(m, sb, sizeof sb);
    zmsg_addmem(m, lb, (size_t)layers * KVEDGE_WIRE_FETCH_PLAN_LAYER_BYTES);
    zlist_append(q, m);
    for (uint16_t l = 0; l < layers; l++) {
        for (uint32_t ci = 0; ci < S_CHUNKS; ci++)
            for (uint16_t h = 0; h < S_HEADS; h++) {
                uint8_t bb[KVEDGE_WIRE_FETCH_BLOCK_BYTES];
                kvedge_wire_fetch_block_t b = {0, l, ci, h, 0};
                kvedge_wire_fetch_block_pack(&b, bb);
                m = s_fxp_msg(KVEDGE_OP_FETCH, fl, id, 1);
                zmsg_addmem(m, bb, sizeof bb);
                zmsg_addmem(m, s_int8.block[l][ci][h], s_int8.len[l][ci][h]);
                zlist_append(q, m);
            }
        uint8_t rb[KVEDGE_WIRE_FETCH_LAYER_BYTES];
        kvedge_wire_fetch_layer_t rec = {.reason = KVEDGE_FETCH_PLANNED,
                                         .layer = l,
                                         .heads = S_CHUNKS * S_HEADS,
                                         .attempts = 1,
                                         .from_layer = l == 0 ? 0 : KVEDGE_WIRE_FETCH_OWN_LAYER};
        kvedge_wire_fetch_layer_pack(&rec, rb);
        m = s_fxp_msg(KVEDGE_OP_FETCH, fl, id, 1);
        zmsg_addmem(m, rb, sizeof rb);
        zlist_append(q, m);
    }
}

static void s_fxp_send(zsock_t *router, zframe_t *route, zmsg_t **m)
{
    zframe_t *r = zframe_dup(route);
    zmsg_prepend(*m, &r);
    zmsg_send(m, router);
}

static void s_fake_proxy(zsock_t *pipe, void *args)
{
    s_fxp_t *fx = args;
    zsock_t *router = zsock_new(ZMQ_ROUTER);
    zsock_set_linger(router, 0);
    int rc = zsock_bind(router, "%s", fx->ep);
    zsock_signal(pipe, rc < 0 ? 1 : 0);
    zpoller_t *poller = zpoller_new(pipe, router, NULL);
    zlist_t *q = zlist_new(); /* the FETCH's messages not sent yet */
    zframe_t *froute = NULL;  /* the FETCH's client */
    uint64_t fid = 0;
    uint32_t credit = 0;
    bool ended = true;
    while (zpoller_wait(poller, -1) == router) {
        zmsg_t *m = zmsg_recv(router);
        zframe_t *route = m ? zmsg_pop(m) : NULL, *hf = m ? zmsg_pop(m) : NULL;
        kvedge_wire_header_t h;
        if (hf && kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h) == 0) {
            if (h.opcode == KVEDGE_OP_HELLO) {
                kvedge_wire_node_info_t info = {KVEDGE_ROLE_PROXY,
                                                {0},
                                                KVEDGE_WIRE_MAX_FRAME_BYTES,
                                                KVEDGE_WIRE_MAX_ITEMS,
                                                KVEDGE_WIRE_MAX_CHUNKS,
                                                KVEDGE_WIRE_MAX_CREDIT,
                                                8};
                uint8_t ib[KVEDGE_WIRE_NODE_INFO_BYTES];
                kvedge_wire_node_info_pack(&info, ib);
                zmsg_t *r = s_fxp_msg(KVEDGE_OP_HELLO, KVEDGE_WIRE_FLAG_REPLY, h.request_id, 0);
                zmsg_addmem(r, ib, sizeof ib);
                zmsg_addmem(r, "fakeproxy", 9);
                s_fxp_send(router, route, &r);
            } else if (h.opcode == KVEDGE_OP_PING && zmsg_first(m)) {
                zmsg_t *r = s_fxp_msg(KVEDGE_OP_PING, KVEDGE_WIRE_FLAG_REPLY, h.request_id, 0);
                zframe_t *echo = zmsg_pop(m);
                zmsg_append(r, &echo);
                s_fxp_send(router, route, &r);
            } else if (h.opcode == KVEDGE_OP_FETCH && zmsg_first(m)) {
                kvedge_wire_fetch_spec_t spec;
                zframe_t *sf = zmsg_first(m);
                assert_int_equal(
                    kvedge_wire_fetch_spec_parse(zframe_data(sf), zframe_size(sf), &spec), 0);
                zframe_destroy(&froute);
                froute = zframe_dup(route);
                fid = h.request_id;
                credit = h.credit;
                ended = false;
                s_fxp_fetch(q, fid, spec.layers);
            } else if (h.opcode == KVEDGE_OP_CREDIT && h.request_id == fid) {
                credit += h.credit;
                atomic_fetch_add(&fx->credits, 1);
            }
        }
        zframe_destroy(&route);
        zframe_destroy(&hf);
        zmsg_destroy(&m);
        for (; credit > 0 && zlist_size(q) > 0; credit--) {
            zmsg_t *next = zlist_pop(q);
            s_fxp_send(router, froute, &next);
            atomic_fetch_add(&fx->sent, 1);
        }
        if (!ended && zlist_size(q) == 0) {
            zmsg_t *end =
                s_fxp_msg(KVEDGE_OP_FETCH, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END, fid, 0);
            s_fxp_send(router, froute, &end);
            ended = true;
        }
    }
    zmsg_t *left;
    while ((left = zlist_pop(q)) != NULL)
        zmsg_destroy(&left);
    zlist_destroy(&q);
    zframe_destroy(&froute);
    zpoller_destroy(&poller);
    zsock_destroy(&router);
}

/* An adapt callback held at a gate: the loader thread stays inside it (so the ring stays full)
 * until the test opens the gate. The mapped model has this one's shape: it copies. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
    int entered;
} s_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, 0};

static int s_adapt_gated(void *arg, uint16_t layer, uint16_t from_layer, const float *k_src,
                         const float *v_src, uint32_t tokens, float *k_dst, float *v_dst)
{
    (void)arg, (void)layer, (void)from_layer;
    pthread_mutex_lock(&s_gate.mu);
    s_gate.entered++;
    pthread_cond_broadcast(&s_gate.cv);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30; /* a test that failed still ends */
    while (!s_gate.open)
        if (pthread_cond_timedwait(&s_gate.cv, &s_gate.mu, &until) != 0)
            break;
    pthread_mutex_unlock(&s_gate.mu);
    size_t n = (size_t)S_HEADS * tokens * S_HD;
    memcpy(k_dst, k_src, n * sizeof(float));
    memcpy(v_dst, v_src, n * sizeof(float));
    return 0;
}

static void s_gate_open(bool open)
{
    pthread_mutex_lock(&s_gate.mu);
    s_gate.open = open;
    pthread_cond_broadcast(&s_gate.cv);
    pthread_mutex_unlock(&s_gate.mu);
}

static int s_gate_entered(void)
{
    pthread_mutex_lock(&s_gate.mu);
    int n = s_gate.entered;
    pthread_mutex_unlock(&s_gate.mu);
    return n;
}

#define S_FULL_LAYERS   3
#define S_FULL_CREDIT   4
#define S_FULL_LAYER0   (1 + S_CHUNKS * S_HEADS + 1) /* the plan, layer 0's blocks and record */
#define S_CALL_DEADLINE 3000                         /* ms: the PING's deadline */

/* A FETCH pipeline whose ring (one slot) is full: layer 0 sits in the loader (its adaptation
 * held at a gate) while layer 1's blocks arrive. The client's I/O thread does not wait for
 * the slot: a PING on the same client, through that same I/O thread (the client has an
 * emulated link, so no call takes a direct channel), completes within its deadline while the
 * ring stays full, and the proxy is held back by credit meanwhile (it has sent no more than
 * the stream's credit beyond layer 0). Then the loader goes on and every layer lands
 * bit-identical to kvedge_block_decode. */
static void test_full_ring_other_calls_go_on(void **state)
{
    (void)state;
    s_fxp_t fx;
    memset(&fx, 0, sizeof fx);
    snprintf(fx.ep, sizeof fx.ep, "ipc://%s/fakeproxy.sock", s_env.root);
    zactor_t *fake = zactor_new(s_fake_proxy, &fx);
    assert_non_null(fake);
    s_gate_open(false);
    s_gate.entered = 0;

    kvedge_client_opts_t co;
    kvedge_client_opts_default(&co);
    co.endpoint = fx.ep;
    co.deadline_ms = S_CALL_DEADLINE;
    co.link = "unlimited"; /* every call through the I/O thread, as a busy client's would */
    co.credit = S_FULL_CREDIT;
    co.window_bytes = 1; /* no extra credit past S_FULL_CREDIT */
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&co, &c), 0);

    kvedge_model_t m, mm;
    assert_int_equal(kvedge_model_builtin(S_MODEL, &m), 0);
    mm = m; /* a "large" model of the same shape: adapting is a copy */
    snprintf(mm.id, sizeof mm.id, "%s-twin", S_MODEL);
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP32, false);
    kvedge_pipeline_opts_t o;
    s_opts(&o, c, &m, &s_int8, &d);
    o.layers = S_FULL_LAYERS;
    o.ring_slots = 1;
    o.mapped_model = &mm;
    o.mapped_chunks = s_int8.ids;
    o.adapt = s_adapt_gated;
    kvedge_pipeline_t *p = NULL;
    assert_int_equal(kvedge_pipeline_open(&o, &p), 0);

    /* The ring is full: layer 0 is in the loader, and the proxy has sent layer 1's first
     * blocks, which have no slot to go to. */
    kt_wait_for(s_gate_entered() != 0 && atomic_load(&fx.sent) > S_FULL_LAYER0, KT_WAIT_MS);
    assert_int_equal(s_gate_entered(), 1);
    assert_true(atomic_load(&fx.sent) > S_FULL_LAYER0);
    assert_int_equal(kvedge_pipeline_ready(p, 0), 0);

    int64_t t0 = zclock_mono();
    double rtt = 0;
    int ping_rc = kvedge_client_ping(c, 0, &rtt, NULL);
    int64_t ping_ms = zclock_mono() - t0;
    int sent_full = atomic_load(&fx.sent);
    int ready0 = kvedge_pipeline_ready(p, 0);
    s_gate_open(true); /* whatever happened, let the loader go on */
    printf("full ring: PING on the same client %s in %lld ms (rtt %.0f us); the proxy held at "
           "%d of %d messages\n",
           ping_rc == 0 ? "answered" : kvedge_strerror(ping_rc), (long long)ping_ms, rtt, sent_full,
           1 + S_FULL_LAYERS * (S_CHUNKS * S_HEADS + 1));
    assert_int_equal(ping_rc, 0);
    assert_true(ping_ms < S_CALL_DEADLINE);
    assert_int_equal(ready0, 0); /* the ring was still full when the PING came back */
    assert_true(sent_full <= S_FULL_LAYER0 + S_FULL_CREDIT); /* held back by credit */

    s_run_t r;
    memset(&r, 0, sizeof r);
    for (uint16_t l = 0; l < S_FULL_LAYERS; l++)
        r.status[l] = kvedge_pipeline_wait(p, l);
    assert_int_equal(kvedge_pipeline_stats(p, &r.st, r.ls, S_FULL_LAYERS), 0);
    kvedge_pipeline_destroy(&p);
    for (uint32_t l = 0; l < S_FULL_LAYERS; l++) {
        assert_int_equal(r.status[l], 0);
        assert_int_equal(r.ls[l].blocks, S_CHUNKS * S_HEADS);
        assert_int_equal(r.ls[l].from_layer, l == 0 ? 0 : -1);
        uint8_t *ek, *ev;
        s_expect(&s_int8, l, &d.k[l], &ek, &ev);
        if (memcmp(d.k[l].base, ek, d.k[l].cap_bytes) != 0 ||
            memcmp(d.v[l].base, ev, d.v[l].cap_bytes) != 0)
            fail_msg("layer %u differs from kvedge_block_decode", l);
        free(ek);
        free(ev);
    }
    assert_int_equal(r.st.resident, S_FULL_LAYERS);
    assert_int_equal(r.st.adapted, 1);
    assert_true(r.st.ring_wait_us > 0);
    assert_true(atomic_load(&fx.credits) > 0);
    s_dst_free(&d);
    kvedge_client_destroy(&c);
    zactor_destroy(&fake);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contexts_exercise_lz4_and_masks),
        cmocka_unit_test(test_node_contiguous_int8),
        cmocka_unit_test(test_node_coded_rung_decodes_identically),
        cmocka_unit_test(test_node_paged_int4),
        cmocka_unit_test(test_node_paged_int8_fp32),
        cmocka_unit_test(test_node_contiguous_int4),
        cmocka_unit_test(test_node_device_memory_api),
        cmocka_unit_test(test_proxy_contiguous_int8),
        cmocka_unit_test(test_proxy_paged_int4),
        cmocka_unit_test(test_missing_layer_is_a_miss),
        cmocka_unit_test(test_ring_of_two_delivers_everything),
        cmocka_unit_test(test_ring_pool_reuses_slots),
        cmocka_unit_test(test_bad_destination_refused),
        cmocka_unit_test(test_mapped_refused),
        cmocka_unit_test(test_mapped_without_map_is_own),
        cmocka_unit_test(test_proxy_plan_and_layer_sources),
        cmocka_unit_test(test_proxy_planned_recompute),
        cmocka_unit_test(test_node_no_plan_layer_sources),
        cmocka_unit_test(test_node_gone_deadline),
        cmocka_unit_test(test_corrupt_block_on_zero_copy_path),
        cmocka_unit_test(test_full_ring_other_calls_go_on),
        cmocka_unit_test(test_node_tc_rung),
        cmocka_unit_test(test_proxy_tc_rung),
        cmocka_unit_test(test_tc_refused_without_basis),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}

#else /* S_GPU_ONLY: device destinations, the device path */

static void test_gpu_node_contiguous_int8(void **state)
{
    (void)state;
    s_bit_identity(s_env.node.ep, &s_int8, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, true, false);
}

static void test_gpu_node_paged_int4(void **state)
{
    (void)state;
    s_bit_identity(s_env.node.ep, &s_int4, KVEDGE_KV_PAGED, KVEDGE_DTYPE_BF16, true, false);
}

static void test_gpu_proxy_paged_int8_ring2(void **state)
{
    (void)state;
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_PAGED, KVEDGE_DTYPE_FP32, true);
    s_run_t r;
    s_run(s_env.proxy_ep, &s_int8, &d, 2, &r);
    s_check(&s_int8, &d, &r, -1);
    assert_true(r.st.device);
    s_dst_free(&d);
}

static void test_gpu_missing_layer_is_a_miss(void **state)
{
    (void)state;
    s_dst_t d;
    s_dst_make(&d, KVEDGE_KV_CONTIG, KVEDGE_DTYPE_FP16, true);
    s_run_t r;
    s_run(s_env.node.ep, &s_holey, &d, 0, &r);
    s_check(&s_holey, &d, &r, S_MISSING);
    s_dst_free(&d);
}

int main(void)
{
    if (kvedge_gpu_device_count() == 0 || kvedge_gpu_stage_on_device() != 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contexts_exercise_lz4_and_masks),
        cmocka_unit_test(test_gpu_node_contiguous_int8),
        cmocka_unit_test(test_gpu_node_paged_int4),
        cmocka_unit_test(test_gpu_proxy_paged_int8_ring2),
        cmocka_unit_test(test_gpu_missing_layer_is_a_miss),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}

#endif
