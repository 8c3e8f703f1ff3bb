/* The block engine: kvedge blocks, their metadata, LRU and TTL indexes, prefix records and
 * model shapes in RocksDB column families, behind the contract of store/engine.h. */
#include "store/engine.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <rocksdb/c.h>
#include <xxhash.h>

#include "store/byteorder.h"
#include "store/error.h"

/* Writers of one key serialize on one of these mutexes, picked by a hash of the key. */
#define S_STRIPES 64
/* Meta record: version 1, fixed 56 bytes, little-endian (see s_meta_pack). */
#define S_META_VERSION      1
#define S_META_RECORD_BYTES 56
/* Prefix record: version 1, 104 fixed bytes followed by the model id (see s_prefix_pack). */
#define S_PREFIX_VERSION     1
#define S_PREFIX_FIXED_BYTES 104
#define S_PREFIX_MAX_BYTES   (S_PREFIX_FIXED_BYTES + KVEDGE_MODEL_ID_MAX_BYTES)
/* LRU and TTL keys: time u64 big-endian | block key, so iteration runs oldest first. */
#define S_INDEX_KEY_BYTES (8 + KVEDGE_BLOCK_KEY_BYTES)
/* An exclusive upper bound for every block key starting with a given prefix. */
#define S_UPPER_BYTES (KVEDGE_BLOCK_KEY_BYTES + 1)
#define S_FORMAT_KEY  "kvedge.format"
/* The longest blocks-family key a walk can step past when its value cannot be read. */
#define S_WALK_KEY_MAX 255
/* The cache is split in shards of at least this much (at most 64 shards): an LRU shard
 * evicts on its own, so it must hold many of the largest blocks at once. */
#define S_CACHE_SHARD_MIN_BYTES (256ull << 20)
#define S_CACHE_SHARD_BITS_MAX  6

enum {
    S_CF_DEFAULT,
    S_CF_BLOCKS,
    S_CF_META,
    S_CF_LRU,
    S_CF_TTL,
    S_CF_PREFIXES,
    S_CF_MODELS,
    S_CF_QUARANTINE,
    S_CF_COUNT
};

static const char *const s_cf_names[S_CF_COUNT] = {
    "default", "blocks", "meta", "lru", "ttl", "prefixes", "models", "quarantine",
};

/* What s_load found for one key, before anyone acts on it. Rocksdb failures are negative. */
enum {
    S_LOAD_OK = 0, /* meta and block present, the block verified against its meta */
    S_LOAD_MISSING,
    S_LOAD_BAD, /* block or meta unreadable, missing on one side, or disagreeing */
};

struct kvedge_engine_t {
    rocksdb_t *db;
    rocksdb_column_family_handle_t **handles; /* every family open, ours and foreign */
    size_t n_handles;
    rocksdb_column_family_handle_t *cf[S_CF_COUNT]; /* ours, borrowed from handles */
    rocksdb_readoptions_t *ro;                      /* point lookups, RocksDB checksums on */
    /* Block reads (get, get_layer): RocksDB's own checksums off, since every block carries
     * its xxh3 and is checked against it and its meta on every read. */
    rocksdb_readoptions_t *ro_blk;
    rocksdb_writeoptions_t *wo; /* sync as opts.sync */
    rocksdb_cache_t *cache;     /* blob and table block cache; NULL when cache_bytes is 0 */
    pthread_mutex_t scrub_mu;   /* guards scrubbing */
    unsigned scrubbing;         /* verifies running: the cache is held empty meanwhile */
    kvedge_engine_opts_t opts;
    pthread_mutex_t stripes[S_STRIPES]; /* serialize writers of one key */
    pthread_mutex_t evict_mu;           /* one evictor at a time */
    pthread_mutex_t models_mu;          /* put_model check-then-write */
    /* Totals of what is stored, kept exact under the stripes. */
    _Atomic uint64_t blocks;
    _Atomic uint64_t bytes;
    _Atomic uint64_t fp16_bytes;
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
};

/* ---------------------------------------------------------------- keys and records */

static void s_index_key(uint64_t t, const uint8_t *kb, uint8_t out[S_INDEX_KEY_BYTES])
{
    kvedge_be_put64(out, t);
    memcpy(out + 8, kb, KVEDGE_BLOCK_KEY_BYTES);
}

/* Bound just past every block key that starts with prefix[0..n). */
static void s_upper(const uint8_t *prefix, size_t n, uint8_t out[S_UPPER_BYTES])
{
    memset(out, 0xff, S_UPPER_BYTES);
    memcpy(out, prefix, n);
}

/* Layout: version u8, dtype u8, scheme u8, flags u8 (1 lz4, 2 pinned), bytes u32, tokens u32,
 * head_dim u16, key_channels u16, group_size u16, zero u16, zero u32, checksum u64,
 * created u64, atime u64, expires u64. */
static void s_meta_pack(const kvedge_block_meta_t *m, uint8_t out[S_META_RECORD_BYTES])
{
    memset(out, 0, S_META_RECORD_BYTES);
    out[0] = S_META_VERSION;
    out[1] = (uint8_t)m->dtype;
    out[2] = (uint8_t)m->scheme;
    out[3] = (uint8_t)((m->lz4 ? 1 : 0) | (m->pinned ? 2 : 0));
    kvedge_le_put32(out + 4, m->bytes);
    kvedge_le_put32(out + 8, m->tokens);
    kvedge_le_put16(out + 12, m->head_dim);
    kvedge_le_put16(out + 14, m->key_channels);
    kvedge_le_put16(out + 16, m->group_size);
    kvedge_le_put64(out + 24, m->checksum);
    kvedge_le_put64(out + 32, m->created_ms);
    kvedge_le_put64(out + 40, m->atime_ms);
    kvedge_le_put64(out + 48, m->expires_ms);
}

static int s_meta_unpack(const uint8_t *in, size_t len, kvedge_block_meta_t *m)
{
    if (len != S_META_RECORD_BYTES || in[0] != S_META_VERSION || (in[3] & ~3u) != 0 ||
        kvedge_le_get16(in + 18) != 0 || kvedge_le_get32(in + 20) != 0)
        return KVEDGE_ECORRUPT;
    memset(m, 0, sizeof *m);
    m->dtype = (kvedge_dtype_t)in[1];
    m->scheme = (kvedge_scheme_t)in[2];
    m->lz4 = (in[3] & 1) != 0;
    m->pinned = (in[3] & 2) != 0;
    m->bytes = kvedge_le_get32(in + 4);
    m->tokens = kvedge_le_get32(in + 8);
    m->head_dim = kvedge_le_get16(in + 12);
    m->key_channels = kvedge_le_get16(in + 14);
    m->group_size = kvedge_le_get16(in + 16);
    m->checksum = kvedge_le_get64(in + 24);
    m->created_ms = kvedge_le_get64(in + 32);
    m->atime_ms = kvedge_le_get64(in + 40);
    m->expires_ms = kvedge_le_get64(in + 48);
    if (kvedge_dtype_size(m->dtype) == 0 || m->scheme > KVEDGE_SCHEME_INT4 ||
        m->bytes < KVEDGE_BLOCK_HEADER_BYTES + KVEDGE_BLOCK_CHECKSUM_BYTES ||
        m->bytes > KVEDGE_BLOCK_MAX_BYTES || m->tokens == 0 ||
        m->tokens > KVEDGE_BLOCK_MAX_TOKENS || m->head_dim == 0 ||
        m->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM || m->key_channels > m->head_dim)
        return KVEDGE_ECORRUPT;
    return KVEDGE_OK;
}

/* Layout: version u8, flags u8 (1 has_parent), model id length u16, index u32, tokens u32,
 * zero u32, created u64, parent id (32 bytes), tenant tag (16), client name (32), model id
 * (no terminator). */
static size_t s_prefix_pack(const kvedge_chunk_info_t *c, uint8_t out[S_PREFIX_MAX_BYTES])
{
    size_t mlen = strlen(c->model_id);
    memset(out, 0, S_PREFIX_FIXED_BYTES);
    out[0] = S_PREFIX_VERSION;
    out[1] = c->has_parent ? 1 : 0;
    kvedge_le_put16(out + 2, (uint16_t)mlen);
    kvedge_le_put32(out + 4, c->index);
    kvedge_le_put32(out + 8, c->tokens);
    kvedge_le_put64(out + 16, c->created_ms);
    if (c->has_parent)
        memcpy(out + 24, c->parent.bytes, KVEDGE_CHUNK_ID_BYTES);
    static const uint8_t zero[KVEDGE_CHUNK_ID_BYTES];
    bool named = memcmp(c->name.bytes, zero, sizeof zero) != 0;
    memcpy(out + 56, c->tenant, 16);
    memcpy(out + 72, named ? c->name.bytes : c->id.bytes, KVEDGE_CHUNK_ID_BYTES);
    memcpy(out + S_PREFIX_FIXED_BYTES, c->model_id, mlen);
    return S_PREFIX_FIXED_BYTES + mlen;
}

static int s_prefix_unpack(const uint8_t *key, size_t klen, const uint8_t *in, size_t len,
                           kvedge_chunk_info_t *c)
{
    static const uint8_t zero[KVEDGE_CHUNK_ID_BYTES];
    if (klen != KVEDGE_CHUNK_ID_BYTES || len < S_PREFIX_FIXED_BYTES || in[0] != S_PREFIX_VERSION ||
        (in[1] & ~1u) != 0 || kvedge_le_get32(in + 12) != 0)
        return KVEDGE_ECORRUPT;
    size_t mlen = kvedge_le_get16(in + 2);
    if (mlen == 0 || mlen > KVEDGE_MODEL_ID_MAX_BYTES || len != S_PREFIX_FIXED_BYTES + mlen ||
        memchr(in + S_PREFIX_FIXED_BYTES, 0, mlen) != NULL)
        return KVEDGE_ECORRUPT;
    memset(c, 0, sizeof *c);
    memcpy(c->id.bytes, key, KVEDGE_CHUNK_ID_BYTES);
    c->has_parent = (in[1] & 1) != 0;
    c->index = kvedge_le_get32(in + 4);
    c->tokens = kvedge_le_get32(in + 8);
    c->created_ms = kvedge_le_get64(in + 16);
    memcpy(c->parent.bytes, in + 24, KVEDGE_CHUNK_ID_BYTES);
    memcpy(c->tenant, in + 56, 16);
    memcpy(c->name.bytes, in + 72, KVEDGE_CHUNK_ID_BYTES);
    memcpy(c->model_id, in + S_PREFIX_FIXED_BYTES, mlen);
    if (c->tokens == 0 || c->tokens > KVEDGE_CHUNK_TOKENS_MAX ||
        (!c->has_parent && memcmp(c->parent.bytes, zero, sizeof zero) != 0))
        return KVEDGE_ECORRUPT;
    return KVEDGE_OK;
}

/* A model id arrives as a key: check it and make it a C string. */
static int s_model_from_kv(const char *k, size_t klen, const char *v, size_t vlen,
                           kvedge_model_t *out)
{
    char id[KVEDGE_MODEL_ID_MAX_BYTES + 1];
    if (klen == 0 || klen > KVEDGE_MODEL_ID_MAX_BYTES || memchr(k, 0, klen) != NULL)
        return KVEDGE_ECORRUPT;
    memcpy(id, k, klen);
    id[klen] = '\0';
    return kvedge_model_unpack(id, (const uint8_t *)v, vlen, out);
}

/* ---------------------------------------------------------------- RocksDB boundary */

