/* Re-replication: four cloud nodes, contexts on R = 2 of them by placement; SIGKILL one node
 * and, once the grace period is over (never before), the survivors' movers copy what it held
 * until every chunk has 2 complete replicas again, every block bit-exact; the metrics say what
 * was moved and that the backlog is gone. A directory entry naming a node that is gone is
 * skipped and counted, nothing else changes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "access/codec/clock.h"
#include "store/node/mover.h"
#include "tests/common/logcap.h"
#include "tests/common/shell.h"
#include "tests/common/http.h"
#include "tests/store/node/test_mover_fx.h"

#define S_GRACE_S 3
#define S_CTX     8

/* The value of the series line starting with prefix, or -1. */
static double s_metric(const char *metrics, const char *prefix)
{
    const char *p = strstr(metrics, prefix);
    while (p && p != metrics && p[-1] != '\n')
        p = strstr(p + 1, prefix);
    return p ? strtod(p + strlen(prefix), NULL) : -1;
}

static double s_node_metric(mv_node_t *nd, const char *prefix)
{
    char *body = malloc(1 << 20);
    assert_non_null(body);
    assert_int_equal(kt_http_get(kvedge_node_metrics_url(nd->node), "/metrics", body, 1 << 20),
                     200);
    double v = s_metric(body, prefix);
    free(body);
    return v;
}

static void test_rereplicate_after_grace(void **state)
{
    (void)state;
    mv_fx_t *f = calloc(1, sizeof *f);
    mv_master(f);
    mv_node(f, MV_CAPACITY, S_GRACE_S, true);
    mv_node(f, MV_CAPACITY, S_GRACE_S, false);
    mv_node(f, MV_CAPACITY, S_GRACE_S, false);
    mv_node_t *victim = mv_spawn(f, KVEDGE_BIN, MV_CAPACITY, S_GRACE_S);
    mv_wait_all_up(f);
    for (int c = 0; c < S_CTX; c++)
        mv_put_context(f, c, f->n);
    kt_wait_for(mv_all_replicated(f, 2, -1), KT_WAIT_MS);
    int on_victim = 0;
    for (int c = 0; c < f->nctx; c++)
        for (int i = 0; i < MV_CHUNKS; i++)
            on_victim += mv_dir_complete(f, victim->id, &f->ctx[c].ids[i]);
    assert_true(on_victim > 0); /* the placement put some contexts there */

    int64_t t0 = kt_now_ms();
    mv_kill(victim);
    kt_wait_for(mv_all_replicated(f, 2, 3), KT_WAIT_MS + MV_DOWN_MS + S_GRACE_S * 1000);
    int64_t took = kt_now_ms() - t0;
    /* Nothing is copied before the node has been down for the grace period. */
    assert_true(took >= S_GRACE_S * 1000);
    mv_verify_all(f, 3);

    uint64_t done = 0, bytes = 0;
    for (int i = 0; i < 3; i++) {
        kvedge_mover_stats_t st;
        kvedge_node_mover_stats(f->nodes[i].node, &st);
        done += st.total.copies_done;
        bytes += st.total.bytes;
    }
    /* Every chunk the victim held got one new replica, copied once. */
    assert_int_equal(done, (uint64_t)on_victim);
    assert_true(bytes >= (uint64_t)on_victim * MV_LAYERS * MV_HEADS * MV_TOKENS * MV_DIM * 4);
    kt_wait_for(s_node_metric(&f->nodes[0], "kvedge_mover_backlog_chunks ") == 0, KT_WAIT_MS);
    kvedge_mover_stats_t st0;
    kvedge_node_mover_stats(f->nodes[0].node, &st0);
    assert_true(s_node_metric(&f->nodes[0], "kvedge_mover_bytes_moved_total ") ==
                (double)st0.total.bytes);
    assert_true(s_node_metric(&f->nodes[0], "kvedge_mover_copies_done_total ") ==
                (double)st0.total.copies_done);
    assert_true(s_node_metric(&f->nodes[0], "kvedge_mover_copies_failed_total ") >= 0);
    /* The skew over the three live nodes: max / mean of their bytes, so in [1, 3]. */
    double skew = s_node_metric(&f->nodes[0], "kvedge_mover_placement_skew ");
    assert_true(skew >= 1.0 && skew <= 3.0);
    mv_stop(f);
    free(f);
}

/* A dir/ record of a node with no node record is skipped and counted by the tier (the node
 * movers log it); the plan and every replica are as before. */
