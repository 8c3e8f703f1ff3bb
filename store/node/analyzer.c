/* The store node's I/O Analyzer: metric families, hot tables and their JSON view. */
#include "store/node/analyzer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/frame.h"
#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/errwire.h"

#define S_OPS      (KVEDGE_OP_MONITOR + 1)
#define S_STATUSES 32 /* a slot per kvedge code (kvedge_err_index); others count as "other" */
#define S_SCHEMES  6  /* lossless, int8, int4, each whole or pruned (ThinK mask) */

struct kvedge_analyzer_t {
    kvedge_metrics_t *reg;
    kvedge_metric_t *requests, *latency, *in_bytes, *out_bytes, *hits, *misses, *served,
        *quarantined, *tenant_requests, *tenant_stored;
    /* Series found once (lazily for requests and misses: filled races are benign, both
     * threads get the same pointer). */
    _Atomic(kvedge_series_t *) req[S_OPS][S_STATUSES + 1];
    _Atomic(kvedge_series_t *) miss[S_STATUSES + 1];
    kvedge_series_t *lat[S_OPS], *in[S_OPS], *out[S_OPS], *hit, *scheme[S_SCHEMES], *quar;
    /* Tenants seen, for the JSON view (bounded: the family folds the rest). */
    pthread_mutex_t tenants_mu;
    size_t n_tenants;
    struct {
        char name[KVEDGE_METRICS_LABEL_VALUE_MAX + 1];
        kvedge_analyzer_tenant_t s;
    } tenants[KVEDGE_ANALYZER_MAX_TENANTS + 1];
    size_t shards;
    kvedge_hot_t **hot;
};

static const char *const s_scheme_names[S_SCHEMES] = {"lossless",       "int8",       "int4",
                                                      "lossless+think", "int8+think", "int4+think"};

static const char *s_op_label(int op)
{
    const char *n = kvedge_wire_op_name(op);
    return n ? n : "UNKNOWN";
}

static size_t s_status_index(int status)
{
    int i = kvedge_err_index(status);
    return i >= 0 && i < S_STATUSES ? (size_t)i : S_STATUSES;
}

static const char *s_status_label(int status)
{
    if (s_status_index(status) == S_STATUSES)
        return "other";
    /* "KVEDGE_ENOTFOUND" -> "ENOTFOUND"; 0 -> "OK" */
    const char *n = kvedge_errname(status);
    return strncmp(n, "KVEDGE_", 7) == 0 ? n + 7 : n;
}

