/* Block variants: round trips and listing, serving by accept list, deriving, put errors,
 * corrupt variants (quarantine, the next option served, verify), the lifecycle with the
 * primary (delete, evict, expire, re-put, quarantine), capacity, reopen, read-only opens of a
 * store without the family, and repair. */
#define _GNU_SOURCE /* nftw */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <rocksdb/c.h>

#include "store/engine/engine.h"
#include "store/engine/engine_debug.h"
#include "access/codec/error.h"
#include "access/codec/prec.h"
#include "tests/common/engine_fx.h"
#include "tests/common/testutil.h"

#define MODEL    "test-model"
#define LAYERS   2
#define HEADS    4
#define HEAD_DIM 64
#define TOKENS   32

static const kvedge_prec_t LL = KVEDGE_PREC_LOSSLESS;
static const kvedge_prec_t I8 = KVEDGE_PREC_INT8;
static const kvedge_prec_t G32 = KVEDGE_PREC_INT4_G32;
static const kvedge_prec_t G64 = KVEDGE_PREC_INT4_G64;

static int setup(void **state)
{
    return kt_fx_setup(state, "variants", 1000);
}

static int teardown(void **state)
{
    return kt_fx_teardown(state);
}

/* Opens fx->e with opts (the fixture's clock when opts is NULL) and registers the model. */
static void s_open(fx_t *fx, const kvedge_engine_opts_t *opts)
{
    const kvedge_model_t m = {MODEL, LAYERS, HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16};
    kt_fx_open(fx, opts, &m);
}

/* A synthetic block of one scheme (group 0: lossless or int8). */
static uint8_t *s_block(uint64_t seed, uint32_t tokens, kvedge_dtype_t dtype,
                        kvedge_scheme_t scheme, size_t *len)
{
    kvedge_block_spec_t spec = {dtype, scheme, tokens, HEAD_DIM, 0, NULL, false};
    uint8_t *b = kt_encode(&spec, seed, len);
    assert_non_null(b);
    return b;
}

/* The block at rung `to` derived from blk, as kvedge_engine_get_prec derives it. */
static uint8_t *s_at(const uint8_t *blk, size_t len, kvedge_prec_t to, size_t *out_len)
{
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_check(blk, len, &info), 0);
    uint8_t *out = NULL;
    assert_int_equal(kvedge_block_transcode(&info, to, true, &out, out_len), 0);
    return out;
}

static kvedge_chunk_info_t s_chunk(uint8_t tag, uint32_t tokens)
{
    kvedge_chunk_info_t c;
    memset(&c, 0, sizeof c);
    for (size_t i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++)
        c.id.bytes[i] = (uint8_t)(tag + 31 * i);
    strcpy(c.model_id, MODEL);
    c.tokens = tokens;
    return c;
}

static kvedge_block_key_t s_key(const kvedge_chunk_info_t *c, uint16_t layer, uint16_t head)
{
    kvedge_block_key_t k = {.chunk = c->id, .layer = layer, .head = head};
    return k;
}

static void s_expect_variant(kvedge_engine_t *e, const kvedge_block_key_t *k, kvedge_prec_t p,
                             const uint8_t *data, size_t len)
{
    kvedge_value_t v;
    assert_int_equal(kvedge_engine_get_variant(e, k, p, &v), 0);
    assert_int_equal(v.len, len);
    assert_memory_equal(v.data, data, len);
    kvedge_value_release(&v);
}

static int s_variant_rc(kvedge_engine_t *e, const kvedge_block_key_t *k, kvedge_prec_t p)
{
    kvedge_value_t v;
    int rc = kvedge_engine_get_variant(e, k, p, &v);
    kvedge_value_release(&v);
    return rc;
}

static void s_vstats(kvedge_engine_t *e, uint64_t blocks, uint64_t bytes)
{
    uint64_t b, n;
    assert_int_equal(kvedge_engine_variant_stats(e, &n, &b), 0);
    assert_int_equal(n, blocks);
    assert_int_equal(b, bytes);
}

static kvedge_engine_stats_t s_stats(kvedge_engine_t *e)
{
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_engine_stats(e, &st), 0);
    return st;
}

/* get_prec, checking the bytes served; returns its code. */
static int s_prec(kvedge_engine_t *e, const kvedge_block_key_t *k, const kvedge_prec_t *accept,
                  size_t n, bool derive, kvedge_prec_t want_served, bool want_derived,
                  const uint8_t *want, size_t want_len)
{
    kvedge_value_t v;
    kvedge_prec_t served = 0xEE;
    bool derived = true;
    int rc = kvedge_engine_get_prec(e, k, accept, n, derive, &v, &served, &derived);
    if (rc == 0) {
        assert_int_equal(served, want_served);
        assert_int_equal(derived, want_derived);
        if (want) {
            assert_int_equal(v.len, want_len);
            assert_memory_equal(v.data, want, want_len);
        }
    } else {
        assert_null(v.data);
        assert_false(derived);
    }
    kvedge_value_release(&v);
    return rc;
}

/* A primary (lossless) at (layer, head) of c with int8 and int4-g32 variants. */
typedef struct {
    uint8_t *p, *i8, *g32;
    size_t pl, i8l, g32l;
} trio_t;

