/* The edge proxy on loopback topologies with emulated links: the plan prices sources as
 * Eq. 19 says and uses a peer edge for the shallow layers it holds (the directory comes from
 * the master); a stale directory is corrected by falling back; the cloud node killed
 * mid-request: the request completes from the historical cache within its deadline, every
 * block verified, and the cloud is re-admitted when it comes back; all sources down: misses
 * within the deadline; a master restart: the proxy resyncs and sees new nodes; bad requests
 * get clear errors and the proxy keeps serving. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "access/client_credit.h"
#include "access/frame.h"
#include "store/master/master.h"
#include "runtime/mview.h"
#include "access/transport.h"
#include "store/node/node.h"
#include "store/engine/engine_debug.h"
#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "access/codec/synth.h"
#include "tests/common/ctx_fx.h"
#include "tests/common/spawn.h"
#include "tests/common/testutil.h"
#include "tests/common/world.h"
#include "tests/common/http.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define S_MODEL  KT_CTX_MODEL /* built in: 12 layers x 12 heads x 64 */
#define S_HEADS  KT_CTX_HEADS
#define S_LAYERS KT_CTX_LAYERS
#define S_CHUNKS 2
#define S_TOKENS KT_CTX_TOKENS /* per chunk */

/* ---------------------------------------------------------------- the context */

static kt_ctx_t s_ctx;

/* ---------------------------------------------------------------- nodes */

typedef struct {
    char dir[200];
    char ep[250];
    kvedge_node_t *node;
    kvedge_engine_t *engine; /* the node's */
} s_node_t;

/* Nodes started with a metrics endpoint on a free loopback port (the monitoring test). */
static bool s_with_metrics;
static uint64_t s_buffer_bytes; /* the proxy's buffer cap; 0: its default */
static bool s_proxy_no_pack;    /* the proxy refuses packing, as older proxies do */

static void s_node_start(s_node_t *n, const char *root, const char *name, kvedge_role_t role,
                         const char *master, const char *pub)
{
    memset(n, 0, sizeof *n);
    snprintf(n->dir, sizeof n->dir, "%.120s/%.60s", root, name);
    snprintf(n->ep, sizeof n->ep, "ipc://%.200s.sock", n->dir);
    kvedge_node_settings_t ns;
    kt_node_settings(&ns, role, name, n->dir, n->ep);
    snprintf(ns.metrics, sizeof ns.metrics, "%s", s_with_metrics ? "127.0.0.1:0" : "off");
    if (master) {
        snprintf(ns.master, sizeof ns.master, "%s", master);
        snprintf(ns.master_pub, sizeof ns.master_pub, "%s", pub);
        snprintf(ns.node_id, sizeof ns.node_id, "%s", name);
        ns.dir_interval_ms = 100;
    }
    char why[256];
    if (kvedge_node_start(&ns, &n->node, why, sizeof why) != 0)
        fail_msg("start %s: %s", name, why);
    n->engine = kvedge_node_engine(n->node);
}

static void s_node_stop(s_node_t *n)
{
    kvedge_node_destroy(&n->node);
}

/* A cloud node in its own process, so it can be killed mid-request. */
static pid_t s_spawn_cloud(const char *root, const char *ep)
{
    pid_t pid = kt_spawn_cloud(KVEDGE_BIN, root, ep);
    assert_true(pid > 0);
    return pid;
}

/* ---------------------------------------------------------------- fetching */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    bool planned;
    kvedge_fetch_plan_t plan;
    kvedge_fetch_layer_t layer[S_LAYERS];
    char layer_src[S_LAYERS][64];
    uint32_t layers;
    uint32_t blocks, mismatches;
    pid_t kill_after_first;      /* SIGKILL this process once layer 0 is delivered */
    kvedge_client_t *count_msgs; /* set: count the BLOCK messages (msgs) through held credit */
    uint32_t msgs;
} s_result_t;

static void s_r_plan(void *ctx, const kvedge_fetch_plan_t *p)
{
    s_result_t *r = ctx;
    r->plan = *p;
    r->planned = true;
}

static void s_r_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source, int status,
                      const uint8_t *data, size_t len)
{
    (void)source;
    s_result_t *r = ctx;
    r->blocks++;
    /* The first block of each message can hold its credit (one per message, packed or not):
     * counted and given back at once. */
    uint64_t stream = r->count_msgs ? kvedge_client_credit_hold() : 0;
    if (stream) {
        r->msgs++;
        assert_int_equal(kvedge_client_credit_return(r->count_msgs, stream, 1), 0);
    }
    if (status != 0 || layer >= S_LAYERS || ci >= S_CHUNKS || head >= S_HEADS ||
        len != s_ctx.len[layer][ci][head] || memcmp(data, s_ctx.block[layer][ci][head], len) != 0)
        r->mismatches++;
}

static void s_r_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_result_t *r = ctx;
    if (r->layers < S_LAYERS) {
        r->layer[r->layers] = *l;
        snprintf(r->layer_src[r->layers], sizeof r->layer_src[0], "%s", l->source_name);
        r->layer[r->layers].source_name = r->layer_src[r->layers];
    }
    r->layers++;
    if (r->kill_after_first > 0) {
        kill(r->kill_after_first, SIGKILL);
        r->kill_after_first = 0;
    }
}

static void s_r_done(void *ctx, int status)
{
    s_result_t *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->done = true;
    r->status = status;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Fetches every layer through the proxy with a client that asks for packed BLOCK messages
 * (the default) or not (no_pack), counting the BLOCK messages when count_msgs; returns the
 * elapsed ms. */
static double s_fetch_pack(const char *proxy_ep, int deadline_ms, s_result_t *r, pid_t kill_pid,
                           bool no_pack, bool count_msgs)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->kill_after_first = kill_pid;
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = proxy_ep;
    o.deadline_ms = deadline_ms;
    o.no_pack = no_pack;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    r->count_msgs = count_msgs ? c : NULL;
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_MODEL,
                              .chunks = s_ctx.ids,
                              .n = S_CHUNKS,
                              .layers = S_LAYERS,
                              .tokens = S_CHUNKS * S_TOKENS,
                              .deadline_ms = deadline_ms};
    kvedge_fetch_cbs_t cbs = {s_r_plan, s_r_block, s_r_layer, s_r_done};
    int64_t t0 = zclock_usecs();
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, r), 0);
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    double ms = (double)(zclock_usecs() - t0) / 1e3;
    kvedge_client_destroy(&c);
    return ms;
}

static double s_fetch(const char *proxy_ep, int deadline_ms, s_result_t *r, pid_t kill_pid)
{
    return s_fetch_pack(proxy_ep, deadline_ms, r, kill_pid, false, false);
}

static int s_src_index(const kvedge_fetch_plan_t *p, const char *name)
{
    for (uint32_t s = 0; s < p->nsources; s++)
        if (strcmp(p->source[s].name, name) == 0)
            return (int)s;
    return -1;
}

