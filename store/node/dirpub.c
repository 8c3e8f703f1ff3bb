/* Directory publisher: engine -> dir/<node>/<chunk> records on the master. */
#include "store/node/dirpub.h"

#include <czmq.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "access/codec/model.h"

#define S_SET_DEADLINE_MS 2000

struct kvedge_dirpub_t {
    kvedge_dirpub_opts_t opts;
    char node_id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    char master[1024]; /* opts.master (a list of masters), or "" */
    char cert[1024];   /* opts.cert, or "" */
    char cert_key[41]; /* the public key in cert, or "" */
    kvedge_master_node_t node;
    bool has_node;
    bool node_sent;
    /* Registration (under mu, copied to reg under reg_mu for the getter). */
    int64_t next_try_ms;          /* monotonic: no SET before, unless the view just came back */
    uint32_t retry_ms;            /* the current backoff */
    bool tried_unsynced;          /* the latest SET went out while the view was not synced */
    uint64_t refusals_seen;       /* the view's refusal count already counted in reg.attempts */
    kvedge_log_limit_t lines;     /* refused / failing lines */
    kvedge_log_limit_t reg_lines; /* registered lines */
    pthread_mutex_t reg_mu;       /* guards reg */
    kvedge_dirpub_reg_t reg;
    zhashx_t *published; /* chunk hex -> kvedge_master_dir_t (what the master has) */
    zhashx_t *models;    /* model id -> kvedge_model_t this node registered */
    uint64_t fingerprint;
    bool synced_once;
    /* The view's last full sync seen: which master, registry and seq (s_resynced). */
    uint64_t view_syncs, view_moves, view_registry, view_seq;
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
    uint16_t rungs; /* kvedge_master_dir_t.rungs bits every block is at; all set before */
} s_counts_t;

