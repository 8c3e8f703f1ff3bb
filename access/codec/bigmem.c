/* Large host buffers (access/codec/bigmem.h). */
#define _GNU_SOURCE
#include "access/codec/bigmem.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

void *kvedge_big_alloc(size_t bytes)
{
    if (bytes < KVEDGE_BIG_MIN)
        return malloc(bytes ? bytes : 1);
    if (bytes > SIZE_MAX - KVEDGE_BIG_PAGE)
        return NULL;
    const size_t rounded = (bytes + KVEDGE_BIG_PAGE - 1) & ~(KVEDGE_BIG_PAGE - 1);
    void *p = NULL;
    if (posix_memalign(&p, KVEDGE_BIG_PAGE, rounded) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    /* Advice only: a kernel without transparent huge pages, or with them off, refuses it and
     * the buffer keeps 4 KiB pages. */
    (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}
