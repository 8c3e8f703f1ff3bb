/* A plain HTTP GET for the tests that read a daemon's /metrics, /health or /ready: over a
 * loopback socket, no library, the failures as cmocka assertions. */
#ifndef KVEDGE_TESTS_HTTP_H
#define KVEDGE_TESTS_HTTP_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* GET url+path (url: http://127.0.0.1:PORT); returns the HTTP status and leaves the body,
 * NUL-terminated, in buf (a response longer than cap - 1 bytes is cut). */
static inline int kt_http_get(const char *url, const char *path, char *buf, size_t cap)
{
    unsigned port = 0;
    assert_int_equal(sscanf(url, "http://127.0.0.1:%u", &port), 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    char req[256];
    int n =
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    assert_int_equal(write(fd, req, (size_t)n), n);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < cap && (r = read(fd, buf + got, cap - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fd);
    int status = 0;
    assert_int_equal(sscanf(buf, "HTTP/1.1 %d", &status), 1);
    char *body = strstr(buf, "\r\n\r\n");
    assert_non_null(body);
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return status;
}

#endif
