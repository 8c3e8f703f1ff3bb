/* Private to the Storage Master's files (store/master/master.c: the daemon, the registry and
 * the ROUTER and PUB; store/master/ha.c: masters on etcd and STATUS): the actor's state and the
 * helpers both share. Nothing else includes it.
 *
 * Naming: the shared functions are kvedge_master_* but internal, not part of
 * store/master/master.h; each runs on the master's actor thread unless its comment says so. */
#ifndef KVEDGE_STORE_MASTER_IMPL_H
#define KVEDGE_STORE_MASTER_IMPL_H

#include <czmq.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "monitor/http.h"
#include "monitor/metrics.h"
#include "runtime/kvmsg.h"
#include "runtime/mview.h"
#include "runtime/secure.h"
#include "store/master/etcd.h"
#include "store/master/master.h"

/* The registry directory's meta rows (docs/master.md, "Persistence"). */
#define S_FORMAT_VERSION 1
#define S_META_FORMAT    "\0format"
#define S_META_SEQ       "\0seq"
#define S_META_REGISTRY  "\0registry"
#define S_META_LEN(k)    (sizeof(k) - 1)
#define S_TICK_MAX_MS    100
#define S_DRAIN_MAX      256  /* ROUTER messages handled per wakeup before timers run */
#define S_MAX_MASTERS    16   /* masters/<id> entries kept for STATUS */
#define S_INFO_MS        2000 /* masters and etcd members re-read this often */
/* Hard records per etcd page at a takeover: the largest (a map of 1024 layers, 2056 bytes) is
 * under 3.6 KB as the gateway's JSON, so a page stays under 4 MiB, half the reply bound. */
#define S_HARD_PAGE_KEYS 1024
#define S_RENEW_EVERY    256 /* hard records read between looks at the lease's renewal */

/* A master's role (kvedge_master_role names them). */
enum { S_ROLE_SINGLE = 0, S_ROLE_LEADER, S_ROLE_STANDBY, S_ROLE_READONLY };
extern const char *const kvedge_master_role_names[4];

/* A master as etcd's leader and masters/ keys describe it. */
typedef struct {
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1]; /* "": none */
    char router[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];
    char pub[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];
    char key[KVEDGE_MASTER_KEY_Z85_BYTES + 1]; /* its public key; "" = plaintext */
} kvedge_master_desc_t;

struct kvedge_master_t {
    zactor_t *actor;
    kvedge_metrics_t *metrics;
    kvedge_http_t *http;
    _Atomic uint64_t records, bytes; /* published by the actor for the scrape */
    kvedge_series_t *records_g, *bytes_g, *seq_g, *denials;
    uint64_t denials_seen; /* the HTTP thread's, at the last scrape */
    char endpoint[256];
    char pub_endpoint[256];
    char public_key[KVEDGE_MASTER_KEY_Z85_BYTES + 1];
    _Atomic uint64_t seq;
    uint64_t registry;
    void *state; /* the actor's kvedge_master_state_t, freed after the actor stopped */
    /* Masters on etcd, published by the actor for kvedge_master_role and the scrape. */
    _Atomic int role;
    _Atomic uint64_t leader_changes, etcd_ok, etcd_failed;
    kvedge_series_t *leader_g, *changes_c, *etcd_req[2], *role_g[4];
    uint64_t changes_seen, etcd_seen[2];
};

/* A heartbeat id the master watches. */
typedef struct {
    int64_t last_mono_ms; /* last heartbeat, monotonic */
    uint64_t last_wall_ms;
    kvedge_master_health_state_t state;
} kvedge_master_peer_t;

