/* Transform-coded K/V sections (access/codec/tcbody.h): round trips within the step on an
 * orthonormal basis, escapes, the all-zero rank, and refusal of truncated, inflated, flipped and
 * hostile sections (rANS tables that do not sum, escape counts that do not match), by the
 * decoder and by kvedge_tc_check alike. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <htscodecs/rANS_static4x16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/byteorder.h"
#include "access/codec/ecbody.h"
#include "access/codec/error.h"
#include "access/codec/half.h"
#include "access/codec/quant.h"
#include "access/codec/tcbody.h"

static uint32_t s_rng = 12345;

/* kvedge_tc_decode, and kvedge_tc_check of the same bytes, which must agree with it on every
 * section (it is the decoder's walk without the basis). */
static int s_decode(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len, const float *inv,
                    float *x)
{
    const int rc = kvedge_tc_decode(s, in, in_len, inv, x),
              checked = kvedge_tc_check(s, in, in_len);
    if (inv && x && checked != rc)
        fail_msg("kvedge_tc_check says %s, kvedge_tc_decode %s", kvedge_errname(checked),
                 kvedge_errname(rc));
    return rc;
}

static float s_uniform(void)
{
    s_rng = s_rng * 1664525u + 1013904223u;
    return (float)(s_rng >> 8) / (float)(1u << 24);
}

/* An orthonormal basis fwd [D][D] (Gram-Schmidt on random columns) and its inverse, the
 * transpose. */
static void s_basis(uint32_t D, float *fwd, float *inv)
{
    double *b = malloc((size_t)D * D * sizeof *b);
    assert_non_null(b);
    for (size_t i = 0; i < (size_t)D * D; i++)
        b[i] = s_uniform() - 0.5;
    for (uint32_t j = 0; j < D; j++) { /* column j of b */
        for (uint32_t k = 0; k < j; k++) {
            double dot = 0;
            for (uint32_t c = 0; c < D; c++)
                dot += b[(size_t)c * D + j] * b[(size_t)c * D + k];
            for (uint32_t c = 0; c < D; c++)
                b[(size_t)c * D + j] -= dot * b[(size_t)c * D + k];
        }
        double norm = 0;
        for (uint32_t c = 0; c < D; c++)
            norm += b[(size_t)c * D + j] * b[(size_t)c * D + j];
        for (uint32_t c = 0; c < D; c++)
            b[(size_t)c * D + j] /= sqrt(norm);
    }
    for (uint32_t c = 0; c < D; c++)
        for (uint32_t j = 0; j < D; j++) {
            fwd[(size_t)c * D + j] = (float)b[(size_t)c * D + j];
            inv[(size_t)j * D + c] = (float)b[(size_t)c * D + j];
        }
    free(b);
}

/* K/V-like values: a per-channel offset, a few strong directions, small noise. */
static void s_values(uint32_t T, uint32_t D, float *x)
{
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t c = 0; c < D; c++)
            x[(size_t)t * D + c] = (float)c * 0.1f - 1.0f +
                                   2.0f * sinf(0.05f * (float)t + (float)c) +
                                   0.3f * (s_uniform() - 0.5f);
}

typedef struct {
    uint32_t T, D;
    float *x, *fwd, *inv, *out;
    uint8_t *buf;
    size_t len;
} s_case_t;

static void s_case_new(s_case_t *k, uint32_t T, uint32_t D, float step)
{
    k->T = T;
    k->D = D;
    k->x = malloc((size_t)T * D * sizeof(float));
    k->out = malloc((size_t)T * D * sizeof(float));
    k->fwd = malloc((size_t)D * D * sizeof(float));
    k->inv = malloc((size_t)D * D * sizeof(float));
    const kvedge_tc_shape_t s = {T, D};
    size_t cap = kvedge_tc_bound(&s);
    assert_true(cap > 0);
    k->buf = malloc(cap);
    assert_non_null(k->x);
    assert_non_null(k->out);
    assert_non_null(k->fwd);
    assert_non_null(k->inv);
    assert_non_null(k->buf);
    s_values(T, D, k->x);
    s_basis(D, k->fwd, k->inv);
    assert_int_equal(kvedge_tc_encode(&s, k->x, k->fwd, step, k->buf, cap, &k->len), KVEDGE_OK);
    assert_true(k->len <= cap);
}

