/* The edge proxy's sources: the table of store nodes it fetches from (given as flags, or found
 * in the Storage Master's registry), the prober thread that connects them, pings them back to
 * health and publishes the links it measured, what is learned of each link, and the asker
 * thread that runs the LOOKUPs a FETCH asks of nodes its directory says nothing of. */
#include <czmq.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/log.h"
#include "runtime/settings.h"
#include "access/shaper.h"
#include "proxy/proxy_impl.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"

#define S_HELLO_MS    1000           /* connect (HELLO) deadline of one probe */
#define S_PING_MS     500            /* PING deadline of one probe */
#define S_PROBE_BYTES (128u * 1024u) /* payload of the bandwidth probe at connect */
#define S_RATIO_PRIOR 1.0            /* bytes per fp16 byte a source is assumed to send at first */

/* ---------------------------------------------------------------- the table */

int kvedge_proxy_source_parse(const char *spec, kvedge_proxy_source_t *out)
{
    if (!spec || !out)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    char buf[2048];
    if (strlen(spec) >= sizeof buf)
        return KVEDGE_EINVAL;
    strcpy(buf, spec);
    char *save = NULL;
    int field = 0;
    for (char *t = strtok_r(buf, " \t", &save); t; t = strtok_r(NULL, " \t", &save), field++) {
        if (field == 0) {
            if (strcmp(t, "local") == 0)
                out->kind = KVEDGE_PLAN_LOCAL;
            else if (strcmp(t, "peer") == 0)
                out->kind = KVEDGE_PLAN_PEER;
            else if (strcmp(t, "cloud") == 0)
                out->kind = KVEDGE_PLAN_CLOUD;
            else if (strcmp(t, "history") == 0)
                out->kind = KVEDGE_PLAN_HISTORY;
            else
                return KVEDGE_EINVAL;
        } else if (field == 1) {
            if (!kvedge_master_id_ok(t) || strlen(t) >= sizeof out->name)
                return KVEDGE_EINVAL;
            strcpy(out->name, t);
        } else if (field == 2) { /* tcp://HOST:PORT with a port, ipc://PATH, inproc://NAME */
            if (strlen(t) >= sizeof out->endpoint ||
                kvedge_settings_check_endpoint(t, NULL, 0) != 0 ||
                strcmp(strrchr(t, ':'), ":*") == 0)
                return KVEDGE_EINVAL;
            strcpy(out->endpoint, t);
        } else if (strncmp(t, "key=", 4) == 0 && strlen(t + 4) < sizeof out->server_key) {
            strcpy(out->server_key, t + 4);
        } else if (strncmp(t, "link=", 5) == 0 && strlen(t + 5) < sizeof out->link) {
            uint64_t rate;
            uint32_t lat;
            if (kvedge_shaper_parse(t + 5, &rate, &lat) != KVEDGE_OK)
                return KVEDGE_EINVAL;
            strcpy(out->link, t + 5);
        } else if (strncmp(t, "bw=", 3) == 0 || strncmp(t, "rtt=", 4) == 0) {
            char *end;
            const char *v = strchr(t, '=') + 1;
            double d = strtod(v, &end);
            if (end == v || *end || !(d > 0) || !isfinite(d))
                return KVEDGE_EINVAL;
            if (t[0] == 'b')
                out->bw_bytes_per_s = d;
            else
                out->rtt_us = d;
        } else {
            return KVEDGE_EINVAL;
        }
    }
    return field >= 3 ? KVEDGE_OK : KVEDGE_EINVAL;
}

