/* `kvedge prefill --master` puts to the placement: a Storage Master (in this process, no etcd),
 * four cloud store nodes in their own processes registered with it (capacities 1:1:2:1), and
 * an edge proxy that learns them from the master. Twenty contexts prefilled with R = 2 are on
 * exactly the two nodes access/placement.h names (each node's LIST); the proxy fetches each one
 * from its holders only, the cheaper of the two when their links differ; a replica SIGKILLed: W = 2
 * fails naming it, W = 1 succeeds with "1 of 2", and every acknowledged context is still fetched
 * bit-exact through the proxy from its other replica, also when a replica serving a request is
 * killed in the middle of it. Bad input: no cloud node with a capacity, W = 0, W > R, -H with
 * --replicas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "access/codec/error.h"
#include "access/placement.h"
#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "runtime/mview.h"
#include "store/master/master.h"
#include "tests/common/ctx_fx.h"
#include "tests/common/shell.h"
#include "tests/common/spawn.h"
#include "tests/common/testutil.h"
#include "tests/common/world.h"

#define S_NODES      4
#define S_CONTEXTS   20
#define S_LAYERS     4
#define S_HEADS      2  /* KV heads of the synthetic model (head_dim 16) */
#define S_CT         64 /* tokens per chunk */
#define S_MODEL      "synth-place"
#define S_MAX_CHUNKS 8

static const char *const s_ids[S_NODES] = {"c1", "c2", "c3", "c4"};
static const char *const s_caps[S_NODES] = {"1G", "1G", "2G", "1G"};

typedef struct {
    char root[64];
    char weights[128];
    kvedge_master_t *master;
    char mep[128], mpub[128];
    kvedge_mview_t *view; /* the whole registry */
    pid_t pid[S_NODES];
    char ep[S_NODES][160];
} s_world_t;

/* A cloud node in its own process, registered with the master under id, of capacity cap. */
static pid_t s_spawn_node(s_world_t *w, int i, const char *cap)
{
    char data[160], ep[160];
    snprintf(data, sizeof data, "%s/%s", w->root, s_ids[i]);
    snprintf(ep, sizeof ep, "ipc://%s/%s.sock", w->root, s_ids[i]);
    memcpy(w->ep[i], ep, sizeof ep);
    char *const argv[] = {"kvedge",     "--data",    data,
                          "store",      "--role",    "cloud",
                          "--insecure", "--bind",    w->ep[i],
                          "--master",   w->mep,      "--master-pub",
                          w->mpub,      "--node-id", (char *)s_ids[i],
                          "--capacity", (char *)cap, "--log-level",
                          "error",      "--metrics", "off",
                          NULL};
    char line[700];
    int fd = -1;
    pid_t pid = kt_spawn_argv(KVEDGE_BIN, argv, line, sizeof line, &fd);
    assert_true(pid > 0);
    if (fd >= 0)
        close(fd);
    return pid;
}

static void s_world_start(s_world_t *w, int nodes, const char *const *caps, uint32_t down_ms)
{
    memset(w, 0, sizeof *w);
    snprintf(w->root, sizeof w->root, "/tmp/kvedge-place-XXXXXX");
    assert_non_null(mkdtemp(w->root));
    snprintf(w->weights, sizeof w->weights, "%s/w.safetensors", w->root);
    kt_synth(w->weights, S_LAYERS, S_HEADS, 300, 1024, 7);
    snprintf(w->mep, sizeof w->mep, "ipc://%s/m.sock", w->root);
    snprintf(w->mpub, sizeof w->mpub, "ipc://%s/mp.sock", w->root);
    char mdir[160];
    snprintf(mdir, sizeof mdir, "%s/master", w->root);
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = w->mep;
    mo.pub = w->mpub;
    mo.data_dir = mdir;
    mo.insecure = true;
    mo.suspect_ms = down_ms < 3000 ? down_ms / 2 : 0;
    mo.down_ms = down_ms;
    assert_int_equal(kvedge_master_start(&mo, &w->master, NULL, 0), KVEDGE_OK);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = w->mep;
    vo.pub = w->mpub;
    assert_int_equal(kvedge_mview_start(&vo, &w->view), KVEDGE_OK);
    for (int i = 0; i < nodes; i++)
        w->pid[i] = s_spawn_node(w, i, caps[i]);
}

static void s_world_stop(s_world_t *w)
{
    for (int i = 0; i < S_NODES; i++)
        if (w->pid[i] > 0) {
            kill(w->pid[i], SIGTERM);
            waitpid(w->pid[i], NULL, 0);
        }
    kvedge_mview_destroy(&w->view);
    kvedge_master_destroy(&w->master);
    assert_int_equal(kt_sh("rm -rf '%s'", w->root), 0);
}

typedef struct {
    s_world_t *w;
    int n;
} s_count_t;

/* The registry has n node records, each with health up. */
static bool s_nodes_up(void *arg)
{
    s_count_t *c = arg;
    for (int i = 0; i < c->n; i++) {
        kvedge_master_health_t h;
        kvedge_master_node_t rec;
        if (kvedge_mview_node(c->w->view, s_ids[i], &rec) != KVEDGE_OK ||
            kvedge_mview_health(c->w->view, s_ids[i], &h) != KVEDGE_OK ||
            h.state != KVEDGE_MASTER_HEALTH_UP)
            return false;
    }
    return true;
}

/* ---------------------------------------------------------------- prefill through the CLI */

typedef struct {
    int rc;
    char out[16384];
    cJSON *doc; /* --json output, when it parsed */
    size_t n_chunks;
    kvedge_chunk_id_t chunks[S_MAX_CHUNKS];
    uint32_t tokens;
    char placed[2][16]; /* the replicas that acknowledged */
    int n_placed;
} s_prefill_t;

static int s_hex_nibble(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void s_parse_id(const char *hex, kvedge_chunk_id_t *out)
{
    assert_int_equal(strlen(hex), 2 * sizeof out->bytes);
    for (size_t i = 0; i < sizeof out->bytes; i++)
        out->bytes[i] = (uint8_t)(s_hex_nibble(hex[2 * i]) << 4 | s_hex_nibble(hex[2 * i + 1]));
}

/* Runs `kvedge --json prefill --master ...` on context k with extra flags; parses the JSON. */
static void s_prefill(s_world_t *w, int k, const char *extra, s_prefill_t *p)
{
    memset(p, 0, sizeof *p);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s --json --deadline 1500 prefill --master %s --master-pub %s -w %s --model-id %s "
             "--chunk-tokens %d --scheme lossless --context 'context %d: the quick brown fox "
             "jumps over the lazy dog, again and again, while the placement spreads contexts "
             "over the cloud tier (%d)' %s 2>&1",
             KVEDGE_BIN, w->mep, w->mpub, w->weights, S_MODEL, S_CT, k, k * 7919, extra);
    p->rc = kt_capture(cmd, p->out, sizeof p->out);
    const char *brace = strchr(p->out, '{');
    p->doc = brace ? cJSON_Parse(brace) : NULL;
    if (!p->doc)
        return;
    const cJSON *chunks = cJSON_GetObjectItem(p->doc, "chunks");
    const cJSON *c;
    cJSON_ArrayForEach(c, chunks)
    {
        assert_true(p->n_chunks < S_MAX_CHUNKS);
        s_parse_id(c->valuestring, &p->chunks[p->n_chunks++]);
    }
    p->tokens = (uint32_t)cJSON_GetObjectItem(p->doc, "tokens")->valuedouble;
    const cJSON *nodes = cJSON_GetObjectItem(cJSON_GetObjectItem(p->doc, "replicas"), "nodes");
    cJSON_ArrayForEach(c, nodes)
    {
        if (cJSON_IsTrue(cJSON_GetObjectItem(c, "ok")) && p->n_placed < 2)
            snprintf(p->placed[p->n_placed++], sizeof p->placed[0], "%s",
                     cJSON_GetObjectItem(c, "id")->valuestring);
    }
}

static void s_prefill_free(s_prefill_t *p)
{
    cJSON_Delete(p->doc);
    p->doc = NULL;
}

/* The placement access/placement.h computes for root over the registry's nodes (all up). */
static void s_expected(s_world_t *w, const kvedge_chunk_id_t *root, char out[2][16])
{
    kvedge_place_node_t nodes[S_NODES];
    for (int i = 0; i < S_NODES; i++) {
        kvedge_master_node_t rec;
        assert_int_equal(kvedge_mview_node(w->view, s_ids[i], &rec), KVEDGE_OK);
        memset(&nodes[i], 0, sizeof nodes[i]);
        snprintf(nodes[i].id, sizeof nodes[i].id, "%s", s_ids[i]);
        nodes[i].weight = rec.capacity_bytes;
        nodes[i].up = true;
    }
    uint32_t pick[2], got = 0;
    assert_int_equal(kvedge_place_pick(root, nodes, S_NODES, 2, pick, &got), KVEDGE_OK);
    assert_int_equal(got, 2);
    for (int i = 0; i < 2; i++)
        snprintf(out[i], sizeof out[i], "%s", s_ids[pick[i]]);
}

static bool s_named(const char names[2][16], int n, const char *id)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], id) == 0)
            return true;
    return false;
}

/* Whether node i's LIST holds every chunk of the chain. */
static bool s_node_holds(s_world_t *w, int i, const s_prefill_t *p, int *held_any)
{
    kvedge_client_t *c = kt_client(w->ep[i], 3000);
    kvedge_chunk_entry_t *all = NULL;
    size_t n = 0;
    assert_int_equal(kvedge_client_list_all(c, &all, &n), KVEDGE_OK);
    size_t held = 0;
    for (size_t k = 0; k < p->n_chunks; k++)
        for (size_t e = 0; e < n; e++)
            if (memcmp(all[e].chunk.id.bytes, p->chunks[k].bytes, sizeof p->chunks[k].bytes) == 0 &&
                all[e].blocks == S_LAYERS * S_HEADS) {
                held++;
                break;
            }
    free(all);
    kvedge_client_destroy(&c);
    *held_any = held > 0;
    return held == p->n_chunks;
}

/* The reference bytes of every block, read from node i (what was put). */
typedef struct {
    uint8_t *buf;
    kvedge_fetched_t got[S_LAYERS * S_MAX_CHUNKS * S_HEADS];
} s_ref_t;

