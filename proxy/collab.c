/* The edge proxy's Collaboration Monitor: families, recording calls and the JSON view of what
 * was recorded (proxy/collab.h). */
#include "proxy/collab.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/frame.h"
#include "proxy/proxy.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "access/codec/errwire.h"

#define S_KINDS   5 /* local, peer, cloud, history, none */
#define S_REASONS 9 /* kvedge_fetch_reason_t 1 ... 8, 0 unknown */
#define S_OPS     (KVEDGE_OP_MONITOR + 1)
#define S_STATUS  32

/* actual / planned time, in thousandths: 0.016 ... 524. */
static const kvedge_histogram_spec_t s_ratio_spec = {16, 16, 1e-3};

typedef struct {
    uint64_t wall_ms;
    char name[64];
    int from, to;
    char reason[160];
} s_transition_t;

struct kvedge_collab_t {
    kvedge_metrics_t *reg;
    kvedge_metric_t *src_bytes, *src_layers, *transitions, *layers, *requests, *fetches;
    kvedge_series_t *sb[KVEDGE_PROXY_MAX_SOURCES], *sl[KVEDGE_PROXY_MAX_SOURCES];
    kvedge_series_t *layer[S_KINDS][S_REASONS];
    _Atomic(kvedge_series_t *) req[S_OPS][S_STATUS + 1];
    _Atomic(kvedge_series_t *) fetch_status[S_STATUS + 1];
    kvedge_series_t *plan_h, *first_h, *last_h, *planned_h, *ratio_h;
    kvedge_series_t *mapped; /* layers delivered from a mapped model */
    kvedge_collab_gauges_t g;
    pthread_mutex_t mu; /* the transition ring */
    s_transition_t ring[KVEDGE_COLLAB_TRANSITIONS];
    uint64_t n_transitions;
    bool off; /* not recording layers, fetches, requests */
};

static const char *s_kind(int k)
{
    return k >= 0 && k < 4 ? kvedge_plan_kind_name((kvedge_plan_kind_t)k) : "none";
}

static const char *s_state(int s)
{
    return s == 0 ? "up" : s == 1 ? "suspect" : "down";
}

static const char *s_status(int status)
{
    if (status == KVEDGE_COLLAB_CANCELLED)
        return "CANCELLED";
    if (kvedge_err_index(status) < 0 || kvedge_err_index(status) >= S_STATUS)
        return "other";
    const char *n = kvedge_errname(status);
    return strncmp(n, "KVEDGE_", 7) == 0 ? n + 7 : n;
}

static kvedge_series_t *s_hist(kvedge_metrics_t *r, const char *name, const char *help,
                               const kvedge_histogram_spec_t *spec, char *why, size_t why_len)
{
    return kvedge_metrics_single(r, KVEDGE_METRIC_HISTOGRAM, name, help, spec, why, why_len);
}

