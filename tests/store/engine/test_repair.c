/* Block engine: the full check that put, get, get_layer and verify share (an lz4 body that does
 * not decode under a valid checksum), and kvedge_engine_repair of a store with a damaged table
 * file, a lost or damaged CURRENT, a lost MANIFEST, flips in every table file or in a blob file,
 * a truncated WAL, or nothing wrong; a second repair of each is a no-op. */
#define _GNU_SOURCE /* nftw */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <rocksdb/c.h>
#include <xxhash.h>

#include "access/codec/byteorder.h"
#include "store/engine/engine.h"
#include "store/engine/engine_debug.h"
#include "access/codec/error.h"
#include "tests/common/testutil.h"

#define MODEL         "test-model"
#define LAYERS        8
#define HEADS         8
#define HEAD_DIM      64
#define TOKENS        32 /* a lossless block of 8 KiB: past the blob threshold */
#define N_CHUNKS      3
#define TOKENS_INLINE 8 /* 2 KiB: kept in the table files */

typedef struct {
    char dir[64];
    char path[96];
    kvedge_engine_t *e;
} fx_t;

static int s_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int setup(void **state)
{
    fx_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    strcpy(fx->dir, "/tmp/kvedge-test-repair-XXXXXX");
    if (!mkdtemp(fx->dir)) {
        free(fx);
        return -1;
    }
    snprintf(fx->path, sizeof fx->path, "%s/store", fx->dir);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fx_t *fx = *state;
    kvedge_engine_destroy(&fx->e);
    nftw(fx->dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
    free(fx);
    return 0;
}

static void s_open(fx_t *fx)
{
    char why[512];
    int rc = kvedge_engine_open(fx->path, NULL, &fx->e, why, sizeof why);
    if (rc != 0)
        fail_msg("open: %s: %s", kvedge_errname(rc), why);
    kvedge_model_t m = {MODEL, LAYERS, HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_engine_put_model(fx->e, &m), 0);
}

static kvedge_chunk_info_t s_chunk(uint8_t tag, uint32_t tokens)
{
    kvedge_chunk_info_t c;
    memset(&c, 0, sizeof c);
    for (size_t i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++)
        c.id.bytes[i] = (uint8_t)(tag + 31 * i);
    strcpy(c.model_id, MODEL);
    c.tokens = tokens;
    return c;
}

static kvedge_block_key_t s_key(const kvedge_chunk_info_t *c, uint16_t layer, uint16_t head)
{
    kvedge_block_key_t k = {.chunk = c->id, .layer = layer, .head = head};
    return k;
}

/* An lz4 block (K and V compress well) whose compressed body is overwritten with 0xff and whose
 * checksum is computed again: it parses, and its body does not decompress. */
static uint8_t *s_bad_lz4_block(size_t *len)
{
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, TOKENS, HEAD_DIM, 0, NULL, true};
    size_t n = (size_t)TOKENS * HEAD_DIM;
    uint16_t *k = calloc(n, 2), *v = calloc(n, 2);
    assert_non_null(k);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        k[i] = v[i] = (uint16_t)(0x3c00 + (i % 4)); /* 1.0, 1.0009...: compressible */
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *b = aligned_alloc(64, (cap + 63) / 64 * 64);
    assert_non_null(b);
    assert_int_equal(kvedge_block_encode(&spec, k, v, b, cap, len), 0);
    free(k);
    free(v);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(b, *len, &info), 0);
    assert_true(info.lz4);
    uint32_t stored = kvedge_le_get32(b + 24);
    memset(b + KVEDGE_BLOCK_HEADER_BYTES, 0xff, stored);
    size_t covered = KVEDGE_BLOCK_HEADER_BYTES + stored;
    kvedge_le_put64(b + covered, XXH3_64bits(b, covered));
    return b;
}

static int s_verify_cb(void *ctx, const kvedge_block_key_t *key, int err)
{
    kvedge_block_key_t *seen = ctx;
    *seen = *key;
    assert_int_equal(err, KVEDGE_ECORRUPT);
    return 0;
}

typedef struct {
    int calls;
    int status;
} layer_t;

static int s_layer_cb(void *ctx, uint16_t head, int status, const uint8_t *data, size_t len)
{
    (void)head;
    (void)data;
    (void)len;
    layer_t *l = ctx;
    l->calls++;
    l->status = status;
    return 0;
}

/* ---------------------------------------------------------------- the full check */

