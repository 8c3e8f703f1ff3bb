/* The block engine: kvedge blocks in RocksDB, addressed by chunk | layer | head, with per-block
 * metadata, capacity-bounded approximate-LRU eviction, pinning, TTL, quarantine of corrupt
 * blocks, variants (other precisions of a block) and statistics. Thread-safe: one engine may be
 * used from any number of threads. */
#ifndef KVEDGE_STORE_ENGINE_H
#define KVEDGE_STORE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/codec/block.h"
#include "access/codec/chunk.h"
#include "access/codec/model.h"
#include "access/codec/prec.h"
#include "access/codec/stats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* On-disk layout version, kept under the key "kvedge.format" of the default column family. */
#define KVEDGE_ENGINE_FORMAT_VERSION               1
#define KVEDGE_ENGINE_BLOB_MIN_BYTES_DEFAULT       4096
#define KVEDGE_ENGINE_ATIME_GRANULARITY_MS_DEFAULT 1000
#define KVEDGE_ENGINE_CACHE_BYTES_DEFAULT          (256ull << 20)
/* Memtables of all column families together: past this RocksDB flushes the largest
 * (db_write_buffer_size); the blocks family's memtable is half of it, each other's 4 MiB,
 * two of each at most (one filling, one flushing). */
#define KVEDGE_ENGINE_MEMTABLE_BYTES (64ull << 20)

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
    /* Re-encoded coarser by kvedge_engine_demote (section "Demotion"), and the rung it was
     * put at (KVEDGE_PREC_STORED when not demoted). A new put of the block clears both. */
    bool demoted;
    kvedge_prec_t demoted_from;
} kvedge_block_meta_t;

typedef struct {
    uint64_t capacity_bytes;       /* 0 = unlimited; counts encoded block bytes, variants too */
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
    /* Capacity pressure (section "Demotion"): 0 (KVEDGE_PREC_STORED) = plain LRU eviction;
     * a rung = drop variants first, then demote least-recently-used blocks to this rung,
     * then evict, demoted blocks last. */
    kvedge_prec_t pressure_demote;
    /* Size of the reserve file (DIR/kvedge.reserve) given back to the file system when the disk
     * fills, so deletes, flushes and a restart have room: 0 = a 32nd of the file system, 1 MiB
     * to 64 MiB; KVEDGE_ENGINE_RESERVE_NONE = none. */
    uint64_t reserve_bytes;
} kvedge_engine_opts_t;

#define KVEDGE_ENGINE_RESERVE_FILE "kvedge.reserve"
#define KVEDGE_ENGINE_RESERVE_NONE UINT64_MAX

/* The store's disk: what the engine sees and did about it. */
typedef struct {
    uint64_t free_bytes;         /* free on the store's file system (statvfs f_bavail) */
    uint64_t fs_bytes;           /* the file system's size */
    uint64_t files_bytes;        /* RocksDB's table and blob files */
    uint64_t memtable_bytes;     /* in the memtables (and the WAL): what a flush writes out */
    uint64_t write_buffer_bytes; /* the blocks family's write buffer */
    uint64_t wal_bound_bytes;    /* the WAL is flushed past this */
    uint64_t reserve_bytes;      /* the reserve file's size (0: none) */
    bool reserve_held;           /* it is on disk now */
    uint64_t reserve_releases;   /* times it was given back since open */
    bool full;                   /* the last large write was refused: KVEDGE_ENOSPC */
    bool write_failed;           /* RocksDB failed a write (no space, I/O): writes stopped
                                    until the store is reopened */
    uint64_t refused;            /* writes refused for want of space since open */
    uint64_t compactions;        /* compactions run to free space (at most one a second) */
} kvedge_engine_disk_t;

int kvedge_engine_disk(kvedge_engine_t *e, kvedge_engine_disk_t *out);

/* The store directory the engine was opened on (valid while it is open). */
const char *kvedge_engine_dir(const kvedge_engine_t *e);

