/* Internal to the store node: the assembled node (node.c) and its monitoring (node_monitor.c:
 * the metrics registry, the I/O Analyzer, the HTTP endpoint and the MONITOR document). Not
 * for callers of node.h. */
#ifndef KVEDGE_STORE_NODE_NODE_IMPL_H
#define KVEDGE_STORE_NODE_NODE_IMPL_H

#include <pthread.h>

#include "runtime/mview.h"
#include "monitor/http.h"
#include "monitor/metrics.h"
#include "store/node/analyzer.h"
#include "store/node/dirpub.h"
#include "store/node/hsync.h"
#include "store/node/mover.h"
#include "store/node/node.h"
#include "store/node/optimizer.h"
#include "store/node/server.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvedge_node_t {
    kvedge_node_settings_t s; /* a copy; defaults resolved (cert, clients) */
    char cert_secret[KVEDGE_NODE_PATH_BYTES + 16];
    kvedge_engine_t *engine;
    kvedge_server_t *server;
    kvedge_hsync_sched_t *sched; /* NULL unless subscriptions were given and loaded */
    kvedge_mview_t *view;        /* NULL unless joined to a master */
    kvedge_dirpub_t *dirpub;
    kvedge_optimizer_t *optimizer; /* NULL unless the `optimize` setting is on */
    kvedge_mover_t *mover;         /* NULL unless a cloud node joined to a master */
    /* Monitoring (node_monitor.c). */
    uint64_t start_wall_ms, start_mono_ms;
    kvedge_metrics_t *metrics;   /* always made: the endpoint and MONITOR read it */
    kvedge_analyzer_t *analyzer; /* NULL when the `monitor` setting is off */
    kvedge_http_t *http;         /* NULL when `metrics` is off */
    struct kvedge_node_mon_t *mon;
};

/* Makes the registry, its collectors and (unless monitoring is off) the analyzer, before the
 * server starts (the server records into it). Returns 0, KVEDGE_ENOMEM. */
int kvedge_node_monitor_open(kvedge_node_t *n, char *why, size_t why_len);

/* Starts the HTTP endpoint once everything else runs (unless `metrics` is off). Errors:
 * those of kvedge_http_start (KVEDGE_EIO: the address cannot be bound). */
int kvedge_node_monitor_serve(kvedge_node_t *n, char *why, size_t why_len);

/* Stops the endpoint and frees the analyzer and the registry; after the server stopped. */
void kvedge_node_monitor_close(kvedge_node_t *n);

/* The MONITOR document (server.h's monitor callback; arg is the node). */
char *kvedge_node_monitor_doc(void *arg, uint32_t top, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
