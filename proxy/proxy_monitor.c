/* The edge proxy's monitoring: its registry (the Collaboration Monitor's families plus the
 * live state read at scrape time: sources, buffers, the master's registry), the HTTP endpoint
 * (/metrics, /health, /ready), the MONITOR document, and the prober's reading of the
 * historical cache's lag from history sources. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"
#include "proxy/proxy_impl.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"

#define S_HISTORY_DEADLINE_MS 1000

/* One source's live state, copied. */
typedef struct {
    kvedge_proxy_source_t conf;
    bool connected, from_master, history_known;
    int state; /* kvedge_health_state_t, or -1 unknown */
    double weight, bw, rtt_us;
    double srtt_us, rttvar_us, rto_ms; /* RFC 6298 estimators of its round trips (0: none) */
    double history_missing, history_age_s, history_blocks;
    char history_state[16];
    uint32_t failures;
    int last_err;
    char hint[320]; /* why it cannot be reached, when a flag would fix it */
} s_src_view_t;

static size_t s_sources(kvedge_proxy_impl_t *p, s_src_view_t *out)
{
    size_t n = atomic_load(&p->nsrc);
    uint64_t now = (uint64_t)kvedge_mono_ms();
    for (size_t i = 0; i < n; i++) {
        kvedge_proxy_impl_src_t *s = &p->src[i];
        s_src_view_t *v = &out[i];
        pthread_mutex_lock(&p->srcs_mu);
        v->conf = s->conf;
        kvedge_client_t *c = s->client;
        v->from_master = s->from_master;
        snprintf(v->hint, sizeof v->hint, "%s", s->hint);
        v->history_known = s->history_known;
        v->history_missing = s->history_missing;
        v->history_age_s = s->history_age_s;
        v->history_blocks = s->history_blocks;
        snprintf(v->history_state, sizeof v->history_state, "%s", s->history_state);
        pthread_mutex_unlock(&p->srcs_mu);
        v->connected = c != NULL;
        kvedge_proxy_impl_src_link(p, s, c, &v->bw, &v->rtt_us);
        v->state = kvedge_health_state(p->health, v->conf.name, now);
        v->weight = kvedge_health_weight(p->health, v->conf.name, now);
        kvedge_health_info_t info;
        v->failures = 0;
        v->last_err = 0;
        v->srtt_us = v->rttvar_us = 0;
        if (kvedge_health_get(p->health, v->conf.name, now, &info) == KVEDGE_OK) {
            v->failures = info.failures;
            v->last_err = info.last_err;
            v->srtt_us = info.srtt_us;
            v->rttvar_us = info.rttvar_us;
        }
        v->rto_ms = kvedge_health_rto_ms(p->health, v->conf.name);
    }
    return n;
}

static const char *s_state_name(int st)
{
    return st == KVEDGE_HEALTH_UP        ? "up"
           : st == KVEDGE_HEALTH_SUSPECT ? "suspect"
           : st == KVEDGE_HEALTH_DOWN    ? "down"
                                         : "unknown";
}

typedef struct {
    kvedge_proxy_impl_t *p;
    const kvedge_collab_gauges_t *g;
    cJSON *arr; /* the document's "registry", or NULL for the metrics */
    size_t n;
} s_nodes_t;