static void test_bad_lz4_body(void **state)
{
    fx_t *fx = *state;
    size_t len;
    uint8_t *bad = s_bad_lz4_block(&len);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(bad, len, &info), 0); /* the checksum holds */
    assert_int_equal(kvedge_block_check(bad, len, &info), KVEDGE_ECORRUPT);
    assert_int_equal(kvedge_block_check(NULL, 0, NULL), KVEDGE_EINVAL);

    /* A put refuses it: it can never be stored. */
    s_open(fx);
    kvedge_chunk_info_t c = s_chunk(1, TOKENS);
    kvedge_block_key_t k = s_key(&c, 0, 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, bad, len, NULL), KVEDGE_ECORRUPT);
    kvedge_block_meta_t m;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), KVEDGE_ENOTFOUND);

    /* Stored behind the put's back, with metadata that describes it: verify reports it and a
     * read refuses it, as a layer scan does. */
    assert_int_equal(kvedge_engine_debug_put_unchecked(fx->e, &c, 0, 0, bad, len), 0);
    uint64_t checked, nbad;
    kvedge_block_key_t seen;
    memset(&seen, 0xee, sizeof seen);
    assert_int_equal(kvedge_engine_verify(fx->e, false, s_verify_cb, &seen, &checked, &nbad), 0);
    assert_int_equal(checked, 1);
    assert_int_equal(nbad, 1);
    assert_memory_equal(&seen, &k, sizeof k);
    layer_t l = {0, 0};
    assert_int_equal(kvedge_engine_get_layer(fx->e, &c.id, 0, s_layer_cb, &l), 0);
    assert_int_equal(l.calls, 1);
    assert_int_equal(l.status, KVEDGE_ECORRUPT); /* quarantined by the scan */
    assert_int_equal(kvedge_engine_debug_put_unchecked(fx->e, &c, 0, 0, bad, len), 0);
    kvedge_value_t v;
    assert_int_equal(kvedge_engine_get(fx->e, &k, &v), KVEDGE_ECORRUPT);
    assert_int_equal(kvedge_engine_get(fx->e, &k, &v), KVEDGE_ENOTFOUND); /* quarantined */
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &nbad), 0);
    assert_int_equal(nbad, 0);

    /* The same block with its body intact is stored and served. */
    size_t glen;
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, TOKENS, HEAD_DIM, 0, NULL, true};
    uint8_t *good = kt_encode(&spec, 7, &glen);
    assert_non_null(good);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, good, glen, NULL), 0);
    kvedge_block_key_t k1 = s_key(&c, 0, 1);
    assert_int_equal(kvedge_engine_get(fx->e, &k1, &v), 0);
    assert_int_equal(v.len, glen);
    kvedge_value_release(&v);
    free(good);
    free(bad);
}

/* ---------------------------------------------------------------- repair */

typedef struct {
    uint8_t *blk[N_CHUNKS][LAYERS][HEADS];
    size_t len[N_CHUNKS][LAYERS][HEADS];
    kvedge_chunk_info_t c[N_CHUNKS];
} put_t;

/* Encodes N_CHUNKS x LAYERS x HEADS lossless blocks of tokens tokens into p. */
static void s_encode_all(put_t *p, uint32_t tokens)
{
    for (int i = 0; i < N_CHUNKS; i++) {
        p->c[i] = s_chunk((uint8_t)(10 * i + 3), tokens);
        for (int l = 0; l < LAYERS; l++)
            for (int h = 0; h < HEADS; h++) {
                kvedge_block_spec_t spec = {
                    KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, tokens, HEAD_DIM, 0, NULL, false};
                p->blk[i][l][h] =
                    kt_encode(&spec, (uint64_t)(i * 1000 + l * 10 + h), &p->len[i][l][h]);
                assert_non_null(p->blk[i][l][h]);
            }
    }
}

/* Puts every block of p into e; 0 or the first error. */
static int s_put_blocks(kvedge_engine_t *e, const put_t *p)
{
    for (int i = 0; i < N_CHUNKS; i++)
        for (int l = 0; l < LAYERS; l++)
            for (int h = 0; h < HEADS; h++) {
                int rc = kvedge_engine_put(e, &p->c[i], (uint16_t)l, (uint16_t)h, p->blk[i][l][h],
                                           p->len[i][l][h], NULL);
                if (rc != 0)
                    return rc;
            }
    return 0;
}

/* Puts N_CHUNKS x LAYERS x HEADS lossless blocks of tokens tokens, and closes the store. */
static void s_put_all(fx_t *fx, put_t *p, uint32_t tokens)
{
    s_open(fx);
    s_encode_all(p, tokens);
    assert_int_equal(s_put_blocks(fx->e, p), 0);
    kvedge_engine_destroy(&fx->e);
}

/* A store of every block, closed; the caller frees it with s_stored_free. */
static put_t *s_stored(fx_t *fx, uint32_t tokens)
{
    put_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    s_put_all(fx, p, tokens);
    return p;
}

static void s_unlink_in(fx_t *fx, const char *name)
{
    char path[256];
    assert_true(snprintf(path, sizeof path, "%s/%s", fx->path, name) < (int)sizeof path);
    assert_int_equal(unlink(path), 0);
}

static void s_stored_free(put_t *p)
{
    for (int i = 0; i < N_CHUNKS; i++)
        for (int l = 0; l < LAYERS; l++)
            for (int h = 0; h < HEADS; h++)
                free(p->blk[i][l][h]);
    free(p);
}

/* Flips the byte in the middle of the largest table file of the store. */
static void s_damage_largest_sst(const char *path)
{
    DIR *d = opendir(path);
    assert_non_null(d);
    char best[512] = "";
    off_t best_size = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 4, ".sst") != 0)
            continue;
        char f[512];
        snprintf(f, sizeof f, "%s/%s", path, de->d_name);
        struct stat st;
        assert_int_equal(stat(f, &st), 0);
        if (st.st_size > best_size) {
            best_size = st.st_size;
            strcpy(best, f);
        }
    }
    closedir(d);
    assert_true(best_size > 0);
    int fd = open(best, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, best_size / 2), 1);
    b ^= 0xff;
    assert_int_equal(pwrite(fd, &b, 1, best_size / 2), 1);
    close(fd);
}

typedef struct {
    int lost;
} lost_t;

static int s_lost_cb(void *ctx, const kvedge_block_key_t *key, int err)
{
    (void)key;
    assert_true(err < 0);
    ((lost_t *)ctx)->lost++;
    return 0;
}

/* Repairs the fixture's store, which must succeed; lost blocks are counted in lost. */
static void s_repair_ok(fx_t *fx, lost_t *lost, kvedge_repair_report_t *rep)
{
    char why[1024] = "";
    int rc = kvedge_engine_repair(fx->path, s_lost_cb, lost, rep, why, sizeof why);
    if (rc != 0)
        fail_msg("repair: %s: %s", kvedge_errname(rc), why);
}

/* Every block that reads back is what was put; returns how many did. */
static uint64_t s_count_served(fx_t *fx, const put_t *p)
{
    uint64_t served = 0;
    for (int i = 0; i < N_CHUNKS; i++)
        for (int l = 0; l < LAYERS; l++)
            for (int h = 0; h < HEADS; h++) {
                kvedge_block_key_t k = s_key(&p->c[i], (uint16_t)l, (uint16_t)h);
                kvedge_value_t v;
                int rc = kvedge_engine_get(fx->e, &k, &v);
                if (rc == KVEDGE_ENOTFOUND)
                    continue;
                assert_int_equal(rc, 0);
                assert_int_equal(v.len, p->len[i][l][h]);
                assert_memory_equal(v.data, p->blk[i][l][h], v.len);
                kvedge_value_release(&v);
                served++;
            }
    return served;
}

static void test_repair_damaged_sst(void **state)
{
    fx_t *fx = *state;
    put_t *p = s_stored(fx, TOKENS);
    const uint64_t put = (uint64_t)N_CHUNKS * LAYERS * HEADS;
    /* Files that are not RocksDB's stay where they are. */
    char cert[160];
    snprintf(cert, sizeof cert, "%s/node.cert", fx->path);
    FILE *f = fopen(cert, "w");
    assert_non_null(f);
    fputs("cert\n", f);
    fclose(f);

    s_damage_largest_sst(fx->path);
    char why[1024] = "";
    assert_int_equal(kvedge_engine_open(fx->path, NULL, &fx->e, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "run kvedge repair --data "));
    assert_non_null(strstr(why, fx->path));

    lost_t lost = {0};
    kvedge_repair_report_t rep;
    int rc = kvedge_engine_repair(fx->path, s_lost_cb, &lost, &rep, why, sizeof why);
    if (rc != 0)
        fail_msg("repair: %s: %s", kvedge_errname(rc), why);
    assert_int_equal(rep.blocks_kept + rep.blocks_lost, put);
    assert_true(rep.blocks_kept > 0);
    assert_int_equal((uint64_t)lost.lost, rep.blocks_lost);
    /* The open failed scanning the meta records: repair met the damage too. */
    assert_true(rep.blocks_lost + rep.meta_rebuilt > 0);
    assert_false(rep.rocksdb_repaired);
    assert_true(rep.old_files[0] != '\0');
    struct stat st;
    assert_int_equal(stat(rep.old_files, &st), 0);
    assert_int_equal(stat(cert, &st), 0);

    /* The store opens; every kept block is served, byte for byte; the lost ones are in
     * quarantine; verify agrees. */
    s_open(fx);
    assert_int_equal(s_count_served(fx, p), rep.blocks_kept);
    kvedge_engine_stats_t s;
    assert_int_equal(kvedge_engine_stats(fx->e, &s), 0);
    assert_int_equal(s.blocks, rep.blocks_kept);
    assert_int_equal(s.quarantined, rep.blocks_lost);
    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, rep.blocks_kept);
    assert_int_equal(bad, 0);
    kvedge_chunk_info_t ci;
    if (rep.chunks_lost == 0)
        for (int i = 0; i < N_CHUNKS; i++)
            assert_int_equal(kvedge_engine_get_chunk(fx->e, &p->c[i].id, &ci), 0);
    /* It takes writes again. */
    assert_int_equal(
        kvedge_engine_put(fx->e, &p->c[0], 0, 0, p->blk[0][0][0], p->len[0][0][0], NULL), 0);
    kvedge_engine_destroy(&fx->e);
    s_stored_free(p);
}

/* Small blocks live in the table files themselves: a damaged data block of the blocks family
 * leaves the store opening, a read of its blocks failing and verify stopping there; repair
 * loses those blocks only. */
static void test_repair_damaged_inline_blocks(void **state)
{
    fx_t *fx = *state;
    put_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    s_put_all(fx, p, TOKENS_INLINE);
    const uint64_t put = (uint64_t)N_CHUNKS * LAYERS * HEADS;
    s_damage_largest_sst(fx->path);
    lost_t lost = {0};
    kvedge_repair_report_t rep;
    s_repair_ok(fx, &lost, &rep);
    assert_int_equal(rep.blocks_kept + rep.blocks_lost, put);
    assert_true(rep.blocks_kept > 0);
    assert_int_equal((uint64_t)lost.lost, rep.blocks_lost);
    s_open(fx);
    assert_int_equal(s_count_served(fx, p), rep.blocks_kept);
    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, rep.blocks_kept);
    assert_int_equal(bad, 0);
    kvedge_engine_destroy(&fx->e);
    s_stored_free(p);
}

/* CURRENT names a MANIFEST that is gone: RocksDB's repair rebuilds one from the tables, and
 * the blocks, whose blob files it drops, are read from those files directly. */
static void test_repair_lost_manifest(void **state)
{
    fx_t *fx = *state;
    put_t *p = s_stored(fx, TOKENS);
    const uint64_t put = (uint64_t)N_CHUNKS * LAYERS * HEADS;
    char cur[160];
    snprintf(cur, sizeof cur, "%s/CURRENT", fx->path);
    FILE *f = fopen(cur, "w");
    assert_non_null(f);
    fputs("MANIFEST-999999\n", f);
    fclose(f);
    char why[1024] = "";
    assert_int_equal(kvedge_engine_open(fx->path, NULL, &fx->e, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "run kvedge repair --data "));

    kvedge_repair_report_t rep;
    int rc = kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why);
    if (rc != 0)
        fail_msg("repair: %s: %s", kvedge_errname(rc), why);
    assert_true(rep.rocksdb_repaired);
    assert_int_equal(rep.blocks_kept, put);
    assert_int_equal(rep.blocks_lost, 0);
    assert_int_equal(rep.from_blob_files, put);
    assert_int_equal(rep.chunks_kept, N_CHUNKS);
    s_open(fx);
    assert_int_equal(s_count_served(fx, p), put);
    kvedge_engine_destroy(&fx->e);
    s_stored_free(p);
}

/* ---------------------------------------------------------------- what must never be lost */

/* A listing of a directory's regular files, "name size\n" sorted, into out. */
static void s_listing(const char *dir, char *out, size_t cap)
{
    char names[256][300];
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < 256) {
        char f[512];
        struct stat st;
        snprintf(f, sizeof f, "%s/%s", dir, de->d_name);
        if (stat(f, &st) != 0 || !S_ISREG(st.st_mode) || strcmp(de->d_name, "LOG") == 0)
            continue;
        assert_true(snprintf(names[n++], sizeof names[0], "%s %lld", de->d_name,
                             (long long)st.st_size) < (int)sizeof names[0]);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        strncat(out, names[i], cap - strlen(out) - 2);
        strcat(out, "\n");
    }
}

/* Flips one byte of a file at off. */
static void s_flip(const char *file, off_t off)
{
    int fd = open(file, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

/* Calls fn on every file of dir whose name ends with suffix; returns how many. */
static int s_each(const char *dir, const char *suffix, void (*fn)(const char *file, off_t size))
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name), sl = strlen(suffix);
        if (len < sl || strcmp(de->d_name + len - sl, suffix) != 0)
            continue;
        char f[512];
        struct stat st;
        snprintf(f, sizeof f, "%s/%s", dir, de->d_name);
        assert_int_equal(stat(f, &st), 0);
        if (fn)
            fn(f, st.st_size);
        n++;
    }
    closedir(d);
    return n;
}

/* Five flips spread over the file, clear of its last 64 bytes (the footer). */
static void s_flip5(const char *file, off_t size)
{
    for (int i = 1; i <= 5; i++)
        s_flip(file, (size - 64) * i / 6);
}

static void s_flip_middle(const char *file, off_t size)
{
    s_flip(file, size / 2);
}

/* A repair of a repaired store changes nothing: every block is found and kept again, none
 * lost, and the directory's files are as they were. */
