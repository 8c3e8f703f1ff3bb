/* Link shaper: link time and latency on an injected clock, bursts, unlimited links, spec
 * parsing, concurrent callers, and one real-time check of wait() (lower bound only). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>

#include "access/shaper.h"
#include "access/codec/error.h"

#define NEAR(got, want, rel)                                                                       \
    do {                                                                                           \
        double g_ = (double)(got), w_ = (double)(want);                                            \
        if (!(fabs(g_ - w_) <= (rel)*fabs(w_)))                                                    \
            fail_msg("%s = %.9g, want %.9g (rel %.3g)", #got, g_, w_, (double)(rel));              \
    } while (0)

/* Sends n messages of size bytes at once at now_us; returns the last one's delay. */
static uint64_t s_send_all(kvedge_shaper_t *s, uint64_t n, uint64_t bytes, uint64_t now_us)
{
    uint64_t d = 0;
    for (uint64_t i = 0; i < n; i++)
        d = kvedge_shaper_delay_us(s, bytes, now_us);
    return d;
}

static void test_link_time(void **state)
{
    (void)state;
    /* Cloud link, 100 Mbit/s + 20 ms: N messages of S bytes take N*S*8/R plus latency. */
    const uint64_t rate = 100000000, n = 500, size = 125000;
    kvedge_shaper_t *s = kvedge_shaper_new(rate, 20000, 0);
    assert_non_null(s);
    const double link_us = (double)n * size * 8 / rate * 1e6;
    NEAR(s_send_all(s, n, size, 1000), link_us + 20000, 0.01);
    kvedge_shaper_destroy(&s);

    /* Each message queues behind the ones before it: exactly one serialization time more,
     * once the 10 ms default burst (one message here) is spent. */
    s = kvedge_shaper_new(rate, 20000, 0);
    assert_non_null(s);
    for (uint64_t i = 0; i < 100; i++)
        assert_int_equal(kvedge_shaper_delay_us(s, size, 7), i * 10000 + 20000);
    kvedge_shaper_destroy(&s);

    /* Peer-edge link, 1 Gbit/s + 1 ms, MTU-sized messages. */
    s = kvedge_shaper_new(1000000000, 1000, 0);
    assert_non_null(s);
    NEAR(s_send_all(s, 400000, 1500, 5), 400000.0 * 1500 * 8 / 1e9 * 1e6 + 1000, 0.01);
    kvedge_shaper_destroy(&s);

    /* Messages paced at the link rate never queue: each sees the latency only. */
    s = kvedge_shaper_new(rate, 20000, 0);
    assert_non_null(s);
    for (uint64_t i = 0; i < 1000; i++)
        assert_int_equal(kvedge_shaper_delay_us(s, size, 1000 + i * 10000), 20000);
    kvedge_shaper_destroy(&s);
    /* With a bucket of one byte, each also waits for its own serialization. */
    s = kvedge_shaper_new(rate, 20000, 1);
    assert_non_null(s);
    for (uint64_t i = 0; i < 1000; i++)
        assert_int_equal(kvedge_shaper_delay_us(s, size, 1000 + i * 10000), 10000 + 20000);
    kvedge_shaper_destroy(&s);
}

static void test_burst(void **state)
{
    (void)state;
    /* 8 Mbit/s is one byte per microsecond. */
    kvedge_shaper_t *s = kvedge_shaper_new(8000000, 500, 100000);
    assert_non_null(s);
    assert_int_equal(kvedge_shaper_burst_bytes(s), 100000);
    /* A full bucket lets a burst through at once, then the link rate applies. */
    for (int i = 0; i < 10; i++)
        assert_int_equal(kvedge_shaper_delay_us(s, 10000, 0), 500);
    assert_int_equal(kvedge_shaper_delay_us(s, 10000, 0), 10000 + 500);
    /* Idle time refills the bucket, up to its size and no further. */
    assert_int_equal(kvedge_shaper_delay_us(s, 100000, 2000000), 500);
    assert_int_equal(kvedge_shaper_delay_us(s, 1, 2000000), 1 + 500);
    /* A message larger than the bucket drains at the link rate past the burst. */
    assert_int_equal(kvedge_shaper_delay_us(s, 300000, 5000000), 200000 + 500);
    /* Half a bucket of idle time buys half a bucket. */
    assert_int_equal(kvedge_shaper_delay_us(s, 100000, 6000000), 500);
    assert_int_equal(kvedge_shaper_delay_us(s, 50000, 6050000), 500);
    assert_int_equal(kvedge_shaper_delay_us(s, 1, 6050000), 1 + 500);
    /* A clock that steps back does not free the link early. */
    assert_int_equal(kvedge_shaper_delay_us(s, 1000000, 7000000), 900000 + 500);
    assert_int_equal(kvedge_shaper_delay_us(s, 1000, 6000000), 1901000 + 500);
    kvedge_shaper_destroy(&s);
    assert_null(s);
    kvedge_shaper_destroy(&s);
    kvedge_shaper_destroy(NULL);
}

