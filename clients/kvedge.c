/* kvedge: one program for the admin CLI (and, as modules land, the daemons). This file only
 * parses global options and dispatches to a command. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli.h"
#include "gpu/gpu.h"

#define KVEDGE_VERSION_STRING "0.1.0"

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
           "  -V, --version    version and build features\n\n"
           "commands:\n");
    for (const kvedge_cli_cmd_t *c = kvedge_cli_local_cmds; c->name; c++)
        fprintf(f, "  %-14s %s\n", c->name, c->summary);
    fprintf(f,
            "\nexit codes: 0 ok, 1 operation failed, 2 usage error, 3 not found,\n"
            "            4 corrupt blocks found, 5 store unavailable (missing, locked, too new)\n");
}

int main(int argc, char **argv)
{
    kvedge_cli_t cli = {getenv("KVEDGE_DATA"), false};
    if (!cli.data_dir || !*cli.data_dir)
        cli.data_dir = KVEDGE_DATA_DIR_DEFAULT;
    enum { OPT_JSON = 1000 };
    static const struct option opts[] = {{"data", required_argument, NULL, 'd'},
                                         {"json", no_argument, NULL, OPT_JSON},
                                         {"help", no_argument, NULL, 'h'},
                                         {"version", no_argument, NULL, 'V'},
                                         {NULL, 0, NULL, 0}};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+d:hV", opts, NULL)) != -1) {
        switch (c) {
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
        if (optind + 1 < argc) {
            for (const kvedge_cli_cmd_t *cmd = kvedge_cli_local_cmds; cmd->name; cmd++)
                if (strcmp(cmd->name, argv[optind + 1]) == 0) {
                    char help[] = "--help";
                    char *sub[] = {argv[optind + 1], help, NULL};
                    optind = 0;
                    return cmd->run(&cli, 2, sub);
                }
        }
        s_help(stdout);
        return KVEDGE_EXIT_OK;
    }
    for (const kvedge_cli_cmd_t *cmd = kvedge_cli_local_cmds; cmd->name; cmd++) {
        if (strcmp(cmd->name, name) == 0) {
            int sub_argc = argc - optind;
            char **sub_argv = argv + optind;
            optind = 0; /* glibc: a full reset, so the command parses its own options */
            return cmd->run(&cli, sub_argc, sub_argv);
        }
    }
    kvedge_cli_error("unknown command '%s' (see kvedge --help)", name);
    return KVEDGE_EXIT_USAGE;
}