static void s_trio(fx_t *fx, const kvedge_chunk_info_t *c, uint16_t layer, uint16_t head,
                   uint64_t seed, trio_t *t)
{
    t->p = s_block(seed, c->tokens, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, &t->pl);
    t->i8 = s_at(t->p, t->pl, I8, &t->i8l);
    t->g32 = s_at(t->p, t->pl, G32, &t->g32l);
    kvedge_block_key_t k = s_key(c, layer, head);
    assert_int_equal(kvedge_engine_put(fx->e, c, layer, head, t->p, t->pl, NULL), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, I8, t->i8, t->i8l), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, G32, t->g32, t->g32l), 0);
}

static void s_trio_free(trio_t *t)
{
    free(t->p);
    free(t->i8);
    free(t->g32);
}

/* Opens the store's RocksDB database with every family and rewrites (data) or deletes (data
 * NULL) one key of one family, or drops the whole family (key NULL). */
static void s_raw(fx_t *fx, const char *family, const void *key, size_t klen, const void *data,
                  size_t len)
{
    rocksdb_options_t *opt = rocksdb_options_create();
    char *err = NULL;
    size_t n = 0;
    char **names = rocksdb_list_column_families(opt, fx->path, &n, &err);
    assert_null(err);
    const rocksdb_options_t **cfo = calloc(n, sizeof *cfo);
    rocksdb_column_family_handle_t **h = calloc(n, sizeof *h);
    assert_non_null(cfo);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++)
        cfo[i] = opt;
    rocksdb_t *db = rocksdb_open_column_families(opt, fx->path, (int)n, (const char *const *)names,
                                                 cfo, h, &err);
    assert_null(err);
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(names[i], family) != 0)
            continue;
        found++;
        if (!key)
            rocksdb_drop_column_family(db, h[i], &err);
        else if (data)
            rocksdb_put_cf(db, wo, h[i], key, klen, data, len, &err);
        else
            rocksdb_delete_cf(db, wo, h[i], key, klen, &err);
        assert_null(err);
    }
    assert_int_equal(found, 1);
    rocksdb_writeoptions_destroy(wo);
    for (size_t i = 0; i < n; i++)
        rocksdb_column_family_handle_destroy(h[i]);
    rocksdb_close(db);
    rocksdb_list_column_families_destroy(names, n);
    free(cfo);
    free(h);
    rocksdb_options_destroy(opt);
}

/* The variant record of rung p at k as stored: the primary's checksum, then the block. */
static void s_vkey(const kvedge_block_key_t *k, kvedge_prec_t p, uint8_t out[37])
{
    kvedge_block_key_pack(k, out);
    out[KVEDGE_BLOCK_KEY_BYTES] = p;
}

/* Closes the engine and writes block (with a flipped byte) as the variant of rung p at k. */
static void s_damage_variant(fx_t *fx, const kvedge_block_key_t *k, kvedge_prec_t p,
                             const uint8_t *block, size_t len, uint64_t primary_checksum)
{
    kvedge_engine_destroy(&fx->e);
    uint8_t vk[37];
    s_vkey(k, p, vk);
    uint8_t *rec = malloc(8 + len);
    assert_non_null(rec);
    for (int i = 0; i < 8; i++)
        rec[i] = (uint8_t)(primary_checksum >> (8 * i));
    memcpy(rec + 8, block, len);
    rec[8 + len / 2] ^= 0x10;
    s_raw(fx, "variants", vk, sizeof vk, rec, 8 + len);
    free(rec);
    s_open(fx, NULL);
}

/* ---------------------------------------------------------------- tests */

