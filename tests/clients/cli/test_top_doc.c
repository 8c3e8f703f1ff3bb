/* The MONITOR document parser of `kvedge top`: a node's and a proxy's documents parsed into
 * the expected values; wrong types, missing fields, out-of-range numbers, huge arrays, long and
 * hostile strings, non-objects and unknown kinds handled as specified; percentiles from
 * histogram deltas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/frame.h"
#include "clients/cli/top_doc.h"
#include "access/codec/error.h"

#define S_LE                                                                                       \
    "[10,20,40,80,160,320,640,1280,2560,5120,10240,20480,40960,81920,163840,327680,655360,"        \
    "1310720,2621440,5242880,10485760,20971520,41943040]"

static const char s_node_doc[] =
    "{\"kind\":\"node\",\"name\":\"edge-a\",\"role\":\"edge\",\"version\":\"0.1.0\","
    "\"time_ms\":1795529948662,\"uptime_ms\":3723000,\"monitor\":true,\"ready\":true,"
    "\"requests\":[{\"op\":\"HELLO\",\"status\":\"OK\",\"count\":15},"
    "{\"op\":\"GET_LAYER\",\"status\":\"OK\",\"count\":1200},"
    "{\"op\":\"GET_LAYER\",\"status\":\"ENOTFOUND\",\"count\":30}],"
    "\"latency\":[{\"op\":\"GET_LAYER\",\"count\":1230,\"sum_us\":1102385,\"buckets\":"
    "[0,0,0,0,0,95,410,1020,1190,1221,1228,1230,1230,1230,1230,1230,1230,1230,1230,1230,1230,"
    "1230,1230]}],"
    "\"latency_le_us\":" S_LE ","
    "\"bytes\":{\"in\":10013885,\"out\":986306314},"
    "\"reads\":{\"hits\":28800,\"misses\":{\"ENOTFOUND\":360,\"EEXPIRED\":12},\"quarantined\":2},"
    "\"served_bytes\":{\"lossless\":0,\"int8\":986131232},"
    "\"tenants\":[{\"tenant\":\"loopback\",\"requests\":1588,\"stored_bytes\":9817344}],"
    "\"hot\":{\"accesses\":1230,\"capacity\":768,\"memory_bytes\":709968,\"prefixes\":["
    "{\"id\":\"91f0930234f08b6969b0a0c02213acaf9e9f7842bbfbc6be264ce6b82c5b37e6\","
    "\"model\":\"opt-125m\",\"count\":820,\"error\":3,\"bytes\":30679200,"
    "\"layers\":[[0,70],[1,70],[5,68],[500,1]],\"heads\":[[0,820],[11,820]]}]},"
    "\"store\":{\"blocks\":288,\"bytes\":9817344,\"fp16_bytes\":18874368,\"pinned_blocks\":144,"
    "\"pinned_bytes\":4908672,\"capacity_bytes\":1073741824,\"quarantined\":1,"
    "\"evicted_blocks\":4,\"expired\":12},"
    "\"sync\":{\"last_pass_ms\":1795529990000,\"subscriptions\":[{\"name\":\"docs\",\"cloud\":"
    "\"tcp://10.0.0.9:7400\",\"state\":\"partial\",\"chunks_total\":40,\"chunks_synced\":31,"
    "\"blocks_held\":4032,\"last_ok_ms\":1795529990000,\"last_error\":\"operation timed out\"}]},"
    "\"master\":{\"endpoint\":\"tcp://10.0.0.2:7500,tcp://10.0.0.3:7500\",\"node_id\":"
    "\"edge-a\",\"following\":\"tcp://10.0.0.3:7500\",\"moves\":2,\"redirects\":1,\"state\":"
    "\"registered\",\"attempts\":1,\"why\":\"\"}}";

static const char s_proxy_doc[] =
    "{\"kind\":\"proxy\",\"name\":\"proxy\",\"version\":\"0.1.0\",\"time_ms\":1795529948662,"
    "\"uptime_ms\":7212,\"ready\":false,\"not_ready\":\"no sources known\","
    "\"stats\":{\"requests\":6,\"layers\":72,\"misses\":2,\"fallbacks\":1,\"corrupt\":0,"
    "\"bytes\":58982400,\"source_failures\":1,\"buffered_bytes\":3355443,\"fetches_open\":1},"
    "\"sources\":[{\"name\":\"n1\",\"kind\":\"local\",\"endpoint\":\"tcp://127.0.0.1:49152\","
    "\"origin\":\"config\",\"connected\":true,\"state\":\"up\",\"weight\":1,\"rtt_us\":448.5,"
    "\"bandwidth\":1351587629,\"failures\":0,\"last_error\":\"\"},"
    "{\"name\":\"h1\",\"kind\":\"history\",\"endpoint\":\"tcp://10.0.0.5:7400\",\"origin\":"
    "\"master\",\"connected\":false,\"state\":\"down\",\"weight\":0,\"rtt_us\":0,\"bandwidth\":0,"
    "\"failures\":9,\"last_error\":\"connection closed\",\"history\":{\"state\":\"partial\","
    "\"chunks_missing\":9,\"blocks_held\":4032,\"last_success_age_s\":812.5}}],"
    "\"layers\":[{\"kind\":\"local\",\"reason\":\"planned\",\"count\":60},"
    "{\"kind\":\"none\",\"reason\":\"miss\",\"count\":2}],"
    "\"fetch\":{\"ok\":5,\"failed\":1,\"le_us\":" S_LE ","
    "\"plan\":{\"count\":6,\"sum_us\":480,\"buckets\":[0,0,0,3,6,6,6,6,6,6,6,6,6,6,6,6,6,6,6,6,6,"
    "6,6]},"
    "\"first_layer\":{\"count\":6,\"sum_us\":15360,\"buckets\":[0,0,0,0,0,0,0,1,4,6,6,6,6,6,6,6,6,"
    "6,6,6,6,6,6]},"
    "\"last_layer\":{\"count\":5,\"sum_us\":123000,\"buckets\":[]},"
    "\"planned\":{\"count\":0,\"sum_us\":0,\"buckets\":[]},\"actual_to_plan_median\":0.77},"
    "\"transitions\":[{\"time_ms\":1795529941000,\"source\":\"h1\",\"from\":\"up\",\"to\":"
    "\"down\",\"reason\":\"connection closed\"}],\"transitions_total\":1,"
    "\"master\":{\"endpoint\":\"tcp://10.0.0.2:7500\",\"registry\":\"synced\",\"nodes\":[{\"node\":"
    "\"n1\",\"role\":\"edge\",\"endpoint\":\"tcp://10.0.0.4:7400\",\"health\":\"up\","
    "\"last_seen_ms\":1795529400000}]}}";

static kvedge_top_doc_t *s_doc(void)
{
    kvedge_top_doc_t *d = malloc(sizeof *d);
    assert_non_null(d);
    memset(d, 0xA5, sizeof *d); /* the parse must clear it */
    return d;
}

