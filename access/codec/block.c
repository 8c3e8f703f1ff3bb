/* Block codec: encode, verify and decode the self-describing KV block of access/codec/block.h. */
#include "access/codec/block.h"

#include <lz4.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "access/codec/basis.h"
#include "access/codec/byteorder.h"
#include "access/codec/ecbody.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/tcblock.h"
#include "access/codec/tcbody.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the block format is little-endian; a big-endian port needs byte swaps in this file"
#endif

static const uint8_t s_magic[4] = {'K', 'V', 'E', 'B'};

size_t kvedge_dtype_size(kvedge_dtype_t dtype)
{
    switch (dtype) {
    case KVEDGE_DTYPE_FP16:
    case KVEDGE_DTYPE_BF16:
        return 2;
    case KVEDGE_DTYPE_FP32:
        return 4;
    }
    return 0;
}

const char *kvedge_dtype_name(kvedge_dtype_t dtype)
{
    switch (dtype) {
    case KVEDGE_DTYPE_FP16:
        return "fp16";
    case KVEDGE_DTYPE_BF16:
        return "bf16";
    case KVEDGE_DTYPE_FP32:
        return "fp32";
    }
    return NULL;
}

const char *kvedge_scheme_name(kvedge_scheme_t scheme)
{
    switch (scheme) {
    case KVEDGE_SCHEME_LOSSLESS:
        return "lossless";
    case KVEDGE_SCHEME_INT8:
        return "int8";
    case KVEDGE_SCHEME_INT4:
        return "int4";
    case KVEDGE_SCHEME_TC:
        return "tc";
    }
    return NULL;
}

int kvedge_dtype_parse(const char *name, kvedge_dtype_t *out)
{
    for (int d = KVEDGE_DTYPE_FP16; d <= KVEDGE_DTYPE_FP32; d++) {
        if (name && strcmp(name, kvedge_dtype_name((kvedge_dtype_t)d)) == 0) {
            *out = (kvedge_dtype_t)d;
            return KVEDGE_OK;
        }
    }
    return KVEDGE_EINVAL;
}

int kvedge_scheme_parse(const char *name, kvedge_scheme_t *out)
{
    for (int s = KVEDGE_SCHEME_LOSSLESS; s <= KVEDGE_SCHEME_TC; s++) {
        if (name && strcmp(name, kvedge_scheme_name((kvedge_scheme_t)s)) == 0) {
            *out = (kvedge_scheme_t)s;
            return KVEDGE_OK;
        }
    }
    return KVEDGE_EINVAL;
}

uint64_t kvedge_block_fp16_bytes(uint32_t tokens, uint16_t head_dim)
{
    return 2ull * 2ull * tokens * head_dim;
}

/* Everything the layout of a block depends on, derived once from header fields. */
typedef struct {
    size_t esize;      /* bytes per element of the dtype (lossless payload) */
    unsigned bits;     /* 8 or 4 for quantized schemes, 0 for lossless */
    uint32_t k_groups; /* K param rows (groups along tokens) */
    uint32_t v_groups; /* V params per token (groups along channels) */
    uint64_t k_params; /* bytes of each section */
    uint64_t v_params;
    uint64_t k_codes;
    uint64_t v_codes;
    uint64_t raw;      /* body bytes */
    size_t mask_bytes; /* bytes of the mask area, 0 without mask */
} s_layout_t;

static int s_layout(kvedge_dtype_t dtype, kvedge_scheme_t scheme, uint32_t tokens,
                    uint32_t head_dim, uint32_t key_channels, uint32_t group, bool has_mask,
                    s_layout_t *l)
{
    memset(l, 0, sizeof *l);
    l->esize = kvedge_dtype_size(dtype);
    if (l->esize == 0 || tokens == 0 || head_dim == 0 || key_channels == 0 ||
        key_channels > head_dim)
        return KVEDGE_EINVAL;
    if (tokens > KVEDGE_BLOCK_MAX_TOKENS || head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM)
        return KVEDGE_ETOOBIG;
    if (!has_mask && key_channels != head_dim)
        return KVEDGE_EINVAL;
    l->mask_bytes = has_mask ? KVEDGE_BLOCK_MASK_BYTES(head_dim) : 0;
    switch (scheme) {
    case KVEDGE_SCHEME_LOSSLESS:
        if (group != 0)
            return KVEDGE_EINVAL;
        l->k_codes = (uint64_t)tokens * key_channels * l->esize;
        l->v_codes = (uint64_t)tokens * head_dim * l->esize;
        break;
    case KVEDGE_SCHEME_INT8:
    case KVEDGE_SCHEME_INT4:
        l->bits = scheme == KVEDGE_SCHEME_INT8 ? 8 : 4;
        l->k_groups = kvedge_quant_groups(tokens, group);
        l->v_groups = kvedge_quant_groups(head_dim, group);
        l->k_params = (uint64_t)l->k_groups * key_channels * 4;
        l->v_params = (uint64_t)tokens * l->v_groups * 4;
        l->k_codes = (uint64_t)tokens * kvedge_quant_row_bytes(key_channels, l->bits);
        l->v_codes = (uint64_t)tokens * kvedge_quant_row_bytes(head_dim, l->bits);
        break;
    default:
        return KVEDGE_EINVAL;
    }
    l->raw = l->k_params + l->v_params + l->k_codes + l->v_codes;
    return l->raw > KVEDGE_BLOCK_MAX_BYTES ? KVEDGE_ETOOBIG : KVEDGE_OK;
}

static uint32_t s_popcount(const uint8_t *mask, uint32_t head_dim)
{
    uint32_t n = 0;
    for (uint32_t c = 0; c < head_dim; c++)
        n += (mask[c >> 3] >> (c & 7)) & 1u;
    return n;
}

