/* Eviction, expiry and pinning: the LRU and TTL indexes, and dropping a block with every
 * index entry that points at it. */
#include "store/engine/engine_impl.h"

/* ---------------------------------------------------------------- dropping blocks */

/* Deletes a block, everything that indexes it and its variants. */
int kvedge_engine_batch_drop(rocksdb_writebatch_t *b, kvedge_engine_t *e, const uint8_t *kb,
                             const kvedge_block_meta_t *m, kvedge_engine_vset_t *vs)
{
    int rc = kvedge_engine_batch_drop_variants(b, e, kb, vs);
    if (rc != KVEDGE_OK)
        return rc;
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
    return KVEDGE_OK;
}

int kvedge_engine_drop_locked(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_meta_t *m)
{
    return kvedge_engine_drop_locked_vs(e, kb, m, NULL);
}

int kvedge_engine_drop_locked_vs(kvedge_engine_t *e, const uint8_t *kb,
                                 const kvedge_block_meta_t *m, kvedge_engine_vset_t *vs_out)
{
    kvedge_engine_vset_t vs;
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    int rc = kvedge_engine_batch_drop(b, e, kb, m, &vs);
    if (rc == KVEDGE_OK)
        rc = s_write(e, b);
    rocksdb_writebatch_destroy(b);
    if (rc != KVEDGE_OK)
        return rc;
    if (m)
        kvedge_engine_totals(e, m, false, true);
    kvedge_engine_variants_gone(e, &vs);
    if (vs_out)
        *vs_out = vs;
    return rc;
}

/* ---------------------------------------------------------------- evict, expire */

int kvedge_engine_evict_locked(kvedge_engine_t *e, uint64_t target, const uint8_t *keep,
                               uint64_t *n_out, uint64_t *bytes_out)
{
    uint64_t epoch = s_get(&e->lru_epoch);
    if (epoch != e->walk_epoch) { /* an unpin put an old access time back */
        memset(e->walk_at_set, 0, sizeof e->walk_at_set);
        e->walk_epoch = epoch;
    }
    if (e->opts.pressure_demote != KVEDGE_PREC_STORED)
        return kvedge_engine_pressure_locked(e, target, keep, n_out, bytes_out);
    return kvedge_engine_evict_lru_locked(e, target, keep, n_out, bytes_out);
}