static kvedge_proxy_t *s_proxy_snap(const char *root, kvedge_proxy_source_t *src, size_t n,
                                    const char *master, const char *pub, const char *snapshot,
                                    char *ep, size_t ep_len);

static kvedge_proxy_t *s_proxy(const char *root, kvedge_proxy_source_t *src, size_t n,
                               const char *master, const char *pub, char *ep, size_t ep_len)
{
    return s_proxy_snap(root, src, n, master, pub, NULL, ep, ep_len);
}

static kvedge_proxy_t *s_proxy_snap(const char *root, kvedge_proxy_source_t *src, size_t n,
                                    const char *master, const char *pub, const char *snapshot,
                                    char *ep, size_t ep_len)
{
    snprintf(ep, ep_len, "ipc://%s/proxy.sock", root);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = ep;
    po.insecure = true;
    po.id = "proxy-t";
    po.sources = src;
    po.nsources = n;
    po.master = master;
    po.master_pub = pub;
    po.snapshot = snapshot;
    po.metrics = s_with_metrics ? "127.0.0.1:0" : NULL;
    if (s_buffer_bytes)
        po.buffer_bytes = s_buffer_bytes;
    po.no_pack = s_proxy_no_pack;
    char why[256];
    kvedge_proxy_t *p = NULL;
    if (kvedge_proxy_start(&po, &p, why, sizeof why) != 0)
        fail_msg("proxy: %s", why);
    return p;
}

static void s_source(kvedge_proxy_source_t *s, const char *spec)
{
    assert_int_equal(kvedge_proxy_source_parse(spec, s), 0);
}

static void s_rmrf(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---------------------------------------------------------------- tests */

/* A node that holds blocks of a model the registry does not know registers its shape
 * (model/<id>), so proxies can plan it; built-in models are not written. */
static void test_node_registers_its_models(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    kt_master_t mm;
    kvedge_master_t *m = kt_master_start(&mm, root);
    s_node_t node;
    s_node_start(&node, root, "edgeM", KVEDGE_ROLE_EDGE, mm.ep, mm.pub);
    kvedge_model_t custom = {.id = "custom-model",
                             .layers = 3,
                             .kv_heads = 2,
                             .head_dim = 64,
                             .dtype = KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_engine_put_model(node.engine, &custom), 0);
    kvedge_client_t *c = kt_client(node.ep, 10000);
    kvedge_put_item_t item;
    memset(&item, 0, sizeof item);
    item.chunk.id = s_ctx.ids[0];
    snprintf(item.chunk.model_id, sizeof item.chunk.model_id, "custom-model");
    item.chunk.tokens = S_TOKENS;
    item.block = s_ctx.block[0][0][0];
    item.len = s_ctx.len[0][0][0];
    assert_int_equal(kvedge_client_put(c, &item, 1, NULL), 0);
    kvedge_client_destroy(&c);

    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = mm.ep;
    vo.pub = mm.pub;
    vo.prefix = "model/";
    kvedge_mview_t *view = NULL;
    assert_int_equal(kvedge_mview_start(&vo, &view), 0);
    kvedge_model_t got;
    uint32_t changed;
    kt_wait_for(kvedge_node_publish(node.node, &changed) == 0 &&
                    kvedge_mview_model(view, "custom-model", &got) == KVEDGE_OK,
                KT_WAIT_MS);
    assert_int_equal(got.layers, 3);
    assert_int_equal(got.kv_heads, 2);
    assert_int_equal(got.head_dim, 64);
    /* S_MODEL is built in: every proxy knows it, nobody registers it. */
    assert_int_equal(kvedge_mview_model(view, S_MODEL, &got), KVEDGE_ENOTFOUND);
    kvedge_mview_destroy(&view);
    s_node_stop(&node);
    kvedge_master_destroy(&m);
    s_rmrf(root);
}

/* Two edges share shallow layers: edge A holds layers 0..5 and tells the master; the proxy of
 * edge B plans them from A (1 Gbit/s, 1 ms) and the deep ones from the cloud (100 Mbit/s,
 * 20 ms), prices each as Eq. 19 says, and delivers every block intact. */
static void test_peer_sharing_with_directory(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    kt_master_t mm;
    kvedge_master_t *m = kt_master_start(&mm, root);
    const char *mep = mm.ep, *mpub = mm.pub;
    s_node_t cloud, peer;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, mep, mpub);
    s_node_start(&peer, root, "edgeA", KVEDGE_ROLE_EDGE, mep, mpub);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    kt_ctx_put(&s_ctx, peer.ep, 0, 6,
               false); /* edge A computed the shallow layers and published them */
    uint32_t changed;
    assert_int_equal(kvedge_node_publish(cloud.node, &changed), 0);
    assert_int_equal(kvedge_node_publish(peer.node, &changed), 0);

    kvedge_proxy_source_t src[2];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s link=100mbit,20ms bw=12500000 rtt=40000",
             cloud.ep);
    s_source(&src[0], spec);
    snprintf(spec, sizeof spec, "peer edgeA %s link=1gbit,1ms bw=125000000 rtt=2000", peer.ep);
    s_source(&src[1], spec);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, src, 2, mep, mpub, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 2, 5000), 0);
    /* The proxy's view has the directory once it has caught up with the master. */
    assert_int_equal(kvedge_proxy_wait_view(p, kvedge_master_seq(m), KT_WAIT_MS), 0);
    assert_int_equal(kvedge_proxy_wait_view(p, kvedge_master_seq(m) + 1000, 50),
                     KVEDGE_ETIMEDOUT); /* a seq the master has not reached */

    s_result_t r;
    s_fetch(pep, 20000, &r, 0);
    assert_int_equal(r.status, 0);
    assert_true(r.planned);
    assert_int_equal(r.layers, S_LAYERS);
    assert_int_equal(r.mismatches, 0);
    assert_int_equal(r.blocks, S_LAYERS * S_CHUNKS * S_HEADS);
    int ci = s_src_index(&r.plan, "cloud1"), pi = s_src_index(&r.plan, "edgeA");
    assert_true(ci >= 0 && pi >= 0);
    /* Eq. 19: every planned layer costs rtt + bytes / bw of its source, with bytes the fp16
     * size of the layer (the proxy's prior before it has seen what a source sends). */
    double fp16 = (double)S_CHUNKS * S_TOKENS * S_HEADS * 64 * 2 * 2;
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        int s = r.plan.layer[l].source;
        assert_true(s >= 0);
        double want = r.plan.source[s].rtt_us + fp16 * 1e6 / r.plan.source[s].bw_bytes_per_s;
        assert_true(fabs(r.plan.layer[l].cost_us - want) <= 1e-6 * want);
        /* The peer holds 0..5 (directory): deep layers can only come from the cloud; every
         * shallow layer is cheaper from the peer, and the plan never loses to cloud-only. */
        if (l >= 6)
            assert_int_equal(s, ci);
        assert_string_equal(r.layer[l].source_name, r.plan.source[s].name);
        assert_int_equal(r.layer[l].reason, KVEDGE_FETCH_PLANNED);
    }
    uint32_t from_peer = 0;
    for (uint32_t l = 0; l < 6; l++)
        from_peer += r.plan.layer[l].source == pi;
    assert_true(from_peer >= 1);
    assert_true(r.plan.total_us <= r.plan.cloud_only_us);
    assert_true(r.plan.bound_us <= r.plan.total_us * (1 + 1e-9));
    printf("plan: %u of 6 shallow layers from the peer, T %.1f ms vs cloud-only %.1f ms\n",
           from_peer, r.plan.total_us / 1e3, r.plan.cloud_only_us / 1e3);

    kvedge_proxy_destroy(&p);
    s_node_stop(&peer);
    s_node_stop(&cloud);
    kvedge_master_destroy(&m);
    s_rmrf(root);
}

