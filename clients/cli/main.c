/* kvedge: one program for the admin CLI (and, as modules land, the daemons). This file only
 * parses global options and dispatches to a command. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "gpu/gpu.h"

#define KVEDGE_VERSION_STRING "0.1.0"

/* The commands that talk to a node or proxy (-H): found first in remote mode. */
static const kvedge_cli_cmd_t *const s_remote_tables[] = {kvedge_cli_remote_cmds,
                                                          kvedge_cli_top_cmds, NULL};

static const kvedge_cli_cmd_t *s_find_remote(const char *name)
{
    for (int t = 0; s_remote_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = s_remote_tables[t]; c->name; c++)
            if (strcmp(c->name, name) == 0)
                return c;
    return NULL;
}

static const kvedge_cli_cmd_t *const s_tables[] = {
    kvedge_cli_local_cmds,    kvedge_cli_daemon_cmds,
    kvedge_cli_master_cmds,   kvedge_cli_proxy_cmds,
    kvedge_cli_e2e_cmds,      kvedge_cli_eval_cmds,
    kvedge_cli_tokenize_cmds, kvedge_cli_layermap_cmds,
    kvedge_cli_lseval_cmds,   NULL};

/* ---- global options ---- */

/* The global options that may also come after the command's name. */
typedef enum {
    S_G_DATA,
    S_G_JSON,
    S_G_HOST,
    S_G_KEY,
    S_G_CERT,
    S_G_DEADLINE,
    S_G_LINK,
    S_G_COUNT
} s_global_t;

static const struct {
    const char *name; /* long name, without "--" */
    char letter;      /* short name, or 0 */
    bool value;       /* takes a value */
} s_globals[S_G_COUNT] = {
    [S_G_DATA] = {"data", 'd', true}, [S_G_JSON] = {"json", 0, false},
    [S_G_HOST] = {"host", 'H', true}, [S_G_KEY] = {"server-key", 0, true},
    [S_G_CERT] = {"cert", 0, true},   [S_G_DEADLINE] = {"deadline", 0, true},
    [S_G_LINK] = {"link", 0, true},
};

#define S_G(g) (1u << (g))

/* Commands that define an option named like a global one for their own purpose: after the
 * command's name, that name stays the command's (before it, it is the global option).
 *
 *   command       keeps for itself                       what it means there
 *   store         --data/-d, --cert                      the node's store, its certificate
 *   master        --data/-d, --cert                      the registry's dir, its certificate
 *   master-dump   --json, --server-key, --cert,          the same words for the master's
 *                 --deadline                             snapshot (defaults: the globals)
 *   proxy         --cert                                 the proxy's certificate
 *   sync          --deadline                             a --once pass's per-call deadline
 *
 * Every other command (the admin commands local and remote, keygen, plan, fetch, prefill,
 * decode, model-synth) takes all global options after its name. */
static const struct {
    const char *cmd;
    unsigned keeps; /* S_G() bits */
} s_keeps[] = {
    {"store", S_G(S_G_DATA) | S_G(S_G_CERT)},
    {"master", S_G(S_G_DATA) | S_G(S_G_CERT)},
    {"master-dump", S_G(S_G_JSON) | S_G(S_G_KEY) | S_G(S_G_CERT) | S_G(S_G_DEADLINE)},
    {"proxy", S_G(S_G_CERT)},
    {"sync", S_G(S_G_DEADLINE)},
};

static unsigned s_kept(const char *cmd)
{
    for (size_t i = 0; i < sizeof s_keeps / sizeof s_keeps[0]; i++)
        if (strcmp(s_keeps[i].cmd, cmd) == 0)
            return s_keeps[i].keeps;
    return 0;
}

/* Which of --data and -H the command line gave (rather than the environment). */
static bool s_data_given, s_host_given;

