/* The store node: serves the wire protocol (docs/protocol.md) from a block engine over a
 * ZeroMQ ROUTER socket, with CURVE and a ZAP allowlist, a worker pool, and credit-based
 * GET_LAYER streams. One frontend thread owns the socket; workers do the engine work; no
 * client can make a worker wait for it. */
#ifndef KVEDGE_STORE_NODE_SERVER_H
#define KVEDGE_STORE_NODE_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "access/frame.h"
#include "access/transport.h"
#include "store/engine/engine.h"
#include "store/node/analyzer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_SERVER_CREDIT_DEFAULT 8
#define KVEDGE_SERVER_DRAIN_MS       5000 /* how long shutdown waits for in-flight work */
#define KVEDGE_SERVER_JOB_QUEUE      4096 /* queued jobs before the node answers EBUSY */

typedef struct kvedge_server_t kvedge_server_t;

typedef struct {
    kvedge_role_t role;
    const char *name;        /* node name in HELLO; NULL = "kvedge" */
    const char *bind;        /* ZeroMQ endpoint, e.g. tcp://0.0.0.0:7400 or tcp://127.0.0.1:* */
    bool insecure;           /* plaintext: refused unless bind is loopback or ipc */
    const char *cert;        /* the node's secret certificate file (czmq format) */
    const char *clients_dir; /* allowlist: public certificates of the clients let in */
    int workers;             /* 0 = one per online core, at least 2 */
    uint32_t default_credit; /* advertised in HELLO; 0 = default */
    kvedge_engine_t *engine; /* not owned; must outlive the server */
    /* The I/O Analyzer to record into (NULL: none), with n_workers + 1 shards. Not owned. */
    kvedge_analyzer_t *analyzer;
    /* MONITOR: returns the node's document (malloc'd JSON, *len its length) or NULL when out
     * of memory; called on the frontend thread. NULL: MONITOR is answered EPROTO. */
    char *(*monitor)(void *arg, uint32_t top, size_t *len);
    void *monitor_arg;
    /* GET and GET_LAYER with an accept list: do not derive a precision that is not held
     * (default: derive), and keep what was derived as a variant (default: no). */
    bool no_derive;
    bool keep_derived;
    /* Answer a GET_LAYER that asks for packed data messages (its pack frame) with
     * KVEDGE_EPROTO, as a node from before packing does (default: pack). */
    bool no_pack;
} kvedge_server_opts_t;

/* Worker threads a node with opts->workers = workers runs (0: one per core, at least 2). */
int kvedge_server_workers(int workers);

/* Starts the node: ZAP handler first (CURVE), then the socket is bound, then the workers.
 * Returns once it serves. why (if not NULL) receives a reason on failure.
 * Errors: KVEDGE_EINVAL, KVEDGE_EDENIED (plaintext on a non-loopback endpoint, or CURVE
 * unavailable), KVEDGE_EIO (bind failed, the endpoint's or the node's internal job queue's;
 * unreadable certificate), KVEDGE_ENOMEM. */
int kvedge_server_start(const kvedge_server_opts_t *opts, kvedge_server_t **out, char *why,
                        size_t why_len);

/* The endpoint actually bound (ephemeral ports resolved). Valid until destroy. */
const char *kvedge_server_endpoint(kvedge_server_t *s);

/* CURVE handshakes the node's ZAP handler refused since start (0 when plaintext). */
uint64_t kvedge_server_denials(kvedge_server_t *s);

/* Blocks derived at a precision a reader asked for since start, and how many of them were
 * kept as variants (keep_derived). */
void kvedge_server_derived(kvedge_server_t *s, uint64_t *derived, uint64_t *kept);

/* The inproc endpoint between the node's frontend and its workers (the job queue). Every node
 * of a process gets its own, never reused by a later one (a closed node's names stay taken
 * until libzmq's reaper releases them). For tests and diagnostics; valid until destroy. */
const char *kvedge_server_jobs_endpoint(kvedge_server_t *s);

/* The node's public key (Z85, 40 chars), or NULL when plaintext. */
const char *kvedge_server_public_key(kvedge_server_t *s);

/* Stops taking requests, lets in-flight work finish (at most KVEDGE_SERVER_DRAIN_MS), stops
 * the workers and closes the socket. Does not close the engine. NULL-safe, idempotent. */
void kvedge_server_destroy(kvedge_server_t **self_p);

#ifdef __cplusplus
}
#endif
#endif
