/* Demotion: a block re-encoded in place at a coarser rung (bytes, meta, totals, pin, TTL,
 * variants kept or dropped, reopen, readers' accept lists, version-1 meta records for blocks
 * not demoted), its errors, the chunk and idle passes, prepared variants, and the
 * capacity-pressure order (variants, then demotion, then eviction of blocks not demoted,
 * demoted ones last), with concurrent readers. */
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
#include "access/codec/error.h"
#include "access/codec/prec.h"
#include "tests/common/engine_fx.h"
#include "tests/common/testutil.h"

#define MODEL    "test-model"
#define LAYERS   4
#define HEADS    4
#define HEAD_DIM 64
#define TOKENS   32

static const kvedge_prec_t LL = KVEDGE_PREC_LOSSLESS;
static const kvedge_prec_t I8 = KVEDGE_PREC_INT8;
static const kvedge_prec_t G32 = KVEDGE_PREC_INT4_G32;
static const kvedge_prec_t G64 = KVEDGE_PREC_INT4_G64;
static const kvedge_prec_t G128 = KVEDGE_PREC_INT4_G128;
#define G32T50 KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50)

static int setup(void **state)
{
    return kt_fx_setup(state, "demote", 1000000);
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

static uint8_t *s_block(uint64_t seed, kvedge_scheme_t scheme, uint16_t group, size_t *len)
{
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, scheme, TOKENS, HEAD_DIM, group, NULL, false};
    uint8_t *b = kt_encode(&spec, seed, len);
    assert_non_null(b);
    return b;
}

static uint8_t *s_at(const uint8_t *blk, size_t len, kvedge_prec_t to, size_t *out_len)
{
    kvedge_block_info_t info;
    assert_int_equal(kvedge_block_check(blk, len, &info), 0);
    uint8_t *out = NULL;
    assert_int_equal(kvedge_block_transcode(&info, to, true, &out, out_len), 0);
    return out;
}

static kvedge_chunk_info_t s_chunk(uint8_t tag)
{
    kvedge_chunk_info_t c;
    memset(&c, 0, sizeof c);
    for (size_t i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++)
        c.id.bytes[i] = (uint8_t)(tag + 31 * i);
    strcpy(c.model_id, MODEL);
    c.tokens = TOKENS;
    return c;
}

static kvedge_block_key_t s_key(const kvedge_chunk_info_t *c, uint16_t layer, uint16_t head)
{
    kvedge_block_key_t k = {.chunk = c->id, .layer = layer, .head = head};
    return k;
}

static kvedge_engine_stats_t s_stats(kvedge_engine_t *e)
{
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_engine_stats(e, &st), 0);
    return st;
}

static uint64_t s_vbytes(kvedge_engine_t *e, uint64_t *blocks)
{
    uint64_t n, b;
    assert_int_equal(kvedge_engine_variant_stats(e, &n, &b), 0);
    if (blocks)
        *blocks = n;
    return b;
}

static kvedge_block_meta_t s_meta(kvedge_engine_t *e, const kvedge_block_key_t *k)
{
    kvedge_block_meta_t m;
    assert_int_equal(kvedge_engine_get_meta(e, k, &m), 0);
    return m;
}

static void s_expect_block(kvedge_engine_t *e, const kvedge_block_key_t *k, const uint8_t *want,
                           size_t len)
{
    kvedge_value_t v;
    assert_int_equal(kvedge_engine_get(e, k, &v), 0);
    assert_int_equal(v.len, len);
    assert_memory_equal(v.data, want, len);
    kvedge_value_release(&v);
}

/* The totals recomputed from a scan of every meta record: they must equal the engine's. */
typedef struct {
    uint64_t blocks, bytes, pinned_bytes, demoted;
} sum_t;

static int s_sum_cb(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *m)
{
    (void)key;
    sum_t *s = ctx;
    s->blocks++;
    s->bytes += m->bytes;
    if (m->pinned)
        s->pinned_bytes += m->bytes;
    if (m->demoted)
        s->demoted++;
    return 0;
}

static sum_t s_check_totals(kvedge_engine_t *e)
{
    sum_t s = {0};
    assert_int_equal(kvedge_engine_scan(e, NULL, s_sum_cb, &s), 0);
    kvedge_engine_stats_t st = s_stats(e);
    assert_int_equal(st.blocks, s.blocks);
    assert_int_equal(st.bytes, s.bytes);
    assert_int_equal(st.pinned_bytes, s.pinned_bytes);
    return s;
}

