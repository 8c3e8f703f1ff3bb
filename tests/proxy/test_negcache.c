/* Negative cache: expiry at exact boundaries, per-source separation, TTL override and
 * refresh, eviction order at capacity, purge, remove, argument errors, a randomized check
 * against a brute-force model, and concurrent use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "proxy/negcache.h"
#include "access/codec/error.h"

#define T0  500000u /* an arbitrary clock origin */
#define TTL 1000u   /* default TTL of most caches here */

/* Key i as 8 bytes. */
static void s_key(uint64_t i, uint8_t out[8])
{
    memcpy(out, &i, 8);
}

static bool s_has(kvedge_negcache_t *nc, const char *src, uint64_t i, uint64_t now)
{
    uint8_t k[8];
    s_key(i, k);
    return kvedge_negcache_contains(nc, src, k, sizeof k, now);
}

static int s_add(kvedge_negcache_t *nc, const char *src, uint64_t i, uint64_t now, uint64_t ttl)
{
    uint8_t k[8];
    s_key(i, k);
    return kvedge_negcache_add(nc, src, k, sizeof k, now, ttl);
}

static void test_degenerate_and_errors(void **state)
{
    (void)state;
    assert_null(kvedge_negcache_new(0, TTL));
    assert_null(kvedge_negcache_new(4, 0));
    assert_null(kvedge_negcache_new(KVEDGE_NEGCACHE_MAX_ENTRIES + 1, TTL));
    kvedge_negcache_destroy(NULL);
    kvedge_negcache_t *nc = kvedge_negcache_new(4, TTL);
    assert_non_null(nc);
    assert_int_equal(kvedge_negcache_count(nc), 0);
    assert_int_equal(kvedge_negcache_count(NULL), 0);

    uint8_t key[KVEDGE_NEGCACHE_KEY_MAX + 1] = {1, 2, 3};
    char src[KVEDGE_NEGCACHE_SOURCE_MAX + 2];
    memset(src, 's', sizeof src);
    src[KVEDGE_NEGCACHE_SOURCE_MAX + 1] = '\0'; /* 65 chars */
    assert_int_equal(kvedge_negcache_add(nc, src, key, 3, T0, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_add(nc, "", key, 3, T0, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_add(nc, NULL, key, 3, T0, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_add(NULL, "c", key, 3, T0, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_add(nc, "c", NULL, 3, T0, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_add(nc, "c", key, 0, T0, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_add(nc, "c", key, sizeof key, T0, 0), KVEDGE_EINVAL);
    assert_false(kvedge_negcache_contains(nc, src, key, 3, T0));
    assert_false(kvedge_negcache_contains(NULL, "c", key, 3, T0));
    assert_false(kvedge_negcache_contains(nc, "c", key, 0, T0));
    assert_int_equal(kvedge_negcache_remove(nc, "c", key, sizeof key), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_remove(NULL, "c", key, 3), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_purge_expired(NULL, T0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_stats(nc, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_negcache_count(nc), 0);

    /* The longest source and key are fine. */
    src[KVEDGE_NEGCACHE_SOURCE_MAX] = '\0';
    assert_int_equal(kvedge_negcache_add(nc, src, key, KVEDGE_NEGCACHE_KEY_MAX, T0, 0), KVEDGE_OK);
    assert_true(kvedge_negcache_contains(nc, src, key, KVEDGE_NEGCACHE_KEY_MAX, T0));
    assert_int_equal(kvedge_negcache_remove(nc, src, key, KVEDGE_NEGCACHE_KEY_MAX), KVEDGE_OK);
    assert_int_equal(kvedge_negcache_remove(nc, src, key, KVEDGE_NEGCACHE_KEY_MAX),
                     KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_negcache_count(nc), 0);

    kvedge_negcache_destroy(&nc);
    assert_null(nc);
    kvedge_negcache_destroy(&nc);
}

static void test_expiry_boundaries(void **state)
{
    (void)state;
    kvedge_negcache_t *nc = kvedge_negcache_new(16, TTL);
    assert_false(s_has(nc, "cloud-0", 1, T0));
    assert_int_equal(s_add(nc, "cloud-0", 1, T0, 0), KVEDGE_OK);
    assert_int_equal(kvedge_negcache_count(nc), 1);
    assert_true(s_has(nc, "cloud-0", 1, T0));
    assert_true(s_has(nc, "cloud-0", 1, T0 + TTL - 1));
    assert_int_equal(kvedge_negcache_count(nc), 1);
    /* Expired from T0 + TTL on, and dropped by the lookup that noticed. */
    assert_false(s_has(nc, "cloud-0", 1, T0 + TTL));
    assert_int_equal(kvedge_negcache_count(nc), 0);
    assert_false(s_has(nc, "cloud-0", 1, T0)); /* gone, even for an older stamp */

    kvedge_negcache_stats_t st;
    assert_int_equal(kvedge_negcache_stats(nc, &st), KVEDGE_OK);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.misses, 3);
    assert_int_equal(st.expirations, 1);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.capacity, 16);

    /* TTL saturates instead of wrapping. */
    assert_int_equal(s_add(nc, "cloud-0", 2, UINT64_MAX - 5, 100), KVEDGE_OK);
    assert_true(s_has(nc, "cloud-0", 2, UINT64_MAX - 1));
    assert_false(s_has(nc, "cloud-0", 2, UINT64_MAX));
    kvedge_negcache_destroy(&nc);
}

static void test_sources_are_separate(void **state)
{
    (void)state;
    kvedge_negcache_t *nc = kvedge_negcache_new(16, TTL);
    assert_int_equal(s_add(nc, "cloud-0", 7, T0, 0), KVEDGE_OK);
    assert_true(s_has(nc, "cloud-0", 7, T0));
    assert_false(s_has(nc, "edge-1", 7, T0));
    assert_false(s_has(nc, "cloud-0", 8, T0));
    assert_false(s_has(nc, "cloud-", 7, T0));

    /* Source and key are not one concatenated string: ("ab", "c") is not ("a", "bc"). */
    assert_int_equal(kvedge_negcache_add(nc, "ab", "c", 1, T0, 0), KVEDGE_OK);
    assert_false(kvedge_negcache_contains(nc, "a", "bc", 2, T0));
    assert_true(kvedge_negcache_contains(nc, "ab", "c", 1, T0));
    /* Keys are binary: length matters, trailing zeros included. */
    assert_false(kvedge_negcache_contains(nc, "ab", "c\0", 2, T0));

    assert_int_equal(s_add(nc, "edge-1", 7, T0, 0), KVEDGE_OK);
    assert_int_equal(kvedge_negcache_count(nc), 3);
    uint8_t k[8];
    s_key(7, k);
    assert_int_equal(kvedge_negcache_remove(nc, "cloud-0", k, sizeof k), KVEDGE_OK);
    assert_false(s_has(nc, "cloud-0", 7, T0));
    assert_true(s_has(nc, "edge-1", 7, T0));
    kvedge_negcache_destroy(&nc);
}

static void test_ttl_override_and_refresh(void **state)
{
    (void)state;
    kvedge_negcache_t *nc = kvedge_negcache_new(16, TTL);
    assert_int_equal(s_add(nc, "s", 1, T0, 50), KVEDGE_OK);
    assert_int_equal(s_add(nc, "s", 2, T0, 5000), KVEDGE_OK);
    assert_true(s_has(nc, "s", 1, T0 + 49));
    assert_false(s_has(nc, "s", 1, T0 + 50));
    assert_true(s_has(nc, "s", 2, T0 + 4999));
    assert_false(s_has(nc, "s", 2, T0 + 5000));

    /* Re-adding refreshes: the latest observation's expiry wins, longer or shorter. */
    assert_int_equal(s_add(nc, "s", 3, T0, 0), KVEDGE_OK);
    assert_int_equal(s_add(nc, "s", 3, T0 + 900, 0), KVEDGE_OK);
    assert_int_equal(kvedge_negcache_count(nc), 1);
    assert_true(s_has(nc, "s", 3, T0 + 900 + TTL - 1));
    assert_false(s_has(nc, "s", 3, T0 + 900 + TTL));
    assert_int_equal(s_add(nc, "s", 4, T0, 10000), KVEDGE_OK);
    assert_int_equal(s_add(nc, "s", 4, T0, 10), KVEDGE_OK);
    assert_false(s_has(nc, "s", 4, T0 + 10));
    kvedge_negcache_destroy(&nc);
}

static void test_eviction_order(void **state)
{
    (void)state;
    kvedge_negcache_t *nc = kvedge_negcache_new(4, TTL);
    /* Expiries: a 1400, b 1100, c 1300, d 1100 (b added before d). */
    assert_int_equal(s_add(nc, "a", 0, T0, 1400), KVEDGE_OK);
    assert_int_equal(s_add(nc, "b", 0, T0, 1100), KVEDGE_OK);
    assert_int_equal(s_add(nc, "c", 0, T0, 1300), KVEDGE_OK);
    assert_int_equal(s_add(nc, "d", 0, T0 + 100, 1000), KVEDGE_OK);
    assert_int_equal(kvedge_negcache_count(nc), 4);

    /* Lookups do not protect an entry (not LRU). */
    assert_true(s_has(nc, "b", 0, T0));
    /* Full: each add evicts the earliest expiry, the earlier-added first on a tie. */
    assert_int_equal(s_add(nc, "e", 0, T0, 5000), KVEDGE_OK);
    assert_int_equal(kvedge_negcache_count(nc), 4);
    assert_false(s_has(nc, "b", 0, T0));
    assert_true(s_has(nc, "d", 0, T0));
    assert_int_equal(s_add(nc, "f", 0, T0, 5000), KVEDGE_OK);
    assert_false(s_has(nc, "d", 0, T0));
    assert_true(s_has(nc, "c", 0, T0));
    /* Refreshing c pushes its expiry past a's, so a goes next. */
    assert_int_equal(s_add(nc, "c", 0, T0, 2000), KVEDGE_OK);
    assert_int_equal(s_add(nc, "g", 0, T0, 5000), KVEDGE_OK);
    assert_false(s_has(nc, "a", 0, T0));
    assert_true(s_has(nc, "c", 0, T0));
    assert_true(s_has(nc, "e", 0, T0));
    assert_true(s_has(nc, "f", 0, T0));
    assert_true(s_has(nc, "g", 0, T0));

    kvedge_negcache_stats_t st;
    assert_int_equal(kvedge_negcache_stats(nc, &st), KVEDGE_OK);
    assert_int_equal(st.evictions, 3);
    assert_int_equal(st.expirations, 0);

    /* An expired entry goes before any live one, and counts as an expiration. */
    assert_int_equal(s_add(nc, "c", 0, T0, 1), KVEDGE_OK);
    assert_int_equal(s_add(nc, "h", 0, T0 + 10, 5000), KVEDGE_OK);
    assert_int_equal(kvedge_negcache_stats(nc, &st), KVEDGE_OK);
    assert_int_equal(st.evictions, 3);
    assert_int_equal(st.expirations, 1);
    assert_true(s_has(nc, "e", 0, T0 + 10));
    assert_true(s_has(nc, "h", 0, T0 + 10));

    /* Capacity 1 still works. */
    kvedge_negcache_t *one = kvedge_negcache_new(1, TTL);
    assert_int_equal(s_add(one, "x", 1, T0, 0), KVEDGE_OK);
    assert_int_equal(s_add(one, "x", 2, T0, 0), KVEDGE_OK);
    assert_false(s_has(one, "x", 1, T0));
    assert_true(s_has(one, "x", 2, T0));
    kvedge_negcache_destroy(&one);
    kvedge_negcache_destroy(&nc);
}

static void test_purge(void **state)
{
    (void)state;
    kvedge_negcache_t *nc = kvedge_negcache_new(64, TTL);
    assert_int_equal(kvedge_negcache_purge_expired(nc, T0), 0);
    for (uint64_t i = 0; i < 40; i++)
        assert_int_equal(s_add(nc, i % 2 ? "odd" : "even", i, T0, 10 * (i + 1)), KVEDGE_OK);
    /* Entry i expires at T0 + 10 (i + 1): at T0 + 100, i = 0..9 have expired. */
    assert_int_equal(kvedge_negcache_purge_expired(nc, T0 + 99), 9);
    assert_int_equal(kvedge_negcache_purge_expired(nc, T0 + 100), 1);
    assert_int_equal(kvedge_negcache_purge_expired(nc, T0 + 100), 0);
    assert_int_equal(kvedge_negcache_count(nc), 30);
    for (uint64_t i = 0; i < 40; i++)
        assert_int_equal(s_has(nc, i % 2 ? "odd" : "even", i, T0 + 100), i >= 10);
    assert_int_equal(kvedge_negcache_purge_expired(nc, UINT64_MAX), 30);
    assert_int_equal(kvedge_negcache_count(nc), 0);
    kvedge_negcache_stats_t st;
    assert_int_equal(kvedge_negcache_stats(nc, &st), KVEDGE_OK);
    assert_int_equal(st.expirations, 40);
    kvedge_negcache_destroy(&nc);
}

/* Deterministic xorshift for the model test. */
static uint64_t s_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#define MODEL_CAP  32
#define MODEL_KEYS 96

/* Random adds, lookups, removes and purges on a small cache, checked step by step against a
 * brute-force model with the documented eviction rule: exercises index deletion chains and
 * heap repair far harder than the hand-written cases. */
static void test_against_model(void **state)
{
    (void)state;
    kvedge_negcache_t *nc = kvedge_negcache_new(MODEL_CAP, TTL);
    struct {
        bool in;
        uint64_t expires, seq;
    } m[MODEL_KEYS] = {{0}};
    uint64_t seed = 0x9e3779b97f4a7c15ull, now = T0, seq = 0;
    for (int step = 0; step < 200000; step++) {
        now += s_rand(&seed) % 7;
        uint64_t r = s_rand(&seed), k = r % MODEL_KEYS, op = (r >> 16) % 10;
        const char *src = k % 3 == 0 ? "cloud" : k % 3 == 1 ? "edge" : "local";
        if (op < 5) {
            uint64_t ttl = (r >> 24) % 4 == 0 ? 0 : 1 + (r >> 32) % 3000;
            if (!m[k].in) {
                size_t n = 0, victim = MODEL_KEYS;
                for (size_t j = 0; j < MODEL_KEYS; j++)
                    if (m[j].in) {
                        n++;
                        if (victim == MODEL_KEYS || m[j].expires < m[victim].expires ||
                            (m[j].expires == m[victim].expires && m[j].seq < m[victim].seq))
                            victim = j;
                    }
                if (n == MODEL_CAP)
                    m[victim].in = false;
            }
            m[k].in = true;
            m[k].expires = now + (ttl ? ttl : TTL);
            m[k].seq = seq++;
            assert_int_equal(s_add(nc, src, k, now, ttl), KVEDGE_OK);
        } else if (op < 8) {
            bool want = m[k].in && now < m[k].expires;
            if (m[k].in && !want)
                m[k].in = false;
            assert_int_equal(s_has(nc, src, k, now), want);
        } else if (op < 9) {
            uint8_t key[8];
            s_key(k, key);
            assert_int_equal(kvedge_negcache_remove(nc, src, key, 8),
                             m[k].in ? KVEDGE_OK : KVEDGE_ENOTFOUND);
            m[k].in = false;
        } else {
            int want = 0;
            for (size_t j = 0; j < MODEL_KEYS; j++)
                if (m[j].in && m[j].expires <= now) {
                    m[j].in = false;
                    want++;
                }
            assert_int_equal(kvedge_negcache_purge_expired(nc, now), want);
        }
        size_t n = 0;
        for (size_t j = 0; j < MODEL_KEYS; j++)
            n += m[j].in;
        assert_int_equal(kvedge_negcache_count(nc), n);
    }
    kvedge_negcache_destroy(&nc);
}

#define THREADS    4
#define PER_THREAD 20000

typedef struct {
    kvedge_negcache_t *nc;
    int id;
} s_worker_t;

/* Each thread adds and looks up its own keys (always found: capacity holds them all, TTLs
 * are long) and churns shared ones. */
static void *s_worker(void *arg)
{
    s_worker_t *w = arg;
    char own[16];
    snprintf(own, sizeof own, "own-%d", w->id);
    for (uint64_t i = 0; i < PER_THREAD; i++) {
        uint64_t now = T0 + i;
        if (s_add(w->nc, own, i % 100, now, 1000000) != KVEDGE_OK ||
            !s_has(w->nc, own, i % 100, now))
            return (void *)1;
        if (s_add(w->nc, "shared", i % 50, now, 5) != KVEDGE_OK)
            return (void *)1;
        (void)s_has(w->nc, "shared", (i + 7) % 50, now);
        if (i % 97 == 0) {
            uint8_t k[8];
            s_key(i % 50, k);
            (void)kvedge_negcache_remove(w->nc, "shared", k, 8);
        }
        if (i % 1000 == 0 && kvedge_negcache_purge_expired(w->nc, now) < 0)
            return (void *)1;
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    kvedge_negcache_t *nc = kvedge_negcache_new(THREADS * 100 + 50, TTL);
    pthread_t th[THREADS];
    s_worker_t w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (s_worker_t){nc, i};
        assert_int_equal(pthread_create(&th[i], NULL, s_worker, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        void *ret = (void *)1;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_null(ret);
    }
    char own[16];
    for (int t = 0; t < THREADS; t++) {
        snprintf(own, sizeof own, "own-%d", t);
        for (uint64_t i = 0; i < 100; i++)
            assert_true(s_has(nc, own, i, T0 + PER_THREAD));
    }
    assert_int_equal(kvedge_negcache_purge_expired(nc, T0 + PER_THREAD + 5) >= 0, 1);
    assert_int_equal(kvedge_negcache_count(nc), THREADS * 100);
    kvedge_negcache_stats_t st;
    assert_int_equal(kvedge_negcache_stats(nc, &st), KVEDGE_OK);
    assert_int_equal(st.evictions, 0);
    kvedge_negcache_destroy(&nc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_degenerate_and_errors),
        cmocka_unit_test(test_expiry_boundaries),
        cmocka_unit_test(test_sources_are_separate),
        cmocka_unit_test(test_ttl_override_and_refresh),
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_purge),
        cmocka_unit_test(test_against_model),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
