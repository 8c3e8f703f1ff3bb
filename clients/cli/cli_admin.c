/* The option tables the local and remote admin commands share (cli_admin.h). */
#include "clients/cli/cli_admin.h"

#include <stddef.h>

#include "access/codec/model.h"
#include "runtime/settings.h"

#define S_PREFIX_HELP "a prefix id: at least 4 hex digits of its last chunk (see kvedge ls)"

const kvedge_cmdopt_t kvedge_cli_prefix_list[1] = {
    {.name = "PREFIX",
     .positional = true,
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(kvedge_cli_prefix_opts_t, prefix),
     .required = true,
     .help = S_PREFIX_HELP},
};

const kvedge_cmdopt_t kvedge_cli_ls_list[2] = {
    {.name = "model",
     .letter = 'm',
     .arg = "ID",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(kvedge_cli_ls_opts_t, model),
     .help = "only prefixes of this model"},
    {.name = "full",
     .letter = 'f',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(kvedge_cli_ls_opts_t, full),
     .help = "print full 64-digit prefix ids (what subscriptions and fetch --chunks take)"},
};

const kvedge_cmdopt_t kvedge_cli_show_list[2] = {
    {.name = "layer",
     .letter = 'l',
     .arg = "L",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(kvedge_cli_show_opts_t, layer),
     .max = KVEDGE_MODEL_MAX_LAYERS - 1,
     .def_num = UINT32_MAX,
     .def_text = "all",
     .help = "only layer L"},
    {.name = "PREFIX",
     .positional = true,
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(kvedge_cli_show_opts_t, prefix),
     .required = true,
     .help = S_PREFIX_HELP},
};

const kvedge_cmdopt_t kvedge_cli_evict_list[1] = {
    {.name = "to",
     .letter = 't',
     .arg = "SIZE",
     .type = KVEDGE_CMDOPT_SIZE,
     KVEDGE_CMDOPT_AT(kvedge_cli_evict_opts_t, to),
     .max = KVEDGE_SETTINGS_SIZE_MAX,
     .required = true,
     .help = "target size: bytes, or with K, M, G, T suffix"},
};
