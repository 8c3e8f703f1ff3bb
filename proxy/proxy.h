/* The edge proxy (`kvedge proxy`): clients send it FETCH (docs/protocol.md); it prices every
 * source of every layer (proxy/plan.h), streams the planned layers from their sources in
 * parallel, checks every block, delivers whole layers in layer order, and re-plans the rest
 * when a source fails, stalls, lacks a layer or sends a corrupt block. A layer nobody can
 * deliver comes back as a miss, within the request's deadline.
 *
 * Sources are store nodes given at start (static) and, with a Storage Master, every node its
 * registry lists (node records: role, endpoint, key), with the block directory saying which
 * node holds which layers. Upstream it is a plain libkvedge client of each node. */
#ifndef KVEDGE_PROXY_PROXY_H
#define KVEDGE_PROXY_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_PROXY_BIND_DEFAULT    "tcp://127.0.0.1:7420"
#define KVEDGE_PROXY_METRICS_DEFAULT "127.0.0.1:9742" /* `kvedge proxy`'s HTTP endpoint */
/* How often the historical cache's lag is read from each history source (MONITOR). */
#define KVEDGE_PROXY_HISTORY_POLL_MS 5000
#define KVEDGE_PROXY_MAX_SOURCES     KVEDGE_PLAN_MAX_SOURCES
/* The default margin on quality profiles' costs, percent. */
#define KVEDGE_PROXY_QUALITY_MARGIN_PCT 150
/* Quality profiles a proxy holds at most (one per model). */
#define KVEDGE_PROXY_MAX_QUALITY 16
/* A layer's stream from one source may take STALL_FACTOR times its priced transfer time, and
 * never less than STALL_MIN_MS, before the source counts as stalled and the layer moves. */
#define KVEDGE_PROXY_STALL_MIN_MS 400
#define KVEDGE_PROXY_STALL_FACTOR 4
/* Undelivered layers are reported as misses this long before the request's deadline, so the
 * whole answer reaches the client in time. */
#define KVEDGE_PROXY_DEADLINE_MARGIN_MS 100
/* Block bytes held for clients at once; past it no new layer stream is opened. */
#define KVEDGE_PROXY_BUFFER_BYTES_DEFAULT (1ull << 30)
/* How long "source s lacks layer l of chain c" is remembered. */
#define KVEDGE_PROXY_NEG_TTL_MS 30000
/* A FETCH with layers the master's directory lists no holder for asks its registered sources
 * the directory says nothing of (LOOKUP) before it plans them as misses, waiting this long at
 * most for the answers (and never past its deadline less the margin): a directory lags the
 * blocks it describes (a node publishes it every few hundred ms). */
#define KVEDGE_PROXY_ASK_MS 1000
/* A FETCH for a model the proxy does not know yet, when it has a master, waits this long at most
 * (and never past its deadline less the margin) for the model to reach its view before it is
 * answered ENOMODEL: a node registers the models it holds with the master only on its next
 * directory pass, so a decode sent right after a prefill would otherwise be refused. */
#define KVEDGE_PROXY_MODEL_WAIT_MS 1000
/* Unreachable and down sources are retried (connect, PING) this often. */
#define KVEDGE_PROXY_PROBE_MS 500
/* Measured links are published to the master this often. */
#define KVEDGE_PROXY_LINK_PUBLISH_MS 5000
/* A link nothing is known about is priced as 100 Mbit/s with a 10 ms round trip. */
#define KVEDGE_PROXY_BW_DEFAULT     12.5e6
#define KVEDGE_PROXY_RTT_US_DEFAULT 10000.0
/* Layer streams open at once per source: enough to cover the bandwidth-delay product. */
#define KVEDGE_PROXY_WINDOW_MAX 8

/* One static source. */
typedef struct {
    char name[KVEDGE_PLAN_NAME_LEN]; /* also the node id used in the master's directory */
    kvedge_plan_kind_t kind;         /* LOCAL, PEER, CLOUD or HISTORY */
    char endpoint[256];
    char server_key[1024]; /* Z85 or a public certificate path; "" = plaintext */
    char link[64];         /* emulated link for tests ("100mbit,20ms"); "" = none */
    double bw_bytes_per_s; /* declared prior; 0 = unknown */
    double rtt_us;         /* declared prior; 0 = unknown */
} kvedge_proxy_source_t;

