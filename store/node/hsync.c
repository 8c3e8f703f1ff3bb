/* Historical cache sync: copies subscribed contexts from a cloud node into the local engine,
 * pinned, through libkvedge. */
#include "store/node/hsync.h"

#include <czmq.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/transport.h"
#include "access/client.h"
#include "runtime/log.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"

/* "A:B" -> first_layer A, layers B - A (0 <= A < B <= KVEDGE_MODEL_MAX_LAYERS). */
static int s_parse_layers(const char *v, uint16_t *first, uint16_t *n)
{
    char *end = NULL;
    unsigned long a = strtoul(v, &end, 10);
    if (end == v || *end != ':' || a >= KVEDGE_MODEL_MAX_LAYERS)
        return KVEDGE_EINVAL;
    const char *bs = end + 1;
    unsigned long b = strtoul(bs, &end, 10);
    if (end == bs || *end || b <= a || b > KVEDGE_MODEL_MAX_LAYERS || *v == '-' || *bs == '-')
        return KVEDGE_EINVAL;
    *first = (uint16_t)a;
    *n = (uint16_t)(b - a);
    return KVEDGE_OK;
}

int kvedge_hsync_load(const char *path, kvedge_hsync_sub_t *subs, size_t max, size_t *n, char *why,
                      size_t why_len)
{
    char dummy[8];
    if (!why) {
        why = dummy;
        why_len = sizeof dummy;
    }
    *n = 0;
    zconfig_t *root = path ? zconfig_load(path) : NULL;
    if (!root) {
        snprintf(why, why_len, "cannot read %s", path ? path : "(null)");
        return KVEDGE_EIO;
    }
    int rc = KVEDGE_OK;
    for (zconfig_t *sec = zconfig_child(root); sec && rc == KVEDGE_OK; sec = zconfig_next(sec)) {
        if (strcmp(zconfig_name(sec), "subscription") != 0) {
            snprintf(why, why_len, "%s: unknown section '%s'", path, zconfig_name(sec));
            rc = KVEDGE_EINVAL;
            break;
        }
        if (*n == max) {
            snprintf(why, why_len, "%s: more than %zu subscriptions", path, max);
            rc = KVEDGE_ETOOBIG;
            break;
        }
        kvedge_hsync_sub_t *s = &subs[*n];
        memset(s, 0, sizeof *s);
        snprintf(s->tenant, sizeof s->tenant, "%s", KVEDGE_LOOPBACK_TENANT);
        bool have_prefix = false;
        for (zconfig_t *k = zconfig_child(sec); k && rc == KVEDGE_OK; k = zconfig_next(k)) {
            const char *key = zconfig_name(k), *v = zconfig_value(k);
            int w = 0;
            size_t cap = 0;
            if (!v) {
                rc = KVEDGE_EINVAL;
            } else if (strcmp(key, "name") == 0) {
                w = snprintf(s->name, cap = sizeof s->name, "%s", v);
            } else if (strcmp(key, "cloud") == 0) {
                w = snprintf(s->cloud, cap = sizeof s->cloud, "%s", v);
            } else if (strcmp(key, "server_key") == 0) {
                w = snprintf(s->server_key, cap = sizeof s->server_key, "%s", v);
            } else if (strcmp(key, "cert") == 0) {
                w = snprintf(s->cert, cap = sizeof s->cert, "%s", v);
            } else if (strcmp(key, "tenant") == 0) {
                w = snprintf(s->tenant, cap = sizeof s->tenant, "%s", v);
            } else if (strcmp(key, "prefix") == 0) {
                rc = kvedge_chunk_id_parse(v, &s->prefix);
                have_prefix = rc == KVEDGE_OK;
            } else if (strcmp(key, "layers") == 0) {
                rc = s_parse_layers(v, &s->first_layer, &s->layers);
            } else {
                rc = KVEDGE_EINVAL;
            }
            if (cap && (size_t)w >= cap)
                rc = KVEDGE_ETOOBIG;
            if (rc != KVEDGE_OK)
                snprintf(why, why_len, "%s: subscription %zu: bad or unknown setting '%s'", path,
                         *n + 1, key);
        }
        if (rc == KVEDGE_OK && (!s->cloud[0] || !have_prefix || !s->tenant[0])) {
            snprintf(why, why_len, "%s: subscription %zu needs cloud and prefix", path, *n + 1);
            rc = KVEDGE_EINVAL;
        }
        if (rc == KVEDGE_OK && !s->name[0])
            snprintf(s->name, sizeof s->name, "sub%zu", *n + 1);
        if (rc == KVEDGE_OK)
            (*n)++;
    }
    zconfig_destroy(&root);
    return rc;
}

