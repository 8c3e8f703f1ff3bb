/* `kvedge proxy` (the edge proxy daemon, proxy/proxy.c) and `kvedge fetch` (a planned fetch
 * through a proxy, printing where each layer came from and why). */
#include <czmq.h>
#include <ctype.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "access/frame.h"
#include "access/log.h"
#include "access/transport.h"
#include "clients/cli/cli.h"
#include "clients/kvedge.h"
#include "proxy/proxy.h"
#include "store/error.h"

#define S_PROXY_CERT_DEFAULT "proxy.cert" /* secret in proxy.cert_secret */

/* Settings of a proxy: defaults, then the config file, then flags. */
typedef struct {
    char bind[256];
    char id[65];
    char cert[1100];
    char clients[1100];
    char master[256];
    char master_pub[256];
    char master_key[1100];
    char snapshot[1100];
    char local_node[65];
    char history_node[65];
    char log[16];
    bool insecure;
    kvedge_proxy_source_t sources[KVEDGE_PROXY_MAX_SOURCES];
    size_t nsources;
} s_conf_t;

static int s_add_source(s_conf_t *c, const char *spec, const char *where)
{
    if (c->nsources == KVEDGE_PROXY_MAX_SOURCES) {
        kvedge_cli_error("proxy: %s: at most %d sources", where, KVEDGE_PROXY_MAX_SOURCES);
        return KVEDGE_EXIT_USAGE;
    }
    if (kvedge_proxy_source_parse(spec, &c->sources[c->nsources]) != KVEDGE_OK) {
        kvedge_cli_error("proxy: %s: bad source '%s' (want \"KIND NAME ENDPOINT [key=K] "
                         "[link=RATE,LATENCY] [bw=BYTES_PER_S] [rtt=US]\", KIND local, peer, "
                         "cloud or history)",
                         where, spec);
        return KVEDGE_EXIT_USAGE;
    }
    c->nsources++;
    return KVEDGE_EXIT_OK;
}

/* One setting by name (the config file's keys are the long flags with '_' for '-'). */
static bool s_set(s_conf_t *c, const char *k, const char *v)
{
    const kvedge_cli_str_t str[] = {{"bind", c->bind, sizeof c->bind},
                                    {"id", c->id, sizeof c->id},
                                    {"cert", c->cert, sizeof c->cert},
                                    {"clients", c->clients, sizeof c->clients},
                                    {"master", c->master, sizeof c->master},
                                    {"master_pub", c->master_pub, sizeof c->master_pub},
                                    {"master_key", c->master_key, sizeof c->master_key},
                                    {"snapshot", c->snapshot, sizeof c->snapshot},
                                    {"local_node", c->local_node, sizeof c->local_node},
                                    {"history_node", c->history_node, sizeof c->history_node},
                                    {"log", c->log, sizeof c->log}};
    if (kvedge_cli_set_str(str, sizeof str / sizeof str[0], k, v))
        return true;
    if (strcmp(k, "insecure") == 0) {
        c->insecure = strcmp(v, "1") == 0 || strcmp(v, "true") == 0;
        return true;
    }
    return false;
}

static int s_conf_file(const char *path, s_conf_t *c)
{
    zconfig_t *root = zconfig_load(path);
    if (!root) {
        kvedge_cli_error("proxy: cannot read config file %s (ZPL format, see "
                         "docs/operations.md)",
                         path);
        return KVEDGE_EXIT_USAGE;
    }
    zconfig_t *sec = zconfig_locate(root, "proxy");
    int ex = KVEDGE_EXIT_OK;
    for (zconfig_t *item = sec ? zconfig_child(sec) : NULL; item && !ex;
         item = zconfig_next(item)) {
        const char *k = zconfig_name(item), *v = zconfig_value(item);
        if (v && strcmp(k, "source") == 0) {
            ex = s_add_source(c, v, path);
        } else if (!v || !s_set(c, k, v)) {
            kvedge_cli_error("proxy: %s: unknown setting or bad value for proxy/%s", path, k);
            ex = KVEDGE_EXIT_USAGE;
        }
    }
    zconfig_destroy(&root);
    return ex;
}