typedef struct {
    uint32_t ttl_s; /* 0 = engine default, KVEDGE_TTL_NEVER = never */
    bool pin;       /* pinned blocks are never evicted and never expire */
} kvedge_put_opts_t;

/* A value read from the engine. data stays valid until kvedge_value_release (priv: the pinned
 * RocksDB value, or a buffer of the engine's own for a derived block). */
typedef struct {
    const uint8_t *data;
    size_t len;
    void *priv;
} kvedge_value_t;

void kvedge_engine_opts_default(kvedge_engine_opts_t *opts);

/* Opens (creating if allowed) the store in dir. On failure, why (if not NULL) receives a
 * one-line reason. Errors: KVEDGE_ENOTFOUND (no store and create_if_missing false),
 * KVEDGE_ELOCKED (another process holds it), KVEDGE_ECORRUPT (RocksDB reports corruption),
 * KVEDGE_EVERSION (written by a newer kvedge), KVEDGE_EIO, KVEDGE_ESTORE. */
int kvedge_engine_open(const char *dir, const kvedge_engine_opts_t *opts, kvedge_engine_t **out,
                       char *why, size_t why_len);

/* Closes the store (flushes nothing extra: every write is already in the WAL). NULL-safe,
 * idempotent, nulls *self_p. */
void kvedge_engine_destroy(kvedge_engine_t **self_p);

/* Model records live in namespaces. The node-wide one holds the records of local use and of
 * the node's plaintext loopback clients, and every record of a store written before tenants
 * had namespaces; each tenant tag (kvedge_chunk_info_t.tenant) has its own. A tenant sees its
 * own records, then the node-wide ones: built-in ids have their built-in shape everywhere, a
 * node-wide record binds its id for every tenant, and any other id is free for each tenant to
 * bind in its own namespace. Records are immutable once registered.
 *
 * Registers a shape in the node-wide namespace: idempotent for the same shape; KVEDGE_ESHAPE
 * if the id is a built-in or is taken with a different shape (nothing changes then). Other
 * errors: KVEDGE_EINVAL, KVEDGE_ETOOBIG (kvedge_model_check), KVEDGE_EREADONLY, store
 * errors. */
int kvedge_engine_put_model(kvedge_engine_t *e, const kvedge_model_t *model);
/* The node-wide record of id (a built-in id answers its built-in shape once a record exists,
 * whatever the record says). Errors: KVEDGE_EINVAL, KVEDGE_ENOMODEL, KVEDGE_ECORRUPT, store
 * errors. */
int kvedge_engine_get_model(kvedge_engine_t *e, const char *id, kvedge_model_t *out);
/* Registers a shape in tenant's namespace (NULL or all zero: the node-wide one, as
 * kvedge_engine_put_model). A built-in id is registered node-wide. KVEDGE_ESHAPE when the
 * id is built in, bound node-wide or bound by this tenant with a different shape; errors
 * otherwise as kvedge_engine_put_model. */
int kvedge_engine_put_tenant_model(kvedge_engine_t *e, const uint8_t *tenant,
                                   const kvedge_model_t *model);
/* The shape tenant (NULL or all zero: node-wide only) sees for id: its own record, else the
 * node-wide one. Errors as kvedge_engine_get_model. */
int kvedge_engine_get_tenant_model(kvedge_engine_t *e, const uint8_t *tenant, const char *id,
                                   kvedge_model_t *out);
/* Copies into dst the record src resolves id to for tenant (kvedge_engine_get_tenant_model),
 * in the namespace it has in src: the tenant's own record stays the tenant's, a node-wide one
 * stays node-wide. Nothing when dst already resolves id for tenant, src does not, or id is
 * not a model id. Returns 1 when a record was written, 0 when none was, KVEDGE_EINVAL (NULL
 * store) or an error of kvedge_engine_put_tenant_model. */
