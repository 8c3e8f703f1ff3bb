/* A MONITOR document parsed into kvedge_top_doc_t: every field is read through one typed
 * getter, so a peer's wrong type or missing field leaves zero or empty, never a crash. */
#include "clients/cli/top_doc.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "access/frame.h"
#include "access/codec/error.h"

/* ---------------------------------------------------------------- typed getters */

static const cJSON *s_get(const cJSON *o, const char *key)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

/* A count: a finite number >= 0, saturated at UINT64_MAX; anything else is 0. */
static uint64_t s_count_of(const cJSON *v)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
        return 0;
    if (v->valuedouble >= 18446744073709551615.0)
        return UINT64_MAX;
    return (uint64_t)v->valuedouble;
}

static uint64_t s_u64(const cJSON *o, const char *key)
{
    return s_count_of(s_get(o, key));
}

/* A measure (rtt, bandwidth, weight, ratio): finite and >= 0, else 0. */
static double s_real(const cJSON *o, const char *key)
{
    const cJSON *v = s_get(o, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
        return 0;
    return v->valuedouble;
}

static bool s_bool(const cJSON *o, const char *key)
{
    return cJSON_IsTrue(s_get(o, key));
}

static uint64_t s_sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* The length of the valid UTF-8 sequence at p (n bytes left), or 0 when the bytes there are
 * not one. C1 control characters (U+0080 ... U+009F) count as invalid: some terminals act on
 * them. */
static size_t s_utf8_len(const unsigned char *p, size_t n)
{
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (p[0] >= 0xC2 && p[0] <= 0xDF)
        len = 2;
    else if (p[0] >= 0xE0 && p[0] <= 0xEF)
        len = 3;
    else if (p[0] >= 0xF0 && p[0] <= 0xF4)
        len = 4;
    else
        return 0;
    if (p[0] == 0xE0)
        lo = 0xA0;
    else if (p[0] == 0xED)
        hi = 0x9F;
    else if (p[0] == 0xF0)
        lo = 0x90;
    else if (p[0] == 0xF4)
        hi = 0x8F;
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    if (p[0] == 0xC2 && p[1] <= 0x9F)
        return 0;
    return len;
}

/* Copies src into buf (cap bytes with the NUL), cut at a character boundary; control
 * characters and bytes that are not UTF-8 become '?'. */
static void s_copy(const char *src, char *buf, size_t cap)
{
    if (cap == 0)
        return;
    size_t n = strlen(src), in = 0, out = 0;
    const unsigned char *p = (const unsigned char *)src;
    while (in < n) {
        size_t len = p[in] >= 0x80 ? s_utf8_len(p + in, n - in) : 1;
        if (out + (len ? len : 1) > cap - 1)
            break;
        if (len == 0 || (len == 1 && (p[in] < 0x20 || p[in] == 0x7F))) {
            buf[out++] = '?';
            in++;
            continue;
        }
        memcpy(buf + out, p + in, len);
        out += len;
        in += len;
    }
    buf[out] = '\0';
}

static void s_str(const cJSON *o, const char *key, char *buf, size_t cap)
{
    const cJSON *v = s_get(o, key);
    if (cJSON_IsString(v) && v->valuestring)
        s_copy(v->valuestring, buf, cap);
    else if (cap)
        buf[0] = '\0';
}

#define S_STR(o, key, field) s_str((o), (key), (field), sizeof(field))

/* The array under key, or NULL (cJSON_ArrayForEach then walks nothing). */
static const cJSON *s_array(const cJSON *o, const char *key)
{
    const cJSON *v = s_get(o, key);
    return cJSON_IsArray(v) ? v : NULL;
}

/* The object under key, or NULL. */
static const cJSON *s_object(const cJSON *o, const char *key)
{
    const cJSON *v = s_get(o, key);
    return cJSON_IsObject(v) ? v : NULL;
}

/* Up to cap counts of an array of numbers; returns how many. */
static uint32_t s_numbers(const cJSON *arr, uint64_t *out, uint32_t cap)
{
    uint32_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        if (n == cap)
            break;
        out[n++] = s_count_of(e);
    }
    return n;
}