/* No directory: the proxy assumes the peer holds every layer; the peer answers "not found"
 * for the deep ones, which move to the cloud (fallback:missing), and the negative cache
 * keeps the next plan off them. */
static void test_stale_directory_falls_back(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    s_node_t cloud, peer;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, NULL, NULL);
    s_node_start(&peer, root, "edgeA", KVEDGE_ROLE_EDGE, NULL, NULL);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    kt_ctx_put(&s_ctx, peer.ep, 0, 6, false);
    kvedge_proxy_source_t src[2];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s link=100mbit,20ms bw=12500000 rtt=40000",
             cloud.ep);
    s_source(&src[0], spec);
    snprintf(spec, sizeof spec, "peer edgeA %s bw=1000000000 rtt=200", peer.ep);
    s_source(&src[1], spec);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, src, 2, NULL, NULL, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 2, 5000), 0);

    s_result_t r;
    s_fetch(pep, 20000, &r, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    assert_int_equal(r.mismatches, 0);
    uint32_t missing = 0;
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        assert_int_equal(r.layer[l].status, 0);
        if (r.layer[l].reason == KVEDGE_FETCH_FALLBACK_MISSING) {
            missing++;
            assert_true(l >= 6);
            assert_string_equal(r.layer[l].source_name, "cloud1");
        }
    }
    assert_true(missing >= 1);
    /* Learned: the next plan keeps deep layers off the peer. */
    s_fetch(pep, 20000, &r, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.mismatches, 0);
    int pi = s_src_index(&r.plan, "edgeA");
    for (uint32_t l = 6; l < S_LAYERS; l++) {
        assert_int_not_equal(r.plan.layer[l].source, pi);
        assert_int_equal(r.layer[l].reason, KVEDGE_FETCH_PLANNED);
    }
    kvedge_proxy_stats_t st;
    kvedge_proxy_stats(p, &st);
    assert_true(st.fallbacks >= missing);
    /* The blocks (64 KiB each) were forwarded in the frames they arrived in, and arrived
     * intact (mismatches 0 above): at most the blocks of the two fetches, some at least. */
    assert_true(st.forwarded_in_place > 0);
    assert_true(st.forwarded_in_place <= 2ull * S_LAYERS * S_CHUNKS * S_HEADS + 64);
    kvedge_proxy_destroy(&p);
    s_node_stop(&peer);
    s_node_stop(&cloud);
    s_rmrf(root);
}

/* Puts heads [0, h1) of layer `layer` of every chunk of the context to the node at ep. */
static void s_put_heads(const char *ep, uint32_t layer, uint32_t h1)
{
    kvedge_client_t *c = kt_client(ep, 10000);
    kvedge_put_item_t items[S_HEADS];
    for (uint32_t ci = 0; ci < S_CHUNKS; ci++) {
        for (uint32_t h = 0; h < h1; h++) {
            memset(&items[h], 0, sizeof items[h]);
            items[h].chunk.id = s_ctx.ids[ci];
            items[h].chunk.has_parent = ci > 0;
            if (ci > 0)
                items[h].chunk.parent = s_ctx.ids[ci - 1];
            snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, S_MODEL);
            items[h].chunk.index = ci;
            items[h].chunk.tokens = S_TOKENS;
            items[h].layer = (uint16_t)layer;
            items[h].head = (uint16_t)h;
            items[h].block = s_ctx.block[layer][ci][h];
            items[h].len = s_ctx.len[layer][ci][h];
        }
        assert_int_equal(kvedge_client_put(c, items, h1, NULL), 0);
    }
    kvedge_client_destroy(&c);
}

static size_t s_lookup(const char *ep)
{
    kvedge_client_t *c = kt_client(ep, 10000);
    size_t hit = 99;
    assert_int_equal(kvedge_client_lookup(c, s_ctx.ids, S_CHUNKS, &hit), 0);
    kvedge_client_destroy(&c);
    return hit;
}

typedef struct {
    kvedge_mview_t *view;
    kvedge_node_t *node;
    const char *name;
    unsigned layer;
    bool want;
} s_dir_ctx_t;

/* Publishes the node's directory; whether the view's entries of every chunk then say `want`
 * about the layer (the view applies the records one update at a time). */
static bool s_dir_says(void *arg)
{
    s_dir_ctx_t *x = arg;
    uint32_t changed, seen = 0;
    assert_int_equal(kvedge_node_publish(x->node, &changed), 0);
    for (uint32_t c = 0; c < S_CHUNKS; c++) {
        kvedge_master_dir_t d;
        seen += kvedge_mview_dir(x->view, x->name, &s_ctx.ids[c], &d) == KVEDGE_OK &&
                kvedge_master_dir_has(&d, x->layer) == x->want;
    }
    return seen == S_CHUNKS;
}

/* Waits until the view's directory entries of node say `want` about layer. */
static void s_wait_dir(kvedge_mview_t *view, kvedge_node_t *node, const char *name, unsigned layer,
                       bool want)
{
    s_dir_ctx_t x = {view, node, name, layer, want};
    if (!kt_poll(s_dir_says, &x, KT_WAIT_MS))
        fail_msg("the directory of %s never said layer %u is %sheld", name, layer,
                 want ? "" : "not ");
}

/* A chunk with only some heads of a layer (what a crash during an unacknowledged PUT
 * leaves): LOOKUP does not count it, the node's directory does not list that layer, and the
 * proxy plans the layer from a node that has all of it. */
