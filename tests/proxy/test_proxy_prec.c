/* The edge proxy choosing precisions (the cache optimizer, docs/protocol.md "Precisions"):
 * a FETCH that accepts several rungs gets, per layer, the one the planner picks under the
 * request's quality budget, priced with the model's quality profile (--quality); the blocks
 * come at the planned rung (the node derives what it does not hold); a request that accepts
 * only lossless never receives a quantized block; an entropy-coded rung is chosen over a slow
 * link and not over a fast one; the choice is made again mid-request when
 * the source turns out slower than planned; bad precision frames and budgets are refused
 * with KVEDGE_EINVAL and the proxy keeps serving; tc planned on a node without the model's
 * coding basis falls back to the next accepted rung, and comes at tc once the basis is there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "access/frame.h"
#include "clients/lib/kvedge.h"
#include "proxy/plan.h"
#include "proxy/proxy.h"
#include "store/node/node.h"
#include "access/codec/basis.h"
#include "access/codec/prec.h"
#include "access/codec/synth.h"
#include "tests/common/basis_fixture.h"
#include "tests/common/ctx_fx.h"

#define S_MODEL   KT_CTX_MODEL /* built in: 12 layers x 12 heads x 64 */
#define S_HEADS   KT_CTX_HEADS
#define S_LAYERS  KT_CTX_LAYERS
#define S_TOKENS  KT_CTX_TOKENS
#define S_INT8_ID "opt-125m" /* the int8 context: same model, other tokens */

static const kvedge_prec_t S_LOSSLESS = KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 0);
static const kvedge_prec_t S_INT8 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 0);
static const kvedge_prec_t S_INT4 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, 0);
static const kvedge_prec_t S_INT4_EC = KVEDGE_PREC_INT4_G32 | KVEDGE_PREC_EC;

/* Quality costs of the profile the proxy gets (KL, nats): int8 1e-6 on every layer; int4
 * 1e-3 on layer 0 (the sensitive one) and 1e-5 on the others. The ppl column is ten times the
 * KL, in percent. */
#define S_KL_INT8      1e-6
#define S_KL_INT4_L0   1e-3
#define S_KL_INT4_REST 1e-5

typedef struct {
    char root[128];
    kvedge_node_t *node;
    kvedge_proxy_t *proxy;
    char proxy_ep[200];
    kvedge_chunk_id_t id;      /* the lossless context */
    kvedge_chunk_id_t id_int8; /* the int8 context */
} s_env_t;

static s_env_t s_env;

/* ---------------------------------------------------------------- set-up */

static void s_put_context(kvedge_client_t *c, uint32_t seed, kvedge_scheme_t scheme,
                          kvedge_chunk_id_t *id)
{
    uint32_t tok[S_TOKENS];
    for (uint32_t i = 0; i < S_TOKENS; i++)
        tok[i] = seed + 7 * i;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, S_TOKENS, id, 1), 1);
    kt_put_chunk(c, id, S_LAYERS, scheme, seed);
}

/* The profile file: model S_MODEL, 12 layers, rungs int8 and int4-g32. */
static void s_write_profile(const char *path)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"kvedge_quality_profile\": 1, \"model\": \"%s\", \"layers\": %d, "
            "\"rungs\": [\"int8\", \"int4-g32\"], \"per_layer\": [",
            S_MODEL, S_LAYERS);
    for (int l = 0; l < S_LAYERS; l++) {
        double k4 = l == 0 ? S_KL_INT4_L0 : S_KL_INT4_REST;
        fprintf(f,
                "%s{\"layer\": %d, \"ppl_pct\": [%.17g, %.17g], \"kl\": [%.17g, %.17g], "
                "\"agreement\": [1, 0.99]}",
                l ? ", " : "", l, 10 * S_KL_INT8, 10 * k4, S_KL_INT8, k4);
    }
    fprintf(f, "]}\n");
    fclose(f);
}

