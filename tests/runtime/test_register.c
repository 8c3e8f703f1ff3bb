/* Registration with the Storage Master that recovers and says why: a node whose certificate
 * the master's allowlist lacks is refused, says so once with the file to copy, keeps trying
 * with a backoff, and registers by itself once the certificate is copied in (no restart); a
 * master that does not answer leaves the registration failing, with the reason; a node bound
 * to a wildcard address registers the address that reaches the master instead. The master
 * runs CURVE on ipc:// endpoints in a temp dir; each test is bounded to well under 20 s. */
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
#include "runtime/mview.h"
#include "runtime/secure.h"
#include "access/codec/error.h"
#include "store/master/master.h"
#include "store/node/dirpub.h"
#include "store/node/node.h"
#include "tests/common/logcap.h"
#include "tests/common/testutil.h"

#define S_WAIT_MS 15000 /* longest wait for one step (the backoff is 1, 2, 4, 8 s) */

/* ---------------------------------------------------------------- fixture */

typedef struct {
    char dir[64];
    char mclients[128]; /* the master's allowlist */
    char mcert[128];    /* the master's certificate (public; _secret next to it) */
    char ncert[128];    /* the node's certificate (public; _secret next to it) */
    char ocert[128];    /* an observer's certificate, allowlisted from the start */
    kvedge_master_t *master;
    kvedge_mview_t *observer; /* reads the registry */
    kt_log_t log;
} s_fx_t;

static int s_setup(void **state)
{
    s_fx_t *fx = calloc(1, sizeof *fx);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/kvedge-register-XXXXXX");
    if (!fx || !mkdtemp(fx->dir))
        return -1;
    snprintf(fx->mclients, sizeof fx->mclients, "%s/mclients", fx->dir);
    snprintf(fx->mcert, sizeof fx->mcert, "%s/master.cert", fx->dir);
    snprintf(fx->ncert, sizeof fx->ncert, "%s/node.cert", fx->dir);
    snprintf(fx->ocert, sizeof fx->ocert, "%s/observer.cert", fx->dir);
    zsys_dir_create("%s", fx->mclients);
    if (kvedge_secure_ensure_cert(fx->mcert, "master") ||
        kvedge_secure_ensure_cert(fx->ncert, "node") ||
        kvedge_secure_ensure_cert(fx->ocert, "observer"))
        return -1;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/'", fx->ocert, fx->mclients);
    if (system(cmd) != 0)
        return -1;
    pthread_mutex_init(&fx->log.mu, NULL);
    kvedge_log_set_sink(kt_log_sink, &fx->log);
    *state = fx;
    return 0;
}

static int s_teardown(void **state)
{
    s_fx_t *fx = *state;
    kvedge_mview_destroy(&fx->observer);
    kvedge_master_destroy(&fx->master);
    kvedge_log_set_sink(NULL, NULL);
    for (size_t i = 0; i < fx->log.n; i++)
        free(fx->log.lines[i]);
    pthread_mutex_destroy(&fx->log.mu);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx->dir);
    int rc = system(cmd);
    free(fx);
    return rc == 0 ? 0 : -1;
}

/* The master (CURVE, allowlist mclients) and a view of it with the observer's key; on ipc://
 * endpoints in the temp dir, or on tcp://127.0.0.1:* when tcp. */
