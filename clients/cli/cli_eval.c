/* `kvedge eval`: the quality of every cache scheme on held-out text (clients/lab/eval.h), against a
 * master, cloud node and edge proxy started in this process, or against a deployment's cloud
 * node (-H) and edge proxy (--proxy). */
#define _GNU_SOURCE /* nftw */
#include <ctype.h>
#include <errno.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/kvmsg.h"
#include "runtime/log.h"
#include "runtime/mview.h"
#include "clients/cli/cli.h"
#include "clients/decoder/decoder.h"
#include "clients/decoder/tokenizer.h"
#include "clients/e2e/e2e.h"
#include "clients/lab/eval.h"
#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "proxy/quality.h"
#include "access/codec/basis.h"
#include "access/codec/error.h"
#include "store/master/master.h"
#include "store/node/node.h"

/* Shared context and scored continuation, in tokens, when not given. */
#define S_CONTEXT_DEFAULT      256
#define S_CONTINUATION_DEFAULT 128
/* The base of the schemes' model ids when --model-id is not given. */
#define S_MODEL_ID_DEFAULT "kvedge-eval"
/* How long the in-process proxy may take to reach its source, and a registration to land. */
#define S_START_WAIT_MS 10000
/* Bytes of an ids file or a text read at most. */
#define S_FILE_MAX_BYTES (256u << 20)

static const char s_eval_help[] =
    "Measures the quality of the cache schemes on held-out text. For each document (the\n"
    "first --context tokens are the shared context, the next --continuation tokens are\n"
    "scored) and each scheme, the cloud prefills the context and puts its K/V to the cloud\n"
    "node (kvedge prefill's path), the edge fetches it through the proxy with the pipelined\n"
    "loader, and the continuation runs with teacher forcing over the fetched (dequantized)\n"
    "K/V. Reference: the same continuation with the context's K/V computed here in fp32.\n"
    "Per scheme: perplexity (natural log), its change against lossless, greedy next-token\n"
    "agreement with the reference, max |logit diff| and mean KL(reference || scheme), and\n"
    "the goals (lossless bit-identical, int8 within 0.5 %, int4-g32 within 3 %). Per layer:\n"
    "the perplexity change when only that layer is stored in a profile scheme.\n\n"
    "tc and the +ec schemes are rungs a node derives, so they are coded in this process\n"
    "instead: from the same context K/V, one block per layer, KV head and chunk as a node\n"
    "holds it, decoded by the block decoder, its bytes counted. tc codes against the model's\n"
    "coding basis (--basis FILE, by default basis.kvb in the model folder).\n\n"
    "Without -H, a Storage Master, a cloud node and an edge proxy run in this process (ipc\n"
    "endpoints in a temporary directory). With -H CLOUD --proxy EP it runs against a\n"
    "deployment: scheme S is stored under model id ID@S (ID@S@rope-XXXXXXXX for a rotary\n"
    "model: the fingerprint of its rotary settings stays last), which the proxy must know (a\n"
    "cloud node joined to the proxy's master registers it; fetches are retried for --wait).\n\n"
    "The model: an OPT safetensors file, or a Hugging Face model folder (Llama, Mistral,\n"
    "Qwen2; grouped-query attention: the store holds the KV heads). With --file, the\n"
    "documents are tokenized by --tokenizer, else by the folder's tokenizer.json; a\n"
    "template's BOS goes before every document, as prefill adds it.\n\n"
    "--json prints one object: {\"reference\": ROW, \"schemes\": [ROW], \"profiles\":\n"
    "[{\"scheme\", \"layers\": [ROW]}], \"doc_index\", ...}.\n\n"
    "exit codes: 2 usage, 1 the evaluation failed, 3 the proxy does not know a scheme's\n"
    "model id, 5 node or proxy unreachable.\n";

/* What `kvedge eval` runs on. */
typedef struct {
    const char *weights, *model_id, *ids, *tokenizer, *file;
    uint32_t heads, context, continuation, chunk_tokens, time_budget_s, wait_ms;
    uint64_t docs;
    const char *schemes, *profiles, *plot_dir, *profile_out, *proxy, *basis;
    bool no_profile, quiet;
} s_eval_opts_t;