/* A proxy in front of the node through an emulated link; bw is the bandwidth it is told the
 * link has (its prior), link the link it really gets. */
static void s_proxy_start_margin(const char *link, double bw, uint32_t margin_pct)
{
    kvedge_proxy_destroy(&s_env.proxy); /* a test that failed left its own */
    char spec[600], profile[300];
    snprintf(spec, sizeof spec, "cloud cloud1 %s link=%s bw=%.0f rtt=2000",
             kvedge_node_endpoint(s_env.node), link, bw);
    kvedge_proxy_source_t src;
    assert_int_equal(kvedge_proxy_source_parse(spec, &src), 0);
    snprintf(profile, sizeof profile, "%s/quality.json", s_env.root);
    snprintf(s_env.proxy_ep, sizeof s_env.proxy_ep, "ipc://%s/proxy.sock", s_env.root);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = s_env.proxy_ep;
    po.insecure = true;
    po.id = "proxy-prec";
    po.sources = &src;
    po.nsources = 1;
    po.quality = profile;
    po.quality_margin_pct = margin_pct;
    char why[256] = "";
    if (kvedge_proxy_start(&po, &s_env.proxy, why, sizeof why) != 0)
        fail_msg("proxy: %s", why);
    assert_int_equal(kvedge_proxy_wait_sources(s_env.proxy, 1, 5000), 0);
}

/* The same at the default margin (costs priced at 150 % of the profile's). */
static void s_proxy_start(const char *link, double bw)
{
    s_proxy_start_margin(link, bw, 0);
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_env.root, sizeof s_env.root, "/tmp/kvedge-pprec-XXXXXX");
    if (!mkdtemp(s_env.root))
        return -1;
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s/node", s_env.root);
    snprintf(ns.bind, sizeof ns.bind, "ipc://%s/node.sock", s_env.root);
    char why[256] = "";
    if (kvedge_node_start(&ns, &s_env.node, why, sizeof why) != 0)
        return -1;
    kvedge_client_t *c = kt_client(kvedge_node_endpoint(s_env.node), 10000);
    s_put_context(c, 1000, KVEDGE_SCHEME_LOSSLESS, &s_env.id);
    s_put_context(c, 5000, KVEDGE_SCHEME_INT8, &s_env.id_int8);
    kvedge_client_destroy(&c);
    char profile[300];
    snprintf(profile, sizeof profile, "%s/quality.json", s_env.root);
    s_write_profile(profile);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    kvedge_proxy_destroy(&s_env.proxy);
    kvedge_node_destroy(&s_env.node);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_env.root);
    assert_int_equal(system(cmd), 0);
    return 0;
}

/* ---------------------------------------------------------------- one fetch */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    kvedge_fetch_plan_t plan;
    kvedge_fetch_layer_t layer[S_LAYERS];
    uint32_t layers;
    kvedge_prec_t block_rung[S_LAYERS]; /* every block of the layer at it, else 0xFF */
    uint32_t blocks;
} s_res_t;

static void s_r_plan(void *ctx, const kvedge_fetch_plan_t *p)
{
    ((s_res_t *)ctx)->plan = *p;
}

static void s_r_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source, int status,
                      const uint8_t *data, size_t len)
{
    (void)ci, (void)head, (void)source;
    s_res_t *r = ctx;
    kvedge_block_info_t info;
    kvedge_prec_t rung = 0xFF;
    if (status == 0 && layer < S_LAYERS && kvedge_block_parse(data, len, &info) == 0)
        rung = kvedge_prec_of_block(&info);
    if (layer < S_LAYERS && r->block_rung[layer] != rung)
        r->block_rung[layer] = r->block_rung[layer] == 0 ? rung : 0xFF;
    r->blocks++;
}

static void s_r_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_res_t *r = ctx;
    if (r->layers < S_LAYERS) {
        r->layer[r->layers] = *l;
        r->layer[r->layers].source_name = "";
    }
    r->layers++;
}

