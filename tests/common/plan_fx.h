/* Helpers shared by the planner's tests (test_plan, test_plan_prec). Include after <cmocka.h>. */
#ifndef KVEDGE_TESTS_PLAN_FX_H
#define KVEDGE_TESTS_PLAN_FX_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/plan.h"

#define EPS 1e-9
#define R   KVEDGE_PLAN_SRC_RECOMPUTE

/* Fails unless |got - want| <= EPS. */
#define EQ(got, want)                                                                              \
    do {                                                                                           \
        double g_ = (got), w_ = (want);                                                            \
        if (!(fabs(g_ - w_) <= EPS))                                                               \
            fail_msg("%s = %.12g, want %.12g", #got, g_, w_);                                      \
    } while (0)

/* An up source of kind and name with its link and per-layer bytes. */
static inline kvedge_plan_source_t s_src(kvedge_plan_kind_t kind, const char *name, double rtt_us,
                                         double bw, const double *bytes)
{
    kvedge_plan_source_t s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    snprintf(s.name, sizeof s.name, "%s", name);
    s.up = true;
    s.rtt_us = rtt_us;
    s.bw_bytes_per_s = bw;
    s.layer_bytes = bytes;
    return s;
}

static inline kvedge_plan_t *s_plan_new(void)
{
    kvedge_plan_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    return p;
}

/* The property tests' generator (splitmix64); each test seeds g_rng. */
static uint64_t g_rng;

static inline uint64_t s_next(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline double s_unif(double lo, double hi)
{
    return lo + (hi - lo) * ((double)(s_next() >> 11) / 9007199254740992.0);
}

#endif