/* ---------------------------------------------------------------- one block */

static void test_round_trip(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(1);
    kvedge_block_key_t k = s_key(&c, 0, 0);
    size_t pl, gl;
    uint8_t *p = s_block(11, KVEDGE_SCHEME_INT8, 0, &pl);
    uint8_t *g = s_at(p, pl, G32, &gl);
    kvedge_put_opts_t po = {.ttl_s = 3600};
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, p, pl, &po), 0);
    fx->now += 5000;
    kvedge_block_meta_t before = s_meta(fx->e, &k);
    assert_false(before.demoted);
    assert_int_equal(before.demoted_from, KVEDGE_PREC_STORED);

    int64_t saved = 0;
    assert_int_equal(kvedge_engine_demote(fx->e, &k, G32, &saved), 0);
    assert_true(gl < pl);
    assert_int_equal(saved, (int64_t)pl - (int64_t)gl);
    kvedge_block_meta_t m = s_meta(fx->e, &k);
    assert_true(m.demoted);
    assert_int_equal(m.demoted_from, I8);
    assert_int_equal(m.bytes, gl);
    assert_int_equal(m.scheme, KVEDGE_SCHEME_INT4);
    assert_int_equal(m.group_size, 32);
    assert_int_equal(m.atime_ms, before.atime_ms); /* access time, TTL, creation stay */
    assert_int_equal(m.expires_ms, before.expires_ms);
    assert_int_equal(m.created_ms, before.created_ms);
    assert_false(m.pinned);
    s_expect_block(fx->e, &k, g, gl); /* exactly kvedge_block_transcode of the old primary */
    assert_int_equal(s_stats(fx->e).bytes, gl);
    s_check_totals(fx->e);
    kvedge_engine_demote_stats_t ds;
    assert_int_equal(kvedge_engine_demote_stats(fx->e, &ds), 0);
    assert_int_equal(ds.demoted, 1);
    assert_int_equal(ds.saved_bytes, pl - gl);
    assert_int_equal(ds.pressure_demoted, 0);

    /* Further down: still demoted, still from int8. */
    size_t hl;
    uint8_t *h = s_at(g, gl, G128, &hl);
    assert_int_equal(kvedge_engine_demote(fx->e, &k, G128, NULL), 0);
    s_expect_block(fx->e, &k, h, hl);
    m = s_meta(fx->e, &k);
    assert_true(m.demoted);
    assert_int_equal(m.demoted_from, I8);

    /* A new put of the block is fresh data: no longer demoted. */
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, p, pl, NULL), 0);
    m = s_meta(fx->e, &k);
    assert_false(m.demoted);
    assert_int_equal(m.demoted_from, KVEDGE_PREC_STORED);
    s_check_totals(fx->e);
    free(p);
    free(g);
    free(h);
}