kvedge_collab_t *kvedge_collab_new(kvedge_metrics_t *r, char *why, size_t why_len)
{
    kvedge_collab_t *c = r ? calloc(1, sizeof *c) : NULL;
    if (!c)
        return NULL;
    c->reg = r;
    pthread_mutex_init(&c->mu, NULL);
    const kvedge_metric_type_t C = KVEDGE_METRIC_COUNTER, G = KVEDGE_METRIC_GAUGE;
    const char *sk[] = {"source", "kind"}, *st[] = {"source", "to"}, *kr[] = {"kind", "reason"},
               *os[] = {"op", "status"}, *res[] = {"status"}, *nr[] = {"node", "role"},
               *sub[] = {"source"};
    const size_t S = KVEDGE_PROXY_MAX_SOURCES;
    c->src_bytes = kvedge_metrics_family(r, C, "kvedge_proxy_source_bytes_total",
                                         "Block bytes delivered to clients from each source.", sk,
                                         2, NULL, S, why, why_len);
    c->src_layers = kvedge_metrics_family(r, C, "kvedge_proxy_source_layers_total",
                                          "Layers delivered to clients from each source.", sk, 2,
                                          NULL, S, why, why_len);
    c->transitions = kvedge_metrics_family(
        r, C, "kvedge_proxy_source_transitions_total",
        "Health state changes of each source, by the state entered (up, suspect, down).", st, 2,
        NULL, 3 * S, why, why_len);
    c->layers = kvedge_metrics_family(
        r, C, "kvedge_proxy_layers_total",
        "Layers reported to clients, by the kind of source that delivered them (none: not "
        "delivered) and the reason (planned, fallback:*, recompute, miss, miss:deadline, "
        "replan:bandwidth).",
        kr, 2, NULL, S_KINDS * S_REASONS, why, why_len);
    c->requests = kvedge_metrics_family(r, C, "kvedge_proxy_requests_total",
                                        "Client requests, by opcode and status.", os, 2, NULL,
                                        S_OPS * (S_STATUS + 1), why, why_len);
    c->fetches = kvedge_metrics_family(r, C, "kvedge_proxy_fetches_total",
                                       "FETCH requests ended, by status (OK: every layer was "
                                       "reported).",
                                       res, 1, NULL, S_STATUS + 1, why, why_len);
    c->plan_h =
        s_hist(r, "kvedge_proxy_fetch_plan_seconds", "Time from a FETCH's arrival to its plan.",
               &kvedge_histogram_latency_us, why, why_len);
    c->first_h = s_hist(r, "kvedge_proxy_fetch_first_layer_seconds",
                        "Time from a FETCH's arrival to its first layer with data (what TTFT "
                        "waits for).",
                        &kvedge_histogram_latency_us, why, why_len);
    c->last_h = s_hist(r, "kvedge_proxy_fetch_last_layer_seconds",
                       "Time from a FETCH's arrival to its last layer's record.",
                       &kvedge_histogram_latency_us, why, why_len);
    c->planned_h = s_hist(r, "kvedge_proxy_fetch_planned_seconds",
                          "The plan's own estimate T (Eq. 20) of each FETCH.",
                          &kvedge_histogram_latency_us, why, why_len);
    c->ratio_h = s_hist(r, "kvedge_proxy_fetch_actual_to_plan_ratio",
                        "Time to the last layer divided by the plan's T (1: as planned).",
                        &s_ratio_spec, why, why_len);
    c->mapped = kvedge_metrics_single(r, C, "kvedge_proxy_mapped_layers_total",
                                      "Layers delivered from a mapped model's layer standing in "
                                      "for the requested model's (large-small).",
                                      NULL, why, why_len);
    c->g.up = kvedge_metrics_family(r, G, "kvedge_proxy_source_up",
                                    "1 when the source is connected and not down.", sk, 2, NULL, S,
                                    why, why_len);
    c->g.state = kvedge_metrics_family(r, G, "kvedge_proxy_source_state",
                                       "Health state of each source: 0 up, 1 suspect, 2 down.", sk,
                                       2, NULL, S, why, why_len);
    c->g.rtt = kvedge_metrics_family(r, G, "kvedge_proxy_source_rtt_seconds",
                                     "Round trip the planner prices each source at (measured, "
                                     "else the master's link record, else declared).",
                                     sk, 2, NULL, S, why, why_len);
    c->g.rto = kvedge_metrics_family(
        r, G, "kvedge_proxy_source_rto_seconds",
        "Retransmission timeout of each source (RFC 6298 SRTT + 4 RTTVAR of its measured round "
        "trips): what a layer stream's silence window allows per round trip; 0 before a sample.",
        sk, 2, NULL, S, why, why_len);
    c->g.bw = kvedge_metrics_family(r, G, "kvedge_proxy_source_bandwidth_bytes_per_second",
                                    "Bandwidth the planner prices each source at.", sk, 2, NULL, S,
                                    why, why_len);
    c->g.node_alive = kvedge_metrics_family(
        r, G, "kvedge_proxy_registry_node_alive",
        "Nodes the Storage Master lists: 1 while their lease is alive, 0 once it lapsed.", nr, 2,
        NULL, KVEDGE_COLLAB_MAX_NODES, why, why_len);
    c->g.sync_missing = kvedge_metrics_family(
        r, G, "kvedge_proxy_history_chunks_missing",
        "Historical cache behind each history source: chunks on the cloud not complete there.", sub,
        1, NULL, S, why, why_len);
    c->g.sync_age = kvedge_metrics_family(
        r, G, "kvedge_proxy_history_last_success_age_seconds",
        "Historical cache: seconds since its last complete pass (history sources).", sub, 1, NULL,
        S, why, why_len);
    c->g.buffered = kvedge_metrics_single(r, G, "kvedge_proxy_buffered_bytes",
                                          "Block bytes held for clients now.", NULL, why, why_len);
    c->g.fetches_open = kvedge_metrics_single(r, G, "kvedge_proxy_fetches_in_progress",
                                              "FETCH requests open now.", NULL, why, why_len);
    c->g.master_synced = kvedge_metrics_single(
        r, G, "kvedge_proxy_master_synced",
        "1 when the replica of the master's registry is in sync (absent without a master).", NULL,
        why, why_len);
    c->g.registry_nodes =
        kvedge_metrics_single(r, G, "kvedge_proxy_registry_nodes",
                              "Nodes the master's registry lists.", NULL, why, why_len);
    if (!c->src_bytes || !c->src_layers || !c->transitions || !c->layers || !c->requests ||
        !c->fetches || !c->mapped || !c->plan_h || !c->first_h || !c->last_h || !c->planned_h ||
        !c->ratio_h || !c->g.up || !c->g.state || !c->g.rtt || !c->g.rto || !c->g.bw ||
        !c->g.node_alive || !c->g.sync_missing || !c->g.sync_age || !c->g.buffered ||
        !c->g.fetches_open || !c->g.master_synced || !c->g.registry_nodes) {
        kvedge_collab_destroy(&c);
        return NULL;
    }
    for (int k = 0; k < S_KINDS; k++)
        for (int re = 1; re < S_REASONS; re++) {
            const char *v[] = {s_kind(k == S_KINDS - 1 ? -1 : k),
                               kvedge_fetch_reason_name((kvedge_fetch_reason_t)re)};
            c->layer[k][re] = kvedge_metric_series(c->layers, v, 2);
        }
    return c;
}

