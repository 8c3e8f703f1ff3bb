/* The edge proxy daemon: the actor that owns the client ROUTER and answers HELLO, PING, FETCH,
 * CREDIT and CANCEL, and the proxy's lifecycle and counters.
 *
 * One actor thread owns the ROUTER and every FETCH in progress (fetch.c); the upstream
 * libkvedge clients deliver blocks on their own I/O threads into an event queue that wakes the
 * actor (an eventfd), so all request state lives on one thread. A prober thread (sources.c)
 * connects sources, pings the ones that are down (re-admission), follows the master's node list
 * and publishes measured links. */
#include "proxy/proxy.h"

#include <czmq.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "runtime/log.h"
#include "access/transport.h"
#include "monitor/http.h"
#include "proxy/proxy_impl.h"
#include "access/codec/clock.h"
#include "access/codec/why.h"
#include "access/codec/error.h"

#define S_CREDIT_DEFAULT 64
#define S_NEG_CAPACITY   65536
#define S_TICK_MS        50

struct kvedge_proxy_t {
    zactor_t *actor;
    kvedge_proxy_impl_t *p;
    char endpoint[256];
    char public_key[41];
};

/* ---------------------------------------------------------------- replies */

zframe_t *kvedge_proxy_impl_header(uint8_t op, uint16_t flags, uint64_t id, int32_t status,
                                   uint32_t count)
{
    kvedge_wire_header_t h = {KVEDGE_WIRE_VERSION, op, flags, id, status, count, 0, 0};
    uint8_t buf[KVEDGE_WIRE_HEADER_BYTES];
    kvedge_wire_header_pack(&h, buf);
    return zframe_new(buf, sizeof buf);
}

void kvedge_proxy_impl_send(kvedge_proxy_impl_t *p, zframe_t *route, zmsg_t **m)
{
    zframe_t *r = zframe_dup(route);
    zmsg_prepend(*m, &r);
    if (zmsg_send(m, p->sec.router) != 0)
        zmsg_destroy(m); /* the client is gone or not reading: its deadline ends it */
}

void kvedge_proxy_impl_reply_error(kvedge_proxy_impl_t *p, zframe_t *route, uint8_t op, uint64_t id,
                                   int32_t status)
{
    zmsg_t *m = zmsg_new();
    bool stream = op == KVEDGE_OP_FETCH || op == KVEDGE_OP_GET_LAYER;
    zframe_t *h = kvedge_proxy_impl_header(
        op, KVEDGE_WIRE_FLAG_REPLY | (stream ? KVEDGE_WIRE_FLAG_END : 0), id, status, 0);
    zmsg_append(m, &h);
    kvedge_proxy_impl_send(p, route, &m);
}

static void s_hello(kvedge_proxy_impl_t *p, zframe_t *route, const kvedge_wire_header_t *h)
{
    kvedge_wire_node_info_t info = {.role = KVEDGE_ROLE_PROXY,
                                    .max_frame_bytes = KVEDGE_WIRE_MAX_FRAME_BYTES,
                                    .max_items = KVEDGE_WIRE_MAX_ITEMS,
                                    .max_chunks = KVEDGE_WIRE_MAX_CHUNKS,
                                    .max_credit = KVEDGE_WIRE_MAX_CREDIT,
                                    .default_credit = S_CREDIT_DEFAULT};
    uint8_t buf[KVEDGE_WIRE_NODE_INFO_BYTES];
    kvedge_wire_node_info_pack(&info, buf);
    zmsg_t *m = zmsg_new();
    zframe_t *hf =
        kvedge_proxy_impl_header(KVEDGE_OP_HELLO, KVEDGE_WIRE_FLAG_REPLY, h->request_id, 0, 0);
    zmsg_append(m, &hf);
    zmsg_addmem(m, buf, sizeof buf);
    zmsg_addmem(m, p->id, strlen(p->id));
    kvedge_proxy_impl_send(p, route, &m);
}

