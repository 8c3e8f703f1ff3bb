/* Demotion: a block re-encoded in place at a coarser precision instead of being evicted,
 * variants prepared ahead of demand, and the order in which capacity pressure frees space
 * (store/engine/engine.h, "Demotion"). */
#include "store/engine/engine_impl.h"

#include <stdlib.h>

/* Blocks with variants that one pressure step collects and orders by access time. */
#define S_PRESSURE_BATCH 1024

/* What a conditional demotion found besides the error codes (positive: nothing was done). */
enum {
    S_DEM_STALE = 1, /* the LRU entry no longer describes the block (gone, pinned, touched) */
    S_DEM_DONE,      /* already demoted */
    S_DEM_CANNOT,    /* prec does not derive from its rung, or it would not shrink */
};

/* What a demotion requires of the block besides prec deriving from its rung. */
typedef struct {
    bool from_lru;      /* unpinned and still at lru_atime, else S_DEM_STALE */
    uint64_t lru_atime; /* the access time of the LRU entry the caller found it by */
    bool skip_demoted;  /* already demoted: S_DEM_DONE */
    bool must_shrink;   /* a new encoding no smaller: S_DEM_CANNOT */
    bool einval_cannot; /* report S_DEM_CANNOT as KVEDGE_EINVAL (the API's answer) */
} s_demote_req_t;

/* ---------------------------------------------------------------- helpers */

static void s_vkey(const uint8_t *kb, kvedge_prec_t prec, uint8_t out[S_VARIANT_KEY_BYTES])
{
    memcpy(out, kb, KVEDGE_BLOCK_KEY_BYTES);
    out[KVEDGE_BLOCK_KEY_BYTES] = prec;
}

/* The rung a primary's meta describes, as kvedge_prec_of_block reads a header (shallowest
 * ThinK level first); KVEDGE_PREC_STORED when none. */
static kvedge_prec_t s_meta_prec(const kvedge_block_meta_t *m)
{
    for (unsigned think = 0; think <= KVEDGE_PREC_THINK_MAX; think++)
        for (unsigned base = 1; base <= KVEDGE_PREC_BASE_MAX; base++) {
            kvedge_prec_t p = KVEDGE_PREC_MAKE(base, think);
            if (kvedge_prec_valid(p) && kvedge_prec_scheme(p) == m->scheme &&
                kvedge_prec_group(p) == m->group_size &&
                kvedge_prec_keep_channels(p, m->head_dim) == m->key_channels)
                return p;
        }
    return KVEDGE_PREC_STORED;
}

/* Whether prec may be made from a block at rung `from`: a coarser rung it derives, or, for a
 * block off the ladder, whatever kvedge_block_transcode will say (tried). */
static bool s_may_derive(kvedge_prec_t from, kvedge_prec_t prec)
{
    if (from == KVEDGE_PREC_STORED)
        return true;
    return from != prec && kvedge_prec_derivable(from, prec);
}

/* Loads and verifies the primary at kb under its stripe, as a get would: a bad one is
 * quarantined (KVEDGE_ECORRUPT), an expired one dropped (KVEDGE_ENOTFOUND). 0 with *blk and
 * *m. */
