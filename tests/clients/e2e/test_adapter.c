/* The K/V adapter (clients/e2e/adapter.h, gpu/adapt.h): the linear fit on a known affine map, head
 * matching on permuted and scaled heads, ThinK's channels on a hand-made case, both kinds fitted
 * on synthesized models against the pieces run by hand, apply and kvedge_cpu_adapt against
 * naive loops, the file's round trip and every kind of refused file, check() and `kvedge
 * layermap --adapter` end to end. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "clients/e2e/adapter.h"
#include "clients/decoder/decoder.h"
#include "clients/e2e/layermap.h"
#include "gpu/adapt.h"
#include "access/codec/error.h"
#include "tests/common/shell.h"

static char s_dir[64];

static uint64_t s_rng = 0x2545f4914f6cdd1dull;

/* A normal deviate (Box-Muller over xorshift). */
static double s_normal(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        s_rng ^= s_rng << 13;
        s_rng ^= s_rng >> 7;
        s_rng ^= s_rng << 17;
        u[i] = ((s_rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static float *s_random(size_t n, float scale)
{
    float *m = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(m);
    for (size_t i = 0; i < n; i++)
        m[i] = scale * (float)s_normal();
    return m;
}

/* y [n][dout] = [x, 1] w, in double. */
static void s_naive_affine(const float *x, const float *w, uint32_t n, uint32_t din, uint32_t dout,
                           double *y)
{
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t j = 0; j < dout; j++) {
            double s = w[(size_t)din * dout + j];
            for (uint32_t i = 0; i < din; i++)
                s += (double)x[(size_t)t * din + i] * w[(size_t)i * dout + j];
            y[(size_t)t * dout + j] = s;
        }
}

/* ---- the linear fit ---- */

static void test_fit_linear(void **state)
{
    (void)state;
    const uint32_t n = 300, din = 9, dout = 5;
    float *x = s_random((size_t)n * din, 1.0f), *w = s_random((size_t)(din + 1) * dout, 1.0f);
    float *y = malloc(sizeof(float) * n * dout), *got = malloc(sizeof(float) * (din + 1) * dout);
    double *yd = malloc(sizeof(double) * n * dout);
    assert_true(y && got && yd);
    for (uint32_t j = 0; j < dout; j++) /* a bias well away from zero */
        w[(size_t)din * dout + j] += 3.0f;
    s_naive_affine(x, w, n, din, dout, yd);
    for (size_t i = 0; i < (size_t)n * dout; i++)
        y[i] = (float)yd[i];
    /* No ridge: the map itself, to float rounding. */
    assert_int_equal(kvedge_adapter_fit_linear(x, y, n, din, dout, 0.0, got), KVEDGE_OK);
    for (size_t i = 0; i < (size_t)(din + 1) * dout; i++)
        assert_true(fabsf(got[i] - w[i]) <= 1e-4f);
    /* A small ridge moves it a little; a large one shrinks the weights, not the bias. */
    assert_int_equal(kvedge_adapter_fit_linear(x, y, n, din, dout, 1e-6, got), KVEDGE_OK);
    for (size_t i = 0; i < (size_t)(din + 1) * dout; i++)
        assert_true(fabsf(got[i] - w[i]) <= 1e-3f);
    assert_int_equal(kvedge_adapter_fit_linear(x, y, n, din, dout, 1e4, got), KVEDGE_OK);
    double wn = 0, gn = 0;
    for (size_t i = 0; i < (size_t)din * dout; i++) {
        wn += (double)w[i] * w[i];
        gn += (double)got[i] * got[i];
    }
    assert_true(gn < 1e-4 * wn);
    for (uint32_t j = 0; j < dout; j++) /* the bias takes the mean of y */
        assert_true(fabsf(got[(size_t)din * dout + j] - w[(size_t)din * dout + j]) < 0.5f);
    /* Errors: a singular system (ridge 0, fewer samples than unknowns), bad arguments. */
    assert_int_equal(kvedge_adapter_fit_linear(x, y, 4, din, dout, 0.0, got), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_fit_linear(x, y, 4, din, dout, 1e-3, got), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_fit_linear(x, y, n, din, dout, -1.0, got), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_fit_linear(x, y, n, din, dout, NAN, got), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_fit_linear(NULL, y, n, din, dout, 0, got), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_fit_linear(x, y, 0, din, dout, 0, got), KVEDGE_EINVAL);
    free(x);
    free(w);
    free(y);
    free(got);
    free(yd);
}

/* ---- head matching and ThinK ---- */

static void test_match_heads(void **state)
{
    (void)state;
    const uint32_t n = 64, hc = 5, dc = 8;
    float *ck = s_random((size_t)hc * n * dc, 1.0f);
    /* Edge heads: scaled copies of cloud heads 3, 0, 4, with the channels permuted (CKA is
     * invariant to both) and a little noise; 6 channels of the 8 kept. */
    const uint32_t he = 3, de = 6, perm[3] = {3, 0, 4};
    const float scale[3] = {0.1f, 7.0f, -2.0f};
    float *ek = malloc(sizeof(float) * he * n * de);
    assert_non_null(ek);
    for (uint32_t h = 0; h < he; h++)
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t j = 0; j < de; j++)
                ek[((size_t)h * n + t) * de + j] =
                    scale[h] * ck[((size_t)perm[h] * n + t) * dc + (j * 5 + 1) % dc] +
                    0.01f * (float)s_normal();
    uint32_t match[5];
    double cka[3 * 5];
    assert_int_equal(kvedge_adapter_match_heads(ek, he, de, ck, hc, dc, n, match, cka), KVEDGE_OK);
    for (uint32_t h = 0; h < he; h++) {
        assert_int_equal(match[h], perm[h]);
        assert_true(cka[h * hc + perm[h]] > 0.6);
    }
    /* Fewer cloud heads than edge heads: two unique, the third reuses its best. Edge heads
     * 0 and 2 both copy cloud head 1 (2 the closer one); edge head 1 copies cloud head 0. */
    float *ek2 = malloc(sizeof(float) * 3 * n * dc);
    assert_non_null(ek2);
    const uint32_t src[3] = {1, 0, 1};
    const float noise[3] = {0.5f, 0.01f, 0.01f};
    for (uint32_t h = 0; h < 3; h++)
        for (size_t i = 0; i < (size_t)n * dc; i++)
            ek2[(size_t)h * n * dc + i] =
                ck[(size_t)src[h] * n * dc + i] + noise[h] * (float)s_normal();
    assert_int_equal(kvedge_adapter_match_heads(ek2, 3, dc, ck, 2, dc, n, match, NULL), KVEDGE_OK);
    assert_int_equal(match[0], 1); /* reused: 2 took cloud head 1 first (higher CKA) */
    assert_int_equal(match[1], 0);
    assert_int_equal(match[2], 1);
    assert_int_equal(kvedge_adapter_match_heads(ek, he, de, ck, hc, dc, 1, match, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_match_heads(ek, 0, de, ck, hc, dc, n, match, NULL),
                     KVEDGE_EINVAL);
    free(ck);
    free(ek);
    free(ek2);
}

static void test_think_channels(void **state)
{
    (void)state;
    /* One query row and one key row: channel j scores |q_j| |k_j|. Scores 5 1 9 2 7 3 7 0: the
     * top 3 are 2 (9), then 4 and 6 (7, a tie: both, lower first) ... kept in channel order. */
    const uint32_t hd = 8;
    const float q[2 * 8] = {5, 1, 3, 2, 7, 3, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    const float k[2 * 8] = {1, 1, 3, 1, 1, 1, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t ch[8];
    assert_int_equal(kvedge_adapter_think_channels(q, k, 2, hd, 3, ch), KVEDGE_OK);
    assert_int_equal(ch[0], 2);
    assert_int_equal(ch[1], 4);
    assert_int_equal(ch[2], 6);
    /* keep 2: the tie between 4 and 6 goes to the lower channel. */
    assert_int_equal(kvedge_adapter_think_channels(q, k, 2, hd, 2, ch), KVEDGE_OK);
    assert_int_equal(ch[0], 2);
    assert_int_equal(ch[1], 4);
    /* keep 5: 0 (5) and 5 (3) join; channel 7 (q 0) never does before them. */
    assert_int_equal(kvedge_adapter_think_channels(q, k, 2, hd, 5, ch), KVEDGE_OK);
    const uint32_t want[5] = {0, 2, 4, 5, 6};
    for (int i = 0; i < 5; i++)
        assert_int_equal(ch[i], want[i]);
    assert_int_equal(kvedge_adapter_think_channels(q, k, 2, hd, 9, ch), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_think_channels(q, k, 2, hd, 0, ch), KVEDGE_EINVAL);
}

/* ---- fits on synthesized models ---- */

/* Two small OPT models of different shapes: A (3 heads x 8) and B (4 heads x 4). */
static kvedge_decoder_t *s_model(const char *name, uint32_t layers, uint32_t heads, uint32_t hd,
                                 uint64_t seed)
{
    char path[160];
    snprintf(path, sizeof path, "%s/%s.safetensors", s_dir, name);
    kvedge_decoder_config_t c = {layers, heads, hd, heads * hd, 4 * heads * hd, 64, 40, heads};
    assert_int_equal(kvedge_decoder_synthesize(path, &c, seed, false), KVEDGE_OK);
    kvedge_decoder_t *md = kvedge_decoder_new();
    assert_int_equal(kvedge_decoder_load(md, path, heads), KVEDGE_OK);
    return md;
}

static void s_map(kvedge_layermap_t *m, const kvedge_decoder_t *cloud, const kvedge_decoder_t *edge,
                  const int32_t *from)
{
    memset(m, 0, sizeof *m);
    snprintf(m->cloud_id, sizeof m->cloud_id, "big");
    snprintf(m->edge_id, sizeof m->edge_id, "small");
    m->cloud_layers = kvedge_decoder_config(cloud)->layers;
    m->cloud_hidden = kvedge_decoder_config(cloud)->hidden;
    m->edge_layers = kvedge_decoder_config(edge)->layers;
    m->edge_hidden = kvedge_decoder_config(edge)->hidden;
    m->samples = 100;
    m->cka_min = m->rsa_min = 0.5;
    m->entry = calloc(m->edge_layers, sizeof *m->entry);
    assert_non_null(m->entry);
    for (uint32_t e = 0; e < m->edge_layers; e++) {
        m->entry[e].cloud = from[e];
        m->entry[e].cka = m->entry[e].rsa = 0.9;
    }
}

/* One layer's Q, K, V of a traced prefill over all tokens in windows of 40: [heads][n][hd]. */
typedef struct {
    uint32_t layer, heads, hd, n, row0;
    float *q, *k, *v;
} s_one_t;

static int s_one_layer(void *arg, uint32_t layer, const float *hidden, uint32_t n, const float *q,
                       const float *k, const float *v)
{
    (void)hidden;
    s_one_t *o = arg;
    if (layer != o->layer)
        return KVEDGE_OK;
    for (uint32_t h = 0; h < o->heads; h++) {
        const size_t dst = ((size_t)h * o->n + o->row0) * o->hd, src = (size_t)h * n * o->hd;
        memcpy(o->q + dst, q + src, (size_t)n * o->hd * sizeof(float));
        memcpy(o->k + dst, k + src, (size_t)n * o->hd * sizeof(float));
        memcpy(o->v + dst, v + src, (size_t)n * o->hd * sizeof(float));
    }
    return KVEDGE_OK;
}

static void s_one(const kvedge_decoder_t *md, uint32_t layer, const int32_t *tok, uint32_t n,
                  s_one_t *o)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    const size_t f = (size_t)c->heads * n * c->head_dim;
    *o = (s_one_t){layer, c->heads,       c->head_dim,    n,
                   0,     s_random(f, 0), s_random(f, 0), s_random(f, 0)};
    for (uint32_t at = 0; at < n; at += 40) {
        o->row0 = at;
        const uint32_t w = n - at < 40 ? n - at : 40;
        assert_int_equal(kvedge_decoder_prefill_trace(md, tok + at, w, s_one_layer, o), KVEDGE_OK);
    }
}

static void s_one_free(s_one_t *o)
{
    free(o->q);
    free(o->k);
    free(o->v);
}

/* [heads][n][hd] -> [n][heads * hd]. */
static float *s_tokens_major(const s_one_t *o)
{
    float *x = malloc(sizeof(float) * o->heads * o->n * o->hd);
    assert_non_null(x);
    for (uint32_t h = 0; h < o->heads; h++)
        for (uint32_t t = 0; t < o->n; t++)
            for (uint32_t j = 0; j < o->hd; j++)
                x[((size_t)t * o->heads + h) * o->hd + j] =
                    o->k[((size_t)h * o->n + t) * o->hd + j];
    return x;
}

/* A heads adapter's layer against match_heads and think_channels run by hand. */
static void s_check_heads_layer(const kvedge_adapter_t *a, uint32_t e, const s_one_t *c,
                                const s_one_t *ed)
{
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    const uint32_t dc = i->cloud_head_dim, de = i->edge_head_dim;
    const size_t din = (size_t)i->cloud_heads * dc, dout = (size_t)i->edge_heads * de;
    const float *wk = kvedge_adapter_weights(a, e, false), *wv = kvedge_adapter_weights(a, e, true);
    assert_non_null(wk);
    assert_memory_equal(wk, wv, (din + 1) * dout * sizeof(float)); /* V: K's heads, channels */
    uint32_t match[8], ch[64];
    assert_int_equal(kvedge_adapter_match_heads(ed->k, i->edge_heads, de, c->k, i->cloud_heads, dc,
                                                c->n, match, NULL),
                     KVEDGE_OK);
    for (uint32_t h = 0; h < i->edge_heads; h++) {
        const uint32_t src = match[h], keep = dc < de ? dc : de;
        if (dc > de)
            assert_int_equal(kvedge_adapter_think_channels(c->q + (size_t)src * c->n * dc,
                                                           c->k + (size_t)src * c->n * dc, c->n, dc,
                                                           de, ch),
                             KVEDGE_OK);
        else
            for (uint32_t j = 0; j < keep; j++)
                ch[j] = j;
        for (uint32_t j = 0; j < de; j++)
            for (size_t r = 0; r <= din; r++) {
                const float want =
                    j < keep && r == (size_t)src * dc + ch[j] ? 1.0f : 0.0f; /* else zero */
                assert_true(wk[r * dout + (size_t)h * de + j] == want);
            }
    }
}

static void test_fit_models(void **state)
{
    (void)state;
    kvedge_decoder_t *big = s_model("big", 3, 3, 8, 11), *small = s_model("small", 2, 4, 4, 12);
    const uint32_t n = 100;
    int32_t tok[100];
    for (uint32_t t = 0; t < n; t++)
        tok[t] = (int32_t)((t * 29 + 3) % 64);
    kvedge_layermap_t map;
    const int32_t from[2] = {2, KVEDGE_LAYERMAP_NONE};
    s_map(&map, big, small, from);
    s_one_t c2, e0;
    s_one(big, 2, tok, n, &c2);
    s_one(small, 0, tok, n, &e0);

    /* Heads, cloud wider (8 > 4: ThinK) and with fewer heads (3 < 4: one reused). */
    kvedge_adapter_t *a = NULL;
    assert_int_equal(kvedge_adapter_fit(big, small, &map, tok, n, n, KVEDGE_ADAPT_HEADS, -1, &a),
                     KVEDGE_OK);
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    assert_int_equal(i->kind, KVEDGE_ADAPT_HEADS);
    assert_int_equal(i->cloud_heads, 3);
    assert_int_equal(i->edge_head_dim, 4);
    assert_int_equal(i->samples, n);
    assert_true(i->ridge == 0);
    assert_string_equal(i->cloud_id, "big");
    assert_int_equal(kvedge_adapter_from(a, 0), 2);
    assert_int_equal(kvedge_adapter_from(a, 1), KVEDGE_LAYERMAP_NONE);
    assert_int_equal(kvedge_adapter_from(a, 2), KVEDGE_LAYERMAP_NONE);
    assert_null(kvedge_adapter_weights(a, 1, false));
    s_check_heads_layer(a, 0, &c2, &e0);
    kvedge_adapter_destroy(&a);
    assert_null(a);

    /* Linear: the fit of the pieces, to the bit. */
    assert_int_equal(kvedge_adapter_fit(big, small, &map, tok, n, n, KVEDGE_ADAPT_LINEAR, -1, &a),
                     KVEDGE_OK);
    assert_true(kvedge_adapter_info(a)->ridge == KVEDGE_ADAPT_RIDGE_DEFAULT);
    float *x = s_tokens_major(&c2), *y = s_tokens_major(&e0);
    float *w = malloc(sizeof(float) * 25 * 16);
    assert_int_equal(kvedge_adapter_fit_linear(x, y, n, 24, 16, KVEDGE_ADAPT_RIDGE_DEFAULT, w),
                     KVEDGE_OK);
    assert_memory_equal(w, kvedge_adapter_weights(a, 0, false), sizeof(float) * 25 * 16);
    /* Its error on the calibration tokens: below 1 (better than nothing), NaN when unmapped. */
    double ek[2], ev[2];
    assert_int_equal(kvedge_adapter_eval(a, big, small, tok, n, n, ek, ev), KVEDGE_OK);
    assert_true(ek[0] < 1 && ev[0] < 1 && ek[0] >= 0);
    assert_true(isnan(ek[1]) && isnan(ev[1]));
    kvedge_adapter_destroy(&a);
    free(x);
    free(y);
    free(w);

    /* Heads with the cloud narrower (4 < 8: channels 4..7 zero) and more heads (4 > 3). */
    kvedge_layermap_t back;
    const int32_t from2[3] = {KVEDGE_LAYERMAP_NONE, 1, 0};
    s_map(&back, small, big, from2);
    assert_int_equal(kvedge_adapter_fit(small, big, &back, tok, n, 50, KVEDGE_ADAPT_HEADS, 0, &a),
                     KVEDGE_OK);
    s_one_t c0, e2;
    s_one(small, 0, tok, 50, &c0);
    s_one(big, 2, tok, 50, &e2);
    s_check_heads_layer(a, 2, &c0, &e2);
    kvedge_adapter_destroy(&a);
    s_one_free(&c0);
    s_one_free(&e2);

    /* Errors: a map of other models, too few tokens, a bad kind, NaN ridge. */
    assert_int_equal(kvedge_adapter_fit(small, big, &map, tok, n, n, KVEDGE_ADAPT_LINEAR, -1, &a),
                     KVEDGE_EINVAL);
    assert_null(a);
    assert_int_equal(
        kvedge_adapter_fit(big, small, &map, tok, n - 1, n, KVEDGE_ADAPT_LINEAR, -1, &a),
        KVEDGE_ETRUNCATED);
    assert_int_equal(kvedge_adapter_fit(big, small, &map, tok, n, 1, KVEDGE_ADAPT_LINEAR, -1, &a),
                     KVEDGE_ETRUNCATED);
    assert_int_equal(kvedge_adapter_fit(big, small, &map, tok, n, n, 7, -1, &a), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_fit(big, small, &map, tok, n, n, KVEDGE_ADAPT_LINEAR, NAN, &a),
                     KVEDGE_EINVAL);
    kvedge_layermap_clear(&map);
    kvedge_layermap_clear(&back);
    s_one_free(&c2);
    s_one_free(&e0);
    kvedge_decoder_destroy(&big);
    kvedge_decoder_destroy(&small);
}

/* ---- apply ---- */

static kvedge_adapter_info_t s_info(kvedge_adapt_kind_t kind)
{
    kvedge_adapter_info_t i = {.kind = kind,
                               .cloud_layers = 4,
                               .cloud_heads = 3,
                               .cloud_head_dim = 5,
                               .edge_layers = 2,
                               .edge_heads = 2,
                               .edge_head_dim = 7,
                               .samples = 99,
                               .ridge = kind == KVEDGE_ADAPT_LINEAR ? 0.25 : 0};
    snprintf(i.cloud_id, sizeof i.cloud_id, "c-\"1\\");
    snprintf(i.edge_id, sizeof i.edge_id, "e1");
    return i;
}

/* A linear adapter of s_info's shape with random weights; layer 1 from cloud layer 3. */
static kvedge_adapter_t *s_linear_adapter(float **w)
{
    const kvedge_adapter_info_t i = s_info(KVEDGE_ADAPT_LINEAR);
    const int32_t from[2] = {KVEDGE_LAYERMAP_NONE, 3};
    w[0] = w[1] = NULL;
    w[2] = s_random(16 * 14, 0.5f);
    w[3] = s_random(16 * 14, 0.5f);
    kvedge_adapter_t *a = NULL;
    char why[256];
    assert_int_equal(kvedge_adapter_make(&i, from, (const float *const *)w, &a, why, sizeof why),
                     KVEDGE_OK);
    return a;
}

static void test_apply(void **state)
{
    (void)state;
    float *w[4];
    kvedge_adapter_t *a = s_linear_adapter(w);
    const uint32_t T = 13, hc = 3, dc = 5, he = 2, de = 7;
    float *ks = s_random(hc * T * dc, 1.0f), *vs = s_random(hc * T * dc, 1.0f);
    float *kd = malloc(sizeof(float) * he * T * de), *vd = malloc(sizeof(float) * he * T * de);
    assert_int_equal(kvedge_adapter_apply(a, 1, ks, vs, T, kd, vd), KVEDGE_OK);
    /* The naive loop, straight from the head-major layouts. */
    for (int t2 = 0; t2 < 2; t2++) {
        const float *src = t2 ? vs : ks, *wt = w[2 + t2], *got = t2 ? vd : kd;
        for (uint32_t h = 0; h < he; h++)
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t j = 0; j < de; j++) {
                    const uint32_t col = h * de + j;
                    double s = wt[15 * 14 + col];
                    for (uint32_t c = 0; c < hc; c++)
                        for (uint32_t i = 0; i < dc; i++)
                            s += (double)src[((size_t)c * T + t) * dc + i] *
                                 wt[(size_t)(c * dc + i) * 14 + col];
                    const float g = got[((size_t)h * T + t) * de + j];
                    assert_true(fabs(g - s) <= KVEDGE_ADAPT_TOL * (1 + fabs(s)));
                }
    }
    /* A non-finite output: the caller computes the layer itself. */
    ks[7] = INFINITY;
    assert_int_equal(kvedge_adapter_apply(a, 1, ks, vs, T, kd, vd), KVEDGE_ECORRUPT);
    ks[7] = 1.0f;
    vs[3] = NAN;
    assert_int_equal(kvedge_adapter_apply(a, 1, ks, vs, T, kd, vd), KVEDGE_ECORRUPT);
    /* Not mapped, out of range, no tokens, NULL. */
    assert_int_equal(kvedge_adapter_apply(a, 0, ks, vs, T, kd, vd), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_apply(a, 2, ks, vs, T, kd, vd), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_apply(a, 1, ks, vs, 0, kd, vd), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_apply(NULL, 1, ks, vs, T, kd, vd), KVEDGE_EINVAL);
    kvedge_adapter_destroy(&a);
    kvedge_adapter_destroy(&a); /* NULL-safe */
    free(ks);
    free(vs);
    free(kd);
    free(vd);
    free(w[2]);
    free(w[3]);
}

static void test_cpu_adapt(void **state)
{
    (void)state;
    const uint32_t toks[] = {1, 3, 17}, dins[] = {1, 5, 33}, douts[] = {1, 7, 19};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++) {
                const uint32_t T = toks[a], din = dins[b], dout = douts[c];
                float *x = s_random((size_t)T * din, 1.0f);
                float *w = s_random((size_t)(din + 1) * dout, 1.0f);
                float *y = malloc(sizeof(float) * T * dout);
                double *ref = malloc(sizeof(double) * T * dout);
                const kvedge_adapt_args_t args = {x, w, T, din, dout, y};
                assert_int_equal(kvedge_cpu_adapt(&args), KVEDGE_OK);
                s_naive_affine(x, w, T, din, dout, ref);
                for (size_t i = 0; i < (size_t)T * dout; i++)
                    assert_true(fabs(y[i] - ref[i]) <= KVEDGE_ADAPT_TOL * (1 + fabs(ref[i])));
                free(x);
                free(w);
                free(y);
                free(ref);
            }
    float one = 1;
    kvedge_adapt_args_t bad = {&one, &one, 0, 1, 1, &one};
    assert_int_equal(kvedge_cpu_adapt(&bad), KVEDGE_EINVAL);
    bad.tokens = 1;
    bad.y = NULL;
    assert_int_equal(kvedge_cpu_adapt(&bad), KVEDGE_EINVAL);
    assert_int_equal(kvedge_cpu_adapt(NULL), KVEDGE_EINVAL);
}

/* ---- the file ---- */

static void s_same(const kvedge_adapter_t *a, const kvedge_adapter_t *b)
{
    const kvedge_adapter_info_t *x = kvedge_adapter_info(a), *y = kvedge_adapter_info(b);
    assert_int_equal(x->kind, y->kind);
    assert_string_equal(x->cloud_id, y->cloud_id);
    assert_string_equal(x->edge_id, y->edge_id);
    assert_int_equal(x->cloud_layers, y->cloud_layers);
    assert_int_equal(x->cloud_heads, y->cloud_heads);
    assert_int_equal(x->cloud_head_dim, y->cloud_head_dim);
    assert_int_equal(x->edge_layers, y->edge_layers);
    assert_int_equal(x->edge_heads, y->edge_heads);
    assert_int_equal(x->edge_head_dim, y->edge_head_dim);
    assert_int_equal(x->samples, y->samples);
    assert_memory_equal(&x->ridge, &y->ridge, sizeof x->ridge);
    const size_t bytes = (size_t)(x->cloud_heads * x->cloud_head_dim + 1) * x->edge_heads *
                         x->edge_head_dim * sizeof(float);
    for (uint32_t e = 0; e < x->edge_layers; e++) {
        assert_int_equal(kvedge_adapter_from(a, e), kvedge_adapter_from(b, e));
        for (int v = 0; v < 2; v++) {
            const float *p = kvedge_adapter_weights(a, e, v), *q = kvedge_adapter_weights(b, e, v);
            assert_true(!p == !q);
            if (p)
                assert_memory_equal(p, q, bytes);
        }
    }
}

static void test_round_trip(void **state)
{
    (void)state;
    float *w[4];
    kvedge_adapter_t *a = s_linear_adapter(w), *b = NULL;
    char path[128], path2[128], why[512];
    snprintf(path, sizeof path, "%s/a.safetensors", s_dir);
    snprintf(path2, sizeof path2, "%s/b.safetensors", s_dir);
    assert_int_equal(kvedge_adapter_save(a, path), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_load(path, &b, why, sizeof why), KVEDGE_OK);
    s_same(a, b);
    /* Written again: the same bytes. */
    assert_int_equal(kvedge_adapter_save(b, path2), KVEDGE_OK);
    assert_int_equal(kt_sh("cmp -s %s %s", path, path2), 0);
    kvedge_adapter_destroy(&b);
    kvedge_adapter_destroy(&a);
    /* A heads adapter: layer 0 from cloud layer 0, a selection with an unselected column. */
    kvedge_adapter_info_t i = s_info(KVEDGE_ADAPT_HEADS);
    const int32_t from[2] = {0, KVEDGE_LAYERMAP_NONE};
    float *s = calloc(16 * 14, sizeof(float));
    for (uint32_t j = 0; j < 13; j++)
        s[(size_t)((j * 3) % 15) * 14 + j] = 1.0f;
    const float *ws[4] = {s, s, NULL, NULL};
    assert_int_equal(kvedge_adapter_make(&i, from, ws, &a, why, sizeof why), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_save(a, path), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_load(path, &b, why, sizeof why), KVEDGE_OK);
    s_same(a, b);
    kvedge_adapter_destroy(&b);
    kvedge_adapter_destroy(&a);
    /* make refuses what the loader refuses: a 0.5 in a selection, a NaN, a bad field. */
    s[3] = 0.5f;
    assert_int_equal(kvedge_adapter_make(&i, from, ws, &a, why, sizeof why), KVEDGE_ECORRUPT);
    s[3] = 0;
    s[15 * 14] = 1.0f; /* a bias in a selection */
    assert_int_equal(kvedge_adapter_make(&i, from, ws, &a, why, sizeof why), KVEDGE_ECORRUPT);
    s[15 * 14] = 0;
    i.kind = KVEDGE_ADAPT_LINEAR;
    s[5] = NAN;
    assert_int_equal(kvedge_adapter_make(&i, from, ws, &a, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "k.0"));
    s[5] = 0;
    i.edge_heads = 0;
    assert_int_equal(kvedge_adapter_make(&i, from, ws, &a, why, sizeof why), KVEDGE_ECORRUPT);
    assert_null(a);
    free(s);
    free(w[2]);
    free(w[3]);
}

/* Writes an adapter file by hand: the metadata object's members (meta, JSON without braces)
 * and tensors name[i] of rows[i] x cols[i] F32 from data[i] (or F16 halves when f16). */
static void s_write_file(const char *path, const char *meta, int nt, const char *const *name,
                         const size_t *rows, const size_t *cols, const float *const *data)
{
    char hdr[4096];
    int len = snprintf(hdr, sizeof hdr, "{\"__metadata__\":{%s}", meta);
    size_t off = 0;
    for (int t = 0; t < nt; t++) {
        const size_t bytes = rows[t] * cols[t] * 4;
        len +=
            snprintf(hdr + len, sizeof hdr - (size_t)len,
                     ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%zu,%zu],\"data_offsets\":[%zu,%zu]}",
                     name[t], rows[t], cols[t], off, off + bytes);
        off += bytes;
    }
    len += snprintf(hdr + len, sizeof hdr - (size_t)len, "}");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t pre[8];
    for (int i = 0; i < 8; i++)
        pre[i] = (uint8_t)((uint64_t)len >> (8 * i));
    assert_int_equal(fwrite(pre, 1, 8, f), 8);
    assert_int_equal(fwrite(hdr, 1, (size_t)len, f), (size_t)len);
    for (int t = 0; t < nt; t++) /* little-endian hosts only, as the test machines are */
        assert_int_equal(fwrite(data[t], 4, rows[t] * cols[t], f), rows[t] * cols[t]);
    assert_int_equal(fclose(f), 0);
}

#define S_META_HEAD "\"format\":\"kvedge-adapter\",\"cloud_id\":\"c\",\"edge_id\":\"e\","
#define S_META_SHAPE                                                                               \
    "\"cloud_layers\":\"2\",\"cloud_heads\":\"2\",\"cloud_head_dim\":\"2\",\"edge_layers\":\"1\"," \
    "\"edge_heads\":\"1\",\"edge_head_dim\":\"3\",\"from\":\"1\",\"samples\":\"10\""

static int s_load_case(const char *meta, int nt, const char *const *name, const size_t *rows,
                       const size_t *cols, const float *const *data, char *why, size_t why_len)
{
    char path[128];
    snprintf(path, sizeof path, "%s/case.safetensors", s_dir);
    s_write_file(path, meta, nt, name, rows, cols, data);
    kvedge_adapter_t *a = NULL;
    int rc = kvedge_adapter_load(path, &a, why, why_len);
    if (rc == KVEDGE_OK)
        assert_non_null(a);
    else
        assert_null(a);
    assert_true(rc == KVEDGE_OK || strncmp(why, path, strlen(path)) == 0); /* "PATH: reason" */
    kvedge_adapter_destroy(&a);
    return rc;
}

static void test_load_rejects(void **state)
{
    (void)state;
    float w[5 * 3] = {0}, sel[5 * 3] = {0}, bad[5 * 3] = {0};
    for (int i = 0; i < 15; i++)
        w[i] = (float)i / 7;
    sel[0 * 3 + 0] = sel[3 * 3 + 2] = 1;
    const char *names[3] = {"k.0", "v.0", "x"};
    const size_t rows[3] = {5, 5, 5}, cols[3] = {3, 3, 3};
    const float *d[3] = {w, w, w};
    const float *ds[3] = {sel, sel, sel};
    char why[512];
    const char *lin =
        "\"version\":\"1\",\"kind\":\"linear\",\"ridge\":\"0.5\"," S_META_HEAD S_META_SHAPE;
    const char *hds =
        "\"version\":\"1\",\"kind\":\"heads\",\"ridge\":\"0\"," S_META_HEAD S_META_SHAPE;
    /* The valid ones. */
    assert_int_equal(s_load_case(lin, 2, names, rows, cols, d, why, sizeof why), KVEDGE_OK);
    assert_int_equal(s_load_case(hds, 2, names, rows, cols, ds, why, sizeof why), KVEDGE_OK);
    /* A missing field. */
    assert_int_equal(s_load_case("\"version\":\"1\",\"kind\":\"linear\"," S_META_HEAD S_META_SHAPE,
                                 2, names, rows, cols, d, why, sizeof why),
                     KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "'ridge' is missing"));
    /* Another version, another format, a bad kind, a bad number, a bad from. */
    assert_int_equal(
        s_load_case(
            "\"version\":\"2\",\"kind\":\"linear\",\"ridge\":\"0.5\"," S_META_HEAD S_META_SHAPE, 2,
            names, rows, cols, d, why, sizeof why),
        KVEDGE_EVERSION);
    assert_int_equal(
        s_load_case("\"version\":\"1\",\"kind\":\"linear\",\"ridge\":\"0.5\",\"format\":\"x\","
                    "\"cloud_id\":\"c\",\"edge_id\":\"e\"," S_META_SHAPE,
                    2, names, rows, cols, d, why, sizeof why),
        KVEDGE_ECORRUPT);
    assert_int_equal(
        s_load_case(
            "\"version\":\"1\",\"kind\":\"cubic\",\"ridge\":\"0.5\"," S_META_HEAD S_META_SHAPE, 2,
            names, rows, cols, d, why, sizeof why),
        KVEDGE_ECORRUPT);
    assert_int_equal(
        s_load_case(
            "\"version\":\"1\",\"kind\":\"linear\",\"ridge\":\"nan\"," S_META_HEAD S_META_SHAPE, 2,
            names, rows, cols, d, why, sizeof why),
        KVEDGE_ECORRUPT);
    assert_int_equal(
        s_load_case("\"version\":\"1\",\"kind\":\"linear\",\"ridge\":\"0.5\"," S_META_HEAD
                    "\"cloud_layers\":\"2\",\"cloud_heads\":\"2\",\"cloud_head_dim\":\"2\","
                    "\"edge_layers\":\"1\",\"edge_heads\":\"1\",\"edge_head_dim\":\"3\","
                    "\"from\":\"2\",\"samples\":\"10\"",
                    2, names, rows, cols, d, why, sizeof why),
        KVEDGE_ECORRUPT);
    /* Wrong shapes: a row short, and the tensors of another width. */
    const size_t short_rows[2] = {4, 4};
    assert_int_equal(s_load_case(lin, 2, names, short_rows, cols, d, why, sizeof why),
                     KVEDGE_ESHAPE);
    const size_t wide[2] = {5, 5}, wcols[2] = {2, 2};
    assert_int_equal(s_load_case(lin, 2, names, wide, wcols, d, why, sizeof why), KVEDGE_ESHAPE);
    /* A NaN weight. */
    memcpy(bad, w, sizeof w);
    bad[4] = NAN;
    const float *dn[2] = {w, bad};
    assert_int_equal(s_load_case(lin, 2, names, rows, cols, dn, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "v.0"));
    /* An extra tensor; a missing one. */
    assert_int_equal(s_load_case(lin, 3, names, rows, cols, d, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "'x'"));
    assert_int_equal(s_load_case(lin, 1, names, rows, cols, d, why, sizeof why), KVEDGE_ECORRUPT);
    /* A heads adapter with a 0.5. */
    memcpy(bad, sel, sizeof sel);
    bad[7] = 0.5f;
    const float *dh[2] = {bad, sel};
    assert_int_equal(s_load_case(hds, 2, names, rows, cols, dh, why, sizeof why), KVEDGE_ECORRUPT);
    /* Heads with a ridge. */
    assert_int_equal(
        s_load_case(
            "\"version\":\"1\",\"kind\":\"heads\",\"ridge\":\"1\"," S_META_HEAD S_META_SHAPE, 2,
            names, rows, cols, ds, why, sizeof why),
        KVEDGE_ECORRUPT);
    /* A truncated file: the safetensors reader's code. */
    char path[128], cut[128];
    snprintf(path, sizeof path, "%s/case.safetensors", s_dir);
    s_write_file(path, lin, 2, names, rows, cols, d);
    snprintf(cut, sizeof cut, "%s/cut.safetensors", s_dir);
    assert_int_equal(kt_sh("head -c 100 %s > %s", path, cut), 0); /* in the header */
    kvedge_adapter_t *a = NULL;
    assert_int_equal(kvedge_adapter_load(cut, &a, why, sizeof why), KVEDGE_ETRUNCATED);
    assert_non_null(strstr(why, "cut.safetensors: "));
    /* In the data: the reader calls tensors past the end corrupt. */
    assert_int_equal(kt_sh("head -c -9 %s > %s", path, cut), 0);
    assert_int_equal(kvedge_adapter_load(cut, &a, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "outside"));
    snprintf(cut, sizeof cut, "%s/none.safetensors", s_dir);
    assert_int_equal(kvedge_adapter_load(cut, &a, why, sizeof why), KVEDGE_EIO);
    assert_null(a);
}

/* A distilled adapter (scripts/train_adapter.py): the same file with a "fit" field. It loads,
 * says how it was fitted, survives a save, and is refused for everything a least-squares file
 * is refused for (a NaN weight, a tensor of another shape, another model pair); a malformed fit
 * is refused too. */
static void test_distilled_file(void **state)
{
    (void)state;
    float w[5 * 3], bad[5 * 3];
    for (int i = 0; i < 15; i++)
        w[i] = (float)i / 7;
    const char *names[2] = {"k.0", "v.0"};
    const size_t rows[2] = {5, 5}, cols[2] = {3, 3};
    const float *d[2] = {w, w};
    char why[512], meta[2048];
    const char *fit = "distilled: KL(cloud||edge)+0*CE, Adam lr 0.003, 120 steps";
    snprintf(meta, sizeof meta,
             "\"version\":\"1\",\"kind\":\"linear\",\"ridge\":\"0.5\",\"fit\":\"%s\"," S_META_HEAD
                 S_META_SHAPE,
             fit);
    char path[128], path2[128];
    snprintf(path, sizeof path, "%s/distilled.safetensors", s_dir);
    snprintf(path2, sizeof path2, "%s/distilled2.safetensors", s_dir);
    s_write_file(path, meta, 2, names, rows, cols, d);
    kvedge_adapter_t *a = NULL, *b = NULL;
    assert_int_equal(kvedge_adapter_load(path, &a, why, sizeof why), KVEDGE_OK);
    assert_string_equal(kvedge_adapter_info(a)->fit, fit);
    assert_string_equal(kvedge_adapter_fit_name(kvedge_adapter_info(a)), "distilled");
    /* Saved and read again: the fit is kept, the bytes are stable. */
    assert_int_equal(kvedge_adapter_save(a, path2), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_load(path2, &b, why, sizeof why), KVEDGE_OK);
    s_same(a, b);
    assert_string_equal(kvedge_adapter_info(b)->fit, fit);
    assert_int_equal(kvedge_adapter_save(b, path), KVEDGE_OK);
    assert_int_equal(kt_sh("cmp -s %s %s", path, path2), 0);
    kvedge_adapter_destroy(&b);
    /* `kvedge layermap --show-adapter` says how it was fitted. */
    char out[160];
    snprintf(out, sizeof out, "%s/show-distilled.txt", s_dir);
    assert_int_equal(kt_sh("%s layermap --show-adapter %s > %s", KVEDGE_BIN, path, out), 0);
    assert_true(kt_file_has(out, "fit: distilled: KL(cloud||edge)+0*CE"));
    assert_int_equal(kt_sh("%s --json layermap --show-adapter %s > %s", KVEDGE_BIN, path, out), 0);
    assert_true(kt_file_has(out, "\"fitted\":\"distilled\",\"fit\":\"distilled: KL"));
    /* Another model pair: refused by check against that pair's map and records. */
    kvedge_layermap_t m = {0};
    snprintf(m.cloud_id, sizeof m.cloud_id, "c");
    snprintf(m.edge_id, sizeof m.edge_id, "other-edge");
    m.cloud_layers = 2;
    m.edge_layers = 1;
    m.cloud_hidden = 4;
    m.edge_hidden = 3;
    m.samples = 10;
    kvedge_layermap_entry_t ent[1] = {{1, 0.9, 0.9}};
    m.entry = ent;
    assert_int_equal(kvedge_adapter_check(a, &m, NULL, NULL, why, sizeof why), KVEDGE_ESHAPE);
    snprintf(m.edge_id, sizeof m.edge_id, "e");
    assert_int_equal(kvedge_adapter_check(a, &m, NULL, NULL, why, sizeof why), KVEDGE_OK);
    kvedge_model_t cm = {"c", 2, 4, 2, KVEDGE_DTYPE_FP16}, em = {"e", 1, 1, 3, KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_adapter_check(a, NULL, &cm, &em, why, sizeof why), KVEDGE_ESHAPE);
    assert_non_null(strstr(why, "cloud model"));
    kvedge_adapter_destroy(&a);
    /* A NaN or an infinite weight; a tensor of another shape. */
    for (int k = 0; k < 2; k++) {
        memcpy(bad, w, sizeof w);
        bad[7] = k ? INFINITY : NAN;
        const float *dn[2] = {bad, w};
        assert_int_equal(s_load_case(meta, 2, names, rows, cols, dn, why, sizeof why),
                         KVEDGE_ECORRUPT);
        assert_non_null(strstr(why, "k.0"));
    }
    const size_t short_rows[2] = {4, 4};
    assert_int_equal(s_load_case(meta, 2, names, short_rows, cols, d, why, sizeof why),
                     KVEDGE_ESHAPE);
    /* An empty fit, one over KVEDGE_ADAPT_FIT_MAX_BYTES, one with a control character. */
    const char *empty = "\"version\":\"1\",\"kind\":\"linear\",\"ridge\":\"0.5\","
                        "\"fit\":\"\"," S_META_HEAD S_META_SHAPE;
    assert_int_equal(s_load_case(empty, 2, names, rows, cols, d, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "fit must be"));
    char longfit[KVEDGE_ADAPT_FIT_MAX_BYTES + 2];
    memset(longfit, 'x', sizeof longfit - 1);
    longfit[sizeof longfit - 1] = '\0';
    snprintf(meta, sizeof meta,
             "\"version\":\"1\",\"kind\":\"linear\",\"ridge\":\"0.5\",\"fit\":\"%s\"," S_META_HEAD
                 S_META_SHAPE,
             longfit);
    assert_int_equal(s_load_case(meta, 2, names, rows, cols, d, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "fit must be"));
    const char *ctl = "\"version\":\"1\",\"kind\":\"linear\",\"ridge\":\"0.5\","
                      "\"fit\":\"a\\u0007b\"," S_META_HEAD S_META_SHAPE;
    assert_int_equal(s_load_case(ctl, 2, names, rows, cols, d, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "fit must be"));
    /* Labels: least squares without a fit, heads, another fit. */
    kvedge_adapter_info_t i = {.kind = KVEDGE_ADAPT_LINEAR};
    assert_string_equal(kvedge_adapter_fit_name(&i), "least-squares");
    snprintf(i.fit, sizeof i.fit, "by hand");
    assert_string_equal(kvedge_adapter_fit_name(&i), "linear");
    i.kind = KVEDGE_ADAPT_HEADS;
    assert_string_equal(kvedge_adapter_fit_name(&i), "heads");
    assert_string_equal(kvedge_adapter_fit_name(NULL), "?");
}