/* One client message. Bad input gets an error reply and changes nothing. */
static void s_request(kvedge_proxy_impl_t *p, zmsg_t *msg)
{
    zframe_t *route = zmsg_pop(msg);
    zframe_t *hf = zmsg_pop(msg);
    kvedge_wire_header_t h;
    int rc = route && hf ? kvedge_wire_header_parse(zframe_data(hf), zframe_size(hf), &h)
                         : KVEDGE_EPROTO;
    /* The most payload frames a request has: a MAPPED, PREC FETCH with times (spec, chunk
     * ids, times, precision frame, mapped frame). */
    kvedge_wire_frame_t pf[5];
    size_t n = zmsg_size(msg);
    if (rc == KVEDGE_OK && n > sizeof pf / sizeof pf[0])
        rc = KVEDGE_EPROTO;
    if (rc == KVEDGE_OK) {
        size_t i = 0;
        for (zframe_t *f = zmsg_first(msg); f; f = zmsg_next(msg), i++)
            pf[i] = (kvedge_wire_frame_t){zframe_data(f), zframe_size(f)};
        rc = kvedge_wire_validate(&h, pf, n);
    }
    kvedge_wire_fetch_spec_t spec;
    if (rc == KVEDGE_OK && p->opts.no_pack && h.opcode == KVEDGE_OP_FETCH &&
        kvedge_wire_fetch_spec_parse(pf[0].data, pf[0].len, &spec) == KVEDGE_OK &&
        (spec.flags & KVEDGE_WIRE_FETCH_FLAG_PACK))
        rc = KVEDGE_EPROTO; /* as a proxy that does not know the flag answers it */
    if (rc != KVEDGE_OK) {
        kvedge_collab_request(p->collab, hf ? h.opcode : 0, rc);
        if (route)
            kvedge_proxy_impl_reply_error(p, route, rc == KVEDGE_EVERSION || hf ? h.opcode : 0,
                                          h.request_id, rc);
    } else {
        /* FETCH is counted here when accepted and again, by how it ended, in fetch.c. */
        if (h.opcode != KVEDGE_OP_CREDIT && h.opcode != KVEDGE_OP_CANCEL)
            kvedge_collab_request(p->collab, h.opcode,
                                  h.opcode == KVEDGE_OP_HELLO || h.opcode == KVEDGE_OP_PING ||
                                          h.opcode == KVEDGE_OP_FETCH ||
                                          h.opcode == KVEDGE_OP_MONITOR
                                      ? KVEDGE_OK
                                      : KVEDGE_EINVAL);
        switch (h.opcode) {
        case KVEDGE_OP_HELLO:
            s_hello(p, route, &h);
            break;
        case KVEDGE_OP_PING: {
            zmsg_t *m = zmsg_new();
            zframe_t *rh = kvedge_proxy_impl_header(KVEDGE_OP_PING, KVEDGE_WIRE_FLAG_REPLY,
                                                    h.request_id, 0, 0);
            zmsg_append(m, &rh);
            zmsg_addmem(m, pf[0].data, pf[0].len);
            kvedge_proxy_impl_send(p, route, &m);
            break;
        }
        case KVEDGE_OP_FETCH:
            kvedge_proxy_impl_fetch_start(p, route, &h, pf, n);
            break;
        case KVEDGE_OP_MONITOR:
            kvedge_proxy_impl_monitor_reply(p, route, &h, pf);
            break;
        case KVEDGE_OP_CREDIT:
            kvedge_proxy_impl_fetch_credit(p, route, h.request_id, h.credit);
            break;
        case KVEDGE_OP_CANCEL:
            kvedge_proxy_impl_fetch_cancel(p, route, h.request_id);
            break;
        default:
            /* A proxy serves HELLO, PING, FETCH and MONITOR; store operations go to a store
             * node. */
            kvedge_proxy_impl_reply_error(p, route, h.opcode, h.request_id, KVEDGE_EINVAL);
            break;
        }
    }
    zframe_destroy(&route);
    zframe_destroy(&hf);
    zmsg_destroy(&msg);
}

