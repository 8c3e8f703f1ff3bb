/* CPU dequantizer of gpu/dequant.h: bit-exact against kvedge_block_decode over every source
 * dtype x scheme x mask x output dtype x layout (page sizes 1, 3, 7, 16, 17), untouched bytes
 * outside the blocks, argument errors that write nothing, and 0- and 1-token blocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/dequant.h"
#include "gpu/gpu.h"
#include "access/codec/error.h"
#include "access/codec/quant.h"
#include "tests/gpu/gpu_testutil.h"

static const uint32_t s_pages[] = {0, 1, 3, 7, 16, 17}; /* 0: contiguous */

/* Decodes every block with kvedge_block_decode and compares each row of K and V in the
 * destinations bit for bit; then checks every other byte still holds the 0xA5 fill. Returns
 * the number of rows compared. */
static uint32_t s_check_layer(const gt_layer_t *L, const kvedge_kv_dst_t *kd,
                              const kvedge_kv_dst_t *vd)
{
    const uint32_t D = kd->head_dim;
    const size_t oes = kvedge_dtype_size(kd->dtype), row = (size_t)D * oes;
    size_t written = 0;
    uint32_t rows = 0;
    for (uint32_t i = 0; i < GT_BLOCKS; i++) {
        const kvedge_dequant_block_t *b = &L->desc[i];
        uint8_t *k = malloc(b->tokens * row), *v = malloc(b->tokens * row);
        assert_non_null(k);
        assert_non_null(v);
        assert_int_equal(kvedge_block_decode(&L->info[i], kd->dtype, k, v), KVEDGE_OK);
        float f[KVEDGE_BLOCK_MAX_HEAD_DIM];
        for (uint32_t t = 0; t < b->tokens; t++) {
            const uint8_t *kr = gt_row(kd, b->head, b->offset + t);
            const uint8_t *vr = gt_row(vd, b->head, b->offset + t);
            assert_memory_equal(kr, k + t * row, row);
            assert_memory_equal(vr, v + t * row, row);
            kvedge_convert_to_f32(kd->dtype, kr, D, f);
            for (uint32_t c = 0; c < D; c++)
                assert_false(isnan(f[c]));
            if (b->masked)
                for (uint32_t c = 0; c < D; c++)
                    if (!((b->key_mask[c >> 3] >> (c & 7)) & 1u))
                        assert_true(f[c] == 0.0f && !signbit(f[c]));
            rows++;
        }
        written += (size_t)b->tokens * row;
        free(k);
        free(v);
    }
    size_t untouched_k = 0, untouched_v = 0;
    for (size_t i = 0; i < kd->cap_bytes; i++)
        untouched_k += ((const uint8_t *)kd->base)[i] == 0xA5;
    for (size_t i = 0; i < vd->cap_bytes; i++)
        untouched_v += ((const uint8_t *)vd->base)[i] == 0xA5;
    /* A written byte may happen to be 0xA5, so the bound is one-sided; the exact rows above
     * and the count below together catch writes outside the blocks' rows. */
    assert_true(untouched_k >= kd->cap_bytes - written);
    assert_true(untouched_v >= vd->cap_bytes - written);
    return rows;
}

static void s_sweep(kvedge_dtype_t src, kvedge_scheme_t scheme, uint16_t group, bool lz4)
{
    static const uint16_t dims[] = {64, 128, 65};
    static const kvedge_dtype_t outs[] = {KVEDGE_DTYPE_FP16, KVEDGE_DTYPE_BF16, KVEDGE_DTYPE_FP32};
    uint32_t rows = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        for (int masked = 0; masked <= 1; masked++) {
            gt_shape_t sh = {src, scheme, dims[di], group, masked, lz4, {37, 20}};
            gt_layer_t L;
            assert_int_equal(gt_layer_make(&sh, 1000 + di * 7 + (uint64_t)masked, &L), 0);
            for (size_t oi = 0; oi < 3; oi++) {
                for (size_t pi = 0; pi < sizeof s_pages / sizeof s_pages[0]; pi++) {
                    kvedge_dequant_args_t a = {L.desc, GT_BLOCKS, {0}, {0}};
                    assert_int_equal(gt_dst_make(outs[oi], dims[di], L.total_tokens, s_pages[pi],
                                                 pi * 11 + oi, &a.k),
                                     0);
                    assert_int_equal(gt_dst_make(outs[oi], dims[di], L.total_tokens, s_pages[pi],
                                                 pi * 13 + oi + 1, &a.v),
                                     0);
                    assert_int_equal(kvedge_cpu_dequant(&a), KVEDGE_OK);
                    rows += s_check_layer(&L, &a.k, &a.v);
                    gt_dst_free(&a.k);
                    gt_dst_free(&a.v);
                }
            }
            gt_layer_free(&L);
        }
    }
    assert_int_equal(rows, 3u * 2u * 3u * 6u * GT_HEADS_USED * (37u + 20u));
}

