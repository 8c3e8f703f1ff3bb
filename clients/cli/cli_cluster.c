/* `kvedge -H MASTER[,MASTER...] cluster`: what an operator sees of a cluster. Asks STATUS of
 * every master given and of every master their STATUS documents list, takes a snapshot of the
 * leader's registry through a replica view, and prints the leader, the standbys, etcd's
 * members, the nodes (capacity, health, what the directory says they hold) and the chunks held
 * whole by fewer than R up cloud nodes. */
#include <cjson/cJSON.h>
#include <czmq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/kvmsg.h"
#include "runtime/mview.h"
#include "access/codec/error.h"
#include "access/codec/model.h"
#include "clients/cli/cli.h"

#define S_MAX_MASTERS    16
#define S_DEADLINE_MS    3000
#define S_MAX_NODES      4096
#define S_LIST_UNDER_MAX 20 /* under-replicated chunks listed in text (JSON: all, up to 4096) */

typedef struct {
    uint32_t replicas;
    uint32_t deadline_ms;
    bool json;
} s_opts_t;

static const kvedge_cmdopt_t s_list[] = {
    {.name = "replicas",
     .letter = 'r',
     .arg = "R",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_opts_t, replicas),
     .min = 1,
     .max = 16,
     .def_num = 2,
     .help = "a chunk held whole by fewer than R up cloud nodes is under-replicated"},
    {.name = "deadline",
     .arg = "MS",
     .type = KVEDGE_CMDOPT_MS,
     KVEDGE_CMDOPT_AT(s_opts_t, deadline_ms),
     .min = 1,
     .max = 600000,
     .def_num = S_DEADLINE_MS,
     .help = "how long each master and the snapshot may take"},
    {.name = "json",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_opts_t, json),
     .help = "JSON output"},
};

static const kvedge_cmdopts_t s_opts = {
    .command = "cluster",
    .summary = "Show the masters, etcd, the nodes and under-replicated chunks (-H MASTER[,...]).",
    .about = "Asks STATUS of every master in -H MASTER[,MASTER...] (ROUTER endpoints) and of\n"
             "every master their answers list, then takes a snapshot of the leader's registry.\n"
             "Prints the leader, the standbys, etcd's members (masters on etcd), every node\n"
             "(role, region, endpoint, capacity, health, the chunks and layer blocks the\n"
             "directory says it holds) and the chunks whose full set of layers fewer than\n"
             "--replicas up cloud nodes hold. Exit 5 when no master answers or no leader is\n"
             "known.\n",
    KVEDGE_CMDOPTS_OF(s_opts_t, s_list)};

/* ---------------------------------------------------------------- STATUS */

typedef struct {
    char router[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];
    cJSON *status; /* NULL: no answer */
} s_master_t;

typedef struct {
    kvedge_cli_t *cli;
    const s_opts_t *o;
    s_master_t m[S_MAX_MASTERS];
    size_t n;
} s_cluster_t;

/* CURVE for a DEALER from the global --server-key (Z85 or a certificate) and --cert. */
static int s_curve(kvedge_cli_t *cli, zsock_t *d)
{
    if (!cli->server_key)
        return 0;
    zcert_t *mine = cli->cert ? zcert_load(cli->cert) : NULL;
    zcert_t *theirs = strlen(cli->server_key) == 40 ? NULL : zcert_load(cli->server_key);
    const char *key = theirs ? zcert_public_txt(theirs) : cli->server_key;
    int rc = mine && strlen(key) == 40 ? 0 : -1;
    if (rc == 0) {
        zcert_apply(mine, d);
        zsock_set_curve_serverkey(d, key);
    }
    zcert_destroy(&mine);
    zcert_destroy(&theirs);
    return rc;
}

