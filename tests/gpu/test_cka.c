/* CKA and ThinK channel scores (CPU reference of gpu/cka.h) against double loops; the top-k
 * keep-mask and its use as a block key mask; argument errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cka.h"
#include "gpu/gpu.h"
#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/synth.h"

/* Linear CKA in double via the n x n Gram matrices (the other textbook form than the
 * reference's feature-space one, so a shared mistake is unlikely). */
static double s_cka_naive(const float *x, const float *y, uint32_t n, uint32_t d1, uint32_t d2)
{
    double *K = calloc((size_t)n * n, sizeof(double)), *L = calloc((size_t)n * n, sizeof(double));
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++) {
            for (uint32_t c = 0; c < d1; c++)
                K[i * n + j] += (double)x[i * d1 + c] * x[j * d1 + c];
            for (uint32_t c = 0; c < d2; c++)
                L[i * n + j] += (double)y[i * d2 + c] * y[j * d2 + c];
        }
    /* Double centering H K H. */
    double *m[2] = {K, L};
    for (int w = 0; w < 2; w++) {
        double *M = m[w], tot = 0;
        double *row = calloc(n, sizeof(double));
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < n; j++) {
                row[i] += M[i * n + j] / n;
                tot += M[i * n + j] / ((double)n * n);
            }
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < n; j++)
                M[i * n + j] += tot - row[i] - row[j];
        free(row);
    }
    double kl = 0, kk = 0, ll = 0;
    for (size_t i = 0; i < (size_t)n * n; i++) {
        kl += K[i] * L[i];
        kk += K[i] * K[i];
        ll += L[i] * L[i];
    }
    free(K);
    free(L);
    return kl / sqrt(kk * ll);
}

static void test_cka(void **state)
{
    (void)state;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 9);
    const uint32_t n = 40, d1 = 24, d2 = 17;
    float *x = malloc(sizeof(float) * n * d1), *y = malloc(sizeof(float) * n * d2);
    float *z = malloc(sizeof(float) * n * d1);
    for (uint32_t i = 0; i < n * d1; i++)
        x[i] = kvedge_rng_normal(&r) + 3.0f; /* an offset that centering must remove */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < d2; c++) /* y partly a linear map of x, partly noise */
            y[i * d2 + c] =
                0.7f * x[i * d1 + c] - 0.4f * x[i * d1 + c + 5] + 0.5f * kvedge_rng_normal(&r);
    double got = -1;
    kvedge_cka_args_t a = {x, y, n, d1, d2, &got};
    assert_int_equal(kvedge_cpu_cka(&a), KVEDGE_OK);
    const double ref = s_cka_naive(x, y, n, d1, d2);
    assert_true(ref > 0.2 && ref < 0.99);
    assert_true(fabs(got - ref) <= KVEDGE_CKA_TOL);

    /* Invariances: CKA(X, X) = 1; CKA(X, 2X + 5) = 1. */
    for (uint32_t i = 0; i < n * d1; i++)
        z[i] = 2.0f * x[i] + 5.0f;
    kvedge_cka_args_t s = {x, z, n, d1, d1, &got};
    assert_int_equal(kvedge_cpu_cka(&s), KVEDGE_OK);
    assert_true(fabs(got - 1.0) <= KVEDGE_CKA_TOL);
    /* A constant side has no variance: defined as 0. */
    for (uint32_t i = 0; i < n * d1; i++)
        z[i] = 4.0f;
    assert_int_equal(kvedge_cpu_cka(&s), KVEDGE_OK);
    assert_true(got == 0.0);

    kvedge_cka_args_t e = a;
    e.n = 1;
    assert_int_equal(kvedge_cpu_cka(&e), KVEDGE_EINVAL);
    e = a;
    e.cka = NULL;
    assert_int_equal(kvedge_cpu_cka(&e), KVEDGE_EINVAL);
    e = a;
    e.d2 = 0;
    assert_int_equal(kvedge_cpu_cka(&e), KVEDGE_EINVAL);
    if (!kvedge_gpu_built_with_cuda())
        assert_int_equal(kvedge_gpu_cka(&a, NULL), KVEDGE_EINVAL);
    free(x);
    free(y);
    free(z);
}

