/* The Storage Master commands of kvedge: `master` (the daemon, access/master.c) and
 * `master-dump` (a snapshot of the registry through a replica view, printed). Thin mains. */
#include <czmq.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/log.h"
#include "store/master/master.h"
#include "access/mview.h"
#include "access/transport.h"
#include "clients/cli/cli.h"
#include "store/error.h"

#define S_MASTER_DATA_DEFAULT "./master"
#define S_MASTER_CERT_NAME    "master.cert" /* in the data dir; the secret is master.cert_secret */
#define S_CLIENTS_DIR_NAME    "clients"
#define S_DUMP_DEADLINE_MS    3000

/* Settings of a master: defaults, then the config file, then flags. */
typedef struct {
    char data[1024];
    char bind[256];
    char pub[256];
    char cert[1100];
    char clients[1100];
    char log[16];
    bool insecure;
    bool sync;
    uint64_t suspect_ms;
    uint64_t down_ms;
} s_conf_t;

static bool s_truthy(const char *v)
{
    return strcmp(v, "1") == 0 || strcmp(v, "true") == 0;
}

static int s_conf_file(const char *path, s_conf_t *c)
{
    zconfig_t *root = zconfig_load(path);
    if (!root) {
        kvedge_cli_error("master: cannot read config file %s (ZPL format, see docs/master.md)",
                         path);
        return KVEDGE_EXIT_USAGE;
    }
    zconfig_t *sec = zconfig_locate(root, "master");
    int ex = KVEDGE_EXIT_OK;
    for (zconfig_t *item = sec ? zconfig_child(sec) : NULL; item && !ex;
         item = zconfig_next(item)) {
        const char *k = zconfig_name(item), *v = zconfig_value(item);
        bool bad = false;
        if (!v)
            bad = true;
        else if (strcmp(k, "data") == 0)
            snprintf(c->data, sizeof c->data, "%s", v);
        else if (strcmp(k, "bind") == 0)
            snprintf(c->bind, sizeof c->bind, "%s", v);
        else if (strcmp(k, "pub") == 0)
            snprintf(c->pub, sizeof c->pub, "%s", v);
        else if (strcmp(k, "cert") == 0)
            snprintf(c->cert, sizeof c->cert, "%s", v);
        else if (strcmp(k, "clients") == 0)
            snprintf(c->clients, sizeof c->clients, "%s", v);
        else if (strcmp(k, "log") == 0)
            snprintf(c->log, sizeof c->log, "%s", v);
        else if (strcmp(k, "insecure") == 0)
            c->insecure = s_truthy(v);
        else if (strcmp(k, "sync") == 0)
            c->sync = s_truthy(v);
        else if (strcmp(k, "suspect_ms") == 0)
            bad = kvedge_cli_parse_u64(v, 10, 3600000, &c->suspect_ms) != 0;
        else if (strcmp(k, "down_ms") == 0)
            bad = kvedge_cli_parse_u64(v, 10, 3600000, &c->down_ms) != 0;
        else
            bad = true;
        if (bad) {
            kvedge_cli_error("master: %s: unknown setting or bad value for master/%s", path, k);
            ex = KVEDGE_EXIT_USAGE;
        }
    }
    zconfig_destroy(&root);
    return ex;
}

