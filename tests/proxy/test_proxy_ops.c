/* The edge proxy under operational faults, with real processes: a cloud node stopped
 * (SIGSTOP) while a peer holds the shallow layers: every layer the peer holds is fetched from
 * it, none is reported as recomputed when the request allowed no recomputation, and the plan's
 * recompute-all total prints as unpriced (kvedge fetch, the decode printout: text and JSON);
 * sources learned from the master are labelled so; a node learned from the master that runs
 * CURVE is reached by a proxy whose clients are plaintext (its certificate loaded because the
 * master may name such nodes), and without a certificate the proxy says which flag to give; a
 * decode sent right after a prefill, before the node published its directory, fetches every
 * layer (the proxy asks its sources before it reports a miss), and a decode prints how many
 * layers were fetched, computed and missed, and why; a decode of a model the proxy's master
 * does not list yet waits for it (KVEDGE_PROXY_MODEL_WAIT_MS) instead of being refused at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <czmq.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/secure.h"
#include "clients/e2e/e2e.h"
#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "proxy/settings.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "access/codec/clock.h"
#include "access/codec/synth.h"
#include "tests/common/ctx_fx.h"
#include "tests/common/shell.h"
#include "tests/common/spawn.h"
#include "tests/common/testutil.h"
#include "tests/common/world.h"

#define S_MODEL  KT_CTX_MODEL /* built in: 12 layers x 12 heads x 64 */
#define S_HEADS  KT_CTX_HEADS
#define S_LAYERS KT_CTX_LAYERS
#define S_CHUNKS 2
#define S_TOKENS KT_CTX_TOKENS                           /* per chunk */
#define S_TINY   KVEDGE_FIXTURES "/opt_tiny.safetensors" /* OPT, 3 layers x 4 heads */

/* ---------------------------------------------------------------- the context */

static kt_ctx_t s_ctx;

static void s_rmrf(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---------------------------------------------------------------- daemons */

/* A store node in this process; registered with the master when mm is given (directory
 * every dir_ms), CURVE toward its clients unless insecure. */
typedef struct {
    char dir[200], ep[250];
    kvedge_node_t *node;
} s_node_t;

static void s_node_start(s_node_t *n, const char *root, const char *name, kvedge_role_t role,
                         const kt_master_t *mm, uint32_t dir_ms, bool insecure)
{
    memset(n, 0, sizeof *n);
    snprintf(n->dir, sizeof n->dir, "%.120s/%.60s", root, name);
    snprintf(n->ep, sizeof n->ep, "ipc://%.200s.sock", n->dir);
    kvedge_node_settings_t ns;
    kt_node_settings(&ns, role, name, n->dir, n->ep);
    ns.insecure = insecure;
    if (mm) {
        snprintf(ns.master, sizeof ns.master, "%s", mm->ep);
        snprintf(ns.master_pub, sizeof ns.master_pub, "%s", mm->pub);
        snprintf(ns.node_id, sizeof ns.node_id, "%s", name);
        ns.dir_interval_ms = dir_ms;
    }
    char why[256];
    if (kvedge_node_start(&ns, &n->node, why, sizeof why) != 0)
        fail_msg("start %s: %s", name, why);
}

/* A plaintext cloud node in its own process (`kvedge store`), so it can be stopped. */
static pid_t s_spawn_cloud(const char *root, const char *ep)
{
    pid_t pid = kt_spawn_cloud(KVEDGE_BIN, root, ep);
    assert_true(pid > 0);
    return pid;
}

static kvedge_proxy_t *s_proxy(kvedge_proxy_opts_t *po, const char *root, char *ep, size_t ep_len)
{
    snprintf(ep, ep_len, "ipc://%s/proxy.sock", root);
    po->bind = ep;
    po->insecure = true;
    po->id = "proxy-ops";
    po->metrics = "off";
    char why[256];
    kvedge_proxy_t *p = NULL;
    if (kvedge_proxy_start(po, &p, why, sizeof why) != 0)
        fail_msg("proxy: %s", why);
    return p;
}

/* ---------------------------------------------------------------- fetching */

typedef struct {
    kt_fetch_t end; /* first */
    kvedge_fetch_plan_t plan;
    kvedge_fetch_layer_t layer[S_LAYERS];
    char src[S_LAYERS][64];
    uint32_t layers;
} s_result_t;

static void s_r_plan(void *ctx, const kvedge_fetch_plan_t *p)
{
    ((s_result_t *)ctx)->plan = *p;
}

static void s_r_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_result_t *r = ctx;
    if (r->layers < S_LAYERS) {
        r->layer[r->layers] = *l;
        snprintf(r->src[r->layers], sizeof r->src[0], "%s", l->source_name);
    }
    r->layers++;
}

