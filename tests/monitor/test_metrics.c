/* Metrics: counter, gauge and histogram values; the exact exposition of a small registry
 * (HELP/TYPE, label escaping, cumulative buckets, _sum, _count); bounded cardinality with the
 * "_other" series; refused declarations and their reasons; histogram_quantile against a hand
 * computation; exact sums under concurrent updates; on_collect hooks; promtool's verdict on a
 * render when promtool is installed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "monitor/metrics.h"
#include "access/codec/error.h" /* only to check that the monitor's codes equal kvedge's */

#define WHY_BYTES 256

/* Lines of text that start with prefix. */
static size_t s_count_lines(const char *text, const char *prefix)
{
    size_t n = 0, pl = strlen(prefix);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, prefix, pl) == 0)
            n++;
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return n;
}

static void test_error_codes(void **state)
{
    (void)state;
    assert_int_equal(KVEDGE_MONITOR_EINVAL, KVEDGE_EINVAL);
    assert_int_equal(KVEDGE_MONITOR_ENOMEM, KVEDGE_ENOMEM);
    assert_int_equal(KVEDGE_MONITOR_EIO, KVEDGE_EIO);
}

static void test_degenerate(void **state)
{
    (void)state;
    kvedge_metrics_destroy(NULL);
    kvedge_metrics_t *none = NULL;
    kvedge_metrics_destroy(&none);
    assert_null(kvedge_metrics_render(NULL, NULL));
    assert_null(kvedge_metric_series(NULL, NULL, 0));
    assert_null(kvedge_metric_plain(NULL));
    /* NULL series: updates do nothing, reads are 0. */
    kvedge_series_inc(NULL);
    kvedge_series_add(NULL, 5);
    kvedge_series_set(NULL, 1.0);
    kvedge_series_gauge_add(NULL, 1.0);
    kvedge_series_observe(NULL, 7);
    assert_true(kvedge_series_value(NULL) == 0);
    uint64_t sum = 9;
    assert_int_equal(kvedge_series_hist(NULL, &sum, NULL, 0), 0);
    assert_int_equal(sum, 0);

    kvedge_metrics_t *r = kvedge_metrics_new();
    assert_non_null(r);
    size_t len = 99;
    char *text = kvedge_metrics_render(r, &len);
    assert_non_null(text);
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    free(text);
    assert_int_equal(kvedge_metrics_on_collect(r, NULL, NULL), -1);
    kvedge_metrics_destroy(&r);
    assert_null(r);
}

static void test_values(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    kvedge_metric_t *c = kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "c_total", "c", NULL, 0,
                                               NULL, 0, why, sizeof why);
    kvedge_metric_t *g =
        kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "g", "g", NULL, 0, NULL, 0, why, sizeof why);
    kvedge_histogram_spec_t spec = {10, 4, 1.0};
    kvedge_metric_t *h = kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "h", "h", NULL, 0, &spec,
                                               0, why, sizeof why);
    assert_non_null(c);
    assert_non_null(g);
    assert_non_null(h);
    kvedge_series_t *cs = kvedge_metric_plain(c), *gs = kvedge_metric_plain(g);
    kvedge_series_t *hs = kvedge_metric_plain(h);
    assert_ptr_equal(kvedge_metric_series(c, NULL, 0), cs);
    assert_null(kvedge_metric_series(c, NULL, 1)); /* wrong n */

    kvedge_series_inc(cs);
    kvedge_series_add(cs, 41);
    kvedge_series_set(cs, 1000); /* set is for gauges: ignored */
    kvedge_series_observe(cs, 3);
    assert_true(kvedge_series_value(cs) == 42);

    kvedge_series_set(gs, 2.5);
    kvedge_series_gauge_add(gs, -1.25);
    kvedge_series_add(gs, 2);
    kvedge_series_inc(gs);
    assert_true(kvedge_series_value(gs) == 4.25);
    kvedge_series_set(gs, -0.5);
    assert_true(kvedge_series_value(gs) == -0.5);

    /* Bounds 10, 20, 40, 80, +Inf: v goes to the first i with v <= 10 << i. */
    const uint64_t obs[] = {0, 10, 11, 20, 21, 40, 41, 80, 81, 1000000, UINT64_MAX / 2};
    for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++)
        kvedge_series_observe(hs, obs[i]);
    kvedge_series_inc(hs); /* counters only: ignored */
    uint64_t cum[6], sum;
    memset(cum, 0xab, sizeof cum);
    assert_int_equal(kvedge_series_hist(hs, &sum, cum, 6), 11);
    assert_int_equal(cum[0], 2);
    assert_int_equal(cum[1], 4);
    assert_int_equal(cum[2], 6);
    assert_int_equal(cum[3], 8);
    assert_int_equal(cum[4], 11); /* past the family's buckets: the total */
    assert_int_equal(cum[5], 11);
    uint64_t want = 0;
    for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++)
        want += obs[i];
    assert_int_equal(sum, want);

    /* The two stock layouts: 10 µs … ~42 s and 64 B … 4 GiB. */
    assert_int_equal(kvedge_histogram_latency_us.first_le, 10);
    assert_int_equal(kvedge_histogram_latency_us.buckets, 23);
    assert_true(kvedge_histogram_latency_us.scale == 1e-6);
    assert_int_equal(kvedge_histogram_latency_us.first_le << 22, 41943040);
    assert_int_equal(kvedge_histogram_bytes.first_le, 64);
    assert_int_equal(kvedge_histogram_bytes.buckets, 27);
    assert_int_equal(kvedge_histogram_bytes.first_le << 26, 4294967296ull);
    kvedge_metrics_destroy(&r);
}