static void s_case_free(s_case_t *k)
{
    free(k->x);
    free(k->out);
    free(k->fwd);
    free(k->inv);
    free(k->buf);
}

/* Every token's error vector has norm at most sqrt(D) * step / 2 (each component within half
 * a step, the basis orthonormal), with float slack. */
static void s_assert_within_step(const s_case_t *k, float step)
{
    const float st = kvedge_fp16_to_f32(kvedge_f32_to_fp16(step));
    const double bound = sqrt((double)k->D) * st / 2 * 1.001 + 1e-4;
    for (uint32_t t = 0; t < k->T; t++) {
        double e2 = 0;
        for (uint32_t c = 0; c < k->D; c++) {
            const double d = (double)k->out[(size_t)t * k->D + c] - k->x[(size_t)t * k->D + c];
            e2 += d * d;
        }
        assert_true(sqrt(e2) <= bound);
    }
}

static void test_round_trip_within_step(void **state)
{
    (void)state;
    const uint32_t shapes[][2] = {{1, 1}, {3, 7}, {256, 32}, {17, 64}, {256, 128}};
    const float steps[] = {0.01f, 0.1f, 0.5f, 3.0f};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t j = 0; j < sizeof steps / sizeof steps[0]; j++) {
            s_case_t k;
            s_case_new(&k, shapes[i][0], shapes[i][1], steps[j]);
            const kvedge_tc_shape_t s = {k.T, k.D};
            assert_int_equal(s_decode(&s, k.buf, k.len, k.inv, k.out), KVEDGE_OK);
            s_assert_within_step(&k, steps[j]);
            s_case_free(&k);
        }
}

/* A fine step on wide values escapes most codes; a huge one codes nothing (R = 0): both
 * decode within the step. The coarser the step, the fewer the bytes. */
static void test_escapes_and_rank_zero(void **state)
{
    (void)state;
    s_case_t fine, coarse, none;
    s_case_new(&fine, 64, 16, 0.001f);
    s_case_new(&coarse, 64, 16, 0.25f);
    s_case_new(&none, 64, 16, 1000.0f);
    const size_t at = KVEDGE_TC_HEAD_BYTES + 2 * 16;
    assert_true(kvedge_le_get32(fine.buf + at + 4 + kvedge_le_get32(fine.buf + at)) > 0);
    assert_true(fine.len > coarse.len);
    assert_true(coarse.len > none.len);
    assert_int_equal(kvedge_le_get16(none.buf + 1), 0);
    assert_int_equal(none.len, KVEDGE_TC_HEAD_BYTES + 2 * 16);
    s_case_t *all[] = {&fine, &coarse, &none};
    const float steps[] = {0.001f, 0.25f, 1000.0f};
    for (int i = 0; i < 3; i++) {
        const kvedge_tc_shape_t s = {all[i]->T, all[i]->D};
        assert_int_equal(s_decode(&s, all[i]->buf, all[i]->len, all[i]->inv, all[i]->out),
                         KVEDGE_OK);
        s_assert_within_step(all[i], steps[i]);
        s_case_free(all[i]);
    }
}

/* Components of falling variance (what a KLT gives) pick the bands layout, one table per band,
 * and it decodes within the step. */
