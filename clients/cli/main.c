/* kvedge: one program for the admin CLI (and, as modules land, the daemons). This file only
 * parses global options and dispatches to a command. */
#include <stdlib.h>
#include <string.h>

#include "access/codec/basis.h"
#include "access/codec/error.h"
#include "clients/cli/cli.h"
#include "clients/cli/cli_doc.h"
#include "gpu/gpu.h"

#define KVEDGE_VERSION_STRING "0.1.0"

static const kvedge_cli_cmd_t *s_find_remote(const char *name)
{
    for (int t = 0; kvedge_cli_remote_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = kvedge_cli_remote_tables[t]; c->name; c++)
            if (strcmp(c->name, name) == 0)
                return c;
    return NULL;
}

/* ---- global options ---- */

/* Commands that define an option named like a global one for their own purpose: after the
 * command's name, that name stays the command's (before it, it is the global option).
 *
 *   command       keeps for itself                       what it means there
 *   store         --data/-d, --cert, --basis             the node's store, its certificate,
 *                                                        its coding bases (a setting)
 *   eval          --basis                                the model's basis file
 *   master        --data/-d, --cert                      the registry's dir, its certificate
 *   master-dump   --json, --server-key, --cert,          the same words for the master's
 *                 --deadline                             snapshot (defaults: the globals)
 *   proxy         --cert                                 the proxy's certificate
 *   sync          --deadline                             a --once pass's per-call deadline
 *
 * Every other command (the admin commands local and remote, keygen, plan, fetch, prefill,
 * decode, model-synth) takes all global options after its name. --version is not taken
 * there. */
static const struct {
    const char *cmd;
    const char *keeps; /* the long names, each followed by a space */
} s_keeps[] = {
    {"store", "data cert basis "},
    {"master", "data cert "},
    {"master-dump", "json server-key cert deadline "},
    {"proxy", "cert "},
    {"sync", "deadline "},
    {"eval", "basis "},
};

static bool s_kept(const char *cmd, const char *name)
{
    char word[32];
    snprintf(word, sizeof word, "%s ", name);
    for (size_t i = 0; i < sizeof s_keeps / sizeof s_keeps[0]; i++)
        if (strcmp(s_keeps[i].cmd, cmd) == 0)
            return strstr(s_keeps[i].keeps, word) != NULL;
    return strcmp(name, "version") == 0;
}

/* The global option arg names by its exact spelling ("--data", "--data=DIR", "-d", "-dDIR"),
 * and whether its value is attached; NULL when it names none. Abbreviations are not taken. */
static const kvedge_cmdopt_t *s_match_global(const char *arg, bool *attached)
{
    *attached = false;
    if (arg[0] != '-' || arg[1] == '\0')
        return NULL;
    for (size_t g = 0; g < kvedge_cli_globals.count; g++) {
        const kvedge_cmdopt_t *o = &kvedge_cli_globals.opts[g];
        if (arg[1] == '-') {
            const char *name = arg + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) {
                *attached = eq != NULL;
                return o;
            }
        } else if (o->letter && arg[1] == o->letter) {
            *attached = arg[2] != '\0';
            return o;
        }
    }
    return NULL;
}

/* The global options' words, as one line for the table's parser ("kvedge" first). */
typedef struct {
    char *argv[256];
    int argc;
    bool data, host; /* the line (not the environment) gave --data, -H */
} s_line_t;

static int s_line_add(s_line_t *l, char *arg, const kvedge_cmdopt_t *o)
{
    if (l->argc >= (int)(sizeof l->argv / sizeof l->argv[0]) - 1) {
        kvedge_cli_error("too many global options");
        return KVEDGE_EXIT_USAGE;
    }
    l->argv[l->argc++] = arg;
    l->data = l->data || (o && strcmp(o->name, "data") == 0);
    l->host = l->host || (o && strcmp(o->name, "host") == 0);
    return -1;
}

/* Takes the global options out of argv[first..argc) (the arguments after the command's name)
 * into l, up to a "--" (left in place for the command), except those the command keeps for
 * itself. argv is compacted in place and stays NULL-terminated; *argc is updated. Returns -1
 * to go on, else an exit code. The command's option table is not known here: a value of its
 * own that is spelled like a global option goes attached (--model=--json). */
