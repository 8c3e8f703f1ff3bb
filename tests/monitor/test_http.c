/* HTTP endpoint over plain sockets on 127.0.0.1: /metrics (GET and HEAD), /health, /ready
 * flipping from 503 to 200, 404, 405 with Allow, a request body refused, oversized headers
 * cut, a second endpoint on a taken port, and the address checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "monitor/http.h"
#include "access/codec/error.h" /* only to check that the monitor's codes equal kvedge's */
#include "tests/common/testutil.h"

#define WHY_BYTES  256
#define REPLY_MAX  (256 * 1024)
#define BIG_HEADER (64 * 1024)

typedef struct {
    atomic_bool ready;
    atomic_int calls;
} s_ready_t;

static bool s_ready_fn(void *arg, char *why, size_t why_len)
{
    s_ready_t *r = arg;
    atomic_fetch_add(&r->calls, 1);
    if (atomic_load(&r->ready))
        return true;
    snprintf(why, why_len, "store is still loading\nsecond line");
    return false;
}

typedef struct {
    kvedge_metrics_t *metrics;
    kvedge_http_t *http;
    s_ready_t ready;
} s_fixture_t;

static int s_setup(void **state)
{
    s_fixture_t *f = calloc(1, sizeof *f);
    f->metrics = kvedge_metrics_new();
    char why[WHY_BYTES];
    kvedge_metric_t *m =
        kvedge_metrics_family(f->metrics, KVEDGE_METRIC_COUNTER, "kvedge_test_hits_total", "Hits.",
                              NULL, 0, NULL, 0, why, sizeof why);
    if (!m)
        return -1;
    kvedge_series_add(kvedge_metric_plain(m), 42);
    int rc = kvedge_http_start("127.0.0.1:0", f->metrics, s_ready_fn, &f->ready, &f->http, why,
                               sizeof why);
    if (rc != 0) {
        print_error("kvedge_http_start: %d %s\n", rc, why);
        return -1;
    }
    *state = f;
    return 0;
}

static int s_teardown(void **state)
{
    s_fixture_t *f = *state;
    kvedge_http_stop(&f->http);
    assert_null(f->http);
    kvedge_metrics_destroy(&f->metrics);
    free(f);
    return 0;
}

/* Sends req to 127.0.0.1:port and reads until the server closes (or 5 s pass). Returns the
 * reply (malloc'd, NUL-terminated; "" when the connection was cut before any byte). */
static char *s_exchange(uint16_t port, const char *req, size_t req_len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    size_t off = 0;
    while (off < req_len) {
        ssize_t n = send(fd, req + off, req_len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break; /* the server cut us: read what it said */
        off += (size_t)n;
    }
    char *buf = malloc(REPLY_MAX + 1);
    size_t got = 0;
    for (;;) {
        ssize_t n = recv(fd, buf + got, REPLY_MAX - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
        if (got == REPLY_MAX)
            break;
    }
    buf[got] = '\0';
    close(fd);
    return buf;
}

static char *s_get(uint16_t port, const char *method, const char *path)
{
    char req[512];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
                     method, path);
    return s_exchange(port, req, (size_t)n);
}

/* The status code of a reply, 0 when there is none. */
static int s_status(const char *reply)
{
    int code = 0;
    if (sscanf(reply, "HTTP/1.%*d %d", &code) != 1)
        return 0;
    return code;
}

/* The body of a reply (after the blank line), "" when there is none. */
static const char *s_body(const char *reply)
{
    const char *p = strstr(reply, "\r\n\r\n");
    return p ? p + 4 : "";
}

/* True when the reply's headers hold "name: value" (name case-insensitive). */
static bool s_has_header(const char *reply, const char *name, const char *value)
{
    const char *end = strstr(reply, "\r\n\r\n");
    size_t nl = strlen(name);
    for (const char *p = strstr(reply, "\r\n"); p && p < end; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ')
                v++;
            if (strncmp(v, value, strlen(value)) == 0)
                return true;
        }
    }
    return false;
}

static void test_error_codes(void **state)
{
    (void)state;
    assert_int_equal(KVEDGE_MONITOR_EINVAL, KVEDGE_EINVAL);
    assert_int_equal(KVEDGE_MONITOR_ENOMEM, KVEDGE_ENOMEM);
    assert_int_equal(KVEDGE_MONITOR_EIO, KVEDGE_EIO);
}

