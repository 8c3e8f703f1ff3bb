/* CPU reference of kvedge's asymmetric quantization, written as flat loops the compiler
 * vectorizes (see KVEDGE_VECTOR_CLONES). */
#include "store/quant.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "store/block.h"
#include "store/error.h"
#include "store/half.h"

#include <stdatomic.h>
#include <stdbool.h>

/* Explicit AVX2 + F16C kernels for the hot loops: GCC 12 does not vectorize _Float16
 * conversions or float min/max reductions by itself. Chosen at run time from CPUID, so one
 * binary runs everywhere. They do exactly the IEEE operations of the generic C loops (mul then
 * add, never fused: the codec builds with -ffp-contract=off), so both paths give identical
 * bits; tests/store/test_quant.c checks that. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define S_HAVE_AVX2 1
#define S_AVX2      __attribute__((target("avx2,f16c")))
#else
#define S_HAVE_AVX2 0
#endif

static atomic_int s_simd = -1; /* -1 unknown, 0 generic, 1 AVX2 + F16C */

static bool s_avx2(void)
{
    int v = atomic_load_explicit(&s_simd, memory_order_relaxed);
    if (v < 0) {
#if S_HAVE_AVX2
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
        v = 0;
#endif
        atomic_store_explicit(&s_simd, v, memory_order_relaxed);
    }
    return v == 1;
}

int kvedge_quant_simd(int enable)
{
    if (enable == 0)
        atomic_store_explicit(&s_simd, 0, memory_order_relaxed);
    else if (enable > 0)
        atomic_store_explicit(&s_simd, -1, memory_order_relaxed);
    return s_avx2();
}

#if S_HAVE_AVX2
S_AVX2 static void s_avx2_f32_to_fp16(const float *s, size_t n, uint16_t *d)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        d[i] = kvedge_f32_to_fp16(s[i]);
}

S_AVX2 static void s_avx2_fp16_to_f32(const uint16_t *s, size_t n, float *d)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        d[i] = kvedge_fp16_to_f32(s[i]);
}

S_AVX2 static void s_avx2_dequant_u8(const uint8_t *c, uint32_t n, const float *scale,
                                     const float *min, float *out)
{
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 q =
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + i))));
        __m256 v =
            _mm256_add_ps(_mm256_mul_ps(q, _mm256_loadu_ps(scale + i)), _mm256_loadu_ps(min + i));
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; i++)
        out[i] = (float)c[i] * scale[i] + min[i];
}

/* Dequantize straight to fp16: per-element params (keys) or one (scale, min) pair (a group of
 * a value row). Same arithmetic as s_avx2_dequant_u8 followed by s_avx2_f32_to_fp16. */
S_AVX2 static void s_avx2_dequant_u8_fp16(const uint8_t *c, uint32_t n, const float *scale,
                                          const float *min, uint16_t *out)
{
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 q =
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + i))));
        __m256 v =
            _mm256_add_ps(_mm256_mul_ps(q, _mm256_loadu_ps(scale + i)), _mm256_loadu_ps(min + i));
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        out[i] = kvedge_f32_to_fp16((float)c[i] * scale[i] + min[i]);
}

