/* Large-small through the edge proxy: a MAPPED FETCH of an edge model served from the layers
 * of a cloud model that a layer map registered with the Storage Master names (edge 0 -> 0,
 * 1 -> none, 2 -> 3); the cloud's blocks arrive under the edge layer with the cloud's heads and
 * from_layer; a peer holding the edge model's own layer serves it exactly; without a map, or
 * with a map the registry's models disagree with, the request is planned as without MAPPED
 * and still completes (and says so in the log, once); malformed MAPPED requests are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "access/frame.h"
#include "runtime/kvmsg.h"
#include "runtime/log.h"
#include "runtime/mview.h"
#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "store/engine/engine.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "access/codec/synth.h"
#include "tests/common/logcap.h"
#include "tests/common/testutil.h"

#define S_CLOUD     "ls-cloud" /* 4 layers x 6 heads x 32 */
#define S_EDGE      "ls-edge"  /* 3 layers x 4 heads x 32 */
#define S_CL_LAYERS 4
#define S_CL_HEADS  6
#define S_ED_LAYERS 3
#define S_ED_HEADS  4
#define S_DIM       32
#define S_CHUNKS    2
#define S_TOKENS    64 /* per chunk */
#define S_MAXH      S_CL_HEADS

/* ---------------------------------------------------------------- the context */

typedef struct {
    kvedge_chunk_id_t ids[S_CHUNKS];
    uint32_t layers, heads;
    uint8_t *block[S_CL_LAYERS][S_CHUNKS][S_MAXH];
    size_t len[S_CL_LAYERS][S_CHUNKS][S_MAXH];
} s_ctx_t;

static s_ctx_t s_cloud, s_edge; /* the same tokens under each model's chain */

static void s_make(s_ctx_t *x, const char *model, uint32_t layers, uint32_t heads, uint64_t seed)
{
    uint32_t tok[S_CHUNKS * S_TOKENS];
    for (uint32_t i = 0; i < S_CHUNKS * S_TOKENS; i++)
        tok[i] = 7 * i + 5;
    assert_int_equal(
        kvedge_chunk_chain(NULL, 0, model, tok, S_CHUNKS * S_TOKENS, S_TOKENS, x->ids, S_CHUNKS),
        S_CHUNKS);
    x->layers = layers;
    x->heads = heads;
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, S_TOKENS, S_DIM, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    static uint16_t k[S_TOKENS * S_DIM], v[S_TOKENS * S_DIM];
    for (uint32_t l = 0; l < layers; l++)
        for (uint32_t c = 0; c < S_CHUNKS; c++)
            for (uint32_t h = 0; h < heads; h++) {
                x->block[l][c][h] = malloc(cap);
                assert_int_equal(kvedge_synth_head(seed + l * 1000 + c * 100 + h, 0, S_TOKENS,
                                                   S_DIM, KVEDGE_DTYPE_FP16, k, v),
                                 0);
                assert_int_equal(
                    kvedge_block_encode(&spec, k, v, x->block[l][c][h], cap, &x->len[l][c][h]), 0);
            }
}

static void s_free(s_ctx_t *x)
{
    for (uint32_t l = 0; l < x->layers; l++)
        for (uint32_t c = 0; c < S_CHUNKS; c++)
            for (uint32_t h = 0; h < x->heads; h++)
                free(x->block[l][c][h]);
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

/* Puts layer l of the context x (model id) to the node at ep. */
static void s_put(const char *ep, const s_ctx_t *x, const char *model, uint32_t l)
{
    kvedge_client_t *c = s_client(ep, 10000);
    kvedge_put_item_t items[S_MAXH];
    for (uint32_t ci = 0; ci < S_CHUNKS; ci++) {
        for (uint32_t h = 0; h < x->heads; h++) {
            memset(&items[h], 0, sizeof items[h]);
            items[h].chunk.id = x->ids[ci];
            items[h].chunk.has_parent = ci > 0;
            if (ci > 0)
                items[h].chunk.parent = x->ids[ci - 1];
            snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, "%s", model);
            items[h].chunk.index = ci;
            items[h].chunk.tokens = S_TOKENS;
            items[h].layer = (uint16_t)l;
            items[h].head = (uint16_t)h;
            items[h].block = x->block[l][ci][h];
            items[h].len = x->len[l][ci][h];
        }
        assert_int_equal(kvedge_client_put(c, items, x->heads, NULL), 0);
    }
    kvedge_client_destroy(&c);
}

/* ---------------------------------------------------------------- daemons */

typedef struct {
    char dir[200], ep[250];
    kvedge_node_t *node;
} s_node_t;

static const kvedge_model_t s_cloud_model = {S_CLOUD, S_CL_LAYERS, S_CL_HEADS, S_DIM,
                                             KVEDGE_DTYPE_FP16};