static int s_count(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *meta)
{
    s_counts_t *c = ctx;
    if (key->layer < KVEDGE_MODEL_MAX_LAYERS && c->heads[key->layer] < UINT16_MAX)
        c->heads[key->layer]++;
    /* The rungs every block of the chunk is at (a block off the ladder: none). */
    int bit = kvedge_master_rung_bit(
        kvedge_prec_of_shape(meta->scheme, meta->group_size, meta->key_channels, meta->head_dim));
    c->rungs &= bit < 0 ? 0 : (uint16_t)(1u << bit);
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

const char *kvedge_dirpub_reg_state_name(int state)
{
    switch (state) {
    case KVEDGE_DIRPUB_PENDING:
        return "pending";
    case KVEDGE_DIRPUB_REGISTERED:
        return "registered";
    case KVEDGE_DIRPUB_REFUSED:
        return "refused";
    case KVEDGE_DIRPUB_FAILING:
        return "failing";
    case KVEDGE_DIRPUB_LOST:
        return "lost";
    }
    return "?";
}

/* Caller holds d->mu. Moves the registration to state (since_ms only when it changes). */
static void s_reg_set(kvedge_dirpub_t *d, int state, int err, const char *why)
{
    pthread_mutex_lock(&d->reg_mu);
    if (d->reg.state != state) {
        d->reg.state = state;
        d->reg.since_ms = kvedge_wall_ms();
    }
    d->reg.last_error = err;
    size_t n = strnlen(why, sizeof d->reg.why - 1); /* a long path is cut, not refused */
    memcpy(d->reg.why, why, n);
    d->reg.why[n] = '\0';
    if (state == KVEDGE_DIRPUB_REGISTERED)
        d->reg.attempts = 0;
    pthread_mutex_unlock(&d->reg_mu);
}

static void s_reg_attempts(kvedge_dirpub_t *d, uint64_t more)
{
    pthread_mutex_lock(&d->reg_mu);
    uint64_t a = d->reg.attempts + more;
    d->reg.attempts = a > UINT32_MAX ? UINT32_MAX : (uint32_t)a;
    pthread_mutex_unlock(&d->reg_mu);
}

/* The master refuses this node's handshake: say what to copy where, when it starts and then
 * every KVEDGE_DIRPUB_PROBLEM_LOG_MS. */
static int s_refused(kvedge_dirpub_t *d)
{
    char why[sizeof d->cert + 160]; /* the getter keeps the first 255 bytes */
    if (d->cert[0])
        snprintf(why, sizeof why,
                 "the master's allowlist lacks this node's certificate: copy %s (public key %s) "
                 "into the master's clients directory",
                 d->cert, d->cert_key[0] ? d->cert_key : "?");
    else
        snprintf(why, sizeof why, "the master's allowlist lacks this node's key");
    s_reg_set(d, KVEDGE_DIRPUB_REFUSED, KVEDGE_EDENIED, why);
    uint64_t held = 0;
    if (kvedge_log_level() >= KVEDGE_LOG_WARN &&
        kvedge_log_limit_allow(&d->lines, "refused", kvedge_mono_ms(), &held))
        kvedge_log_warn("registration with the master %s refused: %s; retrying, no restart "
                        "needed (%u tries so far)",
                        d->master, why, d->reg.attempts);
    return KVEDGE_EDENIED;
}

/* The master was registered with and has gone silent: say so once, when it starts. */
static int s_lost(kvedge_dirpub_t *d)
{
    if (d->reg.state == KVEDGE_DIRPUB_LOST)
        return KVEDGE_ETIMEDOUT;
    kvedge_mview_conn_t conn;
    kvedge_mview_conn(d->opts.view, &conn);
    char why[sizeof d->master + 160]; /* the getter keeps the first bytes */
    snprintf(why, sizeof why,
             "nothing heard from the master %s for %u ms (heartbeats unanswered): it is down or "
             "unreachable; serving on, registering again when it is back",
             d->master, conn.dead_ms);
    s_reg_set(d, KVEDGE_DIRPUB_LOST, KVEDGE_ETIMEDOUT, why);
    kvedge_log_warn("master lost: %s", why);
    return KVEDGE_ETIMEDOUT;
}

/* Why a registration SET failed, with the fix when the view's connection tells it: a master
 * of another security mechanism, or silence from a master that may require CURVE. Returns the
 * cause's key for the log limiter: a cause learned later (the view sees the mismatch after the
 * first try failed) gets its own line instead of waiting out the first one's window. */
static const char *s_failing_why(kvedge_dirpub_t *d, int rc, char *why, size_t cap)
{
    kvedge_mview_conn_t conn;
    kvedge_mview_conn(d->opts.view, &conn);
    const char *what =
        rc == KVEDGE_ETIMEDOUT ? "no answer from the master" : "the master refused the record";
    if (conn.mismatch && !d->cert[0])
        snprintf(why, cap,
                 "%s (%s): the master requires CURVE and this node joins it in plaintext: give "
                 "--master-key with the master's public key or certificate (config key "
                 "master_key); next try in %u s",
                 what, kvedge_strerror(rc), d->retry_ms / 1000);
    else if (conn.mismatch)
        snprintf(why, cap,
                 "%s (%s): the master runs in plaintext (--insecure) and this node joins it "
                 "with CURVE: drop --master-key, or run the master with CURVE; next try in %u s",
                 what, kvedge_strerror(rc), d->retry_ms / 1000);
    if (conn.mismatch)
        return "failing: mechanism";
    if (rc == KVEDGE_ETIMEDOUT && !d->cert[0])
        snprintf(why, cap,
                 "%s (%s); if the master runs with CURVE (its default) it ignores plaintext "
                 "peers: give --master-key with its public key or certificate (config key "
                 "master_key); next try in %u s",
                 what, kvedge_strerror(rc), d->retry_ms / 1000);
    else
        snprintf(why, cap, "%s (%s); next try in %u s", what, kvedge_strerror(rc),
                 d->retry_ms / 1000);
    return "failing";
}

/* The node record is sent at start and again whenever the registry lost it (a master that
 * came back empty, an operator's delete). A failed try waits for the backoff, unless the
 * view has come back since; a refused handshake is not tried at all (no SET can get through)
 * until the view hears the master. */
static int s_keep_node(kvedge_dirpub_t *d)
{
    if (!d->has_node)
        return KVEDGE_OK;
    kvedge_master_node_t cur;
    kvedge_mview_state_t vs = kvedge_mview_state(d->opts.view);
    bool synced = vs == KVEDGE_MVIEW_SYNCED;
    kvedge_mview_conn_t conn;
    kvedge_mview_conn(d->opts.view, &conn);
    if (conn.refusals > d->refusals_seen) {
        s_reg_attempts(d, conn.refusals - d->refusals_seen);
        d->refusals_seen = conn.refusals;
    }
    /* Refused also after registering (the key was taken out of the allowlist): the record
     * may still be there, but nothing of this node reaches the master any more. */
    if (!synced && conn.refused)
        return s_refused(d);
    /* Registered, and the master has gone silent (the view replaced its sockets: nothing
     * heard for its dead_ms, heartbeats unanswered): lost until it is heard again. */
    if (!synced && d->node_sent && !conn.heard)
        return s_lost(d);
    if (synced && d->node_sent && kvedge_mview_node(d->opts.view, d->node_id, &cur) == KVEDGE_OK) {
        if (d->reg.state != KVEDGE_DIRPUB_REGISTERED) {
            if (d->reg.state == KVEDGE_DIRPUB_LOST)
                kvedge_log_info("the master %s is back: registered as %s", d->master, d->node_id);
            s_reg_set(d, KVEDGE_DIRPUB_REGISTERED, 0, "");
        }
        return KVEDGE_OK;
    }
    if (!synced && d->node_sent)
        return KVEDGE_OK; /* a re-sync under way; the view finishes it by itself */
    int64_t now = kvedge_mono_ms();
    if (now < d->next_try_ms && !(synced && d->tried_unsynced)) {
        pthread_mutex_lock(&d->reg_mu);
        int err = d->reg.last_error;
        pthread_mutex_unlock(&d->reg_mu);
        return err ? err : KVEDGE_ETIMEDOUT;
    }
    bool lost = d->node_sent;
    d->tried_unsynced = !synced;
    s_reg_attempts(d, 1);
    int rc = s_send_node(d);
    if (rc == KVEDGE_OK) {
        if (lost) { /* the registry lost us: our model and directory records too */
            zhashx_purge(d->models);
            zhashx_purge(d->published);
            d->synced_once = false;
        }
        d->node_sent = true;
        d->retry_ms = KVEDGE_DIRPUB_RETRY_MIN_MS;
        d->next_try_ms = 0;
        s_reg_set(d, KVEDGE_DIRPUB_REGISTERED, 0, "");
        uint64_t held = 0;
        if (kvedge_log_limit_allow(&d->reg_lines, NULL, now, &held))
            kvedge_log_info("registered with the master %s as %s%s", d->master, d->node_id,
                            lost ? " again (the registry had lost this node)" : "");
        return KVEDGE_OK;
    }
    d->node_sent = false;
    d->next_try_ms = kvedge_mono_ms() + d->retry_ms; /* from the end of this try (a SET waits) */
    char why[sizeof d->reg.why];
    const char *cause = s_failing_why(d, rc, why, sizeof why);
    d->retry_ms =
        d->retry_ms * 2 < KVEDGE_DIRPUB_RETRY_MAX_MS ? d->retry_ms * 2 : KVEDGE_DIRPUB_RETRY_MAX_MS;
    s_reg_set(d, KVEDGE_DIRPUB_FAILING, rc, why);
    uint64_t held = 0;
    if (kvedge_log_level() >= KVEDGE_LOG_WARN &&
        kvedge_log_limit_allow(&d->lines, cause, now, &held))
        kvedge_log_warn("registration with the master %s as %s failing: %s; retrying with "
                        "backoff up to %u s",
                        d->master, d->node_id, why, KVEDGE_DIRPUB_RETRY_MAX_MS / 1000);
    return rc;
}

void kvedge_dirpub_registration(kvedge_dirpub_t *d, kvedge_dirpub_reg_t *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!d)
        return;
    pthread_mutex_lock(&d->reg_mu);
    *out = d->reg;
    pthread_mutex_unlock(&d->reg_mu);
}

