/* Large–small on the edge client (docs/largesmall.md, "Serving: the edge client"): two
 * synthesized models, a cloud (4 layers x 6 heads x 16) and an edge (3 layers x 4 heads x 16),
 * a layer map edge 0 <- cloud 0, edge 1 <- none, edge 2 <- cloud 3 registered with a Storage
 * Master, a linear adapter fitted on them, and the cloud model's context prefilled (lossless
 * fp32) to a cloud node behind a proxy, beside the edge model's own layer 1 of it. The edge
 * then fetches its context through the proxy naming the cloud model:
 *  - the pipeline delivers edge layers 0 and 2 from cloud layers 0 and 3 (from_layer), exactly
 *    kvedge_adapter_apply of the cloud's own K/V, and layer 1 as its own, exactly;
 *  - an adapt callback that fails for one layer makes that layer a miss, the request
 *    completes, and the logits equal a decode where that layer was computed;
 *  - kvedge_e2e_decode with the mapped model and the adapter ("ce-lslm") gives the logits of a
 *    session handed the adapted K/V directly, and prints which cloud layer fed each layer;
 *  - with no map for the pair every layer is computed: the tokens of edge-only;
 *  - `kvedge decode --adapter` prints the same;
 *  - bad requests are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/kvmsg.h"
#include "runtime/mview.h"
#include "clients/e2e/adapter.h"
#include "clients/decoder/decoder.h"
#include "clients/e2e/e2e.h"
#include "clients/lib/kvedge.h"
#include "clients/e2e/layermap.h"
#include "clients/lib/pipeline.h"
#include "proxy/proxy.h"
#include "store/master/master.h"
#include "access/codec/error.h"
#include "store/node/node.h"
#include "tests/common/world.h"

#define S_CLOUD_ID  "ls-cloud"
#define S_CLOUD2_ID "ls-cloud2" /* the same shape; no map pairs it with the edge */
#define S_EDGE_ID   "ls-edge"
#define S_VOCAB     300
#define S_POS       256
#define S_CTX       80 /* shared context tokens: chunks of 32, 32 and 16 */
#define S_CHUNK     32
#define S_NCHUNK    3
#define S_PROMPT    12
#define S_NEW       6
#define S_SAMPLES   64 /* calibration positions of the adapter */
#define S_OFFSET    2  /* the pipeline test's destination position of token 0 */
#define S_DEADLINE  10000
#define S_FILL      0x5A

/* The map: edge layer -> cloud layer (-1 none). */
static const int32_t s_from[3] = {0, -1, 3};

/* ---------------------------------------------------------------- fixture */

static struct {
    char root[64];
    char cloud_w[128], edge_w[128], adapter_path[128], map_path[128];
    kvedge_decoder_t *cloud, *edge;
    const kvedge_decoder_config_t *cc, *ec;
    kvedge_model_t cloud_m, cloud2_m, edge_m;
    int32_t ctx[S_CTX], ctx2[S_CTX], prompt[S_PROMPT], calib[S_SAMPLES];
    kvedge_adapter_t *adapter;  /* ls-cloud -> ls-edge */
    kvedge_adapter_t *adapter2; /* ls-cloud2 -> ls-edge: registered nowhere */
    float *ck, *cv;             /* the cloud's context K/V, [layers][heads][S_CTX][hd] */
    size_t ckvf;                /* floats of one cloud layer */
    size_t ekvf;                /* floats of one edge layer */
    float *ek, *ev;             /* the edge's own context K/V, [layers][heads][S_CTX][hd] */
    float *ak[3], *av[3];       /* kvedge_adapter_apply of the mapped layers, [4][S_CTX][16] */
    kt_world_t w;               /* a master with the models and the maps, a cloud node, a proxy */
} s_fx;

/* A map cloud_id -> ls-edge with s_from, and an adapter fitted on it. */
static kvedge_adapter_t *s_fit(const char *cloud_id)
{
    kvedge_layermap_t map;
    memset(&map, 0, sizeof map);
    snprintf(map.cloud_id, sizeof map.cloud_id, "%s", cloud_id);
    snprintf(map.edge_id, sizeof map.edge_id, "%s", S_EDGE_ID);
    map.cloud_layers = s_fx.cc->layers;
    map.cloud_hidden = s_fx.cc->hidden;
    map.edge_layers = s_fx.ec->layers;
    map.edge_hidden = s_fx.ec->hidden;
    map.samples = S_SAMPLES;
    map.cka_min = map.rsa_min = 0.5;
    kvedge_layermap_entry_t e[3];
    for (int i = 0; i < 3; i++)
        e[i] = (kvedge_layermap_entry_t){s_from[i], 0.9, 0.9};
    map.entry = e;
    kvedge_adapter_t *a = NULL;
    int rc = kvedge_adapter_fit(s_fx.cloud, s_fx.edge, &map, s_fx.calib, S_SAMPLES, S_SAMPLES,
                                KVEDGE_ADAPT_LINEAR, -1, &a);
    if (rc != KVEDGE_OK)
        fail_msg("kvedge_adapter_fit: %s", kvedge_strerror(rc));
    if (strcmp(cloud_id, S_CLOUD_ID) == 0) { /* register this one, and keep its file */
        assert_int_equal(kvedge_layermap_save(s_fx.map_path, &map), KVEDGE_OK);
        kvedge_master_map_t *rec = malloc(sizeof *rec);
        assert_non_null(rec);
        char why[KVEDGE_LAYERMAP_WHY_BYTES];
        assert_int_equal(kvedge_layermap_to_master(&map, rec, why, sizeof why), KVEDGE_OK);
        uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
        size_t len;
        assert_int_equal(kvedge_master_map_pack(rec, body, &len), KVEDGE_OK);
        char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        assert_int_equal(
            kvedge_master_key_format(KVEDGE_MASTER_SPACE_MAP, cloud_id, S_EDGE_ID, key, sizeof key),
            KVEDGE_OK);
        assert_int_equal(kvedge_mview_set(s_fx.w.reg, key, body, len, 3000), KVEDGE_OK);
        free(rec);
    }
    return a;
}

static void s_register_model(const kvedge_model_t *m)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_model_pack(m, body, &len), KVEDGE_OK);
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    assert_int_equal(
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_MODEL, m->id, NULL, key, sizeof key),
        KVEDGE_OK);
    assert_int_equal(kvedge_mview_set(s_fx.w.reg, key, body, len, 3000), KVEDGE_OK);
}

static kvedge_client_t *s_client(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = S_DEADLINE;
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    if (rc != KVEDGE_OK)
        fail_msg("connect %s: %s", ep, kvedge_strerror(rc));
    return c;
}