static void test_metrics(void **state)
{
    s_fixture_t *f = *state;
    uint16_t port = kvedge_http_port(f->http);
    assert_true(port != 0);
    char *r = s_get(port, "GET", "/metrics");
    assert_int_equal(s_status(r), 200);
    assert_true(s_has_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8"));
    assert_non_null(strstr(s_body(r), "# TYPE kvedge_test_hits_total counter\n"));
    assert_non_null(strstr(s_body(r), "kvedge_test_hits_total 42\n"));
    size_t body_len = strlen(s_body(r));
    free(r);

    /* A query string is not part of the path. */
    r = s_get(port, "GET", "/metrics?x=1");
    assert_int_equal(s_status(r), 200);
    free(r);

    /* HEAD: the same headers, no body. */
    r = s_get(port, "HEAD", "/metrics");
    assert_int_equal(s_status(r), 200);
    assert_true(s_has_header(r, "Content-Type", "text/plain; version=0.0.4"));
    char cl[32];
    snprintf(cl, sizeof cl, "%zu", body_len);
    assert_true(s_has_header(r, "Content-Length", cl));
    assert_string_equal(s_body(r), "");
    free(r);
}

static void test_health_and_ready(void **state)
{
    s_fixture_t *f = *state;
    uint16_t port = kvedge_http_port(f->http);
    char *r = s_get(port, "GET", "/health");
    assert_int_equal(s_status(r), 200);
    assert_string_equal(s_body(r), "ok\n");
    free(r);

    r = s_get(port, "GET", "/ready");
    assert_int_equal(s_status(r), 503);
    /* One line: the reason's newline is flattened. */
    assert_string_equal(s_body(r), "not ready: store is still loading second line\n");
    free(r);
    atomic_store(&f->ready.ready, true);
    r = s_get(port, "GET", "/ready");
    assert_int_equal(s_status(r), 200);
    assert_string_equal(s_body(r), "ready\n");
    free(r);
    assert_int_equal(atomic_load(&f->ready.calls), 2);
}

static void test_errors(void **state)
{
    s_fixture_t *f = *state;
    uint16_t port = kvedge_http_port(f->http);
    const char *missing[] = {"/nope", "/", "/metrics/", "/healthz", "/metricsx"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        char *r = s_get(port, "GET", missing[i]);
        assert_int_equal(s_status(r), 404);
        free(r);
    }
    const char *methods[] = {"POST", "PUT", "DELETE", "OPTIONS", "PATCH"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        char *r = s_get(port, methods[i], "/metrics");
        assert_int_equal(s_status(r), 405);
        assert_true(s_has_header(r, "Allow", "GET, HEAD"));
        free(r);
    }

    /* A body, announced by length or chunked, is refused; the connection is not reused. */
    const char *with_body[] = {
        "GET /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
        ("GET /health HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
         "5\r\nhello\r\n0\r\n\r\n"),
        "POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
    };
    for (size_t i = 0; i < sizeof with_body / sizeof with_body[0]; i++) {
        char *r = s_exchange(port, with_body[i], strlen(with_body[i]));
        int st = s_status(r);
        if (st != 413 && st != 400 && st != 405)
            fail_msg("request %zu with a body: status %d\n%s", i, st, r);
        assert_null(strstr(r, "kvedge_test_hits_total"));
        free(r);
    }

    /* A 64 KiB header line: cut (an error status or a closed connection), never served. */
    char *big = malloc(BIG_HEADER + 128);
    int n = snprintf(big, 128, "GET /metrics HTTP/1.1\r\nHost: t\r\nX-Big: ");
    memset(big + n, 'a', BIG_HEADER);
    memcpy(big + n + BIG_HEADER, "\r\nConnection: close\r\n\r\n", 24);
    char *r = s_exchange(port, big, (size_t)n + BIG_HEADER + 23);
    int st = s_status(r);
    if (st != 0 && st != 431 && st != 413 && st != 400)
        fail_msg("64 KiB header: status %d", st);
    assert_null(strstr(r, "kvedge_test_hits_total"));
    free(r);
    free(big);

    /* Garbage is not served either, and the endpoint still answers afterwards. */
    const char junk[] = "\x01\x02 not http at all\r\n\r\n";
    r = s_exchange(port, junk, sizeof junk - 1);
    assert_true(s_status(r) != 200);
    free(r);
    r = s_get(port, "GET", "/health");
    assert_int_equal(s_status(r), 200);
    free(r);
}

/* Keep-alive: two pipelined requests on one connection are both answered; an explicit empty
 * body (Content-Length: 0) is no body. */
static void test_keep_alive(void **state)
{
    s_fixture_t *f = *state;
    uint16_t port = kvedge_http_port(f->http);
    const char req[] = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
                       "GET /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n"
                       "Connection: close\r\n\r\n";
    char *r = s_exchange(port, req, sizeof req - 1);
    assert_int_equal(s_status(r), 200);
    const char *second = strstr(r + 1, "HTTP/1.1 ");
    assert_non_null(second);
    assert_int_equal(s_status(second), 200);
    assert_non_null(strstr(second, "kvedge_test_hits_total 42\n"));
    free(r);
}

/* A socket connected to the endpoint. */
static int s_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* At most KVEDGE_HTTP_MAX_CONNECTIONS at once: one more is not served beside them; a request
 * that stalls is cut after KVEDGE_HTTP_TIMEOUT_S. */
static void test_limits(void **state)
{
    s_fixture_t *f = *state;
    uint16_t port = kvedge_http_port(f->http);
    assert_int_equal(kvedge_http_connections(f->http), 0);
    int fds[KVEDGE_HTTP_MAX_CONNECTIONS];
    for (int i = 0; i < KVEDGE_HTTP_MAX_CONNECTIONS; i++) {
        fds[i] = s_connect(port);
        assert_int_equal(send(fds[i], "GET /health HTTP/1.1\r\n", 23, MSG_NOSIGNAL), 23);
    }
    kt_wait_for(kvedge_http_connections(f->http) == KVEDGE_HTTP_MAX_CONNECTIONS, KT_WAIT_MS);
    /* One more waits in the kernel's queue (or is closed): it is served only once the
     * stalled requests have been cut. */
    double t0 = s_now();
    char *r = s_get(port, "GET", "/health");
    double late = s_now() - t0;
    if (s_status(r) != 0 && late < KVEDGE_HTTP_TIMEOUT_S - 1.0)
        fail_msg("connection %d served after %.2f s, beside %d stalled ones",
                 KVEDGE_HTTP_MAX_CONNECTIONS + 1, late, KVEDGE_HTTP_MAX_CONNECTIONS);
    free(r);
    /* The stalled requests are cut after the timeout. */
    char buf[256];
    ssize_t n = recv(fds[0], buf, sizeof buf, 0);
    double waited = s_now() - t0;
    assert_true(n <= 0);
    if (waited < KVEDGE_HTTP_TIMEOUT_S - 1.0 || waited > KVEDGE_HTTP_TIMEOUT_S + KT_SLACK_MS / 1e3)
        fail_msg("stalled request cut after %.1f s, not about %d s", waited, KVEDGE_HTTP_TIMEOUT_S);
    for (int i = 0; i < KVEDGE_HTTP_MAX_CONNECTIONS; i++)
        close(fds[i]);
    r = s_get(port, "GET", "/health");
    assert_int_equal(s_status(r), 200);
    free(r);
}

static void test_port_taken(void **state)
{
    s_fixture_t *f = *state;
    char addr[64], why[WHY_BYTES] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%u", kvedge_http_port(f->http));
    kvedge_http_t *h = (kvedge_http_t *)&h; /* must be reset to NULL */
    assert_int_equal(kvedge_http_start(addr, f->metrics, NULL, NULL, &h, why, sizeof why),
                     KVEDGE_MONITOR_EIO);
    assert_null(h);
    assert_non_null(strstr(why, addr));
    assert_non_null(strstr(why, strerror(EADDRINUSE)));
    /* The first endpoint still serves. */
    char *r = s_get(kvedge_http_port(f->http), "GET", "/health");
    assert_int_equal(s_status(r), 200);
    free(r);
}

static void test_start_refused(void **state)
{
    (void)state;
    kvedge_metrics_t *m = kvedge_metrics_new();
    char why[WHY_BYTES];
    kvedge_http_t *h = NULL;
    assert_int_equal(kvedge_http_start("off", m, NULL, NULL, &h, why, sizeof why),
                     KVEDGE_MONITOR_EINVAL);
    assert_non_null(strstr(why, "off"));
    assert_int_equal(kvedge_http_start("1.2.3.4", m, NULL, NULL, &h, why, sizeof why),
                     KVEDGE_MONITOR_EINVAL);
    assert_int_equal(kvedge_http_start(NULL, m, NULL, NULL, &h, why, sizeof why),
                     KVEDGE_MONITOR_EINVAL);
    assert_int_equal(kvedge_http_start("127.0.0.1:0", m, NULL, NULL, NULL, why, sizeof why),
                     KVEDGE_MONITOR_EINVAL);
    assert_null(h);
    kvedge_http_stop(NULL);
    kvedge_http_stop(&h);
    assert_int_equal(kvedge_http_port(NULL), 0);
    assert_int_equal(kvedge_http_connections(NULL), 0);

    /* Without a ready function: always ready. IPv6 loopback where the host has it. */
    assert_int_equal(kvedge_http_start("localhost:0", m, NULL, NULL, &h, why, sizeof why), 0);
    char *r = s_get(kvedge_http_port(h), "GET", "/ready");
    assert_int_equal(s_status(r), 200);
    free(r);
    kvedge_http_stop(&h);
    assert_null(h);
    if (kvedge_http_start("[::1]:0", m, NULL, NULL, &h, why, sizeof why) == 0) {
        assert_true(kvedge_http_port(h) != 0);
        kvedge_http_stop(&h);
    } else {
        print_message("no IPv6 loopback here (%s): [::1] start not checked\n", why);
    }
    kvedge_metrics_destroy(&m);
}

/* Open file descriptors of this process. */
static int s_fd_count(void)
{
    int n = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) != -1)
            n++;
    return n;
}