static void s_master_start_on(s_fx_t *fx, bool tcp)
{
    char data[128], bind[128], pub[128], secret[160], why[512] = "";
    snprintf(data, sizeof data, "%s/master", fx->dir);
    snprintf(bind, sizeof bind, "ipc://%s/m.ipc", fx->dir);
    snprintf(pub, sizeof pub, "ipc://%s/p.ipc", fx->dir);
    if (tcp) {
        snprintf(bind, sizeof bind, "tcp://127.0.0.1:*");
        snprintf(pub, sizeof pub, "tcp://127.0.0.1:*");
    }
    snprintf(secret, sizeof secret, "%s_secret", fx->mcert);
    kvedge_master_opts_t o;
    kvedge_master_opts_default(&o);
    o.bind = bind;
    o.pub = pub;
    o.data_dir = data;
    o.cert = secret;
    o.clients_dir = fx->mclients;
    if (kvedge_master_start(&o, &fx->master, why, sizeof why) != KVEDGE_OK)
        fail_msg("master: %s", why);
    char osecret[160];
    snprintf(osecret, sizeof osecret, "%s_secret", fx->ocert);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = kvedge_master_endpoint(fx->master);
    vo.pub = kvedge_master_pub_endpoint(fx->master);
    vo.server_key = fx->mcert;
    vo.client_cert = osecret;
    vo.prefix = "node/";
    assert_int_equal(kvedge_mview_start(&vo, &fx->observer), KVEDGE_OK);
    assert_int_equal(kvedge_mview_wait(fx->observer, 0, 3000), KVEDGE_OK);
}

static void s_master_start(s_fx_t *fx)
{
    s_master_start_on(fx, false);
}

/* The node's view of the master, with the node's key. */
static kvedge_mview_t *s_node_view(s_fx_t *fx)
{
    char secret[160];
    snprintf(secret, sizeof secret, "%s_secret", fx->ncert);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = kvedge_master_endpoint(fx->master);
    vo.pub = kvedge_master_pub_endpoint(fx->master);
    vo.server_key = fx->mcert;
    vo.client_cert = secret;
    vo.prefix = "node/";
    vo.heartbeat_id = "edge-7";
    vo.start_wait_ms = 300;
    kvedge_mview_t *v = NULL;
    assert_int_equal(kvedge_mview_start(&vo, &v), KVEDGE_OK);
    return v;
}

static void s_allow_node(s_fx_t *fx)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/'", fx->ncert, fx->mclients);
    assert_int_equal(system(cmd), 0);
}

typedef struct {
    s_fx_t *fx;
    const char *id;
} s_reg_ctx_t;

static bool s_is_registered(void *arg)
{
    s_reg_ctx_t *x = arg;
    kvedge_master_node_t rec;
    return kvedge_mview_node(x->fx->observer, x->id, &rec) == KVEDGE_OK;
}

/* Waits until the observer sees node/id in the registry. */
static bool s_registered(s_fx_t *fx, const char *id, int ms)
{
    s_reg_ctx_t x = {fx, id};
    return kt_poll(s_is_registered, &x, ms);
}

static int s_reg_state(kvedge_dirpub_t *d)
{
    kvedge_dirpub_reg_t r;
    kvedge_dirpub_registration(d, &r);
    return r.state;
}

typedef struct {
    kvedge_dirpub_t *d;
    int state;
} s_state_ctx_t;

static bool s_in_state(void *arg)
{
    s_state_ctx_t *x = arg;
    return s_reg_state(x->d) == x->state;
}

static bool s_wait_state(kvedge_dirpub_t *d, int state, int ms)
{
    s_state_ctx_t x = {d, state};
    return kt_poll(s_in_state, &x, ms);
}

/* Whether the view has been refused again after a reconnect: three refusals in all. */
static bool s_refused_thrice(void *v)
{
    kvedge_mview_conn_t c;
    kvedge_mview_conn(v, &c);
    return c.reconnects >= 1 && c.refusals >= 3;
}

/* ---------------------------------------------------------------- tests */

