/* The precision ladder: rung names, accept lists, the rung a block is at, and deriving a block
 * at a coarser rung from a finer one (access/codec/prec.h). */
#include "access/codec/prec.h"

#include <stdlib.h>
#include <string.h>

#include "access/codec/basis.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"
#include "access/codec/tcblock.h"

/* Rank of a scheme in precision, finest first: what "coarser" means for off-ladder blocks. */
static int s_scheme_rank(kvedge_scheme_t s)
{
    switch (s) {
    case KVEDGE_SCHEME_LOSSLESS:
        return 0;
    case KVEDGE_SCHEME_INT8:
        return 1;
    case KVEDGE_SCHEME_INT4:
        return 2;
    case KVEDGE_SCHEME_TC: /* apart from the order: derives only from the ladder's rungs */
        return -1;
    }
    return -1;
}

bool kvedge_prec_valid(kvedge_prec_t p)
{
    unsigned base = KVEDGE_PREC_BASE(p), think = KVEDGE_PREC_THINK(p);
    if (base == KVEDGE_PREC_TC)
        return p == KVEDGE_PREC_TC;
    return base >= KVEDGE_PREC_LOSSLESS && base <= KVEDGE_PREC_BASE_MAX &&
           think <= KVEDGE_PREC_THINK_MAX &&
           (!KVEDGE_PREC_IS_EC(p) || base != KVEDGE_PREC_LOSSLESS);
}

kvedge_scheme_t kvedge_prec_scheme(kvedge_prec_t p)
{
    switch (KVEDGE_PREC_BASE(p)) {
    case KVEDGE_PREC_LOSSLESS:
        return KVEDGE_SCHEME_LOSSLESS;
    case KVEDGE_PREC_INT8:
        return KVEDGE_SCHEME_INT8;
    case KVEDGE_PREC_TC:
        return KVEDGE_SCHEME_TC;
    default:
        return KVEDGE_SCHEME_INT4;
    }
}

uint16_t kvedge_prec_group(kvedge_prec_t p)
{
    switch (KVEDGE_PREC_BASE(p)) {
    case KVEDGE_PREC_INT4_G32:
        return 32;
    case KVEDGE_PREC_INT4_G64:
        return 64;
    case KVEDGE_PREC_INT4_G128:
        return 128;
    default:
        return 0;
    }
}

uint32_t kvedge_prec_keep_share(uint32_t pct, uint32_t head_dim)
{
    uint32_t k = (uint32_t)(((uint64_t)head_dim * pct + 50) / 100);
    if (k == 0)
        k = 1;
    return k < head_dim ? k : head_dim;
}

uint32_t kvedge_prec_keep_channels(kvedge_prec_t p, uint32_t head_dim)
{
    switch (KVEDGE_PREC_THINK(p)) {
    case KVEDGE_PREC_THINK_75:
        return kvedge_prec_keep_share(75, head_dim);
    case KVEDGE_PREC_THINK_50:
        return kvedge_prec_keep_share(50, head_dim);
    default:
        return head_dim;
    }
}

static const char *const s_base_names[KVEDGE_PREC_BASE_MAX + 1] = {
    NULL, "lossless", "int8", "int4-g32", "int4-g64", "int4-g128", "tc",
};
static const char *const s_think_names[KVEDGE_PREC_THINK_MAX + 1] = {"", "+think-75", "+think-50"};
/* Every rung's full name, the static storage kvedge_prec_name returns. */
static const char *const s_names[KVEDGE_PREC_BASE_MAX + 1][KVEDGE_PREC_THINK_MAX + 1] = {
    {NULL, NULL, NULL},
    {"lossless", "lossless+think-75", "lossless+think-50"},
    {"int8", "int8+think-75", "int8+think-50"},
    {"int4-g32", "int4-g32+think-75", "int4-g32+think-50"},
    {"int4-g64", "int4-g64+think-75", "int4-g64+think-50"},
    {"int4-g128", "int4-g128+think-75", "int4-g128+think-50"},
    {"tc", NULL, NULL},
};
/* The same with the coding suffix; lossless has no EC rung. */
static const char *const s_names_ec[KVEDGE_PREC_BASE_MAX + 1][KVEDGE_PREC_THINK_MAX + 1] = {
    {NULL, NULL, NULL},
    {NULL, NULL, NULL},
    {"int8+ec", "int8+think-75+ec", "int8+think-50+ec"},
    {"int4-g32+ec", "int4-g32+think-75+ec", "int4-g32+think-50+ec"},
    {"int4-g64+ec", "int4-g64+think-75+ec", "int4-g64+think-50+ec"},
    {"int4-g128+ec", "int4-g128+think-75+ec", "int4-g128+think-50+ec"},
    {NULL, NULL, NULL},
};

