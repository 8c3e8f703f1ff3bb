/* `kvedge rebalance`: three cloud nodes hold contexts on R = 2 by placement; two nodes join (one
 * of capacity 0). --dry-run prints the plan and changes nothing; the real run copies every chain
 * to its new placement while a reader fetches all the time (following the directory, trying the
 * next replica on a miss, as a proxy does) and never misses nor gets a wrong block; afterwards
 * every chunk is on exactly its placement, the copies no longer placed are gone, the node of
 * capacity 0 holds nothing, the skew is printed, and a directory entry of a node that is gone is
 * skipped and counted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>

#include "proxy/proxy.h"
#include "tests/common/shell.h"
#include "tests/store/node/test_mover_fx.h"

#define S_CTX 12

typedef struct {
    mv_fx_t *f;
    atomic_bool stop;
    _Atomic uint64_t reads, misses, wrong;
} s_reader_t;

/* Reads every chunk of every context again and again from the replicas the directory lists
 * complete, the next one on a miss; a chunk none of them serves is a miss. */
static void *s_reader(void *arg)
{
    s_reader_t *r = arg;
    mv_fx_t *f = r->f;
    kvedge_client_t *cl[MV_MAX_NODES] = {0};
    for (int i = 0; i < f->n; i++)
        cl[i] = mv_client(f->nodes[i].ep);
    while (!atomic_load(&r->stop)) {
        for (int c = 0; c < f->nctx; c++)
            for (int k = 0; k < MV_CHUNKS; k++) {
                int got = 0;
                for (int i = 0; i < f->n && got != 1; i++) {
                    if (!mv_dir_complete(f, f->nodes[i].id, &f->ctx[c].ids[k]))
                        continue;
                    got = mv_read_chunk(cl[i], &f->ctx[c], k);
                    if (got < 0)
                        r->wrong++;
                }
                r->reads++;
                r->misses += got != 1;
            }
    }
    for (int i = 0; i < f->n; i++)
        kvedge_client_destroy(&cl[i]);
    return NULL;
}

/* A reader through an edge proxy that learnt the cloud nodes from the master: FETCHes every
 * context whole again and again; a layer the proxy reports missed, a block that differs from
 * what was put, or a FETCH that fails is counted. */
typedef struct {
    mv_fx_t *f;
    const char *ep;
    atomic_bool stop;
    _Atomic uint64_t fetches, missed, wrong, failed;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status, c;
} s_preader_t;

static void s_p_block(void *ctx, uint16_t layer, uint32_t chunk_index, uint16_t head, int source,
                      int status, const uint8_t *data, size_t len)
{
    (void)source;
    s_preader_t *r = ctx;
    const mv_ctx_t *x = &r->f->ctx[r->c];
    if (status != KVEDGE_OK || !data)
        return; /* a layer missed is counted by on_layer */
    if (chunk_index >= MV_CHUNKS || layer >= MV_LAYERS || head >= MV_HEADS ||
        len != x->lens[chunk_index][layer][head] ||
        memcmp(data, x->blocks[chunk_index][layer][head], len) != 0)
        r->wrong++;
}

static void s_p_layer(void *ctx, const kvedge_fetch_layer_t *layer)
{
    s_preader_t *r = ctx;
    if (layer->status != KVEDGE_OK)
        r->missed++;
}

static void s_p_done(void *ctx, int status)
{
    s_preader_t *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->status = status;
    r->done = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void *s_proxy_reader(void *arg)
{
    s_preader_t *r = arg;
    kvedge_client_t *cl = mv_client(r->ep);
    kvedge_fetch_cbs_t cbs = {NULL, s_p_block, s_p_layer, s_p_done};
    while (!atomic_load(&r->stop))
        for (int c = 0; c < r->f->nctx; c++) {
            kvedge_fetch_req_t req;
            kvedge_fetch_req_default(&req);
            req.model_id = MV_MODEL;
            req.chunks = r->f->ctx[c].ids;
            req.n = MV_CHUNKS;
            req.layers = MV_LAYERS;
            req.deadline_ms = 10000;
            r->c = c;
            r->done = false;
            if (kvedge_client_fetch_async(cl, &req, &cbs, r) != KVEDGE_OK) {
                r->failed++;
                continue;
            }
            pthread_mutex_lock(&r->mu);
            while (!r->done)
                pthread_cond_wait(&r->cv, &r->mu);
            pthread_mutex_unlock(&r->mu);
            r->failed += r->status != KVEDGE_OK;
            r->fetches++;
        }
    kvedge_client_destroy(&cl);
    return NULL;
}

/* Runs `kvedge rebalance ARGS --json` against the fixture's master; its exit code, its parsed
 * output in *doc (caller deletes). */
static int s_rebalance(mv_fx_t *f, const char *args, cJSON **doc)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' rebalance --master '%s' --pub '%s' --json %s 2>'%s/rb.err'",
             KVEDGE_BIN, f->mep, f->mpub, args, f->root);
    char *out = calloc(1, 1 << 20);
    assert_non_null(out);
    int rc = kt_capture(cmd, out, 1 << 20);
    *doc = cJSON_Parse(out);
    if (!*doc && rc == 0)
        fail_msg("rebalance printed no JSON (exit %d): %s", rc, out);
    free(out);
    return rc;
}