/* ---- check ---- */

static void test_check(void **state)
{
    (void)state;
    float *w[4];
    kvedge_adapter_t *a = s_linear_adapter(w);
    kvedge_layermap_t m = {0};
    snprintf(m.cloud_id, sizeof m.cloud_id, "c-\"1\\");
    snprintf(m.edge_id, sizeof m.edge_id, "e1");
    m.cloud_layers = 4;
    m.edge_layers = 2;
    m.cloud_hidden = 15;
    m.edge_hidden = 14;
    m.samples = 99;
    kvedge_layermap_entry_t ent[2] = {{KVEDGE_LAYERMAP_NONE, 0.1, 0.1}, {3, 0.9, 0.9}};
    m.entry = ent;
    kvedge_model_t cm = {"c", 4, 3, 5, KVEDGE_DTYPE_FP16}, em = {"e1", 2, 2, 7, KVEDGE_DTYPE_FP16};
    char why[256];
    assert_int_equal(kvedge_adapter_check(a, &m, &cm, &em, why, sizeof why), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_check(a, NULL, NULL, NULL, why, sizeof why), KVEDGE_OK);
    ent[1].cloud = 2;
    assert_int_equal(kvedge_adapter_check(a, &m, NULL, NULL, why, sizeof why), KVEDGE_ESHAPE);
    assert_non_null(strstr(why, "edge layer 1"));
    ent[1].cloud = 3;
    snprintf(m.edge_id, sizeof m.edge_id, "other");
    assert_int_equal(kvedge_adapter_check(a, &m, NULL, NULL, why, sizeof why), KVEDGE_ESHAPE);
    snprintf(m.edge_id, sizeof m.edge_id, "e1");
    m.cloud_layers = 5;
    assert_int_equal(kvedge_adapter_check(a, &m, NULL, NULL, why, sizeof why), KVEDGE_ESHAPE);
    m.cloud_layers = 4;
    cm.kv_heads = 4;
    assert_int_equal(kvedge_adapter_check(a, &m, &cm, &em, why, sizeof why), KVEDGE_ESHAPE);
    assert_non_null(strstr(why, "cloud model"));
    cm.kv_heads = 3;
    em.head_dim = 8;
    assert_int_equal(kvedge_adapter_check(a, &m, &cm, &em, why, sizeof why), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_adapter_check(NULL, &m, &cm, &em, why, sizeof why), KVEDGE_EINVAL);
    kvedge_adapter_destroy(&a);
    free(w[2]);
    free(w[3]);
    /* Names. */
    kvedge_adapt_kind_t k;
    assert_int_equal(kvedge_adapt_kind_parse("heads", &k), KVEDGE_OK);
    assert_int_equal(k, KVEDGE_ADAPT_HEADS);
    assert_string_equal(kvedge_adapt_kind_name(k), "heads");
    assert_int_equal(kvedge_adapt_kind_parse("Linear", &k), KVEDGE_EINVAL);
    assert_string_equal(kvedge_adapt_kind_name(0), "?");
}

/* ---- `kvedge layermap --adapter` end to end ---- */

static void s_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* GPT-2's byte-to-character map: printable bytes map to themselves, the rest to 256 + i. */
static unsigned s_byte_char(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
            k++;
    return 256 + k;
}

static void test_cli(void **state)
{
    (void)state;
    char path[160];
    snprintf(path, sizeof path, "%s/vocab.json", s_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputc('{', f);
    for (unsigned b = 0; b < 256; b++)
        fprintf(f, "%s\"\\u%04x\": %u", b ? ", " : "", s_byte_char(b), b);
    fputs("}\n", f);
    assert_int_equal(fclose(f), 0);
    snprintf(path, sizeof path, "%s/merges.txt", s_dir);
    s_write(path, "#version: 0.2\n");
    char calib[128];
    snprintf(calib, sizeof calib, "%s/calib.txt", s_dir);
    f = fopen(calib, "w");
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        fprintf(f, "In the beginning God created the heaven and the earth. (%d)\n", i);
    assert_int_equal(fclose(f), 0);
    const char *w = KVEDGE_FIXTURES "/opt_tiny.safetensors";
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s --samples "
                           "100 --adapt-samples 200 --out %s/t.map --adapter %s/t.ad --eval-text "
                           "%s > %s/out.txt",
                           KVEDGE_BIN, w, w, s_dir, calib, s_dir, s_dir, calib, s_dir),
                     0);
    /* More adapter samples than the text has: a usage error, nothing written. */
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s --samples "
                           "100 --adapt-samples 100000 --out %s/t2.map --adapter %s/t2.ad "
                           "> /dev/null 2> %s/err2.txt",
                           KVEDGE_BIN, w, w, s_dir, calib, s_dir, s_dir, s_dir),
                     2);
    snprintf(path, sizeof path, "%s/err2.txt", s_dir);
    assert_true(kt_file_has(path, "too short for --adapt-samples 100000"));
    snprintf(path, sizeof path, "%s/t2.ad", s_dir);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/out.txt", s_dir);
    assert_true(kt_file_has(path, "adapter linear (ridge 0.001)"));
    assert_true(kt_file_has(path, "K eval"));
    /* The same model on both sides: the identity is in reach, the error is small. */
    kvedge_adapter_t *a = NULL;
    char why[512];
    snprintf(path, sizeof path, "%s/t.ad", s_dir);
    assert_int_equal(kvedge_adapter_load(path, &a, why, sizeof why), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_info(a)->samples, 200);
    assert_int_equal(kvedge_adapter_from(a, 2), 2);
    kvedge_adapter_destroy(&a);
    assert_int_equal(kt_sh("%s layermap --show-adapter %s/t.ad --show %s/t.map > %s/show.txt",
                           KVEDGE_BIN, s_dir, s_dir, s_dir),
                     0);
    snprintf(path, sizeof path, "%s/show.txt", s_dir);
    assert_true(kt_file_has(path, "fits the map"));
    assert_true(kt_file_has(path, "fit: least squares (kvedge layermap --adapter)"));
    /* heads: identity selection for the same model. */
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s --samples "
                           "200 --adapter %s/h.ad --adapt heads > /dev/null",
                           KVEDGE_BIN, w, w, s_dir, calib, s_dir),
                     0);
    assert_int_equal(
        kt_sh("%s layermap --show-adapter %s/h.ad > %s/show.txt", KVEDGE_BIN, s_dir, s_dir), 0);
    assert_true(kt_file_has(path, "0<-0(16) 1<-1(16) 2<-2(16) 3<-3(16)"));
    assert_true(kt_file_has(path, "fit: head matching"));
    /* Usage and refusals. */
    assert_int_equal(kt_sh("%s layermap --show %s/t.map --ridge 1 2> /dev/null", KVEDGE_BIN, s_dir),
                     2);
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s --adapter "
                           "%s/x.ad --adapt cubic 2> /dev/null",
                           KVEDGE_BIN, w, w, s_dir, calib, s_dir),
                     2);
    assert_int_equal(kt_sh("head -c 100 %s/t.ad > %s/cut.ad; %s layermap --show-adapter %s/cut.ad "
                           "2> /dev/null",
                           s_dir, s_dir, KVEDGE_BIN, s_dir),
                     4);
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-adapter-XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    (void)state;
    return kt_sh("rm -rf %s", s_dir) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fit_linear),
        cmocka_unit_test(test_match_heads),
        cmocka_unit_test(test_think_channels),
        cmocka_unit_test(test_fit_models),
        cmocka_unit_test(test_apply),
        cmocka_unit_test(test_cpu_adapt),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_load_rejects),
        cmocka_unit_test(test_distilled_file),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
