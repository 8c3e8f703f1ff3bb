/* `kvedge lseval`: the quality of large-small collaboration on held-out text
 * (clients/lab/lseval.h): the cloud model, the edge model on its own context, on a peer's int8 copy
 * of it, on the cloud's context K/V adapted through each --adapter, and on no context. In process,
 * no network. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "clients/e2e/adapter.h"
#include "clients/cli/cli.h"
#include "clients/decoder/decoder.h"
#include "clients/decoder/tokenizer.h"
#include "clients/lab/lseval.h"
#include "access/codec/error.h"

/* Context and scored continuation, in tokens, when not given. */
#define S_CONTEXT_DEFAULT      256
#define S_CONTINUATION_DEFAULT 64
/* Bytes of a text read at most. */
#define S_TEXT_MAX_BYTES (256u << 20)

enum {
    S_O_CLOUD = 1000,
    S_O_EDGE,
    S_O_TOKENIZER,
    S_O_TEXT,
    S_O_ADAPTER,
    S_O_CTX,
    S_O_CONT,
    S_O_DOCS,
    S_O_DAT,
    S_O_QUIET,
};

#define S_ARGS                                                                                     \
    "--cloud W --edge W --tokenizer DIR --text FILE [--adapter FILE]... [--ctx N] [--cont N] "     \
    "[--docs N] [--dat FILE]"

static const char s_help[] =
    "Measures what a small edge model (SLM) gains from a large cloud model's (LLM) context\n"
    "K/V, on held-out text, in this process (no network). The text is cut into chapters at\n"
    "blank lines, each tokenized as `kvedge eval` does, and each chapter into documents of\n"
    "--ctx + --cont + 1 tokens: the first --ctx are the context, the next --cont positions\n"
    "are scored with teacher forcing. Rows: cloud-only (the LLM; its greedy choices are the\n"
    "reference), edge-only (the SLM computing its own context, fp32), peer-int8 (the SLM's\n"
    "own context K/V through int8 blocks, as a peer edge node serves it), per adapter\n"
    "ce-lslm at lossless, int8 and int4-g32 (the LLM's context K/V of the mapped layers\n"
    "through blocks of that precision, adapted into the SLM's layers), and no-context (the\n"
    "SLM on the continuation alone). Per row: perplexity of the continuation (natural log),\n"
    "greedy agreement with cloud-only and with edge-only, mean KL(cloud-only || row), and\n"
    "the context's bytes the row needs from elsewhere (encoded blocks; ce-lslm: the mapped\n"
    "cloud layers only).\n\n"
    "      --cloud FILE       the LLM's weights (safetensors)\n"
    "      --edge FILE        the SLM's weights (same vocabulary)\n"
    "      --tokenizer DIR    a BPE tokenizer directory (vocab.json, merges.txt)\n"
    "      --text FILE        held-out text\n"
    "      --adapter FILE     an adapter file (clients/e2e/adapter.h) from the LLM to the SLM;\n"
    "                         up to 4, one row group each\n"
    "      --ctx N            context tokens (default 256)\n"
    "      --cont N           scored continuation positions (default 64)\n"
    "      --docs N           measure at most N documents (default: all)\n"
    "      --dat FILE         also write the rows as a data file (scripts/plot_largesmall.gp)\n"
    "  -q, --quiet            no progress on stderr\n\n"
    "--json prints one object: {\"rows\": [{\"name\", \"kind\", \"ppl\", \"agree_cloud\",\n"
    "\"agree_edge\", \"kl\", \"bytes\", ...}], \"documents\", ...}.\n\n"
    "exit codes: 2 usage (also: a text too short for one document, an adapter for other\n"
    "models), 4 an adapter file the reader refuses, 1 the evaluation failed or a file cannot\n"
    "be read.\n";

/* ---------------------------------------------------------------- documents */

/* Documents of doc_tokens tokens from text: chapters between blank lines, each encoded with
 * "\n\n" after it (as `kvedge eval` and scripts/train_models.py encode them), each cut into
 * consecutive documents of doc_tokens (a chapter's remainder is dropped). *longest receives
 * the longest chapter's tokens. Returns an exit code. */
static int s_read_docs(const char *dir, const char *path, uint32_t vocab, size_t doc_tokens,
                       kvedge_cli_docs_t *d, size_t *chapters, size_t *longest)
{
    kvedge_cli_docs_t ch = {0};
    int ex = kvedge_cli_read_chapters("lseval", dir, path, S_TEXT_MAX_BYTES, vocab, &ch);
    *chapters = ch.n;
    *longest = 0;
    for (size_t c = 0; !ex && c < ch.n; c++) {
        *longest = ch.len[c] > *longest ? ch.len[c] : *longest;
        for (size_t at = 0; !ex && at + doc_tokens <= ch.len[c]; at += doc_tokens) {
            int32_t *copy = malloc(doc_tokens * sizeof *copy);
            if (copy)
                memcpy(copy, ch.doc[c] + at, doc_tokens * sizeof *copy);
            if (!copy || kvedge_cli_docs_add(d, copy, doc_tokens) != 0) {
                kvedge_cli_error("lseval: out of memory");
                ex = KVEDGE_EXIT_FAILURE;
            }
        }
    }
    kvedge_cli_docs_free(&ch);
    return ex;
}

