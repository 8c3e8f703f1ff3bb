/* monitor/ costs: ns per counter increment and histogram observation (one thread, and two
 * threads on one series), ns per heavy-hitter access, the render time of a registry of about
 * 200 series, and the heavy-hitter table's memory after 100 000 distinct prefixes (its own
 * count and the process's RSS growth, to show the bound). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_common.h"
#include "monitor/hot.h"
#include "monitor/metrics.h"

#define OPS          10000000 /* updates per timing */
#define HOT_OPS      2000000  /* heavy-hitter accesses per timing */
#define HOT_DISTINCT 100000   /* distinct prefixes for the memory figure */
#define REPS         KVEDGE_BENCH_REPS_MIN

static kvedge_metric_t *s_family(kvedge_metrics_t *r, kvedge_metric_type_t type, const char *name,
                                 const char *const *labels, size_t n_labels,
                                 const kvedge_histogram_spec_t *hist, size_t max_series)
{
    char why[256];
    kvedge_metric_t *m = kvedge_metrics_family(r, type, name, "bench", labels, n_labels, hist,
                                               max_series, why, sizeof why);
    if (!m) {
        fprintf(stderr, "family %s: %s\n", name, why);
        exit(1);
    }
    return m;
}

/* Resident set size in bytes, from /proc/self/statm. */
static size_t s_rss(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, rss = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &rss) != 2)
        rss = 0;
    fclose(f);
    return rss * (size_t)sysconf(_SC_PAGESIZE);
}

typedef struct {
    kvedge_series_t *s;
    uint64_t n;
    double secs;
} s_job_t;

static void *s_observe_job(void *arg)
{
    s_job_t *j = arg;
    double t0 = bench_now_s();
    for (uint64_t i = 0; i < j->n; i++)
        kvedge_series_observe(j->s, (i * 2654435761u) & 0xfffff);
    j->secs = bench_now_s() - t0;
    return NULL;
}

static void s_bench_updates(void)
{
    kvedge_metrics_t *r = kvedge_metrics_new();
    kvedge_series_t *c =
        kvedge_metric_plain(s_family(r, KVEDGE_METRIC_COUNTER, "ops_total", NULL, 0, NULL, 0));
    kvedge_series_t *h = kvedge_metric_plain(s_family(r, KVEDGE_METRIC_HISTOGRAM, "op_seconds",
                                                      NULL, 0, &kvedge_histogram_latency_us, 0));
    double inc[REPS], obs[REPS], obs2[REPS];
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = bench_now_s();
        for (uint64_t i = 0; i < OPS; i++)
            kvedge_series_inc(c);
        inc[rep] = (bench_now_s() - t0) / OPS * 1e9;

        s_job_t one = {h, OPS, 0};
        s_observe_job(&one);
        obs[rep] = one.secs / OPS * 1e9;

        /* Two threads on one series: the cache line ping-pongs. */
        s_job_t two[2] = {{h, OPS / 2, 0}, {h, OPS / 2, 0}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, s_observe_job, &two[i]);
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], NULL);
        double worst = two[0].secs > two[1].secs ? two[0].secs : two[1].secs;
        obs2[rep] = worst / (OPS / 2) * 1e9;
    }
    printf("counter inc                      %6.2f ns\n", bench_median(inc, REPS));
    printf("histogram observe, 1 thread      %6.2f ns\n", bench_median(obs, REPS));
    printf("histogram observe, 2 threads     %6.2f ns per observation per thread (one series)\n",
           bench_median(obs2, REPS));
    kvedge_metrics_destroy(&r);
}

