/* Block engine throughput: put and get of 128 KiB and 16 MiB blocks against one plain file per
 * value (open/write/close, open/read/close) measured in the same run, plus durable puts
 * (sync WAL) against write + fsync. Gets run with the engine's cache sized to hold the data
 * set (the files are in the page cache), and once without a cache. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "access/codec/block.h"
#include "access/codec/chunk.h"
#include "store/engine/engine.h"
#include "access/codec/error.h"
#include "access/codec/model.h"
#include "access/codec/synth.h"

#define S_HEAD_DIM 128
/* The bench model: 32 layers x 8 KV heads, so one chunk holds 256 blocks. */
#define S_LAYERS           32
#define S_KV_HEADS         8
#define S_MODEL_ID         "bench"
#define S_PUT_REPS_MIN     3
#define S_PUT_REPS_DEFAULT 5
/* Sizes tried: 128 KiB and 16 MiB of fp16 K+V per block. */
#define S_SMALL_TOKENS    256
#define S_SMALL_TOTAL_MIB 64
#define S_LARGE_TOKENS    32768
#define S_LARGE_TOTAL_MIB 256
/* The project's goal: engine large-value reads at >= this fraction of plain file reads. */
#define S_GOAL_READ_FRACTION 0.8
#define S_PATH_MAX           4096
/* The engine's cache: room for the larger data set (256 MiB) with some to spare. */
#define S_CACHE_MIB_DEFAULT 1024

typedef struct {
    uint32_t tokens;
    size_t n;                    /* values */
    size_t len;                  /* bytes of each encoded block (all equal) */
    uint8_t **blocks;            /* n encoded lossless fp16 blocks */
    kvedge_chunk_info_t *chunks; /* one per S_LAYERS * S_KV_HEADS values */
} s_set_t;

typedef struct {
    double *pass; /* seconds per pass */
    double *op;   /* seconds per operation, every pass */
    size_t n_pass;
    size_t n_op;
} s_times_t;

