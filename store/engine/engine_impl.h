/* Private to the block engine's files (store/engine*.c): the engine struct, its column
 * families and record sizes, and the helpers those files share. Nothing else includes it.
 *
 * Naming: the static inline helpers keep the s_ prefix of file-local code (each file compiles
 * its own copy); the shared functions are kvedge_engine_* but internal, not part of
 * store/engine/engine.h. A "_locked" function runs under the lock its comment names. */
#ifndef KVEDGE_STORE_ENGINE_IMPL_H
#define KVEDGE_STORE_ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <rocksdb/c.h>
#include <xxhash.h>

#include "access/codec/byteorder.h"
#include "store/engine/engine.h"
#include "access/codec/error.h"
#include "store/engine/rocks.h"

/* Writers of one key serialize on one of these mutexes, picked by a hash of the key. */
#define S_STRIPES 64
/* Meta record: fixed 56 bytes, little-endian (see kvedge_engine_meta_pack). Version 1 for a
 * block as put; version 2 only for a demoted one (engine_demote.c), so that stores that never
 * demote stay readable by every kvedge. Both are read. */
#define S_META_VERSION         1
#define S_META_VERSION_DEMOTED 2
#define S_META_RECORD_BYTES    56
/* Prefix record: version 1, 104 fixed bytes followed by the model id (see
 * kvedge_engine_prefix_pack). */
#define S_PREFIX_VERSION     1
#define S_PREFIX_FIXED_BYTES 104
#define S_PREFIX_MAX_BYTES   (S_PREFIX_FIXED_BYTES + KVEDGE_MODEL_ID_MAX_BYTES)
/* LRU and TTL keys: time u64 big-endian | block key, so iteration runs oldest first. */
#define S_INDEX_KEY_BYTES (8 + KVEDGE_BLOCK_KEY_BYTES)
/* An exclusive upper bound for every block key starting with a given prefix. */
#define S_UPPER_BYTES (KVEDGE_BLOCK_KEY_BYTES + 1)
/* The longest blocks-family key a walk can step past when its value cannot be read. */
#define S_WALK_KEY_MAX 255
/* Variant records (engine_variant.c): key = block key | rung u8; value = the checksum of the
 * primary it was put against (u64 little-endian) | the encoded block. */
#define S_VARIANT_KEY_BYTES  (KVEDGE_BLOCK_KEY_BYTES + 1)
#define S_VARIANT_HEAD_BYTES 8
/* An exclusive upper bound for every variant key of one block key: block key | 0xFF 0xFF. */
#define S_VARIANT_UPPER_BYTES (KVEDGE_BLOCK_KEY_BYTES + 2)

/* The resumable walks of the LRU under capacity pressure: plain eviction (engine_evict.c), and
 * the pressure order's demotion and eviction of blocks not demoted (engine_demote.c). */
enum { S_WALK_LRU = 0, S_WALK_DEMOTE = 1, S_WALK_EVICT = 2, S_WALKS = 3 };

enum {
    S_CF_DEFAULT,
    S_CF_BLOCKS,
    S_CF_META,
    S_CF_LRU,
    S_CF_TTL,
    S_CF_PREFIXES,
    S_CF_MODELS,
    S_CF_QUARANTINE,
    S_CF_VARIANTS, /* last: a read-only open of a store older than variants goes without it */
    S_CF_COUNT
};

/* What kvedge_engine_load found for one key, before anyone acts on it. Rocksdb failures are
 * negative. */
enum {
    S_LOAD_OK = 0, /* meta and block present, the block verified against its meta */
    S_LOAD_MISSING,
    S_LOAD_BAD, /* block or meta unreadable, missing on one side, or disagreeing */
};