static int s_parse(const char *json, kvedge_top_doc_t *d)
{
    return kvedge_top_doc_parse(json, strlen(json), d);
}

static bool s_is_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

static void test_node_document(void **state)
{
    (void)state;
    kvedge_top_doc_t *d = s_doc();
    assert_int_equal(s_parse(s_node_doc, d), KVEDGE_OK);
    assert_int_equal(d->kind, KVEDGE_TOP_DOC_NODE);
    assert_string_equal(d->name, "edge-a");
    assert_string_equal(d->role, "edge");
    assert_string_equal(d->version, "0.1.0");
    assert_int_equal(d->time_ms, 1795529948662ull);
    assert_int_equal(d->uptime_ms, 3723000);
    assert_true(d->ready);
    assert_string_equal(d->not_ready, "");
    assert_true(d->node.analyzer);
    /* requests by (op, status) fold into one entry per op */
    assert_int_equal(d->node.nops, 2);
    const kvedge_top_op_t *gl = kvedge_top_doc_op(d, "GET_LAYER");
    assert_non_null(gl);
    assert_int_equal(gl->requests, 1230);
    assert_int_equal(gl->errors, 30);
    assert_int_equal(gl->latency.count, 1230);
    assert_int_equal(gl->latency.sum_us, 1102385);
    assert_int_equal(gl->latency.nbuckets, 23);
    assert_int_equal(gl->latency.buckets[7], 1020);
    const kvedge_top_op_t *hello = kvedge_top_doc_op(d, "HELLO");
    assert_non_null(hello);
    assert_int_equal(hello->requests, 15);
    assert_int_equal(hello->errors, 0);
    assert_int_equal(hello->latency.count, 0);
    assert_null(kvedge_top_doc_op(d, "PUT"));
    assert_int_equal(d->node.nle, 23);
    assert_int_equal(d->node.le_us[0], 10);
    assert_int_equal(d->node.le_us[22], 41943040);
    assert_int_equal(d->node.bytes_in, 10013885);
    assert_int_equal(d->node.bytes_out, 986306314);
    assert_int_equal(d->node.hits, 28800);
    assert_int_equal(d->node.misses, 372);
    assert_int_equal(d->node.nmiss_reasons, 2);
    assert_string_equal(d->node.miss_reasons[1].a, "EEXPIRED");
    assert_int_equal(d->node.miss_reasons[1].count, 12);
    assert_int_equal(d->node.quarantined_reads, 2);
    assert_int_equal(d->node.nschemes, 2);
    assert_string_equal(d->node.served[1].a, "int8");
    assert_int_equal(d->node.served[1].count, 986131232);
    assert_int_equal(d->node.ntenants, 1);
    assert_string_equal(d->node.tenants[0].tenant, "loopback");
    assert_int_equal(d->node.tenants[0].requests, 1588);
    assert_int_equal(d->node.hot.accesses, 1230);
    assert_int_equal(d->node.hot.capacity, 768);
    assert_int_equal(d->node.hot.nprefixes, 1);
    const kvedge_top_prefix_t *p = &d->node.hot.prefixes[0];
    assert_string_equal(p->id, "91f0930234f08b6969b0a0c02213acaf9e9f7842bbfbc6be264ce6b82c5b37e6");
    assert_string_equal(p->model, "opt-125m");
    assert_int_equal(p->count, 820);
    assert_int_equal(p->error, 3);
    assert_int_equal(p->bytes, 30679200);
    assert_int_equal(p->layers[0], 70);
    assert_int_equal(p->layers[1], 70);
    assert_int_equal(p->layers[2], 0);
    assert_int_equal(p->layers[5], 68);
    assert_int_equal(p->layers[KVEDGE_TOP_DOC_HOT_LAYERS - 1], 1); /* layer 500: the last */
    assert_int_equal(p->heads[11], 820);
    assert_true(d->node.has_store);
    assert_int_equal(d->node.store.blocks, 288);
    assert_int_equal(d->node.store.fp16_bytes, 18874368);
    assert_int_equal(d->node.store.pinned_blocks, 144);
    assert_int_equal(d->node.store.capacity_bytes, 1073741824);
    assert_int_equal(d->node.store.quarantined, 1);
    assert_int_equal(d->node.store.evicted_blocks, 4);
    assert_int_equal(d->node.store.expired, 12);
    assert_true(d->node.has_sync);
    assert_int_equal(d->node.sync_last_pass_ms, 1795529990000ull);
    assert_int_equal(d->node.nsubs, 1);
    assert_string_equal(d->node.subs[0].name, "docs");
    assert_string_equal(d->node.subs[0].state, "partial");
    assert_int_equal(d->node.subs[0].chunks_total, 40);
    assert_int_equal(d->node.subs[0].chunks_synced, 31);
    assert_string_equal(d->node.subs[0].last_error, "operation timed out");
    assert_true(d->node.has_master);
    assert_string_equal(d->node.master.endpoint, "tcp://10.0.0.2:7500,tcp://10.0.0.3:7500");
    assert_string_equal(d->node.master.following, "tcp://10.0.0.3:7500");
    assert_int_equal(d->node.master.moves, 2);
    assert_string_equal(d->node.master.state, "registered");
    assert_int_equal(d->node.master.attempts, 1);
    /* a node document leaves the proxy's part empty */
    assert_true(s_is_zero(&d->proxy, sizeof d->proxy));
    free(d);
}