static int s_load_locked(kvedge_engine_t *e, const uint8_t *kb, uint64_t now,
                         kvedge_block_meta_t *m, rocksdb_pinnableslice_t **blk)
{
    bool meta_ok;
    int rc = kvedge_engine_load(e, kb, m, &meta_ok, blk, NULL, false);
    if (rc < 0)
        return rc;
    if (rc == S_LOAD_MISSING)
        return KVEDGE_ENOTFOUND;
    if (rc == S_LOAD_BAD) {
        (void)kvedge_engine_quarantine_locked(e, kb, meta_ok ? m : NULL, *blk);
        if (*blk)
            rocksdb_pinnableslice_destroy(*blk);
        *blk = NULL;
        s_add(&e->corrupt, 1);
        return KVEDGE_ECORRUPT;
    }
    if (s_expired(m, now)) {
        rocksdb_pinnableslice_destroy(*blk);
        *blk = NULL;
        rc = kvedge_engine_drop_locked(e, kb, m);
        if (rc != KVEDGE_OK)
            return rc;
        s_add(&e->expired, 1);
        return KVEDGE_ENOTFOUND;
    }
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- demoting one block */

/* Adds to b what the variants of kb become once the primary whose meta is m is replaced by
 * one at rung prec with checksum sum: those coarser than prec are bound to it, the rest
 * deleted (*vs: what the deleted ones count). */
static int s_rebind_variants(rocksdb_writebatch_t *b, kvedge_engine_t *e, const uint8_t *kb,
                             const kvedge_block_meta_t *m, kvedge_prec_t prec, uint64_t sum,
                             kvedge_engine_vset_t *vs)
{
    memset(vs, 0, sizeof *vs);
    if (!e->cf[S_CF_VARIANTS])
        return KVEDGE_OK;
    uint8_t head[S_VARIANT_HEAD_BYTES];
    kvedge_le_put64(head, sum);
    uint8_t upper[S_VARIANT_UPPER_BYTES];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_variant_iter(e, kb, upper, &ro);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_prec_t r =
            klen == S_VARIANT_KEY_BYTES ? (kvedge_prec_t)k[KVEDGE_BLOCK_KEY_BYTES] : 0;
        bool bound = vlen > S_VARIANT_HEAD_BYTES && kvedge_le_get64(v) == m->checksum;
        if (bound && kvedge_prec_valid(r) && r != prec && kvedge_prec_derivable(prec, r)) {
            const char *parts[2] = {(const char *)head, (const char *)v + S_VARIANT_HEAD_BYTES};
            size_t sizes[2] = {sizeof head, vlen - S_VARIANT_HEAD_BYTES};
            rocksdb_writebatch_putv_cf(b, e->cf[S_CF_VARIANTS], 1, &k, &klen, 2, parts, sizes);
            continue;
        }
        rocksdb_writebatch_delete_cf(b, e->cf[S_CF_VARIANTS], k, klen);
        if (klen == S_VARIANT_KEY_BYTES) { /* what the totals counted at open */
            vs->n++;
            vs->bytes += s_variant_bytes(vlen);
        }
    }
    return kvedge_engine_iter_close(it, ro, KVEDGE_OK);
}

/* Under kb's stripe: demotes the primary at kb to prec as req allows. 0 with *saved (bytes
 * freed), a positive S_DEM_* when nothing was done, or an error. */
static int s_demote_locked(kvedge_engine_t *e, const uint8_t *kb, kvedge_prec_t prec,
                           const s_demote_req_t *req, int64_t *saved)
{
    *saved = 0;
    uint64_t now = s_now(e);
    kvedge_block_meta_t m;
    rocksdb_pinnableslice_t *blk = NULL;
    if (req->from_lru) {
        /* Cheap checks on the meta first: most entries a walk meets are not candidates. */
        int rc = kvedge_engine_read_meta(e, kb, &m);
        if (rc == KVEDGE_ENOTFOUND || rc == KVEDGE_ECORRUPT ||
            (rc == KVEDGE_OK && (m.pinned || m.atime_ms != req->lru_atime)))
            return S_DEM_STALE;
        if (rc != KVEDGE_OK)
            return rc;
        if (req->skip_demoted && m.demoted)
            return S_DEM_DONE;
        if (!s_may_derive(s_meta_prec(&m), prec))
            return S_DEM_CANNOT;
    }
    int rc = s_load_locked(e, kb, now, &m, &blk);
    if (rc != KVEDGE_OK)
        return rc;
    uint8_t *nb = NULL;
    size_t nlen = 0;
    rocksdb_writebatch_t *b = NULL;
    kvedge_block_info_t info, ninfo;
    kvedge_prec_t from = s_meta_prec(&m);
    if (req->from_lru && (m.pinned || m.atime_ms != req->lru_atime)) {
        rc = S_DEM_STALE;
        goto out;
    }
    if (req->skip_demoted && m.demoted) {
        rc = S_DEM_DONE;
        goto out;
    }
    if (!s_may_derive(from, prec)) {
        rc = S_DEM_CANNOT;
        goto out;
    }
    size_t len;
    const uint8_t *data = s_pval(blk, &len);
    rc = kvedge_block_parse(data, len, &info); /* verified: fills info */
    if (rc == KVEDGE_OK)
        rc = kvedge_block_transcode(&info, prec, true, &nb, &nlen);
    if (rc == KVEDGE_EINVAL) {
        rc = S_DEM_CANNOT; /* a block off the ladder, or values prec cannot hold */
        goto out;
    }
    if (rc != KVEDGE_OK)
        goto out;
    if (req->must_shrink && nlen >= m.bytes) {
        rc = S_DEM_CANNOT;
        goto out;
    }
    rc = kvedge_block_parse(nb, nlen, &ninfo);
    if (rc != KVEDGE_OK)
        goto out;
    b = rocksdb_writebatch_create();
    kvedge_engine_vset_t vs;
    rc = s_rebind_variants(b, e, kb, &m, prec, ninfo.checksum, &vs);
    if (rc != KVEDGE_OK)
        goto out;
    int64_t delta = (int64_t)nlen - (int64_t)m.bytes; /* the primary's change */
    int64_t udelta = delta - (int64_t)vs.bytes;       /* what capacity sees */
    if (!kvedge_engine_reserve(e, udelta)) {
        rc = KVEDGE_EFULL;
        goto out;
    }
    kvedge_block_meta_t n = m;
    n.bytes = (uint32_t)nlen;
    n.scheme = ninfo.scheme;
    n.key_channels = ninfo.key_channels;
    n.group_size = ninfo.group_size;
    n.lz4 = ninfo.lz4;
    n.checksum = ninfo.checksum;
    n.demoted_from = m.demoted ? m.demoted_from : from;
    n.demoted = true;
    uint8_t rec[S_META_RECORD_BYTES];
    kvedge_engine_meta_pack(&n, rec);
    rocksdb_writebatch_put_cf(b, e->cf[S_CF_BLOCKS], (const char *)kb, KVEDGE_BLOCK_KEY_BYTES,
                              (const char *)nb, nlen);
    rocksdb_writebatch_put_cf(b, e->cf[S_CF_META], (const char *)kb, KVEDGE_BLOCK_KEY_BYTES,
                              (const char *)rec, sizeof rec);
    rc = s_write(e, b);
    if (rc != KVEDGE_OK) {
        s_sub(&e->used, (uint64_t)udelta); /* give the reservation back */
        goto out;
    }
    /* used moved already, by udelta; the other totals follow (modular adds of deltas). */
    s_add(&e->bytes, (uint64_t)delta);
    if (m.pinned)
        s_add(&e->pinned_bytes, (uint64_t)delta);
    s_sub(&e->variant_blocks, vs.n);
    s_sub(&e->variant_bytes, vs.bytes);
    s_add(&e->bytes_written, nlen);
    *saved = -udelta;
    s_add(&e->demoted, 1);
    s_add(&e->demoted_saved, (uint64_t)*saved);
out:
    if (b)
        rocksdb_writebatch_destroy(b);
    free(nb);
    if (blk)
        rocksdb_pinnableslice_destroy(blk);
    if (rc == S_DEM_CANNOT && req->einval_cannot)
        rc = KVEDGE_EINVAL;
    return rc;
}

static int s_demote_key(kvedge_engine_t *e, const uint8_t *kb, kvedge_prec_t prec,
                        const s_demote_req_t *req, int64_t *saved)
{
    unsigned s = s_stripe_of(kb);
    s_lock(e, s);
    int rc = s_demote_locked(e, kb, prec, req, saved);
    s_unlock(e, s);
    return rc;
}

/* ---------------------------------------------------------------- API */

