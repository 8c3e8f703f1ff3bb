/* `kvedge plan` (clients/cli_plan.c). */
#ifndef KVEDGE_CLIENTS_CLI_CLI_PLAN_H
#define KVEDGE_CLIENTS_CLI_CLI_PLAN_H

#include "clients/cli/cli.h"

/* Its options table and its run on the parsed options (the command table's entry). */
extern const kvedge_cmdopts_t kvedge_cli_plan_opts;
int kvedge_cli_plan_exec(kvedge_cli_t *cli, const void *opts);

/* The same from a command line (argv[0] is "plan"): parses it with the table, then runs. */
int kvedge_cli_plan(kvedge_cli_t *cli, int argc, char **argv);

#endif
