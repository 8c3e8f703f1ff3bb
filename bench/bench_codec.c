/* Block codec throughput: encode and decode (parse + decode to fp16) of a working set larger
 * than the caches, for each scheme, compared with memcpy of the same bytes in the same run;
 * with --transcode, deriving a coarser precision from a stored block (access/codec/prec.h) against
 * reading one stored at that precision. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_common.h"
#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/prec.h"
#include "access/codec/synth.h"

/* One block: one head of one layer of one chunk. */
#define S_TOKENS   256
#define S_HEAD_DIM 128
/* Distinct heads in the working set: each has its own outlier channels and channel mask. */
#define S_HEADS 8
/* Key channels kept by the ThinK-style mask rows. */
#define S_KEEP_CHANNELS           96
#define S_WORKING_SET_MIB_DEFAULT 64
#define S_SEED_BASE               1000
/* The project's goal: quantize and dequantize at >= this fraction of memcpy speed. */
#define S_GOAL_FRACTION 0.5

typedef struct {
    kvedge_scheme_t scheme;
    uint16_t group;
    bool lz4;
    bool masked;
    size_t stride;   /* bytes reserved per encoded block in the arena */
    uint8_t *arena;  /* n encoded blocks, one every stride bytes */
    size_t *len;     /* encoded length of each block */
    double *t_enc;   /* seconds per encode pass, one per repetition */
    double *t_dec;   /* seconds per decode pass, one per repetition */
    uint64_t stored; /* encoded bytes of the whole working set */
} s_row_t;

typedef struct {
    size_t n;          /* blocks in the working set */
    size_t half_bytes; /* bytes of K (or of V) of one block in fp16 */
    uint8_t *k_in, *v_in, *k_out, *v_out;
    uint8_t mask[S_HEADS][(S_HEAD_DIM + 7) / 8];
} s_set_t;

static void s_spec(const s_row_t *row, const s_set_t *set, size_t i, kvedge_block_spec_t *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->dtype = KVEDGE_DTYPE_FP16;
    spec->scheme = row->scheme;
    spec->tokens = S_TOKENS;
    spec->head_dim = S_HEAD_DIM;
    spec->group_size = row->group;
    spec->key_mask = row->masked ? set->mask[i % S_HEADS] : NULL;
    spec->lz4 = row->lz4;
}

static double s_pass_memcpy(const s_set_t *set)
{
    double t0 = bench_now_s();
    for (size_t i = 0; i < set->n; i++) {
        size_t off = i * set->half_bytes;
        memcpy(set->k_out + off, set->k_in + off, set->half_bytes);
        memcpy(set->v_out + off, set->v_in + off, set->half_bytes);
    }
    return bench_now_s() - t0;
}

static double s_pass_encode(s_row_t *row, const s_set_t *set)
{
    double t0 = bench_now_s();
    for (size_t i = 0; i < set->n; i++) {
        kvedge_block_spec_t spec;
        s_spec(row, set, i, &spec);
        size_t off = i * set->half_bytes;
        KVEDGE_BENCH_CHECK(kvedge_block_encode(&spec, set->k_in + off, set->v_in + off,
                                               row->arena + i * row->stride, row->stride,
                                               &row->len[i]));
    }
    return bench_now_s() - t0;
}

/* The edge's hot path: verify the block, then decode it to fp16. */
static double s_pass_decode(const s_row_t *row, const s_set_t *set)
{
    double t0 = bench_now_s();
    for (size_t i = 0; i < set->n; i++) {
        kvedge_block_info_t info;
        KVEDGE_BENCH_CHECK(kvedge_block_parse(row->arena + i * row->stride, row->len[i], &info));
        size_t off = i * set->half_bytes;
        KVEDGE_BENCH_CHECK(
            kvedge_block_decode(&info, KVEDGE_DTYPE_FP16, set->k_out + off, set->v_out + off));
    }
    return bench_now_s() - t0;
}

