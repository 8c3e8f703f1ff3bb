/* The edge's historical cache: a list of subscribed contexts (system prompts of tasks) whose
 * KV an edge store node copies from a cloud node and pins, so that it can serve them with
 * the network down. One sync pass pulls what is new or changed; a running node repeats it. */
#ifndef KVEDGE_STORE_NODE_HSYNC_H
#define KVEDGE_STORE_NODE_HSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_HSYNC_MAX_SUBS           256
#define KVEDGE_HSYNC_INTERVAL_S_DEFAULT 60
#define KVEDGE_HSYNC_STATUS_FILE        "sync.status" /* in the data directory */

/* One subscribed context: the chain of chunks ending at `prefix` (a client chunk id, as the
 * cloud's LIST shows it), fetched from `cloud` with this edge's key, stored locally in the
 * namespace of `tenant` (so that local clients of that tenant hit it) and pinned. */
typedef struct {
    char name[64];
    char cloud[256];      /* endpoint of the cloud node */
    char server_key[512]; /* its public key or certificate path; empty = plaintext */
    char cert[512];       /* this edge's secret certificate on the cloud */
    char tenant[128];     /* local tenant that receives the copy ("loopback" = plaintext) */
    kvedge_chunk_id_t prefix;
    /* Layers [first_layer, first_layer + layers) of every chunk; layers 0 = all of them. An
     * edge may keep only the layers it would otherwise fetch over its slowest link (the deep
     * ones from the cloud), or the shallow ones it shares with peers. */
    uint16_t first_layer;
    uint16_t layers;
} kvedge_hsync_sub_t;

typedef enum {
    KVEDGE_HSYNC_NEVER = 0, /* no pass yet */
    KVEDGE_HSYNC_OK,        /* the last pass copied the whole context */
    KVEDGE_HSYNC_PARTIAL,   /* the last pass failed part way: what is here stays pinned */
    KVEDGE_HSYNC_FAILED,    /* the last pass could not start (cloud unreachable, ...) */
} kvedge_hsync_state_t;

/* What one pass found. The held counts always come from the local engine, so a pass that
 * failed (cloud unreachable) still says what the edge serves: FAILED walks the local copy of
 * the chain from the subscribed chunk up through its parents (a copy that never reached the
 * subscribed chunk is not found that way and counts 0); PARTIAL counts the chain the cloud
 * listed. */
typedef struct {
    kvedge_hsync_state_t state;
    uint32_t chunks_total;  /* chunks of the context on the cloud; 0 when it was not listed */
    uint32_t chunks_synced; /* chunks whose every block is here (FAILED: every block of the
                             * subscribed layers, by the model's shape) */
    uint64_t blocks_copied; /* blocks copied by the last pass (0 when nothing changed) */
    uint64_t bytes_copied;
    uint64_t blocks_held;   /* blocks of the context held locally after the pass */
    uint64_t last_ok_ms;    /* wall clock of the last fully successful pass, 0 = never */
    int last_error;         /* 0 or why the last pass did not finish */
    uint64_t blocks_pinned; /* of blocks_held, those pinned (all, unless unpinned by hand) */
} kvedge_hsync_status_t;

/* Reads subscriptions from a ZPL file: one `subscription` section per context with keys
 * name, cloud, server_key, cert, tenant, prefix (64 hex digits) and layers ("A:B", layers A
 * to B-1; default all). *n receives the count.
 * why (may be NULL) says what is wrong. Errors: KVEDGE_EIO (unreadable), KVEDGE_EINVAL. */
int kvedge_hsync_load(const char *path, kvedge_hsync_sub_t *subs, size_t max, size_t *n, char *why,
                      size_t why_len);

/* One sync pass of one subscription into the engine: lists the context on the cloud, copies
 * every chunk whose block count or bytes differ from the local copy (for a layer range: whose
 * block count in the range differs), layer by layer, and pins everything. A layer range
 * past the model's layers is clipped to it. Never deletes anything local. deadline_ms bounds each
 * remote call. */
int kvedge_hsync_run(kvedge_engine_t *engine, const kvedge_hsync_sub_t *sub, int deadline_ms,
                     kvedge_hsync_status_t *status);

/* The state's name: "never", "ok", "partial", "failed"; static storage. */
const char *kvedge_hsync_state_name(int state);

/* One line of words on a status, the same in `kvedge sync`, DATA/sync.status ("summary") and
 * the scheduler's log: "2/2 chunks, 288 blocks copied (1.2 MiB ...) ...", or for a pass that
 * could not start "cloud unreachable: deadline passed (tcp://cloud:7400); held locally: 288
 * blocks (2 chunks), pinned". Writes at most len bytes with the NUL; returns buf. */
char *kvedge_hsync_summary(const kvedge_hsync_sub_t *sub, const kvedge_hsync_status_t *status,
                           char *buf, size_t len);

/* Writes one line per subscription (JSON, with the summary) to DIR/sync.status, atomically. */
int kvedge_hsync_write_status(const char *data_dir, const kvedge_hsync_sub_t *subs,
                              const kvedge_hsync_status_t *status, size_t n);

/* The scheduler of a running edge node: a thread that runs a pass over every subscription,
 * writes DATA/sync.status, then waits `interval_s` (cut short by destroy), and again. Each
 * subscription's pass is logged, at info when it synced, at warn with the reason and what is
 * still held when it did not; what is held stays served. */
typedef struct kvedge_hsync_sched_t kvedge_hsync_sched_t;

/* Starts the thread; subs are copied. engine and data_dir must outlive the scheduler.
 * interval_s 0 = KVEDGE_HSYNC_INTERVAL_S_DEFAULT. Caller owns *out.
 * Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM. */
int kvedge_hsync_sched_start(kvedge_engine_t *engine, const char *data_dir,
                             const kvedge_hsync_sub_t *subs, size_t n, uint32_t interval_s,
                             kvedge_hsync_sched_t **out);

/* Copies the subscriptions (at most max) and their latest status: what the last pass of each
 * found, updated as each pass ends; *last_pass_ms (may be NULL) is the wall clock of the last
 * whole pass (0: none yet). Thread-safe. Errors: KVEDGE_EINVAL. */
int kvedge_hsync_sched_status(kvedge_hsync_sched_t *s, kvedge_hsync_sub_t *subs,
                              kvedge_hsync_status_t *status, size_t max, size_t *n,
                              uint64_t *last_pass_ms);

/* Stops the thread after the pass in progress (each remote call has its deadline).
 * NULL-safe, idempotent, nulls *self_p. */
void kvedge_hsync_sched_destroy(kvedge_hsync_sched_t **self_p);

#ifdef __cplusplus
}
#endif
#endif