/* The whole exposition of a small registry, byte for byte. */
static void test_render_exact(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    const char *const lab2[] = {"method", "path"};
    kvedge_metric_t *req =
        kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "req_total", "Requests served.", lab2, 2,
                              NULL, 4, why, sizeof why);
    assert_non_null(req);
    kvedge_metric_t *temp =
        kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "temp", "Temp \\ with\nnewline \"q\"", NULL,
                              0, NULL, 0, why, sizeof why);
    assert_non_null(temp);
    kvedge_histogram_spec_t spec = {10, 3, 1e-6};
    kvedge_metric_t *lat = kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "lat_seconds",
                                                 "Latency.", NULL, 0, &spec, 0, why, sizeof why);
    assert_non_null(lat);
    const char *const lab1[] = {"op"};
    kvedge_histogram_spec_t bspec = {64, 2, 1.0};
    kvedge_metric_t *size = kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "size_bytes",
                                                  "Sizes.", lab1, 1, &bspec, 8, why, sizeof why);
    assert_non_null(size);
    kvedge_metric_t *empty = kvedge_metrics_family(
        r, KVEDGE_METRIC_GAUGE, "empty_gauge", "No series yet.", lab1, 1, NULL, 8, why, sizeof why);
    assert_non_null(empty);

    const char *const v1[] = {"GET", "a\\b\"c\nd"};
    kvedge_series_t *s1 = kvedge_metric_series(req, v1, 2);
    assert_ptr_equal(kvedge_metric_series(req, v1, 2), s1); /* found, not made again */
    kvedge_series_add(s1, 3);
    const char *const v2[] = {"PUT", ""};
    kvedge_series_inc(kvedge_metric_series(req, v2, 2));
    kvedge_series_set(kvedge_metric_plain(temp), 1.5);
    kvedge_series_t *ls = kvedge_metric_plain(lat);
    kvedge_series_observe(ls, 5);
    kvedge_series_observe(ls, 15);
    kvedge_series_observe(ls, 100);
    const char *const op[] = {"get"};
    kvedge_series_t *ss = kvedge_metric_series(size, op, 1);
    kvedge_series_observe(ss, 64);
    kvedge_series_observe(ss, 65);

    const char *want = "# HELP req_total Requests served.\n"
                       "# TYPE req_total counter\n"
                       "req_total{method=\"GET\",path=\"a\\\\b\\\"c\\nd\"} 3\n"
                       "req_total{method=\"PUT\",path=\"\"} 1\n"
                       "# HELP temp Temp \\\\ with\\nnewline \"q\"\n"
                       "# TYPE temp gauge\n"
                       "temp 1.5\n"
                       "# HELP lat_seconds Latency.\n"
                       "# TYPE lat_seconds histogram\n"
                       "lat_seconds_bucket{le=\"1e-05\"} 1\n"
                       "lat_seconds_bucket{le=\"2e-05\"} 2\n"
                       "lat_seconds_bucket{le=\"4e-05\"} 2\n"
                       "lat_seconds_bucket{le=\"+Inf\"} 3\n"
                       "lat_seconds_sum 0.00012\n"
                       "lat_seconds_count 3\n"
                       "# HELP size_bytes Sizes.\n"
                       "# TYPE size_bytes histogram\n"
                       "size_bytes_bucket{op=\"get\",le=\"64\"} 1\n"
                       "size_bytes_bucket{op=\"get\",le=\"128\"} 2\n"
                       "size_bytes_bucket{op=\"get\",le=\"+Inf\"} 2\n"
                       "size_bytes_sum{op=\"get\"} 129\n"
                       "size_bytes_count{op=\"get\"} 2\n"
                       "# HELP empty_gauge No series yet.\n"
                       "# TYPE empty_gauge gauge\n";
    size_t len = 0;
    char *text = kvedge_metrics_render(r, &len);
    assert_non_null(text);
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    free(text);

    /* Gauge spellings: shortest round trip, NaN and infinities as the format spells them. */
    kvedge_series_t *ts = kvedge_metric_plain(temp);
    const struct {
        double v;
        const char *s;
    } g[] = {{0.1, "temp 0.1\n"},
             {1e21, "temp 1e+21\n"},
             {-3, "temp -3\n"},
             {NAN, "temp NaN\n"},
             {INFINITY, "temp +Inf\n"},
             {-INFINITY, "temp -Inf\n"},
             {1.0 / 3, "temp 0.3333333333333333\n"}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        kvedge_series_set(ts, g[i].v);
        text = kvedge_metrics_render(r, NULL);
        assert_non_null(strstr(text, g[i].s));
        free(text);
    }
    kvedge_metrics_destroy(&r);
}

