/* Block codec: round trips over every dtype x scheme x mask x lz4, and rejection of damaged,
 * truncated, wrong-version and oversized blocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"
#include "tests/common/testutil.h"

/* Decodes a block to fp32 and returns the relative error of K (kept channels only) and V
 * against the fp32 view of the input; checks dropped channels decode to exactly zero. */
static void s_check_round_trip(kvedge_dtype_t dtype, kvedge_scheme_t scheme, uint32_t tokens,
                               uint16_t head_dim, uint16_t group, bool masked, bool lz4)
{
    const size_t n = (size_t)tokens * head_dim, es = kvedge_dtype_size(dtype);
    uint8_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8] = {0};
    float *kf = malloc(n * sizeof(float) * 4), *vf = kf + n, *kd = vf + n, *vd = kd + n;
    uint8_t *k = malloc(n * es), *v = malloc(n * es), *kout = malloc(n * es),
            *vout = malloc(n * es);
    assert_non_null(kf);
    assert_int_equal(kvedge_synth_head(7 + tokens, 0, tokens, head_dim, dtype, k, v), 0);
    kvedge_convert_to_f32(dtype, k, n, kf);
    kvedge_convert_to_f32(dtype, v, n, vf);
    if (masked)
        kvedge_synth_key_mask(kf, tokens, head_dim, head_dim > 1 ? head_dim / 2 : 1, mask);

    kvedge_block_spec_t spec = {dtype, scheme, tokens, head_dim, group, masked ? mask : NULL, lz4};
    size_t cap = kvedge_block_encoded_bound(&spec), len = 0;
    assert_true(cap > 0);
    uint8_t *blk = malloc(cap);
    assert_int_equal(kvedge_block_encode(&spec, k, v, blk, cap, &len), KVEDGE_OK);
    assert_true(len <= cap);

    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_OK);
    assert_int_equal(info.dtype, dtype);
    assert_int_equal(info.scheme, scheme);
    assert_int_equal(info.tokens, tokens);
    assert_int_equal(info.head_dim, head_dim);
    assert_int_equal(info.group_size, group);
    assert_int_equal(info.total_len, len);
    assert_int_equal(info.key_mask != NULL, masked);

    /* Same dtype out: lossless is bit-exact on every kept channel. */
    assert_int_equal(kvedge_block_decode(&info, dtype, kout, vout), KVEDGE_OK);
    for (uint32_t t = 0; t < tokens; t++)
        for (uint32_t c = 0; c < head_dim; c++) {
            size_t i = (size_t)t * head_dim + c;
            bool kept = !masked || ((mask[c >> 3] >> (c & 7)) & 1u);
            if (!kept) {
                static const uint8_t zero[4];
                assert_memory_equal(kout + i * es, zero, es);
            } else if (scheme == KVEDGE_SCHEME_LOSSLESS) {
                assert_memory_equal(kout + i * es, k + i * es, es);
            }
        }
    if (scheme == KVEDGE_SCHEME_LOSSLESS)
        assert_memory_equal(vout, v, n * es);

    /* fp32 out: bounded error for the quantized schemes. */
    assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, kd, vd), KVEDGE_OK);
    for (size_t i = 0; i < n; i++) {
        uint32_t c = (uint32_t)(i % head_dim);
        if (masked && !((mask[c >> 3] >> (c & 7)) & 1u))
            kf[i] = 0.0f; /* compare kept channels only */
        assert_false(isnan(kd[i]) || isnan(vd[i]));
    }
    double ek = kt_rel_err(kf, kd, n), ev = kt_rel_err(vf, vd, n);
    double bound = scheme == KVEDGE_SCHEME_LOSSLESS ? 0.0
                   : scheme == KVEDGE_SCHEME_INT8   ? 0.02
                                                    : 0.25;
    if (dtype != KVEDGE_DTYPE_FP32 && scheme == KVEDGE_SCHEME_LOSSLESS)
        bound = 0.0; /* half -> fp32 is exact */
    if (!(ek <= bound && ev <= bound))
        fail_msg("%s/%s T=%u D=%u G=%u mask=%d lz4=%d: rel err K %.4f V %.4f > %.4f",
                 kvedge_dtype_name(dtype), kvedge_scheme_name(scheme), tokens, head_dim, group,
                 masked, lz4, ek, ev, bound);
    free(kf);
    free(k);
    free(v);
    free(kout);
    free(vout);
    free(blk);
}

