/* The Cache Server assembled: engine, protocol server, historical-cache scheduler and the
 * Storage Master link (heartbeats and the block directory), started and stopped as one. */
#include "store/node/node.h"

#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/kvmsg.h"
#include "runtime/log.h"
#include "runtime/mview.h"
#include "runtime/secure.h"
#include "access/transport.h"
#include "access/codec/basis_dir.h"
#include "access/codec/error.h"
#include "access/codec/why.h"
#include "store/node/dirpub.h"
#include "store/node/hsync.h"
#include "store/node/node_impl.h"
#include "store/node/optimizer.h"
#include "store/node/server.h"

#define S_MASTER_START_WAIT_MS 1500 /* how long start waits for the master's snapshot */

void kvedge_node_settings_default(kvedge_node_settings_t *s)
{
    kvedge_settings_defaults(&kvedge_node_settings_table, s);
}

/* The host of a tcp:// endpoint ("tcp://[src;]HOST:PORT", brackets stripped) into host, and
 * where its port starts (after the ':') into *port; false when ep is not tcp:// or has no
 * port. */
static bool s_tcp_host(const char *ep, char *host, size_t cap, const char **port)
{
    if (!ep || strncmp(ep, "tcp://", 6) != 0)
        return false;
    const char *h = ep + 6;
    const char *semi = strchr(h, ';'); /* a source address comes first */
    if (semi)
        h = semi + 1;
    const char *colon = strrchr(h, ':');
    if (!colon || colon == h)
        return false;
    size_t len = (size_t)(colon - h);
    if (h[0] == '[' && len >= 2 && h[len - 1] == ']') {
        h++;
        len -= 2;
    }
    if (len >= cap)
        return false;
    memcpy(host, h, len);
    host[len] = '\0';
    *port = colon + 1;
    return true;
}

/* The first master of a list "EP[,EP...]": the one whose route names this node's address. */
static const char *s_first_master(const char *list, char *out, size_t cap)
{
    size_t len = strcspn(list, ",");
    snprintf(out, cap, "%.*s", (int)(len < cap ? len : cap - 1), list);
    return out;
}

/* The masters' PUB list: master_pub, else each tcp master's PORT+1. "" when not derivable. */
static const char *s_master_pubs(const kvedge_node_settings_t *s, char *out, size_t cap)
{
    if (s->master_pub[0])
        return s->master_pub;
    if (kvedge_mview_default_pubs(s->master, out, cap) != 0)
        out[0] = '\0';
    return out;
}

/* True when a bound endpoint's host is a wildcard: nobody elsewhere can dial it. */
static bool s_wildcard(const char *ep)
{
    char host[256];
    const char *port;
    return s_tcp_host(ep, host, sizeof host, &port) &&
           (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0 || strcmp(host, "::") == 0);
}

/* The optimizer's options from the settings (engine and analyzer left NULL). */
static int s_optimizer_opts(const kvedge_node_settings_t *s, kvedge_optimizer_opts_t *o, char *why,
                            size_t why_len)
{
    memset(o, 0, sizeof *o);
    o->interval_s = s->optimize_interval_s;
    o->idle_s = s->demote_idle_s;
    o->hot_reads = s->hot_reads;
    o->hot_top = s->hot_top;
    o->pressure = s->demote_on_pressure;
    return kvedge_optimizer_parse(s->demote_to, s->prepare, o, why, why_len);
}

int kvedge_node_settings_check(const kvedge_node_settings_t *s, char *why, size_t why_len)
{
    if (!s || !s->data[0])
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "no data directory");
    if (s->role != KVEDGE_ROLE_CLOUD && s->role != KVEDGE_ROLE_EDGE)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "the role must be cloud or edge");
    char pubs[KVEDGE_NODE_MASTERS_BYTES], first[KVEDGE_NODE_EP_BYTES];
    if (s->master[0] &&
        (!s_master_pubs(s, pubs, sizeof pubs)[0] || !kvedge_master_id_ok(s->node_id)))
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "a master needs its PUB endpoint (master_pub; by default each tcp "
                          "master's PORT+1) and this node's id (node_id: 1-64 of "
                          "[A-Za-z0-9._:@+-])");
    if (s->master[0] && kvedge_mview_count_endpoints(s->master) !=
                            kvedge_mview_count_endpoints(s_master_pubs(s, pubs, sizeof pubs)))
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "master lists %zu masters and master_pub %zu PUB endpoints: give one "
                          "PUB per master, in the same order",
                          kvedge_mview_count_endpoints(s->master),
                          kvedge_mview_count_endpoints(s->master_pub));
    if (s->insecure && !kvedge_endpoint_is_loopback(s->bind))
        return kvedge_why(why, why_len, KVEDGE_EDENIED,
                          "refusing plaintext on %s: insecure is only allowed on loopback "
                          "(tcp://127.0.0.1:PORT) or ipc:// endpoints",
                          s->bind);
    kvedge_optimizer_opts_t oo;
    int rc = s_optimizer_opts(s, &oo, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    char host[256];
    const char *port;
    if (s->master[0] && !s->advertise[0] && s_wildcard(s->bind) &&
        !s_tcp_host(s_first_master(s->master, first, sizeof first), host, sizeof host, &port))
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "%s is a wildcard address the master's other peers cannot dial, and the "
                          "master %s is not tcp:// (no interface to take the address from): pass "
                          "--advertise tcp://HOST:PORT (config key advertise)",
                          s->bind, s->master);
    return KVEDGE_OK;
}

