/* Path planner: Eq. 19 cost, the pipelined timeline, the Eq. 20 bound, the split choice on
 * hand-computed cases, re-planning after a failure, the formatter, argument errors, and a
 * seeded property test (never worse than cloud-only, recompute-all or any single source). */
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

static void s_assign_of(const kvedge_plan_t *p, int32_t *as)
{
    for (uint32_t l = 0; l < p->layers; l++)
        as[l] = p->layer[l].source;
}

/* ---- Eq. 19 ---------------------------------------------------------------------------- */

static void test_cost(void **state)
{
    (void)state;
    double compute[2] = {100, 100}, recompute[2] = {300, 400};
    double pb[2] = {500, -1}, cb[2] = {1000, 1000};
    kvedge_plan_request_t req = {2, 0, compute, recompute};
    kvedge_plan_source_t src[3] = {
        s_src(KVEDGE_PLAN_PEER, "peer", 100, 1e6, pb),    /* 1 byte/us */
        s_src(KVEDGE_PLAN_CLOUD, "cloud", 2000, 2e6, cb), /* 2 bytes/us */
        s_src(KVEDGE_PLAN_RECOMPUTE, "self", 0, 0, NULL),
    };
    EQ(kvedge_plan_cost(&req, src, 3, 0, 0), 100 + 500);      /* rtt + 500 B at 1 B/us */
    assert_true(isinf(kvedge_plan_cost(&req, src, 3, 0, 1))); /* the peer lacks layer 1 */
    EQ(kvedge_plan_cost(&req, src, 3, 1, 1), 2000 + 500);     /* 1000 B at 2 B/us */
    EQ(kvedge_plan_cost(&req, src, 3, R, 0), 300);
    EQ(kvedge_plan_cost(&req, src, 3, R, 1), 400);
    EQ(kvedge_plan_cost(&req, src, 3, 2, 1), 400); /* a RECOMPUTE-kind source = recompute */
    src[1].up = false;
    assert_true(isinf(kvedge_plan_cost(&req, src, 3, 1, 0)));
    assert_true(isinf(kvedge_plan_cost(&req, src, 3, 3, 0)));  /* out of range */
    assert_true(isinf(kvedge_plan_cost(&req, src, 3, -2, 0))); /* not the sentinel */
    assert_true(isinf(kvedge_plan_cost(&req, src, 3, 0, 2)));  /* no layer 2 */
    assert_true(isinf(kvedge_plan_cost(NULL, src, 3, 0, 0)));
}

/* ---- the timeline and the bound -------------------------------------------------------- */

/* L = 3, prefix 50, compute 100 per layer, recompute 300. Peer: rtt 10, 200 B per layer at
 * 1 B/us. Cloud: rtt 100, 50 B per layer at 1 B/us. */
static double g3_compute[3] = {100, 100, 100}, g3_recompute[3] = {300, 300, 300};
static double g3_peer[3] = {200, 200, 200}, g3_cloud[3] = {50, 50, 50};

static void test_simulate(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {3, 50, g3_compute, g3_recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_PEER, "peer", 10, 1e6, g3_peer),
        s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e6, g3_cloud),
    };
    double t, arr[3], done[3];

    /* {peer, cloud, cloud}: peer stream A0 = 10 + 200 = 210; cloud stream A1 = 100 + 50 = 150,
     * A2 = 150 + 50 = 200. done0 = max(0, 210) + 100 = 310, done1 = max(310, 150) + 100 = 410,
     * done2 = max(410, 200) + 100 = 510. T = 50 + 510 = 560. */
    int32_t a1[3] = {0, 1, 1};
    assert_int_equal(kvedge_plan_simulate(&req, src, 2, a1, &t, arr, done), KVEDGE_OK);
    EQ(t, 560);
    EQ(arr[0], 210);
    EQ(arr[1], 150);
    EQ(arr[2], 200);
    EQ(done[0], 310);
    EQ(done[1], 410);
    EQ(done[2], 510);

    /* {recompute, peer, cloud}: A0 = 0, done0 = 100 + 300 = 400; the peer stream's first layer
     * is 1: A1 = 10 + 200 = 210, done1 = 500; A2 = 100 + 50 = 150, done2 = 600. T = 650. */
    int32_t a2[3] = {R, 0, 1};
    assert_int_equal(kvedge_plan_simulate(&req, src, 2, a2, &t, arr, NULL), KVEDGE_OK);
    EQ(t, 650);
    EQ(arr[0], 0);
    EQ(arr[1], 210);
    EQ(arr[2], 150);

    /* Optional outputs may both be NULL. */
    int32_t a3[3] = {1, 1, 1};
    assert_int_equal(kvedge_plan_simulate(&req, src, 2, a3, &t, NULL, NULL), KVEDGE_OK);
    /* A = 150, 200, 250; done = 250, 350, 450; T = 500. */
    EQ(t, 500);
}