/* Puts layer l of the edge model's own context K/V (lossless fp32) to the node. */
static void s_put_edge_layer(kvedge_client_t *c, uint32_t l)
{
    const uint32_t H = s_fx.ec->heads, D = s_fx.ec->head_dim;
    assert_int_equal(kvedge_client_put_model(c, &s_fx.edge_m), KVEDGE_OK);
    kvedge_chunk_id_t ids[S_NCHUNK];
    size_t n;
    assert_int_equal(kvedge_e2e_chunks(&s_fx.edge_m, s_fx.ctx, S_CTX, S_CHUNK, ids, S_NCHUNK, &n),
                     KVEDGE_OK);
    for (uint32_t ci = 0; ci < S_NCHUNK; ci++) {
        uint32_t t = S_CTX - ci * S_CHUNK < S_CHUNK ? S_CTX - ci * S_CHUNK : S_CHUNK;
        kvedge_block_spec_t spec = {
            KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_LOSSLESS, t, (uint16_t)D, 0, NULL, false};
        size_t cap = kvedge_block_encoded_bound(&spec);
        kvedge_put_item_t items[8];
        uint8_t *blk[8];
        float *kb = malloc((size_t)t * D * sizeof(float)),
              *vb = malloc((size_t)t * D * sizeof(float));
        assert_true(H <= 8 && kb && vb);
        for (uint32_t h = 0; h < H; h++) {
            size_t off = ((size_t)l * H + h) * S_CTX * D + (size_t)ci * S_CHUNK * D;
            memcpy(kb, s_fx.ek + off, (size_t)t * D * sizeof(float));
            memcpy(vb, s_fx.ev + off, (size_t)t * D * sizeof(float));
            blk[h] = malloc(cap);
            assert_non_null(blk[h]);
            memset(&items[h], 0, sizeof items[h]);
            assert_int_equal(kvedge_block_encode(&spec, kb, vb, blk[h], cap, &items[h].len),
                             KVEDGE_OK);
            items[h].chunk.id = ids[ci];
            items[h].chunk.has_parent = ci > 0;
            if (ci > 0)
                items[h].chunk.parent = ids[ci - 1];
            snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, "%s", S_EDGE_ID);
            items[h].chunk.index = ci;
            items[h].chunk.tokens = t;
            items[h].layer = (uint16_t)l;
            items[h].head = (uint16_t)h;
            items[h].block = blk[h];
        }
        assert_int_equal(kvedge_client_put(c, items, H, NULL), KVEDGE_OK);
        for (uint32_t h = 0; h < H; h++)
            free(blk[h]);
        free(kb);
        free(vb);
    }
}

static void s_world_start(void)
{
    kt_world_master(&s_fx.w, s_fx.root);
    s_register_model(&s_fx.cloud_m);
    s_register_model(&s_fx.cloud2_m);
    s_register_model(&s_fx.edge_m);

    kt_world_node(&s_fx.w, s_fx.root);

    /* The cloud role: the cloud model's context, lossless fp32, so the edge gets its exact
     * K/V. */
    kvedge_client_t *c = s_client(s_fx.w.nep);
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    q.scheme = KVEDGE_SCHEME_LOSSLESS;
    q.dtype = KVEDGE_DTYPE_FP32;
    kvedge_chunk_id_t ids[S_NCHUNK];
    assert_int_equal(kvedge_e2e_prefill(c, s_fx.cloud, &s_fx.cloud_m, s_fx.ctx, S_CTX, S_CHUNK, &q,
                                        ids, S_NCHUNK, NULL),
                     KVEDGE_OK);
    s_put_edge_layer(c, 1);
    kvedge_client_destroy(&c);

    kt_world_proxy(&s_fx.w, s_fx.root, "proxy-ls");
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_fx.root, sizeof s_fx.root, "/tmp/kvedge-ls-XXXXXX");
    assert_non_null(mkdtemp(s_fx.root));
    snprintf(s_fx.cloud_w, sizeof s_fx.cloud_w, "%s/cloud.safetensors", s_fx.root);
    snprintf(s_fx.edge_w, sizeof s_fx.edge_w, "%s/edge.safetensors", s_fx.root);
    snprintf(s_fx.adapter_path, sizeof s_fx.adapter_path, "%s/ls.adapter", s_fx.root);
    snprintf(s_fx.map_path, sizeof s_fx.map_path, "%s/ls.map", s_fx.root);
    kt_synth(s_fx.cloud_w, 4, 6, S_VOCAB, S_POS, 11);
    kt_synth(s_fx.edge_w, 3, 4, S_VOCAB, S_POS, 22);
    s_fx.cloud = kt_load(s_fx.cloud_w);
    s_fx.edge = kt_load(s_fx.edge_w);
    s_fx.cc = kvedge_decoder_config(s_fx.cloud);
    s_fx.ec = kvedge_decoder_config(s_fx.edge);
    assert_int_equal(kvedge_e2e_model(s_fx.cloud, S_CLOUD_ID, &s_fx.cloud_m), KVEDGE_OK);
    assert_int_equal(kvedge_e2e_model(s_fx.cloud, S_CLOUD2_ID, &s_fx.cloud2_m), KVEDGE_OK);
    assert_int_equal(kvedge_e2e_model(s_fx.edge, S_EDGE_ID, &s_fx.edge_m), KVEDGE_OK);

    uint64_t x = 0x1a2b3c;
    for (uint32_t i = 0; i < 2 * S_CTX + S_PROMPT + S_SAMPLES; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int32_t t = (int32_t)(4 + (x >> 33) % (S_VOCAB - 4));
        if (i < S_CTX)
            s_fx.ctx[i] = t;
        else if (i < S_CTX + S_PROMPT)
            s_fx.prompt[i - S_CTX] = t;
        else if (i < S_CTX + S_PROMPT + S_SAMPLES)
            s_fx.calib[i - S_CTX - S_PROMPT] = t;
        else
            s_fx.ctx2[i - S_CTX - S_PROMPT - S_SAMPLES] = t;
    }
    s_fx.ekvf = kvedge_decoder_kv_floats(s_fx.edge, S_CTX);
    s_fx.ek = malloc(s_fx.ec->layers * s_fx.ekvf * sizeof(float));
    s_fx.ev = malloc(s_fx.ec->layers * s_fx.ekvf * sizeof(float));
    assert_true(s_fx.ek && s_fx.ev);
    assert_int_equal(kvedge_decoder_prefill(s_fx.edge, s_fx.ctx, S_CTX, NULL, s_fx.ek, s_fx.ev),
                     KVEDGE_OK);

    s_world_start();
    s_fx.adapter = s_fit(S_CLOUD_ID);
    s_fx.adapter2 = s_fit(S_CLOUD2_ID);
    assert_int_equal(kvedge_adapter_save(s_fx.adapter, s_fx.adapter_path), KVEDGE_OK);
    kt_world_proxy_sync(&s_fx.w); /* the proxy's replica of the registry gets the map */

    /* The reference: the cloud's own K/V of the context, and the adapter applied here. */
    s_fx.ckvf = kvedge_decoder_kv_floats(s_fx.cloud, S_CTX);
    s_fx.ck = malloc(s_fx.cc->layers * s_fx.ckvf * sizeof(float));
    s_fx.cv = malloc(s_fx.cc->layers * s_fx.ckvf * sizeof(float));
    assert_true(s_fx.ck && s_fx.cv);
    assert_int_equal(kvedge_decoder_prefill(s_fx.cloud, s_fx.ctx, S_CTX, NULL, s_fx.ck, s_fx.cv),
                     KVEDGE_OK);
    for (uint32_t e = 0; e < 3; e++) {
        if (s_from[e] < 0)
            continue;
        assert_int_equal(kvedge_adapter_from(s_fx.adapter, e), s_from[e]);
        s_fx.ak[e] = malloc(s_fx.ekvf * sizeof(float));
        s_fx.av[e] = malloc(s_fx.ekvf * sizeof(float));
        assert_true(s_fx.ak[e] && s_fx.av[e]);
        size_t off = (size_t)s_from[e] * s_fx.ckvf;
        assert_int_equal(kvedge_adapter_apply(s_fx.adapter, e, s_fx.ck + off, s_fx.cv + off, S_CTX,
                                              s_fx.ak[e], s_fx.av[e]),
                         KVEDGE_OK);
    }
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    kt_world_stop(&s_fx.w);
    for (int e = 0; e < 3; e++) {
        free(s_fx.ak[e]);
        free(s_fx.av[e]);
    }
    free(s_fx.ck);
    free(s_fx.cv);
    free(s_fx.ek);
    free(s_fx.ev);
    kvedge_adapter_destroy(&s_fx.adapter);
    kvedge_adapter_destroy(&s_fx.adapter2);
    kvedge_decoder_destroy(&s_fx.cloud);
    kvedge_decoder_destroy(&s_fx.edge);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_fx.root);
    assert_int_equal(system(cmd), 0);
    return 0;
}

