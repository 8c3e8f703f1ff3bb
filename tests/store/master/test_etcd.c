/* The etcd client and the master's etcd mode, against a real 3-member etcd cluster on loopback:
 * the decoder on etcd's own replies and on junk; put, get, paged ranges, txns, leases, members,
 * an endpoint list with a dead member first; an endpoint that is not etcd or is closed; meta
 * refusals (newer format, another cluster, junk); two masters in one process: one leads, the
 * standby redirects and stays silent, hard records land in etcd, and the standby takes over
 * with the registry id, a higher seq and every model; STATUS of the embedded default. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>

#include "store/master/etcd.h"
#include "store/master/master.h"
#include "access/codec/error.h"
#include "tests/common/testutil.h"
#include "tests/common/etcd.h"
#include "tests/store/master/mclient.h"

static kt_etcd_t s_etcd;
static char s_dir[128];
static bool s_have_etcd;

/* ---------------------------------------------------------------- decoding (no etcd) */

static void test_decode_replies(void **state)
{
    (void)state;
    kvedge_etcd_reply_t r;
    char why[300];
    /* A range, as etcd 3.4 writes it: int64 as strings, false fields omitted. */
    const char *range =
        "{\"header\":{\"cluster_id\":\"1\",\"revision\":\"4\"},\"kvs\":[{\"key\":\"Zm9v\","
        "\"create_revision\":\"2\",\"mod_revision\":\"4\",\"version\":\"2\",\"value\":\"eQ==\","
        "\"lease\":\"77\"}],\"more\":true,\"count\":\"2\"}";
    assert_int_equal(kvedge_etcd_decode(range, strlen(range), 200, &r, why, sizeof why), 0);
    assert_int_equal(r.revision, 4);
    assert_int_equal(r.n_kvs, 1);
    assert_string_equal(r.kvs[0].key, "foo");
    assert_int_equal(r.kvs[0].value_len, 1);
    assert_int_equal(r.kvs[0].value[0], 'y');
    assert_int_equal(r.kvs[0].lease, 77);
    assert_int_equal(r.kvs[0].create_rev, 2);
    assert_true(r.more);
    kvedge_etcd_reply_free(&r);
    /* A txn whose compare failed, with its failure branch's range. */
    const char *txn = "{\"header\":{\"revision\":\"9\"},\"responses\":[{\"response_range\":{"
                      "\"header\":{},\"kvs\":[{\"key\":\"YQ==\",\"value\":\"Yg==\"}]}}]}";
    assert_int_equal(kvedge_etcd_decode(txn, strlen(txn), 200, &r, why, sizeof why), 0);
    assert_false(r.succeeded);
    assert_int_equal(r.n_kvs, 1);
    kvedge_etcd_reply_free(&r);
    /* A keepalive (a stream's reply: in "result"); no TTL: the lease is gone. */
    const char *ka = "{\"result\":{\"header\":{\"revision\":\"2\"},\"ID\":\"5\"}}";
    assert_int_equal(kvedge_etcd_decode(ka, strlen(ka), 200, &r, why, sizeof why), 0);
    assert_int_equal(r.id, 5);
    assert_int_equal(r.ttl, 0);
    kvedge_etcd_reply_free(&r);
    const char *mem = "{\"header\":{},\"members\":[{\"ID\":\"12\",\"name\":\"e0\",\"peerURLs\":["
                      "\"http://p\"],\"clientURLs\":[\"http://c1\",\"http://c2\"]}]}";
    assert_int_equal(kvedge_etcd_decode(mem, strlen(mem), 200, &r, why, sizeof why), 0);
    assert_int_equal(r.n_members, 1);
    assert_string_equal(r.members[0].name, "e0");
    assert_int_equal(r.members[0].n_client, 2);
    kvedge_etcd_reply_free(&r);

    /* etcd's errors, mapped to distinct codes with etcd's message. */
    static const struct {
        const char *body;
        int rc;
    } errs[] = {
        {"{\"error\":\"etcdserver: no leader\",\"message\":\"etcdserver: no leader\",\"code\":14}",
         KVEDGE_ECLOSED},
        {"{\"error\":\"etcdserver: request timed out\",\"message\":\"etcdserver: request timed "
         "out\",\"code\":14}",
         KVEDGE_ETIMEDOUT},
        {"{\"error\":\"etcdserver: requested lease not found\",\"code\":5}", KVEDGE_ENOTFOUND},
        {"{\"error\":{\"grpc_code\":14,\"http_code\":503,\"message\":\"etcdserver: no "
         "leader\"}}",
         KVEDGE_ECLOSED},
        {"{\"error\":\"mvcc: database space exceeded\",\"code\":8}", KVEDGE_ENOSPC},
        {"{\"error\":\"bad\",\"message\":\"invalid character\",\"code\":3}", KVEDGE_EINVAL},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        why[0] = '\0';
        assert_int_equal(
            kvedge_etcd_decode(errs[i].body, strlen(errs[i].body), 503, &r, why, sizeof why),
            errs[i].rc);
        assert_non_null(strstr(why, "etcd: "));
        assert_int_equal(r.n_kvs, 0);
    }
    /* Not etcd: junk, an HTML 404, JSON without a header, fields of the wrong type. */
    const char *junk[] = {"",
                          "Not Found",
                          "<html>404</html>",
                          "[1,2]",
                          "{}",
                          "{\"header\":{},\"kvs\":[{\"key\":5}]}",
                          "{\"header\":{},\"kvs\":[{\"key\":\"!!!\"}]}",
                          "{\"header\":{\"revision\":\"x\"}}",
                          "{\"header\":{},\"members\":[{\"ID\":\"1\",\"clientURLs\":[3]}]}",
                          "{\"header\":{},\"more\":\"yes\"}"};
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        why[0] = '\0';
        assert_int_equal(kvedge_etcd_decode(junk[i], strlen(junk[i]), 200, &r, why, sizeof why),
                         KVEDGE_EPROTO);
        assert_true(why[0] != '\0');
    }
    assert_int_equal(
        kvedge_etcd_decode("{}", KVEDGE_ETCD_MAX_REPLY_BYTES + 1, 200, &r, why, sizeof why),
        KVEDGE_ETOOBIG);
    /* HTTP 404 with etcd-looking JSON but no error document is still not etcd. */
    assert_int_equal(kvedge_etcd_decode("{\"header\":{}}", 13, 404, &r, why, sizeof why),
                     KVEDGE_EPROTO);
    kvedge_etcd_t *e = NULL;
    assert_int_equal(kvedge_etcd_new("", 0, &e, why, sizeof why), KVEDGE_EINVAL);
    assert_int_equal(kvedge_etcd_new("tcp://x:1", 0, &e, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, "tcp://x:1"));
    assert_null(e);
}