static void test_round_trip_and_listing(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(1, TOKENS);
    kvedge_block_key_t k = s_key(&c, 1, 2);

    /* Degenerate input. */
    kvedge_value_t v;
    size_t n = 7;
    kvedge_prec_t held[8];
    assert_int_equal(kvedge_engine_get_variant(NULL, &k, I8, &v), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_get_variant(fx->e, &k, 0, &v), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_get_variant(fx->e, &k, 0x80 | LL, &v), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_variants(fx->e, &k, NULL, 1, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_variants(fx->e, &k, held, 8, &n), KVEDGE_ENOTFOUND);
    assert_int_equal(n, 0);
    assert_int_equal(kvedge_engine_drop_variant(fx->e, &k, I8), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_variant_stats(NULL, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(s_variant_rc(fx->e, &k, I8), KVEDGE_ENOTFOUND);
    s_vstats(fx->e, 0, 0);

    trio_t t;
    s_trio(fx, &c, 1, 2, 11, &t);
    s_expect_variant(fx->e, &k, I8, t.i8, t.i8l);
    s_expect_variant(fx->e, &k, G32, t.g32, t.g32l);
    assert_int_equal(s_variant_rc(fx->e, &k, G64), KVEDGE_ENOTFOUND);
    assert_int_equal(s_variant_rc(fx->e, &k, LL), KVEDGE_ENOTFOUND); /* the primary's rung */
    assert_int_equal(kvedge_engine_variants(fx->e, &k, held, 8, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(held[0], I8);
    assert_int_equal(held[1], G32);
    assert_int_equal(kvedge_engine_variants(fx->e, &k, held, 1, &n), 0);
    assert_int_equal(n, 2); /* held, though one was written */
    assert_int_equal(kvedge_engine_variants(fx->e, &k, NULL, 0, &n), 0);
    assert_int_equal(n, 2);
    s_vstats(fx->e, 2, t.i8l + t.g32l);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 1);
    assert_int_equal(st.bytes, t.pl); /* primaries only */

    /* The primary is served as ever. */
    assert_int_equal(kvedge_engine_get(fx->e, &k, &v), 0);
    assert_int_equal(v.len, t.pl);
    assert_memory_equal(v.data, t.p, t.pl);
    kvedge_value_release(&v);

    /* Replacing a rung; dropping one. */
    size_t p2l, g2l;
    uint8_t *p2 = s_block(12, TOKENS, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, &p2l);
    uint8_t *g2 = s_at(p2, p2l, G32, &g2l);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, G32, g2, g2l), 0);
    s_expect_variant(fx->e, &k, G32, g2, g2l);
    s_vstats(fx->e, 2, t.i8l + g2l);
    assert_int_equal(kvedge_engine_drop_variant(fx->e, &k, I8), 0);
    assert_int_equal(kvedge_engine_drop_variant(fx->e, &k, I8), KVEDGE_ENOTFOUND);
    assert_int_equal(s_variant_rc(fx->e, &k, I8), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_variants(fx->e, &k, held, 8, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(held[0], G32);
    s_vstats(fx->e, 1, g2l);
    free(p2);
    free(g2);
    s_trio_free(&t);
}

static void test_get_prec_order(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(2, TOKENS);
    kvedge_block_key_t k = s_key(&c, 0, 0);
    trio_t t;
    s_trio(fx, &c, 0, 0, 21, &t);

    kvedge_value_t v;
    kvedge_prec_t served;
    kvedge_prec_t bad_list[2] = {I8, I8};
    assert_int_equal(kvedge_engine_get_prec(fx->e, &k, bad_list, 2, false, &v, &served, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_get_prec(fx->e, &k, bad_list, 0, false, &v, &served, NULL),
                     KVEDGE_EINVAL);
    kvedge_prec_t stored[1] = {KVEDGE_PREC_STORED};
    assert_int_equal(kvedge_engine_get_prec(fx->e, &k, stored, 1, false, &v, &served, NULL),
                     KVEDGE_EINVAL);

    kvedge_prec_t a1[] = {LL, I8};
    assert_int_equal(s_prec(fx->e, &k, a1, 2, false, LL, false, t.p, t.pl), 0);
    kvedge_prec_t a2[] = {I8, LL};
    assert_int_equal(s_prec(fx->e, &k, a2, 2, false, I8, false, t.i8, t.i8l), 0);
    kvedge_prec_t a3[] = {G64, G32, I8};
    assert_int_equal(s_prec(fx->e, &k, a3, 3, false, G32, false, t.g32, t.g32l), 0);
    kvedge_prec_t a4[] = {G64};
    assert_int_equal(s_prec(fx->e, &k, a4, 1, false, 0, false, NULL, 0), KVEDGE_ENOTFOUND);
    kvedge_block_key_t none = s_key(&c, 1, 0);
    assert_int_equal(s_prec(fx->e, &none, a1, 2, true, 0, false, NULL, 0), KVEDGE_ENOTFOUND);

    /* Serving a variant is an access of the block: the primary's atime moves. */
    kvedge_block_meta_t m;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), 0);
    uint64_t before = m.atime_ms;
    fx->now += 5000;
    assert_int_equal(s_prec(fx->e, &k, a2, 2, false, I8, false, t.i8, t.i8l), 0);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), 0);
    assert_true(m.atime_ms > before);
    assert_int_equal(m.atime_ms, fx->now);
    s_trio_free(&t);
}

static void test_lossless_never_quantized(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(3, TOKENS);
    kvedge_block_key_t k = s_key(&c, 0, 1);
    size_t len;
    uint8_t *i8 = s_block(31, TOKENS, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, &len);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, i8, len, NULL), 0);
    kvedge_prec_t a[] = {LL};
    assert_int_equal(s_prec(fx->e, &k, a, 1, false, 0, false, NULL, 0), KVEDGE_ENOTFOUND);
    assert_int_equal(s_prec(fx->e, &k, a, 1, true, 0, false, NULL, 0), KVEDGE_ENOTFOUND);
    /* int8 itself is served when accepted after lossless. */
    kvedge_prec_t b[] = {LL, I8};
    assert_int_equal(s_prec(fx->e, &k, b, 2, true, I8, false, i8, len), 0);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.gets, 3);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 2);
    free(i8);
}

