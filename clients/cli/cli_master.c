/* The Storage Master commands of kvedge: `master` (the daemon, store/master/master.c, its
 * settings the table in store/master/settings.c) and `master-dump` (a snapshot of the registry
 * through a replica view, printed). Thin mains. */
#include <czmq.h>
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
    const kvedge_cli_cmd_t cmd = {"master",
                                  NULL,
                                  "[OPTIONS] [--config FILE] [--check-config]",
                                  "Run the Storage Master.",
                                  NULL,
                                  NULL,
                                  t};
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
               : rc == KVEDGE_ELOCKED || rc == KVEDGE_EVERSION || rc == KVEDGE_ENOTFOUND ||
                       rc == KVEDGE_ECLOSED || rc == KVEDGE_ETIMEDOUT /* etcd unreachable */
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

/* How a record prints: text (k=v pairs) or the members of a JSON object. */
typedef struct {
    bool json;
    const char *q, *sep, *eq; /* quote, separator, between name and value */
} s_fmt_t;

#define S_F(name) printf("%s%s%s", q, name, eq)

static int s_value_node(const s_fmt_t *f, const uint8_t *body, size_t len)
{
    const char *q = f->q, *sep = f->sep, *eq = f->eq;
    bool json = f->json;
    int rc = KVEDGE_OK;
    kvedge_master_node_t r;
    if ((rc = kvedge_master_node_parse(body, len, &r)) != KVEDGE_OK)
        return rc;
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
    return rc;
}

static int s_value_health(const s_fmt_t *f, const uint8_t *body, size_t len)
{
    const char *q = f->q, *sep = f->sep, *eq = f->eq;
    int rc = KVEDGE_OK;
    kvedge_master_health_t r;
    if ((rc = kvedge_master_health_parse(body, len, &r)) != KVEDGE_OK)
        return rc;
    S_F("state");
    printf("%s%s%s%s", q, kvedge_master_health_name(r.state), q, sep);
    S_F("last_seen_ms");
    printf("%llu%s", (unsigned long long)r.last_seen_ms, sep);
    S_F("changed_ms");
    printf("%llu", (unsigned long long)r.changed_ms);
    return rc;
}

static int s_value_tmodel(const s_fmt_t *f, const uint8_t *body, size_t len)
{
    const char *q = f->q, *sep = f->sep, *eq = f->eq;
    int rc = KVEDGE_OK;
    kvedge_model_t r;
    if ((rc = kvedge_master_model_parse(body, len, &r)) != KVEDGE_OK)
        return rc;
    S_F("layers");
    printf("%u%s", r.layers, sep);
    S_F("kv_heads");
    printf("%u%s", r.kv_heads, sep);
    S_F("head_dim");
    printf("%u%s", r.head_dim, sep);
    S_F("dtype");
    printf("%s%s%s", q, kvedge_dtype_name(r.dtype), q);
    return rc;
}

/* A layer map's fields, as map and adapter records hold them: the layer counts and, per edge
 * layer, its cloud layer or - (null): computed on the edge. */
static void s_layers_from(const s_fmt_t *f, uint32_t cloud_layers, uint32_t edge_layers,
                          const uint16_t *from)
{
    const char *q = f->q, *sep = f->sep, *eq = f->eq;
    bool json = f->json;
    S_F("cloud_layers");
    printf("%u%s", cloud_layers, sep);
    S_F("edge_layers");
    printf("%u%s", edge_layers, sep);
    S_F("from");
    printf("%s", json ? "[" : "");
    for (uint32_t i = 0; i < edge_layers; i++) {
        const char *comma = i ? "," : "";
        if (from[i] == KVEDGE_MASTER_MAP_NONE)
            printf("%s%s", comma, json ? "null" : "-");
        else
            printf("%s%u", comma, from[i]);
    }
    printf("%s", json ? "]" : "");
}

static int s_value_map(const s_fmt_t *f, const uint8_t *body, size_t len)
{
    int rc = KVEDGE_OK;
    kvedge_master_map_t *r = malloc(sizeof *r);
    if (!r || (rc = kvedge_master_map_parse(body, len, r)) != KVEDGE_OK) {
        rc = r ? rc : KVEDGE_ENOMEM;
        free(r);
        return rc;
    }
    s_layers_from(f, r->cloud_layers, r->edge_layers, r->from);
    free(r);
    return rc;
}