/* ---------------------------------------------------------------- the actor */

static void s_actor(zsock_t *pipe, void *args)
{
    kvedge_proxy_impl_t *p = args;
    zsock_signal(pipe, 0);
    zmq_pollitem_t items[3] = {{zsock_resolve(pipe), 0, ZMQ_POLLIN, 0},
                               {zsock_resolve(p->sec.router), 0, ZMQ_POLLIN, 0},
                               {NULL, p->ev_fd, ZMQ_POLLIN, 0}};
    kvedge_log_info("proxy %s serving on %s (%s)", p->id, p->sec.endpoint,
                    p->sec.cert ? "CURVE" : "plaintext loopback");
    bool running = true;
    while (running) {
        if (zmq_poll(items, 3, S_TICK_MS) < 0 && zmq_errno() != EINTR)
            break;
        if (items[0].revents & ZMQ_POLLIN) {
            zmsg_t *m = zmsg_recv(pipe);
            char *cmd = m ? zmsg_popstr(m) : NULL;
            running = !(cmd && strcmp(cmd, "$TERM") == 0) && m;
            free(cmd);
            zmsg_destroy(&m);
        }
        for (int i = 0; i < 256 && (zsock_events(p->sec.router) & ZMQ_POLLIN); i++) {
            zmsg_t *m = zmsg_recv(p->sec.router);
            if (!m)
                break;
            s_request(p, m);
        }
        if (items[2].revents & ZMQ_POLLIN)
            kvedge_proxy_impl_fetch_events(p);
        kvedge_proxy_impl_fetch_deadlines(p);
    }
    /* Shutting down: every open FETCH ends with ECLOSED. */
    kvedge_proxy_impl_fetch_close_all(p);
}

/* ---------------------------------------------------------------- lifecycle */

void kvedge_proxy_opts_default(kvedge_proxy_opts_t *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->bind = KVEDGE_PROXY_BIND_DEFAULT;
}

static void s_proxy_free(kvedge_proxy_impl_t *p)
{
    if (!p)
        return;
    kvedge_http_stop(&p->http);
    kvedge_proxy_impl_prober_stop(p);
    kvedge_proxy_impl_src_close(p); /* their callbacks may still queue events */
    kvedge_proxy_impl_events_free(p);
    kvedge_mview_destroy(&p->view);
    kvedge_secure_router_close(&p->sec);
    zlistx_destroy(&p->fetches);
    zlistx_destroy(&p->parked); /* emptied by kvedge_proxy_impl_fetch_close_all */
    kvedge_health_destroy(&p->health);
    kvedge_negcache_destroy(&p->neg);
    for (size_t i = 0; i < p->nquality; i++)
        kvedge_quality_destroy(&p->quality[i]);
    if (p->ev_fd >= 0)
        close(p->ev_fd);
    pthread_mutex_destroy(&p->srcs_mu);
    pthread_mutex_destroy(&p->ev_mu);
    pthread_mutex_destroy(&p->stop_mu);
    pthread_cond_destroy(&p->stop_cv);
    pthread_mutex_destroy(&p->stats_mu);
    kvedge_proxy_impl_monitor_close(p); /* nothing records any more */
    free(p->cert_path);
    free(p->master_key);
    free(p);
}

/* Loads the quality profiles named in list (comma-separated paths): at most
 * KVEDGE_PROXY_MAX_QUALITY, one per model. A profile that does not load fails the start. */
