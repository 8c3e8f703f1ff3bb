/* Block variants: other precisions of a block (access/codec/prec.h) held beside its primary, bound
 * to it, served by rung or by a reader's accept list, and derived on the fly when none is held. */
#include "store/engine/engine_impl.h"

#include <stdlib.h>

/* What loading one variant found (besides S_LOAD_OK, S_LOAD_MISSING and S_LOAD_BAD). */
enum {
    S_VLOAD_STALE = S_LOAD_BAD + 1, /* bound to another primary than the one stored now */
};

/* ---------------------------------------------------------------- keys and rungs */

static void s_vkey(const uint8_t *kb, kvedge_prec_t prec, uint8_t out[S_VARIANT_KEY_BYTES])
{
    memcpy(out, kb, KVEDGE_BLOCK_KEY_BYTES);
    out[KVEDGE_BLOCK_KEY_BYTES] = prec;
}

/* The rung of a primary from its meta: the rung whose encoding (scheme, group, key channels
 * kept) the meta describes, shallowest ThinK level first, as kvedge_prec_of_block reads a
 * header; KVEDGE_PREC_STORED when none. */
static kvedge_prec_t s_meta_prec(const kvedge_block_meta_t *m)
{
    return kvedge_prec_of_shape(m->scheme, m->group_size, m->key_channels, m->head_dim);
}

/* Finest first: base rung, then ThinK level (a rung off the ladder, 0, sorts first). */
static unsigned s_fineness(kvedge_prec_t p)
{
    return KVEDGE_PREC_BASE(p) * 4u + KVEDGE_PREC_THINK(p);
}

static bool s_has_family(const kvedge_engine_t *e)
{
    return e->cf[S_CF_VARIANTS] != NULL;
}

/* ---------------------------------------------------------------- checks */

/* Checks a variant record of rung prec against the primary whose meta is m: the block
 * (kvedge_block_check), its binding, then its rung and the primary's shape. Returns S_LOAD_OK
 * (info filled, pointing into v), S_LOAD_BAD (*why: the error), S_VLOAD_STALE, or
 * KVEDGE_ENOMEM (no verdict). */
static int s_check_variant(const uint8_t *v, size_t vlen, kvedge_prec_t prec,
                           const kvedge_block_meta_t *m, kvedge_block_info_t *info, int *why)
{
    *why = KVEDGE_ECORRUPT;
    if (vlen <= S_VARIANT_HEAD_BYTES || !kvedge_prec_valid(prec))
        return S_LOAD_BAD;
    int rc = kvedge_block_check(v + S_VARIANT_HEAD_BYTES, vlen - S_VARIANT_HEAD_BYTES, info);
    if (rc == KVEDGE_ENOMEM)
        return rc;
    if (rc != KVEDGE_OK) {
        *why = rc;
        return S_LOAD_BAD;
    }
    /* Bound to another primary: its shape and rung say nothing about this one. */
    if (kvedge_le_get64(v) != m->checksum)
        return S_VLOAD_STALE;
    if (kvedge_prec_of_block(info) != prec || info->tokens != m->tokens ||
        info->head_dim != m->head_dim || info->dtype != m->dtype)
        return S_LOAD_BAD;
    return S_LOAD_OK;
}

int kvedge_engine_check_variant(const uint8_t *v, size_t vlen, kvedge_prec_t prec,
                                const kvedge_block_meta_t *m)
{
    kvedge_block_info_t info;
    int why;
    int rc = s_check_variant(v, vlen, prec, m, &info, &why);
    return rc == S_LOAD_OK ? KVEDGE_OK : rc == KVEDGE_ENOMEM ? rc : KVEDGE_ECORRUPT;
}

/* Reads the variant of rung prec of kb and checks it against m. *p holds the record on
 * S_LOAD_OK, S_LOAD_BAD and S_VLOAD_STALE (NULL when RocksDB could not read it back); info and
 * *why as s_check_variant. Negative: a store error or KVEDGE_ENOMEM. */
static int s_load_variant(kvedge_engine_t *e, const uint8_t *kb, kvedge_prec_t prec,
                          const kvedge_block_meta_t *m, rocksdb_pinnableslice_t **p,
                          kvedge_block_info_t *info, int *why)
{
    *p = NULL;
    *why = KVEDGE_ECORRUPT;
    if (!s_has_family(e))
        return S_LOAD_MISSING;
    uint8_t vk[S_VARIANT_KEY_BYTES];
    s_vkey(kb, prec, vk);
    int rc = kvedge_engine_pget(e, e->ro_blk, S_CF_VARIANTS, vk, sizeof vk, p);
    if (rc == KVEDGE_ENOTFOUND)
        return S_LOAD_MISSING;
    if (rc == KVEDGE_ECORRUPT)
        return S_LOAD_BAD;
    if (rc != KVEDGE_OK)
        return rc;
    size_t vlen;
    const uint8_t *v = s_pval(*p, &vlen);
    rc = s_check_variant(v, vlen, prec, m, info, why);
    if (rc != KVEDGE_ENOMEM)
        return rc;
    rocksdb_pinnableslice_destroy(*p);
    *p = NULL;
    return rc;
}

/* ---------------------------------------------------------------- totals and drops */

void kvedge_engine_variants_gone(kvedge_engine_t *e, const kvedge_engine_vset_t *vs)
{
    s_sub(&e->variant_blocks, vs->n);
    s_sub(&e->variant_bytes, vs->bytes);
    s_sub(&e->used, vs->bytes);
}

int kvedge_engine_batch_drop_variants(rocksdb_writebatch_t *b, kvedge_engine_t *e,
                                      const uint8_t *kb, kvedge_engine_vset_t *vs)
{
    memset(vs, 0, sizeof *vs);
    if (!s_has_family(e))
        return KVEDGE_OK;
    uint8_t upper[S_VARIANT_UPPER_BYTES];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_variant_iter(e, kb, upper, &ro);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        (void)rocksdb_iter_value(it, &vlen);
        rocksdb_writebatch_delete_cf(b, e->cf[S_CF_VARIANTS], k, klen);
        if (klen == S_VARIANT_KEY_BYTES) { /* what the totals counted at open */
            vs->n++;
            vs->bytes += s_variant_bytes(vlen);
        }
    }
    return kvedge_engine_iter_close(it, ro, KVEDGE_OK);
}

int kvedge_engine_load_variant_totals(kvedge_engine_t *e)
{
    if (!s_has_family(e))
        return KVEDGE_OK;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_VARIANTS, NULL, 0, NULL, 0, &ro);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        (void)rocksdb_iter_key(it, &klen);
        (void)rocksdb_iter_value(it, &vlen);
        if (klen != S_VARIANT_KEY_BYTES)
            continue;
        s_add(&e->variant_blocks, 1);
        s_add(&e->variant_bytes, s_variant_bytes(vlen));
        s_add(&e->used, s_variant_bytes(vlen));
    }
    return kvedge_engine_iter_close(it, ro, KVEDGE_OK);
}

/* Under kb's stripe: deletes the variant record at vk (vlen: its length, for the totals). */
static int s_drop_record_locked(kvedge_engine_t *e, const uint8_t *vk, size_t vlen)
{
    char *err = NULL;
    rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_VARIANTS], (const char *)vk, S_VARIANT_KEY_BYTES,
                      &err);
    if (err)
        return s_write_error(e, &err);
    kvedge_engine_vset_t vs = {1, s_variant_bytes(vlen)};
    kvedge_engine_variants_gone(e, &vs);
    return KVEDGE_OK;
}

/* Under kb's stripe: moves a bad variant record to quarantine (its block bytes, or nothing
 * when RocksDB could not read it back) and drops it. */
static int s_quarantine_locked(kvedge_engine_t *e, const uint8_t *vk,
                               const rocksdb_pinnableslice_t *p)
{
    rocksdb_pinnableslice_t *old;
    int rc = s_pget(e, S_CF_QUARANTINE, vk, S_VARIANT_KEY_BYTES, &old);
    if (rc != KVEDGE_OK && rc != KVEDGE_ENOTFOUND)
        return rc;
    bool had = rc == KVEDGE_OK;
    if (old)
        rocksdb_pinnableslice_destroy(old);
    size_t vlen = 0;
    const uint8_t *v = p ? s_pval(p, &vlen) : (const uint8_t *)"";
    size_t skip = vlen > S_VARIANT_HEAD_BYTES ? S_VARIANT_HEAD_BYTES : 0;
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(b, e->cf[S_CF_QUARANTINE], (const char *)vk, S_VARIANT_KEY_BYTES,
                              (const char *)v + skip, vlen - skip);
    rocksdb_writebatch_delete_cf(b, e->cf[S_CF_VARIANTS], (const char *)vk, S_VARIANT_KEY_BYTES);
    rc = s_write(e, b);
    rocksdb_writebatch_destroy(b);
    if (rc != KVEDGE_OK)
        return rc;
    /* A record RocksDB could not read back leaves its bytes counted until the next open. */
    kvedge_engine_vset_t vs = {1, s_variant_bytes(vlen)};
    kvedge_engine_variants_gone(e, &vs);
    if (!had)
        s_add(&e->quarantined, 1);
    return KVEDGE_OK;
}

int kvedge_engine_drop_chunk_variants(kvedge_engine_t *e, const kvedge_chunk_id_t *id)
{
    if (!s_has_family(e))
        return KVEDGE_OK;
    uint8_t upper[S_UPPER_BYTES];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_chunk_iter(e, S_CF_VARIANTS, id, upper, &ro);
    int rc = KVEDGE_OK;
    for (; rc == KVEDGE_OK && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *vk = (const uint8_t *)rocksdb_iter_key(it, &klen);
        (void)rocksdb_iter_value(it, &vlen);
        if (klen != S_VARIANT_KEY_BYTES)
            continue;
        unsigned s = s_stripe_of(vk);
        s_lock(e, s);
        kvedge_block_meta_t m;
        int mrc = kvedge_engine_read_meta(e, vk, &m);
        if (mrc == KVEDGE_ENOTFOUND || mrc == KVEDGE_ECORRUPT) {
            /* Still there under the stripe? A put since may have bound a new one. */
            rocksdb_pinnableslice_t *p;
            int prc = s_pget(e, S_CF_VARIANTS, vk, S_VARIANT_KEY_BYTES, &p);
            if (p)
                rocksdb_pinnableslice_destroy(p);
            if (prc == KVEDGE_OK || prc == KVEDGE_ECORRUPT)
                rc = s_drop_record_locked(e, vk, vlen);
            else if (prc != KVEDGE_ENOTFOUND)
                rc = prc;
        } else if (mrc != KVEDGE_OK) {
            rc = mrc;
        }
        s_unlock(e, s);
    }
    return kvedge_engine_iter_close(it, ro, rc);
}

/* ---------------------------------------------------------------- the primary */

/* The primary's meta for a variant operation: 0, or KVEDGE_ENOTFOUND when there is no live
 * primary (missing, unreadable or expired: an expired one is deleted with its variants here,
 * as a get does). Store errors as they are. */
static int s_primary(kvedge_engine_t *e, const uint8_t *kb, uint64_t now, kvedge_block_meta_t *m)
{
    int rc = kvedge_engine_read_meta(e, kb, m);
    if (rc == KVEDGE_ECORRUPT)
        return KVEDGE_ENOTFOUND; /* a get of the primary quarantines it */
    if (rc != KVEDGE_OK || !s_expired(m, now))
        return rc;
    if (e->opts.read_only)
        return KVEDGE_ENOTFOUND;
    unsigned s = s_stripe_of(kb);
    s_lock(e, s);
    kvedge_block_meta_t f;
    rc = kvedge_engine_read_meta(e, kb, &f);
    if (rc == KVEDGE_OK && s_expired(&f, now)) {
        rc = kvedge_engine_drop_locked(e, kb, &f);
        if (rc == KVEDGE_OK)
            s_add(&e->expired, 1);
    } else if (rc == KVEDGE_OK) {
        *m = f; /* re-put since: live again */
    }
    s_unlock(e, s);
    if (rc == KVEDGE_OK && s_expired(m, now))
        rc = KVEDGE_ENOTFOUND;
    return rc == KVEDGE_ECORRUPT ? KVEDGE_ENOTFOUND : rc;
}

/* ---------------------------------------------------------------- serving one variant */

/* Under kb's stripe, once a lock-free load found a variant bad or stale: loads it again
 * against the primary as it is now and settles it (quarantine when bad, drop when stale or
 * orphaned). Returns S_LOAD_OK with *p and info (it was replaced meanwhile and is sound),
 * KVEDGE_ENOTFOUND, KVEDGE_ECORRUPT (quarantined), or a store error. */
static int s_settle(kvedge_engine_t *e, const uint8_t *kb, kvedge_prec_t prec,
                    rocksdb_pinnableslice_t **p, kvedge_block_info_t *info)
{
    unsigned s = s_stripe_of(kb);
    uint8_t vk[S_VARIANT_KEY_BYTES];
    s_vkey(kb, prec, vk);
    *p = NULL;
    s_lock(e, s);
    kvedge_block_meta_t m;
    int rc = kvedge_engine_read_meta(e, kb, &m);
    int why;
    if (rc == KVEDGE_OK) {
        rc = s_load_variant(e, kb, prec, &m, p, info, &why);
    } else if (rc == KVEDGE_ENOTFOUND || rc == KVEDGE_ECORRUPT) {
        /* No primary to be bound to: whatever record is there is an orphan. */
        rc = kvedge_engine_pget(e, e->ro_blk, S_CF_VARIANTS, vk, sizeof vk, p);
        if (rc == KVEDGE_OK || rc == KVEDGE_ECORRUPT)
            rc = S_VLOAD_STALE;
        else if (rc == KVEDGE_ENOTFOUND)
            rc = S_LOAD_MISSING;
    }
    if (rc == S_LOAD_BAD) {
        rc = s_quarantine_locked(e, vk, *p);
        if (rc == KVEDGE_OK)
            rc = KVEDGE_ECORRUPT;
    } else if (rc == S_VLOAD_STALE) {
        size_t vlen = 0;
        if (*p)
            (void)s_pval(*p, &vlen);
        rc = s_drop_record_locked(e, vk, vlen);
        if (rc == KVEDGE_OK)
            rc = KVEDGE_ENOTFOUND;
    } else if (rc == S_LOAD_MISSING) {
        rc = KVEDGE_ENOTFOUND;
    }
    s_unlock(e, s);
    if (rc != S_LOAD_OK && *p) {
        rocksdb_pinnableslice_destroy(*p);
        *p = NULL;
    }
    return rc;
}

/* Serves the variant of rung prec of kb, whose primary's meta is m: verified, settled when bad
 * or stale, the primary's access recorded. 0 with out (and info, pointing into it), else
 * KVEDGE_ENOTFOUND, KVEDGE_ECORRUPT (counted as corrupt) or a store error. */
static int s_serve_variant(kvedge_engine_t *e, const uint8_t *kb, kvedge_prec_t prec,
                           const kvedge_block_meta_t *m, uint64_t now, kvedge_value_t *out,
                           kvedge_block_info_t *info)
{
    rocksdb_pinnableslice_t *p;
    int why;
    int rc = s_load_variant(e, kb, prec, m, &p, info, &why);
    if (rc != S_LOAD_OK && rc >= 0) {
        if (p)
            rocksdb_pinnableslice_destroy(p);
        p = NULL;
        if (rc == S_LOAD_MISSING)
            rc = KVEDGE_ENOTFOUND;
        else if (e->opts.read_only)
            rc = rc == S_LOAD_BAD ? KVEDGE_ECORRUPT : KVEDGE_ENOTFOUND;
        else
            rc = s_settle(e, kb, prec, &p, info);
        if (rc == KVEDGE_ECORRUPT)
            s_add(&e->corrupt, 1);
    }
    if (rc != S_LOAD_OK)
        return rc;
    size_t vlen;
    const uint8_t *v = s_pval(p, &vlen);
    out->data = v + S_VARIANT_HEAD_BYTES;
    out->len = vlen - S_VARIANT_HEAD_BYTES;
    out->priv = p;
    if (!e->opts.read_only && s_needs_touch(e, m, now))
        kvedge_engine_touch(e, kb, m, now);
    return KVEDGE_OK;
}

