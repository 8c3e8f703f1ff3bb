/* CUDA dequantizer against the CPU reference (gpu/dequant.h): bit-exact over every source
 * dtype x scheme x mask x output dtype x layout (contiguous, page sizes 1, 3, 7, 16, 17), the
 * whole destination compared (untouched bytes included), both kernel paths in one call, more
 * calls in flight than pinned upload buffers. Exits 77 without a device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "gpu/dequant.h"
#include "gpu/gpu.h"
#include "gpu/stage.h"
#include "access/codec/error.h"
#include "tests/gpu/gpu_testutil.h"

/* Device copy of a host buffer. */
static void *s_upload(const void *src, size_t n)
{
    void *d = NULL;
    assert_int_equal(kvedge_gpu_dev_alloc(n, &d), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_copy_h2d(d, src, n, NULL), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_stream_sync(NULL), KVEDGE_OK);
    return d;
}

static void s_sweep(kvedge_dtype_t src, kvedge_scheme_t scheme, uint16_t group)
{
    static const uint16_t dims[] = {64, 128, 65};
    static const uint32_t pages[] = {0, 1, 3, 7, 16, 17};
    kvedge_gpu_stream_t st = NULL;
    assert_int_equal(kvedge_gpu_stream_new(&st), KVEDGE_OK);
    for (size_t di = 0; di < 3; di++)
        for (int masked = 0; masked <= 1; masked++) {
            gt_shape_t sh = {src, scheme, dims[di], group, masked, false, {37, 20}};
            gt_layer_t L;
            assert_int_equal(gt_layer_make(&sh, 500 + di + 10 * (uint64_t)masked, &L), 0);
            kvedge_dequant_block_t dev_blocks[GT_BLOCKS];
            void *bodies[GT_BLOCKS];
            for (int i = 0; i < GT_BLOCKS; i++) {
                dev_blocks[i] = L.desc[i];
                bodies[i] = s_upload(L.raw[i], L.desc[i].body_len);
                dev_blocks[i].body = bodies[i];
            }
            for (int out = KVEDGE_DTYPE_FP16; out <= KVEDGE_DTYPE_FP32; out++)
                for (size_t pi = 0; pi < 6; pi++) {
                    kvedge_dequant_args_t c = {L.desc, GT_BLOCKS, {0}, {0}};
                    assert_int_equal(gt_dst_make((kvedge_dtype_t)out, dims[di], L.total_tokens,
                                                 pages[pi], pi + 1, &c.k),
                                     0);
                    assert_int_equal(gt_dst_make((kvedge_dtype_t)out, dims[di], L.total_tokens,
                                                 pages[pi], pi + 2, &c.v),
                                     0);
                    kvedge_dequant_args_t g = c;
                    g.blocks = dev_blocks;
                    g.k.base = s_upload(c.k.base, c.k.cap_bytes); /* 0xA5 fill too */
                    g.v.base = s_upload(c.v.base, c.v.cap_bytes);
                    assert_int_equal(kvedge_cpu_dequant(&c), KVEDGE_OK);
                    assert_int_equal(kvedge_gpu_dequant(&g, st), KVEDGE_OK);
                    uint8_t *kb = malloc(c.k.cap_bytes), *vb = malloc(c.v.cap_bytes);
                    assert_int_equal(kvedge_gpu_copy_d2h(kb, g.k.base, c.k.cap_bytes, st), 0);
                    assert_int_equal(kvedge_gpu_copy_d2h(vb, g.v.base, c.v.cap_bytes, st), 0);
                    assert_int_equal(kvedge_gpu_stream_sync(st), KVEDGE_OK);
                    assert_memory_equal(kb, c.k.base, c.k.cap_bytes);
                    assert_memory_equal(vb, c.v.base, c.v.cap_bytes);
                    free(kb);
                    free(vb);
                    kvedge_gpu_dev_free(g.k.base);
                    kvedge_gpu_dev_free(g.v.base);
                    gt_dst_free(&c.k);
                    gt_dst_free(&c.v);
                }
            for (int i = 0; i < GT_BLOCKS; i++)
                kvedge_gpu_dev_free(bodies[i]);
            gt_layer_free(&L);
        }
    kvedge_gpu_stream_destroy(&st);
}

static void test_lossless(void **state)
{
    (void)state;
    for (int s = KVEDGE_DTYPE_FP16; s <= KVEDGE_DTYPE_FP32; s++)
        s_sweep((kvedge_dtype_t)s, KVEDGE_SCHEME_LOSSLESS, 0);
}

static void test_int8(void **state)
{
    (void)state;
    s_sweep(KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, 0);
    s_sweep(KVEDGE_DTYPE_BF16, KVEDGE_SCHEME_INT8, 16);
}

static void test_int4(void **state)
{
    (void)state;
    s_sweep(KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT4, 32);
    s_sweep(KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_INT4, 7);
    s_sweep(KVEDGE_DTYPE_BF16, KVEDGE_SCHEME_INT4, 0);
}

