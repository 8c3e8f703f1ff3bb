/* CPU reference of kvedge's asymmetric quantization, written as flat loops the compiler
 * vectorizes (see KVEDGE_VECTOR_CLONES). */
#include "access/codec/quant.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/half.h"

#include <stdatomic.h>
#include <stdbool.h>

/* Explicit AVX2 + F16C kernels for the hot loops: GCC 12 does not vectorize _Float16
 * conversions or float min/max reductions by itself. Chosen at run time from CPUID, so one
 * binary runs everywhere. They do exactly the IEEE operations of the generic C loops (mul then
 * add, never fused: the codec builds with -ffp-contract=off), so both paths give identical
 * bits; tests/access/codec/test_quant.c checks that. */
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

S_AVX2 static void s_avx2_dequant_u8_bcast_f32(const uint8_t *c, uint32_t n, float scale, float min,
                                               float *out)
{
    const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(min);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 q =
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + i))));
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(q, vs), vm));
    }
    for (; i < n; i++)
        out[i] = (float)c[i] * scale + min;
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

/* Codes of one row with per-element params: one byte each (8 bits) or packed two per byte, low
 * nibble first (4 bits; n even for the vector part). */
S_AVX2 static void s_avx2_quantize_row(const float *x, uint32_t n, const float *inv,
                                       const float *min, unsigned bits, uint8_t *q)
{
    const float qmax = bits == 8 ? 255.0f : 15.0f;
    const __m256 half = _mm256_set1_ps(0.5f), zero = _mm256_setzero_ps(),
                 top = _mm256_set1_ps(qmax);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i nib = _mm256_set1_epi16(0x1001); /* lo * 1 + hi * 16 per byte pair */
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
        float v = (x[i] - min[i]) * inv[i] + 0.5f;
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

/* Min and max of x[0..n); false if some value is infinite or NaN. Of equal values the first
 * stays, which decides the sign of a range ending at +-0; the SIMD kernels keep the same. */
static bool s_minmax(const float *x, uint32_t n, float *lo, float *hi)
{
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

#if S_HAVE_AVX2
/* Fused encode kernels. Each pass over a group reads the source once and converts it in
 * registers: keys in tiles of up to 32 channels whose running ranges (or params) stay in
 * registers across the group's rows, values a few rows at a time, re-read from L1 for their
 * codes. They give the bytes of the generic loops: min and max are exact whatever the order,
 * and where the order matters (which of +0 and -0 a range keeps) they keep the first one met,
 * as the generic loops do. Finiteness is checked on running sums: a sum is NaN or infinite
 * iff some input is, or some input is too large for fp16 params, which is refused anyway. */
#define S_INLINE __attribute__((always_inline)) inline
/* Bytes of the stack tile that pruned key rows are compacted into, and of the largest group
 * compacted whole on the heap instead (256 tokens x 1024 fp32 channels). */
#define S_KEY_TILE_BYTES     16384
#define S_KEY_HEAP_MAX_BYTES (1u << 20)

/* 8 elements of dtype as floats: the values kvedge_convert_to_f32 gives. */
S_AVX2 static S_INLINE __m256 s_avx2_load8(int dtype, const uint8_t *p)
{
    if (dtype == KVEDGE_DTYPE_FP16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    if (dtype == KVEDGE_DTYPE_BF16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    return _mm256_loadu_ps((const float *)p);
}

static S_INLINE float s_load1(int dtype, const uint8_t *row, uint32_t c)
{
    uint16_t h;
    float f;
    if (dtype == KVEDGE_DTYPE_FP32) {
        memcpy(&f, row + 4 * (size_t)c, 4);
        return f;
    }
    memcpy(&h, row + 2 * (size_t)c, 2);
    return dtype == KVEDGE_DTYPE_FP16 ? kvedge_fp16_to_f32(h) : kvedge_bf16_to_f32(h);
}

/* The generic loops' code of one value: clamp, then truncate. */
static S_INLINE uint8_t s_code1(float x, float inv, float min, float qmax)
{
    float v = (x - min) * inv + 0.5f;
    v = v < 0.0f ? 0.0f : v;
    v = v > qmax ? qmax : v;
    return (uint8_t)(int)v;
}

static S_INLINE void s_put_code(uint8_t *q, uint32_t c, unsigned bits, uint8_t code)
{
    if (bits == 8)
        q[c] = code;
    else if (c & 1)
        q[c / 2] |= (uint8_t)(code << 4);
    else
        q[c / 2] = code;
}

/* (x - min) * inv + 0.5, truncated: the clamp of the generic loops is done by the saturating
 * packs below. Exact: with params made from the group's own range, |v| < 2^28 (|x - min| is at
 * most the range plus half an fp16 ulp of min, inv at most 2^24), so truncation never
 * overflows, and clamping before or after a monotonic truncation gives the same integer. */
S_AVX2 static S_INLINE __m256i s_avx2_code8(__m256 x, __m256 inv, __m256 min)
{
    __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(x, min), inv), _mm256_set1_ps(0.5f));
    return _mm256_cvttps_epi32(v);
}

/* Stores the codes of nv (1..4, constant after inlining) vectors of 8 codes at q: 8 nv bytes,
 * or 4 nv packed nibble bytes (low nibble first). */
S_AVX2 static S_INLINE void s_avx2_store_codes(const __m256i *w, int nv, unsigned bits, uint8_t *q)
{
    const __m256i z = _mm256_setzero_si256();
    __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(w[0], nv > 1 ? w[1] : z),
                                    _mm256_packs_epi32(nv > 2 ? w[2] : z, nv > 3 ? w[3] : z));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    if (bits == 8) {
        if (nv == 4) {
            _mm256_storeu_si256((__m256i *)q, b);
            return;
        }
        __m128i lo = _mm256_castsi256_si128(b);
        if (nv == 1) {
            _mm_storel_epi64((__m128i *)q, lo);
            return;
        }
        _mm_storeu_si128((__m128i *)q, lo);
        if (nv == 3)
            _mm_storel_epi64((__m128i *)(q + 16), _mm256_extracti128_si256(b, 1));
        return;
    }
    b = _mm256_min_epu8(b, _mm256_set1_epi8(15));
    __m256i p = _mm256_maddubs_epi16(b, _mm256_set1_epi16(0x1001)); /* lo + 16 * hi */
    __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    if (nv == 4)
        _mm_storeu_si128((__m128i *)q, packed);
    else if (nv == 1)
        _mm_storeu_si32(q, packed);
    else {
        _mm_storel_epi64((__m128i *)q, packed);
        if (nv == 3)
            _mm_storeu_si32(q + 8, _mm_srli_si128(packed, 8));
    }
}

/* Folds rows [0, nr) of channels [0, 8 nv) into the running ranges and sums (first: start
 * them from row 0). Per lane, (v < lo ? v : lo) is vminps(v, lo): the same order as
 * s_minmax_fold, so the first of equal values stays. The first tile of a strided source
 * prefetches the rest of the row 8 rows ahead (pf: row bytes), for the tiles after it: the
 * hardware prefetcher follows only the tile's own column of cache lines. */
S_AVX2 static S_INLINE void s_avx2_ranges_tile(int dtype, const uint8_t *src, size_t stride,
                                               uint32_t nr, int nv, bool first, float *lo,
                                               float *hi, float *sum, uint32_t pf)
{
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2;
    __m256 l[4], h[4], s[4];
    for (int j = 0; j < nv; j++) {
        if (first) {
            l[j] = h[j] = s_avx2_load8(dtype, src + 8 * es * (size_t)j);
            s[j] = _mm256_setzero_ps();
        } else {
            l[j] = _mm256_loadu_ps(lo + 8 * j);
            h[j] = _mm256_loadu_ps(hi + 8 * j);
            s[j] = _mm256_loadu_ps(sum + 8 * j);
        }
    }
    for (uint32_t r = 0; r < nr; r++, src += stride) {
        for (uint32_t k = 64; k < pf; k += 64)
            _mm_prefetch((const char *)(src + 8 * stride + k), _MM_HINT_T0);
        for (int j = 0; j < nv; j++) {
            __m256 v = s_avx2_load8(dtype, src + 8 * es * (size_t)j);
            l[j] = _mm256_min_ps(v, l[j]);
            h[j] = _mm256_max_ps(v, h[j]);
            s[j] = _mm256_add_ps(s[j], v);
        }
    }
    for (int j = 0; j < nv; j++) {
        _mm256_storeu_ps(lo + 8 * j, l[j]);
        _mm256_storeu_ps(hi + 8 * j, h[j]);
        _mm256_storeu_ps(sum + 8 * j, s[j]);
    }
}

/* Codes of rows [0, nr) for channels [0, 8 nv), params held in registers. */
S_AVX2 static S_INLINE void s_avx2_codes_tile(int dtype, const uint8_t *src, size_t stride,
                                              uint32_t nr, int nv, const float *inv,
                                              const float *min, unsigned bits, uint8_t *q,
                                              size_t row_bytes)
{
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2;
    __m256 vi[4], vm[4];
    for (int j = 0; j < nv; j++) {
        vi[j] = _mm256_loadu_ps(inv + 8 * j);
        vm[j] = _mm256_loadu_ps(min + 8 * j);
    }
    for (uint32_t r = 0; r < nr; r++, src += stride, q += row_bytes) {
        __m256i w[4];
        for (int j = 0; j < nv; j++)
            w[j] = s_avx2_code8(s_avx2_load8(dtype, src + 8 * es * (size_t)j), vi[j], vm[j]);
        s_avx2_store_codes(w, nv, bits, q);
    }
}

/* Ranges of channels [0, n) of nr rows: tiles of 32 channels, then single channels. */
S_AVX2 static S_INLINE void s_avx2_key_ranges(int dtype, const uint8_t *src, size_t stride,
                                              uint32_t nr, uint32_t n, bool first, float *lo,
                                              float *hi, float *sum, uint32_t pf)
{
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2;
    const uint32_t n8 = n / 8 * 8;
    for (uint32_t c = 0; c < n8; c += 32) {
        const uint8_t *p = src + c * es;
        switch ((n8 - c) / 8) {
        case 1:
            s_avx2_ranges_tile(dtype, p, stride, nr, 1, first, lo + c, hi + c, sum + c,
                               c == 0 ? pf : 0);
            break;
        case 2:
            s_avx2_ranges_tile(dtype, p, stride, nr, 2, first, lo + c, hi + c, sum + c,
                               c == 0 ? pf : 0);
            break;
        case 3:
            s_avx2_ranges_tile(dtype, p, stride, nr, 3, first, lo + c, hi + c, sum + c,
                               c == 0 ? pf : 0);
            break;
        default:
            s_avx2_ranges_tile(dtype, p, stride, nr, 4, first, lo + c, hi + c, sum + c,
                               c == 0 ? pf : 0);
            break;
        }
    }
    for (uint32_t c = n8; c < n; c++) {
        float l = first ? s_load1(dtype, src, c) : lo[c], h = first ? l : hi[c];
        float s = first ? 0.0f : sum[c];
        for (uint32_t r = 0; r < nr; r++) {
            float v = s_load1(dtype, src + r * stride, c);
            l = v < l ? v : l;
            h = v > h ? v : h;
            s += v;
        }
        lo[c] = l;
        hi[c] = h;
        sum[c] = s;
    }
}

S_AVX2 static S_INLINE void s_avx2_key_codes(int dtype, const uint8_t *src, size_t stride,
                                             uint32_t nr, uint32_t n, const float *inv,
                                             const float *min, unsigned bits, uint8_t *q,
                                             size_t row_bytes)
{
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2;
    const uint32_t n8 = n / 8 * 8;
    for (uint32_t c = 0; c < n8; c += 32) {
        const uint8_t *p = src + c * es;
        uint8_t *o = q + (bits == 8 ? c : c / 2);
        switch ((n8 - c) / 8) {
        case 1:
            s_avx2_codes_tile(dtype, p, stride, nr, 1, inv + c, min + c, bits, o, row_bytes);
            break;
        case 2:
            s_avx2_codes_tile(dtype, p, stride, nr, 2, inv + c, min + c, bits, o, row_bytes);
            break;
        case 3:
            s_avx2_codes_tile(dtype, p, stride, nr, 3, inv + c, min + c, bits, o, row_bytes);
            break;
        default:
            s_avx2_codes_tile(dtype, p, stride, nr, 4, inv + c, min + c, bits, o, row_bytes);
            break;
        }
    }
    const float qmax = bits == 8 ? 255.0f : 15.0f;
    for (uint32_t r = 0; r < nr && n8 < n; r++)
        for (uint32_t c = n8; c < n; c++)
            s_put_code(q + r * row_bytes, c, bits,
                       s_code1(s_load1(dtype, src + r * stride, c), inv[c], min[c], qmax));
}

/* Compaction of pruned key rows (ascending kept channels): per 8 source channels one shuffle
 * packs the kept ones to the front and one store puts them at their compact position. */
typedef struct {
    uint32_t chunks;                                 /* whole 8-channel chunks of the source row */
    uint32_t tail;                                   /* kept channels in them; the rest by index */
    uint16_t off[KVEDGE_BLOCK_MAX_HEAD_DIM / 8];     /* compact position of each chunk's first */
    uint8_t ctrl[KVEDGE_BLOCK_MAX_HEAD_DIM / 8][32]; /* pshufb (16-bit) or vpermd (32-bit) */
} s_compact_t;

/* False when kept is not strictly ascending: then rows are gathered channel by channel. */
static bool s_compact_plan(const uint16_t *kept, uint32_t channels, uint32_t head_dim, size_t es,
                           s_compact_t *p)
{
    for (uint32_t j = 1; j < channels; j++)
        if (kept[j] <= kept[j - 1])
            return false;
    p->chunks = head_dim / 8;
    uint32_t j = 0;
    for (uint32_t k = 0; k < p->chunks; k++) {
        p->off[k] = (uint16_t)j;
        memset(p->ctrl[k], es == 2 ? 0x80 : 0, 32);
        for (uint32_t o = 0; j < channels && kept[j] < 8 * (k + 1); j++, o++) {
            uint32_t i = kept[j] - 8 * k;
            if (es == 2) {
                p->ctrl[k][2 * o] = (uint8_t)(2 * i);
                p->ctrl[k][2 * o + 1] = (uint8_t)(2 * i + 1);
            } else {
                uint32_t v = i;
                memcpy(&p->ctrl[k][4 * o], &v, 4);
            }
        }
    }
    p->tail = j;
    return true;
}

/* Rows [t, t + nr) of x, kept channels only, into dst (rows of channels * es bytes; dst has 32
 * bytes of slack past the last row for the whole-chunk stores). */
S_AVX2 static S_INLINE void s_avx2_compact(int dtype, const uint8_t *x, uint32_t head_dim,
                                           const uint16_t *kept, uint32_t channels,
                                           const s_compact_t *p, uint32_t t, uint32_t nr,
                                           uint8_t *dst)
{
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2;
    for (uint32_t r = 0; r < nr; r++, dst += channels * es) {
        const uint8_t *row = x + ((size_t)t + r) * head_dim * es;
        uint32_t j = 0;
        if (p) {
            for (uint32_t k = 0; k < p->chunks; k++) {
                if (es == 2) {
                    __m128i v = _mm_loadu_si128((const __m128i *)(row + 16 * k));
                    v = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)p->ctrl[k]));
                    _mm_storeu_si128((__m128i *)(dst + 2 * p->off[k]), v);
                } else {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(row + 32 * k));
                    v = _mm256_permutevar8x32_epi32(
                        v, _mm256_loadu_si256((const __m256i *)p->ctrl[k]));
                    _mm256_storeu_si256((__m256i *)(dst + 4 * p->off[k]), v);
                }
            }
            j = p->tail;
        }
        for (; j < channels; j++)
            memcpy(dst + j * es, row + (size_t)kept[j] * es, es);
    }
}

