/* The precision ladder (the cache optimizer, docs/block-format.md "Precisions"): a block of
 * one (chunk, layer, head) can be held, asked for and served at more than one precision.
 * A precision is one byte: a base rung (lossless, int8, int4 at a group size) and a ThinK
 * level (every key channel, 75 % or 50 % of them). Readers list the precisions they accept,
 * best first; a node serves the first it holds, or derives one from a finer block it holds
 * (kvedge_block_transcode). Pure functions on bytes: no RocksDB, no ZeroMQ. */
#ifndef KVEDGE_STORE_PREC_H
#define KVEDGE_STORE_PREC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/codec/block.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint8_t kvedge_prec_t;

/* "Whatever is stored": the block as it was put. Never a valid entry of an accept list; a
 * block whose encoding is none of the ladder's rungs (an int4 group of 16, a mask keeping
 * another share) classifies as this. */
#define KVEDGE_PREC_STORED 0u

/* Base rungs (bits 0..4), finest first. Lossless keeps the stored element type. */
#define KVEDGE_PREC_LOSSLESS  1u
#define KVEDGE_PREC_INT8      2u /* group 0: the whole axis */
#define KVEDGE_PREC_INT4_G32  3u
#define KVEDGE_PREC_INT4_G64  4u
#define KVEDGE_PREC_INT4_G128 5u
/* Transform-coded against the model's coding basis (scheme tc, block version 3, basis.h):
 * lossy, coarser than int8 in bytes but not in the int4 order, so it stands apart: made from
 * lossless or int8 (or tc) only, nothing but tc made from it; every key channel, never EC. */
#define KVEDGE_PREC_TC        6u
#define KVEDGE_PREC_BASE_MASK 0x1Fu
#define KVEDGE_PREC_BASE_MAX  6u

/* ThinK level (bits 5..6): 0 every key channel, 1 keep 75 %, 2 keep 50 %. */
#define KVEDGE_PREC_THINK_SHIFT 5
#define KVEDGE_PREC_THINK_MASK  0x60u
#define KVEDGE_PREC_THINK_NONE  0u
#define KVEDGE_PREC_THINK_75    1u
#define KVEDGE_PREC_THINK_50    2u
#define KVEDGE_PREC_THINK_MAX   2u

/* Bit 7: the body is entropy-coded ("+ec": block version 2, access/codec/ecbody.h), the same
 * values as the rung without it in fewer bytes, decoded at a measured cost. int8 and int4
 * bases only. Peers that predate it refuse such a rung as invalid. */
#define KVEDGE_PREC_EC 0x80u

/* Block bytes of an "+ec" rung per byte of the same rung plain (medians over the trained
 * models' blocks of 256 tokens, both pairs), and the client's extra decode time per byte
 * received (median of 3 runs of the decode ns per raw byte, divided by the ratio), measured by
 * `build/bench/bench_entropy` from the repository root (docs/benchmarks.md "Entropy coding of
 * quantized blocks"). */
#define KVEDGE_PREC_EC_RATIO_INT8              0.985
#define KVEDGE_PREC_EC_RATIO_INT4              0.950
#define KVEDGE_PREC_EC_DECODE_US_PER_BYTE_INT8 0.00168
#define KVEDGE_PREC_EC_DECODE_US_PER_BYTE_INT4 0.00614

/* The tc rung's block bytes per byte of the same block at int8 stored plain, and the client's
 * decode time per received byte (µs), measured (docs/benchmarks.md "The tc rung in the
 * product"). The ratio: the mean over the four trained models of tc's bytes over int8's on 24
 * held-out documents at the committed bases' step (0.254 OPT cloud, 0.242 OPT edge, 0.362
 * Llama cloud, 0.351 Llama edge), `kvedge eval ... --schemes int8,int4-g32,int4-g32+ec,tc`.
 * The decode: the median of 3 runs of `build/bench/bench_entropy` (its tc table, "decode us
 * per coded byte": kvedge_block_decode to fp16 on one core, 43-49 MB/s of coded bytes in). */
#define KVEDGE_PREC_TC_RATIO              0.302
#define KVEDGE_PREC_TC_DECODE_US_PER_BYTE 0.021

#define KVEDGE_PREC_MAKE(base, think)                                                              \
    ((kvedge_prec_t)((base) | ((think) << KVEDGE_PREC_THINK_SHIFT)))
#define KVEDGE_PREC_BASE(p)  ((unsigned)(p)&KVEDGE_PREC_BASE_MASK)
#define KVEDGE_PREC_THINK(p) (((unsigned)(p)&KVEDGE_PREC_THINK_MASK) >> KVEDGE_PREC_THINK_SHIFT)
#define KVEDGE_PREC_IS_EC(p) (((unsigned)(p)&KVEDGE_PREC_EC) != 0)

/* Precisions one accept list holds at most, and the longest name with its NUL
 * ("int4-g128+think-75+ec" is 22). */
#define KVEDGE_PREC_MAX_ACCEPT 8
#define KVEDGE_PREC_NAME_BYTES 24

/* True for a ladder rung: base 1..5, ThinK 0..2, bit 7 (EC) only with base int8..int4-g128;
 * or tc alone (no ThinK, no EC). KVEDGE_PREC_STORED is not. */
bool kvedge_prec_valid(kvedge_prec_t p);

/* The rung's encoding: scheme, group size (0 for lossless and int8) and the key channels it
 * keeps of head_dim (round(head_dim x 75 / 100) or round(head_dim / 2), halves rounded up, at
 * least 1 and at most head_dim, as kvedge eval's keep_pct; head_dim without ThinK). A rung
 * whose count is head_dim (think-75 at head_dim <= 2, either level at head_dim 1) is encoded
 * without a mask. Undefined for an invalid p (callers check kvedge_prec_valid first). */
kvedge_scheme_t kvedge_prec_scheme(kvedge_prec_t p);
/* Key channels a ThinK share of pct percent keeps of head_dim: round(head_dim x pct / 100),
 * at least 1, at most head_dim (the rounding every keep count uses: the ladder's rungs and
 * kvedge eval's think-P schemes). */
uint32_t kvedge_prec_keep_share(uint32_t pct, uint32_t head_dim);
uint16_t kvedge_prec_group(kvedge_prec_t p);
uint32_t kvedge_prec_keep_channels(kvedge_prec_t p, uint32_t head_dim);

/* "lossless", "int8", "int4-g32", "int4-g64", "int4-g128", each optionally followed by
 * "+think-75" or "+think-50", then for an EC rung "+ec" ("int4-g32+think-50+ec"); "tc"; "stored"
 * for KVEDGE_PREC_STORED; "?" for anything else. Static storage. The grammar is kvedge eval's
 * scheme names restricted to the ladder, plus the coding suffix. */
const char *kvedge_prec_name(kvedge_prec_t p);
/* Parses a name as printed (not "stored"), exactly: no spaces, case or other suffixes;
 * "int4" alone is int4-g32. 0 or KVEDGE_EINVAL (NULL, anything else; *out untouched). */
int kvedge_prec_parse(const char *name, kvedge_prec_t *out);

/* An accept list: 1..KVEDGE_PREC_MAX_ACCEPT valid rungs, no rung twice. 0 or KVEDGE_EINVAL
 * (empty, too long, an unknown rung or KVEDGE_PREC_STORED, a duplicate). */
int kvedge_prec_list_check(const kvedge_prec_t *list, size_t n);
/* Parses "int8,int4-g32+think-50,...", best first, into out (at most max entries), checks
 * it as kvedge_prec_list_check and writes the count to *n. KVEDGE_EINVAL on anything else
 * (NULL, an empty entry, more than max entries); out and *n are untouched then. */
int kvedge_prec_list_parse(const char *csv, kvedge_prec_t *out, size_t max, size_t *n);

/* The rung a verified block is encoded at, read from its header: scheme, group size, the
 * share of key channels its mask keeps (exactly the rung's kvedge_prec_keep_channels count)
 * and, for an entropy-coded body, KVEDGE_PREC_EC;
 * KVEDGE_PREC_STORED when it matches no rung (or info is NULL). An int4 block whose group
 * covers the whole token and channel axes is still classified by its group field. Where a
 * count fits more than one ThinK level the shallowest wins, since the deeper ones derive from
 * it: a mask keeping all head_dim channels is no ThinK, and at head_dim 3 (75 % and 50 % both
 * keep 2) a mask of 2 is think-75. So at head_dim <= 3 a block put at one level can classify
 * as a shallower one holding the same bytes. */
kvedge_prec_t kvedge_prec_of_block(const kvedge_block_info_t *info);
/* The same from the fields a block's metadata keeps: scheme, group size, key channels stored
 * (head_dim when the block has no mask) and head_dim. */
kvedge_prec_t kvedge_prec_of_shape(kvedge_scheme_t scheme, uint16_t group_size,
                                   uint32_t key_channels, uint32_t head_dim);

