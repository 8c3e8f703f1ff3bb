/* Synthetic KV caches that look like real ones: Gaussian values, and keys with a few outlier
 * channels of large magnitude and offset, as measured in real LLM keys (the reason KIVI
 * quantizes keys per channel). Deterministic for a seed. */
#ifndef KVEDGE_STORE_SYNTH_H
#define KVEDGE_STORE_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "access/codec/block.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fraction of key channels that are outliers, and their scale relative to the rest. */
#define KVEDGE_SYNTH_OUTLIER_PERMILLE 60
#define KVEDGE_SYNTH_OUTLIER_SCALE    8.0f

typedef struct {
    uint64_t s[4];
} kvedge_rng_t;

void kvedge_rng_seed(kvedge_rng_t *r, uint64_t seed);
uint64_t kvedge_rng_next(kvedge_rng_t *r);
/* Standard normal sample. */
float kvedge_rng_normal(kvedge_rng_t *r);

/* Each returns 0 or KVEDGE_ENOMEM. */

/* Fills K and V ([tokens][head_dim] floats) for one head. The outlier channels depend on
 * seed only (as a real head's do), the values on seed and token_offset. */
int kvedge_synth_head_f32(uint64_t seed, uint32_t token_offset, uint32_t tokens, uint32_t head_dim,
                          float *k, float *v);

/* The same, converted to dtype (k and v hold tokens * head_dim elements of it). */
int kvedge_synth_head(uint64_t seed, uint32_t token_offset, uint32_t tokens, uint32_t head_dim,
                      kvedge_dtype_t dtype, void *k, void *v);

/* A ThinK-style key-channel mask keeping the `keep` channels of largest mean |K| over the
 * given keys ([tokens][head_dim] floats). mask has (head_dim + 7) / 8 bytes. */
int kvedge_synth_key_mask(const float *k, uint32_t tokens, uint32_t head_dim, uint32_t keep,
                          uint8_t *mask);

/* The same for the K of a rotary model (Hugging Face's rotate-half layout): channels j and
 * j + head_dim / 2 rotate together and are kept or dropped together, a pair ranked by the sum
 * of both channels' mean |K| (ties: the lower pair). keep is rounded down to even (at least
 * 2). Errors: KVEDGE_EINVAL (NULL, head_dim odd or 0), KVEDGE_ENOMEM. */
int kvedge_synth_key_mask_pairs(const float *k, uint32_t tokens, uint32_t head_dim, uint32_t keep,
                                uint8_t *mask);

#ifdef __cplusplus
}
#endif
#endif