/* The statistics of one variant read that ended with rc. */
static int s_count(kvedge_engine_t *e, int rc, const kvedge_value_t *out)
{
    if (rc == KVEDGE_OK) {
        s_add(&e->hits, 1);
        s_add(&e->bytes_read, out->len);
    } else if (rc == KVEDGE_ENOTFOUND || rc == KVEDGE_ECORRUPT) {
        s_add(&e->misses, 1);
    }
    return rc;
}

/* ---------------------------------------------------------------- API */

int kvedge_engine_put_variant(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_prec_t prec,
                              const uint8_t *block, size_t len)
{
    if (!e || !key || !block || len == 0 || !kvedge_prec_valid(prec))
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    kvedge_block_info_t info;
    int rc = kvedge_block_check(block, len, &info);
    if (rc != KVEDGE_OK)
        return rc;
    if (kvedge_prec_of_block(&info) != prec)
        return KVEDGE_EINVAL;
    uint64_t cap = e->block_capacity;
    if (cap && len > cap)
        return KVEDGE_ETOOBIG;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES], vk[S_VARIANT_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    s_vkey(kb, prec, vk);
    uint64_t now = s_now(e);
    unsigned s = s_stripe_of(kb);
    bool evicting = false, exhausted = false, had = false;
    kvedge_block_meta_t m;
    int64_t delta = 0;
    s_lock(e, s);
    for (;;) {
        rc = kvedge_engine_read_meta(e, kb, &m);
        if (rc == KVEDGE_ECORRUPT || (rc == KVEDGE_OK && s_expired(&m, now)))
            rc = KVEDGE_ENOTFOUND;
        if (rc != KVEDGE_OK)
            goto out;
        if (info.tokens != m.tokens || info.head_dim != m.head_dim || info.dtype != m.dtype) {
            rc = KVEDGE_ESHAPE;
            goto out;
        }
        if (s_meta_prec(&m) == prec) {
            rc = KVEDGE_EINVAL; /* the primary already is this precision */
            goto out;
        }
        rocksdb_pinnableslice_t *p;
        rc = s_pget(e, S_CF_VARIANTS, vk, sizeof vk, &p);
        if (rc != KVEDGE_OK && rc != KVEDGE_ENOTFOUND && rc != KVEDGE_ECORRUPT)
            goto out;
        size_t old_len = 0;
        had = rc != KVEDGE_ENOTFOUND;
        if (p) {
            (void)s_pval(p, &old_len);
            rocksdb_pinnableslice_destroy(p);
        }
        /* An unreadable old record counts as nothing, as the totals' open pass counts it. */
        delta = (int64_t)len - (int64_t)s_variant_bytes(old_len);
        rc = KVEDGE_OK;
        if (cap && s_get(&e->pinned_bytes) + len > cap) {
            rc = KVEDGE_EFULL;
            goto out;
        }
        rc = kvedge_engine_make_room(e, s, delta, cap, kb, &evicting, &exhausted);
        if (rc == KVEDGE_OK)
            break;
        if (rc < 0)
            goto out;
    }
    rc = s_variant_write(e, vk, m.checksum, block, len);
    if (rc != KVEDGE_OK) {
        s_sub(&e->used, (uint64_t)delta); /* give the reservation back */
        goto out;
    }
    if (!had)
        s_add(&e->variant_blocks, 1);
    s_add(&e->variant_bytes, (uint64_t)delta);
    s_add(&e->puts, 1);
    s_add(&e->bytes_written, len);
out:
    s_unlock(e, s);
    if (evicting)
        pthread_mutex_unlock(&e->evict_mu);
    return rc;
}

int kvedge_engine_get_variant(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_prec_t prec,
                              kvedge_value_t *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!e || !key || !out || !kvedge_prec_valid(prec))
        return KVEDGE_EINVAL;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    s_add(&e->gets, 1);
    uint64_t now = s_now(e);
    kvedge_block_meta_t m;
    int rc = s_primary(e, kb, now, &m);
    if (rc == KVEDGE_OK) {
        kvedge_block_info_t info;
        rc = s_serve_variant(e, kb, prec, &m, now, out, &info);
    }
    return s_count(e, rc, out);
}