/* True when a block at rung `to` can be derived from one at rung `from` without putting back
 * anything `from` lost: the base is the same or coarser (lossless < int8 < int4-g32 < g64 <
 * g128) and the ThinK level the same or deeper; the coding (EC) may differ either way, it
 * loses nothing. tc derives from lossless, int8 (with or without EC, without ThinK) and tc;
 * nothing but tc derives from tc. from == to is derivable. False for any invalid rung. */
bool kvedge_prec_derivable(kvedge_prec_t from, kvedge_prec_t to);

/* Bytes per fp16 byte of a rung for a head of head_dim channels and `tokens` tokens, without
 * lz4 (the planner's price of a precision from a block size it knows at another): the exact
 * encoded size of kvedge_block_encoded_bound for that shape (header, mask, params, codes,
 * checksum; lossless at element size elem_bytes, 2 or 4), divided by
 * kvedge_block_fp16_bytes; for an EC rung that of the plain rung times its measured
 * KVEDGE_PREC_EC_RATIO_*; for tc int8's times KVEDGE_PREC_TC_RATIO. 0 for an invalid rung,
 * shape or elem_bytes. */
double kvedge_prec_bytes_per_fp16(kvedge_prec_t p, uint32_t tokens, uint32_t head_dim,
                                  size_t elem_bytes);

/* The client's time per received byte to decode rung p's body beyond a plain block's, in µs:
 * KVEDGE_PREC_EC_DECODE_US_PER_BYTE_* for an EC rung, KVEDGE_PREC_TC_DECODE_US_PER_BYTE for tc,
 * 0 for any other. */
double kvedge_prec_decode_us_per_byte(kvedge_prec_t p);

/* Re-encodes a verified block at rung `to` (kvedge_prec_derivable from the block's own rung):
 * decodes it to its element type, chooses the ThinK mask as the prefill does, encodes with the
 * block's dtype, and with lz4 when `lz4` is set and it pays. The output is the bytes a put at
 * rung `to` of the decoded values would store. *out is malloc'd (free it), *out_len its
 * length.
 * The mask: the source's own when it keeps the count `to` keeps; else kvedge_synth_key_mask
 * (the channels of largest mean |K|, over the decoded keys as fp32) restricted to the channels
 * the source kept (dropped ones decode as 0, so they only tie with an all-zero kept channel).
 * So from a lossless block the output is byte for byte a direct put at `to` of the same values
 * with the mask chosen over them as stored (a prefill choosing over fp32 keys before rounding
 * them to the dtype can differ where two channels' sums are within that rounding).
 * A `to` that differs from the block's rung only in its coding (EC) is kvedge_block_recode of
 * the block: the same values, no requantization; an EC `to` otherwise is the plain rung's
 * transcode, then coded. From a quantized block the values are requantized: int8 -> int4 is int4 of
 * the int8-decoded values, whose error against the original adds the int8 error to a direct int4
 * put's (RMS within 2 %, largest error within twice the int8 error:
 * tests/access/codec/test_prec.c). A block off the ladder (KVEDGE_PREC_STORED) derives only rungs
 * without ThinK whose scheme is coarser than its own (int4 from int8 at another group size), and
 * only when it has no mask. `to` tc needs the block's location (kvedge_block_transcode_at): here
 * it is KVEDGE_ENOBASIS, but from a tc block, whose copy it is. Errors: KVEDGE_EINVAL (NULL,
 * `to` invalid or not derivable from the block, values `to` cannot hold: fp32 beyond the fp16
 * range of quantization params), KVEDGE_ECORRUPT (an lz4 body that does not decompress),
 * KVEDGE_ENOBASIS, KVEDGE_ENOMEM; *out is NULL and nothing allocated then. */
int kvedge_block_transcode(const kvedge_block_info_t *in, kvedge_prec_t to, bool lz4, uint8_t **out,
                           size_t *out_len);

/* kvedge_block_transcode for a block of model_id's (layer, head): the same for every rung but
 * tc; for tc, the block decoded to fp32 and coded with kvedge_block_encode_tc against the
 * model's registered basis (kvedge_basis_find_model), at the block's dtype (a tc block is
 * copied as it is; lz4 does not apply). Errors: those of kvedge_block_transcode, and for tc
 * KVEDGE_EINVAL (model_id NULL), KVEDGE_ENOBASIS (no basis of the model registered),
 * KVEDGE_ESHAPE (layer, head or head_dim outside the basis). */
int kvedge_block_transcode_at(const kvedge_block_info_t *in, kvedge_prec_t to, bool lz4,
                              const char *model_id, uint32_t layer, uint32_t head, uint8_t **out,
                              size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