static void test_proxy_document(void **state)
{
    (void)state;
    kvedge_top_doc_t *d = s_doc();
    assert_int_equal(s_parse(s_proxy_doc, d), KVEDGE_OK);
    assert_int_equal(d->kind, KVEDGE_TOP_DOC_PROXY);
    assert_string_equal(d->name, "proxy");
    assert_string_equal(d->role, "proxy");
    assert_false(d->ready);
    assert_string_equal(d->not_ready, "no sources known");
    assert_int_equal(d->proxy.stats.requests, 6);
    assert_int_equal(d->proxy.stats.layers, 72);
    assert_int_equal(d->proxy.stats.bytes, 58982400);
    assert_int_equal(d->proxy.stats.buffered_bytes, 3355443);
    assert_int_equal(d->proxy.stats.fetches_open, 1);
    assert_int_equal(d->proxy.nsources, 2);
    const kvedge_top_source_t *n1 = &d->proxy.sources[0], *h1 = &d->proxy.sources[1];
    assert_string_equal(n1->name, "n1");
    assert_string_equal(n1->kind, "local");
    assert_string_equal(n1->origin, "config");
    assert_true(n1->connected);
    assert_string_equal(n1->state, "up");
    assert_true(n1->rtt_us == 448.5);
    assert_true(n1->bandwidth == 1351587629.0);
    assert_false(n1->has_history);
    assert_false(h1->connected);
    assert_int_equal(h1->failures, 9);
    assert_string_equal(h1->last_error, "connection closed");
    assert_true(h1->has_history);
    assert_string_equal(h1->history.state, "partial");
    assert_int_equal(h1->history.chunks_missing, 9);
    assert_int_equal(h1->history.blocks_held, 4032);
    assert_true(h1->history.last_success_age_s == 812.5);
    assert_int_equal(d->proxy.nlayers, 2);
    assert_string_equal(d->proxy.layers[1].a, "none");
    assert_string_equal(d->proxy.layers[1].b, "miss");
    assert_int_equal(d->proxy.layers[1].count, 2);
    assert_int_equal(d->proxy.fetch.ok, 5);
    assert_int_equal(d->proxy.fetch.failed, 1);
    assert_int_equal(d->proxy.fetch.nle, 23);
    assert_int_equal(d->proxy.fetch.plan.count, 6);
    assert_int_equal(d->proxy.fetch.first_layer.buckets[8], 4);
    assert_int_equal(d->proxy.fetch.last_layer.count, 5);
    assert_int_equal(d->proxy.fetch.last_layer.nbuckets, 0);
    assert_true(d->proxy.fetch.actual_to_plan_median == 0.77);
    assert_int_equal(d->proxy.ntransitions, 1);
    assert_string_equal(d->proxy.transitions[0].source, "h1");
    assert_string_equal(d->proxy.transitions[0].to, "down");
    assert_int_equal(d->proxy.transitions_total, 1);
    assert_true(d->proxy.has_master);
    assert_string_equal(d->proxy.master.registry, "synced");
    assert_int_equal(d->proxy.master.nnodes, 1);
    assert_string_equal(d->proxy.master.nodes[0].health, "up");
    assert_int_equal(d->proxy.master.nodes[0].last_seen_ms, 1795529400000ull);
    assert_true(s_is_zero(&d->node, sizeof d->node));
    free(d);
}

