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
    if (bits == 8) {
        s_quantize_row(x, n, inv, min, 255.0f, codes);
    } else {
        s_quantize_row(x, n, inv, min, 15.0f, tmp);
        s_pack_nibbles(tmp, n, codes);
    }
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
        for (uint32_t c = 0; c < channels && rc == KVEDGE_OK; c++) {
            rc = bad[c] == 0.0f
                     ? s_make_params(lo[c], hi[c], qmax, p + 2 * c, &scale[c], &inv[c], &min[c])
                     : KVEDGE_EINVAL;
        }
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
    float *buf = malloc(sizeof(float) * 3 * channels + channels);
    if (!buf)
        return KVEDGE_ENOMEM;
    float *inv = buf, *min = inv + channels, *scratch = min + channels;
    uint8_t *tmp = (uint8_t *)(scratch + channels);
    int rc = KVEDGE_OK;
    for (uint32_t t = 0; t < tokens && rc == KVEDGE_OK; t++) {
        const float *r = x + (size_t)t * channels;
        uint16_t *p = params + (size_t)t * ngroups * 2;
        for (uint32_t gi = 0; gi < ngroups && rc == KVEDGE_OK; gi++) {
            uint32_t c0 = gi * g, n = channels - c0 < g ? channels - c0 : g;
            float lo = r[c0], hi = r[c0], bad = 0.0f, s, iv, m;
            for (uint32_t c = c0; c < c0 + n; c++) {
                lo = r[c] < lo ? r[c] : lo;
                hi = r[c] > hi ? r[c] : hi;
                bad += r[c] - r[c];
            }
            rc = bad == 0.0f ? s_make_params(lo, hi, qmax, p + 2 * gi, &s, &iv, &m) : KVEDGE_EINVAL;
            for (uint32_t c = c0; c < c0 + n; c++) {
                inv[c] = iv;
                min[c] = m;
            }
        }
        if (rc == KVEDGE_OK)
            s_emit_row(r, channels, inv, min, bits, tmp, codes + (size_t)t * row_bytes);
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
void kvedge_dequant_row(const uint8_t *codes, unsigned bits, uint32_t n, const float *scale,
                        const float *min, float *out)
{
    if (bits == 8) {
        for (uint32_t c = 0; c < n; c++)
            out[c] = (float)codes[c] * scale[c] + min[c];
        return;
    }
    uint32_t pairs = n / 2;
    for (uint32_t j = 0; j < pairs; j++) {
        out[2 * j] = (float)(codes[j] & 15) * scale[2 * j] + min[2 * j];
        out[2 * j + 1] = (float)(codes[j] >> 4) * scale[2 * j + 1] + min[2 * j + 1];
    }
    if (n & 1)
        out[n - 1] = (float)(codes[pairs] & 15) * scale[n - 1] + min[n - 1];
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