struct kvedge_engine_t {
    rocksdb_t *db;
    rocksdb_column_family_handle_t **handles; /* every family open, ours and foreign */
    size_t n_handles;
    /* Ours, borrowed from handles; cf[S_CF_VARIANTS] is NULL in a read-only open of a store
     * that never held variants (the family cannot be created then). */
    rocksdb_column_family_handle_t *cf[S_CF_COUNT];
    rocksdb_readoptions_t *ro; /* point lookups, RocksDB checksums on */
    /* Block reads (get, get_layer): RocksDB's own checksums off, since every block carries
     * its xxh3 and is checked against it and its meta on every read. */
    rocksdb_readoptions_t *ro_blk;
    rocksdb_writeoptions_t *wo; /* sync as opts.sync */
    rocksdb_cache_t *cache;     /* blob and table block cache; NULL when cache_bytes is 0 */
    bool salvage;             /* opened by repair: RocksDB's paranoid checks and compactions off */
    pthread_mutex_t scrub_mu; /* guards scrubbing */
    unsigned scrubbing;       /* verifies running: the cache is held empty meanwhile */
    kvedge_engine_opts_t opts;
    pthread_mutex_t stripes[S_STRIPES]; /* serialize writers of one key */
    pthread_mutex_t evict_mu;           /* one evictor at a time */
    pthread_mutex_t models_mu;          /* put_model check-then-write */
    /* Totals of what is stored, kept exact under the stripes. */
    _Atomic uint64_t blocks;
    _Atomic uint64_t bytes; /* primaries' encoded bytes */
    _Atomic uint64_t fp16_bytes;
    _Atomic uint64_t variant_blocks;
    _Atomic uint64_t variant_bytes; /* variants' encoded block bytes */
    _Atomic uint64_t used;          /* bytes + variant_bytes: what capacity bounds */
    _Atomic uint64_t pinned_blocks;
    _Atomic uint64_t pinned_bytes;
    _Atomic uint64_t quarantined;
    /* Counters since open. */
    _Atomic uint64_t puts;
    _Atomic uint64_t gets;
    _Atomic uint64_t hits;
    _Atomic uint64_t misses;
    _Atomic uint64_t corrupt;
    _Atomic uint64_t evicted_blocks;
    _Atomic uint64_t evicted_bytes;
    _Atomic uint64_t expired;
    _Atomic uint64_t bytes_written;
    _Atomic uint64_t bytes_read;
    /* Demotion (engine_demote.c): counters since open. */
    _Atomic uint64_t demoted;          /* every demotion, whatever asked for it */
    _Atomic uint64_t demoted_saved;    /* bytes they freed (primaries and dropped variants) */
    _Atomic uint64_t pressure_demoted; /* of those, demotions under capacity pressure */
    _Atomic uint64_t pressure_saved;
    _Atomic uint64_t pressure_vblocks; /* variant records dropped under capacity pressure */
    _Atomic uint64_t pressure_vbytes;
    /* Bumped by every unpin (it puts an LRU entry back at an old access time): the eviction
     * walks' resume points are dropped when it moved. */
    _Atomic uint64_t lru_epoch;
    /* Under evict_mu: where the eviction walks of the LRU resume (S_WALK_*); every entry before
     * one was found done (for the plain walk: evicted or stale; for the pressure walks:
     * demoted, not demotable, pinned or stale). Hints that save re-reading the LRU's head on
     * every put: a missed entry costs order, never totals. */
    uint8_t walk_at[S_WALKS][S_INDEX_KEY_BYTES];
    bool walk_at_set[S_WALKS];
    uint64_t walk_epoch; /* lru_epoch when the resume points were last valid */
    /* Disk space (engine_disk.c). */
    char *dir;                   /* the store directory */
    uint64_t reserve_bytes;      /* the reserve file's size; 0: none */
    uint64_t write_buffer_bytes; /* the blocks family's write buffer */
    uint64_t wal_bound_bytes;    /* max_total_wal_size */
    /* What blocks may take of opts.capacity_bytes: the rest is the WAL's, so that capacity
     * bounds the bytes on disk (0: no limit). */
    uint64_t block_capacity;
    _Atomic bool reserve_held;         /* the reserve file is on disk */
    _Atomic bool disk_full;            /* the last large write was refused for want of space */
    _Atomic bool write_failed;         /* a RocksDB write failed (no space, I/O): writes stopped */
    _Atomic uint64_t disk_refused;     /* writes refused for want of space */
    _Atomic uint64_t disk_compactions; /* compactions a refusal ran */
    _Atomic uint64_t compacted_at_ms;  /* the last (monotonic) */
    _Atomic uint64_t uncompacted;      /* block bytes deleted since the last compaction */
    _Atomic uint64_t reserve_releases;
    _Atomic uint64_t memtables_bytes; /* cached "rocksdb.cur-size-all-mem-tables", summed */
    _Atomic uint64_t memtables_at_ms; /* when read (monotonic) */
    _Atomic uint64_t admitted;        /* bytes let in since (in flight or in the memtables) */
};