int kvedge_engine_evict_lru_locked(kvedge_engine_t *e, uint64_t target, const uint8_t *keep,
                                   uint64_t *n_out, uint64_t *bytes_out)
{
    uint8_t *at = e->walk_at[S_WALK_LRU];
    bool *set = &e->walk_at_set[S_WALK_LRU];
    if (*set && s_now(e) < kvedge_be_get64(at))
        *set = false; /* the clock went back: entries may sort before the resume point */
    bool resumed = *set;
    int rc;
again:
    rc = KVEDGE_EFULL;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_LRU, resumed ? at : NULL,
                                                resumed ? S_INDEX_KEY_BYTES : 0, NULL, 0, &ro);
    bool hold = false; /* an entry was skipped: the resume point stays before it */
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        if (s_get(&e->used) <= target) {
            rc = KVEDGE_OK;
            break;
        }
        size_t klen;
        const uint8_t *ik = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen != S_INDEX_KEY_BYTES) {
            char *err = NULL;
            rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_LRU], (const char *)ik, klen, &err);
            if (err) /* a malformed entry indexes nothing: dropping it is best effort */
                (void)s_write_error(e, &err);
            continue;
        }
        uint64_t atime = kvedge_be_get64(ik);
        const uint8_t *kb = ik + 8;
        if (keep && memcmp(kb, keep, KVEDGE_BLOCK_KEY_BYTES) == 0) {
            hold = true;
            continue;
        }
        unsigned s = s_stripe_of(kb);
        s_lock(e, s);
        kvedge_block_meta_t m;
        int mrc = kvedge_engine_read_meta(e, kb, &m);
        int wrc = KVEDGE_OK;
        if (mrc == KVEDGE_OK && m.atime_ms == atime && !m.pinned) {
            kvedge_engine_vset_t vs;
            wrc = kvedge_engine_drop_locked_vs(e, kb, &m, &vs);
            if (wrc == KVEDGE_OK) {
                /* Bytes freed: the block's and its variants' (capacity counts both). */
                s_add(&e->evicted_blocks, 1);
                s_add(&e->evicted_bytes, m.bytes + vs.bytes);
                if (n_out)
                    (*n_out)++;
                if (bytes_out)
                    *bytes_out += m.bytes + vs.bytes;
            }
        } else if (mrc == KVEDGE_OK || mrc == KVEDGE_ENOTFOUND || mrc == KVEDGE_ECORRUPT) {
            /* Stale entry: the block is gone, pinned, or was touched since. */
            char *err = NULL;
            rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_LRU], (const char *)ik, klen, &err);
            if (err)
                wrc = s_write_error(e, &err);
        } else {
            wrc = mrc;
        }
        s_unlock(e, s);
        if (wrc != KVEDGE_OK) {
            rc = wrc;
            break;
        }
        if (!hold) {
            memcpy(at, ik, S_INDEX_KEY_BYTES);
            *set = true;
        }
    }
    if (rc == KVEDGE_EFULL && s_get(&e->used) <= target)
        rc = KVEDGE_OK;
    rc = kvedge_engine_iter_close(it, ro, rc);
    if (rc == KVEDGE_EFULL && resumed) {
        resumed = false; /* ran out past the resume point: look from the start once */
        goto again;
    }
    return rc;
}

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
    int rc = kvedge_engine_evict_locked(e, target_bytes, NULL, blocks, bytes);
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
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_TTL, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    uint64_t n = 0;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *ik = (const uint8_t *)rocksdb_iter_key(it, &klen);
        int wrc = KVEDGE_OK;
        if (klen != S_INDEX_KEY_BYTES) {
            char *err = NULL;
            rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_TTL], (const char *)ik, klen, &err);
            if (err) /* a malformed entry indexes nothing: dropping it is best effort */
                (void)s_write_error(e, &err);
            continue;
        }
        uint64_t expires = kvedge_be_get64(ik);
        if (expires > now)
            break;
        const uint8_t *kb = ik + 8;
        unsigned s = s_stripe_of(kb);
        s_lock(e, s);
        kvedge_block_meta_t m;
        int mrc = kvedge_engine_read_meta(e, kb, &m);
        if (mrc == KVEDGE_OK && m.expires_ms == expires && s_expired(&m, now)) {
            wrc = kvedge_engine_drop_locked(e, kb, &m);
            if (wrc == KVEDGE_OK) {
                s_add(&e->expired, 1);
                n++;
            }
        } else if (mrc == KVEDGE_OK || mrc == KVEDGE_ENOTFOUND || mrc == KVEDGE_ECORRUPT) {
            char *err = NULL; /* stale: gone, pinned or re-put since */
            rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_TTL], (const char *)ik, klen, &err);
            if (err)
                wrc = s_write_error(e, &err);
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
    return kvedge_engine_iter_close(it, ro, rc);
}

/* ---------------------------------------------------------------- pin */

/* Under the key's stripe: sets the pin. Returns 1 if it changed, 0 if not, or an error. */
static int s_pin_key(kvedge_engine_t *e, const uint8_t *kb, bool pin)
{
    unsigned s = s_stripe_of(kb);
    s_lock(e, s);
    kvedge_block_meta_t m;
    int rc = kvedge_engine_read_meta(e, kb, &m);
    if (rc == KVEDGE_OK && m.pinned != pin) {
        kvedge_block_meta_t n = m;
        n.pinned = pin;
        uint8_t rec[S_META_RECORD_BYTES], lk[S_INDEX_KEY_BYTES], tk[S_INDEX_KEY_BYTES];
        kvedge_engine_meta_pack(&n, rec);
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
        if (rc == KVEDGE_OK && !pin)
            s_add(&e->lru_epoch, 1); /* an old access time is back in the LRU */
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
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_chunk_iter(e, S_CF_META, id, upper, &ro);
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
    rc = kvedge_engine_iter_close(it, ro, rc);
    if (changed)
        *changed = n;
    if (rc == KVEDGE_OK && seen == 0)
        rc = KVEDGE_ENOTFOUND;
    return rc;
}