/* ---------------------------------------------------------------- the client */

static int s_count_cb(void *ctx, const kvedge_etcd_kv_t *kv)
{
    size_t *n = ctx;
    char want[64];
    snprintf(want, sizeof want, "/t/kv/page/%04zu", *n);
    if (strcmp(kv->key, want) != 0) /* in key order, none missed or repeated */
        return -1;
    (*n)++;
    return 0;
}

static void test_client_kv(void **state)
{
    (void)state;
    if (!s_have_etcd)
        skip();
    kvedge_etcd_t *e;
    char why[400] = "";
    /* A closed port first: the client goes on to the next and sticks to it. */
    char list[600];
    snprintf(list, sizeof list, "http://127.0.0.1:%d,%s", kt_free_port(), s_etcd.endpoints);
    assert_int_equal(kvedge_etcd_new(list, 2000, &e, why, sizeof why), 0);
    kvedge_etcd_reply_t r;
    assert_int_equal(kvedge_etcd_status(e, &r, why, sizeof why), 0);
    assert_true(r.version[0] == '3');
    kvedge_etcd_reply_free(&r);
    assert_string_equal(kvedge_etcd_endpoint(e), s_etcd.client[0]);

    const uint8_t bin[5] = {0, 1, 0xFF, '\n', 0};
    assert_int_equal(kvedge_etcd_put(e, "/t/kv/bin", bin, sizeof bin, 0, why, sizeof why), 0);
    assert_int_equal(kvedge_etcd_get(e, "/t/kv/bin", &r, why, sizeof why), 0);
    assert_int_equal(r.n_kvs, 1);
    assert_int_equal(r.kvs[0].value_len, sizeof bin);
    assert_memory_equal(r.kvs[0].value, bin, sizeof bin);
    kvedge_etcd_reply_free(&r);
    assert_int_equal(kvedge_etcd_delete(e, "/t/kv/bin", why, sizeof why), 0);
    assert_int_equal(kvedge_etcd_get(e, "/t/kv/bin", &r, why, sizeof why), 0);
    assert_int_equal(r.n_kvs, 0);
    kvedge_etcd_reply_free(&r);

    /* More keys than a page: every one, in order, once. */
    size_t total = 3 * KVEDGE_ETCD_PAGE_KEYS + 5;
    for (size_t i = 0; i < total; i++) {
        char k[64];
        snprintf(k, sizeof k, "/t/kv/page/%04zu", i);
        assert_int_equal(kvedge_etcd_put(e, k, "v", 1, 0, why, sizeof why), 0);
    }
    size_t seen = 0;
    assert_int_equal(
        kvedge_etcd_range_prefix(e, "/t/kv/page/", 0, s_count_cb, &seen, why, sizeof why), 0);
    assert_int_equal(seen, total);
    seen = 0; /* odd pages */
    assert_int_equal(
        kvedge_etcd_range_prefix(e, "/t/kv/page/", 7, s_count_cb, &seen, why, sizeof why), 0);
    assert_int_equal(seen, total);
    assert_int_equal(kvedge_etcd_range_prefix(e, "/t/kv/page/", KVEDGE_ETCD_MAX_KVS + 1, s_count_cb,
                                              &seen, why, sizeof why),
                     KVEDGE_EINVAL);

    /* A txn: create-if-absent holds once; the failure branch reads the key. */
    kvedge_etcd_cmp_t c = {KVEDGE_ETCD_CMP_CREATE, "/t/kv/once", 0};
    kvedge_etcd_op_t put = {KVEDGE_ETCD_OP_PUT, "/t/kv/once", "a", 1, 0};
    kvedge_etcd_op_t get = {KVEDGE_ETCD_OP_GET, "/t/kv/once", NULL, 0, 0};
    assert_int_equal(kvedge_etcd_txn(e, &c, 1, &put, 1, &get, 1, &r, why, sizeof why), 0);
    assert_true(r.succeeded);
    kvedge_etcd_reply_free(&r);
    put.value = "b";
    assert_int_equal(kvedge_etcd_txn(e, &c, 1, &put, 1, &get, 1, &r, why, sizeof why), 0);
    assert_false(r.succeeded);
    assert_int_equal(r.n_kvs, 1);
    assert_int_equal(r.kvs[0].value[0], 'a');
    kvedge_etcd_reply_free(&r);

    /* Leases: a key on a lease goes with it; a fence on the lease holds only while it lives. */
    int64_t lease = 0, ttl = 0;
    assert_int_equal(kvedge_etcd_lease_grant(e, 5, &lease, why, sizeof why), 0);
    assert_true(lease != 0);
    assert_int_equal(kvedge_etcd_put(e, "/t/kv/leased", "x", 1, lease, why, sizeof why), 0);
    assert_int_equal(kvedge_etcd_lease_keepalive(e, lease, &ttl, why, sizeof why), 0);
    assert_true(ttl > 0 && ttl <= 5);
    kvedge_etcd_cmp_t fence = {KVEDGE_ETCD_CMP_LEASE, "/t/kv/leased", lease};
    kvedge_etcd_op_t w = {KVEDGE_ETCD_OP_PUT, "/t/kv/fenced", "1", 1, 0};
    assert_int_equal(kvedge_etcd_txn(e, &fence, 1, &w, 1, NULL, 0, &r, why, sizeof why), 0);
    assert_true(r.succeeded);
    kvedge_etcd_reply_free(&r);
    assert_int_equal(kvedge_etcd_lease_revoke(e, lease, why, sizeof why), 0);
    assert_int_equal(kvedge_etcd_get(e, "/t/kv/leased", &r, why, sizeof why), 0);
    assert_int_equal(r.n_kvs, 0);
    kvedge_etcd_reply_free(&r);
    assert_int_equal(kvedge_etcd_txn(e, &fence, 1, &w, 1, NULL, 0, &r, why, sizeof why), 0);
    assert_false(r.succeeded);
    kvedge_etcd_reply_free(&r);
    assert_int_equal(kvedge_etcd_lease_keepalive(e, lease, &ttl, why, sizeof why), 0);
    assert_int_equal(ttl, 0);
    assert_int_equal(kvedge_etcd_lease_revoke(e, lease, why, sizeof why), KVEDGE_ENOTFOUND);
    assert_non_null(strstr(why, "lease not found"));

    assert_int_equal(kvedge_etcd_members(e, &r, why, sizeof why), 0);
    assert_int_equal(r.n_members, 3);
    assert_true(r.members[0].n_client == 1 && r.members[0].n_peer == 1);
    kvedge_etcd_reply_free(&r);
    uint64_t ok = 0, failed = 0;
    kvedge_etcd_counts(e, &ok, &failed);
    assert_true(ok > total);
    kvedge_etcd_destroy(&e);
    kvedge_etcd_destroy(&e); /* idempotent */
}