static int s_quality_load(kvedge_proxy_impl_t *p, const char *list, char *why, size_t why_len)
{
    if (!list || !list[0])
        return KVEDGE_OK;
    char *copy = strdup(list), *save = NULL;
    if (!copy)
        return KVEDGE_ENOMEM;
    int rc = KVEDGE_OK;
    for (char *path = strtok_r(copy, ",", &save); path && rc == KVEDGE_OK;
         path = strtok_r(NULL, ",", &save)) {
        kvedge_quality_profile_t *q = NULL;
        if (p->nquality == KVEDGE_PROXY_MAX_QUALITY) {
            rc = kvedge_why(why, why_len, KVEDGE_ETOOBIG, "more than %d quality profiles",
                            KVEDGE_PROXY_MAX_QUALITY);
            break;
        }
        rc = kvedge_quality_load(path, &q, why, why_len);
        if (rc != KVEDGE_OK)
            break;
        if (kvedge_proxy_impl_quality(p, kvedge_quality_model(q))) {
            rc = kvedge_why(why, why_len, KVEDGE_EINVAL, "%s: a second quality profile for %s",
                            path, kvedge_quality_model(q));
            kvedge_quality_destroy(&q);
            break;
        }
        p->quality[p->nquality++] = q;
        kvedge_log_info("quality profile of %s: %s", kvedge_quality_model(q), path);
    }
    free(copy);
    return rc;
}

const kvedge_quality_profile_t *kvedge_proxy_impl_quality(const kvedge_proxy_impl_t *p,
                                                          const char *model)
{
    for (size_t i = 0; i < p->nquality; i++)
        if (strcmp(kvedge_quality_model(p->quality[i]), model) == 0)
            return p->quality[i];
    return NULL;
}

/* The tenant source nodes file the proxy under, derived as they derive it (access/transport.h):
 * its certificate's tenant metadata, else the Z85 text of its key. None without a certificate
 * (plaintext sources file it under the loopback tenant, whose models are node-wide). */
static void s_tenant(kvedge_proxy_impl_t *p)
{
    zcert_t *c = p->cert_path ? zcert_load(p->cert_path) : NULL;
    if (!c)
        return;
    const char *t = zcert_meta(c, "tenant");
    kvedge_tenant_tag(t && *t ? t : zcert_public_txt(c), p->tenant_tag);
    p->has_tenant = true;
    zcert_destroy(&c);
}

/* The client endpoint and the metrics address, checked before anything starts: a second
 * proxy on a host fails at once and names the setting that moves it. */
static int s_probe(const kvedge_proxy_opts_t *o, char *why, size_t why_len)
{
    char sys[512] = "";
    int rc = kvedge_endpoint_probe(o->bind ? o->bind : KVEDGE_PROXY_BIND_DEFAULT, sys, sizeof sys);
    bool http = false;
    if (rc == KVEDGE_OK && o->metrics && o->metrics[0] &&
        kvedge_http_probe(o->metrics, sys, sizeof sys) != 0) {
        http = true;
        rc = strstr(sys, "in use") ? KVEDGE_ELOCKED : KVEDGE_EIO;
    }
    if (rc != KVEDGE_OK && why && why_len)
        snprintf(why, why_len, "%s%s: give this proxy another %s; nothing was started", sys,
                 rc == KVEDGE_ELOCKED ? " (another daemon on this host?)" : "",
                 http ? "metrics endpoint with --metrics HOST:PORT (port 0: any free one, its URL "
                        "is logged), or --metrics off (config key metrics)"
                      : "endpoint with --bind tcp://HOST:PORT (config key bind)");
    return rc;
}

void kvedge_proxy_impl_master_hint(kvedge_proxy_impl_t *p, char *out, size_t cap)
{
    kvedge_mview_conn_t conn;
    kvedge_mview_conn(p->view, &conn);
    bool curve = p->opts.master_key && p->opts.master_key[0];
    if (conn.mismatch && !curve)
        snprintf(out, cap,
                 "; the master requires CURVE and this proxy joins it in plaintext: give "
                 "--master-key with the master's public key or certificate (config key "
                 "master_key)");
    else if (conn.mismatch)
        snprintf(out, cap,
                 "; the master runs in plaintext (--insecure) and this proxy joins it with "
                 "CURVE: drop --master-key, or run the master with CURVE");
    else if (!conn.heard && !curve)
        snprintf(out, cap,
                 "; if the master runs with CURVE (its default) it ignores plaintext peers: give "
                 "--master-key with its public key or certificate (config key master_key)");
    else
        out[0] = '\0';
}

