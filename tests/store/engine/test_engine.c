/* Block engine: round trips, layer scans, persistence, LRU eviction, pinning, TTL, corruption
 * and quarantine, verify, put errors, chunk deletion and lookup, read-only and locked opens,
 * crash durability, concurrent use under a capacity limit, blob records damaged on disk, and
 * the cache tier: sizes, reads after atime refreshes and reopens, rewrites under a warm cache. */
#define _GNU_SOURCE /* nftw */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rocksdb/c.h>
#include <xxhash.h>

#include "store/engine/engine.h"
#include "store/engine/engine_debug.h"
#include "access/codec/block.h"
#include "access/codec/byteorder.h"
#include "access/codec/error.h"
#include "tests/common/engine_fx.h"
#include "tests/common/testutil.h"

#define MODEL    "test-model"
#define LAYERS   4
#define HEADS    4
#define HEAD_DIM 64

static int setup(void **state)
{
    return kt_fx_setup(state, "engine", 1000);
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

static uint8_t *s_block(uint64_t seed, uint32_t tokens, kvedge_scheme_t scheme, size_t *len)
{
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, scheme, tokens, HEAD_DIM, 0, NULL, false};
    uint8_t *b = kt_encode(&spec, seed, len);
    assert_non_null(b);
    return b;
}

static kvedge_chunk_info_t s_chunk(uint8_t tag, const kvedge_chunk_info_t *parent, uint32_t tokens)
{
    kvedge_chunk_info_t c;
    memset(&c, 0, sizeof c);
    for (size_t i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++)
        c.id.bytes[i] = (uint8_t)(tag + 31 * i);
    if (parent) {
        c.parent = parent->id;
        c.has_parent = true;
        c.index = parent->index + 1;
    }
    strcpy(c.model_id, MODEL);
    c.tokens = tokens;
    return c;
}

static kvedge_block_key_t s_key(const kvedge_chunk_info_t *c, uint16_t layer, uint16_t head)
{
    kvedge_block_key_t k = {.chunk = c->id, .layer = layer, .head = head};
    return k;
}

/* Asserts the stored block at key is exactly data. */
static void s_expect(kvedge_engine_t *e, const kvedge_chunk_info_t *c, uint16_t layer,
                     uint16_t head, const uint8_t *data, size_t len)
{
    kvedge_block_key_t k = s_key(c, layer, head);
    kvedge_value_t v;
    assert_int_equal(kvedge_engine_get(e, &k, &v), 0);
    assert_int_equal(v.len, len);
    assert_memory_equal(v.data, data, len);
    kvedge_value_release(&v);
}

static int s_get_rc(kvedge_engine_t *e, const kvedge_chunk_info_t *c, uint16_t layer, uint16_t head)
{
    kvedge_block_key_t k = s_key(c, layer, head);
    kvedge_value_t v;
    int rc = kvedge_engine_get(e, &k, &v);
    kvedge_value_release(&v);
    return rc;
}

static kvedge_engine_stats_t s_stats(kvedge_engine_t *e)
{
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_engine_stats(e, &st), 0);
    return st;
}

/* ---------------------------------------------------------------- tests */

static void test_key_pack_and_degenerate(void **state)
{
    fx_t *fx = *state;
    kvedge_block_key_t k = {.layer = 0x0102, .head = 0xa0b0}, k2;
    memset(k.chunk.bytes, 0x5a, sizeof k.chunk.bytes);
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(&k, kb);
    assert_int_equal(kb[32], 0x01);
    assert_int_equal(kb[33], 0x02);
    assert_int_equal(kb[34], 0xa0);
    assert_int_equal(kb[35], 0xb0);
    kvedge_block_key_unpack(kb, &k2);
    assert_memory_equal(&k, &k2, sizeof k);

    kvedge_engine_opts_t o;
    kvedge_engine_opts_default(&o);
    assert_true(o.create_if_missing);
    assert_int_equal(o.blob_min_bytes, KVEDGE_ENGINE_BLOB_MIN_BYTES_DEFAULT);
    assert_int_equal(o.atime_granularity_ms, KVEDGE_ENGINE_ATIME_GRANULARITY_MS_DEFAULT);
    assert_int_equal(o.capacity_bytes, 0);
    assert_int_equal(o.cache_bytes, KVEDGE_ENGINE_CACHE_BYTES_DEFAULT);
    assert_false(o.read_only);

    kvedge_engine_t *e = NULL;
    assert_int_equal(kvedge_engine_open(NULL, NULL, &e, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_open(fx->path, NULL, NULL, NULL, 0), KVEDGE_EINVAL);
    kvedge_engine_destroy(NULL);
    kvedge_engine_destroy(&e);
    kvedge_value_release(NULL);

    s_open(fx, NULL);
    kvedge_value_t v;
    kvedge_engine_stats_t st;
    assert_int_equal(kvedge_engine_get(NULL, &k, &v), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_get(fx->e, NULL, &v), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_stats(fx->e, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_stats(NULL, &st), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_put(fx->e, NULL, 0, 0, kb, 4, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_get_layer(fx->e, &k.chunk, 0, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, NULL, &k.chunk), KVEDGE_EINVAL);
    /* An empty store: nothing to evict, expire, verify or list. */
    uint64_t n = 9, bad = 9;
    assert_int_equal(kvedge_engine_evict(fx->e, 0, &n, NULL), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvedge_engine_expire(fx->e, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvedge_engine_verify(fx->e, true, NULL, NULL, &n, &bad), 0);
    assert_int_equal(n, 0);
    assert_int_equal(bad, 0);
    st = s_stats(fx->e);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(st.bytes, 0);
}

static void test_put_get_round_trip(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c16 = s_chunk(1, NULL, 16), c256 = s_chunk(2, NULL, 256);
    size_t la, lb;
    uint8_t *a = s_block(11, 16, KVEDGE_SCHEME_LOSSLESS, &la);
    uint8_t *b = s_block(12, 256, KVEDGE_SCHEME_INT8, &lb);
    assert_int_equal(kvedge_engine_put(fx->e, &c16, 1, 2, a, la, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c256, 3, 3, b, lb, NULL), 0);
    s_expect(fx->e, &c16, 1, 2, a, la);
    s_expect(fx->e, &c256, 3, 3, b, lb);

    kvedge_block_meta_t m;
    kvedge_block_key_t k = s_key(&c256, 3, 3);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), 0);
    assert_int_equal(m.bytes, lb);
    assert_int_equal(m.tokens, 256);
    assert_int_equal(m.head_dim, HEAD_DIM);
    assert_int_equal(m.scheme, KVEDGE_SCHEME_INT8);
    assert_int_equal(m.dtype, KVEDGE_DTYPE_FP16);
    assert_false(m.pinned);
    assert_int_equal(m.expires_ms, 0);
    assert_int_equal(m.created_ms, 1000);

    /* Missing keys: another head, another layer, another chunk. */
    assert_int_equal(s_get_rc(fx->e, &c16, 1, 3), KVEDGE_ENOTFOUND);
    assert_int_equal(s_get_rc(fx->e, &c16, 0, 2), KVEDGE_ENOTFOUND);
    kvedge_chunk_info_t other = s_chunk(9, NULL, 16);
    assert_int_equal(s_get_rc(fx->e, &other, 1, 2), KVEDGE_ENOTFOUND);
    k = s_key(&other, 0, 0);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), KVEDGE_ENOTFOUND);

    /* The chunk was registered with the block. */
    kvedge_chunk_info_t ci;
    assert_int_equal(kvedge_engine_get_chunk(fx->e, &c256.id, &ci), 0);
    assert_memory_equal(ci.id.bytes, c256.id.bytes, KVEDGE_CHUNK_ID_BYTES);
    assert_string_equal(ci.model_id, MODEL);
    assert_int_equal(ci.tokens, 256);
    assert_false(ci.has_parent);
    assert_int_equal(ci.created_ms, 1000);
    assert_int_equal(kvedge_engine_get_chunk(fx->e, &other.id, &ci), KVEDGE_ENOTFOUND);

    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 2);
    assert_int_equal(st.bytes, la + lb);
    assert_int_equal(st.fp16_bytes,
                     kvedge_block_fp16_bytes(16, 64) + kvedge_block_fp16_bytes(256, 64));
    assert_int_equal(st.puts, 2);
    assert_int_equal(st.gets, 5);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.misses, 3);
    assert_int_equal(st.bytes_written, la + lb);
    assert_int_equal(st.bytes_read, la + lb);

    /* Overwrite replaces the bytes and keeps the totals exact; release is idempotent. */
    size_t la2;
    uint8_t *a2 = s_block(13, 16, KVEDGE_SCHEME_INT8, &la2);
    assert_int_equal(kvedge_engine_put(fx->e, &c16, 1, 2, a2, la2, NULL), 0);
    kvedge_value_t v;
    k = s_key(&c16, 1, 2);
    assert_int_equal(kvedge_engine_get(fx->e, &k, &v), 0);
    assert_int_equal(v.len, la2);
    assert_memory_equal(v.data, a2, la2);
    kvedge_value_release(&v);
    kvedge_value_release(&v);
    assert_null(v.data);
    st = s_stats(fx->e);
    assert_int_equal(st.blocks, 2);
    assert_int_equal(st.bytes, la2 + lb);
    free(a);
    free(a2);
    free(b);
}

typedef struct {
    int calls;
    uint16_t heads[16];
    const uint8_t *want[16];
    size_t want_len[16];
    int stop_at; /* return 7 at this call; -1 never */
    int corrupt;
} layer_ctx_t;

static int s_layer_cb(void *ctx, uint16_t head, int status, const uint8_t *data, size_t len)
{
    layer_ctx_t *lc = ctx;
    if (lc->calls >= 16)
        return -100;
    lc->heads[lc->calls] = head;
    if (status == KVEDGE_ECORRUPT) {
        lc->corrupt++;
        if (data != NULL)
            return -101;
    } else if (status != 0 || len != lc->want_len[head] || memcmp(data, lc->want[head], len) != 0) {
        return -102;
    }
    if (lc->calls++ == lc->stop_at)
        return 7;
    return 0;
}