static void test_derive(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(4, TOKENS);
    kvedge_block_key_t k = s_key(&c, 1, 3);
    size_t pl, want_l;
    uint8_t *p = s_block(41, TOKENS, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, &pl);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 3, p, pl, NULL), 0);

    /* From the lossless primary, not stored. */
    uint8_t *want = s_at(p, pl, G32, &want_l);
    kvedge_prec_t a[] = {G32};
    assert_int_equal(s_prec(fx->e, &k, a, 1, false, 0, false, NULL, 0), KVEDGE_ENOTFOUND);
    assert_int_equal(s_prec(fx->e, &k, a, 1, true, G32, true, want, want_l), 0);
    size_t n;
    assert_int_equal(kvedge_engine_variants(fx->e, &k, NULL, 0, &n), 0);
    assert_int_equal(n, 0);
    s_vstats(fx->e, 0, 0);
    /* The caller may keep it. */
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, G32, want, want_l), 0);
    assert_int_equal(s_prec(fx->e, &k, a, 1, true, G32, false, want, want_l), 0);
    free(want);

    /* ThinK rungs derive too. */
    kvedge_prec_t think = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, KVEDGE_PREC_THINK_50);
    want = s_at(p, pl, think, &want_l);
    kvedge_prec_t a2[] = {think};
    assert_int_equal(s_prec(fx->e, &k, a2, 1, true, think, true, want, want_l), 0);
    free(want);

    /* Finest source first: an int8 variant before an int4-g32 primary. */
    kvedge_block_key_t k2 = s_key(&c, 0, 0);
    size_t g32l, i8l;
    uint8_t *g32 = s_at(p, pl, G32, &g32l), *i8 = s_at(p, pl, I8, &i8l);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, g32, g32l, NULL), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k2, I8, i8, i8l), 0);
    want = s_at(i8, i8l, G64, &want_l);
    kvedge_prec_t a3[] = {LL, G64};
    assert_int_equal(s_prec(fx->e, &k2, a3, 2, true, G64, true, want, want_l), 0);
    free(want);
    free(g32);
    free(i8);
    free(p);
}

/* Entropy-coded rungs: derived from the lossless primary and from a plain variant of the same
 * rung (recoded, no requantization), kept as variants of their own rung; a coded block is
 * never a primary, and never a demotion target. */
static void test_coded_rungs(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(6, TOKENS);
    kvedge_block_key_t k = s_key(&c, 1, 2);
    size_t pl, want_l, g32l;
    uint8_t *p = s_block(43, TOKENS, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, &pl);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 2, p, pl, NULL), 0);
    const kvedge_prec_t g32ec = G32 | KVEDGE_PREC_EC;

    uint8_t *want = s_at(p, pl, g32ec, &want_l);
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_check(want, want_l, &info), 0);
    assert_true(info.ec);
    kvedge_prec_t a[] = {g32ec};
    assert_int_equal(s_prec(fx->e, &k, a, 1, true, g32ec, true, want, want_l), 0);
    /* Kept as a variant at its own rung, served as held. */
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, g32ec, want, want_l), 0);
    assert_int_equal(s_prec(fx->e, &k, a, 1, true, g32ec, false, want, want_l), 0);
    /* Not the plain rung's variant: a coded block under the plain rung is refused. */
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, G32, want, want_l), KVEDGE_EINVAL);

    /* From a plain int4-g32 primary: the same codes, coded. */
    kvedge_block_key_t k2 = s_key(&c, 0, 1);
    uint8_t *g32 = s_at(p, pl, G32, &g32l);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, g32, g32l, NULL), 0);
    assert_int_equal(s_prec(fx->e, &k2, a, 1, true, g32ec, true, want, want_l), 0);

    /* Never a primary: a put of a coded block is refused, and the store keeps what it had. */
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, want, want_l, NULL), KVEDGE_EINVAL);
    kvedge_prec_t a2[] = {G32};
    assert_int_equal(s_prec(fx->e, &k2, a2, 1, false, G32, false, g32, g32l), 0);
    int64_t saved = 0;
    assert_int_equal(kvedge_engine_demote(fx->e, &k, g32ec, &saved), KVEDGE_EINVAL);
    free(g32);
    free(want);
    free(p);
}

static void test_put_variant_errors(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(5, TOKENS);
    kvedge_block_key_t k = s_key(&c, 0, 2);
    size_t pl, i8l, g32l;
    uint8_t *p = s_block(51, TOKENS, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, &pl);
    uint8_t *i8 = s_at(p, pl, I8, &i8l), *g32 = s_at(p, pl, G32, &g32l);

    assert_int_equal(kvedge_engine_put_variant(NULL, &k, I8, i8, i8l), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, I8, NULL, i8l), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, I8, i8, i8l), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 2, p, pl, NULL), 0);

    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, KVEDGE_PREC_STORED, i8, i8l),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, 0x80 | I8, i8, i8l), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, KVEDGE_PREC_BASE_MAX + 1, i8, i8l),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, G32, i8, i8l), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, LL, p, pl), KVEDGE_EINVAL);

    /* Shape: other tokens, other dtype. */
    size_t ol, fl;
    uint8_t *other = s_block(52, TOKENS / 2, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, &ol);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, I8, other, ol), KVEDGE_ESHAPE);
    uint8_t *f32 = s_block(53, TOKENS, KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_INT8, &fl);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, I8, f32, fl), KVEDGE_ESHAPE);

    /* A damaged block is refused as a put refuses it. */
    uint8_t *bad = malloc(i8l);
    memcpy(bad, i8, i8l);
    bad[i8l / 2] ^= 0x01;
    assert_true(kvedge_engine_put_variant(fx->e, &k, I8, bad, i8l) < 0);
    assert_true(kvedge_engine_put_variant(fx->e, &k, I8, i8, i8l - 3) < 0);

    /* An expired primary holds nothing. */
    kvedge_put_opts_t po = {.ttl_s = 1};
    kvedge_block_key_t k2 = s_key(&c, 0, 3);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 3, p, pl, &po), 0);
    fx->now += 2000;
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k2, I8, i8, i8l), KVEDGE_ENOTFOUND);

    s_vstats(fx->e, 0, 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, I8, i8, i8l), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, G32, g32, g32l), 0);
    s_vstats(fx->e, 2, i8l + g32l);

    /* Read-only. */
    kvedge_engine_destroy(&fx->e);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.read_only = true;
    s_open(fx, &o);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, I8, i8, i8l), KVEDGE_EREADONLY);
    assert_int_equal(kvedge_engine_drop_variant(fx->e, &k, I8), KVEDGE_EREADONLY);
    s_expect_variant(fx->e, &k, I8, i8, i8l);
    s_vstats(fx->e, 2, i8l + g32l);
    free(bad);
    free(other);
    free(f32);
    free(p);
    free(i8);
    free(g32);
}

