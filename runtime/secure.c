/* One place for the CURVE + ZAP + socket-option setup of the daemons' ROUTER sockets, and the
 * process's ZAP handler (RFC 27): an actor on inproc://zeromq.zap.01 that answers libzmq's
 * requests from the allowlists registered with it, one ZAP domain each. */
#include "runtime/secure.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "access/frame.h"
#include "runtime/log.h"
#include "access/transport.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"

#define S_ZAP_ENDPOINT   "inproc://zeromq.zap.01" /* RFC 27: one handler per context */
#define S_META_MAX_BYTES 4096                     /* certificate metadata sent with a client */

/* ---------------------------------------------------------------- the ZAP handler */

struct kvedge_secure_zap_t {
    char domain[32];     /* this allowlist's ZAP domain: KVEDGE_ZAP_DOMAIN.N */
    char *clients_dir;   /* where the public certificates are; NULL: plaintext */
    bool plaintext;      /* lets in NULL-mechanism peers (sockets on loopback) and no others */
    char label[256];     /* what the log lines call the sockets under it */
    zcertstore_t *certs; /* the directory's certificates; under s_zap.mu */
    atomic_uint_least64_t denials;
    kvedge_log_limit_t lines;    /* refusal lines, per peer address */
    kvedge_log_limit_t accepted; /* lines on clients let in, per client key */
};

/* The handler and its registrations. Two locks: the actor may wait on `mu` while it answers,
 * so whoever stops the actor holds only `life`. */
static struct {
    pthread_mutex_t life; /* start and stop of the actor */
    pthread_mutex_t mu;   /* regs, and each registration's certificate store and label */
    zactor_t *actor;
    zlistx_t *regs; /* kvedge_secure_zap_t *, not owned */
    uint32_t next_id;
} s_zap = {.life = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER};

/* Requests for a domain nobody registered (a socket set up elsewhere): refused, and said so
 * at most once a minute. */
static kvedge_log_limit_t s_stray_lines = KVEDGE_LOG_LIMIT_INIT(60000, 1, 1);

/* Caller holds s_zap.mu. */
static kvedge_secure_zap_t *s_find(const char *domain)
{
    if (!s_zap.regs)
        return NULL;
    for (kvedge_secure_zap_t *z = zlistx_first(s_zap.regs); z; z = zlistx_next(s_zap.regs))
        if (strcmp(z->domain, domain) == 0)
            return z;
    return NULL;
}

/* A frame's bytes as a string of printable ASCII ('?' for anything else), at most cap - 1. */
static void s_text(zframe_t *f, char *out, size_t cap)
{
    size_t n = f ? zframe_size(f) : 0;
    if (n >= cap)
        n = cap - 1;
    const uint8_t *d = f ? zframe_data(f) : NULL;
    for (size_t i = 0; i < n; i++)
        out[i] = d[i] >= 0x20 && d[i] < 0x7f ? (char)d[i] : '?';
    out[n] = '\0';
}

/* ZMTP metadata (name-len u8 | name | value-len u32 BE | value) of a certificate's metadata;
 * names libzmq gives a meaning to, or that are not ZMTP property names, are left out. */