static void test_state_names(void **state)
{
    (void)state;
    assert_string_equal(kvedge_dirpub_reg_state_name(KVEDGE_DIRPUB_PENDING), "pending");
    assert_string_equal(kvedge_dirpub_reg_state_name(KVEDGE_DIRPUB_REGISTERED), "registered");
    assert_string_equal(kvedge_dirpub_reg_state_name(KVEDGE_DIRPUB_REFUSED), "refused");
    assert_string_equal(kvedge_dirpub_reg_state_name(KVEDGE_DIRPUB_FAILING), "failing");
    assert_string_equal(kvedge_dirpub_reg_state_name(KVEDGE_DIRPUB_LOST), "lost");
    assert_string_equal(kvedge_dirpub_reg_state_name(42), "?");
    kvedge_dirpub_reg_t r;
    memset(&r, 0xff, sizeof r);
    kvedge_dirpub_registration(NULL, &r);
    assert_int_equal(r.state, KVEDGE_DIRPUB_PENDING);
    assert_int_equal(r.attempts, 0);
    kvedge_dirpub_registration(NULL, NULL);
    kvedge_mview_conn_t c;
    memset(&c, 0xff, sizeof c);
    kvedge_mview_conn(NULL, &c);
    assert_false(c.refused);
    assert_int_equal(c.refusals, 0);
}

/* The store under the temp dir, and a publisher on it that keeps node/<id> (an edge node at
 * tcp://10.0.0.7:7400) registered through v, a pass every interval_ms. */
static kvedge_engine_t *s_engine(s_fx_t *fx)
{
    char edata[128];
    snprintf(edata, sizeof edata, "%s/engine", fx->dir);
    kvedge_engine_t *e = NULL;
    assert_int_equal(kvedge_engine_open(edata, NULL, &e, NULL, 0), KVEDGE_OK);
    return e;
}

static kvedge_dirpub_t *s_publisher(kvedge_engine_t *e, kvedge_mview_t *v, const char *id,
                                    const char *master, const char *cert, uint32_t interval_ms)
{
    kvedge_master_node_t rec;
    memset(&rec, 0, sizeof rec);
    rec.role = KVEDGE_ROLE_EDGE;
    snprintf(rec.endpoint, sizeof rec.endpoint, "tcp://10.0.0.7:7400");
    kvedge_dirpub_opts_t po = {.engine = e,
                               .view = v,
                               .node_id = id,
                               .node = &rec,
                               .interval_ms = interval_ms,
                               .master = master,
                               .cert = cert};
    kvedge_dirpub_t *d = NULL;
    assert_int_equal(kvedge_dirpub_start(&po, &d), KVEDGE_OK);
    return d;
}

/* Stops the publisher, then the view, then the store. */
static void s_stop(kvedge_dirpub_t **d, kvedge_mview_t **v, kvedge_engine_t **e)
{
    kvedge_dirpub_destroy(d);
    kvedge_mview_destroy(v);
    kvedge_engine_destroy(e);
}

/* The publisher and the view on their own: refused (with the fix), then registered once the
 * certificate is in the master's allowlist; the view says why it is not synced meanwhile. */