/* ---------------------------------------------------------------- the pipeline */

/* The adapt callback of the tests: kvedge_adapter_apply, except for layer `fail` (-1: none),
 * where it fails; counts its calls. */
typedef struct {
    int fail;
    int nan; /* layer whose output gets one NaN (-1: none) */
    int calls;
    int from[3]; /* from_layer each layer was called with, -1 when not */
} s_adapt_t;

static int s_adapt(void *arg, uint16_t layer, uint16_t from_layer, const float *k_src,
                   const float *v_src, uint32_t tokens, float *k_dst, float *v_dst)
{
    s_adapt_t *a = arg;
    a->calls++;
    if (layer < 3)
        a->from[layer] = from_layer;
    if ((int)layer == a->fail)
        return KVEDGE_EIO;
    int rc = kvedge_adapter_apply(s_fx.adapter, layer, k_src, v_src, tokens, k_dst, v_dst);
    if ((int)layer == a->nan)
        v_dst[tokens * s_fx.ec->head_dim + 5] = NAN; /* head 1 */
    return rc;
}

typedef struct {
    kvedge_kv_dst_t k[3], v[3];
    uint32_t cap; /* tokens_cap */
} s_dst_t;

/* fp32 contiguous destinations with room for S_OFFSET + S_CTX + 3 positions, filled. */
static void s_dst_make(s_dst_t *d, uint32_t offset)
{
    d->cap = offset + S_CTX + 3;
    for (int l = 0; l < 3; l++) {
        kvedge_kv_dst_t t = {.layout = KVEDGE_KV_CONTIG,
                             .dtype = KVEDGE_DTYPE_FP32,
                             .heads = s_fx.ec->heads,
                             .head_dim = s_fx.ec->head_dim,
                             .tokens_cap = d->cap};
        t.cap_bytes = (size_t)kvedge_dequant_dst_bytes(&t);
        d->k[l] = d->v[l] = t;
        d->k[l].base = malloc(t.cap_bytes);
        d->v[l].base = malloc(t.cap_bytes);
        assert_true(d->k[l].base && d->v[l].base);
        memset(d->k[l].base, S_FILL, t.cap_bytes);
        memset(d->v[l].base, S_FILL, t.cap_bytes);
    }
}

static void s_dst_free(s_dst_t *d)
{
    for (int l = 0; l < 3; l++) {
        free(d->k[l].base);
        free(d->v[l].base);
    }
}

/* The pipeline options of the edge's fetch through the proxy, naming the cloud model. */
static void s_opts(kvedge_pipeline_opts_t *o, kvedge_client_t *c, const s_dst_t *d, uint32_t offset,
                   kvedge_chunk_id_t *ids, kvedge_chunk_id_t *mids, s_adapt_t *a)
{
    size_t n;
    assert_int_equal(kvedge_e2e_chunks(&s_fx.edge_m, s_fx.ctx, S_CTX, S_CHUNK, ids, S_NCHUNK, &n),
                     KVEDGE_OK);
    assert_int_equal(kvedge_e2e_chunks(&s_fx.cloud_m, s_fx.ctx, S_CTX, S_CHUNK, mids, S_NCHUNK, &n),
                     KVEDGE_OK);
    kvedge_pipeline_opts_default(o);
    o->client = c;
    o->model = &s_fx.edge_m;
    o->chunks = ids;
    o->n_chunks = S_NCHUNK;
    o->chunk_tokens = S_CHUNK;
    o->tokens = S_CTX;
    o->layers = 3;
    o->k = d->k;
    o->v = d->v;
    o->token_offset = offset;
    o->deadline_ms = S_DEADLINE;
    /* lossless fp32 blocks: room for them in the larger (the cloud's) shape */
    o->slot_bytes = kvedge_e2e_slot_bytes(S_CTX, S_CHUNK, s_fx.cc->heads, s_fx.cc->head_dim);
    o->mapped_model = &s_fx.cloud_m;
    o->mapped_chunks = mids;
    o->adapt = s_adapt;
    o->adapt_arg = a;
    a->calls = 0;
    for (int l = 0; l < 3; l++)
        a->from[l] = -1;
}

/* Destination d of edge layer e holds ref ([heads][S_CTX][hd]) at positions offset.. and the
 * fill elsewhere (or the fill everywhere when ref is NULL). */
