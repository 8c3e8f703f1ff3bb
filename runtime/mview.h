/* The master's replica view (docs/master.md, "Replica view"): what proxies and nodes hold of
 * the Storage Master's registry. An actor subscribes to the master's PUB, takes a snapshot
 * over its ROUTER, applies the sequenced updates after it, and re-syncs by itself on a gap,
 * a silent master or a master restart (the zguide Clone client). Getters are thread-safe and
 * never wait on the network; when the master is gone the view keeps serving its last state
 * (and, across restarts, a snapshot file) and says so: KVEDGE_MVIEW_STALE. */
#ifndef KVEDGE_ACCESS_MVIEW_H
#define KVEDGE_ACCESS_MVIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/kvmsg.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_MVIEW_DEAD_MS         3000   /* no HUGZ or update for this long: master gone */
#define KVEDGE_MVIEW_SNAPSHOT_MS     3000   /* a snapshot not complete by then is retried */
#define KVEDGE_MVIEW_RETRY_MS        250    /* between snapshot attempts while unreachable */
#define KVEDGE_MVIEW_SAVE_MS         10000  /* snapshot file rewritten this often when changed */
#define KVEDGE_MVIEW_START_WAIT_MS   1000   /* start waits this long for a first sync */
#define KVEDGE_MVIEW_BUFFER_MAX      100000 /* updates held while a snapshot is in flight */
#define KVEDGE_MVIEW_SUB_HWM         100000 /* updates queued in the SUB before libzmq drops */
#define KVEDGE_MVIEW_SET_DEADLINE_MS 3000
#define KVEDGE_MVIEW_FILE_VERSION    1
/* New sockets while the master is not heard (refused, or not answering): first after this
 * long, doubling up to the max. A refusal is seen at once (a socket monitor); silence after
 * max(dead_ms, the current wait). */
#define KVEDGE_MVIEW_RECONNECT_MIN_MS 1000
#define KVEDGE_MVIEW_RECONNECT_MAX_MS 30000
/* A list of masters (docs/master.md "Client algorithm"): a standby's PUB is silent, so the view
 * asks for a snapshot this long after connecting even when the PUB has said nothing (with one
 * master: after dead_ms). The Clone gap rules keep that safe. */
#define KVEDGE_MVIEW_PROBE_MS 200
/* A master that answers ENOTLEADER without naming a leader ("no leader", "no etcd quorum"):
 * the next master of the list (a snapshot), or the same request again (SET), after this long. */
#define KVEDGE_MVIEW_NO_LEADER_MS 250
#define KVEDGE_MVIEW_MAX_MASTERS  16 /* entries in a list of masters */

typedef enum {
    KVEDGE_MVIEW_EMPTY = 0,  /* no state at all: never synced, no snapshot file */
    KVEDGE_MVIEW_STALE = 1,  /* serving the last known state: master unreachable, or re-syncing */
    KVEDGE_MVIEW_SYNCED = 2, /* following the master's updates */
} kvedge_mview_state_t;

/* "empty", "stale", "synced". */
const char *kvedge_mview_state_name(int state);

/* Called on the view's thread after each applied update (body NULL and len 0: deleted) and,
 * with key NULL, after each full (re)sync replaced the state. Runs without the view's lock:
 * it may call the getters, but not kvedge_mview_set or destroy. */
typedef void (*kvedge_mview_change_fn)(void *ctx, const char *key, uint64_t seq,
                                       const uint8_t *body, size_t len);

typedef struct {
    const char *master;        /* the master's ROUTER endpoint, or a list "EP[,EP...]" of the
                                * masters of one cluster (required) */
    const char *pub;           /* the matching PUB endpoint(s), as many as master (required) */
    const char *server_key;    /* the master's public key: Z85 (40 chars) or a path to its
                                * public certificate; NULL = plaintext (loopback only). The
                                * masters of one cluster share one certificate: the same key
                                * serves every entry and any leader a master names */
    const char *client_cert;   /* this peer's secret certificate; required with server_key */
    const char *prefix;        /* replicate only keys starting with it; NULL = everything */
    const char *snapshot_path; /* replica file, rewritten atomically; NULL = none */
    const char *heartbeat_id;  /* when set, a HEARTBEAT with this id every heartbeat_ms */
    uint32_t heartbeat_ms;     /* 0 = KVEDGE_MASTER_HEARTBEAT_IVL_MS */
    uint32_t dead_ms;          /* 0 = KVEDGE_MVIEW_DEAD_MS */
    uint32_t save_ms;          /* 0 = KVEDGE_MVIEW_SAVE_MS */
    int start_wait_ms;         /* 0 = KVEDGE_MVIEW_START_WAIT_MS; negative = do not wait */
    kvedge_mview_change_fn on_change;
    void *ctx;
} kvedge_mview_opts_t;

