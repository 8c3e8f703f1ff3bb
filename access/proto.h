/* The protocol's vocabulary, shared by both ends and by the public client API: node roles,
 * the kinds of source a proxy plans with, why a layer got its source (the plan), and why it
 * came from where it did (the delivery). Every value here is a wire value. */
#ifndef KVEDGE_ACCESS_PROTO_H
#define KVEDGE_ACCESS_PROTO_H

#ifdef __cplusplus
extern "C" {
#endif

/* What a peer says it is in HELLO. */
typedef enum { KVEDGE_ROLE_CLOUD = 1, KVEDGE_ROLE_EDGE = 2, KVEDGE_ROLE_PROXY = 3 } kvedge_role_t;

/* Where a proxy can take a layer from. */
typedef enum {
    KVEDGE_PLAN_LOCAL = 0,   /* the edge's own store node */
    KVEDGE_PLAN_PEER = 1,    /* another edge's store node */
    KVEDGE_PLAN_CLOUD = 2,   /* a cloud store node */
    KVEDGE_PLAN_HISTORY = 3, /* the edge's pinned historical copy: fast, maybe stale or partial */
    KVEDGE_PLAN_RECOMPUTE =
        4, /* the client computes the layer; costs recompute_us on its decoder */
} kvedge_plan_kind_t;

/* Why a layer got its source. */
#define KVEDGE_PLAN_REASON_MAP(X)                                                                  \
    X(CHOSEN_NEAR, "near")        /* layer < m: cheapest local/peer/history source */              \
    X(CHOSEN_FAR, "far")          /* layer >= m: cheapest cloud source */                          \
    X(ONLY_SOURCE, "only-source") /* the one up source that holds the layer */                     \
    X(RECOMPUTE_NO_SOURCE, "recompute:no-source") /* no up source holds the layer */               \
    X(RECOMPUTE_FASTER, "recompute:faster")       /* held somewhere, recomputing is faster */      \
    X(REBALANCED, "rebalanced") /* not the split's choice: moving it lowered T */                  \
    X(DELIVERED, "delivered")   /* replan: received before the re-plan, kept */

typedef enum {
#define KVEDGE_PLAN_REASON_ENUM(name, text) KVEDGE_PLAN_##name,
    KVEDGE_PLAN_REASON_MAP(KVEDGE_PLAN_REASON_ENUM)
#undef KVEDGE_PLAN_REASON_ENUM
} kvedge_plan_reason_t;

/* Why a layer came from where it did (the LAYER record's reason). */
#define KVEDGE_FETCH_REASON_MAP(X)                                                                 \
    X(PLANNED, 1, "planned")                   /* the plan's source delivered it */                \
    X(FALLBACK_FAILED, 2, "fallback:failed")   /* its source failed or stalled: re-planned */      \
    X(FALLBACK_MISSING, 3, "fallback:missing") /* its source did not have it (stale directory) */  \
    X(FALLBACK_CORRUPT, 4, "fallback:corrupt") /* its source sent a block that failed checks */    \
    X(RECOMPUTE, 5, "recompute")               /* the plan says computing it is faster */          \
    X(MISS, 6, "miss")                         /* no reachable source has it */                    \
    X(MISS_DEADLINE, 7, "miss:deadline")       /* the request's deadline came first */             \
    X(REPLAN_BANDWIDTH, 8, "replan:bandwidth") /* a source's bandwidth changed mid-request */

typedef enum {
#define KVEDGE_FETCH_REASON_ENUM(name, value, text) KVEDGE_FETCH_##name = value,
    KVEDGE_FETCH_REASON_MAP(KVEDGE_FETCH_REASON_ENUM)
#undef KVEDGE_FETCH_REASON_ENUM
} kvedge_fetch_reason_t;

/* "planned", "fallback:failed", ...; "?" for anything else. */
const char *kvedge_fetch_reason_name(int reason);

/* Short text for a reason ("near", "recompute:no-source"); never NULL, static storage. */
/* Why the planner (proxy/plan.h, kvedge_plan_make_prec) gave a layer its precision: the PLAN
 * layer record's prec reason. Only layers of a plan made with a precision choice have one
 * other than NONE; a recomputed layer has NONE or BUDGET. */
#define KVEDGE_PLAN_PREC_REASON_MAP(X)                                                             \
    X(NONE, "none")                     /* recompute (not BUDGET), or no precision choice */       \
    X(FINEST, "finest")                 /* the finest rung its source serves for the layer */      \
    X(COARSER_FASTER, "coarser-faster") /* coarser than the source's finest: lowers T, fits */     \
    X(BUDGET, "budget") /* a coarser rung (or, for a recomputed layer, any fetch) would lower T    \
                           but the plan would exceed the budget */                                 \
    X(ONLY, "only")     /* the source serves this layer at this rung only */

typedef enum {
#define KVEDGE_PLAN_PREC_REASON_ENUM(name, text) KVEDGE_PLAN_PREC_##name,
    KVEDGE_PLAN_PREC_REASON_MAP(KVEDGE_PLAN_PREC_REASON_ENUM)
#undef KVEDGE_PLAN_PREC_REASON_ENUM
} kvedge_plan_prec_reason_t;

/* Short text for a precision reason ("finest", "coarser-faster"); "?" for an unknown value;
 * never NULL, static storage. */
const char *kvedge_plan_prec_reason_name(kvedge_plan_prec_reason_t reason);

/* What a request's quality budget bounds (the cache optimizer): the sum over its layers of
 * each layer's cost at the precision it is fetched at, from the model's per-layer
 * sensitivity profile (proxy/quality.h). */
typedef enum {
    KVEDGE_QUALITY_NONE = 0,    /* no budget: any accepted precision, fastest first */
    KVEDGE_QUALITY_PPL_PCT = 1, /* perplexity increase over lossless, percent (0 ... 100) */
    KVEDGE_QUALITY_KL = 2,      /* mean KL(lossless || fetched), nats (0 ... 10) */
} kvedge_quality_metric_t;
#define KVEDGE_QUALITY_PPL_PCT_MAX 100.0
#define KVEDGE_QUALITY_KL_MAX      10.0

/* "none", "ppl", "kl"; "?" for anything else. */
const char *kvedge_quality_metric_name(kvedge_quality_metric_t metric);
/* 0 when budget is finite, >= 0 and within the metric's maximum (NONE: budget 0), else
 * KVEDGE_EINVAL (also for an unknown metric). */
int kvedge_quality_budget_check(kvedge_quality_metric_t metric, double budget);

/* Parses a budget: "ppl:X" or "ppl:X%" (perplexity change, percent, 0 ..
 * KVEDGE_QUALITY_PPL_PCT_MAX) or "kl:X" (nats, 0 .. KVEDGE_QUALITY_KL_MAX), X a decimal number
 * (digits first, exponent allowed; no sign, hex, "nan" or "inf"); "none" is
 * KVEDGE_QUALITY_NONE with budget 0. Errors: KVEDGE_EINVAL (NULL, empty, an unknown metric, a
 * malformed, non-finite or underflowing number, out of bounds); outputs untouched then. */
int kvedge_quality_budget_parse(const char *s, kvedge_quality_metric_t *metric, double *budget);

/* Short text for a plan reason (a layer's kvedge_fetch_plan_t reason), as the proxy's plan
 * names it; never NULL (unknown values have a text too), static storage. */
const char *kvedge_plan_reason_name(kvedge_plan_reason_t reason);

/* Short text for a kind ("local", "peer", "cloud", "history", "recompute"); never NULL. */
const char *kvedge_plan_kind_name(kvedge_plan_kind_t kind);

#ifdef __cplusplus
}
#endif
#endif
