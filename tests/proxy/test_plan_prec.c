/* Path planner with a precision choice: per-layer (source, precision) under a quality budget on
 * hand-computed cases, the precision-aware timeline, bound, cost and quality, re-planning after
 * a bandwidth drop, the formatter, argument errors, the P == 1 regression against the plain
 * planner, and a seeded property test (within budget, never above any fixed precision). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/plan.h"
#include "access/codec/error.h"
#include "tests/common/plan_fx.h"

static kvedge_plan_prec_t s_prec(uint32_t n, const double *qc, double budget)
{
    kvedge_plan_prec_t p;
    memset(&p, 0, sizeof p);
    p.n = n;
    p.quality_cost = qc;
    p.budget = budget;
    return p;
}

static void s_assign_of(const kvedge_plan_t *p, int32_t *as, int32_t *pa)
{
    for (uint32_t l = 0; l < p->layers; l++) {
        as[l] = p->layer[l].source;
        pa[l] = p->layer[l].prec;
    }
}

/* Asserts the layers' (source, precision). */
static void s_expect(const kvedge_plan_t *p, const int32_t *src, const int32_t *prec)
{
    for (uint32_t l = 0; l < p->layers; l++) {
        if (p->layer[l].source != src[l] || p->layer[l].prec != prec[l])
            fail_msg("layer %u: (%d, %d), want (%d, %d)", (unsigned)l, (int)p->layer[l].source,
                     (int)p->layer[l].prec, (int)src[l], (int)prec[l]);
    }
}

/* ---- one cloud, int8 / int4 ------------------------------------------------------------
 * L = 3, prefix 0, compute 100 per layer, recompute 2000 per layer (never worth it here).
 * Cloud: rtt 100, 1 B/us; int8 (p 0) 400 B per layer, int4 (p 1) 200 B. Eq. 19: int8 costs
 * 100 + 400 = 500, int4 100 + 200 = 300. Quality: int8 free, int4 costs {5, 1, 1} (layer 0 the
 * most sensitive). Timelines (A: arrivals on the one stream, done: decoder):
 *   int8 x3:        A = 500, 900, 1300   done = 600, 1000, 1400   T 1400, quality 0
 *   int4 x3:        A = 300, 500, 700    done = 400, 600, 800     T 800,  quality 7
 *   int8,int4,int4: A = 500, 700, 900    done = 600, 800, 1000    T 1000, quality 2
 *   int8,int4,int8: A = 500, 700, 1100   done = 600, 800, 1200    T 1200, quality 1
 *   int4,int8,int8: A = 300, 700, 1100   done = 400, 800, 1200    T 1200, quality 5 */
static double g_compute[3] = {100, 100, 100}, g_recompute[3] = {2000, 2000, 2000};
static double g_cloud[3 * 2] = {400, 200, 400, 200, 400, 200}; /* [l][p] */
static double g_qc[3 * 2] = {0, 5, 0, 1, 0, 1};
static const kvedge_prec_t g_rungs[2] = {KVEDGE_PREC_INT8, KVEDGE_PREC_INT4_G32};

static void test_budget_keeps_sensitive_layer_fine(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {3, 0, g_compute, g_recompute};
    kvedge_plan_source_t src[1] = {s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e6, NULL)};
    kvedge_plan_prec_t pr = s_prec(2, g_qc, 2);
    pr.layer_prec_bytes[0] = g_cloud;
    kvedge_plan_t *p = s_plan_new();
    /* Budget 2: int4 fits on layers 1 and 2 (1 + 1) but not on layer 0 (5). Best within it:
     * int8, int4, int4 = 1000 (each single int4 move: 1200; int4 on layer 0: over budget).
     * Step 1: int8 alone 1400 (recompute only makes it worse: layer 0 recomputed = 2100 before
     * layer 1 is even needed). int4 alone: all-int4 (quality 7) is repaired by recomputing
     * layer 0 (the highest cost): {R, int4, int4}: done = 2100, 2200, 2300 -> 2300. Step 2 from
     * int8 x3: layer 1 to int4 (1200, quality 1), layer 2 to int4 (1000, quality 2); layer 0
     * to int4 would give 800 at quality 7: refused. */
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 1, p), KVEDGE_OK);
    s_expect(p, (int32_t[]){0, 0, 0}, (int32_t[]){0, 1, 1});
    EQ(p->total_us, 1000);
    EQ(p->quality_used, 2);
    EQ(p->budget, 2);
    assert_int_equal(p->precs, 2);
    EQ(p->fixed_prec_us[0], 1400);
    EQ(p->fixed_prec_us[1], 2300);
    EQ(p->fixed_prec_quality[0], 0);
    EQ(p->fixed_prec_quality[1], 2);
    for (int i = 2; i < KVEDGE_PLAN_MAX_PRECS; i++)
        assert_true(isinf(p->fixed_prec_us[i]));
    /* Layer 0: int4 would lower T (to 800) but exceed the budget. Layers 1, 2: coarser than
     * int8, which the source also serves. */
    assert_int_equal(p->layer[0].prec_reason, KVEDGE_PLAN_PREC_BUDGET);
    assert_int_equal(p->layer[1].prec_reason, KVEDGE_PLAN_PREC_COARSER_FASTER);
    assert_int_equal(p->layer[2].prec_reason, KVEDGE_PLAN_PREC_COARSER_FASTER);
    for (int l = 0; l < 3; l++)
        assert_int_equal(p->layer[l].reason, KVEDGE_PLAN_ONLY_SOURCE);
    EQ(p->layer[0].quality, 0);
    EQ(p->layer[1].quality, 1);
    EQ(p->layer[0].cost_us, 500);
    EQ(p->layer[1].cost_us, 300);
    EQ(p->layer[0].arrival_us, 500);
    EQ(p->layer[1].arrival_us, 700);
    EQ(p->layer[2].arrival_us, 900);
    EQ(p->layer[2].done_us, 1000);
    /* Bound: t_1 = 500, stream end 900, X = 400, C = 300: 500 + 400. Load-then-compute: 900 +
     * 300. Step 1's winner (int8) is split m = 0 (all from the cloud) at 1400; cloud-only at
     * int8 1400 (at int4, repaired, 2300); recompute-all 3 * 2100. */
    EQ(p->bound_us, 900);
    EQ(p->load_then_compute_us, 1200);
    assert_int_equal(p->split, 0);
    EQ(p->split_us, 1400);
    EQ(p->cloud_only_us, 1400);
    assert_int_equal(p->cloud_source, 0);
    EQ(p->recompute_all_us, 6300);

    /* Budget 7: all int4 fits, 800 (the int4 run wins step 1; nothing moves back to int8 without
     * raising T: int8 on layer 0 gives 1000, on layer 1 A = 300, 700, 900 -> 1000). */
    pr.budget = 7;
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 1, p), KVEDGE_OK);
    s_expect(p, (int32_t[]){0, 0, 0}, (int32_t[]){1, 1, 1});
    EQ(p->total_us, 800);
    EQ(p->quality_used, 7);
    EQ(p->fixed_prec_us[1], 800);
    EQ(p->fixed_prec_us[0], 1400);
    for (int l = 0; l < 3; l++)
        assert_int_equal(p->layer[l].prec_reason, KVEDGE_PLAN_PREC_COARSER_FASTER);

    /* Budget 1: one int4 layer at most, on 1 or 2 (both 1200): the first move that lowers T
     * is taken in layer order (layer 1), then layer 2 would exceed it. */
    pr.budget = 1;
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 1, p), KVEDGE_OK);
    s_expect(p, (int32_t[]){0, 0, 0}, (int32_t[]){0, 1, 0});
    EQ(p->total_us, 1200);
    EQ(p->quality_used, 1);
    assert_int_equal(p->layer[2].prec_reason, KVEDGE_PLAN_PREC_BUDGET); /* int4: 1000 */
    free(p);
}

/* No recompute_us (a fetch-only request): with a budget that int4 everywhere would break, the
 * plan fetches every layer within it (int8 where it must) and never recomputes one that a
 * source serves, though recomputation would cost no quality. */
/* ---- a plain and an entropy-coded rung: bytes against decode time ----------------------
 * L = 3, compute 1 per layer, recompute never worth it. One cloud, rtt 100. p 0 = int4-g32,
 * 1000 B per layer; p 1 = int4-g32+ec, 950 B and 4 us per KB to decode (0.004 us/B: 3.8 us a
 * layer); quality identical (0). Eq. 19 per layer: plain 100 + 1000/bw, coded
 * 100 + 950/bw + 3.8.
 * Slow link, 1e4 B/s (0.01 B/us): plain 100100, coded 95103.8: coded everywhere,
 * T = 100 + 3 x 95003.8 + 1 = 285112.4.
 * Fast link, 1e10 B/s (1e4 B/us): plain 100.1, coded 103.895: plain everywhere,
 * T = 100.1 + 3 x 1 (the layers after the first arrive while the decoder works).
 * Without the decode price the coded rung is taken on the fast link too (fewer bytes). */
static double g_ec_compute[3] = {1, 1, 1}, g_ec_recompute[3] = {1e9, 1e9, 1e9};
static double g_ec_bytes[3 * 2] = {1000, 950, 1000, 950, 1000, 950};
static double g_ec_qc[3 * 2] = {0, 0, 0, 0, 0, 0};
static double g_ec_dec[2] = {0, 0.004};
static const kvedge_prec_t g_ec_rungs[2] = {KVEDGE_PREC_INT4_G32,
                                            KVEDGE_PREC_INT4_G32 | KVEDGE_PREC_EC};

static void test_decode_cost_prices_coded_rung(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {3, 0, g_ec_compute, g_ec_recompute};
    kvedge_plan_prec_t pr = s_prec(2, g_ec_qc, 0);
    pr.layer_prec_bytes[0] = g_ec_bytes;
    pr.rungs = g_ec_rungs;
    pr.decode_us_per_byte = g_ec_dec;
    kvedge_plan_t *p = s_plan_new();

    kvedge_plan_source_t slow = s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e4, NULL);
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, &slow, 1, p), KVEDGE_OK);
    s_expect(p, (int32_t[]){0, 0, 0}, (int32_t[]){1, 1, 1});
    EQ(p->total_us, 100 + 3 * 95003.8 + 1);
    EQ(kvedge_plan_cost_prec(&req, &pr, &slow, 1, 0, 1, 0), 100 + 95000 + 3.8);
    EQ(kvedge_plan_cost_prec(&req, &pr, &slow, 1, 0, 0, 0), 100 + 100000);

    kvedge_plan_source_t fast = s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e10, NULL);
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, &fast, 1, p), KVEDGE_OK);
    s_expect(p, (int32_t[]){0, 0, 0}, (int32_t[]){0, 0, 0});
    EQ(p->total_us, 100.1 + 3);
    EQ(kvedge_plan_cost_prec(&req, &pr, &fast, 1, 0, 1, 0), 100 + 0.095 + 3.8);

    /* Unpriced decode: fewer bytes always win. */
    pr.decode_us_per_byte = NULL;
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, &fast, 1, p), KVEDGE_OK);
    assert_int_equal(p->layer[0].prec, 1);

    /* A decode price that is no price is refused. */
    double bad[2] = {0, -1};
    pr.decode_us_per_byte = bad;
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, &fast, 1, p), KVEDGE_EINVAL);
    bad[1] = INFINITY;
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, &fast, 1, p), KVEDGE_EINVAL);
    free(p);
}

static void test_no_recompute(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {3, 0, g_compute, NULL};
    kvedge_plan_source_t src[1] = {s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e6, NULL)};
    kvedge_plan_prec_t pr = s_prec(2, g_qc, 2);
    pr.layer_prec_bytes[0] = g_cloud;
    kvedge_plan_t *p = s_plan_new();
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 1, p), KVEDGE_OK);
    s_expect(p, (int32_t[]){0, 0, 0}, (int32_t[]){0, 1, 1});
    EQ(p->total_us, 1000);
    assert_true(p->quality_used <= 2);
    assert_true(isinf(p->recompute_all_us));
    free(p);
}

static void test_budget_zero(void **state)
{
    (void)state;
    /* As above, but recompute 300 per layer and int8 of layer 1 costs 0.5: with budget 0 the
     * fetched layers must be free (int8 of layers 0 and 2) and layer 1 is recomputed.
     *   {int8, R, int8}: A0 = 500, done0 = 600; layer 1 recomputed after a fetched layer 0
     *     runs the context through 0 and 1: done1 = 600 + 100 + 600 = 1300; A2 = 900,
     *     done2 = 1400.
     *   {R, R, int8}: done0 = 400, done1 = 800, A2 = 100 + 400 = 500, done2 = 900.
     *   {R, R, R}: 400, 800, 1200.   {int8, R, R}: 600, 1300, 1700.
     * So {R, R, int8} at 900: step 1's int8 run finds it (split m = 1, repaired: layer 1's
     * int8 recomputed). */
    double recompute[3] = {300, 300, 300}, qc[6] = {0, 5, 0.5, 1, 0, 1};
    kvedge_plan_request_t req = {3, 0, g_compute, recompute};
    kvedge_plan_source_t src[1] = {s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e6, NULL)};
    kvedge_plan_prec_t pr = s_prec(2, qc, 0);
    pr.layer_prec_bytes[0] = g_cloud;
    kvedge_plan_t *p = s_plan_new();
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 1, p), KVEDGE_OK);
    s_expect(p, (int32_t[]){R, R, 0}, (int32_t[]){-1, -1, 0});
    EQ(p->total_us, 900);
    EQ(p->quality_used, 0);
    EQ(p->fixed_prec_us[0], 900);
    /* int4 alone: every int4 layer costs > 0, so everything is recomputed: 1200. */
    EQ(p->fixed_prec_us[1], 1200);
    EQ(p->fixed_prec_quality[1], 0);
    assert_int_equal(p->split, 1);
    /* Layer 0: no fetch lowers T (int8: 1400; int4: A0 = 300, done0 = 400, done1 = 1100,
     * done2 = 1200). Layer 1: int4 would (A1 = 300, done1 = 500, A2 = 700, done2 = 800) but
     * costs 1. Layer 2: int8 is its finest, int4 would not lower T (done2 = 900 still). */
    assert_int_equal(p->layer[0].prec_reason, KVEDGE_PLAN_PREC_NONE);
    assert_int_equal(p->layer[1].prec_reason, KVEDGE_PLAN_PREC_BUDGET);
    assert_int_equal(p->layer[2].prec_reason, KVEDGE_PLAN_PREC_FINEST);
    assert_int_equal(p->layer[0].reason, KVEDGE_PLAN_RECOMPUTE_FASTER);
    /* t_1 = 0, stream end 500, C = 300 + 300 + 300: bound 900 = T. */
    EQ(p->bound_us, 900);
    for (int l = 0; l < 3; l++)
        if (p->layer[l].source != R)
            EQ(p->layer[l].quality, 0);
    free(p);
}

static void test_rung_not_served(void **state)
{
    (void)state;
    /* The first case, budget 7, but the cloud holds layer 2 at int8 only (int4 bytes -1):
     * {int4, int4, int8}: A = 300, 500, 900; done = 400, 600, 1000; quality 5 + 1 + 0.
     * Recomputing layer 2 after fetched layers pays layers 0..2: 6000. int4 alone (step 1):
     * splits {c4, c4, R} = 600 + 100 + 6000 = 6700 and {R, c4, R}: done0 = 2100, A1 = 300,
     * done1 = 2200, layer 2 runs the context through 1 and 2: 2200 + 100 + 4000 = 6300. */
    double cb[6] = {400, 200, 400, 200, 400, -1};
    kvedge_plan_request_t req = {3, 0, g_compute, g_recompute};
    kvedge_plan_source_t src[1] = {s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e6, NULL)};
    kvedge_plan_prec_t pr = s_prec(2, g_qc, 7);
    pr.layer_prec_bytes[0] = cb;
    kvedge_plan_t *p = s_plan_new();
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 1, p), KVEDGE_OK);
    s_expect(p, (int32_t[]){0, 0, 0}, (int32_t[]){1, 1, 0});
    EQ(p->total_us, 1000);
    EQ(p->quality_used, 6);
    EQ(p->fixed_prec_us[0], 1400);
    EQ(p->fixed_prec_us[1], 6300);
    assert_int_equal(p->layer[2].prec_reason, KVEDGE_PLAN_PREC_ONLY);
    assert_int_equal(p->layer[0].prec_reason, KVEDGE_PLAN_PREC_COARSER_FASTER);
    assert_true(isinf(kvedge_plan_cost_prec(&req, &pr, src, 1, 0, 1, 2)));
    free(p);
}

/* ---- the precision-aware timeline, bound, cost and quality ----------------------------- */

static void test_simulate_prec(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {3, 50, g_compute, g_recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e6, NULL),
        s_src(KVEDGE_PLAN_RECOMPUTE, "self", 0, 0, NULL),
    };
    kvedge_plan_prec_t pr = s_prec(2, g_qc, 2);
    pr.layer_prec_bytes[0] = g_cloud;
    double t, b, q, arr[3], done[3];
    /* {int8, int4, int4} with prefix 50: 1050; bound 50 + 900. */
    int32_t as[3] = {0, 0, 0}, pa[3] = {0, 1, 1};
    assert_int_equal(kvedge_plan_simulate_prec(&req, &pr, src, 2, as, pa, &t, arr, done),
                     KVEDGE_OK);
    EQ(t, 1050);
    EQ(arr[0], 500);
    EQ(arr[1], 700);
    EQ(arr[2], 900);
    EQ(done[2], 1000);
    assert_int_equal(kvedge_plan_bound_prec(&req, &pr, src, 2, as, pa, &b), KVEDGE_OK);
    EQ(b, 950);
    assert_int_equal(kvedge_plan_quality(&req, &pr, src, 2, as, pa, &q), KVEDGE_OK);
    EQ(q, 2);
    /* A recomputed layer's precision is not read and costs nothing; a RECOMPUTE-kind source is
     * recompute: {R, int4, self}: done0 = 2100, A1 = 300, done1 = 2200, layer 2 through 1..2:
     * 2200 + 100 + 4000 = 6300, + 50. */
    int32_t as2[3] = {R, 0, 1}, pa2[3] = {99, 1, -7};
    assert_int_equal(kvedge_plan_simulate_prec(&req, &pr, src, 2, as2, pa2, &t, NULL, NULL),
                     KVEDGE_OK);
    EQ(t, 6350);
    assert_int_equal(kvedge_plan_quality(&req, &pr, src, 2, as2, pa2, &q), KVEDGE_OK);
    EQ(q, 1);
    /* Eq. 19 per precision. */
    EQ(kvedge_plan_cost_prec(&req, &pr, src, 2, 0, 0, 0), 500);
    EQ(kvedge_plan_cost_prec(&req, &pr, src, 2, 0, 1, 0), 300);
    EQ(kvedge_plan_cost_prec(&req, &pr, src, 2, R, 0, 1), 2000);
    EQ(kvedge_plan_cost_prec(&req, &pr, src, 2, 1, 5, 1), 2000); /* RECOMPUTE kind */
    assert_true(isinf(kvedge_plan_cost_prec(&req, &pr, src, 2, 0, 2, 0)));
    assert_true(isinf(kvedge_plan_cost_prec(&req, &pr, src, 2, 0, -1, 0)));
    assert_true(isinf(kvedge_plan_cost_prec(&req, &pr, src, 2, 0, 0, 3)));
    assert_true(isinf(kvedge_plan_cost_prec(NULL, &pr, src, 2, 0, 0, 0)));
    /* prec NULL: the plain functions (layer_bytes). */
    double lb[3] = {400, 400, 400};
    src[0].layer_bytes = lb;
    EQ(kvedge_plan_cost_prec(&req, NULL, src, 2, 0, 1, 0), 500);
    assert_int_equal(kvedge_plan_simulate_prec(&req, NULL, src, 2, as, NULL, &t, NULL, NULL),
                     KVEDGE_OK);
    EQ(t, 1450);
    assert_int_equal(kvedge_plan_quality(&req, NULL, src, 2, as, NULL, &q), KVEDGE_OK);
    EQ(q, 0);
}

/* ---- re-planning after a bandwidth drop ------------------------------------------------ */

static void test_replan_bandwidth_drop(void **state)
{
    (void)state;
    /* L = 4, compute 100, recompute 10000. Cloud: rtt 0; int8 100 B, int4 50 B per layer;
     * int4 costs 1 per layer, int8 0; budget 2.5.
     * At 1 B/us: int8 x4: A = 100..400, done = 200..500: T 500, compute-bound after layer 0.
     * int4 on layer 0 only: A = 50, 150, 250, 350; done = 150, 250, 350, 450: T 450 = t_1 + C
     * with the smallest t_1, so no further int4 helps: {int4, int8, int8, int8}. */
    double compute[4] = {100, 100, 100, 100}, recompute[4] = {10000, 10000, 10000, 10000};
    double cb[8] = {100, 50, 100, 50, 100, 50, 100, 50}, qc[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    kvedge_plan_request_t req = {4, 0, compute, recompute};
    kvedge_plan_source_t src[1] = {s_src(KVEDGE_PLAN_CLOUD, "cloud", 0, 1e6, NULL)};
    kvedge_plan_prec_t pr = s_prec(2, qc, 2.5);
    pr.layer_prec_bytes[0] = cb;
    kvedge_plan_t *p = s_plan_new(), *q = s_plan_new();
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 1, p), KVEDGE_OK);
    s_expect(p, (int32_t[]){0, 0, 0, 0}, (int32_t[]){1, 0, 0, 0});
    EQ(p->total_us, 450);
    EQ(p->quality_used, 1);
    assert_int_equal(p->layer[1].prec_reason, KVEDGE_PLAN_PREC_FINEST); /* int4 ties at 450 */

    /* Layers 0 and 1 delivered (quality 1 + 0), then the link drops to 0.25 B/us: int8 400 us
     * a layer, int4 200 us. From now (streams restart, no prefix), budget left 1.5:
     *   {int8, int8}: A = 400, 800, done = 500, 900
     *   {int4, int8}: A = 200, 600, done = 300, 700 (quality 1 + 1 = 2)
     *   {int4, int4}: A = 200, 400, done = 300, 500 (quality 3: over)
     * Layer 2 moves to int4; layer 3 stays int8 for the budget. int4 alone: {int4, int4} is
     * repaired by recomputing layer 2, which runs the context through 0..2 (both delivered
     * layers were fetched): done2 = 100 + 30000, A3 = 200, done3 = 30200. */
    src[0].bw_bytes_per_s = 2.5e5;
    assert_int_equal(kvedge_plan_replan_prec(&req, &pr, src, 1, p, 2, KVEDGE_PLAN_SRC_NONE, q),
                     KVEDGE_OK);
    assert_int_equal(q->first_layer, 2);
    s_expect(q, (int32_t[]){0, 0, 0, 0}, (int32_t[]){1, 0, 1, 0});
    assert_int_equal(q->layer[0].reason, KVEDGE_PLAN_DELIVERED);
    assert_int_equal(q->layer[0].prec_reason, KVEDGE_PLAN_PREC_COARSER_FASTER); /* kept */
    EQ(q->layer[0].quality, 1);
    EQ(q->total_us, 700);
    EQ(q->quality_used, 2);
    EQ(q->fixed_prec_us[0], 900);
    EQ(q->fixed_prec_us[1], 30200);
    EQ(q->fixed_prec_quality[0], 1); /* the delivered layers count */
    assert_int_equal(q->layer[2].prec_reason, KVEDGE_PLAN_PREC_COARSER_FASTER);
    assert_int_equal(q->layer[3].prec_reason, KVEDGE_PLAN_PREC_BUDGET);
    EQ(q->layer[2].arrival_us, 200);
    EQ(q->layer[3].done_us, 700);

    /* The budget lowered below what was delivered: the rest adds nothing (int8), and
     * quality_used is the delivered excess. */
    pr.budget = 0.5;
    assert_int_equal(kvedge_plan_replan_prec(&req, &pr, src, 1, p, 2, KVEDGE_PLAN_SRC_NONE, q),
                     KVEDGE_OK);
    s_expect(q, (int32_t[]){0, 0, 0, 0}, (int32_t[]){1, 0, 0, 0});
    EQ(q->total_us, 900);
    EQ(q->quality_used, 1);

    /* Everything received; and the plain replan of a plan with precisions keeps them. */
    pr.budget = 2.5;
    assert_int_equal(kvedge_plan_replan_prec(&req, &pr, src, 1, p, 4, KVEDGE_PLAN_SRC_NONE, q),
                     KVEDGE_OK);
    EQ(q->total_us, 0);
    EQ(q->quality_used, 1);
    EQ(q->fixed_prec_us[1], 0);
    double lb[4] = {100, 100, 100, 100};
    src[0].layer_bytes = lb;
    assert_int_equal(kvedge_plan_replan(&req, src, 1, p, 1, KVEDGE_PLAN_SRC_NONE, q), KVEDGE_OK);
    assert_int_equal(q->layer[0].prec, 1);
    EQ(q->quality_used, 1);
    assert_int_equal(q->precs, 0);
    assert_int_equal(q->layer[1].prec, -1);
    assert_true(isinf(q->budget));
    free(p);
    free(q);
}

/* ---- P == 1 is the plain planner ------------------------------------------------------- */

static void test_regression_single_precision(void **state)
{
    (void)state;
    /* test_plan's split case: peer 200 B (rtt 0), cloud 100 B (rtt 450), compute 100,
     * recompute 1000, prefix 1000: {peer, peer, cloud, cloud} at 1750. */
    double compute[4] = {100, 100, 100, 100}, recompute[4] = {1000, 1000, 1000, 1000};
    double peer[4] = {200, 200, 200, 200}, cloud[4] = {100, 100, 100, 100};
    double qc[4] = {0.25, 0.5, 1, 2};
    kvedge_plan_request_t req = {4, 1000, compute, recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_PEER, "peer-a", 0, 1e6, peer),
        s_src(KVEDGE_PLAN_CLOUD, "cloud-1", 450, 1e6, cloud),
    };
    kvedge_plan_prec_t pr = s_prec(1, qc, 3.75); /* exactly the all-fetched cost */
    pr.layer_prec_bytes[0] = peer;
    pr.layer_prec_bytes[1] = cloud;
    kvedge_plan_t *p = s_plan_new(), *q = s_plan_new();
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 2, q), KVEDGE_OK);
    EQ(q->total_us, 1750);
    assert_true(q->total_us == p->total_us && q->bound_us == p->bound_us);
    assert_true(q->split_us == p->split_us && q->cloud_only_us == p->cloud_only_us);
    assert_true(q->recompute_all_us == p->recompute_all_us);
    assert_true(q->load_then_compute_us == p->load_then_compute_us);
    assert_int_equal(q->split, p->split);
    assert_int_equal(q->cloud_source, p->cloud_source);
    for (int l = 0; l < 4; l++) {
        assert_int_equal(q->layer[l].source, p->layer[l].source);
        assert_int_equal(q->layer[l].reason, p->layer[l].reason);
        assert_true(q->layer[l].cost_us == p->layer[l].cost_us);
        assert_true(q->layer[l].done_us == p->layer[l].done_us);
        assert_int_equal(q->layer[l].prec, 0);
        assert_int_equal(p->layer[l].prec, -1);
        assert_int_equal(p->layer[l].prec_reason, KVEDGE_PLAN_PREC_NONE);
        assert_int_equal(q->layer[l].prec_reason, KVEDGE_PLAN_PREC_ONLY);
    }
    EQ(q->quality_used, 3.75);
    EQ(q->fixed_prec_us[0], 1750);
    EQ(p->quality_used, 0);
    assert_int_equal(p->precs, 0);
    assert_true(isinf(p->budget) && isinf(p->fixed_prec_us[0]));

    /* A budget below it (layer 3 alone costs 2): within it, and no faster than without it. */
    pr.budget = 1.75;
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 2, q), KVEDGE_OK);
    assert_true(q->quality_used <= 1.75);
    assert_true(q->total_us >= p->total_us);
    free(p);
    free(q);
}

/* ---- the formatter --------------------------------------------------------------------- */

static void test_format_prec(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {3, 0, g_compute, g_recompute};
    kvedge_plan_source_t src[1] = {s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e6, NULL)};
    kvedge_plan_prec_t pr = s_prec(2, g_qc, 2);
    pr.layer_prec_bytes[0] = g_cloud;
    pr.rungs = g_rungs;
    kvedge_plan_t *p = s_plan_new();
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 1, p), KVEDGE_OK);
    assert_int_equal(p->prec_rung[0], KVEDGE_PREC_INT8);
    assert_int_equal(p->prec_rung[2], 0);
    char buf[4096];
    assert_int_equal(kvedge_plan_format(p, src, 1, buf, sizeof buf), KVEDGE_OK);
    assert_non_null(strstr(buf, "prec_reason"));
    assert_non_null(strstr(buf, "int4-g32"));
    assert_non_null(strstr(buf, " budget\n"));
    assert_non_null(strstr(buf, " coarser-faster\n"));
    assert_non_null(strstr(buf, "T 1.000 ms"));
    assert_non_null(strstr(buf, "quality 2 of budget 2"));
    assert_non_null(strstr(buf, "fixed precision: int8 1.400 ms (quality 0), int4-g32 2.300 ms"));
    /* Without rung codes: indices. */
    pr.rungs = NULL;
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 1, p), KVEDGE_OK);
    assert_int_equal(kvedge_plan_format(p, src, 1, buf, sizeof buf), KVEDGE_OK);
    assert_non_null(strstr(buf, "fixed precision: p0 1.400 ms"));
    assert_string_equal(kvedge_plan_prec_reason_name(KVEDGE_PLAN_PREC_COARSER_FASTER),
                        "coarser-faster");
    assert_string_equal(kvedge_plan_prec_reason_name(KVEDGE_PLAN_PREC_NONE), "none");
    assert_string_equal(kvedge_plan_prec_reason_name((kvedge_plan_prec_reason_t)99), "?");
    free(p);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void test_errors_prec(void **state)
{
    (void)state;
    double qc[6] = {0, 1, 0, 1, 0, 1}, cb[6] = {400, 200, 400, 200, 400, 200};
    kvedge_plan_request_t req = {3, 0, g_compute, g_recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e6, NULL),
        s_src(KVEDGE_PLAN_PEER, "peer", 100, 1e6, NULL),
    };
    src[1].up = false; /* a down source needs no table */
    kvedge_plan_prec_t pr = s_prec(2, qc, 1);
    pr.layer_prec_bytes[0] = cb;
    kvedge_plan_t *p = s_plan_new(), *q = s_plan_new();
    int32_t as[3] = {0, 0, 0}, pa[3] = {0, 1, 0};
    double t;
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 2, p), KVEDGE_OK);
    memset(q, 0x5a, sizeof *q);
    kvedge_plan_t before = *q;

#define BAD(call)                                                                                  \
    do {                                                                                           \
        assert_int_equal((call), KVEDGE_EINVAL);                                                   \
        assert_memory_equal(q, &before, sizeof before);                                            \
    } while (0)

    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, NULL));
    BAD(kvedge_plan_make_prec(NULL, &pr, src, 2, q));
    pr.n = 0;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    pr.n = KVEDGE_PLAN_MAX_PRECS + 1;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    pr.n = 2;
    pr.quality_cost = NULL;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    pr.quality_cost = qc;
    qc[3] = -1;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    qc[3] = NAN;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    qc[3] = INFINITY;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    qc[3] = 1;
    pr.budget = -1;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    pr.budget = INFINITY;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    pr.budget = NAN;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    pr.budget = 1;
    pr.layer_prec_bytes[0] = NULL;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    pr.layer_prec_bytes[0] = cb;
    cb[5] = NAN;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    cb[5] = -INFINITY;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    cb[5] = 200;
    src[1].up = true; /* up now, without a table */
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    src[1].up = false;
    kvedge_prec_t dup[2] = {KVEDGE_PREC_INT8, KVEDGE_PREC_INT8};
    pr.rungs = dup;
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    pr.rungs = g_rungs;
    src[0].bw_bytes_per_s = 0; /* the plain checks still apply */
    BAD(kvedge_plan_make_prec(&req, &pr, src, 2, q));
    src[0].bw_bytes_per_s = 1e6;
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, 2, p), KVEDGE_OK);

    /* simulate / bound / quality: precisions that cannot be served. */
    BAD(kvedge_plan_simulate_prec(&req, &pr, src, 2, as, NULL, &t, NULL, NULL));
    BAD(kvedge_plan_simulate_prec(&req, &pr, src, 2, as, pa, NULL, NULL, NULL));
    pa[1] = 2;
    BAD(kvedge_plan_simulate_prec(&req, &pr, src, 2, as, pa, &t, NULL, NULL));
    pa[1] = -1;
    BAD(kvedge_plan_bound_prec(&req, &pr, src, 2, as, pa, &t));
    pa[1] = 1;
    cb[3] = -1; /* layer 1 not served at int4 */
    BAD(kvedge_plan_quality(&req, &pr, src, 2, as, pa, &t));
    BAD(kvedge_plan_simulate_prec(&req, &pr, src, 2, as, pa, &t, NULL, NULL));
    cb[3] = 200;
    as[0] = 1; /* down */
    BAD(kvedge_plan_simulate_prec(&req, &pr, src, 2, as, pa, &t, NULL, NULL));
    as[0] = 0;
    BAD(kvedge_plan_quality(&req, &pr, src, 2, as, pa, NULL));
    assert_int_equal(kvedge_plan_simulate_prec(&req, &pr, src, 2, as, pa, &t, NULL, NULL),
                     KVEDGE_OK);

    /* replan */
    BAD(kvedge_plan_replan_prec(&req, &pr, src, 2, NULL, 1, KVEDGE_PLAN_SRC_NONE, q));
    BAD(kvedge_plan_replan_prec(&req, &pr, src, 2, p, 4, KVEDGE_PLAN_SRC_NONE, q));
    BAD(kvedge_plan_replan_prec(&req, &pr, src, 2, p, 1, 2, q));
    pr.n = 0;
    BAD(kvedge_plan_replan_prec(&req, &pr, src, 2, p, 1, KVEDGE_PLAN_SRC_NONE, q));
    pr.n = 2;
    p->layer[0].quality = NAN; /* not a plan this planner made */
    BAD(kvedge_plan_replan_prec(&req, &pr, src, 2, p, 1, KVEDGE_PLAN_SRC_NONE, q));
    p->layer[0].quality = -1;
    BAD(kvedge_plan_replan_prec(&req, &pr, src, 2, p, 1, KVEDGE_PLAN_SRC_NONE, q));
    p->layer[0].quality = 0;
    assert_int_equal(kvedge_plan_replan_prec(&req, &pr, src, 2, p, 1, KVEDGE_PLAN_SRC_NONE, p),
                     KVEDGE_OK);
#undef BAD
    free(p);
    free(q);
}

/* ---- property test --------------------------------------------------------------------- */

/* The plan is what the precision-aware simulate says it is, within its budget, never above a
 * fixed precision, its bound below it and its per-layer numbers consistent. */
static void s_check_plan(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *pr,
                         const kvedge_plan_source_t *src, size_t n, const kvedge_plan_t *p)
{
    int32_t as[KVEDGE_PLAN_MAX_LAYERS], pa[KVEDGE_PLAN_MAX_LAYERS];
    double arr[KVEDGE_PLAN_MAX_LAYERS], done[KVEDGE_PLAN_MAX_LAYERS], t, b, q;
    s_assign_of(p, as, pa);
    assert_int_equal(kvedge_plan_simulate_prec(req, pr, src, n, as, pa, &t, arr, done), KVEDGE_OK);
    assert_true(p->total_us == t); /* the plan's T is simulate's, bit for bit */
    assert_int_equal(kvedge_plan_bound_prec(req, pr, src, n, as, pa, &b), KVEDGE_OK);
    EQ(p->bound_us, b);
    assert_true(p->bound_us <= p->total_us + EPS);
    assert_int_equal(kvedge_plan_quality(req, pr, src, n, as, pa, &q), KVEDGE_OK);
    assert_true(p->quality_used == q);
    assert_true(p->quality_used <= pr->budget);
    assert_int_equal(p->precs, pr->n);
    for (uint32_t i = 0; i < KVEDGE_PLAN_MAX_PRECS; i++) {
        if (i < pr->n)
            assert_true(p->total_us <= p->fixed_prec_us[i]);
        else
            assert_true(isinf(p->fixed_prec_us[i]));
    }
    assert_true(p->total_us <= p->recompute_all_us + EPS);
    assert_true(p->total_us <= p->cloud_only_us + EPS);
    assert_true(p->total_us <= p->split_us + EPS);
    for (uint32_t l = 0; l < req->layers; l++) {
        const kvedge_plan_layer_t *y = &p->layer[l];
        EQ(y->arrival_us, arr[l]);
        EQ(y->done_us, done[l]);
        EQ(y->cost_us, kvedge_plan_cost_prec(req, pr, src, n, as[l], pa[l], l));
        if (as[l] == R) {
            assert_int_equal(y->prec, -1);
            EQ(y->quality, 0);
            assert_true(y->prec_reason == KVEDGE_PLAN_PREC_NONE ||
                        y->prec_reason == KVEDGE_PLAN_PREC_BUDGET);
        } else {
            assert_true(y->prec >= 0 && (uint32_t)y->prec < pr->n);
            assert_true(y->quality == pr->quality_cost[l * pr->n + (uint32_t)y->prec]);
            assert_int_not_equal(y->prec_reason, KVEDGE_PLAN_PREC_NONE);
        }
    }
}

