/* The block engine: kvedge blocks in RocksDB, addressed by chunk | layer | head, with per-block
 * metadata, capacity-bounded approximate-LRU eviction, pinning, TTL, quarantine of corrupt
 * blocks and statistics. Thread-safe: one engine may be used from any number of threads. */
#ifndef KVEDGE_STORE_ENGINE_H
#define KVEDGE_STORE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/block.h"
#include "store/chunk.h"
#include "store/model.h"
#include "store/stats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* On-disk layout version, kept under the key "kvedge.format" of the default column family. */
#define KVEDGE_ENGINE_FORMAT_VERSION               1
#define KVEDGE_ENGINE_BLOB_MIN_BYTES_DEFAULT       4096
#define KVEDGE_ENGINE_ATIME_GRANULARITY_MS_DEFAULT 1000
#define KVEDGE_ENGINE_CACHE_BYTES_DEFAULT          (256ull << 20)

typedef struct kvedge_engine_t kvedge_engine_t;

/* Per-block metadata, written with the block in one batch. */
typedef struct {
    uint32_t bytes; /* encoded block size */
    kvedge_dtype_t dtype;
    kvedge_scheme_t scheme;
    uint32_t tokens;
    uint16_t head_dim;
    uint16_t key_channels;
    uint16_t group_size;
    bool lz4;
    bool pinned;
    uint64_t checksum; /* the block's own xxh3 */
    uint64_t created_ms;
    uint64_t atime_ms;   /* last access, at the engine's atime granularity */
    uint64_t expires_ms; /* 0 = never */
} kvedge_block_meta_t;

typedef struct {
    uint64_t capacity_bytes;       /* 0 = unlimited; counts encoded block bytes */
    uint32_t default_ttl_s;        /* 0 = blocks do not expire unless a put asks */
    bool sync;                     /* fsync the WAL on every write (durable puts) */
    bool create_if_missing;        /* default true */
    bool read_only;                /* open without the lock; writes fail KVEDGE_EREADONLY */
    uint32_t blob_min_bytes;       /* values at least this large live in blob files */
    uint32_t atime_granularity_ms; /* reads refresh atime only when older than this */
    uint64_t cache_bytes;          /* in-memory LRU of blob values and table blocks; 0 = none */
    /* Clock in milliseconds; NULL = wall clock. Tests inject their own. */
    uint64_t (*clock_ms)(void *ctx);
    void *clock_ctx;
} kvedge_engine_opts_t;

typedef struct {
    uint32_t ttl_s; /* 0 = engine default, KVEDGE_TTL_NEVER = never */
    bool pin;       /* pinned blocks are never evicted and never expire */
} kvedge_put_opts_t;

/* A value read from the engine. data stays valid until kvedge_value_release. */
typedef struct {
    const uint8_t *data;
    size_t len;
    void *priv;
} kvedge_value_t;

void kvedge_engine_opts_default(kvedge_engine_opts_t *opts);

/* Opens (creating if allowed) the store in dir. On failure, why (if not NULL) receives a
 * one-line reason. Errors: KVEDGE_ENOTFOUND (no store and create_if_missing false),
 * KVEDGE_EBUSY (another process holds it), KVEDGE_ECORRUPT (RocksDB reports corruption),
 * KVEDGE_EVERSION (written by a newer kvedge), KVEDGE_EIO, KVEDGE_ESTORE. */
int kvedge_engine_open(const char *dir, const kvedge_engine_opts_t *opts, kvedge_engine_t **out,
                       char *why, size_t why_len);

/* Closes the store (flushes nothing extra: every write is already in the WAL). NULL-safe,
 * idempotent, nulls *self_p. */
void kvedge_engine_destroy(kvedge_engine_t **self_p);

/* Registers a model shape. Records are immutable once registered, and built-in ids are
 * reserved for their built-in shape: idempotent for the same shape; KVEDGE_ESHAPE if the id
 * is a built-in or is taken with a different shape (nothing changes then). */