/* ---------------------------------------------------------------- disk space
 * (engine_disk.c) */

/* Write-buffer bounds for a store in dir with capacity (0: none): the blocks family's write
 * buffer, the other families', and max_total_wal_size. */
void kvedge_engine_disk_bounds(const char *dir, uint64_t capacity, uint64_t *write_buffer,
                               uint64_t *small_write_buffer, uint64_t *wal);
/* Before RocksDB opens dir: gives the reserve file back when the disk is nearly full (the WAL's
 * replay flushes). */
void kvedge_engine_disk_before_open(const char *dir);
/* After the open: the reserve file made or found. 0 or KVEDGE_ENOMEM. */
int kvedge_engine_disk_open(kvedge_engine_t *e, const char *dir);
/* Whether a write batch of n bytes may go: KVEDGE_ENOSPC when it might not fit beside the
 * flush of what the memtables hold. Small batches (deletes) always go. */
int kvedge_engine_disk_admit(kvedge_engine_t *e, size_t n);
/* Compacts the blocks' index (blob references only: small), so that the blob files of deleted
 * and evicted blocks go back to the file system, when at least min_bytes of blocks were deleted
 * since the last compaction (false when skipped). */
bool kvedge_engine_disk_compact(kvedge_engine_t *e, uint64_t min_bytes);
/* Whether RocksDB has stopped writing: a write of ours failed, or a background flush or
 * compaction did ("rocksdb.background-errors"). */
bool kvedge_engine_disk_write_stopped(kvedge_engine_t *e);
/* Gives the reserve file back to the file system. */
void kvedge_engine_disk_release(kvedge_engine_t *e);
/* Whether the free space holds a flush of the memtables. */
bool kvedge_engine_disk_can_flush(kvedge_engine_t *e);
/* A RocksDB write failed with rc: notes it (writes have stopped) and gives the reserve back. */
void kvedge_engine_disk_failed(kvedge_engine_t *e, int rc);

/* ---------------------------------------------------------------- keys and records
 * (engine_record.c) */

static inline void s_index_key(uint64_t t, const uint8_t *kb, uint8_t out[S_INDEX_KEY_BYTES])
{
    kvedge_be_put64(out, t);
    memcpy(out + 8, kb, KVEDGE_BLOCK_KEY_BYTES);
}

/* Bound just past every block key that starts with prefix[0..n). */
static inline void s_upper(const uint8_t *prefix, size_t n, uint8_t out[S_UPPER_BYTES])
{
    memset(out, 0xff, S_UPPER_BYTES);
    memcpy(out, prefix, n);
}

void kvedge_engine_meta_pack(const kvedge_block_meta_t *m, uint8_t out[S_META_RECORD_BYTES]);
/* KVEDGE_ECORRUPT for a record that is not a version-1 meta record of sane values. */
int kvedge_engine_meta_unpack(const uint8_t *in, size_t len, kvedge_block_meta_t *m);
/* Returns the record's length. */
size_t kvedge_engine_prefix_pack(const kvedge_chunk_info_t *c, uint8_t out[S_PREFIX_MAX_BYTES]);
/* key is the chunk id the record is stored under. KVEDGE_ECORRUPT for a bad key or record. */
int kvedge_engine_prefix_unpack(const uint8_t *key, size_t klen, const uint8_t *in, size_t len,
                                kvedge_chunk_info_t *c);

/* ---------------------------------------------------------------- opening for repair
 * (engine.c) */

/* Repair builds its new store in dir/KVEDGE_REPAIR_TMP_DIR and, once it has read that store
 * back, writes KVEDGE_REPAIR_MARK_FILE there before it moves any file: a directory with the
 * mark is a repair to finish, which nothing else opens. */
#define KVEDGE_REPAIR_TMP_DIR   "repair.tmp"
#define KVEDGE_REPAIR_MARK_FILE "KVEDGE-REPAIR-VERIFIED"