int kvedge_engine_copy_model(kvedge_engine_t *dst, kvedge_engine_t *src, const uint8_t *tenant,
                             const char *id);
/* Calls cb for each node-wide record in id order (list_models), or for every record
 * (list_tenant_models): each tenant's, by tag then id, with its 16-byte tag, then the
 * node-wide ones with tenant NULL. A record that does not parse stops the walk with
 * KVEDGE_ECORRUPT; a nonzero cb return stops it and is returned. */
int kvedge_engine_list_models(kvedge_engine_t *e, int (*cb)(void *ctx, const kvedge_model_t *model),
                              void *ctx);
int kvedge_engine_list_tenant_models(kvedge_engine_t *e,
                                     int (*cb)(void *ctx, const uint8_t *tenant,
                                               const kvedge_model_t *model),
                                     void *ctx);

/* Stores one block (data and metadata in one write batch), registering its chunk. The block
 * is verified first; its model must be registered for the chunk's tenant
 * (kvedge_engine_get_tenant_model with chunk->tenant), layer/head inside that shape, its
 * head_dim the model's and its token count the chunk's. Evicts least-recently-used unpinned
 * blocks when over capacity. opts may be NULL.
 * Errors: codec errors of kvedge_block_parse, KVEDGE_ENOMODEL, KVEDGE_ESHAPE (shape or chunk
 * info disagreeing with what is stored), KVEDGE_ETOOBIG (larger than the capacity),
 * KVEDGE_EFULL (cannot free enough: the rest is pinned), KVEDGE_ENOSPC (the disk has no room
 * for it beside what the memtables will flush: nothing written), KVEDGE_EREADONLY,
 * KVEDGE_ESTORE. */
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

/* Evicts least-recently-used unpinned blocks until at most target_bytes are stored (primaries
 * and variants together, as capacity counts them; evicting a block drops its variants, and
 * *bytes counts both). With opts.pressure_demote set it frees in the pressure order (section
 * "Demotion"): *blocks counts the blocks evicted, *bytes every byte freed.
 * Returns 0, or KVEDGE_EFULL if pinned blocks alone exceed the target (it still evicts all
 * it can). Outputs may be NULL. */
int kvedge_engine_evict(kvedge_engine_t *e, uint64_t target_bytes, uint64_t *blocks,
                        uint64_t *bytes);

/* Deletes every expired, unpinned block (with its variants). */
int kvedge_engine_expire(kvedge_engine_t *e, uint64_t *blocks);

/* Reads every block and checks it as a get does (kvedge_block_check: structure, checksum, lz4
 * body; and its metadata), so that a block is bad here exactly when a get refuses it. cb (may
 * be NULL) hears each bad block with its error; with quarantine, bad blocks are moved to
 * quarantine. Reading with RocksDB's own checksums on, verify also finds a damaged RocksDB
 * record around a block that still reads intact (a get serves it): cb hears it with
 * KVEDGE_EIO, it does not count in *bad, and with quarantine it is written again as a fresh
 * record. Returns 0 after a full scan (bad blocks are reported in *bad).
 * Variants are checked too (structure, checksum, their rung and their primary's shape) and
 * count in *checked and *bad; cb hears a bad variant under its primary's key (the primary
 * itself may be sound: kvedge_engine_get_variant tells which rung), and with quarantine it is
 * quarantined as kvedge_engine_get_variant does. With quarantine, variant records left bound
 * to no live primary (a store an older kvedge wrote to) are dropped, not counted. */
typedef int (*kvedge_verify_cb)(void *ctx, const kvedge_block_key_t *key, int err);
int kvedge_engine_verify(kvedge_engine_t *e, bool quarantine, kvedge_verify_cb cb, void *ctx,
                         uint64_t *checked, uint64_t *bad);

/* blocks, bytes, fp16_bytes and the pinned totals count primaries only (the record is a wire
 * record); variants are in kvedge_engine_variant_stats, and capacity_bytes bounds both. gets,
 * hits, misses, puts and the byte counters include variant reads and writes. */