static void test_round_trip_all_combinations(void **state)
{
    (void)state;
    static const struct {
        uint32_t tokens;
        uint16_t head_dim;
    } shapes[] = {{1, 1}, {3, 7}, {37, 64}, {256, 128}, {100, 80}};
    for (int d = KVEDGE_DTYPE_FP16; d <= KVEDGE_DTYPE_FP32; d++)
        for (int s = KVEDGE_SCHEME_LOSSLESS; s <= KVEDGE_SCHEME_INT4; s++)
            for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
                for (int masked = 0; masked < 2; masked++)
                    for (int lz4 = 0; lz4 < 2; lz4++) {
                        uint16_t group = s == KVEDGE_SCHEME_LOSSLESS ? 0
                                         : s == KVEDGE_SCHEME_INT4   ? 32
                                                                     : 0;
                        s_check_round_trip((kvedge_dtype_t)d, (kvedge_scheme_t)s, shapes[sh].tokens,
                                           shapes[sh].head_dim, group, masked, lz4);
                    }
}

static void test_round_trip_group_sizes(void **state)
{
    (void)state;
    static const uint16_t groups[] = {0, 1, 7, 16, 32, 64, 300};
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        s_check_round_trip(KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT4, 77, 128, groups[g], true, true);
        s_check_round_trip(KVEDGE_DTYPE_BF16, KVEDGE_SCHEME_INT8, 77, 64, groups[g], false, false);
    }
}

static void test_lossless_cross_dtype(void **state)
{
    (void)state;
    /* fp16 stored, bf16 requested: every value equals the bf16 rounding of the fp16 value. */
    const uint32_t T = 9, D = 16;
    const size_t n = (size_t)T * D;
    uint16_t k[9 * 16], v[9 * 16], ko[9 * 16], vo[9 * 16];
    float kf[9 * 16], tmp[9 * 16];
    assert_int_equal(kvedge_synth_head(3, 0, T, D, KVEDGE_DTYPE_FP16, k, v), 0);
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, T, D, 0, NULL, false};
    size_t len;
    uint8_t *blk = malloc(kvedge_block_encoded_bound(&spec));
    assert_int_equal(kvedge_block_encode(&spec, k, v, blk, kvedge_block_encoded_bound(&spec), &len),
                     0);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(blk, len, &info), 0);
    assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_BF16, ko, vo), 0);
    kvedge_convert_to_f32(KVEDGE_DTYPE_FP16, k, n, kf);
    kvedge_convert_from_f32(KVEDGE_DTYPE_BF16, kf, n, (uint16_t *)tmp);
    assert_memory_equal(ko, tmp, n * 2);
    free(blk);
}

static void test_lz4_only_when_it_pays(void **state)
{
    (void)state;
    const uint32_t T = 64, D = 64;
    uint16_t *zeros = calloc((size_t)T * D, 2);
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, T, D, 0, NULL, true};
    size_t cap = kvedge_block_encoded_bound(&spec), len;
    uint8_t *blk = malloc(cap);
    assert_int_equal(kvedge_block_encode(&spec, zeros, zeros, blk, cap, &len), 0);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(blk, len, &info), 0);
    assert_true(info.lz4);
    assert_true(len < cap / 4);
    uint16_t *ko = malloc((size_t)T * D * 2), *vo = malloc((size_t)T * D * 2);
    assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_FP16, ko, vo), 0);
    assert_memory_equal(ko, zeros, (size_t)T * D * 2);

    /* Gaussian fp32 mantissas do not compress: the body is stored as is. */
    spec.dtype = KVEDGE_DTYPE_FP32;
    free(blk);
    blk = kt_encode(&spec, 11, &len);
    assert_non_null(blk);
    assert_int_equal(kvedge_block_parse(blk, len, &info), 0);
    assert_false(info.lz4);
    assert_int_equal(len, kvedge_block_encoded_bound(&spec));
    free(blk);
    free(zeros);
    free(ko);
    free(vo);
}

