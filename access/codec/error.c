/* Text for the error codes of access/codec/error.h, and failure reasons (access/codec/why.h). */
#include "access/codec/error.h"
#include "access/codec/why.h"

#include <stdarg.h>
#include <stdio.h>

const char *kvedge_strerror(int err)
{
    switch (err) {
#define KVEDGE_ERR_TEXT(name, value, msg)                                                          \
    case (value):                                                                                  \
        return msg;
        KVEDGE_ERRNO_MAP(KVEDGE_ERR_TEXT)
#undef KVEDGE_ERR_TEXT
    }
    return "unknown error";
}

const char *kvedge_errname(int err)
{
    switch (err) {
#define KVEDGE_ERR_NAME(name, value, msg)                                                          \
    case (value):                                                                                  \
        return "KVEDGE_" #name;
        KVEDGE_ERRNO_MAP(KVEDGE_ERR_NAME)
#undef KVEDGE_ERR_NAME
    }
    return "KVEDGE_EUNKNOWN";
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
