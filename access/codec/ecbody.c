/* Entropy-coded block bodies (ecbody.h): transforms of the code sections and the htscodecs rANS
 * streams, bounded by the lengths the block header implies. */
#include "access/codec/ecbody.h"

#include <htscodecs/rANS_static4x16.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/byteorder.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"

void kvedge_ec_choice_default(kvedge_ec_choice_t *c, unsigned bits)
{
    /* bench_entropy on the trained models' K/V (docs/benchmarks.md "Entropy coding"): the fp16
     * params gain about a fifth coded as two byte streams (high bytes: sign and exponent, few
     * values); min-max codes are close to uniform, so order 0 is as good as order 1 (whose
     * tables cost more than they save at 256 tokens) and token deltas make them worse; int4
     * codes one per byte beat packed pairs. The 4-way stream: 32-way's extra states cost more
     * bytes than its faster decode saves at these sizes. */
    c->xf[0] = c->xf[1] = KVEDGE_EC_XF_NONE;
    c->order[0] = c->order[1] = KVEDGE_EC_ORDER0 | RANS_ORDER_STRIPE | (2 << 8);
    c->xf[2] = c->xf[3] = bits == 4 ? KVEDGE_EC_XF_UNPACK : KVEDGE_EC_XF_NONE;
    c->order[2] = c->order[3] = KVEDGE_EC_ORDER0;
}

static bool s_shape_ok(const kvedge_ec_shape_t *s)
{
    if (!s || (s->bits != 8 && s->bits != 4) || s->tokens == 0 || s->key_channels == 0 ||
        s->head_dim == 0 || s->key_channels > s->head_dim)
        return false;
    if (s->len[2] != (uint64_t)s->tokens * kvedge_quant_row_bytes(s->key_channels, s->bits) ||
        s->len[3] != (uint64_t)s->tokens * kvedge_quant_row_bytes(s->head_dim, s->bits))
        return false;
    uint64_t sum = 0;
    for (int i = 0; i < KVEDGE_EC_SECTIONS; i++) {
        if (s->len[i] == 0 || s->len[i] > UINT32_MAX / 2)
            return false;
        sum += s->len[i];
    }
    return sum <= UINT32_MAX / 2;
}

size_t kvedge_ec_bound(const kvedge_ec_shape_t *s)
{
    if (!s_shape_ok(s))
        return 0;
    return (size_t)(s->len[0] + s->len[1] + s->len[2] + s->len[3]) + KVEDGE_EC_OVERHEAD_BYTES;
}

static uint32_t s_channels(const kvedge_ec_shape_t *s, int sec)
{
    return sec == 2 ? s->key_channels : s->head_dim;
}

/* Bytes a section has once transformed. */
static uint64_t s_xf_len(const kvedge_ec_shape_t *s, int sec, uint8_t xf)
{
    return xf == KVEDGE_EC_XF_NONE ? s->len[sec] : (uint64_t)s->tokens * s_channels(s, sec);
}

/* Rows of packed int4 codes -> one code per byte. */
static void s_forward(const kvedge_ec_shape_t *s, int sec, const uint8_t *src, uint8_t *dst)
{
    const uint32_t T = s->tokens, n = s_channels(s, sec);
    const size_t row = kvedge_quant_row_bytes(n, 4);
    for (uint32_t t = 0; t < T; t++)
        kvedge_quant_unpack4(src + (size_t)t * row, n, dst + (size_t)t * n);
}

/* The inverse of s_forward; refuses a code over 15. */
static int s_inverse(const kvedge_ec_shape_t *s, int sec, const uint8_t *src, uint8_t *dst)
{
    const uint32_t T = s->tokens, n = s_channels(s, sec);
    const size_t row = kvedge_quant_row_bytes(n, 4);
    uint8_t bad = 0;
    for (size_t i = 0; i < (size_t)T * n; i++)
        bad |= src[i];
    if (bad & 0xF0u)
        return KVEDGE_ECORRUPT;
    for (uint32_t t = 0; t < T; t++) {
        const uint8_t *c = src + (size_t)t * n;
        uint8_t *r = dst + (size_t)t * row;
        for (uint32_t j = 0; j < n / 2; j++)
            r[j] = (uint8_t)(c[2 * j] | (c[2 * j + 1] << 4));
        if (n & 1u)
            r[n / 2] = c[n - 1];
    }
    return KVEDGE_OK;
}