/* Registers the shape of a model this node holds blocks of, once per node run (and again
 * when the registry lost this node's records), unless it is built in (every proxy knows
 * those): a proxy can then plan fetches of a model it was never told about. A shape the
 * chunk's tenant registered for itself (not the node-wide one) goes under
 * tmodel/<tenant tag>/<id>, where only proxies of that tenant look. Returns 1 when a record
 * was written. */
static int s_keep_model(kvedge_dirpub_t *d, const kvedge_chunk_info_t *ci, const kvedge_model_t *m)
{
    kvedge_model_t builtin, wide;
    if (kvedge_model_builtin(m->id, &builtin) == KVEDGE_OK)
        return 0;
    bool own = kvedge_engine_get_model(d->opts.engine, m->id, &wide) != KVEDGE_OK ||
               wide.layers != m->layers || wide.kv_heads != m->kv_heads ||
               wide.head_dim != m->head_dim || wide.dtype != m->dtype;
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    char hex[KVEDGE_MASTER_TENANT_HEX_BYTES + 1];
    kvedge_master_tenant_hex(ci->tenant, hex);
    int rc =
        own ? kvedge_master_key_format(KVEDGE_MASTER_SPACE_TMODEL, hex, m->id, key, sizeof key)
            : kvedge_master_key_format(KVEDGE_MASTER_SPACE_MODEL, m->id, NULL, key, sizeof key);
    if (rc != KVEDGE_OK)
        return 0; /* an id the registry cannot address */
    const kvedge_model_t *sent = zhashx_lookup(d->models, key);
    if (sent && sent->layers == m->layers && sent->kv_heads == m->kv_heads &&
        sent->head_dim == m->head_dim && sent->dtype == m->dtype)
        return 0;
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    if (kvedge_master_model_pack(m, body, &len) != KVEDGE_OK)
        return 0;
    kvedge_model_t *copy = malloc(sizeof *copy);
    if (!copy || s_set(d, key, body, len) != KVEDGE_OK) {
        free(copy);
        return 0;
    }
    *copy = *m;
    zhashx_update(d->models, key, copy);
    return 1;
}