static void s_r_done(void *ctx, int status)
{
    s_res_t *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->done = true;
    r->status = status;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* FETCHes layers 0..layers-1 of id; compute_us (per layer, or 0: fetch only). */
static void s_fetch(const kvedge_chunk_id_t *id, uint16_t layers, const kvedge_prec_t *accept,
                    size_t n, kvedge_quality_metric_t metric, double budget, float compute_us,
                    s_res_t *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    float cu[S_LAYERS], ru[S_LAYERS];
    for (int l = 0; l < S_LAYERS; l++) {
        cu[l] = compute_us;
        ru[l] = 1e9f; /* recomputing is never worth it here */
    }
    kvedge_client_t *c = kt_client(s_env.proxy_ep, 30000);
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_MODEL,
                              .chunks = id,
                              .n = 1,
                              .layers = layers,
                              .tokens = S_TOKENS,
                              .compute_us = compute_us > 0 ? cu : NULL,
                              .recompute_us = compute_us > 0 ? ru : NULL,
                              .deadline_ms = 30000,
                              .accept = accept,
                              .n_accept = n,
                              .quality_metric = metric,
                              .quality_budget = budget};
    kvedge_fetch_cbs_t cbs = {s_r_plan, s_r_block, s_r_layer, s_r_done};
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, r), 0);
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    kvedge_client_destroy(&c);
}

static double s_kl(int layer, kvedge_prec_t rung)
{
    if (rung == S_INT8)
        return S_KL_INT8;
    if (rung == S_INT4)
        return layer == 0 ? S_KL_INT4_L0 : S_KL_INT4_REST;
    return 0;
}

/* ---------------------------------------------------------------- tests */

/* Over a slow link (20 Mbit/s, known to the proxy) the fastest plan is the coarsest rung
 * everywhere; a KL budget of 2e-4 cannot pay for int4 on layer 0 (1e-3, priced 1.5e-3 at the
 * default margin of 150 %), so that layer goes int8 (the next coarsest), and the others int4:
 * 1.5 x (1e-6 + 3 x 1e-5) = 4.65e-5 <= 2e-4. At a margin of 1000 % an int4 layer costs 1e-4
 * and an int8 one 1e-5: one int4 layer fits (1.3e-4), two do not (2.2e-4). */