kvedge_analyzer_t *kvedge_analyzer_new(kvedge_metrics_t *r, size_t shards, char *why,
                                       size_t why_len)
{
    if (!r || shards < 1 || shards > 1024) {
        if (why)
            snprintf(why, why_len, "analyzer: a registry and 1 ... 1024 shards are needed");
        return NULL;
    }
    kvedge_analyzer_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->reg = r;
    pthread_mutex_init(&a->tenants_mu, NULL);
    const char *op[] = {"op"}, *op_status[] = {"op", "status"}, *reason[] = {"reason"},
               *scheme[] = {"scheme"}, *tenant[] = {"tenant"};
    a->requests = kvedge_metrics_family(
        r, KVEDGE_METRIC_COUNTER, "kvedge_node_requests_total",
        "Requests answered, by opcode and status (GET_LAYER: once per stream).", op_status, 2, NULL,
        S_OPS * (S_STATUSES + 1), why, why_len);
    a->latency = kvedge_metrics_family(
        r, KVEDGE_METRIC_HISTOGRAM, "kvedge_node_request_duration_seconds",
        "Time from a request's arrival to its answer (GET_LAYER: to the stream's end), by opcode.",
        op, 1, &kvedge_histogram_latency_us, S_OPS, why, why_len);
    a->in_bytes = kvedge_metrics_family(
        r, KVEDGE_METRIC_COUNTER, "kvedge_node_received_bytes_total",
        "Request payload bytes received, by opcode.", op, 1, NULL, S_OPS, why, why_len);
    a->out_bytes = kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "kvedge_node_sent_bytes_total",
                                         "Reply payload bytes sent, by opcode.", op, 1, NULL, S_OPS,
                                         why, why_len);
    a->hits = kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "kvedge_node_block_hits_total",
                                    "Blocks read for a client and sent (GET, GET_LAYER).", NULL, 0,
                                    NULL, 1, why, why_len);
    a->misses = kvedge_metrics_family(
        r, KVEDGE_METRIC_COUNTER, "kvedge_node_block_misses_total",
        "Blocks asked for and not sent, by reason (ENOTFOUND, ECORRUPT, EEXPIRED, ETOOBIG, ...).",
        reason, 1, NULL, S_STATUSES + 1, why, why_len);
    a->served = kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "kvedge_node_served_bytes_total",
                                      "Block bytes sent to clients, by the block's scheme.", scheme,
                                      1, NULL, S_SCHEMES, why, why_len);
    a->quarantined = kvedge_metrics_family(
        r, KVEDGE_METRIC_COUNTER, "kvedge_node_quarantined_total",
        "Blocks moved to quarantine because a client read failed verification.", NULL, 0, NULL, 1,
        why, why_len);
    a->tenant_requests =
        kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "kvedge_node_tenant_requests_total",
                              "Requests by tenant (at most 64 tenants; the rest count as _other).",
                              tenant, 1, NULL, KVEDGE_ANALYZER_MAX_TENANTS, why, why_len);
    a->tenant_stored = kvedge_metrics_family(
        r, KVEDGE_METRIC_COUNTER, "kvedge_node_tenant_stored_bytes_total",
        "Block bytes stored by PUT, by tenant (at most 64 tenants; the rest count as _other).",
        tenant, 1, NULL, KVEDGE_ANALYZER_MAX_TENANTS, why, why_len);
    if (!a->requests || !a->latency || !a->in_bytes || !a->out_bytes || !a->hits || !a->misses ||
        !a->served || !a->quarantined || !a->tenant_requests || !a->tenant_stored) {
        kvedge_analyzer_destroy(&a);
        return NULL;
    }
    for (int i = 1; i < S_OPS; i++) {
        const char *v[] = {s_op_label(i)};
        a->lat[i] = kvedge_metric_series(a->latency, v, 1);
        a->in[i] = kvedge_metric_series(a->in_bytes, v, 1);
        a->out[i] = kvedge_metric_series(a->out_bytes, v, 1);
    }
    a->hit = kvedge_metric_plain(a->hits);
    a->quar = kvedge_metric_plain(a->quarantined);
    for (int i = 0; i < S_SCHEMES; i++) {
        const char *v[] = {s_scheme_names[i]};
        a->scheme[i] = kvedge_metric_series(a->served, v, 1);
    }
    a->shards = shards;
    a->hot = calloc(shards, sizeof *a->hot);
    for (size_t i = 0; a->hot && i < shards; i++)
        if (!(a->hot[i] = kvedge_hot_new(KVEDGE_ANALYZER_HOT_CAPACITY)))
            break;
    if (!a->hot || !a->hot[shards - 1]) {
        if (why)
            snprintf(why, why_len, "analyzer: out of memory");
        kvedge_analyzer_destroy(&a);
        return NULL;
    }
    return a;
}

void kvedge_analyzer_destroy(kvedge_analyzer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_analyzer_t *a = *self_p;
    for (size_t i = 0; a->hot && i < a->shards; i++)
        kvedge_hot_destroy(&a->hot[i]);
    free(a->hot);
    pthread_mutex_destroy(&a->tenants_mu);
    free(a); /* the families belong to the registry */
    *self_p = NULL;
}

void kvedge_analyzer_request(kvedge_analyzer_t *a, int op, int status, uint64_t latency_us,
                             uint64_t in_bytes, uint64_t out_bytes)
{
    if (!a)
        return;
    int o = op > 0 && op < S_OPS ? op : 0;
    size_t si = s_status_index(status);
    const char *v[] = {s_op_label(o), s_status_label(status)};
    kvedge_series_inc(kvedge_metric_series_at(a->requests, &a->req[o][si], v, 2));
    if (o == 0)
        return;
    kvedge_series_observe(a->lat[o], latency_us);
    kvedge_series_add(a->in[o], in_bytes);
    kvedge_series_add(a->out[o], out_bytes);
}

void kvedge_analyzer_read(kvedge_analyzer_t *a, int status, const uint8_t *block, size_t len)
{
    if (!a)
        return;
    if (status != 0) {
        const char *v[] = {s_status_label(status)};
        kvedge_series_inc(
            kvedge_metric_series_at(a->misses, &a->miss[s_status_index(status)], v, 1));
        return;
    }
    kvedge_series_inc(a->hit);
    /* The scheme byte and the mask flag of the block header (docs/block-format.md). */
    if (block && len >= 8 && block[6] <= KVEDGE_SCHEME_INT4)
        kvedge_series_add(a->scheme[block[6] + (block[7] & KVEDGE_BLOCK_FLAG_MASK ? 3 : 0)], len);
}