/* htscodecs' 7-bit big-endian varint (varint.h with BIG_END, what the library writes): at
 * most 6 bytes; returns the bytes read, 0 when none are left. */
static size_t s_varint(const uint8_t *p, const uint8_t *end, uint32_t *v)
{
    const uint8_t *op = p;
    uint32_t j = 0;
    uint8_t c;
    int left = 6;
    do {
        if (p >= end || left-- == 0)
            return 0;
        c = *p++;
        j = (j << 7) | (c & 0x7Fu);
    } while (c & 0x80u);
    *v = j;
    return (size_t)(p - op);
}

/* True when a stream uses only the layouts our encoder writes: order 0/1, CAT, NOSZ, 32-way,
 * and one level of STRIPE. PACK and RLE are refused: their side tables carry sizes the library
 * allocates and fills before checking them against ours, so a hostile table could make a
 * reader allocate gigabytes. */
static bool s_stream_ok(const uint8_t *in, uint32_t n, bool top)
{
    if (n == 0 || (in[0] & (RANS_ORDER_PACK | RANS_ORDER_RLE)))
        return false;
    if (!(in[0] & RANS_ORDER_STRIPE))
        return true;
    const uint8_t *p = in + 1, *end = in + n;
    uint32_t ulen, N, clen[256];
    size_t k = s_varint(p, end, &ulen);
    if (!top || k == 0 || p + k >= end)
        return false;
    p += k;
    N = *p++;
    if (N == 0)
        return false;
    for (uint32_t i = 0; i < N; i++) {
        k = s_varint(p, end, &clen[i]);
        if (k == 0)
            return false;
        p += k;
    }
    for (uint32_t i = 0; i < N; i++) {
        if (clen[i] > (uint32_t)(end - p) || !s_stream_ok(p, clen[i], false))
            return false;
        p += clen[i];
    }
    return true;
}

int kvedge_ec_stream_encode(const uint8_t *in, uint64_t len, int order, uint8_t **out,
                            unsigned *out_len)
{
    if (!in || !out || !out_len || len == 0 || len > UINT32_MAX / 2)
        return KVEDGE_EINVAL;
    unsigned cap = rans_compress_bound_4x16((unsigned)len, order);
    uint8_t *buf = malloc(cap);
    if (!buf)
        return KVEDGE_ENOMEM;
    unsigned n = cap;
    if (!rans_compress_to_4x16((unsigned char *)in, (unsigned)len, buf, &n, order) || n > cap) {
        free(buf);
        return KVEDGE_ENOMEM;
    }
    *out = buf;
    *out_len = n;
    return KVEDGE_OK;
}

/* Codes one section: its record (transform, length) and stream at out + *pos. */
static int s_encode_section(const kvedge_ec_shape_t *s, int sec, const uint8_t *src, uint8_t xf,
                            int order, uint8_t *tmp, uint8_t *out, size_t out_cap, size_t *pos)
{
    const uint8_t *in = src;
    if (xf != KVEDGE_EC_XF_NONE) {
        s_forward(s, sec, src, tmp);
        in = tmp;
    }
    uint8_t *stream;
    unsigned n;
    int rc = kvedge_ec_stream_encode(in, s_xf_len(s, sec, xf), order, &stream, &n);
    if (rc == KVEDGE_OK && n >= s->len[sec] && (xf != KVEDGE_EC_XF_NONE || order != 0)) {
        /* Nothing paid: the plain section at order 0, which rANS stores as it is (CAT, at most
         * 6 bytes more), keeping the body within KVEDGE_EC_OVERHEAD_BYTES of the raw one. */
        free(stream);
        xf = KVEDGE_EC_XF_NONE;
        rc = kvedge_ec_stream_encode(src, s->len[sec], KVEDGE_EC_ORDER0, &stream, &n);
    }
    if (rc != KVEDGE_OK)
        return rc;
    if (*pos + KVEDGE_EC_RECORD_BYTES + n > out_cap) {
        free(stream);
        return KVEDGE_ENOSPACE;
    }
    out[*pos] = xf;
    kvedge_le_put32(out + *pos + 1, n);
    memcpy(out + *pos + KVEDGE_EC_RECORD_BYTES, stream, n);
    *pos += KVEDGE_EC_RECORD_BYTES + n;
    free(stream);
    return KVEDGE_OK;
}