static const kvedge_model_t s_edge_model = {S_EDGE, S_ED_LAYERS, S_ED_HEADS, S_DIM,
                                            KVEDGE_DTYPE_FP16};

/* How often a node joined to the master publishes its block directory: a lagging directory
 * (test_mapped_directory_lags) is one the node does not publish during the test. */
static uint32_t s_dir_interval_ms = 100;
/* How many of the cloud model's layers the topology puts on the cloud node at start. */
static uint32_t s_topo_layers = S_CL_LAYERS;

static void s_node_start(s_node_t *n, const char *root, const char *name, kvedge_role_t role,
                         const char *master, const char *pub)
{
    memset(n, 0, sizeof *n);
    snprintf(n->dir, sizeof n->dir, "%.120s/%.60s", root, name);
    snprintf(n->ep, sizeof n->ep, "ipc://%.200s.sock", n->dir);
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = role;
    ns.insecure = true;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s", n->dir);
    snprintf(ns.bind, sizeof ns.bind, "%s", n->ep);
    snprintf(ns.name, sizeof ns.name, "%s", name);
    if (master) { /* else: no directory in the master, the proxy assumes it holds anything */
        snprintf(ns.master, sizeof ns.master, "%s", master);
        snprintf(ns.master_pub, sizeof ns.master_pub, "%s", pub);
        snprintf(ns.node_id, sizeof ns.node_id, "%s", name);
        ns.dir_interval_ms = s_dir_interval_ms;
    }
    char why[256];
    if (kvedge_node_start(&ns, &n->node, why, sizeof why) != 0)
        fail_msg("start %s: %s", name, why);
    kvedge_engine_t *e = kvedge_node_engine(n->node);
    assert_int_equal(kvedge_engine_put_model(e, &s_cloud_model), 0);
    assert_int_equal(kvedge_engine_put_model(e, &s_edge_model), 0);
}

typedef struct {
    char root[64];
    kvedge_master_opts_t mo;
    char mdir[200], mep[250], mpub[250];
    kvedge_master_t *master;
    kvedge_mview_t *view; /* the test's own, to write records */
    s_node_t cloud, peer;
    char pep[250];
    kvedge_proxy_t *proxy;
} s_topo_t;

/* Writes a record into the master's registry through the test's view. */
static void s_set(s_topo_t *t, const char *key, const uint8_t *body, size_t len)
{
    assert_int_equal(kvedge_mview_set(t->view, key, body, len, 0), KVEDGE_OK);
}

static void s_set_model(s_topo_t *t, const kvedge_model_t *m)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_model_pack(m, body, &len), KVEDGE_OK);
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    assert_int_equal(
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_MODEL, m->id, NULL, key, sizeof key), 0);
    s_set(t, key, body, len);
}

static void s_set_map(s_topo_t *t, const kvedge_master_map_t *r)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_map_pack(r, body, &len), KVEDGE_OK);
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    assert_int_equal(
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_MAP, S_CLOUD, S_EDGE, key, sizeof key), 0);
    s_set(t, key, body, len);
}

/* The map edge 0 <- cloud 0, edge 1 <- none, edge 2 <- cloud 3, in map (the caller's) and in
 * the master. */
static void s_set_map_0_none_3(s_topo_t *t, kvedge_master_map_t *map)
{
    memset(map, 0, sizeof *map);
    map->cloud_layers = S_CL_LAYERS;
    map->edge_layers = S_ED_LAYERS;
    map->from[0] = 0;
    map->from[1] = KVEDGE_MASTER_MAP_NONE;
    map->from[2] = 3;
    s_set_map(t, map);
}

/* A master, a cloud node holding the cloud model's four layers, a peer edge node holding
 * nothing yet, both known to the proxy (cloud far, peer near) and, unless unlisted, registered
 * with the master; and the two models' records. Lagging: registered, but the cloud's puts are
 * not in the master's directory (the nodes publish it only every 10 minutes). */
