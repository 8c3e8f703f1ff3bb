/* A store node re-announces itself to a master that lost its soft state: the node's directory
 * publisher, on a real engine holding two complete chunks, registers and publishes dir/
 * records; the master is replaced by one on a fresh directory (a new registry, as a new leader
 * that lost the soft state), and the node registers again and publishes its whole directory
 * again although its engine did not change. The same through a list of masters: the view
 * moves to the next master when the one it follows goes away, and the directory follows it.
 * Embedded masters on ipc:// endpoints in a temp dir; every step waits on a condition. */
#define _GNU_SOURCE
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

#include "access/codec/error.h"
#include "runtime/log.h"
#include "runtime/mview.h"
#include "store/engine/engine.h"
#include "store/master/master.h"
#include "store/node/dirpub.h"
#include "tests/common/logcap.h"
#include "tests/common/testutil.h"

#define MODEL    "reannounce-model"
#define LAYERS   3
#define HEADS    2
#define HEAD_DIM 64
#define TOKENS   16
#define NODE_ID  "cloud-1"

typedef struct {
    char dir[64];
    char router[2][128], pub[2][128];
    kvedge_master_t *master[2];
    kvedge_engine_t *engine;
    kvedge_chunk_info_t chunk[2];
    kt_log_t log;
} s_fx_t;

static int s_setup(void **state)
{
    s_fx_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    snprintf(fx->dir, sizeof fx->dir, "/tmp/kvedge-reannounce-XXXXXX");
    if (!mkdtemp(fx->dir))
        return -1;
    for (int i = 0; i < 2; i++) {
        snprintf(fx->router[i], sizeof fx->router[i], "ipc://%s/m%d.ipc", fx->dir, i);
        snprintf(fx->pub[i], sizeof fx->pub[i], "ipc://%s/p%d.ipc", fx->dir, i);
    }
    pthread_mutex_init(&fx->log.mu, NULL);
    kvedge_log_set_sink(kt_log_sink, &fx->log);
    *state = fx;
    return 0;
}

static int s_teardown(void **state)
{
    s_fx_t *fx = *state;
    for (int i = 0; i < 2; i++)
        kvedge_master_destroy(&fx->master[i]);
    kvedge_engine_destroy(&fx->engine);
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

/* Master i on a fresh data directory named data (a new registry each time). */
static void s_master_up(s_fx_t *fx, int i, const char *data)
{
    char path[128], why[512] = "";
    snprintf(path, sizeof path, "%s/%s", fx->dir, data);
    kvedge_master_opts_t o;
    kvedge_master_opts_default(&o);
    o.bind = fx->router[i];
    o.pub = fx->pub[i];
    o.data_dir = path;
    o.insecure = true;
    o.hugz_ms = 200;
    o.metrics = "off";
    if (kvedge_master_start(&o, &fx->master[i], why, sizeof why) != KVEDGE_OK)
        fail_msg("master %d: %s", i, why);
}

/* The engine with two complete chunks (every layer, every head). */
static void s_engine_up(s_fx_t *fx)
{
    char path[128], why[256] = "";
    snprintf(path, sizeof path, "%s/store", fx->dir);
    if (kvedge_engine_open(path, NULL, &fx->engine, why, sizeof why) != KVEDGE_OK)
        fail_msg("engine: %s", why);
    const kvedge_model_t m = {MODEL, LAYERS, HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_engine_put_model(fx->engine, &m), KVEDGE_OK);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, TOKENS, HEAD_DIM, 0, NULL, false};
    for (int c = 0; c < 2; c++) {
        kvedge_chunk_info_t *ci = &fx->chunk[c];
        memset(ci, 0, sizeof *ci);
        for (size_t i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++)
            ci->id.bytes[i] = (uint8_t)(c * 97 + 13 * i + 1);
        strcpy(ci->model_id, MODEL);
        ci->tokens = TOKENS;
        for (uint16_t l = 0; l < LAYERS; l++)
            for (uint16_t h = 0; h < HEADS; h++) {
                size_t len;
                uint8_t *b = kt_encode(&spec, (uint64_t)(c * 100 + l * 10 + h), &len);
                assert_non_null(b);
                assert_int_equal(kvedge_engine_put(fx->engine, ci, l, h, b, len, NULL), KVEDGE_OK);
                free(b);
            }
    }
}

static kvedge_mview_t *s_view(const char *routers, const char *pubs, const char *prefix,
                              const char *hb_id)
{
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    o.master = routers;
    o.pub = pubs;
    o.prefix = prefix;
    o.heartbeat_id = hb_id;
    o.dead_ms = 800;
    o.start_wait_ms = -1;
    kvedge_mview_t *v = NULL;
    assert_int_equal(kvedge_mview_start(&o, &v), KVEDGE_OK);
    return v;
}