static void s_bench_render(void)
{
    kvedge_metrics_t *r = kvedge_metrics_new();
    const char *const lab2[] = {"model", "op"};
    const char *const lab1[] = {"source"};
    kvedge_metric_t *req = s_family(r, KVEDGE_METRIC_COUNTER, "req_total", lab2, 2, NULL, 128);
    kvedge_metric_t *up = s_family(r, KVEDGE_METRIC_GAUGE, "source_up", lab1, 1, NULL, 64);
    kvedge_metric_t *lat = s_family(r, KVEDGE_METRIC_HISTOGRAM, "fetch_seconds", lab1, 1,
                                    &kvedge_histogram_latency_us, 64);
    size_t series = 0;
    char a[32], b[32];
    for (int i = 0; i < 100; i++) {
        snprintf(a, sizeof a, "model-%d", i / 4);
        snprintf(b, sizeof b, "op%d", i % 4);
        const char *v[] = {a, b};
        kvedge_series_add(kvedge_metric_series(req, v, 2), (uint64_t)i * 1000);
        series++;
    }
    for (int i = 0; i < 70; i++) {
        snprintf(a, sizeof a, "10.0.0.%d:9740", i);
        const char *v[] = {a};
        kvedge_series_set(kvedge_metric_series(up, v, 1), i % 2);
        series++;
    }
    for (int i = 0; i < 20; i++) {
        snprintf(a, sizeof a, "10.0.0.%d:9740", i);
        const char *v[] = {a};
        kvedge_series_t *s = kvedge_metric_series(lat, v, 1);
        for (uint64_t k = 1; k < 1000; k++)
            kvedge_series_observe(s, k * 37);
        series++;
    }
    for (int i = 0; i < 10; i++) {
        snprintf(a, sizeof a, "plain_%d", i);
        kvedge_series_set(
            kvedge_metric_plain(s_family(r, KVEDGE_METRIC_GAUGE, a, NULL, 0, NULL, 0)), i * 1.5);
        series++;
    }
    double t[REPS * 3];
    size_t len = 0;
    for (int rep = 0; rep < REPS * 3; rep++) {
        double t0 = bench_now_s();
        char *text = kvedge_metrics_render(r, &len);
        t[rep] = bench_now_s() - t0;
        free(text);
    }
    printf("render, %zu series (20 histograms) %6.1f us, %zu bytes\n", series,
           bench_median(t, REPS * 3) * 1e6, len);
    kvedge_metrics_destroy(&r);
}

static void s_key(uint64_t i, uint8_t key[KVEDGE_HOT_KEY_BYTES])
{
    memset(key, 0, KVEDGE_HOT_KEY_BYTES);
    uint64_t h = i * 0x9e3779b97f4a7c15ull;
    memcpy(key, &h, sizeof h);
    memcpy(key + 8, &i, sizeof i);
}

static void s_bench_hot(void)
{
    /* Skewed keys: 90% of accesses to 200 hot prefixes, the rest spread over a million. */
    uint64_t *ids = bench_alloc(HOT_OPS * sizeof *ids);
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < HOT_OPS; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids[i] = s % 10 ? s % 200 : s % 1000000;
    }
    uint8_t(*keys)[KVEDGE_HOT_KEY_BYTES] = bench_alloc(HOT_OPS * KVEDGE_HOT_KEY_BYTES);
    for (size_t i = 0; i < HOT_OPS; i++)
        s_key(ids[i], keys[i]);
    kvedge_hot_t *h = kvedge_hot_new(1024);
    double t[REPS];
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = bench_now_s();
        for (size_t i = 0; i < HOT_OPS; i++)
            kvedge_hot_touch(h, keys[i], "opt-125m", (uint32_t)(i % 12), (uint32_t)(i % 12), 4096);
        t[rep] = (bench_now_s() - t0) / HOT_OPS * 1e9;
    }
    printf("hot touch (capacity 1024, skewed) %6.2f ns\n", bench_median(t, REPS));
    kvedge_hot_destroy(&h);
    free(keys);
    free(ids);

    const size_t caps[] = {256, 1024};
    for (size_t c = 0; c < 2; c++) {
        size_t rss0 = s_rss();
        h = kvedge_hot_new(caps[c]);
        size_t bytes = kvedge_hot_bytes(h);
        uint8_t k[KVEDGE_HOT_KEY_BYTES];
        for (uint64_t i = 0; i < HOT_DISTINCT; i++) {
            s_key(i + 1000000000ull * (c + 1), k);
            kvedge_hot_touch(h, k, "a-model-id", (uint32_t)(i % 200), (uint32_t)(i % 80), 4096);
        }
        size_t rss1 = s_rss();
        printf("hot capacity %4zu: %8zu bytes (fixed: %zu after %d distinct prefixes), RSS "
               "growth %zu KiB\n",
               caps[c], bytes, kvedge_hot_bytes(h), HOT_DISTINCT,
               (rss1 > rss0 ? rss1 - rss0 : 0) / 1024);
        kvedge_hot_destroy(&h);
    }
}

int main(void)
{
    double t0 = bench_now_s();
    s_bench_updates();
    s_bench_render();
    s_bench_hot();
    printf("(bench_monitor took %.1f s)\n", bench_now_s() - t0);
    return 0;
}
