/* Scans and chunks: the metadata scan, chunk records (list, get, find by prefix) and chunk
 * deletion with its descendants. */
#include "store/engine/engine_impl.h"

#include <stdlib.h>

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
    rocksdb_iterator_t *it =
        kvedge_engine_iter(e, S_CF_META, chunk ? chunk->bytes : NULL, KVEDGE_CHUNK_ID_BYTES,
                           chunk ? upper : NULL, sizeof upper, &ro);
    int rc = KVEDGE_OK;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_block_meta_t m;
        kvedge_block_key_t key;
        if (klen != KVEDGE_BLOCK_KEY_BYTES || kvedge_engine_meta_unpack(v, vlen, &m) != KVEDGE_OK) {
            rc = KVEDGE_ECORRUPT;
            break;
        }
        kvedge_block_key_unpack(k, &key);
        rc = cb(ctx, &key, &m);
        if (rc != 0)
            break;
    }
    return kvedge_engine_iter_close(it, ro, rc);
}

/* ---------------------------------------------------------------- chunks */

int kvedge_engine_read_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id,
                             kvedge_chunk_info_t *out)
{
    rocksdb_pinnableslice_t *p;
    int rc = s_pget(e, S_CF_PREFIXES, id->bytes, KVEDGE_CHUNK_ID_BYTES, &p);
    if (rc != KVEDGE_OK)
        return rc;
    size_t len;
    const uint8_t *v = s_pval(p, &len);
    rc = kvedge_engine_prefix_unpack(id->bytes, KVEDGE_CHUNK_ID_BYTES, v, len, out);
    rocksdb_pinnableslice_destroy(p);
    return rc;
}

int kvedge_engine_list_chunks(kvedge_engine_t *e, kvedge_chunk_cb cb, void *ctx)
{
    if (!e || !cb)
        return KVEDGE_EINVAL;
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_PREFIXES, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_chunk_info_t c;
        rc = kvedge_engine_prefix_unpack(k, klen, v, vlen, &c);
        if (rc == KVEDGE_OK)
            rc = cb(ctx, &c);
        if (rc != 0)
            break;
    }
    return kvedge_engine_iter_close(it, ro, rc);
}

int kvedge_engine_get_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id,
                            kvedge_chunk_info_t *out)
{
    if (!e || !id || !out)
        return KVEDGE_EINVAL;
    return kvedge_engine_read_chunk(e, id, out);
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
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_PREFIXES, pre, full + half, NULL, 0, &ro);
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
    return kvedge_engine_iter_close(it, ro, rc);
}

/* ---------------------------------------------------------------- delete */

/* Under the key's stripe: deletes whatever a key holds. Returns 1 when something was there,
 * 0 when not, or an error. */
static int s_erase_key(kvedge_engine_t *e, const uint8_t *kb)
{
    unsigned s = s_stripe_of(kb);
    s_lock(e, s);
    kvedge_block_meta_t m;
    int rc = kvedge_engine_read_meta(e, kb, &m);
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
            rc = kvedge_engine_drop_locked(e, kb, meta_ok ? &m : NULL);
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
        kvedge_engine_walk_t w;
        kvedge_engine_walk_open(&w, e, NULL, id->bytes, KVEDGE_CHUNK_ID_BYTES, upper, sizeof upper,
                                false, false);
        for (; w.valid; kvedge_engine_walk_next(&w)) {
            size_t klen;
            const uint8_t *kb = kvedge_engine_walk_key(&w, &klen);
            if (klen != KVEDGE_BLOCK_KEY_BYTES)
                continue;
            int r = s_erase_key(e, kb);
            if (r < 0) {
                rc = r;
                break;
            }
            *n += (uint64_t)r;
        }
        return kvedge_engine_walk_close(&w, rc);
    }
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_chunk_iter(e, cf, id, upper, &ro);
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
    return kvedge_engine_iter_close(it, ro, rc);
}

static int s_delete_one_chunk(kvedge_engine_t *e, const kvedge_chunk_id_t *id, uint64_t *n,
                              bool *found)
{
    uint64_t before = *n;
    int rc = s_erase_chunk_keys(e, S_CF_META, id, n);
    if (rc == KVEDGE_OK)
        rc = s_erase_chunk_keys(e, S_CF_BLOCKS, id, n);
    if (rc == KVEDGE_OK) /* each block took its variants; these are variants left without one */
        rc = kvedge_engine_drop_chunk_variants(e, id);
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
            return s_write_error(e, &err);
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
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_PREFIXES, NULL, 0, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_chunk_info_t c;
        if (kvedge_engine_prefix_unpack(k, klen, v, vlen, &c) != KVEDGE_OK || !c.has_parent)
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
    rc = kvedge_engine_iter_close(it, ro, rc);
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
    if (count) /* their blob files go back to the disk once nothing references them */
        kvedge_engine_disk_compact(e, 2 * e->write_buffer_bytes);
    if (rc == KVEDGE_OK && !found)
        rc = KVEDGE_ENOTFOUND;
    return rc;
}