/* ---------------------------------------------------------------- models, adapters */

static int s_load_adapter(const char *path, const kvedge_decoder_t *cloud,
                          const kvedge_decoder_t *edge, kvedge_adapter_t **out)
{
    char why[512] = "";
    int rc = kvedge_adapter_load(path, out, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("lseval: cannot use the adapter %s: %s", path,
                         why[0] ? why : kvedge_strerror(rc));
        return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_CORRUPT;
    }
    rc = kvedge_lseval_adapter_check(*out, cloud, edge, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("lseval: the adapter %s does not fit these models: %s", path,
                         why[0] ? why : kvedge_strerror(rc));
        kvedge_adapter_destroy(out);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

/* A row label for each adapter: its kind, or the file's base name (up to its first '.', other
 * than letters, digits, '-' and '_' as '_') when two share a kind. */
static void s_names(const kvedge_adapter_t *const *a, const char *const *paths, size_t n,
                    char names[][KVEDGE_LSEVAL_NAME_BYTES / 2])
{
    for (size_t i = 0; i < n; i++) {
        kvedge_adapt_kind_t kind = kvedge_adapter_info(a[i])->kind;
        bool dup = false;
        for (size_t j = 0; j < n; j++)
            dup |= j != i && kvedge_adapter_info(a[j])->kind == kind;
        if (!dup) {
            snprintf(names[i], KVEDGE_LSEVAL_NAME_BYTES / 2, "%s", kvedge_adapt_kind_name(kind));
            continue;
        }
        const char *base = strrchr(paths[i], '/');
        base = base ? base + 1 : paths[i];
        size_t len = strcspn(base, ".");
        snprintf(names[i], KVEDGE_LSEVAL_NAME_BYTES / 2, "%.*s", (int)len, base);
        for (char *p = names[i]; *p; p++) /* a label for tables, JSON and data files */
            if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_')
                *p = '_';
    }
}

typedef struct {
    bool quiet;
} s_progress_t;

static void s_progress(void *arg, size_t done, size_t doc_index, double elapsed_s)
{
    const s_progress_t *p = arg;
    if (!p->quiet)
        fprintf(stderr, "lseval: %zu documents (last: %zu), %.1f s\n", done, doc_index + 1,
                elapsed_s);
}

static int s_cmd_lseval(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"cloud", required_argument, NULL, S_O_CLOUD},
        {"edge", required_argument, NULL, S_O_EDGE},
        {"tokenizer", required_argument, NULL, S_O_TOKENIZER},
        {"text", required_argument, NULL, S_O_TEXT},
        {"adapter", required_argument, NULL, S_O_ADAPTER},
        {"ctx", required_argument, NULL, S_O_CTX},
        {"cont", required_argument, NULL, S_O_CONT},
        {"docs", required_argument, NULL, S_O_DOCS},
        {"dat", required_argument, NULL, S_O_DAT},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static const kvedge_cli_cmd_t cmd = {"lseval", NULL, S_ARGS, NULL, NULL, NULL};
    const char *cloud_w = NULL, *edge_w = NULL, *tok_dir = NULL, *text = NULL, *dat = NULL;
    const char *adapter_path[KVEDGE_LSEVAL_MAX_ADAPTERS];
    size_t n_adapters = 0;
    uint64_t ctx = S_CONTEXT_DEFAULT, cont = S_CONTINUATION_DEFAULT, docs_max = 0;
    s_progress_t prog = {false};
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        bool bad = false;
        switch (ch) {
        case S_O_CLOUD:
            cloud_w = optarg;
            break;
        case S_O_EDGE:
            edge_w = optarg;
            break;
        case S_O_TOKENIZER:
            tok_dir = optarg;
            break;
        case S_O_TEXT:
            text = optarg;
            break;
        case S_O_ADAPTER:
            if (n_adapters == KVEDGE_LSEVAL_MAX_ADAPTERS) {
                kvedge_cli_error("lseval: at most %d --adapter", KVEDGE_LSEVAL_MAX_ADAPTERS);
                return KVEDGE_EXIT_USAGE;
            }
            adapter_path[n_adapters++] = optarg;
            break;
        case S_O_CTX:
            bad = kvedge_cli_parse_u64(optarg, 1, KVEDGE_BLOCK_MAX_TOKENS, &ctx) != 0;
            break;
        case S_O_CONT:
            bad = kvedge_cli_parse_u64(optarg, 1, KVEDGE_BLOCK_MAX_TOKENS, &cont) != 0;
            break;
        case S_O_DOCS:
            bad = kvedge_cli_parse_u64(optarg, 1, SIZE_MAX, &docs_max) != 0;
            break;
        case S_O_DAT:
            dat = optarg;
            break;
        case 'q':
            prog.quiet = true;
            break;
        case 'h':
            kvedge_cli_usage(stdout, &cmd, s_help);
            return KVEDGE_EXIT_OK;
        default:
            kvedge_cli_error("lseval: unknown option or missing value '%s' (see kvedge lseval "
                             "--help)",
                             argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        if (bad) {
            kvedge_cli_error("lseval: bad value '%s' for --%s", optarg,
                             kvedge_cli_flag_name(opts, ch));
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("lseval: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    if (!cloud_w || !edge_w || !tok_dir || !text) {
        kvedge_cli_error("lseval: --cloud, --edge, --tokenizer and --text are required (see "
                         "kvedge lseval --help)");
        return KVEDGE_EXIT_USAGE;
    }

    kvedge_decoder_t *cloud = NULL, *edge = NULL;
    kvedge_adapter_t *ad[KVEDGE_LSEVAL_MAX_ADAPTERS] = {NULL};
    kvedge_cli_docs_t docs = {0};
    kvedge_lseval_result_t *res = NULL;
    int ex = kvedge_cli_load_model("lseval", cloud_w, "cloud", &cloud);
    if (!ex)
        ex = kvedge_cli_load_model("lseval", edge_w, "edge", &edge);
    const kvedge_decoder_config_t *cc = cloud ? kvedge_decoder_config(cloud) : NULL;
    const kvedge_decoder_config_t *ec = edge ? kvedge_decoder_config(edge) : NULL;
    if (!ex && cc->vocab != ec->vocab) {
        kvedge_cli_error("lseval: the models' vocabularies differ (cloud %u, edge %u): they "
                         "must share a tokenizer",
                         cc->vocab, ec->vocab);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex && (ctx + cont > cc->max_positions || ctx + cont > ec->max_positions)) {
        kvedge_cli_error("lseval: --ctx (%llu) + --cont (%llu) exceed the models' positions "
                         "(cloud %u, edge %u)",
                         (unsigned long long)ctx, (unsigned long long)cont, cc->max_positions,
                         ec->max_positions);
        ex = KVEDGE_EXIT_USAGE;
    }
    for (size_t i = 0; !ex && i < n_adapters; i++)
        ex = s_load_adapter(adapter_path[i], cloud, edge, &ad[i]);
    size_t chapters = 0, longest = 0;
    if (!ex)
        ex = s_read_docs(tok_dir, text, cc->vocab, (size_t)(ctx + cont + 1), &docs, &chapters,
                         &longest);
    if (!ex && docs.n == 0) {
        kvedge_cli_error("lseval: %s is too short for one document: a context of %llu and a "
                         "continuation of %llu need %llu tokens in one chapter (%zu chapters, "
                         "the longest %zu tokens)",
                         text, (unsigned long long)ctx, (unsigned long long)cont,
                         (unsigned long long)(ctx + cont + 1), chapters, longest);
        ex = KVEDGE_EXIT_USAGE;
    }
    char names[KVEDGE_LSEVAL_MAX_ADAPTERS][KVEDGE_LSEVAL_NAME_BYTES / 2];
    const char *name_p[KVEDGE_LSEVAL_MAX_ADAPTERS];
    if (!ex) {
        s_names((const kvedge_adapter_t *const *)ad, adapter_path, n_adapters, names);
        for (size_t i = 0; i < n_adapters; i++)
            name_p[i] = names[i];
        kvedge_lseval_opts_t o = {
            .cloud = cloud,
            .edge = edge,
            .adapters = (const kvedge_adapter_t *const *)ad,
            .adapter_names = name_p,
            .n_adapters = n_adapters,
            .docs = (const int32_t *const *)docs.doc,
            .doc_len = docs.len,
            .n_docs = docs.n,
            .ctx_tokens = (uint32_t)ctx,
            .cont_tokens = (uint32_t)cont,
            .max_docs = (size_t)docs_max,
            .progress = s_progress,
            .progress_arg = &prog,
        };
        int rc = kvedge_lseval_run(&o, &res);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("lseval: the evaluation failed: %s", kvedge_strerror(rc));
            ex = KVEDGE_EXIT_FAILURE;
        }
    }
    if (!ex) {
        kvedge_lseval_print(stdout, res, cli->json);
        if (dat) {
            FILE *f = fopen(dat, "w");
            if (f)
                kvedge_lseval_print_dat(f, res);
            if (!f || fclose(f) != 0) {
                kvedge_cli_error("lseval: cannot write %s: %s", dat, strerror(errno));
                ex = KVEDGE_EXIT_FAILURE;
            }
        }
    }
    free(res);
    kvedge_cli_docs_free(&docs);
    for (size_t i = 0; i < n_adapters; i++)
        kvedge_adapter_destroy(&ad[i]);
    kvedge_decoder_destroy(&edge);
    kvedge_decoder_destroy(&cloud);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_lseval_cmds[] = {
    {"lseval", s_cmd_lseval, S_ARGS,
     "Large-small quality: an edge model on a cloud model's adapted context K/V.", NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL},
};