static void test_refused_then_registered(void **state)
{
    s_fx_t *fx = *state;
    s_master_start(fx);
    kvedge_engine_t *e = s_engine(fx);
    kvedge_mview_t *v = s_node_view(fx);
    int64_t t0 = zclock_mono();
    kvedge_dirpub_t *d =
        s_publisher(e, v, "edge-7", kvedge_master_endpoint(fx->master), fx->ncert, 100);

    assert_true(s_wait_state(d, KVEDGE_DIRPUB_REFUSED, 5000));
    kvedge_dirpub_reg_t r;
    kvedge_dirpub_registration(d, &r);
    assert_int_equal(r.last_error, KVEDGE_EDENIED);
    assert_true(r.attempts >= 1);
    assert_true(r.since_ms > 0);
    assert_non_null(strstr(r.why, "allowlist lacks this node's certificate"));
    assert_non_null(strstr(r.why, fx->ncert));
    kvedge_mview_conn_t c;
    kvedge_mview_conn(v, &c);
    assert_true(c.refused);
    assert_true(c.refusals >= 1);
    assert_false(c.heard);
    assert_int_equal(kvedge_mview_state(v), KVEDGE_MVIEW_EMPTY);
    assert_int_equal(kvedge_dirpub_sync(d, NULL), KVEDGE_EDENIED);
    assert_false(s_registered(fx, "edge-7", 100));
    /* The backoff makes a few more tries (the second's line, were it logged, is written before
     * the third is counted): still one line. */
    kt_wait_until(s_refused_thrice, v, KT_WAIT_MS);
    kvedge_mview_conn(v, &c);
    assert_true(c.reconnects >= 1);
    assert_true(c.refusals >= 2);
    assert_int_equal(kt_log_count(&fx->log, "registration with the master", "refused", fx->ncert,
                                  "clients directory", NULL),
                     1);

    /* The certificate copied in: registered by itself, no restart. */
    s_allow_node(fx);
    assert_true(s_wait_state(d, KVEDGE_DIRPUB_REGISTERED, S_WAIT_MS));
    assert_true(s_registered(fx, "edge-7", 2000));
    kvedge_dirpub_registration(d, &r);
    assert_int_equal(r.last_error, 0);
    assert_int_equal(r.attempts, 0);
    assert_string_equal(r.why, "");
    kvedge_mview_conn(v, &c);
    assert_false(c.refused);
    assert_true(c.heard);
    assert_int_equal(c.retry_ms, KVEDGE_MVIEW_RECONNECT_MIN_MS);
    /* The state moves first, then the line is written. */
    kt_wait_for(kt_log_count(&fx->log, "registered with the master", NULL) > 0, KT_WAIT_MS);
    assert_int_equal(kt_log_count(&fx->log, "registered with the master", "as edge-7", NULL), 1);
    assert_int_equal(kvedge_dirpub_sync(d, NULL), KVEDGE_OK);
    assert_true(zclock_mono() - t0 < 18000 + KT_SLACK_MS); /* the backoff's 1, 2, 4, 8 s */
    s_stop(&d, &v, &e);
}

/* A master that does not answer: failing, with the reason, retried with a backoff. */
static void test_master_down_failing(void **state)
{
    s_fx_t *fx = *state;
    char rt[128], pb[128];
    snprintf(rt, sizeof rt, "ipc://%s/none-r.ipc", fx->dir);
    snprintf(pb, sizeof pb, "ipc://%s/none-p.ipc", fx->dir);
    kvedge_engine_t *e = s_engine(fx);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = rt;
    vo.pub = pb;
    vo.start_wait_ms = -1;
    kvedge_mview_t *v = NULL;
    assert_int_equal(kvedge_mview_start(&vo, &v), KVEDGE_OK);
    /* One pass at start, then none for a minute: the test's own passes are not queued. */
    kvedge_dirpub_t *d = s_publisher(e, v, "edge-8", rt, NULL, 60000);
    kvedge_dirpub_reg_t r;
    kvedge_dirpub_registration(d, &r);
    assert_true(r.state == KVEDGE_DIRPUB_PENDING || r.state == KVEDGE_DIRPUB_FAILING);
    assert_true(s_wait_state(d, KVEDGE_DIRPUB_FAILING, 6000));
    kvedge_dirpub_registration(d, &r);
    assert_int_equal(r.last_error, KVEDGE_ETIMEDOUT);
    assert_non_null(strstr(r.why, "no answer from the master"));
    assert_true(r.attempts >= 1);
    /* Within the backoff a pass does not try again: it answers at once. */
    int64_t t = zclock_mono();
    assert_int_equal(kvedge_dirpub_sync(d, NULL), KVEDGE_ETIMEDOUT);
    assert_true(zclock_mono() - t < 1000);
    kt_wait_for(kt_log_count(&fx->log, "registration with the master", "failing", NULL) > 0,
                KT_WAIT_MS);
    assert_int_equal(kt_log_count(&fx->log, "registration with the master", "failing", rt, NULL),
                     1);
    s_stop(&d, &v, &e);
}