static void test_bound(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {3, 50, g3_compute, g3_recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_PEER, "peer", 10, 1e6, g3_peer),
        s_src(KVEDGE_PLAN_CLOUD, "cloud", 100, 1e6, g3_cloud),
    };
    double b, t;

    /* {peer, cloud, cloud}: t_1 = A0 = 210; streams end at 210 (peer) and 200 (cloud), so
     * X = max(210 - 210, 0) = 0; C = 300. bound = 50 + 210 + max(0, 300) = 560 = T: the
     * decoder never waits after layer 0. */
    int32_t a1[3] = {0, 1, 1};
    assert_int_equal(kvedge_plan_bound(&req, src, 2, a1, &b), KVEDGE_OK);
    EQ(b, 560);

    /* One stream (EdgePrompt's case): cloud for all, t_1 = 150, X = sum of the transfers of
     * layers 2..L = 50 + 50 = 100, C = 300: 50 + 150 + 300 = 500 = T. */
    int32_t a3[3] = {1, 1, 1};
    assert_int_equal(kvedge_plan_bound(&req, src, 2, a3, &b), KVEDGE_OK);
    EQ(b, 500);

    /* Transfer-bound: cloud with 500 B per layer. A = 600, 1100, 1600; done = 700, 1200,
     * 1700, T = 1750. Bound: t_1 = 600, X = 1000, C = 300: 50 + 600 + 1000 = 1650, below T
     * by the last layer's compute, which no overlap can hide. */
    double slow[3] = {500, 500, 500};
    src[1].layer_bytes = slow;
    assert_int_equal(kvedge_plan_bound(&req, src, 2, a3, &b), KVEDGE_OK);
    assert_int_equal(kvedge_plan_simulate(&req, src, 2, a3, &t, NULL, NULL), KVEDGE_OK);
    EQ(b, 1650);
    EQ(t, 1750);

    /* Recompute first: t_1 = 0; C = 300 + 300 (recompute of layer 0); the peer stream (layers
     * 1, 2) ends at 10 + 400 = 410: bound = 50 + 0 + max(410, 600) = 650. Simulated: done0 =
     * 400, A1 = 210, done1 = 500, A2 = 410, done2 = 600, T = 650. */
    int32_t a4[3] = {R, 0, 0};
    assert_int_equal(kvedge_plan_bound(&req, src, 2, a4, &b), KVEDGE_OK);
    assert_int_equal(kvedge_plan_simulate(&req, src, 2, a4, &t, NULL, NULL), KVEDGE_OK);
    EQ(b, 650);
    EQ(t, 650);
}

/* ---- the choice ------------------------------------------------------------------------ */

/* L = 4, prefix 1000, compute 100, recompute 1000 per layer. Peer: rtt 0, 200 B per layer at
 * 1 B/us (Eq. 19 cost 200). Cloud: rtt 450, 100 B (int4) at 1 B/us (cost 550). */
static double g4_compute[4] = {100, 100, 100, 100}, g4_recompute[4] = {1000, 1000, 1000, 1000};
static double g4_peer[4] = {200, 200, 200, 200}, g4_cloud[4] = {100, 100, 100, 100};

static void test_make_split(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {4, 1000, g4_compute, g4_recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_PEER, "peer-a", 0, 1e6, g4_peer),
        s_src(KVEDGE_PLAN_CLOUD, "cloud-1", 450, 1e6, g4_cloud),
    };
    kvedge_plan_t *p = s_plan_new();
    /* Splits (times after the prefix):
     *  m=0 all cloud: A = 550, 650, 750, 850; done = 650, 750, 850, 950 -> 950
     *  m=1: A0 = 200 (peer); cloud 550, 650, 750; done 300, 650, 750, 850 -> 850
     *  m=2: peer 200, 400; cloud 550, 650; done 300, 500, 650, 750 -> 750
     *  m=3: peer 200, 400, 600; cloud 550; done 300, 500, 700, 800 -> 800
     *  m=4 all peer: A = 200, 400, 600, 800; done 300, 500, 700, 900 -> 900
     * m = 2 wins: 1000 + 750 = 1750. No single move lowers it (layer 3 to the peer arrives at
     * 600 and still finishes at 750; the others are worse). Bound: t_1 = 200, last stream end
     * 650 (cloud), X = 450, C = 400: 1000 + 200 + 450 = 1650. Load-then-compute: 1000 + 650 +
     * 400 = 2050. Cloud-only 1950; recompute-all 1000 + 4 * 1100 = 5400. */
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);
    assert_int_equal(p->layers, 4);
    assert_int_equal(p->first_layer, 0);
    assert_int_equal(p->split, 2);
    assert_int_equal(p->layer[0].source, 0);
    assert_int_equal(p->layer[1].source, 0);
    assert_int_equal(p->layer[2].source, 1);
    assert_int_equal(p->layer[3].source, 1);
    assert_int_equal(p->layer[0].reason, KVEDGE_PLAN_CHOSEN_NEAR);
    assert_int_equal(p->layer[1].reason, KVEDGE_PLAN_CHOSEN_NEAR);
    assert_int_equal(p->layer[2].reason, KVEDGE_PLAN_CHOSEN_FAR);
    assert_int_equal(p->layer[3].reason, KVEDGE_PLAN_CHOSEN_FAR);
    EQ(p->total_us, 1750);
    EQ(p->split_us, 1750);
    EQ(p->bound_us, 1650);
    EQ(p->load_then_compute_us, 2050);
    EQ(p->cloud_only_us, 1950);
    assert_int_equal(p->cloud_source, 1);
    EQ(p->recompute_all_us, 5400);
    EQ(p->layer[0].cost_us, 200);
    EQ(p->layer[2].cost_us, 550);
    EQ(p->layer[0].arrival_us, 200);
    EQ(p->layer[1].arrival_us, 400);
    EQ(p->layer[2].arrival_us, 550);
    EQ(p->layer[3].arrival_us, 650);
    EQ(p->layer[0].done_us, 300);
    EQ(p->layer[1].done_us, 500);
    EQ(p->layer[2].done_us, 650);
    EQ(p->layer[3].done_us, 750);
    free(p);
}

