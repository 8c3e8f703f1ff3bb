/* Transform-coded K/V sections (tcbody.h): a basis projection, one uniform step, rANS codes
 * with escapes, every length bounded by the shape. */
#include "access/codec/tcbody.h"

#include <htscodecs/rANS_static4x16.h>
#include <math.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/byteorder.h"
#include "access/codec/ecbody.h"
#include "access/codec/error.h"
#include "access/codec/half.h"
#include "access/codec/quant.h"

#define S_MAX_TOKENS 65536u
#define S_MAX_DIM    1024u

static bool s_shape_ok(const kvedge_tc_shape_t *s)
{
    return s && s->tokens >= 1 && s->tokens <= S_MAX_TOKENS && s->dim >= 1 && s->dim <= S_MAX_DIM;
}

size_t kvedge_tc_bound(const kvedge_tc_shape_t *s)
{
    if (!s_shape_ok(s))
        return 0;
    const size_t n = (size_t)s->tokens * s->dim;
    return KVEDGE_TC_HEAD_BYTES + 2u * s->dim + 4u +
           rans_compress_bound_4x16((unsigned)n, KVEDGE_EC_ORDER1) + 4u + 2u * n;
}

static uint32_t s_zigzag(int32_t q)
{
    return q >= 0 ? 2u * (uint32_t)q : 2u * (uint32_t)(-(int64_t)q) - 1u;
}

static int32_t s_unzigzag(uint32_t z)
{
    return (z & 1u) ? -(int32_t)((z + 1u) / 2u) : (int32_t)(z / 2u);
}

/* The fp16 channel means and the codes q [T][D] of x; *rank the components coded. */
static int s_quantize(const kvedge_tc_shape_t *s, const float *x, const float *fwd, float step,
                      uint16_t *m16, float *m, int32_t *q, uint32_t *rank)
{
    const uint32_t T = s->tokens, D = s->dim;
    for (uint32_t c = 0; c < D; c++) {
        double sum = 0;
        for (uint32_t t = 0; t < T; t++)
            sum += x[(size_t)t * D + c];
        m16[c] = kvedge_f32_to_fp16((float)(sum / T));
        m[c] = kvedge_fp16_to_f32(m16[c]);
        if (!isfinite(m[c]))
            return KVEDGE_EINVAL;
    }
    const float inv_step = 1.0f / step;
    uint32_t r = 0;
    for (uint32_t t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * D;
        for (uint32_t j = 0; j < D; j++) {
            float y = 0.0f;
            for (uint32_t c = 0; c < D; c++)
                y += (xt[c] - m[c]) * fwd[(size_t)c * D + j];
            const float v = floorf(y * inv_step + 0.5f);
            if (!(fabsf(v) <= (float)KVEDGE_TC_CODE_MAX)) /* also NaN */
                return KVEDGE_EINVAL;
            q[(size_t)t * D + j] = (int32_t)v;
            if (v != 0.0f && j + 1 > r)
                r = j + 1;
        }
    }
    *rank = r;
    return KVEDGE_OK;
}

/* Symbols of the first `rank` components in a layout (BANDS: component-major, as COMPONENT);
 * the escaped codes in symbol order. Returns the escape count. */
static size_t s_symbols(const kvedge_tc_shape_t *s, const int32_t *q, uint32_t rank, int layout,
                        uint8_t *sym, int16_t *esc)
{
    const uint32_t T = s->tokens, D = s->dim;
    size_t k = 0, e = 0;
    const bool tm = layout == KVEDGE_TC_LAYOUT_TOKEN;
    const uint32_t outer = tm ? T : rank, inner = tm ? rank : T;
    for (uint32_t a = 0; a < outer; a++)
        for (uint32_t b = 0; b < inner; b++) {
            const int32_t v = tm ? q[(size_t)a * D + b] : q[(size_t)b * D + a];
            const uint32_t z = s_zigzag(v);
            if (z >= KVEDGE_TC_ESCAPE) {
                sym[k++] = (uint8_t)KVEDGE_TC_ESCAPE;
                esc[e++] = (int16_t)v;
            } else {
                sym[k++] = (uint8_t)z;
            }
        }
    return e;
}