typedef struct {
    uint32_t blocks;
    uint64_t bytes;
    uint16_t first_layer, end_layer; /* count only blocks of these layers */
    uint32_t pinned;
} s_local_t;

static int s_count_local(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *m)
{
    s_local_t *l = ctx;
    if (key->layer < l->first_layer || key->layer >= l->end_layer)
        return 0;
    l->blocks++;
    l->bytes += m->bytes;
    l->pinned += m->pinned;
    return 0;
}

/* Every block of one stored chunk into the held counts. */
static void s_add_held(kvedge_engine_t *engine, const kvedge_chunk_id_t *stored,
                       kvedge_hsync_status_t *st)
{
    s_local_t all = {0, 0, 0, UINT16_MAX, 0};
    kvedge_engine_scan(engine, stored, s_count_local, &all);
    st->blocks_held += all.blocks;
    st->blocks_pinned += all.pinned;
}

static void s_range(const kvedge_hsync_sub_t *sub, const kvedge_model_t *m, uint16_t *first,
                    uint16_t *end);

/* What the edge holds of a subscription, from its own chunk records alone (the cloud could
 * not be listed): the chain from the subscribed chunk, in the tenant's namespace, up through
 * the parents the records name. A chunk counts as synced when it holds every head of every
 * subscribed layer of its model. */
static void s_local_chain(kvedge_engine_t *engine, const kvedge_hsync_sub_t *sub,
                          kvedge_hsync_status_t *st)
{
    uint8_t tag[16];
    kvedge_tenant_tag(sub->tenant, tag);
    kvedge_chunk_id_t id;
    kvedge_tenant_chunk_id(tag, &sub->prefix, &id);
    kvedge_chunk_info_t info;
    uint64_t steps = 0, max_steps = 0; /* the first record's index: a damaged chain cannot loop */
    while (kvedge_engine_get_chunk(engine, &id, &info) == KVEDGE_OK) {
        if (steps == 0)
            max_steps = (uint64_t)info.index + 1;
        s_add_held(engine, &id, st);
        kvedge_model_t m;
        if (kvedge_engine_get_tenant_model(engine, info.tenant, info.model_id, &m) == KVEDGE_OK ||
            kvedge_model_builtin(info.model_id, &m) == KVEDGE_OK) {
            s_local_t have = {0, 0, 0, 0, 0};
            s_range(sub, &m, &have.first_layer, &have.end_layer);
            kvedge_engine_scan(engine, &id, s_count_local, &have);
            uint64_t want = (uint64_t)m.kv_heads * (have.end_layer - have.first_layer);
            st->chunks_synced += want > 0 && have.blocks >= want;
        }
        if (!info.has_parent || ++steps >= max_steps)
            break;
        id = info.parent;
    }
}

/* One layer stream landing in the engine as it arrives (on the client's I/O thread). */
typedef struct {
    kvedge_engine_t *engine;
    kvedge_chunk_info_t info;
    uint16_t layer;
    uint64_t blocks, bytes;
    int put_error;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
} s_layer_t;

static void s_on_block(void *ctx, uint32_t chunk_index, uint16_t head, int status,
                       const uint8_t *data, size_t len)
{
    (void)chunk_index;
    s_layer_t *l = ctx;
    if (status != KVEDGE_OK)
        return; /* the cloud lacks this head: nothing to copy */
    kvedge_put_opts_t po = {KVEDGE_TTL_NEVER, true};
    int rc = kvedge_engine_put(l->engine, &l->info, l->layer, head, data, len, &po);
    if (rc == KVEDGE_OK) {
        l->blocks++;
        l->bytes += len;
    } else if (!l->put_error) {
        l->put_error = rc;
    }
}

