/* What libkvedge says when a call fails (kvedge_client_last_error): an endpoint without its
 * transport, a certificate or key file that is missing, a request sent to the kind of daemon
 * that does not answer it (STAT and MODEL to an edge proxy, FETCH to a store node), a node
 * that does not answer; the message belongs to the calling thread and the next call resets
 * it. Real daemons (a store node and an edge proxy, in process) over ipc. */
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

#include "access/client_internal.h"
#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "store/node/node.h"
#include "tests/common/world.h"

typedef struct {
    char root[64];
    char node_ep[128], proxy_ep[128];
    kvedge_node_t *node;
    kvedge_proxy_t *proxy;
} s_fx_t;

static int s_setup(void **state)
{
    s_fx_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    snprintf(fx->root, sizeof fx->root, "/tmp/kvedge-errors-XXXXXX");
    if (!mkdtemp(fx->root)) {
        free(fx);
        return -1;
    }
    snprintf(fx->node_ep, sizeof fx->node_ep, "ipc://%s/node.sock", fx->root);
    snprintf(fx->proxy_ep, sizeof fx->proxy_ep, "ipc://%s/proxy.sock", fx->root);
    char data[100];
    snprintf(data, sizeof data, "%s/node", fx->root);
    kvedge_node_settings_t ns;
    kt_node_settings(&ns, KVEDGE_ROLE_CLOUD, "c1", data, fx->node_ep);
    ns.workers = 1;
    char why[512];
    if (kvedge_node_start(&ns, &fx->node, why, sizeof why) != 0) {
        fprintf(stderr, "node: %s\n", why);
        return -1;
    }
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = fx->proxy_ep;
    po.insecure = true;
    po.id = "p1";
    if (kvedge_proxy_start(&po, &fx->proxy, why, sizeof why) != 0) {
        fprintf(stderr, "proxy: %s\n", why);
        return -1;
    }
    *state = fx;
    return 0;
}

static int s_teardown(void **state)
{
    s_fx_t *fx = *state;
    kvedge_proxy_destroy(&fx->proxy);
    kvedge_node_destroy(&fx->node);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fx->root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", fx->root);
    free(fx);
    return 0;
}

/* The default client options with endpoint ep and, when deadline_ms > 0, that deadline. */
static kvedge_client_opts_t s_opts(const char *ep, int deadline_ms)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    if (deadline_ms > 0)
        o.deadline_ms = deadline_ms;
    return o;
}

static kvedge_client_t *s_connect(const char *ep)
{
    kvedge_client_opts_t o = s_opts(ep, 3000);
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_OK);
    assert_string_equal(kvedge_client_last_error(), "");
    return c;
}

static void s_has(const char *msg, const char *needle)
{
    if (!strstr(msg, needle))
        fail_msg("\"%s\" does not say \"%s\"", msg, needle);
}

/* "127.0.0.1:17400" is refused with the form an endpoint takes; so are other bad options. */
static void test_endpoint_form(void **state)
{
    (void)state;
    kvedge_client_opts_t o = s_opts("127.0.0.1:17400", 0);
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    assert_null(c);
    const char *m = kvedge_client_last_error();
    s_has(m, "\"127.0.0.1:17400\"");
    s_has(m, "tcp://HOST:PORT");
    s_has(m, "ipc://PATH");
    s_has(m, "tcp://127.0.0.1:17400"); /* what it should have been */
    o.endpoint = "";
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "no endpoint");
    o.endpoint = "tcp://127.0.0.1"; /* no port: libzmq's connect refuses it */
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "tcp://HOST:PORT");
    o.endpoint = "tcp://127.0.0.1:1";
    o.deadline_ms = -5;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "deadline_ms -5");
    o.deadline_ms = 0;
    o.link = "fast";
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "RATE,LATENCY");
}

