/* Entropy-coded block bodies (flag EC, version 2): lossless round trips over every quantized
 * layout (int8, int4 at odd widths, groups, ThinK-pruned keys), the same dequantized values as
 * the plain block, and refusal of hostile coded bodies and inconsistent headers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <htscodecs/rANS_static4x16.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "access/codec/block.h"
#include "access/codec/byteorder.h"
#include "access/codec/ecbody.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"

/* A plain quantized block of synthetic K/V; *len its length. Caller frees. */
static uint8_t *s_plain(kvedge_scheme_t scheme, uint32_t tokens, uint16_t head_dim, uint16_t group,
                        bool masked, size_t *len)
{
    const size_t n = (size_t)tokens * head_dim;
    uint8_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8] = {0};
    uint16_t *k = malloc(n * 2), *v = malloc(n * 2);
    float *kf = malloc(n * sizeof(float));
    assert_non_null(k);
    assert_non_null(v);
    assert_non_null(kf);
    assert_int_equal(
        kvedge_synth_head(11 + tokens + head_dim, 0, tokens, head_dim, KVEDGE_DTYPE_FP16, k, v), 0);
    if (masked) {
        kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, k, n, kf);
        kvedge_synth_key_mask(kf, tokens, head_dim, head_dim > 1 ? head_dim / 2 : 1, mask);
    }
    kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP16,
                                .scheme = scheme,
                                .tokens = tokens,
                                .head_dim = head_dim,
                                .group_size = group,
                                .key_mask = masked ? mask : NULL};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blk = malloc(cap);
    assert_non_null(blk);
    assert_int_equal(kvedge_block_encode(&spec, k, v, blk, cap, len), KVEDGE_OK);
    free(k);
    free(v);
    free(kf);
    return blk;
}

/* Plain -> coded -> plain: the coded block is version 2 with flag EC, its body decodes to the
 * plain body byte for byte, it dequantizes to the same floats, and coding back gives the plain
 * block exactly. */
static void s_round_trip(kvedge_scheme_t scheme, uint32_t tokens, uint16_t head_dim, uint16_t group,
                         bool masked)
{
    size_t plen;
    uint8_t *plain = s_plain(scheme, tokens, head_dim, group, masked, &plen);
    kvedge_block_info_t pi, ci;
    assert_int_equal(kvedge_block_parse(plain, plen, &pi), KVEDGE_OK);

    uint8_t *coded = NULL;
    size_t clen = 0;
    assert_int_equal(kvedge_block_recode(&pi, true, false, &coded, &clen), KVEDGE_OK);
    assert_int_equal(kvedge_block_check(coded, clen, &ci), KVEDGE_OK);
    assert_true(ci.ec);
    assert_false(ci.lz4);
    assert_int_equal(ci.version, KVEDGE_BLOCK_VERSION_EC);
    assert_int_equal(coded[4], 2);
    assert_true(coded[7] & KVEDGE_BLOCK_FLAG_EC);
    assert_int_equal(ci.raw_len, pi.raw_len);
    assert_true(ci.stored_len <= (uint64_t)pi.raw_len + KVEDGE_EC_OVERHEAD_BYTES);
    assert_int_equal(ci.key_channels, pi.key_channels);
    assert_int_equal(ci.key_mask != NULL, masked);

    uint8_t *scratch = malloc(ci.raw_len);
    const uint8_t *raw;
    assert_non_null(scratch);
    assert_int_equal(kvedge_block_body(&ci, scratch, ci.raw_len, &raw), KVEDGE_OK);
    assert_memory_equal(raw, pi.body, pi.raw_len);
    assert_int_equal(kvedge_block_body(&ci, scratch, ci.raw_len - 1, &raw), KVEDGE_ENOSPACE);

    /* Quality is the plain rung's: the same dequantized values, bit for bit. */
    const size_t n = (size_t)tokens * head_dim;
    float *a = malloc(4 * n * sizeof(float));
    assert_non_null(a);
    assert_int_equal(kvedge_block_decode(&pi, KVEDGE_DTYPE_FP32, a, a + n), KVEDGE_OK);
    assert_int_equal(kvedge_block_decode(&ci, KVEDGE_DTYPE_FP32, a + 2 * n, a + 3 * n), KVEDGE_OK);
    assert_memory_equal(a, a + 2 * n, 2 * n * sizeof(float));

    uint8_t *back = NULL;
    size_t blen = 0;
    assert_int_equal(kvedge_block_recode(&ci, false, false, &back, &blen), KVEDGE_OK);
    assert_int_equal(blen, plen);
    assert_memory_equal(back, plain, plen);

    free(back);
    free(a);
    free(scratch);
    free(coded);
    free(plain);
}