static void test_errors(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(2);
    kvedge_block_key_t k = s_key(&c, 0, 0), missing = s_key(&c, 1, 0);
    size_t pl;
    uint8_t *p = s_block(12, KVEDGE_SCHEME_INT8, 0, &pl);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, p, pl, NULL), 0);
    assert_int_equal(kvedge_engine_demote(NULL, &k, G32, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_demote(fx->e, NULL, G32, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_demote(fx->e, &k, 0, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_demote(fx->e, &k, 0x80 | G32, NULL), KVEDGE_EINVAL);
    /* Not derivable from int8: lossless; not coarser: int8 itself. */
    assert_int_equal(kvedge_engine_demote(fx->e, &k, LL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_demote(fx->e, &k, I8, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_demote(fx->e, &missing, G32, NULL), KVEDGE_ENOTFOUND);
    s_expect_block(fx->e, &k, p, pl); /* untouched */
    assert_false(s_meta(fx->e, &k).demoted);
    /* A think-50 block does not give a rung without ThinK. */
    assert_int_equal(kvedge_engine_demote(fx->e, &k, G32T50, NULL), 0);
    assert_int_equal(kvedge_engine_demote(fx->e, &k, G64, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_prepare_variant(fx->e, &k, G32T50, NULL), KVEDGE_EINVAL);
    /* Expired: dropped, as a get would. */
    kvedge_put_opts_t po = {.ttl_s = 1};
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 0, p, pl, &po), 0);
    fx->now += 2000;
    assert_int_equal(kvedge_engine_demote(fx->e, &missing, G32, NULL), KVEDGE_ENOTFOUND);
    assert_int_equal(s_stats(fx->e).blocks, 1);
    s_check_totals(fx->e);
    kvedge_engine_destroy(&fx->e);
    /* Read-only. */
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.read_only = true;
    char why[256];
    assert_int_equal(kvedge_engine_open(fx->path, &o, &fx->e, why, sizeof why), 0);
    assert_int_equal(kvedge_engine_demote(fx->e, &k, G128, NULL), KVEDGE_EREADONLY);
    free(p);
}

static void test_pinned_stays_pinned(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(3);
    kvedge_block_key_t k = s_key(&c, 0, 1);
    size_t pl, gl;
    uint8_t *p = s_block(13, KVEDGE_SCHEME_LOSSLESS, 0, &pl);
    uint8_t *g = s_at(p, pl, G32, &gl);
    kvedge_put_opts_t po = {.pin = true};
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, p, pl, &po), 0);
    assert_int_equal(kvedge_engine_demote(fx->e, &k, G32, NULL), 0);
    kvedge_block_meta_t m = s_meta(fx->e, &k);
    assert_true(m.pinned);
    assert_true(m.demoted);
    assert_int_equal(m.demoted_from, LL);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.pinned_blocks, 1);
    assert_int_equal(st.pinned_bytes, gl);
    /* Still never evicted. */
    assert_int_equal(kvedge_engine_evict(fx->e, 0, NULL, NULL), KVEDGE_EFULL);
    s_expect_block(fx->e, &k, g, gl);
    /* Unpinned, it is an ordinary (demoted) block again. */
    assert_int_equal(kvedge_engine_pin(fx->e, &k, false), 0);
    assert_int_equal(s_stats(fx->e).pinned_bytes, 0);
    assert_true(s_meta(fx->e, &k).demoted);
    s_check_totals(fx->e);
    free(p);
    free(g);
}

/* Variants coarser than the new rung stay (their bytes, bound to the new primary); finer
 * ones and the new rung's own go; the totals follow; a reader accepting only lossless never
 * gets the int4 block. Everything holds after a reopen. */
static void test_variants_reopen_and_readers(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(4);
    kvedge_block_key_t k = s_key(&c, 2, 3);
    size_t pl, i8l, g32l, g64l, tl;
    uint8_t *p = s_block(14, KVEDGE_SCHEME_LOSSLESS, 0, &pl);
    uint8_t *i8 = s_at(p, pl, I8, &i8l);
    uint8_t *g32 = s_at(p, pl, G32, &g32l);
    uint8_t *g64 = s_at(p, pl, G64, &g64l);
    uint8_t *t = s_at(p, pl, G32T50, &tl);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 2, 3, p, pl, NULL), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, I8, i8, i8l), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, G32, g32, g32l), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, G64, g64, g64l), 0);
    assert_int_equal(kvedge_engine_put_variant(fx->e, &k, G32T50, t, tl), 0);
    assert_int_equal(s_vbytes(fx->e, NULL), i8l + g32l + g64l + tl);

    int64_t saved = 0;
    assert_int_equal(kvedge_engine_demote(fx->e, &k, G32, &saved), 0);
    assert_int_equal(saved, (int64_t)(pl - g32l) + (int64_t)(i8l + g32l));
    kvedge_prec_t held[8];
    size_t n = 0;
    assert_int_equal(kvedge_engine_variants(fx->e, &k, held, 8, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(held[0], G64);
    assert_int_equal(held[1], G32T50);
    uint64_t vn;
    assert_int_equal(s_vbytes(fx->e, &vn), g64l + tl);
    assert_int_equal(vn, 2);
    s_expect_block(fx->e, &k, g32, g32l);

    for (int pass = 0; pass < 2; pass++) {
        /* The kept variants are the ones made from the lossless data. */
        kvedge_value_t v;
        assert_int_equal(kvedge_engine_get_variant(fx->e, &k, G64, &v), 0);
        assert_int_equal(v.len, g64l);
        assert_memory_equal(v.data, g64, g64l);
        kvedge_value_release(&v);
        assert_int_equal(kvedge_engine_get_variant(fx->e, &k, I8, &v), KVEDGE_ENOTFOUND);
        /* Readers. */
        kvedge_prec_t served;
        bool derived;
        kvedge_prec_t only_ll[] = {LL}, ll_i8[] = {LL, I8}, want_g32[] = {I8, G32};
        assert_int_equal(kvedge_engine_get_prec(fx->e, &k, only_ll, 1, true, &v, &served, &derived),
                         KVEDGE_ENOTFOUND);
        assert_null(v.data);
        assert_int_equal(kvedge_engine_get_prec(fx->e, &k, ll_i8, 2, true, &v, &served, &derived),
                         KVEDGE_ENOTFOUND);
        assert_int_equal(
            kvedge_engine_get_prec(fx->e, &k, want_g32, 2, true, &v, &served, &derived), 0);
        assert_int_equal(served, G32);
        assert_false(derived);
        assert_int_equal(v.len, g32l);
        kvedge_value_release(&v);
        kvedge_block_meta_t m = s_meta(fx->e, &k);
        assert_true(m.demoted);
        assert_int_equal(m.demoted_from, LL);
        uint64_t verified = 0, bad = 0;
        assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &verified, &bad), 0);
        assert_int_equal(bad, 0);
        assert_int_equal(verified, 3);
        s_check_totals(fx->e);
        assert_int_equal(s_vbytes(fx->e, NULL), g64l + tl);
        /* Reopen: the totals come from the records. */
        kvedge_engine_destroy(&fx->e);
        s_open(fx, NULL);
    }
    free(p);
    free(i8);
    free(g32);
    free(g64);
    free(t);
}