static void test_partial_layer_not_held(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    kt_master_t mm;
    kvedge_master_t *m = kt_master_start(&mm, root);
    s_node_t cloud, peer;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, mm.ep, mm.pub);
    s_node_start(&peer, root, "edgeA", KVEDGE_ROLE_EDGE, mm.ep, mm.pub);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    const unsigned partial = 5;
    kt_ctx_put(&s_ctx, peer.ep, 0, partial, false);
    s_put_heads(peer.ep, partial, S_HEADS / 2);
    kt_ctx_put(&s_ctx, peer.ep, partial + 1, S_LAYERS, false);

    /* Every layer but one is whole on the peer: not a cached chunk. */
    assert_int_equal(s_lookup(cloud.ep), S_CHUNKS);
    assert_int_equal(s_lookup(peer.ep), 0);

    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = mm.ep;
    vo.pub = mm.pub;
    vo.prefix = "dir/";
    kvedge_mview_t *view = NULL;
    assert_int_equal(kvedge_mview_start(&vo, &view), 0);
    s_wait_dir(view, cloud.node, "cloud1", partial, true);
    /* The peer's last layer, put last: a record published while the puts ran (layer 0 held,
     * later ones not yet) does not satisfy it. */
    s_wait_dir(view, peer.node, "edgeA", S_LAYERS - 1, true);
    for (uint32_t c = 0; c < S_CHUNKS; c++) {
        kvedge_master_dir_t d;
        assert_int_equal(kvedge_mview_dir(view, "edgeA", &s_ctx.ids[c], &d), 0);
        for (unsigned l = 0; l < S_LAYERS; l++)
            assert_int_equal(kvedge_master_dir_has(&d, l), l != partial);
        /* The precisions it serves: its blocks are int8, and it derives coarser rungs. */
        assert_int_equal(d.rungs,
                         (1u << kvedge_master_rung_bit(KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 0))) |
                             KVEDGE_MASTER_DIR_DERIVES);
    }

    kvedge_proxy_source_t src[2];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s link=100mbit,20ms bw=12500000 rtt=40000",
             cloud.ep);
    s_source(&src[0], spec);
    snprintf(spec, sizeof spec, "peer edgeA %s link=1gbit,1ms bw=125000000 rtt=2000", peer.ep);
    s_source(&src[1], spec);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, src, 2, mm.ep, mm.pub, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 2, 5000), 0);
    /* The proxy's view catches up with the directory. */
    assert_int_equal(kvedge_proxy_wait_view(p, kvedge_master_seq(mm.m), KT_WAIT_MS), 0);

    s_result_t r;
    s_fetch(pep, 20000, &r, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    assert_int_equal(r.mismatches, 0);
    assert_int_equal(r.blocks, S_LAYERS * S_CHUNKS * S_HEADS);
    int ci = s_src_index(&r.plan, "cloud1"), pi = s_src_index(&r.plan, "edgeA");
    assert_true(ci >= 0 && pi >= 0);
    uint32_t from_peer = 0;
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        assert_int_equal(r.layer[l].status, 0);
        assert_int_equal(r.layer[l].reason, KVEDGE_FETCH_PLANNED);
        from_peer += r.plan.layer[l].source == pi;
    }
    assert_true(from_peer >= 1);                        /* the peer is a planned source ... */
    assert_int_equal(r.plan.layer[partial].source, ci); /* ... but not of its partial layer */
    assert_string_equal(r.layer[partial].source_name, "cloud1");

    /* A request that accepts only lossless: the directory says neither node can serve it (both
     * hold int8, and lossless derives from nothing else), so no layer is even asked for. */
    kvedge_client_t *lc = kt_client(pep, 20000);
    const kvedge_prec_t lossless = KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 0);
    kvedge_fetch_req_t lreq = {.size = sizeof(kvedge_fetch_req_t),
                               .model_id = S_MODEL,
                               .chunks = s_ctx.ids,
                               .n = S_CHUNKS,
                               .layers = S_LAYERS,
                               .tokens = S_CHUNKS * S_TOKENS,
                               .deadline_ms = 20000,
                               .accept = &lossless,
                               .n_accept = 1};
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    kvedge_fetch_cbs_t lcbs = {s_r_plan, s_r_block, s_r_layer, s_r_done};
    assert_int_equal(kvedge_client_fetch_async(lc, &lreq, &lcbs, &r), 0);
    pthread_mutex_lock(&r.mu);
    while (!r.done)
        pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    kvedge_client_destroy(&lc);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.blocks, 0);
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        assert_int_equal(r.plan.layer[l].source, -1);
        assert_int_equal(r.layer[l].status, KVEDGE_ENOTFOUND);
        assert_int_equal(r.layer[l].attempts, 0);
    }

    /* The missing heads arrive: the chunk is whole, and so is its layer in the directory. */
    kt_ctx_put(&s_ctx, peer.ep, partial, partial + 1, false);
    assert_int_equal(s_lookup(peer.ep), S_CHUNKS);
    s_wait_dir(view, peer.node, "edgeA", partial, true);

    kvedge_mview_destroy(&view);
    kvedge_proxy_destroy(&p);
    s_node_stop(&peer);
    s_node_stop(&cloud);
    kvedge_master_destroy(&m);
    s_rmrf(root);
}

/* A peer whose stored block is damaged on disk: the node reports the head as corrupt, the
 * proxy moves that layer to the cloud (fallback:corrupt) and never delivers a bad byte. */
static void test_corrupt_block_falls_back(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    s_node_t cloud, peer;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, NULL, NULL);
    s_node_start(&peer, root, "edgeA", KVEDGE_ROLE_EDGE, NULL, NULL);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    kt_ctx_put(&s_ctx, peer.ep, 0, S_LAYERS, false);
    /* Damage layer 2, chunk 0, head 3 on the peer (stored under the loopback tenant). */
    uint8_t tag[16];
    kvedge_tenant_tag(KVEDGE_LOOPBACK_TENANT, tag);
    kvedge_block_key_t key = {.layer = 2, .head = 3};
    kvedge_tenant_chunk_id(tag, &s_ctx.ids[0], &key.chunk);
    uint8_t *bad = malloc(s_ctx.len[2][0][3]);
    memcpy(bad, s_ctx.block[2][0][3], s_ctx.len[2][0][3]);
    bad[s_ctx.len[2][0][3] / 2] ^= 0x5a;
    assert_int_equal(kvedge_engine_debug_put_raw(peer.engine, &key, bad, s_ctx.len[2][0][3]), 0);
    free(bad);
    kvedge_proxy_source_t src[2];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s link=100mbit,10ms bw=12500000 rtt=20000",
             cloud.ep);
    s_source(&src[0], spec);
    snprintf(spec, sizeof spec, "peer edgeA %s bw=1000000000 rtt=200", peer.ep);
    s_source(&src[1], spec);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, src, 2, NULL, NULL, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 2, 5000), 0);
    s_result_t r;
    s_fetch(pep, 20000, &r, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    assert_int_equal(r.mismatches, 0);
    assert_int_equal(r.blocks, S_LAYERS * S_CHUNKS * S_HEADS);
    assert_int_equal(r.plan.layer[2].source, s_src_index(&r.plan, "edgeA"));
    assert_int_equal(r.layer[2].reason, KVEDGE_FETCH_FALLBACK_CORRUPT);
    assert_string_equal(r.layer[2].source_name, "cloud1");
    assert_int_equal(r.layer[2].attempts, 2);
    kvedge_proxy_destroy(&p);
    s_node_stop(&peer);
    s_node_stop(&cloud);
    s_rmrf(root);
}