static void s_read_ref(s_world_t *w, int i, const s_prefill_t *p, s_ref_t *ref)
{
    kvedge_block_key_t keys[S_LAYERS * S_MAX_CHUNKS * S_HEADS];
    size_t n = 0;
    for (uint16_t l = 0; l < S_LAYERS; l++)
        for (size_t c = 0; c < p->n_chunks; c++)
            for (uint16_t h = 0; h < S_HEADS; h++)
                keys[n++] = (kvedge_block_key_t){p->chunks[c], l, h};
    size_t cap = 4u << 20;
    ref->buf = malloc(cap);
    assert_non_null(ref->buf);
    kvedge_client_t *cl = kt_client(w->ep[i], 3000);
    assert_int_equal(kvedge_client_get(cl, keys, n, ref->buf, cap, ref->got), KVEDGE_OK);
    for (size_t k = 0; k < n; k++)
        assert_int_equal(ref->got[k].status, KVEDGE_OK);
    kvedge_client_destroy(&cl);
}

/* ---------------------------------------------------------------- fetching through the proxy */

/* The end of a FETCH, awaited by s_run_fetch: the first member of each fetch's state. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
} s_sync_t;

static void s_sync_done(void *ctx, int status)
{
    s_sync_t *y = ctx;
    pthread_mutex_lock(&y->mu);
    y->done = true;
    y->status = status;
    pthread_cond_signal(&y->cv);
    pthread_mutex_unlock(&y->mu);
}

/* Sends req through the proxy at pep with cbs (their done is s_sync_done) and waits for its
 * end; ctx starts with the s_sync_t, which is set up and torn down here. */
static void s_run_fetch(const char *pep, const kvedge_fetch_req_t *req, kvedge_fetch_cbs_t cbs,
                        void *ctx)
{
    s_sync_t *y = ctx;
    pthread_mutex_init(&y->mu, NULL);
    pthread_cond_init(&y->cv, NULL);
    kvedge_client_t *c = kt_client(pep, (int)req->deadline_ms);
    cbs.on_done = s_sync_done;
    assert_int_equal(kvedge_client_fetch_async(c, req, &cbs, ctx), KVEDGE_OK);
    pthread_mutex_lock(&y->mu);
    while (!y->done)
        pthread_cond_wait(&y->cv, &y->mu);
    pthread_mutex_unlock(&y->mu);
    kvedge_client_destroy(&c);
    pthread_cond_destroy(&y->cv);
    pthread_mutex_destroy(&y->mu);
}

typedef struct {
    s_sync_t sync;
    const s_prefill_t *p;
    const s_ref_t *ref;
    uint32_t blocks, mismatches, layers, delivered;
    char source[S_LAYERS][64];
    char why[S_LAYERS * 48]; /* each layer not delivered: "L:reason(status) " */
} s_fetch_t;

static void s_f_plan(void *ctx, const kvedge_fetch_plan_t *plan)
{
    (void)ctx;
    (void)plan;
}

static void s_f_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source, int status,
                      const uint8_t *data, size_t len)
{
    (void)source;
    s_fetch_t *f = ctx;
    f->blocks++;
    size_t k = ((size_t)layer * f->p->n_chunks + ci) * S_HEADS + head;
    if (status != 0 || layer >= S_LAYERS || ci >= f->p->n_chunks || head >= S_HEADS ||
        len != f->ref->got[k].len || memcmp(data, f->ref->buf + f->ref->got[k].offset, len) != 0)
        f->mismatches++;
}

static void s_f_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_fetch_t *f = ctx;
    if (l->layer < S_LAYERS)
        snprintf(f->source[l->layer], sizeof f->source[0], "%s", l->source_name);
    f->layers++;
    f->delivered += l->status == 0;
    if (l->status != 0) {
        size_t at = strlen(f->why);
        snprintf(f->why + at, sizeof f->why - at, "%u:%s(%d) ", l->layer,
                 kvedge_fetch_reason_name(l->reason), l->status);
    }
}

/* FETCH of every layer of p's context through the proxy at pep, each block compared. */
static void s_fetch(const char *pep, const s_prefill_t *p, const s_ref_t *ref, s_fetch_t *f)
{
    memset(f, 0, sizeof *f);
    f->p = p;
    f->ref = ref;
    kvedge_fetch_req_t req;
    kvedge_fetch_req_default(&req);
    req.model_id = S_MODEL;
    req.chunks = p->chunks;
    req.n = p->n_chunks;
    req.layers = S_LAYERS;
    req.tokens = p->tokens;
    req.deadline_ms = 10000;
    s_run_fetch(pep, &req, (kvedge_fetch_cbs_t){s_f_plan, s_f_block, s_f_layer, NULL}, f);
}

typedef struct {
    s_world_t *w;
    const s_prefill_t *p;
} s_dir_t;

/* The master's directory lists every chunk of the context on both its replicas. */
static bool s_dir_has(void *arg)
{
    s_dir_t *d = arg;
    for (int r = 0; r < d->p->n_placed; r++)
        for (size_t c = 0; c < d->p->n_chunks; c++) {
            kvedge_master_dir_t dir;
            if (kvedge_mview_dir(d->w->view, d->p->placed[r], &d->p->chunks[c], &dir) != KVEDGE_OK)
                return false;
        }
    return true;
}

/* An edge proxy following the master, on ROOT/NAME.sock; src (n): sources given by name,
 * which the master's nodes of the same name do not replace. */
static kvedge_proxy_t *s_proxy(s_world_t *w, const char *name, const kvedge_proxy_source_t *src,
                               size_t n, char *pep, size_t cap)
{
    snprintf(pep, cap, "ipc://%s/%s.sock", w->root, name);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = pep;
    po.insecure = true;
    po.id = name;
    po.sources = src;
    po.nsources = n;
    po.master = w->mep;
    po.master_pub = w->mpub;
    /* One layer buffered at a time: the proxy asks a source for the next layer only once the
     * client has the previous one, so a source killed after the first layer still has layers
     * to serve (the mid-request kill below). */
    po.buffer_bytes = 1;
    char why[256];
    kvedge_proxy_t *px = NULL;
    if (kvedge_proxy_start(&po, &px, why, sizeof why) != KVEDGE_OK)
        fail_msg("proxy: %s", why);
    return px;
}

/* ---------------------------------------------------------------- a replica killed mid-request */

static kt_ctx_t s_big; /* opt-125m, 2 chunks: 12 layers x 12 heads, put with the library */

/* The tier as the master's registry has it (every node up). */
static size_t s_tier(s_world_t *w, kvedge_placed_node_t *tier)
{
    size_t n = 0;
    for (int i = 0; i < S_NODES; i++) {
        kvedge_master_node_t rec;
        if (w->pid[i] <= 0 || kvedge_mview_node(w->view, s_ids[i], &rec) != KVEDGE_OK)
            continue;
        memset(&tier[n], 0, sizeof tier[n]);
        snprintf(tier[n].id, sizeof tier[n].id, "%s", s_ids[i]);
        snprintf(tier[n].endpoint, sizeof tier[n].endpoint, "%s", rec.endpoint);
        tier[n].weight = rec.capacity_bytes;
        tier[n].up = true;
        n++;
    }
    return n;
}

/* Puts s_big to its placement with the placed writer; its two replicas into placed. */
static void s_put_big(s_world_t *w, char placed[2][16])
{
    kt_ctx_make(&s_big, 2, 3, 11, true);
    kvedge_placed_node_t tier[S_NODES];
    size_t n = s_tier(w, tier);
    kvedge_placed_opts_t o;
    kvedge_placed_opts_default(&o);
    kvedge_placed_t *pw = NULL;
    assert_int_equal(kvedge_placed_new(&o, tier, n, &s_big.ids[0], &pw), KVEDGE_OK);
    assert_int_equal(kvedge_placed_connect(pw), KVEDGE_OK);
    static kvedge_put_item_t items[KT_CTX_LAYERS * 2 * KT_CTX_HEADS];
    size_t k = 0;
    for (uint16_t l = 0; l < KT_CTX_LAYERS; l++)
        for (uint32_t c = 0; c < 2; c++)
            for (uint16_t h = 0; h < KT_CTX_HEADS; h++) {
                kvedge_put_item_t *it = &items[k++];
                memset(it, 0, sizeof *it);
                it->chunk.id = s_big.ids[c];
                it->chunk.has_parent = c > 0;
                if (c > 0)
                    it->chunk.parent = s_big.ids[c - 1];
                snprintf(it->chunk.model_id, sizeof it->chunk.model_id, "%s", KT_CTX_MODEL);
                it->chunk.index = c;
                it->chunk.tokens = KT_CTX_TOKENS;
                it->layer = l;
                it->head = h;
                it->block = s_big.block[l][c][h];
                it->len = s_big.len[l][c][h];
            }
    assert_int_equal(kvedge_placed_put(pw, items, k), KVEDGE_OK);
    assert_int_equal(kvedge_placed_acked(pw), 2);
    for (uint32_t i = 0; i < 2; i++) {
        kvedge_placed_replica_t r;
        assert_int_equal(kvedge_placed_replica(pw, i, &r), KVEDGE_OK);
        assert_int_equal(r.items, k);
        snprintf(placed[i], sizeof placed[0], "%.15s", r.id);
    }
    kvedge_placed_destroy(&pw);
}

typedef struct {
    s_sync_t sync;
    s_world_t *w;
    kvedge_fetch_plan_t plan;
    int frozen[2];      /* the context's two replicas (node indices), frozen before the request */
    int victim;         /* the one killed at the plan: the one it put the most layers on */
    uint32_t on_victim; /* layers the plan put on it */
    uint32_t blocks, mismatches, delivered, fell_back;
    char source[KT_CTX_LAYERS][64];
    char why[KT_CTX_LAYERS * 40]; /* each layer not delivered: "L:reason " */
} s_big_fetch_t;

/* The plan arrives before any block. Both replicas have been frozen (SIGSTOP) since before the
 * request, so neither has served any of it: the one the plan put the most layers on is
 * SIGKILLed now, with every layer planned on it still to serve, and the other thawed
 * (SIGCONT). Killing a replica after its first delivered layer instead races the proxy,
 * which reads a source's layers as far ahead as its window and the client's credit allow;
 * choosing the victim before the request races the planner, which may plan either replica. */
static void s_b_plan(void *ctx, const kvedge_fetch_plan_t *plan)
{
    s_big_fetch_t *f = ctx;
    f->plan = *plan;
    uint32_t on[2] = {0, 0};
    for (uint32_t l = 0; l < plan->layers && l < KT_CTX_LAYERS; l++) {
        int s = plan->layer[l].source;
        for (int r = 0; r < 2; r++)
            on[r] += s >= 0 && (uint32_t)s < plan->nsources &&
                     strcmp(plan->source[s].name, s_ids[f->frozen[r]]) == 0;
    }
    int v = on[1] > on[0];
    f->victim = f->frozen[v];
    f->on_victim = on[v];
    kill(f->w->pid[f->victim], SIGKILL);
    kill(f->w->pid[f->frozen[!v]], SIGCONT);
}

