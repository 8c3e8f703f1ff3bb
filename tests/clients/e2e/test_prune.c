/* Pruning unmapped layers (docs/largesmall.md, "Pruning unmapped layers"): the kept set of a
 * cloud model is the union of the cloud layers its registered layer maps use, and a prefill
 * with a layer set stores only those layers. Two synthesized models, a cloud (4 layers x 6
 * heads x 16, served under three ids) and an edge (3 layers x 4 heads x 16), a Storage Master
 * with the maps pr-cloud -> pr-edge (0, 1, 3), pr-cloud -> pr-edge2 (0, none) and
 * pr-full -> pr-edge (0, 1, 3), a cloud node and a proxy. pr-full is the context prefilled
 * whole, pr-cloud the same context pruned to the maps' union {0, 1, 3}:
 *  - the set, the --layers parser and the union, including their refusals;
 *  - the node holds layers 0, 1 and 3 of pr-cloud only, and the bytes saved are exactly what
 *    the full prefill stores more;
 *  - a FETCH of pr-cloud itself misses layer 2, which the client computes: the tokens of
 *    edge-only;
 *  - a MAPPED FETCH of the edge model gets the mapped layers 0, 1 and 3 and generates exactly
 *    the tokens and logits it does on the unpruned context;
 *  - `kvedge prefill --layers`, `--mapped-only`, and their refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

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
#include "clients/e2e/prune.h"
#include "proxy/proxy.h"
#include "access/codec/error.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "tests/common/world.h"

#define S_CLOUD_ID "pr-cloud" /* pruned to the maps' union */
#define S_FULL_ID  "pr-full"  /* the same weights, every layer stored */
#define S_NOMAP_ID "pr-nomap" /* the same weights, no map names it */
#define S_EDGE_ID  "pr-edge"  /* the edge model */
#define S_EDGE2_ID "pr-edge2" /* a second edge model (a record and a map only) */
#define S_VOCAB    300
#define S_POS      256
#define S_CTX      80 /* chunks of 32, 32 and 16 */
#define S_CHUNK    32
#define S_NCHUNK   3
#define S_PROMPT   12
#define S_NEW      6
#define S_SAMPLES  64
#define S_DEADLINE 10000

/* pr-edge: edge layer -> cloud layer. Every edge layer mapped: a layer the edge must compute
 * makes the proxy's plan compute the layers below it too (docs/largesmall.md), which would
 * hide what pruning does. */
static const int32_t s_from[3] = {0, 1, 3};
static const int32_t s_from2[2] = {0, -1}; /* pr-edge2 */

static struct {
    char root[64];
    char cloud_w[128], edge_w[128];
    kvedge_decoder_t *cloud, *edge;
    const kvedge_decoder_config_t *cc, *ec;
    kvedge_model_t cloud_m, full_m, nomap_m, edge_m, edge2_m;
    int32_t ctx[S_CTX], prompt[S_PROMPT], calib[S_SAMPLES];
    kvedge_adapter_t *adapter, *adapter_full;
    kvedge_e2e_prefill_stats_t st_full, st_pruned;
    kvedge_prune_set_t keep; /* what the pruned prefill used */
    kt_world_t w;            /* a master with the models and the maps, a cloud node, a proxy */
} s_fx;

/* ---------------------------------------------------------------- helpers */

static void s_set(const char *key, const uint8_t *body, size_t len)
{
    assert_int_equal(kvedge_mview_set(s_fx.w.reg, key, body, len, 3000), KVEDGE_OK);
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
    s_set(key, body, len);
}

/* A master map record: from[e] < 0 is none. */
static void s_map_rec(kvedge_master_map_t *r, uint16_t cloud_layers, const int32_t *from,
                      uint16_t edge_layers)
{
    memset(r, 0, sizeof *r);
    r->cloud_layers = cloud_layers;
    r->edge_layers = edge_layers;
    for (uint16_t e = 0; e < edge_layers; e++)
        r->from[e] = from[e] < 0 ? KVEDGE_MASTER_MAP_NONE : (uint16_t)from[e];
}

static void s_register_map(const char *cloud, const char *edge, const int32_t *from,
                           uint16_t edge_layers)
{
    kvedge_master_map_t *r = malloc(sizeof *r);
    assert_non_null(r);
    s_map_rec(r, (uint16_t)s_fx.cc->layers, from, edge_layers);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_map_pack(r, body, &len), KVEDGE_OK);
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    assert_int_equal(
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_MAP, cloud, edge, key, sizeof key), KVEDGE_OK);
    s_set(key, body, len);
    free(r);
}