int kvedge_engine_put_model(kvedge_engine_t *e, const kvedge_model_t *model);
int kvedge_engine_get_model(kvedge_engine_t *e, const char *id, kvedge_model_t *out);
int kvedge_engine_list_models(kvedge_engine_t *e, int (*cb)(void *ctx, const kvedge_model_t *model),
                              void *ctx);

/* Stores one block (data and metadata in one write batch), registering its chunk. The block
 * is verified first; its model must be registered, layer/head inside the model's shape, its
 * head_dim the model's and its token count the chunk's. Evicts least-recently-used unpinned
 * blocks when over capacity. opts may be NULL.
 * Errors: codec errors of kvedge_block_parse, KVEDGE_ENOMODEL, KVEDGE_ESHAPE (shape or chunk
 * info disagreeing with what is stored), KVEDGE_ETOOBIG (larger than the capacity),
 * KVEDGE_EFULL (cannot free enough: the rest is pinned), KVEDGE_EREADONLY, KVEDGE_ESTORE. */
int kvedge_engine_put(kvedge_engine_t *e, const kvedge_chunk_info_t *chunk, uint16_t layer,
                      uint16_t head, const uint8_t *block, size_t len,
                      const kvedge_put_opts_t *opts);

/* Reads and verifies one block; refreshes its access time. A block failing verification is
 * moved to quarantine, counted, and reported as KVEDGE_ECORRUPT (callers treat it as a miss;
 * the next get says KVEDGE_ENOTFOUND). Expired blocks are deleted and reported
 * KVEDGE_ENOTFOUND. Caller releases *out with kvedge_value_release. */
int kvedge_engine_get(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_value_t *out);
void kvedge_value_release(kvedge_value_t *v);

/* Reads the metadata of one block without touching the block or its access time. */
int kvedge_engine_get_meta(kvedge_engine_t *e, const kvedge_block_key_t *key,
                           kvedge_block_meta_t *out);

/* Called per head of a layer scan, in head order. status is 0 with the verified block
 * (valid only during the call), or KVEDGE_ECORRUPT with data NULL for a quarantined head.
 * Return 0 to go on; anything else stops the scan and is returned by the scan. */
typedef int (*kvedge_layer_cb)(void *ctx, uint16_t head, int status, const uint8_t *data,
                               size_t len);

/* Streams every stored head of one layer of one chunk (a range scan). Returns the number of
 * heads delivered with status 0, or a negative error, or the callback's non-zero value. */
int kvedge_engine_get_layer(kvedge_engine_t *e, const kvedge_chunk_id_t *chunk, uint16_t layer,
                            kvedge_layer_cb cb, void *ctx);

/* Metadata of every block, in key order; of one chunk when chunk is not NULL. The callback
 * returns 0 to go on. */
typedef int (*kvedge_meta_cb)(void *ctx, const kvedge_block_key_t *key,
                              const kvedge_block_meta_t *meta);
int kvedge_engine_scan(kvedge_engine_t *e, const kvedge_chunk_id_t *chunk, kvedge_meta_cb cb,
                       void *ctx);

typedef int (*kvedge_chunk_cb)(void *ctx, const kvedge_chunk_info_t *info);
int kvedge_engine_list_chunks(kvedge_engine_t *e, kvedge_chunk_cb cb, void *ctx);
int kvedge_engine_get_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id,
                            kvedge_chunk_info_t *out);
/* Resolves a hex prefix (at least 4 digits) of a chunk id, as git resolves short hashes.
 * Errors: KVEDGE_EINVAL, KVEDGE_ENOTFOUND, KVEDGE_EAMBIGUOUS. */
int kvedge_engine_find_chunk(kvedge_engine_t *e, const char *hex_prefix, kvedge_chunk_id_t *out);

/* Deletes a chunk's blocks and record; with descendants, also every chunk chained below it.
 * *blocks (may be NULL) receives the number of blocks deleted. Pinned blocks are deleted too:
 * deletion is explicit. */
int kvedge_engine_delete_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id, bool descendants,
                               uint64_t *blocks);

/* Pins or unpins one block, or every block of a chunk (*changed: blocks whose state
 * changed). */