static void test_make_cloud_fast(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {4, 0, g4_compute, g4_recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_PEER, "peer-a", 0, 1e6, g4_peer),
        s_src(KVEDGE_PLAN_CLOUD, "cloud-1", 50, 4e6, g4_cloud), /* 100 B in 25 us: cost 75 */
    };
    kvedge_plan_t *p = s_plan_new();
    /* m = 0: A = 75, 100, 125, 150; done = 175, 275, 375, 475. That is t_1 + C with the
     * earliest possible t_1 (the peer's first layer is at 200), so nothing beats it. */
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);
    assert_int_equal(p->split, 0);
    for (int l = 0; l < 4; l++) {
        assert_int_equal(p->layer[l].source, 1);
        assert_int_equal(p->layer[l].reason, KVEDGE_PLAN_CHOSEN_FAR);
    }
    EQ(p->total_us, 475);
    EQ(p->bound_us, 475);
    EQ(p->cloud_only_us, 475);
    free(p);
}

static void test_make_all_down(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {4, 10, g4_compute, g4_recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_PEER, "peer-a", 0, 1e6, g4_peer),
        s_src(KVEDGE_PLAN_CLOUD, "cloud-1", 50, 4e6, g4_cloud),
    };
    src[0].up = src[1].up = false;
    src[1].bw_bytes_per_s = 0; /* a down source's numbers are never read */
    kvedge_plan_t *p = s_plan_new();
    /* Every layer recomputed: 10 + 4 * (100 + 1000) = 4410; every split is the same plan,
     * the earliest (0) is kept. */
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);
    for (int l = 0; l < 4; l++) {
        assert_int_equal(p->layer[l].source, R);
        assert_int_equal(p->layer[l].reason, KVEDGE_PLAN_RECOMPUTE_NO_SOURCE);
        EQ(p->layer[l].cost_us, 1000);
        EQ(p->layer[l].arrival_us, 0);
    }
    assert_int_equal(p->split, 0);
    EQ(p->total_us, 4410);
    EQ(p->recompute_all_us, 4410);
    EQ(p->cloud_only_us, 4410);
    assert_int_equal(p->cloud_source, -1);
    EQ(p->bound_us, 4410);
    EQ(p->load_then_compute_us, 4410);

    /* No sources at all is the same request. */
    assert_int_equal(kvedge_plan_make(&req, NULL, 0, p), KVEDGE_OK);
    EQ(p->total_us, 4410);
    free(p);
}

static void test_make_peer_missing(void **state)
{
    (void)state;
    /* L = 3, compute 100, recompute 150. Peer: rtt 0, 100 B at 1 B/us, lacks layer 1.
     * Cloud: rtt 1000, 100 B at 1 B/us (cost 1100). near = {peer, recompute, peer}
     * (recompute is the only near option for layer 1), far = cloud.
     * m = 3: A0 = 100, done0 = 200; layer 1 recomputed after a fetched layer 0 runs the
     * context through layers 0 and 1: done1 = 200 + 100 + 300 = 600; A2 = 200, done2 = 700.
     * Improvement: recompute layer 0 too (the context has to be run through it anyway):
     * done0 = 250, done1 = 500, A2 = 100 (the peer's only layer), done2 = 600. Any cloud layer
     * arrives at 1100 or later, so T = 600. */
    double compute[3] = {100, 100, 100}, recompute[3] = {150, 150, 150};
    double pb[3] = {100, -1, 100}, cb[3] = {100, 100, 100};
    kvedge_plan_request_t req = {3, 0, compute, recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_PEER, "peer", 0, 1e6, pb),
        s_src(KVEDGE_PLAN_CLOUD, "cloud", 1000, 1e6, cb),
    };
    kvedge_plan_t *p = s_plan_new();
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);
    assert_int_equal(p->split, 3);
    EQ(p->split_us, 700);
    assert_int_equal(p->layer[0].source, R);
    assert_int_equal(p->layer[1].source, R);
    assert_int_equal(p->layer[2].source, 0);
    assert_int_equal(p->layer[0].reason, KVEDGE_PLAN_RECOMPUTE_FASTER);
    assert_int_equal(p->layer[1].reason, KVEDGE_PLAN_RECOMPUTE_FASTER); /* the cloud has it */
    assert_int_equal(p->layer[2].reason, KVEDGE_PLAN_CHOSEN_NEAR);
    EQ(p->total_us, 600);
    EQ(p->layer[2].arrival_us, 100);
    /* The fetched-then-recomputed order, priced by simulate: layer 1 pays layers 0 and 1. */
    int32_t fr[3] = {0, R, 0};
    double t_fr;
    assert_int_equal(kvedge_plan_simulate(&req, src, 2, fr, &t_fr, NULL, NULL), KVEDGE_OK);
    EQ(t_fr, 700);
    /* Cloud-only: A = 1100, 1200, 1300; done = 1200, 1300, 1400. Recompute-all: 3 * 250. */
    EQ(p->cloud_only_us, 1400);
    EQ(p->recompute_all_us, 750);

    /* The cloud down: the peer is the only source of layers 0 and 2, nobody has layer 1. */
    src[1].up = false;
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);
    assert_int_equal(p->layer[0].source, R); /* as above: cheaper than the peer's copy */
    assert_int_equal(p->layer[0].reason, KVEDGE_PLAN_RECOMPUTE_FASTER);
    assert_int_equal(p->layer[1].reason, KVEDGE_PLAN_RECOMPUTE_NO_SOURCE);
    assert_int_equal(p->layer[2].reason, KVEDGE_PLAN_ONLY_SOURCE);
    assert_int_equal(p->split, 0); /* every split is the same plan */
    EQ(p->total_us, 600);
    EQ(p->cloud_only_us, 750);
    assert_int_equal(p->cloud_source, -1);
    free(p);
}

