/* What libkvedge's own parts (the loader, clients/lib/pipeline.c) and access/'s users that
 * speak czmq (the edge proxy) get beyond the public client API. Not installed; libkvedge does
 * not export it. */
#ifndef KVEDGE_ACCESS_CLIENT_INTERNAL_H
#define KVEDGE_ACCESS_CLIENT_INTERNAL_H

#include <czmq.h>
#include <stddef.h>

#include "access/client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kvedge_client_block_take as the czmq frame that holds the bytes: the caller owns it and may
 * forward it as it is (zmsg_append gives it away) or destroy it (zframe_destroy). */
zframe_t *kvedge_client_block_take_frame(void);

/* The smallest layout of each public struct that grows (its `size` field first) that the
 * library accepts: the first with a size field, today's. When a field is appended, these stay
 * and the tail an older caller's struct lacks takes its default (kvedge_abi_read). The
 * loader's, KVEDGE_PIPELINE_OPTS_SIZE_MIN, is in clients/lib/pipeline.c. */
#define KVEDGE_CLIENT_OPTS_SIZE_MIN sizeof(kvedge_client_opts_t)
#define KVEDGE_FETCH_REQ_SIZE_MIN   sizeof(kvedge_fetch_req_t)

/* Reads a caller's struct that starts with `size_t size` (sizeof the struct as the caller
 * compiled it) into dst, which holds the library's layout (dst_size bytes) already filled with
 * the defaults: the caller's first `size` bytes replace them, so fields the caller's layout
 * lacks keep their defaults; dst's size becomes dst_size. KVEDGE_EINVAL, with a message for
 * kvedge_client_last_error naming `type`, when src is NULL or its size is below min_size (0:
 * not set; call the _default function or set it to sizeof) or above dst_size (built against
 * newer headers than this library). */
int kvedge_abi_read(void *dst, size_t dst_size, const void *src, size_t min_size, const char *type);

/* Sets this thread's kvedge_client_last_error message (printf-style) for a failure of another
 * part of the library (the pipelined loader); returns rc. */
int kvedge_client__say(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