const char *kvedge_prec_name(kvedge_prec_t p)
{
    if (p == KVEDGE_PREC_STORED)
        return "stored";
    if (!kvedge_prec_valid(p))
        return "?";
    return (KVEDGE_PREC_IS_EC(p) ? s_names_ec : s_names)[KVEDGE_PREC_BASE(p)][KVEDGE_PREC_THINK(p)];
}

/* Parses the first len bytes of name (no NUL needed). */
static int s_parse(const char *name, size_t len, kvedge_prec_t *out)
{
    bool ec = len > 3 && memcmp(name + len - 3, "+ec", 3) == 0;
    if (ec)
        len -= 3;
    const char *plus = memchr(name, '+', len);
    size_t blen = plus ? (size_t)(plus - name) : len;
    unsigned base = 0, think = KVEDGE_PREC_THINK_NONE;
    for (unsigned b = KVEDGE_PREC_LOSSLESS; b <= KVEDGE_PREC_BASE_MAX; b++)
        if (strlen(s_base_names[b]) == blen && memcmp(name, s_base_names[b], blen) == 0)
            base = b;
    if (blen == 4 && memcmp(name, "int4", 4) == 0)
        base = KVEDGE_PREC_INT4_G32;
    if (base == 0)
        return KVEDGE_EINVAL;
    if (plus) {
        size_t tlen = len - blen;
        think = 0;
        for (unsigned t = KVEDGE_PREC_THINK_75; t <= KVEDGE_PREC_THINK_MAX; t++)
            if (strlen(s_think_names[t]) == tlen && memcmp(plus, s_think_names[t], tlen) == 0)
                think = t;
        if (think == 0)
            return KVEDGE_EINVAL;
    }
    kvedge_prec_t p = (kvedge_prec_t)(KVEDGE_PREC_MAKE(base, think) | (ec ? KVEDGE_PREC_EC : 0));
    if (!kvedge_prec_valid(p))
        return KVEDGE_EINVAL; /* lossless+ec */
    *out = p;
    return KVEDGE_OK;
}

int kvedge_prec_parse(const char *name, kvedge_prec_t *out)
{
    if (!name || !out)
        return KVEDGE_EINVAL;
    return s_parse(name, strlen(name), out);
}

int kvedge_prec_list_check(const kvedge_prec_t *list, size_t n)
{
    if (!list || n == 0 || n > KVEDGE_PREC_MAX_ACCEPT)
        return KVEDGE_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!kvedge_prec_valid(list[i]))
            return KVEDGE_EINVAL;
        for (size_t j = 0; j < i; j++)
            if (list[j] == list[i])
                return KVEDGE_EINVAL;
    }
    return KVEDGE_OK;
}

int kvedge_prec_list_parse(const char *csv, kvedge_prec_t *out, size_t max, size_t *n)
{
    if (!csv || !out || !n)
        return KVEDGE_EINVAL;
    kvedge_prec_t list[KVEDGE_PREC_MAX_ACCEPT];
    size_t count = 0;
    const char *p = csv;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (count == KVEDGE_PREC_MAX_ACCEPT || count == max || len == 0 ||
            s_parse(p, len, &list[count]) != KVEDGE_OK)
            return KVEDGE_EINVAL;
        count++;
        if (!comma)
            break;
        p = comma + 1;
    }
    int rc = kvedge_prec_list_check(list, count);
    if (rc != KVEDGE_OK)
        return rc;
    memcpy(out, list, count * sizeof *list);
    *n = count;
    return KVEDGE_OK;
}

kvedge_prec_t kvedge_prec_of_shape(kvedge_scheme_t scheme, uint16_t group_size,
                                   uint32_t key_channels, uint32_t head_dim)
{
    unsigned base = 0;
    switch (scheme) {
    case KVEDGE_SCHEME_LOSSLESS:
        base = group_size == 0 ? KVEDGE_PREC_LOSSLESS : 0;
        break;
    case KVEDGE_SCHEME_INT8:
        base = group_size == 0 ? KVEDGE_PREC_INT8 : 0;
        break;
    case KVEDGE_SCHEME_INT4:
        base = group_size == 32    ? KVEDGE_PREC_INT4_G32
               : group_size == 64  ? KVEDGE_PREC_INT4_G64
               : group_size == 128 ? KVEDGE_PREC_INT4_G128
                                   : 0;
        break;
    case KVEDGE_SCHEME_TC: /* every key channel, no group */
        return group_size == 0 && head_dim != 0 && key_channels == head_dim ? KVEDGE_PREC_TC
                                                                            : KVEDGE_PREC_STORED;
    }
    if (base == 0 || head_dim == 0)
        return KVEDGE_PREC_STORED;
    /* The shallowest level whose count matches: every deeper one derives from it. */
    const uint32_t d = head_dim, kc = key_channels;
    unsigned think;
    if (kc == d)
        think = KVEDGE_PREC_THINK_NONE;
    else if (kc == kvedge_prec_keep_share(75, d))
        think = KVEDGE_PREC_THINK_75;
    else if (kc == kvedge_prec_keep_share(50, d))
        think = KVEDGE_PREC_THINK_50;
    else
        return KVEDGE_PREC_STORED;
    return KVEDGE_PREC_MAKE(base, think);
}

kvedge_prec_t kvedge_prec_of_block(const kvedge_block_info_t *info)
{
    if (!info)
        return KVEDGE_PREC_STORED;
    kvedge_prec_t p =
        kvedge_prec_of_shape(info->scheme, info->group_size,
                             info->key_mask ? info->key_channels : info->head_dim, info->head_dim);
    return p != KVEDGE_PREC_STORED && info->ec ? (kvedge_prec_t)(p | KVEDGE_PREC_EC) : p;
}

bool kvedge_prec_derivable(kvedge_prec_t from, kvedge_prec_t to)
{
    if (!kvedge_prec_valid(from) || !kvedge_prec_valid(to))
        return false;
    /* tc stands apart from the int4 order: from lossless or int8 over every key channel. */
    if (to == KVEDGE_PREC_TC)
        return KVEDGE_PREC_THINK(from) == KVEDGE_PREC_THINK_NONE &&
               (KVEDGE_PREC_BASE(from) == KVEDGE_PREC_LOSSLESS ||
                KVEDGE_PREC_BASE(from) == KVEDGE_PREC_INT8 || from == KVEDGE_PREC_TC);
    if (from == KVEDGE_PREC_TC)
        return false;
    /* The coding bit is ignored: a body is coded or uncoded without loss. */
    return KVEDGE_PREC_BASE(to) >= KVEDGE_PREC_BASE(from) &&
           KVEDGE_PREC_THINK(to) >= KVEDGE_PREC_THINK(from);
}

/* The spec of rung p for a shape; mask is the key mask to use, or NULL. */
static void s_spec(kvedge_prec_t p, kvedge_dtype_t dtype, uint32_t tokens, uint32_t head_dim,
                   const uint8_t *mask, bool lz4, kvedge_block_spec_t *spec)
{
    memset(spec, 0, sizeof *spec);
    spec->dtype = dtype;
    spec->scheme = kvedge_prec_scheme(p);
    spec->tokens = tokens;
    spec->head_dim = (uint16_t)head_dim;
    spec->group_size = kvedge_prec_group(p);
    spec->key_mask = mask;
    spec->lz4 = lz4;
}

