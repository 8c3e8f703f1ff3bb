/* Chunk ids: known answers computed independently (Python's hashlib.blake2b), chain
 * properties, and argument errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "access/codec/chunk.h"
#include "access/codec/error.h"

static const uint8_t s_salt[] = "tenant-a";
#define SALT s_salt, sizeof s_salt - 1

/* Expected ids from: blake2b(digest_size=32) over tag|u32le len|bytes fields (domain
 * "kvedge.chunk.v1", salt, model, parent, tokens as u32le), see docs/block-format.md. */
static void test_known_answers(void **state)
{
    (void)state;
    const uint32_t tokens[] = {1, 2, 3, 50000, 7};
    kvedge_chunk_id_t ids[2];
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
    assert_int_equal(kvedge_chunk_chain(SALT, "opt-125m", tokens, 5, 4, ids, 2), 2);
    assert_string_equal(kvedge_chunk_id_hex(&ids[0], hex),
                        "fd436c2a3853c48cc772382a1e5d3bdbe165d24d839849fe8bfe00054f747e46");
    assert_string_equal(kvedge_chunk_id_hex(&ids[1], hex),
                        "d1d8f103063c0c7aaeb77079e26f73558a4c4cfd73fa0f99175d5708287cabd1");
}

static void test_chain_properties(void **state)
{
    (void)state;
    enum { N = 1000, C = 256 };
    static uint32_t a[N], b[N];
    for (uint32_t i = 0; i < N; i++)
        a[i] = b[i] = i * 2654435761u % 50272;
    kvedge_chunk_id_t ia[4], ib[4], ic[4], id[4];
    assert_int_equal(kvedge_chunk_chain(SALT, "opt-1.3b", a, N, C, ia, 4), 4);
    assert_int_equal(kvedge_chunk_chain(SALT, "opt-1.3b", b, N, C, ib, 4), 4);
    assert_memory_equal(ia, ib, sizeof ia); /* same prefix, same ids */

    b[600] ^= 1; /* in chunk 2: ids 0, 1 agree, 2 and 3 diverge */
    assert_int_equal(kvedge_chunk_chain(SALT, "opt-1.3b", b, N, C, ib, 4), 4);
    assert_memory_equal(&ia[0], &ib[0], 2 * sizeof ia[0]);
    assert_memory_not_equal(&ia[2], &ib[2], sizeof ia[2]);
    assert_memory_not_equal(&ia[3], &ib[3], sizeof ia[3]);

    const uint8_t other[] = "tenant-b";
    assert_int_equal(kvedge_chunk_chain(other, 8, "opt-1.3b", a, N, C, ic, 4), 4);
    for (int i = 0; i < 4; i++)
        assert_memory_not_equal(&ia[i], &ic[i], sizeof ia[i]);
    assert_int_equal(kvedge_chunk_chain(SALT, "opt-125m", a, N, C, id, 4), 4);
    assert_memory_not_equal(&ia[0], &id[0], sizeof ia[0]);

    /* A prefix of the sequence yields a prefix of the chain. */
    kvedge_chunk_id_t ie[2];
    assert_int_equal(kvedge_chunk_chain(SALT, "opt-1.3b", a, 512, C, ie, 2), 2);
    assert_memory_equal(ie, ia, sizeof ie);
    /* A partial last chunk differs from the full chunk that extends it. */
    assert_int_equal(kvedge_chunk_chain(SALT, "opt-1.3b", a, 700, C, ie, 2), 3);
    assert_int_equal(kvedge_chunk_chain(SALT, "opt-1.3b", a, 700, C, ic, 3), 3);
    assert_memory_not_equal(&ic[2], &ia[2], sizeof ic[2]);
    /* Counting without output, and the default chunk size. */
    assert_int_equal(kvedge_chunk_chain(SALT, "opt-1.3b", a, N, 0, NULL, 0), 4);
    assert_int_equal(kvedge_chunk_chain(NULL, 0, "opt-1.3b", a, 1, 0, ic, 1), 1);
}

static void test_errors_and_hex(void **state)
{
    (void)state;
    uint32_t t[4] = {1, 2, 3, 4};
    kvedge_chunk_id_t id;
    assert_int_equal(kvedge_chunk_id(NULL, 0, "", NULL, t, 4, &id), KVEDGE_EINVAL);
    assert_int_equal(kvedge_chunk_id(NULL, 0, "m", NULL, t, 0, &id), KVEDGE_EINVAL);
    assert_int_equal(kvedge_chunk_id(NULL, 3, "m", NULL, t, 4, &id), KVEDGE_EINVAL);
    uint8_t salt[KVEDGE_SALT_MAX_BYTES + 1] = {0};
    assert_int_equal(kvedge_chunk_id(salt, sizeof salt, "m", NULL, t, 4, &id), KVEDGE_ETOOBIG);
    char model[KVEDGE_MODEL_ID_MAX_BYTES + 2];
    memset(model, 'x', sizeof model - 1);
    model[sizeof model - 1] = '\0';
    assert_int_equal(kvedge_chunk_id(NULL, 0, model, NULL, t, 4, &id), KVEDGE_ETOOBIG);
    assert_int_equal(kvedge_chunk_chain(NULL, 0, "m", t, 4, KVEDGE_CHUNK_TOKENS_MAX + 1, &id, 1),
                     KVEDGE_ETOOBIG);
    assert_int_equal(kvedge_chunk_chain(NULL, 0, "", t, 4, 0, NULL, 0), KVEDGE_EINVAL);

    assert_int_equal(kvedge_chunk_id(NULL, 0, "m", NULL, t, 4, &id), 0);
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
    kvedge_chunk_id_t back;
    assert_int_equal(kvedge_chunk_id_parse(kvedge_chunk_id_hex(&id, hex), &back), 0);
    assert_memory_equal(&id, &back, sizeof id);
    hex[10] = 'g';
    assert_int_equal(kvedge_chunk_id_parse(hex, &back), KVEDGE_EINVAL);
    assert_int_equal(kvedge_chunk_id_parse("abcd", &back), KVEDGE_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answers),
        cmocka_unit_test(test_chain_properties),
        cmocka_unit_test(test_errors_and_hex),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