/* STATUS of the master at ep; NULL when it does not answer within the deadline. */
static cJSON *s_status(kvedge_cli_t *cli, const char *ep, uint32_t deadline_ms)
{
    zsock_t *d = zsock_new(ZMQ_DEALER);
    if (!d)
        return NULL;
    zsock_set_linger(d, 0);
    zsock_set_rcvtimeo(d, (int)deadline_ms);
    zsock_set_maxmsgsize(d, (int64_t)KVEDGE_KVMSG_MAX_FRAME_BYTES);
    cJSON *doc = NULL;
    kvedge_kvmsg_t k = {.cmd = KVEDGE_KVMSG_STATUS, .rid = 1};
    kvedge_kvmsg_buf_t buf;
    kvedge_wire_frame_t f[KVEDGE_KVMSG_MAX_FRAMES];
    size_t n = 0;
    if (s_curve(cli, d) == 0 && zsock_connect(d, "%s", ep) == 0 &&
        kvedge_kvmsg_pack(&k, &buf, f, &n) == 0) {
        zmsg_t *msg = zmsg_new();
        for (size_t i = 0; i < n; i++)
            zmsg_addmem(msg, f[i].data, f[i].len);
        if (zmsg_send(&msg, d) != 0)
            zmsg_destroy(&msg);
        zmsg_t *r = zmsg_recv(d);
        kvedge_wire_frame_t rf[KVEDGE_KVMSG_MAX_FRAMES];
        size_t rn = 0;
        for (zframe_t *fr = r ? zmsg_first(r) : NULL; fr && rn < KVEDGE_KVMSG_MAX_FRAMES;
             fr = zmsg_next(r))
            rf[rn++] = (kvedge_wire_frame_t){zframe_data(fr), zframe_size(fr)};
        kvedge_kvmsg_t a;
        if (r && kvedge_kvmsg_parse(rf, rn, &a) == 0 && a.cmd == KVEDGE_KVMSG_OK && a.rid == 1)
            doc = cJSON_ParseWithLength((const char *)a.body, a.body_len);
        zmsg_destroy(&r);
    }
    zsock_destroy(&d);
    return cJSON_IsObject(doc) ? doc : (cJSON_Delete(doc), NULL);
}

static const char *s_str(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static void s_add(s_cluster_t *c, const char *router)
{
    if (!router[0] || strlen(router) > KVEDGE_MASTER_MAX_ENDPOINT_BYTES || c->n == S_MAX_MASTERS)
        return;
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->m[i].router, router) == 0)
            return;
    snprintf(c->m[c->n++].router, sizeof c->m[0].router, "%s", router);
}

/* STATUS of every master given and of every master the answers list (in turn: the list grows
 * while it is read). */
static void s_ask_all(s_cluster_t *c)
{
    const char *p = c->cli->host;
    while (*p) {
        size_t n = strcspn(p, ",");
        char ep[KVEDGE_MASTER_MAX_ENDPOINT_BYTES + 1];
        snprintf(ep, sizeof ep, "%.*s", (int)(n < sizeof ep - 1 ? n : sizeof ep - 1), p);
        s_add(c, ep);
        p += n + (p[n] == ',');
    }
    for (size_t i = 0; i < c->n; i++) {
        c->m[i].status = s_status(c->cli, c->m[i].router, c->o->deadline_ms);
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(c->m[i].status, "masters"), *x;
        cJSON_ArrayForEach(x, ms) s_add(c, s_str(x, "router"));
    }
}

/* The master that leads, from the answers: one that says it leads, else the leader one names. */
static const cJSON *s_leader(const s_cluster_t *c)
{
    for (size_t i = 0; i < c->n; i++) {
        const char *role = s_str(c->m[i].status, "role");
        if (strcmp(role, "leader") == 0 || strcmp(role, "single") == 0)
            return c->m[i].status;
    }
    return NULL;
}

/* ---------------------------------------------------------------- the registry */

typedef struct {
    char id[KVEDGE_MASTER_MAX_ID_BYTES + 1];
    kvedge_master_node_t rec;
    int health; /* 0: no health record */
    uint64_t chunks, blocks, bytes;
} s_node_t;

