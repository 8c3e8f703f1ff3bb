/* The edge proxy's Collaboration Monitor (CE-LSLM's Cache Server, section III-B): how the
 * sources and the requests of one edge cooperate. Per source: its health state and every
 * transition with its reason, measured round trip and bandwidth, bytes and layers it served;
 * per request: layers by source kind and reason, the TTFT-relevant timings (planning, first
 * layer, last layer) and the plan's T against the time it took; the registration state of
 * every node the Storage Master lists; and the historical cache's lag, read from the
 * history source's own MONITOR document. On /metrics (proxy/collab.c declares the families),
 * over MONITOR (`kvedge -H PROXY stat`, `kvedge -H PROXY sources`) and in the log.
 *
 * Recording calls are relaxed atomic adds on series found when a source is added; the ring of
 * recent transitions has its own mutex (transitions are rare). A NULL monitor records
 * nothing. */
#ifndef KVEDGE_PROXY_COLLAB_H
#define KVEDGE_PROXY_COLLAB_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/proto.h"
#include "monitor/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Transitions kept for MONITOR (the oldest fall off; the counters keep counting). */
#define KVEDGE_COLLAB_TRANSITIONS 64
/* Nodes of the master's registry with their own series (the rest fold into _other). */
#define KVEDGE_COLLAB_MAX_NODES 256

typedef struct kvedge_collab_t kvedge_collab_t;

/* The status of a fetch the client cancelled (counted as "CANCELLED"). */
#define KVEDGE_COLLAB_CANCELLED 1

/* One fetch, as it ended. Times are microseconds from its arrival. */
typedef struct {
    int status;        /* 0, or the error that ended it (ECLOSED, cancelled: ECLOSED) */
    double planned_us; /* the plan's T (Eq. 20) */
    uint64_t plan_us;  /* to the plan */
    uint64_t first_us; /* to the first layer with data (0: none came) */
    uint64_t last_us;  /* to the last layer's record */
    uint32_t layers;   /* asked for */
} kvedge_collab_fetch_t;

/* Declares the families in r (which must outlive it). NULL with why on failure. */
kvedge_collab_t *kvedge_collab_new(kvedge_metrics_t *r, char *why, size_t why_len);
void kvedge_collab_destroy(kvedge_collab_t **self_p);

/* Off: layers, fetches and requests are no longer recorded (monitoring off); sources,
 * transitions and the live gauges still are. On by default. */
void kvedge_collab_set_recording(kvedge_collab_t *c, bool on);

/* Source i (the proxy's table index, < KVEDGE_PROXY_MAX_SOURCES) was added. */
void kvedge_collab_source(kvedge_collab_t *c, int i, const char *name, kvedge_plan_kind_t kind);

/* A source changed health state (0 up, 1 suspect, 2 down), with the reason. */
void kvedge_collab_transition(kvedge_collab_t *c, const char *name, int from, int to,
                              const char *reason);

/* One layer reported to a client: delivered from proxy source src (>= 0) with bytes, or not
 * (src -1), with its delivery reason (kvedge_fetch_reason_t). */
void kvedge_collab_layer(kvedge_collab_t *c, int src, kvedge_plan_kind_t kind, int reason,
                         uint64_t bytes);

/* One of the layers kvedge_collab_layer recorded was a mapped model's layer standing in for
 * the requested one (large-small): kvedge_proxy_mapped_layers_total. */
void kvedge_collab_mapped(kvedge_collab_t *c);

/* One fetch ended. */
void kvedge_collab_fetch(kvedge_collab_t *c, const kvedge_collab_fetch_t *f);

/* One client request (any opcode), by opcode, as it was answered or accepted. */
void kvedge_collab_request(kvedge_collab_t *c, int op, int status);

/* Adds "sources_total", "layers", "fetch", "transitions" to obj (the rest of the proxy's
 * document comes from proxy.c, which knows the live table). Returns 0 or -1. */
int kvedge_collab_json(kvedge_collab_t *c, cJSON *obj);

/* The families the proxy sets at scrape time from its live state. */
typedef struct {
    kvedge_metric_t *up, *state, *rtt, *rto, *bw, *node_alive, *sync_missing, *sync_age;
    kvedge_series_t *buffered, *fetches_open, *master_synced, *registry_nodes;
} kvedge_collab_gauges_t;
const kvedge_collab_gauges_t *kvedge_collab_gauges(kvedge_collab_t *c);

#ifdef __cplusplus
}
#endif
#endif
