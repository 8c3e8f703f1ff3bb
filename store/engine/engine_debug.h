/* Test-only fault injection into the block engine: not part of its API, for tests that need
 * damaged blocks on disk. */
#ifndef KVEDGE_STORE_ENGINE_DEBUG_H
#define KVEDGE_STORE_ENGINE_DEBUG_H

#include <stddef.h>
#include <stdint.h>

#include "store/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Overwrites a stored block's bytes (its metadata and indexes untouched), bypassing every
 * check. Errors: KVEDGE_EINVAL, KVEDGE_EREADONLY, store errors. */
int kvedge_engine_debug_put_raw(kvedge_engine_t *e, const kvedge_block_key_t *key,
                                const uint8_t *data, size_t len);

/* Stores a block as kvedge_engine_put does (metadata and indexes describe it), but without
 * decompressing its lz4 body: how a block whose body does not decode, under a valid checksum,
 * reached a store before puts refused it. Errors as kvedge_engine_put. */
int kvedge_engine_debug_put_unchecked(kvedge_engine_t *e, const kvedge_chunk_info_t *chunk,
                                      uint16_t layer, uint16_t head, const uint8_t *block,
                                      size_t len);

/* Faults kvedge_engine_repair meets once each, then forgets (0: none). */
enum {
    KVEDGE_REPAIR_FAULT_NONE,
    KVEDGE_REPAIR_FAULT_SHORT_STORE, /* one kept block goes missing from the new store */
    KVEDGE_REPAIR_FAULT_STOP_SWAP,   /* the swap stops once the old files have moved */
};
void kvedge_engine_debug_repair_fault(int fault);

/* Test-only, for a command run as a child process: with this variable set to "abort", a repair
 * run in a process that has not opened RocksDB yet (kvedge repair) dies in its first try as a
 * librocksdb assertion would make it, and takes the blob files alone in its second. */
#define KVEDGE_REPAIR_FAULT_ENV "KVEDGE_DEBUG_REPAIR_FAULT"

/* Writes bytes into the models family under any key, bypassing every check: how a test builds
 * a store in an older record layout (a node-wide record's key is the bare model id, its value
 * kvedge_model_pack's). Errors: KVEDGE_EINVAL, KVEDGE_EREADONLY, store errors. */
int kvedge_engine_debug_put_model_record(kvedge_engine_t *e, const void *key, size_t klen,
                                         const uint8_t *rec, size_t len);

#ifdef __cplusplus
}
#endif
#endif