int kvedge_ec_encode(const kvedge_ec_shape_t *s, const uint8_t *raw, const kvedge_ec_choice_t *c,
                     uint8_t *out, size_t out_cap, size_t *out_len)
{
    kvedge_ec_choice_t def;
    if (!s_shape_ok(s) || !raw || !out || !out_len)
        return KVEDGE_EINVAL;
    if (!c) {
        kvedge_ec_choice_default(&def, s->bits);
        c = &def;
    }
    for (int i = 0; i < KVEDGE_EC_SECTIONS; i++)
        if (c->xf[i] > KVEDGE_EC_XF_MAX ||
            ((i < 2 || s->bits == 8) && c->xf[i] != KVEDGE_EC_XF_NONE))
            return KVEDGE_EINVAL;
    uint8_t *tmp = malloc((size_t)s->tokens * s->head_dim);
    if (!tmp)
        return KVEDGE_ENOMEM;
    size_t pos = 0, off = 0;
    int rc = KVEDGE_OK;
    for (int i = 0; i < KVEDGE_EC_SECTIONS && rc == KVEDGE_OK; i++) {
        rc = s_encode_section(s, i, raw + off, c->xf[i], c->order[i], tmp, out, out_cap, &pos);
        off += s->len[i];
    }
    free(tmp);
    if (rc == KVEDGE_OK)
        *out_len = pos;
    return rc;
}

int kvedge_ec_stream_decode(const uint8_t *in, uint32_t n, uint8_t *out, uint64_t want)
{
    if (!in || !out || want == 0 || want > UINT32_MAX / 2)
        return KVEDGE_EINVAL;
    /* The library checks the size a stream claims against ours and refuses a larger one; a
     * shorter one is refused here. */
    unsigned got = (unsigned)want;
    if (!s_stream_ok(in, n, true) || !rans_uncompress_to_4x16((unsigned char *)in, n, out, &got) ||
        got != want)
        return KVEDGE_ECORRUPT;
    return KVEDGE_OK;
}

int kvedge_ec_decode(const kvedge_ec_shape_t *s, const uint8_t *in, size_t in_len, uint8_t *raw)
{
    if (!s_shape_ok(s) || !in || !raw)
        return KVEDGE_EINVAL;
    uint8_t *tmp = NULL;
    size_t pos = 0, off = 0;
    int rc = KVEDGE_OK;
    for (int i = 0; i < KVEDGE_EC_SECTIONS && rc == KVEDGE_OK; i++) {
        rc = KVEDGE_ECORRUPT;
        if (in_len - pos < KVEDGE_EC_RECORD_BYTES)
            break;
        const uint8_t xf = in[pos];
        const uint32_t n = kvedge_le_get32(in + pos + 1);
        pos += KVEDGE_EC_RECORD_BYTES;
        if (xf > KVEDGE_EC_XF_MAX || ((i < 2 || s->bits == 8) && xf != KVEDGE_EC_XF_NONE) ||
            n == 0 || n > in_len - pos)
            break;
        const uint64_t want = s_xf_len(s, i, xf);
        uint8_t *dst = raw + off;
        if (xf != KVEDGE_EC_XF_NONE) {
            if (!tmp && !(tmp = malloc((size_t)s->tokens * s->head_dim))) {
                rc = KVEDGE_ENOMEM;
                break;
            }
            dst = tmp;
        }
        if (kvedge_ec_stream_decode(in + pos, n, dst, want) != KVEDGE_OK)
            break;
        rc = xf == KVEDGE_EC_XF_NONE ? KVEDGE_OK : s_inverse(s, i, tmp, raw + off);
        pos += n;
        off += s->len[i];
    }
    free(tmp);
    if (rc == KVEDGE_OK && pos != in_len)
        rc = KVEDGE_ECORRUPT;
    return rc;
}