/* True if no bit at or past head_dim is set in a mask area of `bytes` bytes. */
static bool s_mask_tail_clear(const uint8_t *mask, uint32_t head_dim, size_t bytes)
{
    for (size_t c = head_dim; c < bytes * 8; c++)
        if ((mask[c >> 3] >> (c & 7)) & 1u)
            return false;
    return true;
}

int kvedge_block_spec_check(const kvedge_block_spec_t *spec)
{
    if (!spec)
        return KVEDGE_EINVAL;
    uint32_t kc = spec->head_dim;
    if (spec->key_mask) {
        if (spec->head_dim == 0 || spec->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM)
            return spec->head_dim == 0 ? KVEDGE_EINVAL : KVEDGE_ETOOBIG;
        if (!s_mask_tail_clear(spec->key_mask, spec->head_dim, ((size_t)spec->head_dim + 7) / 8))
            return KVEDGE_EINVAL;
        kc = s_popcount(spec->key_mask, spec->head_dim);
    }
    s_layout_t l;
    return s_layout(spec->dtype, spec->scheme, spec->tokens, spec->head_dim, kc, spec->group_size,
                    spec->key_mask != NULL, &l);
}

/* The shape an entropy-coded body follows, from a layout. */
static void s_ec_shape(const s_layout_t *l, uint32_t tokens, uint32_t key_channels,
                       uint32_t head_dim, kvedge_ec_shape_t *s)
{
    s->tokens = tokens;
    s->key_channels = key_channels;
    s->head_dim = head_dim;
    s->bits = l->bits;
    s->len[0] = l->k_params;
    s->len[1] = l->v_params;
    s->len[2] = l->k_codes;
    s->len[3] = l->v_codes;
}

static size_t s_bound(const kvedge_block_spec_t *spec, s_layout_t *l)
{
    memset(l, 0, sizeof *l);
    if (kvedge_block_spec_check(spec) != KVEDGE_OK)
        return 0;
    uint32_t kc = spec->key_mask ? s_popcount(spec->key_mask, spec->head_dim) : spec->head_dim;
    s_layout(spec->dtype, spec->scheme, spec->tokens, spec->head_dim, kc, spec->group_size,
             spec->key_mask != NULL, l);
    return KVEDGE_BLOCK_HEADER_BYTES + l->mask_bytes + (size_t)l->raw + KVEDGE_BLOCK_CHECKSUM_BYTES;
}

size_t kvedge_block_encoded_bound(const kvedge_block_spec_t *spec)
{
    s_layout_t l;
    return s_bound(spec, &l);
}

/* Kept channel indices of a mask (or all channels); returns their count. */
static uint32_t s_kept_channels(const uint8_t *mask, uint32_t head_dim, uint16_t *idx)
{
    uint32_t n = 0;
    for (uint32_t c = 0; c < head_dim; c++)
        if (!mask || ((mask[c >> 3] >> (c & 7)) & 1u))
            idx[n++] = (uint16_t)c;
    return n;
}

/* Copies the kept channels of each row, element by element at the dtype's width. */
static void s_gather_rows(const uint8_t *src, uint32_t tokens, uint32_t head_dim,
                          const uint16_t *idx, uint32_t kc, size_t es, uint8_t *dst)
{
    for (uint32_t t = 0; t < tokens; t++) {
        const uint8_t *r = src + (size_t)t * head_dim * es;
        for (uint32_t j = 0; j < kc; j++)
            memcpy(dst + ((size_t)t * kc + j) * es, r + (size_t)idx[j] * es, es);
    }
}

static int s_encode_quant(const kvedge_block_spec_t *spec, const s_layout_t *l, const uint16_t *idx,
                          uint32_t kc, const void *k, const void *v, uint8_t *body)
{
    uint8_t *kp = body, *vp = kp + l->k_params, *kcodes = vp + l->v_params;
    uint8_t *vcodes = kcodes + l->k_codes;
    int rc =
        kvedge_quant_keys(spec->dtype, k, spec->tokens, spec->head_dim, spec->key_mask ? idx : NULL,
                          kc, spec->group_size, l->bits, (uint16_t *)kp, kcodes);
    if (rc == KVEDGE_OK)
        rc = kvedge_quant_values(spec->dtype, v, spec->tokens, spec->head_dim, spec->group_size,
                                 l->bits, (uint16_t *)vp, vcodes);
    return rc;
}

/* The header fields of a block besides its lengths and flags. */
typedef struct {
    kvedge_dtype_t dtype;
    kvedge_scheme_t scheme;
    uint32_t tokens;
    uint16_t head_dim;
    uint32_t key_channels;
    uint16_t group_size;
    bool has_mask;
} s_fields_t;

/* Replaces the raw body (l->raw bytes, with room for KVEDGE_EC_OVERHEAD_BYTES more) by its
 * entropy-coded form; *stored gets its length. */
static int s_encode_ec(const s_layout_t *l, uint32_t tokens, uint32_t kc, uint32_t head_dim,
                       uint8_t *body, uint32_t *stored)
{
    kvedge_ec_shape_t shape;
    s_ec_shape(l, tokens, kc, head_dim, &shape);
    const size_t cap = kvedge_ec_bound(&shape);
    uint8_t *coded = cap ? malloc(cap) : NULL;
    if (!coded)
        return cap ? KVEDGE_ENOMEM : KVEDGE_EINVAL;
    size_t n = 0;
    int rc = kvedge_ec_encode(&shape, body, NULL, coded, cap, &n);
    if (rc == KVEDGE_OK) {
        memcpy(body, coded, n);
        *stored = (uint32_t)n;
    }
    free(coded);
    return rc;
}

/* Finishes a block whose mask and raw body are in place in out: codes or compresses the body
 * (ec, or lz4 when it pays), then writes the header and the checksum. */