/* A full re-sync of the view with another master (a new leader, the next of a list), another
 * registry (a master on a fresh directory) or an older state of it (a restart from a backup):
 * that master may lack this node's soft state, so the whole directory and the model records
 * are published again on this pass (SET is idempotent), as HDFS datanodes send a full block
 * report to a new namenode. The registration is checked on every pass (s_keep_node). */
static void s_resynced(kvedge_dirpub_t *d)
{
    kvedge_mview_stats_t st;
    kvedge_mview_stats(d->opts.view, &st);
    uint64_t seq = kvedge_mview_seq(d->opts.view), last_seq = d->view_seq;
    if (kvedge_mview_state(d->opts.view) == KVEDGE_MVIEW_SYNCED)
        d->view_seq = seq; /* the seq seen by the previous pass, for the next */
    if (st.syncs == d->view_syncs || kvedge_mview_state(d->opts.view) != KVEDGE_MVIEW_SYNCED)
        return;
    kvedge_mview_conn_t conn;
    kvedge_mview_conn(d->opts.view, &conn);
    uint64_t registry = kvedge_mview_registry(d->opts.view);
    bool first = d->view_syncs == 0;
    bool other = conn.moves != d->view_moves || registry != d->view_registry || seq < last_seq;
    d->view_syncs = st.syncs;
    d->view_moves = conn.moves;
    d->view_registry = registry;
    if (first || !other)
        return;
    kvedge_log_info("the master view re-synced with %s (registry %016llx, seq %llu): "
                    "publishing this node's %zu directory records again",
                    conn.endpoint, (unsigned long long)registry, (unsigned long long)seq,
                    zhashx_size(d->published));
    zhashx_purge(d->published);
    zhashx_purge(d->models);
    d->synced_once = false;
}