/* The linear adapter cloud_id -> pr-edge of s_from. */
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
    return a;
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

static void s_quant(kvedge_e2e_quant_t *q, const kvedge_prune_set_t *layers)
{
    kvedge_e2e_quant_default(q);
    q->scheme = KVEDGE_SCHEME_LOSSLESS; /* the edge gets the cloud's exact K/V */
    q->dtype = KVEDGE_DTYPE_FP32;
    q->layers = layers;
}

/* ---------------------------------------------------------------- fixture */

static void s_world_start(void)
{
    kt_world_master(&s_fx.w, s_fx.root);
    s_register_model(&s_fx.cloud_m);
    s_register_model(&s_fx.full_m);
    s_register_model(&s_fx.nomap_m);
    s_register_model(&s_fx.edge_m);
    s_register_model(&s_fx.edge2_m);
    s_register_map(S_CLOUD_ID, S_EDGE_ID, s_from, 3);
    s_register_map(S_CLOUD_ID, S_EDGE2_ID, s_from2, 2);
    s_register_map(S_FULL_ID, S_EDGE_ID, s_from, 3);

    /* The cloud node is not registered with the master: no directory, so the proxy learns
     * that a layer is missing from the node's answer (the fallback path). */
    kt_world_node(&s_fx.w, s_fx.root);

    /* The cloud role: the context whole under pr-full, pruned to the maps' union under
     * pr-cloud. */
    size_t n_maps = 0;
    char edges[256], why[KVEDGE_PRUNE_WHY_BYTES];
    if (kvedge_prune_from_view(s_fx.w.reg, S_CLOUD_ID, s_fx.cc->layers, &s_fx.keep, &n_maps, edges,
                               sizeof edges, why, sizeof why) != KVEDGE_OK)
        fail_msg("kvedge_prune_from_view: %s", why);
    kvedge_client_t *c = s_client(s_fx.w.nep);
    kvedge_e2e_quant_t q;
    kvedge_chunk_id_t ids[S_NCHUNK];
    s_quant(&q, NULL);
    assert_int_equal(kvedge_e2e_prefill(c, s_fx.cloud, &s_fx.full_m, s_fx.ctx, S_CTX, S_CHUNK, &q,
                                        ids, S_NCHUNK, &s_fx.st_full),
                     KVEDGE_OK);
    s_quant(&q, &s_fx.keep);
    assert_int_equal(kvedge_e2e_prefill(c, s_fx.cloud, &s_fx.cloud_m, s_fx.ctx, S_CTX, S_CHUNK, &q,
                                        ids, S_NCHUNK, &s_fx.st_pruned),
                     KVEDGE_OK);
    kvedge_client_destroy(&c);

    kt_world_proxy(&s_fx.w, s_fx.root, "proxy-pr");
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_fx.root, sizeof s_fx.root, "/tmp/kvedge-pr-XXXXXX");
    assert_non_null(mkdtemp(s_fx.root));
    snprintf(s_fx.cloud_w, sizeof s_fx.cloud_w, "%s/cloud.safetensors", s_fx.root);
    snprintf(s_fx.edge_w, sizeof s_fx.edge_w, "%s/edge.safetensors", s_fx.root);
    kt_synth(s_fx.cloud_w, 4, 6, S_VOCAB, S_POS, 11);
    kt_synth(s_fx.edge_w, 3, 4, S_VOCAB, S_POS, 22);
    s_fx.cloud = kt_load(s_fx.cloud_w);
    s_fx.edge = kt_load(s_fx.edge_w);
    s_fx.cc = kvedge_decoder_config(s_fx.cloud);
    s_fx.ec = kvedge_decoder_config(s_fx.edge);
    assert_int_equal(kvedge_e2e_model(s_fx.cloud, S_CLOUD_ID, &s_fx.cloud_m), KVEDGE_OK);
    assert_int_equal(kvedge_e2e_model(s_fx.cloud, S_FULL_ID, &s_fx.full_m), KVEDGE_OK);
    assert_int_equal(kvedge_e2e_model(s_fx.cloud, S_NOMAP_ID, &s_fx.nomap_m), KVEDGE_OK);
    assert_int_equal(kvedge_e2e_model(s_fx.edge, S_EDGE_ID, &s_fx.edge_m), KVEDGE_OK);
    s_fx.edge2_m = s_fx.edge_m;
    snprintf(s_fx.edge2_m.id, sizeof s_fx.edge2_m.id, "%s", S_EDGE2_ID);
    s_fx.edge2_m.layers = 2;

    uint64_t x = 0x5eed;
    for (uint32_t i = 0; i < S_CTX + S_PROMPT + S_SAMPLES; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int32_t t = (int32_t)(4 + (x >> 33) % (S_VOCAB - 4));
        if (i < S_CTX)
            s_fx.ctx[i] = t;
        else if (i < S_CTX + S_PROMPT)
            s_fx.prompt[i - S_CTX] = t;
        else
            s_fx.calib[i - S_CTX - S_PROMPT] = t;
    }
    s_world_start();
    s_fx.adapter = s_fit(S_CLOUD_ID);
    s_fx.adapter_full = s_fit(S_FULL_ID);
    kt_world_proxy_sync(&s_fx.w); /* the proxy's replica of the registry gets the map */
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    kt_world_stop(&s_fx.w);
    kvedge_adapter_destroy(&s_fx.adapter);
    kvedge_adapter_destroy(&s_fx.adapter_full);
    kvedge_decoder_destroy(&s_fx.cloud);
    kvedge_decoder_destroy(&s_fx.edge);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_fx.root);
    assert_int_equal(system(cmd), 0);
    return 0;
}