static void s_hist(const cJSON *o, kvedge_top_hist_t *h)
{
    h->count = s_u64(o, "count");
    h->sum_us = s_u64(o, "sum_us");
    h->nbuckets = s_numbers(s_array(o, "buckets"), h->buckets, KVEDGE_TOP_DOC_MAX_BUCKETS);
}

/* [[index, count], ...] into counts[0 ... cap): indexes past the end count in the last slot,
 * as the daemon's hot table does. */
static void s_pairs(const cJSON *arr, uint64_t *counts, size_t cap)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        const cJSON *i = cJSON_IsArray(e) ? cJSON_GetArrayItem(e, 0) : NULL;
        const cJSON *c = cJSON_IsArray(e) ? cJSON_GetArrayItem(e, 1) : NULL;
        if (!cJSON_IsNumber(i) || !cJSON_IsNumber(c) || !isfinite(i->valuedouble) ||
            i->valuedouble < 0)
            continue;
        size_t k = i->valuedouble >= (double)(cap - 1) ? cap - 1 : (size_t)i->valuedouble;
        counts[k] = s_sat_add(counts[k], s_count_of(c));
    }
}

/* ---------------------------------------------------------------- node */

static kvedge_top_op_t *s_op(kvedge_top_doc_t *d, const cJSON *e)
{
    const cJSON *v = s_get(e, "op");
    if (!cJSON_IsString(v) || !v->valuestring)
        return NULL;
    char name[KVEDGE_TOP_DOC_SHORT_BYTES];
    s_copy(v->valuestring, name, sizeof name);
    for (uint32_t i = 0; i < d->node.nops; i++)
        if (strcmp(d->node.ops[i].op, name) == 0)
            return &d->node.ops[i];
    if (d->node.nops == KVEDGE_TOP_DOC_MAX_OPS)
        return NULL;
    kvedge_top_op_t *op = &d->node.ops[d->node.nops++];
    memcpy(op->op, name, sizeof name);
    return op;
}

static void s_node_analyzer(const cJSON *root, kvedge_top_doc_t *d)
{
    const cJSON *e;
    d->node.analyzer = cJSON_IsArray(s_get(root, "requests"));
    cJSON_ArrayForEach(e, s_array(root, "requests"))
    {
        kvedge_top_op_t *op = s_op(d, e);
        if (!op)
            continue;
        uint64_t n = s_u64(e, "count");
        const cJSON *st = s_get(e, "status");
        op->requests = s_sat_add(op->requests, n);
        if (!cJSON_IsString(st) || strcmp(st->valuestring, "OK") != 0)
            op->errors = s_sat_add(op->errors, n);
    }
    cJSON_ArrayForEach(e, s_array(root, "latency"))
    {
        kvedge_top_op_t *op = s_op(d, e);
        if (op)
            s_hist(e, &op->latency);
    }
    d->node.nle =
        s_numbers(s_array(root, "latency_le_us"), d->node.le_us, KVEDGE_TOP_DOC_MAX_BUCKETS);
    const cJSON *bytes = s_get(root, "bytes"), *reads = s_get(root, "reads");
    d->node.bytes_in = s_u64(bytes, "in");
    d->node.bytes_out = s_u64(bytes, "out");
    d->node.hits = s_u64(reads, "hits");
    d->node.quarantined_reads = s_u64(reads, "quarantined");
    const cJSON *misses = s_object(reads, "misses");
    cJSON_ArrayForEach(e, misses)
    {
        uint64_t n = s_count_of(e);
        d->node.misses = s_sat_add(d->node.misses, n);
        if (d->node.nmiss_reasons < KVEDGE_TOP_DOC_MAX_REASONS && e->string) {
            kvedge_top_count_t *c = &d->node.miss_reasons[d->node.nmiss_reasons++];
            s_copy(e->string, c->a, sizeof c->a);
            c->count = n;
        }
    }
    const cJSON *served = s_object(root, "served_bytes");
    cJSON_ArrayForEach(e, served)
    {
        if (d->node.nschemes == KVEDGE_TOP_DOC_MAX_SCHEMES)
            break;
        if (!e->string)
            continue;
        kvedge_top_count_t *c = &d->node.served[d->node.nschemes++];
        s_copy(e->string, c->a, sizeof c->a);
        c->count = s_count_of(e);
    }
    cJSON_ArrayForEach(e, s_array(root, "tenants"))
    {
        if (d->node.ntenants == KVEDGE_TOP_DOC_MAX_TENANTS)
            break;
        kvedge_top_tenant_t *t = &d->node.tenants[d->node.ntenants++];
        S_STR(e, "tenant", t->tenant);
        t->requests = s_u64(e, "requests");
        t->stored_bytes = s_u64(e, "stored_bytes");
    }
    const cJSON *hot = s_get(root, "hot");
    d->node.hot.accesses = s_u64(hot, "accesses");
    d->node.hot.capacity = s_u64(hot, "capacity");
    d->node.hot.memory_bytes = s_u64(hot, "memory_bytes");
    cJSON_ArrayForEach(e, s_array(hot, "prefixes"))
    {
        if (d->node.hot.nprefixes == KVEDGE_TOP_DOC_MAX_PREFIXES)
            break;
        kvedge_top_prefix_t *p = &d->node.hot.prefixes[d->node.hot.nprefixes++];
        S_STR(e, "id", p->id);
        S_STR(e, "model", p->model);
        p->count = s_u64(e, "count");
        p->error = s_u64(e, "error");
        p->bytes = s_u64(e, "bytes");
        s_pairs(s_array(e, "layers"), p->layers, KVEDGE_TOP_DOC_HOT_LAYERS);
        s_pairs(s_array(e, "heads"), p->heads, KVEDGE_TOP_DOC_HOT_HEADS);
    }
}