static kvedge_dirpub_t *s_publisher(s_fx_t *fx, kvedge_mview_t *v)
{
    kvedge_master_node_t rec;
    memset(&rec, 0, sizeof rec);
    rec.role = KVEDGE_ROLE_CLOUD;
    snprintf(rec.region, sizeof rec.region, "eu-1");
    snprintf(rec.endpoint, sizeof rec.endpoint, "tcp://127.0.0.1:7400");
    rec.capacity_bytes = 1ull << 30;
    kvedge_dirpub_opts_t po = {.engine = fx->engine,
                               .view = v,
                               .node_id = NODE_ID,
                               .node = &rec,
                               .interval_ms = 100,
                               .master = "test"};
    kvedge_dirpub_t *d = NULL;
    assert_int_equal(kvedge_dirpub_start(&po, &d), KVEDGE_OK);
    return d;
}

/* The registry as an observer of master i sees it: node/<id> and both chunks' dir/ records,
 * every layer held. */
static bool s_announced(s_fx_t *fx, kvedge_mview_t *obs)
{
    (void)fx;
    kvedge_master_node_t n;
    if (kvedge_mview_state(obs) != KVEDGE_MVIEW_SYNCED ||
        kvedge_mview_node(obs, NODE_ID, &n) != KVEDGE_OK)
        return false;
    for (int c = 0; c < 2; c++) {
        kvedge_master_dir_t rec;
        if (kvedge_mview_dir(obs, NODE_ID, &fx->chunk[c].id, &rec) != KVEDGE_OK ||
            rec.layers != LAYERS)
            return false;
        for (unsigned l = 0; l < LAYERS; l++)
            if (!kvedge_master_dir_has(&rec, l))
                return false;
    }
    return true;
}

static kvedge_mview_t *s_observer(s_fx_t *fx, int i)
{
    return s_view(fx->router[i], fx->pub[i], NULL, NULL);
}

/* The master restarted empty on the same endpoints: registration and directory come back. */
static void test_master_restarted_empty(void **state)
{
    s_fx_t *fx = *state;
    s_engine_up(fx);
    s_master_up(fx, 0, "data-a");
    kvedge_mview_t *v = s_view(fx->router[0], fx->pub[0], "node/", NODE_ID);
    kvedge_dirpub_t *d = s_publisher(fx, v);
    kvedge_mview_t *obs = s_observer(fx, 0);
    kt_wait_for(s_announced(fx, obs), KT_WAIT_MS);
    uint64_t registry = kvedge_mview_registry(obs);
    kvedge_mview_destroy(&obs);

    /* A new master on a fresh directory: nothing of this node in it. */
    kvedge_master_destroy(&fx->master[0]);
    s_master_up(fx, 0, "data-b");
    assert_int_not_equal(kvedge_master_registry(fx->master[0]), registry);
    obs = s_observer(fx, 0);
    kt_wait_for(s_announced(fx, obs), KT_WAIT_MS);
    assert_int_equal(kvedge_mview_registry(obs), kvedge_master_registry(fx->master[0]));
    kvedge_dirpub_reg_t r;
    kvedge_dirpub_registration(d, &r);
    assert_int_equal(r.state, KVEDGE_DIRPUB_REGISTERED);
    assert_true(kt_log_count(&fx->log, "registered with the master", "again", NULL) >= 1);
    kvedge_mview_destroy(&obs);
    kvedge_dirpub_destroy(&d);
    kvedge_mview_destroy(&v);
}

/* A list [M0, M1]: M0 goes away, the view moves to M1 (another registry: a new leader with
 * none of the soft state), and the node is registered and its directory published there;
 * the log says the view re-synced with M1. */
static void test_view_moves_directory_follows(void **state)
{
    s_fx_t *fx = *state;
    s_engine_up(fx);
    s_master_up(fx, 0, "data-0");
    s_master_up(fx, 1, "data-1");
    char routers[300], pubs[300];
    snprintf(routers, sizeof routers, "%s,%s", fx->router[0], fx->router[1]);
    snprintf(pubs, sizeof pubs, "%s,%s", fx->pub[0], fx->pub[1]);
    kvedge_mview_t *v = s_view(routers, pubs, "node/", NODE_ID);
    kvedge_dirpub_t *d = s_publisher(fx, v);
    kvedge_mview_t *obs0 = s_observer(fx, 0), *obs1 = s_observer(fx, 1);
    kt_wait_for(s_announced(fx, obs0), KT_WAIT_MS);
    kvedge_master_node_t n;
    assert_int_equal(kvedge_mview_node(obs1, NODE_ID, &n), KVEDGE_ENOTFOUND);
    kvedge_mview_destroy(&obs0);

    kvedge_master_destroy(&fx->master[0]);
    kt_wait_for(s_announced(fx, obs1), KT_WAIT_MS);
    kvedge_mview_conn_t c;
    kvedge_mview_conn(v, &c);
    assert_string_equal(c.endpoint, fx->router[1]);
    assert_int_equal(c.moves, 1);
    assert_true(kt_log_count(&fx->log, "re-synced with", fx->router[1], "directory records again",
                             NULL) >= 1);
    kvedge_mview_destroy(&obs1);
    kvedge_dirpub_destroy(&d);
    kvedge_mview_destroy(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_master_restarted_empty, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_view_moves_directory_follows, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