/* ---------------------------------------------------------------- the set and the list */

static void s_expect_list(const kvedge_prune_set_t *s, const char *want)
{
    char got[KVEDGE_PRUNE_LIST_BYTES];
    assert_int_equal(kvedge_prune_set_format(s, got, sizeof got), KVEDGE_OK);
    assert_string_equal(got, want);
}

/* A list is refused with a reason that contains `part`. */
static void s_parse_refused(const char *list, uint32_t layers, const char *part)
{
    kvedge_prune_set_t s;
    char why[KVEDGE_PRUNE_WHY_BYTES] = "";
    assert_int_equal(kvedge_prune_parse(list, layers, &s, why, sizeof why), KVEDGE_EINVAL);
    printf("  '%s' of %u layers: %s\n", list, layers, why);
    if (!strstr(why, part))
        fail_msg("'%s': reason '%s' does not say '%s'", list, why, part);
    assert_int_equal(kvedge_prune_set_count(&s), 0);
}

static void test_set_and_parse(void **state)
{
    (void)state;
    kvedge_prune_set_t s;
    kvedge_prune_set_init(&s, 6);
    assert_int_equal(kvedge_prune_set_count(&s), 0);
    s_expect_list(&s, "");
    kvedge_prune_set_add(&s, 4);
    kvedge_prune_set_add(&s, 0);
    kvedge_prune_set_add(&s, 6); /* past the model: ignored */
    assert_true(kvedge_prune_set_has(&s, 4));
    assert_false(kvedge_prune_set_has(&s, 6));
    s_expect_list(&s, "0,4");
    kvedge_prune_set_all(&s, 6);
    s_expect_list(&s, "0,1,2,3,4,5");
    char tiny[4];
    assert_int_equal(kvedge_prune_set_format(&s, tiny, sizeof tiny), KVEDGE_ENOSPACE);

    assert_int_equal(kvedge_prune_parse("4,0,1", 6, &s, NULL, 0), KVEDGE_OK);
    s_expect_list(&s, "0,1,4");
    assert_int_equal(kvedge_prune_parse("5", 6, &s, NULL, 0), KVEDGE_OK);
    s_expect_list(&s, "5");
    /* 1024 layers, the last one */
    assert_int_equal(kvedge_prune_parse("1023", KVEDGE_MODEL_MAX_LAYERS, &s, NULL, 0), KVEDGE_OK);
    assert_true(kvedge_prune_set_has(&s, 1023));

    s_parse_refused("", 6, "empty list");
    s_parse_refused("0,,1", 6, "empty item");
    s_parse_refused("0,1,", 6, "empty item");
    s_parse_refused(",0", 6, "empty item");
    s_parse_refused("0,6", 6, "layer 6 is out of range: the model has layers 0..5");
    s_parse_refused("99999999999999999999", 6, "out of range");
    s_parse_refused("1,4,1", 6, "layer 1 is listed twice");
    s_parse_refused("a", 6, "'a' at byte 0");
    s_parse_refused("0,x", 6, "'x' at byte 2");
    s_parse_refused("1-3", 6, "'-' at byte 1");
    s_parse_refused("-1", 6, "'-' at byte 0");
    s_parse_refused("+1", 6, "'+' at byte 0");
    s_parse_refused(" 1", 6, "' ' at byte 0");
    s_parse_refused("0, 1", 6, "' ' at byte 2");
    s_parse_refused("1 ", 6, "' ' at byte 1");
    assert_int_equal(kvedge_prune_parse(NULL, 6, &s, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prune_parse("0", 0, &s, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prune_parse("0", 6, NULL, NULL, 0), KVEDGE_EINVAL);
}

/* ---------------------------------------------------------------- the union */

static void test_union(void **state)
{
    (void)state;
    kvedge_master_map_t a, b, bad;
    const int32_t fa[3] = {0, 1, 4}, fb[4] = {-1, 4, 5, -1};
    s_map_rec(&a, 6, fa, 3);
    s_map_rec(&b, 6, fb, 4);
    kvedge_prune_set_t s;
    char why[KVEDGE_PRUNE_WHY_BYTES] = "";

    /* two maps: their cloud layers, each once; none entries add nothing */
    kvedge_prune_map_t two[2] = {{"kjv-cloud", "kjv-edge", &a}, {"kjv-cloud", "tiny", &b}};
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, two, 2, &s, why, sizeof why), KVEDGE_OK);
    s_expect_list(&s, "0,1,4,5");
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, two, 1, &s, why, sizeof why), KVEDGE_OK);
    s_expect_list(&s, "0,1,4");
    /* a map of none entries only; no maps at all: the empty set */
    const int32_t fn[2] = {-1, -1};
    kvedge_master_map_t none;
    s_map_rec(&none, 6, fn, 2);
    kvedge_prune_map_t nm = {"kjv-cloud", "e", &none};
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, &nm, 1, &s, why, sizeof why), KVEDGE_OK);
    assert_int_equal(kvedge_prune_set_count(&s), 0);
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, NULL, 0, &s, why, sizeof why), KVEDGE_OK);
    assert_int_equal(kvedge_prune_set_count(&s), 0);

    /* a map naming another cloud model */
    kvedge_prune_map_t other[2] = {{"kjv-cloud", "kjv-edge", &a}, {"opt-1.3b", "tiny", &b}};
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, other, 2, &s, why, sizeof why),
                     KVEDGE_EINVAL);
    printf("  %s\n", why);
    assert_non_null(strstr(why, "map/opt-1.3b/tiny is a map of opt-1.3b, not of kjv-cloud"));
    assert_int_equal(kvedge_prune_set_count(&s), 0);
    /* a map of another layer count */
    s_map_rec(&bad, 4, fa, 2);
    kvedge_prune_map_t cnt = {"kjv-cloud", "old", &bad};
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, &cnt, 1, &s, why, sizeof why),
                     KVEDGE_ECORRUPT);
    printf("  %s\n", why);
    assert_non_null(strstr(why, "map/kjv-cloud/old gives kjv-cloud 4 layers, the model has 6"));
    /* an entry past the model's layers (a record the parser would refuse, made by hand) */
    const int32_t fo[3] = {0, 6, 1};
    s_map_rec(&bad, 6, fo, 3);
    kvedge_prune_map_t oob[2] = {{"kjv-cloud", "kjv-edge", &a}, {"kjv-cloud", "hand", &bad}};
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, oob, 2, &s, why, sizeof why),
                     KVEDGE_ECORRUPT);
    printf("  %s\n", why);
    assert_non_null(strstr(why, "map/kjv-cloud/hand: edge layer 1 takes cloud layer 6, "
                                "kjv-cloud has 6"));
    assert_int_equal(kvedge_prune_set_count(&s), 0);
    /* no edge layers */
    s_map_rec(&bad, 6, fa, 0);
    kvedge_prune_map_t empty = {"kjv-cloud", "e0", &bad};
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, &empty, 1, &s, why, sizeof why),
                     KVEDGE_ECORRUPT);
    /* arguments */
    assert_int_equal(kvedge_prune_union(NULL, 6, two, 2, &s, why, sizeof why), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, NULL, 2, &s, why, sizeof why),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_prune_union("kjv-cloud", 0, two, 2, &s, why, sizeof why),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, two, 2, NULL, why, sizeof why),
                     KVEDGE_EINVAL);
    kvedge_prune_map_t nul = {"kjv-cloud", "e", NULL};
    assert_int_equal(kvedge_prune_union("kjv-cloud", 6, &nul, 1, &s, NULL, 0), KVEDGE_EINVAL);
}