void kvedge_collab_destroy(kvedge_collab_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    pthread_mutex_destroy(&(*self_p)->mu);
    free(*self_p);
    *self_p = NULL;
}

void kvedge_collab_set_recording(kvedge_collab_t *c, bool on)
{
    if (c)
        c->off = !on;
}

void kvedge_collab_source(kvedge_collab_t *c, int i, const char *name, kvedge_plan_kind_t kind)
{
    if (!c || i < 0 || i >= KVEDGE_PROXY_MAX_SOURCES)
        return;
    const char *v[] = {name, s_kind((int)kind)};
    c->sb[i] = kvedge_metric_series(c->src_bytes, v, 2);
    c->sl[i] = kvedge_metric_series(c->src_layers, v, 2);
}

void kvedge_collab_transition(kvedge_collab_t *c, const char *name, int from, int to,
                              const char *reason)
{
    if (!c || !name)
        return;
    const char *v[] = {name, s_state(to)};
    kvedge_series_inc(kvedge_metric_series(c->transitions, v, 2));
    pthread_mutex_lock(&c->mu);
    s_transition_t *t = &c->ring[c->n_transitions++ % KVEDGE_COLLAB_TRANSITIONS];
    t->wall_ms = (uint64_t)kvedge_wall_ms();
    snprintf(t->name, sizeof t->name, "%s", name);
    t->from = from;
    t->to = to;
    snprintf(t->reason, sizeof t->reason, "%s", reason ? reason : "");
    pthread_mutex_unlock(&c->mu);
}

void kvedge_collab_layer(kvedge_collab_t *c, int src, kvedge_plan_kind_t kind, int reason,
                         uint64_t bytes)
{
    if (!c || c->off)
        return;
    int k = src >= 0 && (int)kind >= 0 && kind < 4 ? (int)kind : S_KINDS - 1;
    int re = reason > 0 && reason < S_REASONS ? reason : 0;
    if (re)
        kvedge_series_inc(c->layer[k][re]);
    if (src >= 0 && src < KVEDGE_PROXY_MAX_SOURCES) {
        kvedge_series_inc(c->sl[src]);
        kvedge_series_add(c->sb[src], bytes);
    }
}

void kvedge_collab_mapped(kvedge_collab_t *c)
{
    if (c && !c->off)
        kvedge_series_inc(c->mapped);
}

/* A slot per kvedge code (kvedge_err_index); slot S_STATUS - 1 is unused by them (they end
 * near 25): cancellations go there. */
static size_t s_status_index(int status)
{
    if (status == KVEDGE_COLLAB_CANCELLED)
        return S_STATUS - 1;
    int i = kvedge_err_index(status);
    return i >= 0 && i < S_STATUS - 1 ? (size_t)i : S_STATUS;
}

void kvedge_collab_fetch(kvedge_collab_t *c, const kvedge_collab_fetch_t *f)
{
    if (!c || !f || c->off)
        return;
    const char *v[] = {s_status(f->status)};
    kvedge_series_inc(
        kvedge_metric_series_at(c->fetches, &c->fetch_status[s_status_index(f->status)], v, 1));
    if (f->status != 0)
        return;
    kvedge_series_observe(c->plan_h, f->plan_us);
    if (f->first_us)
        kvedge_series_observe(c->first_h, f->first_us);
    kvedge_series_observe(c->last_h, f->last_us);
    kvedge_series_observe(c->planned_h, (uint64_t)(f->planned_us > 0 ? f->planned_us : 0));
    if (f->planned_us >= 1)
        kvedge_series_observe(c->ratio_h, (uint64_t)((double)f->last_us * 1e3 / f->planned_us));
}

