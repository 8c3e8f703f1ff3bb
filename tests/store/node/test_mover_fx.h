/* A cloud tier for the mover's tests (test_mover, test_rebalance): one embedded master with
 * short health timings, cloud store nodes joined to it (in this process, or a `kvedge store`
 * process a test can SIGKILL), contexts put to R = 2 nodes chosen by kvedge_place_pick on their
 * root chunk, and checks against the directory: complete replicas, bit-exact blocks. */
#ifndef KVEDGE_TESTS_MOVER_FX_H
#define KVEDGE_TESTS_MOVER_FX_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "access/placement.h"
#include "clients/lib/kvedge.h"
#include "runtime/mview.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "tests/common/spawn.h"
#include "tests/common/testutil.h"

#define MV_MODEL      "mv-tiny" /* registered by the test: not built in */
#define MV_LAYERS     4
#define MV_HEADS      2
#define MV_DIM        16
#define MV_TOKENS     16 /* per chunk */
#define MV_CHUNKS     3  /* per context */
#define MV_MAX_NODES  6
#define MV_MAX_CTX    16
#define MV_CAPACITY   (1ull << 30)
#define MV_SUSPECT_MS 2500 /* above the nodes' 1 s heartbeat, with room for a loaded runner */
#define MV_DOWN_MS    4000

typedef struct {
    char id[16];
    char dir[260], ep[280];
    uint64_t capacity;
    kvedge_node_t *node; /* in this process */
    pid_t pid;           /* or a process */
} mv_node_t;

typedef struct {
    kvedge_chunk_id_t ids[MV_CHUNKS];
    uint8_t *blocks[MV_CHUNKS][MV_LAYERS][MV_HEADS];
    size_t lens[MV_CHUNKS][MV_LAYERS][MV_HEADS];
} mv_ctx_t;

typedef struct {
    char root[200], mdir[260], mep[280], mpub[280];
    kvedge_master_t *master;
    kvedge_mview_t *reg; /* the whole registry, for the checks */
    mv_node_t nodes[MV_MAX_NODES];
    int n;
    mv_ctx_t ctx[MV_MAX_CTX];
    int nctx;
} mv_fx_t;

static inline void mv_master(mv_fx_t *f)
{
    snprintf(f->root, sizeof f->root, "/tmp/kvedge-mover-XXXXXX");
    assert_non_null(mkdtemp(f->root));
    snprintf(f->mdir, sizeof f->mdir, "%.200s/master", f->root);
    snprintf(f->mep, sizeof f->mep, "ipc://%.200s/m.sock", f->root);
    snprintf(f->mpub, sizeof f->mpub, "ipc://%.200s/mp.sock", f->root);
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = f->mep;
    mo.pub = f->mpub;
    mo.data_dir = f->mdir;
    mo.insecure = true;
    mo.suspect_ms = MV_SUSPECT_MS;
    mo.down_ms = MV_DOWN_MS;
    assert_int_equal(kvedge_master_start(&mo, &f->master, NULL, 0), KVEDGE_OK);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = f->mep;
    vo.pub = f->mpub;
    assert_int_equal(kvedge_mview_start(&vo, &f->reg), KVEDGE_OK);
}

static inline mv_node_t *mv_slot(mv_fx_t *f, uint64_t capacity)
{
    assert_true(f->n < MV_MAX_NODES);
    mv_node_t *nd = &f->nodes[f->n];
    memset(nd, 0, sizeof *nd);
    char root[200];
    memcpy(root, f->root, sizeof root);
    snprintf(nd->id, sizeof nd->id, "c%d", f->n + 1);
    snprintf(nd->dir, sizeof nd->dir, "%.199s/c%d", root, f->n + 1);
    snprintf(nd->ep, sizeof nd->ep, "ipc://%.199s/c%d.sock", root, f->n + 1);
    nd->capacity = capacity;
    f->n++;
    return nd;
}

/* A cloud node in this process, joined to the master; its mover gives up a node after
 * grace_s. */