/* Fetches every layer through the proxy, without decoder times (fetch only: the request
 * allows no recomputation). */
static void s_fetch(const char *proxy_ep, int deadline_ms, s_result_t *r)
{
    memset(r, 0, sizeof *r);
    r->end.ctx = &s_ctx;
    kvedge_client_t *c = kt_client(proxy_ep, deadline_ms);
    kvedge_fetch_req_t req = {.size = sizeof(kvedge_fetch_req_t),
                              .model_id = S_MODEL,
                              .chunks = s_ctx.ids,
                              .n = S_CHUNKS,
                              .layers = S_LAYERS,
                              .tokens = S_CHUNKS * S_TOKENS,
                              .deadline_ms = deadline_ms};
    kvedge_fetch_cbs_t cbs = {s_r_plan, kt_fetch_block, s_r_layer, kt_fetch_done};
    kt_fetch_wait(c, &req, &cbs, r);
    kvedge_client_destroy(&c);
}

static cJSON *s_monitor(const char *ep)
{
    kvedge_client_t *c = kt_client(ep, 5000);
    char *json = NULL;
    size_t len = 0;
    assert_int_equal(kvedge_client_monitor(c, 0, &json, &len), 0);
    kvedge_client_destroy(&c);
    cJSON *doc = cJSON_ParseWithLength(json, len);
    assert_non_null(doc);
    free(json);
    return doc;
}

/* The proxy's MONITOR entry of source name (caller deletes *doc), or NULL. */
static const cJSON *s_source_entry(const char *pep, const char *name, cJSON **doc)
{
    *doc = s_monitor(pep);
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(*doc, "sources"))
    {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (cJSON_IsString(n) && strcmp(n->valuestring, name) == 0)
            return e;
    }
    return NULL;
}

static const char *s_str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* ---------------------------------------------------------------- tests */

/* The cloud holds all 12 layers, a peer layers 0-5; the cloud is stopped (SIGSTOP: its socket
 * stays open, nothing answers). A FETCH without decoder times allows no recomputation: every
 * layer the peer holds is delivered from it in every one of 8 fetches, and none is reported
 * as recomputed (the deep layers nobody can deliver are misses). */
static void test_peer_layers_fetched_while_cloud_stopped(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-pops-XXXXXX";
    assert_non_null(mkdtemp(root));
    char cep[300];
    snprintf(cep, sizeof cep, "ipc://%s/cloud.sock", root);
    pid_t cloud = s_spawn_cloud(root, cep);
    kt_ctx_put(&s_ctx, cep, 0, S_LAYERS, false);
    s_node_t peer;
    s_node_start(&peer, root, "peer1", KVEDGE_ROLE_EDGE, NULL, 0, true);
    kt_ctx_put(&s_ctx, peer.ep, 0, 6, false);

    kvedge_proxy_source_t src[2];
    char spec[600];
    snprintf(spec, sizeof spec, "cloud cloud1 %s bw=125000000 rtt=2000", cep);
    assert_int_equal(kvedge_proxy_source_parse(spec, &src[0]), 0);
    snprintf(spec, sizeof spec, "peer peer1 %s bw=125000000 rtt=1000", peer.ep);
    assert_int_equal(kvedge_proxy_source_parse(spec, &src[1]), 0);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.sources = src;
    po.nsources = 2;
    po.stall_min_ms = 200;
    char pep[350];
    kvedge_proxy_t *p = s_proxy(&po, root, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(p, 2, 5000), 0);

    assert_int_equal(kill(cloud, SIGSTOP), 0);
    for (int i = 0; i < 8; i++) {
        s_result_t r;
        s_fetch(pep, 5000, &r);
        assert_int_equal(r.end.status, 0);
        assert_int_equal(r.layers, S_LAYERS);
        assert_int_equal(r.end.mismatches, 0);
        for (uint32_t l = 0; l < S_LAYERS; l++) {
            const kvedge_fetch_layer_t *ly = &r.layer[l];
            if (ly->reason == KVEDGE_FETCH_RECOMPUTE)
                fail_msg("fetch %d: layer %u reported recompute (the request sent no times)", i, l);
            if (l < 6) {
                if (ly->status != 0)
                    fail_msg("fetch %d: layer %u (held by the peer) not delivered: %s", i, l,
                             kvedge_fetch_reason_name(ly->reason));
                assert_string_equal(r.src[l], "peer1");
            } else {
                assert_int_equal(ly->status, KVEDGE_ENOTFOUND);
            }
        }
        /* Nothing in the plan is priced as recomputation: the request allowed none. */
        for (uint32_t l = 0; l < 6; l++)
            assert_true(r.plan.layer[l].source >= 0);
    }

    /* `kvedge fetch` prints the plan's totals: recompute-all is unpriced, not a time. */
    char hex[S_CHUNKS][KVEDGE_CHUNK_ID_HEX_BYTES], cmd[1200];
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s -H %s fetch --model %s --chunks %s,%s 2>/dev/null", KVEDGE_BIN,
             pep, S_MODEL, kvedge_chunk_id_hex(&s_ctx.ids[0], hex[0]),
             kvedge_chunk_id_hex(&s_ctx.ids[1], hex[1]));
    kt_capture(cmd, out, sizeof out);
    if (!strstr(out, "recompute-all unpriced)"))
        fail_msg("kvedge fetch printed:\n%s", out);

    kill(cloud, SIGKILL);
    kill(cloud, SIGCONT);
    waitpid(cloud, NULL, 0);
    kvedge_proxy_destroy(&p);
    kvedge_node_destroy(&peer.node);
    s_rmrf(root);
}

/* The decode printout: a total the proxy could not price (1e300 on the wire: recomputation
 * the request did not allow) is "unpriced" in text and null in JSON, never a time. */
static void test_decode_prints_unpriced(void **state)
{
    (void)state;
    kvedge_e2e_result_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->mode = KVEDGE_E2E_KVEDGE;
    r->have_plan = true;
    r->plan.layers = 1;
    r->plan.total_us = 2500;
    r->plan.bound_us = 2000;
    r->plan.cloud_only_us = 1e300;
    r->plan.recompute_all_us = 1e300;
    r->plan.load_then_compute_us = 3000;
    static char buf[1 << 16];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    assert_non_null(f);
    kvedge_e2e_print(f, r, false);
    fclose(f);
    if (!strstr(buf, "cloud-only unpriced, recompute-all unpriced") || strstr(buf, "e+") ||
        !strstr(buf, "T 2.50 ms"))
        fail_msg("text:\n%s", buf);
    f = fmemopen(buf, sizeof buf, "w");
    assert_non_null(f);
    kvedge_e2e_print(f, r, true);
    fclose(f);
    cJSON *doc = cJSON_Parse(buf);
    if (!doc)
        fail_msg("not JSON:\n%s", buf);
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(doc, "plan");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(plan, "recompute_all_ms")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(plan, "cloud_only_ms")));
    assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(plan, "total_ms")));
    cJSON_Delete(doc);
    free(r);
}

