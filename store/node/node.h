/* The Cache Server: one store node, cloud or edge role, assembled from one settings struct.
 * It opens the block engine, serves the wire protocol (server.h), keeps the edge's
 * historical cache in sync (hsync.h) and, when it joins a Storage Master, heartbeats and
 * publishes its block directory (dirpub.h). The `kvedge store` command is a thin main over
 * kvedge_node_start. */
#ifndef KVEDGE_STORE_NODE_NODE_H
#define KVEDGE_STORE_NODE_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/log.h"
#include "access/proto.h"
#include "runtime/settings.h"
#include "store/engine/engine.h"
#include "store/node/mover.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_NODE_BIND_DEFAULT  "tcp://127.0.0.1:7400"
#define KVEDGE_NODE_CERT_NAME     "node.cert" /* in the data dir; the secret is node.cert_secret */
#define KVEDGE_NODE_CLIENTS_NAME  "clients"   /* the allowlist directory, in the data dir */
#define KVEDGE_NODE_PATH_BYTES    1024
#define KVEDGE_NODE_EP_BYTES      256
#define KVEDGE_NODE_MASTERS_BYTES 1024 /* a list of masters "EP[,EP...]" */
/* The HTTP endpoint's default address: /metrics, /health, /ready (docs/operations.md). */
#define KVEDGE_NODE_METRICS_DEFAULT "127.0.0.1:9740"

/* Everything a node is started with. The daemon's settings table (store/node/settings.c) holds
 * the defaults and maps config keys and flags onto the fields; kvedge_node_settings_default
 * applies it. */
typedef struct {
    kvedge_role_t role;                   /* KVEDGE_ROLE_CLOUD or KVEDGE_ROLE_EDGE */
    char data[KVEDGE_NODE_PATH_BYTES];    /* store directory (required) */
    char bind[KVEDGE_NODE_EP_BYTES];      /* ZeroMQ endpoint */
    char cert[KVEDGE_NODE_PATH_BYTES];    /* node certificate; "" = DATA/node.cert, made once */
    char clients[KVEDGE_NODE_PATH_BYTES]; /* allowlist directory; "" = DATA/clients */
    char name[KVEDGE_NODE_EP_BYTES];      /* name in HELLO; "" = node_id, or "kvedge" */
    bool insecure;                        /* plaintext: only on loopback or ipc endpoints */
    bool sync;                            /* fsync the WAL on every write */
    uint32_t workers;                     /* 0 = one per core, at least 2 */
    uint64_t capacity_bytes;              /* evict LRU unpinned blocks beyond; 0 = none */
    uint64_t cache_bytes;                 /* block cache */
    /* Historical cache (edge): subscribed contexts, and the seconds between sync passes. */
    char subscriptions[KVEDGE_NODE_PATH_BYTES];
    uint32_t sync_interval_s;
    /* Storage Master: register, heartbeat, publish the block directory ("" = stand alone).
     * A list "EP[,EP...]" of the masters of one cluster: the view follows the leader. The PUB
     * list matches it entry for entry; "" = each tcp entry's PORT+1. */
    char master[KVEDGE_NODE_MASTERS_BYTES];
    char master_pub[KVEDGE_NODE_MASTERS_BYTES];
    char master_key[KVEDGE_NODE_PATH_BYTES]; /* its public key or certificate; "" = plaintext */
    char node_id[65];
    char advertise[KVEDGE_NODE_EP_BYTES]; /* the endpoint others reach us on; "" = bound */
    char region[65];
    uint64_t declare_bw;      /* bytes/s, a prior for planners; 0 = unknown */
    uint32_t declare_rtt_us;  /* a prior for planners; 0 = unknown */
    uint32_t dir_interval_ms; /* how often the block directory is looked at; 0 = default */
    /* Monitoring: the HTTP endpoint ("HOST:PORT", or "off"), and whether the I/O Analyzer
     * records (off: /metrics and MONITOR still show the store's gauges). */
    char metrics[128];
    bool monitor;
    /* Precisions (the cache optimizer): derive a precision a reader accepts from a finer
     * block when no held block is at it, and keep what was derived as a variant. */
    bool derive;
    bool keep_derived;
    /* Coding bases (*.kvb, access/codec/basis.h) registered at start: the models whose
     * transform-coded rung ("tc") the node can derive. "" = none. */
    char basis[KVEDGE_NODE_PATH_BYTES];
    /* GET_LAYER packed data messages for clients that ask (no: refused as older nodes do). */
    bool pack;
    /* The storage optimizer (store/node/optimizer.h): off unless optimize. Prepares the
     * `prepare` rungs of hot prefixes (hot_reads accesses in one interval, among the
     * analyzer's hot_top), demotes blocks idle demote_idle_s to demote_to, and with
     * demote_on_pressure demotes before it evicts. Rungs as text (kvedge_prec_parse). */
    bool optimize;
    uint32_t optimize_interval_s;
    char demote_to[KVEDGE_PREC_NAME_BYTES];
    uint32_t demote_idle_s; /* 0: no idle demotion */
    bool demote_on_pressure;
    char prepare[128]; /* "int4-g32,int4-g128"; "" or "none": nothing */
    uint32_t hot_reads;
    uint32_t hot_top;
    kvedge_log_level_t log_level; /* the process-wide logger's level: the daemon's main sets it */
    /* The mover (store/node/mover.h), on a cloud node joined to a master: re-replicates the
     * chunks of a node down past mover_grace_s to R (replicas; 0 = the default) live
     * replicas, copying at most mover_bw bytes/s (0 = unlimited). */
    uint32_t replicas;
    uint32_t mover_grace_s;
    uint64_t mover_bw;
} kvedge_node_settings_t;