/* Fetches through the proxy at pep; whether the plan has cloud1 up again. */
static bool s_cloud_readmitted(void *pep)
{
    s_result_t r;
    s_fetch(pep, 8000, &r, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.mismatches, 0);
    int ci = s_src_index(&r.plan, "cloud1");
    return ci >= 0 && r.plan.source[ci].up;
}

/* The cloud node is killed (SIGKILL) after the first layer: the rest comes from the edge's
 * historical cache within the deadline, every byte verified. The cloud comes back and is
 * re-admitted. */
static void test_cloud_killed_mid_request(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    char cep[350];
    snprintf(cep, sizeof cep, "ipc://%s/cloud.sock", root);
    pid_t cloud = s_spawn_cloud(root, cep);
    s_node_t hist;
    s_node_start(&hist, root, "history", KVEDGE_ROLE_EDGE, NULL, NULL);
    kt_ctx_put(&s_ctx, cep, 0, S_LAYERS, false);
    kt_ctx_put(&s_ctx, hist.ep, 0, S_LAYERS, true); /* the pinned historical copy */
    kvedge_proxy_source_t src[2];
    char spec[600];
    /* The cloud is the fast source in the plan (bw=), so the plan starts there; its emulated
     * link is slower (about 1.5 s for the context), so most of it is still to come when the
     * cloud is killed after the first layer, however loaded the machine. */
    snprintf(spec, sizeof spec, "cloud cloud1 %s link=100mbit,5ms bw=125000000 rtt=10000", cep);
    s_source(&src[0], spec);
    snprintf(spec, sizeof spec, "history hist %s link=100mbit,1ms bw=12500000 rtt=2000", hist.ep);
    s_source(&src[1], spec);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, src, 2, NULL, NULL, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 2, 5000), 0);
    assert_int_equal(kvedge_proxy_wait_view(p, 0, 100), KVEDGE_EINVAL); /* no master */
    assert_int_equal(kvedge_proxy_wait_view(NULL, 0, 100), KVEDGE_EINVAL);

    s_result_t r;
    double ms = s_fetch(pep, 8000, &r, cloud);
    waitpid(cloud, NULL, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    assert_int_equal(r.mismatches, 0);
    assert_int_equal(r.blocks, S_LAYERS * S_CHUNKS * S_HEADS);
    assert_true(ms < 8000 + KT_SLACK_MS);
    uint32_t fell_back = 0;
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        assert_int_equal(r.layer[l].status, 0); /* every layer delivered */
        if (r.layer[l].reason == KVEDGE_FETCH_FALLBACK_FAILED) {
            fell_back++;
            assert_string_equal(r.layer[l].source_name, "hist");
        }
    }
    assert_true(fell_back >= 1);
    printf("cloud killed: %u layers from the historical cache, all %u layers in %.0f ms\n",
           fell_back, r.layers, ms);

    /* Back: the prober hears it again; a later plan may use it. */
    cloud = s_spawn_cloud(root, cep);
    kt_wait_until(s_cloud_readmitted, pep, KT_WAIT_MS);
    kill(cloud, SIGTERM);
    waitpid(cloud, NULL, 0);
    kvedge_proxy_destroy(&p);
    s_node_stop(&hist);
    s_rmrf(root);
}

/* The buffer cap never holds back the layer to deliver next. Here a frozen source (SIGSTOP
 * before the request: the proxy still plans with it) had the first layers, the other source
 * the rest, already buffered behind them under a one-byte cap; the frozen source fails by its
 * silence and its layers move to the other one, which must be asked for each in turn as it
 * becomes the next to deliver, though the buffer never drains below the cap. */
static void test_failover_under_a_full_buffer(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    char aep[350], bep[350];
    snprintf(aep, sizeof aep, "ipc://%s/a.sock", root);
    snprintf(bep, sizeof bep, "ipc://%s/b.sock", root);
    pid_t a = s_spawn_cloud(root, aep);
    kt_ctx_put(&s_ctx, aep, 0, S_LAYERS, false);
    s_node_t b;
    s_node_start(&b, root, "b", KVEDGE_ROLE_EDGE, NULL, NULL);
    kt_ctx_put(&s_ctx, b.ep, 0, S_LAYERS, false);
    kvedge_proxy_source_t src[2];
    char spec[600];
    snprintf(spec, sizeof spec, "peer pa %s bw=125000000 rtt=1000", aep);
    s_source(&src[0], spec);
    snprintf(spec, sizeof spec, "cloud cb %s bw=125000000 rtt=1000", bep);
    s_source(&src[1], spec);
    char pep[350];
    s_buffer_bytes = 1;
    kvedge_proxy_t *p = s_proxy(root, src, 2, NULL, NULL, pep, sizeof pep);
    s_buffer_bytes = 0;
    assert_int_equal(kvedge_proxy_wait_sources(p, 2, 5000), 0);

    assert_int_equal(kill(a, SIGSTOP), 0);
    s_result_t r;
    double ms = s_fetch(pep, 20000, &r, 0);
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    int ia = s_src_index(&r.plan, "pa"), ib = s_src_index(&r.plan, "cb");
    assert_true(ia >= 0 && ib >= 0);
    uint32_t on_a = 0, first_b = S_LAYERS;
    for (uint32_t l = 0; l < r.plan.layers; l++) {
        on_a += r.plan.layer[l].source == ia;
        if (r.plan.layer[l].source == ib && first_b == S_LAYERS)
            first_b = l;
    }
    printf("plan: %u layers on the frozen source, the other's from layer %u\n", on_a, first_b);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    assert_int_equal(r.mismatches, 0);
    uint32_t fell_back = 0;
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        if (r.layer[l].status != 0)
            fail_msg("layer %u not delivered (%s)", l, kvedge_fetch_reason_name(r.layer[l].reason));
        assert_string_equal(r.layer[l].source_name, "cb");
        fell_back += r.layer[l].reason == KVEDGE_FETCH_FALLBACK_FAILED;
    }
    /* The shape that needs it: at least two layers moved, with the other source's planned
     * layers after them. */
    assert_true(on_a >= 2);
    assert_true(first_b > 1 && first_b < S_LAYERS);
    assert_int_equal(fell_back, on_a);
    printf("frozen source: its %u layers from the other one under a full buffer, in %.0f ms\n",
           fell_back, ms);
    kvedge_proxy_destroy(&p);
    s_node_stop(&b);
    s_rmrf(root);
}

