/* The placed writer (<kvedge/placed.h>): puts one context to the R cloud nodes its placement
 * names (weighted rendezvous hashing on the context's root chunk id, the first chunk of its
 * chain, weighted by each node's registered capacity: every client computes the same R nodes)
 * and acknowledges a write when W of them acknowledged every block. The caller gives the tier
 * (the node records it read from the Storage Master, or any list); the writer connects to the
 * placed nodes, registers models and puts blocks on every replica at once (one thread per
 * replica per call), and says per replica what happened. A replica that failed once is left
 * out of later calls; the write stands while W replicas still have every block. */
#ifndef KVEDGE_CLIENTS_PLACED_H
#define KVEDGE_CLIENTS_PLACED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/client.h"
#include "access/codec/chunk.h"
#include "access/codec/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_PLACED_MAX_NODES        4096 /* nodes one placement considers */
#define KVEDGE_PLACED_MAX_REPLICAS     16   /* R at most */
#define KVEDGE_PLACED_REPLICAS_DEFAULT 2    /* R when the caller leaves it 0 (fewer nodes: all) */
#define KVEDGE_PLACED_ID_BYTES         65   /* a node id (1 ... 64 bytes) and its NUL */
#define KVEDGE_PLACED_ENDPOINT_BYTES   256
#define KVEDGE_PLACED_KEY_BYTES        256
#define KVEDGE_PLACED_ERROR_BYTES      256

/* One node of the tier, as its registry record says. */
typedef struct {
    char id[KVEDGE_PLACED_ID_BYTES];             /* its registry id (node/<id>) */
    char endpoint[KVEDGE_PLACED_ENDPOINT_BYTES]; /* where clients reach it */
    char server_key[KVEDGE_PLACED_KEY_BYTES];    /* Z85 public key or a certificate path;
                                                  * "" = plaintext */
    uint64_t weight;                             /* its capacity in bytes; 0: never placed */
    bool up;                                     /* false: never placed */
} kvedge_placed_node_t;

/* How to write. Fill with kvedge_placed_opts_default (it sets size). */
typedef struct {
    size_t size;             /* sizeof(kvedge_placed_opts_t): kvedge_placed_opts_default */
    uint32_t replicas;       /* R asked, 1 ... KVEDGE_PLACED_MAX_REPLICAS; 0 = the default
                              * (2); fewer usable nodes than R: as many as there are */
    uint32_t write_quorum;   /* W: replicas that must have every block; 0 = every replica
                              * placed; more than R asked: KVEDGE_EINVAL */
    const char *client_cert; /* this client's secret certificate, for nodes with a key */
    int deadline_ms;         /* each call on each replica; 0 = the client's default */
    const char *name;        /* sent in HELLO; NULL = "libkvedge" */
} kvedge_placed_opts_t;

/* What one replica did. */
typedef struct {
    char id[KVEDGE_PLACED_ID_BYTES];
    char endpoint[KVEDGE_PLACED_ENDPOINT_BYTES];
    bool connected; /* kvedge_placed_connect reached it */
    int status;     /* 0: every call so far succeeded; else the first failure's code */
    uint64_t items; /* blocks it acknowledged */
    char error[KVEDGE_PLACED_ERROR_BYTES]; /* the client's message for that failure, or "" */
} kvedge_placed_replica_t;

typedef struct kvedge_placed_t kvedge_placed_t;

/* Fills *opts with the defaults (R 2, W every replica, no certificate, the client's deadline)
 * and its size. Never fails; NULL does nothing. */
void kvedge_placed_opts_default(kvedge_placed_opts_t *opts);

/* The placement of the context whose root chunk id is key over nodes[0 .. n-1] (copied): the
 * first R up nodes of weight > 0 by descending score (access/placement.h's rule). Connects to
 * nothing. Caller owns *out. Errors: KVEDGE_EINVAL (NULL, a size not set, R or W out of range,
 * W > R, n > KVEDGE_PLACED_MAX_NODES, a node without an id or endpoint), KVEDGE_ENOTFOUND (no
 * node is up with a weight, or fewer than W are, kvedge_placed_usable: the write could never
 * be acknowledged), KVEDGE_ENOMEM. */
int kvedge_placed_new(const kvedge_placed_opts_t *opts, const kvedge_placed_node_t *nodes, size_t n,
                      const kvedge_chunk_id_t *key, kvedge_placed_t **out);

/* How many of nodes[0 .. n-1] a placement may name: up, with a weight. 0 for NULL. */
size_t kvedge_placed_usable(const kvedge_placed_node_t *nodes, size_t n);

/* Closes the replicas' clients, frees. NULL-safe, idempotent, nulls *self_p. */
void kvedge_placed_destroy(kvedge_placed_t **self_p);

/* R asked (after the default), R placed (min(R asked, usable nodes)), W (after its default:
 * R placed when 0), and replicas that have every block so far. 0 for a NULL writer. */
uint32_t kvedge_placed_asked(const kvedge_placed_t *pw);
uint32_t kvedge_placed_count(const kvedge_placed_t *pw);
uint32_t kvedge_placed_quorum(const kvedge_placed_t *pw);
uint32_t kvedge_placed_acked(const kvedge_placed_t *pw);

/* Copies replica i (0 ... kvedge_placed_count - 1, in placement order) into *out. Errors:
 * KVEDGE_EINVAL (NULL, i out of range). */
int kvedge_placed_replica(const kvedge_placed_t *pw, uint32_t i, kvedge_placed_replica_t *out);

/* Copies the placement key (the root chunk id the writer was made for). Errors: KVEDGE_EINVAL. */
int kvedge_placed_key(const kvedge_placed_t *pw, kvedge_chunk_id_t *out);

/* Replica i's client, owned by the writer (valid until kvedge_placed_destroy), for calls the
 * writer does not make; NULL when it is not connected, has failed, or i is out of range. */
kvedge_client_t *kvedge_placed_client(kvedge_placed_t *pw, uint32_t i);

/* Connects to every placed node at once (kvedge_client_connect with each node's key), each
 * within the deadline. A replica that cannot be reached is marked failed. Returns 0 when at
 * least W replicas are connected, else the first failure's code (KVEDGE_ETIMEDOUT for a node
 * that is down, ...). Calling it again connects nothing more. Errors: KVEDGE_EINVAL too. */
int kvedge_placed_connect(kvedge_placed_t *pw);

/* kvedge_client_put_model on every replica that has not failed, at once. Returns 0 when at
 * least W replicas have succeeded every call so far, else the first failure's code. */
int kvedge_placed_put_model(kvedge_placed_t *pw, const kvedge_model_t *model);

/* kvedge_client_put of the same n items on every replica that has not failed, at once (the
 * caller keeps its memory). A replica for which any item fails is failed from then on.
 * Returns 0 when at least W replicas have acknowledged every block so far, else the first
 * failure's code (a transport error, or the node's item status: KVEDGE_ENOMODEL, KVEDGE_ENOSPC,
 * ...). Errors: KVEDGE_EINVAL (NULL items with n > 0, not connected). */
int kvedge_placed_put(kvedge_placed_t *pw, const kvedge_put_item_t *items, size_t n);

#ifdef __cplusplus
}
#endif
#endif