static int s_first(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)key;
    (void)seq;
    (void)body;
    (void)len;
    *(bool *)ctx = true;
    return 1;
}

static double s_num(const cJSON *doc, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, name);
    if (!cJSON_IsNumber(v))
        fail_msg("rebalance JSON has no number \"%s\"", name);
    return v->valuedouble;
}

static size_t s_listed(mv_node_t *nd)
{
    kvedge_client_t *cl = mv_client(nd->ep);
    kvedge_chunk_entry_t *e = NULL;
    size_t n = 0;
    assert_int_equal(kvedge_client_list_all(cl, &e, &n), KVEDGE_OK);
    free(e);
    kvedge_client_destroy(&cl);
    return n;
}

/* Every chunk is complete on exactly the 2 nodes its root is placed on among all the
 * fixture's nodes, and the directory names it nowhere else. */
static bool s_on_placement(mv_fx_t *f)
{
    for (int c = 0; c < f->nctx; c++) {
        uint32_t pick[KVEDGE_PLACE_MAX_REPLICAS];
        uint32_t got = mv_place(f, f->n, &f->ctx[c].ids[0], pick);
        for (int k = 0; k < MV_CHUNKS; k++)
            for (int i = 0; i < f->n; i++) {
                bool placed =
                    (got > 0 && pick[0] == (uint32_t)i) || (got > 1 && pick[1] == (uint32_t)i);
                kvedge_master_dir_t d;
                bool any =
                    kvedge_mview_dir(f->reg, f->nodes[i].id, &f->ctx[c].ids[k], &d) == KVEDGE_OK;
                if (placed != mv_dir_complete(f, f->nodes[i].id, &f->ctx[c].ids[k]) ||
                    (!placed && any))
                    return false;
            }
    }
    return true;
}

/* A dir/ record for a node that has no node record. */
static void s_ghost_entry(mv_fx_t *f)
{
    kvedge_master_dir_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.model_id, sizeof d.model_id, "%s", MV_MODEL);
    d.layers = MV_LAYERS;
    kvedge_master_dir_set(&d, 0);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_dir_pack(&d, body, &len), KVEDGE_OK);
    char hex[KVEDGE_MASTER_CHUNK_HEX_BYTES + 1], key[200];
    kvedge_master_chunk_hex(&f->ctx[0].ids[1], hex);
    snprintf(key, sizeof key, "dir/ghost/%s", hex);
    assert_int_equal(kvedge_mview_set(f->reg, key, body, len, 3000), KVEDGE_OK);
}

