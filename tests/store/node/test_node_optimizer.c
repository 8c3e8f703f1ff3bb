/* The store node's storage optimizer (docs/operations.md "Storage optimizer"): off by default;
 * with it on, a prefix read often gets its configured variants prepared, an idle one is
 * demoted, capacity pressure demotes before it evicts, and /metrics and MONITOR show it; the
 * thread runs passes by itself; bad settings are refused with a reason naming the setting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/settings.h"
#include "access/transport.h"
#include "clients/lib/kvedge.h"
#include "store/engine/engine.h"
#include "store/node/node.h"
#include "access/codec/prec.h"
#include "access/codec/synth.h"
#include "tests/common/testutil.h"
#include "tests/common/http.h"

#define S_MODEL  "opt-125m" /* built in: 12 layers x 12 heads x 64 */
#define S_HEADS  12
#define S_DIM    64
#define S_TOKENS 64
#define S_BUF    (4u << 20)

static const kvedge_prec_t S_INT8 = KVEDGE_PREC_INT8;
static const kvedge_prec_t S_G32 = KVEDGE_PREC_INT4_G32;

typedef struct {
    char dir[256];
    kvedge_node_t *node;
    kvedge_engine_t *engine;
    kvedge_client_t *client;
} s_env_t;

static void s_settings(s_env_t *e, kvedge_node_settings_t *ns)
{
    kvedge_node_settings_default(ns);
    snprintf(ns->metrics, sizeof ns->metrics, "127.0.0.1:0");
    ns->role = KVEDGE_ROLE_CLOUD;
    ns->insecure = true;
    ns->workers = 2;
    snprintf(ns->data, sizeof ns->data, "%s", e->dir);
    snprintf(ns->bind, sizeof ns->bind, "tcp://127.0.0.1:*");
}

static void s_start(s_env_t *e, const kvedge_node_settings_t *ns)
{
    char why[512] = "";
    if (kvedge_node_start(ns, &e->node, why, sizeof why) != 0)
        fail_msg("node start: %s", why);
    e->engine = kvedge_node_engine(e->node);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = kvedge_node_endpoint(e->node);
    o.deadline_ms = 5000;
    assert_int_equal(kvedge_client_connect(&o, &e->client), 0);
}

static void s_stop(s_env_t *e)
{
    kvedge_client_destroy(&e->client);
    kvedge_node_destroy(&e->node);
}

static int s_setup(void **state)
{
    s_env_t *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    snprintf(e->dir, sizeof e->dir, "/tmp/kvedge-nodeopt-XXXXXX");
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

/* Puts layer 0 of one chunk (tokens seeded by tag) as int8 through the node; *id its client
 * chunk id. */
static void s_put(s_env_t *e, uint32_t tag, kvedge_chunk_id_t *id)
{
    uint32_t tok[S_TOKENS];
    for (uint32_t i = 0; i < S_TOKENS; i++)
        tok[i] = 7000 + 100 * tag + i;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, 0, id, 1), 1);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, S_TOKENS, S_DIM, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blocks = malloc(cap * S_HEADS);
    uint16_t k[S_TOKENS * S_DIM], v[S_TOKENS * S_DIM];
    kvedge_put_item_t items[S_HEADS];
    for (uint32_t h = 0; h < S_HEADS; h++) {
        assert_int_equal(
            kvedge_synth_head(100 * tag + h + 1, 0, S_TOKENS, S_DIM, KVEDGE_DTYPE_FP16, k, v), 0);
        memset(&items[h], 0, sizeof items[h]);
        assert_int_equal(kvedge_block_encode(&spec, k, v, blocks + h * cap, cap, &items[h].len), 0);
        items[h].chunk.id = *id;
        snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, S_MODEL);
        items[h].chunk.tokens = S_TOKENS;
        items[h].layer = 0;
        items[h].head = (uint16_t)h;
        items[h].block = blocks + h * cap;
    }
    assert_int_equal(kvedge_client_put(e->client, items, S_HEADS, NULL), 0);
    free(blocks);
}

/* Reads layer 0 of a chunk through the node (one access in the I/O Analyzer). */
static void s_read(s_env_t *e, const kvedge_chunk_id_t *id)
{
    uint8_t *buf = malloc(S_BUF);
    kvedge_fetched_t out[S_HEADS];
    uint32_t heads = 0;
    assert_int_equal(kvedge_client_get_layer(e->client, id, 1, 0, buf, S_BUF, out, S_HEADS, &heads),
                     0);
    assert_int_equal(heads, S_HEADS);
    for (int h = 0; h < S_HEADS; h++)
        assert_int_equal(out[h].status, 0);
    free(buf);
}

