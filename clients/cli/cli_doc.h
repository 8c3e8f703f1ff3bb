/* The kvedge manual page (roff) and bash completion, written from the command tables and the
 * global options, so that neither can go stale: `kvedge help --man` and `kvedge help
 * --completion bash` print them, the build writes build/kvedge.1 and build/kvedge.bash with
 * them and `make install` installs those. */
#ifndef KVEDGE_CLIENTS_CLI_CLI_DOC_H
#define KVEDGE_CLIENTS_CLI_CLI_DOC_H

#include <stdio.h>

#include "clients/cli/cli.h"

/* What the page and the completion describe. */
typedef struct {
    const kvedge_cli_cmd_t *const *tables; /* every command (kvedge_cli_tables) */
    const kvedge_cli_cmd_t *const *remote; /* the forms taken with -H (kvedge_cli_remote_tables) */
    const kvedge_cmdopts_t *globals;       /* the global options (kvedge_cli_globals) */
    const char *version;                   /* "0.1.0" */
} kvedge_cli_doc_t;

/* The manual page, section 1: NAME, SYNOPSIS, DESCRIPTION, GLOBAL OPTIONS, COMMANDS (each with
 * its synopsis, summary, arguments, every flag with its value and help, the daemons' settings
 * flags with their config keys), EXIT STATUS, ENVIRONMENT, FILES. */
void kvedge_cli_doc_man(const kvedge_cli_doc_t *d, FILE *f);

/* A bash completion script defining _kvedge and `complete -F _kvedge kvedge`: the global
 * options and the commands, then each command's flags; a flag's value completes as a file name
 * (FILE, FILES, PATH, KEY, MAP), a directory (DIR) or one of its choices (an ENUM). */
void kvedge_cli_doc_bash(const kvedge_cli_doc_t *d, FILE *f);

#endif