static void s_node(const cJSON *root, kvedge_top_doc_t *d)
{
    S_STR(root, "role", d->role);
    s_node_analyzer(root, d);
    const cJSON *st = s_get(root, "store"), *e;
    d->node.has_store = cJSON_IsObject(st);
    d->node.store.blocks = s_u64(st, "blocks");
    d->node.store.bytes = s_u64(st, "bytes");
    d->node.store.fp16_bytes = s_u64(st, "fp16_bytes");
    d->node.store.pinned_blocks = s_u64(st, "pinned_blocks");
    d->node.store.pinned_bytes = s_u64(st, "pinned_bytes");
    d->node.store.capacity_bytes = s_u64(st, "capacity_bytes");
    d->node.store.quarantined = s_u64(st, "quarantined");
    d->node.store.evicted_blocks = s_u64(st, "evicted_blocks");
    d->node.store.expired = s_u64(st, "expired");
    const cJSON *sync = s_get(root, "sync");
    d->node.has_sync = cJSON_IsObject(sync);
    d->node.sync_last_pass_ms = s_u64(sync, "last_pass_ms");
    cJSON_ArrayForEach(e, s_array(sync, "subscriptions"))
    {
        if (d->node.nsubs == KVEDGE_TOP_DOC_MAX_SUBS)
            break;
        kvedge_top_sub_t *s = &d->node.subs[d->node.nsubs++];
        S_STR(e, "name", s->name);
        S_STR(e, "cloud", s->cloud);
        S_STR(e, "state", s->state);
        s->chunks_total = s_u64(e, "chunks_total");
        s->chunks_synced = s_u64(e, "chunks_synced");
        s->blocks_held = s_u64(e, "blocks_held");
        s->last_ok_ms = s_u64(e, "last_ok_ms");
        S_STR(e, "last_error", s->last_error);
    }
    const cJSON *m = s_get(root, "master");
    d->node.has_master = cJSON_IsObject(m);
    S_STR(m, "endpoint", d->node.master.endpoint);
    S_STR(m, "node_id", d->node.master.node_id);
    S_STR(m, "state", d->node.master.state);
    d->node.master.attempts = s_u64(m, "attempts");
    S_STR(m, "why", d->node.master.why);
    S_STR(m, "following", d->node.master.following);
    d->node.master.moves = s_u64(m, "moves");
}

/* ---------------------------------------------------------------- proxy */

