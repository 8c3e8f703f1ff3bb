/* kvedge: one program for the admin CLI (and, as modules land, the daemons). This file only
 * parses global options and dispatches to a command. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "gpu/gpu.h"

#define KVEDGE_VERSION_STRING "0.1.0"

static const kvedge_cli_cmd_t *const s_tables[] = {kvedge_cli_local_cmds,  kvedge_cli_daemon_cmds,
                                                   kvedge_cli_master_cmds, kvedge_cli_proxy_cmds,
                                                   kvedge_cli_e2e_cmds,    NULL};

static const kvedge_cli_cmd_t *s_find(const char *name)
{
    for (int t = 0; s_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = s_tables[t]; c->name; c++)
            if (strcmp(c->name, name) == 0)
                return c;
    return NULL;
}

static void s_help(FILE *f)
{
    fprintf(
        f, "kvedge " KVEDGE_VERSION_STRING
           ": distributed KV-cache store for cloud-edge LLM inference\n\n"
           "usage: kvedge [--data DIR] [--json] COMMAND [ARGS]\n\n"
           "global options:\n"
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
           "      --link SPEC  emulate a link to the node, e.g. 100mbit,20ms (testing)\n\n"
           "commands:\n");
    for (int t = 0; s_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = s_tables[t]; c->name; c++)
            fprintf(f, "  %-14s %s\n", c->name, c->summary);
    fprintf(f, "  %-14s %s\n  %-14s %s\n", "stat", "Node statistics (with -H).", "ping",
            "Round-trip latency and bandwidth to a node (with -H).");
    fprintf(f,
            "\nexit codes: 0 ok, 1 operation failed, 2 usage error, 3 not found,\n"
            "            4 corrupt blocks found, 5 store unavailable (missing, locked, too new)\n");
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
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+d:H:hV", opts, NULL)) != -1) {
        uint64_t ms;
        switch (c) {
        case 'H':
            cli.host = optarg;
            break;
        case OPT_KEY:
            cli.server_key = optarg;
            break;
        case OPT_CERT:
            cli.cert = optarg;
            break;
        case OPT_LINK:
            cli.link = optarg;
            break;
        case OPT_DEADLINE:
            if (kvedge_cli_parse_u64(optarg, 1, 600000, &ms) != 0) {
                kvedge_cli_error("--deadline wants milliseconds (1 to 600000), got '%s'", optarg);
                return KVEDGE_EXIT_USAGE;
            }
            cli.deadline_ms = (int)ms;
            break;
        case 'd':
            cli.data_dir = optarg;
            break;
        case OPT_JSON:
            cli.json = true;
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
    }
    if (optind >= argc) {
        s_help(stderr);
        return KVEDGE_EXIT_USAGE;
    }
    const char *name = argv[optind];
    if (strcmp(name, "help") == 0) {
        const kvedge_cli_cmd_t *cmd = optind + 1 < argc ? s_find(argv[optind + 1]) : NULL;
        if (cmd) {
            char help[] = "--help";
            char *sub[] = {argv[optind + 1], help, NULL};
            optind = 0;
            return cmd->run(&cli, 2, sub);
        }
        s_help(stdout);
        return KVEDGE_EXIT_OK;
    }
    const kvedge_cli_cmd_t *cmd = NULL;
    if (cli.host) /* remote mode: the remote form of a command when it has one */
        for (const kvedge_cli_cmd_t *r = kvedge_cli_remote_cmds; r->name && !cmd; r++)
            if (strcmp(r->name, name) == 0)
                cmd = r;
    if (!cmd)
        cmd = s_find(name);
    if (!cmd && !cli.host)
        for (const kvedge_cli_cmd_t *r = kvedge_cli_remote_cmds; r->name; r++)
            if (strcmp(r->name, name) == 0) {
                kvedge_cli_error("%s talks to a node: give it -H ENDPOINT", name);
                return KVEDGE_EXIT_USAGE;
            }
    if (cmd) {
        int sub_argc = argc - optind;
        char **sub_argv = argv + optind;
        optind = 0; /* glibc: a full reset, so the command parses its own options */
        return cmd->run(&cli, sub_argc, sub_argv);
    }
    kvedge_cli_error("unknown command '%s' (see kvedge --help)", name);
    return KVEDGE_EXIT_USAGE;
}
