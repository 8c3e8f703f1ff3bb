/* The mover: puts a cloud tier's chunks where placement says (access/placement.h), reading the
 * Storage Master's directory. One core, two callers. Every cloud store node that joins a
 * master runs it in the background for re-replication: when a cloud node has been down past a
 * grace period, each chunk it held that now has fewer than R live complete replicas is copied
 * from a surviving replica to the nodes its placement names, by the first up holder in the
 * placement's rank order (so one node copies each chunk), under a bandwidth limit. A chunk
 * below R that no lost node held (written to fewer nodes than R) is copied once it has stayed
 * below R for the grace period too, so a write still in flight is not copied under it.
 * `kvedge rebalance` runs the same plan by hand to move every chunk to its current placement,
 * and deletes the copies on nodes no longer placed only once the directory shows the new ones
 * complete. The placement key is the chunk's root (LIST reports parents: a chain walks to its
 * first chunk), so a chain moves together. Copies travel node to node through the protocol
 * client (GET_LAYER from the source, PUT to the target) with the copier's key: they land in the
 * namespace of the tenant that key is (plaintext loopback: `loopback`); chunks of other tenants
 * are not listed to it and are skipped (docs/operations.md, "Re-replication and
 * rebalancing"). */
#ifndef KVEDGE_STORE_NODE_MOVER_H
#define KVEDGE_STORE_NODE_MOVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/client.h"
#include "access/placement.h"
#include "monitor/metrics.h"
#include "runtime/kvmsg.h"
#include "runtime/mview.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_MOVER_GRACE_S_DEFAULT 30            /* down this long: its replicas are lost */
#define KVEDGE_MOVER_BW_DEFAULT      (32ull << 20) /* bytes/s a mover copies at, at most */
#define KVEDGE_MOVER_INTERVAL_MS     1000          /* between background passes */
#define KVEDGE_MOVER_RECENT_MS       10000         /* a copy is not redone this soon */
/* A backlog the last pass could do nothing about (another tenant's chunks, no source, a write
 * waiting out the grace) is looked at again this often while the registry does not change. */
#define KVEDGE_MOVER_IDLE_MS         10000
#define KVEDGE_MOVER_DEADLINE_MS     10000        /* per call to a node */
#define KVEDGE_MOVER_LAYER_BYTES_MAX (256u << 20) /* one layer of one chunk, all heads */
#define KVEDGE_MOVER_WALK_MAX        65536        /* parent links followed to a root */
#define KVEDGE_MOVER_FAIL_LINES      5 /* failed copies logged one by one per run, then counted */
#define KVEDGE_MOVER_LOG_MS          60000 /* a repeated skip is logged this often */

/* One cloud node of the tier as the directory shows it. */
typedef struct {
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    char endpoint[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];
    char public_key[KVEDGE_MASTER_KEY_Z85_BYTES + 1]; /* "" plaintext */
    uint64_t capacity; /* registered capacity: the placement weight (0: never placed) */
    int health;        /* kvedge_master_health_state_t; 0 when the master has none */
    bool up;           /* health up: placement picks among these */
    bool live;         /* its copies count as replicas: not down, or down within the grace */
    uint64_t bytes;    /* bytes its LIST reported (0 until listed) */
    bool listed;       /* kvedge_tier_learn ran for it */
} kvedge_tier_node_t;

typedef struct kvedge_tier_t kvedge_tier_t;

/* Reads the cloud nodes (node/ records of role cloud, with their health/ records) and the
 * directory (dir/) from a synced view at wall clock now_ms. A node down for at least
 * grace_ms is not live; grace_ms 0: only up and suspect nodes are. Directory entries of a node
 * with no node record (gone), or of an edge node, are skipped and counted
 * (kvedge_tier_skipped). Caller owns *out. Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM. */
int kvedge_tier_read(kvedge_mview_t *view, uint64_t now_ms, uint64_t grace_ms, kvedge_tier_t **out);

/* NULL-safe, idempotent, nulls *self_p. */
void kvedge_tier_destroy(kvedge_tier_t **self_p);