/* The endpoint registered with the master: --advertise, else the bound endpoint unless its
 * host is a wildcard (0.0.0.0, *, [::]): a peer elsewhere would dial itself. Then the
 * address of the interface that reaches the master (a UDP socket connected to it: no packet
 * is sent), with the bound port. Errors: KVEDGE_EINVAL (not derivable: why asks for
 * --advertise). */
static int s_advertised(kvedge_node_t *n, char *out, size_t cap, char *why, size_t why_len)
{
    const kvedge_node_settings_t *s = &n->s;
    const char *bound = kvedge_server_endpoint(n->server);
    if (s->advertise[0] || !s_wildcard(bound)) {
        snprintf(out, cap, "%s", s->advertise[0] ? s->advertise : bound);
        return KVEDGE_OK;
    }
    char wild[256], mhost[256], addr[INET6_ADDRSTRLEN] = "", first[KVEDGE_NODE_EP_BYTES];
    const char *bport, *mport;
    s_tcp_host(bound, wild, sizeof wild, &bport);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    const char *fail = "the master is not a tcp:// endpoint";
    if (s_tcp_host(s_first_master(s->master, first, sizeof first), mhost, sizeof mhost, &mport)) {
        int gai = getaddrinfo(mhost, mport, &hints, &res);
        fail = gai ? gai_strerror(gai) : "no route to the master";
        for (struct addrinfo *ai = gai ? NULL : res; ai && !addr[0]; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
            struct sockaddr_storage me;
            socklen_t len = sizeof me;
            if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
                getsockname(fd, (struct sockaddr *)&me, &len) == 0)
                getnameinfo((struct sockaddr *)&me, len, addr, sizeof addr, NULL, 0,
                            NI_NUMERICHOST);
            if (fd >= 0)
                close(fd);
        }
        if (res)
            freeaddrinfo(res);
    }
    if (!addr[0])
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "bound to %s, a wildcard address the master's other peers cannot dial, "
                          "and the address of the interface that reaches the master %s is not "
                          "known (%s): pass --advertise tcp://HOST:PORT (config key advertise)",
                          bound, s->master, fail);
    bool v6 = strchr(addr, ':') != NULL;
    snprintf(out, cap, "tcp://%s%s%s:%s", v6 ? "[" : "", addr, v6 ? "]" : "", bport);
    kvedge_log_info("advertising %s to the master %s: bound to %s, a wildcard, so the address "
                    "of the interface that reaches the master (--advertise to choose another)",
                    out, s->master, bound);
    return KVEDGE_OK;
}

/* Joins the Storage Master: a view (heartbeats as node_id) and the directory publisher; the
 * node's record names endpoint (s_advertised). */