static void s_second_repair_noop(fx_t *fx, uint64_t kept)
{
    static char before[1 << 16], after[1 << 16];
    char why[1024];
    s_listing(fx->path, before, sizeof before);
    kvedge_repair_report_t rep;
    int rc = kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why);
    if (rc != 0)
        fail_msg("second repair: %s: %s", kvedge_errname(rc), why);
    if (!rep.unchanged)
        fail_msg("second repair changed the store: damaged %d rocksdb %d found %llu kept %llu "
                 "lost %llu meta %llu blobs %llu chunks lost %llu rebuilt %llu models lost %llu "
                 "variants dropped %llu",
                 rep.damaged, rep.rocksdb_repaired, (unsigned long long)rep.blocks_found,
                 (unsigned long long)rep.blocks_kept, (unsigned long long)rep.blocks_lost,
                 (unsigned long long)rep.meta_rebuilt, (unsigned long long)rep.from_blob_files,
                 (unsigned long long)rep.chunks_lost, (unsigned long long)rep.chunks_rebuilt,
                 (unsigned long long)rep.models_lost, (unsigned long long)rep.variants_dropped);
    assert_false(rep.damaged);
    assert_int_equal(rep.blocks_found, kept);
    assert_int_equal(rep.blocks_kept, kept);
    assert_int_equal(rep.blocks_lost, 0);
    assert_int_equal(rep.chunks_lost, 0);
    assert_int_equal(rep.models_lost, 0);
    assert_string_equal(rep.old_files, "");
    s_listing(fx->path, after, sizeof after);
    assert_string_equal(before, after);
}

/* Opens the repaired store, checks every block put is served byte for byte, closes it, and
 * checks a second repair changes nothing. */
static void s_served_then_noop(fx_t *fx, const put_t *p, uint64_t served)
{
    s_open(fx);
    assert_int_equal(s_count_served(fx, p), served);
    kvedge_engine_destroy(&fx->e);
    s_second_repair_noop(fx, served);
}

/* A store whose CURRENT is gone: opening it changes nothing on disk (RocksDB, asked to create a
 * store there, would have written a new CURRENT over an empty MANIFEST and then deleted every
 * table and blob file); repair finds every block in the files and keeps them all. */
static void test_repair_lost_current(void **state)
{
    fx_t *fx = *state;
    put_t *p = s_stored(fx, TOKENS);
    const uint64_t put = (uint64_t)N_CHUNKS * LAYERS * HEADS;
    static char before[1 << 16], after[1 << 16];
    s_unlink_in(fx, "CURRENT");
    s_listing(fx->path, before, sizeof before);
    char why[1024] = "";
    for (int i = 0; i < 2; i++) { /* a node restarted by its supervisor, twice */
        assert_int_equal(kvedge_engine_open(fx->path, NULL, &fx->e, why, sizeof why),
                         KVEDGE_ECORRUPT);
        assert_non_null(strstr(why, "CURRENT"));
        assert_non_null(strstr(why, "run kvedge repair --data "));
    }
    s_listing(fx->path, after, sizeof after);
    assert_string_equal(before, after);

    lost_t lost = {0};
    kvedge_repair_report_t rep;
    int rc = kvedge_engine_repair(fx->path, s_lost_cb, &lost, &rep, why, sizeof why);
    if (rc != 0)
        fail_msg("repair: %s: %s", kvedge_errname(rc), why);
    assert_true(rep.damaged);
    assert_false(rep.unchanged);
    assert_true(rep.blob_files > 0);
    assert_int_equal(rep.blocks_found, put);
    assert_int_equal(rep.blocks_kept, put);
    assert_int_equal(rep.blocks_lost, 0);
    assert_int_equal(lost.lost, 0);
    assert_int_equal(rep.chunks_kept + rep.chunks_rebuilt, N_CHUNKS);
    assert_int_equal(rep.chunks_lost, 0);
    s_open(fx);
    assert_int_equal(s_count_served(fx, p), put);
    /* Every layer is served again: its chunk names its model (what a node's GET_LAYER needs). */
    for (int i = 0; i < N_CHUNKS; i++) {
        layer_t l = {0, 0};
        assert_int_equal(kvedge_engine_get_layer(fx->e, &p->c[i].id, LAYERS - 1, s_layer_cb, &l),
                         HEADS);
        assert_int_equal(l.status, 0);
        kvedge_chunk_info_t ci;
        assert_int_equal(kvedge_engine_get_chunk(fx->e, &p->c[i].id, &ci), 0);
        assert_string_equal(ci.model_id, MODEL);
        assert_int_equal(ci.tokens, TOKENS);
    }
    kvedge_engine_destroy(&fx->e);
    s_second_repair_noop(fx, put);
    s_stored_free(p);
}

