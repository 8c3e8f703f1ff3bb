/* Node health: every state transition on an injected clock (silence, failures, success,
 * re-admission ramp, failure on probation, a timeout on probation), weights, capacity, name
 * limits, foreach, concurrent use, the observer that hears each transition with its reason,
 * and the round-trip estimators (RFC 6298) that stream deadlines follow. */
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

#include "proxy/health.h"
#include "access/codec/error.h"

#define NEAR(got, want)                                                                            \
    do {                                                                                           \
        double g_ = (got), w_ = (want);                                                            \
        if (!(fabs(g_ - w_) <= 1e-9))                                                              \
            fail_msg("%s = %.12g, want %.12g", #got, g_, w_);                                      \
    } while (0)

#define T0 1000000u /* an arbitrary clock origin, so nothing relies on time 0 */

static void s_assert_state(kvedge_health_t *h, const char *node, uint64_t now, int want)
{
    int got = kvedge_health_state(h, node, now);
    if (got != want)
        fail_msg("%s at %llu: %s, want %s", node, (unsigned long long)now,
                 kvedge_health_state_name(got), kvedge_health_state_name(want));
}

/* Drives a node to DOWN by failures at now. */
static void s_knock_down(kvedge_health_t *h, const char *node, uint64_t now)
{
    for (int i = 0; i < KVEDGE_HEALTH_DOWN_FAILURES; i++)
        assert_int_equal(kvedge_health_failure(h, node, now, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    s_assert_state(h, node, now, KVEDGE_HEALTH_DOWN);
}

static void test_degenerate_and_errors(void **state)
{
    (void)state;
    assert_null(kvedge_health_new(KVEDGE_HEALTH_MAX_NODES + 1));
    kvedge_health_destroy(NULL);
    kvedge_health_t *h = kvedge_health_new(0);
    assert_non_null(h);
    assert_int_equal(kvedge_health_count(h), 0);
    assert_int_equal(kvedge_health_count(NULL), 0);

    char name[KVEDGE_HEALTH_NAME_MAX + 2];
    memset(name, 'n', sizeof name);
    name[KVEDGE_HEALTH_NAME_MAX + 1] = '\0'; /* 65 chars: too long */
    assert_int_equal(kvedge_health_heartbeat(h, name, T0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_success(h, name, T0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_failure(h, name, T0, KVEDGE_EIO), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_add(h, name, T0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_state(h, name, T0), KVEDGE_EINVAL);
    name[KVEDGE_HEALTH_NAME_MAX] = '\0'; /* 64 chars: the longest allowed */
    assert_int_equal(kvedge_health_heartbeat(h, name, T0), KVEDGE_OK);
    s_assert_state(h, name, T0, KVEDGE_HEALTH_UP);

    assert_int_equal(kvedge_health_heartbeat(h, "", T0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_heartbeat(h, NULL, T0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_heartbeat(NULL, "a", T0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_failure(h, "a", T0, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_failure(h, "a", T0, 5), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_tick(NULL, T0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_count(h), 1); /* nothing above added a node */

    /* Queries never add. */
    assert_int_equal(kvedge_health_state(h, "ghost", T0), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_health_weight(h, "ghost", T0), 0.0);
    assert_false(kvedge_health_usable(h, "ghost", T0));
    kvedge_health_info_t info;
    assert_int_equal(kvedge_health_get(h, "ghost", T0, &info), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_health_get(h, name, T0, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_weight(NULL, name, T0), 0.0);
    assert_false(kvedge_health_usable(NULL, name, T0));
    assert_int_equal(kvedge_health_foreach(h, T0, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_count(h), 1);

    assert_string_equal(kvedge_health_state_name(KVEDGE_HEALTH_SUSPECT), "SUSPECT");
    assert_string_equal(kvedge_health_state_name(KVEDGE_EINVAL), "?");

    kvedge_health_destroy(&h);
    assert_null(h);
    kvedge_health_destroy(&h);
}

static void test_silence(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(8);
    assert_int_equal(kvedge_health_heartbeat(h, "cloud-0", T0), KVEDGE_OK);
    s_assert_state(h, "cloud-0", T0, KVEDGE_HEALTH_UP);
    NEAR(kvedge_health_weight(h, "cloud-0", T0), 1.0);

    /* Boundaries are strict: exactly SUSPECT_MS of silence is still UP. */
    s_assert_state(h, "cloud-0", T0 + KVEDGE_HEALTH_SUSPECT_MS, KVEDGE_HEALTH_UP);
    s_assert_state(h, "cloud-0", T0 + KVEDGE_HEALTH_SUSPECT_MS + 1, KVEDGE_HEALTH_SUSPECT);
    NEAR(kvedge_health_weight(h, "cloud-0", T0 + KVEDGE_HEALTH_SUSPECT_MS + 1),
         KVEDGE_HEALTH_SUSPECT_WEIGHT);
    assert_true(kvedge_health_usable(h, "cloud-0", T0 + KVEDGE_HEALTH_SUSPECT_MS + 1));
    s_assert_state(h, "cloud-0", T0 + KVEDGE_HEALTH_DOWN_MS, KVEDGE_HEALTH_SUSPECT);
    s_assert_state(h, "cloud-0", T0 + KVEDGE_HEALTH_DOWN_MS + 1, KVEDGE_HEALTH_DOWN);
    assert_false(kvedge_health_usable(h, "cloud-0", T0 + KVEDGE_HEALTH_DOWN_MS + 1));
    NEAR(kvedge_health_weight(h, "cloud-0", T0 + KVEDGE_HEALTH_DOWN_MS + 1), 0.0);

    /* A heartbeat lifts SUSPECT-by-silence straight back to UP, without probation. */
    assert_int_equal(kvedge_health_heartbeat(h, "edge-1", T0), KVEDGE_OK);
    uint64_t t = T0 + KVEDGE_HEALTH_SUSPECT_MS + 500;
    s_assert_state(h, "edge-1", t, KVEDGE_HEALTH_SUSPECT);
    assert_int_equal(kvedge_health_heartbeat(h, "edge-1", t), KVEDGE_OK);
    s_assert_state(h, "edge-1", t, KVEDGE_HEALTH_UP);
    NEAR(kvedge_health_weight(h, "edge-1", t), 1.0);

    /* A node added without being heard starts its silence clock when added. */
    assert_int_equal(kvedge_health_add(h, "cfg", T0), KVEDGE_OK);
    assert_int_equal(kvedge_health_add(h, "cfg", T0 + 2000), KVEDGE_OK); /* no-op */
    kvedge_health_info_t info;
    assert_int_equal(kvedge_health_get(h, "cfg", T0, &info), KVEDGE_OK);
    assert_int_equal(info.last_heard_ms, 0);
    s_assert_state(h, "cfg", T0 + KVEDGE_HEALTH_SUSPECT_MS + 1, KVEDGE_HEALTH_SUSPECT);

    /* tick applies silence to every node and counts the changes. */
    assert_int_equal(kvedge_health_tick(h, T0 + KVEDGE_HEALTH_SUSPECT_MS + 1), 0);
    /* edge-1 (heard at t) turns SUSPECT, cfg goes DOWN, cloud-0 was DOWN already. */
    assert_int_equal(kvedge_health_tick(h, T0 + KVEDGE_HEALTH_DOWN_MS + 1), 2);
    assert_int_equal(kvedge_health_tick(h, T0 + KVEDGE_HEALTH_DOWN_MS + 1), 0);
    s_assert_state(h, "edge-1", T0 + KVEDGE_HEALTH_DOWN_MS + 1, KVEDGE_HEALTH_SUSPECT);
    s_assert_state(h, "cfg", T0 + KVEDGE_HEALTH_DOWN_MS + 1, KVEDGE_HEALTH_DOWN);
    kvedge_health_destroy(&h);
}

static void test_failures_and_success(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(8);
    const char *n = "edge-2";
    assert_int_equal(kvedge_health_heartbeat(h, n, T0), KVEDGE_OK);
    for (int i = 1; i < KVEDGE_HEALTH_SUSPECT_FAILURES; i++)
        assert_int_equal(kvedge_health_failure(h, n, T0, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    s_assert_state(h, n, T0, KVEDGE_HEALTH_UP);
    assert_int_equal(kvedge_health_failure(h, n, T0, KVEDGE_EIO), KVEDGE_OK);
    s_assert_state(h, n, T0, KVEDGE_HEALTH_SUSPECT);
    NEAR(kvedge_health_weight(h, n, T0), KVEDGE_HEALTH_SUSPECT_WEIGHT);
    kvedge_health_info_t info;
    assert_int_equal(kvedge_health_get(h, n, T0, &info), KVEDGE_OK);
    assert_int_equal(info.failures, KVEDGE_HEALTH_SUSPECT_FAILURES);
    assert_int_equal(info.last_err, KVEDGE_EIO);

    /* A heartbeat does not forgive failures: the node is alive but failing requests. */
    assert_int_equal(kvedge_health_heartbeat(h, n, T0 + 10), KVEDGE_OK);
    s_assert_state(h, n, T0 + 10, KVEDGE_HEALTH_SUSPECT);
    /* A success does. */
    assert_int_equal(kvedge_health_success(h, n, T0 + 20), KVEDGE_OK);
    s_assert_state(h, n, T0 + 20, KVEDGE_HEALTH_UP);
    assert_int_equal(kvedge_health_get(h, n, T0 + 20, &info), KVEDGE_OK);
    assert_int_equal(info.failures, 0);
    assert_int_equal(info.last_heard_ms, T0 + 20);
    assert_false(info.probation);

    /* Failures need to be consecutive: a success in between starts the count over. */
    for (int i = 0; i < KVEDGE_HEALTH_DOWN_FAILURES - 1; i++)
        assert_int_equal(kvedge_health_failure(h, n, T0 + 30, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    s_assert_state(h, n, T0 + 30, KVEDGE_HEALTH_SUSPECT);
    assert_int_equal(kvedge_health_success(h, n, T0 + 40), KVEDGE_OK);
    assert_int_equal(kvedge_health_failure(h, n, T0 + 50, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    s_assert_state(h, n, T0 + 50, KVEDGE_HEALTH_UP);
    for (int i = 1; i < KVEDGE_HEALTH_DOWN_FAILURES; i++)
        assert_int_equal(kvedge_health_failure(h, n, T0 + 60, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    s_assert_state(h, n, T0 + 60, KVEDGE_HEALTH_DOWN);
    assert_false(kvedge_health_usable(h, n, T0 + 60));

    /* DOWN never lifts by itself, however much time passes or failures pile up. */
    assert_int_equal(kvedge_health_failure(h, n, T0 + 70, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    assert_int_equal(kvedge_health_tick(h, T0 + 1000000), 0);
    s_assert_state(h, n, T0 + 1000000, KVEDGE_HEALTH_DOWN);
    assert_false(kvedge_health_usable(h, n, T0 + 1000000));
    NEAR(kvedge_health_weight(h, n, T0 + 1000000), 0.0);

    /* A node first mentioned by a failure is added, unheard. */
    assert_int_equal(kvedge_health_failure(h, "new", T0, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    assert_int_equal(kvedge_health_get(h, "new", T0, &info), KVEDGE_OK);
    assert_int_equal(info.state, KVEDGE_HEALTH_UP);
    assert_int_equal(info.failures, 1);
    assert_int_equal(info.last_heard_ms, 0);
    kvedge_health_destroy(&h);
}

static void test_readmission_ramp(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(8);
    const char *n = "cloud-1";
    assert_int_equal(kvedge_health_heartbeat(h, n, T0), KVEDGE_OK);
    uint64_t back = T0 + KVEDGE_HEALTH_DOWN_MS + 5000; /* DOWN by silence, then heard */
    s_assert_state(h, n, back - 1, KVEDGE_HEALTH_DOWN);
    assert_int_equal(kvedge_health_heartbeat(h, n, back), KVEDGE_OK);
    s_assert_state(h, n, back, KVEDGE_HEALTH_UP);
    assert_true(kvedge_health_usable(h, n, back));
    NEAR(kvedge_health_weight(h, n, back), 0.1);
    kvedge_health_info_t info;
    assert_int_equal(kvedge_health_get(h, n, back, &info), KVEDGE_OK);
    assert_true(info.probation);
    assert_int_equal(info.probation_start_ms, back);

    /* Keep it heard (heartbeats on probation do not restart the ramp). */
    for (uint64_t t = back + 1000; t < back + KVEDGE_HEALTH_READMIT_MS; t += 1000)
        assert_int_equal(kvedge_health_heartbeat(h, n, t), KVEDGE_OK);
    NEAR(kvedge_health_weight(h, n, back + 2500), 0.325);
    NEAR(kvedge_health_weight(h, n, back + 5000), 0.55);
    NEAR(kvedge_health_weight(h, n, back + KVEDGE_HEALTH_READMIT_MS - 1),
         0.1 + 0.9 * (KVEDGE_HEALTH_READMIT_MS - 1) / (double)KVEDGE_HEALTH_READMIT_MS);
    NEAR(kvedge_health_weight(h, n, back + KVEDGE_HEALTH_READMIT_MS), 1.0);
    assert_int_equal(kvedge_health_get(h, n, back + KVEDGE_HEALTH_READMIT_MS, &info), KVEDGE_OK);
    assert_false(info.probation);
    /* Probation is over: one failure is an ordinary failure now. */
    assert_int_equal(kvedge_health_failure(h, n, back + KVEDGE_HEALTH_READMIT_MS, KVEDGE_ETIMEDOUT),
                     KVEDGE_OK);
    s_assert_state(h, n, back + KVEDGE_HEALTH_READMIT_MS, KVEDGE_HEALTH_UP);

    /* A probation node that goes quiet is SUSPECT and capped at the SUSPECT weight. */
    s_knock_down(h, "q", T0);
    assert_int_equal(kvedge_health_heartbeat(h, "q", T0), KVEDGE_OK);
    uint64_t quiet = T0 + KVEDGE_HEALTH_SUSPECT_MS + 1;
    s_assert_state(h, "q", quiet, KVEDGE_HEALTH_SUSPECT);
    NEAR(kvedge_health_weight(h, "q", quiet),
         0.1 + 0.9 * (double)(quiet - T0) / KVEDGE_HEALTH_READMIT_MS); /* ramp below the cap */
    NEAR(kvedge_health_weight(h, "q", T0 + 8000), KVEDGE_HEALTH_SUSPECT_WEIGHT);
    kvedge_health_destroy(&h);
}

static void test_failure_on_probation(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(8);
    const char *n = "edge-3";
    s_knock_down(h, n, T0);
    /* Re-admitted by a heartbeat: failures reset, ramp starts. */
    assert_int_equal(kvedge_health_heartbeat(h, n, T0 + 100), KVEDGE_OK);
    kvedge_health_info_t info;
    assert_int_equal(kvedge_health_get(h, n, T0 + 100, &info), KVEDGE_OK);
    assert_int_equal(info.state, KVEDGE_HEALTH_UP);
    assert_int_equal(info.failures, 0);
    assert_true(info.probation);

    /* One failure on probation (not a timeout): DOWN at once. */
    assert_int_equal(kvedge_health_heartbeat(h, n, T0 + 3000), KVEDGE_OK);
    assert_int_equal(kvedge_health_failure(h, n, T0 + 5100, KVEDGE_ECLOSED), KVEDGE_OK);
    s_assert_state(h, n, T0 + 5100, KVEDGE_HEALTH_DOWN);
    assert_false(kvedge_health_usable(h, n, T0 + 5100));
    assert_int_equal(kvedge_health_get(h, n, T0 + 5100, &info), KVEDGE_OK);
    assert_false(info.probation);

    /* The next heartbeat restarts probation from the bottom of the ramp. */
    assert_int_equal(kvedge_health_heartbeat(h, n, T0 + 6000), KVEDGE_OK);
    NEAR(kvedge_health_weight(h, n, T0 + 6000), 0.1);
    NEAR(kvedge_health_weight(h, n, T0 + 7000), 0.19);

    /* A success also re-admits (a late reply is proof of life), on probation too. */
    s_knock_down(h, "late", T0);
    assert_int_equal(kvedge_health_success(h, "late", T0 + 10), KVEDGE_OK);
    NEAR(kvedge_health_weight(h, "late", T0 + 10), 0.1);
    assert_int_equal(kvedge_health_get(h, "late", T0 + 10, &info), KVEDGE_OK);
    assert_true(info.probation);
    kvedge_health_destroy(&h);
}

/* A timeout on probation counts as any failure: the node stays usable on its ramp, SUSPECT
 * at the second in a row, DOWN at the fourth; a success in between clears the count and the
 * probation goes on. */
static void test_timeout_on_probation(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(8);
    const char *n = "jittery";
    s_knock_down(h, n, T0);
    assert_int_equal(kvedge_health_heartbeat(h, n, T0 + 100), KVEDGE_OK);
    assert_int_equal(kvedge_health_failure(h, n, T0 + 200, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    kvedge_health_info_t info;
    assert_int_equal(kvedge_health_get(h, n, T0 + 200, &info), KVEDGE_OK);
    assert_int_equal(info.state, KVEDGE_HEALTH_UP);
    assert_true(info.probation);
    assert_int_equal(info.failures, 1);
    assert_true(kvedge_health_usable(h, n, T0 + 200));
    NEAR(kvedge_health_weight(h, n, T0 + 1100), 0.1 + 0.9 * 1000 / KVEDGE_HEALTH_READMIT_MS);

    /* A success clears the count; the ramp is not restarted. */
    assert_int_equal(kvedge_health_success(h, n, T0 + 1100), KVEDGE_OK);
    assert_int_equal(kvedge_health_get(h, n, T0 + 1100, &info), KVEDGE_OK);
    assert_int_equal(info.failures, 0);
    assert_int_equal(info.probation_start_ms, T0 + 100);

    /* Two in a row: SUSPECT (still usable, capped), four: DOWN. */
    assert_int_equal(kvedge_health_failure(h, n, T0 + 1200, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    assert_int_equal(kvedge_health_failure(h, n, T0 + 1300, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    s_assert_state(h, n, T0 + 1300, KVEDGE_HEALTH_SUSPECT);
    assert_true(kvedge_health_usable(h, n, T0 + 1300));
    assert_int_equal(kvedge_health_failure(h, n, T0 + 1400, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    assert_int_equal(kvedge_health_failure(h, n, T0 + 1500, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    s_assert_state(h, n, T0 + 1500, KVEDGE_HEALTH_DOWN);
    kvedge_health_destroy(&h);
}

/* RFC 6298 on the round-trip samples: the first sets SRTT = R and RTTVAR = R / 2, later ones
 * move them by 1/8 and 1/4; the timeout is SRTT + 4 x RTTVAR and grows with the variation
 * of the samples, not only their mean. */
static void test_rtt_estimators(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(8);
    assert_int_equal(kvedge_health_rtt(NULL, "a", T0, 1000), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_rtt(h, "", T0, 1000), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_rtt(h, "a", T0, -1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_rtt(h, "a", T0, NAN), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_rtt(h, "a", T0, INFINITY), KVEDGE_EINVAL);
    NEAR(kvedge_health_rto_ms(NULL, "a"), 0);
    NEAR(kvedge_health_rto_ms(h, "unknown"), 0);
    assert_int_equal(kvedge_health_add(h, "a", T0), KVEDGE_OK);
    NEAR(kvedge_health_rto_ms(h, "a"), 0); /* known, never sampled */

    assert_int_equal(kvedge_health_rtt(h, "a", T0, 100000), KVEDGE_OK); /* 100 ms */
    NEAR(kvedge_health_rto_ms(h, "a"), 100 + 4 * 50);
    assert_int_equal(kvedge_health_rtt(h, "a", T0, 60000), KVEDGE_OK);
    /* RTTVAR = 3/4 50 + 1/4 |100 - 60| = 47.5 ms, SRTT = 7/8 100 + 1/8 60 = 95 ms. */
    kvedge_health_info_t info;
    assert_int_equal(kvedge_health_get(h, "a", T0, &info), KVEDGE_OK);
    NEAR(info.srtt_us, 95000);
    NEAR(info.rttvar_us, 47500);
    NEAR(kvedge_health_rto_ms(h, "a"), 95 + 4 * 47.5);
    /* A sample is not proof of life: the node is as silent as it was. */
    assert_int_equal(info.last_heard_ms, 0);

    /* Steady samples shrink RTTVAR toward 0 and the timeout toward SRTT; one that is far off
     * (a retransmission) widens it again. */
    for (int i = 0; i < 60; i++)
        assert_int_equal(kvedge_health_rtt(h, "b", T0, 50000), KVEDGE_OK);
    double steady = kvedge_health_rto_ms(h, "b");
    assert_true(steady > 50 && steady < 51);
    assert_int_equal(kvedge_health_rtt(h, "b", T0, 250000), KVEDGE_OK);
    assert_true(kvedge_health_rto_ms(h, "b") > steady + 4 * 0.25 * 200 - 1);
    /* 0 (loopback at microsecond resolution) is a sample too. */
    assert_int_equal(kvedge_health_rtt(h, "c", T0, 0), KVEDGE_OK);
    assert_true(kvedge_health_rto_ms(h, "c") > 0);
    kvedge_health_destroy(&h);
}

static void test_out_of_order_stamps(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(8);
    assert_int_equal(kvedge_health_heartbeat(h, "a", T0 + 5000), KVEDGE_OK);
    /* A stale heartbeat does not move the clock back. */
    assert_int_equal(kvedge_health_heartbeat(h, "a", T0), KVEDGE_OK);
    kvedge_health_info_t info;
    assert_int_equal(kvedge_health_get(h, "a", T0 + 5000, &info), KVEDGE_OK);
    assert_int_equal(info.last_heard_ms, T0 + 5000);
    s_assert_state(h, "a", T0 + 5000 + KVEDGE_HEALTH_SUSPECT_MS, KVEDGE_HEALTH_UP);
    /* A query older than the last heartbeat sees no silence at all. */
    s_assert_state(h, "a", T0, KVEDGE_HEALTH_UP);
    kvedge_health_destroy(&h);
}

static void test_capacity(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(0);
    char name[32];
    for (int i = 0; i < KVEDGE_HEALTH_MAX_NODES; i++) {
        snprintf(name, sizeof name, "node-%d", i);
        assert_int_equal(kvedge_health_heartbeat(h, name, T0), KVEDGE_OK);
    }
    assert_int_equal(kvedge_health_count(h), KVEDGE_HEALTH_MAX_NODES);
    assert_int_equal(kvedge_health_heartbeat(h, "one-more", T0), KVEDGE_EFULL);
    assert_int_equal(kvedge_health_failure(h, "one-more", T0, KVEDGE_EIO), KVEDGE_EFULL);
    assert_int_equal(kvedge_health_add(h, "one-more", T0), KVEDGE_EFULL);
    /* Known nodes still take events; every one is still found. */
    assert_int_equal(kvedge_health_failure(h, "node-7", T0, KVEDGE_EIO), KVEDGE_OK);
    for (int i = 0; i < KVEDGE_HEALTH_MAX_NODES; i++) {
        snprintf(name, sizeof name, "node-%d", i);
        s_assert_state(h, name, T0, KVEDGE_HEALTH_UP);
    }
    kvedge_health_destroy(&h);

    h = kvedge_health_new(2);
    assert_int_equal(kvedge_health_add(h, "x", T0), KVEDGE_OK);
    assert_int_equal(kvedge_health_add(h, "y", T0), KVEDGE_OK);
    assert_int_equal(kvedge_health_add(h, "z", T0), KVEDGE_EFULL);
    assert_int_equal(kvedge_health_count(h), 2);
    kvedge_health_destroy(&h);
}

typedef struct {
    int seen;
    int states[3];
    char names[8][KVEDGE_HEALTH_NAME_MAX + 1];
    kvedge_health_t *h; /* to call back into from the callback */
} s_walk_t;

static int s_collect(const kvedge_health_info_t *info, void *arg)
{
    s_walk_t *w = arg;
    if (w->seen < 8)
        strcpy(w->names[w->seen], info->name);
    w->seen++;
    w->states[info->state]++;
    /* The lock is not held: calling back in must not deadlock. */
    assert_true(kvedge_health_count(w->h) > 0);
    return 0;
}

static int s_stop_at_two(const kvedge_health_info_t *info, void *arg)
{
    (void)info;
    return ++*(int *)arg == 2 ? 42 : 0;
}

static void test_foreach(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(8);
    s_walk_t w = {.h = h};
    assert_int_equal(kvedge_health_foreach(h, T0, s_collect, &w), 0);
    assert_int_equal(w.seen, 0);

    assert_int_equal(kvedge_health_heartbeat(h, "up", T0), KVEDGE_OK);
    assert_int_equal(kvedge_health_heartbeat(h, "quiet", T0 - KVEDGE_HEALTH_SUSPECT_MS - 1),
                     KVEDGE_OK);
    s_knock_down(h, "down", T0);
    assert_int_equal(kvedge_health_failure(h, "flaky", T0, KVEDGE_EIO), KVEDGE_OK);
    assert_int_equal(kvedge_health_failure(h, "flaky", T0, KVEDGE_EIO), KVEDGE_OK);
    assert_int_equal(kvedge_health_foreach(h, T0, s_collect, &w), 0);
    assert_int_equal(w.seen, 4);
    assert_string_equal(w.names[0], "up"); /* order of addition */
    assert_string_equal(w.names[1], "quiet");
    assert_string_equal(w.names[2], "down");
    assert_string_equal(w.names[3], "flaky");
    assert_int_equal(w.states[KVEDGE_HEALTH_UP], 1);
    assert_int_equal(w.states[KVEDGE_HEALTH_SUSPECT], 2);
    assert_int_equal(w.states[KVEDGE_HEALTH_DOWN], 1);

    int calls = 0;
    assert_int_equal(kvedge_health_foreach(h, T0, s_stop_at_two, &calls), 42);
    assert_int_equal(calls, 2);
    kvedge_health_destroy(&h);
}

#define THREADS    4
#define PER_THREAD 5000
#define SHARED     8

typedef struct {
    kvedge_health_t *h;
    int id;
} s_worker_t;

/* Each thread: failures on shared "fail-*" nodes, heartbeats on shared "hb-*" nodes, a mix on
 * shared "mix-*" nodes, and a few snapshots. */
static void *s_worker(void *arg)
{
    s_worker_t *w = arg;
    char name[32];
    for (int i = 0; i < PER_THREAD; i++) {
        uint64_t now = T0 + (uint64_t)i;
        int k = i % SHARED;
        snprintf(name, sizeof name, "fail-%d", k);
        if (kvedge_health_failure(w->h, name, now, KVEDGE_ETIMEDOUT) != KVEDGE_OK)
            return (void *)1;
        snprintf(name, sizeof name, "hb-%d", k);
        if (kvedge_health_heartbeat(w->h, name, now) != KVEDGE_OK)
            return (void *)1;
        snprintf(name, sizeof name, "mix-%d", k);
        int rc = (i + w->id) % 3 == 0   ? kvedge_health_success(w->h, name, now)
                 : (i + w->id) % 3 == 1 ? kvedge_health_failure(w->h, name, now, KVEDGE_EIO)
                                        : kvedge_health_heartbeat(w->h, name, now);
        if (rc != KVEDGE_OK)
            return (void *)1;
        double wt = kvedge_health_weight(w->h, name, now);
        if (!(wt >= 0.0 && wt <= 1.0))
            return (void *)1;
        if (i % 1000 == 0 && kvedge_health_tick(w->h, now) < 0)
            return (void *)1;
    }
    return NULL;
}

static int s_count_nodes(const kvedge_health_info_t *info, void *arg)
{
    (void)info;
    ++*(int *)arg;
    return 0;
}

static void test_threads(void **state)
{
    (void)state;
    kvedge_health_t *h = kvedge_health_new(0);
    pthread_t th[THREADS];
    s_worker_t w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (s_worker_t){h, i};
        assert_int_equal(pthread_create(&th[i], NULL, s_worker, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        void *ret = (void *)1;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_null(ret);
    }
    assert_int_equal(kvedge_health_count(h), 3 * SHARED);
    int nodes = 0;
    assert_int_equal(kvedge_health_foreach(h, T0 + PER_THREAD, s_count_nodes, &nodes), 0);
    assert_int_equal(nodes, 3 * SHARED);

    char name[32];
    kvedge_health_info_t info;
    for (int k = 0; k < SHARED; k++) {
        /* Never heard, never succeeded: every failure counted, none lost to a race. */
        snprintf(name, sizeof name, "fail-%d", k);
        assert_int_equal(kvedge_health_get(h, name, T0 + PER_THREAD, &info), KVEDGE_OK);
        assert_int_equal(info.failures, THREADS * PER_THREAD / SHARED);
        assert_int_equal(info.state, KVEDGE_HEALTH_DOWN);
        assert_int_equal(info.last_heard_ms, 0);
        /* Heard at the latest stamp any thread sent for it. */
        snprintf(name, sizeof name, "hb-%d", k);
        assert_int_equal(kvedge_health_get(h, name, T0 + PER_THREAD, &info), KVEDGE_OK);
        assert_int_equal(info.failures, 0);
        assert_int_equal(info.state, KVEDGE_HEALTH_UP);
        assert_int_equal(info.last_heard_ms, T0 + PER_THREAD - SHARED + k);
    }
    kvedge_health_destroy(&h);
}

/* ---------------------------------------------------------------- the observer */

typedef struct {
    char node[KVEDGE_HEALTH_NAME_MAX + 1];
    kvedge_health_state_t from, to;
    char reason[KVEDGE_HEALTH_REASON_MAX + 1];
    uint64_t now;
} s_seen_t;

typedef struct {
    kvedge_health_t *h;
    s_seen_t v[64];
    size_t n;
    int reentered; /* states read back from inside the observer */
} s_obs_t;

static void s_observe(const char *node, kvedge_health_state_t from, kvedge_health_state_t to,
                      const char *reason, uint64_t now_ms, void *arg)
{
    s_obs_t *o = arg;
    assert_true(o->n < 64);
    s_seen_t *x = &o->v[o->n++];
    snprintf(x->node, sizeof x->node, "%s", node);
    x->from = from;
    x->to = to;
    snprintf(x->reason, sizeof x->reason, "%s", reason);
    x->now = now_ms;
    /* Called without the table's lock: reading the table back must not deadlock (it may
     * already be past `to`: a call's changes are told once it is done). */
    if (kvedge_health_state(o->h, node, now_ms) >= 0)
        o->reentered++;
}

/* The i-th change seen (from the end when i < 0) is node from -> to with that reason. */
static void s_assert_seen(const s_obs_t *o, int i, const char *node, kvedge_health_state_t from,
                          kvedge_health_state_t to, const char *reason)
{
    size_t at = i < 0 ? o->n - (size_t)-i : (size_t)i;
    if (at >= o->n)
        fail_msg("change %d of %zu not seen (%s %s -> %s)", i, o->n, node,
                 kvedge_health_state_name(from), kvedge_health_state_name(to));
    const s_seen_t *x = &o->v[at];
    if (strcmp(x->node, node) != 0 || x->from != from || x->to != to ||
        strcmp(x->reason, reason) != 0)
        fail_msg("change %zu: %s %s -> %s '%s', want %s %s -> %s '%s'", at, x->node,
                 kvedge_health_state_name(x->from), kvedge_health_state_name(x->to), x->reason,
                 node, kvedge_health_state_name(from), kvedge_health_state_name(to), reason);
}

static void test_observer(void **state)
{
    (void)state;
    assert_int_equal(kvedge_health_set_observer(NULL, s_observe, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_health_transitions(NULL), 0);
    kvedge_health_t *h = kvedge_health_new(0);
    s_obs_t *o = calloc(1, sizeof *o);
    o->h = h;
    assert_int_equal(kvedge_health_set_observer(h, s_observe, o), KVEDGE_OK);
    char want[KVEDGE_HEALTH_REASON_MAX + 1];

    /* Silence: UP -> SUSPECT -> DOWN, each seen by the query that noticed it. */
    assert_int_equal(kvedge_health_add(h, "quiet", T0), KVEDGE_OK);
    assert_int_equal(o->n, 0); /* adding is not a change */
    s_assert_state(h, "quiet", T0 + KVEDGE_HEALTH_SUSPECT_MS + 1, KVEDGE_HEALTH_SUSPECT);
    snprintf(want, sizeof want, "silent for %u ms", KVEDGE_HEALTH_SUSPECT_MS + 1);
    s_assert_seen(o, 0, "quiet", KVEDGE_HEALTH_UP, KVEDGE_HEALTH_SUSPECT, want);
    assert_int_equal(o->v[0].now, T0 + KVEDGE_HEALTH_SUSPECT_MS + 1);
    s_assert_state(h, "quiet", T0 + KVEDGE_HEALTH_DOWN_MS + 1, KVEDGE_HEALTH_DOWN);
    snprintf(want, sizeof want, "silent for %u ms", KVEDGE_HEALTH_DOWN_MS + 1);
    s_assert_seen(o, 1, "quiet", KVEDGE_HEALTH_SUSPECT, KVEDGE_HEALTH_DOWN, want);
    assert_int_equal(o->n, 2);

    /* Re-admission: heard again after the silence, on probation. */
    assert_int_equal(kvedge_health_heartbeat(h, "quiet", T0 + 20000), KVEDGE_OK);
    s_assert_seen(o, 2, "quiet", KVEDGE_HEALTH_DOWN, KVEDGE_HEALTH_UP,
                  "heard again after 20000 ms");
    assert_int_equal(o->n, 3);
    /* A failure on probation (not a timeout) sends it straight back. */
    assert_int_equal(kvedge_health_failure(h, "quiet", T0 + 20100, KVEDGE_ECLOSED), KVEDGE_OK);
    snprintf(want, sizeof want, "failed on probation: %s", kvedge_strerror(KVEDGE_ECLOSED));
    s_assert_seen(o, 3, "quiet", KVEDGE_HEALTH_UP, KVEDGE_HEALTH_DOWN, want);
    assert_int_equal(o->n, 4);

    /* Failures: SUSPECT at 2, DOWN at 4, the last error named. */
    assert_int_equal(kvedge_health_failure(h, "flaky", T0, KVEDGE_EIO), KVEDGE_OK);
    assert_int_equal(o->n, 4);
    assert_int_equal(kvedge_health_failure(h, "flaky", T0, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    snprintf(want, sizeof want, "2 consecutive failures, last: %s",
             kvedge_strerror(KVEDGE_ETIMEDOUT));
    s_assert_seen(o, 4, "flaky", KVEDGE_HEALTH_UP, KVEDGE_HEALTH_SUSPECT, want);
    assert_int_equal(kvedge_health_failure(h, "flaky", T0, KVEDGE_ETIMEDOUT), KVEDGE_OK);
    assert_int_equal(o->n, 5); /* still SUSPECT: no change */
    assert_int_equal(kvedge_health_failure(h, "flaky", T0, KVEDGE_ECLOSED), KVEDGE_OK);
    snprintf(want, sizeof want, "4 consecutive failures, last: %s",
             kvedge_strerror(KVEDGE_ECLOSED));
    s_assert_seen(o, 5, "flaky", KVEDGE_HEALTH_SUSPECT, KVEDGE_HEALTH_DOWN, want);

    /* SUSPECT -> UP: by a success, and by a heartbeat after a silence (noticed late: the
     * silence, then the heartbeat). */
    s_knock_down(h, "spare", T0); /* a node with a history... */
    size_t before = o->n;
    assert_int_equal(kvedge_health_failure(h, "ok", T0, KVEDGE_EIO), KVEDGE_OK);
    assert_int_equal(kvedge_health_failure(h, "ok", T0, KVEDGE_EIO), KVEDGE_OK);
    assert_int_equal(kvedge_health_success(h, "ok", T0 + 10), KVEDGE_OK);
    s_assert_seen(o, -1, "ok", KVEDGE_HEALTH_SUSPECT, KVEDGE_HEALTH_UP, "a request succeeded");
    assert_int_equal(o->n, before + 2);
    assert_int_equal(kvedge_health_heartbeat(h, "ok", T0 + 10 + 3500), KVEDGE_OK);
    s_assert_seen(o, -2, "ok", KVEDGE_HEALTH_UP, KVEDGE_HEALTH_SUSPECT, "silent for 3500 ms");
    s_assert_seen(o, -1, "ok", KVEDGE_HEALTH_SUSPECT, KVEDGE_HEALTH_UP, "heard again");
    assert_int_equal(o->n, before + 4);
    assert_int_equal(o->reentered, (int)o->n);
    assert_int_equal(kvedge_health_transitions(h), o->n);

    /* A tick that changes many nodes reports each of them. */
    kvedge_health_t *many = kvedge_health_new(16);
    s_obs_t *om = calloc(1, sizeof *om);
    om->h = many;
    for (int i = 0; i < 10; i++) {
        char name[16];
        snprintf(name, sizeof name, "n%d", i);
        assert_int_equal(kvedge_health_add(many, name, T0), KVEDGE_OK);
    }
    assert_int_equal(kvedge_health_set_observer(many, s_observe, om), KVEDGE_OK);
    assert_int_equal(kvedge_health_tick(many, T0 + KVEDGE_HEALTH_SUSPECT_MS + 5), 10);
    assert_int_equal(om->n, 10);
    for (int i = 0; i < 10; i++) {
        char name[16];
        snprintf(name, sizeof name, "n%d", i);
        s_assert_seen(om, i, name, KVEDGE_HEALTH_UP, KVEDGE_HEALTH_SUSPECT, "silent for 3005 ms");
    }
    /* Removed: changes are still counted, nobody hears them. */
    assert_int_equal(kvedge_health_set_observer(many, NULL, om), KVEDGE_OK);
    assert_int_equal(kvedge_health_tick(many, T0 + KVEDGE_HEALTH_DOWN_MS + 5), 10);
    assert_int_equal(om->n, 10);
    assert_int_equal(kvedge_health_transitions(many), 20);
    kvedge_health_destroy(&many);
    free(om);
    kvedge_health_destroy(&h);
    free(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_degenerate_and_errors),
        cmocka_unit_test(test_silence),
        cmocka_unit_test(test_failures_and_success),
        cmocka_unit_test(test_readmission_ramp),
        cmocka_unit_test(test_failure_on_probation),
        cmocka_unit_test(test_timeout_on_probation),
        cmocka_unit_test(test_rtt_estimators),
        cmocka_unit_test(test_out_of_order_stamps),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_foreach),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_observer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