static void test_make_ties(void **state)
{
    (void)state;
    /* Two peers at the same Eq. 19 cost (rtt 100 + 100 B vs rtt 0 + 200 B): fewer bytes wins;
     * same cost and bytes: the lower index. L = 1, compute 10, recompute 1000. */
    double compute[1] = {10}, recompute[1] = {1000};
    double b100[1] = {100}, b200[1] = {200};
    kvedge_plan_request_t req = {1, 0, compute, recompute};
    kvedge_plan_source_t src[3] = {
        s_src(KVEDGE_PLAN_PEER, "p0", 0, 1e6, b200),
        s_src(KVEDGE_PLAN_LOCAL, "p1", 100, 1e6, b100),
        s_src(KVEDGE_PLAN_HISTORY, "p2", 100, 1e6, b100),
    };
    kvedge_plan_t *p = s_plan_new();
    assert_int_equal(kvedge_plan_make(&req, src, 3, p), KVEDGE_OK);
    assert_int_equal(p->layer[0].source, 1);
    EQ(p->total_us, 210);
    /* Recompute at exactly the source's cost: the source (recompute only when cheaper). */
    recompute[0] = 200;
    assert_int_equal(kvedge_plan_make(&req, src, 3, p), KVEDGE_OK);
    assert_int_equal(p->layer[0].source, 1);
    free(p);
}

/* ---- re-planning ----------------------------------------------------------------------- */

static void test_replan_cloud_fails(void **state)
{
    (void)state;
    /* test_make_split's request plus a history copy that holds only layer 3 (rtt 20, 300 B:
     * cost 320; arrives at 320 on its own stream). The first plan is unchanged: {peer, peer,
     * cloud, cloud} (layer 3 from history also finishes at 750, not strictly better). */
    double hist[4] = {-1, -1, -1, 300};
    kvedge_plan_request_t req = {4, 1000, g4_compute, g4_recompute};
    kvedge_plan_source_t src[3] = {
        s_src(KVEDGE_PLAN_PEER, "peer-a", 0, 1e6, g4_peer),
        s_src(KVEDGE_PLAN_CLOUD, "cloud-1", 450, 1e6, g4_cloud),
        s_src(KVEDGE_PLAN_HISTORY, "history", 20, 1e6, hist),
    };
    kvedge_plan_t *p = s_plan_new(), *q = s_plan_new();
    assert_int_equal(kvedge_plan_make(&req, src, 3, p), KVEDGE_OK);
    EQ(p->total_us, 1750);
    assert_int_equal(p->layer[3].source, 1);

    /* The cloud fails after layers 0 and 1 arrived. From now: the peer restarts (A2 = 200,
     * A3 = 400) and history has layer 3 at 320. Split result {peer, peer}: done2 = 300,
     * done3 = 500. Improvement: layer 3 from history: done3 = max(300, 320) + 100 = 420.
     * No prefix (already paid). Bound: t_1 = 200, last stream end 320, X = 120, C = 200:
     * 200 + 200 = 400. */
    assert_int_equal(kvedge_plan_replan(&req, src, 3, p, 2, 1, q), KVEDGE_OK);
    assert_true(src[1].up); /* the caller's table is untouched */
    assert_int_equal(q->layers, 4);
    assert_int_equal(q->first_layer, 2);
    assert_int_equal(q->split, 2);
    assert_int_equal(q->layer[0].source, 0);
    assert_int_equal(q->layer[1].source, 0);
    assert_int_equal(q->layer[0].reason, KVEDGE_PLAN_DELIVERED);
    assert_int_equal(q->layer[1].reason, KVEDGE_PLAN_DELIVERED);
    EQ(q->layer[0].cost_us, 200);
    assert_int_equal(q->layer[2].source, 0);
    assert_int_equal(q->layer[2].reason, KVEDGE_PLAN_ONLY_SOURCE);
    assert_int_equal(q->layer[3].source, 2);
    assert_int_equal(q->layer[3].reason, KVEDGE_PLAN_REBALANCED);
    EQ(q->split_us, 500);
    EQ(q->total_us, 420);
    EQ(q->bound_us, 400);
    EQ(q->layer[3].arrival_us, 320);
    EQ(q->layer[3].done_us, 420);
    assert_int_equal(q->cloud_source, -1);
    /* Layers 0 and 1 were fetched: recomputing layer 2 runs the context through 0..2. */
    EQ(q->recompute_all_us, 3100 + 1100);

    /* In place, and with the peer failing too: history for layer 3, layer 2 recomputed
     * through layers 0..2: done2 = 3100, A3 = 320, done3 = 3200. */
    src[1].up = false;
    assert_int_equal(kvedge_plan_replan(&req, src, 3, q, 2, 0, q), KVEDGE_OK);
    assert_int_equal(q->layer[0].source, 0);
    assert_int_equal(q->layer[0].reason, KVEDGE_PLAN_DELIVERED);
    assert_int_equal(q->layer[2].source, R);
    assert_int_equal(q->layer[2].reason, KVEDGE_PLAN_RECOMPUTE_NO_SOURCE);
    assert_int_equal(q->layer[3].source, 2);
    assert_int_equal(q->layer[3].reason, KVEDGE_PLAN_ONLY_SOURCE);
    EQ(q->total_us, 3200);

    /* Everything received: nothing left. */
    assert_int_equal(kvedge_plan_replan(&req, src, 3, p, 4, KVEDGE_PLAN_SRC_NONE, q), KVEDGE_OK);
    EQ(q->total_us, 0);
    for (int l = 0; l < 4; l++)
        assert_int_equal(q->layer[l].reason, KVEDGE_PLAN_DELIVERED);
    free(p);
    free(q);
}

/* ---- the formatter --------------------------------------------------------------------- */

static void test_format(void **state)
{
    (void)state;
    kvedge_plan_request_t req = {4, 1000, g4_compute, g4_recompute};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_PEER, "peer-a", 0, 1e6, g4_peer),
        s_src(KVEDGE_PLAN_CLOUD, "cloud-1", 450, 1e6, g4_cloud),
    };
    kvedge_plan_t *p = s_plan_new();
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);
    char buf[4096];
    assert_int_equal(kvedge_plan_format(p, src, 2, buf, sizeof buf), KVEDGE_OK);
    assert_non_null(strstr(buf, "peer-a"));
    assert_non_null(strstr(buf, "cloud-1"));
    assert_non_null(strstr(buf, " near\n"));
    assert_non_null(strstr(buf, " far\n"));
    assert_non_null(strstr(buf, "T 1.750 ms"));
    assert_non_null(strstr(buf, "bound 1.650 ms"));
    assert_non_null(strstr(buf, "split m=2"));
    assert_non_null(strstr(buf, "cloud-only 1.950 ms (cloud-1)"));
    assert_non_null(strstr(buf, "recompute-all 5.400 ms"));
    assert_non_null(strstr(buf, "load-then-compute 2.050 ms"));

    char small[40];
    assert_int_equal(kvedge_plan_format(p, src, 2, small, sizeof small), KVEDGE_ENOSPACE);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_int_equal(kvedge_plan_format(NULL, src, 2, buf, sizeof buf), KVEDGE_EINVAL);
    assert_int_equal(kvedge_plan_format(p, src, 2, NULL, 10), KVEDGE_EINVAL);
    assert_int_equal(kvedge_plan_format(p, src, 2, buf, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_plan_format(p, NULL, 2, buf, sizeof buf), KVEDGE_EINVAL);
    assert_string_equal(kvedge_plan_reason_name(KVEDGE_PLAN_RECOMPUTE_NO_SOURCE),
                        "recompute:no-source");
    assert_string_equal(kvedge_plan_kind_name(KVEDGE_PLAN_HISTORY), "history");
    free(p);
}

/* ---- a request that allows no recomputation -------------------------------------------- */

/* No recompute_us (a fetch-only client): the cloud is down, a peer holds layers 0-5. Every
 * layer the peer holds is fetched from it, the others are misses nobody can avoid
 * (recompute:no-source, unpriced), recompute-all is unpriced and printed so, and a re-plan
 * after the peer's own failure keeps its delivered layers and plans the rest as misses. With
 * recomputation priced as a large finite time instead, the context's lazy recomputation makes
 * recomputing layer 0 look cheaper than fetching it (it saves the wait for layer 5). */