/* The store node's settings table: section `store` of a config file, the flags of
 * `kvedge store`. */
extern const kvedge_settings_table_t kvedge_node_settings_table;

typedef struct kvedge_node_t kvedge_node_t;

/* Fills *s with the table's defaults (no data directory: the caller names one). */
void kvedge_node_settings_default(kvedge_node_settings_t *s);

/* Checks the settings without starting anything: why (may be NULL) says what is wrong.
 * Errors: KVEDGE_EINVAL (no data directory, a role other than cloud or edge, --master
 * without master_pub and a valid node_id, optimizer settings that do not parse or hold:
 * kvedge_optimizer_parse), KVEDGE_EDENIED (plaintext on an endpoint other
 * hosts can reach). */
int kvedge_node_settings_check(const kvedge_node_settings_t *s, char *why, size_t why_len);

/* Checks the settings, opens the store, makes the node certificate on first start, binds and
 * serves; then starts the historical-cache scheduler and joins the master (both only logged
 * when they fail: the node serves what it has). Returns once it serves. Caller owns *out.
 * Every "*.kvb" file of the basis directory is loaded and registered first
 * (kvedge_basis_load_dir): a file that does not load refuses the start with its error (why
 * names the file and the check; the files before it stay registered in this process).
 * Errors: those of kvedge_node_settings_check; those of kvedge_basis_load_dir; the engine's open
 * errors (KVEDGE_ENOTFOUND, KVEDGE_ELOCKED, KVEDGE_ECORRUPT, KVEDGE_EVERSION, KVEDGE_ESTORE: the
 * store is unavailable); KVEDGE_EIO (bind failed, certificate unreadable or not writable);
 * KVEDGE_ENOMEM. */
int kvedge_node_start(const kvedge_node_settings_t *s, kvedge_node_t **out, char *why,
                      size_t why_len);

/* Stops the scheduler and the master link, lets in-flight requests finish, closes the
 * socket and the store. NULL-safe, idempotent, nulls *self_p. */
void kvedge_node_destroy(kvedge_node_t **self_p);

/* The endpoint actually bound (ephemeral ports resolved), and the node's public key (Z85)
 * or NULL when plaintext. Valid until destroy. */
const char *kvedge_node_endpoint(kvedge_node_t *n);
const char *kvedge_node_public_key(kvedge_node_t *n);

/* One block-directory pass now, on the caller's thread (*changed, may be NULL: records
 * written): after a change that must be visible to planners at once. Errors: KVEDGE_EINVAL
 * (not joined to a master), those of kvedge_dirpub_sync. */
int kvedge_node_publish(kvedge_node_t *n, uint32_t *changed);

/* "http://HOST:PORT" of the node's metrics endpoint as bound (port 0 resolved), or NULL when
 * it is off. Valid until destroy. */
const char *kvedge_node_metrics_url(kvedge_node_t *n);

/* One storage-optimizer pass now, on the caller's thread (serialized with the optimizer's
 * own): for tests and tools. Errors: KVEDGE_EINVAL (the optimizer is off), those of the
 * pass. */
int kvedge_node_optimize(kvedge_node_t *n);

/* One re-replication pass of the node's mover now, on the caller's thread (serialized with
 * the mover's own): for tests and tools. Errors: KVEDGE_EINVAL (no mover: not a cloud node
 * joined to a master), those of kvedge_mover_pass. */
int kvedge_node_mover_pass(kvedge_node_t *n);

/* The node's mover counters (zeros without a mover). */
void kvedge_node_mover_stats(kvedge_node_t *n, kvedge_mover_stats_t *out);

/* The node's engine, for tests and tools in the same process. Valid until destroy. */
kvedge_engine_t *kvedge_node_engine(kvedge_node_t *n);

#ifdef __cplusplus
}
#endif
#endif
