/* Re-replication throughput against the node-to-node link: two cloud nodes on loopback TCP,
 * one chain held by the first; per repetition, the same bytes read with GET_LAYER from the
 * first node (the mover's read side alone, the link's plain GET figure) and copied to the
 * second by the mover's core (GET_LAYER + PUT, no bandwidth limit), the copy deleted again in
 * between, and the same blocks put to the second node (PUT time alone: the write side's
 * ceiling). Prints the medians and their ratios. Usage: bench_mover [CHUNKS] (default 4 chunks of
 * opt-125m, 256 tokens, lossless fp16: 9.4 MB each). */
#include <czmq.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "access/codec/block.h"
#include "access/codec/clock.h"
#include "access/codec/synth.h"
#include "bench/bench_common.h"
#include "runtime/log.h"
#include "runtime/mview.h"
#include "store/master/master.h"
#include "store/node/mover.h"
#include "store/node/node.h"

#define S_MODEL  "opt-125m" /* built in: 12 layers x 12 KV heads x 64 */
#define S_LAYERS 12
#define S_HEADS  12
#define S_DIM    64
#define S_TOKENS 256
#define S_MAX    64

static kvedge_node_t *s_node(const char *root, const char *id, const char *mep, const char *mpub)
{
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    ns.capacity_bytes = 1ull << 34;
    ns.dir_interval_ms = 100;
    ns.mover_grace_s = 86400; /* the node's own mover stays out of the measurement */
    snprintf(ns.data, sizeof ns.data, "%.900s/%s", root, id);
    snprintf(ns.bind, sizeof ns.bind, "tcp://127.0.0.1:*");
    snprintf(ns.master, sizeof ns.master, "%s", mep);
    snprintf(ns.master_pub, sizeof ns.master_pub, "%s", mpub);
    snprintf(ns.node_id, sizeof ns.node_id, "%s", id);
    kvedge_node_t *n = NULL;
    char why[512] = "";
    if (kvedge_node_start(&ns, &n, why, sizeof why) != KVEDGE_OK) {
        fprintf(stderr, "node %s: %s\n", id, why);
        exit(1);
    }
    return n;
}

static kvedge_client_t *s_client(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = 30000;
    kvedge_client_t *c = NULL;
    KVEDGE_BENCH_CHECK(kvedge_client_connect(&o, &c));
    return c;
}

/* A chain of n chunks, every layer and head, put to c. */
static void s_put_chain(kvedge_client_t *c, kvedge_chunk_id_t *ids, uint32_t n)
{
    uint32_t *tok = bench_alloc(sizeof *tok * n * S_TOKENS);
    for (uint32_t i = 0; i < n * S_TOKENS; i++)
        tok[i] = 5 * i + 3;
    if (kvedge_chunk_chain(NULL, 0, S_MODEL, tok, n * S_TOKENS, S_TOKENS, ids, n) != (int)n)
        exit(1);
    free(tok);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, S_TOKENS, S_DIM, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    uint8_t *blocks = bench_alloc(cap * S_HEADS);
    uint16_t *k = bench_alloc(sizeof *k * S_TOKENS * S_DIM);
    uint16_t *v = bench_alloc(sizeof *v * S_TOKENS * S_DIM);
    kvedge_put_item_t items[S_HEADS];
    for (uint32_t ci = 0; ci < n; ci++)
        for (uint16_t l = 0; l < S_LAYERS; l++) {
            for (uint16_t h = 0; h < S_HEADS; h++) {
                KVEDGE_BENCH_CHECK(kvedge_synth_head(ci * 1000 + l * 16 + h, 0, S_TOKENS, S_DIM,
                                                     KVEDGE_DTYPE_FP16, k, v));
                memset(&items[h], 0, sizeof items[h]);
                KVEDGE_BENCH_CHECK(
                    kvedge_block_encode(&spec, k, v, blocks + h * cap, cap, &items[h].len));
                items[h].chunk.id = ids[ci];
                items[h].chunk.has_parent = ci > 0;
                if (ci > 0)
                    items[h].chunk.parent = ids[ci - 1];
                snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, S_MODEL);
                items[h].chunk.index = ci;
                items[h].chunk.tokens = S_TOKENS;
                items[h].layer = l;
                items[h].head = h;
                items[h].block = blocks + h * cap;
            }
            KVEDGE_BENCH_CHECK(kvedge_client_put(c, items, S_HEADS, NULL));
        }
    free(blocks);
    free(k);
    free(v);
}

/* Node id holds every chunk complete (want true) or none of them (want false). */
static bool s_dir(kvedge_mview_t *v, const char *id, const kvedge_chunk_id_t *ids, uint32_t n,
                  bool want)
{
    for (uint32_t i = 0; i < n; i++) {
        kvedge_master_dir_t d;
        bool has = kvedge_mview_dir(v, id, &ids[i], &d) == KVEDGE_OK && d.layers == S_LAYERS &&
                   kvedge_master_dir_has(&d, S_LAYERS - 1) && kvedge_master_dir_has(&d, 0);
        if (has != want)
            return false;
    }
    return true;
}