void kvedge_collab_request(kvedge_collab_t *c, int op, int status)
{
    if (!c || c->off)
        return;
    int o = op > 0 && op < S_OPS ? op : 0;
    const char *name = kvedge_wire_op_name(o);
    const char *v[] = {name ? name : "UNKNOWN", s_status(status)};
    kvedge_series_inc(
        kvedge_metric_series_at(c->requests, &c->req[o][s_status_index(status)], v, 2));
}

const kvedge_collab_gauges_t *kvedge_collab_gauges(kvedge_collab_t *c)
{
    return c ? &c->g : NULL;
}

/* ---------------------------------------------------------------- JSON */

static void s_json_hist(cJSON *obj, const char *name, const kvedge_series_t *s)
{
    const kvedge_histogram_spec_t *spec = &kvedge_histogram_latency_us;
    uint64_t cum[KVEDGE_METRICS_MAX_BUCKETS], sum = 0;
    uint64_t n = kvedge_series_hist(s, &sum, cum, spec->buckets);
    cJSON *h = cJSON_AddObjectToObject(obj, name);
    cJSON_AddNumberToObject(h, "count", (double)n);
    cJSON_AddNumberToObject(h, "sum_us", (double)sum);
    cJSON *b = cJSON_AddArrayToObject(h, "buckets");
    for (uint32_t i = 0; b && i < spec->buckets; i++)
        cJSON_AddItemToArray(b, cJSON_CreateNumber((double)cum[i]));
}

int kvedge_collab_json(kvedge_collab_t *c, cJSON *obj)
{
    if (!c)
        return 0;
    cJSON *layers = cJSON_AddArrayToObject(obj, "layers");
    for (int k = 0; layers && k < S_KINDS; k++)
        for (int re = 1; re < S_REASONS; re++) {
            double v = kvedge_series_value(c->layer[k][re]);
            if (v <= 0)
                continue;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "kind", s_kind(k == S_KINDS - 1 ? -1 : k));
            cJSON_AddStringToObject(e, "reason",
                                    kvedge_fetch_reason_name((kvedge_fetch_reason_t)re));
            cJSON_AddNumberToObject(e, "count", v);
            cJSON_AddItemToArray(layers, e);
        }
    cJSON *fetch = cJSON_AddObjectToObject(obj, "fetch");
    double ok = 0, failed = 0;
    for (size_t i = 0; i <= S_STATUS; i++) {
        kvedge_series_t *s = atomic_load_explicit(&c->fetch_status[i], memory_order_acquire);
        if (s)
            *(i == 0 ? &ok : &failed) += kvedge_series_value(s);
    }
    cJSON_AddNumberToObject(fetch, "ok", ok);
    cJSON_AddNumberToObject(fetch, "failed", failed);
    cJSON *les = cJSON_AddArrayToObject(fetch, "le_us");
    for (uint32_t b = 0; les && b < kvedge_histogram_latency_us.buckets; b++)
        cJSON_AddItemToArray(
            les, cJSON_CreateNumber((double)(kvedge_histogram_latency_us.first_le << b)));
    s_json_hist(fetch, "plan", c->plan_h);
    s_json_hist(fetch, "first_layer", c->first_h);
    s_json_hist(fetch, "last_layer", c->last_h);
    s_json_hist(fetch, "planned", c->planned_h);
    uint64_t rc[KVEDGE_METRICS_MAX_BUCKETS], rsum = 0;
    uint64_t rn = kvedge_series_hist(c->ratio_h, &rsum, rc, s_ratio_spec.buckets);
    cJSON_AddNumberToObject(fetch, "actual_to_plan_median",
                            rn ? kvedge_histogram_quantile(&s_ratio_spec, rc, rn, 0.5) / 1e3 : 0);
    cJSON *tr = cJSON_AddArrayToObject(obj, "transitions");
    pthread_mutex_lock(&c->mu);
    uint64_t n = c->n_transitions,
             from = n > KVEDGE_COLLAB_TRANSITIONS ? n - KVEDGE_COLLAB_TRANSITIONS : 0;
    for (uint64_t i = from; tr && i < n; i++) {
        const s_transition_t *t = &c->ring[i % KVEDGE_COLLAB_TRANSITIONS];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "time_ms", (double)t->wall_ms);
        cJSON_AddStringToObject(e, "source", t->name);
        cJSON_AddStringToObject(e, "from", s_state(t->from));
        cJSON_AddStringToObject(e, "to", s_state(t->to));
        cJSON_AddStringToObject(e, "reason", t->reason);
        cJSON_AddItemToArray(tr, e);
    }
    pthread_mutex_unlock(&c->mu);
    cJSON_AddNumberToObject(obj, "transitions_total", (double)n);
    return layers && fetch && tr ? 0 : -1;
}