static void s_dst_expect(const kvedge_kv_dst_t *d, uint32_t offset, const float *ref,
                         const char *what, uint32_t e)
{
    const uint32_t hd = d->head_dim;
    const uint8_t *b = d->base;
    for (uint32_t h = 0; h < d->heads; h++)
        for (uint32_t p = 0; p < d->tokens_cap; p++) {
            const uint8_t *row = b + ((size_t)h * d->tokens_cap + p) * hd * sizeof(float);
            bool in = ref && p >= offset && p < offset + S_CTX;
            if (in) {
                const float *want = ref + ((size_t)h * S_CTX + (p - offset)) * hd;
                if (memcmp(row, want, hd * sizeof(float)) != 0)
                    fail_msg("edge layer %u %s: head %u position %u is not the adapted cloud "
                             "K/V",
                             e, what, h, p);
            } else {
                for (uint32_t i = 0; i < hd * sizeof(float); i++)
                    if (row[i] != S_FILL)
                        fail_msg("edge layer %u %s: head %u position %u written", e, what, h, p);
            }
        }
}

/* Edge layers 0 and 2 arrive from cloud layers 0 and 3 through the adapter, exactly what
 * kvedge_adapter_apply makes of the cloud's own K/V (lossless fp32 blocks), at the token
 * offset; edge layer 1 (no cloud layer) arrives as the edge's own. */
static void test_pipeline_mapped_exact(void **state)
{
    (void)state;
    kvedge_client_t *c = s_client(s_fx.w.pep);
    s_dst_t d;
    s_dst_make(&d, S_OFFSET);
    kvedge_chunk_id_t ids[S_NCHUNK], mids[S_NCHUNK];
    s_adapt_t a = {.fail = -1, .nan = -1};
    kvedge_pipeline_opts_t o;
    s_opts(&o, c, &d, S_OFFSET, ids, mids, &a);
    kvedge_pipeline_t *p = NULL;
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_OK);
    int st[3];
    for (uint16_t l = 0; l < 3; l++)
        st[l] = kvedge_pipeline_wait(p, l);
    kvedge_pipeline_stats_t ps;
    kvedge_pipeline_layer_stats_t ls[3];
    assert_int_equal(kvedge_pipeline_stats(p, &ps, ls, 3), KVEDGE_OK);
    kvedge_fetch_plan_t *plan = malloc(sizeof *plan);
    assert_non_null(plan);
    assert_int_equal(kvedge_pipeline_plan(p, plan), KVEDGE_OK);
    kvedge_pipeline_destroy(&p);
    for (uint32_t e = 0; e < 3; e++) {
        printf("  edge layer %u: status %s, from_layer %d, source '%s', reason %s, plan from %d\n",
               e, kvedge_errname(st[e]), ls[e].from_layer, ls[e].source,
               kvedge_fetch_reason_name(ls[e].reason), plan->layer[e].from_layer);
        if (s_from[e] >= 0) {
            assert_int_equal(st[e], KVEDGE_OK);
            assert_int_equal(ls[e].from_layer, s_from[e]);
            assert_int_equal(a.from[e], s_from[e]);
            assert_int_equal(ls[e].blocks, S_NCHUNK * s_fx.cc->heads); /* the cloud's heads */
            assert_string_equal(ls[e].source, "cloud1");
            /* the plan may have priced the edge's own layer first (the proxy falls back to
             * the mapped one when the source lacks it): only the delivery is checked */
            assert_true(plan->layer[e].from_layer == s_from[e] || plan->layer[e].from_layer == -1);
            s_dst_expect(&d.k[e], S_OFFSET, s_fx.ak[e], "K", e);
            s_dst_expect(&d.v[e], S_OFFSET, s_fx.av[e], "V", e);
        } else {
            assert_int_equal(st[e], KVEDGE_OK);
            assert_int_equal(ls[e].from_layer, -1);
            assert_int_equal(a.from[e], -1);
            assert_int_equal(ls[e].blocks, S_NCHUNK * s_fx.ec->heads);
            assert_int_equal(plan->layer[e].from_layer, -1);
            s_dst_expect(&d.k[e], S_OFFSET, s_fx.ek + e * s_fx.ekvf, "K", e);
            s_dst_expect(&d.v[e], S_OFFSET, s_fx.ev + e * s_fx.ekvf, "V", e);
        }
        assert_false(ls[e].adapt_failed);
    }
    assert_int_equal(a.calls, 2);
    assert_int_equal(ps.adapted, 2);
    assert_int_equal(ps.resident, 3);
    assert_int_equal(ps.misses, 0);
    assert_true(ps.slot_bytes > 0);
    free(plan);
    s_dst_free(&d);
    kvedge_client_destroy(&c);
}

/* A decoder provider over a pipeline (what kvedge_e2e_decode does), or over the reference:
 * the adapted K/V for mapped layers, the edge's own K/V for the others, MISS for `miss`. */
typedef struct {
    kvedge_pipeline_t *p; /* NULL: the reference */
    s_dst_t *d;
    int miss;
} s_prov_t;

static int s_provide(void *arg, uint32_t layer, float *k, float *v)
{
    s_prov_t *pv = arg;
    if (!pv->p) {
        if ((int)layer == pv->miss)
            return KVEDGE_DECODER_MISS;
        bool own = s_from[layer] < 0;
        memcpy(k, own ? s_fx.ek + layer * s_fx.ekvf : s_fx.ak[layer], s_fx.ekvf * sizeof(float));
        memcpy(v, own ? s_fx.ev + layer * s_fx.ekvf : s_fx.av[layer], s_fx.ekvf * sizeof(float));
        return KVEDGE_OK;
    }
    int rc = kvedge_pipeline_wait(pv->p, (uint16_t)layer);
    if (rc == KVEDGE_ENOTFOUND)
        return KVEDGE_DECODER_MISS;
    if (rc != KVEDGE_OK)
        return rc;
    memcpy(k, pv->d->k[layer].base, s_fx.ekvf * sizeof(float)); /* offset 0, cap S_CTX */
    memcpy(v, pv->d->v[layer].base, s_fx.ekvf * sizeof(float));
    return KVEDGE_OK;
}

/* The edge decoder over the context with provider pv: the prompt's last logits. */
static void s_decode(s_prov_t *pv, float *logits)
{
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(s_fx.edge);
    assert_non_null(s);
    assert_int_equal(kvedge_decoder_session_begin(s, s_fx.ctx, S_CTX, s_provide, pv, s_fx.prompt,
                                                  S_PROMPT, S_NEW, logits),
                     KVEDGE_OK);
    kvedge_decoder_session_destroy(&s);
}