int kvedge_proxy_start(const kvedge_proxy_opts_t *opts, kvedge_proxy_t **out, char *why,
                       size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!opts || !out || opts->nsources > KVEDGE_PROXY_MAX_SOURCES ||
        (opts->quality_margin_pct &&
         (opts->quality_margin_pct < 100 || opts->quality_margin_pct > 1000)) ||
        (opts->nsources && !opts->sources) || (opts->id && !kvedge_master_id_ok(opts->id)) ||
        (!opts->master != !opts->master_pub)) {
        if (why && why_len)
            snprintf(why, why_len,
                     "invalid options (id, sources, master without its PUB, or a "
                     "quality margin outside 100 ... 1000 %%)");
        return KVEDGE_EINVAL;
    }
    *out = NULL;
    int prc = s_probe(opts, why, why_len);
    if (prc != KVEDGE_OK)
        return prc;
    zsys_handler_set(NULL);
    kvedge_proxy_impl_t *p = calloc(1, sizeof *p);
    kvedge_proxy_t *self = calloc(1, sizeof *self);
    if (!p || !self) {
        free(p);
        free(self);
        return KVEDGE_ENOMEM;
    }
    p->opts = *opts;
    p->ev_fd = -1;
    if (!p->opts.bind)
        p->opts.bind = KVEDGE_PROXY_BIND_DEFAULT;
    if (!p->opts.buffer_bytes)
        p->opts.buffer_bytes = KVEDGE_PROXY_BUFFER_BYTES_DEFAULT;
    if (!p->opts.stall_min_ms)
        p->opts.stall_min_ms = KVEDGE_PROXY_STALL_MIN_MS;
    if (!p->opts.neg_ttl_ms)
        p->opts.neg_ttl_ms = KVEDGE_PROXY_NEG_TTL_MS;
    if (!p->opts.credit)
        p->opts.credit = S_CREDIT_DEFAULT;
    if (!p->opts.quality_margin_pct)
        p->opts.quality_margin_pct = KVEDGE_PROXY_QUALITY_MARGIN_PCT;
    snprintf(p->id, sizeof p->id, "%s", opts->id ? opts->id : "proxy");
    pthread_mutex_init(&p->srcs_mu, NULL);
    pthread_mutex_init(&p->ev_mu, NULL);
    pthread_mutex_init(&p->stop_mu, NULL);
    pthread_cond_init(&p->stop_cv, NULL);
    pthread_mutex_init(&p->stats_mu, NULL);
    p->cert_path = opts->cert ? strdup(opts->cert) : NULL;
    p->master_key = opts->master_key ? strdup(opts->master_key) : NULL;
    p->health = kvedge_health_new(KVEDGE_PROXY_MAX_SOURCES);
    p->neg = kvedge_negcache_new(S_NEG_CAPACITY, p->opts.neg_ttl_ms);
    p->fetches = zlistx_new();
    p->parked = zlistx_new();
    p->ev_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int rc =
        p->health && p->neg && p->fetches && p->parked && p->ev_fd >= 0 ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK)
        rc = s_quality_load(p, opts->quality, why, why_len);
    if (rc == KVEDGE_OK)
        rc = kvedge_proxy_impl_monitor_open(p, why, why_len);
    if (rc == KVEDGE_OK)
        rc = kvedge_secure_router_open(&p->sec, p->opts.bind, opts->insecure, opts->cert,
                                       opts->clients_dir, why, why_len);
    if (rc == KVEDGE_OK)
        s_tenant(p);
    for (size_t i = 0; rc == KVEDGE_OK && i < opts->nsources; i++)
        kvedge_proxy_impl_src_add(p, &opts->sources[i], false);
    if (rc == KVEDGE_OK && opts->master) {
        kvedge_mview_opts_t vo;
        kvedge_mview_opts_default(&vo);
        vo.master = opts->master;
        vo.pub = opts->master_pub;
        vo.server_key = opts->master_key;
        vo.client_cert = opts->master_key ? opts->cert : NULL;
        vo.snapshot_path = opts->snapshot;
        vo.heartbeat_id = p->id;
        vo.start_wait_ms = 1500;
        rc = kvedge_mview_start(&vo, &p->view);
        if (rc != KVEDGE_OK) {
            if (why && why_len)
                snprintf(why, why_len, "master view: %s", kvedge_strerror(rc));
        } else if (kvedge_mview_state(p->view) != KVEDGE_MVIEW_SYNCED) {
            char hint[512];
            kvedge_proxy_impl_master_hint(p, hint, sizeof hint);
            kvedge_log_warn("master %s unreachable: planning from %s until it answers%s",
                            opts->master,
                            kvedge_mview_count(p->view) ? "the last snapshot" : "flags only", hint);
        }
    }
    if (rc == KVEDGE_OK) {
        snprintf(self->endpoint, sizeof self->endpoint, "%s", p->sec.endpoint);
        snprintf(self->public_key, sizeof self->public_key, "%s", p->sec.public_key);
        self->p = p;
        p->owner = self;
        rc = kvedge_proxy_impl_prober_start(p);
    }
    if (rc == KVEDGE_OK) {
        self->actor = zactor_new(s_actor, p);
        if (!self->actor)
            rc = KVEDGE_ENOMEM;
    }
    if (rc == KVEDGE_OK)
        rc = kvedge_proxy_impl_monitor_serve(p, why, why_len);
    if (rc != KVEDGE_OK) {
        zactor_destroy(&self->actor);
        s_proxy_free(p);
        free(self);
        return rc;
    }
    *out = self;
    return KVEDGE_OK;
}