static void s_die_errno(const char *what, const char *path)
{
    fprintf(stderr, "%s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

static void s_times_init(s_times_t *t, size_t passes, size_t ops_per_pass)
{
    memset(t, 0, sizeof *t);
    t->pass = bench_alloc(passes * sizeof(double));
    t->op = bench_alloc(passes * ops_per_pass * sizeof(double));
}

static void s_times_free(s_times_t *t)
{
    free(t->pass);
    free(t->op);
}

static double s_mbps(const s_set_t *set, const s_times_t *t)
{
    return bench_mbps((double)set->n * (double)set->len, t->pass, t->n_pass);
}

static int s_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Removes a directory tree (ours: made by mkdtemp). */
static void s_rm_tree(const char *path)
{
    if (nftw(path, s_rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        s_die_errno("cannot remove", path);
}

static void s_mkdir(const char *path)
{
    if (mkdir(path, 0755) != 0)
        s_die_errno("cannot create", path);
}

static void s_key(const s_set_t *set, size_t i, kvedge_block_key_t *key)
{
    const size_t per_chunk = S_LAYERS * S_KV_HEADS;
    key->chunk = set->chunks[i / per_chunk].id;
    key->layer = (uint16_t)((i % per_chunk) / S_KV_HEADS);
    key->head = (uint16_t)(i % S_KV_HEADS);
}

/* Builds n distinct lossless fp16 blocks of `tokens` tokens and the chunks they belong to. */
static void s_make_set(s_set_t *set, uint32_t tokens, size_t total_mib)
{
    memset(set, 0, sizeof *set);
    set->tokens = tokens;
    const uint64_t payload = kvedge_block_fp16_bytes(tokens, S_HEAD_DIM);
    set->n = (size_t)(((uint64_t)total_mib << 20) / payload);
    kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP16,
                                .scheme = KVEDGE_SCHEME_LOSSLESS,
                                .tokens = tokens,
                                .head_dim = S_HEAD_DIM};
    const size_t cap = kvedge_block_encoded_bound(&spec);
    const size_t half = (size_t)payload / 2;
    uint8_t *k = bench_alloc(half), *v = bench_alloc(half);
    set->blocks = bench_alloc(set->n * sizeof *set->blocks);
    for (size_t i = 0; i < set->n; i++) {
        set->blocks[i] = bench_alloc(cap);
        KVEDGE_BENCH_CHECK(kvedge_synth_head(1 + i % S_KV_HEADS,
                                             (uint32_t)(i / S_KV_HEADS) * tokens, tokens,
                                             S_HEAD_DIM, KVEDGE_DTYPE_FP16, k, v));
        size_t len;
        KVEDGE_BENCH_CHECK(kvedge_block_encode(&spec, k, v, set->blocks[i], cap, &len));
        set->len = len;
    }
    free(k);
    free(v);

    const size_t per_chunk = S_LAYERS * S_KV_HEADS;
    const size_t n_chunks = (set->n + per_chunk - 1) / per_chunk;
    set->chunks = bench_alloc(n_chunks * sizeof *set->chunks);
    uint32_t *ids = bench_alloc(tokens * sizeof *ids);
    for (size_t c = 0; c < n_chunks; c++) {
        kvedge_chunk_info_t *ci = &set->chunks[c];
        memset(ci, 0, sizeof *ci);
        for (uint32_t t = 0; t < tokens; t++)
            ids[t] = (uint32_t)(c * tokens + t);
        KVEDGE_BENCH_CHECK(kvedge_chunk_id(NULL, 0, S_MODEL_ID, NULL, ids, tokens, &ci->id));
        snprintf(ci->model_id, sizeof ci->model_id, "%s", S_MODEL_ID);
        ci->tokens = tokens;
    }
    free(ids);
}

static void s_free_set(s_set_t *set)
{
    for (size_t i = 0; i < set->n; i++)
        free(set->blocks[i]);
    free(set->blocks);
    free(set->chunks);
}

/* Opens a store with the default options but sync, the atime granularity and the cache. */
static kvedge_engine_t *s_open(const char *dir, bool sync, uint32_t atime_ms, uint64_t cache_bytes)
{
    kvedge_engine_opts_t opts;
    kvedge_engine_opts_default(&opts);
    opts.sync = sync;
    opts.atime_granularity_ms = atime_ms;
    opts.cache_bytes = cache_bytes;
    kvedge_engine_t *e = NULL;
    char why[512];
    int rc = kvedge_engine_open(dir, &opts, &e, why, sizeof why);
    if (rc != KVEDGE_OK) {
        fprintf(stderr, "kvedge_engine_open %s: %s (%s)\n", dir, kvedge_strerror(rc), why);
        exit(1);
    }
    kvedge_model_t m;
    memset(&m, 0, sizeof m);
    snprintf(m.id, sizeof m.id, "%s", S_MODEL_ID);
    m.layers = S_LAYERS;
    m.kv_heads = S_KV_HEADS;
    m.head_dim = S_HEAD_DIM;
    m.dtype = KVEDGE_DTYPE_FP16;
    KVEDGE_BENCH_CHECK(kvedge_engine_put_model(e, &m));
    return e;
}

/* Formats a path into out (S_PATH_MAX bytes); a path that does not fit is fatal. */
__attribute__((format(printf, 2, 3))) static void s_path(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, S_PATH_MAX, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= S_PATH_MAX) {
        fprintf(stderr, "path too long\n");
        exit(1);
    }
}

static void s_file_path(char *out, const char *dir, size_t i)
{
    s_path(out, "%s/v%06zu", dir, i);
}

/* Writes every value to its own file; fsync before close when durable. */
static void s_file_put_pass(const s_set_t *set, const char *dir, bool durable, s_times_t *t)
{
    char path[S_PATH_MAX];
    double t0 = bench_now_s();
    for (size_t i = 0; i < set->n; i++) {
        s_file_path(path, dir, i);
        double o0 = bench_now_s();
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            s_die_errno("cannot create", path);
        for (size_t off = 0; off < set->len;) {
            ssize_t w = write(fd, set->blocks[i] + off, set->len - off);
            if (w < 0 && errno != EINTR)
                s_die_errno("cannot write", path);
            off += w > 0 ? (size_t)w : 0;
        }
        if (durable && fsync(fd) != 0)
            s_die_errno("cannot fsync", path);
        if (close(fd) != 0)
            s_die_errno("cannot close", path);
        t->op[t->n_op++] = bench_now_s() - o0;
    }
    t->pass[t->n_pass++] = bench_now_s() - t0;
}

static void s_file_get_pass(const s_set_t *set, const char *dir, uint8_t *buf, s_times_t *t)
{
    char path[S_PATH_MAX];
    double t0 = bench_now_s();
    for (size_t i = 0; i < set->n; i++) {
        s_file_path(path, dir, i);
        double o0 = bench_now_s();
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            s_die_errno("cannot open", path);
        size_t off = 0;
        while (off < set->len) {
            ssize_t r = read(fd, buf + off, set->len - off);
            if (r < 0 && errno != EINTR)
                s_die_errno("cannot read", path);
            if (r == 0)
                break;
            off += r > 0 ? (size_t)r : 0;
        }
        close(fd);
        if (off != set->len) {
            fprintf(stderr, "short read of %s\n", path);
            exit(1);
        }
        if (t)
            t->op[t->n_op++] = bench_now_s() - o0;
    }
    if (t)
        t->pass[t->n_pass++] = bench_now_s() - t0;
}

static void s_engine_put_pass(const s_set_t *set, kvedge_engine_t *e, s_times_t *t)
{
    double t0 = bench_now_s();
    for (size_t i = 0; i < set->n; i++) {
        kvedge_block_key_t key;
        s_key(set, i, &key);
        const kvedge_chunk_info_t *ci = &set->chunks[i / (S_LAYERS * S_KV_HEADS)];
        double o0 = bench_now_s();
        KVEDGE_BENCH_CHECK(
            kvedge_engine_put(e, ci, key.layer, key.head, set->blocks[i], set->len, NULL));
        t->op[t->n_op++] = bench_now_s() - o0;
    }
    t->pass[t->n_pass++] = bench_now_s() - t0;
}

static void s_engine_get_pass(const s_set_t *set, kvedge_engine_t *e, s_times_t *t)
{
    double t0 = bench_now_s();
    for (size_t i = 0; i < set->n; i++) {
        kvedge_block_key_t key;
        s_key(set, i, &key);
        kvedge_value_t v;
        double o0 = bench_now_s();
        KVEDGE_BENCH_CHECK(kvedge_engine_get(e, &key, &v));
        if (v.len != set->len) {
            fprintf(stderr, "engine returned %zu bytes, expected %zu\n", v.len, set->len);
            exit(1);
        }
        kvedge_value_release(&v);
        if (t)
            t->op[t->n_op++] = bench_now_s() - o0;
    }
    if (t)
        t->pass[t->n_pass++] = bench_now_s() - t0;
}

/* Counts the blob files of a store: where large values live once the memtable is flushed. */
static int s_count_blobs(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        size_t len = strlen(de->d_name);
        n += len > 5 && strcmp(de->d_name + len - 5, ".blob") == 0;
    }
    closedir(d);
    return n;
}

typedef struct {
    const char *base;     /* our mkdtemp directory */
    int reps;             /* get passes */
    int put_reps;         /* put passes */
    uint64_t cache_bytes; /* the engine's cache (0 = none) */
} s_cfg_t;

static void s_print_row(const char *label, const s_set_t *set, const s_times_t *eng,
                        const s_times_t *file, bool latency, const char *goal)
{
    double em = s_mbps(set, eng), fm = s_mbps(set, file);
    printf("| %s | %zu x %zu | %.0f | %.0f | %.2f |", label, set->n, eng->n_pass, em, fm, em / fm);
    if (latency)
        printf(" %.3f / %.3f | %.3f / %.3f |", 1e3 * bench_quantile(eng->op, eng->n_op, 0.5),
               1e3 * bench_quantile(eng->op, eng->n_op, 0.99),
               1e3 * bench_quantile(file->op, file->n_op, 0.5),
               1e3 * bench_quantile(file->op, file->n_op, 0.99));
    else
        printf(" - | - |");
    printf(" %s |\n", goal);
}

/* Put passes (fresh store and fresh directory each), then get passes on the last ones.
 * Returns the number of blob files the store held for the get passes. */
static int s_run_size(const s_cfg_t *cfg, const char *label, uint32_t tokens, size_t total_mib,
                      bool large)
{
    s_set_t set;
    s_make_set(&set, tokens, total_mib);
    const char *tag = large ? "large" : "small";
    char edir[S_PATH_MAX], fdir[S_PATH_MAX];
    s_times_t eput, fput;
    s_times_init(&eput, (size_t)cfg->put_reps, set.n);
    s_times_init(&fput, (size_t)cfg->put_reps, set.n);

    kvedge_engine_t *e = NULL;
    for (int rep = 0; rep < cfg->put_reps; rep++) {
        bool last = rep == cfg->put_reps - 1;
        s_path(fdir, "%s/%s-files-%d", cfg->base, tag, rep);
        s_path(edir, "%s/%s-engine-%d", cfg->base, tag, rep);
        s_mkdir(fdir);
        e = s_open(edir, false, KVEDGE_ENGINE_ATIME_GRANULARITY_MS_DEFAULT, cfg->cache_bytes);
        sync(); /* start each timed pass with no dirty pages from the previous one */
        s_file_put_pass(&set, fdir, false, &fput);
        sync();
        s_engine_put_pass(&set, e, &eput);
        if (!last) { /* the last pass's store and files serve the gets */
            kvedge_engine_destroy(&e);
            s_rm_tree(edir);
            s_rm_tree(fdir);
        }
    }

    kvedge_engine_destroy(&e);
    uint8_t *buf = bench_alloc(set.len);
    memset(buf, 0, set.len);
    int blobs = s_count_blobs(edir);
    char name[64];
    snprintf(name, sizeof name, "%s put", label);
    s_print_row(name, &set, &eput, &fput, false, "-");
    /* Gets on the closed and reopened store (as after a restart: blob files, not the
     * memtable), three times: a read refreshes the block's atime when it is older than the
     * granularity (default 1 s), so reads of a block less than 1 s apart skip the refresh and
     * reads further apart pay it. Granularities of "never" and 0 give both cases for sure.
     * The third runs without the engine's cache (cache_bytes 0, no refresh): every get reads
     * its blob file. */
    for (int mode = 0; mode < 3; mode++) {
        const bool refresh = mode == 1, cached = mode != 2;
        s_times_t eget, fget;
        s_times_init(&eget, (size_t)cfg->reps, set.n);
        s_times_init(&fget, (size_t)cfg->reps, set.n);
        e = s_open(edir, false, refresh ? 0 : UINT32_MAX, cached ? cfg->cache_bytes : 0);
        s_file_get_pass(&set, fdir, buf, NULL); /* warm the page cache, untimed */
        s_engine_get_pass(&set, e, NULL);       /* and the engine's cache */
        for (int rep = 0; rep < cfg->reps; rep++) {
            s_file_get_pass(&set, fdir, buf, &fget);
            s_engine_get_pass(&set, e, &eget);
        }
        kvedge_engine_destroy(&e);
        snprintf(name, sizeof name, "%s get%s", label,
                 refresh   ? " + atime refresh"
                 : !cached ? ", no cache"
                           : "");
        double ratio = s_mbps(&set, &eget) / s_mbps(&set, &fget);
        const char *goal = !large ? "-" : ratio >= S_GOAL_READ_FRACTION ? "met" : "missed";
        s_print_row(name, &set, &eget, &fget, true, goal);
        fflush(stdout);
        s_times_free(&eget);
        s_times_free(&fget);
    }
    s_rm_tree(edir);
    s_rm_tree(fdir);

    if (large) {
        /* Durable puts: sync WAL against write + fsync, fresh store and directory each. */
        s_times_t esync, fsync_t;
        s_times_init(&esync, (size_t)cfg->put_reps, set.n);
        s_times_init(&fsync_t, (size_t)cfg->put_reps, set.n);
        for (int rep = 0; rep < cfg->put_reps; rep++) {
            s_path(fdir, "%s/%s-sync-files-%d", cfg->base, tag, rep);
            s_path(edir, "%s/%s-sync-engine-%d", cfg->base, tag, rep);
            s_mkdir(fdir);
            e = s_open(edir, true, KVEDGE_ENGINE_ATIME_GRANULARITY_MS_DEFAULT, cfg->cache_bytes);
            sync();
            s_file_put_pass(&set, fdir, true, &fsync_t);
            sync();
            s_engine_put_pass(&set, e, &esync);
            kvedge_engine_destroy(&e);
            s_rm_tree(edir);
            s_rm_tree(fdir);
        }
        snprintf(name, sizeof name, "%s put, sync / fsync", label);
        s_print_row(name, &set, &esync, &fsync_t, false, "-");
        s_times_free(&esync);
        s_times_free(&fsync_t);
    }

    free(buf);
    s_times_free(&eput);
    s_times_free(&fput);
    s_free_set(&set);
    return blobs;
}

static void s_usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--dir DIR (temp dirs go here, default /tmp)] [--reps N (get passes, "
            ">= %d)] [--put-reps N (>= %d)] [--cache-mib N (engine cache, default %d)]\n",
            argv0, KVEDGE_BENCH_REPS_MIN, S_PUT_REPS_MIN, S_CACHE_MIB_DEFAULT);
    exit(2);
}

