/* The secured ROUTER every kvedge daemon that serves the wire protocol binds: CURVE with a ZAP
 * allowlist started before the bind, plaintext only on loopback when asked, and the socket
 * options of docs/protocol.md (heartbeats, handshake limit, message size). */
#ifndef KVEDGE_ACCESS_SECURE_H
#define KVEDGE_ACCESS_SECURE_H

#include <czmq.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What kvedge_secure_router made; destroy with kvedge_secure_router_close. */
typedef struct {
    zsock_t *router;
    zactor_t *auth; /* the ZAP handler; NULL when plaintext */
    zcert_t *cert;  /* the daemon's certificate; NULL when plaintext */
    char endpoint[256];
    char public_key[41]; /* Z85; empty when plaintext */
} kvedge_secure_router_t;

/* Binds a ROUTER on bind: plaintext when insecure (refused unless bind is loopback or ipc),
 * else CURVE with cert_path (the daemon's secret certificate) and clients_dir (public
 * certificates let in). why receives a reason on failure; nothing is left open then.
 * Errors: KVEDGE_EINVAL, KVEDGE_EDENIED, KVEDGE_EIO. */
int kvedge_secure_router_open(kvedge_secure_router_t *out, const char *bind, bool insecure,
                              const char *cert_path, const char *clients_dir, char *why,
                              size_t why_len);

/* Closes the socket, then the ZAP handler. Idempotent. */
void kvedge_secure_router_close(kvedge_secure_router_t *r);

/* Makes a CURVE certificate pair at path (public, mode 0644) and path_secret (mode 0600 from
 * its first byte) unless the secret exists, so a daemon runs with no configuration. role
 * goes into the certificate's metadata. Errors: KVEDGE_EIO, KVEDGE_ENOMEM. */
int kvedge_secure_ensure_cert(const char *path, const char *role);

#ifdef __cplusplus
}
#endif
#endif
