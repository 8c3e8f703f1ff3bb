/* The GPU OPT decoder (gpu/opt.h) against the CPU reference decoder on fresh random tokens:
 * prefill logits and K/V, greedy tokens, a session over context K/V fetched from device buffers
 * or recomputed (MISS), and its error paths. The bridge and the no-device behaviour run
 * everywhere; the rest exits 77 without a device. Tolerances: docs/gpu.md, "GPU decoder". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clients/decoder/decoder.h"
#include "clients/decoder/decoder_gpu.h"
#include "gpu/gpu.h"
#include "gpu/opt.h"
#include "gpu/stage.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"

/* fp32 mode: max |gpu - cpu| / max |cpu| over the logits (and K/V). Only the summation order
 * differs (cuBLAS fp32 compute, no TF32): ~1e-6 is expected, 1e-3 leaves margin. */
#define S_TOL_FP32 1e-3
/* fp16 / bf16: ||gpu - cpu|| / ||cpu|| over the logits. The weights, the K/V cache and every
 * GEMM input are rounded to 11 (fp16) or 8 (bf16) significant bits, about 5e-4 and 4e-3 relative
 * per element; a few layers of such roundings give a few 1e-3 (fp16) and about 1e-2 (bf16). */
#define S_TOL_FP16 1e-2
#define S_TOL_BF16 3e-2
/* Greedy tokens in fp16/bf16: a near-tie may flip one token and the continuation with it, so
 * the check is the matched prefix over all prompts as a fraction of the tokens generated. */
#define S_GREEDY_MIN_FP16 0.75
#define S_GREEDY_MIN_BF16 0.60
#define S_GREEDY          16
#define S_PROMPTS         4

static uint64_t g_seed;
static char g_synth_path[256];
static kvedge_decoder_t *g_synth, *g_edge, *g_cloud;

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                   */

static double s_max_rel(const float *got, const float *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        md = d > md || isnan(d) ? d : md;
        mr = fabs(ref[i]) > mr ? fabs(ref[i]) : mr;
    }
    return mr > 0 ? md / mr : md;
}

static double s_l2_rel(const float *got, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double s_tol(kvedge_dtype_t dt)
{
    return dt == KVEDGE_DTYPE_FP32 ? S_TOL_FP32 : dt == KVEDGE_DTYPE_FP16 ? S_TOL_FP16 : S_TOL_BF16;
}

/* The error measure of a dtype: max-relative for fp32, relative L2 for fp16/bf16. */
static double s_err(kvedge_dtype_t dt, const float *got, const float *ref, size_t n)
{
    return dt == KVEDGE_DTYPE_FP32 ? s_max_rel(got, ref, n) : s_l2_rel(got, ref, n);
}

static const char *s_dt_name(kvedge_dtype_t dt)
{
    return dt == KVEDGE_DTYPE_FP32 ? "fp32" : dt == KVEDGE_DTYPE_FP16 ? "fp16" : "bf16";
}

static void s_tokens(kvedge_rng_t *r, uint32_t vocab, uint32_t n, int32_t *t)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = (int32_t)(kvedge_rng_next(r) % vocab);
}

static kvedge_gpu_opt_t *s_gpu_model(const kvedge_decoder_t *md, kvedge_dtype_t dt)
{
    kvedge_gpu_opt_weights_t w;
    assert_int_equal(kvedge_decoder_gpu_weights(md, &w), KVEDGE_OK);
    kvedge_gpu_opt_t *g = NULL;
    assert_int_equal(kvedge_gpu_opt_new(&w, dt, &g), KVEDGE_OK);
    kvedge_decoder_gpu_weights_free(&w);
    assert_non_null(g);
    return g;
}

static kvedge_decoder_t *s_load(const char *path)
{
    kvedge_decoder_t *md = kvedge_decoder_new();
    assert_non_null(md);
    if (kvedge_decoder_load(md, path, 0) != KVEDGE_OK)
        fail_msg("%s: %s", path, kvedge_decoder_error(md));
    return md;
}

/* Device copy of fp32 K/V [heads][n][hd] converted to dt, laid out [heads][cap][hd]; the rows
 * past n are NaN, so a read beyond the context shows in the logits. */