/* Turns a RocksDB error message into a kvedge code; frees it and resets the pointer. */
static int s_rerr(char **err)
{
    int rc = KVEDGE_ESTORE;
    if (strstr(*err, "Corruption") != NULL)
        rc = KVEDGE_ECORRUPT;
    else if (strstr(*err, "IO error") != NULL)
        rc = KVEDGE_EIO;
    rocksdb_free(*err);
    *err = NULL;
    return rc;
}

static int s_write(kvedge_engine_t *e, rocksdb_writebatch_t *b)
{
    char *err = NULL;
    rocksdb_write(e->db, e->wo, b, &err);
    return err ? s_rerr(&err) : KVEDGE_OK;
}

/* Zero-copy point lookup under ro. Returns 0 with *out set, KVEDGE_ENOTFOUND, or a store
 * error (KVEDGE_ECORRUPT for a value RocksDB cannot read back intact). */
static int s_pget_ro(kvedge_engine_t *e, const rocksdb_readoptions_t *ro, int cf, const void *key,
                     size_t klen, rocksdb_pinnableslice_t **out)
{
    char *err = NULL;
    *out = rocksdb_get_pinned_cf(e->db, ro, e->cf[cf], key, klen, &err);
    if (err) {
        if (*out)
            rocksdb_pinnableslice_destroy(*out);
        *out = NULL;
        return s_rerr(&err);
    }
    return *out ? KVEDGE_OK : KVEDGE_ENOTFOUND;
}

static int s_pget(kvedge_engine_t *e, int cf, const void *key, size_t klen,
                  rocksdb_pinnableslice_t **out)
{
    return s_pget_ro(e, e->ro, cf, key, klen, out);
}

static const uint8_t *s_pval(const rocksdb_pinnableslice_t *p, size_t *len)
{
    return (const uint8_t *)rocksdb_pinnableslice_value(p, len);
}

static int s_get_meta(kvedge_engine_t *e, const uint8_t *kb, kvedge_block_meta_t *m)
{
    rocksdb_pinnableslice_t *p;
    int rc = s_pget(e, S_CF_META, kb, KVEDGE_BLOCK_KEY_BYTES, &p);
    if (rc != KVEDGE_OK)
        return rc;
    size_t len;
    const uint8_t *v = s_pval(p, &len);
    rc = s_meta_unpack(v, len, m);
    rocksdb_pinnableslice_destroy(p);
    return rc;
}

/* Iterator over [lower, upper) of one family; upper must outlive the iterator. */
static rocksdb_iterator_t *s_iter(kvedge_engine_t *e, int cf, const void *lower, size_t llen,
                                  const void *upper, size_t ulen, rocksdb_readoptions_t **ro)
{
    *ro = rocksdb_readoptions_create();
    if (upper)
        rocksdb_readoptions_set_iterate_upper_bound(*ro, upper, ulen);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(e->db, *ro, e->cf[cf]);
    if (lower)
        rocksdb_iter_seek(it, lower, llen);
    else
        rocksdb_iter_seek_to_first(it);
    return it;
}

/* Closes an iterator, returning its error if it stopped on one (else rc unchanged). */
static int s_iter_close(rocksdb_iterator_t *it, rocksdb_readoptions_t *ro, int rc)
{
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    if (err) {
        int ierr = s_rerr(&err);
        if (rc >= 0)
            rc = ierr;
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc;
}

/* ---------------------------------------------------------------- block walks */

/* What one probe of the blocks family found in [from, upper). */
enum { S_PROBE_EMPTY, S_PROBE_FAILS, S_PROBE_READS };

/* Keys of the blocks family in key order, each with its value where RocksDB can read it back.
 * A damaged blob record ends a plain iterator for good (invalid, with a Corruption status), and
 * it does not say at which key; a walk finds that key, yields it with no value and goes on past
 * it, so one damaged value costs one block, never the rest of a scan. */
typedef struct {
    kvedge_engine_t *e;
    const rocksdb_snapshot_t *snap; /* every read of the walk, probes included, sees this */
    bool own_snap;                  /* taken by the walk, released by s_walk_close */
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
} s_walk_t;

/* Read options for one read of a walk: its snapshot, checksum and cache policy. */
static rocksdb_readoptions_t *s_walk_ro(const s_walk_t *w)
{
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_snapshot(ro, w->snap);
    rocksdb_readoptions_set_verify_checksums(ro, w->check);
    rocksdb_readoptions_set_fill_cache(ro, w->fill);
    return ro;
}

/* Probes [from, upper) under the walk's snapshot: empty, or its first key fails or reads.
 * Upper bounds are checked before a value is fetched, so only the first key decides. */
static int s_probe(s_walk_t *w, const uint8_t *from, size_t flen, const uint8_t *upper, size_t ulen)
{
    rocksdb_readoptions_t *ro = s_walk_ro(w);
    rocksdb_readoptions_set_iterate_upper_bound(ro, (const char *)upper, ulen);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(w->e->db, ro, w->e->cf[S_CF_BLOCKS]);
    rocksdb_iter_seek(it, (const char *)from, flen);
    int rc = S_PROBE_READS;
    if (!rocksdb_iter_valid(it)) {
        char *err = NULL;
        rocksdb_iter_get_error(it, &err);
        rc = S_PROBE_EMPTY;
        if (err)
            rc = s_rerr(&err) == KVEDGE_ECORRUPT ? S_PROBE_FAILS : S_PROBE_READS;
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc;
}

/* Whether key holds a block whose value cannot be read back intact. */
static bool s_unreadable(s_walk_t *w, const uint8_t *key, size_t klen)
{
    rocksdb_pinnableslice_t *p;
    int rc = s_pget_ro(w->e, w->pro, S_CF_BLOCKS, key, klen, &p);
    if (p)
        rocksdb_pinnableslice_destroy(p);
    return rc == KVEDGE_ECORRUPT;
}

/* The first key at or past from, known to fail: most blocks have metadata, so each meta key
 * past from is tried (no block before it, and it fails); a block without one is found by
 * bisection, one byte of the key at a time. Returns 0 with the key in w->key, or
 * KVEDGE_ECORRUPT when the failure cannot be pinned on one key. */
static int s_walk_find(s_walk_t *w, const uint8_t *from, size_t flen)
{
    rocksdb_readoptions_t *ro = s_walk_ro(w);
    if (w->upper)
        rocksdb_readoptions_set_iterate_upper_bound(ro, (const char *)w->upper, w->ulen);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(w->e->db, ro, w->e->cf[S_CF_META]);
    int rc = KVEDGE_ECORRUPT;
    bool bisect = true;
    for (rocksdb_iter_seek(it, (const char *)from, flen); rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t mlen;
        const uint8_t *m = (const uint8_t *)rocksdb_iter_key(it, &mlen);
        int p = s_probe(w, from, flen, m, mlen);
        if (p == S_PROBE_FAILS)
            break; /* a block with no metadata fails before m */
        if (p != S_PROBE_EMPTY || mlen > S_WALK_KEY_MAX) {
            bisect = false;
            break;
        }
        if (s_unreadable(w, m, mlen)) {
            memcpy(w->key, m, mlen);
            w->klen = mlen;
            rc = KVEDGE_OK;
            bisect = false;
            break;
        }
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    if (!bisect)
        return rc;

    /* Bisection: w->key[0..n) is a prefix of the failing key; a probe up to key+0x00 says
     * whether it is the key itself, probes up to key+b narrow down its next byte. */
    uint8_t *k = w->key;
    for (size_t n = 0; n < KVEDGE_BLOCK_KEY_BYTES; n++) {
        k[n] = 0x00;
        if (s_probe(w, from, flen, k, n + 1) != S_PROBE_EMPTY)
            return KVEDGE_ECORRUPT; /* ends short of a block key: not a value failing */
        unsigned lo = 0, hi = 255;
        while (lo < hi) {
            unsigned mid = (lo + hi) / 2;
            k[n] = (uint8_t)(mid + 1);
            int p = s_probe(w, from, flen, k, n + 1);
            if (p == S_PROBE_FAILS)
                hi = mid;
            else if (p == S_PROBE_EMPTY)
                lo = mid + 1;
            else
                return KVEDGE_ECORRUPT;
        }
        k[n] = (uint8_t)lo;
    }
    /* Only a block key that exists, past from, and fails on its own is stepped over, so a
     * walk always moves forward and never invents keys. */
    size_t cmp_len = flen < KVEDGE_BLOCK_KEY_BYTES ? flen : KVEDGE_BLOCK_KEY_BYTES;
    int c = memcmp(k, from, cmp_len);
    if ((c < 0 || (c == 0 && flen > KVEDGE_BLOCK_KEY_BYTES)) ||
        !s_unreadable(w, k, KVEDGE_BLOCK_KEY_BYTES))
        return KVEDGE_ECORRUPT;
    w->klen = KVEDGE_BLOCK_KEY_BYTES;
    return KVEDGE_OK;
}

/* After the iterator moved to the first key at or past from: takes the key it found, or on a
 * value that failed finds that key (from NULL: it cannot), or ends the walk. */
static void s_walk_settle(s_walk_t *w, const uint8_t *from, size_t flen)
{
    w->unreadable = false;
    if (rocksdb_iter_valid(w->it)) {
        const char *k = rocksdb_iter_key(w->it, &w->klen);
        if (w->klen <= S_WALK_KEY_MAX)
            memcpy(w->key, k, w->klen);
        w->valid = true;
        return;
    }
    w->valid = false;
    char *err = NULL;
    rocksdb_iter_get_error(w->it, &err);
    if (!err)
        return;
    int rc = s_rerr(&err);
    if (rc == KVEDGE_ECORRUPT && from)
        rc = s_walk_find(w, from, flen);
    if (rc == KVEDGE_OK)
        w->valid = w->unreadable = true;
    else
        w->err = rc;
}

/* Starts a walk over [lower, upper) of the blocks family (either may be NULL; upper must
 * outlive the walk) under snap, or a snapshot of its own when snap is NULL. With check,
 * RocksDB verifies its own checksums (so a damaged blob record header fails its key); with
 * fill, the values read enter the cache. */
static void s_walk_open(s_walk_t *w, kvedge_engine_t *e, const rocksdb_snapshot_t *snap,
                        const uint8_t *lower, size_t llen, const uint8_t *upper, size_t ulen,
                        bool check, bool fill)
{
    memset(w, 0, sizeof *w);
    w->e = e;
    w->own_snap = snap == NULL;
    w->snap = snap ? snap : rocksdb_create_snapshot(e->db);
    w->check = check;
    w->fill = fill;
    w->upper = upper;
    w->ulen = ulen;
    w->ro = s_walk_ro(w);
    if (upper)
        rocksdb_readoptions_set_iterate_upper_bound(w->ro, (const char *)upper, ulen);
    w->pro = s_walk_ro(w);
    w->it = rocksdb_create_iterator_cf(e->db, w->ro, e->cf[S_CF_BLOCKS]);
    if (lower)
        rocksdb_iter_seek(w->it, (const char *)lower, llen);
    else
        rocksdb_iter_seek_to_first(w->it);
    s_walk_settle(w, lower ? lower : (const uint8_t *)"", lower ? llen : 0);
}

static const uint8_t *s_walk_key(const s_walk_t *w, size_t *klen)
{
    if (w->unreadable) {
        *klen = w->klen;
        return w->key;
    }
    return (const uint8_t *)rocksdb_iter_key(w->it, klen);
}

/* The current value, valid until the walk moves; NULL when it could not be read. */
static const uint8_t *s_walk_value(const s_walk_t *w, size_t *vlen)
{
    *vlen = 0;
    return w->unreadable ? NULL : (const uint8_t *)rocksdb_iter_value(w->it, vlen);
}

static void s_walk_next(s_walk_t *w)
{
    if (!w->valid)
        return;
    /* Everything past the current key starts at key + 0x00 (a foreign key too long to keep
     * is stepped over only while the values past it read). */
    uint8_t from[S_WALK_KEY_MAX + 1];
    size_t flen = w->klen + 1;
    bool kept = w->klen <= S_WALK_KEY_MAX;
    if (kept) {
        memcpy(from, w->key, w->klen);
        from[w->klen] = 0x00;
    }
    if (w->unreadable) {
        /* The iterator stopped for good on the failure: a fresh one seeks past the key. */
        rocksdb_iter_destroy(w->it);
        w->it = rocksdb_create_iterator_cf(w->e->db, w->ro, w->e->cf[S_CF_BLOCKS]);
        rocksdb_iter_seek(w->it, (const char *)from, flen);
    } else {
        rocksdb_iter_next(w->it);
    }
    s_walk_settle(w, kept ? from : NULL, flen);
}

/* Ends a walk; returns rc, or the store error that ended the walk when rc is not negative. */
static int s_walk_close(s_walk_t *w, int rc)
{
    if (w->err && rc >= 0)
        rc = w->err;
    rocksdb_iter_destroy(w->it);
    rocksdb_readoptions_destroy(w->pro);
    rocksdb_readoptions_destroy(w->ro);
    if (w->own_snap)
        rocksdb_release_snapshot(w->e->db, w->snap);
    return rc;
}

/* ---------------------------------------------------------------- engine helpers */

static uint64_t s_now(const kvedge_engine_t *e)
{
    if (e->opts.clock_ms)
        return e->opts.clock_ms(e->opts.clock_ctx);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static unsigned s_stripe_of(const uint8_t *kb)
{
    return (unsigned)(XXH3_64bits(kb, KVEDGE_BLOCK_KEY_BYTES) % S_STRIPES);
}

static void s_lock(kvedge_engine_t *e, unsigned s)
{
    pthread_mutex_lock(&e->stripes[s]);
}

static void s_unlock(kvedge_engine_t *e, unsigned s)
{
    pthread_mutex_unlock(&e->stripes[s]);
}

static void s_add(_Atomic uint64_t *a, uint64_t v)
{
    atomic_fetch_add_explicit(a, v, memory_order_relaxed);
}

static void s_sub(_Atomic uint64_t *a, uint64_t v)
{
    atomic_fetch_sub_explicit(a, v, memory_order_relaxed);
}

static uint64_t s_get(_Atomic uint64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

/* Totals of one block entering or leaving the store; bytes too when with_bytes (a put moves
 * bytes itself, by reservation). */
static void s_totals(kvedge_engine_t *e, const kvedge_block_meta_t *m, bool add, bool with_bytes)
{
    void (*f)(_Atomic uint64_t *, uint64_t) = add ? s_add : s_sub;
    f(&e->blocks, 1);
    if (with_bytes)
        f(&e->bytes, m->bytes);
    f(&e->fp16_bytes, kvedge_block_fp16_bytes(m->tokens, m->head_dim));
    if (m->pinned) {
        f(&e->pinned_blocks, 1);
        f(&e->pinned_bytes, m->bytes);
    }
}

static bool s_expired(const kvedge_block_meta_t *m, uint64_t now)
{
    return !m->pinned && m->expires_ms != 0 && now >= m->expires_ms;
}

static bool s_needs_touch(const kvedge_engine_t *e, const kvedge_block_meta_t *m, uint64_t now)
{
    return now >= m->atime_ms && now - m->atime_ms >= e->opts.atime_granularity_ms;
}

/* Checks a block's bytes against itself and against its metadata. Returns 0, a parse error,
 * or KVEDGE_ECORRUPT for a disagreement. */
static int s_check_block(const uint8_t *data, size_t len, const kvedge_block_meta_t *m)
{
    kvedge_block_info_t info;
    int rc = kvedge_block_parse(data, len, &info);
    if (rc != KVEDGE_OK)
        return rc;
    if (len != m->bytes || info.checksum != m->checksum || info.dtype != m->dtype ||
        info.scheme != m->scheme || info.tokens != m->tokens || info.head_dim != m->head_dim ||
        info.key_channels != m->key_channels || info.group_size != m->group_size ||
        info.lz4 != m->lz4)
        return KVEDGE_ECORRUPT;
    return KVEDGE_OK;
}

/* Reads meta and block of one key and verifies them. On S_LOAD_OK, *blk holds the block; on
 * S_LOAD_BAD it may hold the bad bytes (or be NULL: missing, or a value RocksDB cannot read
 * back, such as a damaged blob record) and *meta_ok says whether meta is usable; *why (may be
 * NULL) receives the specific failure. Negative: a store error. The block is read with
 * RocksDB's own checksums only when scrub (verify); reads rely on the block's xxh3. */
static int s_load(kvedge_engine_t *e, const uint8_t *kb, kvedge_block_meta_t *meta, bool *meta_ok,
                  rocksdb_pinnableslice_t **blk, int *why, bool scrub)
{
    *blk = NULL;
    *meta_ok = false;
    int mrc = s_get_meta(e, kb, meta);
    if (mrc != KVEDGE_OK && mrc != KVEDGE_ENOTFOUND && mrc != KVEDGE_ECORRUPT)
        return mrc;
    int brc = s_pget_ro(e, scrub ? e->ro : e->ro_blk, S_CF_BLOCKS, kb, KVEDGE_BLOCK_KEY_BYTES, blk);
    if (brc != KVEDGE_OK && brc != KVEDGE_ENOTFOUND && brc != KVEDGE_ECORRUPT)
        return brc;
    *meta_ok = mrc == KVEDGE_OK;
    if (mrc == KVEDGE_ENOTFOUND && brc == KVEDGE_ENOTFOUND)
        return S_LOAD_MISSING;
    int bad = KVEDGE_ECORRUPT;
    if (mrc == KVEDGE_OK && brc == KVEDGE_OK) {
        size_t len;
        const uint8_t *v = s_pval(*blk, &len);
        bad = s_check_block(v, len, meta);
        if (bad == KVEDGE_OK)
            return S_LOAD_OK;
    }
    if (why)
        *why = bad;
    return S_LOAD_BAD;
}

/* Deletes a block and everything that indexes it. */
static void s_batch_drop(rocksdb_writebatch_t *b, kvedge_engine_t *e, const uint8_t *kb,
                         const kvedge_block_meta_t *m)
{
    uint8_t ik[S_INDEX_KEY_BYTES];
    rocksdb_writebatch_delete_cf(b, e->cf[S_CF_BLOCKS], (const char *)kb, KVEDGE_BLOCK_KEY_BYTES);
    rocksdb_writebatch_delete_cf(b, e->cf[S_CF_META], (const char *)kb, KVEDGE_BLOCK_KEY_BYTES);
    if (m) {
        s_index_key(m->atime_ms, kb, ik);
        rocksdb_writebatch_delete_cf(b, e->cf[S_CF_LRU], (const char *)ik, sizeof ik);
        if (m->expires_ms) {
            s_index_key(m->expires_ms, kb, ik);
            rocksdb_writebatch_delete_cf(b, e->cf[S_CF_TTL], (const char *)ik, sizeof ik);
        }
    }
}

/* Under the key's stripe: deletes a block whose meta is m (NULL: meta unusable, totals do not
 * count it). */
static int s_drop_locked(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_meta_t *m)
{
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    s_batch_drop(b, e, kb, m);
    int rc = s_write(e, b);
    rocksdb_writebatch_destroy(b);
    if (rc == KVEDGE_OK && m)
        s_totals(e, m, false, true);
    return rc;
}

/* Under the key's stripe: moves a bad block's bytes to quarantine and drops it. */
static int s_quarantine_locked(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_meta_t *m,
                               const rocksdb_pinnableslice_t *blk)
{
    rocksdb_pinnableslice_t *old;
    int rc = s_pget(e, S_CF_QUARANTINE, kb, KVEDGE_BLOCK_KEY_BYTES, &old);
    if (rc != KVEDGE_OK && rc != KVEDGE_ENOTFOUND)
        return rc;
    bool had = rc == KVEDGE_OK;
    if (old)
        rocksdb_pinnableslice_destroy(old);
    size_t len = 0;
    const uint8_t *v = blk ? s_pval(blk, &len) : (const uint8_t *)"";
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(b, e->cf[S_CF_QUARANTINE], (const char *)kb, KVEDGE_BLOCK_KEY_BYTES,
                              (const char *)v, len);
    s_batch_drop(b, e, kb, m);
    rc = s_write(e, b);
    rocksdb_writebatch_destroy(b);
    if (rc != KVEDGE_OK)
        return rc;
    if (m)
        s_totals(e, m, false, true);
    if (!had)
        s_add(&e->quarantined, 1);
    return KVEDGE_OK;
}

/* Under the key's stripe: records an access (meta atime and the LRU entry, one batch). */
static int s_touch_locked(kvedge_engine_t *e, const uint8_t *kb, kvedge_block_meta_t *m,
                          uint64_t now)
{
    kvedge_block_meta_t n = *m;
    n.atime_ms = now;
    uint8_t rec[S_META_RECORD_BYTES], ik[S_INDEX_KEY_BYTES];
    s_meta_pack(&n, rec);
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(b, e->cf[S_CF_META], (const char *)kb, KVEDGE_BLOCK_KEY_BYTES,
                              (const char *)rec, sizeof rec);
    if (!m->pinned) {
        s_index_key(m->atime_ms, kb, ik);
        rocksdb_writebatch_delete_cf(b, e->cf[S_CF_LRU], (const char *)ik, sizeof ik);
        s_index_key(now, kb, ik);
        rocksdb_writebatch_put_cf(b, e->cf[S_CF_LRU], (const char *)ik, sizeof ik, "", 0);
    }
    int rc = s_write(e, b);
    rocksdb_writebatch_destroy(b);
    if (rc == KVEDGE_OK)
        *m = n;
    return rc;
}

/* The read path once the lock-free look found something to act on: under the key's stripe,
 * reads again and quarantines, expires or touches as the fresh state says. Returns 0 with
 * *blk, KVEDGE_ENOTFOUND, KVEDGE_ECORRUPT (quarantined), or a store error. */
static int s_read_locked(kvedge_engine_t *e, const uint8_t *kb, uint64_t now,
                         rocksdb_pinnableslice_t **blk)
{
    unsigned s = s_stripe_of(kb);
    kvedge_block_meta_t m;
    bool meta_ok;
    s_lock(e, s);
    int rc = s_load(e, kb, &m, &meta_ok, blk, NULL, false);
    if (rc == S_LOAD_OK) {
        if (s_expired(&m, now)) {
            rocksdb_pinnableslice_destroy(*blk);
            *blk = NULL;
            rc = s_drop_locked(e, kb, &m);
            if (rc == KVEDGE_OK) {
                s_add(&e->expired, 1);
                rc = KVEDGE_ENOTFOUND;
            }
        } else if (s_needs_touch(e, &m, now)) {
            /* A failed refresh costs recency, not the read. */
            (void)s_touch_locked(e, kb, &m, now);
        }
    } else if (rc == S_LOAD_MISSING) {
        rc = KVEDGE_ENOTFOUND;
    } else if (rc == S_LOAD_BAD) {
        (void)s_quarantine_locked(e, kb, meta_ok ? &m : NULL, *blk);
        if (*blk)
            rocksdb_pinnableslice_destroy(*blk);
        *blk = NULL;
        rc = KVEDGE_ECORRUPT;
    }
    s_unlock(e, s);
    return rc;
}

/* The atime refresh of a read that verified its block against meta seen: under the key's
 * stripe, re-reads the meta only and, if it still describes the same block (same checksum
 * and size) and still wants a refresh, records the access. The block itself is not read
 * again. A failed or skipped refresh costs recency, not the read. */
static void s_touch_if_same(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_meta_t *seen,
                            uint64_t now)
{
    unsigned s = s_stripe_of(kb);
    kvedge_block_meta_t m;
    s_lock(e, s);
    if (s_get_meta(e, kb, &m) == KVEDGE_OK && m.checksum == seen->checksum &&
        m.bytes == seen->bytes && !s_expired(&m, now) && s_needs_touch(e, &m, now))
        (void)s_touch_locked(e, kb, &m, now);
    s_unlock(e, s);
}

/* Bytes may grow by delta only while the total stays within capacity. */
static bool s_reserve(kvedge_engine_t *e, int64_t delta)
{
    if (delta <= 0) {
        s_sub(&e->bytes, (uint64_t)-delta);
        return true;
    }
    uint64_t cur = atomic_load(&e->bytes);
    do {
        if (cur + (uint64_t)delta > e->opts.capacity_bytes)
            return false;
    } while (!atomic_compare_exchange_weak(&e->bytes, &cur, cur + (uint64_t)delta));
    return true;
}

/* Under evict_mu: evicts least-recently-used unpinned blocks until bytes <= target, skipping
 * the key `keep` (may be NULL). Takes each victim's stripe in turn; the caller holds none.
 * Returns 0, KVEDGE_EFULL when the LRU ran out first, or a store error. */
static int s_evict_locked(kvedge_engine_t *e, uint64_t target, const uint8_t *keep, uint64_t *n_out,
                          uint64_t *bytes_out)
{
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = s_iter(e, S_CF_LRU, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_EFULL;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        if (s_get(&e->bytes) <= target) {
            rc = KVEDGE_OK;
            break;
        }
        size_t klen;
        const uint8_t *ik = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen != S_INDEX_KEY_BYTES) {
            char *err = NULL;
            rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_LRU], (const char *)ik, klen, &err);
            if (err)
                s_rerr(&err);
            continue;
        }
        uint64_t atime = kvedge_be_get64(ik);
        const uint8_t *kb = ik + 8;
        if (keep && memcmp(kb, keep, KVEDGE_BLOCK_KEY_BYTES) == 0)
            continue;
        unsigned s = s_stripe_of(kb);
        s_lock(e, s);
        kvedge_block_meta_t m;
        int mrc = s_get_meta(e, kb, &m);
        int wrc = KVEDGE_OK;
        if (mrc == KVEDGE_OK && m.atime_ms == atime && !m.pinned) {
            wrc = s_drop_locked(e, kb, &m);
            if (wrc == KVEDGE_OK) {
                s_add(&e->evicted_blocks, 1);
                s_add(&e->evicted_bytes, m.bytes);
                if (n_out)
                    (*n_out)++;
                if (bytes_out)
                    *bytes_out += m.bytes;
            }
        } else if (mrc == KVEDGE_OK || mrc == KVEDGE_ENOTFOUND || mrc == KVEDGE_ECORRUPT) {
            /* Stale entry: the block is gone, pinned, or was touched since. */
            char *err = NULL;
            rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_LRU], (const char *)ik, klen, &err);
            if (err)
                wrc = s_rerr(&err);
        } else {
            wrc = mrc;
        }
        s_unlock(e, s);
        if (wrc != KVEDGE_OK) {
            rc = wrc;
            break;
        }
    }
    if (rc == KVEDGE_EFULL && s_get(&e->bytes) <= target)
        rc = KVEDGE_OK;
    return s_iter_close(it, ro, rc);
}

/* ---------------------------------------------------------------- open and close */

void kvedge_engine_opts_default(kvedge_engine_opts_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->create_if_missing = true;
    opts->blob_min_bytes = KVEDGE_ENGINE_BLOB_MIN_BYTES_DEFAULT;
    opts->atime_granularity_ms = KVEDGE_ENGINE_ATIME_GRANULARITY_MS_DEFAULT;
    opts->cache_bytes = KVEDGE_ENGINE_CACHE_BYTES_DEFAULT;
}

/* Shard bits of the cache: as many shards as keep each at S_CACHE_SHARD_MIN_BYTES or more. */
static int s_cache_shard_bits(uint64_t bytes)
{
    int bits = 0;
    while (bits < S_CACHE_SHARD_BITS_MAX && (bytes >> (bits + 1)) >= S_CACHE_SHARD_MIN_BYTES)
        bits++;
    return bits;
}

__attribute__((format(printf, 3, 4))) static void s_why(char *why, size_t why_len, const char *fmt,
                                                        ...)
{
    if (!why || why_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    for (char *p = why; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

/* Maps an error from opening a store; frees the message. */
static int s_open_err(char **err, const char *dir, char *why, size_t why_len)
{
    const char *m = *err;
    int rc;
    if (strstr(m, "While lock file") || strstr(m, "lock hold by current process") ||
        strstr(m, "/LOCK") || strstr(m, "Resource temporarily unavailable"))
        rc = KVEDGE_EBUSY;
    else if (strstr(m, "Corruption"))
        rc = KVEDGE_ECORRUPT;
    else if (strstr(m, "IO error"))
        rc = KVEDGE_EIO;
    else
        rc = KVEDGE_ESTORE;
    if (rc == KVEDGE_EBUSY)
        s_why(why, why_len, "store %s is in use by another process or handle (%s)", dir, m);
    else
        s_why(why, why_len, "cannot open store %s: %s", dir, m);
    rocksdb_free(*err);
    *err = NULL;
    return rc;
}

/* Reads (or, on a writable new store, writes) the format version. */
static int s_check_format(kvedge_engine_t *e, char *why, size_t why_len)
{
    rocksdb_pinnableslice_t *p;
    int rc = s_pget(e, S_CF_DEFAULT, S_FORMAT_KEY, strlen(S_FORMAT_KEY), &p);
    if (rc == KVEDGE_ENOTFOUND) {
        if (e->opts.read_only)
            return KVEDGE_OK;
        char v[16];
        int n = snprintf(v, sizeof v, "%d", KVEDGE_ENGINE_FORMAT_VERSION);
        char *err = NULL;
        rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
        rocksdb_writeoptions_set_sync(wo, 1);
        rocksdb_put_cf(e->db, wo, e->cf[S_CF_DEFAULT], S_FORMAT_KEY, strlen(S_FORMAT_KEY), v,
                       (size_t)n, &err);
        rocksdb_writeoptions_destroy(wo);
        if (err) {
            s_why(why, why_len, "cannot write the format version: %s", err);
            return s_rerr(&err);
        }
        return KVEDGE_OK;
    }
    if (rc != KVEDGE_OK) {
        s_why(why, why_len, "cannot read the format version: %s", kvedge_strerror(rc));
        return rc;
    }
    size_t len;
    const uint8_t *v = s_pval(p, &len);
    uint64_t ver = 0;
    bool ok = len > 0 && len <= 9;
    for (size_t i = 0; ok && i < len; i++) {
        ok = v[i] >= '0' && v[i] <= '9';
        ver = ver * 10 + (uint64_t)(v[i] - '0');
    }
    rocksdb_pinnableslice_destroy(p);
    if (!ok) {
        s_why(why, why_len, "store format version record is corrupt");
        return KVEDGE_ECORRUPT;
    }
    if (ver > KVEDGE_ENGINE_FORMAT_VERSION) {
        s_why(why, why_len, "store format %llu is newer than this kvedge supports (%d)",
              (unsigned long long)ver, KVEDGE_ENGINE_FORMAT_VERSION);
        return KVEDGE_EVERSION;
    }
    return KVEDGE_OK;
}

/* Computes the totals from the meta family and counts quarantined blocks. */
static int s_load_totals(kvedge_engine_t *e)
{
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = s_iter(e, S_CF_META, NULL, 0, NULL, 0, &ro);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        (void)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_block_meta_t m;
        if (klen == KVEDGE_BLOCK_KEY_BYTES && s_meta_unpack(v, vlen, &m) == KVEDGE_OK)
            s_totals(e, &m, true, true);
    }
    int rc = s_iter_close(it, ro, KVEDGE_OK);
    if (rc != KVEDGE_OK)
        return rc;
    it = s_iter(e, S_CF_QUARANTINE, NULL, 0, NULL, 0, &ro);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it))
        s_add(&e->quarantined, 1);
    return s_iter_close(it, ro, KVEDGE_OK);
}

static bool s_store_exists(const char *dir)
{
    size_t n = strlen(dir) + sizeof "/CURRENT";
    char *path = malloc(n);
    if (!path)
        return false;
    snprintf(path, n, "%s/CURRENT", dir);
    struct stat st;
    bool ok = stat(path, &st) == 0;
    free(path);
    return ok;
}

/* Opens the database with our families plus any others it holds. */
static int s_open_db(kvedge_engine_t *e, const char *dir, bool exists, char *why, size_t why_len)
{
    int rc = KVEDGE_OK;
    char *err = NULL;
    char **listed = NULL;
    size_t n_listed = 0;
    const char **names = NULL;
    rocksdb_options_t **cfo = NULL;
    rocksdb_options_t *base = rocksdb_options_create();
    rocksdb_options_t *blobs = NULL;
    rocksdb_block_based_table_options_t *table = NULL;
    if (e->cache) {
        /* One cache for the table blocks of every family and the blob values. */
        table = rocksdb_block_based_options_create();
        rocksdb_block_based_options_set_block_cache(table, e->cache);
        rocksdb_options_set_block_based_table_factory(base, table);
    }
    rocksdb_options_set_create_if_missing(base, !e->opts.read_only);
    rocksdb_options_set_create_missing_column_families(base, !e->opts.read_only);

    if (exists) {
        listed = rocksdb_list_column_families(base, dir, &n_listed, &err);
        if (err) {
            rc = s_open_err(&err, dir, why, why_len);
            goto done;
        }
    }
    size_t cap = S_CF_COUNT + n_listed;
    names = calloc(cap, sizeof *names);
    cfo = calloc(cap, sizeof *cfo);
    e->handles = calloc(cap, sizeof *e->handles);
    if (!names || !cfo || !e->handles) {
        rc = KVEDGE_ENOMEM;
        goto done;
    }
    size_t n = 0;
    for (size_t i = 0; i < S_CF_COUNT; i++)
        names[n++] = s_cf_names[i];
    for (size_t i = 0; i < n_listed; i++) {
        bool ours = false;
        for (size_t j = 0; j < S_CF_COUNT; j++)
            ours = ours || strcmp(listed[i], s_cf_names[j]) == 0;
        if (!ours)
            names[n++] = listed[i];
    }
    if (e->opts.read_only) {
        /* A read-only open cannot create families: a kvedge store has them all. */
        for (size_t j = 0; exists && j < S_CF_COUNT; j++) {
            bool found = false;
            for (size_t i = 0; i < n_listed; i++)
                found = found || strcmp(listed[i], s_cf_names[j]) == 0;
            if (!found) {
                s_why(why, why_len, "store %s lacks the column family %s", dir, s_cf_names[j]);
                rc = KVEDGE_ECORRUPT;
                goto done;
            }
        }
    }
    blobs = rocksdb_options_create();
    rocksdb_options_set_enable_blob_files(blobs, 1);
    rocksdb_options_set_min_blob_size(blobs, e->opts.blob_min_bytes);
    rocksdb_options_set_enable_blob_gc(blobs, 1);
    if (e->cache) {
        rocksdb_options_set_block_based_table_factory(blobs, table);
        /* A hit pins the cached value in the get's PinnableSlice: no read, no copy. Blobs
         * enter the cache as they are flushed, so fresh blocks are served warm. */
        rocksdb_options_set_blob_cache(blobs, e->cache);
        rocksdb_options_set_prepopulate_blob_cache(blobs, rocksdb_prepopulate_blob_flush_only);
    }
    for (size_t i = 0; i < n; i++)
        cfo[i] = i == S_CF_BLOCKS ? blobs : base;

    if (e->opts.read_only)
        e->db = rocksdb_open_for_read_only_column_families(
            base, dir, (int)n, names, (const rocksdb_options_t *const *)cfo, e->handles, 0, &err);
    else
        e->db = rocksdb_open_column_families(
            base, dir, (int)n, names, (const rocksdb_options_t *const *)cfo, e->handles, &err);
    if (err) {
        if (e->db)
            rocksdb_close(e->db);
        e->db = NULL;
        rc = s_open_err(&err, dir, why, why_len);
        goto done;
    }
    e->n_handles = n;
    for (size_t i = 0; i < S_CF_COUNT; i++)
        e->cf[i] = e->handles[i];
done:
    if (blobs)
        rocksdb_options_destroy(blobs);
    if (table)
        rocksdb_block_based_options_destroy(table);
    rocksdb_options_destroy(base);
    if (listed)
        rocksdb_list_column_families_destroy(listed, n_listed);
    free(names);
    free(cfo);
    return rc;
}

int kvedge_engine_open(const char *dir, const kvedge_engine_opts_t *opts, kvedge_engine_t **out,
                       char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!out)
        return KVEDGE_EINVAL;
    *out = NULL;
    if (!dir || !*dir) {
        s_why(why, why_len, "no store directory given");
        return KVEDGE_EINVAL;
    }
    kvedge_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return KVEDGE_ENOMEM;
    if (opts)
        e->opts = *opts;
    else
        kvedge_engine_opts_default(&e->opts);
    for (size_t i = 0; i < S_STRIPES; i++)
        pthread_mutex_init(&e->stripes[i], NULL);
    pthread_mutex_init(&e->evict_mu, NULL);
    pthread_mutex_init(&e->models_mu, NULL);
    pthread_mutex_init(&e->scrub_mu, NULL);

    int rc;
    bool exists = s_store_exists(dir);
    if (!exists && (e->opts.read_only || !e->opts.create_if_missing)) {
        s_why(why, why_len, "no kvedge store at %s", dir);
        rc = KVEDGE_ENOTFOUND;
        goto fail;
    }
    if (e->opts.cache_bytes) {
        rocksdb_lru_cache_options_t *co = rocksdb_lru_cache_options_create();
        rocksdb_lru_cache_options_set_capacity(co, (size_t)e->opts.cache_bytes);
        rocksdb_lru_cache_options_set_num_shard_bits(co, s_cache_shard_bits(e->opts.cache_bytes));
        e->cache = rocksdb_cache_create_lru_opts(co);
        rocksdb_lru_cache_options_destroy(co);
    }
    rc = s_open_db(e, dir, exists, why, why_len);
    if (rc != KVEDGE_OK)
        goto fail;
    e->ro = rocksdb_readoptions_create();
    e->ro_blk = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(e->ro_blk, 0);
    e->wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(e->wo, e->opts.sync ? 1 : 0);
    rc = s_check_format(e, why, why_len);
    if (rc != KVEDGE_OK)
        goto fail;
    rc = s_load_totals(e);
    if (rc != KVEDGE_OK) {
        s_why(why, why_len, "cannot scan store %s: %s", dir, kvedge_strerror(rc));
        goto fail;
    }
    *out = e;
    return KVEDGE_OK;
fail:
    kvedge_engine_destroy(&e);
    return rc;
}

void kvedge_engine_destroy(kvedge_engine_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_engine_t *e = *self_p;
    *self_p = NULL;
    if (e->db) {
        /* Flush memtables on a clean close: blob files and SSTs hold everything, and the
         * next open has no WAL to replay. A failed flush loses nothing (the WAL has it). */
        if (!e->opts.read_only) {
            rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
            rocksdb_flushoptions_set_wait(fo, 1);
            for (size_t i = 0; i < e->n_handles; i++) {
                char *err = NULL;
                rocksdb_flush_cf(e->db, fo, e->handles[i], &err);
                free(err);
            }
            rocksdb_flushoptions_destroy(fo);
        }
        for (size_t i = e->n_handles; i-- > 0;)
            rocksdb_column_family_handle_destroy(e->handles[i]);
        rocksdb_close(e->db);
    }
    if (e->cache)
        rocksdb_cache_destroy(e->cache); /* after the DB: its families hold it until closed */
    free(e->handles);
    if (e->wo)
        rocksdb_writeoptions_destroy(e->wo);
    if (e->ro)
        rocksdb_readoptions_destroy(e->ro);
    if (e->ro_blk)
        rocksdb_readoptions_destroy(e->ro_blk);
    pthread_mutex_destroy(&e->scrub_mu);
    pthread_mutex_destroy(&e->models_mu);
    pthread_mutex_destroy(&e->evict_mu);
    for (size_t i = S_STRIPES; i-- > 0;)
        pthread_mutex_destroy(&e->stripes[i]);
    free(e);
}

/* ---------------------------------------------------------------- models */

static bool s_id_ok(const char *id)
{
    return id && id[0] != '\0' &&
           strnlen(id, KVEDGE_MODEL_ID_MAX_BYTES + 1) <= KVEDGE_MODEL_ID_MAX_BYTES;
}

int kvedge_engine_get_model(kvedge_engine_t *e, const char *id, kvedge_model_t *out)
{
    if (!e || !s_id_ok(id) || !out)
        return KVEDGE_EINVAL;
    rocksdb_pinnableslice_t *p;
    int rc = s_pget(e, S_CF_MODELS, id, strlen(id), &p);
    if (rc == KVEDGE_ENOTFOUND)
        return KVEDGE_ENOMODEL;
    if (rc != KVEDGE_OK)
        return rc;
    size_t len;
    const uint8_t *v = s_pval(p, &len);
    rc = kvedge_model_unpack(id, v, len, out);
    rocksdb_pinnableslice_destroy(p);
    return rc;
}

int kvedge_engine_put_model(kvedge_engine_t *e, const kvedge_model_t *model)
{
    if (!e || !model || memchr(model->id, 0, sizeof model->id) == NULL)
        return KVEDGE_EINVAL;
    int rc = kvedge_model_check(model);
    if (rc != KVEDGE_OK)
        return rc;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    pthread_mutex_lock(&e->models_mu);
    kvedge_model_t old;
    rc = kvedge_engine_get_model(e, model->id, &old);
    if (rc == KVEDGE_OK) {
        if (old.layers != model->layers || old.kv_heads != model->kv_heads ||
            old.head_dim != model->head_dim || old.dtype != model->dtype)
            rc = KVEDGE_ESHAPE;
    } else if (rc == KVEDGE_ENOMODEL || rc == KVEDGE_ECORRUPT) {
        uint8_t rec[KVEDGE_MODEL_RECORD_BYTES];
        kvedge_model_pack(model, rec);
        char *err = NULL;
        rocksdb_put_cf(e->db, e->wo, e->cf[S_CF_MODELS], model->id, strlen(model->id),
                       (const char *)rec, sizeof rec, &err);
        rc = err ? s_rerr(&err) : KVEDGE_OK;
    }
    pthread_mutex_unlock(&e->models_mu);
    return rc;
}

int kvedge_engine_list_models(kvedge_engine_t *e, int (*cb)(void *ctx, const kvedge_model_t *model),
                              void *ctx)
{
    if (!e || !cb)
        return KVEDGE_EINVAL;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = s_iter(e, S_CF_MODELS, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        const char *v = rocksdb_iter_value(it, &vlen);
        kvedge_model_t m;
        rc = s_model_from_kv(k, klen, v, vlen, &m);
        if (rc == KVEDGE_OK)
            rc = cb(ctx, &m);
        if (rc != KVEDGE_OK)
            break;
    }
    return s_iter_close(it, ro, rc);
}

/* ---------------------------------------------------------------- put */

static int s_get_chunk_raw(kvedge_engine_t *e, const kvedge_chunk_id_t *id,
                           kvedge_chunk_info_t *out)
{
    rocksdb_pinnableslice_t *p;
    int rc = s_pget(e, S_CF_PREFIXES, id->bytes, KVEDGE_CHUNK_ID_BYTES, &p);
    if (rc != KVEDGE_OK)
        return rc;
    size_t len;
    const uint8_t *v = s_pval(p, &len);
    rc = s_prefix_unpack(id->bytes, KVEDGE_CHUNK_ID_BYTES, v, len, out);
    rocksdb_pinnableslice_destroy(p);
    return rc;
}

/* Checks a put's chunk against the model and the stored record; fills the record to write. */
static int s_put_chunk_check(kvedge_engine_t *e, const kvedge_chunk_info_t *chunk, uint64_t now,
                             kvedge_chunk_info_t *rec)
{
    *rec = *chunk;
    if (!chunk->has_parent)
        memset(rec->parent.bytes, 0, sizeof rec->parent.bytes);
    kvedge_chunk_info_t old;
    int rc = s_get_chunk_raw(e, &chunk->id, &old);
    if (rc == KVEDGE_OK) {
        if (strcmp(old.model_id, rec->model_id) != 0 || old.has_parent != rec->has_parent ||
            memcmp(old.parent.bytes, rec->parent.bytes, KVEDGE_CHUNK_ID_BYTES) != 0 ||
            old.index != rec->index || old.tokens != rec->tokens)
            return KVEDGE_ESHAPE;
        rec->created_ms = old.created_ms;
        return KVEDGE_OK;
    }
    if (rc != KVEDGE_ENOTFOUND && rc != KVEDGE_ECORRUPT)
        return rc;
    if (rec->created_ms == 0)
        rec->created_ms = now;
    return KVEDGE_OK;
}

int kvedge_engine_put(kvedge_engine_t *e, const kvedge_chunk_info_t *chunk, uint16_t layer,
                      uint16_t head, const uint8_t *block, size_t len,
                      const kvedge_put_opts_t *opts)
{
    if (!e || !chunk || !block || len == 0 ||
        memchr(chunk->model_id, 0, sizeof chunk->model_id) == NULL)
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    kvedge_block_info_t info;
    int rc = kvedge_block_parse(block, len, &info);
    if (rc != KVEDGE_OK)
        return rc;
    uint64_t cap = e->opts.capacity_bytes;
    if (cap && len > cap)
        return KVEDGE_ETOOBIG;
    kvedge_model_t model;
    rc = kvedge_engine_get_model(e, chunk->model_id, &model);
    if (rc != KVEDGE_OK)
        return rc == KVEDGE_EINVAL ? KVEDGE_ENOMODEL : rc;
    if (layer >= model.layers || head >= model.kv_heads || info.head_dim != model.head_dim ||
        info.tokens != chunk->tokens)
        return KVEDGE_ESHAPE;
    uint64_t now = s_now(e);
    kvedge_chunk_info_t crec;
    rc = s_put_chunk_check(e, chunk, now, &crec);
    if (rc != KVEDGE_OK)
        return rc;

    kvedge_block_key_t key = {.chunk = chunk->id, .layer = layer, .head = head};
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(&key, kb);
    unsigned s = s_stripe_of(kb);
    bool evicting = false, exhausted = false;
    kvedge_block_meta_t old, m;
    bool have_old;
    int64_t delta;
    s_lock(e, s);
    for (;;) {
        int orc = s_get_meta(e, kb, &old);
        if (orc != KVEDGE_OK && orc != KVEDGE_ENOTFOUND && orc != KVEDGE_ECORRUPT) {
            rc = orc;
            goto out;
        }
        /* A replaced block keeps an operator's pin: pins are lifted only explicitly. */
        have_old = orc == KVEDGE_OK;
        memset(&m, 0, sizeof m);
        m.pinned = (opts && opts->pin) || (have_old && old.pinned);
        delta = (int64_t)len - (have_old ? (int64_t)old.bytes : 0);
        if (!cap) {
            s_add(&e->bytes, (uint64_t)delta);
            break;
        }
        uint64_t pinned_other = s_get(&e->pinned_bytes) - (have_old && old.pinned ? old.bytes : 0);
        if (pinned_other + len > cap) {
            rc = KVEDGE_EFULL;
            goto out;
        }
        if (s_reserve(e, delta))
            break;
        if (exhausted) {
            rc = KVEDGE_EFULL;
            goto out;
        }
        /* Lock order is evict_mu, then one stripe at a time: ours is dropped while others'
         * blocks are evicted, and the loop re-reads our key once it is back. */
        s_unlock(e, s);
        if (!evicting) {
            pthread_mutex_lock(&e->evict_mu);
            evicting = true;
            s_lock(e, s);
            continue;
        }
        uint64_t freed = 0;
        int erc = s_evict_locked(e, cap - (uint64_t)delta, kb, &freed, NULL);
        s_lock(e, s);
        if (erc != KVEDGE_OK && erc != KVEDGE_EFULL) {
            rc = erc;
            goto out;
        }
        exhausted = erc == KVEDGE_EFULL && freed == 0;
    }
    if (evicting) {
        pthread_mutex_unlock(&e->evict_mu);
        evicting = false;
    }

    uint32_t ttl = opts ? opts->ttl_s : 0;
    if (ttl == 0)
        ttl = e->opts.default_ttl_s;
    m.bytes = (uint32_t)len;
    m.dtype = info.dtype;
    m.scheme = info.scheme;
    m.tokens = info.tokens;
    m.head_dim = info.head_dim;
    m.key_channels = info.key_channels;
    m.group_size = info.group_size;
    m.lz4 = info.lz4;
    m.checksum = info.checksum;
    m.created_ms = now;
    m.atime_ms = now;
    m.expires_ms = ttl == 0 || ttl == KVEDGE_TTL_NEVER ? 0 : now + (uint64_t)ttl * 1000u;

    uint8_t rec[S_META_RECORD_BYTES], ik[S_INDEX_KEY_BYTES], prec[S_PREFIX_MAX_BYTES];
    s_meta_pack(&m, rec);
    size_t plen = s_prefix_pack(&crec, prec);
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(b, e->cf[S_CF_BLOCKS], (const char *)kb, sizeof kb,
                              (const char *)block, len);
    rocksdb_writebatch_put_cf(b, e->cf[S_CF_META], (const char *)kb, sizeof kb, (const char *)rec,
                              sizeof rec);
    if (have_old) {
        s_index_key(old.atime_ms, kb, ik);
        rocksdb_writebatch_delete_cf(b, e->cf[S_CF_LRU], (const char *)ik, sizeof ik);
        if (old.expires_ms) {
            s_index_key(old.expires_ms, kb, ik);
            rocksdb_writebatch_delete_cf(b, e->cf[S_CF_TTL], (const char *)ik, sizeof ik);
        }
    }
    if (!m.pinned) {
        s_index_key(m.atime_ms, kb, ik);
        rocksdb_writebatch_put_cf(b, e->cf[S_CF_LRU], (const char *)ik, sizeof ik, "", 0);
        if (m.expires_ms) {
            s_index_key(m.expires_ms, kb, ik);
            rocksdb_writebatch_put_cf(b, e->cf[S_CF_TTL], (const char *)ik, sizeof ik, "", 0);
        }
    }
    rocksdb_writebatch_put_cf(b, e->cf[S_CF_PREFIXES], (const char *)chunk->id.bytes,
                              KVEDGE_CHUNK_ID_BYTES, (const char *)prec, plen);
    rc = s_write(e, b);
    rocksdb_writebatch_destroy(b);
    if (rc != KVEDGE_OK) {
        s_sub(&e->bytes, (uint64_t)delta); /* give the reservation back */
        goto out;
    }
    /* bytes moved already, by delta; the other totals follow. */
    if (have_old)
        s_totals(e, &old, false, false);
    s_totals(e, &m, true, false);
    s_add(&e->puts, 1);
    s_add(&e->bytes_written, len);
out:
    s_unlock(e, s);
    if (evicting)
        pthread_mutex_unlock(&e->evict_mu);
    return rc;
}

/* ---------------------------------------------------------------- get */

void kvedge_value_release(kvedge_value_t *v)
{
    if (!v)
        return;
    if (v->priv)
        rocksdb_pinnableslice_destroy(v->priv);
    memset(v, 0, sizeof *v);
}

int kvedge_engine_get(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_value_t *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!e || !key || !out)
        return KVEDGE_EINVAL;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    s_add(&e->gets, 1);
    uint64_t now = s_now(e);
    kvedge_block_meta_t m;
    bool meta_ok;
    rocksdb_pinnableslice_t *blk;
    int rc = s_load(e, kb, &m, &meta_ok, &blk, NULL, false);
    if (rc < 0)
        return rc;
    bool ro = e->opts.read_only;
    if (rc == S_LOAD_OK && !s_expired(&m, now)) {
        if (!ro && s_needs_touch(e, &m, now))
            s_touch_if_same(e, kb, &m, now);
        rc = KVEDGE_OK;
    } else if (rc == S_LOAD_MISSING) {
        rc = KVEDGE_ENOTFOUND;
    } else if (ro) {
        rc = rc == S_LOAD_OK ? KVEDGE_ENOTFOUND : KVEDGE_ECORRUPT;
    } else {
        if (blk)
            rocksdb_pinnableslice_destroy(blk);
        blk = NULL;
        rc = s_read_locked(e, kb, now, &blk);
    }
    if (rc != KVEDGE_OK) {
        if (blk)
            rocksdb_pinnableslice_destroy(blk);
        if (rc == KVEDGE_ECORRUPT)
            s_add(&e->corrupt, 1);
        if (rc == KVEDGE_ENOTFOUND || rc == KVEDGE_ECORRUPT)
            s_add(&e->misses, 1);
        return rc;
    }
    out->data = s_pval(blk, &out->len);
    out->priv = blk;
    s_add(&e->hits, 1);
    s_add(&e->bytes_read, out->len);
    return KVEDGE_OK;
}

int kvedge_engine_get_meta(kvedge_engine_t *e, const kvedge_block_key_t *key,
                           kvedge_block_meta_t *out)
{
    if (!e || !key || !out)
        return KVEDGE_EINVAL;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    return s_get_meta(e, kb, out);
}

int kvedge_engine_get_layer(kvedge_engine_t *e, const kvedge_chunk_id_t *chunk, uint16_t layer,
                            kvedge_layer_cb cb, void *ctx)
{
    if (!e || !chunk || !cb)
        return KVEDGE_EINVAL;
    kvedge_block_key_t k0 = {.chunk = *chunk, .layer = layer, .head = 0};
    uint8_t lower[KVEDGE_BLOCK_KEY_BYTES], upper[S_UPPER_BYTES];
    kvedge_block_key_pack(&k0, lower);
    s_upper(lower, KVEDGE_CHUNK_ID_BYTES + 2, upper);
    /* A walk, not an iterator: a head whose value cannot be read is reported in its place. */
    s_walk_t w;
    s_walk_open(&w, e, NULL, lower, sizeof lower, upper, sizeof upper, false, true);
    bool read_only = e->opts.read_only;
    uint64_t now = s_now(e);
    int rc = KVEDGE_OK, delivered = 0;
    for (; w.valid; s_walk_next(&w)) {
        size_t klen, vlen;
        const uint8_t *kb = s_walk_key(&w, &klen);
        if (klen != KVEDGE_BLOCK_KEY_BYTES)
            continue;
        uint16_t head = kvedge_be_get16(kb + KVEDGE_CHUNK_ID_BYTES + 2);
        const uint8_t *data = s_walk_value(&w, &vlen);
        s_add(&e->gets, 1);
        kvedge_block_meta_t m;
        int mrc = s_get_meta(e, kb, &m);
        if (mrc != KVEDGE_OK && mrc != KVEDGE_ENOTFOUND && mrc != KVEDGE_ECORRUPT) {
            rc = mrc;
            break;
        }
        bool good = data && mrc == KVEDGE_OK && s_check_block(data, vlen, &m) == KVEDGE_OK;
        int status;
        rocksdb_pinnableslice_t *blk = NULL;
        if (good && !s_expired(&m, now)) {
            if (!read_only && s_needs_touch(e, &m, now))
                s_touch_if_same(e, kb, &m, now);
            status = KVEDGE_OK;
        } else if (read_only) {
            status = good ? KVEDGE_ENOTFOUND : KVEDGE_ECORRUPT;
        } else {
            status = s_read_locked(e, kb, now, &blk);
            if (status == KVEDGE_OK)
                data = s_pval(blk, &vlen);
        }
        if (status == KVEDGE_ENOTFOUND) {
            s_add(&e->misses, 1);
            continue;
        }
        if (status != KVEDGE_OK && status != KVEDGE_ECORRUPT) {
            rc = status;
            break;
        }
        if (status == KVEDGE_OK) {
            s_add(&e->hits, 1);
            s_add(&e->bytes_read, vlen);
            delivered++;
        } else {
            s_add(&e->corrupt, 1);
            s_add(&e->misses, 1);
            data = NULL;
            vlen = 0;
        }
        int crc = cb(ctx, head, status, data, vlen);
        if (blk)
            rocksdb_pinnableslice_destroy(blk);
        if (crc != 0) {
            rc = crc;
            break;
        }
    }
    rc = s_walk_close(&w, rc);
    return rc == KVEDGE_OK ? delivered : rc;
}

/* ---------------------------------------------------------------- scans */

int kvedge_engine_scan(kvedge_engine_t *e, const kvedge_chunk_id_t *chunk, kvedge_meta_cb cb,
                       void *ctx)
{
    if (!e || !cb)
        return KVEDGE_EINVAL;
    uint8_t upper[S_UPPER_BYTES];
    if (chunk)
        s_upper(chunk->bytes, KVEDGE_CHUNK_ID_BYTES, upper);
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = s_iter(e, S_CF_META, chunk ? chunk->bytes : NULL,
                                    KVEDGE_CHUNK_ID_BYTES, chunk ? upper : NULL, sizeof upper, &ro);
    int rc = KVEDGE_OK;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_block_meta_t m;
        kvedge_block_key_t key;
        if (klen != KVEDGE_BLOCK_KEY_BYTES || s_meta_unpack(v, vlen, &m) != KVEDGE_OK) {
            rc = KVEDGE_ECORRUPT;
            break;
        }
        kvedge_block_key_unpack(k, &key);
        rc = cb(ctx, &key, &m);
        if (rc != 0)
            break;
    }
    return s_iter_close(it, ro, rc);
}

int kvedge_engine_list_chunks(kvedge_engine_t *e, kvedge_chunk_cb cb, void *ctx)
{
    if (!e || !cb)
        return KVEDGE_EINVAL;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = s_iter(e, S_CF_PREFIXES, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_chunk_info_t c;
        rc = s_prefix_unpack(k, klen, v, vlen, &c);
        if (rc == KVEDGE_OK)
            rc = cb(ctx, &c);
        if (rc != 0)
            break;
    }
    return s_iter_close(it, ro, rc);
}

int kvedge_engine_get_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id,
                            kvedge_chunk_info_t *out)
{
    if (!e || !id || !out)
        return KVEDGE_EINVAL;
    return s_get_chunk_raw(e, id, out);
}

static int s_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int kvedge_engine_find_chunk(kvedge_engine_t *e, const char *hex_prefix, kvedge_chunk_id_t *out)
{
    if (!e || !hex_prefix || !out)
        return KVEDGE_EINVAL;
    size_t n = strnlen(hex_prefix, 2 * KVEDGE_CHUNK_ID_BYTES + 1);
    if (n < 4 || n > 2 * KVEDGE_CHUNK_ID_BYTES)
        return KVEDGE_EINVAL;
    uint8_t pre[KVEDGE_CHUNK_ID_BYTES] = {0};
    for (size_t i = 0; i < n; i++) {
        int v = s_hexval(hex_prefix[i]);
        if (v < 0)
            return KVEDGE_EINVAL;
        pre[i / 2] |= (uint8_t)(i % 2 ? v : v << 4);
    }
    size_t full = n / 2;
    bool half = n % 2;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = s_iter(e, S_CF_PREFIXES, pre, full + half, NULL, 0, &ro);
    int rc = KVEDGE_ENOTFOUND;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen < full + half || memcmp(k, pre, full) != 0 ||
            (half && (k[full] & 0xf0) != pre[full]))
            break;
        if (klen != KVEDGE_CHUNK_ID_BYTES)
            continue;
        if (rc == KVEDGE_OK) {
            rc = KVEDGE_EAMBIGUOUS;
            break;
        }
        memcpy(out->bytes, k, KVEDGE_CHUNK_ID_BYTES);
        rc = KVEDGE_OK;
    }
    return s_iter_close(it, ro, rc);
}

/* ---------------------------------------------------------------- delete, pin */

/* Under the key's stripe: deletes whatever a key holds. Returns 1 when something was there,
 * 0 when not, or an error. */
static int s_erase_key(kvedge_engine_t *e, const uint8_t *kb)
{
    unsigned s = s_stripe_of(kb);
    s_lock(e, s);
    kvedge_block_meta_t m;
    int rc = s_get_meta(e, kb, &m);
    bool meta_ok = rc == KVEDGE_OK, there = rc != KVEDGE_ENOTFOUND;
    if (rc == KVEDGE_OK || rc == KVEDGE_ENOTFOUND || rc == KVEDGE_ECORRUPT) {
        if (!there) {
            /* A block whose value cannot be read back is there all the same. */
            rocksdb_pinnableslice_t *p;
            rc = s_pget(e, S_CF_BLOCKS, kb, KVEDGE_BLOCK_KEY_BYTES, &p);
            there = rc == KVEDGE_OK || rc == KVEDGE_ECORRUPT;
            if (p)
                rocksdb_pinnableslice_destroy(p);
            if (rc == KVEDGE_ENOTFOUND || there)
                rc = KVEDGE_OK;
        } else {
            rc = KVEDGE_OK;
        }
        if (there && rc == KVEDGE_OK)
            rc = s_drop_locked(e, kb, meta_ok ? &m : NULL);
    }
    s_unlock(e, s);
    return rc == KVEDGE_OK ? (there ? 1 : 0) : rc;
}

/* Deletes every key of a chunk in one family's range (meta, then orphan blocks). Blocks are
 * walked, so a value that cannot be read back does not stop its own deletion. */
static int s_erase_chunk_keys(kvedge_engine_t *e, int cf, const kvedge_chunk_id_t *id, uint64_t *n)
{
    uint8_t upper[S_UPPER_BYTES];
    s_upper(id->bytes, KVEDGE_CHUNK_ID_BYTES, upper);
    int rc = KVEDGE_OK;
    if (cf == S_CF_BLOCKS) {
        s_walk_t w;
        s_walk_open(&w, e, NULL, id->bytes, KVEDGE_CHUNK_ID_BYTES, upper, sizeof upper, false,
                    false);
        for (; w.valid; s_walk_next(&w)) {
            size_t klen;
            const uint8_t *kb = s_walk_key(&w, &klen);
            if (klen != KVEDGE_BLOCK_KEY_BYTES)
                continue;
            int r = s_erase_key(e, kb);
            if (r < 0) {
                rc = r;
                break;
            }
            *n += (uint64_t)r;
        }
        return s_walk_close(&w, rc);
    }
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it =
        s_iter(e, cf, id->bytes, KVEDGE_CHUNK_ID_BYTES, upper, sizeof upper, &ro);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *kb = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen != KVEDGE_BLOCK_KEY_BYTES)
            continue;
        int r = s_erase_key(e, kb);
        if (r < 0) {
            rc = r;
            break;
        }
        *n += (uint64_t)r;
    }
    return s_iter_close(it, ro, rc);
}

static int s_delete_one_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id, uint64_t *n,
                              bool *found)
{
    uint64_t before = *n;
    int rc = s_erase_chunk_keys(e, S_CF_META, id, n);
    if (rc == KVEDGE_OK)
        rc = s_erase_chunk_keys(e, S_CF_BLOCKS, id, n);
    if (rc != KVEDGE_OK)
        return rc;
    rocksdb_pinnableslice_t *p;
    rc = s_pget(e, S_CF_PREFIXES, id->bytes, KVEDGE_CHUNK_ID_BYTES, &p);
    if (rc != KVEDGE_OK && rc != KVEDGE_ENOTFOUND)
        return rc;
    if (p)
        rocksdb_pinnableslice_destroy(p);
    if (rc == KVEDGE_OK) {
        char *err = NULL;
        rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_PREFIXES], (const char *)id->bytes,
                          KVEDGE_CHUNK_ID_BYTES, &err);
        if (err)
            return s_rerr(&err);
    }
    *found = *found || rc == KVEDGE_OK || *n > before;
    return KVEDGE_OK;
}

typedef struct {
    kvedge_chunk_id_t parent;
    kvedge_chunk_id_t child;
    bool used;
} s_edge_t;

static int s_edge_cmp(const void *a, const void *b)
{
    return memcmp(((const s_edge_t *)a)->parent.bytes, ((const s_edge_t *)b)->parent.bytes,
                  KVEDGE_CHUNK_ID_BYTES);
}

/* Every chunk whose parent chain leads to root, root first: one scan of the prefixes, the
 * edges sorted by parent, then a walk. Caller frees *out. */
static int s_descendants(kvedge_engine_t *e, const kvedge_chunk_id_t *root, kvedge_chunk_id_t **out,
                         size_t *n_out)
{
    s_edge_t *edges = NULL;
    size_t n_edges = 0, cap_edges = 0;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = s_iter(e, S_CF_PREFIXES, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_chunk_info_t c;
        if (s_prefix_unpack(k, klen, v, vlen, &c) != KVEDGE_OK || !c.has_parent)
            continue;
        if (n_edges == cap_edges) {
            size_t nc = cap_edges ? 2 * cap_edges : 64;
            s_edge_t *ne = realloc(edges, nc * sizeof *ne);
            if (!ne) {
                rc = KVEDGE_ENOMEM;
                break;
            }
            edges = ne;
            cap_edges = nc;
        }
        edges[n_edges++] = (s_edge_t){.parent = c.parent, .child = c.id, .used = false};
    }
    rc = s_iter_close(it, ro, rc);
    /* Each edge adds at most one chunk, so the walk ends even on a corrupt cycle. */
    kvedge_chunk_id_t *list = rc == KVEDGE_OK ? malloc((n_edges + 1) * sizeof *list) : NULL;
    if (rc == KVEDGE_OK && !list)
        rc = KVEDGE_ENOMEM;
    if (rc != KVEDGE_OK) {
        free(edges);
        return rc;
    }
    if (n_edges)
        qsort(edges, n_edges, sizeof *edges, s_edge_cmp);
    size_t n = 0;
    list[n++] = *root;
    for (size_t q = 0; q < n; q++) {
        size_t lo = 0, hi = n_edges;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (memcmp(edges[mid].parent.bytes, list[q].bytes, KVEDGE_CHUNK_ID_BYTES) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (size_t i = lo; i < n_edges && memcmp(edges[i].parent.bytes, list[q].bytes,
                                                  KVEDGE_CHUNK_ID_BYTES) == 0;
             i++) {
            if (!edges[i].used) {
                edges[i].used = true;
                list[n++] = edges[i].child;
            }
        }
    }
    free(edges);
    *out = list;
    *n_out = n;
    return KVEDGE_OK;
}

int kvedge_engine_delete_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id, bool descendants,
                               uint64_t *blocks)
{
    if (blocks)
        *blocks = 0;
    if (!e || !id)
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    const kvedge_chunk_id_t *list = id;
    kvedge_chunk_id_t *owned = NULL;
    size_t n = 1;
    if (descendants) {
        int rc = s_descendants(e, id, &owned, &n);
        if (rc != KVEDGE_OK)
            return rc;
        list = owned;
    }
    uint64_t count = 0;
    bool found = false;
    int rc = KVEDGE_OK;
    for (size_t i = 0; i < n && rc == KVEDGE_OK; i++)
        rc = s_delete_one_chunk(e, &list[i], &count, &found);
    free(owned);
    if (blocks)
        *blocks = count;
    if (rc == KVEDGE_OK && !found)
        rc = KVEDGE_ENOTFOUND;
    return rc;
}

/* Under the key's stripe: sets the pin. Returns 1 if it changed, 0 if not, or an error. */
static int s_pin_key(kvedge_engine_t *e, const uint8_t *kb, bool pin)
{
    unsigned s = s_stripe_of(kb);
    s_lock(e, s);
    kvedge_block_meta_t m;
    int rc = s_get_meta(e, kb, &m);
    if (rc == KVEDGE_OK && m.pinned != pin) {
        kvedge_block_meta_t n = m;
        n.pinned = pin;
        uint8_t rec[S_META_RECORD_BYTES], lk[S_INDEX_KEY_BYTES], tk[S_INDEX_KEY_BYTES];
        s_meta_pack(&n, rec);
        s_index_key(m.atime_ms, kb, lk);
        s_index_key(m.expires_ms, kb, tk);
        rocksdb_writebatch_t *b = rocksdb_writebatch_create();
        rocksdb_writebatch_put_cf(b, e->cf[S_CF_META], (const char *)kb, KVEDGE_BLOCK_KEY_BYTES,
                                  (const char *)rec, sizeof rec);
        if (pin) {
            rocksdb_writebatch_delete_cf(b, e->cf[S_CF_LRU], (const char *)lk, sizeof lk);
            if (m.expires_ms)
                rocksdb_writebatch_delete_cf(b, e->cf[S_CF_TTL], (const char *)tk, sizeof tk);
        } else {
            rocksdb_writebatch_put_cf(b, e->cf[S_CF_LRU], (const char *)lk, sizeof lk, "", 0);
            if (m.expires_ms)
                rocksdb_writebatch_put_cf(b, e->cf[S_CF_TTL], (const char *)tk, sizeof tk, "", 0);
        }
        rc = s_write(e, b);
        rocksdb_writebatch_destroy(b);
        if (rc == KVEDGE_OK) {
            void (*f)(_Atomic uint64_t *, uint64_t) = pin ? s_add : s_sub;
            f(&e->pinned_blocks, 1);
            f(&e->pinned_bytes, m.bytes);
            rc = 1;
        }
    }
    s_unlock(e, s);
    return rc;
}