typedef struct {
    int calls;
    kvedge_block_key_t key;
    int err;
} verify_ctx_t;

static int s_verify_cb(void *ctx, const kvedge_block_key_t *key, int err)
{
    verify_ctx_t *vc = ctx;
    vc->calls++;
    vc->key = *key;
    vc->err = err;
    return 0;
}

static void test_corrupt_variant(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(6, TOKENS);
    kvedge_block_key_t k = s_key(&c, 1, 1), k2 = s_key(&c, 1, 2);
    trio_t t, t2;
    s_trio(fx, &c, 1, 1, 61, &t);
    s_trio(fx, &c, 1, 2, 62, &t2);
    kvedge_block_meta_t m, m2;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), 0);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k2, &m2), 0);
    s_damage_variant(fx, &k, I8, t.i8, t.i8l, m.checksum);
    s_damage_variant(fx, &k2, I8, t2.i8, t2.i8l, m2.checksum);
    s_vstats(fx->e, 4, t.i8l + t.g32l + t2.i8l + t2.g32l);

    /* verify finds it, under its primary's key, and leaves it unless asked. */
    uint64_t checked, bad;
    verify_ctx_t vc = {0};
    assert_int_equal(kvedge_engine_verify(fx->e, false, s_verify_cb, &vc, &checked, &bad), 0);
    assert_int_equal(checked, 6);
    assert_int_equal(bad, 2);
    assert_int_equal(vc.calls, 2);
    assert_memory_equal(&vc.key, &k2, sizeof k2);
    assert_true(vc.err < 0);
    s_vstats(fx->e, 4, t.i8l + t.g32l + t2.i8l + t2.g32l);

    /* get_prec: quarantined, and the next acceptable served. */
    kvedge_prec_t a[] = {I8, G32, LL};
    assert_int_equal(s_prec(fx->e, &k, a, 3, false, G32, false, t.g32, t.g32l), 0);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.corrupt, 1);
    assert_int_equal(st.quarantined, 1);
    assert_int_equal(st.blocks, 2);
    s_vstats(fx->e, 3, t.g32l + t2.i8l + t2.g32l);
    assert_int_equal(s_variant_rc(fx->e, &k, I8), KVEDGE_ENOTFOUND);

    /* get_variant: ECORRUPT, then ENOTFOUND. */
    assert_int_equal(s_variant_rc(fx->e, &k2, I8), KVEDGE_ECORRUPT);
    assert_int_equal(s_variant_rc(fx->e, &k2, I8), KVEDGE_ENOTFOUND);
    st = s_stats(fx->e);
    assert_int_equal(st.corrupt, 2);
    assert_int_equal(st.quarantined, 2);
    s_vstats(fx->e, 2, t.g32l + t2.g32l);
    s_expect_variant(fx->e, &k2, G32, t2.g32, t2.g32l);

    /* A damaged variant is derived around: from the primary. */
    s_damage_variant(fx, &k2, G32, t2.g32, t2.g32l, m2.checksum);
    kvedge_prec_t a2[] = {G32};
    assert_int_equal(s_prec(fx->e, &k2, a2, 1, true, G32, true, t2.g32, t2.g32l), 0);
    s_vstats(fx->e, 1, t.g32l);

    /* verify with quarantine moves a bad one aside; the quarantine survives a reopen. */
    s_damage_variant(fx, &k, G32, t.g32, t.g32l, m.checksum);
    memset(&vc, 0, sizeof vc);
    assert_int_equal(kvedge_engine_verify(fx->e, true, s_verify_cb, &vc, &checked, &bad), 0);
    assert_int_equal(bad, 1);
    assert_int_equal(vc.calls, 1);
    assert_memory_equal(&vc.key, &k, sizeof k);
    s_vstats(fx->e, 0, 0);
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, 2);
    assert_int_equal(bad, 0);
    kvedge_engine_destroy(&fx->e);
    s_open(fx, NULL);
    st = s_stats(fx->e);
    assert_int_equal(st.quarantined, 4);
    assert_int_equal(st.blocks, 2);
    s_vstats(fx->e, 0, 0);
    s_trio_free(&t);
    s_trio_free(&t2);
}