/* The MANIFEST file itself is gone (CURRENT names it). */
static void test_repair_manifest_file_gone(void **state)
{
    fx_t *fx = *state;
    put_t *p = s_stored(fx, TOKENS);
    const uint64_t put = (uint64_t)N_CHUNKS * LAYERS * HEADS;
    assert_int_equal(s_each(fx->path, "", NULL) > 0, 1);
    char m[512];
    DIR *d = opendir(fx->path);
    struct dirent *de;
    int removed = 0;
    while ((de = readdir(d)) != NULL)
        if (strncmp(de->d_name, "MANIFEST-", 9) == 0) {
            assert_true(snprintf(m, sizeof m, "%s/%s", fx->path, de->d_name) < (int)sizeof m);
            assert_int_equal(unlink(m), 0);
            removed++;
        }
    closedir(d);
    assert_true(removed > 0);
    char why[1024] = "";
    assert_int_equal(kvedge_engine_open(fx->path, NULL, &fx->e, why, sizeof why), KVEDGE_ECORRUPT);
    kvedge_repair_report_t rep;
    int rc = kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why);
    if (rc != 0)
        fail_msg("repair: %s: %s", kvedge_errname(rc), why);
    assert_true(rep.rocksdb_repaired);
    assert_int_equal(rep.blocks_found, put);
    assert_int_equal(rep.blocks_kept, put);
    assert_int_equal(rep.blocks_lost, 0);
    s_served_then_noop(fx, p, put);
    s_stored_free(p);
}

/* Five flipped bytes in every table file: the blob files still hold every block, and repair
 * keeps every one of them; whatever it reports lost it says so. */
static void test_repair_flips_in_every_sst(void **state)
{
    fx_t *fx = *state;
    put_t *p = s_stored(fx, TOKENS);
    const uint64_t put = (uint64_t)N_CHUNKS * LAYERS * HEADS;
    assert_true(s_each(fx->path, ".sst", s_flip5) > 0);
    lost_t lost = {0};
    kvedge_repair_report_t rep;
    s_repair_ok(fx, &lost, &rep);
    assert_true(rep.damaged);
    assert_int_equal(rep.blocks_found, put);
    assert_int_equal(rep.blocks_kept + rep.blocks_lost, rep.blocks_found);
    assert_int_equal(rep.blocks_kept, put); /* the blob files are intact */
    assert_int_equal((uint64_t)lost.lost, rep.blocks_lost);
    assert_int_equal(rep.chunks_kept + rep.chunks_rebuilt + rep.chunks_lost, N_CHUNKS);
    s_open(fx);
    assert_int_equal(s_count_served(fx, p), rep.blocks_kept);
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_engine_stats(fx->e, &st), 0);
    assert_int_equal(st.blocks, rep.blocks_kept);
    /* A chunk whose record was lost or rebuilt is counted as such. */
    uint64_t recorded = 0;
    for (int i = 0; i < N_CHUNKS; i++) {
        kvedge_chunk_info_t ci;
        recorded += kvedge_engine_get_chunk(fx->e, &p->c[i].id, &ci) == 0;
    }
    assert_int_equal(recorded, rep.chunks_kept + rep.chunks_rebuilt);
    kvedge_engine_destroy(&fx->e);
    s_second_repair_noop(fx, rep.blocks_kept);
    s_stored_free(p);
}

/* A flipped byte in the middle of every blob file: the blocks it hits are lost (reported, in
 * quarantine), every other is kept and served byte for byte. */
static void test_repair_flip_in_blob(void **state)
{
    fx_t *fx = *state;
    put_t *p = s_stored(fx, TOKENS);
    const uint64_t put = (uint64_t)N_CHUNKS * LAYERS * HEADS;
    int blobs = s_each(fx->path, ".blob", s_flip_middle);
    assert_true(blobs > 0);
    lost_t lost = {0};
    kvedge_repair_report_t rep;
    s_repair_ok(fx, &lost, &rep);
    assert_false(rep.unchanged);
    assert_int_equal(rep.blocks_found, put);
    assert_int_equal(rep.blocks_kept + rep.blocks_lost, put);
    assert_true(rep.blocks_lost >= 1 && rep.blocks_lost <= (uint64_t)blobs);
    assert_int_equal((uint64_t)lost.lost, rep.blocks_lost);
    s_open(fx);
    assert_int_equal(s_count_served(fx, p), rep.blocks_kept);
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_engine_stats(fx->e, &st), 0);
    assert_int_equal(st.quarantined, rep.blocks_lost);
    kvedge_engine_destroy(&fx->e);
    s_second_repair_noop(fx, rep.blocks_kept);
    s_stored_free(p);
}

/* Puts every block with synced writes in a child that then dies without closing the store:
 * they are in the WAL only. */