int kvedge_engine_stats(kvedge_engine_t *e, kvedge_engine_stats_t *out);

/* ---------------------------------------------------------------- variants
 *
 * A block (one chunk, layer, head) may be held at more than one precision (access/codec/prec.h).
 * The block put with kvedge_engine_put is the primary: metadata, LRU, TTL and pin are its. Other
 * rungs are variants, stored beside it (column family `variants`) and bound to the primary
 * they were put against: a variant lives and dies with its primary (delete, eviction, expiry,
 * quarantine of the primary, and a new put of the primary, which changes the data the variants
 * came from, drop them in the same write). Variant bytes count toward capacity_bytes; only
 * primaries are evicted, each taking its variants along. Writers of one block key serialize
 * with its primary's writers. Variants are stored, never made, by the engine:
 * kvedge_engine_get_prec derives a missing rung on the fly and leaves storing it to the
 * caller. Each variant record carries the checksum of the primary it was put against: one
 * bound to another primary (left by a kvedge that knew no variants, which keeps the family but
 * does not drop variants with their blocks) is never served, listed or reported bad; reads,
 * delete_chunk and verify with quarantine drop it. A read-only open of a store that never held
 * variants (no family to open) holds none. */

/* Stores block as the variant at rung prec of the primary at key, replacing the variant held
 * at that rung. The block is verified first (kvedge_block_check) and must be at rung prec
 * (kvedge_prec_of_block). Evicts least-recently-used unpinned primaries (never this one) when
 * over capacity.
 * Errors: codec errors of kvedge_block_check; KVEDGE_EINVAL (NULL, prec not a ladder rung, the
 * block at another rung, or prec the primary's own rung: the primary already is that
 * precision); KVEDGE_ENOTFOUND (no live primary); KVEDGE_ESHAPE (tokens, head_dim or dtype not
 * the primary's); KVEDGE_ETOOBIG, KVEDGE_EFULL, KVEDGE_EREADONLY, store errors, as
 * kvedge_engine_put. */
int kvedge_engine_put_variant(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_prec_t prec,
                              const uint8_t *block, size_t len);

/* Reads and verifies the variant at rung prec of key (kvedge_block_check, still at rung prec,
 * the primary's shape). Serving a variant is an access of its block: the primary's access time
 * is refreshed at the engine's granularity. A variant failing verification is moved to
 * quarantine (under its block key | rung), counted as quarantined and corrupt, and reported
 * KVEDGE_ECORRUPT (the next get says KVEDGE_ENOTFOUND). KVEDGE_ENOTFOUND when not held, or when
 * the primary is gone or expired (an expired primary is deleted, variants with it).
 * KVEDGE_EINVAL for NULL or an invalid rung. Caller releases *out with kvedge_value_release. */
int kvedge_engine_get_variant(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_prec_t prec,
                              kvedge_value_t *out);

/* The rungs held as variants of key, ascending, the primary's own not included (the listing
 * reads keys, not blocks: a listed variant may still fail its check when read). At most max
 * are written to out (may be NULL when max is 0); *n receives how many are held, which may
 * exceed max. Errors: KVEDGE_EINVAL, KVEDGE_ENOTFOUND (no primary), store errors. */
int kvedge_engine_variants(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_prec_t *out,
                           size_t max, size_t *n);

/* Deletes the variant at rung prec of key. Errors: KVEDGE_EINVAL, KVEDGE_ENOTFOUND (not held),
 * KVEDGE_EREADONLY, store errors. */
int kvedge_engine_drop_variant(kvedge_engine_t *e, const kvedge_block_key_t *key,
                               kvedge_prec_t prec);

