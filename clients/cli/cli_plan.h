/* `kvedge plan` (clients/cli_plan.c). */
#ifndef KVEDGE_CLIENTS_CLI_CLI_PLAN_H
#define KVEDGE_CLIENTS_CLI_CLI_PLAN_H

#include "clients/cli/cli.h"

int kvedge_cli_plan(kvedge_cli_t *cli, int argc, char **argv);

#endif