static inline mv_node_t *mv_node(mv_fx_t *f, uint64_t capacity, uint32_t grace_s, bool metrics_on)
{
    mv_node_t *nd = mv_slot(f, capacity);
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "%s", metrics_on ? "127.0.0.1:0" : "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    ns.capacity_bytes = capacity;
    ns.dir_interval_ms = 100;
    ns.mover_grace_s = grace_s;
    ns.mover_bw = 0;
    snprintf(ns.data, sizeof ns.data, "%s", nd->dir);
    snprintf(ns.bind, sizeof ns.bind, "%.250s", nd->ep);
    snprintf(ns.master, sizeof ns.master, "%.250s", f->mep);
    snprintf(ns.master_pub, sizeof ns.master_pub, "%.250s", f->mpub);
    snprintf(ns.node_id, sizeof ns.node_id, "%s", nd->id);
    char why[512] = "";
    if (kvedge_node_start(&ns, &nd->node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node %s: %s", nd->id, why);
    return nd;
}

/* A cloud node as a `kvedge store` process (so a test can SIGKILL it). */
static inline mv_node_t *mv_spawn(mv_fx_t *f, const char *bin, uint64_t capacity, uint32_t grace_s)
{
    mv_node_t *nd = mv_slot(f, capacity);
    char cap[32], grace[32];
    snprintf(cap, sizeof cap, "%llu", (unsigned long long)capacity);
    snprintf(grace, sizeof grace, "%u", grace_s);
    char *const argv[] = {
        "kvedge",     "--data",      nd->dir, "store",      "--role", "cloud",
        "--insecure", "--bind",      nd->ep,  "--master",   f->mep,   "--master-pub",
        f->mpub,      "--node-id",   nd->id,  "--capacity", cap,      "--mover-grace",
        grace,        "--log-level", "warn",  "--metrics",  "off",    NULL};
    char line[700];
    int fd = -1;
    nd->pid = kt_spawn_argv(bin, argv, line, sizeof line, &fd);
    if (nd->pid <= 0)
        fail_msg("spawn %s: %s", nd->id, line);
    if (fd >= 0)
        close(fd);
    return nd;
}

static inline void mv_kill(mv_node_t *nd)
{
    assert_true(nd->pid > 0);
    kill(nd->pid, SIGKILL);
    waitpid(nd->pid, NULL, 0);
    nd->pid = 0;
}

static inline void mv_stop(mv_fx_t *f)
{
    for (int i = 0; i < f->n; i++) {
        kvedge_node_destroy(&f->nodes[i].node);
        if (f->nodes[i].pid > 0)
            mv_kill(&f->nodes[i]);
    }
    kvedge_mview_destroy(&f->reg);
    kvedge_master_destroy(&f->master);
    for (int c = 0; c < f->nctx; c++)
        for (int i = 0; i < MV_CHUNKS; i++)
            for (int l = 0; l < MV_LAYERS; l++)
                for (int h = 0; h < MV_HEADS; h++)
                    free(f->ctx[c].blocks[i][l][h]);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->root);
    assert_int_equal(system(cmd), 0);
}

/* Whether the registry shows node id up. */
static inline bool mv_up(mv_fx_t *f, const char *id)
{
    kvedge_master_health_t h;
    return kvedge_mview_health(f->reg, id, &h) == KVEDGE_OK && h.state == KVEDGE_MASTER_HEALTH_UP;
}

static inline void mv_wait_up(mv_fx_t *f, int i)
{
    kt_wait_for(mv_up(f, f->nodes[i].id), KT_WAIT_MS);
}

/* Waits until the master holds every node of the fixture up. */
static inline void mv_wait_all_up(mv_fx_t *f)
{
    for (int i = 0; i < f->n; i++)
        mv_wait_up(f, i);
}

/* A fixture with its master and n in-process cloud nodes of MV_CAPACITY, grace_s, metrics
 * off, all up. Free with mv_stop, then free(). */
static inline mv_fx_t *mv_world(int n, uint32_t grace_s)
{
    mv_fx_t *f = calloc(1, sizeof *f);
    assert_non_null(f);
    mv_master(f);
    for (int i = 0; i < n; i++)
        mv_node(f, MV_CAPACITY, grace_s, false);
    mv_wait_all_up(f);
    return f;
}

static inline kvedge_client_t *mv_client(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = 5000;
    kvedge_client_t *c = NULL;
    assert_int_equal(kvedge_client_connect(&o, &c), KVEDGE_OK);
    return c;
}

/* The placement of a root over the fixture's nodes [0, upto) (all up, their capacities). */
static inline uint32_t mv_place(mv_fx_t *f, int upto, const kvedge_chunk_id_t *root,
                                uint32_t out[KVEDGE_PLACE_MAX_REPLICAS])
{
    kvedge_place_node_t pn[MV_MAX_NODES];
    for (int i = 0; i < upto; i++) {
        memset(&pn[i], 0, sizeof pn[i]);
        snprintf(pn[i].id, sizeof pn[i].id, "%s", f->nodes[i].id);
        pn[i].weight = f->nodes[i].capacity;
        pn[i].up = true;
    }
    uint32_t got = 0;
    assert_int_equal(kvedge_place_pick(root, pn, (size_t)upto, 2, out, &got), KVEDGE_OK);
    return got;
}

#define MV_ITEMS (MV_CHUNKS * MV_LAYERS * MV_HEADS)

/* Makes context c: its chain, its blocks (kept in f->ctx[c]) and the MV_ITEMS items that put
 * it (pointing into the blocks). */
static inline void mv_make_context(mv_fx_t *f, int c, kvedge_put_item_t items[MV_ITEMS])
{
    mv_ctx_t *x = &f->ctx[c];
    uint32_t tok[MV_CHUNKS * MV_TOKENS];
    for (uint32_t i = 0; i < MV_CHUNKS * MV_TOKENS; i++)
        tok[i] = (uint32_t)(c * 1000 + 3 * i + 1);
    assert_int_equal(kvedge_chunk_chain(NULL, 0, MV_MODEL, tok, MV_CHUNKS * MV_TOKENS, MV_TOKENS,
                                        x->ids, MV_CHUNKS),
                     MV_CHUNKS);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP16, KVEDGE_SCHEME_LOSSLESS, MV_TOKENS, MV_DIM, 0, NULL, false};
    size_t k = 0;
    for (int i = 0; i < MV_CHUNKS; i++)
        for (int l = 0; l < MV_LAYERS; l++)
            for (int h = 0; h < MV_HEADS; h++) {
                x->blocks[i][l][h] = kt_encode(
                    &spec, (uint64_t)(c * 100000 + i * 1000 + l * 10 + h), &x->lens[i][l][h]);
                assert_non_null(x->blocks[i][l][h]);
                kvedge_put_item_t *it = &items[k++];
                memset(it, 0, sizeof *it);
                it->chunk.id = x->ids[i];
                it->chunk.has_parent = i > 0;
                if (i > 0)
                    it->chunk.parent = x->ids[i - 1];
                snprintf(it->chunk.model_id, sizeof it->chunk.model_id, "%s", MV_MODEL);
                it->chunk.index = (uint32_t)i;
                it->chunk.tokens = MV_TOKENS;
                it->layer = (uint16_t)l;
                it->head = (uint16_t)h;
                it->block = x->blocks[i][l][h];
                it->len = x->lens[i][l][h];
            }
    if (c >= f->nctx)
        f->nctx = c + 1;
}