/* Demotion targets are plain rungs: a primary is never entropy-coded (kvedge_engine_put). */
int kvedge_engine_demote(kvedge_engine_t *e, const kvedge_block_key_t *key, kvedge_prec_t prec,
                         int64_t *saved)
{
    if (saved)
        *saved = 0;
    if (!e || !key || !kvedge_prec_valid(prec) || KVEDGE_PREC_IS_EC(prec))
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    s_demote_req_t req = {.einval_cannot = true};
    int64_t freed;
    int rc = s_demote_key(e, kb, prec, &req, &freed);
    if (rc == KVEDGE_OK && saved)
        *saved = freed;
    return rc;
}

int kvedge_engine_demote_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id, kvedge_prec_t prec,
                               uint64_t *blocks, int64_t *saved)
{
    if (blocks)
        *blocks = 0;
    if (saved)
        *saved = 0;
    if (!e || !id || !kvedge_prec_valid(prec) || KVEDGE_PREC_IS_EC(prec))
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    uint8_t upper[S_UPPER_BYTES];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_chunk_iter(e, S_CF_META, id, upper, &ro);
    int rc = KVEDGE_OK;
    uint64_t n = 0, seen = 0;
    int64_t total = 0;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *kb = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen != KVEDGE_BLOCK_KEY_BYTES)
            continue;
        s_demote_req_t req = {0};
        int64_t freed;
        int r = s_demote_key(e, kb, prec, &req, &freed);
        if (r == KVEDGE_ENOTFOUND || r == KVEDGE_ECORRUPT)
            continue; /* gone since the iterator's snapshot, or quarantined */
        seen++;
        if (r > 0 || r == KVEDGE_EFULL)
            continue; /* not demotable to prec */
        if (r != KVEDGE_OK) {
            rc = r;
            break;
        }
        n++;
        total += freed;
    }
    rc = kvedge_engine_iter_close(it, ro, rc);
    if (blocks)
        *blocks = n;
    if (saved)
        *saved = total;
    if (rc == KVEDGE_OK && seen == 0)
        rc = KVEDGE_ENOTFOUND;
    return rc;
}

int kvedge_engine_demote_idle(kvedge_engine_t *e, kvedge_prec_t prec, uint64_t idle_ms,
                              uint64_t max, uint64_t *blocks, int64_t *saved)
{
    if (blocks)
        *blocks = 0;
    if (saved)
        *saved = 0;
    if (!e || !kvedge_prec_valid(prec) || KVEDGE_PREC_IS_EC(prec))
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    uint64_t now = s_now(e);
    if (now < idle_ms)
        return KVEDGE_OK; /* nothing can be that old */
    uint64_t cutoff = now - idle_ms;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_LRU, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    uint64_t n = 0;
    int64_t total = 0;
    for (; rocksdb_iter_valid(it) && (max == 0 || n < max); rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *ik = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen != S_INDEX_KEY_BYTES)
            continue; /* eviction drops malformed entries */
        uint64_t atime = kvedge_be_get64(ik);
        if (atime > cutoff)
            break; /* the LRU is in access order: the rest is more recent */
        s_demote_req_t req = {
            .from_lru = true, .lru_atime = atime, .skip_demoted = true, .must_shrink = true};
        int64_t freed;
        int r = s_demote_key(e, ik + 8, prec, &req, &freed);
        if (r == KVEDGE_OK) {
            n++;
            total += freed;
        } else if (r < 0 && r != KVEDGE_ENOTFOUND && r != KVEDGE_ECORRUPT && r != KVEDGE_EFULL) {
            rc = r;
            break;
        }
    }
    rc = kvedge_engine_iter_close(it, ro, rc);
    if (blocks)
        *blocks = n;
    if (saved)
        *saved = total;
    return rc;
}