static void s_source(const cJSON *e, kvedge_top_source_t *s)
{
    S_STR(e, "name", s->name);
    S_STR(e, "kind", s->kind);
    S_STR(e, "endpoint", s->endpoint);
    S_STR(e, "origin", s->origin);
    s->connected = s_bool(e, "connected");
    S_STR(e, "state", s->state);
    s->weight = s_real(e, "weight");
    s->rtt_us = s_real(e, "rtt_us");
    s->bandwidth = s_real(e, "bandwidth");
    s->failures = s_u64(e, "failures");
    S_STR(e, "last_error", s->last_error);
    const cJSON *h = s_get(e, "history");
    s->has_history = cJSON_IsObject(h);
    S_STR(h, "state", s->history.state);
    s->history.chunks_missing = s_u64(h, "chunks_missing");
    s->history.blocks_held = s_u64(h, "blocks_held");
    const cJSON *age = s_get(h, "last_success_age_s");
    s->history.last_success_age_s =
        cJSON_IsNumber(age) && isfinite(age->valuedouble) && age->valuedouble >= 0
            ? age->valuedouble
            : -1;
}

static void s_proxy(const cJSON *root, kvedge_top_doc_t *d)
{
    snprintf(d->role, sizeof d->role, "proxy");
    const cJSON *st = s_get(root, "stats"), *e;
    d->proxy.stats.requests = s_u64(st, "requests");
    d->proxy.stats.layers = s_u64(st, "layers");
    d->proxy.stats.misses = s_u64(st, "misses");
    d->proxy.stats.fallbacks = s_u64(st, "fallbacks");
    d->proxy.stats.corrupt = s_u64(st, "corrupt");
    d->proxy.stats.bytes = s_u64(st, "bytes");
    d->proxy.stats.source_failures = s_u64(st, "source_failures");
    d->proxy.stats.buffered_bytes = s_u64(st, "buffered_bytes");
    d->proxy.stats.fetches_open = s_u64(st, "fetches_open");
    cJSON_ArrayForEach(e, s_array(root, "sources"))
    {
        if (d->proxy.nsources == KVEDGE_TOP_DOC_MAX_SOURCES)
            break;
        s_source(e, &d->proxy.sources[d->proxy.nsources++]);
    }
    cJSON_ArrayForEach(e, s_array(root, "layers"))
    {
        if (d->proxy.nlayers == KVEDGE_TOP_DOC_MAX_REASONS)
            break;
        kvedge_top_count_t *c = &d->proxy.layers[d->proxy.nlayers++];
        S_STR(e, "kind", c->a);
        S_STR(e, "reason", c->b);
        c->count = s_u64(e, "count");
    }
    const cJSON *f = s_get(root, "fetch");
    d->proxy.fetch.ok = s_u64(f, "ok");
    d->proxy.fetch.failed = s_u64(f, "failed");
    d->proxy.fetch.nle =
        s_numbers(s_array(f, "le_us"), d->proxy.fetch.le_us, KVEDGE_TOP_DOC_MAX_BUCKETS);
    s_hist(s_get(f, "plan"), &d->proxy.fetch.plan);
    s_hist(s_get(f, "first_layer"), &d->proxy.fetch.first_layer);
    s_hist(s_get(f, "last_layer"), &d->proxy.fetch.last_layer);
    s_hist(s_get(f, "planned"), &d->proxy.fetch.planned);
    d->proxy.fetch.actual_to_plan_median = s_real(f, "actual_to_plan_median");
    /* The document lists the transitions oldest first: keep the last ones. */
    const cJSON *tr = s_array(root, "transitions");
    int total = tr ? cJSON_GetArraySize(tr) : 0, i = 0;
    cJSON_ArrayForEach(e, tr)
    {
        if (i++ < total - KVEDGE_TOP_DOC_MAX_TRANSITIONS)
            continue;
        kvedge_top_transition_t *t = &d->proxy.transitions[d->proxy.ntransitions++];
        t->time_ms = s_u64(e, "time_ms");
        S_STR(e, "source", t->source);
        S_STR(e, "from", t->from);
        S_STR(e, "to", t->to);
        S_STR(e, "reason", t->reason);
    }
    d->proxy.transitions_total = s_u64(root, "transitions_total");
    const cJSON *m = s_get(root, "master");
    d->proxy.has_master = cJSON_IsObject(m);
    S_STR(m, "endpoint", d->proxy.master.endpoint);
    S_STR(m, "registry", d->proxy.master.registry);
    cJSON_ArrayForEach(e, s_array(m, "nodes"))
    {
        if (d->proxy.master.nnodes == KVEDGE_TOP_DOC_MAX_NODES)
            break;
        kvedge_top_registry_node_t *n = &d->proxy.master.nodes[d->proxy.master.nnodes++];
        S_STR(e, "node", n->node);
        S_STR(e, "role", n->role);
        S_STR(e, "endpoint", n->endpoint);
        S_STR(e, "health", n->health);
        n->last_seen_ms = s_u64(e, "last_seen_ms");
    }
}