static int s_node_cb(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    s_nodes_t *a = ctx;
    const char *id = key + strlen("node/");
    kvedge_master_node_t node;
    if (kvedge_master_node_parse(body, len, &node) != KVEDGE_OK)
        return 0;
    kvedge_master_health_t h;
    bool known = kvedge_mview_health(a->p->view, id, &h) == KVEDGE_OK;
    bool alive = known && h.state != KVEDGE_MASTER_HEALTH_DOWN;
    const char *role = node.role == KVEDGE_ROLE_CLOUD  ? "cloud"
                       : node.role == KVEDGE_ROLE_EDGE ? "edge"
                                                       : "proxy";
    a->n++;
    if (a->g) {
        const char *v[] = {id, role};
        kvedge_series_set(kvedge_metric_series(a->g->node_alive, v, 2), alive ? 1 : 0);
    }
    if (a->arr) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "node", id);
        cJSON_AddStringToObject(e, "role", role);
        cJSON_AddStringToObject(e, "endpoint", node.endpoint);
        cJSON_AddStringToObject(e, "health",
                                !known                                    ? "unknown"
                                : h.state == KVEDGE_MASTER_HEALTH_UP      ? "up"
                                : h.state == KVEDGE_MASTER_HEALTH_SUSPECT ? "suspect"
                                                                          : "down");
        cJSON_AddNumberToObject(e, "last_seen_ms", known ? (double)h.last_seen_ms : 0);
        cJSON_AddItemToArray(a->arr, e);
    }
    return 0;
}

static void s_collect(kvedge_metrics_t *r, void *arg)
{
    (void)r;
    kvedge_proxy_impl_t *p = arg;
    const kvedge_collab_gauges_t *g = kvedge_collab_gauges(p->collab);
    if (!g)
        return;
    s_src_view_t *v = calloc(KVEDGE_PROXY_MAX_SOURCES, sizeof *v);
    size_t n = v ? s_sources(p, v) : 0;
    for (size_t i = 0; i < n; i++) {
        const char *lv[] = {v[i].conf.name, kvedge_plan_kind_name(v[i].conf.kind)};
        kvedge_series_set(kvedge_metric_series(g->up, lv, 2),
                          v[i].connected && v[i].state != KVEDGE_HEALTH_DOWN ? 1 : 0);
        kvedge_series_set(kvedge_metric_series(g->state, lv, 2), v[i].state);
        kvedge_series_set(kvedge_metric_series(g->rtt, lv, 2), v[i].rtt_us / 1e6);
        kvedge_series_set(kvedge_metric_series(g->rto, lv, 2), v[i].rto_ms / 1e3);
        kvedge_series_set(kvedge_metric_series(g->bw, lv, 2), v[i].bw);
        if (v[i].conf.kind == KVEDGE_PLAN_HISTORY && v[i].history_known) {
            const char *hv[] = {v[i].conf.name};
            kvedge_series_set(kvedge_metric_series(g->sync_missing, hv, 1), v[i].history_missing);
            if (v[i].history_age_s >= 0)
                kvedge_series_set(kvedge_metric_series(g->sync_age, hv, 1), v[i].history_age_s);
        }
    }
    free(v);
    kvedge_series_mirror(p->denials, &p->denials_seen, kvedge_secure_router_denials(&p->sec));
    kvedge_series_set(g->buffered, (double)atomic_load(&p->buffered_now));
    kvedge_series_set(g->fetches_open, (double)atomic_load(&p->fetches_open));
    if (p->view) {
        kvedge_series_set(g->master_synced,
                          kvedge_mview_state(p->view) == KVEDGE_MVIEW_SYNCED ? 1 : 0);
        s_nodes_t a = {p, g, NULL, 0};
        kvedge_mview_foreach(p->view, "node/", s_node_cb, &a);
        kvedge_series_set(g->registry_nodes, (double)a.n);
    }
}

static bool s_ready(void *arg, char *why, size_t why_len)
{
    kvedge_proxy_impl_t *p = arg;
    if (p->view && kvedge_mview_state(p->view) == KVEDGE_MVIEW_EMPTY) {
        char hint[512];
        kvedge_proxy_impl_master_hint(p, hint, sizeof hint);
        snprintf(why, why_len,
                 "no registry yet: the master %s has not answered and there is "
                 "no snapshot%s",
                 p->opts.master, hint);
        return false;
    }
    if (atomic_load(&p->nsrc) == 0) {
        snprintf(why, why_len, "no sources known");
        return false;
    }
    if (kvedge_proxy_impl_src_usable(p) == 0) {
        snprintf(why, why_len, "no source is connected and usable (%zu known)",
                 atomic_load(&p->nsrc));
        return false;
    }
    return true;
}