static const char s_master_help[] =
    "Runs the Storage Master (docs/master.md): the registry of nodes, health, models, layer\n"
    "maps, block directories and links, persisted in --data, served on a ROUTER (snapshots,\n"
    "updates, heartbeats) and a PUB (sequenced updates, HUGZ every second). Prints\n"
    "\"listening ROUTER_EP PUB_EP\" once it serves; stops cleanly on SIGINT or SIGTERM.\n\n"
    "  -b, --bind EP         ROUTER endpoint (default " KVEDGE_MASTER_BIND_DEFAULT ")\n"
    "  -p, --pub EP          PUB endpoint (default " KVEDGE_MASTER_PUB_DEFAULT ")\n"
    "  -d, --data DIR        registry directory (default " S_MASTER_DATA_DEFAULT ")\n"
    "  -c, --config FILE     ZPL config file, section `master` (flags override)\n"
    "      --cert FILE       master certificate (default DATA/" S_MASTER_CERT_NAME
    ", made on first start)\n"
    "      --clients DIR     allowlist of peer certificates (default DATA/" S_CLIENTS_DIR_NAME
    "; empty = nobody)\n"
    "      --insecure        plaintext, allowed only when both endpoints are loopback/ipc\n"
    "      --sync            fsync the registry's WAL on every update\n"
    "      --suspect-ms MS   heartbeat silence before a node is suspect (default 3000)\n"
    "      --down-ms MS      heartbeat silence before a node is down (default 10000)\n"
    "      --log-level L     error, warn, info (default), debug\n";