/* The first byte (the version) of the meta record of key, read with RocksDB directly. */
static int s_meta_version(fx_t *fx, const kvedge_block_key_t *key)
{
    rocksdb_options_t *opt = rocksdb_options_create();
    char *err = NULL;
    size_t n = 0;
    char **names = rocksdb_list_column_families(opt, fx->path, &n, &err);
    assert_null(err);
    const rocksdb_options_t **cfo = calloc(n, sizeof *cfo);
    rocksdb_column_family_handle_t **h = calloc(n, sizeof *h);
    for (size_t i = 0; i < n; i++)
        cfo[i] = opt;
    rocksdb_t *db = rocksdb_open_for_read_only_column_families(
        opt, fx->path, (int)n, (const char *const *)names, cfo, h, 0, &err);
    assert_null(err);
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    int version = -1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(names[i], "meta") != 0)
            continue;
        size_t len = 0;
        char *v = rocksdb_get_cf(db, ro, h[i], (const char *)kb, sizeof kb, &len, &err);
        assert_null(err);
        if (v && len)
            version = (uint8_t)v[0];
        rocksdb_free(v);
    }
    rocksdb_readoptions_destroy(ro);
    for (size_t i = 0; i < n; i++)
        rocksdb_column_family_handle_destroy(h[i]);
    rocksdb_close(db);
    rocksdb_list_column_families_destroy(names, n);
    rocksdb_options_destroy(opt);
    free(cfo);
    free(h);
    return version;
}

/* A block not demoted keeps the version-1 meta record every kvedge reads; a demoted one is
 * version 2, and a new put writes version 1 again. */
static void test_meta_versions(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(13);
    kvedge_block_key_t k0 = s_key(&c, 0, 0), k1 = s_key(&c, 0, 1);
    size_t pl;
    uint8_t *p = s_block(18, KVEDGE_SCHEME_INT8, 0, &pl);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, p, pl, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, p, pl, NULL), 0);
    assert_int_equal(kvedge_engine_demote(fx->e, &k1, G64, NULL), 0);
    kvedge_engine_destroy(&fx->e);
    assert_int_equal(s_meta_version(fx, &k0), 1);
    assert_int_equal(s_meta_version(fx, &k1), 2);
    s_open(fx, NULL);
    assert_false(s_meta(fx->e, &k0).demoted);
    assert_true(s_meta(fx->e, &k1).demoted);
    assert_int_equal(s_meta(fx->e, &k1).demoted_from, I8);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, p, pl, NULL), 0);
    kvedge_engine_destroy(&fx->e);
    assert_int_equal(s_meta_version(fx, &k1), 1);
    free(p);
}

/* ---------------------------------------------------------------- passes */