enum {
    KVEDGE_STORE_DIR_NONE,      /* no RocksDB data files and no CURRENT: no store */
    KVEDGE_STORE_DIR_SOUND,     /* CURRENT names a MANIFEST that exists */
    KVEDGE_STORE_DIR_DAMAGED,   /* data files, and CURRENT missing or naming no MANIFEST */
    KVEDGE_STORE_DIR_REPAIRING, /* a verified repaired store waits to be put in place */
};

/* Whether a chunk record was rebuilt by repair from its blocks (tenant tag all 0xff). */
static inline bool kvedge_engine_chunk_rebuilt(const kvedge_chunk_info_t *c)
{
    for (size_t i = 0; i < sizeof c->tenant; i++)
        if (c->tenant[i] != 0xff)
            return false;
    return true;
}

/* Whether this process has opened a RocksDB database (its thread pools may then run). */
extern _Atomic bool kvedge_engine_rocksdb_started;

/* Classifies a store directory from its file names alone (RocksDB is not called). */
int kvedge_engine_dir_state(const char *dir);

/* A MANIFEST, table, blob or WAL file name: what holds a store's data. */
bool kvedge_engine_rocks_data_file(const char *name);

/* Opens the RocksDB database of a store for salvage (engine_repair.c): writable, missing
 * families created, RocksDB's paranoid checks and automatic compactions off (a table whose
 * own blocks are damaged still opens; reads from it fail one by one), no cache, and neither
 * the format record nor the totals read. Errors as kvedge_engine_open. */
int kvedge_engine_open_salvage(const char *dir, kvedge_engine_t **out, char *why, size_t why_len);

/* Reads the store's format version record (writing it when missing and the store writable):
 * 0, KVEDGE_EVERSION (a newer kvedge's), KVEDGE_ECORRUPT or a store error, with why. */
int kvedge_engine_check_format(kvedge_engine_t *e, char *why, size_t why_len);

/* ---------------------------------------------------------------- RocksDB boundary
 * (engine.c; errors translated by store/engine/rocks.h) */

/* The error of a write RocksDB refused (err set): translated, and a full disk or an I/O error
 * marks the engine's writes failed, as s_write does, so that a clean close does not use the
 * writer that failed (kvedge_engine_destroy). */
static inline int s_write_error(kvedge_engine_t *e, char **err)
{
    int rc = kvedge_rocks_error(err);
    kvedge_engine_disk_failed(e, rc);
    return rc;
}

static inline int s_write(kvedge_engine_t *e, rocksdb_writebatch_t *b)
{
    size_t n = 0;
    (void)rocksdb_writebatch_data(b, &n);
    int rc = kvedge_engine_disk_admit(e, n);
    if (rc != KVEDGE_OK)
        return rc;
    char *err = NULL;
    rocksdb_write(e->db, e->wo, b, &err);
    if (!err)
        return KVEDGE_OK;
    return s_write_error(e, &err);
}

/* Registers one stored record of the models family (either key layout: a node-wide id, or a
 * tenant's NUL | tag | id) in e, as kvedge_engine_put_tenant_model does; repair carries
 * records over with it. Returns KVEDGE_ECORRUPT for a record that does not parse, else as
 * kvedge_engine_put_tenant_model. */
int kvedge_engine_model_restore(kvedge_engine_t *e, const void *k, size_t klen, const void *v,
                                size_t vlen);

/* Zero-copy point lookup under ro. Returns 0 with *out set, KVEDGE_ENOTFOUND, or a store
 * error (KVEDGE_ECORRUPT for a value RocksDB cannot read back intact). */
int kvedge_engine_pget(kvedge_engine_t *e, const rocksdb_readoptions_t *ro, int cf, const void *key,
                       size_t klen, rocksdb_pinnableslice_t **out);

static inline int s_pget(kvedge_engine_t *e, int cf, const void *key, size_t klen,
                         rocksdb_pinnableslice_t **out)
{
    return kvedge_engine_pget(e, e->ro, cf, key, klen, out);
}

static inline const uint8_t *s_pval(const rocksdb_pinnableslice_t *p, size_t *len)
{
    return (const uint8_t *)rocksdb_pinnableslice_value(p, len);
}