/* The registry's maps: pr-cloud has two ({0, 1, 3} and {0}), pr-full one, pr-nomap none; a
 * model whose maps use none of its layers is refused as well. */
static void test_from_view(void **state)
{
    (void)state;
    kvedge_prune_set_t s;
    size_t n = 99;
    char edges[256], why[KVEDGE_PRUNE_WHY_BYTES] = "";
    assert_int_equal(kvedge_prune_from_view(s_fx.w.reg, S_CLOUD_ID, 4, &s, &n, edges, sizeof edges,
                                            why, sizeof why),
                     KVEDGE_OK);
    s_expect_list(&s, "0,1,3");
    assert_int_equal(n, 2);
    assert_string_equal(edges, "pr-edge,pr-edge2");
    assert_int_equal(kvedge_prune_from_view(s_fx.w.reg, S_FULL_ID, 4, &s, &n, NULL, 0, NULL, 0),
                     KVEDGE_OK);
    assert_int_equal(n, 1);
    /* pr-cloud's key is a prefix of nothing else: pr-cloud2 would not count */
    assert_int_equal(kvedge_prune_from_view(s_fx.w.reg, S_NOMAP_ID, 4, &s, &n, edges, sizeof edges,
                                            why, sizeof why),
                     KVEDGE_ENOTFOUND);
    printf("  %s\n", why);
    assert_non_null(strstr(why, "no edge model maps pr-nomap: pruning would drop every layer"));
    assert_int_equal(n, 0);
    assert_int_equal(kvedge_prune_set_count(&s), 0);
    /* a map record of another layer count than the caller's model */
    assert_int_equal(
        kvedge_prune_from_view(s_fx.w.reg, S_CLOUD_ID, 6, &s, &n, NULL, 0, why, sizeof why),
        KVEDGE_ECORRUPT);
    printf("  %s\n", why);
    /* maps that use none of the model's layers */
    const int32_t fn[2] = {-1, -1};
    s_register_map("pr-allnone", S_EDGE2_ID, fn, 2);
    assert_int_equal(
        kvedge_prune_from_view(s_fx.w.reg, "pr-allnone", 4, &s, &n, NULL, 0, why, sizeof why),
        KVEDGE_ENOTFOUND);
    printf("  %s\n", why);
    assert_non_null(strstr(why, "the 1 map of pr-allnone uses none of its layers"));
    assert_int_equal(kvedge_prune_from_view(NULL, S_CLOUD_ID, 4, &s, &n, NULL, 0, NULL, 0),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_prune_from_view(s_fx.w.reg, "a/b", 4, &s, &n, NULL, 0, NULL, 0),
                     KVEDGE_EINVAL);
}