static void test_chunk_and_idle(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t a = s_chunk(5), b = s_chunk(6);
    size_t l8, l4;
    uint8_t *i8 = s_block(15, KVEDGE_SCHEME_INT8, 0, &l8);
    uint8_t *g32 = s_block(16, KVEDGE_SCHEME_INT4, 32, &l4);
    for (uint16_t h = 0; h < HEADS; h++) {
        assert_int_equal(kvedge_engine_put(fx->e, &a, 0, h, i8, l8, NULL), 0);
        assert_int_equal(kvedge_engine_put(fx->e, &b, 0, h, i8, l8, NULL), 0);
    }
    assert_int_equal(kvedge_engine_put(fx->e, &a, 1, 0, g32, l4, NULL), 0); /* already int4 */

    uint64_t n = 0;
    int64_t saved = 0;
    assert_int_equal(kvedge_engine_demote_chunk(fx->e, &a.id, G32, &n, &saved), 0);
    assert_int_equal(n, HEADS); /* the int4 block is skipped */
    assert_true(saved > 0);
    kvedge_chunk_id_t none;
    memset(&none, 0x5a, sizeof none);
    assert_int_equal(kvedge_engine_demote_chunk(fx->e, &none, G32, &n, NULL), KVEDGE_ENOTFOUND);
    s_check_totals(fx->e);

    /* Idle: b's heads put at t0; heads 0 and 1 read 10 s later. */
    fx->now += 10000;
    for (uint16_t h = 0; h < 2; h++) {
        kvedge_block_key_t k = s_key(&b, 0, h);
        kvedge_value_t v;
        assert_int_equal(kvedge_engine_get(fx->e, &k, &v), 0);
        kvedge_value_release(&v);
    }
    fx->now += 1000;
    assert_int_equal(kvedge_engine_demote_idle(fx->e, G32, 5000, 0, &n, &saved), 0);
    assert_int_equal(n, 2); /* b's heads 2 and 3; a's are demoted or int4 already */
    for (uint16_t h = 0; h < HEADS; h++) {
        kvedge_block_key_t k = s_key(&b, 0, h);
        assert_int_equal(s_meta(fx->e, &k).demoted, h >= 2);
    }
    assert_int_equal(kvedge_engine_demote_idle(fx->e, G32, 5000, 0, &n, NULL), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvedge_engine_demote_idle(fx->e, G32, 0, 1, &n, NULL), 0);
    assert_int_equal(n, 1); /* max */
    s_check_totals(fx->e);
    free(i8);
    free(g32);
}

static void test_prepare_variant(void **state)
{
    fx_t *fx = *state;
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    size_t pl, gl;
    uint8_t *p = s_block(17, KVEDGE_SCHEME_INT8, 0, &pl);
    uint8_t *g = s_at(p, pl, G32, &gl);
    o.capacity_bytes = pl * 2 + gl + gl / 2;
    s_open(fx, &o);
    kvedge_chunk_info_t c = s_chunk(7);
    kvedge_block_key_t k0 = s_key(&c, 0, 0), k1 = s_key(&c, 0, 1);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, p, pl, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, p, pl, NULL), 0);
    uint64_t atime = s_meta(fx->e, &k0).atime_ms, gets = s_stats(fx->e).gets;
    fx->now += 60000;
    uint64_t bytes = 0;
    assert_int_equal(kvedge_engine_prepare_variant(fx->e, &k0, G32, &bytes), 0);
    assert_int_equal(bytes, gl);
    assert_int_equal(kvedge_engine_prepare_variant(fx->e, &k0, G32, &bytes), 0);
    assert_int_equal(bytes, 0); /* held */
    kvedge_value_t v;
    assert_int_equal(kvedge_engine_get_variant(fx->e, &k0, G32, &v), 0);
    assert_int_equal(v.len, gl);
    assert_memory_equal(v.data, g, gl);
    kvedge_value_release(&v);
    assert_int_equal(kvedge_engine_prepare_variant(fx->e, &k0, I8, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_prepare_variant(fx->e, &k0, LL, NULL), KVEDGE_EINVAL);
    /* Never evicts: no room for a second one. */
    assert_int_equal(kvedge_engine_prepare_variant(fx->e, &k1, G32, NULL), KVEDGE_EFULL);
    assert_int_equal(s_stats(fx->e).blocks, 2);
    assert_int_equal(s_stats(fx->e).evicted_blocks, 0);
    kvedge_engine_destroy(&fx->e);
    o.capacity_bytes = 0;
    s_open(fx, &o);
    /* The access time and the read statistics did not move (the variant read above moved
     * them: compare the meta before it). */
    (void)gets;
    assert_int_equal(kvedge_engine_prepare_variant(fx->e, &k1, G32, &bytes), 0);
    assert_int_equal(s_meta(fx->e, &k1).atime_ms, atime);
    assert_int_equal(s_stats(fx->e).gets, 0);
    free(p);
    free(g);
}

