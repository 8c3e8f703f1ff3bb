/* `kvedge lseval`: the quality of large-small collaboration on held-out text
 * (clients/lab/lseval.h): the cloud model, the edge model on its own context, on a peer's int8 copy
 * of it, on the cloud's context K/V adapted through each --adapter, and on no context. In process,
 * no network. */
#include <ctype.h>
#include <errno.h>
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

static const char s_help[] =
    "Measures what a small edge model (SLM) gains from a large cloud model's (LLM) context\n"
    "K/V, on held-out text, in this process (no network). The text is cut into chapters at\n"
    "blank lines, each tokenized as `kvedge eval` does, and each chapter into documents of\n"
    "--ctx + --cont + 1 tokens: the first --ctx are the context, the next --cont positions\n"
    "are scored with teacher forcing. Rows: cloud-only (the LLM; its greedy choices are the\n"
    "reference), edge-only (the SLM computing its own context, fp32), peer-int8 (the SLM's\n"
    "own context K/V through int8 blocks, as a peer edge node serves it), per adapter\n"
    "ce-lslm at lossless, int8 and int4-g32 (the LLM's context K/V of the mapped layers\n"
    "through blocks of that precision, adapted into the SLM's layers; each adapter's rows\n"
    "are labeled by how it was fitted: least-squares, distilled or heads, or by the file's\n"
    "base name when two share that label), and no-context (the\n"
    "SLM on the continuation alone). Per row: perplexity of the continuation (natural log),\n"
    "greedy agreement with cloud-only and with edge-only, mean KL(cloud-only || row), and\n"
    "the context's bytes the row needs from elsewhere (encoded blocks; ce-lslm: the mapped\n"
    "cloud layers only).\n\n"
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

/* A row label for each adapter: how it was fitted (kvedge_adapter_fit_name: least-squares,
 * distilled, heads), or the file's base name (up to its first '.', other than letters, digits,
 * '-' and '_' as '_') when two share that label. */
static void s_names(const kvedge_adapter_t *const *a, const char *const *paths, size_t n,
                    char names[][KVEDGE_LSEVAL_NAME_BYTES / 2])
{
    for (size_t i = 0; i < n; i++) {
        const char *label = kvedge_adapter_fit_name(kvedge_adapter_info(a[i]));
        bool dup = false;
        for (size_t j = 0; j < n; j++)
            dup |= j != i && strcmp(kvedge_adapter_fit_name(kvedge_adapter_info(a[j])), label) == 0;
        if (!dup) {
            snprintf(names[i], KVEDGE_LSEVAL_NAME_BYTES / 2, "%s", label);
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

/* What `kvedge lseval` runs on. */
typedef struct {
    const char *cloud, *edge, *tokenizer, *file, *dat;
    const char *adapters[KVEDGE_LSEVAL_MAX_ADAPTERS];
    size_t n_adapters;
    uint32_t ctx, cont;
    uint64_t docs;
    bool quiet;
} s_opts_t;

static const kvedge_cmdopt_t s_opt_list[] = {
    {.name = "cloud",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, cloud),
     .required = true,
     .help = "the LLM: an OPT safetensors file or a Hugging Face model folder"},
    {.name = "edge",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, edge),
     .required = true,
     .help = "the SLM, the same way (same vocabulary)"},
    {.name = "tokenizer",
     .arg = "PATH",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, tokenizer),
     .def_text = "the cloud model folder's tokenizer.json",
     .help = "a folder with vocab.json + merges.txt (else tokenizer.json), or a tokenizer.json"},
    {.name = "file",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, file),
     .alias = "text",
     .required = true,
     .help = "held-out text"},
    {.name = "adapter",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STRS,
     KVEDGE_CMDOPT_LIST_AT(s_opts_t, adapters, n_adapters),
     .help = "an adapter file (clients/e2e/adapter.h) from the LLM to the SLM; repeat for up "
             "to 4, one row group each"},
    {.name = "context",
     .alias = "ctx",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_opts_t, ctx),
     .min = 1,
     .max = KVEDGE_BLOCK_MAX_TOKENS,
     .def_num = S_CONTEXT_DEFAULT,
     .help = "shared context tokens"},
    {.name = "continuation",
     .alias = "cont",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_opts_t, cont),
     .min = 1,
     .max = KVEDGE_BLOCK_MAX_TOKENS,
     .def_num = S_CONTINUATION_DEFAULT,
     .help = "scored continuation tokens"},
    {.name = "docs",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_opts_t, docs),
     .min = 1,
     .max = SIZE_MAX,
     .def_text = "all",
     .help = "measure at most N documents"},
    {.name = "dat",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, dat),
     .help = "also write the rows as a data file (scripts/plot_largesmall.gp)"},
    {.name = "quiet",
     .letter = 'q',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_opts_t, quiet),
     .help = "no progress on stderr"},
};

static const kvedge_cmdopts_t s_opts = {
    .command = "lseval",
    .summary = "Large-small quality: an edge model on a cloud model's adapted context K/V.",
    .about = s_help,
    KVEDGE_CMDOPTS_OF(s_opts_t, s_opt_list)};

/* What lseval works on. */
typedef struct {
    kvedge_decoder_t *cloud, *edge;
    kvedge_adapter_t *ad[KVEDGE_LSEVAL_MAX_ADAPTERS];
    kvedge_cli_docs_t docs;
    kvedge_lseval_result_t *res;
} s_lseval_t;