/* The nodes, in id order; *n their count. Valid until destroy. */
const kvedge_tier_node_t *kvedge_tier_nodes(const kvedge_tier_t *t, size_t *n);

/* The index of node id, or -1. */
int kvedge_tier_find(const kvedge_tier_t *t, const char *id);

/* Learns what node `node` holds from its LIST (chunk ids as the lister's tenant knows them):
 * parents, model, index and tokens of each chunk the directory names, and the node's bytes.
 * Returns 0 or KVEDGE_EINVAL. */
int kvedge_tier_learn(kvedge_tier_t *t, size_t node, const kvedge_chunk_entry_t *e, size_t n);

/* Directory entries skipped by read (node gone or not a cloud node), and chunks the plan
 * could not place (no LIST named them, or their chain does not reach a root): the node ids
 * gone are in *gone (may be NULL; the first of them, "" none). */
uint32_t kvedge_tier_skipped(const kvedge_tier_t *t, uint32_t *unplaced, const char **gone);

/* Chunks with fewer than r live complete replicas (r 0: the default for the up nodes), and
 * of those, how many no up node holds complete (nothing to copy from). */
uint32_t kvedge_tier_backlog(const kvedge_tier_t *t, uint32_t r, uint32_t *stranded);

/* The placement skew over the up nodes of weight > 0: max / mean of their listed bytes
 * (1.0 when even; 0 when none holds anything). */
double kvedge_tier_skew(const kvedge_tier_t *t);

typedef enum {
    KVEDGE_MOVE_COPY = 1,   /* copy chunk from node `from` to node `to` */
    KVEDGE_MOVE_DELETE = 2, /* delete chunk on node `to` once its placement holds it */
} kvedge_move_kind_t;

typedef struct {
    kvedge_move_kind_t kind;
    uint32_t from, to;         /* node indexes (from: COPY only) */
    kvedge_chunk_info_t chunk; /* client ids */
    kvedge_chunk_id_t root;    /* its placement key */
    uint64_t bytes;            /* as the source's LIST said */
    bool lost;                 /* a node no longer live (down past the grace) held it */
    bool pinned;               /* every block pinned where it was listed: the copy is pinned */
} kvedge_move_t;

typedef enum {
    KVEDGE_MOVER_REPAIR = 1,    /* copies until r live complete replicas; no deletes */
    KVEDGE_MOVER_REBALANCE = 2, /* copies to every placed node, deletes elsewhere */
} kvedge_mover_mode_t;

/* The moves that put the learnt chunks where placement says, with r replicas (0: the default
 * for the up nodes). A copy's source is the first up node in rank order that holds the chunk
 * complete and listed it; with self >= 0 (REPAIR by a node) only the moves whose source is
 * self. Deletes (REBALANCE) are listed after every copy. *moves: caller frees (free).
 * Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM. */
int kvedge_tier_plan(kvedge_tier_t *t, kvedge_mover_mode_t mode, uint32_t r, int self,
                     kvedge_move_t **moves, size_t *n);

/* What copying did. */
typedef struct {
    uint64_t copies_done, copies_failed; /* chunk copies */
    uint64_t bytes;                      /* block bytes put to targets */
    uint64_t deletes_done, deletes_kept; /* chunk deletes: done, or held back (placement
                                            not complete) */
    uint64_t elapsed_us;                 /* copying time */
} kvedge_mover_result_t;

/* How a mover reaches nodes. */
typedef struct {
    const char *cert;  /* this copier's secret certificate; NULL: plaintext */
    uint64_t bw;       /* bytes/s at most; 0 = unlimited */
    int deadline_ms;   /* per call; 0 = KVEDGE_MOVER_DEADLINE_MS */
    atomic_bool *stop; /* may be NULL: set, the copies end early */
} kvedge_mover_io_t;

/* Open connections to a tier's nodes, made on first use. */
typedef struct kvedge_mover_conns_t kvedge_mover_conns_t;
kvedge_mover_conns_t *kvedge_mover_conns_new(const kvedge_mover_io_t *io);
void kvedge_mover_conns_destroy(kvedge_mover_conns_t **self_p);
/* The connection to node i of t (connected now if it is not); NULL on failure, with why. */
kvedge_client_t *kvedge_mover_conn(kvedge_mover_conns_t *c, const kvedge_tier_t *t, size_t i,
                                   char *why, size_t why_len);