/* The streams of a layout: their symbol counts in n[] (at most KVEDGE_TC_MAX_STREAMS); returns
 * how many. BANDS cuts the components [0, rank) at D/8, D/4 and D/2 (empty bands dropped). */
static int s_streams(const kvedge_tc_shape_t *s, uint32_t rank, int layout, size_t *n)
{
    if (layout != KVEDGE_TC_LAYOUT_BANDS) {
        n[0] = (size_t)s->tokens * rank;
        return 1;
    }
    const uint32_t D = s->dim;
    const uint32_t cut[KVEDGE_TC_MAX_STREAMS + 1] = {0, D / 8, D / 4, D / 2, D};
    int k = 0;
    for (int b = 0; b < KVEDGE_TC_MAX_STREAMS; b++) {
        const uint32_t lo = cut[b] < rank ? cut[b] : rank,
                       hi = cut[b + 1] < rank ? cut[b + 1] : rank;
        if (hi > lo)
            n[k++] = (size_t)s->tokens * (hi - lo);
    }
    return k;
}

/* A layout's streams, each at the smaller of rANS orders 0 and 1, written from out + pos when
 * out is not NULL (capacity checked); returns their bytes (with their lengths) in *bytes. */
static int s_code_layout(const kvedge_tc_shape_t *s, uint32_t rank, int layout, const uint8_t *sym,
                         uint8_t *out, size_t cap, size_t pos, size_t *bytes)
{
    size_t n[KVEDGE_TC_MAX_STREAMS], off = 0, total = 0;
    const int k = s_streams(s, rank, layout, n);
    for (int i = 0; i < k; i++, off += n[i - 1]) {
        uint8_t *best = NULL;
        unsigned best_len = 0;
        for (int order = KVEDGE_EC_ORDER0; order <= KVEDGE_EC_ORDER1; order++) {
            uint8_t *st;
            unsigned len;
            int rc = kvedge_ec_stream_encode(sym + off, n[i], order, &st, &len);
            if (rc != KVEDGE_OK) {
                free(best);
                return rc;
            }
            if (best && len >= best_len) {
                free(st);
                continue;
            }
            free(best);
            best = st;
            best_len = len;
        }
        if (out && pos + total + 4u + best_len > cap) {
            free(best);
            return KVEDGE_ENOSPACE;
        }
        if (out) {
            kvedge_le_put32(out + pos + total, best_len);
            memcpy(out + pos + total + 4, best, best_len);
        }
        total += 4u + best_len;
        free(best);
    }
    *bytes = total;
    return KVEDGE_OK;
}

int kvedge_tc_encode(const kvedge_tc_shape_t *s, const float *x, const float *fwd, float step,
                     uint8_t *out, size_t out_cap, size_t *out_len)
{
    if (!s_shape_ok(s) || !x || !fwd || !out || !out_len)
        return KVEDGE_EINVAL;
    const uint16_t step16 = kvedge_f32_to_fp16(step);
    const float st = kvedge_fp16_to_f32(step16);
    if (!(st > 0.0f) || !isfinite(st))
        return KVEDGE_EINVAL;
    const uint32_t T = s->tokens, D = s->dim;
    const size_t n = (size_t)T * D;
    uint16_t *m16 = malloc(D * sizeof *m16);
    float *m = malloc(D * sizeof *m);
    int32_t *q = malloc(n * sizeof *q);
    uint8_t *sym = malloc(n);
    int16_t *esc = malloc(n * sizeof *esc), *esc_tmp = malloc(n * sizeof *esc_tmp);
    int rc = KVEDGE_ENOMEM;
    if (!m16 || !m || !q || !sym || !esc || !esc_tmp)
        goto out;
    uint32_t rank;
    rc = s_quantize(s, x, fwd, st, m16, m, q, &rank);
    if (rc != KVEDGE_OK)
        goto out;
    /* The smallest layout (sizes first, then the chosen one written). */
    int layout = KVEDGE_TC_LAYOUT_TOKEN;
    size_t best = SIZE_MAX, e = 0;
    for (int l = KVEDGE_TC_LAYOUT_TOKEN; rank > 0 && l <= KVEDGE_TC_LAYOUT_MAX; l++) {
        size_t bytes;
        const size_t ne = s_symbols(s, q, rank, l, sym, esc_tmp);
        rc = s_code_layout(s, rank, l, sym, NULL, 0, 0, &bytes);
        if (rc != KVEDGE_OK)
            goto out;
        if (bytes < best) {
            best = bytes;
            layout = l;
            e = ne;
        }
    }
    const size_t head = KVEDGE_TC_HEAD_BYTES + 2u * D;
    if (head > out_cap) {
        rc = KVEDGE_ENOSPACE;
        goto out;
    }
    out[0] = (uint8_t)layout;
    kvedge_le_put16(out + 1, (uint16_t)rank);
    kvedge_le_put16(out + 3, step16);
    for (uint32_t c = 0; c < D; c++)
        kvedge_le_put16(out + KVEDGE_TC_HEAD_BYTES + 2u * c, m16[c]);
    size_t pos = head;
    if (rank) {
        s_symbols(s, q, rank, layout, sym, esc);
        size_t bytes;
        rc = s_code_layout(s, rank, layout, sym, out, out_cap, pos, &bytes);
        if (rc == KVEDGE_OK && pos + bytes + 4u + 2u * e > out_cap)
            rc = KVEDGE_ENOSPACE;
        if (rc != KVEDGE_OK)
            goto out;
        pos += bytes;
        kvedge_le_put32(out + pos, (uint32_t)e);
        pos += 4;
        for (size_t i = 0; i < e; i++, pos += 2)
            kvedge_le_put16(out + pos, (uint16_t)esc[i]);
    }
    *out_len = pos;
out:
    free(esc_tmp);
    free(esc);
    free(sym);
    free(q);
    free(m);
    free(m16);
    return rc;
}