int kvedge_engine_pin(kvedge_engine_t *e, const kvedge_block_key_t *key, bool pin)
{
    if (!e || !key)
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    int rc = s_pin_key(e, kb, pin);
    return rc < 0 ? rc : KVEDGE_OK;
}

int kvedge_engine_pin_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id, bool pin,
                            uint64_t *changed)
{
    if (changed)
        *changed = 0;
    if (!e || !id)
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    uint8_t upper[S_UPPER_BYTES];
    s_upper(id->bytes, KVEDGE_CHUNK_ID_BYTES, upper);
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it =
        s_iter(e, S_CF_META, id->bytes, KVEDGE_CHUNK_ID_BYTES, upper, sizeof upper, &ro);
    int rc = KVEDGE_OK;
    uint64_t n = 0, seen = 0;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *kb = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen != KVEDGE_BLOCK_KEY_BYTES)
            continue;
        int r = s_pin_key(e, kb, pin);
        if (r == KVEDGE_ENOTFOUND)
            continue; /* deleted since the iterator's snapshot */
        if (r < 0) {
            rc = r;
            break;
        }
        seen++;
        n += (uint64_t)r;
    }
    rc = s_iter_close(it, ro, rc);
    if (changed)
        *changed = n;
    if (rc == KVEDGE_OK && seen == 0)
        rc = KVEDGE_ENOTFOUND;
    return rc;
}

/* ---------------------------------------------------------------- evict, expire */

int kvedge_engine_evict(kvedge_engine_t *e, uint64_t target_bytes, uint64_t *blocks,
                        uint64_t *bytes)
{
    if (blocks)
        *blocks = 0;
    if (bytes)
        *bytes = 0;
    if (!e)
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    pthread_mutex_lock(&e->evict_mu);
    int rc = s_evict_locked(e, target_bytes, NULL, blocks, bytes);
    pthread_mutex_unlock(&e->evict_mu);
    return rc;
}

int kvedge_engine_expire(kvedge_engine_t *e, uint64_t *blocks)
{
    if (blocks)
        *blocks = 0;
    if (!e)
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    uint64_t now = s_now(e);
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = s_iter(e, S_CF_TTL, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    uint64_t n = 0;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *ik = (const uint8_t *)rocksdb_iter_key(it, &klen);
        int wrc = KVEDGE_OK;
        if (klen != S_INDEX_KEY_BYTES) {
            char *err = NULL;
            rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_TTL], (const char *)ik, klen, &err);
            if (err)
                s_rerr(&err);
            continue;
        }
        uint64_t expires = kvedge_be_get64(ik);
        if (expires > now)
            break;
        const uint8_t *kb = ik + 8;
        unsigned s = s_stripe_of(kb);
        s_lock(e, s);
        kvedge_block_meta_t m;
        int mrc = s_get_meta(e, kb, &m);
        if (mrc == KVEDGE_OK && m.expires_ms == expires && s_expired(&m, now)) {
            wrc = s_drop_locked(e, kb, &m);
            if (wrc == KVEDGE_OK) {
                s_add(&e->expired, 1);
                n++;
            }
        } else if (mrc == KVEDGE_OK || mrc == KVEDGE_ENOTFOUND || mrc == KVEDGE_ECORRUPT) {
            char *err = NULL; /* stale: gone, pinned or re-put since */
            rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_TTL], (const char *)ik, klen, &err);
            if (err)
                wrc = s_rerr(&err);
        } else {
            wrc = mrc;
        }
        s_unlock(e, s);
        if (wrc != KVEDGE_OK) {
            rc = wrc;
            break;
        }
    }
    if (blocks)
        *blocks = n;
    return s_iter_close(it, ro, rc);
}

/* ---------------------------------------------------------------- verify, stats, debug */

/* A verify reads what is on disk, not what the cache holds: blob values and table blocks
 * cached by reads were not checked by RocksDB (reads leave that to the block's xxh3), and a
 * value cached before its record was damaged would hide the damage. While any verify runs the
 * cache is held empty (capacity 0: what a live kvedge_value_t pins stays until released). */
static void s_scrub_begin(kvedge_engine_t *e)
{
    if (!e->cache)
        return;
    pthread_mutex_lock(&e->scrub_mu);
    if (e->scrubbing++ == 0)
        rocksdb_cache_set_capacity(e->cache, 0);
    pthread_mutex_unlock(&e->scrub_mu);
}

static void s_scrub_end(kvedge_engine_t *e)
{
    if (!e->cache)
        return;
    pthread_mutex_lock(&e->scrub_mu);
    if (--e->scrubbing == 0)
        rocksdb_cache_set_capacity(e->cache, (size_t)e->opts.cache_bytes);
    pthread_mutex_unlock(&e->scrub_mu);
}

/* One bad key found by verify: report it, and quarantine it if it is still bad under its
 * stripe. Returns the callback's value or a store error. */
static int s_verify_bad(kvedge_engine_t *e, const uint8_t *kb, int err, bool quarantine,
                        kvedge_verify_cb cb, void *ctx)
{
    if (quarantine) {
        unsigned s = s_stripe_of(kb);
        kvedge_block_meta_t m;
        bool meta_ok;
        rocksdb_pinnableslice_t *blk;
        s_lock(e, s);
        int rc = s_load(e, kb, &m, &meta_ok, &blk, NULL, true);
        if (rc == S_LOAD_BAD) {
            rc = s_quarantine_locked(e, kb, meta_ok ? &m : NULL, blk);
            if (rc == KVEDGE_OK)
                s_add(&e->corrupt, 1);
        }
        if (blk)
            rocksdb_pinnableslice_destroy(blk);
        s_unlock(e, s);
        if (rc < 0)
            return rc;
    }
    if (cb) {
        kvedge_block_key_t key;
        kvedge_block_key_unpack(kb, &key);
        return cb(ctx, &key, err);
    }
    return KVEDGE_OK;
}

int kvedge_engine_verify(kvedge_engine_t *e, bool quarantine, kvedge_verify_cb cb, void *ctx,
                         uint64_t *checked, uint64_t *bad)
{
    if (checked)
        *checked = 0;
    if (bad)
        *bad = 0;
    if (!e)
        return KVEDGE_EINVAL;
    if (quarantine && e->opts.read_only)
        return KVEDGE_EREADONLY;
    /* Blocks and meta walked side by side in key order: one pass finds both orphans. The
     * blocks side is a walk, so a value that cannot be read is one bad block, in its place.
     * RocksDB checks its own checksums here too (a damaged blob record header is found even
     * when the value reads intact), on disk: see s_scrub_begin. */
    s_scrub_begin(e);
    const rocksdb_snapshot_t *snap = rocksdb_create_snapshot(e->db);
    rocksdb_readoptions_t *rom = rocksdb_readoptions_create();
    rocksdb_readoptions_set_snapshot(rom, snap);
    s_walk_t wb;
    s_walk_open(&wb, e, snap, NULL, 0, NULL, 0, true, false);
    rocksdb_iterator_t *im = rocksdb_create_iterator_cf(e->db, rom, e->cf[S_CF_META]);
    rocksdb_iter_seek_to_first(im);
    int rc = KVEDGE_OK;
    uint64_t n = 0, nbad = 0;
    for (;;) {
        bool vb = wb.valid, vm = rocksdb_iter_valid(im);
        if ((!vb && !vm) || wb.err)
            break; /* done, or the blocks side failed: its keys can no longer be matched */
        size_t kbl = 0, kml = 0, vlen = 0, mlen = 0;
        const uint8_t *kb = vb ? s_walk_key(&wb, &kbl) : NULL;
        const uint8_t *km = vm ? (const uint8_t *)rocksdb_iter_key(im, &kml) : NULL;
        int c;
        if (!vb)
            c = 1;
        else if (!vm)
            c = -1;
        else {
            c = memcmp(kb, km, kbl < kml ? kbl : kml);
            if (c == 0)
                c = kbl < kml ? -1 : kbl > kml;
        }
        const uint8_t *key = c <= 0 ? kb : km;
        size_t klen = c <= 0 ? kbl : kml;
        int err = KVEDGE_ECORRUPT; /* one side missing */
        if (c == 0) {
            const uint8_t *data = s_walk_value(&wb, &vlen);
            const uint8_t *mv = (const uint8_t *)rocksdb_iter_value(im, &mlen);
            kvedge_block_meta_t m;
            err = s_meta_unpack(mv, mlen, &m);
            if (err == KVEDGE_OK)
                err = data ? s_check_block(data, vlen, &m) : KVEDGE_ECORRUPT;
        }
        if (klen == KVEDGE_BLOCK_KEY_BYTES) {
            n++;
            if (err != KVEDGE_OK) {
                nbad++;
                rc = s_verify_bad(e, key, err, quarantine, cb, ctx);
            }
        }
        if (c <= 0)
            s_walk_next(&wb);
        if (c >= 0)
            rocksdb_iter_next(im);
        if (rc != KVEDGE_OK)
            break;
    }
    rc = s_walk_close(&wb, rc);
    rc = s_iter_close(im, rom, rc);
    rocksdb_release_snapshot(e->db, snap);
    s_scrub_end(e);
    if (checked)
        *checked = n;
    if (bad)
        *bad = nbad;
    return rc;
}

int kvedge_engine_stats(kvedge_engine_t *e, kvedge_engine_stats_t *out)
{
    if (!e || !out)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    out->blocks = s_get(&e->blocks);
    out->bytes = s_get(&e->bytes);
    out->fp16_bytes = s_get(&e->fp16_bytes);
    out->pinned_blocks = s_get(&e->pinned_blocks);
    out->pinned_bytes = s_get(&e->pinned_bytes);
    out->capacity_bytes = e->opts.capacity_bytes;
    out->quarantined = s_get(&e->quarantined);
    out->puts = s_get(&e->puts);
    out->gets = s_get(&e->gets);
    out->hits = s_get(&e->hits);
    out->misses = s_get(&e->misses);
    out->corrupt = s_get(&e->corrupt);
    out->evicted_blocks = s_get(&e->evicted_blocks);
    out->evicted_bytes = s_get(&e->evicted_bytes);
    out->expired = s_get(&e->expired);
    out->bytes_written = s_get(&e->bytes_written);
    out->bytes_read = s_get(&e->bytes_read);
    return KVEDGE_OK;
}

int kvedge_engine_debug_put_raw(kvedge_engine_t *e, const kvedge_block_key_t *key,
                                const uint8_t *data, size_t len)
{
    if (!e || !key || (!data && len))
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    unsigned s = s_stripe_of(kb);
    char *err = NULL;
    s_lock(e, s);
    rocksdb_put_cf(e->db, e->wo, e->cf[S_CF_BLOCKS], (const char *)kb, sizeof kb,
                   data ? (const char *)data : "", len, &err);
    s_unlock(e, s);
    return err ? s_rerr(&err) : KVEDGE_OK;
}