typedef struct {
    const char *pep, *name;
    bool (*ok)(const cJSON *e, const void *arg);
    const void *arg;
} s_source_ctx_t;

static bool s_source_ok(void *arg)
{
    s_source_ctx_t *x = arg;
    cJSON *doc;
    const cJSON *e = s_source_entry(x->pep, x->name, &doc);
    bool yes = e && x->ok(e, x->arg);
    cJSON_Delete(doc);
    return yes;
}

/* Polls the proxy's MONITOR document until source name's entry satisfies ok (KT_WAIT_MS at
 * most); returns whether it did. */
static bool s_wait_source(const char *pep, const char *name,
                          bool (*ok)(const cJSON *e, const void *arg), const void *arg)
{
    s_source_ctx_t x = {pep, name, ok, arg};
    return kt_poll(s_source_ok, &x, KT_WAIT_MS);
}

static bool s_is_up(const cJSON *e, const void *arg)
{
    (void)arg;
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "connected")) &&
           strcmp(s_str(e, "state"), "up") == 0;
}

static bool s_error_has(const cJSON *e, const void *arg)
{
    return strstr(s_str(e, "last_error"), (const char *)arg) != NULL &&
           strcmp(s_str(e, "state"), "down") == 0;
}

/* A node learned from the master runs CURVE; the proxy's clients are plaintext (--insecure)
 * and it has a certificate (--cert): it loads it because the master may name such nodes, and
 * reaches the node once the node allowlists it. The `sources` view says where each source
 * came from: master for n1, config for the static one. A proxy without a certificate says in
 * the view which flag to give, and counts the node down. */
static void test_curve_node_from_master(void **state)
{
    (void)state;
    char root[] = "/tmp/kvedge-pops-XXXXXX";
    assert_non_null(mkdtemp(root));
    kt_master_t mm;
    kt_master_start(&mm, root);
    s_node_t n1, st;
    s_node_start(&n1, root, "n1", KVEDGE_ROLE_CLOUD, &mm, 100, false);
    s_node_start(&st, root, "static1", KVEDGE_ROLE_EDGE, NULL, 0, true);

    /* The daemon's path: settings, as `kvedge proxy --insecure --master .. --cert ..`. */
    kvedge_proxy_settings_t ps;
    kvedge_proxy_settings_default(&ps);
    char pep[200];
    snprintf(pep, sizeof pep, "ipc://%s/proxy.sock", root);
    snprintf(ps.bind, sizeof ps.bind, "%s", pep);
    ps.insecure = true;
    snprintf(ps.master, sizeof ps.master, "%s", mm.ep);
    snprintf(ps.master_pub, sizeof ps.master_pub, "%s", mm.pub);
    snprintf(ps.cert, sizeof ps.cert, "%.200s/proxy.cert", root);
    snprintf(ps.metrics, sizeof ps.metrics, "off");
    snprintf(ps.source[0], sizeof ps.source[0], "peer static1 %s", st.ep);
    ps.nsource = 1;
    kvedge_proxy_t *p = NULL;
    char why[512];
    if (kvedge_proxy_settings_start(&ps, &p, why, sizeof why) != 0)
        fail_msg("proxy: %s", why);
    /* n1 lets the proxy in: its public certificate in n1's clients directory. */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%.300s' '%.200s/clients/proxy.cert'", ps.cert, n1.dir);
    assert_int_equal(system(cmd), 0);
    if (!s_wait_source(pep, "n1", s_is_up, NULL)) {
        cJSON *doc;
        const cJSON *e = s_source_entry(pep, "n1", &doc);
        char *txt = e ? cJSON_PrintUnformatted(e) : NULL;
        fail_msg("n1 never came up: %s", txt ? txt : "(not listed)");
    }
    cJSON *doc;
    const cJSON *e = s_source_entry(pep, "n1", &doc);
    assert_string_equal(s_str(e, "origin"), "master");
    cJSON_Delete(doc);
    e = s_source_entry(pep, "static1", &doc);
    assert_non_null(e);
    assert_string_equal(s_str(e, "origin"), "config");
    cJSON_Delete(doc);
    /* The CLI's table says the same. */
    static char out[1 << 16];
    snprintf(cmd, sizeof cmd, "%s -H %s sources 2>&1", KVEDGE_BIN, pep);
    assert_int_equal(kt_capture(cmd, out, sizeof out), 0);
    const char *row = strstr(out, "\nn1 ");
    if (!row || !strstr(row, " master ") || !strstr(strstr(out, "\nstatic1 "), " config "))
        fail_msg("kvedge sources printed:\n%s", out);
    kvedge_proxy_destroy(&p);

    /* No certificate at all (the library's path): the view names the flag. */
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.master = mm.ep;
    po.master_pub = mm.pub;
    p = s_proxy(&po, root, pep, sizeof pep);
    if (!s_wait_source(pep, "n1", s_error_has, "--cert FILE")) {
        e = s_source_entry(pep, "n1", &doc);
        char *txt = e ? cJSON_PrintUnformatted(e) : NULL;
        fail_msg("n1's entry does not say to give --cert: %s", txt ? txt : "(not listed)");
    }
    snprintf(cmd, sizeof cmd, "%s -H %s sources 2>&1", KVEDGE_BIN, pep);
    assert_int_equal(kt_capture(cmd, out, sizeof out), 0);
    if (!strstr(out, "no certificate: start the proxy with --cert FILE"))
        fail_msg("kvedge sources printed:\n%s", out);
    kvedge_proxy_destroy(&p);

    kvedge_node_destroy(&st.node);
    kvedge_node_destroy(&n1.node);
    kvedge_master_destroy(&mm.m);
    s_rmrf(root);
}