typedef struct {
    kvedge_master_opts_t opts;
    kvedge_master_t *owner;
    rocksdb_t *db;
    rocksdb_writeoptions_t *wo;
    rocksdb_readoptions_t *ro;
    uint64_t seq;             /* last assigned; persisted with every update */
    uint64_t registry;        /* random id of this registry */
    uint64_t records;         /* live records */
    uint64_t bytes;           /* keys + bodies of live records */
    zhashx_t *peers;          /* heartbeat id -> kvedge_master_peer_t */
    zcert_t *cert;            /* NULL when plaintext */
    kvedge_secure_zap_t *zap; /* its allowlist in the process's ZAP handler; NULL: plaintext */
    zsock_t *router;
    zsock_t *pub;
    int start_rc;
    char *start_error;
    /* Monitoring (the actor's own series; the registry belongs to the owner). */
    kvedge_metric_t *req_family, *peer_family;
    kvedge_series_t *req[5]; /* snapshot, set, heartbeat, malformed, other */
    /* Masters on etcd (docs/master.md): all zero in the embedded default (role single). */
    kvedge_etcd_t *etcd;
    char prefix[256];                             /* every key of this cluster, with a '/' */
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];      /* this master's id */
    char cluster[KVEDGE_MASTER_MAX_ID_BYTES + 1]; /* the cluster name in meta */
    int role;                                     /* S_ROLE_* */
    int64_t lease;                                /* this master's lease; 0 = none */
    int64_t lease_ok_ms;         /* monotonic: when the last keepalive that held was sent */
    int64_t next_keepalive;      /* monotonic */
    int64_t next_info;           /* monotonic: masters and members re-read */
    int64_t next_check;          /* monotonic: a leader reads the leader key again */
    uint64_t reserved;           /* H: seqs up to it are reserved in etcd */
    int64_t term;                /* the leader key's create revision while leading */
    bool etcd_ok;                /* the last etcd call was answered */
    kvedge_master_desc_t leader; /* the leader known (id "": none) */
    kvedge_mview_t *view;        /* a standby's view of the leader's registry */
    kvedge_etcd_reply_t members;
    kvedge_master_desc_t masters[S_MAX_MASTERS];
    size_t n_masters;
    uint64_t leader_changes;
    int64_t led_lease; /* the lease under which this master's state became the leader's */
    char why[KVEDGE_KVMSG_MAX_REASON_BYTES + 1]; /* why s_apply refused (etcd), for the ERR */
} kvedge_master_state_t;

/* master.c: the registry's side, for ha.c. */

/* Publishes a heartbeat id's state (1 up, 2 suspect, 3 down) as a gauge. */
void kvedge_master_peer_metric(kvedge_master_state_t *m, const char *id,
                               kvedge_master_health_state_t st);
/* The record count and size, published for the scrape. */
void kvedge_master_publish_size(kvedge_master_state_t *m);
/* A RocksDB error on the registry: logged, then translated (it frees *err). */
int kvedge_master_rerr(char **err);
/* A stored row: seq u64 | body (1 … 64 KiB) under a valid key. */
bool kvedge_master_row_ok(const char *k, size_t kl, const char *v, size_t vl);
/* Sends k to the peer at route; false when the peer is gone or its queue is full. */
bool kvedge_master_reply(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *k);
/* ERR with status and reason to the peer at route, echoing req's rid and key. */
void kvedge_master_reply_err(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *req,
                             int status, const char *reason);
/* HUGZ with the current seq and registry id on the PUB. */
void kvedge_master_hugz(kvedge_master_state_t *m);

/* ha.c: masters on etcd and STATUS, for master.c. */

/* model/, tmodel/ and map/: the hard records that live in etcd. */
bool kvedge_master_hard_key(const char *key, size_t len);
/* Persists H = seq + KVEDGE_MASTER_SEQ_BLOCK in etcd (fenced) before seq is published. */
int kvedge_master_reserve(kvedge_master_state_t *m, uint64_t seq, char *why, size_t why_len);
/* A hard record (len 0: its deletion) into etcd at seq, fenced by the leader's lease. */
int kvedge_master_etcd_record(kvedge_master_state_t *m, const char *key, uint64_t seq,
                              const uint8_t *body, size_t len, char *why, size_t why_len);
/* The answer to STATUS (every master, every role). */
void kvedge_master_status_reply(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *k);
/* ERR ENOTLEADER with `leader R P`, `no leader` or `no etcd quorum`. */
void kvedge_master_not_leader(kvedge_master_state_t *m, zframe_t *route, const kvedge_kvmsg_t *k);
/* At start on etcd: the client, an endpoint that is etcd, meta (format, cluster, registry id). */
int kvedge_master_etcd_open(kvedge_master_state_t *m, char *why, size_t why_len);
/* A master's default id from its ROUTER endpoint: "tcp://10.0.0.1:7410" -> "10.0.0.1:7410". */
void kvedge_master_default_id(const char *ep, char *out, size_t cap);
/* At stop: the lease revoked (a clean handover), the view and the client closed. */
void kvedge_master_etcd_close(kvedge_master_state_t *m);
/* One election step: the lease, then campaign, take over, lead again or follow. */
void kvedge_master_elect(kvedge_master_state_t *m);

#endif
