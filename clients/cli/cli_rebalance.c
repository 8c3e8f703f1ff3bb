/* `kvedge rebalance`: moves the cloud tier's chunks to their current placement through the
 * mover's core (store/node/mover.h): copies first (bandwidth-limited), then, once the master's
 * directory shows every copy complete, deletes the copies no longer placed. */
#include <czmq.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/clock.h"
#include "access/codec/error.h"
#include "clients/cli/cli.h"
#include "runtime/mview.h"
#include "store/node/mover.h"

#define S_VIEW_WAIT_MS 5000
#define S_LAND_WAIT_MS 60000
#define S_LAND_POLL_MS 100

typedef struct {
    const char *master, *pub, *server_key, *cert, *forget;
    uint32_t replicas;
    uint64_t bw;
    uint64_t wait_ms;
    bool dry_run, json;
} s_opts_t;

static const kvedge_cmdopt_t s_list[] = {
    {.name = "master",
     .letter = 'm',
     .arg = "EP",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, master),
     .def = KVEDGE_MASTER_BIND_DEFAULT,
     .help = "the master's ROUTER"},
    {.name = "pub",
     .letter = 'p',
     .arg = "EP",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, pub),
     .help = "its PUB (default: for tcp://HOST:PORT, PORT+1)"},
    {.name = "replicas",
     .letter = 'r',
     .arg = "R",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_opts_t, replicas),
     .max = KVEDGE_PLACE_MAX_REPLICAS,
     .def_num = 0,
     .def_text = "2, or 1 with one node",
     .help = "replicas of every chunk"},
    {.name = "bw",
     .arg = "SIZE",
     .type = KVEDGE_CMDOPT_SIZE,
     KVEDGE_CMDOPT_AT(s_opts_t, bw),
     .max = 1ull << 40,
     .def_num = KVEDGE_MOVER_BW_DEFAULT,
     .help = "bytes/s copied at most (0: unlimited)"},
    {.name = "wait",
     .arg = "MS",
     .type = KVEDGE_CMDOPT_MS,
     KVEDGE_CMDOPT_AT(s_opts_t, wait_ms),
     .min = 1,
     .max = 3600000,
     .def_num = S_LAND_WAIT_MS,
     .help = "how long to wait for the directory to show the copies before deleting"},
    {.name = "forget",
     .arg = "ID",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, forget),
     .help = "first remove the records of node ID, which is down for good (node/, health/, its "
             "dir/ entries)"},
    {.name = "dry-run",
     .letter = 'n',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_opts_t, dry_run),
     .help = "print the plan only: copy and delete nothing"},
    {.name = "json",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_opts_t, json),
     .help = "JSON output"},
    {.name = "server-key",
     .arg = "KEY",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, server_key),
     .help = "the master's public key or certificate (default the global --server-key; none: "
             "plaintext, loopback only)"},
    {.name = "cert",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, cert),
     .help = "this client's secret certificate, for the master and the nodes (default the "
             "global --cert)"},
};

static const kvedge_cmdopts_t s_opts = {
    .command = "rebalance",
    .summary = "Move the cloud tier's chunks to their current placement.",
    .about =
        "Reads the master's directory, lists every up cloud node, and computes for every\n"
        "chunk the R nodes its placement names (rendezvous hashing on the chain's root chunk,\n"
        "weighted by registered capacity). Copies each chunk to the placed nodes that lack it\n"
        "(node to node, at most --bw bytes/s), waits until the directory shows every copy\n"
        "complete, and only then deletes the copies on up nodes no longer placed: never\n"
        "fewer than R complete replicas. Prints the moves, the bytes moved and the placement\n"
        "skew (max/mean bytes per up node) before and after. Chunks are those the client's\n"
        "key may list (its tenant). Exit 1 when a copy failed or a delete was held back,\n"
        "5 when the master does not answer.\n",
    KVEDGE_CMDOPTS_OF(s_opts_t, s_list)};

typedef struct {
    uint32_t r, nodes, copies, deletes, backlog, unplaced, skipped;
    uint32_t forgotten;                /* records of --forget's node removed */
    uint32_t unlisted, unlisted_after; /* up nodes whose LIST failed: their copies stay put */
    const char *gone;
    double skew_before, skew_after;
    bool landed, dry_run;
    kvedge_mover_result_t res;
} s_result_t;

static int s_view(const s_opts_t *o, kvedge_cli_t *cli, kvedge_mview_t **out)
{
    char pub_buf[300];
    const char *pub = o->pub;
    const char *key = o->server_key ? o->server_key : cli->server_key;
    const char *cert = o->cert ? o->cert : cli->cert;
    if (!pub && kvedge_cli_default_pub(o->master, pub_buf, sizeof pub_buf) != 0) {
        kvedge_cli_error("rebalance: give --pub for %s", o->master);
        return KVEDGE_EXIT_USAGE;
    }
    if (key && !cert) {
        kvedge_cli_error("rebalance: --server-key needs --cert (this client's secret "
                         "certificate)");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = o->master;
    vo.pub = pub ? pub : pub_buf;
    vo.server_key = key;
    vo.client_cert = key ? cert : NULL;
    vo.start_wait_ms = S_VIEW_WAIT_MS;
    int rc = kvedge_mview_start(&vo, out);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("rebalance: %s", kvedge_strerror(rc));
        return rc == KVEDGE_EINVAL || rc == KVEDGE_EDENIED ? KVEDGE_EXIT_USAGE
                                                           : KVEDGE_EXIT_FAILURE;
    }
    if (kvedge_mview_state(*out) != KVEDGE_MVIEW_SYNCED) {
        kvedge_cli_error("rebalance: no snapshot from %s within %d ms (master down, wrong "
                         "endpoint, or key not allowed)",
                         o->master, S_VIEW_WAIT_MS);
        kvedge_mview_destroy(out);
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    return KVEDGE_EXIT_OK;
}

typedef struct {
    zlistx_t *keys;
} s_keys_t;

static int s_key(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    (void)seq;
    (void)body;
    (void)len;
    zlistx_add_end(((s_keys_t *)ctx)->keys, (void *)key);
    return 0;
}

/* --forget ID: removes the records of a node that is down (its dir/ entries first, so none is
 * ever left naming a node without a record). Returns an exit code. */
static int s_forget(kvedge_mview_t *v, const char *id, bool dry_run, uint32_t *removed)
{
    if (!kvedge_master_id_ok(id)) {
        kvedge_cli_error("rebalance: --forget %s: not a node id", id);
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_master_health_t h;
    if (kvedge_mview_health(v, id, &h) == KVEDGE_OK && h.state != KVEDGE_MASTER_HEALTH_DOWN) {
        kvedge_cli_error("rebalance: --forget %s: the node is %s; only a node that is down is "
                         "forgotten (stop it first)",
                         id, kvedge_master_health_name(h.state));
        return KVEDGE_EXIT_FAILURE;
    }
    s_keys_t k = {zlistx_new()};
    zlistx_set_duplicator(k.keys, (czmq_duplicator *)strdup);
    zlistx_set_destructor(k.keys, (czmq_destructor *)zstr_free);
    char prefix[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    snprintf(prefix, sizeof prefix, "dir/%s/", id);
    kvedge_mview_foreach(v, prefix, s_key, &k);
    char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    snprintf(key, sizeof key, "node/%s", id);
    zlistx_add_end(k.keys, key);
    snprintf(key, sizeof key, "health/%s", id);
    zlistx_add_end(k.keys, key);
    int rc = KVEDGE_OK;
    for (const char *kk = zlistx_first(k.keys); kk && rc == KVEDGE_OK; kk = zlistx_next(k.keys)) {
        if (kvedge_mview_get(v, kk, NULL, 0, NULL) == KVEDGE_ENOTFOUND)
            continue;
        rc = dry_run ? KVEDGE_OK : kvedge_mview_set(v, kk, NULL, 0, 0);
        *removed += rc == KVEDGE_OK;
    }
    zlistx_destroy(&k.keys);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("rebalance: --forget %s: the master refused a delete: %s", id,
                         kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

/* The tier now, every up node listed. */
static int s_survey(kvedge_mview_t *v, kvedge_mover_conns_t *c, kvedge_tier_t **out,
                    uint32_t *unlisted)
{
    int rc = kvedge_tier_read(v, kvedge_wall_ms(), 0, out);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("rebalance: reading the directory: %s", kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    size_t n;
    const kvedge_tier_node_t *nodes = kvedge_tier_nodes(*out, &n);
    for (size_t i = 0; i < n; i++) {
        if (!nodes[i].up)
            continue;
        rc = kvedge_mover_list(c, *out, i);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("rebalance: listing %s (%s): %s; its copies are not moved",
                             nodes[i].id, nodes[i].endpoint, kvedge_strerror(rc));
            (*unlisted)++;
        }
    }
    return KVEDGE_EXIT_OK;
}

/* The skew the moves would leave (a dry run says it without moving anything). */
static double s_projected(kvedge_tier_t *t, const kvedge_move_t *m, size_t n)
{
    size_t nn;
    kvedge_tier_node_t *nodes = (kvedge_tier_node_t *)kvedge_tier_nodes(t, &nn);
    for (size_t i = 0; i < n; i++) {
        kvedge_tier_node_t *to = &nodes[m[i].to];
        if (m[i].kind == KVEDGE_MOVE_COPY)
            to->bytes += m[i].bytes;
        else
            to->bytes -= to->bytes < m[i].bytes ? to->bytes : m[i].bytes;
    }
    return kvedge_tier_skew(t);
}

static void s_wait_landed(kvedge_mview_t *v, const kvedge_tier_t *t, const kvedge_move_t *m,
                          size_t n, uint64_t wait_ms, s_result_t *r)
{
    int64_t end = kvedge_mono_ms() + (int64_t)wait_ms;
    while (!(r->landed = kvedge_mover_landed(v, t, m, n)) && kvedge_mono_ms() < end)
        zclock_sleep(S_LAND_POLL_MS); /* the poll interval of a wait with a deadline */
}

static void s_print_moves(const kvedge_tier_t *t, const kvedge_move_t *m, size_t n, bool json)
{
    const kvedge_tier_node_t *nodes = kvedge_tier_nodes(t, NULL);
    for (size_t i = 0; i < n; i++) {
        char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
        kvedge_chunk_id_hex(&m[i].chunk.id, hex);
        bool copy = m[i].kind == KVEDGE_MOVE_COPY;
        if (json) {
            printf("%s\n    {\"kind\": \"%s\", \"chunk\": \"%s\", \"from\": ", i ? "," : "",
                   copy ? "copy" : "delete", hex);
            kvedge_cli_json_str(stdout, copy ? nodes[m[i].from].id : "");
            printf(", \"to\": ");
            kvedge_cli_json_str(stdout, nodes[m[i].to].id);
            printf(", \"bytes\": %llu}", (unsigned long long)m[i].bytes);
        } else if (copy) {
            printf("copy   %.16s  %s -> %s  %llu bytes\n", hex, nodes[m[i].from].id,
                   nodes[m[i].to].id, (unsigned long long)m[i].bytes);
        } else {
            printf("delete %.16s  on %s (not placed there)\n", hex, nodes[m[i].to].id);
        }
    }
}

static void s_print(const s_result_t *r, const kvedge_tier_t *t, const kvedge_move_t *m, size_t n,
                    bool json)
{
    double secs = (double)r->res.elapsed_us / 1e6;
    double rate = secs > 0 ? (double)r->res.bytes / secs : 0;
    if (!json) {
        if (r->forgotten)
            printf("%s %u records of the node given to --forget\n",
                   r->dry_run ? "would remove" : "removed", r->forgotten);
        s_print_moves(t, m, n, false);
        printf("%s%u copies, %u deletes over %u cloud nodes (R=%u)\n",
               r->dry_run ? "plan: " : "moves: ", r->copies, r->deletes, r->nodes, r->r);
        if (!r->dry_run)
            printf("copies done %llu, failed %llu; bytes moved %llu in %.3f s (%.1f MB/s); "
                   "deletes done %llu, kept %llu%s\n",
                   (unsigned long long)r->res.copies_done, (unsigned long long)r->res.copies_failed,
                   (unsigned long long)r->res.bytes, secs, rate / 1e6,
                   (unsigned long long)r->res.deletes_done, (unsigned long long)r->res.deletes_kept,
                   r->landed ? "" : " (the directory did not show every copy in time)");
        printf("skew (max/mean bytes per up node): before %.3f, after %.3f%s\n", r->skew_before,
               r->skew_after, r->dry_run ? " (projected)" : "");
        if (r->unlisted)
            printf("%u up nodes could not be listed: their copies were neither moved nor "
                   "deleted\n",
                   r->unlisted);
        if (r->unplaced || r->skipped)
            printf("skipped: %u chunks with no known root, %u directory entries of a node "
                   "gone (%s)\n",
                   r->unplaced, r->skipped, r->gone);
        return;
    }
    printf("{\"dry_run\": %s, \"replicas\": %u, \"nodes\": %u, \"copies\": %u, \"deletes\": %u, "
           "\"copies_done\": %llu, \"copies_failed\": %llu, \"bytes_moved\": %llu, "
           "\"seconds\": %.6f, \"bytes_per_s\": %.0f, \"deletes_done\": %llu, "
           "\"deletes_kept\": %llu, \"landed\": %s, \"skew_before\": %.6f, \"skew_after\": %.6f, "
           "\"backlog\": %u, \"unplaced\": %u, \"skipped\": %u, \"forgotten\": %u, "
           "\"unlisted\": %u, \"moves\": [",
           r->dry_run ? "true" : "false", r->r, r->nodes, r->copies, r->deletes,
           (unsigned long long)r->res.copies_done, (unsigned long long)r->res.copies_failed,
           (unsigned long long)r->res.bytes, secs, rate, (unsigned long long)r->res.deletes_done,
           (unsigned long long)r->res.deletes_kept, r->landed ? "true" : "false", r->skew_before,
           r->skew_after, r->backlog, r->unplaced, r->skipped, r->forgotten, r->unlisted);
    s_print_moves(t, m, n, true);
    printf("%s]}\n", n ? "\n  " : "");
}

/* Plans on t and, unless a dry run, moves; fills r. */
static void s_move(const s_opts_t *o, kvedge_mview_t *v, kvedge_mover_conns_t *c, kvedge_tier_t *t,
                   const kvedge_move_t *m, size_t n, s_result_t *r)
{
    r->skew_before = kvedge_tier_skew(t);
    r->unplaced = 0;
    r->skipped = kvedge_tier_skipped(t, &r->unplaced, &r->gone);
    r->backlog = kvedge_tier_backlog(t, o->replicas, NULL);
    size_t nn;
    kvedge_tier_nodes(t, &nn);
    r->nodes = (uint32_t)nn;
    for (size_t i = 0; i < n; i++)
        m[i].kind == KVEDGE_MOVE_COPY ? r->copies++ : r->deletes++;
    r->landed = true;
    if (o->dry_run)
        return;
    kvedge_mover_copy_all(c, t, m, n, &r->res);
    s_wait_landed(v, t, m, n, o->wait_ms, r);
    kvedge_mover_delete_all(c, v, t, o->replicas, m, n, &r->res);
}

static int s_rebalance(kvedge_cli_t *cli, const void *opts)
{
    const s_opts_t *o = opts;
    kvedge_mview_t *v = NULL;
    int ex = s_view(o, cli, &v);
    if (ex != KVEDGE_EXIT_OK)
        return ex;
    kvedge_mover_io_t io = {.cert = o->cert ? o->cert : cli->cert,
                            .bw = o->bw,
                            .deadline_ms = cli->deadline_ms > 0 ? cli->deadline_ms : 0};
    kvedge_mover_conns_t *c = kvedge_mover_conns_new(&io);
    kvedge_tier_t *t = NULL, *after = NULL;
    kvedge_move_t *m = NULL;
    size_t n = 0;
    s_result_t r = {.dry_run = o->dry_run};
    ex = c ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
    if (ex == KVEDGE_EXIT_OK && o->forget)
        ex = s_forget(v, o->forget, o->dry_run, &r.forgotten);
    if (ex == KVEDGE_EXIT_OK)
        ex = s_survey(v, c, &t, &r.unlisted);
    if (ex == KVEDGE_EXIT_OK &&
        kvedge_tier_plan(t, KVEDGE_MOVER_REBALANCE, o->replicas, -1, &m, &n) != KVEDGE_OK) {
        kvedge_cli_error("rebalance: out of memory planning");
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (ex == KVEDGE_EXIT_OK) {
        size_t nn;
        const kvedge_tier_node_t *nodes = kvedge_tier_nodes(t, &nn);
        size_t up = 0;
        for (size_t i = 0; i < nn; i++)
            up += nodes[i].up && nodes[i].capacity > 0;
        r.r = kvedge_place_replicas(o->replicas, up);
        s_move(o, v, c, t, m, n, &r);
        if (o->dry_run)
            r.skew_after = s_projected(t, m, n);
        else if (s_survey(v, c, &after, &r.unlisted_after) == KVEDGE_EXIT_OK)
            r.skew_after = kvedge_tier_skew(after);
        s_print(&r, t, m, n, o->json || cli->json);
        if (r.res.copies_failed || r.res.deletes_kept || !r.landed || r.unlisted)
            ex = KVEDGE_EXIT_FAILURE;
    }
    free(m);
    kvedge_tier_destroy(&after);
    kvedge_tier_destroy(&t);
    kvedge_mover_conns_destroy(&c);
    kvedge_mview_destroy(&v);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_rebalance_cmds[] = {
    {.name = "rebalance", .opts = &s_opts, .exec = s_rebalance},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