/* The adapter fails on edge layer 2: it becomes a miss (adapt_failed, its destination
 * untouched), the rest arrives, and the decoder's logits are those of a decode that computed
 * layer 2 itself. An adapted layer with a NaN in it is a miss too. */
static void test_adapt_failure_is_a_miss(void **state)
{
    (void)state;
    kvedge_client_t *c = s_client(s_fx.w.pep);
    s_dst_t d;
    s_dst_make(&d, 0);
    for (int l = 0; l < 3; l++) /* tokens_cap S_CTX: s_provide copies the layer as it is */
        d.k[l].tokens_cap = d.v[l].tokens_cap = S_CTX;
    kvedge_chunk_id_t ids[S_NCHUNK], mids[S_NCHUNK];
    s_adapt_t a = {.fail = 2, .nan = -1};
    kvedge_pipeline_opts_t o;
    s_opts(&o, c, &d, 0, ids, mids, &a);
    kvedge_pipeline_t *p = NULL;
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_OK);
    float *got = malloc(S_VOCAB * sizeof(float)), *want = malloc(S_VOCAB * sizeof(float));
    assert_true(got && want);
    s_prov_t pv = {.p = p, .d = &d, .miss = -1};
    s_decode(&pv, got);
    kvedge_pipeline_stats_t ps;
    kvedge_pipeline_layer_stats_t ls[3];
    assert_int_equal(kvedge_pipeline_stats(p, &ps, ls, 3), KVEDGE_OK);
    assert_int_equal(kvedge_pipeline_wait(p, 2), KVEDGE_ENOTFOUND);
    kvedge_pipeline_destroy(&p);
    assert_int_equal(ls[2].status, KVEDGE_ENOTFOUND);
    assert_true(ls[2].adapt_failed);
    assert_int_equal(ls[2].from_layer, 3); /* delivered, not used */
    assert_int_equal(ls[2].reason, KVEDGE_FETCH_MISS);
    assert_int_equal(ls[0].status, KVEDGE_OK);
    assert_false(ls[0].adapt_failed);
    assert_int_equal(ps.adapted, 1);
    assert_int_equal(ps.misses, 1);
    assert_int_equal(a.calls, 2);
    s_dst_expect(&d.k[2], 0, NULL, "K", 2);
    s_dst_expect(&d.v[2], 0, NULL, "V", 2);

    s_prov_t ref = {.p = NULL, .miss = 2};
    s_decode(&ref, want);
    assert_memory_equal(got, want, S_VOCAB * sizeof(float));
    /* and not those of a decode that used the adapted layer 2 */
    ref.miss = -1;
    s_decode(&ref, want);
    assert_memory_not_equal(got, want, S_VOCAB * sizeof(float));
    free(got);
    free(want);
    s_dst_free(&d);

    /* An output that is not finite: the same. */
    s_dst_make(&d, S_OFFSET);
    s_adapt_t an = {.fail = -1, .nan = 0};
    s_opts(&o, c, &d, S_OFFSET, ids, mids, &an);
    assert_int_equal(kvedge_pipeline_open(&o, &p), KVEDGE_OK);
    assert_int_equal(kvedge_pipeline_wait(p, 0), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_pipeline_wait(p, 1), KVEDGE_OK);
    assert_int_equal(kvedge_pipeline_wait(p, 2), KVEDGE_OK);
    assert_int_equal(kvedge_pipeline_stats(p, &ps, ls, 3), KVEDGE_OK);
    kvedge_pipeline_destroy(&p);
    assert_true(ls[0].adapt_failed);
    assert_false(ls[2].adapt_failed);
    assert_int_equal(ps.adapted, 1);
    s_dst_expect(&d.k[0], S_OFFSET, NULL, "K", 0);
    s_dst_expect(&d.v[0], S_OFFSET, NULL, "V", 0);
    s_dst_expect(&d.k[2], S_OFFSET, s_fx.ak[2], "K", 2);
    s_dst_free(&d);
    kvedge_client_destroy(&c);
}

/* ---------------------------------------------------------------- kvedge_e2e_decode */

static int s_e2e(kvedge_e2e_mode_t mode, kvedge_client_t *proxy, const kvedge_model_t *mapped,
                 const kvedge_adapter_t *adapter, const int32_t *ctx, int32_t *tokens,
                 float *logits, kvedge_e2e_result_t *res)
{
    kvedge_e2e_request_t rq = {
        .mode = mode,
        .decoder = s_fx.edge,
        .ctx = ctx,
        .ctx_len = S_CTX,
        .prompt = s_fx.prompt,
        .prompt_len = S_PROMPT,
        .max_new = S_NEW,
        .proxy = proxy,
        .model = &s_fx.edge_m,
        .chunk_tokens = S_CHUNK,
        .deadline_ms = S_DEADLINE,
        .mapped_model = mapped,
        .adapter = adapter,
        .logits = logits,
    };
    return kvedge_e2e_decode(&rq, tokens, res);
}

/* ce-lslm: the logits of a session handed the adapted cloud K/V for edge layers 0 and 2 and
 * its own for layer 1; the result and its printing say which cloud layer fed which. */
static void test_e2e_large_small(void **state)
{
    (void)state;
    kvedge_client_t *c = s_client(s_fx.w.pep);
    kvedge_e2e_result_t *r = calloc(1, sizeof *r);
    float *got = malloc(S_VOCAB * sizeof(float)), *want = malloc(S_VOCAB * sizeof(float));
    assert_true(r && got && want);
    int32_t tok[S_NEW];
    int rc = s_e2e(KVEDGE_E2E_KVEDGE, c, &s_fx.cloud_m, s_fx.adapter, s_fx.ctx, tok, got, r);
    if (rc != KVEDGE_OK)
        fail_msg("ce-lslm decode: %s", kvedge_strerror(rc));
    assert_true(r->large_small);
    assert_string_equal(kvedge_e2e_result_mode(r), "ce-lslm");
    assert_string_equal(r->mapped_model, S_CLOUD_ID);
    assert_int_equal(r->fetched, 3);
    assert_int_equal(r->computed, 0);
    assert_int_equal(r->adapted, 2);
    for (uint32_t e = 0; e < 3; e++) {
        assert_int_equal(r->layer[e].from_layer, s_from[e]);
        assert_false(r->layer[e].computed);
    }
    s_prov_t ref = {.p = NULL, .miss = -1};
    s_decode(&ref, want);
    assert_memory_equal(got, want, S_VOCAB * sizeof(float));

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    kvedge_e2e_print(f, r, false);
    fclose(f);
    printf("%s", buf);
    assert_non_null(strstr(buf, "layer 0 \u2190 cloud ls-cloud layer 0 via cloud1 ("));
    assert_non_null(strstr(buf, "layer 2 \u2190 cloud ls-cloud layer 3 via cloud1 ("));
    assert_non_null(strstr(buf, "layer 1 \u2190 its own K/V via cloud1 ("));
    assert_non_null(strstr(buf, "mode      ce-lslm"));
    free(buf);
    f = open_memstream(&buf, &len);
    assert_non_null(f);
    kvedge_e2e_print(f, r, true);
    fclose(f);
    cJSON *j = cJSON_Parse(buf);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "mode")->valuestring, "ce-lslm");
    assert_string_equal(cJSON_GetObjectItem(j, "mapped_model")->valuestring, S_CLOUD_ID);
    cJSON *layers = cJSON_GetObjectItem(j, "layer");
    assert_int_equal(cJSON_GetArraySize(layers), 3);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(layers, 2), "from_layer")->valueint, 3);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(layers, 1), "from_layer")));
    cJSON_Delete(j);
    free(buf);
    free(got);
    free(want);
    free(r);
    kvedge_client_destroy(&c);
}

