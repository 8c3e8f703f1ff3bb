/* Quantization math: exact half conversions, and stated error bounds for int8 and int4 on
 * keys with outlier channels (K, V and the attention output computed with them). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/half.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"
#include "tests/common/testutil.h"

/* Error bounds this codebase promises (docs/block-format.md), for head_dim 128, 256 tokens of
 * synthetic keys with 6% outlier channels at 8x scale, default groups. Measured when written:
 * int8 K 0.0046 V 0.0059 attention 0.0129; int4 K 0.057 V 0.078 attention 0.145. The
 * attention error exceeds the K error because the outlier channels make softmax peaky. */
#define INT8_MAX_REL_ERR_KV   0.010
#define INT8_MAX_REL_ERR_ATTN 0.020
#define INT4_MAX_REL_ERR_KV   0.100
#define INT4_MAX_REL_ERR_ATTN 0.180

static void test_fp16_exhaustive(void **state)
{
    (void)state;
    /* Every half converts to float and back unchanged (NaNs stay NaN), and matches the
     * compiler's own _Float16 conversion. */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvedge_fp16_to_f32((uint16_t)h);
        _Float16 ref;
        uint16_t hb = (uint16_t)h;
        memcpy(&ref, &hb, 2);
        if (isnan(f)) {
            assert_true(isnan((float)ref));
            assert_true(isnan(kvedge_fp16_to_f32(kvedge_f32_to_fp16(f))));
            continue;
        }
        assert_true(f == (float)ref);
        assert_int_equal(kvedge_f32_to_fp16(f), h);
    }
    /* float -> half rounding agrees with the compiler on a sweep of awkward values. */
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 42);
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)kvedge_rng_next(&r);
        float f = kvedge_f32_from_bits(bits);
        if (isnan(f))
            continue;
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &ref, 2);
        if (kvedge_f32_to_fp16(f) != rb)
            fail_msg("fp16(%a) = %04x, expected %04x", (double)f, kvedge_f32_to_fp16(f), rb);
    }
}

static void test_bf16(void **state)
{
    (void)state;
    assert_int_equal(kvedge_f32_to_bf16(1.0f), 0x3F80);
    /* 1 + 2^-8 is halfway between two bf16 values: ties go to even (down). */
    assert_int_equal(kvedge_f32_to_bf16(1.0f + 0x1.0p-8f), 0x3F80);
    assert_int_equal(kvedge_f32_to_bf16(1.0f + 0x1.8p-8f), 0x3F81);
    assert_true(isnan(kvedge_bf16_to_f32(kvedge_f32_to_bf16(NAN))));
    assert_true(isinf(kvedge_bf16_to_f32(kvedge_f32_to_bf16(INFINITY))));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvedge_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(kvedge_f32_to_bf16(f), h);
    }
}

/* out[q][d] = softmax(Q K^T / sqrt(D)) V, in double. */
static void s_attention(const float *q, uint32_t nq, const float *k, const float *v, uint32_t T,
                        uint32_t D, double *out)
{
    double *w = malloc(sizeof(double) * T);
    for (uint32_t i = 0; i < nq; i++) {
        double mx = -INFINITY, sum = 0;
        for (uint32_t t = 0; t < T; t++) {
            double s = 0;
            for (uint32_t d = 0; d < D; d++)
                s += (double)q[i * D + d] * k[(size_t)t * D + d];
            w[t] = s / sqrt((double)D);
            mx = w[t] > mx ? w[t] : mx;
        }
        for (uint32_t t = 0; t < T; t++)
            sum += (w[t] = exp(w[t] - mx));
        for (uint32_t d = 0; d < D; d++) {
            double o = 0;
            for (uint32_t t = 0; t < T; t++)
                o += w[t] / sum * v[(size_t)t * D + d];
            out[i * D + d] = o;
        }
    }
    free(w);
}

typedef struct {
    double k, v, attn;
} s_errs_t;

