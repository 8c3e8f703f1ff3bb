/* The kvedge block: K and V of one head of one layer for one chunk of tokens, self-describing,
 * optionally quantized and channel-pruned, lz4-compressed when that pays or (quantized blocks)
 * entropy-coded with rANS, or transform-coded against a model's coding basis (scheme tc),
 * xxh3-checksummed.
 * The byte layout is specified in docs/block-format.md. */
#ifndef KVEDGE_STORE_BLOCK_H
#define KVEDGE_STORE_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access/codec/basis.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version 1: bodies as they are or lz4-compressed. Version 2: the body is entropy-coded (flag
 * EC); a block is written at version 2 only then, so readers of version 1 read every other
 * block and refuse a coded one as an unsupported version. Version 3: a transform-coded body
 * (scheme tc), written only for tc blocks, which readers of versions 1-2 refuse alike. */
#define KVEDGE_BLOCK_VERSION        1
#define KVEDGE_BLOCK_VERSION_EC     2
#define KVEDGE_BLOCK_VERSION_TC     3
#define KVEDGE_BLOCK_HEADER_BYTES   32
#define KVEDGE_BLOCK_CHECKSUM_BYTES 8
#define KVEDGE_BLOCK_MAX_TOKENS     65536
#define KVEDGE_BLOCK_MAX_HEAD_DIM   1024
/* Upper bound of a decoded body and of an encoded block; larger input is refused unread. */
#define KVEDGE_BLOCK_MAX_BYTES          (256u << 20)
#define KVEDGE_BLOCK_INT4_GROUP_DEFAULT 32

#define KVEDGE_BLOCK_FLAG_LZ4  0x01u
#define KVEDGE_BLOCK_FLAG_MASK 0x02u
/* The body is entropy-coded (access/codec/ecbody.h); quantized schemes only, never with LZ4. */
#define KVEDGE_BLOCK_FLAG_EC 0x04u

/* Bytes the key-channel mask occupies in a block: head_dim bits padded to 8-byte words, so
 * the body that follows stays aligned. */
#define KVEDGE_BLOCK_MASK_BYTES(head_dim) ((((size_t)(head_dim) + 63) / 64) * 8)

typedef enum {
    KVEDGE_DTYPE_FP16 = 1,
    KVEDGE_DTYPE_BF16 = 2,
    KVEDGE_DTYPE_FP32 = 3,
} kvedge_dtype_t;

typedef enum {
    KVEDGE_SCHEME_LOSSLESS = 0,
    KVEDGE_SCHEME_INT8 = 1, /* asymmetric 8-bit; K per channel, V per token */
    KVEDGE_SCHEME_INT4 = 2, /* asymmetric 4-bit, KIVI: K per channel, V per token, in groups */
    /* Transform-coded (lossy, entropy-coded) against a model's coding basis (basis.h): made by
     * kvedge_block_encode_tc only (kvedge_block_encode refuses it), block version 3. */
    KVEDGE_SCHEME_TC = 3,
} kvedge_scheme_t;

/* The body of a tc block: basis id u64 | layer u16 | head u16 | n_k u32 | K section (n_k
 * bytes, access/codec/tcbody.h) | V section (the rest, at least 1 byte). */
#define KVEDGE_BLOCK_TC_PREFIX_BYTES 16u

/* What to encode. K and V are both [tokens][head_dim] row-major in `dtype`. */
typedef struct {
    kvedge_dtype_t dtype;
    kvedge_scheme_t scheme;
    uint32_t tokens;
    uint16_t head_dim;
    /* Quantization group: K groups span this many tokens of one channel, V groups this many
     * channels of one token. 0 = the whole axis. Must be 0 for lossless. */
    uint16_t group_size;
    /* Key channels to keep (ThinK pruning): bitmap of head_dim bits, LSB-first; NULL keeps
     * every channel. Dropped key channels are not stored and decode as zero. */
    const uint8_t *key_mask;
    /* Try lz4 on the body and keep it only when it is smaller. An entropy-coded body is made
     * from an encoded block by kvedge_block_recode. */
    bool lz4;
} kvedge_block_spec_t;

