/* Lists of masters where a master is given: the endpoint checks and PUB defaults
 * (kvedge_mview_check_endpoints, kvedge_mview_default_pubs), the node's and the proxy's
 * settings (PUB per entry, PORT+1 by default for tcp, lists of one length), a whole node given
 * [a master that is down, the real one] with default PUBs registering with the real one, and
 * `kvedge master-dump --master LIST` (a bad entry is a usage error naming it; a list whose
 * first master is down dumps the second). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "access/codec/error.h"
#include "proxy/settings.h"
#include "runtime/mview.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "tests/common/testutil.h"

static void test_check_endpoints(void **state)
{
    (void)state;
    char why[512];
    assert_int_equal(kvedge_mview_check_endpoints("", why, sizeof why), 0);
    assert_int_equal(kvedge_mview_check_endpoints("tcp://10.0.0.1:7410", why, sizeof why), 0);
    assert_int_equal(
        kvedge_mview_check_endpoints("tcp://10.0.0.1:7410,ipc:///tmp/m.sock", why, sizeof why), 0);
    why[0] = '\0';
    assert_int_equal(
        kvedge_mview_check_endpoints("tcp://10.0.0.1:7410,tcp:/10.0.0.2:7410", why, sizeof why),
        -1);
    assert_non_null(strstr(why, "has a bad entry 'tcp:/10.0.0.2:7410': is not an endpoint"));
    assert_int_equal(kvedge_mview_check_endpoints("tcp:/10.0.0.2:7410", why, sizeof why), -1);
    assert_non_null(strstr(why, "is not an endpoint")); /* as for one endpoint */
    assert_null(strstr(why, "entry"));
    assert_int_equal(
        kvedge_mview_check_endpoints("tcp://10.0.0.1:7410,tcp://10.0.0.2:99999", why, sizeof why),
        -1);
    assert_non_null(strstr(why, "99999"));
    assert_int_equal(kvedge_mview_check_endpoints("tcp://10.0.0.1:7410,", why, sizeof why), -1);
    assert_non_null(strstr(why, "entry 2"));
    assert_non_null(strstr(why, "empty"));
    char many[1024] = "";
    for (int i = 0; i <= KVEDGE_MVIEW_MAX_MASTERS; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%stcp://h:%d", i ? "," : "",
                 7000 + i);
    assert_int_equal(kvedge_mview_check_endpoints(many, why, sizeof why), -1);
    assert_non_null(strstr(why, "more than 16"));
    assert_int_equal(kvedge_mview_count_endpoints(NULL), 0);
    assert_int_equal(kvedge_mview_count_endpoints("a,b,c"), 3);
}

static void test_default_pubs(void **state)
{
    (void)state;
    char out[256];
    assert_int_equal(kvedge_mview_default_pubs("tcp://10.0.0.1:7410", out, sizeof out), 0);
    assert_string_equal(out, "tcp://10.0.0.1:7411");
    assert_int_equal(
        kvedge_mview_default_pubs("tcp://10.0.0.1:7410,tcp://[::1]:7420", out, sizeof out), 0);
    assert_string_equal(out, "tcp://10.0.0.1:7411,tcp://[::1]:7421");
    assert_int_equal(kvedge_mview_default_pubs("tcp://a:7410,ipc:///tmp/m", out, sizeof out), -1);
    assert_int_equal(kvedge_mview_default_pubs("tcp://a:65535", out, sizeof out), -1);
    assert_int_equal(kvedge_mview_default_pubs("tcp://a:7410x", out, sizeof out), -1);
    assert_int_equal(kvedge_mview_default_pubs("tcp://a:", out, sizeof out), -1);
    assert_int_equal(kvedge_mview_default_pubs("", out, sizeof out), -1);
    assert_int_equal(kvedge_mview_default_pubs("tcp://10.0.0.1:7410,tcp://10.0.0.2:7410", out, 25),
                     -1); /* does not fit */
}

static void s_node_settings(kvedge_node_settings_t *s, const char *master, const char *pub)
{
    kvedge_node_settings_default(s);
    snprintf(s->data, sizeof s->data, "/tmp/unused");
    snprintf(s->node_id, sizeof s->node_id, "cloud-1");
    snprintf(s->master, sizeof s->master, "%s", master);
    snprintf(s->master_pub, sizeof s->master_pub, "%s", pub);
}

static void test_node_settings(void **state)
{
    (void)state;
    kvedge_node_settings_t s;
    char why[512] = "";
    s_node_settings(&s, "tcp://10.0.0.1:7410,tcp://10.0.0.2:7410", "");
    assert_int_equal(kvedge_node_settings_check(&s, why, sizeof why), KVEDGE_OK);
    s_node_settings(&s, "ipc:///tmp/a,ipc:///tmp/b", "ipc:///tmp/ap,ipc:///tmp/bp");
    assert_int_equal(kvedge_node_settings_check(&s, why, sizeof why), KVEDGE_OK);
    s_node_settings(&s, "ipc:///tmp/a,ipc:///tmp/b", "");
    assert_int_equal(kvedge_node_settings_check(&s, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "PUB endpoint"));
    s_node_settings(&s, "tcp://10.0.0.1:7410,tcp://10.0.0.2:7410", "tcp://10.0.0.1:7411");
    assert_int_equal(kvedge_node_settings_check(&s, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "2 masters and master_pub 1 PUB"));
}

static void test_proxy_settings(void **state)
{
    (void)state;
    kvedge_proxy_settings_t s;
    char why[512] = "";
    kvedge_proxy_settings_default(&s);
    s.insecure = true;
    snprintf(s.master, sizeof s.master, "tcp://127.0.0.1:7410,tcp://127.0.0.1:7420");
    assert_int_equal(kvedge_proxy_settings_check(&s, why, sizeof why), KVEDGE_OK);
    snprintf(s.master_pub, sizeof s.master_pub, "tcp://127.0.0.1:7411");
    assert_int_equal(kvedge_proxy_settings_check(&s, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "2 masters and master_pub 1 PUB"));
    snprintf(s.master, sizeof s.master, "ipc:///tmp/a");
    s.master_pub[0] = '\0';
    assert_int_equal(kvedge_proxy_settings_check(&s, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "PORT+1 only for tcp"));
    s.master[0] = '\0';
    snprintf(s.master_pub, sizeof s.master_pub, "ipc:///tmp/ap");
    assert_int_equal(kvedge_proxy_settings_check(&s, why, sizeof why), KVEDGE_EINVAL);
}

/* ---------------------------------------------------------------- with real processes */

typedef struct {
    char dir[64];
    kvedge_master_t *master;
    int port; /* the master's ROUTER; its PUB is port + 1 */
} s_fx_t;

static int s_setup(void **state)
{
    s_fx_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    snprintf(fx->dir, sizeof fx->dir, "/tmp/kvedge-lists-XXXXXX");
    if (!mkdtemp(fx->dir))
        return -1;
    *state = fx;
    return 0;
}

static int s_teardown(void **state)
{
    s_fx_t *fx = *state;
    kvedge_master_destroy(&fx->master);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx->dir);
    int rc = system(cmd);
    free(fx);
    return rc == 0 ? 0 : -1;
}

/* A master on tcp://127.0.0.1:P with its PUB on P+1 (the default pairing), P free. */
static void s_master_up(s_fx_t *fx)
{
    char data[128], bind[64], pub[64], why[512] = "";
    snprintf(data, sizeof data, "%s/master", fx->dir);
    for (int tries = 0; tries < 50; tries++) {
        fx->port = 20000 + (int)(zclock_mono() * 7919 % 40000) + tries * 2;
        snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", fx->port);
        snprintf(pub, sizeof pub, "tcp://127.0.0.1:%d", fx->port + 1);
        kvedge_master_opts_t o;
        kvedge_master_opts_default(&o);
        o.bind = bind;
        o.pub = pub;
        o.data_dir = data;
        o.insecure = true;
        o.hugz_ms = 200;
        o.metrics = "off";
        int rc = kvedge_master_start(&o, &fx->master, why, sizeof why);
        if (rc == KVEDGE_OK)
            return;
        if (rc != KVEDGE_ELOCKED)
            fail_msg("master: %s", why);
    }
    fail_msg("no free port pair for the master");
}

/* A view following the master on fx's port (its ROUTER) and the next (its PUB). */
static kvedge_mview_t *s_view_of_master(s_fx_t *fx)
{
    kvedge_mview_opts_t o;
    kvedge_mview_opts_default(&o);
    char router[64], pub[64];
    snprintf(router, sizeof router, "tcp://127.0.0.1:%d", fx->port);
    snprintf(pub, sizeof pub, "tcp://127.0.0.1:%d", fx->port + 1);
    o.master = router;
    o.pub = pub;
    kvedge_mview_t *v = NULL;
    assert_int_equal(kvedge_mview_start(&o, &v), KVEDGE_OK);
    return v;
}

/* A port nothing listens on (bound a moment ago, released). */
static int s_dead_port(void)
{
    zsock_t *s = zsock_new(ZMQ_ROUTER);
    int port = zsock_bind(s, "tcp://127.0.0.1:*");
    zsock_destroy(&s);
    assert_true(port > 0);
    return port;
}