static void test_bands(void **state)
{
    (void)state;
    enum { T = 256, D = 32 };
    const kvedge_tc_shape_t s = {T, D};
    float *x = malloc(sizeof(float) * T * D), *y = malloc(sizeof(float) * T * D);
    float eye[D * D] = {0};
    uint8_t *buf = malloc(kvedge_tc_bound(&s));
    assert_non_null(x);
    assert_non_null(y);
    assert_non_null(buf);
    for (int c = 0; c < D; c++)
        eye[c * D + c] = 1;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++)
            x[t * D + c] = 8.0f * powf(0.75f, (float)c) * (s_uniform() - 0.5f);
    size_t len;
    assert_int_equal(kvedge_tc_encode(&s, x, eye, 0.05f, buf, kvedge_tc_bound(&s), &len),
                     KVEDGE_OK);
    assert_int_equal(buf[0], KVEDGE_TC_LAYOUT_BANDS);
    assert_int_equal(s_decode(&s, buf, len, eye, y), KVEDGE_OK);
    const float st = kvedge_fp16_to_f32(kvedge_f32_to_fp16(0.05f));
    for (int i = 0; i < T * D; i++)
        assert_true(fabsf(y[i] - x[i]) <= st / 2 * 1.001f + 1e-3f);
    free(buf);
    free(y);
    free(x);
}

/* The AVX2 transform (when the CPU has it) gives the generic loop's bits. */
static void test_simd_same_bits(void **state)
{
    (void)state;
    s_case_t k;
    s_case_new(&k, 256, 32, 0.02f);
    const kvedge_tc_shape_t s = {k.T, k.D};
    float *generic = malloc(sizeof(float) * k.T * k.D);
    assert_non_null(generic);
    kvedge_quant_simd(0);
    assert_int_equal(s_decode(&s, k.buf, k.len, k.inv, generic), KVEDGE_OK);
    if (!kvedge_quant_simd(1)) {
        free(generic);
        s_case_free(&k);
        skip();
    }
    assert_int_equal(s_decode(&s, k.buf, k.len, k.inv, k.out), KVEDGE_OK);
    assert_memory_equal(generic, k.out, sizeof(float) * k.T * k.D);
    free(generic);
    s_case_free(&k);
}

/* The encoder picks its layout and orders from entropy estimates; the full search
 * (kvedge_tc_encode_full, every layout at both orders, the smallest kept) is the reference. Both
 * quantize alike, so they decode to the same bits; the estimated choice costs at most 1 % more
 * bytes here (falling-variance components, K/V-like values, escapes, odd shapes), and with SIMD
 * off the encoder writes the same bytes (the AVX2 projection gives the generic one's codes). */
static void test_estimated_choice(void **state)
{
    (void)state;
    const uint32_t shapes[][2] = {{256, 32}, {256, 128}, {33, 40}, {64, 17}, {5, 3}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int kind = 0; kind < 3; kind++) {
            const uint32_t T = shapes[i][0], D = shapes[i][1];
            const kvedge_tc_shape_t s = {T, D};
            const size_t n = (size_t)T * D, cap = kvedge_tc_bound(&s);
            float *x = malloc(n * sizeof *x), *a = malloc(n * sizeof *a),
                  *b = malloc(n * sizeof *b), *fwd = malloc((size_t)D * D * sizeof *fwd),
                  *inv = malloc((size_t)D * D * sizeof *inv);
            uint8_t *fast = malloc(cap), *full = malloc(cap), *generic = malloc(cap);
            assert_true(x && a && b && fwd && inv && fast && full && generic);
            s_basis(D, fwd, inv);
            if (kind == 0)
                s_values(T, D, x);
            for (size_t k = 0; kind > 0 && k < n; k++) {
                const float spread = kind == 1 ? 8.0f * powf(0.8f, (float)(k % D)) : 20.0f;
                x[k] = spread * (s_uniform() - 0.5f);
            }
            const float step = 0.02f;
            size_t lf, lg, lw;
            assert_int_equal(kvedge_tc_encode(&s, x, fwd, step, fast, cap, &lf), KVEDGE_OK);
            assert_int_equal(kvedge_tc_encode_full(&s, x, fwd, step, full, cap, &lg), KVEDGE_OK);
            if (!((double)lf <= 1.01 * (double)lg + 8))
                fail_msg("T %u D %u kind %d: %zu vs %zu", T, D, kind, lf, lg);
            /* Rank, step and means are the same bytes; only the layout byte may differ. */
            assert_memory_equal(fast + 1, full + 1, KVEDGE_TC_HEAD_BYTES - 1 + 2u * D);
            assert_int_equal(s_decode(&s, fast, lf, inv, a), KVEDGE_OK);
            assert_int_equal(s_decode(&s, full, lg, inv, b), KVEDGE_OK);
            assert_memory_equal(a, b, n * sizeof *a);
            if (kvedge_quant_simd(-1)) {
                kvedge_quant_simd(0);
                assert_int_equal(kvedge_tc_encode(&s, x, fwd, step, generic, cap, &lw), KVEDGE_OK);
                kvedge_quant_simd(1);
                assert_int_equal(lw, lf);
                assert_memory_equal(generic, fast, lf);
            }
            free(x);
            free(a);
            free(b);
            free(fwd);
            free(inv);
            free(fast);
            free(full);
            free(generic);
        }
}

