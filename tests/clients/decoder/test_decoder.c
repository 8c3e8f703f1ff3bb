/* Tests of the reference OPT decoder: against logits computed by PyTorch (tests/fixtures, made
 * by scripts/opt_reference.py), decoding over fetched context K/V against full recomputation,
 * quantized context K/V, MISS layers, load and argument errors; model shapes, synthetic
 * checkpoints, flop counts and time estimates (clients/decoder_model.c). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>
#include <cmocka.h>

#include "clients/decoder/decoder.h"
#include "clients/decoder/safetensors.h"
#include "access/codec/block.h"
#include "access/codec/error.h"

#define S_MODEL    KVEDGE_FIXTURES "/opt_tiny.safetensors"
#define S_EXPECTED KVEDGE_FIXTURES "/opt_tiny_expected.safetensors"

/* Against PyTorch: two fp32 implementations with different summation orders. Logits of the
 * fixture are O(1); measured differences are ~1e-6. */
#define S_TOL_TORCH 1e-4f
/* Fetched lossless context vs recomputing it: same math, merged by log-sum-exp instead of one
 * softmax, so only fp32 rounding differs. */
#define S_TOL_LOSSLESS 1e-5f
/* MISS recomputation runs exactly the prefill's operations on the same shapes. */
#define S_TOL_MISS 1e-6f
/* Quantized context K/V (per head per layer through the block codec): max |logit error|.
 * Measured int8 4.5e-3 and int4 6.6e-2 on this model (see the printed values); bounds have
 * margin. */
#define S_TOL_INT8 2e-2f
#define S_TOL_INT4 2.5e-1f

#define S_CTX      96 /* context tokens in the C-only tests */
#define S_PROMPT   16 /* local prompt tokens in the C-only tests */
#define S_GREEDY   8
#define S_MAXLAYER 16

/* ---- helpers ------------------------------------------------------------------------- */

static float s_max_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) /* NaN counts as infinitely wrong */
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static float s_max_abs(const float *a, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabsf(a[i]) > m ? fabsf(a[i]) : m;
    return m;
}

static int32_t s_argmax(const float *a, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (a[i] > a[best])
            best = i;
    return (int32_t)best;
}

/* Deterministic token ids for the C-only tests. */
static void s_tokens(int32_t *t, uint32_t n, uint32_t vocab, uint32_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((x >> 33) % vocab);
    }
}

static kvedge_decoder_t *s_model(void)
{
    kvedge_decoder_t *md = kvedge_decoder_new();
    assert_non_null(md);
    int rc = kvedge_decoder_load(md, S_MODEL, 0);
    if (rc != KVEDGE_OK)
        fail_msg("load %s: %s (%s)", S_MODEL, kvedge_strerror(rc), kvedge_decoder_error(md));
    return md;
}

/* A tensor of the expected-output fixture as fp32; caller frees. */
static float *s_expected(const kvedge_safetensors_t *st, const char *name, size_t *n)
{
    const kvedge_safetensors_tensor_t *t = kvedge_safetensors_find(st, name);
    assert_non_null(t);
    float *f = malloc(t->numel * sizeof(float));
    assert_non_null(f);
    assert_int_equal(kvedge_safetensors_to_f32(t, f, t->numel), KVEDGE_OK);
    *n = t->numel;
    return f;
}

/* A context K/V provider: serves layers from k/v, answers MISS for layers in miss_mask (after
 * filling the buffers with NaN, which the decoder must overwrite), or fails at fail_layer. */
typedef struct {
    const float *k, *v; /* [layers][heads][ctx][head_dim] */
    size_t kvf;         /* floats per layer */
    uint32_t miss_mask;
    int fail_layer; /* -1: never */
    int fail_rc;
    uint32_t calls;
    uint32_t order[S_MAXLAYER];
} s_provider_t;

static int s_provide(void *arg, uint32_t layer, float *k, float *v)
{
    s_provider_t *p = arg;
    if (p->calls < S_MAXLAYER)
        p->order[p->calls] = layer;
    p->calls++;
    if ((int)layer == p->fail_layer)
        return p->fail_rc;
    if (p->miss_mask & (1u << layer)) {
        for (size_t i = 0; i < p->kvf; i++)
            k[i] = v[i] = NAN;
        return KVEDGE_DECODER_MISS;
    }
    memcpy(k, p->k + layer * p->kvf, p->kvf * sizeof(float));
    memcpy(v, p->v + layer * p->kvf, p->kvf * sizeof(float));
    return 0;
}

/* The context's K/V by prefill; caller frees both. */
static void s_context_kv(const kvedge_decoder_t *md, const int32_t *ctx, uint32_t n, float **k,
                         float **v)
{
    size_t all = kvedge_decoder_config(md)->layers * kvedge_decoder_kv_floats(md, n);
    *k = malloc(all * sizeof(float));
    *v = malloc(all * sizeof(float));
    assert_non_null(*k);
    assert_non_null(*v);
    assert_int_equal(kvedge_decoder_prefill(md, ctx, n, NULL, *k, *v), KVEDGE_OK);
}

/* Begins a decode over ctx (served by p, or computed when p is NULL: then ctx and prompt run
 * as one local prompt), checks the provider saw every layer in order, generates S_GREEDY
 * tokens and returns the logits after begin and after each generated token. */
static void s_decode(const kvedge_decoder_t *md, const int32_t *ctx, uint32_t ctx_len,
                     s_provider_t *p, const int32_t *prompt, uint32_t prompt_len, float *logits,
                     int32_t *greedy)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(md);
    assert_non_null(s);
    int rc;
    if (p) {
        rc = kvedge_decoder_session_begin(s, ctx, ctx_len, s_provide, p, prompt, prompt_len,
                                          S_GREEDY, logits);
        assert_int_equal(p->calls, c->layers);
        for (uint32_t l = 0; l < c->layers; l++)
            assert_int_equal(p->order[l], l);
    } else {
        int32_t *all = malloc((ctx_len + prompt_len) * sizeof(int32_t));
        memcpy(all, ctx, ctx_len * sizeof(int32_t));
        memcpy(all + ctx_len, prompt, prompt_len * sizeof(int32_t));
        rc = kvedge_decoder_session_begin(s, NULL, 0, NULL, NULL, all, ctx_len + prompt_len,
                                          S_GREEDY, logits);
        free(all);
    }
    assert_int_equal(rc, KVEDGE_OK);
    for (uint32_t i = 0; i < S_GREEDY; i++) {
        greedy[i] = s_argmax(kvedge_decoder_session_logits(s), c->vocab);
        assert_int_equal(kvedge_decoder_session_step(s, greedy[i], logits + (i + 1) * c->vocab),
                         KVEDGE_OK);
    }
    assert_int_equal(kvedge_decoder_session_local_tokens(s),
                     (p ? 0 : ctx_len) + prompt_len + S_GREEDY);
    assert_int_equal(kvedge_decoder_session_step(s, 0, NULL), KVEDGE_ENOSPACE);
    kvedge_decoder_session_destroy(&s);
    assert_null(s);
}

/* ---- against PyTorch ----------------------------------------------------------------- */

static void test_fixture_config(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    assert_int_equal(c->layers, 3);
    assert_int_equal(c->heads, 4); /* from __metadata__ */
    assert_int_equal(c->head_dim, 16);
    assert_int_equal(c->hidden, 64);
    assert_int_equal(c->ffn, 256);
    assert_int_equal(c->vocab, 256);
    assert_int_equal(c->max_positions, 160);
    assert_int_equal(kvedge_decoder_kv_floats(md, 10), 4 * 10 * 16);
    assert_string_equal(kvedge_decoder_error(md), "");
    assert_int_equal(kvedge_decoder_load(md, S_MODEL, 0), KVEDGE_EINVAL); /* once only */
    kvedge_decoder_destroy(&md);
    assert_null(md);
    kvedge_decoder_destroy(&md);
    kvedge_decoder_destroy(NULL);
}

static void test_fixture_prefill(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const uint32_t V = kvedge_decoder_config(md)->vocab;
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    assert_int_equal(kvedge_safetensors_open(st, S_EXPECTED), KVEDGE_OK);
    size_t nt, nl;
    float *ft = s_expected(st, "prefill.tokens", &nt);
    float *want = s_expected(st, "prefill.logits", &nl);
    assert_int_equal(nl, nt * V);
    int32_t tokens[64];
    assert_true(nt <= 64);
    for (size_t i = 0; i < nt; i++)
        tokens[i] = (int32_t)ft[i];

    /* Every prefix length's last logits against the matching row of PyTorch's. */
    float *got = malloc(V * sizeof(float));
    float worst = 0;
    for (uint32_t n = 1; n <= nt; n++) {
        assert_int_equal(kvedge_decoder_prefill(md, tokens, n, got, NULL, NULL), KVEDGE_OK);
        float d = s_max_diff(got, want + (size_t)(n - 1) * V, V);
        worst = d > worst ? d : worst;
    }
    printf("  prefill vs PyTorch, %zu prefix lengths: max |logit diff| = %.3g (tol %.0e), "
           "max |logit| = %.3g\n",
           nt, worst, S_TOL_TORCH, s_max_abs(want, nl));
    assert_true(worst <= S_TOL_TORCH);

    /* The check has teeth: the same weights split into 2 heads are a different model. */
    kvedge_decoder_t *two = kvedge_decoder_new();
    assert_int_equal(kvedge_decoder_load(two, S_MODEL, 2), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_config(two)->head_dim, 32);
    assert_int_equal(kvedge_decoder_prefill(two, tokens, (uint32_t)nt, got, NULL, NULL), KVEDGE_OK);
    assert_true(s_max_diff(got, want + (nt - 1) * V, V) > 1e-2f);
    kvedge_decoder_destroy(&two);

    free(got);
    free(want);
    free(ft);
    kvedge_safetensors_destroy(&st);
    kvedge_decoder_destroy(&md);
}

static void test_fixture_greedy(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const uint32_t V = kvedge_decoder_config(md)->vocab;
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    assert_int_equal(kvedge_safetensors_open(st, S_EXPECTED), KVEDGE_OK);
    size_t nt, ng, ngl;
    float *ft = s_expected(st, "prefill.tokens", &nt);
    float *gt = s_expected(st, "greedy.tokens", &ng);
    float *gl = s_expected(st, "greedy.logits", &ngl);
    assert_int_equal(ng, S_GREEDY);
    assert_int_equal(ngl, S_GREEDY * V);
    int32_t tokens[64];
    for (size_t i = 0; i < nt; i++)
        tokens[i] = (int32_t)ft[i];

    /* Two ways: all 40 tokens local, and the first 24 as fetched context K/V. */
    const uint32_t splits[] = {0, 24};
    float *logits = malloc((S_GREEDY + 1) * V * sizeof(float));
    for (size_t si = 0; si < 2; si++) {
        uint32_t cl = splits[si];
        float *ck = NULL, *cv = NULL;
        s_provider_t p = {.fail_layer = -1};
        if (cl) {
            s_context_kv(md, tokens, cl, &ck, &cv);
            p.k = ck, p.v = cv, p.kvf = kvedge_decoder_kv_floats(md, cl);
        }
        int32_t greedy[S_GREEDY];
        s_decode(md, tokens, cl, cl ? &p : NULL, tokens + cl, (uint32_t)nt - cl, logits, greedy);
        float worst = 0;
        for (uint32_t i = 0; i < S_GREEDY; i++) {
            assert_int_equal(greedy[i], (int32_t)gt[i]);
            float d = s_max_diff(logits + (size_t)i * V, gl + (size_t)i * V, V);
            worst = d > worst ? d : worst;
        }
        printf("  greedy %u tokens vs PyTorch (context %u fetched): identical tokens, max |logit "
               "diff| = %.3g\n",
               S_GREEDY, cl, worst);
        assert_true(worst <= S_TOL_TORCH);
        free(ck);
        free(cv);
    }
    free(logits);
    free(gl);
    free(gt);
    free(ft);
    kvedge_safetensors_destroy(&st);
    kvedge_decoder_destroy(&md);
}

/* Prefill attends in tiles of query rows, each over the keys its last row sees; token by token
 * decoding attends one row at a time over every key. Both must agree at tile edges. */
static void test_prefill_tiles(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    const uint32_t V = c->vocab, N = 150;
    assert_true(N <= c->max_positions);
    int32_t t[150];
    s_tokens(t, N, V, 31);
    float *pre = malloc(V * sizeof(float)), *step = malloc(V * sizeof(float));
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(md);
    assert_int_equal(kvedge_decoder_session_begin(s, NULL, 0, NULL, NULL, t, 1, N - 1, step),
                     KVEDGE_OK);
    const uint32_t checks[] = {63, 64, 65, 128, 129, 150};
    size_t ci = 0;
    float worst = 0;
    for (uint32_t n = 1; n <= N; n++) {
        if (n > 1)
            assert_int_equal(kvedge_decoder_session_step(s, t[n - 1], step), KVEDGE_OK);
        if (ci < sizeof checks / sizeof checks[0] && n == checks[ci]) {
            assert_int_equal(kvedge_decoder_prefill(md, t, n, pre, NULL, NULL), KVEDGE_OK);
            worst = fmaxf(worst, s_max_diff(pre, step, V));
            ci++;
        }
    }
    assert_int_equal(ci, sizeof checks / sizeof checks[0]);
    printf("  prefill vs token-by-token decode at 63..150 tokens: max |logit diff| = %.3g "
           "(tol %.0e)\n",
           worst, S_TOL_LOSSLESS);
    assert_true(worst <= S_TOL_LOSSLESS);
    kvedge_decoder_session_destroy(&s);
    free(step);
    free(pre);
    kvedge_decoder_destroy(&md);
}

/* ---- fetched context K/V against recomputation ---------------------------------------- */

static void test_context_lossless(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    const uint32_t V = c->vocab;
    int32_t all[S_CTX + S_PROMPT];
    s_tokens(all, S_CTX + S_PROMPT, V, 7);

    /* Causality: the context's K/V inside a longer prefill equals its own prefill. */
    float *ck, *cv, *fk, *fv;
    s_context_kv(md, all, S_CTX, &ck, &cv);
    s_context_kv(md, all, S_CTX + S_PROMPT, &fk, &fv);
    const size_t ckvf = kvedge_decoder_kv_floats(md, S_CTX),
                 fkvf = kvedge_decoder_kv_floats(md, S_CTX + S_PROMPT);
    float kv_diff = 0;
    for (uint32_t l = 0; l < c->layers; l++)
        for (uint32_t h = 0; h < c->heads; h++) {
            size_t co = l * ckvf + (size_t)h * S_CTX * c->head_dim;
            size_t fo = l * fkvf + (size_t)h * (S_CTX + S_PROMPT) * c->head_dim;
            float dk = s_max_diff(ck + co, fk + fo, (size_t)S_CTX * c->head_dim);
            float dv = s_max_diff(cv + co, fv + fo, (size_t)S_CTX * c->head_dim);
            kv_diff = fmaxf(kv_diff, fmaxf(dk, dv));
        }
    assert_true(kv_diff <= S_TOL_LOSSLESS);

    float *local = malloc((S_GREEDY + 1) * V * sizeof(float));
    float *fetched = malloc((S_GREEDY + 1) * V * sizeof(float));
    float *pre = malloc(V * sizeof(float));
    int32_t g_local[S_GREEDY], g_fetched[S_GREEDY];
    s_decode(md, all, S_CTX, NULL, all + S_CTX, S_PROMPT, local, g_local);
    s_provider_t p = {.k = ck, .v = cv, .kvf = ckvf, .fail_layer = -1};
    s_decode(md, all, S_CTX, &p, all + S_CTX, S_PROMPT, fetched, g_fetched);
    assert_int_equal(kvedge_decoder_prefill(md, all, S_CTX + S_PROMPT, pre, NULL, NULL), KVEDGE_OK);

    float d0 = s_max_diff(local, fetched, V);
    float dall = s_max_diff(local, fetched, (size_t)(S_GREEDY + 1) * V);
    float dpre = s_max_diff(pre, local, V);
    printf("  context %u fetched (lossless) vs recomputed, prompt %u: max |logit diff| = %.3g, "
           "over %u greedy steps %.3g; prefill vs session %.3g; context K/V causality %.3g "
           "(tol %.0e)\n",
           S_CTX, S_PROMPT, d0, S_GREEDY, dall, dpre, kv_diff, S_TOL_LOSSLESS);
    assert_true(dall <= S_TOL_LOSSLESS);
    assert_true(dpre <= S_TOL_LOSSLESS);
    assert_memory_equal(g_local, g_fetched, sizeof g_local);

    /* The context matters: K/V of another context gives other logits. */
    int32_t other[S_CTX];
    s_tokens(other, S_CTX, V, 8);
    float *ok, *ov;
    s_context_kv(md, other, S_CTX, &ok, &ov);
    s_provider_t q = {.k = ok, .v = ov, .kvf = ckvf, .fail_layer = -1};
    s_decode(md, all, S_CTX, &q, all + S_CTX, S_PROMPT, fetched, g_fetched);
    assert_true(s_max_diff(local, fetched, V) > 1e-2f);

    free(ok);
    free(ov);
    free(pre);
    free(fetched);
    free(local);
    free(fk);
    free(fv);
    free(ck);
    free(cv);
    kvedge_decoder_destroy(&md);
}

/* Round-trips every (layer, head) of K and V through the block codec. */
static void s_quantize_kv(const kvedge_decoder_t *md, float *k, float *v, uint32_t tokens,
                          kvedge_scheme_t scheme, double *k_rel, double *v_rel)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    const size_t per = (size_t)tokens * c->head_dim;
    kvedge_block_spec_t spec = {
        .dtype = KVEDGE_DTYPE_FP32,
        .scheme = scheme,
        .tokens = tokens,
        .head_dim = (uint16_t)c->head_dim,
        .group_size = scheme == KVEDGE_SCHEME_INT4 ? KVEDGE_BLOCK_INT4_GROUP_DEFAULT : 0,
    };
    size_t cap = kvedge_block_encoded_bound(&spec);
    assert_true(cap > 0);
    uint8_t *blk = malloc(cap);
    float *dk = malloc(per * sizeof(float)), *dv = malloc(per * sizeof(float));
    double kerr = 0, knorm = 0, verr = 0, vnorm = 0;
    for (size_t b = 0; b < (size_t)c->layers * c->heads; b++) {
        float *kb = k + b * per, *vb = v + b * per;
        size_t len;
        assert_int_equal(kvedge_block_encode(&spec, kb, vb, blk, cap, &len), KVEDGE_OK);
        kvedge_block_info_t info;
        assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_OK);
        assert_int_equal(info.scheme, scheme);
        assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, dk, dv), KVEDGE_OK);
        for (size_t i = 0; i < per; i++) {
            kerr += (dk[i] - kb[i]) * (double)(dk[i] - kb[i]);
            knorm += kb[i] * (double)kb[i];
            verr += (dv[i] - vb[i]) * (double)(dv[i] - vb[i]);
            vnorm += vb[i] * (double)vb[i];
        }
        memcpy(kb, dk, per * sizeof(float));
        memcpy(vb, dv, per * sizeof(float));
    }
    *k_rel = sqrt(kerr / knorm);
    *v_rel = sqrt(verr / vnorm);
    free(dv);
    free(dk);
    free(blk);
}

static void test_context_quantized(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const uint32_t V = kvedge_decoder_config(md)->vocab;
    int32_t all[S_CTX + S_PROMPT];
    s_tokens(all, S_CTX + S_PROMPT, V, 11);
    float *ck, *cv;
    s_context_kv(md, all, S_CTX, &ck, &cv);
    const size_t kvf = kvedge_decoder_kv_floats(md, S_CTX);
    const size_t all_kv = kvedge_decoder_config(md)->layers * kvf;

    float *ref = malloc((S_GREEDY + 1) * V * sizeof(float));
    float *got = malloc((S_GREEDY + 1) * V * sizeof(float));
    int32_t g_ref[S_GREEDY], g_got[S_GREEDY];
    s_provider_t p = {.k = ck, .v = cv, .kvf = kvf, .fail_layer = -1};
    s_decode(md, all, S_CTX, &p, all + S_CTX, S_PROMPT, ref, g_ref);

    const kvedge_scheme_t schemes[] = {KVEDGE_SCHEME_INT8, KVEDGE_SCHEME_INT4};
    const float tols[] = {S_TOL_INT8, S_TOL_INT4};
    float errs[2];
    for (int si = 0; si < 2; si++) {
        float *qk = malloc(all_kv * sizeof(float)), *qv = malloc(all_kv * sizeof(float));
        memcpy(qk, ck, all_kv * sizeof(float));
        memcpy(qv, cv, all_kv * sizeof(float));
        double k_rel, v_rel;
        s_quantize_kv(md, qk, qv, S_CTX, schemes[si], &k_rel, &v_rel);
        s_provider_t q = {.k = qk, .v = qv, .kvf = kvf, .fail_layer = -1};
        s_decode(md, all, S_CTX, &q, all + S_CTX, S_PROMPT, got, g_got);
        float d0 = s_max_diff(ref, got, V);
        int same = 0;
        for (int i = 0; i < S_GREEDY; i++)
            same += g_ref[i] == g_got[i];
        printf("  context %u as %s: K rel err %.3g, V rel err %.3g; max |logit err| %.3g "
               "(bound %.1e, max |logit| %.3g); greedy tokens equal to lossless: %d/%d\n",
               S_CTX, kvedge_scheme_name(schemes[si]), k_rel, v_rel, d0, tols[si],
               s_max_abs(ref, V), same, S_GREEDY);
        errs[si] = d0;
        assert_true(d0 <= tols[si]);
        assert_true(d0 > 0); /* the round trip was lossy, so the fetched K/V was used */
        if (schemes[si] == KVEDGE_SCHEME_INT8)
            assert_int_equal(g_ref[0], g_got[0]);
        free(qk);
        free(qv);
    }
    assert_true(errs[0] < errs[1]); /* int8 beats int4 */
    free(got);
    free(ref);
    free(ck);
    free(cv);
    kvedge_decoder_destroy(&md);
}

