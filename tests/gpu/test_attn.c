/* Partial attention and the log-sum-exp merge (CPU reference of gpu/attn.h): merging the
 * context partial with the causal local partial equals attention over the concatenation,
 * computed here with double loops, within KVEDGE_ATTN_TOL_REL * max |V|; empty sides, GQA,
 * in-place merge and argument errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/attn.h"
#include "gpu/gpu.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"

/* Random [n] floats, stored in dtype (buf) and read back as the exact float values (f). */
static void s_fill(kvedge_rng_t *r, kvedge_dtype_t dt, size_t n, float amp, void *buf, float *f)
{
    for (size_t i = 0; i < n; i++)
        f[i] = amp * kvedge_rng_normal(r);
    kvedge_convert_from_f32(dt, f, n, buf);
    kvedge_convert_to_f32(dt, buf, n, f);
}

typedef struct {
    uint32_t H, KH, D, nq, n1, n2;
    kvedge_dtype_t dt;
} s_case_t;

static void s_run(const s_case_t *c, uint64_t seed)
{
    const uint32_t H = c->H, KH = c->KH, D = c->D, nq = c->nq, n1 = c->n1, n2 = c->n2;
    const size_t es = kvedge_dtype_size(c->dt);
    kvedge_rng_t r;
    kvedge_rng_seed(&r, seed);
    const size_t qn = (size_t)H * nq * D, k1n = (size_t)KH * n1 * D, k2n = (size_t)KH * n2 * D;
    float *qf = malloc(sizeof(float) * (qn + 2 * k1n + 2 * k2n + 1));
    float *k1f = qf + qn, *v1f = k1f + k1n, *k2f = v1f + k1n, *v2f = k2f + k2n;
    uint8_t *qb = malloc(es * (qn + 1)), *k1b = malloc(es * (k1n + 1)),
            *v1b = malloc(es * (k1n + 1));
    uint8_t *k2b = malloc(es * (k2n + 1)), *v2b = malloc(es * (k2n + 1));
    assert_non_null(qf);
    s_fill(&r, c->dt, qn, 1.0f, qb, qf);
    s_fill(&r, c->dt, k1n, 1.0f, k1b, k1f);
    s_fill(&r, c->dt, k1n, 2.0f, v1b, v1f);
    s_fill(&r, c->dt, k2n, 1.0f, k2b, k2f);
    s_fill(&r, c->dt, k2n, 2.0f, v2b, v2f);
    const float scale = 1.0f / sqrtf((float)D);
    float *o1 = malloc(sizeof(float) * (3 * qn + 1)), *o2 = o1 + qn, *o = o2 + qn;
    float *l1 = malloc(sizeof(float) * (3 * (size_t)H * nq + 1)), *l2 = l1 + H * nq,
          *l = l2 + H * nq;
    kvedge_attn_partial_args_t p1 = {c->dt, qb, k1b,   v1b,   H, KH, nq,
                                     n1,    D,  scale, false, 0, o1, l1};
    kvedge_attn_partial_args_t p2 = {c->dt, qb, k2b, v2b, H, KH, nq, n2, D, scale, true, 0, o2, l2};
    assert_int_equal(kvedge_cpu_attn_partial(&p1), KVEDGE_OK);
    assert_int_equal(kvedge_cpu_attn_partial(&p2), KVEDGE_OK);
    kvedge_attn_merge_args_t m = {o1, l1, o2, l2, o, l, H * nq, D};
    assert_int_equal(kvedge_cpu_attn_merge(&m), KVEDGE_OK);

    /* Reference: query i of head h sees every context key and local keys 0..i. */
    double vmax = 0;
    for (size_t i = 0; i < k1n; i++)
        vmax = fmax(vmax, fabs(v1f[i]));
    for (size_t i = 0; i < k2n; i++)
        vmax = fmax(vmax, fabs(v2f[i]));
    double *sc = malloc(sizeof(double) * (n1 + n2 + 1)), *ref = malloc(sizeof(double) * D);
    double worst = 0;
    for (uint32_t h = 0; h < H; h++) {
        const uint32_t kh = h / (H / KH);
        for (uint32_t i = 0; i < nq; i++) {
            const float *q = qf + ((size_t)h * nq + i) * D;
            const uint32_t loc = i + 1 < n2 ? i + 1 : n2, tot = n1 + loc;
            double mx = -INFINITY, sum = 0;
            for (uint32_t j = 0; j < tot; j++) {
                const float *k =
                    j < n1 ? k1f + ((size_t)kh * n1 + j) * D : k2f + ((size_t)kh * n2 + j - n1) * D;
                double d = 0;
                for (uint32_t x = 0; x < D; x++)
                    d += (double)q[x] * k[x];
                sc[j] = d * scale;
                mx = fmax(mx, sc[j]);
            }
            memset(ref, 0, sizeof(double) * D);
            for (uint32_t j = 0; j < tot; j++) {
                const double p = exp(sc[j] - mx);
                const float *v =
                    j < n1 ? v1f + ((size_t)kh * n1 + j) * D : v2f + ((size_t)kh * n2 + j - n1) * D;
                sum += p;
                for (uint32_t x = 0; x < D; x++)
                    ref[x] += p * v[x];
            }
            const float *got = o + ((size_t)h * nq + i) * D;
            const float gl = l[(size_t)h * nq + i];
            if (tot == 0) {
                assert_true(gl == -INFINITY);
                for (uint32_t x = 0; x < D; x++)
                    assert_true(got[x] == 0.0f);
                continue;
            }
            const double lse = mx + log(sum);
            assert_true(fabs(gl - lse) <= KVEDGE_ATTN_TOL_REL * fmax(1.0, fabs(lse)));
            for (uint32_t x = 0; x < D; x++) {
                assert_false(isnan(got[x]));
                worst = fmax(worst, fabs(got[x] - ref[x] / sum));
            }
        }
    }
    assert_true(worst <= KVEDGE_ATTN_TOL_REL * vmax);

    /* In place: o and lse may be the first partial's buffers. */
    kvedge_attn_merge_args_t mi = {o1, l1, o2, l2, o1, l1, H * nq, D};
    assert_int_equal(kvedge_cpu_attn_merge(&mi), KVEDGE_OK);
    assert_memory_equal(o1, o, sizeof(float) * qn);
    assert_memory_equal(l1, l, sizeof(float) * H * nq);
    free(sc);
    free(ref);
    free(o1);
    free(l1);
    free(qf);
    free(qb);
    free(k1b);
    free(v1b);
    free(k2b);
    free(v2b);
}

