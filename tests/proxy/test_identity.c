/* The proxy's identity: at start it prints its public key and the tenant its certificate
 * carries; a context stored under tenant A, fetched through a proxy whose key the node files
 * under tenant B, misses everywhere although the master's directory says the node holds it, and
 * the proxy says that the tenant is the likely cause. With a key of tenant A the same fetch is
 * served and nothing is said. A model id two tenants registered with two shapes is planned
 * and served in each tenant's own shape through its proxy. */
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

#include "runtime/log.h"
#include "access/transport.h"
#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "proxy/settings.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "access/codec/synth.h"
#include "tests/common/logcap.h"
#include "tests/common/testutil.h"

#define S_MODEL  "opt-125m" /* built in: 12 layers x 12 heads x 64 */
#define S_HEADS  12
#define S_TOKENS 256

/* ---------------------------------------------------------------- captured log lines */

static kt_log_t s_log = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---------------------------------------------------------------- the topology */

typedef struct {
    char root[64];
    char clients[128]; /* the node's allowlist */
    char writer[128];  /* tenant acme: stores the context */
    char proxy_b[128]; /* tenant other */
    char proxy_a[128]; /* tenant acme */
    kvedge_master_t *master;
    char mep[128], mpub[128];
    kvedge_node_t *node;
    kvedge_chunk_id_t id;
} s_fx_t;

static void s_keygen(const char *path, const char *tenant, const char *clients)
{
    zcert_t *c = zcert_new();
    zcert_set_meta(c, "tenant", "%s", tenant);
    assert_int_equal(zcert_save(c, path), 0);
    char pub[256];
    snprintf(pub, sizeof pub, "%s/%s", clients, strrchr(path, '/') + 1);
    assert_int_equal(zcert_save_public(c, pub), 0);
    zcert_destroy(&c);
}

/* Puts layer 0 of one chunk (every head) as the writer, tenant acme. */
static void s_put(s_fx_t *fx)
{
    uint32_t tok[S_TOKENS];
    for (uint32_t i = 0; i < S_TOKENS; i++)
        tok[i] = 7 * i + 1;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, S_TOKENS, &fx->id, 1), 1);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, S_TOKENS, 64, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    static uint16_t k[S_TOKENS * 64], v[S_TOKENS * 64];
    uint8_t *blocks[S_HEADS];
    kvedge_put_item_t items[S_HEADS];
    for (uint32_t h = 0; h < S_HEADS; h++) {
        blocks[h] = malloc(cap);
        assert_int_equal(kvedge_synth_head(h, 0, S_TOKENS, 64, KVEDGE_DTYPE_FP16, k, v), 0);
        memset(&items[h], 0, sizeof items[h]);
        assert_int_equal(kvedge_block_encode(&spec, k, v, blocks[h], cap, &items[h].len), 0);
        items[h].chunk.id = fx->id;
        snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, S_MODEL);
        items[h].chunk.tokens = S_TOKENS;
        items[h].head = (uint16_t)h;
        items[h].block = blocks[h];
    }
    char secret[160];
    snprintf(secret, sizeof secret, "%s_secret", fx->writer);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = kvedge_node_endpoint(fx->node);
    o.server_key = kvedge_node_public_key(fx->node);
    o.client_cert = secret;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_OK);
    assert_int_equal(kvedge_client_put(c, items, S_HEADS, NULL), KVEDGE_OK);
    kvedge_client_destroy(&c);
    for (uint32_t h = 0; h < S_HEADS; h++)
        free(blocks[h]);
    uint32_t changed = 0;
    assert_int_equal(kvedge_node_publish(fx->node, &changed), KVEDGE_OK);
}

