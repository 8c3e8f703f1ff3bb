/* Error codes shared by every kvedge module: 0 is success, failures are negative. */
#ifndef KVEDGE_STORE_ERROR_H
#define KVEDGE_STORE_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes live in a range of their own, KVEDGE_ERR_BASE - 1 down to KVEDGE_ERR_BASE - 99
 * (-30701 ... -30799), that never reads as a -errno value (Linux's errno values stay below 4096),
 * as LMDB does with its -30600 range: a caller that mixes kvedge codes with -errno can tell
 * them apart. 0 is success.
 *
 * X(name, n, message): KVEDGE_<name> = KVEDGE_ERR_BASE - n (n >= 1; OK is 0). n is the code's
 * number on the wire: a status field carries -n (docs/protocol.md, "Status codes"), so the wire
 * protocol keeps its values and the library maps at the boundary. Numbers are stable: new codes
 * are appended, never renumbered. */
#define KVEDGE_ERR_BASE (-30700)

#define KVEDGE_ERRNO_MAP(X)                                                                        \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, 1, "invalid argument")                                                               \
    X(ENOMEM, 2, "out of memory")                                                                  \
    X(ENOTFOUND, 3, "not found")                                                                   \
    X(ECORRUPT, 4, "data is corrupt (checksum or structure check failed)")                         \
    X(EVERSION, 5, "unsupported format version")                                                   \
    X(ETOOBIG, 6, "size exceeds a hard limit")                                                     \
    X(ETRUNCATED, 7, "data is truncated")                                                          \
    X(EIO, 8, "input/output error")                                                                \
    X(EBUSY, 9, "node is overloaded: retry later")                                                 \
    X(EFULL, 10, "capacity exhausted (everything left is pinned)")                                 \
    X(ENOMODEL, 11, "unknown model")                                                               \
    X(ESHAPE, 12, "block does not match the model shape")                                          \
    X(ESTORE, 13, "storage engine error")                                                          \
    X(ENOSPACE, 14, "output buffer too small")                                                     \
    X(EEXPIRED, 15, "entry expired")                                                               \
    X(EREADONLY, 16, "store is open read-only")                                                    \
    X(EAMBIGUOUS, 17, "prefix matches more than one entry")                                        \
    X(EPROTO, 18, "malformed protocol message")                                                    \
    X(ETIMEDOUT, 19, "deadline passed")                                                            \
    X(EDENIED, 20, "not allowed")                                                                  \
    X(ECLOSED, 21, "peer is shutting down or gone")                                                \
    X(ECANCELED, 22, "cancelled")                                                                  \
    X(ENOSPC, 23, "no space left on the store's disk")                                             \
    X(ELOCKED, 24, "in use by another process (a store's lock or a listening address)")            \
    X(EBACKLOG, 25, "too many requests queued behind a busy thread: retry later")                  \
    X(ENOTLEADER, 26, "not the leading master (a standby, or no etcd quorum): ask the leader")     \
    X(ENOBASIS, 27, "no coding basis for this model is loaded")

/* How many codes KVEDGE_ERRNO_MAP has, OK included: n runs 0 ... KVEDGE_ERR_COUNT - 1. */
#define KVEDGE_ERR_COUNT 28

typedef enum {
#define KVEDGE_ERR_ENUM(name, n, msg) KVEDGE_##name = ((n) ? KVEDGE_ERR_BASE - (n) : 0),
    KVEDGE_ERRNO_MAP(KVEDGE_ERR_ENUM)
#undef KVEDGE_ERR_ENUM
} kvedge_err_t;

/* Human-readable text for an error code; never NULL, static storage. A value that is no
 * KVEDGE_E* code (a -errno, say) gives "unknown error (not a kvedge error code)". */
const char *kvedge_strerror(int err);

/* Symbolic name ("KVEDGE_ECORRUPT") for an error code; "KVEDGE_EUNKNOWN" for a value that
 * is no KVEDGE_E* code. Never NULL, static storage. */
const char *kvedge_errname(int err);

#ifdef __cplusplus
}
#endif
#endif