static void test_constant_data_is_exact(void **state)
{
    (void)state;
    const uint32_t T = 40, D = 32;
    float k[40 * 32], v[40 * 32], ko[40 * 32], vo[40 * 32];
    for (size_t i = 0; i < (size_t)T * D; i++) {
        k[i] = 1.5f;
        v[i] = -0.25f;
    }
    for (int s = KVEDGE_SCHEME_INT8; s <= KVEDGE_SCHEME_INT4; s++) {
        kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP32, (kvedge_scheme_t)s, T, D, 8, NULL, false};
        uint8_t blk[16384];
        size_t len;
        kvedge_block_info_t info;
        assert_int_equal(kvedge_block_encode(&spec, k, v, blk, sizeof blk, &len), 0);
        assert_int_equal(kvedge_block_parse(blk, len, &info), 0);
        assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, ko, vo), 0);
        assert_memory_equal(ko, k, sizeof k);
        assert_memory_equal(vo, v, sizeof v);
    }
}

static void test_every_corrupted_byte_is_rejected(void **state)
{
    (void)state;
    for (int s = KVEDGE_SCHEME_LOSSLESS; s <= KVEDGE_SCHEME_INT4; s++) {
        uint8_t mask[8] = {0xF0, 0x0F, 0xFF, 0x01, 0x80, 0, 0xAA, 0x55};
        kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16,
                                    (kvedge_scheme_t)s,
                                    19,
                                    64,
                                    s == KVEDGE_SCHEME_INT4 ? 8 : 0,
                                    mask,
                                    s == 0};
        size_t len;
        uint8_t *blk = kt_encode(&spec, 5, &len);
        assert_non_null(blk);
        kvedge_block_info_t info;
        assert_int_equal(kvedge_block_parse(blk, len, &info), 0);
        for (size_t off = 0; off < len; off++) {
            for (int bit = 0; bit < 8; bit += 7) {
                blk[off] ^= (uint8_t)(1u << bit);
                int rc = kvedge_block_parse(blk, len, &info);
                if (rc == KVEDGE_OK)
                    fail_msg("scheme %d: flipping bit %d of byte %zu went unnoticed", s, bit, off);
                blk[off] ^= (uint8_t)(1u << bit);
            }
        }
        /* Every truncation is rejected, and so is a trailing byte. */
        for (size_t cut = 0; cut < len; cut++)
            assert_int_not_equal(kvedge_block_parse(blk, cut, &info), KVEDGE_OK);
        uint8_t *longer = malloc(len + 1);
        memcpy(longer, blk, len);
        longer[len] = 0;
        assert_int_equal(kvedge_block_parse(longer, len + 1, &info), KVEDGE_ECORRUPT);
        assert_int_equal(kvedge_block_parse(blk, 7, &info), KVEDGE_ETRUNCATED);
        free(longer);
        free(blk);
    }
}

static void test_wrong_version_and_magic(void **state)
{
    (void)state;
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_BF16, KVEDGE_SCHEME_INT8, 8, 16, 0, NULL, false};
    size_t len;
    uint8_t *blk = kt_encode(&spec, 1, &len);
    kvedge_block_info_t info;
    blk[4] = KVEDGE_BLOCK_VERSION_EC + 1;
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_EVERSION);
    /* Version 2 is the entropy-coded body only: a plain body under it is not a block. */
    blk[4] = KVEDGE_BLOCK_VERSION_EC;
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_ECORRUPT);
    blk[4] = 0;
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_EVERSION);
    blk[4] = KVEDGE_BLOCK_VERSION;
    blk[0] = 'X';
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_ECORRUPT);
    free(blk);
}