int kvedge_engine_pin(kvedge_engine_t *e, const kvedge_block_key_t *key, bool pin);
int kvedge_engine_pin_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id, bool pin,
                            uint64_t *changed);

/* Evicts least-recently-used unpinned blocks until at most target_bytes are stored.
 * Returns 0, or KVEDGE_EFULL if pinned blocks alone exceed the target (it still evicts all
 * it can). Outputs may be NULL. */
int kvedge_engine_evict(kvedge_engine_t *e, uint64_t target_bytes, uint64_t *blocks,
                        uint64_t *bytes);

/* Deletes every expired, unpinned block. */
int kvedge_engine_expire(kvedge_engine_t *e, uint64_t *blocks);

/* Reads every block and checks it as a get does (kvedge_block_check: structure, checksum, lz4
 * body; and its metadata), so that a block is bad here exactly when a get refuses it. cb (may
 * be NULL) hears each bad block with its error; with quarantine, bad blocks are moved to
 * quarantine. Reading with RocksDB's own checksums on, verify also finds a damaged RocksDB
 * record around a block that still reads intact (a get serves it): cb hears it with
 * KVEDGE_EIO, it does not count in *bad, and with quarantine it is written again as a fresh
 * record. Returns 0 after a full scan (bad blocks are reported in *bad). */
typedef int (*kvedge_verify_cb)(void *ctx, const kvedge_block_key_t *key, int err);
int kvedge_engine_verify(kvedge_engine_t *e, bool quarantine, kvedge_verify_cb cb, void *ctx,
                         uint64_t *checked, uint64_t *bad);

int kvedge_engine_stats(kvedge_engine_t *e, kvedge_engine_stats_t *out);

/* What kvedge_engine_repair did. */
typedef struct {
    uint64_t blocks_kept;     /* blocks that passed the full check: in the repaired store */
    uint64_t blocks_lost;     /* blocks that did not: in its quarantine family */
    uint64_t from_blob_files; /* kept blocks RocksDB could not read, found in its blob files */
    uint64_t meta_rebuilt;    /* kept blocks whose metadata was unreadable: rebuilt from the block
                                 (not pinned, no expiry, accessed now) */
    uint64_t chunks_kept;     /* chunk records carried over */
    uint64_t chunks_lost;     /* chunks of kept blocks whose record could not be read */
    uint64_t models_kept;     /* model records carried over */
    uint64_t quarantine_kept; /* entries already in quarantine, carried over */
    bool rocksdb_repaired;    /* RocksDB could not open the files: its own repair ran first */
    char old_files[512];      /* where the damaged store's RocksDB files were moved */
} kvedge_repair_report_t;

/* Salvages a damaged store (the node stopped: it takes the store's lock). Reads every record
 * RocksDB can still read back, checks every block as a get does (kvedge_block_check and its
 * metadata), and writes a new store of what passes into dir/repair.tmp; then moves the old
 * RocksDB files to dir/lost/repair-TIME/ and the new ones into dir (other files of dir, such
 * as certificates, stay). A block RocksDB cannot read is looked for in the blob files
 * themselves (its newest copy that passes, and matches its metadata when that is readable).
 * Blocks that still fail are quarantined in the new store (with their bytes when those could
 * be read) and reported through cb (may be NULL; a non-zero return stops the repair, leaving
 * the store as it was) with their error. The LRU and TTL indexes are rebuilt; unreadable
 * metadata is rebuilt from its block. When RocksDB cannot open the files at all,
 * rocksdb_repair_db rebuilds its MANIFEST first (the blob files, which it drops, are linked
 * into dir/lost/blobs-TIME/ beforehand and read from there). Needs free space for a copy of
 * what is kept. Errors: KVEDGE_ENOTFOUND (no store), KVEDGE_EBUSY (in use), KVEDGE_EVERSION
 * (written by a newer kvedge: left alone), KVEDGE_EIO,
 * KVEDGE_ENOMEM, store errors; why receives a one-line reason. out may be NULL. */
int kvedge_engine_repair(const char *dir, kvedge_verify_cb cb, void *ctx,
                         kvedge_repair_report_t *out, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