static void s_on_done(void *ctx, int status, uint32_t heads)
{
    (void)heads;
    s_layer_t *l = ctx;
    pthread_mutex_lock(&l->mu);
    l->status = status;
    l->done = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Copies layers [first, end) of one chunk; returns 0 or the first error. */
/* The chunk's model as the local tenant (tag) sees it: the engine's, else a built-in one, else
 * the cloud's (a model its prefill registered there, in the tenant this edge's key has on
 * the cloud), registered here before the first block is stored: in the local tenant's
 * namespace, or node-wide for the loopback tenant (as its MODEL calls would). */
static int s_model(kvedge_client_t *c, kvedge_engine_t *engine, const uint8_t tag[16],
                   const kvedge_chunk_entry_t *e, kvedge_model_t *m)
{
    int rc = kvedge_engine_get_tenant_model(engine, tag, e->chunk.model_id, m);
    if (rc == KVEDGE_OK)
        return rc;
    rc = kvedge_model_builtin(e->chunk.model_id, m);
    if (rc != KVEDGE_OK)
        rc = kvedge_client_get_model(c, e->chunk.model_id, m);
    uint8_t loopback[16];
    kvedge_tenant_tag(KVEDGE_LOOPBACK_TENANT, loopback);
    const uint8_t *ns = memcmp(tag, loopback, 16) == 0 ? NULL : tag;
    return rc == KVEDGE_OK ? kvedge_engine_put_tenant_model(engine, ns, m) : rc;
}

/* The subscription's layer range within m: [*first, *end). */
static void s_range(const kvedge_hsync_sub_t *sub, const kvedge_model_t *m, uint16_t *first,
                    uint16_t *end)
{
    uint32_t a = sub->layers ? sub->first_layer : 0;
    uint32_t b = sub->layers ? a + sub->layers : m->layers;
    *first = (uint16_t)(a < m->layers ? a : m->layers);
    *end = (uint16_t)(b < m->layers ? b : m->layers);
}

static int s_copy_chunk(kvedge_client_t *c, kvedge_engine_t *engine, const uint8_t tag[16],
                        const kvedge_chunk_entry_t *e, const kvedge_chunk_entry_t *parent,
                        uint16_t first, uint16_t end, int deadline_ms, kvedge_hsync_status_t *st)
{
    int rc = KVEDGE_OK;
    s_layer_t l;
    memset(&l, 0, sizeof l);
    l.engine = engine;
    l.info = e->chunk;
    memcpy(l.info.tenant, tag, 16);
    l.info.name = e->chunk.id;
    kvedge_tenant_chunk_id(tag, &e->chunk.id, &l.info.id);
    l.info.has_parent = parent != NULL;
    memset(&l.info.parent, 0, sizeof l.info.parent);
    if (parent)
        kvedge_tenant_chunk_id(tag, &parent->chunk.id, &l.info.parent);
    pthread_mutex_init(&l.mu, NULL);
    pthread_cond_init(&l.cv, NULL);
    for (uint32_t layer = first; rc == KVEDGE_OK && layer < end; layer++) {
        l.layer = (uint16_t)layer;
        l.done = false;
        rc = kvedge_client_get_layer_async(c, &e->chunk.id, 1, (uint16_t)layer, deadline_ms,
                                           s_on_block, s_on_done, &l);
        if (rc != KVEDGE_OK)
            break;
        pthread_mutex_lock(&l.mu);
        while (!l.done)
            pthread_cond_wait(&l.cv, &l.mu); /* on_done always runs, by the deadline */
        pthread_mutex_unlock(&l.mu);
        rc = l.status != KVEDGE_OK ? l.status : l.put_error;
    }
    pthread_mutex_destroy(&l.mu);
    pthread_cond_destroy(&l.cv);
    st->blocks_copied += l.blocks;
    st->bytes_copied += l.bytes;
    return rc;
}

int kvedge_hsync_run(kvedge_engine_t *engine, const kvedge_hsync_sub_t *sub, int deadline_ms,
                     kvedge_hsync_status_t *st)
{
    if (!engine || !sub || !st)
        return KVEDGE_EINVAL;
    uint64_t last_ok = st->last_ok_ms;
    memset(st, 0, sizeof *st);
    st->last_ok_ms = last_ok;
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = sub->cloud;
    o.server_key = sub->server_key[0] ? sub->server_key : NULL;
    o.client_cert = sub->cert[0] ? sub->cert : NULL;
    o.deadline_ms = deadline_ms;
    o.name = "kvedge-hsync";
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    kvedge_chunk_entry_t *all = NULL;
    size_t n = 0;
    if (rc == KVEDGE_OK)
        rc = kvedge_client_list_all(c, &all, &n);
    /* The chain, from the subscribed chunk up to its root, through LIST's parent ids. */
    const kvedge_chunk_entry_t **chain = NULL;
    size_t depth = 0;
    if (rc == KVEDGE_OK) {
        chain = calloc(n + 1, sizeof *chain);
        const kvedge_chunk_id_t *want = &sub->prefix;
        while (chain && depth < n) {
            size_t i = 0;
            while (i < n && memcmp(&all[i].chunk.id, want, sizeof *want) != 0)
                i++;
            if (i == n)
                break;
            chain[depth++] = &all[i];
            if (!all[i].chunk.has_parent)
                break;
            want = &all[i].chunk.parent;
        }
        rc = !chain ? KVEDGE_ENOMEM : depth == 0 ? KVEDGE_ENOTFOUND : KVEDGE_OK;
    }
    if (rc != KVEDGE_OK) {
        st->state = KVEDGE_HSYNC_FAILED;
        st->last_error = rc;
        s_local_chain(engine, sub, st);
        free(chain);
        free(all);
        kvedge_client_destroy(&c);
        return rc;
    }
    uint8_t tag[16];
    kvedge_tenant_tag(sub->tenant, tag);
    st->chunks_total = (uint32_t)depth;
    for (size_t d = depth; d-- > 0 && rc == KVEDGE_OK;) { /* root first */
        const kvedge_chunk_entry_t *e = chain[d];
        kvedge_chunk_id_t stored;
        kvedge_tenant_chunk_id(tag, &e->chunk.id, &stored);
        kvedge_model_t m;
        rc = s_model(c, engine, tag, e, &m);
        if (rc != KVEDGE_OK)
            break;
        s_local_t have = {0, 0, 0, 0, 0};
        s_range(sub, &m, &have.first_layer, &have.end_layer);
        kvedge_engine_scan(engine, &stored, s_count_local, &have);
        /* Blocks are spread evenly over layers (heads per layer); a range is compared by
         * count, the whole chunk also by bytes. */
        bool whole = have.first_layer == 0 && have.end_layer == m.layers;
        uint64_t want =
            m.layers ? (uint64_t)e->blocks * (have.end_layer - have.first_layer) / m.layers : 0;
        if (have.blocks != want || (whole && have.bytes != e->bytes))
            rc = s_copy_chunk(c, engine, tag, e, d + 1 < depth ? chain[d + 1] : NULL,
                              have.first_layer, have.end_layer, deadline_ms, st);
        if (rc == KVEDGE_OK) {
            uint64_t changed = 0;
            rc = kvedge_engine_pin_chunk(engine, &stored, true, &changed);
            if (rc == KVEDGE_ENOTFOUND) /* a chunk with no blocks on the cloud either */
                rc = KVEDGE_OK;
            st->chunks_synced++;
        }
        s_add_held(engine, &stored, st);
    }
    if (rc != KVEDGE_OK) {
        /* Part way: what is held is every chunk of the chain the cloud listed. */
        st->blocks_held = 0;
        st->blocks_pinned = 0;
        for (size_t d = 0; d < depth; d++) {
            kvedge_chunk_id_t stored;
            kvedge_tenant_chunk_id(tag, &chain[d]->chunk.id, &stored);
            s_add_held(engine, &stored, st);
        }
    }
    st->last_error = rc;
    if (rc == KVEDGE_OK) {
        st->state = KVEDGE_HSYNC_OK;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        st->last_ok_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    } else {
        st->state = KVEDGE_HSYNC_PARTIAL;
    }
    free(chain);
    free(all);
    kvedge_client_destroy(&c);
    return rc;
}

const char *kvedge_hsync_state_name(int s)
{
    switch (s) {
    case KVEDGE_HSYNC_OK:
        return "ok";
    case KVEDGE_HSYNC_PARTIAL:
        return "partial";
    case KVEDGE_HSYNC_FAILED:
        return "failed";
    default:
        return "never";
    }
}

/* "pinned" when every block held is, else how many are. */
static const char *s_pinned(const kvedge_hsync_status_t *st, char *buf, size_t len)
{
    if (st->blocks_pinned == st->blocks_held)
        return "pinned";
    snprintf(buf, len, "%llu of them pinned", (unsigned long long)st->blocks_pinned);
    return buf;
}

char *kvedge_hsync_summary(const kvedge_hsync_sub_t *sub, const kvedge_hsync_status_t *st,
                           char *buf, size_t len)
{
    if (!buf || !len)
        return buf;
    char pin[48];
    const char *err = kvedge_strerror(st->last_error);
    switch (st->state) {
    case KVEDGE_HSYNC_OK:
        snprintf(buf, len, "%u/%u chunks, %llu blocks copied (%llu bytes), %llu held, %s",
                 st->chunks_synced, st->chunks_total, (unsigned long long)st->blocks_copied,
                 (unsigned long long)st->bytes_copied, (unsigned long long)st->blocks_held,
                 s_pinned(st, pin, sizeof pin));
        break;
    case KVEDGE_HSYNC_PARTIAL:
        snprintf(buf, len,
                 "%u/%u chunks, %llu blocks copied (%llu bytes), then %s (%s); held locally: "
                 "%llu blocks, %s",
                 st->chunks_synced, st->chunks_total, (unsigned long long)st->blocks_copied,
                 (unsigned long long)st->bytes_copied, err, sub ? sub->cloud : "?",
                 (unsigned long long)st->blocks_held, s_pinned(st, pin, sizeof pin));
        break;
    case KVEDGE_HSYNC_FAILED:
        /* The pass could not list the context: the cloud is down or refuses us (both end in
         * a deadline), or it does not have the subscribed chunk. */
        snprintf(buf, len, "%s: %s (%s); held locally: %llu blocks (%u chunks), %s",
                 st->last_error == KVEDGE_ENOTFOUND ? "the cloud lacks the subscribed chunk"
                                                    : "cloud unreachable",
                 err, sub ? sub->cloud : "?", (unsigned long long)st->blocks_held,
                 st->chunks_synced, s_pinned(st, pin, sizeof pin));
        break;
    default:
        snprintf(buf, len, "no pass yet");
        break;
    }
    return buf;
}

int kvedge_hsync_write_status(const char *data_dir, const kvedge_hsync_sub_t *subs,
                              const kvedge_hsync_status_t *status, size_t n)
{
    char path[1200], tmp[1300];
    snprintf(path, sizeof path, "%s/%s", data_dir, KVEDGE_HSYNC_STATUS_FILE);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return KVEDGE_EIO;
    for (size_t i = 0; i < n; i++) {
        const kvedge_hsync_status_t *s = &status[i];
        char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
        /* Names and endpoints come from the operator's own file; quote-free by construction
         * would be an assumption, so escape the two characters JSON cares about. */
        fprintf(f, "{\"name\":\"");
        for (const char *p = subs[i].name; *p; p++)
            fprintf(f, (*p == '"' || *p == '\\') ? "\\%c" : "%c", *p);
        fprintf(f,
                "\",\"prefix\":\"%s\",\"state\":\"%s\",\"chunks_total\":%u,"
                "\"chunks_synced\":%u,\"blocks_copied\":%llu,\"bytes_copied\":%llu,"
                "\"blocks_held\":%llu,\"blocks_pinned\":%llu,\"last_ok_ms\":%llu,"
                "\"last_error\":\"%s\",\"summary\":\"",
                kvedge_chunk_id_hex(&subs[i].prefix, hex), kvedge_hsync_state_name(s->state),
                s->chunks_total, s->chunks_synced, (unsigned long long)s->blocks_copied,
                (unsigned long long)s->bytes_copied, (unsigned long long)s->blocks_held,
                (unsigned long long)s->blocks_pinned, (unsigned long long)s->last_ok_ms,
                s->last_error ? kvedge_errname(s->last_error) : "");
        char sum[1024];
        kvedge_hsync_summary(&subs[i], s, sum, sizeof sum);
        for (const char *p = sum; *p; p++)
            if ((unsigned char)*p >= 0x20)
                fprintf(f, (*p == '"' || *p == '\\') ? "\\%c" : "%c", *p);
        fprintf(f, "\"}\n");
    }
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        remove(tmp);
        return KVEDGE_EIO;
    }
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- the scheduler */

#define S_SCHED_DEADLINE_MS 10000 /* per remote call of a scheduled pass */

struct kvedge_hsync_sched_t {
    kvedge_engine_t *engine; /* not owned */
    const char *data_dir;    /* not owned */
    kvedge_hsync_sub_t *subs;
    kvedge_hsync_status_t *status;
    size_t n;
    uint32_t interval_s;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    pthread_mutex_t status_mu; /* status and last_pass_ms, read by kvedge_hsync_sched_status */
    uint64_t last_pass_ms;
};

static void *s_sched_run(void *arg)
{
    kvedge_hsync_sched_t *y = arg;
    pthread_mutex_lock(&y->mu);
    while (!y->stop) {
        pthread_mutex_unlock(&y->mu);
        for (size_t i = 0; i < y->n; i++) {
            pthread_mutex_lock(&y->status_mu);
            kvedge_hsync_status_t st = y->status[i];
            pthread_mutex_unlock(&y->status_mu);
            int rc = kvedge_hsync_run(y->engine, &y->subs[i], S_SCHED_DEADLINE_MS, &st);
            pthread_mutex_lock(&y->status_mu);
            y->status[i] = st;
            pthread_mutex_unlock(&y->status_mu);
            /* One line per subscription and pass: the interval bounds how often. */
            char sum[1024];
            if (rc == KVEDGE_OK)
                kvedge_log_info(
                    "sync %s: %u chunks, %llu blocks copied (%llu bytes), held %llu "
                    "blocks, state ok",
                    y->subs[i].name, st.chunks_total, (unsigned long long)st.blocks_copied,
                    (unsigned long long)st.bytes_copied, (unsigned long long)st.blocks_held);
            else
                kvedge_log_warn("sync %s: state %s: %s", y->subs[i].name,
                                kvedge_hsync_state_name(st.state),
                                kvedge_hsync_summary(&y->subs[i], &st, sum, sizeof sum));
        }
        pthread_mutex_lock(&y->status_mu);
        y->last_pass_ms = (uint64_t)kvedge_wall_ms();
        kvedge_hsync_write_status(y->data_dir, y->subs, y->status, y->n);
        pthread_mutex_unlock(&y->status_mu);
        pthread_mutex_lock(&y->mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)y->interval_s;
        while (!y->stop && pthread_cond_timedwait(&y->cv, &y->mu, &ts) == 0) {
        }
    }
    pthread_mutex_unlock(&y->mu);
    return NULL;
}

int kvedge_hsync_sched_status(kvedge_hsync_sched_t *y, kvedge_hsync_sub_t *subs,
                              kvedge_hsync_status_t *status, size_t max, size_t *n,
                              uint64_t *last_pass_ms)
{
    if (!y || !subs || !status || !n)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&y->status_mu);
    *n = y->n < max ? y->n : max;
    memcpy(subs, y->subs, *n * sizeof *subs);
    memcpy(status, y->status, *n * sizeof *status);
    if (last_pass_ms)
        *last_pass_ms = y->last_pass_ms;
    pthread_mutex_unlock(&y->status_mu);
    return KVEDGE_OK;
}

int kvedge_hsync_sched_start(kvedge_engine_t *engine, const char *data_dir,
                             const kvedge_hsync_sub_t *subs, size_t n, uint32_t interval_s,
                             kvedge_hsync_sched_t **out)
{
    if (!engine || !data_dir || !subs || n == 0 || n > KVEDGE_HSYNC_MAX_SUBS || !out)
        return KVEDGE_EINVAL;
    kvedge_hsync_sched_t *y = calloc(1, sizeof *y);
    if (!y)
        return KVEDGE_ENOMEM;
    y->subs = calloc(n, sizeof *y->subs);
    y->status = calloc(n, sizeof *y->status);
    if (!y->subs || !y->status) {
        free(y->subs);
        free(y->status);
        free(y);
        return KVEDGE_ENOMEM;
    }
    memcpy(y->subs, subs, n * sizeof *subs);
    y->engine = engine;
    y->data_dir = data_dir;
    y->n = n;
    y->interval_s = interval_s ? interval_s : KVEDGE_HSYNC_INTERVAL_S_DEFAULT;
    pthread_mutex_init(&y->mu, NULL);
    pthread_mutex_init(&y->status_mu, NULL);
    pthread_cond_init(&y->cv, NULL);
    if (pthread_create(&y->thread, NULL, s_sched_run, y) != 0) {
        pthread_cond_destroy(&y->cv);
        pthread_mutex_destroy(&y->mu);
        pthread_mutex_destroy(&y->status_mu);
        free(y->subs);
        free(y->status);
        free(y);
        return KVEDGE_ENOMEM;
    }
    *out = y;
    return KVEDGE_OK;
}

void kvedge_hsync_sched_destroy(kvedge_hsync_sched_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_hsync_sched_t *y = *self_p;
    pthread_mutex_lock(&y->mu);
    y->stop = true;
    pthread_cond_signal(&y->cv);
    pthread_mutex_unlock(&y->mu);
    pthread_join(y->thread, NULL);
    pthread_cond_destroy(&y->cv);
    pthread_mutex_destroy(&y->mu);
    pthread_mutex_destroy(&y->status_mu);
    free(y->subs);
    free(y->status);
    free(y);
    *self_p = NULL;
}