/* ---------------------------------------------------------------- the prefill */

/* Blocks the node holds of each layer of model m's context: GET_LAYER per layer. */
static void s_count_layers(const kvedge_model_t *m, uint32_t *blocks)
{
    kvedge_client_t *c = s_client(s_fx.w.nep);
    kvedge_chunk_id_t ids[S_NCHUNK];
    size_t n;
    assert_int_equal(kvedge_e2e_chunks(m, s_fx.ctx, S_CTX, S_CHUNK, ids, S_NCHUNK, &n), KVEDGE_OK);
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    kvedge_fetched_t out[S_NCHUNK * 8];
    assert_non_null(buf);
    for (uint32_t l = 0; l < m->layers; l++) {
        uint32_t heads = 0;
        memset(out, 0, sizeof out);
        int rc = kvedge_client_get_layer(c, ids, S_NCHUNK, (uint16_t)l, buf, cap, out, S_NCHUNK * 8,
                                         &heads);
        blocks[l] = 0;
        for (size_t i = 0; rc == KVEDGE_OK && i < (size_t)S_NCHUNK * m->kv_heads; i++)
            blocks[l] += out[i].status == KVEDGE_OK && out[i].len > 0;
        printf("  %s layer %u: %s, %u blocks\n", m->id, l, kvedge_errname(rc), blocks[l]);
    }
    free(buf);
    kvedge_client_destroy(&c);
}

/* The pruned prefill stored layers 0, 1 and 3 only; the full one every layer; the bytes saved
 * are exactly what the full prefill stored more. LIST agrees. Bad sets are refused. */