static int s_globals_after(s_line_t *l, const char *cmd, int *argc, char **argv, int first)
{
    int in = first, out = first, ex = -1;
    while (in < *argc && ex < 0) {
        bool attached;
        const kvedge_cmdopt_t *o = s_match_global(argv[in], &attached);
        if (strcmp(argv[in], "--") == 0) {
            while (in < *argc)
                argv[out++] = argv[in++];
            break;
        }
        if (!o || s_kept(cmd, o->name)) {
            argv[out++] = argv[in++];
            continue;
        }
        bool value = o->type != KVEDGE_CMDOPT_BOOL;
        if (!value && attached) {
            kvedge_cli_error("%s: option '--%s' takes no value", cmd, o->name);
            return KVEDGE_EXIT_USAGE;
        }
        if (value && !attached && in + 1 >= *argc) {
            kvedge_cli_error("%s: option '%s' needs a value (see kvedge --help)", cmd, argv[in]);
            return KVEDGE_EXIT_USAGE;
        }
        ex = s_line_add(l, argv[in++], o);
        if (ex < 0 && value && !attached)
            ex = s_line_add(l, argv[in++], NULL);
    }
    argv[out] = NULL;
    *argc = out;
    return ex;
}

/* The global options before the command into l; returns the index of the command's name
 * (argc when none) and sets *dashdash when a "--" came before it. */
static int s_globals_before(s_line_t *l, int argc, char **argv, bool *dashdash)
{
    int i = 1;
    *dashdash = false;
    while (i < argc && argv[i][0] == '-' && argv[i][1] != '\0') {
        if (strcmp(argv[i], "--") == 0) {
            *dashdash = true;
            return i + 1;
        }
        bool attached;
        const kvedge_cmdopt_t *o = s_match_global(argv[i], &attached);
        if (s_line_add(l, argv[i++], o) >= 0)
            return argc;
        if (o && o->type != KVEDGE_CMDOPT_BOOL && !attached && i < argc &&
            s_line_add(l, argv[i++], NULL) >= 0)
            return argc;
    }
    return i;
}

/* ---- commands ---- */

static const kvedge_cli_cmd_t *s_find(const char *name)
{
    for (int t = 0; kvedge_cli_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = kvedge_cli_tables[t]; c->name; c++)
            if (strcmp(c->name, name) == 0)
                return c;
    return NULL;
}

/* The command a mistyped name most likely meant, or NULL. */
static const char *s_nearest(const char *name)
{
    const char *names[128];
    size_t n = 0;
    for (int t = 0; kvedge_cli_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = kvedge_cli_tables[t]; c->name && n < 127; c++)
            names[n++] = c->name;
    for (int t = 0; kvedge_cli_remote_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = kvedge_cli_remote_tables[t]; c->name && n < 127; c++)
            names[n++] = c->name;
    names[n++] = "help";
    return kvedge_settings_nearest(name, names, n);
}