static void test_stale_variant(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(7, TOKENS);
    kvedge_block_key_t k = s_key(&c, 0, 0);
    trio_t t;
    s_trio(fx, &c, 0, 0, 71, &t);
    /* A record bound to another primary (left by a kvedge that knew no variants): never
     * served, listed or counted as bad; verify with quarantine drops it. */
    kvedge_engine_destroy(&fx->e);
    uint8_t vk[37];
    size_t g64l;
    uint8_t *g64 = s_at(t.p, t.pl, G64, &g64l);
    uint8_t *rec = malloc(8 + g64l);
    memset(rec, 0xAB, 8);
    memcpy(rec + 8, g64, g64l);
    s_vkey(&k, G64, vk);
    s_raw(fx, "variants", vk, sizeof vk, rec, 8 + g64l);
    s_open(fx, NULL);
    assert_int_equal(s_variant_rc(fx->e, &k, G64), KVEDGE_ENOTFOUND);
    kvedge_prec_t held[8];
    size_t n;
    assert_int_equal(kvedge_engine_variants(fx->e, &k, held, 8, &n), 0);
    assert_int_equal(n, 2);
    /* The read dropped it. */
    s_vstats(fx->e, 2, t.i8l + t.g32l);
    assert_int_equal(s_stats(fx->e).quarantined, 0);

    kvedge_engine_destroy(&fx->e);
    s_raw(fx, "variants", vk, sizeof vk, rec, 8 + g64l);
    s_open(fx, NULL);
    s_vstats(fx->e, 3, t.i8l + t.g32l + g64l);
    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, 3);
    assert_int_equal(bad, 0);
    assert_int_equal(kvedge_engine_verify(fx->e, true, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(bad, 0);
    s_vstats(fx->e, 2, t.i8l + t.g32l);
    free(rec);
    free(g64);
    s_trio_free(&t);
}

static void test_lifecycle(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(8, TOKENS), d = s_chunk(9, TOKENS);
    trio_t t[4];

    /* delete_chunk */
    s_trio(fx, &c, 0, 0, 81, &t[0]);
    s_trio(fx, &c, 1, 3, 82, &t[1]);
    s_trio(fx, &d, 0, 0, 83, &t[2]);
    s_vstats(fx->e, 6, t[0].i8l + t[0].g32l + t[1].i8l + t[1].g32l + t[2].i8l + t[2].g32l);
    uint64_t n;
    assert_int_equal(kvedge_engine_delete_chunk(fx->e, &c.id, false, &n), 0);
    assert_int_equal(n, 2);
    s_vstats(fx->e, 2, t[2].i8l + t[2].g32l);
    kvedge_block_key_t kc = s_key(&c, 0, 0), kd = s_key(&d, 0, 0);
    assert_int_equal(s_variant_rc(fx->e, &kc, I8), KVEDGE_ENOTFOUND);
    s_expect_variant(fx->e, &kd, I8, t[2].i8, t[2].i8l);

    /* re-put of the primary */
    assert_int_equal(kvedge_engine_put(fx->e, &d, 0, 0, t[2].p, t[2].pl, NULL), 0);
    s_vstats(fx->e, 0, 0);
    assert_int_equal(s_variant_rc(fx->e, &kd, I8), KVEDGE_ENOTFOUND);
    size_t held;
    assert_int_equal(kvedge_engine_variants(fx->e, &kd, NULL, 0, &held), 0);
    assert_int_equal(held, 0);

    /* evict: the bytes of variants count as freed */
    assert_int_equal(kvedge_engine_put_variant(fx->e, &kd, I8, t[2].i8, t[2].i8l), 0);
    uint64_t blocks, bytes;
    assert_int_equal(kvedge_engine_evict(fx->e, 0, &blocks, &bytes), 0);
    assert_int_equal(blocks, 1);
    assert_int_equal(bytes, t[2].pl + t[2].i8l);
    s_vstats(fx->e, 0, 0);
    assert_int_equal(s_stats(fx->e).bytes, 0);

    /* expire */
    kvedge_put_opts_t po = {.ttl_s = 10};
    kvedge_block_key_t ke = s_key(&c, 1, 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 0, t[0].p, t[0].pl, &po), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &ke, I8, t[0].i8, t[0].i8l), 0);
    s_vstats(fx->e, 1, t[0].i8l);
    fx->now += 11000;
    assert_int_equal(kvedge_engine_expire(fx->e, &n), 0);
    assert_int_equal(n, 1);
    s_vstats(fx->e, 0, 0);
    /* ... or a read of an expired primary's variant */
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 0, t[0].p, t[0].pl, &po), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &ke, I8, t[0].i8, t[0].i8l), 0);
    fx->now += 11000;
    assert_int_equal(s_variant_rc(fx->e, &ke, I8), KVEDGE_ENOTFOUND);
    s_vstats(fx->e, 0, 0);
    assert_int_equal(s_stats(fx->e).blocks, 0);

    /* quarantine of the primary */
    s_trio(fx, &c, 0, 1, 84, &t[3]);
    kvedge_block_key_t kq = s_key(&c, 0, 1);
    uint8_t *bad = malloc(t[3].pl);
    memcpy(bad, t[3].p, t[3].pl);
    bad[t[3].pl / 2] ^= 0x01;
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &kq, bad, t[3].pl), 0);
    kvedge_prec_t a[] = {LL, I8};
    assert_int_equal(s_prec(fx->e, &kq, a, 2, true, 0, false, NULL, 0), KVEDGE_ECORRUPT);
    s_vstats(fx->e, 0, 0);
    assert_int_equal(s_variant_rc(fx->e, &kq, I8), KVEDGE_ENOTFOUND);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(st.quarantined, 1);
    free(bad);
    for (int i = 0; i < 4; i++)
        s_trio_free(&t[i]);
}

