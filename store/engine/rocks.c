/* The one translation of RocksDB error messages into kvedge error codes. */
#include "store/engine/rocks.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <rocksdb/c.h>

#include "access/codec/error.h"

/* RocksDB's C API reports errors only as text; its status kind leads the message. The lock
 * failures name the store's LOCK file: "IO error: While lock file: <dir>/LOCK: Resource
 * temporarily unavailable" (another process) or "IO error: lock hold by current process ..."
 * (another handle in this one), so they are matched before the generic "IO error". */
static int s_translate(const char *m, bool open)
{
    if (open && (strstr(m, "While lock file") || strstr(m, "lock hold by current process") ||
                 strstr(m, "LOCK") || strstr(m, "Resource temporarily unavailable")))
        return KVEDGE_ELOCKED;
    if (strstr(m, "Corruption"))
        return KVEDGE_ECORRUPT;
    /* "IO error: No space left on device: While appending to file ..." (ENOSPC), and RocksDB's
     * own "NoSpace" sub-code once it has stopped writes on a background error of that kind. */
    if (strstr(m, "No space left on device") || strstr(m, "NoSpace") ||
        strstr(m, "Disk quota exceeded"))
        return KVEDGE_ENOSPC;
    if (strstr(m, "IO error"))
        return KVEDGE_EIO;
    return KVEDGE_ESTORE;
}

static int s_take(char **errptr, bool open, char *msg, size_t msg_len)
{
    int rc = s_translate(*errptr, open);
    if (msg && msg_len)
        snprintf(msg, msg_len, "%s", *errptr);
    rocksdb_free(*errptr);
    *errptr = NULL;
    return rc;
}

int kvedge_rocks_error(char **errptr)
{
    return s_take(errptr, false, NULL, 0);
}

int kvedge_rocks_error_msg(char **errptr, char *msg, size_t msg_len)
{
    return s_take(errptr, false, msg, msg_len);
}

int kvedge_rocks_open_error(char **errptr, char *msg, size_t msg_len)
{
    return s_take(errptr, true, msg, msg_len);
}