static s_errs_t s_measure(kvedge_scheme_t scheme, uint16_t group, bool per_token_keys)
{
    enum { T = 256, D = 128, NQ = 16 };
    static float k[T * D], v[T * D], kd[T * D], vd[T * D], q[NQ * D];
    static double o_ref[NQ * D], o_q[NQ * D];
    s_errs_t e = {0, 0, 0};
    int heads = 8;
    double num = 0, den = 0;
    for (int h = 0; h < heads; h++) {
        assert_int_equal(kvedge_synth_head_f32(100 + h, 0, T, D, k, v), 0);
        kvedge_rng_t r;
        kvedge_rng_seed(&r, 900 + h);
        for (int i = 0; i < NQ * D; i++)
            q[i] = kvedge_rng_normal(&r);
        if (per_token_keys) {
            /* Keys quantized like values (per token): what KIVI shows is wrong for keys. */
            uint16_t params[T * D * 2];
            uint8_t codes[T * D];
            float sc[D], mn[D];
            unsigned bits = scheme == KVEDGE_SCHEME_INT8 ? 8 : 4;
            assert_int_equal(
                kvedge_quant_values(KVEDGE_DTYPE_FP32, k, T, D, group, bits, params, codes), 0);
            for (uint32_t t = 0; t < T; t++) {
                kvedge_quant_params_expand_grouped(
                    params + (size_t)t * kvedge_quant_groups(D, group) * 2, D, group, sc, mn);
                kvedge_dequant_row(codes + t * kvedge_quant_row_bytes(D, bits), bits, D, sc, mn,
                                   kd + (size_t)t * D);
            }
            memcpy(vd, v, sizeof v);
        } else {
            kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP32, scheme, T, D, group, NULL, false};
            static uint8_t blk[T * D * 8 + 4096];
            size_t len;
            kvedge_block_info_t info;
            assert_int_equal(kvedge_block_encode(&spec, k, v, blk, sizeof blk, &len), 0);
            assert_int_equal(kvedge_block_parse(blk, len, &info), 0);
            assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, kd, vd), 0);
        }
        e.k += kt_rel_err(k, kd, T * D) / heads;
        e.v += kt_rel_err(v, vd, T * D) / heads;
        s_attention(q, NQ, k, v, T, D, o_ref);
        s_attention(q, NQ, kd, vd, T, D, o_q);
        for (int i = 0; i < NQ * D; i++) {
            num += (o_ref[i] - o_q[i]) * (o_ref[i] - o_q[i]);
            den += o_ref[i] * o_ref[i];
        }
    }
    e.attn = sqrt(num / den);
    return e;
}

static void test_int8_error_bounds(void **state)
{
    (void)state;
    s_errs_t e = s_measure(KVEDGE_SCHEME_INT8, 0, false);
    print_message("int8: rel err K %.5f V %.5f attention %.5f\n", e.k, e.v, e.attn);
    assert_true(e.k < INT8_MAX_REL_ERR_KV);
    assert_true(e.v < INT8_MAX_REL_ERR_KV);
    assert_true(e.attn < INT8_MAX_REL_ERR_ATTN);
    assert_true(e.k > 0 && e.attn > 0); /* it is lossy: a zero here means nothing was measured */
}

static void test_int4_error_bounds(void **state)
{
    (void)state;
    s_errs_t e = s_measure(KVEDGE_SCHEME_INT4, KVEDGE_BLOCK_INT4_GROUP_DEFAULT, false);
    print_message("int4 g32: rel err K %.5f V %.5f attention %.5f\n", e.k, e.v, e.attn);
    assert_true(e.k < INT4_MAX_REL_ERR_KV);
    assert_true(e.v < INT4_MAX_REL_ERR_KV);
    assert_true(e.attn < INT4_MAX_REL_ERR_ATTN);
    /* Per-channel keys are the point of KIVI: per-token keys with outlier channels do worse. */
    s_errs_t naive = s_measure(KVEDGE_SCHEME_INT4, KVEDGE_BLOCK_INT4_GROUP_DEFAULT, true);
    print_message("int4 per-token keys: rel err K %.5f attention %.5f\n", naive.k, naive.attn);
    assert_true(e.k < naive.k);
}

/* Encodes and decodes with the SIMD kernels and with the generic loops: blocks and decoded
 * values must be bit-identical (the kernels do the same IEEE operations). */