static void s_put_all_unflushed(fx_t *fx, put_t *p)
{
    s_encode_all(p, TOKENS);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvedge_engine_opts_t o;
        kvedge_engine_opts_default(&o);
        o.sync = true;
        kvedge_engine_t *e = NULL;
        char why[256];
        if (kvedge_engine_open(fx->path, &o, &e, why, sizeof why) != 0)
            _exit(2);
        kvedge_model_t m = {MODEL, LAYERS, HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16};
        if (kvedge_engine_put_model(e, &m) != 0)
            _exit(3);
        _exit(s_put_blocks(e, p) != 0 ? 4 : 0); /* no close: nothing flushed */
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void s_truncate_third(const char *file, off_t size)
{
    assert_int_equal(truncate(file, size - size / 3), 0);
}

/* The WAL cut short (a crash of the disk under it): RocksDB replays it up to the cut; every
 * block it replays is sound, kept and served, and none of it is reported lost. */
static void test_repair_truncated_wal(void **state)
{
    fx_t *fx = *state;
    put_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    s_put_all_unflushed(fx, p);
    const uint64_t put = (uint64_t)N_CHUNKS * LAYERS * HEADS;
    assert_int_equal(s_each(fx->path, ".blob", NULL), 0); /* nothing flushed */
    assert_true(s_each(fx->path, ".log", s_truncate_third) > 0);
    lost_t lost = {0};
    kvedge_repair_report_t rep;
    s_repair_ok(fx, &lost, &rep);
    assert_true(rep.wal_files > 0);
    assert_true(rep.blocks_found > 0 && rep.blocks_found < put); /* the cut lost the rest */
    assert_int_equal(rep.blocks_kept, rep.blocks_found);
    assert_int_equal(rep.blocks_lost, 0);
    s_served_then_noop(fx, p, rep.blocks_kept);
    s_stored_free(p);
}

/* A new store that does not read back whole is never put in place: the damaged store stays. */
static void test_repair_refuses_short_store(void **state)
{
    fx_t *fx = *state;
    put_t *p = s_stored(fx, TOKENS);
    static char before[1 << 16], after[1 << 16];
    s_unlink_in(fx, "CURRENT");
    s_listing(fx->path, before, sizeof before);
    kvedge_engine_debug_repair_fault(KVEDGE_REPAIR_FAULT_SHORT_STORE);
    kvedge_repair_report_t rep;
    char why[1024] = "";
    assert_int_equal(kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why),
                     KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "not put in place"));
    assert_true(rep.unchanged);
    s_listing(fx->path, after, sizeof after);
    assert_string_equal(before, after);
    struct stat st;
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s/repair.tmp", fx->path);
    assert_int_not_equal(stat(tmp, &st), 0);
    /* Without the fault the same store is repaired whole. */
    assert_int_equal(kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why), 0);
    assert_int_equal(rep.blocks_kept, (uint64_t)N_CHUNKS * LAYERS * HEADS);
    s_stored_free(p);
}

/* A repair stopped after moving the old files: the node refuses the directory, the next repair
 * finishes putting the verified store in place. */
static void test_repair_resumes_swap(void **state)
{
    fx_t *fx = *state;
    put_t *p = s_stored(fx, TOKENS);
    const uint64_t put = (uint64_t)N_CHUNKS * LAYERS * HEADS;
    s_unlink_in(fx, "CURRENT");
    kvedge_engine_debug_repair_fault(KVEDGE_REPAIR_FAULT_STOP_SWAP);
    kvedge_repair_report_t rep;
    char why[1024] = "";
    assert_int_equal(kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why), KVEDGE_EIO);
    assert_int_equal(kvedge_engine_open(fx->path, NULL, &fx->e, why, sizeof why), KVEDGE_ELOCKED);
    assert_non_null(strstr(why, "being repaired"));
    int rc = kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why);
    if (rc != 0)
        fail_msg("resumed repair: %s: %s", kvedge_errname(rc), why);
    assert_true(rep.resumed);
    assert_int_equal(rep.blocks_kept, put);
    s_served_then_noop(fx, p, put);
    s_stored_free(p);
}

static void test_repair_sound_store(void **state)
{
    fx_t *fx = *state;
    put_t *p = s_stored(fx, TOKENS);
    kvedge_repair_report_t rep;
    char why[512];
    assert_int_equal(kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why), 0);
    assert_int_equal(rep.blocks_kept, (uint64_t)N_CHUNKS * LAYERS * HEADS);
    assert_int_equal(rep.blocks_lost, 0);
    assert_int_equal(rep.meta_rebuilt, 0);
    assert_int_equal(rep.chunks_kept, N_CHUNKS);
    assert_int_equal(rep.chunks_lost, 0);
    assert_int_equal(rep.models_kept, 1);
    s_open(fx);
    assert_int_equal(s_count_served(fx, p), rep.blocks_kept);
    kvedge_engine_destroy(&fx->e);
    s_stored_free(p);
}

/* Model records of tenant namespaces are carried over as they were, beside the node-wide ones,
 * and a tenant's blocks are served in its shape after the repair. */