typedef struct {
    uint64_t syncs;      /* snapshots completed */
    uint64_t gaps;       /* re-syncs for a missed update (seq gap, HUGZ ahead of us) */
    uint64_t deaths;     /* re-syncs for a silent master (no HUGZ for dead_ms) */
    uint64_t bad;        /* malformed or unexpected messages ignored */
    uint64_t file_loads; /* 1 when the state came from the snapshot file at start */
} kvedge_mview_stats_t;

typedef struct kvedge_mview_t kvedge_mview_t;

void kvedge_mview_opts_default(kvedge_mview_opts_t *opts);

/* Checks a list of masters "EP[,EP...]" (or "": none): 1 … KVEDGE_MVIEW_MAX_MASTERS entries,
 * each an endpoint (kvedge_settings_check_endpoint). Returns 0, or -1 with why naming the
 * entry at fault (one endpoint: kvedge_settings_check_endpoint's words). A STRING setting's
 * check: the caller puts the value in front. */
int kvedge_mview_check_endpoints(const char *list, char *why, size_t why_len);

/* The PUB list of a list of masters: each tcp://HOST:PORT entry's PORT+1 (the master's
 * default); out receives "EP[,EP...]". Returns 0, or -1 when an entry is not tcp:// with a port
 * below 65535 (its PUB must be given) or out is too small. */
int kvedge_mview_default_pubs(const char *masters, char *out, size_t cap);

/* The number of entries of a list of masters (0 for NULL or ""). */
size_t kvedge_mview_count_endpoints(const char *list);

/* Loads the snapshot file when there is a valid one (state STALE), starts the actor, and
 * waits up to start_wait_ms for a first sync. Succeeds with the master down: check
 * kvedge_mview_state. A damaged or foreign snapshot file is ignored. Caller owns *out.
 * Errors: KVEDGE_EINVAL, KVEDGE_EIO (unreadable certificate or key), KVEDGE_EDENIED
 * (plaintext to an endpoint that is not loopback or ipc, or a libzmq without CURVE),
 * KVEDGE_ENOMEM. */
int kvedge_mview_start(const kvedge_mview_opts_t *opts, kvedge_mview_t **out);

/* Stops the actor (pending sets return KVEDGE_ECLOSED), writes the snapshot file when the
 * state changed since it was last written, frees. NULL-safe, idempotent. */
void kvedge_mview_destroy(kvedge_mview_t **self_p);

kvedge_mview_state_t kvedge_mview_state(kvedge_mview_t *v);

/* The seq of the state the view serves (0 when EMPTY). */
uint64_t kvedge_mview_seq(kvedge_mview_t *v);

/* The id of the registry the served state came from (0 when EMPTY): a master on a fresh
 * directory has another one. */
uint64_t kvedge_mview_registry(kvedge_mview_t *v);

/* Records held. */
size_t kvedge_mview_count(kvedge_mview_t *v);

void kvedge_mview_stats(kvedge_mview_t *v, kvedge_mview_stats_t *out);

/* The view's connection to the master, for logs and readiness checks. */
typedef struct {
    bool refused;        /* the master refused this view's latest CURVE handshake (its ZAP
                          * handler: this peer's key is not in the master's allowlist); cleared
                          * by the next handshake that succeeds */
    uint64_t refusals;   /* handshakes refused since start */
    uint64_t reconnects; /* new sockets made because the master refused or did not answer */
    uint32_t retry_ms;   /* the wait before the next new sockets while not heard */
    bool heard;          /* the current sockets have heard the master */
    uint32_t dead_ms;    /* silence after which the master counts as gone (opts.dead_ms) */
    bool mismatch;       /* the master speaks another security mechanism: it requires CURVE
                          * and this view is plaintext (no server_key), or the reverse; cleared
                          * by the next handshake that succeeds */
    char endpoint[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1]; /* the ROUTER of the master followed now
                                                          * (an entry of the list, or the leader
                                                          * a master named) */
    char pub[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];      /* its PUB */
    uint64_t moves;     /* times the view went to another master (a redirect, or the next entry
                         * of the list after silence or "no leader") */
    uint64_t redirects; /* of those, moves to the leader an ENOTLEADER answer named */
    char reason[KVEDGE_KVMSG_MAX_REASON_BYTES + 1]; /* the last ENOTLEADER reason ("leader R P",
                                                     * "no leader", "no etcd quorum"); "" none */
} kvedge_mview_conn_t;