typedef struct {
    const char *bind;        /* where clients connect; NULL = KVEDGE_PROXY_BIND_DEFAULT */
    bool insecure;           /* plaintext for clients (loopback/ipc only) */
    const char *cert;        /* the proxy's secret certificate: CURVE for clients and its
                              * client key toward sources and the master */
    const char *clients_dir; /* allowlist of client keys (with cert) */
    const char *id;          /* the proxy's id (master heartbeats, link records); NULL = "proxy" */
    const kvedge_proxy_source_t *sources; /* static sources (copied) */
    size_t nsources;
    /* The Storage Master (optional): discovery, directory, links, models. */
    const char *master;
    const char *master_pub;
    const char *master_key;   /* Z85 or certificate path; NULL = plaintext */
    const char *snapshot;     /* the master view's replica file; NULL = none */
    const char *local_node;   /* node id of this edge's own store: kind LOCAL */
    const char *history_node; /* node id of this edge's historical cache: kind HISTORY */
    uint64_t buffer_bytes;    /* 0 = KVEDGE_PROXY_BUFFER_BYTES_DEFAULT */
    uint32_t stall_min_ms;    /* 0 = KVEDGE_PROXY_STALL_MIN_MS */
    uint32_t neg_ttl_ms;      /* 0 = KVEDGE_PROXY_NEG_TTL_MS */
    uint32_t credit;          /* upstream credit per layer stream; 0 = 64 */
    /* Monitoring: the HTTP endpoint ("HOST:PORT"; NULL or "off": none) and whether the
     * Collaboration Monitor records (no_monitor: only the live gauges). */
    const char *metrics;
    bool no_monitor;
    /* The cache optimizer: per-layer sensitivity profiles (proxy/quality.h, written by
     * `kvedge eval --profile-out`), comma-separated paths, one per model; NULL or "": none
     * (a request's lossy rungs are then never chosen under a quality budget). */
    const char *quality;
    /* Percent the profile's per-layer costs are priced at (100 ... 1000; 0 = the default
     * KVEDGE_PROXY_QUALITY_MARGIN_PCT): a profile is a mean over held-out documents, and a
     * workload's documents vary around it, so pricing above the mean keeps the measured
     * quality under the budget (docs/benchmarks.md, "The cache optimizer"). */
    uint32_t quality_margin_pct;
    /* Refuse a FETCH that asks for packed BLOCK messages (its PACK flag) with KVEDGE_EPROTO,
     * as a proxy from before packing does (default: pack when asked). */
    bool no_pack;
} kvedge_proxy_opts_t;

/* Counters since start. */
typedef struct {
    uint64_t requests;  /* FETCH requests accepted */
    uint64_t layers;    /* layers delivered with data */
    uint64_t misses;    /* layers reported as not delivered (recompute, miss, deadline) */
    uint64_t fallbacks; /* layers moved to another source after a failure */
    uint64_t corrupt;   /* blocks that failed verification */
    uint64_t bytes;     /* block bytes delivered */
    uint64_t source_failures;
    uint64_t mapped_layers; /* layers delivered from a mapped model's layer (large-small) */
    uint64_t replans;       /* re-plans after a source's measured bandwidth changed */
    /* Blocks forwarded in the frame they arrived in (at least 4 KiB: no copy), of those
     * received from sources. */
    uint64_t forwarded_in_place;
} kvedge_proxy_stats_t;

typedef struct kvedge_proxy_t kvedge_proxy_t;

void kvedge_proxy_opts_default(kvedge_proxy_opts_t *opts);

/* Parses "KIND NAME ENDPOINT [key=K] [link=SPEC] [bw=BYTES_PER_S] [rtt=US]" (KIND local,
 * peer, cloud or history; fields separated by spaces). Returns 0 or KVEDGE_EINVAL. */
int kvedge_proxy_source_parse(const char *spec, kvedge_proxy_source_t *out);

/* Binds, starts the master view (when configured; an unreachable master is not an error: the
 * view serves its snapshot file and catches up later) and starts connecting to sources.
 * Returns once it serves. why receives a reason on failure. Caller owns *out.
 * Errors: KVEDGE_EINVAL, KVEDGE_EDENIED, KVEDGE_EIO, KVEDGE_ENOMEM. */
int kvedge_proxy_start(const kvedge_proxy_opts_t *opts, kvedge_proxy_t **out, char *why,
                       size_t why_len);

/* Stops serving (open FETCH streams end with KVEDGE_ECLOSED), closes every source.
 * NULL-safe, idempotent, nulls *self_p. */
void kvedge_proxy_destroy(kvedge_proxy_t **self_p);

const char *kvedge_proxy_endpoint(kvedge_proxy_t *p);
const char *kvedge_proxy_public_key(kvedge_proxy_t *p);
void kvedge_proxy_stats(kvedge_proxy_t *p, kvedge_proxy_stats_t *out);

/* "http://HOST:PORT" of the metrics endpoint as bound, or NULL when it is off. */
const char *kvedge_proxy_metrics_url(kvedge_proxy_t *p);

/* Waits until at least n sources are connected and usable, or timeout_ms. Returns 0 or
 * KVEDGE_ETIMEDOUT. */
int kvedge_proxy_wait_sources(kvedge_proxy_t *p, size_t n, int timeout_ms);

/* Waits until the proxy's view of the Storage Master is synced at seq >= min_seq (e.g. the
 * master's kvedge_master_seq), its changes applied: plans made after it returns see the
 * directory, models and maps up to there. Returns 0, KVEDGE_ETIMEDOUT, or KVEDGE_EINVAL for a
 * proxy without a master. */
int kvedge_proxy_wait_view(kvedge_proxy_t *p, uint64_t min_seq, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif
