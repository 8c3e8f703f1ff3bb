/* Rotary positions outside a forward pass (clients/decoder/decoder.h, "Rotary settings"): the
 * frequencies a model's settings give and the rotation of stored K, forwards and back, the
 * decoder's own arithmetic, so that large-small reuse (clients/e2e/adapter.h) can take a
 * cloud model's rotation off its K and put the edge model's on. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clients/decoder/decoder.h"
#include "access/codec/error.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

bool kvedge_decoder_rope_equal(const kvedge_decoder_rope_t *a, const kvedge_decoder_rope_t *b)
{
    if (!a || !b || a->rotary != b->rotary)
        return false;
    if (!a->rotary)
        return true;
    if (a->theta != b->theta || a->llama3 != b->llama3)
        return false;
    return !a->llama3 ||
           (a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
            a->high_freq_factor == b->high_freq_factor && a->original_max == b->original_max);
}

int kvedge_decoder_rope_check(const kvedge_decoder_rope_t *r)
{
    if (!r)
        return KVEDGE_EINVAL;
    if (!r->rotary)
        return KVEDGE_OK;
    if (!(r->theta >= 1 && r->theta <= 1e12))
        return KVEDGE_EINVAL;
    if (r->llama3 && !(r->factor > 0 && isfinite(r->factor) && r->low_freq_factor > 0 &&
                       r->high_freq_factor > r->low_freq_factor && isfinite(r->high_freq_factor) &&
                       r->original_max > 0 && isfinite(r->original_max)))
        return KVEDGE_EINVAL;
    return KVEDGE_OK;
}

int kvedge_decoder_rope_freqs(const kvedge_decoder_rope_t *r, uint32_t head_dim, float *inv_freq)
{
    if (!r || !inv_freq || !r->rotary || head_dim < 2 || head_dim % 2 != 0 ||
        head_dim > KVEDGE_DECODER_ROPE_HEAD_DIM_MAX || kvedge_decoder_rope_check(r) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    /* HF's rotary frequencies base^(-2i/d); Llama 3's rope_scaling divides the low ones by
     * factor and blends the middle band (transformers' _compute_llama3_parameters). */
    for (uint32_t i = 0; i < head_dim / 2; i++) {
        double f = 1.0 / pow(r->theta, 2.0 * i / head_dim);
        if (r->llama3) {
            const double wavelen = 2.0 * M_PI / f;
            const double low_wl = r->original_max / r->low_freq_factor;
            const double high_wl = r->original_max / r->high_freq_factor;
            if (wavelen > low_wl) {
                f /= r->factor;
            } else if (wavelen >= high_wl) {
                const double sm = (r->original_max / wavelen - r->low_freq_factor) /
                                  (r->high_freq_factor - r->low_freq_factor);
                f = (1.0 - sm) * f / r->factor + sm * f;
            }
        }
        inv_freq[i] = (float)f;
    }
    return KVEDGE_OK;
}

uint32_t kvedge_decoder_rope_fingerprint_of(const kvedge_decoder_rope_t *r, uint32_t head_dim)
{
    float inv_freq[KVEDGE_DECODER_ROPE_HEAD_DIM_MAX / 2];
    if (!r || !r->rotary || kvedge_decoder_rope_freqs(r, head_dim, inv_freq) != KVEDGE_OK)
        return 0;
    /* FNV-1a over the frequencies' bytes, as kvedge_decoder_rope_fingerprint. */
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < head_dim / 2; i++) {
        uint32_t bits;
        memcpy(&bits, &inv_freq[i], sizeof bits);
        for (int b = 0; b < 4; b++) {
            h ^= (bits >> (8 * b)) & 0xFFu;
            h *= 16777619u;
        }
    }
    return h ? h : 1;
}

int kvedge_decoder_rope_apply(const kvedge_decoder_rope_t *r, uint32_t head_dim, float *x,
                              uint32_t heads, uint32_t tokens, uint32_t pos0, bool inverse)
{
    if (!r || !x || heads == 0 || tokens == 0 || kvedge_decoder_rope_check(r) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    if (!r->rotary)
        return KVEDGE_OK;
    if ((uint64_t)pos0 + tokens > UINT32_MAX)
        return KVEDGE_EINVAL;
    float inv_freq[KVEDGE_DECODER_ROPE_HEAD_DIM_MAX / 2];
    int rc = kvedge_decoder_rope_freqs(r, head_dim, inv_freq);
    if (rc != KVEDGE_OK)
        return rc;
    const uint32_t half = head_dim / 2;
    float *cs = malloc((size_t)head_dim * sizeof(float));
    if (!cs)
        return KVEDGE_ENOMEM;
    /* As the decoder's forward: the angle and its sine in double, the turn in fp32. */
    for (uint32_t t = 0; t < tokens; t++) {
        for (uint32_t j = 0; j < half; j++) {
            const double a = (double)(pos0 + t) * inv_freq[j];
            cs[j] = (float)cos(a);
            cs[half + j] = (float)sin(a);
        }
        for (uint32_t h = 0; h < heads; h++) {
            float *row = x + ((size_t)h * tokens + t) * head_dim;
            for (uint32_t j = 0; j < half; j++) {
                const float x1 = row[j], x2 = row[half + j], c = cs[j], s = cs[half + j];
                if (inverse) {
                    row[j] = x1 * c + x2 * s;
                    row[half + j] = x2 * c - x1 * s;
                } else {
                    row[j] = x1 * c - x2 * s;
                    row[half + j] = x2 * c + x1 * s;
                }
            }
        }
    }
    free(cs);
    return KVEDGE_OK;
}