static void test_think_scores(void **state)
{
    (void)state;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 4);
    const uint32_t H = 3, nq = 8, n = 50, D = 128;
    float *q = malloc(sizeof(float) * H * nq * D), *k = malloc(sizeof(float) * H * n * D);
    float *s = malloc(sizeof(float) * H * D);
    for (uint32_t i = 0; i < H * nq * D; i++)
        q[i] = kvedge_rng_normal(&r) * (1.0f + (float)(i % D) / 32.0f);
    for (uint32_t i = 0; i < H * n * D; i++)
        k[i] = kvedge_rng_normal(&r);
    kvedge_think_args_t a = {q, k, H, nq, n, D, s};
    assert_int_equal(kvedge_cpu_think_scores(&a), KVEDGE_OK);
    for (uint32_t h = 0; h < H; h++)
        for (uint32_t c = 0; c < D; c++) {
            /* Frobenius norm of the rank-1 matrix Q[:,c] K[:,c]^T, entry by entry. */
            double f = 0;
            for (uint32_t i = 0; i < nq; i++)
                for (uint32_t j = 0; j < n; j++) {
                    const double e = (double)q[(h * nq + i) * D + c] * k[(h * n + j) * D + c];
                    f += e * e;
                }
            f = sqrt(f);
            assert_true(fabs(s[h * D + c] - f) <= KVEDGE_THINK_TOL_REL * f);
        }
    /* No queries: every channel scores 0. */
    a.nq = 0;
    a.q = NULL;
    assert_int_equal(kvedge_cpu_think_scores(&a), KVEDGE_OK);
    for (uint32_t i = 0; i < H * D; i++)
        assert_true(s[i] == 0.0f);
    a.head_dim = 0;
    assert_int_equal(kvedge_cpu_think_scores(&a), KVEDGE_EINVAL);
    assert_int_equal(kvedge_cpu_think_scores(NULL), KVEDGE_EINVAL);
    free(q);
    free(k);
    free(s);
}

static void test_keep_mask(void **state)
{
    (void)state;
    float sc[10] = {0.5f, 3.0f, 1.0f, 3.0f, NAN, 2.0f, 0.0f, 7.0f, 1.0f, 2.5f};
    uint8_t m[2] = {0xFF, 0xFF};
    assert_int_equal(kvedge_think_keep_mask(sc, 10, 4, m, sizeof m), KVEDGE_OK);
    /* 7.0 (ch 7), 3.0 (ch 1), 3.0 (ch 3, tie: lower first), 2.5 (ch 9) */
    assert_int_equal(m[0], (1u << 7) | (1u << 1) | (1u << 3));
    assert_int_equal(m[1], 1u << 1);
    assert_int_equal(kvedge_think_keep_mask(sc, 10, 10, m, sizeof m), KVEDGE_OK);
    assert_int_equal(m[0], 0xFF);
    assert_int_equal(m[1], 0x03); /* NaN ranks last but is kept when all are; padding zero */
    uint8_t before[2] = {m[0], m[1]};
    assert_int_equal(kvedge_think_keep_mask(sc, 10, 0, m, sizeof m), KVEDGE_EINVAL);
    assert_int_equal(kvedge_think_keep_mask(sc, 10, 11, m, sizeof m), KVEDGE_EINVAL);
    assert_int_equal(kvedge_think_keep_mask(sc, 10, 3, m, 1), KVEDGE_ENOSPACE);
    assert_int_equal(kvedge_think_keep_mask(NULL, 10, 3, m, 2), KVEDGE_EINVAL);
    assert_memory_equal(m, before, 2);

    /* The mask is a valid block key mask: encode with it and get `keep` channels. */
    const uint32_t D = 64, T = 8, keep = 20;
    float s64[64], kf[8 * 64], vf[8 * 64];
    for (uint32_t c = 0; c < D; c++)
        s64[c] = (float)((c * 37) % 64);
    uint8_t mask[8];
    assert_int_equal(kvedge_think_keep_mask(s64, D, keep, mask, sizeof mask), KVEDGE_OK);
    assert_int_equal(kvedge_synth_head_f32(1, 0, T, D, kf, vf), 0);
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_INT8, T, D, 0, mask, false};
    size_t cap = kvedge_block_encoded_bound(&spec), len = 0;
    uint8_t *blk = malloc(cap);
    assert_int_equal(kvedge_block_encode(&spec, kf, vf, blk, cap, &len), KVEDGE_OK);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_OK);
    assert_int_equal(info.key_channels, keep);
    free(blk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cka),
        cmocka_unit_test(test_think_scores),
        cmocka_unit_test(test_keep_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
