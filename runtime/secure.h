/* The secured ROUTER every kvedge daemon that serves the wire protocol binds: CURVE with a ZAP
 * allowlist started before the bind, plaintext only on loopback when asked, and the socket
 * options of docs/protocol.md (heartbeats, handshake limit, message size). The ZAP handler
 * (RFC 27) is kvedge's own, one per process: it re-reads each allowlist directory when it
 * changes, and counts and logs every handshake it refuses. */
#ifndef KVEDGE_ACCESS_SECURE_H
#define KVEDGE_ACCESS_SECURE_H

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Refusals logged per peer address in any window of this length; more are counted. */
#define KVEDGE_SECURE_DENIAL_LOG_MS 10000
/* Refusal lines per allowlist in one such window, all peer addresses together (the same
 * bound holds for lines on clients let in). */
#define KVEDGE_SECURE_DENIAL_LOG_TOTAL 20
/* A client let in is logged once per client key in any window of this length. */
#define KVEDGE_SECURE_ACCEPT_LOG_MS 600000

/* One allowlist in the process's ZAP handler. */
typedef struct kvedge_secure_zap_t kvedge_secure_zap_t;

/* What kvedge_secure_router made; destroy with kvedge_secure_router_close. */
typedef struct {
    zsock_t *router;
    kvedge_secure_zap_t *zap; /* its registration in the ZAP handler (plaintext too) */
    zcert_t *cert;            /* the daemon's certificate; NULL when plaintext */
    char endpoint[256];
    char public_key[41]; /* Z85; empty when plaintext */
} kvedge_secure_router_t;

/* Binds a ROUTER on bind: plaintext when insecure (refused unless bind is loopback or ipc;
 * under a kvedge_secure_zap_open_plaintext registration, so libzmq drops pre-ZMTP-3.0 peers
 * and their garbage at the greeting), else CURVE with cert_path (the daemon's secret certificate)
 * and clients_dir (public certificates let in). why receives a reason on failure; nothing is left
 * open then. Errors: KVEDGE_EINVAL, KVEDGE_EDENIED, KVEDGE_EIO. */
int kvedge_secure_router_open(kvedge_secure_router_t *out, const char *bind, bool insecure,
                              const char *cert_path, const char *clients_dir, char *why,
                              size_t why_len);

/* Closes the socket, then its allowlist. Idempotent. */
void kvedge_secure_router_close(kvedge_secure_router_t *r);

/* Handshakes the ROUTER's ZAP handler refused since it was opened (0 when plaintext): a
 * counter for metrics. Thread-safe. */
uint64_t kvedge_secure_router_denials(const kvedge_secure_router_t *r);

/* Makes a CURVE certificate pair at path (public, mode 0644) and path_secret (mode 0600 from
 * its first byte) unless the secret exists, so a daemon runs with no configuration. role
 * goes into the certificate's metadata. Errors: KVEDGE_EIO, KVEDGE_ENOMEM. */
int kvedge_secure_ensure_cert(const char *path, const char *role);

/* ---------------------------------------------------------------- the ZAP handler */

/* Registers an allowlist with the process's ZAP handler, starting the handler on first use.
 * A CURVE server socket put under it (kvedge_secure_zap_apply) lets in a client only when the
 * client's public certificate is in clients_dir; the directory is re-read when it changes, so
 * a certificate copied in later is accepted without a restart. An accepted client's User-Id
 * is its Z85 key and its certificate's metadata comes with its messages, as with czmq's zauth.
 * Every refusal is counted (kvedge_secure_zap_denials) and logged at info, naming the peer
 * address, the client's key and the fix, at most one line per peer address per
 * KVEDGE_SECURE_DENIAL_LOG_MS (the rest are counted in the next line); a client let in is
 * logged at info once per key per KVEDGE_SECURE_ACCEPT_LOG_MS. Each allowlist has its
 * own ZAP domain, so daemons in one process keep their own lists. Caller owns *out.
 * Errors: KVEDGE_EINVAL, KVEDGE_EIO (clients_dir does not exist), KVEDGE_EDENIED (the ZAP
 * endpoint is taken: czmq's zauth runs in this process), KVEDGE_ENOMEM. */
int kvedge_secure_zap_open(const char *clients_dir, kvedge_secure_zap_t **out);

/* Registers a plaintext "allowlist": a socket under it (NULL mechanism, bound to loopback or
 * ipc only) lets in every NULL-mechanism peer. What it is for is the ZAP domain itself: with
 * one set, libzmq refuses ZMTP 1.0 and 2.0 peers, which cannot do ZAP, instead of reading any
 * bytes whose first is not 0xFF as ZMTP 1.0 frames. Caller owns *out; close with
 * kvedge_secure_zap_close. Errors: KVEDGE_EINVAL, KVEDGE_EDENIED (the ZAP endpoint is taken),
 * KVEDGE_ENOMEM. */
int kvedge_secure_zap_open_plaintext(kvedge_secure_zap_t **out);

/* Names the sockets under z in its log lines (e.g. "store tcp://0.0.0.0:7400"). */
void kvedge_secure_zap_label(kvedge_secure_zap_t *z, const char *label);

/* Puts a server socket under z (sets its ZAP domain); before the socket binds. */
void kvedge_secure_zap_apply(kvedge_secure_zap_t *z, zsock_t *sock);

/* Handshakes refused under z since it was opened. Thread-safe; 0 for NULL. */
uint64_t kvedge_secure_zap_denials(const kvedge_secure_zap_t *z);

/* Unregisters the allowlist (the handler stops with the last one). Close the sockets under it
 * first: a handshake arriving later is refused. NULL-safe, idempotent, nulls *self_p. */
void kvedge_secure_zap_close(kvedge_secure_zap_t **self_p);

#ifdef __cplusplus
}
#endif
#endif
