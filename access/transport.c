/* Transport rules both ends share: which endpoints count as loopback, and tenant
 * namespacing of chunk ids. */
#include "access/transport.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "access/codec/error.h"

#define S_PROBE_STEP_MS 50

void kvedge_tenant_tag(const char *tenant, uint8_t tag[16])
{
    static const char domain[] = "kvedge.tenant.v1";
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 16);
    crypto_generichash_update(&st, (const uint8_t *)domain, sizeof domain - 1);
    crypto_generichash_update(&st, (const uint8_t *)tenant, strlen(tenant));
    crypto_generichash_final(&st, tag, 16);
}

void kvedge_tenant_chunk_id(const uint8_t tag[16], const kvedge_chunk_id_t *client_id,
                            kvedge_chunk_id_t *stored)
{
    static const char domain[] = "kvedge.ns.v1";
    crypto_generichash_state st;
    crypto_generichash_init(&st, tag, 16, KVEDGE_CHUNK_ID_BYTES);
    crypto_generichash_update(&st, (const uint8_t *)domain, sizeof domain - 1);
    crypto_generichash_update(&st, client_id->bytes, KVEDGE_CHUNK_ID_BYTES);
    crypto_generichash_final(&st, stored->bytes, KVEDGE_CHUNK_ID_BYTES);
}

bool kvedge_endpoint_is_loopback(const char *ep)
{
    if (!ep)
        return false;
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0)
        return true;
    if (strncmp(ep, "tcp://", 6) != 0)
        return false;
    const char *host = ep + 6;
    return strncmp(host, "127.", 4) == 0 || strncmp(host, "localhost:", 10) == 0 ||
           strncmp(host, "[::1]:", 6) == 0;
}

/* ipc://PATH: in use when something accepts a connection on it. */
static int s_probe_ipc(const char *ep, char *why, size_t why_len)
{
    const char *path = ep + 6;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof sa.sun_path)
        return KVEDGE_OK; /* libzmq's bind says what is wrong with it */
    memcpy(sa.sun_path, path, len);
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    if (path[0] == '@') /* the abstract namespace, as libzmq spells it */
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return KVEDGE_OK;
    int rc = connect(fd, (const struct sockaddr *)&sa, sl);
    close(fd);
    if (rc == 0) {
        if (why && why_len)
            snprintf(why, why_len, "%s: already in use (another process accepts on it)", ep);
        return KVEDGE_ELOCKED;
    }
    return KVEDGE_OK;
}

static int s_probe_once(const char *ep, char *why, size_t why_len)
{
    if (strncmp(ep, "ipc://", 6) == 0)
        return s_probe_ipc(ep, why, why_len);
    if (strncmp(ep, "tcp://", 6) != 0)
        return KVEDGE_OK;
    const char *h = ep + 6;
    const char *semi = strchr(h, ';'); /* a source address comes first when connecting */
    if (semi)
        h = semi + 1;
    const char *colon = strrchr(h, ':');
    if (!colon || colon == h || strcmp(colon + 1, "*") == 0 || strcmp(colon + 1, "0") == 0)
        return KVEDGE_OK;
    char host[256];
    size_t len = (size_t)(colon - h);
    if (h[0] == '[' && len >= 2 && h[len - 1] == ']') {
        h++;
        len -= 2;
    }
    if (len >= sizeof host)
        return KVEDGE_OK;
    memcpy(host, h, len);
    host[len] = '\0';
    bool any = strcmp(host, "*") == 0;
    /* libzmq resolves names to IPv4 unless the socket has ZMQ_IPV6, which kvedge never sets;
     * an IPv6 literal stays IPv6. */
    struct addrinfo hints = {.ai_family = strchr(host, ':') ? AF_INET6 : AF_INET,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    if (getaddrinfo(any ? NULL : host, colon + 1, &hints, &res) != 0 || !res)
        return KVEDGE_OK; /* an interface name, say: libzmq resolves those itself */
    int rc = KVEDGE_OK;
    struct addrinfo *ai = res;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        int e = errno;
        rc = e == EADDRINUSE ? KVEDGE_ELOCKED : KVEDGE_EIO;
        if (why && why_len)
            snprintf(why, why_len, "%s: cannot bind: %s", ep, strerror(e));
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return rc;
}

int kvedge_endpoint_probe(const char *ep, char *why, size_t why_len)
{
    if (!ep)
        return KVEDGE_OK;
    /* libzmq closes a socket's listener on its I/O thread after zmq_close returns: an endpoint
     * a daemon of this process (or one that just exited) let go of is free a moment later. */
    int rc = s_probe_once(ep, why, why_len);
    for (int waited = 0; rc == KVEDGE_ELOCKED && waited < KVEDGE_PROBE_GRACE_MS;
         waited += S_PROBE_STEP_MS) {
        struct timespec ts = {0, S_PROBE_STEP_MS * 1000000L};
        nanosleep(&ts, NULL);
        rc = s_probe_once(ep, why, why_len);
    }
    return rc;
}