static size_t s_meta(zcert_t *cert, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    zlist_t *keys = zcert_meta_keys(cert);
    for (const char *k = keys ? zlist_first(keys) : NULL; k; k = zlist_next(keys)) {
        const char *v = zcert_meta(cert, k);
        size_t kl = strlen(k), vl = v ? strlen(v) : 0;
        bool ok = v && kl > 0 && kl < 256 && strcasecmp(k, "Socket-Type") != 0 &&
                  strcasecmp(k, "Identity") != 0 && strcasecmp(k, "User-Id") != 0 &&
                  len + 5 + kl + vl <= cap;
        for (size_t i = 0; ok && i < kl; i++)
            ok = (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z') ||
                 (k[i] >= '0' && k[i] <= '9') || strchr("-_.+", k[i]);
        if (!ok)
            continue;
        buf[len++] = (uint8_t)kl;
        memcpy(buf + len, k, kl);
        len += kl;
        buf[len++] = (uint8_t)(vl >> 24);
        buf[len++] = (uint8_t)(vl >> 16);
        buf[len++] = (uint8_t)(vl >> 8);
        buf[len++] = (uint8_t)vl;
        memcpy(buf + len, v, vl);
        len += vl;
    }
    zlist_destroy(&keys);
    return len;
}

/* Caller holds s_zap.mu. Counts and (rate-limited) logs one refusal under z. */
static void s_refused(kvedge_secure_zap_t *z, const char *address, const char *mechanism,
                      const char *key)
{
    atomic_fetch_add(&z->denials, 1);
    uint64_t held = 0;
    if (kvedge_log_level() < KVEDGE_LOG_INFO ||
        !kvedge_log_limit_allow(&z->lines, address, kvedge_mono_ms(), &held))
        return;
    char more[96] = "";
    if (held)
        snprintf(more, sizeof more, " (%llu more refusals held back since the last line)",
                 (unsigned long long)held);
    if (z->plaintext)
        kvedge_log_info("refused a %s handshake on %s from %s: only plaintext (NULL) peers are "
                        "let in%s",
                        mechanism, z->label, address, more);
    else if (key[0])
        kvedge_log_info("refused a CURVE handshake on %s from %s: client key %s is not "
                        "allowlisted; to let it in, add its public certificate to %s (read again "
                        "when it changes: no restart)%s",
                        z->label, address, key, z->clients_dir, more);
    else
        kvedge_log_info("refused a %s handshake on %s from %s: only CURVE clients listed in %s "
                        "are let in%s",
                        mechanism, z->label, address, z->clients_dir, more);
}

/* Caller holds s_zap.mu. Says who came in: once per client key and window (a client that
 * reconnects often is not a line each time). */
static void s_accepted(kvedge_secure_zap_t *z, zcert_t *cert, const char *address, const char *key)
{
    uint64_t held = 0;
    if (kvedge_log_level() < KVEDGE_LOG_INFO ||
        !kvedge_log_limit_allow(&z->accepted, key, kvedge_mono_ms(), &held))
        return;
    const char *tenant = zcert_meta(cert, "tenant");
    char more[96] = "";
    if (held)
        snprintf(more, sizeof more, " (%llu more handshakes let in, not logged)",
                 (unsigned long long)held);
    kvedge_log_info("client %s (tenant %s) from %s let in on %s%s", key,
                    tenant && *tenant ? tenant : "its key", address, z->label, more);
}

/* Answers one ZAP request. Every request gets a reply (the REP socket needs one to go on);
 * anything that is not a CURVE client of a registered allowlist is refused. */
static void s_zap_answer(zsock_t *rep)
{
    zmsg_t *req = zmsg_recv(rep);
    if (!req)
        return;
    zframe_t *f[7] = {NULL}; /* version, request id, domain, address, routing id, mechanism,
                              * credentials */
    size_t n = 0;
    for (zframe_t *fr = zmsg_first(req); fr && n < 7; fr = zmsg_next(req))
        f[n++] = fr;
    const char *status = "500", *text = "Internal error";
    char user[41] = "";
    uint8_t meta[S_META_MAX_BYTES];
    size_t meta_len = 0;
    if (n >= 6 && zframe_streq(f[0], "1.0")) {
        char domain[256], address[256], mechanism[32], key[41] = "";
        s_text(f[2], domain, sizeof domain);
        s_text(f[3], address, sizeof address);
        s_text(f[5], mechanism, sizeof mechanism);
        if (!address[0])
            snprintf(address, sizeof address, "a local peer");
        bool curve = strcmp(mechanism, "CURVE") == 0 && n >= 7 && zframe_size(f[6]) == 32;
        if (curve)
            zmq_z85_encode(key, zframe_data(f[6]), 32);
        status = "400";
        text = "No access";
        pthread_mutex_lock(&s_zap.mu);
        kvedge_secure_zap_t *z = s_find(domain);
        zcert_t *cert = z && curve && z->certs ? zcertstore_lookup(z->certs, key) : NULL;
        if (cert) {
            status = "200";
            text = "OK";
            memcpy(user, key, sizeof user);
            meta_len = s_meta(cert, meta, sizeof meta);
            s_accepted(z, cert, address, key);
        } else if (z && z->plaintext && strcmp(mechanism, "NULL") == 0) {
            status = "200"; /* a plaintext socket binds only loopback or ipc */
            text = "OK";
        } else if (z) {
            s_refused(z, address, mechanism, key);
        } else if (kvedge_log_limit_allow(&s_stray_lines, NULL, kvedge_mono_ms(), NULL)) {
            kvedge_log_warn("refused a %s handshake from %s: its socket's ZAP domain '%s' has "
                            "no allowlist in this process",
                            mechanism, address, domain);
        }
        pthread_mutex_unlock(&s_zap.mu);
    }
    zmsg_t *r = zmsg_new();
    if (r) {
        zmsg_addstr(r, "1.0");
        if (n >= 2)
            zmsg_addmem(r, zframe_data(f[1]), zframe_size(f[1]));
        else
            zmsg_addmem(r, NULL, 0);
        zmsg_addstr(r, status);
        zmsg_addstr(r, text);
        zmsg_addstr(r, user);
        zmsg_addmem(r, meta, meta_len);
        if (zmsg_send(&r, rep) != 0)
            zmsg_destroy(&r);
    }
    zmsg_destroy(&req);
}

/* The handler. *arg (an atomic_int) says, before zactor_new returns, whether it started: 0,
 * or KVEDGE_EDENIED when the ZAP endpoint is taken (another handler runs). */
static void s_zap_actor(zsock_t *pipe, void *arg)
{
    atomic_int *started = arg;
    zsock_t *rep = zsock_new(ZMQ_REP);
    zpoller_t *poller = NULL;
    if (rep && zsock_bind(rep, S_ZAP_ENDPOINT) == 0)
        poller = zpoller_new(pipe, rep, NULL);
    atomic_store(started, poller ? KVEDGE_OK : rep ? KVEDGE_EDENIED : KVEDGE_ENOMEM);
    zsock_signal(pipe, 0); /* zactor_new waits for it */
    if (poller)
        zpoller_set_nonstop(poller, true); /* only $TERM stops us, never a signal */
    bool running = true;
    while (running) {
        void *which = poller ? zpoller_wait(poller, -1) : pipe;
        if (which == pipe) {
            char *cmd = zstr_recv(pipe);
            running = cmd && strcmp(cmd, "$TERM") != 0;
            zstr_free(&cmd);
        } else if (which == rep) {
            s_zap_answer(rep);
        }
    }
    zpoller_destroy(&poller);
    if (rep)
        zsock_unbind(rep, S_ZAP_ENDPOINT);
    zsock_destroy(&rep);
}

/* Registers z (its lists and label set up; rc: how that went) with the handler, starting it
 * on first use. On failure z is freed. */
static int s_register(kvedge_secure_zap_t *z, int rc, kvedge_secure_zap_t **out)
{
    pthread_mutex_lock(&s_zap.life);
    if (rc == KVEDGE_OK && !s_zap.actor) {
        atomic_int started = KVEDGE_ENOMEM;
        zactor_t *a = zactor_new(s_zap_actor, &started);
        rc = a ? atomic_load(&started) : KVEDGE_ENOMEM;
        if (rc == KVEDGE_OK)
            s_zap.actor = a;
        else
            zactor_destroy(&a);
    }
    pthread_mutex_lock(&s_zap.mu);
    if (rc == KVEDGE_OK && !s_zap.regs && !(s_zap.regs = zlistx_new()))
        rc = KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK) {
        snprintf(z->domain, sizeof z->domain, "%s.%u", KVEDGE_ZAP_DOMAIN, ++s_zap.next_id);
        if (!zlistx_add_end(s_zap.regs, z))
            rc = KVEDGE_ENOMEM;
    }
    bool idle = !s_zap.regs || zlistx_size(s_zap.regs) == 0;
    pthread_mutex_unlock(&s_zap.mu);
    if (rc != KVEDGE_OK && idle)
        zactor_destroy(&s_zap.actor); /* started for this registration alone */
    pthread_mutex_unlock(&s_zap.life);
    if (rc != KVEDGE_OK) {
        zcertstore_destroy(&z->certs);
        kvedge_log_limit_fini(&z->lines);
        kvedge_log_limit_fini(&z->accepted);
        free(z->clients_dir);
        free(z);
        return rc;
    }
    *out = z;
    return KVEDGE_OK;
}

