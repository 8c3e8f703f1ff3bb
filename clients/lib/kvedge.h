/* libkvedge: the installed C API of kvedge (#include <kvedge/kvedge.h>, pkg-config kvedge).
 *
 * - <kvedge/client.h>: connect to a store node or an edge proxy; put, get, stream layers,
 *   look up prefixes, list, pin, evict, and FETCH planned, multi-source layer streams.
 * - <kvedge/pipeline.h>: the pipelined loader that pulls a context's layers into a decoder's
 *   KV layout (contiguous or paged, CPU or GPU) while the decoder computes.
 * - <kvedge/block.h>, <kvedge/chunk.h>, <kvedge/model.h>: encode blocks, compute chunk ids,
 *   describe model shapes; <kvedge/error.h>: the error codes every call returns.
 *
 * Every function returns 0 or a negative KVEDGE_E* code (kvedge_strerror() gives the text);
 * each declaration says its errors and the lifetime of what it returns. The library never
 * logs and never exits. It links no RocksDB: storage is the store node's business. */
#ifndef KVEDGE_CLIENTS_KVEDGE_H
#define KVEDGE_CLIENTS_KVEDGE_H

#include "access/client.h"
#include "clients/lib/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of these headers; kvedge_version() gives the library's, which may be newer
 * within the same major version (the SONAME). Must match project(VERSION) in the top
 * CMakeLists.txt: configuring fails when they differ. */
#define KVEDGE_VERSION_MAJOR 0
#define KVEDGE_VERSION_MINOR 1
#define KVEDGE_VERSION_PATCH 0

/* "MAJOR.MINOR.PATCH" of the library linked at run time; static storage. */
const char *kvedge_version(void);

#ifdef __cplusplus
}
#endif
#endif
