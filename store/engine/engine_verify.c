/* Verification and quarantine: a block checked against itself and its meta (every read does
 * it), bad blocks moved aside, the full scrub, and the fault injection its tests use. */
#include "store/engine/engine_impl.h"

#include "store/engine/engine_debug.h"

/* ---------------------------------------------------------------- checks and quarantine */

int kvedge_engine_check_block(const uint8_t *data, size_t len, const kvedge_block_meta_t *m)
{
    kvedge_block_info_t info;
    int rc = kvedge_block_check(data, len, &info);
    if (rc != KVEDGE_OK)
        return rc;
    if (len != m->bytes || info.checksum != m->checksum || info.dtype != m->dtype ||
        info.scheme != m->scheme || info.tokens != m->tokens || info.head_dim != m->head_dim ||
        info.key_channels != m->key_channels || info.group_size != m->group_size ||
        info.lz4 != m->lz4)
        return KVEDGE_ECORRUPT;
    return KVEDGE_OK;
}

int kvedge_engine_load(kvedge_engine_t *e, const uint8_t *kb, kvedge_block_meta_t *meta,
                       bool *meta_ok, rocksdb_pinnableslice_t **blk, int *why, bool scrub)
{
    *blk = NULL;
    *meta_ok = false;
    int mrc = kvedge_engine_read_meta(e, kb, meta);
    if (mrc != KVEDGE_OK && mrc != KVEDGE_ENOTFOUND && mrc != KVEDGE_ECORRUPT)
        return mrc;
    int brc = kvedge_engine_pget(e, scrub ? e->ro : e->ro_blk, S_CF_BLOCKS, kb,
                                 KVEDGE_BLOCK_KEY_BYTES, blk);
    if (brc != KVEDGE_OK && brc != KVEDGE_ENOTFOUND && brc != KVEDGE_ECORRUPT)
        return brc;
    *meta_ok = mrc == KVEDGE_OK;
    if (mrc == KVEDGE_ENOTFOUND && brc == KVEDGE_ENOTFOUND)
        return S_LOAD_MISSING;
    int bad = KVEDGE_ECORRUPT;
    if (mrc == KVEDGE_OK && brc == KVEDGE_OK) {
        size_t len;
        const uint8_t *v = s_pval(*blk, &len);
        bad = kvedge_engine_check_block(v, len, meta);
        if (bad == KVEDGE_OK)
            return S_LOAD_OK;
        if (bad == KVEDGE_ENOMEM) { /* no verdict on the block: not a reason to move it */
            rocksdb_pinnableslice_destroy(*blk);
            *blk = NULL;
            return bad;
        }
    }
    if (why)
        *why = bad;
    return S_LOAD_BAD;
}