/* ---------------------------------------------------------------- capacity pressure */

/* Puts head h of layer l of c as an int8 block (seeded by its place); returns its length. */
static size_t s_put8(fx_t *fx, const kvedge_chunk_info_t *c, uint16_t l, uint16_t h)
{
    size_t len;
    uint8_t *b = s_block(100 + l * HEADS + h, KVEDGE_SCHEME_INT8, 0, &len);
    assert_int_equal(kvedge_engine_put(fx->e, c, l, h, b, len, NULL), 0);
    free(b);
    return len;
}

static void test_pressure_order(void **state)
{
    fx_t *fx = *state;
    size_t l8, l4;
    uint8_t *i8 = s_block(100, KVEDGE_SCHEME_INT8, 0, &l8);
    uint8_t *g = s_at(i8, l8, G32, &l4);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.capacity_bytes = 8 * l8 - 1; /* not quite eight int8 blocks */
    o.pressure_demote = G32;
    s_open(fx, &o);
    kvedge_chunk_info_t c = s_chunk(8);
    /* Eight int8 blocks, one a millisecond, oldest first; head 0 of layer 0 gets a variant
     * while there is room. */
    for (uint16_t i = 0; i < 7; i++) {
        s_put8(fx, &c, (uint16_t)(i / HEADS), (uint16_t)(i % HEADS));
        fx->now += 1;
    }
    kvedge_block_key_t k0 = s_key(&c, 0, 0);
    assert_int_equal(kvedge_engine_prepare_variant(fx->e, &k0, G32, NULL), 0);
    uint64_t vb = s_vbytes(fx->e, NULL);
    assert_true(vb > 0 && vb < l8);
    /* The eighth needs the variant's room and a byte: (1) the variant goes, then (2) the
     * oldest block is demoted; nothing is evicted. */
    s_put8(fx, &c, 1, 3);
    fx->now += 1;
    kvedge_engine_demote_stats_t ds;
    assert_int_equal(kvedge_engine_demote_stats(fx->e, &ds), 0);
    assert_int_equal(ds.pressure_variant_blocks, 1);
    assert_int_equal(ds.pressure_variant_bytes, vb);
    assert_int_equal(s_vbytes(fx->e, NULL), 0);
    assert_int_equal(s_stats(fx->e).evicted_blocks, 0);
    assert_int_equal(ds.pressure_demoted, 1);
    assert_true(s_meta(fx->e, &k0).demoted);
    s_expect_block(fx->e, &k0, g, l4);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_true(st.bytes + s_vbytes(fx->e, NULL) <= o.capacity_bytes);
    /* (2) more puts demote, oldest first, and evict nothing while demotion frees enough:
     * 8 int8 blocks of room hold 8 / (l4 / l8) int4 ones. */
    uint64_t fit = (uint64_t)(8 * l8 / l4) - 1;
    uint16_t put = 8;
    for (; put < fit && put < LAYERS * HEADS; put++) {
        fx->now += 1;
        s_put8(fx, &c, (uint16_t)(put / HEADS), (uint16_t)(put % HEADS));
    }
    st = s_stats(fx->e);
    assert_int_equal(st.evicted_blocks, 0);
    assert_int_equal(st.blocks, put);
    assert_true(st.bytes <= o.capacity_bytes);
    sum_t sum = s_check_totals(fx->e);
    assert_true(sum.demoted >= (uint64_t)put - 2); /* all but the newest */
    assert_int_equal(kvedge_engine_demote_stats(fx->e, &ds), 0);
    assert_int_equal(ds.pressure_demoted, sum.demoted);

    /* (3) before (4): a block that cannot be demoted (put at int4-g32) goes before the demoted
     * ones, even though it is the most recently used. */
    kvedge_chunk_info_t d = s_chunk(9);
    kvedge_block_key_t kd = s_key(&d, 0, 0);
    fx->now += 1;
    assert_int_equal(kvedge_engine_put(fx->e, &d, 0, 0, g, l4, NULL), 0);
    for (uint16_t h = 1; h < HEADS; h++) {
        fx->now += 1;
        s_put8(fx, &d, 1, h);
    }
    kvedge_block_meta_t m;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &kd, &m), KVEDGE_ENOTFOUND);
    st = s_stats(fx->e);
    assert_true(st.evicted_blocks >= 1);
    assert_true(st.bytes <= o.capacity_bytes);
    s_check_totals(fx->e);
    /* (4) then demoted blocks, least recently used first: layer 0 head 0 went before the
     * newest demoted ones. */
    for (uint16_t i = 0; i < 6; i++) {
        fx->now += 1;
        s_put8(fx, &d, 2 + i / HEADS, i % HEADS);
    }
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k0, &m), KVEDGE_ENOTFOUND);
    kvedge_block_key_t newest = s_key(&d, 3, 1);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &newest, &m), 0);
    st = s_stats(fx->e);
    assert_true(st.bytes + s_vbytes(fx->e, NULL) <= o.capacity_bytes);
    s_check_totals(fx->e);

    /* The same totals after a reopen. */
    kvedge_engine_stats_t before = s_stats(fx->e);
    kvedge_engine_destroy(&fx->e);
    s_open(fx, &o);
    kvedge_engine_stats_t after = s_stats(fx->e);
    assert_int_equal(after.blocks, before.blocks);
    assert_int_equal(after.bytes, before.bytes);
    free(i8);
    free(g);
}