/* A node that joins the CURVE master in plaintext is not refused but ignored (the handshake
 * fails on the mechanism): the registration says that the master requires CURVE and which
 * setting to give. */
static void test_plaintext_to_curve_master(void **state)
{
    s_fx_t *fx = *state;
    s_master_start(fx);
    kvedge_engine_t *e = s_engine(fx);
    kvedge_mview_opts_t vo; /* no server_key: plaintext */
    kvedge_mview_opts_default(&vo);
    vo.master = kvedge_master_endpoint(fx->master);
    vo.pub = kvedge_master_pub_endpoint(fx->master);
    vo.prefix = "node/";
    vo.start_wait_ms = -1;
    kvedge_mview_t *v = NULL;
    assert_int_equal(kvedge_mview_start(&vo, &v), KVEDGE_OK);
    kvedge_dirpub_t *d = s_publisher(e, v, "edge-9", kvedge_master_endpoint(fx->master), NULL, 100);
    assert_true(s_wait_state(d, KVEDGE_DIRPUB_FAILING, S_WAIT_MS));
    kvedge_mview_conn_t c;
    kvedge_mview_conn(v, &c);
    assert_true(c.mismatch);
    assert_false(c.refused); /* not a ZAP refusal: the mechanisms differ */
    kvedge_dirpub_reg_t r;
    kvedge_dirpub_registration(d, &r);
    assert_int_equal(r.last_error, KVEDGE_ETIMEDOUT);
    assert_non_null(strstr(r.why, "the master requires CURVE"));
    assert_non_null(strstr(r.why, "--master-key"));
    kt_wait_for(kt_log_count(&fx->log, "registration with the master", "failing", NULL) > 0,
                KT_WAIT_MS);
    assert_int_equal(kt_log_count(&fx->log, "registration with the master", "requires CURVE",
                                  "--master-key", NULL),
                     1);
    s_stop(&d, &v, &e);
}

/* Registered, then the master goes away: lost once it has been silent for the view's
 * dead_ms, said once; registered again when it comes back on its registry, said once. */
static void test_master_lost_and_back(void **state)
{
    s_fx_t *fx = *state;
    s_allow_node(fx);
    s_master_start(fx); /* ipc: the restarted master takes the same paths */
    char bind[128], pub[128];
    snprintf(bind, sizeof bind, "%s", kvedge_master_endpoint(fx->master));
    snprintf(pub, sizeof pub, "%s", kvedge_master_pub_endpoint(fx->master));
    char secret[160];
    snprintf(secret, sizeof secret, "%s_secret", fx->ncert);
    kvedge_engine_t *e = s_engine(fx);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = bind;
    vo.pub = pub;
    vo.server_key = fx->mcert;
    vo.client_cert = secret;
    vo.prefix = "node/";
    vo.heartbeat_id = "edge-5";
    vo.dead_ms = 1500; /* above the master's HUGZ interval (1 s): silence, not a gap */
    vo.start_wait_ms = 2000;
    kvedge_mview_t *v = NULL;
    assert_int_equal(kvedge_mview_start(&vo, &v), KVEDGE_OK);
    kvedge_dirpub_t *d = s_publisher(e, v, "edge-5", bind, fx->ncert, 100);
    assert_true(s_wait_state(d, KVEDGE_DIRPUB_REGISTERED, S_WAIT_MS));

    kvedge_mview_destroy(&fx->observer);
    kvedge_master_destroy(&fx->master);
    int64_t t0 = zclock_mono();
    assert_true(s_wait_state(d, KVEDGE_DIRPUB_LOST, 5000));
    assert_true(zclock_mono() - t0 >= 400); /* not before the view's dead_ms (less the time
                                             * since the last HUGZ, at most 1 s) */
    kvedge_dirpub_reg_t r;
    kvedge_dirpub_registration(d, &r);
    assert_int_equal(r.last_error, KVEDGE_ETIMEDOUT);
    assert_non_null(strstr(r.why, "nothing heard from the master"));
    assert_non_null(strstr(r.why, "1500 ms"));
    assert_int_equal(kvedge_dirpub_sync(d, NULL), KVEDGE_ETIMEDOUT);
    assert_int_equal(s_reg_state(d), KVEDGE_DIRPUB_LOST);

    /* Back on the same registry and endpoints (the same ipc paths). */
    s_master_start(fx);
    assert_string_equal(kvedge_master_endpoint(fx->master), bind);
    assert_true(s_wait_state(d, KVEDGE_DIRPUB_REGISTERED, S_WAIT_MS));
    assert_int_equal(kt_log_count(&fx->log, "master lost", "nothing heard", NULL), 1);
    assert_int_equal(kt_log_count(&fx->log, "is back: registered as edge-5", NULL), 1);
    s_stop(&d, &v, &e);
}