/* Adds a source (prober or start); returns its index or -1 when the table is full. */
int kvedge_proxy_impl_src_add(kvedge_proxy_impl_t *p, const kvedge_proxy_source_t *conf,
                              bool from_master)
{
    pthread_mutex_lock(&p->srcs_mu);
    size_t n = atomic_load(&p->nsrc);
    int idx = -1;
    if (n < KVEDGE_PROXY_MAX_SOURCES) {
        kvedge_proxy_impl_src_t *s = &p->src[n];
        memset(s, 0, sizeof *s);
        s->conf = *conf;
        s->from_master = from_master;
        s->ratio = S_RATIO_PRIOR;
        idx = (int)n;
        atomic_store(&p->nsrc, n + 1);
    }
    pthread_mutex_unlock(&p->srcs_mu);
    if (idx >= 0) {
        kvedge_health_add(p->health, conf->name, (uint64_t)kvedge_mono_ms());
        kvedge_collab_source(p->collab, idx, conf->name, conf->kind);
    }
    return idx;
}

/* The link the planner uses for a source: measured by our own client when it has samples,
 * else the master's link record from this proxy, else declared (node record or flags), else
 * the defaults. */
void kvedge_proxy_impl_src_link(kvedge_proxy_impl_t *p, kvedge_proxy_impl_src_t *s,
                                kvedge_client_t *c, double *bw, double *rtt)
{
    double mbw = 0, mrtt = 0;
    uint64_t samples = 0;
    if (c)
        kvedge_client_link(c, &mbw, &mrtt, &samples);
    *bw = s->conf.bw_bytes_per_s > 0 ? s->conf.bw_bytes_per_s : KVEDGE_PROXY_BW_DEFAULT;
    *rtt = s->conf.rtt_us > 0 ? s->conf.rtt_us : KVEDGE_PROXY_RTT_US_DEFAULT;
    kvedge_master_link_t lr;
    if (p->view && kvedge_mview_link(p->view, p->id, s->conf.name, &lr) == KVEDGE_OK) {
        if (lr.bw_bytes_per_s)
            *bw = (double)lr.bw_bytes_per_s;
        if (lr.rtt_us)
            *rtt = lr.rtt_us;
    }
    /* Our own client's round trips (pings, small replies) are the best rtt we have; its
     * per-stream bandwidth undercounts when streams share the link, so the throughput
     * measured over whole fetches wins over it. */
    if (samples > 0) {
        if (mbw > 0)
            *bw = mbw;
        if (mrtt > 0)
            *rtt = mrtt;
    }
    pthread_mutex_lock(&p->srcs_mu);
    double est = s->bw_est;
    pthread_mutex_unlock(&p->srcs_mu);
    if (est > 0)
        *bw = est;
}

/* Exponentially weighted: the first few samples average, later ones weigh a quarter, so the
 * estimate follows a link that changes without jumping on one odd fetch. */
void kvedge_proxy_impl_src_learn_bw(kvedge_proxy_impl_t *p, int i, double bw)
{
    pthread_mutex_lock(&p->srcs_mu);
    kvedge_proxy_impl_src_t *src = &p->src[i];
    src->bw_samples++;
    double w = src->bw_samples < 4 ? 1.0 / (double)src->bw_samples : 0.25;
    src->bw_est = src->bw_est > 0 ? (1 - w) * src->bw_est + w * bw : bw;
    pthread_mutex_unlock(&p->srcs_mu);
}

size_t kvedge_proxy_impl_src_usable(kvedge_proxy_impl_t *p)
{
    size_t ok = 0, n = atomic_load(&p->nsrc);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&p->srcs_mu);
        bool c = p->src[i].client != NULL;
        pthread_mutex_unlock(&p->srcs_mu);
        ok += c && kvedge_health_usable(p->health, p->src[i].conf.name, (uint64_t)kvedge_mono_ms());
    }
    return ok;
}

void kvedge_proxy_impl_src_close(kvedge_proxy_impl_t *p)
{
    size_t n = atomic_load(&p->nsrc);
    for (size_t i = 0; i < n; i++)
        kvedge_client_destroy(&p->src[i].client);
}

/* ---------------------------------------------------------------- prober */

