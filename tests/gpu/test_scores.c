/* Scores against channel-pruned keys (CPU reference of gpu/scores.h) equal q . k_expanded
 * computed in double on the widened keys; argument errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "gpu/scores.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"

static void s_case(uint32_t D, uint32_t T, uint32_t nq, kvedge_dtype_t dt, int masked,
                   uint64_t seed)
{
    kvedge_rng_t r;
    kvedge_rng_seed(&r, seed);
    uint8_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8] = {0};
    uint32_t kc = 0;
    uint16_t idx[KVEDGE_BLOCK_MAX_HEAD_DIM];
    for (uint32_t c = 0; c < D; c++)
        if (!masked || (kvedge_rng_next(&r) % 3) != 0 || c == 0) {
            mask[c >> 3] |= (uint8_t)(1u << (c & 7));
            idx[kc++] = (uint16_t)c;
        }
    float *q = malloc(sizeof(float) * nq * D), *kf = malloc(sizeof(float) * T * kc);
    float *sc = malloc(sizeof(float) * nq * T);
    uint8_t *kb = malloc(kvedge_dtype_size(dt) * T * kc);
    for (size_t i = 0; i < (size_t)nq * D; i++)
        q[i] = kvedge_rng_normal(&r);
    for (size_t i = 0; i < (size_t)T * kc; i++)
        kf[i] = kvedge_rng_normal(&r);
    kvedge_convert_from_f32(dt, kf, (size_t)T * kc, kb);
    kvedge_convert_to_f32(dt, kb, (size_t)T * kc, kf);
    const float scale = 0.125f;
    kvedge_scores_args_t a = {q, dt, kb, nq, T, D, kc, masked ? mask : NULL, scale, sc};
    assert_int_equal(kvedge_cpu_masked_scores(&a), KVEDGE_OK);
    double *wide = malloc(sizeof(double) * D);
    for (uint32_t t = 0; t < T; t++) {
        memset(wide, 0, sizeof(double) * D);
        for (uint32_t j = 0; j < kc; j++)
            wide[idx[j]] = kf[(size_t)t * kc + j];
        for (uint32_t i = 0; i < nq; i++) {
            double dot = 0, mag = 0;
            for (uint32_t c = 0; c < D; c++) {
                dot += q[(size_t)i * D + c] * wide[c];
                mag += fabs(q[(size_t)i * D + c] * wide[c]);
            }
            const double got = sc[(size_t)i * T + t];
            assert_false(isnan(got));
            assert_true(fabs(got - scale * dot) <= KVEDGE_SCORES_GPU_TOL_REL * scale * mag + 1e-30);
        }
    }
    free(wide);
    free(q);
    free(kf);
    free(sc);
    free(kb);
}

static void test_matches_expanded(void **state)
{
    (void)state;
    uint64_t seed = 3;
    static const uint32_t dims[] = {64, 128, 65};
    for (size_t d = 0; d < 3; d++)
        for (int dt = KVEDGE_DTYPE_FP16; dt <= KVEDGE_DTYPE_FP32; dt++)
            for (int masked = 0; masked <= 1; masked++) {
                s_case(dims[d], 37, 3, (kvedge_dtype_t)dt, masked, seed++);
                s_case(dims[d], 1, 1, (kvedge_dtype_t)dt, masked, seed++);
            }
}

static void test_errors(void **state)
{
    (void)state;
    float q[8] = {0}, k[8] = {0}, s[4];
    uint8_t mask[1] = {0x0F};
    kvedge_scores_args_t good = {q, KVEDGE_DTYPE_FP32, k, 1, 2, 8, 4, mask, 1.0f, s};
    assert_int_equal(kvedge_cpu_masked_scores(&good), KVEDGE_OK);
    kvedge_scores_args_t a = good;
    a.key_channels = 3; /* popcount mismatch */
    assert_int_equal(kvedge_cpu_masked_scores(&a), KVEDGE_EINVAL);
    a = good;
    a.head_dim = 3; /* mask bit 3 lies past head_dim */
    a.key_channels = 3;
    assert_int_equal(kvedge_cpu_masked_scores(&a), KVEDGE_EINVAL);
    a = good;
    a.k = NULL;
    assert_int_equal(kvedge_cpu_masked_scores(&a), KVEDGE_EINVAL);
    a = good;
    a.k_dtype = (kvedge_dtype_t)7;
    assert_int_equal(kvedge_cpu_masked_scores(&a), KVEDGE_EINVAL);
    a = good;
    a.key_mask = NULL; /* unmasked needs key_channels == head_dim */
    assert_int_equal(kvedge_cpu_masked_scores(&a), KVEDGE_EINVAL);
    assert_int_equal(kvedge_cpu_masked_scores(NULL), KVEDGE_EINVAL);
    a = good;
    a.tokens = 0; /* nothing to score */
    a.scores = NULL;
    assert_int_equal(kvedge_cpu_masked_scores(&a), KVEDGE_OK);
    if (!kvedge_gpu_built_with_cuda())
        assert_int_equal(kvedge_gpu_masked_scores(&good, NULL), KVEDGE_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_expanded),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
