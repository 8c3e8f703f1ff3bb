/* The block engine: opening and closing the store (options, format version, column
 * families), its RocksDB primitives, model shapes and statistics. The rest of the contract of
 * store/engine/engine.h lives in store/engine_*.c, sharing store/engine/engine_impl.h. */
#include "store/engine/engine_impl.h"
#include "store/engine/engine_debug.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define S_FORMAT_KEY "kvedge.format"
/* The cache is split in shards of at least this much (at most 64 shards): an LRU shard
 * evicts on its own, so it must hold many of the largest blocks at once. */
#define S_CACHE_SHARD_MIN_BYTES (256ull << 20)
#define S_CACHE_SHARD_BITS_MAX  6

static const char *const s_cf_names[S_CF_COUNT] = {
    "default", "blocks", "meta", "lru", "ttl", "prefixes", "models", "quarantine", "variants",
};

/* ---------------------------------------------------------------- RocksDB boundary */

int kvedge_engine_pget(kvedge_engine_t *e, const rocksdb_readoptions_t *ro, int cf, const void *key,
                       size_t klen, rocksdb_pinnableslice_t **out)
{
    char *err = NULL;
    *out = rocksdb_get_pinned_cf(e->db, ro, e->cf[cf], key, klen, &err);
    if (err) {
        if (*out)
            rocksdb_pinnableslice_destroy(*out);
        *out = NULL;
        return kvedge_rocks_error(&err);
    }
    return *out ? KVEDGE_OK : KVEDGE_ENOTFOUND;
}

int kvedge_engine_read_meta(kvedge_engine_t *e, const uint8_t *kb, kvedge_block_meta_t *m)
{
    rocksdb_pinnableslice_t *p;
    int rc = s_pget(e, S_CF_META, kb, KVEDGE_BLOCK_KEY_BYTES, &p);
    if (rc != KVEDGE_OK)
        return rc;
    size_t len;
    const uint8_t *v = s_pval(p, &len);
    rc = kvedge_engine_meta_unpack(v, len, m);
    rocksdb_pinnableslice_destroy(p);
    return rc;
}

rocksdb_iterator_t *kvedge_engine_iter(kvedge_engine_t *e, int cf, const void *lower, size_t llen,
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

int kvedge_engine_iter_close(rocksdb_iterator_t *it, rocksdb_readoptions_t *ro, int rc)
{
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    if (err) {
        int ierr = kvedge_rocks_error(&err);
        if (rc >= 0)
            rc = ierr;
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return rc;
}

/* ---------------------------------------------------------------- totals */

void kvedge_engine_totals(kvedge_engine_t *e, const kvedge_block_meta_t *m, bool add,
                          bool with_bytes)
{
    void (*f)(_Atomic uint64_t *, uint64_t) = add ? s_add : s_sub;
    f(&e->blocks, 1);
    if (!add)
        s_add(&e->uncompacted, m->bytes); /* its blob stays on disk until a compaction */
    if (with_bytes) {
        f(&e->bytes, m->bytes);
        f(&e->used, m->bytes);
    }
    f(&e->fp16_bytes, kvedge_block_fp16_bytes(m->tokens, m->head_dim));
    if (m->pinned) {
        f(&e->pinned_blocks, 1);
        f(&e->pinned_bytes, m->bytes);
    }
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

/* Maps an error from opening a store into a code and a reason; frees the message. */
static int s_open_err(char **err, const char *dir, char *why, size_t why_len)
{
    char msg[KVEDGE_ROCKS_MSG_MAX_BYTES];
    int rc = kvedge_rocks_open_error(err, msg, sizeof msg);
    if (rc == KVEDGE_ELOCKED)
        s_why(why, why_len, "store %s is in use by another process or handle (%s)", dir, msg);
    else
        s_why(why, why_len, "cannot open store %s: %s", dir, msg);
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
            char msg[KVEDGE_ROCKS_MSG_MAX_BYTES];
            rc = kvedge_rocks_error_msg(&err, msg, sizeof msg);
            s_why(why, why_len, "cannot write the format version: %s", msg);
            return rc;
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
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_META, NULL, 0, NULL, 0, &ro);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        (void)rocksdb_iter_key(it, &klen);
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vlen);
        kvedge_block_meta_t m;
        if (klen == KVEDGE_BLOCK_KEY_BYTES && kvedge_engine_meta_unpack(v, vlen, &m) == KVEDGE_OK)
            kvedge_engine_totals(e, &m, true, true);
    }
    int rc = kvedge_engine_iter_close(it, ro, KVEDGE_OK);
    if (rc != KVEDGE_OK)
        return rc;
    it = kvedge_engine_iter(e, S_CF_QUARANTINE, NULL, 0, NULL, 0, &ro);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it))
        s_add(&e->quarantined, 1);
    rc = kvedge_engine_iter_close(it, ro, KVEDGE_OK);
    if (rc != KVEDGE_OK)
        return rc;
    return kvedge_engine_load_variant_totals(e);
}

/* What a directory holds, read before RocksDB touches it: RocksDB opened with
 * create_if_missing on a directory whose CURRENT is gone writes a new CURRENT and an empty
 * MANIFEST, and its next open deletes every table and blob file that MANIFEST does not name. */
int kvedge_engine_dir_state(const char *dir)
{
    char path[4096];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/" KVEDGE_REPAIR_TMP_DIR "/" KVEDGE_REPAIR_MARK_FILE, dir) <
            (int)sizeof path &&
        stat(path, &st) == 0)
        return KVEDGE_STORE_DIR_REPAIRING;
    bool data = false;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while (!data && (de = readdir(d)) != NULL)
            data = kvedge_engine_rocks_data_file(de->d_name);
        closedir(d);
    }
    /* CURRENT names the MANIFEST: "MANIFEST-NNNNNN\n". */
    char cur[64] = "";
    FILE *f =
        snprintf(path, sizeof path, "%s/CURRENT", dir) < (int)sizeof path ? fopen(path, "r") : NULL;
    if (!f)
        return data ? KVEDGE_STORE_DIR_DAMAGED : KVEDGE_STORE_DIR_NONE;
    size_t got = fread(cur, 1, sizeof cur - 1, f);
    cur[got] = '\0';
    fclose(f);
    size_t len = strcspn(cur, "\n");
    bool named = len > 9 && strncmp(cur, "MANIFEST-", 9) == 0 && cur[len] == '\n' &&
                 strspn(cur + 9, "0123456789") == len - 9;
    cur[len] = '\0';
    return named && snprintf(path, sizeof path, "%s/%s", dir, cur) < (int)sizeof path &&
                   stat(path, &st) == 0 && S_ISREG(st.st_mode)
               ? KVEDGE_STORE_DIR_SOUND
               : KVEDGE_STORE_DIR_DAMAGED;
}