/* kvedge_quant_keys for one dtype (constant after inlining). */
/* Pruned rows are compacted into `tile`, rb rows at a time; the tile keeps the last block it
 * was filled with, so the codes pass (run backwards) starts with what is still there. */
S_AVX2 static S_INLINE int s_avx2_keys_tiled(int dtype, const uint8_t *x, uint32_t tokens,
                                             uint32_t head_dim, const uint16_t *kept,
                                             uint32_t channels, uint32_t g, unsigned bits,
                                             uint16_t *params, uint8_t *codes, uint8_t *tile,
                                             uint32_t rb)
{
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2;
    const size_t row_bytes = kvedge_quant_row_bytes(channels, bits);
    const size_t stride = (kept ? channels : head_dim) * es;
    float lo[KVEDGE_BLOCK_MAX_HEAD_DIM], hi[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float sum[KVEDGE_BLOCK_MAX_HEAD_DIM], scale[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float inv[KVEDGE_BLOCK_MAX_HEAD_DIM], min[KVEDGE_BLOCK_MAX_HEAD_DIM];
    /* Prefetch only for groups larger than L1: a small group's rows are all loaded by its
     * first tile anyway, and there it measured slower. */
    const uint32_t pf = !kept && (size_t)g * stride > S_KEY_TILE_BYTES ? (uint32_t)stride : 0;
    s_compact_t plan;
    const s_compact_t *pp =
        kept && s_compact_plan(kept, channels, head_dim, es, &plan) ? &plan : NULL;
    uint32_t tile_t = UINT32_MAX, tile_n = 0;
    for (uint32_t t0 = 0; t0 < tokens; t0 += g) {
        const uint32_t rows = tokens - t0 < g ? tokens - t0 : g;
        const uint32_t blocks = (rows - 1) / rb + 1;
        for (uint32_t r0 = 0; r0 < rows; r0 += rb) {
            const uint32_t nr = rows - r0 < rb ? rows - r0 : rb;
            const uint8_t *src = x + ((size_t)t0 + r0) * stride;
            if (kept) {
                if (tile_t != t0 + r0 || tile_n != nr)
                    s_avx2_compact(dtype, x, head_dim, kept, channels, pp, t0 + r0, nr, tile);
                tile_t = t0 + r0;
                tile_n = nr;
                src = tile;
            }
            s_avx2_key_ranges(dtype, src, stride, nr, channels, r0 == 0, lo, hi, sum, pf);
        }
        float bad = 0.0f;
        for (uint32_t c = 0; c < channels; c++)
            bad += sum[c] - sum[c];
        if (bad != 0.0f)
            return KVEDGE_EINVAL;
        int rc = s_make_params_n(lo, hi, channels, (1u << bits) - 1,
                                 params + (size_t)(t0 / g) * channels * 2, scale, inv, min);
        if (rc != KVEDGE_OK)
            return rc;
        for (uint32_t b = blocks; b-- > 0;) {
            const uint32_t r0 = b * rb;
            const uint32_t nr = rows - r0 < rb ? rows - r0 : rb;
            const uint8_t *src = x + ((size_t)t0 + r0) * stride;
            if (kept) {
                if (tile_t != t0 + r0 || tile_n != nr)
                    s_avx2_compact(dtype, x, head_dim, kept, channels, pp, t0 + r0, nr, tile);
                tile_t = t0 + r0;
                tile_n = nr;
                src = tile;
            }
            s_avx2_key_codes(dtype, src, stride, nr, channels, inv, min, bits,
                             codes + ((size_t)t0 + r0) * row_bytes, row_bytes);
        }
    }
    return KVEDGE_OK;
}

/* kvedge_quant_keys for one dtype. A pruned group is compacted once for both passes when it
 * fits a heap tile of S_KEY_HEAP_MAX_BYTES, else rb rows at a time in a stack tile. */
S_AVX2 static S_INLINE int s_avx2_keys(int dtype, const uint8_t *x, uint32_t tokens,
                                       uint32_t head_dim, const uint16_t *kept, uint32_t channels,
                                       uint32_t g, unsigned bits, uint16_t *params, uint8_t *codes)
{
    const size_t stride = (size_t)channels * (dtype == KVEDGE_DTYPE_FP32 ? 4 : 2);
    _Alignas(32) uint8_t tile[S_KEY_TILE_BYTES + 32];
    if (!kept)
        return s_avx2_keys_tiled(dtype, x, tokens, head_dim, NULL, channels, g, bits, params, codes,
                                 NULL, g);
    uint32_t rb = (uint32_t)(S_KEY_TILE_BYTES / stride);
    uint8_t *heap = NULL;
    if (rb < g && (size_t)g * stride <= S_KEY_HEAP_MAX_BYTES && (heap = malloc(g * stride + 32)))
        rb = g;
    int rc = s_avx2_keys_tiled(dtype, x, tokens, head_dim, kept, channels, g, bits, params, codes,
                               heap ? heap : tile, rb);
    free(heap);
    return rc;
}

S_AVX2 static int s_avx2_keys_fp16(const void *x, uint32_t tokens, uint32_t head_dim,
                                   const uint16_t *kept, uint32_t channels, uint32_t g,
                                   unsigned bits, uint16_t *params, uint8_t *codes)
{
    return s_avx2_keys(KVEDGE_DTYPE_FP16, x, tokens, head_dim, kept, channels, g, bits, params,
                       codes);
}

S_AVX2 static int s_avx2_keys_bf16(const void *x, uint32_t tokens, uint32_t head_dim,
                                   const uint16_t *kept, uint32_t channels, uint32_t g,
                                   unsigned bits, uint16_t *params, uint8_t *codes)
{
    return s_avx2_keys(KVEDGE_DTYPE_BF16, x, tokens, head_dim, kept, channels, g, bits, params,
                       codes);
}

S_AVX2 static int s_avx2_keys_fp32(const void *x, uint32_t tokens, uint32_t head_dim,
                                   const uint16_t *kept, uint32_t channels, uint32_t g,
                                   unsigned bits, uint16_t *params, uint8_t *codes)
{
    return s_avx2_keys(KVEDGE_DTYPE_FP32, x, tokens, head_dim, kept, channels, g, bits, params,
                       codes);
}

/* Lane-wise min (max) of 8 vectors a[0..7] reduced to one vector of their 8 minima (maxima). */
S_AVX2 static S_INLINE __m256 s_avx2_reduce8(const float *a, bool max)
{
#define S_OP(x, y) (max ? _mm256_max_ps(x, y) : _mm256_min_ps(x, y))
    __m256 t[4], u[2];
    for (int i = 0; i < 4; i++) {
        __m256 x = _mm256_loadu_ps(a + 16 * i), y = _mm256_loadu_ps(a + 16 * i + 8);
        t[i] = S_OP(_mm256_unpacklo_ps(x, y), _mm256_unpackhi_ps(x, y));
    }
    for (int i = 0; i < 2; i++)
        u[i] = S_OP(_mm256_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44),
                    _mm256_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
    return S_OP(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
#undef S_OP
}

/* The first value equal to 0 in x[0..n) of dtype, for a range that came out as +-0: the
 * generic loops keep the first of equal values, so its sign is the one to keep. */
static float s_first_zero(int dtype, const uint8_t *x, uint32_t n)
{
    for (uint32_t c = 0; c < n; c++) {
        float v = s_load1(dtype, x, c);
        if (v == 0.0f)
            return v;
    }
    return 0.0f;
}

/* Codes of one value group of n channels at x with one (inv, min) pair; g even or 8 bits. */
S_AVX2 static S_INLINE void s_avx2_value_codes(int dtype, const uint8_t *x, uint32_t n, float inv,
                                               float min, unsigned bits, uint8_t *q)
{
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2;
    const __m256 vi = _mm256_set1_ps(inv), vm = _mm256_set1_ps(min);
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i w[4];
        for (int j = 0; j < 4; j++)
            w[j] = s_avx2_code8(s_avx2_load8(dtype, x + (i + 8 * (size_t)j) * es), vi, vm);
        s_avx2_store_codes(w, 4, bits, q + (bits == 8 ? i : i / 2));
    }
    for (; i + 8 <= n; i += 8) {
        __m256i w = s_avx2_code8(s_avx2_load8(dtype, x + i * es), vi, vm);
        s_avx2_store_codes(&w, 1, bits, q + (bits == 8 ? i : i / 2));
    }
    for (; i < n; i++)
        s_put_code(q, i, bits, s_code1(s_load1(dtype, x, i), inv, min, bits == 8 ? 255.0f : 15.0f));
}

/* First pass over one value row whose groups are all gv vectors long (gv constant after
 * inlining, so the loops unroll): each group's lane-wise min and max into pl/ph, the row into
 * the running sums. Two min/max chains per group and four sum chains keep the adds off the
 * critical path. */
S_AVX2 static S_INLINE void s_avx2_row_ranges(int dtype, const uint8_t *row, uint32_t ngroups,
                                              int gv, float *pl, float *ph, __m256 *vs)
{
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2;
    for (uint32_t gi = 0; gi < ngroups; gi++, row += 8 * (size_t)gv * es) {
        __m256 l[2], h[2];
        for (int k = 0; k < gv; k++) {
            __m256 v = s_avx2_load8(dtype, row + 8 * (size_t)k * es);
            if (k < 2) {
                l[k] = h[k] = v;
            } else {
                l[k & 1] = _mm256_min_ps(l[k & 1], v);
                h[k & 1] = _mm256_max_ps(h[k & 1], v);
            }
            vs[k & 3] = _mm256_add_ps(vs[k & 3], v);
        }
        _mm256_store_ps(pl + 8 * gi, gv > 1 ? _mm256_min_ps(l[0], l[1]) : l[0]);
        _mm256_store_ps(ph + 8 * gi, gv > 1 ? _mm256_max_ps(h[0], h[1]) : h[0]);
    }
}

/* Codes of one value row whose groups are all gv vectors long. */
S_AVX2 static S_INLINE void s_avx2_row_codes(int dtype, const uint8_t *row, uint32_t ngroups,
                                             int gv, const float *inv, const float *min,
                                             unsigned bits, uint8_t *q)
{
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2;
    const uint32_t g = 8 * (uint32_t)gv;
    for (uint32_t gi = 0; gi < ngroups; gi++)
        s_avx2_value_codes(dtype, row + (size_t)gi * g * es, g, inv[gi], min[gi], bits,
                           q + (bits == 8 ? gi * g : gi * g / 2));
}

/* kvedge_quant_values for one dtype, groups of g >= 8 channels (even for 4 bits). Up to 8
 * tokens at a time: their group ranges are reduced 8 groups per vector, their params made in
 * one vector pass, then their codes made from rows still in L1. */
S_AVX2 static S_INLINE int s_avx2_values(int dtype, const uint8_t *x, uint32_t tokens,
                                         uint32_t channels, uint32_t g, unsigned bits,
                                         uint16_t *params, uint8_t *codes)
{
    enum { MAX_GROUPS = 128 }; /* per batch; a row has at most 1024 / 8 groups */
    const size_t es = dtype == KVEDGE_DTYPE_FP32 ? 4 : 2, stride = channels * es;
    const uint32_t ngroups = kvedge_quant_groups(channels, g);
    const uint32_t batch = MAX_GROUPS / ngroups < 8 ? MAX_GROUPS / ngroups : 8;
    const size_t row_bytes = kvedge_quant_row_bytes(channels, bits);
    /* Rows cut into whole groups of whole vectors take unrolled loops (gv vectors a group). */
    const int gv = g % 8 == 0 && channels % g == 0 ? (int)(g / 8) : 0;
    _Alignas(32) float pl[MAX_GROUPS * 8 + 64], ph[MAX_GROUPS * 8 + 64];
    float lo[MAX_GROUPS], hi[MAX_GROUPS], gs[MAX_GROUPS], ginv[MAX_GROUPS], gmin[MAX_GROUPS];
    for (uint32_t t0 = 0; t0 < tokens; t0 += batch) {
        const uint32_t nt = tokens - t0 < batch ? tokens - t0 : batch, n = nt * ngroups;
        __m256 vs = _mm256_setzero_ps(), vs4[4] = {vs, vs, vs, vs};
        float ss = 0.0f;
        for (uint32_t t = 0; t < nt; t++) {
            const uint8_t *row = x + ((size_t)t0 + t) * stride;
            float *tl = pl + 8 * t * ngroups, *th = ph + 8 * t * ngroups;
            switch (gv) {
            case 1:
                s_avx2_row_ranges(dtype, row, ngroups, 1, tl, th, vs4);
                continue;
            case 2:
                s_avx2_row_ranges(dtype, row, ngroups, 2, tl, th, vs4);
                continue;
            case 4:
                s_avx2_row_ranges(dtype, row, ngroups, 4, tl, th, vs4);
                continue;
            case 8:
                s_avx2_row_ranges(dtype, row, ngroups, 8, tl, th, vs4);
                continue;
            case 16:
                s_avx2_row_ranges(dtype, row, ngroups, 16, tl, th, vs4);
                continue;
            default:
                break;
            }
            for (uint32_t gi = 0, c0 = 0; gi < ngroups; gi++, c0 += g) {
                const uint32_t m = channels - c0 < g ? channels - c0 : g, m8 = m / 8 * 8;
                const uint8_t *p = row + c0 * es;
                __m256 l, h;
                if (m8) {
                    l = h = s_avx2_load8(dtype, p);
                    vs = _mm256_add_ps(vs, l);
                } else {
                    l = h = _mm256_set1_ps(s_load1(dtype, p, 0));
                }
                for (uint32_t c = 8; c < m8; c += 8) {
                    __m256 v = s_avx2_load8(dtype, p + c * es);
                    l = _mm256_min_ps(l, v);
                    h = _mm256_max_ps(h, v);
                    vs = _mm256_add_ps(vs, v);
                }
                for (uint32_t c = m8; c < m; c++) {
                    float v = s_load1(dtype, p, c);
                    l = _mm256_min_ps(l, _mm256_set1_ps(v));
                    h = _mm256_max_ps(h, _mm256_set1_ps(v));
                    ss += v;
                }
                _mm256_store_ps(pl + 8 * (t * ngroups + gi), l);
                _mm256_store_ps(ph + 8 * (t * ngroups + gi), h);
            }
        }
        uint32_t i = 0;
        bool zero = false; /* some range ends at +-0: its sign needs the first such value */
        for (; i + 8 <= n; i += 8) {
            __m256 l = s_avx2_reduce8(pl + 8 * i, false), h = s_avx2_reduce8(ph + 8 * i, true);
            _mm256_storeu_ps(lo + i, l);
            _mm256_storeu_ps(hi + i, h);
            zero |= _mm256_movemask_ps(
                        _mm256_or_ps(_mm256_cmp_ps(l, _mm256_setzero_ps(), _CMP_EQ_OQ),
                                     _mm256_cmp_ps(h, _mm256_setzero_ps(), _CMP_EQ_OQ))) != 0;
        }
        for (; i < n; i++) {
            float l = pl[8 * i], h = ph[8 * i];
            for (int k = 1; k < 8; k++) {
                l = pl[8 * i + k] < l ? pl[8 * i + k] : l;
                h = ph[8 * i + k] > h ? ph[8 * i + k] : h;
            }
            lo[i] = l;
            hi[i] = h;
            zero |= l == 0.0f || h == 0.0f;
        }
        vs = _mm256_add_ps(
            vs, _mm256_add_ps(_mm256_add_ps(vs4[0], vs4[1]), _mm256_add_ps(vs4[2], vs4[3])));
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(vs), _mm256_extractf128_ps(vs, 1));
        s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
        float bad = _mm_cvtss_f32(s4) + ss;
        if (bad - bad != 0.0f)
            return KVEDGE_EINVAL;
        for (i = 0; zero && i < n; i++)
            if (lo[i] == 0.0f || hi[i] == 0.0f) {
                uint32_t t = i / ngroups, c0 = (i % ngroups) * g;
                const uint8_t *p = x + ((size_t)t0 + t) * stride + c0 * es;
                const uint32_t m = channels - c0 < g ? channels - c0 : g;
                if (lo[i] == 0.0f)
                    lo[i] = s_first_zero(dtype, p, m);
                if (hi[i] == 0.0f)
                    hi[i] = s_first_zero(dtype, p, m);
            }
        int rc = s_make_params_n(lo, hi, n, (1u << bits) - 1, params + (size_t)t0 * ngroups * 2, gs,
                                 ginv, gmin);
        if (rc != KVEDGE_OK)
            return rc;
        for (uint32_t t = 0; t < nt; t++) {
            const uint8_t *row = x + ((size_t)t0 + t) * stride;
            uint8_t *q = codes + ((size_t)t0 + t) * row_bytes;
            const float *ti = ginv + t * ngroups, *tm = gmin + t * ngroups;
            switch (gv) {
            case 1:
                s_avx2_row_codes(dtype, row, ngroups, 1, ti, tm, bits, q);
                continue;
            case 2:
                s_avx2_row_codes(dtype, row, ngroups, 2, ti, tm, bits, q);
                continue;
            case 4:
                s_avx2_row_codes(dtype, row, ngroups, 4, ti, tm, bits, q);
                continue;
            case 8:
                s_avx2_row_codes(dtype, row, ngroups, 8, ti, tm, bits, q);
                continue;
            case 16:
                s_avx2_row_codes(dtype, row, ngroups, 16, ti, tm, bits, q);
                continue;
            default:
                break;
            }
            for (uint32_t gi = 0, c0 = 0; gi < ngroups; gi++, c0 += g)
                s_avx2_value_codes(dtype, row + c0 * es, channels - c0 < g ? channels - c0 : g,
                                   ginv[t * ngroups + gi], gmin[t * ngroups + gi], bits,
                                   q + (bits == 8 ? c0 : c0 / 2));
        }
    }
    return KVEDGE_OK;
}

S_AVX2 static int s_avx2_values_fp16(const void *x, uint32_t tokens, uint32_t channels, uint32_t g,
                                     unsigned bits, uint16_t *params, uint8_t *codes)
{
    return s_avx2_values(KVEDGE_DTYPE_FP16, x, tokens, channels, g, bits, params, codes);
}

S_AVX2 static int s_avx2_values_bf16(const void *x, uint32_t tokens, uint32_t channels, uint32_t g,
                                     unsigned bits, uint16_t *params, uint8_t *codes)
{
    return s_avx2_values(KVEDGE_DTYPE_BF16, x, tokens, channels, g, bits, params, codes);
}

S_AVX2 static int s_avx2_values_fp32(const void *x, uint32_t tokens, uint32_t channels, uint32_t g,
                                     unsigned bits, uint16_t *params, uint8_t *codes)
{
    return s_avx2_values(KVEDGE_DTYPE_FP32, x, tokens, channels, g, bits, params, codes);
}
#endif

/* The generic loops: the reference the SIMD kernels reproduce bit for bit. */
static int s_keys_ref(int dtype, const void *x, uint32_t tokens, uint32_t head_dim,
                      const uint16_t *kept, uint32_t channels, uint32_t g, unsigned bits,
                      uint16_t *params, uint8_t *codes)
{
    const unsigned qmax = (1u << bits) - 1;
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

static int s_values_ref(int dtype, const void *x, uint32_t tokens, uint32_t channels, uint32_t g,
                        unsigned bits, uint16_t *params, uint8_t *codes)
{
    enum { BATCH_GROUPS = KVEDGE_BLOCK_MAX_HEAD_DIM };
    const unsigned qmax = (1u << bits) - 1;
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

int kvedge_quant_keys(int dtype, const void *x, uint32_t tokens, uint32_t head_dim,
                      const uint16_t *kept, uint32_t channels, uint32_t group, unsigned bits,
                      uint16_t *params, uint8_t *codes)
{
    if (!x || !params || !codes || tokens == 0 || channels == 0 || !s_dtype_ok(dtype) ||
        head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM || channels > head_dim ||
        (!kept && channels != head_dim) || (bits != 8 && bits != 4))
        return KVEDGE_EINVAL;
    for (uint32_t j = 0; kept && j < channels; j++)
        if (kept[j] >= head_dim)
            return KVEDGE_EINVAL;
    const uint32_t g = (group == 0 || group > tokens) ? tokens : group;
#if S_HAVE_AVX2
    if (s_avx2()) {
        if (dtype == KVEDGE_DTYPE_FP16)
            return s_avx2_keys_fp16(x, tokens, head_dim, kept, channels, g, bits, params, codes);
        if (dtype == KVEDGE_DTYPE_BF16)
            return s_avx2_keys_bf16(x, tokens, head_dim, kept, channels, g, bits, params, codes);
        return s_avx2_keys_fp32(x, tokens, head_dim, kept, channels, g, bits, params, codes);
    }
#endif
    return s_keys_ref(dtype, x, tokens, head_dim, kept, channels, g, bits, params, codes);
}

int kvedge_quant_values(int dtype, const void *x, uint32_t tokens, uint32_t channels,
                        uint32_t group, unsigned bits, uint16_t *params, uint8_t *codes)
{
    if (!x || !params || !codes || tokens == 0 || channels == 0 || !s_dtype_ok(dtype) ||
        channels > KVEDGE_BLOCK_MAX_HEAD_DIM || (bits != 8 && bits != 4))
        return KVEDGE_EINVAL;
    const uint32_t g = (group == 0 || group > channels) ? channels : group;
#if S_HAVE_AVX2
    /* Groups shorter than a vector, or odd nibble groups, take the generic loops. */
    if (s_avx2() && g >= 8 && (bits == 8 || g % 2 == 0)) {
        if (dtype == KVEDGE_DTYPE_FP16)
            return s_avx2_values_fp16(x, tokens, channels, g, bits, params, codes);
        if (dtype == KVEDGE_DTYPE_BF16)
            return s_avx2_values_bf16(x, tokens, channels, g, bits, params, codes);
        return s_avx2_values_fp32(x, tokens, channels, g, bits, params, codes);
    }
#endif
    return s_values_ref(dtype, x, tokens, channels, g, bits, params, codes);
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

KVEDGE_VECTOR_CLONES
static void s_dequant_u8_bcast_ref(const uint8_t *c, uint32_t n, float scale, float min, float *out)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = (float)c[i] * scale + min;
}

/* out[i] = c[i] * scale + min: one group of a value row, the arithmetic of s_dequant_u8 with
 * the pair broadcast. */
static void s_dequant_u8_bcast(const uint8_t *c, uint32_t n, float scale, float min, float *out)
{
#if S_HAVE_AVX2
    if (s_avx2()) {
        s_avx2_dequant_u8_bcast_f32(c, n, scale, min, out);
        return;
    }
#endif
    s_dequant_u8_bcast_ref(c, n, scale, min, out);
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

/* One row into out_dtype by the generic loops (kvedge_dequant_row's own dispatch): what the row
 * functions do for the dtypes, or on the machines, the AVX2 row loops below do not cover. */
static void s_row_out(const uint8_t *codes, unsigned bits, uint32_t n, const float *scale,
                      const float *min, int out_dtype, void *out)
{
    if (out_dtype == KVEDGE_DTYPE_FP32) { /* straight into the destination: no scratch row */
        kvedge_dequant_row(codes, bits, n, scale, min, out);
        return;
    }
    float row[KVEDGE_BLOCK_MAX_HEAD_DIM];
    kvedge_dequant_row(codes, bits, n, scale, min, row);
    kvedge_convert_from_f32(out_dtype, row, n, out);
}

static void s_row_grouped_out(const uint8_t *codes, unsigned bits, uint32_t n,
                              const uint16_t *params, uint32_t group, int out_dtype, void *out)
{
    const uint32_t g = (group == 0 || group > n) ? n : group;
    uint8_t tmp[KVEDGE_BLOCK_MAX_HEAD_DIM];
    if (bits == 4) {
        kvedge_quant_unpack4(codes, n, tmp);
        codes = tmp;
    }
    /* One (scale, min) pair per group, broadcast: no per-channel arrays. fp32 goes straight to
     * the destination, other dtypes through one scratch row. */
    float row[KVEDGE_BLOCK_MAX_HEAD_DIM];
    float *f = out_dtype == KVEDGE_DTYPE_FP32 ? (float *)out : row;
    for (uint32_t c0 = 0, gi = 0; c0 < n; c0 += g, gi++)
        s_dequant_u8_bcast(codes + c0, n - c0 < g ? n - c0 : g, kvedge_fp16_to_f32(params[2 * gi]),
                           kvedge_fp16_to_f32(params[2 * gi + 1]), f + c0);
    if (f == row)
        kvedge_convert_from_f32(out_dtype, row, n, out);
}

void kvedge_dequant_row_out(const uint8_t *codes, unsigned bits, uint32_t n, const float *scale,
                            const float *min, int out_dtype, void *out)
{
    kvedge_dequant_rows_out(codes, 0, 1, bits, n, scale, min, out_dtype, out, 0);
}

void kvedge_dequant_row_grouped_out(const uint8_t *codes, unsigned bits, uint32_t n,
                                    const uint16_t *params, uint32_t group, int out_dtype,
                                    void *out)
{
    kvedge_dequant_rows_grouped_out(codes, 0, 1, bits, n, params, 0, group, out_dtype, out, 0);
}

#if S_HAVE_AVX2
/* kvedge_dequant_rows_grouped_out into fp16 or fp32 with AVX2 + F16C: each row's (scale, min)
 * pairs converted by F16C (the bits of kvedge_fp16_to_f32), one broadcast kernel per group. */
S_AVX2 static void s_avx2_rows_grouped(const uint8_t *codes, size_t code_stride, uint32_t rows,
                                       unsigned bits, uint32_t n, const uint16_t *params,
                                       size_t param_stride, uint32_t group, bool fp16, void *out,
                                       size_t out_stride)
{
    const uint32_t g = (group == 0 || group > n) ? n : group;
    uint8_t tmp[KVEDGE_BLOCK_MAX_HEAD_DIM];
    uint8_t *o = out;
    for (uint32_t r = 0; r < rows; r++) {
        const uint8_t *c = codes + (size_t)r * code_stride;
        const uint16_t *p = params + (size_t)r * param_stride;
        uint8_t *dst = o + (size_t)r * out_stride;
        if (bits == 4) {
            kvedge_quant_unpack4(c, n, tmp);
            c = tmp;
        }
        for (uint32_t c0 = 0, gi = 0; c0 < n; c0 += g, gi++) {
            const uint32_t len = n - c0 < g ? n - c0 : g;
            uint32_t pair;
            memcpy(&pair, p + 2 * gi, sizeof pair);
            const __m128 sm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)pair));
            const float sc = _mm_cvtss_f32(sm);
            const float mn = _mm_cvtss_f32(_mm_shuffle_ps(sm, sm, 1));
            if (fp16)
                s_avx2_dequant_u8_bcast_fp16(c + c0, len, sc, mn, (uint16_t *)dst + c0);
            else
                s_avx2_dequant_u8_bcast_f32(c + c0, len, sc, mn, (float *)dst + c0);
        }
    }
}
#endif

void kvedge_dequant_rows_out(const uint8_t *codes, size_t code_stride, uint32_t rows, unsigned bits,
                             uint32_t n, const float *scale, const float *min, int out_dtype,
                             void *out, size_t out_stride)
{
    uint8_t *o = out;
#if S_HAVE_AVX2
    if ((out_dtype == KVEDGE_DTYPE_FP16 || out_dtype == KVEDGE_DTYPE_FP32) && s_avx2()) {
        uint8_t tmp[KVEDGE_BLOCK_MAX_HEAD_DIM];
        for (uint32_t r = 0; r < rows; r++) {
            const uint8_t *c = codes + (size_t)r * code_stride;
            if (bits == 4) {
                kvedge_quant_unpack4(c, n, tmp);
                c = tmp;
            }
            if (out_dtype == KVEDGE_DTYPE_FP16)
                s_avx2_dequant_u8_fp16(c, n, scale, min, (uint16_t *)(o + (size_t)r * out_stride));
            else
                s_avx2_dequant_u8(c, n, scale, min, (float *)(o + (size_t)r * out_stride));
        }
        return;
    }
#endif
    for (uint32_t r = 0; r < rows; r++)
        s_row_out(codes + (size_t)r * code_stride, bits, n, scale, min, out_dtype,
                  o + (size_t)r * out_stride);
}

void kvedge_dequant_rows_grouped_out(const uint8_t *codes, size_t code_stride, uint32_t rows,
                                     unsigned bits, uint32_t n, const uint16_t *params,
                                     size_t param_stride, uint32_t group, int out_dtype, void *out,
                                     size_t out_stride)
{
    uint8_t *o = out;
#if S_HAVE_AVX2
    if ((out_dtype == KVEDGE_DTYPE_FP16 || out_dtype == KVEDGE_DTYPE_FP32) && s_avx2()) {
        s_avx2_rows_grouped(codes, code_stride, rows, bits, n, params, param_stride, group,
                            out_dtype == KVEDGE_DTYPE_FP16, out, out_stride);
        return;
    }
#endif
    for (uint32_t r = 0; r < rows; r++)
        s_row_grouped_out(codes + (size_t)r * code_stride, bits, n,
                          params + (size_t)r * param_stride, group, out_dtype,
                          o + (size_t)r * out_stride);
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