/* Registers the test's model and puts the items through cl. */
static inline void mv_put_items(kvedge_client_t *cl, const kvedge_put_item_t items[MV_ITEMS])
{
    kvedge_model_t m = {.id = MV_MODEL,
                        .layers = MV_LAYERS,
                        .kv_heads = MV_HEADS,
                        .head_dim = MV_DIM,
                        .dtype = KVEDGE_DTYPE_FP16};
    int rc = kvedge_client_put_model(cl, &m);
    assert_true(rc == KVEDGE_OK || rc == KVEDGE_ESHAPE);
    assert_int_equal(kvedge_client_put(cl, items, MV_ITEMS, NULL), KVEDGE_OK);
}

/* Makes context c and puts it (plaintext) to the n nodes of indexes to[]. */
static inline void mv_put_context_on(mv_fx_t *f, int c, const uint32_t *to, uint32_t n)
{
    kvedge_put_item_t items[MV_ITEMS];
    mv_make_context(f, c, items);
    for (uint32_t r = 0; r < n; r++) {
        kvedge_client_t *cl = mv_client(f->nodes[to[r]].ep);
        mv_put_items(cl, items);
        kvedge_client_destroy(&cl);
    }
}

/* Context c put to the 2 nodes its root is placed on among nodes [0, upto). */
static inline void mv_put_context(mv_fx_t *f, int c, int upto)
{
    uint32_t tok[MV_CHUNKS * MV_TOKENS];
    for (uint32_t i = 0; i < MV_CHUNKS * MV_TOKENS; i++)
        tok[i] = (uint32_t)(c * 1000 + 3 * i + 1);
    kvedge_chunk_id_t root;
    assert_int_equal(kvedge_chunk_chain(NULL, 0, MV_MODEL, tok, MV_TOKENS, MV_TOKENS, &root, 1), 1);
    uint32_t pick[KVEDGE_PLACE_MAX_REPLICAS];
    assert_int_equal(mv_place(f, upto, &root, pick), 2);
    mv_put_context_on(f, c, pick, 2);
}