static void test_prefill_stores_kept_layers(void **state)
{
    (void)state;
    const kvedge_e2e_prefill_stats_t *f = &s_fx.st_full, *p = &s_fx.st_pruned;
    const uint32_t per_layer = S_NCHUNK * s_fx.cc->heads;
    printf("  full: %llu blocks, %llu bytes; pruned: %llu blocks, %llu bytes, saved %llu blocks, "
           "%llu bytes\n",
           (unsigned long long)f->blocks, (unsigned long long)f->bytes,
           (unsigned long long)p->blocks, (unsigned long long)p->bytes,
           (unsigned long long)p->pruned_blocks, (unsigned long long)p->pruned_bytes);
    assert_int_equal(f->layers_put, 4);
    assert_int_equal(f->pruned_blocks, 0);
    assert_int_equal(f->pruned_bytes, 0);
    assert_int_equal(p->layers_put, 3);
    assert_int_equal(p->blocks, 3 * per_layer);
    assert_int_equal(p->pruned_blocks, per_layer);
    assert_int_equal(p->blocks + p->pruned_blocks, f->blocks);
    assert_int_equal(p->bytes + p->pruned_bytes, f->bytes);
    assert_int_equal(p->fp16_bytes + p->pruned_fp16_bytes, f->fp16_bytes);

    uint32_t blocks[4];
    s_count_layers(&s_fx.cloud_m, blocks);
    for (uint32_t l = 0; l < 4; l++)
        assert_int_equal(blocks[l], kvedge_prune_set_has(&s_fx.keep, l) ? per_layer : 0);
    s_count_layers(&s_fx.full_m, blocks);
    for (uint32_t l = 0; l < 4; l++)
        assert_int_equal(blocks[l], per_layer);

    kvedge_client_t *c = s_client(s_fx.w.nep);
    kvedge_chunk_entry_t *all = NULL;
    size_t n = 0, pruned_chunks = 0;
    assert_int_equal(kvedge_client_list_all(c, &all, &n), KVEDGE_OK);
    for (size_t i = 0; i < n; i++)
        if (strcmp(all[i].chunk.model_id, S_CLOUD_ID) == 0) {
            assert_int_equal(all[i].blocks, 3 * s_fx.cc->heads);
            pruned_chunks++;
        }
    assert_int_equal(pruned_chunks, S_NCHUNK);
    free(all);

    /* refused: a set of another layer count, an empty set */
    kvedge_prune_set_t other, empty;
    kvedge_prune_set_all(&other, 6);
    kvedge_prune_set_init(&empty, 4);
    kvedge_e2e_quant_t q;
    kvedge_chunk_id_t ids[S_NCHUNK];
    s_quant(&q, &other);
    assert_int_equal(kvedge_e2e_prefill(c, s_fx.cloud, &s_fx.nomap_m, s_fx.ctx, S_CTX, S_CHUNK, &q,
                                        ids, S_NCHUNK, NULL),
                     KVEDGE_EINVAL);
    s_quant(&q, &empty);
    assert_int_equal(kvedge_e2e_prefill(c, s_fx.cloud, &s_fx.nomap_m, s_fx.ctx, S_CTX, S_CHUNK, &q,
                                        ids, S_NCHUNK, NULL),
                     KVEDGE_EINVAL);
    kvedge_client_destroy(&c);
    uint32_t none[4];
    s_count_layers(&s_fx.nomap_m, none); /* nothing was put */
    for (uint32_t l = 0; l < 4; l++)
        assert_int_equal(none[l], 0);
}

/* ---------------------------------------------------------------- downstream */

static int s_e2e(kvedge_e2e_mode_t mode, kvedge_client_t *proxy, const kvedge_decoder_t *d,
                 const kvedge_model_t *model, const kvedge_model_t *mapped,
                 const kvedge_adapter_t *adapter, int32_t *tokens, float *logits,
                 kvedge_e2e_result_t *res)
{
    kvedge_e2e_request_t rq = {
        .mode = mode,
        .decoder = d,
        .ctx = s_fx.ctx,
        .ctx_len = S_CTX,
        .prompt = s_fx.prompt,
        .prompt_len = S_PROMPT,
        .max_new = S_NEW,
        .proxy = proxy,
        .model = model,
        .chunk_tokens = S_CHUNK,
        .deadline_ms = S_DEADLINE,
        .mapped_model = mapped,
        .adapter = adapter,
        .logits = logits,
    };
    return kvedge_e2e_decode(&rq, tokens, res);
}

/* A FETCH of the pruned cloud model itself: layer 2 is a miss (the node lacks it; no
 * directory tells the proxy so, it learns it from the node's answer), the client computes it,
 * and the tokens are edge-only's. */