int kvedge_proxy_impl_monitor_open(kvedge_proxy_impl_t *p, char *why, size_t why_len)
{
    p->start_mono_ms = (uint64_t)kvedge_mono_ms();
    p->start_wall_ms = (uint64_t)kvedge_wall_ms();
    p->metrics = kvedge_metrics_new();
    if (!p->metrics)
        return KVEDGE_ENOMEM;
    if (kvedge_metrics_process(p->metrics, KVEDGE_VERSION_STRING, "proxy",
                               (double)p->start_wall_ms / 1e3, why, why_len) != 0)
        return KVEDGE_ENOMEM;
    p->denials = kvedge_metrics_single(
        p->metrics, KVEDGE_METRIC_COUNTER, "kvedge_proxy_handshake_denials_total",
        "CURVE handshakes refused: client keys not in the allowlist (each is logged, a few a "
        "minute per address).",
        NULL, why, why_len);
    /* The live gauges live in the monitor's families: without recording they are made all
     * the same, so /metrics and MONITOR always show the sources. */
    p->collab = kvedge_collab_new(p->metrics, why, why_len);
    if (!p->denials || !p->collab)
        return KVEDGE_ENOMEM;
    kvedge_collab_set_recording(p->collab, !p->opts.no_monitor);
    if (kvedge_metrics_on_collect(p->metrics, s_collect, p) != 0)
        return KVEDGE_ENOMEM;
    return KVEDGE_OK;
}

int kvedge_proxy_impl_monitor_serve(kvedge_proxy_impl_t *p, char *why, size_t why_len)
{
    const char *addr = p->opts.metrics;
    if (!addr || !addr[0] || strcmp(addr, KVEDGE_HTTP_OFF) == 0)
        return KVEDGE_OK;
    int rc = kvedge_http_start(addr, p->metrics, s_ready, p, &p->http, why, why_len);
    if (rc == KVEDGE_OK)
        kvedge_log_info("metrics on %s/metrics (health: /health, readiness: /ready)",
                        kvedge_http_url(p->http));
    return rc;
}

void kvedge_proxy_impl_monitor_close(kvedge_proxy_impl_t *p)
{
    kvedge_http_stop(&p->http);
    kvedge_collab_destroy(&p->collab);
    kvedge_metrics_destroy(&p->metrics);
}

/* ---------------------------------------------------------------- MONITOR */