static int s_setup(void **state)
{
    s_fx_t *fx = calloc(1, sizeof *fx);
    snprintf(fx->root, sizeof fx->root, "/tmp/kvedge-identity-XXXXXX");
    if (!fx || !mkdtemp(fx->root))
        return -1;
    snprintf(fx->clients, sizeof fx->clients, "%s/clients", fx->root);
    snprintf(fx->writer, sizeof fx->writer, "%s/keys/writer", fx->root);
    snprintf(fx->proxy_b, sizeof fx->proxy_b, "%s/keys/proxy-b", fx->root);
    snprintf(fx->proxy_a, sizeof fx->proxy_a, "%s/keys/proxy-a", fx->root);
    zsys_dir_create("%s", fx->clients);
    zsys_dir_create("%s/keys", fx->root);
    s_keygen(fx->writer, "acme", fx->clients);
    s_keygen(fx->proxy_b, "other", fx->clients);
    s_keygen(fx->proxy_a, "acme", fx->clients);

    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    char mdata[128];
    snprintf(mdata, sizeof mdata, "%s/master", fx->root);
    snprintf(fx->mep, sizeof fx->mep, "ipc://%s/m.sock", fx->root);
    snprintf(fx->mpub, sizeof fx->mpub, "ipc://%s/mp.sock", fx->root);
    mo.bind = fx->mep;
    mo.pub = fx->mpub;
    mo.data_dir = mdata;
    mo.insecure = true;
    if (kvedge_master_start(&mo, &fx->master, NULL, 0) != KVEDGE_OK)
        return -1;

    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s/node", fx->root);
    snprintf(ns.bind, sizeof ns.bind, "tcp://127.0.0.1:*");
    snprintf(ns.clients, sizeof ns.clients, "%s", fx->clients);
    snprintf(ns.master, sizeof ns.master, "%s", fx->mep);
    snprintf(ns.master_pub, sizeof ns.master_pub, "%s", fx->mpub);
    snprintf(ns.node_id, sizeof ns.node_id, "n1");
    ns.dir_interval_ms = 100;
    char why[512] = "";
    if (kvedge_node_start(&ns, &fx->node, why, sizeof why) != KVEDGE_OK) {
        fprintf(stderr, "node: %s\n", why);
        return -1;
    }
    kvedge_log_set_level(KVEDGE_LOG_INFO);
    kvedge_log_set_sink(kt_log_sink, &s_log);
    *state = fx;
    return 0;
}

static int s_teardown(void **state)
{
    s_fx_t *fx = *state;
    kvedge_log_set_sink(NULL, NULL);
    kt_log_clear(&s_log);
    kvedge_node_destroy(&fx->node);
    kvedge_master_destroy(&fx->master);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx->root);
    int rc = system(cmd);
    free(fx);
    return rc == 0 ? 0 : -1;
}

/* A proxy with the certificate cert, the node as a static source (its registered id, so the
 * directory applies) and the master. */
static kvedge_proxy_t *s_proxy(s_fx_t *fx, const char *cert, char *ep, size_t ep_len)
{
    kvedge_proxy_settings_t s;
    kvedge_proxy_settings_default(&s);
    snprintf(ep, ep_len, "ipc://%s/proxy-%s.sock", fx->root, strrchr(cert, '-') + 1);
    snprintf(s.bind, sizeof s.bind, "%s", ep);
    s.insecure = true;
    snprintf(s.id, sizeof s.id, "edge-proxy");
    snprintf(s.source[0], sizeof s.source[0], "cloud n1 %s key=%s", kvedge_node_endpoint(fx->node),
             kvedge_node_public_key(fx->node));
    s.nsource = 1;
    snprintf(s.master, sizeof s.master, "%s", fx->mep);
    snprintf(s.master_pub, sizeof s.master_pub, "%s", fx->mpub);
    snprintf(s.cert, sizeof s.cert, "%s", cert);
    snprintf(s.metrics, sizeof s.metrics, "off");
    kvedge_proxy_t *p = NULL;
    char why[512] = "";
    if (kvedge_proxy_settings_start(&s, &p, why, sizeof why) != KVEDGE_OK)
        fail_msg("proxy: %s", why);
    assert_int_equal(kvedge_proxy_wait_sources(p, 1, 5000), KVEDGE_OK);
    /* The proxy's view catches up with the directory. */
    assert_int_equal(kvedge_proxy_wait_view(p, kvedge_master_seq(fx->master), KT_WAIT_MS), 0);
    return p;
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    uint32_t layers, served, blocks;
} s_result_t;

static void s_r_plan(void *ctx, const kvedge_fetch_plan_t *p)
{
    (void)ctx;
    (void)p;
}