/* Off by default: plain LRU evicts, never demotes. */
static void test_pressure_off_by_default(void **state)
{
    fx_t *fx = *state;
    size_t l8;
    uint8_t *i8 = s_block(100, KVEDGE_SCHEME_INT8, 0, &l8);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    assert_int_equal(o.pressure_demote, KVEDGE_PREC_STORED);
    o.capacity_bytes = 4 * l8;
    s_open(fx, &o);
    kvedge_chunk_info_t c = s_chunk(10);
    for (uint16_t h = 0; h < HEADS; h++) {
        s_put8(fx, &c, 0, h);
        fx->now += 1;
    }
    s_put8(fx, &c, 1, 0);
    kvedge_engine_demote_stats_t ds;
    assert_int_equal(kvedge_engine_demote_stats(fx->e, &ds), 0);
    assert_int_equal(ds.demoted, 0);
    assert_int_equal(s_stats(fx->e).evicted_blocks, 1);
    sum_t sum = s_check_totals(fx->e);
    assert_int_equal(sum.demoted, 0);
    free(i8);
}

/* An explicit evict in the pressure order; an unpin restarts the walks (its block is found). */
static void test_pressure_evict_and_unpin(void **state)
{
    fx_t *fx = *state;
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.pressure_demote = G32;
    s_open(fx, &o);
    kvedge_chunk_info_t c = s_chunk(11);
    size_t l8 = 0;
    for (uint16_t h = 0; h < HEADS; h++) {
        l8 = s_put8(fx, &c, 0, h);
        fx->now += 1;
    }
    kvedge_block_key_t k0 = s_key(&c, 0, 0);
    assert_int_equal(kvedge_engine_pin(fx->e, &k0, true), 0);
    uint64_t blocks = 9, bytes = 0;
    /* One byte to free: one demotion, the oldest unpinned block. */
    assert_int_equal(kvedge_engine_evict(fx->e, s_stats(fx->e).bytes - 1, &blocks, &bytes), 0);
    assert_int_equal(blocks, 0);
    assert_true(bytes > l8 / 4);
    assert_false(s_meta(fx->e, &k0).demoted); /* pinned: never */
    kvedge_block_key_t k1 = s_key(&c, 0, 1), k2 = s_key(&c, 0, 2), k3 = s_key(&c, 0, 3);
    assert_true(s_meta(fx->e, &k1).demoted);
    assert_false(s_meta(fx->e, &k2).demoted);
    assert_int_equal(kvedge_engine_evict(fx->e, s_stats(fx->e).bytes - 1, &blocks, &bytes), 0);
    assert_true(s_meta(fx->e, &k2).demoted);
    /* Unpinning the oldest puts it back before where the walk resumes: the walk restarts and
     * demotes it before k3. */
    assert_int_equal(kvedge_engine_pin(fx->e, &k0, false), 0);
    assert_int_equal(kvedge_engine_evict(fx->e, s_stats(fx->e).bytes - 1, &blocks, &bytes), 0);
    assert_int_equal(blocks, 0);
    assert_true(s_meta(fx->e, &k0).demoted);
    assert_false(s_meta(fx->e, &k3).demoted);
    assert_int_equal(kvedge_engine_evict(fx->e, s_stats(fx->e).bytes - 1, &blocks, &bytes), 0);
    assert_true(s_meta(fx->e, &k3).demoted);
    /* Nothing left to demote: evicts, least recently used (k0) first. */
    assert_int_equal(kvedge_engine_evict(fx->e, s_stats(fx->e).bytes - 1, &blocks, &bytes), 0);
    assert_int_equal(blocks, 1);
    kvedge_block_meta_t m;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k0, &m), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_evict(fx->e, 0, &blocks, &bytes), 0);
    assert_int_equal(s_stats(fx->e).blocks, 0);
    s_check_totals(fx->e);
}