static int s_join_master(kvedge_node_t *n, const char *endpoint)
{
    const kvedge_node_settings_t *s = &n->s;
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    char pubs[KVEDGE_NODE_MASTERS_BYTES];
    vo.master = s->master;
    vo.pub = s_master_pubs(s, pubs, sizeof pubs);
    vo.server_key = s->master_key[0] ? s->master_key : NULL;
    vo.client_cert = s->master_key[0] ? n->cert_secret : NULL;
    vo.heartbeat_id = s->node_id;
    vo.prefix = "node/";
    vo.start_wait_ms = S_MASTER_START_WAIT_MS;
    int rc = kvedge_mview_start(&vo, &n->view);
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_master_node_t rec;
    memset(&rec, 0, sizeof rec);
    rec.role = s->role;
    snprintf(rec.region, sizeof rec.region, "%s", s->region);
    snprintf(rec.endpoint, sizeof rec.endpoint, "%s", endpoint);
    const char *key = kvedge_server_public_key(n->server);
    snprintf(rec.public_key, sizeof rec.public_key, "%s", key ? key : "");
    rec.capacity_bytes = s->capacity_bytes;
    rec.bandwidth_bytes_per_s = s->declare_bw;
    rec.rtt_us = s->declare_rtt_us;
    /* The master's endpoint and the certificate the view presents go into the registration's
     * log lines and state (a refusal names the file to copy into the master's allowlist). */
    kvedge_dirpub_opts_t po = {.engine = n->engine,
                               .view = n->view,
                               .node_id = s->node_id,
                               .node = &rec,
                               .interval_ms = s->dir_interval_ms,
                               .master = s->master,
                               .cert = s->master_key[0] ? s->cert : NULL,
                               .derives = s->derive};
    rc = kvedge_dirpub_start(&po, &n->dirpub);
    if (rc != KVEDGE_OK) {
        kvedge_mview_destroy(&n->view);
        return rc;
    }
    if (s->role == KVEDGE_ROLE_CLOUD) {
        kvedge_mover_opts_t mo = {.node_id = s->node_id,
                                  .master = s->master,
                                  .master_pub = vo.pub, /* the list, defaults filled in */
                                  .master_key = s->master_key[0] ? s->master_key : NULL,
                                  .cert = s->insecure ? NULL : n->cert_secret,
                                  .replicas = s->replicas,
                                  .grace_ms = (uint64_t)s->mover_grace_s * 1000u,
                                  .bw = s->mover_bw,
                                  .metrics = n->metrics};
        if (kvedge_mover_start(&mo, &n->mover) != KVEDGE_OK)
            kvedge_log_error("mover not started: no re-replication from this node");
        else {
            char r[48] = "2 replicas (1 with one node)", bw[48] = "at full speed";
            if (s->replicas)
                snprintf(r, sizeof r, "%u replicas", s->replicas);
            if (s->mover_bw)
                snprintf(bw, sizeof bw, "at most %llu bytes/s", (unsigned long long)s->mover_bw);
            kvedge_log_info("mover: the chunks of a node down for %u s go back to %s, copied %s",
                            s->mover_grace_s, r, bw);
        }
    }
    return KVEDGE_OK;
}

/* Starts the historical-cache scheduler from the subscriptions file. */
static int s_start_sync(kvedge_node_t *n, char *why, size_t why_len)
{
    /* Up to 380 KiB of subscriptions: too large for a stack; the scheduler keeps a copy. */
    kvedge_hsync_sub_t *subs = calloc(KVEDGE_HSYNC_MAX_SUBS, sizeof *subs);
    if (!subs)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    size_t count = 0;
    int rc =
        kvedge_hsync_load(n->s.subscriptions, subs, KVEDGE_HSYNC_MAX_SUBS, &count, why, why_len);
    if (rc == KVEDGE_OK && count == 0)
        rc = kvedge_why(why, why_len, KVEDGE_EINVAL, "%s has no subscription", n->s.subscriptions);
    if (rc == KVEDGE_OK)
        rc = kvedge_hsync_sched_start(n->engine, n->s.data, subs, count, n->s.sync_interval_s,
                                      &n->sched);
    free(subs);
    if (rc == KVEDGE_OK)
        kvedge_log_info("historical cache: %zu subscriptions, a pass every %u s", count,
                        n->s.sync_interval_s ? n->s.sync_interval_s
                                             : KVEDGE_HSYNC_INTERVAL_S_DEFAULT);
    return rc;
}

/* Every address the node will bind, checked before it opens or creates the store, registers
 * or syncs anything: a second node on a host that takes a default port fails at once and says
 * which setting moves it. */
static int s_probe(const kvedge_node_settings_t *s, char *why, size_t why_len)
{
    char sys[512] = "";
    int rc = kvedge_endpoint_probe(s->bind, sys, sizeof sys);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc,
                          "%s%s: give this node another endpoint with --bind tcp://HOST:PORT "
                          "(config key bind); nothing was started",
                          sys, rc == KVEDGE_ELOCKED ? " (another daemon on this host?)" : "");
    if (s->metrics[0] && kvedge_http_probe(s->metrics, sys, sizeof sys) != 0)
        return kvedge_why(why, why_len, strstr(sys, "in use") ? KVEDGE_ELOCKED : KVEDGE_EIO,
                          "%s%s: give this node another metrics "
                          "endpoint with --metrics HOST:PORT (port 0: any free one, its URL is "
                          "logged), or --metrics off (config key metrics); nothing was started",
                          sys, strstr(sys, "in use") ? " (another daemon on this host?)" : "");
    return KVEDGE_OK;
}