static void s_topo_start_ex(s_topo_t *t, bool unlisted, bool lagging)
{
    memset(t, 0, sizeof *t);
    snprintf(t->root, sizeof t->root, "/tmp/kvedge-mapped-XXXXXX");
    assert_non_null(mkdtemp(t->root));
    kvedge_master_opts_default(&t->mo);
    snprintf(t->mdir, sizeof t->mdir, "%s/master", t->root);
    snprintf(t->mep, sizeof t->mep, "ipc://%s/m.sock", t->root);
    snprintf(t->mpub, sizeof t->mpub, "ipc://%s/mp.sock", t->root);
    t->mo.bind = t->mep;
    t->mo.pub = t->mpub;
    t->mo.data_dir = t->mdir;
    t->mo.insecure = true;
    assert_int_equal(kvedge_master_start(&t->mo, &t->master, NULL, 0), 0);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = t->mep;
    vo.pub = t->mpub;
    assert_int_equal(kvedge_mview_start(&vo, &t->view), 0);
    s_set_model(t, &s_cloud_model);
    s_set_model(t, &s_edge_model);

    const char *mep = unlisted ? NULL : t->mep, *mpub = unlisted ? NULL : t->mpub;
    s_dir_interval_ms = lagging ? 600000 : 100;
    s_node_start(&t->cloud, t->root, "cloud1", KVEDGE_ROLE_CLOUD, mep, mpub);
    s_node_start(&t->peer, t->root, "edgeA", KVEDGE_ROLE_EDGE, mep, mpub);
    s_dir_interval_ms = 100;
    for (uint32_t l = 0; l < s_topo_layers; l++)
        s_put(t->cloud.ep, &s_cloud, S_CLOUD, l);
    uint32_t changed;
    if (!unlisted && !lagging)
        assert_int_equal(kvedge_node_publish(t->cloud.node, &changed), 0);

    kvedge_proxy_source_t src[2];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s bw=12500000 rtt=40000", t->cloud.ep);
    assert_int_equal(kvedge_proxy_source_parse(spec, &src[0]), 0);
    snprintf(spec, sizeof spec, "peer edgeA %s bw=125000000 rtt=2000", t->peer.ep);
    assert_int_equal(kvedge_proxy_source_parse(spec, &src[1]), 0);
    snprintf(t->pep, sizeof t->pep, "ipc://%s/proxy.sock", t->root);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = t->pep;
    po.insecure = true;
    po.id = "proxy-ls";
    po.sources = src;
    po.nsources = unlisted ? 1 : 2; /* unlisted: only the cloud (the peer would "hold" all) */
    po.master = t->mep;
    po.master_pub = t->mpub;
    char why[256];
    if (kvedge_proxy_start(&po, &t->proxy, why, sizeof why) != 0)
        fail_msg("proxy: %s", why);
    assert_int_equal(kvedge_proxy_wait_sources(t->proxy, po.nsources, 5000), 0);
}

static void s_topo_start(s_topo_t *t)
{
    s_topo_start_ex(t, false, false);
}

static void s_topo_stop(s_topo_t *t)
{
    kvedge_proxy_destroy(&t->proxy);
    kvedge_node_destroy(&t->peer.node);
    kvedge_node_destroy(&t->cloud.node);
    kvedge_mview_destroy(&t->view);
    kvedge_master_destroy(&t->master);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->root);
    assert_int_equal(system(cmd), 0);
}

/* ---------------------------------------------------------------- fetching */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    bool planned;
    kvedge_fetch_plan_t plan;
    kvedge_fetch_layer_t layer[S_ED_LAYERS];
    char src[S_ED_LAYERS][64];
    uint32_t layers;
    uint32_t blocks[S_ED_LAYERS];
    uint32_t max_head[S_ED_LAYERS];
    uint32_t mismatches;
    /* What each edge layer's blocks must be: the cloud's layer from, or the edge's own. */
    int expect_from[S_ED_LAYERS];
} s_result_t;

static void s_r_plan(void *ctx, const kvedge_fetch_plan_t *p)
{
    s_result_t *r = ctx;
    r->plan = *p;
    r->planned = true;
}

/* Blocks are checked against the expected model's bytes, byte for byte. */
static void s_r_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source, int status,
                      const uint8_t *data, size_t len)
{
    (void)source;
    s_result_t *r = ctx;
    if (layer >= S_ED_LAYERS || status != 0 || ci >= S_CHUNKS) {
        r->mismatches++;
        return;
    }
    r->blocks[layer]++;
    if (head > r->max_head[layer])
        r->max_head[layer] = head;
    int from = r->expect_from[layer];
    const s_ctx_t *x = from >= 0 ? &s_cloud : &s_edge;
    uint32_t l = from >= 0 ? (uint32_t)from : layer;
    if (head >= x->heads || len != x->len[l][ci][head] || memcmp(data, x->block[l][ci][head], len))
        r->mismatches++;
}

static void s_r_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_result_t *r = ctx;
    if (l->layer < S_ED_LAYERS) {
        r->layer[l->layer] = *l;
        snprintf(r->src[l->layer], sizeof r->src[l->layer], "%s", l->source_name);
    }
    r->layers++;
}

static void s_r_done(void *ctx, int status)
{
    s_result_t *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->status = status;
    r->done = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* When set, FETCHes carry the decoder's times too (compute cheap, recompute dear, so the plan
 * is the same): the request then has its most frames, spec, ids, times and mapped frame. */
static bool s_with_times;

/* A MAPPED FETCH of the edge model's layers [first, first + n) with the cloud model as the
 * mapped one; expect_from says which blocks each layer must carry (-1: the edge's own). */
