/* The store node's storage optimizer: a pass every interval that prepares hot prefixes'
 * variants and demotes idle blocks, with its stats, log lines and MONITOR view. */
#include "store/node/optimizer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/log.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "access/codec/why.h"

/* One prefix of the last pass's top and its access count then. */
typedef struct {
    uint8_t key[KVEDGE_HOT_KEY_BYTES];
    uint64_t count;
} s_seen_t;

struct kvedge_optimizer_t {
    kvedge_optimizer_opts_t o;
    pthread_t thread;
    bool running;
    pthread_mutex_t mu; /* stop and the wait */
    pthread_cond_t cv;
    bool stop;
    pthread_mutex_t pass_mu; /* one pass at a time; guards seen */
    s_seen_t *seen;          /* the last pass's top (hot_top entries) */
    size_t n_seen;
    pthread_mutex_t stats_mu; /* stats */
    kvedge_optimizer_stats_t stats;
};

/* ---------------------------------------------------------------- checks */

int kvedge_optimizer_check(const kvedge_optimizer_opts_t *o, char *why, size_t why_len)
{
    if (!o)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "optimizer: no settings");
    if (!kvedge_prec_valid(o->demote_to) ||
        KVEDGE_PREC_BASE(o->demote_to) == KVEDGE_PREC_LOSSLESS || KVEDGE_PREC_IS_EC(o->demote_to))
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "demote_to must be a rung coarser than lossless (int8, int4-g32, "
                          "int4-g64, int4-g128, optionally +think-75 or +think-50), not %s",
                          kvedge_prec_name(o->demote_to));
    if (o->n_prepare && kvedge_prec_list_check(o->prepare, o->n_prepare) != KVEDGE_OK)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "prepare must list distinct rungs (at most %d), such as int4-g32",
                          KVEDGE_PREC_MAX_ACCEPT);
    for (size_t i = 0; i < o->n_prepare; i++)
        if (KVEDGE_PREC_BASE(o->prepare[i]) == KVEDGE_PREC_LOSSLESS &&
            KVEDGE_PREC_THINK(o->prepare[i]) == KVEDGE_PREC_THINK_NONE)
            return kvedge_why(why, why_len, KVEDGE_EINVAL,
                              "prepare: lossless is never made from anything but itself");
    if (o->hot_reads < 1)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "hot_reads must be at least 1");
    if (o->hot_top < 1 || o->hot_top > KVEDGE_OPTIMIZER_HOT_TOP_MAX)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "hot_top must be 1 ... %d",
                          KVEDGE_OPTIMIZER_HOT_TOP_MAX);
    return KVEDGE_OK;
}

int kvedge_optimizer_parse(const char *demote_to, const char *prepare,
                           kvedge_optimizer_opts_t *opts, char *why, size_t why_len)
{
    if (!demote_to || kvedge_prec_parse(demote_to, &opts->demote_to) != KVEDGE_OK)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "demote_to: '%s' is not a precision (int8, int4-g32, int4-g64, "
                          "int4-g128, optionally +think-75 or +think-50)",
                          demote_to ? demote_to : "");
    opts->n_prepare = 0;
    if (prepare && prepare[0] && strcmp(prepare, "none") != 0 &&
        kvedge_prec_list_parse(prepare, opts->prepare, KVEDGE_PREC_MAX_ACCEPT, &opts->n_prepare) !=
            KVEDGE_OK)
        return kvedge_why(why, why_len, KVEDGE_EINVAL,
                          "prepare: '%s' is not a list of distinct precisions such as "
                          "int4-g32,int4-g128 (or none)",
                          prepare);
    return kvedge_optimizer_check(opts, why, why_len);
}

/* ---------------------------------------------------------------- one pass */

/* Block keys of one chunk, collected by a scan before anything is written. */
typedef struct {
    kvedge_block_key_t *keys;
    size_t n, cap;
} s_keys_t;

static int s_collect(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *meta)
{
    (void)meta;
    s_keys_t *k = ctx;
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 64;
        kvedge_block_key_t *p = realloc(k->keys, cap * sizeof *p);
        if (!p)
            return KVEDGE_ENOMEM;
        k->keys = p;
        k->cap = cap;
    }
    k->keys[k->n++] = *key;
    return 0;
}

