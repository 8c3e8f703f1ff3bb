/* The options the admin commands share between their local form (on a data directory,
 * cli_local.c) and their remote form (-H EP, cli_remote.c): one table each, so the two forms
 * of a command take the same flags. */
#ifndef KVEDGE_CLI_ADMIN_H
#define KVEDGE_CLI_ADMIN_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/cmdopts.h"

/* pin, unpin, delete: one prefix. */
typedef struct {
    const char *prefix;
} kvedge_cli_prefix_opts_t;
extern const kvedge_cmdopt_t kvedge_cli_prefix_list[1];

/* ls */
typedef struct {
    const char *model; /* only this model's prefixes; NULL = all */
    bool full;         /* 64-digit ids */
} kvedge_cli_ls_opts_t;
extern const kvedge_cmdopt_t kvedge_cli_ls_list[2];

/* show */
typedef struct {
    const char *prefix;
    uint32_t layer; /* UINT32_MAX = all */
} kvedge_cli_show_opts_t;
extern const kvedge_cmdopt_t kvedge_cli_show_list[2];

/* evict */
typedef struct {
    uint64_t to; /* bytes */
} kvedge_cli_evict_opts_t;
extern const kvedge_cmdopt_t kvedge_cli_evict_list[1];

#endif