static void test_simd_matches_generic(void **state)
{
    (void)state;
    if (!kvedge_quant_simd(-1))
        skip(); /* no AVX2 + F16C here: only the generic path exists */
    /* Shapes with vector tails: odd kept-channel counts and head_dims not a multiple of 32. */
    static const struct {
        uint32_t tokens, head_dim, keep;
    } shapes[] = {{77, 128, 96}, {33, 100, 75}, {5, 7, 3}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const uint32_t T = shapes[sh].tokens, D = shapes[sh].head_dim;
        const size_t n = (size_t)T * D;
        uint16_t *k = malloc(n * 2), *v = malloc(n * 2), *ko[2], *vo[2];
        uint8_t *blk[2], mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8];
        float *kf = malloc(n * 4), *vf = malloc(n * 4);
        for (int i = 0; i < 2; i++) {
            ko[i] = malloc(n * 2);
            vo[i] = malloc(n * 2);
            blk[i] = malloc(n * 8 + 4096);
        }
        assert_int_equal(kvedge_synth_head_f32(5 + sh, 0, T, D, kf, vf), 0);
        kvedge_synth_key_mask(kf, T, D, shapes[sh].keep, mask);
        for (int s = KVEDGE_SCHEME_INT8; s <= KVEDGE_SCHEME_INT4; s++)
            for (int masked = 0; masked < 2; masked++)
                for (int d = KVEDGE_DTYPE_FP16; d <= KVEDGE_DTYPE_BF16; d++) {
                    kvedge_convert_from_f32(d, kf, n, k);
                    kvedge_convert_from_f32(d, vf, n, v);
                    kvedge_block_spec_t spec = {(kvedge_dtype_t)d,
                                                (kvedge_scheme_t)s,
                                                T,
                                                (uint16_t)D,
                                                32,
                                                masked ? mask : NULL,
                                                false};
                    size_t len[2];
                    for (int path = 0; path < 2; path++) {
                        kvedge_quant_simd(path == 0 ? 1 : 0);
                        kvedge_block_info_t info;
                        assert_int_equal(
                            kvedge_block_encode(&spec, k, v, blk[path], n * 8 + 4096, &len[path]),
                            0);
                        assert_int_equal(kvedge_block_parse(blk[path], len[path], &info), 0);
                        assert_int_equal(kvedge_block_decode(&info, spec.dtype, ko[path], vo[path]),
                                         0);
                    }
                    kvedge_quant_simd(1);
                    assert_int_equal(len[0], len[1]);
                    assert_memory_equal(blk[0], blk[1], len[0]);
                    assert_memory_equal(ko[0], ko[1], n * 2);
                    assert_memory_equal(vo[0], vo[1], n * 2);
                }
        for (int i = 0; i < 2; i++) {
            free(ko[i]);
            free(vo[i]);
            free(blk[i]);
        }
        free(k);
        free(v);
        free(kf);
        free(vf);
    }
    /* Plain conversions too, over every half value. */
    static uint16_t all[65536], back[2][65536];
    static float f[2][65536];
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    for (int path = 0; path < 2; path++) {
        kvedge_quant_simd(path == 0 ? 1 : 0);
        kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, all, 65536, f[path]);
        kvedge_convert_from_f32(KVEDGE_DTYPE_FP16, f[path], 65536, back[path]);
    }
    kvedge_quant_simd(1);
    assert_memory_equal(f[0], f[1], sizeof f[0]);
    assert_memory_equal(back[0], back[1], sizeof back[0]);
}

/* Adversarial fills for the SIMD-against-generic sweep: what tends to break a vector kernel
 * (tails, signed zeros, subnormals, constants, specials, out-of-range values). */
enum { S_FILL_KINDS = 12 };
static void s_fill(kvedge_rng_t *r, int kind, float *f, size_t n, uint32_t D)
{
    for (size_t i = 0; i < n; i++) {
        float x = kvedge_rng_normal(r);
        switch (kind) {
        case 0: /* outlier channels with offsets */
            x = (i % D) % 7 == 0 ? 8.0f * x + 3.0f : x;
            break;
        case 1: /* only signed zeros */
            x = (kvedge_rng_next(r) & 1) ? 0.0f : -0.0f;
            break;
        case 2: /* ranges that start or end at a signed zero */
            x = (kvedge_rng_next(r) % 4 == 0) ? ((kvedge_rng_next(r) & 1) ? 0.0f : -0.0f)
                                              : ((kvedge_rng_next(r) & 1) ? fabsf(x) : -fabsf(x));
            if (i % D < D / 2)
                x = fabsf(x);
            break;
        case 3: /* a constant */
            x = 1.5f;
            break;
        case 4: /* constant rows */
            x = 0.25f * (float)(i / D);
            break;
        case 5: /* fp16 subnormals */
            x *= 1e-6f;
            break;
        case 6: /* fp32 denormals: zeros of both signs once in 16 bits */
            x *= 1e-40f;
            break;
        case 7: /* near the fp16 limit, and a range fp16 cannot hold */
            x = (kvedge_rng_next(r) & 1) ? 65504.0f - (float)(i % 64) : -65504.0f;
            break;
        case 8: /* too large for fp16 params */
            x *= 1e6f;
            break;
        default:
            break;
        }
        f[i] = x;
    }
    /* One special value in some fills: the encoder must refuse them on both paths. */
    static const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f};
    if (kind >= 9)
        f[kvedge_rng_next(r) % n] = specials[kind - 9];
}

