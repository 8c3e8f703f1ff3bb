/* Error codes shared by every kvedge module: 0 is success, failures are negative. */
#ifndef KVEDGE_STORE_ERROR_H
#define KVEDGE_STORE_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message). Values are stable: they travel in wire status fields and exit
 * paths, so new codes are appended, never renumbered. */
#define KVEDGE_ERRNO_MAP(X)                                                                        \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(ENOTFOUND, -3, "not found")                                                                  \
    X(ECORRUPT, -4, "data is corrupt (checksum or structure check failed)")                        \
    X(EVERSION, -5, "unsupported format version")                                                  \
    X(ETOOBIG, -6, "size exceeds a hard limit")                                                    \
    X(ETRUNCATED, -7, "data is truncated")                                                         \
    X(EIO, -8, "input/output error")                                                               \
    X(EBUSY, -9, "resource is locked by another process")                                          \
    X(EFULL, -10, "capacity exhausted (everything left is pinned)")                                \
    X(ENOMODEL, -11, "unknown model")                                                              \
    X(ESHAPE, -12, "block does not match the model shape")                                         \
    X(ESTORE, -13, "storage engine error")                                                         \
    X(ENOSPACE, -14, "output buffer too small")                                                    \
    X(EEXPIRED, -15, "entry expired")                                                              \
    X(EREADONLY, -16, "store is open read-only")                                                   \
    X(EAMBIGUOUS, -17, "prefix matches more than one entry")                                       \
    X(EPROTO, -18, "malformed protocol message")                                                   \
    X(ETIMEDOUT, -19, "deadline passed")                                                           \
    X(EDENIED, -20, "not allowed")                                                                 \
    X(ECLOSED, -21, "peer is shutting down or gone")                                               \
    X(ECANCELED, -22, "cancelled")                                                                 \
    X(ENOSPC, -23, "no space left on the store's disk")

typedef enum {
#define KVEDGE_ERR_ENUM(name, value, msg) KVEDGE_##name = (value),
    KVEDGE_ERRNO_MAP(KVEDGE_ERR_ENUM)
#undef KVEDGE_ERR_ENUM
} kvedge_err_t;

/* Human-readable text for an error code; never NULL, static storage. */
const char *kvedge_strerror(int err);

/* Symbolic name ("KVEDGE_ECORRUPT") for an error code; never NULL, static storage. */
const char *kvedge_errname(int err);

#ifdef __cplusplus
}
#endif
#endif