/* Every source down: each layer comes back as a miss, within the deadline, never a hang. */
static void test_all_sources_down_misses(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    char cep[350];
    snprintf(cep, sizeof cep, "ipc://%s/cloud.sock", root);
    pid_t cloud = s_spawn_cloud(root, cep);
    kt_ctx_put(&s_ctx, cep, 0, S_LAYERS, false);
    kvedge_proxy_source_t src[2];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s", cep);
    s_source(&src[0], spec);
    snprintf(spec, sizeof spec, "peer nobody ipc://%s/nobody.sock", root);
    s_source(&src[1], spec);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, src, 2, NULL, NULL, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 1, 5000), 0);
    kill(cloud, SIGKILL);
    waitpid(cloud, NULL, 0);
    s_result_t r;
    double ms = s_fetch(pep, 1500, &r, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    assert_int_equal(r.blocks, 0);
    for (uint32_t l = 0; l < S_LAYERS; l++) {
        assert_int_equal(r.layer[l].status, KVEDGE_ENOTFOUND);
        assert_true(r.layer[l].reason == KVEDGE_FETCH_MISS ||
                    r.layer[l].reason == KVEDGE_FETCH_MISS_DEADLINE);
    }
    assert_true(ms < 1500 + KT_SLACK_MS);
    printf("all sources down: %u misses in %.0f ms (deadline 1500)\n", r.layers, ms);
    kvedge_proxy_destroy(&p);
    s_rmrf(root);
}

/* The master restarts: the proxy's view resyncs by itself and sees a node that registered
 * after the restart. */
static void test_master_restart_resync(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    kt_master_t mm;
    kvedge_master_t *m = kt_master_start(&mm, root);
    const char *mep = mm.ep, *mpub = mm.pub;
    s_node_t cloud;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, mep, mpub);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, NULL, 0, mep, mpub, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 1, 8000), 0); /* discovered */

    kvedge_master_destroy(&m);
    kt_pause_ms(300); /* the point: an outage, not an instant restart */
    assert_int_equal(kvedge_master_start(&mm.opts, &m, NULL, 0), 0);
    s_node_t edge;
    s_node_start(&edge, root, "edge9", KVEDGE_ROLE_EDGE, mep, mpub);
    assert_int_equal(kvedge_proxy_wait_sources(p, 2, 15000), 0); /* edge9 seen after resync */
    s_result_t r;
    s_fetch(pep, 10000, &r, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.mismatches, 0);
    assert_true(s_src_index(&r.plan, "edge9") >= 0);
    assert_true(s_src_index(&r.plan, "cloud1") >= 0);
    kvedge_proxy_destroy(&p);
    s_node_stop(&edge);
    s_node_stop(&cloud);
    kvedge_master_destroy(&m);
    s_rmrf(root);
}

/* The master is unreachable when the proxy starts: it plans from its last snapshot of the
 * registry (sources and directory) and serves. */
static void test_master_down_at_start_uses_snapshot(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    kt_master_t mm;
    kvedge_master_t *m = kt_master_start(&mm, root);
    s_node_t cloud;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, mm.ep, mm.pub);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    uint32_t changed;
    assert_int_equal(kvedge_node_publish(cloud.node, &changed), 0);
    char snap[300], pep[350];
    snprintf(snap, sizeof snap, "%.200s/proxy.view", root);
    kvedge_proxy_t *p = s_proxy_snap(root, NULL, 0, mm.ep, mm.pub, snap, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 1, 8000), 0);
    assert_int_equal(kvedge_proxy_wait_view(p, kvedge_master_seq(m), KT_WAIT_MS), 0);
    kvedge_proxy_destroy(&p);  /* writes the replica file */
    kvedge_master_destroy(&m); /* the node stays up; its view retries the master */
    p = s_proxy_snap(root, NULL, 0, mm.ep, mm.pub, snap, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 1, 8000), 0);
    s_result_t r;
    s_fetch(pep, 10000, &r, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    assert_int_equal(r.mismatches, 0);
    assert_int_equal(r.blocks, S_LAYERS * S_CHUNKS * S_HEADS);
    assert_string_equal(r.layer[0].source_name, "cloud1");
    kvedge_proxy_destroy(&p);
    s_node_stop(&cloud);
    s_rmrf(root);
}

/* ---------------------------------------------------------------- monitoring */

static cJSON *s_monitor(const char *ep, uint32_t top)
{
    kvedge_client_t *c = kt_client(ep, 5000);
    char *json = NULL;
    size_t len = 0;
    assert_int_equal(kvedge_client_monitor(c, top, &json, &len), 0);
    kvedge_client_destroy(&c);
    cJSON *doc = cJSON_ParseWithLength(json, len);
    assert_non_null(doc);
    free(json);
    return doc;
}

static double s_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

/* The value (after the line's last space) of the first series line of metrics starting with
 * prefix, or -1. */
static double s_metric(const char *metrics, const char *prefix)
{
    for (const char *p = metrics; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, prefix, strlen(prefix)) != 0)
            continue;
        const char *end = strchr(p, '\n'), *v = p;
        for (const char *q = p; q < (end ? end : p + strlen(p)); q++)
            if (*q == ' ')
                v = q + 1;
        return strtod(v, NULL);
    }
    return -1;
}

/* The I/O Analyzer and the Collaboration Monitor see one fetch of the whole context: over
 * MONITOR and on /metrics, with readiness, and what the node's hot table says of the
 * prefix. */