static void s_fetch_range(const char *ep, s_result_t *r, const int expect_from[S_ED_LAYERS],
                          uint16_t first, uint16_t n)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    memcpy(r->expect_from, expect_from, sizeof r->expect_from);
    kvedge_client_t *c = s_client(ep, 10000);
    float compute[S_ED_LAYERS], recompute[S_ED_LAYERS];
    for (uint32_t l = 0; l < S_ED_LAYERS; l++) {
        compute[l] = 100.0f;
        recompute[l] = 1e9f;
    }
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_EDGE,
                              .chunks = s_edge.ids,
                              .n = S_CHUNKS,
                              .first_layer = first,
                              .layers = n,
                              .tokens = S_CHUNKS * S_TOKENS,
                              .compute_us = s_with_times ? compute : NULL,
                              .recompute_us = s_with_times ? recompute : NULL,
                              .deadline_ms = 8000,
                              .mapped_model_id = S_CLOUD,
                              .mapped_chunks = s_cloud.ids};
    kvedge_fetch_cbs_t cbs = {s_r_plan, s_r_block, s_r_layer, s_r_done};
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, r), 0);
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    kvedge_client_destroy(&c);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

/* A plain FETCH (no MAPPED frame) of the cloud model's layers [0, S_ED_LAYERS): each layer's
 * blocks must be the cloud's own. */
static void s_fetch_cloud(const char *ep, s_result_t *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    for (uint32_t l = 0; l < S_ED_LAYERS; l++)
        r->expect_from[l] = (int)l;
    kvedge_client_t *c = s_client(ep, 10000);
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_CLOUD,
                              .chunks = s_cloud.ids,
                              .n = S_CHUNKS,
                              .layers = S_ED_LAYERS,
                              .tokens = S_CHUNKS * S_TOKENS,
                              .deadline_ms = 8000};
    kvedge_fetch_cbs_t cbs = {s_r_plan, s_r_block, s_r_layer, s_r_done};
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, r), 0);
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    kvedge_client_destroy(&c);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

static void s_fetch(const char *ep, s_result_t *r, const int expect_from[S_ED_LAYERS])
{
    s_fetch_range(ep, r, expect_from, 0, S_ED_LAYERS);
}

/* Every layer planned and reported as without a map: the cloud holds no edge layer and the
 * peer nothing, so every one is a miss, own, and the request completes. */
static void s_check_all_missed(const s_result_t *r)
{
    assert_int_equal(r->status, 0);
    assert_true(r->planned);
    assert_int_equal(r->layers, S_ED_LAYERS);
    for (uint32_t l = 0; l < S_ED_LAYERS; l++) {
        assert_int_equal(r->plan.layer[l].source, -1);
        assert_int_equal(r->plan.layer[l].from_layer, -1);
        assert_int_equal(r->layer[l].status, KVEDGE_ENOTFOUND);
        assert_int_equal(r->layer[l].reason, KVEDGE_FETCH_MISS);
        assert_int_equal(r->layer[l].from_layer, -1);
        assert_int_equal(r->blocks[l], 0);
    }
}

/* ---------------------------------------------------------------- tests */

/* Layer l was planned and delivered from the cloud as the cloud's layer from: its heads;
 * priced (Eq. 19) at that layer's fp16 bytes while the proxy has not yet learned what the
 * cloud sends per fp16 byte (first_seen). */
static void s_check_mapped(const s_result_t *r, uint32_t l, int from, bool first_seen)
{
    assert_int_equal(r->plan.layer[l].from_layer, from);
    assert_int_equal(r->layer[l].from_layer, from);
    assert_string_equal(r->src[l], "cloud1");
    assert_int_equal(r->layer[l].status, 0);
    assert_int_equal(r->layer[l].reason, KVEDGE_FETCH_PLANNED);
    assert_int_equal(r->layer[l].blocks, S_CHUNKS * S_CL_HEADS);
    assert_int_equal(r->blocks[l], S_CHUNKS * S_CL_HEADS);
    assert_int_equal(r->max_head[l], S_CL_HEADS - 1);
    int s = r->plan.layer[l].source;
    assert_true(s >= 0);
    assert_string_equal(r->plan.source[s].name, "cloud1");
    if (!first_seen)
        return;
    double bytes = (double)S_CHUNKS * S_TOKENS * S_CL_HEADS * S_DIM * 2 * 2;
    double want = r->plan.source[s].rtt_us + bytes * 1e6 / r->plan.source[s].bw_bytes_per_s;
    assert_true(r->plan.layer[l].cost_us >= want * (1 - 1e-6) &&
                r->plan.layer[l].cost_us <= want * (1 + 1e-6));
}

static const int s_none[S_ED_LAYERS] = {-1, -1, -1};

