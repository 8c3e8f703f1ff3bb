/* The daemons' monitors on their own: the store node's I/O Analyzer (requests by opcode and
 * status, reads by scheme and miss reason, tenants bounded, the hot set in fixed memory under
 * 100 000 distinct prefixes) and the proxy's Collaboration Monitor (layers by kind and reason,
 * fetch timings, the transition ring), each checked on its registry's exposition and its
 * JSON view. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/frame.h"
#include "proxy/collab.h"
#include "access/codec/error.h"
#include "store/node/analyzer.h"

/* Lines of text that start with prefix. */
static size_t s_lines(const char *text, const char *prefix)
{
    size_t n = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        n += strncmp(p, prefix, strlen(prefix)) == 0;
    return n;
}

static void test_analyzer_requests_and_reads(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[256];
    kvedge_analyzer_t *a = kvedge_analyzer_new(r, 3, why, sizeof why);
    assert_non_null(a);
    kvedge_analyzer_request(a, KVEDGE_OP_GET, KVEDGE_OK, 120, 36, 4000);
    kvedge_analyzer_request(a, KVEDGE_OP_GET, KVEDGE_ENOTFOUND, 80, 36, 4);
    kvedge_analyzer_request(a, KVEDGE_OP_PUT, -1000, 5, 100, 4); /* a code from the future */
    uint8_t block[40] = "KVEB";
    block[6] = KVEDGE_SCHEME_INT4;
    block[7] = KVEDGE_BLOCK_FLAG_MASK;
    kvedge_analyzer_read(a, KVEDGE_OK, block, sizeof block);
    kvedge_analyzer_read(a, KVEDGE_ECORRUPT, NULL, 0);
    kvedge_analyzer_quarantine(a);
    char *text = kvedge_metrics_render(r, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "kvedge_node_requests_total{op=\"GET\",status=\"OK\"} 1\n"));
    assert_non_null(
        strstr(text, "kvedge_node_requests_total{op=\"GET\",status=\"ENOTFOUND\"} 1\n"));
    assert_non_null(strstr(text, "kvedge_node_requests_total{op=\"PUT\",status=\"other\"} 1\n"));
    assert_non_null(strstr(text, "kvedge_node_request_duration_seconds_count{op=\"GET\"} 2\n"));
    assert_non_null(strstr(text, "kvedge_node_served_bytes_total{scheme=\"int4+think\"} 40\n"));
    assert_non_null(strstr(text, "kvedge_node_block_misses_total{reason=\"ECORRUPT\"} 1\n"));
    assert_non_null(strstr(text, "kvedge_node_quarantined_total 1\n"));
    assert_non_null(strstr(text, "kvedge_node_received_bytes_total{op=\"GET\"} 72\n"));
    free(text);
    cJSON *doc = cJSON_CreateObject();
    assert_int_equal(kvedge_analyzer_json(a, doc, 5), 0);
    const cJSON *reads = cJSON_GetObjectItemCaseSensitive(doc, "reads");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(reads, "hits")->valueint, 1);
    const cJSON *misses = cJSON_GetObjectItemCaseSensitive(reads, "misses");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(misses, "ECORRUPT")->valueint, 1);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "requests")), 3);
    cJSON_Delete(doc);
    kvedge_analyzer_destroy(&a);
    kvedge_metrics_destroy(&r);
    /* Monitoring off: a NULL analyzer takes every call and records nothing. */
    kvedge_analyzer_request(NULL, KVEDGE_OP_GET, 0, 1, 1, 1);
    kvedge_analyzer_read(NULL, 0, block, sizeof block);
    kvedge_analyzer_touch(NULL, 0, NULL, NULL, 0, 0, 0);
}