typedef struct {
    char (*ids)[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    size_t n;
} s_ids_t;

static int s_collect_node(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    (void)body;
    (void)len;
    s_ids_t *acc = ctx;
    kvedge_master_key_t k;
    if (acc->n >= KVEDGE_PROXY_MAX_SOURCES ||
        kvedge_master_key_parse(key, strlen(key), &k) != KVEDGE_OK ||
        k.space != KVEDGE_MASTER_SPACE_NODE || strlen(k.a) > KVEDGE_MASTER_MAX_ID_BYTES)
        return 0;
    if (!acc->ids && !(acc->ids = calloc(KVEDGE_PROXY_MAX_SOURCES, sizeof *acc->ids)))
        return -1;
    memcpy(acc->ids[acc->n++], k.a, strlen(k.a) + 1);
    return 0;
}

/* Adds the master's registered nodes not known yet (the view's foreach runs on a copy). */
static void s_discover(kvedge_proxy_impl_t *p)
{
    if (!p->view)
        return;
    s_ids_t acc = {NULL, 0};
    kvedge_mview_foreach(p->view, "node/", s_collect_node, &acc);
    for (size_t i = 0; i < acc.n; i++) {
        const char *id = acc.ids[i];
        bool known = false;
        size_t n = atomic_load(&p->nsrc);
        for (size_t j = 0; j < n && !known; j++)
            known = strcmp(p->src[j].conf.name, id) == 0;
        kvedge_master_node_t rec;
        if (known || strcmp(id, p->id) == 0 || kvedge_mview_node(p->view, id, &rec) != KVEDGE_OK ||
            !rec.endpoint[0])
            continue;
        kvedge_proxy_source_t conf;
        memset(&conf, 0, sizeof conf);
        snprintf(conf.name, sizeof conf.name, "%s", id);
        snprintf(conf.endpoint, sizeof conf.endpoint, "%s", rec.endpoint);
        snprintf(conf.server_key, sizeof conf.server_key, "%s", rec.public_key);
        if (p->opts.local_node && strcmp(id, p->opts.local_node) == 0)
            conf.kind = KVEDGE_PLAN_LOCAL;
        else if (p->opts.history_node && strcmp(id, p->opts.history_node) == 0)
            conf.kind = KVEDGE_PLAN_HISTORY;
        else
            conf.kind = rec.role == KVEDGE_ROLE_CLOUD ? KVEDGE_PLAN_CLOUD : KVEDGE_PLAN_PEER;
        conf.bw_bytes_per_s = (double)rec.bandwidth_bytes_per_s;
        conf.rtt_us = rec.rtt_us;
        if (kvedge_proxy_impl_src_add(p, &conf, true) >= 0)
            kvedge_log_info("source %s (%s) from the master: %s", id,
                            kvedge_plan_kind_name(conf.kind), conf.endpoint);
    }
    free(acc.ids);
}

/* A source that runs CURVE (it has a public key) cannot be reached without a certificate of
 * our own: say so, in the `sources` view and in the log (warn, once a minute per source), with
 * the flag that fixes it, rather than fail the connect with "invalid argument". */
static kvedge_log_limit_t s_no_cert_lines = KVEDGE_LOG_LIMIT_INIT(60000, 1, 30);

static void s_no_cert(kvedge_proxy_impl_t *p, size_t i, const kvedge_proxy_source_t *conf,
                      uint64_t now)
{
    pthread_mutex_lock(&p->srcs_mu);
    bool from_master = p->src[i].from_master;
    snprintf(p->src[i].hint, sizeof p->src[i].hint,
             "%s runs CURVE and this proxy has no certificate: start the proxy with --cert FILE "
             "and allowlist FILE's public key on %s",
             conf->name, conf->name);
    pthread_mutex_unlock(&p->srcs_mu);
    kvedge_health_failure(p->health, conf->name, now, KVEDGE_EDENIED);
    uint64_t held = 0;
    if (kvedge_log_limit_allow(&s_no_cert_lines, conf->name, kvedge_mono_ms(), &held))
        kvedge_log_warn("source %s (%s%s) runs CURVE (it has a public key) but this proxy has no "
                        "certificate, so it cannot connect: start the proxy with --cert FILE "
                        "(made if missing) and allowlist FILE's public key on %s",
                        conf->name, conf->endpoint, from_master ? ", from the master" : "",
                        conf->name);
}

static void s_probe_source(kvedge_proxy_impl_t *p, size_t i)
{
    pthread_mutex_lock(&p->srcs_mu);
    kvedge_proxy_impl_src_t *s = &p->src[i];
    kvedge_client_t *c = s->client;
    kvedge_proxy_source_t conf = s->conf;
    pthread_mutex_unlock(&p->srcs_mu);
    uint64_t now = (uint64_t)kvedge_mono_ms();
    if (!c && conf.server_key[0] && !p->cert_path) {
        s_no_cert(p, i, &conf, now);
        return;
    }
    if (!c) {
        kvedge_client_opts_t o;
        kvedge_client_opts_default(&o);
        o.endpoint = conf.endpoint;
        o.server_key = conf.server_key[0] ? conf.server_key : NULL;
        o.client_cert = conf.server_key[0] ? p->cert_path : NULL;
        o.deadline_ms = S_HELLO_MS;
        o.credit = p->opts.credit;
        o.name = p->id;
        o.link = conf.link[0] ? conf.link : NULL;
        int rc = kvedge_client_connect(&o, &c);
        if (rc != KVEDGE_OK) {
            kvedge_log_debug("source %s (%s): %s", conf.name, conf.endpoint, kvedge_strerror(rc));
            kvedge_health_failure(p->health, conf.name, now, rc);
            return;
        }
        /* A first measurement of the link, so an undeclared source is not priced at the
         * defaults until a fetch has used it: a round trip, then a payload big enough to
         * feed the bandwidth estimate (access/meter.h). */
        if (conf.bw_bytes_per_s <= 0 && kvedge_client_ping(c, 0, NULL, NULL) == KVEDGE_OK)
            (void)kvedge_client_ping(c, S_PROBE_BYTES, NULL, NULL);
        pthread_mutex_lock(&p->srcs_mu);
        s->client = c;
        pthread_mutex_unlock(&p->srcs_mu);
        kvedge_health_success(p->health, conf.name, (uint64_t)kvedge_mono_ms());
        kvedge_log_info("source %s (%s) connected: %s", conf.name, kvedge_plan_kind_name(conf.kind),
                        conf.endpoint);
        return;
    }
    /* A liveness probe: keeps an idle source from looking silent, and is how a source that
     * went down is heard again (re-admission). */
    double rtt = 0;
    int rc = kvedge_client_ping(c, 0, &rtt, NULL);
    if (rc == KVEDGE_OK) {
        /* Its round trip feeds the deadlines of streams from this source (fetch.c). */
        kvedge_health_rtt(p->health, conf.name, (uint64_t)kvedge_mono_ms(), rtt);
        kvedge_health_heartbeat(p->health, conf.name, (uint64_t)kvedge_mono_ms());
    } else {
        kvedge_health_failure(p->health, conf.name, (uint64_t)kvedge_mono_ms(), rc);
    }
}

/* Publishes what this proxy measured of its link to each source (link/<proxy>/<node>). */
static void s_publish_links(kvedge_proxy_impl_t *p)
{
    if (!p->view)
        return;
    uint64_t now = (uint64_t)kvedge_mono_ms();
    size_t n = atomic_load(&p->nsrc);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&p->srcs_mu);
        kvedge_proxy_impl_src_t *s = &p->src[i];
        kvedge_client_t *c = s->client;
        bool due = now - s->last_publish_ms >= KVEDGE_PROXY_LINK_PUBLISH_MS;
        pthread_mutex_unlock(&p->srcs_mu);
        double bw = 0, rtt = 0;
        if (!c || !due)
            continue;
        kvedge_proxy_impl_src_link(p, s, c, &bw, &rtt);
        uint64_t samples = 0;
        kvedge_client_link(c, NULL, NULL, &samples);
        pthread_mutex_lock(&p->srcs_mu);
        samples += s->bw_samples;
        pthread_mutex_unlock(&p->srcs_mu);
        if (!samples)
            continue;
        kvedge_master_link_t lr = {.rtt_us = (uint32_t)rtt,
                                   .bw_bytes_per_s = (uint64_t)bw,
                                   .samples = samples > UINT32_MAX ? UINT32_MAX : (uint32_t)samples,
                                   .updated_ms = (uint64_t)zclock_time()};
        uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
        size_t len;
        char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        if (kvedge_master_link_pack(&lr, body, &len) != KVEDGE_OK ||
            kvedge_master_key_format(KVEDGE_MASTER_SPACE_LINK, p->id, s->conf.name, key,
                                     sizeof key) != KVEDGE_OK)
            continue;
        if (kvedge_mview_set(p->view, key, body, len, S_PING_MS) == KVEDGE_OK) {
            pthread_mutex_lock(&p->srcs_mu);
            s->last_publish_ms = now;
            pthread_mutex_unlock(&p->srcs_mu);
        }
    }
}