static const kvedge_cmdopt_t s_eval_list[] = {
    {.name = "weights",
     .letter = 'w',
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, weights),
     .help = "the model, as prefill and decode take it: an OPT safetensors file or a Hugging "
             "Face model folder (Llama, Mistral, Qwen2, OPT); required"},
    {.name = "heads",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, heads),
     .min = 1,
     .max = KVEDGE_MODEL_MAX_HEADS,
     .def_text = "the file's metadata, else hidden/64",
     .help = "query heads of an OPT safetensors file (a model folder's config.json says)"},
    {.name = "model-id",
     .arg = "ID",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, model_id),
     .def = S_MODEL_ID_DEFAULT,
     .help = "base of the schemes' model ids"},
    {.name = "ids",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, ids),
     .help = "documents as token ids: whitespace-separated, documents separated by blank "
             "lines"},
    {.name = "tokenizer",
     .arg = "PATH",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, tokenizer),
     .def_text = "a model folder's tokenizer.json",
     .help = "with --file: a folder with vocab.json + merges.txt (else tokenizer.json), or a "
             "tokenizer.json"},
    {.name = "file",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, file),
     .alias = "text",
     .help = "documents as text, separated by blank lines (chapters)"},
    {.name = "context",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, context),
     .min = 1,
     .max = UINT32_MAX,
     .def_num = S_CONTEXT_DEFAULT,
     .help = "shared context tokens"},
    {.name = "continuation",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, continuation),
     .min = 1,
     .max = UINT32_MAX,
     .def_num = S_CONTINUATION_DEFAULT,
     .help = "scored continuation tokens; a document needs context + continuation + 1 tokens, "
             "shorter ones are skipped"},
    {.name = "chunk-tokens",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, chunk_tokens),
     .min = 1,
     .max = KVEDGE_BLOCK_MAX_TOKENS,
     .def_text = "256",
     .help = "context tokens per chunk"},
    {.name = "docs",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, docs),
     .min = 1,
     .max = SIZE_MAX,
     .def_text = "all",
     .help = "measure at most N documents"},
    {.name = "time-budget",
     .arg = "S",
     .type = KVEDGE_CMDOPT_SECONDS,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, time_budget_s),
     .min = 1,
     .max = 1000000,
     .def_text = "none",
     .help = "start no document after S seconds"},
    {.name = "schemes",
     .arg = "LIST",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, schemes),
     .def_text = "lossless,fp16,int8,int4-g32,int4-g64,int4-g128,think-75,think-50,"
                 "int4-g32+think-50",
     .help = "comma-separated scheme names: lossless (fp32), fp16, int8, int4[-gN], each with "
             "an optional +think-P (keep P % of the key channels), think-P; int8+ec, "
             "int4[-gN]+ec (entropy-coded) and tc (transform-coded, needs the model's coding "
             "basis): blocks a node derives, coded in this process"},
    {.name = "profiles",
     .arg = "LIST",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, profiles),
     .def_text = "int4-g32,think-50",
     .help = "per-layer profile schemes, at most 16; 'ladder': every lossy rung of the "
             "precision ladder (int8, int4-g32, int4-g64, int4-g128, each alone, with +think-75 "
             "and with +think-50, and think-75, think-50: 14)"},
    {.name = "basis",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, basis),
     .def_text = "basis.kvb in the model folder (beside an OPT safetensors file)",
     .help = "the model's coding basis (a .kvb file, scripts/fit_basis.py) the tc scheme codes "
             "with"},
    {.name = "no-profile",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, no_profile),
     .help = "no per-layer profile"},
    {.name = "profile-out",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, profile_out),
     .help = "write the per-layer profile as the quality profile the edge proxy's planner reads "
             "(proxy/quality.h, JSON version 1): per layer and rung the perplexity change (%), "
             "mean KL and agreement, and the whole-model rows of the schemes that are ladder "
             "rungs. Every profile scheme must be a ladder rung (lossless, int8, "
             "int4-g32/g64/g128, each optionally with +think-75 or +think-50, or tc; not fp16, "
             "other groups or shares, or +ec)"},
    {.name = "plot-dir",
     .arg = "DIR",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, plot_dir),
     .help = "write quality_schemes.dat, quality_layers.dat and quality.json there "
             "(scripts/plot_quality.gp draws them)"},
    {.name = "proxy",
     .arg = "EP",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, proxy),
     .help = "with -H: the edge proxy to fetch through"},
    {.name = "wait",
     .arg = "MS",
     .type = KVEDGE_CMDOPT_MS,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, wait_ms),
     .min = 1,
     .max = 3600000,
     .def_text = "10000",
     .help = "retry a fetch the proxy cannot serve yet for MS"},
    {.name = "quiet",
     .letter = 'q',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_eval_opts_t, quiet),
     .help = "no progress on stderr"},
};

