/* Directory publisher: engine -> dir/<node>/<chunk> records on the master. */
#include "store/node/dirpub.h"

#include <czmq.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "access/log.h"
#include "store/error.h"
#include "store/model.h"

#define S_SET_DEADLINE_MS 2000

struct kvedge_dirpub_t {
    kvedge_dirpub_opts_t opts;
    char node_id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    kvedge_master_node_t node;
    bool has_node;
    bool node_sent;
    zhashx_t *published; /* chunk hex -> kvedge_master_dir_t (what the master has) */
    zhashx_t *models;    /* model id -> kvedge_model_t this node registered */
    uint64_t fingerprint;
    bool synced_once;
    pthread_mutex_t mu; /* one pass at a time */
    pthread_t thread;
    bool started;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    bool stop;
};

static void s_free_item(void **item)
{
    free(*item);
    *item = NULL;
}

typedef struct {
    kvedge_chunk_info_t *chunks;
    size_t n, cap;
} s_chunks_t;

static int s_collect(void *ctx, const kvedge_chunk_info_t *info)
{
    s_chunks_t *c = ctx;
    if (c->n == KVEDGE_DIRPUB_MAX_CHUNKS)
        return 1;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 256;
        kvedge_chunk_info_t *p = realloc(c->chunks, cap * sizeof *p);
        if (!p)
            return 1;
        c->chunks = p;
        c->cap = cap;
    }
    c->chunks[c->n++] = *info;
    return 0;
}

typedef struct {
    uint16_t heads[KVEDGE_MODEL_MAX_LAYERS]; /* blocks seen per layer */
} s_counts_t;

static int s_count(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *meta)
{
    (void)meta;
    s_counts_t *c = ctx;
    if (key->layer < KVEDGE_MODEL_MAX_LAYERS && c->heads[key->layer] < UINT16_MAX)
        c->heads[key->layer]++;
    return 0;
}

static uint64_t s_fingerprint(kvedge_engine_t *e)
{
    kvedge_engine_stats_t s;
    if (kvedge_engine_stats(e, &s) != KVEDGE_OK)
        return 0;
    return s.blocks * 1000003u ^ s.bytes * 7919u ^ s.puts * 104729u ^ s.evicted_blocks * 31u ^
           s.expired * 131u ^ s.quarantined;
}

static int s_set(kvedge_dirpub_t *d, const char *key, const uint8_t *body, size_t len)
{
    int rc = kvedge_mview_set(d->opts.view, key, body, len, S_SET_DEADLINE_MS);
    if (rc != KVEDGE_OK)
        kvedge_log_debug("directory: %s: %s", key, kvedge_strerror(rc));
    return rc;
}

static int s_send_node(kvedge_dirpub_t *d)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    if (kvedge_master_node_pack(&d->node, body, &len) != KVEDGE_OK ||
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_NODE, d->node_id, NULL, key, sizeof key) !=
            KVEDGE_OK)
        return KVEDGE_EINVAL;
    return s_set(d, key, body, len);
}

/* The node record is sent at start and again whenever the registry lost it (a master that
 * came back empty, an operator's delete). */
static int s_keep_node(kvedge_dirpub_t *d)
{
    if (!d->has_node)
        return KVEDGE_OK;
    kvedge_master_node_t cur;
    if (d->node_sent && kvedge_mview_node(d->opts.view, d->node_id, &cur) == KVEDGE_OK)
        return KVEDGE_OK;
    if (kvedge_mview_state(d->opts.view) != KVEDGE_MVIEW_SYNCED && d->node_sent)
        return KVEDGE_OK;
    bool lost = d->node_sent;
    int rc = s_send_node(d);
    if (rc == KVEDGE_OK) {
        if (lost) { /* the registry lost us: our model records too */
            zhashx_purge(d->models);
            d->synced_once = false;
        }
        d->node_sent = true;
        kvedge_log_info("registered as %s with the master", d->node_id);
    }
    return rc;
}

/* Registers the shape of a model this node holds blocks of, once per node run (and again
 * when the registry lost this node's records), unless it is built in (every proxy knows
 * those): a proxy can then plan fetches of a model it was never told about. Returns 1 when a
 * record was written. */