/* The engine's key of head h of layer 0 of a loopback client's chunk. */
static kvedge_block_key_t s_key(const kvedge_chunk_id_t *id, uint16_t h)
{
    uint8_t tag[16];
    kvedge_tenant_tag(KVEDGE_LOOPBACK_TENANT, tag);
    kvedge_block_key_t key = {.layer = 0, .head = h};
    kvedge_tenant_chunk_id(tag, id, &key.chunk);
    return key;
}

static cJSON *s_monitor(s_env_t *e)
{
    char *json = NULL;
    size_t len = 0;
    assert_int_equal(kvedge_client_monitor(e->client, 10, &json, &len), 0);
    cJSON *doc = cJSON_ParseWithLength(json, len);
    assert_non_null(doc);
    free(json);
    return doc;
}

static double s_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        fail_msg("no number %s", key);
    return v->valuedouble;
}

/* The value of the first series line of metrics starting with prefix, or -1. */
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

/* Whether the node's optimizer thread has made a pass (its MONITOR document says so). */
static bool s_optimizer_passed(void *arg)
{
    cJSON *doc = s_monitor(arg);
    double passes = s_num(cJSON_GetObjectItemCaseSensitive(doc, "optimizer"), "passes");
    cJSON_Delete(doc);
    return passes >= 1;
}

/* ---------------------------------------------------------------- tests */

static void test_bad_settings_refused(void **state)
{
    s_env_t *e = *state;
    kvedge_node_settings_t ns;
    s_settings(e, &ns);
    /* The defaults: off, int4-g32 both ways. */
    assert_false(ns.optimize);
    assert_string_equal(ns.demote_to, "int4-g32");
    assert_string_equal(ns.prepare, "int4-g32");
    assert_true(ns.demote_on_pressure);
    char why[512];
    struct {
        const char *demote_to, *prepare;
        uint32_t hot_reads, hot_top;
        const char *says;
    } bad[] = {
        {"lossless", "int4-g32", 16, 10, "demote_to"},
        {"int9", "int4-g32", 16, 10, "demote_to"},
        {"int4-g32", "int4-g32,bogus", 16, 10, "prepare"},
        {"int4-g32", "int8,int8", 16, 10, "prepare"},
        {"int4-g32", "lossless", 16, 10, "prepare"},
        {"int4-g32", "int4-g32", 0, 10, "hot_reads"},
        {"int4-g32", "int4-g32", 16, 0, "hot_top"},
        {"int4-g32", "int4-g32", 16, 100000, "hot_top"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvedge_node_settings_t s = ns;
        s.optimize = true;
        snprintf(s.demote_to, sizeof s.demote_to, "%s", bad[i].demote_to);
        snprintf(s.prepare, sizeof s.prepare, "%s", bad[i].prepare);
        s.hot_reads = bad[i].hot_reads;
        s.hot_top = bad[i].hot_top;
        why[0] = '\0';
        assert_int_equal(kvedge_node_settings_check(&s, why, sizeof why), KVEDGE_EINVAL);
        if (!strstr(why, bad[i].says))
            fail_msg("case %zu: '%s' does not name %s", i, why, bad[i].says);
        assert_int_equal(kvedge_node_start(&s, &e->node, why, sizeof why), KVEDGE_EINVAL);
        assert_null(e->node);
    }
    /* The config reader refuses them too, naming the key. */
    kvedge_node_settings_t s = ns;
    assert_int_equal(kvedge_settings_set(&kvedge_node_settings_table, &s, "demote_to", "int4-g7",
                                         why, sizeof why),
                     KVEDGE_EINVAL);
    assert_non_null(strstr(why, "demote_to"));
    assert_int_equal(
        kvedge_settings_set(&kvedge_node_settings_table, &s, "prepare", "int4,x", why, sizeof why),
        KVEDGE_EINVAL);
    assert_non_null(strstr(why, "prepare"));
    assert_int_equal(
        kvedge_settings_set(&kvedge_node_settings_table, &s, "prepare", "none", why, sizeof why),
        0);
    assert_int_equal(
        kvedge_settings_set(&kvedge_node_settings_table, &s, "demote_to", "int8", why, sizeof why),
        0);
    assert_int_equal(kvedge_node_settings_check(&s, why, sizeof why), 0);
}

static void test_off_by_default(void **state)
{
    s_env_t *e = *state;
    kvedge_node_settings_t ns;
    s_settings(e, &ns);
    s_start(e, &ns);
    assert_int_equal(kvedge_node_optimize(e->node), KVEDGE_EINVAL);
    cJSON *doc = s_monitor(e);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(doc, "optimizer");
    assert_non_null(o);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "enabled")));
    assert_int_equal(s_num(o, "demoted_blocks"), 0);
    cJSON_Delete(doc);
}

