/* CUDA attention partial/merge, masked scores, CKA and ThinK scores against their CPU
 * references, with the tolerances stated in the headers. Exits 77 without a device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/attn.h"
#include "gpu/cka.h"
#include "gpu/rsa.h"
#include "gpu/gpu.h"
#include "gpu/scores.h"
#include "gpu/stage.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"

static void *s_up(const void *src, size_t n)
{
    void *d = NULL;
    assert_int_equal(kvedge_gpu_dev_alloc(n ? n : 4, &d), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_copy_h2d(d, src, n, NULL), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_stream_sync(NULL), KVEDGE_OK);
    return d;
}

static void s_down(void *dst, const void *dev, size_t n)
{
    assert_int_equal(kvedge_gpu_copy_d2h(dst, dev, n, NULL), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_stream_sync(NULL), KVEDGE_OK);
}

static void *s_rand(kvedge_rng_t *r, kvedge_dtype_t dt, size_t n, float amp)
{
    float *f = malloc(sizeof(float) * (n + 1));
    void *b = malloc(kvedge_dtype_size(dt) * (n + 1));
    for (size_t i = 0; i < n; i++)
        f[i] = amp * kvedge_rng_normal(r);
    kvedge_convert_from_f32(dt, f, n, b);
    free(f);
    return b;
}

static void s_attn_case(uint32_t H, uint32_t KH, uint32_t D, uint32_t nq, uint32_t n, bool causal,
                        kvedge_dtype_t dt, uint64_t seed)
{
    kvedge_rng_t r;
    kvedge_rng_seed(&r, seed);
    const size_t es = kvedge_dtype_size(dt), qn = (size_t)H * nq * D, kn = (size_t)KH * n * D;
    void *q = s_rand(&r, dt, qn, 1.0f), *k = s_rand(&r, dt, kn, 1.0f),
         *v = s_rand(&r, dt, kn, 2.0f);
    float *o = malloc(sizeof(float) * qn), *l = malloc(sizeof(float) * H * nq);
    float *go = malloc(sizeof(float) * qn), *gl = malloc(sizeof(float) * H * nq);
    kvedge_attn_partial_args_t c = {dt,     q, k, v, H, KH, nq, n, D, 1.0f / sqrtf((float)D),
                                    causal, 0, o, l};
    assert_int_equal(kvedge_cpu_attn_partial(&c), KVEDGE_OK);
    kvedge_attn_partial_args_t g = c;
    g.q = s_up(q, qn * es);
    g.k = s_up(k, kn * es);
    g.v = s_up(v, kn * es);
    void *dout = NULL, *dlse = NULL;
    assert_int_equal(kvedge_gpu_dev_alloc(qn * sizeof(float), &dout), 0);
    assert_int_equal(kvedge_gpu_dev_alloc(H * nq * sizeof(float), &dlse), 0);
    g.o = dout;
    g.lse = dlse;
    assert_int_equal(kvedge_gpu_attn_partial(&g, NULL), KVEDGE_OK);
    s_down(go, dout, qn * sizeof(float));
    s_down(gl, dlse, H * nq * sizeof(float));
    for (size_t i = 0; i < H * nq; i++) {
        if (isinf(l[i])) {
            assert_true(isinf(gl[i]) && gl[i] < 0);
            continue;
        }
        assert_true(fabsf(gl[i] - l[i]) <= KVEDGE_ATTN_GPU_TOL_REL * fmaxf(1.0f, fabsf(l[i])));
    }
    for (size_t i = 0; i < qn; i++) {
        assert_false(isnan(go[i]));
        assert_true(fabsf(go[i] - o[i]) <= KVEDGE_ATTN_GPU_TOL_REL * 2.0f * 6.0f); /* |V|<~12 */
    }
    /* Merge this partial with itself shifted: GPU merge against CPU merge. */
    float *mo = malloc(sizeof(float) * qn), *ml = malloc(sizeof(float) * H * nq);
    for (size_t i = 0; i < H * nq; i++)
        gl[i] = l[i] + (i % 3 == 0 ? -INFINITY : 0.5f); /* some rows with an empty second side */
    kvedge_attn_merge_args_t cm = {o, l, o, gl, mo, ml, H * nq, D};
    assert_int_equal(kvedge_cpu_attn_merge(&cm), KVEDGE_OK);
    void *dl2 = s_up(gl, H * nq * sizeof(float)), *do1 = s_up(o, qn * sizeof(float));
    void *dl1 = s_up(l, H * nq * sizeof(float));
    kvedge_attn_merge_args_t gm = {do1, dl1, do1, dl2, do1, dl1, H * nq, D}; /* in place */
    assert_int_equal(kvedge_gpu_attn_merge(&gm, NULL), KVEDGE_OK);
    s_down(go, do1, qn * sizeof(float));
    s_down(gl, dl1, H * nq * sizeof(float));
    for (size_t i = 0; i < qn; i++)
        assert_true(fabsf(go[i] - mo[i]) <= 1e-6f * 12.0f);
    for (size_t i = 0; i < H * nq; i++)
        assert_true(isinf(ml[i]) ? gl[i] == ml[i]
                                 : fabsf(gl[i] - ml[i]) <= 1e-6f * fmaxf(1, fabsf(ml[i])));
    kvedge_gpu_dev_free((void *)g.q);
    kvedge_gpu_dev_free((void *)g.k);
    kvedge_gpu_dev_free((void *)g.v);
    kvedge_gpu_dev_free(dout);
    kvedge_gpu_dev_free(dlse);
    kvedge_gpu_dev_free(dl1);
    kvedge_gpu_dev_free(dl2);
    kvedge_gpu_dev_free(do1);
    free(q);
    free(k);
    free(v);
    free(o);
    free(l);
    free(go);
    free(gl);
    free(mo);
    free(ml);
}

static void test_attn(void **state)
{
    (void)state;
    uint64_t seed = 1;
    for (int dt = KVEDGE_DTYPE_FP16; dt <= KVEDGE_DTYPE_FP32; dt++)
        for (uint32_t D = 64; D <= 128; D += 64) {
            s_attn_case(4, 2, D, 5, 300, false, (kvedge_dtype_t)dt, seed++);
            s_attn_case(4, 4, D, 17, 17, true, (kvedge_dtype_t)dt, seed++);
            s_attn_case(2, 1, D, 3, 0, false, (kvedge_dtype_t)dt, seed++); /* empty */
            s_attn_case(2, 2, D, 1, 1, true, (kvedge_dtype_t)dt, seed++);
        }
}

static void test_scores(void **state)
{
    (void)state;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 8);
    for (uint32_t D = 64; D <= 128; D += 64)
        for (int dt = KVEDGE_DTYPE_FP16; dt <= KVEDGE_DTYPE_FP32; dt++) {
            uint8_t mask[16] = {0};
            uint32_t kc = 0;
            for (uint32_t c = 0; c < D; c++)
                if (c == 0 || kvedge_rng_next(&r) % 3) {
                    mask[c >> 3] |= (uint8_t)(1u << (c & 7));
                    kc++;
                }
            const uint32_t nq = 3, T = 41;
            float *q = s_rand(&r, KVEDGE_DTYPE_FP32, (size_t)nq * D, 1.0f);
            void *k = s_rand(&r, (kvedge_dtype_t)dt, (size_t)T * kc, 1.0f);
            float *cs = malloc(sizeof(float) * nq * T), *gs = malloc(sizeof(float) * nq * T);
            kvedge_scores_args_t c = {q, (kvedge_dtype_t)dt, k, nq, T, D, kc, mask, 0.1f, cs};
            assert_int_equal(kvedge_cpu_masked_scores(&c), KVEDGE_OK);
            kvedge_scores_args_t g = c;
            g.q = s_up(q, sizeof(float) * nq * D);
            g.k = s_up(k, kvedge_dtype_size((kvedge_dtype_t)dt) * T * kc);
            void *ds = NULL;
            assert_int_equal(kvedge_gpu_dev_alloc(sizeof(float) * nq * T, &ds), 0);
            g.scores = ds;
            assert_int_equal(kvedge_gpu_masked_scores(&g, NULL), KVEDGE_OK);
            s_down(gs, ds, sizeof(float) * nq * T);
            for (uint32_t i = 0; i < nq * T; i++) /* |q.k| <= ~ 3 * sqrt(kc) * 4 */
                assert_true(fabsf(gs[i] - cs[i]) <=
                            KVEDGE_SCORES_GPU_TOL_REL * 0.1f * 4.0f * (float)kc);
            kvedge_gpu_dev_free((void *)g.q);
            kvedge_gpu_dev_free((void *)g.k);
            kvedge_gpu_dev_free(ds);
            free(q);
            free(k);
            free(cs);
            free(gs);
        }
}