static void s_make_set(s_set_t *set, size_t mib)
{
    const uint64_t block_bytes = kvedge_block_fp16_bytes(S_TOKENS, S_HEAD_DIM);
    set->n = (size_t)(((uint64_t)mib << 20) + block_bytes - 1) / block_bytes;
    set->half_bytes = (size_t)block_bytes / 2;
    size_t total = set->n * set->half_bytes;
    set->k_in = bench_alloc(total);
    set->v_in = bench_alloc(total);
    set->k_out = bench_alloc(total);
    set->v_out = bench_alloc(total);
    memset(set->k_out, 0, total); /* fault the pages in before anything is timed */
    memset(set->v_out, 0, total);
    for (size_t i = 0; i < set->n; i++) {
        uint64_t seed = S_SEED_BASE + i % S_HEADS;
        uint32_t offset = (uint32_t)(i / S_HEADS) * S_TOKENS;
        size_t off = i * set->half_bytes;
        KVEDGE_BENCH_CHECK(kvedge_synth_head(seed, offset, S_TOKENS, S_HEAD_DIM, KVEDGE_DTYPE_FP16,
                                             set->k_in + off, set->v_in + off));
    }
    /* One mask per head, from its first chunk's keys, as a ThinK calibration would do. */
    float *kf = bench_alloc(sizeof(float) * S_TOKENS * S_HEAD_DIM);
    float *vf = bench_alloc(sizeof(float) * S_TOKENS * S_HEAD_DIM);
    for (uint32_t h = 0; h < S_HEADS; h++) {
        KVEDGE_BENCH_CHECK(kvedge_synth_head_f32(S_SEED_BASE + h, 0, S_TOKENS, S_HEAD_DIM, kf, vf));
        KVEDGE_BENCH_CHECK(
            kvedge_synth_key_mask(kf, S_TOKENS, S_HEAD_DIM, S_KEEP_CHANNELS, set->mask[h]));
    }
    free(kf);
    free(vf);
}

static void s_row_init(s_row_t *row, const s_set_t *set, int reps)
{
    kvedge_block_spec_t spec;
    s_spec(row, set, 0, &spec);
    size_t bound = kvedge_block_encoded_bound(&spec);
    if (bound == 0) {
        fprintf(stderr, "invalid spec for %s\n", kvedge_scheme_name(row->scheme));
        exit(1);
    }
    row->stride = (bound + 63) & ~(size_t)63;
    row->arena = bench_alloc(set->n * row->stride);
    memset(row->arena, 0, set->n * row->stride);
    row->len = bench_alloc(set->n * sizeof *row->len);
    row->t_enc = bench_alloc((size_t)reps * sizeof(double));
    row->t_dec = bench_alloc((size_t)reps * sizeof(double));
}

static void s_row_free(s_row_t *row)
{
    free(row->arena);
    free(row->len);
    free(row->t_enc);
    free(row->t_dec);
}

static void s_usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--reps N (>= %d)] [--mib N (working set, default %d)] [--row N]\n"
            "       %s --callgrind [--mib N] [--row N]\n"
            "       %s --transcode [--reps N] [--mib N]\n",
            argv0, KVEDGE_BENCH_REPS_MIN, S_WORKING_SET_MIB_DEFAULT, argv0, argv0);
    exit(2);
}

/* --transcode: one row per derivation a node may make instead of storing the variant. */
typedef struct {
    const s_row_t *src; /* the stored blocks it derives from */
    kvedge_prec_t from, to;
    size_t stride;  /* bytes reserved per output block */
    uint8_t *arena; /* the same blocks stored at `to` (the output of a transcode pass) */
    uint8_t *copy;  /* memcpy's destination */
    size_t *len;    /* length of each block at `to` */
    uint64_t out;   /* bytes of the working set at `to` */
    double *t_tx;   /* seconds per pass: verify the source, transcode, free the output */
    double *t_read; /* seconds per pass: verify the stored block at `to` */
    double *t_mem;  /* seconds per pass: memcpy of the blocks at `to` */
} s_tx_row_t;

/* What serving a precision the node does not hold costs: the stored source is verified as
 * every read is (kvedge_block_check), then re-encoded; the output is counted, then freed. */
static double s_pass_transcode(s_tx_row_t *row, size_t n, bool keep)
{
    double t0 = bench_now_s();
    for (size_t i = 0; i < n; i++) {
        kvedge_block_info_t info;
        KVEDGE_BENCH_CHECK(
            kvedge_block_check(row->src->arena + i * row->src->stride, row->src->len[i], &info));
        uint8_t *out = NULL;
        size_t len = 0;
        KVEDGE_BENCH_CHECK(kvedge_block_transcode(&info, row->to, false, &out, &len));
        if (keep) {
            if (len > row->stride) {
                fprintf(stderr, "%s: block %zu is %zu bytes, %zu reserved\n",
                        kvedge_prec_name(row->to), i, len, row->stride);
                exit(1);
            }
            memcpy(row->arena + i * row->stride, out, len);
            row->len[i] = len;
        }
        free(out);
    }
    return bench_now_s() - t0;
}