static void test_gone_node_skipped(void **state)
{
    (void)state;
    mv_fx_t *f = mv_world(2, S_GRACE_S);
    mv_put_context(f, 0, f->n);
    kt_wait_for(mv_all_replicated(f, 2, -1), KT_WAIT_MS);
    kvedge_master_dir_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.model_id, sizeof d.model_id, "%s", MV_MODEL);
    d.layers = MV_LAYERS;
    for (unsigned l = 0; l < MV_LAYERS; l++)
        kvedge_master_dir_set(&d, l);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_dir_pack(&d, body, &len), KVEDGE_OK);
    char hex[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1], key[200];
    kvedge_master_chunk_hex(&f->ctx[0].ids[0], hex);
    snprintf(key, sizeof key, "dir/ghost/%s", hex);
    assert_int_equal(kvedge_mview_set(f->reg, key, body, len, 3000), KVEDGE_OK);

    kvedge_tier_t *t = NULL;
    assert_int_equal(kvedge_tier_read(f->reg, kvedge_wall_ms(), 30000, &t), KVEDGE_OK);
    const char *gone = NULL;
    uint32_t unplaced = 0;
    assert_int_equal(kvedge_tier_skipped(t, &unplaced, &gone), 1);
    assert_string_equal(gone, "ghost");
    assert_int_equal(kvedge_tier_backlog(t, 2, NULL), 0);
    kvedge_tier_destroy(&t);
    /* The movers' passes see it too, say so, and change nothing. */
    kt_log_t logs = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kvedge_log_set_sink(kt_log_sink, &logs);
    assert_int_equal(kvedge_node_mover_pass(f->nodes[0].node), KVEDGE_OK);
    assert_int_equal(kvedge_node_mover_pass(f->nodes[1].node), KVEDGE_OK);
    kvedge_log_set_sink(NULL, NULL);
    assert_true(kt_log_count(&logs, "mover: ", "directory entries skipped", "node ghost", NULL) >=
                1);
    kt_log_clear(&logs);
    kvedge_mover_stats_t st;
    kvedge_node_mover_stats(f->nodes[0].node, &st);
    assert_int_equal(st.backlog, 0);
    assert_int_equal(st.total.copies_done + st.total.copies_failed, 0);
    assert_true(mv_all_replicated(f, 2, -1));
    mv_verify_all(f, -1);
    mv_stop(f);
    free(f);
}

/* The core under a bandwidth limit: a chain held by one node of two is planned onto both and
 * copied no faster than the limit (and bit-exact); the copier's counts say what moved. */
static void test_copy_bandwidth_limit(void **state)
{
    (void)state;
    mv_fx_t *f = mv_world(2, 30); /* its movers leave it alone */
    uint32_t only_c1 = 0;
    mv_put_context_on(f, 0, &only_c1, 1);
    /* Its first two chunks pinned: their copies are too, the third's is not. */
    kvedge_client_t *p1 = mv_client(f->nodes[0].ep);
    assert_int_equal(kvedge_client_pin(p1, f->ctx[0].ids, 2, true, NULL), KVEDGE_OK);
    kvedge_client_destroy(&p1);
    kt_wait_for(mv_holders(f, &f->ctx[0].ids[0], -1) == 1 &&
                    mv_holders(f, &f->ctx[0].ids[1], -1) == 1 &&
                    mv_holders(f, &f->ctx[0].ids[2], -1) == 1,
                KT_WAIT_MS);

    kvedge_tier_t *t = NULL;
    assert_int_equal(kvedge_tier_read(f->reg, kvedge_wall_ms(), 30000, &t), KVEDGE_OK);
    assert_int_equal(kvedge_tier_backlog(t, 2, NULL), MV_CHUNKS);
    const uint64_t bw = 20000; /* bytes/s: the chain's ~26 KB take more than a second */
    kvedge_mover_io_t io = {.bw = bw};
    kvedge_mover_conns_t *c = kvedge_mover_conns_new(&io);
    assert_non_null(c);
    assert_int_equal(kvedge_mover_list(c, t, 0), KVEDGE_OK);
    kvedge_move_t *m = NULL;
    size_t n = 0;
    assert_int_equal(kvedge_tier_plan(t, KVEDGE_MOVER_REPAIR, 2, -1, &m, &n), KVEDGE_OK);
    assert_int_equal(n, MV_CHUNKS);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(m[i].kind, KVEDGE_MOVE_COPY);
        assert_int_equal(m[i].from, 0);
        assert_int_equal(m[i].to, 1);
    }
    kvedge_mover_result_t res = {0};
    kvedge_mover_copy_all(c, t, m, n, &res);
    assert_int_equal(res.copies_done, MV_CHUNKS);
    assert_int_equal(res.copies_failed, 0);
    assert_true(res.bytes >= (uint64_t)MV_CHUNKS * MV_LAYERS * MV_HEADS * MV_TOKENS * MV_DIM * 4);
    assert_true((double)res.elapsed_us >= (double)res.bytes * 1e6 / (double)bw * 0.95);
    kt_wait_for(kvedge_mover_landed(f->reg, t, m, n), KT_WAIT_MS);
    mv_verify_all(f, -1);
    kvedge_client_t *c1 = mv_client(f->nodes[0].ep), *c2 = mv_client(f->nodes[1].ep);
    kvedge_chunk_entry_t *e1 = NULL, *e2 = NULL;
    size_t n1 = 0, n2 = 0;
    assert_int_equal(kvedge_client_list_all(c1, &e1, &n1), KVEDGE_OK);
    assert_int_equal(kvedge_client_list_all(c2, &e2, &n2), KVEDGE_OK);
    assert_int_equal(n1, MV_CHUNKS);
    assert_int_equal(n2, MV_CHUNKS);
    uint32_t pinned = 0;
    for (size_t i = 0; i < n2; i++) {
        assert_int_equal(e2[i].pinned_blocks, e1[i].pinned_blocks); /* same id order */
        assert_int_equal(e2[i].blocks, e1[i].blocks);
        pinned += e2[i].pinned_blocks;
    }
    assert_int_equal(pinned, 2 * MV_LAYERS * MV_HEADS);
    free(e1);
    free(e2);
    kvedge_client_destroy(&c1);
    kvedge_client_destroy(&c2);
    free(m);
    kvedge_mover_conns_destroy(&c);
    kvedge_tier_destroy(&t);
    mv_stop(f);
    free(f);
}