/* Sets one global option; returns -1 to go on, else an exit code. */
static int s_set_global(kvedge_cli_t *cli, s_global_t g, const char *v)
{
    uint64_t ms;
    switch (g) {
    case S_G_DATA:
        cli->data_dir = v;
        s_data_given = true;
        break;
    case S_G_JSON:
        cli->json = true;
        break;
    case S_G_HOST:
        cli->host = v;
        s_host_given = true;
        break;
    case S_G_KEY:
        cli->server_key = v;
        break;
    case S_G_CERT:
        cli->cert = v;
        break;
    case S_G_DEADLINE:
        if (kvedge_cli_parse_u64(v, 1, 600000, &ms) != 0) {
            kvedge_cli_error("--deadline wants milliseconds (1 to 600000), got '%s'", v);
            return KVEDGE_EXIT_USAGE;
        }
        cli->deadline_ms = (int)ms;
        break;
    case S_G_LINK:
        cli->link = v;
        break;
    case S_G_COUNT:
        break;
    }
    return -1;
}

/* Which global option arg names, by its exact spelling ("--data", "--data=DIR", "-d",
 * "-dDIR"), and where its attached value starts (NULL when none). Abbreviations are not taken
 * after the command's name: they belong to the command's own parser. */
static int s_match_global(const char *arg, const char **attached)
{
    *attached = NULL;
    if (arg[0] != '-' || arg[1] == '\0')
        return -1;
    if (arg[1] == '-') {
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        for (int g = 0; g < S_G_COUNT; g++)
            if (strlen(s_globals[g].name) == len && strncmp(s_globals[g].name, name, len) == 0) {
                *attached = eq ? eq + 1 : NULL;
                return g;
            }
        return -1;
    }
    for (int g = 0; g < S_G_COUNT; g++)
        if (s_globals[g].letter && arg[1] == s_globals[g].letter) {
            *attached = arg[2] ? arg + 2 : NULL;
            return g;
        }
    return -1;
}

/* Takes the global options out of argv[first..argc) (the arguments after the command's name),
 * up to a "--" (left in place for the command), except those the command keeps for itself.
 * argv is compacted in place and stays NULL-terminated; *argc is updated. Returns -1 to go
 * on, else an exit code. The command's option table is not known here: a value of its own
 * that is spelled like a global option goes attached (--model=--json). */
static int s_globals_after(kvedge_cli_t *cli, const char *cmd, int *argc, char **argv, int first)
{
    unsigned kept = s_kept(cmd);
    int in = first, out = first;
    while (in < *argc) {
        const char *arg = argv[in], *value;
        if (strcmp(arg, "--") == 0) {
            while (in < *argc)
                argv[out++] = argv[in++];
            break;
        }
        int g = s_match_global(arg, &value);
        if (g < 0 || (kept & S_G(g))) {
            argv[out++] = argv[in++];
            continue;
        }
        in++;
        if (!s_globals[g].value && value) {
            kvedge_cli_error("%s: option '--%s' takes no value", cmd, s_globals[g].name);
            return KVEDGE_EXIT_USAGE;
        }
        if (s_globals[g].value && !value) {
            if (in >= *argc) {
                kvedge_cli_error("%s: option '%s' needs a value (see kvedge --help)", cmd, arg);
                return KVEDGE_EXIT_USAGE;
            }
            value = argv[in++];
        }
        int ex = s_set_global(cli, (s_global_t)g, value);
        if (ex >= 0)
            return ex;
    }
    argv[out] = NULL;
    *argc = out;
    return -1;
}

/* ---- commands ---- */

static const kvedge_cli_cmd_t *s_find(const char *name)
{
    for (int t = 0; s_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = s_tables[t]; c->name; c++)
            if (strcmp(c->name, name) == 0)
                return c;
    return NULL;
}

/* The command a mistyped name most likely meant, or NULL. */
static const char *s_nearest(const char *name)
{
    const char *names[128];
    size_t n = 0;
    for (int t = 0; s_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = s_tables[t]; c->name && n < 127; c++)
            names[n++] = c->name;
    for (int t = 0; s_remote_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = s_remote_tables[t]; c->name && n < 127; c++)
            names[n++] = c->name;
    names[n++] = "help";
    return kvedge_settings_nearest(name, names, n);
}