static const char s_proxy_help[] =
    "Runs the edge proxy: clients send it FETCH (docs/protocol.md); it prices every source of\n"
    "every layer (Eq. 19), picks the split that minimizes the pipelined completion time\n"
    "(Eq. 20), streams the layers from their sources in parallel, verifies every block,\n"
    "delivers whole layers in order and re-plans when a source fails, stalls, lacks a layer or\n"
    "sends a corrupt block; a layer nobody has comes back as a miss. Prints \"listening EP\"\n"
    "once it serves; stops cleanly on SIGINT or SIGTERM.\n\n"
    "  -b, --bind EP          client endpoint (default " KVEDGE_PROXY_BIND_DEFAULT ")\n"
    "      --id ID            the proxy's id in the registry (default proxy)\n"
    "  -s, --source SPEC      a store node: \"KIND NAME ENDPOINT [key=K] [link=RATE,LATENCY]\n"
    "                         [bw=BYTES_PER_S] [rtt=US]\", KIND local, peer, cloud, history\n"
    "                         (repeatable; link= emulates a link, for tests)\n"
    "      --master EP        Storage Master ROUTER: sources, directory, links, models\n"
    "      --master-pub EP    its PUB endpoint (with --master)\n"
    "      --master-key KEY   its public key or certificate (none = plaintext, loopback only)\n"
    "      --snapshot FILE    keep the registry replica here (used when the master is down)\n"
    "      --local-node ID    this edge's store node in the registry (kind local)\n"
    "      --history-node ID  this edge's historical cache in the registry (kind history)\n"
    "      --cert FILE        proxy certificate, CURVE toward clients and sources (default\n"
    "                         ./" S_PROXY_CERT_DEFAULT ", made on first start)\n"
    "      --clients DIR      allowlist of client certificates (CURVE)\n"
    "      --insecure         plaintext for clients, loopback/ipc only\n"
    "  -c, --config FILE      ZPL config file, section `proxy` (keys as the flags with '_';\n"
    "                         one `source = \"...\"` per source); flags override\n"
    "      --log-level L      error, warn, info (default), debug\n";

