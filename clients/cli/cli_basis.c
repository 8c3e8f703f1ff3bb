/* `kvedge basis`: reads a coding-basis file of the tc rung (access/codec/basis.h) with the
 * loader every encoder and decoder uses, and shows what it is: model, basis id, shape, size and
 * the range of its quantization steps for K and for V. */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "access/codec/basis.h"
#include "access/codec/error.h"
#include "clients/cli/cli.h"

/* What `kvedge basis` runs on. */
typedef struct {
    bool show;
    const char *file;
} s_opts_t;

static const kvedge_cmdopt_t s_opt_list[] = {
    {.name = "show",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_opts_t, show),
     .help = "read the basis file and print what it is"},
    {.name = "file",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, file),
     .required = true,
     .help = "the basis file (.kvb, as scripts/fit_basis.py writes it)"},
};

static const char s_about[] =
    "With --show, loads a coding basis of the tc rung (docs/block-format.md \"Coding bases\")\n"
    "as every store node and client does (layout, limits, values, BLAKE2b digest) and prints\n"
    "its model id, basis id (the id every tc block coded with it names), layers, KV heads,\n"
    "head dim, file size and the smallest and largest quantization step of its K and of its V\n"
    "sections.\n\n"
    "exit codes: 1 a file that cannot be read, 4 a file the loader refuses (the message says\n"
    "which check failed).\n";

static const kvedge_cmdopts_t s_opts = {.command = "basis",
                                        .summary = "Show what a coding-basis file holds.",
                                        .about = s_about,
                                        KVEDGE_CMDOPTS_OF(s_opts_t, s_opt_list)};

/* What --show prints. */
typedef struct {
    const kvedge_basis_t *b;
    uint64_t bytes;     /* the file's size */
    float lo[2], hi[2]; /* step range of the K (0) and V (1) sections */
} s_shown_t;

static int s_step_ranges(s_shown_t *s)
{
    for (int w = 0; w < 2; w++) {
        s->lo[w] = FLT_MAX;
        s->hi[w] = 0;
    }
    for (uint32_t l = 0; l < kvedge_basis_layers(s->b); l++)
        for (uint32_t h = 0; h < kvedge_basis_kv_heads(s->b); h++)
            for (int w = 0; w < 2; w++) {
                kvedge_basis_section_t sec;
                int rc = kvedge_basis_section(s->b, l, h, w, &sec);
                if (rc != KVEDGE_OK)
                    return rc;
                s->lo[w] = sec.step < s->lo[w] ? sec.step : s->lo[w];
                s->hi[w] = sec.step > s->hi[w] ? sec.step : s->hi[w];
            }
    return KVEDGE_OK;
}

static void s_print_json(const char *file, const s_shown_t *s)
{
    printf("{\"file\":");
    kvedge_cli_json_str(stdout, file);
    printf(",\"model\":");
    kvedge_cli_json_str(stdout, kvedge_basis_model(s->b));
    printf(",\"basis_id\":\"%016" PRIx64 "\",\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,"
           "\"bytes\":%" PRIu64 ",\"k_step_min\":%.9g,\"k_step_max\":%.9g,"
           "\"v_step_min\":%.9g,\"v_step_max\":%.9g}\n",
           kvedge_basis_id(s->b), kvedge_basis_layers(s->b), kvedge_basis_kv_heads(s->b),
           kvedge_basis_head_dim(s->b), s->bytes, (double)s->lo[0], (double)s->hi[0],
           (double)s->lo[1], (double)s->hi[1]);
}

static void s_print_text(const char *file, const s_shown_t *s)
{
    printf("%s: coding basis %016" PRIx64 " of model %s\n", file, kvedge_basis_id(s->b),
           kvedge_basis_model(s->b));
    printf("%u layers x %u KV heads, head dim %u: %u sections, %" PRIu64 " bytes, digest ok\n",
           kvedge_basis_layers(s->b), kvedge_basis_kv_heads(s->b), kvedge_basis_head_dim(s->b),
           2 * kvedge_basis_layers(s->b) * kvedge_basis_kv_heads(s->b), s->bytes);
    printf("K steps %.6g .. %.6g\nV steps %.6g .. %.6g\n", (double)s->lo[0], (double)s->hi[0],
           (double)s->lo[1], (double)s->hi[1]);
}

static int s_basis(kvedge_cli_t *cli, const void *opts)
{
    const s_opts_t *o = opts;
    if (!o->show) {
        kvedge_cli_error("basis: say what to do with %s: --show", o->file);
        return KVEDGE_EXIT_USAGE;
    }
    char why[512] = "";
    kvedge_basis_t *b = NULL;
    int rc = kvedge_basis_load(o->file, &b, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("basis: %s", why[0] ? why : kvedge_strerror(rc));
        return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_CORRUPT;
    }
    s_shown_t s = {.b = b};
    struct stat st;
    if (stat(o->file, &st) == 0)
        s.bytes = (uint64_t)st.st_size;
    rc = s_step_ranges(&s);
    if (rc == KVEDGE_OK) {
        if (cli->json)
            s_print_json(o->file, &s);
        else
            s_print_text(o->file, &s);
    } else {
        kvedge_cli_error("basis: %s: %s", o->file, kvedge_strerror(rc));
    }
    kvedge_basis_free(&b);
    if (rc != KVEDGE_OK)
        return KVEDGE_EXIT_FAILURE;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        kvedge_cli_error("basis: cannot write the output: %s", strerror(errno));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

const kvedge_cli_cmd_t kvedge_cli_basis_cmds[] = {
    {.name = "basis", .opts = &s_opts, .exec = s_basis},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