static void test_budget_picks_per_layer(void **state)
{
    (void)state;
    s_proxy_start("20mbit,1ms", 2.5e6);
    const kvedge_prec_t accept[] = {S_LOSSLESS, S_INT8, S_INT4};
    s_res_t r;
    s_fetch(&s_env.id, 4, accept, 3, KVEDGE_QUALITY_KL, 2e-4, 0, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, 4);
    double used = 0;
    for (int l = 0; l < 4; l++) {
        kvedge_prec_t want = l == 0 ? S_INT8 : S_INT4;
        assert_int_equal(r.plan.layer[l].source, 0);
        assert_int_equal(r.plan.layer[l].prec, want);
        assert_int_equal(r.plan.layer[l].prec_reason,
                         l == 0 ? KVEDGE_PLAN_PREC_BUDGET : KVEDGE_PLAN_PREC_COARSER_FASTER);
        assert_int_equal(r.layer[l].status, 0);
        assert_int_equal(r.layer[l].prec, want);
        assert_int_equal(r.block_rung[l], want); /* derived by the node from lossless */
        used += s_kl(l, want);
    }
    assert_true(used <= 2e-4);
    assert_int_equal(r.blocks, 4 * S_HEADS);
    /* Priced at ten times the profile: exactly one int4 layer, the others int8. */
    s_proxy_start_margin("20mbit,1ms", 2.5e6, 1000);
    s_fetch(&s_env.id, 4, accept, 3, KVEDGE_QUALITY_KL, 2e-4, 0, &r);
    assert_int_equal(r.status, 0);
    uint32_t int4_layers = 0;
    double priced = 0;
    for (int l = 0; l < 4; l++) {
        assert_int_equal(r.layer[l].status, 0);
        assert_int_equal(r.block_rung[l], r.plan.layer[l].prec);
        int4_layers += r.plan.layer[l].prec == S_INT4;
        priced += 10 * s_kl(l, r.plan.layer[l].prec);
    }
    assert_int_equal(r.plan.layer[0].prec, S_INT8);
    assert_int_equal(int4_layers, 1);
    assert_true(priced <= 2e-4);
    s_proxy_start("20mbit,1ms", 2.5e6);
    /* No budget: any accepted rung, the fastest: int4 everywhere. */
    s_fetch(&s_env.id, 4, accept, 3, KVEDGE_QUALITY_NONE, 0, 0, &r);
    assert_int_equal(r.status, 0);
    for (int l = 0; l < 4; l++) {
        assert_int_equal(r.plan.layer[l].prec, S_INT4);
        assert_int_equal(r.block_rung[l], S_INT4);
    }
    /* Budget 0: only what costs nothing, lossless. */
    s_fetch(&s_env.id, 4, accept, 3, KVEDGE_QUALITY_KL, 0, 0, &r);
    assert_int_equal(r.status, 0);
    for (int l = 0; l < 4; l++) {
        assert_int_equal(r.plan.layer[l].prec, S_LOSSLESS);
        assert_int_equal(r.block_rung[l], S_LOSSLESS);
    }
    /* Without a precision frame: the blocks as stored, no rung in the records. */
    s_fetch(&s_env.id, 2, NULL, 0, KVEDGE_QUALITY_NONE, 0, 0, &r);
    assert_int_equal(r.status, 0);
    for (int l = 0; l < 2; l++) {
        assert_int_equal(r.plan.layer[l].prec, 0);
        assert_int_equal(r.layer[l].prec, 0);
        assert_int_equal(r.block_rung[l], S_LOSSLESS);
    }
    kvedge_proxy_destroy(&s_env.proxy);
}

/* int4-g32 against int4-g32+ec (the same values, priced from the profile's int4-g32 row): the
 * coded rung sends KVEDGE_PREC_EC_RATIO_INT4 (0.95) of the bytes and costs the client
 * KVEDGE_PREC_EC_DECODE_US_PER_BYTE_INT4 per byte received to decode. Per KB of the plain
 * rung, over 20 Mbit/s (2.5 B/us) the 50 bytes it saves are worth 20 us against 5.8 us of
 * decoding: every layer comes coded, derived by the node from the lossless blocks. Over
 * 1 Gbit/s (125 B/us) they are worth 0.4 us: every layer is planned plain. */
static void test_coded_rung_only_on_a_slow_link(void **state)
{
    (void)state;
    const kvedge_prec_t accept[] = {S_INT4, S_INT4_EC};
    s_res_t r;
    s_proxy_start("20mbit,1ms", 2.5e6);
    s_fetch(&s_env.id, 4, accept, 2, KVEDGE_QUALITY_KL, 1.0, 0, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, 4);
    for (int l = 0; l < 4; l++) {
        assert_int_equal(r.plan.layer[l].prec, S_INT4_EC);
        assert_int_equal(r.layer[l].status, 0);
        assert_int_equal(r.layer[l].prec, S_INT4_EC);
        assert_int_equal(r.block_rung[l], S_INT4_EC); /* coded by the node */
    }
    assert_int_equal(r.blocks, 4 * S_HEADS);
    s_proxy_start("1gbit,1ms", 1.25e8);
    s_fetch(&s_env.id, 4, accept, 2, KVEDGE_QUALITY_KL, 1.0, 0, &r);
    assert_int_equal(r.status, 0);
    for (int l = 0; l < 4; l++) {
        assert_int_equal(r.plan.layer[l].prec, S_INT4);
        assert_int_equal(r.layer[l].status, 0);
    }
    kvedge_proxy_destroy(&s_env.proxy);
}

/* A request that accepts only lossless, of a context stored int8: every layer is a miss (the
 * client computes it), and not one quantized block reaches it. */