/* Lists node i and learns it (kvedge_tier_learn). Errors: the client's. */
int kvedge_mover_list(kvedge_mover_conns_t *c, kvedge_tier_t *t, size_t i);

/* Copies one chunk (every layer of its model, at every head, the blocks as stored; pinned when
 * m->pinned) from node from to node to: GET_LAYER of the next layer streams in while the
 * current one is PUT, paced to io's bandwidth. *bytes receives the bytes put. Errors: the
 * clients' (a head the source lacks: KVEDGE_ENOTFOUND), KVEDGE_ETIMEDOUT (a node did not
 * answer: no new connection to it is tried for KVEDGE_MOVER_RECENT_MS), KVEDGE_ECLOSED
 * (stopped). */
int kvedge_mover_copy(kvedge_mover_conns_t *c, const kvedge_tier_t *t, const kvedge_move_t *m,
                      uint64_t *bytes);

/* Runs the COPY moves; adds to *res. */
void kvedge_mover_copy_all(kvedge_mover_conns_t *c, const kvedge_tier_t *t,
                           const kvedge_move_t *moves, size_t n, kvedge_mover_result_t *res);

/* Whether the view shows every COPY move's chunk complete on its target. */
bool kvedge_mover_landed(kvedge_mview_t *view, const kvedge_tier_t *t, const kvedge_move_t *moves,
                         size_t n);

/* Runs the DELETE moves whose chunk's placed nodes all hold it complete in the view (r of
 * them at least), grouped per node and root: a node's copies of a chain go only when every
 * chunk of it the node holds is complete on its placement. The rest are kept (counted).
 * Adds to *res. */
void kvedge_mover_delete_all(kvedge_mover_conns_t *c, kvedge_mview_t *view, kvedge_tier_t *t,
                             uint32_t r, const kvedge_move_t *moves, size_t n,
                             kvedge_mover_result_t *res);

/* ---------------------------------------------------------------- the node's mover */

typedef struct {
    const char *node_id; /* this node's id in the registry */
    const char *master;  /* the master's ROUTER and PUB */
    const char *master_pub;
    const char *master_key;    /* its key; NULL plaintext */
    const char *cert;          /* this node's secret certificate (for the master and the nodes);
                                * NULL plaintext */
    uint32_t replicas;         /* R; 0 = KVEDGE_PLACE_REPLICAS_DEFAULT */
    uint64_t grace_ms;         /* 0 = KVEDGE_MOVER_GRACE_S_DEFAULT s */
    uint64_t bw;               /* bytes/s; 0 = unlimited */
    uint32_t interval_ms;      /* 0 = KVEDGE_MOVER_INTERVAL_MS */
    kvedge_metrics_t *metrics; /* may be NULL: the families are made in it */
} kvedge_mover_opts_t;

typedef struct kvedge_mover_t kvedge_mover_t;

typedef struct {
    uint32_t backlog;  /* chunks below R live complete replicas, at the last pass */
    uint32_t stranded; /* of those, held complete by no up node */
    uint64_t passes;   /* passes that looked at the directory */
    kvedge_mover_result_t total;
} kvedge_mover_stats_t;

/* Starts the background mover (its own view of the whole registry, and a thread). Caller
 * owns *out. Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM, those of kvedge_mview_start. */
int kvedge_mover_start(const kvedge_mover_opts_t *opts, kvedge_mover_t **out);

/* Stops it (a copy in flight ends within its deadline). NULL-safe, idempotent. */
void kvedge_mover_destroy(kvedge_mover_t **self_p);

/* One pass now, on the caller's thread (serialized with the thread's). Returns 0, or
 * KVEDGE_ETIMEDOUT when the view is not synced. */
int kvedge_mover_pass(kvedge_mover_t *m);

/* Copies the counters. Thread-safe. */
void kvedge_mover_stats(kvedge_mover_t *m, kvedge_mover_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif
