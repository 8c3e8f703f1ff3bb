/* The historical cache: an edge copies a subscribed context from a cloud node, pinned; serves
 * it to local clients of the subscribed tenant; keeps serving it with the cloud gone, and says
 * what it holds then (the status, the scheduler's log, `kvedge sync`); copies only what changed
 * on the next pass; and the subscription file is parsed strictly. */
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
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/log.h"
#include "store/node/server.h"
#include "store/node/hsync.h"
#include "clients/lib/kvedge.h"
#include "access/codec/synth.h"
#include "tests/common/shell.h"
#include "tests/common/testutil.h"

#define S_MODEL  "opt-125m" /* built in: 12 layers x 12 heads x 64 */
#define S_HEADS  12
#define S_LAYERS 12

typedef struct {
    char dir[200];
    char cloud_ep[250];
    char edge_ep[250];
    kvedge_engine_t *cloud_engine, *edge_engine;
    kvedge_server_t *cloud, *edge;
} s_fx_t;

static kvedge_server_t *s_serve(kvedge_engine_t *e, const char *ep)
{
    kvedge_server_opts_t so = {
        .role = KVEDGE_ROLE_CLOUD, .bind = ep, .insecure = true, .workers = 2, .engine = e};
    kvedge_server_t *s = NULL;
    char why[256];
    if (kvedge_server_start(&so, &s, why, sizeof why) != 0)
        fail_msg("start %s: %s", ep, why);
    return s;
}

static int s_setup(void **state)
{
    s_fx_t *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/kvedge-hsync-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    char p[400];
    snprintf(p, sizeof p, "%s/cloud", f->dir);
    if (kvedge_engine_open(p, NULL, &f->cloud_engine, NULL, 0) != 0)
        return -1;
    snprintf(p, sizeof p, "%s/edge", f->dir);
    if (kvedge_engine_open(p, NULL, &f->edge_engine, NULL, 0) != 0)
        return -1;
    /* ipc endpoints: a dead node's tcp port could be taken by another test's node */
    snprintf(f->cloud_ep, sizeof f->cloud_ep, "ipc://%.200s/cloud.sock", f->dir);
    snprintf(f->edge_ep, sizeof f->edge_ep, "ipc://%.200s/edge.sock", f->dir);
    f->cloud = s_serve(f->cloud_engine, f->cloud_ep);
    *state = f;
    return 0;
}

static int s_teardown(void **state)
{
    s_fx_t *f = *state;
    kvedge_server_destroy(&f->edge);
    kvedge_server_destroy(&f->cloud);
    kvedge_engine_destroy(&f->edge_engine);
    kvedge_engine_destroy(&f->cloud_engine);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

static kvedge_client_t *s_client(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = 2000;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    return c;
}

/* Puts layers [l0, l1) of a 2-chunk context of model; returns the chain ids. */
static void s_put_context_of(kvedge_client_t *c, const char *model, uint32_t l0, uint32_t l1,
                             kvedge_chunk_id_t ids[2])
{
    uint32_t tok[512];
    for (uint32_t i = 0; i < 512; i++)
        tok[i] = 7 * i + 1;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, model, tok, 512, 0, ids, 2), 2);
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT4, 256, 64, 32, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blocks = malloc(cap * S_HEADS);
    uint16_t k[256 * 64], v[256 * 64];
    kvedge_put_item_t items[S_HEADS];
    for (uint32_t ci = 0; ci < 2; ci++)
        for (uint32_t l = l0; l < l1; l++) {
            for (uint32_t h = 0; h < S_HEADS; h++) {
                assert_int_equal(
                    kvedge_synth_head(ci * 1000 + l * 16 + h, 0, 256, 64, KVEDGE_DTYPE_FP16, k, v),
                    0);
                memset(&items[h], 0, sizeof items[h]);
                assert_int_equal(
                    kvedge_block_encode(&spec, k, v, blocks + h * cap, cap, &items[h].len), 0);
                items[h].chunk.id = ids[ci];
                items[h].chunk.has_parent = ci > 0;
                if (ci > 0)
                    items[h].chunk.parent = ids[0];
                snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, "%s", model);
                items[h].chunk.index = ci;
                items[h].chunk.tokens = 256;
                items[h].layer = (uint16_t)l;
                items[h].head = (uint16_t)h;
                items[h].block = blocks + h * cap;
            }
            assert_int_equal(kvedge_client_put(c, items, S_HEADS, NULL), 0);
        }
    free(blocks);
}