static void test_unlimited_and_degenerate(void **state)
{
    (void)state;
    kvedge_shaper_t *s = kvedge_shaper_new(0, 1000, 0);
    assert_non_null(s);
    assert_int_equal(kvedge_shaper_rate_bps(s), 0);
    assert_int_equal(kvedge_shaper_latency_us(s), 1000);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(kvedge_shaper_delay_us(s, 1u << 30, 0), 1000);
    assert_int_equal(kvedge_shaper_delay_us(s, UINT64_MAX, UINT64_MAX), 1000);
    assert_int_equal(kvedge_shaper_delay_us(s, 0, 0), 1000);
    kvedge_shaper_destroy(&s);

    /* A NULL shaper is an unshaped link. */
    assert_int_equal(kvedge_shaper_delay_us(NULL, 1u << 30, 0), 0);
    assert_int_equal(kvedge_shaper_wait(NULL, 1u << 30), KVEDGE_OK);
    assert_int_equal(kvedge_shaper_wait_from(NULL, 1u << 30, 0), KVEDGE_OK);
    assert_int_equal(kvedge_shaper_rate_bps(NULL), 0);
    assert_int_equal(kvedge_shaper_latency_us(NULL), 0);
    assert_int_equal(kvedge_shaper_burst_bytes(NULL), 0);

    /* Default bursts: 10 ms of the rate, at least 64 KiB. */
    const struct {
        uint64_t rate, burst, want;
    } cases[] = {
        {100000000, 0, 125000},
        {1000000000, 0, 1250000},
        {10000000000, 0, 12500000},
        {1000000, 0, 65536},
        {0, 0, 65536},
        {100000000, 4096, 4096},
        {UINT64_MAX, 0, UINT64_MAX / 800},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s = kvedge_shaper_new(cases[i].rate, 0, cases[i].burst);
        assert_non_null(s);
        assert_int_equal(kvedge_shaper_burst_bytes(s), cases[i].want);
        kvedge_shaper_destroy(&s);
    }

    /* Delays saturate instead of wrapping; an empty message on an idle link costs latency. */
    s = kvedge_shaper_new(1, 7, 1);
    assert_non_null(s);
    assert_int_equal(kvedge_shaper_delay_us(s, 0, 100), 7);
    assert_true(kvedge_shaper_delay_us(s, UINT64_MAX, 100) == UINT64_MAX);
    assert_true(kvedge_shaper_delay_us(s, 1, UINT64_MAX) == UINT64_MAX);
    kvedge_shaper_destroy(&s);
}

static void test_parse(void **state)
{
    (void)state;
    const struct {
        const char *spec;
        uint64_t rate;
        uint32_t lat;
    } good[] = {
        {"100mbit,20ms", 100000000, 20000},
        {"1gbit,1ms", 1000000000, 1000},
        {"10gbit", 10000000000, 0},
        {"unlimited", 0, 0},
        {"500kbit,250us", 500000, 250},
        {"1bit,2s", 1, 2000000},
        {"UNLIMITED,5ms", 0, 5000},
        {"1Gbit,0us", 1000000000, 0},
        {"007Mbit,010MS", 7000000, 10000},
        {"18446744073709551615bit", UINT64_MAX, 0},
        {"18446744073gbit,4294967295us", 18446744073000000000u, UINT32_MAX},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t rate = 42;
        uint32_t lat = 42;
        if (kvedge_shaper_parse(good[i].spec, &rate, &lat) != KVEDGE_OK)
            fail_msg("\"%s\" refused", good[i].spec);
        assert_true(rate == good[i].rate);
        assert_int_equal(lat, good[i].lat);
    }

    const char *bad[] = {
        "",
        "4294s",
        "100",
        "mbit",
        "100mb",
        "100 mbit",
        " 100mbit",
        "100mbit ",
        "100mbit,",
        "100mbit,20",
        "100mbit,20ms,",
        "100mbit,20ms,1ms",
        "100mbit,,20ms",
        "-1mbit",
        "+1mbit",
        "0mbit",
        "0bit,1ms",
        "1.5gbit",
        "1e9bit",
        "0x10mbit",
        "unlimited,",
        "unlimitedx",
        "unlim",
        ",20ms",
        "100mbit;20ms",
        "100mbit,20 ms",
        "100mbit,-1ms",
        "100mbit,1.5ms",
        "100mbit,20msx",
        "100mbit,20mbit",
        "18446744073709551616bit",
        "18446744073709551615kbit",
        "18446744074gbit",
        "100mbit,4294967296us",
        "100mbit,4295s",
        "100mbit,99999999999999999999999us",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t rate = 42;
        uint32_t lat = 42;
        if (kvedge_shaper_parse(bad[i], &rate, &lat) != KVEDGE_EINVAL)
            fail_msg("\"%s\" accepted", bad[i]);
        assert_true(rate == 42 && lat == 42); /* untouched */
    }
    uint64_t rate;
    uint32_t lat;
    assert_int_equal(kvedge_shaper_parse(NULL, &rate, &lat), KVEDGE_EINVAL);
    assert_int_equal(kvedge_shaper_parse("1gbit", NULL, &lat), KVEDGE_EINVAL);
    assert_int_equal(kvedge_shaper_parse("1gbit", &rate, NULL), KVEDGE_EINVAL);

    /* A parsed spec builds the link it names. */
    assert_int_equal(kvedge_shaper_parse("100mbit,20ms", &rate, &lat), KVEDGE_OK);
    kvedge_shaper_t *s = kvedge_shaper_new(rate, lat, 0);
    assert_non_null(s);
    assert_int_equal(kvedge_shaper_delay_us(s, 125000, 0), 20000);
    assert_int_equal(kvedge_shaper_delay_us(s, 125000, 0), 30000);
    kvedge_shaper_destroy(&s);
}