/* No map pairs ls-cloud2 with the edge: nothing comes from it (and of another context the
 * edge's own K/V is nowhere either), every layer is computed, and the tokens and logits are
 * edge-only's. */
static void test_no_map_all_computed(void **state)
{
    (void)state;
    kvedge_client_t *c = s_client(s_fx.w.pep);
    kvedge_e2e_result_t *r = calloc(1, sizeof *r);
    float *got = malloc(S_VOCAB * sizeof(float)), *want = malloc(S_VOCAB * sizeof(float));
    assert_true(r && got && want);
    int32_t tok[S_NEW], local[S_NEW];
    assert_int_equal(
        s_e2e(KVEDGE_E2E_KVEDGE, c, &s_fx.cloud2_m, s_fx.adapter2, s_fx.ctx2, tok, got, r),
        KVEDGE_OK);
    assert_true(r->large_small);
    assert_int_equal(r->computed, 3);
    assert_int_equal(r->adapted, 0);
    for (uint32_t e = 0; e < 3; e++)
        assert_int_equal(r->layer[e].from_layer, -1);
    assert_int_equal(s_e2e(KVEDGE_E2E_LOCAL, NULL, NULL, NULL, s_fx.ctx2, local, want, r),
                     KVEDGE_OK);
    assert_memory_equal(tok, local, sizeof tok);
    assert_memory_equal(got, want, S_VOCAB * sizeof(float));
    free(got);
    free(want);
    free(r);
    kvedge_client_destroy(&c);
}

/* Refused: a mapped model without adapter or the reverse, either outside kvedge mode, an
 * adapter for another cloud model or of other shapes, a store node instead of a proxy. */
static void test_e2e_refused(void **state)
{
    (void)state;
    kvedge_client_t *c = s_client(s_fx.w.pep), *node = s_client(s_fx.w.nep);
    kvedge_e2e_result_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    int32_t tok[S_NEW];
    assert_int_equal(s_e2e(KVEDGE_E2E_KVEDGE, c, &s_fx.cloud_m, NULL, s_fx.ctx, tok, NULL, r),
                     KVEDGE_EINVAL);
    assert_int_equal(s_e2e(KVEDGE_E2E_KVEDGE, c, NULL, s_fx.adapter, s_fx.ctx, tok, NULL, r),
                     KVEDGE_EINVAL);
    assert_int_equal(
        s_e2e(KVEDGE_E2E_LOCAL, NULL, &s_fx.cloud_m, s_fx.adapter, s_fx.ctx, tok, NULL, r),
        KVEDGE_EINVAL);
    assert_int_equal(
        s_e2e(KVEDGE_E2E_KVEDGE, c, &s_fx.cloud_m, s_fx.adapter2, s_fx.ctx, tok, NULL, r),
        KVEDGE_EINVAL); /* fitted for ls-cloud2 */
    kvedge_model_t wrong = s_fx.cloud_m;
    wrong.kv_heads = 3;
    wrong.head_dim = 32;
    assert_int_equal(s_e2e(KVEDGE_E2E_KVEDGE, c, &wrong, s_fx.adapter, s_fx.ctx, tok, NULL, r),
                     KVEDGE_ESHAPE);
    assert_int_equal(
        s_e2e(KVEDGE_E2E_KVEDGE, node, &s_fx.cloud_m, s_fx.adapter, s_fx.ctx, tok, NULL, r),
        KVEDGE_EINVAL);
    free(r);
    kvedge_client_destroy(&node);
    kvedge_client_destroy(&c);
}

/* ---------------------------------------------------------------- the command */