static void test_monitoring(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    s_with_metrics = true;
    s_node_t cloud;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, NULL, NULL);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    kvedge_proxy_source_t src;
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s", cloud.ep);
    s_source(&src, spec);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, &src, 1, NULL, NULL, pep, sizeof pep);
    s_with_metrics = false;
    assert_int_equal(kvedge_proxy_wait_sources(p, 1, 5000), 0);
    s_result_t r;
    s_fetch(pep, 20000, &r, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    const uint32_t blocks = S_LAYERS * S_CHUNKS * S_HEADS;

    /* The node's document: every block a hit, one GET_LAYER per layer, the context's two
     * chunks the hot set with all 12 layers. */
    cJSON *nd = s_monitor(cloud.ep, 10);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(nd, "kind")->valuestring, "node");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(nd, "ready")));
    assert_int_equal((int)s_num(cJSON_GetObjectItemCaseSensitive(nd, "reads"), "hits"), blocks);
    double get_layer = 0, put_ok = 0, failed = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(nd, "requests"))
    {
        const char *op = cJSON_GetObjectItemCaseSensitive(e, "op")->valuestring;
        const char *st = cJSON_GetObjectItemCaseSensitive(e, "status")->valuestring;
        if (strcmp(op, "GET_LAYER") == 0)
            get_layer += s_num(e, "count");
        if (strcmp(op, "PUT") == 0 && strcmp(st, "OK") == 0)
            put_ok += s_num(e, "count");
        if (strcmp(st, "OK") != 0)
            failed += s_num(e, "count");
    }
    assert_int_equal((int)get_layer, S_LAYERS * 1);     /* one stream per layer of the context */
    assert_int_equal((int)put_ok, S_LAYERS * S_CHUNKS); /* s_put: one PUT per layer and chunk */
    assert_int_equal((int)failed, 0);
    const cJSON *hot = cJSON_GetObjectItemCaseSensitive(nd, "hot");
    const cJSON *prefixes = cJSON_GetObjectItemCaseSensitive(hot, "prefixes");
    assert_int_equal(cJSON_GetArraySize(prefixes), S_CHUNKS);
    cJSON_ArrayForEach(e, prefixes)
    {
        assert_int_equal((int)s_num(e, "count"), S_LAYERS); /* one touch per chunk and layer */
        assert_int_equal((int)s_num(e, "error"), 0);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "model")->valuestring, S_MODEL);
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(e, "layers")),
                         S_LAYERS);
    }
    cJSON_Delete(nd);

    /* The proxy's document: the source up, 12 layers planned from a cloud, one fetch OK. */
    cJSON *pd = s_monitor(pep, 0);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(pd, "kind")->valuestring, "proxy");
    const cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pd, "sources"), 0);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(s0, "name")->valuestring, "cloud1");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(s0, "state")->valuestring, "up");
    assert_true(s_num(s0, "rtt_us") > 0);
    /* The fetch's first stream, opened alone, was a round-trip sample: the RTO it set. */
    assert_true(s_num(s0, "srtt_us") > 0);
    assert_true(fabs(s_num(s0, "rto_ms") - (s_num(s0, "srtt_us") + 4 * s_num(s0, "rttvar_us")) /
                                               1e3) < 1e-6 * (1 + s_num(s0, "rto_ms")));
    const cJSON *l0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pd, "layers"), 0);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(l0, "kind")->valuestring, "cloud");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(l0, "reason")->valuestring, "planned");
    assert_int_equal((int)s_num(l0, "count"), S_LAYERS);
    const cJSON *fetch = cJSON_GetObjectItemCaseSensitive(pd, "fetch");
    assert_int_equal((int)s_num(fetch, "ok"), 1);
    assert_int_equal((int)s_num(cJSON_GetObjectItemCaseSensitive(fetch, "first_layer"), "count"),
                     1);
    cJSON_Delete(pd);

    /* The same on /metrics, and both ready. */
    static char body[1 << 20];
    const char *nurl = kvedge_node_metrics_url(cloud.node), *purl = kvedge_proxy_metrics_url(p);
    assert_non_null(nurl);
    assert_non_null(purl);
    assert_int_equal(kt_http_get(nurl, "/metrics", body, sizeof body), 200);
    assert_int_equal((int)s_metric(body, "kvedge_node_block_hits_total "), blocks);
    assert_int_equal((int)s_metric(body, "kvedge_node_blocks "), blocks);
    assert_true(s_metric(body, "kvedge_node_hot_prefix_accesses{rank=\"1\"") >= S_LAYERS);
    assert_int_equal(kt_http_get(purl, "/metrics", body, sizeof body), 200);
    assert_int_equal((int)s_metric(body, "kvedge_proxy_fetches_total{status=\"OK\"} "), 1);
    assert_int_equal(
        (int)s_metric(body, "kvedge_proxy_layers_total{kind=\"cloud\",reason=\"planned\"} "),
        S_LAYERS);
    assert_int_equal((int)s_metric(body, "kvedge_proxy_source_up{source=\"cloud1\""), 1);
    assert_true(s_metric(body, "kvedge_proxy_source_rto_seconds{source=\"cloud1\"") > 0);
    assert_int_equal(kt_http_get(nurl, "/ready", body, sizeof body), 200);
    assert_int_equal(kt_http_get(purl, "/ready", body, sizeof body), 200);

    /* The source goes away: the proxy is no longer ready, and says why. */
    s_node_stop(&cloud);
    kt_wait_for((s_fetch(pep, 1000, &r, 0), /* failures are how the proxy learns */
                 kt_http_get(purl, "/ready", body, sizeof body) != 200),
                KT_WAIT_MS);
    assert_int_equal(kt_http_get(purl, "/ready", body, sizeof body), 503);
    assert_non_null(strstr(body, "not ready: "));
    kvedge_proxy_destroy(&p);
    s_rmrf(root);
}

static int s_fetch_status(kvedge_client_t *c, const char *model, uint16_t first, uint16_t n)
{
    s_result_t r;
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = model,
                              .chunks = s_ctx.ids,
                              .n = S_CHUNKS,
                              .first_layer = first,
                              .layers = n,
                              .deadline_ms = 3000};
    kvedge_fetch_cbs_t cbs = {NULL, NULL, NULL, s_r_done};
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, &r), 0);
    pthread_mutex_lock(&r.mu);
    while (!r.done)
        pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    return r.status;
}

/* Unknown model, layers outside the model, a malformed message, an opcode a proxy does not
 * serve: clear errors, and the proxy keeps serving. */
static void test_bad_requests(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    s_node_t cloud;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, NULL, NULL);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    kvedge_proxy_source_t src[1];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s", cloud.ep);
    s_source(&src[0], spec);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, src, 1, NULL, NULL, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 1, 5000), 0);
    kvedge_client_t *c = kt_client(pep, 3000);
    assert_int_equal(kvedge_client_node(c)->role, KVEDGE_ROLE_PROXY);
    assert_int_equal(s_fetch_status(c, "no-such-model", 0, 1), KVEDGE_ENOMODEL);
    assert_int_equal(s_fetch_status(c, S_MODEL, 10, 5), KVEDGE_ESHAPE);
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_client_stat(c, &st), KVEDGE_EINVAL); /* not a store node */
    /* Garbage on the wire gets an EPROTO answer. */
    zsock_t *raw = zsock_new_dealer(pep);
    zsock_set_rcvtimeo(raw, 3000);
    zstr_send(raw, "not a kvedge header");
    zmsg_t *ans = zmsg_recv(raw);
    assert_non_null(ans);
    zframe_t *hf = zmsg_first(ans);
    kvedge_wire_header_t h;
    assert_int_equal(kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h), 0);
    assert_int_equal(h.status, KVEDGE_EPROTO);
    zmsg_destroy(&ans);
    zsock_destroy(&raw);
    /* Still serving. */
    assert_int_equal(s_fetch_status(c, S_MODEL, 0, S_LAYERS), 0);
    double rtt;
    assert_int_equal(kvedge_client_ping(c, 0, &rtt, NULL), 0);
    kvedge_client_destroy(&c);
    /* Source specs are parsed strictly. */
    kvedge_proxy_source_t bad;
    assert_int_equal(kvedge_proxy_source_parse("satellite x ipc://a", &bad), KVEDGE_EINVAL);
    assert_int_equal(kvedge_proxy_source_parse("cloud x", &bad), KVEDGE_EINVAL);
    assert_int_equal(kvedge_proxy_source_parse("cloud x ipc://a link=fast", &bad), KVEDGE_EINVAL);
    assert_int_equal(kvedge_proxy_source_parse("cloud x ipc://a bw=-1", &bad), KVEDGE_EINVAL);
    assert_int_equal(kvedge_proxy_source_parse("cloud x ipc://a what=1", &bad), KVEDGE_EINVAL);
    assert_int_equal(kvedge_proxy_source_parse("cloud bad/id ipc://a", &bad), KVEDGE_EINVAL);
    kvedge_proxy_destroy(&p);
    s_node_stop(&cloud);
    s_rmrf(root);
}