/* Stop releases the port and every descriptor: the same port binds again at once, and twenty
 * start/stop cycles leave the descriptor count where it was. */
static void test_restart(void **state)
{
    (void)state;
    kvedge_metrics_t *m = kvedge_metrics_new();
    char why[WHY_BYTES], addr[64];
    kvedge_http_t *h = NULL;
    assert_int_equal(kvedge_http_start("127.0.0.1:0", m, NULL, NULL, &h, why, sizeof why), 0);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", kvedge_http_port(h));
    char *r = s_get(kvedge_http_port(h), "GET", "/health");
    assert_int_equal(s_status(r), 200);
    free(r);
    kvedge_http_stop(&h);
    int fds = s_fd_count();
    for (int i = 0; i < 20; i++) {
        if (kvedge_http_start(addr, m, NULL, NULL, &h, why, sizeof why) != 0)
            fail_msg("restart %d on %s: %s", i, addr, why);
        kvedge_http_stop(&h);
    }
    assert_int_equal(s_fd_count(), fds);
    kvedge_metrics_destroy(&m);
}

static void test_check_addr(void **state)
{
    (void)state;
    char why[WHY_BYTES];
    const char *good[] = {"127.0.0.1:9741", "0.0.0.0:0",  "[::1]:9741",    "localhost:80", "off",
                          "[::]:65535",     "10.1.2.3:1", "[fe80::1]:8080"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        why[0] = '\0';
        if (kvedge_http_check_addr(good[i], why, sizeof why) != 0)
            fail_msg("%s refused: %s", good[i], why);
    }
    const char *bad[] = {"1.2.3.4",
                         "host:99999",
                         "",
                         "[::1",
                         "[::1]",
                         "[::1]9741",
                         "::1:9741",
                         "127.0.0.1:",
                         ":80",
                         "127.0.0.1:-1",
                         "127.0.0.1:+80",
                         "127.0.0.1:80x",
                         "127.0.0.1:65536",
                         "127.0.0.1:000080",
                         "1.2.3:80",
                         "256.1.1.1:80",
                         "example.com:80",
                         "localhost",
                         "[1.2.3.4]:80",
                         "OFF",
                         " 127.0.0.1:80",
                         "[::1]:80:80",
                         NULL};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        if (kvedge_http_check_addr(bad[i], why, sizeof why) != -1)
            fail_msg("\"%s\" accepted", bad[i] ? bad[i] : "(null)");
        if (why[0] == '\0')
            fail_msg("\"%s\" refused without a reason", bad[i] ? bad[i] : "(null)");
    }
    /* Too long for KVEDGE_HTTP_ADDR_BYTES. */
    char longa[KVEDGE_HTTP_ADDR_BYTES + 8];
    memset(longa, '1', sizeof longa - 1);
    longa[sizeof longa - 1] = '\0';
    assert_int_equal(kvedge_http_check_addr(longa, why, sizeof why), -1);
    assert_int_equal(kvedge_http_check_addr("bad", NULL, 0), -1); /* NULL why is fine */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_codes),
        cmocka_unit_test_setup_teardown(test_metrics, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_health_and_ready, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_errors, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_keep_alive, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_limits, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_port_taken, s_setup, s_teardown),
        cmocka_unit_test(test_start_refused),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_check_addr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