/* The stock layouts' le values are spelt cleanly: no 1.0000000000000001e-05. */
static void test_render_stock_layouts(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    kvedge_metric_t *lat =
        kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "op_seconds", "Latency.", NULL, 0,
                              &kvedge_histogram_latency_us, 0, why, sizeof why);
    kvedge_metric_t *sz =
        kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "op_bytes", "Sizes.", NULL, 0,
                              &kvedge_histogram_bytes, 0, why, sizeof why);
    assert_non_null(lat);
    assert_non_null(sz);
    kvedge_series_observe(kvedge_metric_plain(lat), 123);
    char *text = kvedge_metrics_render(r, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "op_seconds_bucket{le=\"1e-05\"} 0\n"));
    assert_non_null(strstr(text, "op_seconds_bucket{le=\"0.00016\"} 1\n"));
    assert_non_null(strstr(text, "op_seconds_bucket{le=\"0.01024\"} 1\n"));
    assert_non_null(strstr(text, "op_seconds_bucket{le=\"41.94304\"} 1\n"));
    assert_non_null(strstr(text, "op_seconds_sum 0.000123\n"));
    assert_non_null(strstr(text, "op_bytes_bucket{le=\"64\"} 0\n"));
    assert_non_null(strstr(text, "op_bytes_bucket{le=\"4294967296\"} 0\n"));
    assert_int_equal(s_count_lines(text, "op_seconds_bucket"), 24);
    assert_int_equal(s_count_lines(text, "op_bytes_bucket"), 28);
    assert_null(strstr(text, "00000001"));
    free(text);
    kvedge_metrics_destroy(&r);
}

static void test_escape_label(void **state)
{
    (void)state;
    char out[16];
    assert_int_equal(kvedge_metrics_escape_label("a\\b\"c\nd", out, sizeof out), 10);
    assert_string_equal(out, "a\\\\b\\\"c\\nd");
    assert_int_equal(kvedge_metrics_escape_label(NULL, out, sizeof out), 0);
    assert_string_equal(out, "");
    assert_int_equal(kvedge_metrics_escape_label("x", NULL, 4), 0);
    assert_int_equal(kvedge_metrics_escape_label("x", out, 0), 0);
    /* Cut at a whole escape: "ab\" needs 4 + NUL, 4 bytes of room hold "ab" only. */
    assert_int_equal(kvedge_metrics_escape_label("ab\"", out, 4), 2);
    assert_string_equal(out, "ab");
    assert_int_equal(kvedge_metrics_escape_label("ab\"", out, 5), 4);
    assert_string_equal(out, "ab\\\"");
}

/* Label values: cut at 128 bytes on a character boundary; bytes that are not UTF-8 become
 * '?'; NULL reads as "". */
static void test_label_values(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    const char *const lab[] = {"v"};
    kvedge_metric_t *m = kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "lv", "Values.", lab, 1,
                                               NULL, 16, why, sizeof why);
    assert_non_null(m);
    char longv[300];
    memset(longv, 'a', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    const char *v[1] = {longv};
    kvedge_series_set(kvedge_metric_series(m, v, 1), 1);
    /* Another value with the same first 128 bytes is the same series. */
    longv[200] = 'b';
    assert_ptr_equal(kvedge_metric_series(m, v, 1), kvedge_metric_series(m, v, 1));
    char cut[200];
    memset(cut, 'a', 127);
    strcpy(cut + 127, "\xc3\xa9"); /* é across the bound */
    v[0] = cut;
    kvedge_series_set(kvedge_metric_series(m, v, 1), 2);
    v[0] = "x\xff\xc3(y";
    kvedge_series_set(kvedge_metric_series(m, v, 1), 3);
    v[0] = NULL;
    kvedge_series_set(kvedge_metric_series(m, v, 1), 4);

    char *text = kvedge_metrics_render(r, NULL);
    assert_non_null(text);
    char want[400];
    snprintf(want, sizeof want, "lv{v=\"%.128s\"} 1\n", longv);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof want, "lv{v=\"%.127s\"} 2\n", cut);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "lv{v=\"x?\?(y\"} 3\n"));
    assert_non_null(strstr(text, "lv{v=\"\"} 4\n"));
    assert_int_equal(s_count_lines(text, "lv{"), 4);
    free(text);
    kvedge_metrics_destroy(&r);
}