static void s_b_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source, int status,
                      const uint8_t *data, size_t len)
{
    (void)source;
    s_big_fetch_t *f = ctx;
    f->blocks++;
    if (status != 0 || layer >= KT_CTX_LAYERS || ci >= 2 || head >= KT_CTX_HEADS ||
        len != s_big.len[layer][ci][head] || memcmp(data, s_big.block[layer][ci][head], len) != 0)
        f->mismatches++;
}

static void s_b_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_big_fetch_t *f = ctx;
    if (l->layer < KT_CTX_LAYERS)
        snprintf(f->source[l->layer], sizeof f->source[0], "%s", l->source_name);
    f->delivered += l->status == 0;
    f->fell_back += l->reason == KVEDGE_FETCH_FALLBACK_FAILED;
    if (l->status != 0) {
        size_t at = strlen(f->why);
        snprintf(f->why + at, sizeof f->why - at, "%u:%s ", l->layer,
                 kvedge_fetch_reason_name(l->reason));
    }
}

/* FETCH of s_big through the proxy with its two replicas (node indices r0, r1) frozen just
 * before the request (the proxy still counts them up and plans with them); at the plan one
 * is killed (f->victim, reaped here) and the other thawed (s_b_plan). */
static void s_fetch_big_kill(s_world_t *w, const char *pep, int r0, int r1, s_big_fetch_t *f)
{
    memset(f, 0, sizeof *f);
    f->w = w;
    f->frozen[0] = r0;
    f->frozen[1] = r1;
    f->victim = -1;
    kvedge_fetch_req_t req;
    kvedge_fetch_req_default(&req);
    req.model_id = KT_CTX_MODEL;
    req.chunks = s_big.ids;
    req.n = 2;
    req.layers = KT_CTX_LAYERS;
    req.tokens = 2 * KT_CTX_TOKENS;
    /* The proxy finds a dead source by its silence: a stream's window is STALL_FACTOR times
     * its expected time (round trip at the link's measured RTO included), and a loaded runner
     * inflates the RTO to seconds, so the layers in flight on the dead node may wait several
     * windows before they move. A deadline that leaves room for that: what is checked is
     * where the layers come from, not how fast the silence is judged. */
    req.deadline_ms = 30000;
    assert_int_equal(kill(w->pid[r0], SIGSTOP), 0);
    assert_int_equal(kill(w->pid[r1], SIGSTOP), 0);
    s_run_fetch(pep, &req, (kvedge_fetch_cbs_t){s_b_plan, s_b_block, s_b_layer, NULL}, f);
    if (f->victim < 0) { /* no plan came: thaw both, and fail */
        kill(w->pid[r0], SIGCONT);
        kill(w->pid[r1], SIGCONT);
        fail_msg("the big context's fetch ended with status %d before its plan", f->sync.status);
    }
    waitpid(w->pid[f->victim], NULL, 0);
    w->pid[f->victim] = -1;
}

/* ---------------------------------------------------------------- tests */