static void test_cka_think(void **state)
{
    (void)state;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 5);
    const uint32_t n = 64, d1 = 48, d2 = 33;
    float *x = s_rand(&r, KVEDGE_DTYPE_FP32, (size_t)n * d1, 1.0f);
    float *y = s_rand(&r, KVEDGE_DTYPE_FP32, (size_t)n * d2, 1.0f);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < d2; c++)
            y[i * d2 + c] += x[i * d1 + c];
    double cc = 0, gc = 0;
    kvedge_cka_args_t c = {x, y, n, d1, d2, &cc};
    assert_int_equal(kvedge_cpu_cka(&c), KVEDGE_OK);
    kvedge_cka_args_t g = c;
    g.x = s_up(x, sizeof(float) * n * d1);
    g.y = s_up(y, sizeof(float) * n * d2);
    g.cka = &gc;
    assert_int_equal(kvedge_gpu_cka(&g, NULL), KVEDGE_OK);
    assert_true(fabs(gc - cc) <= KVEDGE_CKA_TOL);

    const uint32_t H = 2, nq = 6, nk = 70, D = 128;
    float *q = s_rand(&r, KVEDGE_DTYPE_FP32, (size_t)H * nq * D, 1.0f);
    float *k = s_rand(&r, KVEDGE_DTYPE_FP32, (size_t)H * nk * D, 1.0f);
    float *cs = malloc(sizeof(float) * H * D), *gs = malloc(sizeof(float) * H * D);
    kvedge_think_args_t tc = {q, k, H, nq, nk, D, cs};
    assert_int_equal(kvedge_cpu_think_scores(&tc), KVEDGE_OK);
    kvedge_think_args_t tg = tc;
    tg.q = s_up(q, sizeof(float) * H * nq * D);
    tg.k = s_up(k, sizeof(float) * H * nk * D);
    void *ds = NULL;
    assert_int_equal(kvedge_gpu_dev_alloc(sizeof(float) * H * D, &ds), 0);
    tg.scores = ds;
    assert_int_equal(kvedge_gpu_think_scores(&tg, NULL), KVEDGE_OK);
    s_down(gs, ds, sizeof(float) * H * D);
    for (uint32_t i = 0; i < H * D; i++)
        assert_true(fabsf(gs[i] - cs[i]) <= 1e-4f * cs[i]);
    kvedge_gpu_dev_free((void *)g.x);
    kvedge_gpu_dev_free((void *)g.y);
    kvedge_gpu_dev_free((void *)tg.q);
    kvedge_gpu_dev_free((void *)tg.k);
    kvedge_gpu_dev_free(ds);
    free(x);
    free(y);
    free(q);
    free(k);
    free(cs);
    free(gs);
}

/* RSA on odd sample counts (the lower-triangle reductions split rows across threads) and a
 * zero row (cosine 0 with every row on both paths). */
static void test_rsa(void **state)
{
    (void)state;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 11);
    const uint32_t ns[] = {2, 3, 37, 300}, d1 = 48, d2 = 29;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        const uint32_t n = ns[t];
        float *x = s_rand(&r, KVEDGE_DTYPE_FP32, (size_t)n * d1, 1.0f);
        float *y = s_rand(&r, KVEDGE_DTYPE_FP32, (size_t)n * d2, 1.0f);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t c = 0; c < d2; c++)
                y[i * d2 + c] += x[i * d1 + c];
        if (n > 3)
            memset(x + d1, 0, sizeof(float) * d1);
        double cr = 2, gr = 2;
        kvedge_rsa_args_t c = {x, y, n, d1, d2, &cr};
        assert_int_equal(kvedge_cpu_rsa(&c), KVEDGE_OK);
        kvedge_rsa_args_t g = c;
        g.x = s_up(x, sizeof(float) * n * d1);
        g.y = s_up(y, sizeof(float) * n * d2);
        g.rsa = &gr;
        assert_int_equal(kvedge_gpu_rsa(&g, NULL), KVEDGE_OK);
        assert_true(fabs(gr - cr) <= KVEDGE_RSA_TOL);
        kvedge_gpu_dev_free((void *)g.x);
        kvedge_gpu_dev_free((void *)g.y);
        free(x);
        free(y);
    }
}

int main(void)
{
    if (kvedge_gpu_device_count() == 0)
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn),
        cmocka_unit_test(test_scores),
        cmocka_unit_test(test_cka_think),
        cmocka_unit_test(test_rsa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