/* Bad arguments are refused on the host before anything reaches the device. */
static void test_errors(void **state)
{
    (void)state;
    gt_shape_t sh = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, 64, 0, false, false, {4, 4}};
    gt_layer_t L;
    assert_int_equal(gt_layer_make(&sh, 3, &L), 0);
    kvedge_dequant_args_t a = {L.desc, GT_BLOCKS, {0}, {0}};
    assert_int_equal(gt_dst_make(KVEDGE_DTYPE_FP16, 64, L.total_tokens, 3, 1, &a.k), 0);
    assert_int_equal(gt_dst_make(KVEDGE_DTYPE_FP16, 64, L.total_tokens, 3, 2, &a.v), 0);
    ((int32_t *)a.k.page_table)[0] = -1;
    assert_int_equal(kvedge_gpu_dequant(&a, NULL), KVEDGE_EINVAL);
    ((int32_t *)a.k.page_table)[0] = 0;
    a.v.cap_bytes--;
    assert_int_equal(kvedge_gpu_dequant(&a, NULL), KVEDGE_ENOSPACE);
    assert_int_equal(kvedge_gpu_dequant(NULL, NULL), KVEDGE_EINVAL);
    gt_dst_free(&a.k);
    gt_dst_free(&a.v);
    gt_layer_free(&L);
}

/* One call whose blocks take both kernel paths: bodies at 16-byte and at 4-byte aligned
 * addresses (int8 codes then miss their 8-byte alignment: the general path), masked and
 * unmasked; and more calls in flight on one stream than the launcher has pinned upload buffers
 * (the rest upload from pageable memory). Every result equals the CPU reference. */
static void test_mixed_paths(void **state)
{
    (void)state;
    kvedge_gpu_stream_t st = NULL;
    assert_int_equal(kvedge_gpu_stream_new(&st), KVEDGE_OK);
    for (int masked = 0; masked <= 1; masked++) {
        gt_shape_t sh = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, 128, 0, masked, false, {40, 33}};
        gt_layer_t L;
        assert_int_equal(gt_layer_make(&sh, 900 + (uint64_t)masked, &L), 0);
        kvedge_dequant_block_t dev_blocks[GT_BLOCKS];
        void *alloc[GT_BLOCKS];
        for (int i = 0; i < GT_BLOCKS; i++) {
            const size_t shift = (i % 2) ? 4 : 0;
            assert_int_equal(kvedge_gpu_dev_alloc(L.desc[i].body_len + 16, &alloc[i]), 0);
            assert_int_equal(kvedge_gpu_copy_h2d((uint8_t *)alloc[i] + shift, L.raw[i],
                                                 L.desc[i].body_len, NULL),
                             0);
            dev_blocks[i] = L.desc[i];
            dev_blocks[i].body = (uint8_t *)alloc[i] + shift;
        }
        assert_int_equal(kvedge_gpu_stream_sync(NULL), KVEDGE_OK);
        kvedge_dequant_args_t c = {L.desc, GT_BLOCKS, {0}, {0}};
        assert_int_equal(gt_dst_make(KVEDGE_DTYPE_BF16, 128, L.total_tokens, 16, 5, &c.k), 0);
        assert_int_equal(gt_dst_make(KVEDGE_DTYPE_BF16, 128, L.total_tokens, 16, 6, &c.v), 0);
        kvedge_dequant_args_t g = c;
        g.blocks = dev_blocks;
        g.k.base = s_upload(c.k.base, c.k.cap_bytes);
        g.v.base = s_upload(c.v.base, c.v.cap_bytes);
        assert_int_equal(kvedge_cpu_dequant(&c), KVEDGE_OK);
        for (int r = 0; r < 20; r++) /* 20 in flight, 8 pinned upload buffers */
            assert_int_equal(kvedge_gpu_dequant(&g, st), KVEDGE_OK);
        uint8_t *kb = malloc(c.k.cap_bytes), *vb = malloc(c.v.cap_bytes);
        assert_int_equal(kvedge_gpu_copy_d2h(kb, g.k.base, c.k.cap_bytes, st), 0);
        assert_int_equal(kvedge_gpu_copy_d2h(vb, g.v.base, c.v.cap_bytes, st), 0);
        assert_int_equal(kvedge_gpu_stream_sync(st), KVEDGE_OK);
        assert_memory_equal(kb, c.k.base, c.k.cap_bytes);
        assert_memory_equal(vb, c.v.base, c.v.cap_bytes);
        free(kb);
        free(vb);
        kvedge_gpu_dev_free(g.k.base);
        kvedge_gpu_dev_free(g.v.base);
        gt_dst_free(&c.k);
        gt_dst_free(&c.v);
        for (int i = 0; i < GT_BLOCKS; i++)
            kvedge_gpu_dev_free(alloc[i]);
        gt_layer_free(&L);
    }
    kvedge_gpu_stream_destroy(&st);
}

int main(void)
{
    if (kvedge_gpu_device_count() == 0)
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lossless), cmocka_unit_test(test_int8),
        cmocka_unit_test(test_int4),     cmocka_unit_test(test_mixed_paths),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
