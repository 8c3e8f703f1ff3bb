/* The Storage Master daemon (docs/master.md): a sequenced registry of nodes, health, models,
 * layer maps, block directories and links, served the zguide "Clone" way: a ROUTER for
 * snapshots and updates, a PUB for sequenced updates and HUGZ. Its messages and records are
 * runtime/kvmsg.h. */
#ifndef KVEDGE_STORE_MASTER_MASTER_H
#define KVEDGE_STORE_MASTER_MASTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/kvmsg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvedge_master_t kvedge_master_t;

typedef struct {
    const char *bind;        /* ROUTER endpoint (snapshots, updates, heartbeats) */
    const char *pub;         /* PUB endpoint (sequenced updates, HUGZ) */
    const char *data_dir;    /* the registry's RocksDB directory; created when missing */
    bool insecure;           /* plaintext: refused unless both endpoints are loopback or ipc */
    const char *cert;        /* the master's secret certificate file (czmq format) */
    const char *clients_dir; /* allowlist: public certificates of the peers let in */
    bool sync;               /* fsync the WAL on every update */
    uint32_t hugz_ms;        /* 0 = KVEDGE_MASTER_HUGZ_MS */
    uint32_t suspect_ms;     /* 0 = KVEDGE_MASTER_SUSPECT_MS */
    uint32_t down_ms;        /* 0 = KVEDGE_MASTER_DOWN_MS (raised to suspect_ms if below) */
    int pub_hwm;             /* 0 = KVEDGE_MASTER_PUB_HWM */
    /* Fault injection for tests: every update whose seq is a multiple of this is applied and
     * acknowledged but not published, as a lossy network would. 0 = off. */
    uint32_t drop_pub_every;
    /* The HTTP endpoint for /metrics, /health, /ready ("HOST:PORT"; NULL or "off": none). */
    const char *metrics;
    /* Masters on etcd (docs/master.md, "Masters on etcd"): "URL[,URL...]" of the etcd v3 JSON
     * gateway; NULL or "" = the embedded default (one master, its own registry, no etcd). */
    const char *etcd;
    const char *etcd_prefix; /* NULL or "" = /kvedge/<cluster> */
    const char *cluster;     /* NULL or "" = KVEDGE_MASTER_CLUSTER_DEFAULT */
    const char *id;          /* NULL or "" = from the ROUTER endpoint bound */
    uint32_t lease_ms;       /* 0 = KVEDGE_MASTER_LEASE_MS */
} kvedge_master_opts_t;

#define KVEDGE_MASTER_CLUSTER_DEFAULT "kvedge"
#define KVEDGE_MASTER_LEASE_MS        3000  /* the leader's etcd lease (its TTL, rounded up to s) */
#define KVEDGE_MASTER_SEQ_BLOCK       65536 /* seqs reserved in etcd ahead of the published ones */
#define KVEDGE_MASTER_ETCD_FORMAT     1     /* the layout under the prefix (its meta key) */
#define KVEDGE_MASTER_STATUS_MAX      65536 /* a STATUS document's bound */

#define KVEDGE_MASTER_METRICS_DEFAULT "127.0.0.1:9741" /* `kvedge master`'s HTTP endpoint */

void kvedge_master_opts_default(kvedge_master_opts_t *opts);

/* Opens the registry, starts the ZAP handler (CURVE), binds both sockets and serves. Returns
 * once it serves; why (if not NULL) receives a reason on failure. Caller owns *out.
 * Errors: KVEDGE_EINVAL, KVEDGE_EDENIED (plaintext on a non-loopback endpoint, no CURVE),
 * KVEDGE_ELOCKED (the directory is in use, or an address: checked before anything is opened),
 * KVEDGE_EVERSION (a newer registry format), KVEDGE_ECORRUPT, KVEDGE_EIO (bind failed, unreadable
 * certificate), KVEDGE_ESTORE, KVEDGE_ENOMEM. */
int kvedge_master_start(const kvedge_master_opts_t *opts, kvedge_master_t **out, char *why,
                        size_t why_len);

/* Checks every address the master will bind (ROUTER, PUB, the HTTP endpoint) by binding and
 * releasing it, before anything is opened or created: a second master on a host fails at once
 * and why names the setting that moves it (--bind, --pub, --metrics). kvedge_master_start
 * calls it first; a caller that prepares files before (kvedge_master_settings_start: the data
 * directory, the certificate) calls it before those. Errors: KVEDGE_ELOCKED (in use), KVEDGE_EIO
 * (cannot bind for another reason), KVEDGE_EINVAL. */
int kvedge_master_probe(const kvedge_master_opts_t *opts, char *why, size_t why_len);

/* Stops serving, closes the sockets and the registry. NULL-safe, idempotent. */
void kvedge_master_destroy(kvedge_master_t **self_p);

/* The endpoints actually bound (ephemeral ports resolved). Valid until destroy. */
const char *kvedge_master_endpoint(kvedge_master_t *m);
const char *kvedge_master_pub_endpoint(kvedge_master_t *m);

/* The master's public key (Z85, 40 chars), or NULL when plaintext. */
const char *kvedge_master_public_key(kvedge_master_t *m);

/* The last sequence number assigned. Thread-safe. */
uint64_t kvedge_master_seq(kvedge_master_t *m);

/* The registry's id (random, made with the directory, or with the etcd prefix on etcd; HUGZ and
 * KTHXBAI carry it). */
uint64_t kvedge_master_registry(kvedge_master_t *m);

/* The master's role: "single" (no etcd), "leader", "standby" or "readonly" (the leader that
 * lost its etcd quorum: reads only). Thread-safe; static storage. */
const char *kvedge_master_role(kvedge_master_t *m);

#ifdef __cplusplus
}
#endif
#endif