static void test_bounded_cardinality(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    const char *const lab[] = {"model", "tenant"};
    kvedge_metric_t *m = kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "hits_total", "Hits.", lab,
                                               2, NULL, 10, why, sizeof why);
    assert_non_null(m);
    char model[32];
    const char *v[2] = {model, "t"};
    kvedge_series_t *first[10];
    for (int i = 0; i < 100000; i++) {
        snprintf(model, sizeof model, "m%d", i);
        kvedge_series_t *s = kvedge_metric_series(m, v, 2);
        assert_non_null(s);
        if (i < 10)
            first[i] = s;
        kvedge_series_inc(s);
    }
    /* The first ten kept their own series; everything after folded into one. */
    for (int i = 0; i < 10; i++) {
        snprintf(model, sizeof model, "m%d", i);
        assert_ptr_equal(kvedge_metric_series(m, v, 2), first[i]);
        assert_true(kvedge_series_value(first[i]) == 1);
    }
    snprintf(model, sizeof model, "m%d", 99999);
    kvedge_series_t *other = kvedge_metric_series(m, v, 2);
    const char *const ov[] = {KVEDGE_METRICS_OTHER, KVEDGE_METRICS_OTHER};
    assert_ptr_equal(kvedge_metric_series(m, ov, 2), other);
    assert_true(kvedge_series_value(other) == 99990);

    char *text = kvedge_metrics_render(r, NULL);
    assert_non_null(text);
    assert_int_equal(s_count_lines(text, "hits_total{"), 11);
    assert_non_null(strstr(text, "hits_total{model=\"_other\",tenant=\"_other\"} 99990\n"));
    assert_non_null(strstr(text, "hits_total{model=\"m0\",tenant=\"t\"} 1\n"));
    free(text);

    /* Asking for the "_other" label set before the bound hands out the overflow series and
     * makes no second series with the same labels. */
    kvedge_metric_t *m2 =
        kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "g2", "G.", lab, 2, NULL, 5, why, sizeof why);
    assert_non_null(m2);
    kvedge_series_set(kvedge_metric_series(m2, ov, 2), 7);
    text = kvedge_metrics_render(r, NULL);
    assert_int_equal(s_count_lines(text, "g2{"), 1);
    assert_non_null(strstr(text, "g2{model=\"_other\",tenant=\"_other\"} 7\n"));
    free(text);
    kvedge_metrics_destroy(&r);
}

/* kvedge_metric_reset: a top-K view rebuilt at every scrape renders only its latest label
 * sets, reuses the series it let go, and leaves old pointers valid. */
static void test_reset(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    const char *const lab[] = {"rank", "key"};
    kvedge_metric_t *m = kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "hot", "Top keys.", lab, 2,
                                               NULL, 4, why, sizeof why);
    kvedge_histogram_spec_t spec = {1, 2, 1.0};
    kvedge_metric_t *h = kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "hh", "", lab, 2, &spec,
                                               2, why, sizeof why);
    kvedge_metric_t *plain = kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "p_total", "", NULL, 0,
                                                   NULL, 0, why, sizeof why);
    assert_non_null(m);
    assert_non_null(h);
    assert_non_null(plain);
    kvedge_series_t *old = NULL;
    char rank[16], key[24];
    const char *v[] = {rank, key};
    for (int round = 0; round < 1000; round++) {
        kvedge_metric_reset(m);
        kvedge_metric_reset(h);
        int n = round == 0 ? 6 : 3; /* the first round overflows */
        for (int i = 0; i < n; i++) {
            snprintf(rank, sizeof rank, "%d", i + 1);
            snprintf(key, sizeof key, "k%d", round * 10 + i);
            kvedge_series_t *s = kvedge_metric_series(m, v, 2);
            assert_true(kvedge_series_value(s) == 0 || i >= 4); /* fresh, or the overflow */
            kvedge_series_gauge_add(s, 1);
            kvedge_series_observe(kvedge_metric_series(h, v, 2), 2);
            if (round == 0 && i == 0)
                old = s;
        }
    }
    kvedge_series_set(old, 5); /* still a valid series (standing for some label set now) */
    kvedge_metric_reset(m);
    const char *const v1[] = {"1", "new"};
    kvedge_series_t *s = kvedge_metric_series(m, v1, 2);
    assert_true(kvedge_series_value(s) == 0);
    kvedge_series_set(s, 9);
    kvedge_series_add(kvedge_metric_plain(plain), 3);
    kvedge_metric_reset(plain);
    char *text = kvedge_metrics_render(r, NULL);
    assert_non_null(text);
    assert_int_equal(s_count_lines(text, "hot{"), 1);
    assert_non_null(strstr(text, "hot{rank=\"1\",key=\"new\"} 9\n"));
    /* The histogram holds the last round's three sets: two of its own and the overflow. */
    assert_int_equal(s_count_lines(text, "hh_count{"), 3);
    assert_non_null(strstr(text, "hh_count{rank=\"_other\",key=\"_other\"} 1\n"));
    assert_non_null(strstr(text, "hh_bucket{rank=\"1\",key=\"k9990\",le=\"2\"} 1\n"));
    assert_non_null(strstr(text, "p_total 0\n"));
    free(text);
    kvedge_metric_reset(NULL);
    kvedge_metrics_destroy(&r);
}