static char *s_doc(kvedge_proxy_impl_t *p, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON_AddStringToObject(root, "kind", "proxy");
    cJSON_AddStringToObject(root, "name", p->id);
    cJSON_AddStringToObject(root, "version", KVEDGE_VERSION_STRING);
    cJSON_AddNumberToObject(root, "time_ms", (double)kvedge_wall_ms());
    cJSON_AddNumberToObject(root, "uptime_ms",
                            (double)((uint64_t)kvedge_mono_ms() - p->start_mono_ms));
    char why[256] = "";
    bool ready = s_ready(p, why, sizeof why);
    cJSON_AddBoolToObject(root, "ready", ready);
    if (!ready)
        cJSON_AddStringToObject(root, "not_ready", why);
    kvedge_proxy_stats_t stats;
    pthread_mutex_lock(&p->stats_mu);
    stats = p->stats;
    pthread_mutex_unlock(&p->stats_mu);
    cJSON *so = cJSON_AddObjectToObject(root, "stats");
    cJSON_AddNumberToObject(so, "requests", (double)stats.requests);
    cJSON_AddNumberToObject(so, "layers", (double)stats.layers);
    cJSON_AddNumberToObject(so, "misses", (double)stats.misses);
    cJSON_AddNumberToObject(so, "fallbacks", (double)stats.fallbacks);
    cJSON_AddNumberToObject(so, "corrupt", (double)stats.corrupt);
    cJSON_AddNumberToObject(so, "bytes", (double)stats.bytes);
    cJSON_AddNumberToObject(so, "source_failures", (double)stats.source_failures);
    cJSON_AddNumberToObject(so, "mapped_layers", (double)stats.mapped_layers);
    cJSON_AddNumberToObject(so, "replans", (double)stats.replans);
    cJSON_AddNumberToObject(so, "buffered_bytes", (double)atomic_load(&p->buffered_now));
    cJSON_AddNumberToObject(so, "fetches_open", (double)atomic_load(&p->fetches_open));
    s_src_view_t *v = calloc(KVEDGE_PROXY_MAX_SOURCES, sizeof *v);
    size_t n = v ? s_sources(p, v) : 0;
    cJSON *arr = cJSON_AddArrayToObject(root, "sources");
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", v[i].conf.name);
        cJSON_AddStringToObject(e, "kind", kvedge_plan_kind_name(v[i].conf.kind));
        cJSON_AddStringToObject(e, "endpoint", v[i].conf.endpoint);
        cJSON_AddStringToObject(e, "origin", v[i].from_master ? "master" : "config");
        cJSON_AddBoolToObject(e, "connected", v[i].connected);
        cJSON_AddStringToObject(e, "state", s_state_name(v[i].state));
        cJSON_AddNumberToObject(e, "weight", v[i].weight > 0 ? v[i].weight : 0);
        cJSON_AddNumberToObject(e, "rtt_us", v[i].rtt_us);
        cJSON_AddNumberToObject(e, "srtt_us", v[i].srtt_us);
        cJSON_AddNumberToObject(e, "rttvar_us", v[i].rttvar_us);
        cJSON_AddNumberToObject(e, "rto_ms", v[i].rto_ms);
        cJSON_AddNumberToObject(e, "bandwidth", v[i].bw);
        cJSON_AddNumberToObject(e, "failures", v[i].failures);
        cJSON_AddStringToObject(e, "last_error",
                                v[i].hint[0]    ? v[i].hint
                                : v[i].last_err ? kvedge_strerror(v[i].last_err)
                                                : "");
        if (v[i].conf.kind == KVEDGE_PLAN_HISTORY && v[i].history_known) {
            cJSON *h = cJSON_AddObjectToObject(e, "history");
            cJSON_AddStringToObject(h, "state", v[i].history_state);
            cJSON_AddNumberToObject(h, "chunks_missing", v[i].history_missing);
            cJSON_AddNumberToObject(h, "blocks_held", v[i].history_blocks);
            cJSON_AddNumberToObject(h, "last_success_age_s", v[i].history_age_s);
        }
        cJSON_AddItemToArray(arr, e);
    }
    free(v);
    if (kvedge_collab_json(p->collab, root) != 0) {
        cJSON_Delete(root);
        return NULL;
    }
    if (p->view) {
        cJSON *m = cJSON_AddObjectToObject(root, "master");
        cJSON_AddStringToObject(m, "endpoint", p->opts.master);
        cJSON_AddStringToObject(m, "registry",
                                kvedge_mview_state_name(kvedge_mview_state(p->view)));
        s_nodes_t a = {p, NULL, cJSON_AddArrayToObject(m, "nodes"), 0};
        kvedge_mview_foreach(p->view, "node/", s_node_cb, &a);
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (out && len)
        *len = strlen(out);
    return out;
}

void kvedge_proxy_impl_monitor_reply(kvedge_proxy_impl_t *p, zframe_t *route,
                                     const kvedge_wire_header_t *h, const kvedge_wire_frame_t *pf)
{
    (void)pf; /* a proxy has no hot prefixes: `top` asks for none here */
    size_t len = 0;
    char *doc = s_doc(p, &len);
    int rc = !doc ? KVEDGE_ENOMEM : len > KVEDGE_WIRE_MAX_MONITOR_BYTES ? KVEDGE_ETOOBIG : 0;
    if (rc != KVEDGE_OK) {
        free(doc);
        kvedge_proxy_impl_reply_error(p, route, KVEDGE_OP_MONITOR, h->request_id, rc);
        return;
    }
    zmsg_t *m = zmsg_new();
    zframe_t *hf =
        kvedge_proxy_impl_header(KVEDGE_OP_MONITOR, KVEDGE_WIRE_FLAG_REPLY, h->request_id, 0, 0);
    zmsg_append(m, &hf);
    zmsg_addmem(m, doc, len);
    free(doc);
    kvedge_proxy_impl_send(p, route, &m);
}

/* ---------------------------------------------------------------- history lag */

/* Reads a node's MONITOR "sync" section into the source's lag (the document is a peer's:
 * every field is checked for its type; anything missing leaves the lag unknown). */
static void s_history_parse(kvedge_proxy_impl_src_t *s, const char *json, size_t len)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    cJSON *sync = cJSON_GetObjectItemCaseSensitive(root, "sync");
    cJSON *subs = cJSON_GetObjectItemCaseSensitive(sync, "subscriptions");
    double missing = 0, held = 0, age = -1, now = (double)kvedge_wall_ms();
    const char *state = "ok";
    bool any = false;
    cJSON *e;
    if (!cJSON_IsArray(subs))
        subs = NULL;
    cJSON_ArrayForEach(e, subs)
    {
        cJSON *tot = cJSON_GetObjectItemCaseSensitive(e, "chunks_total");
        cJSON *syn = cJSON_GetObjectItemCaseSensitive(e, "chunks_synced");
        cJSON *hb = cJSON_GetObjectItemCaseSensitive(e, "blocks_held");
        cJSON *ok = cJSON_GetObjectItemCaseSensitive(e, "last_ok_ms");
        cJSON *st = cJSON_GetObjectItemCaseSensitive(e, "state");
        if (!cJSON_IsNumber(tot) || !cJSON_IsNumber(syn) || !cJSON_IsNumber(hb) ||
            !cJSON_IsNumber(ok) || !cJSON_IsString(st))
            continue;
        any = true;
        if (tot->valuedouble > syn->valuedouble)
            missing += tot->valuedouble - syn->valuedouble;
        held += hb->valuedouble;
        double a =
            ok->valuedouble > 0 && now > ok->valuedouble ? (now - ok->valuedouble) / 1e3 : -1;
        if (a > age)
            age = a; /* the oldest subscription sets the lag */
        if (strcmp(st->valuestring, "ok") != 0)
            state = strcmp(st->valuestring, "failed") == 0 ? "failed" : "partial";
    }
    s->history_known = any;
    s->history_missing = missing;
    s->history_blocks = held;
    s->history_age_s = age;
    snprintf(s->history_state, sizeof s->history_state, "%s", any ? state : "");
    cJSON_Delete(root);
}

void kvedge_proxy_impl_monitor_poll_history(kvedge_proxy_impl_t *p)
{
    size_t n = atomic_load(&p->nsrc);
    uint64_t now = (uint64_t)kvedge_mono_ms();
    for (size_t i = 0; i < n; i++) {
        kvedge_proxy_impl_src_t *s = &p->src[i];
        pthread_mutex_lock(&p->srcs_mu);
        kvedge_client_t *c = s->client;
        bool due = s->conf.kind == KVEDGE_PLAN_HISTORY && c &&
                   now >= s->history_polled_ms + KVEDGE_PROXY_HISTORY_POLL_MS;
        if (due)
            s->history_polled_ms = now;
        pthread_mutex_unlock(&p->srcs_mu);
        if (!due)
            continue;
        char *json = NULL;
        size_t len = 0;
        /* The client's own deadline bounds the call (the prober's clients use short ones). */
        if (kvedge_client_monitor(c, 0, &json, &len) != KVEDGE_OK)
            continue;
        pthread_mutex_lock(&p->srcs_mu);
        s_history_parse(s, json, len);
        pthread_mutex_unlock(&p->srcs_mu);
        free(json);
    }
}
