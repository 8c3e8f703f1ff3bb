/* Large host buffers: the K/V of a context in the decoder's session, the loader's staging
 * slots. Fresh memory is faulted in on first touch, and on this project's CPU edge that touch
 * is on the fetch's critical path (the loader dequantizes into it while layers arrive): 4 KiB
 * pages cost one fault per 4 KiB (about 37 ms of CPU per 90 MB on the machine of
 * docs/benchmarks.md). A big buffer is 2 MiB-aligned, a whole number of 2 MiB, and advised for
 * transparent huge pages (MADV_HUGEPAGE: one fault per 2 MiB where the kernel grants them, 4 KiB
 * pages as before where it does not). Free it with free(). */
#ifndef KVEDGE_STORE_BIGMEM_H
#define KVEDGE_STORE_BIGMEM_H

#include <stddef.h>

#define KVEDGE_BIG_PAGE ((size_t)2 << 20) /* alignment and granule of a big buffer */
#define KVEDGE_BIG_MIN  ((size_t)4 << 20) /* below it, plain malloc */

/* bytes of memory (at least 1), or NULL when out of memory (or bytes too large to round). */
void *kvedge_big_alloc(size_t bytes);

#endif