/* An HTTP server that is not etcd: every request gets a 404 page. */
typedef struct {
    int fd;
    int port;
    volatile bool stop;
    pthread_t th;
} s_http404_t;

static void *s_http404_run(void *arg)
{
    s_http404_t *h = arg;
    while (!h->stop) {
        struct pollfd p = {h->fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept(h->fd, NULL, NULL);
        if (c < 0)
            continue;
        char buf[4096];
        ssize_t got = recv(c, buf, sizeof buf, 0);
        (void)got;
        static const char resp[] = "HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\n"
                                   "Content-Length: 22\r\nConnection: close\r\n\r\n"
                                   "<html>not here</html>\n";
        ssize_t sent = send(c, resp, sizeof resp - 1, MSG_NOSIGNAL);
        (void)sent;
        close(c);
    }
    return NULL;
}

static void s_http404_start(s_http404_t *h)
{
    memset(h, 0, sizeof *h);
    h->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(h->fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(h->fd, (struct sockaddr *)&a, &len), 0);
    assert_int_equal(listen(h->fd, 16), 0);
    h->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&h->th, NULL, s_http404_run, h), 0);
}

static void s_http404_stop(s_http404_t *h)
{
    h->stop = true;
    pthread_join(h->th, NULL);
    close(h->fd);
}

