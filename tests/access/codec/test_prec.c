/* Precision ladder: rung names and accept lists, the rung of a block, derivability, and
 * transcoding, which must give the very bytes a direct put at the coarser rung gives. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/block.h"
#include "access/codec/error.h"
#include "access/codec/prec.h"
#include "access/codec/quant.h"
#include "access/codec/synth.h"
#include "tests/common/basis_fixture.h"

#define S_SEED 4242

/* Every valid rung of the ladder, finest base first (tc, which needs a basis, apart). */
static size_t s_all(kvedge_prec_t *out)
{
    size_t n = 0;
    for (unsigned b = KVEDGE_PREC_LOSSLESS; b <= KVEDGE_PREC_INT4_G128; b++)
        for (unsigned t = 0; t <= KVEDGE_PREC_THINK_MAX; t++)
            out[n++] = KVEDGE_PREC_MAKE(b, t);
    return n;
}

/* One synthetic head in dtype, and its fp32 view. Caller frees all three. */
typedef struct {
    kvedge_dtype_t dtype;
    uint32_t tokens, head_dim;
    uint8_t *k, *v;
    float *kf, *vf;
} s_head_t;

static void s_head(s_head_t *h, kvedge_dtype_t dtype, uint32_t tokens, uint32_t head_dim,
                   uint64_t seed)
{
    const size_t n = (size_t)tokens * head_dim, es = kvedge_dtype_size(dtype);
    h->dtype = dtype;
    h->tokens = tokens;
    h->head_dim = head_dim;
    h->k = malloc(n * es);
    h->v = malloc(n * es);
    h->kf = malloc(n * sizeof(float));
    h->vf = malloc(n * sizeof(float));
    assert_true(h->k && h->v && h->kf && h->vf);
    assert_int_equal(kvedge_synth_head(seed, 0, tokens, head_dim, dtype, h->k, h->v), KVEDGE_OK);
    kvedge_convert_to_f32(dtype, h->k, n, h->kf);
    kvedge_convert_to_f32(dtype, h->v, n, h->vf);
}

static void s_head_free(s_head_t *h)
{
    free(h->k);
    free(h->v);
    free(h->kf);
    free(h->vf);
}

/* Encodes the head with an explicit spec; returns the malloc'd block. */
static uint8_t *s_encode(const s_head_t *h, kvedge_scheme_t scheme, uint16_t group,
                         const uint8_t *mask, bool lz4, size_t *len)
{
    kvedge_block_spec_t spec = {h->dtype, scheme, h->tokens, (uint16_t)h->head_dim,
                                group,    mask,   lz4};
    size_t cap = kvedge_block_encoded_bound(&spec);
    assert_true(cap > 0);
    uint8_t *blk = malloc(cap);
    assert_non_null(blk);
    assert_int_equal(kvedge_block_encode(&spec, h->k, h->v, blk, cap, len), KVEDGE_OK);
    return blk;
}

/* A put of the head straight at rung p, the mask chosen as the prefill chooses it. */
static uint8_t *s_direct(const s_head_t *h, kvedge_prec_t p, bool lz4, size_t *len)
{
    uint8_t mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8];
    uint32_t keep = kvedge_prec_keep_channels(p, h->head_dim);
    bool masked = keep < h->head_dim;
    if (masked)
        assert_int_equal(kvedge_synth_key_mask(h->kf, h->tokens, h->head_dim, keep, mask), 0);
    return s_encode(h, kvedge_prec_scheme(p), kvedge_prec_group(p), masked ? mask : NULL, lz4, len);
}

static void s_parse(const uint8_t *blk, size_t len, kvedge_block_info_t *info)
{
    assert_int_equal(kvedge_block_check(blk, len, info), KVEDGE_OK);
}

static uint8_t *s_transcode(const uint8_t *blk, size_t len, kvedge_prec_t to, bool lz4,
                            size_t *out_len)
{
    kvedge_block_info_t info;
    s_parse(blk, len, &info);
    uint8_t *out = NULL;
    assert_int_equal(kvedge_block_transcode(&info, to, lz4, &out, out_len), KVEDGE_OK);
    assert_non_null(out);
    return out;
}

/* Decodes a block to fp32 K and V (caller frees *k; *v is inside it). */
static void s_decode_f32(const uint8_t *blk, size_t len, float **k, float **v)
{
    kvedge_block_info_t info;
    s_parse(blk, len, &info);
    size_t n = (size_t)info.tokens * info.head_dim;
    *k = malloc(2 * n * sizeof(float));
    assert_non_null(*k);
    *v = *k + n;
    assert_int_equal(kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, *k, *v), KVEDGE_OK);
}

static void test_names_round_trip(void **state)
{
    (void)state;
    unsigned valid = 0;
    for (unsigned p = 0; p < 256; p++) {
        const char *name = kvedge_prec_name((kvedge_prec_t)p);
        assert_non_null(name);
        if (!kvedge_prec_valid((kvedge_prec_t)p)) {
            assert_string_equal(name, p == KVEDGE_PREC_STORED ? "stored" : "?");
            continue;
        }
        valid++;
        assert_true(strlen(name) < KVEDGE_PREC_NAME_BYTES);
        kvedge_prec_t back = 0;
        assert_int_equal(kvedge_prec_parse(name, &back), KVEDGE_OK);
        assert_int_equal(back, p);
    }
    /* The ladder, its int8/int4 rungs entropy-coded, and tc. */
    assert_int_equal(valid, 15 + 12 + 1);
    assert_string_equal(kvedge_prec_name(KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G128, 1)),
                        "int4-g128+think-75");
    assert_string_equal(kvedge_prec_name(KVEDGE_PREC_LOSSLESS), "lossless");
    assert_false(kvedge_prec_valid(KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 3)));
    assert_false(kvedge_prec_valid(KVEDGE_PREC_LOSSLESS | KVEDGE_PREC_EC));
    assert_string_equal(kvedge_prec_name(KVEDGE_PREC_INT8 | KVEDGE_PREC_EC), "int8+ec");
    assert_string_equal(kvedge_prec_name(KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G128, 1) | 0x80u),
                        "int4-g128+think-75+ec");
    kvedge_prec_t p = 0;
    assert_int_equal(kvedge_prec_parse("int4", &p), KVEDGE_OK);
    assert_int_equal(p, KVEDGE_PREC_INT4_G32);
    assert_int_equal(kvedge_prec_parse("int4+think-50", &p), KVEDGE_OK);
    assert_int_equal(p, KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50));
}