/* Rungs held as variants of kb bound to the primary m, ascending (key order). */
static int s_list(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_meta_t *m,
                  kvedge_prec_t *out, size_t max, size_t *n)
{
    *n = 0;
    if (!s_has_family(e))
        return KVEDGE_OK;
    uint8_t upper[S_VARIANT_UPPER_BYTES];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_variant_iter(e, kb, upper, &ro);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        if (klen != S_VARIANT_KEY_BYTES)
            continue;
        kvedge_prec_t p = k[KVEDGE_BLOCK_KEY_BYTES];
        if (!kvedge_prec_valid(p) || vlen <= S_VARIANT_HEAD_BYTES ||
            kvedge_le_get64(v) != m->checksum)
            continue; /* not a variant of this primary */
        if (*n < max)
            out[*n] = p;
        (*n)++;
    }
    return kvedge_engine_iter_close(it, ro, KVEDGE_OK);
}

int kvedge_engine_variants(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_prec_t *out,
                           size_t max, size_t *n)
{
    if (n)
        *n = 0;
    if (!e || !key || !n || (max && !out))
        return KVEDGE_EINVAL;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    kvedge_block_meta_t m;
    int rc = s_primary(e, kb, s_now(e), &m);
    if (rc != KVEDGE_OK)
        return rc;
    return s_list(e, kb, &m, out, max, n);
}

int kvedge_engine_drop_variant(kvedge_engine_t *e, const kvedge_block_key_t *key,
                               kvedge_prec_t prec)
{
    if (!e || !key || !kvedge_prec_valid(prec))
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES], vk[S_VARIANT_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    s_vkey(kb, prec, vk);
    unsigned s = s_stripe_of(kb);
    s_lock(e, s);
    rocksdb_pinnableslice_t *p;
    int rc = s_pget(e, S_CF_VARIANTS, vk, sizeof vk, &p);
    if (rc == KVEDGE_OK || rc == KVEDGE_ECORRUPT) {
        size_t vlen = 0;
        if (p)
            (void)s_pval(p, &vlen);
        rc = s_drop_record_locked(e, vk, vlen);
    }
    if (p)
        rocksdb_pinnableslice_destroy(p);
    s_unlock(e, s);
    return rc;
}

int kvedge_engine_transcode(kvedge_engine_t *e, const uint8_t *kb, const kvedge_block_info_t *info,
                            kvedge_prec_t to, uint8_t **out, size_t *out_len)
{
    if (KVEDGE_PREC_BASE(to) != KVEDGE_PREC_TC)
        return kvedge_block_transcode(info, to, true, out, out_len);
    kvedge_block_key_t key;
    kvedge_block_key_unpack(kb, &key);
    kvedge_chunk_info_t ci;
    int rc = kvedge_engine_read_chunk(e, &key.chunk, &ci);
    if (rc == KVEDGE_ENOTFOUND || rc == KVEDGE_ECORRUPT)
        return KVEDGE_ENOBASIS; /* no record names the block's model */
    if (rc != KVEDGE_OK)
        return rc;
    return kvedge_block_transcode_at(info, to, true, ci.model_id, key.layer, key.head, out,
                                     out_len);
}

/* One source a rung may be derived from: the primary (is_primary) or a held variant. */
typedef struct {
    kvedge_prec_t prec;
    bool is_primary;
} s_source_t;

/* Derives rung `to` from one source: 0 with out owning the block, KVEDGE_EINVAL when the
 * source cannot give it, KVEDGE_ENOBASIS when no source can (a transform-coded rung of a model
 * whose basis this process lacks), KVEDGE_ENOTFOUND when the source is gone, KVEDGE_ECORRUPT (a
 * bad source, quarantined), or an error. *primary_bad is set when the primary was the bad one. */
