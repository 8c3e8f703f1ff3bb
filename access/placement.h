/* Placement of contexts on a cloud tier of many store nodes: weighted rendezvous hashing
 * (highest random weight). Every node gets a score per placement key from a hash of (key, node
 * id), scaled by the node's weight (its capacity): score = -weight / ln(u), u in (0, 1) from
 * XXH3-64; a key goes to the R nodes with the highest scores. Adding or removing a node moves
 * only the keys whose top R it enters or leaves (about R/N of them), and a node holds a share
 * of the keys proportional to its weight. The key is a context's root chunk id (the first
 * chunk of its chain): every chunk of a chain lands on the same R nodes, so one request
 * streams each layer from one node per replica instead of hopping between nodes per chunk, and
 * different contexts spread over the tier (a hot shared prefix is one key: its replicas, and
 * the edges' own copies, carry it). Pure functions: no I/O, no clocks, no allocation. */
#ifndef KVEDGE_ACCESS_PLACEMENT_H
#define KVEDGE_ACCESS_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/codec/chunk.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVEDGE_PLACE_MAX_NODES        4096 /* nodes one ranking considers; more: KVEDGE_EINVAL */
#define KVEDGE_PLACE_MAX_REPLICAS     16
#define KVEDGE_PLACE_REPLICAS_DEFAULT 2  /* R when the tier has at least two nodes */
#define KVEDGE_PLACE_ID_BYTES         65 /* a node id (1 ... 64 of the master's id charset) + NUL */

typedef struct {
    char id[KVEDGE_PLACE_ID_BYTES]; /* the node's id, as registered (node/<id>) */
    uint64_t weight;                /* its capacity in bytes; 0: never chosen */
    bool up;                        /* false: ranked, but skipped by kvedge_place_pick */
} kvedge_place_node_t;

/* The score of one node for one key (higher wins); 0 for weight 0. Deterministic across
 * processes and machines: every client, node and master computes the same placement. */
double kvedge_place_score(const kvedge_chunk_id_t *key, const char *node_id, uint64_t weight);

/* Writes into order[0 .. n-1] the indexes of nodes[] by descending score for key (ties: the
 * smaller id first). Returns 0, or KVEDGE_EINVAL (NULL, n > KVEDGE_PLACE_MAX_NODES). */
int kvedge_place_rank(const kvedge_chunk_id_t *key, const kvedge_place_node_t *nodes, size_t n,
                      uint32_t *order);

/* The placement: the first r up nodes of weight > 0 in rank order, into out[0 .. *got-1]
 * (indexes into nodes[]). *got < r when fewer nodes qualify (not an error: the caller says how
 * many replicas it got). Returns 0, or KVEDGE_EINVAL (NULL, r = 0 or > KVEDGE_PLACE_MAX_REPLICAS,
 * n > KVEDGE_PLACE_MAX_NODES). */
int kvedge_place_pick(const kvedge_chunk_id_t *key, const kvedge_place_node_t *nodes, size_t n,
                      uint32_t r, uint32_t *out, uint32_t *got);

/* R for a tier of n_up usable nodes when the caller asked for `asked` (0 = the default):
 * min(asked or KVEDGE_PLACE_REPLICAS_DEFAULT, n_up), at least 1. */
uint32_t kvedge_place_replicas(uint32_t asked, size_t n_up);

#ifdef __cplusplus
}
#endif
#endif
