/* Internal to the edge proxy: the state its three files share (proxy.c the actor, fetch.c the
 * FETCH state machine, sources.c the sources table and prober) and the calls between them. Not
 * installed and not for callers of proxy/proxy.h. */
#ifndef KVEDGE_PROXY_PROXY_IMPL_H
#define KVEDGE_PROXY_PROXY_IMPL_H

#include <czmq.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/client.h"
#include "access/frame.h"
#include "runtime/kvmsg.h"
#include "runtime/mview.h"
#include "runtime/secure.h"
#include "monitor/http.h"
#include "monitor/metrics.h"
#include "proxy/collab.h"
#include "proxy/health.h"
#include "proxy/negcache.h"
#include "proxy/proxy.h"
#include "proxy/quality.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One entry of the sources table. Entries are only ever appended (nsrc grows under srcs_mu),
 * so an index stays valid for the proxy's life. */
typedef struct {
    kvedge_proxy_source_t conf;
    bool from_master; /* discovered in the master's node list */
    /* Why the prober cannot reach it, when a flag would fix it (shown as its last error in
     * the `sources` view); "" otherwise (under srcs_mu). */
    char hint[320];
    kvedge_client_t *client; /* set once by the prober (under srcs_mu), never replaced */
    double ratio;            /* learned wire bytes per fp16 byte (actor only) */
    double bw_est;           /* throughput measured over whole fetches (under srcs_mu) */
    uint64_t bw_samples;
    uint64_t last_publish_ms; /* prober: last link record sent */
    /* History sources: the lag of their historical cache, read from their MONITOR document by
     * the prober (under srcs_mu). */
    uint64_t history_polled_ms;
    bool history_known;
    double history_missing, history_age_s, history_blocks;
    char history_state[16];
} kvedge_proxy_impl_src_t;

/* A block or an end of stream from an upstream client's I/O thread; defined in fetch.c. */
typedef struct kvedge_proxy_impl_event_t kvedge_proxy_impl_event_t;
/* A LOOKUP a FETCH asks of a source, queued for the asker thread; defined in sources.c. */
typedef struct kvedge_proxy_impl_ask_t kvedge_proxy_impl_ask_t;

/* The proxy's state. Owned by kvedge_proxy_t; freed after the actor and the prober stopped. */
typedef struct {
    /* Shared by every thread. */
    kvedge_proxy_opts_t opts;
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    char *cert_path, *master_key;
    /* The tenant source nodes file this proxy under (from its certificate), whose own model
     * records (tmodel/<tag>/<id>) it plans with; none without a certificate. */
    uint8_t tenant_tag[16];
    bool has_tenant;
    pthread_mutex_t srcs_mu;
    kvedge_proxy_impl_src_t src[KVEDGE_PROXY_MAX_SOURCES];
    atomic_size_t nsrc;
    kvedge_health_t *health;
    kvedge_negcache_t *neg;
    /* Quality profiles by model (the cache optimizer), read at start, immutable after. */
    kvedge_quality_profile_t *quality[KVEDGE_PROXY_MAX_QUALITY];
    size_t nquality;
    int64_t quality_warned_ms; /* the last "a rung is unpriced" warning (actor only) */
    kvedge_mview_t *view;
    /* The event queue: libkvedge I/O threads -> actor. */
    pthread_mutex_t ev_mu;
    kvedge_proxy_impl_event_t *ev_head, *ev_tail;
    int ev_fd;
    /* Prober thread, and the asker thread that runs FETCH's LOOKUPs (its queue and the stop
     * flag under stop_mu, both woken by stop_cv). */
    pthread_t prober, asker;
    bool prober_started, asker_started;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    bool stop;
    kvedge_proxy_impl_ask_t *ask_head, *ask_tail;
    /* Actor only. */
    kvedge_secure_router_t sec;
    zlistx_t *fetches; /* fetch.c's fetches in progress, owned */
    zlistx_t *parked;  /* fetch.c's FETCHes waiting for their model (MODEL_WAIT_MS), owned */
    uint64_t next_serial;
    uint64_t buffered; /* block bytes held */
    pthread_mutex_t stats_mu;
    kvedge_proxy_stats_t stats;
    int start_rc;
    char start_why[512];
    struct kvedge_proxy_t *owner;
    /* Monitoring (proxy_monitor.c). */
    uint64_t start_mono_ms, start_wall_ms;
    kvedge_metrics_t *metrics;
    kvedge_collab_t *collab; /* NULL when no_monitor */
    kvedge_http_t *http;
    atomic_size_t fetches_open;
    atomic_uint_fast64_t buffered_now; /* buffered, published for the scrape */
    kvedge_series_t *denials;          /* refused handshakes, mirrored at each scrape */
    uint64_t denials_seen;
} kvedge_proxy_impl_t;

