/* Garbage on the plaintext port: random bytes that libzmq would take for a ZMTP 1.0 peer (first
 * byte not 0xFF) sent over many raw TCP connections to a plaintext loopback store node do not
 * grow the node's memory (its ZAP domain makes libzmq refuse pre-3.0 peers), and a
 * well-behaved client is still served afterwards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "access/client.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "proxy/proxy.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "tests/common/testutil.h"

#define S_GARBAGE_BYTES  (200ull << 20) /* sent in all, over every connection */
#define S_SENDERS        4              /* connections at a time */
#define S_SEND_BUDGET_MS 12000          /* stop sending after this, whatever was sent */
#define S_RSS_GROWTH_MAX (64ull << 20)  /* what the node may keep after the garbage */
#define S_CHUNK_BYTES    (256u << 10)   /* one write */
#define S_CONN_BYTES_MAX (8ull << 20)   /* a connection is closed after this many bytes */

typedef struct {
    uint16_t port;
    uint64_t seed;
    uint64_t quota; /* bytes this sender sends */
    uint64_t sent;
    uint64_t connections;
    int64_t deadline_ms;
} s_sender_t;

static uint64_t s_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void s_fill(uint8_t *buf, size_t n, uint64_t *x)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v = s_next(x);
        memcpy(buf + i, &v, 8);
    }
}

/* Sends random bytes over fresh connections until its quota or the deadline: each connection
 * starts with a byte other than 0xFF (libzmq's ZMTP 1.0 fallback) and ends when the node
 * drops it or after S_CONN_BYTES_MAX. */
static void *s_sender(void *arg)
{
    s_sender_t *s = arg;
    uint8_t *buf = malloc(S_CHUNK_BYTES);
    uint64_t x = s->seed;
    while (buf && s->sent < s->quota && kvedge_mono_ms() < s->deadline_ms) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            break;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(s->port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        struct timeval tv = {.tv_sec = 1};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            break;
        }
        s->connections++;
        uint64_t on_conn = 0;
        bool first = true;
        while (on_conn < S_CONN_BYTES_MAX && s->sent < s->quota &&
               kvedge_mono_ms() < s->deadline_ms) {
            s_fill(buf, S_CHUNK_BYTES, &x);
            if (first)
                buf[0] = (uint8_t)(buf[0] % 0xFF); /* never 0xFF */
            first = false;
            ssize_t w = send(fd, buf, S_CHUNK_BYTES, MSG_NOSIGNAL);
            if (w <= 0)
                break; /* dropped by the node (or a full buffer past the timeout) */
            on_conn += (uint64_t)w;
            s->sent += (uint64_t)w;
        }
        close(fd);
    }
    free(buf);
    return NULL;
}

/* This process's resident set in bytes. */
static uint64_t s_rss(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Connects to port, sends the len bytes of hello and reads until the node closes the
 * connection or wait_ms pass. True when the node closed it. */
static bool s_dropped(uint16_t port, const uint8_t *hello, size_t len, int wait_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, hello, len, MSG_NOSIGNAL), (ssize_t)len);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100 * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    bool closed = false;
    int64_t end = kvedge_mono_ms() + wait_ms;
    uint8_t buf[512];
    while (!closed && kvedge_mono_ms() < end) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        closed = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    close(fd);
    return closed;
}

/* Pre-3.0 peers (ZMTP 1.0 unversioned and versioned, ZMTP 2.0) cannot do ZAP: the node drops
 * them at the greeting instead of taking their frames. Well-formed 1.0 traffic, so only the
 * handshake can end it. */
static void test_old_zmtp_dropped(void **state)
{
    kvedge_node_t *node = *state;
    const char *ep = kvedge_node_endpoint(node);
    uint16_t port = (uint16_t)atoi(strrchr(ep, ':') + 1);
    /* 1.0 unversioned: an empty identity (length 1, flags 0), then a 1-byte frame. */
    static const uint8_t v10[] = {0x01, 0x00, 0x02, 0x00, 'x'};
    assert_true(s_dropped(port, v10, sizeof v10, 2000));
    /* 1.0 and 2.0 with the 10-byte signature and a revision byte, socket type ROUTER. */
    static const uint8_t v10r[] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 0x00, 0x06};
    assert_true(s_dropped(port, v10r, sizeof v10r, 2000));
    static const uint8_t v20[] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 0x01, 0x06};
    assert_true(s_dropped(port, v20, sizeof v20, 2000));
    /* A ZMTP 3.0 NULL client is still let in. */
    kvedge_client_opts_t co;
    kvedge_client_opts_default(&co);
    co.endpoint = ep;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&co, &c), KVEDGE_OK);
    assert_int_equal(kvedge_client_ping(c, 0, NULL, NULL), KVEDGE_OK);
    kvedge_client_destroy(&c);
}

typedef struct {
    uint64_t before, after;
} s_rss_ctx_t;

/* Whether the process's RSS (into after) is within S_RSS_GROWTH_MAX of before. */
static bool s_rss_settled(void *arg)
{
    s_rss_ctx_t *x = arg;
    x->after = s_rss();
    return x->after < x->before + S_RSS_GROWTH_MAX;
}