static void test_no_recompute(void **state)
{
    (void)state;
    enum { L = 12 };
    double compute[L] = {0}, peer[L], cloud[L];
    for (uint32_t l = 0; l < L; l++) {
        peer[l] = l < 6 ? 1e6 : -1;
        cloud[l] = 1e6;
    }
    kvedge_plan_request_t req = {L, 0, compute, NULL};
    kvedge_plan_source_t src[2] = {
        s_src(KVEDGE_PLAN_CLOUD, "cloud", 2000, 1e8, cloud),
        s_src(KVEDGE_PLAN_PEER, "peer", 1000, 1e8, peer),
    };
    src[0].up = false;
    kvedge_plan_t *p = s_plan_new();
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);
    for (uint32_t l = 0; l < L; l++) {
        if (l < 6) {
            assert_int_equal(p->layer[l].source, 1);
        } else {
            assert_int_equal(p->layer[l].source, R);
            assert_int_equal(p->layer[l].reason, KVEDGE_PLAN_RECOMPUTE_NO_SOURCE);
            assert_true(isinf(p->layer[l].cost_us));
        }
    }
    assert_true(isfinite(p->total_us));
    assert_true(isinf(p->recompute_all_us));
    EQ(kvedge_plan_cost(&req, src, 2, 1, 0), 1000 + 1e4);
    assert_true(isinf(kvedge_plan_cost(&req, src, 2, R, 0)));
    char buf[4096];
    assert_int_equal(kvedge_plan_format(p, src, 2, buf, sizeof buf), KVEDGE_OK);
    assert_non_null(strstr(buf, "recompute-all unpriced"));
    assert_null(strstr(buf, "inf"));
    /* The peer fails after layers 0-2 arrived: 3-5 have no source left; nothing that was not
     * allowed is planned (each is a miss, not "faster"). */
    kvedge_plan_t *q = s_plan_new();
    assert_int_equal(kvedge_plan_replan(&req, src, 2, p, 3, 1, q), KVEDGE_OK);
    for (uint32_t l = 3; l < L; l++) {
        assert_int_equal(q->layer[l].source, R);
        assert_int_equal(q->layer[l].reason, KVEDGE_PLAN_RECOMPUTE_NO_SOURCE);
    }
    /* The same request with an hour per layer of recomputation: the planner may trade a held
     * layer for recomputation when that is priced, which is what a request without times
     * must never get. */
    double hour[L];
    for (uint32_t l = 0; l < L; l++)
        hour[l] = 3.6e9;
    req.recompute_us = hour;
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);
    assert_int_equal(p->layer[0].source, R);
    free(q);
    free(p);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void test_errors(void **state)
{
    (void)state;
    double compute[4] = {100, 100, 100, 100}, recompute[4] = {1, 1, 1, 1};
    double pb[4] = {1, 1, 1, 1};
    kvedge_plan_request_t req = {4, 0, compute, recompute};
    kvedge_plan_source_t src[KVEDGE_PLAN_MAX_SOURCES + 1];
    for (int i = 0; i <= KVEDGE_PLAN_MAX_SOURCES; i++)
        src[i] = s_src(KVEDGE_PLAN_PEER, "p", 1, 1e6, pb);
    kvedge_plan_t *p = s_plan_new(), *q = s_plan_new();
    int32_t as[4] = {0, 0, 0, 0};
    double t;

    assert_int_equal(kvedge_plan_make(&req, src, 1, p), KVEDGE_OK);
    memset(q, 0x5a, sizeof *q);
    kvedge_plan_t before = *q;

#define BAD(call)                                                                                  \
    do {                                                                                           \
        assert_int_equal((call), KVEDGE_EINVAL);                                                   \
        assert_memory_equal(q, &before, sizeof before);                                            \
    } while (0)

    BAD(kvedge_plan_make(NULL, src, 1, q));
    BAD(kvedge_plan_make(&req, src, 1, NULL));
    BAD(kvedge_plan_make(&req, NULL, 1, q));
    BAD(kvedge_plan_make(&req, src, KVEDGE_PLAN_MAX_SOURCES + 1, q));
    req.layers = 0;
    BAD(kvedge_plan_make(&req, src, 1, q));
    req.layers = KVEDGE_PLAN_MAX_LAYERS + 1;
    BAD(kvedge_plan_make(&req, src, 1, q));
    req.layers = 4;
    req.prefix_us = -1;
    BAD(kvedge_plan_make(&req, src, 1, q));
    req.prefix_us = INFINITY;
    BAD(kvedge_plan_make(&req, src, 1, q));
    req.prefix_us = 0;
    req.compute_us = NULL;
    BAD(kvedge_plan_make(&req, src, 1, q));
    req.compute_us = compute;
    compute[2] = NAN;
    BAD(kvedge_plan_make(&req, src, 1, q));
    compute[2] = 100;
    recompute[3] = -5;
    BAD(kvedge_plan_make(&req, src, 1, q));
    recompute[3] = 1;

    src[0].bw_bytes_per_s = 0;
    BAD(kvedge_plan_make(&req, src, 1, q));
    src[0].bw_bytes_per_s = NAN;
    BAD(kvedge_plan_make(&req, src, 1, q));
    src[0].bw_bytes_per_s = INFINITY;
    BAD(kvedge_plan_make(&req, src, 1, q));
    src[0].bw_bytes_per_s = 1e6;
    src[0].rtt_us = -1;
    BAD(kvedge_plan_make(&req, src, 1, q));
    src[0].rtt_us = NAN;
    BAD(kvedge_plan_make(&req, src, 1, q));
    src[0].rtt_us = 1;
    src[0].layer_bytes = NULL;
    BAD(kvedge_plan_make(&req, src, 1, q));
    src[0].layer_bytes = pb;
    pb[1] = NAN;
    BAD(kvedge_plan_make(&req, src, 1, q));
    pb[1] = -INFINITY;
    BAD(kvedge_plan_make(&req, src, 1, q));
    pb[1] = 1;
    src[0].kind = (kvedge_plan_kind_t)7;
    BAD(kvedge_plan_make(&req, src, 1, q));
    src[0].kind = KVEDGE_PLAN_PEER;
    memset(src[0].name, 'x', sizeof src[0].name);
    BAD(kvedge_plan_make(&req, src, 1, q));
    src[0].name[0] = '\0';
    /* A RECOMPUTE-kind source needs no numbers. */
    src[1] = s_src(KVEDGE_PLAN_RECOMPUTE, "self", NAN, 0, NULL);
    assert_int_equal(kvedge_plan_make(&req, src, 2, p), KVEDGE_OK);

    /* simulate / bound: assignments that cannot be served. */
    BAD(kvedge_plan_simulate(&req, src, 1, NULL, &t, NULL, NULL));
    BAD(kvedge_plan_simulate(&req, src, 1, as, NULL, NULL, NULL));
    as[2] = 1; /* out of range with nsrc 1 */
    BAD(kvedge_plan_simulate(&req, src, 1, as, &t, NULL, NULL));
    as[2] = -2;
    BAD(kvedge_plan_simulate(&req, src, 1, as, &t, NULL, NULL));
    as[2] = 0;
    pb[3] = -1; /* the source lacks layer 3 */
    BAD(kvedge_plan_simulate(&req, src, 1, as, &t, NULL, NULL));
    BAD(kvedge_plan_bound(&req, src, 1, as, &t));
    pb[3] = 1;
    src[0].up = false;
    BAD(kvedge_plan_simulate(&req, src, 1, as, &t, NULL, NULL));
    BAD(kvedge_plan_bound(&req, src, 1, as, &t));
    src[0].up = true;
    BAD(kvedge_plan_bound(&req, src, 1, as, NULL));
    assert_int_equal(kvedge_plan_simulate(&req, src, 1, as, &t, NULL, NULL), KVEDGE_OK);
    as[1] = 1; /* a RECOMPUTE-kind source may be assigned: it is recompute */
    assert_int_equal(kvedge_plan_simulate(&req, src, 2, as, &t, NULL, NULL), KVEDGE_OK);

    /* replan */
    BAD(kvedge_plan_replan(&req, src, 1, NULL, 1, 0, q));
    BAD(kvedge_plan_replan(&req, src, 1, p, 5, 0, q));
    BAD(kvedge_plan_replan(&req, src, 1, p, 1, 1, q));
    BAD(kvedge_plan_replan(&req, src, 1, p, 1, -2, q));
    BAD(kvedge_plan_replan(&req, src, 1, p, 1, 0, NULL));
    req.layers = 3; /* not the plan's request */
    BAD(kvedge_plan_replan(&req, src, 1, p, 1, 0, q));
#undef BAD
    free(p);
    free(q);
}