S_AVX2 static void s_avx2_dequant_u8_bcast_fp16(const uint8_t *c, uint32_t n, float scale,
                                                float min, uint16_t *out)
{
    const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(min);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 q =
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + i))));
        _mm_storeu_si128(
            (__m128i *)(out + i),
            _mm256_cvtps_ph(_mm256_add_ps(_mm256_mul_ps(q, vs), vm), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        out[i] = kvedge_f32_to_fp16((float)c[i] * scale + min);
}

/* s_make_params over 8 groups at a time; returns the number of groups done (a multiple of 8),
 * or -1 if one of them is out of range. */
S_AVX2 static int64_t s_avx2_make_params(const float *lo, const float *hi, uint32_t n,
                                         unsigned qmax, uint16_t *pairs, float *scale, float *inv,
                                         float *min)
{
    const __m256 q = _mm256_set1_ps((float)qmax), big = _mm256_set1_ps(FLT_MAX),
                 nbig = _mm256_set1_ps(-FLT_MAX), zero = _mm256_setzero_ps(),
                 one = _mm256_set1_ps(1.0f);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 l = _mm256_loadu_ps(lo + i), h = _mm256_loadu_ps(hi + i);
        __m256 ok =
            _mm256_and_ps(_mm256_cmp_ps(l, nbig, _CMP_GE_OQ), _mm256_cmp_ps(h, big, _CMP_LE_OQ));
        __m128i s16 =
            _mm256_cvtps_ph(_mm256_div_ps(_mm256_sub_ps(h, l), q), _MM_FROUND_TO_NEAREST_INT);
        __m128i m16 = _mm256_cvtps_ph(l, _MM_FROUND_TO_NEAREST_INT);
        __m256 sf = _mm256_cvtph_ps(s16), mf = _mm256_cvtph_ps(m16);
        ok = _mm256_and_ps(ok, _mm256_and_ps(_mm256_cmp_ps(sf, big, _CMP_LE_OQ),
                                             _mm256_cmp_ps(mf, big, _CMP_LE_OQ)));
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(mf, nbig, _CMP_GE_OQ));
        if (_mm256_movemask_ps(ok) != 0xFF)
            return -1;
        __m256 iv = _mm256_and_ps(_mm256_div_ps(one, sf), _mm256_cmp_ps(sf, zero, _CMP_GT_OQ));
        _mm_storeu_si128((__m128i *)(pairs + 2 * i), _mm_unpacklo_epi16(s16, m16));
        _mm_storeu_si128((__m128i *)(pairs + 2 * i + 8), _mm_unpackhi_epi16(s16, m16));
        _mm256_storeu_ps(scale + i, sf);
        _mm256_storeu_ps(inv + i, iv);
        _mm256_storeu_ps(min + i, mf);
    }
    return i;
}

/* Min and max of x[0..n); returns false if some value is infinite or NaN. */
S_AVX2 static bool s_avx2_minmax(const float *x, uint32_t n, float *lo, float *hi)
{
    float l = x[0], h = x[0], bad = 0.0f;
    uint32_t i = 0;
    if (n >= 8) {
        __m256 vl = _mm256_loadu_ps(x), vh = vl, vb = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            vl = _mm256_min_ps(vl, v);
            vh = _mm256_max_ps(vh, v);
            vb = _mm256_add_ps(vb, _mm256_sub_ps(v, v));
        }
        float tl[8], th[8], tb[8];
        _mm256_storeu_ps(tl, vl);
        _mm256_storeu_ps(th, vh);
        _mm256_storeu_ps(tb, vb);
        for (int j = 0; j < 8; j++) {
            l = tl[j] < l ? tl[j] : l;
            h = th[j] > h ? th[j] : h;
            bad += tb[j];
        }
    }
    for (; i < n; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
        bad += x[i] - x[i];
    }
    *lo = l;
    *hi = h;
    return bad == 0.0f;
}

S_AVX2 static void s_avx2_quantize_row(const float *x, uint32_t n, const float *inv,
                                       const float *min, float qmax, uint8_t *q)
{
    const __m256 half = _mm256_set1_ps(0.5f), zero = _mm256_setzero_ps(),
                 top = _mm256_set1_ps(qmax);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i w[4];
        for (int j = 0; j < 4; j++) {
            uint32_t o = i + 8 * (uint32_t)j;
            __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + o), _mm256_loadu_ps(min + o));
            v = _mm256_add_ps(_mm256_mul_ps(v, _mm256_loadu_ps(inv + o)), half);
            v = _mm256_min_ps(_mm256_max_ps(v, zero), top);
            w[j] = _mm256_cvttps_epi32(v);
        }
        __m256i b =
            _mm256_packus_epi16(_mm256_packs_epi32(w[0], w[1]), _mm256_packs_epi32(w[2], w[3]));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(b, order));
    }
    for (; i < n; i++) {
        float v = (x[i] - min[i]) * inv[i] + 0.5f;
        v = v < 0.0f ? 0.0f : v;
        v = v > qmax ? qmax : v;
        q[i] = (uint8_t)(int)v;
    }
}
#endif