static void test_rebalance_moves_to_placement(void **state)
{
    (void)state;
    mv_fx_t *f = mv_world(3, 30);
    for (int c = 0; c < S_CTX; c++)
        mv_put_context(f, c, 3);
    kt_wait_for(mv_all_replicated(f, 2, -1), KT_WAIT_MS);
    mv_node(f, MV_CAPACITY, 30, false); /* c4 */
    mv_node(f, 0, 30, false);           /* c5: capacity 0, never placed */
    mv_wait_up(f, 3);
    mv_wait_up(f, 4);
    s_ghost_entry(f);

    /* --dry-run: the plan, and nothing moves. */
    cJSON *doc = NULL;
    assert_int_equal(s_rebalance(f, "--dry-run", &doc), 0);
    double planned = s_num(doc, "copies");
    assert_true(planned > 0);
    assert_true(s_num(doc, "deletes") == planned); /* one node loses what another gains */
    assert_true(s_num(doc, "copies_done") == 0);
    assert_true(s_num(doc, "skipped") == 1);
    assert_true(s_num(doc, "skew_before") > 1.0); /* c4 holds nothing yet */
    assert_true(s_num(doc, "skew_after") < s_num(doc, "skew_before"));
    cJSON_Delete(doc);
    assert_int_equal(s_listed(&f->nodes[3]), 0);
    assert_true(mv_all_replicated(f, 2, -1));

    /* The move, with two readers fetching all along: one that follows the directory itself,
     * one through an edge proxy that learnt the nodes from the master. */
    char pep[300];
    snprintf(pep, sizeof pep, "ipc://%.200s/proxy.sock", f->root);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = pep;
    po.insecure = true;
    po.id = "proxy-rb";
    po.master = f->mep;
    po.master_pub = f->mpub;
    kvedge_proxy_t *proxy = NULL;
    char why[256] = "";
    if (kvedge_proxy_start(&po, &proxy, why, sizeof why) != KVEDGE_OK)
        fail_msg("proxy: %s", why);
    assert_int_equal(kvedge_proxy_wait_sources(proxy, 5, KT_WAIT_MS), KVEDGE_OK);
    assert_int_equal(kvedge_proxy_wait_view(proxy, kvedge_master_seq(f->master), KT_WAIT_MS),
                     KVEDGE_OK);
    s_preader_t pr = {.f = f, .ep = pep};
    atomic_init(&pr.stop, false);
    pthread_mutex_init(&pr.mu, NULL);
    pthread_cond_init(&pr.cv, NULL);
    pthread_t pth;
    assert_int_equal(pthread_create(&pth, NULL, s_proxy_reader, &pr), 0);
    s_reader_t rd = {.f = f};
    atomic_init(&rd.stop, false);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, s_reader, &rd), 0);
    kt_wait_for(rd.reads > 0 && pr.fetches > 0, KT_WAIT_MS);
    /* 100 KiB/s: the ~230 KB of copies take about 2 s, the readers fetch all through them. */
    uint64_t fetched_before = pr.fetches;
    assert_int_equal(s_rebalance(f, "--bw 100K", &doc), 0);
    assert_true(pr.fetches >= fetched_before + 10); /* the proxy reader ran during the move */
    assert_true(s_num(doc, "seconds") >= 1.5);
    assert_true(s_num(doc, "copies") == planned);
    assert_true(s_num(doc, "copies_done") == planned);
    assert_true(s_num(doc, "copies_failed") == 0);
    assert_true(s_num(doc, "deletes_done") == planned);
    assert_true(s_num(doc, "deletes_kept") == 0);
    assert_true(s_num(doc, "bytes_moved") >=
                planned * MV_LAYERS * MV_HEADS * MV_TOKENS * MV_DIM * 4);
    assert_true(s_num(doc, "skew_after") < s_num(doc, "skew_before"));
    cJSON_Delete(doc);
    kt_wait_for(s_on_placement(f), KT_WAIT_MS);
    uint64_t before = rd.reads, pbefore = pr.fetches;
    /* the readers went on after the move too */
    kt_wait_for(rd.reads > before && pr.fetches > pbefore, KT_WAIT_MS);
    atomic_store(&rd.stop, true);
    atomic_store(&pr.stop, true);
    pthread_join(th, NULL);
    pthread_join(pth, NULL);
    kvedge_proxy_destroy(&proxy);
    pthread_cond_destroy(&pr.cv);
    pthread_mutex_destroy(&pr.mu);
    assert_int_equal(atomic_load(&rd.wrong), 0);
    assert_int_equal(atomic_load(&rd.misses), 0);
    assert_int_equal(atomic_load(&pr.wrong), 0);
    assert_int_equal(atomic_load(&pr.missed), 0);
    assert_int_equal(atomic_load(&pr.failed), 0);
    assert_true(atomic_load(&pr.fetches) > 0);
    assert_int_equal(s_listed(&f->nodes[4]), 0);
    assert_true(s_listed(&f->nodes[3]) > 0);
    mv_verify_all(f, -1);

    /* Once placed, a second run has nothing to do, and says so in words. */
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' rebalance --master '%s' --pub '%s' 2>&1", KVEDGE_BIN, f->mep,
             f->mpub);
    assert_int_equal(kt_capture(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "moves: 0 copies, 0 deletes over 5 cloud nodes (R=2)"));
    assert_non_null(strstr(out, "skew (max/mean bytes per up node): before "));
    assert_non_null(strstr(out, "1 directory entries of a node gone (ghost)"));
    mv_stop(f);
    free(f);
}

static bool s_has_prefix(mv_fx_t *f, const char *prefix)
{
    bool *found = calloc(1, sizeof *found);
    assert_non_null(found);
    kvedge_mview_foreach(f->reg, prefix, s_first, found);
    bool r = *found;
    free(found);
    return r;
}

/* --forget: refused for a node that is up (nothing removed); for a node down for good, its
 * records go and its chunks are copied back to R on the others. */
static void test_forget_down_node(void **state)
{
    (void)state;
    mv_fx_t *f = calloc(1, sizeof *f);
    mv_master(f);
    mv_node(f, MV_CAPACITY, 30, false);
    mv_node(f, MV_CAPACITY, 30, false);
    mv_spawn(f, KVEDGE_BIN, MV_CAPACITY, 30);
    mv_wait_all_up(f);
    for (int c = 0; c < 4; c++)
        mv_put_context(f, c, 3);
    kt_wait_for(mv_all_replicated(f, 2, -1), KT_WAIT_MS);
    cJSON *doc = NULL;
    assert_int_equal(s_rebalance(f, "--forget c1", &doc), 1);
    assert_null(doc);
    assert_true(s_has_prefix(f, "dir/c1/") && s_has_prefix(f, "node/c1"));

    mv_kill(&f->nodes[2]);
    kvedge_master_health_t h;
    kt_wait_for(kvedge_mview_health(f->reg, "c3", &h) == KVEDGE_OK &&
                    h.state == KVEDGE_MASTER_HEALTH_DOWN,
                KT_WAIT_MS);
    assert_int_equal(s_rebalance(f, "--forget c3", &doc), 0);
    assert_true(s_num(doc, "forgotten") >= 3); /* dir entries, node/c3, health/c3 */
    assert_true(s_num(doc, "copies_failed") == 0);
    cJSON_Delete(doc);
    assert_false(s_has_prefix(f, "dir/c3/"));
    assert_false(s_has_prefix(f, "node/c3"));
    assert_false(s_has_prefix(f, "health/c3"));
    kt_wait_for(mv_all_replicated(f, 2, 2), KT_WAIT_MS);
    mv_verify_all(f, 2);
    mv_stop(f);
    free(f);
}

/* A node registered and heartbeating (so `up`) whose endpoint nobody serves: rebalance cannot
 * list it and every copy to it fails, so no chain it is placed on loses a copy elsewhere:
 * deletes are held back, exit 1, and every chunk keeps its 2 complete replicas, bit-exact. */
static void test_unreachable_placed_node(void **state)
{
    (void)state;
    mv_fx_t *f = mv_world(2, 30);
    for (int c = 0; c < 6; c++)
        mv_put_context(f, c, 2);
    kt_wait_for(mv_all_replicated(f, 2, -1), KT_WAIT_MS);
    kvedge_master_node_t rec;
    memset(&rec, 0, sizeof rec);
    rec.role = KVEDGE_ROLE_CLOUD;
    snprintf(rec.endpoint, sizeof rec.endpoint, "ipc://%.200s/nobody.sock", f->root);
    rec.capacity_bytes = 4 * MV_CAPACITY; /* placed on most chains */
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_node_pack(&rec, body, &len), KVEDGE_OK);
    assert_int_equal(kvedge_mview_set(f->reg, "node/ghost", body, len, 3000), KVEDGE_OK);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = f->mep;
    vo.pub = f->mpub;
    vo.heartbeat_id = "ghost";
    vo.prefix = "node/ghost";
    kvedge_mview_t *hb = NULL;
    assert_int_equal(kvedge_mview_start(&vo, &hb), KVEDGE_OK);
    kt_wait_for(mv_up(f, "ghost"), KT_WAIT_MS);

    cJSON *doc = NULL;
    char args[64];
    snprintf(args, sizeof args, "--deadline 500 --wait 1000");
    assert_int_equal(s_rebalance(f, args, &doc), 1);
    assert_true(s_num(doc, "unlisted") == 1);
    assert_true(s_num(doc, "copies_failed") > 0);
    assert_true(s_num(doc, "deletes_done") == 0);
    assert_true(s_num(doc, "deletes_kept") > 0);
    cJSON_Delete(doc);
    char err[300];
    snprintf(err, sizeof err, "%.200s/rb.err", f->root);
    assert_true(kt_file_has(err, "listing ghost"));
    assert_true(kt_file_has(err, "not copied"));
    assert_true(kt_file_has(err, "kept on"));
    assert_true(mv_all_replicated(f, 2, -1));
    mv_verify_all(f, -1);
    kvedge_mview_destroy(&hb);
    mv_stop(f);
    free(f);
}

/* A master that does not answer: exit 5 and a message, nothing else. */
static void test_master_down(void **state)
{
    (void)state;
    char out[4096];
    int rc = kt_capture("'" KVEDGE_BIN "' rebalance --master ipc:///tmp/kvedge-no-master.sock "
                        "--pub ipc:///tmp/kvedge-no-master-pub.sock 2>&1",
                        out, sizeof out);
    assert_int_equal(rc, 5);
    assert_non_null(strstr(out, "no snapshot"));
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_master_down),
        cmocka_unit_test(test_rebalance_moves_to_placement),
        cmocka_unit_test(test_forget_down_node),
        cmocka_unit_test(test_unreachable_placed_node),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