static void test_oversized_is_refused_unread(void **state)
{
    (void)state;
    /* A buffer claimed larger than any block may be: refused from the header alone. The
     * mapping is never touched past the first page, so it costs no memory. */
    size_t huge = (size_t)KVEDGE_BLOCK_MAX_BYTES + (64u << 20);
    uint8_t *m = mmap(NULL, huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    memcpy(m, "KVEB", 4);
    m[4] = KVEDGE_BLOCK_VERSION;
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(m, huge, &info), KVEDGE_ETOOBIG);
    munmap(m, huge);

    /* A header claiming more tokens than the limit. */
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, 4, 8, 0, NULL, false};
    size_t len;
    uint8_t *blk = kt_encode(&spec, 2, &len);
    uint32_t big = KVEDGE_BLOCK_MAX_TOKENS + 1;
    memcpy(blk + 8, &big, 4);
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_ETOOBIG);
    free(blk);
}

static void test_bad_specs(void **state)
{
    (void)state;
    float k[64] = {0}, v[64] = {0};
    uint8_t out[4096];
    size_t len;
    kvedge_block_spec_t ok = {KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_INT4, 8, 8, 32, NULL, false};
    kvedge_block_spec_t s = ok;
    assert_int_equal(kvedge_block_encode(&s, k, v, out, sizeof out, &len), KVEDGE_OK);
    s.tokens = 0;
    assert_int_equal(kvedge_block_encode(&s, k, v, out, sizeof out, &len), KVEDGE_EINVAL);
    s = ok;
    s.head_dim = KVEDGE_BLOCK_MAX_HEAD_DIM + 1;
    assert_int_equal(kvedge_block_spec_check(&s), KVEDGE_ETOOBIG);
    s = ok;
    s.tokens = KVEDGE_BLOCK_MAX_TOKENS + 1;
    assert_int_equal(kvedge_block_spec_check(&s), KVEDGE_ETOOBIG);
    s = ok;
    s.scheme = KVEDGE_SCHEME_LOSSLESS; /* lossless takes no group size */
    assert_int_equal(kvedge_block_spec_check(&s), KVEDGE_EINVAL);
    s = ok;
    s.dtype = (kvedge_dtype_t)9;
    assert_int_equal(kvedge_block_spec_check(&s), KVEDGE_EINVAL);
    s = ok;
    uint8_t empty_mask[1] = {0}, tail_mask[1] = {0xFF};
    s.key_mask = empty_mask;
    assert_int_equal(kvedge_block_spec_check(&s), KVEDGE_EINVAL);
    s.head_dim = 7;
    s.key_mask = tail_mask; /* bit 7 set with head_dim 7 */
    assert_int_equal(kvedge_block_spec_check(&s), KVEDGE_EINVAL);
    s = ok;
    assert_int_equal(kvedge_block_encode(&s, k, v, out, 10, &len), KVEDGE_ENOSPACE);
    /* Non-finite input cannot be quantized. */
    k[5] = NAN;
    assert_int_equal(kvedge_block_encode(&s, k, v, out, sizeof out, &len), KVEDGE_EINVAL);
    k[5] = INFINITY;
    assert_int_equal(kvedge_block_encode(&s, k, v, out, sizeof out, &len), KVEDGE_EINVAL);
    k[5] = 0;
    v[3] = 1e30f; /* range beyond fp16 params */
    assert_int_equal(kvedge_block_encode(&s, k, v, out, sizeof out, &len), KVEDGE_EINVAL);
    /* ...while lossless keeps whatever it is given, bit for bit. */
    s.scheme = KVEDGE_SCHEME_LOSSLESS;
    s.group_size = 0;
    v[4] = NAN;
    assert_int_equal(kvedge_block_encode(&s, k, v, out, sizeof out, &len), KVEDGE_OK);
    assert_int_equal(kvedge_block_parse(NULL, 0, NULL), KVEDGE_EINVAL);
}