/* Comma-separated token ids of a context of n tokens (chunks of 16 for the tiny model). */
static const char *s_ctx_ids(char *ids, size_t len, int n, int seed)
{
    size_t at = 0;
    ids[0] = '\0';
    for (int i = 0; i < n && at + 8 < len; i++)
        at += (size_t)snprintf(ids + at, len - at, "%s%d", i ? "," : "",
                               (seed + 37 * i + (i * i) % 11) % 250 + 4);
    return ids;
}

typedef struct {
    const char *cmd;
    char *out;
    size_t cap;
    const char *want;
} s_cmd_ctx_t;

/* Runs the command line; whether it succeeded with want in its output. */
static bool s_cmd_says(void *arg)
{
    s_cmd_ctx_t *x = arg;
    return kt_capture(x->cmd, x->out, x->cap) == 0 && strstr(x->out, x->want);
}

/* A master, a cloud node registered with it (its directory published only when a test says)
 * and an edge proxy following the master, the node its one source. */
typedef struct {
    char root[32];
    kt_master_t mm;
    s_node_t cloud;
    char pep[350];
    kvedge_proxy_t *p;
} s_mcp_t;

static void s_mcp_start(s_mcp_t *w)
{
    snprintf(w->root, sizeof w->root, "/tmp/kvedge-pops-XXXXXX");
    assert_non_null(mkdtemp(w->root));
    kt_master_start(&w->mm, w->root);
    s_node_start(&w->cloud, w->root, "cloud1", KVEDGE_ROLE_CLOUD, &w->mm, 600000, true);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.master = w->mm.ep;
    po.master_pub = w->mm.pub;
    w->p = s_proxy(&po, w->root, w->pep, sizeof w->pep);
    assert_int_equal(kvedge_proxy_wait_sources(w->p, 1, 10000), 0);
}

static void s_mcp_stop(s_mcp_t *w)
{
    kvedge_proxy_destroy(&w->p);
    kvedge_node_destroy(&w->cloud.node);
    kvedge_master_destroy(&w->mm.m);
    s_rmrf(w->root);
}

/* A prefill to the cloud node, then at once (no wait) a decode through the proxy: the node
 * publishes its block directory to the master only every so often (here: only when the test
 * says), so the proxy's directory lists nobody for the new context; the proxy asks the node
 * (LOOKUP) and every layer is fetched. A context nobody holds is still decoded, every layer
 * computed here, and the output says how many were missed and why. */
static void test_decode_right_after_prefill(void **state)
{
    (void)state;
    s_mcp_t w;
    s_mcp_start(&w);
    kvedge_proxy_t *p = w.p;
    const char *pep = w.pep;

    static char out[1 << 16];
    char cmd[3000], a[400], b[400];
    /* A first context, published: the master (and through it the proxy) knows the model. */
    snprintf(cmd, sizeof cmd,
             "%s -H %s --json prefill --weights %s --context-ids %s --chunk-tokens 16 "
             "--scheme lossless --dtype fp32",
             KVEDGE_BIN, w.cloud.ep, S_TINY, s_ctx_ids(a, sizeof a, 40, 3));
    if (kt_capture(cmd, out, sizeof out) != 0)
        fail_msg("prefill: %s", out);
    uint32_t changed;
    assert_int_equal(kvedge_node_publish(w.cloud.node, &changed), 0);
    snprintf(cmd, sizeof cmd,
             "%s -H %s --json decode --weights %s --context-ids %s --chunk-tokens 16 "
             "--prompt-ids 10,20,30 --max-new 2 2>&1",
             KVEDGE_BIN, pep, S_TINY, a);
    assert_int_equal(kvedge_proxy_wait_view(p, kvedge_master_seq(w.mm.m), KT_WAIT_MS), 0);
    s_cmd_ctx_t first = {cmd, out, sizeof out, "\"fetched\":3,"};
    if (!kt_poll(s_cmd_says, &first, KT_WAIT_MS))
        fail_msg("the first context never reached the proxy:\n%s", out);

    /* The second context: prefilled, then decoded at once, before any directory pass. */
    snprintf(cmd, sizeof cmd,
             "%s -H %s --json prefill --weights %s --context-ids %s --chunk-tokens 16 "
             "--scheme lossless --dtype fp32",
             KVEDGE_BIN, w.cloud.ep, S_TINY, s_ctx_ids(b, sizeof b, 40, 11));
    if (kt_capture(cmd, out, sizeof out) != 0)
        fail_msg("prefill: %s", out);
    snprintf(cmd, sizeof cmd,
             "%s -H %s --json decode --weights %s --context-ids %s --chunk-tokens 16 "
             "--prompt-ids 10,20,30 --max-new 2 2>&1",
             KVEDGE_BIN, pep, S_TINY, b);
    if (kt_capture(cmd, out, sizeof out) != 0 || !strstr(out, "\"fetched\":3,\"computed\":0"))
        fail_msg("decode right after prefill:\n%s", out);

    /* Nobody holds this context: decoded anyway, the misses counted with their reason. */
    snprintf(cmd, sizeof cmd,
             "%s -H %s --json decode --weights %s --context-ids 1,2,3,4 --prompt-ids 5 "
             "--max-new 2 2>&1",
             KVEDGE_BIN, pep, S_TINY);
    if (kt_capture(cmd, out, sizeof out) != 0 ||
        !strstr(out, "\"fetched\":0,\"computed\":3,\"missed\":3") ||
        !strstr(out, "\"why\":{\"miss\":3}"))
        fail_msg("decode of a context nobody holds:\n%s", out);
    snprintf(cmd, sizeof cmd,
             "%s -H %s decode --weights %s --context-ids 1,2,3,4 --prompt-ids 5 --max-new 2 2>&1",
             KVEDGE_BIN, pep, S_TINY);
    if (kt_capture(cmd, out, sizeof out) != 0 ||
        !strstr(out, "layers    0 fetched, 3 computed of 3 (3 missed: miss 3)"))
        fail_msg("decode of a context nobody holds:\n%s", out);

    s_mcp_stop(&w);
}