/* A layer larger than the copier's first buffer (4 MiB: 72 heads of 64 KiB) is read again into
 * a larger one and copied whole, bit-exact. */
static void test_copy_large_layer(void **state)
{
    (void)state;
    enum { HEADS = 72, LAYERS = 2, TOKENS = 256, DIM = 64 };
    mv_fx_t *f = mv_world(2, 30);
    kvedge_model_t model = {.id = "mv-wide",
                            .layers = LAYERS,
                            .kv_heads = HEADS,
                            .head_dim = DIM,
                            .dtype = KVEDGE_DTYPE_FP16};
    uint32_t tok[TOKENS];
    for (uint32_t i = 0; i < TOKENS; i++)
        tok[i] = i + 11;
    kvedge_chunk_id_t id;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, model.id, tok, TOKENS, TOKENS, &id, 1), 1);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, TOKENS, DIM, 0, NULL, false};
    kvedge_client_t *c1 = mv_client(f->nodes[0].ep), *c2 = mv_client(f->nodes[1].ep);
    assert_int_equal(kvedge_client_put_model(c1, &model), KVEDGE_OK);
    uint8_t *blocks[LAYERS][HEADS];
    size_t lens[LAYERS][HEADS];
    for (int l = 0; l < LAYERS; l++) {
        kvedge_put_item_t items[HEADS];
        for (int h = 0; h < HEADS; h++) {
            blocks[l][h] = kt_encode(&spec, (uint64_t)(l * 100 + h + 1), &lens[l][h]);
            assert_non_null(blocks[l][h]);
            items[h] = (kvedge_put_item_t){.layer = (uint16_t)l,
                                           .head = (uint16_t)h,
                                           .block = blocks[l][h],
                                           .len = lens[l][h]};
            items[h].chunk.id = id;
            snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, "%s", model.id);
            items[h].chunk.tokens = TOKENS;
        }
        assert_int_equal(kvedge_client_put(c1, items, HEADS, NULL), KVEDGE_OK);
    }
    kvedge_master_dir_t d;
    kt_wait_for(kvedge_mview_dir(f->reg, "c1", &id, &d) == KVEDGE_OK &&
                    kvedge_master_dir_has(&d, LAYERS - 1),
                KT_WAIT_MS);
    kvedge_tier_t *t = NULL;
    assert_int_equal(kvedge_tier_read(f->reg, kvedge_wall_ms(), 30000, &t), KVEDGE_OK);
    kvedge_mover_io_t io = {.bw = 0};
    kvedge_mover_conns_t *c = kvedge_mover_conns_new(&io);
    assert_int_equal(kvedge_mover_list(c, t, 0), KVEDGE_OK);
    kvedge_move_t *m = NULL;
    size_t n = 0;
    assert_int_equal(kvedge_tier_plan(t, KVEDGE_MOVER_REPAIR, 2, -1, &m, &n), KVEDGE_OK);
    assert_int_equal(n, 1);
    kvedge_mover_result_t res = {0};
    kvedge_mover_copy_all(c, t, m, n, &res);
    assert_int_equal(res.copies_done, 1);
    uint8_t *buf = malloc(8u << 20);
    assert_non_null(buf);
    for (int l = 0; l < LAYERS; l++) {
        kvedge_fetched_t out[HEADS];
        uint32_t heads = 0;
        assert_int_equal(
            kvedge_client_get_layer(c2, &id, 1, (uint16_t)l, buf, 8u << 20, out, HEADS, &heads),
            KVEDGE_OK);
        assert_int_equal(heads, HEADS);
        for (int h = 0; h < HEADS; h++) {
            assert_int_equal(out[h].status, KVEDGE_OK);
            assert_int_equal(out[h].len, lens[l][h]);
            assert_memory_equal(buf + out[h].offset, blocks[l][h], lens[l][h]);
            free(blocks[l][h]);
        }
    }
    free(buf);
    free(m);
    kvedge_mover_conns_destroy(&c);
    kvedge_tier_destroy(&t);
    kvedge_client_destroy(&c1);
    kvedge_client_destroy(&c2);
    mv_stop(f);
    free(f);
}