static void s_put_context(kvedge_client_t *c, uint32_t l0, uint32_t l1, kvedge_chunk_id_t ids[2])
{
    s_put_context_of(c, S_MODEL, l0, l1, ids);
}

/* A model the edge has never heard of (registered on the cloud by its prefill, not built in):
 * the sync asks the cloud for its shape (a MODEL query) and registers it before copying. */
static void test_sync_model_from_cloud(void **state)
{
    s_fx_t *f = *state;
    kvedge_client_t *cloud = s_client(f->cloud_ep);
    kvedge_model_t custom = {.id = "custom-12x12",
                             .layers = S_LAYERS,
                             .kv_heads = S_HEADS,
                             .head_dim = 64,
                             .dtype = KVEDGE_DTYPE_FP16};
    kvedge_model_t got;
    assert_int_equal(kvedge_client_get_model(cloud, "custom-12x12", &got), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_client_put_model(cloud, &custom), 0);
    assert_int_equal(kvedge_client_get_model(cloud, "custom-12x12", &got), 0);
    assert_int_equal(got.layers, S_LAYERS);
    assert_int_equal(got.kv_heads, S_HEADS);
    assert_int_equal(kvedge_client_get_model(cloud, S_MODEL, &got), 0); /* built in */
    assert_int_equal(got.head_dim, 64);
    assert_int_equal(kvedge_client_get_model(cloud, "", &got), KVEDGE_EINVAL);
    kvedge_chunk_id_t ids[2];
    s_put_context_of(cloud, "custom-12x12", 0, 2, ids);

    kvedge_hsync_sub_t sub;
    memset(&sub, 0, sizeof sub);
    snprintf(sub.name, sizeof sub.name, "custom");
    snprintf(sub.cloud, sizeof sub.cloud, "%s", f->cloud_ep);
    snprintf(sub.tenant, sizeof sub.tenant, "%s", KVEDGE_LOOPBACK_TENANT);
    sub.prefix = ids[1];
    kvedge_hsync_status_t st;
    memset(&st, 0, sizeof st);
    assert_int_equal(kvedge_engine_get_model(f->edge_engine, "custom-12x12", &got),
                     KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 2000, &st), 0);
    assert_int_equal(st.state, KVEDGE_HSYNC_OK);
    assert_int_equal(st.blocks_copied, 2 * 2 * S_HEADS);
    assert_int_equal(kvedge_engine_get_model(f->edge_engine, "custom-12x12", &got), 0);
    assert_int_equal(got.layers, S_LAYERS);
    kvedge_client_destroy(&cloud);
}

/* A model the sync registers on the edge goes into the subscription's local tenant, as that
 * tenant's own MODEL would: another tenant of the edge holding the id with another shape
 * neither blocks the copy nor sees the copied shape. */
static void test_sync_model_keeps_tenant(void **state)
{
    s_fx_t *f = *state;
    kvedge_client_t *cloud = s_client(f->cloud_ep);
    kvedge_model_t custom = {.id = "custom-t",
                             .layers = S_LAYERS,
                             .kv_heads = S_HEADS,
                             .head_dim = 64,
                             .dtype = KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_client_put_model(cloud, &custom), 0);
    kvedge_chunk_id_t ids[2];
    s_put_context_of(cloud, "custom-t", 0, 2, ids);
    uint8_t acme[16], bravo[16];
    kvedge_tenant_tag("acme", acme);
    kvedge_tenant_tag("bravo", bravo);
    kvedge_model_t other = custom, got;
    other.layers = 1;
    other.kv_heads = 1;
    assert_int_equal(kvedge_engine_put_tenant_model(f->edge_engine, bravo, &other), 0);

    kvedge_hsync_sub_t sub;
    memset(&sub, 0, sizeof sub);
    snprintf(sub.name, sizeof sub.name, "tenant");
    snprintf(sub.cloud, sizeof sub.cloud, "%s", f->cloud_ep);
    snprintf(sub.tenant, sizeof sub.tenant, "acme");
    sub.prefix = ids[1];
    kvedge_hsync_status_t st;
    memset(&st, 0, sizeof st);
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 2000, &st), 0);
    assert_int_equal(st.state, KVEDGE_HSYNC_OK);
    assert_int_equal(st.blocks_copied, 2 * 2 * S_HEADS);
    assert_int_equal(kvedge_engine_get_tenant_model(f->edge_engine, acme, "custom-t", &got), 0);
    assert_int_equal(got.layers, S_LAYERS);
    assert_int_equal(got.kv_heads, S_HEADS);
    assert_int_equal(kvedge_engine_get_tenant_model(f->edge_engine, bravo, "custom-t", &got), 0);
    assert_int_equal(got.layers, 1);
    assert_int_equal(kvedge_engine_get_model(f->edge_engine, "custom-t", &got), KVEDGE_ENOMODEL);
    kvedge_client_destroy(&cloud);
}

