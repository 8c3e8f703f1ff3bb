/* Link meter: EWMA convergence, RTT-corrected bandwidth, small transfers as latency probes,
 * priors, the transfer-time model, argument errors and concurrent use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>

#include "access/meter.h"
#include "access/codec/error.h"

/* Fails unless |got - want| <= rel * |want|. */
#define NEAR(got, want, rel)                                                                       \
    do {                                                                                           \
        double g_ = (got), w_ = (want);                                                            \
        if (!(fabs(g_ - w_) <= (rel)*fabs(w_)))                                                    \
            fail_msg("%s = %.6g, want %.6g (rel %.3g)", #got, g_, w_, (double)(rel));              \
    } while (0)

#define RTT_US   20000.0
#define BW_BPS   12.5e6 /* 100 Mbit/s */
#define BIG_XFER (1u << 20)

/* elapsed of one request for bytes on a link of bw and rtt */
static uint64_t s_elapsed(uint64_t bytes, double bw, double rtt)
{
    return (uint64_t)llround(rtt + (double)bytes * 1e6 / bw);
}

static void test_degenerate_and_errors(void **state)
{
    (void)state;
    assert_null(kvedge_meter_new(NAN));
    assert_null(kvedge_meter_new(1.5));
    kvedge_meter_destroy(NULL);
    kvedge_meter_t *m = kvedge_meter_new(0); /* default alpha */
    assert_non_null(m);

    kvedge_meter_stats_t st;
    assert_int_equal(kvedge_meter_stats(m, &st), KVEDGE_OK);
    assert_true(st.bw_bytes_per_s == 0 && st.rtt_us == 0);
    assert_true(st.samples == 0 && st.bytes_total == 0 && st.last_update_ms == 0);
    /* Nothing known: an unknown link is infinitely slow, a zero-byte fetch costs the RTT. */
    assert_true(isinf(kvedge_meter_transfer_time_us(m, 1)));
    assert_true(kvedge_meter_transfer_time_us(m, 0) == 0);

    assert_int_equal(kvedge_meter_observe(NULL, 100, 100), KVEDGE_EINVAL);
    assert_int_equal(kvedge_meter_observe(m, BIG_XFER, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_meter_observe_rtt(NULL, 5), KVEDGE_EINVAL);
    assert_int_equal(kvedge_meter_prior(NULL, 1e6, 5), KVEDGE_EINVAL);
    assert_int_equal(kvedge_meter_prior(m, 0, 5), KVEDGE_EINVAL);
    assert_int_equal(kvedge_meter_prior(m, -1, 5), KVEDGE_EINVAL);
    assert_int_equal(kvedge_meter_prior(m, NAN, 5), KVEDGE_EINVAL);
    assert_int_equal(kvedge_meter_prior(m, INFINITY, 5), KVEDGE_EINVAL);
    assert_int_equal(kvedge_meter_stats(NULL, &st), KVEDGE_EINVAL);
    assert_int_equal(kvedge_meter_stats(m, NULL), KVEDGE_EINVAL);
    assert_true(kvedge_meter_bw(NULL) == 0 && kvedge_meter_rtt_us(NULL) == 0);
    assert_true(isinf(kvedge_meter_transfer_time_us(NULL, 0)));
    /* Rejected calls left no trace. */
    assert_int_equal(kvedge_meter_stats(m, &st), KVEDGE_OK);
    assert_true(st.bw_bytes_per_s == 0 && st.rtt_us == 0 && st.samples == 0);

    /* Extremes stay finite, and the byte total saturates. */
    assert_int_equal(kvedge_meter_observe(m, UINT64_MAX, 1), KVEDGE_OK);
    assert_int_equal(kvedge_meter_observe(m, UINT64_MAX, UINT64_MAX), KVEDGE_OK);
    assert_int_equal(kvedge_meter_observe_rtt(m, UINT64_MAX), KVEDGE_OK);
    assert_int_equal(kvedge_meter_stats(m, &st), KVEDGE_OK);
    assert_true(isfinite(st.bw_bytes_per_s) && st.bw_bytes_per_s > 0);
    assert_true(isfinite(st.rtt_us));
    assert_true(st.bytes_total == UINT64_MAX);
    assert_int_equal(st.samples, 3);
    assert_true(st.last_update_ms > 0);
    assert_true(isfinite(kvedge_meter_transfer_time_us(m, UINT64_MAX)));

    kvedge_meter_destroy(&m);
    assert_null(m);
    kvedge_meter_destroy(&m);
}

static void test_ewma_converges(void **state)
{
    (void)state;
    kvedge_meter_t *m = kvedge_meter_new(KVEDGE_METER_ALPHA_DEFAULT);
    assert_non_null(m);
    assert_int_equal(kvedge_meter_observe_rtt(m, (uint64_t)RTT_US), KVEDGE_OK);
    /* The first sample is taken as is, and the RTT is subtracted: the naive
     * bytes / elapsed would read ~19% low here. */
    assert_int_equal(kvedge_meter_observe(m, BIG_XFER, s_elapsed(BIG_XFER, BW_BPS, RTT_US)),
                     KVEDGE_OK);
    NEAR(kvedge_meter_bw(m), BW_BPS, 1e-4);

    /* The link slows to half: the estimate follows geometrically (factor 1 - alpha). */
    for (int i = 0; i < 40; i++)
        assert_int_equal(kvedge_meter_observe(m, BIG_XFER, s_elapsed(BIG_XFER, BW_BPS / 2, RTT_US)),
                         KVEDGE_OK);
    NEAR(kvedge_meter_bw(m), BW_BPS / 2, 1e-3);

    /* Noisy samples around a constant: the mean is found. */
    for (int i = 0; i < 400; i++) {
        double bw = BW_BPS * (i % 2 ? 1.1 : 0.9);
        assert_int_equal(kvedge_meter_observe(m, 4 * BIG_XFER, s_elapsed(4 * BIG_XFER, bw, RTT_US)),
                         KVEDGE_OK);
    }
    NEAR(kvedge_meter_bw(m), BW_BPS, 0.03);
    NEAR(kvedge_meter_rtt_us(m), RTT_US, 1e-9);

    kvedge_meter_stats_t st;
    assert_int_equal(kvedge_meter_stats(m, &st), KVEDGE_OK);
    assert_int_equal(st.samples, 442);
    assert_true(st.bytes_total == 41ull * BIG_XFER + 400ull * 4 * BIG_XFER);
    kvedge_meter_destroy(&m);
}

static void test_small_transfers_feed_rtt(void **state)
{
    (void)state;
    kvedge_meter_t *m = kvedge_meter_new(0.5);
    assert_non_null(m);
    /* Small transfers with no bandwidth known: their whole elapsed time is the RTT. */
    for (int i = 0; i < 10; i++)
        assert_int_equal(kvedge_meter_observe(m, 1000, 20000), KVEDGE_OK);
    assert_true(kvedge_meter_bw(m) == 0);
    NEAR(kvedge_meter_rtt_us(m), 20000, 1e-12);
    assert_int_equal(kvedge_meter_observe(m, KVEDGE_METER_MIN_BW_BYTES - 1, 30000), KVEDGE_OK);
    assert_true(kvedge_meter_bw(m) == 0);
    NEAR(kvedge_meter_rtt_us(m), 25000, 1e-12); /* alpha 0.5 */

    /* Once bandwidth is known, a small transfer's serialization time is taken off. */
    kvedge_meter_t *k = kvedge_meter_new(0);
    assert_non_null(k);
    assert_int_equal(kvedge_meter_observe(k, BIG_XFER, s_elapsed(BIG_XFER, BW_BPS, 0)), KVEDGE_OK);
    NEAR(kvedge_meter_bw(k), BW_BPS, 1e-5);
    assert_int_equal(kvedge_meter_observe(k, 12500, 21000), KVEDGE_OK); /* 1 ms on the wire */
    NEAR(kvedge_meter_rtt_us(k), 20000, 1e-3);
    NEAR(kvedge_meter_bw(k), BW_BPS, 1e-5);
    /* A zero-byte exchange is a pure latency probe. */
    assert_int_equal(kvedge_meter_observe(k, 0, 20000), KVEDGE_OK);
    NEAR(kvedge_meter_rtt_us(k), 20000, 1e-3);

    kvedge_meter_stats_t st;
    assert_int_equal(kvedge_meter_stats(m, &st), KVEDGE_OK);
    assert_int_equal(st.samples, 11);
    assert_true(st.bytes_total == 10000u + KVEDGE_METER_MIN_BW_BYTES - 1);
    kvedge_meter_destroy(&m);
    kvedge_meter_destroy(&k);
}

static void test_prior(void **state)
{
    (void)state;
    kvedge_meter_t *m = kvedge_meter_new(0);
    assert_non_null(m);
    assert_int_equal(kvedge_meter_prior(m, BW_BPS, (uint64_t)RTT_US), KVEDGE_OK);
    kvedge_meter_stats_t st;
    assert_int_equal(kvedge_meter_stats(m, &st), KVEDGE_OK);
    assert_true(st.bw_bytes_per_s == BW_BPS && st.rtt_us == RTT_US);
    assert_true(st.samples == 0 && st.last_update_ms == 0); /* a prior is not an observation */
    NEAR(kvedge_meter_transfer_time_us(m, 1000000), RTT_US + 80000, 1e-12);

    /* A second prior replaces the first while nothing was observed. */
    assert_int_equal(kvedge_meter_prior(m, 2 * BW_BPS, 1000), KVEDGE_OK);
    assert_true(kvedge_meter_bw(m) == 2 * BW_BPS && kvedge_meter_rtt_us(m) == 1000);
    assert_int_equal(kvedge_meter_prior(m, BW_BPS, (uint64_t)RTT_US), KVEDGE_OK);

    /* The prior weighs as one sample: the first observation (25e6 B/s net of the prior's
     * RTT) is averaged with it. */
    assert_int_equal(kvedge_meter_observe(m, 1000000, 60000), KVEDGE_OK);
    NEAR(kvedge_meter_bw(m), (BW_BPS + 25e6) / 2, 1e-12);

    /* A new prior does not override a measured bandwidth, but still seeds the RTT, which
     * has only a prior so far. */
    assert_int_equal(kvedge_meter_prior(m, 1e9, 5000), KVEDGE_OK);
    NEAR(kvedge_meter_bw(m), (BW_BPS + 25e6) / 2, 1e-12);
    assert_true(kvedge_meter_rtt_us(m) == 5000);
    assert_int_equal(kvedge_meter_observe_rtt(m, 7000), KVEDGE_OK);
    NEAR(kvedge_meter_rtt_us(m), 6000, 1e-12);
    assert_int_equal(kvedge_meter_prior(m, 1e9, 1), KVEDGE_OK);
    NEAR(kvedge_meter_rtt_us(m), 6000, 1e-12);

    /* A far-off prior is forgotten as observations accumulate. */
    kvedge_meter_t *k = kvedge_meter_new(0);
    assert_non_null(k);
    assert_int_equal(kvedge_meter_prior(k, 1e9, 100), KVEDGE_OK);
    for (int i = 0; i < 60; i++) {
        assert_int_equal(kvedge_meter_observe_rtt(k, (uint64_t)RTT_US), KVEDGE_OK);
        assert_int_equal(kvedge_meter_observe(k, BIG_XFER, s_elapsed(BIG_XFER, BW_BPS, RTT_US)),
                         KVEDGE_OK);
    }
    NEAR(kvedge_meter_bw(k), BW_BPS, 1e-3);
    NEAR(kvedge_meter_rtt_us(k), RTT_US, 1e-3);
    kvedge_meter_destroy(&m);
    kvedge_meter_destroy(&k);
}

static void test_transfer_time(void **state)
{
    (void)state;
    kvedge_meter_t *m = kvedge_meter_new(0);
    assert_non_null(m);
    /* A peer-edge link: 1 Gbit/s, 1 ms. */
    assert_int_equal(kvedge_meter_observe_rtt(m, 1000), KVEDGE_OK);
    assert_int_equal(kvedge_meter_observe(m, 8u << 20, s_elapsed(8u << 20, 125e6, 1000)),
                     KVEDGE_OK);
    NEAR(kvedge_meter_transfer_time_us(m, 0), 1000, 1e-12);
    NEAR(kvedge_meter_transfer_time_us(m, 125000000), 1000 + 1e6, 1e-5);
    NEAR(kvedge_meter_transfer_time_us(m, 1250), 1010, 1e-5);
    /* The cost is monotonic in size. */
    double prev = 0;
    for (uint64_t b = 1; b < (1ull << 40); b *= 7) {
        double t = kvedge_meter_transfer_time_us(m, b);
        assert_true(t > prev);
        prev = t;
    }
    /* A sample whose elapsed is below the RTT estimate is floored, not a spike: it is worth
     * at most NET_FLOOR_DIV times bytes / elapsed (second sample: weight 1/2). */
    assert_int_equal(kvedge_meter_observe(m, BIG_XFER, 500), KVEDGE_OK);
    double cap = (double)BIG_XFER * 1e6 / 500.0 * KVEDGE_METER_NET_FLOOR_DIV;
    NEAR(kvedge_meter_bw(m), (125e6 + cap) / 2, 1e-5);
    kvedge_meter_destroy(&m);
}

enum { THREADS = 8, PER_THREAD = 2000 };

static void *s_observer(void *arg)
{
    kvedge_meter_t *m = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        if (i % 2)
            kvedge_meter_observe_rtt(m, (uint64_t)RTT_US);
        else
            kvedge_meter_observe(m, BIG_XFER, s_elapsed(BIG_XFER, BW_BPS, RTT_US));
        (void)kvedge_meter_transfer_time_us(m, 1000);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    kvedge_meter_t *m = kvedge_meter_new(0);
    assert_non_null(m);
    assert_int_equal(kvedge_meter_prior(m, BW_BPS, (uint64_t)RTT_US), KVEDGE_OK);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, s_observer, m), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    kvedge_meter_stats_t st;
    assert_int_equal(kvedge_meter_stats(m, &st), KVEDGE_OK);
    assert_int_equal(st.samples, THREADS * PER_THREAD);
    assert_true(st.bytes_total == (uint64_t)THREADS * PER_THREAD / 2 * BIG_XFER);
    NEAR(st.bw_bytes_per_s, BW_BPS, 1e-4);
    NEAR(st.rtt_us, RTT_US, 1e-9);
    kvedge_meter_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_degenerate_and_errors),
        cmocka_unit_test(test_ewma_converges),
        cmocka_unit_test(test_small_transfers_feed_rtt),
        cmocka_unit_test(test_prior),
        cmocka_unit_test(test_transfer_time),
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