/* The meta record of one block key: 0, KVEDGE_ENOTFOUND, KVEDGE_ECORRUPT or a store error. */
int kvedge_engine_read_meta(kvedge_engine_t *e, const uint8_t *kb, kvedge_block_meta_t *m);

/* Iterator over [lower, upper) of one family; upper must outlive the iterator. Either bound
 * may be NULL. Close with kvedge_engine_iter_close. */
rocksdb_iterator_t *kvedge_engine_iter(kvedge_engine_t *e, int cf, const void *lower, size_t llen,
                                       const void *upper, size_t ulen, rocksdb_readoptions_t **ro);

/* Iterator over one family's keys of chunk id (every key that starts with its 32 bytes); upper
 * receives the bound and must outlive the iterator. */
static inline rocksdb_iterator_t *kvedge_engine_chunk_iter(kvedge_engine_t *e, int cf,
                                                           const kvedge_chunk_id_t *id,
                                                           uint8_t upper[S_UPPER_BYTES],
                                                           rocksdb_readoptions_t **ro)
{
    s_upper(id->bytes, KVEDGE_CHUNK_ID_BYTES, upper);
    return kvedge_engine_iter(e, cf, id->bytes, KVEDGE_CHUNK_ID_BYTES, upper, S_UPPER_BYTES, ro);
}

/* Closes an iterator, returning its error if it stopped on one (else rc unchanged). */
int kvedge_engine_iter_close(rocksdb_iterator_t *it, rocksdb_readoptions_t *ro, int rc);

/* ---------------------------------------------------------------- block walks
 * (engine_walk.c) */

/* Keys of the blocks family in key order, each with its value where RocksDB can read it back.
 * A damaged blob record ends a plain iterator for good (invalid, with a Corruption status), and
 * it does not say at which key; a walk finds that key, yields it with no value and goes on past
 * it, so one damaged value costs one block, never the rest of a scan. */
typedef struct {
    kvedge_engine_t *e;
    const rocksdb_snapshot_t *snap; /* every read of the walk, probes included, sees this */
    bool own_snap;                  /* taken by the walk, released by kvedge_engine_walk_close */
    bool check;                     /* RocksDB verifies its checksums on every read */
    bool fill;                      /* values read enter the cache */
    rocksdb_readoptions_t *ro;      /* the iterator's: snapshot and upper bound */
    rocksdb_readoptions_t *pro;     /* point reads: snapshot only */
    rocksdb_iterator_t *it;
    const uint8_t *upper; /* exclusive bound, NULL for none; outlives the walk */
    size_t ulen;
    uint8_t key[S_WALK_KEY_MAX + 1]; /* the current key (room for a 0x00 to step past it) */
    size_t klen;                     /* its length, even when too long to keep */
    bool valid;
    bool unreadable; /* the current key's value could not be read */
    int err;         /* the store error that ended the walk early, else 0 */
} kvedge_engine_walk_t;

/* Starts a walk over [lower, upper) of the blocks family (either may be NULL; upper must
 * outlive the walk) under snap, or a snapshot of its own when snap is NULL. With check,
 * RocksDB verifies its own checksums (so a damaged blob record header fails its key); with
 * fill, the values read enter the cache. */
void kvedge_engine_walk_open(kvedge_engine_walk_t *w, kvedge_engine_t *e,
                             const rocksdb_snapshot_t *snap, const uint8_t *lower, size_t llen,
                             const uint8_t *upper, size_t ulen, bool check, bool fill);
const uint8_t *kvedge_engine_walk_key(const kvedge_engine_walk_t *w, size_t *klen);
/* The current value, valid until the walk moves; NULL when it could not be read. */
const uint8_t *kvedge_engine_walk_value(const kvedge_engine_walk_t *w, size_t *vlen);
void kvedge_engine_walk_next(kvedge_engine_walk_t *w);
/* Ends a walk; returns rc, or the store error that ended the walk when rc is not negative. */
int kvedge_engine_walk_close(kvedge_engine_walk_t *w, int rc);

/* ---------------------------------------------------------------- variants
 * (engine_variant.c) */

/* The variants of one block as they leave the store together. */
typedef struct {
    uint64_t n;     /* records */
    uint64_t bytes; /* their block bytes, as variant_bytes counts them */
} kvedge_engine_vset_t;