/* Turns a group's float range into fp16 params and the float values quantization must use,
 * so that encode and decode agree on the rounded params. */
static int s_make_params(float lo, float hi, unsigned qmax, uint16_t *pair, float *scale,
                         float *inv, float *min)
{
    if (!(lo >= -FLT_MAX && hi <= FLT_MAX)) /* also false for NaN */
        return KVEDGE_EINVAL;
    uint16_t s16 = kvedge_f32_to_fp16((hi - lo) / (float)qmax);
    uint16_t m16 = kvedge_f32_to_fp16(lo);
    float s = kvedge_fp16_to_f32(s16);
    float m = kvedge_fp16_to_f32(m16);
    if (!isfinite(s) || !isfinite(m))
        return KVEDGE_EINVAL;
    pair[0] = s16;
    pair[1] = m16;
    *scale = s;
    *inv = s > 0.0f ? 1.0f / s : 0.0f;
    *min = m;
    return KVEDGE_OK;
}

/* s_make_params for n groups: pairs[2n], scale/inv/min[n]. */
static int s_make_params_n(const float *lo, const float *hi, uint32_t n, unsigned qmax,
                           uint16_t *pairs, float *scale, float *inv, float *min)
{
    uint32_t i = 0;
#if S_HAVE_AVX2
    if (s_avx2()) {
        int64_t done = s_avx2_make_params(lo, hi, n, qmax, pairs, scale, inv, min);
        if (done < 0)
            return KVEDGE_EINVAL;
        i = (uint32_t)done;
    }
#endif
    for (; i < n; i++) {
        int rc = s_make_params(lo[i], hi[i], qmax, pairs + 2 * i, &scale[i], &inv[i], &min[i]);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

KVEDGE_VECTOR_CLONES
static void s_quantize_row(const float *x, uint32_t n, const float *inv, const float *min,
                           float qmax, uint8_t *q)
{
#if S_HAVE_AVX2
    if (s_avx2()) {
        s_avx2_quantize_row(x, n, inv, min, qmax, q);
        return;
    }
#endif
    for (uint32_t c = 0; c < n; c++) {
        float v = (x[c] - min[c]) * inv[c] + 0.5f;
        v = v < 0.0f ? 0.0f : v;
        v = v > qmax ? qmax : v;
        q[c] = (uint8_t)(int)v;
    }
}

KVEDGE_VECTOR_CLONES
static void s_pack_nibbles(const uint8_t *q, uint32_t n, uint8_t *out)
{
    uint32_t pairs = n / 2;
    for (uint32_t j = 0; j < pairs; j++)
        out[j] = (uint8_t)(q[2 * j] | (q[2 * j + 1] << 4));
    if (n & 1)
        out[pairs] = q[n - 1];
}

static void s_emit_row(const float *x, uint32_t n, const float *inv, const float *min,
                       unsigned bits, uint8_t *tmp, uint8_t *codes)
{
    if (bits == 8) {
        s_quantize_row(x, n, inv, min, 255.0f, codes);
    } else {
        s_quantize_row(x, n, inv, min, 15.0f, tmp);
        s_pack_nibbles(tmp, n, codes);
    }
}

/* Min and max of x[0..n); false if some value is infinite or NaN. */
static bool s_minmax(const float *x, uint32_t n, float *lo, float *hi)
{
#if S_HAVE_AVX2
    if (s_avx2())
        return s_avx2_minmax(x, n, lo, hi);
#endif
    float l = x[0], h = x[0], bad = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
        bad += x[i] - x[i];
    }
    *lo = l;
    *hi = h;
    return bad == 0.0f;
}

KVEDGE_VECTOR_CLONES
static void s_minmax_cols(const float *x, uint32_t rows, uint32_t n, float *lo, float *hi,
                          float *bad)
{
    for (uint32_t c = 0; c < n; c++) {
        lo[c] = x[c];
        hi[c] = x[c];
    }
    for (uint32_t t = 0; t < rows; t++) {
        const float *r = x + (size_t)t * n;
        for (uint32_t c = 0; c < n; c++) {
            lo[c] = r[c] < lo[c] ? r[c] : lo[c];
            hi[c] = r[c] > hi[c] ? r[c] : hi[c];
            bad[c] += r[c] - r[c]; /* NaN iff some input was inf or NaN */
        }
    }
}

int kvedge_quant_keys(const float *x, uint32_t tokens, uint32_t channels, uint32_t group,
                      unsigned bits, uint16_t *params, uint8_t *codes)
{
    if (!x || !params || !codes || tokens == 0 || channels == 0 || (bits != 8 && bits != 4))
        return KVEDGE_EINVAL;
    const unsigned qmax = (1u << bits) - 1;
    const uint32_t g = (group == 0 || group > tokens) ? tokens : group;
    const size_t row_bytes = kvedge_quant_row_bytes(channels, bits);
    /* lo, hi, bad, scale/inv/min per channel, then one row of unpacked codes. */
    float *buf = malloc(sizeof(float) * 6 * channels + channels);
    if (!buf)
        return KVEDGE_ENOMEM;
    float *lo = buf, *hi = lo + channels, *bad = hi + channels;
    float *scale = bad + channels, *inv = scale + channels, *min = inv + channels;
    uint8_t *tmp = (uint8_t *)(min + channels);
    int rc = KVEDGE_OK;
    for (uint32_t t0 = 0; t0 < tokens && rc == KVEDGE_OK; t0 += g) {
        uint32_t rows = tokens - t0 < g ? tokens - t0 : g;
        const float *xg = x + (size_t)t0 * channels;
        memset(bad, 0, sizeof(float) * channels);
        s_minmax_cols(xg, rows, channels, lo, hi, bad);
        uint16_t *p = params + (size_t)(t0 / g) * channels * 2;
        float anybad = 0.0f;
        for (uint32_t c = 0; c < channels; c++)
            anybad += bad[c];
        rc = anybad == 0.0f ? s_make_params_n(lo, hi, channels, qmax, p, scale, inv, min)
                            : KVEDGE_EINVAL;
        for (uint32_t t = 0; t < rows && rc == KVEDGE_OK; t++)
            s_emit_row(xg + (size_t)t * channels, channels, inv, min, bits, tmp,
                       codes + (size_t)(t0 + t) * row_bytes);
    }
    free(buf);
    return rc;
}

int kvedge_quant_values(const float *x, uint32_t tokens, uint32_t channels, uint32_t group,
                        unsigned bits, uint16_t *params, uint8_t *codes)
{
    if (!x || !params || !codes || tokens == 0 || channels == 0 || (bits != 8 && bits != 4))
        return KVEDGE_EINVAL;
    const unsigned qmax = (1u << bits) - 1;
    const uint32_t g = (group == 0 || group > channels) ? channels : group;
    const uint32_t ngroups = kvedge_quant_groups(channels, g);
    const size_t row_bytes = kvedge_quant_row_bytes(channels, bits);
    const size_t np = (size_t)tokens * ngroups;
    /* Three passes: ranges of every (token, group), their params in one vector pass, codes. */
    float *buf = malloc(sizeof(float) * (5 * np + 2 * channels) + channels);
    if (!buf)
        return KVEDGE_ENOMEM;
    float *lo = buf, *hi = lo + np, *gs = hi + np, *ginv = gs + np, *gmin = ginv + np;
    float *inv = gmin + np, *min = inv + channels;
    uint8_t *tmp = (uint8_t *)(min + channels);
    bool finite = true;
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t gi = 0, c0 = 0; gi < ngroups; gi++, c0 += g)
            finite &= s_minmax(x + (size_t)t * channels + c0, channels - c0 < g ? channels - c0 : g,
                               &lo[(size_t)t * ngroups + gi], &hi[(size_t)t * ngroups + gi]);
    int rc = finite ? s_make_params_n(lo, hi, (uint32_t)np, qmax, params, gs, ginv, gmin)
                    : KVEDGE_EINVAL;
    for (uint32_t t = 0; t < tokens && rc == KVEDGE_OK; t++) {
        for (uint32_t gi = 0, c0 = 0; gi < ngroups; gi++, c0 += g) {
            uint32_t end = c0 + g < channels ? c0 + g : channels;
            float iv = ginv[(size_t)t * ngroups + gi], m = gmin[(size_t)t * ngroups + gi];
            for (uint32_t c = c0; c < end; c++) {
                inv[c] = iv;
                min[c] = m;
            }
        }
        s_emit_row(x + (size_t)t * channels, channels, inv, min, bits, tmp,
                   codes + (size_t)t * row_bytes);
    }
    free(buf);
    return rc;
}