/* A parsed, verified block. Pointers point into the buffer given to kvedge_block_parse. */
typedef struct {
    uint8_t version;
    kvedge_dtype_t dtype;
    kvedge_scheme_t scheme;
    uint32_t tokens;
    uint16_t head_dim;
    uint16_t key_channels; /* channels of K stored (popcount of the mask) */
    uint16_t group_size;
    bool lz4;
    bool ec;                 /* the body is entropy-coded (version 2) */
    const uint8_t *key_mask; /* NULL when every channel is kept */
    uint32_t raw_len;        /* body bytes once decompressed or decoded */
    uint32_t stored_len;     /* body bytes in the block */
    const uint8_t *body;     /* stored body; lz4-compressed or entropy-coded when flagged */
    uint64_t checksum;
    size_t total_len;
} kvedge_block_info_t;

/* The sections of a decompressed body, in this order: K params, V params, K codes, V codes.
 * For lossless, k_codes/v_codes hold the raw dtype elements and the params are NULL. For int8/int4:
 * params are (scale, min) fp16 pairs, K: [k_groups][key_channels], V: [tokens][v_groups]; codes are
 * [tokens] rows of [channels] bytes (int8) or of ceil(channels/2) bytes holding two nibbles each,
 * channel 2j in the low nibble of byte j (int4). */
typedef struct {
    const uint16_t *k_params;
    const uint8_t *k_codes;
    const uint16_t *v_params;
    const uint8_t *v_codes;
    uint32_t k_groups; /* groups along tokens per key channel */
    uint32_t v_groups; /* groups along channels per token */
} kvedge_block_sections_t;

/* Bytes per element of a dtype; 0 for an invalid dtype. */
size_t kvedge_dtype_size(kvedge_dtype_t dtype);
/* "fp16", "bf16", "fp32", or NULL. */
const char *kvedge_dtype_name(kvedge_dtype_t dtype);
/* "lossless", "int8", "int4", "tc", or NULL. */
const char *kvedge_scheme_name(kvedge_scheme_t scheme);
/* Parse names as printed above. Return 0 or KVEDGE_EINVAL. */
int kvedge_dtype_parse(const char *name, kvedge_dtype_t *out);
int kvedge_scheme_parse(const char *name, kvedge_scheme_t *out);

/* Checks a spec against the format's rules and hard limits (scheme tc is no spec's: it is
 * KVEDGE_EINVAL). Returns 0 or KVEDGE_EINVAL / KVEDGE_ETOOBIG. */
int kvedge_block_spec_check(const kvedge_block_spec_t *spec);

/* Upper bound on the encoded size for a spec (exact when lz4 does not pay); 0 if the spec is
 * invalid. */
size_t kvedge_block_encoded_bound(const kvedge_block_spec_t *spec);

/* Bytes of K and V together as fp16 for this shape: the "uncompressed" reference size. */
uint64_t kvedge_block_fp16_bytes(uint32_t tokens, uint16_t head_dim);

/* Encodes K and V into out (4-byte aligned, capacity out_cap: kvedge_block_encoded_bound).
 * Errors: KVEDGE_EINVAL (bad spec, non-finite values or a range fp16 params cannot hold in a
 * quantized scheme), KVEDGE_ETOOBIG, KVEDGE_ENOSPACE, KVEDGE_ENOMEM. On error out is garbage. */
int kvedge_block_encode(const kvedge_block_spec_t *spec, const void *k, const void *v, uint8_t *out,
                        size_t out_cap, size_t *out_len);

/* Re-codes the body of a verified quantized block: entropy-coded when ec is set (a version-2
 * block, flag EC; access/codec/ecbody.h), else as a version-1 block, lz4-compressed when lz4 is
 * set and that is smaller. Header fields, mask and the decoded body stay as they are, so the
 * block decodes to exactly the same values. *out is malloc'd (free it), *out_len its length.
 * Errors: KVEDGE_EINVAL (NULL, a lossless block), KVEDGE_ECORRUPT (a body that does not decode),
 * KVEDGE_ENOMEM; *out is NULL then. */
int kvedge_block_recode(const kvedge_block_info_t *in, bool ec, bool lz4, uint8_t **out,
                        size_t *out_len);

/* Verifies a block without decoding its payload: magic, version, flags, every count and length
 * against the buffer and the hard limits, then the checksum, then the mask (for a tc block: its
 * body's prefix and that both sections are there). Fills info on success. Errors:
 * KVEDGE_ETRUNCATED, KVEDGE_ECORRUPT, KVEDGE_EVERSION, KVEDGE_ETOOBIG. */
int kvedge_block_parse(const uint8_t *buf, size_t len, kvedge_block_info_t *info);