static int s_value_adapter(const s_fmt_t *f, const uint8_t *body, size_t len)
{
    const char *q = f->q, *sep = f->sep, *eq = f->eq;
    bool json = f->json;
    int rc = KVEDGE_OK;
    kvedge_master_adapter_t *r = malloc(sizeof *r);
    if (!r || (rc = kvedge_master_adapter_parse(body, len, r)) != KVEDGE_OK) {
        rc = r ? rc : KVEDGE_ENOMEM;
        free(r);
        return rc;
    }
    S_F("fit");
    printf("%s%s%s%s", q, kvedge_master_fit_name(r->fit), q, sep);
    S_F("size");
    printf("%llu%s", (unsigned long long)r->size, sep);
    S_F("digest");
    printf("%s", q);
    s_hex(stdout, r->digest, sizeof r->digest);
    printf("%s%s", q, sep);
    s_layers_from(f, r->cloud_layers, r->edge_layers, r->from);
    printf("%s", sep);
    S_F("cloud_rope");
    json ? kvedge_cli_json_str(stdout, r->cloud_rope) : (void)printf("%s", r->cloud_rope);
    printf("%s", sep);
    S_F("edge_rope");
    json ? kvedge_cli_json_str(stdout, r->edge_rope) : (void)printf("%s", r->edge_rope);
    free(r);
    return rc;
}

static int s_value_dir(const s_fmt_t *f, const uint8_t *body, size_t len)
{
    const char *q = f->q, *sep = f->sep, *eq = f->eq;
    bool json = f->json;
    int rc = KVEDGE_OK;
    kvedge_master_dir_t r;
    if ((rc = kvedge_master_dir_parse(body, len, &r)) != KVEDGE_OK)
        return rc;
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
    return rc;
}

static int s_value_link(const s_fmt_t *f, const uint8_t *body, size_t len)
{
    const char *q = f->q, *sep = f->sep, *eq = f->eq;
    int rc = KVEDGE_OK;
    kvedge_master_link_t r;
    if ((rc = kvedge_master_link_parse(body, len, &r)) != KVEDGE_OK)
        return rc;
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
    return rc;
}

/* Prints the fields of one record of space; returns what its parser said. */
static int s_value_fields(const s_fmt_t *f, int space, const uint8_t *body, size_t len)
{
    switch (space) {
    case KVEDGE_MASTER_SPACE_NODE:
        return s_value_node(f, body, len);
    case KVEDGE_MASTER_SPACE_HEALTH:
        return s_value_health(f, body, len);
    case KVEDGE_MASTER_SPACE_MODEL:
    case KVEDGE_MASTER_SPACE_TMODEL:
        return s_value_tmodel(f, body, len);
    case KVEDGE_MASTER_SPACE_MAP:
        return s_value_map(f, body, len);
    case KVEDGE_MASTER_SPACE_DIR:
        return s_value_dir(f, body, len);
    case KVEDGE_MASTER_SPACE_ADAPTER:
        return s_value_adapter(f, body, len);
    case KVEDGE_MASTER_SPACE_LINK:
        return s_value_link(f, body, len);
    }
    return KVEDGE_EINVAL;
}