static void test_sections_and_names(void **state)
{
    (void)state;
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT4, 70, 128, 32, NULL, false};
    size_t len;
    uint8_t *blk = kt_encode(&spec, 3, &len);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_parse(blk, len, &info), 0);
    const uint8_t *raw;
    assert_int_equal(kvedge_block_body(&info, NULL, 0, &raw), 0);
    kvedge_block_sections_t sec;
    kvedge_block_sections(&info, raw, &sec);
    assert_int_equal(sec.k_groups, 3); /* ceil(70 / 32) */
    assert_int_equal(sec.v_groups, 4); /* 128 / 32 */
    assert_ptr_equal(sec.k_params, raw);
    assert_ptr_equal((const uint8_t *)sec.v_params, raw + 3 * 128 * 4);
    assert_ptr_equal(sec.k_codes, raw + 3 * 128 * 4 + 70 * 4 * 4);
    assert_ptr_equal(sec.v_codes, sec.k_codes + 70 * 64);
    assert_int_equal(sec.v_codes + 70 * 64 - raw, info.raw_len);
    free(blk);

    kvedge_dtype_t d;
    kvedge_scheme_t s;
    assert_int_equal(kvedge_dtype_parse("bf16", &d), 0);
    assert_int_equal(d, KVEDGE_DTYPE_BF16);
    assert_int_equal(kvedge_dtype_parse("fp8", &d), KVEDGE_EINVAL);
    assert_int_equal(kvedge_scheme_parse("int4", &s), 0);
    assert_int_equal(s, KVEDGE_SCHEME_INT4);
    assert_int_equal(kvedge_scheme_parse(NULL, &s), KVEDGE_EINVAL);
    assert_string_equal(kvedge_strerror(KVEDGE_ECORRUPT),
                        "data is corrupt (checksum or structure check failed)");
    assert_string_equal(kvedge_errname(KVEDGE_EVERSION), "KVEDGE_EVERSION");
    assert_string_equal(kvedge_strerror(12345), "unknown error (not a kvedge error code)");
    assert_string_equal(kvedge_errname(12345), "KVEDGE_EUNKNOWN");
    /* Codes sit in their own range, never on a -errno value (Linux's stay below 4096). */
    assert_int_equal(KVEDGE_EINVAL, -30701);
    assert_int_equal(KVEDGE_ENOBASIS, KVEDGE_ERR_BASE - (KVEDGE_ERR_COUNT - 1));
    assert_string_equal(kvedge_strerror(-22), "unknown error (not a kvedge error code)");
    /* One meaning per code: the three kinds of "busy" are three codes. */
    assert_string_equal(kvedge_errname(KVEDGE_ELOCKED), "KVEDGE_ELOCKED");
    assert_string_equal(kvedge_errname(KVEDGE_EBACKLOG), "KVEDGE_EBACKLOG");
    assert_string_not_equal(kvedge_strerror(KVEDGE_EBUSY), kvedge_strerror(KVEDGE_ELOCKED));
    assert_string_not_equal(kvedge_strerror(KVEDGE_EBUSY), kvedge_strerror(KVEDGE_EBACKLOG));
    for (int n = 1; n < KVEDGE_ERR_COUNT; n++) {
        int code = KVEDGE_ERR_BASE - n;
        assert_true(code < -4095);
        assert_string_not_equal(kvedge_strerror(code), "unknown error (not a kvedge error code)");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_all_combinations),
        cmocka_unit_test(test_round_trip_group_sizes),
        cmocka_unit_test(test_lossless_cross_dtype),
        cmocka_unit_test(test_lz4_only_when_it_pays),
        cmocka_unit_test(test_constant_data_is_exact),
        cmocka_unit_test(test_every_corrupted_byte_is_rejected),
        cmocka_unit_test(test_wrong_version_and_magic),
        cmocka_unit_test(test_oversized_is_refused_unread),
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_sections_and_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
