/* Repair: a damaged store salvaged into a new one, record by record, keeping every block that
 * passes the check a get makes and quarantining the rest (kvedge repair). */
#define _GNU_SOURCE /* nftw */
#include "store/engine/engine_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/engine/engine_debug.h"
#include "access/codec/why.h"

static _Atomic int s_fault; /* kvedge_engine_debug_repair_fault */

void kvedge_engine_debug_repair_fault(int fault)
{
    s_fault = fault;
}

static bool s_fault_take(int fault)
{
    int want = fault;
    return atomic_compare_exchange_strong(&s_fault, &want, KVEDGE_REPAIR_FAULT_NONE);
}

/* The new store is built here, inside the store directory (same file system: moved by
 * rename), and the old RocksDB files go under S_LOST_DIR (where RocksDB's own repair puts
 * what it drops). */
#define S_TMP_DIR  KVEDGE_REPAIR_TMP_DIR
#define S_LOST_DIR "lost"
/* The damaged store is read through a working copy (table and blob files linked, every file
 * RocksDB may rewrite copied): nothing RocksDB does while opening or repairing it reaches an
 * original file. */
#define S_WORK_DIR "repair.work"
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
 * for meta, 8 for the LRU and TTL indexes). A read that fails (a damaged table block) ends the
 * forward pass; a backward pass from the last key then takes what lies past the damage. Sets
 * *damaged when a read failed. */
static int s_collect_index(kvedge_engine_t *e, int cf, size_t key_off, s_keys_t *ks, bool *damaged)
{
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(ro, 0);
    int rc = KVEDGE_OK;
    for (int pass = 0; pass < 2 && rc == KVEDGE_OK; pass++) {
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(e->db, ro, e->cf[cf]);
        if (pass == 0)
            rocksdb_iter_seek_to_first(it);
        else
            rocksdb_iter_seek_to_last(it);
        for (; rc == KVEDGE_OK && rocksdb_iter_valid(it);
             pass == 0 ? rocksdb_iter_next(it) : rocksdb_iter_prev(it)) {
            size_t klen;
            const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
            if (klen == key_off + KVEDGE_BLOCK_KEY_BYTES)
                rc = s_keys_add(ks, k + key_off);
        }
        char *err = NULL;
        rocksdb_iter_get_error(it, &err);
        rocksdb_iter_destroy(it);
        if (!err)
            break; /* the whole family was read: no backward pass */
        (void)kvedge_rocks_error(&err);
        *damaged = true;
    }
    rocksdb_readoptions_destroy(ro);
    return rc;
}

/* Every block key the damaged store still names: its blocks (a walk, which steps past values
 * it cannot read), its meta records and its LRU and TTL indexes. Sets *damaged when a family
 * could not be read whole. */
static int s_collect_keys(kvedge_engine_t *e, s_keys_t *ks, bool *damaged)
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
    if (wrc != KVEDGE_OK && wrc != KVEDGE_ENOMEM)
        *damaged = true; /* a walk ended by damage: the indexes below name the keys past it */
    if (rc == KVEDGE_OK)
        rc = s_collect_index(e, S_CF_META, 0, ks, damaged);
    if (rc == KVEDGE_OK)
        rc = s_collect_index(e, S_CF_LRU, 8, ks, damaged);
    if (rc == KVEDGE_OK)
        rc = s_collect_index(e, S_CF_TTL, 8, ks, damaged);
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

/* The first record of the block in the (sorted) index, or b->n. */
static size_t s_blobs_first(const s_blobs_t *b, const uint8_t *kb)
{
    size_t lo = 0, hi = b->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (memcmp(b->r[mid].key, kb, KVEDGE_BLOCK_KEY_BYTES) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Whether the blob files hold any record of the block (sound or not). */
static bool s_blobs_have(const s_blobs_t *b, const uint8_t *kb)
{
    size_t lo = s_blobs_first(b, kb);
    return lo < b->n && memcmp(b->r[lo].key, kb, KVEDGE_BLOCK_KEY_BYTES) == 0;
}

/* The newest copy of a block in the blob files that passes the full check (and matches m when
 * m is not NULL). Returns a buffer the caller frees, or NULL. */
static uint8_t *s_blobs_find(const s_blobs_t *b, const uint8_t *kb, const kvedge_block_meta_t *m,
                             size_t *len, kvedge_block_info_t *info)
{
    for (size_t i = s_blobs_first(b, kb);
         i < b->n && memcmp(b->r[i].key, kb, KVEDGE_BLOCK_KEY_BYTES) == 0; i++) {
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
    bool damaged;      /* RocksDB's view is incomplete: the blob files name blocks too */
    bool models_whole; /* every model record of the store was read */
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
    /* Without src (RocksDB could not read the tables: blob files only) nothing is found there. */
    rocksdb_pinnableslice_t *blk = NULL;
    int brc = s->src ? kvedge_engine_pget(s->src, s->src->ro, S_CF_BLOCKS, kb,
                                          KVEDGE_BLOCK_KEY_BYTES, &blk)
                     : KVEDGE_ENOTFOUND;
    kvedge_block_meta_t m;
    int mrc = s->src ? kvedge_engine_read_meta(s->src, kb, &m) : KVEDGE_ENOTFOUND;
    if (brc == KVEDGE_ENOTFOUND && mrc == KVEDGE_ENOTFOUND &&
        !(s->damaged && s_blobs_have(s->blobs, kb)))
        return KVEDGE_OK; /* an index entry left behind: no block */
    kvedge_block_key_t key;
    kvedge_block_key_unpack(kb, &key);
    if (key.layer >= KVEDGE_MODEL_MAX_LAYERS || key.head >= KVEDGE_MODEL_MAX_HEADS) {
        s->rep->damaged_keys++; /* no put writes such a key: a damaged one, not a block */
        s->damaged = true;
        return KVEDGE_OK;
    }
    s->rep->blocks_found++;
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
        if (s->cb)
            rc = s->cb(s->ctx, &key, err);
    }
    if (rc == KVEDGE_OK && ++s->in_batch >= S_BATCH_BLOCKS)
        rc = s_flush(s);
    free(found); /* the batch holds copies */
    if (blk)
        rocksdb_pinnableslice_destroy(blk);
    return rc;
}

/* Writes a chunk record into the new store. */
static int s_put_chunk_record(s_salvage_t *s, const kvedge_chunk_info_t *c)
{
    uint8_t rec[S_PREFIX_MAX_BYTES];
    size_t n = kvedge_engine_prefix_pack(c, rec);
    char *err = NULL;
    rocksdb_put_cf(s->dst->db, s->dst->wo, s->dst->cf[S_CF_PREFIXES], (const char *)c->id.bytes,
                   KVEDGE_CHUNK_ID_BYTES, (const char *)rec, n, &err);
    return err ? kvedge_rocks_error(&err) : KVEDGE_OK;
}

/* A kept chunk's model the new store cannot resolve: a built-in gets its record (as a node
 * registers one on first use); any other is lost (its blocks are kept; no node can tell their
 * shape). */
static int s_builtin_or_lost(s_salvage_t *s, const char *id)
{
    kvedge_model_t builtin;
    if (kvedge_model_builtin(id, &builtin) != KVEDGE_OK) {
        s->rep->models_lost++;
        return KVEDGE_OK;
    }
    int rc = kvedge_engine_put_model(s->dst, &builtin);
    if (rc == KVEDGE_OK)
        s->rep->models_kept++;
    return rc;
}

/* What the kept blocks of one chunk say about it, and the one model they fit. */
typedef struct {
    uint16_t layers, heads; /* 1 + the largest layer and head kept */
    uint16_t head_dim;
    kvedge_dtype_t dtype;
    uint32_t tokens;
    bool mixed; /* blocks that disagree on tokens, head dim or dtype */
    kvedge_model_t fit, exact;
    int n_fit, n_exact;
    bool tenant_fit; /* a tenant's own record fits */
} s_shape_t;

/* Counts the models that fit exactly (layers and heads as kept) and loosely (at least). */
static void s_shape_fit(s_shape_t *sh, const kvedge_model_t *m)
{
    if (m->layers < sh->layers || m->kv_heads < sh->heads || m->head_dim != sh->head_dim ||
        m->dtype != sh->dtype)
        return;
    bool exact = m->layers == sh->layers && m->kv_heads == sh->heads;
    if ((exact && sh->n_exact && strcmp(sh->exact.id, m->id) == 0) ||
        (sh->n_fit && strcmp(sh->fit.id, m->id) == 0))
        return; /* a built-in also recorded in the store */
    if (exact) {
        sh->exact = *m;
        sh->n_exact++;
    }
    sh->fit = *m;
    sh->n_fit++;
}

/* Every record counts toward the fits; a tenant's own record marks the fit as one a rebuilt
 * record (which no tenant owns) could not resolve. */
static int s_shape_model_cb(void *ctx, const uint8_t *tenant, const kvedge_model_t *m)
{
    s_shape_t *sh = ctx;
    int exact = sh->n_exact, fit = sh->n_fit;
    s_shape_fit(sh, m);
    if (tenant && (sh->n_exact != exact || sh->n_fit != fit))
        sh->tenant_fit = true;
    return KVEDGE_OK;
}

/* A kept chunk whose record cannot be read gets one rebuilt from its blocks when exactly one
 * model the store knows fits them (layers and heads at least those kept, head dim, dtype):
 * served again, listed under no tenant (its tenant tag is all 0xff) and replaced by the next put
 * of the chunk. When the models family was not read whole, only an exact fit that is built in.
 * Otherwise the chunk is lost: its blocks are kept by key. */
static int s_rebuild_chunk(s_salvage_t *s, const kvedge_chunk_id_t *id)
{
    uint8_t upper[S_UPPER_BYTES];
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_chunk_iter(s->dst, S_CF_META, id, upper, &ro);
    s_shape_t sh = {0};
    bool any = false;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_block_meta_t m;
        if (klen != KVEDGE_BLOCK_KEY_BYTES || kvedge_engine_meta_unpack(v, vlen, &m) != KVEDGE_OK)
            continue;
        kvedge_block_key_t key;
        kvedge_block_key_unpack(k, &key);
        if (!any) {
            sh.head_dim = m.head_dim;
            sh.dtype = m.dtype;
            sh.tokens = m.tokens;
        }
        sh.mixed =
            sh.mixed || m.head_dim != sh.head_dim || m.dtype != sh.dtype || m.tokens != sh.tokens;
        sh.layers = key.layer + 1 > sh.layers ? (uint16_t)(key.layer + 1) : sh.layers;
        sh.heads = key.head + 1 > sh.heads ? (uint16_t)(key.head + 1) : sh.heads;
        any = true;
    }
    int rc = kvedge_engine_iter_close(it, ro, KVEDGE_OK);
    if (rc == KVEDGE_ENOMEM)
        return rc;
    if (rc == KVEDGE_OK && any && !sh.mixed) {
        size_t n_builtin;
        const kvedge_model_t *b = kvedge_model_builtins(&n_builtin);
        for (size_t i = 0; i < n_builtin; i++)
            s_shape_fit(&sh, &b[i]);
        rc = kvedge_engine_list_tenant_models(s->dst, s_shape_model_cb, &sh);
        if (rc == KVEDGE_ENOMEM)
            return rc;
    }
    /* One exact fit, else one loose fit, when every model the store knew was read; when some
     * record could not be read, only a built-in the blocks fit exactly (a lost record could
     * fit as well as any other). */
    const kvedge_model_t *fit = sh.n_exact == 1                    ? &sh.exact
                                : sh.n_exact == 0 && sh.n_fit == 1 ? &sh.fit
                                                                   : NULL;
    kvedge_model_t builtin;
    if (fit && !s->models_whole &&
        (fit != &sh.exact || kvedge_model_builtin(fit->id, &builtin) != KVEDGE_OK))
        fit = NULL;
    if (rc != KVEDGE_OK || !any || sh.mixed || !fit || sh.tenant_fit) {
        s->rep->chunks_lost++;
        return KVEDGE_OK;
    }
    kvedge_chunk_info_t c;
    memset(&c, 0, sizeof c);
    c.id = *id;
    c.name = *id;
    snprintf(c.model_id, sizeof c.model_id, "%s", fit->id);
    c.tokens = sh.tokens;
    c.created_ms = s->now;
    memset(c.tenant, 0xff, sizeof c.tenant);
    int wrc = s_put_chunk_record(s, &c);
    if (wrc != KVEDGE_OK)
        return wrc;
    s->rep->chunks_rebuilt++;
    kvedge_model_t have;
    return kvedge_engine_get_model(s->dst, fit->id, &have) == KVEDGE_OK
               ? KVEDGE_OK
               : s_builtin_or_lost(s, fit->id);
}

/* Copies one readable chunk record and the model it names (when the new store lacks it). */
static int s_copy_chunk(s_salvage_t *s, const kvedge_chunk_id_t *id)
{
    kvedge_chunk_info_t c;
    if (kvedge_engine_read_chunk(s->dst, id, &c) == KVEDGE_OK)
        return KVEDGE_OK;
    int rc = s->src ? kvedge_engine_read_chunk(s->src, id, &c) : KVEDGE_ECORRUPT;
    if (rc == KVEDGE_ENOMEM)
        return rc;
    if (rc == KVEDGE_ENOTFOUND && !s->damaged)
        return KVEDGE_OK; /* no record in a sound store: lost before (kept by key), not now */
    if (rc != KVEDGE_OK)
        return s_rebuild_chunk(s, id);
    rc = s_put_chunk_record(s, &c);
    if (rc != KVEDGE_OK)
        return rc;
    s->rep->chunks_kept++;
    rc = kvedge_engine_copy_model(s->dst, s->src, c.tenant, c.model_id);
    kvedge_model_t have;
    if (rc > 0)
        s->rep->models_kept++;
    else if (rc == 0 &&
             kvedge_engine_get_tenant_model(s->dst, c.tenant, c.model_id, &have) != KVEDGE_OK)
        rc = s_builtin_or_lost(s, c.model_id);
    return rc > 0 ? KVEDGE_OK : rc;
}

/* Readable records of the prefixes, models and quarantine families, in key order up to the
 * first that cannot be read; chunks of kept blocks past that are looked up one by one. */
static int s_copy_records(s_salvage_t *s, int cf)
{
    if (!s->src) {
        s->models_whole = false;
        return KVEDGE_OK;
    }
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
            if (rc == KVEDGE_ECORRUPT)
                s->models_whole = false;
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
    if (err) {
        (void)kvedge_rocks_error(&err); /* the rest of this family cannot be read */
        s->damaged = true;
        s->models_whole = s->models_whole && cf != S_CF_MODELS;
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc;
}

/* Carries over the variants of kept blocks that pass the check a get makes and are bound to the
 * block kept; the rest are dropped, not quarantined (a variant can be made again from its
 * primary). Reads up to the first record RocksDB cannot read back. */
static int s_salvage_variants(s_salvage_t *s)
{
    if (!s->src || !s->src->cf[S_CF_VARIANTS])
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
        if (klen != S_VARIANT_KEY_BYTES || kvedge_engine_read_meta(s->dst, k, &m) != KVEDGE_OK) {
            s->rep->variants_dropped++;
            continue;
        }
        rc = kvedge_engine_check_variant(v, vlen, k[KVEDGE_BLOCK_KEY_BYTES], &m);
        if (rc == KVEDGE_ECORRUPT) {
            s->rep->variants_dropped++;
            rc = KVEDGE_OK;
            continue;
        }
        if (rc != KVEDGE_OK)
            break;
        rocksdb_writebatch_put_cf(s->b, s->dst->cf[S_CF_VARIANTS], (const char *)k, klen,
                                  (const char *)v, vlen);
        s->rep->variants_kept++;
        if (++s->in_batch >= S_BATCH_BLOCKS)
            rc = s_flush(s);
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    if (err) {
        (void)kvedge_rocks_error(&err); /* the rest of the family cannot be read: dropped */
        s->damaged = true;
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc == KVEDGE_OK ? s_flush(s) : rc;
}

/* Salvages src into dst. damaged: RocksDB's view of src is known to be incomplete (it had to
 * be rebuilt, or it lost files the directory holds), so blocks that only the blob files hold
 * are taken too; the reads below may find more damage. src NULL: from the blob files alone. */
static int s_salvage(kvedge_engine_t *src, kvedge_engine_t *dst, const char *blob_dir, bool damaged,
                     kvedge_verify_cb cb, void *ctx, kvedge_repair_report_t *rep)
{
    s_blobs_t blobs = {0};
    s_salvage_t s = {
        src, dst, cb, ctx, rep, &blobs, damaged, true, rocksdb_writebatch_create(), 0, s_now(dst)};
    s_keys_t ks = {0};
    int rc = s_blobs_open(&blobs, blob_dir);
    if (rc == KVEDGE_OK && src)
        rc = s_collect_keys(src, &ks, &s.damaged);
    /* Blocks no table names any more are in the blob files still. */
    for (size_t i = 0; rc == KVEDGE_OK && s.damaged && i < blobs.n; i++)
        rc = s_keys_add(&ks, blobs.r[i].key);
    if (rc == KVEDGE_OK)
        s_keys_seal(&ks);
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
    const uint8_t *done = NULL; /* the last chunk copied */
    for (size_t i = 0; rc == KVEDGE_OK && i < ks.n; i++) {
        const uint8_t *kb = ks.k + i * KVEDGE_BLOCK_KEY_BYTES;
        if (done && memcmp(kb, done, KVEDGE_CHUNK_ID_BYTES) == 0)
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
        done = kb;
    }
    if (rc == KVEDGE_OK)
        rc = s_copy_records(&s, S_CF_QUARANTINE);
    rep->damaged = s.damaged;
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

/* The files a swap moves: RocksDB's but the LOCK, which repair holds throughout. */
static bool s_moved_file(const char *name)
{
    return s_rocks_file(name) && strcmp(name, "LOCK") != 0;
}

/* What the working copy needs: RocksDB's files but the lock and its info logs. */
static bool s_work_file(const char *name)
{
    return s_moved_file(name) && strcmp(name, "LOG") != 0 && strncmp(name, "LOG.old.", 8) != 0;
}

/* Files RocksDB never writes again once written: the working copy links them. */
static bool s_immutable_file(const char *name)
{
    return s_ends(name, ".sst") || s_ends(name, ".blob");
}

static int s_rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void s_rm_tree(const char *path)
{
    (void)nftw(path, s_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
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

/* Moves the files of from that pick selects into to. CURRENT goes first when current_first
 * (a store losing its files stops being one at once) and last otherwise (a store gaining
 * them is one only when whole). */
static int s_move_files(const char *from, const char *to, bool (*pick)(const char *),
                        bool current_first)
{
    char a[S_PATH_MAX], b[S_PATH_MAX];
    snprintf(a, sizeof a, "%s/CURRENT", from);
    snprintf(b, sizeof b, "%s/CURRENT", to);
    struct stat st;
    bool current = stat(a, &st) == 0;
    if (current && current_first && rename(a, b) != 0)
        return KVEDGE_EIO;
    DIR *d = opendir(from);
    if (!d)
        return KVEDGE_EIO;
    int rc = KVEDGE_OK;
    struct dirent *de;
    while (rc == KVEDGE_OK && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || !pick(de->d_name) || strcmp(de->d_name, "CURRENT") == 0)
            continue;
        if (snprintf(a, sizeof a, "%s/%s", from, de->d_name) >= (int)sizeof a ||
            snprintf(b, sizeof b, "%s/%s", to, de->d_name) >= (int)sizeof b) {
            rc = KVEDGE_EINVAL;
            break;
        }
        if (stat(a, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (rename(a, b) != 0)
            rc = KVEDGE_EIO;
    }
    closedir(d);
    if (rc == KVEDGE_OK && current && !current_first) {
        snprintf(a, sizeof a, "%s/CURRENT", from);
        snprintf(b, sizeof b, "%s/CURRENT", to);
        if (rename(a, b) != 0)
            rc = KVEDGE_EIO;
    }
    s_sync_dir(to);
    s_sync_dir(from);
    return rc;
}

static int s_copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY);
    if (in < 0)
        return KVEDGE_EIO;
    int out = open(to, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (out < 0) {
        close(in);
        return KVEDGE_EIO;
    }
    int rc = KVEDGE_OK;
    char buf[1 << 16];
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n == 0)
            break;
        if (n < 0 || write(out, buf, (size_t)n) != n) {
            rc = errno == ENOSPC ? KVEDGE_ENOSPC : KVEDGE_EIO;
            break;
        }
    }
    if (rc == KVEDGE_OK && fsync(out) != 0)
        rc = KVEDGE_EIO;
    close(in);
    close(out);
    return rc;
}

/* The working copy of the damaged store in work: its table and blob files linked (copied where
 * the file system cannot link), the rest copied; counts what the store holds into rep. */
static int s_make_work(const char *dir, const char *work, kvedge_repair_report_t *rep)
{
    s_rm_tree(work);
    if (mkdir(work, 0755) != 0)
        return KVEDGE_EIO;
    DIR *d = opendir(dir);
    if (!d)
        return KVEDGE_EIO;
    int rc = KVEDGE_OK;
    struct dirent *de;
    char a[S_PATH_MAX], b[S_PATH_MAX];
    while (rc == KVEDGE_OK && (de = readdir(d)) != NULL) {
        if (!s_work_file(de->d_name))
            continue;
        if (snprintf(a, sizeof a, "%s/%s", dir, de->d_name) >= (int)sizeof a ||
            snprintf(b, sizeof b, "%s/%s", work, de->d_name) >= (int)sizeof b) {
            rc = KVEDGE_EINVAL;
            break;
        }
        struct stat st;
        if (stat(a, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (s_ends(de->d_name, ".sst"))
            rep->table_files++;
        else if (s_ends(de->d_name, ".blob"))
            rep->blob_files++;
        else if (s_ends(de->d_name, ".log"))
            rep->wal_files++;
        if (kvedge_engine_rocks_data_file(de->d_name))
            rep->data_bytes += (uint64_t)st.st_size;
        if (!s_immutable_file(de->d_name) || link(a, b) != 0)
            rc = s_copy_file(a, b);
    }
    closedir(d);
    return rc;
}

/* Whether RocksDB, opening the working copy, dropped a table or blob file of the store: data
 * its MANIFEST does not name (a lost or rebuilt MANIFEST). */
static bool s_files_dropped(const char *dir, const char *work)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool dropped = false;
    struct dirent *de;
    while (!dropped && (de = readdir(d)) != NULL)
        dropped = s_immutable_file(de->d_name) && !s_exists(work, de->d_name);
    closedir(d);
    return dropped;
}

/* ---------------------------------------------------------------- the lock and the mark */

/* Takes the store's lock the way RocksDB does (a record lock on dir/LOCK), as an open file
 * description lock: it conflicts with a node's lock, also one in this process. */
static int s_lock_store(const char *dir, int *fd, char *why, size_t why_len)
{
    char path[S_PATH_MAX];
    if (snprintf(path, sizeof path, "%s/LOCK", dir) >= (int)sizeof path)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "store path too long");
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return kvedge_why(why, why_len, KVEDGE_ENOTFOUND, "no kvedge store at %s", dir);
    *fd = open(path, O_RDWR | O_CREAT, 0644);
    if (*fd < 0)
        return kvedge_why(why, why_len, KVEDGE_EIO, "cannot open %s: %s", path, strerror(errno));
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(*fd, F_OFD_SETLK, &fl) != 0) {
        close(*fd);
        *fd = -1;
        return kvedge_why(why, why_len, KVEDGE_ELOCKED,
                          "store %s is in use by another process or handle (stop the node first)",
                          dir);
    }
    return KVEDGE_OK;
}

/* The mark a verified new store carries until it is in place: "PHASE N\nOLD-FILES-DIR\n",
 * phase 1 when the old files may still be in dir, 2 once they are all in OLD-FILES-DIR. */
static int s_mark_write(const char *tmp, int phase, uint64_t kept, const char *old)
{
    char path[S_PATH_MAX], next[S_PATH_MAX];
    if (snprintf(path, sizeof path, "%s/" KVEDGE_REPAIR_MARK_FILE, tmp) >= (int)sizeof path ||
        snprintf(next, sizeof next, "%s.new", path) >= (int)sizeof next)
        return KVEDGE_EINVAL;
    FILE *f = fopen(next, "w");
    if (!f)
        return KVEDGE_EIO;
    int ok = fprintf(f, "%d %llu\n%s\n", phase, (unsigned long long)kept, old) > 0;
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(next, path) != 0)
        return KVEDGE_EIO;
    s_sync_dir(tmp);
    return KVEDGE_OK;
}

static int s_mark_read(const char *tmp, int *phase, uint64_t *kept, char *old, size_t old_len)
{
    char path[S_PATH_MAX];
    if (snprintf(path, sizeof path, "%s/" KVEDGE_REPAIR_MARK_FILE, tmp) >= (int)sizeof path)
        return KVEDGE_EINVAL;
    FILE *f = fopen(path, "r");
    if (!f)
        return KVEDGE_ENOTFOUND;
    unsigned long long k = 0;
    int ok = fscanf(f, "%d %llu\n", phase, &k) == 2 && fgets(old, (int)old_len, f) != NULL;
    fclose(f);
    old[ok ? strcspn(old, "\n") : 0] = '\0';
    *kept = k;
    return ok && (*phase == 1 || *phase == 2) && old[0] == '/' ? KVEDGE_OK : KVEDGE_ECORRUPT;
}

/* Puts the verified new store of tmp in place: the old RocksDB files to rep->old_files (made
 * when empty), the new ones from tmp into dir. Each step is recorded in the mark first, so a
 * repair that stops here is finished by the next run. */
static int s_swap(const char *dir, const char *tmp, int phase, kvedge_repair_report_t *rep,
                  char *why, size_t why_len)
{
    int rc = KVEDGE_OK;
    if (!rep->old_files[0]) {
        rc = s_lost_dir(dir, "repair", rep->old_files, sizeof rep->old_files);
        if (rc == KVEDGE_OK)
            rc = s_mark_write(tmp, 1, rep->blocks_kept, rep->old_files);
        if (rc != KVEDGE_OK)
            return kvedge_why(why, why_len, rc, "cannot prepare to move the old files: %s",
                              strerror(errno));
    }
    if (phase <= 1) {
        rc = s_move_files(dir, rep->old_files, s_moved_file, true);
        if (rc == KVEDGE_OK)
            rc = s_mark_write(tmp, 2, rep->blocks_kept, rep->old_files);
        if (rc == KVEDGE_OK && s_fault_take(KVEDGE_REPAIR_FAULT_STOP_SWAP))
            return kvedge_why(why, why_len, KVEDGE_EIO, "stopped by a test fault");
        if (rc != KVEDGE_OK)
            return kvedge_why(why, why_len, rc,
                              "cannot move the damaged store's files to %s: %s (run kvedge "
                              "repair again to finish)",
                              rep->old_files, strerror(errno));
    }
    rc = s_move_files(tmp, dir, s_moved_file, false);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc,
                          "cannot move the repaired store from %s into %s: %s (run kvedge "
                          "repair again to finish)",
                          tmp, dir, strerror(errno));
    s_sync_dir(dir);
    s_rm_tree(tmp); /* the mark goes last of all */
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- repair */

/* Opens the working copy; when RocksDB cannot, runs its repair on the copy (which rebuilds the
 * MANIFEST from the tables it can read, and drops the blob files from it) and tries again. */
static int s_open_src(const char *work, kvedge_engine_t **src, kvedge_repair_report_t *rep,
                      char *why, size_t why_len)
{
    char msg[KVEDGE_ROCKS_MSG_MAX_BYTES] = "";
    int rc = kvedge_engine_open_salvage(work, src, msg, sizeof msg);
    if (rc == KVEDGE_OK)
        return rc;
    if (rc == KVEDGE_ENOMEM)
        return kvedge_why(why, why_len, rc, "%s", msg);
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_enable_blob_files(o, 1);
    char *err = NULL;
    rocksdb_repair_db(o, work, &err);
    rocksdb_options_destroy(o);
    if (err) {
        rc = kvedge_rocks_error_msg(&err, msg, sizeof msg);
        return kvedge_why(why, why_len, rc, "RocksDB cannot rebuild a copy of the store: %s", msg);
    }
    rep->rocksdb_repaired = true;
    rc = kvedge_engine_open_salvage(work, src, msg, sizeof msg);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "%s, even after RocksDB's repair", msg);
    return KVEDGE_OK;
}

/* KVEDGE_REPAIR_FAULT_SHORT_STORE: deletes the first kept block of the new store. */
static void s_fault_drop_one(kvedge_engine_t *e)
{
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_BLOCKS, NULL, 0, NULL, 0, &ro);
    if (rocksdb_iter_valid(it)) {
        size_t klen;
        const char *k = rocksdb_iter_key(it, &klen);
        char *err = NULL;
        rocksdb_delete_cf(e->db, e->wo, e->cf[S_CF_BLOCKS], k, klen, &err);
        if (err)
            (void)kvedge_rocks_error(&err);
    }
    (void)kvedge_engine_iter_close(it, ro, KVEDGE_OK);
}

/* Reads the new store back block by block: it must hold every block the salvage kept, each
 * passing the check a read makes. */
static int s_verify_new(const char *tmp, const kvedge_repair_report_t *rep, char *why,
                        size_t why_len)
{
    kvedge_engine_opts_t o;
    kvedge_engine_opts_default(&o);
    o.cache_bytes = 0;
    o.create_if_missing = false;
    kvedge_engine_t *e = NULL;
    char msg[KVEDGE_ROCKS_MSG_MAX_BYTES] = "";
    int rc = kvedge_engine_open(tmp, &o, &e, msg, sizeof msg);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "cannot read the repaired store back: %s", msg);
    uint64_t checked = 0, bad = 0;
    kvedge_engine_stats_t st;
    rc = kvedge_engine_verify(e, false, NULL, NULL, &checked, &bad);
    if (rc == KVEDGE_OK)
        rc = kvedge_engine_stats(e, &st);
    kvedge_engine_destroy(&e);
    if (rc != KVEDGE_OK)
        return kvedge_why(why, why_len, rc, "cannot read the repaired store back: %s",
                          kvedge_strerror(rc));
    /* verify counts variant records beside blocks */
    if (checked != rep->blocks_kept + rep->variants_kept || bad != 0 ||
        st.blocks != rep->blocks_kept)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "the repaired store reads back %llu sound blocks and variants (%llu "
                          "bad), not the %llu blocks and %llu variants kept: it was not put in "
                          "place",
                          (unsigned long long)(checked - bad), (unsigned long long)bad,
                          (unsigned long long)rep->blocks_kept,
                          (unsigned long long)rep->variants_kept);
    return KVEDGE_OK;
}

static bool s_changed(const kvedge_repair_report_t *r)
{
    return r->damaged || r->rocksdb_repaired || r->blocks_lost || r->meta_rebuilt ||
           r->from_blob_files || r->chunks_lost || r->chunks_rebuilt || r->models_lost ||
           r->variants_dropped;
}

/* Builds the repaired store in tmp and reads it back; the lock is held. blob_only: RocksDB
 * is not asked to read the damaged store (an earlier try aborted in it): the blocks come from
 * the blob files alone. Touches no original file. */
static int s_build(const char *dir, const char *tmp, const char *work, bool blob_only,
                   kvedge_verify_cb cb, void *ctx, kvedge_repair_report_t *rep, char *why,
                   size_t why_len)
{
    if (kvedge_engine_dir_state(dir) == KVEDGE_STORE_DIR_NONE)
        return kvedge_why(why, why_len, KVEDGE_ENOTFOUND, "no kvedge store at %s", dir);
    int rc = s_make_work(dir, work, rep);
    if (rc != KVEDGE_OK) {
        s_rm_tree(work);
        return kvedge_why(why, why_len, rc, "cannot make a working copy of %s in %s: %s", dir, work,
                          kvedge_strerror(rc));
    }
    kvedge_engine_t *src = NULL, *dst = NULL;
    bool damaged = blob_only;
    if (!blob_only) {
        rc = s_open_src(work, &src, rep, why, why_len);
        if (rc != KVEDGE_OK) {
            s_rm_tree(work);
            return rc;
        }
        damaged = rep->rocksdb_repaired || s_files_dropped(dir, work);
        /* A newer kvedge's store is not rewritten in this one's format (a damaged record is). */
        if (kvedge_engine_check_format(src, why, why_len) == KVEDGE_EVERSION) {
            kvedge_engine_destroy(&src);
            s_rm_tree(work);
            return KVEDGE_EVERSION;
        }
        if (why && why_len)
            why[0] = '\0';
    }
    s_rm_tree(tmp); /* a half-built store of an interrupted repair */
    kvedge_engine_opts_t o;
    kvedge_engine_opts_default(&o);
    o.cache_bytes = 0;
    char msg[KVEDGE_ROCKS_MSG_MAX_BYTES] = "";
    rc = kvedge_engine_open(tmp, &o, &dst, msg, sizeof msg);
    if (rc == KVEDGE_OK) {
        /* The blob files are read where they are: the working copy's are links to them. */
        rc = s_salvage(src, dst, dir, damaged, cb, ctx, rep);
        if (rc == KVEDGE_OK && s_fault_take(KVEDGE_REPAIR_FAULT_SHORT_STORE))
            s_fault_drop_one(dst);
        kvedge_engine_destroy(&dst); /* flushed: the new store's tables hold everything */
    } else {
        snprintf(why, why_len, "cannot create the repaired store: %s", msg);
    }
    kvedge_engine_destroy(&src);
    s_rm_tree(work);
    if (rc == KVEDGE_OK)
        rc = s_verify_new(tmp, rep, why, why_len);
    else if (!why || !why[0])
        kvedge_why(why, why_len, rc, "salvage of %s stopped: %s", dir, kvedge_strerror(rc));
    if (rc != KVEDGE_OK || !s_changed(rep)) {
        s_rm_tree(tmp);
        rep->unchanged = true;
    }
    return rc;
}

/* ---------------------------------------------------------------- a build in a child process

 * Debian's librocksdb is built with assertions, and reading damaged tables can trip one
 * (get_context.cc: a value type no record should have): the build runs in a child process, so
 * an abort costs that try, not the caller. Lost blocks are relayed to the caller's callback (an
 * ack for each, so a stop is obeyed before anything else happens), then the report. */

typedef struct {
    int out; /* to the parent */
    int in;  /* the parent's acks */
} s_relay_t;

enum { S_MSG_LOST = 'L', S_MSG_DONE = 'R' };

static bool s_write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static bool s_read_all(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

static int s_relay_lost(void *ctx, const kvedge_block_key_t *key, int err)
{
    s_relay_t *r = ctx;
    uint8_t msg[1 + sizeof *key + sizeof err], ack = 1;
    msg[0] = S_MSG_LOST;
    memcpy(msg + 1, key, sizeof *key);
    memcpy(msg + 1 + sizeof *key, &err, sizeof err);
    if (!s_write_all(r->out, msg, sizeof msg) || !s_read_all(r->in, &ack, 1))
        return KVEDGE_ECANCELED;
    return ack ? KVEDGE_ECANCELED : 0;
}

/* Runs s_build in a child (only in a process where RocksDB has not started its threads).
 * Returns its result, or 1 when the child died of a signal (*sig). */
static int s_build_in_child(const char *dir, const char *tmp, const char *work, bool blob_only,
                            kvedge_verify_cb cb, void *ctx, kvedge_repair_report_t *rep, char *why,
                            size_t why_len, int *sig)
{
    int up[2], down[2];
    if (pipe(up) != 0)
        return kvedge_why(why, why_len, KVEDGE_EIO, "cannot make a pipe: %s", strerror(errno));
    if (pipe(down) != 0) {
        close(up[0]);
        close(up[1]);
        return kvedge_why(why, why_len, KVEDGE_EIO, "cannot make a pipe: %s", strerror(errno));
    }
    fflush(NULL); /* nothing buffered is written twice */
    pid_t pid = fork();
    if (pid < 0) {
        close(up[0]);
        close(up[1]);
        close(down[0]);
        close(down[1]);
        return kvedge_why(why, why_len, KVEDGE_EIO, "cannot fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        /* Test-only (engine_debug.h): the first try dies as librocksdb's assertions make it. */
        const char *fault = getenv(KVEDGE_REPAIR_FAULT_ENV);
        if (!blob_only && fault && strcmp(fault, "abort") == 0)
            abort();
        s_relay_t r = {up[1], down[0]};
        char cwhy[1024] = "";
        int32_t crc = s_build(dir, tmp, work, blob_only, cb ? s_relay_lost : NULL, &r, rep, cwhy,
                              sizeof cwhy);
        uint8_t tag = S_MSG_DONE;
        bool ok = s_write_all(up[1], &tag, 1) && s_write_all(up[1], &crc, sizeof crc) &&
                  s_write_all(up[1], rep, sizeof *rep) && s_write_all(up[1], cwhy, sizeof cwhy);
        _exit(ok ? 0 : 1);
    }
    close(up[1]);
    close(down[0]);
    int rc = KVEDGE_EIO;
    bool done = false;
    for (;;) {
        uint8_t tag;
        if (!s_read_all(up[0], &tag, 1))
            break;
        if (tag == S_MSG_LOST) {
            kvedge_block_key_t key;
            int err;
            if (!s_read_all(up[0], &key, sizeof key) || !s_read_all(up[0], &err, sizeof err))
                break;
            uint8_t stop = cb(ctx, &key, err) != 0;
            if (!s_write_all(down[1], &stop, 1))
                break;
        } else if (tag == S_MSG_DONE) {
            int32_t crc;
            char cwhy[1024];
            done = s_read_all(up[0], &crc, sizeof crc) && s_read_all(up[0], rep, sizeof *rep) &&
                   s_read_all(up[0], cwhy, sizeof cwhy);
            if (done) {
                cwhy[sizeof cwhy - 1] = '\0';
                rc = crc;
                if (why && why_len)
                    snprintf(why, why_len, "%s", cwhy);
            }
            break;
        } else {
            break;
        }
    }
    close(up[0]);
    close(down[1]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    (void)s_fault_take(KVEDGE_REPAIR_FAULT_SHORT_STORE); /* the child met it */
    if (!done && WIFSIGNALED(st)) {
        *sig = WTERMSIG(st);
        return 1;
    }
    if (!done)
        return kvedge_why(why, why_len, KVEDGE_EIO, "the repair's child process failed");
    return rc;
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
    char tmp[S_PATH_MAX], work[S_PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s/" S_TMP_DIR, dir) >= (int)sizeof tmp ||
        snprintf(work, sizeof work, "%s/" S_WORK_DIR, dir) >= (int)sizeof work)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "store path too long");
    int lock = -1;
    int rc = s_lock_store(dir, &lock, why, why_len);
    if (rc != KVEDGE_OK)
        goto done;
    int phase;
    if (s_mark_read(tmp, &phase, &rep.blocks_kept, rep.old_files, sizeof rep.old_files) ==
        KVEDGE_OK) {
        /* An earlier repair stopped while putting its verified store in place. */
        rep.resumed = true;
        rc = s_swap(dir, tmp, phase, &rep, why, why_len);
    } else if (atomic_load(&kvedge_engine_rocksdb_started)) {
        /* RocksDB's thread pools run in this process and a child would have none of them (its
         * flushes would never run): the build runs here, unprotected from an abort. */
        rc = s_build(dir, tmp, work, false, cb, ctx, &rep, why, why_len);
        if (rc == KVEDGE_OK && !rep.unchanged)
            rc = s_swap(dir, tmp, 0, &rep, why, why_len);
    } else {
        int sig = 0;
        rc = s_build_in_child(dir, tmp, work, false, cb, ctx, &rep, why, why_len, &sig);
        if (rc == 1) {
            /* RocksDB aborted reading the damaged tables: the blob files alone, once. */
            memset(&rep, 0, sizeof rep);
            rep.rocksdb_aborted = true;
            s_rm_tree(work);
            s_rm_tree(tmp);
            rc = s_build_in_child(dir, tmp, work, true, cb, ctx, &rep, why, why_len, &sig);
            rep.rocksdb_aborted = true;
            if (rc == 1) {
                s_rm_tree(work);
                s_rm_tree(tmp);
                rc = kvedge_why(why, why_len, KVEDGE_ESTORE,
                                "the repair died of signal %d twice, the second time reading the "
                                "blob files alone; the store is unchanged",
                                sig);
            }
        }
        if (rc == KVEDGE_OK && !rep.unchanged)
            rc = s_swap(dir, tmp, 0, &rep, why, why_len);
    }
    close(lock);
done:
    if (out)
        *out = rep;
    return rc;
}
