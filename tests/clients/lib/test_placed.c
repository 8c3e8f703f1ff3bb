/* The placed writer (clients/lib/placed.h) against in-process store nodes: its placement is
 * access/placement.h's, it puts every block on each replica and on no other node, W decides
 * whether a replica that cannot be reached fails the write, and bad input is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "access/codec/error.h"
#include "access/codec/synth.h"
#include "access/placement.h"
#include "clients/lib/kvedge.h"
#include "store/node/node.h"
#include "tests/common/testutil.h"

#define S_NODES 3

typedef struct {
    char root[64];
    kvedge_node_t *node[S_NODES];
    kvedge_placed_node_t tier[S_NODES + 1]; /* the last: an endpoint nobody serves */
} s_world_t;

static void s_start(s_world_t *w)
{
    memset(w, 0, sizeof *w);
    snprintf(w->root, sizeof w->root, "/tmp/kvedge-placed-XXXXXX");
    assert_non_null(mkdtemp(w->root));
    for (int i = 0; i <= S_NODES; i++) {
        kvedge_placed_node_t *t = &w->tier[i];
        snprintf(t->id, sizeof t->id, "n%d", i);
        snprintf(t->endpoint, sizeof t->endpoint, "ipc://%s/n%d.sock", w->root, i);
        t->weight = 1u << 30;
        t->up = true;
        if (i == S_NODES)
            break;
        kvedge_node_settings_t ns;
        kvedge_node_settings_default(&ns);
        snprintf(ns.metrics, sizeof ns.metrics, "off");
        ns.role = KVEDGE_ROLE_CLOUD;
        ns.insecure = true;
        ns.workers = 2;
        snprintf(ns.data, sizeof ns.data, "%s/n%d", w->root, i);
        snprintf(ns.bind, sizeof ns.bind, "%s", t->endpoint);
        char why[256];
        if (kvedge_node_start(&ns, &w->node[i], why, sizeof why) != KVEDGE_OK)
            fail_msg("node %d: %s", i, why);
    }
}