static void s_wait_dir(kvedge_mview_t *v, const char *id, const kvedge_chunk_id_t *ids, uint32_t n,
                       bool want)
{
    double end = bench_now_s() + 60;
    while (!s_dir(v, id, ids, n, want)) {
        if (bench_now_s() > end) {
            fprintf(stderr, "the directory did not show %s %s the chain\n", id,
                    want ? "holding" : "without");
            exit(1);
        }
        zclock_sleep(20); /* the poll interval of a wait with a deadline */
    }
}

/* Reads the chain from c layer by layer, as the mover does; returns bytes read. */
static uint64_t s_get_all(kvedge_client_t *c, const kvedge_chunk_id_t *ids, uint32_t n,
                          uint8_t *buf, size_t cap)
{
    kvedge_fetched_t out[S_HEADS];
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint16_t l = 0; l < S_LAYERS; l++) {
            uint32_t heads = 0;
            KVEDGE_BENCH_CHECK(
                kvedge_client_get_layer(c, &ids[i], 1, l, buf, cap, out, S_HEADS, &heads));
            for (uint32_t h = 0; h < heads; h++)
                bytes += out[h].len;
        }
    return bytes;
}

/* The chain read from src and put to dst layer by layer, only the PUTs timed: the write side's
 * own ceiling. Returns the seconds spent in PUT. */
static double s_put_only(kvedge_client_t *src, kvedge_client_t *dst, const kvedge_chunk_id_t *ids,
                         uint32_t n, uint8_t *buf, size_t cap)
{
    kvedge_fetched_t out[S_HEADS];
    kvedge_put_item_t items[S_HEADS];
    double spent = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint16_t l = 0; l < S_LAYERS; l++) {
            uint32_t heads = 0;
            KVEDGE_BENCH_CHECK(
                kvedge_client_get_layer(src, &ids[i], 1, l, buf, cap, out, S_HEADS, &heads));
            for (uint32_t h = 0; h < heads; h++) {
                memset(&items[h], 0, sizeof items[h]);
                items[h].chunk.id = ids[i];
                items[h].chunk.has_parent = i > 0;
                if (i > 0)
                    items[h].chunk.parent = ids[i - 1];
                snprintf(items[h].chunk.model_id, sizeof items[h].chunk.model_id, S_MODEL);
                items[h].chunk.index = i;
                items[h].chunk.tokens = S_TOKENS;
                items[h].layer = l;
                items[h].head = (uint16_t)h;
                items[h].block = buf + out[h].offset;
                items[h].len = out[h].len;
            }
            double t0 = bench_now_s();
            KVEDGE_BENCH_CHECK(kvedge_client_put(dst, items, heads, NULL));
            spent += bench_now_s() - t0;
        }
    return spent;
}