static void test_parse_errors(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "unknown",
        "stored",
        "int4-g16",
        "+think-30",
        "+think-50",
        "int8+think-30",
        "int8+",
        "int8x",
        "int8 ",
        " int8",
        "INT8",
        "int4-g32+think-50x",
        "int4-g32+think-50+think-75",
        "int8,int4",
        "lossless+think",
        "int4-g",
        "int4-g064",
        "lossless+ec",
        "lossless+think-50+ec",
        "int8+ec+think-50",
        "+ec",
        "ec",
        "int8+ec+ec",
        "int8+EC",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvedge_prec_t p = 0x7F;
        assert_int_equal(kvedge_prec_parse(bad[i], &p), KVEDGE_EINVAL);
        assert_int_equal(p, 0x7F); /* untouched */
    }
    kvedge_prec_t p;
    assert_int_equal(kvedge_prec_parse(NULL, &p), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_parse("int8", NULL), KVEDGE_EINVAL);
}

static void test_lists(void **state)
{
    (void)state;
    kvedge_prec_t out[KVEDGE_PREC_MAX_ACCEPT + 2];
    size_t n = 99;
    assert_int_equal(kvedge_prec_list_parse("int8,int4-g32+think-50,lossless", out, 8, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(out[0], KVEDGE_PREC_INT8);
    assert_int_equal(out[1], KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50));
    assert_int_equal(out[2], KVEDGE_PREC_LOSSLESS);
    assert_int_equal(kvedge_prec_list_parse("int4-g64", out, 1, &n), 0);
    assert_int_equal(n, 1);

    const char *eight = "lossless,int8,int4-g32,int4-g64,int4-g128,int8+think-75,"
                        "int8+think-50,int4-g32+think-50";
    assert_int_equal(kvedge_prec_list_parse(eight, out, KVEDGE_PREC_MAX_ACCEPT, &n), 0);
    assert_int_equal(n, 8);
    assert_int_equal(kvedge_prec_list_check(out, n), 0);

    static const char *const bad[] = {
        "",
        ",",
        "int8,",
        ",int8",
        "int8,,int4",
        "int8,int8",
        "int4,int4-g32", /* the same rung twice under two names */
        "int8,bogus",
        "int8,stored",
        "int8, int4",
        "lossless,int8,int4-g32,int4-g64,int4-g128,int8+think-75,int8+think-50,"
        "int4-g32+think-50,int4-g64+think-50", /* 9 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = 99;
        out[0] = 0x7F;
        assert_int_equal(kvedge_prec_list_parse(bad[i], out, sizeof out / sizeof out[0], &n),
                         KVEDGE_EINVAL);
        assert_int_equal(n, 99);
        assert_int_equal(out[0], 0x7F);
    }
    assert_int_equal(kvedge_prec_list_parse("int8,int4", out, 1, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_list_parse("int8", out, 0, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_list_parse(NULL, out, 8, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_list_parse("int8", NULL, 8, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_list_parse("int8", out, 8, NULL), KVEDGE_EINVAL);

    kvedge_prec_t ok[2] = {KVEDGE_PREC_INT8, KVEDGE_PREC_LOSSLESS};
    kvedge_prec_t dup[2] = {KVEDGE_PREC_INT8, KVEDGE_PREC_INT8};
    kvedge_prec_t stored[2] = {KVEDGE_PREC_INT8, KVEDGE_PREC_STORED};
    kvedge_prec_t junk[1] = {0x80u | KVEDGE_PREC_LOSSLESS};
    kvedge_prec_t every[16], nine[9];
    s_all(every);
    memcpy(nine, every, sizeof nine);
    assert_int_equal(kvedge_prec_list_check(ok, 2), KVEDGE_OK);
    assert_int_equal(kvedge_prec_list_check(ok, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_list_check(NULL, 1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_list_check(dup, 2), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_list_check(stored, 2), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_list_check(junk, 1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_prec_list_check(nine, 8), KVEDGE_OK);
    assert_int_equal(kvedge_prec_list_check(nine, 9), KVEDGE_EINVAL);
}

static void test_encoding_of_rungs(void **state)
{
    (void)state;
    static const struct {
        uint32_t d, k75, k50;
    } keep[] = {{128, 96, 64}, {96, 72, 48}, {40, 30, 20}, {5, 4, 3},
                {3, 2, 2},     {2, 2, 1},    {1, 1, 1},    {0, 0, 0}};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        assert_int_equal(kvedge_prec_keep_channels(KVEDGE_PREC_INT8, keep[i].d), keep[i].d);
        assert_int_equal(kvedge_prec_keep_channels(KVEDGE_PREC_MAKE(2, 1), keep[i].d), keep[i].k75);
        assert_int_equal(kvedge_prec_keep_channels(KVEDGE_PREC_MAKE(2, 2), keep[i].d), keep[i].k50);
    }
    assert_int_equal(kvedge_prec_scheme(KVEDGE_PREC_LOSSLESS), KVEDGE_SCHEME_LOSSLESS);
    assert_int_equal(kvedge_prec_scheme(KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 2)), KVEDGE_SCHEME_INT8);
    assert_int_equal(kvedge_prec_scheme(KVEDGE_PREC_INT4_G64), KVEDGE_SCHEME_INT4);
    assert_int_equal(kvedge_prec_group(KVEDGE_PREC_LOSSLESS), 0);
    assert_int_equal(kvedge_prec_group(KVEDGE_PREC_INT8), 0);
    assert_int_equal(kvedge_prec_group(KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, 1)), 32);
    assert_int_equal(kvedge_prec_group(KVEDGE_PREC_INT4_G64), 64);
    assert_int_equal(kvedge_prec_group(KVEDGE_PREC_INT4_G128), 128);
}

/* A mask keeping the first `keep` channels. */
static void s_first(uint8_t *mask, uint32_t head_dim, uint32_t keep)
{
    memset(mask, 0, (head_dim + 7) / 8);
    for (uint32_t c = 0; c < keep; c++)
        mask[c >> 3] |= (uint8_t)(1u << (c & 7));
}

static kvedge_prec_t s_of(const uint8_t *blk, size_t len)
{
    kvedge_block_info_t info;
    s_parse(blk, len, &info);
    return kvedge_prec_of_block(&info);
}

static void test_of_block(void **state)
{
    (void)state;
    kvedge_prec_t all[16];
    size_t n_all = s_all(all);
    static const uint32_t dims[] = {128, 40, 3};
    for (size_t di = 0; di < 3; di++) {
        s_head_t h;
        s_head(&h, KVEDGE_DTYPE_FP16, 64, dims[di], S_SEED + di);
        for (size_t i = 0; i < n_all; i++) {
            size_t len;
            uint8_t *blk = s_direct(&h, all[i], i % 2 == 0, &len);
            kvedge_prec_t want = all[i];
            /* head_dim 3: 75 % and 50 % both keep 2, and the shallower level wins. */
            if (dims[di] == 3 && KVEDGE_PREC_THINK(want) == KVEDGE_PREC_THINK_50)
                want = KVEDGE_PREC_MAKE(KVEDGE_PREC_BASE(want), KVEDGE_PREC_THINK_75);
            assert_int_equal(s_of(blk, len), want);
            free(blk);
        }
        s_head_free(&h);
    }
    /* Classified think-75, a head_dim 3 block put at think-50 still derives think-50 rungs. */
    s_head_t h3;
    s_head(&h3, KVEDGE_DTYPE_FP16, 9, 3, S_SEED);
    const kvedge_prec_t to = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50);
    size_t l3, dlen, tlen;
    uint8_t *b3 = s_direct(&h3, KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 2), false, &l3);
    uint8_t *direct = s_direct(&h3, to, false, &dlen);
    uint8_t *got = s_transcode(b3, l3, to, false, &tlen);
    assert_int_equal(tlen, dlen);
    assert_memory_equal(got, direct, dlen);
    free(b3);
    free(direct);
    free(got);
    s_head_free(&h3);

    s_head_t h;
    s_head(&h, KVEDGE_DTYPE_FP16, 64, 32, S_SEED);
    uint8_t mask[4];
    size_t len;
    uint8_t *blk;
    /* Off the ladder: group sizes no rung has, and masks keeping another share. */
    blk = s_encode(&h, KVEDGE_SCHEME_INT4, 16, NULL, false, &len);
    assert_int_equal(s_of(blk, len), KVEDGE_PREC_STORED);
    free(blk);
    blk = s_encode(&h, KVEDGE_SCHEME_INT4, 0, NULL, false, &len);
    assert_int_equal(s_of(blk, len), KVEDGE_PREC_STORED);
    free(blk);
    blk = s_encode(&h, KVEDGE_SCHEME_INT8, 32, NULL, false, &len);
    assert_int_equal(s_of(blk, len), KVEDGE_PREC_STORED);
    free(blk);
    s_first(mask, 32, 3);
    blk = s_encode(&h, KVEDGE_SCHEME_INT4, 32, mask, false, &len);
    assert_int_equal(s_of(blk, len), KVEDGE_PREC_STORED);
    free(blk);
    blk = s_encode(&h, KVEDGE_SCHEME_LOSSLESS, 0, mask, true, &len);
    assert_int_equal(s_of(blk, len), KVEDGE_PREC_STORED);
    free(blk);
    /* Any mask of the rung's count is that rung, whichever channels it keeps. */
    s_first(mask, 32, 16);
    blk = s_encode(&h, KVEDGE_SCHEME_INT4, 64, mask, false, &len);
    assert_int_equal(s_of(blk, len), KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G64, 2));
    free(blk);
    /* A mask keeping every channel is no ThinK. */
    s_first(mask, 32, 32);
    blk = s_encode(&h, KVEDGE_SCHEME_INT8, 0, mask, false, &len);
    assert_int_equal(s_of(blk, len), KVEDGE_PREC_INT8);
    free(blk);
    s_head_free(&h);
    assert_int_equal(kvedge_prec_of_block(NULL), KVEDGE_PREC_STORED);
}

static void test_derivable(void **state)
{
    (void)state;
    const kvedge_prec_t L = KVEDGE_PREC_LOSSLESS, I8 = KVEDGE_PREC_INT8, G32 = KVEDGE_PREC_INT4_G32,
                        G64 = KVEDGE_PREC_INT4_G64, G128 = KVEDGE_PREC_INT4_G128;
    assert_true(kvedge_prec_derivable(L, L));
    assert_true(kvedge_prec_derivable(L, I8));
    assert_true(kvedge_prec_derivable(L, KVEDGE_PREC_MAKE(G128, 2)));
    assert_true(kvedge_prec_derivable(I8, G32));
    assert_true(kvedge_prec_derivable(G32, G128));
    assert_true(kvedge_prec_derivable(KVEDGE_PREC_MAKE(I8, 1), KVEDGE_PREC_MAKE(G32, 2)));
    assert_true(kvedge_prec_derivable(KVEDGE_PREC_MAKE(I8, 1), KVEDGE_PREC_MAKE(I8, 1)));
    assert_false(kvedge_prec_derivable(I8, L));
    assert_false(kvedge_prec_derivable(G64, G32));
    assert_false(kvedge_prec_derivable(KVEDGE_PREC_MAKE(L, 2), KVEDGE_PREC_MAKE(I8, 1)));
    assert_false(kvedge_prec_derivable(KVEDGE_PREC_MAKE(L, 1), L));
    assert_false(kvedge_prec_derivable(KVEDGE_PREC_MAKE(I8, 1), KVEDGE_PREC_MAKE(L, 2)));
    assert_false(kvedge_prec_derivable(KVEDGE_PREC_STORED, I8));
    assert_false(kvedge_prec_derivable(L, KVEDGE_PREC_STORED));
    assert_false(kvedge_prec_derivable(L, KVEDGE_PREC_MAKE(I8, 3)));
    assert_false(kvedge_prec_derivable(0x80u | L, I8));
    /* The whole matrix against the rule: base and level both the same or coarser. */
    kvedge_prec_t all[16];
    size_t n = s_all(all);
    size_t yes = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            bool want = KVEDGE_PREC_BASE(all[j]) >= KVEDGE_PREC_BASE(all[i]) &&
                        KVEDGE_PREC_THINK(all[j]) >= KVEDGE_PREC_THINK(all[i]);
            assert_int_equal(kvedge_prec_derivable(all[i], all[j]), want);
            yes += want;
        }
    assert_int_equal(yes, 15 * 6); /* 15 base pairs x 6 level pairs */
}

/* The key property: from a lossless block, every rung comes out byte for byte as a direct put
 * at that rung, over odd shapes, with and without lz4. */
static void test_transcode_matches_direct(void **state)
{
    (void)state;
    static const uint32_t dims[] = {128, 96, 40};
    static const uint32_t toks[] = {256, 7};
    kvedge_prec_t all[16];
    size_t n_all = s_all(all);
    for (size_t di = 0; di < 3; di++)
        for (size_t ti = 0; ti < 2; ti++)
            for (int lz4 = 0; lz4 < 2; lz4++) {
                s_head_t h;
                s_head(&h, KVEDGE_DTYPE_FP16, toks[ti], dims[di], S_SEED + 10 * di + ti);
                size_t slen;
                uint8_t *src = s_encode(&h, KVEDGE_SCHEME_LOSSLESS, 0, NULL, lz4, &slen);
                for (size_t i = 0; i < n_all; i++) {
                    size_t dlen, tlen;
                    uint8_t *direct = s_direct(&h, all[i], lz4, &dlen);
                    uint8_t *got = s_transcode(src, slen, all[i], lz4, &tlen);
                    assert_int_equal(tlen, dlen);
                    assert_memory_equal(got, direct, dlen);
                    assert_int_equal(s_of(got, tlen), all[i]);
                    free(direct);
                    free(got);
                }
                free(src);
                s_head_free(&h);
            }
}

/* Lossless at think-75 holds the keys 50 % keeps (they are among the 75 % kept), so it derives
 * every think-50 rung as a direct put would; and a put at a rung derives itself unchanged. */
static void test_transcode_from_think(void **state)
{
    (void)state;
    s_head_t h;
    s_head(&h, KVEDGE_DTYPE_FP16, 256, 128, S_SEED + 77);
    size_t slen;
    uint8_t *src = s_direct(&h, KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 1), false, &slen);
    for (unsigned b = KVEDGE_PREC_LOSSLESS; b <= KVEDGE_PREC_INT4_G128; b++) {
        kvedge_prec_t to = KVEDGE_PREC_MAKE(b, KVEDGE_PREC_THINK_50);
        size_t dlen, tlen;
        uint8_t *direct = s_direct(&h, to, false, &dlen);
        uint8_t *got = s_transcode(src, slen, to, false, &tlen);
        assert_int_equal(tlen, dlen);
        assert_memory_equal(got, direct, dlen);
        free(direct);
        free(got);
    }
    free(src);
    /* Identity: a lossless block to its own rung is the block itself. */
    for (int lz4 = 0; lz4 < 2; lz4++) {
        static const kvedge_prec_t same[] = {KVEDGE_PREC_LOSSLESS,
                                             KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 2)};
        for (size_t i = 0; i < 2; i++) {
            size_t tlen;
            src = s_direct(&h, same[i], lz4, &slen);
            uint8_t *got = s_transcode(src, slen, same[i], lz4, &tlen);
            assert_int_equal(tlen, slen);
            assert_memory_equal(got, src, slen);
            free(got);
            free(src);
        }
    }
    s_head_free(&h);
}

/* Where a kept channel is all zeros, the new mask still keeps only channels the source kept. */
static void test_transcode_mask_stays_within(void **state)
{
    (void)state;
    s_head_t h;
    s_head(&h, KVEDGE_DTYPE_FP16, 16, 8, S_SEED);
    /* Channels 2, 3, 4 zero; 0 and 1 dropped by the source (which keeps 6 of 8: think-75). */
    for (uint32_t t = 0; t < 16; t++)
        for (uint32_t c = 2; c <= 4; c++)
            memset(h.k + ((size_t)t * 8 + c) * 2, 0, 2);
    uint8_t mask[1] = {0xFC};
    size_t slen, tlen;
    uint8_t *src = s_encode(&h, KVEDGE_SCHEME_LOSSLESS, 0, mask, false, &slen);
    assert_int_equal(s_of(src, slen), KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 1));
    uint8_t *got = s_transcode(src, slen, KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 2), false, &tlen);
    kvedge_block_info_t info;
    s_parse(got, tlen, &info);
    assert_non_null(info.key_mask);
    assert_int_equal(info.key_channels, 4);
    assert_int_equal(info.key_mask[0], 0xE4); /* 5, 6, 7 by magnitude, then zero channel 2 */
    free(got);
    free(src);
    s_head_free(&h);
}

/* Max |a - b| and the RMS of a - b over n floats. */
static void s_err(const float *a, const float *b, size_t n, double *max, double *rms)
{
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        m = d > m ? d : m;
        s += d * d;
    }
    *max = m;
    *rms = sqrt(s / (double)n);
}

/* int8 -> int4 requantizes the int8-decoded values: the largest error against the original
 * grows by at most twice the int8 error (once as the values' own error, once through a group
 * range widened by it) and the RMS stays within 2 % of a direct int4 put (measured: < 0.6 %;
 * KVEDGE_TEST_VERBOSE=1 prints the figures). */
static void test_transcode_int8_to_int4(void **state)
{
    (void)state;
    static const uint32_t dims[] = {128, 40};
    static const uint32_t toks[] = {256, 7};
    static const kvedge_prec_t rungs[] = {KVEDGE_PREC_INT4_G32, KVEDGE_PREC_INT4_G64,
                                          KVEDGE_PREC_INT4_G128};
    for (size_t di = 0; di < 2; di++)
        for (size_t ti = 0; ti < 2; ti++) {
            s_head_t h;
            s_head(&h, KVEDGE_DTYPE_FP16, toks[ti], dims[di], S_SEED + 3 * di + ti);
            const size_t n = (size_t)toks[ti] * dims[di];
            size_t len8;
            uint8_t *b8 = s_direct(&h, KVEDGE_PREC_INT8, false, &len8);
            float *k8, *v8;
            s_decode_f32(b8, len8, &k8, &v8);
            double e8k, e8v, r;
            s_err(h.kf, k8, n, &e8k, &r);
            s_err(h.vf, v8, n, &e8v, &r);
            for (size_t ri = 0; ri < 3; ri++) {
                size_t dlen, tlen;
                uint8_t *direct = s_direct(&h, rungs[ri], false, &dlen);
                uint8_t *got = s_transcode(b8, len8, rungs[ri], false, &tlen);
                assert_int_equal(tlen, dlen); /* same shape, same size */
                assert_int_equal(s_of(got, tlen), rungs[ri]);
                float *kd, *vd, *kt, *vt;
                s_decode_f32(direct, dlen, &kd, &vd);
                s_decode_f32(got, tlen, &kt, &vt);
                double mdk, rdk, mtk, rtk, mdv, rdv, mtv, rtv;
                s_err(h.kf, kd, n, &mdk, &rdk);
                s_err(h.kf, kt, n, &mtk, &rtk);
                s_err(h.vf, vd, n, &mdv, &rdv);
                s_err(h.vf, vt, n, &mtv, &rtv);
                if (getenv("KVEDGE_TEST_VERBOSE"))
                    printf("D %u T %u %s: int8 max %.4g/%.4g; direct max %.4g/%.4g rms "
                           "%.4g/%.4g; derived max %.4g/%.4g rms %.4g/%.4g (K/V)\n",
                           dims[di], toks[ti], kvedge_prec_name(rungs[ri]), e8k, e8v, mdk, mdv, rdk,
                           rdv, mtk, mtv, rtk, rtv);
                assert_true(mtk <= mdk + 2 * e8k + 1e-3 * mdk);
                assert_true(mtv <= mdv + 2 * e8v + 1e-3 * mdv);
                assert_true(rtk <= 1.02 * rdk);
                assert_true(rtv <= 1.02 * rdv);
                free(kd);
                free(kt);
                free(direct);
                free(got);
            }
            free(k8);
            free(b8);
            s_head_free(&h);
        }
}

/* bf16 and fp32 blocks transcode in their own dtype, as a direct put in that dtype does. */
static void test_transcode_dtypes(void **state)
{
    (void)state;
    static const kvedge_dtype_t dtypes[] = {KVEDGE_DTYPE_BF16, KVEDGE_DTYPE_FP32};
    static const kvedge_prec_t rungs[] = {KVEDGE_PREC_INT8,
                                          KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, 2),
                                          KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 1)};
    for (size_t di = 0; di < 2; di++) {
        s_head_t h;
        s_head(&h, dtypes[di], 33, 96, S_SEED + di);
        size_t slen;
        uint8_t *src = s_encode(&h, KVEDGE_SCHEME_LOSSLESS, 0, NULL, di == 1, &slen);
        for (size_t i = 0; i < 3; i++) {
            size_t dlen, tlen;
            uint8_t *direct = s_direct(&h, rungs[i], false, &dlen);
            uint8_t *got = s_transcode(src, slen, rungs[i], false, &tlen);
            kvedge_block_info_t info;
            s_parse(got, tlen, &info);
            assert_int_equal(info.dtype, dtypes[di]);
            assert_int_equal(tlen, dlen);
            assert_memory_equal(got, direct, dlen);
            free(direct);
            free(got);
        }
        free(src);
        s_head_free(&h);
    }
}

static void s_refused(const uint8_t *blk, size_t len, kvedge_prec_t to)
{
    kvedge_block_info_t info;
    s_parse(blk, len, &info);
    uint8_t *out = (uint8_t *)&info; /* not NULL: the call must reset it */
    size_t out_len = 123;
    assert_int_equal(kvedge_block_transcode(&info, to, false, &out, &out_len), KVEDGE_EINVAL);
    assert_null(out);
    assert_int_equal(out_len, 0);
}

static void test_transcode_refused(void **state)
{
    (void)state;
    s_head_t h;
    s_head(&h, KVEDGE_DTYPE_FP16, 40, 64, S_SEED);
    size_t len, tlen;
    uint8_t *blk = s_direct(&h, KVEDGE_PREC_INT8, true, &len);
    s_refused(blk, len, KVEDGE_PREC_LOSSLESS);
    s_refused(blk, len, KVEDGE_PREC_STORED);
    s_refused(blk, len, KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, 3));
    s_refused(blk, len, 0x80u | KVEDGE_PREC_LOSSLESS);
    free(blk);
    blk = s_direct(&h, KVEDGE_PREC_INT4_G64, false, &len);
    s_refused(blk, len, KVEDGE_PREC_INT4_G32);
    free(blk);
    blk = s_direct(&h, KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, 2), false, &len);
    s_refused(blk, len, KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 1));
    s_refused(blk, len, KVEDGE_PREC_INT8);
    free(blk);

    /* Off the ladder: only a coarser scheme, every channel, and no mask in the source. */
    blk = s_encode(&h, KVEDGE_SCHEME_INT8, 16, NULL, false, &len);
    assert_int_equal(s_of(blk, len), KVEDGE_PREC_STORED);
    s_refused(blk, len, KVEDGE_PREC_INT8);
    s_refused(blk, len, KVEDGE_PREC_LOSSLESS);
    s_refused(blk, len, KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, 1));
    free(s_transcode(blk, len, KVEDGE_PREC_INT4_G64, false, &tlen));
    free(blk);
    blk = s_encode(&h, KVEDGE_SCHEME_INT4, 16, NULL, false, &len);
    s_refused(blk, len, KVEDGE_PREC_INT4_G32);
    s_refused(blk, len, KVEDGE_PREC_INT4_G128);
    free(blk);
    uint8_t mask[8];
    s_first(mask, 64, 5);
    blk = s_encode(&h, KVEDGE_SCHEME_LOSSLESS, 0, mask, false, &len);
    assert_int_equal(s_of(blk, len), KVEDGE_PREC_STORED);
    s_refused(blk, len, KVEDGE_PREC_INT8);
    free(blk);

    /* NULL arguments. */
    blk = s_direct(&h, KVEDGE_PREC_LOSSLESS, false, &len);
    kvedge_block_info_t info;
    s_parse(blk, len, &info);
    uint8_t *out = NULL;
    size_t out_len = 0;
    assert_int_equal(kvedge_block_transcode(NULL, KVEDGE_PREC_INT8, false, &out, &out_len),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_block_transcode(&info, KVEDGE_PREC_INT8, false, NULL, &out_len),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_block_transcode(&info, KVEDGE_PREC_INT8, false, &out, NULL),
                     KVEDGE_EINVAL);
    assert_null(out);
    kvedge_block_info_t empty;
    memset(&empty, 0, sizeof empty);
    assert_int_equal(kvedge_block_transcode(&empty, KVEDGE_PREC_INT8, false, &out, &out_len),
                     KVEDGE_EINVAL);
    free(blk);
    s_head_free(&h);
}

/* bytes_per_fp16 is the encoded length over the fp16 length, exactly, for every rung. */
/* The entropy-coded rungs (bit 7): names, derivation both ways, the rung a coded block is
 * at, and transcodes whose values are exactly the plain rung's. */
static void test_coded_rungs(void **state)
{
    (void)state;
    const kvedge_prec_t I8 = KVEDGE_PREC_INT8, G32 = KVEDGE_PREC_INT4_G32, EC = KVEDGE_PREC_EC;
    const kvedge_prec_t G32_T50 = KVEDGE_PREC_MAKE(G32, KVEDGE_PREC_THINK_50);
    kvedge_prec_t p = 0;
    assert_int_equal(kvedge_prec_parse("int4+ec", &p), KVEDGE_OK);
    assert_int_equal(p, G32 | EC);
    assert_int_equal(kvedge_prec_parse("int4-g32+think-50+ec", &p), KVEDGE_OK);
    assert_int_equal(p, G32_T50 | EC);
    kvedge_prec_t list[4];
    size_t n = 0;
    assert_int_equal(kvedge_prec_list_parse("int4-g32+ec,int4-g32,int8+ec", list, 4, &n), 0);
    assert_int_equal(n, 3);
    assert_true(kvedge_prec_derivable(I8, I8 | EC));
    assert_true(kvedge_prec_derivable(I8 | EC, I8));
    assert_true(kvedge_prec_derivable(KVEDGE_PREC_LOSSLESS, G32_T50 | EC));
    assert_true(kvedge_prec_derivable(I8 | EC, G32_T50 | EC));
    assert_false(kvedge_prec_derivable(G32 | EC, I8));
    assert_false(kvedge_prec_derivable(KVEDGE_PREC_LOSSLESS | EC, I8));
    assert_true(kvedge_prec_decode_us_per_byte(G32 | EC) > 0);
    assert_true(kvedge_prec_decode_us_per_byte(I8 | EC) > 0);
    assert_true(kvedge_prec_decode_us_per_byte(G32) == 0);
    assert_true(kvedge_prec_decode_us_per_byte(KVEDGE_PREC_STORED) == 0);
    double plain = kvedge_prec_bytes_per_fp16(G32, 256, 128, 2);
    assert_true(kvedge_prec_bytes_per_fp16(G32 | EC, 256, 128, 2) ==
                plain * KVEDGE_PREC_EC_RATIO_INT4);
    assert_true(kvedge_prec_bytes_per_fp16(I8 | EC, 256, 128, 2) ==
                kvedge_prec_bytes_per_fp16(I8, 256, 128, 2) * KVEDGE_PREC_EC_RATIO_INT8);

    s_head_t h;
    s_head(&h, KVEDGE_DTYPE_FP16, 64, 40, S_SEED + 9);
    size_t llen, len;
    uint8_t *lossless = s_encode(&h, KVEDGE_SCHEME_LOSSLESS, 0, NULL, false, &llen);
    const kvedge_prec_t tos[] = {I8 | EC, G32 | EC, G32_T50 | EC};
    for (size_t i = 0; i < sizeof tos / sizeof tos[0]; i++) {
        const kvedge_prec_t plain_to = (kvedge_prec_t)(tos[i] & ~EC);
        uint8_t *coded = s_transcode(lossless, llen, tos[i], true, &len);
        kvedge_block_info_t ci;
        s_parse(coded, len, &ci);
        assert_true(ci.ec);
        assert_int_equal(kvedge_prec_of_block(&ci), tos[i]);
        /* Uncoded it is byte for byte the plain rung's transcode (no lz4). */
        size_t plen, ulen;
        uint8_t *direct = s_transcode(lossless, llen, plain_to, false, &plen);
        uint8_t *uncoded = s_transcode(coded, len, plain_to, false, &ulen);
        assert_int_equal(ulen, plen);
        assert_memory_equal(uncoded, direct, plen);
        /* And coded again from the plain block: the same coded bytes. */
        size_t rlen;
        uint8_t *recoded = s_transcode(direct, plen, tos[i], false, &rlen);
        assert_int_equal(rlen, len);
        assert_memory_equal(recoded, coded, len);
        /* The same values as the plain rung: its quality. */
        float *ka, *va, *kb, *vb;
        s_decode_f32(coded, len, &ka, &va);
        s_decode_f32(direct, plen, &kb, &vb);
        assert_memory_equal(ka, kb, 2 * (size_t)h.tokens * h.head_dim * sizeof(float));
        free(ka);
        free(kb);
        free(recoded);
        free(uncoded);
        free(direct);
        free(coded);
    }
    /* From a coded int8 block a coarser coded rung: requantized, then coded. */
    uint8_t *c8 = s_transcode(lossless, llen, I8 | EC, false, &len);
    size_t a, b;
    uint8_t *from_coded = s_transcode(c8, len, G32, false, &a);
    uint8_t *p8 = s_transcode(lossless, llen, I8, false, &b);
    size_t c;
    uint8_t *from_plain = s_transcode(p8, b, G32, false, &c);
    assert_int_equal(a, c);
    assert_memory_equal(from_coded, from_plain, a);
    free(from_plain);
    free(p8);
    free(from_coded);
    free(c8);
    /* Lossless is never coded. */
    kvedge_block_info_t li;
    s_parse(lossless, llen, &li);
    uint8_t *out = NULL;
    assert_int_equal(kvedge_block_transcode(&li, KVEDGE_PREC_LOSSLESS | EC, false, &out, &len),
                     KVEDGE_EINVAL);
    assert_null(out);
    free(lossless);
    s_head_free(&h);
}

static void test_bytes_per_fp16(void **state)
{
    (void)state;
    kvedge_prec_t all[16];
    size_t n_all = s_all(all);
    static const uint32_t dims[] = {128, 40, 3};
    static const uint32_t toks[] = {256, 7};
    static const kvedge_dtype_t dtypes[] = {KVEDGE_DTYPE_FP16, KVEDGE_DTYPE_FP32};
    for (size_t xi = 0; xi < 2; xi++)
        for (size_t di = 0; di < 3; di++)
            for (size_t ti = 0; ti < 2; ti++) {
                s_head_t h;
                s_head(&h, dtypes[xi], toks[ti], dims[di], S_SEED);
                for (size_t i = 0; i < n_all; i++) {
                    size_t len;
                    uint8_t *blk = s_direct(&h, all[i], false, &len);
                    double want = (double)len / (double)kvedge_block_fp16_bytes(toks[ti], dims[di]);
                    double got = kvedge_prec_bytes_per_fp16(all[i], toks[ti], dims[di],
                                                            kvedge_dtype_size(dtypes[xi]));
                    assert_true(got == want);
                    free(blk);
                }
                s_head_free(&h);
            }
    /* Sanity on the ladder's order at a real shape: each base coarser, each level smaller. */
    double last = 1e9;
    for (unsigned b = KVEDGE_PREC_LOSSLESS; b <= KVEDGE_PREC_INT4_G128; b++) {
        double r = kvedge_prec_bytes_per_fp16(KVEDGE_PREC_MAKE(b, 0), 256, 128, 2);
        assert_true(r < last && r > 0);
        assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_MAKE(b, 1), 256, 128, 2) < r);
        assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_MAKE(b, 2), 256, 128, 2) <
                    kvedge_prec_bytes_per_fp16(KVEDGE_PREC_MAKE(b, 1), 256, 128, 2));
        last = r;
    }
    assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_STORED, 256, 128, 2) == 0.0);
    assert_true(kvedge_prec_bytes_per_fp16(0x80u | KVEDGE_PREC_LOSSLESS, 256, 128, 2) == 0.0);
    assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_INT8, 256, 128, 3) == 0.0);
    assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_INT8, 0, 128, 2) == 0.0);
    assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_INT8, 256, 0, 2) == 0.0);
    assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_INT8, 256, 2000, 2) == 0.0);
    assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_INT8, KVEDGE_BLOCK_MAX_TOKENS + 1, 128, 2) ==
                0.0);
}

/* The tc rung: one name, no ThinK, no coding bit, scheme tc over every key channel. */
static void test_tc_rung(void **state)
{
    (void)state;
    assert_int_equal(KVEDGE_PREC_BASE_MAX, 6);
    assert_string_equal(kvedge_prec_name(KVEDGE_PREC_TC), "tc");
    kvedge_prec_t p = 0;
    assert_int_equal(kvedge_prec_parse("tc", &p), KVEDGE_OK);
    assert_int_equal(p, KVEDGE_PREC_TC);
    const char *bad[] = {"tc+think-50", "tc+think-75", "tc+ec", "TC", "tc ", "tc-g32"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = 0;
        assert_int_equal(kvedge_prec_parse(bad[i], &p), KVEDGE_EINVAL);
        assert_int_equal(p, 0);
    }
    assert_true(kvedge_prec_valid(KVEDGE_PREC_TC));
    assert_false(kvedge_prec_valid(KVEDGE_PREC_MAKE(KVEDGE_PREC_TC, KVEDGE_PREC_THINK_75)));
    assert_false(kvedge_prec_valid(KVEDGE_PREC_MAKE(KVEDGE_PREC_TC, KVEDGE_PREC_THINK_50)));
    assert_false(kvedge_prec_valid(KVEDGE_PREC_TC | KVEDGE_PREC_EC));
    assert_false(kvedge_prec_valid(KVEDGE_PREC_BASE_MAX + 1));
    assert_string_equal(kvedge_prec_name(KVEDGE_PREC_TC | KVEDGE_PREC_EC), "?");
    assert_int_equal(kvedge_prec_scheme(KVEDGE_PREC_TC), KVEDGE_SCHEME_TC);
    assert_int_equal(kvedge_prec_group(KVEDGE_PREC_TC), 0);
    assert_int_equal(kvedge_prec_keep_channels(KVEDGE_PREC_TC, 128), 128);
    assert_int_equal(kvedge_prec_of_shape(KVEDGE_SCHEME_TC, 0, 64, 64), KVEDGE_PREC_TC);
    assert_int_equal(kvedge_prec_of_shape(KVEDGE_SCHEME_TC, 0, 32, 64), KVEDGE_PREC_STORED);
    assert_int_equal(kvedge_prec_of_shape(KVEDGE_SCHEME_TC, 32, 64, 64), KVEDGE_PREC_STORED);
    size_t n = 0;
    kvedge_prec_t list[4];
    assert_int_equal(kvedge_prec_list_parse("tc,int8,lossless", list, 4, &n), KVEDGE_OK);
    assert_int_equal(n, 3);
    assert_int_equal(list[0], KVEDGE_PREC_TC);
    assert_int_equal(kvedge_prec_list_parse("tc,tc", list, 4, &n), KVEDGE_EINVAL);
    /* Derivable from lossless and int8 over every key channel (coded or not), and from
     * itself; nothing else derives from tc. */
    const kvedge_prec_t from_ok[] = {KVEDGE_PREC_LOSSLESS, KVEDGE_PREC_INT8,
                                     KVEDGE_PREC_INT8 | KVEDGE_PREC_EC, KVEDGE_PREC_TC};
    for (size_t i = 0; i < sizeof from_ok / sizeof from_ok[0]; i++)
        assert_true(kvedge_prec_derivable(from_ok[i], KVEDGE_PREC_TC));
    kvedge_prec_t all[64];
    const size_t n_all = s_all(all);
    for (size_t i = 0; i < n_all; i++) {
        const bool ok = all[i] == KVEDGE_PREC_LOSSLESS || all[i] == KVEDGE_PREC_INT8;
        assert_int_equal(kvedge_prec_derivable(all[i], KVEDGE_PREC_TC), ok);
        assert_false(kvedge_prec_derivable(KVEDGE_PREC_TC, all[i]));
        assert_false(kvedge_prec_derivable(KVEDGE_PREC_TC, all[i] | KVEDGE_PREC_EC));
    }
    assert_false(kvedge_prec_derivable(KVEDGE_PREC_TC, KVEDGE_PREC_TC | KVEDGE_PREC_EC));
    assert_false(kvedge_prec_derivable(KVEDGE_PREC_STORED, KVEDGE_PREC_TC));
    /* Priced from int8 (placeholders until bench_entropy measures them). */
    const double i8 = kvedge_prec_bytes_per_fp16(KVEDGE_PREC_INT8, 256, 128, 2);
    assert_true(i8 > 0);
    assert_true(fabs(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_TC, 256, 128, 2) -
                     KVEDGE_PREC_TC_RATIO * i8) < 1e-12);
    assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_TC, 256, 128, 3) == 0.0);
    assert_true(kvedge_prec_bytes_per_fp16(KVEDGE_PREC_TC, 0, 128, 2) == 0.0);
    assert_true(kvedge_prec_decode_us_per_byte(KVEDGE_PREC_TC) ==
                KVEDGE_PREC_TC_DECODE_US_PER_BYTE);
    assert_true(kvedge_prec_decode_us_per_byte(KVEDGE_PREC_TC | KVEDGE_PREC_EC) == 0.0);
}

/* The model whose basis test_transcode_tc registers (after test_transcode_tc_without_basis:
 * the registry is process-wide), and its step. */
#define S_TC_MODEL "prec-tc"
#define S_TC_STEP  0.03125f

/* Checks a tc block decodes within step/2 of kref and vref (fp32 [T][D]): a signed-permutation
 * basis is exact, so only the fp16 rounding of the channel means and fp32 arithmetic add. */
static void s_tc_within(const uint8_t *blk, size_t len, const float *kref, const float *vref)
{
    float *k, *v;
    s_decode_f32(blk, len, &k, &v);
    kvedge_block_info_t info;
    s_parse(blk, len, &info);
    const size_t n = (size_t)info.tokens * info.head_dim;
    for (size_t i = 0; i < n; i++) {
        const float tk = S_TC_STEP / 2 + 1e-6f * fabsf(kref[i]) + 1e-7f,
                    tv = S_TC_STEP / 2 + 1e-6f * fabsf(vref[i]) + 1e-7f;
        if (!(fabsf(k[i] - kref[i]) <= tk) || !(fabsf(v[i] - vref[i]) <= tv))
            fail_msg("value %zu: K %g vs %g, V %g vs %g", i, (double)k[i], (double)kref[i],
                     (double)v[i], (double)vref[i]);
    }
    free(k);
}

/* Before any basis is registered: transcode_at to tc is ENOBASIS, and so is transcode. */
static void test_transcode_tc_without_basis(void **state)
{
    (void)state;
    assert_null(kvedge_basis_find_model(S_TC_MODEL));
    s_head_t h;
    s_head(&h, KVEDGE_DTYPE_FP16, 32, 16, S_SEED + 500);
    size_t len, olen = 1;
    uint8_t *src = s_direct(&h, KVEDGE_PREC_LOSSLESS, false, &len), *out = (uint8_t *)1;
    kvedge_block_info_t info;
    s_parse(src, len, &info);
    assert_int_equal(
        kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false, S_TC_MODEL, 0, 0, &out, &olen),
        KVEDGE_ENOBASIS);
    assert_null(out);
    assert_int_equal(olen, 0);
    out = (uint8_t *)1;
    assert_int_equal(kvedge_block_transcode(&info, KVEDGE_PREC_TC, false, &out, &olen),
                     KVEDGE_ENOBASIS);
    assert_null(out);
    free(src);
    s_head_free(&h);
}

/* The refusals of transcode_at to tc from a lossless block: another model, a location outside
 * the basis, no model; then from int4 and from a ThinK rung. */
static void s_tc_refusals(const s_head_t *h, const uint8_t *src, size_t len)
{
    kvedge_block_info_t info;
    s_parse(src, len, &info);
    uint8_t *out = (uint8_t *)1;
    size_t olen;
    assert_int_equal(
        kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false, "other-model", 0, 0, &out, &olen),
        KVEDGE_ENOBASIS);
    assert_null(out);
    assert_int_equal(
        kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false, S_TC_MODEL, 2, 0, &out, &olen),
        KVEDGE_ESHAPE);
    assert_int_equal(
        kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false, S_TC_MODEL, 0, 2, &out, &olen),
        KVEDGE_ESHAPE);
    assert_int_equal(
        kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false, NULL, 0, 0, &out, &olen),
        KVEDGE_EINVAL);
    uint8_t *i4 = s_transcode(src, len, KVEDGE_PREC_INT4_G32, false, &olen);
    s_parse(i4, olen, &info);
    assert_int_equal(
        kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false, S_TC_MODEL, 0, 0, &out, &olen),
        KVEDGE_EINVAL);
    free(i4);
    size_t tlen;
    uint8_t *think =
        s_direct(h, KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, KVEDGE_PREC_THINK_50), false, &tlen);
    s_parse(think, tlen, &info);
    assert_int_equal(
        kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false, S_TC_MODEL, 0, 0, &out, &olen),
        KVEDGE_EINVAL);
    assert_null(out);
    free(think);
}

/* A tc block made from lossless: its header, location and values; tc -> tc copies it, and
 * nothing else derives from it. */
static void s_tc_from_lossless(const s_head_t *h, const uint8_t *src, size_t len)
{
    kvedge_block_info_t info, oi;
    s_parse(src, len, &info);
    uint8_t *out = NULL;
    size_t olen;
    assert_int_equal(
        kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, true, S_TC_MODEL, 1, 0, &out, &olen),
        KVEDGE_OK);
    s_parse(out, olen, &oi);
    assert_int_equal(oi.version, KVEDGE_BLOCK_VERSION_TC);
    assert_int_equal(oi.dtype, h->dtype);
    assert_int_equal(kvedge_prec_of_block(&oi), KVEDGE_PREC_TC);
    uint64_t id;
    uint16_t layer, head;
    assert_int_equal(kvedge_block_tc_where(&oi, &id, &layer, &head), KVEDGE_OK);
    assert_int_equal(id, kvedge_basis_id(kvedge_basis_find_model(S_TC_MODEL)));
    assert_int_equal(layer, 1);
    assert_int_equal(head, 0);
    s_tc_within(out, olen, h->kf, h->vf);
    uint8_t *again = NULL;
    size_t alen;
    assert_int_equal(
        kvedge_block_transcode_at(&oi, KVEDGE_PREC_TC, false, S_TC_MODEL, 1, 0, &again, &alen),
        KVEDGE_OK);
    assert_int_equal(alen, olen);
    assert_memory_equal(again, out, olen);
    free(again);
    assert_int_equal(kvedge_block_transcode(&oi, KVEDGE_PREC_TC, false, &again, &alen), KVEDGE_OK);
    assert_memory_equal(again, out, olen);
    free(again);
    again = (uint8_t *)1;
    assert_int_equal(kvedge_block_transcode(&oi, KVEDGE_PREC_INT8, false, &again, &alen),
                     KVEDGE_EINVAL);
    assert_null(again);
    assert_int_equal(kvedge_block_transcode_at(&oi, KVEDGE_PREC_INT4_G32, false, S_TC_MODEL, 1, 0,
                                               &again, &alen),
                     KVEDGE_EINVAL);
    free(out);
}

static void test_transcode_tc(void **state)
{
    (void)state;
    uint8_t *file;
    size_t flen;
    assert_int_equal(kt_basis_file(S_TC_MODEL, 2, 2, 16, S_TC_STEP, 11, &file, &flen), 0);
    kvedge_basis_t *b = NULL;
    assert_int_equal(kvedge_basis_parse(file, flen, &b, NULL, 0), KVEDGE_OK);
    free(file);
    assert_int_equal(kvedge_basis_register(&b), KVEDGE_OK);
    const kvedge_dtype_t dtypes[] = {KVEDGE_DTYPE_FP16, KVEDGE_DTYPE_BF16, KVEDGE_DTYPE_FP32};
    for (size_t d = 0; d < 3; d++) {
        s_head_t h;
        s_head(&h, dtypes[d], 37, 16, S_SEED + 501 + d);
        size_t len, olen;
        uint8_t *src = s_direct(&h, KVEDGE_PREC_LOSSLESS, true, &len);
        s_tc_from_lossless(&h, src, len);
        /* From int8 (and int8+ec): within step/2 of the int8-decoded values. */
        const kvedge_prec_t int8s[] = {KVEDGE_PREC_INT8, KVEDGE_PREC_INT8 | KVEDGE_PREC_EC};
        for (size_t r = 0; r < 2; r++) {
            uint8_t *i8 = s_transcode(src, len, int8s[r], false, &olen), *out = NULL;
            const size_t i8len = olen;
            float *k8, *v8;
            s_decode_f32(i8, i8len, &k8, &v8);
            kvedge_block_info_t info;
            s_parse(i8, i8len, &info);
            assert_int_equal(kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false, S_TC_MODEL, 0,
                                                       1, &out, &olen),
                             KVEDGE_OK);
            s_tc_within(out, olen, k8, v8);
            free(out);
            free(k8);
            free(i8);
        }
        /* Other rungs: exactly kvedge_block_transcode. */
        kvedge_block_info_t info;
        s_parse(src, len, &info);
        uint8_t *a = NULL, *t = NULL;
        size_t al, tl;
        assert_int_equal(
            kvedge_block_transcode_at(&info, KVEDGE_PREC_INT4_G64, true, S_TC_MODEL, 0, 0, &a, &al),
            KVEDGE_OK);
        assert_int_equal(kvedge_block_transcode(&info, KVEDGE_PREC_INT4_G64, true, &t, &tl),
                         KVEDGE_OK);
        assert_int_equal(al, tl);
        assert_memory_equal(a, t, al);
        free(a);
        free(t);
        s_tc_refusals(&h, src, len);
        free(src);
        s_head_free(&h);
    }
    /* A head_dim that is not the basis's. */
    s_head_t h;
    s_head(&h, KVEDGE_DTYPE_FP16, 8, 32, S_SEED + 510);
    size_t len, olen;
    uint8_t *src = s_direct(&h, KVEDGE_PREC_INT8, false, &len), *out = NULL;
    kvedge_block_info_t info;
    s_parse(src, len, &info);
    assert_int_equal(
        kvedge_block_transcode_at(&info, KVEDGE_PREC_TC, false, S_TC_MODEL, 0, 0, &out, &olen),
        KVEDGE_ESHAPE);
    assert_null(out);
    free(src);
    s_head_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_round_trip),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_lists),
        cmocka_unit_test(test_encoding_of_rungs),
        cmocka_unit_test(test_of_block),
        cmocka_unit_test(test_derivable),
        cmocka_unit_test(test_transcode_matches_direct),
        cmocka_unit_test(test_transcode_from_think),
        cmocka_unit_test(test_transcode_mask_stays_within),
        cmocka_unit_test(test_transcode_int8_to_int4),
        cmocka_unit_test(test_transcode_dtypes),
        cmocka_unit_test(test_transcode_refused),
        cmocka_unit_test(test_coded_rungs),
        cmocka_unit_test(test_bytes_per_fp16),
        cmocka_unit_test(test_tc_rung),
        cmocka_unit_test(test_transcode_tc_without_basis),
        cmocka_unit_test(test_transcode_tc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