static void s_stop(s_world_t *w)
{
    for (int i = S_NODES; i-- > 0;)
        kvedge_node_destroy(&w->node[i]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", w->root);
    assert_int_equal(system(cmd), 0);
}

static kvedge_chunk_id_t s_key(uint8_t seed)
{
    kvedge_chunk_id_t k;
    for (size_t i = 0; i < sizeof k.bytes; i++)
        k.bytes[i] = (uint8_t)(seed * 31 + i);
    return k;
}

/* Degenerate input: never a crash, the right code. */
static void test_refusals(void **state)
{
    (void)state;
    kvedge_placed_node_t nodes[2];
    memset(nodes, 0, sizeof nodes);
    for (int i = 0; i < 2; i++) {
        snprintf(nodes[i].id, sizeof nodes[i].id, "n%d", i);
        snprintf(nodes[i].endpoint, sizeof nodes[i].endpoint, "ipc:///nonexistent/n%d", i);
        nodes[i].weight = 100;
        nodes[i].up = true;
    }
    kvedge_chunk_id_t key = s_key(1);
    kvedge_placed_opts_t o;
    kvedge_placed_opts_default(&o);
    kvedge_placed_t *pw = NULL;
    kvedge_placed_opts_t unsized = o;
    unsized.size = 0;
    assert_int_equal(kvedge_placed_new(&unsized, nodes, 2, &key, &pw), KVEDGE_EINVAL);
    assert_int_equal(kvedge_placed_new(NULL, nodes, 2, &key, &pw), KVEDGE_EINVAL);
    assert_int_equal(kvedge_placed_new(&o, nodes, 2, NULL, &pw), KVEDGE_EINVAL);
    assert_int_equal(kvedge_placed_new(&o, NULL, 2, &key, &pw), KVEDGE_EINVAL);
    assert_int_equal(kvedge_placed_new(&o, nodes, 2, &key, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_placed_new(&o, nodes, KVEDGE_PLACED_MAX_NODES + 1, &key, &pw),
                     KVEDGE_EINVAL);
    o.replicas = KVEDGE_PLACED_MAX_REPLICAS + 1;
    assert_int_equal(kvedge_placed_new(&o, nodes, 2, &key, &pw), KVEDGE_EINVAL);
    o.replicas = 2;
    o.write_quorum = 3; /* W > R */
    assert_int_equal(kvedge_placed_new(&o, nodes, 2, &key, &pw), KVEDGE_EINVAL);
    o.write_quorum = 0;
    kvedge_placed_node_t bad = nodes[0];
    bad.endpoint[0] = '\0';
    assert_int_equal(kvedge_placed_new(&o, &bad, 1, &key, &pw), KVEDGE_EINVAL);
    /* No usable node: none, all down, all without capacity; fewer than W. */
    assert_int_equal(kvedge_placed_new(&o, nodes, 0, &key, &pw), KVEDGE_ENOTFOUND);
    kvedge_placed_node_t off[2] = {nodes[0], nodes[1]};
    off[0].up = off[1].up = false;
    assert_int_equal(kvedge_placed_usable(off, 2), 0);
    assert_int_equal(kvedge_placed_new(&o, off, 2, &key, &pw), KVEDGE_ENOTFOUND);
    off[0].up = off[1].up = true;
    off[0].weight = off[1].weight = 0;
    assert_int_equal(kvedge_placed_new(&o, off, 2, &key, &pw), KVEDGE_ENOTFOUND);
    off[0].weight = 1;
    o.write_quorum = 2;
    assert_int_equal(kvedge_placed_new(&o, off, 2, &key, &pw), KVEDGE_ENOTFOUND);
    assert_null(pw);
    /* Calls before connect, and on NULL. */
    o.write_quorum = 0;
    assert_int_equal(kvedge_placed_new(&o, nodes, 2, &key, &pw), KVEDGE_OK);
    kvedge_put_item_t item;
    memset(&item, 0, sizeof item);
    assert_int_equal(kvedge_placed_put(pw, &item, 1), KVEDGE_EINVAL);
    assert_int_equal(kvedge_placed_put_model(pw, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_placed_replica(pw, 2, &(kvedge_placed_replica_t){0}), KVEDGE_EINVAL);
    assert_null(kvedge_placed_client(pw, 0)); /* not connected */
    assert_int_equal(kvedge_placed_connect(NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_placed_count(NULL), 0);
    kvedge_placed_destroy(&pw);
    assert_null(pw);
    kvedge_placed_destroy(&pw);
    kvedge_placed_destroy(NULL);
}

/* The writer names access/placement.h's nodes; R above the usable nodes gives them all. */
static void test_placement_is_the_hash(void **state)
{
    (void)state;
    kvedge_placed_node_t nodes[5];
    kvedge_place_node_t pn[5];
    memset(nodes, 0, sizeof nodes);
    memset(pn, 0, sizeof pn);
    for (int i = 0; i < 5; i++) {
        snprintf(nodes[i].id, sizeof nodes[i].id, "node-%d", i);
        snprintf(nodes[i].endpoint, sizeof nodes[i].endpoint, "ipc:///nonexistent/%d", i);
        nodes[i].weight = (uint64_t)(i + 1) << 30;
        nodes[i].up = i != 3;
        memcpy(pn[i].id, nodes[i].id, sizeof pn[i].id);
        pn[i].weight = nodes[i].weight;
        pn[i].up = nodes[i].up;
    }
    for (uint8_t k = 0; k < 50; k++) {
        kvedge_chunk_id_t key = s_key(k);
        kvedge_placed_opts_t o;
        kvedge_placed_opts_default(&o);
        kvedge_placed_t *pw = NULL;
        assert_int_equal(kvedge_placed_new(&o, nodes, 5, &key, &pw), KVEDGE_OK);
        uint32_t pick[2], got = 0;
        assert_int_equal(kvedge_place_pick(&key, pn, 5, 2, pick, &got), KVEDGE_OK);
        assert_int_equal(kvedge_placed_count(pw), got);
        assert_int_equal(kvedge_placed_quorum(pw), got);
        for (uint32_t i = 0; i < got; i++) {
            kvedge_placed_replica_t r;
            assert_int_equal(kvedge_placed_replica(pw, i, &r), KVEDGE_OK);
            assert_string_equal(r.id, nodes[pick[i]].id);
            assert_string_not_equal(r.id, "node-3"); /* down */
        }
        kvedge_chunk_id_t back;
        assert_int_equal(kvedge_placed_key(pw, &back), KVEDGE_OK);
        assert_memory_equal(back.bytes, key.bytes, sizeof key.bytes);
        kvedge_placed_destroy(&pw);
        o.replicas = 9;
        assert_int_equal(kvedge_placed_new(&o, nodes, 5, &key, &pw), KVEDGE_OK);
        assert_int_equal(kvedge_placed_asked(pw), 9);
        assert_int_equal(kvedge_placed_count(pw), 4); /* the usable ones */
        assert_int_equal(kvedge_placed_quorum(pw), 4);
        kvedge_placed_destroy(&pw);
    }
}

/* Blocks of one chunk: 2 layers x 1 head of a registered model. */
#define S_ITEMS 2

static void s_items(kvedge_put_item_t *items, const kvedge_chunk_id_t *chunk, uint8_t **blocks)
{
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_INT8, 32, 16, 0, NULL, false};
    for (int l = 0; l < S_ITEMS; l++) {
        memset(&items[l], 0, sizeof items[l]);
        items[l].chunk.id = *chunk;
        snprintf(items[l].chunk.model_id, sizeof items[l].chunk.model_id, "placed-m");
        items[l].chunk.tokens = 32;
        items[l].layer = (uint16_t)l;
        blocks[l] = kt_encode(&spec, 40 + (uint64_t)l, &items[l].len);
        assert_non_null(blocks[l]);
        items[l].block = blocks[l];
    }
}

/* Every block on each replica and on no other node; a replica nobody serves fails the write
 * with W = R and not with W = 1, and says so. */
static void test_put_to_replicas(void **state)
{
    (void)state;
    s_world_t w;
    s_start(&w);
    kvedge_model_t m = {
        .id = "placed-m", .layers = 2, .kv_heads = 1, .head_dim = 16, .dtype = KVEDGE_DTYPE_FP16};
    kvedge_put_item_t items[S_ITEMS];
    uint8_t *blocks[S_ITEMS];
    kvedge_chunk_id_t key = s_key(7);
    s_items(items, &key, blocks);

    kvedge_placed_opts_t o;
    kvedge_placed_opts_default(&o);
    o.deadline_ms = 2000;
    kvedge_placed_t *pw = NULL;
    assert_int_equal(kvedge_placed_new(&o, w.tier, S_NODES, &key, &pw), KVEDGE_OK);
    assert_int_equal(kvedge_placed_connect(pw), KVEDGE_OK);
    assert_int_equal(kvedge_placed_put_model(pw, &m), KVEDGE_OK);
    assert_int_equal(kvedge_placed_put(pw, items, S_ITEMS), KVEDGE_OK);
    assert_int_equal(kvedge_placed_acked(pw), 2);
    bool placed[S_NODES] = {false};
    for (uint32_t i = 0; i < 2; i++) {
        kvedge_placed_replica_t r;
        assert_int_equal(kvedge_placed_replica(pw, i, &r), KVEDGE_OK);
        assert_true(r.connected);
        assert_int_equal(r.status, KVEDGE_OK);
        assert_int_equal(r.items, S_ITEMS);
        placed[r.id[1] - '0'] = true;
        assert_non_null(kvedge_placed_client(pw, i));
    }
    kvedge_placed_destroy(&pw);
    for (int i = 0; i < S_NODES; i++) {
        kvedge_client_opts_t co;
        kvedge_client_opts_default(&co);
        co.endpoint = w.tier[i].endpoint;
        kvedge_client_t *c = NULL;
        assert_int_equal(kvedge_client_connect(&co, &c), KVEDGE_OK);
        size_t hit = 0;
        assert_int_equal(kvedge_client_lookup(c, &key, 1, &hit), KVEDGE_OK);
        assert_int_equal(hit, placed[i] ? 1 : 0);
        kvedge_client_destroy(&c);
    }

    /* A tier whose placement names the node nobody serves (it is the only other one). */
    kvedge_placed_node_t two[2] = {w.tier[0], w.tier[S_NODES]};
    o.deadline_ms = 300;
    assert_int_equal(kvedge_placed_new(&o, two, 2, &key, &pw), KVEDGE_OK);
    int rc = kvedge_placed_connect(pw);
    assert_int_equal(rc, KVEDGE_ETIMEDOUT);
    assert_int_equal(kvedge_placed_acked(pw), 1);
    assert_int_equal(kvedge_placed_put(pw, items, S_ITEMS), KVEDGE_ETIMEDOUT);
    kvedge_placed_destroy(&pw);
    o.write_quorum = 1;
    assert_int_equal(kvedge_placed_new(&o, two, 2, &key, &pw), KVEDGE_OK);
    assert_int_equal(kvedge_placed_connect(pw), KVEDGE_OK);
    assert_int_equal(kvedge_placed_put_model(pw, &m), KVEDGE_OK);
    assert_int_equal(kvedge_placed_put(pw, items, S_ITEMS), KVEDGE_OK);
    assert_int_equal(kvedge_placed_acked(pw), 1);
    for (uint32_t i = 0; i < 2; i++) {
        kvedge_placed_replica_t r;
        assert_int_equal(kvedge_placed_replica(pw, i, &r), KVEDGE_OK);
        bool dead = strcmp(r.id, w.tier[S_NODES].id) == 0;
        assert_int_equal(r.connected, !dead);
        assert_int_equal(r.status, dead ? KVEDGE_ETIMEDOUT : KVEDGE_OK);
        assert_int_equal(r.items, dead ? 0 : S_ITEMS);
        assert_true(dead == (kvedge_placed_client(pw, i) == NULL));
    }
    kvedge_placed_destroy(&pw);

    for (int l = 0; l < S_ITEMS; l++)
        free(blocks[l]);
    s_stop(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_placement_is_the_hash),
        cmocka_unit_test(test_put_to_replicas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