static bool s_has_node(kvedge_mview_t *v, const char *id)
{
    kvedge_master_node_t n;
    return kvedge_mview_state(v) == KVEDGE_MVIEW_SYNCED && kvedge_mview_node(v, id, &n) == 0;
}

static int s_run(char *out, size_t cap, const char *args);

/* A node given [a master that is down, the real master], PUBs by default: it registers with
 * the real one, and `kvedge top` says which master it follows. */
static void test_node_joins_list(void **state)
{
    s_fx_t *fx = *state;
    s_master_up(fx);
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 1;
    snprintf(ns.data, sizeof ns.data, "%s/node", fx->dir);
    snprintf(ns.bind, sizeof ns.bind, "ipc://%s/n.ipc", fx->dir);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    snprintf(ns.master, sizeof ns.master, "tcp://127.0.0.1:%d,tcp://127.0.0.1:%d", s_dead_port(),
             fx->port);
    snprintf(ns.node_id, sizeof ns.node_id, "cloud-7");
    ns.dir_interval_ms = 100;
    char why[512] = "";
    kvedge_node_t *node = NULL;
    if (kvedge_node_start(&ns, &node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node: %s", why);
    kvedge_mview_t *obs = s_view_of_master(fx);
    kt_wait_for(s_has_node(obs, "cloud-7"), KT_WAIT_MS);
    char router[64];
    snprintf(router, sizeof router, "tcp://127.0.0.1:%d", fx->port);
    kvedge_mview_destroy(&obs);
    static char out[65536];
    char args[300], want[200];
    snprintf(args, sizeof args, "-H ipc://%s/n.ipc top --json", fx->dir);
    assert_int_equal(s_run(out, sizeof out, args), 0);
    snprintf(want, sizeof want, "\"following\":\t\"%s\"", router); /* cJSON's pretty print */
    if (!strstr(out, want))
        fail_msg("expected %s in:\n%.4000s", want, out);
    assert_non_null(strstr(out, "\"moves\":\t1,"));
    snprintf(args, sizeof args, "-H ipc://%s/n.ipc top", fx->dir);
    assert_int_equal(s_run(out, sizeof out, args), 0);
    snprintf(want, sizeof want, "following %s (1 moves)", router);
    if (!strstr(out, want))
        fail_msg("expected %s in:\n%.4000s", want, out);
    kvedge_node_destroy(&node);
}

/* Runs the kvedge binary with the arguments, stderr and stdout into out; returns the exit
 * code. */
static int s_run(char *out, size_t cap, const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", KVEDGE_BIN, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_master_dump_list(void **state)
{
    s_fx_t *fx = *state;
    s_master_up(fx);
    kvedge_mview_t *v = s_view_of_master(fx);
    kvedge_master_node_t n;
    memset(&n, 0, sizeof n);
    n.role = KVEDGE_ROLE_CLOUD;
    snprintf(n.endpoint, sizeof n.endpoint, "tcp://127.0.0.1:7400");
    n.capacity_bytes = 1u << 20;
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_node_pack(&n, body, &len), KVEDGE_OK);
    assert_int_equal(kvedge_mview_set(v, "node/listed", body, len, 3000), KVEDGE_OK);
    kvedge_mview_destroy(&v);

    static char out[65536];
    char args[512];
    snprintf(args, sizeof args, "master-dump --master tcp://127.0.0.1:%d,tcp:/oops:1", fx->port);
    assert_int_equal(s_run(out, sizeof out, args), 2);
    assert_non_null(strstr(out, "has a bad entry 'tcp:/oops:1'"));
    snprintf(args, sizeof args,
             "master-dump --master tcp://127.0.0.1:%d,tcp://127.0.0.1:%d --pub "
             "tcp://127.0.0.1:1",
             s_dead_port(), fx->port);
    assert_int_equal(s_run(out, sizeof out, args), 2);
    assert_non_null(strstr(out, "2 masters and --pub 1 PUB"));
    /* The first master is down: the view moves to the second (after its dead time). */
    snprintf(args, sizeof args,
             "master-dump --deadline 15000 --prefix node/ --master "
             "tcp://127.0.0.1:%d,tcp://127.0.0.1:%d",
             s_dead_port(), fx->port);
    assert_int_equal(s_run(out, sizeof out, args), 0);
    assert_non_null(strstr(out, "node/listed"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_endpoints),
        cmocka_unit_test(test_default_pubs),
        cmocka_unit_test(test_node_settings),
        cmocka_unit_test(test_proxy_settings),
        cmocka_unit_test_setup_teardown(test_node_joins_list, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_cli_master_dump_list, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