/* Writes the variant record at vk: the primary's checksum (what binds the variant to it) and
 * the block, in one put. 0 or the write's error. */
static inline int s_variant_write(kvedge_engine_t *e, const uint8_t vk[S_VARIANT_KEY_BYTES],
                                  uint64_t primary_checksum, const uint8_t *block, size_t len)
{
    uint8_t head[S_VARIANT_HEAD_BYTES];
    kvedge_le_put64(head, primary_checksum);
    const char *keys[1] = {(const char *)vk};
    size_t key_sizes[1] = {S_VARIANT_KEY_BYTES};
    const char *parts[2] = {(const char *)head, (const char *)block};
    size_t part_sizes[2] = {sizeof head, len};
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    rocksdb_writebatch_putv_cf(b, e->cf[S_CF_VARIANTS], 1, keys, key_sizes, 2, parts, part_sizes);
    int rc = s_write(e, b);
    rocksdb_writebatch_destroy(b);
    return rc;
}

/* Block bytes a variant record of vlen bytes counts for. */
static inline uint64_t s_variant_bytes(size_t vlen)
{
    return vlen > S_VARIANT_HEAD_BYTES ? (uint64_t)(vlen - S_VARIANT_HEAD_BYTES) : 0;
}

/* Whether a variant record (value vlen bytes at v) of rung prec is sound and bound to the
 * primary whose meta is m: 0, KVEDGE_ECORRUPT, or KVEDGE_ENOMEM (no verdict). */
int kvedge_engine_check_variant(const uint8_t *v, size_t vlen, kvedge_prec_t prec,
                                const kvedge_block_meta_t *m);

/* Under kb's stripe: adds to b the deletion of every variant record of kb (bound to any
 * primary, or to none); *vs receives what they count. 0 or a store error. */
int kvedge_engine_batch_drop_variants(rocksdb_writebatch_t *b, kvedge_engine_t *e,
                                      const uint8_t *kb, kvedge_engine_vset_t *vs);

/* Totals once the batch that dropped vs is written. */
void kvedge_engine_variants_gone(kvedge_engine_t *e, const kvedge_engine_vset_t *vs);

/* At open: adds every variant record to the totals. */
int kvedge_engine_load_variant_totals(kvedge_engine_t *e);

/* The variant half of kvedge_engine_verify (bad ones reported under their primary's key);
 * adds to *checked and *bad. Records bound to no live primary are dropped with quarantine. */
int kvedge_engine_verify_variants(kvedge_engine_t *e, bool quarantine, kvedge_verify_cb cb,
                                  void *ctx, uint64_t *checked, uint64_t *bad);

/* Drops the variant records of one chunk whose primary is gone (delete_chunk, after its
 * blocks). */
int kvedge_engine_drop_chunk_variants(kvedge_engine_t *e, const kvedge_chunk_id_t *id);

/* ---------------------------------------------------------------- the read path's pieces
 * (engine_io.c) */

/* Gives v a malloc'd buffer: kvedge_value_release frees it. */
void kvedge_engine_value_own(kvedge_value_t *v, uint8_t *buf, size_t len);

/* Reads and verifies one primary as kvedge_engine_get does (quarantine, expiry, atime), without
 * counting it in the get statistics. 0 with *blk and *m (its meta), KVEDGE_ENOTFOUND,
 * KVEDGE_ECORRUPT (quarantined, variants with it) or a store error. */
int kvedge_engine_read_primary(kvedge_engine_t *e, const uint8_t *kb, uint64_t now,
                               kvedge_block_meta_t *m, rocksdb_pinnableslice_t **blk);

/* kvedge_block_transcode of a verified block of kb to rung `to`, with lz4 where it pays; a
 * transform-coded rung (KVEDGE_PREC_TC) is coded with the basis of the model the chunk record
 * of kb names, at kb's layer and head (kvedge_block_transcode_at). KVEDGE_ENOBASIS when this
 * process holds no basis of that model, or kb's chunk has no record to name it; otherwise the
 * errors of those calls. */
int kvedge_engine_transcode(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_info_t *info,
                            kvedge_prec_t to, uint8_t **out, size_t *out_len);

