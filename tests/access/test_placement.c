/* Placement: weighted rendezvous hashing is deterministic, spreads keys by weight, moves only
 * the keys a new node takes, skips nodes that are down or weigh nothing, and refuses bad
 * arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "access/placement.h"
#include "access/codec/error.h"

#define KEYS 4000

static kvedge_chunk_id_t s_key(uint32_t i)
{
    kvedge_chunk_id_t k;
    memset(&k, 0, sizeof k);
    for (int b = 0; b < 32; b++)
        k.bytes[b] = (uint8_t)((i * 2654435761u) >> (b % 4 * 8)) ^ (uint8_t)b;
    memcpy(k.bytes, &i, sizeof i);
    return k;
}

static void s_nodes(kvedge_place_node_t *n, size_t count, uint64_t weight)
{
    memset(n, 0, count * sizeof *n);
    for (size_t i = 0; i < count; i++) {
        snprintf(n[i].id, sizeof n[i].id, "cloud-%zu", i + 1);
        n[i].weight = weight;
        n[i].up = true;
    }
}

static void test_deterministic_and_rank_matches_pick(void **state)
{
    (void)state;
    kvedge_place_node_t n[5];
    s_nodes(n, 5, 1000);
    kvedge_chunk_id_t k = s_key(7);
    assert_true(kvedge_place_score(&k, "cloud-1", 1000) > 0.0);
    assert_true(kvedge_place_score(&k, "cloud-1", 1000) == kvedge_place_score(&k, "cloud-1", 1000));
    assert_true(kvedge_place_score(&k, "cloud-1", 0) == 0.0);
    uint32_t order[5], pick[3], got = 0;
    assert_int_equal(kvedge_place_rank(&k, n, 5, order), 0);
    for (int i = 1; i < 5; i++)
        assert_true(kvedge_place_score(&k, n[order[i - 1]].id, 1000) >=
                    kvedge_place_score(&k, n[order[i]].id, 1000));
    assert_int_equal(kvedge_place_pick(&k, n, 5, 3, pick, &got), 0);
    assert_int_equal(got, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(pick[i], order[i]);
    /* The node order in the input does not matter: the same ids win. */
    kvedge_place_node_t rev[5];
    for (int i = 0; i < 5; i++)
        rev[i] = n[4 - i];
    uint32_t pick2[3];
    assert_int_equal(kvedge_place_pick(&k, rev, 5, 3, pick2, &got), 0);
    for (int i = 0; i < 3; i++)
        assert_string_equal(rev[pick2[i]].id, n[pick[i]].id);
}

static void test_spread_follows_weight(void **state)
{
    (void)state;
    kvedge_place_node_t n[4];
    s_nodes(n, 4, 1000);
    n[3].weight = 2000; /* twice the capacity: about twice the keys */
    unsigned count[4] = {0};
    for (uint32_t i = 0; i < KEYS; i++) {
        kvedge_chunk_id_t k = s_key(i);
        uint32_t pick[1], got = 0;
        assert_int_equal(kvedge_place_pick(&k, n, 4, 1, pick, &got), 0);
        assert_int_equal(got, 1);
        count[pick[0]]++;
    }
    /* Expected shares 1/5, 1/5, 1/5, 2/5 of KEYS: within 15 % each. */
    for (int i = 0; i < 3; i++)
        assert_in_range(count[i], KEYS / 5 * 85 / 100, KEYS / 5 * 115 / 100);
    assert_in_range(count[3], KEYS * 2 / 5 * 85 / 100, KEYS * 2 / 5 * 115 / 100);
}

static void test_adding_a_node_moves_only_its_share(void **state)
{
    (void)state;
    kvedge_place_node_t n[5];
    s_nodes(n, 5, 1000);
    unsigned moved = 0, to_new = 0;
    for (uint32_t i = 0; i < KEYS; i++) {
        kvedge_chunk_id_t k = s_key(i);
        uint32_t before[2], after[2], got = 0;
        assert_int_equal(kvedge_place_pick(&k, n, 4, 2, before, &got), 0);
        assert_int_equal(got, 2);
        assert_int_equal(kvedge_place_pick(&k, n, 5, 2, after, &got), 0);
        for (int r = 0; r < 2; r++) {
            bool kept = after[r] == before[0] || after[r] == before[1];
            if (!kept) {
                moved++;
                to_new += after[r] == 4;
            }
        }
    }
    /* Every replica that moved moved to the new node; it takes about R/N = 2/5 of the keys. */
    assert_int_equal(moved, to_new);
    assert_in_range(moved, KEYS * 2 / 5 * 85 / 100, KEYS * 2 / 5 * 115 / 100);
}

static void test_down_and_weightless_nodes_are_skipped(void **state)
{
    (void)state;
    kvedge_place_node_t n[4];
    s_nodes(n, 4, 1000);
    kvedge_chunk_id_t k = s_key(3);
    uint32_t order[4], pick[4], got = 0;
    assert_int_equal(kvedge_place_rank(&k, n, 4, order), 0);
    n[order[0]].up = false; /* the first choice is down: the next ones replace it */
    n[order[2]].weight = 0; /* capacity 0: never chosen */
    assert_int_equal(kvedge_place_pick(&k, n, 4, 4, pick, &got), 0);
    assert_int_equal(got, 2);
    assert_int_equal(pick[0], order[1]);
    assert_int_equal(pick[1], order[3]);
    assert_int_equal(kvedge_place_replicas(0, 4), KVEDGE_PLACE_REPLICAS_DEFAULT);
    assert_int_equal(kvedge_place_replicas(0, 1), 1);
    assert_int_equal(kvedge_place_replicas(3, 2), 2);
    assert_int_equal(kvedge_place_replicas(0, 0), 1);
    assert_int_equal(kvedge_place_replicas(99, 100), KVEDGE_PLACE_MAX_REPLICAS);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    kvedge_place_node_t n[2];
    s_nodes(n, 2, 1);
    kvedge_chunk_id_t k = s_key(1);
    uint32_t out[2], got = 9;
    assert_int_equal(kvedge_place_pick(&k, n, 2, 0, out, &got), KVEDGE_EINVAL);
    assert_int_equal(kvedge_place_pick(&k, n, 2, KVEDGE_PLACE_MAX_REPLICAS + 1, out, &got),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_place_pick(NULL, n, 2, 1, out, &got), KVEDGE_EINVAL);
    assert_int_equal(kvedge_place_pick(&k, NULL, 2, 1, out, &got), KVEDGE_EINVAL);
    assert_int_equal(kvedge_place_rank(&k, n, KVEDGE_PLACE_MAX_NODES + 1, out), KVEDGE_EINVAL);
    assert_int_equal(kvedge_place_pick(&k, n, 0, 1, out, &got), 0);
    assert_int_equal(got, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic_and_rank_matches_pick),
        cmocka_unit_test(test_spread_follows_weight),
        cmocka_unit_test(test_adding_a_node_moves_only_its_share),
        cmocka_unit_test(test_down_and_weightless_nodes_are_skipped),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