static void test_layer_scan(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c = s_chunk(3, NULL, 16), next = s_chunk(4, &c, 16);
    uint8_t *blk[3][HEADS];
    size_t len[3][HEADS];
    for (int l = 0; l < 3; l++)
        for (int h = 0; h < HEADS; h++)
            blk[l][h] =
                s_block((uint64_t)(100 + l * 16 + h), 16, KVEDGE_SCHEME_LOSSLESS, &len[l][h]);
    /* Shuffled put order (a fixed permutation of the 12 (layer, head) pairs). */
    static const int order[12] = {7, 2, 11, 0, 5, 9, 3, 10, 1, 6, 8, 4};
    for (int i = 0; i < 12; i++) {
        int l = order[i] / HEADS, h = order[i] % HEADS;
        assert_int_equal(
            kvedge_engine_put(fx->e, &c, (uint16_t)l, (uint16_t)h, blk[l][h], len[l][h], NULL), 0);
    }
    /* A neighbouring chunk's layer 1 must not leak into the scan. */
    assert_int_equal(kvedge_engine_put(fx->e, &next, 1, 0, blk[0][0], len[0][0], NULL), 0);

    layer_ctx_t lc = {.stop_at = -1};
    for (int h = 0; h < HEADS; h++) {
        lc.want[h] = blk[1][h];
        lc.want_len[h] = len[1][h];
    }
    assert_int_equal(kvedge_engine_get_layer(fx->e, &c.id, 1, s_layer_cb, &lc), HEADS);
    assert_int_equal(lc.calls, HEADS);
    for (int h = 0; h < HEADS; h++)
        assert_int_equal(lc.heads[h], h);

    /* A layer with no blocks delivers nothing; a callback's non-zero value stops the scan. */
    memset(&lc, 0, sizeof lc);
    lc.stop_at = -1;
    assert_int_equal(kvedge_engine_get_layer(fx->e, &c.id, 3, s_layer_cb, &lc), 0);
    assert_int_equal(lc.calls, 0);
    for (int h = 0; h < HEADS; h++) {
        lc.want[h] = blk[2][h];
        lc.want_len[h] = len[2][h];
    }
    lc.stop_at = 1;
    assert_int_equal(kvedge_engine_get_layer(fx->e, &c.id, 2, s_layer_cb, &lc), 7);
    assert_int_equal(lc.calls, 2);

    /* A corrupt head is reported in its place, quarantined, and the others still arrive. */
    uint8_t *bad = malloc(len[0][2]);
    memcpy(bad, blk[0][2], len[0][2]);
    bad[len[0][2] / 2] ^= 0x10;
    kvedge_block_key_t k = s_key(&c, 0, 2);
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k, bad, len[0][2]), 0);
    memset(&lc, 0, sizeof lc);
    lc.stop_at = -1;
    for (int h = 0; h < HEADS; h++) {
        lc.want[h] = blk[0][h];
        lc.want_len[h] = len[0][h];
    }
    assert_int_equal(kvedge_engine_get_layer(fx->e, &c.id, 0, s_layer_cb, &lc), HEADS - 1);
    assert_int_equal(lc.calls, HEADS);
    assert_int_equal(lc.corrupt, 1);
    assert_int_equal(lc.heads[2], 2);
    assert_int_equal(s_get_rc(fx->e, &c, 0, 2), KVEDGE_ENOTFOUND);
    assert_int_equal(s_stats(fx->e).quarantined, 1);

    free(bad);
    for (int l = 0; l < 3; l++)
        for (int h = 0; h < HEADS; h++)
            free(blk[l][h]);
}

static void test_reopen_keeps_data_and_totals(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_chunk_info_t c0 = s_chunk(5, NULL, 32), c1 = s_chunk(6, &c0, 32);
    uint8_t *b[4];
    size_t len[4];
    for (int i = 0; i < 4; i++)
        b[i] = s_block((uint64_t)(200 + i), 32, i % 2 ? KVEDGE_SCHEME_INT8 : KVEDGE_SCHEME_LOSSLESS,
                       &len[i]);
    kvedge_put_opts_t pin = {.pin = true};
    assert_int_equal(kvedge_engine_put(fx->e, &c0, 0, 0, b[0], len[0], &pin), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c0, 0, 1, b[1], len[1], NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c1, 2, 0, b[2], len[2], NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c1, 3, 3, b[3], len[3], NULL), 0);
    kvedge_engine_stats_t before = s_stats(fx->e);
    kvedge_engine_destroy(&fx->e);
    assert_null(fx->e);

    s_open(fx, NULL);
    kvedge_engine_stats_t after = s_stats(fx->e);
    assert_int_equal(after.blocks, 4);
    assert_int_equal(after.blocks, before.blocks);
    assert_int_equal(after.bytes, before.bytes);
    assert_int_equal(after.bytes, len[0] + len[1] + len[2] + len[3]);
    assert_int_equal(after.fp16_bytes, before.fp16_bytes);
    assert_int_equal(after.pinned_blocks, 1);
    assert_int_equal(after.pinned_bytes, len[0]);
    assert_int_equal(after.puts, 0); /* counters restart */
    s_expect(fx->e, &c0, 0, 0, b[0], len[0]);
    s_expect(fx->e, &c0, 0, 1, b[1], len[1]);
    s_expect(fx->e, &c1, 2, 0, b[2], len[2]);
    s_expect(fx->e, &c1, 3, 3, b[3], len[3]);
    kvedge_chunk_info_t ci;
    assert_int_equal(kvedge_engine_get_chunk(fx->e, &c1.id, &ci), 0);
    assert_true(ci.has_parent);
    assert_memory_equal(ci.parent.bytes, c0.id.bytes, KVEDGE_CHUNK_ID_BYTES);
    assert_int_equal(ci.index, 1);
    kvedge_model_t m;
    assert_int_equal(kvedge_engine_get_model(fx->e, MODEL, &m), 0);
    assert_int_equal(m.layers, LAYERS);
    assert_int_equal(m.kv_heads, HEADS);
    for (int i = 0; i < 4; i++)
        free(b[i]);
}

static void test_eviction_order(void **state)
{
    fx_t *fx = *state;
    size_t len;
    uint8_t *blk = s_block(1, 16, KVEDGE_SCHEME_LOSSLESS, &len);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.capacity_bytes = 3 * len;
    s_open(fx, &o);
    kvedge_chunk_info_t c = s_chunk(7, NULL, 16);
    fx->now = 1000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, blk, len, NULL), 0); /* A */
    fx->now = 2000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, blk, len, NULL), 0); /* B */
    fx->now = 3000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 2, blk, len, NULL), 0); /* C */
    fx->now = 5000;
    s_expect(fx->e, &c, 0, 0, blk, len); /* A refreshed: now newer than B and C */
    kvedge_block_meta_t m;
    kvedge_block_key_t ka = s_key(&c, 0, 0);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &ka, &m), 0);
    assert_int_equal(m.atime_ms, 5000);
    fx->now = 5500; /* within the granularity: no refresh */
    s_expect(fx->e, &c, 0, 0, blk, len);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &ka, &m), 0);
    assert_int_equal(m.atime_ms, 5000);

    fx->now = 6000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 3, blk, len, NULL), 0); /* D evicts B */
    assert_int_equal(s_get_rc(fx->e, &c, 0, 1), KVEDGE_ENOTFOUND);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.evicted_blocks, 1);
    assert_int_equal(st.evicted_bytes, len);
    assert_int_equal(st.blocks, 3);
    assert_int_equal(st.bytes, 3 * len);
    fx->now = 7000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 0, blk, len, NULL), 0); /* E evicts C */
    assert_int_equal(s_get_rc(fx->e, &c, 0, 2), KVEDGE_ENOTFOUND);
    s_expect(fx->e, &c, 0, 0, blk, len);
    s_expect(fx->e, &c, 0, 3, blk, len);
    s_expect(fx->e, &c, 1, 0, blk, len);

    /* Explicit eviction down to one block keeps the most recent one. */
    fx->now = 9000;
    s_expect(fx->e, &c, 0, 3, blk, len);
    uint64_t n, bytes;
    assert_int_equal(kvedge_engine_evict(fx->e, len, &n, &bytes), 0);
    assert_int_equal(n, 2);
    assert_int_equal(bytes, 2 * len);
    s_expect(fx->e, &c, 0, 3, blk, len);
    st = s_stats(fx->e);
    assert_int_equal(st.blocks, 1);
    assert_int_equal(st.bytes, len);
    assert_int_equal(st.evicted_blocks, 4);
    free(blk);
}

static void test_pinned_survive_eviction(void **state)
{
    fx_t *fx = *state;
    size_t len;
    uint8_t *blk = s_block(2, 16, KVEDGE_SCHEME_LOSSLESS, &len);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.capacity_bytes = 3 * len;
    s_open(fx, &o);
    kvedge_chunk_info_t c = s_chunk(8, NULL, 16);
    kvedge_put_opts_t pin = {.pin = true};
    fx->now = 1000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, blk, len, &pin), 0); /* A, oldest */
    fx->now = 2000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, blk, len, NULL), 0); /* B */
    fx->now = 3000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 2, blk, len, NULL), 0); /* C */
    fx->now = 4000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 3, blk, len, NULL), 0); /* evicts B */
    s_expect(fx->e, &c, 0, 0, blk, len);
    assert_int_equal(s_get_rc(fx->e, &c, 0, 1), KVEDGE_ENOTFOUND);

    /* Evicting everything: the pinned block stays and the call says EFULL. */
    uint64_t n;
    assert_int_equal(kvedge_engine_evict(fx->e, 0, &n, NULL), KVEDGE_EFULL);
    assert_int_equal(n, 2);
    s_expect(fx->e, &c, 0, 0, blk, len);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 1);
    assert_int_equal(st.pinned_blocks, 1);
    assert_int_equal(st.pinned_bytes, len);

    /* Fill the capacity with pinned blocks: the next put is refused and nothing is written. */
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 0, blk, len, &pin), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 1, blk, len, &pin), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 2, blk, len, NULL), KVEDGE_EFULL);
    assert_int_equal(s_get_rc(fx->e, &c, 1, 2), KVEDGE_ENOTFOUND);
    st = s_stats(fx->e);
    assert_int_equal(st.blocks, 3);
    assert_int_equal(st.bytes, 3 * len);
    assert_int_equal(st.pinned_blocks, 3);
    /* Re-putting a pinned block without asking for a pin keeps it pinned. */
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 0, blk, len, NULL), 0);
    kvedge_block_meta_t m;
    kvedge_block_key_t k10 = s_key(&c, 1, 0);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k10, &m), 0);
    assert_true(m.pinned);
    st = s_stats(fx->e);
    assert_int_equal(st.pinned_blocks, 3);
    assert_int_equal(st.bytes, 3 * len);

    /* Unpinning makes room: the unpinned block is the one evicted. */
    kvedge_block_key_t ka = s_key(&c, 0, 0);
    assert_int_equal(kvedge_engine_pin(fx->e, &ka, false), 0);
    assert_int_equal(s_stats(fx->e).pinned_blocks, 2);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 2, blk, len, NULL), 0);
    assert_int_equal(s_get_rc(fx->e, &c, 0, 0), KVEDGE_ENOTFOUND);
    s_expect(fx->e, &c, 1, 2, blk, len);

    /* pin_chunk counts what changed; pin of a missing block is ENOTFOUND. */
    uint64_t changed;
    assert_int_equal(kvedge_engine_pin_chunk(fx->e, &c.id, true, &changed), 0);
    assert_int_equal(changed, 1);
    assert_int_equal(kvedge_engine_pin_chunk(fx->e, &c.id, false, &changed), 0);
    assert_int_equal(changed, 3);
    st = s_stats(fx->e);
    assert_int_equal(st.pinned_blocks, 0);
    assert_int_equal(st.pinned_bytes, 0);
    assert_int_equal(kvedge_engine_pin(fx->e, &ka, true), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_evict(fx->e, 0, &n, NULL), 0);
    assert_int_equal(n, 3);
    assert_int_equal(s_stats(fx->e).bytes, 0);
    free(blk);
}

