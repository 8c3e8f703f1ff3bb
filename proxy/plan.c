/* Path planner: Eq. 19 prices, the pipelined timeline, the Eq. 20 bound, the split search
 * with greedy improvement, re-planning and the table formatter (see plan.h for the model). */
#include "proxy/plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "access/codec/error.h"

/* An accept list fits the ladder's, and a layer's rungs fit a byte of flags (s_coarsen). */
_Static_assert(KVEDGE_PLAN_MAX_PRECS <= KVEDGE_PREC_MAX_ACCEPT, "accept list longer than prec.h's");
_Static_assert(KVEDGE_PLAN_MAX_PRECS <= 8, "s_coarsen keeps one bit per rung in a uint8_t");

/* What one computation reads: the request, the sources, and the layers it covers.
 * An "option" (int32_t) is what a layer gets: without a precision choice a source index (as
 * in the API's assign[]); with one, source * np + precision; negative: recompute. */
typedef struct {
    const kvedge_plan_request_t *req;
    const kvedge_plan_source_t *src;
    size_t nsrc;
    uint32_t first;  /* first layer planned (0, or k for a replan) */
    uint32_t layers; /* L */
    double prefix;   /* prefix_us, or 0 for a replan */
    uint32_t ctx0;   /* layers the context has been run through at `first` (recomputation) */
    const kvedge_plan_prec_t *prec; /* NULL: no precision choice */
    uint32_t np;                    /* P, 0 without a precision choice */
    int32_t fix;                    /* -1: every precision; else only this one (step 1) */
    double q0;                      /* quality of the delivered layers (a replan) */
    double limit;                   /* the most quality may reach; INFINITY without prec */
    /* A request without recompute_us (recomputation not allowed): held[l] says some up
     * network source serves layer l at some precision, so recomputing it is out of reach;
     * a layer nobody holds is a miss the plan cannot avoid, priced at its compute time. */
    bool held[KVEDGE_PLAN_MAX_LAYERS];
} s_ctx_t;

static bool s_finite_nonneg(double x)
{
    return isfinite(x) && x >= 0;
}

static bool s_is_net(const kvedge_plan_source_t *s)
{
    return s->kind != KVEDGE_PLAN_RECOMPUTE;
}

/* The source and the precision of an option (-1 for recompute / no precision choice). */
static int32_t s_src_of(const s_ctx_t *c, int32_t o)
{
    return o < 0 || !c->np ? o : o / (int32_t)c->np;
}

static int32_t s_prec_of(const s_ctx_t *c, int32_t o)
{
    return o < 0 || !c->np ? -1 : o % (int32_t)c->np;
}

static int32_t s_opt(const s_ctx_t *c, size_t s, int32_t p)
{
    return c->np ? (int32_t)s * (int32_t)c->np + p : (int32_t)s;
}

/* Options 0..s_nopt-1 are every (source, precision); order: sources, then precisions. */
static int32_t s_nopt(const s_ctx_t *c)
{
    return (int32_t)(c->nsrc * (c->np ? c->np : 1));
}

/* The option of source s in a view with one precision (no choice, or step 1's fix). */
static int32_t s_view_opt(const s_ctx_t *c, size_t s)
{
    return s_opt(c, s, c->fix < 0 ? 0 : c->fix);
}

/* Bytes of layer l from a network option. */
static double s_bytes(const s_ctx_t *c, int32_t o, uint32_t l)
{
    uint32_t u = (uint32_t)o; /* o >= 0 here */
    if (!c->np)
        return c->src[u].layer_bytes[l];
    return c->prec->layer_prec_bytes[u / c->np][(size_t)l * c->np + u % c->np];
}

/* An option of an up network source that serves layer l (at the view's precision). */
static bool s_holds(const s_ctx_t *c, int32_t o, uint32_t l)
{
    const kvedge_plan_source_t *p = &c->src[s_src_of(c, o)];
    return p->up && s_is_net(p) && (c->fix < 0 || s_prec_of(c, o) == c->fix) &&
           s_bytes(c, o, l) >= 0;
}

/* Source s serves layer l at some precision the view allows. */
static bool s_src_holds(const s_ctx_t *c, size_t s, uint32_t l)
{
    if (!c->np || c->fix >= 0)
        return s_holds(c, s_view_opt(c, s), l);
    for (uint32_t p = 0; p < c->np; p++)
        if (s_holds(c, s_opt(c, s, (int32_t)p), l))
            return true;
    return false;
}

/* Transfer time in microseconds of bytes over bw bytes/s. */
static double s_xfer_us(double bytes, double bw)
{
    return bytes * 1e6 / bw;
}

/* Time for layer l from network option o: its bytes over the source's link, plus the client's
 * time to decode that precision's body beyond a plain block's (prec->decode_us_per_byte, per
 * byte received), counted on the same stream: a rung slow to decode is priced as a slower link. */
static double s_time(const s_ctx_t *c, int32_t o, uint32_t l)
{
    double b = s_bytes(c, o, l), t = s_xfer_us(b, c->src[s_src_of(c, o)].bw_bytes_per_s);
    if (c->np && c->prec->decode_us_per_byte)
        t += b * c->prec->decode_us_per_byte[s_prec_of(c, o)];
    return t;
}

/* Whether option a means "recompute" (the sentinel or a RECOMPUTE-kind source). */
static bool s_is_recompute(const s_ctx_t *c, int32_t a)
{
    return a < 0 || !s_is_net(&c->src[s_src_of(c, a)]);
}

/* Quality cost of layer l under option o: 0 when recomputed or without a precision choice. */
static double s_q(const s_ctx_t *c, int32_t o, uint32_t l)
{
    if (!c->np || s_is_recompute(c, o))
        return 0;
    return c->prec->quality_cost[(size_t)l * c->np + (uint32_t)s_prec_of(c, o)];
}

/* Quality of an assignment: the delivered layers' sum, then the planned layers in order. */
static double s_quality(const s_ctx_t *c, const int32_t *assign)
{
    double q = c->q0;
    if (!c->np)
        return q;
    for (uint32_t l = c->first; l < c->layers; l++)
        if (!s_is_recompute(c, assign[l]))
            q += s_q(c, assign[l], l);
    return q;
}

/* Whether assign, with layer l at option o, stays within the budget. */
static bool s_fits_with(const s_ctx_t *c, int32_t *assign, uint32_t l, int32_t o)
{
    if (!c->np)
        return true;
    int32_t keep = assign[l];
    assign[l] = o;
    bool fits = s_quality(c, assign) <= c->limit;
    assign[l] = keep;
    return fits;
}

static int s_check_sources(const kvedge_plan_source_t *sources, size_t nsrc, uint32_t layers,
                           bool need_bytes)
{
    if (nsrc > KVEDGE_PLAN_MAX_SOURCES || (nsrc > 0 && !sources))
        return KVEDGE_EINVAL;
    for (size_t i = 0; i < nsrc; i++) {
        const kvedge_plan_source_t *s = &sources[i];
        if ((unsigned)s->kind > KVEDGE_PLAN_RECOMPUTE || !memchr(s->name, '\0', sizeof s->name))
            return KVEDGE_EINVAL;
        if (!s->up || !s_is_net(s))
            continue; /* never priced, so never read */
        if (!s_finite_nonneg(s->rtt_us) || !isfinite(s->bw_bytes_per_s) || !(s->bw_bytes_per_s > 0))
            return KVEDGE_EINVAL;
        if (!need_bytes)
            continue; /* priced by the precision table instead */
        if (!s->layer_bytes)
            return KVEDGE_EINVAL;
        for (uint32_t l = 0; l < layers; l++)
            if (!isfinite(s->layer_bytes[l]))
                return KVEDGE_EINVAL;
    }
    return KVEDGE_OK;
}

/* The request and the sources; with prec also the precision table (see plan.h). */
static int s_check_all(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                       const kvedge_plan_source_t *sources, size_t nsrc)
{
    if (!req || req->layers < 1 || req->layers > KVEDGE_PLAN_MAX_LAYERS ||
        !s_finite_nonneg(req->prefix_us) || !req->compute_us)
        return KVEDGE_EINVAL;
    for (uint32_t l = 0; l < req->layers; l++)
        if (!s_finite_nonneg(req->compute_us[l]) ||
            (req->recompute_us && !s_finite_nonneg(req->recompute_us[l])))
            return KVEDGE_EINVAL;
    if (s_check_sources(sources, nsrc, req->layers, !prec) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    if (!prec)
        return KVEDGE_OK;
    if (prec->n < 1 || prec->n > KVEDGE_PLAN_MAX_PRECS || !prec->quality_cost ||
        !s_finite_nonneg(prec->budget))
        return KVEDGE_EINVAL;
    size_t cells = (size_t)req->layers * prec->n;
    for (size_t i = 0; i < cells; i++)
        if (!s_finite_nonneg(prec->quality_cost[i]))
            return KVEDGE_EINVAL;
    for (size_t s = 0; s < nsrc; s++) {
        if (!sources[s].up || !s_is_net(&sources[s]))
            continue;
        const double *b = prec->layer_prec_bytes[s];
        if (!b)
            return KVEDGE_EINVAL;
        for (size_t i = 0; i < cells; i++)
            if (!isfinite(b[i]))
                return KVEDGE_EINVAL;
    }
    if (prec->rungs && kvedge_prec_list_check(prec->rungs, prec->n) != 0)
        return KVEDGE_EINVAL;
    for (uint32_t p = 0; prec->decode_us_per_byte && p < prec->n; p++)
        if (!s_finite_nonneg(prec->decode_us_per_byte[p]))
            return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

/* The API's (assign, prec_assign) as options in opts: every layer's source is the sentinel or
 * an in-range, up source that can serve it at its precision. Without prec, opts = assign. */
static int s_opts(const s_ctx_t *c, const int32_t *assign, const int32_t *pa, int32_t *opts)
{
    if (!assign || (c->np && !pa))
        return KVEDGE_EINVAL;
    for (uint32_t l = c->first; l < c->layers; l++) {
        int32_t a = assign[l];
        opts[l] = a;
        if (a == KVEDGE_PLAN_SRC_RECOMPUTE)
            continue;
        if (a < 0 || (size_t)a >= c->nsrc || !c->src[a].up)
            return KVEDGE_EINVAL;
        if (!s_is_net(&c->src[a])) {
            if (c->np)
                opts[l] = KVEDGE_PLAN_SRC_RECOMPUTE;
            continue;
        }
        if (c->np) {
            if (pa[l] < 0 || (uint32_t)pa[l] >= c->np)
                return KVEDGE_EINVAL;
            opts[l] = s_opt(c, (size_t)a, pa[l]);
        }
        if (!s_holds(c, opts[l], l))
            return KVEDGE_EINVAL;
    }
    return KVEDGE_OK;
}

static s_ctx_t s_ctx(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                     const kvedge_plan_source_t *src, size_t nsrc, uint32_t first, double prefix,
                     uint32_t ctx0)
{
    s_ctx_t c = {.req = req,
                 .src = src,
                 .nsrc = nsrc,
                 .first = first,
                 .layers = req->layers,
                 .prefix = prefix,
                 .ctx0 = ctx0,
                 .prec = prec,
                 .np = prec ? prec->n : 0,
                 .fix = -1,
                 .q0 = 0,
                 .limit = prec ? prec->budget : INFINITY};
    for (uint32_t l = first; !req->recompute_us && l < c.layers; l++)
        for (size_t s = 0; s < nsrc && !c.held[l]; s++)
            c.held[l] = s_src_holds(&c, s, l);
    return c;
}

/* Decoder time to compute layer l's context KV when the context has been run through layers
 * [0, *ctx): the client runs the context's hidden state lazily, so it pays every layer from
 * *ctx to l (decoder.h); advances *ctx past l. */
static double s_recompute(const s_ctx_t *c, uint32_t l, uint32_t *ctx)
{
    if (!c->req->recompute_us) { /* not allowed: out of reach, or a miss nobody can avoid */
        *ctx = l + 1;
        return c->held[l] ? INFINITY : 0;
    }
    double work = 0;
    for (uint32_t j = *ctx < l ? *ctx : l; j <= l; j++)
        work += c->req->recompute_us[j];
    *ctx = l + 1;
    return work;
}

/* Every stream starts at time 0 with its round trip ahead of it. */
static void s_acc_init(const s_ctx_t *c, double *acc)
{
    for (size_t s = 0; s < c->nsrc; s++)
        acc[s] = c->src[s].up && s_is_net(&c->src[s]) ? c->src[s].rtt_us : 0;
}

/* One decoder step: layer l from option a after the decoder finished at `done`; advances a's
 * stream in acc and, for a recomputed layer, the context in *ctx. Returns done(l); *arrival
 * gets A(l). */
static double s_step(const s_ctx_t *c, int32_t a, uint32_t l, double done, double *acc,
                     uint32_t *ctx, double *arrival)
{
    double arr = 0, work = c->req->compute_us[l];
    if (s_is_recompute(c, a)) {
        work += s_recompute(c, l, ctx);
    } else {
        int32_t s = s_src_of(c, a);
        acc[s] += s_time(c, a, l);
        arr = acc[s];
    }
    *arrival = arr;
    return (done > arr ? done : arr) + work;
}

/* done(L-1) of assign from layer `from` on, given the decoder state there; layer ovl uses
 * ovs instead of assign[ovl] (ovl = UINT32_MAX: none). Same operations in the same order as
 * a full run, so a tail evaluation is bit-identical to simulating the changed assignment. */
static double s_tail(const s_ctx_t *c, const int32_t *assign, uint32_t from, double done,
                     double *acc, uint32_t ctx, uint32_t ovl, int32_t ovs)
{
    double arr;
    for (uint32_t l = from; l < c->layers; l++)
        done = s_step(c, l == ovl ? ovs : assign[l], l, done, acc, &ctx, &arr);
    return done;
}

/* done(L-1) of an assignment (no prefix). */
static double s_done(const s_ctx_t *c, const int32_t *assign)
{
    double acc[KVEDGE_PLAN_MAX_SOURCES];
    s_acc_init(c, acc);
    return s_tail(c, assign, c->first, 0, acc, c->ctx0, UINT32_MAX, 0);
}

/* T of an assignment (prefix included). */
static double s_total(const s_ctx_t *c, const int32_t *assign)
{
    return c->prefix + s_done(c, assign);
}

/* The pieces of the Eq. 20 bound: t_1, the latest stream end (0: no stream) and C. */
static void s_parts(const s_ctx_t *c, const int32_t *assign, double *t1, double *last, double *csum)
{
    double acc[KVEDGE_PLAN_MAX_SOURCES], done = 0, arr;
    bool used[KVEDGE_PLAN_MAX_SOURCES] = {false};
    uint32_t ctx = c->ctx0, cctx = c->ctx0;
    s_acc_init(c, acc);
    *t1 = 0;
    *csum = 0;
    for (uint32_t l = c->first; l < c->layers; l++) {
        int32_t a = assign[l];
        done = s_step(c, a, l, done, acc, &ctx, &arr);
        if (l == c->first)
            *t1 = arr;
        *csum += c->req->compute_us[l];
        if (s_is_recompute(c, a))
            *csum += s_recompute(c, l, &cctx);
        else
            used[s_src_of(c, a)] = true;
    }
    *last = 0;
    for (size_t s = 0; s < c->nsrc; s++)
        if (used[s] && acc[s] > *last)
            *last = acc[s];
}

static double s_bound(const s_ctx_t *c, const int32_t *assign)
{
    double t1, last, csum;
    s_parts(c, assign, &t1, &last, &csum);
    double x = last - t1 > 0 ? last - t1 : 0;
    return c->prefix + t1 + (x > csum ? x : csum);
}

static double s_load_then_compute(const s_ctx_t *c, const int32_t *assign)
{
    double t1, last, csum;
    s_parts(c, assign, &t1, &last, &csum);
    return c->prefix + last + csum;
}

static double s_cost(const s_ctx_t *c, int32_t a, uint32_t l)
{
    if (s_is_recompute(c, a))
        return c->req->recompute_us ? c->req->recompute_us[l] : INFINITY; /* unpriced */
    const kvedge_plan_source_t *p = &c->src[s_src_of(c, a)];
    return p->rtt_us + s_time(c, a, l);
}

/* The cheapest up source holding l among the cloud (cloud) or the near kinds (!cloud), as an
 * option of the view; ties: fewer bytes, then the lower index. -1 when none. */
static int32_t s_cheapest(const s_ctx_t *c, uint32_t l, bool cloud, double *cost)
{
    int32_t best = -1;
    double bc = INFINITY, bb = INFINITY;
    for (size_t s = 0; s < c->nsrc; s++) {
        int32_t o = s_view_opt(c, s);
        if (!s_holds(c, o, l) || (c->src[s].kind == KVEDGE_PLAN_CLOUD) != cloud)
            continue;
        double k = s_cost(c, o, l), b = s_bytes(c, o, l);
        if (best < 0 || k < bc || (k == bc && b < bb)) {
            best = o;
            bc = k;
            bb = b;
        }
    }
    *cost = bc;
    return best;
}

/* Greedy passes over the layers: move one layer at a time to the option that lowers T the
 * most, when any does and the plan stays within the budget. t is done(L-1) of assign;
 * returns the new one. */
static double s_improve(const s_ctx_t *c, int32_t *assign, double t)
{
    double acc[KVEDGE_PLAN_MAX_SOURCES], tmp[KVEDGE_PLAN_MAX_SOURCES];
    uint64_t steps = 0;
    int32_t nopt = s_nopt(c);
    for (int pass = 0; pass < KVEDGE_PLAN_IMPROVE_PASSES; pass++) {
        bool changed = false;
        double done = 0, arr;
        uint32_t ctx = c->ctx0;
        s_acc_init(c, acc);
        for (uint32_t l = c->first; l < c->layers; l++) {
            int32_t cur = assign[l], pick = cur;
            double pick_t = t;
            for (int32_t o = -1; o < nopt; o++) {
                if (o == cur || (o >= 0 && !s_holds(c, o, l)))
                    continue;
                steps += c->layers - l;
                if (steps > KVEDGE_PLAN_IMPROVE_STEPS)
                    return t;
                memcpy(tmp, acc, c->nsrc * sizeof *tmp);
                double v = s_tail(c, assign, l, done, tmp, ctx, l, o);
                if (v < pick_t && s_fits_with(c, assign, l, o)) {
                    pick_t = v;
                    pick = o;
                }
            }
            if (pick != cur) {
                assign[l] = pick;
                t = pick_t;
                changed = true;
            }
            done = s_step(c, assign[l], l, done, acc, &ctx, &arr);
        }
        if (!changed)
            break;
    }
    return t;
}

/* Step 3, quality recovery: one pass moving each fetched layer to the option of least quality
 * cost below its own that does not raise T (ties: the lower T, then the first option). t is
 * done(L-1) of assign; returns the new one. */
static double s_refine(const s_ctx_t *c, int32_t *assign, double t)
{
    double acc[KVEDGE_PLAN_MAX_SOURCES], tmp[KVEDGE_PLAN_MAX_SOURCES], done = 0, arr;
    uint64_t steps = 0;
    uint32_t ctx = c->ctx0;
    int32_t nopt = s_nopt(c);
    s_acc_init(c, acc);
    for (uint32_t l = c->first; l < c->layers; l++) {
        int32_t cur = assign[l], pick = cur;
        if (!s_is_recompute(c, cur)) {
            double qcur = s_q(c, cur, l), best_q = qcur, best_v = t;
            for (int32_t o = -1; o < nopt; o++) {
                if (o == cur || (o >= 0 && !s_holds(c, o, l)))
                    continue;
                double qo = s_q(c, o, l);
                if (!(qo < qcur) || (pick != cur && qo > best_q))
                    continue;
                steps += c->layers - l;
                if (steps > KVEDGE_PLAN_IMPROVE_STEPS)
                    return t;
                memcpy(tmp, acc, c->nsrc * sizeof *tmp);
                double v = s_tail(c, assign, l, done, tmp, ctx, l, o);
                if (v <= t && (pick == cur || qo < best_q || v < best_v)) {
                    pick = o;
                    best_q = qo;
                    best_v = v;
                }
            }
            if (pick != cur && s_fits_with(c, assign, l, pick)) {
                assign[l] = pick;
                t = best_v;
            }
        }
        done = s_step(c, assign[l], l, done, acc, &ctx, &arr);
    }
    return t;
}

/* The order in which a candidate over the budget recomputes its layers: the planned layers by
 * quality_cost[l][fix], highest first, ties the lower layer (a stable insertion sort). */
static void s_repair_order(const s_ctx_t *c, uint32_t *order)
{
    const double *qc = c->prec->quality_cost;
    uint32_t n = 0;
    for (uint32_t l = c->first; l < c->layers; l++) {
        double q = qc[(size_t)l * c->np + (uint32_t)c->fix];
        uint32_t i = n++;
        while (i > 0 && qc[(size_t)order[i - 1] * c->np + (uint32_t)c->fix] < q) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = l;
    }
}

/* Makes cand fit the budget by recomputing the fewest leading layers of order (bisection:
 * the quality of a subset of the fetched layers, summed in layer order, never exceeds the
 * whole's, and recompute-all fits). No-op without a precision choice or when cand fits. */
static void s_repair(const s_ctx_t *c, int32_t *cand, const uint32_t *order)
{
    if (!c->np || s_quality(c, cand) <= c->limit)
        return;
    int32_t tmp[KVEDGE_PLAN_MAX_LAYERS];
    uint32_t k = c->first, n = c->layers - k, lo = 0, hi = n;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        memcpy(tmp + k, cand + k, n * sizeof *tmp);
        for (uint32_t i = 0; i < mid; i++)
            tmp[order[i]] = KVEDGE_PLAN_SRC_RECOMPUTE;
        if (s_quality(c, tmp) <= c->limit)
            hi = mid;
        else
            lo = mid;
    }
    for (uint32_t i = 0; i < hi; i++)
        cand[order[i]] = KVEDGE_PLAN_SRC_RECOMPUTE;
}

static kvedge_plan_reason_t s_reason(const s_ctx_t *c, int32_t a, uint32_t l, uint32_t m,
                                     int32_t near, int32_t far)
{
    unsigned holders = 0;
    for (size_t s = 0; s < c->nsrc; s++)
        holders += s_src_holds(c, s, l);
    if (a < 0)
        return holders ? KVEDGE_PLAN_RECOMPUTE_FASTER : KVEDGE_PLAN_RECOMPUTE_NO_SOURCE;
    if (holders == 1)
        return KVEDGE_PLAN_ONLY_SOURCE;
    int32_t s = s_src_of(c, a), sn = s_src_of(c, near), sf = s_src_of(c, far);
    if (s == sn && (l < m || sf == sn))
        return KVEDGE_PLAN_CHOSEN_NEAR;
    if (s == sf && l >= m)
        return KVEDGE_PLAN_CHOSEN_FAR;
    return KVEDGE_PLAN_REBALANCED;
}

/* One run of kvedge_plan_make's steps 1-3 over c's view. */
typedef struct {
    int32_t near[KVEDGE_PLAN_MAX_LAYERS], far[KVEDGE_PLAN_MAX_LAYERS];
    int32_t best[KVEDGE_PLAN_MAX_LAYERS]; /* the plan */
    uint32_t m;                           /* the best split */
    double t;                             /* T of best (see s_search) */
    double split_t, cloud_t, recompute_t; /* T of the best split, cloud-only, recompute-all */
    int32_t cloud_s;                      /* the cloud source behind cloud_t, or -1 */
} s_run_t;

/* The split search, the baselines and the greedy improvement over layers [c->first, L) of
 * c's view (no precision choice, or one fixed precision); candidates over the budget are
 * repaired in `order` (NULL without a precision choice). */
static void s_search(const s_ctx_t *c, const uint32_t *order, s_run_t *r)
{
    int32_t *near = r->near, *far = r->far, *best = r->best;
    int32_t cand[KVEDGE_PLAN_MAX_LAYERS];
    uint32_t k = c->first, L = c->layers;

    uint32_t nctx = c->ctx0; /* the context's progress under the near choices so far */
    for (uint32_t l = k; l < L; l++) {
        double nc, fc;
        near[l] = s_cheapest(c, l, false, &nc);
        uint32_t t = nctx;
        if (near[l] < 0 || s_recompute(c, l, &t) < nc) {
            near[l] = KVEDGE_PLAN_SRC_RECOMPUTE;
            nctx = t;
        }
        far[l] = s_cheapest(c, l, true, &fc);
        if (far[l] < 0)
            far[l] = near[l];
    }

    /* The split search (Eq. 20): near below m, far from m on. */
    double best_t = INFINITY;
    uint32_t m_best = k;
    for (uint32_t m = k; m <= L; m++) {
        for (uint32_t l = k; l < L; l++)
            cand[l] = l < m ? near[l] : far[l];
        s_repair(c, cand, order);
        double t = s_total(c, cand);
        if (m == k || t < best_t) {
            best_t = t;
            m_best = m;
            memcpy(best + k, cand + k, (L - k) * sizeof *cand);
        }
    }
    double split_t = best_t;

    /* The baselines, as candidates too: recompute-all and each source alone; base holds the
     * best of them. */
    int32_t base[KVEDGE_PLAN_MAX_LAYERS];
    for (uint32_t l = k; l < L; l++)
        base[l] = KVEDGE_PLAN_SRC_RECOMPUTE;
    double recompute_t = s_total(c, base), base_t = recompute_t;
    double cloud_t = recompute_t;
    int32_t cloud_s = -1;
    for (size_t s = 0; s < c->nsrc; s++) {
        if (!c->src[s].up || !s_is_net(&c->src[s]))
            continue;
        int32_t o = s_view_opt(c, s);
        for (uint32_t l = k; l < L; l++)
            cand[l] = s_holds(c, o, l) ? o : KVEDGE_PLAN_SRC_RECOMPUTE;
        s_repair(c, cand, order);
        double t = s_total(c, cand);
        if (c->src[s].kind == KVEDGE_PLAN_CLOUD && (cloud_s < 0 || t < cloud_t)) {
            cloud_t = t;
            cloud_s = (int32_t)s;
        }
        if (t < base_t) {
            base_t = t;
            memcpy(base + k, cand + k, (L - k) * sizeof *cand);
        }
    }

    /* Greedy improvement from the split and, when it starts lower, from the best baseline:
     * single moves get stuck in different places from different starts. Ties: the split. */
    best_t = c->prefix + s_improve(c, best, best_t - c->prefix);
    if (base_t < split_t) {
        base_t = c->prefix + s_improve(c, base, base_t - c->prefix);
        if (base_t < best_t) {
            best_t = base_t;
            memcpy(best + k, base + k, (L - k) * sizeof *base);
        }
    }
    r->m = m_best;
    r->t = best_t;
    r->split_t = split_t;
    r->cloud_t = cloud_t;
    r->recompute_t = recompute_t;
    r->cloud_s = cloud_s;
}

/* Step 2's second start (a multiple-choice knapsack greedy, as CacheGen allocates bits): from
 * a's layers at their sources' cheapest rungs in quality, move one fetched layer at a time to a
 * rung of its source with fewer bytes, taking the move that saves the most transfer time per unit
 * of quality it adds (a move that adds none first; ties: the lower layer, then the finer rung)
 * while a stays within the budget; a move that would not fit is dropped. At most
 * KVEDGE_PLAN_IMPROVE_STEPS of work, one step per move looked at. */
static void s_coarsen(const s_ctx_t *c, int32_t *a)
{
    uint8_t dropped[KVEDGE_PLAN_MAX_LAYERS] = {0}; /* bit p: the move to rung p did not fit */
    uint64_t steps = 0;
    /* The base: each fetched layer at its source's rung of least quality cost (ties: fewer
     * bytes, then the finer rung), so the budget is spent by the greedy, not by the start. */
    for (uint32_t l = c->first; l < c->layers; l++) {
        if (s_is_recompute(c, a[l]))
            continue;
        size_t s = (size_t)s_src_of(c, a[l]);
        int32_t best = a[l];
        for (uint32_t p = 0; p < c->np; p++) {
            int32_t o = s_opt(c, s, (int32_t)p);
            if (s_holds(c, o, l) &&
                (s_q(c, o, l) < s_q(c, best, l) ||
                 (s_q(c, o, l) == s_q(c, best, l) && s_bytes(c, o, l) < s_bytes(c, best, l))))
                best = o;
        }
        a[l] = best;
    }
    for (;;) {
        int32_t pick = -1;
        uint32_t pick_l = 0;
        double pick_key = -INFINITY;
        for (uint32_t l = c->first; l < c->layers; l++) {
            if (s_is_recompute(c, a[l]))
                continue;
            size_t s = (size_t)s_src_of(c, a[l]);
            double b = s_bytes(c, a[l], l), q = s_q(c, a[l], l);
            for (uint32_t p = 0; p < c->np; p++) {
                int32_t o = s_opt(c, s, (int32_t)p);
                if (++steps > KVEDGE_PLAN_IMPROVE_STEPS)
                    return;
                if ((dropped[l] >> p & 1u) || !s_holds(c, o, l) || !(s_bytes(c, o, l) < b))
                    continue;
                double dq = s_q(c, o, l) - q;
                double saved = s_time(c, a[l], l) - s_time(c, o, l);
                if (!(saved > 0))
                    continue; /* fewer bytes, but slower to decode than they save */
                double key = dq > 0 ? saved / dq : INFINITY;
                if (pick < 0 || key > pick_key) {
                    pick = o;
                    pick_l = l;
                    pick_key = key;
                }
            }
        }
        if (pick < 0)
            return;
        if (s_fits_with(c, a, pick_l, pick))
            a[pick_l] = pick;
        else
            dropped[pick_l] |= (uint8_t)(1u << (uint32_t)s_prec_of(c, pick));
    }
}

/* Precision reasons of the final plan (see kvedge_plan_make_prec), writing out->layer[l]
 * .prec_reason for the planned layers; t is done(L-1) of assign. */
static void s_prec_reasons(const s_ctx_t *c, int32_t *assign, double t, kvedge_plan_t *out)
{
    double acc[KVEDGE_PLAN_MAX_SOURCES], tmp[KVEDGE_PLAN_MAX_SOURCES], done = 0, arr;
    uint64_t steps = 0;
    uint32_t ctx = c->ctx0;
    int32_t nopt = s_nopt(c);
    s_acc_init(c, acc);
    for (uint32_t l = c->first; l < c->layers; l++) {
        int32_t cur = assign[l];
        kvedge_plan_prec_reason_t why = KVEDGE_PLAN_PREC_NONE;
        /* Options worth a look: any fetch for a recomputed layer, else coarser rungs of its
         * source. */
        int32_t lo = -1, hi = -1, p = s_prec_of(c, cur);
        size_t s = 0;
        unsigned served = 0, finer = 0;
        if (s_is_recompute(c, cur)) {
            lo = 0;
            hi = nopt;
        } else {
            s = (size_t)s_src_of(c, cur);
            for (uint32_t q = 0; q < c->np; q++)
                if (s_holds(c, s_opt(c, s, (int32_t)q), l)) {
                    served++;
                    finer += (int32_t)q < p;
                }
            if (served > 1) {
                lo = s_opt(c, s, p + 1);
                hi = s_opt(c, s, (int32_t)c->np);
            }
        }
        for (int32_t o = lo; o < hi && why == KVEDGE_PLAN_PREC_NONE; o++) {
            if (!s_holds(c, o, l))
                continue;
            steps += c->layers - l;
            if (steps > KVEDGE_PLAN_IMPROVE_STEPS)
                break;
            memcpy(tmp, acc, c->nsrc * sizeof *tmp);
            double v = s_tail(c, assign, l, done, tmp, ctx, l, o);
            if (v < t && !s_fits_with(c, assign, l, o))
                why = KVEDGE_PLAN_PREC_BUDGET;
        }
        if (!s_is_recompute(c, cur) && why == KVEDGE_PLAN_PREC_NONE)
            why = served == 1 ? KVEDGE_PLAN_PREC_ONLY
                  : finer     ? KVEDGE_PLAN_PREC_COARSER_FASTER
                              : KVEDGE_PLAN_PREC_FINEST;
        out->layer[l].prec_reason = why;
        done = s_step(c, cur, l, done, acc, &ctx, &arr);
    }
}

/* Plans layers [c->first, L) into out (inputs already checked); leaves out->layer below
 * c->first alone. */
static void s_make(const s_ctx_t *c, kvedge_plan_t *out)
{
    s_run_t win, run;
    int32_t fin[KVEDGE_PLAN_MAX_LAYERS];
    uint32_t k = c->first, L = c->layers;
    double total, cloud_t, fdone = 0;
    int32_t cloud_s;
    s_ctx_t ca = *c; /* every option */
    ca.fix = -1;

    for (uint32_t p = 0; p < KVEDGE_PLAN_MAX_PRECS; p++) {
        out->fixed_prec_us[p] = INFINITY;
        out->fixed_prec_quality[p] = 0;
        out->prec_rung[p] = c->np && c->prec->rungs && p < c->np ? c->prec->rungs[p] : 0;
    }
    if (!c->np) {
        s_search(c, NULL, &win);
        total = win.t;
        cloud_t = win.cloud_t;
        cloud_s = win.cloud_s;
        memcpy(fin + k, win.best + k, (L - k) * sizeof *fin);
    } else {
        /* Step 1: each precision alone; T exact (simulate's), so the steps compare exactly. */
        uint32_t order[KVEDGE_PLAN_MAX_LAYERS];
        int32_t alt[KVEDGE_PLAN_MAX_LAYERS];
        double done = INFINITY;
        cloud_t = INFINITY;
        cloud_s = -1;
        for (uint32_t p = 0; p < c->np; p++) {
            s_ctx_t cp = *c;
            cp.fix = (int32_t)p;
            s_repair_order(&cp, order);
            s_search(&cp, order, &run);
            run.t = cp.prefix + s_done(&cp, run.best);
            out->fixed_prec_us[p] = run.t;
            out->fixed_prec_quality[p] = s_quality(&cp, run.best);
            if (p == 0 || run.cloud_t < cloud_t) {
                cloud_t = run.cloud_t;
                cloud_s = run.cloud_s;
            }
            if (c->np > 1) {
                /* Step 2: every option, from this precision's plan; the lowest (ties: the
                 * lower p) is kept in fin. */
                memcpy(alt + k, run.best + k, (L - k) * sizeof *alt);
                double d = s_improve(&ca, alt, s_done(&ca, alt));
                if (p == 0 || d < done) {
                    done = d;
                    memcpy(fin + k, alt + k, (L - k) * sizeof *fin);
                }
            }
            if (p == 0 || run.t < win.t)
                win = run;
        }
        if (c->np > 1) {
            /* Step 2 from step 1's winner coarsened (ties: the plans above). */
            memcpy(alt + k, win.best + k, (L - k) * sizeof *alt);
            s_coarsen(&ca, alt);
            double d = s_improve(&ca, alt, s_done(&ca, alt));
            if (d < done) {
                done = d;
                memcpy(fin + k, alt + k, (L - k) * sizeof *fin);
            }
            /* Step 3: the quality T does not need back. */
            done = s_refine(&ca, fin, done);
        } else {
            memcpy(fin + k, win.best + k, (L - k) * sizeof *fin);
            done = s_done(&ca, fin);
        }
        fdone = done;
        total = ca.prefix + done;
    }

    out->layers = L;
    out->first_layer = k;
    out->split = win.m;
    out->cloud_source = cloud_s;
    out->total_us = total;
    out->bound_us = s_bound(&ca, fin);
    out->split_us = win.split_t;
    out->cloud_only_us = cloud_t;
    out->recompute_all_us = c->req->recompute_us ? win.recompute_t : INFINITY;
    out->load_then_compute_us = s_load_then_compute(&ca, fin);
    out->precs = c->np;
    out->quality_used = s_quality(&ca, fin);
    out->budget = c->np ? c->prec->budget : INFINITY;

    double acc[KVEDGE_PLAN_MAX_SOURCES], done = 0;
    uint32_t ctx = c->ctx0;
    s_acc_init(&ca, acc);
    for (uint32_t l = k; l < L; l++) {
        kvedge_plan_layer_t *p = &out->layer[l];
        p->source = s_src_of(&ca, fin[l]);
        p->reason = s_reason(&ca, fin[l], l, win.m, win.near[l], win.far[l]);
        p->cost_us = s_cost(&ca, fin[l], l);
        done = s_step(&ca, fin[l], l, done, acc, &ctx, &p->arrival_us);
        p->done_us = done;
        p->prec = s_prec_of(&ca, fin[l]);
        p->prec_reason = KVEDGE_PLAN_PREC_NONE;
        p->quality = s_q(&ca, fin[l], l);
    }
    if (c->np)
        s_prec_reasons(&ca, fin, fdone, out);
}

/* What kvedge_plan_cost and kvedge_plan_cost_prec share: the checks, and the costs that do not
 * depend on bytes. Returns true with *cost final (INFINITY for bad input or a down source,
 * recomputation for RECOMPUTE or a local source), else false with *net, the network source. */
static bool s_cost_fixed(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                         size_t nsrc, int32_t source, uint32_t layer, double *cost,
                         const kvedge_plan_source_t **net)
{
    *cost = INFINITY;
    if (!req || layer >= req->layers || layer >= KVEDGE_PLAN_MAX_LAYERS ||
        nsrc > KVEDGE_PLAN_MAX_SOURCES || (nsrc > 0 && !sources))
        return true;
    if (source != KVEDGE_PLAN_SRC_RECOMPUTE &&
        (source < 0 || (size_t)source >= nsrc || !sources[source].up))
        return true;
    if (source == KVEDGE_PLAN_SRC_RECOMPUTE || !s_is_net(&sources[source])) {
        *cost = req->recompute_us ? req->recompute_us[layer] : INFINITY;
        return true;
    }
    *net = &sources[source];
    return false;
}

double kvedge_plan_cost(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                        size_t nsrc, int32_t source, uint32_t layer)
{
    double cost;
    const kvedge_plan_source_t *s;
    if (s_cost_fixed(req, sources, nsrc, source, layer, &cost, &s))
        return cost;
    if (!s->layer_bytes || !(s->layer_bytes[layer] >= 0))
        return INFINITY;
    return s->rtt_us + s_xfer_us(s->layer_bytes[layer], s->bw_bytes_per_s);
}

double kvedge_plan_cost_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                             const kvedge_plan_source_t *sources, size_t nsrc, int32_t source,
                             int32_t prec_index, uint32_t layer)
{
    if (!prec)
        return kvedge_plan_cost(req, sources, nsrc, source, layer);
    if (prec->n < 1 || prec->n > KVEDGE_PLAN_MAX_PRECS)
        return INFINITY;
    double cost;
    const kvedge_plan_source_t *s;
    if (s_cost_fixed(req, sources, nsrc, source, layer, &cost, &s))
        return cost;
    const double *b = prec->layer_prec_bytes[source];
    if (prec_index < 0 || (uint32_t)prec_index >= prec->n || !b)
        return INFINITY;
    double bytes = b[(size_t)layer * prec->n + (uint32_t)prec_index];
    if (!(bytes >= 0))
        return INFINITY;
    double dec = prec->decode_us_per_byte ? prec->decode_us_per_byte[prec_index] : 0;
    return s->rtt_us + s_xfer_us(bytes, s->bw_bytes_per_s) + bytes * dec;
}

