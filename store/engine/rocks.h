/* RocksDB's C API at kvedge's boundary: its char **errptr messages turned into kvedge error
 * codes, in one place for every RocksDB user (the block engine and the Storage Master). */
#ifndef KVEDGE_STORE_ROCKS_H
#define KVEDGE_STORE_ROCKS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Room for a RocksDB message copied out before it is freed (longer ones are truncated). */
#define KVEDGE_ROCKS_MSG_MAX_BYTES 1024

/* Translates the message in *errptr (which must not be NULL) into KVEDGE_ECORRUPT ("Corruption"),
 * KVEDGE_EIO ("IO error") or KVEDGE_ESTORE (anything else); frees it with rocksdb_free and
 * resets *errptr to NULL. */
int kvedge_rocks_error(char **errptr);

/* As kvedge_rocks_error, copying the message first into msg (may be NULL) as a C string. */
int kvedge_rocks_error_msg(char **errptr, char *msg, size_t msg_len);

/* For a failed open (or column family listing): as kvedge_rocks_error_msg, but a message about
 * the store's LOCK file, or EAGAIN on it, is KVEDGE_ELOCKED (another process or handle holds
 * the store). */
int kvedge_rocks_open_error(char **errptr, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif
