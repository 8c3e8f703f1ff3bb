/* Block codec: round trips over every dtype x scheme x mask x lz4, and rejection of damaged,
 * truncated, wrong-version and oversized blocks; tc blocks (version 3) against registered
 * coding bases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <xxhash.h>

#include "access/codec/basis.h"
#include "access/codec/block.h"
#include "access/codec/byteorder.h"
#include "access/codec/error.h"
#include "access/codec/half.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"
#include "tests/common/basis_fixture.h"
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
    blk[4] = KVEDGE_BLOCK_VERSION_TC + 1;
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_EVERSION);
    /* Version 3 is the tc scheme only. */
    blk[4] = KVEDGE_BLOCK_VERSION_TC;
    assert_int_equal(kvedge_block_parse(blk, len, &info), KVEDGE_ECORRUPT);
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

/* tc blocks (version 3). The basis registry is process-wide: test_tc_without_basis runs before
 * test_tc_round_trip registers the bases these tests use. */
#define S_TC_STEP 0.0625f

/* A basis of model `model` (2 layers, 3 heads, D head_dim), parsed, not registered. */
static kvedge_basis_t *s_tc_basis(const char *model, uint16_t head_dim, uint32_t seed)
{
    uint8_t *file = NULL;
    size_t len = 0;
    assert_int_equal(kt_basis_file(model, 2, 3, head_dim, S_TC_STEP, seed, &file, &len), 0);
    kvedge_basis_t *b = NULL;
    assert_int_equal(kvedge_basis_parse(file, len, &b, NULL, 0), KVEDGE_OK);
    free(file);
    return b;
}

/* A tc block of a synthetic head (dtype, tokens, the basis's D) at (layer, head); *k and *v
 * (may be NULL) get the fp32 view of its input, which the caller frees (*v inside *k). */
static uint8_t *s_tc_block(const kvedge_basis_t *b, kvedge_dtype_t dtype, uint32_t tokens,
                           uint32_t layer, uint32_t head, size_t *len, float **kf, float **vf)
{
    const uint16_t D = (uint16_t)kvedge_basis_head_dim(b);
    const size_t n = (size_t)tokens * D, es = kvedge_dtype_size(dtype);
    uint8_t *k = malloc(n * es), *v = malloc(n * es), *blk = NULL;
    assert_true(k && v);
    assert_int_equal(kvedge_synth_head(91 + tokens, layer, tokens, D, dtype, k, v), 0);
    assert_int_equal(kvedge_block_encode_tc(b, layer, head, dtype, tokens, D, k, v, &blk, len),
                     KVEDGE_OK);
    if (kf) {
        *kf = malloc(2 * n * sizeof(float));
        assert_non_null(*kf);
        *vf = *kf + n;
        kvedge_convert_to_f32(dtype, k, n, *kf);
        kvedge_convert_to_f32(dtype, v, n, *vf);
    }
    free(v);
    free(k);
    return blk;
}

/* Recomputes the checksum of a block after a test edited it. */
static void s_reseal(uint8_t *blk, size_t len)
{
    const size_t covered = len - KVEDGE_BLOCK_CHECKSUM_BYTES;
    const uint64_t sum = XXH3_64bits(blk, covered);
    for (int i = 0; i < 8; i++)
        blk[covered + i] = (uint8_t)(sum >> (8 * i));
}

static void test_tc_without_basis(void **state)
{
    (void)state;
    kvedge_basis_t *b = s_tc_basis("blk-tc-unloaded", 8, 1);
    size_t len;
    uint8_t *blk = s_tc_block(b, KVEDGE_DTYPE_FP16, 12, 1, 2, &len, NULL, NULL);
    kvedge_block_info_t info;
    /* Structure checks need no basis. */
    assert_int_equal(kvedge_block_check(blk, len, &info), KVEDGE_OK);
    assert_int_equal(info.version, KVEDGE_BLOCK_VERSION_TC);
    assert_int_equal(info.scheme, KVEDGE_SCHEME_TC);
    uint64_t id = 0;
    uint16_t layer = 0, head = 0;
    assert_int_equal(kvedge_block_tc_where(&info, &id, &layer, &head), KVEDGE_OK);
    assert_int_equal(id, kvedge_basis_id(b));
    assert_int_equal(layer, 1);
    assert_int_equal(head, 2);
    assert_null(kvedge_basis_find(id));
    uint16_t out[2 * 12 * 8];
    assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_FP16, out, out + 12 * 8),
                     KVEDGE_ENOBASIS);
    free(blk);
    kvedge_basis_free(&b);
}

static void test_tc_round_trip(void **state)
{
    (void)state;
    const uint16_t dims[] = {16, 5, 128};
    const char *models[] = {"blk-tc-16", "blk-tc-5", "blk-tc-128"};
    const kvedge_dtype_t dtypes[] = {KVEDGE_DTYPE_FP16, KVEDGE_DTYPE_BF16, KVEDGE_DTYPE_FP32};
    const uint32_t tokens[] = {1, 17, 256};
    for (size_t m = 0; m < 3; m++) {
        kvedge_basis_t *b = s_tc_basis(models[m], dims[m], (uint32_t)m + 7);
        assert_int_equal(kvedge_basis_register(&b), KVEDGE_OK);
        const kvedge_basis_t *reg = kvedge_basis_find_model(models[m]);
        for (size_t d = 0; d < 3; d++)
            for (size_t t = 0; t < 3; t++) {
                size_t len;
                float *kf, *vf;
                uint8_t *blk = s_tc_block(reg, dtypes[d], tokens[t], 1, 2, &len, &kf, &vf);
                kvedge_block_info_t info;
                assert_int_equal(kvedge_block_check(blk, len, &info), KVEDGE_OK);
                assert_int_equal(info.dtype, dtypes[d]);
                assert_int_equal(info.tokens, tokens[t]);
                assert_int_equal(info.head_dim, dims[m]);
                assert_int_equal(info.key_channels, dims[m]);
                assert_int_equal(info.group_size, 0);
                assert_false(info.lz4 || info.ec);
                assert_null(info.key_mask);
                assert_int_equal(info.raw_len, info.stored_len);
                assert_int_equal(info.total_len, len);
                const size_t n = (size_t)tokens[t] * dims[m];
                float *k = malloc(2 * n * sizeof(float)), *v = k + n;
                assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, k, v), KVEDGE_OK);
                for (size_t i = 0; i < n; i++) {
                    /* A signed permutation is exact: step/2 and fp32 rounding. */
                    const float tk = S_TC_STEP / 2 + 1e-6f * fabsf(kf[i]) + 1e-7f,
                                tv = S_TC_STEP / 2 + 1e-6f * fabsf(vf[i]) + 1e-7f;
                    if (!(fabsf(k[i] - kf[i]) <= tk) || !(fabsf(v[i] - vf[i]) <= tv))
                        fail_msg("D %u %s T %u value %zu: K %g vs %g, V %g vs %g", dims[m],
                                 kvedge_dtype_name(dtypes[d]), tokens[t], i, (double)k[i],
                                 (double)kf[i], (double)v[i], (double)vf[i]);
                }
                /* Any out dtype: the fp32 values converted. */
                uint16_t *h = malloc(2 * n * sizeof *h);
                assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_BF16, h, h + n),
                                 KVEDGE_OK);
                for (size_t i = 0; i < n; i++)
                    assert_int_equal(h[i], kvedge_f32_to_bf16(k[i]));
                free(h);
                free(k);
                free(kf);
                free(blk);
            }
    }
}

