/* A MONITOR document (a store node's or an edge proxy's, docs/protocol.md) parsed into a
 * fixed-size snapshot for `kvedge top`, `kvedge sources` and `kvedge stat`. The document comes
 * from a peer: every field is type-checked, and what is missing or of the wrong type stays
 * zero or empty. */
#ifndef KVEDGE_CLIENTS_CLI_TOP_DOC_H
#define KVEDGE_CLIENTS_CLI_TOP_DOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "monitor/metrics.h"

/* Caps: entries past them are dropped (the counts of what was dropped are not kept). */
#define KVEDGE_TOP_DOC_MAX_SOURCES     32
#define KVEDGE_TOP_DOC_MAX_OPS         18 /* opcodes 0 (UNKNOWN) ... 17 (MONITOR) */
#define KVEDGE_TOP_DOC_MAX_PREFIXES    64
#define KVEDGE_TOP_DOC_MAX_SUBS        16
#define KVEDGE_TOP_DOC_MAX_TRANSITIONS 16 /* the most recent ones */
#define KVEDGE_TOP_DOC_MAX_REASONS     40 /* miss reasons, layer (kind, reason) pairs */
#define KVEDGE_TOP_DOC_MAX_SCHEMES     8
#define KVEDGE_TOP_DOC_MAX_TENANTS     16
#define KVEDGE_TOP_DOC_MAX_NODES       32 /* the proxy's view of the master's registry */
#define KVEDGE_TOP_DOC_MAX_BUCKETS     KVEDGE_METRICS_MAX_BUCKETS
#define KVEDGE_TOP_DOC_HOT_LAYERS      128 /* as monitor/hot.h keeps them */
#define KVEDGE_TOP_DOC_HOT_HEADS       64

/* String buffers (bytes, with the NUL). Strings are cut there at a UTF-8 boundary, and
 * control characters are replaced by '?' so a peer cannot write escape codes to a terminal. */
#define KVEDGE_TOP_DOC_NAME_BYTES   64
#define KVEDGE_TOP_DOC_SHORT_BYTES  24
#define KVEDGE_TOP_DOC_TEXT_BYTES   192
#define KVEDGE_TOP_DOC_PREFIX_BYTES 65 /* 64 hex digits */

typedef enum {
    KVEDGE_TOP_DOC_NODE = 1,
    KVEDGE_TOP_DOC_PROXY = 2,
} kvedge_top_doc_kind_t;

/* A latency histogram in microseconds: cumulative counts at the document's bucket bounds. */
typedef struct {
    uint64_t count;
    uint64_t sum_us;
    uint32_t nbuckets;
    uint64_t buckets[KVEDGE_TOP_DOC_MAX_BUCKETS];
} kvedge_top_hist_t;

typedef struct {
    char op[KVEDGE_TOP_DOC_SHORT_BYTES]; /* "GET_LAYER" */
    uint64_t requests;                   /* every status */
    uint64_t errors;                     /* status other than OK */
    kvedge_top_hist_t latency;
} kvedge_top_op_t;

typedef struct {
    char id[KVEDGE_TOP_DOC_PREFIX_BYTES]; /* hex chunk id */
    char model[KVEDGE_TOP_DOC_NAME_BYTES];
    uint64_t count, error, bytes; /* Space-Saving estimate and its error bound */
    uint64_t layers[KVEDGE_TOP_DOC_HOT_LAYERS];
    uint64_t heads[KVEDGE_TOP_DOC_HOT_HEADS];
} kvedge_top_prefix_t;

typedef struct {
    char name[KVEDGE_TOP_DOC_NAME_BYTES];
    char cloud[KVEDGE_TOP_DOC_TEXT_BYTES];
    char state[KVEDGE_TOP_DOC_SHORT_BYTES]; /* never, ok, partial, failed */
    uint64_t chunks_total, chunks_synced, blocks_held, last_ok_ms;
    char last_error[KVEDGE_TOP_DOC_TEXT_BYTES];
} kvedge_top_sub_t;

