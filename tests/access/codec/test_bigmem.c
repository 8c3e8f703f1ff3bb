/* kvedge_big_alloc (access/codec/bigmem.h): small sizes are plain allocations; big ones are 2 MiB
 * aligned, whole 2 MiB granules, usable to the last byte, and advised for transparent huge
 * pages where the kernel has them; sizes that cannot be rounded are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "access/codec/bigmem.h"

static void test_small_and_big(void **state)
{
    (void)state;
    uint8_t *z = kvedge_big_alloc(0); /* at least one byte */
    assert_non_null(z);
    z[0] = 7;
    free(z);
    uint8_t *s = kvedge_big_alloc(4096);
    assert_non_null(s);
    memset(s, 1, 4096);
    free(s);
    const size_t sizes[] = {KVEDGE_BIG_MIN, KVEDGE_BIG_MIN + 1, 3 * KVEDGE_BIG_PAGE + 12345};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *b = kvedge_big_alloc(sizes[i]);
        assert_non_null(b);
        assert_int_equal((uintptr_t)b % KVEDGE_BIG_PAGE, 0);
        memset(b, 0xa5, sizes[i]);
        assert_int_equal(b[sizes[i] - 1], 0xa5);
        free(b);
    }
    assert_null(kvedge_big_alloc(SIZE_MAX));
    assert_null(kvedge_big_alloc(SIZE_MAX - KVEDGE_BIG_PAGE / 2));
}

/* The kernel's mode of transparent huge pages, or NULL where it has none. */
static const char *s_thp_mode(char *buf, size_t len)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return NULL;
    const char *r = fgets(buf, (int)len, f);
    fclose(f);
    return r;
}

/* The THPeligible line of the /proc/self/smaps mapping that holds p: 1, 0, or -1 if absent. */
static int s_thp_eligible(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    int in = 0, got = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && sscanf(line, "THPeligible: %d", &got) == 1)
            break;
    }
    fclose(f);
    return got;
}

/* Where the kernel has transparent huge pages in "madvise" or "always" mode, a big buffer's
 * mapping is eligible for them. */
static void test_huge_page_advice(void **state)
{
    (void)state;
    char mode[256];
    if (!s_thp_mode(mode, sizeof mode) || strstr(mode, "[never]")) {
        skip(); /* no transparent huge pages here: the advice is refused, 4 KiB pages stay */
        return;
    }
    uint8_t *b = kvedge_big_alloc(8 * KVEDGE_BIG_PAGE);
    assert_non_null(b);
    memset(b, 1, 8 * KVEDGE_BIG_PAGE);
    const int eligible = s_thp_eligible(b);
    if (eligible < 0) {
        free(b);
        skip(); /* a kernel whose smaps has no THPeligible line */
        return;
    }
    assert_int_equal(eligible, 1); /* in "madvise" mode, only because of the advice */
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_and_big),
        cmocka_unit_test(test_huge_page_advice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