int main(int argc, char **argv)
{
    const char *parent = "/tmp";
    s_cfg_t cfg = {.reps = KVEDGE_BENCH_REPS_MIN,
                   .put_reps = S_PUT_REPS_DEFAULT,
                   .cache_bytes = (uint64_t)S_CACHE_MIB_DEFAULT << 20};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            parent = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            cfg.reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--put-reps") == 0 && i + 1 < argc)
            cfg.put_reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--cache-mib") == 0 && i + 1 < argc)
            cfg.cache_bytes = strtoull(argv[++i], NULL, 10) << 20;
        else
            s_usage(argv[0]);
    }
    if (cfg.reps < KVEDGE_BENCH_REPS_MIN || cfg.put_reps < S_PUT_REPS_MIN)
        s_usage(argv[0]);
    char base[S_PATH_MAX];
    snprintf(base, sizeof base, "%s/kvedge-bench-XXXXXX", parent);
    if (!mkdtemp(base))
        s_die_errno("cannot create a temp dir under", parent);
    cfg.base = base;

    printf("### Block engine vs plain files (temp dir %s)\n\n", base);
    printf("Lossless fp16 blocks, head_dim %d. Engine cache (cache_bytes): %llu MiB. Put: "
           "median of %d passes, fresh store and fresh directory each, no fsync (the engine's "
           "default non-synced WAL). Get: median of %d warm passes (page cache, and the "
           "engine's cache) on the store closed and reopened after the last put pass; the "
           "engine verifies each block's checksum; \"+ atime refresh\": every get also "
           "refreshes the block's access time (the default for reads of a block more than 1 s "
           "apart); \"no cache\": cache_bytes 0, every get reads its blob file. Latency: p50 "
           "/ p99 per get over every pass, in ms.\n\n",
           S_HEAD_DIM, (unsigned long long)(cfg.cache_bytes >> 20), cfg.put_reps, cfg.reps);
    printf("| value, op | values x passes | engine MB/s | file MB/s | engine/file "
           "| engine p50 / p99 ms | file p50 / p99 ms | goal: large reads >= %.0f%% of file |\n",
           S_GOAL_READ_FRACTION * 100);
    printf("|---|---:|---:|---:|---:|---:|---:|---|\n");
    fflush(stdout);
    int small_blobs = s_run_size(&cfg, "128 KiB", S_SMALL_TOKENS, S_SMALL_TOTAL_MIB, false);
    fflush(stdout);
    int large_blobs = s_run_size(&cfg, "16 MiB", S_LARGE_TOKENS, S_LARGE_TOTAL_MIB, true);
    printf("\nMB = 10^6 bytes of encoded block (payload + 40 bytes of header and checksum). "
           "Blob files in the reopened stores: %d (128 KiB), %d (16 MiB)%s.\n",
           small_blobs, large_blobs,
           small_blobs > 0 && large_blobs > 0 ? ": gets read blob files, not the memtable"
                                              : ": some gets were served from the memtable");
    s_rm_tree(base);
    return 0;
}