static void s_help(FILE *f)
{
    fprintf(
        f, "kvedge " KVEDGE_VERSION_STRING
           ": distributed KV-cache store for cloud-edge LLM inference\n\n"
           "usage: kvedge [GLOBAL OPTIONS] COMMAND [ARGS] [GLOBAL OPTIONS]\n\n"
           "global options, before or after the command (after it: up to a `--`, and not\n"
           "the names that store, master, master-dump, proxy and sync define for themselves):\n"
           "  -d, --data DIR   store directory (default $KVEDGE_DATA, else " KVEDGE_DATA_DIR_DEFAULT
           ")\n"
           "      --json       machine-readable output\n"
           "  -h, --help       this help; `kvedge COMMAND --help` for a command\n"
           "  -V, --version    version and build features\n"
           "  -H, --host EP    remote mode: the admin commands against the node at EP\n"
           "                   ($KVEDGE_HOST)\n"
           "      --server-key KEY  the node's public key or certificate file\n"
           "                   ($KVEDGE_SERVER_KEY; none = plaintext, loopback only)\n"
           "      --cert FILE  this client's secret certificate ($KVEDGE_CERT)\n"
           "      --deadline MS  per-call deadline in remote mode (default 5000)\n"
           "      --link SPEC  emulate a link to the node, e.g. 100mbit,20ms (testing)\n"
           "  After the command give them in full (--opt VALUE, --opt=VALUE, -d DIR, -H EP);\n"
           "  -h and --help there are the command's.\n\n"
           "commands:\n");
    for (int t = 0; s_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = s_tables[t]; c->name; c++)
            fprintf(f, "  %-14s %s\n", c->name, kvedge_cli_summary(c));
    fprintf(f, "  %-14s %s\n  %-14s %s\n", "stat", "Node statistics (with -H).", "ping",
            "Round-trip latency and bandwidth to a node (with -H).");
    for (const kvedge_cli_cmd_t *c = kvedge_cli_top_cmds; c->name; c++)
        fprintf(f, "  %-14s %s\n", c->name, kvedge_cli_summary(c));
    fprintf(
        f, "\nexit codes: 0 ok, 1 operation failed, 2 usage error, 3 not found,\n"
           "            4 corrupt blocks found, 5 store unavailable (missing, locked, too new),\n"
           "            6 permission denied (the key may not do that: evict needs an admin key)\n");
}

