/* Staging API of gpu/stage.h on whichever path this machine has: round trip of a copy through
 * "device" memory from pinned memory, events and streams, NULL-safety and argument errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "gpu/gpu.h"
#include "gpu/stage.h"
#include "access/codec/error.h"

static void test_round_trip(void **state)
{
    (void)state;
    const size_t n = 1u << 20;
    kvedge_gpu_stream_t s = NULL;
    kvedge_gpu_event_t *e = NULL;
    uint8_t *host = NULL, *back = NULL;
    void *dev = NULL;
    assert_int_equal(kvedge_gpu_stage_on_device(), kvedge_gpu_device_count() > 0);
    assert_int_equal(kvedge_gpu_stream_new(&s), KVEDGE_OK);
    assert_non_null(s);
    assert_int_equal(kvedge_gpu_event_new(&e), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_event_query(e), 1); /* never recorded: complete */
    assert_int_equal(kvedge_gpu_host_alloc(n, (void **)&host), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_host_alloc(n, (void **)&back), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_dev_alloc(n, &dev), KVEDGE_OK);
    for (size_t i = 0; i < n; i++)
        host[i] = (uint8_t)(i * 31 + 7);
    memset(back, 0, n);
    assert_int_equal(kvedge_gpu_copy_h2d(dev, host, n, s), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_event_record(e, s), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_event_sync(e), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_event_query(e), 1);
    assert_int_equal(kvedge_gpu_stream_wait_event(NULL, e), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_copy_d2h(back, dev, n, s), KVEDGE_OK);
    assert_int_equal(kvedge_gpu_stream_sync(s), KVEDGE_OK);
    assert_memory_equal(host, back, n);
    assert_int_equal(kvedge_gpu_copy_h2d(dev, host, 0, s), KVEDGE_OK); /* nothing to copy */

    kvedge_gpu_dev_free(dev);
    kvedge_gpu_host_free(host);
    kvedge_gpu_host_free(back);
    kvedge_gpu_event_destroy(&e);
    assert_null(e);
    kvedge_gpu_event_destroy(&e); /* idempotent */
    kvedge_gpu_stream_destroy(&s);
    assert_null(s);
    kvedge_gpu_stream_destroy(&s);
    kvedge_gpu_stream_destroy(NULL);
    kvedge_gpu_event_destroy(NULL);
    kvedge_gpu_dev_free(NULL);
    kvedge_gpu_host_free(NULL);
}

static void test_errors(void **state)
{
    (void)state;
    void *p = (void *)&p;
    assert_int_equal(kvedge_gpu_stream_new(NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_event_new(NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_host_alloc(0, &p), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_host_alloc(8, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_dev_alloc(0, &p), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_copy_h2d(NULL, p, 8, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_copy_d2h(p, NULL, 8, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_event_record(NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_event_query(NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_event_sync(NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_gpu_stream_wait_event(NULL, NULL), KVEDGE_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
