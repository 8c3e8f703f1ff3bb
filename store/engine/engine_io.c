/* The block engine's read and write path: put, get, get_meta and get_layer, with the access
 * time refresh that reads do and the capacity reservation that puts do. */
#include "store/engine/engine_impl.h"

#include <stdlib.h>

#include "store/engine/engine_debug.h"

/* ---------------------------------------------------------------- access time */

/* Under the key's stripe: records an access (meta atime and the LRU entry, one batch). */
static int s_touch_locked(kvedge_engine_t *e, const uint8_t *kb, kvedge_block_meta_t *m,
                          uint64_t now)
{
    kvedge_block_meta_t n = *m;
    n.atime_ms = now;
    uint8_t rec[S_META_RECORD_BYTES], ik[S_INDEX_KEY_BYTES];
    kvedge_engine_meta_pack(&n, rec);
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
 * *blk (and its meta in *m_out when not NULL), KVEDGE_ENOTFOUND, KVEDGE_ECORRUPT
 * (quarantined), or a store error. */
static int s_read_locked(kvedge_engine_t *e, const uint8_t *kb, uint64_t now,
                         rocksdb_pinnableslice_t **blk, kvedge_block_meta_t *m_out)
{
    unsigned s = s_stripe_of(kb);
    kvedge_block_meta_t m;
    bool meta_ok;
    s_lock(e, s);
    int rc = kvedge_engine_load(e, kb, &m, &meta_ok, blk, NULL, false);
    if (rc == S_LOAD_OK) {
        if (s_expired(&m, now)) {
            rocksdb_pinnableslice_destroy(*blk);
            *blk = NULL;
            rc = kvedge_engine_drop_locked(e, kb, &m);
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
        (void)kvedge_engine_quarantine_locked(e, kb, meta_ok ? &m : NULL, *blk);
        if (*blk)
            rocksdb_pinnableslice_destroy(*blk);
        *blk = NULL;
        rc = KVEDGE_ECORRUPT;
    }
    s_unlock(e, s);
    if (rc == KVEDGE_OK && m_out)
        *m_out = m;
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
    if (kvedge_engine_read_meta(e, kb, &m) == KVEDGE_OK && m.checksum == seen->checksum &&
        m.bytes == seen->bytes && !s_expired(&m, now) && s_needs_touch(e, &m, now))
        (void)s_touch_locked(e, kb, &m, now);
    s_unlock(e, s);
}

void kvedge_engine_touch(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_meta_t *seen,
                         uint64_t now)
{
    s_touch_if_same(e, kb, seen, now);
}

/* ---------------------------------------------------------------- put */

/* Capacity is reserved on used (primaries and variants together), so that concurrent puts of
 * either kind never overshoot it; bytes and variant_bytes follow once a write is done. */
bool kvedge_engine_reserve(kvedge_engine_t *e, int64_t delta)
{
    if (delta <= 0 || !e->block_capacity) {
        s_add(&e->used, (uint64_t)delta); /* modular: adds a negative delta too */
        return true;
    }
    uint64_t cur = atomic_load(&e->used);
    do {
        if (cur + (uint64_t)delta > e->block_capacity)
            return false;
    } while (!atomic_compare_exchange_weak(&e->used, &cur, cur + (uint64_t)delta));
    return true;
}

int kvedge_engine_make_room(kvedge_engine_t *e, unsigned s, int64_t delta, uint64_t cap,
                            const uint8_t *kb, bool *evicting, bool *exhausted)
{
    if (kvedge_engine_reserve(e, delta))
        return KVEDGE_OK;
    if (*exhausted)
        return KVEDGE_EFULL;
    /* Ours is dropped while others' blocks are evicted; the caller re-reads its key. */
    s_unlock(e, s);
    if (!*evicting) {
        pthread_mutex_lock(&e->evict_mu);
        *evicting = true;
        s_lock(e, s);
        return 1;
    }
    uint64_t freed = 0;
    int erc = kvedge_engine_evict_locked(e, cap - (uint64_t)delta, kb, &freed, NULL);
    if (freed) /* the evicted blocks' blob files go back to the disk */
        kvedge_engine_disk_compact(e, 2 * e->write_buffer_bytes);
    s_lock(e, s);
    if (erc != KVEDGE_OK && erc != KVEDGE_EFULL)
        return erc;
    *exhausted = erc == KVEDGE_EFULL && freed == 0;
    return 1;
}

/* Checks a put's chunk against the model and the stored record; fills the record to write. */
static int s_put_chunk_check(kvedge_engine_t *e, const kvedge_chunk_info_t *chunk, uint64_t now,
                             kvedge_chunk_info_t *rec)
{
    *rec = *chunk;
    if (!chunk->has_parent)
        memset(rec->parent.bytes, 0, sizeof rec->parent.bytes);
    kvedge_chunk_info_t old;
    int rc = kvedge_engine_read_chunk(e, &chunk->id, &old);
    if (rc == KVEDGE_OK && kvedge_engine_chunk_rebuilt(&old)) {
        /* Rebuilt by repair from its blocks, its model guessed from their shape: the put's
         * record, which knows its model, place in the chain and tenant, replaces it. */
        if (old.tokens != rec->tokens)
            return KVEDGE_ESHAPE;
        rec->created_ms = old.created_ms;
        return KVEDGE_OK;
    }
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

/* A put; full_check false (kvedge_engine_debug_put_unchecked only) skips the lz4 body. */
static int s_put(kvedge_engine_t *e, const kvedge_chunk_info_t *chunk, uint16_t layer,
                 uint16_t head, const uint8_t *block, size_t len, const kvedge_put_opts_t *opts,
                 bool full_check)
{
    if (!e || !chunk || !block || len == 0 ||
        memchr(chunk->model_id, 0, sizeof chunk->model_id) == NULL)
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    kvedge_block_info_t info;
    /* The header first: a body is decoded (below) only once its shape is the model's, so a
     * small block claiming a huge shape costs nothing. */
    int rc = kvedge_block_parse(block, len, &info);
    if (rc != KVEDGE_OK)
        return rc;
    /* An entropy-coded body is a variant the node derives, never a primary: the meta record
     * has no coding bit, so a reader asking for the plain rung would get a version-2 block. */
    if (info.ec)
        return KVEDGE_EINVAL;
    uint64_t cap = e->block_capacity;
    if (cap && len > cap)
        return KVEDGE_ETOOBIG;
    kvedge_model_t model;
    rc = kvedge_engine_get_tenant_model(e, chunk->tenant, chunk->model_id, &model);
    if (rc != KVEDGE_OK)
        return rc == KVEDGE_EINVAL ? KVEDGE_ENOMODEL : rc;
    if (layer >= model.layers || head >= model.kv_heads || info.head_dim != model.head_dim ||
        info.tokens != chunk->tokens)
        return KVEDGE_ESHAPE;
    /* What reads check, so no block stored is refused by a read. */
    if (full_check && (rc = kvedge_block_check(block, len, &info)) != KVEDGE_OK)
        return rc;
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
    int64_t delta, udelta;
    kvedge_engine_vset_t vs;
    /* The new block replaces the data its variants came from: they go in the same batch. */
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    s_lock(e, s);
    for (;;) {
        int orc = kvedge_engine_read_meta(e, kb, &old);
        if (orc != KVEDGE_OK && orc != KVEDGE_ENOTFOUND && orc != KVEDGE_ECORRUPT) {
            rc = orc;
            goto out;
        }
        rocksdb_writebatch_clear(b);
        rc = kvedge_engine_batch_drop_variants(b, e, kb, &vs);
        if (rc != KVEDGE_OK)
            goto out;
        /* A replaced block keeps an operator's pin: pins are lifted only explicitly. */
        have_old = orc == KVEDGE_OK;
        memset(&m, 0, sizeof m);
        m.pinned = (opts && opts->pin) || (have_old && old.pinned);
        delta = (int64_t)len - (have_old ? (int64_t)old.bytes : 0);
        udelta = delta - (int64_t)vs.bytes;
        if (cap) {
            uint64_t pinned_other =
                s_get(&e->pinned_bytes) - (have_old && old.pinned ? old.bytes : 0);
            if (pinned_other + len > cap) {
                rc = KVEDGE_EFULL;
                goto out;
            }
        }
        rc = kvedge_engine_make_room(e, s, udelta, cap, kb, &evicting, &exhausted);
        if (rc == KVEDGE_OK)
            break;
        if (rc < 0)
            goto out;
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
    kvedge_engine_meta_pack(&m, rec);
    size_t plen = kvedge_engine_prefix_pack(&crec, prec);
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
    if (rc != KVEDGE_OK) {
        s_sub(&e->used, (uint64_t)udelta); /* give the reservation back */
        goto out;
    }
    /* used moved already, by udelta; the other totals follow. */
    s_add(&e->bytes, (uint64_t)delta);
    s_sub(&e->variant_blocks, vs.n);
    s_sub(&e->variant_bytes, vs.bytes);
    if (have_old)
        kvedge_engine_totals(e, &old, false, false);
    kvedge_engine_totals(e, &m, true, false);
    s_add(&e->puts, 1);
    s_add(&e->bytes_written, len);
out:
    s_unlock(e, s);
    rocksdb_writebatch_destroy(b);
    if (evicting)
        pthread_mutex_unlock(&e->evict_mu);
    return rc;
}

int kvedge_engine_put(kvedge_engine_t *e, const kvedge_chunk_info_t *chunk, uint16_t layer,
                      uint16_t head, const uint8_t *block, size_t len,
                      const kvedge_put_opts_t *opts)
{
    return s_put(e, chunk, layer, head, block, len, opts, true);
}

int kvedge_engine_debug_put_unchecked(kvedge_engine_t *e, const kvedge_chunk_info_t *chunk,
                                      uint16_t layer, uint16_t head, const uint8_t *block,
                                      size_t len)
{
    return s_put(e, chunk, layer, head, block, len, NULL, false);
}

/* ---------------------------------------------------------------- get */

/* priv of a value whose data is a malloc'd buffer of the engine's (a derived block), not a
 * pinned RocksDB value. */
static const uint8_t s_value_owned;

void kvedge_value_release(kvedge_value_t *v)
{
    if (!v)
        return;
    if (v->priv == &s_value_owned)
        free((void *)v->data);
    else if (v->priv)
        rocksdb_pinnableslice_destroy(v->priv);
    memset(v, 0, sizeof *v);
}

void kvedge_engine_value_own(kvedge_value_t *v, uint8_t *buf, size_t len)
{
    v->data = buf;
    v->len = len;
    v->priv = (void *)&s_value_owned;
}

int kvedge_engine_read_primary(kvedge_engine_t *e, const uint8_t *kb, uint64_t now,
                               kvedge_block_meta_t *m, rocksdb_pinnableslice_t **blk)
{
    bool meta_ok;
    int rc = kvedge_engine_load(e, kb, m, &meta_ok, blk, NULL, false);
    if (rc < 0)
        return rc;
    bool ro = e->opts.read_only;
    if (rc == S_LOAD_OK && !s_expired(m, now)) {
        if (!ro && s_needs_touch(e, m, now))
            s_touch_if_same(e, kb, m, now);
        rc = KVEDGE_OK;
    } else if (rc == S_LOAD_MISSING) {
        rc = KVEDGE_ENOTFOUND;
    } else if (ro) {
        rc = rc == S_LOAD_OK ? KVEDGE_ENOTFOUND : KVEDGE_ECORRUPT;
    } else {
        if (*blk)
            rocksdb_pinnableslice_destroy(*blk);
        *blk = NULL;
        rc = s_read_locked(e, kb, now, blk, m);
    }
    if (rc != KVEDGE_OK && *blk) {
        rocksdb_pinnableslice_destroy(*blk);
        *blk = NULL;
    }
    return rc;
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
    kvedge_block_meta_t m;
    rocksdb_pinnableslice_t *blk;
    int rc = kvedge_engine_read_primary(e, kb, s_now(e), &m, &blk);
    if (rc != KVEDGE_OK) {
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
    return kvedge_engine_read_meta(e, kb, out);
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
    kvedge_engine_walk_t w;
    kvedge_engine_walk_open(&w, e, NULL, lower, sizeof lower, upper, sizeof upper, false, true);
    bool read_only = e->opts.read_only;
    uint64_t now = s_now(e);
    int rc = KVEDGE_OK, delivered = 0;
    for (; w.valid; kvedge_engine_walk_next(&w)) {
        size_t klen, vlen;
        const uint8_t *kb = kvedge_engine_walk_key(&w, &klen);
        if (klen != KVEDGE_BLOCK_KEY_BYTES)
            continue;
        uint16_t head = kvedge_be_get16(kb + KVEDGE_CHUNK_ID_BYTES + 2);
        const uint8_t *data = kvedge_engine_walk_value(&w, &vlen);
        s_add(&e->gets, 1);
        kvedge_block_meta_t m;
        int mrc = kvedge_engine_read_meta(e, kb, &m);
        if (mrc != KVEDGE_OK && mrc != KVEDGE_ENOTFOUND && mrc != KVEDGE_ECORRUPT) {
            rc = mrc;
            break;
        }
        bool good =
            data && mrc == KVEDGE_OK && kvedge_engine_check_block(data, vlen, &m) == KVEDGE_OK;
        int status;
        rocksdb_pinnableslice_t *blk = NULL;
        if (good && !s_expired(&m, now)) {
            if (!read_only && s_needs_touch(e, &m, now))
                s_touch_if_same(e, kb, &m, now);
            status = KVEDGE_OK;
        } else if (read_only) {
            status = good ? KVEDGE_ENOTFOUND : KVEDGE_ECORRUPT;
        } else {
            status = s_read_locked(e, kb, now, &blk, NULL);
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
    rc = kvedge_engine_walk_close(&w, rc);
    return rc == KVEDGE_OK ? delivered : rc;
}