/* ---------------------------------------------------------------- public */

int kvedge_top_doc_parse(const char *json, size_t len, kvedge_top_doc_t *out)
{
    if (!out)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    if (!json)
        return KVEDGE_EINVAL;
    if (len > KVEDGE_WIRE_MAX_MONITOR_BYTES)
        return KVEDGE_ETOOBIG;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) /* cJSON does not tell malformed from out of memory */
        return KVEDGE_EPROTO;
    const cJSON *kind = s_get(root, "kind");
    int rc = KVEDGE_OK;
    if (cJSON_IsString(kind) && strcmp(kind->valuestring, "node") == 0)
        out->kind = KVEDGE_TOP_DOC_NODE;
    else if (cJSON_IsString(kind) && strcmp(kind->valuestring, "proxy") == 0)
        out->kind = KVEDGE_TOP_DOC_PROXY;
    else
        rc = KVEDGE_EPROTO;
    if (rc == KVEDGE_OK) {
        S_STR(root, "name", out->name);
        S_STR(root, "version", out->version);
        out->time_ms = s_u64(root, "time_ms");
        out->uptime_ms = s_u64(root, "uptime_ms");
        out->ready = s_bool(root, "ready");
        S_STR(root, "not_ready", out->not_ready);
        if (out->kind == KVEDGE_TOP_DOC_NODE)
            s_node(root, out);
        else
            s_proxy(root, out);
    }
    cJSON_Delete(root);
    if (rc != KVEDGE_OK)
        memset(out, 0, sizeof *out);
    return rc;
}

bool kvedge_top_hist_delta(kvedge_top_hist_t *acc, const kvedge_top_hist_t *cur,
                           const kvedge_top_hist_t *prev)
{
    static const kvedge_top_hist_t zero;
    if (!prev)
        prev = &zero; /* empty, with any layout */
    uint32_t nb = cur->nbuckets;
    if ((prev != &zero && prev->nbuckets != nb) ||
        ((acc->count || acc->nbuckets) && acc->nbuckets != nb) || cur->count < prev->count ||
        cur->sum_us < prev->sum_us)
        return false;
    for (uint32_t b = 0; b < nb; b++)
        if (cur->buckets[b] < prev->buckets[b])
            return false;
    acc->nbuckets = nb;
    acc->count = s_sat_add(acc->count, cur->count - prev->count);
    acc->sum_us = s_sat_add(acc->sum_us, cur->sum_us - prev->sum_us);
    for (uint32_t b = 0; b < nb; b++)
        acc->buckets[b] = s_sat_add(acc->buckets[b], cur->buckets[b] - prev->buckets[b]);
    return true;
}

double kvedge_top_hist_quantile(const kvedge_top_hist_t *h, const uint64_t *le_us, uint32_t nle,
                                double q)
{
    if (!h || !le_us || h->count == 0 || nle == 0 || nle > KVEDGE_TOP_DOC_MAX_BUCKETS ||
        h->nbuckets != nle || le_us[0] == 0 || le_us[0] > (UINT64_MAX >> (nle - 1)))
        return 0;
    for (uint32_t b = 0; b < nle; b++) {
        if (le_us[b] != le_us[0] << b)
            return 0;
        if ((b && h->buckets[b] < h->buckets[b - 1]) || h->buckets[b] > h->count)
            return 0;
    }
    kvedge_histogram_spec_t spec = {le_us[0], nle, 1.0};
    return kvedge_histogram_quantile(&spec, h->buckets, h->count, q);
}

const kvedge_top_op_t *kvedge_top_doc_op(const kvedge_top_doc_t *d, const char *op)
{
    for (uint32_t i = 0; d && op && i < d->node.nops; i++)
        if (strcmp(d->node.ops[i].op, op) == 0)
            return &d->node.ops[i];
    return NULL;
}