static void test_sync_serve_offline_and_delta(void **state)
{
    s_fx_t *f = *state;
    kvedge_client_t *cloud = s_client(f->cloud_ep);
    kvedge_chunk_id_t ids[2];
    s_put_context(cloud, 0, 8, ids); /* layers 0..7 now, the rest later */

    kvedge_hsync_sub_t sub;
    memset(&sub, 0, sizeof sub);
    snprintf(sub.name, sizeof sub.name, "ctx");
    snprintf(sub.cloud, sizeof sub.cloud, "%s", f->cloud_ep);
    snprintf(sub.tenant, sizeof sub.tenant, "%s", KVEDGE_LOOPBACK_TENANT);
    sub.prefix = ids[1];
    kvedge_hsync_status_t st;
    memset(&st, 0, sizeof st);
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 2000, &st), 0);
    assert_int_equal(st.state, KVEDGE_HSYNC_OK);
    assert_int_equal(st.chunks_total, 2);
    assert_int_equal(st.chunks_synced, 2);
    assert_int_equal(st.blocks_copied, 2 * 8 * S_HEADS);
    assert_int_equal(st.blocks_held, 2 * 8 * S_HEADS);
    assert_true(st.last_ok_ms > 0);
    kvedge_engine_stats_t es;
    assert_int_equal(kvedge_engine_stats(f->edge_engine, &es), 0);
    assert_int_equal(es.pinned_blocks, 2 * 8 * S_HEADS); /* the historical copy is pinned */

    /* Nothing changed: the next pass copies nothing. */
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 2000, &st), 0);
    assert_int_equal(st.blocks_copied, 0);

    /* The cloud gets the deep layers: the next pass copies exactly those. */
    s_put_context(cloud, 8, S_LAYERS, ids);
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 2000, &st), 0);
    assert_int_equal(st.blocks_held, 2 * S_LAYERS * S_HEADS);
    assert_true(st.blocks_copied >= 2 * 4 * S_HEADS);

    /* The edge serves the copy to a local client of the tenant, bit-identical. */
    f->edge = s_serve(f->edge_engine, f->edge_ep);
    kvedge_client_t *edge = s_client(f->edge_ep);
    uint8_t *a = malloc(1 << 20), *b = malloc(1 << 20);
    kvedge_fetched_t oa[S_HEADS], ob[S_HEADS];
    uint32_t heads;
    for (uint16_t layer = 0; layer < S_LAYERS; layer += 11) {
        assert_int_equal(
            kvedge_client_get_layer(cloud, &ids[1], 1, layer, a, 1 << 20, oa, S_HEADS, &heads), 0);
        assert_int_equal(
            kvedge_client_get_layer(edge, &ids[1], 1, layer, b, 1 << 20, ob, S_HEADS, &heads), 0);
        for (int h = 0; h < S_HEADS; h++) {
            assert_int_equal(ob[h].status, 0);
            assert_int_equal(oa[h].len, ob[h].len);
            assert_memory_equal(a + oa[h].offset, b + ob[h].offset, oa[h].len);
        }
    }
    kvedge_client_destroy(&cloud);

    /* The cloud goes away: a pass fails, and the edge keeps serving everything it holds. */
    kvedge_server_destroy(&f->cloud);
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 500, &st), KVEDGE_ETIMEDOUT);
    assert_int_equal(st.state, KVEDGE_HSYNC_FAILED);
    assert_true(st.last_ok_ms > 0); /* the last good pass is remembered */
    /* ... and what is held is counted from the local copy, not reported as nothing. */
    assert_int_equal(st.chunks_total, 0);
    assert_int_equal(st.chunks_synced, 2);
    assert_int_equal(st.blocks_held, 2 * S_LAYERS * S_HEADS);
    assert_int_equal(st.blocks_pinned, 2 * S_LAYERS * S_HEADS);
    assert_int_equal(st.blocks_copied, 0);
    char sum[1024];
    kvedge_hsync_summary(&sub, &st, sum, sizeof sum);
    assert_non_null(strstr(sum, "cloud unreachable: "));
    assert_non_null(strstr(sum, f->cloud_ep));
    assert_non_null(strstr(sum, "held locally: 288 blocks (2 chunks), pinned"));
    size_t hit = 0;
    assert_int_equal(kvedge_client_lookup(edge, ids, 2, &hit), 0);
    assert_int_equal(hit, 2);
    assert_int_equal(kvedge_client_get_layer(edge, &ids[0], 1, 3, b, 1 << 20, ob, S_HEADS, &heads),
                     0);
    assert_int_equal(heads, S_HEADS);

    /* The status file says all of it. */
    assert_int_equal(kvedge_hsync_write_status(f->dir, &sub, &st, 1), 0);
    char path[400];
    snprintf(path, sizeof path, "%s/%s", f->dir, KVEDGE_HSYNC_STATUS_FILE);
    FILE *sf = fopen(path, "r");
    assert_non_null(sf);
    char line[1024] = "";
    assert_non_null(fgets(line, sizeof line, sf));
    fclose(sf);
    assert_non_null(strstr(line, "\"state\":\"failed\""));
    assert_non_null(strstr(line, "\"last_error\":\"KVEDGE_ETIMEDOUT\""));
    assert_non_null(strstr(line, "\"blocks_held\":288,\"blocks_pinned\":288"));
    assert_non_null(strstr(line, "held locally: 288 blocks (2 chunks), pinned\"}"));
    free(a);
    free(b);
    kvedge_client_destroy(&edge);
}

/* A layer range: only those layers are copied, and a pass with nothing new copies nothing. */
static void test_sync_layer_range(void **state)
{
    s_fx_t *f = *state;
    kvedge_client_t *cloud = s_client(f->cloud_ep);
    kvedge_chunk_id_t ids[2];
    s_put_context(cloud, 0, S_LAYERS, ids);
    kvedge_hsync_sub_t sub;
    memset(&sub, 0, sizeof sub);
    snprintf(sub.cloud, sizeof sub.cloud, "%s", f->cloud_ep);
    snprintf(sub.tenant, sizeof sub.tenant, "%s", KVEDGE_LOOPBACK_TENANT);
    sub.prefix = ids[1];
    sub.first_layer = 2;
    sub.layers = 3;
    kvedge_hsync_status_t st;
    memset(&st, 0, sizeof st);
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 2000, &st), 0);
    assert_int_equal(st.state, KVEDGE_HSYNC_OK);
    assert_int_equal(st.blocks_copied, 2 * 3 * S_HEADS);
    assert_int_equal(st.blocks_held, 2 * 3 * S_HEADS);
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 2000, &st), 0);
    assert_int_equal(st.blocks_copied, 0);
    /* Past the model's end: clipped to the last layers. */
    sub.first_layer = S_LAYERS - 1;
    sub.layers = 40;
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 2000, &st), 0);
    assert_int_equal(st.blocks_copied, 2 * S_HEADS);
    kvedge_client_destroy(&cloud);
}

static void test_unknown_prefix(void **state)
{
    s_fx_t *f = *state;
    kvedge_hsync_sub_t sub;
    memset(&sub, 0, sizeof sub);
    snprintf(sub.cloud, sizeof sub.cloud, "%s", f->cloud_ep);
    snprintf(sub.tenant, sizeof sub.tenant, "%s", KVEDGE_LOOPBACK_TENANT);
    memset(sub.prefix.bytes, 0x42, sizeof sub.prefix.bytes);
    kvedge_hsync_status_t st;
    memset(&st, 0, sizeof st);
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 1000, &st), KVEDGE_ENOTFOUND);
    assert_int_equal(st.state, KVEDGE_HSYNC_FAILED);
}

static void s_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_subscription_file(void **state)
{
    s_fx_t *f = *state;
    char path[400], why[256];
    snprintf(path, sizeof path, "%s/subs.conf", f->dir);
    kvedge_hsync_sub_t subs[4];
    size_t n = 9;
    s_write(path,
            "subscription\n    name = a\n    cloud = tcp://c:7400\n    tenant = acme\n"
            "    prefix = 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"
            "subscription\n    cloud = tcp://d:7400\n"
            "    prefix = ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n");
    assert_int_equal(kvedge_hsync_load(path, subs, 4, &n, why, sizeof why), 0);
    assert_int_equal(n, 2);
    assert_string_equal(subs[0].tenant, "acme");
    assert_string_equal(subs[1].tenant, KVEDGE_LOOPBACK_TENANT);
    assert_string_equal(subs[1].name, "sub2");
    assert_int_equal(subs[0].prefix.bytes[1], 0x11);
    assert_int_equal(subs[0].layers, 0); /* all */

    const char *pre = "subscription\n    cloud = tcp://c:7400\n    prefix = "
                      "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
    char text[400];
    snprintf(text, sizeof text, "%s    layers = 6:12\n", pre);
    s_write(path, text);
    assert_int_equal(kvedge_hsync_load(path, subs, 4, &n, why, sizeof why), 0);
    assert_int_equal(subs[0].first_layer, 6);
    assert_int_equal(subs[0].layers, 6);
    const char *bad[] = {"12:6", "3:3", "x", "1:", ":4", "-1:4", "0:5000", "2:4z"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(text, sizeof text, "%s    layers = %s\n", pre, bad[i]);
        s_write(path, text);
        assert_int_equal(kvedge_hsync_load(path, subs, 4, &n, why, sizeof why), KVEDGE_EINVAL);
        assert_non_null(strstr(why, "layers"));
    }

    s_write(path, "subscription\n    cloud = tcp://c:7400\n    prefix = abc\n");
    assert_int_equal(kvedge_hsync_load(path, subs, 4, &n, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "prefix"));
    s_write(path, "subscription\n    prefix = "
                  "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n");
    assert_int_equal(kvedge_hsync_load(path, subs, 4, &n, why, sizeof why), KVEDGE_EINVAL);
    s_write(path, "subscription\n    colour = blue\n");
    assert_int_equal(kvedge_hsync_load(path, subs, 4, &n, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "colour"));
    s_write(path, "cache\n    x = 1\n");
    assert_int_equal(kvedge_hsync_load(path, subs, 4, &n, why, sizeof why), KVEDGE_EINVAL);
    snprintf(path, sizeof path, "%s/missing.conf", f->dir);
    assert_int_equal(kvedge_hsync_load(path, subs, 4, &n, why, sizeof why), KVEDGE_EIO);
}

/* ---------------------------------------------------------------- what is said */

typedef struct {
    pthread_mutex_t mu;
    char *lines[256];
    size_t n;
} s_log_t;

static void s_sink(kvedge_log_level_t level, const char *text, void *arg)
{
    (void)level;
    s_log_t *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n < 256)
        l->lines[l->n++] = strdup(text);
    pthread_mutex_unlock(&l->mu);
}

/* Lines containing both needles. */
static size_t s_logged(s_log_t *l, const char *a, const char *b)
{
    size_t hits = 0;
    pthread_mutex_lock(&l->mu);
    for (size_t i = 0; i < l->n; i++)
        hits += strstr(l->lines[i], a) && strstr(l->lines[i], b);
    pthread_mutex_unlock(&l->mu);
    return hits;
}

static void s_sub(kvedge_hsync_sub_t *sub, const char *name, const char *cloud,
                  const kvedge_chunk_id_t *prefix)
{
    memset(sub, 0, sizeof *sub);
    snprintf(sub->name, sizeof sub->name, "%s", name);
    snprintf(sub->cloud, sizeof sub->cloud, "%s", cloud);
    snprintf(sub->tenant, sizeof sub->tenant, "%s", KVEDGE_LOOPBACK_TENANT);
    sub->prefix = *prefix;
}

/* The scheduler: each pass logged per subscription (synced at info; failed at warn with the
 * reason and what is still held), and its state readable while it runs. */