void kvedge_analyzer_touch(kvedge_analyzer_t *a, size_t shard, const kvedge_chunk_id_t *id,
                           const char *model, uint32_t layer, uint32_t head, uint64_t bytes)
{
    if (!a || !id)
        return;
    kvedge_hot_touch(a->hot[shard < a->shards ? shard : 0], id->bytes, model, layer, head, bytes);
}

void kvedge_analyzer_quarantine(kvedge_analyzer_t *a)
{
    if (a)
        kvedge_series_inc(a->quar);
}

void kvedge_analyzer_tenant(kvedge_analyzer_t *a, const char *name, kvedge_analyzer_tenant_t *out)
{
    memset(out, 0, sizeof *out);
    if (!a || !name)
        return;
    pthread_mutex_lock(&a->tenants_mu);
    for (size_t i = 0; i < a->n_tenants; i++)
        if (strncmp(a->tenants[i].name, name, KVEDGE_METRICS_LABEL_VALUE_MAX) == 0) {
            *out = a->tenants[i].s;
            pthread_mutex_unlock(&a->tenants_mu);
            return;
        }
    const char *v[] = {name};
    out->requests = kvedge_metric_series(a->tenant_requests, v, 1);
    out->stored_bytes = kvedge_metric_series(a->tenant_stored, v, 1);
    size_t slot =
        a->n_tenants < KVEDGE_ANALYZER_MAX_TENANTS ? a->n_tenants++ : KVEDGE_ANALYZER_MAX_TENANTS;
    if (slot == KVEDGE_ANALYZER_MAX_TENANTS)
        name = KVEDGE_METRICS_OTHER; /* the families fold it too */
    snprintf(a->tenants[slot].name, sizeof a->tenants[slot].name, "%s", name);
    a->tenants[slot].s = *out;
    pthread_mutex_unlock(&a->tenants_mu);
}

size_t kvedge_analyzer_top(kvedge_analyzer_t *a, kvedge_hot_entry_t *out, size_t n)
{
    if (!a || !out || n == 0)
        return 0;
    return kvedge_hot_top(a->hot, a->shards, out, n);
}

/* ---------------------------------------------------------------- JSON */

static void s_hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static cJSON *s_counts(const uint32_t *c, size_t n)
{
    /* [[index, count], ...] for the slots that were used. */
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++) {
        if (c[i] == 0)
            continue;
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)i));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)c[i]));
        cJSON_AddItemToArray(arr, pair);
    }
    return arr;
}

static int s_json_hot(kvedge_analyzer_t *a, cJSON *obj, size_t top)
{
    cJSON *hot = cJSON_AddObjectToObject(obj, "hot");
    if (!hot)
        return -1;
    uint64_t total = 0;
    size_t bytes = 0;
    for (size_t i = 0; i < a->shards; i++) {
        total += kvedge_hot_total(a->hot[i]);
        bytes += kvedge_hot_bytes(a->hot[i]);
    }
    cJSON_AddNumberToObject(hot, "accesses", (double)total);
    cJSON_AddNumberToObject(hot, "capacity", (double)(KVEDGE_ANALYZER_HOT_CAPACITY * a->shards));
    cJSON_AddNumberToObject(hot, "memory_bytes", (double)bytes);
    cJSON *arr = cJSON_AddArrayToObject(hot, "prefixes");
    kvedge_hot_entry_t *e = top ? calloc(top, sizeof *e) : NULL;
    size_t n = e ? kvedge_analyzer_top(a, e, top) : 0;
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *p = cJSON_CreateObject();
        char hex[2 * KVEDGE_HOT_KEY_BYTES + 1];
        s_hex(e[i].key, KVEDGE_HOT_KEY_BYTES, hex);
        cJSON_AddStringToObject(p, "id", hex);
        cJSON_AddStringToObject(p, "model", e[i].label);
        cJSON_AddNumberToObject(p, "count", (double)e[i].count);
        cJSON_AddNumberToObject(p, "error", (double)e[i].error);
        cJSON_AddNumberToObject(p, "bytes", (double)e[i].bytes);
        cJSON_AddItemToObject(p, "layers", s_counts(e[i].layers, KVEDGE_HOT_LAYERS));
        cJSON_AddItemToObject(p, "heads", s_counts(e[i].heads, KVEDGE_HOT_HEADS));
        cJSON_AddItemToArray(arr, p);
    }
    free(e);
    return arr ? 0 : -1;
}