void kvedge_proxy_destroy(kvedge_proxy_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_proxy_t *self = *self_p;
    zactor_destroy(&self->actor);
    s_proxy_free(self->p);
    free(self);
    *self_p = NULL;
}

const char *kvedge_proxy_endpoint(kvedge_proxy_t *p)
{
    return p ? p->endpoint : NULL;
}

const char *kvedge_proxy_public_key(kvedge_proxy_t *p)
{
    return p && p->public_key[0] ? p->public_key : NULL;
}

void kvedge_proxy_stats(kvedge_proxy_t *p, kvedge_proxy_stats_t *out)
{
    if (!p || !out)
        return;
    pthread_mutex_lock(&p->p->stats_mu);
    *out = p->p->stats;
    pthread_mutex_unlock(&p->p->stats_mu);
}

const char *kvedge_proxy_metrics_url(kvedge_proxy_t *p)
{
    return p && p->p->http ? kvedge_http_url(p->p->http) : NULL;
}

int kvedge_proxy_wait_sources(kvedge_proxy_t *self, size_t want, int timeout_ms)
{
    int64_t until = kvedge_mono_ms() + timeout_ms;
    kvedge_proxy_impl_t *p = self->p;
    do {
        if (kvedge_proxy_impl_src_usable(p) >= want)
            return KVEDGE_OK;
        zclock_sleep(20);
    } while (kvedge_mono_ms() < until);
    return KVEDGE_ETIMEDOUT;
}

int kvedge_proxy_wait_view(kvedge_proxy_t *self, uint64_t min_seq, int timeout_ms)
{
    if (!self || !self->p->view)
        return KVEDGE_EINVAL;
    return kvedge_mview_wait(self->p->view, min_seq, timeout_ms) == 0 ? KVEDGE_OK
                                                                      : KVEDGE_ETIMEDOUT;
}