static const kvedge_cmdopts_t s_eval_opts = {
    .command = "eval",
    .summary = "Measure the quality of every cache scheme (perplexity, agreement, KL) on "
               "held-out text.",
    .about = s_eval_help,
    KVEDGE_CMDOPTS_OF(s_eval_opts_t, s_eval_list)};

/* ---------------------------------------------------------------- documents */

/* Documents from an ids file: whitespace-separated ids below vocab; a line holding only
 * whitespace ends a document. Returns an exit code. */
static int s_read_ids(const char *path, uint32_t vocab, kvedge_cli_docs_t *d)
{
    char *text = NULL;
    size_t len = 0;
    int ex = kvedge_cli_slurp("eval", "the ids file", path, S_FILE_MAX_BYTES, &text, &len);
    if (ex)
        return ex;
    int32_t *cur = NULL;
    size_t n = 0, cap = 0, line = 1;
    bool blank = true; /* the current line has nothing but whitespace so far */
    for (const char *p = text;; p++) {
        if (*p == '\n' || *p == '\0') {
            if ((blank || *p == '\0') && n) { /* a blank line or the end closes a document */
                if (kvedge_cli_docs_add(d, cur, n) != 0)
                    ex = KVEDGE_EXIT_FAILURE;
                cur = NULL;
                n = cap = 0;
            }
            if (*p == '\0' || ex)
                break;
            line++;
            blank = true;
            continue;
        }
        if (isspace((unsigned char)*p))
            continue;
        blank = false;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || (uint64_t)v >= vocab ||
            (*end && !isspace((unsigned char)*end))) {
            kvedge_cli_error("eval: %s:%zu: want token ids 0..%u, got '%.16s'", path, line,
                             vocab - 1, p);
            ex = KVEDGE_EXIT_USAGE;
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            int32_t *more = realloc(cur, cap * sizeof *cur);
            if (!more) {
                ex = KVEDGE_EXIT_FAILURE;
                break;
            }
            cur = more;
        }
        cur[n++] = (int32_t)v;
        p = end - 1;
    }
    free(cur);
    free(text);
    if (ex == KVEDGE_EXIT_FAILURE)
        kvedge_cli_error("eval: out of memory reading %s", path);
    return ex;
}

/* ---------------------------------------------------------------- the in-process deployment */

typedef struct {
    char root[64];
    char m_ep[128], m_pub[128], n_ep[128], p_ep[128];
    kvedge_master_t *master;
    kvedge_mview_t *reg;
    kvedge_node_t *node;
    kvedge_proxy_t *proxy;
} s_local_t;

static int s_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void s_local_stop(s_local_t *w)
{
    kvedge_proxy_destroy(&w->proxy);
    kvedge_node_destroy(&w->node);
    kvedge_mview_destroy(&w->reg);
    kvedge_master_destroy(&w->master);
    if (w->root[0])
        nftw(w->root, s_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Registers the model record of every scheme with the master, so the proxy knows them. */
static int s_local_register(s_local_t *w, const kvedge_model_t *base, const kvedge_eval_scheme_t *s,
                            size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvedge_model_t m;
        memset(&m, 0, sizeof m);
        uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
        size_t len = 0;
        char key[KVEDGE_MODEL_ID_MAX_BYTES + 16];
        int rc = kvedge_eval_model(base, &s[i], &m);
        if (rc == KVEDGE_OK)
            rc = kvedge_master_model_pack(&m, body, &len);
        snprintf(key, sizeof key, "model/%s", m.id);
        if (rc == KVEDGE_OK)
            rc = kvedge_mview_set(w->reg, key, body, len, S_START_WAIT_MS);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("eval: cannot register model %s with the master: %s", m.id,
                             kvedge_strerror(rc));
            return KVEDGE_EXIT_FAILURE;
        }
    }
    return KVEDGE_EXIT_OK;
}

/* A master, a cloud node and a proxy whose source is that node, on ipc endpoints in a
 * temporary directory. Returns an exit code; on failure the caller still calls stop. */