static void test_ttl(void **state)
{
    fx_t *fx = *state;
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.default_ttl_s = 100;
    s_open(fx, &o);
    size_t len;
    uint8_t *blk = s_block(3, 16, KVEDGE_SCHEME_INT8, &len);
    kvedge_chunk_info_t c = s_chunk(9, NULL, 16);
    kvedge_put_opts_t t10 = {.ttl_s = 10}, t20 = {.ttl_s = 20}, t10p = {.ttl_s = 10, .pin = true},
                      never = {.ttl_s = KVEDGE_TTL_NEVER};
    fx->now = 1000;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, blk, len, &t10), 0);   /* A: 11000 */
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, blk, len, &t20), 0);   /* B: 21000 */
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 2, blk, len, &t10p), 0);  /* C: pinned */
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 3, blk, len, NULL), 0);   /* D: 101000 */
    assert_int_equal(kvedge_engine_put(fx->e, &c, 1, 0, blk, len, &never), 0); /* E */
    kvedge_block_meta_t m;
    kvedge_block_key_t k = s_key(&c, 0, 3);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), 0);
    assert_int_equal(m.expires_ms, 101000);
    k = s_key(&c, 1, 0);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), 0);
    assert_int_equal(m.expires_ms, 0);

    fx->now = 10999;
    s_expect(fx->e, &c, 0, 0, blk, len);
    fx->now = 11000;
    assert_int_equal(s_get_rc(fx->e, &c, 0, 0), KVEDGE_ENOTFOUND);
    assert_int_equal(s_stats(fx->e).expired, 1);
    s_expect(fx->e, &c, 0, 2, blk, len); /* pinned: never expires */

    uint64_t n;
    fx->now = 21000;
    assert_int_equal(kvedge_engine_expire(fx->e, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(s_get_rc(fx->e, &c, 0, 1), KVEDGE_ENOTFOUND);
    s_expect(fx->e, &c, 0, 3, blk, len);

    fx->now = 200000;
    assert_int_equal(kvedge_engine_expire(fx->e, &n), 0);
    assert_int_equal(n, 1); /* D */
    assert_int_equal(s_get_rc(fx->e, &c, 0, 3), KVEDGE_ENOTFOUND);
    s_expect(fx->e, &c, 1, 0, blk, len);
    s_expect(fx->e, &c, 0, 2, blk, len);
    /* Unpinned, C's old expiry applies again. */
    k = s_key(&c, 0, 2);
    assert_int_equal(kvedge_engine_pin(fx->e, &k, false), 0);
    assert_int_equal(kvedge_engine_expire(fx->e, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(s_get_rc(fx->e, &c, 0, 2), KVEDGE_ENOTFOUND);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.expired, 4);
    assert_int_equal(st.blocks, 1);
    assert_int_equal(st.bytes, len);
    free(blk);
}

static void test_corruption_quarantined(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    size_t len;
    uint8_t *blk = s_block(4, 64, KVEDGE_SCHEME_LOSSLESS, &len);
    kvedge_chunk_info_t c = s_chunk(10, NULL, 64);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 2, 1, blk, len, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 2, 2, blk, len, NULL), 0);
    uint8_t *bad = malloc(len);
    memcpy(bad, blk, len);
    bad[len / 2] ^= 0x01;
    kvedge_block_key_t k = s_key(&c, 2, 1);
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k, bad, len), 0);
    assert_int_equal(s_get_rc(fx->e, &c, 2, 1), KVEDGE_ECORRUPT);
    assert_int_equal(s_get_rc(fx->e, &c, 2, 1), KVEDGE_ENOTFOUND);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.corrupt, 1);
    assert_int_equal(st.quarantined, 1);
    assert_int_equal(st.blocks, 1);
    assert_int_equal(st.bytes, len);
    s_expect(fx->e, &c, 2, 2, blk, len);

    /* A block with no metadata is corrupt too. */
    k = s_key(&c, 3, 0);
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k, blk, len), 0);
    assert_int_equal(s_get_rc(fx->e, &c, 3, 0), KVEDGE_ECORRUPT);
    assert_int_equal(s_get_rc(fx->e, &c, 3, 0), KVEDGE_ENOTFOUND);
    st = s_stats(fx->e);
    assert_int_equal(st.corrupt, 2);
    assert_int_equal(st.quarantined, 2);
    assert_int_equal(st.blocks, 1);

    /* The quarantine survives a reopen. */
    kvedge_engine_destroy(&fx->e);
    s_open(fx, NULL);
    st = s_stats(fx->e);
    assert_int_equal(st.quarantined, 2);
    assert_int_equal(st.blocks, 1);
    assert_int_equal(st.bytes, len);
    free(bad);
    free(blk);
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

static void test_verify(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    size_t len;
    uint8_t *blk = s_block(5, 16, KVEDGE_SCHEME_INT8, &len);
    kvedge_chunk_info_t c = s_chunk(11, NULL, 16);
    for (uint16_t h = 0; h < 3; h++)
        assert_int_equal(kvedge_engine_put(fx->e, &c, 1, h, blk, len, NULL), 0);
    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, 3);
    assert_int_equal(bad, 0);

    kvedge_block_key_t k = s_key(&c, 1, 1);
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k, blk, len - 3), 0);
    verify_ctx_t vc = {0};
    assert_int_equal(kvedge_engine_verify(fx->e, false, s_verify_cb, &vc, &checked, &bad), 0);
    assert_int_equal(checked, 3);
    assert_int_equal(bad, 1);
    assert_int_equal(vc.calls, 1);
    assert_memory_equal(&vc.key, &k, sizeof k);
    assert_true(vc.err < 0);
    assert_int_equal(s_stats(fx->e).blocks, 3); /* reporting only */

    memset(&vc, 0, sizeof vc);
    assert_int_equal(kvedge_engine_verify(fx->e, true, s_verify_cb, &vc, &checked, &bad), 0);
    assert_int_equal(bad, 1);
    assert_int_equal(vc.calls, 1);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.quarantined, 1);
    assert_int_equal(st.blocks, 2);
    assert_int_equal(st.bytes, 2 * len);
    assert_int_equal(s_get_rc(fx->e, &c, 1, 1), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, 2);
    assert_int_equal(bad, 0);
    free(blk);
}

static void test_put_errors_leave_data_intact(void **state)
{
    fx_t *fx = *state;
    size_t len, big_len, len32;
    uint8_t *blk = s_block(6, 16, KVEDGE_SCHEME_LOSSLESS, &len);
    uint8_t *big = s_block(7, 256, KVEDGE_SCHEME_LOSSLESS, &big_len);
    uint8_t *b32 = s_block(8, 32, KVEDGE_SCHEME_LOSSLESS, &len32);
    assert_true(big_len > 4 * len);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.capacity_bytes = 4 * len;
    s_open(fx, &o);
    kvedge_chunk_info_t c = s_chunk(12, NULL, 16);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, blk, len, NULL), 0);
    kvedge_engine_stats_t before = s_stats(fx->e);

    kvedge_chunk_info_t unknown = c;
    strcpy(unknown.model_id, "no-such-model");
    assert_int_equal(kvedge_engine_put(fx->e, &unknown, 0, 1, blk, len, NULL), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, HEADS, blk, len, NULL), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_engine_put(fx->e, &c, LAYERS, 0, blk, len, NULL), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, b32, len32, NULL), KVEDGE_ESHAPE);
    kvedge_chunk_info_t moved = c; /* same id, different place in a chain */
    moved.index = 5;
    assert_int_equal(kvedge_engine_put(fx->e, &moved, 0, 0, blk, len, NULL), KVEDGE_ESHAPE);
    int rc = kvedge_engine_put(fx->e, &c, 0, 0, blk, len - 1, NULL);
    assert_true(rc == KVEDGE_ETRUNCATED || rc == KVEDGE_ECORRUPT);
    uint8_t *flip = malloc(len);
    memcpy(flip, blk, len);
    flip[len - 20] ^= 0x80;
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, flip, len, NULL), KVEDGE_ECORRUPT);
    /* A block of another shape whose body would not decode (an lz4 body of garbage under a
     * valid checksum): refused for its shape from the header, before its body is decoded. */
    uint8_t *lzb = malloc(len32);
    assert_non_null(lzb);
    size_t lz_stored = 64;
    memcpy(lzb, b32, KVEDGE_BLOCK_HEADER_BYTES);
    lzb[7] |= KVEDGE_BLOCK_FLAG_LZ4;
    kvedge_le_put32(lzb + 24, (uint32_t)lz_stored);
    memset(lzb + KVEDGE_BLOCK_HEADER_BYTES, 0xA5, lz_stored);
    size_t lz_covered = KVEDGE_BLOCK_HEADER_BYTES + lz_stored;
    kvedge_le_put64(lzb + lz_covered, XXH3_64bits(lzb, lz_covered));
    size_t lz_len = lz_covered + KVEDGE_BLOCK_CHECKSUM_BYTES;
    kvedge_block_info_t lzi;
    assert_int_equal(kvedge_block_parse(lzb, lz_len, &lzi), KVEDGE_OK);
    assert_int_equal(kvedge_block_check(lzb, lz_len, NULL), KVEDGE_ECORRUPT);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, lzb, lz_len, NULL), KVEDGE_ESHAPE);
    free(lzb);
    kvedge_chunk_info_t c256 = s_chunk(13, NULL, 256);
    assert_int_equal(kvedge_engine_put(fx->e, &c256, 0, 0, big, big_len, NULL), KVEDGE_ETOOBIG);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, NULL, len, NULL), KVEDGE_EINVAL);

    s_expect(fx->e, &c, 0, 0, blk, len);
    assert_int_equal(s_get_rc(fx->e, &c, 0, 1), KVEDGE_ENOTFOUND);
    kvedge_chunk_info_t ci;
    assert_int_equal(kvedge_engine_get_chunk(fx->e, &c256.id, &ci), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_get_chunk(fx->e, &c.id, &ci), 0);
    assert_int_equal(ci.index, 0);
    kvedge_engine_stats_t after = s_stats(fx->e);
    assert_int_equal(after.blocks, before.blocks);
    assert_int_equal(after.bytes, before.bytes);
    assert_int_equal(after.puts, 1);

    /* Models: idempotent for the same shape, ESHAPE for another, ENOMODEL when unknown. */
    kvedge_model_t m = {MODEL, LAYERS, HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16}, got;
    assert_int_equal(kvedge_engine_put_model(fx->e, &m), 0);
    m.layers = 8;
    assert_int_equal(kvedge_engine_put_model(fx->e, &m), KVEDGE_ESHAPE);
    m.layers = 0;
    assert_int_equal(kvedge_engine_put_model(fx->e, &m), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_get_model(fx->e, MODEL, &got), 0);
    assert_int_equal(got.layers, LAYERS);
    assert_int_equal(kvedge_engine_get_model(fx->e, "no-such-model", &got), KVEDGE_ENOMODEL);
    free(flip);
    free(blk);
    free(big);
    free(b32);
}

static int s_count_chunk(void *ctx, const kvedge_chunk_info_t *info)
{
    (void)info;
    (*(int *)ctx)++;
    return 0;
}

static void test_delete_chunk_descendants(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    size_t len;
    uint8_t *blk = s_block(9, 16, KVEDGE_SCHEME_LOSSLESS, &len);
    /* c0 -> c1 -> c2 -> c4, c0 -> c3; u unrelated. */
    kvedge_chunk_info_t c[6];
    c[0] = s_chunk(20, NULL, 16);
    c[1] = s_chunk(21, &c[0], 16);
    c[2] = s_chunk(22, &c[1], 16);
    c[3] = s_chunk(23, &c[0], 16);
    c[4] = s_chunk(24, &c[2], 16);
    c[5] = s_chunk(25, NULL, 16);
    kvedge_put_opts_t pin = {.pin = true};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(kvedge_engine_put(fx->e, &c[i], 0, 0, blk, len, NULL), 0);
        assert_int_equal(kvedge_engine_put(fx->e, &c[i], 1, 1, blk, len, i == 2 ? &pin : NULL), 0);
    }
    int n = 0;
    assert_int_equal(kvedge_engine_list_chunks(fx->e, s_count_chunk, &n), 0);
    assert_int_equal(n, 6);

    uint64_t deleted;
    assert_int_equal(kvedge_engine_delete_chunk(fx->e, &c[1].id, true, &deleted), 0);
    assert_int_equal(deleted, 6); /* c1, c2 (one pinned block), c4 */
    kvedge_chunk_info_t ci;
    for (int i = 0; i < 6; i++) {
        bool gone = i == 1 || i == 2 || i == 4;
        assert_int_equal(kvedge_engine_get_chunk(fx->e, &c[i].id, &ci),
                         gone ? KVEDGE_ENOTFOUND : 0);
        assert_int_equal(s_get_rc(fx->e, &c[i], 1, 1), gone ? KVEDGE_ENOTFOUND : 0);
    }
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 6);
    assert_int_equal(st.bytes, 6 * len);
    assert_int_equal(st.pinned_blocks, 0);

    /* Without descendants only the chunk itself goes. */
    assert_int_equal(kvedge_engine_delete_chunk(fx->e, &c[0].id, false, &deleted), 0);
    assert_int_equal(deleted, 2);
    assert_int_equal(kvedge_engine_get_chunk(fx->e, &c[3].id, &ci), 0);
    assert_int_equal(s_get_rc(fx->e, &c[3], 0, 0), 0);
    /* c0's record is gone but c3 still names it as parent: it is a descendant. */
    assert_int_equal(kvedge_engine_delete_chunk(fx->e, &c[0].id, true, &deleted), 0);
    assert_int_equal(deleted, 2);
    assert_int_equal(kvedge_engine_get_chunk(fx->e, &c[3].id, &ci), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_delete_chunk(fx->e, &c[0].id, true, &deleted), KVEDGE_ENOTFOUND);
    assert_int_equal(deleted, 0);
    n = 0;
    assert_int_equal(kvedge_engine_list_chunks(fx->e, s_count_chunk, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(s_stats(fx->e).blocks, 2);
    assert_int_equal(s_get_rc(fx->e, &c[5], 1, 1), 0);
    free(blk);
}

static void test_find_chunk(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    size_t len;
    uint8_t *blk = s_block(10, 16, KVEDGE_SCHEME_LOSSLESS, &len);
    kvedge_chunk_info_t a = s_chunk(0, NULL, 16), b = a, z = a;
    memset(a.id.bytes, 0x11, sizeof a.id.bytes);
    a.id.bytes[0] = 0xaa, a.id.bytes[1] = 0xbb, a.id.bytes[2] = 0x01;
    memset(b.id.bytes, 0x22, sizeof b.id.bytes);
    b.id.bytes[0] = 0xaa, b.id.bytes[1] = 0xbb, b.id.bytes[2] = 0x02;
    memset(z.id.bytes, 0x33, sizeof z.id.bytes);
    assert_int_equal(kvedge_engine_put(fx->e, &a, 0, 0, blk, len, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &b, 0, 0, blk, len, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &z, 0, 0, blk, len, NULL), 0);

    kvedge_chunk_id_t id;
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "aabb", &id), KVEDGE_EAMBIGUOUS);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "aabb0", &id), KVEDGE_EAMBIGUOUS);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "aabb01", &id), 0);
    assert_memory_equal(id.bytes, a.id.bytes, sizeof id.bytes);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "AABB02", &id), 0);
    assert_memory_equal(id.bytes, b.id.bytes, sizeof id.bytes);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "3333", &id), 0);
    assert_memory_equal(id.bytes, z.id.bytes, sizeof id.bytes);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, kvedge_chunk_id_hex(&b.id, hex), &id), 0);
    assert_memory_equal(id.bytes, b.id.bytes, sizeof id.bytes);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "ffff", &id), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "aabb03", &id), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "abc", &id), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "aabz", &id), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_find_chunk(fx->e, "", &id), KVEDGE_EINVAL);
    free(blk);
}

static void test_read_only(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    size_t len;
    uint8_t *blk = s_block(11, 16, KVEDGE_SCHEME_LOSSLESS, &len);
    kvedge_chunk_info_t c = s_chunk(30, NULL, 16);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 0, blk, len, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 1, blk, len, NULL), 0);
    kvedge_block_key_t k1 = s_key(&c, 0, 1), k0 = s_key(&c, 0, 0);
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k1, blk, len / 2), 0);
    kvedge_engine_destroy(&fx->e);

    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.read_only = true;
    s_open(fx, &o);
    fx->now = 100000; /* would refresh atime if the engine could write */
    s_expect(fx->e, &c, 0, 0, blk, len);
    kvedge_block_meta_t m;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k0, &m), 0);
    assert_int_equal(m.atime_ms, 1000);
    /* Corrupt blocks are reported, not moved. */
    assert_int_equal(s_get_rc(fx->e, &c, 0, 1), KVEDGE_ECORRUPT);
    assert_int_equal(s_get_rc(fx->e, &c, 0, 1), KVEDGE_ECORRUPT);
    assert_int_equal(kvedge_engine_put(fx->e, &c, 0, 2, blk, len, NULL), KVEDGE_EREADONLY);
    kvedge_model_t model = {MODEL, LAYERS, HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_engine_put_model(fx->e, &model), KVEDGE_EREADONLY);
    assert_int_equal(kvedge_engine_pin(fx->e, &k0, true), KVEDGE_EREADONLY);
    assert_int_equal(kvedge_engine_delete_chunk(fx->e, &c.id, false, NULL), KVEDGE_EREADONLY);
    assert_int_equal(kvedge_engine_evict(fx->e, 0, NULL, NULL), KVEDGE_EREADONLY);
    assert_int_equal(kvedge_engine_expire(fx->e, NULL), KVEDGE_EREADONLY);
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k0, blk, len), KVEDGE_EREADONLY);
    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, true, NULL, NULL, &checked, &bad),
                     KVEDGE_EREADONLY);
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, 2);
    assert_int_equal(bad, 1);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 2);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.corrupt, 2);
    /* A read-only open of nothing. */
    kvedge_engine_t *e2 = NULL;
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none", fx->dir);
    assert_int_equal(kvedge_engine_open(missing, &o, &e2, NULL, 0), KVEDGE_ENOTFOUND);
    assert_null(e2);
    free(blk);
}

static void test_second_open_is_busy(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    kvedge_engine_t *e2 = NULL;
    char why[256] = "";
    assert_int_equal(kvedge_engine_open(fx->path, NULL, &e2, why, sizeof why), KVEDGE_ELOCKED);
    assert_null(e2);
    assert_true(strlen(why) > 0);
    assert_null(strchr(why, '\n'));
    /* Free again once closed. */
    kvedge_engine_destroy(&fx->e);
    assert_int_equal(kvedge_engine_open(fx->path, NULL, &e2, why, sizeof why), 0);
    kvedge_engine_destroy(&e2);
}

static void test_missing_dir(void **state)
{
    fx_t *fx = *state;
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.create_if_missing = false;
    kvedge_engine_t *e = NULL;
    char why[256] = "";
    assert_int_equal(kvedge_engine_open(fx->path, &o, &e, why, sizeof why), KVEDGE_ENOTFOUND);
    assert_null(e);
    assert_non_null(strstr(why, "no kvedge store at"));
    assert_int_equal(access(fx->path, F_OK), -1); /* nothing was created */
}

static void test_newer_format_refused(void **state)
{
    fx_t *fx = *state;
    /* A RocksDB store whose format marker says 2. */
    rocksdb_options_t *opt = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(opt, 1);
    char *err = NULL;
    rocksdb_t *db = rocksdb_open(opt, fx->path, &err);
    assert_null(err);
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    rocksdb_put(db, wo, "kvedge.format", 13, "2", 1, &err);
    assert_null(err);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_close(db);
    rocksdb_options_destroy(opt);
    kvedge_engine_t *e = NULL;
    char why[256] = "";
    assert_int_equal(kvedge_engine_open(fx->path, NULL, &e, why, sizeof why), KVEDGE_EVERSION);
    assert_null(e);
    assert_non_null(strstr(why, "2"));
}

#define CRASH_BLOCKS 8

static void test_crash_durability(void **state)
{
    fx_t *fx = *state;
    uint8_t *blk[CRASH_BLOCKS];
    size_t len[CRASH_BLOCKS];
    for (int i = 0; i < CRASH_BLOCKS; i++)
        blk[i] = s_block((uint64_t)(300 + i), 32,
                         i % 2 ? KVEDGE_SCHEME_INT8 : KVEDGE_SCHEME_LOSSLESS, &len[i]);
    kvedge_chunk_info_t c = s_chunk(40, NULL, 32);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The child must not touch cmocka: it reports through its exit status only. */
        kvedge_engine_opts_t o;
        kvedge_engine_opts_default(&o);
        o.sync = true;
        kvedge_engine_t *e = NULL;
        if (kvedge_engine_open(fx->path, &o, &e, NULL, 0) != 0)
            _exit(2);
        kvedge_model_t m = {MODEL, LAYERS, HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16};
        if (kvedge_engine_put_model(e, &m) != 0)
            _exit(3);
        for (int i = 0; i < CRASH_BLOCKS; i++)
            if (kvedge_engine_put(e, &c, (uint16_t)(i / HEADS), (uint16_t)(i % HEADS), blk[i],
                                  len[i], NULL) != 0)
                _exit(4);
        _exit(0); /* no close: only the synced WAL holds the data */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);

    s_open(fx, NULL);
    for (int i = 0; i < CRASH_BLOCKS; i++)
        s_expect(fx->e, &c, (uint16_t)(i / HEADS), (uint16_t)(i % HEADS), blk[i], len[i]);
    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, CRASH_BLOCKS);
    assert_int_equal(bad, 0);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, CRASH_BLOCKS);
    uint64_t total = 0;
    for (int i = 0; i < CRASH_BLOCKS; i++)
        total += len[i];
    assert_int_equal(st.bytes, total);
    for (int i = 0; i < CRASH_BLOCKS; i++)
        free(blk[i]);
}

