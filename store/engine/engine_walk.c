/* Block walks: the blocks family in key order, stepping past values RocksDB cannot read back
 * instead of stopping on them (get_layer, delete_chunk and verify walk). */
#include "store/engine/engine_impl.h"

/* What one probe of the blocks family found in [from, upper). */
enum { S_PROBE_EMPTY, S_PROBE_FAILS, S_PROBE_READS };

/* Read options for one read of a walk: its snapshot, checksum and cache policy. */
static rocksdb_readoptions_t *s_walk_ro(const kvedge_engine_walk_t *w)
{
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_snapshot(ro, w->snap);
    rocksdb_readoptions_set_verify_checksums(ro, w->check);
    rocksdb_readoptions_set_fill_cache(ro, w->fill);
    return ro;
}

/* Probes [from, upper) under the walk's snapshot: empty, or its first key fails or reads.
 * Upper bounds are checked before a value is fetched, so only the first key decides. */
static int s_probe(kvedge_engine_walk_t *w, const uint8_t *from, size_t flen, const uint8_t *upper,
                   size_t ulen)
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
            rc = kvedge_rocks_error(&err) == KVEDGE_ECORRUPT ? S_PROBE_FAILS : S_PROBE_READS;
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc;
}

/* Whether key holds a block whose value cannot be read back intact. */
static bool s_unreadable(kvedge_engine_walk_t *w, const uint8_t *key, size_t klen)
{
    rocksdb_pinnableslice_t *p;
    int rc = kvedge_engine_pget(w->e, w->pro, S_CF_BLOCKS, key, klen, &p);
    if (p)
        rocksdb_pinnableslice_destroy(p);
    return rc == KVEDGE_ECORRUPT;
}

/* The first key at or past from, known to fail: most blocks have metadata, so each meta key
 * past from is tried (no block before it, and it fails); a block without one is found by
 * bisection, one byte of the key at a time. Returns 0 with the key in w->key, or
 * KVEDGE_ECORRUPT when the failure cannot be pinned on one key. */
static int s_walk_find(kvedge_engine_walk_t *w, const uint8_t *from, size_t flen)
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
static void s_walk_settle(kvedge_engine_walk_t *w, const uint8_t *from, size_t flen)
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
    int rc = kvedge_rocks_error(&err);
    if (rc == KVEDGE_ECORRUPT && from)
        rc = s_walk_find(w, from, flen);
    if (rc == KVEDGE_OK)
        w->valid = w->unreadable = true;
    else
        w->err = rc;
}

void kvedge_engine_walk_open(kvedge_engine_walk_t *w, kvedge_engine_t *e,
                             const rocksdb_snapshot_t *snap, const uint8_t *lower, size_t llen,
                             const uint8_t *upper, size_t ulen, bool check, bool fill)
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

const uint8_t *kvedge_engine_walk_key(const kvedge_engine_walk_t *w, size_t *klen)
{
    if (w->unreadable) {
        *klen = w->klen;
        return w->key;
    }
    return (const uint8_t *)rocksdb_iter_key(w->it, klen);
}

const uint8_t *kvedge_engine_walk_value(const kvedge_engine_walk_t *w, size_t *vlen)
{
    *vlen = 0;
    return w->unreadable ? NULL : (const uint8_t *)rocksdb_iter_value(w->it, vlen);
}

void kvedge_engine_walk_next(kvedge_engine_walk_t *w)
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

int kvedge_engine_walk_close(kvedge_engine_walk_t *w, int rc)
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