static void test_capacity(void **state)
{
    fx_t *fx = *state;
    size_t pl, i8l;
    uint8_t *p = s_block(91, TOKENS, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, &pl);
    uint8_t *i8 = s_at(p, pl, I8, &i8l);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.capacity_bytes = 2 * pl + i8l / 2; /* two primaries, not a variant besides */
    s_open(fx, &o);
    kvedge_chunk_info_t c = s_chunk(10, TOKENS);
    kvedge_block_key_t ka = s_key(&c, 0, 0), kb = s_key(&c, 0, 1);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, p, pl, NULL), 0);
    fx->now += 2000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, p, pl, NULL), 0);
    fx->now += 2000;
    /* The variant of b evicts a (least recently used), never b itself. */
    assert_int_equal(kvedge_engine_put_variant(fx->e, &kb, I8, i8, i8l), 0);
    kvedge_block_meta_t m;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &ka, &m), KVEDGE_ENOTFOUND);
    s_expect_variant(fx->e, &kb, I8, i8, i8l);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 1);
    assert_int_equal(st.bytes, pl);
    assert_int_equal(st.evicted_blocks, 1);
    s_vstats(fx->e, 1, i8l);

    /* A primary put evicts b, taking its variant along. */
    fx->now += 2000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 2, p, pl, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, p, pl, NULL), 0);
    s_vstats(fx->e, 0, 0);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &kb, &m), KVEDGE_ENOTFOUND);
    st = s_stats(fx->e);
    assert_int_equal(st.blocks, 2);
    assert_int_equal(st.bytes, 2 * pl);
    assert_int_equal(st.evicted_bytes, 2 * pl + i8l);

    /* Pinned primaries: no room for a variant. */
    assert_int_equal(kvedge_engine_pin_chunk(fx->e, &c.id, true, NULL), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &ka, I8, i8, i8l), KVEDGE_EFULL);
    s_vstats(fx->e, 0, 0);
    free(p);
    free(i8);
}

static void test_reopen_totals(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(11, TOKENS);
    trio_t t[2];
    s_trio(fx, &c, 0, 0, 101, &t[0]);
    s_trio(fx, &c, 1, 1, 102, &t[1]);
    uint64_t want = t[0].i8l + t[0].g32l + t[1].i8l + t[1].g32l;
    s_vstats(fx->e, 4, want);
    kvedge_engine_destroy(&fx->e);
    s_open(fx, NULL);
    s_vstats(fx->e, 4, want);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 2);
    assert_int_equal(st.bytes, t[0].pl + t[1].pl);
    kvedge_block_key_t k = s_key(&c, 1, 1);
    s_expect_variant(fx->e, &k, G32, t[1].g32, t[1].g32l);

    /* Capacity after a reopen counts the variants: evicting to the primaries' bytes frees
     * the least recently used block with its variants. */
    uint64_t blocks, bytes;
    assert_int_equal(kvedge_engine_evict(fx->e, t[0].pl + t[1].pl, &blocks, &bytes), 0);
    assert_int_equal(blocks, 1);
    s_trio_free(&t[0]);
    s_trio_free(&t[1]);
}

static void test_read_only_without_family(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(12, TOKENS);
    size_t pl;
    uint8_t *p = s_block(111, TOKENS, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, &pl);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, p, pl, NULL), 0);
    kvedge_engine_destroy(&fx->e);
    s_raw(fx, "variants", NULL, 0, NULL, 0); /* a store from before variants */

    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.read_only = true;
    s_open(fx, &o);
    kvedge_block_key_t k = s_key(&c, 0, 0);
    assert_int_equal(s_variant_rc(fx->e, &k, I8), KVEDGE_ENOTFOUND);
    size_t n = 9;
    assert_int_equal(kvedge_engine_variants(fx->e, &k, NULL, 0, &n), 0);
    assert_int_equal(n, 0);
    kvedge_prec_t a[] = {I8, LL};
    assert_int_equal(s_prec(fx->e, &k, a, 2, false, LL, false, p, pl), 0);
    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, 1);
    s_vstats(fx->e, 0, 0);
    kvedge_engine_destroy(&fx->e);

    /* A writable open creates it. */
    s_open(fx, NULL);
    size_t i8l;
    uint8_t *i8 = s_at(p, pl, I8, &i8l);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, I8, i8, i8l), 0);
    s_expect_variant(fx->e, &k, I8, i8, i8l);
    free(i8);
    free(p);
}

static void test_repair_keeps_variants(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(13, TOKENS);
    trio_t t;
    s_trio(fx, &c, 1, 0, 121, &t);
    kvedge_block_key_t k = s_key(&c, 1, 0);
    kvedge_block_meta_t m;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), 0);
    s_damage_variant(fx, &k, G32, t.g32, t.g32l, m.checksum);
    kvedge_engine_destroy(&fx->e);
    kvedge_repair_report_t rep;
    char why[256];
    int rc = kvedge_engine_repair(fx->path, NULL, NULL, &rep, why, sizeof why);
    if (rc != 0)
        fail_msg("repair: %s: %s", kvedge_errname(rc), why);
    assert_int_equal(rep.blocks_kept, 1);
    assert_int_equal(rep.variants_dropped, 1);
    s_open(fx, NULL);
    s_expect_variant(fx->e, &k, I8, t.i8, t.i8l);
    assert_int_equal(s_variant_rc(fx->e, &k, G32), KVEDGE_ENOTFOUND); /* dropped */
    s_vstats(fx->e, 1, t.i8l);
    s_trio_free(&t);
}

