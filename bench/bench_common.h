/* Helpers shared by the benchmarks: a monotonic clock, medians and percentiles of repeated
 * measurements, and a fail-fast check (benchmarks are programs, not library code). */
#ifndef KVEDGE_BENCH_COMMON_H
#define KVEDGE_BENCH_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/codec/error.h"

/* Every figure is the median of at least this many repetitions. */
#define KVEDGE_BENCH_REPS_MIN 7
/* Bytes in the "MB" of MB/s. */
#define KVEDGE_BENCH_MB 1e6

/* Aborts the benchmark with the kvedge error text when rc is not 0. */
#define KVEDGE_BENCH_CHECK(expr)                                                                   \
    do {                                                                                           \
        int bench_rc_ = (expr);                                                                    \
        if (bench_rc_ != 0) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                          \
                    kvedge_strerror(bench_rc_));                                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* malloc that never returns NULL. */
static inline void *bench_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* The token ids of MODELS/kjv/heldout.ids (whitespace-separated integers); exits with a line
 * naming `prog` and the path when the file cannot be opened. *n gets the count. */
static inline int32_t *bench_read_heldout_ids(const char *prog, const char *models_root, size_t *n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/kjv/heldout.ids", models_root);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: cannot open %s (run from the repository root or pass --models DIR)\n",
                prog, path);
        exit(1);
    }
    size_t cap = 1 << 16, k = 0;
    int32_t *ids = bench_alloc(cap * sizeof *ids);
    long v;
    while (fscanf(f, "%ld", &v) == 1) {
        if (k == cap && !(ids = realloc(ids, (cap *= 2) * sizeof *ids)))
            exit(1);
        ids[k++] = (int32_t)v;
    }
    fclose(f);
    *n = k;
    return ids;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1, nearest rank) of n samples; sorts a copy. */
static inline double bench_quantile(const double *v, size_t n, double q)
{
    if (n == 0)
        return 0.0;
    double *s = bench_alloc(n * sizeof *s);
    memcpy(s, v, n * sizeof *s);
    qsort(s, n, sizeof *s, bench_cmp_double);
    size_t i = (size_t)(q * (double)n);
    if (i >= n)
        i = n - 1;
    double r = s[i];
    if (q == 0.5 && n % 2 == 0)
        r = (s[n / 2 - 1] + s[n / 2]) / 2.0;
    free(s);
    return r;
}

static inline double bench_median(const double *v, size_t n)
{
    return bench_quantile(v, n, 0.5);
}

/* MB/s for `bytes` moved in the median of n timings (seconds). */
static inline double bench_mbps(double bytes, const double *secs, size_t n)
{
    return bytes / KVEDGE_BENCH_MB / bench_median(secs, n);
}

#endif
