/* The kvedge program's command tables and global options: what main.c dispatches to and parses,
 * and what the manual page and the shell completion list (clients/cli/cli_doc.c). */
#include "clients/cli/cli.h"

const kvedge_cli_cmd_t *const kvedge_cli_tables[] = {
    kvedge_cli_local_cmds,    kvedge_cli_daemon_cmds,    kvedge_cli_master_cmds,
    kvedge_cli_proxy_cmds,    kvedge_cli_e2e_cmds,       kvedge_cli_eval_cmds,
    kvedge_cli_tokenize_cmds, kvedge_cli_block_cmds,     kvedge_cli_layermap_cmds,
    kvedge_cli_lseval_cmds,   kvedge_cli_rebalance_cmds, NULL};

const kvedge_cli_cmd_t *const kvedge_cli_remote_tables[] = {
    kvedge_cli_remote_cmds, kvedge_cli_top_cmds,
    kvedge_cli_cluster_cmds, /* -H MASTER[,MASTER...] cluster */
    NULL};

static const kvedge_cmdopt_t s_global_list[] = {
    {.name = "data",
     .letter = 'd',
     .arg = "DIR",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, data),
     .def = KVEDGE_DATA_DIR_DEFAULT,
     .env = "KVEDGE_DATA",
     .help = "store directory"},
    {.name = "json",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, json),
     .help = "machine-readable output"},
    {.name = "version",
     .letter = 'V',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, version),
     .help = "version and build features"},
    {.name = "host",
     .letter = 'H',
     .arg = "EP",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, host),
     .env = "KVEDGE_HOST",
     .help = "remote mode: the admin commands against the node at EP"},
    {.name = "server-key",
     .arg = "KEY",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, server_key),
     .env = "KVEDGE_SERVER_KEY",
     .help = "the node's public key or certificate file (none = plaintext, loopback only)"},
    {.name = "cert",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, cert),
     .env = "KVEDGE_CERT",
     .help = "this client's secret certificate"},
    {.name = "deadline",
     .arg = "MS",
     .type = KVEDGE_CMDOPT_MS,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, deadline_ms),
     .min = 1,
     .max = 600000,
     .def_num = 0,
     .def_text = "5000",
     .help = "per-call deadline in remote mode"},
    {.name = "link",
     .arg = "SPEC",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, link),
     .help = "emulate a link to the node, e.g. 100mbit,20ms (testing)"},
    {.name = "basis",
     .arg = "DIR",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, basis),
     .help = "load the coding bases (*.kvb) of DIR first, to decode the tc precision of their "
             "models (fetch, decode)"},
    {.name = "no-pack",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(kvedge_cli_globals_t, no_pack),
     .help = "ask for one head per GET_LAYER data message, not packed ones (diagnosis)"},
};

const kvedge_cmdopts_t kvedge_cli_globals = {
    .command = "kvedge",
    .summary = "distributed KV-cache store for cloud-edge LLM inference",
    KVEDGE_CMDOPTS_OF(kvedge_cli_globals_t, s_global_list)};