double kvedge_prec_bytes_per_fp16(kvedge_prec_t p, uint32_t tokens, uint32_t head_dim,
                                  size_t elem_bytes)
{
    kvedge_dtype_t dtype;
    if (elem_bytes == 2)
        dtype = KVEDGE_DTYPE_FP16;
    else if (elem_bytes == 4)
        dtype = KVEDGE_DTYPE_FP32;
    else
        return 0.0;
    if (!kvedge_prec_valid(p) || tokens == 0 || tokens > KVEDGE_BLOCK_MAX_TOKENS || head_dim == 0 ||
        head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM)
        return 0.0;
    if (p == KVEDGE_PREC_TC) /* priced from int8's exact size */
        return KVEDGE_PREC_TC_RATIO *
               kvedge_prec_bytes_per_fp16(KVEDGE_PREC_INT8, tokens, head_dim, elem_bytes);
    /* Only the count of kept channels sets the size: keep the first ones. */
    uint8_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8] = {0};
    const uint32_t keep = kvedge_prec_keep_channels(p, head_dim);
    for (uint32_t c = 0; c < keep; c++)
        mask[c >> 3] |= (uint8_t)(1u << (c & 7));
    kvedge_block_spec_t spec;
    s_spec(p, dtype, tokens, head_dim, keep < head_dim ? mask : NULL, false, &spec);
    size_t bytes = kvedge_block_encoded_bound(&spec);
    if (bytes == 0)
        return 0.0;
    double ratio = !KVEDGE_PREC_IS_EC(p)                         ? 1.0
                   : kvedge_prec_scheme(p) == KVEDGE_SCHEME_INT8 ? KVEDGE_PREC_EC_RATIO_INT8
                                                                 : KVEDGE_PREC_EC_RATIO_INT4;
    return ratio * (double)bytes / (double)kvedge_block_fp16_bytes(tokens, (uint16_t)head_dim);
}

double kvedge_prec_decode_us_per_byte(kvedge_prec_t p)
{
    if (p == KVEDGE_PREC_TC)
        return KVEDGE_PREC_TC_DECODE_US_PER_BYTE;
    if (!kvedge_prec_valid(p) || !KVEDGE_PREC_IS_EC(p))
        return 0.0;
    return kvedge_prec_scheme(p) == KVEDGE_SCHEME_INT8 ? KVEDGE_PREC_EC_DECODE_US_PER_BYTE_INT8
                                                       : KVEDGE_PREC_EC_DECODE_US_PER_BYTE_INT4;
}

/* True when the block at rung `from` (its info) may be re-encoded at `to`. */
static bool s_may_derive(const kvedge_block_info_t *in, kvedge_prec_t from, kvedge_prec_t to)
{
    if (from != KVEDGE_PREC_STORED)
        return kvedge_prec_derivable(from, to);
    /* Off the ladder: only a coarser scheme over every key channel, whose values are sure to
     * lose at least what the stored block lost. */
    int have = s_scheme_rank(in->scheme), want = s_scheme_rank(kvedge_prec_scheme(to));
    return kvedge_prec_valid(to) && KVEDGE_PREC_THINK(to) == KVEDGE_PREC_THINK_NONE &&
           in->key_mask == NULL && have >= 0 && want > have;
}

static bool s_bit(const uint8_t *mask, uint32_t c)
{
    return (mask[c >> 3] >> (c & 7)) & 1u;
}

/* kvedge_synth_key_mask over the decoded keys can pick a channel the source dropped only on a
 * tie at zero mean |K| (a kept channel of all zeros); swap such picks for unpicked kept ones,
 * which are zero too, so the choice stays a subset of the source's mask. */
static void s_mask_within(uint8_t *mask, const uint8_t *src, uint32_t head_dim)
{
    uint32_t spare = 0;
    for (uint32_t c = 0; c < head_dim; c++) {
        if (!s_bit(mask, c) || s_bit(src, c))
            continue;
        while (spare < head_dim && (!s_bit(src, spare) || s_bit(mask, spare)))
            spare++;
        if (spare == head_dim)
            return; /* cannot happen: the source keeps at least as many channels */
        mask[c >> 3] &= (uint8_t) ~(1u << (c & 7));
        mask[spare >> 3] |= (uint8_t)(1u << (spare & 7));
    }
}