int kvedge_dirpub_sync(kvedge_dirpub_t *d, uint32_t *changed)
{
    if (!d)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&d->mu);
    uint32_t n_changed = 0;
    s_resynced(d);
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
            if (kvedge_engine_get_tenant_model(d->opts.engine, ci->tenant, ci->model_id, &m) !=
                    KVEDGE_OK &&
                kvedge_model_builtin(ci->model_id, &m) != KVEDGE_OK)
                continue; /* no shape: no way to say which layers are complete */
            n_changed += (uint32_t)s_keep_model(d, ci, &m);
            s_counts_t *counts = calloc(1, sizeof *counts);
            if (!counts)
                break;
            counts->rungs = (uint16_t)((1u << KVEDGE_MASTER_DIR_RUNGS) - 1);
            kvedge_engine_scan(d->opts.engine, &ci->id, s_count, counts);
            kvedge_master_dir_t rec;
            memset(&rec, 0, sizeof rec);
            memcpy(rec.model_id, ci->model_id, idlen + 1);
            rec.layers = m.layers;
            /* A layer is held only with all its heads: a proxy never plans one onto a node
             * that a crash during an unacknowledged PUT left with some of them. */
            bool any = false;
            for (unsigned l = 0; l < m.layers; l++)
                if (counts->heads[l] >= m.kv_heads) {
                    kvedge_master_dir_set(&rec, l);
                    any = true;
                }
            /* The precisions it serves: the one rung all its blocks are at, and whether the
             * node derives coarser ones; nothing said for blocks at mixed rungs. */
            if (any && counts->rungs)
                rec.rungs = counts->rungs | (d->opts.derives ? KVEDGE_MASTER_DIR_DERIVES : 0);
            free(counts);
            static const kvedge_chunk_id_t zero;
            const kvedge_chunk_id_t *name =
                memcmp(&ci->name, &zero, sizeof zero) != 0 ? &ci->name : &ci->id;
            char hex[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1];
            kvedge_master_chunk_hex(name, hex);
            /* Two tenants with the same tokens: one record says what any of them holds. */
            kvedge_master_dir_t *prev_now = zhashx_lookup(now, hex);
            if (prev_now) {
                /* Their models may differ (model ids are per tenant): the larger count. */
                if (prev_now->layers > rec.layers)
                    rec.layers = prev_now->layers;
                for (size_t b = 0; b < sizeof rec.held; b++)
                    rec.held[b] |= prev_now->held[b];
                if (prev_now->rungs != rec.rungs)
                    rec.rungs = 0; /* the two disagree: say nothing */
            }
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
    snprintf(d->master, sizeof d->master, "%s", opts->master ? opts->master : "");
    snprintf(d->cert, sizeof d->cert, "%s", opts->cert ? opts->cert : "");
    d->opts.master = d->master;
    d->opts.cert = d->cert;
    zcert_t *cert = d->cert[0] ? zcert_load(d->cert) : NULL;
    if (cert)
        snprintf(d->cert_key, sizeof d->cert_key, "%s", zcert_public_txt(cert));
    zcert_destroy(&cert);
    d->retry_ms = KVEDGE_DIRPUB_RETRY_MIN_MS;
    kvedge_log_limit_init(&d->lines, KVEDGE_DIRPUB_PROBLEM_LOG_MS, 1, 4);
    kvedge_log_limit_init(&d->reg_lines, 60000, 3, 3);
    pthread_mutex_init(&d->reg_mu, NULL);
    d->reg.since_ms = kvedge_wall_ms();
    if (opts->node) {
        d->node = *opts->node;
        d->has_node = true;
    } else {
        d->reg.state = KVEDGE_DIRPUB_REGISTERED; /* nothing to keep registered */
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
    kvedge_log_limit_fini(&d->lines);
    kvedge_log_limit_fini(&d->reg_lines);
    pthread_mutex_destroy(&d->reg_mu);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->stop_mu);
    pthread_cond_destroy(&d->stop_cv);
    free(d);
    *self_p = NULL;
}
