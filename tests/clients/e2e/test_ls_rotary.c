/* Large-small with rotary positions (clients/e2e/adapter.h, clients/decoder/rope.c): K is
 * un-rotated with the cloud model's rotary settings, adapted, re-rotated with the edge model's;
 * ThinK keeps rotate-half pairs; adapters map KV heads; the settings travel in the file. The
 * models are tiny random Llama models that tests/decoder/tiny_llama.py writes at test time
 * (python3 with NumPy; the test skips, 77, without it): "llama" (3 layers, 4 query / 2 KV heads,
 * head_dim 16) at rope_theta 500000 and again at 10000 (the same weights), and "llama3" (2
 * layers, head_dim 32, Llama 3's rope_scaling). */
#define _GNU_SOURCE /* memmem */
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
#include "access/codec/error.h"
#include "access/codec/synth.h"

#define S_VOCAB 300u
#define S_N     48u /* context tokens */

static char s_dir[256];

static void s_path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", s_dir, name);
}

static kvedge_decoder_t *s_load(const char *name)
{
    char p[320];
    s_path(p, sizeof p, name);
    kvedge_decoder_t *md = kvedge_decoder_new();
    assert_non_null(md);
    int rc = kvedge_decoder_load(md, p, 0);
    if (rc != KVEDGE_OK)
        fprintf(stderr, "%s: %s\n", p, kvedge_decoder_error(md));
    assert_int_equal(rc, KVEDGE_OK);
    return md;
}

static void s_tokens(int32_t *t, uint32_t n, uint32_t seed)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = (int32_t)((i * 7919u + seed * 104729u + 13u) % S_VOCAB);
}

/* The context K of every layer: [layers][kv_heads][n][head_dim] (caller frees). */
static float *s_prefill_k(const kvedge_decoder_t *md, const int32_t *tok, uint32_t n)
{
    const size_t f = kvedge_decoder_kv_floats(md, n) * kvedge_decoder_config(md)->layers;
    float *k = malloc(f * sizeof(float)), *v = malloc(f * sizeof(float));
    assert_non_null(k);
    assert_non_null(v);
    assert_int_equal(kvedge_decoder_prefill(md, tok, n, NULL, k, v), KVEDGE_OK);
    free(v);
    return k;
}

static uint32_t s_rng = 12345;
static float s_unit(void)
{
    s_rng = s_rng * 1664525u + 1013904223u;
    return (float)((s_rng >> 8) / (double)(1u << 24)) * 2.0f - 1.0f;
}

/* max |a - b| / (1 + |b|) */
static double s_maxrel(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i]));
        m = d > m ? d : m;
    }
    return m;
}

static const kvedge_decoder_rope_t s_llama3 = {true, 500000.0, true, 8.0, 1.0, 4.0, 64.0};

/* ---- the rotation alone ---- */

static void test_rope_roundtrip(void **state)
{
    (void)state;
    const kvedge_decoder_rope_t plain = {.rotary = true, .theta = 10000.0};
    const kvedge_decoder_rope_t *r[2] = {&plain, &s_llama3};
    const uint32_t heads = 3, tokens = 50, hd = 32;
    const size_t n = (size_t)heads * tokens * hd;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    assert_non_null(x);
    assert_non_null(y);
    for (size_t i = 0; i < n; i++)
        x[i] = s_unit();
    for (int k = 0; k < 2; k++)
        for (uint32_t pos0 = 0; pos0 <= 1000; pos0 += 1000) {
            memcpy(y, x, n * sizeof(float));
            assert_int_equal(kvedge_decoder_rope_apply(r[k], hd, y, heads, tokens, pos0, false), 0);
            assert_true(s_maxrel(y, x, n) > 0.1); /* it did turn */
            assert_int_equal(kvedge_decoder_rope_apply(r[k], hd, y, heads, tokens, pos0, true), 0);
            assert_true(s_maxrel(y, x, n) <= 1e-6);
        }
    /* Not rotary: untouched. */
    const kvedge_decoder_rope_t none = {0};
    memcpy(y, x, n * sizeof(float));
    assert_int_equal(kvedge_decoder_rope_apply(&none, hd, y, heads, tokens, 0, true), 0);
    assert_memory_equal(x, y, n * sizeof(float));
    /* Bad input. */
    assert_int_equal(kvedge_decoder_rope_apply(&plain, 15, y, 1, 1, 0, false), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_rope_apply(NULL, hd, y, 1, 1, 0, false), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_rope_apply(&plain, hd, y, 0, 1, 0, false), KVEDGE_EINVAL);
    const kvedge_decoder_rope_t bad = {.rotary = true, .theta = 0};
    assert_int_equal(kvedge_decoder_rope_apply(&bad, hd, y, 1, 1, 0, false), KVEDGE_EINVAL);
    kvedge_decoder_rope_t bad3 = s_llama3;
    bad3.high_freq_factor = 0.5; /* below low */
    assert_int_equal(kvedge_decoder_rope_check(&bad3), KVEDGE_EINVAL);
    assert_false(kvedge_decoder_rope_equal(&plain, &s_llama3));
    assert_true(kvedge_decoder_rope_equal(&s_llama3, &s_llama3));
    free(x);
    free(y);
}

/* The decoder's own rotation: a model's settings are its config.json's. */
static void test_model_settings(void **state)
{
    (void)state;
    kvedge_decoder_t *a = s_load("cloud"), *b = s_load("scaled");
    kvedge_decoder_rope_t r;
    assert_int_equal(kvedge_decoder_rope(a, &r), KVEDGE_OK);
    assert_true(r.rotary);
    assert_true(r.theta == 500000.0);
    assert_false(r.llama3);
    assert_int_equal(kvedge_decoder_rope(b, &r), KVEDGE_OK);
    assert_true(r.llama3 && r.factor == 8.0 && r.original_max == 64.0);
    kvedge_decoder_destroy(&a);
    kvedge_decoder_destroy(&b);
}

/* ---- identity adapters ---- */

/* An identity linear adapter over every layer of a model of this shape (KV heads). */
static kvedge_adapter_t *s_identity(const kvedge_decoder_t *cloud, const kvedge_decoder_t *edge,
                                    bool ropes)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(cloud);
    kvedge_adapter_info_t info = {
        .kind = KVEDGE_ADAPT_LINEAR,
        .cloud_layers = c->layers,
        .cloud_heads = kvedge_decoder_kv_heads(cloud),
        .cloud_head_dim = c->head_dim,
        .edge_layers = c->layers,
        .edge_heads = kvedge_decoder_kv_heads(edge),
        .edge_head_dim = c->head_dim,
        .samples = 2,
        .ridge = 0,
    };
    snprintf(info.cloud_id, sizeof info.cloud_id, "cloud");
    snprintf(info.edge_id, sizeof info.edge_id, "edge");
    if (ropes) {
        kvedge_decoder_rope(cloud, &info.cloud_rope);
        kvedge_decoder_rope(edge, &info.edge_rope);
    }
    const size_t d = (size_t)info.cloud_heads * info.cloud_head_dim;
    float *w = calloc((d + 1) * d, sizeof(float));
    assert_non_null(w);
    for (size_t i = 0; i < d; i++)
        w[i * d + i] = 1.0f;
    int32_t from[16];
    const float *ws[32];
    for (uint32_t e = 0; e < c->layers; e++) {
        from[e] = (int32_t)e;
        ws[2 * e] = ws[2 * e + 1] = w;
    }
    kvedge_adapter_t *a = NULL;
    char why[256];
    assert_int_equal(kvedge_adapter_make(&info, from, ws, &a, why, sizeof why), KVEDGE_OK);
    free(w);
    return a;
}

/* Same shape, same settings: the identity gives the same K (un-rotated, re-rotated). */
static void test_identity_same_settings(void **state)
{
    (void)state;
    kvedge_decoder_t *md = s_load("cloud");
    int32_t tok[S_N];
    s_tokens(tok, S_N, 1);
    float *k = s_prefill_k(md, tok, S_N);
    kvedge_adapter_t *a = s_identity(md, md, true);
    assert_true(kvedge_adapter_info(a)->cloud_rope.rotary);
    const size_t f = kvedge_decoder_kv_floats(md, S_N);
    float *ko = malloc(f * sizeof(float)), *vo = malloc(f * sizeof(float));
    assert_non_null(ko);
    assert_non_null(vo);
    for (uint32_t l = 0; l < kvedge_decoder_config(md)->layers; l++) {
        assert_int_equal(kvedge_adapter_apply(a, l, k + l * f, k + l * f, S_N, ko, vo), KVEDGE_OK);
        assert_true(s_maxrel(ko, k + l * f, f) <= 1e-6);
        assert_memory_equal(vo, k + l * f, f * sizeof(float)); /* V is never rotated */
    }
    kvedge_adapter_destroy(&a);
    free(ko);
    free(vo);
    free(k);
    kvedge_decoder_destroy(&md);
}

/* Across rope_theta: two models with the same weights compute the same un-rotated K at layer 0;
 * the identity adapter must give the K the edge model computes itself, and without the
 * settings it does not. */
static void test_identity_across_theta(void **state)
{
    (void)state;
    kvedge_decoder_t *cloud = s_load("cloud"), *edge = s_load("edge");
    for (uint32_t seed = 1; seed <= 3; seed++) {
        int32_t tok[S_N];
        s_tokens(tok, S_N, seed);
        float *kc = s_prefill_k(cloud, tok, S_N), *ke = s_prefill_k(edge, tok, S_N);
        const size_t f = kvedge_decoder_kv_floats(edge, S_N);
        float *ko = malloc(f * sizeof(float)), *vo = malloc(f * sizeof(float));
        assert_non_null(ko);
        assert_non_null(vo);
        kvedge_adapter_t *a = s_identity(cloud, edge, true);
        assert_int_equal(kvedge_adapter_apply(a, 0, kc, kc, S_N, ko, vo), KVEDGE_OK);
        const double with = s_maxrel(ko, ke, f);
        kvedge_adapter_destroy(&a);
        a = s_identity(cloud, edge, false); /* as if post-rotary K were mapped as it is */
        assert_int_equal(kvedge_adapter_apply(a, 0, kc, kc, S_N, ko, vo), KVEDGE_OK);
        const double without = s_maxrel(ko, ke, f);
        kvedge_adapter_destroy(&a);
        print_message(
            "seed %u: max rel |K_adapted - K_edge| %.2e with the settings, %.2e without\n", seed,
            with, without);
        assert_true(with <= 1e-5);
        assert_true(without > 0.1);
        free(kc);
        free(ke);
        free(ko);
        free(vo);
    }
    char why[256];
    kvedge_adapter_t *a = s_identity(cloud, edge, true);
    assert_int_equal(kvedge_adapter_check_rope(a, cloud, edge, why, sizeof why), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_check_rope(a, edge, edge, why, sizeof why), KVEDGE_ESHAPE);
    assert_non_null(strstr(why, "cloud model's rotary settings are theta=10000"));
    /* The same adapter distilled (a "fit" field, as scripts/train_adapter.py writes), through
     * its file: the settings it records are checked as a least-squares file's are. */
    kvedge_adapter_info_t info = *kvedge_adapter_info(a);
    snprintf(info.fit, sizeof info.fit, "distilled: test");
    int32_t from[16];
    const float *ws[32];
    for (uint32_t e = 0; e < info.edge_layers; e++) {
        from[e] = kvedge_adapter_from(a, e);
        ws[2 * e] = kvedge_adapter_weights(a, e, false);
        ws[2 * e + 1] = kvedge_adapter_weights(a, e, true);
    }
    kvedge_adapter_t *d = NULL;
    assert_int_equal(kvedge_adapter_make(&info, from, ws, &d, why, sizeof why), KVEDGE_OK);
    char p[320];
    s_path(p, sizeof p, "distilled.safetensors");
    assert_int_equal(kvedge_adapter_save(d, p), KVEDGE_OK);
    kvedge_adapter_destroy(&d);
    assert_int_equal(kvedge_adapter_load(p, &d, why, sizeof why), KVEDGE_OK);
    assert_string_equal(kvedge_adapter_info(d)->fit, "distilled: test");
    assert_int_equal(kvedge_adapter_check_rope(d, cloud, edge, why, sizeof why), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_check_rope(d, edge, edge, why, sizeof why), KVEDGE_ESHAPE);
    assert_non_null(strstr(why, "cloud model's rotary settings are theta=10000"));
    kvedge_adapter_destroy(&d);
    kvedge_adapter_destroy(&a);
    kvedge_decoder_destroy(&cloud);
    kvedge_decoder_destroy(&edge);
}

/* ---- ThinK on pairs ---- */

static void test_think_pairs(void **state)
{
    (void)state;
    const uint32_t n = 20, hd = 16, half = 8;
    float q[20 * 16], k[20 * 16];
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t j = 0; j < hd; j++) {
            q[t * hd + j] = 1.0f;
            k[t * hd + j] = 0.1f;
        }
    /* Channel 2 alone is the strongest, but its partner 10 is silent; the pair (5, 13) is
     * strong on both halves and wins as a pair. */
    for (uint32_t t = 0; t < n; t++) {
        k[t * hd + 2] = 3.0f;
        k[t * hd + 10] = 0.0f;
        k[t * hd + 5] = k[t * hd + 13] = 2.0f;
    }
    uint32_t ch[16];
    assert_int_equal(kvedge_adapter_think_channels(q, k, n, hd, 1, ch), KVEDGE_OK);
    assert_int_equal(ch[0], 2); /* channel by channel: 2 */
    assert_int_equal(kvedge_adapter_think_pairs(q, n, k, n, hd, 2, ch), KVEDGE_OK);
    assert_int_equal(ch[0], 5);
    assert_int_equal(ch[1], 13);
    /* Random heads: whatever is kept, partners are kept with it. */
    for (int rep = 0; rep < 20; rep++) {
        for (uint32_t i = 0; i < n * hd; i++) {
            q[i] = s_unit();
            k[i] = s_unit() * (1 + (i % hd));
        }
        for (uint32_t keep = 2; keep <= hd; keep += 2) {
            assert_int_equal(kvedge_adapter_think_pairs(q, n, k, n, hd, keep, ch), KVEDGE_OK);
            bool in[16] = {0};
            for (uint32_t i = 0; i < keep; i++) {
                assert_true(ch[i] < hd);
                assert_false(in[ch[i]]);
                in[ch[i]] = true;
            }
            for (uint32_t j = 0; j < half; j++)
                assert_int_equal(in[j], in[j + half]);
            for (uint32_t i = 0; i < keep / 2; i++)
                assert_int_equal(ch[keep / 2 + i], ch[i] + half);
        }
    }
    assert_int_equal(kvedge_adapter_think_pairs(q, n, k, n, hd, 3, ch), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_think_pairs(q, n, k, n, 15, 2, ch), KVEDGE_EINVAL);
    assert_int_equal(kvedge_adapter_think_pairs(NULL, n, k, n, hd, 2, ch), KVEDGE_EINVAL);
}

/* The store's key-channel mask (the quantized schemes' ThinK) for rotary K keeps pairs. */
static void test_key_mask_pairs(void **state)
{
    (void)state;
    const uint32_t n = 30, hd = 16, half = 8;
    float k[30 * 16];
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t j = 0; j < hd; j++)
            k[t * hd + j] = 0.1f;
    for (uint32_t t = 0; t < n; t++) { /* channel 1 alone is largest; pair (6, 14) as a pair */
        k[t * hd + 1] = 3.0f;
        k[t * hd + 9] = 0.0f;
        k[t * hd + 6] = k[t * hd + 14] = -2.0f;
    }
    uint8_t m[2];
    assert_int_equal(kvedge_synth_key_mask(k, n, hd, 1, m), KVEDGE_OK);
    assert_int_equal(m[0], 1u << 1);
    assert_int_equal(kvedge_synth_key_mask_pairs(k, n, hd, 2, m), KVEDGE_OK);
    assert_int_equal(m[0], 1u << 6);
    assert_int_equal(m[1], 1u << 6);
    for (int rep = 0; rep < 20; rep++) {
        for (uint32_t i = 0; i < n * hd; i++)
            k[i] = s_unit();
        for (uint32_t keep = 2; keep <= hd; keep += 2) {
            assert_int_equal(kvedge_synth_key_mask_pairs(k, n, hd, keep, m), KVEDGE_OK);
            uint32_t count = 0;
            for (uint32_t j = 0; j < half; j++) {
                const bool lo = (m[j >> 3] >> (j & 7)) & 1u,
                           hi = (m[(j + half) >> 3] >> ((j + half) & 7)) & 1u;
                assert_int_equal(lo, hi);
                count += 2u * lo;
            }
            assert_int_equal(count, keep);
        }
    }
    assert_int_equal(kvedge_synth_key_mask_pairs(k, n, 15, 2, m), KVEDGE_EINVAL);
}

/* ---- fitting, files ---- */

static void s_map(kvedge_layermap_t *m, const kvedge_decoder_t *cloud, const kvedge_decoder_t *edge,
                  const int32_t *from)
{
    memset(m, 0, sizeof *m);
    snprintf(m->cloud_id, sizeof m->cloud_id, "cloud");
    snprintf(m->edge_id, sizeof m->edge_id, "edge");
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

/* A linear fit across rope_theta learns the identity on layer 0, because it fits un-rotated K:
 * post-rotary K at two thetas are not a per-token linear map of each other. */
static void test_fit_linear_across_theta(void **state)
{
    (void)state;
    kvedge_decoder_t *cloud = s_load("cloud"), *edge = s_load("edge");
    const int32_t from[3] = {0, 1, 2};
    kvedge_layermap_t map;
    s_map(&map, cloud, edge, from);
    enum { T = 600 };
    int32_t *tok = malloc(T * sizeof(int32_t));
    assert_non_null(tok);
    s_tokens(tok, T, 5);
    kvedge_adapter_t *a = NULL;
    assert_int_equal(kvedge_adapter_fit(cloud, edge, &map, tok, T, 400, KVEDGE_ADAPT_LINEAR, 0, &a),
                     KVEDGE_OK);
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    assert_int_equal(i->cloud_heads, 2); /* KV heads, not the 4 query heads */
    assert_int_equal(i->edge_heads, 2);
    assert_true(i->cloud_rope.rotary && i->cloud_rope.theta == 500000.0);
    assert_true(i->edge_rope.rotary && i->edge_rope.theta == 10000.0);
    double ek[3], ev[3];
    assert_int_equal(kvedge_adapter_eval(a, cloud, edge, tok + 400, T - 400, 200, ek, ev), 0);
    print_message("held-out relative K error per layer: %.2e %.2e %.2e\n", ek[0], ek[1], ek[2]);
    assert_true(ek[0] < 1e-3);
    assert_true(ev[0] < 1e-3);
    /* Applied to a context: layer 0 is the edge's own K. */
    float *kc = s_prefill_k(cloud, tok, S_N), *ke = s_prefill_k(edge, tok, S_N);
    const size_t f = kvedge_decoder_kv_floats(edge, S_N);
    float *ko = malloc(f * sizeof(float)), *vo = malloc(f * sizeof(float));
    assert_non_null(ko);
    assert_non_null(vo);
    assert_int_equal(kvedge_adapter_apply(a, 0, kc, kc, S_N, ko, vo), KVEDGE_OK);
    assert_true(s_maxrel(ko, ke, f) <= 1e-3);
    free(kc);
    free(ke);
    free(ko);
    free(vo);
    free(tok);
    free(map.entry);
    kvedge_adapter_destroy(&a);
    kvedge_decoder_destroy(&cloud);
    kvedge_decoder_destroy(&edge);
}

/* A heads adapter from head_dim 16 to 32 (Llama 3 scaling on the edge) keeps pairs: cloud pair
 * (j, j + 8) lands on edge pair (j, j + 16); the file carries both settings and reads back. */
static void test_fit_heads_file(void **state)
{
    (void)state;
    kvedge_decoder_t *cloud = s_load("cloud"), *edge = s_load("scaled");
    const int32_t from[2] = {0, 2};
    kvedge_layermap_t map;
    s_map(&map, cloud, edge, from);
    enum { T = 300 };
    int32_t tok[T];
    s_tokens(tok, T, 9);
    kvedge_adapter_t *a = NULL;
    assert_int_equal(kvedge_adapter_fit(cloud, edge, &map, tok, T, T, KVEDGE_ADAPT_HEADS, -1, &a),
                     KVEDGE_OK);
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    assert_int_equal(i->cloud_heads, 2);
    assert_int_equal(i->cloud_head_dim, 16);
    assert_int_equal(i->edge_head_dim, 32);
    assert_true(i->edge_rope.llama3);
    const uint32_t dc = 16, de = 32, dout = i->edge_heads * de;
    for (uint32_t e = 0; e < 2; e++) {
        const float *w = kvedge_adapter_weights(a, e, false);
        for (uint32_t h = 0; h < i->edge_heads; h++)
            for (uint32_t j = 0; j < dc / 2; j++) {
                int src_lo = -1, src_hi = -1;
                for (uint32_t r = 0; r < i->cloud_heads * dc; r++) {
                    if (w[(size_t)r * dout + h * de + j] == 1.0f)
                        src_lo = (int)r;
                    if (w[(size_t)r * dout + h * de + j + de / 2] == 1.0f)
                        src_hi = (int)r;
                }
                assert_true(src_lo >= 0);
                assert_int_equal(src_hi, src_lo + (int)dc / 2);
            }
    }
    char p[320], why[512];
    s_path(p, sizeof p, "heads.safetensors");
    assert_int_equal(kvedge_adapter_save(a, p), KVEDGE_OK);
    kvedge_adapter_t *b = NULL;
    assert_int_equal(kvedge_adapter_load(p, &b, why, sizeof why), KVEDGE_OK);
    const kvedge_adapter_info_t *j = kvedge_adapter_info(b);
    assert_true(kvedge_decoder_rope_equal(&j->cloud_rope, &i->cloud_rope));
    assert_true(kvedge_decoder_rope_equal(&j->edge_rope, &i->edge_rope));
    assert_int_equal(kvedge_adapter_check_rope(b, cloud, edge, why, sizeof why), KVEDGE_OK);
    /* Applying the loaded one gives what the fitted one gives. */
    float *kc = s_prefill_k(cloud, tok, S_N);
    const size_t fc = kvedge_decoder_kv_floats(cloud, S_N),
                 fe = kvedge_decoder_kv_floats(edge, S_N);
    float *k1 = malloc(fe * sizeof(float)), *k2 = malloc(fe * sizeof(float)),
          *v1 = malloc(fe * sizeof(float)), *v2 = malloc(fe * sizeof(float));
    assert_non_null(k1);
    assert_non_null(k2);
    assert_non_null(v1);
    assert_non_null(v2);
    assert_int_equal(kvedge_adapter_apply(a, 1, kc + 2 * fc, kc, S_N, k1, v1), KVEDGE_OK);
    assert_int_equal(kvedge_adapter_apply(b, 1, kc + 2 * fc, kc, S_N, k2, v2), KVEDGE_OK);
    assert_memory_equal(k1, k2, fe * sizeof(float));
    free(k1);
    free(k2);
    free(v1);
    free(v2);
    free(kc);
    kvedge_adapter_destroy(&b);

    /* A malformed setting is refused naming the field. */
    FILE *fp = fopen(p, "r+b");
    assert_non_null(fp);
    char buf[4096];
    size_t got = fread(buf, 1, sizeof buf, fp);
    char *at = memmem(buf, got, "\"edge_rope\":\"theta=", 19);
    assert_non_null(at);
    at[19] = 'x';
    assert_int_equal(fseek(fp, 0, SEEK_SET), 0);
    assert_int_equal(fwrite(buf, 1, got, fp), got);
    fclose(fp);
    assert_int_equal(kvedge_adapter_load(p, &b, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "edge_rope must be"));
    assert_null(b);

    free(map.entry);
    kvedge_adapter_destroy(&a);
    kvedge_decoder_destroy(&cloud);
    kvedge_decoder_destroy(&edge);
}

/* The other way, head_dim 32 to 16: ThinK picks 8 of the cloud head's 16 rotate-half pairs,
 * scored with the queries of both query heads that read the KV head (4 query / 2 KV heads),
 * and pair (a, a + 16) lands on edge pair (i, i + 8). */
static void test_fit_heads_think(void **state)
{
    (void)state;
    kvedge_decoder_t *cloud = s_load("scaled"), *edge = s_load("cloud");
    const int32_t from[3] = {0, 1, KVEDGE_LAYERMAP_NONE};
    kvedge_layermap_t map;
    s_map(&map, cloud, edge, from);
    enum { T = 300 };
    int32_t tok[T];
    s_tokens(tok, T, 11);
    kvedge_adapter_t *a = NULL;
    assert_int_equal(kvedge_adapter_fit(cloud, edge, &map, tok, T, T, KVEDGE_ADAPT_HEADS, -1, &a),
                     KVEDGE_OK);
    const kvedge_adapter_info_t *i = kvedge_adapter_info(a);
    assert_int_equal(i->cloud_heads, 2);
    assert_int_equal(i->cloud_head_dim, 32);
    assert_int_equal(i->edge_head_dim, 16);
    const uint32_t dc = 32, de = 16, dout = i->edge_heads * de;
    assert_null(kvedge_adapter_weights(a, 2, false));
    for (uint32_t e = 0; e < 2; e++) {
        const float *w = kvedge_adapter_weights(a, e, false);
        for (uint32_t h = 0; h < i->edge_heads; h++) {
            int prev = -1;
            for (uint32_t j = 0; j < de / 2; j++) {
                int lo = -1, hi = -1;
                for (uint32_t r = 0; r < i->cloud_heads * dc; r++) {
                    if (w[(size_t)r * dout + h * de + j] == 1.0f)
                        lo = (int)r;
                    if (w[(size_t)r * dout + h * de + j + de / 2] == 1.0f)
                        hi = (int)r;
                }
                assert_true(lo >= 0);
                assert_true((uint32_t)lo % dc < dc / 2); /* a first half ... */
                assert_int_equal(hi, lo + (int)dc / 2);  /* ... and its partner */
                assert_true(lo > prev);                  /* in channel order */
                prev = lo;
            }
        }
    }
    free(map.entry);
    kvedge_adapter_destroy(&a);
    kvedge_decoder_destroy(&cloud);
    kvedge_decoder_destroy(&edge);
}

/* The committed OPT adapters (version 1, no settings) still load, as not rotary, and an OPT
 * adapter saved again is version 1 with no rotary fields. */
static void test_old_files(void **state)
{
    (void)state;
    const char *names[2] = {"adapter-heads.safetensors", "adapter-linear.safetensors"};
    for (int k = 0; k < 2; k++) {
        char p[512], why[512], q[320];
        snprintf(p, sizeof p, "%s/kjv/ls/%s", KVEDGE_MODELS, names[k]);
        kvedge_adapter_t *a = NULL;
        assert_int_equal(kvedge_adapter_load(p, &a, why, sizeof why), KVEDGE_OK);
        assert_false(kvedge_adapter_info(a)->cloud_rope.rotary);
        assert_false(kvedge_adapter_info(a)->edge_rope.rotary);
        s_path(q, sizeof q, "again.safetensors");
        assert_int_equal(kvedge_adapter_save(a, q), KVEDGE_OK);
        FILE *f1 = fopen(p, "rb"), *f2 = fopen(q, "rb");
        assert_non_null(f1);
        assert_non_null(f2);
        static char b1[1 << 16], b2[1 << 16];
        size_t n1 = fread(b1, 1, sizeof b1, f1), n2 = fread(b2, 1, sizeof b2, f2);
        fclose(f1);
        fclose(f2);
        assert_int_equal(n1, n2);
        assert_memory_equal(b1, b2, n1); /* byte for byte (the first 64 KiB) */
        assert_null(memmem(b2, n2, "rope", 4));
        kvedge_adapter_destroy(&a);
    }
}

static int s_make_models(void)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge_ls_rotary_XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    static const char *const what[3][3] = {
        {"llama", "500000", "cloud"}, {"llama", "10000", "edge"}, {"llama3", "500000", "scaled"}};
    for (int i = 0; i < 3; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "'%s' '%s' bare %s %u %s '%s/%s'", KVEDGE_PYTHON3,
                 KVEDGE_TINY_LLAMA, what[i][0], S_VOCAB, what[i][1], s_dir, what[i][2]);
        if (system(cmd) != 0)
            return -1;
    }
    return 0;
}

int main(void)
{
    char probe[512];
    snprintf(probe, sizeof probe, "'%s' -c 'import numpy' 2>/dev/null", KVEDGE_PYTHON3);
    if (system(probe) != 0) {
        fprintf(stderr,
                "test_ls_rotary: %s has no NumPy (scripts/setup.sh installs "
                "python3-numpy): skipped\n",
                KVEDGE_PYTHON3);
        return 77;
    }
    if (s_make_models() != 0) {
        fprintf(stderr, "test_ls_rotary: tiny_llama.py failed\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_roundtrip),
        cmocka_unit_test(test_model_settings),
        cmocka_unit_test(test_identity_same_settings),
        cmocka_unit_test(test_identity_across_theta),
        cmocka_unit_test(test_think_pairs),
        cmocka_unit_test(test_key_mask_pairs),
        cmocka_unit_test(test_fit_linear_across_theta),
        cmocka_unit_test(test_fit_heads_file),
        cmocka_unit_test(test_fit_heads_think),
        cmocka_unit_test(test_old_files),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_ls_rotary: could not remove %s\n", s_dir);
    return rc;
}