static void test_cloud_fetch_of_pruned_layer_is_a_miss(void **state)
{
    (void)state;
    kvedge_client_t *c = s_client(s_fx.w.pep);
    kvedge_e2e_result_t *r = calloc(1, sizeof *r);
    float *got = malloc(S_VOCAB * sizeof(float)), *want = malloc(S_VOCAB * sizeof(float));
    assert_true(r && got && want);
    int32_t tok[S_NEW], local[S_NEW];
    int rc = s_e2e(KVEDGE_E2E_KVEDGE, c, s_fx.cloud, &s_fx.cloud_m, NULL, NULL, tok, got, r);
    if (rc != KVEDGE_OK)
        fail_msg("decode of the pruned model: %s", kvedge_strerror(rc));
    kvedge_e2e_print(stdout, r, false);
    assert_int_equal(r->layers, 4);
    assert_true(r->layer[2].computed);
    assert_int_equal(r->layer[2].reason, KVEDGE_FETCH_MISS);
    assert_false(r->layer[0].computed); /* below the miss: fetched */
    assert_false(r->layer[1].computed);
    assert_true(r->computed >= 1);
    assert_int_equal(r->fetched + r->computed, 4);
    assert_int_equal(s_e2e(KVEDGE_E2E_LOCAL, NULL, s_fx.cloud, NULL, NULL, NULL, local, want, r),
                     KVEDGE_OK);
    assert_memory_equal(tok, local, sizeof tok);
    float maxd = 0;
    for (int i = 0; i < S_VOCAB; i++)
        maxd = fmaxf(maxd, fabsf(got[i] - want[i]));
    printf("  logits: max |pruned - edge-only| = %g\n", (double)maxd);
    assert_true(maxd < 1e-4f);
    free(got);
    free(want);
    free(r);
    kvedge_client_destroy(&c);
}

/* The edge model's MAPPED request on the pruned context gets its mapped layers 0, 1 and 3
 * and generates the same tokens, with the same logits, as on the unpruned one. */
static void test_mapped_request_unchanged(void **state)
{
    (void)state;
    kvedge_client_t *c = s_client(s_fx.w.pep);
    kvedge_e2e_result_t *r = calloc(1, sizeof *r), *rf = calloc(1, sizeof *rf);
    float *got = malloc(S_VOCAB * sizeof(float)), *want = malloc(S_VOCAB * sizeof(float));
    assert_true(r && rf && got && want);
    int32_t tok[S_NEW], full[S_NEW];
    int rc = s_e2e(KVEDGE_E2E_KVEDGE, c, s_fx.edge, &s_fx.edge_m, &s_fx.cloud_m, s_fx.adapter, tok,
                   got, r);
    if (rc != KVEDGE_OK)
        fail_msg("mapped decode on the pruned context: %s", kvedge_strerror(rc));
    rc = s_e2e(KVEDGE_E2E_KVEDGE, c, s_fx.edge, &s_fx.edge_m, &s_fx.full_m, s_fx.adapter_full, full,
               want, rf);
    if (rc != KVEDGE_OK)
        fail_msg("mapped decode on the full context: %s", kvedge_strerror(rc));
    kvedge_e2e_print(stdout, r, false);
    for (const kvedge_e2e_result_t *x = r; x; x = x == r ? rf : NULL) {
        assert_true(x->large_small);
        assert_int_equal(x->adapted, 3);
        assert_int_equal(x->computed, 0);
        for (uint32_t e = 0; e < 3; e++)
            assert_int_equal(x->layer[e].from_layer, s_from[e]);
    }
    assert_memory_equal(tok, full, sizeof tok);
    assert_memory_equal(got, want, S_VOCAB * sizeof(float));
    printf("  TTFT pruned %.2f ms, full %.2f ms; received %llu and %llu bytes\n", r->ttft_us / 1e3,
           rf->ttft_us / 1e3, (unsigned long long)r->received_bytes,
           (unsigned long long)rf->received_bytes);
    free(got);
    free(want);
    free(r);
    free(rf);
    kvedge_client_destroy(&c);
}

/* ---------------------------------------------------------------- the command */

/* Runs `kvedge ARGS` with output to a file; returns the exit code and the output in text. */
static int s_run(const char *args, char *text, size_t cap)
{
    char out[160], cmd[16384];
    snprintf(out, sizeof out, "%s/cmd.txt", s_fx.root);
    snprintf(cmd, sizeof cmd, "%s %s > %s 2>&1", KVEDGE_BIN, args, out);
    int rc = system(cmd);
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, cap - 1, f);
    text[n] = '\0';
    fclose(f);
    assert_true(WIFEXITED(rc));
    return WEXITSTATUS(rc);
}