/* Every field of the wrong type: zeros and empty strings, and the parse still succeeds. */
static void test_wrong_types(void **state)
{
    (void)state;
    kvedge_top_doc_t *d = s_doc();
    const char *node = "{\"kind\":\"node\",\"name\":7,\"role\":[],\"version\":null,"
                       "\"time_ms\":\"now\",\"uptime_ms\":-5,\"ready\":1,\"not_ready\":false,"
                       "\"requests\":{\"op\":\"GET\"},\"latency\":[1,\"x\",{\"op\":3},"
                       "{\"op\":\"GET\",\"count\":\"9\",\"buckets\":{\"a\":1}}],"
                       "\"latency_le_us\":[\"10\",-20,1e400,40.5],"
                       "\"bytes\":[1,2],\"reads\":{\"hits\":true,\"misses\":[3]},"
                       "\"served_bytes\":\"int8\",\"tenants\":[7,{\"tenant\":1}],"
                       "\"hot\":{\"accesses\":1e30,\"prefixes\":[{\"id\":5,\"layers\":[[\"a\",1],"
                       "[1],3,[-1,5],[2,-7],[3,1e400]],\"heads\":{}}]},"
                       "\"store\":7,\"sync\":[],\"master\":\"m\"}";
    assert_int_equal(s_parse(node, d), KVEDGE_OK);
    assert_int_equal(d->kind, KVEDGE_TOP_DOC_NODE);
    assert_string_equal(d->name, "");
    assert_string_equal(d->role, "");
    assert_string_equal(d->version, "");
    assert_int_equal(d->time_ms, 0);
    assert_int_equal(d->uptime_ms, 0); /* a negative count is no count */
    assert_false(d->ready);            /* 1 is not true */
    assert_false(d->node.analyzer);    /* "requests" is not an array */
    assert_int_equal(d->node.nops, 1); /* only the latency entry with a string op */
    assert_string_equal(d->node.ops[0].op, "GET");
    assert_int_equal(d->node.ops[0].latency.count, 0);
    assert_int_equal(d->node.ops[0].latency.nbuckets, 0);
    assert_int_equal(d->node.nle, 4);
    assert_int_equal(d->node.le_us[0], 0);
    assert_int_equal(d->node.le_us[1], 0);
    assert_int_equal(d->node.le_us[2], 0); /* not finite */
    assert_int_equal(d->node.le_us[3], 40);
    assert_int_equal(d->node.bytes_in, 0);
    assert_int_equal(d->node.hits, 0);
    assert_int_equal(d->node.nmiss_reasons, 0);
    assert_int_equal(d->node.nschemes, 0);
    assert_int_equal(d->node.ntenants, 2);
    assert_string_equal(d->node.tenants[1].tenant, "");
    assert_int_equal(d->node.hot.accesses, UINT64_MAX); /* saturated */
    assert_int_equal(d->node.hot.nprefixes, 1);
    assert_string_equal(d->node.hot.prefixes[0].id, "");
    for (size_t i = 0; i < KVEDGE_TOP_DOC_HOT_LAYERS; i++)
        assert_int_equal(d->node.hot.prefixes[0].layers[i], 0);
    assert_false(d->node.has_store);
    assert_false(d->node.has_sync);
    assert_false(d->node.has_master);

    const char *proxy = "{\"kind\":\"proxy\",\"stats\":[],\"sources\":[1,null,{\"name\":[],"
                        "\"connected\":\"yes\",\"rtt_us\":-3,\"bandwidth\":1e999,\"weight\":\"1\","
                        "\"history\":{\"last_success_age_s\":\"old\"}}],"
                        "\"layers\":{},\"fetch\":{\"plan\":[],\"first_layer\":{\"buckets\":\"x\"},"
                        "\"actual_to_plan_median\":-1},\"transitions\":\"none\","
                        "\"transitions_total\":-1,\"master\":{\"nodes\":{\"node\":\"n\"}}}";
    assert_int_equal(s_parse(proxy, d), KVEDGE_OK);
    assert_int_equal(d->kind, KVEDGE_TOP_DOC_PROXY);
    assert_int_equal(d->proxy.stats.requests, 0);
    assert_int_equal(d->proxy.nsources, 3); /* entries of the wrong type leave empty rows */
    const kvedge_top_source_t *s = &d->proxy.sources[2];
    assert_string_equal(s->name, "");
    assert_false(s->connected);
    assert_true(s->rtt_us == 0);
    assert_true(s->bandwidth == 0);
    assert_true(s->weight == 0);
    assert_true(s->has_history);
    assert_true(s->history.last_success_age_s == -1);
    assert_false(d->proxy.sources[0].has_history);
    assert_int_equal(d->proxy.nlayers, 0);
    assert_int_equal(d->proxy.fetch.plan.count, 0);
    assert_int_equal(d->proxy.fetch.first_layer.nbuckets, 0);
    assert_true(d->proxy.fetch.actual_to_plan_median == 0);
    assert_int_equal(d->proxy.ntransitions, 0);
    assert_int_equal(d->proxy.transitions_total, 0);
    assert_true(d->proxy.has_master);
    assert_int_equal(d->proxy.master.nnodes, 0);
    free(d);
}

