/* Heavy hitters: exact counts while the keys fit, replacement of the smallest count, the
 * Space-Saving guarantees on a Zipf stream, fixed memory through 100 000 distinct prefixes,
 * the merge of four tables, per-layer and per-head counts with clamping, labels, reset and
 * the degenerate inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monitor/hot.h"

#define ZIPF_KEYS 5000   /* distinct keys of the Zipf stream */
#define ZIPF_N    200000 /* accesses of the Zipf stream */

/* Key i: its index in the first 8 bytes, a fixed pattern after. */
static void s_key(uint64_t i, uint8_t key[KVEDGE_HOT_KEY_BYTES])
{
    memset(key, 0x5a, KVEDGE_HOT_KEY_BYTES);
    memcpy(key, &i, sizeof i);
}

static uint64_t s_key_id(const uint8_t key[KVEDGE_HOT_KEY_BYTES])
{
    uint64_t i;
    memcpy(&i, key, sizeof i);
    return i;
}

static void s_touch(kvedge_hot_t *h, uint64_t i)
{
    uint8_t k[KVEDGE_HOT_KEY_BYTES];
    s_key(i, k);
    kvedge_hot_touch(h, k, "m", 0, 0, 1);
}

static uint64_t s_rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A Zipf(1.1) stream over ZIPF_KEYS keys, by inverse CDF: stream[i] is a key id, truth[k] how
 * often key k occurs. */
static void s_zipf(uint64_t seed, uint32_t *stream, uint64_t *truth)
{
    double *cdf = malloc(ZIPF_KEYS * sizeof *cdf), total = 0;
    for (int k = 0; k < ZIPF_KEYS; k++)
        total += 1.0 / pow(k + 1, 1.1);
    double acc = 0;
    for (int k = 0; k < ZIPF_KEYS; k++) {
        acc += 1.0 / pow(k + 1, 1.1) / total;
        cdf[k] = acc;
    }
    memset(truth, 0, ZIPF_KEYS * sizeof *truth);
    uint64_t s = seed;
    for (int i = 0; i < ZIPF_N; i++) {
        double u = (double)(s_rng(&s) >> 11) / 9007199254740992.0;
        int lo = 0, hi = ZIPF_KEYS - 1;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        /* Scatter ranks over ids so the heavy keys are not simply the small ids. */
        uint32_t id = (uint32_t)((uint64_t)lo * 2654435761u % ZIPF_KEYS);
        stream[i] = id;
        truth[id]++;
    }
    free(cdf);
}

/* Checks the Space-Saving bounds of entries against the truth, and that every key with a
 * true count above threshold is among them. */
static void s_check_bounds(const kvedge_hot_entry_t *e, size_t n, const uint64_t *truth,
                           uint64_t threshold)
{
    bool *seen = calloc(ZIPF_KEYS, sizeof *seen);
    for (size_t i = 0; i < n; i++) {
        uint64_t id = s_key_id(e[i].key);
        assert_true(id < ZIPF_KEYS);
        assert_false(seen[id]);
        seen[id] = true;
        if (!(e[i].count - e[i].error <= truth[id] && truth[id] <= e[i].count))
            fail_msg("key %llu: count %llu error %llu truth %llu", (unsigned long long)id,
                     (unsigned long long)e[i].count, (unsigned long long)e[i].error,
                     (unsigned long long)truth[id]);
        if (i > 0)
            assert_true(e[i - 1].count > e[i].count ||
                        (e[i - 1].count == e[i].count && e[i - 1].error <= e[i].error));
    }
    size_t heavy = 0;
    for (uint64_t k = 0; k < ZIPF_KEYS; k++) {
        if (truth[k] > threshold) {
            heavy++;
            if (!seen[k])
                fail_msg("heavy key %llu (true count %llu > %llu) not reported",
                         (unsigned long long)k, (unsigned long long)truth[k],
                         (unsigned long long)threshold);
        }
    }
    assert_true(heavy >= 2); /* the stream has heavy hitters to find */
    free(seen);
}