static void test_merge_equals_concatenation(void **state)
{
    (void)state;
    static const uint32_t n1s[] = {1, 50, 300}, n2s[] = {1, 17};
    static const uint32_t dims[] = {64, 128};
    uint64_t seed = 1;
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 2; b++)
            for (size_t d = 0; d < 2; d++)
                for (int dt = KVEDGE_DTYPE_FP16; dt <= KVEDGE_DTYPE_FP32; dt++) {
                    s_case_t c = {4, 2, dims[d], n2s[b], n1s[a], n2s[b], (kvedge_dtype_t)dt};
                    s_run(&c, seed++);
                    c.KH = 4;
                    s_run(&c, seed++);
                }
}

/* One side empty: the merge returns the other side exactly as attention over it alone. */
static void test_empty_side(void **state)
{
    (void)state;
    s_case_t no_ctx = {2, 2, 64, 9, 0, 9, KVEDGE_DTYPE_FP32};
    s_run(&no_ctx, 11);
    s_case_t no_local = {2, 1, 64, 6, 40, 0, KVEDGE_DTYPE_FP16};
    s_run(&no_local, 12);
    s_case_t nothing = {1, 1, 64, 3, 0, 0, KVEDGE_DTYPE_FP32};
    s_run(&nothing, 13);
}

