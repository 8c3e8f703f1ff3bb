/* The daemons' HTTP endpoint (see http.h): the address is parsed and bound here, so a bind
 * failure reports the system's reason; libmicrohttpd serves the bound socket from one
 * internal polling thread. */
#include "monitor/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define S_BACKLOG   64   /* pending connections the kernel queues for us */
#define S_WHY_BYTES 256  /* a readiness reason */
#define S_DRAIN_MS  1000 /* how long stop waits for open connections to finish */

struct kvedge_http_t {
    struct MHD_Daemon *mhd;
    kvedge_metrics_t *metrics; /* the caller's */
    kvedge_http_ready_fn ready;
    void *ready_arg;
    uint16_t port;
    char url[KVEDGE_HTTP_ADDR_BYTES + 16]; /* "http://HOST:PORT", the port resolved */
};

/* A parsed bind address. */
typedef struct {
    struct sockaddr_storage sa;
    socklen_t len;
} s_addr_t;

static void s_why(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void s_why(char *why, size_t why_len, const char *fmt, ...)
{
    if (!why || why_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

/* Parses "HOST:PORT" (IPv4 literal or localhost) or "[IPV6]:PORT" into *out (may be NULL).
 * "off" is not an address here. Returns 0, or -1 with why. */
static int s_parse(const char *addr, s_addr_t *out, char *why, size_t why_len)
{
    if (!addr || !*addr) {
        s_why(why, why_len, "empty address: expected HOST:PORT, [IPV6]:PORT or off");
        return -1;
    }
    size_t len = strlen(addr);
    if (len >= KVEDGE_HTTP_ADDR_BYTES) {
        s_why(why, why_len, "address is %zu bytes, at most %d", len, KVEDGE_HTTP_ADDR_BYTES - 1);
        return -1;
    }
    char host[KVEDGE_HTTP_ADDR_BYTES];
    const char *port_s;
    bool v6 = addr[0] == '[';
    if (v6) {
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':') {
            s_why(why, why_len, "address \"%s\": expected [IPV6]:PORT", addr);
            return -1;
        }
        size_t hl = (size_t)(close - addr - 1);
        memcpy(host, addr + 1, hl);
        host[hl] = '\0';
        port_s = close + 2;
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon) {
            s_why(why, why_len, "address \"%s\" has no port: expected HOST:PORT", addr);
            return -1;
        }
        size_t hl = (size_t)(colon - addr);
        memcpy(host, addr, hl);
        host[hl] = '\0';
        port_s = colon + 1;
    }
    unsigned long port = 0;
    size_t digits = strspn(port_s, "0123456789");
    if (digits == 0 || port_s[digits] != '\0' || digits > 5 ||
        (port = strtoul(port_s, NULL, 10)) > 65535) {
        s_why(why, why_len, "address \"%s\": port \"%s\" is not 0 … 65535", addr, port_s);
        return -1;
    }
    s_addr_t a;
    memset(&a, 0, sizeof a);
    if (v6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&a.sa;
        if (inet_pton(AF_INET6, host, &s6->sin6_addr) != 1) {
            s_why(why, why_len, "address \"%s\": \"%s\" is not an IPv6 address", addr, host);
            return -1;
        }
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        a.len = sizeof *s6;
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&a.sa;
        if (strcmp(host, "localhost") == 0) {
            s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        } else if (inet_pton(AF_INET, host, &s4->sin_addr) != 1) {
            s_why(why, why_len,
                  "address \"%s\": \"%s\" is not an IPv4 address or localhost (IPv6 goes in "
                  "brackets)",
                  addr, host);
            return -1;
        }
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        a.len = sizeof *s4;
    }
    if (out)
        *out = a;
    return 0;
}

int kvedge_http_check_addr(const char *addr, char *why, size_t why_len)
{
    if (addr && strcmp(addr, KVEDGE_HTTP_OFF) == 0)
        return 0;
    return s_parse(addr, NULL, why, why_len);
}

/* ---- requests ---- */

static enum MHD_Result s_respond(struct MHD_Connection *c, unsigned status, const char *body,
                                 size_t len, enum MHD_ResponseMemoryMode mode,
                                 const char *content_type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free((void *)body);
        return MHD_NO; /* MHD closes the connection */
    }
    enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (ok == MHD_YES && status == MHD_HTTP_METHOD_NOT_ALLOWED)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    if (ok == MHD_YES)
        ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result s_text(struct MHD_Connection *c, unsigned status, const char *body)
{
    return s_respond(c, status, body, strlen(body), MHD_RESPMEM_PERSISTENT,
                     "text/plain; charset=utf-8");
}

static enum MHD_Result s_ready(kvedge_http_t *h, struct MHD_Connection *c)
{
    char why[S_WHY_BYTES] = "";
    if (!h->ready || h->ready(h->ready_arg, why, sizeof why))
        return s_text(c, MHD_HTTP_OK, "ready\n");
    why[sizeof why - 1] = '\0';
    for (char *p = why; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    char body[S_WHY_BYTES + 16];
    int n = snprintf(body, sizeof body, "not ready: %s\n", why[0] ? why : "(no reason given)");
    return s_respond(c, MHD_HTTP_SERVICE_UNAVAILABLE, body, (size_t)n, MHD_RESPMEM_MUST_COPY,
                     "text/plain; charset=utf-8");
}

/* True when the request announces a body: a Content-Length above 0 or any Transfer-Encoding. */
static bool s_has_body(struct MHD_Connection *c)
{
    const char *te =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return te || (cl && strspn(cl, "0 \t") != strlen(cl));
}

/* Refusals are queued on the handler's first call, before any body is read: libmicrohttpd
 * then closes the connection. Good requests are answered on the second call, once the whole
 * request is in, so the connection may be kept alive for the next scrape. */
static enum MHD_Result s_handle(void *cls, struct MHD_Connection *c, const char *url,
                                const char *method, const char *version, const char *upload_data,
                                size_t *upload_data_size, void **req_cls)
{
    (void)version;
    (void)upload_data;
    kvedge_http_t *h = cls;
    if (!*req_cls) {
        if (strcmp(url, "/metrics") != 0 && strcmp(url, "/health") != 0 &&
            strcmp(url, "/ready") != 0)
            return s_text(c, MHD_HTTP_NOT_FOUND, "not found\n");
        if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
            return s_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n");
        if (s_has_body(c))
            return s_text(c, MHD_HTTP_CONTENT_TOO_LARGE, "requests carry no body\n");
        *req_cls = h; /* accepted: answer once the request is complete */
        return MHD_YES;
    }
    if (*upload_data_size != 0)
        return MHD_NO; /* a body no header announced: drop the connection */
    if (strcmp(url, "/health") == 0)
        return s_text(c, MHD_HTTP_OK, "ok\n");
    if (strcmp(url, "/ready") == 0)
        return s_ready(h, c);
    size_t len = 0;
    char *body = kvedge_metrics_render(h->metrics, &len);
    if (!body)
        return s_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    return s_respond(c, MHD_HTTP_OK, body, len, MHD_RESPMEM_MUST_FREE,
                     "text/plain; version=0.0.4; charset=utf-8");
}

/* libmicrohttpd's own messages would go to stderr; a daemon logs through its logger only. */
static void s_quiet(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    (void)fmt;
    (void)ap;
}

/* ---- start and stop ---- */

/* A listening socket on a, non-blocking and close-on-exec; -1 with why. */
static int s_listen(const char *addr, const s_addr_t *a, char *why, size_t why_len)
{
    int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        s_why(why, why_len, "http %s: socket: %s", addr, strerror(errno));
        return -1;
    }
    int one = 1;
    /* SO_REUSEADDR lets a restarted daemon bind past TIME_WAIT; on Linux it never lets two
     * listeners share a port. V6ONLY keeps "[::]:P" from also taking IPv4's P. */
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        (a->sa.ss_family == AF_INET6 &&
         setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0)) {
        s_why(why, why_len, "http %s: setsockopt: %s", addr, strerror(errno));
        close(fd);
        return -1;
    }
    if (bind(fd, (const struct sockaddr *)&a->sa, a->len) != 0) {
        s_why(why, why_len, "http %s: cannot bind: %s", addr, strerror(errno));
        close(fd);
        return -1;
    }
    if (listen(fd, S_BACKLOG) != 0) {
        s_why(why, why_len, "http %s: cannot listen: %s", addr, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

int kvedge_http_probe(const char *addr, char *why, size_t why_len)
{
    if (addr && strcmp(addr, KVEDGE_HTTP_OFF) == 0)
        return 0;
    s_addr_t a;
    if (s_parse(addr, &a, why, why_len) != 0)
        return KVEDGE_MONITOR_EINVAL;
    int fd = s_listen(addr, &a, why, why_len);
    if (fd < 0)
        return KVEDGE_MONITOR_EIO;
    close(fd);
    return 0;
}

int kvedge_http_start(const char *addr, kvedge_metrics_t *metrics, kvedge_http_ready_fn ready,
                      void *ready_arg, kvedge_http_t **out, char *why, size_t why_len)
{
    if (out)
        *out = NULL;
    if (!out) {
        s_why(why, why_len, "no place for the endpoint");
        return KVEDGE_MONITOR_EINVAL;
    }
    if (addr && strcmp(addr, KVEDGE_HTTP_OFF) == 0) {
        s_why(why, why_len, "address is \"off\": no endpoint to start");
        return KVEDGE_MONITOR_EINVAL;
    }
    s_addr_t a;
    if (s_parse(addr, &a, why, why_len) != 0)
        return KVEDGE_MONITOR_EINVAL;
    kvedge_http_t *h = calloc(1, sizeof *h);
    if (!h) {
        s_why(why, why_len, "http %s: out of memory", addr);
        return KVEDGE_MONITOR_ENOMEM;
    }
    h->metrics = metrics;
    h->ready = ready;
    h->ready_arg = ready_arg;
    int fd = s_listen(addr, &a, why, why_len);
    if (fd < 0) {
        free(h);
        return KVEDGE_MONITOR_EIO;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    if (getsockname(fd, (struct sockaddr *)&bound, &blen) != 0) {
        s_why(why, why_len, "http %s: getsockname: %s", addr, strerror(errno));
        close(fd);
        free(h);
        return KVEDGE_MONITOR_EIO;
    }
    h->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    /* The URL: the address as given, its port replaced by the one bound. */
    const char *colon = strrchr(addr, ':');
    snprintf(h->url, sizeof h->url, "http://%.*s:%u", colon ? (int)(colon - addr) : 0, addr,
             (unsigned)h->port);
    /* ITC: the polling thread can be woken, which MHD_quiesce_daemon needs in stop. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC;
    if (a.sa.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->mhd = MHD_start_daemon(flags, 0, NULL, NULL, s_handle, h, MHD_OPTION_LISTEN_SOCKET,
                              (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)KVEDGE_HTTP_MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT,
                              (unsigned)KVEDGE_HTTP_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                              (size_t)KVEDGE_HTTP_MEMORY_BYTES, MHD_OPTION_EXTERNAL_LOGGER, s_quiet,
                              NULL, MHD_OPTION_END);
    if (!h->mhd) {
        /* libmicrohttpd closes fd on the failures it can have once it holds the socket;
         * closing it again could close a number another thread was just given. */
        s_why(why, why_len, "http %s: libmicrohttpd could not start its thread", addr);
        free(h);
        return KVEDGE_MONITOR_EIO;
    }
    *out = h;
    return 0;
}

uint16_t kvedge_http_port(const kvedge_http_t *h)
{
    return h ? h->port : 0;
}

const char *kvedge_http_url(const kvedge_http_t *h)
{
    return h ? h->url : NULL;
}

unsigned kvedge_http_connections(const kvedge_http_t *h)
{
    if (!h)
        return 0;
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return info ? info->num_connections : 0;
}

void kvedge_http_stop(kvedge_http_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_http_t *h = *self_p;
    /* Stop accepting, give the open connections a moment to finish their replies, then stop
     * (which joins the thread and closes what is left). A quiesced daemon hands the listening
     * socket back to us to close. */
    MHD_socket fd = MHD_quiesce_daemon(h->mhd);
    for (int waited = 0; fd != MHD_INVALID_SOCKET && waited < S_DRAIN_MS; waited += 10) {
        const union MHD_DaemonInfo *info =
            MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!info || info->num_connections == 0)
            break;
        usleep(10 * 1000);
    }
    MHD_stop_daemon(h->mhd);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    free(h);
    *self_p = NULL;
}