static void test_degenerate(void **state)
{
    (void)state;
    assert_null(kvedge_hot_new(0));
    assert_null(kvedge_hot_new(KVEDGE_HOT_MAX_CAPACITY + 1));
    kvedge_hot_destroy(NULL);
    kvedge_hot_t *h = NULL;
    kvedge_hot_destroy(&h);
    assert_int_equal(kvedge_hot_bytes(NULL), 0);
    assert_int_equal(kvedge_hot_total(NULL), 0);
    assert_int_equal(kvedge_hot_admitted(NULL), 0);
    kvedge_hot_reset(NULL);
    uint8_t k[KVEDGE_HOT_KEY_BYTES] = {0};
    kvedge_hot_touch(NULL, k, NULL, 0, 0, 0);

    h = kvedge_hot_new(1);
    assert_non_null(h);
    kvedge_hot_touch(h, NULL, NULL, 0, 0, 0); /* ignored */
    kvedge_hot_entry_t e;
    assert_int_equal(kvedge_hot_top(&h, 1, &e, 1), 0);
    assert_int_equal(kvedge_hot_top(NULL, 1, &e, 1), 0);
    assert_int_equal(kvedge_hot_top(&h, 0, &e, 1), 0);
    assert_int_equal(kvedge_hot_top(&h, 1, NULL, 1), 0);
    assert_int_equal(kvedge_hot_top(&h, 1, &e, 0), 0);
    /* Capacity 1: every new key replaces the last. */
    s_touch(h, 1);
    s_touch(h, 1);
    s_touch(h, 2);
    assert_int_equal(kvedge_hot_top(&h, 1, &e, 1), 1);
    assert_int_equal(s_key_id(e.key), 2);
    assert_int_equal(e.count, 3);
    assert_int_equal(e.error, 2);
    assert_int_equal(kvedge_hot_total(h), 3);
    assert_int_equal(kvedge_hot_admitted(h), 2);
    kvedge_hot_destroy(&h);
    assert_null(h);
    h = kvedge_hot_new(KVEDGE_HOT_MAX_CAPACITY);
    assert_non_null(h);
    kvedge_hot_destroy(&h);
}

static void test_exact(void **state)
{
    (void)state;
    kvedge_hot_t *h = kvedge_hot_new(16);
    /* Key i touched i + 1 times, in an interleaved order. */
    for (int round = 0; round < 10; round++)
        for (uint64_t i = 0; i < 10; i++)
            if ((uint64_t)round <= i)
                s_touch(h, i);
    kvedge_hot_entry_t *e = calloc(16, sizeof *e);
    assert_int_equal(kvedge_hot_top(&h, 1, e, 16), 10);
    for (size_t i = 0; i < 10; i++) {
        assert_int_equal(s_key_id(e[i].key), 9 - i);
        assert_int_equal(e[i].count, 10 - i);
        assert_int_equal(e[i].error, 0);
        assert_int_equal(e[i].bytes, 10 - i);
        assert_string_equal(e[i].label, "m");
    }
    /* n smaller than the table: the top n. */
    assert_int_equal(kvedge_hot_top(&h, 1, e, 3), 3);
    assert_int_equal(s_key_id(e[2].key), 7);
    assert_int_equal(kvedge_hot_total(h), 55);
    assert_int_equal(kvedge_hot_admitted(h), 10);
    free(e);
    kvedge_hot_destroy(&h);
}

/* Full table: a new key replaces the smallest count m and starts at m + 1 with error m. */
static void test_replacement(void **state)
{
    (void)state;
    kvedge_hot_t *h = kvedge_hot_new(3);
    for (int i = 0; i < 5; i++)
        s_touch(h, 1);
    for (int i = 0; i < 3; i++)
        s_touch(h, 2);
    for (int i = 0; i < 2; i++)
        s_touch(h, 3);
    s_touch(h, 4); /* replaces 3 (count 2): 4 gets 3, error 2 */
    s_touch(h, 5); /* smallest is now 2 or 4 at 3, ties: either; gets 4, error 3 */
    kvedge_hot_entry_t e[3];
    assert_int_equal(kvedge_hot_top(&h, 1, e, 3), 3);
    assert_int_equal(s_key_id(e[0].key), 1);
    assert_int_equal(e[0].count, 5);
    assert_int_equal(s_key_id(e[1].key), 5);
    assert_int_equal(e[1].count, 4);
    assert_int_equal(e[1].error, 3);
    assert_int_equal(e[2].count, 3);
    assert_int_equal(kvedge_hot_admitted(h), 5);
    kvedge_hot_destroy(&h);
}

