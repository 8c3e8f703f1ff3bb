/* Path planner: Eq. 19 prices, the pipelined timeline, the Eq. 20 bound, the split search
 * with greedy improvement, re-planning and the table formatter (see plan.h for the model). */
#include "proxy/plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "store/error.h"

/* What one computation reads: the request, the sources, and the layers it covers. */
typedef struct {
    const kvedge_plan_request_t *req;
    const kvedge_plan_source_t *src;
    size_t nsrc;
    uint32_t first;  /* first layer planned (0, or k for a replan) */
    uint32_t layers; /* L */
    double prefix;   /* prefix_us, or 0 for a replan */
    uint32_t ctx0;   /* layers the context has been run through at `first` (recomputation) */
} s_ctx_t;

static bool s_finite_nonneg(double x)
{
    return isfinite(x) && x >= 0;
}

static bool s_is_net(const kvedge_plan_source_t *s)
{
    return s->kind != KVEDGE_PLAN_RECOMPUTE;
}

/* An up network source that holds layer l. */
static bool s_holds(const s_ctx_t *c, size_t s, uint32_t l)
{
    const kvedge_plan_source_t *p = &c->src[s];
    return p->up && s_is_net(p) && p->layer_bytes[l] >= 0;
}

/* Transfer time in microseconds of bytes over bw bytes/s. */
static double s_xfer_us(double bytes, double bw)
{
    return bytes * 1e6 / bw;
}

/* Whether assignment value a means "recompute" (the sentinel or a RECOMPUTE-kind source). */
static bool s_is_recompute(const s_ctx_t *c, int32_t a)
{
    return a < 0 || !s_is_net(&c->src[a]);
}

static int s_check_sources(const kvedge_plan_source_t *sources, size_t nsrc, uint32_t layers)
{
    if (nsrc > KVEDGE_PLAN_MAX_SOURCES || (nsrc > 0 && !sources))
        return KVEDGE_EINVAL;
    for (size_t i = 0; i < nsrc; i++) {
        const kvedge_plan_source_t *s = &sources[i];
        if ((unsigned)s->kind > KVEDGE_PLAN_RECOMPUTE || !memchr(s->name, '\0', sizeof s->name))
            return KVEDGE_EINVAL;
        if (!s->up || !s_is_net(s))
            continue; /* never priced, so never read */
        if (!s_finite_nonneg(s->rtt_us) || !isfinite(s->bw_bytes_per_s) ||
            !(s->bw_bytes_per_s > 0) || !s->layer_bytes)
            return KVEDGE_EINVAL;
        for (uint32_t l = 0; l < layers; l++)
            if (!isfinite(s->layer_bytes[l]))
                return KVEDGE_EINVAL;
    }
    return KVEDGE_OK;
}

static int s_check(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                   size_t nsrc)
{
    if (!req || req->layers < 1 || req->layers > KVEDGE_PLAN_MAX_LAYERS ||
        !s_finite_nonneg(req->prefix_us) || !req->compute_us || !req->recompute_us)
        return KVEDGE_EINVAL;
    for (uint32_t l = 0; l < req->layers; l++)
        if (!s_finite_nonneg(req->compute_us[l]) || !s_finite_nonneg(req->recompute_us[l]))
            return KVEDGE_EINVAL;
    return s_check_sources(sources, nsrc, req->layers);
}

/* Every layer's source is the sentinel or an in-range, up source that can serve it. */
static int s_check_assign(const s_ctx_t *c, const int32_t *assign)
{
    if (!assign)
        return KVEDGE_EINVAL;
    for (uint32_t l = c->first; l < c->layers; l++) {
        int32_t a = assign[l];
        if (a == KVEDGE_PLAN_SRC_RECOMPUTE)
            continue;
        if (a < 0 || (size_t)a >= c->nsrc || !c->src[a].up)
            return KVEDGE_EINVAL;
        if (s_is_net(&c->src[a]) && !s_holds(c, (size_t)a, l))
            return KVEDGE_EINVAL;
    }
    return KVEDGE_OK;
}

static s_ctx_t s_ctx(const kvedge_plan_request_t *req, const kvedge_plan_source_t *src, size_t nsrc,
                     uint32_t first, double prefix, uint32_t ctx0)
{
    s_ctx_t c = {req, src, nsrc, first, req->layers, prefix, ctx0};
    return c;
}

/* Decoder time to compute layer l's context KV when the context has been run through layers
 * [0, *ctx): the client runs the context's hidden state lazily, so it pays every layer from
 * *ctx to l (decoder.h); advances *ctx past l. */
static double s_recompute(const s_ctx_t *c, uint32_t l, uint32_t *ctx)
{
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

/* One decoder step: layer l from source a after the decoder finished at `done`; advances a's
 * stream in acc and, for a recomputed layer, the context in *ctx. Returns done(l); *arrival
 * gets A(l). */
static double s_step(const s_ctx_t *c, int32_t a, uint32_t l, double done, double *acc,
                     uint32_t *ctx, double *arrival)
{
    double arr = 0, work = c->req->compute_us[l];
    if (s_is_recompute(c, a)) {
        work += s_recompute(c, l, ctx);
    } else {
        acc[a] += s_xfer_us(c->src[a].layer_bytes[l], c->src[a].bw_bytes_per_s);
        arr = acc[a];
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

/* T of an assignment (prefix included). */
static double s_total(const s_ctx_t *c, const int32_t *assign)
{
    double acc[KVEDGE_PLAN_MAX_SOURCES];
    s_acc_init(c, acc);
    return c->prefix + s_tail(c, assign, c->first, 0, acc, c->ctx0, UINT32_MAX, 0);
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
            used[a] = true;
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
        return c->req->recompute_us[l];
    const kvedge_plan_source_t *p = &c->src[a];
    return p->rtt_us + s_xfer_us(p->layer_bytes[l], p->bw_bytes_per_s);
}

/* The cheapest up source holding l among the cloud (cloud) or the near kinds (!cloud);
 * ties: fewer bytes, then the lower index. -1 when none. */
static int32_t s_cheapest(const s_ctx_t *c, uint32_t l, bool cloud, double *cost)
{
    int32_t best = -1;
    double bc = INFINITY, bb = INFINITY;
    for (size_t s = 0; s < c->nsrc; s++) {
        if (!s_holds(c, s, l) || (c->src[s].kind == KVEDGE_PLAN_CLOUD) != cloud)
            continue;
        double k = s_cost(c, (int32_t)s, l), b = c->src[s].layer_bytes[l];
        if (best < 0 || k < bc || (k == bc && b < bb)) {
            best = (int32_t)s;
            bc = k;
            bb = b;
        }
    }
    *cost = bc;
    return best;
}

/* Greedy passes over the layers: move one layer at a time to the option that lowers T the
 * most, when any does. t is done(L-1) of assign; returns the new one. */
static double s_improve(const s_ctx_t *c, int32_t *assign, double t)
{
    double acc[KVEDGE_PLAN_MAX_SOURCES], tmp[KVEDGE_PLAN_MAX_SOURCES];
    uint64_t steps = 0;
    for (int pass = 0; pass < KVEDGE_PLAN_IMPROVE_PASSES; pass++) {
        bool changed = false;
        double done = 0, arr;
        uint32_t ctx = c->ctx0;
        s_acc_init(c, acc);
        for (uint32_t l = c->first; l < c->layers; l++) {
            int32_t cur = assign[l], pick = cur;
            double pick_t = t;
            for (int32_t o = -1; o < (int32_t)c->nsrc; o++) {
                if (o == cur || (o >= 0 && !s_holds(c, (size_t)o, l)))
                    continue;
                steps += c->layers - l;
                if (steps > KVEDGE_PLAN_IMPROVE_STEPS)
                    return t;
                memcpy(tmp, acc, c->nsrc * sizeof *tmp);
                double v = s_tail(c, assign, l, done, tmp, ctx, l, o);
                if (v < pick_t) {
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

static kvedge_plan_reason_t s_reason(const s_ctx_t *c, int32_t a, uint32_t l, uint32_t m,
                                     int32_t near, int32_t far)
{
    unsigned holders = 0;
    for (size_t s = 0; s < c->nsrc; s++)
        holders += s_holds(c, s, l);
    if (a < 0)
        return holders ? KVEDGE_PLAN_RECOMPUTE_FASTER : KVEDGE_PLAN_RECOMPUTE_NO_SOURCE;
    if (holders == 1)
        return KVEDGE_PLAN_ONLY_SOURCE;
    if (a == near && (l < m || far == near))
        return KVEDGE_PLAN_CHOSEN_NEAR;
    if (a == far && l >= m)
        return KVEDGE_PLAN_CHOSEN_FAR;
    return KVEDGE_PLAN_REBALANCED;
}

/* Plans layers [c->first, L) into out (inputs already checked); leaves out->layer below
 * c->first alone. */
static void s_make(const s_ctx_t *c, kvedge_plan_t *out)
{
    int32_t near[KVEDGE_PLAN_MAX_LAYERS], far[KVEDGE_PLAN_MAX_LAYERS];
    int32_t cand[KVEDGE_PLAN_MAX_LAYERS], best[KVEDGE_PLAN_MAX_LAYERS];
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
        for (uint32_t l = k; l < L; l++)
            cand[l] = s_holds(c, s, l) ? (int32_t)s : KVEDGE_PLAN_SRC_RECOMPUTE;
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

    out->layers = L;
    out->first_layer = k;
    out->split = m_best;
    out->cloud_source = cloud_s;
    out->total_us = best_t;
    out->bound_us = s_bound(c, best);
    out->split_us = split_t;
    out->cloud_only_us = cloud_t;
    out->recompute_all_us = recompute_t;
    out->load_then_compute_us = s_load_then_compute(c, best);

    double acc[KVEDGE_PLAN_MAX_SOURCES], done = 0;
    uint32_t ctx = c->ctx0;
    s_acc_init(c, acc);
    for (uint32_t l = k; l < L; l++) {
        kvedge_plan_layer_t *p = &out->layer[l];
        p->source = best[l];
        p->reason = s_reason(c, best[l], l, m_best, near[l], far[l]);
        p->cost_us = s_cost(c, best[l], l);
        done = s_step(c, best[l], l, done, acc, &ctx, &p->arrival_us);
        p->done_us = done;
    }
}

double kvedge_plan_cost(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                        size_t nsrc, int32_t source, uint32_t layer)
{
    if (!req || !req->recompute_us || layer >= req->layers || layer >= KVEDGE_PLAN_MAX_LAYERS ||
        nsrc > KVEDGE_PLAN_MAX_SOURCES || (nsrc > 0 && !sources))
        return INFINITY;
    if (source == KVEDGE_PLAN_SRC_RECOMPUTE)
        return req->recompute_us[layer];
    if (source < 0 || (size_t)source >= nsrc || !sources[source].up)
        return INFINITY;
    const kvedge_plan_source_t *s = &sources[source];
    if (!s_is_net(s))
        return req->recompute_us[layer];
    if (!s->layer_bytes || !(s->layer_bytes[layer] >= 0))
        return INFINITY;
    return s->rtt_us + s_xfer_us(s->layer_bytes[layer], s->bw_bytes_per_s);
}

int kvedge_plan_simulate(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                         size_t nsrc, const int32_t *assign, double *total_us, double *arrival_us,
                         double *done_us)
{
    int rc = s_check(req, sources, nsrc);
    if (rc != KVEDGE_OK || !total_us)
        return KVEDGE_EINVAL;
    s_ctx_t c = s_ctx(req, sources, nsrc, 0, req->prefix_us, 0);
    if (s_check_assign(&c, assign) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    double acc[KVEDGE_PLAN_MAX_SOURCES], done = 0, arr;
    uint32_t ctx = 0;
    s_acc_init(&c, acc);
    for (uint32_t l = 0; l < c.layers; l++) {
        done = s_step(&c, assign[l], l, done, acc, &ctx, &arr);
        if (arrival_us)
            arrival_us[l] = arr;
        if (done_us)
            done_us[l] = done;
    }
    *total_us = c.prefix + done;
    return KVEDGE_OK;
}

int kvedge_plan_bound(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                      size_t nsrc, const int32_t *assign, double *bound_us)
{
    int rc = s_check(req, sources, nsrc);
    if (rc != KVEDGE_OK || !bound_us)
        return KVEDGE_EINVAL;
    s_ctx_t c = s_ctx(req, sources, nsrc, 0, req->prefix_us, 0);
    if (s_check_assign(&c, assign) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    *bound_us = s_bound(&c, assign);
    return KVEDGE_OK;
}

int kvedge_plan_make(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                     size_t nsrc, kvedge_plan_t *out)
{
    if (!out || s_check(req, sources, nsrc) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    s_ctx_t c = s_ctx(req, sources, nsrc, 0, req->prefix_us, 0);
    s_make(&c, out);
    return KVEDGE_OK;
}

int kvedge_plan_replan(const kvedge_plan_request_t *req, const kvedge_plan_source_t *sources,
                       size_t nsrc, const kvedge_plan_t *prev, uint32_t first_layer_not_received,
                       int32_t failed, kvedge_plan_t *out)
{
    uint32_t k = first_layer_not_received;
    if (!out || !prev || s_check(req, sources, nsrc) != KVEDGE_OK || prev->layers != req->layers ||
        k > req->layers ||
        (failed != KVEDGE_PLAN_SRC_NONE && (failed < 0 || (size_t)failed >= nsrc)))
        return KVEDGE_EINVAL;

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
        return KVEDGE_OK;
    }
    /* The client has run the context through the leading layers it recomputed. */
    uint32_t ctx0 = 0;
    while (ctx0 < k && prev->layer[ctx0].source == KVEDGE_PLAN_SRC_RECOMPUTE)
        ctx0++;
    s_ctx_t c = s_ctx(req, local, nsrc, k, 0, ctx0);
    s_make(&c, out);
    return KVEDGE_OK;
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

int kvedge_plan_format(const kvedge_plan_t *plan, const kvedge_plan_source_t *sources, size_t nsrc,
                       char *buf, size_t len)
{
    if (!plan || !buf || len == 0 || (nsrc > 0 && !sources))
        return KVEDGE_EINVAL;
    s_out_t o = {buf, len, 0, false};
    buf[0] = '\0';
    uint32_t L = plan->layers < KVEDGE_PLAN_MAX_LAYERS ? plan->layers : KVEDGE_PLAN_MAX_LAYERS;
    if (plan->first_layer > 0)
        s_put(&o, "re-plan from layer %u: times are from now\n", (unsigned)plan->first_layer);
    s_put(&o, "%5s  %-20s %-9s %10s %10s %10s  %s\n", "layer", "source", "kind", "cost_ms",
          "arrive_ms", "done_ms", "reason");
    for (uint32_t l = 0; l < L; l++) {
        const kvedge_plan_layer_t *p = &plan->layer[l];
        s_put(&o, "%5u  %-20.63s %-9s %10.3f %10.3f %10.3f  %s\n", (unsigned)l,
              s_src_name(sources, nsrc, p->source), s_src_kind(sources, nsrc, p->source),
              p->cost_us / 1e3, p->arrival_us / 1e3, p->done_us / 1e3,
              kvedge_plan_reason_name(p->reason));
    }
    s_put(&o, "T %.3f ms  bound %.3f ms  split m=%u (%.3f ms before improvement)\n",
          plan->total_us / 1e3, plan->bound_us / 1e3, (unsigned)plan->split, plan->split_us / 1e3);
    s_put(&o, "cloud-only %.3f ms (%.63s)  recompute-all %.3f ms  load-then-compute %.3f ms\n",
          plan->cloud_only_us / 1e3,
          plan->cloud_source >= 0 ? s_src_name(sources, nsrc, plan->cloud_source) : "no cloud",
          plan->recompute_all_us / 1e3, plan->load_then_compute_us / 1e3);
    return o.truncated ? KVEDGE_ENOSPACE : KVEDGE_OK;
}