static void test_analyzer_tenants_bounded(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    kvedge_analyzer_t *a = kvedge_analyzer_new(r, 1, NULL, 0);
    assert_non_null(a);
    /* A name that needs escaping, then more tenants than the bound. */
    kvedge_analyzer_tenant_t t;
    kvedge_analyzer_tenant(a, "acme \"prod\"\n", &t);
    kvedge_series_inc(t.requests);
    for (int i = 0; i < 200; i++) {
        char name[32];
        snprintf(name, sizeof name, "tenant-%d", i);
        kvedge_analyzer_tenant(a, name, &t);
        kvedge_series_inc(t.requests);
        kvedge_series_add(t.stored_bytes, 10);
    }
    char *text = kvedge_metrics_render(r, NULL);
    assert_non_null(strstr(text, "kvedge_node_tenant_requests_total{tenant=\"acme "
                                 "\\\"prod\\\"\\n\"} 1\n"));
    assert_int_equal(s_lines(text, "kvedge_node_tenant_requests_total{"),
                     KVEDGE_ANALYZER_MAX_TENANTS + 1);
    /* 201 tenants, 63 with their own series after acme: the other 137 fold into _other. */
    assert_non_null(strstr(text, "kvedge_node_tenant_requests_total{tenant=\"_other\"} 137\n"));
    free(text);
    cJSON *doc = cJSON_CreateObject();
    assert_int_equal(kvedge_analyzer_json(a, doc, 0), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "tenants")),
                     KVEDGE_ANALYZER_MAX_TENANTS + 1);
    cJSON_Delete(doc);
    kvedge_analyzer_destroy(&a);
    kvedge_metrics_destroy(&r);
}

/* 100 000 distinct prefixes pass through 3 shards with one hot prefix among them: memory does
 * not move, and the hot one comes out first with every layer it was read at. */
static void test_analyzer_hot_set_bounded(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    kvedge_analyzer_t *a = kvedge_analyzer_new(r, 3, NULL, 0);
    assert_non_null(a);
    cJSON *doc = cJSON_CreateObject();
    assert_int_equal(kvedge_analyzer_json(a, doc, 0), 0);
    double mem0 = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "hot"),
                                                   "memory_bytes")
                      ->valuedouble;
    cJSON_Delete(doc);
    kvedge_chunk_id_t hot, cold;
    memset(&hot, 0xAB, sizeof hot);
    memset(&cold, 0, sizeof cold);
    for (uint32_t i = 0; i < 100000; i++) {
        memcpy(cold.bytes, &i, sizeof i);
        kvedge_analyzer_touch(a, i % 3, &cold, "m", i % 12, UINT32_MAX, 100);
        if (i % 10 == 0)
            kvedge_analyzer_touch(a, i % 3, &hot, "hot-model", (i / 10) % 24, UINT32_MAX, 1000);
    }
    kvedge_hot_entry_t top[4];
    assert_int_equal(kvedge_analyzer_top(a, top, 4), 4);
    assert_memory_equal(top[0].key, hot.bytes, sizeof hot.bytes);
    assert_string_equal(top[0].label, "hot-model");
    assert_true(top[0].count - top[0].error <= 10000 && top[0].count >= 10000);
    for (int l = 0; l < 24; l++)
        assert_true(top[0].layers[l] > 0);
    doc = cJSON_CreateObject();
    assert_int_equal(kvedge_analyzer_json(a, doc, 2), 0);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(doc, "hot");
    assert_true(cJSON_GetObjectItemCaseSensitive(h, "memory_bytes")->valuedouble == mem0);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(h, "accesses")->valuedouble, 110000);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(h, "prefixes")), 2);
    printf("hot set: %.0f bytes for 3 shards x %d prefixes, unchanged after 100000 distinct\n",
           mem0, KVEDGE_ANALYZER_HOT_CAPACITY);
    cJSON_Delete(doc);
    kvedge_analyzer_destroy(&a);
    kvedge_metrics_destroy(&r);
}

static void test_collab(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[256];
    kvedge_collab_t *c = kvedge_collab_new(r, why, sizeof why);
    assert_non_null(c);
    kvedge_collab_source(c, 0, "cloud1", KVEDGE_PLAN_CLOUD);
    kvedge_collab_source(c, 1, "edge-b", KVEDGE_PLAN_PEER);
    for (int i = 0; i < 5; i++)
        kvedge_collab_layer(c, 0, KVEDGE_PLAN_CLOUD, KVEDGE_FETCH_PLANNED, 1000);
    kvedge_collab_layer(c, 1, KVEDGE_PLAN_PEER, KVEDGE_FETCH_FALLBACK_FAILED, 500);
    kvedge_collab_layer(c, -1, KVEDGE_PLAN_LOCAL, KVEDGE_FETCH_RECOMPUTE, 0);
    kvedge_collab_fetch_t f = {0, 20000, 300, 5000, 25000, 7};
    kvedge_collab_fetch(c, &f);
    kvedge_collab_fetch_t cancelled = {KVEDGE_COLLAB_CANCELLED, 0, 0, 0, 100, 7};
    kvedge_collab_fetch(c, &cancelled);
    for (int i = 0; i < 70; i++)
        kvedge_collab_transition(c, "edge-b", i % 2 ? 2 : 0, i % 2 ? 0 : 2,
                                 i % 2 ? "heard again" : "4 consecutive failures");
    char *text = kvedge_metrics_render(r, NULL);
    assert_non_null(strstr(text, "kvedge_proxy_layers_total{kind=\"cloud\",reason=\"planned\"} 5"));
    assert_non_null(
        strstr(text, "kvedge_proxy_layers_total{kind=\"peer\",reason=\"fallback:failed\"} 1"));
    assert_non_null(
        strstr(text, "kvedge_proxy_layers_total{kind=\"none\",reason=\"recompute\"} 1"));
    assert_non_null(strstr(text,
                           "kvedge_proxy_source_bytes_total{source=\"cloud1\",kind=\"cloud\"} "
                           "5000"));
    assert_non_null(strstr(text, "kvedge_proxy_fetches_total{status=\"OK\"} 1"));
    assert_non_null(strstr(text, "kvedge_proxy_fetches_total{status=\"CANCELLED\"} 1"));
    assert_non_null(strstr(text, "kvedge_proxy_fetch_first_layer_seconds_count 1"));
    assert_non_null(strstr(text, "kvedge_proxy_source_transitions_total{source=\"edge-b\",to="
                                 "\"down\"} 35"));
    free(text);
    cJSON *doc = cJSON_CreateObject();
    assert_int_equal(kvedge_collab_json(c, doc), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "transitions")),
                     KVEDGE_COLLAB_TRANSITIONS);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(doc, "transitions_total")->valueint, 70);
    const cJSON *last = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "transitions"),
                                           KVEDGE_COLLAB_TRANSITIONS - 1);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(last, "reason")->valuestring,
                        "heard again");
    const cJSON *fetch = cJSON_GetObjectItemCaseSensitive(doc, "fetch");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(fetch, "ok")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(fetch, "failed")->valueint, 1);
    /* 25 ms against a plan of 20 ms: the ratio's median lies in the 1.0 … 2.0 bucket. */
    double ratio = cJSON_GetObjectItemCaseSensitive(fetch, "actual_to_plan_median")->valuedouble;
    assert_true(ratio > 1.0 && ratio <= 2.1);
    cJSON_Delete(doc);
    /* Recording off: layers and fetches stop counting; transitions still do. */
    kvedge_collab_set_recording(c, false);
    kvedge_collab_layer(c, 0, KVEDGE_PLAN_CLOUD, KVEDGE_FETCH_PLANNED, 1000);
    text = kvedge_metrics_render(r, NULL);
    assert_non_null(strstr(text, "kvedge_proxy_layers_total{kind=\"cloud\",reason=\"planned\"} 5"));
    free(text);
    kvedge_collab_destroy(&c);
    kvedge_metrics_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_analyzer_requests_and_reads),
        cmocka_unit_test(test_analyzer_tenants_bounded),
        cmocka_unit_test(test_analyzer_hot_set_bounded),
        cmocka_unit_test(test_collab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