static void s_cli_expect(const char *base, const char *extra, int code, const char *part)
{
    char args[8192], text[8192];
    snprintf(args, sizeof args, "%s %s", base, extra);
    int ex = s_run(args, text, sizeof text);
    printf("  [%s] exit %d: %s", extra, ex, text);
    if (ex != code)
        fail_msg("kvedge prefill %s: exit %d, not %d:\n%s", extra, ex, code, text);
    if (part && !strstr(text, part))
        fail_msg("kvedge prefill %s: no '%s' in:\n%s", extra, part, text);
}

static void test_cli(void **state)
{
    (void)state;
    char ctx[S_CTX * 8], base[4096], master[600];
    size_t k = 0;
    for (uint32_t i = 0; i < S_CTX; i++)
        k += (size_t)snprintf(ctx + k, sizeof ctx - k, "%s%d", i ? "," : "", s_fx.ctx[i]);
    snprintf(base, sizeof base,
             "-H %s prefill --weights %s --context-ids %s --chunk-tokens %d --scheme lossless "
             "--dtype fp32",
             s_fx.w.nep, s_fx.cloud_w, ctx, S_CHUNK);
    snprintf(master, sizeof master, "--master %s --master-pub %s", s_fx.w.mep, s_fx.w.mpub);
    char extra[1024];

    /* --layers: what was kept, and the bytes saved (the same as the library's) */
    char saved[64];
    snprintf(saved, sizeof saved, "layers: kept 0,3 of 4 (--layers), pruned 2: saved ");
    s_cli_expect(base, "--model-id pr-cli --layers 3,0", 0, saved);
    s_cli_expect(base, "--model-id pr-cli --layers 3,0 --json", 0, "\"layers\":[0,3]");
    snprintf(saved, sizeof saved, "\"pruned_bytes\":%llu,",
             (unsigned long long)s_fx.st_pruned.pruned_bytes);
    s_cli_expect(base, "--model-id pr-cli --layers 0,1,3 --json", 0, saved);

    /* --mapped-only: the union of the two maps naming pr-cloud */
    snprintf(extra, sizeof extra, "--model-id %s --mapped-only %s", S_CLOUD_ID, master);
    s_cli_expect(base, extra, 0, "layers: kept 0,1,3 of 4 (mapped), pruned 1");
    s_cli_expect(base, extra, 0, "maps: 2 naming pr-cloud (edge models pr-edge,pr-edge2)");
    /* no map names pr-nomap: refused, nothing computed or stored */
    snprintf(extra, sizeof extra, "--model-id %s --mapped-only %s", S_NOMAP_ID, master);
    s_cli_expect(base, extra, 3, "no edge model maps pr-nomap: pruning would drop every layer");
    uint32_t none[4];
    s_count_layers(&s_fx.nomap_m, none);
    for (uint32_t l = 0; l < 4; l++)
        assert_int_equal(none[l], 0);

    /* bad --layers, before anything is loaded or stored */
    s_cli_expect(base, "--model-id pr-cli --layers ''", 2, "empty list");
    s_cli_expect(base, "--model-id pr-cli --layers 0,,1", 2, "empty item");
    s_cli_expect(base, "--model-id pr-cli --layers 0,4", 2,
                 "layer 4 is out of range: the model has layers 0..3");
    s_cli_expect(base, "--model-id pr-cli --layers 0,5000", 2,
                 "layer 5000 is out of range: the model has layers 0..3");
    s_cli_expect(base, "--model-id pr-cli --layers 1,1", 2, "layer 1 is listed twice");
    s_cli_expect(base, "--model-id pr-cli --layers junk", 2, "'j' at byte 0");
    s_cli_expect(base, "--model-id pr-cli --layers 0-2", 2, "'-' at byte 1");
    /* usage */
    snprintf(extra, sizeof extra, "--model-id %s --mapped-only", S_CLOUD_ID);
    s_cli_expect(base, extra, 2, "--mapped-only needs --master EP");
    snprintf(extra, sizeof extra, "--model-id %s --layers 0 %s", S_CLOUD_ID, master);
    s_cli_expect(base, extra, 2, "--mapped-only needs --master EP");
    snprintf(extra, sizeof extra, "--model-id %s --layers 0 --mapped-only %s", S_CLOUD_ID, master);
    s_cli_expect(base, extra, 2, "give --layers LIST or --mapped-only, not both");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_and_parse),
        cmocka_unit_test(test_union),
        cmocka_unit_test(test_from_view),
        cmocka_unit_test(test_prefill_stores_kept_layers),
        cmocka_unit_test(test_cloud_fetch_of_pruned_layer_is_a_miss),
        cmocka_unit_test(test_mapped_request_unchanged),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