/* One re-replication of the chain c1 -> c2 through the mover's core; its result. */
static kvedge_mover_result_t s_copy(kvedge_mview_t *v, kvedge_mover_conns_t *conns)
{
    kvedge_tier_t *t = NULL;
    KVEDGE_BENCH_CHECK(kvedge_tier_read(v, kvedge_wall_ms(), 86400000ull, &t));
    int c1 = kvedge_tier_find(t, "c1");
    KVEDGE_BENCH_CHECK(c1 < 0 ? KVEDGE_ENOTFOUND : kvedge_mover_list(conns, t, (size_t)c1));
    kvedge_move_t *m = NULL;
    size_t n = 0;
    KVEDGE_BENCH_CHECK(kvedge_tier_plan(t, KVEDGE_MOVER_REPAIR, 2, -1, &m, &n));
    kvedge_mover_result_t res = {0};
    kvedge_mover_copy_all(conns, t, m, n, &res);
    if (res.copies_failed || !res.copies_done) {
        fprintf(stderr, "copies: %llu done, %llu failed\n", (unsigned long long)res.copies_done,
                (unsigned long long)res.copies_failed);
        exit(1);
    }
    free(m);
    kvedge_tier_destroy(&t);
    return res;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double s_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, s_cmp);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    uint32_t chunks = argc > 1 ? (uint32_t)atoi(argv[1]) : 4;
    if (chunks < 1 || chunks > S_MAX) {
        fprintf(stderr, "usage: bench_mover [CHUNKS 1..%d]\n", S_MAX);
        return 2;
    }
    kvedge_log_set_level(KVEDGE_LOG_WARN);
    char root[] = "/tmp/kvedge-bench-mover-XXXXXX";
    if (!mkdtemp(root))
        return 1;
    char mdir[300], mep[300], mpub[300];
    snprintf(mdir, sizeof mdir, "%s/master", root);
    snprintf(mep, sizeof mep, "ipc://%s/m.sock", root);
    snprintf(mpub, sizeof mpub, "ipc://%s/mp.sock", root);
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = mep;
    mo.pub = mpub;
    mo.data_dir = mdir;
    mo.insecure = true;
    kvedge_master_t *master = NULL;
    KVEDGE_BENCH_CHECK(kvedge_master_start(&mo, &master, NULL, 0));
    kvedge_node_t *n1 = s_node(root, "c1", mep, mpub), *n2 = s_node(root, "c2", mep, mpub);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = mep;
    vo.pub = mpub;
    kvedge_mview_t *v = NULL;
    KVEDGE_BENCH_CHECK(kvedge_mview_start(&vo, &v));
    kvedge_client_t *c1 = s_client(kvedge_node_endpoint(n1));
    kvedge_client_t *c2 = s_client(kvedge_node_endpoint(n2));
    kvedge_chunk_id_t ids[S_MAX];
    s_put_chain(c1, ids, chunks);
    s_wait_dir(v, "c1", ids, chunks, true);
    /* Both nodes up in the registry before any plan (placement picks among up nodes). */
    for (double end = bench_now_s() + 30;; zclock_sleep(50)) {
        kvedge_master_health_t h1, h2;
        if (kvedge_mview_health(v, "c1", &h1) == KVEDGE_OK &&
            kvedge_mview_health(v, "c2", &h2) == KVEDGE_OK && h1.state == KVEDGE_MASTER_HEALTH_UP &&
            h2.state == KVEDGE_MASTER_HEALTH_UP)
            break;
        if (bench_now_s() > end)
            return 1;
    }
    size_t cap = 64u << 20;
    uint8_t *buf = bench_alloc(cap);
    kvedge_mover_io_t io = {.bw = 0};
    kvedge_mover_conns_t *conns = kvedge_mover_conns_new(&io);
    double get_mb[KVEDGE_BENCH_REPS_MIN], copy_mb[KVEDGE_BENCH_REPS_MIN],
        put_mb[KVEDGE_BENCH_REPS_MIN];
    uint64_t bytes = 0;
    for (int r = 0; r < KVEDGE_BENCH_REPS_MIN; r++) {
        double t0 = bench_now_s();
        bytes = s_get_all(c1, ids, chunks, buf, cap);
        get_mb[r] = (double)bytes / (bench_now_s() - t0) / KVEDGE_BENCH_MB;
        kvedge_mover_result_t res = s_copy(v, conns);
        copy_mb[r] = (double)res.bytes / ((double)res.elapsed_us / 1e6) / KVEDGE_BENCH_MB;
        s_wait_dir(v, "c2", ids, chunks, true);
        KVEDGE_BENCH_CHECK(kvedge_client_delete(c2, ids, 1, NULL)); /* the chain, for the next */
        s_wait_dir(v, "c2", ids, chunks, false);
        put_mb[r] = (double)bytes / s_put_only(c1, c2, ids, chunks, buf, cap) / KVEDGE_BENCH_MB;
        KVEDGE_BENCH_CHECK(kvedge_client_delete(c2, ids, 1, NULL));
        s_wait_dir(v, "c2", ids, chunks, false);
    }
    double g = s_median(get_mb, KVEDGE_BENCH_REPS_MIN),
           c = s_median(copy_mb, KVEDGE_BENCH_REPS_MIN);
    printf("chain: %u chunks of %s (%u layers x %u heads x %u tokens, lossless fp16), %llu bytes\n",
           chunks, S_MODEL, S_LAYERS, S_HEADS, S_TOKENS, (unsigned long long)bytes);
    printf("GET_LAYER from c1 (loopback tcp), median of %d: %.1f MB/s\n", KVEDGE_BENCH_REPS_MIN, g);
    printf("re-replication c1 -> c2 (GET_LAYER + PUT), median of %d: %.1f MB/s\n",
           KVEDGE_BENCH_REPS_MIN, c);
    double p = s_median(put_mb, KVEDGE_BENCH_REPS_MIN);
    printf("PUT of the same blocks to c2 (loopback tcp, PUT time only), median of %d: %.1f MB/s\n",
           KVEDGE_BENCH_REPS_MIN, p);
    printf("ratio re-replication / GET: %.2f; re-replication / PUT: %.2f\n", c / g, c / p);
    free(buf);
    kvedge_mover_conns_destroy(&conns);
    kvedge_client_destroy(&c2);
    kvedge_client_destroy(&c1);
    kvedge_mview_destroy(&v);
    kvedge_node_destroy(&n2);
    kvedge_node_destroy(&n1);
    kvedge_master_destroy(&master);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : 1;
}