static int s_cmd_proxy(kvedge_cli_t *cli, int argc, char **argv)
{
    (void)cli;
    enum {
        S_O_ID = 1000,
        S_O_MASTER,
        S_O_PUB,
        S_O_MKEY,
        S_O_SNAP,
        S_O_LOCAL,
        S_O_HIST,
        S_O_CERT,
        S_O_CLIENTS,
        S_O_INSECURE,
        S_O_LOG
    };
    static const struct option opts[] = {{"bind", required_argument, NULL, 'b'},
                                         {"id", required_argument, NULL, S_O_ID},
                                         {"source", required_argument, NULL, 's'},
                                         {"master", required_argument, NULL, S_O_MASTER},
                                         {"master-pub", required_argument, NULL, S_O_PUB},
                                         {"master-key", required_argument, NULL, S_O_MKEY},
                                         {"snapshot", required_argument, NULL, S_O_SNAP},
                                         {"local-node", required_argument, NULL, S_O_LOCAL},
                                         {"history-node", required_argument, NULL, S_O_HIST},
                                         {"cert", required_argument, NULL, S_O_CERT},
                                         {"clients", required_argument, NULL, S_O_CLIENTS},
                                         {"insecure", no_argument, NULL, S_O_INSECURE},
                                         {"config", required_argument, NULL, 'c'},
                                         {"log-level", required_argument, NULL, S_O_LOG},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    static s_conf_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.bind, sizeof c.bind, KVEDGE_PROXY_BIND_DEFAULT);
    snprintf(c.id, sizeof c.id, "proxy");
    snprintf(c.log, sizeof c.log, "info");
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--config") == 0 || strcmp(argv[i], "-c") == 0) {
            int ex = s_conf_file(argv[i + 1], &c);
            if (ex)
                return ex;
        }
    const kvedge_cli_cmd_t cmd = {"proxy", NULL,
                                  "[--bind EP] [--source SPEC]... [--master EP --master-pub EP]",
                                  "Run the edge proxy."};
    static const char *const keys[] = {[S_O_ID - 1000] = "id",
                                       [S_O_MASTER - 1000] = "master",
                                       [S_O_PUB - 1000] = "master_pub",
                                       [S_O_MKEY - 1000] = "master_key",
                                       [S_O_SNAP - 1000] = "snapshot",
                                       [S_O_LOCAL - 1000] = "local_node",
                                       [S_O_HIST - 1000] = "history_node",
                                       [S_O_CERT - 1000] = "cert",
                                       [S_O_CLIENTS - 1000] = "clients",
                                       [S_O_LOG - 1000] = "log"};
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "b:s:c:h", opts, NULL)) != -1) {
        int ex = KVEDGE_EXIT_OK;
        if (ch == 'b') {
            if (!s_set(&c, "bind", optarg))
                ex = KVEDGE_EXIT_USAGE;
        } else if (ch == 's') {
            ex = s_add_source(&c, optarg, "--source");
            if (ex)
                return ex;
        } else if (ch == 'c') {
            /* read above */
        } else if (ch == S_O_INSECURE) {
            c.insecure = true;
        } else if (ch >= S_O_ID && ch <= S_O_LOG && keys[ch - 1000]) {
            if (!s_set(&c, keys[ch - 1000], optarg))
                ex = KVEDGE_EXIT_USAGE;
        } else if (ch == 'h') {
            kvedge_cli_usage(stdout, &cmd, s_proxy_help);
            return KVEDGE_EXIT_OK;
        } else {
            kvedge_cli_error("proxy: unknown option or missing value '%s'", argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        if (ex) {
            kvedge_cli_error("proxy: value too long for %s", argv[optind - 1]);
            return ex;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("proxy: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_log_level_t level;
    if (kvedge_log_parse(c.log, &level) != 0) {
        kvedge_cli_error("proxy: --log-level must be error, warn, info or debug");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_log_set_level(level);
    if (!c.master[0] != !c.master_pub[0]) {
        kvedge_cli_error("proxy: --master and --master-pub go together");
        return KVEDGE_EXIT_USAGE;
    }
    if (!c.nsources && !c.master[0]) {
        kvedge_cli_error("proxy: no sources: give --source (repeatable) or --master");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_cli_trap_signals();
    char secret[1200] = "";
    bool need_cert = !c.insecure || c.master_key[0];
    for (size_t i = 0; i < c.nsources; i++)
        need_cert = need_cert || c.sources[i].server_key[0];
    if (need_cert) {
        if (!c.cert[0])
            snprintf(c.cert, sizeof c.cert, "%s", S_PROXY_CERT_DEFAULT);
        if (kvedge_cli_ensure_cert(c.cert, "kvedge proxy") != 0) {
            kvedge_cli_error("proxy: cannot create the proxy certificate %s", c.cert);
            return KVEDGE_EXIT_FAILURE;
        }
        snprintf(secret, sizeof secret, "%s_secret", c.cert);
    }
    if (!c.insecure && !c.clients[0]) {
        kvedge_cli_error("proxy: CURVE for clients needs --clients DIR (or --insecure on "
                         "loopback)");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = c.bind;
    po.insecure = c.insecure;
    po.cert = need_cert ? secret : NULL;
    po.clients_dir = c.insecure ? NULL : c.clients;
    po.id = c.id;
    po.sources = c.sources;
    po.nsources = c.nsources;
    po.master = c.master[0] ? c.master : NULL;
    po.master_pub = c.master_pub[0] ? c.master_pub : NULL;
    po.master_key = c.master_key[0] ? c.master_key : NULL;
    po.snapshot = c.snapshot[0] ? c.snapshot : NULL;
    po.local_node = c.local_node[0] ? c.local_node : NULL;
    po.history_node = c.history_node[0] ? c.history_node : NULL;
    char why[512] = "";
    kvedge_proxy_t *p;
    int rc = kvedge_proxy_start(&po, &p, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("proxy: %s", why[0] ? why : kvedge_strerror(rc));
        return rc == KVEDGE_EDENIED || rc == KVEDGE_EINVAL ? KVEDGE_EXIT_USAGE
                                                           : KVEDGE_EXIT_FAILURE;
    }
    printf("listening %s\n", kvedge_proxy_endpoint(p));
    fflush(stdout);
    kvedge_cli_wait_signal();
    kvedge_log_info("signal received: stopping");
    kvedge_proxy_destroy(&p);
    return KVEDGE_EXIT_OK;
}

/* ---------------------------------------------------------------- fetch */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    bool json;
    int64_t t0;
    uint64_t bytes;
    uint32_t delivered, missed;
} s_fetch_out_t;

static void s_out_plan(void *ctx, const kvedge_fetch_plan_t *pl)
{
    s_fetch_out_t *o = ctx;
    if (o->json)
        return;
    printf("plan: %u layers, split %u, T %.1f ms (bound %.1f, cloud-only %.1f, "
           "load-then-compute %.1f, recompute-all %.1f)\n",
           pl->layers, pl->split, pl->total_us / 1e3, pl->bound_us / 1e3, pl->cloud_only_us / 1e3,
           pl->load_then_compute_us / 1e3, pl->recompute_all_us / 1e3);
    for (uint32_t s = 0; s < pl->nsources; s++)
        printf("  source %u %-16s %-8s %-4s rtt %.2f ms, %.1f MB/s\n", s, pl->source[s].name,
               kvedge_plan_kind_name((kvedge_plan_kind_t)pl->source[s].kind),
               pl->source[s].up ? "up" : "down", pl->source[s].rtt_us / 1e3,
               pl->source[s].bw_bytes_per_s / 1e6);
}

static void s_out_block(void *ctx, uint16_t layer, uint32_t ci, uint16_t head, int source,
                        int status, const uint8_t *data, size_t len)
{
    (void)layer, (void)ci, (void)head, (void)source, (void)status, (void)data;
    ((s_fetch_out_t *)ctx)->bytes += len;
}

static void s_out_layer(void *ctx, const kvedge_fetch_layer_t *l)
{
    s_fetch_out_t *o = ctx;
    double ms = (double)(zclock_usecs() - o->t0) / 1e3;
    if (l->status == KVEDGE_OK)
        o->delivered++;
    else
        o->missed++;
    if (o->json)
        printf("{\"layer\":%u,\"source\":\"%s\",\"reason\":\"%s\",\"status\":\"%s\","
               "\"blocks\":%u,\"attempts\":%u,\"ms\":%.3f}\n",
               l->layer, l->source_name, kvedge_fetch_reason_name(l->reason),
               l->status == KVEDGE_OK ? "ok" : "miss", l->blocks, l->attempts, ms);
    else
        printf("layer %3u  %-16s %-18s %-4s %4u blocks  %u tries  at %8.1f ms\n", l->layer,
               l->status == KVEDGE_OK ? l->source_name : "(compute)",
               kvedge_fetch_reason_name(l->reason), l->status == KVEDGE_OK ? "ok" : "miss",
               l->blocks, l->attempts, ms);
}

static void s_out_done(void *ctx, int status)
{
    s_fetch_out_t *o = ctx;
    pthread_mutex_lock(&o->mu);
    o->done = true;
    o->status = status;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static int s_hex_id(const char *s, size_t n, kvedge_chunk_id_t *out)
{
    if (n != 2 * KVEDGE_CHUNK_ID_BYTES)
        return -1;
    for (size_t i = 0; i < KVEDGE_CHUNK_ID_BYTES; i++) {
        unsigned v;
        char b[3] = {s[2 * i], s[2 * i + 1], 0};
        if (!isxdigit((unsigned char)b[0]) || !isxdigit((unsigned char)b[1]) ||
            sscanf(b, "%2x", &v) != 1)
            return -1;
        out->bytes[i] = (uint8_t)v;
    }
    return 0;
}

static const char s_fetch_help[] =
    "Fetches layers of a context through an edge proxy (-H) and prints the plan and, per\n"
    "layer, the source that delivered it and why (planned, fallback:failed, fallback:missing,\n"
    "fallback:corrupt, recompute, miss, miss:deadline). Blocks are verified and counted,\n"
    "not kept.\n\n"
    "  -m, --model ID        the model the context was computed with\n"
    "      --chunks IDS      the context's chunk chain: 64-hex ids, comma-separated, in order\n"
    "      --layers A:B      layers A .. B-1 (default: every layer of the model)\n"
    "      --tokens N        context tokens, for pricing (default 256 per chunk)\n"
    "      --compute-us US   the decoder's time per layer (with --recompute-us)\n"
    "      --recompute-us US its extra time to compute a layer's context KV\n";

static int s_cmd_fetch(kvedge_cli_t *cli, int argc, char **argv)
{
    enum { S_O_CHUNKS = 1000, S_O_LAYERS, S_O_TOKENS, S_O_CU, S_O_RU };
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"chunks", required_argument, NULL, S_O_CHUNKS},
                                         {"layers", required_argument, NULL, S_O_LAYERS},
                                         {"tokens", required_argument, NULL, S_O_TOKENS},
                                         {"compute-us", required_argument, NULL, S_O_CU},
                                         {"recompute-us", required_argument, NULL, S_O_RU},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {"fetch", NULL, "-H PROXY --model ID --chunks IDS [...]",
                                  "Fetch through a proxy."};
    const char *model = NULL, *chunks = NULL, *layers = NULL;
    uint64_t tokens = 0, cu = 0, ru = 0;
    bool have_cu = false, have_ru = false;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        bool bad = false;
        switch (ch) {
        case 'm':
            model = optarg;
            break;
        case S_O_CHUNKS:
            chunks = optarg;
            break;
        case S_O_LAYERS:
            layers = optarg;
            break;
        case S_O_TOKENS:
            bad = kvedge_cli_parse_u64(optarg, 1, UINT32_MAX, &tokens) != 0;
            break;
        case S_O_CU:
            bad = kvedge_cli_parse_u64(optarg, 0, 1000000000, &cu) != 0;
            have_cu = true;
            break;
        case S_O_RU:
            bad = kvedge_cli_parse_u64(optarg, 0, 1000000000, &ru) != 0;
            have_ru = true;
            break;
        case 'h':
            kvedge_cli_usage(stdout, &cmd, s_fetch_help);
            return KVEDGE_EXIT_OK;
        default:
            kvedge_cli_error("fetch: unknown option or missing value '%s'", argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        if (bad) {
            kvedge_cli_error("fetch: bad value '%s' for %s", optarg, argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (!cli->host || !model || !chunks || have_cu != have_ru) {
        kvedge_cli_error("fetch: needs -H PROXY, --model and --chunks (and --compute-us with "
                         "--recompute-us)");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_model_t shape;
    unsigned a = 0, b = 0;
    if (layers) {
        if (sscanf(layers, "%u:%u", &a, &b) != 2 || b <= a || b - a > KVEDGE_FETCH_MAX_LAYERS ||
            b > 65536) {
            kvedge_cli_error("fetch: --layers wants A:B with A < B, at most %d layers",
                             KVEDGE_FETCH_MAX_LAYERS);
            return KVEDGE_EXIT_USAGE;
        }
    } else if (kvedge_model_builtin(model, &shape) == KVEDGE_OK) {
        b = shape.layers;
    } else {
        kvedge_cli_error("fetch: %s is not a built-in model: give --layers A:B", model);
        return KVEDGE_EXIT_USAGE;
    }
    size_t n = 0, len = strlen(chunks);
    kvedge_chunk_id_t *ids = calloc(len / 64 + 1, sizeof *ids);
    for (const char *p = chunks; ids && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (n > KVEDGE_WIRE_MAX_CHUNKS || s_hex_id(p, l, &ids[n]) != 0) {
            kvedge_cli_error("fetch: --chunks wants 64-hex chunk ids separated by commas");
            free(ids);
            return KVEDGE_EXIT_USAGE;
        }
        n++;
        p = e ? e + 1 : p + l;
    }
    float *cus = NULL, *rus = NULL;
    if (have_cu) {
        cus = calloc(b - a, sizeof *cus);
        rus = calloc(b - a, sizeof *rus);
        for (unsigned i = 0; cus && rus && i < b - a; i++) {
            cus[i] = (float)cu;
            rus[i] = (float)ru;
        }
    }
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = cli->host;
    o.server_key = cli->server_key;
    o.client_cert = cli->cert;
    o.deadline_ms = cli->deadline_ms;
    o.link = cli->link;
    o.name = "kvedge fetch";
    kvedge_client_t *c = NULL;
    int rc = ids ? kvedge_client_connect(&o, &c) : KVEDGE_ENOMEM;
    s_fetch_out_t out = {PTHREAD_MUTEX_INITIALIZER,
                         PTHREAD_COND_INITIALIZER,
                         false,
                         0,
                         cli->json,
                         zclock_usecs(),
                         0,
                         0,
                         0};
    if (rc == KVEDGE_OK) {
        kvedge_fetch_req_t req = {
            model,           ids, n, (uint16_t)a, (uint16_t)(b - a), (uint32_t)tokens, cus, rus,
            cli->deadline_ms};
        kvedge_fetch_cbs_t cbs = {s_out_plan, s_out_block, s_out_layer, s_out_done};
        rc = kvedge_client_fetch_async(c, &req, &cbs, &out);
        if (rc == KVEDGE_OK) {
            pthread_mutex_lock(&out.mu);
            while (!out.done)
                pthread_cond_wait(&out.cv, &out.mu);
            pthread_mutex_unlock(&out.mu);
            rc = out.status;
        }
    }
    kvedge_client_destroy(&c);
    free(ids);
    free(cus);
    free(rus);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("fetch: %s", kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    if (!cli->json)
        printf("%u layers delivered, %u to compute locally, %.1f MB in %.1f ms\n", out.delivered,
               out.missed, (double)out.bytes / 1e6, (double)(zclock_usecs() - out.t0) / 1e3);
    return KVEDGE_EXIT_OK;
}

const kvedge_cli_cmd_t kvedge_cli_proxy_cmds[] = {
    {"proxy", s_cmd_proxy, "[--bind EP] [--source SPEC]... [--master EP --master-pub EP]",
     "Run the edge proxy (planned multi-source fetches, failover, misses)."},
    {"fetch", s_cmd_fetch, "-H PROXY --model ID --chunks IDS [--layers A:B]",
     "Fetch a context's layers through a proxy; print each layer's source and reason."},
    {NULL, NULL, NULL, NULL},
};