/* The key mask of rung `to` for the decoded keys k (in the block's dtype); *use is false when
 * the rung keeps every channel. */
static int s_choose_mask(const kvedge_block_info_t *in, kvedge_prec_t to, const void *k,
                         uint8_t *mask, bool *use)
{
    const uint32_t d = in->head_dim, keep = kvedge_prec_keep_channels(to, d);
    *use = keep < d;
    if (!*use)
        return KVEDGE_OK;
    memset(mask, 0, (d + 7) / 8);
    if (in->key_mask && in->key_channels == keep) {
        /* Same share as the source: its choice, made over the values before they lost any. */
        memcpy(mask, in->key_mask, (d + 7) / 8);
        return KVEDGE_OK;
    }
    const size_t n = (size_t)in->tokens * d;
    float *kf = malloc(n * sizeof *kf);
    if (!kf)
        return KVEDGE_ENOMEM;
    kvedge_convert_to_f32(in->dtype, k, n, kf);
    int rc = kvedge_synth_key_mask(kf, in->tokens, d, keep, mask);
    free(kf);
    if (rc == KVEDGE_OK && in->key_mask)
        s_mask_within(mask, in->key_mask, d);
    return rc;
}

/* An EC rung whose values differ from the block's: the plain rung's transcode, then coded. */
static int s_transcode_coded(const kvedge_block_info_t *in, kvedge_prec_t plain_to, uint8_t **out,
                             size_t *out_len)
{
    uint8_t *plain = NULL;
    size_t plen = 0;
    int rc = kvedge_block_transcode(in, plain_to, false, &plain, &plen);
    kvedge_block_info_t pi;
    if (rc == KVEDGE_OK)
        rc = kvedge_block_parse(plain, plen, &pi);
    if (rc == KVEDGE_OK)
        rc = kvedge_block_recode(&pi, true, false, out, out_len);
    free(plain);
    return rc;
}

/* A copy of a verified block's bytes: header, mask, body, checksum. */
static int s_copy(const kvedge_block_info_t *in, uint8_t **out, size_t *out_len)
{
    const size_t len = KVEDGE_BLOCK_HEADER_BYTES +
                       (in->key_mask ? KVEDGE_BLOCK_MASK_BYTES(in->head_dim) : 0) +
                       (size_t)in->stored_len + KVEDGE_BLOCK_CHECKSUM_BYTES;
    uint8_t *blk = malloc(len);
    if (!blk)
        return KVEDGE_ENOMEM;
    const uint8_t *start = in->body - (len - KVEDGE_BLOCK_CHECKSUM_BYTES - in->stored_len);
    memcpy(blk, start, len);
    *out = blk;
    *out_len = len;
    return KVEDGE_OK;
}