/* A chain written to fewer nodes than R, no node down: the mover of its holder copies it to its
 * placement once it has stayed below R for the grace period, not before. */
static void test_under_replicated_write(void **state)
{
    (void)state;
    mv_fx_t *f = mv_world(2, S_GRACE_S);
    uint32_t only_c2 = 1;
    int64_t t0 = kt_now_ms();
    mv_put_context_on(f, 0, &only_c2, 1);
    kt_wait_for(mv_all_replicated(f, 2, -1), KT_WAIT_MS + S_GRACE_S * 1000);
    assert_true(kt_now_ms() - t0 >= S_GRACE_S * 1000);
    mv_verify_all(f, -1);
    kvedge_mover_stats_t st;
    kvedge_node_mover_stats(f->nodes[1].node, &st);
    assert_int_equal(st.total.copies_done, MV_CHUNKS);
    mv_stop(f);
    free(f);
}

/* CURVE with tenants: the nodes' certificates are in every node's allowlist with the tenant
 * `acme`; a chain of acme and one of another tenant each held by one node of two. The mover
 * copies the acme chain into acme's namespace on the other node (acme's client reads it there,
 * bit-exact) and cannot list the other tenant's chain: it stays where it is, counted in the
 * backlog. */
typedef struct {
    char key[300], secret[310];
} s_cert_t;

static void s_keygen(mv_fx_t *f, const char *name, const char *tenant, s_cert_t *c)
{
    snprintf(c->key, sizeof c->key, "%s/keys/%s", f->root, name);
    snprintf(c->secret, sizeof c->secret, "%s_secret", c->key);
    assert_int_equal(kt_sh("'%s' keygen --tenant %s '%s' >/dev/null", KVEDGE_BIN, tenant, c->key),
                     0);
}

static kvedge_client_t *s_curve_client(mv_node_t *nd, const s_cert_t *c)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = nd->ep;
    o.server_key = kvedge_node_public_key(nd->node);
    o.client_cert = c->secret;
    o.deadline_ms = 5000;
    kvedge_client_t *cl = NULL;
    assert_int_equal(kvedge_client_connect(&o, &cl), KVEDGE_OK);
    return cl;
}

static void test_curve_tenant(void **state)
{
    (void)state;
    mv_fx_t *f = calloc(1, sizeof *f);
    mv_master(f);
    assert_int_equal(kt_sh("mkdir -p '%s/keys' '%s/allow'", f->root, f->root), 0);
    s_cert_t node[2], app, other;
    s_keygen(f, "node1", "acme", &node[0]);
    s_keygen(f, "node2", "acme", &node[1]);
    s_keygen(f, "app", "acme", &app);
    s_keygen(f, "other", "zeta", &other);
    assert_int_equal(kt_sh("cp '%s' '%s' '%s' '%s' '%s/allow/'", node[0].key, node[1].key, app.key,
                           other.key, f->root),
                     0);
    for (int i = 0; i < 2; i++) {
        mv_node_t *nd = mv_slot(f, MV_CAPACITY);
        kvedge_node_settings_t ns;
        kvedge_node_settings_default(&ns);
        snprintf(ns.metrics, sizeof ns.metrics, "off");
        ns.role = KVEDGE_ROLE_CLOUD;
        ns.workers = 2;
        ns.capacity_bytes = MV_CAPACITY;
        ns.dir_interval_ms = 100;
        ns.mover_grace_s = 1;
        snprintf(ns.cert, sizeof ns.cert, "%.299s", node[i].key);
        snprintf(ns.clients, sizeof ns.clients, "%.900s/allow", f->root);
        snprintf(ns.data, sizeof ns.data, "%s", nd->dir);
        snprintf(ns.bind, sizeof ns.bind, "%.250s", nd->ep);
        snprintf(ns.master, sizeof ns.master, "%.250s", f->mep);
        snprintf(ns.master_pub, sizeof ns.master_pub, "%.250s", f->mpub);
        snprintf(ns.node_id, sizeof ns.node_id, "%s", nd->id);
        char why[512] = "";
        if (kvedge_node_start(&ns, &nd->node, why, sizeof why) != KVEDGE_OK)
            fail_msg("node %s: %s", nd->id, why);
    }
    mv_wait_up(f, 0);
    mv_wait_up(f, 1);
    /* Both chains on c1 only, each through a client of its tenant. */
    kvedge_put_item_t items[MV_ITEMS];
    kvedge_client_t *a1 = s_curve_client(&f->nodes[0], &app);
    kvedge_client_t *o1 = s_curve_client(&f->nodes[0], &other);
    mv_make_context(f, 0, items);
    mv_put_items(a1, items);
    mv_make_context(f, 1, items);
    mv_put_items(o1, items);
    /* After the grace, the acme chain has its second replica. */
    kt_wait_for(mv_holders(f, &f->ctx[0].ids[0], -1) == 2 &&
                    mv_holders(f, &f->ctx[0].ids[1], -1) == 2 &&
                    mv_holders(f, &f->ctx[0].ids[2], -1) == 2,
                KT_WAIT_MS);
    kvedge_client_t *a2 = s_curve_client(&f->nodes[1], &app);
    kvedge_client_t *o2 = s_curve_client(&f->nodes[1], &other);
    for (int i = 0; i < MV_CHUNKS; i++) {
        assert_int_equal(mv_read_chunk(a2, &f->ctx[0], i), 1); /* in acme's namespace */
        assert_int_equal(mv_read_chunk(o2, &f->ctx[0], i), 0); /* not in zeta's */
        assert_int_equal(mv_read_chunk(o1, &f->ctx[1], i), 1);
        assert_int_equal(mv_holders(f, &f->ctx[1].ids[i], -1), 1);
    }
    /* The zeta chain is not listed to the mover: it stays, counted in the backlog. */
    assert_int_equal(kvedge_node_mover_pass(f->nodes[0].node), KVEDGE_OK);
    kvedge_mover_stats_t st;
    kvedge_node_mover_stats(f->nodes[0].node, &st);
    assert_int_equal(st.backlog, MV_CHUNKS);
    assert_int_equal(st.total.copies_done, MV_CHUNKS);
    kvedge_chunk_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(kvedge_client_list_all(o2, &e, &n), KVEDGE_OK);
    assert_int_equal(n, 0);
    free(e);
    kvedge_client_destroy(&a1);
    kvedge_client_destroy(&o1);
    kvedge_client_destroy(&a2);
    kvedge_client_destroy(&o2);
    mv_stop(f);
    free(f);
}

/* Bad arguments are refused, never crash. */
static void test_bad_args(void **state)
{
    (void)state;
    kvedge_tier_t *t = NULL;
    assert_int_equal(kvedge_tier_read(NULL, 0, 0, &t), KVEDGE_EINVAL);
    assert_null(t);
    kvedge_move_t *m = NULL;
    size_t n = 0;
    assert_int_equal(kvedge_tier_plan(NULL, KVEDGE_MOVER_REPAIR, 2, -1, &m, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tier_learn(NULL, 0, NULL, 0), KVEDGE_EINVAL);
    kvedge_mover_opts_t o = {.node_id = "bad id", .master = "ipc:///x", .master_pub = "ipc:///y"};
    kvedge_mover_t *mv = NULL;
    assert_int_equal(kvedge_mover_start(&o, &mv), KVEDGE_EINVAL);
    assert_int_equal(kvedge_mover_pass(NULL), KVEDGE_EINVAL);
    kvedge_mover_destroy(&mv);
    kvedge_tier_destroy(&t);
    assert_true(kvedge_tier_skew(NULL) == 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_gone_node_skipped),
        cmocka_unit_test(test_copy_bandwidth_limit),
        cmocka_unit_test(test_under_replicated_write),
        cmocka_unit_test(test_copy_large_layer),
        cmocka_unit_test(test_curve_tenant),
        cmocka_unit_test(test_rereplicate_after_grace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
