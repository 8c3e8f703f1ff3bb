/* The cloud tier as a Storage Master's registry describes it, for the commands that write to
 * the placement (`kvedge prefill --master EP` without -H): the node/ records of role cloud,
 * their capacity as the placement's weight, their health/ record as up or not. */
#ifndef KVEDGE_CLIENTS_CLI_PLACE_H
#define KVEDGE_CLIENTS_CLI_PLACE_H

#include <stddef.h>

#include "clients/lib/placed.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where the registry is read. */
typedef struct {
    const char *cmd;    /* the command, for messages */
    const char *master; /* ROUTER endpoint */
    const char *pub;    /* PUB endpoint; NULL: PORT+1 of a tcp master */
    const char *key;    /* the master's public key or certificate; NULL: plaintext */
    const char *cert;   /* this client's secret certificate (with key) */
    int deadline_ms;    /* for the snapshot */
} kvedge_cli_tier_src_t;

/* The tier: every cloud node of the registry (at most KVEDGE_PLACED_MAX_NODES), up when its
 * health is up or suspect (down, or no health record while other nodes have one: not up), its
 * weight its registered capacity. Caller frees *nodes. Prints what went wrong; returns an exit
 * code (0, usage, failure, unavailable: no snapshot from the master). */
int kvedge_cli_tier_read(const kvedge_cli_tier_src_t *src, kvedge_placed_node_t **nodes, size_t *n);

/* Prints why nodes[0 .. n-1] give no placement (no cloud node, none up, no capacity) as an
 * error, the message naming what to fix. */
void kvedge_cli_tier_explain(const char *cmd, const kvedge_placed_node_t *nodes, size_t n);

#ifdef __cplusplus
}
#endif
#endif