static int s_derive(kvedge_engine_t *e, const uint8_t *kb, const s_source_t *src, kvedge_prec_t to,
                    const kvedge_block_meta_t *m, uint64_t now, kvedge_value_t *out,
                    bool *primary_bad)
{
    kvedge_value_t v = {0};
    kvedge_block_info_t info;
    int rc;
    if (src->is_primary) {
        rocksdb_pinnableslice_t *blk;
        kvedge_block_meta_t pm;
        rc = kvedge_engine_read_primary(e, kb, now, &pm, &blk);
        if (rc == KVEDGE_ECORRUPT) {
            s_add(&e->corrupt, 1);
            *primary_bad = true;
        }
        if (rc != KVEDGE_OK)
            return rc;
        v.data = s_pval(blk, &v.len);
        v.priv = blk;
        rc = kvedge_block_parse(v.data, v.len, &info); /* verified: fills info */
    } else {
        rc = s_serve_variant(e, kb, src->prec, m, now, &v, &info);
    }
    if (rc == KVEDGE_OK) {
        uint8_t *buf = NULL;
        size_t len = 0;
        rc = kvedge_engine_transcode(e, kb, &info, to, &buf, &len);
        if (rc == KVEDGE_OK)
            kvedge_engine_value_own(out, buf, len);
    }
    kvedge_value_release(&v);
    return rc;
}

int kvedge_engine_get_prec(kvedge_engine_t *e, const kvedge_block_key_t *key,
                           const kvedge_prec_t *accept, size_t n, bool derive, kvedge_value_t *out,
                           kvedge_prec_t *served, bool *derived)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (served)
        *served = KVEDGE_PREC_STORED;
    if (derived)
        *derived = false;
    if (!e || !key || !out || !served || !accept || kvedge_prec_list_check(accept, n) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    s_add(&e->gets, 1);
    uint64_t now = s_now(e);
    kvedge_block_meta_t m;
    int rc = s_primary(e, kb, now, &m);
    if (rc != KVEDGE_OK)
        return s_count(e, rc, out);
    kvedge_prec_t pp = s_meta_prec(&m);
    /* Every rung a variant can be at, ascending: the ladder has fewer than 128. */
    kvedge_prec_t held[KVEDGE_PREC_THINK_MASK | KVEDGE_PREC_BASE_MASK];
    size_t n_held;
    rc = s_list(e, kb, &m, held, sizeof held / sizeof held[0], &n_held);
    if (rc != KVEDGE_OK)
        return rc;
    if (n_held > sizeof held / sizeof held[0])
        n_held = sizeof held / sizeof held[0];
    bool gone[sizeof held / sizeof held[0]] = {false}; /* found bad or missing on the way */

    /* Held: the primary at its rung, else a variant. */
    for (size_t i = 0; i < n; i++) {
        if (accept[i] == pp) {
            rocksdb_pinnableslice_t *blk;
            kvedge_block_meta_t pm;
            rc = kvedge_engine_read_primary(e, kb, now, &pm, &blk);
            if (rc == KVEDGE_OK && s_meta_prec(&pm) != pp) {
                /* Put again at another rung since we looked (its variants went with the old
                 * one): a miss rather than a block the reader may not accept. */
                rocksdb_pinnableslice_destroy(blk);
                rc = KVEDGE_ENOTFOUND;
            } else if (rc == KVEDGE_OK) {
                out->data = s_pval(blk, &out->len);
                out->priv = blk;
                *served = pp;
            } else if (rc == KVEDGE_ECORRUPT) {
                s_add(&e->corrupt, 1); /* quarantined with its variants: nothing else left */
            }
            return s_count(e, rc, out);
        }
        for (size_t j = 0; j < n_held; j++) {
            if (held[j] != accept[i] || gone[j])
                continue;
            kvedge_block_info_t info;
            rc = s_serve_variant(e, kb, held[j], &m, now, out, &info);
            if (rc == KVEDGE_OK) {
                *served = held[j];
                return s_count(e, rc, out);
            }
            if (rc != KVEDGE_ENOTFOUND && rc != KVEDGE_ECORRUPT)
                return rc;
            gone[j] = true; /* the next acceptable option is tried */
        }
    }
    if (!derive)
        return s_count(e, KVEDGE_ENOTFOUND, out);

    /* Derived: the first acceptable rung any source gives, finest source first. */
    s_source_t src[sizeof held / sizeof held[0] + 1];
    size_t n_src = 0;
    src[n_src++] = (s_source_t){pp, true};
    for (size_t j = 0; j < n_held; j++)
        if (!gone[j])
            src[n_src++] = (s_source_t){held[j], false};
    for (size_t a = 1; a < n_src; a++) /* insertion sort: a handful at most */
        for (size_t b = a; b > 0 && s_fineness(src[b].prec) < s_fineness(src[b - 1].prec); b--) {
            s_source_t t = src[b];
            src[b] = src[b - 1];
            src[b - 1] = t;
        }
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < n_src; j++) {
            /* A primary off the ladder derives what kvedge_block_transcode allows it. */
            bool may = src[j].prec == KVEDGE_PREC_STORED
                           ? src[j].is_primary
                           : kvedge_prec_derivable(src[j].prec, accept[i]);
            if (!may)
                continue;
            bool primary_bad = false;
            rc = s_derive(e, kb, &src[j], accept[i], &m, now, out, &primary_bad);
            if (rc == KVEDGE_OK) {
                *served = accept[i];
                if (derived)
                    *derived = true;
                return s_count(e, rc, out);
            }
            if (primary_bad || (src[j].is_primary && rc == KVEDGE_ENOTFOUND))
                return s_count(e, rc, out); /* the primary gone: its variants went with it */
            if (rc == KVEDGE_ENOBASIS)
                break; /* no source gives this rung here: the next acceptable one is tried */
            if (rc != KVEDGE_EINVAL && rc != KVEDGE_ENOTFOUND && rc != KVEDGE_ECORRUPT)
                return rc;
            if (!src[j].is_primary && rc != KVEDGE_EINVAL)
                src[j].prec = KVEDGE_PREC_STORED; /* gone: never a source again */
        }
    }
    return s_count(e, KVEDGE_ENOTFOUND, out);
}