static int s_seal(uint8_t *out, const s_fields_t *f, const s_layout_t *l, bool lz4, bool ec,
                  size_t *out_len)
{
    uint8_t *body = out + KVEDGE_BLOCK_HEADER_BYTES + l->mask_bytes;
    uint32_t stored = (uint32_t)l->raw;
    uint8_t flags = f->has_mask ? KVEDGE_BLOCK_FLAG_MASK : 0;
    if (ec) {
        int rc = s_encode_ec(l, f->tokens, f->key_channels, f->head_dim, body, &stored);
        if (rc != KVEDGE_OK)
            return rc;
        flags |= KVEDGE_BLOCK_FLAG_EC;
    } else if (lz4 && l->raw > 0) {
        int cap = LZ4_compressBound((int)l->raw);
        char *z = cap > 0 ? malloc((size_t)cap) : NULL;
        if (!z)
            return KVEDGE_ENOMEM;
        int n = LZ4_compress_default((const char *)body, z, (int)l->raw, cap);
        if (n > 0 && (uint32_t)n < stored) {
            memcpy(body, z, (size_t)n);
            stored = (uint32_t)n;
            flags |= KVEDGE_BLOCK_FLAG_LZ4;
        }
        free(z);
    }

    memcpy(out, s_magic, 4);
    out[4] = ec ? KVEDGE_BLOCK_VERSION_EC : KVEDGE_BLOCK_VERSION;
    out[5] = (uint8_t)f->dtype;
    out[6] = (uint8_t)f->scheme;
    out[7] = flags;
    kvedge_le_put32(out + 8, f->tokens);
    kvedge_le_put16(out + 12, f->head_dim);
    kvedge_le_put16(out + 14, (uint16_t)f->key_channels);
    kvedge_le_put16(out + 16, f->group_size);
    kvedge_le_put16(out + 18, 0);
    kvedge_le_put32(out + 20, (uint32_t)l->raw);
    kvedge_le_put32(out + 24, stored);
    kvedge_le_put32(out + 28, 0);
    size_t covered = KVEDGE_BLOCK_HEADER_BYTES + l->mask_bytes + stored;
    kvedge_le_put64(out + covered, XXH3_64bits(out, covered));
    *out_len = covered + KVEDGE_BLOCK_CHECKSUM_BYTES;
    return KVEDGE_OK;
}

int kvedge_block_encode(const kvedge_block_spec_t *spec, const void *k, const void *v, uint8_t *out,
                        size_t out_cap, size_t *out_len)
{
    if (!spec || !k || !v || !out || !out_len || ((uintptr_t)out & 3u) != 0)
        return KVEDGE_EINVAL;
    int rc = kvedge_block_spec_check(spec);
    if (rc != KVEDGE_OK)
        return rc;
    s_layout_t l;
    size_t bound = s_bound(spec, &l);
    if (out_cap < bound)
        return KVEDGE_ENOSPACE;
    uint16_t idx[KVEDGE_BLOCK_MAX_HEAD_DIM];
    const uint32_t kc = s_kept_channels(spec->key_mask, spec->head_dim, idx);

    uint8_t *mask = out + KVEDGE_BLOCK_HEADER_BYTES;
    if (spec->key_mask) {
        memset(mask, 0, l.mask_bytes);
        memcpy(mask, spec->key_mask, ((size_t)spec->head_dim + 7) / 8);
    }
    uint8_t *body = mask + l.mask_bytes;
    if (l.bits == 0) {
        if (spec->key_mask)
            s_gather_rows(k, spec->tokens, spec->head_dim, idx, kc, l.esize, body);
        else
            memcpy(body, k, l.k_codes);
        memcpy(body + l.k_codes, v, l.v_codes);
    } else {
        rc = s_encode_quant(spec, &l, idx, kc, k, v, body);
        if (rc != KVEDGE_OK)
            return rc;
    }

    s_fields_t f = {spec->dtype, spec->scheme,     spec->tokens,          spec->head_dim,
                    kc,          spec->group_size, spec->key_mask != NULL};
    return s_seal(out, &f, &l, spec->lz4, false, out_len);
}

int kvedge_block_recode(const kvedge_block_info_t *in, bool ec, bool lz4, uint8_t **out,
                        size_t *out_len)
{
    if (out)
        *out = NULL;
    if (!in || !in->body || !out || !out_len || in->scheme == KVEDGE_SCHEME_LOSSLESS)
        return KVEDGE_EINVAL;
    s_layout_t l;
    if (s_layout(in->dtype, in->scheme, in->tokens, in->head_dim, in->key_channels, in->group_size,
                 in->key_mask != NULL, &l) != KVEDGE_OK ||
        l.raw != in->raw_len)
        return KVEDGE_EINVAL;
    const size_t cap = KVEDGE_BLOCK_HEADER_BYTES + l.mask_bytes + (size_t)l.raw +
                       KVEDGE_EC_OVERHEAD_BYTES + KVEDGE_BLOCK_CHECKSUM_BYTES;
    uint8_t *blk = malloc(cap);
    if (!blk)
        return KVEDGE_ENOMEM;
    uint8_t *body = blk + KVEDGE_BLOCK_HEADER_BYTES + l.mask_bytes;
    const uint8_t *raw;
    int rc = kvedge_block_body(in, body, cap - KVEDGE_BLOCK_HEADER_BYTES - l.mask_bytes, &raw);
    if (rc == KVEDGE_OK) {
        if (raw != body)
            memcpy(body, raw, l.raw);
        if (l.mask_bytes)
            memcpy(blk + KVEDGE_BLOCK_HEADER_BYTES, in->key_mask, l.mask_bytes);
        s_fields_t f = {in->dtype,        in->scheme,     in->tokens,          in->head_dim,
                        in->key_channels, in->group_size, in->key_mask != NULL};
        rc = s_seal(blk, &f, &l, lz4, ec, out_len);
    }
    if (rc != KVEDGE_OK) {
        free(blk);
        return rc;
    }
    uint8_t *shrunk = realloc(blk, *out_len);
    *out = shrunk ? shrunk : blk;
    return KVEDGE_OK;
}

