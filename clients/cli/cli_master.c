/* The Storage Master commands of kvedge: `master` (the daemon, store/master/master.c, its
 * settings the table in store/master/settings.c) and `master-dump` (a snapshot of the registry
 * through a replica view, printed). Thin mains. */
#include <czmq.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/log.h"
#include "store/master/master.h"
#include "store/master/settings.h"
#include "runtime/mview.h"
#include "access/transport.h"
#include "clients/cli/cli.h"
#include "access/codec/error.h"

#define S_DUMP_DEADLINE_MS 3000

static const char s_master_about[] =
    "Runs the Storage Master (docs/master.md): the registry of nodes, health, models, layer\n"
    "maps, block directories and links, persisted in --data, served on a ROUTER (snapshots,\n"
    "updates, heartbeats) and a PUB (sequenced updates, HUGZ every second). Prints\n"
    "\"listening ROUTER_EP PUB_EP\" once it serves; stops cleanly on SIGINT or SIGTERM.\n"
    "Example config: etc/kvedge-master.conf.\n";

/* The daemon's own check, in the form kvedge_cli_daemon_settings takes. */
static int s_check(const void *settings, char *why, size_t why_len)
{
    return kvedge_master_settings_check(settings, why, why_len);
}

/* `kvedge master`: settings from the table (defaults, --config FILE, flags), the master, a
 * signal, a clean stop. */
static int s_cmd_master(kvedge_cli_t *cli, int argc, char **argv)
{
    const kvedge_settings_table_t *t = &kvedge_master_settings_table;
    const kvedge_cli_cmd_t cmd = {"master", NULL, "[OPTIONS] [--config FILE] [--check-config]",
                                  "Run the Storage Master."};
    static kvedge_master_settings_t s;
    int ex = kvedge_cli_daemon_settings(cli, &cmd, s_master_about, t, &s, s_check, argc, argv);
    if (ex >= 0)
        return ex;
    kvedge_log_set_name("master");
    char why[1024] = "";
    kvedge_master_t *m;
    int rc = kvedge_master_settings_start(&s, &m, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("master: %s", why);
        return rc == KVEDGE_EDENIED || rc == KVEDGE_EINVAL ? KVEDGE_EXIT_USAGE
               : rc == KVEDGE_ELOCKED || rc == KVEDGE_EVERSION || rc == KVEDGE_ENOTFOUND
                   ? KVEDGE_EXIT_UNAVAILABLE
                   : KVEDGE_EXIT_FAILURE;
    }
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
        case KVEDGE_MASTER_SPACE_MODEL:
        case KVEDGE_MASTER_SPACE_TMODEL: {
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
            S_F("edge_layers");
            printf("%u%s", r->edge_layers, sep);
            S_F("from"); /* per edge layer: its cloud layer, or - (null): computed on the edge */
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
    {"master", s_cmd_master, "[--bind EP] [--pub EP] [--data DIR] [--config FILE] [...]",
     "Run the Storage Master (registry of nodes, models, maps, blocks, links)."},
    {"master-dump", s_cmd_dump, "[--master EP] [--pub EP] [--prefix P] [--json]",
     "Snapshot the master's registry and print it."},
    {NULL, NULL, NULL, NULL},
};