/* The alternative, storing the variant: a hit reads and verifies the block as stored. */
static double s_pass_read(const s_tx_row_t *row, size_t n)
{
    double t0 = bench_now_s();
    for (size_t i = 0; i < n; i++) {
        kvedge_block_info_t info;
        KVEDGE_BENCH_CHECK(kvedge_block_check(row->arena + i * row->stride, row->len[i], &info));
    }
    return bench_now_s() - t0;
}

static double s_pass_tx_memcpy(const s_tx_row_t *row, size_t n)
{
    double t0 = bench_now_s();
    for (size_t i = 0; i < n; i++)
        memcpy(row->copy + i * row->stride, row->arena + i * row->stride, row->len[i]);
    return bench_now_s() - t0;
}

static int s_transcode_bench(s_row_t *src, size_t n_src, const s_set_t *set, int reps)
{
    for (size_t r = 0; r < n_src; r++) {
        s_row_init(&src[r], set, reps);
        s_pass_encode(&src[r], set);
    }
    const kvedge_prec_t think50 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50);
    s_tx_row_t rows[] = {
        {.src = &src[0], .from = KVEDGE_PREC_LOSSLESS, .to = KVEDGE_PREC_INT8},
        {.src = &src[0], .from = KVEDGE_PREC_LOSSLESS, .to = KVEDGE_PREC_INT4_G32},
        {.src = &src[0], .from = KVEDGE_PREC_LOSSLESS, .to = think50},
        {.src = &src[1], .from = KVEDGE_PREC_INT8, .to = KVEDGE_PREC_INT4_G32},
    };
    const size_t n_rows = sizeof rows / sizeof rows[0];
    for (size_t r = 0; r < n_rows; r++) {
        s_tx_row_t *row = &rows[r];
        /* Every block has one shape, so the size of a rung's block is known before any. */
        double per = kvedge_prec_bytes_per_fp16(row->to, S_TOKENS, S_HEAD_DIM, 2);
        row->stride = ((size_t)(per * (double)set->half_bytes * 2.0 + 0.5) + 63) & ~(size_t)63;
        row->arena = bench_alloc(set->n * row->stride);
        row->copy = bench_alloc(set->n * row->stride);
        memset(row->arena, 0, set->n * row->stride);
        memset(row->copy, 0, set->n * row->stride);
        row->len = bench_alloc(set->n * sizeof *row->len);
        row->t_tx = bench_alloc((size_t)reps * sizeof(double));
        row->t_read = bench_alloc((size_t)reps * sizeof(double));
        row->t_mem = bench_alloc((size_t)reps * sizeof(double));
        /* Untimed: fills the arena with the blocks at `to`, as if they had been stored. */
        s_pass_transcode(row, set->n, true);
        row->out = 0;
        for (size_t i = 0; i < set->n; i++) {
            kvedge_block_info_t info;
            KVEDGE_BENCH_CHECK(
                kvedge_block_parse(row->arena + i * row->stride, row->len[i], &info));
            if (kvedge_prec_of_block(&info) != row->to) {
                fprintf(stderr, "derived block is not at %s\n", kvedge_prec_name(row->to));
                return 1;
            }
            row->out += row->len[i];
        }
        s_pass_read(row, set->n);
        s_pass_tx_memcpy(row, set->n);
    }

    /* Repetitions interleave the rows and their peers, so noise spreads over all of them. */
    for (int rep = 0; rep < reps; rep++)
        for (size_t r = 0; r < n_rows; r++) {
            rows[r].t_mem[rep] = s_pass_tx_memcpy(&rows[r], set->n);
            rows[r].t_tx[rep] = s_pass_transcode(&rows[r], set->n, false);
            rows[r].t_read[rep] = s_pass_read(&rows[r], set->n);
        }

    printf("### Transcode: %zu blocks of %u tokens x %u dims fp16 K+V (%.1f MiB as fp16), "
           "median of %d passes\n\n",
           set->n, S_TOKENS, S_HEAD_DIM, 2.0 * (double)set->n * (double)set->half_bytes / (1 << 20),
           reps);
    printf("| from | to | out MiB | transcode MB/s | us/block | read+verify MB/s | memcpy MB/s "
           "| transcode/memcpy | transcode/read |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t r = 0; r < n_rows; r++) {
        const s_tx_row_t *row = &rows[r];
        const double bytes = (double)row->out;
        double tx = bench_mbps(bytes, row->t_tx, (size_t)reps);
        double rd = bench_mbps(bytes, row->t_read, (size_t)reps);
        double mem = bench_mbps(bytes, row->t_mem, (size_t)reps);
        double us = bench_median(row->t_tx, (size_t)reps) * 1e6 / (double)set->n;
        printf("| %s | %s | %.1f | %.0f | %.1f | %.0f | %.0f | %.3f | %.3f |\n",
               kvedge_prec_name(row->from), kvedge_prec_name(row->to), bytes / (1 << 20), tx, us,
               rd, mem, tx / mem, tx / rd);
    }
    printf("\nMB/s = 10^6 bytes of output-rung blocks per second. transcode = kvedge_block_check "
           "of the stored source, then kvedge_block_transcode (no lz4); read+verify = "
           "kvedge_block_check of the block stored at the output rung; memcpy copies those "
           "blocks, same run.\n");

    for (size_t r = 0; r < n_rows; r++) {
        free(rows[r].arena);
        free(rows[r].copy);
        free(rows[r].len);
        free(rows[r].t_tx);
        free(rows[r].t_read);
        free(rows[r].t_mem);
    }
    for (size_t r = 0; r < n_src; r++)
        s_row_free(&src[r]);
    return 0;
}