typedef struct {
    kvedge_node_t *node;
    int rc;
} s_publish_t;

static void *s_publish_later(void *arg)
{
    s_publish_t *x = arg;
    /* The point of the test: the model's registration reaches the master while the decode's
     * FETCH waits at the proxy, a moment after the prefill. */
    kt_pause_ms(300);
    uint32_t changed;
    x->rc = kvedge_node_publish(x->node, &changed);
    return NULL;
}

/* A decode through a proxy right after the prefill of a model nobody has announced yet: the
 * node registers the models it holds with the master only on its next directory pass, so the
 * proxy's view lacks the model. The FETCH waits for it (at most KVEDGE_PROXY_MODEL_WAIT_MS)
 * and succeeds once the pass runs; a model that never comes is refused (exit 3) after the
 * wait, not before. */
static void test_decode_waits_for_model(void **state)
{
    (void)state;
    s_mcp_t w;
    s_mcp_start(&w);
    const char *pep = w.pep;

    static char out[1 << 16];
    char cmd[3000], a[400];
    /* A model that is never registered: refused, after the wait. */
    snprintf(cmd, sizeof cmd,
             "%s -H %s decode --weights %s --model-id ghost-tiny --context-ids %s "
             "--chunk-tokens 16 --prompt-ids 10,20,30 --max-new 2 2>&1",
             KVEDGE_BIN, pep, S_TINY, s_ctx_ids(a, sizeof a, 40, 5));
    int64_t t0 = kvedge_mono_ms();
    int rc = kt_capture(cmd, out, sizeof out);
    int64_t waited = kvedge_mono_ms() - t0;
    if (rc != 3 || !strstr(out, "does not know model"))
        fail_msg("decode of a model nobody registered (exit %d):\n%s", rc, out);
    if (waited < KVEDGE_PROXY_MODEL_WAIT_MS - 100 || waited > KT_WAIT_MS)
        fail_msg("refused after %lld ms, not after the %d ms wait", (long long)waited,
                 KVEDGE_PROXY_MODEL_WAIT_MS);

    /* A model prefilled now and announced during the decode's wait: decoded, every layer
     * fetched. */
    snprintf(cmd, sizeof cmd,
             "%s -H %s --json prefill --weights %s --model-id late-tiny --context-ids %s "
             "--chunk-tokens 16 --scheme lossless --dtype fp32",
             KVEDGE_BIN, w.cloud.ep, S_TINY, s_ctx_ids(a, sizeof a, 40, 7));
    if (kt_capture(cmd, out, sizeof out) != 0)
        fail_msg("prefill: %s", out);
    snprintf(cmd, sizeof cmd,
             "%s -H %s --json decode --weights %s --model-id late-tiny --context-ids %s "
             "--chunk-tokens 16 --prompt-ids 10,20,30 --max-new 2 2>&1",
             KVEDGE_BIN, pep, S_TINY, a);
    s_publish_t pub = {w.cloud.node, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, s_publish_later, &pub), 0);
    rc = kt_capture(cmd, out, sizeof out);
    pthread_join(th, NULL);
    assert_int_equal(pub.rc, 0);
    if (rc != 0 || !strstr(out, "\"fetched\":3,\"computed\":0"))
        fail_msg("decode right after the prefill of a new model (exit %d):\n%s", rc, out);

    s_mcp_stop(&w);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    kt_ctx_make(&s_ctx, S_CHUNKS, 7, 5, false);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_layers_fetched_while_cloud_stopped),
        cmocka_unit_test(test_decode_prints_unpriced),
        cmocka_unit_test(test_curve_node_from_master),
        cmocka_unit_test(test_decode_right_after_prefill),
        cmocka_unit_test(test_decode_waits_for_model),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_ctx_free(&s_ctx);
    return rc;
}