static void test_missing_fields(void **state)
{
    (void)state;
    kvedge_top_doc_t *d = s_doc();
    assert_int_equal(s_parse("{\"kind\":\"node\"}", d), KVEDGE_OK);
    assert_int_equal(d->kind, KVEDGE_TOP_DOC_NODE);
    kvedge_top_doc_t *z = calloc(1, sizeof *z);
    assert_non_null(z);
    z->kind = KVEDGE_TOP_DOC_NODE;
    assert_memory_equal(d, z, sizeof *d);
    assert_int_equal(s_parse("{\"kind\":\"proxy\"}", d), KVEDGE_OK);
    z->kind = KVEDGE_TOP_DOC_PROXY;
    snprintf(z->role, sizeof z->role, "proxy");
    assert_memory_equal(d, z, sizeof *d);
    free(z);
    free(d);
}

/* Arrays past the caps: the first ones kept (the last ones for transitions). */
static void test_huge_arrays(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    char *j = malloc(cap);
    assert_non_null(j);
    size_t n = (size_t)snprintf(j, cap, "{\"kind\":\"proxy\",\"sources\":[");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(j + n, cap - n, "%s{\"name\":\"s%d\"}", i ? "," : "", i);
    n += (size_t)snprintf(j + n, cap - n, "],\"transitions\":[");
    for (int i = 0; i < 64; i++)
        n += (size_t)snprintf(j + n, cap - n, "%s{\"source\":\"t%d\",\"time_ms\":%d}", i ? "," : "",
                              i, i);
    n += (size_t)snprintf(j + n, cap - n, "],\"layers\":[");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(j + n, cap - n, "%s{\"kind\":\"local\",\"count\":1}", i ? "," : "");
    n += (size_t)snprintf(j + n, cap - n, "],\"fetch\":{\"le_us\":[");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(j + n, cap - n, "%s%d", i ? "," : "", i);
    n += (size_t)snprintf(j + n, cap - n, "]}}");
    kvedge_top_doc_t *d = s_doc();
    assert_int_equal(kvedge_top_doc_parse(j, n, d), KVEDGE_OK);
    assert_int_equal(d->proxy.nsources, KVEDGE_TOP_DOC_MAX_SOURCES);
    assert_string_equal(d->proxy.sources[31].name, "s31");
    assert_int_equal(d->proxy.ntransitions, KVEDGE_TOP_DOC_MAX_TRANSITIONS);
    assert_string_equal(d->proxy.transitions[0].source, "t48");
    assert_string_equal(d->proxy.transitions[15].source, "t63");
    assert_int_equal(d->proxy.nlayers, KVEDGE_TOP_DOC_MAX_REASONS);
    assert_int_equal(d->proxy.fetch.nle, KVEDGE_TOP_DOC_MAX_BUCKETS);

    n = (size_t)snprintf(j, cap, "{\"kind\":\"node\",\"requests\":[");
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(j + n, cap - n, "%s{\"op\":\"OP%d\",\"status\":\"OK\",\"count\":1}",
                              i ? "," : "", i % 30);
    n += (size_t)snprintf(j + n, cap - n, "],\"hot\":{\"prefixes\":[");
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(j + n, cap - n, "%s{\"id\":\"%064d\",\"count\":%d}", i ? "," : "", i,
                              200 - i);
    n += (size_t)snprintf(j + n, cap - n, "]},\"sync\":{\"subscriptions\":[");
    for (int i = 0; i < 50; i++)
        n += (size_t)snprintf(j + n, cap - n, "%s{\"name\":\"s%d\"}", i ? "," : "", i);
    n += (size_t)snprintf(j + n, cap - n, "]}}");
    assert_int_equal(kvedge_top_doc_parse(j, n, d), KVEDGE_OK);
    assert_int_equal(d->node.nops, KVEDGE_TOP_DOC_MAX_OPS);
    assert_int_equal(d->node.ops[0].requests, 2); /* OP0 twice: i = 0 and 30 */
    assert_int_equal(d->node.hot.nprefixes, KVEDGE_TOP_DOC_MAX_PREFIXES);
    assert_int_equal(d->node.hot.prefixes[63].count, 137);
    assert_int_equal(strlen(d->node.hot.prefixes[63].id), 64);
    assert_int_equal(d->node.nsubs, KVEDGE_TOP_DOC_MAX_SUBS);

    /* Past the wire's bound: refused before parsing. */
    memset(j, ' ', cap);
    memcpy(j, "{\"kind\":\"node\"}", 15);
    assert_int_equal(kvedge_top_doc_parse(j, KVEDGE_WIRE_MAX_MONITOR_BYTES, d), KVEDGE_OK);
    char *big = malloc(KVEDGE_WIRE_MAX_MONITOR_BYTES + 1);
    assert_non_null(big);
    memset(big, ' ', KVEDGE_WIRE_MAX_MONITOR_BYTES + 1);
    memcpy(big, "{\"kind\":\"node\"}", 15);
    assert_int_equal(kvedge_top_doc_parse(big, KVEDGE_WIRE_MAX_MONITOR_BYTES + 1, d),
                     KVEDGE_ETOOBIG);
    assert_int_equal(d->kind, 0);
    free(big);
    free(j);
    free(d);
}