/* Reads the codes of a section with R > 0 (at in + pos) into y [T][D] as q * step; components
 * R.. stay 0. With y NULL, checks them only. */
static int s_read_codes(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len, size_t pos,
                        int layout, uint32_t rank, float st, float *y)
{
    const uint32_t T = s->tokens, D = s->dim;
    const size_t n = (size_t)T * rank;
    size_t sn[KVEDGE_TC_MAX_STREAMS], off = 0;
    const int k_streams = s_streams(s, rank, layout, sn);
    uint8_t *sym = malloc(n);
    if (!sym)
        return KVEDGE_ENOMEM;
    int rc = KVEDGE_OK;
    for (int i = 0; i < k_streams && rc == KVEDGE_OK; i++) {
        uint32_t len = 0;
        if (in_len - pos < 4 || (len = kvedge_le_get32(in + pos)) == 0 || len > in_len - pos - 4) {
            rc = KVEDGE_ECORRUPT;
            break;
        }
        pos += 4;
        rc = kvedge_ec_stream_decode(in + pos, len, sym + off, sn[i]);
        pos += len;
        off += sn[i];
    }
    size_t escapes = 0;
    for (size_t i = 0; i < n && rc == KVEDGE_OK; i++)
        escapes += sym[i] == KVEDGE_TC_ESCAPE;
    if (rc == KVEDGE_OK && (in_len - pos < 4 || kvedge_le_get32(in + pos) != escapes ||
                            in_len - pos - 4 != 2 * escapes))
        rc = KVEDGE_ECORRUPT;
    const uint8_t *e = in + pos + 4;
    const bool tm = layout == KVEDGE_TC_LAYOUT_TOKEN;
    const uint32_t outer = tm ? T : rank, inner = tm ? rank : T;
    size_t k = 0;
    for (uint32_t a = 0; a < outer && rc == KVEDGE_OK; a++)
        for (uint32_t b = 0; b < inner && rc == KVEDGE_OK; b++, k++) {
            int32_t v;
            if (sym[k] == KVEDGE_TC_ESCAPE) {
                v = (int16_t)kvedge_le_get16(e);
                e += 2;
                if (s_zigzag(v) < KVEDGE_TC_ESCAPE) /* not how the encoder writes it */
                    rc = KVEDGE_ECORRUPT;
            } else {
                v = s_unzigzag(sym[k]);
            }
            const size_t at = tm ? (size_t)a * D + b : (size_t)b * D + a;
            if (y)
                y[at] = (float)v * st;
        }
    free(sym);
    return rc;
}

