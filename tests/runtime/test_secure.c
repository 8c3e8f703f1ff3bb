/* The daemons' secured ROUTER and kvedge's ZAP handler: a client whose key is not in the
 * allowlist is refused, counted and logged once per address and window with its key and the
 * fix; a certificate copied in later is let in without a restart, with its key as User-Id and
 * its metadata; two allowlists in one process stay apart; and the log's rate limit counts what
 * it holds back. */
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
#include "runtime/secure.h"
#include "access/codec/error.h"
#include "tests/common/logcap.h"
#include "tests/common/testutil.h"

/* ---------------------------------------------------------------- captured log lines */

static void s_log_free(kt_log_t *l)
{
    kt_log_clear(l);
    pthread_mutex_destroy(&l->mu);
}

/* ---------------------------------------------------------------- fixture */

typedef struct {
    char dir[64];
    char clients[128];
    char clients2[128];
    char server_cert[128];
    kt_log_t log;
} s_fx_t;

static int s_setup(void **state)
{
    s_fx_t *fx = calloc(1, sizeof *fx);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/kvedge-secure-XXXXXX");
    if (!fx || !mkdtemp(fx->dir))
        return -1;
    snprintf(fx->clients, sizeof fx->clients, "%s/clients", fx->dir);
    snprintf(fx->clients2, sizeof fx->clients2, "%s/clients2", fx->dir);
    snprintf(fx->server_cert, sizeof fx->server_cert, "%s/server", fx->dir);
    zsys_dir_create("%s", fx->clients);
    zsys_dir_create("%s", fx->clients2);
    if (kvedge_secure_ensure_cert(fx->server_cert, "test") != KVEDGE_OK)
        return -1;
    pthread_mutex_init(&fx->log.mu, NULL);
    kvedge_log_set_sink(kt_log_sink, &fx->log);
    *state = fx;
    return 0;
}

static int s_teardown(void **state)
{
    s_fx_t *fx = *state;
    kvedge_log_set_sink(NULL, NULL);
    s_log_free(&fx->log);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx->dir);
    int rc = system(cmd);
    free(fx);
    return rc == 0 ? 0 : -1;
}

static void s_open(s_fx_t *fx, kvedge_secure_router_t *r, const char *clients)
{
    char secret[160], why[512] = "";
    snprintf(secret, sizeof secret, "%s_secret", fx->server_cert);
    int rc =
        kvedge_secure_router_open(r, "tcp://127.0.0.1:*", false, secret, clients, why, sizeof why);
    if (rc != KVEDGE_OK)
        fail_msg("router: %s", why);
}

/* A DEALER with cert's keys, connected to r, that has sent one message. */
static zsock_t *s_client(const kvedge_secure_router_t *r, zcert_t *cert)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    assert_non_null(s);
    zsock_set_linger(s, 0);
    zcert_apply(cert, s);
    zsock_set_curve_serverkey(s, r->public_key);
    assert_int_equal(zsock_connect(s, "%s", r->endpoint), 0);
    zstr_send(s, "hello");
    return s;
}

/* Waits until the router's refusals reach want. */
static void s_wait_denials(const kvedge_secure_router_t *r, uint64_t want)
{
    kt_wait_for(kvedge_secure_router_denials(r) >= want, KT_WAIT_MS);
    assert_int_equal(kvedge_secure_router_denials(r), want);
}

/* The message the router got from a client, or NULL within ms. */
static zmsg_t *s_recv(kvedge_secure_router_t *r, int ms)
{
    zpoller_t *p = zpoller_new(r->router, NULL);
    zmsg_t *m = zpoller_wait(p, ms) ? zmsg_recv(r->router) : NULL;
    zpoller_destroy(&p);
    return m;
}

/* ---------------------------------------------------------------- tests */

