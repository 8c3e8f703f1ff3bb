/* Synthetic, realistic-looking KV data for demos, tests and benchmarks. */
#include "access/codec/synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"
#include "access/codec/quant.h"

static uint64_t s_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void kvedge_rng_seed(kvedge_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = s_splitmix(&seed);
}

static uint64_t s_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
uint64_t kvedge_rng_next(kvedge_rng_t *r)
{
    uint64_t *s = r->s;
    const uint64_t result = s_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl(s[3], 45);
    return result;
}

float kvedge_rng_normal(kvedge_rng_t *r)
{
    /* Box-Muller; u1 in (0, 1] so the log is finite. */
    double u1 = ((kvedge_rng_next(r) >> 11) + 1) * 0x1.0p-53;
    double u2 = (kvedge_rng_next(r) >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int kvedge_synth_head_f32(uint64_t seed, uint32_t token_offset, uint32_t tokens, uint32_t head_dim,
                          float *k, float *v)
{
    kvedge_rng_t r;
    /* Per-channel character of this head: outlier channels have a large scale and offset. */
    float *scale = malloc(sizeof(float) * head_dim * 2);
    if (!scale)
        return KVEDGE_ENOMEM;
    float *offset = scale + head_dim;
    kvedge_rng_seed(&r, seed);
    for (uint32_t c = 0; c < head_dim; c++) {
        int outlier = (kvedge_rng_next(&r) % 1000) < KVEDGE_SYNTH_OUTLIER_PERMILLE;
        scale[c] = outlier ? KVEDGE_SYNTH_OUTLIER_SCALE : 1.0f;
        offset[c] = outlier ? KVEDGE_SYNTH_OUTLIER_SCALE * kvedge_rng_normal(&r) : 0.0f;
    }
    kvedge_rng_seed(&r, seed ^ (0xA5A5A5A5ull * (token_offset + 1)));
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t c = 0; c < head_dim; c++) {
            size_t i = (size_t)t * head_dim + c;
            k[i] = offset[c] + scale[c] * kvedge_rng_normal(&r);
            v[i] = kvedge_rng_normal(&r);
        }
    free(scale);
    return KVEDGE_OK;
}

int kvedge_synth_head(uint64_t seed, uint32_t token_offset, uint32_t tokens, uint32_t head_dim,
                      kvedge_dtype_t dtype, void *k, void *v)
{
    size_t n = (size_t)tokens * head_dim;
    float *buf = malloc(sizeof(float) * n * 2);
    if (!buf)
        return KVEDGE_ENOMEM;
    int rc = kvedge_synth_head_f32(seed, token_offset, tokens, head_dim, buf, buf + n);
    if (rc != KVEDGE_OK) {
        free(buf);
        return rc;
    }
    kvedge_convert_from_f32(dtype, buf, n, k);
    kvedge_convert_from_f32(dtype, buf + n, n, v);
    free(buf);
    return KVEDGE_OK;
}

int kvedge_synth_key_mask(const float *k, uint32_t tokens, uint32_t head_dim, uint32_t keep,
                          uint8_t *mask)
{
    double *mag = calloc(head_dim, sizeof(double));
    if (!mag)
        return KVEDGE_ENOMEM;
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t c = 0; c < head_dim; c++)
            mag[c] += fabs(k[(size_t)t * head_dim + c]);
    memset(mask, 0, ((size_t)head_dim + 7) / 8);
    if (keep > head_dim)
        keep = head_dim;
    for (uint32_t n = 0; n < keep; n++) {
        uint32_t best = 0;
        double best_mag = -1.0;
        for (uint32_t c = 0; c < head_dim; c++)
            if (!((mask[c >> 3] >> (c & 7)) & 1u) && mag[c] > best_mag) {
                best = c;
                best_mag = mag[c];
            }
        mask[best >> 3] |= (uint8_t)(1u << (best & 7));
    }
    free(mag);
    return KVEDGE_OK;
}

int kvedge_synth_key_mask_pairs(const float *k, uint32_t tokens, uint32_t head_dim, uint32_t keep,
                                uint8_t *mask)
{
    if (!k || !mask || head_dim == 0 || head_dim % 2 != 0)
        return KVEDGE_EINVAL;
    const uint32_t half = head_dim / 2;
    double *mag = calloc(half, sizeof(double));
    if (!mag)
        return KVEDGE_ENOMEM;
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t c = 0; c < head_dim; c++)
            mag[c % half] += fabs(k[(size_t)t * head_dim + c]);
    memset(mask, 0, ((size_t)head_dim + 7) / 8);
    uint32_t pairs = keep / 2;
    pairs = pairs < 1 ? 1 : pairs > half ? half : pairs;
    for (uint32_t n = 0; n < pairs; n++) {
        uint32_t best = 0;
        double best_mag = -1.0;
        for (uint32_t c = 0; c < half; c++)
            if (!((mask[c >> 3] >> (c & 7)) & 1u) && mag[c] > best_mag) {
                best = c;
                best_mag = mag[c];
            }
        mask[best >> 3] |= (uint8_t)(1u << (best & 7));
        mask[(best + half) >> 3] |= (uint8_t)(1u << ((best + half) & 7));
    }
    free(mag);
    return KVEDGE_OK;
}