/* The prefixes of the analyzer's top that were read at least hot_reads times since the last
 * pass (a prefix new to the top: its count's lower bound); remembers this top for the next. */
static size_t s_hot(kvedge_optimizer_t *o, kvedge_hot_entry_t *top, size_t n,
                    kvedge_chunk_id_t *hot)
{
    size_t h = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t before = top[i].error; /* never seen: what Space-Saving may have inherited */
        for (size_t j = 0; j < o->n_seen; j++)
            if (memcmp(o->seen[j].key, top[i].key, KVEDGE_HOT_KEY_BYTES) == 0) {
                before = o->seen[j].count;
                break;
            }
        if (top[i].count >= before && top[i].count - before >= o->o.hot_reads)
            memcpy(hot[h++].bytes, top[i].key, KVEDGE_CHUNK_ID_BYTES);
    }
    for (size_t i = 0; i < n; i++) {
        memcpy(o->seen[i].key, top[i].key, KVEDGE_HOT_KEY_BYTES);
        o->seen[i].count = top[i].count;
    }
    o->n_seen = n;
    return h;
}

/* Prepares the configured variants of every block of the hot prefixes. Stops preparing at the
 * first variant that does not fit (nothing is evicted for them). */
static int s_prepare(kvedge_optimizer_t *o, const kvedge_chunk_id_t *hot, size_t n_hot,
                     kvedge_optimizer_stats_t *p)
{
    int rc = KVEDGE_OK;
    s_keys_t keys = {0};
    bool full = false;
    for (size_t i = 0; i < n_hot && !full && rc == KVEDGE_OK; i++) {
        keys.n = 0;
        rc = kvedge_engine_scan(o->o.engine, &hot[i], s_collect, &keys);
        if (rc == KVEDGE_ENOTFOUND) {
            rc = KVEDGE_OK; /* read, but not stored here (misses are hot too) */
            continue;
        }
        for (size_t b = 0; rc == KVEDGE_OK && !full && b < keys.n; b++)
            for (size_t r = 0; r < o->o.n_prepare; r++) {
                uint64_t bytes = 0;
                int prc = kvedge_engine_prepare_variant(o->o.engine, &keys.keys[b], o->o.prepare[r],
                                                        &bytes);
                if (prc == KVEDGE_OK && bytes) {
                    p->last_prepared++;
                    p->last_prepared_bytes += bytes;
                } else if (prc == KVEDGE_EFULL) {
                    p->prepare_full++;
                    full = true;
                    break;
                } else if (prc != KVEDGE_OK && prc != KVEDGE_EINVAL && prc != KVEDGE_ENOTFOUND &&
                           prc != KVEDGE_ECORRUPT && prc != KVEDGE_ENOBASIS) {
                    /* EINVAL: not derivable from this block's rung; ENOBASIS: tc of a model
                     * whose coding basis the node has not loaded */
                    rc = prc;
                    break;
                }
            }
    }
    free(keys.keys);
    return rc;
}