static void test_lossless(void **state)
{
    (void)state;
    s_sweep(KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, 0, false);
    s_sweep(KVEDGE_DTYPE_BF16, KVEDGE_SCHEME_LOSSLESS, 0, true);
    s_sweep(KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_LOSSLESS, 0, false);
}

static void test_int8(void **state)
{
    (void)state;
    s_sweep(KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, 0, false);
    s_sweep(KVEDGE_DTYPE_BF16, KVEDGE_SCHEME_INT8, 16, true);
    s_sweep(KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_INT8, 0, false);
}

static void test_int4(void **state)
{
    (void)state;
    s_sweep(KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT4, 32, false);
    s_sweep(KVEDGE_DTYPE_BF16, KVEDGE_SCHEME_INT4, 7, true);
    s_sweep(KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_INT4, 0, false);
}

/* The generic loops (no AVX2) must give the same bits too: the decoder picks its kernels at
 * run time and so does the reference, but each must agree with the other on every machine. */
static void test_generic_kernels(void **state)
{
    (void)state;
    int was = kvedge_quant_simd(-1);
    kvedge_quant_simd(0);
    s_sweep(KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT4, 32, false);
    s_sweep(KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_LOSSLESS, 0, false);
    if (was)
        kvedge_quant_simd(1);
}

/* Sets up a valid int4 paged call; each error case mutates a copy of it. */
typedef struct {
    gt_layer_t L;
    kvedge_dequant_block_t blocks[GT_BLOCKS];
    kvedge_dequant_args_t a;
    uint8_t *snap_k, *snap_v;
} s_fixture_t;

static void s_fixture(s_fixture_t *f)
{
    gt_shape_t sh = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT4, 64, 32, true, false, {37, 20}};
    assert_int_equal(gt_layer_make(&sh, 77, &f->L), 0);
    memcpy(f->blocks, f->L.desc, sizeof f->blocks);
    memset(&f->a, 0, sizeof f->a);
    f->a.blocks = f->blocks;
    f->a.n_blocks = GT_BLOCKS;
    assert_int_equal(gt_dst_make(KVEDGE_DTYPE_FP16, 64, f->L.total_tokens, 7, 5, &f->a.k), 0);
    assert_int_equal(gt_dst_make(KVEDGE_DTYPE_FP16, 64, f->L.total_tokens, 7, 6, &f->a.v), 0);
    f->snap_k = malloc(f->a.k.cap_bytes);
    f->snap_v = malloc(f->a.v.cap_bytes);
    memcpy(f->snap_k, f->a.k.base, f->a.k.cap_bytes);
    memcpy(f->snap_v, f->a.v.base, f->a.v.cap_bytes);
}

static void s_fixture_free(s_fixture_t *f)
{
    free(f->snap_k);
    free(f->snap_v);
    gt_dst_free(&f->a.k);
    gt_dst_free(&f->a.v);
    gt_layer_free(&f->L);
}

/* Runs the call and asserts the error and that neither destination changed. */
static void s_expect(const s_fixture_t *f, const kvedge_dequant_args_t *a, int err)
{
    assert_int_equal(kvedge_dequant_check(a), err);
    assert_int_equal(kvedge_cpu_dequant(a), err);
    assert_memory_equal(f->a.k.base, f->snap_k, f->a.k.cap_bytes);
    assert_memory_equal(f->a.v.base, f->snap_v, f->a.v.cap_bytes);
}