static int s_cmd_master(kvedge_cli_t *cli, int argc, char **argv)
{
    (void)cli;
    enum { S_O_CERT = 1000, S_O_CLIENTS, S_O_INSECURE, S_O_SYNC, S_O_SUSPECT, S_O_DOWN, S_O_LOG };
    static const struct option opts[] = {{"bind", required_argument, NULL, 'b'},
                                         {"pub", required_argument, NULL, 'p'},
                                         {"data", required_argument, NULL, 'd'},
                                         {"config", required_argument, NULL, 'c'},
                                         {"cert", required_argument, NULL, S_O_CERT},
                                         {"clients", required_argument, NULL, S_O_CLIENTS},
                                         {"insecure", no_argument, NULL, S_O_INSECURE},
                                         {"sync", no_argument, NULL, S_O_SYNC},
                                         {"suspect-ms", required_argument, NULL, S_O_SUSPECT},
                                         {"down-ms", required_argument, NULL, S_O_DOWN},
                                         {"log-level", required_argument, NULL, S_O_LOG},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    s_conf_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.data, sizeof c.data, S_MASTER_DATA_DEFAULT);
    snprintf(c.bind, sizeof c.bind, KVEDGE_MASTER_BIND_DEFAULT);
    snprintf(c.pub, sizeof c.pub, KVEDGE_MASTER_PUB_DEFAULT);
    snprintf(c.log, sizeof c.log, "info");
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--config") == 0 || strcmp(argv[i], "-c") == 0) {
            int ex = s_conf_file(argv[i + 1], &c);
            if (ex)
                return ex;
        }
    const kvedge_cli_cmd_t cmd = {"master", NULL,
                                  "[--bind EP] [--pub EP] [--data DIR] [--insecure] [...]",
                                  "Run the Storage Master."};
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "b:p:d:c:h", opts, NULL)) != -1) {
        bool bad = false;
        switch (ch) {
        case 'b':
            snprintf(c.bind, sizeof c.bind, "%s", optarg);
            break;
        case 'p':
            snprintf(c.pub, sizeof c.pub, "%s", optarg);
            break;
        case 'd':
            snprintf(c.data, sizeof c.data, "%s", optarg);
            break;
        case 'c':
            break; /* read above */
        case S_O_CERT:
            snprintf(c.cert, sizeof c.cert, "%s", optarg);
            break;
        case S_O_CLIENTS:
            snprintf(c.clients, sizeof c.clients, "%s", optarg);
            break;
        case S_O_INSECURE:
            c.insecure = true;
            break;
        case S_O_SYNC:
            c.sync = true;
            break;
        case S_O_SUSPECT:
            bad = kvedge_cli_parse_u64(optarg, 10, 3600000, &c.suspect_ms) != 0;
            break;
        case S_O_DOWN:
            bad = kvedge_cli_parse_u64(optarg, 10, 3600000, &c.down_ms) != 0;
            break;
        case S_O_LOG:
            snprintf(c.log, sizeof c.log, "%s", optarg);
            break;
        case 'h':
            kvedge_cli_usage(stdout, &cmd, s_master_help);
            return KVEDGE_EXIT_OK;
        default:
            kvedge_cli_error("master: unknown option or missing value '%s'", argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        if (bad) {
            kvedge_cli_error("master: bad value '%s' for %s", optarg, argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("master: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_log_level_t level;
    if (kvedge_log_parse(c.log, &level) != 0) {
        kvedge_cli_error("master: --log-level must be error, warn, info or debug");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_log_set_level(level);
    if (c.insecure &&
        (!kvedge_endpoint_is_loopback(c.bind) || !kvedge_endpoint_is_loopback(c.pub))) {
        kvedge_cli_error("master: refusing plaintext on %s / %s: --insecure is only allowed on "
                         "loopback (tcp://127.0.0.1:PORT) or ipc:// endpoints",
                         c.bind, c.pub);
        return KVEDGE_EXIT_USAGE;
    }

    kvedge_cli_trap_signals(); /* the first SIGINT/SIGTERM starts a clean stop */

    if (mkdir(c.data, 0700) != 0 && !zsys_file_exists(c.data)) {
        kvedge_cli_error("master: cannot create the data directory %s", c.data);
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    char secret[1200] = "";
    if (!c.insecure) {
        if (!c.cert[0])
            snprintf(c.cert, sizeof c.cert, "%s/%s", c.data, S_MASTER_CERT_NAME);
        if (!c.clients[0]) {
            snprintf(c.clients, sizeof c.clients, "%s/%s", c.data, S_CLIENTS_DIR_NAME);
            mkdir(c.clients, 0700);
        }
        if (kvedge_cli_ensure_cert(c.cert, "kvedge master") != 0) {
            kvedge_cli_error("master: cannot create the master certificate %s", c.cert);
            return KVEDGE_EXIT_FAILURE;
        }
        snprintf(secret, sizeof secret, "%s_secret", c.cert);
    }
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = c.bind;
    mo.pub = c.pub;
    mo.data_dir = c.data;
    mo.insecure = c.insecure;
    mo.cert = c.insecure ? NULL : secret;
    mo.clients_dir = c.insecure ? NULL : c.clients;
    mo.sync = c.sync;
    mo.suspect_ms = (uint32_t)c.suspect_ms;
    mo.down_ms = (uint32_t)c.down_ms;
    char why[512] = "";
    kvedge_master_t *m;
    int rc = kvedge_master_start(&mo, &m, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("master: %s", why);
        return rc == KVEDGE_EDENIED                          ? KVEDGE_EXIT_USAGE
               : rc == KVEDGE_EBUSY || rc == KVEDGE_EVERSION ? KVEDGE_EXIT_UNAVAILABLE
                                                             : KVEDGE_EXIT_FAILURE;
    }
    if (!c.insecure)
        kvedge_log_info("master public key %s (certificate %s); peers allowed: the "
                        "certificates in %s",
                        kvedge_master_public_key(m), c.cert, c.clients);
    printf("listening %s %s\n", kvedge_master_endpoint(m), kvedge_master_pub_endpoint(m));
    fflush(stdout);
    kvedge_cli_wait_signal();
    kvedge_log_info("signal received: stopping");
    kvedge_master_destroy(&m);
    return KVEDGE_EXIT_OK;
}

/* ---------------------------------------------------------------- master-dump */

typedef struct {
    bool json;
    size_t n;
} s_dump_t;

static void s_hex(FILE *f, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", p[i]);
}

/* One record, decoded by its key's space: text (k=v pairs) or a JSON object. */
static void s_print_value(bool json, const char *key, const uint8_t *body, size_t len)
{
    kvedge_master_key_t k;
    int rc = kvedge_master_key_parse(key, strlen(key), &k) == KVEDGE_OK ? KVEDGE_OK : KVEDGE_EINVAL;
    const char *q = json ? "\"" : "";
    const char *sep = json ? ", " : " ";
    const char *eq = json ? "\": " : "=";
#define S_F(name) printf("%s%s%s", q, name, eq)
    if (rc == KVEDGE_OK)
        switch (k.space) {
        case KVEDGE_MASTER_SPACE_NODE: {
            kvedge_master_node_t r;
            if ((rc = kvedge_master_node_parse(body, len, &r)) != KVEDGE_OK)
                break;
            S_F("role");
            printf("%s%s%s%s", q, r.role == KVEDGE_ROLE_CLOUD ? "cloud" : "edge", q, sep);
            S_F("region");
            json ? kvedge_cli_json_str(stdout, r.region) : (void)printf("%s", r.region);
            printf("%s", sep);
            S_F("endpoint");
            json ? kvedge_cli_json_str(stdout, r.endpoint) : (void)printf("%s", r.endpoint);
            printf("%s", sep);
            S_F("public_key");
            json ? kvedge_cli_json_str(stdout, r.public_key) : (void)printf("%s", r.public_key);
            printf("%s", sep);
            S_F("capacity_bytes");
            printf("%llu%s", (unsigned long long)r.capacity_bytes, sep);
            S_F("bandwidth_bytes_per_s");
            printf("%llu%s", (unsigned long long)r.bandwidth_bytes_per_s, sep);
            S_F("rtt_us");
            printf("%u", r.rtt_us);
            break;
        }
        case KVEDGE_MASTER_SPACE_HEALTH: {
            kvedge_master_health_t r;
            if ((rc = kvedge_master_health_parse(body, len, &r)) != KVEDGE_OK)
                break;
            S_F("state");
            printf("%s%s%s%s", q, kvedge_master_health_name(r.state), q, sep);
            S_F("last_seen_ms");
            printf("%llu%s", (unsigned long long)r.last_seen_ms, sep);
            S_F("changed_ms");
            printf("%llu", (unsigned long long)r.changed_ms);
            break;
        }
        case KVEDGE_MASTER_SPACE_MODEL: {
            kvedge_model_t r;
            if ((rc = kvedge_master_model_parse(body, len, &r)) != KVEDGE_OK)
                break;
            S_F("layers");
            printf("%u%s", r.layers, sep);
            S_F("kv_heads");
            printf("%u%s", r.kv_heads, sep);
            S_F("head_dim");
            printf("%u%s", r.head_dim, sep);
            S_F("dtype");
            printf("%s%s%s", q, kvedge_dtype_name(r.dtype), q);
            break;
        }
        case KVEDGE_MASTER_SPACE_MAP: {
            kvedge_master_map_t *r = malloc(sizeof *r);
            if (!r || (rc = kvedge_master_map_parse(body, len, r)) != KVEDGE_OK) {
                rc = r ? rc : KVEDGE_ENOMEM;
                free(r);
                break;
            }
            S_F("cloud_layers");
            printf("%u%s", r->cloud_layers, sep);
            S_F("from");
            printf("%s", json ? "[" : "");
            for (uint32_t i = 0; i < r->edge_layers; i++) {
                const char *comma = i ? "," : "";
                if (r->from[i] == KVEDGE_MASTER_MAP_NONE)
                    printf("%s%s", comma, json ? "null" : "-");
                else
                    printf("%s%u", comma, r->from[i]);
            }
            printf("%s", json ? "]" : "");
            free(r);
            break;
        }
        case KVEDGE_MASTER_SPACE_DIR: {
            kvedge_master_dir_t r;
            if ((rc = kvedge_master_dir_parse(body, len, &r)) != KVEDGE_OK)
                break;
            S_F("model");
            json ? kvedge_cli_json_str(stdout, r.model_id) : (void)printf("%s", r.model_id);
            printf("%s", sep);
            S_F("layers");
            printf("%u%s", r.layers, sep);
            S_F("held");
            printf("%s", json ? "[" : "");
            bool first = true;
            for (unsigned l = 0; l < r.layers; l++)
                if (kvedge_master_dir_has(&r, l)) {
                    printf("%s%u", first ? "" : ",", l);
                    first = false;
                }
            printf("%s", json ? "]" : "");
            break;
        }
        case KVEDGE_MASTER_SPACE_LINK: {
            kvedge_master_link_t r;
            if ((rc = kvedge_master_link_parse(body, len, &r)) != KVEDGE_OK)
                break;
            S_F("rtt_us");
            printf("%u%s", r.rtt_us, sep);
            S_F("bw_bytes_per_s");
            printf("%llu%s", (unsigned long long)r.bw_bytes_per_s, sep);
            S_F("samples");
            printf("%u%s", r.samples, sep);
            S_F("declared");
            printf("%s%s", r.declared ? "true" : "false", sep);
            S_F("updated_ms");
            printf("%llu", (unsigned long long)r.updated_ms);
            break;
        }
        }
    if (rc != KVEDGE_OK) {
        S_F("undecoded");
        printf("%s", q);
        s_hex(stdout, body, len < 64 ? len : 64);
        printf("%s%s", len > 64 ? "..." : "", q);
    }
#undef S_F
}

static int s_dump_cb(void *ctx, const char *key, uint64_t seq, const uint8_t *body, size_t len)
{
    s_dump_t *d = ctx;
    if (d->json) {
        printf("%s\n    {\"key\": ", d->n ? "," : "");
        kvedge_cli_json_str(stdout, key);
        printf(", \"seq\": %llu, \"bytes\": %zu, \"value\": {", (unsigned long long)seq, len);
        s_print_value(true, key, body, len);
        printf("}}");
    } else {
        printf("%s seq=%llu ", key, (unsigned long long)seq);
        s_print_value(false, key, body, len);
        printf("\n");
    }
    d->n++;
    return 0;
}

/* The PUB endpoint next to a ROUTER endpoint tcp://HOST:PORT: tcp://HOST:PORT+1. */
static int s_default_pub(const char *master, char *out, size_t cap)
{
    const char *colon = strrchr(master, ':');
    if (strncmp(master, "tcp://", 6) != 0 || !colon)
        return -1;
    uint64_t port;
    if (kvedge_cli_parse_u64(colon + 1, 1, 65534, &port) != 0)
        return -1;
    snprintf(out, cap, "%.*s:%llu", (int)(colon - master), master, (unsigned long long)port + 1);
    return 0;
}

static int s_cmd_dump(kvedge_cli_t *cli, int argc, char **argv)
{
    enum { S_O_JSON = 1000, S_O_KEY, S_O_CERT, S_O_DEADLINE };
    static const struct option opts[] = {{"master", required_argument, NULL, 'm'},
                                         {"pub", required_argument, NULL, 'p'},
                                         {"prefix", required_argument, NULL, 'P'},
                                         {"json", no_argument, NULL, S_O_JSON},
                                         {"server-key", required_argument, NULL, S_O_KEY},
                                         {"cert", required_argument, NULL, S_O_CERT},
                                         {"deadline", required_argument, NULL, S_O_DEADLINE},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {"master-dump", NULL,
                                  "[--master EP] [--pub EP] [--prefix P] [--json]",
                                  "Snapshot the master's registry and print it."};
    const char *master = KVEDGE_MASTER_BIND_DEFAULT, *pub = NULL, *prefix = NULL;
    const char *key = cli->server_key, *cert = cli->cert;
    bool json = cli->json;
    uint64_t deadline = cli->deadline_ms > 0 ? (uint64_t)cli->deadline_ms : S_DUMP_DEADLINE_MS;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "m:p:P:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm':
            master = optarg;
            break;
        case 'p':
            pub = optarg;
            break;
        case 'P':
            prefix = optarg;
            break;
        case S_O_JSON:
            json = true;
            break;
        case S_O_KEY:
            key = optarg;
            break;
        case S_O_CERT:
            cert = optarg;
            break;
        case S_O_DEADLINE:
            if (kvedge_cli_parse_u64(optarg, 1, 600000, &deadline) != 0) {
                kvedge_cli_error("master-dump: --deadline wants milliseconds, got '%s'", optarg);
                return KVEDGE_EXIT_USAGE;
            }
            break;
        case 'h':
            kvedge_cli_usage(
                stdout, &cmd,
                "Takes a snapshot of the master's registry (or of the keys under --prefix)\n"
                "through a replica view and prints one record per line, decoded (`KEY seq=N\n"
                "field=value ...`), or a JSON document with --json. Exit 5 when the master\n"
                "does not answer within the deadline.\n\n"
                "  -m, --master EP      the master's ROUTER (default " KVEDGE_MASTER_BIND_DEFAULT
                ")\n"
                "  -p, --pub EP         its PUB (default: for tcp://HOST:PORT, PORT+1)\n"
                "  -P, --prefix P       only keys starting with P (node/, health/, model/, map/,\n"
                "                       dir/, link/ or longer)\n"
                "      --json           JSON output\n"
                "      --server-key KEY the master's public key or certificate (none: plaintext,\n"
                "                       loopback only)\n"
                "      --cert FILE      this client's secret certificate (with --server-key)\n"
                "      --deadline MS    how long to wait for the snapshot (default 3000)\n");
            return KVEDGE_EXIT_OK;
        default:
            kvedge_cli_error("master-dump: unknown option or missing value '%s'", argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("master-dump: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    char pub_buf[300];
    if (!pub) {
        if (s_default_pub(master, pub_buf, sizeof pub_buf) != 0) {
            kvedge_cli_error("master-dump: give --pub for %s", master);
            return KVEDGE_EXIT_USAGE;
        }
        pub = pub_buf;
    }
    if (key && !cert) {
        kvedge_cli_error("master-dump: --server-key needs --cert (this client's secret "
                         "certificate)");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = master;
    vo.pub = pub;
    vo.server_key = key;
    vo.client_cert = key ? cert : NULL;
    vo.prefix = prefix;
    vo.start_wait_ms = (int)deadline;
    kvedge_mview_t *v;
    int rc = kvedge_mview_start(&vo, &v);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("master-dump: %s%s", kvedge_strerror(rc),
                         rc == KVEDGE_EDENIED ? " (plaintext is for loopback and ipc only: give "
                                                "--server-key and --cert)"
                                              : "");
        return rc == KVEDGE_EINVAL || rc == KVEDGE_EDENIED ? KVEDGE_EXIT_USAGE
                                                           : KVEDGE_EXIT_FAILURE;
    }
    if (kvedge_mview_state(v) != KVEDGE_MVIEW_SYNCED) {
        kvedge_cli_error("master-dump: no snapshot from %s within %llu ms (master down, wrong "
                         "endpoint, or key not allowed)",
                         master, (unsigned long long)deadline);
        kvedge_mview_destroy(&v);
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    s_dump_t d = {json, 0};
    if (json)
        printf("{\"seq\": %llu, \"records\": [", (unsigned long long)kvedge_mview_seq(v));
    rc = kvedge_mview_foreach(v, prefix, s_dump_cb, &d);
    if (json)
        printf("%s]}\n", d.n ? "\n  " : "");
    else
        printf("# %zu records at seq %llu\n", d.n, (unsigned long long)kvedge_mview_seq(v));
    kvedge_mview_destroy(&v);
    return rc == KVEDGE_OK ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
}

const kvedge_cli_cmd_t kvedge_cli_master_cmds[] = {
    {"master", s_cmd_master, "[--bind EP] [--pub EP] [--data DIR] [--insecure] [...]",
     "Run the Storage Master (registry of nodes, models, maps, blocks, links)."},
    {"master-dump", s_cmd_dump, "[--master EP] [--pub EP] [--prefix P] [--json]",
     "Snapshot the master's registry and print it."},
    {NULL, NULL, NULL, NULL},
};