/* Concurrent puts and gets over 64 shared keys, two candidate blocks per key. */
#define CC_THREADS 4
#define CC_OPS     400
#define CC_CHUNKS  4
#define CC_KEYS    (CC_CHUNKS * LAYERS * HEADS)

typedef struct {
    kvedge_engine_t *e;
    kvedge_chunk_info_t chunks[CC_CHUNKS];
    uint8_t *blk[CC_KEYS][2];
    size_t len[CC_KEYS][2];
} cc_shared_t;

typedef struct {
    cc_shared_t *sh;
    uint64_t seed;
    int failures;
    int puts;
    int hits;
} cc_thread_t;

static void *s_cc_worker(void *arg)
{
    cc_thread_t *t = arg;
    cc_shared_t *sh = t->sh;
    kvedge_rng_t rng;
    kvedge_rng_seed(&rng, t->seed);
    for (int i = 0; i < CC_OPS; i++) {
        uint64_t r = kvedge_rng_next(&rng);
        int key = (int)(r % CC_KEYS), which = (int)((r >> 8) & 1);
        const kvedge_chunk_info_t *c = &sh->chunks[key / (LAYERS * HEADS)];
        uint16_t layer = (uint16_t)(key / HEADS % LAYERS), head = (uint16_t)(key % HEADS);
        if ((r >> 16) % 2 == 0) {
            int rc = kvedge_engine_put(sh->e, c, layer, head, sh->blk[key][which],
                                       sh->len[key][which], NULL);
            t->failures += rc != 0;
            t->puts += rc == 0;
        } else {
            kvedge_block_key_t k = s_key(c, layer, head);
            kvedge_value_t v;
            int rc = kvedge_engine_get(sh->e, &k, &v);
            if (rc == 0) {
                bool ok = false;
                for (int w = 0; w < 2; w++)
                    ok = ok ||
                         (v.len == sh->len[key][w] && memcmp(v.data, sh->blk[key][w], v.len) == 0);
                t->failures += !ok;
                t->hits++;
            } else {
                t->failures += rc != KVEDGE_ENOTFOUND;
            }
            kvedge_value_release(&v);
        }
    }
    return NULL;
}

typedef struct {
    uint64_t blocks;
    uint64_t bytes;
    uint64_t pinned;
} scan_sum_t;

static int s_scan_sum(void *ctx, const kvedge_block_key_t *key, const kvedge_block_meta_t *m)
{
    (void)key;
    scan_sum_t *s = ctx;
    s->blocks++;
    s->bytes += m->bytes;
    s->pinned += m->pinned;
    return 0;
}

static void test_concurrent_puts_and_gets(void **state)
{
    fx_t *fx = *state;
    static cc_shared_t sh;
    memset(&sh, 0, sizeof sh);
    for (int i = 0; i < CC_CHUNKS; i++)
        sh.chunks[i] = s_chunk((uint8_t)(50 + i), i ? &sh.chunks[i - 1] : NULL, 16);
    for (int k = 0; k < CC_KEYS; k++)
        for (int w = 0; w < 2; w++)
            sh.blk[k][w] = s_block((uint64_t)(1000 + 2 * k + w), 16,
                                   w ? KVEDGE_SCHEME_INT8 : KVEDGE_SCHEME_LOSSLESS, &sh.len[k][w]);
    kvedge_engine_opts_t o;
    kvedge_engine_opts_default(&o); /* the wall clock: the threads share it */
    o.atime_granularity_ms = 0;     /* every hit rewrites meta and the LRU entry */
    o.capacity_bytes = 16 * sh.len[0][0];
    s_open(fx, &o);
    sh.e = fx->e;

    pthread_t th[CC_THREADS];
    cc_thread_t ct[CC_THREADS];
    for (int i = 0; i < CC_THREADS; i++) {
        ct[i] = (cc_thread_t){.sh = &sh, .seed = (uint64_t)(77 + i)};
        assert_int_equal(pthread_create(&th[i], NULL, s_cc_worker, &ct[i]), 0);
    }
    int failures = 0, puts = 0;
    for (int i = 0; i < CC_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        failures += ct[i].failures;
        puts += ct[i].puts;
    }
    assert_int_equal(failures, 0);
    assert_true(puts > CC_THREADS * CC_OPS / 4);

    scan_sum_t sum = {0};
    assert_int_equal(kvedge_engine_scan(fx->e, NULL, s_scan_sum, &sum), 0);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.bytes, sum.bytes);
    assert_int_equal(st.blocks, sum.blocks);
    assert_true(st.bytes <= o.capacity_bytes);
    assert_true(st.evicted_blocks > 0);
    assert_int_equal(st.puts, (uint64_t)puts);
    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, sum.blocks);
    assert_int_equal(bad, 0);

    /* scan of one chunk sees only its blocks; the totals survive a reopen. */
    scan_sum_t one = {0};
    assert_int_equal(kvedge_engine_scan(fx->e, &sh.chunks[0].id, s_scan_sum, &one), 0);
    assert_true(one.blocks <= LAYERS * HEADS);
    kvedge_engine_destroy(&fx->e);
    s_open(fx, &o);
    kvedge_engine_stats_t again = s_stats(fx->e);
    assert_int_equal(again.bytes, st.bytes);
    assert_int_equal(again.blocks, st.blocks);
    for (int k = 0; k < CC_KEYS; k++)
        for (int w = 0; w < 2; w++)
            free(sh.blk[k][w]);
}

/* ---------------------------------------------------------------- damaged blob records */

/* Blocks large enough to live in blob files: 256 tokens x 64 dims fp16, lossless (~64 KiB). */
#define BLOB_MODEL  "blob-model"
#define BLOB_HEADS  16
#define BLOB_TOKENS 256
/* A blob record: a 32-byte header, the key, the value. Offsets from the key's first byte. */
#define BLOB_VALUE_OFF  (KVEDGE_BLOCK_KEY_BYTES + 1000)
#define BLOB_HEADER_OFF (-20)

typedef struct {
    kvedge_chunk_info_t c;
    uint8_t *blk[BLOB_HEADS];
    size_t len[BLOB_HEADS];
    size_t total;
} blob_fx_t;

static void s_blob_free(blob_fx_t *bf)
{
    for (int h = 0; h < BLOB_HEADS; h++)
        free(bf->blk[h]);
}

/* Builds a closed store (so flushed: the values sit in .blob files) holding every head of
 * layer 0 of one chunk, and head 0 of layer 1; with orphan, also a block with no metadata at
 * layer 1 head 3 (in a blob file of its own). */
static void s_blob_store(fx_t *fx, blob_fx_t *bf, bool orphan)
{
    memset(bf, 0, sizeof *bf);
    s_open(fx, NULL);
    kvedge_model_t m = {BLOB_MODEL, 2, BLOB_HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_engine_put_model(fx->e, &m), 0);
    bf->c = s_chunk(50, NULL, BLOB_TOKENS);
    strcpy(bf->c.model_id, BLOB_MODEL);
    for (int h = 0; h < BLOB_HEADS; h++) {
        bf->blk[h] = s_block((uint64_t)(500 + h), BLOB_TOKENS, KVEDGE_SCHEME_LOSSLESS, &bf->len[h]);
        assert_true(bf->len[h] >= 64 * 1024);
        assert_int_equal(
            kvedge_engine_put(fx->e, &bf->c, 0, (uint16_t)h, bf->blk[h], bf->len[h], NULL), 0);
        bf->total += bf->len[h];
    }
    assert_int_equal(kvedge_engine_put(fx->e, &bf->c, 1, 0, bf->blk[0], bf->len[0], NULL), 0);
    bf->total += bf->len[0];
    if (orphan) {
        kvedge_engine_destroy(&fx->e); /* its own flush, so its own blob file */
        s_open(fx, NULL);
        kvedge_block_key_t k = s_key(&bf->c, 1, 3);
        assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k, bf->blk[1], bf->len[1]), 0);
    }
    kvedge_engine_destroy(&fx->e);
}

/* Flips one byte of the blob record of key, at off from the key inside the record, in
 * whichever .blob file holds it; exactly one record may hold it. */
static void s_damage_blob(fx_t *fx, const kvedge_block_key_t *key, long off)
{
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
    DIR *d = opendir(fx->path);
    assert_non_null(d);
    struct dirent *de;
    int found = 0;
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 5, ".blob") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", fx->path, de->d_name);
        int fd = open(path, O_RDWR);
        assert_true(fd >= 0);
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        uint8_t *buf = malloc((size_t)st.st_size);
        assert_non_null(buf);
        assert_int_equal(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
        for (const uint8_t *p = buf;
             (p = memmem(p, (size_t)(buf + st.st_size - p), kb, sizeof kb)) != NULL; p++) {
            off_t at = (off_t)(p - buf) + off;
            assert_true(at >= 0 && at < st.st_size);
            uint8_t b = buf[at] ^ 0x5a;
            assert_int_equal(pwrite(fd, &b, 1, at), 1);
            found++;
        }
        free(buf);
        close(fd);
    }
    closedir(d);
    assert_int_equal(found, 1);
}

/* Layer 0 of the blob chunk through get_layer: want every head but skip, which must be reported
 * ECORRUPT in its place (skip -1: none). Returns the scan's result. */
static int s_blob_layer(fx_t *fx, blob_fx_t *bf, int skip, layer_ctx_t *lc)
{
    memset(lc, 0, sizeof *lc);
    lc->stop_at = -1;
    for (int h = 0; h < BLOB_HEADS; h++) {
        lc->want[h] = bf->blk[h];
        lc->want_len[h] = bf->len[h];
    }
    int rc = kvedge_engine_get_layer(fx->e, &bf->c.id, 0, s_layer_cb, lc);
    assert_int_equal(lc->corrupt, skip >= 0 ? 1 : 0);
    return rc;
}

typedef struct {
    int calls;
    kvedge_block_key_t keys[8];
    int errs[8];
} verify_all_t;

static int s_verify_all_cb(void *ctx, const kvedge_block_key_t *key, int err)
{
    verify_all_t *va = ctx;
    if (va->calls < 8) {
        va->keys[va->calls] = *key;
        va->errs[va->calls] = err;
    }
    va->calls++;
    return 0;
}