typedef struct {
    kvedge_mview_t *v;
    s_node_t *nodes;
    size_t n_nodes;
    zhashx_t *full; /* chunk hex -> 1 + the up cloud nodes that hold it whole (as a pointer) */
} s_reg_t;

static s_node_t *s_node(s_reg_t *r, const char *id)
{
    for (size_t i = 0; i < r->n_nodes; i++)
        if (strcmp(r->nodes[i].id, id) == 0)
            return &r->nodes[i];
    return NULL;
}

static int s_node_cb(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    s_reg_t *r = ctx;
    kvedge_master_key_t k;
    if (kvedge_master_key_parse(key, strlen(key), &k) != 0 || r->n_nodes == S_MAX_NODES)
        return 0;
    s_node_t *n = &r->nodes[r->n_nodes];
    memset(n, 0, sizeof *n);
    if (kvedge_master_node_parse(body, len, &n->rec) == 0) {
        snprintf(n->id, sizeof n->id, "%.64s", k.a);
        kvedge_master_health_t h;
        char hk[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        uint8_t hb[KVEDGE_MASTER_RECORD_MAX_BYTES];
        size_t hl = 0;
        snprintf(hk, sizeof hk, "health/%s", k.a);
        if (kvedge_mview_get(r->v, hk, hb, sizeof hb, &hl) == 0 &&
            kvedge_master_health_parse(hb, hl, &h) == 0)
            n->health = (int)h.state;
        r->n_nodes++;
    }
    return 0;
}

static int s_dir_cb(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    s_reg_t *r = ctx;
    kvedge_master_key_t k;
    kvedge_master_dir_t d;
    s_node_t *n;
    if (kvedge_master_key_parse(key, strlen(key), &k) != 0 ||
        kvedge_master_dir_parse(body, len, &d) != 0 || !(n = s_node(r, k.a)))
        return 0;
    unsigned held = 0;
    for (unsigned l = 0; l < d.layers; l++)
        held += kvedge_master_dir_has(&d, l);
    n->chunks++;
    n->blocks += held;
    char mk[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    uint8_t mb[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t ml = 0;
    kvedge_model_t m;
    snprintf(mk, sizeof mk, "model/%s", d.model_id);
    if (kvedge_mview_get(r->v, mk, mb, sizeof mb, &ml) == 0 &&
        kvedge_master_model_parse(mb, ml, &m) == 0 && m.layers)
        n->bytes += kvedge_model_fp16_bytes(&m, KVEDGE_CHUNK_TOKENS_DEFAULT) / m.layers * held;
    bool whole = d.layers > 0 && held == d.layers;
    bool counts = whole && n->rec.role == KVEDGE_ROLE_CLOUD && n->health == KVEDGE_MASTER_HEALTH_UP;
    /* Stored as count + 1, so that a chunk no up cloud node holds whole is still listed. */
    uintptr_t have = (uintptr_t)zhashx_lookup(r->full, k.b);
    zhashx_update(r->full, k.b, (void *)((have ? have : 1) + (counts ? 1 : 0)));
    return 0;
}

/* ---------------------------------------------------------------- printing */

static const char *s_health(int st)
{
    return st ? kvedge_master_health_name(st) : "unknown";
}

static void s_print_text(const s_cluster_t *c, const cJSON *leader, const s_reg_t *r)
{
    printf("leader   %s %s %s (term %.0f, seq %.0f, registry %s)\n", s_str(leader, "id"),
           s_str(leader, "router"), s_str(leader, "pub"),
           cJSON_GetNumberValue(cJSON_GetObjectItem(leader, "term")),
           cJSON_GetNumberValue(cJSON_GetObjectItem(leader, "seq")), s_str(leader, "registry"));
    for (size_t i = 0; i < c->n; i++)
        if (c->m[i].status != leader)
            printf("%-8s %s %s\n", c->m[i].status ? s_str(c->m[i].status, "role") : "silent",
                   c->m[i].status ? s_str(c->m[i].status, "id") : "-", c->m[i].router);
    const cJSON *etcd = cJSON_GetObjectItem(leader, "etcd"), *x;
    if (cJSON_IsObject(etcd)) {
        printf("etcd     %s, prefix %s, cluster %s\n",
               cJSON_IsTrue(cJSON_GetObjectItem(etcd, "healthy")) ? "healthy" : "UNHEALTHY",
               s_str(etcd, "prefix"), s_str(etcd, "cluster"));
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(etcd, "members"))
        {
            const cJSON *u = cJSON_GetArrayItem(cJSON_GetObjectItem(x, "client_urls"), 0);
            printf("  member %s %s\n", s_str(x, "name"), cJSON_IsString(u) ? u->valuestring : "");
        }
    }
    printf("nodes    %zu\n", r->n_nodes);
    printf("  %-16s %-5s %-8s %-28s %10s %-7s %8s %8s %10s\n", "ID", "ROLE", "REGION", "ENDPOINT",
           "CAPACITY", "STATE", "CHUNKS", "BLOCKS", "BYTES");
    for (size_t i = 0; i < r->n_nodes; i++) {
        const s_node_t *n = &r->nodes[i];
        char cap[32], bytes[32];
        printf("  %-16s %-5s %-8s %-28s %10s %-7s %8llu %8llu %10s\n", n->id,
               n->rec.role == KVEDGE_ROLE_CLOUD ? "cloud" : "edge",
               n->rec.region[0] ? n->rec.region : "-", n->rec.endpoint,
               kvedge_cli_bytes(n->rec.capacity_bytes, cap, sizeof cap), s_health(n->health),
               (unsigned long long)n->chunks, (unsigned long long)n->blocks,
               kvedge_cli_bytes(n->bytes, bytes, sizeof bytes));
    }
}

/* Under-replicated chunks: text (the first few) or a JSON array. Returns how many. */
static size_t s_print_under(const s_reg_t *r, uint32_t replicas, bool json)
{
    size_t n = 0;
    for (void *v = zhashx_first(r->full); v; v = zhashx_next(r->full)) {
        uint32_t have = (uint32_t)((uintptr_t)v - 1);
        if (have >= replicas)
            continue;
        const char *chunk = zhashx_cursor(r->full);
        if (json && n < S_MAX_NODES)
            printf("%s{\"chunk\": \"%s\", \"replicas\": %u}", n ? ", " : "", chunk, have);
        else if (!json && n < S_LIST_UNDER_MAX)
            printf("  %s held whole by %u up cloud node%s\n", chunk, have, have == 1 ? "" : "s");
        n++;
    }
    return n;
}

static void s_print_json(const s_cluster_t *c, const cJSON *leader, const s_reg_t *r,
                         uint32_t replicas)
{
    cJSON *ms = cJSON_CreateArray();
    for (size_t i = 0; i < c->n; i++) {
        cJSON *o = c->m[i].status ? cJSON_Duplicate(c->m[i].status, 1) : cJSON_CreateObject();
        if (!c->m[i].status) {
            cJSON_AddStringToObject(o, "router", c->m[i].router);
            cJSON_AddStringToObject(o, "role", "silent");
        }
        cJSON_AddItemToArray(ms, o);
    }
    char *mtext = cJSON_PrintUnformatted(ms);
    cJSON_Delete(ms);
    printf("{\"leader\": \"%s\", \"masters\": %s, \"etcd\": ", s_str(leader, "id"),
           mtext ? mtext : "[]");
    free(mtext);
    char *etext = cJSON_PrintUnformatted(cJSON_GetObjectItem(leader, "etcd"));
    printf("%s, \"nodes\": [", etext ? etext : "null");
    free(etext);
    for (size_t i = 0; i < r->n_nodes; i++) {
        const s_node_t *n = &r->nodes[i];
        printf("%s{\"id\": ", i ? ", " : "");
        kvedge_cli_json_str(stdout, n->id);
        printf(", \"role\": \"%s\", \"region\": ",
               n->rec.role == KVEDGE_ROLE_CLOUD ? "cloud" : "edge");
        kvedge_cli_json_str(stdout, n->rec.region);
        printf(", \"endpoint\": ");
        kvedge_cli_json_str(stdout, n->rec.endpoint);
        printf(", \"capacity_bytes\": %llu, \"state\": \"%s\", \"chunks\": %llu, \"blocks\": "
               "%llu, \"bytes_fp16\": %llu}",
               (unsigned long long)n->rec.capacity_bytes, s_health(n->health),
               (unsigned long long)n->chunks, (unsigned long long)n->blocks,
               (unsigned long long)n->bytes);
    }
    printf("], \"replicas\": %u, \"under_replicated\": [", replicas);
    size_t under = s_print_under(r, replicas, true);
    printf("], \"under_replicated_count\": %zu}\n", under);
}

/* ---------------------------------------------------------------- the command */

/* A snapshot of the leader's registry: its nodes, health and directory. */
static int s_registry(s_cluster_t *c, const cJSON *leader, s_reg_t *r)
{
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = s_str(leader, "router");
    vo.pub = s_str(leader, "pub");
    vo.server_key = c->cli->server_key;
    vo.client_cert = c->cli->server_key ? c->cli->cert : NULL;
    vo.start_wait_ms = (int)c->o->deadline_ms;
    if (kvedge_mview_start(&vo, &r->v) != 0 || kvedge_mview_state(r->v) != KVEDGE_MVIEW_SYNCED) {
        kvedge_cli_error("cluster: no snapshot from the leader %s within %u ms", vo.master,
                         c->o->deadline_ms);
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    r->nodes = calloc(S_MAX_NODES, sizeof *r->nodes);
    r->full = zhashx_new();
    if (!r->nodes || !r->full)
        return KVEDGE_EXIT_FAILURE;
    kvedge_mview_foreach(r->v, "node/", s_node_cb, r);
    kvedge_mview_foreach(r->v, "dir/", s_dir_cb, r);
    return KVEDGE_EXIT_OK;
}

static int s_cluster(kvedge_cli_t *cli, const void *opts)
{
    static s_cluster_t c;
    memset(&c, 0, sizeof c);
    c.cli = cli;
    c.o = opts;
    if (!cli->host || !*cli->host) {
        kvedge_cli_error("cluster: give the masters with -H MASTER[,MASTER...]");
        return KVEDGE_EXIT_USAGE;
    }
    if (cli->server_key && !cli->cert) {
        kvedge_cli_error("cluster: --server-key needs --cert (this client's secret certificate)");
        return KVEDGE_EXIT_USAGE;
    }
    s_ask_all(&c);
    const cJSON *leader = s_leader(&c);
    int ex = KVEDGE_EXIT_OK;
    s_reg_t r = {0};
    if (!leader) {
        bool any = false;
        for (size_t i = 0; i < c.n; i++)
            any = any || c.m[i].status;
        kvedge_cli_error(any ? "cluster: no master leads (%s): an election is under way, or "
                               "etcd has no quorum"
                             : "cluster: no master answers STATUS at %s",
                         cli->host);
        ex = KVEDGE_EXIT_UNAVAILABLE;
    } else {
        ex = s_registry(&c, leader, &r);
    }
    if (ex == KVEDGE_EXIT_OK && (c.o->json || cli->json)) {
        s_print_json(&c, leader, &r, c.o->replicas);
    } else if (ex == KVEDGE_EXIT_OK) {
        s_print_text(&c, leader, &r);
        printf("under-replicated (fewer than %u up cloud nodes hold every layer):\n",
               c.o->replicas);
        size_t under = s_print_under(&r, c.o->replicas, false);
        printf("  %zu chunk%s\n", under, under == 1 ? "" : "s");
    }
    kvedge_mview_destroy(&r.v);
    zhashx_destroy(&r.full);
    free(r.nodes);
    for (size_t i = 0; i < c.n; i++)
        cJSON_Delete(c.m[i].status);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_cluster_cmds[] = {
    {.name = "cluster", .opts = &s_opts, .exec = s_cluster},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