/* A master on etcd in this process, plaintext on ipc endpoints in the test's directory. */
typedef struct {
    char router[200], pub[200], data[200], metrics[64];
    kvedge_master_t *m;
} s_mfx_t;

static int s_master_try(s_mfx_t *f, const char *name, const char *etcd, const char *prefix,
                        const char *cluster, char *why, size_t why_len)
{
    snprintf(f->metrics, sizeof f->metrics, "127.0.0.1:%d", kt_free_port());
    snprintf(f->router, sizeof f->router, "ipc://%s/%s.router", s_dir, name);
    snprintf(f->pub, sizeof f->pub, "ipc://%s/%s.pub", s_dir, name);
    snprintf(f->data, sizeof f->data, "%s/%s.data", s_dir, name);
    kvedge_master_opts_t o;
    kvedge_master_opts_default(&o);
    o.bind = f->router;
    o.pub = f->pub;
    o.data_dir = f->data;
    o.insecure = true;
    o.hugz_ms = 100;
    o.etcd = etcd;
    o.etcd_prefix = prefix;
    o.cluster = cluster;
    o.id = name;
    o.lease_ms = 2000;
    o.metrics = f->metrics;
    return kvedge_master_start(&o, &f->m, why, why_len);
}

static void test_not_etcd(void **state)
{
    (void)state;
    if (!s_have_etcd)
        skip();
    s_http404_t h;
    s_http404_start(&h);
    char url[64], why[600] = "";
    snprintf(url, sizeof url, "http://127.0.0.1:%d", h.port);
    kvedge_etcd_t *e;
    assert_int_equal(kvedge_etcd_new(url, 1000, &e, why, sizeof why), 0);
    kvedge_etcd_reply_t r;
    assert_int_equal(kvedge_etcd_status(e, &r, why, sizeof why), KVEDGE_EPROTO);
    assert_non_null(strstr(why, url));
    kvedge_etcd_destroy(&e);
    /* The master refuses to start on it, naming the endpoint; nothing is left running. */
    s_mfx_t f;
    why[0] = '\0';
    assert_int_equal(s_master_try(&f, "notetcd", url, "/t/notetcd", NULL, why, sizeof why),
                     KVEDGE_EPROTO);
    assert_non_null(strstr(why, url));
    assert_null(f.m);
    s_http404_stop(&h);
    /* A closed port: unreachable, named. */
    snprintf(url, sizeof url, "http://127.0.0.1:%d", kt_free_port());
    why[0] = '\0';
    assert_int_equal(s_master_try(&f, "closed", url, "/t/closed", NULL, why, sizeof why),
                     KVEDGE_ECLOSED);
    assert_non_null(strstr(why, url));
    print_message("closed port: %s\n", why);
}

static void test_meta_refused(void **state)
{
    (void)state;
    if (!s_have_etcd)
        skip();
    kvedge_etcd_t *e;
    char why[600] = "";
    assert_int_equal(kvedge_etcd_new(s_etcd.endpoints, 2000, &e, why, sizeof why), 0);
    const char *newer = "{\"format\":99,\"registry\":\"00000000000000aa\",\"cluster\":\"kvedge\"}";
    assert_int_equal(kvedge_etcd_put(e, "/t/newer/meta", newer, strlen(newer), 0, why, sizeof why),
                     0);
    const char *junk = "not json";
    assert_int_equal(kvedge_etcd_put(e, "/t/junk/meta", junk, strlen(junk), 0, why, sizeof why), 0);
    kvedge_etcd_destroy(&e);
    s_mfx_t f;
    assert_int_equal(s_master_try(&f, "newer", s_etcd.endpoints, "/t/newer", NULL, why, sizeof why),
                     KVEDGE_EVERSION);
    assert_non_null(strstr(why, "format 99"));
    assert_int_equal(s_master_try(&f, "junk", s_etcd.endpoints, "/t/junk", NULL, why, sizeof why),
                     KVEDGE_ECORRUPT);
    /* Cluster "a" makes the prefix its own; cluster "b" on the same prefix is refused. */
    assert_int_equal(s_master_try(&f, "ca", s_etcd.endpoints, "/t/shared", "a", why, sizeof why),
                     0);
    assert_string_equal(kvedge_master_role(f.m), "standby");
    kt_wait_for(strcmp(kvedge_master_role(f.m), "leader") == 0, KT_WAIT_MS);
    s_mfx_t g;
    assert_int_equal(s_master_try(&g, "cb", s_etcd.endpoints, "/t/shared", "b", why, sizeof why),
                     KVEDGE_ELOCKED);
    assert_non_null(strstr(why, "'a'"));
    assert_null(g.m);
    kvedge_master_destroy(&f.m);
}