static void s_help(FILE *f)
{
    fprintf(f, "kvedge " KVEDGE_VERSION_STRING
               ": distributed KV-cache store for cloud-edge LLM inference\n\n"
               "usage: kvedge [GLOBAL OPTIONS] COMMAND [ARGS] [GLOBAL OPTIONS]\n\n"
               "global options, before or after the command (after it: up to a `--`, and not\n"
               "the names that store, master, master-dump, proxy and sync define for "
               "themselves):\n");
    kvedge_cmdopts_options_help(&kvedge_cli_globals, f);
    fprintf(f, "  -h, --help                this help; `kvedge COMMAND --help` for a command\n"
               "  `kvedge help --man`: the manual page; `kvedge help --completion bash`: bash "
               "completion\n"
               "  After the command give them in full (--opt VALUE, --opt=VALUE, -d DIR, -H EP);\n"
               "  -h and --help there are the command's.\n\n"
               "commands:\n");
    for (int t = 0; kvedge_cli_tables[t]; t++)
        for (const kvedge_cli_cmd_t *c = kvedge_cli_tables[t]; c->name; c++)
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

/* `kvedge help --man` (the manual page, roff) and `kvedge help --completion bash`: written from
 * the tables this program parses with, so they cannot go stale; the build installs both. */
static int s_help_doc(int argc, char **argv)
{
    const kvedge_cli_doc_t d = {kvedge_cli_tables, kvedge_cli_remote_tables, &kvedge_cli_globals,
                                KVEDGE_VERSION_STRING};
    if (strcmp(argv[1], "--man") == 0 && argc == 2) {
        kvedge_cli_doc_man(&d, stdout);
    } else if (strcmp(argv[1], "--completion") == 0 && argc == 3 && strcmp(argv[2], "bash") == 0) {
        kvedge_cli_doc_bash(&d, stdout);
    } else {
        kvedge_cli_error("help: want `kvedge help --man` or `kvedge help --completion bash`");
        return KVEDGE_EXIT_USAGE;
    }
    return fflush(stdout) == 0 && !ferror(stdout) ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
}

/* `kvedge help [COMMAND]`, `kvedge help --man`, `kvedge help --completion bash`. */
static int s_help_cmd(kvedge_cli_t *cli, int argc, char **argv)
{
    if (argc > 1 && strncmp(argv[1], "--", 2) == 0)
        return s_help_doc(argc, argv);
    const kvedge_cli_cmd_t *cmd = argc > 1 ? s_find(argv[1]) : NULL;
    if (!cmd && argc > 1)
        cmd = s_find_remote(argv[1]);
    if (!cmd) {
        s_help(stdout);
        return KVEDGE_EXIT_OK;
    }
    char help[] = "--help";
    char *sub[] = {argv[1], help, NULL};
    return kvedge_cli_dispatch(cli, cmd, 2, sub);
}

/* Which command runs name: the remote form in remote mode, else the local one; a node's
 * command without -H only for its --help. NULL (said why) when none. */
static const kvedge_cli_cmd_t *s_pick(const kvedge_cli_t *cli, const s_line_t *l, const char *name,
                                      int argc, char **argv)
{
    const kvedge_cli_cmd_t *cmd = cli->host ? s_find_remote(name) : NULL;
    /* --data on the command line, the node from the environment, a command with both forms:
     * which one was meant is not clear, and the node's would ignore --data silently. */
    if (cli->host && !l->host && l->data && s_find(name) &&
        (cmd || strcmp(name, "put-synthetic") == 0)) {
        kvedge_cli_error("%s: --data %s is given but KVEDGE_HOST=%s is set, which makes it run "
                         "against that node and ignore --data: unset KVEDGE_HOST to use the "
                         "store in %s, or drop --data (or give -H) to use the node",
                         name, cli->data_dir, cli->host, cli->data_dir);
        return NULL;
    }
    if (!cmd)
        cmd = s_find(name);
    if (!cmd && !cli->host && s_find_remote(name)) {
        /* Help needs no node: `kvedge stat --help` as `kvedge -H EP stat --help`. */
        bool help = false;
        for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
            help = help || strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
        if (help)
            return s_find_remote(name);
        kvedge_cli_error("%s talks to a node: give it -H ENDPOINT", name);
        return NULL;
    }
    if (cmd)
        return cmd;
    const char *near = s_nearest(name);
    if (near)
        kvedge_cli_error("unknown command '%s' (did you mean `kvedge %s`? see kvedge --help)", name,
                         near);
    else
        kvedge_cli_error("unknown command '%s' (see kvedge --help)", name);
    return NULL;
}

/* The global options of l into cli. Returns -1 to go on, else an exit code. */
static int s_resolve_globals(s_line_t *l, kvedge_cli_t *cli, bool *version)
{
    kvedge_cli_globals_t g;
    bool help = false;
    char why[600];
    l->argv[l->argc] = NULL;
    if (kvedge_cmdopts_parse(&kvedge_cli_globals, &g, l->argc, l->argv, &help, why, sizeof why) !=
        0) {
        kvedge_cli_error("%s (see kvedge --help)", why);
        return KVEDGE_EXIT_USAGE;
    }
    if (help) {
        s_help(stdout);
        return KVEDGE_EXIT_OK;
    }
    kvedge_cli_t c = {g.data, g.json,   g.host, g.server_key, g.cert, (int)g.deadline_ms,
                      g.link, g.no_pack};
    *cli = c;
    *version = g.version;
    if (g.basis && g.basis[0]) {
        size_t loaded = 0;
        int rc = kvedge_basis_load_dir(g.basis, &loaded, why, sizeof why);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("--basis %s: %s (%s)", g.basis, why, kvedge_strerror(rc));
            return kvedge_cli_exit_code(rc);
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    static s_line_t l;
    l.argv[l.argc++] = argv[0];
    bool dashdash, version;
    int at = s_globals_before(&l, argc, argv, &dashdash);
    const char *name = at < argc ? argv[at] : NULL;
    int ex = name && !dashdash ? s_globals_after(&l, name, &argc, argv, at + 1) : -1;
    kvedge_cli_t cli;
    if (ex < 0)
        ex = s_resolve_globals(&l, &cli, &version);
    if (ex >= 0)
        return ex;
    if (version) {
        printf("kvedge %s (cuda kernels: %s, devices: %d)\n", KVEDGE_VERSION_STRING,
               kvedge_gpu_built_with_cuda() ? "built" : "not built", kvedge_gpu_device_count());
        return KVEDGE_EXIT_OK;
    }
    if (!name) {
        s_help(stderr);
        return KVEDGE_EXIT_USAGE;
    }
    if (strcmp(name, "help") == 0)
        return s_help_cmd(&cli, argc - at, argv + at);
    const kvedge_cli_cmd_t *cmd = s_pick(&cli, &l, name, argc - at, argv + at);
    return cmd ? kvedge_cli_dispatch(&cli, cmd, argc - at, argv + at) : KVEDGE_EXIT_USAGE;
}