static void test_lossless_only_never_quantized(void **state)
{
    (void)state;
    s_proxy_start("1gbit,1ms", 1.25e8);
    const kvedge_prec_t accept[] = {S_LOSSLESS};
    s_res_t r;
    s_fetch(&s_env.id_int8, 3, accept, 1, KVEDGE_QUALITY_NONE, 0, 0, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, 3);
    assert_int_equal(r.blocks, 0);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(r.layer[l].status, KVEDGE_ENOTFOUND);
        assert_int_equal(r.layer[l].prec, 0);
    }
    /* The same context with int8 accepted too: served as stored. */
    const kvedge_prec_t both[] = {S_LOSSLESS, S_INT8};
    s_fetch(&s_env.id_int8, 3, both, 2, KVEDGE_QUALITY_NONE, 0, 0, &r);
    assert_int_equal(r.status, 0);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(r.layer[l].status, 0);
        assert_int_equal(r.block_rung[l], S_INT8);
    }
    kvedge_proxy_destroy(&s_env.proxy);
}

/* The proxy believes the link does 100 MB/s; it does 40 Mbit/s (5 MB/s). With the decoder's times
 * in the request (25 ms a layer), the first plan fetches lossless wherever the transfer hides
 * behind the decoder; once the first layers measure the link, the layers not yet asked for
 * are planned again, at int4 (reason replan:bandwidth), and the request still meets its
 * budget. */
static void test_bandwidth_drop_rechooses(void **state)
{
    (void)state;
    s_proxy_start("40mbit,1ms", 1e8);
    const kvedge_prec_t accept[] = {S_LOSSLESS, S_INT8, S_INT4};
    s_res_t r;
    s_fetch(&s_env.id, S_LAYERS, accept, 3, KVEDGE_QUALITY_KL, 2e-4, 25000, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    kvedge_proxy_stats_t st;
    kvedge_proxy_stats(s_env.proxy, &st);
    assert_true(st.replans >= 1);
    uint32_t replanned = 0, lossless_planned = 0;
    double used = 0;
    for (int l = 0; l < S_LAYERS; l++) {
        assert_int_equal(r.layer[l].status, 0);
        lossless_planned += r.plan.layer[l].prec == S_LOSSLESS;
        if (r.layer[l].reason == KVEDGE_FETCH_REPLAN_BANDWIDTH) {
            replanned++;
            assert_int_not_equal(r.layer[l].prec, S_LOSSLESS); /* coarser than first planned */
        }
        assert_int_equal(r.block_rung[l], r.layer[l].prec); /* what the record says came */
        used += s_kl(l, r.layer[l].prec);
    }
    assert_true(lossless_planned >= 1); /* the first plan trusted the fast link */
    assert_true(replanned >= 1);
    assert_true(used <= 2e-4);
    kvedge_proxy_destroy(&s_env.proxy);
}

/* tc over a slow link: the fastest rung, planned first. A node without the model's coding
 * basis answers the tc-only ask missing, and the proxy plans the layer again at the node's
 * other accepted rung (int8); once the basis is loaded (this process's registry is the
 * node's), the node derives tc and the blocks come at tc. Runs last: it registers a basis. */
static void test_tc_without_basis_falls_back(void **state)
{
    (void)state;
    const kvedge_prec_t tc = KVEDGE_PREC_MAKE(KVEDGE_PREC_TC, 0);
    const kvedge_prec_t accept[] = {tc, S_INT8};
    assert_null(kvedge_basis_find_model(S_MODEL));
    s_proxy_start("20mbit,1ms", 2.5e6);
    s_res_t r;
    s_fetch(&s_env.id, 3, accept, 2, KVEDGE_QUALITY_NONE, 0, 0, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, 3);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(r.plan.layer[l].prec, tc);
        assert_int_equal(r.layer[l].status, 0);
        assert_int_equal(r.layer[l].prec, S_INT8);
        assert_int_equal(r.layer[l].reason, KVEDGE_FETCH_FALLBACK_MISSING);
        assert_int_equal(r.block_rung[l], S_INT8);
    }
    char dir[200], path[260];
    snprintf(dir, sizeof dir, "%s/bases", s_env.root);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/opt.kvb", dir);
    assert_int_equal(kt_basis_write(path, S_MODEL, S_LAYERS, S_HEADS, 64, 0.125f, 9), 0);
    assert_int_equal(kvedge_basis_load_dir(dir, NULL, NULL, 0), 0);
    s_fetch(&s_env.id, 3, accept, 2, KVEDGE_QUALITY_NONE, 0, 0, &r);
    assert_int_equal(r.status, 0);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(r.layer[l].status, 0);
        assert_int_equal(r.layer[l].prec, tc);
        assert_int_equal(r.layer[l].reason, KVEDGE_FETCH_PLANNED);
        assert_int_equal(r.block_rung[l], tc);
    }
    kvedge_proxy_destroy(&s_env.proxy);
}