/* CANCEL ends a FETCH stream: the data messages already sent, then at once an END with
 * KVEDGE_ECANCELED that counts them, and nothing after it. */
static void test_cancel_ends_fetch(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    s_node_t cloud;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, NULL, NULL);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    kvedge_proxy_source_t src[1];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s", cloud.ep);
    s_source(&src[0], spec);
    char pep[350];
    kvedge_proxy_t *p = s_proxy(root, src, 1, NULL, NULL, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 1, 5000), 0);

    /* One block per message, then packed (credit still counts messages). */
    for (int packed = 0; packed < 2; packed++) {
        zsock_t *raw = zsock_new_dealer(pep);
        zsock_set_linger(raw, 0);
        zsock_set_rcvtimeo(raw, 3000);
        kvedge_wire_fetch_spec_t fs;
        memset(&fs, 0, sizeof fs);
        snprintf(fs.model_id, sizeof fs.model_id, S_MODEL);
        fs.layers = S_LAYERS;
        fs.tokens = S_CHUNKS * S_TOKENS;
        fs.flags = packed ? KVEDGE_WIRE_FETCH_FLAG_PACK : 0;
        uint8_t sb[KVEDGE_WIRE_FETCH_SPEC_BYTES], hb[KVEDGE_WIRE_HEADER_BYTES];
        assert_int_equal(kvedge_wire_fetch_spec_pack(&fs, sb), 0);
        /* Credit 2: the plan and one BLOCK message, then the stream waits for credit. */
        kvedge_wire_header_t h = {1, KVEDGE_OP_FETCH, 0, 7, 0, S_CHUNKS, 2, 5000};
        kvedge_wire_header_pack(&h, hb);
        zmsg_t *m = zmsg_new();
        zmsg_addmem(m, hb, sizeof hb);
        zmsg_addmem(m, sb, sizeof sb);
        zmsg_addmem(m, s_ctx.ids, sizeof s_ctx.ids);
        assert_int_equal(zmsg_send(&m, raw), 0);
        for (int i = 0; i < 2; i++) {
            m = zmsg_recv(raw);
            assert_non_null(m);
            zframe_t *f = zmsg_first(m);
            assert_int_equal(kvedge_wire_header_parse(zframe_data(f), zframe_size(f), &h), 0);
            assert_int_equal(h.flags, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_MORE);
            if (i == 1) /* the BLOCK message: a pack of the layer's first blocks when asked */
                assert_true(packed ? h.count > 1 && zmsg_size(m) == 2 + h.count : h.count == 1);
            zmsg_destroy(&m);
        }
        kvedge_wire_header_t c = {1, KVEDGE_OP_CANCEL, 0, 7, 0, 0, 0, 5000};
        kvedge_wire_header_pack(&c, hb);
        int64_t t0 = zclock_mono();
        assert_int_equal(zsock_send(raw, "b", hb, sizeof hb), 0);
        m = zmsg_recv(raw);
        int64_t took = zclock_mono() - t0;
        assert_non_null(m);
        zframe_t *f = zmsg_first(m);
        assert_int_equal(kvedge_wire_header_parse(zframe_data(f), zframe_size(f), &h), 0);
        assert_int_equal(zmsg_size(m), 1);
        zmsg_destroy(&m);
        assert_int_equal(h.opcode, KVEDGE_OP_FETCH);
        assert_int_equal(h.flags, KVEDGE_WIRE_FLAG_REPLY | KVEDGE_WIRE_FLAG_END);
        assert_int_equal(h.request_id, 7);
        assert_int_equal(h.status, KVEDGE_ECANCELED);
        assert_int_equal(h.count, 2);
        assert_true(took < 100);
        zsock_set_rcvtimeo(raw, 300);
        m = zmsg_recv(raw);
        assert_null(m); /* nothing after the END */
        zsock_destroy(&raw);
    }
    /* Still serving. */
    kvedge_client_t *cl = kt_client(pep, 3000);
    assert_int_equal(s_fetch_status(cl, S_MODEL, 0, S_LAYERS), 0);
    kvedge_client_destroy(&cl);
    kvedge_proxy_destroy(&p);
    s_node_stop(&cloud);
    s_rmrf(root);
}

/* FETCH with packed BLOCK messages (the default), with one block per message (no_pack), and
 * against a proxy that refuses packing as older proxies do (the client falls back): every
 * block verified against what was put each time, the same blocks, and fewer messages only
 * where the proxy packed. The proxy asks its node for packed streams itself. */
static void test_packed_fetch(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-proxy-XXXXXX";
    assert_non_null(mkdtemp(root));
    s_node_t cloud;
    s_node_start(&cloud, root, "cloud1", KVEDGE_ROLE_CLOUD, NULL, NULL);
    kt_ctx_put(&s_ctx, cloud.ep, 0, S_LAYERS, false);
    kvedge_proxy_source_t src[1];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s", cloud.ep);
    s_source(&src[0], spec);
    const uint32_t all = S_LAYERS * S_CHUNKS * S_HEADS;
    for (int old = 0; old < 2; old++) {
        s_proxy_no_pack = old == 1;
        char pep[350];
        kvedge_proxy_t *p = s_proxy(root, src, 1, NULL, NULL, pep, sizeof pep);
        assert_int_equal(kvedge_proxy_wait_sources(p, 1, 5000), 0);
        for (int no_pack = 0; no_pack < 2; no_pack++) {
            s_result_t r;
            s_fetch_pack(pep, 20000, &r, 0, no_pack == 1, true);
            assert_int_equal(r.status, 0);
            assert_int_equal(r.layers, S_LAYERS);
            assert_int_equal(r.blocks, all);
            assert_int_equal(r.mismatches, 0);
            if (old || no_pack)
                assert_int_equal(r.msgs, all); /* one block per message */
            else
                assert_true(r.msgs < all / 2); /* packed (64 KiB blocks: 16 per MiB) */
        }
        kvedge_proxy_destroy(&p);
    }
    s_proxy_no_pack = false;
    s_node_stop(&cloud);
    s_rmrf(root);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    kt_ctx_make(&s_ctx, S_CHUNKS, 11, 3, false);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_cancel_ends_fetch),
        cmocka_unit_test(test_packed_fetch),
        cmocka_unit_test(test_node_registers_its_models),
        cmocka_unit_test(test_peer_sharing_with_directory),
        cmocka_unit_test(test_stale_directory_falls_back),
        cmocka_unit_test(test_partial_layer_not_held),
        cmocka_unit_test(test_corrupt_block_falls_back),
        cmocka_unit_test(test_cloud_killed_mid_request),
        cmocka_unit_test(test_failover_under_a_full_buffer),
        cmocka_unit_test(test_all_sources_down_misses),
        cmocka_unit_test(test_master_restart_resync),
        cmocka_unit_test(test_master_down_at_start_uses_snapshot),
        cmocka_unit_test(test_monitoring),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_ctx_free(&s_ctx);
    return rc;
}