static void test_blob_damage_read_only(void **state)
{
    fx_t *fx = *state;
    blob_fx_t bf;
    s_blob_store(fx, &bf, false);
    kvedge_block_key_t k5 = s_key(&bf.c, 0, 5);
    s_damage_blob(fx, &k5, BLOB_VALUE_OFF);
    kvedge_engine_opts_t o = kt_fx_opts(fx);
    o.read_only = true;
    s_open(fx, &o);

    /* Exactly the damaged head fails, every time: nothing is moved. */
    int corrupt = 0, which = -1;
    for (int h = 0; h < BLOB_HEADS; h++) {
        int rc = s_get_rc(fx->e, &bf.c, 0, (uint16_t)h);
        if (rc == KVEDGE_ECORRUPT) {
            corrupt++;
            which = h;
        } else {
            assert_int_equal(rc, 0);
            s_expect(fx->e, &bf.c, 0, (uint16_t)h, bf.blk[h], bf.len[h]);
        }
    }
    assert_int_equal(corrupt, 1);
    assert_int_equal(which, 5);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 5), KVEDGE_ECORRUPT);

    layer_ctx_t lc;
    assert_int_equal(s_blob_layer(fx, &bf, 5, &lc), BLOB_HEADS - 1);
    assert_int_equal(lc.calls, BLOB_HEADS);
    for (int h = 0; h < BLOB_HEADS; h++)
        assert_int_equal(lc.heads[h], h);

    uint64_t checked, bad;
    verify_all_t va = {0};
    assert_int_equal(kvedge_engine_verify(fx->e, false, s_verify_all_cb, &va, &checked, &bad), 0);
    assert_int_equal(checked, BLOB_HEADS + 1);
    assert_int_equal(bad, 1);
    assert_int_equal(va.calls, 1);
    assert_memory_equal(&va.keys[0], &k5, sizeof k5);
    assert_int_equal(va.errs[0], KVEDGE_ECORRUPT);
    assert_int_equal(kvedge_engine_verify(fx->e, true, NULL, NULL, &checked, &bad),
                     KVEDGE_EREADONLY);

    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.corrupt, 3); /* two gets and the layer scan */
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.blocks, BLOB_HEADS + 1);
    assert_int_equal(st.bytes, bf.total);

    /* Nothing was written: a writable open still finds it. */
    kvedge_engine_destroy(&fx->e);
    s_open(fx, NULL);
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(bad, 1);
    assert_int_equal(s_stats(fx->e).quarantined, 0);
    s_blob_free(&bf);
}

static void test_blob_damage_get(void **state)
{
    fx_t *fx = *state;
    blob_fx_t bf;
    s_blob_store(fx, &bf, false);
    kvedge_block_key_t k9 = s_key(&bf.c, 0, 9);
    /* The value: reads leave RocksDB's checksums off, the block's own xxh3 finds it. (A
     * damaged record header, value intact, is the scrubber's: test_blob_damage_header.) */
    s_damage_blob(fx, &k9, BLOB_VALUE_OFF);
    s_open(fx, NULL);

    int corrupt = 0, which = -1;
    for (int h = 0; h < BLOB_HEADS; h++) {
        int rc = s_get_rc(fx->e, &bf.c, 0, (uint16_t)h);
        if (rc == KVEDGE_ECORRUPT) {
            corrupt++;
            which = h;
        } else {
            assert_int_equal(rc, 0);
        }
    }
    assert_int_equal(corrupt, 1);
    assert_int_equal(which, 9);
    for (int h = 0; h < BLOB_HEADS; h++)
        if (h != 9)
            s_expect(fx->e, &bf.c, 0, (uint16_t)h, bf.blk[h], bf.len[h]);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.corrupt, 1);
    assert_int_equal(st.quarantined, 1);
    assert_int_equal(st.blocks, BLOB_HEADS);
    assert_int_equal(st.bytes, bf.total - bf.len[9]);
    assert_int_equal(st.misses, 1);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 9), KVEDGE_ENOTFOUND);
    kvedge_block_meta_t m;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k9, &m), KVEDGE_ENOTFOUND);

    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, BLOB_HEADS);
    assert_int_equal(bad, 0);
    layer_ctx_t lc;
    assert_int_equal(s_blob_layer(fx, &bf, -1, &lc), BLOB_HEADS - 1);
    assert_int_equal(lc.calls, BLOB_HEADS - 1);

    /* The totals and the quarantine hold across a reopen. */
    kvedge_engine_destroy(&fx->e);
    s_open(fx, NULL);
    st = s_stats(fx->e);
    assert_int_equal(st.quarantined, 1);
    assert_int_equal(st.blocks, BLOB_HEADS);
    assert_int_equal(st.bytes, bf.total - bf.len[9]);
    s_blob_free(&bf);
}

static void test_blob_damage_layer(void **state)
{
    fx_t *fx = *state;
    blob_fx_t bf;
    s_blob_store(fx, &bf, false);
    /* The first head: the scan's very first read fails. */
    kvedge_block_key_t k0 = s_key(&bf.c, 0, 0);
    s_damage_blob(fx, &k0, BLOB_VALUE_OFF);
    s_open(fx, NULL);

    layer_ctx_t lc;
    assert_int_equal(s_blob_layer(fx, &bf, 0, &lc), BLOB_HEADS - 1);
    assert_int_equal(lc.calls, BLOB_HEADS);
    for (int h = 0; h < BLOB_HEADS; h++)
        assert_int_equal(lc.heads[h], h);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.corrupt, 1);
    assert_int_equal(st.quarantined, 1);
    assert_int_equal(st.blocks, BLOB_HEADS);
    assert_int_equal(st.hits, BLOB_HEADS - 1);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 0), KVEDGE_ENOTFOUND);

    assert_int_equal(s_blob_layer(fx, &bf, -1, &lc), BLOB_HEADS - 1);
    assert_int_equal(lc.calls, BLOB_HEADS - 1);
    assert_int_equal(lc.heads[0], 1);
    uint64_t checked, bad;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, BLOB_HEADS);
    assert_int_equal(bad, 0);
    s_blob_free(&bf);
}

static void test_blob_damage_verify(void **state)
{
    fx_t *fx = *state;
    blob_fx_t bf;
    s_blob_store(fx, &bf, true);
    /* A damaged block with metadata, and a damaged block without any. */
    kvedge_block_key_t k7 = s_key(&bf.c, 0, 7), ko = s_key(&bf.c, 1, 3);
    s_damage_blob(fx, &k7, BLOB_VALUE_OFF);
    s_damage_blob(fx, &ko, BLOB_VALUE_OFF);
    s_open(fx, NULL);

    uint64_t checked, bad;
    verify_all_t va = {0};
    assert_int_equal(kvedge_engine_verify(fx->e, false, s_verify_all_cb, &va, &checked, &bad), 0);
    assert_int_equal(checked, BLOB_HEADS + 2);
    assert_int_equal(bad, 2);
    assert_int_equal(va.calls, 2);
    assert_memory_equal(&va.keys[0], &k7, sizeof k7);
    assert_memory_equal(&va.keys[1], &ko, sizeof ko);
    assert_int_equal(va.errs[0], KVEDGE_ECORRUPT);
    assert_int_equal(va.errs[1], KVEDGE_ECORRUPT);
    assert_int_equal(s_stats(fx->e).blocks, BLOB_HEADS + 1); /* reporting only */

    memset(&va, 0, sizeof va);
    assert_int_equal(kvedge_engine_verify(fx->e, true, s_verify_all_cb, &va, &checked, &bad), 0);
    assert_int_equal(bad, 2);
    assert_int_equal(va.calls, 2);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.quarantined, 2);
    assert_int_equal(st.corrupt, 2);
    assert_int_equal(st.blocks, BLOB_HEADS);
    assert_int_equal(st.bytes, bf.total - bf.len[7]);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 7), KVEDGE_ENOTFOUND);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 1, 3), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, BLOB_HEADS);
    assert_int_equal(bad, 0);
    s_blob_free(&bf);
}

/* Deletes key from one column family of the closed store at fx->path, behind the engine. */
static void s_raw_delete(fx_t *fx, const char *family, const kvedge_block_key_t *key)
{
    uint8_t kb[KVEDGE_BLOCK_KEY_BYTES];
    kvedge_block_key_pack(key, kb);
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
    int deleted = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(names[i], family) != 0)
            continue;
        rocksdb_delete_cf(db, wo, h[i], (const char *)kb, sizeof kb, &err);
        assert_null(err);
        deleted++;
    }
    assert_int_equal(deleted, 1);
    rocksdb_writeoptions_destroy(wo);
    for (size_t i = 0; i < n; i++)
        rocksdb_column_family_handle_destroy(h[i]);
    rocksdb_close(db);
    rocksdb_list_column_families_destroy(names, n);
    free(cfo);
    free(h);
    rocksdb_options_destroy(opt);
}

static void test_blob_damage_delete_chunk(void **state)
{
    fx_t *fx = *state;
    blob_fx_t bf;
    s_blob_store(fx, &bf, true);
    kvedge_block_key_t k4 = s_key(&bf.c, 0, 4), ko = s_key(&bf.c, 1, 3), k10 = s_key(&bf.c, 0, 10);
    s_damage_blob(fx, &k4, BLOB_VALUE_OFF);
    s_damage_blob(fx, &ko, BLOB_HEADER_OFF);
    s_raw_delete(fx, "blocks", &k10); /* metadata left with no block */
    s_open(fx, NULL);

    /* Each orphan and each damaged block is reported once, in key order. */
    uint64_t checked, bad;
    verify_all_t va = {0};
    assert_int_equal(kvedge_engine_verify(fx->e, false, s_verify_all_cb, &va, &checked, &bad), 0);
    assert_int_equal(checked, BLOB_HEADS + 2);
    assert_int_equal(bad, 3);
    assert_int_equal(va.calls, 3);
    assert_memory_equal(&va.keys[0], &k4, sizeof k4);
    assert_memory_equal(&va.keys[1], &k10, sizeof k10);
    assert_memory_equal(&va.keys[2], &ko, sizeof ko);

    /* Deleting needs only keys: damaged values do not stand in the way. */
    uint64_t n = 0;
    assert_int_equal(kvedge_engine_delete_chunk(fx->e, &bf.c.id, false, &n), 0);
    assert_int_equal(n, BLOB_HEADS + 2);
    for (int h = 0; h < BLOB_HEADS; h++)
        assert_int_equal(s_get_rc(fx->e, &bf.c, 0, (uint16_t)h), KVEDGE_ENOTFOUND);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 1, 3), KVEDGE_ENOTFOUND);
    kvedge_chunk_info_t ci;
    assert_int_equal(kvedge_engine_get_chunk(fx->e, &bf.c.id, &ci), KVEDGE_ENOTFOUND);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 0);
    assert_int_equal(st.bytes, 0);
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
    assert_int_equal(checked, 0);
    assert_int_equal(bad, 0);
    s_blob_free(&bf);
}