/* The codes are those of the scalar projection the codec has always made (y[j] summed over c
 * in order, one mul and one add per term, then floor(y / step + 0.5)), whatever the vector
 * blocking: decoded with the identity as inverse, every value is m[c] + q[t][c] * step of the
 * reference's q. Widths with and without a tail past the 32-component blocks, odd token
 * counts, SIMD on and off. */
static void test_codes_match_scalar_reference(void **state)
{
    (void)state;
    const uint32_t shapes[][2] = {{64, 64}, {33, 40}, {7, 96}, {5, 3}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int simd = 0; simd < 2; simd++) {
            const uint32_t T = shapes[i][0], D = shapes[i][1];
            const kvedge_tc_shape_t s = {T, D};
            const size_t n = (size_t)T * D, cap = kvedge_tc_bound(&s);
            float *x = malloc(n * sizeof *x), *out = malloc(n * sizeof *out),
                  *fwd = malloc((size_t)D * D * sizeof *fwd),
                  *inv = malloc((size_t)D * D * sizeof *inv),
                  *eye = calloc((size_t)D * D, sizeof *eye), *m = malloc(D * sizeof *m);
            uint8_t *buf = malloc(cap);
            assert_true(x && out && fwd && inv && eye && m && buf);
            s_basis(D, fwd, inv);
            s_values(T, D, x);
            for (uint32_t c = 0; c < D; c++)
                eye[(size_t)c * D + c] = 1.0f;
            const float step = 0.03f, st = kvedge_fp16_to_f32(kvedge_f32_to_fp16(step));
            kvedge_quant_simd(simd);
            size_t len;
            assert_int_equal(kvedge_tc_encode(&s, x, fwd, step, buf, cap, &len), KVEDGE_OK);
            kvedge_quant_simd(1);
            assert_int_equal(s_decode(&s, buf, len, eye, out), KVEDGE_OK);
            for (uint32_t c = 0; c < D; c++) {
                double sum = 0;
                for (uint32_t t = 0; t < T; t++)
                    sum += x[(size_t)t * D + c];
                m[c] = kvedge_fp16_to_f32(kvedge_f32_to_fp16((float)(sum / T)));
            }
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t j = 0; j < D; j++) {
                    float y = 0.0f;
                    for (uint32_t c = 0; c < D; c++) {
                        const float d = x[(size_t)t * D + c] - m[c];
                        const float p = d * fwd[(size_t)c * D + j];
                        y = y + p;
                    }
                    const float q = floorf(y * (1.0f / st) + 0.5f);
                    const float want = m[j] + q * st;
                    if (!(out[(size_t)t * D + j] == want))
                        fail_msg("T %u D %u simd %d: t %u j %u: %g, the reference %g", T, D, simd,
                                 t, j, (double)out[(size_t)t * D + j], (double)want);
                }
            free(x);
            free(out);
            free(fwd);
            free(inv);
            free(eye);
            free(m);
            free(buf);
        }
}

