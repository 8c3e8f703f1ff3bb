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
#include <cpuid.h>
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
        /* CPUID: F16C (leaf 1 ECX bit 29), AVX2 (leaf 7 EBX bit 5), and the OS saving the
         * YMM state (OSXSAVE, XCR0 bits 1-2). Read directly: clang 14 has no "f16c" for
         * __builtin_cpu_supports. */
        unsigned a, b, c, d;
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) && (c & (1u << 27));
        bool avx2 = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 5));
        bool ymm = false;
        if (f16c) {
            unsigned lo, hi;
            __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            ymm = (lo & 6u) == 6u;
        }
        v = f16c && avx2 && ymm;
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

/* One pshufb per 16 output channels: each lane's kept channels are a contiguous run of the
 * compact row, so a 16-byte load at the lane's start and a shuffle place them. */
S_AVX2 static void s_avx2_expand_u8(const kvedge_expand_plan_t *p, const uint8_t *padded,
                                    uint8_t *wide)
{
    for (uint32_t l = 0; l < (p->head_dim + 15) / 16; l++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(padded + p->start[l]));
        __m128i c = _mm_loadu_si128((const __m128i *)p->ctrl[l]);
        _mm_storeu_si128((__m128i *)(wide + 16 * l), _mm_shuffle_epi8(v, c));
    }
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
        /* Horizontal reduction in registers: 8 -> 4 -> 2 -> 1 lanes. */
        __m128 l4 = _mm_min_ps(_mm256_castps256_ps128(vl), _mm256_extractf128_ps(vl, 1));
        __m128 h4 = _mm_max_ps(_mm256_castps256_ps128(vh), _mm256_extractf128_ps(vh, 1));
        __m128 b4 = _mm_add_ps(_mm256_castps256_ps128(vb), _mm256_extractf128_ps(vb, 1));
        l4 = _mm_min_ps(l4, _mm_movehl_ps(l4, l4));
        h4 = _mm_max_ps(h4, _mm_movehl_ps(h4, h4));
        b4 = _mm_add_ps(b4, _mm_movehl_ps(b4, b4));
        l4 = _mm_min_ss(l4, _mm_shuffle_ps(l4, l4, 1));
        h4 = _mm_max_ss(h4, _mm_shuffle_ps(h4, h4, 1));
        b4 = _mm_add_ss(b4, _mm_shuffle_ps(b4, b4, 1));
        l = _mm_cvtss_f32(l4);
        h = _mm_cvtss_f32(h4);
        bad = _mm_cvtss_f32(b4);
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

/* Codes of one row: one byte each (8 bits) or packed two per byte, low nibble first (4 bits;
 * n even for the vector part). */
/* Codes of one row: one byte each (8 bits) or packed two per byte, low nibble first (4 bits;
 * n even for the vector part). Params per element, or one pair for the whole row (bcast):
 * always inlined with a constant bcast, so each caller gets its own loop. */
