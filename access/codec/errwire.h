/* Error codes on the wire: a status field carries -n for the code KVEDGE_ERR_BASE - n
 * (access/codec/error.h), so the protocol keeps its small values while the API's codes stay
 * out of errno's range. Every status that is packed or parsed goes through these two. */
#ifndef KVEDGE_ACCESS_CODEC_ERRWIRE_H
#define KVEDGE_ACCESS_CODEC_ERRWIRE_H

#include <stdint.h>

#include "access/codec/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The wire value of a code: 0 for KVEDGE_OK, -n for KVEDGE_ERR_BASE - n. A value that is no
 * KVEDGE_E* code (a bug that let a -errno through) travels as KVEDGE_EIO's. */
int32_t kvedge_err_to_wire(int err);

/* The code a wire status stands for: 0, or KVEDGE_ERR_BASE - n for -n. A status this library
 * does not know (positive, or a code a newer peer added) is KVEDGE_EPROTO. */
int kvedge_err_from_wire(int32_t status);

/* n of a code (0 for KVEDGE_OK, 1 ... KVEDGE_ERR_COUNT - 1), or -1 for a value that is no
 * KVEDGE_E* code: for tables indexed by code (counters per status). */
int kvedge_err_index(int err);

#ifdef __cplusplus
}
#endif
#endif