/* Serves key at the best precision a reader accepts. accept lists the rungs it takes, best
 * first (kvedge_prec_list_check, else KVEDGE_EINVAL). For each rung in order: the primary when
 * it is at that rung, else the variant held at it; the first found and verified is served.
 * When none is held and derive is set: the first rung in the list that can be derived
 * (kvedge_prec_derivable; kvedge_block_transcode's rule for a primary off the ladder) from the
 * primary or a held variant, finest source first, is made with kvedge_block_transcode (lz4
 * when it pays; a transform-coded rung with the basis of the chunk's model, at the key's layer
 * and head: kvedge_block_transcode_at) and served with *derived true; the engine does not store
 * it (the caller may kvedge_engine_put_variant it). A transform-coded rung of a model whose
 * basis this process has not registered (kvedge_basis_load_dir) is a rung it cannot give: the
 * next acceptable one is tried. A corrupt variant is quarantined (and counted) and the next
 * acceptable option is tried; a corrupt primary is quarantined with its variants, leaving
 * nothing to serve: KVEDGE_ECORRUPT. The primary's access time is refreshed as by
 * kvedge_engine_get_variant. *served receives the rung served (served must not be NULL;
 * derived may be).
 * Errors: KVEDGE_EINVAL, KVEDGE_ENOTFOUND (no primary, or nothing acceptable held or
 * derivable: a reader accepting only lossless never gets a quantized block),
 * KVEDGE_ECORRUPT, KVEDGE_ENOMEM, store errors. Caller releases *out with
 * kvedge_value_release. */
int kvedge_engine_get_prec(kvedge_engine_t *e, const kvedge_block_key_t *key,
                           const kvedge_prec_t *accept, size_t n, bool derive, kvedge_value_t *out,
                           kvedge_prec_t *served, bool *derived);

/* Variant records held and their encoded block bytes (what capacity counts of them). Outputs
 * may be NULL. */
int kvedge_engine_variant_stats(kvedge_engine_t *e, uint64_t *blocks, uint64_t *bytes);

/* ---------------------------------------------------------------- demotion
 *
 * A cold block can stay at a coarser precision rather than leave: demotion replaces the
 * primary, in place and in one write batch, with kvedge_block_transcode of it at a coarser
 * rung (lz4 when it pays), and marks it demoted (kvedge_block_meta_t.demoted and
 * .demoted_from; the meta record is then version 2, which an older kvedge reads as damaged).
 * Pin, TTL, created and access time stay; the LRU and TTL entries do not move. Variants
 * coarser than the new rung (kvedge_prec_derivable from it, not equal to it) are kept and
 * bound to the new primary: they were made from the finer data and are at least as good as
 * what the demoted block would give. The others (finer, the new rung itself, incomparable
 * ThinK levels) are dropped: they are worth more bytes than the demotion frees, and a reader
 * must never be served a finer precision than the primary can back. The totals stay exact.
 * A demoted block is served as what it now is: to a reader with an accept list only at its
 * new rung or what derives from it (a reader accepting only lossless misses); to a plain GET
 * as stored.
 *
 * Capacity pressure (opts.pressure_demote set): when a put needs room, or
 * kvedge_engine_evict is asked for it, the engine frees, in this order and each step only
 * until used <= the target: (1) variant records, roughly least recently used block first
 * (they are re-derivable extras); (2) demotion of least-recently-used unpinned blocks not yet
 * demoted to opts.pressure_demote, when that rung derives from theirs and the block shrinks;
 * (3) eviction of least-recently-used blocks not demoted (those that could not be); (4)
 * eviction of demoted blocks, least recently used first. Pinned blocks are never touched.
 * With opts.pressure_demote 0 eviction is plain LRU, as before. The walks resume where the
 * last one stopped (an unpin restarts them), so a store full of demoted blocks is not
 * re-read on every put. */

/* Demotes the primary at key to rung prec. *saved (may be NULL) receives the bytes freed:
 * the primary's old size less its new one, plus the variants dropped (negative when the new
 * encoding is larger: lz4 did not pay). A demoted block can be demoted again, further down.
 * Errors: KVEDGE_EINVAL (NULL, prec not a rung, not derivable from the primary's rung or
 * equal to it: kvedge_prec_derivable, and for a primary off the ladder
 * kvedge_block_transcode's rule), KVEDGE_ENOTFOUND (no live primary), KVEDGE_ECORRUPT (the
 * primary failed verification: quarantined, as a get does), KVEDGE_EFULL (the new encoding is
 * larger and does not fit), KVEDGE_EREADONLY, KVEDGE_ENOMEM, store errors. */
int kvedge_engine_demote(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_prec_t prec,
                         int64_t *saved);

/* Demotes every block of a chunk that prec derives from (pinned ones too: the caller asked),
 * skipping those it does not (already at or below prec, another ThinK level). *blocks and
 * *saved (may be NULL) receive the blocks demoted and the bytes freed. Errors: KVEDGE_EINVAL,
 * KVEDGE_ENOTFOUND (no block of the chunk), KVEDGE_EREADONLY, store errors (it stops there;
 * what was demoted stays demoted). */
int kvedge_engine_demote_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id, kvedge_prec_t prec,
                               uint64_t *blocks, int64_t *saved);

/* The cold pass: demotes to prec every unpinned block not demoted whose access time is at
 * least idle_ms old (the LRU index, oldest first, up to the first block accessed since), when
 * prec derives from its rung and the block shrinks; at most max blocks (0: no limit).
 * *blocks and *saved as kvedge_engine_demote_chunk. Errors: KVEDGE_EINVAL, KVEDGE_EREADONLY,
 * store errors. */
int kvedge_engine_demote_idle(kvedge_engine_t *e, kvedge_prec_t prec, uint64_t idle_ms,
                              uint64_t max, uint64_t *blocks, int64_t *saved);

/* Stores the variant at rung prec of key made from its primary (kvedge_block_transcode, lz4
 * when it pays), when not held yet: *bytes (may be NULL) receives its size, 0 when it was
 * held already. Never evicts: KVEDGE_EFULL when it does not fit within capacity (preparing
 * ahead of demand must not push out what was asked for). Neither the access time nor the read
 * statistics move. Errors: KVEDGE_EINVAL (as kvedge_engine_demote: not derivable, or the
 * primary's own rung), KVEDGE_ENOBASIS (a transform-coded rung of a model whose basis this
 * process has not registered), KVEDGE_ENOTFOUND, KVEDGE_ECORRUPT, KVEDGE_EFULL,
 * KVEDGE_EREADONLY, KVEDGE_ENOMEM, store errors. */
int kvedge_engine_prepare_variant(kvedge_engine_t *e, const kvedge_block_key_t *key,
                                  kvedge_prec_t prec, uint64_t *bytes);

/* Demotion counters since open. */
typedef struct {
    uint64_t demoted;          /* demotions, whatever asked for them */
    uint64_t saved_bytes;      /* bytes they freed */
    uint64_t pressure_demoted; /* of those, made under capacity pressure */
    uint64_t pressure_saved_bytes;
    uint64_t pressure_variant_blocks; /* variant records dropped under capacity pressure */
    uint64_t pressure_variant_bytes;
} kvedge_engine_demote_stats_t;

int kvedge_engine_demote_stats(kvedge_engine_t *e, kvedge_engine_demote_stats_t *out);