static void *s_upload_kv(const float *kv, uint32_t heads, uint32_t n, uint32_t cap, uint32_t hd,
                         kvedge_dtype_t dt)
{
    const size_t es = kvedge_dtype_size(dt), elems = (size_t)heads * cap * hd;
    float *f = malloc(elems * sizeof(float));
    void *b = malloc(elems * es);
    assert_non_null(f);
    assert_non_null(b);
    for (size_t i = 0; i < elems; i++)
        f[i] = NAN;
    for (uint32_t h = 0; h < heads; h++)
        memcpy(f + (size_t)h * cap * hd, kv + (size_t)h * n * hd, (size_t)n * hd * sizeof(float));
    kvedge_convert_from_f32(dt, f, elems, b);
    void *d = NULL;
    assert_int_equal(kvedge_gpu_dev_alloc(elems * es, &d), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_copy_h2d(d, b, elems * es, NULL), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_stream_sync(NULL), KVEDGE_OK);
    free(b);
    free(f);
    return d;
}

/* Device elements in dt back to fp32. */
static float *s_download(const void *dev, size_t elems, kvedge_dtype_t dt)
{
    const size_t es = kvedge_dtype_size(dt);
    void *b = malloc(elems * es);
    float *f = malloc(elems * sizeof(float));
    assert_non_null(b);
    assert_non_null(f);
    assert_int_equal(kvedge_gpu_copy_d2h(b, dev, elems * es, NULL), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_stream_sync(NULL), KVEDGE_OK);
    kvedge_convert_to_f32(dt, b, elems, f);
    free(b);
    return f;
}

/* ---------------------------------------------------------------------------------------- */
/* Providers                                                                                 */

/* The GPU session's: device K/V per layer, MISS for the layers in miss, an error at err_layer. */
typedef struct {
    void **k, **v; /* [layers] device */
    uint32_t layers;
    uint32_t miss; /* bit l: report layer l as MISS */
    int err;       /* returned at err_layer when non-zero */
    uint32_t err_layer;
    bool null_ptr;  /* return 0 with NULL pointers */
    uint32_t calls; /* layers asked, in order */
    bool in_order;
} s_gprov_t;

static int s_gprov(void *arg, uint32_t layer, const void **k, const void **v)
{
    s_gprov_t *p = arg;
    if (layer != p->calls)
        p->in_order = false;
    p->calls++;
    if (p->err && layer == p->err_layer)
        return p->err;
    if (p->miss & (1u << layer))
        return KVEDGE_GPU_OPT_MISS;
    *k = p->null_ptr ? NULL : p->k[layer];
    *v = p->null_ptr ? NULL : p->v[layer];
    return 0;
}

/* The CPU session's: copies fp32 K/V [layers][heads][n][hd]. */
typedef struct {
    const float *k, *v;
    size_t layer_floats;
} s_cprov_t;

static int s_cprov(void *arg, uint32_t layer, float *k, float *v)
{
    const s_cprov_t *p = arg;
    memcpy(k, p->k + layer * p->layer_floats, p->layer_floats * sizeof(float));
    memcpy(v, p->v + layer * p->layer_floats, p->layer_floats * sizeof(float));
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Everywhere: the bridge, and no device -> errors                                           */

static void test_bridge(void **state)
{
    (void)state;
    kvedge_gpu_opt_weights_t w;
    assert_int_equal(kvedge_decoder_gpu_weights(NULL, &w), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_gpu_weights(g_synth, NULL), KVEDGE_EINVAL);
    kvedge_decoder_t *empty = kvedge_decoder_new();
    assert_int_equal(kvedge_decoder_gpu_weights(empty, &w), KVEDGE_EINVAL);
    assert_null(w.layer);
    kvedge_decoder_destroy(&empty);
    kvedge_decoder_gpu_weights_free(NULL);

    assert_int_equal(kvedge_decoder_gpu_weights(g_synth, &w), KVEDGE_OK);
    const kvedge_decoder_config_t *c = kvedge_decoder_config(g_synth);
    assert_int_equal(w.cfg.layers, c->layers);
    assert_int_equal(w.cfg.heads, c->heads);
    assert_int_equal(w.cfg.head_dim, c->head_dim);
    assert_int_equal(w.cfg.hidden, c->hidden);
    assert_int_equal(w.cfg.ffn, c->ffn);
    assert_int_equal(w.cfg.vocab, c->vocab);
    assert_int_equal(w.cfg.max_positions, c->max_positions);
    assert_true(w.lm_head == w.embed_tokens); /* synthesized models are tied */
    assert_non_null(w.embed_positions);
    for (uint32_t l = 0; l < c->layers; l++)
        assert_true(w.layer[l].wq && w.layer[l].fc2_b && w.layer[l].ln2_w);
    /* Without a device (or CUDA) the GPU model cannot be made, cleanly. */
    if (kvedge_gpu_device_count() == 0) {
        kvedge_gpu_opt_t *g = (kvedge_gpu_opt_t *)&w; /* must be nulled */
        assert_int_equal(kvedge_gpu_opt_new(&w, KVEDGE_DTYPE_FP16, &g), KVEDGE_EINVAL);
        assert_null(g);
        kvedge_gpu_opt_session_t *s = NULL;
        assert_int_equal(kvedge_gpu_opt_session_new(NULL, &s), KVEDGE_EINVAL);
        assert_int_equal(kvedge_gpu_opt_prefill(NULL, NULL, 0, NULL, NULL, NULL), KVEDGE_EINVAL);
        kvedge_gpu_opt_destroy(NULL);
        kvedge_gpu_opt_destroy(&g);
        kvedge_gpu_opt_session_destroy(&s);
    }
    kvedge_decoder_gpu_weights_free(&w);
    assert_null(w.layer);
}

/* ---------------------------------------------------------------------------------------- */
/* On a device                                                                               */

/* (a) prefill logits and K/V against the CPU's, for n tokens. */
static void s_prefill_case(const char *name, const kvedge_decoder_t *md, kvedge_dtype_t dt,
                           uint32_t n, kvedge_rng_t *r)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    int32_t *t = malloc(n * sizeof(int32_t));
    s_tokens(r, c->vocab, n, t);
    const size_t kvf = kvedge_decoder_kv_floats(md, n);
    float *ref = malloc(c->vocab * sizeof(float)), *got = malloc(c->vocab * sizeof(float));
    float *rk = malloc(c->layers * kvf * sizeof(float)), *rv = malloc(c->layers * kvf * 4);
    assert_int_equal(kvedge_decoder_prefill(md, t, n, ref, rk, rv), KVEDGE_OK);

    kvedge_gpu_opt_t *g = s_gpu_model(md, dt);
    void **dk = calloc(c->layers, sizeof(void *)), **dv = calloc(c->layers, sizeof(void *));
    for (uint32_t l = 0; l < c->layers; l++) {
        assert_int_equal(kvedge_gpu_dev_alloc(kvf * kvedge_dtype_size(dt), &dk[l]), KVEDGE_OK);
        assert_int_equal(kvedge_gpu_dev_alloc(kvf * kvedge_dtype_size(dt), &dv[l]), KVEDGE_OK);
    }
    assert_int_equal(kvedge_gpu_opt_prefill(g, t, n, got, dk, dv), KVEDGE_OK);
    const double e = s_err(dt, got, ref, c->vocab);
    double ek = 0;
    for (uint32_t l = 0; l < c->layers; l++) {
        float *k = s_download(dk[l], kvf, dt), *v = s_download(dv[l], kvf, dt);
        double a = s_err(dt, k, rk + l * kvf, kvf), b = s_err(dt, v, rv + l * kvf, kvf);
        ek = a > ek ? a : ek;
        ek = b > ek ? b : ek;
        free(k);
        free(v);
    }
    printf("prefill %-6s %s n=%u: logits err %.2e, K/V err %.2e (tol %.0e)\n", name, s_dt_name(dt),
           n, e, ek, s_tol(dt));
    assert_true(e <= s_tol(dt));
    assert_true(ek <= s_tol(dt));

    /* A second prefill without K/V out gives the same logits (scratch reuse). */
    float *again = malloc(c->vocab * sizeof(float));
    assert_int_equal(kvedge_gpu_opt_prefill(g, t, n, again, NULL, NULL), KVEDGE_OK);
    assert_true(s_max_rel(again, got, c->vocab) <= 1e-6);
    free(again);
    for (uint32_t l = 0; l < c->layers; l++) {
        kvedge_gpu_dev_free(dk[l]);
        kvedge_gpu_dev_free(dv[l]);
    }
    free(dk);
    free(dv);
    kvedge_gpu_opt_destroy(&g);
    assert_null(g);
    free(rk);
    free(rv);
    free(got);
    free(ref);
    free(t);
}

static void test_prefill_fp32(void **state)
{
    (void)state;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, g_seed + 1);
    s_prefill_case("synth", g_synth, KVEDGE_DTYPE_FP32, 1, &r);
    s_prefill_case("synth", g_synth, KVEDGE_DTYPE_FP32, 37, &r);
    s_prefill_case("synth", g_synth, KVEDGE_DTYPE_FP32, 130, &r);
    s_prefill_case("edge", g_edge, KVEDGE_DTYPE_FP32, 64, &r);
    s_prefill_case("edge", g_edge, KVEDGE_DTYPE_FP32, 300, &r);
    s_prefill_case("cloud", g_cloud, KVEDGE_DTYPE_FP32, 200, &r);
}

static void test_prefill_half(void **state)
{
    (void)state;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, g_seed + 2);
    const kvedge_dtype_t dts[2] = {KVEDGE_DTYPE_FP16, KVEDGE_DTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        s_prefill_case("synth", g_synth, dts[i], 37, &r);
        s_prefill_case("edge", g_edge, dts[i], 64, &r);
        s_prefill_case("edge", g_edge, dts[i], 300, &r);
        s_prefill_case("cloud", g_cloud, dts[i], 200, &r);
    }
}

/* Matched prefix of two token sequences. */
static uint32_t s_prefix(const int32_t *a, const int32_t *b, uint32_t n)
{
    uint32_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* (b) greedy tokens, no context: GPU session vs CPU session. Returns the matched fraction. */
static double s_greedy_case(const char *name, const kvedge_decoder_t *md, kvedge_dtype_t dt,
                            kvedge_rng_t *r)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    kvedge_gpu_opt_t *g = s_gpu_model(md, dt);
    kvedge_gpu_opt_session_t *gs = NULL;
    assert_int_equal(kvedge_gpu_opt_session_new(g, &gs), KVEDGE_OK);
    kvedge_decoder_session_t *cs = kvedge_decoder_session_new(md);
    assert_non_null(cs);
    float *ref = malloc(c->vocab * sizeof(float)), *got = malloc(c->vocab * sizeof(float));
    static const uint32_t lens[S_PROMPTS] = {5, 12, 23, 40};
    uint32_t matched = 0;
    double worst = 0;
    for (int p = 0; p < S_PROMPTS; p++) {
        int32_t prompt[40], want[S_GREEDY], have[S_GREEDY];
        s_tokens(r, c->vocab, lens[p], prompt);
        assert_int_equal(
            kvedge_decoder_session_begin(cs, NULL, 0, NULL, NULL, prompt, lens[p], S_GREEDY, ref),
            KVEDGE_OK);
        assert_int_equal(kvedge_gpu_opt_session_begin(gs, NULL, prompt, lens[p], S_GREEDY, got),
                         KVEDGE_OK);
        const double e = s_err(dt, got, ref, c->vocab);
        worst = e > worst ? e : worst;
        assert_int_equal(kvedge_decoder_session_generate(cs, S_GREEDY, want), KVEDGE_OK);
        assert_int_equal(kvedge_gpu_opt_session_generate(gs, S_GREEDY, have), KVEDGE_OK);
        matched += s_prefix(want, have, S_GREEDY);
        /* Past max_new: no room. */
        assert_int_equal(kvedge_gpu_opt_session_step(gs, 0, NULL), KVEDGE_ENOSPACE);
    }
    const double frac = (double)matched / (S_PROMPTS * S_GREEDY);
    printf("greedy  %-6s %s: %u/%u tokens match, prompt logits err %.2e (tol %.0e)\n", name,
           s_dt_name(dt), matched, S_PROMPTS * S_GREEDY, worst, s_tol(dt));
    assert_true(worst <= s_tol(dt));
    free(got);
    free(ref);
    kvedge_decoder_session_destroy(&cs);
    kvedge_gpu_opt_session_destroy(&gs);
    assert_null(gs);
    kvedge_gpu_opt_destroy(&g);
    return frac;
}

static void test_greedy(void **state)
{
    (void)state;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, g_seed + 3);
    assert_true(s_greedy_case("edge", g_edge, KVEDGE_DTYPE_FP32, &r) == 1.0);
    assert_true(s_greedy_case("cloud", g_cloud, KVEDGE_DTYPE_FP32, &r) == 1.0);
    assert_true(s_greedy_case("edge", g_edge, KVEDGE_DTYPE_FP16, &r) >= S_GREEDY_MIN_FP16);
    assert_true(s_greedy_case("cloud", g_cloud, KVEDGE_DTYPE_FP16, &r) >= S_GREEDY_MIN_FP16);
    assert_true(s_greedy_case("edge", g_edge, KVEDGE_DTYPE_BF16, &r) >= S_GREEDY_MIN_BF16);
    assert_true(s_greedy_case("cloud", g_cloud, KVEDGE_DTYPE_BF16, &r) >= S_GREEDY_MIN_BF16);
}

/* A context's K/V computed on the CPU, on the device in dt with a row stride of len + 3. */
typedef struct {
    uint32_t len, cap, layers;
    int32_t *tokens;
    float *k, *v; /* CPU [layers][heads][len][hd] */
    void **dk, **dv;
} s_ctx_t;

static void s_ctx_make(s_ctx_t *x, const kvedge_decoder_t *md, kvedge_dtype_t dt, uint32_t len,
                       kvedge_rng_t *r)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    const size_t kvf = kvedge_decoder_kv_floats(md, len);
    x->len = len;
    x->cap = len + 3;
    x->layers = c->layers;
    x->tokens = malloc(len * sizeof(int32_t));
    x->k = malloc(c->layers * kvf * sizeof(float));
    x->v = malloc(c->layers * kvf * sizeof(float));
    x->dk = calloc(c->layers, sizeof(void *));
    x->dv = calloc(c->layers, sizeof(void *));
    s_tokens(r, c->vocab, len, x->tokens);
    assert_int_equal(kvedge_decoder_prefill(md, x->tokens, len, NULL, x->k, x->v), KVEDGE_OK);
    for (uint32_t l = 0; l < c->layers; l++) {
        x->dk[l] = s_upload_kv(x->k + l * kvf, c->heads, len, x->cap, c->head_dim, dt);
        x->dv[l] = s_upload_kv(x->v + l * kvf, c->heads, len, x->cap, c->head_dim, dt);
    }
}

static void s_ctx_free(s_ctx_t *x)
{
    for (uint32_t l = 0; l < x->layers; l++) {
        kvedge_gpu_dev_free(x->dk[l]);
        kvedge_gpu_dev_free(x->dv[l]);
    }
    free(x->dk);
    free(x->dv);
    free(x->k);
    free(x->v);
    free(x->tokens);
}

/* (c) and (d): decode over context K/V against the CPU session; then the same with MISS layers
 * against the all-fetched GPU run. */
static void s_session_case(const char *name, const kvedge_decoder_t *md, kvedge_dtype_t dt,
                           uint32_t ctx_len, uint32_t plen, kvedge_rng_t *r)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    s_ctx_t x;
    s_ctx_make(&x, md, dt, ctx_len, r);
    int32_t prompt[64];
    assert_true(plen <= 64);
    s_tokens(r, c->vocab, plen, prompt);
    float *ref = malloc(c->vocab * sizeof(float)), *got = malloc(c->vocab * sizeof(float));
    float *fetched = malloc(c->vocab * sizeof(float));

    kvedge_decoder_session_t *cs = kvedge_decoder_session_new(md);
    s_cprov_t cp = {x.k, x.v, kvedge_decoder_kv_floats(md, ctx_len)};
    assert_int_equal(kvedge_decoder_session_begin(cs, x.tokens, ctx_len, s_cprov, &cp, prompt, plen,
                                                  S_GREEDY, ref),
                     KVEDGE_OK);
    int32_t want[S_GREEDY], have[S_GREEDY], have_miss[S_GREEDY];
    assert_int_equal(kvedge_decoder_session_generate(cs, S_GREEDY, want), KVEDGE_OK);

    kvedge_gpu_opt_t *g = s_gpu_model(md, dt);
    kvedge_gpu_opt_session_t *gs = NULL;
    assert_int_equal(kvedge_gpu_opt_session_new(g, &gs), KVEDGE_OK);
    assert_non_null(kvedge_gpu_opt_session_stream(gs));
    s_gprov_t gp = {.k = x.dk, .v = x.dv, .layers = c->layers, .in_order = true};
    kvedge_gpu_opt_ctx_t ctx = {x.tokens, ctx_len, x.cap, s_gprov, &gp};
    assert_int_equal(kvedge_gpu_opt_session_begin(gs, &ctx, prompt, plen, S_GREEDY, got),
                     KVEDGE_OK);
    assert_int_equal(gp.calls, c->layers);
    assert_true(gp.in_order);
    const double e = s_err(dt, got, ref, c->vocab);
    memcpy(fetched, got, c->vocab * sizeof(float));
    assert_int_equal(kvedge_gpu_opt_session_generate(gs, S_GREEDY, have), KVEDGE_OK);
    const uint32_t m = s_prefix(want, have, S_GREEDY);
    printf("session %-6s %s ctx=%u prompt=%u: logits err %.2e (tol %.0e), %u/%u tokens match\n",
           name, s_dt_name(dt), ctx_len, plen, e, s_tol(dt), m, S_GREEDY);
    assert_true(e <= s_tol(dt));
    if (dt == KVEDGE_DTYPE_FP32)
        assert_int_equal(m, S_GREEDY);

    /* (d) MISS patterns: the first layer, every other layer, the last, all of them. */
    const uint32_t all = c->layers >= 32 ? 0xFFFFFFFFu : (1u << c->layers) - 1;
    const uint32_t masks[4] = {1u, 0x55555555u & all, 1u << (c->layers - 1), all};
    for (int i = 0; i < 4; i++) {
        s_gprov_t mp = {
            .k = x.dk, .v = x.dv, .layers = c->layers, .miss = masks[i], .in_order = true};
        ctx.arg = &mp;
        assert_int_equal(kvedge_gpu_opt_session_begin(gs, &ctx, prompt, plen, S_GREEDY, got),
                         KVEDGE_OK);
        assert_int_equal(mp.calls, c->layers);
        /* Recomputed K/V against fetched K/V: the CPU's rounded to dt, so the fp16/bf16
         * tolerance; fp32 is the same up to summation order. */
        const double em = s_err(dt, got, fetched, c->vocab);
        assert_int_equal(kvedge_gpu_opt_session_generate(gs, S_GREEDY, have_miss), KVEDGE_OK);
        const uint32_t mm = s_prefix(have, have_miss, S_GREEDY);
        printf("  miss mask 0x%x: logits vs fetched %.2e, %u/%u tokens match\n", masks[i], em, mm,
               S_GREEDY);
        assert_true(em <= s_tol(dt));
        if (dt == KVEDGE_DTYPE_FP32)
            assert_int_equal(mm, S_GREEDY);
    }
    kvedge_gpu_opt_session_destroy(&gs);
    kvedge_gpu_opt_destroy(&g);
    kvedge_decoder_session_destroy(&cs);
    free(fetched);
    free(got);
    free(ref);
    s_ctx_free(&x);
}

static void test_session(void **state)
{
    (void)state;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, g_seed + 4);
    s_session_case("synth", g_synth, KVEDGE_DTYPE_FP32, 50, 7, &r);
    s_session_case("edge", g_edge, KVEDGE_DTYPE_FP32, 200, 16, &r);
    s_session_case("cloud", g_cloud, KVEDGE_DTYPE_FP32, 130, 9, &r);
    s_session_case("edge", g_edge, KVEDGE_DTYPE_FP16, 200, 16, &r);
    s_session_case("cloud", g_cloud, KVEDGE_DTYPE_FP16, 130, 9, &r);
    s_session_case("edge", g_edge, KVEDGE_DTYPE_BF16, 200, 16, &r);
    s_session_case("cloud", g_cloud, KVEDGE_DTYPE_BF16, 1, 1, &r);
}