/* The K section's length of a tc body, 0 when the prefix or a section is missing. */
static uint32_t s_tc_nk(const uint8_t *body, uint32_t stored)
{
    if (stored < KVEDGE_BLOCK_TC_PREFIX_BYTES + 2u)
        return 0;
    const uint32_t nk = kvedge_le_get32(body + 12);
    return nk >= 1 && nk <= stored - KVEDGE_BLOCK_TC_PREFIX_BYTES - 1u ? nk : 0;
}

/* kvedge_block_parse of a version-3 (tc) block, its header fields read into *in: version 3 is
 * exactly scheme tc, no flag, group 0, every key channel, the body stored as it is (raw_len =
 * stored_len) holding the prefix and both sections. */
static int s_parse_tc(const uint8_t *buf, size_t len, uint8_t flags, kvedge_block_info_t *in,
                      kvedge_block_info_t *info)
{
    if (in->version != KVEDGE_BLOCK_VERSION_TC || in->scheme != KVEDGE_SCHEME_TC || flags != 0)
        return KVEDGE_ECORRUPT;
    if (kvedge_dtype_size(in->dtype) == 0 || in->tokens == 0 || in->head_dim == 0 ||
        in->key_channels != in->head_dim || in->group_size != 0)
        return KVEDGE_ECORRUPT;
    if (in->tokens > KVEDGE_BLOCK_MAX_TOKENS || in->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM ||
        in->stored_len > KVEDGE_BLOCK_MAX_BYTES)
        return KVEDGE_ETOOBIG;
    if (in->raw_len != in->stored_len || in->stored_len < KVEDGE_BLOCK_TC_PREFIX_BYTES + 2u)
        return KVEDGE_ECORRUPT;
    const size_t need =
        KVEDGE_BLOCK_HEADER_BYTES + (size_t)in->stored_len + KVEDGE_BLOCK_CHECKSUM_BYTES;
    if (len < need)
        return KVEDGE_ETRUNCATED;
    if (len > need)
        return KVEDGE_ECORRUPT;
    const size_t covered = need - KVEDGE_BLOCK_CHECKSUM_BYTES;
    in->checksum = kvedge_le_get64(buf + covered);
    if (XXH3_64bits(buf, covered) != in->checksum)
        return KVEDGE_ECORRUPT;
    in->body = buf + KVEDGE_BLOCK_HEADER_BYTES;
    if (s_tc_nk(in->body, in->stored_len) == 0)
        return KVEDGE_ECORRUPT;
    in->total_len = len;
    *info = *in;
    return KVEDGE_OK;
}

int kvedge_block_parse(const uint8_t *buf, size_t len, kvedge_block_info_t *info)
{
    if (!buf || !info)
        return KVEDGE_EINVAL;
    if (len < KVEDGE_BLOCK_HEADER_BYTES + KVEDGE_BLOCK_CHECKSUM_BYTES)
        return KVEDGE_ETRUNCATED;
    if (memcmp(buf, s_magic, 4) != 0)
        return KVEDGE_ECORRUPT;
    if (buf[4] != KVEDGE_BLOCK_VERSION && buf[4] != KVEDGE_BLOCK_VERSION_EC &&
        buf[4] != KVEDGE_BLOCK_VERSION_TC)
        return KVEDGE_EVERSION;
    if (len > (size_t)KVEDGE_BLOCK_MAX_BYTES + KVEDGE_BLOCK_HEADER_BYTES +
                  KVEDGE_BLOCK_MASK_BYTES(KVEDGE_BLOCK_MAX_HEAD_DIM) + KVEDGE_BLOCK_CHECKSUM_BYTES)
        return KVEDGE_ETOOBIG;
    const uint8_t flags = buf[7];
    if ((flags & ~(KVEDGE_BLOCK_FLAG_LZ4 | KVEDGE_BLOCK_FLAG_MASK | KVEDGE_BLOCK_FLAG_EC)) != 0 ||
        kvedge_le_get16(buf + 18) != 0 || kvedge_le_get32(buf + 28) != 0)
        return KVEDGE_ECORRUPT;
    /* Version 2 is exactly the coded body; a coded body is never also lz4. */
    const bool ec = (flags & KVEDGE_BLOCK_FLAG_EC) != 0;
    if (ec != (buf[4] == KVEDGE_BLOCK_VERSION_EC) || (ec && (flags & KVEDGE_BLOCK_FLAG_LZ4)))
        return KVEDGE_ECORRUPT;

    kvedge_block_info_t in;
    memset(&in, 0, sizeof in);
    in.version = buf[4];
    in.dtype = (kvedge_dtype_t)buf[5];
    in.scheme = (kvedge_scheme_t)buf[6];
    in.lz4 = (flags & KVEDGE_BLOCK_FLAG_LZ4) != 0;
    in.ec = ec;
    in.tokens = kvedge_le_get32(buf + 8);
    in.head_dim = kvedge_le_get16(buf + 12);
    in.key_channels = kvedge_le_get16(buf + 14);
    in.group_size = kvedge_le_get16(buf + 16);
    in.raw_len = kvedge_le_get32(buf + 20);
    in.stored_len = kvedge_le_get32(buf + 24);
    if (in.version == KVEDGE_BLOCK_VERSION_TC || in.scheme == KVEDGE_SCHEME_TC)
        return s_parse_tc(buf, len, flags, &in, info);

    s_layout_t l;
    int rc = s_layout(in.dtype, in.scheme, in.tokens, in.head_dim, in.key_channels, in.group_size,
                      (flags & KVEDGE_BLOCK_FLAG_MASK) != 0, &l);
    if (rc != KVEDGE_OK)
        return rc == KVEDGE_ETOOBIG ? KVEDGE_ETOOBIG : KVEDGE_ECORRUPT;
    /* The body length is implied by the shape; a compressed body must be strictly smaller, a
     * coded one (quantized only) at most KVEDGE_EC_OVERHEAD_BYTES larger. */
    if (in.raw_len != l.raw)
        return KVEDGE_ECORRUPT;
    if (in.ec ? l.bits == 0 || in.stored_len == 0 ||
                    in.stored_len > (uint64_t)in.raw_len + KVEDGE_EC_OVERHEAD_BYTES
        : in.lz4 ? in.stored_len >= in.raw_len || in.stored_len == 0
                 : in.stored_len != in.raw_len)
        return KVEDGE_ECORRUPT;
    const size_t need = KVEDGE_BLOCK_HEADER_BYTES + l.mask_bytes + (size_t)in.stored_len +
                        KVEDGE_BLOCK_CHECKSUM_BYTES;
    if (len < need)
        return KVEDGE_ETRUNCATED;
    if (len > need)
        return KVEDGE_ECORRUPT;
    const size_t covered = need - KVEDGE_BLOCK_CHECKSUM_BYTES;
    in.checksum = kvedge_le_get64(buf + covered);
    if (XXH3_64bits(buf, covered) != in.checksum)
        return KVEDGE_ECORRUPT;
    if (l.mask_bytes) {
        in.key_mask = buf + KVEDGE_BLOCK_HEADER_BYTES;
        if (!s_mask_tail_clear(in.key_mask, in.head_dim, l.mask_bytes) ||
            s_popcount(in.key_mask, in.head_dim) != in.key_channels)
            return KVEDGE_ECORRUPT;
    }
    in.body = buf + KVEDGE_BLOCK_HEADER_BYTES + l.mask_bytes;
    in.total_len = len;
    *info = in;
    return KVEDGE_OK;
}