static int s_keep_model(kvedge_dirpub_t *d, const kvedge_model_t *m)
{
    kvedge_model_t builtin;
    const kvedge_model_t *sent = zhashx_lookup(d->models, m->id);
    if (kvedge_model_builtin(m->id, &builtin) == KVEDGE_OK ||
        (sent && sent->layers == m->layers && sent->kv_heads == m->kv_heads &&
         sent->head_dim == m->head_dim && sent->dtype == m->dtype))
        return 0;
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    if (kvedge_master_model_pack(m, body, &len) != KVEDGE_OK ||
        kvedge_master_key_format(KVEDGE_MASTER_SPACE_MODEL, m->id, NULL, key, sizeof key) !=
            KVEDGE_OK)
        return 0; /* an id the registry cannot address */
    kvedge_model_t *copy = malloc(sizeof *copy);
    if (!copy || s_set(d, key, body, len) != KVEDGE_OK) {
        free(copy);
        return 0;
    }
    *copy = *m;
    zhashx_update(d->models, m->id, copy);
    return 1;
}

int kvedge_dirpub_sync(kvedge_dirpub_t *d, uint32_t *changed)
{
    if (!d)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&d->mu);
    uint32_t n_changed = 0;
    int rc = s_keep_node(d);
    uint64_t fp = s_fingerprint(d->opts.engine);
    /* A master that restarted from an older state may lack records: a fresh sync after a
     * re-sync of the view compares against the registry, not against our memory. */
    bool view_synced = kvedge_mview_state(d->opts.view) == KVEDGE_MVIEW_SYNCED;
    if (rc == KVEDGE_OK && (!d->synced_once || fp != d->fingerprint) && view_synced) {
        s_chunks_t all = {NULL, 0, 0};
        kvedge_engine_list_chunks(d->opts.engine, s_collect, &all);
        zhashx_t *now = zhashx_new();
        zhashx_set_destructor(now, s_free_item);
        for (size_t i = 0; i < all.n && rc == KVEDGE_OK; i++) {
            const kvedge_chunk_info_t *ci = &all.chunks[i];
            kvedge_model_t m;
            size_t idlen = strlen(ci->model_id);
            if (idlen > KVEDGE_MASTER_MAX_MODEL_ID_BYTES)
                continue; /* not addressable in the registry */
            if (kvedge_engine_get_model(d->opts.engine, ci->model_id, &m) != KVEDGE_OK &&
                kvedge_model_builtin(ci->model_id, &m) != KVEDGE_OK)
                continue; /* no shape: no way to say which layers are complete */
            n_changed += (uint32_t)s_keep_model(d, &m);
            s_counts_t *counts = calloc(1, sizeof *counts);
            if (!counts)
                break;
            kvedge_engine_scan(d->opts.engine, &ci->id, s_count, counts);
            kvedge_master_dir_t rec;
            memset(&rec, 0, sizeof rec);
            memcpy(rec.model_id, ci->model_id, idlen + 1);
            rec.layers = m.layers;
            for (unsigned l = 0; l < m.layers; l++)
                if (counts->heads[l] >= m.kv_heads)
                    kvedge_master_dir_set(&rec, l);
            free(counts);
            static const kvedge_chunk_id_t zero;
            const kvedge_chunk_id_t *name =
                memcmp(&ci->name, &zero, sizeof zero) != 0 ? &ci->name : &ci->id;
            char hex[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1];
            kvedge_master_chunk_hex(name, hex);
            /* Two tenants with the same tokens: one record says what any of them holds. */
            kvedge_master_dir_t *prev_now = zhashx_lookup(now, hex);
            if (prev_now)
                for (size_t b = 0; b < sizeof rec.held; b++)
                    rec.held[b] |= prev_now->held[b];
            kvedge_master_dir_t *copy = malloc(sizeof *copy);
            if (!copy)
                break;
            *copy = rec;
            zhashx_update(now, hex, copy);
        }
        /* Write what differs from the registry, delete what is gone. */
        for (kvedge_master_dir_t *rec = zhashx_first(now); rec && rc == KVEDGE_OK;
             rec = zhashx_next(now)) {
            const char *hex = zhashx_cursor(now);
            kvedge_master_dir_t *old = zhashx_lookup(d->published, hex);
            if (old && memcmp(old, rec, sizeof *rec) == 0)
                continue;
            uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
            size_t len;
            char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
            if (kvedge_master_dir_pack(rec, body, &len) != KVEDGE_OK ||
                kvedge_master_key_format(KVEDGE_MASTER_SPACE_DIR, d->node_id, hex, key,
                                         sizeof key) != KVEDGE_OK)
                continue;
            rc = s_set(d, key, body, len);
            if (rc == KVEDGE_OK) {
                kvedge_master_dir_t *copy = malloc(sizeof *copy);
                if (copy) {
                    *copy = *rec;
                    zhashx_update(d->published, hex, copy);
                }
                n_changed++;
            }
        }
        zlistx_t *gone = zlistx_new();
        for (void *v = zhashx_first(d->published); v; v = zhashx_next(d->published))
            if (!zhashx_lookup(now, zhashx_cursor(d->published)))
                zlistx_add_end(gone, (void *)zhashx_cursor(d->published));
        for (const char *hex = zlistx_first(gone); hex && rc == KVEDGE_OK;
             hex = zlistx_next(gone)) {
            char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
            if (kvedge_master_key_format(KVEDGE_MASTER_SPACE_DIR, d->node_id, hex, key,
                                         sizeof key) != KVEDGE_OK)
                continue;
            rc = s_set(d, key, NULL, 0);
            if (rc == KVEDGE_OK) {
                zhashx_delete(d->published, hex);
                n_changed++;
            }
        }
        zlistx_destroy(&gone);
        zhashx_destroy(&now);
        free(all.chunks);
        if (rc == KVEDGE_OK) {
            d->fingerprint = fp;
            d->synced_once = true;
        }
    }
    pthread_mutex_unlock(&d->mu);
    if (changed)
        *changed = n_changed;
    return rc;
}

