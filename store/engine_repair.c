/* Repair: a damaged store salvaged into a new one, record by record, keeping every block that
 * passes the check a get makes and quarantining the rest (kvedge repair). */
#define _GNU_SOURCE /* nftw */
#include "store/engine_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/why.h"

/* The new store is built here, inside the store directory (same file system: moved by
 * rename), and the old RocksDB files go under S_LOST_DIR (where RocksDB's own repair puts
 * what it drops). */
#define S_TMP_DIR  "repair.tmp"
#define S_LOST_DIR "lost"
/* Blocks written to the new store per write batch. */
#define S_BATCH_BLOCKS 256
#define S_PATH_MAX     4096

/* ---------------------------------------------------------------- key sets */

/* Block keys, sorted and unique once s_keys_seal ran. */
typedef struct {
    uint8_t *k;
    size_t n, cap;
} s_keys_t;

static int s_keys_add(s_keys_t *ks, const uint8_t *kb)
{
    if (ks->n == ks->cap) {
        size_t cap = ks->cap ? ks->cap * 2 : 1024;
        uint8_t *k = realloc(ks->k, cap * KVEDGE_BLOCK_KEY_BYTES);
        if (!k)
            return KVEDGE_ENOMEM;
        ks->k = k;
        ks->cap = cap;
    }
    memcpy(ks->k + ks->n++ * KVEDGE_BLOCK_KEY_BYTES, kb, KVEDGE_BLOCK_KEY_BYTES);
    return KVEDGE_OK;
}

static int s_key_cmp(const void *a, const void *b)
{
    return memcmp(a, b, KVEDGE_BLOCK_KEY_BYTES);
}

static void s_keys_seal(s_keys_t *ks)
{
    if (ks->n == 0)
        return;
    qsort(ks->k, ks->n, KVEDGE_BLOCK_KEY_BYTES, s_key_cmp);
    size_t w = 1;
    for (size_t r = 1; r < ks->n; r++) {
        const uint8_t *k = ks->k + r * KVEDGE_BLOCK_KEY_BYTES;
        if (memcmp(k, ks->k + (w - 1) * KVEDGE_BLOCK_KEY_BYTES, KVEDGE_BLOCK_KEY_BYTES) != 0)
            memmove(ks->k + w++ * KVEDGE_BLOCK_KEY_BYTES, k, KVEDGE_BLOCK_KEY_BYTES);
    }
    ks->n = w;
}

/* Adds the block keys one family names (key_off: where the block key starts in its keys, 0
 * for meta, 8 for the LRU and TTL indexes), in key order, up to its end or the first record
 * RocksDB cannot read back: the other families name what lies past it. */
static int s_collect_index(kvedge_engine_t *e, int cf, size_t key_off, s_keys_t *ks)
{
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(ro, 0);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(e->db, ro, e->cf[cf]);
    int rc = KVEDGE_OK;
    for (rocksdb_iter_seek_to_first(it); rc == KVEDGE_OK && rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t klen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        if (klen == key_off + KVEDGE_BLOCK_KEY_BYTES)
            rc = s_keys_add(ks, k + key_off);
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    if (err)
        (void)kvedge_rocks_error(&err);
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc;
}

/* Every block key the damaged store still names: its blocks (a walk, which steps past values
 * it cannot read), its meta records and its LRU and TTL indexes. */
static int s_collect_keys(kvedge_engine_t *e, s_keys_t *ks)
{
    kvedge_engine_walk_t w;
    kvedge_engine_walk_open(&w, e, NULL, NULL, 0, NULL, 0, false, false);
    int rc = KVEDGE_OK;
    for (; rc == KVEDGE_OK && w.valid; kvedge_engine_walk_next(&w)) {
        size_t klen;
        const uint8_t *k = kvedge_engine_walk_key(&w, &klen);
        if (klen == KVEDGE_BLOCK_KEY_BYTES)
            rc = s_keys_add(ks, k);
    }
    int wrc = kvedge_engine_walk_close(&w, KVEDGE_OK);
    (void)wrc; /* a walk ended by damage: the indexes below name the keys past it */
    if (rc == KVEDGE_OK)
        rc = s_collect_index(e, S_CF_META, 0, ks);
    if (rc == KVEDGE_OK)
        rc = s_collect_index(e, S_CF_LRU, 8, ks);
    if (rc == KVEDGE_OK)
        rc = s_collect_index(e, S_CF_TTL, 8, ks);
    if (rc == KVEDGE_OK)
        s_keys_seal(ks);
    return rc;
}

/* ---------------------------------------------------------------- blob files */

/* The blob files hold most blocks (key and value, each block self-checking) and outlive what
 * names them: a block whose record cannot be read through RocksDB (its table damaged, or its
 * blob file dropped by RocksDB's repair) is looked for in them, record by record. Layout
 * (RocksDB's blob_log_format.h, little-endian): a 30-byte header starting with the magic, then
 * records of a 32-byte header (key size u64, value size u64, expiration u64, two CRCs), the
 * key and the value, then a 32-byte footer starting with the magic. */
#define S_BLOB_MAGIC        0x00248F37u
#define S_BLOB_HEADER_BYTES 30
#define S_BLOB_RECORD_BYTES 32
#define S_BLOB_SCAN_BYTES   (1u << 20)

typedef struct {
    uint8_t key[KVEDGE_BLOCK_KEY_BYTES];
    uint32_t file; /* index into s_blobs_t.fd */
    uint64_t number;
    uint64_t off; /* of the value */
    uint64_t len;
} s_blobrec_t;

typedef struct {
    s_blobrec_t *r;
    size_t n, cap;
    int *fd;
    size_t n_fd;
} s_blobs_t;

static int s_blobs_add(s_blobs_t *b, const uint8_t *key, uint32_t file, uint64_t number,
                       uint64_t off, uint64_t len)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        s_blobrec_t *r = realloc(b->r, cap * sizeof *r);
        if (!r)
            return KVEDGE_ENOMEM;
        b->r = r;
        b->cap = cap;
    }
    s_blobrec_t *r = &b->r[b->n++];
    memcpy(r->key, key, KVEDGE_BLOCK_KEY_BYTES);
    r->file = file;
    r->number = number;
    r->off = off;
    r->len = len;
    return KVEDGE_OK;
}

/* The next offset at or past from where a block value ("KVEB") could follow a record header
 * and a block key, or size when there is none: a damaged record header costs its record. */
static uint64_t s_blob_resync(int fd, uint64_t from, uint64_t size)
{
    const uint64_t lead = S_BLOB_RECORD_BYTES + KVEDGE_BLOCK_KEY_BYTES;
    uint8_t *buf = malloc(S_BLOB_SCAN_BYTES);
    if (!buf)
        return size;
    for (uint64_t at = from + lead; at + 4 <= size; at += S_BLOB_SCAN_BYTES - 3) {
        ssize_t n = pread(fd, buf, S_BLOB_SCAN_BYTES, (off_t)at);
        if (n < 4)
            break;
        const uint8_t *m = memmem(buf, (size_t)n, "KVEB", 4);
        if (m) {
            uint64_t found = at + (uint64_t)(m - buf) - lead;
            free(buf);
            return found;
        }
    }
    free(buf);
    return size;
}

/* Indexes the block records of one blob file. */
static int s_blob_scan(s_blobs_t *b, int fd, uint32_t file, uint64_t number)
{
    struct stat st;
    uint8_t h[S_BLOB_RECORD_BYTES + KVEDGE_BLOCK_KEY_BYTES];
    if (fstat(fd, &st) != 0 || pread(fd, h, S_BLOB_HEADER_BYTES, 0) != S_BLOB_HEADER_BYTES ||
        kvedge_le_get32(h) != S_BLOB_MAGIC || h[13] != 0 /* compressed: not ours */)
        return KVEDGE_OK;
    uint64_t size = (uint64_t)st.st_size, off = S_BLOB_HEADER_BYTES;
    while (off + sizeof h <= size) {
        if (pread(fd, h, sizeof h, (off_t)off) != (ssize_t)sizeof h)
            break;
        uint64_t klen = kvedge_le_get64(h), vlen = kvedge_le_get64(h + 8);
        uint64_t at = off + S_BLOB_RECORD_BYTES + KVEDGE_BLOCK_KEY_BYTES;
        if (klen == KVEDGE_BLOCK_KEY_BYTES && vlen >= 4 && vlen <= size - at) {
            int rc = s_blobs_add(b, h + S_BLOB_RECORD_BYTES, file, number, at, vlen);
            if (rc != KVEDGE_OK)
                return rc;
            off = at + vlen;
        } else if (kvedge_le_get32(h) == S_BLOB_MAGIC && size - off == S_BLOB_RECORD_BYTES) {
            break; /* the footer */
        } else {
            off = s_blob_resync(fd, off + 1, size);
        }
    }
    return KVEDGE_OK;
}

static int s_blobrec_cmp(const void *a, const void *b)
{
    const s_blobrec_t *x = a, *y = b;
    int c = memcmp(x->key, y->key, KVEDGE_BLOCK_KEY_BYTES);
    if (c)
        return c;
    if (x->number != y->number) /* newest file first */
        return x->number < y->number ? 1 : -1;
    return x->off < y->off ? 1 : x->off > y->off ? -1 : 0;
}

/* Indexes every blob file in dir. */
static int s_blobs_open(s_blobs_t *b, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return KVEDGE_OK;
    int rc = KVEDGE_OK;
    struct dirent *de;
    char path[S_PATH_MAX];
    while (rc == KVEDGE_OK && (de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 6 || strcmp(de->d_name + n - 5, ".blob") != 0)
            continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path)
            continue;
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        int *fds = realloc(b->fd, (b->n_fd + 1) * sizeof *fds);
        if (!fds) {
            close(fd);
            rc = KVEDGE_ENOMEM;
            break;
        }
        b->fd = fds;
        b->fd[b->n_fd] = fd;
        rc = s_blob_scan(b, fd, (uint32_t)b->n_fd, strtoull(de->d_name, NULL, 10));
        b->n_fd++;
    }
    closedir(d);
    if (rc == KVEDGE_OK && b->n)
        qsort(b->r, b->n, sizeof *b->r, s_blobrec_cmp);
    return rc;
}

static void s_blobs_close(s_blobs_t *b)
{
    for (size_t i = 0; i < b->n_fd; i++)
        close(b->fd[i]);
    free(b->fd);
    free(b->r);
    memset(b, 0, sizeof *b);
}

/* The newest copy of a block in the blob files that passes the full check (and matches m when
 * m is not NULL). Returns a buffer the caller frees, or NULL. */
static uint8_t *s_blobs_find(const s_blobs_t *b, const uint8_t *kb, const kvedge_block_meta_t *m,
                             size_t *len, kvedge_block_info_t *info)
{
    size_t lo = 0, hi = b->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (memcmp(b->r[mid].key, kb, KVEDGE_BLOCK_KEY_BYTES) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < b->n && memcmp(b->r[i].key, kb, KVEDGE_BLOCK_KEY_BYTES) == 0; i++) {
        const s_blobrec_t *r = &b->r[i];
        if (r->len > (uint64_t)KVEDGE_BLOCK_MAX_BYTES * 2)
            continue;
        uint8_t *buf = malloc((size_t)r->len);
        if (!buf)
            return NULL;
        if (pread(b->fd[r->file], buf, (size_t)r->len, (off_t)r->off) == (ssize_t)r->len &&
            kvedge_block_check(buf, (size_t)r->len, info) == KVEDGE_OK &&
            (!m || kvedge_engine_check_block(buf, (size_t)r->len, m) == KVEDGE_OK)) {
            *len = (size_t)r->len;
            return buf;
        }
        free(buf);
    }
    return NULL;
}

/* ---------------------------------------------------------------- salvage */

typedef struct {
    kvedge_engine_t *src, *dst;
    kvedge_verify_cb cb;
    void *ctx;
    kvedge_repair_report_t *rep;
    const s_blobs_t *blobs;
    rocksdb_writebatch_t *b;
    size_t in_batch;
    uint64_t now;
} s_salvage_t;

static int s_flush(s_salvage_t *s)
{
    if (s->in_batch == 0)
        return KVEDGE_OK;
    int rc = s_write(s->dst, s->b);
    rocksdb_writebatch_clear(s->b);
    s->in_batch = 0;
    return rc;
}

/* The metadata a kept block gets: its own when that describes it, else rebuilt from the block,
 * keeping the pin and expiry of a readable record. */
static void s_meta_for(const kvedge_block_info_t *info, size_t len, bool have, bool matches,
                       uint64_t now, kvedge_block_meta_t *m)
{
    if (have && matches)
        return;
    bool pinned = have && m->pinned;
    uint64_t expires = have ? m->expires_ms : 0;
    memset(m, 0, sizeof *m);
    m->bytes = (uint32_t)len;
    m->dtype = info->dtype;
    m->scheme = info->scheme;
    m->tokens = info->tokens;
    m->head_dim = info->head_dim;
    m->key_channels = info->key_channels;
    m->group_size = info->group_size;
    m->lz4 = info->lz4;
    m->checksum = info->checksum;
    m->created_ms = now;
    m->atime_ms = now;
    m->pinned = pinned;
    m->expires_ms = pinned ? 0 : expires;
}

/* One key of the damaged store: its block kept (with meta and indexes) or quarantined. */
static int s_salvage_block(s_salvage_t *s, const uint8_t *kb)
{
    rocksdb_pinnableslice_t *blk;
    int brc = kvedge_engine_pget(s->src, s->src->ro, S_CF_BLOCKS, kb, KVEDGE_BLOCK_KEY_BYTES, &blk);
    kvedge_block_meta_t m;
    int mrc = kvedge_engine_read_meta(s->src, kb, &m);
    if (brc == KVEDGE_ENOTFOUND && mrc == KVEDGE_ENOTFOUND)
        return KVEDGE_OK; /* an index entry left behind: no block */
    size_t len = 0;
    const uint8_t *data = brc == KVEDGE_OK ? s_pval(blk, &len) : NULL;
    kvedge_block_info_t info;
    int err = data ? kvedge_block_check(data, len, &info) : KVEDGE_ECORRUPT;
    uint8_t *found = NULL;
    if (err != KVEDGE_OK && err != KVEDGE_ENOMEM) {
        /* Its meta when readable says which copy is the one stored; else the newest. */
        found = s_blobs_find(s->blobs, kb, mrc == KVEDGE_OK ? &m : NULL, &len, &info);
        if (!found && mrc == KVEDGE_OK)
            found = s_blobs_find(s->blobs, kb, NULL, &len, &info);
        if (found) {
            data = found;
            err = KVEDGE_OK;
            s->rep->from_blob_files++;
        }
    }
    int rc = KVEDGE_OK;
    if (err == KVEDGE_ENOMEM) {
        rc = err;
    } else if (err == KVEDGE_OK) {
        bool have = mrc == KVEDGE_OK;
        bool matches = have && kvedge_engine_check_block(data, len, &m) == KVEDGE_OK;
        s_meta_for(&info, len, have, matches, s->now, &m);
        if (!matches)
            s->rep->meta_rebuilt++;
        uint8_t rec[S_META_RECORD_BYTES], ik[S_INDEX_KEY_BYTES];
        kvedge_engine_meta_pack(&m, rec);
        rocksdb_writebatch_put_cf(s->b, s->dst->cf[S_CF_BLOCKS], (const char *)kb,
                                  KVEDGE_BLOCK_KEY_BYTES, (const char *)data, len);
        rocksdb_writebatch_put_cf(s->b, s->dst->cf[S_CF_META], (const char *)kb,
                                  KVEDGE_BLOCK_KEY_BYTES, (const char *)rec, sizeof rec);
        if (!m.pinned) {
            s_index_key(m.atime_ms, kb, ik);
            rocksdb_writebatch_put_cf(s->b, s->dst->cf[S_CF_LRU], (const char *)ik, sizeof ik, "",
                                      0);
            if (m.expires_ms) {
                s_index_key(m.expires_ms, kb, ik);
                rocksdb_writebatch_put_cf(s->b, s->dst->cf[S_CF_TTL], (const char *)ik, sizeof ik,
                                          "", 0);
            }
        }
        s->rep->blocks_kept++;
    } else {
        /* As a get would: the bytes (when any could be read) go to quarantine. */
        rocksdb_writebatch_put_cf(s->b, s->dst->cf[S_CF_QUARANTINE], (const char *)kb,
                                  KVEDGE_BLOCK_KEY_BYTES, data ? (const char *)data : "",
                                  data ? len : 0);
        s->rep->blocks_lost++;
        if (s->cb) {
            kvedge_block_key_t key;
            kvedge_block_key_unpack(kb, &key);
            rc = s->cb(s->ctx, &key, err);
        }
    }
    if (rc == KVEDGE_OK && ++s->in_batch >= S_BATCH_BLOCKS)
        rc = s_flush(s);
    free(found); /* the batch holds copies */
    if (blk)
        rocksdb_pinnableslice_destroy(blk);
    return rc;
}

/* Copies one readable chunk record and the model it names (when the new store lacks it). */
static int s_copy_chunk(s_salvage_t *s, const kvedge_chunk_id_t *id)
{
    kvedge_chunk_info_t c;
    if (kvedge_engine_read_chunk(s->dst, id, &c) == KVEDGE_OK)
        return KVEDGE_OK;
    int rc = kvedge_engine_read_chunk(s->src, id, &c);
    if (rc == KVEDGE_ENOMEM)
        return rc;
    if (rc != KVEDGE_OK) {
        s->rep->chunks_lost++;
        return KVEDGE_OK;
    }
    uint8_t rec[S_PREFIX_MAX_BYTES];
    size_t n = kvedge_engine_prefix_pack(&c, rec);
    char *err = NULL;
    rocksdb_put_cf(s->dst->db, s->dst->wo, s->dst->cf[S_CF_PREFIXES], (const char *)id->bytes,
                   KVEDGE_CHUNK_ID_BYTES, (const char *)rec, n, &err);
    if (err)
        return kvedge_rocks_error(&err);
    s->rep->chunks_kept++;
    rc = kvedge_engine_copy_model(s->dst, s->src, c.tenant, c.model_id);
    if (rc > 0)
        s->rep->models_kept++;
    return rc > 0 ? KVEDGE_OK : rc;
}

/* Readable records of the prefixes, models and quarantine families, in key order up to the
 * first that cannot be read; chunks of kept blocks past that are looked up one by one. */
static int s_copy_records(s_salvage_t *s, int cf)
{
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(ro, 0);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->src->db, ro, s->src->cf[cf]);
    int rc = KVEDGE_OK;
    for (rocksdb_iter_seek_to_first(it); rc == KVEDGE_OK && rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        const char *v = rocksdb_iter_value(it, &vlen);
        if (cf == S_CF_PREFIXES) {
            kvedge_chunk_info_t c;
            if (kvedge_engine_prefix_unpack((const uint8_t *)k, klen, (const uint8_t *)v, vlen,
                                            &c) == KVEDGE_OK)
                rc = s_copy_chunk(s, &c.id);
        } else if (cf == S_CF_MODELS) {
            rc = kvedge_engine_model_restore(s->dst, k, klen, v, vlen);
            if (rc == KVEDGE_OK)
                s->rep->models_kept++;
            else if (rc == KVEDGE_ESHAPE || rc == KVEDGE_ECORRUPT)
                rc = KVEDGE_OK; /* already carried over with a chunk, or unreadable */
        } else if (klen == KVEDGE_BLOCK_KEY_BYTES || klen == S_VARIANT_KEY_BYTES) {
            /* A block's entry, or a variant's (block key | rung). */
            rocksdb_pinnableslice_t *p;
            int q = kvedge_engine_pget(s->dst, s->dst->ro, S_CF_QUARANTINE, k, klen, &p);
            if (p)
                rocksdb_pinnableslice_destroy(p);
            if (q != KVEDGE_ENOTFOUND)
                continue; /* lost again in this repair: its entry is newer */
            char *err = NULL;
            rocksdb_put_cf(s->dst->db, s->dst->wo, s->dst->cf[S_CF_QUARANTINE], k, klen, v, vlen,
                           &err);
            if (err)
                rc = kvedge_rocks_error(&err);
            else
                s->rep->quarantine_kept++;
        }
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    if (err)
        (void)kvedge_rocks_error(&err); /* the rest of this family cannot be read */
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc;
}

/* Carries over the variants of kept blocks that pass the check a get makes and are bound to the
 * block kept; the rest are dropped, not quarantined (a variant can be made again from its
 * primary). Reads up to the first record RocksDB cannot read back. */
static int s_salvage_variants(s_salvage_t *s)
{
    if (!s->src->cf[S_CF_VARIANTS])
        return KVEDGE_OK;
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(ro, 0);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->src->db, ro, s->src->cf[S_CF_VARIANTS]);
    int rc = KVEDGE_OK;
    for (rocksdb_iter_seek_to_first(it); rc == KVEDGE_OK && rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_block_meta_t m;
        if (klen != S_VARIANT_KEY_BYTES || kvedge_engine_read_meta(s->dst, k, &m) != KVEDGE_OK)
            continue;
        rc = kvedge_engine_check_variant(v, vlen, k[KVEDGE_BLOCK_KEY_BYTES], &m);
        if (rc == KVEDGE_ECORRUPT) {
            rc = KVEDGE_OK;
            continue;
        }
        if (rc != KVEDGE_OK)
            break;
        rocksdb_writebatch_put_cf(s->b, s->dst->cf[S_CF_VARIANTS], (const char *)k, klen,
                                  (const char *)v, vlen);
        if (++s->in_batch >= S_BATCH_BLOCKS)
            rc = s_flush(s);
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    if (err)
        (void)kvedge_rocks_error(&err); /* the rest of the family cannot be read: dropped */
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc == KVEDGE_OK ? s_flush(s) : rc;
}

static int s_salvage(kvedge_engine_t *src, kvedge_engine_t *dst, const char *blob_dir,
                     kvedge_verify_cb cb, void *ctx, kvedge_repair_report_t *rep)
{
    s_blobs_t blobs = {0};
    s_salvage_t s = {src, dst, cb, ctx, rep, &blobs, rocksdb_writebatch_create(), 0, s_now(dst)};
    s_keys_t ks = {0};
    int rc = s_blobs_open(&blobs, blob_dir);
    if (rc == KVEDGE_OK)
        rc = s_collect_keys(src, &ks);
    for (size_t i = 0; rc == KVEDGE_OK && i < ks.n; i++)
        rc = s_salvage_block(&s, ks.k + i * KVEDGE_BLOCK_KEY_BYTES);
    if (rc == KVEDGE_OK)
        rc = s_flush(&s);
    if (rc == KVEDGE_OK)
        rc = s_salvage_variants(&s);
    if (rc == KVEDGE_OK)
        rc = s_copy_records(&s, S_CF_MODELS);
    if (rc == KVEDGE_OK)
        rc = s_copy_records(&s, S_CF_PREFIXES);
    /* The chunk of every kept block, also where the prefixes family could not be read. */
    for (size_t i = 0; rc == KVEDGE_OK && i < ks.n; i++) {
        const uint8_t *kb = ks.k + i * KVEDGE_BLOCK_KEY_BYTES;
        if (i > 0 && memcmp(kb, kb - KVEDGE_BLOCK_KEY_BYTES, KVEDGE_CHUNK_ID_BYTES) == 0)
            continue;
        rocksdb_pinnableslice_t *p;
        int have = kvedge_engine_pget(dst, dst->ro, S_CF_META, kb, KVEDGE_BLOCK_KEY_BYTES, &p);
        if (p)
            rocksdb_pinnableslice_destroy(p);
        if (have != KVEDGE_OK)
            continue; /* this key was not kept; a later key of the chunk may be */
        kvedge_chunk_id_t id;
        memcpy(id.bytes, kb, KVEDGE_CHUNK_ID_BYTES);
        rc = s_copy_chunk(&s, &id);
    }
    if (rc == KVEDGE_OK)
        rc = s_copy_records(&s, S_CF_QUARANTINE);
    free(ks.k);
    s_blobs_close(&blobs);
    rocksdb_writebatch_destroy(s.b);
    return rc;
}

/* ---------------------------------------------------------------- files */

static bool s_ends(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The files RocksDB owns in a store directory; everything else (certificates, the allowlist,
 * configuration) stays where it is. */
static bool s_rocks_file(const char *name)
{
    return strcmp(name, "CURRENT") == 0 || strcmp(name, "IDENTITY") == 0 ||
           strcmp(name, "LOCK") == 0 || strcmp(name, "LOG") == 0 ||
           strncmp(name, "LOG.old.", 8) == 0 || strncmp(name, "MANIFEST-", 9) == 0 ||
           strncmp(name, "OPTIONS-", 8) == 0 || s_ends(name, ".sst") || s_ends(name, ".blob") ||
           s_ends(name, ".log") || s_ends(name, ".dbtmp");
}

static int s_rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static bool s_exists(const char *dir, const char *name)
{
    char path[S_PATH_MAX];
    struct stat st;
    return snprintf(path, sizeof path, "%s/%s", dir, name) < (int)sizeof path &&
           stat(path, &st) == 0;
}

static void s_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* Makes dir/lost/PREFIX-TIME (a fresh one: -2, -3... when taken) and returns it in out. */
static int s_lost_dir(const char *dir, const char *prefix, char *out, size_t out_len)
{
    char lost[S_PATH_MAX];
    snprintf(lost, sizeof lost, "%s/" S_LOST_DIR, dir);
    if (mkdir(lost, 0755) != 0 && errno != EEXIST)
        return KVEDGE_EIO;
    char stamp[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    for (int i = 1; i < 1000; i++) {
        int n = i == 1 ? snprintf(out, out_len, "%s/%s-%s", lost, prefix, stamp)
                       : snprintf(out, out_len, "%s/%s-%s-%d", lost, prefix, stamp, i);
        if (n < 0 || (size_t)n >= out_len)
            return KVEDGE_EINVAL;
        if (mkdir(out, 0755) == 0)
            return KVEDGE_OK;
        if (errno != EEXIST)
            return KVEDGE_EIO;
    }
    return KVEDGE_EIO;
}

/* Moves (link: keep a copy with) the files of from that pick selects into to; CURRENT last,
 * so a store whose CURRENT is in place is whole. */
static int s_move_files(const char *from, const char *to, bool (*pick)(const char *),
                        bool link_only)
{
    DIR *d = opendir(from);
    if (!d)
        return KVEDGE_EIO;
    int rc = KVEDGE_OK;
    bool current = false;
    struct dirent *de;
    char a[S_PATH_MAX], b[S_PATH_MAX];
    while (rc == KVEDGE_OK && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || (pick && !pick(de->d_name)))
            continue;
        if (strcmp(de->d_name, "CURRENT") == 0) {
            current = true;
            continue;
        }
        snprintf(a, sizeof a, "%s/%s", from, de->d_name);
        snprintf(b, sizeof b, "%s/%s", to, de->d_name);
        struct stat st;
        if (stat(a, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if ((link_only ? link(a, b) : rename(a, b)) != 0)
            rc = KVEDGE_EIO;
    }
    closedir(d);
    if (rc == KVEDGE_OK && current && !link_only) {
        snprintf(a, sizeof a, "%s/CURRENT", from);
        snprintf(b, sizeof b, "%s/CURRENT", to);
        if (rename(a, b) != 0)
            rc = KVEDGE_EIO;
    }
    s_sync_dir(to);
    s_sync_dir(from);
    return rc;
}

static bool s_is_blob(const char *name)
{
    return s_ends(name, ".blob");
}

/* Puts the new store in place: the old RocksDB files to dir/lost/repair-TIME, the new ones
 * from dir/repair.tmp into dir. */
static int s_swap(const char *dir, const char *tmp, kvedge_repair_report_t *rep, char *why,
                  size_t why_len)
{
    int rc = KVEDGE_OK;
    if (s_exists(dir, "CURRENT")) {
        rc = s_lost_dir(dir, "repair", rep->old_files, sizeof rep->old_files);
        if (rc == KVEDGE_OK)
            rc = s_move_files(dir, rep->old_files, s_rocks_file, false);
        if (rc != KVEDGE_OK)
            return kvedge_why(why, why_len, rc, "cannot move the damaged store's files to %s: %s",
                              rep->old_files[0] ? rep->old_files : dir, strerror(errno));
    }
    rc = s_move_files(tmp, dir, NULL, false);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "cannot move the repaired store from %s into %s: %s",
                          tmp, dir, strerror(errno));
    (void)rmdir(tmp);
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- repair */

/* Opens the damaged store; when RocksDB cannot, runs its repair (which rebuilds the MANIFEST
 * from the tables it can read) and tries again. */
static int s_open_src(const char *dir, kvedge_engine_t **src, kvedge_repair_report_t *rep,
                      char *blob_dir, size_t blob_dir_len, char *why, size_t why_len)
{
    snprintf(blob_dir, blob_dir_len, "%s", dir);
    char msg[KVEDGE_ROCKS_MSG_MAX_BYTES] = "";
    int rc = kvedge_engine_open_salvage(dir, src, msg, sizeof msg);
    if (rc == KVEDGE_OK)
        return rc;
    if (rc == KVEDGE_EBUSY)
        return kvedge_why(why, why_len, rc, "%s (stop the node first)", msg);
    if (rc == KVEDGE_ENOTFOUND || rc == KVEDGE_ENOMEM)
        return kvedge_why(why, why_len, rc, "%s", msg);
    /* RocksDB's repair leaves blob files out of its new MANIFEST, and the next open deletes
     * them: keep a link to each first. */
    char blobs[S_PATH_MAX] = "";
    rc = s_lost_dir(dir, "blobs", blobs, sizeof blobs);
    if (rc == KVEDGE_OK)
        rc = s_move_files(dir, blobs, s_is_blob, true);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "cannot keep the blob files of %s: %s", dir,
                          strerror(errno));
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_enable_blob_files(o, 1);
    char *err = NULL;
    rocksdb_repair_db(o, dir, &err);
    rocksdb_options_destroy(o);
    if (err) {
        rc = kvedge_rocks_error_msg(&err, msg, sizeof msg);
        return kvedge_why(why, why_len, rc, "RocksDB cannot repair %s: %s", dir, msg);
    }
    rep->rocksdb_repaired = true;
    snprintf(blob_dir, blob_dir_len, "%s", blobs);
    rc = kvedge_engine_open_salvage(dir, src, msg, sizeof msg);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "%s, even after RocksDB's repair", msg);
    return KVEDGE_OK;
}

int kvedge_engine_repair(const char *dir, kvedge_verify_cb cb, void *ctx,
                         kvedge_repair_report_t *out, char *why, size_t why_len)
{
    kvedge_repair_report_t rep;
    memset(&rep, 0, sizeof rep);
    if (out)
        *out = rep;
    if (why && why_len)
        why[0] = '\0';
    if (!dir || !*dir)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "no store directory given");
    char tmp[S_PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s/" S_TMP_DIR, dir) >= (int)sizeof tmp)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "store path too long");
    int rc;
    if (!s_exists(dir, "CURRENT") && s_exists(tmp, "CURRENT")) {
        /* An earlier repair stopped while moving files: its new store is whole. */
        rc = s_swap(dir, tmp, &rep, why, why_len);
        goto done;
    }
    if (!s_exists(dir, "CURRENT")) {
        rc = kvedge_why(why, why_len, KVEDGE_ENOTFOUND, "no kvedge store at %s", dir);
        goto done;
    }
    kvedge_engine_t *src = NULL, *dst = NULL;
    char blob_dir[S_PATH_MAX];
    rc = s_open_src(dir, &src, &rep, blob_dir, sizeof blob_dir, why, why_len);
    if (rc != KVEDGE_OK)
        goto done;
    /* A newer kvedge's store is not rewritten in this one's format (a damaged record is). */
    if (kvedge_engine_check_format(src, why, why_len) == KVEDGE_EVERSION) {
        kvedge_engine_destroy(&src);
        rc = KVEDGE_EVERSION;
        goto done;
    }
    if (why && why_len)
        why[0] = '\0';
    /* A half-built store of an interrupted repair is ours to throw away. */
    (void)nftw(tmp, s_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    kvedge_engine_opts_t o;
    kvedge_engine_opts_default(&o);
    o.cache_bytes = 0;
    char msg[KVEDGE_ROCKS_MSG_MAX_BYTES] = "";
    rc = kvedge_engine_open(tmp, &o, &dst, msg, sizeof msg);
    if (rc != KVEDGE_OK) {
        kvedge_engine_destroy(&src);
        rc = kvedge_why(why, why_len, rc, "cannot create the repaired store: %s", msg);
        goto done;
    }
    rc = s_salvage(src, dst, blob_dir, cb, ctx, &rep);
    kvedge_engine_destroy(&dst); /* flushed: the new store's tables hold everything */
    kvedge_engine_destroy(&src);
    if (rc != KVEDGE_OK) {
        (void)nftw(tmp, s_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        rc = kvedge_why(why, why_len, rc, "salvage of %s stopped: %s (the store is unchanged)", dir,
                        kvedge_strerror(rc));
        goto done;
    }
    rc = s_swap(dir, tmp, &rep, why, why_len);
done:
    if (out)
        *out = rep;
    return rc;
}
