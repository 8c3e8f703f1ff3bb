/* Text for the error codes of access/codec/error.h, their wire values (access/codec/errwire.h),
 * and failure reasons (access/codec/why.h). */
#include "access/codec/error.h"
#include "access/codec/errwire.h"
#include "access/codec/why.h"

#include <stdarg.h>
#include <stdio.h>

const char *kvedge_strerror(int err)
{
    switch (err) {
#define KVEDGE_ERR_TEXT(name, n, msg)                                                              \
    case KVEDGE_##name:                                                                            \
        return msg;
        KVEDGE_ERRNO_MAP(KVEDGE_ERR_TEXT)
#undef KVEDGE_ERR_TEXT
    }
    return "unknown error (not a kvedge error code)";
}

const char *kvedge_errname(int err)
{
    switch (err) {
#define KVEDGE_ERR_NAME(name, n, msg)                                                              \
    case KVEDGE_##name:                                                                            \
        return "KVEDGE_" #name;
        KVEDGE_ERRNO_MAP(KVEDGE_ERR_NAME)
#undef KVEDGE_ERR_NAME
    }
    return "KVEDGE_EUNKNOWN";
}

/* The map's numbers run 0 ... KVEDGE_ERR_COUNT - 1 without a gap (checked at compile time). */
#define KVEDGE_ERR_ONE(name, n, msg) +1
_Static_assert(0 KVEDGE_ERRNO_MAP(KVEDGE_ERR_ONE) == KVEDGE_ERR_COUNT,
               "KVEDGE_ERR_COUNT is the number of codes in KVEDGE_ERRNO_MAP");
#undef KVEDGE_ERR_ONE
#define KVEDGE_ERR_SUM(name, n, msg) +(n)
_Static_assert(0 KVEDGE_ERRNO_MAP(KVEDGE_ERR_SUM) == KVEDGE_ERR_COUNT * (KVEDGE_ERR_COUNT - 1) / 2,
               "KVEDGE_ERRNO_MAP numbers its codes 0 ... KVEDGE_ERR_COUNT - 1");
#undef KVEDGE_ERR_SUM

int kvedge_err_index(int err)
{
    if (err == KVEDGE_OK)
        return 0;
    if (err < KVEDGE_ERR_BASE && err > KVEDGE_ERR_BASE - KVEDGE_ERR_COUNT)
        return KVEDGE_ERR_BASE - err;
    return -1;
}

int32_t kvedge_err_to_wire(int err)
{
    int n = kvedge_err_index(err);
    return n >= 0 ? -n : -kvedge_err_index(KVEDGE_EIO);
}

int kvedge_err_from_wire(int32_t status)
{
    if (status == 0)
        return KVEDGE_OK;
    if (status < 0 && status > -KVEDGE_ERR_COUNT)
        return KVEDGE_ERR_BASE + status;
    return KVEDGE_EPROTO;
}

int kvedge_why(char *why, size_t len, int rc, const char *fmt, ...)
{
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return rc;
}
