/* fp16 and bf16 <-> fp32 conversion, branch-free so that loops over arrays vectorize. */
#ifndef KVEDGE_STORE_HALF_H
#define KVEDGE_STORE_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t kvedge_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float kvedge_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN included).
 * Normal and subnormal halves are both rebuilt with float arithmetic and the right one is
 * selected, which keeps the function free of data-dependent branches. */
static inline float kvedge_fp16_to_f32(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    /* Normal: move exponent and mantissa into place, rebias by scaling with 2^-112. */
    const float normal = kvedge_f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    /* Subnormal: put the mantissa under a 0.5 exponent and subtract 0.5. */
    const float subnormal = kvedge_f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t bits = two_w < (1u << 27) ? kvedge_f32_bits(subnormal) : kvedge_f32_bits(normal);
    return kvedge_f32_from_bits(sign | bits);
}

/* binary32 -> binary16, round to nearest even; overflow gives inf, NaN stays NaN. */
static inline uint16_t kvedge_f32_to_fp16(float f)
{
    const uint32_t w = kvedge_f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    /* Scaling up then down lets the FPU do the rounding of the mantissa for us; values too
     * large for binary16 overflow to infinity on the way up. */
    float base = (kvedge_f32_from_bits(w & 0x7FFFFFFFu) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t bias = shl1_w & 0xFF000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    base = kvedge_f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = kvedge_f32_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    /* NaN: quiet, keeping the top payload bits, exactly as F16C's vcvtps2ph does. */
    const uint32_t nan = 0x7E00u | ((w >> 13) & 0x03FFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? nan : nonsign));
}

static inline float kvedge_bf16_to_f32(uint16_t h)
{
    return kvedge_f32_from_bits((uint32_t)h << 16);
}

/* binary32 -> bfloat16, round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t kvedge_f32_to_bf16(float f)
{
    const uint32_t u = kvedge_f32_bits(f);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const int is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    return (uint16_t)(is_nan ? ((u >> 16) | 0x40u) : rounded);
}

#endif
