/* The daemon commands of kvedge: `store` (a store node), `keygen` (CURVE certificates) and
 * `sync` (the historical cache). Thin mains: the node is store/node/node.c, its settings the
 * table in store/node/settings.c. */
#include <cjson/cJSON.h>
#include <czmq.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/log.h"
#include "runtime/settings.h"
#include "store/node/node.h"
#include "clients/cli/cli.h"
#include "clients/cli/cli_plan.h"
#include "store/node/hsync.h"
#include "access/codec/error.h"

static const char s_store_about[] =
    "Serves the store in --data over ZeroMQ (docs/protocol.md) until SIGINT or SIGTERM, then\n"
    "finishes in-flight work and closes the store. Prints \"listening EP\" once it serves.\n"
    "Example config: etc/kvedge-store.conf.\n";

/* The daemon's own check, in the form kvedge_cli_daemon_settings takes. */
static int s_check(const void *settings, char *why, size_t why_len)
{
    return kvedge_node_settings_check(settings, why, why_len);
}

/* `kvedge store`: settings from the table (defaults, --config FILE, flags), the node, a
 * signal, a clean stop. */
static int s_cmd_store(kvedge_cli_t *cli, int argc, char **argv)
{
    const kvedge_settings_table_t *t = &kvedge_node_settings_table;
    const kvedge_cli_cmd_t cmd = {
        "store", NULL, "[OPTIONS] [--config FILE] [--check-config]", "Run a store node.", NULL,
        NULL,    t};
    static kvedge_node_settings_t s;
    int ex = kvedge_cli_daemon_settings(cli, &cmd, s_store_about, t, &s, s_check, argc, argv);
    if (ex >= 0)
        return ex;
    /* Its lines carry the name it goes by: its name, else its id in the registry, else its
     * role. */
    kvedge_log_set_name(s.name[0]                     ? s.name
                        : s.node_id[0]                ? s.node_id
                        : s.role == KVEDGE_ROLE_CLOUD ? "cloud"
                                                      : "edge");
    char why[1024] = "";
    kvedge_node_t *node;
    int rc = kvedge_node_start(&s, &node, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("store: %s", why);
        switch (rc) {
        case KVEDGE_EINVAL:
        case KVEDGE_EDENIED:
            return KVEDGE_EXIT_USAGE;
        case KVEDGE_ENOTFOUND:
        case KVEDGE_ELOCKED:
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

typedef struct {
    const char *path;
    const char *tenant;
    bool admin, force;
} s_keygen_opts_t;

static const kvedge_cmdopt_t s_keygen_list[] = {
    {.name = "tenant",
     .letter = 't',
     .arg = "NAME",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_keygen_opts_t, tenant),
     .help = "put the client in a named tenant: every key of the same tenant shares one cache "
             "namespace"},
    {.name = "admin",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_keygen_opts_t, admin),
     .help = "let the key run store-wide operations (evict) once its public certificate is in "
             "a node's allowlist"},
    {.name = "force",
     .letter = 'f',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_keygen_opts_t, force),
     .help = "replace existing files"},
    {.name = "PATH",
     .positional = true,
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_keygen_opts_t, path),
     .required = true,
     .help = "the public certificate; the secret one is PATH_secret"},
};

static const kvedge_cmdopts_t s_keygen_opts = {
    .command = "keygen",
    .summary = "Write a CURVE certificate pair.",
    .about = "Writes a CURVE certificate pair: PATH (public: give it to the node's\n"
             "clients directory, or to clients as the node key) and PATH_secret (mode\n"
             "0600: keep it).\n"
             "--json prints {\"public\": PATH, \"secret\": PATH_secret, \"public_key\": KEY}.\n",
    KVEDGE_CMDOPTS_OF(s_keygen_opts_t, s_keygen_list)};

static void s_keygen_print(const kvedge_cli_t *cli, const char *path, const char *secret,
                           zcert_t *cert)
{
    if (cli->json) {
        printf("{\"public\":");
        kvedge_cli_json_str(stdout, path);
        printf(",\"secret\":");
        kvedge_cli_json_str(stdout, secret);
        printf(",\"public_key\":");
        kvedge_cli_json_str(stdout, zcert_public_txt(cert));
        printf("}\n");
    } else {
        printf("public key %s\nwrote %s and %s\n", zcert_public_txt(cert), path, secret);
    }
}

static int s_keygen(kvedge_cli_t *cli, const void *opts)
{
    const s_keygen_opts_t *o = opts;
    const char *path = o->path, *tenant = o->tenant;
    bool force = o->force, admin = o->admin;
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
        s_keygen_print(cli, path, secret, cert);
    } else {
        kvedge_cli_error("keygen: cannot write %s: %s", path, strerror(errno));
    }
    zcert_destroy(&cert);
    return rc == 0 ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
}

/* One JSON line of the status file as text, in --once's words: name, state, summary. A line
 * that does not parse is shown as it is. */
static void s_sync_status_line(const char *line)
{
    cJSON *o = cJSON_Parse(line);
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "name"));
    const char *state = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "state"));
    const char *sum = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "summary"));
    if (name && state && sum)
        printf("%-20s %-8s %s\n", name, state, sum);
    else
        fputs(line, stdout);
    cJSON_Delete(o);
}