int kvedge_engine_prepare_variant(kvedge_engine_t *e, const kvedge_block_key_t *key,
                                  kvedge_prec_t prec, uint64_t *bytes)
{
    if (bytes)
        *bytes = 0;
    if (!e || !key || !kvedge_prec_valid(prec))
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    if (!e->cf[S_CF_VARIANTS])
        return KVEDGE_EINVAL;
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES], vk[S_VARIANT_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    s_vkey(kb, prec, vk);
    unsigned s = s_stripe_of(kb);
    s_lock(e, s);
    kvedge_block_meta_t m;
    rocksdb_pinnableslice_t *blk = NULL, *old = NULL;
    uint8_t *nb = NULL;
    size_t nlen = 0;
    int rc = s_load_locked(e, kb, s_now(e), &m, &blk);
    if (rc != KVEDGE_OK)
        goto out;
    if (!s_may_derive(s_meta_prec(&m), prec)) {
        rc = KVEDGE_EINVAL;
        goto out;
    }
    /* Held and bound to this primary: nothing to do (a stale record is replaced). */
    rc = s_pget(e, S_CF_VARIANTS, vk, sizeof vk, &old);
    size_t olen = 0;
    const uint8_t *ov = old ? s_pval(old, &olen) : NULL;
    if (rc != KVEDGE_OK && rc != KVEDGE_ENOTFOUND && rc != KVEDGE_ECORRUPT)
        goto out;
    if (ov && olen > S_VARIANT_HEAD_BYTES && kvedge_le_get64(ov) == m.checksum) {
        rc = KVEDGE_OK;
        goto out;
    }
    bool had = rc != KVEDGE_ENOTFOUND;
    kvedge_block_info_t info;
    size_t len;
    const uint8_t *data = s_pval(blk, &len);
    rc = kvedge_block_parse(data, len, &info);
    if (rc == KVEDGE_OK)
        rc = kvedge_block_transcode(&info, prec, true, &nb, &nlen);
    if (rc != KVEDGE_OK)
        goto out;
    int64_t delta = (int64_t)nlen - (int64_t)s_variant_bytes(olen);
    if (!kvedge_engine_reserve(e, delta)) {
        rc = KVEDGE_EFULL; /* never evicts: preparing must not push anything out */
        goto out;
    }
    rc = s_variant_write(e, vk, m.checksum, nb, nlen);
    if (rc != KVEDGE_OK) {
        s_sub(&e->used, (uint64_t)delta);
        goto out;
    }
    if (!had)
        s_add(&e->variant_blocks, 1);
    s_add(&e->variant_bytes, (uint64_t)delta);
    s_add(&e->puts, 1);
    s_add(&e->bytes_written, nlen);
    if (bytes)
        *bytes = nlen;
out:
    s_unlock(e, s);
    free(nb);
    if (old)
        rocksdb_pinnableslice_destroy(old);
    if (blk)
        rocksdb_pinnableslice_destroy(blk);
    return rc;
}