static void test_round_trip_every_layout(void **state)
{
    (void)state;
    const uint32_t tokens[] = {1, 3, 64, 256};
    const uint16_t dims[] = {1, 7, 32, 33, 128};
    const uint16_t groups[] = {0, 32};
    for (int s = KVEDGE_SCHEME_INT8; s <= KVEDGE_SCHEME_INT4; s++)
        for (size_t t = 0; t < sizeof tokens / sizeof *tokens; t++)
            for (size_t d = 0; d < sizeof dims / sizeof *dims; d++)
                for (size_t g = 0; g < 2; g++)
                    for (int m = 0; m < 2; m++)
                        s_round_trip((kvedge_scheme_t)s, tokens[t], dims[d], groups[g], m);
}

/* Random codes (incompressible) still code, within the overhead bound, and round-trip. */
static void test_incompressible_body_stays_bounded(void **state)
{
    (void)state;
    kvedge_ec_shape_t s = {.tokens = 64, .key_channels = 33, .head_dim = 33, .bits = 4};
    s.len[0] = 2 * 33 * 4;
    s.len[1] = 64 * 2 * 4;
    s.len[2] = s.len[3] = 64 * kvedge_quant_row_bytes(33, 4);
    size_t raw_len = (size_t)(s.len[0] + s.len[1] + s.len[2] + s.len[3]);
    uint8_t *raw = malloc(raw_len), *back = malloc(raw_len);
    size_t cap = kvedge_ec_bound(&s), n = 0;
    uint8_t *out = malloc(cap);
    assert_true(cap == raw_len + KVEDGE_EC_OVERHEAD_BYTES);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < raw_len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        raw[i] = (uint8_t)x;
    }
    /* The odd rows' padding nibbles must be zero in a valid body. */
    for (size_t sec = 2, off = s.len[0] + s.len[1]; sec < 4; off += s.len[sec], sec++)
        for (uint32_t t = 0; t < s.tokens; t++)
            raw[off + (t + 1) * kvedge_quant_row_bytes(33, 4) - 1] &= 0x0F;
    assert_int_equal(kvedge_ec_encode(&s, raw, NULL, out, cap, &n), KVEDGE_OK);
    assert_true(n <= cap);
    assert_int_equal(kvedge_ec_decode(&s, out, n, back), KVEDGE_OK);
    assert_memory_equal(back, raw, raw_len);
    assert_int_equal(kvedge_ec_encode(&s, raw, NULL, out, n - 1, &n), KVEDGE_ENOSPACE);
    free(out);
    free(raw);
    free(back);
}

/* Rewrites the checksum after a header or body was changed on purpose. */
static void s_reseal(uint8_t *blk, size_t len)
{
    kvedge_le_put64(blk + len - 8, XXH3_64bits(blk, len - 8));
}

static uint8_t *s_coded(kvedge_scheme_t scheme, uint16_t head_dim, size_t *len,
                        kvedge_block_info_t *info)
{
    size_t plen;
    uint8_t *plain = s_plain(scheme, 64, head_dim, 32, false, &plen), *coded = NULL;
    kvedge_block_info_t pi;
    assert_int_equal(kvedge_block_parse(plain, plen, &pi), KVEDGE_OK);
    assert_int_equal(kvedge_block_recode(&pi, true, false, &coded, len), KVEDGE_OK);
    free(plain);
    assert_int_equal(kvedge_block_parse(coded, *len, info), KVEDGE_OK);
    return coded;
}