static void test_zipf_guarantees(void **state)
{
    (void)state;
    uint32_t *stream = malloc(ZIPF_N * sizeof *stream);
    uint64_t *truth = malloc(ZIPF_KEYS * sizeof *truth);
    s_zipf(1, stream, truth);
    const size_t caps[] = {20, 50, 200};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        size_t k = caps[c];
        kvedge_hot_t *h = kvedge_hot_new(k);
        for (int i = 0; i < ZIPF_N; i++)
            s_touch(h, stream[i]);
        kvedge_hot_entry_t *e = calloc(k, sizeof *e);
        size_t n = kvedge_hot_top(&h, 1, e, k);
        assert_int_equal(n, k);
        s_check_bounds(e, n, truth, ZIPF_N / k);
        /* Errors are at most N/k. */
        for (size_t i = 0; i < n; i++)
            assert_true(e[i].error <= ZIPF_N / k);
        assert_int_equal(kvedge_hot_total(h), ZIPF_N);
        free(e);
        kvedge_hot_destroy(&h);
    }
    free(truth);
    free(stream);
}

static void test_fixed_memory(void **state)
{
    (void)state;
    kvedge_hot_t *h = kvedge_hot_new(256);
    size_t bytes = kvedge_hot_bytes(h);
    assert_true(bytes >= 256 * sizeof(kvedge_hot_entry_t) / 2);
    for (uint64_t i = 0; i < 100000; i++) {
        uint8_t k[KVEDGE_HOT_KEY_BYTES];
        s_key(i, k);
        kvedge_hot_touch(h, k, "model-with-a-long-name", (uint32_t)(i % 300), (uint32_t)i, 4096);
    }
    assert_int_equal(kvedge_hot_bytes(h), bytes);
    assert_int_equal(kvedge_hot_total(h), 100000);
    assert_int_equal(kvedge_hot_admitted(h), 100000);
    kvedge_hot_entry_t *e = calloc(256, sizeof *e);
    assert_int_equal(kvedge_hot_top(&h, 1, e, 1000), 256);
    /* 100000 accesses over 256 slots: counts are about 100000/256 with errors to match. */
    for (size_t i = 0; i < 256; i++)
        assert_true(e[i].count - e[i].error == 1);
    free(e);
    kvedge_hot_destroy(&h);
}

static void test_merge(void **state)
{
    (void)state;
    uint32_t *stream = malloc(ZIPF_N * sizeof *stream);
    uint64_t *truth = malloc(ZIPF_KEYS * sizeof *truth);
    s_zipf(7, stream, truth);
    enum { TABLES = 4, K = 64 };
    kvedge_hot_t *t[TABLES];
    for (int i = 0; i < TABLES; i++)
        t[i] = kvedge_hot_new(K);
    /* Each worker thread sees a random share of the stream. */
    uint64_t s = 99;
    for (int i = 0; i < ZIPF_N; i++)
        s_touch(t[s_rng(&s) % TABLES], stream[i]);
    kvedge_hot_entry_t *e = calloc(K, sizeof *e);
    size_t n = kvedge_hot_top(t, TABLES, e, K);
    assert_int_equal(n, K); /* at most the capacity, though the union holds more */
    s_check_bounds(e, n, truth, ZIPF_N / K);
    /* The merged top five are the true top five. */
    uint64_t *sorted = malloc(ZIPF_KEYS * sizeof *sorted);
    memcpy(sorted, truth, ZIPF_KEYS * sizeof *sorted);
    for (int i = 0; i < 5; i++) {
        int best = i;
        for (int j = i + 1; j < ZIPF_KEYS; j++)
            if (sorted[j] > sorted[best])
                best = j;
        uint64_t x = sorted[i];
        sorted[i] = sorted[best];
        sorted[best] = x;
        assert_int_equal(truth[s_key_id(e[i].key)], sorted[i]);
    }
    /* Bytes and layer counts add over the tables. */
    uint64_t id0 = s_key_id(e[0].key);
    assert_int_equal(e[0].bytes, truth[id0]);
    assert_int_equal(e[0].layers[0], truth[id0]);
    /* A table named twice counts once; NULL tables are skipped. */
    kvedge_hot_t *dup[] = {t[0], NULL, t[0]};
    kvedge_hot_entry_t a[4], b[4];
    assert_int_equal(kvedge_hot_top(dup, 3, a, 4), 4);
    assert_int_equal(kvedge_hot_top(t, 1, b, 4), 4);
    for (int i = 0; i < 4; i++) {
        assert_memory_equal(a[i].key, b[i].key, KVEDGE_HOT_KEY_BYTES);
        assert_int_equal(a[i].count, b[i].count);
    }
    free(sorted);
    free(e);
    for (int i = 0; i < TABLES; i++)
        kvedge_hot_destroy(&t[i]);
    free(truth);
    free(stream);
}