static void test_prefill_to_the_placement(void **state)
{
    (void)state;
    s_world_t w;
    /* A killed node stays "suspect" (still placed) for the whole test: the W checks need the
     * placement to keep naming it. */
    s_world_start(&w, S_NODES, s_caps, 600000);
    s_count_t cnt = {&w, S_NODES};
    kt_wait_until(s_nodes_up, &cnt, KT_WAIT_MS);

    static s_prefill_t p[S_CONTEXTS];
    int per_node[S_NODES] = {0};
    for (int k = 0; k < S_CONTEXTS; k++) {
        s_prefill(&w, k, "--replicas 2", &p[k]);
        if (p[k].rc != 0 || !p[k].doc)
            fail_msg("prefill %d: exit %d: %s", k, p[k].rc, p[k].out);
        assert_int_equal(p[k].n_placed, 2);
        assert_true(p[k].n_chunks >= 2);
        /* The replicas are the placement's, and they hold the whole chain; no other node
         * holds any of it. */
        char want[2][16];
        s_expected(&w, &p[k].chunks[0], want);
        assert_true(s_named(p[k].placed, 2, want[0]) && s_named(p[k].placed, 2, want[1]));
        for (int i = 0; i < S_NODES; i++) {
            int any = 0;
            bool whole = s_node_holds(&w, i, &p[k], &any);
            if (s_named(want, 2, s_ids[i])) {
                assert_true(whole);
                per_node[i]++;
            } else {
                assert_false(any);
            }
        }
    }
    printf("20 contexts, R=2: c1 %d, c2 %d, c3 %d (capacity 2G), c4 %d\n", per_node[0], per_node[1],
           per_node[2], per_node[3]);

    /* The text form says how many replicas acknowledged. */
    char cmd[2048], out[8192];
    snprintf(cmd, sizeof cmd,
             "%s prefill --master %s --master-pub %s -w %s --model-id %s --chunk-tokens %d "
             "--scheme lossless --context 'context 0: the quick brown fox jumps over the lazy dog, "
             "again and again, "
             "while the placement spreads contexts over the cloud tier (0)' 2>&1",
             KVEDGE_BIN, w.mep, w.mpub, w.weights, S_MODEL, S_CT);
    assert_int_equal(kt_capture(cmd, out, sizeof out), 0);
    char line[128];
    snprintf(line, sizeof line, "replicas: stored on 2 of 2 (%s, %s) W=2", p[0].placed[0],
             p[0].placed[1]);
    if (!strstr(out, line))
        fail_msg("no '%s' in: %s", line, out);

    /* R above the nodes up: all of them, and it says so. */
    s_prefill_t all;
    s_prefill(&w, 100, "--replicas 5", &all);
    if (all.rc != 0 || !strstr(all.out, "\"placed\":4"))
        fail_msg("--replicas 5: exit %d: %s", all.rc, all.out);
    s_prefill_free(&all);

    /* A context put with the library's placed writer (opt-125m, 12 layers, 2 chunks). */
    char big_placed[2][16];
    s_put_big(&w, big_placed);

    /* The proxy learns the four nodes from the master; each context comes from its replicas
     * only, bit-exact. */
    char pep[200];
    kvedge_proxy_t *px = s_proxy(&w, "edge-proxy", NULL, 0, pep, sizeof pep);
    assert_int_equal(kvedge_proxy_wait_sources(px, S_NODES, KT_WAIT_MS), KVEDGE_OK);
    static s_ref_t ref[S_CONTEXTS];
    for (int k = 0; k < S_CONTEXTS; k++) {
        s_dir_t d = {&w, &p[k]};
        kt_wait_until(s_dir_has, &d, KT_WAIT_MS);
        int holder = -1;
        for (int i = 0; i < S_NODES; i++)
            if (strcmp(s_ids[i], p[k].placed[1]) == 0)
                holder = i;
        s_read_ref(&w, holder, &p[k], &ref[k]);
    }
    assert_int_equal(kvedge_proxy_wait_view(px, kvedge_master_seq(w.master), KT_WAIT_MS),
                     KVEDGE_OK);
    for (int k = 0; k < S_CONTEXTS; k++) {
        s_fetch_t f;
        s_fetch(pep, &p[k], &ref[k], &f);
        if (f.sync.status != 0 || f.mismatches != 0 || f.delivered != S_LAYERS)
            fail_msg("context %d: status %d, %u mismatches, %u of %u layers delivered (not "
                     "delivered: %s)",
                     k, f.sync.status, f.mismatches, f.delivered, S_LAYERS, f.why);
        for (int l = 0; l < S_LAYERS; l++)
            if (!s_named(p[k].placed, 2, f.source[l]))
                fail_msg("context %d layer %d from %s, not a replica (%s, %s)", k, l, f.source[l],
                         p[k].placed[0], p[k].placed[1]);
    }

    /* The cheaper replica: a second proxy whose link to c1 is slow (1 Mbit/s, 200 ms one way)
     * and to the others fast (1 Gbit/s, 1 ms) takes every layer of a context c1 holds from its
     * other replica, and still only from replicas. The layers are a few KiB, so what decides
     * is the round trip: c1's is so long that a loaded machine's inflated round trips to the
     * fast replicas (the planner prices what it measures) stay far below it; the priors say
     * the same from the first plan on. */
    kvedge_proxy_source_t links[S_NODES];
    for (int i = 0; i < S_NODES; i++) {
        char spec[400];
        snprintf(spec, sizeof spec, "cloud %s %s link=%s", s_ids[i], w.ep[i],
                 i == 0 ? "1mbit,200ms bw=125000 rtt=400000" : "1gbit,1ms bw=125000000 rtt=2000");
        assert_int_equal(kvedge_proxy_source_parse(spec, &links[i]), KVEDGE_OK);
    }
    char pep2[200];
    kvedge_proxy_t *px2 = s_proxy(&w, "edge-proxy-2", links, S_NODES, pep2, sizeof pep2);
    assert_int_equal(kvedge_proxy_wait_sources(px2, S_NODES, KT_WAIT_MS), KVEDGE_OK);
    assert_int_equal(kvedge_proxy_wait_view(px2, kvedge_master_seq(w.master), KT_WAIT_MS),
                     KVEDGE_OK);
    uint32_t with_c1 = 0;
    for (int k = 0; k < S_CONTEXTS; k++) {
        s_fetch_t f;
        s_fetch(pep2, &p[k], &ref[k], &f);
        if (f.sync.status != 0 || f.mismatches != 0 || f.delivered != S_LAYERS)
            fail_msg("context %d via the shaped proxy: status %d, %u mismatches, %u of %u "
                     "layers (not delivered: %s)",
                     k, f.sync.status, f.mismatches, f.delivered, S_LAYERS, f.why);
        bool c1 = s_named(p[k].placed, 2, "c1");
        with_c1 += c1;
        for (int l = 0; l < S_LAYERS; l++)
            if (!s_named(p[k].placed, 2, f.source[l]) || (c1 && strcmp(f.source[l], "c1") == 0))
                fail_msg("context %d (on %s, %s) layer %d from %s", k, p[k].placed[0],
                         p[k].placed[1], l, f.source[l]);
    }
    printf("slow link to c1: the %u contexts it holds came whole from their other replica\n",
           with_c1);
    assert_true(with_c1 > 0);
    kvedge_proxy_destroy(&px2);

    /* Mid-request: a replica the request's plan counts on dies with every layer planned on it
     * still to serve; they come from its other replica, bit-exact, none computed. */
    static s_prefill_t bigp;
    bigp.n_chunks = 2;
    bigp.n_placed = 2;
    memcpy(bigp.chunks, s_big.ids, sizeof s_big.ids);
    memcpy(bigp.placed, big_placed, sizeof big_placed);
    s_dir_t bd = {&w, &bigp};
    kt_wait_until(s_dir_has, &bd, KT_WAIT_MS);
    assert_int_equal(kvedge_proxy_wait_view(px, kvedge_master_seq(w.master), KT_WAIT_MS),
                     KVEDGE_OK);
    int rep[2] = {-1, -1};
    for (int i = 0; i < S_NODES; i++)
        for (int r = 0; r < 2; r++)
            if (strcmp(s_ids[i], big_placed[r]) == 0)
                rep[r] = i;
    assert_true(rep[0] >= 0 && rep[1] >= 0);
    s_big_fetch_t bf;
    s_fetch_big_kill(&w, pep, rep[0], rep[1], &bf);
    int victim = bf.victim;
    const char *vname = s_ids[victim];
    if (bf.sync.status != 0 || bf.mismatches != 0 || bf.delivered != KT_CTX_LAYERS ||
        bf.blocks != KT_CTX_LAYERS * 2 * KT_CTX_HEADS)
        fail_msg("%s killed mid-request: status %d, %u mismatches, %u of %u layers, %u blocks "
                 "(not delivered: %s)",
                 vname, bf.sync.status, bf.mismatches, bf.delivered, KT_CTX_LAYERS, bf.blocks,
                 bf.why);
    assert_true(bf.on_victim >= 1); /* the plan used a replica: it had no other source */
    /* Every layer from the other replica; every one planned on the victim re-planned after
     * its failure (none computed, none missed). */
    for (int l = 0; l < KT_CTX_LAYERS; l++) {
        assert_true(s_named(big_placed, 2, bf.source[l]));
        assert_string_not_equal(bf.source[l], vname);
    }
    printf("%s killed with the request's %u layers planned on it: all 12 from the other "
           "replica (%u re-planned after the failure), bit-exact\n",
           vname, bf.on_victim, bf.fell_back);
    assert_int_equal(bf.fell_back, bf.on_victim);

    /* Every acknowledged context is still fetched whole and bit-exact, from its other
     * replica. */
    uint32_t failed_over = 0;
    for (int k = 0; k < S_CONTEXTS; k++) {
        s_fetch_t f;
        s_fetch(pep, &p[k], &ref[k], &f);
        if (f.sync.status != 0 || f.mismatches != 0 || f.delivered != S_LAYERS)
            fail_msg("context %d after %s was killed: status %d, %u mismatches, %u of %u "
                     "layers delivered (not delivered: %s)",
                     k, s_ids[victim], f.sync.status, f.mismatches, f.delivered, S_LAYERS, f.why);
        for (int l = 0; l < S_LAYERS; l++) {
            assert_true(s_named(p[k].placed, 2, f.source[l]));
            assert_string_not_equal(f.source[l], s_ids[victim]);
        }
        failed_over += s_named(p[k].placed, 2, s_ids[victim]);
    }
    printf("%s killed: %u contexts it held fetched bit-exact from their other replica\n",
           s_ids[victim], failed_over);
    assert_true(failed_over > 0);

    /* W: a context placed on the killed node. W = 2 fails naming it; W = 1 succeeds with
     * "1 of 2". */
    int x = -1;
    for (int k = 0; k < S_CONTEXTS && x < 0; k++)
        if (s_named(p[k].placed, 2, s_ids[victim]))
            x = k;
    assert_true(x >= 0);
    const char *other =
        strcmp(p[x].placed[0], s_ids[victim]) == 0 ? p[x].placed[1] : p[x].placed[0];
    s_prefill_t w2;
    s_prefill(&w, x, "--write-quorum 2", &w2);
    assert_int_equal(w2.rc, 1);
    snprintf(line, sizeof line, "stored on 1 of 2 (%s) W=2", other);
    char failed[64];
    snprintf(failed, sizeof failed, "; %s (", s_ids[victim]);
    if (!strstr(w2.out, line) || !strstr(w2.out, failed) || !strstr(w2.out, "failed: "))
        fail_msg("W=2 with %s dead: %s", s_ids[victim], w2.out);
    s_prefill_free(&w2);
    s_prefill_t w1;
    s_prefill(&w, x, "--write-quorum 1", &w1);
    if (w1.rc != 0 || !strstr(w1.out, "\"acked\":1") || !strstr(w1.out, "\"write_quorum\":1"))
        fail_msg("W=1 with %s dead: exit %d: %s", s_ids[victim], w1.rc, w1.out);
    s_prefill_free(&w1);
    snprintf(cmd, sizeof cmd,
             "%s --deadline 1500 prefill --master %s --master-pub %s -w %s --model-id %s "
             "--chunk-tokens %d --scheme lossless --write-quorum 1 --context 'context %d: the "
             "quick brown fox jumps "
             "over the lazy dog, again and again, while the placement spreads contexts over the "
             "cloud tier (%d)' 2>&1",
             KVEDGE_BIN, w.mep, w.mpub, w.weights, S_MODEL, S_CT, x, x * 7919);
    assert_int_equal(kt_capture(cmd, out, sizeof out), 0);
    snprintf(line, sizeof line, "replicas: stored on 1 of 2 (%s) W=1", other);
    if (!strstr(out, line))
        fail_msg("no '%s' in: %s", line, out);

    kvedge_proxy_destroy(&px);
    for (int k = 0; k < S_CONTEXTS; k++) {
        free(ref[k].buf);
        s_prefill_free(&p[k]);
    }
    kt_ctx_free(&s_big);
    s_world_stop(&w);
}