static void test_property_prec(void **state)
{
    (void)state;
    enum { MAXL = 12, MAXP = 4, MAXS = 6 };
    static double bytes[MAXS][MAXL * MAXP], flat[MAXS][MAXL];
    double compute[MAXL], recompute[MAXL], qc[MAXL * MAXP];
    kvedge_plan_source_t src[MAXS];
    kvedge_plan_t *p = s_plan_new(), *q = s_plan_new(), *o = s_plan_new();
    g_rng = 20261124;
    for (int iter = 0; iter < 400; iter++) {
        uint32_t L = 1 + (uint32_t)(s_next() % MAXL);
        uint32_t P = 1 + (uint32_t)(s_next() % MAXP);
        size_t n = (size_t)(s_next() % (MAXS + 1));
        kvedge_plan_request_t req = {L, s_unif(0, 1000), compute, recompute};
        for (uint32_t l = 0; l < L; l++) {
            compute[l] = s_unif(0, 2000);
            recompute[l] = s_unif(0, 20000);
            /* Coarser rungs usually cost more quality; some are free. */
            double acc = 0;
            for (uint32_t k = 0; k < P; k++) {
                acc += s_next() % 4 == 0 ? 0 : s_unif(0, 2);
                qc[l * P + k] = k == 0 && s_next() % 2 ? 0 : acc;
            }
        }
        double all = 0;
        for (uint32_t i = 0; i < L * P; i++)
            all += qc[i];
        kvedge_plan_prec_t pr = s_prec(P, qc, s_next() % 8 == 0 ? 0 : s_unif(0, all / P * 1.5));
        for (size_t s = 0; s < n; s++) {
            kvedge_plan_kind_t kind = (kvedge_plan_kind_t)(s_next() % 5);
            src[s] = s_src(kind, "s", s_unif(0, 10000), s_unif(1e6, 1e9), NULL);
            src[s].up = s_next() % 5 != 0;
            pr.layer_prec_bytes[s] = bytes[s];
            for (uint32_t l = 0; l < L; l++) {
                double b = s_unif(0, 4e6);
                for (uint32_t k = 0; k < P; k++) {
                    bytes[s][l * P + k] = s_next() % 10 < 7 ? b : -1;
                    b *= s_unif(0.3, 1.0);
                }
            }
        }
        assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, n, p), KVEDGE_OK);
        s_check_plan(&req, &pr, src, n, p);

        /* P == 1 with room for everything: the plain planner's plan for the same bytes. */
        if (P == 1) {
            pr.budget = all;
            for (size_t s = 0; s < n; s++) {
                for (uint32_t l = 0; l < L; l++)
                    flat[s][l] = bytes[s][l];
                src[s].layer_bytes = flat[s];
            }
            assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, n, p), KVEDGE_OK);
            assert_int_equal(kvedge_plan_make(&req, src, n, o), KVEDGE_OK);
            assert_true(p->total_us == o->total_us);
            assert_int_equal(p->split, o->split);
            for (uint32_t l = 0; l < L; l++) {
                assert_int_equal(p->layer[l].source, o->layer[l].source);
                assert_int_equal(p->layer[l].reason, o->layer[l].reason);
            }
        }

        /* Mid-request: a bandwidth change (and maybe a failure); delivered layers keep their
         * precision and quality, the rest stays within what the budget has left. */
        uint32_t k = (uint32_t)(s_next() % (L + 1));
        int32_t f = n > 0 && s_next() % 2 ? (int32_t)(s_next() % n) : KVEDGE_PLAN_SRC_NONE;
        for (size_t s = 0; s < n; s++)
            src[s].bw_bytes_per_s *= s_unif(0.05, 2);
        assert_int_equal(kvedge_plan_replan_prec(&req, &pr, src, n, p, k, f, q), KVEDGE_OK);
        assert_true(q->quality_used <= pr.budget);
        double q0 = 0;
        for (uint32_t l = 0; l < L; l++) {
            if (l < k) {
                assert_int_equal(q->layer[l].source, p->layer[l].source);
                assert_int_equal(q->layer[l].prec, p->layer[l].prec);
                assert_true(q->layer[l].quality == p->layer[l].quality);
                q0 += p->layer[l].quality;
            } else if (f >= 0) {
                assert_int_not_equal(q->layer[l].source, f);
            }
        }
        assert_true(q->quality_used >= q0);
        for (uint32_t i = 0; i < P; i++)
            assert_true(q->total_us <= q->fixed_prec_us[i]);
        assert_true(q->bound_us <= q->total_us + EPS);
    }
    free(p);
    free(q);
    free(o);
}

/* The largest request: every limit at once stays within the step budgets. */
static void test_large_prec(void **state)
{
    (void)state;
    enum { P = KVEDGE_PLAN_MAX_PRECS, L = KVEDGE_PLAN_MAX_LAYERS, S = KVEDGE_PLAN_MAX_SOURCES };
    static double bytes[S][L * P], qc[L * P];
    static double compute[L], recompute[L];
    static kvedge_plan_source_t src[S];
    kvedge_plan_t *p = s_plan_new();
    g_rng = 7;
    for (uint32_t l = 0; l < L; l++) {
        compute[l] = s_unif(50, 150);
        recompute[l] = s_unif(500, 1500);
        for (uint32_t k = 0; k < P; k++)
            qc[l * P + k] = k * s_unif(0, 0.01);
    }
    kvedge_plan_prec_t pr = s_prec(P, qc, 2);
    for (size_t s = 0; s < S; s++) {
        src[s] = s_src((kvedge_plan_kind_t)(s % 4), "s", s_unif(0, 5000), s_unif(1e8, 1e9), NULL);
        pr.layer_prec_bytes[s] = bytes[s];
        for (uint32_t l = 0; l < L; l++) {
            double b = s_unif(1e4, 1e5);
            for (uint32_t k = 0; k < P; k++)
                bytes[s][l * P + k] = s_next() % 2 ? b / (1 + k) : -1;
        }
    }
    kvedge_plan_request_t req = {L, 0, compute, recompute};
    assert_int_equal(kvedge_plan_make_prec(&req, &pr, src, S, p), KVEDGE_OK);
    s_check_plan(&req, &pr, src, S, p);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_keeps_sensitive_layer_fine),
        cmocka_unit_test(test_budget_zero),
        cmocka_unit_test(test_decode_cost_prices_coded_rung),
        cmocka_unit_test(test_no_recompute),
        cmocka_unit_test(test_rung_not_served),
        cmocka_unit_test(test_simulate_prec),
        cmocka_unit_test(test_replan_bandwidth_drop),
        cmocka_unit_test(test_regression_single_precision),
        cmocka_unit_test(test_format_prec),
        cmocka_unit_test(test_errors_prec),
        cmocka_unit_test(test_property_prec),
        cmocka_unit_test(test_large_prec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