int kvedge_block_check(const uint8_t *buf, size_t len, kvedge_block_info_t *info)
{
    kvedge_block_info_t in;
    int rc = kvedge_block_parse(buf, len, &in);
    if (rc != KVEDGE_OK)
        return rc;
    if (in.scheme == KVEDGE_SCHEME_TC) {
        /* Both sections walked as the decoder walks them: only the basis can be missing. */
        const kvedge_tc_shape_t shape = {in.tokens, in.head_dim};
        const uint32_t nk = s_tc_nk(in.body, in.stored_len);
        const uint8_t *sec = in.body + KVEDGE_BLOCK_TC_PREFIX_BYTES;
        rc = kvedge_tc_check(&shape, sec, nk);
        if (rc == KVEDGE_OK)
            rc = kvedge_tc_check(&shape, sec + nk,
                                 in.stored_len - KVEDGE_BLOCK_TC_PREFIX_BYTES - nk);
        if (rc != KVEDGE_OK)
            return rc == KVEDGE_ENOMEM ? rc : KVEDGE_ECORRUPT;
    } else if (in.lz4 || in.ec) {
        /* A checksum only says the bytes are the ones written: an lz4 or coded body that was
         * bad when written is caught here, before anything serves it. */
        void *scratch = malloc(in.raw_len);
        if (!scratch)
            return KVEDGE_ENOMEM;
        const uint8_t *raw;
        rc = kvedge_block_body(&in, scratch, in.raw_len, &raw);
        free(scratch);
        if (rc != KVEDGE_OK)
            return rc;
    }
    if (info)
        *info = in;
    return KVEDGE_OK;
}

int kvedge_block_body(const kvedge_block_info_t *info, void *scratch, size_t scratch_cap,
                      const uint8_t **raw)
{
    if (!info || !raw)
        return KVEDGE_EINVAL;
    if (!info->lz4 && !info->ec) {
        *raw = info->body;
        return KVEDGE_OK;
    }
    if (!scratch || scratch_cap < info->raw_len)
        return KVEDGE_ENOSPACE;
    if (info->ec) {
        s_layout_t l;
        kvedge_ec_shape_t shape;
        if (s_layout(info->dtype, info->scheme, info->tokens, info->head_dim, info->key_channels,
                     info->group_size, info->key_mask != NULL, &l) != KVEDGE_OK ||
            l.bits == 0 || l.raw != info->raw_len)
            return KVEDGE_ECORRUPT;
        s_ec_shape(&l, info->tokens, info->key_channels, info->head_dim, &shape);
        int rc = kvedge_ec_decode(&shape, info->body, info->stored_len, scratch);
        if (rc != KVEDGE_OK)
            return rc == KVEDGE_ENOMEM ? rc : KVEDGE_ECORRUPT;
        *raw = scratch;
        return KVEDGE_OK;
    }
    int n = LZ4_decompress_safe((const char *)info->body, scratch, (int)info->stored_len,
                                (int)info->raw_len);
    if (n < 0 || (uint32_t)n != info->raw_len)
        return KVEDGE_ECORRUPT;
    *raw = scratch;
    return KVEDGE_OK;
}