int kvedge_engine_demote_stats(kvedge_engine_t *e, kvedge_engine_demote_stats_t *out)
{
    if (!e || !out)
        return KVEDGE_EINVAL;
    out->demoted = s_get(&e->demoted);
    out->saved_bytes = s_get(&e->demoted_saved);
    out->pressure_demoted = s_get(&e->pressure_demoted);
    out->pressure_saved_bytes = s_get(&e->pressure_saved);
    out->pressure_variant_blocks = s_get(&e->pressure_vblocks);
    out->pressure_variant_bytes = s_get(&e->pressure_vbytes);
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- capacity pressure */

/* One block whose variants may go, with its primary's access time. */
typedef struct {
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    uint64_t atime;
} s_vowner_t;

static int s_by_atime(const void *a, const void *b)
{
    const s_vowner_t *x = a, *y = b;
    if (x->atime != y->atime)
        return x->atime < y->atime ? -1 : 1;
    return memcmp(x->kb, y->kb, KVEDGE_BLOCK_KEY_BYTES);
}

/* Step 1: drops every variant of blocks, least recently used first, until used <= target:
 * up to S_PRESSURE_BATCH blocks at a time, taken in key order (orphaned records, with no
 * primary, go first). */
static int s_drop_variants(kvedge_engine_t *e, uint64_t target, const uint8_t *keep,
                           uint64_t *bytes_out)
{
    if (!e->cf[S_CF_VARIANTS])
        return KVEDGE_OK;
    s_vowner_t *own = malloc(S_PRESSURE_BATCH * sizeof *own);
    if (!own)
        return KVEDGE_ENOMEM;
    int rc = KVEDGE_OK;
    uint8_t from[KVEDGE_BLOCK_KEY_BYTES + 1];
    size_t from_len = 0;
    while (rc == KVEDGE_OK && s_get(&e->used) > target && s_get(&e->variant_blocks) > 0) {
        size_t n = 0;
        rocksdb_readoptions_t *ro;
        rocksdb_iterator_t *it =
            kvedge_engine_iter(e, S_CF_VARIANTS, from_len ? from : NULL, from_len, NULL, 0, &ro);
        for (; n < S_PRESSURE_BATCH && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t klen;
            const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
            if (klen < KVEDGE_BLOCK_KEY_BYTES ||
                (n && memcmp(own[n - 1].kb, k, KVEDGE_BLOCK_KEY_BYTES) == 0) ||
                (keep && memcmp(k, keep, KVEDGE_BLOCK_KEY_BYTES) == 0))
                continue;
            memcpy(own[n].kb, k, KVEDGE_BLOCK_KEY_BYTES);
            kvedge_block_meta_t m;
            own[n].atime = kvedge_engine_read_meta(e, k, &m) == KVEDGE_OK ? m.atime_ms : 0;
            n++;
        }
        bool more = rocksdb_iter_valid(it);
        rc = kvedge_engine_iter_close(it, ro, KVEDGE_OK);
        if (rc != KVEDGE_OK || n == 0)
            break;
        /* Resume past the last block taken: its key with every rung is below this bound. */
        memcpy(from, own[n - 1].kb, KVEDGE_BLOCK_KEY_BYTES);
        from[KVEDGE_BLOCK_KEY_BYTES] = 0xff;
        from_len = sizeof from;
        qsort(own, n, sizeof *own, s_by_atime);
        for (size_t i = 0; i < n && s_get(&e->used) > target; i++) {
            unsigned s = s_stripe_of(own[i].kb);
            s_lock(e, s);
            kvedge_engine_vset_t vs;
            rocksdb_writebatch_t *b = rocksdb_writebatch_create();
            rc = kvedge_engine_batch_drop_variants(b, e, own[i].kb, &vs);
            if (rc == KVEDGE_OK && rocksdb_writebatch_count(b) > 0)
                rc = s_write(e, b); /* malformed records under the key go too */
            rocksdb_writebatch_destroy(b);
            if (rc == KVEDGE_OK && vs.n) {
                kvedge_engine_variants_gone(e, &vs);
                s_add(&e->pressure_vblocks, vs.n);
                s_add(&e->pressure_vbytes, vs.bytes);
                if (bytes_out)
                    *bytes_out += vs.bytes;
            }
            s_unlock(e, s);
            if (rc != KVEDGE_OK)
                break;
        }
        if (!more)
            break;
    }
    free(own);
    return rc;
}

/* Deletes a stale LRU entry (its block is gone, pinned or was touched since). */
static int s_drop_entry(kvedge_engine_t *e, const uint8_t *ik, size_t klen)
{
    char *err = NULL;
    rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_LRU], (const char *)ik, klen, &err);
    return err ? s_write_error(e, &err) : KVEDGE_OK;
}

/* Under kb's stripe: evicts the block the LRU entry at ik names when it is still that entry's
 * and, with only_live, not demoted. Returns 0 (evicted), S_DEM_STALE (entry dropped),
 * S_DEM_DONE (demoted: left), or an error. */
static int s_evict_entry_locked(kvedge_engine_t *e, const uint8_t *ik, size_t klen, bool only_live,
                                uint64_t *n_out, uint64_t *bytes_out)
{
    const uint8_t *kb = ik + 8;
    kvedge_block_meta_t m;
    int mrc = kvedge_engine_read_meta(e, kb, &m);
    if (mrc != KVEDGE_OK && mrc != KVEDGE_ENOTFOUND && mrc != KVEDGE_ECORRUPT)
        return mrc;
    if (mrc != KVEDGE_OK || m.atime_ms != kvedge_be_get64(ik) || m.pinned) {
        int rc = s_drop_entry(e, ik, klen);
        return rc == KVEDGE_OK ? S_DEM_STALE : rc;
    }
    if (only_live && m.demoted)
        return S_DEM_DONE;
    kvedge_engine_vset_t vs;
    int rc = kvedge_engine_drop_locked_vs(e, kb, &m, &vs);
    if (rc != KVEDGE_OK)
        return rc;
    s_add(&e->evicted_blocks, 1);
    s_add(&e->evicted_bytes, m.bytes + vs.bytes);
    if (n_out)
        (*n_out)++;
    if (bytes_out)
        *bytes_out += m.bytes + vs.bytes;
    return KVEDGE_OK;
}