int kvedge_engine_variant_stats(kvedge_engine_t *e, uint64_t *blocks, uint64_t *bytes)
{
    if (!e)
        return KVEDGE_EINVAL;
    if (blocks)
        *blocks = s_get(&e->variant_blocks);
    if (bytes)
        *bytes = s_get(&e->variant_bytes);
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- verify */

int kvedge_engine_verify_variants(kvedge_engine_t *e, bool quarantine, kvedge_verify_cb cb,
                                  void *ctx, uint64_t *checked, uint64_t *bad)
{
    if (!s_has_family(e))
        return KVEDGE_OK;
    /* RocksDB checks its own checksums here too (the default read options). */
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_VARIANTS, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    for (; rc == KVEDGE_OK && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *vk = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        if (klen != S_VARIANT_KEY_BYTES)
            continue;
        kvedge_prec_t prec = vk[KVEDGE_BLOCK_KEY_BYTES];
        kvedge_block_meta_t m;
        int mrc = kvedge_engine_read_meta(e, vk, &m);
        if (mrc != KVEDGE_OK && mrc != KVEDGE_ENOTFOUND && mrc != KVEDGE_ECORRUPT) {
            rc = mrc;
            break;
        }
        kvedge_block_info_t info;
        int why = KVEDGE_OK;
        int st = mrc == KVEDGE_OK ? s_check_variant(v, vlen, prec, &m, &info, &why) : S_VLOAD_STALE;
        if (st == KVEDGE_ENOMEM) {
            rc = st; /* no verdict: stop rather than report a sound variant */
            break;
        }
        if (st != S_VLOAD_STALE)
            (*checked)++;
        if (st == S_LOAD_OK || (st == S_VLOAD_STALE && !quarantine))
            continue;
        if (st == S_LOAD_BAD)
            (*bad)++;
        if (quarantine) {
            rocksdb_pinnableslice_t *p;
            kvedge_block_info_t info2;
            int s_rc = s_settle(e, vk, prec, &p, &info2);
            if (p)
                rocksdb_pinnableslice_destroy(p);
            if (s_rc == KVEDGE_ECORRUPT)
                s_add(&e->corrupt, 1);
            else if (s_rc < 0 && s_rc != KVEDGE_ENOTFOUND)
                rc = s_rc;
        }
        if (rc == KVEDGE_OK && st == S_LOAD_BAD && cb) {
            kvedge_block_key_t key;
            kvedge_block_key_unpack(vk, &key);
            rc = cb(ctx, &key, why);
        }
    }
    return kvedge_engine_iter_close(it, ro, rc);
}