/* A registration with its log limits set up and the label named; NULL when out of memory. */
static kvedge_secure_zap_t *s_zap_new(const char *label)
{
    kvedge_secure_zap_t *z = calloc(1, sizeof *z);
    if (!z)
        return NULL;
    kvedge_log_limit_init(&z->lines, KVEDGE_SECURE_DENIAL_LOG_MS, 1,
                          KVEDGE_SECURE_DENIAL_LOG_TOTAL);
    kvedge_log_limit_init(&z->accepted, KVEDGE_SECURE_ACCEPT_LOG_MS, 1,
                          KVEDGE_SECURE_DENIAL_LOG_TOTAL);
    snprintf(z->label, sizeof z->label, "%s", label);
    return z;
}

int kvedge_secure_zap_open(const char *clients_dir, kvedge_secure_zap_t **out)
{
    if (!out)
        return KVEDGE_EINVAL;
    *out = NULL;
    if (!clients_dir || !*clients_dir)
        return KVEDGE_EINVAL;
    if (!zsys_file_exists(clients_dir))
        return KVEDGE_EIO;
    kvedge_secure_zap_t *z = s_zap_new("a CURVE socket");
    if (!z)
        return KVEDGE_ENOMEM;
    z->clients_dir = strdup(clients_dir);
    z->certs = zcertstore_new(clients_dir); /* the disk loader: re-read on change */
    return s_register(z, z->clients_dir && z->certs ? KVEDGE_OK : KVEDGE_ENOMEM, out);
}

