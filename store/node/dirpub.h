/* The block directory publisher of a store node: keeps the Storage Master's
 * dir/<node>/<chunk> records equal to what the node's engine holds (which layers of which
 * chunk are complete), and registers the node itself (node/<id>). It polls the engine: a pass
 * starts only when the engine's counters moved, so an idle node costs nothing, and one
 * mechanism covers puts, deletes, evictions and expiry alike. */
#ifndef KVEDGE_STORE_NODE_DIRPUB_H
#define KVEDGE_STORE_NODE_DIRPUB_H

#include <stdint.h>

#include "access/kvmsg.h"
#include "access/mview.h"
#include "store/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_DIRPUB_INTERVAL_MS 500        /* how often the engine's counters are looked at */
#define KVEDGE_DIRPUB_MAX_CHUNKS  (1u << 20) /* chunks one pass publishes; the rest wait */

typedef struct kvedge_dirpub_t kvedge_dirpub_t;

typedef struct {
    kvedge_engine_t *engine; /* not owned */
    kvedge_mview_t *view;    /* not owned: its master takes the records */
    const char *node_id;
    const kvedge_master_node_t *node; /* the node record to keep registered; NULL = none */
    uint32_t interval_ms;             /* 0 = KVEDGE_DIRPUB_INTERVAL_MS */
} kvedge_dirpub_opts_t;

/* Starts the publisher thread. Caller owns *out. Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM. */
int kvedge_dirpub_start(const kvedge_dirpub_opts_t *opts, kvedge_dirpub_t **out);

/* Stops the thread. NULL-safe, idempotent, nulls *self_p. Records stay in the registry:
 * a node that stops still holds its blocks on disk. */
void kvedge_dirpub_destroy(kvedge_dirpub_t **self_p);

/* One pass now, on the caller's thread (the publisher's own passes are serialized with it):
 * publishes every chunk whose held layers changed and deletes records of chunks gone.
 * *changed (may be NULL) receives the records written. Returns 0 or the first SET error
 * (KVEDGE_ETIMEDOUT when the master is down: the next pass retries). */
int kvedge_dirpub_sync(kvedge_dirpub_t *d, uint32_t *changed);

#ifdef __cplusplus
}
#endif
#endif