/* Long strings cut at a character boundary; control characters and bytes that are not UTF-8
 * cannot reach a terminal. */
static void test_strings(void **state)
{
    (void)state;
    kvedge_top_doc_t *d = s_doc();
    char j[1024];
    char name[200];
    memset(name, 'a', 62);
    snprintf(name + 62, sizeof name - 62, "\xc3\xa9zzzzzzzz"); /* "é" across the 63-byte cut */
    snprintf(j, sizeof j,
             "{\"kind\":\"node\",\"name\":\"%s\",\"role\":\"\\u001b[2Jedge\\n\","
             "\"version\":\"\xff\xfe\xc2\x9b\xe2\x82\xac\"}",
             name);
    assert_int_equal(s_parse(j, d), KVEDGE_OK);
    assert_int_equal(strlen(d->name), 62); /* the two-byte character does not fit */
    assert_string_equal(d->role, "?[2Jedge?");
    assert_string_equal(d->version, "????\xe2\x82\xac"); /* invalid, C1 CSI, then the euro */
    free(d);
}

static void test_refusals(void **state)
{
    (void)state;
    kvedge_top_doc_t *d = s_doc();
    static const char *const bad[] = {
        "",
        "[]",
        "42",
        "\"node\"",
        "null",
        "{",
        "{\"kind\":\"node\"",
        "{\"kind\":\"master\"}",
        "{\"kind\":\"Node\"}",
        "{\"kind\":1}",
        "{\"kind\":[\"node\"]}",
        "{\"name\":\"n\"}",
        "[{\"kind\":\"node\"}]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(d, 0xA5, sizeof *d);
        assert_int_equal(s_parse(bad[i], d), KVEDGE_EPROTO);
        assert_true(s_is_zero(d, sizeof *d));
    }
    /* Unterminated input: only len bytes count. */
    const char *two = "{\"kind\":\"node\"}{\"kind\":\"proxy\"}";
    assert_int_equal(kvedge_top_doc_parse(two, 15, d), KVEDGE_OK);
    assert_int_equal(d->kind, KVEDGE_TOP_DOC_NODE);
    assert_int_equal(kvedge_top_doc_parse(two, 10, d), KVEDGE_EPROTO);
    assert_int_equal(kvedge_top_doc_parse(NULL, 3, d), KVEDGE_EINVAL);
    assert_int_equal(kvedge_top_doc_parse("{}", 2, NULL), KVEDGE_EINVAL);
    free(d);
}