/* Records an access of the primary at kb if its meta still is seen (same checksum and size)
 * and wants a refresh; takes the stripe. Best effort. */
void kvedge_engine_touch(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_meta_t *seen,
                         uint64_t now);

/* Bytes stored (used) may grow by delta only while within capacity; a delta <= 0 always
 * succeeds. With no capacity it always succeeds. */
bool kvedge_engine_reserve(kvedge_engine_t *e, int64_t delta);

/* One step of a write's reserve-or-evict loop, the caller holding stripe s: reserves delta
 * (returns KVEDGE_OK: write now), or makes room and returns 1 (the stripe was dropped: re-read
 * the key and try again). Lock order is evict_mu, then one stripe at a time: the first miss
 * takes evict_mu (*evicting), each later one evicts down to cap - delta, sparing kb, with the
 * stripe dropped; a pass that freed nothing after one that ran out (*exhausted) gives
 * KVEDGE_EFULL; an eviction error is returned. The caller unlocks evict_mu when *evicting. */
int kvedge_engine_make_room(kvedge_engine_t *e, unsigned s, int64_t delta, uint64_t cap,
                            const uint8_t *kb, bool *evicting, bool *exhausted);

/* ---------------------------------------------------------------- time, stripes, totals */

static inline uint64_t s_now(const kvedge_engine_t *e)
{
    if (e->opts.clock_ms)
        return e->opts.clock_ms(e->opts.clock_ctx);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline unsigned s_stripe_of(const uint8_t *kb)
{
    return (unsigned)(XXH3_64bits(kb, KVEDGE_BLOCK_KEY_BYTES) % S_STRIPES);
}

static inline void s_lock(kvedge_engine_t *e, unsigned s)
{
    pthread_mutex_lock(&e->stripes[s]);
}

static inline void s_unlock(kvedge_engine_t *e, unsigned s)
{
    pthread_mutex_unlock(&e->stripes[s]);
}

/* Iterator over kb's variant keys (from kb to kb | 0xFF 0xFF); upper receives the bound and
 * must outlive the iterator. Close with kvedge_engine_iter_close. */
static inline rocksdb_iterator_t *kvedge_variant_iter(kvedge_engine_t *e, const uint8_t *kb,
                                                      uint8_t upper[S_VARIANT_UPPER_BYTES],
                                                      rocksdb_readoptions_t **ro)
{
    memcpy(upper, kb, KVEDGE_BLOCK_KEY_BYTES);
    upper[KVEDGE_BLOCK_KEY_BYTES] = 0xff;
    upper[KVEDGE_BLOCK_KEY_BYTES + 1] = 0xff;
    return kvedge_engine_iter(e, S_CF_VARIANTS, kb, KVEDGE_BLOCK_KEY_BYTES, upper,
                              S_VARIANT_UPPER_BYTES, ro);
}

static inline void s_add(_Atomic uint64_t *a, uint64_t v)
{
    atomic_fetch_add_explicit(a, v, memory_order_relaxed);
}

static inline void s_sub(_Atomic uint64_t *a, uint64_t v)
{
    atomic_fetch_sub_explicit(a, v, memory_order_relaxed);
}

static inline uint64_t s_get(_Atomic uint64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

/* Totals of one block entering or leaving the store; bytes (and used) too when with_bytes (a
 * put moves bytes itself, by reservation). */
void kvedge_engine_totals(kvedge_engine_t *e, const kvedge_block_meta_t *m, bool add,
                          bool with_bytes);

static inline bool s_expired(const kvedge_block_meta_t *m, uint64_t now)
{
    return !m->pinned && m->expires_ms != 0 && now >= m->expires_ms;
}

static inline bool s_needs_touch(const kvedge_engine_t *e, const kvedge_block_meta_t *m,
                                 uint64_t now)
{
    return now >= m->atime_ms && now - m->atime_ms >= e->opts.atime_granularity_ms;
}

/* ---------------------------------------------------------------- verification and
 * quarantine (engine_verify.c) */

/* Checks a block's bytes against itself (kvedge_block_check: parsed, checksum, lz4 body
 * decompressed) and against its metadata: the one check of get, get_layer, verify and
 * repair, so they agree on every block. Returns 0, a codec error, KVEDGE_ECORRUPT for a
 * disagreement, or KVEDGE_ENOMEM (no verdict). */
int kvedge_engine_check_block(const uint8_t *data, size_t len, const kvedge_block_meta_t *m);

/* Reads meta and block of one key and verifies them. On S_LOAD_OK, *blk holds the block; on
 * S_LOAD_BAD it may hold the bad bytes (or be NULL: missing, or a value RocksDB cannot read
 * back, such as a damaged blob record) and *meta_ok says whether meta is usable; *why (may be
 * NULL) receives the specific failure. Negative: a store error. The block is read with
 * RocksDB's own checksums only when scrub (verify); reads rely on the block's xxh3. */
int kvedge_engine_load(kvedge_engine_t *e, const uint8_t *kb, kvedge_block_meta_t *meta,
                       bool *meta_ok, rocksdb_pinnableslice_t **blk, int *why, bool scrub);

/* Under the key's stripe: moves a bad block's bytes to quarantine and drops it. */
int kvedge_engine_quarantine_locked(kvedge_engine_t *e, const uint8_t *kb,
                                    const kvedge_block_meta_t *m,
                                    const rocksdb_pinnableslice_t *blk);

/* ---------------------------------------------------------------- dropping and evicting
 * blocks (engine_evict.c) */

/* Under the key's stripe: adds to b the deletion of a block and everything that indexes it
 * (m NULL: meta unusable, only the block and meta records), its variants included (*vs
 * receives what they count: apply it with kvedge_engine_variants_gone once b is written).
 * Returns 0 or a store error (the variants could not be listed: write nothing). */
int kvedge_engine_batch_drop(rocksdb_writebatch_t *b, kvedge_engine_t *e, const uint8_t *kb,
                             const kvedge_block_meta_t *m, kvedge_engine_vset_t *vs);

/* Under the key's stripe: deletes a block whose meta is m (NULL: meta unusable, totals do not
 * count it) with its variants; the _vs form tells what the variants counted (vs may be NULL). */
int kvedge_engine_drop_locked(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_meta_t *m);
int kvedge_engine_drop_locked_vs(kvedge_engine_t *e, const uint8_t *kb,
                                 const kvedge_block_meta_t *m, kvedge_engine_vset_t *vs);

/* Under evict_mu: frees space until used <= target, skipping the key `keep` (may be NULL):
 * by plain LRU eviction, or in the pressure order when opts.pressure_demote is set
 * (kvedge_engine_pressure_locked). Takes each victim's stripe in turn; the caller holds none.
 * *n_out counts blocks evicted, *bytes_out every byte freed. Returns 0, KVEDGE_EFULL when
 * nothing was left to free first, or a store error. */
int kvedge_engine_evict_locked(kvedge_engine_t *e, uint64_t target, const uint8_t *keep,
                               uint64_t *n_out, uint64_t *bytes_out);

/* Under evict_mu: plain LRU eviction of unpinned blocks, oldest first, as
 * kvedge_engine_evict_locked. It resumes where the last walk stopped and walks from the LRU's
 * start only when that runs out, so a put over capacity does not re-read every entry dropped
 * since the last flush. */
int kvedge_engine_evict_lru_locked(kvedge_engine_t *e, uint64_t target, const uint8_t *keep,
                                   uint64_t *n_out, uint64_t *bytes_out);

/* ---------------------------------------------------------------- demotion
 * (engine_demote.c) */

/* Under evict_mu: the pressure order (store/engine/engine.h, "Demotion"): drop variants, demote the
 * least recently used blocks not demoted to opts.pressure_demote, evict blocks not demoted,
 * then demoted ones, each step until used <= target. As kvedge_engine_evict_locked. */
int kvedge_engine_pressure_locked(kvedge_engine_t *e, uint64_t target, const uint8_t *keep,
                                  uint64_t *n_out, uint64_t *bytes_out);

/* ---------------------------------------------------------------- chunks (engine_scan.c) */

/* The stored record of one chunk: 0, KVEDGE_ENOTFOUND, KVEDGE_ECORRUPT or a store error. */
int kvedge_engine_read_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id,
                             kvedge_chunk_info_t *out);

#endif