static void test_repair_keeps_tenant_models(void **state)
{
    fx_t *fx = *state;
    s_open(fx);
    const uint8_t a[16] = {0xa}, b[16] = {0xb};
    kvedge_model_t sa = {"x", LAYERS, HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16}, sb = sa, got;
    sb.layers = 1;
    sb.kv_heads = 1;
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, a, &sa), 0);
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, b, &sb), 0);
    kvedge_chunk_info_t c = s_chunk(77, TOKENS);
    strcpy(c.model_id, "x");
    memcpy(c.tenant, a, 16);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, TOKENS, HEAD_DIM, 0, NULL, false};
    size_t len;
    uint8_t *blk = kt_encode(&spec, 77, &len);
    assert_non_null(blk);
    assert_int_equal(kvedge_engine_put(fx->e, &c, LAYERS - 1, HEADS - 1, blk, len, NULL), 0);
    kvedge_engine_destroy(&fx->e);

    kvedge_repair_report_t rep;
    char why[512];
    assert_int_equal(kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why), 0);
    assert_int_equal(rep.blocks_kept, 1);
    assert_int_equal(rep.models_kept, 3); /* MODEL node-wide, x of a, x of b */
    s_open(fx);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, a, "x", &got), 0);
    assert_int_equal(got.layers, LAYERS);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, b, "x", &got), 0);
    assert_int_equal(got.layers, 1);
    assert_int_equal(kvedge_engine_get_model(fx->e, "x", &got), KVEDGE_ENOMODEL);
    kvedge_block_key_t k = s_key(&c, LAYERS - 1, HEADS - 1);
    kvedge_value_t v;
    assert_int_equal(kvedge_engine_get(fx->e, &k, &v), 0);
    assert_int_equal(v.len, len);
    assert_memory_equal(v.data, blk, len);
    kvedge_value_release(&v);
    kvedge_engine_destroy(&fx->e);
    free(blk);
}

/* A model copied for a chunk keeps its namespace: a tenant's own record stays the tenant's, a
 * node-wide one stays node-wide (what repair does for a chunk whose model the walk over the
 * models family did not reach). */
static void test_copy_model_keeps_namespace(void **state)
{
    fx_t *fx = *state;
    s_open(fx);
    char path[300];
    snprintf(path, sizeof path, "%s/dst", fx->dir);
    kvedge_engine_t *dst = NULL;
    char why[256];
    assert_int_equal(kvedge_engine_open(path, NULL, &dst, why, sizeof why), 0);
    const uint8_t a[16] = {0xa};
    kvedge_model_t own = {"x", 2, 2, HEAD_DIM, KVEDGE_DTYPE_FP16}, got;
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, a, &own), 0);
    /* MODEL is node-wide in fx->e (s_open). */
    assert_int_equal(kvedge_engine_copy_model(dst, fx->e, a, MODEL), 1);
    assert_int_equal(kvedge_engine_get_model(dst, MODEL, &got), 0);
    assert_int_equal(got.layers, LAYERS);
    assert_int_equal(kvedge_engine_copy_model(dst, fx->e, a, "x"), 1);
    assert_int_equal(kvedge_engine_get_tenant_model(dst, a, "x", &got), 0);
    assert_int_equal(got.layers, 2);
    assert_int_equal(kvedge_engine_get_model(dst, "x", &got), KVEDGE_ENOMODEL);
    /* Nothing to do: already there, unknown, or not a model id. */
    assert_int_equal(kvedge_engine_copy_model(dst, fx->e, a, "x"), 0);
    assert_int_equal(kvedge_engine_copy_model(dst, fx->e, NULL, "x"), 0);
    assert_int_equal(kvedge_engine_copy_model(dst, fx->e, a, "none"), 0);
    assert_int_equal(kvedge_engine_copy_model(dst, fx->e, a, ""), 0);
    assert_int_equal(kvedge_engine_copy_model(NULL, fx->e, a, "x"), KVEDGE_EINVAL);
    kvedge_engine_destroy(&dst);
    kvedge_engine_destroy(&fx->e);
}

static void test_repair_errors(void **state)
{
    fx_t *fx = *state;
    char why[512];
    kvedge_repair_report_t rep;
    assert_int_equal(kvedge_engine_repair(NULL, NULL, NULL, &rep, why, sizeof why), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why),
                     KVEDGE_ENOTFOUND);
    /* A store in use is not repaired under its user. */
    s_open(fx);
    assert_int_equal(kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why),
                     KVEDGE_ELOCKED);
    assert_non_null(strstr(why, "stop the node"));
    kvedge_engine_destroy(&fx->e);

    /* A newer kvedge's store is left alone. */
    char newer[128];
    snprintf(newer, sizeof newer, "%s/newer", fx->dir);
    rocksdb_options_t *opt = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(opt, 1);
    char *err = NULL;
    rocksdb_t *db = rocksdb_open(opt, newer, &err);
    assert_null(err);
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    rocksdb_put(db, wo, "kvedge.format", 13, "2", 1, &err);
    assert_null(err);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_close(db);
    rocksdb_options_destroy(opt);
    assert_int_equal(kvedge_engine_repair(newer, NULL, NULL, &rep, why, sizeof why),
                     KVEDGE_EVERSION);
    assert_int_equal(kvedge_engine_open(newer, NULL, &fx->e, why, sizeof why), KVEDGE_EVERSION);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bad_lz4_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_damaged_sst, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_damaged_inline_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_lost_manifest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_lost_current, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_manifest_file_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_flips_in_every_sst, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_flip_in_blob, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_truncated_wal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_refuses_short_store, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_resumes_swap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_sound_store, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_keeps_tenant_models, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_model_keeps_namespace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repair_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
