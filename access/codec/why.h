/* The one-line reasons that calls taking a `char *why, size_t why_len` pair give on failure. */
#ifndef KVEDGE_STORE_WHY_H
#define KVEDGE_STORE_WHY_H

#include <stddef.h>

/* Writes the reason into why (nothing when why is NULL or len 0) and returns rc, so that a
 * failure path reads `return kvedge_why(why, len, KVEDGE_EINVAL, "...", ...);`. */
int kvedge_why(char *why, size_t len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