/* Registers the coding bases of the basis setting, before anything is opened: a file that
 * does not load refuses the start with the loader's reason. */
static int s_load_bases(const char *dir, char *why, size_t why_len)
{
    if (!dir[0])
        return KVEDGE_OK;
    size_t loaded = 0;
    char bwhy[512] = "", models[1024];
    int rc = kvedge_basis_load_dir_models(dir, &loaded, models, sizeof models, bwhy, sizeof bwhy);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc,
                          "cannot load the coding bases of %s (config key basis): %s (%s); "
                          "nothing was started",
                          dir, bwhy, kvedge_strerror(rc));
    kvedge_log_info("%zu coding bases loaded (models %s) from %s", loaded,
                    models[0] ? models : "none", dir);
    return KVEDGE_OK;
}

int kvedge_node_start(const kvedge_node_settings_t *s, kvedge_node_t **out, char *why,
                      size_t why_len)
{
    if (!out)
        return KVEDGE_EINVAL;
    int rc = kvedge_node_settings_check(s, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    rc = s_probe(s, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    rc = s_load_bases(s->basis, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_node_t *n = calloc(1, sizeof *n);
    if (!n)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    n->s = *s;
    /* A node without a name goes by its id in the registry (HELLO, MONITOR, its log lines). */
    if (!n->s.name[0] && n->s.node_id[0])
        snprintf(n->s.name, sizeof n->s.name, "%s", n->s.node_id);
    if (!n->s.insecure) {
        if (!n->s.cert[0] && snprintf(n->s.cert, sizeof n->s.cert, "%s/%s", n->s.data,
                                      KVEDGE_NODE_CERT_NAME) >= (int)sizeof n->s.cert) {
            free(n);
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "data directory path too long");
        }
        if (!n->s.clients[0] && snprintf(n->s.clients, sizeof n->s.clients, "%s/%s", n->s.data,
                                         KVEDGE_NODE_CLIENTS_NAME) >= (int)sizeof n->s.clients) {
            free(n);
            return kvedge_why(why, why_len, KVEDGE_EINVAL, "data directory path too long");
        }
    }
    snprintf(n->cert_secret, sizeof n->cert_secret, "%s_secret", n->s.cert);

    kvedge_engine_opts_t eo;
    kvedge_engine_opts_default(&eo);
    eo.capacity_bytes = n->s.capacity_bytes;
    eo.sync = n->s.sync;
    eo.cache_bytes = n->s.cache_bytes;
    kvedge_optimizer_opts_t oo;
    (void)s_optimizer_opts(&n->s, &oo, NULL, 0); /* checked above */
    if (n->s.optimize && n->s.demote_on_pressure)
        eo.pressure_demote = oo.demote_to;
    char ewhy[512] = "";
    rc = kvedge_engine_open(n->s.data, &eo, &n->engine, ewhy, sizeof ewhy);
    if (rc != KVEDGE_OK) {
        kvedge_why(why, why_len, rc, "cannot open store %s: %s (%s)", n->s.data, ewhy,
                   kvedge_strerror(rc));
        free(n);
        return rc;
    }
    if (!n->s.insecure) {
        mkdir(n->s.clients, 0700); /* an empty allowlist lets nobody in */
        rc = kvedge_secure_ensure_cert(n->s.cert, "kvedge node");
        if (rc != KVEDGE_OK) {
            kvedge_why(why, why_len, KVEDGE_EIO, "cannot create the node certificate %s",
                       n->s.cert);
            kvedge_node_destroy(&n);
            return KVEDGE_EIO;
        }
    }
    rc = kvedge_node_monitor_open(n, why, why_len);
    if (rc != KVEDGE_OK) {
        kvedge_node_destroy(&n);
        return rc;
    }
    kvedge_server_opts_t so = {n->s.role,
                               n->s.name[0] ? n->s.name : NULL,
                               n->s.bind,
                               n->s.insecure,
                               n->s.insecure ? NULL : n->cert_secret,
                               n->s.insecure ? NULL : n->s.clients,
                               (int)n->s.workers,
                               0,
                               n->engine,
                               n->analyzer,
                               kvedge_node_monitor_doc,
                               n,
                               !n->s.derive,
                               n->s.keep_derived,
                               !n->s.pack};
    rc = kvedge_server_start(&so, &n->server, why, why_len);
    if (rc != KVEDGE_OK) {
        kvedge_node_destroy(&n);
        return rc;
    }
    if (!n->s.insecure)
        kvedge_log_info("node public key %s (certificate %s); clients allowed: the "
                        "certificates in %s",
                        kvedge_server_public_key(n->server), n->s.cert, n->s.clients);
    if (n->s.optimize) {
        oo.engine = n->engine;
        oo.analyzer = n->analyzer;
        rc = kvedge_optimizer_start(&oo, &n->optimizer, why, why_len);
        if (rc != KVEDGE_OK) {
            kvedge_node_destroy(&n);
            return rc;
        }
        char prep[KVEDGE_PREC_MAX_ACCEPT * KVEDGE_PREC_NAME_BYTES] = "";
        for (size_t i = 0; i < oo.n_prepare; i++)
            snprintf(prep + strlen(prep), sizeof prep - strlen(prep), "%s%s", i ? "," : "",
                     kvedge_prec_name(oo.prepare[i]));
        char when[96];
        if (oo.idle_s)
            snprintf(when, sizeof when, "after %u s idle%s", oo.idle_s,
                     oo.pressure ? " and before evicting" : "");
        else
            snprintf(when, sizeof when, "%s", oo.pressure ? "before evicting" : "never");
        kvedge_log_info("storage optimizer: a pass every %u s; demote to %s %s; prepare %s for "
                        "prefixes read %u times an interval (top %u)%s",
                        oo.interval_s ? oo.interval_s : KVEDGE_OPTIMIZER_INTERVAL_S_DEFAULT,
                        kvedge_prec_name(oo.demote_to), when, oo.n_prepare ? prep : "nothing",
                        oo.hot_reads, oo.hot_top,
                        n->analyzer ? "" : " (monitor is off: no hot prefixes known)");
    }
    if (n->s.subscriptions[0]) {
        char swhy[512] = "";
        if (s_start_sync(n, swhy, sizeof swhy) != KVEDGE_OK)
            kvedge_log_error("historical cache disabled: %s", swhy);
    }
    if (n->s.master[0]) {
        char ep[KVEDGE_NODE_EP_BYTES];
        rc = s_advertised(n, ep, sizeof ep, why, why_len);
        if (rc != KVEDGE_OK) {
            kvedge_node_destroy(&n);
            return rc;
        }
        rc = s_join_master(n, ep);
        if (rc != KVEDGE_OK)
            kvedge_log_error("not registered with the master %s: %s (serving anyway)", n->s.master,
                             kvedge_strerror(rc));
    }
    rc = kvedge_node_monitor_serve(n, why, why_len);
    if (rc != KVEDGE_OK) {
        kvedge_node_destroy(&n);
        return rc;
    }
    *out = n;
    return KVEDGE_OK;
}

void kvedge_node_destroy(kvedge_node_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_node_t *n = *self_p;
    /* The endpoints first: no request (MONITOR reads every part, a worker the optimizer's
     * analyzer) is answered by a node half taken apart. */
    kvedge_http_stop(&n->http); /* its readiness reads the parts stopped below */
    kvedge_server_destroy(&n->server);
    kvedge_mover_destroy(&n->mover);
    kvedge_dirpub_destroy(&n->dirpub);
    kvedge_mview_destroy(&n->view);
    kvedge_hsync_sched_destroy(&n->sched);
    kvedge_optimizer_destroy(&n->optimizer);
    kvedge_node_monitor_close(n);
    kvedge_engine_destroy(&n->engine);
    free(n);
    *self_p = NULL;
}

const char *kvedge_node_endpoint(kvedge_node_t *n)
{
    return n && n->server ? kvedge_server_endpoint(n->server) : NULL;
}

const char *kvedge_node_public_key(kvedge_node_t *n)
{
    return n && n->server ? kvedge_server_public_key(n->server) : NULL;
}

int kvedge_node_publish(kvedge_node_t *n, uint32_t *changed)
{
    if (!n || !n->dirpub)
        return KVEDGE_EINVAL;
    return kvedge_dirpub_sync(n->dirpub, changed);
}

const char *kvedge_node_metrics_url(kvedge_node_t *n)
{
    return n && n->http ? kvedge_http_url(n->http) : NULL;
}

int kvedge_node_mover_pass(kvedge_node_t *n)
{
    if (!n || !n->mover)
        return KVEDGE_EINVAL;
    return kvedge_mover_pass(n->mover);
}

void kvedge_node_mover_stats(kvedge_node_t *n, kvedge_mover_stats_t *out)
{
    kvedge_mover_stats(n ? n->mover : NULL, out);
}

int kvedge_node_optimize(kvedge_node_t *n)
{
    if (!n || !n->optimizer)
        return KVEDGE_EINVAL;
    return kvedge_optimizer_pass(n->optimizer, NULL);
}

kvedge_engine_t *kvedge_node_engine(kvedge_node_t *n)
{
    return n ? n->engine : NULL;
}