/* --callgrind: one untimed encode pass of each selected row and nothing else timed, for an
 * instruction count that noise cannot move:
 *   valgrind --tool=callgrind --toggle-collect=kvedge_block_encode \
 *       bench_codec --callgrind --mib 4 --row 2
 * Instructions per MB = Ir / the MB printed here. */
static void s_callgrind(s_row_t *rows, size_t n_rows, const s_set_t *set, int only)
{
    const double mb = 2.0 * (double)set->n * (double)set->half_bytes / KVEDGE_BENCH_MB;
    for (size_t r = 0; r < n_rows; r++) {
        if (only >= 0 && (size_t)only != r)
            continue;
        s_pass_encode(&rows[r], set);
        /* A digest of the blocks' checksums (their last 8 bytes, an xxh3 of all the others), so
         * two builds can be shown to write the same bytes. */
        uint64_t digest = 0;
        for (size_t i = 0; i < set->n; i++) {
            uint64_t sum;
            memcpy(&sum, rows[r].arena + i * rows[r].stride + rows[r].len[i] - 8, 8);
            digest = digest * 1000003u ^ sum;
        }
        printf("row %zu: %s group %u key ch %u lz4 %s: encoded %.3f MB of fp16 input, "
               "digest %016llx\n",
               r, kvedge_scheme_name(rows[r].scheme), rows[r].group,
               rows[r].masked ? S_KEEP_CHANNELS : S_HEAD_DIM, rows[r].lz4 ? "on" : "off", mb,
               (unsigned long long)digest);
    }
}