/* `kvedge -H PROXY decode --adapter FILE`: the per-layer report names the cloud layers. */
static void test_cli_decode_adapter(void **state)
{
    (void)state;
    char ctx[S_CTX * 8], prompt[S_PROMPT * 8];
    size_t k = 0;
    for (uint32_t i = 0; i < S_CTX; i++)
        k += (size_t)snprintf(ctx + k, sizeof ctx - k, "%s%d", i ? "," : "", s_fx.ctx[i]);
    k = 0;
    for (uint32_t i = 0; i < S_PROMPT; i++)
        k += (size_t)snprintf(prompt + k, sizeof prompt - k, "%s%d", i ? "," : "", s_fx.prompt[i]);
    char out[160], cmd[4096];
    snprintf(out, sizeof out, "%s/decode.txt", s_fx.root);
    snprintf(cmd, sizeof cmd,
             "%s -H %s decode --weights %s --model-id %s --context-ids %s --prompt-ids %s "
             "--chunk-tokens %d --max-new %d --adapter %s > %s 2>&1",
             KVEDGE_BIN, s_fx.w.pep, s_fx.edge_w, S_EDGE_ID, ctx, prompt, S_CHUNK, S_NEW,
             s_fx.adapter_path, out);
    int rc = system(cmd);
    char text[8192] = "";
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    if (rc != 0)
        fail_msg("kvedge decode --adapter: exit %d:\n%s", rc, text);
    printf("%s", text);
    assert_non_null(strstr(text, "layer 2 \u2190 cloud ls-cloud layer 3 via cloud1 ("));
    assert_non_null(strstr(text, "layer 1 \u2190 its own K/V via cloud1 ("));
    assert_non_null(strstr(text, "mode      ce-lslm"));
    assert_non_null(strstr(text, "adapted   2 layers of ls-cloud"));

    /* Adapters refused: one that does not fit the weights (the cloud's weights as the edge)
     * and a damaged file. Each is reported, and the decode goes on as the loaded model's own
     * request, its layers fetched or computed here: it completes. */
    char bad[200];
    snprintf(bad, sizeof bad, "%s/damaged.safetensors", s_fx.root);
    f = fopen(bad, "w");
    assert_non_null(f);
    fputs("not an adapter file", f);
    fclose(f);
    const struct {
        const char *weights, *id, *adapter, *why;
    } refused[] = {
        {s_fx.cloud_w, S_CLOUD_ID, s_fx.adapter_path, "does not fit"},
        {s_fx.edge_w, S_EDGE_ID, bad, "cannot use the adapter"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(cmd, sizeof cmd,
                 "%s -H %s decode --weights %s --model-id %s --context-ids %s --prompt-ids %s "
                 "--chunk-tokens %d --max-new %d --adapter %s > %s 2>&1",
                 KVEDGE_BIN, s_fx.w.pep, refused[i].weights, refused[i].id, ctx, prompt, S_CHUNK,
                 S_NEW, refused[i].adapter, out);
        rc = system(cmd);
        f = fopen(out, "r");
        assert_non_null(f);
        n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        fclose(f);
        if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
            fail_msg("decode with a refused adapter (%s): exit %d:\n%s", refused[i].why, rc, text);
        assert_non_null(strstr(text, refused[i].why));
        assert_non_null(strstr(text, "going on without the adapter"));
        assert_null(strstr(text, "ce-lslm"));
        assert_non_null(strstr(text, "mode      kvedge"));
    }
}

/* ---------------------------------------------------------------- a registered adapter */

/* Runs a shell command line into ROOT/reg.txt (stdout and stderr); returns its exit status and
 * the output in text. */
static int s_run(char *text, size_t cap, const char *fmt, ...)
{
    char cmd[4096], out[160];
    snprintf(out, sizeof out, "%s/reg.txt", s_fx.root);
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    assert_true(k > 0 && (size_t)k + strlen(out) + 8 < sizeof cmd);
    snprintf(cmd + k, sizeof cmd - (size_t)k, " > %s 2>&1", out);
    int rc = system(cmd);
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, cap - 1, f);
    text[n] = '\0';
    fclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* `kvedge -H PROXY decode ... --adapter FILE` plus extra (--master ...), into text. */
static int s_decode_with(const char *extra, const char *global, const char *adapter, char *text,
                         size_t cap)
{
    char ctx[S_CTX * 8], prompt[S_PROMPT * 8];
    size_t k = 0;
    for (uint32_t i = 0; i < S_CTX; i++)
        k += (size_t)snprintf(ctx + k, sizeof ctx - k, "%s%d", i ? "," : "", s_fx.ctx[i]);
    k = 0;
    for (uint32_t i = 0; i < S_PROMPT; i++)
        k += (size_t)snprintf(prompt + k, sizeof prompt - k, "%s%d", i ? "," : "", s_fx.prompt[i]);
    return s_run(text, cap,
                 "%s %s -H %s decode --weights %s --model-id %s --context-ids %s --prompt-ids %s "
                 "--chunk-tokens %d --max-new %d --adapter %s %s",
                 KVEDGE_BIN, global, s_fx.w.pep, s_fx.edge_w, S_EDGE_ID, ctx, prompt, S_CHUNK,
                 S_NEW, adapter, extra);
}

/* Writes the map record ls-cloud -> ls-edge with from[2] = last. */
static void s_set_map(uint16_t last)
{
    kvedge_master_map_t *rec = calloc(1, sizeof *rec);
    assert_non_null(rec);
    rec->cloud_layers = (uint16_t)s_fx.cc->layers;
    rec->edge_layers = (uint16_t)s_fx.ec->layers;
    rec->from[0] = 0;
    rec->from[1] = KVEDGE_MASTER_MAP_NONE;
    rec->from[2] = last;
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_map_pack(rec, body, &len), KVEDGE_OK);
    assert_int_equal(kvedge_mview_set(s_fx.w.reg, "map/" S_CLOUD_ID "/" S_EDGE_ID, body, len, 3000),
                     KVEDGE_OK);
    free(rec);
}

/* The decode went on as the edge model's own request, and said why. */
static void s_expect_without(int rc, const char *text, const char *why)
{
    if (rc != 0 || !strstr(text, why) || !strstr(text, "going on without the adapter") ||
        strstr(text, "ce-lslm") || !strstr(text, "mode      kvedge"))
        fail_msg("expected a decode without the adapter (%s), exit 0; got exit %d:\n%s", why, rc,
                 text);
}

/* `kvedge layermap --show MAP --register --adapter FILE` registers the file's digest record
 * beside the map; `kvedge decode --adapter FILE --master` uses only that file, fitted with the
 * map registered now, and otherwise (another file, a stale map, no record, no master) goes on
 * without it. */
