/* `kvedge block`: verifies one block file (docs/block-format.md) and shows its header, its rung
 * and how its body is stored: plain, lz4, or entropy-coded with each section's stream. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/block.h"
#include "access/codec/ecbody.h"
#include "access/codec/error.h"
#include "access/codec/prec.h"
#include "clients/cli/cli.h"

/* What `kvedge block` runs on. */
typedef struct {
    const char *file;
} s_opts_t;

static const kvedge_cmdopt_t s_opt_list[] = {
    {.name = "file",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, file),
     .required = true,
     .help = "the block (the bytes of one stored block or variant, as written)"},
};

static const char s_about[] =
    "Verifies a block file as every reader does (structure, checksum, and decoding an lz4\n"
    "or entropy-coded body) and prints its version, shape, rung, body coding (plain, lz4,\n"
    "or ec: rANS streams, docs/block-format.md \"Entropy-coded body\"), raw and stored\n"
    "bytes, and per section its raw bytes, stored bytes and transform.\n\n"
    "exit codes: 1 a file that cannot be read, 4 a block that fails verification (the\n"
    "message says why).\n";

static const kvedge_cmdopts_t s_opts = {.command = "block",
                                        .summary = "Verify a block file and show how it is coded.",
                                        .about = s_about,
                                        KVEDGE_CMDOPTS_OF(s_opts_t, s_opt_list)};

static const char *const s_section_names[4] = {"K params", "V params", "K codes", "V codes"};
static const char *const s_section_keys[4] = {"k_params", "v_params", "k_codes", "v_codes"};

static const char *s_coding(const kvedge_block_info_t *in)
{
    return in->ec ? "ec" : in->lz4 ? "lz4" : "plain";
}

static const char *s_transform(uint8_t xf)
{
    return xf == KVEDGE_EC_XF_UNPACK ? "unpack" : "none";
}

static void s_print_json(const kvedge_block_info_t *in, const kvedge_block_section_coding_t *sec,
                         size_t n)
{
    printf("{\"version\":%u,\"dtype\":\"%s\",\"scheme\":\"%s\",\"group\":%u,\"tokens\":%u,"
           "\"head_dim\":%u,\"key_channels\":%u,\"rung\":\"%s\",\"coding\":\"%s\","
           "\"raw_bytes\":%u,\"stored_bytes\":%u,\"bytes\":%zu,\"sections\":[",
           in->version, kvedge_dtype_name(in->dtype), kvedge_scheme_name(in->scheme),
           in->group_size, in->tokens, in->head_dim, in->key_channels,
           kvedge_prec_name(kvedge_prec_of_block(in)), s_coding(in), in->raw_len, in->stored_len,
           in->total_len);
    for (size_t i = 0; i < n; i++)
        printf("%s{\"section\":\"%s\",\"raw\":%u,\"stored\":%u,\"transform\":\"%s\"}", i ? "," : "",
               n == 4 ? s_section_keys[i]
               : i    ? "v"
                      : "k",
               sec[i].raw, sec[i].stored, s_transform(sec[i].transform));
    printf("]}\n");
}

static void s_print_text(const char *file, const kvedge_block_info_t *in,
                         const kvedge_block_section_coding_t *sec, size_t n)
{
    printf("%s: block version %u, %s %s", file, in->version, kvedge_dtype_name(in->dtype),
           kvedge_scheme_name(in->scheme));
    if (in->scheme != KVEDGE_SCHEME_LOSSLESS)
        printf(" group %u", in->group_size);
    printf(", %u tokens x %u channels (%u key channels kept), rung %s\n", in->tokens, in->head_dim,
           in->key_channels, kvedge_prec_name(kvedge_prec_of_block(in)));
    printf("body: %s, %u bytes stored for %u raw (%.3f); block %zu bytes, checksum ok\n",
           s_coding(in), in->stored_len, in->raw_len,
           in->raw_len ? (double)in->stored_len / in->raw_len : 0.0, in->total_len);
    if (in->lz4)
        return; /* one lz4 stream: no per-section sizes */
    printf("%-9s %10s %10s  %s\n", "section", "raw", "stored", "transform");
    for (size_t i = 0; i < n; i++)
        printf("%-9s %10u %10u  %s\n",
               n == 4 ? s_section_names[i]
               : i    ? "V"
                      : "K",
               sec[i].raw, sec[i].stored, s_transform(sec[i].transform));
}

static int s_block(kvedge_cli_t *cli, const void *opts)
{
    const s_opts_t *o = opts;
    char *buf = NULL;
    size_t len = 0;
    int ex = kvedge_cli_slurp("block", "the block", o->file, (size_t)KVEDGE_BLOCK_MAX_BYTES + 4096,
                              &buf, &len);
    if (ex)
        return ex;
    kvedge_block_info_t info;
    kvedge_block_section_coding_t sec[4];
    size_t n = 0;
    int rc = kvedge_block_check((const uint8_t *)buf, len, &info);
    if (rc == KVEDGE_OK)
        rc = kvedge_block_coding(&info, sec, &n);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("block: %s is not a valid block: %s", o->file, kvedge_strerror(rc));
        free(buf);
        return rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_CORRUPT;
    }
    if (cli->json)
        s_print_json(&info, sec, n);
    else
        s_print_text(o->file, &info, sec, n);
    free(buf);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        kvedge_cli_error("block: cannot write the output: %s", strerror(errno));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

const kvedge_cli_cmd_t kvedge_cli_block_cmds[] = {
    {.name = "block", .opts = &s_opts, .exec = s_block},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