int kvedge_block_transcode(const kvedge_block_info_t *in, kvedge_prec_t to, bool lz4, uint8_t **out,
                           size_t *out_len)
{
    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!in || !out || !out_len || !in->body || !kvedge_prec_valid(to))
        return KVEDGE_EINVAL;
    const size_t es = kvedge_dtype_size(in->dtype);
    const kvedge_prec_t from = kvedge_prec_of_block(in);
    if (es == 0 || in->tokens == 0 || in->head_dim == 0 || !s_may_derive(in, from, to))
        return KVEDGE_EINVAL;
    if (to == KVEDGE_PREC_TC) /* tc from tc: the same block; else the basis needs a location */
        return from == KVEDGE_PREC_TC ? s_copy(in, out, out_len) : KVEDGE_ENOBASIS;
    const kvedge_prec_t plain_to = (kvedge_prec_t)(to & ~KVEDGE_PREC_EC);
    if (from != KVEDGE_PREC_STORED && (kvedge_prec_t)(from & ~KVEDGE_PREC_EC) == plain_to &&
        (KVEDGE_PREC_IS_EC(from) || KVEDGE_PREC_IS_EC(to)))
        /* Only the coding differs: the same codes, coded or uncoded. */
        return kvedge_block_recode(in, KVEDGE_PREC_IS_EC(to), lz4 && !KVEDGE_PREC_IS_EC(to), out,
                                   out_len);
    if (KVEDGE_PREC_IS_EC(to))
        return s_transcode_coded(in, plain_to, out, out_len);

    const size_t n = (size_t)in->tokens * in->head_dim;
    const void *k, *v;
    void *buf = NULL;
    int rc;
    if (in->scheme == KVEDGE_SCHEME_LOSSLESS && !in->key_mask &&
        (in->lz4 || ((uintptr_t)in->body & 3u) == 0)) {
        /* Lossless over every channel: the body already is K then V in the block's dtype
         * (never entropy-coded: the coding is for quantized blocks only). */
        const uint8_t *raw = in->body;
        if (in->lz4) {
            buf = malloc(in->raw_len);
            if (!buf)
                return KVEDGE_ENOMEM;
            rc = kvedge_block_body(in, buf, in->raw_len, &raw);
            if (rc != KVEDGE_OK) {
                free(buf);
                return rc;
            }
        }
        k = raw;
        v = raw + n * es;
    } else {
        buf = malloc(2 * n * es);
        if (!buf)
            return KVEDGE_ENOMEM;
        rc = kvedge_block_decode(in, in->dtype, buf, (uint8_t *)buf + n * es);
        if (rc != KVEDGE_OK) {
            free(buf);
            return rc;
        }
        k = buf;
        v = (uint8_t *)buf + n * es;
    }

    uint8_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8];
    bool masked = false;
    rc = s_choose_mask(in, to, k, mask, &masked);
    kvedge_block_spec_t spec;
    s_spec(to, in->dtype, in->tokens, in->head_dim, masked ? mask : NULL, lz4, &spec);
    size_t cap = rc == KVEDGE_OK ? kvedge_block_encoded_bound(&spec) : 0, len = 0;
    uint8_t *blk = NULL;
    if (rc == KVEDGE_OK && cap == 0)
        rc = KVEDGE_EINVAL;
    if (rc == KVEDGE_OK && !(blk = malloc(cap)))
        rc = KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK)
        rc = kvedge_block_encode(&spec, k, v, blk, cap, &len);
    free(buf);
    if (rc != KVEDGE_OK) {
        free(blk);
        return rc;
    }
    if (len < cap) {
        uint8_t *shrunk = realloc(blk, len);
        if (shrunk)
            blk = shrunk;
    }
    *out = blk;
    *out_len = len;
    return KVEDGE_OK;
}

int kvedge_block_transcode_at(const kvedge_block_info_t *in, kvedge_prec_t to, bool lz4,
                              const char *model_id, uint32_t layer, uint32_t head, uint8_t **out,
                              size_t *out_len)
{
    if (to != KVEDGE_PREC_TC)
        return kvedge_block_transcode(in, to, lz4, out, out_len);
    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!in || !out || !out_len || !in->body || !model_id)
        return KVEDGE_EINVAL;
    const size_t es = kvedge_dtype_size(in->dtype);
    const kvedge_prec_t from = kvedge_prec_of_block(in);
    if (es == 0 || in->tokens == 0 || in->head_dim == 0 || !kvedge_prec_derivable(from, to))
        return KVEDGE_EINVAL;
    if (from == KVEDGE_PREC_TC)
        return s_copy(in, out, out_len);
    const kvedge_basis_t *b = kvedge_basis_find_model(model_id);
    if (!b)
        return KVEDGE_ENOBASIS;
    if (kvedge_basis_head_dim(b) != in->head_dim || layer >= kvedge_basis_layers(b) ||
        head >= kvedge_basis_kv_heads(b))
        return KVEDGE_ESHAPE;
    /* Decoded to fp32, so int8's dequantized values reach the projection unrounded. */
    const size_t n = (size_t)in->tokens * in->head_dim;
    float *kv = malloc(2 * n * sizeof *kv);
    if (!kv)
        return KVEDGE_ENOMEM;
    int rc = kvedge_block_decode(in, KVEDGE_DTYPE_FP32, kv, kv + n);
    if (rc == KVEDGE_OK)
        rc = kvedge_block_encode_tc_f32(b, layer, head, in->dtype, in->tokens, in->head_dim, kv,
                                        kv + n, out, out_len);
    free(kv);
    return rc;
}