static void test_mapped_fetch(void **state)
{
    (void)state;
    kt_log_t log = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kvedge_log_set_sink(kt_log_sink, &log);
    s_topo_t *t = calloc(1, sizeof *t);
    s_result_t *r = calloc(1, sizeof *r);
    kvedge_master_map_t *map = calloc(1, sizeof *map);
    assert_non_null(t);
    assert_non_null(r);
    assert_non_null(map);
    s_topo_start(t);

    /* The proxy knows both models once its view has the records. */
    kt_wait_for((s_fetch(t->pep, r, s_none), r->status != KVEDGE_ENOMODEL), KT_WAIT_MS);
    /* 1. No map registered: planned as today, said once (rate-limited) however often. */
    s_check_all_missed(r);
    s_fetch(t->pep, r, s_none);
    s_check_all_missed(r);
    assert_int_equal(kt_log_count(&log, "MAPPED " S_CLOUD, "no usable layer map",
                                  "no map/" S_CLOUD "/" S_EDGE, NULL),
                     1);

    /* 2. A map whose edge layer count is not the edge model's: the accessor refuses it (and
     * logs why); the request completes as without a map. */
    memset(map, 0, sizeof *map);
    map->cloud_layers = S_CL_LAYERS;
    map->edge_layers = S_ED_LAYERS - 1;
    map->from[0] = 0;
    map->from[1] = KVEDGE_MASTER_MAP_NONE;
    s_set_map(t, map);
    kt_wait_for((s_fetch(t->pep, r, s_none), s_check_all_missed(r),
                 kt_log_count(&log, "ignoring layer map map/" S_CLOUD "/" S_EDGE, NULL) > 0),
                KT_WAIT_MS);
    assert_int_equal(kt_log_count(&log, "ignoring layer map map/" S_CLOUD "/" S_EDGE,
                                  "it has 2 edge layers, model " S_EDGE " has 3", NULL),
                     1);

    /* 3. The map edge 0 -> 0, 1 -> none, 2 -> 3, with only the cloud holding anything, and
     * the decoder's times in the request: layer 2 comes from the cloud as the cloud's layer 3
     * (six heads, from_layer 3); layer 1 is a miss, and so layer 0 is not fetched: the client
     * must run the context through layer 0 to compute layer 1 (R(l), proxy/plan.h), so
     * computing layer 0 costs nothing more and the plan recomputes it. */
    map->edge_layers = S_ED_LAYERS;
    map->from[2] = 3;
    s_set_map(t, map);
    const int only_cloud[S_ED_LAYERS] = {-1, -1, 3};
    s_with_times = true;
    kt_wait_for((s_fetch(t->pep, r, only_cloud), r->plan.layer[2].from_layer == 3), KT_WAIT_MS);
    s_with_times = false;
    assert_int_equal(r->status, 0);
    assert_int_equal(r->layers, S_ED_LAYERS);
    assert_int_equal(r->mismatches, 0);
    for (uint32_t l = 0; l < 2; l++) {
        assert_int_equal(r->plan.layer[l].source, -1);
        assert_int_equal(r->plan.layer[l].from_layer, -1);
        assert_int_equal(r->layer[l].status, KVEDGE_ENOTFOUND);
        assert_int_equal(r->layer[l].from_layer, -1);
        assert_int_equal(r->blocks[l], 0);
    }
    assert_int_equal(r->layer[1].reason, KVEDGE_FETCH_MISS);
    s_check_mapped(r, 2, 3, true);
    kvedge_proxy_stats_t st;
    kvedge_proxy_stats(t->proxy, &st);
    assert_int_equal(st.mapped_layers, 1);

    /* 3b. The same without times (fetch only): the request allows no recomputation, so
     * layer 0, which the cloud serves as its layer 0, is fetched; layer 1 is a miss. */
    const int fetch_only[S_ED_LAYERS] = {0, -1, 3};
    s_fetch(t->pep, r, fetch_only);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->mismatches, 0);
    s_check_mapped(r, 0, 0, false);
    assert_int_equal(r->layer[1].status, KVEDGE_ENOTFOUND);
    assert_int_equal(r->layer[1].reason, KVEDGE_FETCH_MISS);
    s_check_mapped(r, 2, 3, false);
    kvedge_proxy_stats(t->proxy, &st);
    assert_int_equal(st.mapped_layers, 3);

    /* 4. The peer computed the edge model's own layer 1: it serves it exactly (four heads,
     * from_layer -1); the mapped layers still come from the cloud. */
    s_put(t->peer.ep, &s_edge, S_EDGE, 1);
    uint32_t changed;
    assert_int_equal(kvedge_node_publish(t->peer.node, &changed), 0);
    const int with_peer[S_ED_LAYERS] = {0, -1, 3};
    kt_wait_for((s_fetch(t->pep, r, with_peer), r->layer[1].status == 0), KT_WAIT_MS);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->mismatches, 0);
    assert_int_equal(r->layer[1].status, 0);
    assert_string_equal(r->src[1], "edgeA");
    assert_int_equal(r->layer[1].from_layer, -1);
    assert_int_equal(r->plan.layer[1].from_layer, -1);
    assert_int_equal(r->blocks[1], S_CHUNKS * S_ED_HEADS);
    assert_int_equal(r->max_head[1], S_ED_HEADS - 1);
    s_check_mapped(r, 0, 0, false);
    s_check_mapped(r, 2, 3, false);
    kvedge_proxy_stats(t->proxy, &st);
    assert_true(st.mapped_layers >= 3);

    /* 4b. The same with the decoder's times in the request (four payload frames). */
    s_with_times = true;
    s_fetch(t->pep, r, with_peer);
    s_with_times = false;
    assert_int_equal(r->status, 0);
    assert_int_equal(r->mismatches, 0);
    assert_int_equal(r->layer[1].status, 0);
    assert_int_equal(r->layer[1].from_layer, -1);
    s_check_mapped(r, 0, 0, false);
    s_check_mapped(r, 2, 3, false);

    /* 5. A request without MAPPED is unchanged: no layer of another model in it. */
    kvedge_client_t *c = s_client(t->pep, 5000);
    s_result_t *plain = calloc(1, sizeof *plain);
    assert_non_null(plain);
    pthread_mutex_init(&plain->mu, NULL);
    pthread_cond_init(&plain->cv, NULL);
    memcpy(plain->expect_from, s_none, sizeof plain->expect_from);
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_EDGE,
                              .chunks = s_edge.ids,
                              .n = S_CHUNKS,
                              .layers = S_ED_LAYERS,
                              .deadline_ms = 5000};
    kvedge_fetch_cbs_t cbs = {s_r_plan, s_r_block, s_r_layer, s_r_done};
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, plain), 0);
    pthread_mutex_lock(&plain->mu);
    while (!plain->done)
        pthread_cond_wait(&plain->cv, &plain->mu);
    pthread_mutex_unlock(&plain->mu);
    assert_int_equal(plain->status, 0);
    assert_int_equal(plain->mismatches, 0);
    for (uint32_t l = 0; l < S_ED_LAYERS; l++) {
        assert_int_equal(plain->layer[l].from_layer, -1);
        assert_int_equal(plain->plan.layer[l].from_layer, -1);
        assert_int_equal(plain->layer[l].status, l == 1 ? 0 : KVEDGE_ENOTFOUND);
    }
    /* The client refuses what the wire cannot say. */
    req.mapped_model_id = S_CLOUD; /* without its chain */
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, plain), KVEDGE_EINVAL);
    req.mapped_chunks = s_cloud.ids;
    req.mapped_model_id = S_EDGE; /* the model itself */
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, plain), KVEDGE_EINVAL);
    kvedge_client_destroy(&c);
    pthread_mutex_destroy(&plain->mu);
    pthread_cond_destroy(&plain->cv);
    free(plain);

    s_topo_stop(t);
    kvedge_log_set_sink(NULL, NULL);
    kt_log_clear(&log);
    free(map);
    free(r);
    free(t);
}