static void *s_run(void *arg)
{
    kvedge_dirpub_t *d = arg;
    pthread_mutex_lock(&d->stop_mu);
    while (!d->stop) {
        pthread_mutex_unlock(&d->stop_mu);
        uint32_t changed = 0;
        if (kvedge_dirpub_sync(d, &changed) == KVEDGE_OK && changed)
            kvedge_log_debug("directory: %u records published", changed);
        pthread_mutex_lock(&d->stop_mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)d->opts.interval_ms * 1000000L;
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        while (!d->stop && pthread_cond_timedwait(&d->stop_cv, &d->stop_mu, &ts) == 0) {
        }
    }
    pthread_mutex_unlock(&d->stop_mu);
    return NULL;
}

int kvedge_dirpub_start(const kvedge_dirpub_opts_t *opts, kvedge_dirpub_t **out)
{
    if (!opts || !out || !opts->engine || !opts->view || !opts->node_id ||
        !kvedge_master_id_ok(opts->node_id))
        return KVEDGE_EINVAL;
    kvedge_dirpub_t *d = calloc(1, sizeof *d);
    if (!d)
        return KVEDGE_ENOMEM;
    d->opts = *opts;
    if (!d->opts.interval_ms)
        d->opts.interval_ms = KVEDGE_DIRPUB_INTERVAL_MS;
    snprintf(d->node_id, sizeof d->node_id, "%s", opts->node_id);
    d->opts.node_id = d->node_id;
    if (opts->node) {
        d->node = *opts->node;
        d->has_node = true;
    }
    d->published = zhashx_new();
    d->models = zhashx_new();
    if (d->published)
        zhashx_set_destructor(d->published, s_free_item);
    if (d->models)
        zhashx_set_destructor(d->models, s_free_item);
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->stop_mu, NULL);
    pthread_cond_init(&d->stop_cv, NULL);
    if (!d->published || !d->models || pthread_create(&d->thread, NULL, s_run, d) != 0) {
        kvedge_dirpub_destroy(&d);
        return KVEDGE_ENOMEM;
    }
    d->started = true;
    *out = d;
    return KVEDGE_OK;
}

void kvedge_dirpub_destroy(kvedge_dirpub_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_dirpub_t *d = *self_p;
    if (d->started) {
        pthread_mutex_lock(&d->stop_mu);
        d->stop = true;
        pthread_cond_broadcast(&d->stop_cv);
        pthread_mutex_unlock(&d->stop_mu);
        pthread_join(d->thread, NULL);
    }
    zhashx_destroy(&d->published);
    zhashx_destroy(&d->models);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->stop_mu);
    pthread_cond_destroy(&d->stop_cv);
    free(d);
    *self_p = NULL;
}