/* The models (one vocabulary, positions for --context + --continuation), the adapters and the
 * documents. Returns an exit code. */
static int s_lseval_load(const s_opts_t *o, s_lseval_t *r)
{
    int ex = kvedge_cli_load_model("lseval", o->cloud, "cloud", &r->cloud);
    if (!ex)
        ex = kvedge_cli_load_model("lseval", o->edge, "edge", &r->edge);
    const kvedge_decoder_config_t *cc = r->cloud ? kvedge_decoder_config(r->cloud) : NULL;
    const kvedge_decoder_config_t *ec = r->edge ? kvedge_decoder_config(r->edge) : NULL;
    uint64_t ctx = o->ctx, cont = o->cont;
    if (!ex && cc->vocab != ec->vocab) {
        kvedge_cli_error("lseval: the models' vocabularies differ (cloud %u, edge %u): they "
                         "must share a tokenizer",
                         cc->vocab, ec->vocab);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex && (ctx + cont > cc->max_positions || ctx + cont > ec->max_positions)) {
        kvedge_cli_error(
            "lseval: --context (%llu) + --continuation (%llu) exceed the models' positions "
            "(cloud %u, edge %u)",
            (unsigned long long)ctx, (unsigned long long)cont, cc->max_positions,
            ec->max_positions);
        ex = KVEDGE_EXIT_USAGE;
    }
    for (size_t i = 0; !ex && i < o->n_adapters; i++)
        ex = s_load_adapter(o->adapters[i], r->cloud, r->edge, &r->ad[i]);
    size_t chapters = 0, longest = 0;
    char own[4096];
    const char *tok =
        o->tokenizer ? o->tokenizer : kvedge_cli_own_tokenizer(o->cloud, own, sizeof own);
    if (!ex && !tok) {
        kvedge_cli_error("lseval: --tokenizer PATH is required: %s is not a model folder with a "
                         "tokenizer.json",
                         o->cloud);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex)
        ex = s_read_docs(tok, o->file, cc->vocab, (size_t)(ctx + cont + 1), &r->docs, &chapters,
                         &longest);
    if (!ex && r->docs.n == 0) {
        kvedge_cli_error("lseval: %s is too short for one document: a context of %llu and a "
                         "continuation of %llu need %llu tokens in one chapter (%zu chapters, "
                         "the longest %zu tokens)",
                         o->file, (unsigned long long)ctx, (unsigned long long)cont,
                         (unsigned long long)(ctx + cont + 1), chapters, longest);
        ex = KVEDGE_EXIT_USAGE;
    }
    return ex;
}

/* Runs the evaluation into r->res. Returns an exit code. */
static int s_lseval_measure(const s_opts_t *o, s_lseval_t *r)
{
    char names[KVEDGE_LSEVAL_MAX_ADAPTERS][KVEDGE_LSEVAL_NAME_BYTES / 2];
    const char *name_p[KVEDGE_LSEVAL_MAX_ADAPTERS];
    s_progress_t prog = {o->quiet};
    s_names((const kvedge_adapter_t *const *)r->ad, o->adapters, o->n_adapters, names);
    for (size_t i = 0; i < o->n_adapters; i++)
        name_p[i] = names[i];
    kvedge_lseval_opts_t lo = {
        .cloud = r->cloud,
        .edge = r->edge,
        .adapters = (const kvedge_adapter_t *const *)r->ad,
        .adapter_names = name_p,
        .n_adapters = o->n_adapters,
        .docs = (const int32_t *const *)r->docs.doc,
        .doc_len = r->docs.len,
        .n_docs = r->docs.n,
        .ctx_tokens = o->ctx,
        .cont_tokens = o->cont,
        .max_docs = (size_t)o->docs,
        .progress = s_progress,
        .progress_arg = &prog,
    };
    int rc = kvedge_lseval_run(&lo, &r->res);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("lseval: the evaluation failed: %s", kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

/* Prints the rows, and writes them to --dat. Returns an exit code. */
static int s_lseval_print(const kvedge_cli_t *cli, const s_opts_t *o, const s_lseval_t *r)
{
    kvedge_lseval_print(stdout, r->res, cli->json);
    if (!o->dat)
        return KVEDGE_EXIT_OK;
    FILE *f = fopen(o->dat, "w");
    if (f)
        kvedge_lseval_print_dat(f, r->res);
    if (!f || fclose(f) != 0) {
        kvedge_cli_error("lseval: cannot write %s: %s", o->dat, strerror(errno));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

static int s_lseval(kvedge_cli_t *cli, const void *opts)
{
    const s_opts_t *o = opts;
    s_lseval_t r = {0};
    int ex = s_lseval_load(o, &r);
    if (!ex)
        ex = s_lseval_measure(o, &r);
    if (!ex)
        ex = s_lseval_print(cli, o, &r);
    free(r.res);
    kvedge_cli_docs_free(&r.docs);
    for (size_t i = 0; i < o->n_adapters; i++)
        kvedge_adapter_destroy(&r.ad[i]);
    kvedge_decoder_destroy(&r.edge);
    kvedge_decoder_destroy(&r.cloud);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_lseval_cmds[] = {
    {.name = "lseval", .opts = &s_opts, .exec = s_lseval},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