static void *s_prober(void *arg)
{
    kvedge_proxy_impl_t *p = arg;
    pthread_mutex_lock(&p->stop_mu);
    while (!p->stop) {
        pthread_mutex_unlock(&p->stop_mu);
        s_discover(p);
        size_t n = atomic_load(&p->nsrc);
        for (size_t i = 0; i < n; i++)
            s_probe_source(p, i);
        s_publish_links(p);
        kvedge_proxy_impl_monitor_poll_history(p);
        pthread_mutex_lock(&p->stop_mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)KVEDGE_PROXY_PROBE_MS * 1000000L;
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        while (!p->stop && pthread_cond_timedwait(&p->stop_cv, &p->stop_mu, &ts) == 0) {
        }
    }
    pthread_mutex_unlock(&p->stop_mu);
    return NULL;
}

/* Source health changes at info, so an operator sees a source go down and come back. A
 * flapping source gets at most 6 lines a minute; its next line counts the ones left out. */
static kvedge_log_limit_t s_health_lines = KVEDGE_LOG_LIMIT_INIT(60000, 6, 60);

static void s_on_health(const char *name, kvedge_health_state_t from, kvedge_health_state_t to,
                        const char *reason, uint64_t now_ms, void *arg)
{
    (void)now_ms;
    kvedge_proxy_impl_t *p = arg;
    /* The Collaboration Monitor keeps every change with its reason; the log, a few a minute. */
    kvedge_collab_transition(p->collab, name, (int)from, (int)to, reason);
    uint64_t held = 0;
    if (kvedge_log_level() < KVEDGE_LOG_INFO ||
        !kvedge_log_limit_allow(&s_health_lines, name, kvedge_mono_ms(), &held))
        return;
    char more[96] = "";
    if (held)
        snprintf(more, sizeof more, " (%llu earlier changes of its health not logged)",
                 (unsigned long long)held);
    kvedge_log_info("source %s %s: %s%s", name,
                    to == KVEDGE_HEALTH_DOWN      ? "down"
                    : to == KVEDGE_HEALTH_SUSPECT ? "suspect"
                                                  : "up",
                    reason, more);
}

/* ---------------------------------------------------------------- asker */

/* A LOOKUP a FETCH asks of a source. */
struct kvedge_proxy_impl_ask_t {
    kvedge_proxy_impl_ask_t *next;
    uint64_t serial; /* the fetch */
    int src, local;  /* proxy index of the source; the fetch's own index of it */
    uint32_t n;
    kvedge_chunk_id_t ids[]; /* the chain */
};

int kvedge_proxy_impl_ask(kvedge_proxy_impl_t *p, uint64_t serial, int src, int local,
                          const kvedge_chunk_id_t *chain, uint32_t n)
{
    kvedge_proxy_impl_ask_t *a = malloc(sizeof *a + (size_t)n * sizeof a->ids[0]);
    if (!a)
        return KVEDGE_ENOMEM;
    *a = (kvedge_proxy_impl_ask_t){NULL, serial, src, local, n};
    memcpy(a->ids, chain, (size_t)n * sizeof a->ids[0]);
    pthread_mutex_lock(&p->stop_mu);
    bool stopping = p->stop || !p->asker_started;
    if (!stopping) {
        if (p->ask_tail)
            p->ask_tail->next = a;
        else
            p->ask_head = a;
        p->ask_tail = a;
        pthread_cond_broadcast(&p->stop_cv);
    }
    pthread_mutex_unlock(&p->stop_mu);
    if (stopping) {
        free(a);
        return KVEDGE_ECLOSED;
    }
    return KVEDGE_OK;
}