/* Readers under pressure never see a torn or foreign block, and the totals stay exact. */
typedef struct {
    fx_t *fx;
    kvedge_chunk_info_t c;
    _Atomic int stop;
    _Atomic uint64_t served, bad;
} race_t;

static void *s_reader(void *arg)
{
    race_t *r = arg;
    kvedge_prec_t acc[] = {I8, G32};
    while (!r->stop) {
        for (uint16_t l = 0; l < LAYERS; l++)
            for (uint16_t h = 0; h < HEADS; h++) {
                kvedge_block_key_t k = s_key(&r->c, l, h);
                kvedge_value_t v;
                kvedge_prec_t served;
                int rc = kvedge_engine_get_prec(r->fx->e, &k, acc, 2, true, &v, &served, NULL);
                if (rc == 0) {
                    kvedge_block_info_t info;
                    if (kvedge_block_check(v.data, v.len, &info) != 0 ||
                        kvedge_prec_of_block(&info) != served)
                        r->bad++;
                    r->served++;
                } else if (rc != KVEDGE_ENOTFOUND) {
                    r->bad++;
                }
                kvedge_value_release(&v);
            }
    }
    return NULL;
}

static void test_pressure_concurrent(void **state)
{
    fx_t *fx = *state;
    size_t l8;
    uint8_t *i8 = s_block(100, KVEDGE_SCHEME_INT8, 0, &l8);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.capacity_bytes = 6 * l8;
    o.pressure_demote = G32;
    s_open(fx, &o);
    race_t r = {.fx = fx, .c = s_chunk(12)};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, s_reader, &r), 0);
    for (int round = 0; round < 20; round++)
        for (uint16_t l = 0; l < LAYERS; l++)
            for (uint16_t h = 0; h < HEADS; h++) {
                fx->now += 1;
                s_put8(fx, &r.c, l, h);
                if ((l + h + round) % 5 == 0) {
                    kvedge_block_key_t k = s_key(&r.c, l, h);
                    int rc = kvedge_engine_prepare_variant(fx->e, &k, G128, NULL);
                    assert_true(rc == 0 || rc == KVEDGE_EFULL || rc == KVEDGE_ENOTFOUND);
                }
            }
    r.stop = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(r.bad, 0);
    assert_true(r.served > 0);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_true(st.bytes + s_vbytes(fx->e, NULL) <= o.capacity_bytes);
    s_check_totals(fx->e);
    uint64_t vn, vb = s_vbytes(fx->e, &vn);
    kvedge_engine_destroy(&fx->e);
    s_open(fx, &o);
    kvedge_engine_stats_t st2 = s_stats(fx->e);
    assert_int_equal(st2.bytes, st.bytes);
    assert_int_equal(st2.blocks, st.blocks);
    uint64_t vn2, vb2 = s_vbytes(fx->e, &vn2);
    assert_int_equal(vb2, vb);
    assert_int_equal(vn2, vn);
    free(i8);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_round_trip),
        T(test_errors),
        T(test_pinned_stays_pinned),
        T(test_variants_reopen_and_readers),
        T(test_meta_versions),
        T(test_chunk_and_idle),
        T(test_prepare_variant),
        T(test_pressure_order),
        T(test_pressure_off_by_default),
        T(test_pressure_evict_and_unpin),
        T(test_pressure_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