/* Verifies a block fully, as every reader of stored blocks must: kvedge_block_parse, then for an
 * lz4 or entropy-coded body its decoding to exactly raw_len bytes (steps 10 and 11 of
 * docs/block-format.md), for a tc block both sections' structure (kvedge_tc_check: no basis
 * needed), so a block that passes can be decoded (a tc block once its basis is loaded). info (may
 * be NULL) is filled on success. Such a body is decoded into a buffer allocated and freed here.
 * Errors: those of kvedge_block_parse, KVEDGE_ECORRUPT (a body that does not decode),
 * KVEDGE_ENOMEM. */
int kvedge_block_check(const uint8_t *buf, size_t len, kvedge_block_info_t *info);

/* Returns the decompressed body: info->body itself when neither compressed nor coded (and for a
 * tc block, whose body is the prefix and two coded sections: never split it with
 * kvedge_block_sections, decode it with kvedge_block_decode), else
 * decompresses or decodes into scratch (at least info->raw_len bytes; a coded body allocates a
 * scratch of its own for channel-major sections). Errors: KVEDGE_ENOSPACE, KVEDGE_ECORRUPT,
 * KVEDGE_ENOMEM. */
int kvedge_block_body(const kvedge_block_info_t *info, void *scratch, size_t scratch_cap,
                      const uint8_t **raw);

/* One section of a body as the block stores it: its raw bytes and, for an entropy-coded body,
 * its record's stream bytes and transform (KVEDGE_EC_XF_* of access/codec/ecbody.h); for a
 * plain body stored = raw and transform 0. */
typedef struct {
    uint32_t raw;
    uint32_t stored;
    uint8_t transform;
} kvedge_block_section_coding_t;

/* The sections of a verified block's body (K params, V params, K codes, V codes; K and V for
 * lossless and tc) as stored, without decoding anything: *n gets 4 or 2. For a tc block raw and
 * stored are each coded section's length (the prefix not counted). For an lz4 body stored is 0
 * (the body is one stream). An entropy-coded body's records are walked as the decoder walks
 * them. Errors: KVEDGE_EINVAL (NULL), KVEDGE_ECORRUPT (records that do not fit the body). */
int kvedge_block_coding(const kvedge_block_info_t *info, kvedge_block_section_coding_t out[4],
                        size_t *n);

/* Splits a decompressed body into its sections (all NULL for a tc block, whose sections are
 * coded). */
void kvedge_block_sections(const kvedge_block_info_t *info, const uint8_t *raw,
                           kvedge_block_sections_t *sec);

/* Decodes a parsed block into K and V, each [tokens][head_dim] in out_dtype. Dropped key
 * channels come out as zero. Allocates a scratch body only for lz4 and coded blocks. A tc block
 * is decoded with the registered basis its body names (kvedge_basis_find), to fp32 and then
 * out_dtype. Errors: KVEDGE_EINVAL, KVEDGE_ECORRUPT, KVEDGE_ENOMEM; for tc, KVEDGE_ENOBASIS (its
 * basis is not registered in this process) and KVEDGE_ESHAPE (its layer or head outside the
 * basis, or head_dim not the basis's). */
int kvedge_block_decode(const kvedge_block_info_t *info, kvedge_dtype_t out_dtype, void *k_out,
                        void *v_out);

/* Encodes a tc block (version 3, scheme tc) of one (layer, head): K and V [tokens][head_dim]
 * in dtype, each projected on the basis's section of (layer, head) (its fwd and step) and coded
 * with kvedge_tc_encode; the header's dtype is dtype, what the block decodes to by default.
 * *out is malloc'd (free it), *out_len its length. Errors: KVEDGE_EINVAL (NULL, a bad dtype or
 * token count, non-finite values or a code over the codec's range), KVEDGE_ESHAPE (head_dim not
 * the basis's, layer or head outside it), KVEDGE_ETOOBIG, KVEDGE_ENOMEM; *out is NULL then. */
int kvedge_block_encode_tc(const kvedge_basis_t *b, uint32_t layer, uint32_t head,
                           kvedge_dtype_t dtype, uint32_t tokens, uint16_t head_dim, const void *k,
                           const void *v, uint8_t **out, size_t *out_len);

/* The basis id, layer and head a verified tc block names (read from its body). Each output may be
 * NULL. Errors: KVEDGE_EINVAL (NULL info, not a tc block). */
int kvedge_block_tc_where(const kvedge_block_info_t *info, uint64_t *basis_id, uint16_t *layer,
                          uint16_t *head);

#ifdef __cplusplus
}
#endif
#endif
