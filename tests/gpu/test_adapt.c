/* The CUDA affine map (gpu/adapt.h) against its CPU reference on odd sizes, on a stream of its
 * own and on the default stream, and its argument errors. Exits 77 without a device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/adapt.h"
#include "gpu/gpu.h"
#include "gpu/stage.h"
#include "access/codec/error.h"
#include "access/codec/synth.h"

static void *s_up(const void *src, size_t n)
{
    void *d = NULL;
    assert_int_equal(kvedge_gpu_dev_alloc(n ? n : 4, &d), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_copy_h2d(d, src, n, NULL), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_stream_sync(NULL), KVEDGE_OK);
    return d;
}

static float *s_rand(kvedge_rng_t *r, size_t n)
{
    float *f = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(f);
    for (size_t i = 0; i < n; i++)
        f[i] = kvedge_rng_normal(r);
    return f;
}

static void s_case(uint32_t T, uint32_t din, uint32_t dout, kvedge_gpu_stream_t st, uint64_t seed)
{
    kvedge_rng_t r;
    kvedge_rng_seed(&r, seed);
    float *x = s_rand(&r, (size_t)T * din), *w = s_rand(&r, (size_t)(din + 1) * dout);
    float *cy = malloc(sizeof(float) * T * dout), *gy = malloc(sizeof(float) * T * dout);
    assert_true(cy && gy);
    const kvedge_adapt_args_t c = {x, w, T, din, dout, cy};
    assert_int_equal(kvedge_cpu_adapt(&c), KVEDGE_OK);
    void *dx = s_up(x, sizeof(float) * T * din), *dw = s_up(w, sizeof(float) * (din + 1) * dout);
    void *dy = NULL;
    assert_int_equal(kvedge_gpu_dev_alloc(sizeof(float) * T * dout, &dy), KVEDGE_OK);
    const kvedge_adapt_args_t g = {dx, dw, T, din, dout, dy};
    assert_int_equal(kvedge_gpu_adapt(&g, st), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_copy_d2h(gy, dy, sizeof(float) * T * dout, st), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_stream_sync(st), KVEDGE_OK);
    for (size_t i = 0; i < (size_t)T * dout; i++)
        assert_true(fabsf(gy[i] - cy[i]) <= KVEDGE_ADAPT_TOL * (1 + fabsf(cy[i])));
    kvedge_gpu_dev_free(dx);
    kvedge_gpu_dev_free(dw);
    kvedge_gpu_dev_free(dy);
    free(x);
    free(w);
    free(cy);
    free(gy);
}

static void test_adapt(void **state)
{
    (void)state;
    kvedge_gpu_stream_t st = NULL;
    assert_int_equal(kvedge_gpu_stream_new(&st), KVEDGE_OK);
    const uint32_t toks[] = {1, 3, 17, 257}, dins[] = {1, 7, 33, 192}, douts[] = {1, 5, 19, 128};
    uint64_t seed = 1;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++) {
                s_case(toks[a], dins[b], douts[c], (seed & 1) ? st : NULL, seed);
                seed++;
            }
    kvedge_gpu_stream_destroy(&st);
    /* Errors are the CPU path's, checked before anything runs. */
    kvedge_adapt_args_t bad = {NULL, NULL, 1, 1, 1, NULL};
    assert_int_equal(kvedge_gpu_adapt(&bad, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_adapt(NULL, NULL), KVEDGE_EINVAL);
}

int main(void)
{
    if (kvedge_gpu_device_count() == 0)
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adapt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