/* One record, decoded by its key's space: text (k=v pairs) or a JSON object. */
static void s_print_value(bool json, const char *key, const uint8_t *body, size_t len)
{
    kvedge_master_key_t k;
    const s_fmt_t f = {json, json ? "\"" : "", json ? ", " : " ", json ? "\": " : "="};
    const char *q = f.q, *eq = f.eq;
    int rc = kvedge_master_key_parse(key, strlen(key), &k) == KVEDGE_OK
                 ? s_value_fields(&f, (int)k.space, body, len)
                 : KVEDGE_EINVAL;
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

/* What master-dump runs on; key, cert, json and deadline default to the global options. */
typedef struct {
    const char *master, *pub, *prefix;
    bool json;
    const char *server_key, *cert;
    uint32_t deadline_ms; /* 0: the global --deadline, else S_DUMP_DEADLINE_MS */
} s_dump_opts_t;

static const kvedge_cmdopt_t s_dump_list[] = {
    {.name = "master",
     .letter = 'm',
     .arg = "EPS",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_dump_opts_t, master),
     .def = KVEDGE_MASTER_BIND_DEFAULT,
     .help = "the master's ROUTER, or a list EP[,EP...] of the masters of one cluster (the "
             "leader answers)"},
    {.name = "pub",
     .letter = 'p',
     .arg = "EPS",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_dump_opts_t, pub),
     .help = "its PUB, one per master (default: for tcp://HOST:PORT, PORT+1)"},
    {.name = "prefix",
     .letter = 'P',
     .arg = "P",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_dump_opts_t, prefix),
     .help = "only keys starting with P (node/, health/, model/, map/, dir/, link/ or longer)"},
    {.name = "json",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_dump_opts_t, json),
     .help = "JSON output"},
    {.name = "server-key",
     .arg = "KEY",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_dump_opts_t, server_key),
     .help = "the master's public key or certificate (default the global --server-key; none: "
             "plaintext, loopback only)"},
    {.name = "cert",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_dump_opts_t, cert),
     .help = "this client's secret certificate (with --server-key; default the global --cert)"},
    {.name = "deadline",
     .arg = "MS",
     .type = KVEDGE_CMDOPT_MS,
     KVEDGE_CMDOPT_AT(s_dump_opts_t, deadline_ms),
     .min = 1,
     .max = 600000,
     .def_num = 0,
     .def_text = "the global --deadline, else 3000",
     .help = "how long to wait for the snapshot"},
};

static const kvedge_cmdopts_t s_dump_opts = {
    .command = "master-dump",
    .summary = "Snapshot the master's registry and print it.",
    .about = "Takes a snapshot of the master's registry (or of the keys under --prefix)\n"
             "through a replica view and prints one record per line, decoded (`KEY seq=N\n"
             "field=value ...`), or a JSON document with --json. Exit 5 when the master\n"
             "does not answer within the deadline.\n",
    KVEDGE_CMDOPTS_OF(s_dump_opts_t, s_dump_list)};

/* Prints every record of the synced view v under prefix. Returns an exit code. */
static int s_dump_print(kvedge_mview_t *v, const char *prefix, bool json)
{
    s_dump_t d = {json, 0};
    if (json)
        printf("{\"seq\": %llu, \"records\": [", (unsigned long long)kvedge_mview_seq(v));
    int rc = kvedge_mview_foreach(v, prefix, s_dump_cb, &d);
    if (json)
        printf("%s]}\n", d.n ? "\n  " : "");
    else
        printf("# %zu records at seq %llu\n", d.n, (unsigned long long)kvedge_mview_seq(v));
    return rc == KVEDGE_OK ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
}

static int s_dump(kvedge_cli_t *cli, const void *opts)
{
    const s_dump_opts_t *o = opts;
    const char *master = o->master, *pub = o->pub, *prefix = o->prefix;
    const char *key = o->server_key ? o->server_key : cli->server_key;
    const char *cert = o->cert ? o->cert : cli->cert;
    bool json = o->json || cli->json;
    uint64_t deadline = o->deadline_ms         ? o->deadline_ms
                        : cli->deadline_ms > 0 ? (uint64_t)cli->deadline_ms
                                               : S_DUMP_DEADLINE_MS;
    char pub_buf[1024];
    pub = kvedge_cli_master_pubs("master-dump", "master", master, "pub", pub, pub_buf,
                                 sizeof pub_buf);
    if (!pub)
        return KVEDGE_EXIT_USAGE;
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
    int ex = s_dump_print(v, prefix, json);
    kvedge_mview_destroy(&v);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_master_cmds[] = {
    {"master", s_cmd_master, "[--bind EP] [--pub EP] [--data DIR] [--config FILE] [...]",
     "Run the Storage Master (registry of nodes, models, maps, blocks, links).", NULL, NULL,
     &kvedge_master_settings_table},
    {.name = "master-dump", .opts = &s_dump_opts, .exec = s_dump},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
