/* Held credit: a stream's consumer that cannot take a block yet keeps it and holds back its
 * credit, so the node sends no more than the credit it holds, and gives the credit back once
 * it has taken the block. For the loader in libkvedge (clients/lib/pipeline.c): not
 * installed, not exported from libkvedge.so. */
#ifndef KVEDGE_ACCESS_CLIENT_CREDIT_H
#define KVEDGE_ACCESS_CLIENT_CREDIT_H

#include <stdint.h>

#include "access/client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Inside the on_block callback of an asynchronous stream (GET_LAYER or FETCH, which run on the
 * client's I/O thread): the message being delivered is not owed back to the node when the
 * callback returns; its credit is held until kvedge_client_credit_return gives it back.
 * Returns the stream's id for that, or 0 (nothing held) outside such a callback, or in the
 * callback of a synchronous stream run on its caller's thread. A packed message (several
 * blocks, docs/protocol.md "Packed data messages") has one credit: the first hold among its
 * blocks' callbacks holds it, later ones in the same message return 0. */
uint64_t kvedge_client_credit_hold(void);

/* Gives back n credits held on stream (kvedge_client_credit_hold's id): the I/O thread grants
 * them to the node in its next CREDIT. A stream that has ended meanwhile ignores them. Any
 * thread may call it, a callback on the I/O thread too (it only queues).
 * Errors: KVEDGE_EINVAL (NULL client, stream 0, n 0 or above KVEDGE_WIRE_MAX_CREDIT),
 * KVEDGE_ENOMEM, KVEDGE_ECLOSED (the client is closing), KVEDGE_EBACKLOG (the I/O thread is far
 * behind: try again), KVEDGE_ETIMEDOUT. */
int kvedge_client_credit_return(kvedge_client_t *c, uint64_t stream, uint32_t n);

#ifdef __cplusplus
}
#endif
#endif
