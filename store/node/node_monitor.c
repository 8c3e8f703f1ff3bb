/* The store node's monitoring: its metrics registry (the I/O Analyzer's families plus gauges
 * read from the engine, the historical cache and the master link at scrape time), the HTTP
 * endpoint (/metrics, /health, /ready) and the MONITOR document. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"
#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "store/node/node_impl.h"
#include "access/codec/why.h"

#define S_LAYER_RANKS 3 /* hot prefixes whose per-layer counts /metrics shows */

/* Engine counters mirrored into Prometheus counters (added by their change since the last
 * scrape, so they only go up while the node runs). */
typedef struct {
    kvedge_series_t *series;
    uint64_t last;
} s_mirror_t;

struct kvedge_node_mon_t {
    pthread_mutex_t mu; /* collect runs on the HTTP thread; MONITOR on the frontend */
    kvedge_series_t *blocks, *bytes, *fp16_bytes, *pinned_blocks, *pinned_bytes, *capacity,
        *quarantine, *registered, *reachable, *uptime;
    s_mirror_t puts, evicted_blocks, evicted_bytes, expired, corrupt, written, read, denials;
    s_mirror_t derived, derived_kept; /* precisions derived for readers, and those kept */
    kvedge_metric_t *hot, *hot_layers, *sync_state, *sync_missing, *sync_held, *sync_age;
    /* Precisions and the storage optimizer: variants held, demotions by cause (idle: the
     * optimizer's passes; pressure: the engine, before evicting), variants prepared and
     * dropped under pressure. */
    kvedge_series_t *variant_blocks, *variant_bytes, *opt_hot;
    /* The store's disk (kvedge_engine_disk). */
    kvedge_series_t *disk_free, *disk_size, *disk_files, *disk_full, *disk_reserve;
    s_mirror_t disk_refused, disk_failed;
    kvedge_metric_t *demoted_f, *demoted_bytes_f;
    s_mirror_t demoted_idle, demoted_pressure, saved_idle, saved_pressure, prepared, prepared_bytes,
        vdropped, vdropped_bytes, opt_passes;
};

static kvedge_series_t *s_gauge(kvedge_metrics_t *r, kvedge_metric_type_t type, const char *name,
                                const char *help)
{
    return kvedge_metrics_single(r, type, name, help, NULL, NULL, 0);
}

static void s_mirror(s_mirror_t *m, uint64_t now)
{
    kvedge_series_mirror(m->series, &m->last, now);
}

static const char *s_sync_state_name(kvedge_hsync_state_t st)
{
    switch (st) {
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

/* The historical cache's state, copied out (NULL when the node keeps none). Caller frees
 * *subs and *st. */
static size_t s_sync_status(kvedge_node_t *n, kvedge_hsync_sub_t **subs, kvedge_hsync_status_t **st,
                            uint64_t *last_pass_ms)
{
    *subs = NULL;
    *st = NULL;
    *last_pass_ms = 0;
    if (!n->sched)
        return 0;
    *subs = calloc(KVEDGE_HSYNC_MAX_SUBS, sizeof **subs);
    *st = calloc(KVEDGE_HSYNC_MAX_SUBS, sizeof **st);
    size_t count = 0;
    if (!*subs || !*st ||
        kvedge_hsync_sched_status(n->sched, *subs, *st, KVEDGE_HSYNC_MAX_SUBS, &count,
                                  last_pass_ms) != KVEDGE_OK)
        count = 0;
    return count;
}

/* Registration with the master, as the replicated registry shows it: registered once the view
 * follows the master and holds this node's record. Returns true when registered; *state
 * names the state, why says what is missing. */
static bool s_registered(kvedge_node_t *n, const char **state, char *why, size_t why_len)
{
    why[0] = '\0';
    if (!n->view) {
        *state = "not joined";
        snprintf(why, why_len, "not joined to the master %.300s", n->s.master);
        return false;
    }
    kvedge_mview_state_t vs = kvedge_mview_state(n->view);
    kvedge_master_node_t rec;
    if (vs != KVEDGE_MVIEW_SYNCED) {
        *state = "unreachable";
        snprintf(why, why_len,
                 "the master %.300s does not answer (if it runs with CURVE: is this node's "
                 "certificate %.600s in its clients directory?)",
                 n->s.master, n->s.cert);
        return false;
    }
    if (kvedge_mview_node(n->view, n->s.node_id, &rec) != KVEDGE_OK) {
        *state = "pending";
        snprintf(why, why_len, "the registry has no record node/%s yet", n->s.node_id);
        return false;
    }
    *state = "registered";
    return true;
}

/* The registration as the directory publisher tracks it (refusals, failures, attempts), or
 * as the replicated registry shows it when there is no publisher. */
static bool s_registration(kvedge_node_t *n, const char **state, char *why, size_t why_len,
                           uint32_t *attempts)
{
    *attempts = 0;
    if (!n->dirpub)
        return s_registered(n, state, why, why_len);
    kvedge_dirpub_reg_t reg;
    kvedge_dirpub_registration(n->dirpub, &reg);
    *state = kvedge_dirpub_reg_state_name(reg.state);
    *attempts = reg.attempts;
    snprintf(why, why_len, "%s", reg.why);
    return reg.state == KVEDGE_DIRPUB_REGISTERED;
}

/* Whether the node hears its master now: the view follows its updates. */
static bool s_reachable(kvedge_node_t *n)
{
    return n->view && kvedge_mview_state(n->view) == KVEDGE_MVIEW_SYNCED;
}

static void s_hex8(const uint8_t *b, char out[17])
{
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void s_collect(kvedge_metrics_t *r, void *arg)
{
    (void)r;
    kvedge_node_t *n = arg;
    struct kvedge_node_mon_t *m = n->mon;
    pthread_mutex_lock(&m->mu);
    kvedge_engine_stats_t es;
    if (kvedge_engine_stats(n->engine, &es) == KVEDGE_OK) {
        kvedge_series_set(m->blocks, (double)es.blocks);
        kvedge_series_set(m->bytes, (double)es.bytes);
        kvedge_series_set(m->fp16_bytes, (double)es.fp16_bytes);
        kvedge_series_set(m->pinned_blocks, (double)es.pinned_blocks);
        kvedge_series_set(m->pinned_bytes, (double)es.pinned_bytes);
        kvedge_series_set(m->capacity, (double)es.capacity_bytes);
        kvedge_series_set(m->quarantine, (double)es.quarantined);
        s_mirror(&m->puts, es.puts);
        s_mirror(&m->evicted_blocks, es.evicted_blocks);
        s_mirror(&m->evicted_bytes, es.evicted_bytes);
        s_mirror(&m->expired, es.expired);
        s_mirror(&m->corrupt, es.corrupt);
        s_mirror(&m->written, es.bytes_written);
        s_mirror(&m->read, es.bytes_read);
    }
    kvedge_engine_disk_t dk;
    if (kvedge_engine_disk(n->engine, &dk) == KVEDGE_OK) {
        kvedge_series_set(m->disk_free, (double)dk.free_bytes);
        kvedge_series_set(m->disk_size, (double)dk.fs_bytes);
        kvedge_series_set(m->disk_files, (double)dk.files_bytes);
        kvedge_series_set(m->disk_full, dk.full || dk.write_failed ? 1.0 : 0.0);
        kvedge_series_set(m->disk_reserve, dk.reserve_held ? (double)dk.reserve_bytes : 0.0);
        s_mirror(&m->disk_refused, dk.refused);
        s_mirror(&m->disk_failed, dk.write_failed ? 1 : 0);
    }
    uint64_t vblocks = 0, vbytes = 0;
    if (kvedge_engine_variant_stats(n->engine, &vblocks, &vbytes) == KVEDGE_OK) {
        kvedge_series_set(m->variant_blocks, (double)vblocks);
        kvedge_series_set(m->variant_bytes, (double)vbytes);
    }
    kvedge_engine_demote_stats_t ds;
    if (kvedge_engine_demote_stats(n->engine, &ds) == KVEDGE_OK) {
        s_mirror(&m->demoted_pressure, ds.pressure_demoted);
        s_mirror(&m->saved_pressure, ds.pressure_saved_bytes);
        s_mirror(&m->vdropped, ds.pressure_variant_blocks);
        s_mirror(&m->vdropped_bytes, ds.pressure_variant_bytes);
    }
    if (n->optimizer) {
        kvedge_optimizer_stats_t os;
        kvedge_optimizer_stats(n->optimizer, &os);
        s_mirror(&m->demoted_idle, os.demoted);
        s_mirror(&m->saved_idle, os.saved_bytes > 0 ? (uint64_t)os.saved_bytes : 0);
        s_mirror(&m->prepared, os.prepared);
        s_mirror(&m->prepared_bytes, os.prepared_bytes);
        s_mirror(&m->opt_passes, os.passes);
        kvedge_series_set(m->opt_hot, os.last_hot);
    }
    kvedge_series_set(m->uptime, (double)((uint64_t)kvedge_mono_ms() - n->start_mono_ms) / 1e3);
    s_mirror(&m->denials, kvedge_server_denials(n->server));
    uint64_t derived, kept;
    kvedge_server_derived(n->server, &derived, &kept);
    s_mirror(&m->derived, derived);
    s_mirror(&m->derived_kept, kept);
    if (n->s.master[0]) {
        const char *state;
        char why[1536];
        uint32_t attempts;
        kvedge_series_set(m->registered,
                          s_registration(n, &state, why, sizeof why, &attempts) ? 1 : 0);
        kvedge_series_set(m->reachable, s_reachable(n) ? 1 : 0);
    }
    /* The hot set: top-K only, replaced at every scrape, so the series stay bounded. */
    kvedge_hot_entry_t *top = calloc(KVEDGE_ANALYZER_METRICS_TOP, sizeof *top);
    size_t nt = top ? kvedge_analyzer_top(n->analyzer, top, KVEDGE_ANALYZER_METRICS_TOP) : 0;
    kvedge_metric_reset(m->hot);
    kvedge_metric_reset(m->hot_layers);
    for (size_t i = 0; i < nt; i++) {
        char rank[24], id[17];
        snprintf(rank, sizeof rank, "%zu", i + 1);
        s_hex8(top[i].key, id);
        const char *v[] = {rank, id, top[i].label};
        kvedge_series_set(kvedge_metric_series(m->hot, v, 3), (double)top[i].count);
        for (uint32_t l = 0; i < S_LAYER_RANKS && l < KVEDGE_HOT_LAYERS; l++) {
            if (!top[i].layers[l])
                continue;
            char layer[16];
            snprintf(layer, sizeof layer, "%u", l);
            const char *lv[] = {rank, layer};
            kvedge_series_set(kvedge_metric_series(m->hot_layers, lv, 2), (double)top[i].layers[l]);
        }
    }
    free(top);
    /* The historical cache: one series per subscription (at most KVEDGE_HSYNC_MAX_SUBS). */
    kvedge_hsync_sub_t *subs;
    kvedge_hsync_status_t *st;
    uint64_t last_pass;
    size_t ns = s_sync_status(n, &subs, &st, &last_pass);
    uint64_t now = (uint64_t)kvedge_wall_ms();
    for (size_t i = 0; i < ns; i++) {
        const char *v[] = {subs[i].name};
        kvedge_series_set(kvedge_metric_series(m->sync_state, v, 1), (double)st[i].state);
        kvedge_series_set(kvedge_metric_series(m->sync_missing, v, 1),
                          (double)(st[i].chunks_total > st[i].chunks_synced
                                       ? st[i].chunks_total - st[i].chunks_synced
                                       : 0));
        kvedge_series_set(kvedge_metric_series(m->sync_held, v, 1), (double)st[i].blocks_held);
        if (st[i].last_ok_ms)
            kvedge_series_set(kvedge_metric_series(m->sync_age, v, 1),
                              now > st[i].last_ok_ms ? (double)(now - st[i].last_ok_ms) / 1e3 : 0);
    }
    free(subs);
    free(st);
    pthread_mutex_unlock(&m->mu);
}

static bool s_ready(void *arg, char *why, size_t why_len)
{
    kvedge_node_t *n = arg;
    if (!n->engine || !n->server) {
        snprintf(why, why_len, "the store is not open");
        return false;
    }
    if (n->s.master[0]) {
        const char *state;
        char reason[1536];
        uint32_t attempts;
        /* A node that lost its master after registering serves as before: still ready (an
         * orchestrator that pulled every node when the master dies would turn one loss into
         * an outage); the state, the gauges and the log say it. */
        if (!s_registration(n, &state, reason, sizeof reason, &attempts) &&
            strcmp(state, kvedge_dirpub_reg_state_name(KVEDGE_DIRPUB_LOST)) != 0) {
            snprintf(why, why_len, "not registered with the master (%s): %s", state, reason);
            return false;
        }
    }
    return true;
}

/* The node's own families (the analyzer declares its own). Returns false when one could not be
 * made (why says which). */
static bool s_node_families(kvedge_node_t *n, char *why, size_t why_len)
{
    struct kvedge_node_mon_t *m = n->mon;
    kvedge_metrics_t *r = n->metrics;
    const kvedge_metric_type_t G = KVEDGE_METRIC_GAUGE, C = KVEDGE_METRIC_COUNTER;
    m->blocks = s_gauge(r, G, "kvedge_node_blocks", "Blocks stored.");
    m->bytes = s_gauge(r, G, "kvedge_node_stored_bytes", "Encoded block bytes stored.");
    m->fp16_bytes = s_gauge(r, G, "kvedge_node_fp16_bytes",
                            "What the stored blocks would take as fp16 (stored/fp16: the "
                            "compression).");
    m->pinned_blocks = s_gauge(r, G, "kvedge_node_pinned_blocks", "Pinned blocks (never evicted).");
    m->pinned_bytes = s_gauge(r, G, "kvedge_node_pinned_bytes", "Bytes of the pinned blocks.");
    m->capacity = s_gauge(r, G, "kvedge_node_capacity_bytes",
                          "Capacity beyond which unpinned blocks are evicted; 0: no limit.");
    m->quarantine = s_gauge(r, G, "kvedge_node_quarantine_blocks",
                            "Blocks held in the quarantine column family.");
    m->puts.series = s_gauge(r, C, "kvedge_node_block_puts_total", "Blocks written.");
    m->evicted_blocks.series =
        s_gauge(r, C, "kvedge_node_evicted_blocks_total", "Blocks evicted for capacity.");
    m->evicted_bytes.series =
        s_gauge(r, C, "kvedge_node_evicted_bytes_total", "Bytes evicted for capacity.");
    m->expired.series = s_gauge(r, C, "kvedge_node_expired_blocks_total",
                                "Blocks dropped because their TTL ran out.");
    m->corrupt.series = s_gauge(r, C, "kvedge_node_corrupt_blocks_total",
                                "Blocks that failed verification (reads and kvedge verify).");
    m->written.series =
        s_gauge(r, C, "kvedge_node_engine_written_bytes_total", "Block bytes the engine wrote.");
    m->read.series =
        s_gauge(r, C, "kvedge_node_engine_read_bytes_total", "Block bytes the engine read.");
    m->denials.series = s_gauge(r, C, "kvedge_node_handshake_denials_total",
                                "CURVE handshakes refused: client keys not in the allowlist "
                                "(each is logged, a few a minute per address).");
    m->derived.series = s_gauge(r, C, "kvedge_node_derived_blocks_total",
                                "Blocks served at a precision the node did not hold, re-encoded "
                                "from a finer one (setting derive).");
    m->derived_kept.series =
        s_gauge(r, C, "kvedge_node_derived_kept_blocks_total",
                "Derived blocks kept as variants of their block (setting keep_derived).");
    m->registered = s_gauge(r, G, "kvedge_node_master_registered",
                            "1 when the node is registered with its Storage Master, else 0 "
                            "(absent without a master).");
    m->reachable = s_gauge(r, G, "kvedge_node_master_reachable",
                           "1 while the node hears its Storage Master (HUGZ, heartbeat answers), "
                           "0 once it has been silent past the deadline (absent without a "
                           "master).");
    const char *hot_l[] = {"rank", "prefix", "model"}, *layer_l[] = {"rank", "layer"},
               *sub_l[] = {"subscription"};
    m->hot = kvedge_metrics_family(
        r, G, "kvedge_node_hot_prefix_accesses",
        "Accesses to the hottest prefixes (Space-Saving estimate, an upper bound), top 10 by rank; "
        "prefix: the first 8 bytes of the stored chunk id.",
        hot_l, 3, NULL, KVEDGE_ANALYZER_METRICS_TOP, why, why_len);
    m->hot_layers =
        kvedge_metrics_family(r, G, "kvedge_node_hot_prefix_layer_accesses",
                              "Accesses per layer of the three hottest prefixes (rank as in "
                              "kvedge_node_hot_prefix_accesses).",
                              layer_l, 2, NULL, S_LAYER_RANKS * KVEDGE_HOT_LAYERS, why, why_len);
    m->sync_state = kvedge_metrics_family(
        r, G, "kvedge_node_sync_state",
        "Historical cache: the last pass of each subscription (0 never, 1 ok, 2 partial, 3 "
        "failed).",
        sub_l, 1, NULL, KVEDGE_HSYNC_MAX_SUBS, why, why_len);
    m->sync_missing = kvedge_metrics_family(
        r, G, "kvedge_node_sync_chunks_missing",
        "Historical cache: chunks of the subscribed context on the cloud not complete here.", sub_l,
        1, NULL, KVEDGE_HSYNC_MAX_SUBS, why, why_len);
    m->sync_held = kvedge_metrics_family(r, G, "kvedge_node_sync_blocks_held",
                                         "Historical cache: blocks of the context held here.",
                                         sub_l, 1, NULL, KVEDGE_HSYNC_MAX_SUBS, why, why_len);
    m->sync_age = kvedge_metrics_family(
        r, G, "kvedge_node_sync_last_success_age_seconds",
        "Historical cache: seconds since the last pass that copied the whole context.", sub_l, 1,
        NULL, KVEDGE_HSYNC_MAX_SUBS, why, why_len);
    const char *cause_l[] = {"cause"}, *idle_v[] = {"idle"}, *pressure_v[] = {"pressure"};
    m->disk_free =
        s_gauge(r, G, "kvedge_node_disk_free_bytes", "Free bytes on the store's file system.");
    m->disk_size = s_gauge(r, G, "kvedge_node_disk_size_bytes", "Size of the store's file system.");
    m->disk_files = s_gauge(r, G, "kvedge_node_store_files_bytes",
                            "Bytes of the store's table and blob files.");
    m->disk_full = s_gauge(r, G, "kvedge_node_disk_full",
                           "1 while block writes are refused for want of disk space.");
    m->disk_reserve = s_gauge(r, G, "kvedge_node_disk_reserve_bytes",
                              "Bytes held in the reserve file (0 once given back to a full disk).");
    m->disk_refused.series = s_gauge(r, C, "kvedge_node_disk_refused_writes_total",
                                     "Block writes refused with KVEDGE_ENOSPC.");
    m->disk_failed.series =
        s_gauge(r, C, "kvedge_node_store_write_failures_total",
                "1 once RocksDB failed a write (writes stopped until restart).");
    m->variant_blocks = s_gauge(r, G, "kvedge_node_variant_blocks",
                                "Variants held: other precisions of stored blocks.");
    m->variant_bytes = s_gauge(r, G, "kvedge_node_variant_bytes",
                               "Encoded bytes of the variants held (they count toward capacity).");
    m->demoted_f = kvedge_metrics_family(
        r, C, "kvedge_node_demoted_blocks_total",
        "Blocks re-encoded at a coarser precision, by cause (idle: a storage-optimizer pass; "
        "pressure: capacity, before evicting).",
        cause_l, 1, NULL, 2, why, why_len);
    m->demoted_bytes_f = kvedge_metrics_family(
        r, C, "kvedge_node_demoted_saved_bytes_total",
        "Bytes freed by demotions (smaller blocks, variants dropped with them), by cause.", cause_l,
        1, NULL, 2, why, why_len);
    if (m->demoted_f && m->demoted_bytes_f) {
        m->demoted_idle.series = kvedge_metric_series(m->demoted_f, idle_v, 1);
        m->demoted_pressure.series = kvedge_metric_series(m->demoted_f, pressure_v, 1);
        m->saved_idle.series = kvedge_metric_series(m->demoted_bytes_f, idle_v, 1);
        m->saved_pressure.series = kvedge_metric_series(m->demoted_bytes_f, pressure_v, 1);
    }
    m->prepared.series = s_gauge(r, C, "kvedge_node_variants_prepared_total",
                                 "Variants the storage optimizer stored ahead of demand for hot "
                                 "prefixes.");
    m->prepared_bytes.series = s_gauge(r, C, "kvedge_node_variants_prepared_bytes_total",
                                       "Bytes of the variants prepared ahead of demand.");
    m->vdropped.series = s_gauge(r, C, "kvedge_node_pressure_variant_drops_total",
                                 "Variants dropped to make room before any block was demoted or "
                                 "evicted.");
    m->vdropped_bytes.series = s_gauge(r, C, "kvedge_node_pressure_variant_drop_bytes_total",
                                       "Bytes of the variants dropped under capacity pressure.");
    m->opt_passes.series =
        s_gauge(r, C, "kvedge_node_optimizer_passes_total", "Storage-optimizer passes run.");
    m->opt_hot = s_gauge(r, G, "kvedge_node_optimizer_hot_prefixes",
                         "Hot prefixes the last storage-optimizer pass prepared variants for.");
    if (!m->variant_blocks || !m->variant_bytes || !m->demoted_idle.series ||
        !m->demoted_pressure.series || !m->saved_idle.series || !m->saved_pressure.series ||
        !m->prepared.series || !m->prepared_bytes.series || !m->vdropped.series ||
        !m->vdropped_bytes.series || !m->opt_passes.series || !m->opt_hot)
        return false;
    return m->blocks && m->bytes && m->fp16_bytes && m->pinned_blocks && m->pinned_bytes &&
           m->capacity && m->quarantine && m->puts.series && m->evicted_blocks.series &&
           m->evicted_bytes.series && m->expired.series && m->corrupt.series && m->written.series &&
           m->read.series && m->denials.series && m->derived.series && m->derived_kept.series &&
           m->registered && m->reachable && m->hot && m->hot_layers && m->sync_state &&
           m->sync_missing && m->sync_held && m->sync_age;
}

int kvedge_node_monitor_open(kvedge_node_t *n, char *why, size_t why_len)
{
    n->start_wall_ms = (uint64_t)kvedge_wall_ms();
    n->start_mono_ms = (uint64_t)kvedge_mono_ms();
    n->metrics = kvedge_metrics_new();
    n->mon = calloc(1, sizeof *n->mon);
    if (!n->metrics || !n->mon)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    struct kvedge_node_mon_t *m = n->mon;
    pthread_mutex_init(&m->mu, NULL);
    kvedge_metrics_t *r = n->metrics;
    if (kvedge_metrics_process(r, KVEDGE_VERSION_STRING,
                               n->s.role == KVEDGE_ROLE_CLOUD ? "cloud" : "edge",
                               (double)n->start_wall_ms / 1e3, why, why_len) != 0)
        return KVEDGE_ENOMEM;
    m->uptime = s_gauge(r, KVEDGE_METRIC_GAUGE, "kvedge_uptime_seconds",
                        "Seconds since the daemon started.");
    if (!s_node_families(n, why, why_len))
        return KVEDGE_ENOMEM;
    if (n->s.monitor) {
        n->analyzer = kvedge_analyzer_new(r, (size_t)kvedge_server_workers((int)n->s.workers) + 1,
                                          why, why_len);
        if (!n->analyzer)
            return KVEDGE_ENOMEM;
    }
    if (kvedge_metrics_on_collect(r, s_collect, n) != 0)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of collectors");
    return KVEDGE_OK;
}

int kvedge_node_monitor_serve(kvedge_node_t *n, char *why, size_t why_len)
{
    if (!n->s.metrics[0] || strcmp(n->s.metrics, KVEDGE_HTTP_OFF) == 0)
        return KVEDGE_OK;
    int rc = kvedge_http_start(n->s.metrics, n->metrics, s_ready, n, &n->http, why, why_len);
    if (rc == KVEDGE_OK)
        kvedge_log_info("metrics on %s/metrics (health: /health, readiness: /ready)",
                        kvedge_http_url(n->http));
    return rc;
}

void kvedge_node_monitor_close(kvedge_node_t *n)
{
    kvedge_http_stop(&n->http);
    kvedge_analyzer_destroy(&n->analyzer);
    kvedge_metrics_destroy(&n->metrics);
    if (n->mon) {
        pthread_mutex_destroy(&n->mon->mu);
        free(n->mon);
        n->mon = NULL;
    }
}

/* ---------------------------------------------------------------- MONITOR */

static void s_json_store(kvedge_node_t *n, cJSON *root)
{
    kvedge_engine_stats_t es;
    if (kvedge_engine_stats(n->engine, &es) != KVEDGE_OK)
        return;
    cJSON *o = cJSON_AddObjectToObject(root, "store");
    cJSON_AddNumberToObject(o, "blocks", (double)es.blocks);
    cJSON_AddNumberToObject(o, "bytes", (double)es.bytes);
    cJSON_AddNumberToObject(o, "fp16_bytes", (double)es.fp16_bytes);
    cJSON_AddNumberToObject(o, "pinned_blocks", (double)es.pinned_blocks);
    cJSON_AddNumberToObject(o, "pinned_bytes", (double)es.pinned_bytes);
    cJSON_AddNumberToObject(o, "capacity_bytes", (double)es.capacity_bytes);
    cJSON_AddNumberToObject(o, "quarantined", (double)es.quarantined);
    cJSON_AddNumberToObject(o, "evicted_blocks", (double)es.evicted_blocks);
    cJSON_AddNumberToObject(o, "expired", (double)es.expired);
}

/* The storage optimizer and what capacity pressure did: always there ("enabled": false
 * when off), so a reader sees whether demotion can happen. */
static void s_json_optimizer(kvedge_node_t *n, cJSON *root)
{
    cJSON *o = cJSON_AddObjectToObject(root, "optimizer");
    if (!o)
        return;
    cJSON_AddBoolToObject(o, "enabled", n->optimizer != NULL);
    if (n->optimizer)
        (void)kvedge_optimizer_json(n->optimizer, o);
    uint64_t vblocks = 0, vbytes = 0;
    (void)kvedge_engine_variant_stats(n->engine, &vblocks, &vbytes);
    cJSON_AddNumberToObject(o, "variant_blocks", (double)vblocks);
    cJSON_AddNumberToObject(o, "variant_bytes", (double)vbytes);
    kvedge_engine_demote_stats_t ds;
    if (kvedge_engine_demote_stats(n->engine, &ds) == KVEDGE_OK) {
        cJSON_AddNumberToObject(o, "demoted_blocks", (double)ds.demoted);
        cJSON_AddNumberToObject(o, "demoted_saved_bytes", (double)ds.saved_bytes);
        cJSON_AddNumberToObject(o, "pressure_demoted_blocks", (double)ds.pressure_demoted);
        cJSON_AddNumberToObject(o, "pressure_saved_bytes", (double)ds.pressure_saved_bytes);
        cJSON_AddNumberToObject(o, "pressure_variant_drops", (double)ds.pressure_variant_blocks);
        cJSON_AddNumberToObject(o, "pressure_variant_drop_bytes",
                                (double)ds.pressure_variant_bytes);
    }
}

static void s_json_sync(kvedge_node_t *n, cJSON *root)
{
    kvedge_hsync_sub_t *subs;
    kvedge_hsync_status_t *st;
    uint64_t last_pass;
    size_t ns = s_sync_status(n, &subs, &st, &last_pass);
    if (n->sched) {
        cJSON *o = cJSON_AddObjectToObject(root, "sync");
        cJSON_AddNumberToObject(o, "last_pass_ms", (double)last_pass);
        cJSON *arr = cJSON_AddArrayToObject(o, "subscriptions");
        for (size_t i = 0; arr && i < ns; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", subs[i].name);
            cJSON_AddStringToObject(e, "cloud", subs[i].cloud);
            cJSON_AddStringToObject(e, "state", s_sync_state_name(st[i].state));
            cJSON_AddNumberToObject(e, "chunks_total", st[i].chunks_total);
            cJSON_AddNumberToObject(e, "chunks_synced", st[i].chunks_synced);
            cJSON_AddNumberToObject(e, "blocks_held", (double)st[i].blocks_held);
            cJSON_AddNumberToObject(e, "last_ok_ms", (double)st[i].last_ok_ms);
            cJSON_AddStringToObject(e, "last_error",
                                    st[i].last_error ? kvedge_strerror(st[i].last_error) : "");
            cJSON_AddItemToArray(arr, e);
        }
    }
    free(subs);
    free(st);
}

char *kvedge_node_monitor_doc(void *arg, uint32_t top, size_t *len)
{
    kvedge_node_t *n = arg;
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON_AddStringToObject(root, "kind", "node");
    cJSON_AddStringToObject(root, "name", n->s.name[0] ? n->s.name : "kvedge");
    cJSON_AddStringToObject(root, "role", n->s.role == KVEDGE_ROLE_CLOUD ? "cloud" : "edge");
    cJSON_AddStringToObject(root, "version", KVEDGE_VERSION_STRING);
    cJSON_AddNumberToObject(root, "time_ms", (double)kvedge_wall_ms());
    cJSON_AddNumberToObject(root, "uptime_ms",
                            (double)((uint64_t)kvedge_mono_ms() - n->start_mono_ms));
    cJSON_AddBoolToObject(root, "monitor", n->analyzer != NULL);
    char why[2048] = "";
    bool ready = s_ready(n, why, sizeof why);
    cJSON_AddBoolToObject(root, "ready", ready);
    if (!ready)
        cJSON_AddStringToObject(root, "not_ready", why);
    if (kvedge_analyzer_json(n->analyzer, root, top) != 0) {
        cJSON_Delete(root);
        return NULL;
    }
    s_json_store(n, root);
    s_json_optimizer(n, root);
    s_json_sync(n, root);
    if (n->s.master[0]) {
        cJSON *o = cJSON_AddObjectToObject(root, "master");
        cJSON_AddStringToObject(o, "endpoint", n->s.master);
        cJSON_AddStringToObject(o, "node_id", n->s.node_id);
        /* The master the view follows now (of a list, or the leader one named), and how often
         * it moved. */
        kvedge_mview_conn_t conn;
        kvedge_mview_conn(n->view, &conn);
        cJSON_AddStringToObject(o, "following", conn.endpoint);
        cJSON_AddNumberToObject(o, "moves", (double)conn.moves);
        cJSON_AddNumberToObject(o, "redirects", (double)conn.redirects);
        const char *state;
        char reason[1536];
        uint32_t attempts;
        s_registration(n, &state, reason, sizeof reason, &attempts);
        cJSON_AddStringToObject(o, "state", state);
        cJSON_AddBoolToObject(o, "reachable", s_reachable(n));
        if (n->dirpub) {
            kvedge_dirpub_reg_t reg;
            kvedge_dirpub_registration(n->dirpub, &reg);
            cJSON_AddNumberToObject(o, "since_ms", (double)reg.since_ms);
        }
        cJSON_AddNumberToObject(o, "attempts", attempts);
        cJSON_AddStringToObject(o, "why", reason);
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (out && len)
        *len = strlen(out);
    return out;
}