int main(int argc, char **argv)
{
    kvedge_cli_t cli = {getenv("KVEDGE_DATA"),
                        false,
                        getenv("KVEDGE_HOST"),
                        getenv("KVEDGE_SERVER_KEY"),
                        getenv("KVEDGE_CERT"),
                        0,
                        NULL};
    if (!cli.data_dir || !*cli.data_dir)
        cli.data_dir = KVEDGE_DATA_DIR_DEFAULT;
    enum { OPT_JSON = 1000, OPT_KEY, OPT_CERT, OPT_DEADLINE, OPT_LINK };
    static const struct option opts[] = {{"data", required_argument, NULL, 'd'},
                                         {"json", no_argument, NULL, OPT_JSON},
                                         {"host", required_argument, NULL, 'H'},
                                         {"server-key", required_argument, NULL, OPT_KEY},
                                         {"cert", required_argument, NULL, OPT_CERT},
                                         {"deadline", required_argument, NULL, OPT_DEADLINE},
                                         {"link", required_argument, NULL, OPT_LINK},
                                         {"help", no_argument, NULL, 'h'},
                                         {"version", no_argument, NULL, 'V'},
                                         {NULL, 0, NULL, 0}};
    int c;
    const char *last_value = NULL; /* to tell a "--" that ended the options from a value */
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+d:H:hV", opts, NULL)) != -1) {
        s_global_t g = S_G_COUNT;
        last_value = optarg;
        switch (c) {
        case 'H':
            g = S_G_HOST;
            break;
        case OPT_KEY:
            g = S_G_KEY;
            break;
        case OPT_CERT:
            g = S_G_CERT;
            break;
        case OPT_LINK:
            g = S_G_LINK;
            break;
        case OPT_DEADLINE:
            g = S_G_DEADLINE;
            break;
        case 'd':
            g = S_G_DATA;
            break;
        case OPT_JSON:
            g = S_G_JSON;
            break;
        case 'h':
            s_help(stdout);
            return KVEDGE_EXIT_OK;
        case 'V':
            printf("kvedge %s (cuda kernels: %s, devices: %d)\n", KVEDGE_VERSION_STRING,
                   kvedge_gpu_built_with_cuda() ? "built" : "not built", kvedge_gpu_device_count());
            return KVEDGE_EXIT_OK;
        default:
            kvedge_cli_error("unknown or incomplete option '%s' (see kvedge --help)",
                             argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        int ex = s_set_global(&cli, g, optarg);
        if (ex >= 0)
            return ex;
    }
    if (optind >= argc) {
        s_help(stderr);
        return KVEDGE_EXIT_USAGE;
    }
    /* A "--" before the command: nothing after it is a global option. */
    bool dashdash =
        optind > 1 && strcmp(argv[optind - 1], "--") == 0 && argv[optind - 1] != last_value;
    const char *name = argv[optind];
    if (!dashdash) {
        int ex = s_globals_after(&cli, name, &argc, argv, optind + 1);
        if (ex >= 0)
            return ex;
    }
    if (strcmp(name, "help") == 0) {
        const kvedge_cli_cmd_t *cmd = optind + 1 < argc ? s_find(argv[optind + 1]) : NULL;
        if (!cmd && optind + 1 < argc)
            cmd = s_find_remote(argv[optind + 1]);
        if (cmd) {
            char help[] = "--help";
            char *sub[] = {argv[optind + 1], help, NULL};
            optind = 0;
            return kvedge_cli_dispatch(&cli, cmd, 2, sub);
        }
        s_help(stdout);
        return KVEDGE_EXIT_OK;
    }
    const kvedge_cli_cmd_t *cmd = NULL;
    if (cli.host) /* remote mode: the remote form of a command when it has one */
        cmd = s_find_remote(name);
    /* --data on the command line, the node from the environment, a command with both forms:
     * which one was meant is not clear, and the node's would ignore --data silently. */
    if (cli.host && !s_host_given && s_data_given && s_find(name) &&
        (cmd || strcmp(name, "put-synthetic") == 0)) {
        kvedge_cli_error("%s: --data %s is given but KVEDGE_HOST=%s is set, which makes it run "
                         "against that node and ignore --data: unset KVEDGE_HOST to use the "
                         "store in %s, or drop --data (or give -H) to use the node",
                         name, cli.data_dir, cli.host, cli.data_dir);
        return KVEDGE_EXIT_USAGE;
    }
    if (!cmd)
        cmd = s_find(name);
    if (!cmd && !cli.host && s_find_remote(name)) {
        /* Help needs no node: `kvedge stat --help` as `kvedge -H EP stat --help`. */
        bool help = false;
        for (int i = optind + 1; i < argc && strcmp(argv[i], "--") != 0; i++)
            help = help || strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
        if (!help) {
            kvedge_cli_error("%s talks to a node: give it -H ENDPOINT", name);
            return KVEDGE_EXIT_USAGE;
        }
        cmd = s_find_remote(name);
    }
    if (cmd) {
        int sub_argc = argc - optind;
        char **sub_argv = argv + optind;
        optind = 0; /* glibc: a full reset, so the command parses its own options */
        return kvedge_cli_dispatch(&cli, cmd, sub_argc, sub_argv);
    }
    const char *near = s_nearest(name);
    if (near)
        kvedge_cli_error("unknown command '%s' (did you mean `kvedge %s`? see kvedge --help)", name,
                         near);
    else
        kvedge_cli_error("unknown command '%s' (see kvedge --help)", name);
    return KVEDGE_EXIT_USAGE;
}