/* Each refused declaration returns NULL and says why. */
static void test_refused(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    const char *const ok_lab[] = {"a"};
    kvedge_histogram_spec_t spec = {1, 8, 1.0};
    struct {
        kvedge_metric_type_t type;
        const char *name;
        const char *const *labels;
        size_t n_labels;
        const kvedge_histogram_spec_t *hist;
        size_t max_series;
        const char *why_has;
    } bad[] = {
        {KVEDGE_METRIC_GAUGE, "1abc", NULL, 0, NULL, 0, "1abc"},
        {KVEDGE_METRIC_GAUGE, "", NULL, 0, NULL, 0, "metric name"},
        {KVEDGE_METRIC_GAUGE, NULL, NULL, 0, NULL, 0, "(null)"},
        {KVEDGE_METRIC_GAUGE, "a-b", NULL, 0, NULL, 0, "a-b"},
        {KVEDGE_METRIC_GAUGE, "a b", NULL, 0, NULL, 0, "a b"},
        {KVEDGE_METRIC_COUNTER, "requests", NULL, 0, NULL, 0, "_total"},
        {KVEDGE_METRIC_COUNTER, "_total", NULL, 0, NULL, 0, "_total"},
        {(kvedge_metric_type_t)7, "x", NULL, 0, NULL, 0, "type"},
        {KVEDGE_METRIC_GAUGE, "x", (const char *const[]){"__x"}, 1, NULL, 4, "__x"},
        {KVEDGE_METRIC_GAUGE, "x", (const char *const[]){"le"}, 1, NULL, 4, "le"},
        {KVEDGE_METRIC_GAUGE, "x", (const char *const[]){"a:b"}, 1, NULL, 4, "a:b"},
        {KVEDGE_METRIC_GAUGE, "x", (const char *const[]){"9a"}, 1, NULL, 4, "9a"},
        {KVEDGE_METRIC_GAUGE, "x", (const char *const[]){NULL}, 1, NULL, 4, "(null)"},
        {KVEDGE_METRIC_GAUGE, "x", (const char *const[]){"a", "a"}, 2, NULL, 4, "twice"},
        {KVEDGE_METRIC_GAUGE, "x", (const char *const[]){"a", "b", "c", "d", "e"}, 5, NULL, 4,
         "labels"},
        {KVEDGE_METRIC_GAUGE, "x", NULL, 1, NULL, 4, "label names"},
        {KVEDGE_METRIC_GAUGE, "x", ok_lab, 1, NULL, 0, "max_series"},
        {KVEDGE_METRIC_GAUGE, "x", ok_lab, 1, NULL, KVEDGE_METRICS_MAX_SERIES + 1, "max_series"},
        {KVEDGE_METRIC_HISTOGRAM, "x", NULL, 0, NULL, 0, "histogram"},
        {KVEDGE_METRIC_HISTOGRAM, "x", NULL, 0, &(kvedge_histogram_spec_t){0, 8, 1}, 0,
         "histogram"},
        {KVEDGE_METRIC_HISTOGRAM, "x", NULL, 0, &(kvedge_histogram_spec_t){1, 0, 1}, 0,
         "histogram"},
        {KVEDGE_METRIC_HISTOGRAM, "x", NULL, 0, &(kvedge_histogram_spec_t){1, 41, 1}, 0,
         "histogram"},
        {KVEDGE_METRIC_HISTOGRAM, "x", NULL, 0, &(kvedge_histogram_spec_t){1, 8, 0}, 0,
         "histogram"},
        {KVEDGE_METRIC_HISTOGRAM, "x", NULL, 0, &(kvedge_histogram_spec_t){1, 8, NAN}, 0,
         "histogram"},
        {KVEDGE_METRIC_HISTOGRAM, "x", NULL, 0, &(kvedge_histogram_spec_t){1u << 30, 40, 1}, 0,
         "histogram"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        assert_null(kvedge_metrics_family(r, bad[i].type, bad[i].name, "h", bad[i].labels,
                                          bad[i].n_labels, bad[i].hist, bad[i].max_series, why,
                                          sizeof why));
        if (!strstr(why, bad[i].why_has))
            fail_msg("case %zu: why \"%s\" lacks \"%s\"", i, why, bad[i].why_has);
    }
    /* NULL why is fine. */
    assert_null(
        kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "1x", "h", NULL, 0, NULL, 0, NULL, 0));
    assert_null(kvedge_metrics_family(NULL, KVEDGE_METRIC_GAUGE, "x", "h", NULL, 0, NULL, 0, why,
                                      sizeof why));

    /* Duplicates, and names a histogram's samples would collide with. */
    assert_non_null(kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "h", NULL, NULL, 0, &spec, 0,
                                          why, sizeof why));
    assert_non_null(
        kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "g", "", NULL, 0, NULL, 0, why, sizeof why));
    const char *clash[] = {"h", "h_count", "h_sum", "h_bucket", "g"};
    for (size_t i = 0; i < sizeof clash / sizeof clash[0]; i++) {
        why[0] = '\0';
        assert_null(kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, clash[i], "", NULL, 0, NULL, 0,
                                          why, sizeof why));
        assert_non_null(strstr(why, "clashes"));
    }
    why[0] = '\0';
    assert_null(kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "g", NULL, NULL, 0, &spec, 0, why,
                                      sizeof why));
    assert_non_null(strstr(why, "clashes"));
    /* A gauge "x_count" first, then a histogram "x". */
    assert_non_null(kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "x_count", "", NULL, 0, NULL, 0,
                                          why, sizeof why));
    assert_null(kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "x", "", NULL, 0, &spec, 0, why,
                                      sizeof why));
    assert_non_null(strstr(why, "x_count"));
    /* A help of "" prints no trailing blank. */
    char *text = kvedge_metrics_render(r, NULL);
    assert_non_null(strstr(text, "# HELP g\n# TYPE g gauge\ng 0\n"));
    free(text);

    /* Labelled families: wrong number of values is refused; a plain series does not exist. */
    kvedge_metric_t *lf = kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "lf", "", ok_lab, 1, NULL,
                                                2, why, sizeof why);
    assert_non_null(lf);
    assert_null(kvedge_metric_plain(lf));
    assert_null(kvedge_metric_series(lf, ok_lab, 0));
    assert_null(kvedge_metric_series(lf, ok_lab, 2));
    assert_non_null(kvedge_metric_series(lf, NULL, 1)); /* NULL values read as "" */

    /* The registry holds at most KVEDGE_METRICS_MAX_FAMILIES families. */
    kvedge_metrics_t *full = kvedge_metrics_new();
    char name[32];
    for (int i = 0; i < KVEDGE_METRICS_MAX_FAMILIES; i++) {
        snprintf(name, sizeof name, "f%d", i);
        assert_non_null(kvedge_metrics_family(full, KVEDGE_METRIC_GAUGE, name, "", NULL, 0, NULL, 0,
                                              why, sizeof why));
    }
    assert_null(kvedge_metrics_family(full, KVEDGE_METRIC_GAUGE, "one_more", "", NULL, 0, NULL, 0,
                                      why, sizeof why));
    assert_non_null(strstr(why, "256"));
    kvedge_metrics_destroy(&full);
    kvedge_metrics_destroy(&r);
}