static void test_quantiles(void **state)
{
    (void)state;
    static const uint64_t le[] = {10, 20, 40, 80};
    kvedge_top_hist_t prev = {4, 40, 4, {4, 4, 4, 4}};        /* 4 observations <= 10 us */
    kvedge_top_hist_t cur = {104, 4040, 4, {4, 4, 104, 104}}; /* then 100 in (20, 40] */
    kvedge_top_hist_t acc = {0};
    assert_true(kvedge_top_hist_delta(&acc, &cur, &prev));
    assert_int_equal(acc.count, 100);
    assert_int_equal(acc.sum_us, 4000);
    assert_int_equal(acc.buckets[0], 0);
    assert_int_equal(acc.buckets[2], 100);
    double p50 = kvedge_top_hist_quantile(&acc, le, 4, 0.5);
    assert_true(p50 == 30.0); /* halfway through (20, 40] */
    assert_true(kvedge_top_hist_quantile(&acc, le, 4, 0.99) > 39.0);
    /* Accumulating another op's delta, from the start (prev NULL). */
    kvedge_top_hist_t other = {100, 500, 4, {100, 100, 100, 100}};
    assert_true(kvedge_top_hist_delta(&acc, &other, NULL));
    assert_int_equal(acc.count, 200);
    assert_true(kvedge_top_hist_quantile(&acc, le, 4, 0.25) <= 10.0);
    /* A restart (counts went down) and a different layout change nothing. */
    kvedge_top_hist_t before = acc;
    assert_false(kvedge_top_hist_delta(&acc, &prev, &cur));
    kvedge_top_hist_t three = {1, 1, 3, {1, 1, 1}};
    assert_false(kvedge_top_hist_delta(&acc, &three, NULL));
    assert_memory_equal(&acc, &before, sizeof acc);
    /* Without buckets the counts still subtract (found by fuzz_monitor: a previous snapshot
     * without buckets once counted as empty). */
    kvedge_top_hist_t nb_prev = {3, 30, 0, {0}}, nb_cur = {5, 50, 0, {0}}, nb_acc = {0};
    assert_true(kvedge_top_hist_delta(&nb_acc, &nb_cur, &nb_prev));
    assert_int_equal(nb_acc.count, 2);
    assert_true(kvedge_top_hist_delta(&nb_acc, &nb_cur, &nb_cur));
    assert_int_equal(nb_acc.count, 2);
    assert_false(kvedge_top_hist_delta(&nb_acc, &cur, NULL)); /* 4 buckets into a count without */
    /* Degenerate inputs: 0. */
    kvedge_top_hist_t empty = {0};
    assert_true(kvedge_top_hist_quantile(&empty, le, 4, 0.5) == 0);
    static const uint64_t not_doubling[] = {10, 20, 30, 80};
    assert_true(kvedge_top_hist_quantile(&cur, not_doubling, 4, 0.5) == 0);
    assert_true(kvedge_top_hist_quantile(&cur, le, 3, 0.5) == 0);
    assert_true(kvedge_top_hist_quantile(&cur, NULL, 4, 0.5) == 0);
    kvedge_top_hist_t unsorted = {10, 0, 4, {5, 3, 10, 10}};
    assert_true(kvedge_top_hist_quantile(&unsorted, le, 4, 0.5) == 0);
    static const uint64_t huge[] = {UINT64_MAX / 2, UINT64_MAX};
    kvedge_top_hist_t two = {1, 0, 2, {1, 1}};
    assert_true(kvedge_top_hist_quantile(&two, huge, 2, 0.5) == 0);
    /* Beyond the last bound: the last bound. */
    kvedge_top_hist_t inf = {10, 0, 4, {0, 0, 0, 0}};
    assert_true(kvedge_top_hist_quantile(&inf, le, 4, 0.5) == 80.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_document), cmocka_unit_test(test_proxy_document),
        cmocka_unit_test(test_wrong_types),   cmocka_unit_test(test_missing_fields),
        cmocka_unit_test(test_huge_arrays),   cmocka_unit_test(test_strings),
        cmocka_unit_test(test_refusals),      cmocka_unit_test(test_quantiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