typedef struct {
    char name[KVEDGE_TOP_DOC_NAME_BYTES];
    char kind[KVEDGE_TOP_DOC_SHORT_BYTES]; /* local, peer, cloud, history */
    char endpoint[KVEDGE_TOP_DOC_TEXT_BYTES];
    char origin[KVEDGE_TOP_DOC_SHORT_BYTES]; /* config, master */
    bool connected;
    char state[KVEDGE_TOP_DOC_SHORT_BYTES]; /* up, suspect, down, unknown */
    double weight, rtt_us, bandwidth;       /* bandwidth in bytes/s */
    uint64_t failures;
    char last_error[KVEDGE_TOP_DOC_TEXT_BYTES];
    bool has_history;
    struct {
        char state[KVEDGE_TOP_DOC_SHORT_BYTES];
        uint64_t chunks_missing, blocks_held;
        double last_success_age_s; /* -1: never */
    } history;
} kvedge_top_source_t;

typedef struct {
    char a[KVEDGE_TOP_DOC_SHORT_BYTES]; /* reason (misses), scheme (served), kind (layers) */
    char b[KVEDGE_TOP_DOC_SHORT_BYTES]; /* the layer's reason; empty otherwise */
    uint64_t count;
} kvedge_top_count_t;

typedef struct {
    uint64_t time_ms;
    char source[KVEDGE_TOP_DOC_NAME_BYTES];
    char from[KVEDGE_TOP_DOC_SHORT_BYTES], to[KVEDGE_TOP_DOC_SHORT_BYTES];
    char reason[KVEDGE_TOP_DOC_TEXT_BYTES];
} kvedge_top_transition_t;

typedef struct {
    char tenant[KVEDGE_TOP_DOC_NAME_BYTES];
    uint64_t requests, stored_bytes;
} kvedge_top_tenant_t;

/* A node as the proxy's view of the master's registry has it. */
typedef struct {
    char node[KVEDGE_TOP_DOC_NAME_BYTES];
    char role[KVEDGE_TOP_DOC_SHORT_BYTES];
    char endpoint[KVEDGE_TOP_DOC_TEXT_BYTES];
    char health[KVEDGE_TOP_DOC_SHORT_BYTES];
    uint64_t last_seen_ms;
} kvedge_top_registry_node_t;

/* The node's store counters (engine statistics). */
typedef struct {
    uint64_t blocks, bytes, fp16_bytes, pinned_blocks, pinned_bytes, capacity_bytes, quarantined,
        evicted_blocks, expired;
} kvedge_top_store_t;

/* The proxy's counters since start. */
typedef struct {
    uint64_t requests, layers, misses, fallbacks, corrupt, bytes, source_failures, buffered_bytes,
        fetches_open;
} kvedge_top_proxy_stats_t;

/* The proxy's fetch timings (microseconds) and outcomes. */
typedef struct {
    uint64_t ok, failed;
    uint32_t nle;
    uint64_t le_us[KVEDGE_TOP_DOC_MAX_BUCKETS];
    kvedge_top_hist_t plan, first_layer, last_layer, planned;
    double actual_to_plan_median;
} kvedge_top_fetch_t;

typedef struct {
    kvedge_top_doc_kind_t kind;
    char name[KVEDGE_TOP_DOC_NAME_BYTES];
    char role[KVEDGE_TOP_DOC_SHORT_BYTES]; /* node: cloud, edge; proxy: "proxy" */
    char version[KVEDGE_TOP_DOC_SHORT_BYTES];
    uint64_t time_ms, uptime_ms;
    bool ready;
    char not_ready[KVEDGE_TOP_DOC_TEXT_BYTES];

    /* kind "node" */
    struct {
        bool analyzer; /* the I/O Analyzer's sections are there (the node's monitor is on) */
        uint32_t nops;
        kvedge_top_op_t ops[KVEDGE_TOP_DOC_MAX_OPS];
        uint32_t nle;
        uint64_t le_us[KVEDGE_TOP_DOC_MAX_BUCKETS]; /* the latency buckets' upper bounds */
        uint64_t bytes_in, bytes_out;
        uint64_t hits, misses, quarantined_reads; /* misses: every reason */
        uint32_t nmiss_reasons;
        kvedge_top_count_t miss_reasons[KVEDGE_TOP_DOC_MAX_REASONS];
        uint32_t nschemes;
        kvedge_top_count_t served[KVEDGE_TOP_DOC_MAX_SCHEMES]; /* bytes by scheme */
        uint32_t ntenants;
        kvedge_top_tenant_t tenants[KVEDGE_TOP_DOC_MAX_TENANTS];
        struct {
            uint64_t accesses, capacity, memory_bytes;
            uint32_t nprefixes;
            kvedge_top_prefix_t prefixes[KVEDGE_TOP_DOC_MAX_PREFIXES];
        } hot;
        bool has_store;
        kvedge_top_store_t store;
        bool has_sync;
        uint64_t sync_last_pass_ms;
        uint32_t nsubs;
        kvedge_top_sub_t subs[KVEDGE_TOP_DOC_MAX_SUBS];
        bool has_master;
        struct {
            char endpoint[KVEDGE_TOP_DOC_TEXT_BYTES];
            char node_id[KVEDGE_TOP_DOC_NAME_BYTES];
            char state[KVEDGE_TOP_DOC_SHORT_BYTES];
            uint64_t attempts;
            char why[KVEDGE_TOP_DOC_TEXT_BYTES];
            char following[KVEDGE_TOP_DOC_TEXT_BYTES]; /* the master its view follows now */
            uint64_t moves;                            /* times the view went to another */
        } master;
    } node;

    /* kind "proxy" */
    struct {
        kvedge_top_proxy_stats_t stats;
        uint32_t nsources;
        kvedge_top_source_t sources[KVEDGE_TOP_DOC_MAX_SOURCES];
        uint32_t nlayers;
        kvedge_top_count_t layers[KVEDGE_TOP_DOC_MAX_REASONS]; /* (kind, reason, count) */
        kvedge_top_fetch_t fetch;
        uint32_t ntransitions; /* the last ones, oldest first */
        kvedge_top_transition_t transitions[KVEDGE_TOP_DOC_MAX_TRANSITIONS];
        uint64_t transitions_total;
        bool has_master;
        struct {
            char endpoint[KVEDGE_TOP_DOC_TEXT_BYTES];
            char registry[KVEDGE_TOP_DOC_SHORT_BYTES];
            uint32_t nnodes;
            kvedge_top_registry_node_t nodes[KVEDGE_TOP_DOC_MAX_NODES];
        } master;
    } proxy;
} kvedge_top_doc_t;

/* Parses len bytes of json (not necessarily NUL-terminated) into *out, which is cleared
 * first. The struct is large (about 150 KiB): allocate it. Returns 0, or
 * KVEDGE_EINVAL (NULL arguments), KVEDGE_ETOOBIG (more than KVEDGE_WIRE_MAX_MONITOR_BYTES),
 * KVEDGE_EPROTO (not JSON (or out of memory), not an object, or "kind" is not "node" or
 * "proxy"). On an error *out is left cleared. */
int kvedge_top_doc_parse(const char *json, size_t len, kvedge_top_doc_t *out);

/* Adds the observations between two snapshots of one histogram (cur minus prev, bucket by
 * bucket; prev may be NULL: since the start) to *acc, which starts zeroed. Returns false and
 * leaves *acc as it was when the counts went down (the daemon restarted) or the bucket
 * layouts differ. */
bool kvedge_top_hist_delta(kvedge_top_hist_t *acc, const kvedge_top_hist_t *cur,
                           const kvedge_top_hist_t *prev);

/* The quantile q (0 ... 1) of h's observations in microseconds, interpolated in the bucket as
 * Prometheus does, with the bucket upper bounds le_us (nle of them, doubling from the first,
 * as the daemons send them). 0 when h is empty, the bounds are not such a series or do not
 * match h, or the counts are not cumulative. */
double kvedge_top_hist_quantile(const kvedge_top_hist_t *h, const uint64_t *le_us, uint32_t nle,
                                double q);

/* The op entry named op in d (node documents), or NULL. */
const kvedge_top_op_t *kvedge_top_doc_op(const kvedge_top_doc_t *d, const char *op);

#endif