static void test_blob_damage_header(void **state)
{
    fx_t *fx = *state;
    blob_fx_t bf;
    s_blob_store(fx, &bf, false);
    kvedge_block_key_t k12 = s_key(&bf.c, 0, 12);
    s_damage_blob(fx, &k12, BLOB_HEADER_OFF); /* the record's header CRC fails */
    s_open(fx, NULL);

    /* Reads take only the value, which is intact (its xxh3 holds): every head is served. */
    for (int h = 0; h < BLOB_HEADS; h++)
        s_expect(fx->e, &bf.c, 0, (uint16_t)h, bf.blk[h], bf.len[h]);
    layer_ctx_t lc;
    assert_int_equal(s_blob_layer(fx, &bf, -1, &lc), BLOB_HEADS);
    assert_int_equal(s_stats(fx->e).corrupt, 0);

    /* The scrubber checks RocksDB's checksums on disk, though the reads left the value in the
     * cache: the damaged record is reported exactly once, as a record (KVEDGE_EIO), not as a
     * bad block, since a get serves it; with quarantine it is written again, not moved. */
    uint64_t checked, bad;
    verify_all_t va = {0};
    assert_int_equal(kvedge_engine_verify(fx->e, false, s_verify_all_cb, &va, &checked, &bad), 0);
    assert_int_equal(checked, BLOB_HEADS + 1);
    assert_int_equal(bad, 0);
    assert_int_equal(va.calls, 1);
    assert_memory_equal(&va.keys[0], &k12, sizeof k12);
    assert_int_equal(va.errs[0], KVEDGE_EIO);
    assert_int_equal(s_stats(fx->e).blocks, BLOB_HEADS + 1); /* reporting only */
    memset(&va, 0, sizeof va);
    assert_int_equal(kvedge_engine_verify(fx->e, true, s_verify_all_cb, &va, &checked, &bad), 0);
    assert_int_equal(bad, 0);
    assert_int_equal(va.calls, 1);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.corrupt, 0);
    assert_int_equal(st.blocks, BLOB_HEADS + 1);
    assert_int_equal(st.bytes, bf.total);
    memset(&va, 0, sizeof va);
    assert_int_equal(kvedge_engine_verify(fx->e, false, s_verify_all_cb, &va, &checked, &bad), 0);
    assert_int_equal(checked, BLOB_HEADS + 1);
    assert_int_equal(bad, 0);
    assert_int_equal(va.calls, 0); /* the record was written again */
    /* The cache works again after the scrubs, and every head is still served. */
    for (int h = 0; h < BLOB_HEADS; h++)
        s_expect(fx->e, &bf.c, 0, (uint16_t)h, bf.blk[h], bf.len[h]);
    s_blob_free(&bf);
}

/* ---------------------------------------------------------------- the cache tier */

/* Every block of test_cache_sizes, read back one by one and by layer scans. */
static void s_expect_cache_set(fx_t *fx, const kvedge_chunk_info_t *cb,
                               const kvedge_chunk_info_t *cs, uint8_t **big, const size_t *blen,
                               uint8_t **small, const size_t *slen)
{
    for (int h = 0; h < HEADS; h++) {
        s_expect(fx->e, cb, 0, (uint16_t)h, big[h], blen[h]);
        s_expect(fx->e, cs, 1, (uint16_t)h, small[h], slen[h]);
    }
    layer_ctx_t lc = {.stop_at = -1};
    for (int h = 0; h < HEADS; h++) {
        lc.want[h] = big[h];
        lc.want_len[h] = blen[h];
    }
    assert_int_equal(kvedge_engine_get_layer(fx->e, &cb->id, 0, s_layer_cb, &lc), HEADS);
    memset(&lc, 0, sizeof lc);
    lc.stop_at = -1;
    for (int h = 0; h < HEADS; h++) {
        lc.want[h] = small[h];
        lc.want_len[h] = slen[h];
    }
    assert_int_equal(kvedge_engine_get_layer(fx->e, &cs->id, 1, s_layer_cb, &lc), HEADS);
}

/* No cache, a cache smaller than one block (nothing stays), the default: the same bytes come
 * back from the memtable, and after reopens from blob files (a miss, then a hit), with and
 * without atime refreshes, one by one and by layer scans, around a verify. */
static void test_cache_sizes(void **state)
{
    fx_t *fx = *state;
    static const uint64_t sizes[] = {0, 64 * 1024, KVEDGE_ENGINE_CACHE_BYTES_DEFAULT};
    kvedge_chunk_info_t cb = s_chunk(60, NULL, BLOB_TOKENS), cs = s_chunk(61, NULL, 8);
    strcpy(cb.model_id, BLOB_MODEL);
    uint8_t *big[HEADS], *small[HEADS];
    size_t blen[HEADS], slen[HEADS];
    for (int h = 0; h < HEADS; h++) {
        big[h] = s_block((uint64_t)(600 + h), BLOB_TOKENS, KVEDGE_SCHEME_LOSSLESS, &blen[h]);
        small[h] = s_block((uint64_t)(620 + h), 8, KVEDGE_SCHEME_LOSSLESS, &slen[h]);
        assert_true(blen[h] > 64 * 1024);
        assert_true(slen[h] < KVEDGE_ENGINE_BLOB_MIN_BYTES_DEFAULT); /* inline in the table */
    }
    kvedge_model_t bm = {BLOB_MODEL, 2, BLOB_HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        snprintf(fx->path, sizeof fx->path, "%s/store-%zu", fx->dir, i);
        kvedge_engine_opts_t o = kt_fx_opts(fx);
        o.cache_bytes = sizes[i];
        fx->now = 1000;
        s_open(fx, &o);
        assert_int_equal(kvedge_engine_put_model(fx->e, &bm), 0);
        for (int h = 0; h < HEADS; h++) {
            assert_int_equal(kvedge_engine_put(fx->e, &cb, 0, (uint16_t)h, big[h], blen[h], NULL),
                             0);
            assert_int_equal(kvedge_engine_put(fx->e, &cs, 1, (uint16_t)h, small[h], slen[h], NULL),
                             0);
        }
        s_expect_cache_set(fx, &cb, &cs, big, blen, small, slen);
        for (int round = 0; round < 2; round++) {
            kvedge_engine_destroy(&fx->e);
            s_open(fx, &o);
            fx->now += 5000; /* the first pass refreshes every atime, the second does not */
            for (int pass = 0; pass < 2; pass++)
                s_expect_cache_set(fx, &cb, &cs, big, blen, small, slen);
            kvedge_block_meta_t m;
            kvedge_block_key_t k = s_key(&cb, 0, 1);
            assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), 0);
            assert_int_equal(m.atime_ms, fx->now);
            uint64_t checked, bad;
            assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad), 0);
            assert_int_equal(checked, 2 * HEADS);
            assert_int_equal(bad, 0);
            s_expect_cache_set(fx, &cb, &cs, big, blen, small, slen);
        }
        kvedge_engine_stats_t st = s_stats(fx->e);
        assert_int_equal(st.corrupt, 0);
        assert_int_equal(st.blocks, 2 * HEADS);
        kvedge_engine_destroy(&fx->e);
    }
    for (int h = 0; h < HEADS; h++) {
        free(big[h]);
        free(small[h]);
    }
}

/* A get that refreshes atime rewrites the meta and the LRU entry only: the bytes it returns,
 * and those of every get after it, are the block's; a value held across a refresh stays. */
static void test_atime_refresh_reads(void **state)
{
    fx_t *fx = *state;
    blob_fx_t bf;
    s_blob_store(fx, &bf, false); /* every block at t = 1000, in blob files */
    s_open(fx, NULL);
    kvedge_block_key_t k3 = s_key(&bf.c, 0, 3);
    kvedge_block_meta_t m0, m;
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k3, &m0), 0);
    assert_int_equal(m0.atime_ms, 1000);

    fx->now = 5000;
    s_expect(fx->e, &bf.c, 0, 3, bf.blk[3], bf.len[3]); /* refreshes */
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k3, &m), 0);
    assert_int_equal(m.atime_ms, 5000);
    assert_int_equal(m.checksum, m0.checksum);
    assert_int_equal(m.bytes, m0.bytes);
    assert_int_equal(m.created_ms, 1000);
    fx->now = 5500; /* within the granularity */
    s_expect(fx->e, &bf.c, 0, 3, bf.blk[3], bf.len[3]);
    assert_int_equal(kvedge_engine_get_meta(fx->e, &k3, &m), 0);
    assert_int_equal(m.atime_ms, 5000);

    fx->now = 6000;
    kvedge_value_t held;
    assert_int_equal(kvedge_engine_get(fx->e, &k3, &held), 0); /* refreshes */
    /* A layer scan refreshes each head the same way. */
    fx->now = 8000;
    layer_ctx_t lc;
    assert_int_equal(s_blob_layer(fx, &bf, -1, &lc), BLOB_HEADS);
    for (int h = 0; h < BLOB_HEADS; h++) {
        kvedge_block_key_t k = s_key(&bf.c, 0, (uint16_t)h);
        assert_int_equal(kvedge_engine_get_meta(fx->e, &k, &m), 0);
        assert_int_equal(m.atime_ms, 8000);
    }
    fx->now = 10000;
    kvedge_value_t v;
    assert_int_equal(kvedge_engine_get(fx->e, &k3, &v), 0); /* refreshes */
    assert_int_equal(v.len, bf.len[3]);
    assert_memory_equal(v.data, bf.blk[3], bf.len[3]);
    assert_int_equal(held.len, bf.len[3]);
    assert_memory_equal(held.data, bf.blk[3], bf.len[3]);
    kvedge_value_release(&v);
    kvedge_value_release(&held);
    s_expect(fx->e, &bf.c, 0, 3, bf.blk[3], bf.len[3]);

    /* Each refresh moved the LRU entry: eviction down to one block keeps k3, the newest. */
    uint64_t n, bytes;
    assert_int_equal(kvedge_engine_evict(fx->e, bf.len[3], &n, &bytes), 0);
    assert_int_equal(n, BLOB_HEADS);
    assert_int_equal(bytes, bf.total - bf.len[3]);
    s_expect(fx->e, &bf.c, 0, 3, bf.blk[3], bf.len[3]);
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.blocks, 1);
    assert_int_equal(st.corrupt, 0);
    s_blob_free(&bf);
}

/* Total bytes of the store's MANIFEST files: they grow when a flush is installed. */
static long s_manifest_bytes(fx_t *fx)
{
    DIR *d = opendir(fx->path);
    assert_non_null(d);
    long total = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, "MANIFEST-", 9) != 0)
            continue;
        char path[512];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", fx->path, de->d_name);
        if (stat(path, &st) == 0)
            total += (long)st.st_size;
    }
    closedir(d);
    return total;
}

typedef struct {
    fx_t *fx;
    long before;
} s_manifest_ctx_t;

/* Whether the engine's MANIFEST has grown: a flush has been installed. */
static bool s_manifest_grew(void *arg)
{
    s_manifest_ctx_t *x = arg;
    return s_manifest_bytes(x->fx) != x->before;
}

/* Puts other blocks (the blob model's, chunk tags from 100) until the blocks family's
 * memtable has been flushed, without closing: waits for the flush to be installed. */
