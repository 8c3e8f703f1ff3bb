/* The I/O Analyzer of a store node (CE-LSLM's Cache Server, section III-B): what clients ask
 * and what the node answers, and the access pattern of the cached data, in bounded memory.
 *
 * It keeps, as metrics of the node's registry (docs/operations.md, "Monitoring"): requests
 * and bytes per opcode and status, latency histograms per opcode, block reads that hit and
 * misses with their reason, bytes served per scheme, quarantines, per-tenant requests and
 * bytes stored; and, in Space-Saving tables (monitor/hot.h), the hot set of prefixes with
 * per-layer and per-head access counts of each tracked one. Every update is a relaxed atomic
 * add on a series found once; the hot tables are one per thread that records (the frontend
 * and each worker), each with its own mutex, merged only when someone asks.
 *
 * A NULL analyzer is valid everywhere and records nothing (monitoring off). */
#ifndef KVEDGE_STORE_NODE_ANALYZER_H
#define KVEDGE_STORE_NODE_ANALYZER_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "monitor/hot.h"
#include "monitor/metrics.h"
#include "access/codec/chunk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Prefixes one hot table tracks (per recording thread), and how many /metrics shows. */
#define KVEDGE_ANALYZER_HOT_CAPACITY 256
#define KVEDGE_ANALYZER_METRICS_TOP  10
/* Tenants with their own series; the rest count under "_other". */
#define KVEDGE_ANALYZER_MAX_TENANTS 64

typedef struct kvedge_analyzer_t kvedge_analyzer_t;

/* The series of one tenant, found once per tenant by the frontend. */
typedef struct {
    kvedge_series_t *requests;
    kvedge_series_t *stored_bytes;
} kvedge_analyzer_tenant_t;

/* Declares the analyzer's families in r (which must outlive it) and makes `shards` hot
 * tables (1 … 1024: the frontend is shard 0, worker i is shard i + 1). NULL with why filled
 * on failure. */
kvedge_analyzer_t *kvedge_analyzer_new(kvedge_metrics_t *r, size_t shards, char *why,
                                       size_t why_len);
void kvedge_analyzer_destroy(kvedge_analyzer_t **self_p);

/* One request answered: opcode (a KVEDGE_OP_*), its status, the time from its arrival to its
 * answer, the payload bytes it brought and the reply bytes sent. */
void kvedge_analyzer_request(kvedge_analyzer_t *a, int op, int status, uint64_t latency_us,
                             uint64_t in_bytes, uint64_t out_bytes);

/* One block read for a client: status 0 (a hit; block/len are the block sent, for its scheme)
 * or the reason it was not served (a miss). */
void kvedge_analyzer_read(kvedge_analyzer_t *a, int status, const uint8_t *block, size_t len);

/* One access to a stored prefix (the stored, namespaced chunk id) at layer and head
 * (UINT32_MAX: a whole layer), bytes served for it, recorded in the caller's shard. */
void kvedge_analyzer_touch(kvedge_analyzer_t *a, size_t shard, const kvedge_chunk_id_t *id,
                           const char *model, uint32_t layer, uint32_t head, uint64_t bytes);

/* One block moved to quarantine (its read failed verification). */
void kvedge_analyzer_quarantine(kvedge_analyzer_t *a);

/* The series of the tenant called name (the allowlist's tenant metadata, a key, or
 * "loopback"). Takes a mutex: callers keep the result per tenant. Zeroed for a NULL a. */
void kvedge_analyzer_tenant(kvedge_analyzer_t *a, const char *name, kvedge_analyzer_tenant_t *out);

/* The top n prefixes over every shard (monitor/hot.h's merge). */
size_t kvedge_analyzer_top(kvedge_analyzer_t *a, kvedge_hot_entry_t *out, size_t n);

/* Adds the analyzer's view to obj (docs/protocol.md, MONITOR, store node): "requests",
 * "latency", "bytes", "reads", "served_bytes", "tenants", "hot" (top prefixes). Returns 0 or
 * -1 when out of memory. */
int kvedge_analyzer_json(kvedge_analyzer_t *a, cJSON *obj, size_t top);

#ifdef __cplusplus
}
#endif
#endif