int kvedge_analyzer_json(kvedge_analyzer_t *a, cJSON *obj, size_t top)
{
    if (!a || !obj)
        return a ? -1 : 0;
    cJSON *req = cJSON_AddArrayToObject(obj, "requests");
    cJSON *lat = cJSON_AddArrayToObject(obj, "latency");
    const kvedge_histogram_spec_t *spec = &kvedge_histogram_latency_us;
    cJSON *les = cJSON_AddArrayToObject(obj, "latency_le_us");
    for (uint32_t b = 0; les && b < spec->buckets; b++)
        cJSON_AddItemToArray(les, cJSON_CreateNumber((double)(spec->first_le << b)));
    uint64_t in = 0, out = 0;
    for (int o = 0; req && lat && o < S_OPS; o++) {
        for (size_t si = 0; si <= S_STATUSES; si++) {
            kvedge_series_t *s = atomic_load_explicit(&a->req[o][si], memory_order_acquire);
            double v = s ? kvedge_series_value(s) : 0;
            if (v <= 0)
                continue;
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "op", s_op_label(o));
            cJSON_AddStringToObject(
                r, "status",
                si == S_STATUSES ? "other" : s_status_label(kvedge_err_from_wire(-(int32_t)si)));
            cJSON_AddNumberToObject(r, "count", v);
            cJSON_AddItemToArray(req, r);
        }
        if (o == 0)
            continue;
        in += (uint64_t)kvedge_series_value(a->in[o]);
        out += (uint64_t)kvedge_series_value(a->out[o]);
        uint64_t cum[KVEDGE_METRICS_MAX_BUCKETS], sum = 0;
        uint64_t count = kvedge_series_hist(a->lat[o], &sum, cum, spec->buckets);
        if (count == 0)
            continue;
        cJSON *l = cJSON_CreateObject();
        cJSON_AddStringToObject(l, "op", s_op_label(o));
        cJSON_AddNumberToObject(l, "count", (double)count);
        cJSON_AddNumberToObject(l, "sum_us", (double)sum);
        cJSON *b = cJSON_AddArrayToObject(l, "buckets");
        for (uint32_t i = 0; b && i < spec->buckets; i++)
            cJSON_AddItemToArray(b, cJSON_CreateNumber((double)cum[i]));
        cJSON_AddItemToArray(lat, l);
    }
    cJSON *bytes = cJSON_AddObjectToObject(obj, "bytes");
    cJSON_AddNumberToObject(bytes, "in", (double)in);
    cJSON_AddNumberToObject(bytes, "out", (double)out);
    cJSON *reads = cJSON_AddObjectToObject(obj, "reads");
    cJSON_AddNumberToObject(reads, "hits", kvedge_series_value(a->hit));
    cJSON *misses = cJSON_AddObjectToObject(reads, "misses");
    for (size_t si = 1; misses && si <= S_STATUSES; si++) {
        kvedge_series_t *s = atomic_load_explicit(&a->miss[si], memory_order_acquire);
        if (s && kvedge_series_value(s) > 0)
            cJSON_AddNumberToObject(
                misses,
                si == S_STATUSES ? "other" : s_status_label(kvedge_err_from_wire(-(int32_t)si)),
                kvedge_series_value(s));
    }
    cJSON_AddNumberToObject(reads, "quarantined", kvedge_series_value(a->quar));
    cJSON *served = cJSON_AddObjectToObject(obj, "served_bytes");
    for (int i = 0; served && i < S_SCHEMES; i++)
        cJSON_AddNumberToObject(served, s_scheme_names[i], kvedge_series_value(a->scheme[i]));
    cJSON *tenants = cJSON_AddArrayToObject(obj, "tenants");
    pthread_mutex_lock(&a->tenants_mu);
    size_t nt = a->n_tenants + (a->tenants[KVEDGE_ANALYZER_MAX_TENANTS].s.requests ? 1 : 0);
    for (size_t i = 0; tenants && i < nt; i++) {
        size_t k = i < a->n_tenants ? i : KVEDGE_ANALYZER_MAX_TENANTS;
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "tenant", a->tenants[k].name);
        cJSON_AddNumberToObject(t, "requests", kvedge_series_value(a->tenants[k].s.requests));
        cJSON_AddNumberToObject(t, "stored_bytes",
                                kvedge_series_value(a->tenants[k].s.stored_bytes));
        cJSON_AddItemToArray(tenants, t);
    }
    pthread_mutex_unlock(&a->tenants_mu);
    if (!req || !lat || !les || !bytes || !reads || !misses || !served || !tenants)
        return -1;
    return s_json_hot(a, obj, top);
}