enum { THREADS = 4, PER_THREAD = 1000 };

typedef struct {
    kvedge_shaper_t *s;
    uint64_t sum; /* of the delays this thread got */
} s_worker_t;

static void *s_sender(void *arg)
{
    s_worker_t *w = arg;
    for (int i = 0; i < PER_THREAD; i++)
        w->sum += kvedge_shaper_delay_us(w->s, 1000, 0);
    return NULL;
}

static void test_concurrent_senders(void **state)
{
    (void)state;
    /* One byte per microsecond, a burst of one message, 300 us latency: whatever the
     * interleaving, the messages are serialized, the k-th delayed (k - 1) ms + latency. */
    kvedge_shaper_t *s = kvedge_shaper_new(8000000, 300, 1000);
    assert_non_null(s);
    pthread_t th[THREADS];
    s_worker_t w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (s_worker_t){.s = s};
        assert_int_equal(pthread_create(&th[i], NULL, s_sender, &w[i]), 0);
    }
    uint64_t sum = 0;
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        sum += w[i].sum;
    }
    const uint64_t n = THREADS * PER_THREAD;
    assert_true(sum == 1000 * (n - 1) * n / 2 + n * 300);
    kvedge_shaper_destroy(&s);
}

static void test_wait_real_time(void **state)
{
    (void)state;
    /* 20 messages of 125 KB at 100 Mbit/s: 200 ms of link time less the 10 ms burst. Only
     * the lower bound is exact; the upper bound just catches a runaway. */
    kvedge_shaper_t *s = kvedge_shaper_new(100000000, 0, 0);
    assert_non_null(s);
    uint64_t t0 = kvedge_shaper_now_us();
    for (int i = 0; i < 20; i++)
        assert_int_equal(kvedge_shaper_wait(s, 125000), KVEDGE_OK);
    uint64_t took = kvedge_shaper_now_us() - t0;
    if (took < 190000 || took > 5000000)
        fail_msg("20 x 125 KB at 100 Mbit/s took %llu us", (unsigned long long)took);
    kvedge_shaper_destroy(&s);

    /* Latency is pipelined for messages stamped when sent: five stamped together take one
     * latency (200 ms), not five (1 s, what waiting for each in turn would cost). */
    s = kvedge_shaper_new(0, 200000, 0);
    assert_non_null(s);
    t0 = kvedge_shaper_now_us();
    for (int i = 0; i < 5; i++)
        assert_int_equal(kvedge_shaper_wait_from(s, 1000, t0), KVEDGE_OK);
    took = kvedge_shaper_now_us() - t0;
    if (took < 200000 || took > 900000)
        fail_msg("5 stamped messages took %llu us", (unsigned long long)took);
    /* A message whose delivery time has passed is not held. */
    t0 = kvedge_shaper_now_us();
    assert_int_equal(kvedge_shaper_wait_from(s, 1000, t0 > 1000000 ? t0 - 1000000 : 0), KVEDGE_OK);
    took = kvedge_shaper_now_us() - t0;
    if (took > 150000)
        fail_msg("an overdue message was held %llu us", (unsigned long long)took);
    kvedge_shaper_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_link_time),
        cmocka_unit_test(test_burst),
        cmocka_unit_test(test_unlimited_and_degenerate),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_concurrent_senders),
        cmocka_unit_test(test_wait_real_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