S_AVX2 static inline __attribute__((always_inline)) void
s_avx2_quantize(const float *x, uint32_t n, const float *inv, const float *min, float inv1,
                float min1, bool bcast, unsigned bits, uint8_t *q)
{
    const float qmax = bits == 8 ? 255.0f : 15.0f;
    const __m256 half = _mm256_set1_ps(0.5f), zero = _mm256_setzero_ps(),
                 top = _mm256_set1_ps(qmax), vi1 = _mm256_set1_ps(inv1), vm1 = _mm256_set1_ps(min1);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i nib = _mm256_set1_epi16(0x1001); /* lo * 1 + hi * 16 per byte pair */
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i w[4];
        for (int j = 0; j < 4; j++) {
            uint32_t o = i + 8 * (uint32_t)j;
            __m256 vm = bcast ? vm1 : _mm256_loadu_ps(min + o);
            __m256 vi = bcast ? vi1 : _mm256_loadu_ps(inv + o);
            __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + o), vm);
            v = _mm256_add_ps(_mm256_mul_ps(v, vi), half);
            v = _mm256_min_ps(_mm256_max_ps(v, zero), top);
            w[j] = _mm256_cvttps_epi32(v);
        }
        __m256i b =
            _mm256_packus_epi16(_mm256_packs_epi32(w[0], w[1]), _mm256_packs_epi32(w[2], w[3]));
        b = _mm256_permutevar8x32_epi32(b, order);
        if (bits == 8) {
            _mm256_storeu_si256((__m256i *)(q + i), b);
        } else {
            __m256i p = _mm256_maddubs_epi16(b, nib); /* 16 x u16 holding one packed byte */
            __m128i packed =
                _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
            _mm_storeu_si128((__m128i *)(q + i / 2), packed);
        }
    }
    for (; i < n; i++) {
        float v = (x[i] - (bcast ? min1 : min[i])) * (bcast ? inv1 : inv[i]) + 0.5f;
        v = v < 0.0f ? 0.0f : v;
        v = v > qmax ? qmax : v;
        uint8_t c = (uint8_t)(int)v;
        if (bits == 8)
            q[i] = c;
        else if (i & 1)
            q[i / 2] |= (uint8_t)(c << 4);
        else
            q[i / 2] = c;
    }
}

S_AVX2 static void s_avx2_quantize_row(const float *x, uint32_t n, const float *inv,
                                       const float *min, unsigned bits, uint8_t *q)
{
    s_avx2_quantize(x, n, inv, min, 0.0f, 0.0f, false, bits, q);
}