static void s_r_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source, int status,
                      const uint8_t *data, size_t len)
{
    (void)layer, (void)ci, (void)head, (void)source, (void)data, (void)len;
    s_result_t *r = ctx;
    r->blocks += status == 0;
}

static void s_r_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_result_t *r = ctx;
    r->layers++;
    r->served += l->source >= 0;
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

/* Fetches the first `layers` layers of chunk id of model_id through the proxy at ep. */
static void s_fetch_layers(const char *ep, const char *model_id, const kvedge_chunk_id_t *id,
                           uint16_t layers, s_result_t *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = 5000;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_OK);
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = model_id,
                              .chunks = id,
                              .n = 1,
                              .first_layer = 0,
                              .layers = layers,
                              .tokens = S_TOKENS,
                              .deadline_ms = 5000};
    kvedge_fetch_cbs_t cbs = {s_r_plan, s_r_block, s_r_layer, s_r_done};
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, r), KVEDGE_OK);
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    kvedge_client_destroy(&c);
}

/* Fetches layer 0 of the chunk through the proxy at ep. */
static void s_fetch(s_fx_t *fx, const char *ep, s_result_t *r)
{
    s_fetch_layers(ep, S_MODEL, &fx->id, 1, r);
}

static void test_wrong_tenant_is_named(void **state)
{
    s_fx_t *fx = *state;
    s_put(fx);
    char ep[256];
    kvedge_proxy_t *p = s_proxy(fx, fx->proxy_b, ep, sizeof ep);
    assert_int_equal(
        kt_log_count(&s_log, "proxy public key", fx->proxy_b, "with tenant other", NULL), 1);
    s_result_t r;
    s_fetch(fx, ep, &r);
    assert_int_equal(r.status, KVEDGE_OK);
    assert_int_equal(r.layers, 1);
    assert_int_equal(r.served, 0); /* the node files the proxy under "other": nothing there */
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
    kvedge_chunk_id_hex(&fx->id, hex);
    assert_int_equal(kt_log_count(&s_log, "source n1 holds chunk", hex,
                                  "not in this proxy's tenant", fx->proxy_b, NULL),
                     1);
    kvedge_proxy_destroy(&p);
}

static void test_right_tenant_is_served(void **state)
{
    s_fx_t *fx = *state;
    s_put(fx);
    char ep[256];
    kvedge_proxy_t *p = s_proxy(fx, fx->proxy_a, ep, sizeof ep);
    assert_int_equal(
        kt_log_count(&s_log, "proxy public key", fx->proxy_a, "with tenant acme", NULL), 1);
    s_result_t r;
    s_fetch(fx, ep, &r);
    assert_int_equal(r.status, KVEDGE_OK);
    assert_int_equal(r.served, 1);
    assert_int_equal(r.blocks, S_HEADS);
    assert_int_equal(kt_log_count(&s_log, "not in this proxy's tenant", NULL), 0);
    kvedge_proxy_destroy(&p);
}

/* Puts every layer and head of one chunk of model m as the client with certificate cert,
 * registering m first; returns its id. */
static kvedge_chunk_id_t s_chunk_of(const char *model_id)
{
    uint32_t tok[S_TOKENS];
    for (uint32_t i = 0; i < S_TOKENS; i++)
        tok[i] = 11 * i + 3;
    kvedge_chunk_id_t id;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, model_id, tok, S_TOKENS, S_TOKENS, &id, 1), 1);
    return id;
}

