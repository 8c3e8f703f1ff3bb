/* Path planner: prices every source of a request's context KV per layer (CE-LSLM Eq. 19) and
 * picks a source per layer that minimizes the pipelined completion time (Eq. 20, EdgePrompt's
 * overlap model). Pure functions: no I/O, no clocks, no allocation, no logging. */
#ifndef KVEDGE_PROXY_PLAN_H
#define KVEDGE_PROXY_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/proto.h"

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
     * hold the layer. Unused (may be NULL) for kind RECOMPUTE. */
    const double *layer_bytes;
} kvedge_plan_source_t;

/* One request: layers 0..L-1 of one context. Times in microseconds. */
typedef struct {
    uint32_t layers;            /* L, 1..KVEDGE_PLAN_MAX_LAYERS */
    double prefix_us;           /* serial work outside the overlap (T_prefix); added once */
    const double *compute_us;   /* L: decoder time of layer l over the user prompt (t_le,c) */
    const double *recompute_us; /* L: extra decoder time to compute layer l's context KV */
} kvedge_plan_request_t;

/* A planned layer. Times are on the stream timeline: 0 = streams start (after prefix_us). */
typedef struct {
    int32_t source; /* index into sources[], or KVEDGE_PLAN_SRC_RECOMPUTE */
    kvedge_plan_reason_t reason;
    double cost_us;    /* Eq. 19 price: rtt + bytes / bw, or recompute_us */
    double arrival_us; /* A(l): resident on the client (0 for recompute and delivered) */
    double done_us;    /* done(l): the decoder has finished layer l (0 for delivered) */
} kvedge_plan_layer_t;

/* A plan. About 40 KiB (the layer table is fixed-size so a plan owns no memory): allocate it
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
    kvedge_plan_layer_t layer[KVEDGE_PLAN_MAX_LAYERS]; /* [0, layers) are valid */
} kvedge_plan_t;

/* Units: every time is in microseconds; "bytes / bw" below means bytes * 1e6 / bw_bytes_per_s,
 * the transfer time in microseconds. */

/* Eq. 19: the price in microseconds of layer `layer` from sources[source]:
 * rtt + bytes / bw for a network source, recompute_us[layer] (the layer alone; timelines price
 * R(l), see kvedge_plan_simulate) for KVEDGE_PLAN_SRC_RECOMPUTE or
 * a source of kind RECOMPUTE. INFINITY when the source is down, does not hold the layer, or
 * an argument is out of range (numbers are not otherwise validated here). */
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
 * KVEDGE_PLAN_MAX_SOURCES; L outside 1..KVEDGE_PLAN_MAX_LAYERS; prefix_us, compute_us or
 * recompute_us NULL, negative or not finite; an unknown kind or a name without NUL; an up
 * network source whose rtt is negative or not finite, bw not finite or not > 0, layer_bytes
 * NULL or an entry not finite); *out unchanged. */
int kvedge_plan_make(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                     size_t nsrc, kvedge_plan_t *out);

/* Re-plans after sources[failed] failed while layers [0, k) had been received
 * (k = first_layer_not_received, 0..L; failed may be KVEDGE_PLAN_SRC_NONE). The failed source
 * is treated as down; layers [k, L) are planned as kvedge_plan_make plans a new request with
 * the time origin at now: streams restart (each pays its rtt again), the decoder is taken as
 * free (its backlog of received layers is not modelled) and prefix_us is not paid again.
 * Layers below k keep prev's source and cost, reason DELIVERED, times 0. total_us and every
 * other time in *out are the remaining time from now. The caller's sources are not
 * modified. out may be prev.
 * Errors: KVEDGE_EINVAL (as kvedge_plan_make; prev NULL or prev->layers != L; k > L; failed
 * neither KVEDGE_PLAN_SRC_NONE nor a source index); *out unchanged. */
int kvedge_plan_replan(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                       size_t nsrc, const kvedge_plan_t *prev, uint32_t first_layer_not_received,
                       int32_t failed, kvedge_plan_t *out);

/* Writes a human-readable table of the plan into buf (always NUL-terminated when len > 0):
 * one row per layer (layer, source, kind, cost ms, arrival ms, done ms, reason), then T, the
 * bound, the split and the comparison totals. sources are the ones the plan was made with,
 * for names. Errors: KVEDGE_EINVAL (NULL plan or buf, len 0, sources NULL with nsrc > 0);
 * KVEDGE_ENOSPACE (buf too small: it holds a truncated table). */
int kvedge_plan_format(const kvedge_plan_t *plan, const kvedge_plan_source_t *sources, size_t nsrc,
                       char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