static void test_header_rules(void **state)
{
    (void)state;
    size_t len;
    kvedge_block_info_t info;
    uint8_t *blk = s_coded(KVEDGE_SCHEME_INT8, 32, &len, &info);
    /* A version-1 reader's view: version 2 is an unsupported version, refused before anything
     * else; this reader accepts 2 only together with flag EC and never with LZ4. */
    blk[4] = KVEDGE_BLOCK_VERSION_TC + 1;
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_EVERSION);
    blk[4] = KVEDGE_BLOCK_VERSION_TC; /* version 3 is scheme tc's alone */
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_ECORRUPT);
    blk[4] = 1; /* EC at version 1 */
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_ECORRUPT);
    blk[4] = 2;
    blk[7] &= (uint8_t)~KVEDGE_BLOCK_FLAG_EC; /* version 2 without EC */
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_ECORRUPT);
    blk[7] |= KVEDGE_BLOCK_FLAG_EC | KVEDGE_BLOCK_FLAG_LZ4; /* EC with LZ4 */
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_ECORRUPT);
    blk[7] &= (uint8_t)~KVEDGE_BLOCK_FLAG_LZ4;
    blk[6] = KVEDGE_SCHEME_LOSSLESS; /* EC on a lossless body */
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_ECORRUPT);
    blk[6] = KVEDGE_SCHEME_INT8;
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_check(blk, len, &info), KVEDGE_OK);
    free(blk);

    /* A stored length past raw_len + KVEDGE_EC_OVERHEAD_BYTES is refused from the header. */
    blk = s_coded(KVEDGE_SCHEME_INT4, 2, &len, &info);
    const uint32_t over = info.raw_len + KVEDGE_EC_OVERHEAD_BYTES + 1;
    size_t blen = KVEDGE_BLOCK_HEADER_BYTES + over + KVEDGE_BLOCK_CHECKSUM_BYTES;
    uint8_t *big = calloc(1, blen);
    assert_non_null(big);
    memcpy(big, blk, KVEDGE_BLOCK_HEADER_BYTES);
    kvedge_le_put32(big + 24, over);
    s_reseal(big, blen);
    assert_int_equal(kvedge_block_parse(big, blen, &info), KVEDGE_ECORRUPT);
    kvedge_le_put32(big + 24, over - 1); /* at the bound: the header passes, the body not */
    s_reseal(big, blen - 1);
    assert_int_equal(kvedge_block_parse(big, blen - 1, &info), KVEDGE_OK);
    assert_int_equal(kvedge_block_check(big, blen - 1, &info), KVEDGE_ECORRUPT);
    free(big);
    free(blk);
}

/* Builds a coded int4 block by hand whose K-codes record holds `stream` (n bytes) with
 * transform xf, the other sections as the encoder made them. */
static uint8_t *s_splice(const uint8_t *stream, uint32_t n, uint8_t xf, size_t *out_len)
{
    size_t len;
    kvedge_block_info_t info;
    uint8_t *blk = s_coded(KVEDGE_SCHEME_INT4, 32, &len, &info);
    /* Walk to the third record (K codes). */
    const uint8_t *b = info.body;
    size_t p = 0;
    for (int i = 0; i < 2; i++)
        p += KVEDGE_EC_RECORD_BYTES + kvedge_le_get32(b + p + 1);
    const size_t k_end = p + KVEDGE_EC_RECORD_BYTES + kvedge_le_get32(b + p + 1);
    const size_t body_len = p + KVEDGE_EC_RECORD_BYTES + n + (info.stored_len - k_end);
    uint8_t *out = calloc(1, KVEDGE_BLOCK_HEADER_BYTES + body_len + KVEDGE_BLOCK_CHECKSUM_BYTES);
    assert_non_null(out);
    memcpy(out, blk, KVEDGE_BLOCK_HEADER_BYTES);
    uint8_t *ob = out + KVEDGE_BLOCK_HEADER_BYTES;
    memcpy(ob, b, p);
    ob[p] = xf;
    kvedge_le_put32(ob + p + 1, n);
    memcpy(ob + p + KVEDGE_EC_RECORD_BYTES, stream, n);
    memcpy(ob + p + KVEDGE_EC_RECORD_BYTES + n, b + k_end, info.stored_len - k_end);
    kvedge_le_put32(out + 24, (uint32_t)body_len);
    *out_len = KVEDGE_BLOCK_HEADER_BYTES + body_len + KVEDGE_BLOCK_CHECKSUM_BYTES;
    s_reseal(out, *out_len);
    free(blk);
    return out;
}

/* The first (flags) byte of the stream htscodecs makes of src at order. */
static uint8_t s_first_byte(const uint8_t *src, uint32_t len, int order)
{
    unsigned n = 0;
    uint8_t *z = rans_compress_4x16((unsigned char *)src, len, &n, order);
    assert_non_null(z);
    uint8_t b = z[0];
    free(z);
    return b;
}

static int s_check_stream(const uint8_t *src, uint32_t len, int order, uint8_t xf)
{
    unsigned n = 0;
    uint8_t *z = rans_compress_4x16((unsigned char *)src, len, &n, order);
    assert_non_null(z);
    size_t blen;
    uint8_t *blk = s_splice(z, n, xf, &blen);
    kvedge_block_info_t info;
    int rc = kvedge_block_parse(blk, blen, &info);
    if (rc == KVEDGE_OK)
        rc = kvedge_block_check(blk, blen, &info);
    free(blk);
    free(z);
    return rc;
}

static void test_hostile_streams(void **state)
{
    (void)state;
    /* 64 tokens x 32 int4 codes: unpacked 2048 bytes, packed 1024. */
    uint8_t codes[4096];
    for (size_t i = 0; i < sizeof codes; i++)
        codes[i] = (uint8_t)(i * 7 % 16);
    /* The right length decodes. */
    assert_int_equal(s_check_stream(codes, 2048, 0, KVEDGE_EC_XF_UNPACK), KVEDGE_OK);
    assert_int_equal(s_check_stream(codes, 1024, 0, KVEDGE_EC_XF_NONE), KVEDGE_OK);
    /* A stream claiming more than the section, or less, is refused. */
    assert_int_equal(s_check_stream(codes, 4096, 0, KVEDGE_EC_XF_UNPACK), KVEDGE_ECORRUPT);
    assert_int_equal(s_check_stream(codes, 2047, 0, KVEDGE_EC_XF_UNPACK), KVEDGE_ECORRUPT);
    assert_int_equal(s_check_stream(codes, 2048, 1, KVEDGE_EC_XF_NONE), KVEDGE_ECORRUPT);
    assert_int_equal(s_check_stream(codes, 2048, RANS_ORDER_STRIPE | (4 << 8), KVEDGE_EC_XF_NONE),
                     KVEDGE_ECORRUPT);
    /* RLE and PACK layouts are refused whatever they hold (their side tables carry sizes the
     * library would allocate before checking), at the top and inside a stripe. Codes in long
     * runs, so the library keeps RLE. */
    uint8_t runs[2048];
    for (size_t i = 0; i < sizeof runs; i++)
        runs[i] = (uint8_t)(i / 64 % 16);
    assert_true(s_first_byte(runs, 2048, RANS_ORDER_RLE) & RANS_ORDER_RLE);
    assert_int_equal(s_check_stream(runs, 2048, 0, KVEDGE_EC_XF_UNPACK), KVEDGE_OK);
    assert_int_equal(s_check_stream(runs, 2048, RANS_ORDER_RLE, KVEDGE_EC_XF_UNPACK),
                     KVEDGE_ECORRUPT);
    assert_true(s_first_byte(runs, 2048, RANS_ORDER_PACK) & RANS_ORDER_PACK);
    assert_int_equal(s_check_stream(runs, 2048, RANS_ORDER_PACK, KVEDGE_EC_XF_UNPACK),
                     KVEDGE_ECORRUPT);
    assert_int_equal(s_check_stream(runs, 2048, RANS_ORDER_STRIPE | RANS_ORDER_RLE | (2 << 8),
                                    KVEDGE_EC_XF_UNPACK),
                     KVEDGE_ECORRUPT);
    /* What the encoder writes for params decodes: a stripe of two order-0 streams. */
    assert_int_equal(s_check_stream(codes, 2048, RANS_ORDER_STRIPE | (2 << 8), KVEDGE_EC_XF_UNPACK),
                     KVEDGE_OK);
    assert_int_equal(s_check_stream(codes, 2048, 1 | RANS_ORDER_X32, KVEDGE_EC_XF_UNPACK),
                     KVEDGE_OK);
    /* An unpacked int4 code over 15 is refused. */
    codes[100] = 0x10;
    assert_int_equal(s_check_stream(codes, 2048, 0, KVEDGE_EC_XF_UNPACK), KVEDGE_ECORRUPT);
    /* An unknown transform, or UNPACK on a params section, is refused. */
    assert_int_equal(s_check_stream(codes, 1024, 0, 2), KVEDGE_ECORRUPT);
    /* A record longer than the body, and garbage where a stream should be. */
    size_t len;
    kvedge_block_info_t info;
    uint8_t *blk = s_coded(KVEDGE_SCHEME_INT8, 32, &len, &info);
    uint8_t *body = blk + KVEDGE_BLOCK_HEADER_BYTES;
    const uint32_t first = kvedge_le_get32(body + 1);
    kvedge_le_put32(body + 1, info.stored_len);
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_check(blk, len, &info), KVEDGE_ECORRUPT);
    kvedge_le_put32(body + 1, first);
    body[0] = KVEDGE_EC_XF_UNPACK; /* params may not be transformed */
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_check(blk, len, &info), KVEDGE_ECORRUPT);
    body[0] = KVEDGE_EC_XF_NONE;
    memset(body + KVEDGE_EC_RECORD_BYTES, 0xFF, first);
    s_reseal(blk, len);
    assert_int_equal(kvedge_block_check(blk, len, &info), KVEDGE_ECORRUPT);
    free(blk);
}