int kvedge_block_coding(const kvedge_block_info_t *info, kvedge_block_section_coding_t out[4],
                        size_t *n)
{
    if (info && out && n && info->scheme == KVEDGE_SCHEME_TC) {
        const uint32_t nk = info->body ? s_tc_nk(info->body, info->stored_len) : 0;
        if (nk == 0)
            return KVEDGE_ECORRUPT;
        const uint32_t nv = info->stored_len - KVEDGE_BLOCK_TC_PREFIX_BYTES - nk;
        out[0] = (kvedge_block_section_coding_t){nk, nk, KVEDGE_EC_XF_NONE};
        out[1] = (kvedge_block_section_coding_t){nv, nv, KVEDGE_EC_XF_NONE};
        *n = 2;
        return KVEDGE_OK;
    }
    s_layout_t l;
    if (!info || !out || !n ||
        s_layout(info->dtype, info->scheme, info->tokens, info->head_dim, info->key_channels,
                 info->group_size, info->key_mask != NULL, &l) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    const uint64_t raw[4] = {l.k_params, l.v_params, l.k_codes, l.v_codes};
    const size_t first = l.bits ? 0 : 2;
    size_t pos = 0;
    *n = 4 - first;
    for (size_t i = first; i < 4; i++) {
        kvedge_block_section_coding_t *c = &out[i - first];
        c->raw = (uint32_t)raw[i];
        c->stored = info->lz4 ? 0 : c->raw;
        c->transform = KVEDGE_EC_XF_NONE;
        if (!info->ec)
            continue;
        if (info->stored_len - pos < KVEDGE_EC_RECORD_BYTES)
            return KVEDGE_ECORRUPT;
        c->transform = info->body[pos];
        c->stored = kvedge_le_get32(info->body + pos + 1);
        pos += KVEDGE_EC_RECORD_BYTES;
        if (c->stored > info->stored_len - pos)
            return KVEDGE_ECORRUPT;
        pos += c->stored;
    }
    return !info->ec || pos == info->stored_len ? KVEDGE_OK : KVEDGE_ECORRUPT;
}

void kvedge_block_sections(const kvedge_block_info_t *info, const uint8_t *raw,
                           kvedge_block_sections_t *sec)
{
    s_layout_t l;
    memset(sec, 0, sizeof *sec);
    if (s_layout(info->dtype, info->scheme, info->tokens, info->head_dim, info->key_channels,
                 info->group_size, info->key_mask != NULL, &l) != KVEDGE_OK)
        return;
    sec->k_groups = l.k_groups;
    sec->v_groups = l.v_groups;
    if (l.bits == 0) {
        sec->k_codes = raw;
        sec->v_codes = raw + l.k_codes;
        return;
    }
    sec->k_params = (const uint16_t *)raw;
    sec->v_params = (const uint16_t *)(raw + l.k_params);
    sec->k_codes = raw + l.k_params + l.v_params;
    sec->v_codes = sec->k_codes + l.k_codes;
}

/* Writes one K row of kc kept channels (float) into a head_dim-wide output row. */
static void s_put_key_row(const float *kept, const uint16_t *idx, uint32_t kc, uint32_t D,
                          bool masked, float *wide, kvedge_dtype_t out_dtype, void *dst)
{
    const float *src = kept;
    if (masked) {
        memset(wide, 0, sizeof(float) * D);
        for (uint32_t j = 0; j < kc; j++)
            wide[idx[j]] = kept[j];
        src = wide;
    }
    kvedge_convert_from_f32(out_dtype, src, D, dst);
}

static void s_decode_lossless(const kvedge_block_info_t *info, const kvedge_block_sections_t *sec,
                              const uint16_t *idx, kvedge_dtype_t out_dtype, uint8_t *k_out,
                              uint8_t *v_out, float *tmp)
{
    const uint32_t T = info->tokens, D = info->head_dim, kc = info->key_channels;
    const size_t es = kvedge_dtype_size(info->dtype), oes = kvedge_dtype_size(out_dtype);
    const bool masked = info->key_mask != NULL;
    if (out_dtype == info->dtype) { /* bit-exact copy */
        if (masked) {
            memset(k_out, 0, (size_t)T * D * es);
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t j = 0; j < kc; j++)
                    memcpy(k_out + ((size_t)t * D + idx[j]) * es,
                           sec->k_codes + ((size_t)t * kc + j) * es, es);
        } else {
            memcpy(k_out, sec->k_codes, (size_t)T * D * es);
        }
        memcpy(v_out, sec->v_codes, (size_t)T * D * es);
        return;
    }
    float *row = tmp, *wide = tmp + D;
    for (uint32_t t = 0; t < T; t++) {
        kvedge_convert_to_f32(info->dtype, sec->k_codes + (size_t)t * kc * es, kc, row);
        s_put_key_row(row, idx, kc, D, masked, wide, out_dtype, k_out + (size_t)t * D * oes);
    }
    for (uint32_t t = 0; t < T; t++) {
        kvedge_convert_to_f32(info->dtype, sec->v_codes + (size_t)t * D * es, D, row);
        kvedge_convert_from_f32(out_dtype, row, D, v_out + (size_t)t * D * oes);
    }
}