static void test_context_miss(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    const uint32_t V = c->vocab;
    assert_int_equal(c->layers, 3);
    int32_t all[S_CTX + S_PROMPT];
    s_tokens(all, S_CTX + S_PROMPT, V, 13);
    float *ck, *cv;
    s_context_kv(md, all, S_CTX, &ck, &cv);
    const size_t kvf = kvedge_decoder_kv_floats(md, S_CTX);

    float *ref = malloc((S_GREEDY + 1) * V * sizeof(float));
    float *got = malloc((S_GREEDY + 1) * V * sizeof(float));
    int32_t g_ref[S_GREEDY], g_got[S_GREEDY];
    s_provider_t p = {.k = ck, .v = cv, .kvf = kvf, .fail_layer = -1};
    s_decode(md, all, S_CTX, &p, all + S_CTX, S_PROMPT, ref, g_ref);

    /* Layer 0 only; the middle layer after a fetched one; the last; first and last; all. */
    const uint32_t masks[] = {0x1, 0x2, 0x4, 0x5, 0x7};
    for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++) {
        s_provider_t q = {.k = ck, .v = cv, .kvf = kvf, .miss_mask = masks[mi], .fail_layer = -1};
        s_decode(md, all, S_CTX, &q, all + S_CTX, S_PROMPT, got, g_got);
        float d = s_max_diff(ref, got, (size_t)(S_GREEDY + 1) * V);
        printf("  MISS mask 0x%x recomputed vs fetched lossless: max |logit diff| %.3g over "
               "%u steps%s (tol %.0e)\n",
               masks[mi], d, S_GREEDY + 1, d == 0 ? ", bit-identical" : "", S_TOL_MISS);
        assert_true(d <= S_TOL_MISS);
        assert_memory_equal(g_ref, g_got, sizeof g_ref);
    }
    free(got);
    free(ref);
    free(ck);
    free(cv);
    kvedge_decoder_destroy(&md);
}

/* ---- context K/V in place ------------------------------------------------------------ */

/* An in-place provider: a "loader" already wrote the fetched layers into the session's own
 * storage; layers in miss_mask are reported MISS, and their storage holds NaN (what a failed
 * load might leave), which the decoder must overwrite, never read. */
typedef struct {
    kvedge_decoder_session_t *s;
    uint32_t miss_mask;
    int fail_layer; /* -1: never */
    uint32_t calls;
} s_in_place_t;

static int s_provide_in_place(void *arg, uint32_t layer, float *k, float *v)
{
    s_in_place_t *p = arg;
    p->calls++;
    float *sk, *sv;
    assert_int_equal(kvedge_decoder_session_ctx_kv(p->s, layer, &sk, &sv), KVEDGE_OK);
    assert_ptr_equal(k, sk); /* the very buffers the loader was lent */
    assert_ptr_equal(v, sv);
    if ((int)layer == p->fail_layer)
        return KVEDGE_ETIMEDOUT;
    return p->miss_mask & (1u << layer) ? KVEDGE_DECODER_MISS : KVEDGE_DECODER_IN_PLACE;
}

/* The loader's part: every layer's storage gets k/v, or NaN for a layer in miss_mask. */
static void s_load_in_place(kvedge_decoder_session_t *s, const kvedge_decoder_t *md, const float *k,
                            const float *v, size_t kvf, uint32_t miss_mask)
{
    for (uint32_t l = 0; l < kvedge_decoder_config(md)->layers; l++) {
        float *sk, *sv;
        assert_int_equal(kvedge_decoder_session_ctx_kv(s, l, &sk, &sv), KVEDGE_OK);
        for (size_t i = 0; i < kvf; i++) {
            sk[i] = miss_mask & (1u << l) ? NAN : k[l * kvf + i];
            sv[i] = miss_mask & (1u << l) ? NAN : v[l * kvf + i];
        }
    }
}

/* Says IN_PLACE for every layer, whatever the session. */
static int s_provide_ip_bare(void *arg, uint32_t layer, float *k, float *v)
{
    (void)arg;
    (void)layer;
    (void)k;
    (void)v;
    return KVEDGE_DECODER_IN_PLACE;
}

/* The in-place path (the session's storage lent to a loader, the provider answering
 * IN_PLACE) gives the copying path's logits to the bit, lossless and int8, with misses at the
 * first, the middle and the last layer, and accounts its bytes. */
static void test_context_in_place(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    const uint32_t V = c->vocab;
    assert_int_equal(c->layers, 3);
    int32_t all[S_CTX + S_PROMPT];
    s_tokens(all, S_CTX + S_PROMPT, V, 19);
    float *ck, *cv;
    s_context_kv(md, all, S_CTX, &ck, &cv);
    const size_t kvf = kvedge_decoder_kv_floats(md, S_CTX), all_kv = c->layers * kvf;
    float *qk = malloc(all_kv * sizeof(float)), *qv = malloc(all_kv * sizeof(float));
    assert_true(qk && qv);
    memcpy(qk, ck, all_kv * sizeof(float));
    memcpy(qv, cv, all_kv * sizeof(float));
    double k_rel, v_rel;
    s_quantize_kv(md, qk, qv, S_CTX, KVEDGE_SCHEME_INT8, &k_rel, &v_rel);

    const size_t steps = (size_t)(S_GREEDY + 1) * V;
    float *ref = malloc(steps * sizeof(float)), *got = malloc(steps * sizeof(float));
    assert_true(ref && got);
    int32_t g_ref[S_GREEDY];
    const uint64_t base =
        2ull * c->layers * sizeof(float) *
        (kvf + kvedge_decoder_kv_floats(md, S_PROMPT + S_GREEDY)); /* context + local K/V */
    const uint64_t hid = (uint64_t)S_CTX * c->hidden * sizeof(float), tmp = 2ull * kvf * 4;
    const uint32_t masks[] = {0x0, 0x1, 0x2, 0x4, 0x5, 0x7};
    /* Context state a miss costs: the hidden state, plus a scratch pair to rerun fetched
     * layers before it (none when every layer before the miss was computed too). */
    const uint64_t extra[] = {0, hid, hid + tmp, hid + tmp, hid + tmp, hid};
    const float *kvs[2][2] = {{ck, cv}, {qk, qv}};
    for (int q = 0; q < 2; q++)
        for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++) {
            s_provider_t cp = {.k = kvs[q][0],
                               .v = kvs[q][1],
                               .kvf = kvf,
                               .miss_mask = masks[mi],
                               .fail_layer = -1};
            s_decode(md, all, S_CTX, &cp, all + S_CTX, S_PROMPT, ref, g_ref);

            kvedge_decoder_session_t *s = kvedge_decoder_session_new(md);
            assert_non_null(s);
            assert_int_equal(kvedge_decoder_session_reserve(s, S_CTX, S_PROMPT, S_GREEDY),
                             KVEDGE_OK);
            assert_int_equal(kvedge_decoder_session_kv_bytes(s), base);
            s_load_in_place(s, md, kvs[q][0], kvs[q][1], kvf, masks[mi]);
            s_in_place_t ip = {.s = s, .miss_mask = masks[mi], .fail_layer = -1};
            assert_int_equal(kvedge_decoder_session_begin(s, all, S_CTX, s_provide_in_place, &ip,
                                                          all + S_CTX, S_PROMPT, S_GREEDY, got),
                             KVEDGE_OK);
            assert_int_equal(ip.calls, c->layers);
            for (uint32_t i = 0; i < S_GREEDY; i++) {
                int32_t t = s_argmax(kvedge_decoder_session_logits(s), V);
                assert_int_equal(t, g_ref[i]);
                assert_int_equal(kvedge_decoder_session_step(s, t, got + (i + 1) * V), KVEDGE_OK);
            }
            assert_memory_equal(got, ref, steps * sizeof(float));
            assert_int_equal(kvedge_decoder_session_kv_bytes(s), base + extra[mi]);
            kvedge_decoder_session_destroy(&s);
        }
    printf("  in place vs copied, lossless and int8 (K rel err %.3g), MISS masks 0,1,2,4,5,7: "
           "logits bit-identical over %u steps; K/V bytes %llu (+ %llu hidden, + %llu scratch)\n",
           k_rel, S_GREEDY + 1, (unsigned long long)base, (unsigned long long)hid,
           (unsigned long long)tmp);

    /* A begin that fails keeps the lent storage where it was and the loader's bytes in it;
     * the next begin succeeds on it. */
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(md);
    assert_non_null(s);
    float *k0, *v0, *k1, *v1;
    assert_int_equal(kvedge_decoder_session_ctx_kv(s, 0, &k0, &v0), KVEDGE_EINVAL);
    assert_null(k0);
    assert_null(v0);
    assert_int_equal(kvedge_decoder_session_reserve(s, S_CTX, S_PROMPT, S_GREEDY), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_session_ctx_kv(s, 0, &k0, &v0), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_session_ctx_kv(s, c->layers, &k1, &v1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_ctx_kv(s, 0, NULL, &v1), KVEDGE_EINVAL);
    s_load_in_place(s, md, ck, cv, kvf, 0);
    s_in_place_t ip = {.s = s, .fail_layer = 1};
    assert_int_equal(kvedge_decoder_session_begin(s, all, S_CTX, s_provide_in_place, &ip,
                                                  all + S_CTX, S_PROMPT, S_GREEDY, NULL),
                     KVEDGE_ETIMEDOUT);
    assert_int_equal(kvedge_decoder_session_ctx_kv(s, 0, &k1, &v1), KVEDGE_OK);
    assert_ptr_equal(k0, k1);
    assert_ptr_equal(v0, v1);
    assert_memory_equal(k0, ck, kvf * sizeof(float));
    /* The shape must fit the reservation: another context length, more local tokens. */
    ip.fail_layer = -1;
    assert_int_equal(kvedge_decoder_session_begin(s, all, S_CTX - 1, s_provide_in_place, &ip,
                                                  all + S_CTX, S_PROMPT, S_GREEDY, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_begin(s, all, S_CTX, s_provide_in_place, &ip,
                                                  all + S_CTX, S_PROMPT, S_GREEDY + 1, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_ctx_kv(s, 0, &k1, &v1), KVEDGE_OK);
    assert_ptr_equal(k0, k1);
    /* Fewer local tokens than reserved: the same logits as a copying session of that shape. */
    s_provider_t cp = {.k = ck, .v = cv, .kvf = kvf, .fail_layer = -1};
    s_decode(md, all, S_CTX, &cp, all + S_CTX, S_PROMPT - 4, ref, g_ref);
    ip.calls = 0;
    assert_int_equal(kvedge_decoder_session_begin(s, all, S_CTX, s_provide_in_place, &ip,
                                                  all + S_CTX, S_PROMPT - 4, S_GREEDY, got),
                     KVEDGE_OK);
    assert_memory_equal(got, ref, V * sizeof(float));
    kvedge_decoder_session_destroy(&s);

    /* IN_PLACE from a provider of an unreserved session: nothing was lent, so nothing can be
     * in place. Reserve's own errors. */
    s = kvedge_decoder_session_new(md);
    assert_non_null(s);
    assert_int_equal(kvedge_decoder_session_begin(s, all, S_CTX, s_provide_ip_bare, NULL,
                                                  all + S_CTX, S_PROMPT, S_GREEDY, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_reserve(NULL, S_CTX, S_PROMPT, 1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_reserve(s, S_CTX, 0, 1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_reserve(s, c->max_positions, S_PROMPT, 1),
                     KVEDGE_ETOOBIG);
    assert_int_equal(kvedge_decoder_session_ctx_kv(s, 0, &k1, &v1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_reserve(s, 0, S_PROMPT, 1), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_session_ctx_kv(s, 0, &k1, &v1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_kv_bytes(NULL), 0);
    kvedge_decoder_session_destroy(&s);

    free(got);
    free(ref);
    free(qv);
    free(qk);
    free(ck);
    free(cv);
    kvedge_decoder_destroy(&md);
}

static void test_provider_errors(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const uint32_t V = kvedge_decoder_config(md)->vocab;
    int32_t all[40];
    s_tokens(all, 40, V, 17);
    float *ck, *cv;
    s_context_kv(md, all, 30, &ck, &cv);
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(md);
    assert_non_null(s);

    s_provider_t p = {.k = ck,
                      .v = cv,
                      .kvf = kvedge_decoder_kv_floats(md, 30),
                      .fail_layer = 1,
                      .fail_rc = KVEDGE_ETIMEDOUT};
    assert_int_equal(kvedge_decoder_session_begin(s, all, 30, s_provide, &p, all + 30, 10, 2, NULL),
                     KVEDGE_ETIMEDOUT);
    assert_int_equal(p.calls, 2); /* stopped at the failing layer */
    assert_null(kvedge_decoder_session_logits(s));
    assert_int_equal(kvedge_decoder_session_step(s, 1, NULL), KVEDGE_EINVAL);
    int32_t tok;
    assert_int_equal(kvedge_decoder_session_generate(s, 1, &tok), KVEDGE_EINVAL);

    p.calls = 0;
    p.fail_rc = 5; /* neither 0, MISS nor an error code */
    assert_int_equal(kvedge_decoder_session_begin(s, all, 30, s_provide, &p, all + 30, 10, 2, NULL),
                     KVEDGE_EINVAL);

    /* The session recovers with a good provider. */
    p.calls = 0;
    p.fail_layer = -1;
    float *logits = malloc(V * sizeof(float));
    assert_int_equal(
        kvedge_decoder_session_begin(s, all, 30, s_provide, &p, all + 30, 10, 2, logits),
        KVEDGE_OK);
    assert_memory_equal(kvedge_decoder_session_logits(s), logits, V * sizeof(float));
    int32_t two[2];
    assert_int_equal(kvedge_decoder_session_generate(s, 2, two), KVEDGE_OK);
    assert_int_equal(two[0], s_argmax(logits, V));
    assert_int_equal(kvedge_decoder_session_generate(s, 1, two), KVEDGE_ENOSPACE);

    free(logits);
    kvedge_decoder_session_destroy(&s);
    kvedge_decoder_session_destroy(&s);
    kvedge_decoder_session_destroy(NULL);
    free(ck);
    free(cv);
    kvedge_decoder_destroy(&md);
}

static void test_argument_errors(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_model();
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    int32_t t[200];
    s_tokens(t, 200, c->vocab, 19);
    float *k = malloc(c->layers * kvedge_decoder_kv_floats(md, 4) * sizeof(float));

    assert_int_equal(kvedge_decoder_prefill(md, t, 0, NULL, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_prefill(md, NULL, 4, NULL, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_prefill(md, t, 4, NULL, k, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_prefill(md, t, c->max_positions + 1, NULL, NULL, NULL),
                     KVEDGE_ETOOBIG);
    assert_int_equal(kvedge_decoder_prefill(md, t, c->max_positions, NULL, NULL, NULL), KVEDGE_OK);
    int32_t bad[2] = {1, (int32_t)c->vocab};
    assert_int_equal(kvedge_decoder_prefill(md, bad, 2, NULL, NULL, NULL), KVEDGE_EINVAL);
    bad[1] = -1;
    assert_int_equal(kvedge_decoder_prefill(md, bad, 2, NULL, NULL, NULL), KVEDGE_EINVAL);

    kvedge_decoder_session_t *s = kvedge_decoder_session_new(md);
    assert_int_equal(kvedge_decoder_session_step(s, 1, NULL), KVEDGE_EINVAL); /* not begun */
    assert_int_equal(kvedge_decoder_session_begin(s, NULL, 0, NULL, NULL, t, 0, 0, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_begin(s, t, 4, NULL, NULL, t, 4, 0, NULL),
                     KVEDGE_EINVAL); /* context without a provider */
    assert_int_equal(kvedge_decoder_session_begin(s, t, 100, s_provide, NULL, t, 50, 11, NULL),
                     KVEDGE_ETOOBIG);
    assert_int_equal(kvedge_decoder_session_begin(s, NULL, 0, NULL, NULL, bad, 2, 0, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_begin(s, NULL, 0, NULL, NULL, t, 3, 1, NULL),
                     KVEDGE_OK);
    assert_int_equal(kvedge_decoder_session_step(s, (int32_t)c->vocab, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_session_step(s, 3, NULL), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_session_step(s, 3, NULL), KVEDGE_ENOSPACE);
    kvedge_decoder_session_destroy(&s);

    kvedge_decoder_t *empty = kvedge_decoder_new();
    assert_null(kvedge_decoder_session_new(empty));
    assert_null(kvedge_decoder_session_new(NULL));
    assert_int_equal(kvedge_decoder_prefill(empty, t, 4, NULL, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_config(empty)->layers, 0);
    kvedge_decoder_destroy(&empty);
    free(k);
    kvedge_decoder_destroy(&md);
}

/* ---- loading ------------------------------------------------------------------------- */

/* A small random OPT written as safetensors (F32), with faults on request. */
typedef struct {
    const char *prefix; /* "model.decoder." or "decoder." */
    uint32_t hidden, ffn, vocab, layers, max_pos;
    const char *drop;     /* a tensor name to leave out */
    const char *misshape; /* a tensor name whose first dimension gets one extra row */
    const char *extra;    /* an extra [vocab][hidden] tensor name */
    const char *meta;     /* JSON object text for __metadata__, or NULL */
} s_synth_t;

static void s_write_synth(const char *path, const s_synth_t *o)
{
    enum { MAXT = 8 + 16 * 8 };
    char names[MAXT][128];
    uint64_t d0[MAXT], d1[MAXT];
    int n = 0;
    const uint32_t H = o->hidden, F = o->ffn;
#define S_ADD(a, b, ...)                                                                           \
    do {                                                                                           \
        snprintf(names[n], sizeof names[n], __VA_ARGS__);                                          \
        d0[n] = (a), d1[n] = (b), n++;                                                             \
    } while (0)
    S_ADD(o->vocab, H, "%sembed_tokens.weight", o->prefix);
    S_ADD(o->max_pos + 2, H, "%sembed_positions.weight", o->prefix);
    S_ADD(H, 0, "%sfinal_layer_norm.weight", o->prefix);
    S_ADD(H, 0, "%sfinal_layer_norm.bias", o->prefix);
    for (uint32_t l = 0; l < o->layers; l++) {
        const char *ln[] = {"self_attn_layer_norm", "final_layer_norm"};
        for (int i = 0; i < 2; i++) {
            S_ADD(H, 0, "%slayers.%u.%s.weight", o->prefix, l, ln[i]);
            S_ADD(H, 0, "%slayers.%u.%s.bias", o->prefix, l, ln[i]);
        }
        const char *pr[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
        for (int i = 0; i < 4; i++) {
            S_ADD(H, H, "%slayers.%u.self_attn.%s.weight", o->prefix, l, pr[i]);
            S_ADD(H, 0, "%slayers.%u.self_attn.%s.bias", o->prefix, l, pr[i]);
        }
        S_ADD(F, H, "%slayers.%u.fc1.weight", o->prefix, l);
        S_ADD(F, 0, "%slayers.%u.fc1.bias", o->prefix, l);
        S_ADD(H, F, "%slayers.%u.fc2.weight", o->prefix, l);
        S_ADD(H, 0, "%slayers.%u.fc2.bias", o->prefix, l);
    }
    if (o->extra)
        S_ADD(o->vocab, H, "%s", o->extra);
#undef S_ADD
    size_t hcap = 64 * 1024, hlen = 0, off = 0;
    char *hdr = malloc(hcap);
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "{");
    if (o->meta)
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "\"__metadata__\":%s,", o->meta);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (o->drop && strcmp(names[i], o->drop) == 0)
            continue;
        if (o->misshape && strcmp(names[i], o->misshape) == 0)
            d0[i]++;
        size_t bytes = d0[i] * (d1[i] ? d1[i] : 1) * 4;
        if (d1[i])
            hlen += (size_t)snprintf(hdr + hlen, hcap - hlen,
                                     "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%llu,%llu],"
                                     "\"data_offsets\":[%zu,%zu]}",
                                     kept ? "," : "", names[i], (unsigned long long)d0[i],
                                     (unsigned long long)d1[i], off, off + bytes);
        else
            hlen += (size_t)snprintf(hdr + hlen, hcap - hlen,
                                     "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%llu],"
                                     "\"data_offsets\":[%zu,%zu]}",
                                     kept ? "," : "", names[i], (unsigned long long)d0[i], off,
                                     off + bytes);
        off += bytes;
        kept++;
    }
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "}");
    assert_true(hlen < hcap);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, hlen, f);
    uint64_t x = 12345;
    for (size_t i = 0; i < off / 4; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        float val = ((float)(x >> 40) / (float)(1u << 24) - 0.5f) * 0.4f;
        fwrite(&val, 4, 1, f);
    }
    fclose(f);
    free(hdr);
}

/* Loads a synthetic model and returns the code; on success the model is kept in *out. */
static int s_load_synth(const s_synth_t *o, uint32_t heads, kvedge_decoder_t **out, char *err,
                        size_t err_len)
{
    char path[] = "/tmp/kvedge_dec_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    s_write_synth(path, o);
    kvedge_decoder_t *md = kvedge_decoder_new();
    int rc = kvedge_decoder_load(md, path, heads);
    if (err)
        snprintf(err, err_len, "%s", kvedge_decoder_error(md));
    unlink(path);
    if (rc == KVEDGE_OK && out)
        *out = md;
    else
        kvedge_decoder_destroy(&md);
    return rc;
}

static void test_load_errors(void **state)
{
    (void)state;
    const s_synth_t base = {"model.decoder.", 64, 128, 50, 2, 20, NULL, NULL, NULL, NULL};
    char err[256];
    assert_int_equal(s_load_synth(&base, 0, NULL, err, sizeof err), KVEDGE_OK);

    s_synth_t o = base;
    o.drop = "model.decoder.layers.1.fc2.bias";
    assert_int_equal(s_load_synth(&o, 0, NULL, err, sizeof err), KVEDGE_ENOTFOUND);
    assert_non_null(strstr(err, "layers.1.fc2.bias"));
    o.drop = "model.decoder.embed_positions.weight";
    assert_int_equal(s_load_synth(&o, 0, NULL, err, sizeof err), KVEDGE_ENOTFOUND);
    o.drop = "model.decoder.final_layer_norm.weight";
    assert_int_equal(s_load_synth(&o, 0, NULL, err, sizeof err), KVEDGE_ENOTFOUND);

    const char *shapes[] = {
        "model.decoder.layers.1.fc1.weight", "model.decoder.layers.1.self_attn.k_proj.weight",
        "model.decoder.layers.0.self_attn.out_proj.bias",
        "model.decoder.layers.1.final_layer_norm.weight", "model.decoder.final_layer_norm.bias"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        o = base;
        o.misshape = shapes[i];
        assert_int_equal(s_load_synth(&o, 0, NULL, err, sizeof err), KVEDGE_ESHAPE);
        assert_non_null(strstr(err, shapes[i]));
    }
    /* Heads that do not divide hidden, and a malformed head count in the metadata. */
    assert_int_equal(s_load_synth(&base, 3, NULL, err, sizeof err), KVEDGE_ESHAPE);
    o = base;
    o.meta = "{\"num_attention_heads\":\"four\"}";
    assert_int_equal(s_load_synth(&o, 0, NULL, err, sizeof err), KVEDGE_ESHAPE);
    /* Variants this decoder does not implement are refused, not silently mis-run. */
    o = base;
    o.extra = "model.decoder.project_in.weight";
    assert_int_equal(s_load_synth(&o, 0, NULL, err, sizeof err), KVEDGE_EINVAL);
    o = base;
    o.meta = "{\"activation_function\":\"gelu\"}";
    assert_int_equal(s_load_synth(&o, 0, NULL, err, sizeof err), KVEDGE_EINVAL);
    o = base;
    o.meta = "{\"do_layer_norm_before\":\"false\"}";
    assert_int_equal(s_load_synth(&o, 0, NULL, err, sizeof err), KVEDGE_EINVAL);
    /* Not a model at all, and not a file. */
    o = base;
    o.prefix = "transformer.";
    assert_int_equal(s_load_synth(&o, 0, NULL, err, sizeof err), KVEDGE_ENOTFOUND);
    kvedge_decoder_t *md = kvedge_decoder_new();
    assert_int_equal(kvedge_decoder_load(md, "/nonexistent.safetensors", 0), KVEDGE_EIO);
    assert_int_equal(kvedge_decoder_load(md, KVEDGE_FIXTURES "/../fixtures", 0), KVEDGE_EIO);
    assert_true(strlen(kvedge_decoder_error(md)) > 0);
    kvedge_decoder_destroy(&md);
}

static void test_load_variants(void **state)
{
    (void)state;
    const s_synth_t base = {"model.decoder.", 128, 64, 40, 2, 24, NULL, NULL, NULL, NULL};
    int32_t t[12];
    s_tokens(t, 12, 40, 23);
    float a[40], b[40];

    kvedge_decoder_t *m1 = NULL, *m2 = NULL;
    assert_int_equal(s_load_synth(&base, 0, &m1, NULL, 0), KVEDGE_OK);
    const kvedge_decoder_config_t *c = kvedge_decoder_config(m1);
    /* No head count anywhere: head_dim 64, as in every OPT size. */
    assert_int_equal(c->heads, 2);
    assert_int_equal(c->head_dim, 64);
    assert_int_equal(c->layers, 2);
    assert_int_equal(c->ffn, 64);
    assert_int_equal(c->vocab, 40);
    assert_int_equal(c->max_positions, 24);
    assert_int_equal(kvedge_decoder_prefill(m1, t, 12, a, NULL, NULL), KVEDGE_OK);

    /* OPTModel naming ("decoder.") loads the same model. */
    s_synth_t o = base;
    o.prefix = "decoder.";
    assert_int_equal(s_load_synth(&o, 0, &m2, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_prefill(m2, t, 12, b, NULL, NULL), KVEDGE_OK);
    assert_memory_equal(a, b, sizeof a);
    kvedge_decoder_destroy(&m2);

    /* The caller's head count wins over the default and changes the model. */
    assert_int_equal(s_load_synth(&base, 8, &m2, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_config(m2)->head_dim, 16);
    assert_int_equal(kvedge_decoder_prefill(m2, t, 12, b, NULL, NULL), KVEDGE_OK);
    assert_true(s_max_diff(a, b, 40) > 1e-4f);
    kvedge_decoder_destroy(&m2);
    /* ... and so does the metadata's. */
    o = base;
    o.meta = "{\"num_attention_heads\":\"8\"}";
    assert_int_equal(s_load_synth(&o, 0, &m2, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_config(m2)->heads, 8);
    kvedge_decoder_destroy(&m2);

    /* A stored lm_head.weight is the output head (here untied, so the logits change). */
    o = base;
    o.extra = "lm_head.weight";
    assert_int_equal(s_load_synth(&o, 0, &m2, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_prefill(m2, t, 12, b, NULL, NULL), KVEDGE_OK);
    assert_true(s_max_diff(a, b, 40) > 1e-4f);
    kvedge_decoder_destroy(&m2);
    kvedge_decoder_destroy(&m1);
}

/* ---- shapes, synthetic weights, costs (decoder_model.c) ------------------------------ */

static void test_model_shapes(void **state)
{
    (void)state;
    kvedge_decoder_config_t c;
    assert_int_equal(kvedge_decoder_shape("opt-125m", &c), KVEDGE_OK);
    assert_int_equal(c.layers, 12);
    assert_int_equal(c.heads, 12);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.hidden, 768);
    assert_int_equal(c.ffn, 3072);
    assert_int_equal(c.vocab, 50272);
    assert_int_equal(c.max_positions, 2048);
    assert_int_equal(kvedge_decoder_shape("opt-1.3b", &c), KVEDGE_OK);
    assert_int_equal(c.layers, 24);
    assert_int_equal(c.heads, 32);
    assert_int_equal(c.hidden, 2048);
    assert_int_equal(c.ffn, 8192);
    assert_int_equal(c.head_dim * c.heads, c.hidden);
    assert_int_equal(kvedge_decoder_shape("opt-2.7b", &c), KVEDGE_OK);
    assert_int_equal(c.layers, 32);
    assert_int_equal(c.heads, 32);
    assert_int_equal(c.head_dim, 80); /* not hidden / 64: the head count must travel along */
    assert_int_equal(c.hidden, 2560);
    assert_int_equal(c.ffn, 10240);

    /* opt-tiny is the fixture's shape, as the loader derives it from the file. */
    kvedge_decoder_t *md = s_model();
    assert_int_equal(kvedge_decoder_shape("opt-tiny", &c), KVEDGE_OK);
    assert_memory_equal(&c, kvedge_decoder_config(md), sizeof c);
    kvedge_decoder_destroy(&md);

    assert_int_equal(kvedge_decoder_shape("opt-999b", &c), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_decoder_shape("OPT-125M", &c), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_decoder_shape("", &c), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_decoder_shape(NULL, &c), KVEDGE_ENOMODEL);

    /* The Llama family: query and KV heads from the published configs. */
    assert_int_equal(kvedge_decoder_shape("llama-3.2-1b", &c), KVEDGE_OK);
    assert_int_equal(c.layers, 16);
    assert_int_equal(c.heads, 32);
    assert_int_equal(c.kv_heads, 8);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.vocab, 128256);
    assert_string_equal(kvedge_decoder_shape_arch("llama-3.2-1b"), "llama");
    assert_int_equal(kvedge_decoder_shape("qwen2.5-0.5b", &c), KVEDGE_OK);
    assert_int_equal(c.layers, 24);
    assert_int_equal(c.heads, 14);
    assert_int_equal(c.kv_heads, 2);
    assert_int_equal(c.head_dim * c.heads, c.hidden);
    assert_string_equal(kvedge_decoder_shape_arch("qwen2.5-0.5b"), "qwen2");
    assert_string_equal(kvedge_decoder_shape_arch("opt-125m"), "opt");
    assert_null(kvedge_decoder_shape_arch("opt-999b"));
    size_t names = 0;
    while (kvedge_decoder_shape_name(names))
        assert_int_equal(kvedge_decoder_shape(kvedge_decoder_shape_name(names++), &c), KVEDGE_OK);
    assert_int_equal(names, 9);
    /* The OPT writer refuses a shape with fewer KV than query heads. */
    assert_int_equal(kvedge_decoder_shape("llama-3.2-1b", &c), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_synthesize("/nonexistent/x", &c, 1, true), KVEDGE_EINVAL);
}

/* kvedge_decoder_synthesize_hf: a tiny Qwen2-style GQA model loads back with its shape, the
 * model_type and biases it was written with; bad shapes and types are refused. */
static void test_synthesize_hf(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvedge-synth-hf-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char m[64];
    snprintf(m, sizeof m, "%s/m", dir);
    const kvedge_decoder_config_t c = {.layers = 2,
                                       .heads = 6,
                                       .head_dim = 8,
                                       .hidden = 48,
                                       .ffn = 64,
                                       .vocab = 90,
                                       .max_positions = 64,
                                       .kv_heads = 2};
    assert_int_equal(kvedge_decoder_synthesize_hf(m, "qwen2", &c, 1e6, false, 3, true), KVEDGE_OK);
    kvedge_decoder_t *md = kvedge_decoder_new();
    int rc = kvedge_decoder_load(md, m, 0);
    if (rc != KVEDGE_OK)
        fail_msg("load: %s (%s)", kvedge_strerror(rc), kvedge_decoder_error(md));
    assert_memory_equal(kvedge_decoder_config(md), &c, sizeof c);
    assert_string_equal(kvedge_decoder_arch(md), "qwen2");
    assert_int_equal(kvedge_decoder_kv_heads(md), 2);
    assert_true(kvedge_decoder_rope_fingerprint(md) != 0);
    int32_t t[5] = {1, 2, 3, 4, 5};
    float *logits = calloc(c.vocab, sizeof *logits);
    assert_int_equal(kvedge_decoder_prefill(md, t, 5, logits, NULL, NULL), KVEDGE_OK);
    assert_true(isfinite(logits[0]) && logits[0] != logits[1]);
    free(logits);
    kvedge_decoder_destroy(&md);

    kvedge_decoder_config_t bad = c;
    bad.kv_heads = 4; /* does not divide 6 */
    assert_int_equal(kvedge_decoder_synthesize_hf(m, "llama", &bad, 1e4, false, 1, true),
                     KVEDGE_EINVAL);
    bad = c;
    bad.head_dim = 7; /* odd: no rotary pairs */
    assert_int_equal(kvedge_decoder_synthesize_hf(m, "llama", &bad, 1e4, false, 1, true),
                     KVEDGE_EINVAL);
    bad = c;
    bad.kv_heads = 0;
    assert_int_equal(kvedge_decoder_synthesize_hf(m, "llama", &bad, 1e4, false, 1, true),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_synthesize_hf(m, "opt", &c, 1e4, false, 1, true),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_synthesize_hf(m, "llama", &c, 0.5, false, 1, true),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_synthesize_hf("", "llama", &c, 1e4, false, 1, true),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_synthesize_shape("nope", m, 1, true), KVEDGE_ENOMODEL);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The whole of a small file; caller frees. */
static uint8_t *s_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n > 0 && n < (64l << 20));
    rewind(f);
    uint8_t *b = malloc((size_t)n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* fp32 bytes of an OPT of shape c as the loader holds it (tied head: no lm_head). */
static uint64_t s_weight_bytes(const kvedge_decoder_config_t *c)
{
    const uint64_t H = c->hidden, F = c->ffn;
    const uint64_t layer = 4 * (H * H + H) + (F * H + F) + (H * F + H) + 2 * 2 * H;
    return 4 * ((uint64_t)c->vocab * H + (c->max_positions + 2ull) * H + 2 * H + c->layers * layer);
}

static void test_synthesize(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvedge_synth_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char a[64], b[64], d[64], tmp[80];
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    snprintf(d, sizeof d, "%s/d.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", a);

    /* 4 heads of 16: the loader would guess 1 head (hidden / 64) without the metadata. */
    const kvedge_decoder_config_t c = {.layers = 2,
                                       .heads = 4,
                                       .head_dim = 16,
                                       .hidden = 64,
                                       .ffn = 96,
                                       .vocab = 70,
                                       .max_positions = 40,
                                       .kv_heads = 4};
    for (int fp16 = 1; fp16 >= 0; fp16--) {
        assert_int_equal(kvedge_decoder_synthesize(a, &c, 42, fp16), KVEDGE_OK);
        assert_int_equal(access(tmp, F_OK), -1); /* renamed, nothing left behind */
        kvedge_decoder_t *md = kvedge_decoder_new();
        assert_int_equal(kvedge_decoder_weights_bytes(md), 0);
        int rc = kvedge_decoder_load(md, a, 0);
        if (rc != KVEDGE_OK)
            fail_msg("load synthetic: %s (%s)", kvedge_strerror(rc), kvedge_decoder_error(md));
        assert_memory_equal(kvedge_decoder_config(md), &c, sizeof c);
        assert_int_equal(kvedge_decoder_weights_bytes(md), s_weight_bytes(&c));

        /* It runs, and its logits are those of a random model: finite, not all equal. */
        int32_t t[20];
        s_tokens(t, 20, c.vocab, 29);
        float logits[70];
        assert_int_equal(kvedge_decoder_prefill(md, t, 20, logits, NULL, NULL), KVEDGE_OK);
        float lo = INFINITY, hi = -INFINITY;
        for (uint32_t i = 0; i < c.vocab; i++) {
            assert_true(isfinite(logits[i]));
            lo = fminf(lo, logits[i]);
            hi = fmaxf(hi, logits[i]);
        }
        assert_true(hi > lo);
        kvedge_decoder_destroy(&md);

        /* The values are what the header promises: N(0, 0.02) matrices, LayerNorm 1 and 0,
         * zero biases, the metadata, and the dtype asked for. */
        kvedge_safetensors_t *st = kvedge_safetensors_new();
        assert_int_equal(kvedge_safetensors_open(st, a), KVEDGE_OK);
        assert_int_equal(kvedge_safetensors_count(st), 4 + 16 * c.layers);
        assert_null(kvedge_safetensors_find(st, "lm_head.weight")); /* tied */
        assert_string_equal(kvedge_safetensors_metadata(st, "num_attention_heads"), "4");
        assert_string_equal(kvedge_safetensors_metadata(st, "num_hidden_layers"), "2");
        assert_string_equal(kvedge_safetensors_metadata(st, "hidden_size"), "64");
        assert_string_equal(kvedge_safetensors_metadata(st, "ffn_dim"), "96");
        assert_string_equal(kvedge_safetensors_metadata(st, "vocab_size"), "70");
        assert_string_equal(kvedge_safetensors_metadata(st, "max_position_embeddings"), "40");
        const kvedge_safetensors_tensor_t *w =
            kvedge_safetensors_find(st, "model.decoder.layers.1.fc1.weight");
        assert_non_null(w);
        assert_int_equal(w->dtype, fp16 ? KVEDGE_SAFETENSORS_F16 : KVEDGE_SAFETENSORS_F32);
        float *f = malloc(w->numel * sizeof(float));
        assert_int_equal(kvedge_safetensors_to_f32(w, f, w->numel), KVEDGE_OK);
        double sum = 0, sq = 0;
        for (size_t i = 0; i < w->numel; i++)
            sum += f[i], sq += (double)f[i] * f[i];
        const double mean = sum / w->numel, sd = sqrt(sq / w->numel - mean * mean);
        printf("  synthetic %s fc1 (%zu values): mean %.2g, std %.4g (want 0.02)\n",
               fp16 ? "F16" : "F32", (size_t)w->numel, mean, sd);
        assert_true(fabs(mean) < 0.002 && fabs(sd - 0.02) < 0.001);
        free(f);
        const char *ones = "model.decoder.layers.0.final_layer_norm.weight";
        const char *zeros[] = {"model.decoder.layers.0.final_layer_norm.bias",
                               "model.decoder.layers.1.self_attn.k_proj.bias",
                               "model.decoder.final_layer_norm.bias"};
        float v[64];
        assert_int_equal(kvedge_safetensors_to_f32(kvedge_safetensors_find(st, ones), v, 64),
                         KVEDGE_OK);
        for (int i = 0; i < 64; i++)
            assert_true(v[i] == 1.0f);
        for (int z = 0; z < 3; z++) {
            assert_int_equal(
                kvedge_safetensors_to_f32(kvedge_safetensors_find(st, zeros[z]), v, 64), KVEDGE_OK);
            for (int i = 0; i < 64; i++)
                assert_true(v[i] == 0.0f);
        }
        kvedge_safetensors_destroy(&st);

        /* Same seed, same bytes; another seed, other bytes of the same size. */
        assert_int_equal(kvedge_decoder_synthesize(b, &c, 42, fp16), KVEDGE_OK);
        assert_int_equal(kvedge_decoder_synthesize(d, &c, 43, fp16), KVEDGE_OK);
        size_t la, lb, ld;
        uint8_t *fa = s_read_file(a, &la), *fb = s_read_file(b, &lb), *fd = s_read_file(d, &ld);
        assert_int_equal(la, lb);
        assert_memory_equal(fa, fb, la);
        assert_int_equal(la, ld);
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++)
            hlen |= (uint64_t)fa[i] << (8 * i);
        assert_int_equal((8 + hlen) % 8, 0); /* data 8-byte aligned */
        assert_true(8 + hlen < la);
        assert_true(memcmp(fa + 8 + hlen, fd + 8 + hlen, la - 8 - hlen) != 0);
        /* The data is 2 or 4 bytes per weight. */
        assert_int_equal(la - 8 - hlen, s_weight_bytes(&c) / (fp16 ? 2 : 1));
        free(fa);
        free(fb);
        free(fd);
        /* An existing file is replaced whole. */
        assert_int_equal(kvedge_decoder_synthesize(b, &c, 43, fp16), KVEDGE_OK);
        fb = s_read_file(b, &lb);
        fd = s_read_file(d, &ld);
        assert_int_equal(lb, ld);
        assert_memory_equal(fb, fd, lb);
        free(fb);
        free(fd);
    }

    /* Bad shapes: nothing is written. */
    kvedge_decoder_config_t bad = c;
    bad.layers = 0;
    assert_int_equal(kvedge_decoder_synthesize(d, &bad, 1, true), KVEDGE_EINVAL);
    bad = c;
    bad.heads = 3; /* does not divide 64 */
    bad.head_dim = 0;
    assert_int_equal(kvedge_decoder_synthesize(d, &bad, 1, true), KVEDGE_EINVAL);
    bad = c;
    bad.head_dim = 32; /* not hidden / heads */
    assert_int_equal(kvedge_decoder_synthesize(d, &bad, 1, true), KVEDGE_EINVAL);
    const size_t zero_fields[] = {
        offsetof(kvedge_decoder_config_t, heads), offsetof(kvedge_decoder_config_t, hidden),
        offsetof(kvedge_decoder_config_t, ffn), offsetof(kvedge_decoder_config_t, vocab),
        offsetof(kvedge_decoder_config_t, max_positions)};
    for (size_t i = 0; i < sizeof zero_fields / sizeof zero_fields[0]; i++) {
        bad = c;
        memset((uint8_t *)&bad + zero_fields[i], 0, sizeof(uint32_t));
        assert_int_equal(kvedge_decoder_synthesize(d, &bad, 1, true), KVEDGE_EINVAL);
    }
    bad = c;
    bad.layers = 1u << 20; /* past any real model */
    assert_int_equal(kvedge_decoder_synthesize(d, &bad, 1, true), KVEDGE_EINVAL);
    bad = c;
    bad.head_dim = 0; /* derived when not given */
    assert_int_equal(kvedge_decoder_synthesize(d, &bad, 7, false), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_synthesize(NULL, &c, 1, true), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_synthesize("", &c, 1, true), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_synthesize(d, NULL, 1, true), KVEDGE_EINVAL);

    /* Unwritable: a missing directory (errno says why), and a directory in the way of the
     * rename; neither leaves its temporary file. */
    char missing[96], sub[64], subtmp[80];
    snprintf(missing, sizeof missing, "%s/no/such/dir/x.safetensors", dir);
    errno = 0;
    assert_int_equal(kvedge_decoder_synthesize(missing, &c, 1, true), KVEDGE_EIO);
    assert_int_equal(errno, ENOENT);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    snprintf(subtmp, sizeof subtmp, "%s.tmp", sub);
    assert_int_equal(mkdir(sub, 0700), 0);
    assert_int_equal(kvedge_decoder_synthesize(sub, &c, 1, true), KVEDGE_EIO);
    assert_int_equal(access(subtmp, F_OK), -1);
    assert_int_equal(rmdir(sub), 0);

    assert_int_equal(unlink(a), 0);
    assert_int_equal(unlink(b), 0);
    assert_int_equal(unlink(d), 0);
    assert_int_equal(rmdir(dir), 0);
}

static void test_layer_flops(void **state)
{
    (void)state;
    /* hidden 8 (2 heads of 4), ffn 16. Each matrix product is 2 M N K flops. */
    const kvedge_decoder_config_t c = {.layers = 1,
                                       .heads = 2,
                                       .head_dim = 4,
                                       .hidden = 8,
                                       .ffn = 16,
                                       .vocab = 10,
                                       .max_positions = 100};
    double compute = -1, recompute = -1;
    kvedge_decoder_layer_flops(&c, 10, 3, &compute, &recompute);
    /* 3 prompt tokens over 10 context tokens:
     *   q, k, v, out projections  4 * 2 * 3 * 8 * 8   = 1536
     *   fc1 and fc2               2 * 2 * 3 * 8 * 16  = 1536
     *   scores: token i sees 10 + i + 1 keys, per head: 11 + 12 + 13 = 36, 2 heads = 72;
     *   Q K^T and P V, 2 * 4 flops each per score: 72 * 16 = 1152.            total 4224 */
    assert_true(compute == 4224.0);
    /* The 10 context tokens by themselves, causal:
     *   projections 4 * 2 * 10 * 64 = 5120, FFN 2 * 2 * 10 * 128 = 5120,
     *   scores 2 * (1 + 2 + ... + 10) = 110, times 16 = 1760.                 total 12000 */
    assert_true(recompute == 12000.0);
    kvedge_decoder_layer_flops(&c, 0, 1, &compute, &recompute);
    /* One token, nothing before it: 2 * 64 * 4 + 2 * 128 * 2 = 1024, one score per head. */
    assert_true(compute == 1024.0 + 2 * 16);
    assert_true(recompute == 0.0);
    kvedge_decoder_layer_flops(&c, 5, 2, NULL, &recompute); /* outputs are optional */
    kvedge_decoder_layer_flops(&c, 5, 2, &compute, NULL);

    /* The dense part dominates a real model's short prompt: about 2 * parameters per token. */
    kvedge_decoder_config_t opt;
    assert_int_equal(kvedge_decoder_shape("opt-125m", &opt), KVEDGE_OK);
    kvedge_decoder_layer_flops(&opt, 0, 1, &compute, &recompute);
    const double params = 4.0 * 768 * 768 + 2.0 * 768 * 3072;
    assert_true(compute >= 2 * params && compute < 2 * params * 1.001);
    /* Attention grows with the context, the dense part does not. */
    double c1, c2, r1, r2;
    kvedge_decoder_layer_flops(&opt, 512, 32, &c1, &r1);
    kvedge_decoder_layer_flops(&opt, 1024, 32, &c2, &r2);
    assert_true(c2 - c1 == 4.0 * 64 * 12 * 32 * 512);
    assert_true(r2 > 2 * r1);
}

typedef struct {
    const kvedge_decoder_t *md;
    float compute, recompute;
    int rc;
} s_estimate_arg_t;

static void *s_estimate_thread(void *arg)
{
    s_estimate_arg_t *e = arg;
    e->rc = kvedge_decoder_estimate(e->md, 128, 8, &e->compute, &e->recompute);
    return NULL;
}

static void test_estimate(void **state)
{
    (void)state;
    float cu = -1, ru = -1;
    kvedge_decoder_t *empty = kvedge_decoder_new();
    assert_int_equal(kvedge_decoder_estimate(empty, 100, 8, &cu, &ru), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_estimate(NULL, 100, 8, &cu, &ru), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_weights_bytes(empty), 0);
    assert_int_equal(kvedge_decoder_weights_bytes(NULL), 0);
    kvedge_decoder_destroy(&empty);

    /* Threads asking at once on a fresh model get one measurement, so the same answer. */
    kvedge_decoder_t *md = s_model();
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    assert_int_equal(kvedge_decoder_weights_bytes(md), s_weight_bytes(c));
    enum { THREADS = 4 };
    pthread_t th[THREADS];
    s_estimate_arg_t e[THREADS];
    for (int i = 0; i < THREADS; i++) {
        e[i] = (s_estimate_arg_t){.md = md, .rc = 1};
        assert_int_equal(pthread_create(&th[i], NULL, s_estimate_thread, &e[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(e[i].rc, KVEDGE_OK);
        assert_true(e[i].compute == e[0].compute && e[i].recompute == e[0].recompute);
    }

    assert_int_equal(kvedge_decoder_estimate(md, 128, 0, &cu, &ru), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_estimate(md, 128, 8, &cu, &ru), KVEDGE_OK);
    assert_true(cu == e[0].compute && ru == e[0].recompute); /* measured once, kept */
    printf("  estimate on the fixture model, context 128, prompt 8: compute %.1f us, "
           "recompute %.1f us per layer\n",
           cu, ru);
    assert_true(isfinite(cu) && cu > 0);
    assert_true(isfinite(ru) && ru > cu); /* 128 context tokens cost more than 8 */
    float cu0, ru0, cu2, ru2;
    assert_int_equal(kvedge_decoder_estimate(md, 0, 8, &cu0, &ru0), KVEDGE_OK);
    assert_true(ru0 == 0.0f && cu0 > 0 && cu0 <= cu);
    assert_int_equal(kvedge_decoder_estimate(md, 150, 8, &cu2, &ru2), KVEDGE_OK);
    assert_true(ru2 > ru && cu2 >= cu);
    assert_int_equal(kvedge_decoder_estimate(md, 150, 8, NULL, NULL), KVEDGE_OK);
    kvedge_decoder_destroy(&md);
}

/* |a / b - 1| <= tol */
static bool s_near(double a, double b, double tol)
{
    return b != 0 && fabs(a / b - 1) <= tol;
}

typedef struct {
    const kvedge_decoder_t *md;
    float cu0, ru0; /* the prior at context 128, prompt 8 */
    int rc;
    bool in_range; /* every estimate read stayed within the factors' bounds */
} s_learn_arg_t;

/* Observes layers at 2x the prior and reads the estimate, again and again. */
static void *s_learn_thread(void *arg)
{
    s_learn_arg_t *a = arg;
    a->in_range = true;
    for (int i = 0; i < 200 && a->rc == KVEDGE_OK; i++) {
        a->rc = kvedge_decoder_observe(a->md, 128, 8, 2.0 * a->cu0, 2.0 * a->ru0);
        float cu = 0, ru = 0;
        if (a->rc == KVEDGE_OK)
            a->rc = kvedge_decoder_estimate(a->md, 128, 8, &cu, &ru);
        if (a->rc == KVEDGE_OK && !(cu >= a->cu0 * 0.99 && cu <= a->cu0 * 2.01 &&
                                    ru >= a->ru0 * 0.99 && ru <= a->ru0 * 2.01))
            a->in_range = false;
    }
    return NULL;
}

/* kvedge_decoder_observe: the estimate follows what the decoder really takes, per kind, within
 * the stated number of samples, one outlier moves it a bounded step, absurd inputs are refused
 * or clamped, and concurrent observers and readers agree. */
static void test_learn(void **state)
{
    (void)state;
    kvedge_decoder_speed_t sp;
    kvedge_decoder_t *empty = kvedge_decoder_new();
    assert_int_equal(kvedge_decoder_observe(empty, 128, 8, 10, 10), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_observe(NULL, 128, 8, 10, 10), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_speed(empty, &sp), KVEDGE_EINVAL);
    kvedge_decoder_forget(empty);
    kvedge_decoder_forget(NULL);
    kvedge_decoder_destroy(&empty);

    kvedge_decoder_t *md = s_model();
    assert_int_equal(kvedge_decoder_speed(md, NULL), KVEDGE_EINVAL);
    float cu0, ru0, cs0, rs0;
    assert_int_equal(kvedge_decoder_estimate(md, 128, 8, &cu0, &ru0), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_estimate(md, 40, 3, &cs0, &rs0), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_speed(md, &sp), KVEDGE_OK);
    assert_true(sp.compute == 1 && sp.recompute == 1);
    assert_true(sp.compute_samples == 0 && sp.recompute_samples == 0);

    /* Refused, and nothing learned: no prompt, NaN, infinities, nothing measured. */
    assert_int_equal(kvedge_decoder_observe(md, 128, 0, 10, 10), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_observe(md, 128, 8, NAN, 10), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_observe(md, 128, 8, 10, NAN), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_observe(md, 128, 8, INFINITY, -1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_observe(md, 128, 8, -INFINITY, 10), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_observe(md, 128, 8, 10, INFINITY), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_observe(md, 128, 8, -1, -1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_observe(md, 0, 8, -1, 10), KVEDGE_EINVAL); /* no context */
    assert_int_equal(kvedge_decoder_speed(md, &sp), KVEDGE_OK);
    assert_true(sp.compute == 1 && sp.recompute == 1 && sp.compute_samples == 0);

    /* Compute observed at 3x, recompute at 0.5x: within 5 % after LEARN_SAMPLES samples,
     * closer with every one, the flop model still scaling other shapes. */
    double prev = 1;
    for (int i = 0; i < KVEDGE_DECODER_LEARN_SAMPLES; i++) {
        assert_int_equal(kvedge_decoder_observe(md, 128, 8, 3.0 * cu0, 0.5 * ru0), KVEDGE_OK);
        assert_int_equal(kvedge_decoder_speed(md, &sp), KVEDGE_OK);
        assert_true(sp.compute > prev && sp.compute < 3.0 * 1.0001);
        assert_true(sp.compute <= prev * pow(2, KVEDGE_DECODER_LEARN_WEIGHT) * 1.0001);
        prev = sp.compute;
    }
    assert_true(sp.compute_samples == KVEDGE_DECODER_LEARN_SAMPLES &&
                sp.recompute_samples == KVEDGE_DECODER_LEARN_SAMPLES);
    float cu, ru;
    assert_int_equal(kvedge_decoder_estimate(md, 128, 8, &cu, &ru), KVEDGE_OK);
    printf("  learned after %d samples: compute %.3fx, recompute %.3fx of the calibration\n",
           KVEDGE_DECODER_LEARN_SAMPLES, cu / cu0, ru / ru0);
    assert_true(s_near(cu, 3.0 * cu0, 0.05) && s_near(ru, 0.5 * ru0, 0.05));
    float cs, rs;
    assert_int_equal(kvedge_decoder_estimate(md, 40, 3, &cs, &rs), KVEDGE_OK);
    assert_true(s_near(cs / cs0, cu / cu0, 1e-5) && s_near(rs / rs0, ru / ru0, 1e-5));

    /* One outlier (a million times the prior) moves the factor one bounded step. */
    kvedge_decoder_speed_t before;
    assert_int_equal(kvedge_decoder_speed(md, &before), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_observe(md, 128, 8, 1e6 * cu0, -1), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_speed(md, &sp), KVEDGE_OK);
    assert_true(sp.compute <= before.compute * pow(2, KVEDGE_DECODER_LEARN_WEIGHT) * 1.0001);
    assert_true(sp.recompute == before.recompute); /* not measured: unchanged */

    /* Absurd but finite inputs are clamped: no estimate beyond [MIN, MAX] x the calibration. */
    for (int i = 0; i < 100; i++)
        assert_int_equal(kvedge_decoder_observe(md, 128, 8, 1e300, 1e300), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_estimate(md, 128, 8, &cu, &ru), KVEDGE_OK);
    assert_true(isfinite(cu) && cu <= cu0 * KVEDGE_DECODER_LEARN_MAX * 1.0001);
    assert_true(s_near(cu, cu0 * KVEDGE_DECODER_LEARN_MAX, 0.01));
    assert_true(isfinite(ru) && ru <= ru0 * KVEDGE_DECODER_LEARN_MAX * 1.0001);
    for (int i = 0; i < 100; i++)
        assert_int_equal(kvedge_decoder_observe(md, 128, 8, 0, 0), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_estimate(md, 128, 8, &cu, &ru), KVEDGE_OK);
    assert_true(cu > 0 && cu >= cu0 * KVEDGE_DECODER_LEARN_MIN * 0.9999);
    assert_true(s_near(cu, cu0 * KVEDGE_DECODER_LEARN_MIN, 0.01));
    assert_true(ru > 0 && ru >= ru0 * KVEDGE_DECODER_LEARN_MIN * 0.9999);

    /* Forget: the calibration again, exactly; it was not measured again. */
    kvedge_decoder_forget(md);
    assert_int_equal(kvedge_decoder_estimate(md, 128, 8, &cu, &ru), KVEDGE_OK);
    assert_true(cu == cu0 && ru == ru0);
    assert_int_equal(kvedge_decoder_speed(md, &sp), KVEDGE_OK);
    assert_true(sp.compute == 1 && sp.recompute_samples == 0);

    /* Threads observing 2x and reading at once: every sample counted, estimates in between. */
    enum { THREADS = 4 };
    pthread_t th[THREADS];
    s_learn_arg_t a[THREADS];
    for (int i = 0; i < THREADS; i++) {
        a[i] = (s_learn_arg_t){.md = md, .cu0 = cu0, .ru0 = ru0, .rc = KVEDGE_OK};
        assert_int_equal(pthread_create(&th[i], NULL, s_learn_thread, &a[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(a[i].rc, KVEDGE_OK);
        assert_true(a[i].in_range);
    }
    assert_int_equal(kvedge_decoder_speed(md, &sp), KVEDGE_OK);
    assert_true(sp.compute_samples == THREADS * 200 && sp.recompute_samples == THREADS * 200);
    assert_true(s_near(sp.compute, 2, 1e-4) && s_near(sp.recompute, 2, 1e-4));
    kvedge_decoder_destroy(&md);
}

/* The project's trained models (models/kjv, scripts/train_models.py) against the PyTorch
 * model that trained them: the same weights (F16 matrices widened to fp32 on both sides),
 * logits at every position of 64 held-out tokens and 8 greedy steps by full recomputation.
 * Their logits reach ~14; fp32 summation order moves them by ~1e-5; the bound has margin. */
#define S_TOL_TRAINED 2e-4f

static void s_trained(const char *size)
{
    char path[512], exp[512];
    snprintf(path, sizeof path, "%s/kjv/%s/model.safetensors", KVEDGE_MODELS, size);
    snprintf(exp, sizeof exp, "%s/kjv/%s/expected.safetensors", KVEDGE_MODELS, size);
    kvedge_decoder_t *md = kvedge_decoder_new();
    if (kvedge_decoder_load(md, path, 0) != KVEDGE_OK) /* heads from the file's metadata */
        fail_msg("%s: %s", path, kvedge_decoder_error(md));
    const uint32_t V = kvedge_decoder_config(md)->vocab;
    assert_int_equal(V, 4096);
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    assert_int_equal(kvedge_safetensors_open(st, exp), KVEDGE_OK);
    size_t nt, nl, ng, ngl;
    float *ft = s_expected(st, "prefill.tokens", &nt);
    float *want = s_expected(st, "prefill.logits", &nl);
    float *gt = s_expected(st, "greedy.tokens", &ng);
    float *gl = s_expected(st, "greedy.logits", &ngl);
    assert_int_equal(nl, nt * V);
    assert_int_equal(ng, S_GREEDY);
    int32_t tokens[64 + S_GREEDY];
    assert_true(nt <= 64);
    for (size_t i = 0; i < nt; i++)
        tokens[i] = (int32_t)ft[i];
    float *got = malloc(V * sizeof(float));
    float worst = 0;
    for (uint32_t n = 1; n <= nt; n++) {
        assert_int_equal(kvedge_decoder_prefill(md, tokens, n, got, NULL, NULL), KVEDGE_OK);
        float d = s_max_diff(got, want + (size_t)(n - 1) * V, V);
        worst = d > worst ? d : worst;
    }
    /* Greedy steps by full recomputation, as PyTorch made them. */
    float gworst = 0;
    for (uint32_t i = 0; i < S_GREEDY; i++) {
        uint32_t n = (uint32_t)nt + i;
        assert_int_equal(kvedge_decoder_prefill(md, tokens, n, got, NULL, NULL), KVEDGE_OK);
        tokens[n] = kvedge_decoder_argmax(got, V);
        assert_int_equal(tokens[n], (int32_t)gt[i]);
        float d = s_max_diff(got, gl + (size_t)i * V, V);
        gworst = d > gworst ? d : gworst;
    }
    printf("  %s model vs PyTorch: %zu positions max |logit diff| = %.3g, %u greedy tokens "
           "identical (max diff %.3g), tol %.0e, max |logit| %.3g\n",
           size, nt, worst, S_GREEDY, gworst, S_TOL_TRAINED, s_max_abs(want, nl));
    assert_true(worst <= S_TOL_TRAINED);
    assert_true(gworst <= S_TOL_TRAINED);
    free(got);
    free(want);
    free(gt);
    free(gl);
    free(ft);
    kvedge_safetensors_destroy(&st);
    kvedge_decoder_destroy(&md);
}

static void test_trained_cloud(void **state)
{
    (void)state;
    s_trained("cloud");
}

static void test_trained_edge(void **state)
{
    (void)state;
    s_trained("edge");
}

/* One holder taking and giving its share 1000 times; *arg is the base thread count. While it
 * holds one, BLAS runs on the fewer threads, whatever the others do. */
static void *s_share_loop(void *arg)
{
    const int base = *(const int *)arg, fewer = base - KVEDGE_DECODER_FETCH_THREADS;
    bool held = false;
    for (int i = 0; i < 1000; i++) {
        const int n = kvedge_decoder_share_cores(&held, i % 3 != 0);
        if (held ? n != fewer : n != fewer && n != base)
            return (void *)1;
    }
    kvedge_decoder_share_cores(&held, false);
    return NULL;
}

/* kvedge_decoder_share_cores: a share runs BLAS on KVEDGE_DECODER_FETCH_THREADS fewer threads
 * (at least 1); shares are counted process-wide and the count in use before the first is
 * restored when the last is given back; a holder's flag makes taking and giving idempotent. */
static void test_share_cores(void **state)
{
    (void)state;
    const int before = openblas_get_num_threads();
    openblas_set_num_threads(4); /* OpenBLAS starts more threads than cores if asked */
    const int base = openblas_get_num_threads();
    assert_true(base > KVEDGE_DECODER_FETCH_THREADS);
    const int fewer = base - KVEDGE_DECODER_FETCH_THREADS;
    bool a = false, b = false;
    assert_int_equal(kvedge_decoder_share_cores(&a, false), base); /* not held: nothing */
    assert_false(a);
    assert_int_equal(kvedge_decoder_share_cores(NULL, true), base); /* no flag: nothing */
    assert_int_equal(kvedge_decoder_share_cores(&a, true), fewer);
    assert_true(a);
    assert_int_equal(openblas_get_num_threads(), fewer);
    assert_int_equal(kvedge_decoder_share_cores(&a, true), fewer); /* held: counted once */
    assert_int_equal(kvedge_decoder_share_cores(&b, true), fewer);
    assert_int_equal(kvedge_decoder_share_cores(&a, false), fewer); /* b still holds one */
    assert_false(a);
    assert_int_equal(kvedge_decoder_share_cores(&a, false), fewer); /* not held: nothing */
    assert_int_equal(kvedge_decoder_share_cores(&b, false), base);  /* the last: restored */
    assert_false(b);
    assert_int_equal(openblas_get_num_threads(), base);
    /* Two threads of cores: a share keeps at least one. */
    openblas_set_num_threads(2);
    assert_int_equal(kvedge_decoder_share_cores(&a, true), 1);
    assert_int_equal(kvedge_decoder_share_cores(&a, false), 2);
    /* Many holders on many threads: balanced, they leave the count as it was. */
    openblas_set_num_threads(base);
    enum { S_HOLDERS = 8 };
    pthread_t t[S_HOLDERS];
    int base_arg = base;
    for (int i = 0; i < S_HOLDERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, s_share_loop, &base_arg), 0);
    for (int i = 0; i < S_HOLDERS; i++) {
        void *bad = (void *)1;
        pthread_join(t[i], &bad);
        assert_null(bad);
    }
    assert_int_equal(openblas_get_num_threads(), base);
    openblas_set_num_threads(before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_config),    cmocka_unit_test(test_fixture_prefill),
        cmocka_unit_test(test_fixture_greedy),    cmocka_unit_test(test_trained_cloud),
        cmocka_unit_test(test_trained_edge),      cmocka_unit_test(test_context_lossless),
        cmocka_unit_test(test_context_quantized), cmocka_unit_test(test_context_miss),
        cmocka_unit_test(test_context_in_place),  cmocka_unit_test(test_provider_errors),
        cmocka_unit_test(test_argument_errors),   cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_load_variants),     cmocka_unit_test(test_prefill_tiles),
        cmocka_unit_test(test_model_shapes),      cmocka_unit_test(test_synthesize_hf),
        cmocka_unit_test(test_synthesize),        cmocka_unit_test(test_layer_flops),
        cmocka_unit_test(test_estimate),          cmocka_unit_test(test_learn),
        cmocka_unit_test(test_share_cores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