/* A raw FETCH whose precision frame is well formed but means nothing usable: EINVAL. */
static int32_t s_raw_fetch(zsock_t *s, const kvedge_wire_fetch_prec_t *pr)
{
    static uint64_t rid = 500;
    kvedge_wire_header_t h = {1, KVEDGE_OP_FETCH, 0, ++rid, 0, 1, 64, 5000}; /* credit for all */
    uint8_t hb[KVEDGE_WIRE_HEADER_BYTES], sb[KVEDGE_WIRE_FETCH_SPEC_BYTES];
    uint8_t pf[KVEDGE_WIRE_FETCH_PREC_HDR_BYTES + KVEDGE_WIRE_MAX_ACCEPT];
    size_t plen = 0;
    kvedge_wire_header_pack(&h, hb);
    kvedge_wire_fetch_spec_t spec = {
        .first_layer = 0, .layers = 2, .tokens = S_TOKENS, .flags = KVEDGE_WIRE_FETCH_FLAG_PREC};
    snprintf(spec.model_id, sizeof spec.model_id, "%s", S_MODEL);
    assert_int_equal(kvedge_wire_fetch_spec_pack(&spec, sb), 0);
    assert_int_equal(kvedge_wire_fetch_prec_pack(pr, pf, &plen), 0);
    zmsg_t *m = zmsg_new();
    zmsg_addmem(m, hb, sizeof hb);
    zmsg_addmem(m, sb, sizeof sb);
    zmsg_addmem(m, s_env.id.bytes, KVEDGE_CHUNK_ID_BYTES);
    zmsg_addmem(m, pf, plen);
    assert_int_equal(zmsg_send(&m, s), 0);
    while (true) {
        zmsg_t *rep = zmsg_recv(s);
        if (!rep)
            fail_msg("no reply from the proxy (metric %d, %u rungs, budget %g)", (int)pr->metric,
                     pr->n, pr->budget);
        kvedge_wire_header_t rh;
        zframe_t *f = zmsg_first(rep);
        assert_int_equal(kvedge_wire_header_parse(zframe_data(f), zframe_size(f), &rh), 0);
        zmsg_destroy(&rep);
        if (rh.flags & KVEDGE_WIRE_FLAG_END)
            return rh.status;
    }
}