int main(int argc, char **argv)
{
    int reps = KVEDGE_BENCH_REPS_MIN;
    size_t mib = S_WORKING_SET_MIB_DEFAULT;
    int only = -1; /* --row: one row of the table (0-based), -1 all */
    bool callgrind = false, transcode = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
            mib = (size_t)atol(argv[++i]);
        else if (strcmp(argv[i], "--row") == 0 && i + 1 < argc)
            only = atoi(argv[++i]);
        else if (strcmp(argv[i], "--callgrind") == 0)
            callgrind = true;
        else if (strcmp(argv[i], "--transcode") == 0)
            transcode = true;
        else
            s_usage(argv[0]);
    }
    if (reps < KVEDGE_BENCH_REPS_MIN || mib == 0 || only < -1 ||
        (transcode && (callgrind || only >= 0)))
        s_usage(argv[0]);

    s_set_t set;
    s_make_set(&set, mib);
    if (transcode) {
        s_row_t src[] = {{.scheme = KVEDGE_SCHEME_LOSSLESS}, {.scheme = KVEDGE_SCHEME_INT8}};
        int rc = s_transcode_bench(src, sizeof src / sizeof src[0], &set, reps);
        free(set.k_in);
        free(set.v_in);
        free(set.k_out);
        free(set.v_out);
        return rc;
    }
    s_row_t all_rows[] = {
        {.scheme = KVEDGE_SCHEME_LOSSLESS},
        {.scheme = KVEDGE_SCHEME_LOSSLESS, .lz4 = true},
        {.scheme = KVEDGE_SCHEME_INT8, .group = 0},
        {.scheme = KVEDGE_SCHEME_INT4, .group = KVEDGE_BLOCK_INT4_GROUP_DEFAULT},
        {.scheme = KVEDGE_SCHEME_INT8, .group = 0, .masked = true},
        {.scheme = KVEDGE_SCHEME_INT4, .group = KVEDGE_BLOCK_INT4_GROUP_DEFAULT, .masked = true},
    };
    size_t n_rows = sizeof all_rows / sizeof all_rows[0];
    s_row_t *rows = all_rows;
    if (only >= (int)n_rows)
        s_usage(argv[0]);
    if (only >= 0 && !callgrind) {
        rows = &all_rows[only];
        n_rows = 1;
    }
    for (size_t r = 0; r < n_rows; r++)
        s_row_init(&rows[r], &set, reps);
    if (callgrind) {
        s_callgrind(rows, n_rows, &set, only);
        for (size_t r = 0; r < n_rows; r++)
            s_row_free(&rows[r]);
        free(set.k_in);
        free(set.v_in);
        free(set.k_out);
        free(set.v_out);
        return 0;
    }

    /* Untimed warm-up pass: faults every page in and fills the arenas for decoding. */
    s_pass_memcpy(&set);
    for (size_t r = 0; r < n_rows; r++) {
        s_pass_encode(&rows[r], &set);
        s_pass_decode(&rows[r], &set);
        rows[r].stored = 0;
        for (size_t i = 0; i < set.n; i++)
            rows[r].stored += rows[r].len[i];
        if (rows[r].scheme == KVEDGE_SCHEME_LOSSLESS && !rows[r].masked &&
            (memcmp(set.k_in, set.k_out, set.n * set.half_bytes) != 0 ||
             memcmp(set.v_in, set.v_out, set.n * set.half_bytes) != 0)) {
            fprintf(stderr, "lossless round trip is not bit-exact\n");
            return 1;
        }
    }

    /* Repetitions interleave the peer and every row, so noise spreads over all of them. */
    double *t_memcpy = bench_alloc((size_t)reps * sizeof(double));
    for (int rep = 0; rep < reps; rep++) {
        t_memcpy[rep] = s_pass_memcpy(&set);
        for (size_t r = 0; r < n_rows; r++) {
            rows[r].t_enc[rep] = s_pass_encode(&rows[r], &set);
            rows[r].t_dec[rep] = s_pass_decode(&rows[r], &set);
        }
    }

    const double bytes = 2.0 * (double)set.n * (double)set.half_bytes;
    const double mem = bench_mbps(bytes, t_memcpy, (size_t)reps);
    printf("### Block codec: %zu blocks of %u tokens x %u dims fp16 K+V (%.1f MiB), "
           "median of %d passes\n\n",
           set.n, S_TOKENS, S_HEAD_DIM, bytes / (1 << 20), reps);
    printf("memcpy of the same bytes, same run: %.0f MB/s (MB = 10^6 bytes of fp16 input)\n\n",
           mem);
    printf("| scheme | group | key ch | lz4 | ratio | encode MB/s | enc/memcpy | decode MB/s "
           "| dec/memcpy | >= %.0f%% memcpy (enc, dec) |\n",
           S_GOAL_FRACTION * 100);
    printf("|---|---:|---:|---|---:|---:|---:|---:|---:|---|\n");
    for (size_t r = 0; r < n_rows; r++) {
        const s_row_t *row = &rows[r];
        double enc = bench_mbps(bytes, row->t_enc, (size_t)reps);
        double dec = bench_mbps(bytes, row->t_dec, (size_t)reps);
        printf("| %s | %u | %u | %s | %.2f | %.0f | %.2f | %.0f | %.2f | %s, %s |\n",
               kvedge_scheme_name(row->scheme), row->group,
               row->masked ? S_KEEP_CHANNELS : S_HEAD_DIM, row->lz4 ? "on" : "off",
               bytes / (double)row->stored, enc, enc / mem, dec, dec / mem,
               enc / mem >= S_GOAL_FRACTION ? "yes" : "no",
               dec / mem >= S_GOAL_FRACTION ? "yes" : "no");
    }
    printf("\nratio = fp16 bytes / encoded bytes. The goal is stated for the quantized "
           "schemes (int8, int4); lossless rows are shown for reference.\n");

    for (size_t r = 0; r < n_rows; r++)
        s_row_free(&rows[r]);
    free(t_memcpy);
    free(set.k_in);
    free(set.v_in);
    free(set.k_out);
    free(set.v_out);
    return 0;
}