static void s_flush_by_filling(fx_t *fx, const blob_fx_t *bf)
{
    long before = s_manifest_bytes(fx);
    size_t put = 0;
    for (int tag = 100; tag < 250 && s_manifest_bytes(fx) == before; tag++) {
        kvedge_chunk_info_t c = s_chunk((uint8_t)tag, NULL, BLOB_TOKENS);
        strcpy(c.model_id, BLOB_MODEL);
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < BLOB_HEADS; h++) {
                assert_int_equal(kvedge_engine_put(fx->e, &c, (uint16_t)l, (uint16_t)h, bf->blk[h],
                                                   bf->len[h], NULL),
                                 0);
                put += bf->len[h];
            }
        /* Past the default 64 MiB write buffer, a flush is under way: wait for it. */
        s_manifest_ctx_t mc = {fx, before};
        if (put > (80u << 20))
            kt_poll(s_manifest_grew, &mc, 30000);
    }
    assert_true(s_manifest_bytes(fx) > before);
}

/* A value read into the cache, then rewritten behind the engine (kvedge_engine_debug_put_raw)
 * with damaged bytes: the damage is found whether the rewrite is read from the memtable, from
 * a blob file flushed in the same session (the cache is keyed by blob file and offset, so the
 * stale cached value is never served), or after a reopen. */
static void test_cache_rewrite_detected(void **state)
{
    fx_t *fx = *state;
    blob_fx_t bf;
    s_blob_store(fx, &bf, false);
    s_open(fx, NULL);
    static const uint16_t heads[3] = {2, 5, 7};
    uint8_t *bad[3];
    for (int i = 0; i < 3; i++) {
        uint16_t h = heads[i];
        bad[i] = malloc(bf.len[h]);
        assert_non_null(bad[i]);
        memcpy(bad[i], bf.blk[h], bf.len[h]);
        bad[i][bf.len[h] / 2] ^= 0x20;
        s_expect(fx->e, &bf.c, 0, h, bf.blk[h], bf.len[h]); /* read from disk, cached */
        s_expect(fx->e, &bf.c, 0, h, bf.blk[h], bf.len[h]); /* from the cache */
    }
    kvedge_block_key_t k2 = s_key(&bf.c, 0, 2), k5 = s_key(&bf.c, 0, 5), k7 = s_key(&bf.c, 0, 7);

    /* In the memtable. */
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k2, bad[0], bf.len[2]), 0);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 2), KVEDGE_ECORRUPT);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 2), KVEDGE_ENOTFOUND);

    /* In a blob file flushed in this session (and put into the cache by the flush). */
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k5, bad[1], bf.len[5]), 0);
    s_flush_by_filling(fx, &bf);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 5), KVEDGE_ECORRUPT);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 5), KVEDGE_ENOTFOUND);

    /* In a blob file written by the close, read after a reopen. */
    assert_int_equal(kvedge_engine_debug_put_raw(fx->e, &k7, bad[2], bf.len[7]), 0);
    kvedge_engine_destroy(&fx->e);
    s_open(fx, NULL);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 7), KVEDGE_ECORRUPT);
    assert_int_equal(s_get_rc(fx->e, &bf.c, 0, 7), KVEDGE_ENOTFOUND);

    /* Each reported once (this session counts one), quarantined, the rest served. */
    kvedge_engine_stats_t st = s_stats(fx->e);
    assert_int_equal(st.corrupt, 1);
    assert_int_equal(st.quarantined, 3);
    for (int h = 0; h < BLOB_HEADS; h++)
        if (h != 2 && h != 5 && h != 7)
            s_expect(fx->e, &bf.c, 0, (uint16_t)h, bf.blk[h], bf.len[h]);
    uint64_t checked, bad_n;
    assert_int_equal(kvedge_engine_verify(fx->e, false, NULL, NULL, &checked, &bad_n), 0);
    assert_int_equal(bad_n, 0);
    assert_int_equal(checked, st.blocks);
    for (int i = 0; i < 3; i++)
        free(bad[i]);
    s_blob_free(&bf);
}

typedef struct {
    int wide, tenants;
    bool saw_a;
} s_model_count_t;

static int s_count_wide(void *ctx, const kvedge_model_t *m)
{
    (void)m;
    ((s_model_count_t *)ctx)->wide++;
    return 0;
}

static int s_count_all(void *ctx, const uint8_t *tenant, const kvedge_model_t *m)
{
    s_model_count_t *c = ctx;
    static const uint8_t a[16] = {0xa};
    if (!tenant)
        c->wide++;
    else
        c->tenants++;
    c->saw_a |= tenant && memcmp(tenant, a, 16) == 0 && strcmp(m->id, "x") == 0 && m->layers == 2;
    return 0;
}

/* Registered model ids live per tenant namespace: two tenants bind one id to two shapes and
 * store blocks of each; node-wide records (and a store's records in the layout from before
 * namespaces) bind their id for every tenant; built-in ids keep their shape everywhere. */
static void test_model_namespaces(void **state)
{
    fx_t *fx = *state;
    s_open(fx, NULL);
    const uint8_t a[16] = {0xa}, b[16] = {0xb}, c[16] = {0xc}, zero[16] = {0};
    kvedge_model_t s1 = {"x", 2, 2, HEAD_DIM, KVEDGE_DTYPE_FP16};
    kvedge_model_t s2 = {"x", 1, 1, HEAD_DIM, KVEDGE_DTYPE_FP16}, got;
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, a, &s1), 0);
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, b, &s2), 0);
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, b, &s1), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, a, &s1), 0);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, a, "x", &got), 0);
    assert_int_equal(got.layers, 2);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, b, "x", &got), 0);
    assert_int_equal(got.layers, 1);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, c, "x", &got), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, zero, "x", &got), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_engine_get_model(fx->e, "x", &got), KVEDGE_ENOMODEL);

    /* Blocks are checked against the shape of the chunk's tenant. */
    size_t len;
    uint8_t *blk = s_block(71, 16, KVEDGE_SCHEME_LOSSLESS, &len);
    kvedge_chunk_info_t ca = s_chunk(70, NULL, 16), cb = ca;
    strcpy(ca.model_id, "x");
    strcpy(cb.model_id, "x");
    memcpy(ca.tenant, a, 16);
    memcpy(cb.tenant, b, 16);
    cb.id.bytes[0] ^= 1; /* namespaced ids differ */
    assert_int_equal(kvedge_engine_put(fx->e, &ca, 1, 1, blk, len, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &cb, 0, 0, blk, len, NULL), 0);
    assert_int_equal(kvedge_engine_put(fx->e, &cb, 1, 0, blk, len, NULL), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_engine_put(fx->e, &cb, 0, 1, blk, len, NULL), KVEDGE_ESHAPE);
    s_expect(fx->e, &ca, 1, 1, blk, len);
    s_expect(fx->e, &cb, 0, 0, blk, len);

    /* A node-wide record binds its id for every tenant. */
    kvedge_model_t wide = {MODEL, LAYERS, HEADS, HEAD_DIM, KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, c, MODEL, &got), 0);
    assert_int_equal(got.layers, LAYERS);
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, c, &wide), 0);
    wide.layers = 1;
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, c, &wide), KVEDGE_ESHAPE);
    /* Built-in ids: their shape for every tenant, registered node-wide. */
    kvedge_model_t opt;
    assert_int_equal(kvedge_model_builtin("opt-125m", &opt), 0);
    kvedge_model_t fake = opt;
    fake.kv_heads = 1;
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, a, &fake), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, a, &opt), 0);
    assert_int_equal(kvedge_engine_get_model(fx->e, "opt-125m", &got), 0);
    assert_int_equal(got.kv_heads, opt.kv_heads);
    /* A later node-wide record of a tenant's id leaves the tenant its own shape. */
    kvedge_model_t s3 = {"x", 3, 1, HEAD_DIM, KVEDGE_DTYPE_FP16};
    assert_int_equal(kvedge_engine_put_model(fx->e, &s3), 0);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, a, "x", &got), 0);
    assert_int_equal(got.layers, 2);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, c, "x", &got), 0);
    assert_int_equal(got.layers, 3);

    /* A record in the layout of a store from before namespaces (the bare id as its key) is
     * node-wide, after a reopen too. */
    kvedge_model_t legacy = {"legacy", 2, 3, HEAD_DIM, KVEDGE_DTYPE_BF16};
    uint8_t rec[KVEDGE_MODEL_RECORD_BYTES];
    kvedge_model_pack(&legacy, rec);
    assert_int_equal(kvedge_engine_debug_put_model_record(fx->e, "legacy", 6, rec, sizeof rec), 0);
    kvedge_engine_destroy(&fx->e);
    s_open(fx, NULL);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, b, "legacy", &got), 0);
    assert_int_equal(got.kv_heads, 3);
    assert_int_equal(got.dtype, KVEDGE_DTYPE_BF16);
    assert_int_equal(kvedge_engine_get_model(fx->e, "legacy", &got), 0);
    legacy.kv_heads = 4;
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, a, &legacy), KVEDGE_ESHAPE);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, a, "x", &got), 0);
    assert_int_equal(got.layers, 2);

    /* Listing: node-wide records alone, or every record with its tenant. */
    s_model_count_t n = {0, 0, false};
    assert_int_equal(kvedge_engine_list_models(fx->e, s_count_wide, &n), 0);
    assert_int_equal(n.wide, 4); /* MODEL, opt-125m, x, legacy */
    n = (s_model_count_t){0, 0, false};
    assert_int_equal(kvedge_engine_list_tenant_models(fx->e, s_count_all, &n), 0);
    assert_int_equal(n.wide, 4);
    assert_int_equal(n.tenants, 2);
    assert_true(n.saw_a);
    /* A damaged tenant key is reported by the full walk; the node-wide walk never reaches it. */
    assert_int_equal(kvedge_engine_debug_put_model_record(fx->e, "\0ab", 3, rec, sizeof rec), 0);
    n = (s_model_count_t){0, 0, false};
    assert_int_equal(kvedge_engine_list_tenant_models(fx->e, s_count_all, &n), KVEDGE_ECORRUPT);
    assert_int_equal(kvedge_engine_list_models(fx->e, s_count_wide, &n), 0);
    assert_int_equal(kvedge_engine_put_tenant_model(fx->e, a, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_engine_get_tenant_model(fx->e, a, "", &got), KVEDGE_EINVAL);
    free(blk);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* First, while no RocksDB threads exist yet to be lost across fork(). */
        T(test_crash_durability),
        T(test_key_pack_and_degenerate),
        T(test_put_get_round_trip),
        T(test_layer_scan),
        T(test_reopen_keeps_data_and_totals),
        T(test_eviction_order),
        T(test_pinned_survive_eviction),
        T(test_ttl),
        T(test_corruption_quarantined),
        T(test_verify),
        T(test_put_errors_leave_data_intact),
        T(test_delete_chunk_descendants),
        T(test_find_chunk),
        T(test_read_only),
        T(test_second_open_is_busy),
        T(test_missing_dir),
        T(test_newer_format_refused),
        T(test_concurrent_puts_and_gets),
        T(test_blob_damage_read_only),
        T(test_blob_damage_get),
        T(test_blob_damage_layer),
        T(test_blob_damage_verify),
        T(test_blob_damage_delete_chunk),
        T(test_blob_damage_header),
        T(test_cache_sizes),
        T(test_atime_refresh_reads),
        T(test_cache_rewrite_detected),
        T(test_model_namespaces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