static void test_bad_precision_requests(void **state)
{
    (void)state;
    s_proxy_start("1gbit,1ms", 1.25e8);
    zsock_t *s = zsock_new(ZMQ_DEALER);
    zsock_set_linger(s, 0);
    zsock_set_rcvtimeo(s, 5000);
    assert_int_equal(zsock_connect(s, "%s", s_env.proxy_ep), 0);
    kvedge_wire_fetch_prec_t good = {KVEDGE_QUALITY_KL, 2, {S_INT8, S_INT4}, 1e-4};
    kvedge_wire_fetch_prec_t bad[] = {
        {KVEDGE_QUALITY_KL, 0, {0}, 1e-4},              /* empty */
        {KVEDGE_QUALITY_KL, 2, {S_INT8, S_INT8}, 1e-4}, /* contradictory */
        {KVEDGE_QUALITY_KL, 1, {0x7F}, 1e-4},           /* unknown */
        {KVEDGE_QUALITY_PPL_PCT, 1, {S_INT8}, 200},     /* budget out of bounds */
        {KVEDGE_QUALITY_KL, 1, {S_INT8}, -1},           /* negative */
        {(kvedge_quality_metric_t)7, 1, {S_INT8}, 1},   /* unknown metric */
        {KVEDGE_QUALITY_NONE, 1, {S_INT8}, 1},          /* a budget without a metric */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(s_raw_fetch(s, &bad[i]), KVEDGE_EINVAL);
    assert_int_equal(s_raw_fetch(s, &good), 0);
    zsock_destroy(&s);
    /* The client library refuses the same before sending. */
    kvedge_client_t *c = kt_client(s_env.proxy_ep, 5000);
    s_res_t r;
    kvedge_fetch_cbs_t cbs = {s_r_plan, s_r_block, s_r_layer, s_r_done};
    const kvedge_prec_t dup[] = {S_INT8, S_INT8};
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_MODEL,
                              .chunks = &s_env.id,
                              .n = 1,
                              .layers = 2,
                              .accept = dup,
                              .n_accept = 2};
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, &r), KVEDGE_EINVAL);
    req.n_accept = 1;
    req.quality_metric = KVEDGE_QUALITY_PPL_PCT;
    req.quality_budget = 101;
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, &r), KVEDGE_EINVAL);
    req.accept = NULL;
    req.n_accept = 0;
    req.quality_budget = 1;
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, &r), KVEDGE_EINVAL);
    kvedge_client_destroy(&c);
    /* And the proxy still serves. */
    const kvedge_prec_t accept[] = {S_INT8};
    s_fetch(&s_env.id, 2, accept, 1, KVEDGE_QUALITY_NONE, 0, 0, &r);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.block_rung[0], S_INT8);
    kvedge_proxy_destroy(&s_env.proxy);
}

/* A proxy refuses to start on a profile it cannot read, and says why. */
static void test_bad_profile_refused(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/bad.json", s_env.root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"kvedge_quality_profile\": 1, \"model\": \"x\", \"layers\": 2, \"rungs\": [\"int8\"], "
          "\"per_layer\": [{\"layer\": 0, \"ppl_pct\": [0], \"kl\": [0], \"agreement\": [1]}]}",
          f);
    fclose(f);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    char ep[300];
    snprintf(ep, sizeof ep, "ipc://%s/proxy-bad.sock", s_env.root);
    po.bind = ep;
    po.insecure = true;
    po.quality = path;
    char why[256] = "";
    kvedge_proxy_t *p = NULL;
    po.quality_margin_pct = 99; /* below the mean: refused */
    assert_int_equal(kvedge_proxy_start(&po, &p, why, sizeof why), KVEDGE_EINVAL);
    assert_null(p);
    po.quality_margin_pct = 0;
    assert_int_equal(kvedge_proxy_start(&po, &p, why, sizeof why), KVEDGE_EINVAL);
    assert_null(p);
    assert_non_null(strstr(why, "bad.json"));
    snprintf(path, sizeof path, "%s/missing.json", s_env.root);
    po.quality = path;
    assert_int_not_equal(kvedge_proxy_start(&po, &p, why, sizeof why), 0);
    assert_null(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_picks_per_layer),
        cmocka_unit_test(test_coded_rung_only_on_a_slow_link),
        cmocka_unit_test(test_lossless_only_never_quantized),
        cmocka_unit_test(test_bandwidth_drop_rechooses),
        cmocka_unit_test(test_bad_precision_requests),
        cmocka_unit_test(test_bad_profile_refused),
        cmocka_unit_test(test_tc_without_basis_falls_back),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