/* Fallback and the negative cache work for mapped layers: the cloud node is not in the
 * master's directory, so the proxy assumes it holds the edge model's own layer 2 and asks for
 * it; the cloud has no such layer, and the same source is asked next for the mapped layer
 * (cloud layer 3), delivered with reason fallback:missing. The next request remembers the
 * miss (negative cache) and plans the mapped layer at once. */
static void test_mapped_fallback(void **state)
{
    (void)state;
    s_topo_t *t = calloc(1, sizeof *t);
    s_result_t *r = calloc(1, sizeof *r);
    kvedge_master_map_t *map = calloc(1, sizeof *map);
    assert_non_null(t);
    assert_non_null(r);
    assert_non_null(map);
    s_topo_start_ex(t, true, false);
    s_set_map_0_none_3(t, map);
    /* One request only once the proxy's view has the map: a request planned before it would
     * leave the miss of the edge model's own layer 2 in the negative cache, and the next one
     * would plan the mapped layer at once instead of falling back. */
    assert_int_equal(kvedge_proxy_wait_view(t->proxy, kvedge_master_seq(t->master), KT_WAIT_MS), 0);
    const int from3[S_ED_LAYERS] = {-1, -1, 3};
    s_fetch_range(t->pep, r, from3, 2, 1);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->mismatches, 0);
    assert_int_equal(r->layers, 1);
    assert_int_equal(r->plan.layer[0].from_layer, -1); /* planned: its own layer */
    assert_int_equal(r->layer[2].status, 0);
    assert_int_equal(r->layer[2].reason, KVEDGE_FETCH_FALLBACK_MISSING);
    assert_int_equal(r->layer[2].from_layer, 3);
    assert_int_equal(r->layer[2].attempts, 2);
    assert_string_equal(r->src[2], "cloud1");
    assert_int_equal(r->blocks[2], S_CHUNKS * S_CL_HEADS);
    /* Remembered: planned mapped at once. */
    s_fetch_range(t->pep, r, from3, 2, 1);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->mismatches, 0);
    assert_int_equal(r->plan.layer[0].from_layer, 3);
    assert_int_equal(r->layer[2].reason, KVEDGE_FETCH_PLANNED);
    assert_int_equal(r->layer[2].from_layer, 3);
    assert_int_equal(r->layer[2].attempts, 1);
    s_topo_stop(t);
    free(map);
    free(r);
    free(t);
}