/* The merge rule by hand: a key missing from a full table gets that table's minimum as count
 * and error; from a table that is not full, nothing. */
static void test_merge_rule(void **state)
{
    (void)state;
    kvedge_hot_t *t[3] = {kvedge_hot_new(2), kvedge_hot_new(2), kvedge_hot_new(8)};
    for (int i = 0; i < 5; i++)
        s_touch(t[0], 1);
    for (int i = 0; i < 3; i++)
        s_touch(t[0], 2); /* t0 full: {1: 5, 2: 3}, minimum 3 */
    for (int i = 0; i < 4; i++)
        s_touch(t[1], 3);
    s_touch(t[1], 4); /* t1 full: {3: 4, 4: 1}, minimum 1 */
    s_touch(t[2], 1); /* t2 not full */
    kvedge_hot_entry_t e[4];
    assert_int_equal(kvedge_hot_top(t, 3, e, 4), 4);
    /* 1: 5 + 1 (t1's min) + 1 = 7, error 1; 3: 4 + 3 = 7, error 3; 2: 3 + 1 = 4, error 1;
     * 4: 1 + 3 = 4, error 3. */
    const uint64_t want[4][3] = {{1, 7, 1}, {3, 7, 3}, {2, 4, 1}, {4, 4, 3}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(s_key_id(e[i].key), want[i][0]);
        assert_int_equal(e[i].count, want[i][1]);
        assert_int_equal(e[i].error, want[i][2]);
    }
    assert_int_equal(e[0].bytes, 6);
    for (int i = 0; i < 3; i++)
        kvedge_hot_destroy(&t[i]);
}

static void test_layers_heads_label(void **state)
{
    (void)state;
    kvedge_hot_t *h = kvedge_hot_new(4);
    uint8_t k[KVEDGE_HOT_KEY_BYTES];
    s_key(42, k);
    char longl[100];
    memset(longl, 'x', sizeof longl - 1);
    longl[sizeof longl - 1] = '\0';
    kvedge_hot_touch(h, k, longl, 3, 5, 100);
    kvedge_hot_touch(h, k, "other", 3, 5, 100); /* the first label stays */
    kvedge_hot_touch(h, k, NULL, 127, 63, 1);
    kvedge_hot_touch(h, k, NULL, 128, 64, 1);
    kvedge_hot_touch(h, k, NULL, UINT32_MAX - 1, UINT32_MAX - 1, 1);
    kvedge_hot_touch(h, k, NULL, 7, UINT32_MAX, 1); /* every head: no head slot */
    uint8_t k2[KVEDGE_HOT_KEY_BYTES];
    s_key(43, k2);
    kvedge_hot_touch(h, k2, NULL, 0, 0, 0);
    kvedge_hot_entry_t e[2];
    assert_int_equal(kvedge_hot_top(&h, 1, e, 2), 2);
    assert_int_equal(s_key_id(e[0].key), 42);
    assert_int_equal(e[0].count, 6);
    assert_int_equal(e[0].bytes, 204);
    assert_int_equal(strlen(e[0].label), KVEDGE_HOT_LABEL_BYTES);
    assert_int_equal(e[0].label[0], 'x');
    assert_int_equal(e[0].layers[3], 2);
    assert_int_equal(e[0].layers[127], 3);
    assert_int_equal(e[0].layers[7], 1);
    assert_int_equal(e[0].heads[5], 2);
    assert_int_equal(e[0].heads[63], 3);
    uint64_t heads = 0, layers = 0;
    for (int i = 0; i < KVEDGE_HOT_HEADS; i++)
        heads += e[0].heads[i];
    for (int i = 0; i < KVEDGE_HOT_LAYERS; i++)
        layers += e[0].layers[i];
    assert_int_equal(heads, 5);
    assert_int_equal(layers, 6);
    assert_string_equal(e[1].label, "");

    /* Reset: counts and keys gone, memory the same. */
    size_t bytes = kvedge_hot_bytes(h);
    kvedge_hot_reset(h);
    assert_int_equal(kvedge_hot_total(h), 0);
    assert_int_equal(kvedge_hot_admitted(h), 0);
    assert_int_equal(kvedge_hot_top(&h, 1, e, 2), 0);
    assert_int_equal(kvedge_hot_bytes(h), bytes);
    kvedge_hot_touch(h, k, NULL, 0, 0, 9);
    assert_int_equal(kvedge_hot_top(&h, 1, e, 2), 1);
    assert_int_equal(e[0].count, 1);
    assert_int_equal(e[0].bytes, 9);
    assert_int_equal(e[0].layers[3], 0); /* the old counts went with the reset */
    kvedge_hot_destroy(&h);
}