/* ---- property test --------------------------------------------------------------------- */

/* T of the assignment "source s where it has the layer, recompute elsewhere". */
static double s_single(const kvedge_plan_request_t *req, const kvedge_plan_source_t *src, size_t n,
                       int32_t s)
{
    int32_t as[KVEDGE_PLAN_MAX_LAYERS];
    for (uint32_t l = 0; l < req->layers; l++)
        as[l] = s >= 0 && src[s].layer_bytes[l] >= 0 ? s : R;
    double t;
    assert_int_equal(kvedge_plan_simulate(req, src, n, as, &t, NULL, NULL), KVEDGE_OK);
    return t;
}

/* The plan is what simulate says it is, uses only sources that can serve, and its bound and
 * baselines hold. */
static void s_check_plan(const kvedge_plan_request_t *req, const kvedge_plan_source_t *src,
                         size_t n, const kvedge_plan_t *p)
{
    int32_t as[KVEDGE_PLAN_MAX_LAYERS];
    double arr[KVEDGE_PLAN_MAX_LAYERS], done[KVEDGE_PLAN_MAX_LAYERS], t, b;
    s_assign_of(p, as);
    assert_int_equal(kvedge_plan_simulate(req, src, n, as, &t, arr, done), KVEDGE_OK);
    EQ(p->total_us, t);
    assert_int_equal(kvedge_plan_bound(req, src, n, as, &b), KVEDGE_OK);
    EQ(p->bound_us, b);
    for (uint32_t l = 0; l < req->layers; l++) {
        EQ(p->layer[l].arrival_us, arr[l]);
        EQ(p->layer[l].done_us, done[l]);
        EQ(p->layer[l].cost_us, kvedge_plan_cost(req, src, n, as[l], l));
        if (as[l] >= 0)
            assert_true(src[as[l]].up && src[as[l]].kind != KVEDGE_PLAN_RECOMPUTE);
    }
    assert_true(p->bound_us <= p->total_us + EPS);
    assert_true(p->total_us <= p->split_us + EPS);
    assert_true(p->total_us <= p->cloud_only_us + EPS);
    assert_true(p->total_us <= p->recompute_all_us + EPS);
    assert_true(p->total_us <= p->load_then_compute_us + EPS);
    assert_true(p->split <= req->layers);
}