/* x[t] = m + sum over j < rank of y[t][j] * inv[j], mul then add (the codec builds with
 * -ffp-contract=off), so the AVX2 copy below, which the compiler vectorizes eight channels
 * wide, gives the same bits as the generic one. */
static inline __attribute__((always_inline)) void s_transform_body(const kvedge_tc_shape_t *s,
                                                                   const float *m, const float *y,
                                                                   uint32_t rank, const float *inv,
                                                                   float *x)
{
    const uint32_t T = s->tokens, D = s->dim;
    for (uint32_t t = 0; t < T; t++) {
        const float *yt = y + (size_t)t * D;
        float *xt = x + (size_t)t * D;
        for (uint32_t c = 0; c < D; c++)
            xt[c] = m[c];
        for (uint32_t j = 0; j < rank; j++) {
            if (yt[j] == 0.0f)
                continue;
            const float *row = inv + (size_t)j * D;
            const float yj = yt[j];
            for (uint32_t c = 0; c < D; c++)
                xt[c] += yj * row[c];
        }
    }
}

static void s_transform(const kvedge_tc_shape_t *s, const float *m, const float *y, uint32_t rank,
                        const float *inv, float *x)
{
    s_transform_body(s, m, y, rank, inv, x);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) static void s_transform_avx2(const kvedge_tc_shape_t *s,
                                                             const float *m, const float *y,
                                                             uint32_t rank, const float *inv,
                                                             float *x)
{
    s_transform_body(s, m, y, rank, inv, x);
}
#else
#define s_transform_avx2 s_transform
#endif

/* Walks a section: header, means (into m when not NULL) and codes (into y [T][D] when not
 * NULL, zeroed by the caller); *rank gets R. Every check of the layout, none needing the basis. */
static int s_walk(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len, float *m, float *y,
                  uint32_t *rank_out)
{
    const uint32_t D = s->dim;
    if (in_len < KVEDGE_TC_HEAD_BYTES + 2u * D)
        return KVEDGE_ECORRUPT;
    const int layout = in[0];
    const uint32_t rank = kvedge_le_get16(in + 1);
    const float st = kvedge_fp16_to_f32(kvedge_le_get16(in + 3));
    if (layout > KVEDGE_TC_LAYOUT_MAX || rank > D || !(st > 0.0f) || !isfinite(st))
        return KVEDGE_ECORRUPT;
    for (uint32_t c = 0; c < D; c++) {
        const float mc = kvedge_fp16_to_f32(kvedge_le_get16(in + KVEDGE_TC_HEAD_BYTES + 2u * c));
        if (!isfinite(mc))
            return KVEDGE_ECORRUPT;
        if (m)
            m[c] = mc;
    }
    *rank_out = rank;
    const size_t pos = KVEDGE_TC_HEAD_BYTES + 2u * D;
    if (rank == 0)
        return in_len == pos ? KVEDGE_OK : KVEDGE_ECORRUPT;
    return s_read_codes(s, in, in_len, pos, layout, rank, st, y);
}

int kvedge_tc_check(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len)
{
    if (!s_shape_ok(s) || !in)
        return KVEDGE_EINVAL;
    uint32_t rank;
    return s_walk(s, in, in_len, NULL, NULL, &rank);
}

int kvedge_tc_decode(const kvedge_tc_shape_t *s, const uint8_t *in, size_t in_len, const float *inv,
                     float *x)
{
    if (!s_shape_ok(s) || !in || !inv || !x)
        return KVEDGE_EINVAL;
    const uint32_t T = s->tokens, D = s->dim;
    if (in_len < KVEDGE_TC_HEAD_BYTES + 2u * D)
        return KVEDGE_ECORRUPT; /* before allocating anything */
    float *m = malloc(D * sizeof *m);
    float *y = calloc((size_t)T * D, sizeof *y);
    int rc = KVEDGE_ENOMEM;
    uint32_t rank = 0;
    if (!m || !y)
        goto out;
    rc = s_walk(s, in, in_len, m, y, &rank);
    if (rc != KVEDGE_OK)
        goto out;
    if (kvedge_quant_simd(-1))
        s_transform_avx2(s, m, y, rank, inv, x);
    else
        s_transform(s, m, y, rank, inv, x);
out:
    free(y);
    free(m);
    return rc;
}