int kvedge_secure_zap_open_plaintext(kvedge_secure_zap_t **out)
{
    if (!out)
        return KVEDGE_EINVAL;
    *out = NULL;
    kvedge_secure_zap_t *z = s_zap_new("a plaintext socket");
    if (!z)
        return KVEDGE_ENOMEM;
    z->plaintext = true;
    return s_register(z, KVEDGE_OK, out);
}

void kvedge_secure_zap_label(kvedge_secure_zap_t *z, const char *label)
{
    if (!z || !label)
        return;
    pthread_mutex_lock(&s_zap.mu);
    snprintf(z->label, sizeof z->label, "%s", label);
    pthread_mutex_unlock(&s_zap.mu);
}

void kvedge_secure_zap_apply(kvedge_secure_zap_t *z, zsock_t *sock)
{
    if (z && sock)
        zsock_set_zap_domain(sock, z->domain);
}

uint64_t kvedge_secure_zap_denials(const kvedge_secure_zap_t *z)
{
    return z ? atomic_load(&((kvedge_secure_zap_t *)z)->denials) : 0;
}

void kvedge_secure_zap_close(kvedge_secure_zap_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_secure_zap_t *z = *self_p;
    *self_p = NULL;
    pthread_mutex_lock(&s_zap.life);
    pthread_mutex_lock(&s_zap.mu);
    void *h = s_zap.regs ? zlistx_find(s_zap.regs, z) : NULL;
    if (h)
        zlistx_delete(s_zap.regs, h);
    bool idle = !s_zap.regs || zlistx_size(s_zap.regs) == 0;
    if (idle)
        zlistx_destroy(&s_zap.regs);
    pthread_mutex_unlock(&s_zap.mu);
    if (idle)
        zactor_destroy(&s_zap.actor); /* unbinds the endpoint: another handler may take it */
    pthread_mutex_unlock(&s_zap.life);
    zcertstore_destroy(&z->certs);
    kvedge_log_limit_fini(&z->lines);
    kvedge_log_limit_fini(&z->accepted);
    free(z->clients_dir);
    free(z);
}

/* ---------------------------------------------------------------- the ROUTER */

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
    if (rc == KVEDGE_OK && insecure) {
        /* A ZAP domain on the plaintext socket too: libzmq then refuses ZMTP 1.0 and 2.0
         * peers (they cannot do ZAP), and with them the fallback that lets any bytes whose
         * first is not 0xFF in as frames. */
        rc = kvedge_secure_zap_open_plaintext(&out->zap);
        if (rc != KVEDGE_OK) {
            rc = KVEDGE_EDENIED;
            snprintf(msg, sizeof msg, "the ZAP handler did not start: refusing to serve");
        }
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
            rc = kvedge_secure_zap_open(clients_dir, &out->zap);
            if (rc != KVEDGE_OK) {
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
        }
        kvedge_secure_zap_apply(out->zap, out->router);
        if (zsock_bind(out->router, "%s", bind) < 0) {
            rc = KVEDGE_EIO;
            snprintf(msg, sizeof msg, "cannot bind %s: %s", bind, zmq_strerror(zmq_errno()));
        } else {
            const char *ep = zsock_endpoint(out->router);
            snprintf(out->endpoint, sizeof out->endpoint, "%s", ep ? ep : bind);
            kvedge_secure_zap_label(out->zap, out->endpoint);
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
    kvedge_secure_zap_close(&r->zap);
    zcert_destroy(&r->cert);
}

uint64_t kvedge_secure_router_denials(const kvedge_secure_router_t *r)
{
    return r ? kvedge_secure_zap_denials(r->zap) : 0;
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
