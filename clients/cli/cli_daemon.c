/* The daemon commands of kvedge: `store` (a store node) and `keygen` (CURVE certificates).
 * Thin mains: the node itself is store/node/node.c. */
#include <czmq.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/log.h"
#include "store/node/node.h"
#include "clients/cli/cli.h"
#include "clients/cli/cli_plan.h"
#include "store/node/hsync.h"
#include "store/error.h"


/* Settings of a store node: defaults, then the config file, then flags. */
typedef struct {
    char role[16];
    char data[1024];
    char bind[256];
    char cert[KVEDGE_NODE_PATH_BYTES];
    char clients[KVEDGE_NODE_PATH_BYTES];
    char name[256];
    char log[16];
    bool insecure;
    bool sync;
    uint64_t workers;
    uint64_t capacity;
    uint64_t cache;
    bool cache_set;
    char subscriptions[KVEDGE_NODE_PATH_BYTES]; /* historical cache: subscribed contexts (edge nodes) */
    uint64_t sync_interval_s;
    /* Registration with a Storage Master: node record, heartbeats, block directory. */
    char master[256];
    char master_pub[256];
    char master_key[KVEDGE_NODE_PATH_BYTES];
    char node_id[65];
    char advertise[256]; /* the endpoint others reach us on; default: the bound one */
    char region[65];
    uint64_t declare_bw;     /* bytes/s, a prior for planners; 0 = unknown */
    uint64_t declare_rtt_us; /* a prior for planners; 0 = unknown */
} s_store_conf_t;

static bool s_store_str(s_store_conf_t *c, const char *k, const char *v);

static int s_conf_file(const char *path, s_store_conf_t *c)
{
    zconfig_t *root = zconfig_load(path);
    if (!root) {
        kvedge_cli_error("store: cannot read config file %s (ZPL format, see docs/operations.md)",
                         path);
        return KVEDGE_EXIT_USAGE;
    }
    static const char *known[] = {
        "role",          "data",          "bind",       "cert",           "clients",    "name",
        "log",           "insecure",      "sync",       "workers",        "capacity",   "cache",
        "subscriptions", "sync_interval", "master",     "master_pub",     "master_key", "node_id",
        "advertise",     "region",        "declare_bw", "declare_rtt_us", NULL};
    zconfig_t *store = zconfig_locate(root, "store");
    int ex = KVEDGE_EXIT_OK;
    for (zconfig_t *item = store ? zconfig_child(store) : NULL; item && !ex;
         item = zconfig_next(item)) {
        const char *k = zconfig_name(item), *v = zconfig_value(item);
        int i = 0;
        while (known[i] && strcmp(known[i], k) != 0)
            i++;
        if (!known[i] || !v) {
            kvedge_cli_error("store: %s: unknown or empty setting store/%s", path, k);
            ex = KVEDGE_EXIT_USAGE;
            break;
        }
        bool bad = false;
        if (strcmp(k, "role") == 0)
            snprintf(c->role, sizeof c->role, "%s", v);
        else if (strcmp(k, "data") == 0)
            snprintf(c->data, sizeof c->data, "%s", v);
        else if (strcmp(k, "bind") == 0)
            snprintf(c->bind, sizeof c->bind, "%s", v);
        else if (strcmp(k, "cert") == 0)
            snprintf(c->cert, sizeof c->cert, "%s", v);
        else if (strcmp(k, "clients") == 0)
            snprintf(c->clients, sizeof c->clients, "%s", v);
        else if (strcmp(k, "name") == 0)
            snprintf(c->name, sizeof c->name, "%s", v);
        else if (strcmp(k, "log") == 0)
            snprintf(c->log, sizeof c->log, "%s", v);
        else if (strcmp(k, "insecure") == 0)
            c->insecure = strcmp(v, "1") == 0 || strcmp(v, "true") == 0;
        else if (strcmp(k, "sync") == 0)
            c->sync = strcmp(v, "1") == 0 || strcmp(v, "true") == 0;
        else if (strcmp(k, "workers") == 0)
            bad = kvedge_cli_parse_u64(v, 1, 256, &c->workers) != 0;
        else if (strcmp(k, "capacity") == 0)
            bad = kvedge_cli_parse_size(v, &c->capacity) != 0;
        else if (strcmp(k, "subscriptions") == 0)
            snprintf(c->subscriptions, sizeof c->subscriptions, "%s", v);
        else if (strcmp(k, "sync_interval") == 0)
            bad = kvedge_cli_parse_u64(v, 1, 86400, &c->sync_interval_s) != 0;
        else if (strcmp(k, "cache") == 0)
            bad = kvedge_cli_parse_size(v, &c->cache) != 0 || !(c->cache_set = true);
        else if (strcmp(k, "declare_bw") == 0)
            bad = kvedge_cli_parse_size(v, &c->declare_bw) != 0;
        else if (strcmp(k, "declare_rtt_us") == 0)
            bad = kvedge_cli_parse_u64(v, 1, 60000000, &c->declare_rtt_us) != 0;
        else
            bad = !s_store_str(c, k, v);
        if (bad) {
            kvedge_cli_error("store: %s: bad value '%s' for store/%s", path, v, k);
            ex = KVEDGE_EXIT_USAGE;
        }
    }
    zconfig_destroy(&root);
    return ex;
}