/* `kvedge sync`: the historical cache's progress (what a running edge node last wrote), or
 * one pass in the foreground with --once. */
typedef struct {
    bool once;
    const char *subscriptions; /* NULL: DIR/subscriptions.conf */
    uint32_t deadline_ms;
} s_sync_opts_t;

static const kvedge_cmdopt_t s_sync_list[] = {
    {.name = "once",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_sync_opts_t, once),
     .help = "one pass now into DIR (the node must not be running)"},
    {.name = "subscriptions",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_sync_opts_t, subscriptions),
     .help = "the contexts to copy (default DIR/subscriptions.conf): the store node's "
             "--subscriptions file"},
    {.name = "deadline",
     .arg = "MS",
     .type = KVEDGE_CMDOPT_MS,
     KVEDGE_CMDOPT_AT(s_sync_opts_t, deadline_ms),
     .min = 1,
     .max = 600000,
     .def_num = 10000,
     .help = "per-call deadline of a --once pass"},
};

static const kvedge_cmdopts_t s_sync_opts = {
    .command = "sync",
    .summary = "Historical cache of an edge: progress, or one pass.",
    .about = "The edge's historical cache: contexts copied from a cloud node and pinned,\n"
             "so the edge serves them with the network down. Without --once: the\n"
             "progress a running node last wrote (DIR/" KVEDGE_HSYNC_STATUS_FILE
             "), one line per context;\n"
             "with --json, the file's JSON lines. With --once: one pass now into DIR\n"
             "(the node must not be running). The file (default\n"
             "DIR/subscriptions.conf) has one section per context:\n\n"
             "  subscription\n"
             "      name = support-bot\n"
             "      cloud = tcp://cloud:7400\n"
             "      server_key = /etc/kvedge/cloud.cert   # omit for plaintext loopback\n"
             "      cert = /etc/kvedge/keys/edge_secret\n"
             "      tenant = acme          # local tenant the copy serves\n"
             "      prefix = <64 hex digits: the context's last chunk, as kvedge -H ls "
             "shows>\n"
             "      layers = 6:12          # optional: only layers 6..11 (default all)\n\n"
             "--once prints one line per context: its state (ok, partial, failed) and what\n"
             "the pass did; a pass that fails still says what is held locally (pinned,\n"
             "served). Exit 0 when every context synced; else the code of the first\n"
             "failure: 1 (cloud unreachable, ...), 3 (the cloud lacks a subscribed chunk).\n",
    KVEDGE_CMDOPTS_OF(s_sync_opts_t, s_sync_list)};

/* Without --once: prints the status file a running edge node last wrote. */
static int s_sync_status(const kvedge_cli_t *cli)
{
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
        if (cli->json)
            fputs(line, stdout);
        else
            s_sync_status_line(line);
    fclose(f);
    return KVEDGE_EXIT_OK;
}

static int s_sync(kvedge_cli_t *cli, const void *opts)
{
    const s_sync_opts_t *o = opts;
    char subs_path[KVEDGE_NODE_PATH_BYTES];
    if (o->subscriptions)
        snprintf(subs_path, sizeof subs_path, "%s", o->subscriptions);
    else
        snprintf(subs_path, sizeof subs_path, "%s/subscriptions.conf", cli->data_dir);
    uint64_t deadline = o->deadline_ms;
    if (!o->once)
        return s_sync_status(cli);
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
    int ex = kvedge_cli_open_create(cli, &engine); /* an edge's first pass makes its store */
    if (ex)
        return ex;
    /* Exit code: 0 when every pass synced, else that of the first failure
     * (kvedge_cli_exit_code: 3 when the cloud lacks a subscribed chunk, 1 when it is
     * unreachable, ...), even though what is held stays served: scripts see a stale copy. */
    int worst = KVEDGE_OK;
    for (size_t i = 0; i < n; i++) {
        memset(&st[i], 0, sizeof st[i]);
        rc = kvedge_hsync_run(engine, &subs[i], (int)deadline, &st[i]);
        if (rc != KVEDGE_OK && worst == KVEDGE_OK)
            worst = rc;
        char sum[1024];
        printf("%-20s %-8s %s\n", subs[i].name, kvedge_hsync_state_name(st[i].state),
               kvedge_hsync_summary(&subs[i], &st[i], sum, sizeof sum));
    }
    kvedge_hsync_write_status(cli->data_dir, subs, st, n);
    kvedge_engine_destroy(&engine);
    return kvedge_cli_exit_code(worst);
}

const kvedge_cli_cmd_t kvedge_cli_daemon_cmds[] = {
    {"store", s_cmd_store, "[--role cloud|edge] [--bind EP] [--config FILE] [--check-config]",
     "Run a store node (cloud or edge role) serving the data directory.", NULL, NULL,
     &kvedge_node_settings_table},
    {.name = "keygen", .opts = &s_keygen_opts, .exec = s_keygen},
    {.name = "plan", .opts = &kvedge_cli_plan_opts, .exec = kvedge_cli_plan_exec},
    {.name = "sync", .opts = &s_sync_opts, .exec = s_sync},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
