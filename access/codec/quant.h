/* Asymmetric integer quantization of KV rows (CPU reference): K per channel, V per token,
 * in groups (KIVI). Params are (scale, min) pairs stored as fp16; x ~ code * scale + min. */
#ifndef KVEDGE_STORE_QUANT_H
#define KVEDGE_STORE_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Hot loops get an AVX2 clone chosen at load time, so one binary runs everywhere and still
 * uses wide vectors where the CPU has them. GCC only: clang 14 emits no resolver for exported
 * clones in a static library. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(KVEDGE_NO_CLONES)
#define KVEDGE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KVEDGE_VECTOR_CLONES
#endif

/* Groups along an axis of n elements for group size g (0 = the whole axis). */
static inline uint32_t kvedge_quant_groups(uint32_t n, uint32_t g)
{
    return (g == 0 || g >= n) ? 1u : (n + g - 1) / g;
}

/* Bytes of one row of n codes at `bits` (8 or 4) bits per code. */
static inline size_t kvedge_quant_row_bytes(uint32_t n, unsigned bits)
{
    return bits == 8 ? (size_t)n : ((size_t)n + 1) / 2;
}

/* Quantizes keys x[tokens][head_dim] (row-major, in dtype of access/codec/block.h): per channel,
 * over groups of `group` tokens (0 = all). kept lists the `channels` channels to keep (NULL:
 * all, channels == head_dim; each < head_dim, ascending is the fast case). params:
 * [groups][channels] (scale, min) fp16 pairs; codes: `tokens` rows of
 * kvedge_quant_row_bytes(channels, bits). Returns 0, or KVEDGE_EINVAL for bad arguments, a
 * non-finite input or a range fp16 cannot hold (params and codes then hold partial output).
 * Where a range ends at +-0, the zero met first (in token order) gives the sign of min. */
int kvedge_quant_keys(int dtype, const void *x, uint32_t tokens, uint32_t head_dim,
                      const uint16_t *kept, uint32_t channels, uint32_t group, unsigned bits,
                      uint16_t *params, uint8_t *codes);

/* Quantizes values x[tokens][channels] in dtype: per token, over groups of `group` channels.
 * params: [tokens][groups] pairs. Same errors and zero rule (channel order) as
 * kvedge_quant_keys. */
int kvedge_quant_values(int dtype, const void *x, uint32_t tokens, uint32_t channels,
                        uint32_t group, unsigned bits, uint16_t *params, uint8_t *codes);

/* Expands one group's fp16 (scale, min) pairs into float arrays of n entries. */
void kvedge_quant_params_expand(const uint16_t *params, uint32_t n, float *scale, float *min);

/* Expands one token's value params (groups of `group` channels) to per-channel arrays. */
void kvedge_quant_params_expand_grouped(const uint16_t *params, uint32_t channels, uint32_t group,
                                        float *scale, float *min);

/* out[c] = code[c] * scale[c] + min[c] for one row of n codes (n <= KVEDGE_BLOCK_MAX_HEAD_DIM
 * for 4-bit rows). */
void kvedge_dequant_row(const uint8_t *codes, unsigned bits, uint32_t n, const float *scale,
                        const float *min, float *out);

/* Widening of a channel-pruned row back to head_dim: kept channel j goes to idx[j], dropped
 * channels become 0. The plan is made once per mask. */
typedef struct {
    uint32_t head_dim;
    uint32_t kept;
    uint16_t idx[1024];   /* kept channel indices, ascending */
    uint16_t start[64];   /* per 16-channel lane: first compact position it draws from */
    uint8_t ctrl[64][16]; /* per lane: byte shuffle from compact to wide (0x80 = zero) */
} kvedge_expand_plan_t;

/* mask: head_dim bits, LSB-first, as in the block format. */
void kvedge_expand_plan(const uint8_t *mask, uint32_t head_dim, kvedge_expand_plan_t *plan);

/* wide[0 .. head_dim rounded up to 16) from compact[0 .. plan->kept). */
void kvedge_expand_u8(const kvedge_expand_plan_t *plan, const uint8_t *compact, uint8_t *wide);

/* Unpacks n 4-bit codes (two per byte, low nibble first) into one byte each. */
void kvedge_quant_unpack4(const uint8_t *codes, uint32_t n, uint8_t *out);

/* Dequantizes one row straight into out_dtype (a dtype of access/codec/block.h): per-element params
 * (keys), or fp16 (scale, min) pairs for groups of `group` channels (values). n is at most
 * KVEDGE_BLOCK_MAX_HEAD_DIM. */
void kvedge_dequant_row_out(const uint8_t *codes, unsigned bits, uint32_t n, const float *scale,
                            const float *min, int out_dtype, void *out);
void kvedge_dequant_row_grouped_out(const uint8_t *codes, unsigned bits, uint32_t n,
                                    const uint16_t *params, uint32_t group, int out_dtype,
                                    void *out);

/* The same over `rows` rows: code rows code_stride bytes apart, output rows out_stride bytes
 * apart; keys with one set of per-element params (a token group), values with row r's pairs at
 * params + r * param_stride. What a run of tokens of a block costs without a call per row. */
void kvedge_dequant_rows_out(const uint8_t *codes, size_t code_stride, uint32_t rows, unsigned bits,
                             uint32_t n, const float *scale, const float *min, int out_dtype,
                             void *out, size_t out_stride);
void kvedge_dequant_rows_grouped_out(const uint8_t *codes, size_t code_stride, uint32_t rows,
                                     unsigned bits, uint32_t n, const uint16_t *params,
                                     size_t param_stride, uint32_t group, int out_dtype, void *out,
                                     size_t out_stride);

/* SIMD kernels (AVX2 + F16C, chosen from CPUID: conversions, dequantization, and the fused
 * one-read-per-pass quantization of keys and values) give the same bits as the generic loops.
 * enable 0 forces the generic loops, 1 re-detects, -1 only asks. Returns 1 when the SIMD
 * kernels are in use. For tests and benchmarks; thread-safe. */
int kvedge_quant_simd(int enable);

/* Element conversion of n values between a dtype (see access/codec/block.h) and fp32. */
void kvedge_convert_to_f32(int dtype, const void *src, size_t n, float *dst);
void kvedge_convert_from_f32(int dtype, const float *src, size_t n, void *dst);

#ifdef __cplusplus
}
#endif
#endif