/* Runs the queued LOOKUPs one after the other, each bounded by its client's deadline, and
 * hands every answer to the actor. */
static void *s_asker(void *arg)
{
    kvedge_proxy_impl_t *p = arg;
    pthread_mutex_lock(&p->stop_mu);
    while (!p->stop) {
        kvedge_proxy_impl_ask_t *a = p->ask_head;
        if (!a) {
            pthread_cond_wait(&p->stop_cv, &p->stop_mu);
            continue;
        }
        p->ask_head = a->next;
        if (!p->ask_head)
            p->ask_tail = NULL;
        pthread_mutex_unlock(&p->stop_mu);
        pthread_mutex_lock(&p->srcs_mu);
        kvedge_client_t *c = p->src[a->src].client;
        pthread_mutex_unlock(&p->srcs_mu);
        size_t hit = 0;
        int rc = c ? kvedge_client_lookup(c, a->ids, a->n, &hit) : KVEDGE_ECLOSED;
        kvedge_log_debug("fetch %llu: LOOKUP on %s: %s, %zu of %u chunks held whole",
                         (unsigned long long)a->serial, p->src[a->src].conf.name,
                         kvedge_strerror(rc), hit, a->n);
        kvedge_proxy_impl_fetch_asked(p, a->serial, a->local, rc,
                                      hit > UINT32_MAX ? UINT32_MAX : (uint32_t)hit);
        free(a);
        pthread_mutex_lock(&p->stop_mu);
    }
    pthread_mutex_unlock(&p->stop_mu);
    return NULL;
}

int kvedge_proxy_impl_prober_start(kvedge_proxy_impl_t *p)
{
    kvedge_health_set_observer(p->health, s_on_health, p);
    if (pthread_create(&p->prober, NULL, s_prober, p) != 0)
        return KVEDGE_ENOMEM;
    p->prober_started = true;
    if (pthread_create(&p->asker, NULL, s_asker, p) != 0)
        return KVEDGE_ENOMEM;
    pthread_mutex_lock(&p->stop_mu);
    p->asker_started = true;
    pthread_mutex_unlock(&p->stop_mu);
    return KVEDGE_OK;
}

void kvedge_proxy_impl_prober_stop(kvedge_proxy_impl_t *p)
{
    if (!p->prober_started)
        return;
    pthread_mutex_lock(&p->stop_mu);
    p->stop = true;
    pthread_cond_broadcast(&p->stop_cv);
    bool asker = p->asker_started;
    pthread_mutex_unlock(&p->stop_mu);
    pthread_join(p->prober, NULL);
    if (asker)
        pthread_join(p->asker, NULL);
    p->prober_started = false;
    pthread_mutex_lock(&p->stop_mu);
    p->asker_started = false;
    kvedge_proxy_impl_ask_t *a = p->ask_head;
    p->ask_head = p->ask_tail = NULL;
    pthread_mutex_unlock(&p->stop_mu);
    while (a) {
        kvedge_proxy_impl_ask_t *next = a->next;
        free(a);
        a = next;
    }
}
