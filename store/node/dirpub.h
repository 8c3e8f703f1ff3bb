/* The block directory publisher of a store node: keeps the Storage Master's
 * dir/<node>/<chunk> records equal to what the node's engine holds (which layers of which
 * chunk are complete), and registers the node itself (node/<id>). It polls the engine: a pass
 * starts only when the engine's counters moved, so an idle node costs nothing, and one
 * mechanism covers puts, deletes, evictions and expiry alike. A full re-sync of the view with
 * another master (a new leader, the next of a list), another registry (a master restarted on
 * a fresh directory) or an older state publishes the whole directory again, and a registry
 * that lost node/<id> gets it and the directory again: a new leader rebuilds this soft state
 * from the nodes. Registration retries by itself
 * (with a backoff) and says why it waits: a master that refuses this node's certificate, one
 * that does not answer, one that answers with an error. */
#ifndef KVEDGE_STORE_NODE_DIRPUB_H
#define KVEDGE_STORE_NODE_DIRPUB_H

#include <stdint.h>

#include "runtime/kvmsg.h"
#include "runtime/mview.h"
#include "store/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_DIRPUB_INTERVAL_MS 500        /* how often the engine's counters are looked at */
#define KVEDGE_DIRPUB_MAX_CHUNKS  (1u << 20) /* chunks one pass publishes; the rest wait */
/* A registration that failed is tried again after this long, doubling up to the max; at once
 * when the master's view has just come back. */
#define KVEDGE_DIRPUB_RETRY_MIN_MS 1000
#define KVEDGE_DIRPUB_RETRY_MAX_MS 30000
/* A registration problem (refused, failing) is logged when it starts and then at most once
 * per this long while it lasts. Losing the master and hearing it again are logged once per
 * transition. */
#define KVEDGE_DIRPUB_PROBLEM_LOG_MS 300000

typedef struct kvedge_dirpub_t kvedge_dirpub_t;

typedef struct {
    kvedge_engine_t *engine; /* not owned */
    kvedge_mview_t *view;    /* not owned: its master takes the records */
    const char *node_id;
    const kvedge_master_node_t *node; /* the node record to keep registered; NULL = none */
    uint32_t interval_ms;             /* 0 = KVEDGE_DIRPUB_INTERVAL_MS */
    const char *master;               /* the master's endpoint, for log lines; may be NULL */
    const char *cert; /* the public certificate the view presents to the master (its key must be
                       * in the master's allowlist), named in the fix when it is refused; may
                       * be NULL (plaintext) */
    bool derives;     /* the node derives precisions it does not hold (directory rungs) */
} kvedge_dirpub_opts_t;

/* Where the registration of node/<id> stands. */
typedef enum {
    KVEDGE_DIRPUB_PENDING = 0,    /* not registered yet, nothing has failed so far */
    KVEDGE_DIRPUB_REGISTERED = 1, /* node/<id> is in the registry (or there is no record to
                                   * keep) */
    KVEDGE_DIRPUB_REFUSED = 2,    /* the master refuses this node's handshake: its certificate
                                   * is not in the master's allowlist */
    KVEDGE_DIRPUB_FAILING = 3,    /* the master does not answer, or answers with an error */
    KVEDGE_DIRPUB_LOST = 4,       /* registered, then the master went silent: nothing heard
                                   * (HUGZ, heartbeat answers) for the view's dead_ms; the node
                                   * serves on and is registered again when the master is back */
} kvedge_dirpub_reg_state_t;

typedef struct {
    int state;         /* a kvedge_dirpub_reg_state_t */
    uint64_t since_ms; /* wall clock (ms since the epoch) when state took its value */
    uint32_t attempts; /* tries since the last registration: SETs sent and handshakes the
                        * master refused */
    int last_error;    /* the latest try's error (KVEDGE_EDENIED for a refused handshake);
                        * 0 when none since the last registration */
    char why[384];     /* the state in words, with the fix when there is one; "" registered */
} kvedge_dirpub_reg_t;

/* Starts the publisher thread. Caller owns *out. Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM. */
int kvedge_dirpub_start(const kvedge_dirpub_opts_t *opts, kvedge_dirpub_t **out);

/* Stops the thread. NULL-safe, idempotent, nulls *self_p. Records stay in the registry:
 * a node that stops still holds its blocks on disk. */
void kvedge_dirpub_destroy(kvedge_dirpub_t **self_p);

/* One pass now, on the caller's thread (the publisher's own passes are serialized with it):
 * registers the node when it is not (yet, or any more) and the backoff allows, then publishes
 * every chunk whose held layers changed and deletes records of chunks gone. *changed (may be
 * NULL) receives the records written. Returns 0 or the first SET error (KVEDGE_ETIMEDOUT when
 * the master is down: the next pass retries); while the node is not registered, the
 * registration's latest error (KVEDGE_EDENIED: the master refuses this node's handshake). */
int kvedge_dirpub_sync(kvedge_dirpub_t *d, uint32_t *changed);

/* Copies where the registration stands. Thread-safe, never waits on the network. */
void kvedge_dirpub_registration(kvedge_dirpub_t *d, kvedge_dirpub_reg_t *out);

/* "pending", "registered", "refused", "failing", "lost", or "?"; static storage. */
const char *kvedge_dirpub_reg_state_name(int state);

#ifdef __cplusplus
}
#endif
#endif