/* Precisions a reader asked for that the node derived, and kept (keep_derived), count in
 * /metrics; a second read of the same rung finds the kept variants and derives nothing. */
static void test_derived_counted(void **state)
{
    s_env_t *e = *state;
    kvedge_node_settings_t ns;
    s_settings(e, &ns);
    ns.keep_derived = true;
    s_start(e, &ns);
    kvedge_chunk_id_t id;
    s_put(e, 9, &id); /* int8 blocks */
    uint8_t *buf = malloc(1 << 20);
    kvedge_fetched_t out[S_HEADS];
    uint32_t heads = 0;
    for (int round = 0; round < 2; round++) {
        assert_int_equal(kvedge_client_get_layer_prec(e->client, &id, 1, 0, &S_G32, 1, buf, 1 << 20,
                                                      out, S_HEADS, &heads),
                         0);
        for (int h = 0; h < S_HEADS; h++)
            assert_int_equal(out[h].status, 0);
    }
    free(buf);
    char *body = malloc(1 << 20);
    assert_int_equal(kt_http_get(kvedge_node_metrics_url(e->node), "/metrics", body, 1 << 20), 200);
    assert_true(s_metric(body, "kvedge_node_derived_blocks_total ") == S_HEADS);
    assert_true(s_metric(body, "kvedge_node_derived_kept_blocks_total ") == S_HEADS);
    free(body);
}

/* A hot prefix gets its variants, an idle one is demoted; MONITOR and /metrics show it. */
static void test_hot_prepared_cold_demoted(void **state)
{
    s_env_t *e = *state;
    kvedge_node_settings_t ns;
    s_settings(e, &ns);
    ns.optimize = true;
    ns.optimize_interval_s = 3600; /* passes are run by hand here */
    ns.demote_idle_s = 1;
    ns.hot_reads = 3;
    s_start(e, &ns);
    kvedge_chunk_id_t hot, cold;
    s_put(e, 1, &hot);
    s_put(e, 2, &cold);
    /* Past the idle threshold, then the hot prefix read (its access time refreshed). */
    kt_pause_ms(1300); /* the time is the point: past demote_idle_s for both */
    for (int i = 0; i < 5; i++)
        s_read(e, &hot);
    assert_int_equal(kvedge_node_optimize(e->node), 0);

    for (uint16_t h = 0; h < S_HEADS; h++) {
        kvedge_block_key_t kh = s_key(&hot, h), kc = s_key(&cold, h);
        kvedge_prec_t held[KVEDGE_PREC_MAX_ACCEPT];
        size_t n = 0;
        assert_int_equal(kvedge_engine_variants(e->engine, &kh, held, KVEDGE_PREC_MAX_ACCEPT, &n),
                         0);
        assert_int_equal(n, 1);
        assert_int_equal(held[0], S_G32);
        kvedge_block_meta_t m;
        assert_int_equal(kvedge_engine_get_meta(e->engine, &kh, &m), 0);
        assert_false(m.demoted);
        assert_int_equal(kvedge_engine_get_meta(e->engine, &kc, &m), 0);
        assert_true(m.demoted);
        assert_int_equal(m.demoted_from, S_INT8);
        assert_int_equal(m.scheme, KVEDGE_SCHEME_INT4);
    }
    uint64_t vblocks = 0, vbytes = 0;
    assert_int_equal(kvedge_engine_variant_stats(e->engine, &vblocks, &vbytes), 0);
    assert_int_equal(vblocks, S_HEADS);

    cJSON *doc = s_monitor(e);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(doc, "optimizer");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "enabled")));
    assert_int_equal(s_num(o, "passes"), 1);
    assert_int_equal(s_num(o, "variants_prepared"), S_HEADS);
    assert_int_equal(s_num(o, "idle_demoted_blocks"), S_HEADS);
    assert_true(s_num(o, "idle_saved_bytes") > 0);
    assert_int_equal(s_num(o, "variant_blocks"), S_HEADS);
    assert_int_equal(s_num(o, "variant_bytes"), vbytes);
    const cJSON *last = cJSON_GetObjectItemCaseSensitive(o, "last");
    assert_int_equal(s_num(last, "hot_prefixes"), 1);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "demote_to")->valuestring, "int4-g32");
    cJSON_Delete(doc);

    char *body = malloc(1 << 20);
    assert_int_equal(kt_http_get(kvedge_node_metrics_url(e->node), "/metrics", body, 1 << 20), 200);
    assert_int_equal(s_metric(body, "kvedge_node_variants_prepared_total "), S_HEADS);
    assert_int_equal(s_metric(body, "kvedge_node_demoted_blocks_total{cause=\"idle\"} "), S_HEADS);
    assert_int_equal(s_metric(body, "kvedge_node_demoted_blocks_total{cause=\"pressure\"} "), 0);
    assert_int_equal(s_metric(body, "kvedge_node_variant_blocks "), S_HEADS);
    assert_int_equal(s_metric(body, "kvedge_node_variant_bytes "), vbytes);
    assert_int_equal(s_metric(body, "kvedge_node_optimizer_passes_total "), 1);
    assert_true(s_metric(body, "kvedge_node_demoted_saved_bytes_total{cause=\"idle\"} ") > 0);

    /* A second pass: nobody read in between, so nothing is hot; nothing new to demote. */
    assert_int_equal(kvedge_node_optimize(e->node), 0);
    doc = s_monitor(e);
    o = cJSON_GetObjectItemCaseSensitive(doc, "optimizer");
    assert_int_equal(s_num(o, "passes"), 2);
    assert_int_equal(s_num(o, "variants_prepared"), S_HEADS);
    last = cJSON_GetObjectItemCaseSensitive(o, "last");
    assert_int_equal(s_num(last, "hot_prefixes"), 0);
    cJSON_Delete(doc);
    free(body);
}

/* The thread runs passes on its own; a full node demotes before it evicts. */
static void test_thread_and_pressure(void **state)
{
    s_env_t *e = *state;
    kvedge_node_settings_t ns;
    s_settings(e, &ns);
    ns.optimize = true;
    ns.optimize_interval_s = 1;
    ns.demote_idle_s = 0; /* pressure only */
    /* Room for about two and a half chunks at int8. */
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, S_TOKENS, S_DIM, 0, NULL, false};
    ns.capacity_bytes = kvedge_block_encoded_bound(&spec) * S_HEADS * 5 / 2;
    s_start(e, &ns);
    kvedge_chunk_id_t ids[4];
    for (uint32_t i = 0; i < 4; i++)
        s_put(e, 10 + i, &ids[i]);
    kvedge_engine_demote_stats_t ds;
    assert_int_equal(kvedge_engine_demote_stats(e->engine, &ds), 0);
    assert_true(ds.pressure_demoted > 0);
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_engine_stats(e->engine, &st), 0);
    assert_true(st.blocks > 2 * S_HEADS); /* more than int8 alone would hold */
    assert_true(st.bytes <= ns.capacity_bytes);
    /* Every chunk's newest block is still there, int8 or demoted. */
    for (uint32_t i = 1; i < 4; i++) {
        kvedge_block_key_t k = s_key(&ids[i], S_HEADS - 1);
        kvedge_block_meta_t m;
        assert_int_equal(kvedge_engine_get_meta(e->engine, &k, &m), 0);
    }
    /* The thread's passes. */
    kt_wait_until(s_optimizer_passed, e, KT_WAIT_MS);
    char *body = malloc(1 << 20);
    assert_int_equal(kt_http_get(kvedge_node_metrics_url(e->node), "/metrics", body, 1 << 20), 200);
    assert_int_equal(s_metric(body, "kvedge_node_demoted_blocks_total{cause=\"pressure\"} "),
                     ds.pressure_demoted);
    assert_true(s_metric(body, "kvedge_node_optimizer_passes_total ") >= 1);
    free(body);
}

#define T(f) cmocka_unit_test_setup_teardown(f, s_setup, s_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_bad_settings_refused),      T(test_off_by_default),      T(test_derived_counted),
        T(test_hot_prepared_cold_demoted), T(test_thread_and_pressure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