/* The AVX2 transform gives the generic loop's bits at widths that are and are not a multiple
 * of its 32-channel blocks. */
static void test_simd_same_bits_odd_dims(void **state)
{
    (void)state;
    const uint32_t dims[] = {1, 17, 40, 100, 128};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        s_case_t k;
        s_case_new(&k, 70, dims[i], 0.02f);
        const kvedge_tc_shape_t s = {k.T, k.D};
        float *generic = malloc(sizeof(float) * k.T * k.D);
        assert_non_null(generic);
        kvedge_quant_simd(0);
        assert_int_equal(s_decode(&s, k.buf, k.len, k.inv, generic), KVEDGE_OK);
        const int simd = kvedge_quant_simd(1);
        assert_int_equal(s_decode(&s, k.buf, k.len, k.inv, k.out), KVEDGE_OK);
        if (simd)
            assert_memory_equal(generic, k.out, sizeof(float) * k.T * k.D);
        s_assert_within_step(&k, 0.02f);
        free(generic);
        s_case_free(&k);
    }
}

static void test_encode_errors(void **state)
{
    (void)state;
    float x[8] = {0}, fwd[4] = {1, 0, 0, 1};
    uint8_t out[256];
    size_t len;
    const kvedge_tc_shape_t s = {4, 2}, bad = {0, 2}, wide = {4, 2000};
    assert_int_equal(kvedge_tc_encode(&bad, x, fwd, 1, out, sizeof out, &len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tc_bound(&bad), 0);
    assert_int_equal(kvedge_tc_bound(&wide), 0);
    assert_int_equal(kvedge_tc_encode(&s, NULL, fwd, 1, out, sizeof out, &len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tc_encode(&s, x, fwd, 0, out, sizeof out, &len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tc_encode(&s, x, fwd, -1, out, sizeof out, &len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tc_encode(&s, x, fwd, NAN, out, sizeof out, &len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tc_encode(&s, x, fwd, 1e-9f, out, sizeof out, &len), KVEDGE_EINVAL);
    x[3] = NAN;
    assert_int_equal(kvedge_tc_encode(&s, x, fwd, 1, out, sizeof out, &len), KVEDGE_EINVAL);
    /* A code beyond an escape's int16. */
    x[3] = 0;
    x[0] = 1e6f;
    assert_int_equal(kvedge_tc_encode(&s, x, fwd, 0.01f, out, sizeof out, &len), KVEDGE_EINVAL);
    x[0] = 5;
    assert_int_equal(kvedge_tc_encode(&s, x, fwd, 0.01f, out, 8, &len), KVEDGE_ENOSPACE);
    assert_int_equal(kvedge_tc_encode(&s, x, fwd, 0.01f, out, sizeof out, &len), KVEDGE_OK);
    float y[8];
    assert_int_equal(s_decode(&s, out, len, fwd, y), KVEDGE_OK);
    assert_int_equal(s_decode(&bad, out, len, fwd, y), KVEDGE_EINVAL);
    assert_int_equal(s_decode(&s, out, len, NULL, y), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tc_check(&bad, out, len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tc_check(&s, NULL, len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tc_check(NULL, out, len), KVEDGE_EINVAL);
}

/* Every shorter length and a longer buffer are refused; so is a section read with the wrong
 * shape. */
static void test_truncated_and_inflated(void **state)
{
    (void)state;
    s_case_t k;
    s_case_new(&k, 64, 32, 0.05f);
    const kvedge_tc_shape_t s = {k.T, k.D};
    for (size_t n = 0; n < k.len; n++)
        assert_int_equal(s_decode(&s, k.buf, n, k.inv, k.out), KVEDGE_ECORRUPT);
    uint8_t *big = malloc(k.len + 1);
    assert_non_null(big);
    memcpy(big, k.buf, k.len);
    big[k.len] = 0;
    assert_int_equal(s_decode(&s, big, k.len + 1, k.inv, k.out), KVEDGE_ECORRUPT);
    const kvedge_tc_shape_t more = {65, 32}, fewer = {64, 31};
    assert_int_equal(s_decode(&more, k.buf, k.len, k.inv, k.out), KVEDGE_ECORRUPT);
    assert_int_equal(s_decode(&fewer, k.buf, k.len, k.inv, k.out), KVEDGE_ECORRUPT);
    free(big);
    s_case_free(&k);
}

/* Any single flipped byte gives OK or ECORRUPT, never a crash or an out-of-bounds access (the
 * ASan build checks the latter). */
static void test_every_byte_flipped(void **state)
{
    (void)state;
    s_case_t k;
    s_case_new(&k, 33, 16, 0.02f);
    const kvedge_tc_shape_t s = {k.T, k.D};
    uint8_t *copy = malloc(k.len);
    assert_non_null(copy);
    for (size_t i = 0; i < k.len; i++)
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(copy, k.buf, k.len);
            copy[i] ^= (uint8_t)(1u << bit);
            int rc = s_decode(&s, copy, k.len, k.inv, k.out);
            assert_true(rc == KVEDGE_OK || rc == KVEDGE_ECORRUPT);
        }
    free(copy);
    s_case_free(&k);
}

/* Hand-made sections: header fields out of range, a stream whose frequency table does not sum
 * to the total, an escape count or value that does not match. */
static void test_hostile_sections(void **state)
{
    (void)state;
    enum { T = 64, D = 2 };
    const kvedge_tc_shape_t s = {T, D};
    const float inv[D * D] = {1, 0, 0, 1};
    float out[T * D];
    uint8_t buf[512];
    /* Rank 0: header and means only. */
    memset(buf, 0, sizeof buf);
    kvedge_le_put16(buf + 3, kvedge_f32_to_fp16(1.0f));
    assert_int_equal(s_decode(&s, buf, KVEDGE_TC_HEAD_BYTES + 2 * D, inv, out), KVEDGE_OK);
    buf[0] = KVEDGE_TC_LAYOUT_MAX + 1; /* unknown layout */
    assert_int_equal(s_decode(&s, buf, KVEDGE_TC_HEAD_BYTES + 2 * D, inv, out), KVEDGE_ECORRUPT);
    buf[0] = 0;
    kvedge_le_put16(buf + 1, D + 1); /* R > D */
    assert_int_equal(s_decode(&s, buf, KVEDGE_TC_HEAD_BYTES + 2 * D, inv, out), KVEDGE_ECORRUPT);
    kvedge_le_put16(buf + 1, 0);
    const uint16_t bad_steps[] = {0x0000, 0x8000 | 0x3C00, 0x7C00, 0x7E00};
    for (size_t i = 0; i < 4; i++) {
        kvedge_le_put16(buf + 3, bad_steps[i]);
        assert_int_equal(s_decode(&s, buf, KVEDGE_TC_HEAD_BYTES + 2 * D, inv, out),
                         KVEDGE_ECORRUPT);
    }
    kvedge_le_put16(buf + 3, kvedge_f32_to_fp16(1.0f));
    kvedge_le_put16(buf + KVEDGE_TC_HEAD_BYTES, 0x7C00); /* an infinite mean */
    assert_int_equal(s_decode(&s, buf, KVEDGE_TC_HEAD_BYTES + 2 * D, inv, out), KVEDGE_ECORRUPT);
    kvedge_le_put16(buf + KVEDGE_TC_HEAD_BYTES, 0);

    /* Rank 2 with one escape: symbols 0, 1, 2 over and over and one 255, then the escaped code
     * 200. */
    uint8_t sym[T * D];
    for (int i = 0; i < T * D; i++)
        sym[i] = (uint8_t)(i % 3);
    sym[5] = KVEDGE_TC_ESCAPE;
    uint8_t *st;
    unsigned n;
    assert_int_equal(kvedge_ec_stream_encode(sym, T * D, 0, &st, &n), KVEDGE_OK);
    const size_t at = KVEDGE_TC_HEAD_BYTES + 2 * D;
    kvedge_le_put16(buf + 1, D);
    kvedge_le_put32(buf + at, n);
    memcpy(buf + at + 4, st, n);
    kvedge_le_put32(buf + at + 4 + n, 1);
    kvedge_le_put16(buf + at + 8 + n, 200);
    const size_t len = at + 10 + n;
    assert_int_equal(s_decode(&s, buf, len, inv, out), KVEDGE_OK);
    assert_true(out[5] == 200.0f);
    assert_true(out[6] == 0.0f);
    assert_true(out[7] == -1.0f); /* symbol 1: zigzag 1 is -1 */
    /* The same stream read as bands (two streams at D = 2: components [0, 1) and [1, 2)). */
    buf[0] = KVEDGE_TC_LAYOUT_BANDS;
    assert_int_equal(s_decode(&s, buf, len, inv, out), KVEDGE_ECORRUPT);
    buf[0] = KVEDGE_TC_LAYOUT_TOKEN;
    /* An escape holding a code that needs none, a count that does not match. */
    kvedge_le_put16(buf + at + 8 + n, 3);
    assert_int_equal(s_decode(&s, buf, len, inv, out), KVEDGE_ECORRUPT);
    kvedge_le_put16(buf + at + 8 + n, 200);
    kvedge_le_put32(buf + at + 4 + n, 2);
    assert_int_equal(s_decode(&s, buf, len, inv, out), KVEDGE_ECORRUPT);
    kvedge_le_put32(buf + at + 4 + n, 1);
    /* A stream length past the end, and zero. */
    kvedge_le_put32(buf + at, (uint32_t)len);
    assert_int_equal(s_decode(&s, buf, len, inv, out), KVEDGE_ECORRUPT);
    kvedge_le_put32(buf + at, 0);
    assert_int_equal(s_decode(&s, buf, len, inv, out), KVEDGE_ECORRUPT);
    kvedge_le_put32(buf + at, n);
    /* The order-0 frequency table: after the flags byte and the length (a 7-bit varint), the
     * symbols present and their frequencies, which must sum to the total (htscodecs normalizes
     * to 4096). Raising every frequency byte breaks the sum; the stream must be refused. */
    assert_int_equal(buf[at + 4] & 0xE1u, 0); /* order 0, not stored (CAT), no PACK or RLE */
    int refused = 0;
    for (unsigned i = 2; i < n && i < 40; i++) {
        uint8_t keep = buf[at + 4 + i];
        buf[at + 4 + i] = (uint8_t)(keep + 0x40);
        int rc = s_decode(&s, buf, len, inv, out);
        assert_true(rc == KVEDGE_OK || rc == KVEDGE_ECORRUPT);
        refused += rc == KVEDGE_ECORRUPT;
        buf[at + 4 + i] = keep;
    }
    assert_true(refused > 0);
    assert_int_equal(s_decode(&s, buf, len, inv, out), KVEDGE_OK);
    free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_within_step),
        cmocka_unit_test(test_escapes_and_rank_zero),
        cmocka_unit_test(test_bands),
        cmocka_unit_test(test_simd_same_bits),
        cmocka_unit_test(test_estimated_choice),
        cmocka_unit_test(test_codes_match_scalar_reference),
        cmocka_unit_test(test_simd_same_bits_odd_dims),
        cmocka_unit_test(test_encode_errors),
        cmocka_unit_test(test_truncated_and_inflated),
        cmocka_unit_test(test_every_byte_flipped),
        cmocka_unit_test(test_hostile_sections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