static void s_decode_quant(const kvedge_block_info_t *info, const kvedge_block_sections_t *sec,
                           const uint16_t *idx, kvedge_dtype_t out_dtype, uint8_t *k_out,
                           uint8_t *v_out, float *tmp)
{
    const uint32_t T = info->tokens, D = info->head_dim, kc = info->key_channels;
    const unsigned bits = info->scheme == KVEDGE_SCHEME_INT8 ? 8 : 4;
    const uint32_t G = info->group_size == 0 || info->group_size > T ? T : info->group_size;
    const size_t oes = kvedge_dtype_size(out_dtype);
    const size_t krow = kvedge_quant_row_bytes(kc, bits), vrow = kvedge_quant_row_bytes(D, bits);
    const bool masked = info->key_mask != NULL;
    /* A pruned key row is widened to head_dim before dequantizing: dropped channels get code 0
     * with scale 0 and min 0, so they come out as exact zeros from the same kernel. */
    float *scale = tmp, *min = scale + D, *kscale = min + D, *kmin = kscale + D;
    uint8_t codes[KVEDGE_BLOCK_MAX_HEAD_DIM], wide[KVEDGE_BLOCK_MAX_HEAD_DIM];
    kvedge_expand_plan_t plan;
    if (masked)
        kvedge_expand_plan(info->key_mask, D, &plan);
    for (uint32_t t = 0; t < T; t++) {
        const uint8_t *src = sec->k_codes + (size_t)t * krow;
        if (t % G == 0) {
            const uint16_t *p = sec->k_params + (size_t)(t / G) * kc * 2;
            if (masked) {
                kvedge_quant_params_expand(p, kc, kscale, kmin);
                memset(scale, 0, sizeof(float) * D);
                memset(min, 0, sizeof(float) * D);
                for (uint32_t j = 0; j < kc; j++) {
                    scale[idx[j]] = kscale[j];
                    min[idx[j]] = kmin[j];
                }
            } else {
                kvedge_quant_params_expand(p, kc, scale, min);
            }
        }
        unsigned rbits = bits;
        if (masked) {
            if (bits == 4) {
                kvedge_quant_unpack4(src, kc, codes);
                src = codes;
            }
            kvedge_expand_u8(&plan, src, wide);
            src = wide;
            rbits = 8;
        }
        kvedge_dequant_row_out(src, rbits, masked ? D : kc, scale, min, out_dtype,
                               k_out + (size_t)t * D * oes);
    }
    for (uint32_t t = 0; t < T; t++)
        kvedge_dequant_row_grouped_out(sec->v_codes + (size_t)t * vrow, bits, D,
                                       sec->v_params + (size_t)t * sec->v_groups * 2,
                                       info->group_size, out_dtype, v_out + (size_t)t * D * oes);
}

/* Decodes the sections of a tc block with its registered basis, to fp32 then out_dtype. */
static int s_decode_tc(const kvedge_block_info_t *info, kvedge_dtype_t out_dtype, void *k_out,
                       void *v_out)
{
    uint64_t id;
    uint16_t layer, head;
    const uint32_t nk = s_tc_nk(info->body, info->stored_len);
    if (nk == 0 || kvedge_block_tc_where(info, &id, &layer, &head) != KVEDGE_OK)
        return KVEDGE_ECORRUPT;
    const kvedge_basis_t *b = kvedge_basis_find(id);
    if (!b)
        return KVEDGE_ENOBASIS;
    kvedge_basis_section_t ks, vs;
    if (kvedge_basis_head_dim(b) != info->head_dim ||
        kvedge_basis_section(b, layer, head, 0, &ks) != KVEDGE_OK ||
        kvedge_basis_section(b, layer, head, 1, &vs) != KVEDGE_OK)
        return KVEDGE_ESHAPE;
    const kvedge_tc_shape_t shape = {info->tokens, info->head_dim};
    const size_t n = (size_t)info->tokens * info->head_dim;
    float *x = malloc(n * sizeof *x);
    if (!x)
        return KVEDGE_ENOMEM;
    const uint8_t *sec = info->body + KVEDGE_BLOCK_TC_PREFIX_BYTES;
    int rc = kvedge_tc_decode(&shape, sec, nk, ks.inv, x);
    if (rc == KVEDGE_OK) {
        kvedge_convert_from_f32(out_dtype, x, n, k_out);
        rc = kvedge_tc_decode(&shape, sec + nk,
                              info->stored_len - KVEDGE_BLOCK_TC_PREFIX_BYTES - nk, vs.inv, x);
    }
    if (rc == KVEDGE_OK)
        kvedge_convert_from_f32(out_dtype, x, n, v_out);
    free(x);
    return rc == KVEDGE_OK || rc == KVEDGE_ENOMEM ? rc : KVEDGE_ECORRUPT;
}

int kvedge_block_decode(const kvedge_block_info_t *info, kvedge_dtype_t out_dtype, void *k_out,
                        void *v_out)
{
    if (!info || !k_out || !v_out || kvedge_dtype_size(out_dtype) == 0 || !info->body)
        return KVEDGE_EINVAL;
    if (info->scheme == KVEDGE_SCHEME_TC)
        return s_decode_tc(info, out_dtype, k_out, v_out);
    /* A stored body is decompressed, or copied when it is misaligned for 16-bit params. */
    void *scratch = NULL;
    const uint8_t *raw = info->body;
    if (info->lz4 || info->ec || ((uintptr_t)info->body & 3u) != 0) {
        scratch = malloc(info->raw_len);
        if (!scratch)
            return KVEDGE_ENOMEM;
        if (info->lz4 || info->ec) {
            int rc = kvedge_block_body(info, scratch, info->raw_len, &raw);
            if (rc != KVEDGE_OK) {
                free(scratch);
                return rc;
            }
        } else {
            memcpy(scratch, info->body, info->raw_len);
            raw = scratch;
        }
    }
    kvedge_block_sections_t sec;
    kvedge_block_sections(info, raw, &sec);
    uint16_t idx[KVEDGE_BLOCK_MAX_HEAD_DIM];
    s_kept_channels(info->key_mask, info->head_dim, idx);
    float tmp[4 * KVEDGE_BLOCK_MAX_HEAD_DIM];
    if (info->scheme == KVEDGE_SCHEME_LOSSLESS)
        s_decode_lossless(info, &sec, idx, out_dtype, k_out, v_out, tmp);
    else
        s_decode_quant(info, &sec, idx, out_dtype, k_out, v_out, tmp);
    free(scratch);
    return KVEDGE_OK;
}

int kvedge_block_tc_where(const kvedge_block_info_t *info, uint64_t *basis_id, uint16_t *layer,
                          uint16_t *head)
{
    if (!info || !info->body || info->scheme != KVEDGE_SCHEME_TC ||
        info->stored_len < KVEDGE_BLOCK_TC_PREFIX_BYTES)
        return KVEDGE_EINVAL;
    if (basis_id)
        *basis_id = kvedge_le_get64(info->body);
    if (layer)
        *layer = kvedge_le_get16(info->body + 8);
    if (head)
        *head = kvedge_le_get16(info->body + 10);
    return KVEDGE_OK;
}