static void test_sched_logs_and_status(void **state)
{
    s_fx_t *f = *state;
    kvedge_client_t *cloud = s_client(f->cloud_ep);
    kvedge_chunk_id_t ids[2];
    s_put_context(cloud, 0, S_LAYERS, ids);
    kvedge_client_destroy(&cloud);
    /* The second subscription is the same context from a cloud that cannot be reached. */
    kvedge_hsync_sub_t subs[2];
    s_sub(&subs[0], "good", f->cloud_ep, &ids[1]);
    s_sub(&subs[1], "gone", "not-an-endpoint", &ids[1]);
    s_log_t log = {.n = 0};
    pthread_mutex_init(&log.mu, NULL);
    kvedge_log_set_sink(s_sink, &log);
    kvedge_hsync_sched_t *y = NULL;
    assert_int_equal(kvedge_hsync_sched_start(f->edge_engine, f->dir, subs, 2, 3600, &y), 0);
    kvedge_hsync_sub_t got[4];
    kvedge_hsync_status_t st[4];
    size_t n = 0;
    uint64_t last = 0;
    /* The first pass ended: its time is set. */
    kt_wait_for(kvedge_hsync_sched_status(y, got, st, 4, &n, &last) == 0 && last > 0, KT_WAIT_MS);
    assert_int_equal(n, 2);
    assert_string_equal(got[1].name, "gone");
    assert_int_equal(st[0].state, KVEDGE_HSYNC_OK);
    assert_int_equal(st[0].blocks_held, 2 * S_LAYERS * S_HEADS);
    assert_int_equal(st[1].state, KVEDGE_HSYNC_FAILED);
    assert_int_equal(st[1].blocks_held, 2 * S_LAYERS * S_HEADS);
    assert_int_equal(st[1].chunks_synced, 2);
    assert_int_equal(kvedge_hsync_sched_status(y, got, st, 1, &n, NULL), 0);
    assert_int_equal(n, 1);
    assert_int_equal(kvedge_hsync_sched_status(NULL, got, st, 4, &n, NULL), KVEDGE_EINVAL);
    kvedge_hsync_sched_destroy(&y);
    kvedge_log_set_sink(NULL, NULL);
    assert_int_equal(
        s_logged(&log, "sync good: 2 chunks, 288 blocks copied (", "), held 288 blocks, state ok"),
        1);
    assert_int_equal(s_logged(&log, "sync gone: state failed: cloud unreachable: ",
                              "held locally: 288 blocks (2 chunks), pinned"),
                     1);
    for (size_t i = 0; i < log.n; i++)
        free(log.lines[i]);
    pthread_mutex_destroy(&log.mu);
}

/* Runs the kvedge command; its stdout into out, its exit code returned. */
static int s_kvedge(char *out, size_t cap, const char *fmt, ...)
{
    char args[1500], cmd[2000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", KVEDGE_BIN, args);
    return kt_capture(cmd, out, cap);
}

/* `kvedge sync` with the cloud down: the pass fails (exit code says so) and the output says
 * what is still held, pinned; so does the status it leaves for `kvedge sync`. */
static void test_cli_cloud_down(void **state)
{
    s_fx_t *f = *state;
    kvedge_client_t *cloud = s_client(f->cloud_ep);
    kvedge_chunk_id_t ids[2];
    s_put_context(cloud, 0, S_LAYERS, ids);
    kvedge_client_destroy(&cloud);
    kvedge_hsync_sub_t sub;
    s_sub(&sub, "bot", f->cloud_ep, &ids[1]);
    kvedge_hsync_status_t st;
    memset(&st, 0, sizeof st);
    assert_int_equal(kvedge_hsync_run(f->edge_engine, &sub, 2000, &st), 0);
    assert_int_equal(st.blocks_held, 2 * S_LAYERS * S_HEADS);
    kvedge_engine_destroy(&f->edge_engine); /* the command opens the store itself */
    kvedge_server_destroy(&f->cloud);

    char subs[400], edge[400], hex[KVEDGE_CHUNK_ID_HEX_BYTES], text[800];
    snprintf(subs, sizeof subs, "%s/subs.conf", f->dir);
    snprintf(edge, sizeof edge, "%s/edge", f->dir);
    snprintf(text, sizeof text, "subscription\n    name = bot\n    cloud = %s\n    prefix = %s\n",
             f->cloud_ep, kvedge_chunk_id_hex(&ids[1], hex));
    s_write(subs, text);
    char *out = malloc(1 << 16);
    assert_int_equal(s_kvedge(out, 1 << 16,
                              "--data %s sync --once --deadline 300 --subscriptions %s", edge,
                              subs),
                     1);
    assert_non_null(strstr(out, "bot"));
    assert_non_null(strstr(out, "failed"));
    assert_non_null(strstr(out, "cloud unreachable: "));
    assert_non_null(strstr(out, "held locally: 288 blocks (2 chunks), pinned"));
    assert_int_equal(s_kvedge(out, 1 << 16, "--data %s sync --json", edge), 0);
    assert_non_null(strstr(out, "\"state\":\"failed\""));
    assert_non_null(strstr(out, "\"blocks_held\":288"));
    assert_non_null(strstr(out, "held locally: 288 blocks (2 chunks), pinned"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sync_model_keeps_tenant, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_sync_model_from_cloud, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_sync_serve_offline_and_delta, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_sync_layer_range, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_unknown_prefix, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_subscription_file, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_sched_logs_and_status, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_cli_cloud_down, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