/* ---------------------------------------------------------------- two masters */

static size_t s_body_cb(char *p, size_t size, size_t n, void *arg)
{
    char *buf = arg;
    size_t have = strlen(buf), add = size * n;
    if (have + add >= 65536)
        add = 65535 - have;
    memcpy(buf + have, p, add);
    buf[have + add] = '\0';
    return size * n;
}

/* The value of one series on the master's /metrics; -1 when absent. */
static double s_metric(const s_mfx_t *f, const char *series)
{
    static char buf[65536];
    buf[0] = '\0';
    char url[128];
    snprintf(url, sizeof url, "http://%s/metrics", f->metrics);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, s_body_cb);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, buf);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 3000L);
    CURLcode cc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    assert_int_equal(cc, CURLE_OK);
    char want[200];
    snprintf(want, sizeof want, "\n%s ", series);
    const char *at = strstr(buf, want);
    return at ? strtod(at + strlen(want), NULL) : -1;
}

static const char *s_role(s_mfx_t *f)
{
    return kvedge_master_role(f->m);
}

static cJSON *s_status(s_mfx_t *f)
{
    kt_mreply_t r;
    assert_int_equal(
        kt_master_call(f->router, KVEDGE_KVMSG_STATUS, NULL, NULL, 0, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.cmd, KVEDGE_KVMSG_OK);
    cJSON *o = cJSON_Parse(r.body);
    assert_non_null(o);
    return o;
}

static const char *s_str(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static size_t s_array_size(const cJSON *o, const char *name)
{
    return (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, name));
}

static bool s_two_masters(void *ctx)
{
    cJSON *o = s_status(ctx);
    bool ok = s_array_size(o, "masters") == 2;
    cJSON_Delete(o);
    return ok;
}

static void test_two_masters_one_leads(void **state)
{
    (void)state;
    if (!s_have_etcd)
        skip();
    char why[600] = "";
    s_mfx_t a, b;
    assert_int_equal(s_master_try(&a, "m1", s_etcd.endpoints, "/t/two", NULL, why, sizeof why), 0);
    kt_wait_for(strcmp(s_role(&a), "leader") == 0, KT_WAIT_MS);
    assert_int_equal(s_master_try(&b, "m2", s_etcd.endpoints, "/t/two", NULL, why, sizeof why), 0);
    kt_wait_until(s_two_masters, &b, KT_WAIT_MS);
    assert_string_equal(s_role(&b), "standby");

    /* Hard records go to etcd before they are applied. */
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    kt_mreply_t r;
    for (int i = 0; i < 5; i++) {
        char key[64], id[32];
        snprintf(id, sizeof id, "model-%d", i);
        snprintf(key, sizeof key, "model/%s", id);
        size_t len = kt_model_body(id, body);
        assert_int_equal(
            kt_master_call(a.router, KVEDGE_KVMSG_SET, key, body, len, 3000, &r, NULL, NULL), 0);
        assert_int_equal(r.cmd, KVEDGE_KVMSG_OK);
    }
    kvedge_etcd_t *e;
    assert_int_equal(kvedge_etcd_new(s_etcd.endpoints, 2000, &e, why, sizeof why), 0);
    kvedge_etcd_reply_t er;
    assert_int_equal(kvedge_etcd_get(e, "/t/two/reg/model/model-3", &er, why, sizeof why), 0);
    assert_int_equal(er.n_kvs, 1);
    kvedge_etcd_reply_free(&er);

    /* The standby redirects to the leader, and its PUB says nothing. */
    size_t len = kt_model_body("x", body);
    assert_int_equal(
        kt_master_call(b.router, KVEDGE_KVMSG_SET, "model/x", body, len, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.cmd, KVEDGE_KVMSG_ERR);
    assert_int_equal(r.status, KVEDGE_ENOTLEADER);
    char want[600];
    snprintf(want, sizeof want, "leader %s %s", a.router, a.pub);
    assert_string_equal(r.body, want);
    assert_int_equal(
        kt_master_call(b.router, KVEDGE_KVMSG_ICANHAZ, "", NULL, 0, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.status, KVEDGE_ENOTLEADER);
    zsock_t *sub = zsock_new_sub(b.pub, "");
    assert_non_null(sub);
    zsock_set_rcvtimeo(sub, 600); /* a silence to last: 6 HUGZ periods */
    zmsg_t *heard = zmsg_recv(sub);
    assert_null(heard);
    zsock_destroy(&sub);

    assert_true(s_metric(&b, "kvedge_master_leader") == 0);
    assert_true(s_metric(&b, "kvedge_master_role{role=\"standby\"}") == 1);
    cJSON *sa = s_status(&a), *sb = s_status(&b);
    assert_string_equal(s_str(sa, "role"), "leader");
    assert_string_equal(s_str(sb, "role"), "standby");
    assert_string_equal(s_str(sb, "registry"), s_str(sa, "registry"));
    assert_string_equal(s_str(cJSON_GetObjectItem(sb, "leader"), "id"), "m1");
    const cJSON *et = cJSON_GetObjectItem(sa, "etcd");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(et, "healthy")));
    assert_int_equal(s_array_size(et, "members"), 3);
    assert_string_equal(s_str(et, "prefix"), "/t/two/");
    char registry[17];
    snprintf(registry, sizeof registry, "%s", s_str(sa, "registry"));
    cJSON_Delete(sa);
    cJSON_Delete(sb);

    /* A node's registration (soft) reaches the standby through its view. */
    uint64_t seq_a = kvedge_master_seq(a.m);
    kvedge_master_node_t n = {.role = KVEDGE_ROLE_CLOUD, .capacity_bytes = 1 << 30};
    snprintf(n.endpoint, sizeof n.endpoint, "tcp://127.0.0.1:9");
    uint8_t nb[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t nlen = 0;
    assert_int_equal(kvedge_master_node_pack(&n, nb, &nlen), 0);
    assert_int_equal(
        kt_master_call(a.router, KVEDGE_KVMSG_SET, "node/n1", nb, nlen, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.cmd, KVEDGE_KVMSG_OK);
    kt_wait_for(
        kt_master_call(b.router, KVEDGE_KVMSG_STATUS, NULL, NULL, 0, 3000, &r, NULL, NULL) == 0 &&
            r.seq >= seq_a + 1,
        KT_WAIT_MS);

    /* The leader goes away cleanly (its lease revoked): the standby takes over at once with
     * the registry id, a seq above the old leader's, every model and the node. */
    uint64_t last = kvedge_master_seq(a.m);
    int64_t t0 = kt_now_ms();
    kvedge_master_destroy(&a.m);
    kt_wait_for(strcmp(s_role(&b), "leader") == 0, KT_WAIT_MS);
    print_message("clean handover in %lld ms\n", (long long)(kt_now_ms() - t0));
    assert_int_equal(
        kt_master_call(b.router, KVEDGE_KVMSG_ICANHAZ, "", NULL, 0, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.cmd, KVEDGE_KVMSG_KTHXBAI);
    /* Above the block the old leader reserved in etcd: above anything it may have published. */
    assert_true(r.seq > last && r.seq > KVEDGE_MASTER_SEQ_BLOCK);
    char reg[17];
    snprintf(reg, sizeof reg, "%016llx", (unsigned long long)r.registry);
    assert_string_equal(reg, registry);
    assert_int_equal(
        kt_master_call(b.router, KVEDGE_KVMSG_ICANHAZ, "model/", NULL, 0, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.synced, 5);
    assert_int_equal(
        kt_master_call(b.router, KVEDGE_KVMSG_ICANHAZ, "node/", NULL, 0, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.synced, 1);
    sb = s_status(&b);
    assert_int_equal(cJSON_GetObjectItem(sb, "leader_changes")->valueint, 1);
    cJSON_Delete(sb);
    assert_true(s_metric(&b, "kvedge_master_leader") == 1);
    assert_true(s_metric(&b, "kvedge_master_leader_changes_total") == 1);
    assert_true(s_metric(&b, "kvedge_master_role{role=\"leader\"}") == 1);
    assert_true(s_metric(&b, "kvedge_master_role{role=\"standby\"}") == 0);
    assert_true(s_metric(&b, "kvedge_master_etcd_requests_total{result=\"ok\"}") > 0);
    /* A deletion of a hard record leaves etcd too. */
    assert_int_equal(
        kt_master_call(b.router, KVEDGE_KVMSG_SET, "model/model-3", NULL, 0, 3000, &r, NULL, NULL),
        0);
    assert_int_equal(r.cmd, KVEDGE_KVMSG_OK);
    assert_int_equal(kvedge_etcd_get(e, "/t/two/reg/model/model-3", &er, why, sizeof why), 0);
    assert_int_equal(er.n_kvs, 0);
    kvedge_etcd_reply_free(&er);
    kvedge_etcd_destroy(&e);
    kvedge_master_destroy(&b.m);
}

/* A leader whose key was taken (its lease no longer holds it) cannot write: the fence refuses
 * the hard record, nothing changes, and it follows whoever etcd names; when that key goes it
 * leads again. */
static void test_deposed_leader_is_fenced(void **state)
{
    (void)state;
    if (!s_have_etcd)
        skip();
    char why[600] = "";
    s_mfx_t f;
    assert_int_equal(s_master_try(&f, "f1", s_etcd.endpoints, "/t/fence", NULL, why, sizeof why),
                     0);
    kt_wait_for(strcmp(s_role(&f), "leader") == 0, KT_WAIT_MS);
    kvedge_etcd_t *e;
    assert_int_equal(kvedge_etcd_new(s_etcd.endpoints, 2000, &e, why, sizeof why), 0);
    int64_t lease = 0;
    assert_int_equal(kvedge_etcd_lease_grant(e, 30, &lease, why, sizeof why), 0);
    const char *other = "{\"id\":\"intruder\",\"router\":\"ipc:///nowhere\",\"pub\":\"ipc:///"
                        "nowhere-pub\"}";
    /* Another lease on the leader key, as a master that took over would have. */
    assert_int_equal(
        kvedge_etcd_put(e, "/t/fence/leader", other, strlen(other), lease, why, sizeof why), 0);
    kvedge_etcd_reply_t r;

    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = kt_model_body("late", body);
    uint64_t seq = kvedge_master_seq(f.m);
    kt_mreply_t mr;
    assert_int_equal(
        kt_master_call(f.router, KVEDGE_KVMSG_SET, "model/late", body, len, 3000, &mr, NULL, NULL),
        0);
    assert_int_equal(mr.cmd, KVEDGE_KVMSG_ERR);
    assert_int_equal(mr.status, KVEDGE_ENOTLEADER);
    assert_int_equal(kvedge_master_seq(f.m), seq);
    assert_int_equal(kvedge_etcd_get(e, "/t/fence/reg/model/late", &r, why, sizeof why), 0);
    assert_int_equal(r.n_kvs, 0);
    kvedge_etcd_reply_free(&r);
    kt_wait_for(strcmp(s_role(&f), "standby") == 0, KT_WAIT_MS);
    kt_wait_for(kt_master_call(f.router, KVEDGE_KVMSG_SET, "model/late", body, len, 3000, &mr, NULL,
                               NULL) == 0 &&
                    strcmp(mr.body, "leader ipc:///nowhere ipc:///nowhere-pub") == 0,
                KT_WAIT_MS);
    /* The intruder's lease goes: f1 campaigns and leads again. */
    assert_int_equal(kvedge_etcd_lease_revoke(e, lease, why, sizeof why), 0);
    kt_wait_for(strcmp(s_role(&f), "leader") == 0, KT_WAIT_MS);
    assert_int_equal(
        kt_master_call(f.router, KVEDGE_KVMSG_SET, "model/late", body, len, 3000, &mr, NULL, NULL),
        0);
    assert_int_equal(mr.cmd, KVEDGE_KVMSG_OK);
    /* Without any write: a leader sees its key taken on its own and stops leading. */
    assert_int_equal(kvedge_etcd_lease_grant(e, 30, &lease, why, sizeof why), 0);
    assert_int_equal(
        kvedge_etcd_put(e, "/t/fence/leader", other, strlen(other), lease, why, sizeof why), 0);
    kt_wait_for(strcmp(s_role(&f), "standby") == 0, KT_WAIT_MS);
    assert_int_equal(kvedge_etcd_lease_revoke(e, lease, why, sizeof why), 0);
    kt_wait_for(strcmp(s_role(&f), "leader") == 0, KT_WAIT_MS);
    kvedge_etcd_destroy(&e);
    kvedge_master_destroy(&f.m);
}

/* A takeover of a registry with many hard records keeps its lease while it reads them, and
 * stays the leader: 20,000 models seeded straight into etcd (txns of 100 puts). */
static void test_takeover_of_a_large_registry(void **state)
{
    (void)state;
    if (!s_have_etcd)
        skip();
    char why[600] = "";
    kvedge_etcd_t *e;
    assert_int_equal(kvedge_etcd_new(s_etcd.endpoints, 5000, &e, why, sizeof why), 0);
    enum { N = 20000, PER_TXN = 100 };
    static char keys[PER_TXN][64];
    static uint8_t vals[PER_TXN][8 + KVEDGE_MASTER_RECORD_MAX_BYTES];
    for (int base = 0; base < N; base += PER_TXN) {
        kvedge_etcd_op_t ops[PER_TXN];
        for (int i = 0; i < PER_TXN; i++) {
            char id[32];
            snprintf(id, sizeof id, "big-%05d", base + i);
            snprintf(keys[i], sizeof keys[i], "/t/big/reg/model/%s", id);
            size_t len = kt_model_body(id, vals[i] + 8);
            memset(vals[i], 0, 8);
            vals[i][0] = 1; /* seq 1 */
            ops[i] = (kvedge_etcd_op_t){KVEDGE_ETCD_OP_PUT, keys[i], vals[i], 8 + len, 0};
        }
        kvedge_etcd_reply_t r;
        assert_int_equal(kvedge_etcd_txn(e, NULL, 0, ops, PER_TXN, NULL, 0, &r, why, sizeof why),
                         0);
        kvedge_etcd_reply_free(&r);
    }
    kvedge_etcd_destroy(&e);
    s_mfx_t f;
    assert_int_equal(s_master_try(&f, "big", s_etcd.endpoints, "/t/big", NULL, why, sizeof why), 0);
    kt_wait_for(strcmp(s_role(&f), "leader") == 0, KT_WAIT_MS);
    kt_mreply_t mr;
    assert_int_equal(
        kt_master_call(f.router, KVEDGE_KVMSG_ICANHAZ, "model/", NULL, 0, 10000, &mr, NULL, NULL),
        0);
    assert_int_equal(mr.synced, N);
    kt_pause_ms(2500); /* longer than the lease: it must still be renewed */
    assert_string_equal(s_role(&f), "leader");
    cJSON *o = s_status(&f);
    assert_int_equal(cJSON_GetObjectItem(o, "leader_changes")->valueint, 1);
    cJSON_Delete(o);
    kvedge_master_destroy(&f.m);
}

/* Without --id a master on etcd is known by its ROUTER endpoint without the scheme. */
static void test_default_id(void **state)
{
    (void)state;
    if (!s_have_etcd)
        skip();
    int port = kt_free_port();
    char router[64], pub[64], data[256], want[64], why[600] = "";
    snprintf(router, sizeof router, "tcp://127.0.0.1:%d", port);
    snprintf(pub, sizeof pub, "tcp://127.0.0.1:%d", kt_free_port());
    snprintf(data, sizeof data, "%s/noid.data", s_dir);
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    kvedge_master_opts_t o;
    kvedge_master_opts_default(&o);
    o.bind = router;
    o.pub = pub;
    o.data_dir = data;
    o.insecure = true;
    o.etcd = s_etcd.endpoints;
    o.etcd_prefix = "/t/noid";
    s_mfx_t f = {.m = NULL};
    snprintf(f.router, sizeof f.router, "%s", router);
    assert_int_equal(kvedge_master_start(&o, &f.m, why, sizeof why), 0);
    kt_wait_for(strcmp(s_role(&f), "leader") == 0, KT_WAIT_MS);
    cJSON *doc = s_status(&f);
    assert_string_equal(s_str(doc, "id"), want);
    assert_string_equal(s_str(cJSON_GetObjectItem(doc, "etcd"), "cluster"), "kvedge");
    cJSON_Delete(doc);
    kvedge_master_destroy(&f.m);
}

/* Without --etcd: role single, no etcd, itself the leader; the rest as before. */
static void test_embedded_status(void **state)
{
    (void)state;
    char why[600] = "";
    s_mfx_t f;
    assert_int_equal(s_master_try(&f, "single", NULL, NULL, NULL, why, sizeof why), 0);
    assert_string_equal(s_role(&f), "single");
    cJSON *o = s_status(&f);
    assert_string_equal(s_str(o, "role"), "single");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "etcd")));
    assert_string_equal(s_str(cJSON_GetObjectItem(o, "leader"), "router"), f.router);
    assert_int_equal(s_array_size(o, "masters"), 1);
    cJSON_Delete(o);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = kt_model_body("m", body);
    kt_mreply_t r;
    assert_int_equal(
        kt_master_call(f.router, KVEDGE_KVMSG_SET, "model/m", body, len, 3000, &r, NULL, NULL), 0);
    assert_int_equal(r.cmd, KVEDGE_KVMSG_OK);
    assert_int_equal(r.seq, 1);
    kvedge_master_destroy(&f.m);
}

int main(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-test-etcd-%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", s_dir, s_dir);
    if (system(cmd) != 0)
        return 1;
    s_have_etcd = kt_etcd_installed();
    if (s_have_etcd && kt_etcd_start(&s_etcd, s_dir, 3) != 0) {
        fprintf(stderr, "etcd did not start: see %s/etcd*.log\n", s_dir);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_replies),
        cmocka_unit_test(test_embedded_status),
        cmocka_unit_test(test_client_kv),
        cmocka_unit_test(test_not_etcd),
        cmocka_unit_test(test_meta_refused),
        cmocka_unit_test(test_two_masters_one_leads),
        cmocka_unit_test(test_deposed_leader_is_fenced),
        cmocka_unit_test(test_takeover_of_a_large_registry),
        cmocka_unit_test(test_default_id),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (s_have_etcd)
        kt_etcd_stop(&s_etcd);
    if (rc == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
        rc = system(cmd) == 0 ? 0 : 1;
    }
    if (rc == 0 && !s_have_etcd) {
        fprintf(stderr, "etcd is not installed (scripts/setup.sh installs it): skipped\n");
        return 77;
    }
    return rc;
}