static kvedge_chunk_id_t s_put_shape(s_fx_t *fx, const char *cert, const kvedge_model_t *m)
{
    kvedge_chunk_id_t id = s_chunk_of(m->id);
    char secret[160];
    snprintf(secret, sizeof secret, "%s_secret", cert);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = kvedge_node_endpoint(fx->node);
    o.server_key = kvedge_node_public_key(fx->node);
    o.client_cert = secret;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_OK);
    assert_int_equal(kvedge_client_put_model(c, m), KVEDGE_OK);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, S_TOKENS, m->head_dim, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint16_t *k = malloc((size_t)S_TOKENS * m->head_dim * 2);
    uint16_t *v = malloc((size_t)S_TOKENS * m->head_dim * 2);
    uint8_t *blocks = malloc(cap);
    assert_non_null(k);
    assert_non_null(v);
    assert_non_null(blocks);
    for (uint16_t l = 0; l < m->layers; l++)
        for (uint16_t h = 0; h < m->kv_heads; h++) {
            kvedge_put_item_t item;
            memset(&item, 0, sizeof item);
            assert_int_equal(
                kvedge_synth_head(l * 100u + h, 0, S_TOKENS, m->head_dim, KVEDGE_DTYPE_FP16, k, v),
                0);
            assert_int_equal(kvedge_block_encode(&spec, k, v, blocks, cap, &item.len), 0);
            item.chunk.id = id;
            snprintf(item.chunk.model_id, sizeof item.chunk.model_id, "%s", m->id);
            item.chunk.tokens = S_TOKENS;
            item.layer = l;
            item.head = h;
            item.block = blocks;
            assert_int_equal(kvedge_client_put(c, &item, 1, NULL), KVEDGE_OK);
        }
    free(blocks);
    free(v);
    free(k);
    kvedge_client_destroy(&c);
    return id;
}

/* Fetches every layer of chunk id of model m through the proxy at ep. */
static void s_fetch_model(const char *ep, const kvedge_model_t *m, const kvedge_chunk_id_t *id,
                          s_result_t *r)
{
    s_fetch_layers(ep, m->id, id, m->layers, r);
}

/* Two tenants register the same model id with two shapes on the node and store the same
 * tokens under it; the node publishes each tenant's shape under its tenant
 * (tmodel/<tag>/<id>), and each tenant's proxy plans and serves the tenant's own shape. The
 * one directory entry of the shared client chunk id says every layer either holds: the model
 * with fewer layers is given to the tenant whose chunk the node lists last (stored ids in
 * key order), the order in which a merge could cut the other's layers. */
static void test_tenant_models_through_proxy(void **state)
{
    s_fx_t *fx = *state;
    kvedge_model_t big = {
        .id = "m", .layers = 3, .kv_heads = 2, .head_dim = 64, .dtype = KVEDGE_DTYPE_FP16};
    kvedge_model_t small = {
        .id = "m", .layers = 2, .kv_heads = 4, .head_dim = 32, .dtype = KVEDGE_DTYPE_FP16};
    kvedge_chunk_id_t client = s_chunk_of("m"), sa, sb;
    uint8_t ta[16], tb[16];
    kvedge_tenant_tag("acme", ta);
    kvedge_tenant_tag("other", tb);
    kvedge_tenant_chunk_id(ta, &client, &sa);
    kvedge_tenant_chunk_id(tb, &client, &sb);
    bool acme_first = memcmp(sa.bytes, sb.bytes, sizeof sa.bytes) < 0;
    kvedge_model_t ma = acme_first ? big : small, mb = acme_first ? small : big;
    kvedge_chunk_id_t idb = s_put_shape(fx, fx->proxy_b, &mb); /* tenant other, first */
    kvedge_chunk_id_t ida = s_put_shape(fx, fx->writer, &ma);  /* tenant acme */
    assert_memory_equal(&ida, &idb, sizeof ida);
    uint32_t changed = 0;
    assert_int_equal(kvedge_node_publish(fx->node, &changed), KVEDGE_OK);

    char ep[256];
    s_result_t r;
    kvedge_proxy_t *p = s_proxy(fx, fx->proxy_a, ep, sizeof ep);
    s_fetch_model(ep, &ma, &ida, &r);
    assert_int_equal(r.status, KVEDGE_OK);
    assert_int_equal(r.layers, ma.layers);
    assert_int_equal(r.served, ma.layers);
    assert_int_equal(r.blocks, ma.layers * ma.kv_heads);
    kvedge_proxy_destroy(&p);

    p = s_proxy(fx, fx->proxy_b, ep, sizeof ep);
    s_fetch_model(ep, &mb, &idb, &r);
    assert_int_equal(r.status, KVEDGE_OK);
    assert_int_equal(r.layers, mb.layers);
    assert_int_equal(r.served, mb.layers);
    assert_int_equal(r.blocks, mb.layers * mb.kv_heads);
    kvedge_proxy_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_wrong_tenant_is_named, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_right_tenant_is_served, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_tenant_models_through_proxy, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