/* (e) bad input: clean errors, nothing aborts, the session works afterwards. */
static void test_errors(void **state)
{
    (void)state;
    const kvedge_decoder_t *md = g_edge;
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    kvedge_gpu_opt_weights_t w;
    assert_int_equal(kvedge_decoder_gpu_weights(md, &w), KVEDGE_OK);
    kvedge_gpu_opt_t *g = NULL;
    assert_int_equal(kvedge_gpu_opt_new(NULL, KVEDGE_DTYPE_FP16, &g), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_new(&w, KVEDGE_DTYPE_FP16, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_new(&w, (kvedge_dtype_t)0, &g), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_new(&w, (kvedge_dtype_t)4, &g), KVEDGE_EINVAL);
    assert_null(g);
    kvedge_gpu_opt_weights_t bad = w;
    bad.embed_positions = NULL;
    assert_int_equal(kvedge_gpu_opt_new(&bad, KVEDGE_DTYPE_FP16, &g), KVEDGE_EINVAL);
    bad = w;
    bad.cfg.head_dim++; /* heads * head_dim != hidden */
    assert_int_equal(kvedge_gpu_opt_new(&bad, KVEDGE_DTYPE_FP16, &g), KVEDGE_EINVAL);
    bad = w;
    bad.cfg.layers = 0;
    assert_int_equal(kvedge_gpu_opt_new(&bad, KVEDGE_DTYPE_FP16, &g), KVEDGE_EINVAL);

    /* A gigantic model (~6.7e12 bytes in fp16): refused before any weight is read. */
    static const float dummy[4];
    kvedge_gpu_opt_layer_t *gl = malloc(1000 * sizeof *gl);
    for (int l = 0; l < 1000; l++)
        gl[l] = (kvedge_gpu_opt_layer_t){dummy, dummy, dummy, dummy, dummy, dummy, dummy, dummy,
                                         dummy, dummy, dummy, dummy, dummy, dummy, dummy, dummy};
    kvedge_gpu_opt_weights_t big = {
        {1000, 128, 128, 16384, 65536, 50272, 2048}, dummy, dummy, dummy, dummy, dummy, gl};
    int rc = kvedge_gpu_opt_new(&big, KVEDGE_DTYPE_FP16, &g);
    assert_true(rc == KVEDGE_ENOMEM || rc == KVEDGE_EINVAL);
    assert_null(g);
    free(gl);

    assert_int_equal(kvedge_gpu_opt_new(&w, KVEDGE_DTYPE_FP16, &g), KVEDGE_OK);
    kvedge_decoder_gpu_weights_free(&w);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *logits = malloc(c->vocab * sizeof(float));
    void *one[1] = {logits};
    assert_int_equal(kvedge_gpu_opt_prefill(NULL, t, 8, logits, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_prefill(g, NULL, 8, logits, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_prefill(g, t, 0, logits, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_prefill(g, t, 8, logits, one, NULL), KVEDGE_EINVAL);
    int32_t *longt = calloc(c->max_positions + 1, sizeof(int32_t));
    assert_int_equal(kvedge_gpu_opt_prefill(g, longt, c->max_positions + 1, logits, NULL, NULL),
                     KVEDGE_ETOOBIG);
    t[3] = (int32_t)c->vocab;
    assert_int_equal(kvedge_gpu_opt_prefill(g, t, 8, logits, NULL, NULL), KVEDGE_EINVAL);
    t[3] = -1;
    assert_int_equal(kvedge_gpu_opt_prefill(g, t, 8, logits, NULL, NULL), KVEDGE_EINVAL);
    t[3] = 4;
    assert_int_equal(kvedge_gpu_opt_prefill(g, t, 8, logits, NULL, NULL), KVEDGE_OK);

    kvedge_gpu_opt_session_t *s = NULL;
    assert_int_equal(kvedge_gpu_opt_session_new(NULL, &s), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_session_new(g, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_session_new(g, &s), KVEDGE_OK);
    assert_null(kvedge_gpu_opt_session_stream(NULL));
    /* Not begun. */
    int32_t out[4];
    assert_int_equal(kvedge_gpu_opt_session_step(s, 1, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_session_generate(s, 1, out), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_session_begin(NULL, NULL, t, 8, 4, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_session_begin(s, NULL, NULL, 8, 4, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_session_begin(s, NULL, t, 0, 4, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_session_begin(s, NULL, t, 8, c->max_positions, NULL),
                     KVEDGE_ETOOBIG);

    kvedge_rng_t r;
    kvedge_rng_seed(&r, g_seed + 5);
    s_ctx_t x;
    s_ctx_make(&x, md, KVEDGE_DTYPE_FP16, 40, &r);
    s_gprov_t gp = {.k = x.dk, .v = x.dv, .layers = c->layers, .in_order = true};
    kvedge_gpu_opt_ctx_t ctx = {x.tokens, x.len, x.cap, s_gprov, &gp};
    kvedge_gpu_opt_ctx_t bc = ctx;
    bc.tokens = longt;
    bc.len = c->max_positions; /* context over max_positions with the prompt */
    bc.cap = 0;
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &bc, t, 8, 0, NULL), KVEDGE_ETOOBIG);
    bc = ctx;
    bc.len = 0;
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &bc, t, 8, 0, NULL), KVEDGE_EINVAL);
    bc = ctx;
    bc.cap = ctx.len - 1;
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &bc, t, 8, 0, NULL), KVEDGE_EINVAL);
    bc = ctx;
    bc.provider = NULL;
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &bc, t, 8, 0, NULL), KVEDGE_EINVAL);
    bc = ctx;
    bc.tokens = NULL;
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &bc, t, 8, 0, NULL), KVEDGE_EINVAL);
    x.tokens[5] = (int32_t)c->vocab;
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &ctx, t, 8, 0, NULL), KVEDGE_EINVAL);
    x.tokens[5] = 0;
    assert_int_equal(gp.calls, 0); /* nothing was asked on an argument error */

    /* The provider's error aborts the begin with its code; the session must be begun again. */
    gp.err = KVEDGE_ETIMEDOUT;
    gp.err_layer = c->layers - 1;
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &ctx, t, 8, 4, logits), KVEDGE_ETIMEDOUT);
    assert_int_equal(kvedge_gpu_opt_session_step(s, 1, NULL), KVEDGE_EINVAL);
    gp.err = 7; /* neither 0, MISS nor an error */
    gp.err_layer = 0;
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &ctx, t, 8, 4, logits), KVEDGE_EINVAL);
    gp.err = 0;
    gp.null_ptr = true;
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &ctx, t, 8, 4, logits), KVEDGE_EINVAL);
    gp.null_ptr = false;
    /* And it works again, with a bad step token refused and the session still usable. */
    assert_int_equal(kvedge_gpu_opt_session_begin(s, &ctx, t, 8, 4, logits), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_opt_session_step(s, (int32_t)c->vocab, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_session_step(s, -3, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_opt_session_generate(s, 4, out), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_opt_session_step(s, 1, NULL), KVEDGE_ENOSPACE);
    for (int i = 0; i < 4; i++)
        assert_true(out[i] >= 0 && (uint32_t)out[i] < c->vocab);

    s_ctx_free(&x);
    free(longt);
    free(logits);
    kvedge_gpu_opt_session_destroy(&s);
    kvedge_gpu_opt_session_destroy(&s); /* idempotent */
    kvedge_gpu_opt_destroy(&g);
    kvedge_gpu_opt_destroy(&g);
    assert_null(g);
}

/* ---------------------------------------------------------------------------------------- */

static int s_setup(void **state)
{
    (void)state;
    const char *env = getenv("KVEDGE_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (KVEDGE_TEST_SEED to repeat)\n", (unsigned long long)g_seed);
    /* An odd small shape: 3 layers, 5 heads of 24, ffn 200, vocab 301. */
    kvedge_decoder_config_t sc = {3, 5, 24, 120, 200, 301, 256, 5};
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_synth_path, sizeof g_synth_path, "%s/test_gpu_decoder_%d.safetensors", tmp,
             (int)getpid());
    if (kvedge_decoder_synthesize(g_synth_path, &sc, g_seed, false) != KVEDGE_OK)
        return -1;
    g_synth = s_load(g_synth_path);
    char path[512];
    snprintf(path, sizeof path, "%s/kjv/edge/model.safetensors", KVEDGE_MODELS);
    g_edge = s_load(path);
    snprintf(path, sizeof path, "%s/kjv/cloud/model.safetensors", KVEDGE_MODELS);
    g_cloud = s_load(path);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    kvedge_decoder_destroy(&g_synth);
    kvedge_decoder_destroy(&g_edge);
    kvedge_decoder_destroy(&g_cloud);
    unlink(g_synth_path);
    return 0;
}

int main(void)
{
    const struct CMUnitTest everywhere[] = {
        cmocka_unit_test(test_bridge),
    };
    int rc = cmocka_run_group_tests(everywhere, s_setup, s_teardown);
    if (rc != 0)
        return rc;
    if (kvedge_gpu_device_count() == 0)
        return 77;
    const struct CMUnitTest device[] = {
        cmocka_unit_test(test_prefill_fp32), cmocka_unit_test(test_prefill_half),
        cmocka_unit_test(test_greedy),       cmocka_unit_test(test_session),
        cmocka_unit_test(test_errors),
    };
    rc = cmocka_run_group_tests(device, s_setup, s_teardown);
    if (rc != 0)
        return rc;
    /* Again with attention in chunks of a few query rows (5000 scores at once). */
    setenv(KVEDGE_GPU_OPT_SCORE_ELEMS_ENV, "5000", 1);
    const struct CMUnitTest chunked[] = {
        cmocka_unit_test(test_prefill_fp32),
        cmocka_unit_test(test_prefill_half),
        cmocka_unit_test(test_session),
    };
    return cmocka_run_group_tests(chunked, s_setup, s_teardown);
}