static void test_quantile(void **state)
{
    (void)state;
    /* Bounds 10, 20, 40, 80; counts per bucket 2, 4, 4, 0 and 2 in +Inf: 12 in all. */
    kvedge_histogram_spec_t spec = {10, 4, 1.0};
    const uint64_t cum[] = {2, 6, 10, 10};
    /* rank = q·12; inside bucket b: lo + (hi - lo)·(rank - below)/in_bucket. */
    assert_true(fabs(kvedge_histogram_quantile(&spec, cum, 12, 0.5) - 20.0) < 1e-9);
    assert_true(fabs(kvedge_histogram_quantile(&spec, cum, 12, 0.25) - 12.5) < 1e-9);
    assert_true(fabs(kvedge_histogram_quantile(&spec, cum, 12, 0.75) - 35.0) < 1e-9);
    assert_true(fabs(kvedge_histogram_quantile(&spec, cum, 12, 0.1) - 6.0) < 1e-9);
    assert_true(fabs(kvedge_histogram_quantile(&spec, cum, 12, 0.0) - 0.0) < 1e-9);
    /* In the +Inf bucket: the largest finite bound. */
    assert_true(kvedge_histogram_quantile(&spec, cum, 12, 0.95) == 80.0);
    assert_true(kvedge_histogram_quantile(&spec, cum, 12, 1.0) == 80.0);
    assert_true(kvedge_histogram_quantile(&spec, cum, 12, 7.0) == 80.0); /* clamped to 1 */
    assert_true(kvedge_histogram_quantile(&spec, cum, 0, 0.5) == 0);
    assert_true(kvedge_histogram_quantile(NULL, cum, 12, 0.5) == 0);
    assert_true(kvedge_histogram_quantile(&spec, NULL, 12, 0.5) == 0);
    /* Empty leading buckets: q = 0 lands in the first bucket that holds anything. */
    const uint64_t cum2[] = {0, 0, 4, 4};
    assert_true(fabs(kvedge_histogram_quantile(&spec, cum2, 4, 0.0) - 20.0) < 1e-9);
    assert_true(fabs(kvedge_histogram_quantile(&spec, cum2, 4, 0.5) - 30.0) < 1e-9);

    /* From a live series: 100 observations of 1 … 100 µs in the latency layout. */
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    kvedge_metric_t *m = kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "q_seconds", "", NULL, 0,
                                               &kvedge_histogram_latency_us, 0, why, sizeof why);
    for (uint64_t v = 1; v <= 100; v++)
        kvedge_series_observe(kvedge_metric_plain(m), v);
    uint64_t c[KVEDGE_METRICS_MAX_BUCKETS];
    uint64_t n = kvedge_series_hist(kvedge_metric_plain(m), NULL, c, 23);
    assert_int_equal(n, 100);
    /* Bounds 10, 20, 40, 80, 160 hold 10, 20, 40, 80, 100: the median is in (40, 80] at
     * (50 - 40)/40 of the way: 50. p99 in (80, 160]: 80 + 80·(99 - 80)/20 = 156. */
    assert_true(fabs(kvedge_histogram_quantile(&kvedge_histogram_latency_us, c, n, 0.5) - 50) <
                1e-9);
    assert_true(fabs(kvedge_histogram_quantile(&kvedge_histogram_latency_us, c, n, 0.99) - 156) <
                1e-9);
    kvedge_metrics_destroy(&r);
}