/* A random stream with a few hot keys: at every check the bounds hold for every entry, the
 * counts add up to N, and the hot keys are tracked. */
static void test_random_bounds(void **state)
{
    (void)state;
    enum { K = 8, KEYS = 40, STEPS = 20000 };
    kvedge_hot_t *h = kvedge_hot_new(K);
    uint64_t truth[KEYS] = {0};
    uint64_t s = 3;
    for (int step = 1; step <= STEPS; step++) {
        uint64_t key = s_rng(&s) % (s_rng(&s) % 2 ? 3 : KEYS);
        s_touch(h, key);
        truth[key]++;
        if (step % 97 != 0)
            continue;
        kvedge_hot_entry_t e[K];
        assert_int_equal(kvedge_hot_top(&h, 1, e, K), K);
        uint64_t sum = 0;
        bool hot[3] = {false, false, false};
        for (size_t j = 0; j < K; j++) {
            uint64_t id = s_key_id(e[j].key);
            assert_true(e[j].count - e[j].error <= truth[id] && truth[id] <= e[j].count);
            if (id < 3)
                hot[id] = true;
            sum += e[j].count;
        }
        assert_int_equal(sum, step);
        for (int j = 0; j < 3; j++)
            if (truth[j] > (uint64_t)step / K)
                assert_true(hot[j]);
    }
    kvedge_hot_destroy(&h);
}

typedef struct {
    kvedge_hot_t *h;
    uint64_t base;
} s_worker_t;

static void *s_worker(void *arg)
{
    s_worker_t *w = arg;
    for (uint64_t i = 0; i < 50000; i++)
        s_touch(w->h, w->base + i % 100);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    kvedge_hot_t *h = kvedge_hot_new(512);
    pthread_t t[4];
    s_worker_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (s_worker_t){h, (uint64_t)i * 100};
        assert_int_equal(pthread_create(&t[i], NULL, s_worker, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(kvedge_hot_total(h), 200000);
    kvedge_hot_entry_t *e = calloc(512, sizeof *e);
    assert_int_equal(kvedge_hot_top(&h, 1, e, 512), 400);
    for (int i = 0; i < 400; i++)
        assert_int_equal(e[i].count, 500);
    free(e);
    kvedge_hot_destroy(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_degenerate),    cmocka_unit_test(test_exact),
        cmocka_unit_test(test_replacement),   cmocka_unit_test(test_zipf_guarantees),
        cmocka_unit_test(test_fixed_memory),  cmocka_unit_test(test_merge),
        cmocka_unit_test(test_merge_rule),    cmocka_unit_test(test_layers_heads_label),
        cmocka_unit_test(test_random_bounds), cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