static void test_errors_write_nothing(void **state)
{
    (void)state;
    s_fixture_t f;
    s_fixture(&f);
    kvedge_dequant_args_t a;
    const uint32_t last = GT_BLOCKS - 1; /* damage the last block: earlier ones must not land */

    assert_int_equal(kvedge_cpu_dequant(NULL), KVEDGE_EINVAL);
    a = f.a;
    a.blocks = NULL;
    s_expect(&f, &a, KVEDGE_EINVAL);
    a = f.a;
    a.k.base = NULL;
    s_expect(&f, &a, KVEDGE_EINVAL);
    a = f.a; /* destination too small */
    a.v.cap_bytes -= 1;
    s_expect(&f, &a, KVEDGE_ENOSPACE);
    a = f.a; /* bad page ids */
    int32_t *table = (int32_t *)f.a.k.page_table;
    const int32_t saved = table[1];
    table[1] = (int32_t)f.a.k.num_pages;
    s_expect(&f, &a, KVEDGE_EINVAL);
    table[1] = -1;
    s_expect(&f, &a, KVEDGE_EINVAL);
    table[1] = saved;
    a = f.a; /* page table shorter than the positions written */
    a.k.table_len = (f.L.total_tokens - 1) / 7;
    s_expect(&f, &a, KVEDGE_ENOSPACE);
    a = f.a;
    a.k.page_table = NULL;
    s_expect(&f, &a, KVEDGE_EINVAL);
    a = f.a;
    a.k.page_size = 0;
    s_expect(&f, &a, KVEDGE_EINVAL);
    a = f.a;
    a.k.dtype = (kvedge_dtype_t)9;
    s_expect(&f, &a, KVEDGE_EINVAL);
    a = f.a;
    a.v.layout = (kvedge_kv_layout_t)5;
    s_expect(&f, &a, KVEDGE_EINVAL);
    a = f.a;
    a.n_blocks = KVEDGE_DEQUANT_MAX_BLOCKS + 1;
    s_expect(&f, &a, KVEDGE_EINVAL);

    /* Per-block damage. */
    f.blocks[last].head = GT_DST_HEADS;
    s_expect(&f, &f.a, KVEDGE_EINVAL);
    f.blocks[last] = f.L.desc[last];
    f.blocks[last].head_dim = 65;
    s_expect(&f, &f.a, KVEDGE_EINVAL);
    f.blocks[last] = f.L.desc[last];
    f.blocks[last].body_len += 4;
    s_expect(&f, &f.a, KVEDGE_EINVAL);
    f.blocks[last] = f.L.desc[last];
    f.blocks[last].body = (const uint8_t *)f.blocks[last].body + 2;
    s_expect(&f, &f.a, KVEDGE_EINVAL);
    f.blocks[last] = f.L.desc[last];
    f.blocks[last].body = NULL;
    s_expect(&f, &f.a, KVEDGE_EINVAL);
    f.blocks[last] = f.L.desc[last];
    f.blocks[last].key_channels -= 1; /* disagrees with the mask */
    s_expect(&f, &f.a, KVEDGE_EINVAL);
    f.blocks[last] = f.L.desc[last];
    f.blocks[last].key_mask[KVEDGE_BLOCK_MAX_HEAD_DIM / 8 - 1] = 0x80; /* bit past head_dim */
    s_expect(&f, &f.a, KVEDGE_EINVAL);
    f.blocks[last] = f.L.desc[last];
    f.blocks[last].scheme = (kvedge_scheme_t)3;
    s_expect(&f, &f.a, KVEDGE_EINVAL);
    f.blocks[last] = f.L.desc[last];
    f.blocks[last].offset = 1000; /* past the page table */
    s_expect(&f, &f.a, KVEDGE_ENOSPACE);
    f.blocks[last] = f.L.desc[last];

    /* Contiguous: offset past the capacity. */
    free(f.a.k.base);
    free((void *)f.a.k.page_table);
    assert_int_equal(gt_dst_make(KVEDGE_DTYPE_FP16, 64, f.L.total_tokens, 0, 1, &f.a.k), 0);
    free(f.snap_k);
    f.snap_k = malloc(f.a.k.cap_bytes);
    memcpy(f.snap_k, f.a.k.base, f.a.k.cap_bytes);
    f.blocks[last].offset = f.a.k.tokens_cap - f.blocks[last].tokens + 1;
    s_expect(&f, &f.a, KVEDGE_ENOSPACE);
    f.blocks[last].offset = f.a.k.tokens_cap - f.blocks[last].tokens; /* exactly fits */
    assert_int_equal(kvedge_cpu_dequant(&f.a), KVEDGE_OK);
    s_fixture_free(&f);
}