/* Sends one raw FETCH; returns the status of the first answer. */
static int s_raw_fetch(const char *ep, uint32_t flags, size_t mapped_len, bool mapped_frame)
{
    zsock_t *raw = zsock_new_dealer(ep);
    assert_non_null(raw);
    zsock_set_linger(raw, 0);
    zsock_set_rcvtimeo(raw, 3000);
    uint8_t sb[KVEDGE_WIRE_FETCH_SPEC_BYTES], hb[KVEDGE_WIRE_HEADER_BYTES];
    memset(sb, 0, sizeof sb);
    kvedge_wire_fetch_spec_t fs = {.layers = S_ED_LAYERS, .tokens = S_CHUNKS * S_TOKENS};
    snprintf(fs.model_id, sizeof fs.model_id, S_EDGE);
    assert_int_equal(kvedge_wire_fetch_spec_pack(&fs, sb), 0);
    kvedge_le_put32(sb + 132, flags); /* whatever the packer would refuse */
    kvedge_wire_header_t h = {1, KVEDGE_OP_FETCH, 0, 9, 0, S_CHUNKS, 8, 3000};
    kvedge_wire_header_pack(&h, hb);
    uint8_t mf[KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES + (S_CHUNKS + 1) * KVEDGE_CHUNK_ID_BYTES];
    memset(mf, 0, sizeof mf);
    assert_int_equal(kvedge_wire_fetch_mapped_pack(S_CLOUD, mf), 0);
    memcpy(mf + KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES, s_cloud.ids, sizeof s_cloud.ids);
    assert_true(mapped_len <= sizeof mf);
    zmsg_t *m = zmsg_new();
    zmsg_addmem(m, hb, sizeof hb);
    zmsg_addmem(m, sb, sizeof sb);
    zmsg_addmem(m, s_edge.ids, sizeof s_edge.ids);
    if (mapped_frame)
        zmsg_addmem(m, mf, mapped_len);
    assert_int_equal(zmsg_send(&m, raw), 0);
    zmsg_t *ans = zmsg_recv(raw);
    assert_non_null(ans);
    zframe_t *hf = zmsg_first(ans);
    assert_int_equal(kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h), 0);
    assert_int_equal(h.request_id, 9);
    zmsg_destroy(&ans);
    zsock_destroy(&raw);
    return h.status;
}

/* A MAPPED FETCH right after the cloud model's context was stored, before the node's next
 * directory pass: the directory lists no holder of the cloud model's chain (nor of the edge
 * model's), so the proxy asks the registered nodes (LOOKUP) for both chains, learns that the
 * cloud holds the mapped one whole and plans the mapped layers there, as with the directory;
 * the edge layer the map gives no cloud layer is a miss. */
static void test_mapped_directory_lags(void **state)
{
    (void)state;
    s_topo_t *t = calloc(1, sizeof *t);
    s_result_t *r = calloc(1, sizeof *r);
    kvedge_master_map_t *map = calloc(1, sizeof *map);
    assert_non_null(t);
    assert_non_null(r);
    assert_non_null(map);
    s_topo_start_ex(t, false, true);
    s_set_map_0_none_3(t, map);
    /* Until the proxy's view has the map and both nodes' registrations (the LOOKUP goes only
     * to registered nodes the directory says nothing of). */
    const int fetch_only[S_ED_LAYERS] = {0, -1, 3};
    kt_wait_for((s_fetch(t->pep, r, fetch_only), r->plan.layer[2].from_layer == 3), KT_WAIT_MS);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->layers, S_ED_LAYERS);
    assert_int_equal(r->mismatches, 0);
    s_check_mapped(r, 0, 0, false);
    assert_int_equal(r->layer[1].status, KVEDGE_ENOTFOUND);
    assert_int_equal(r->layer[1].reason, KVEDGE_FETCH_MISS);
    s_check_mapped(r, 2, 3, false);
    /* The directory still lists nothing of the cloud: every answer came from the LOOKUPs. */
    kvedge_master_dir_t d;
    assert_int_not_equal(kvedge_mview_dir(t->view, "cloud1", &s_cloud.ids[0], &d), KVEDGE_OK);
    s_topo_stop(t);
    free(map);
    free(r);
    free(t);
}