/* The string settings of the master registration, by config key. */
static bool s_store_str(s_store_conf_t *c, const char *k, const char *v)
{
    const kvedge_cli_str_t t[] = {{"master", c->master, sizeof c->master},
                                  {"master_pub", c->master_pub, sizeof c->master_pub},
                                  {"master_key", c->master_key, sizeof c->master_key},
                                  {"node_id", c->node_id, sizeof c->node_id},
                                  {"advertise", c->advertise, sizeof c->advertise},
                                  {"region", c->region, sizeof c->region}};
    return kvedge_cli_set_str(t, sizeof t / sizeof t[0], k, v);
}

static int s_cmd_store(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"role", required_argument, NULL, 'r'},
                                         {"data", required_argument, NULL, 'd'},
                                         {"bind", required_argument, NULL, 'b'},
                                         {"config", required_argument, NULL, 'c'},
                                         {"insecure", no_argument, NULL, 'I'},
                                         {"cert", required_argument, NULL, 'C'},
                                         {"clients", required_argument, NULL, 'A'},
                                         {"workers", required_argument, NULL, 'w'},
                                         {"capacity", required_argument, NULL, 'K'},
                                         {"cache", required_argument, NULL, 'M'},
                                         {"sync", no_argument, NULL, 'S'},
                                         {"name", required_argument, NULL, 'n'},
                                         {"log-level", required_argument, NULL, 'L'},
                                         {"subscriptions", required_argument, NULL, 'U'},
                                         {"sync-interval", required_argument, NULL, 'Y'},
                                         {"master", required_argument, NULL, 1001},
                                         {"master-pub", required_argument, NULL, 1002},
                                         {"master-key", required_argument, NULL, 1003},
                                         {"node-id", required_argument, NULL, 1004},
                                         {"advertise", required_argument, NULL, 1005},
                                         {"region", required_argument, NULL, 1006},
                                         {"declare-bw", required_argument, NULL, 1007},
                                         {"declare-rtt-us", required_argument, NULL, 1008},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    s_store_conf_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.role, sizeof c.role, "edge");
    snprintf(c.data, sizeof c.data, "%s", cli->data_dir);
    snprintf(c.bind, sizeof c.bind, KVEDGE_NODE_BIND_DEFAULT);
    snprintf(c.log, sizeof c.log, "info");
    /* The config file first (wherever --config is on the line), then the flags over it. */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--config") == 0 || strcmp(argv[i], "-c") == 0) {
            int ex = s_conf_file(argv[i + 1], &c);
            if (ex)
                return ex;
        }
    const kvedge_cli_cmd_t cmd = {"store", NULL, "[--role cloud|edge] [--bind EP] [...]",
                                  "Run a store node."};
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "r:d:b:c:w:n:h", opts, NULL)) != -1) {
        bool bad = false;
        switch (ch) {
        case 'r':
            snprintf(c.role, sizeof c.role, "%s", optarg);
            break;
        case 'd':
            snprintf(c.data, sizeof c.data, "%s", optarg);
            break;
        case 'b':
            snprintf(c.bind, sizeof c.bind, "%s", optarg);
            break;
        case 'c':
            break; /* read above */
        case 'I':
            c.insecure = true;
            break;
        case 'C':
            snprintf(c.cert, sizeof c.cert, "%s", optarg);
            break;
        case 'A':
            snprintf(c.clients, sizeof c.clients, "%s", optarg);
            break;
        case 'w':
            bad = kvedge_cli_parse_u64(optarg, 1, 256, &c.workers) != 0;
            break;
        case 'K':
            bad = kvedge_cli_parse_size(optarg, &c.capacity) != 0;
            break;
        case 'M':
            bad = kvedge_cli_parse_size(optarg, &c.cache) != 0;
            c.cache_set = true;
            break;
        case 'S':
            c.sync = true;
            break;
        case 'n':
            snprintf(c.name, sizeof c.name, "%s", optarg);
            break;
        case 'L':
            snprintf(c.log, sizeof c.log, "%s", optarg);
            break;
        case 'U':
            snprintf(c.subscriptions, sizeof c.subscriptions, "%s", optarg);
            break;
        case 'Y':
            bad = kvedge_cli_parse_u64(optarg, 1, 86400, &c.sync_interval_s) != 0;
            break;
        case 1001:
        case 1002:
        case 1003:
        case 1004:
        case 1005:
        case 1006: {
            static const char *const k[] = {"master",  "master_pub", "master_key",
                                            "node_id", "advertise",  "region"};
            bad = !s_store_str(&c, k[ch - 1001], optarg);
            break;
        }
        case 1007:
            bad = kvedge_cli_parse_size(optarg, &c.declare_bw) != 0;
            break;
        case 1008:
            bad = kvedge_cli_parse_u64(optarg, 1, 60000000, &c.declare_rtt_us) != 0;
            break;
        case 'h':
            kvedge_cli_usage(
                stdout, &cmd,
                "Serves the store in --data over ZeroMQ (docs/protocol.md) until SIGINT or\n"
                "SIGTERM, then finishes in-flight work and closes the store.\n\n"
                "  -r, --role cloud|edge   node role (default edge)\n"
                "  -d, --data DIR          store directory (default: the global --data)\n"
                "  -b, --bind EP           endpoint (default " KVEDGE_NODE_BIND_DEFAULT ")\n"
                "  -c, --config FILE       ZPL config file, section `store` (flags override)\n"
                "      --cert FILE         node certificate (default DATA/" KVEDGE_NODE_CERT_NAME
                ", made on first start)\n"
                "      --clients DIR       allowlist of client certificates (default\n"
                "                          DATA/" KVEDGE_NODE_CLIENTS_NAME "; empty = nobody)\n"
                "      --insecure          plaintext, allowed only on loopback/ipc endpoints\n"
                "  -w, --workers N         worker threads (default: one per core, at least 2)\n"
                "      --capacity SIZE     evict LRU unpinned blocks beyond SIZE (default none)\n"
                "      --cache SIZE        in-memory block cache (default 256M)\n"
                "      --sync              fsync the WAL on every write\n"
                "  -n, --name NAME         node name shown to clients\n"
                "      --log-level L       error, warn, info (default), debug\n"
                "      --subscriptions F   historical cache (edge): contexts to copy from a\n"
                "                          cloud node and pin (see kvedge sync --help)\n"
                "      --sync-interval S   seconds between sync passes (default 60)\n"
                "      --master EP         join a Storage Master (with --master-pub, --node-id):\n"
                "                          register, heartbeat, publish the block directory\n"
                "      --master-pub EP     the master's PUB endpoint\n"
                "      --master-key KEY    the master's public key or certificate\n"
                "      --node-id ID        this node's id in the registry\n"
                "      --advertise EP      endpoint others reach this node on (default: bound)\n"
                "      --region R          region label in the node record\n"
                "      --declare-bw SIZE   declared bandwidth to this node, bytes/s (a prior)\n"
                "      --declare-rtt-us US declared round trip to this node (a prior)\n");
            return KVEDGE_EXIT_OK;
        default:
            kvedge_cli_error("store: unknown option or missing value '%s'", argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        if (bad) {
            kvedge_cli_error("store: bad value '%s' for %s", optarg, argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("store: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_role_t role;
    if (strcmp(c.role, "cloud") == 0)
        role = KVEDGE_ROLE_CLOUD;
    else if (strcmp(c.role, "edge") == 0)
        role = KVEDGE_ROLE_EDGE;
    else {
        kvedge_cli_error("store: --role must be cloud or edge, not '%s'", c.role);
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_log_level_t level;
    if (kvedge_log_parse(c.log, &level) != 0) {
        kvedge_cli_error("store: --log-level must be error, warn, info or debug");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_log_set_level(level);
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    ns.role = role;
    snprintf(ns.data, sizeof ns.data, "%s", c.data);
    snprintf(ns.bind, sizeof ns.bind, "%s", c.bind);
    snprintf(ns.cert, sizeof ns.cert, "%s", c.cert);
    snprintf(ns.clients, sizeof ns.clients, "%s", c.clients);
    snprintf(ns.name, sizeof ns.name, "%s", c.name);
    ns.insecure = c.insecure;
    ns.sync = c.sync;
    ns.workers = (uint32_t)c.workers;
    ns.capacity_bytes = c.capacity;
    if (c.cache_set)
        ns.cache_bytes = c.cache;
    snprintf(ns.subscriptions, sizeof ns.subscriptions, "%s", c.subscriptions);
    if (c.sync_interval_s)
        ns.sync_interval_s = (uint32_t)c.sync_interval_s;
    snprintf(ns.master, sizeof ns.master, "%s", c.master);
    snprintf(ns.master_pub, sizeof ns.master_pub, "%s", c.master_pub);
    snprintf(ns.master_key, sizeof ns.master_key, "%s", c.master_key);
    snprintf(ns.node_id, sizeof ns.node_id, "%s", c.node_id);
    snprintf(ns.advertise, sizeof ns.advertise, "%s", c.advertise);
    snprintf(ns.region, sizeof ns.region, "%s", c.region);
    ns.declare_bw = c.declare_bw;
    ns.declare_rtt_us = (uint32_t)c.declare_rtt_us;
    char why[512] = "";
    int rc = kvedge_node_settings_check(&ns, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("store: %s", why);
        return KVEDGE_EXIT_USAGE;
    }

    kvedge_cli_trap_signals(); /* the first SIGINT/SIGTERM starts a clean stop */
    kvedge_node_t *node;
    rc = kvedge_node_start(&ns, &node, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("store: %s", why);
        switch (rc) {
        case KVEDGE_EINVAL:
        case KVEDGE_EDENIED:
            return KVEDGE_EXIT_USAGE;
        case KVEDGE_ENOTFOUND:
        case KVEDGE_EBUSY:
        case KVEDGE_ECORRUPT:
        case KVEDGE_EVERSION:
        case KVEDGE_ESTORE:
            return KVEDGE_EXIT_UNAVAILABLE;
        default:
            return KVEDGE_EXIT_FAILURE;
        }
    }
    /* Tell scripts where we are (ephemeral ports): one line on stdout. */
    printf("listening %s\n", kvedge_node_endpoint(node));
    fflush(stdout);
    kvedge_cli_wait_signal();
    kvedge_log_info("signal received: finishing in-flight work");
    kvedge_node_destroy(&node);
    kvedge_log_info("store closed");
    return KVEDGE_EXIT_OK;
}

static int s_cmd_keygen(kvedge_cli_t *cli, int argc, char **argv)
{
    (void)cli;
    static const struct option opts[] = {{"tenant", required_argument, NULL, 't'},
                                         {"admin", no_argument, NULL, 'a'},
                                         {"force", no_argument, NULL, 'f'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {"keygen", NULL, "PATH [--tenant NAME] [--admin] [--force]", NULL};
    const char *tenant = NULL;
    bool force = false, admin = false;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "t:fh", opts, NULL)) != -1) {
        if (ch == 't') {
            tenant = optarg;
        } else if (ch == 'a') {
            admin = true;
        } else if (ch == 'f') {
            force = true;
        } else if (ch == 'h') {
            printf(
                "usage: kvedge keygen PATH [--tenant NAME] [--admin] [--force]\n\n"
                "Writes a CURVE certificate pair: PATH (public: give it to the node's\n"
                "clients directory, or to clients as the node key) and PATH_secret (mode\n"
                "0600: keep it). --tenant puts the client in a named tenant: every key of\n"
                "the same tenant shares one cache namespace. --admin lets the key run store-wide\n"
                "operations (evict) once its public certificate is in a node's allowlist.\n");
            return KVEDGE_EXIT_OK;
        } else {
            kvedge_cli_error("keygen: unknown option '%s'", argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    (void)cmd;
    if (argc - optind != 1) {
        kvedge_cli_error("keygen: expected one PATH");
        return KVEDGE_EXIT_USAGE;
    }
    const char *path = argv[optind];
    char secret[4200];
    snprintf(secret, sizeof secret, "%s_secret", path);
    if (!force && (zsys_file_exists(path) || zsys_file_exists(secret))) {
        kvedge_cli_error("keygen: %s exists; pass --force to replace it", path);
        return KVEDGE_EXIT_FAILURE;
    }
    zcert_t *cert = zcert_new();
    if (!cert)
        return KVEDGE_EXIT_FAILURE;
    if (tenant)
        zcert_set_meta(cert, "tenant", "%s", tenant);
    if (admin)
        zcert_set_meta(cert, "admin", "true");
    mode_t old = umask(077); /* the secret file is private from its first byte */
    int rc = zcert_save(cert, path);
    umask(old);
    if (rc == 0) {
        chmod(secret, 0600);
        chmod(path, 0644);
        printf("public key %s\nwrote %s and %s\n", zcert_public_txt(cert), path, secret);
    } else {
        kvedge_cli_error("keygen: cannot write %s: %s", path, strerror(errno));
    }
    zcert_destroy(&cert);
    return rc == 0 ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
}

/* `kvedge sync`: the historical cache's progress (what a running edge node last wrote), or
 * one pass in the foreground with --once. */
static int s_cmd_sync(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"once", no_argument, NULL, 'o'},
                                         {"subscriptions", required_argument, NULL, 'U'},
                                         {"deadline", required_argument, NULL, 'D'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    bool once = false;
    char subs_path[KVEDGE_NODE_PATH_BYTES];
    uint64_t deadline = 10000;
    snprintf(subs_path, sizeof subs_path, "%s/subscriptions.conf", cli->data_dir);
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ch == 'o') {
            once = true;
        } else if (ch == 'U') {
            snprintf(subs_path, sizeof subs_path, "%s", optarg);
        } else if (ch == 'D' && kvedge_cli_parse_u64(optarg, 1, 600000, &deadline) == 0) {
            continue;
        } else if (ch == 'h') {
            printf("usage: kvedge [--data DIR] sync [--once] [--subscriptions FILE]\n\n"
                   "The edge's historical cache: contexts copied from a cloud node and pinned,\n"
                   "so the edge serves them with the network down. Without --once: the\n"
                   "progress a running node last wrote (DIR/" KVEDGE_HSYNC_STATUS_FILE
                   "). With --once: one\n"
                   "pass now into DIR (the node must not be running). The file (default\n"
                   "DIR/subscriptions.conf) has one section per context:\n\n"
                   "  subscription\n"
                   "      name = support-bot\n"
                   "      cloud = tcp://cloud:7400\n"
                   "      server_key = /etc/kvedge/cloud.cert   # omit for plaintext loopback\n"
                   "      cert = /etc/kvedge/keys/edge_secret\n"
                   "      tenant = acme          # local tenant the copy serves\n"
                   "      prefix = <64 hex digits: the context's last chunk, as kvedge -H ls "
                   "shows>\n"
                   "      layers = 6:12          # optional: only layers 6..11 (default all)\n");
            return KVEDGE_EXIT_OK;
        } else {
            kvedge_cli_error("sync: bad option '%s'", argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (!once) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", cli->data_dir, KVEDGE_HSYNC_STATUS_FILE);
        FILE *f = fopen(path, "r");
        if (!f) {
            kvedge_cli_error("no sync status in %s: no edge node with --subscriptions has run "
                             "there yet (or run kvedge sync --once)",
                             cli->data_dir);
            return KVEDGE_EXIT_NOTFOUND;
        }
        char line[2048];
        while (fgets(line, sizeof line, f))
            fputs(line, stdout);
        fclose(f);
        return KVEDGE_EXIT_OK;
    }
    static kvedge_hsync_sub_t subs[KVEDGE_HSYNC_MAX_SUBS];
    static kvedge_hsync_status_t st[KVEDGE_HSYNC_MAX_SUBS];
    size_t n = 0;
    char why[512] = "";
    int rc = kvedge_hsync_load(subs_path, subs, KVEDGE_HSYNC_MAX_SUBS, &n, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("sync: %s", why);
        return rc == KVEDGE_EIO ? KVEDGE_EXIT_NOTFOUND : KVEDGE_EXIT_USAGE;
    }
    kvedge_engine_t *engine;
    int ex = kvedge_cli_open(cli, true, &engine);
    if (ex)
        return ex;
    int worst = KVEDGE_OK;
    for (size_t i = 0; i < n; i++) {
        memset(&st[i], 0, sizeof st[i]);
        rc = kvedge_hsync_run(engine, &subs[i], (int)deadline, &st[i]);
        if (rc != KVEDGE_OK && worst == KVEDGE_OK)
            worst = rc;
        printf("%-20s %-8s %u/%u chunks, %llu blocks copied (%llu bytes), %llu held%s%s\n",
               subs[i].name, rc == KVEDGE_OK ? "ok" : "failed", st[i].chunks_synced,
               st[i].chunks_total, (unsigned long long)st[i].blocks_copied,
               (unsigned long long)st[i].bytes_copied, (unsigned long long)st[i].blocks_held,
               rc == KVEDGE_OK ? "" : ": ", rc == KVEDGE_OK ? "" : kvedge_strerror(rc));
    }
    kvedge_hsync_write_status(cli->data_dir, subs, st, n);
    kvedge_engine_destroy(&engine);
    return kvedge_cli_exit_code(worst);
}

const kvedge_cli_cmd_t kvedge_cli_daemon_cmds[] = {
    {"store", s_cmd_store, "[--role cloud|edge] [--bind EP] [--config FILE] [...]",
     "Run a store node (cloud or edge role) serving the data directory."},
    {"keygen", s_cmd_keygen, "PATH [--tenant NAME]", "Write a CURVE certificate pair."},
    {"plan", kvedge_cli_plan, "--model ID --source SPEC [...]",
     "What the planner would fetch from where, without fetching."},
    {"sync", s_cmd_sync, "[--once] [--subscriptions FILE]",
     "Historical cache of an edge: progress, or one pass."},
    {NULL, NULL, NULL, NULL},
};