/* Steps 2 and 3: one resumable walk of the LRU over blocks not demoted, either demoting them
 * (S_WALK_DEMOTE) or evicting them (S_WALK_EVICT), until used <= target. Entries found done
 * move the walk's resume point; one skipped for `keep` holds it there. */
static int s_walk(kvedge_engine_t *e, int which, uint64_t target, const uint8_t *keep,
                  uint64_t *n_out, uint64_t *bytes_out)
{
    uint8_t *at = e->walk_at[which];
    bool *set = &e->walk_at_set[which];
    if (*set && s_now(e) < kvedge_be_get64(at))
        *set = false; /* the clock went back: entries may sort before the resume point */
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_LRU, *set ? at : NULL,
                                                *set ? S_INDEX_KEY_BYTES : 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    bool hold = false; /* an entry not done was skipped: the resume point stays before it */
    for (; rocksdb_iter_valid(it) && s_get(&e->used) > target; rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *ik = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen != S_INDEX_KEY_BYTES) {
            (void)s_drop_entry(e, ik, klen); /* indexes nothing: best effort */
            continue;
        }
        const uint8_t *kb = ik + 8;
        if (keep && memcmp(kb, keep, KVEDGE_BLOCK_KEY_BYTES) == 0) {
            hold = true;
            continue;
        }
        unsigned s = s_stripe_of(kb);
        int r;
        s_lock(e, s);
        if (which == S_WALK_DEMOTE) {
            s_demote_req_t req = {.from_lru = true,
                                  .lru_atime = kvedge_be_get64(ik),
                                  .skip_demoted = true,
                                  .must_shrink = true};
            int64_t freed;
            r = s_demote_locked(e, kb, e->opts.pressure_demote, &req, &freed);
            if (r == KVEDGE_OK) {
                s_add(&e->pressure_demoted, 1);
                s_add(&e->pressure_saved, (uint64_t)freed);
                if (bytes_out)
                    *bytes_out += (uint64_t)freed;
            } else if (r == S_DEM_STALE) {
                r = s_drop_entry(e, ik, klen);
            } else if (r == KVEDGE_ENOTFOUND || r == KVEDGE_ECORRUPT || r == KVEDGE_EFULL) {
                r = KVEDGE_OK; /* gone, quarantined, or (EFULL) no gain: done with it */
            }
        } else {
            r = s_evict_entry_locked(e, ik, klen, true, n_out, bytes_out);
        }
        s_unlock(e, s);
        if (r < 0) {
            rc = r;
            break;
        }
        if (!hold) {
            memcpy(at, ik, S_INDEX_KEY_BYTES);
            *set = true;
        }
    }
    return kvedge_engine_iter_close(it, ro, rc);
}

int kvedge_engine_pressure_locked(kvedge_engine_t *e, uint64_t target, const uint8_t *keep,
                                  uint64_t *n_out, uint64_t *bytes_out)
{
    int rc = s_drop_variants(e, target, keep, bytes_out);
    if (rc == KVEDGE_OK && s_get(&e->used) > target)
        rc = s_walk(e, S_WALK_DEMOTE, target, keep, n_out, bytes_out);
    if (rc == KVEDGE_OK && s_get(&e->used) > target)
        rc = s_walk(e, S_WALK_EVICT, target, keep, n_out, bytes_out);
    if (rc == KVEDGE_OK && s_get(&e->used) > target)
        rc = kvedge_engine_evict_lru_locked(e, target, keep, n_out, bytes_out);
    return rc;
}
