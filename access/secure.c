/* One place for the CURVE + ZAP + socket-option setup of the daemons' ROUTER sockets. */
#include "access/secure.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "access/frame.h"
#include "access/transport.h"
#include "store/error.h"

int kvedge_secure_router_open(kvedge_secure_router_t *out, const char *bind, bool insecure,
                              const char *cert_path, const char *clients_dir, char *why,
                              size_t why_len)
{
    char msg[512] = "";
    int rc = KVEDGE_OK;
    memset(out, 0, sizeof *out);
    if (!bind) {
        rc = KVEDGE_EINVAL;
        snprintf(msg, sizeof msg, "a bind endpoint is required");
    } else if (insecure && !kvedge_endpoint_is_loopback(bind)) {
        rc = KVEDGE_EDENIED;
        snprintf(msg, sizeof msg,
                 "refusing plaintext on %s: plaintext is only allowed on loopback or ipc "
                 "endpoints; drop --insecure and use CURVE",
                 bind);
    } else if (!insecure && !zsys_has_curve()) {
        rc = KVEDGE_EDENIED;
        snprintf(msg, sizeof msg, "this libzmq has no CURVE support: refusing to serve %s", bind);
    } else if (!insecure && (!cert_path || !clients_dir)) {
        rc = KVEDGE_EINVAL;
        snprintf(msg, sizeof msg, "CURVE needs the daemon's certificate and a clients directory");
    }
    if (rc == KVEDGE_OK && !insecure) {
        out->cert = zcert_load(cert_path);
        if (!out->cert) {
            rc = KVEDGE_EIO;
            snprintf(msg, sizeof msg, "cannot load the certificate %s", cert_path);
        } else if (!zsys_file_exists(clients_dir)) {
            rc = KVEDGE_EIO;
            snprintf(msg, sizeof msg, "clients directory %s does not exist", clients_dir);
        } else {
            /* The ZAP handler runs before the socket binds: no connection is ever accepted
             * without it. */
            out->auth = zactor_new(zauth, NULL);
            if (!out->auth || zstr_sendx(out->auth, "CURVE", clients_dir, NULL) != 0 ||
                zsock_wait(out->auth) != 0) {
                rc = KVEDGE_EDENIED;
                snprintf(msg, sizeof msg, "the ZAP handler did not start: refusing to serve");
            }
        }
    }
    if (rc == KVEDGE_OK) {
        out->router = zsock_new(ZMQ_ROUTER);
        zsock_set_router_mandatory(out->router, 1);
        zsock_set_sndtimeo(out->router, 0);
        zsock_set_maxmsgsize(out->router, (int64_t)KVEDGE_WIRE_MAX_FRAME_BYTES);
        zsock_set_heartbeat_ivl(out->router, KVEDGE_HEARTBEAT_IVL_MS);
        zsock_set_heartbeat_timeout(out->router, KVEDGE_HEARTBEAT_TIMEOUT_MS);
        zsock_set_handshake_ivl(out->router, KVEDGE_HANDSHAKE_MS);
        zsock_set_linger(out->router, 0);
        if (out->cert) {
            zcert_apply(out->cert, out->router);
            zsock_set_curve_server(out->router, 1);
            zsock_set_zap_domain(out->router, KVEDGE_ZAP_DOMAIN);
        }
        if (zsock_bind(out->router, "%s", bind) < 0) {
            rc = KVEDGE_EIO;
            snprintf(msg, sizeof msg, "cannot bind %s: %s", bind, zmq_strerror(zmq_errno()));
        } else {
            const char *ep = zsock_endpoint(out->router);
            snprintf(out->endpoint, sizeof out->endpoint, "%s", ep ? ep : bind);
            if (out->cert)
                snprintf(out->public_key, sizeof out->public_key, "%s",
                         zcert_public_txt(out->cert));
        }
    }
    if (rc != KVEDGE_OK) {
        kvedge_secure_router_close(out);
        if (why && why_len)
            snprintf(why, why_len, "%s", msg);
    }
    return rc;
}

void kvedge_secure_router_close(kvedge_secure_router_t *r)
{
    zsock_destroy(&r->router);
    zactor_destroy(&r->auth);
    zcert_destroy(&r->cert);
}

int kvedge_secure_ensure_cert(const char *path, const char *role)
{
    char secret[4200];
    if (snprintf(secret, sizeof secret, "%s_secret", path) >= (int)sizeof secret)
        return KVEDGE_EINVAL;
    if (zsys_file_exists(secret))
        return KVEDGE_OK;
    zcert_t *cert = zcert_new();
    if (!cert)
        return KVEDGE_ENOMEM;
    zcert_set_meta(cert, "role", "%s", role);
    mode_t old = umask(077); /* the secret file is private from its first byte */
    int rc = zcert_save(cert, path);
    umask(old);
    zcert_destroy(&cert);
    if (rc != 0)
        return KVEDGE_EIO;
    chmod(secret, 0600);
    chmod(path, 0644);
    return KVEDGE_OK;
}
