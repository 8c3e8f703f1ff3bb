/* What access/'s users that speak czmq (the edge proxy) get beyond the public client API: the
 * received frame behind a kvedge_block_ref_t. Not installed; libkvedge does not export it. */
#ifndef KVEDGE_ACCESS_CLIENT_FRAME_H
#define KVEDGE_ACCESS_CLIENT_FRAME_H

#include <czmq.h>

#ifdef __cplusplus
extern "C" {
#endif

/* kvedge_client_block_take as the czmq frame that holds the bytes: the caller owns it and may
 * forward it as it is (zmsg_append gives it away) or destroy it (zframe_destroy). */
zframe_t *kvedge_client_block_take_frame(void);

#ifdef __cplusplus
}
#endif
#endif