/* The whole node: started before its certificate is allowlisted, registered without a restart
 * once it is, and the log says both. */
static void test_node_registers_without_restart(void **state)
{
    s_fx_t *fx = *state;
    s_master_start(fx);
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    ns.role = KVEDGE_ROLE_EDGE;
    ns.insecure = true; /* its own ROUTER; CURVE to the master all the same */
    ns.workers = 1;
    snprintf(ns.data, sizeof ns.data, "%s/node", fx->dir);
    snprintf(ns.bind, sizeof ns.bind, "ipc://%s/n.ipc", fx->dir);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    snprintf(ns.cert, sizeof ns.cert, "%s", fx->ncert);
    snprintf(ns.master, sizeof ns.master, "%s", kvedge_master_endpoint(fx->master));
    snprintf(ns.master_pub, sizeof ns.master_pub, "%s", kvedge_master_pub_endpoint(fx->master));
    snprintf(ns.master_key, sizeof ns.master_key, "%s", fx->mcert);
    snprintf(ns.node_id, sizeof ns.node_id, "edge-9");
    ns.dir_interval_ms = 100;
    char why[512] = "";
    kvedge_node_t *node = NULL;
    int64_t t0 = zclock_mono();
    if (kvedge_node_start(&ns, &node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node: %s", why);
    kt_wait_for(kt_log_count(&fx->log, "registration with the master", "refused", NULL) > 0,
                KT_WAIT_MS);
    assert_int_equal(
        kt_log_count(&fx->log, "registration with the master", "refused", fx->ncert, NULL), 1);
    assert_false(s_registered(fx, "edge-9", 200));
    assert_int_equal(kvedge_node_publish(node, NULL), KVEDGE_EDENIED);
    s_allow_node(fx);
    assert_true(s_registered(fx, "edge-9", S_WAIT_MS));
    kvedge_master_node_t rec;
    assert_int_equal(kvedge_mview_node(fx->observer, "edge-9", &rec), KVEDGE_OK);
    assert_string_equal(rec.endpoint, kvedge_node_endpoint(node));
    kt_wait_for(kt_log_count(&fx->log, "registered with the master", NULL) > 0, KT_WAIT_MS);
    assert_int_equal(kt_log_count(&fx->log, "registered with the master", "as edge-9", NULL), 1);
    assert_int_equal(kvedge_node_publish(node, NULL), KVEDGE_OK);
    assert_true(zclock_mono() - t0 < 19000 + KT_SLACK_MS);
    kvedge_node_destroy(&node);
}

/* A CURVE node on bind joining the master as id, advertising advertise ("" = derived). */
static int s_wild_node(s_fx_t *fx, const char *bind, const char *advertise, const char *id,
                       kvedge_node_t **node, char *why, size_t why_len)
{
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    ns.role = KVEDGE_ROLE_EDGE;
    ns.workers = 1;
    snprintf(ns.data, sizeof ns.data, "%s/%s", fx->dir, id);
    snprintf(ns.bind, sizeof ns.bind, "%s", bind);
    snprintf(ns.advertise, sizeof ns.advertise, "%s", advertise);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    snprintf(ns.cert, sizeof ns.cert, "%s", fx->ncert);
    snprintf(ns.master, sizeof ns.master, "%s", kvedge_master_endpoint(fx->master));
    snprintf(ns.master_pub, sizeof ns.master_pub, "%s", kvedge_master_pub_endpoint(fx->master));
    snprintf(ns.master_key, sizeof ns.master_key, "%s", fx->mcert);
    snprintf(ns.node_id, sizeof ns.node_id, "%s", id);
    ns.dir_interval_ms = 100;
    return kvedge_node_start(&ns, node, why, why_len);
}

/* A node bound to the wildcard never registers it: it advertises the address of the
 * interface that reaches the master (127.0.0.1 here) with its bound port, and says so;
 * --advertise wins; with a master on ipc:// there is nothing to derive from and the node
 * refuses to start, asking for --advertise. */
static void test_wildcard_not_advertised(void **state)
{
    s_fx_t *fx = *state;
    s_master_start_on(fx, true);
    s_allow_node(fx);
    char why[512] = "";
    kvedge_node_t *node = NULL;
    if (s_wild_node(fx, "tcp://0.0.0.0:*", "", "wild-1", &node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node: %s", why);
    const char *bound = kvedge_node_endpoint(node);
    assert_non_null(strstr(bound, "tcp://0.0.0.0:"));
    char want[128];
    snprintf(want, sizeof want, "tcp://127.0.0.1:%s", strrchr(bound, ':') + 1);
    assert_true(s_registered(fx, "wild-1", S_WAIT_MS));
    kvedge_master_node_t rec;
    assert_int_equal(kvedge_mview_node(fx->observer, "wild-1", &rec), KVEDGE_OK);
    assert_string_equal(rec.endpoint, want);
    assert_int_equal(kt_log_count(&fx->log, "advertising", want, "wildcard", "--advertise", NULL),
                     1);
    kvedge_node_destroy(&node);

    if (s_wild_node(fx, "tcp://*:*", "tcp://edge.example:7400", "wild-2", &node, why, sizeof why) !=
        KVEDGE_OK)
        fail_msg("node: %s", why);
    assert_true(s_registered(fx, "wild-2", S_WAIT_MS));
    assert_int_equal(kvedge_mview_node(fx->observer, "wild-2", &rec), KVEDGE_OK);
    assert_string_equal(rec.endpoint, "tcp://edge.example:7400");
    kvedge_node_destroy(&node);

    /* A non-wildcard bind is registered as bound. */
    if (s_wild_node(fx, "tcp://127.0.0.1:*", "", "wild-3", &node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node: %s", why);
    assert_true(s_registered(fx, "wild-3", S_WAIT_MS));
    assert_int_equal(kvedge_mview_node(fx->observer, "wild-3", &rec), KVEDGE_OK);
    assert_string_equal(rec.endpoint, kvedge_node_endpoint(node));
    kvedge_node_destroy(&node);
}

static void test_wildcard_without_a_tcp_master_refused(void **state)
{
    s_fx_t *fx = *state;
    s_master_start(fx); /* ipc:// */
    char why[512] = "";
    kvedge_node_t *node = NULL;
    assert_int_equal(s_wild_node(fx, "tcp://0.0.0.0:*", "", "wild-4", &node, why, sizeof why),
                     KVEDGE_EINVAL);
    assert_null(node);
    assert_non_null(strstr(why, "--advertise"));
    assert_non_null(strstr(why, "wildcard"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_names),
        cmocka_unit_test_setup_teardown(test_refused_then_registered, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_master_down_failing, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_plaintext_to_curve_master, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_master_lost_and_back, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_node_registers_without_restart, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_wildcard_not_advertised, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_wildcard_without_a_tcp_master_refused, s_setup,
                                        s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