/* Writers and readers of the same few blocks under a capacity that keeps evicting: what is
 * served is right, and the totals kept while running are the ones a reopen computes. */
#define RACE_THREADS 4
#define RACE_OPS     300

typedef struct {
    kvedge_engine_t *e;
    const kvedge_chunk_info_t *c;
    const trio_t *t;
    unsigned seed;
    int failures;
    int fail_op, fail_rc; /* the last failure, for the report */
} race_t;

static void *s_race(void *arg)
{
    race_t *r = arg;
    kvedge_prec_t accept[] = {G32, I8, LL};
    for (int i = 0; i < RACE_OPS; i++) {
        unsigned x = (unsigned)rand_r(&r->seed);
        uint16_t head = (uint16_t)(x % HEADS), layer = (uint16_t)((x >> 4) % LAYERS);
        kvedge_block_key_t k = s_key(r->c, layer, head);
        int rc = 0;
        kvedge_value_t v;
        int op = (int)((x >> 8) % 6);
        switch (op) {
        case 0:
            rc = kvedge_engine_put(r->e, r->c, layer, head, r->t->p, r->t->pl, NULL);
            break;
        case 1:
            rc = kvedge_engine_put_variant(r->e, &k, I8, r->t->i8, r->t->i8l);
            rc = rc == KVEDGE_ENOTFOUND ? 0 : rc;
            break;
        case 2:
            rc = kvedge_engine_put_variant(r->e, &k, G32, r->t->g32, r->t->g32l);
            rc = rc == KVEDGE_ENOTFOUND ? 0 : rc;
            break;
        case 3:
            rc = kvedge_engine_drop_variant(r->e, &k, (x >> 16) & 1 ? I8 : G32);
            rc = rc == KVEDGE_ENOTFOUND ? 0 : rc;
            break;
        case 4: {
            kvedge_prec_t served;
            rc = kvedge_engine_get_prec(r->e, &k, accept, 3, true, &v, &served, NULL);
            if (rc == 0) {
                const uint8_t *want = served == LL ? r->t->p : served == I8 ? r->t->i8 : r->t->g32;
                size_t want_len = served == LL ? r->t->pl : served == I8 ? r->t->i8l : r->t->g32l;
                if (v.len != want_len || memcmp(v.data, want, want_len) != 0)
                    rc = 1000 + served;
            }
            kvedge_value_release(&v);
            rc = rc == KVEDGE_ENOTFOUND ? 0 : rc;
            break;
        }
        default:
            rc = kvedge_engine_get_variant(r->e, &k, I8, &v);
            if (rc == 0 && (v.len != r->t->i8l || memcmp(v.data, r->t->i8, v.len) != 0))
                rc = 2000;
            kvedge_value_release(&v);
            rc = rc == KVEDGE_ENOTFOUND ? 0 : rc;
            break;
        }
        if (rc != 0) {
            r->failures++;
            r->fail_op = op;
            r->fail_rc = rc;
        }
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    fx_t *fx = *state;
    trio_t t;
    t.p = s_block(131, TOKENS, KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, &t.pl);
    t.i8 = s_at(t.p, t.pl, I8, &t.i8l);
    t.g32 = s_at(t.p, t.pl, G32, &t.g32l);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.clock_ms = NULL; /* the wall clock: threads read it */
    /* Room for what the other threads may hold reserved and not yet written (a primary each)
     * and for a block with its variants, never for every block: puts keep evicting. */
    o.capacity_bytes = 4 * t.pl + 2 * (t.pl + t.i8l + t.g32l);
    s_open(fx, &o);
    kvedge_chunk_info_t c = s_chunk(14, TOKENS);
    race_t r[RACE_THREADS];
    pthread_t th[RACE_THREADS];
    for (int i = 0; i < RACE_THREADS; i++) {
        r[i] = (race_t){fx->e, &c, &t, (unsigned)(i * 7919 + 1), 0, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, s_race, &r[i]), 0);
    }
    for (int i = 0; i < RACE_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        if (r[i].failures)
            fail_msg("%d failures, the last op %d: %d", r[i].failures, r[i].fail_op, r[i].fail_rc);
    }
    kvedge_engine_stats_t st = s_stats(fx->e);
    uint64_t vb, vbytes;
    assert_int_equal(kvedge_engine_variant_stats(fx->e, &vb, &vbytes), 0);
    assert_true(st.bytes + vbytes <= o.capacity_bytes);
    assert_true(st.evicted_blocks > 0);
    kvedge_engine_destroy(&fx->e);
    s_open(fx, &o);
    kvedge_engine_stats_t st2 = s_stats(fx->e);
    assert_int_equal(st2.blocks, st.blocks);
    assert_int_equal(st2.bytes, st.bytes);
    s_vstats(fx->e, vb, vbytes);
    s_trio_free(&t);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_round_trip_and_listing),
        T(test_get_prec_order),
        T(test_lossless_never_quantized),
        T(test_derive),
        T(test_coded_rungs),
        T(test_put_variant_errors),
        T(test_corrupt_variant),
        T(test_stale_variant),
        T(test_lifecycle),
        T(test_capacity),
        T(test_reopen_totals),
        T(test_read_only_without_family),
        T(test_repair_keeps_variants),
        T(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
