/* libkvedge: the installed C API of kvedge (#include <kvedge/kvedge.h>, pkg-config kvedge).
 *
 * - <kvedge/client.h>: connect to a store node or an edge proxy; put, get, stream layers,
 *   look up prefixes, list, pin, evict, and FETCH planned, multi-source layer streams.
 * - <kvedge/pipeline.h>: the pipelined loader that pulls a context's layers into a decoder's
 *   KV layout (contiguous or paged, CPU or GPU) while the decoder computes.
 * - <kvedge/placed.h>: the placed writer that puts a context to the R cloud nodes its
 *   placement names and acknowledges it when W of them have every block.
 * - <kvedge/block.h>, <kvedge/chunk.h>, <kvedge/model.h>: encode blocks, compute chunk ids,
 *   describe model shapes; <kvedge/error.h>: the error codes every call returns.
 * - <kvedge/basis.h>: load the coding bases that transform-coded ("tc") blocks of a model are
 *   encoded and decoded with (kvedge_basis_load_dir).
 *
 * Every function returns 0 or a negative KVEDGE_E* code (kvedge_strerror() gives the text);
 * each declaration says its errors and the lifetime of what it returns. The library never
 * logs and never exits. It links no RocksDB: storage is the store node's business. */
#ifndef KVEDGE_CLIENTS_KVEDGE_H
#define KVEDGE_CLIENTS_KVEDGE_H

#include "access/client.h"
#include "access/codec/basis.h"
#include "clients/lib/pipeline.h"
#include "clients/lib/placed.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of these headers; kvedge_version() and kvedge_version_number() give the
 * library's, which may be newer within the same ABI (the SONAME, libkvedge.so.1). Must match
 * project(VERSION) in the top CMakeLists.txt: configuring fails when they differ (MINOR and
 * PATCH stay below 100). */
#define KVEDGE_VERSION_MAJOR 0
#define KVEDGE_VERSION_MINOR 1
#define KVEDGE_VERSION_PATCH 0
/* One number that orders versions: MAJOR * 10000 + MINOR * 100 + PATCH (0.1.0 is 100), for
 * `#if KVEDGE_VERSION_NUMBER >= 10200` in code that must build against several versions. */
#define KVEDGE_VERSION_NUMBER                                                                      \
    (KVEDGE_VERSION_MAJOR * 10000 + KVEDGE_VERSION_MINOR * 100 + KVEDGE_VERSION_PATCH)

/* "MAJOR.MINOR.PATCH" of the library linked at run time. Never fails; the string is static
 * storage (do not free it). */
const char *kvedge_version(void);

/* KVEDGE_VERSION_NUMBER of the library linked at run time (MAJOR * 10000 + MINOR * 100 +
 * PATCH): compare it with the headers' macro to tell an older library from a newer one.
 * Never fails. */
int kvedge_version_number(void);

#ifdef __cplusplus
}
#endif
#endif
