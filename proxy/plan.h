/* Path planner: prices every source of a request's context KV per layer (CE-LSLM Eq. 19) and
 * picks a source per layer, and optionally a precision (CacheGen-style, under a quality budget),
 * that minimizes the pipelined completion time (Eq. 20, EdgePrompt's overlap model). Pure
 * functions: no I/O, no clocks, no allocation, no logging. */
#ifndef KVEDGE_PROXY_PLAN_H
#define KVEDGE_PROXY_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/proto.h"
#include "access/codec/prec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hard limits of one request; larger inputs are KVEDGE_EINVAL. */
#define KVEDGE_PLAN_MAX_LAYERS  1024
#define KVEDGE_PLAN_MAX_SOURCES 32
/* Size of a source's name, NUL included. */
#define KVEDGE_PLAN_NAME_LEN 64
/* The "source" index that means: the client computes the layer's context KV itself. */
#define KVEDGE_PLAN_SRC_RECOMPUTE (-1)
/* kvedge_plan_replan's failed index when no source failed (a plain re-plan). */
#define KVEDGE_PLAN_SRC_NONE (-1)
/* Greedy improvement passes after the split search, and the work they may spend, counted in
 * simulated layer steps (one step = one layer of one candidate timeline). */
#define KVEDGE_PLAN_IMPROVE_PASSES 2
#define KVEDGE_PLAN_IMPROVE_STEPS  (1u << 22)
/* Precisions (rungs) one request may offer at most: an accept list's length. */
#define KVEDGE_PLAN_MAX_PRECS 8
/* A time at or above this (or not finite) is not a price but "unpriced": INFINITY in a plan
 * (recomputation a request did not allow), 1e300 on the wire (docs/protocol.md). Printers
 * show it as "-" or "unpriced" (JSON: null), never as a time. */
#define KVEDGE_PLAN_UNPRICED_US 1e290

/* One place a request's layers can come from. Network sources (every kind but RECOMPUTE)
 * stream the layers assigned to them in layer order on one stream that pays rtt_us once.
 * The caller owns layer_bytes; the planner only reads it during a call. */
typedef struct {
    kvedge_plan_kind_t kind;
    char name[KVEDGE_PLAN_NAME_LEN]; /* NUL-terminated, for the formatter */
    bool up;                         /* false: never chosen, its numbers are not read */
    double rtt_us;                   /* round trip, paid once per stream */
    double bw_bytes_per_s;           /* > 0 for an up network source */
    /* Per layer (L entries, indexed by absolute layer) the bytes this source would send for
     * it, at its own precision (a cloud may hold int4, a peer fp16); negative: it does not
     * hold the layer. Unused (may be NULL) for kind RECOMPUTE, and by the *_prec functions
     * given a precision choice (kvedge_plan_prec_t.layer_prec_bytes prices it then). */
    const double *layer_bytes;
} kvedge_plan_source_t;

/* One request: layers 0..L-1 of one context. Times in microseconds. */
typedef struct {
    uint32_t layers;          /* L, 1..KVEDGE_PLAN_MAX_LAYERS */
    double prefix_us;         /* serial work outside the overlap (T_prefix); added once */
    const double *compute_us; /* L: decoder time of layer l over the user prompt (t_le,c) */
    /* L: extra decoder time to compute layer l's context KV. NULL: the request allows no
     * recomputation (a fetch-only client that sent no decoder times): a layer some up source
     * holds is never planned as recomputed (recomputing it is priced INFINITY, so no plan
     * that does so is ever lower), and a layer no up source holds is planned as
     * KVEDGE_PLAN_SRC_RECOMPUTE, reason RECOMPUTE_NO_SOURCE (a miss: the client computes it),
     * its timeline step priced at compute_us[l] alone and its cost_us INFINITY; the plan's
     * recompute_all_us is INFINITY (unpriced) and cloud_only_us is when the best cloud source
     * lacks a layer another source holds. */
    const double *recompute_us;
} kvedge_plan_request_t;

/* The precision choice of a request (CacheGen-style): the request accepts P precisions, an
 * accept list best first (index 0 the finest; "coarser" below means a higher index), and the
 * planner picks a (source, precision) pair or recompute per layer, minimizing T subject to
 *   quality(plan) = sum over the fetched layers l of quality_cost[l][p(l)] <= budget
 * (a first-order model: per-layer sensitivities add). Recomputed layers cost 0 (recompute is
 * exact); layers delivered before a replan keep the cost they were delivered at. Passed to the
 * *_prec functions beside the request (NULL there: no precision choice, exactly the plain
 * functions). The caller owns every array; the planner reads them only during a call. */
typedef struct {
    uint32_t n;                 /* P, 1..KVEDGE_PLAN_MAX_PRECS */
    const double *quality_cost; /* [L][P] row-major: cost of layer l at precision p, finite >= 0
                                   (perplexity increase %, KL, ...: any additive unit) */
    double budget;              /* finite >= 0, in quality_cost's unit */
    /* Per source (indexed as sources[]): [L][P] row-major, the bytes the source sends for layer
     * l at precision p; negative: it cannot serve l at p. Required (non-NULL, every entry
     * finite) for an up network source; unread for down and RECOMPUTE-kind sources. With a
     * precision choice a source's layer_bytes is ignored: these bytes are its prices. */
    const double *layer_prec_bytes[KVEDGE_PLAN_MAX_SOURCES];
    /* Optional (NULL: none): the n rung codes of the accept list (access/codec/prec.h), best first;
     * checked with kvedge_prec_list_check, copied into the plan for the formatter's names. */
    const kvedge_prec_t *rungs;
    /* Optional (NULL: none): n entries, finite >= 0, the client's time in µs per byte received
     * to decode precision p's body beyond a plain block's (an entropy-coded rung:
     * kvedge_prec_decode_us_per_byte). Added to the layer's transfer time on its stream
     * (Eq. 19 becomes rtt + bytes / bw + bytes * decode), so on a fast link a rung that saves
     * few bytes but decodes slowly loses, and on a slow link it wins. */
    const double *decode_us_per_byte;
} kvedge_plan_prec_t;

/* A planned layer. Times are on the stream timeline: 0 = streams start (after prefix_us). */
typedef struct {
    int32_t source; /* index into sources[], or KVEDGE_PLAN_SRC_RECOMPUTE */
    kvedge_plan_reason_t reason;
    double cost_us;    /* Eq. 19 price: rtt + bytes / bw, or recompute_us */
    double arrival_us; /* A(l): resident on the client (0 for recompute and delivered) */
    double done_us;    /* done(l): the decoder has finished layer l (0 for delivered) */
    int32_t prec;      /* index into the accept list; -1: recompute or no precision choice */
    kvedge_plan_prec_reason_t prec_reason;
    double quality; /* quality_cost[l][prec] for a fetched layer, else 0; kept when delivered */
} kvedge_plan_layer_t;

/* A plan. About 50 KiB (the layer table is fixed-size so a plan owns no memory): allocate it
 * on the heap or statically in long-lived code. */
typedef struct {
    uint32_t layers;             /* L */
    uint32_t first_layer;        /* 0; for a replan k: layers below k are DELIVERED */
    uint32_t split;              /* m of the best split candidate, first_layer..L */
    int32_t cloud_source;        /* the cloud source behind cloud_only_us; -1 when none is up */
    double total_us;             /* T of this plan (kvedge_plan_simulate of its sources) */
    double bound_us;             /* kvedge_plan_bound of its sources: a lower bound on total_us */
    double split_us;             /* T of the best split candidate, before improvement */
    double cloud_only_us;        /* every layer from the best cloud source, recompute where it lacks
                                    one; = recompute_all_us when no cloud source is up */
    double recompute_all_us;     /* every layer recomputed */
    double load_then_compute_us; /* this plan's sources, but no compute before every transfer
                                    has finished: prefix + max stream end + sum of computes */
    /* The precision choice (kvedge_plan_make_prec): precs = P, 0 without one. */
    uint32_t precs;
    kvedge_prec_t prec_rung[KVEDGE_PLAN_MAX_PRECS]; /* the accept list's codes; 0 unknown */
    double quality_used; /* sum of the layers' quality (delivered ones included) */
    double budget;       /* the request's budget; INFINITY without a precision choice */
    /* fixed_prec_us[p]: T of the planner's best plan with every fetched layer at precision p
     * (kvedge_plan_make_prec's step 1: recompute allowed, within the budget, so finite for
     * p < precs); fixed_prec_quality[p] its quality, delivered layers included. INFINITY and
     * 0 for p >= precs. */
    double fixed_prec_us[KVEDGE_PLAN_MAX_PRECS];
    double fixed_prec_quality[KVEDGE_PLAN_MAX_PRECS];
    kvedge_plan_layer_t layer[KVEDGE_PLAN_MAX_LAYERS]; /* [0, layers) are valid */
} kvedge_plan_t;

/* Units: every time is in microseconds; "bytes / bw" below means bytes * 1e6 / bw_bytes_per_s,
 * the transfer time in microseconds. */

/* Eq. 19: the price in microseconds of layer `layer` from sources[source]:
 * rtt + bytes / bw for a network source, recompute_us[layer] (the layer alone; timelines price
 * R(l), see kvedge_plan_simulate) for KVEDGE_PLAN_SRC_RECOMPUTE or
 * a source of kind RECOMPUTE (INFINITY without recompute_us). INFINITY when the source is down,
 * does not hold the layer, or an argument is out of range (numbers are not otherwise validated
 * here). */
double kvedge_plan_cost(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                        size_t nsrc, int32_t source, uint32_t layer);

/* The pipelined timeline of one assignment (assign[l] = source index or
 * KVEDGE_PLAN_SRC_RECOMPUTE, L entries). Every network source streams its assigned layers in
 * layer order from time 0, all sources in parallel: A(l) = rtt(s) + sum over layers l' <= l
 * assigned to s of bytes(l', s) / bw(s); a recomputed layer has A(l) = 0. The decoder runs
 * layers in order: done(-1) = 0, done(l) = max(done(l-1), A(l)) + compute_us[l]
 * (+ R(l) when recomputed). *total_us = prefix_us + done(L-1).
 * R(l), the decoder's time to compute layer l's context KV: the client runs the context's
 * hidden state lazily (clients/decoder.h), so R(l) = sum of recompute_us[j] for j from c to
 * l, where c is the first layer the context has not yet been run through (0 at the start of
 * a request, l after a recomputed layer l - 1). Recomputing a shallow prefix costs its layers;
 * recomputing a deep layer after fetched ones pays every layer below it.
 * arrival_us and done_us (L entries each) are optional outputs, NULL to skip.
 * Errors: KVEDGE_EINVAL (bad request or sources, see kvedge_plan_make; an assigned source out
 * of range, down, or not holding its layer); nothing written. */
int kvedge_plan_simulate(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                         size_t nsrc, const int32_t *assign, double *total_us, double *arrival_us,
                         double *done_us);

/* The overlap bound of Eq. 20 for one assignment, EdgePrompt's
 *   T = T_prefix + (t_lc,c + t_lc,t) + max[ sum_{l>=2} (t_lc,c + t_lc,t), sum_{l>=1} t_le,c ]
 * with the cloud's compute already done (the KV is stored) and parallel streams:
 *   bound = prefix_us + t_1 + max(X, C)
 *   t_1 = A(0): the first layer's arrival, rtt(s) + bytes(0, s) / bw(s), or 0 if recomputed;
 *   X   = max over the streams s of (rtt(s) + sum of bytes(l, s) / bw(s) over its layers) - t_1,
 *         at least 0: the transfer time left after the first layer (with one stream carrying
 *         every layer, exactly sum_{l>=2} of the transfer times);
 *   C   = sum of compute_us[l] + sum of R(l) over the recomputed layers.
 * It equals max(t_1 + C, last arrival) + prefix, so it never exceeds kvedge_plan_simulate's
 * total for the same assignment (the decoder cannot start before layer 0 is there and cannot
 * finish before the last layer is); equal to it when the decoder never waits after layer 0.
 * Errors: as kvedge_plan_simulate. */
int kvedge_plan_bound(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                      size_t nsrc, const int32_t *assign, double *bound_us);

/* Chooses a source per layer.
 * 1. near(l): the cheapest (Eq. 19) up LOCAL, PEER or HISTORY source holding l, or recompute
 *    when that is strictly cheaper or nothing holds l; far(l): the cheapest up CLOUD source
 *    holding l, else near(l). Cost ties go to fewer bytes, then the lower index.
 * 2. For every split m in 0..L: layers < m from near, >= m from far; simulate; keep the
 *    lowest T (ties: the smaller m). Also simulated, as baselines: recompute-all and every up
 *    source alone (recompute where it lacks a layer).
 * 3. Greedy improvement: up to KVEDGE_PLAN_IMPROVE_PASSES passes in layer order, each moving
 *    a layer to the usable option (any up source holding it, or recompute) that lowers T
 *    the most, when one strictly does; at most KVEDGE_PLAN_IMPROVE_STEPS of work per run.
 *    Run from the best split and, when the best baseline is strictly lower, from it too; the
 *    lower result wins (ties: the split's). So T is never above the best split, cloud-only,
 *    recompute-all or any single source. Reasons are relative to the best split's m.
 * Down sources and sources of kind RECOMPUTE are never chosen (recompute is the index
 * KVEDGE_PLAN_SRC_RECOMPUTE). Fills *out completely (first_layer 0).
 * Errors: KVEDGE_EINVAL (NULL req/out; sources NULL with nsrc > 0; nsrc >
 * KVEDGE_PLAN_MAX_SOURCES; L outside 1..KVEDGE_PLAN_MAX_LAYERS; prefix_us or compute_us NULL,
 * negative or not finite; a recompute_us entry negative or not finite; an unknown kind or a name
 * without NUL; an up network source whose rtt is negative or not finite, bw not finite or not > 0,
 * layer_bytes NULL or an entry not finite); *out unchanged. */
int kvedge_plan_make(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                     size_t nsrc, kvedge_plan_t *out);

/* Re-plans after sources[failed] failed while layers [0, k) had been received
 * (k = first_layer_not_received, 0..L; failed may be KVEDGE_PLAN_SRC_NONE). The failed source
 * is treated as down; layers [k, L) are planned as kvedge_plan_make plans a new request with
 * the time origin at now: streams restart (each pays its rtt again), the decoder is taken as
 * free (its backlog of received layers is not modelled) and prefix_us is not paid again.
 * Layers below k keep prev's source, cost, precision and quality, reason DELIVERED, times 0;
 * quality_used is their quality's sum (budget INFINITY, precs 0: no precision choice for the
 * rest). total_us and every other time in *out are the remaining time from now. The caller's
 * sources are not modified. out may be prev. Errors: KVEDGE_EINVAL (as kvedge_plan_make; prev NULL
 * or prev->layers != L; k > L; failed neither KVEDGE_PLAN_SRC_NONE nor a source index); *out
 * unchanged. */
int kvedge_plan_replan(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                       size_t nsrc, const kvedge_plan_t *prev, uint32_t first_layer_not_received,
                       int32_t failed, kvedge_plan_t *out);

/* Writes a human-readable table of the plan into buf (always NUL-terminated when len > 0):
 * one row per layer (layer, source, kind, cost ms, arrival ms, done ms, reason, and for a plan
 * with a precision choice the precision index, its rung name and the precision reason), then T,
 * the bound, the split and the comparison totals (and the quality used, the budget and each
 * fixed precision's T). sources are the ones the plan was made with,
 * for names. Errors: KVEDGE_EINVAL (NULL plan or buf, len 0, sources NULL with nsrc > 0);
 * KVEDGE_ENOSPACE (buf too small: it holds a truncated table). */
int kvedge_plan_format(const kvedge_plan_t *plan, const kvedge_plan_source_t *sources, size_t nsrc,
                       char *buf, size_t len);

/* A time for people: "%.<decimals>f ms" of us, or "unpriced" when us is not a price (not
 * finite, or at least KVEDGE_PLAN_UNPRICED_US). Writes buf (always NUL-terminated when
 * len > 0) and returns it; decimals is clamped to 0..6. */
const char *kvedge_plan_ms_text(double us, int decimals, char *buf, size_t len);

/* ---- precision choice ------------------------------------------------------------------
 * The functions below take a kvedge_plan_prec_t beside the request; prec NULL makes each one
 * exactly its plain counterpart above (prec_assign is then not read). With prec, a layer's
 * option is (source, precision) or recompute: a source's bytes for layer l are
 * prec->layer_prec_bytes[source][l * P + p] (its layer_bytes is not read) and every timeline
 * rule above is unchanged. prec_assign[l] (L entries) is the precision index of layer l; it is
 * read only where assign[l] is a network source, and must be < P with the source serving the
 * layer at that precision. Validation: as kvedge_plan_make, plus KVEDGE_EINVAL for P 0 or
 * above KVEDGE_PLAN_MAX_PRECS; quality_cost NULL or an entry negative or not finite; budget
 * negative or not finite; an up network source whose layer_prec_bytes is NULL or has an entry
 * that is not finite; rungs not NULL and failing kvedge_prec_list_check. */

/* Eq. 19 at precision prec_index: rtt + bytes(layer, prec_index) / bw (+ bytes times the
 * precision's decode_us_per_byte); recompute as
 * kvedge_plan_cost. INFINITY where kvedge_plan_cost is, or when prec_index >= P or the source
 * cannot serve the layer at it. */
double kvedge_plan_cost_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                             const kvedge_plan_source_t *sources, size_t nsrc, int32_t source,
                             int32_t prec_index, uint32_t layer);

/* kvedge_plan_simulate and kvedge_plan_bound of an assignment with precisions. Errors: as
 * their plain counterparts, plus a bad prec or a prec_assign entry that cannot be served
 * (prec_assign NULL with prec set is KVEDGE_EINVAL); nothing written. */
int kvedge_plan_simulate_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                              const kvedge_plan_source_t *sources, size_t nsrc,
                              const int32_t *assign, const int32_t *prec_assign, double *total_us,
                              double *arrival_us, double *done_us);
int kvedge_plan_bound_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                           const kvedge_plan_source_t *sources, size_t nsrc, const int32_t *assign,
                           const int32_t *prec_assign, double *bound_us);

/* The quality cost of an assignment: the sum, in layer order from layer 0, of
 * quality_cost[l][prec_assign[l]] over the layers assigned to a network source (the same sum,
 * bit for bit, as a plan's quality_used for a plan made by kvedge_plan_make_prec). 0 when prec
 * is NULL. Errors: as kvedge_plan_simulate_prec; nothing written. */
int kvedge_plan_quality(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                        const kvedge_plan_source_t *sources, size_t nsrc, const int32_t *assign,
                        const int32_t *prec_assign, double *quality);

/* Chooses a (source, precision) pair or recompute per layer: minimizes T subject to
 * quality <= budget. prec NULL: kvedge_plan_make.
 * 1. Fixed precision: for each p in 0..P-1, kvedge_plan_make's steps 1-3 with every source
 *    restricted to precision p, under the budget: a split or baseline candidate over the
 *    budget is repaired by recomputing its fetched layers, highest quality_cost[l][p] first
 *    (ties: the lower layer), the fewest that make it fit (recompute-all always fits); a
 *    greedy move that would leave the budget is not taken. Its T is fixed_prec_us[p]. The
 *    lowest wins (ties: the lower p); split, split_us are that run's; cloud_only_us and
 *    cloud_source the lowest cloud-only of all the runs (ties: the lower p).
 * 2. When P > 1, across every option (any up source at any precision it serves, or
 *    recompute): the greedy improvement of kvedge_plan_make, within the budget, from each
 *    precision's plan of step 1, and from step 1's winner re-allocated as a multiple-choice
 *    knapsack (CacheGen-style): every fetched layer at its source's rung of least quality
 *    cost, then, one move at a time, the move of a layer to a rung of its source with fewer
 *    bytes that saves the most transfer time per unit of quality cost it adds (ties: the lower
 *    layer, then the finer rung), a move that would leave the budget dropped. The lowest T
 *    wins (ties: the lower p, the knapsack start last).
 * 3. When P > 1, one pass of quality recovery in layer order: a fetched layer moves to the
 *    option of least quality cost (recompute's is 0), strictly below its own, that does not
 *    raise T (ties: the lower T, then sources in index order, precisions best first).
 * Each greedy run, the knapsack start and step 3 spend at most KVEDGE_PLAN_IMPROVE_STEPS, so
 * the work is about (2P + 2) times kvedge_plan_make's, plus P split searches. T (exactly
 * kvedge_plan_simulate_prec's) <= min over p of fixed_prec_us[p] <= each run's split,
 * cloud-only and recompute-all; quality_used <= budget; with P == 1 and a budget at least the
 * all-fetched cost the plan is kvedge_plan_make's for the same bytes. Precision reasons: ONLY when
 * the source serves the layer at one rung; else BUDGET when a coarser rung of the same source would
 * strictly lower T but exceed the budget; else FINEST or COARSER_FASTER by whether a finer rung is
 * served. A recomputed layer is BUDGET when some fetch would strictly lower T but exceed the
 * budget, else NONE. These checks spend at most KVEDGE_PLAN_IMPROVE_STEPS too; past it no layer is
 * marked BUDGET. Source reasons are relative to step 1's winner.
 * Fills *out completely. Errors: as kvedge_plan_make and the validation above; *out
 * unchanged. */
int kvedge_plan_make_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                          const kvedge_plan_source_t *sources, size_t nsrc, kvedge_plan_t *out);

/* kvedge_plan_replan with a precision choice (prec NULL: kvedge_plan_replan, which keeps the
 * delivered layers' precision and quality and reports their sum as quality_used). Called when
 * a source failed or its bandwidth changed (the caller updates bw_bytes_per_s first): layers
 * [k, L) are planned as kvedge_plan_make_prec plans them, and may change precision; delivered
 * layers keep their source, precision, prec_reason and quality, and their quality counts
 * against the budget: the rest is planned within budget minus their sum (in layer order).
 * When the delivered layers alone exceed the budget (the caller lowered it) the rest may add
 * no quality cost, and quality_used exceeds budget by exactly the delivered excess.
 * Errors: as kvedge_plan_replan and the validation above, plus a delivered layer's quality
 * negative or not finite; *out unchanged. */
int kvedge_plan_replan_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                            const kvedge_plan_source_t *sources, size_t nsrc,
                            const kvedge_plan_t *prev, uint32_t first_layer_not_received,
                            int32_t failed, kvedge_plan_t *out);

#ifdef __cplusplus
}
#endif
#endif