/* kvedge_quant_keys and kvedge_quant_values with the SIMD kernels and with the generic loops
 * give the same return code and, on success, the same bytes, over odd shapes, every dtype,
 * group sizes around the vector width, pruned and full keys, and adversarial inputs. */
static void test_simd_matches_generic_adversarial(void **state)
{
    (void)state;
    if (!kvedge_quant_simd(-1))
        skip();
    static const uint32_t tokens[] = {1, 3, 31, 77}, dims[] = {1, 7, 17, 100, 128, 129};
    static const uint32_t groups[] = {0, 1, 7, 8, 32, 33};
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 77);
    const size_t max_n = 77 * 129;
    float *f = malloc(max_n * 4);
    void *x = malloc(max_n * 4);
    uint16_t *p[2];
    uint8_t *c[2];
    for (int i = 0; i < 2; i++) {
        p[i] = malloc(max_n * 4);
        c[i] = malloc(max_n);
    }
    unsigned combo = 0, refused = 0, accepted = 0;
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t di = 0; di < 6; di++)
            for (size_t gi = 0; gi < 6; gi++)
                for (unsigned bits = 4; bits <= 8; bits += 4)
                    for (int dt = KVEDGE_DTYPE_FP16; dt <= KVEDGE_DTYPE_FP32; dt++, combo++) {
                        const uint32_t T = tokens[ti], D = dims[di], G = groups[gi];
                        const size_t n = (size_t)T * D;
                        s_fill(&r, (int)(combo % S_FILL_KINDS), f, n, D);
                        if (dt == KVEDGE_DTYPE_FP32)
                            memcpy(x, f, n * 4);
                        else
                            kvedge_convert_from_f32(dt, f, n, x);
                        uint16_t kept[KVEDGE_BLOCK_MAX_HEAD_DIM];
                        uint32_t C = 0;
                        const bool masked = (combo / S_FILL_KINDS) % 2 == 1 && D > 1;
                        for (uint32_t ch = 0; ch < D; ch++)
                            if (!masked || kvedge_rng_next(&r) % 4 != 0)
                                kept[C++] = (uint16_t)ch;
                        if (C == 0)
                            kept[C++] = 0;
                        for (int which = 0; which < 2; which++) {
                            const size_t np = which == 0
                                                  ? (size_t)kvedge_quant_groups(T, G) * C * 4
                                                  : (size_t)T * kvedge_quant_groups(D, G) * 4;
                            const size_t nc =
                                (size_t)T * kvedge_quant_row_bytes(which == 0 ? C : D, bits);
                            int rc[2];
                            for (int path = 0; path < 2; path++) {
                                kvedge_quant_simd(path == 0 ? 1 : 0);
                                rc[path] = which == 0 ? kvedge_quant_keys(dt, x, T, D,
                                                                          masked ? kept : NULL, C,
                                                                          G, bits, p[path], c[path])
                                                      : kvedge_quant_values(dt, x, T, D, G, bits,
                                                                            p[path], c[path]);
                            }
                            kvedge_quant_simd(1);
                            if (rc[0] != rc[1])
                                fail_msg("%s T=%u D=%u G=%u bits=%u dtype=%d fill=%u: rc %d vs %d",
                                         which ? "values" : "keys", T, D, G, bits, dt,
                                         combo % S_FILL_KINDS, rc[0], rc[1]);
                            if (rc[0] != KVEDGE_OK) {
                                refused++;
                                continue;
                            }
                            accepted++;
                            assert_memory_equal(p[0], p[1], np);
                            assert_memory_equal(c[0], c[1], nc);
                        }
                    }
    /* Both outcomes were exercised. */
    assert_true(refused > 50 && accepted > 500);
    for (int i = 0; i < 2; i++) {
        free(p[i]);
        free(c[i]);
    }
    free(f);
    free(x);
}