/* Copies the connection's state. A refused view keeps trying (new sockets, with backoff), so
 * adding its certificate to the master's allowlist is enough: no restart. Zeroes *out for a
 * NULL view. */
void kvedge_mview_conn(kvedge_mview_t *v, kvedge_mview_conn_t *out);

/* Waits until the view is SYNCED at seq >= min_seq, and the on_change calls up to that seq
 * have returned. Returns 0 or KVEDGE_ETIMEDOUT. */
int kvedge_mview_wait(kvedge_mview_t *v, uint64_t min_seq, int timeout_ms);

/* Copies the body of key into buf. *len (may be NULL) receives its length, also when buf is
 * too small. Errors: KVEDGE_EINVAL, KVEDGE_ENOTFOUND, KVEDGE_ENOSPACE. */
int kvedge_mview_get(kvedge_mview_t *v, const char *key, void *buf, size_t cap, size_t *len);

/* Calls cb for every record whose key starts with prefix (NULL or "" = all), in key order, on
 * a copy taken under the lock: cb may call the getters. cb returns 0 to go on. Returns 0 or
 * KVEDGE_ENOMEM. */
typedef int (*kvedge_mview_cb)(void *ctx, const char *key, uint64_t seq, const uint8_t *body,
                               size_t len);
int kvedge_mview_foreach(kvedge_mview_t *v, const char *prefix, kvedge_mview_cb cb, void *ctx);

/* Sends a SET (len 0 = delete) and waits for the master's answer until deadline_ms (0 =
 * KVEDGE_MVIEW_SET_DEADLINE_MS, at most KVEDGE_WIRE_MAX_DEADLINE_MS). On success the view itself
 * has applied the update, when it is synced (read your writes). The master may have applied an
 * update whose answer was lost: SET is idempotent, retry it. A master that does not lead and
 * names the leader moves the view there and the SET is sent again within the deadline;
 * KVEDGE_ENOTLEADER only when no leader answered in time (kvedge_mview_conn's reason says
 * why). Errors: KVEDGE_EINVAL (key or length),
 * the master's refusal (KVEDGE_EINVAL, KVEDGE_EDENIED, KVEDGE_EPROTO, KVEDGE_EVERSION,
 * KVEDGE_EFULL, store errors), KVEDGE_ETIMEDOUT (no answer: the master is down; keep working
 * on the view), KVEDGE_ECLOSED (the view is being destroyed), KVEDGE_EBACKLOG (its queue is full).
 */
int kvedge_mview_set(kvedge_mview_t *v, const char *key, const void *body, size_t len,
                     int deadline_ms);

/* Queues one HEARTBEAT for id to the master the view follows (dropped when it is unreachable;
 * an ENOTLEADER answer that names the leader moves the view there). Returns 0, or
 * KVEDGE_EINVAL (not a node id), KVEDGE_ECLOSED, KVEDGE_EBACKLOG. */
int kvedge_mview_heartbeat(kvedge_mview_t *v, const char *id);

/* Typed getters: the record under the key built from the ids, decoded. Errors: those of
 * kvedge_mview_get, KVEDGE_EINVAL (bad id), and the record parser's (KVEDGE_EPROTO,
 * KVEDGE_EVERSION). */
int kvedge_mview_node(kvedge_mview_t *v, const char *id, kvedge_master_node_t *out);
int kvedge_mview_health(kvedge_mview_t *v, const char *id, kvedge_master_health_t *out);
int kvedge_mview_model(kvedge_mview_t *v, const char *model_id, kvedge_model_t *out);
/* The model record a tenant registered on a node (tmodel/<tag hex>/<id>), tag its
 * kvedge_tenant_tag; errors as kvedge_mview_model. */
int kvedge_mview_tenant_model(kvedge_mview_t *v, const uint8_t tag[16], const char *model_id,
                              kvedge_model_t *out);
int kvedge_mview_map(kvedge_mview_t *v, const char *cloud_model, const char *edge_model,
                     kvedge_master_map_t *out);
int kvedge_mview_adapter(kvedge_mview_t *v, const char *cloud_model, const char *edge_model,
                         kvedge_master_adapter_t *out);
int kvedge_mview_dir(kvedge_mview_t *v, const char *node_id, const kvedge_chunk_id_t *chunk,
                     kvedge_master_dir_t *out);
int kvedge_mview_link(kvedge_mview_t *v, const char *from, const char *to,
                      kvedge_master_link_t *out);

#ifdef __cplusplus
}
#endif
#endif