/* kvedge_dequant_block_init refuses what it cannot describe. */
static void test_block_init(void **state)
{
    (void)state;
    kvedge_block_info_t info;
    memset(&info, 0, sizeof info);
    kvedge_dequant_block_t b;
    uint8_t raw[4] = {0};
    assert_int_equal(kvedge_dequant_block_init(NULL, raw, 0, 0, &b), KVEDGE_EINVAL);
    assert_int_equal(kvedge_dequant_block_init(&info, NULL, 0, 0, &b), KVEDGE_EINVAL);
    assert_int_equal(kvedge_dequant_block_init(&info, raw, 0, 0, &b), KVEDGE_EINVAL); /* dtype 0 */
}

/* A 1-token block lands exactly; a 0-token block and an empty call write nothing. */
static void test_degenerate(void **state)
{
    (void)state;
    gt_shape_t sh = {KVEDGE_DTYPE_BF16, KVEDGE_SCHEME_INT4, 128, 32, true, false, {1, 1}};
    gt_layer_t L;
    assert_int_equal(gt_layer_make(&sh, 5, &L), 0);
    kvedge_dequant_args_t a = {L.desc, GT_BLOCKS, {0}, {0}};
    assert_int_equal(gt_dst_make(KVEDGE_DTYPE_FP16, 128, L.total_tokens, 3, 1, &a.k), 0);
    assert_int_equal(gt_dst_make(KVEDGE_DTYPE_FP16, 128, L.total_tokens, 3, 2, &a.v), 0);
    assert_int_equal(kvedge_cpu_dequant(&a), KVEDGE_OK);
    assert_int_equal(s_check_layer(&L, &a.k, &a.v), GT_BLOCKS);

    memset(a.k.base, 0xA5, a.k.cap_bytes);
    memset(a.v.base, 0xA5, a.v.cap_bytes);
    kvedge_dequant_block_t empty = L.desc[0];
    empty.tokens = 0;
    empty.body = NULL;
    empty.body_len = 0;
    a.blocks = &empty;
    a.n_blocks = 1;
    assert_int_equal(kvedge_cpu_dequant(&a), KVEDGE_OK);
    a.n_blocks = 0;
    a.blocks = NULL;
    assert_int_equal(kvedge_cpu_dequant(&a), KVEDGE_OK);
    for (size_t i = 0; i < a.k.cap_bytes; i++)
        assert_int_equal(((uint8_t *)a.k.base)[i], 0xA5);
    gt_dst_free(&a.k);
    gt_dst_free(&a.v);
    gt_layer_free(&L);
}

/* Without CUDA the GPU entry point says so instead of pretending. */
static void test_gpu_entry_without_cuda(void **state)
{
    (void)state;
    if (kvedge_gpu_built_with_cuda())
        skip();
    kvedge_dequant_args_t a;
    memset(&a, 0, sizeof a);
    assert_int_equal(kvedge_gpu_dequant(&a, NULL), KVEDGE_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lossless),
        cmocka_unit_test(test_int8),
        cmocka_unit_test(test_int4),
        cmocka_unit_test(test_generic_kernels),
        cmocka_unit_test(test_errors_write_nothing),
        cmocka_unit_test(test_block_init),
        cmocka_unit_test(test_degenerate),
        cmocka_unit_test(test_gpu_entry_without_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