/* Where a range ends at zero, the sign of the zero kept is the first met (in token order for a
 * key channel, channel order for a value group), on both paths. */
static void test_signed_zero_ranges(void **state)
{
    (void)state;
    enum { T = 4, D = 40 };
    float x[T * D];
    for (int path = 0; path < 2; path++) {
        kvedge_quant_simd(path == 0 ? 1 : 0);
        for (int first_negative = 0; first_negative < 2; first_negative++) {
            const float z0 = first_negative ? -0.0f : 0.0f, z1 = first_negative ? 0.0f : -0.0f;
            for (int i = 0; i < T * D; i++)
                x[i] = (float)(1 + i % 5);
            /* Every value row: zeros of both signs late in the row, the first at channel 20. */
            for (int t = 0; t < T; t++) {
                x[t * D + 20] = z0;
                x[t * D + 33] = z1;
                x[t * D + 39] = z1;
            }
            uint16_t params[T * D * 2];
            uint8_t codes[T * D];
            assert_int_equal(kvedge_quant_values(KVEDGE_DTYPE_FP32, x, T, D, 0, 8, params, codes),
                             0);
            for (int t = 0; t < T; t++)
                assert_int_equal(params[2 * t + 1], first_negative ? 0x8000 : 0x0000);
            /* Every key channel: a zero of each sign, the first in token 1. */
            for (int i = 0; i < T * D; i++)
                x[i] = (float)(1 + i % 3);
            for (int ch = 0; ch < D; ch++) {
                x[1 * D + ch] = z0;
                x[3 * D + ch] = z1;
            }
            assert_int_equal(
                kvedge_quant_keys(KVEDGE_DTYPE_FP32, x, T, D, NULL, D, 0, 8, params, codes), 0);
            for (int ch = 0; ch < D; ch++)
                assert_int_equal(params[2 * ch + 1], first_negative ? 0x8000 : 0x0000);
        }
    }
    kvedge_quant_simd(1);
}

static void test_quant_argument_errors(void **state)
{
    (void)state;
    float x[4] = {0, 1, 2, 3};
    uint16_t p[8];
    uint8_t c[4];
    assert_int_equal(kvedge_quant_keys(KVEDGE_DTYPE_FP32, x, 2, 2, NULL, 2, 0, 5, p, c),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_quant_keys(KVEDGE_DTYPE_FP32, NULL, 2, 2, NULL, 2, 0, 8, p, c),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_quant_keys(KVEDGE_DTYPE_FP32, x, 2, 2, NULL, 1, 0, 8, p, c),
                     KVEDGE_EINVAL); /* fewer channels than head_dim needs a kept list */
    assert_int_equal(kvedge_quant_keys(7, x, 2, 2, NULL, 2, 0, 8, p, c), KVEDGE_EINVAL);
    const uint16_t out_of_range[1] = {2}; /* a kept channel past head_dim */
    assert_int_equal(kvedge_quant_keys(KVEDGE_DTYPE_FP32, x, 2, 2, out_of_range, 1, 0, 8, p, c),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_quant_values(KVEDGE_DTYPE_FP32, x, 0, 2, 0, 8, p, c), KVEDGE_EINVAL);
    assert_int_equal(kvedge_quant_keys(KVEDGE_DTYPE_FP32, x, 2, 2, NULL, 2, 0, 8, p, c), 0);
    assert_int_equal(kvedge_quant_groups(100, 32), 4);
    assert_int_equal(kvedge_quant_groups(100, 0), 1);
    assert_int_equal(kvedge_quant_row_bytes(7, 4), 4);
    assert_int_equal(kvedge_quant_row_bytes(7, 8), 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_exhaustive),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_int8_error_bounds),
        cmocka_unit_test(test_int4_error_bounds),
        cmocka_unit_test(test_simd_matches_generic),
        cmocka_unit_test(test_simd_matches_generic_adversarial),
        cmocka_unit_test(test_signed_zero_ranges),
        cmocka_unit_test(test_quant_argument_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