/* A row whose params are one (inv, min) pair. */
S_AVX2 static void s_avx2_quantize_bcast(const float *x, uint32_t n, float inv, float min,
                                         unsigned bits, uint8_t *q)
{
    s_avx2_quantize(x, n, NULL, NULL, inv, min, true, bits, q);
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
#if S_HAVE_AVX2
    if (s_avx2()) {
        s_avx2_quantize_row(x, n, inv, min, bits, codes);
        return;
    }
#endif
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

/* Folds one row into running per-channel ranges; bad turns NaN on a non-finite value. */
KVEDGE_VECTOR_CLONES
static void s_minmax_fold(const float *r, uint32_t n, float *lo, float *hi, float *bad)
{
    for (uint32_t c = 0; c < n; c++) {
        lo[c] = r[c] < lo[c] ? r[c] : lo[c];
        hi[c] = r[c] > hi[c] ? r[c] : hi[c];
        bad[c] += r[c] - r[c];
    }
}

/* Row t of x ([tokens][head_dim] in dtype) as floats, only the kept channels when kept is not
 * NULL. The row lives in `row` (L1-sized), so no full-matrix float copy is ever made. */
static const float *s_row(int dtype, const void *x, uint32_t head_dim, uint32_t t,
                          const uint16_t *kept, uint32_t channels, float *row, float *wide)
{
    const size_t es = kvedge_dtype_size((kvedge_dtype_t)dtype);
    const uint8_t *src = (const uint8_t *)x + (size_t)t * head_dim * es;
    if (!kept) {
        if (dtype == KVEDGE_DTYPE_FP32)
            return (const float *)src;
        kvedge_convert_to_f32(dtype, src, head_dim, row);
        return row;
    }
    kvedge_convert_to_f32(dtype, src, head_dim, wide);
    for (uint32_t j = 0; j < channels; j++)
        row[j] = wide[kept[j]];
    return row;
}

static bool s_dtype_ok(int dtype)
{
    return kvedge_dtype_size((kvedge_dtype_t)dtype) != 0;
}

int kvedge_quant_keys(int dtype, const void *x, uint32_t tokens, uint32_t head_dim,
                      const uint16_t *kept, uint32_t channels, uint32_t group, unsigned bits,
                      uint16_t *params, uint8_t *codes)
{
    if (!x || !params || !codes || tokens == 0 || channels == 0 || !s_dtype_ok(dtype) ||
        head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM || channels > head_dim ||
        (!kept && channels != head_dim) || (bits != 8 && bits != 4))
        return KVEDGE_EINVAL;
    const unsigned qmax = (1u << bits) - 1;
    const uint32_t g = (group == 0 || group > tokens) ? tokens : group;
    const size_t row_bytes = kvedge_quant_row_bytes(channels, bits);
    float lo[KVEDGE_BLOCK_MAX_HEAD_DIM], hi[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float bad[KVEDGE_BLOCK_MAX_HEAD_DIM], scale[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float inv[KVEDGE_BLOCK_MAX_HEAD_DIM], min[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float row[KVEDGE_BLOCK_MAX_HEAD_DIM], wide[KVEDGE_BLOCK_MAX_HEAD_DIM];
    uint8_t tmp[KVEDGE_BLOCK_MAX_HEAD_DIM];
    int rc = KVEDGE_OK;
    /* Per group of tokens: one pass for the per-channel ranges, one for the codes; each
     * re-reads the group's rows from the source, which is still in cache. (Keeping the
     * converted group in a float tile between the passes measured no faster.) */
    for (uint32_t t0 = 0; t0 < tokens && rc == KVEDGE_OK; t0 += g) {
        uint32_t rows = tokens - t0 < g ? tokens - t0 : g;
        const float *r = s_row(dtype, x, head_dim, t0, kept, channels, row, wide);
        memcpy(lo, r, sizeof(float) * channels);
        memcpy(hi, r, sizeof(float) * channels);
        memset(bad, 0, sizeof(float) * channels);
        for (uint32_t t = 0; t < rows; t++)
            s_minmax_fold(s_row(dtype, x, head_dim, t0 + t, kept, channels, row, wide), channels,
                          lo, hi, bad);
        float anybad = 0.0f;
        for (uint32_t c = 0; c < channels; c++)
            anybad += bad[c];
        rc = anybad == 0.0f
                 ? s_make_params_n(lo, hi, channels, qmax, params + (size_t)(t0 / g) * channels * 2,
                                   scale, inv, min)
                 : KVEDGE_EINVAL;
        for (uint32_t t = 0; t < rows && rc == KVEDGE_OK; t++)
            s_emit_row(s_row(dtype, x, head_dim, t0 + t, kept, channels, row, wide), channels, inv,
                       min, bits, tmp, codes + (size_t)(t0 + t) * row_bytes);
    }
    return rc;
}

int kvedge_quant_values(int dtype, const void *x, uint32_t tokens, uint32_t channels,
                        uint32_t group, unsigned bits, uint16_t *params, uint8_t *codes)
{
    if (!x || !params || !codes || tokens == 0 || channels == 0 || !s_dtype_ok(dtype) ||
        channels > KVEDGE_BLOCK_MAX_HEAD_DIM || (bits != 8 && bits != 4))
        return KVEDGE_EINVAL;
    enum { BATCH_GROUPS = KVEDGE_BLOCK_MAX_HEAD_DIM };
    const unsigned qmax = (1u << bits) - 1;
    const uint32_t g = (group == 0 || group > channels) ? channels : group;
    const uint32_t ngroups = kvedge_quant_groups(channels, g);
    const uint32_t batch = BATCH_GROUPS / ngroups; /* >= 1: ngroups <= channels <= the max */
    const size_t row_bytes = kvedge_quant_row_bytes(channels, bits);
    float lo[BATCH_GROUPS], hi[BATCH_GROUPS], gs[BATCH_GROUPS], ginv[BATCH_GROUPS],
        gmin[BATCH_GROUPS];
    float inv[KVEDGE_BLOCK_MAX_HEAD_DIM], min[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float row[KVEDGE_BLOCK_MAX_HEAD_DIM];
    uint8_t tmp[KVEDGE_BLOCK_MAX_HEAD_DIM];
    int rc = KVEDGE_OK;
    /* Tokens in batches, so the params of many groups are made in one vector pass; each row
     * is converted again for its codes (cheap, and no full-matrix float copy). */
    for (uint32_t t0 = 0; t0 < tokens && rc == KVEDGE_OK; t0 += batch) {
        uint32_t nt = tokens - t0 < batch ? tokens - t0 : batch;
        bool finite = true;
        for (uint32_t t = 0; t < nt; t++) {
            const float *r = s_row(dtype, x, channels, t0 + t, NULL, channels, row, NULL);
            for (uint32_t gi = 0, c0 = 0; gi < ngroups; gi++, c0 += g)
                finite &= s_minmax(r + c0, channels - c0 < g ? channels - c0 : g,
                                   &lo[t * ngroups + gi], &hi[t * ngroups + gi]);
        }
        rc = finite ? s_make_params_n(lo, hi, nt * ngroups, qmax, params + (size_t)t0 * ngroups * 2,
                                      gs, ginv, gmin)
                    : KVEDGE_EINVAL;
        for (uint32_t t = 0; t < nt && rc == KVEDGE_OK; t++) {
#if S_HAVE_AVX2
            /* Group by group with broadcast params: no per-channel param arrays to build.
             * Nibble rows stay aligned when groups have even length. */
            if (s_avx2() && (bits == 8 || g % 2 == 0)) {
                const float *r = s_row(dtype, x, channels, t0 + t, NULL, channels, row, NULL);
                uint8_t *q = codes + (size_t)(t0 + t) * row_bytes;
                for (uint32_t gi = 0, c0 = 0; gi < ngroups; gi++, c0 += g)
                    s_avx2_quantize_bcast(r + c0, channels - c0 < g ? channels - c0 : g,
                                          ginv[t * ngroups + gi], gmin[t * ngroups + gi], bits,
                                          q + (bits == 8 ? c0 : c0 / 2));
                continue;
            }
#endif
            for (uint32_t gi = 0, c0 = 0; gi < ngroups; gi++, c0 += g) {
                uint32_t end = c0 + g < channels ? c0 + g : channels;
                for (uint32_t c = c0; c < end; c++) {
                    inv[c] = ginv[t * ngroups + gi];
                    min[c] = gmin[t * ngroups + gi];
                }
            }
            s_emit_row(s_row(dtype, x, channels, t0 + t, NULL, channels, row, NULL), channels, inv,
                       min, bits, tmp, codes + (size_t)(t0 + t) * row_bytes);
        }
    }
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

void kvedge_expand_plan(const uint8_t *mask, uint32_t head_dim, kvedge_expand_plan_t *p)
{
    memset(p, 0, sizeof *p);
    p->head_dim = head_dim;
    for (uint32_t c = 0; c < head_dim; c++) {
        if (c % 16 == 0)
            p->start[c / 16] = (uint16_t)p->kept;
        bool kept = (mask[c >> 3] >> (c & 7)) & 1u;
        p->ctrl[c / 16][c % 16] = kept ? (uint8_t)(p->kept - p->start[c / 16]) : 0x80;
        if (kept)
            p->idx[p->kept++] = (uint16_t)c;
    }
    for (uint32_t c = head_dim; c % 16 != 0; c++) /* tail of the last lane: zeros */
        p->ctrl[c / 16][c % 16] = 0x80;
}

void kvedge_expand_u8(const kvedge_expand_plan_t *p, const uint8_t *compact, uint8_t *wide)
{
#if S_HAVE_AVX2
    if (s_avx2()) {
        /* Lanes read up to 16 bytes past their start: work on a padded copy of the row. */
        uint8_t padded[1024 + 16];
        memcpy(padded, compact, p->kept);
        memset(padded + p->kept, 0, 16);
        s_avx2_expand_u8(p, padded, wide);
        return;
    }
#endif
    memset(wide, 0, (p->head_dim + 15) / 16 * 16);
    for (uint32_t j = 0; j < p->kept; j++)
        wide[p->idx[j]] = compact[j];
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