/* causal_offset shifts the window: with -2 the first two queries see no key at all. */
static void test_causal_offset(void **state)
{
    (void)state;
    const uint32_t D = 8, n = 5, nq = 4;
    float q[4 * 8], k[5 * 8], v[5 * 8], o[4 * 8], lse[4];
    for (uint32_t i = 0; i < nq * D; i++)
        q[i] = 0.1f * (float)(i % 7);
    for (uint32_t i = 0; i < n * D; i++) {
        k[i] = 0.05f * (float)(i % 5);
        v[i] = (float)(i / D); /* value of key j is j in every channel */
    }
    kvedge_attn_partial_args_t a = {
        KVEDGE_DTYPE_FP32, q, k, v, 1, 0, nq, n, D, 1.0f, true, -2, o, lse};
    assert_int_equal(kvedge_cpu_attn_partial(&a), KVEDGE_OK);
    assert_true(lse[0] == -INFINITY && lse[1] == -INFINITY);
    assert_true(o[0] == 0.0f && o[D] == 0.0f);
    assert_true(isfinite(lse[2]));
    assert_float_equal(o[2 * D], 0.0f, 1e-6); /* query 2 sees key 0 only */
    assert_true(o[3 * D] > 0.0f && o[3 * D] < 1.0f);
    /* A large positive offset is plain non-causal attention. */
    float o2[4 * 8], lse2[4];
    a.causal_offset = 100;
    a.o = o2;
    a.lse = lse2;
    assert_int_equal(kvedge_cpu_attn_partial(&a), KVEDGE_OK);
    a.causal = false;
    a.o = o;
    a.lse = lse;
    assert_int_equal(kvedge_cpu_attn_partial(&a), KVEDGE_OK);
    assert_memory_equal(o, o2, sizeof o);
}

static void test_errors(void **state)
{
    (void)state;
    float q[64], k[64], v[64], o[64], lse[8];
    kvedge_attn_partial_args_t good = {
        KVEDGE_DTYPE_FP32, q, k, v, 4, 2, 1, 2, 8, 1.0f, false, 0, o, lse};
    kvedge_attn_partial_args_t a = good;
    assert_int_equal(kvedge_cpu_attn_partial(NULL), KVEDGE_EINVAL);
    a.kv_heads = 3;
    assert_int_equal(kvedge_cpu_attn_partial(&a), KVEDGE_EINVAL);
    a = good;
    a.dtype = (kvedge_dtype_t)0;
    assert_int_equal(kvedge_cpu_attn_partial(&a), KVEDGE_EINVAL);
    a = good;
    a.scale = NAN;
    assert_int_equal(kvedge_cpu_attn_partial(&a), KVEDGE_EINVAL);
    a = good;
    a.k = NULL;
    assert_int_equal(kvedge_cpu_attn_partial(&a), KVEDGE_EINVAL);
    a = good;
    a.head_dim = 0;
    assert_int_equal(kvedge_cpu_attn_partial(&a), KVEDGE_EINVAL);
    kvedge_attn_merge_args_t m = {o, lse, o, lse, NULL, lse, 1, 8};
    assert_int_equal(kvedge_cpu_attn_merge(&m), KVEDGE_EINVAL);
    assert_int_equal(kvedge_cpu_attn_merge(NULL), KVEDGE_EINVAL);
    if (!kvedge_gpu_built_with_cuda()) {
        assert_int_equal(kvedge_gpu_attn_partial(&good, NULL), KVEDGE_EINVAL);
        assert_int_equal(kvedge_gpu_attn_merge(&m, NULL), KVEDGE_EINVAL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_equals_concatenation),
        cmocka_unit_test(test_empty_side),
        cmocka_unit_test(test_causal_offset),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