static void test_property(void **state)
{
    (void)state;
    static double bytes[KVEDGE_PLAN_MAX_SOURCES][16];
    double compute[16], recompute[16];
    kvedge_plan_source_t src[8];
    kvedge_plan_t *p = s_plan_new(), *q = s_plan_new();
    g_rng = 20240601;
    for (int iter = 0; iter < 500; iter++) {
        uint32_t L = 1 + (uint32_t)(s_next() % 12);
        size_t n = (size_t)(s_next() % 7);
        kvedge_plan_request_t req = {L, s_unif(0, 1000), compute, recompute};
        for (uint32_t l = 0; l < L; l++) {
            compute[l] = s_unif(0, 2000);
            recompute[l] = s_unif(0, 20000);
        }
        for (size_t s = 0; s < n; s++) {
            kvedge_plan_kind_t kind = (kvedge_plan_kind_t)(s_next() % 4);
            src[s] = s_src(kind, "s", s_unif(0, 10000), s_unif(1e6, 1e9), bytes[s]);
            src[s].up = s_next() % 5 != 0;
            for (uint32_t l = 0; l < L; l++)
                bytes[s][l] = s_next() % 10 < 7 ? s_unif(0, 4e6) : -1;
        }
        assert_int_equal(kvedge_plan_make(&req, src, n, p), KVEDGE_OK);
        s_check_plan(&req, src, n, p);
        assert_true(p->total_us <= s_single(&req, src, n, R) + EPS);
        EQ(p->recompute_all_us, s_single(&req, src, n, R));
        for (size_t s = 0; s < n; s++)
            if (src[s].up)
                assert_true(p->total_us <= s_single(&req, src, n, (int32_t)s) + EPS);

        /* A failure mid-request: the failed source is never used for the rest, the
         * delivered layers are kept. */
        if (n > 0) {
            uint32_t k = (uint32_t)(s_next() % (L + 1));
            int32_t f = (int32_t)(s_next() % n);
            assert_int_equal(kvedge_plan_replan(&req, src, n, p, k, f, q), KVEDGE_OK);
            assert_int_equal(q->first_layer, k);
            for (uint32_t l = 0; l < L; l++) {
                if (l < k) {
                    assert_int_equal(q->layer[l].source, p->layer[l].source);
                    assert_int_equal(q->layer[l].reason, KVEDGE_PLAN_DELIVERED);
                } else {
                    assert_int_not_equal(q->layer[l].source, f);
                }
            }
            assert_true(q->total_us <= q->recompute_all_us + EPS);
            assert_true(q->bound_us <= q->total_us + EPS);
        }
    }
    free(p);
    free(q);
}

/* The largest request: every limit at once stays within the improvement budget. */
static void test_large(void **state)
{
    (void)state;
    static double bytes[KVEDGE_PLAN_MAX_SOURCES][KVEDGE_PLAN_MAX_LAYERS];
    static double compute[KVEDGE_PLAN_MAX_LAYERS], recompute[KVEDGE_PLAN_MAX_LAYERS];
    static kvedge_plan_source_t src[KVEDGE_PLAN_MAX_SOURCES];
    kvedge_plan_t *p = s_plan_new();
    g_rng = 7;
    for (uint32_t l = 0; l < KVEDGE_PLAN_MAX_LAYERS; l++) {
        compute[l] = s_unif(50, 150);
        recompute[l] = s_unif(500, 1500);
    }
    for (size_t s = 0; s < KVEDGE_PLAN_MAX_SOURCES; s++) {
        src[s] =
            s_src((kvedge_plan_kind_t)(s % 4), "s", s_unif(0, 5000), s_unif(1e8, 1e9), bytes[s]);
        for (uint32_t l = 0; l < KVEDGE_PLAN_MAX_LAYERS; l++)
            bytes[s][l] = s_next() % 2 ? s_unif(1e4, 1e5) : -1;
    }
    kvedge_plan_request_t req = {KVEDGE_PLAN_MAX_LAYERS, 0, compute, recompute};
    assert_int_equal(kvedge_plan_make(&req, src, KVEDGE_PLAN_MAX_SOURCES, p), KVEDGE_OK);
    s_check_plan(&req, src, KVEDGE_PLAN_MAX_SOURCES, p);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost),
        cmocka_unit_test(test_simulate),
        cmocka_unit_test(test_bound),
        cmocka_unit_test(test_make_split),
        cmocka_unit_test(test_make_cloud_fast),
        cmocka_unit_test(test_make_all_down),
        cmocka_unit_test(test_make_peer_missing),
        cmocka_unit_test(test_make_ties),
        cmocka_unit_test(test_replan_cloud_fails),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_no_recompute),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_property),
        cmocka_unit_test(test_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