#define THREADS       4
#define PER_THREAD    250000
#define THREAD_SERIES 8 /* label sets the threads share, made concurrently */
typedef struct {
    kvedge_metric_t *counter, *gauge, *hist;
    int id;
} s_worker_t;

static void *s_worker(void *arg)
{
    s_worker_t *w = arg;
    kvedge_series_t *s[THREAD_SERIES];
    for (int i = 0; i < THREAD_SERIES; i++) {
        char v[8];
        snprintf(v, sizeof v, "s%d", i);
        const char *vals[] = {v};
        s[i] = kvedge_metric_series(w->counter, vals, 1);
    }
    kvedge_series_t *g = kvedge_metric_plain(w->gauge), *h = kvedge_metric_plain(w->hist);
    for (int i = 0; i < PER_THREAD; i++) {
        kvedge_series_inc(s[i % THREAD_SERIES]);
        kvedge_series_gauge_add(g, 1.0);
        kvedge_series_observe(h, (uint64_t)(i % 1000));
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    const char *const lab[] = {"s"};
    s_worker_t w[THREADS];
    w[0].counter = kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "ops_total", "", lab, 1, NULL,
                                         64, why, sizeof why);
    w[0].gauge =
        kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "level", "", NULL, 0, NULL, 0, why, 256);
    w[0].hist = kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "op_bytes", "", NULL, 0,
                                      &kvedge_histogram_bytes, 0, why, sizeof why);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = w[0];
        w[i].id = i;
        assert_int_equal(pthread_create(&t[i], NULL, s_worker, &w[i]), 0);
    }
    /* Renders while they run: never torn, +Inf always equals _count. */
    for (int k = 0; k < 20; k++) {
        char *text = kvedge_metrics_render(r, NULL);
        assert_non_null(text);
        free(text);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    double total = 0;
    for (int i = 0; i < THREAD_SERIES; i++) {
        char v[8];
        snprintf(v, sizeof v, "s%d", i);
        const char *vals[] = {v};
        double x = kvedge_series_value(kvedge_metric_series(w[0].counter, vals, 1));
        assert_true(x == (double)THREADS * PER_THREAD / THREAD_SERIES);
        total += x;
    }
    assert_true(total == (double)THREADS * PER_THREAD);
    assert_true(kvedge_series_value(kvedge_metric_plain(w[0].gauge)) ==
                (double)THREADS * PER_THREAD);
    uint64_t sum;
    assert_int_equal(kvedge_series_hist(kvedge_metric_plain(w[0].hist), &sum, NULL, 0),
                     (uint64_t)THREADS * PER_THREAD);
    assert_int_equal(sum, (uint64_t)THREADS * (PER_THREAD / 1000) * (999 * 1000 / 2));
    char *text = kvedge_metrics_render(r, NULL);
    assert_int_equal(s_count_lines(text, "ops_total{"), THREAD_SERIES);
    free(text);
    kvedge_metrics_destroy(&r);
}