/* The body as stored: the prefix, two sections; names; what spec-based calls say of tc. */
static void test_tc_body_and_names(void **state)
{
    (void)state;
    const kvedge_basis_t *b = kvedge_basis_find_model("blk-tc-16");
    assert_non_null(b);
    size_t len;
    uint8_t *blk = s_tc_block(b, KVEDGE_DTYPE_FP16, 40, 0, 1, &len, NULL, NULL);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_check(blk, len, &info), KVEDGE_OK);
    const uint8_t *raw = NULL;
    assert_int_equal(kvedge_block_body(&info, NULL, 0, &raw), KVEDGE_OK);
    assert_ptr_equal(raw, info.body);
    kvedge_block_section_coding_t c[4];
    size_t n = 0;
    assert_int_equal(kvedge_block_coding(&info, c, &n), KVEDGE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(c[0].stored, kvedge_le_get32(info.body + 12));
    assert_int_equal(KVEDGE_BLOCK_TC_PREFIX_BYTES + c[0].stored + c[1].stored, info.stored_len);
    assert_int_equal(c[0].raw, c[0].stored);
    assert_int_equal(c[1].transform, 0);
    kvedge_block_sections_t sec;
    kvedge_block_sections(&info, raw, &sec);
    assert_null(sec.k_codes);
    assert_null(sec.v_codes);
    /* A tc block is no quantized block to recode, nor a spec to encode. */
    uint8_t *re = (uint8_t *)1;
    size_t relen;
    assert_int_equal(kvedge_block_recode(&info, true, false, &re, &relen), KVEDGE_EINVAL);
    assert_null(re);
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_TC, 4, 16, 0, NULL, false};
    assert_int_equal(kvedge_block_spec_check(&spec), KVEDGE_EINVAL);
    assert_int_equal(kvedge_block_encoded_bound(&spec), 0);
    assert_string_equal(kvedge_scheme_name(KVEDGE_SCHEME_TC), "tc");
    kvedge_scheme_t s;
    assert_int_equal(kvedge_scheme_parse("tc", &s), KVEDGE_OK);
    assert_int_equal(s, KVEDGE_SCHEME_TC);
    /* tc_where of another block. */
    kvedge_block_spec_t i8 = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, 4, 16, 0, NULL, false};
    size_t i8len;
    uint8_t *i8blk = kt_encode(&i8, 3, &i8len);
    kvedge_block_info_t i8info;
    assert_int_equal(kvedge_block_parse(i8blk, i8len, &i8info), KVEDGE_OK);
    assert_int_equal(kvedge_block_tc_where(&i8info, NULL, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_block_tc_where(NULL, NULL, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_block_tc_where(&info, NULL, NULL, NULL), KVEDGE_OK);
    free(i8blk);
    free(blk);
}

/* Encoder refusals: the basis's shape, NULLs, non-finite values. */
static void test_tc_encode_errors(void **state)
{
    (void)state;
    const kvedge_basis_t *b = kvedge_basis_find_model("blk-tc-16");
    float k[4 * 16] = {0}, v[4 * 16] = {0};
    uint8_t *out = (uint8_t *)1;
    size_t len;
    const kvedge_dtype_t f = KVEDGE_DTYPE_FP32;
    assert_int_equal(kvedge_block_encode_tc(b, 0, 0, f, 4, 8, k, v, &out, &len), KVEDGE_ESHAPE);
    assert_null(out);
    assert_int_equal(kvedge_block_encode_tc(b, 2, 0, f, 4, 16, k, v, &out, &len), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_block_encode_tc(b, 0, 3, f, 4, 16, k, v, &out, &len), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_block_encode_tc(NULL, 0, 0, f, 4, 16, k, v, &out, &len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_block_encode_tc(b, 0, 0, f, 0, 16, k, v, &out, &len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_block_encode_tc(b, 0, 0, (kvedge_dtype_t)9, 4, 16, k, v, &out, &len),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_block_encode_tc(b, 0, 0, f, 4, 16, NULL, v, &out, &len), KVEDGE_EINVAL);
    assert_int_equal(
        kvedge_block_encode_tc(b, 0, 0, f, KVEDGE_BLOCK_MAX_TOKENS + 1, 16, k, v, &out, &len),
        KVEDGE_ETOOBIG);
    v[5] = NAN;
    assert_int_equal(kvedge_block_encode_tc(b, 0, 0, f, 4, 16, k, v, &out, &len), KVEDGE_EINVAL);
    assert_null(out);
    /* All zeros: rank 0 sections, still a block. */
    v[5] = 0;
    assert_int_equal(kvedge_block_encode_tc(b, 0, 0, f, 4, 16, k, v, &out, &len), KVEDGE_OK);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_check(out, len, &info), KVEDGE_OK);
    float kd[4 * 16], vd[4 * 16];
    assert_int_equal(kvedge_block_decode(&info, f, kd, vd), KVEDGE_OK);
    for (int i = 0; i < 4 * 16; i++)
        assert_true(kd[i] == 0.0f && vd[i] == 0.0f);
    free(out);
}

/* Every truncation and every flipped byte refused; damage behind a valid checksum refused by
 * the structural walk of kvedge_block_check; the header rules of version 3. */
static void test_tc_damage(void **state)
{
    (void)state;
    const kvedge_basis_t *b = kvedge_basis_find_model("blk-tc-16");
    size_t len;
    uint8_t *blk = s_tc_block(b, KVEDGE_DTYPE_FP16, 33, 1, 1, &len, NULL, NULL);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_check(blk, len, &info), KVEDGE_OK);
    for (size_t cut = 0; cut < len; cut++)
        assert_int_not_equal(kvedge_block_check(blk, cut, &info), KVEDGE_OK);
    for (size_t off = 0; off < len; off++) {
        blk[off] ^= 0x21;
        if (kvedge_block_check(blk, len, &info) == KVEDGE_OK)
            fail_msg("flipping byte %zu of a tc block went unnoticed", off);
        blk[off] ^= 0x21;
    }
    uint8_t *t = malloc(len);
    const size_t body = KVEDGE_BLOCK_HEADER_BYTES, sec = body + KVEDGE_BLOCK_TC_PREFIX_BYTES;
    const uint32_t nk = kvedge_le_get32(blk + body + 12);
    const uint32_t stored = (uint32_t)(len - body - KVEDGE_BLOCK_CHECKSUM_BYTES);
    /* Header and prefix rules: parse refuses. */
    struct {
        size_t off;
        int bytes;
        uint32_t value;
        int rc;
    } hdr[] = {
        {4, 1, 4, KVEDGE_EVERSION},                          /* an unknown version */
        {4, 1, KVEDGE_BLOCK_VERSION, KVEDGE_ECORRUPT},       /* tc under version 1 */
        {4, 1, KVEDGE_BLOCK_VERSION_EC, KVEDGE_ECORRUPT},    /* or 2 */
        {6, 1, KVEDGE_SCHEME_INT8, KVEDGE_ECORRUPT},         /* version 3 of int8 */
        {6, 1, 4, KVEDGE_ECORRUPT},                          /* an unknown scheme */
        {5, 1, 0, KVEDGE_ECORRUPT},                          /* dtype */
        {7, 1, KVEDGE_BLOCK_FLAG_LZ4, KVEDGE_ECORRUPT},      /* no flag */
        {7, 1, KVEDGE_BLOCK_FLAG_EC, KVEDGE_ECORRUPT},       /* no flag */
        {14, 2, 8, KVEDGE_ECORRUPT},                         /* key_channels != D */
        {16, 2, 32, KVEDGE_ECORRUPT},                        /* group */
        {20, 4, stored + 1, KVEDGE_ECORRUPT},                /* raw_len != stored_len */
        {8, 4, 0, KVEDGE_ECORRUPT},                          /* no tokens */
        {8, 4, KVEDGE_BLOCK_MAX_TOKENS + 1, KVEDGE_ETOOBIG}, /* too many */
        {12, 2, 0, KVEDGE_ECORRUPT},                         /* D 0 */
        {body + 12, 4, 0, KVEDGE_ECORRUPT},                  /* n_k 0 */
        {body + 12, 4, stored - 16, KVEDGE_ECORRUPT},        /* no V */
        {body + 12, 4, 0xFFFFFFF0u, KVEDGE_ECORRUPT},        /* past the end */
    };
    for (size_t i = 0; i < sizeof hdr / sizeof hdr[0]; i++) {
        memcpy(t, blk, len);
        if (hdr[i].bytes == 1)
            t[hdr[i].off] = (uint8_t)hdr[i].value;
        else if (hdr[i].bytes == 2)
            kvedge_le_put16(t + hdr[i].off, (uint16_t)hdr[i].value);
        else
            kvedge_le_put32(t + hdr[i].off, hdr[i].value);
        s_reseal(t, len);
        const int rc = kvedge_block_parse(t, len, &info);
        if (rc != hdr[i].rc)
            fail_msg("edit %zu (offset %zu = %u): %s, expected %s", i, hdr[i].off, hdr[i].value,
                     kvedge_errname(rc), kvedge_errname(hdr[i].rc));
    }
    /* Section damage behind a valid checksum: parse passes, check refuses. */
    struct {
        size_t off;
        int bytes;
        uint32_t value;
    } walk[] = {
        {body + 12, 4, nk - 1},                           /* K ends early, V starts inside it */
        {body + 12, 4, nk + 1},                           /* K runs into V */
        {sec, 1, 3},                                      /* unknown layout */
        {sec + 1, 2, 17},                                 /* R > D */
        {sec + 3, 2, 0},                                  /* step 0 */
        {sec + 3, 2, 0x7C00},                             /* step inf */
        {sec + 5, 2, 0x7E00},                             /* a NaN mean */
        {sec + 5 + 32, 4, 0},                             /* a stream of length 0 */
        {sec + 5 + 32, 4, 0x7FFFFFFF},                    /* a stream past the end */
        {sec + nk + 1, 2, 0xFFFF},                        /* V: R > D */
        {sec + nk - 4, 4, 1000},                          /* K's escape count */
        {len - KVEDGE_BLOCK_CHECKSUM_BYTES - 4, 4, 1000}, /* V's escape count */
    };
    for (size_t i = 0; i < sizeof walk / sizeof walk[0]; i++) {
        memcpy(t, blk, len);
        if (walk[i].bytes == 1)
            t[walk[i].off] = (uint8_t)walk[i].value;
        else if (walk[i].bytes == 2)
            kvedge_le_put16(t + walk[i].off, (uint16_t)walk[i].value);
        else
            kvedge_le_put32(t + walk[i].off, walk[i].value);
        s_reseal(t, len);
        assert_int_equal(kvedge_block_parse(t, len, &info), KVEDGE_OK);
        const int rc = kvedge_block_check(t, len, &info);
        if (rc != KVEDGE_ECORRUPT)
            fail_msg("section edit %zu (offset %zu): %s, expected KVEDGE_ECORRUPT", i, walk[i].off,
                     kvedge_errname(rc));
    }
    /* A basis id never registered: ENOBASIS; a layer or head outside the basis, or a basis of
     * another head_dim: ESHAPE. */
    float k[33 * 16], v[33 * 16];
    struct {
        size_t off;
        int bytes;
        uint64_t value;
        int rc;
    } where[] = {
        {body, 8, kvedge_basis_id(b) ^ 1, KVEDGE_ENOBASIS},
        {body + 8, 2, 2, KVEDGE_ESHAPE},
        {body + 10, 2, 3, KVEDGE_ESHAPE},
        {body, 8, kvedge_basis_id(kvedge_basis_find_model("blk-tc-5")), KVEDGE_ESHAPE},
    };
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        memcpy(t, blk, len);
        if (where[i].bytes == 8)
            kvedge_le_put64(t + where[i].off, where[i].value);
        else
            kvedge_le_put16(t + where[i].off, (uint16_t)where[i].value);
        s_reseal(t, len);
        assert_int_equal(kvedge_block_check(t, len, &info), KVEDGE_OK);
        assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, k, v), where[i].rc);
    }
    free(t);
    free(blk);
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
        /* In this order: the first decodes before any basis is registered. */
        cmocka_unit_test(test_tc_without_basis),
        cmocka_unit_test(test_tc_round_trip),
        cmocka_unit_test(test_tc_body_and_names),
        cmocka_unit_test(test_tc_encode_errors),
        cmocka_unit_test(test_tc_damage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