/* ---------------------------------------------------------------- proxy.c: replies */

/* A reply's header frame. Caller owns the return value (NULL when out of memory). */
zframe_t *kvedge_proxy_impl_header(uint8_t op, uint16_t flags, uint64_t id, int32_t status,
                                   uint32_t count);

/* Sends *m to the client at route on the ROUTER (actor only). Takes ownership of *m and nulls
 * it; a message the client cannot take is dropped. */
void kvedge_proxy_impl_send(kvedge_proxy_impl_t *p, zframe_t *route, zmsg_t **m);

/* Sends a header-only error reply, with END when op is a stream (actor only). */
void kvedge_proxy_impl_reply_error(kvedge_proxy_impl_t *p, zframe_t *route, uint8_t op, uint64_t id,
                                   int32_t status);

/* ---------------------------------------------------------------- fetch.c: FETCH */

/* Starts a FETCH whose frames kvedge_wire_validate accepted (n of them); answers an error
 * when the model, the shape or memory is wanting. Actor only; does not take route. */
void kvedge_proxy_impl_fetch_start(kvedge_proxy_impl_t *p, zframe_t *route,
                                   const kvedge_wire_header_t *h, const kvedge_wire_frame_t *pf,
                                   size_t n);

/* CREDIT for the client's fetch rid: adds it and sends what it now covers. Unknown: ignored. */
void kvedge_proxy_impl_fetch_credit(kvedge_proxy_impl_t *p, zframe_t *route, uint64_t rid,
                                    uint32_t credit);

/* CANCEL: ends the client's fetch rid with an END (KVEDGE_ECANCELED, the data messages sent);
 * what was not sent is dropped. Unknown: ignored. */
void kvedge_proxy_impl_fetch_cancel(kvedge_proxy_impl_t *p, zframe_t *route, uint64_t rid);

/* The answer to a LOOKUP that fetch serial asked of its request-local source `local`
 * (kvedge_proxy_impl_ask): status, and how many leading chunks of the chain the source holds
 * whole. Queued for the actor like an upstream event. Any thread. */
void kvedge_proxy_impl_fetch_asked(kvedge_proxy_impl_t *p, uint64_t serial, int local, int status,
                                   uint32_t hit);

/* Handles every queued upstream event (ev_fd was readable). Actor only. */
void kvedge_proxy_impl_fetch_events(kvedge_proxy_impl_t *p);

/* Reports layers past their deadline as misses, drops fetches long past it, starts fetches whose
 * LOOKUPs took too long. Actor only; called every tick. */
void kvedge_proxy_impl_fetch_deadlines(kvedge_proxy_impl_t *p);

/* Shutdown: ends every open fetch with KVEDGE_ECLOSED and frees it. Actor only. */
void kvedge_proxy_impl_fetch_close_all(kvedge_proxy_impl_t *p);

/* Frees events still queued; only once no upstream client is left to queue more. */
void kvedge_proxy_impl_events_free(kvedge_proxy_impl_t *p);

/* ---------------------------------------------------------------- proxy_monitor.c */

/* Makes the registry, the Collaboration Monitor (unless no_monitor) and the collector.
 * Returns 0 or KVEDGE_ENOMEM. */
int kvedge_proxy_impl_monitor_open(kvedge_proxy_impl_t *p, char *why, size_t why_len);
/* Starts the HTTP endpoint (unless off). Errors: those of kvedge_http_start. */
int kvedge_proxy_impl_monitor_serve(kvedge_proxy_impl_t *p, char *why, size_t why_len);
/* Stops the endpoint; frees the monitor and the registry. */
void kvedge_proxy_impl_monitor_close(kvedge_proxy_impl_t *p);
/* Answers MONITOR with the proxy's document (actor only). */
void kvedge_proxy_impl_monitor_reply(kvedge_proxy_impl_t *p, zframe_t *route,
                                     const kvedge_wire_header_t *h, const kvedge_wire_frame_t *pf);