/* Checks the inputs of simulate / bound / quality and converts the assignment into opts. */
static int s_prepare(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                     const kvedge_plan_source_t *sources, size_t nsrc, const int32_t *assign,
                     const int32_t *prec_assign, s_ctx_t *c, int32_t *opts)
{
    if (s_check_all(req, prec, sources, nsrc) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    *c = s_ctx(req, prec, sources, nsrc, 0, req->prefix_us, 0);
    return s_opts(c, assign, prec_assign, opts);
}

int kvedge_plan_simulate_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                              const kvedge_plan_source_t *sources, size_t nsrc,
                              const int32_t *assign, const int32_t *prec_assign, double *total_us,
                              double *arrival_us, double *done_us)
{
    s_ctx_t c;
    int32_t opts[KVEDGE_PLAN_MAX_LAYERS];
    if (!total_us ||
        s_prepare(req, prec, sources, nsrc, assign, prec_assign, &c, opts) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    double acc[KVEDGE_PLAN_MAX_SOURCES], done = 0, arr;
    uint32_t ctx = 0;
    s_acc_init(&c, acc);
    for (uint32_t l = 0; l < c.layers; l++) {
        done = s_step(&c, opts[l], l, done, acc, &ctx, &arr);
        if (arrival_us)
            arrival_us[l] = arr;
        if (done_us)
            done_us[l] = done;
    }
    *total_us = c.prefix + done;
    return KVEDGE_OK;
}

int kvedge_plan_simulate(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                         size_t nsrc, const int32_t *assign, double *total_us, double *arrival_us,
                         double *done_us)
{
    return kvedge_plan_simulate_prec(req, NULL, sources, nsrc, assign, NULL, total_us, arrival_us,
                                     done_us);
}

int kvedge_plan_bound_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                           const kvedge_plan_source_t *sources, size_t nsrc, const int32_t *assign,
                           const int32_t *prec_assign, double *bound_us)
{
    s_ctx_t c;
    int32_t opts[KVEDGE_PLAN_MAX_LAYERS];
    if (!bound_us ||
        s_prepare(req, prec, sources, nsrc, assign, prec_assign, &c, opts) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    *bound_us = s_bound(&c, opts);
    return KVEDGE_OK;
}

int kvedge_plan_bound(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                      size_t nsrc, const int32_t *assign, double *bound_us)
{
    return kvedge_plan_bound_prec(req, NULL, sources, nsrc, assign, NULL, bound_us);
}

int kvedge_plan_quality(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                        const kvedge_plan_source_t *sources, size_t nsrc, const int32_t *assign,
                        const int32_t *prec_assign, double *quality)
{
    s_ctx_t c;
    int32_t opts[KVEDGE_PLAN_MAX_LAYERS];
    if (!quality || s_prepare(req, prec, sources, nsrc, assign, prec_assign, &c, opts) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    *quality = s_quality(&c, opts);
    return KVEDGE_OK;
}

int kvedge_plan_make_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                          const kvedge_plan_source_t *sources, size_t nsrc, kvedge_plan_t *out)
{
    if (!out || s_check_all(req, prec, sources, nsrc) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    s_ctx_t c = s_ctx(req, prec, sources, nsrc, 0, req->prefix_us, 0);
    s_make(&c, out);
    return KVEDGE_OK;
}

int kvedge_plan_make(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                     size_t nsrc, kvedge_plan_t *out)
{
    return kvedge_plan_make_prec(req, NULL, sources, nsrc, out);
}

int kvedge_plan_replan_prec(const kvedge_plan_request_t *req, const kvedge_plan_prec_t *prec,
                            const kvedge_plan_source_t *sources, size_t nsrc,
                            const kvedge_plan_t *prev, uint32_t first_layer_not_received,
                            int32_t failed, kvedge_plan_t *out)
{
    uint32_t k = first_layer_not_received;
    if (!out || !prev || s_check_all(req, prec, sources, nsrc) != KVEDGE_OK ||
        prev->layers != req->layers || k > req->layers ||
        (failed != KVEDGE_PLAN_SRC_NONE && (failed < 0 || (size_t)failed >= nsrc)))
        return KVEDGE_EINVAL;
    /* What the delivered layers already cost, in layer order (as s_quality sums). */
    double q0 = 0;
    for (uint32_t l = 0; l < k; l++) {
        if (prec && !s_finite_nonneg(prev->layer[l].quality))
            return KVEDGE_EINVAL;
        q0 += prev->layer[l].quality;
    }

    /* The failed source, down, in a private copy of the table. */
    kvedge_plan_source_t local[KVEDGE_PLAN_MAX_SOURCES];
    if (nsrc > 0)
        memcpy(local, sources, nsrc * sizeof *local);
    if (failed >= 0)
        local[failed].up = false;

    if (out != prev)
        memcpy(out->layer, prev->layer, k * sizeof *out->layer);
    for (uint32_t l = 0; l < k; l++) {
        out->layer[l].reason = KVEDGE_PLAN_DELIVERED;
        out->layer[l].arrival_us = 0;
        out->layer[l].done_us = 0;
    }
    if (k == req->layers) { /* nothing left to fetch */
        out->layers = req->layers;
        out->first_layer = k;
        out->split = k;
        out->cloud_source = -1;
        out->total_us = out->bound_us = out->split_us = 0;
        out->cloud_only_us = out->recompute_all_us = out->load_then_compute_us = 0;
        out->precs = prec ? prec->n : 0;
        out->quality_used = q0;
        out->budget = prec ? prec->budget : INFINITY;
        for (uint32_t p = 0; p < KVEDGE_PLAN_MAX_PRECS; p++) {
            bool in = p < out->precs;
            out->fixed_prec_us[p] = in ? 0 : INFINITY;
            out->fixed_prec_quality[p] = in ? q0 : 0;
            out->prec_rung[p] = in && prec->rungs ? prec->rungs[p] : 0;
        }
        return KVEDGE_OK;
    }
    /* The client has run the context through the leading layers it recomputed. */
    uint32_t ctx0 = 0;
    while (ctx0 < k && prev->layer[ctx0].source == KVEDGE_PLAN_SRC_RECOMPUTE)
        ctx0++;
    s_ctx_t c = s_ctx(req, prec, local, nsrc, k, 0, ctx0);
    c.q0 = q0;
    if (prec && c.limit < q0)
        c.limit = q0; /* the delivered layers alone exceed it: the rest adds nothing */
    s_make(&c, out);
    return KVEDGE_OK;
}

int kvedge_plan_replan(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                       size_t nsrc, const kvedge_plan_t *prev, uint32_t first_layer_not_received,
                       int32_t failed, kvedge_plan_t *out)
{
    return kvedge_plan_replan_prec(req, NULL, sources, nsrc, prev, first_layer_not_received, failed,
                                   out);
}

/* Appends to a buffer; remembers whether anything did not fit. */
typedef struct {
    char *buf;
    size_t len, pos;
    bool truncated;
} s_out_t;

__attribute__((format(printf, 2, 3))) static void s_put(s_out_t *o, const char *fmt, ...)
{
    if (o->truncated)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->pos, o->len - o->pos, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->len - o->pos) {
        o->truncated = true;
        o->pos = o->len - 1;
    } else {
        o->pos += (size_t)n;
    }
}

static const char *s_src_name(const kvedge_plan_source_t *sources, size_t nsrc, int32_t a)
{
    if (a == KVEDGE_PLAN_SRC_RECOMPUTE)
        return "(recompute)";
    if (a < 0 || (size_t)a >= nsrc)
        return "?";
    return sources[a].name;
}

static const char *s_src_kind(const kvedge_plan_source_t *sources, size_t nsrc, int32_t a)
{
    if (a == KVEDGE_PLAN_SRC_RECOMPUTE)
        return kvedge_plan_kind_name(KVEDGE_PLAN_RECOMPUTE);
    if (a < 0 || (size_t)a >= nsrc)
        return "?";
    return kvedge_plan_kind_name(sources[a].kind);
}

/* The name of precision p of a plan: its rung's, or "p<index>" without one. */
static const char *s_prec_name(const kvedge_plan_t *plan, int32_t p, char *tmp, size_t len)
{
    if (p < 0)
        return "-";
    if (p < KVEDGE_PLAN_MAX_PRECS && plan->prec_rung[p] != KVEDGE_PREC_STORED)
        return kvedge_prec_name(plan->prec_rung[p]);
    snprintf(tmp, len, "p%d", (int)p);
    return tmp;
}

const char *kvedge_plan_ms_text(double us, int decimals, char *buf, size_t len)
{
    if (!buf || len == 0)
        return "";
    if (!isfinite(us) || us >= KVEDGE_PLAN_UNPRICED_US)
        snprintf(buf, len, "unpriced");
    else
        snprintf(buf, len, "%.*f ms", decimals < 0 ? 0 : decimals > 6 ? 6 : decimals, us / 1e3);
    return buf;
}

/* A time in ms with 3 decimals (and the unit when unit), or "-" ("unpriced" with unit) for
 * one that is not a price (recomputation the request did not allow): never a sentinel. */
static const char *s_ms(double us, bool unit, char *tmp, size_t len)
{
    if (unit)
        return kvedge_plan_ms_text(us, 3, tmp, len);
    if (!isfinite(us) || us >= KVEDGE_PLAN_UNPRICED_US)
        return "-";
    snprintf(tmp, len, "%.3f", us / 1e3);
    return tmp;
}

int kvedge_plan_format(const kvedge_plan_t *plan, const kvedge_plan_source_t *sources, size_t nsrc,
                       char *buf, size_t len)
{
    if (!plan || !buf || len == 0 || (nsrc > 0 && !sources))
        return KVEDGE_EINVAL;
    s_out_t o = {buf, len, 0, false};
    buf[0] = '\0';
    uint32_t L = plan->layers < KVEDGE_PLAN_MAX_LAYERS ? plan->layers : KVEDGE_PLAN_MAX_LAYERS;
    bool prec = plan->precs > 0;
    char tmp[16], t1[32], t2[32], t3[32];
    if (plan->first_layer > 0)
        s_put(&o, "re-plan from layer %u: times are from now\n", (unsigned)plan->first_layer);
    if (prec)
        s_put(&o, "%5s  %-20s %-9s %10s %10s %10s  %-19s %4s %-18s %s\n", "layer", "source", "kind",
              "cost_ms", "arrive_ms", "done_ms", "reason", "prec", "rung", "prec_reason");
    else
        s_put(&o, "%5s  %-20s %-9s %10s %10s %10s  %s\n", "layer", "source", "kind", "cost_ms",
              "arrive_ms", "done_ms", "reason");
    for (uint32_t l = 0; l < L; l++) {
        const kvedge_plan_layer_t *p = &plan->layer[l];
        const char *cost = s_ms(p->cost_us, false, t1, sizeof t1),
                   *arrive = s_ms(p->arrival_us, false, t2, sizeof t2),
                   *done = s_ms(p->done_us, false, t3, sizeof t3);
        if (prec)
            s_put(&o, "%5u  %-20.63s %-9s %10s %10s %10s  %-19s %4d %-18s %s\n", (unsigned)l,
                  s_src_name(sources, nsrc, p->source), s_src_kind(sources, nsrc, p->source), cost,
                  arrive, done, kvedge_plan_reason_name(p->reason), (int)p->prec,
                  s_prec_name(plan, p->prec, tmp, sizeof tmp),
                  kvedge_plan_prec_reason_name(p->prec_reason));
        else
            s_put(&o, "%5u  %-20.63s %-9s %10s %10s %10s  %s\n", (unsigned)l,
                  s_src_name(sources, nsrc, p->source), s_src_kind(sources, nsrc, p->source), cost,
                  arrive, done, kvedge_plan_reason_name(p->reason));
    }
    char t4[32];
    s_put(&o, "T %s  bound %s  split m=%u (%s before improvement)\n",
          s_ms(plan->total_us, true, t1, sizeof t1), s_ms(plan->bound_us, true, t2, sizeof t2),
          (unsigned)plan->split, s_ms(plan->split_us, true, t3, sizeof t3));
    s_put(&o, "cloud-only %s (%.63s)  recompute-all %s  load-then-compute %s\n",
          s_ms(plan->cloud_only_us, true, t1, sizeof t1),
          plan->cloud_source >= 0 ? s_src_name(sources, nsrc, plan->cloud_source) : "no cloud",
          s_ms(plan->recompute_all_us, true, t2, sizeof t2),
          s_ms(plan->load_then_compute_us, true, t4, sizeof t4));
    if (prec) {
        s_put(&o, "quality %.6g of budget %.6g\n", plan->quality_used, plan->budget);
        s_put(&o, "fixed precision:");
        for (uint32_t p = 0; p < plan->precs && p < KVEDGE_PLAN_MAX_PRECS; p++)
            s_put(&o, " %s %s (quality %.6g)%s", s_prec_name(plan, (int32_t)p, tmp, sizeof tmp),
                  s_ms(plan->fixed_prec_us[p], true, t1, sizeof t1), plan->fixed_prec_quality[p],
                  p + 1 < plan->precs ? "," : "");
        s_put(&o, "\n");
    }
    return o.truncated ? KVEDGE_ENOSPACE : KVEDGE_OK;
}