KVEDGE_VECTOR_CLONES
void kvedge_quant_params_expand(const uint16_t *params, uint32_t n, float *scale, float *min)
{
    for (uint32_t c = 0; c < n; c++) {
        scale[c] = kvedge_fp16_to_f32(params[2 * c]);
        min[c] = kvedge_fp16_to_f32(params[2 * c + 1]);
    }
}

void kvedge_quant_params_expand_grouped(const uint16_t *params, uint32_t channels, uint32_t group,
                                        float *scale, float *min)
{
    const uint32_t g = (group == 0 || group > channels) ? channels : group;
    for (uint32_t c0 = 0, gi = 0; c0 < channels; c0 += g, gi++) {
        float s = kvedge_fp16_to_f32(params[2 * gi]);
        float m = kvedge_fp16_to_f32(params[2 * gi + 1]);
        uint32_t end = c0 + g < channels ? c0 + g : channels;
        for (uint32_t c = c0; c < end; c++) {
            scale[c] = s;
            min[c] = m;
        }
    }
}

KVEDGE_VECTOR_CLONES
void kvedge_quant_unpack4(const uint8_t *codes, uint32_t n, uint8_t *out)
{
    uint32_t pairs = n / 2;
    for (uint32_t j = 0; j < pairs; j++) {
        out[2 * j] = codes[j] & 15;
        out[2 * j + 1] = codes[j] >> 4;
    }
    if (n & 1)
        out[n - 1] = codes[pairs] & 15;
}