/* Flipping any single byte of a coded body (checksum fixed up) gives OK or ECORRUPT, never a
 * crash or an out-of-bounds access (the ASan build checks the latter). */
static void test_every_byte_flipped(void **state)
{
    (void)state;
    for (int s = KVEDGE_SCHEME_INT8; s <= KVEDGE_SCHEME_INT4; s++) {
        size_t len;
        kvedge_block_info_t info;
        uint8_t *blk = s_coded((kvedge_scheme_t)s, 33, &len, &info);
        uint8_t *copy = malloc(len);
        assert_non_null(copy);
        for (size_t i = KVEDGE_BLOCK_HEADER_BYTES; i < len - KVEDGE_BLOCK_CHECKSUM_BYTES; i++) {
            memcpy(copy, blk, len);
            copy[i] ^= (uint8_t)(0x5A + i);
            s_reseal(copy, len);
            kvedge_block_info_t ci;
            int rc = kvedge_block_check(copy, len, &ci);
            assert_true(rc == KVEDGE_OK || rc == KVEDGE_ECORRUPT);
        }
        free(copy);
        free(blk);
    }
}

static void test_recode_errors(void **state)
{
    (void)state;
    uint8_t *out = (uint8_t *)1;
    size_t len = 0;
    assert_int_equal(kvedge_block_recode(NULL, true, false, &out, &len), KVEDGE_EINVAL);
    assert_null(out);
    size_t plen;
    uint8_t *plain = s_plain(KVEDGE_SCHEME_LOSSLESS, 4, 8, 0, false, &plen);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(plain, plen, &info), KVEDGE_OK);
    assert_int_equal(kvedge_block_recode(&info, true, false, &out, &len), KVEDGE_EINVAL);
    assert_null(out);
    free(plain);
    /* Recoding with lz4 keeps lz4 only when it pays, as a put does. */
    plain = s_plain(KVEDGE_SCHEME_INT8, 64, 32, 0, false, &plen);
    assert_int_equal(kvedge_block_parse(plain, plen, &info), KVEDGE_OK);
    assert_int_equal(kvedge_block_recode(&info, false, true, &out, &len), KVEDGE_OK);
    kvedge_block_info_t ri;
    assert_int_equal(kvedge_block_check(out, len, &ri), KVEDGE_OK);
    assert_false(ri.ec);
    assert_int_equal(ri.version, KVEDGE_BLOCK_VERSION);
    free(out);
    free(plain);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_layout),
        cmocka_unit_test(test_incompressible_body_stays_bounded),
        cmocka_unit_test(test_header_rules),
        cmocka_unit_test(test_hostile_streams),
        cmocka_unit_test(test_every_byte_flipped),
        cmocka_unit_test(test_recode_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