static void test_garbage_does_not_grow_the_node(void **state)
{
    kvedge_node_t *node = *state;
    const char *ep = kvedge_node_endpoint(node);
    const char *colon = strrchr(ep, ':');
    assert_non_null(colon);
    uint16_t port = (uint16_t)atoi(colon + 1);

    kvedge_client_opts_t co;
    kvedge_client_opts_default(&co);
    co.endpoint = ep;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&co, &c), KVEDGE_OK);
    assert_int_equal(kvedge_client_ping(c, 0, NULL, NULL), KVEDGE_OK);
    kvedge_client_destroy(&c);

    uint64_t before = s_rss();
    s_sender_t senders[S_SENDERS];
    pthread_t threads[S_SENDERS];
    int64_t deadline = kvedge_mono_ms() + S_SEND_BUDGET_MS;
    for (int i = 0; i < S_SENDERS; i++) {
        senders[i] = (s_sender_t){.port = port,
                                  .seed = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1),
                                  .quota = S_GARBAGE_BYTES / S_SENDERS,
                                  .deadline_ms = deadline};
        assert_int_equal(pthread_create(&threads[i], NULL, s_sender, &senders[i]), 0);
    }
    uint64_t sent = 0, conns = 0;
    for (int i = 0; i < S_SENDERS; i++) {
        pthread_join(threads[i], NULL);
        sent += senders[i].sent;
        conns += senders[i].connections;
    }
    /* What the node still holds, not what is in flight: its memory comes back under the bound
     * once libzmq has dropped the last connections (never, were the garbage kept). */
    s_rss_ctx_t rc = {before, 0};
    kt_poll(s_rss_settled, &rc, KT_WAIT_MS);
    uint64_t after = rc.after;
    uint64_t growth = after > before ? after - before : 0;
    printf("# garbage: %llu MiB over %llu connections; node RSS %llu -> %llu MiB\n",
           (unsigned long long)(sent >> 20), (unsigned long long)conns,
           (unsigned long long)(before >> 20), (unsigned long long)(after >> 20));
    assert_true(conns > 0);
    assert_true(growth < S_RSS_GROWTH_MAX);

    /* A well-behaved client is still served. */
    assert_int_equal(kvedge_client_connect(&co, &c), KVEDGE_OK);
    assert_int_equal(kvedge_client_ping(c, 4096, NULL, NULL), KVEDGE_OK);
    kvedge_client_destroy(&c);
}

/* The port of a tcp://127.0.0.1:PORT endpoint. */
static uint16_t s_port(const char *ep)
{
    return (uint16_t)atoi(strrchr(ep, ':') + 1);
}

/* The other plaintext daemons get the same treatment: the master (ROUTER and XPUB) and an
 * edge proxy drop a ZMTP 1.0 peer at its greeting. */
static void test_old_zmtp_dropped_by_master_and_proxy(void **state)
{
    (void)state;
    static const uint8_t v10[] = {0x01, 0x00, 0x02, 0x00, 'x'};
    char dir[64] = "/tmp/kvedge-garbage-m-XXXXXX";
    assert_non_null(mkdtemp(dir));
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = "tcp://127.0.0.1:*";
    mo.pub = "tcp://127.0.0.1:*";
    mo.data_dir = dir;
    mo.insecure = true;
    kvedge_master_t *m = NULL;
    char why[512] = "";
    assert_int_equal(kvedge_master_start(&mo, &m, why, sizeof why), KVEDGE_OK);
    assert_true(s_dropped(s_port(kvedge_master_endpoint(m)), v10, sizeof v10, 2000));
    assert_true(s_dropped(s_port(kvedge_master_pub_endpoint(m)), v10, sizeof v10, 2000));
    kvedge_proxy_source_t src;
    assert_int_equal(kvedge_proxy_source_parse("cloud c1 tcp://127.0.0.1:9", &src), KVEDGE_OK);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = "tcp://127.0.0.1:*";
    po.insecure = true;
    po.sources = &src;
    po.nsources = 1;
    kvedge_proxy_t *p = NULL;
    assert_int_equal(kvedge_proxy_start(&po, &p, why, sizeof why), KVEDGE_OK);
    assert_true(s_dropped(s_port(kvedge_proxy_endpoint(p)), v10, sizeof v10, 2000));
    kvedge_proxy_destroy(&p);
    kvedge_master_destroy(&m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static char s_dir[64];

static int s_setup(void **state)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-garbage-XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    snprintf(ns.data, sizeof ns.data, "%s/data", s_dir);
    snprintf(ns.bind, sizeof ns.bind, "tcp://127.0.0.1:*");
    ns.insecure = true;
    ns.workers = 2;
    kvedge_node_t *node = NULL;
    char why[512] = "";
    if (kvedge_node_start(&ns, &node, why, sizeof why) != KVEDGE_OK) {
        fprintf(stderr, "node start: %s\n", why);
        return -1;
    }
    *state = node;
    return 0;
}

static int s_teardown(void **state)
{
    kvedge_node_t *node = *state;
    kvedge_node_destroy(&node);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_old_zmtp_dropped, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_garbage_does_not_grow_the_node, s_setup, s_teardown),
        cmocka_unit_test(test_old_zmtp_dropped_by_master_and_proxy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