static void test_refused_counted_logged_then_allowed(void **state)
{
    s_fx_t *fx = *state;
    kvedge_secure_router_t r;
    s_open(fx, &r, fx->clients);
    assert_non_null(r.zap);
    assert_int_equal(kvedge_secure_router_denials(&r), 0);

    zcert_t *eve = zcert_new();
    zcert_set_meta(eve, "tenant", "acme");
    zsock_t *c = s_client(&r, eve);
    s_wait_denials(&r, 1);
    assert_null(s_recv(&r, 100)); /* nothing from a refused client */
    /* The refusal is counted, then logged. */
    kt_wait_for(kt_log_count(&fx->log, "refused a CURVE handshake", NULL) > 0, KT_WAIT_MS);
    assert_int_equal(kt_log_count(&fx->log, "refused a CURVE handshake", "127.0.0.1",
                                  zcert_public_txt(eve), fx->clients, "add its public certificate",
                                  r.endpoint, NULL),
                     1);
    /* Again from the same address within the window: counted, not logged. */
    zsock_destroy(&c);
    c = s_client(&r, eve);
    s_wait_denials(&r, 2);
    zsock_destroy(&c);

    /* Listed now: let in without a restart, with its key as User-Id and its metadata. */
    char path[200];
    snprintf(path, sizeof path, "%s/eve", fx->clients);
    assert_int_equal(zcert_save_public(eve, path), 0);
    c = s_client(&r, eve);
    zmsg_t *m = s_recv(&r, 3000);
    assert_non_null(m);
    zframe_t *id = zmsg_pop(m);
    zframe_t *body = zmsg_first(m);
    assert_true(zframe_streq(body, "hello"));
    assert_string_equal(zframe_meta(body, "User-Id"), zcert_public_txt(eve));
    assert_string_equal(zframe_meta(body, "tenant"), "acme");
    assert_int_equal(kt_log_count(&fx->log, "client", zcert_public_txt(eve), "(tenant acme)",
                                  "let in on", r.endpoint, NULL),
                     1);
    /* One handler thread answers in turn: the second refusal's line, had it been written, is
     * there by now. */
    assert_int_equal(kt_log_count(&fx->log, "refused a CURVE handshake", NULL), 1);
    zframe_destroy(&id);
    zmsg_destroy(&m);
    assert_int_equal(kvedge_secure_router_denials(&r), 2);
    zsock_destroy(&c);
    zcert_destroy(&eve);
    kvedge_secure_router_close(&r);
    kvedge_secure_router_close(&r); /* idempotent */
    assert_int_equal(kvedge_secure_router_denials(&r), 0);
}

/* Two daemons in one process: each router answers from its own allowlist. */
static void test_two_allowlists(void **state)
{
    s_fx_t *fx = *state;
    zcert_t *alice = zcert_new();
    char path[200];
    snprintf(path, sizeof path, "%s/alice", fx->clients);
    assert_int_equal(zcert_save_public(alice, path), 0);
    kvedge_secure_router_t a, b;
    s_open(fx, &a, fx->clients);
    s_open(fx, &b, fx->clients2);
    zsock_t *ca = s_client(&a, alice);
    zsock_t *cb = s_client(&b, alice);
    zmsg_t *m = s_recv(&a, 3000);
    assert_non_null(m);
    zmsg_destroy(&m);
    s_wait_denials(&b, 1);
    assert_int_equal(kvedge_secure_router_denials(&a), 0);
    kt_wait_for(kt_log_count(&fx->log, "refused", fx->clients2, b.endpoint, NULL) > 0, KT_WAIT_MS);
    assert_int_equal(kt_log_count(&fx->log, "refused", fx->clients2, b.endpoint, NULL), 1);
    zsock_destroy(&ca);
    zsock_destroy(&cb);
    /* Closing one leaves the other's handler running. */
    kvedge_secure_router_close(&a);
    ca = s_client(&b, alice);
    s_wait_denials(&b, 2);
    zsock_destroy(&ca);
    kvedge_secure_router_close(&b);
    zcert_destroy(&alice);
}

static void test_zap_errors(void **state)
{
    s_fx_t *fx = *state;
    kvedge_secure_zap_t *z = NULL;
    assert_int_equal(kvedge_secure_zap_open(NULL, &z), KVEDGE_EINVAL);
    assert_int_equal(kvedge_secure_zap_open("", &z), KVEDGE_EINVAL);
    assert_int_equal(kvedge_secure_zap_open(fx->clients, NULL), KVEDGE_EINVAL);
    char missing[200];
    snprintf(missing, sizeof missing, "%s/nope", fx->dir);
    assert_int_equal(kvedge_secure_zap_open(missing, &z), KVEDGE_EIO);
    assert_null(z);
    assert_int_equal(kvedge_secure_zap_denials(NULL), 0);
    kvedge_secure_zap_close(&z); /* NULL-safe */
    assert_int_equal(kvedge_secure_zap_open(fx->clients, &z), KVEDGE_OK);
    kvedge_secure_zap_close(&z);
    assert_null(z);
    kvedge_secure_router_t r;
    char why[256] = "";
    assert_int_equal(kvedge_secure_router_open(&r, "tcp://127.0.0.1:*", false, fx->server_cert,
                                               missing, why, sizeof why),
                     KVEDGE_EIO);
    assert_non_null(strstr(why, "does not exist"));
    assert_null(r.zap);
}

/* The plaintext ROUTER sits under a plaintext registration (its ZAP domain is what makes libzmq
 * refuse ZMTP 1.0 and 2.0 peers): a NULL-mechanism client is let in, nothing is refused, and a
 * CURVE allowlist in the same process keeps refusing what it does not list. */
static void test_plaintext_under_zap(void **state)
{
    s_fx_t *fx = *state;
    kvedge_secure_router_t plain;
    char why[512] = "";
    assert_int_equal(
        kvedge_secure_router_open(&plain, "tcp://127.0.0.1:*", true, NULL, NULL, why, sizeof why),
        KVEDGE_OK);
    assert_non_null(plain.zap);
    assert_null(plain.cert);
    assert_string_equal(plain.public_key, "");
    kvedge_secure_router_t curve;
    s_open(fx, &curve, fx->clients);
    zsock_t *c = zsock_new(ZMQ_DEALER);
    zsock_set_linger(c, 0);
    assert_int_equal(zsock_connect(c, "%s", plain.endpoint), 0);
    zstr_send(c, "hello");
    zmsg_t *m = s_recv(&plain, 3000);
    assert_non_null(m);
    zmsg_destroy(&m);
    assert_int_equal(kvedge_secure_router_denials(&plain), 0);
    zsock_t *eve = zsock_new(ZMQ_DEALER); /* plaintext to the CURVE socket: refused */
    zsock_set_linger(eve, 0);
    assert_int_equal(zsock_connect(eve, "%s", curve.endpoint), 0);
    zstr_send(eve, "hello");
    assert_null(s_recv(&curve, 300));
    zsock_destroy(&eve);
    zsock_destroy(&c);
    kvedge_secure_router_close(&curve);
    kvedge_secure_router_close(&plain);
    assert_null(plain.zap);
    kvedge_secure_zap_t *z = NULL;
    assert_int_equal(kvedge_secure_zap_open_plaintext(NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_secure_zap_open_plaintext(&z), KVEDGE_OK);
    kvedge_secure_zap_close(&z);
    assert_null(z);
}

/* The rate limit: per key and in total, and what it held back handed to the next line. */
static void test_log_limit(void **state)
{
    (void)state;
    kvedge_log_limit_t l;
    kvedge_log_limit_init(&l, 1000, 2, 3);
    uint64_t held = 99;
    assert_true(kvedge_log_limit_allow(&l, "a", 5000, &held));
    assert_int_equal(held, 0);
    assert_true(kvedge_log_limit_allow(&l, "a", 5001, NULL));
    assert_false(kvedge_log_limit_allow(&l, "a", 5002, &held)); /* 2 per key */
    assert_false(kvedge_log_limit_allow(&l, "a", 5003, &held));
    assert_true(kvedge_log_limit_allow(&l, "b", 5004, &held));
    assert_false(kvedge_log_limit_allow(&l, "c", 5005, &held)); /* 3 in total */
    assert_true(kvedge_log_limit_allow(&l, "a", 6000, &held));  /* a new window */
    assert_int_equal(held, 2);
    assert_true(kvedge_log_limit_allow(&l, "c", 6001, &held));
    assert_int_equal(held, 1);
    assert_true(kvedge_log_limit_allow(&l, NULL, 6002, &held)); /* NULL is a key too */
    kvedge_log_limit_fini(&l);

    /* More keys than slots: the forgotten key's count goes to the next line let through. */
    kvedge_log_limit_init(&l, 1000, 1, 1000);
    assert_true(kvedge_log_limit_allow(&l, "k0", 100, &held));
    assert_false(kvedge_log_limit_allow(&l, "k0", 101, &held));
    for (int i = 1; i <= KVEDGE_LOG_LIMIT_SLOTS; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        assert_true(kvedge_log_limit_allow(&l, key, 200 + i, &held));
        assert_int_equal(held, i == KVEDGE_LOG_LIMIT_SLOTS ? 1 : 0);
    }
    kvedge_log_limit_fini(&l);

    static kvedge_log_limit_t s = KVEDGE_LOG_LIMIT_INIT(10000, 1, 5);
    assert_true(kvedge_log_limit_allow(&s, "x", 1, NULL));
    assert_false(kvedge_log_limit_allow(&s, "x", 2, NULL));
    assert_true(kvedge_log_limit_allow(NULL, "x", 3, NULL)); /* no limit */
}

/* The sink hears every line written, not those below the level. */
static void test_log_sink(void **state)
{
    s_fx_t *fx = *state;
    kvedge_log_level_t old = kvedge_log_level();
    kvedge_log_set_level(KVEDGE_LOG_INFO);
    kvedge_log_info("sink test %d", 42);
    kvedge_log_debug("sink test hidden");
    assert_int_equal(kt_log_count(&fx->log, "sink test 42", NULL), 1);
    assert_int_equal(kt_log_count(&fx->log, "hidden", NULL), 0);
    kvedge_log_set_sink(NULL, NULL);
    kvedge_log_info("sink test after");
    assert_int_equal(kt_log_count(&fx->log, "after", NULL), 0);
    kvedge_log_set_level(old);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_limit),
        cmocka_unit_test_setup_teardown(test_log_sink, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_zap_errors, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_refused_counted_logged_then_allowed, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_two_allowlists, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_plaintext_under_zap, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