/* Whether the directory shows chunk id complete (every layer) on node id. */
static inline bool mv_dir_complete(mv_fx_t *f, const char *node, const kvedge_chunk_id_t *id)
{
    kvedge_master_dir_t d;
    if (kvedge_mview_dir(f->reg, node, id, &d) != KVEDGE_OK || d.layers != MV_LAYERS)
        return false;
    for (unsigned l = 0; l < MV_LAYERS; l++)
        if (!kvedge_master_dir_has(&d, l))
            return false;
    return true;
}

/* How many of nodes [0, f->n) other than `except` hold chunk id complete, per the directory. */
static inline int mv_holders(mv_fx_t *f, const kvedge_chunk_id_t *id, int except)
{
    int n = 0;
    for (int i = 0; i < f->n; i++)
        n += i != except && mv_dir_complete(f, f->nodes[i].id, id);
    return n;
}

/* Every chunk of every context has exactly `want` complete replicas outside `except`. */
static inline bool mv_all_replicated(mv_fx_t *f, int want, int except)
{
    for (int c = 0; c < f->nctx; c++)
        for (int i = 0; i < MV_CHUNKS; i++)
            if (mv_holders(f, &f->ctx[c].ids[i], except) != want)
                return false;
    return true;
}

/* Chunk i of context c read from the node at ep is bit-exact: 1; a miss: 0; a wrong block: -1. */
static inline int mv_read_chunk(kvedge_client_t *cl, const mv_ctx_t *x, int i)
{
    kvedge_block_key_t keys[MV_LAYERS * MV_HEADS];
    kvedge_fetched_t out[MV_LAYERS * MV_HEADS];
    size_t k = 0;
    for (int l = 0; l < MV_LAYERS; l++)
        for (int h = 0; h < MV_HEADS; h++)
            keys[k++] = (kvedge_block_key_t){x->ids[i], (uint16_t)l, (uint16_t)h};
    static _Thread_local uint8_t buf[1 << 20];
    if (kvedge_client_get(cl, keys, k, buf, sizeof buf, out) != KVEDGE_OK)
        return 0;
    k = 0;
    for (int l = 0; l < MV_LAYERS; l++)
        for (int h = 0; h < MV_HEADS; h++, k++) {
            if (out[k].status != KVEDGE_OK)
                return 0;
            if (out[k].len != x->lens[i][l][h] ||
                memcmp(buf + out[k].offset, x->blocks[i][l][h], out[k].len) != 0)
                return -1;
        }
    return 1;
}

/* Every complete replica the directory lists (outside `except`) is bit-exact. */
static inline void mv_verify_all(mv_fx_t *f, int except)
{
    for (int n = 0; n < f->n; n++) {
        if (n == except)
            continue;
        kvedge_client_t *cl = mv_client(f->nodes[n].ep);
        for (int c = 0; c < f->nctx; c++)
            for (int i = 0; i < MV_CHUNKS; i++)
                if (mv_dir_complete(f, f->nodes[n].id, &f->ctx[c].ids[i]) &&
                    mv_read_chunk(cl, &f->ctx[c], i) != 1)
                    fail_msg("context %d chunk %d on %s is not bit-exact", c, i, f->nodes[n].id);
        kvedge_client_destroy(&cl);
    }
}

#endif