/* A missing key or certificate file is named, with what to give instead. */
static void test_missing_files(void **state)
{
    s_fx_t *fx = *state;
    char cert[160], missing_key[160], missing_cert[160];
    snprintf(cert, sizeof cert, "%s/me.cert", fx->root);
    snprintf(missing_key, sizeof missing_key, "%s/no-such-node.cert", fx->root);
    snprintf(missing_cert, sizeof missing_cert, "%s/no-such-client.cert_secret", fx->root);
    zcert_t *z = zcert_new();
    assert_int_equal(zcert_save(z, cert), 0);
    zcert_destroy(&z);
    kvedge_client_opts_t o = s_opts(fx->node_ep, 0);
    o.server_key = missing_key;
    o.client_cert = cert;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EIO);
    s_has(kvedge_client_last_error(), missing_key);
    s_has(kvedge_client_last_error(), "no such file");
    o.server_key = cert; /* a readable certificate as the server key */
    o.client_cert = missing_cert;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EIO);
    s_has(kvedge_client_last_error(), missing_cert);
    s_has(kvedge_client_last_error(), "no such file");
    /* A public certificate where the secret one belongs. */
    o.client_cert = cert;
    char pub_only[200];
    snprintf(pub_only, sizeof pub_only, "%s/pub.cert", fx->root);
    z = zcert_new();
    assert_int_equal(zcert_save_public(z, pub_only), 0);
    zcert_destroy(&z);
    o.client_cert = pub_only;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EIO);
    s_has(kvedge_client_last_error(), pub_only);
    s_has(kvedge_client_last_error(), "no secret key");
}

/* STAT and MODEL sent to an edge proxy say that store nodes answer them; FETCH to a store
 * node says that edge proxies do; a call that succeeds afterwards says nothing. */
static void test_role(void **state)
{
    s_fx_t *fx = *state;
    kvedge_client_t *p = s_connect(fx->proxy_ep);
    assert_int_equal(kvedge_client_node(p)->role, KVEDGE_ROLE_PROXY);
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_client_stat(p, &st), KVEDGE_EINVAL); /* the proxy's own answer */
    const char *m = kvedge_client_last_error();
    s_has(m, "is an edge proxy (\"p1\"");
    s_has(m, "STAT is answered by store nodes");
    kvedge_model_t model;
    assert_int_equal(kvedge_client_get_model(p, "opt-125m", &model), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "MODEL is answered by store nodes");
    assert_int_equal(kvedge_client_ping(p, 0, NULL, NULL), KVEDGE_OK);
    assert_string_equal(kvedge_client_last_error(), ""); /* reset by the next call */
    kvedge_client_destroy(&p);

    kvedge_client_t *n = s_connect(fx->node_ep);
    uint32_t tok[256];
    for (uint32_t i = 0; i < 256; i++)
        tok[i] = i;
    kvedge_chunk_id_t id;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, "opt-125m", tok, 256, 256, &id, 1), 1);
    kvedge_fetch_req_t req;
    kvedge_fetch_req_default(&req);
    req.model_id = "opt-125m";
    req.chunks = &id;
    req.n = 1;
    req.layers = 2;
    kvedge_fetch_cbs_t cbs;
    memset(&cbs, 0, sizeof cbs);
    assert_int_equal(kvedge_client_fetch_async(n, &req, &cbs, NULL), KVEDGE_EPROTO);
    m = kvedge_client_last_error();
    s_has(m, "is a cloud store node (\"c1\"");
    s_has(m, "FETCH is answered by edge proxies");
    /* A store request a node answers: no message. */
    assert_int_equal(kvedge_client_stat(n, &st), KVEDGE_OK);
    assert_string_equal(kvedge_client_last_error(), "");
    kvedge_client_destroy(&n);
}

static void *s_other_thread(void *arg)
{
    *(char *)arg = kvedge_client_last_error()[0];
    return NULL;
}

/* The message is the failing thread's own: another thread sees nothing of it. */
static void test_per_thread(void **state)
{
    (void)state;
    kvedge_client_opts_t o = s_opts("localhost:7400", 0);
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    assert_true(kvedge_client_last_error()[0] != '\0');
    char seen = 'x';
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_other_thread, &seen), 0);
    pthread_join(t, NULL);
    assert_int_equal(seen, '\0');
    s_has(kvedge_client_last_error(), "tcp://localhost:7400");
}

/* Nothing serves the endpoint: the deadline passes, and the message says what it can mean. */
static void test_no_answer(void **state)
{
    s_fx_t *fx = *state;
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/nobody.sock", fx->root);
    kvedge_client_opts_t o = s_opts(ep, 300);
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_ETIMEDOUT);
    s_has(kvedge_client_last_error(), "no answer from");
    s_has(kvedge_client_last_error(), "within 300 ms");
    s_has(kvedge_client_last_error(), "CURVE");
}

/* Structs that can grow: a size the library does not know is refused with a message; the
 * _default functions and `.size = sizeof(T)` set it. */
static void test_struct_size(void **state)
{
    s_fx_t *fx = *state;
    kvedge_client_opts_t o = s_opts(fx->node_ep, 0);
    assert_int_equal(o.size, sizeof o);
    kvedge_client_t *c = NULL;
    o.size = 0; /* a caller that filled the struct without kvedge_client_opts_default */
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    assert_null(c);
    s_has(kvedge_client_last_error(), "opts.size is 0");
    s_has(kvedge_client_last_error(), "_default");
    o.size = sizeof o + 8; /* built against newer headers */
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "newer kvedge headers");
    o.size = sizeof o - 1;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "no layout this library knows");
    o.size = sizeof o;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_OK);

    kvedge_fetch_req_t req = {.size = sizeof req, .model_id = "opt-125m"};
    kvedge_fetch_req_t def;
    kvedge_fetch_req_default(&def);
    assert_int_equal(def.size, sizeof def);
    assert_null(def.model_id);
    kvedge_fetch_cbs_t cbs;
    memset(&cbs, 0, sizeof cbs);
    req.size = 0;
    assert_int_equal(kvedge_client_fetch_async(c, &req, &cbs, NULL), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "req.size is 0");

    kvedge_pipeline_opts_t po;
    kvedge_pipeline_opts_default(&po);
    assert_int_equal(po.size, sizeof po);
    po.client = c;
    po.size = sizeof po * 2;
    kvedge_pipeline_t *p = NULL;
    assert_int_equal(kvedge_pipeline_open(&po, &p), KVEDGE_EINVAL);
    assert_null(p);
    s_has(kvedge_client_last_error(), "opts.size");
    kvedge_client_destroy(&c);
}

/* An older caller's struct (a known layout smaller than the library's) keeps the library's
 * defaults in the tail it lacks. */
static void test_struct_size_tail(void **state)
{
    (void)state;
    typedef struct {
        size_t size;
        int a;
        int b; /* appended by a newer library */
    } s_grown_t;
    const size_t old_size = offsetof(s_grown_t, b);
    s_grown_t caller = {old_size, 5, 99}; /* b is not the caller's: never read */
    s_grown_t lib = {0, 1, 7};            /* the library's defaults */
    assert_int_equal(kvedge_abi_read(&lib, sizeof lib, &caller, old_size, "grown"), KVEDGE_OK);
    assert_int_equal(lib.size, sizeof lib);
    assert_int_equal(lib.a, 5);
    assert_int_equal(lib.b, 7);
    caller.size = old_size - 1;
    assert_int_equal(kvedge_abi_read(&lib, sizeof lib, &caller, old_size, "grown"), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "grown.size");
    assert_int_equal(kvedge_abi_read(&lib, sizeof lib, NULL, old_size, "grown"), KVEDGE_EINVAL);
    s_has(kvedge_client_last_error(), "grown is NULL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoint_form),
        cmocka_unit_test(test_missing_files),
        cmocka_unit_test(test_role),
        cmocka_unit_test(test_per_thread),
        cmocka_unit_test(test_no_answer),
        cmocka_unit_test(test_struct_size),
        cmocka_unit_test(test_struct_size_tail),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