bool kvedge_engine_rocks_data_file(const char *name)
{
    size_t n = strlen(name);
    return strncmp(name, "MANIFEST-", 9) == 0 ||
           (n > 4 && (strcmp(name + n - 4, ".sst") == 0 || strcmp(name + n - 4, ".log") == 0)) ||
           (n > 5 && strcmp(name + n - 5, ".blob") == 0);
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
        /* Index and filter blocks live in the cache too, under its bound. */
        rocksdb_block_based_options_set_cache_index_and_filter_blocks(table, 1);
        rocksdb_options_set_block_based_table_factory(base, table);
    }
    /* Memory bounds besides the cache: the memtables (docs/operations.md, "Memory"). */
    rocksdb_options_set_db_write_buffer_size(base, KVEDGE_ENGINE_MEMTABLE_BYTES);
    rocksdb_options_set_max_write_buffer_number(base, 2);
    rocksdb_options_set_create_if_missing(base, !e->opts.read_only);
    rocksdb_options_set_create_missing_column_families(base, !e->opts.read_only);
    uint64_t wb, small_wb;
    kvedge_engine_disk_bounds(dir, e->opts.capacity_bytes, &wb, &small_wb, &e->wal_bound_bytes);
    e->write_buffer_bytes = wb;
    /* Of the capacity, the WAL may take its bound, and the blob files of blocks evicted but
     * not yet compacted away about two write buffers: blocks get the rest. */
    uint64_t disk_share = e->wal_bound_bytes + 2 * wb;
    e->block_capacity = e->opts.capacity_bytes > 2 * disk_share
                            ? e->opts.capacity_bytes - disk_share
                            : e->opts.capacity_bytes;
    rocksdb_options_set_write_buffer_size(base, (size_t)small_wb);
    rocksdb_options_set_max_total_wal_size(base, e->wal_bound_bytes);
    /* RocksDB's own info log (DIR/LOG) rolls at 1 MiB, two kept: bounded on disk too. */
    rocksdb_options_set_max_log_file_size(base, 1u << 20);
    rocksdb_options_set_keep_log_file_num(base, 2);
    if (e->salvage) {
        rocksdb_options_set_paranoid_checks(base, 0);
        rocksdb_options_set_disable_auto_compactions(base, 1);
    }

    if (exists) {
        listed = rocksdb_list_column_families(base, dir, &n_listed, &err);
        if (err) {
            rc = s_open_err(&err, dir, why, why_len);
            goto done;
        }
    }
    size_t n_ours = S_CF_COUNT;
    if (e->opts.read_only) {
        /* A read-only open cannot create families: a kvedge store has them all, but for the
         * variants family (the last of ours), which a store that never held variants lacks. */
        for (size_t j = 0; exists && j < S_CF_COUNT; j++) {
            bool found = false;
            for (size_t i = 0; i < n_listed; i++)
                found = found || strcmp(listed[i], s_cf_names[j]) == 0;
            if (!found && j == S_CF_VARIANTS) {
                n_ours = S_CF_VARIANTS;
            } else if (!found) {
                s_why(why, why_len, "store %s lacks the column family %s", dir, s_cf_names[j]);
                rc = KVEDGE_ECORRUPT;
                goto done;
            }
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
    for (size_t i = 0; i < n_ours; i++)
        names[n++] = s_cf_names[i];
    for (size_t i = 0; i < n_listed; i++) {
        bool ours = false;
        for (size_t j = 0; j < S_CF_COUNT; j++)
            ours = ours || strcmp(listed[i], s_cf_names[j]) == 0;
        if (!ours)
            names[n++] = listed[i];
    }
    blobs = rocksdb_options_create();
    if (e->salvage) {
        rocksdb_options_set_paranoid_checks(blobs, 0);
        rocksdb_options_set_disable_auto_compactions(blobs, 1);
    }
    rocksdb_options_set_write_buffer_size(blobs, (size_t)wb);
    rocksdb_options_set_max_write_buffer_number(blobs, 2);
    rocksdb_options_set_max_total_wal_size(blobs, e->wal_bound_bytes);
    rocksdb_options_set_enable_blob_files(blobs, 1);
    rocksdb_options_set_min_blob_size(blobs, e->opts.blob_min_bytes);
    /* No blob garbage collection: it relocates the live blocks of the oldest blob files in
     * every compaction, which needs free space the size of what it moves (a store filling its
     * disk then fails its compactions for good) and fails on a damaged blob. A blob file goes
     * back to the file system once none of its blocks is referenced any more; evictions free
     * the oldest first (see kvedge_engine_disk_admit for the compaction that drops the
     * references). */
    rocksdb_options_set_enable_blob_gc(blobs, 0);
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
    for (size_t i = 0; i < n_ours; i++)
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

/* Set by the first open: RocksDB's background threads may exist in this process from then on,
 * and a fork would copy none of them (engine_repair.c forks only before). */
_Atomic bool kvedge_engine_rocksdb_started;

static int s_open(const char *dir, const kvedge_engine_opts_t *opts, bool salvage,
                  kvedge_engine_t **out, char *why, size_t why_len)
{
    atomic_store(&kvedge_engine_rocksdb_started, true);
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
    e->salvage = salvage;
    for (size_t i = 0; i < S_STRIPES; i++)
        pthread_mutex_init(&e->stripes[i], NULL);
    pthread_mutex_init(&e->evict_mu, NULL);
    pthread_mutex_init(&e->models_mu, NULL);
    pthread_mutex_init(&e->scrub_mu, NULL);

    int rc;
    int state = kvedge_engine_dir_state(dir);
    bool exists = state == KVEDGE_STORE_DIR_SOUND;
    if (state == KVEDGE_STORE_DIR_REPAIRING) {
        /* A repair verified a new store and stopped while putting it in place. */
        s_why(why, why_len,
              "store %s is being repaired: a verified new store waits in %s/" KVEDGE_REPAIR_TMP_DIR
              "; run kvedge repair --data %s to finish putting it in place",
              dir, dir, dir);
        rc = KVEDGE_ELOCKED;
        goto fail;
    }
    if (state == KVEDGE_STORE_DIR_DAMAGED) {
        /* Never opened by RocksDB: it would create a new store over the files. */
        s_why(why, why_len,
              "its CURRENT file is missing or names no MANIFEST, but it holds RocksDB data "
              "files (left untouched)");
        rc = KVEDGE_ECORRUPT;
        goto fail;
    }
    if (!exists && (e->opts.read_only || !e->opts.create_if_missing)) {
        s_why(why, why_len, "no kvedge store at %s", dir);
        rc = KVEDGE_ENOTFOUND;
        goto fail;
    }
    if (!e->opts.read_only && !salvage)
        kvedge_engine_disk_before_open(dir);
    if (e->opts.cache_bytes) {
        rocksdb_lru_cache_options_t *co = rocksdb_lru_cache_options_create();
        rocksdb_lru_cache_options_set_capacity(co, (size_t)e->opts.cache_bytes);
        rocksdb_lru_cache_options_set_num_shard_bits(co, s_cache_shard_bits(e->opts.cache_bytes));
        e->cache = rocksdb_cache_create_lru_opts(co);
        rocksdb_lru_cache_options_destroy(co);
    }
    rc = s_open_db(e, dir, exists, why, why_len);
    if (rc == KVEDGE_OK)
        rc = kvedge_engine_disk_open(e, dir);
    if (rc != KVEDGE_OK)
        goto fail;
    e->ro = rocksdb_readoptions_create();
    e->ro_blk = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(e->ro_blk, 0);
    e->wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(e->wo, e->opts.sync ? 1 : 0);
    if (salvage) {
        *out = e;
        return KVEDGE_OK;
    }
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

int kvedge_engine_open(const char *dir, const kvedge_engine_opts_t *opts, kvedge_engine_t **out,
                       char *why, size_t why_len)
{
    int rc = s_open(dir, opts, false, out, why, why_len);
    /* CURRENT naming a MANIFEST that is gone or unreadable: the store is damaged, not the
     * disk failing. */
    if (rc == KVEDGE_EIO && why && strstr(why, "MANIFEST") &&
        kvedge_engine_dir_state(dir) != KVEDGE_STORE_DIR_NONE)
        rc = KVEDGE_ECORRUPT;
    if (rc == KVEDGE_ECORRUPT && why && why_len) {
        /* The way out, in every message that reports a damaged store (CLI, node). The hint
         * is kept whole: the reason before it is cut short when both do not fit. */
        char hint[KVEDGE_ROCKS_MSG_MAX_BYTES];
        int n = snprintf(hint, sizeof hint, "; run kvedge repair --data %s to salvage it", dir);
        size_t have = strlen(why);
        if (n > 0 && (size_t)n < why_len) {
            size_t at = have + (size_t)n < why_len ? have : why_len - 1 - (size_t)n;
            memcpy(why + at, hint, (size_t)n + 1);
        }
    }
    return rc;
}

int kvedge_engine_check_format(kvedge_engine_t *e, char *why, size_t why_len)
{
    return s_check_format(e, why, why_len);
}

int kvedge_engine_open_salvage(const char *dir, kvedge_engine_t **out, char *why, size_t why_len)
{
    kvedge_engine_opts_t opts;
    kvedge_engine_opts_default(&opts);
    opts.create_if_missing = false;
    opts.cache_bytes = 0;
    return s_open(dir, &opts, true, out, why, why_len);
}

void kvedge_engine_destroy(kvedge_engine_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_engine_t *e = *self_p;
    *self_p = NULL;
    if (e->db) {
        /* Flush memtables on a clean close: blob files and SSTs hold everything, and the
         * next open has no WAL to replay. A failed flush loses nothing (the WAL has it); not
         * tried after a failed write or without room for it (a RocksDB writer used again after
         * an error aborts the process). */
        bool stopped = !e->opts.read_only && kvedge_engine_disk_write_stopped(e);
        bool flush = !e->opts.read_only && !stopped && kvedge_engine_disk_can_flush(e);
        if (!e->opts.read_only && !stopped && !flush) {
            kvedge_engine_disk_release(e); /* the reserve is the room the flush needs */
            flush = kvedge_engine_disk_can_flush(e);
        }
        if (flush) {
            rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
            rocksdb_flushoptions_set_wait(fo, 1);
            bool failed = false;
            for (size_t i = 0; i < e->n_handles && !failed; i++) {
                char *err = NULL;
                rocksdb_flush_cf(e->db, fo, e->handles[i], &err);
                failed = err != NULL;
                if (err)
                    (void)kvedge_rocks_error(&err);
            }
            rocksdb_flushoptions_destroy(fo);
            /* A flush that failed (the disk filled under it, or RocksDB had already stopped
             * writing on an error a write met) leaves RocksDB stopped: closing would abort as
             * below. */
            stopped = failed || kvedge_engine_disk_write_stopped(e);
        }
        if (stopped) {
            /* RocksDB stopped writing on an error (a full disk under a flush): closing would use
             * the writer that failed again, which Debian's librocksdb (built with assertions)
             * aborts on. Its background work is stopped and the handle left to the process's
             * exit: every acknowledged write is in the WAL, which the next open replays. */
            rocksdb_cancel_all_background_work(e->db, 1);
            e->db = NULL;
        } else {
            for (size_t i = e->n_handles; i-- > 0;)
                rocksdb_column_family_handle_destroy(e->handles[i]);
            rocksdb_close(e->db);
        }
    }
    if (e->cache)
        rocksdb_cache_destroy(e->cache); /* after the DB: its families hold it until closed */
    free(e->handles);
    free(e->dir);
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

/* A node-wide record's key is its model id, which never holds a NUL (the layout of every store
 * written before tenants had namespaces); a tenant's is NUL | tenant tag (16 bytes) | id. The
 * two never meet, so an older store opens as it is: its records are the node-wide ones. */
#define S_MODEL_TAG_BYTES    16
#define S_MODEL_PREFIX_BYTES (1 + S_MODEL_TAG_BYTES)
#define S_MODEL_KEY_MAX      (S_MODEL_PREFIX_BYTES + KVEDGE_MODEL_ID_MAX_BYTES)

static bool s_id_ok(const char *id)
{
    return id && id[0] != '\0' &&
           strnlen(id, KVEDGE_MODEL_ID_MAX_BYTES + 1) <= KVEDGE_MODEL_ID_MAX_BYTES;
}

static bool s_same_shape(const kvedge_model_t *a, const kvedge_model_t *b)
{
    return a->layers == b->layers && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim &&
           a->dtype == b->dtype;
}

/* A tenant namespace was named: a tag that is not NULL and not all zero. */
static bool s_tenant_named(const uint8_t *tenant)
{
    if (!tenant)
        return false;
    for (int i = 0; i < S_MODEL_TAG_BYTES; i++)
        if (tenant[i])
            return true;
    return false;
}

/* The key of id's record in tenant's namespace (NULL: node-wide); returns its length. */
static size_t s_model_key(const uint8_t *tenant, const char *id, char out[S_MODEL_KEY_MAX])
{
    size_t n = strlen(id), at = 0;
    if (s_tenant_named(tenant)) {
        out[0] = '\0';
        memcpy(out + 1, tenant, S_MODEL_TAG_BYTES);
        at = S_MODEL_PREFIX_BYTES;
    }
    memcpy(out + at, id, n);
    return at + n;
}

/* Splits a stored key into its tenant (NULL: node-wide; else points into k) and its id. */
static int s_model_key_parse(const char *k, size_t klen, const uint8_t **tenant,
                             char id[KVEDGE_MODEL_ID_MAX_BYTES + 1])
{
    *tenant = NULL;
    if (klen > 0 && k[0] == '\0') {
        if (klen <= S_MODEL_PREFIX_BYTES)
            return KVEDGE_ECORRUPT;
        *tenant = (const uint8_t *)k + 1;
        k += S_MODEL_PREFIX_BYTES;
        klen -= S_MODEL_PREFIX_BYTES;
    }
    if (klen == 0 || klen > KVEDGE_MODEL_ID_MAX_BYTES || memchr(k, 0, klen) != NULL)
        return KVEDGE_ECORRUPT;
    memcpy(id, k, klen);
    id[klen] = '\0';
    return KVEDGE_OK;
}

/* A built-in id always has its built-in shape, even where an older node stored another one
 * for it (registrations used to be able to claim a built-in name). */
static void s_builtin_wins(kvedge_model_t *m)
{
    kvedge_model_t builtin;
    if (kvedge_model_builtin(m->id, &builtin) == KVEDGE_OK && !s_same_shape(m, &builtin))
        *m = builtin;
}

/* id's record in one namespace: 0, KVEDGE_ENOMODEL, KVEDGE_ECORRUPT or a store error. */
static int s_model_read(kvedge_engine_t *e, const uint8_t *tenant, const char *id,
                        kvedge_model_t *out)
{
    char key[S_MODEL_KEY_MAX];
    size_t klen = s_model_key(tenant, id, key);
    rocksdb_pinnableslice_t *p;
    int rc = s_pget(e, S_CF_MODELS, key, klen, &p);
    if (rc == KVEDGE_ENOTFOUND)
        return KVEDGE_ENOMODEL;
    if (rc != KVEDGE_OK)
        return rc;
    size_t len;
    const uint8_t *v = s_pval(p, &len);
    rc = kvedge_model_unpack(id, v, len, out);
    rocksdb_pinnableslice_destroy(p);
    if (rc == KVEDGE_OK)
        s_builtin_wins(out);
    return rc;
}

int kvedge_engine_get_model(kvedge_engine_t *e, const char *id, kvedge_model_t *out)
{
    if (!e || !s_id_ok(id) || !out)
        return KVEDGE_EINVAL;
    return s_model_read(e, NULL, id, out);
}

int kvedge_engine_get_tenant_model(kvedge_engine_t *e, const uint8_t *tenant, const char *id,
                                   kvedge_model_t *out)
{
    if (!e || !s_id_ok(id) || !out)
        return KVEDGE_EINVAL;
    kvedge_model_t builtin; /* never in a tenant's namespace: one lookup, on every put */
    if (s_tenant_named(tenant) && kvedge_model_builtin(id, &builtin) != KVEDGE_OK) {
        int rc = s_model_read(e, tenant, id, out);
        if (rc != KVEDGE_ENOMODEL)
            return rc;
    }
    return s_model_read(e, NULL, id, out);
}

/* The first registration an id's namespace sees stands: the same shape again answers 0, another
 * KVEDGE_ESHAPE. A tenant is bound by the node-wide records too (they are what every tenant
 * sees), and a built-in id is node-wide. */
int kvedge_engine_put_tenant_model(kvedge_engine_t *e, const uint8_t *tenant,
                                   const kvedge_model_t *model)
{
    if (!e || !model || memchr(model->id, 0, sizeof model->id) == NULL)
        return KVEDGE_EINVAL;
    int rc = kvedge_model_check(model);
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_model_t builtin;
    if (kvedge_model_builtin(model->id, &builtin) == KVEDGE_OK) {
        if (!s_same_shape(model, &builtin))
            return KVEDGE_ESHAPE; /* a built-in name is never another shape */
        tenant = NULL;
    }
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    pthread_mutex_lock(&e->models_mu);
    kvedge_model_t old;
    rc = kvedge_engine_get_tenant_model(e, tenant, model->id, &old);
    if (rc == KVEDGE_OK) {
        if (!s_same_shape(&old, model))
            rc = KVEDGE_ESHAPE; /* records are immutable: the first registration stands */
    } else if (rc == KVEDGE_ENOMODEL || rc == KVEDGE_ECORRUPT) {
        uint8_t rec[KVEDGE_MODEL_RECORD_BYTES];
        kvedge_model_pack(model, rec);
        char key[S_MODEL_KEY_MAX];
        size_t klen = s_model_key(tenant, model->id, key);
        char *err = NULL;
        rocksdb_put_cf(e->db, e->wo, e->cf[S_CF_MODELS], key, klen, (const char *)rec, sizeof rec,
                       &err);
        rc = err ? s_write_error(e, &err) : KVEDGE_OK;
    }
    pthread_mutex_unlock(&e->models_mu);
    return rc;
}

int kvedge_engine_put_model(kvedge_engine_t *e, const kvedge_model_t *model)
{
    return kvedge_engine_put_tenant_model(e, NULL, model);
}

int kvedge_engine_copy_model(kvedge_engine_t *dst, kvedge_engine_t *src, const uint8_t *tenant,
                             const char *id)
{
    if (!dst || !src)
        return KVEDGE_EINVAL;
    if (!s_id_ok(id))
        return 0; /* no record can have it */
    kvedge_model_t m, builtin;
    if (kvedge_engine_get_tenant_model(dst, tenant, id, &m) == KVEDGE_OK)
        return 0;
    int rc = KVEDGE_ENOMODEL;
    if (s_tenant_named(tenant) && kvedge_model_builtin(id, &builtin) != KVEDGE_OK)
        rc = s_model_read(src, tenant, id, &m);
    if (rc == KVEDGE_ENOMODEL) {
        tenant = NULL;
        rc = s_model_read(src, NULL, id, &m);
    }
    if (rc != KVEDGE_OK)
        return 0;
    rc = kvedge_engine_put_tenant_model(dst, tenant, &m);
    return rc == KVEDGE_OK ? 1 : rc;
}

int kvedge_engine_model_restore(kvedge_engine_t *e, const void *k, size_t klen, const void *v,
                                size_t vlen)
{
    const uint8_t *tenant;
    char id[KVEDGE_MODEL_ID_MAX_BYTES + 1];
    kvedge_model_t m;
    int rc = s_model_key_parse(k, klen, &tenant, id);
    if (rc == KVEDGE_OK)
        rc = kvedge_model_unpack(id, v, vlen, &m);
    return rc == KVEDGE_OK ? kvedge_engine_put_tenant_model(e, tenant, &m) : KVEDGE_ECORRUPT;
}

typedef struct {
    int (*cb)(void *ctx, const kvedge_model_t *model);
    void *ctx;
} s_list_wide_t;

static int s_list_wide(void *ctx, const uint8_t *tenant, const kvedge_model_t *model)
{
    s_list_wide_t *w = ctx;
    return tenant ? KVEDGE_OK : w->cb(w->ctx, model);
}

/* Walks the records from lower (NULL: all), each as kvedge_engine_get_tenant_model answers it. */
static int s_list(kvedge_engine_t *e, const char *lower, size_t llen,
                  int (*cb)(void *ctx, const uint8_t *tenant, const kvedge_model_t *model),
                  void *ctx)
{
    rocksdb_readoptions_t *ro;
    rocksdb_iterator_t *it = kvedge_engine_iter(e, S_CF_MODELS, lower, llen, NULL, 0, &ro);
    int rc = KVEDGE_OK;
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        const char *v = rocksdb_iter_value(it, &vlen);
        const uint8_t *tenant;
        char id[KVEDGE_MODEL_ID_MAX_BYTES + 1];
        kvedge_model_t m;
        rc = s_model_key_parse(k, klen, &tenant, id);
        if (rc == KVEDGE_OK)
            rc = kvedge_model_unpack(id, (const uint8_t *)v, vlen, &m);
        if (rc == KVEDGE_OK) {
            s_builtin_wins(&m);
            rc = cb(ctx, tenant, &m);
        }
        if (rc != KVEDGE_OK)
            break;
    }
    return kvedge_engine_iter_close(it, ro, rc);
}

int kvedge_engine_list_models(kvedge_engine_t *e, int (*cb)(void *ctx, const kvedge_model_t *model),
                              void *ctx)
{
    if (!e || !cb)
        return KVEDGE_EINVAL;
    s_list_wide_t w = {cb, ctx};
    return s_list(e, "\x01", 1, s_list_wide, &w); /* past every tenant's key */
}

int kvedge_engine_list_tenant_models(kvedge_engine_t *e,
                                     int (*cb)(void *ctx, const uint8_t *tenant,
                                               const kvedge_model_t *model),
                                     void *ctx)
{
    if (!e || !cb)
        return KVEDGE_EINVAL;
    return s_list(e, NULL, 0, cb, ctx);
}

int kvedge_engine_debug_put_model_record(kvedge_engine_t *e, const void *key, size_t klen,
                                         const uint8_t *rec, size_t len)
{
    if (!e || !key || klen == 0 || !rec)
        return KVEDGE_EINVAL;
    if (e->opts.read_only)
        return KVEDGE_EREADONLY;
    char *err = NULL;
    rocksdb_put_cf(e->db, e->wo, e->cf[S_CF_MODELS], key, klen, (const char *)rec, len, &err);
    return err ? s_write_error(e, &err) : KVEDGE_OK;
}

/* ---------------------------------------------------------------- stats */

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