static int s_local_start(s_local_t *w)
{
    memset(w, 0, sizeof *w);
    snprintf(w->root, sizeof w->root, "/tmp/kvedge-eval-XXXXXX");
    if (!mkdtemp(w->root)) {
        kvedge_cli_error("eval: cannot make a temporary directory: %s", strerror(errno));
        w->root[0] = '\0';
        return KVEDGE_EXIT_FAILURE;
    }
    char dir[128], why[512] = "";
    snprintf(w->m_ep, sizeof w->m_ep, "ipc://%s/master.sock", w->root);
    snprintf(w->m_pub, sizeof w->m_pub, "ipc://%s/master-pub.sock", w->root);
    snprintf(w->n_ep, sizeof w->n_ep, "ipc://%s/cloud.sock", w->root);
    snprintf(w->p_ep, sizeof w->p_ep, "ipc://%s/proxy.sock", w->root);
    snprintf(dir, sizeof dir, "%s/master", w->root);
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = w->m_ep;
    mo.pub = w->m_pub;
    mo.data_dir = dir;
    mo.insecure = true;
    int rc = kvedge_master_start(&mo, &w->master, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("eval: cannot start the master: %s", why[0] ? why : kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = w->m_ep;
    vo.pub = w->m_pub;
    vo.prefix = "model/";
    rc = kvedge_mview_start(&vo, &w->reg);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("eval: cannot reach the master: %s", kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s/cloud", w->root);
    snprintf(ns.bind, sizeof ns.bind, "%s", w->n_ep);
    snprintf(ns.name, sizeof ns.name, "cloud");
    rc = kvedge_node_start(&ns, &w->node, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("eval: cannot start the cloud node: %s",
                         why[0] ? why : kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    char spec[200];
    snprintf(spec, sizeof spec, "cloud cloud %s", w->n_ep);
    kvedge_proxy_source_t src;
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    if (kvedge_proxy_source_parse(spec, &src) != KVEDGE_OK) {
        kvedge_cli_error("eval: bad proxy source '%s'", spec);
        return KVEDGE_EXIT_FAILURE;
    }
    po.bind = w->p_ep;
    po.insecure = true;
    po.id = "proxy";
    po.sources = &src;
    po.nsources = 1;
    po.master = w->m_ep;
    po.master_pub = w->m_pub;
    rc = kvedge_proxy_start(&po, &w->proxy, why, sizeof why);
    if (rc == KVEDGE_OK)
        rc = kvedge_proxy_wait_sources(w->proxy, 1, S_START_WAIT_MS);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("eval: cannot start the edge proxy: %s",
                         why[0] ? why : kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

static int s_local_client(const char *ep, int deadline_ms, const char *name, kvedge_client_t **out)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = deadline_ms;
    o.name = name;
    int rc = kvedge_client_connect(&o, out);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("eval: cannot connect to %s: %s", ep, kvedge_strerror(rc));
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    return KVEDGE_EXIT_OK;
}

/* ---------------------------------------------------------------- the command */

/* A comma-separated scheme list into out (at most max). Returns an exit code. */
static int s_schemes(const char *flag, const char *list, kvedge_eval_scheme_t *out, size_t max,
                     size_t *n)
{
    size_t k = 0;
    for (const char *p = list;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char name[KVEDGE_EVAL_NAME_BYTES] = "";
        if (len >= sizeof name || k == max) {
            kvedge_cli_error("eval: %s: %s", flag,
                             k == max ? "too many schemes" : "a scheme name is too long");
            return KVEDGE_EXIT_USAGE;
        }
        memcpy(name, p, len);
        if (kvedge_eval_scheme_parse(name, &out[k]) != KVEDGE_OK) {
            kvedge_cli_error("eval: %s: unknown scheme '%s' (lossless, fp16, int8, int4[-gN] "
                             "with N >= %d, each with an optional +think-P, P 1..99; think-P)",
                             flag, name, KVEDGE_E2E_GROUP_MIN);
            return KVEDGE_EXIT_USAGE;
        }
        for (size_t j = 0; j < k; j++)
            if (strcmp(out[j].name, out[k].name) == 0) {
                kvedge_cli_error("eval: %s names %s twice", flag, out[k].name);
                return KVEDGE_EXIT_USAGE;
            }
        k++;
        if (!e)
            break;
        p = e + 1;
    }
    *n = k;
    return KVEDGE_EXIT_OK;
}

typedef struct {
    bool quiet;
} s_progress_t;

static void s_progress(void *arg, size_t done, size_t doc_index, double elapsed_s)
{
    const s_progress_t *p = arg;
    if (!p->quiet)
        fprintf(stderr, "eval: %zu documents measured (last: document %zu), %.1f s\n", done,
                doc_index, elapsed_s);
}

/* Writes one of the plot files into dir. Returns an exit code. */
static int s_write(const char *dir, const char *name, const kvedge_eval_result_t *r, int which)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        kvedge_cli_error("eval: cannot write %s: %s", path, strerror(errno));
        return KVEDGE_EXIT_FAILURE;
    }
    if (which == 0)
        kvedge_eval_print_schemes_dat(f, r);
    else if (which == 1)
        kvedge_eval_print_layers_dat(f, r);
    else
        kvedge_eval_print(f, r, true);
    if (fclose(f) != 0) {
        kvedge_cli_error("eval: cannot write %s: %s", path, strerror(errno));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

/* --profile-out: the profile schemes are ladder rungs, and the file's folder takes a file
 * (checked before the run, which may take minutes). Returns an exit code. */
static int s_profile_check(const kvedge_eval_scheme_t *profiles, size_t n, const char *path)
{
    if (n == 0) {
        kvedge_cli_error("eval: --profile-out needs a per-layer profile (not --no-profile)");
        return KVEDGE_EXIT_USAGE;
    }
    for (size_t i = 0; i < n; i++) {
        kvedge_prec_t p;
        if (kvedge_eval_scheme_prec(&profiles[i], &p) != KVEDGE_OK) {
            kvedge_cli_error("eval: --profile-out: profile scheme %s is not a rung of the "
                             "precision ladder (lossless, int8, int4-g32, int4-g64, int4-g128, "
                             "each optionally with +think-75 or +think-50; tc)",
                             profiles[i].name);
            return KVEDGE_EXIT_USAGE;
        }
        if (KVEDGE_PREC_IS_EC(p)) {
            kvedge_cli_error("eval: --profile-out: profile scheme %s: an +ec rung's quality is "
                             "its plain rung's (measure that one)",
                             profiles[i].name);
            return KVEDGE_EXIT_USAGE;
        }
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir ? 1 : 0] = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    if (access(dir, W_OK | X_OK) != 0) {
        kvedge_cli_error("eval: --profile-out %s: cannot write in %s: %s", path, dir,
                         strerror(errno));
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

/* Writes the quality profile to path.tmp and renames it over path, so a proxy that reloads
 * the file never reads half of it. Returns an exit code. */
static int s_profile_write(const char *path, const kvedge_eval_result_t *r, const char *model_id)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        kvedge_cli_error("eval: cannot write %s: %s", tmp, strerror(errno));
        return KVEDGE_EXIT_FAILURE;
    }
    int rc = kvedge_eval_profile_write(f, r, model_id);
    if (fclose(f) != 0 && rc == KVEDGE_OK)
        rc = KVEDGE_EIO;
    if (rc == KVEDGE_OK && rename(tmp, path) != 0)
        rc = KVEDGE_EIO;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("eval: cannot write the quality profile %s: %s%s", path,
                         kvedge_strerror(rc),
                         rc == KVEDGE_EINVAL ? " (a figure is not finite)" : "");
        remove(tmp);
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

/* Why the run failed, said plainly. Returns the exit code. */
static int s_run_fail(int rc, const char *model_id, const kvedge_eval_opts_t *o)
{
    switch (rc) {
    case KVEDGE_ETOOBIG:
        kvedge_cli_error("eval: --context (%u) + --continuation (%u) exceed the model's %u "
                         "positions",
                         o->ctx_tokens, o->cont_tokens,
                         kvedge_decoder_config(o->decoder)->max_positions);
        return KVEDGE_EXIT_USAGE;
    case KVEDGE_ENOMODEL:
        kvedge_cli_error("eval: the proxy does not know the model ids %s@SCHEME: join the cloud "
                         "node to the proxy's master (it registers the models it holds), or "
                         "register them there",
                         model_id);
        return KVEDGE_EXIT_NOTFOUND;
    case KVEDGE_ENOTFOUND:
        kvedge_cli_error("eval: the proxy kept reporting layers missing: is the proxy's source "
                         "the node given with -H?");
        return KVEDGE_EXIT_FAILURE;
    case KVEDGE_ESHAPE:
        kvedge_cli_error("eval: the coding basis of %s is not of the model's shape (%u layers, "
                         "%u KV heads, head dim %u)",
                         o->model->id, o->model->layers, o->model->kv_heads, o->model->head_dim);
        return KVEDGE_EXIT_USAGE;
    default:
        kvedge_cli_error("eval: %s (%s)", kvedge_strerror(rc), kvedge_errname(rc));
        return KVEDGE_EXIT_FAILURE;
    }
}

/* What eval works on and what it measured. */
typedef struct {
    kvedge_eval_scheme_t schemes[KVEDGE_EVAL_MAX_SCHEMES], profiles[KVEDGE_EVAL_MAX_PROFILES];
    size_t n_schemes, n_profiles;
    kvedge_decoder_t *d;
    kvedge_model_t model;
    kvedge_cli_docs_t docs;
    s_local_t w; /* the in-process deployment (without -H) */
    kvedge_client_t *cloud, *proxy;
    kvedge_eval_result_t *res;
    s_progress_t prog;
} s_eval_t;

/* The scheme lists into r, and the values and combinations the table cannot check. Returns an
 * exit code. */
static int s_eval_check(const kvedge_cli_t *cli, const s_eval_opts_t *o, s_eval_t *r)
{
    int ex = KVEDGE_EXIT_OK;
    r->n_schemes = kvedge_eval_schemes_default(r->schemes, KVEDGE_EVAL_MAX_SCHEMES);
    r->n_profiles = kvedge_eval_profiles_default(r->profiles, KVEDGE_EVAL_MAX_PROFILES);
    if (o->schemes)
        ex = s_schemes("--schemes", o->schemes, r->schemes, KVEDGE_EVAL_MAX_SCHEMES, &r->n_schemes);
    if (!ex && o->profiles && strcmp(o->profiles, "ladder") == 0)
        r->n_profiles = kvedge_eval_profiles_ladder(r->profiles, KVEDGE_EVAL_MAX_PROFILES);
    else if (!ex && o->profiles)
        ex = s_schemes("--profiles", o->profiles, r->profiles, KVEDGE_EVAL_MAX_PROFILES,
                       &r->n_profiles);
    if (o->no_profile)
        r->n_profiles = 0;
    if (ex)
        return ex;
    const char *bad = !*o->model_id || strlen(o->model_id) > KVEDGE_MODEL_ID_MAX_BYTES ? "model-id"
                      : o->profile_out && !*o->profile_out ? "profile-out"
                                                           : NULL;
    if (bad) {
        kvedge_cli_error("eval: bad value '%s' for --%s",
                         strcmp(bad, "model-id") == 0 ? o->model_id : o->profile_out, bad);
        return KVEDGE_EXIT_USAGE;
    }
    if (!o->weights) {
        kvedge_cli_error("eval: --weights FILE is required");
        return KVEDGE_EXIT_USAGE;
    }
    char own[4096];
    if (!o->ids == !o->file || (o->ids && o->tokenizer) ||
        (o->file && !o->tokenizer && !kvedge_cli_own_tokenizer(o->weights, own, sizeof own))) {
        kvedge_cli_error("eval: give the documents once: --ids FILE, or --file FILE with a "
                         "tokenizer (--tokenizer PATH, or a model folder's tokenizer.json)");
        return KVEDGE_EXIT_USAGE;
    }
    if (!cli->host != !o->proxy) {
        kvedge_cli_error("eval: -H CLOUD and --proxy EP go together (a deployment's cloud node "
                         "and edge proxy); without both, everything runs in this process");
        return KVEDGE_EXIT_USAGE;
    }
    if (o->profile_out && (ex = s_profile_check(r->profiles, r->n_profiles, o->profile_out)))
        return ex;
    struct stat sb;
    if (o->plot_dir && (stat(o->plot_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        kvedge_cli_error("eval: --plot-dir %s is not a directory", o->plot_dir);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

/* The weights, the model's record and the documents, long enough for --context and
 * --continuation. Returns an exit code. */
static int s_eval_load(const s_eval_opts_t *o, s_eval_t *r)
{
    r->d = kvedge_decoder_new();
    if (!r->d) {
        kvedge_cli_error("eval: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    int rc = kvedge_decoder_load(r->d, o->weights, o->heads);
    if (rc != KVEDGE_OK) {
        const char *why = kvedge_decoder_error(r->d);
        kvedge_cli_error("eval: cannot load the weights %s: %s%s%s", o->weights,
                         kvedge_strerror(rc), why[0] ? ": " : "", why);
        return KVEDGE_EXIT_FAILURE;
    }
    const kvedge_decoder_config_t *cfg = kvedge_decoder_config(r->d);
    uint64_t ctx = o->context, cont = o->continuation;
    int ex = KVEDGE_EXIT_OK;
    if ((rc = kvedge_e2e_model(r->d, o->model_id, &r->model)) != KVEDGE_OK) {
        kvedge_cli_error("eval: model '%s' cannot be stored: %s", o->model_id, kvedge_strerror(rc));
        ex = KVEDGE_EXIT_USAGE;
    } else if (ctx + cont > cfg->max_positions) {
        kvedge_cli_error("eval: --context (%llu) + --continuation (%llu) exceed the model's %u "
                         "positions",
                         (unsigned long long)ctx, (unsigned long long)cont, cfg->max_positions);
        ex = KVEDGE_EXIT_USAGE;
    } else if (o->ids) {
        ex = s_read_ids(o->ids, cfg->vocab, &r->docs);
    } else {
        char own[4096];
        const char *tok =
            o->tokenizer ? o->tokenizer : kvedge_cli_own_tokenizer(o->weights, own, sizeof own);
        ex = kvedge_cli_read_chapters("eval", tok, o->file, S_FILE_MAX_BYTES, cfg->vocab, &r->docs);
    }
    size_t longest = 0;
    for (size_t i = 0; !ex && i < r->docs.n; i++)
        longest = r->docs.len[i] > longest ? r->docs.len[i] : longest;
    if (!ex && longest < ctx + cont + 1) {
        kvedge_cli_error("eval: no document has the %llu tokens a context of %llu and a "
                         "continuation of %llu need (%zu documents, the longest %zu tokens)",
                         (unsigned long long)(ctx + cont + 1), (unsigned long long)ctx,
                         (unsigned long long)cont, r->docs.n, longest);
        ex = KVEDGE_EXIT_USAGE;
    }
    return ex;
}

/* The coding basis a tc scheme needs: --basis FILE, else basis.kvb in the model folder (beside
 * an OPT safetensors file), loaded, checked to be the model's, and registered. Returns an exit
 * code. */
static int s_eval_basis(const s_eval_opts_t *o, const s_eval_t *r)
{
    bool tc = false;
    for (size_t i = 0; i < r->n_schemes + r->n_profiles; i++)
        tc = tc || (i < r->n_schemes ? &r->schemes[i] : &r->profiles[i - r->n_schemes])->scheme ==
                       KVEDGE_SCHEME_TC;
    if (!tc && !o->basis)
        return KVEDGE_EXIT_OK;
    char def[4096];
    const char *path = o->basis;
    struct stat sb;
    if (!path) {
        const char *slash = strrchr(o->weights, '/');
        if (stat(o->weights, &sb) == 0 && S_ISDIR(sb.st_mode))
            snprintf(def, sizeof def, "%s/basis.kvb", o->weights);
        else
            snprintf(def, sizeof def, "%.*sbasis.kvb", slash ? (int)(slash - o->weights + 1) : 0,
                     o->weights);
        if (stat(def, &sb) != 0) {
            kvedge_cli_error("eval: scheme tc needs the model's coding basis: give --basis FILE "
                             "(there is no %s)",
                             def);
            return KVEDGE_EXIT_USAGE;
        }
        path = def;
    }
    char why[512] = "";
    kvedge_basis_t *b = NULL;
    int rc = kvedge_basis_load(path, &b, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("eval: cannot load the coding basis: %s", why);
        return KVEDGE_EXIT_FAILURE;
    }
    if (strcmp(kvedge_basis_model(b), r->model.id) != 0) {
        kvedge_cli_error("eval: the coding basis %s is for model %s, not %s", path,
                         kvedge_basis_model(b), r->model.id);
        kvedge_basis_free(&b);
        return KVEDGE_EXIT_USAGE;
    }
    rc = kvedge_basis_register(&b);
    kvedge_basis_free(&b); /* NULL once registered */
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("eval: cannot register the coding basis %s: %s", path,
                         kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

/* The cloud node and the proxy: started here (the schemes' models registered with the
 * in-process master), or the deployment's at -H and --proxy. Returns an exit code. */
static int s_eval_connect(kvedge_cli_t *cli, const s_eval_opts_t *o, s_eval_t *r)
{
    int ex;
    if (cli->host) {
        ex = kvedge_cli_connect(cli, "kvedge eval (cloud)", &r->cloud);
        kvedge_cli_t pc = *cli;
        pc.host = o->proxy;
        return ex ? ex : kvedge_cli_connect(&pc, "kvedge eval (edge)", &r->proxy);
    }
    kvedge_log_set_level(KVEDGE_LOG_WARN);
    ex = s_local_start(&r->w);
    kvedge_eval_scheme_t ll;
    kvedge_eval_scheme_parse("lossless", &ll);
    if (!ex)
        ex = s_local_register(&r->w, &r->model, r->schemes, r->n_schemes);
    if (!ex)
        ex = s_local_register(&r->w, &r->model, r->profiles, r->n_profiles);
    if (!ex)
        ex = s_local_register(&r->w, &r->model, &ll, 1);
    if (!ex)
        ex = s_local_client(r->w.n_ep, cli->deadline_ms, "kvedge eval (cloud)", &r->cloud);
    if (!ex)
        ex = s_local_client(r->w.p_ep, cli->deadline_ms, "kvedge eval (edge)", &r->proxy);
    return ex;
}

/* Runs the evaluation into r->res. Returns an exit code. */
static int s_eval_measure(const kvedge_cli_t *cli, const s_eval_opts_t *o, s_eval_t *r)
{
    r->prog.quiet = o->quiet;
    kvedge_eval_opts_t eo = {
        .decoder = r->d,
        .model = &r->model,
        .cloud = r->cloud,
        .proxy = r->proxy,
        .docs = (const int32_t *const *)r->docs.doc,
        .doc_len = r->docs.len,
        .n_docs = r->docs.n,
        .ctx_tokens = o->context,
        .cont_tokens = o->continuation,
        .chunk_tokens = o->chunk_tokens,
        .schemes = r->schemes,
        .n_schemes = r->n_schemes,
        .profiles = r->profiles,
        .n_profiles = r->n_profiles,
        .max_docs = (size_t)o->docs,
        .max_s = (double)o->time_budget_s,
        .deadline_ms = cli->deadline_ms,
        .wait_ms = (int)o->wait_ms,
        .progress = s_progress,
        .progress_arg = &r->prog,
    };
    int rc = kvedge_eval_run(&eo, &r->res);
    return rc == KVEDGE_OK ? KVEDGE_EXIT_OK : s_run_fail(rc, o->model_id, &eo);
}

/* Prints the result, then writes --plot-dir's files and --profile-out. Returns an exit code. */
static int s_eval_print(const kvedge_cli_t *cli, const s_eval_opts_t *o, const s_eval_t *r)
{
    int ex = KVEDGE_EXIT_OK;
    kvedge_eval_print(stdout, r->res, cli->json);
    if (o->plot_dir) {
        ex = s_write(o->plot_dir, "quality_schemes.dat", r->res, 0);
        if (!ex)
            ex = s_write(o->plot_dir, "quality_layers.dat", r->res, 1);
        if (!ex)
            ex = s_write(o->plot_dir, "quality.json", r->res, 2);
    }
    if (!ex && o->profile_out)
        ex = s_profile_write(o->profile_out, r->res, o->model_id);
    return ex;
}

static int s_eval(kvedge_cli_t *cli, const void *opts)
{
    const s_eval_opts_t *o = opts;
    s_eval_t *r = calloc(1, sizeof *r);
    if (!r) {
        kvedge_cli_error("eval: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    int ex = s_eval_check(cli, o, r);
    if (!ex)
        ex = s_eval_load(o, r);
    if (!ex)
        ex = s_eval_basis(o, r);
    if (!ex)
        ex = s_eval_connect(cli, o, r);
    if (!ex)
        ex = s_eval_measure(cli, o, r);
    kvedge_client_destroy(&r->proxy);
    kvedge_client_destroy(&r->cloud);
    s_local_stop(&r->w);
    if (!ex)
        ex = s_eval_print(cli, o, r);
    kvedge_eval_result_destroy(&r->res);
    kvedge_cli_docs_free(&r->docs);
    kvedge_decoder_destroy(&r->d);
    free(r);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_eval_cmds[] = {
    {.name = "eval", .opts = &s_eval_opts, .exec = s_eval},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