KVEDGE_VECTOR_CLONES
static void s_dequant_u8(const uint8_t *c, uint32_t n, const float *scale, const float *min,
                         float *out)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = (float)c[i] * scale[i] + min[i];
}

void kvedge_dequant_row(const uint8_t *codes, unsigned bits, uint32_t n, const float *scale,
                        const float *min, float *out)
{
    uint8_t tmp[KVEDGE_BLOCK_MAX_HEAD_DIM];
    if (bits == 4) {
        /* rows are at most head_dim long; callers never pass more */
        kvedge_quant_unpack4(codes, n, tmp);
        codes = tmp;
    }
#if S_HAVE_AVX2
    if (s_avx2()) {
        s_avx2_dequant_u8(codes, n, scale, min, out);
        return;
    }
#endif
    s_dequant_u8(codes, n, scale, min, out);
}

void kvedge_dequant_row_out(const uint8_t *codes, unsigned bits, uint32_t n, const float *scale,
                            const float *min, int out_dtype, void *out)
{
    uint8_t tmp[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float row[KVEDGE_BLOCK_MAX_HEAD_DIM];
#if S_HAVE_AVX2
    if (out_dtype == KVEDGE_DTYPE_FP16 && s_avx2()) {
        if (bits == 4) {
            kvedge_quant_unpack4(codes, n, tmp);
            codes = tmp;
        }
        s_avx2_dequant_u8_fp16(codes, n, scale, min, out);
        return;
    }
#endif
    kvedge_dequant_row(codes, bits, n, scale, min, row);
    kvedge_convert_from_f32(out_dtype, row, n, out);
}

void kvedge_dequant_row_grouped_out(const uint8_t *codes, unsigned bits, uint32_t n,
                                    const uint16_t *params, uint32_t group, int out_dtype,
                                    void *out)
{
    const uint32_t g = (group == 0 || group > n) ? n : group;
#if S_HAVE_AVX2
    if (out_dtype == KVEDGE_DTYPE_FP16 && s_avx2()) {
        uint8_t tmp[KVEDGE_BLOCK_MAX_HEAD_DIM];
        if (bits == 4) {
            kvedge_quant_unpack4(codes, n, tmp);
            codes = tmp;
        }
        for (uint32_t c0 = 0, gi = 0; c0 < n; c0 += g, gi++)
            s_avx2_dequant_u8_bcast_fp16(
                codes + c0, n - c0 < g ? n - c0 : g, kvedge_fp16_to_f32(params[2 * gi]),
                kvedge_fp16_to_f32(params[2 * gi + 1]), (uint16_t *)out + c0);
        return;
    }
#endif
    float scale[KVEDGE_BLOCK_MAX_HEAD_DIM], min[KVEDGE_BLOCK_MAX_HEAD_DIM];
    kvedge_quant_params_expand_grouped(params, n, group, scale, min);
    kvedge_dequant_row_out(codes, bits, n, scale, min, out_dtype, out);
}

KVEDGE_VECTOR_CLONES
static void s_fp16_to_f32(const uint16_t *s, size_t n, float *d)
{
    for (size_t i = 0; i < n; i++)
        d[i] = kvedge_fp16_to_f32(s[i]);
}

KVEDGE_VECTOR_CLONES
static void s_bf16_to_f32(const uint16_t *s, size_t n, float *d)
{
    for (size_t i = 0; i < n; i++)
        d[i] = kvedge_bf16_to_f32(s[i]);
}

KVEDGE_VECTOR_CLONES
static void s_f32_to_fp16(const float *s, size_t n, uint16_t *d)
{
    for (size_t i = 0; i < n; i++)
        d[i] = kvedge_f32_to_fp16(s[i]);
}

KVEDGE_VECTOR_CLONES
static void s_f32_to_bf16(const float *s, size_t n, uint16_t *d)
{
    for (size_t i = 0; i < n; i++)
        d[i] = kvedge_f32_to_bf16(s[i]);
}

void kvedge_convert_to_f32(int dtype, const void *src, size_t n, float *dst)
{
    switch (dtype) {
    case KVEDGE_DTYPE_FP16:
#if S_HAVE_AVX2
        if (s_avx2()) {
            s_avx2_fp16_to_f32(src, n, dst);
            break;
        }
#endif
        s_fp16_to_f32(src, n, dst);
        break;
    case KVEDGE_DTYPE_BF16:
        s_bf16_to_f32(src, n, dst);
        break;
    default:
        memcpy(dst, src, n * sizeof(float));
        break;
    }
}

void kvedge_convert_from_f32(int dtype, const float *src, size_t n, void *dst)
{
    switch (dtype) {
    case KVEDGE_DTYPE_FP16:
#if S_HAVE_AVX2
        if (s_avx2()) {
            s_avx2_f32_to_fp16(src, n, dst);
            break;
        }
#endif
        s_f32_to_fp16(src, n, dst);
        break;
    case KVEDGE_DTYPE_BF16:
        s_f32_to_bf16(src, n, dst);
        break;
    default:
        memcpy(dst, src, n * sizeof(float));
        break;
    }
}