/* The directory lists the cloud's chunks with the layers stored when the node published it
 * (a pass during a prefill), and the node holds every layer now: a FETCH wanting a layer the
 * record lacks asks the node (LOOKUP) instead of reporting the layer missing, and every layer
 * comes from the cloud. */
static void test_directory_lists_part_of_a_context(void **state)
{
    (void)state;
    s_topo_t *t = calloc(1, sizeof *t);
    s_result_t *r = calloc(1, sizeof *r);
    assert_non_null(t);
    assert_non_null(r);
    s_topo_layers = 2;
    s_topo_start_ex(t, false, true);
    s_topo_layers = S_CL_LAYERS;
    uint32_t changed;
    assert_int_equal(kvedge_node_publish(t->cloud.node, &changed), 0); /* layers 0 and 1 */
    for (uint32_t l = 2; l < S_CL_LAYERS; l++)
        s_put(t->cloud.ep, &s_cloud, S_CLOUD, l);
    /* The record of layers 0 and 1 in the master, then in the proxy's view. */
    kvedge_master_dir_t d;
    kt_wait_for(kvedge_mview_dir(t->view, "cloud1", &s_cloud.ids[S_CHUNKS - 1], &d) == KVEDGE_OK,
                KT_WAIT_MS);
    assert_true(kvedge_master_dir_has(&d, 1));
    assert_false(kvedge_master_dir_has(&d, 2));
    assert_int_equal(kvedge_proxy_wait_view(t->proxy, kvedge_master_seq(t->master), KT_WAIT_MS), 0);
    s_fetch_cloud(t->pep, r);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->layers, S_ED_LAYERS);
    assert_int_equal(r->mismatches, 0);
    for (uint32_t l = 0; l < S_ED_LAYERS; l++) {
        assert_int_equal(r->layer[l].status, 0);
        assert_int_equal(r->layer[l].reason, KVEDGE_FETCH_PLANNED);
        assert_int_equal(r->layer[l].from_layer, -1);
        assert_string_equal(r->src[l], "cloud1");
        assert_int_equal(r->blocks[l], S_CHUNKS * S_CL_HEADS);
    }
    s_topo_stop(t);
    free(r);
    free(t);
}

/* Malformed MAPPED requests are refused with EPROTO, and the proxy keeps serving. */
static void test_mapped_refused(void **state)
{
    (void)state;
    s_topo_t *t = calloc(1, sizeof *t);
    assert_non_null(t);
    s_topo_start(t);
    size_t good = KVEDGE_WIRE_FETCH_MAPPED_HDR_BYTES + S_CHUNKS * KVEDGE_CHUNK_ID_BYTES;
    assert_int_equal(s_raw_fetch(t->pep, 0x2, good, false), KVEDGE_EPROTO); /* unknown bit */
    assert_int_equal(s_raw_fetch(t->pep, 0x3, good, true), KVEDGE_EPROTO);
    assert_int_equal(s_raw_fetch(t->pep, 0x80000000u, good, false), KVEDGE_EPROTO);
    assert_int_equal(s_raw_fetch(t->pep, 0x1, good, false), KVEDGE_EPROTO); /* no mapped frame */
    assert_int_equal(s_raw_fetch(t->pep, 0x1, good - 1, true), KVEDGE_EPROTO);
    assert_int_equal(s_raw_fetch(t->pep, 0x1, good + KVEDGE_CHUNK_ID_BYTES, true), KVEDGE_EPROTO);
    assert_int_equal(s_raw_fetch(t->pep, 0x0, good, true), KVEDGE_EPROTO); /* one too many */
    /* Well-formed, it is served (the first answer is the plan: status 0). */
    int rc;
    kt_wait_for((rc = s_raw_fetch(t->pep, 0x1, good, true)) != KVEDGE_ENOMODEL, KT_WAIT_MS);
    assert_int_equal(rc, 0);
    s_topo_stop(t);
    free(t);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    s_make(&s_cloud, S_CLOUD, S_CL_LAYERS, S_CL_HEADS, 1);
    s_make(&s_edge, S_EDGE, S_ED_LAYERS, S_ED_HEADS, 500000);
    const struct CMUnitTest tests[] = {
        /* First: the "no usable map" line is said once per pair per 10 minutes, and the
         * refusals test ends with a MAPPED request that has no map. */
        cmocka_unit_test(test_mapped_fetch),
        cmocka_unit_test(test_mapped_fallback),
        cmocka_unit_test(test_mapped_directory_lags),
        cmocka_unit_test(test_directory_lists_part_of_a_context),
        cmocka_unit_test(test_mapped_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    s_free(&s_cloud);
    s_free(&s_edge);
    return rc;
}
