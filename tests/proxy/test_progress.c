/* A layer stream that is making progress is not a stalled one: a cloud node whose link is
 * far slower than the proxy believes (declared 1 GB/s, emulated 8 Mbit/s) streams each layer
 * for much longer than the stall window priced from the belief, but its blocks keep arriving,
 * so every layer is fetched from it and no source failure is counted. In-process node and
 * proxy over ipc with the emulated link (access/shaper.h); tests/proxy/test_jitter.c is the
 * same over a real jittery and lossy link. */
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

#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "store/node/node.h"
#include "access/codec/synth.h"
#include "tests/common/ctx_fx.h"
#include "tests/common/world.h"

#define S_MODEL  KT_CTX_MODEL /* built in: 12 layers x 12 heads x 64 */
#define S_LAYERS 4            /* put and fetched: the first four */
#define S_TOKENS KT_CTX_TOKENS
/* At 8 Mbit/s a layer (12 int8 blocks of 256 tokens, about 400 KB) takes about 0.4 s and the
 * four about 1.6 s: each stream outlives the 400 ms window many times over. */
#define S_LINK "8mbit,1ms"

static kvedge_chunk_id_t s_id;

static void s_put(const char *ep)
{
    uint32_t tok[S_TOKENS];
    for (uint32_t i = 0; i < S_TOKENS; i++)
        tok[i] = 3 * i + 1;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, S_MODEL, tok, S_TOKENS, S_TOKENS, &s_id, 1), 1);
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), 0);
    kt_put_chunk(c, &s_id, S_LAYERS, KVEDGE_SCHEME_INT8, 0);
    kvedge_client_destroy(&c);
}

static void test_slow_stream_is_not_stalled(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-progress-XXXXXX";
    assert_non_null(mkdtemp(root));
    char data[200], bind[200];
    snprintf(data, sizeof data, "%s/cloud1", root);
    snprintf(bind, sizeof bind, "ipc://%s/cloud1.sock", root);
    kvedge_node_settings_t ns;
    kt_node_settings(&ns, KVEDGE_ROLE_CLOUD, "cloud1", data, bind);
    kvedge_node_t *node = NULL;
    char why[256];
    if (kvedge_node_start(&ns, &node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node: %s", why);
    s_put(ns.bind);

    kvedge_proxy_source_t src;
    char spec[400], pep[300];
    snprintf(spec, sizeof spec, "cloud cloud1 %s bw=1000000000 rtt=200 link=%s", ns.bind, S_LINK);
    assert_int_equal(kvedge_proxy_source_parse(spec, &src), KVEDGE_OK);
    snprintf(pep, sizeof pep, "ipc://%s/proxy.sock", root);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = pep;
    po.insecure = true;
    po.sources = &src;
    po.nsources = 1;
    po.metrics = "off";
    kvedge_proxy_t *proxy = NULL;
    if (kvedge_proxy_start(&po, &proxy, why, sizeof why) != KVEDGE_OK)
        fail_msg("proxy: %s", why);
    assert_int_equal(kvedge_proxy_wait_sources(proxy, 1, 5000), KVEDGE_OK);

    kvedge_client_t *c = kt_client(pep, 20000);
    kt_fetch_t r = {0};
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_MODEL,
                              .chunks = &s_id,
                              .n = 1,
                              .layers = S_LAYERS,
                              .tokens = S_TOKENS,
                              .deadline_ms = 20000};
    kvedge_fetch_cbs_t cbs = {NULL, NULL, kt_fetch_layer, kt_fetch_done};
    int64_t t0 = zclock_mono();
    kt_fetch_wait(c, &req, &cbs, &r);
    int64_t ms = zclock_mono() - t0;
    kvedge_client_destroy(&c);

    kvedge_proxy_stats_t st;
    kvedge_proxy_stats(proxy, &st);
    print_message("%u of %u layers fetched in %lld ms; %llu source failures\n", r.fetched, S_LAYERS,
                  (long long)ms, (unsigned long long)st.source_failures);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.layers, S_LAYERS);
    assert_int_equal(r.fetched, S_LAYERS);
    assert_int_equal(st.source_failures, 0);
    /* The link was as slow as it says: the streams did outlive the window. */
    assert_true(ms > 2 * KVEDGE_PROXY_STALL_MIN_MS);
    kvedge_proxy_destroy(&proxy);
    kvedge_node_destroy(&node);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slow_stream_is_not_stalled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