/* What kvedge_engine_repair found and did. blocks_found = blocks_kept + blocks_lost. */
typedef struct {
    uint64_t blocks_found;    /* blocks the store named or held (tables, indexes, blob files) */
    uint64_t damaged_keys;    /* keys no put could have written (layer or head past the limits):
                                 damage to a key, not blocks; not counted in found */
    uint64_t blocks_kept;     /* blocks that passed the full check: in the repaired store */
    uint64_t blocks_lost;     /* blocks that did not: in its quarantine family */
    uint64_t from_blob_files; /* kept blocks RocksDB could not read, found in its blob files */
    uint64_t meta_rebuilt;    /* kept blocks whose metadata was unreadable: rebuilt from the block
                                 (not pinned, no expiry, accessed now) */
    uint64_t chunks_kept;     /* chunk records carried over */
    uint64_t chunks_rebuilt;  /* chunks of kept blocks whose record was unreadable: rebuilt from
                                 the blocks and the one model they fit (listed by no tenant) */
    uint64_t chunks_lost;     /* chunks of kept blocks with no record: their blocks are kept by
                                 key, but no layer of them is served */
    uint64_t models_kept;     /* model records carried over */
    uint64_t models_lost;     /* models named by kept chunks whose record was unreadable */
    uint64_t quarantine_kept; /* entries already in quarantine, carried over */
    uint64_t variants_kept;   /* variant records carried over */
    uint64_t
        variants_dropped; /* variant records dropped: unreadable, failing, or of a lost block */
    uint64_t table_files, blob_files, wal_files; /* what the store held before the repair */
    uint64_t data_bytes;                         /* their bytes (and the MANIFESTs') */
    bool rocksdb_repaired; /* RocksDB could not open the files: its own repair ran on a copy */
    bool rocksdb_aborted;  /* RocksDB aborted reading the damaged tables (an assertion of
                              librocksdb's): the blocks were taken from the blob files alone */
    bool damaged;   /* RocksDB's view was incomplete: blocks were also taken from the blob files */
    bool unchanged; /* the store was left as it was (nothing to repair, or the repair failed) */
    bool resumed;   /* an interrupted repair's verified store was put in place */
    char old_files[512]; /* where the damaged store's RocksDB files were moved */
} kvedge_repair_report_t;

/* Salvages a damaged store (the node stopped: it takes the store's lock). Never changes an
 * original file before a new store has been built and read back: the damaged store is read
 * through a working copy (dir/repair.work: table and blob files linked, the rest copied), so
 * neither RocksDB's open nor its repair touches what it reads. Every record RocksDB can still
 * read is read, every block checked as a get does (kvedge_block_check and its metadata), and a
 * new store of what passes is written into dir/repair.tmp. When RocksDB's view is incomplete
 * (it needed rocksdb_repair_db, or dropped table or blob files its MANIFEST does not name, or a
 * family could not be read whole), the blocks the blob files hold are taken too. A block
 * RocksDB cannot read is looked for in the blob files themselves (its newest copy that
 * passes, and matches its metadata when that is readable). Blocks that still fail are
 * quarantined in the new store (with their bytes when those could be read) and reported through
 * cb (may be NULL; a non-zero return stops the repair, leaving the store as it was) with their
 * error. The LRU and TTL indexes are rebuilt; unreadable metadata is rebuilt from its block;
 * unreadable chunk records are rebuilt when one known model fits the chunk's blocks. Variants
 * of kept blocks that pass the same check and are bound to the block kept are carried over.
 * The new store is then opened and verified block by block (it must hold every block kept);
 * only then are the old RocksDB files moved to dir/lost/repair-TIME/ and the new ones into dir
 * (a mark in dir/repair.tmp lets the next run finish a repair stopped there; the node refuses
 * to open meanwhile). A store with nothing to repair is left as it was (out->unchanged).
 * Needs free space for a copy of what is kept. Errors: KVEDGE_ENOTFOUND (no store),
 * KVEDGE_ELOCKED (in use), KVEDGE_EVERSION (written by a newer kvedge: left alone),
 * KVEDGE_ECORRUPT (the new store did not read back whole: not put in place), KVEDGE_EIO,
 * KVEDGE_ENOSPC, KVEDGE_ENOMEM, store errors; why receives a one-line reason. out may be NULL. */
int kvedge_engine_repair(const char *dir, kvedge_verify_cb cb, void *ctx,
                         kvedge_repair_report_t *out, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