int kvedge_optimizer_pass(kvedge_optimizer_t *o, kvedge_optimizer_stats_t *pass)
{
    if (!o)
        return KVEDGE_EINVAL;
    pthread_mutex_lock(&o->pass_mu);
    int64_t t0 = kvedge_mono_ms();
    kvedge_optimizer_stats_t p;
    memset(&p, 0, sizeof p);
    int rc = KVEDGE_OK;
    /* Hot prefixes first: their blocks were just read, so idle demotion leaves them. */
    if (o->o.analyzer && o->o.n_prepare) {
        kvedge_hot_entry_t *top = calloc(o->o.hot_top, sizeof *top);
        kvedge_chunk_id_t *hot = calloc(o->o.hot_top, sizeof *hot);
        if (!top || !hot) {
            rc = KVEDGE_ENOMEM;
        } else {
            size_t n = kvedge_analyzer_top(o->o.analyzer, top, o->o.hot_top);
            size_t n_hot = s_hot(o, top, n, hot);
            p.last_hot = (uint32_t)n_hot;
            rc = s_prepare(o, hot, n_hot, &p);
        }
        free(top);
        free(hot);
    }
    if (rc == KVEDGE_OK && o->o.idle_s) {
        uint64_t n = 0;
        int64_t saved = 0;
        rc = kvedge_engine_demote_idle(o->o.engine, o->o.demote_to, (uint64_t)o->o.idle_s * 1000u,
                                       KVEDGE_OPTIMIZER_DEMOTE_MAX_PER_PASS, &n, &saved);
        p.last_demoted = n;
        p.last_saved_bytes = saved;
    }
    uint64_t took = (uint64_t)(kvedge_mono_ms() - t0);
    pthread_mutex_lock(&o->stats_mu);
    kvedge_optimizer_stats_t *s = &o->stats;
    s->passes++;
    s->last_pass_ms = kvedge_wall_ms();
    s->last_duration_ms = took;
    s->last_error = rc;
    s->last_hot = p.last_hot;
    s->last_prepared = p.last_prepared;
    s->last_prepared_bytes = p.last_prepared_bytes;
    s->last_demoted = p.last_demoted;
    s->last_saved_bytes = p.last_saved_bytes;
    s->prepared += p.last_prepared;
    s->prepared_bytes += p.last_prepared_bytes;
    s->prepare_full += p.prepare_full;
    s->demoted += p.last_demoted;
    s->saved_bytes += p.last_saved_bytes;
    if (pass)
        *pass = *s;
    uint64_t passes = s->passes;
    pthread_mutex_unlock(&o->stats_mu);
    pthread_mutex_unlock(&o->pass_mu);

    kvedge_engine_demote_stats_t ds = {0};
    (void)kvedge_engine_demote_stats(o->o.engine, &ds);
    uint64_t vblocks = 0, vbytes = 0;
    (void)kvedge_engine_variant_stats(o->o.engine, &vblocks, &vbytes);
    /* One line a pass when it did something (the interval bounds the rate), else debug. */
    bool did = p.last_prepared || p.last_demoted || p.prepare_full || rc != KVEDGE_OK;
    if (rc != KVEDGE_OK)
        kvedge_log_warn("optimizer pass %llu cut short: %s (prepared %llu variants, demoted %llu "
                        "blocks)",
                        (unsigned long long)passes, kvedge_strerror(rc),
                        (unsigned long long)p.last_prepared, (unsigned long long)p.last_demoted);
    else if (did)
        kvedge_log_info(
            "optimizer pass %llu: %u hot prefixes, %llu variants prepared (%llu bytes%s), %llu "
            "idle blocks demoted to %s (%lld bytes freed); held %llu variants (%llu bytes); "
            "under pressure since start %llu demoted, %llu variants dropped; %llu ms",
            (unsigned long long)passes, p.last_hot, (unsigned long long)p.last_prepared,
            (unsigned long long)p.last_prepared_bytes, p.prepare_full ? ", stopped: no room" : "",
            (unsigned long long)p.last_demoted, kvedge_prec_name(o->o.demote_to),
            (long long)p.last_saved_bytes, (unsigned long long)vblocks, (unsigned long long)vbytes,
            (unsigned long long)ds.pressure_demoted, (unsigned long long)ds.pressure_variant_blocks,
            (unsigned long long)took);
    else
        kvedge_log_debug("optimizer pass %llu: nothing to do (%u hot prefixes, %llu ms)",
                         (unsigned long long)passes, p.last_hot, (unsigned long long)took);
    return rc;
}

void kvedge_optimizer_stats(kvedge_optimizer_t *o, kvedge_optimizer_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (!o)
        return;
    pthread_mutex_lock(&o->stats_mu);
    *out = o->stats;
    pthread_mutex_unlock(&o->stats_mu);
}

int kvedge_optimizer_json(kvedge_optimizer_t *o, cJSON *obj)
{
    if (!o || !obj)
        return -1;
    kvedge_optimizer_stats_t s;
    kvedge_optimizer_stats(o, &s);
    cJSON_AddNumberToObject(obj, "interval_s", o->o.interval_s);
    cJSON_AddStringToObject(obj, "demote_to", kvedge_prec_name(o->o.demote_to));
    cJSON_AddNumberToObject(obj, "demote_idle_s", o->o.idle_s);
    cJSON_AddBoolToObject(obj, "demote_on_pressure", o->o.pressure);
    cJSON *prep = cJSON_AddArrayToObject(obj, "prepare");
    for (size_t i = 0; prep && i < o->o.n_prepare; i++)
        cJSON_AddItemToArray(prep, cJSON_CreateString(kvedge_prec_name(o->o.prepare[i])));
    cJSON_AddNumberToObject(obj, "hot_reads", o->o.hot_reads);
    cJSON_AddNumberToObject(obj, "hot_top", o->o.hot_top);
    cJSON_AddNumberToObject(obj, "passes", (double)s.passes);
    cJSON_AddNumberToObject(obj, "last_pass_ms", (double)s.last_pass_ms);
    cJSON *last = cJSON_AddObjectToObject(obj, "last");
    if (last) {
        cJSON_AddNumberToObject(last, "duration_ms", (double)s.last_duration_ms);
        cJSON_AddStringToObject(last, "error", s.last_error ? kvedge_strerror(s.last_error) : "");
        cJSON_AddNumberToObject(last, "hot_prefixes", s.last_hot);
        cJSON_AddNumberToObject(last, "variants_prepared", (double)s.last_prepared);
        cJSON_AddNumberToObject(last, "variant_bytes_prepared", (double)s.last_prepared_bytes);
        cJSON_AddNumberToObject(last, "demoted_blocks", (double)s.last_demoted);
        cJSON_AddNumberToObject(last, "saved_bytes", (double)s.last_saved_bytes);
    }
    cJSON_AddNumberToObject(obj, "variants_prepared", (double)s.prepared);
    cJSON_AddNumberToObject(obj, "variant_bytes_prepared", (double)s.prepared_bytes);
    cJSON_AddNumberToObject(obj, "prepare_no_room", (double)s.prepare_full);
    cJSON_AddNumberToObject(obj, "idle_demoted_blocks", (double)s.demoted);
    cJSON_AddNumberToObject(obj, "idle_saved_bytes", (double)s.saved_bytes);
    return prep && last ? 0 : -1;
}

/* ---------------------------------------------------------------- the thread */

static void *s_run(void *arg)
{
    kvedge_optimizer_t *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)o->o.interval_s;
        while (!o->stop && pthread_cond_timedwait(&o->cv, &o->mu, &ts) == 0) {
        }
        if (o->stop)
            break;
        pthread_mutex_unlock(&o->mu);
        (void)kvedge_optimizer_pass(o, NULL); /* it logs what went wrong */
        pthread_mutex_lock(&o->mu);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

int kvedge_optimizer_start(const kvedge_optimizer_opts_t *opts, kvedge_optimizer_t **out, char *why,
                           size_t why_len)
{
    if (!out)
        return KVEDGE_EINVAL;
    *out = NULL;
    int rc = kvedge_optimizer_check(opts, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    if (!opts->engine)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "optimizer: no engine");
    kvedge_optimizer_t *o = calloc(1, sizeof *o);
    if (!o)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    o->o = *opts;
    if (!o->o.interval_s)
        o->o.interval_s = KVEDGE_OPTIMIZER_INTERVAL_S_DEFAULT;
    o->seen = calloc(o->o.hot_top, sizeof *o->seen);
    if (!o->seen) {
        free(o);
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&o->mu, NULL);
    pthread_mutex_init(&o->pass_mu, NULL);
    pthread_mutex_init(&o->stats_mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    if (pthread_create(&o->thread, NULL, s_run, o) != 0) {
        kvedge_optimizer_destroy(&o);
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "cannot start the optimizer thread");
    }
    o->running = true;
    *out = o;
    return KVEDGE_OK;
}

void kvedge_optimizer_destroy(kvedge_optimizer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_optimizer_t *o = *self_p;
    *self_p = NULL;
    if (o->running) {
        pthread_mutex_lock(&o->mu);
        o->stop = true;
        pthread_cond_signal(&o->cv);
        pthread_mutex_unlock(&o->mu);
        pthread_join(o->thread, NULL);
    }
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->stats_mu);
    pthread_mutex_destroy(&o->pass_mu);
    pthread_mutex_destroy(&o->mu);
    free(o->seen);
    free(o);
}