/* One section coded against the basis section s into out + *pos (capacity checked). */
static int s_encode_tc_section(const kvedge_tc_shape_t *shape, const float *x,
                               const kvedge_basis_section_t *s, uint8_t *out, size_t cap,
                               size_t *pos)
{
    size_t n = 0;
    int rc = kvedge_tc_encode(shape, x, s->fwd, s->step, out + *pos, cap - *pos, &n);
    if (rc == KVEDGE_OK)
        *pos += n;
    return rc;
}

/* The tc encoder: K and V in in_dtype, the header naming dtype. */
static int s_encode_tc(const kvedge_basis_t *b, uint32_t layer, uint32_t head, kvedge_dtype_t dtype,
                       kvedge_dtype_t in_dtype, uint32_t tokens, uint16_t head_dim, const void *k,
                       const void *v, uint8_t **out, size_t *out_len)
{
    if (out)
        *out = NULL;
    if (!b || !k || !v || !out || !out_len || kvedge_dtype_size(dtype) == 0 ||
        kvedge_dtype_size(in_dtype) == 0 || tokens == 0 || head_dim == 0)
        return KVEDGE_EINVAL;
    if (tokens > KVEDGE_BLOCK_MAX_TOKENS)
        return KVEDGE_ETOOBIG;
    kvedge_basis_section_t ks, vs;
    if (head_dim != kvedge_basis_head_dim(b) ||
        kvedge_basis_section(b, layer, head, 0, &ks) != KVEDGE_OK ||
        kvedge_basis_section(b, layer, head, 1, &vs) != KVEDGE_OK)
        return KVEDGE_ESHAPE;
    const kvedge_tc_shape_t shape = {tokens, head_dim};
    const size_t n = (size_t)tokens * head_dim, bound = kvedge_tc_bound(&shape);
    const size_t cap = KVEDGE_BLOCK_HEADER_BYTES + KVEDGE_BLOCK_TC_PREFIX_BYTES + 2 * bound +
                       KVEDGE_BLOCK_CHECKSUM_BYTES;
    float *x = malloc(n * sizeof *x);
    uint8_t *blk = malloc(cap);
    int rc = KVEDGE_ENOMEM;
    if (!x || !blk)
        goto fail;
    uint8_t *body = blk + KVEDGE_BLOCK_HEADER_BYTES;
    size_t pos = KVEDGE_BLOCK_TC_PREFIX_BYTES;
    const size_t body_cap = cap - KVEDGE_BLOCK_HEADER_BYTES - KVEDGE_BLOCK_CHECKSUM_BYTES;
    kvedge_convert_to_f32(in_dtype, k, n, x);
    rc = s_encode_tc_section(&shape, x, &ks, body, body_cap, &pos);
    const size_t nk = pos - KVEDGE_BLOCK_TC_PREFIX_BYTES;
    if (rc == KVEDGE_OK) {
        kvedge_convert_to_f32(in_dtype, v, n, x);
        rc = s_encode_tc_section(&shape, x, &vs, body, body_cap, &pos);
    }
    if (rc == KVEDGE_OK && pos > KVEDGE_BLOCK_MAX_BYTES)
        rc = KVEDGE_ETOOBIG;
    if (rc != KVEDGE_OK)
        goto fail;
    kvedge_le_put64(body, kvedge_basis_id(b));
    kvedge_le_put16(body + 8, (uint16_t)layer);
    kvedge_le_put16(body + 10, (uint16_t)head);
    kvedge_le_put32(body + 12, (uint32_t)nk);
    memcpy(blk, s_magic, 4);
    blk[4] = KVEDGE_BLOCK_VERSION_TC;
    blk[5] = (uint8_t)dtype;
    blk[6] = (uint8_t)KVEDGE_SCHEME_TC;
    blk[7] = 0;
    kvedge_le_put32(blk + 8, tokens);
    kvedge_le_put16(blk + 12, head_dim);
    kvedge_le_put16(blk + 14, head_dim);
    kvedge_le_put16(blk + 16, 0);
    kvedge_le_put16(blk + 18, 0);
    kvedge_le_put32(blk + 20, (uint32_t)pos);
    kvedge_le_put32(blk + 24, (uint32_t)pos);
    kvedge_le_put32(blk + 28, 0);
    const size_t covered = KVEDGE_BLOCK_HEADER_BYTES + pos;
    kvedge_le_put64(blk + covered, XXH3_64bits(blk, covered));
    free(x);
    *out_len = covered + KVEDGE_BLOCK_CHECKSUM_BYTES;
    uint8_t *shrunk = realloc(blk, *out_len);
    *out = shrunk ? shrunk : blk;
    return KVEDGE_OK;
fail:
    free(blk);
    free(x);
    return rc;
}

int kvedge_block_encode_tc(const kvedge_basis_t *b, uint32_t layer, uint32_t head,
                           kvedge_dtype_t dtype, uint32_t tokens, uint16_t head_dim, const void *k,
                           const void *v, uint8_t **out, size_t *out_len)
{
    return s_encode_tc(b, layer, head, dtype, dtype, tokens, head_dim, k, v, out, out_len);
}

int kvedge_block_encode_tc_f32(const kvedge_basis_t *b, uint32_t layer, uint32_t head,
                               kvedge_dtype_t dtype, uint32_t tokens, uint16_t head_dim,
                               const float *k, const float *v, uint8_t **out, size_t *out_len)
{
    return s_encode_tc(b, layer, head, dtype, KVEDGE_DTYPE_FP32, tokens, head_dim, k, v, out,
                       out_len);
}