/* What the placement refuses, before anything is computed. */
static void test_placement_refusals(void **state)
{
    (void)state;
    static const char *const no_cap[] = {"0"};
    s_world_t w;
    s_world_start(&w, 1, no_cap, 0);
    s_count_t cnt = {&w, 1};
    kt_wait_until(s_nodes_up, &cnt, KT_WAIT_MS);
    s_prefill_t p;
    s_prefill(&w, 1, "", &p);
    if (p.rc != 5 || !strstr(p.out, "no capacity") || !strstr(p.out, "--capacity"))
        fail_msg("capacity 0: exit %d: %s", p.rc, p.out);
    s_prefill_free(&p);
    s_prefill(&w, 1, "--write-quorum 0", &p);
    assert_int_equal(p.rc, 2);
    s_prefill_free(&p);
    s_prefill(&w, 1, "--replicas 2 --write-quorum 3", &p);
    if (p.rc != 2 || !strstr(p.out, "W <= R"))
        fail_msg("W > R: exit %d: %s", p.rc, p.out);
    s_prefill_free(&p);
    char out[4096];
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s -H %s prefill -w %s --model-id %s --context abc --replicas 2 2>&1", KVEDGE_BIN,
             w.ep[0], w.weights, S_MODEL);
    assert_int_equal(kt_capture(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--replicas and --write-quorum go with --master"));
    s_world_stop(&w);

    /* A master with no cloud node at all. */
    s_world_start(&w, 0, NULL, 0);
    s_prefill(&w, 1, "", &p);
    if (p.rc != 5 || !strstr(p.out, "no cloud node registered"))
        fail_msg("no node: exit %d: %s", p.rc, p.out);
    s_prefill_free(&p);
    s_world_stop(&w);
}

typedef struct {
    s_world_t *w;
    int i;
} s_down_t;

static bool s_is_down(void *arg)
{
    s_down_t *d = arg;
    kvedge_master_health_t h;
    return kvedge_mview_health(d->w->view, s_ids[d->i], &h) == KVEDGE_OK &&
           h.state == KVEDGE_MASTER_HEALTH_DOWN;
}

/* A node the master holds down is not placed: the context goes to the next node in its
 * ranking, and R above the nodes up gives what there is and says so. */
static void test_placement_skips_down_nodes(void **state)
{
    (void)state;
    s_world_t w;
    s_world_start(&w, 3, s_caps, 1500);
    s_count_t cnt = {&w, 3};
    kt_wait_until(s_nodes_up, &cnt, KT_WAIT_MS);
    s_prefill_t p;
    s_prefill(&w, 7, "", &p);
    if (p.rc != 0 || p.n_placed != 2)
        fail_msg("all up: exit %d: %s", p.rc, p.out);
    int dead = 0;
    while (strcmp(s_ids[dead], p.placed[0]) != 0)
        dead++;
    kill(w.pid[dead], SIGKILL);
    waitpid(w.pid[dead], NULL, 0);
    w.pid[dead] = -1;
    s_down_t d = {&w, dead};
    kt_wait_until(s_is_down, &d, KT_WAIT_MS);
    s_prefill_free(&p);
    s_prefill(&w, 7, "", &p);
    if (p.rc != 0 || p.n_placed != 2 || s_named(p.placed, 2, s_ids[dead]))
        fail_msg("%s down: exit %d: %s", s_ids[dead], p.rc, p.out);
    s_prefill_free(&p);
    char cmd[1024], out[4096], line[128];
    snprintf(cmd, sizeof cmd,
             "%s prefill --master %s --master-pub %s -w %s --model-id %s --context abcdef "
             "--replicas 3 2>&1",
             KVEDGE_BIN, w.mep, w.mpub, w.weights, S_MODEL);
    assert_int_equal(kt_capture(cmd, out, sizeof out), 0);
    snprintf(line, sizeof line, "W=2; asked 3, 2 cloud nodes up with a capacity");
    if (!strstr(out, "replicas: stored on 2 of 2 (") || !strstr(out, line))
        fail_msg("--replicas 3 with 2 up: %s", out);
    snprintf(cmd, sizeof cmd,
             "%s prefill --master %s --master-pub %s -w %s --model-id %s --context abcdef "
             "--replicas 3 --write-quorum 3 2>&1",
             KVEDGE_BIN, w.mep, w.mpub, w.weights, S_MODEL);
    assert_int_equal(kt_capture(cmd, out, sizeof out), 5);
    assert_non_null(strstr(out, "--write-quorum 3 cannot be met: 2 cloud nodes up"));
    s_world_stop(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_to_the_placement),
        cmocka_unit_test(test_placement_refusals),
        cmocka_unit_test(test_placement_skips_down_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