int kvedge_engine_quarantine_locked(kvedge_engine_t *e, const uint8_t *kb,
                                    const kvedge_block_meta_t *m,
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
    kvedge_engine_vset_t vs; /* the variants go with it: they were bound to this primary */
    rc = kvedge_engine_batch_drop(b, e, kb, m, &vs);
    if (rc == KVEDGE_OK)
        rc = s_write(e, b);
    rocksdb_writebatch_destroy(b);
    if (rc != KVEDGE_OK)
        return rc;
    if (m)
        kvedge_engine_totals(e, m, false, true);
    kvedge_engine_variants_gone(e, &vs);
    if (!had)
        s_add(&e->quarantined, 1);
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- verify */

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

/* Whether a get serves the block at kb: the same load and check, with the read options of
 * reads (RocksDB's checksums off: the block's xxh3 and structure decide). */
static bool s_served(kvedge_engine_t *e, const uint8_t *kb)
{
    kvedge_block_meta_t m;
    bool meta_ok;
    rocksdb_pinnableslice_t *blk;
    int rc = kvedge_engine_load(e, kb, &m, &meta_ok, &blk, NULL, false);
    if (blk)
        rocksdb_pinnableslice_destroy(blk);
    return rc == S_LOAD_OK;
}

/* Under kb's stripe: writes a block that reads intact under a damaged RocksDB record back as
 * a fresh record (same bytes, so its meta still holds); the damaged one becomes garbage. */
static int s_rewrite(kvedge_engine_t *e, const uint8_t *kb)
{
    unsigned s = s_stripe_of(kb);
    kvedge_block_meta_t m;
    bool meta_ok;
    rocksdb_pinnableslice_t *blk;
    s_lock(e, s);
    int rc = kvedge_engine_load(e, kb, &m, &meta_ok, &blk, NULL, false);
    if (rc == S_LOAD_OK) {
        size_t len;
        const uint8_t *v = s_pval(blk, &len);
        char *err = NULL;
        rocksdb_put_cf(e->db, e->wo, e->cf[S_CF_BLOCKS], (const char *)kb, KVEDGE_BLOCK_KEY_BYTES,
                       (const char *)v, len, &err);
        rc = err ? s_write_error(e, &err) : KVEDGE_OK;
    }
    if (blk)
        rocksdb_pinnableslice_destroy(blk);
    s_unlock(e, s);
    return rc < 0 ? rc : KVEDGE_OK;
}

/* One bad key found by verify: report it, and quarantine it if it is still bad under its
 * stripe (KVEDGE_EIO, a block a get serves from a damaged record: rewrite it instead). Returns
 * the callback's value or a store error. */
static int s_verify_bad(kvedge_engine_t *e, const uint8_t *kb, int err, bool quarantine,
                        kvedge_verify_cb cb, void *ctx)
{
    if (quarantine && err == KVEDGE_EIO) {
        int rc = s_rewrite(e, kb);
        if (rc < 0)
            return rc;
    } else if (quarantine) {
        unsigned s = s_stripe_of(kb);
        kvedge_block_meta_t m;
        bool meta_ok;
        rocksdb_pinnableslice_t *blk;
        s_lock(e, s);
        int rc = kvedge_engine_load(e, kb, &m, &meta_ok, &blk, NULL, true);
        if (rc == S_LOAD_BAD) {
            rc = kvedge_engine_quarantine_locked(e, kb, meta_ok ? &m : NULL, blk);
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
    kvedge_engine_walk_t wb;
    kvedge_engine_walk_open(&wb, e, snap, NULL, 0, NULL, 0, true, false);
    rocksdb_iterator_t *im = rocksdb_create_iterator_cf(e->db, rom, e->cf[S_CF_META]);
    rocksdb_iter_seek_to_first(im);
    int rc = KVEDGE_OK;
    uint64_t n = 0, nbad = 0;
    for (;;) {
        bool vb = wb.valid, vm = rocksdb_iter_valid(im);
        if ((!vb && !vm) || wb.err)
            break; /* done, or the blocks side failed: its keys can no longer be matched */
        size_t kbl = 0, kml = 0, vlen = 0, mlen = 0;
        const uint8_t *kb = vb ? kvedge_engine_walk_key(&wb, &kbl) : NULL;
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
            const uint8_t *data = kvedge_engine_walk_value(&wb, &vlen);
            const uint8_t *mv = (const uint8_t *)rocksdb_iter_value(im, &mlen);
            kvedge_block_meta_t m;
            err = kvedge_engine_meta_unpack(mv, mlen, &m);
            if (err == KVEDGE_OK)
                err = data ? kvedge_engine_check_block(data, vlen, &m) : KVEDGE_ECORRUPT;
        }
        if (err == KVEDGE_ENOMEM) {
            rc = err; /* no verdict: stop rather than report a sound block */
            break;
        }
        if (klen == KVEDGE_BLOCK_KEY_BYTES) {
            n++;
            /* A get's verdict decides whether the block is bad; a RocksDB record that fails
             * its own checksums around a block that reads intact is reported apart. */
            if (err != KVEDGE_OK && c == 0 && s_served(e, key))
                err = KVEDGE_EIO;
            if (err != KVEDGE_OK) {
                nbad += err != KVEDGE_EIO;
                rc = s_verify_bad(e, key, err, quarantine, cb, ctx);
            }
        }
        if (c <= 0)
            kvedge_engine_walk_next(&wb);
        if (c >= 0)
            rocksdb_iter_next(im);
        if (rc != KVEDGE_OK)
            break;
    }
    rc = kvedge_engine_walk_close(&wb, rc);
    rc = kvedge_engine_iter_close(im, rom, rc);
    rocksdb_release_snapshot(e->db, snap);
    if (rc == KVEDGE_OK)
        rc = kvedge_engine_verify_variants(e, quarantine, cb, ctx, &n, &nbad);
    s_scrub_end(e);
    if (checked)
        *checked = n;
    if (bad)
        *bad = nbad;
    return rc;
}

/* ---------------------------------------------------------------- fault injection */

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
    return err ? s_write_error(e, &err) : KVEDGE_OK;
}