static void test_registered_adapter(void **state)
{
    (void)state;
    static char text[16384];
    char reg[600], changed[200], master[600];
    snprintf(reg, sizeof reg, "--register %s --master-pub %s", s_fx.w.mep, s_fx.w.mpub);
    snprintf(master, sizeof master, "--master %s --master-pub %s", s_fx.w.mep, s_fx.w.mpub);

    /* An adapter that is not the map's (fitted for ls-cloud2) is refused, nothing registered. */
    char other[200];
    snprintf(other, sizeof other, "%s/other.adapter", s_fx.root);
    assert_int_equal(kvedge_adapter_save(s_fx.adapter2, other), KVEDGE_OK);
    int rc = s_run(text, sizeof text, "%s layermap --show %s %s --adapter %s", KVEDGE_BIN,
                   s_fx.map_path, reg, other);
    if (rc != 4 || !strstr(text, "does not fit the map"))
        fail_msg("registering another pair's adapter: exit %d:\n%s", rc, text);
    kvedge_master_adapter_t *rec = malloc(sizeof *rec);
    assert_non_null(rec);
    assert_int_equal(kvedge_mview_adapter(s_fx.w.reg, S_CLOUD_ID, S_EDGE_ID, rec),
                     KVEDGE_ENOTFOUND);
    /* --adapter with --show needs --register. */
    assert_int_equal(s_run(text, sizeof text, "%s layermap --show %s --adapter %s", KVEDGE_BIN,
                           s_fx.map_path, s_fx.adapter_path),
                     2);

    /* Registered: the record has the file's size and fit, and master-dump shows it. */
    rc = s_run(text, sizeof text, "%s layermap --show %s %s --adapter %s", KVEDGE_BIN,
               s_fx.map_path, reg, s_fx.adapter_path);
    if (rc != 0 || !strstr(text, "registered adapter/" S_CLOUD_ID "/" S_EDGE_ID " at ") ||
        !strstr(text, ", least-squares, "))
        fail_msg("registering the adapter: exit %d:\n%s", rc, text);
    assert_int_equal(kvedge_mview_wait(s_fx.w.reg, kvedge_master_seq(s_fx.w.master), KT_WAIT_MS),
                     KVEDGE_OK);
    assert_int_equal(kvedge_mview_adapter(s_fx.w.reg, S_CLOUD_ID, S_EDGE_ID, rec), KVEDGE_OK);
    FILE *f = fopen(s_fx.adapter_path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    assert_int_equal((uint64_t)ftell(f), rec->size);
    assert_int_equal(rec->fit, KVEDGE_MASTER_FIT_LEAST_SQUARES);
    assert_int_equal(rec->from[2], 3);
    assert_string_equal(rec->cloud_rope, "none");
    assert_int_equal(s_run(text, sizeof text,
                           "%s master-dump --master %s --pub %s --prefix adapter/", KVEDGE_BIN,
                           s_fx.w.mep, s_fx.w.mpub),
                     0);
    assert_non_null(strstr(text, "fit=least-squares"));
    assert_non_null(strstr(text, "from=0,-,3"));

    /* The registered file: used. */
    rc = s_decode_with(master, "", s_fx.adapter_path, text, sizeof text);
    if (rc != 0 || !strstr(text, "is the adapter registered for") || !strstr(text, "ce-lslm") ||
        !strstr(text, "adapted   2 layers of ls-cloud"))
        fail_msg("decode with the registered adapter: exit %d:\n%s", rc, text);

    /* Another file of the same pair and shape (one weight's last bit changed): refused. */
    snprintf(changed, sizeof changed, "%s/changed.adapter", s_fx.root);
    uint8_t *bytes = malloc(rec->size);
    assert_non_null(bytes);
    rewind(f);
    assert_int_equal(fread(bytes, 1, rec->size, f), rec->size);
    fclose(f);
    bytes[rec->size - 4] ^= 1; /* the lowest mantissa bit of the last weight */
    f = fopen(changed, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, rec->size, f), rec->size);
    assert_int_equal(fclose(f), 0);
    free(bytes);
    rc = s_decode_with(master, "", changed, text, sizeof text);
    s_expect_without(rc, text, "is not the registered adapter");
    /* Without a master nothing changes: the same file is used. */
    rc = s_decode_with("", "", changed, text, sizeof text);
    if (rc != 0 || !strstr(text, "ce-lslm"))
        fail_msg("decode without a master: exit %d:\n%s", rc, text);

    /* The map changed after the adapter was registered: stale. */
    s_set_map(2);
    rc = s_decode_with(master, "", s_fx.adapter_path, text, sizeof text);
    s_expect_without(rc, text, "is stale: fitted with the map 0,-,3");
    s_set_map(3);

    /* A record the master refuses: nothing changes. */
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_adapter_pack(rec, body, &len), KVEDGE_OK);
    body[2] = 9; /* no such fit */
    assert_int_equal(
        kvedge_mview_set(s_fx.w.reg, "adapter/" S_CLOUD_ID "/" S_EDGE_ID, body, len, 3000),
        KVEDGE_EPROTO);
    rc = s_decode_with(master, "", s_fx.adapter_path, text, sizeof text);
    if (rc != 0 || !strstr(text, "ce-lslm"))
        fail_msg("decode after a refused record: exit %d:\n%s", rc, text);

    /* No record: not used (a master is named, so only a registered adapter is). */
    assert_int_equal(
        kvedge_mview_set(s_fx.w.reg, "adapter/" S_CLOUD_ID "/" S_EDGE_ID, NULL, 0, 3000),
        KVEDGE_OK);
    rc = s_decode_with(master, "", s_fx.adapter_path, text, sizeof text);
    s_expect_without(rc, text, "no adapter is registered for ls-cloud -> ls-edge");

    /* No master: the deadline, a clear message, and the decode goes on without it. */
    char down[600];
    snprintf(down, sizeof down, "--master ipc://%s/nomaster.sock --master-pub ipc://%s/nopub.sock",
             s_fx.root, s_fx.root);
    rc = s_decode_with(down, "--deadline 1000", s_fx.adapter_path, text, sizeof text);
    s_expect_without(rc, text, "no snapshot from the master at ipc://");
    assert_non_null(strstr(text, "within 1000 ms"));
    /* Flags that go together. */
    assert_int_equal(
        s_decode_with("--master-pub ipc:///nowhere", "", s_fx.adapter_path, text, sizeof text), 2);

    /* The check itself: a record with the file's digest that does not describe it (written by
     * hand), and no map at all. */
    kvedge_adapter_t *a = NULL;
    uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES];
    uint64_t size = 0;
    char why[KVEDGE_ADAPTER_REG_WHY_BYTES];
    assert_int_equal(
        kvedge_adapter_load_digest(s_fx.adapter_path, &a, digest, &size, why, sizeof why),
        KVEDGE_OK);
    kvedge_master_map_t *map = calloc(1, sizeof *map);
    assert_non_null(map);
    assert_int_equal(kvedge_adapter_to_master(a, digest, size, rec, why, sizeof why), KVEDGE_OK);
    map->cloud_layers = rec->cloud_layers;
    map->edge_layers = rec->edge_layers;
    memcpy(map->from, rec->from, sizeof map->from);
    assert_int_equal(kvedge_adapter_check_registered(a, digest, size, rec, map, why, sizeof why),
                     KVEDGE_OK);
    assert_int_equal(kvedge_adapter_check_registered(a, digest, size, rec, NULL, why, sizeof why),
                     KVEDGE_EEXPIRED);
    assert_int_equal(
        kvedge_adapter_check_registered(a, digest, size + 1, rec, map, why, sizeof why),
        KVEDGE_ECORRUPT);
    rec->fit = KVEDGE_MASTER_FIT_DISTILLED;
    assert_int_equal(kvedge_adapter_check_registered(a, digest, size, rec, map, why, sizeof why),
                     KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "not its fit, map or rotary settings"));
    kvedge_adapter_destroy(&a);
    assert_int_equal(
        kvedge_adapter_load_digest("/nonexistent/x", &a, digest, &size, why, sizeof why),
        KVEDGE_EIO);
    assert_null(a);
    free(map);
    free(rec);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_mapped_exact),
        cmocka_unit_test(test_adapt_failure_is_a_miss),
        cmocka_unit_test(test_e2e_large_small),
        cmocka_unit_test(test_cli_decode_adapter),
        cmocka_unit_test(test_e2e_refused),
        cmocka_unit_test(test_no_map_all_computed),
        cmocka_unit_test(test_registered_adapter),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
