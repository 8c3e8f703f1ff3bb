/* The entropy-coded body of a quantized block (flag EC of access/codec/block.h; the byte layout
 * is docs/block-format.md "Entropy-coded body"): each of the four sections of the raw body,
 * optionally rearranged by a transform, as one rANS stream of htscodecs (the CRAM 3.1
 * rANS-Nx16 codec: static frequency tables inside the stream). Used by block.c; the bench and
 * the tests call it directly to compare transforms. */
#ifndef KVEDGE_CODEC_ECBODY_H
#define KVEDGE_CODEC_ECBODY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sections of a quantized body, in order: K params, V params, K codes, V codes. */
#define KVEDGE_EC_SECTIONS 4
/* Bytes a section record adds before its stream: transform (1) and stream length (u32). */
#define KVEDGE_EC_RECORD_BYTES 5
/* Most a coded body may exceed its raw body by: each stream that does not pay is stored as it
 * is (htscodecs' CAT: an order byte and the length, at most 6 bytes) after its record. */
#define KVEDGE_EC_OVERHEAD_BYTES 64

/* Transforms of a section before it is coded. Params sections and int8 codes use NONE only. */
#define KVEDGE_EC_XF_NONE 0 /* the section's bytes as in the raw body */
/* int4 codes only: one code per byte, in the order of the rows ([tokens][channels]), so the
 * coder's symbols are codes and not pairs of them. */
#define KVEDGE_EC_XF_UNPACK 1
#define KVEDGE_EC_XF_MAX    1

/* The rANS order the encoder asks htscodecs for (the decoder reads it from the stream); the
 * stream may also use htscodecs' STRIPE, PACK, RLE and X32 layouts. */
#define KVEDGE_EC_ORDER0 0x00
#define KVEDGE_EC_ORDER1 0x01

/* The shape a body's sections follow (from the block header). */
typedef struct {
    uint32_t tokens;
    uint32_t key_channels;            /* K codes per row */
    uint32_t head_dim;                /* V codes per row */
    unsigned bits;                    /* 8 or 4 */
    uint64_t len[KVEDGE_EC_SECTIONS]; /* raw bytes of each section */
} kvedge_ec_shape_t;

/* The encoder's choice per section: transform and rANS order flags (KVEDGE_EC_ORDER* | htscodecs'
 * RANS_ORDER_* bits). */
typedef struct {
    uint8_t xf[KVEDGE_EC_SECTIONS];
    int order[KVEDGE_EC_SECTIONS];
} kvedge_ec_choice_t;

/* The choice blocks of `bits`-bit codes are coded with (measured by bench_entropy,
 * docs/benchmarks.md "Entropy coding"). */
void kvedge_ec_choice_default(kvedge_ec_choice_t *c, unsigned bits);

/* Upper bound of a coded body for a shape: the raw bytes plus KVEDGE_EC_OVERHEAD_BYTES. */
size_t kvedge_ec_bound(const kvedge_ec_shape_t *s);

/* Codes a raw body (sum of s->len bytes) into out (capacity out_cap >= kvedge_ec_bound), with
 * choice c (NULL: the default for s->bits). A section whose transformed stream would not be smaller
 * than the section is stored untransformed, so the result never exceeds the bound. Errors:
 * KVEDGE_EINVAL (bad shape or choice), KVEDGE_ENOSPACE, KVEDGE_ENOMEM. */
int kvedge_ec_encode(const kvedge_ec_shape_t *s, const uint8_t *raw, const kvedge_ec_choice_t *c,
                     uint8_t *out, size_t out_cap, size_t *out_len);

/* Decodes a coded body of in_len bytes into raw (the sum of s->len bytes). Every record must lie
 * inside in, the records must end exactly at in_len, each stream must decode to exactly its
 * section's (transformed) length and no more, and int4 codes must be < 16. Allocates a scratch
 * buffer for transformed sections. Errors: KVEDGE_ECORRUPT, KVEDGE_ENOMEM, KVEDGE_EINVAL. */
int kvedge_ec_decode(const kvedge_ec_shape_t *s, const uint8_t *in, size_t in_len, uint8_t *raw);

/* One rANS-Nx16 stream of the `len` bytes at in (0 < len <= UINT32_MAX / 2), at `order`
 * (KVEDGE_EC_ORDER* | htscodecs' layout bits), into a malloc'd buffer the caller frees; *out_len
 * its length. Errors: KVEDGE_EINVAL, KVEDGE_ENOMEM. */
int kvedge_ec_stream_encode(const uint8_t *in, uint64_t len, int order, uint8_t **out,
                            unsigned *out_len);

/* Decodes the n-byte stream at in into exactly `want` bytes at out, with the checks of
 * kvedge_ec_decode: only the layouts the encoders write (no PACK or RLE), no more and no fewer
 * bytes than want. Errors: KVEDGE_ECORRUPT, KVEDGE_EINVAL (want 0 or too large). */
int kvedge_ec_stream_decode(const uint8_t *in, uint32_t n, uint8_t *out, uint64_t want);

#ifdef __cplusplus
}
#endif
#endif
