/* Adapting a cloud model's K/V to an edge model's shape (clients/e2e/adapter.h): collection of
 * both models' K, V and the cloud's queries through the decoder's trace hook, the linear and
 * the head-matching fits, the apply path (gpu/adapt.h), the safetensors file. */
#include <cblas.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clients/e2e/adapter.h"
#include "clients/decoder/safetensors.h"
#include "gpu/adapt.h"
#include "gpu/cka.h"
#include "access/codec/error.h"

#define S_FORMAT  "kvedge-adapter"
#define S_VERSION 1
/* The rotary settings are two optional metadata fields, cloud_rope and edge_rope, written when
 * either model is rotary: a file without them (every OPT adapter's, written as it always was)
 * means learned positions. */
/* Room for a rotary setting as the file writes it (s_fmt_rope). */
#define S_ROPE_BYTES 256
/* Most calibration positions a file may name (far above what a fit can hold in memory). */
#define S_SAMPLES_MAX (1u << 24)

struct kvedge_adapter_t {
    kvedge_adapter_info_t info;
    int32_t *from; /* [edge_layers]: the cloud layer, or KVEDGE_LAYERMAP_NONE */
    float **w;     /* [2 * edge_layers]: K then V of each layer, [din + 1][dout], or NULL */
};

static void s_why(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void s_fmt_double(double x, char *out, size_t len);
static void s_why(char *why, size_t why_len, const char *fmt, ...)
{
    if (!why || why_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

const char *kvedge_adapt_kind_name(kvedge_adapt_kind_t kind)
{
    return kind == KVEDGE_ADAPT_LINEAR ? "linear" : kind == KVEDGE_ADAPT_HEADS ? "heads" : "?";
}

const char *kvedge_adapter_fit_name(const kvedge_adapter_info_t *info)
{
    if (!info)
        return "?";
    if (info->kind == KVEDGE_ADAPT_HEADS)
        return "heads";
    if (info->kind != KVEDGE_ADAPT_LINEAR)
        return "?";
    if (!info->fit[0])
        return "least-squares";
    return strncmp(info->fit, "distilled", 9) == 0 ? "distilled" : "linear";
}

int kvedge_adapt_kind_parse(const char *name, kvedge_adapt_kind_t *out)
{
    if (!name || !out)
        return KVEDGE_EINVAL;
    if (strcmp(name, "linear") == 0)
        *out = KVEDGE_ADAPT_LINEAR;
    else if (strcmp(name, "heads") == 0)
        *out = KVEDGE_ADAPT_HEADS;
    else
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

static size_t s_din(const kvedge_adapter_info_t *i)
{
    return (size_t)i->cloud_heads * i->cloud_head_dim;
}

static size_t s_dout(const kvedge_adapter_info_t *i)
{
    return (size_t)i->edge_heads * i->edge_head_dim;
}

void kvedge_adapter_destroy(kvedge_adapter_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_adapter_t *a = *self_p;
    if (a->w)
        for (uint32_t i = 0; i < 2 * a->info.edge_layers; i++)
            free(a->w[i]);
    free(a->w);
    free(a->from);
    free(a);
    *self_p = NULL;
}

/* An adapter with info, from and zeroed weights for every mapped layer. */
static kvedge_adapter_t *s_new(const kvedge_adapter_info_t *info, const int32_t *from)
{
    kvedge_adapter_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->info = *info;
    a->from = calloc(info->edge_layers, sizeof *a->from);
    a->w = calloc(2 * (size_t)info->edge_layers, sizeof *a->w);
    bool ok = a->from && a->w;
    const size_t floats = (s_din(info) + 1) * s_dout(info);
    for (uint32_t e = 0; ok && e < info->edge_layers; e++) {
        a->from[e] = from[e];
        if (from[e] == KVEDGE_LAYERMAP_NONE)
            continue;
        a->w[2 * e] = calloc(floats, sizeof(float));
        a->w[2 * e + 1] = calloc(floats, sizeof(float));
        ok = a->w[2 * e] && a->w[2 * e + 1];
    }
    if (!ok)
        kvedge_adapter_destroy(&a);
    return a;
}

const kvedge_adapter_info_t *kvedge_adapter_info(const kvedge_adapter_t *a)
{
    return a ? &a->info : NULL;
}

int32_t kvedge_adapter_from(const kvedge_adapter_t *a, uint32_t edge_layer)
{
    if (!a || edge_layer >= a->info.edge_layers)
        return KVEDGE_LAYERMAP_NONE;
    return a->from[edge_layer];
}

const float *kvedge_adapter_weights(const kvedge_adapter_t *a, uint32_t edge_layer, bool v)
{
    if (kvedge_adapter_from(a, edge_layer) == KVEDGE_LAYERMAP_NONE)
        return NULL;
    return a->w[2 * edge_layer + (v ? 1 : 0)];
}

/* ---------------------------------------------------------------------------------------- */
/* Validation (the loader's and kvedge_adapter_make's)                                       */

/* The header fields; 0 or KVEDGE_ECORRUPT with why. */
static int s_check_info(const kvedge_adapter_info_t *i, char *why, size_t why_len)
{
    if (i->kind != KVEDGE_ADAPT_LINEAR && i->kind != KVEDGE_ADAPT_HEADS) {
        s_why(why, why_len, "kind must be linear or heads");
        return KVEDGE_ECORRUPT;
    }
    int rc = kvedge_layermap_pair_check(i->cloud_id, i->edge_id, i->cloud_layers, i->edge_layers,
                                        why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    if (i->cloud_heads == 0 || i->cloud_heads > KVEDGE_ADAPT_HEADS_MAX || i->edge_heads == 0 ||
        i->edge_heads > KVEDGE_ADAPT_HEADS_MAX || i->cloud_head_dim == 0 ||
        i->cloud_head_dim > KVEDGE_ADAPT_HEAD_DIM_MAX || i->edge_head_dim == 0 ||
        i->edge_head_dim > KVEDGE_ADAPT_HEAD_DIM_MAX || s_din(i) > KVEDGE_ADAPT_WIDTH_MAX ||
        s_dout(i) > KVEDGE_ADAPT_WIDTH_MAX) {
        s_why(why, why_len,
              "KV heads must be 1..%u, head_dim 1..%u, KV heads x head_dim at most %u",
              KVEDGE_ADAPT_HEADS_MAX, KVEDGE_ADAPT_HEAD_DIM_MAX, KVEDGE_ADAPT_WIDTH_MAX);
        return KVEDGE_ECORRUPT;
    }
    if (i->samples < 2 || i->samples > S_SAMPLES_MAX) {
        s_why(why, why_len, "samples must be 2..%u", S_SAMPLES_MAX);
        return KVEDGE_ECORRUPT;
    }
    if (!(i->ridge >= 0 && isfinite(i->ridge)) || (i->kind == KVEDGE_ADAPT_HEADS && i->ridge)) {
        s_why(why, why_len, "ridge must be finite and >= 0 (0 for heads)");
        return KVEDGE_ECORRUPT;
    }
    const size_t fit_len = strnlen(i->fit, sizeof i->fit);
    bool fit_ok = fit_len < sizeof i->fit;
    for (size_t k = 0; fit_ok && k < fit_len; k++)
        fit_ok = i->fit[k] >= 0x20 && i->fit[k] <= 0x7e;
    if (!fit_ok) {
        s_why(why, why_len, "fit must be at most %u bytes of printable ASCII",
              KVEDGE_ADAPT_FIT_MAX_BYTES);
        return KVEDGE_ECORRUPT;
    }
    const kvedge_decoder_rope_t *rope[2] = {&i->cloud_rope, &i->edge_rope};
    const uint32_t hd[2] = {i->cloud_head_dim, i->edge_head_dim};
    for (int k = 0; k < 2; k++)
        if (kvedge_decoder_rope_check(rope[k]) != KVEDGE_OK ||
            (rope[k]->rotary && hd[k] % 2 != 0)) {
            s_why(why, why_len,
                  "%s rotary settings out of range (theta 1..1e12, llama3 scaling with 0 < "
                  "low_freq_factor < high_freq_factor, an even head_dim)",
                  k ? "edge" : "cloud");
            return KVEDGE_ECORRUPT;
        }
    return KVEDGE_OK;
}

/* One layer's weights: finite; for heads a selection (0/1, bias 0, at most one 1 per output
 * column). 0 or KVEDGE_ECORRUPT with why. */
static int s_check_weights(const kvedge_adapter_info_t *i, uint32_t e, bool v, const float *w,
                           char *why, size_t why_len)
{
    const size_t din = s_din(i), dout = s_dout(i);
    const char *t = v ? "v" : "k";
    for (size_t r = 0; r <= din; r++)
        for (size_t c = 0; c < dout; c++) {
            const float x = w[r * dout + c];
            if (!isfinite(x)) {
                s_why(why, why_len, "%s.%u: a weight is not finite (row %zu, column %zu)", t, e, r,
                      c);
                return KVEDGE_ECORRUPT;
            }
            if (i->kind == KVEDGE_ADAPT_HEADS && x != 0.0f && (x != 1.0f || r == din)) {
                s_why(why, why_len,
                      "%s.%u: a heads adapter is a 0/1 selection with a zero bias (row %zu, "
                      "column %zu is %g)",
                      t, e, r, c, (double)x);
                return KVEDGE_ECORRUPT;
            }
        }
    if (i->kind == KVEDGE_ADAPT_HEADS)
        for (size_t c = 0; c < dout; c++) {
            unsigned ones = 0;
            for (size_t r = 0; r < din; r++)
                ones += w[r * dout + c] == 1.0f;
            if (ones > 1) {
                s_why(why, why_len, "%s.%u: output column %zu selects %u inputs", t, e, c, ones);
                return KVEDGE_ECORRUPT;
            }
        }
    return KVEDGE_OK;
}

static int s_check_from(const kvedge_adapter_info_t *i, const int32_t *from, char *why,
                        size_t why_len)
{
    for (uint32_t e = 0; e < i->edge_layers; e++)
        if (from[e] != KVEDGE_LAYERMAP_NONE &&
            (from[e] < 0 || (uint32_t)from[e] >= i->cloud_layers)) {
            s_why(why, why_len, "edge layer %u: cloud layer %d out of range 0..%u", e, from[e],
                  i->cloud_layers - 1);
            return KVEDGE_ECORRUPT;
        }
    return KVEDGE_OK;
}

int kvedge_adapter_make(const kvedge_adapter_info_t *info, const int32_t *from,
                        const float *const *w, kvedge_adapter_t **out, char *why, size_t why_len)
{
    if (out)
        *out = NULL;
    if (!info || !from || !w || !out)
        return KVEDGE_EINVAL;
    int rc = s_check_info(info, why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_check_from(info, from, why, why_len);
    for (uint32_t e = 0; rc == KVEDGE_OK && e < info->edge_layers; e++) {
        if (from[e] == KVEDGE_LAYERMAP_NONE)
            continue;
        if (!w[2 * e] || !w[2 * e + 1])
            return KVEDGE_EINVAL;
        rc = s_check_weights(info, e, false, w[2 * e], why, why_len);
        if (rc == KVEDGE_OK)
            rc = s_check_weights(info, e, true, w[2 * e + 1], why, why_len);
    }
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_adapter_t *a = s_new(info, from);
    if (!a)
        return KVEDGE_ENOMEM;
    const size_t bytes = (s_din(info) + 1) * s_dout(info) * sizeof(float);
    for (uint32_t e = 0; e < info->edge_layers; e++)
        if (from[e] != KVEDGE_LAYERMAP_NONE) {
            memcpy(a->w[2 * e], w[2 * e], bytes);
            memcpy(a->w[2 * e + 1], w[2 * e + 1], bytes);
        }
    *out = a;
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Collection                                                                                */

/* What a traced prefill keeps: for every layer with a slot, its K and V, each
 * [kv_heads][samples][head_dim], and Q when q is set, [q_heads][samples][head_dim], the
 * window's rows at row0; K and Q un-rotated with rope when it is set (a window's tokens are at
 * positions 0..n-1: each window is a prefill of its own). */
typedef struct {
    uint32_t kv_heads, q_heads, head_dim, samples, row0;
    const kvedge_decoder_rope_t *rope; /* NULL: keep K and Q as the model stores them */
    const int32_t *slot;               /* [layers]: the layer's slot, or -1 */
    float **k, **v, **q;               /* [slots]; q NULL when not wanted */
} s_grab_t;

static int s_grab_layer(void *arg, uint32_t layer, const float *hidden, uint32_t n, const float *q,
                        const float *k, const float *v)
{
    (void)hidden;
    s_grab_t *g = arg;
    const int32_t s = g->slot[layer];
    if (s < 0)
        return KVEDGE_OK;
    const size_t hd = g->head_dim, row = (size_t)n * hd;
    int rc = KVEDGE_OK;
    for (uint32_t h = 0; rc == KVEDGE_OK && h < g->kv_heads; h++) {
        const size_t dst = ((size_t)h * g->samples + g->row0) * hd, src = (size_t)h * row;
        memcpy(g->k[s] + dst, k + src, row * sizeof(float));
        memcpy(g->v[s] + dst, v + src, row * sizeof(float));
        if (g->rope)
            rc = kvedge_decoder_rope_apply(g->rope, g->head_dim, g->k[s] + dst, 1, n, 0, true);
    }
    for (uint32_t h = 0; rc == KVEDGE_OK && g->q && h < g->q_heads; h++) {
        const size_t dst = ((size_t)h * g->samples + g->row0) * hd, src = (size_t)h * row;
        memcpy(g->q[s] + dst, q + src, row * sizeof(float));
        if (g->rope)
            rc = kvedge_decoder_rope_apply(g->rope, g->head_dim, g->q[s] + dst, 1, n, 0, true);
    }
    return rc;
}

/* Runs md over tokens[0..samples) in windows of window tokens, filling g. */
static int s_grab(const kvedge_decoder_t *md, const int32_t *tokens, uint32_t window, s_grab_t *g)
{
    for (uint32_t at = 0; at < g->samples; at += window) {
        const uint32_t n = g->samples - at < window ? g->samples - at : window;
        g->row0 = at;
        int rc = kvedge_decoder_prefill_trace(md, tokens + at, n, s_grab_layer, g);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

/* Everything a fit or an evaluation needs from both models, per mapped edge layer e:
 * ck/cv/cq of its cloud layer (cq only with queries) and ek/ev, [kv_heads][samples][head_dim]
 * (cq [heads][samples][head_dim]); K and Q un-rotated when asked. */
typedef struct {
    uint32_t slots_c, slots_e;
    int32_t *slot_c, *slot_e; /* [cloud layers], [edge layers] */
    float **ck, **cv, **cq;   /* [slots_c] */
    float **ek, **ev;         /* [slots_e] */
} s_states_t;

static void s_states_free(s_states_t *st)
{
    for (uint32_t i = 0; st->ck && i < st->slots_c; i++) {
        free(st->ck[i]);
        free(st->cv[i]);
        if (st->cq)
            free(st->cq[i]);
    }
    for (uint32_t i = 0; st->ek && i < st->slots_e; i++) {
        free(st->ek[i]);
        free(st->ev[i]);
    }
    free(st->ck);
    free(st->cv);
    free(st->cq);
    free(st->ek);
    free(st->ev);
    free(st->slot_c);
    free(st->slot_e);
    memset(st, 0, sizeof *st);
}

/* Collects st for the layer pairs from[] (one slot per distinct cloud layer and per mapped
 * edge layer); queries too when queries is set; K and Q un-rotated (each model's own rotary
 * settings) when unrotate is set. */
static int s_states(const kvedge_decoder_t *cloud, const kvedge_decoder_t *edge,
                    const int32_t *from, const int32_t *tokens, uint32_t samples, bool queries,
                    bool unrotate, s_states_t *st)
{
    memset(st, 0, sizeof *st);
    const kvedge_decoder_config_t *cc = kvedge_decoder_config(cloud),
                                  *ec = kvedge_decoder_config(edge);
    st->slot_c = malloc(cc->layers * sizeof(int32_t));
    st->slot_e = malloc(ec->layers * sizeof(int32_t));
    if (!st->slot_c || !st->slot_e) {
        s_states_free(st);
        return KVEDGE_ENOMEM;
    }
    for (uint32_t c = 0; c < cc->layers; c++)
        st->slot_c[c] = -1;
    for (uint32_t e = 0; e < ec->layers; e++) {
        st->slot_e[e] = -1;
        if (from[e] == KVEDGE_LAYERMAP_NONE)
            continue;
        st->slot_e[e] = (int32_t)st->slots_e++;
        if (st->slot_c[from[e]] < 0)
            st->slot_c[from[e]] = (int32_t)st->slots_c++;
    }
    const uint32_t nc = st->slots_c ? st->slots_c : 1, ne = st->slots_e ? st->slots_e : 1;
    st->ck = calloc(nc, sizeof(float *));
    st->cv = calloc(nc, sizeof(float *));
    st->cq = queries ? calloc(nc, sizeof(float *)) : NULL;
    st->ek = calloc(ne, sizeof(float *));
    st->ev = calloc(ne, sizeof(float *));
    bool ok = st->ck && st->cv && (!queries || st->cq) && st->ek && st->ev;
    const uint32_t kvc = kvedge_decoder_kv_heads(cloud), kve = kvedge_decoder_kv_heads(edge);
    const size_t fc = (size_t)kvc * cc->head_dim * samples,
                 fq = (size_t)cc->heads * cc->head_dim * samples,
                 fe = (size_t)kve * ec->head_dim * samples;
    for (uint32_t i = 0; ok && i < st->slots_c; i++) {
        st->ck[i] = malloc(fc * sizeof(float));
        st->cv[i] = malloc(fc * sizeof(float));
        if (queries)
            st->cq[i] = malloc(fq * sizeof(float));
        ok = st->ck[i] && st->cv[i] && (!queries || st->cq[i]);
    }
    for (uint32_t i = 0; ok && i < st->slots_e; i++) {
        st->ek[i] = malloc(fe * sizeof(float));
        st->ev[i] = malloc(fe * sizeof(float));
        ok = st->ek[i] && st->ev[i];
    }
    if (!ok) {
        s_states_free(st);
        return KVEDGE_ENOMEM;
    }
    if (st->slots_e == 0)
        return KVEDGE_OK;
    uint32_t window = KVEDGE_LAYERMAP_WINDOW_TOKENS_MAX;
    window = cc->max_positions < window ? cc->max_positions : window;
    window = ec->max_positions < window ? ec->max_positions : window;
    kvedge_decoder_rope_t rc_rope, re_rope;
    kvedge_decoder_rope(cloud, &rc_rope);
    kvedge_decoder_rope(edge, &re_rope);
    s_grab_t gc = {kvc,        cc->heads, cc->head_dim, samples, 0, unrotate ? &rc_rope : NULL,
                   st->slot_c, st->ck,    st->cv,       st->cq};
    s_grab_t ge = {kve,        ec->heads, ec->head_dim, samples, 0, unrotate ? &re_rope : NULL,
                   st->slot_e, st->ek,    st->ev,       NULL};
    int rc = s_grab(cloud, tokens, window, &gc);
    if (rc == KVEDGE_OK)
        rc = s_grab(edge, tokens, window, &ge);
    if (rc != KVEDGE_OK)
        s_states_free(st);
    return rc;
}

/* [heads][n][hd] -> [n][heads * hd]. */
static void s_gather(const float *src, uint32_t heads, uint32_t n, uint32_t hd, float *dst)
{
    const size_t w = (size_t)heads * hd;
    for (uint32_t h = 0; h < heads; h++)
        for (uint32_t t = 0; t < n; t++)
            memcpy(dst + t * w + (size_t)h * hd, src + ((size_t)h * n + t) * hd,
                   hd * sizeof(float));
}

/* [n][heads * hd] -> [heads][n][hd]. */
static void s_scatter(const float *src, uint32_t heads, uint32_t n, uint32_t hd, float *dst)
{
    const size_t w = (size_t)heads * hd;
    for (uint32_t h = 0; h < heads; h++)
        for (uint32_t t = 0; t < n; t++)
            memcpy(dst + ((size_t)h * n + t) * hd, src + t * w + (size_t)h * hd,
                   hd * sizeof(float));
}

/* ---------------------------------------------------------------------------------------- */
/* The linear fit                                                                            */

/* In-place Cholesky of the SPD matrix a [n][n] (lower triangle used and overwritten by L).
 * false when a pivot is not positive (a singular system). */
static bool s_cholesky(double *a, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        double d = a[j * n + j];
        for (size_t k = 0; k < j; k++)
            d -= a[j * n + k] * a[j * n + k];
        if (!(d > 0) || !isfinite(d))
            return false;
        const double l = sqrt(d);
        a[j * n + j] = l;
        for (size_t i = j + 1; i < n; i++) {
            double s = a[i * n + j];
            for (size_t k = 0; k < j; k++)
                s -= a[i * n + k] * a[j * n + k];
            a[i * n + j] = s / l;
        }
    }
    return true;
}

int kvedge_adapter_fit_linear(const float *x, const float *y, uint32_t n, uint32_t din,
                              uint32_t dout, double ridge, float *w)
{
    if (!x || !y || !w || n == 0 || din == 0 || dout == 0 || !(ridge >= 0) || !isfinite(ridge))
        return KVEDGE_EINVAL;
    const size_t m = (size_t)din + 1, N = n;
    double *xd = malloc(N * m * sizeof(double)), *yd = malloc(N * dout * sizeof(double));
    double *a = malloc(m * m * sizeof(double)), *b = malloc(m * dout * sizeof(double));
    int rc = xd && yd && a && b ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK) {
        for (size_t t = 0; t < N; t++) {
            for (size_t j = 0; j < din; j++)
                xd[t * m + j] = x[t * din + j];
            xd[t * m + din] = 1.0; /* the bias column */
            for (size_t j = 0; j < dout; j++)
                yd[t * dout + j] = y[t * dout + j];
        }
        /* Normal equations [x, 1]^T [x, 1] w = [x, 1]^T y, in double. */
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)m, (int)N, 1.0, xd,
                    (int)m, xd, (int)m, 0.0, a, (int)m);
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)dout, (int)N, 1.0, xd,
                    (int)m, yd, (int)dout, 0.0, b, (int)dout);
        double mean = 0;
        for (size_t j = 0; j < din; j++)
            mean += a[j * m + j];
        mean /= din;
        const double lambda = ridge * (mean > 0 ? mean : 1.0);
        for (size_t j = 0; j < din; j++)
            a[j * m + j] += lambda;
        if (!s_cholesky(a, m))
            rc = KVEDGE_EINVAL;
    }
    if (rc == KVEDGE_OK) {
        /* L z = b, then L^T w = z, row by row over all dout right-hand sides. */
        for (size_t i = 0; i < m; i++) {
            double *bi = b + i * dout;
            for (size_t k = 0; k < i; k++) {
                const double l = a[i * m + k];
                const double *bk = b + k * dout;
                for (size_t c = 0; c < dout; c++)
                    bi[c] -= l * bk[c];
            }
            for (size_t c = 0; c < dout; c++)
                bi[c] /= a[i * m + i];
        }
        for (size_t i = m; i-- > 0;) {
            double *bi = b + i * dout;
            for (size_t k = i + 1; k < m; k++) {
                const double l = a[k * m + i];
                const double *bk = b + k * dout;
                for (size_t c = 0; c < dout; c++)
                    bi[c] -= l * bk[c];
            }
            for (size_t c = 0; c < dout; c++)
                bi[c] /= a[i * m + i];
        }
        for (size_t i = 0; i < m * dout; i++)
            w[i] = (float)b[i];
    }
    free(xd);
    free(yd);
    free(a);
    free(b);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Head matching and ThinK                                                                   */

typedef struct {
    double cka;
    uint32_t e, c;
} s_pair_t;

/* Highest CKA first; ties: lower edge head, then lower cloud head; NaN last. */
static int s_pair_cmp(const void *pa, const void *pb)
{
    const s_pair_t *a = pa, *b = pb;
    const bool na = isnan(a->cka), nb = isnan(b->cka);
    if (na != nb)
        return na ? 1 : -1;
    if (!na && a->cka != b->cka)
        return a->cka > b->cka ? -1 : 1;
    if (a->e != b->e)
        return a->e < b->e ? -1 : 1;
    return a->c < b->c ? -1 : a->c > b->c;
}

int kvedge_adapter_match_heads(const float *edge_k, uint32_t edge_heads, uint32_t edge_head_dim,
                               const float *cloud_k, uint32_t cloud_heads, uint32_t cloud_head_dim,
                               uint32_t n, uint32_t *match, double *cka)
{
    if (!edge_k || !cloud_k || !match || edge_heads == 0 || cloud_heads == 0 ||
        edge_head_dim == 0 || cloud_head_dim == 0 || n < 2)
        return KVEDGE_EINVAL;
    const size_t pairs = (size_t)edge_heads * cloud_heads;
    s_pair_t *p = malloc(pairs * sizeof *p);
    bool *used = calloc(cloud_heads, sizeof *used), *done = calloc(edge_heads, sizeof *done);
    int rc = p && used && done ? KVEDGE_OK : KVEDGE_ENOMEM;
    for (uint32_t e = 0; rc == KVEDGE_OK && e < edge_heads; e++)
        for (uint32_t c = 0; rc == KVEDGE_OK && c < cloud_heads; c++) {
            s_pair_t *x = &p[(size_t)e * cloud_heads + c];
            x->e = e;
            x->c = c;
            const kvedge_cka_args_t a = {edge_k + (size_t)e * n * edge_head_dim,
                                         cloud_k + (size_t)c * n * cloud_head_dim,
                                         n,
                                         edge_head_dim,
                                         cloud_head_dim,
                                         &x->cka};
            rc = kvedge_cpu_cka(&a);
            if (rc == KVEDGE_OK && cka)
                cka[(size_t)e * cloud_heads + c] = x->cka;
        }
    if (rc == KVEDGE_OK) {
        qsort(p, pairs, sizeof *p, s_pair_cmp);
        /* Unique first: every cloud head once while both sides have heads left. */
        uint32_t left = edge_heads;
        for (size_t i = 0; i < pairs && left; i++)
            if (!done[p[i].e] && !used[p[i].c]) {
                match[p[i].e] = p[i].c;
                done[p[i].e] = used[p[i].c] = true;
                left--;
            }
        /* Cloud heads ran out (cloud_heads < edge_heads): the rest take their best again. */
        for (size_t i = 0; i < pairs && left; i++)
            if (!done[p[i].e]) {
                match[p[i].e] = p[i].c;
                done[p[i].e] = true;
                left--;
            }
    }
    free(p);
    free(used);
    free(done);
    return rc;
}

/* kvedge_adapter_think_channels with nq queries and n keys. */
static int s_think(const float *q, uint32_t nq, const float *k, uint32_t n, uint32_t head_dim,
                   uint32_t keep, uint32_t *channels)
{
    if (!q || !k || !channels || nq == 0 || n == 0 || head_dim == 0 || keep == 0 ||
        keep > head_dim || head_dim > KVEDGE_ADAPT_HEAD_DIM_MAX)
        return KVEDGE_EINVAL;
    float scores[KVEDGE_ADAPT_HEAD_DIM_MAX];
    uint8_t mask[KVEDGE_ADAPT_HEAD_DIM_MAX / 8];
    const kvedge_think_args_t a = {q, k, 1, nq, n, head_dim, scores};
    int rc = kvedge_cpu_think_scores(&a);
    if (rc == KVEDGE_OK)
        rc = kvedge_think_keep_mask(scores, head_dim, keep, mask, sizeof mask);
    if (rc != KVEDGE_OK)
        return rc;
    uint32_t got = 0;
    for (uint32_t j = 0; j < head_dim; j++)
        if (mask[j >> 3] & (1u << (j & 7)))
            channels[got++] = j;
    return got == keep ? KVEDGE_OK : KVEDGE_EINVAL;
}

int kvedge_adapter_think_channels(const float *q, const float *k, uint32_t n, uint32_t head_dim,
                                  uint32_t keep, uint32_t *channels)
{
    return s_think(q, n, k, n, head_dim, keep, channels);
}

int kvedge_adapter_think_pairs(const float *q, uint32_t nq, const float *k, uint32_t n,
                               uint32_t head_dim, uint32_t keep, uint32_t *channels)
{
    if (!q || !k || !channels || nq == 0 || n == 0 || head_dim == 0 || head_dim % 2 != 0 ||
        keep == 0 || keep % 2 != 0 || keep > head_dim || head_dim > KVEDGE_ADAPT_HEAD_DIM_MAX)
        return KVEDGE_EINVAL;
    const uint32_t half = head_dim / 2;
    float scores[KVEDGE_ADAPT_HEAD_DIM_MAX], pair[KVEDGE_ADAPT_HEAD_DIM_MAX / 2];
    uint8_t mask[KVEDGE_ADAPT_HEAD_DIM_MAX / 16];
    const kvedge_think_args_t a = {q, k, 1, nq, n, head_dim, scores};
    int rc = kvedge_cpu_think_scores(&a);
    for (uint32_t j = 0; j < half; j++)
        pair[j] = scores[j] + scores[half + j];
    if (rc == KVEDGE_OK) /* the same ranking (ties: the lower pair) over the pairs */
        rc = kvedge_think_keep_mask(pair, half, keep / 2, mask, sizeof mask);
    if (rc != KVEDGE_OK)
        return rc;
    uint32_t got = 0;
    for (uint32_t j = 0; j < half; j++)
        if (mask[j >> 3] & (1u << (j & 7))) {
            channels[got] = j;
            channels[keep / 2 + got] = half + j;
            got++;
        }
    return got == keep / 2 ? KVEDGE_OK : KVEDGE_EINVAL;
}

/* The selection W [din + 1][dout] of one layer: edge head h, channel j <- cloud head match[h],
 * its j-th kept channel (ThinK, when the cloud head is wider), or zero (when narrower). cq
 * holds group query heads per cloud KV head. With pairs (a rotary model on either side), a
 * rotate-half pair of the cloud head goes to a pair of the edge head: ThinK keeps pairs, and a
 * narrower cloud head's channel j (j < dc/2) lands on edge channel j, j + dc/2 on j + de/2. */
static int s_fit_heads(const kvedge_adapter_info_t *i, const float *cq, uint32_t group,
                       const float *ck, const float *ek, uint32_t n, bool pairs, float *w)
{
    const uint32_t hc = i->cloud_heads, dc = i->cloud_head_dim, he = i->edge_heads,
                   de = i->edge_head_dim;
    uint32_t *match = malloc(he * sizeof(uint32_t)), ch[KVEDGE_ADAPT_HEAD_DIM_MAX],
             to[KVEDGE_ADAPT_HEAD_DIM_MAX];
    if (!match)
        return KVEDGE_ENOMEM;
    int rc = kvedge_adapter_match_heads(ek, he, de, ck, hc, dc, n, match, NULL);
    const size_t dout = s_dout(i);
    memset(w, 0, (s_din(i) + 1) * dout * sizeof(float));
    for (uint32_t h = 0; rc == KVEDGE_OK && h < he; h++) {
        const uint32_t c = match[h], keep = dc < de ? dc : de;
        const float *q = cq ? cq + (size_t)c * group * n * dc : NULL, *k = ck + (size_t)c * n * dc;
        if (dc > de && pairs)
            rc = kvedge_adapter_think_pairs(q, group * n, k, n, dc, de, ch);
        else if (dc > de)
            rc = s_think(q, group * n, k, n, dc, de, ch);
        else
            for (uint32_t j = 0; j < keep; j++)
                ch[j] = j;
        for (uint32_t j = 0; j < keep; j++)
            to[j] = pairs && dc < de && j >= dc / 2 ? j - dc / 2 + de / 2 : j;
        for (uint32_t j = 0; rc == KVEDGE_OK && j < keep; j++)
            w[((size_t)c * dc + ch[j]) * dout + (size_t)h * de + to[j]] = 1.0f;
    }
    free(match);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Fit, apply, evaluate                                                                      */

/* The models' shapes against the map (fit) or the adapter (eval); true when they agree. */
static bool s_models_fit(const kvedge_decoder_t *cloud, const kvedge_decoder_t *edge,
                         uint32_t cloud_layers, uint32_t edge_layers)
{
    const kvedge_decoder_config_t *cc = kvedge_decoder_config(cloud),
                                  *ec = kvedge_decoder_config(edge);
    return cc->layers == cloud_layers && ec->layers == edge_layers &&
           kvedge_decoder_kv_heads(cloud) && kvedge_decoder_kv_heads(edge);
}

int kvedge_adapter_fit(const kvedge_decoder_t *cloud, const kvedge_decoder_t *edge,
                       const kvedge_layermap_t *map, const int32_t *tokens, size_t ntokens,
                       uint32_t samples, kvedge_adapt_kind_t kind, double ridge,
                       kvedge_adapter_t **out)
{
    if (out)
        *out = NULL;
    if (!cloud || !edge || !map || !tokens || !out ||
        (kind != KVEDGE_ADAPT_LINEAR && kind != KVEDGE_ADAPT_HEADS) || isnan(ridge) ||
        isinf(ridge) || kvedge_layermap_check(map, NULL, 0) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    const kvedge_decoder_config_t *cc = kvedge_decoder_config(cloud),
                                  *ec = kvedge_decoder_config(edge);
    if (!s_models_fit(cloud, edge, map->cloud_layers, map->edge_layers) ||
        cc->hidden != map->cloud_hidden || ec->hidden != map->edge_hidden)
        return KVEDGE_EINVAL;
    const uint32_t kvc = kvedge_decoder_kv_heads(cloud), kve = kvedge_decoder_kv_heads(edge);
    if (kvc > KVEDGE_ADAPT_HEADS_MAX || kve > KVEDGE_ADAPT_HEADS_MAX ||
        cc->head_dim > KVEDGE_ADAPT_HEAD_DIM_MAX || ec->head_dim > KVEDGE_ADAPT_HEAD_DIM_MAX ||
        (size_t)kvc * cc->head_dim > KVEDGE_ADAPT_WIDTH_MAX ||
        (size_t)kve * ec->head_dim > KVEDGE_ADAPT_WIDTH_MAX || samples > S_SAMPLES_MAX)
        return KVEDGE_ETOOBIG;
    if (samples < 2 || ntokens < samples)
        return KVEDGE_ETRUNCATED;
    if (ridge < 0)
        ridge = KVEDGE_ADAPT_RIDGE_DEFAULT;
    kvedge_adapter_info_t info = {
        .kind = kind,
        .cloud_layers = cc->layers,
        .cloud_heads = kvc,
        .cloud_head_dim = cc->head_dim,
        .edge_layers = ec->layers,
        .edge_heads = kve,
        .edge_head_dim = ec->head_dim,
        .samples = samples,
        .ridge = kind == KVEDGE_ADAPT_LINEAR ? ridge : 0.0,
    };
    kvedge_decoder_rope(cloud, &info.cloud_rope);
    kvedge_decoder_rope(edge, &info.edge_rope);
    const bool pairs = (info.cloud_rope.rotary || info.edge_rope.rotary) && cc->head_dim % 2 == 0 &&
                       ec->head_dim % 2 == 0;
    snprintf(info.cloud_id, sizeof info.cloud_id, "%s", map->cloud_id);
    snprintf(info.edge_id, sizeof info.edge_id, "%s", map->edge_id);
    int32_t *from = malloc(ec->layers * sizeof(int32_t));
    if (!from)
        return KVEDGE_ENOMEM;
    for (uint32_t e = 0; e < ec->layers; e++)
        from[e] = map->entry[e].cloud;
    kvedge_adapter_t *a = s_new(&info, from);
    s_states_t st = {0};
    int rc = a ? s_states(cloud, edge, from, tokens, samples, kind == KVEDGE_ADAPT_HEADS, true, &st)
               : KVEDGE_ENOMEM;
    const size_t din = s_din(&info), dout = s_dout(&info);
    float *x = NULL, *y = NULL;
    if (rc == KVEDGE_OK && kind == KVEDGE_ADAPT_LINEAR) {
        x = malloc((size_t)samples * din * sizeof(float));
        y = malloc((size_t)samples * dout * sizeof(float));
        if (!x || !y)
            rc = KVEDGE_ENOMEM;
    }
    for (uint32_t e = 0; rc == KVEDGE_OK && e < ec->layers; e++) {
        if (from[e] == KVEDGE_LAYERMAP_NONE)
            continue;
        const int32_t sc = st.slot_c[from[e]], se = st.slot_e[e];
        if (kind == KVEDGE_ADAPT_HEADS) {
            rc = s_fit_heads(&info, st.cq[sc], cc->heads / kvc, st.ck[sc], st.ek[se], samples,
                             pairs, a->w[2 * e]);
            if (rc == KVEDGE_OK) /* V takes the heads and channels K chose */
                memcpy(a->w[2 * e + 1], a->w[2 * e], (din + 1) * dout * sizeof(float));
            continue;
        }
        for (int t = 0; rc == KVEDGE_OK && t < 2; t++) {
            s_gather(t ? st.cv[sc] : st.ck[sc], kvc, samples, cc->head_dim, x);
            s_gather(t ? st.ev[se] : st.ek[se], kve, samples, ec->head_dim, y);
            rc = kvedge_adapter_fit_linear(x, y, samples, (uint32_t)din, (uint32_t)dout, ridge,
                                           a->w[2 * e + t]);
        }
    }
    s_states_free(&st); /* zeroed when never filled */
    free(x);
    free(y);
    free(from);
    if (rc != KVEDGE_OK)
        kvedge_adapter_destroy(&a);
    *out = a;
    return rc;
}

/* One of K or V: gather, the affine map, the finiteness check, scatter. */
static int s_apply_one(const kvedge_adapter_info_t *i, const float *w, const float *src,
                       uint32_t tokens, float *x, float *y, float *dst)
{
    s_gather(src, i->cloud_heads, tokens, i->cloud_head_dim, x);
    const kvedge_adapt_args_t a = {x, w, tokens, (uint32_t)s_din(i), (uint32_t)s_dout(i), y};
    int rc = kvedge_cpu_adapt(&a);
    if (rc != KVEDGE_OK)
        return rc;
    bool finite = true;
    for (size_t j = 0; j < (size_t)tokens * s_dout(i); j++)
        finite &= isfinite(y[j]) != 0;
    s_scatter(y, i->edge_heads, tokens, i->edge_head_dim, dst);
    return finite ? KVEDGE_OK : KVEDGE_ECORRUPT;
}

/* kvedge_adapter_apply; with rope false the bare map, on K already un-rotated and giving K
 * un-rotated (an evaluation compares there). */
static int s_apply(const kvedge_adapter_t *a, uint32_t edge_layer, const float *k_src,
                   const float *v_src, uint32_t tokens, float *k_dst, float *v_dst, bool rope)
{
    if (!a || !k_src || !v_src || !k_dst || !v_dst || tokens == 0 ||
        kvedge_adapter_from(a, edge_layer) == KVEDGE_LAYERMAP_NONE)
        return KVEDGE_EINVAL;
    const kvedge_adapter_info_t *i = &a->info;
    const bool unrotate = rope && i->cloud_rope.rotary, rotate = rope && i->edge_rope.rotary;
    const size_t src_floats = (size_t)tokens * s_din(i);
    float *x = malloc(src_floats * sizeof(float));
    float *y = malloc((size_t)tokens * s_dout(i) * sizeof(float));
    float *kr = unrotate ? malloc(src_floats * sizeof(float)) : NULL;
    int rc = x && y && (!unrotate || kr) ? KVEDGE_OK : KVEDGE_ENOMEM;
    const float *ks = k_src;
    if (rc == KVEDGE_OK && unrotate) { /* the cloud's rotation off a copy */
        memcpy(kr, k_src, src_floats * sizeof(float));
        rc = kvedge_decoder_rope_apply(&i->cloud_rope, i->cloud_head_dim, kr, i->cloud_heads,
                                       tokens, 0, true);
        ks = kr;
    }
    if (rc == KVEDGE_OK)
        rc = s_apply_one(i, a->w[2 * edge_layer], ks, tokens, x, y, k_dst);
    if (rc == KVEDGE_OK && rotate) /* the edge's rotation on */
        rc = kvedge_decoder_rope_apply(&i->edge_rope, i->edge_head_dim, k_dst, i->edge_heads,
                                       tokens, 0, false);
    if (rc == KVEDGE_OK)
        rc = s_apply_one(i, a->w[2 * edge_layer + 1], v_src, tokens, x, y, v_dst);
    free(x);
    free(y);
    free(kr);
    return rc;
}

int kvedge_adapter_apply(const kvedge_adapter_t *a, uint32_t edge_layer, const float *k_src,
                         const float *v_src, uint32_t tokens, float *k_dst, float *v_dst)
{
    return s_apply(a, edge_layer, k_src, v_src, tokens, k_dst, v_dst, true);
}

/* ||ref - got|| / ||ref|| over len floats, in double. */
static double s_rel_err(const float *ref, const float *got, size_t len)
{
    double num = 0, den = 0;
    for (size_t j = 0; j < len; j++) {
        const double d = (double)ref[j] - got[j];
        num += d * d;
        den += (double)ref[j] * ref[j];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

int kvedge_adapter_eval(const kvedge_adapter_t *a, const kvedge_decoder_t *cloud,
                        const kvedge_decoder_t *edge, const int32_t *tokens, size_t ntokens,
                        uint32_t samples, double *err_k, double *err_v)
{
    if (!a || !cloud || !edge || !tokens || !err_k || !err_v)
        return KVEDGE_EINVAL;
    const kvedge_adapter_info_t *i = &a->info;
    const kvedge_decoder_config_t *cc = kvedge_decoder_config(cloud),
                                  *ec = kvedge_decoder_config(edge);
    if (!s_models_fit(cloud, edge, i->cloud_layers, i->edge_layers) ||
        kvedge_decoder_kv_heads(cloud) != i->cloud_heads || cc->head_dim != i->cloud_head_dim ||
        kvedge_decoder_kv_heads(edge) != i->edge_heads || ec->head_dim != i->edge_head_dim ||
        kvedge_adapter_check_rope(a, cloud, edge, NULL, 0) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    if (samples < 2 || ntokens < samples)
        return KVEDGE_ETRUNCATED;
    for (uint32_t e = 0; e < i->edge_layers; e++)
        err_k[e] = err_v[e] = NAN;
    s_states_t st;
    /* Compared un-rotated: the edge's rotation turns rotate-half pairs, so it keeps both norms,
     * and windows restart positions, which the un-rotated K does not depend on. */
    int rc = s_states(cloud, edge, a->from, tokens, samples, false, true, &st);
    if (rc != KVEDGE_OK)
        return rc;
    const size_t len = (size_t)samples * s_dout(i);
    float *yk = malloc(len * sizeof(float)), *yv = malloc(len * sizeof(float));
    rc = yk && yv ? KVEDGE_OK : KVEDGE_ENOMEM;
    for (uint32_t e = 0; rc == KVEDGE_OK && e < i->edge_layers; e++) {
        if (a->from[e] == KVEDGE_LAYERMAP_NONE)
            continue;
        const int32_t sc = st.slot_c[a->from[e]], se = st.slot_e[e];
        rc = s_apply(a, e, st.ck[sc], st.cv[sc], samples, yk, yv, false);
        if (rc == KVEDGE_ECORRUPT) /* measured as it is: an infinite error */
            rc = KVEDGE_OK;
        err_k[e] = s_rel_err(st.ek[se], yk, len);
        err_v[e] = s_rel_err(st.ev[se], yv, len);
    }
    free(yk);
    free(yv);
    s_states_free(&st);
    return rc;
}

int kvedge_adapter_check(const kvedge_adapter_t *a, const kvedge_layermap_t *map,
                         const kvedge_model_t *cloud, const kvedge_model_t *edge, char *why,
                         size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!a)
        return KVEDGE_EINVAL;
    const kvedge_adapter_info_t *i = &a->info;
    if (map) {
        if (!map->entry && map->edge_layers)
            return KVEDGE_EINVAL;
        if (strcmp(map->cloud_id, i->cloud_id) != 0 || strcmp(map->edge_id, i->edge_id) != 0) {
            s_why(why, why_len, "the map is for %s -> %s, the adapter for %s -> %s", map->cloud_id,
                  map->edge_id, i->cloud_id, i->edge_id);
            return KVEDGE_ESHAPE;
        }
        if (map->cloud_layers != i->cloud_layers || map->edge_layers != i->edge_layers) {
            s_why(why, why_len, "the map has %u cloud and %u edge layers, the adapter %u and %u",
                  map->cloud_layers, map->edge_layers, i->cloud_layers, i->edge_layers);
            return KVEDGE_ESHAPE;
        }
        for (uint32_t e = 0; e < i->edge_layers; e++)
            if (map->entry[e].cloud != a->from[e]) {
                s_why(why, why_len, "edge layer %u: the map gives cloud layer %d, the adapter %d",
                      e, map->entry[e].cloud, a->from[e]);
                return KVEDGE_ESHAPE;
            }
    }
    const kvedge_model_t *m[2] = {cloud, edge};
    const char *side[2] = {"cloud", "edge"};
    const uint32_t want[2][3] = {{i->cloud_layers, i->cloud_heads, i->cloud_head_dim},
                                 {i->edge_layers, i->edge_heads, i->edge_head_dim}};
    for (int s = 0; s < 2; s++)
        if (m[s] && (m[s]->layers != want[s][0] || m[s]->kv_heads != want[s][1] ||
                     m[s]->head_dim != want[s][2])) {
            s_why(why, why_len,
                  "the %s model %s is %u layers x %u KV heads x %u, the adapter's %u x %u x %u",
                  side[s], m[s]->id, m[s]->layers, m[s]->kv_heads, m[s]->head_dim, want[s][0],
                  want[s][1], want[s][2]);
            return KVEDGE_ESHAPE;
        }
    return KVEDGE_OK;
}

/* The shortest decimal that reads back as x, without an exponent when one that short exists
 * (a setting reads as config.json spells it: 500000, not 5e+05). */
static void s_fmt_plain(double x, char *out, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, len, "%.*g", prec, x);
        if (strtod(out, NULL) == x && !strchr(out, 'e'))
            return;
    }
    s_fmt_double(x, out, len);
}

/* "none", or "theta=T" with ",llama3,factor=F,low_freq_factor=L,high_freq_factor=H,
 * original_max_position_embeddings=M" when scaled: the metadata value, and what a mismatch
 * names. */
void kvedge_adapter_rope_format(const kvedge_decoder_rope_t *r, char *out, size_t len)
{
    if (!r->rotary) {
        snprintf(out, len, "none");
        return;
    }
    char t[32], f[32], lo[32], hi[32], m[32];
    s_fmt_plain(r->theta, t, sizeof t);
    if (!r->llama3) {
        snprintf(out, len, "theta=%s", t);
        return;
    }
    s_fmt_plain(r->factor, f, sizeof f);
    s_fmt_plain(r->low_freq_factor, lo, sizeof lo);
    s_fmt_plain(r->high_freq_factor, hi, sizeof hi);
    s_fmt_plain(r->original_max, m, sizeof m);
    snprintf(out, len,
             "theta=%s,llama3,factor=%s,low_freq_factor=%s,high_freq_factor=%s,"
             "original_max_position_embeddings=%s",
             t, f, lo, hi, m);
}

int kvedge_adapter_check_rope(const kvedge_adapter_t *a, const kvedge_decoder_t *cloud,
                              const kvedge_decoder_t *edge, char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!a)
        return KVEDGE_EINVAL;
    const kvedge_decoder_t *m[2] = {cloud, edge};
    const kvedge_decoder_rope_t *want[2] = {&a->info.cloud_rope, &a->info.edge_rope};
    for (int s = 0; s < 2; s++) {
        kvedge_decoder_rope_t have;
        if (!m[s] || kvedge_decoder_rope(m[s], &have) != KVEDGE_OK ||
            kvedge_decoder_rope_equal(&have, want[s]))
            continue;
        char h[S_ROPE_BYTES], w[S_ROPE_BYTES];
        kvedge_adapter_rope_format(&have, h, sizeof h);
        kvedge_adapter_rope_format(want[s], w, sizeof w);
        s_why(why, why_len, "the %s model's rotary settings are %s, the adapter's %s",
              s ? "edge" : "cloud", h, w);
        return KVEDGE_ESHAPE;
    }
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* The file                                                                                  */

/* Appends s to the growing buffer; false when out of memory. */
typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} s_buf_t;

static void s_put(s_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_put(s_buf_t *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap : 1024) * 2;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

/* A JSON string of printable ASCII (ids): quotes and backslashes escaped. */
static void s_put_str(s_buf_t *b, const char *s)
{
    s_put(b, "\"");
    for (; *s; s++)
        s_put(b, *s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
    s_put(b, "\"");
}

/* The shortest decimal that reads back as x. */
static void s_fmt_double(double x, char *out, size_t len)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, len, "%.*g", prec, x);
        if (strtod(out, NULL) == x)
            return;
    }
}

/* "0,1,4" with "-1" for none. */
static void s_put_from(s_buf_t *b, const kvedge_adapter_t *a)
{
    for (uint32_t e = 0; e < a->info.edge_layers; e++)
        s_put(b, "%s%d", e ? "," : "", a->from[e]);
}

static void s_put_le_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

int kvedge_adapter_save(const kvedge_adapter_t *a, const char *path)
{
    if (!a || !path || !*path)
        return KVEDGE_EINVAL;
    const kvedge_adapter_info_t *i = &a->info;
    const size_t din = s_din(i), dout = s_dout(i), bytes = (din + 1) * dout * sizeof(float);
    char ridge[32];
    s_fmt_double(i->ridge, ridge, sizeof ridge);
    s_buf_t h = {0};
    const bool rope = i->cloud_rope.rotary || i->edge_rope.rotary;
    s_put(&h, "{\"__metadata__\":{\"format\":\"%s\",\"version\":\"%d\",\"kind\":\"%s\",", S_FORMAT,
          S_VERSION, kvedge_adapt_kind_name(i->kind));
    s_put(&h, "\"cloud_id\":");
    s_put_str(&h, i->cloud_id);
    s_put(&h, ",\"edge_id\":");
    s_put_str(&h, i->edge_id);
    s_put(&h,
          ",\"cloud_layers\":\"%u\",\"cloud_heads\":\"%u\",\"cloud_head_dim\":\"%u\","
          "\"edge_layers\":\"%u\",\"edge_heads\":\"%u\",\"edge_head_dim\":\"%u\",\"from\":\"",
          i->cloud_layers, i->cloud_heads, i->cloud_head_dim, i->edge_layers, i->edge_heads,
          i->edge_head_dim);
    s_put_from(&h, a);
    s_put(&h, "\",\"samples\":\"%u\",\"ridge\":\"%s\"", i->samples, ridge);
    if (i->fit[0]) {
        s_put(&h, ",\"fit\":");
        s_put_str(&h, i->fit);
    }
    if (rope) {
        char r[S_ROPE_BYTES];
        kvedge_adapter_rope_format(&i->cloud_rope, r, sizeof r);
        s_put(&h, ",\"cloud_rope\":\"%s\"", r);
        kvedge_adapter_rope_format(&i->edge_rope, r, sizeof r);
        s_put(&h, ",\"edge_rope\":\"%s\"", r);
    }
    s_put(&h, "}");
    uint64_t off = 0;
    for (uint32_t e = 0; e < i->edge_layers; e++)
        for (int t = 0; a->from[e] != KVEDGE_LAYERMAP_NONE && t < 2; t++) {
            s_put(&h,
                  ",\"%c.%u\":{\"dtype\":\"F32\",\"shape\":[%zu,%zu],\"data_offsets\":[%llu,"
                  "%llu]}",
                  t ? 'v' : 'k', e, din + 1, dout, (unsigned long long)off,
                  (unsigned long long)(off + bytes));
            off += bytes;
        }
    s_put(&h, "}");
    while (!h.oom && h.len % 8) /* the data starts 8-byte aligned, as other writers do */
        s_put(&h, " ");
    if (h.oom) {
        free(h.p);
        return KVEDGE_ENOMEM;
    }
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) {
        free(h.p);
        return KVEDGE_ENOMEM;
    }
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    int rc = f ? KVEDGE_OK : KVEDGE_EIO;
    int err = errno;
    uint8_t prefix[8];
    s_put_le_u64(prefix, h.len);
    if (rc == KVEDGE_OK && (fwrite(prefix, 1, 8, f) != 8 || fwrite(h.p, 1, h.len, f) != h.len))
        rc = KVEDGE_EIO;
    /* Weights little-endian, as the reader assembles them. */
    uint8_t *le = rc == KVEDGE_OK ? malloc(bytes) : NULL;
    if (rc == KVEDGE_OK && !le)
        rc = KVEDGE_ENOMEM;
    for (uint32_t e = 0; rc == KVEDGE_OK && e < i->edge_layers; e++)
        for (int t = 0; rc == KVEDGE_OK && a->from[e] != KVEDGE_LAYERMAP_NONE && t < 2; t++) {
            const float *w = a->w[2 * e + t];
            for (size_t j = 0; j < bytes / 4; j++) {
                uint32_t u;
                memcpy(&u, &w[j], 4);
                for (int b = 0; b < 4; b++)
                    le[4 * j + b] = (uint8_t)(u >> (8 * b));
            }
            if (fwrite(le, 1, bytes, f) != bytes)
                rc = KVEDGE_EIO;
        }
    if (rc == KVEDGE_EIO)
        err = errno;
    if (f && fclose(f) != 0 && rc == KVEDGE_OK) {
        rc = KVEDGE_EIO;
        err = errno;
    }
    if (rc == KVEDGE_OK && rename(tmp, path) != 0) {
        rc = KVEDGE_EIO;
        err = errno;
    }
    if (rc != KVEDGE_OK && f)
        unlink(tmp);
    free(le);
    free(tmp);
    free(h.p);
    errno = err;
    return rc;
}

/* A decimal integer in [min, max], all of s, no sign, no leading zero. */
static bool s_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
    if (!isdigit((unsigned char)s[0]) || (s[0] == '0' && s[1]) || strlen(s) > 10)
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* The metadata field key, or NULL with why set. */
static const char *s_meta(const kvedge_safetensors_t *st, const char *path, const char *key,
                          char *why, size_t why_len)
{
    const char *v = kvedge_safetensors_metadata(st, key);
    if (!v)
        s_why(why, why_len, "%s: metadata '%s' is missing", path, key);
    return v;
}

/* "from": edge_layers entries "-1" or 0..cloud_layers-1, comma-separated. */
static bool s_parse_from(const char *s, const kvedge_adapter_info_t *i, int32_t *from)
{
    for (uint32_t e = 0; e < i->edge_layers; e++) {
        const size_t n = strcspn(s, ",");
        char tok[16];
        if (n == 0 || n >= sizeof tok)
            return false;
        memcpy(tok, s, n);
        tok[n] = '\0';
        uint32_t c;
        if (strcmp(tok, "-1") == 0)
            from[e] = KVEDGE_LAYERMAP_NONE;
        else if (s_u32(tok, 0, i->cloud_layers - 1, &c))
            from[e] = (int32_t)c;
        else
            return false;
        s += n;
        if (e + 1 < i->edge_layers) {
            if (*s != ',')
                return false;
            s++;
        }
    }
    return *s == '\0';
}

/* A strict finite decimal number (no hex, inf or nan). */
static bool s_num(const char *s, double *out)
{
    if (!*s)
        return false;
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p) && *p != '.' && *p != '-' && *p != '+' && *p != 'e' &&
            *p != 'E')
            return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

/* One item "key=number" of a rotary setting, at *s (advanced past it and its comma). */
static bool s_rope_item(const char **s, const char *key, double *out)
{
    const size_t kl = strlen(key);
    if (strncmp(*s, key, kl) != 0 || (*s)[kl] != '=')
        return false;
    const char *v = *s + kl + 1;
    const size_t n = strcspn(v, ",");
    char tok[40];
    if (n == 0 || n >= sizeof tok)
        return false;
    memcpy(tok, v, n);
    tok[n] = '\0';
    if (!s_num(tok, out))
        return false;
    *s = v + n + (v[n] == ',');
    return true;
}

/* A rotary setting as s_fmt_rope writes it, strictly, checked. */
static bool s_parse_rope(const char *s, kvedge_decoder_rope_t *r)
{
    memset(r, 0, sizeof *r);
    if (strcmp(s, "none") == 0)
        return true;
    const size_t len = strlen(s);
    if (len == 0 || s[len - 1] == ',')
        return false;
    r->rotary = true;
    if (!s_rope_item(&s, "theta", &r->theta))
        return false;
    if (*s) {
        if (strncmp(s, "llama3,", 7) != 0)
            return false;
        s += 7;
        r->llama3 = true;
        if (!s_rope_item(&s, "factor", &r->factor) ||
            !s_rope_item(&s, "low_freq_factor", &r->low_freq_factor) ||
            !s_rope_item(&s, "high_freq_factor", &r->high_freq_factor) ||
            !s_rope_item(&s, "original_max_position_embeddings", &r->original_max) || *s)
            return false;
    }
    return kvedge_decoder_rope_check(r) == KVEDGE_OK;
}

/* The metadata into info and from; 0, KVEDGE_ECORRUPT or KVEDGE_EVERSION with why. */
static int s_read_meta(const kvedge_safetensors_t *st, const char *path, kvedge_adapter_info_t *i,
                       int32_t **from, char *why, size_t why_len)
{
    static const char *const keys[] = {
        "format",        "version",     "kind",           "cloud_id",    "edge_id",
        "cloud_layers",  "cloud_heads", "cloud_head_dim", "edge_layers", "edge_heads",
        "edge_head_dim", "from",        "samples",        "ridge"};
    const char *v[sizeof keys / sizeof keys[0]];
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (!(v[k] = s_meta(st, path, keys[k], why, why_len)))
            return KVEDGE_ECORRUPT;
    if (strcmp(v[0], S_FORMAT) != 0) {
        s_why(why, why_len, "%s: format is not %s", path, S_FORMAT);
        return KVEDGE_ECORRUPT;
    }
    uint32_t ver;
    if (!s_u32(v[1], 0, UINT32_MAX, &ver)) {
        s_why(why, why_len, "%s: bad version '%.32s'", path, v[1]);
        return KVEDGE_ECORRUPT;
    }
    if (ver != S_VERSION) {
        s_why(why, why_len, "%s: format version %u, this reader knows %d", path, ver, S_VERSION);
        return KVEDGE_EVERSION;
    }
    memset(&i->cloud_rope, 0, sizeof i->cloud_rope); /* absent: not rotary */
    memset(&i->edge_rope, 0, sizeof i->edge_rope);
    {
        const char *rk[2] = {"cloud_rope", "edge_rope"};
        kvedge_decoder_rope_t *ro[2] = {&i->cloud_rope, &i->edge_rope};
        for (int k = 0; k < 2; k++) {
            const char *rv = kvedge_safetensors_metadata(st, rk[k]);
            if (rv && !s_parse_rope(rv, ro[k])) {
                s_why(why, why_len,
                      "%s: %s must be none, theta=T or theta=T,llama3,factor=F,"
                      "low_freq_factor=L,high_freq_factor=H,original_max_position_embeddings=M",
                      path, rk[k]);
                return KVEDGE_ECORRUPT;
            }
        }
    }
    const char *fit = kvedge_safetensors_metadata(st, "fit"); /* optional */
    if (fit && (strlen(fit) > KVEDGE_ADAPT_FIT_MAX_BYTES || !fit[0])) {
        s_why(why, why_len, "%s: fit must be 1..%u bytes of printable ASCII", path,
              KVEDGE_ADAPT_FIT_MAX_BYTES);
        return KVEDGE_ECORRUPT;
    }
    snprintf(i->fit, sizeof i->fit, "%s", fit ? fit : "");
    if (kvedge_adapt_kind_parse(v[2], &i->kind) != KVEDGE_OK) {
        s_why(why, why_len, "%s: kind must be linear or heads", path);
        return KVEDGE_ECORRUPT;
    }
    if (!kvedge_layermap_id_ok(v[3]) || !kvedge_layermap_id_ok(v[4])) {
        s_why(why, why_len, "%s: a model id is empty, over %u bytes or not one printable word",
              path, KVEDGE_LAYERMAP_ID_MAX_BYTES);
        return KVEDGE_ECORRUPT;
    }
    snprintf(i->cloud_id, sizeof i->cloud_id, "%s", v[3]);
    snprintf(i->edge_id, sizeof i->edge_id, "%s", v[4]);
    uint32_t *num[] = {&i->cloud_layers, &i->cloud_heads, &i->cloud_head_dim,
                       &i->edge_layers,  &i->edge_heads,  &i->edge_head_dim};
    for (int k = 0; k < 6; k++)
        if (!s_u32(v[5 + k], 1, UINT32_MAX, num[k])) {
            s_why(why, why_len, "%s: %s must be a positive decimal integer", path, keys[5 + k]);
            return KVEDGE_ECORRUPT;
        }
    if (!s_u32(v[12], 0, UINT32_MAX, &i->samples) || !s_num(v[13], &i->ridge)) {
        s_why(why, why_len, "%s: samples and ridge must be decimal numbers", path);
        return KVEDGE_ECORRUPT;
    }
    char reason[KVEDGE_LAYERMAP_WHY_BYTES];
    if (s_check_info(i, reason, sizeof reason) != KVEDGE_OK) {
        s_why(why, why_len, "%s: %s", path, reason);
        return KVEDGE_ECORRUPT;
    }
    *from = malloc(i->edge_layers * sizeof(int32_t));
    if (!*from)
        return KVEDGE_ENOMEM;
    if (!s_parse_from(v[11], i, *from)) {
        s_why(why, why_len,
              "%s: from must list %u edge layers, each -1 or a cloud layer 0..%u, with commas",
              path, i->edge_layers, i->cloud_layers - 1);
        return KVEDGE_ECORRUPT;
    }
    return KVEDGE_OK;
}

/* The tensors: exactly k.E and v.E of each mapped E, F32 [din + 1][dout], copied into w. */
static int s_read_tensors(const kvedge_safetensors_t *st, const char *path,
                          const kvedge_adapter_info_t *i, const int32_t *from, float **w, char *why,
                          size_t why_len)
{
    const size_t din = s_din(i), dout = s_dout(i);
    size_t want = 0;
    for (uint32_t e = 0; e < i->edge_layers; e++) {
        if (from[e] == KVEDGE_LAYERMAP_NONE)
            continue;
        want += 2;
        for (int t = 0; t < 2; t++) {
            char name[32];
            snprintf(name, sizeof name, "%c.%u", t ? 'v' : 'k', e);
            const kvedge_safetensors_tensor_t *x = kvedge_safetensors_find(st, name);
            if (!x) {
                s_why(why, why_len, "%s: tensor %s is missing (edge layer %u is mapped)", path,
                      name, e);
                return KVEDGE_ECORRUPT;
            }
            if (x->dtype != KVEDGE_SAFETENSORS_F32) {
                s_why(why, why_len, "%s: tensor %s is %s, not F32", path, name,
                      kvedge_safetensors_dtype_name(x->dtype));
                return KVEDGE_ECORRUPT;
            }
            if (x->ndim != 2 || x->shape[0] != din + 1 || x->shape[1] != dout) {
                s_why(why, why_len, "%s: tensor %s is not [%zu, %zu]", path, name, din + 1, dout);
                return KVEDGE_ESHAPE;
            }
            w[2 * e + t] = malloc(x->nbytes);
            if (!w[2 * e + t])
                return KVEDGE_ENOMEM;
            int rc = kvedge_safetensors_to_f32(x, w[2 * e + t], (size_t)x->numel);
            if (rc != KVEDGE_OK)
                return rc;
        }
    }
    const size_t count = kvedge_safetensors_count(st);
    if (count != want) {
        /* Name one that is not ours: anything but k.E and v.E of a mapped E, spelled so. */
        for (size_t k = 0; k < count; k++) {
            const char *name = kvedge_safetensors_at(st, k)->name;
            char t = 0, canon[32] = "";
            uint32_t e = 0;
            if (sscanf(name, "%c.%u", &t, &e) == 2 && e < i->edge_layers)
                snprintf(canon, sizeof canon, "%c.%u", t, e);
            if ((t == 'k' || t == 'v') && strcmp(canon, name) == 0 &&
                from[e] != KVEDGE_LAYERMAP_NONE)
                continue;
            s_why(why, why_len, "%s: tensor '%.64s' is not one of this adapter's", path, name);
            return KVEDGE_ECORRUPT;
        }
        s_why(why, why_len, "%s: %zu tensors, expected %zu", path, count, want);
        return KVEDGE_ECORRUPT;
    }
    return KVEDGE_OK;
}

int kvedge_adapter_load(const char *path, kvedge_adapter_t **out, char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (out)
        *out = NULL;
    if (!path || !out)
        return KVEDGE_EINVAL;
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    if (!st)
        return KVEDGE_ENOMEM;
    int rc = kvedge_safetensors_open(st, path);
    if (rc != KVEDGE_OK) {
        const char *e = kvedge_safetensors_error(st); /* some name the file already */
        if (strncmp(e, path, strlen(path)) == 0 && e[strlen(path)] == ':')
            s_why(why, why_len, "%s", e);
        else
            s_why(why, why_len, "%s: %s", path, e);
        kvedge_safetensors_destroy(&st);
        return rc;
    }
    kvedge_adapter_info_t info;
    memset(&info, 0, sizeof info);
    int32_t *from = NULL;
    float **w = NULL;
    rc = s_read_meta(st, path, &info, &from, why, why_len);
    if (rc == KVEDGE_OK) {
        w = calloc(2 * (size_t)info.edge_layers, sizeof *w);
        rc = w ? s_read_tensors(st, path, &info, from, w, why, why_len) : KVEDGE_ENOMEM;
    }
    if (rc == KVEDGE_OK) {
        char reason[KVEDGE_LAYERMAP_WHY_BYTES];
        rc = kvedge_adapter_make(&info, from, (const float *const *)w, out, reason, sizeof reason);
        if (rc == KVEDGE_ECORRUPT)
            s_why(why, why_len, "%s: %s", path, reason);
    }
    if (rc == KVEDGE_ENOMEM)
        s_why(why, why_len, "%s: out of memory", path);
    if (w)
        for (uint32_t e = 0; e < 2 * info.edge_layers; e++)
            free(w[e]);
    free(w);
    free(from);
    kvedge_safetensors_destroy(&st);
    return rc;
}