/* Prober: reads the historical cache's lag from history sources due for it. */
void kvedge_proxy_impl_monitor_poll_history(kvedge_proxy_impl_t *p);

/* ---------------------------------------------------------------- sources.c: sources */

/* Appends a source to the table and to health; from_master: found in the master's registry
 * (the `sources` view's origin), else given at start. Returns its index, or -1 when it is
 * full. */
int kvedge_proxy_impl_src_add(kvedge_proxy_impl_t *p, const kvedge_proxy_source_t *conf,
                              bool from_master);

/* The link the planner prices source s at (c: its client, or NULL): measured, else the
 * master's link record, else declared, else the defaults. Any thread. */
void kvedge_proxy_impl_src_link(kvedge_proxy_impl_t *p, kvedge_proxy_impl_src_t *s,
                                kvedge_client_t *c, double *bw, double *rtt);

/* Folds a throughput sample (bytes/s over one fetch) into source i's bandwidth estimate. */
void kvedge_proxy_impl_src_learn_bw(kvedge_proxy_impl_t *p, int i, double bw);

/* Sources connected and usable now. */
size_t kvedge_proxy_impl_src_usable(kvedge_proxy_impl_t *p);

/* Destroys every source's client; after the prober stopped. Their callbacks may still have
 * queued events: free those after. */
void kvedge_proxy_impl_src_close(kvedge_proxy_impl_t *p);

/* Starts the prober thread (connects, pings, discovers, publishes links every
 * KVEDGE_PROXY_PROBE_MS) and the asker thread. Returns 0 or KVEDGE_ENOMEM. */
int kvedge_proxy_impl_prober_start(kvedge_proxy_impl_t *p);

/* Stops and joins the prober and the asker, if started, and drops the asks still queued.
 * Idempotent. */
void kvedge_proxy_impl_prober_stop(kvedge_proxy_impl_t *p);

/* Queues a LOOKUP of chain (n ids, copied) on proxy source src for fetch serial, whose
 * request-local index of the source is local; the asker thread runs it (the source's client
 * deadline bounds it) and answers with kvedge_proxy_impl_fetch_asked. Any thread. Returns 0,
 * KVEDGE_ENOMEM or KVEDGE_ECLOSED (stopping). */
int kvedge_proxy_impl_ask(kvedge_proxy_impl_t *p, uint64_t serial, int src, int local,
                          const kvedge_chunk_id_t *chain, uint32_t n);

/* ---------------------------------------------------------------- layermaps.c */

/* The layer map map/<cloud>/<edge> of the master's registry, when it can be trusted: its layer
 * counts equal the two models' (built in, else their master records) and every from[] entry is
 * a cloud layer of the model or KVEDGE_MASTER_MAP_NONE. A map refused is logged (warn, once per
 * key per 10 minutes: "ignoring layer map ... those layers are computed locally") and *out
 * zeroed. A MAPPED FETCH (fetch.c) plans with it: edge layer e may be served by the cloud
 * model's layer from[e] (docs/largesmall.md, "Serving: the proxy"). Any thread. Errors:
 * KVEDGE_EINVAL (NULL, ids that are not registry model ids), KVEDGE_ENOTFOUND (no such map,
 * or no view; not logged), KVEDGE_EPROTO (a map refused). */
/* A model's shape as the proxy plans it: built in, else the record the proxy's tenant
 * registered (tmodel/<tag>/<id>), else the node-wide one (model/<id>), as a node resolves it
 * for that tenant. Returns 0 or KVEDGE_ENOMODEL. */
int kvedge_proxy_impl_model(kvedge_proxy_impl_t *p, const char *id, kvedge_model_t *out);
int kvedge_proxy_impl_map(kvedge_proxy_impl_t *p, const char *cloud, const char *edge,
                          kvedge_master_map_t *out);

/* Logs (warn, once per pair of models per 10 minutes) that a MAPPED FETCH of edge with the
 * mapped model cloud found no usable map, and why. Any thread. */
void kvedge_proxy_impl_map_unusable(const char *cloud, const char *edge, const char *why);

/* The quality profile of a model, or NULL (proxy.c). */
const kvedge_quality_profile_t *kvedge_proxy_impl_quality(const kvedge_proxy_impl_t *p,
                                                          const char *model);

/* Why the master's view may not be heard, with the flag that fixes it ("; ..."), or ""
 * (proxy.c). */
void kvedge_proxy_impl_master_hint(kvedge_proxy_impl_t *p, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