typedef struct {
    kvedge_series_t *s;
    int calls;
} s_hook_t;

static void s_hook(kvedge_metrics_t *r, void *arg)
{
    (void)r;
    s_hook_t *h = arg;
    h->calls++;
    kvedge_series_set(h->s, (double)h->calls * 10);
}

static void test_on_collect(void **state)
{
    (void)state;
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    kvedge_metric_t *m = kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "blocks", "Blocks.", NULL, 0,
                                               NULL, 0, why, sizeof why);
    s_hook_t h = {kvedge_metric_plain(m), 0};
    assert_int_equal(kvedge_metrics_on_collect(r, s_hook, &h), 0);
    char *text = kvedge_metrics_render(r, NULL);
    assert_non_null(strstr(text, "blocks 10\n"));
    free(text);
    text = kvedge_metrics_render(r, NULL);
    assert_non_null(strstr(text, "blocks 20\n"));
    free(text);
    for (int i = 1; i < 8; i++)
        assert_int_equal(kvedge_metrics_on_collect(r, s_hook, &h), 0);
    assert_int_equal(kvedge_metrics_on_collect(r, s_hook, &h), -1);
    text = kvedge_metrics_render(r, NULL);
    assert_int_equal(h.calls, 10);
    free(text);
    kvedge_metrics_destroy(&r);
}

/* promtool (Debian's prometheus package) parses and lints a render; skipped without it. */
static void test_promtool(void **state)
{
    (void)state;
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        print_message("promtool not on PATH: the promtool check is skipped\n");
        skip();
    }
    kvedge_metrics_t *r = kvedge_metrics_new();
    char why[WHY_BYTES];
    const char *const lab[] = {"model", "path"};
    kvedge_metric_t *c =
        kvedge_metrics_family(r, KVEDGE_METRIC_COUNTER, "kvedge_requests_total",
                              "Requests served, by model.", lab, 2, NULL, 3, why, sizeof why);
    kvedge_metric_t *g =
        kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "kvedge_blocks", "Blocks \\ stored\nnow.",
                              NULL, 0, NULL, 0, why, sizeof why);
    kvedge_metric_t *h =
        kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "kvedge_fetch_seconds", "Fetch latency.",
                              lab, 2, &kvedge_histogram_latency_us, 4, why, sizeof why);
    kvedge_metric_t *b =
        kvedge_metrics_family(r, KVEDGE_METRIC_HISTOGRAM, "kvedge_fetch_bytes", "Fetch sizes.",
                              NULL, 0, &kvedge_histogram_bytes, 0, why, sizeof why);
    kvedge_metric_t *e = kvedge_metrics_family(r, KVEDGE_METRIC_GAUGE, "kvedge_sources_up",
                                               "Sources up.", lab, 2, NULL, 4, why, sizeof why);
    assert_non_null(c);
    assert_non_null(g);
    assert_non_null(h);
    assert_non_null(b);
    assert_non_null(e);
    char model[16];
    for (int i = 0; i < 6; i++) {
        snprintf(model, sizeof model, "m\"%d\\\n", i);
        const char *v[] = {model, "/a/b"};
        kvedge_series_add(kvedge_metric_series(c, v, 2), (uint64_t)i + 1);
        kvedge_series_observe(kvedge_metric_series(h, v, 2), (uint64_t)i * 1000);
    }
    kvedge_series_set(kvedge_metric_plain(g), NAN);
    kvedge_series_observe(kvedge_metric_plain(b), 1u << 20);
    size_t len;
    char *text = kvedge_metrics_render(r, &len);
    assert_non_null(text);
    char path[] = "/tmp/kvedge_test_metrics_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
    int rc = system(cmd);
    unlink(path);
    if (rc != 0)
        fail_msg("promtool check metrics rejected the render (status %d):\n%s", rc, text);
    free(text);
    kvedge_metrics_destroy(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_codes),
        cmocka_unit_test(test_degenerate),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_render_exact),
        cmocka_unit_test(test_render_stock_layouts),
        cmocka_unit_test(test_escape_label),
        cmocka_unit_test(test_label_values),
        cmocka_unit_test(test_bounded_cardinality),
        cmocka_unit_test(test_reset),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_quantile),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_on_collect),
        cmocka_unit_test(test_promtool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
