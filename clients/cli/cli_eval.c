/* `kvedge eval`: the quality of every cache scheme on held-out text (clients/lab/eval.h), against a
 * master, cloud node and edge proxy started in this process, or against a deployment's cloud
 * node (-H) and edge proxy (--proxy). */
#define _GNU_SOURCE /* nftw */
#include <ctype.h>
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
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

enum {
    S_O_WEIGHTS = 1000,
    S_O_HEADS,
    S_O_MODEL_ID,
    S_O_IDS,
    S_O_TOKENIZER,
    S_O_TEXT,
    S_O_CONTEXT,
    S_O_CONTINUATION,
    S_O_CHUNK_TOKENS,
    S_O_DOCS,
    S_O_TIME_BUDGET,
    S_O_SCHEMES,
    S_O_PROFILES,
    S_O_NO_PROFILE,
    S_O_PLOT_DIR,
    S_O_PROFILE_OUT,
    S_O_PROXY,
    S_O_WAIT,
    S_O_QUIET,
};

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
    "Without -H, a Storage Master, a cloud node and an edge proxy run in this process (ipc\n"
    "endpoints in a temporary directory). With -H CLOUD --proxy EP it runs against a\n"
    "deployment: scheme S is stored under model id ID@S, which the proxy must know (a cloud\n"
    "node joined to the proxy's master registers it; fetches are retried for --wait).\n\n"
    "  -w, --weights FILE     OPT weights (safetensors), as prefill and decode take them\n"
    "      --heads N          attention heads (default: the file's metadata, else hidden/64)\n"
    "      --model-id ID      base of the schemes' model ids (default " S_MODEL_ID_DEFAULT ")\n"
    "      --ids FILE         documents as token ids: whitespace-separated, documents\n"
    "                         separated by blank lines\n"
    "      --tokenizer DIR    with --text: a BPE tokenizer directory (vocab.json, merges.txt)\n"
    "      --text FILE        documents as text, separated by blank lines (chapters)\n"
    "      --context N        shared context tokens (default 256)\n"
    "      --continuation N   scored continuation tokens (default 128); a document needs\n"
    "                         context + continuation + 1 tokens, shorter ones are skipped\n"
    "      --chunk-tokens N   context tokens per chunk (default 256)\n"
    "      --docs N           measure at most N documents (default: all)\n"
    "      --time-budget S    start no document after S seconds (default: none)\n"
    "      --schemes LIST     comma-separated, default: lossless,fp16,int8,int4-g32,\n"
    "                         int4-g64,int4-g128,think-75,think-50,int4-g32+think-50.\n"
    "                         Names: lossless (fp32), fp16, int8, int4[-gN], each with an\n"
    "                         optional +think-P (keep P % of the key channels), think-P\n"
    "      --profiles LIST    per-layer profile schemes (default int4-g32,think-50), at\n"
    "                         most 16; 'ladder': every lossy rung of the precision ladder\n"
    "                         (int8, int4-g32, int4-g64, int4-g128, each alone, with\n"
    "                         +think-75 and with +think-50, and think-75, think-50: 14)\n"
    "      --no-profile       no per-layer profile\n"
    "      --profile-out FILE write the per-layer profile as the quality profile the edge\n"
    "                         proxy's planner reads (proxy/quality.h, JSON version 1):\n"
    "                         per layer and rung the perplexity change (%), mean KL and\n"
    "                         agreement, and the whole-model rows of the schemes that are\n"
    "                         ladder rungs. Every profile scheme must be a ladder rung\n"
    "                         (lossless, int8, int4-g32/g64/g128, each optionally with\n"
    "                         +think-75 or +think-50; not fp16 or other groups or shares)\n"
    "      --plot-dir DIR     write quality_schemes.dat, quality_layers.dat and\n"
    "                         quality.json there (scripts/plot_quality.gp draws them)\n"
    "      --proxy EP         with -H: the edge proxy to fetch through\n"
    "      --wait MS          retry a fetch the proxy cannot serve yet for MS (default 10000)\n"
    "  -q, --quiet            no progress on stderr\n\n"
    "--json prints one object: {\"reference\": ROW, \"schemes\": [ROW], \"profiles\":\n"
    "[{\"scheme\", \"layers\": [ROW]}], \"doc_index\", ...}.\n\n"
    "exit codes: 2 usage, 1 the evaluation failed, 3 the proxy does not know a scheme's\n"
    "model id, 5 node or proxy unreachable.\n";

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
                             "each optionally with +think-75 or +think-50)",
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
    default:
        kvedge_cli_error("eval: %s (%s)", kvedge_strerror(rc), kvedge_errname(rc));
        return KVEDGE_EXIT_FAILURE;
    }
}

static int s_cmd_eval(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        {"weights", required_argument, NULL, S_O_WEIGHTS},
        {"heads", required_argument, NULL, S_O_HEADS},
        {"model-id", required_argument, NULL, S_O_MODEL_ID},
        {"ids", required_argument, NULL, S_O_IDS},
        {"tokenizer", required_argument, NULL, S_O_TOKENIZER},
        {"text", required_argument, NULL, S_O_TEXT},
        {"context", required_argument, NULL, S_O_CONTEXT},
        {"continuation", required_argument, NULL, S_O_CONTINUATION},
        {"chunk-tokens", required_argument, NULL, S_O_CHUNK_TOKENS},
        {"docs", required_argument, NULL, S_O_DOCS},
        {"time-budget", required_argument, NULL, S_O_TIME_BUDGET},
        {"schemes", required_argument, NULL, S_O_SCHEMES},
        {"profiles", required_argument, NULL, S_O_PROFILES},
        {"no-profile", no_argument, NULL, S_O_NO_PROFILE},
        {"plot-dir", required_argument, NULL, S_O_PLOT_DIR},
        {"profile-out", required_argument, NULL, S_O_PROFILE_OUT},
        {"proxy", required_argument, NULL, S_O_PROXY},
        {"wait", required_argument, NULL, S_O_WAIT},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {"eval",
                                  NULL,
                                  "--weights FILE (--ids FILE | --tokenizer DIR --text FILE) "
                                  "[-H CLOUD --proxy EP] [...]",
                                  "Measure the quality of every cache scheme on held-out text.",
                                  NULL,
                                  NULL};
    const char *weights = NULL, *model_id = S_MODEL_ID_DEFAULT, *ids_file = NULL, *tok_dir = NULL,
               *text_file = NULL, *plot_dir = NULL, *proxy_ep = NULL, *profile_out = NULL;
    uint64_t heads = 0, ctx = S_CONTEXT_DEFAULT, cont = S_CONTINUATION_DEFAULT, chunk = 0,
             docs_max = 0, budget = 0, wait_ms = 0;
    kvedge_eval_scheme_t schemes[KVEDGE_EVAL_MAX_SCHEMES], profiles[KVEDGE_EVAL_MAX_PROFILES];
    size_t n_schemes = kvedge_eval_schemes_default(schemes, KVEDGE_EVAL_MAX_SCHEMES);
    size_t n_profiles = kvedge_eval_profiles_default(profiles, KVEDGE_EVAL_MAX_PROFILES);
    s_progress_t prog = {false};
    int ch, ex = KVEDGE_EXIT_OK;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "w:qh", opts, NULL)) != -1) {
        bool bad = false;
        switch (ch) {
        case 'w':
        case S_O_WEIGHTS:
            weights = optarg;
            break;
        case S_O_HEADS:
            bad = kvedge_cli_parse_u64(optarg, 1, KVEDGE_MODEL_MAX_HEADS, &heads) != 0;
            break;
        case S_O_MODEL_ID:
            model_id = optarg;
            bad = !*optarg || strlen(optarg) > KVEDGE_MODEL_ID_MAX_BYTES;
            break;
        case S_O_IDS:
            ids_file = optarg;
            break;
        case S_O_TOKENIZER:
            tok_dir = optarg;
            break;
        case S_O_TEXT:
            text_file = optarg;
            break;
        case S_O_CONTEXT:
            bad = kvedge_cli_parse_u64(optarg, 1, UINT32_MAX, &ctx) != 0;
            break;
        case S_O_CONTINUATION:
            bad = kvedge_cli_parse_u64(optarg, 1, UINT32_MAX, &cont) != 0;
            break;
        case S_O_CHUNK_TOKENS:
            bad = kvedge_cli_parse_u64(optarg, 1, KVEDGE_BLOCK_MAX_TOKENS, &chunk) != 0;
            break;
        case S_O_DOCS:
            bad = kvedge_cli_parse_u64(optarg, 1, SIZE_MAX, &docs_max) != 0;
            break;
        case S_O_TIME_BUDGET:
            bad = kvedge_cli_parse_u64(optarg, 1, 1000000, &budget) != 0;
            break;
        case S_O_SCHEMES:
            ex = s_schemes("--schemes", optarg, schemes, KVEDGE_EVAL_MAX_SCHEMES, &n_schemes);
            break;
        case S_O_PROFILES:
            if (strcmp(optarg, "ladder") == 0)
                n_profiles = kvedge_eval_profiles_ladder(profiles, KVEDGE_EVAL_MAX_PROFILES);
            else
                ex = s_schemes("--profiles", optarg, profiles, KVEDGE_EVAL_MAX_PROFILES,
                               &n_profiles);
            break;
        case S_O_NO_PROFILE:
            n_profiles = 0;
            break;
        case S_O_PLOT_DIR:
            plot_dir = optarg;
            break;
        case S_O_PROFILE_OUT:
            profile_out = optarg;
            bad = !*optarg;
            break;
        case S_O_PROXY:
            proxy_ep = optarg;
            break;
        case S_O_WAIT:
            bad = kvedge_cli_parse_u64(optarg, 1, 3600000, &wait_ms) != 0;
            break;
        case 'q':
            prog.quiet = true;
            break;
        case 'h':
            kvedge_cli_usage(stdout, &cmd, s_eval_help);
            return KVEDGE_EXIT_OK;
        default:
            kvedge_cli_error("eval: unknown option or missing value '%s' (see kvedge eval --help)",
                             argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        if (ex)
            return ex;
        if (bad) {
            kvedge_cli_error("eval: bad value '%s' for --%s", optarg,
                             kvedge_cli_flag_name(opts, ch));
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("eval: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    if (!weights) {
        kvedge_cli_error("eval: --weights FILE is required");
        return KVEDGE_EXIT_USAGE;
    }
    if (!ids_file == !text_file || !text_file != !tok_dir) {
        kvedge_cli_error("eval: give the documents once: --ids FILE, or --tokenizer DIR with "
                         "--text FILE");
        return KVEDGE_EXIT_USAGE;
    }
    if (!cli->host != !proxy_ep) {
        kvedge_cli_error("eval: -H CLOUD and --proxy EP go together (a deployment's cloud node "
                         "and edge proxy); without both, everything runs in this process");
        return KVEDGE_EXIT_USAGE;
    }
    if (profile_out)
        ex = s_profile_check(profiles, n_profiles, profile_out);
    if (ex)
        return ex;
    if (plot_dir) {
        struct stat sb;
        if (stat(plot_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            kvedge_cli_error("eval: --plot-dir %s is not a directory", plot_dir);
            return KVEDGE_EXIT_USAGE;
        }
    }

    kvedge_decoder_t *d = kvedge_decoder_new();
    if (!d) {
        kvedge_cli_error("eval: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    int rc = kvedge_decoder_load(d, weights, (uint32_t)heads);
    if (rc != KVEDGE_OK) {
        const char *why = kvedge_decoder_error(d);
        kvedge_cli_error("eval: cannot load the weights %s: %s%s%s", weights, kvedge_strerror(rc),
                         why[0] ? ": " : "", why);
        kvedge_decoder_destroy(&d);
        return KVEDGE_EXIT_FAILURE;
    }
    const kvedge_decoder_config_t *cfg = kvedge_decoder_config(d);
    kvedge_model_t model;
    rc = kvedge_e2e_model(d, model_id, &model);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("eval: model '%s' cannot be stored: %s", model_id, kvedge_strerror(rc));
        ex = KVEDGE_EXIT_USAGE;
    }
    if (!ex && ctx + cont > cfg->max_positions) {
        kvedge_cli_error("eval: --context (%llu) + --continuation (%llu) exceed the model's %u "
                         "positions",
                         (unsigned long long)ctx, (unsigned long long)cont, cfg->max_positions);
        ex = KVEDGE_EXIT_USAGE;
    }
    kvedge_cli_docs_t docs = {0};
    if (!ex && ids_file)
        ex = s_read_ids(ids_file, cfg->vocab, &docs);
    if (!ex && text_file)
        ex = kvedge_cli_read_chapters("eval", tok_dir, text_file, S_FILE_MAX_BYTES, cfg->vocab,
                                      &docs);
    size_t longest = 0;
    for (size_t i = 0; !ex && i < docs.n; i++)
        longest = docs.len[i] > longest ? docs.len[i] : longest;
    if (!ex && longest < ctx + cont + 1) {
        kvedge_cli_error("eval: no document has the %llu tokens a context of %llu and a "
                         "continuation of %llu need (%zu documents, the longest %zu tokens)",
                         (unsigned long long)(ctx + cont + 1), (unsigned long long)ctx,
                         (unsigned long long)cont, docs.n, longest);
        ex = KVEDGE_EXIT_USAGE;
    }

    s_local_t w;
    memset(&w, 0, sizeof w);
    kvedge_client_t *cloud = NULL, *proxy = NULL;
    if (!ex && !cli->host) {
        kvedge_log_set_level(KVEDGE_LOG_WARN);
        ex = s_local_start(&w);
        kvedge_eval_scheme_t ll;
        kvedge_eval_scheme_parse("lossless", &ll);
        if (!ex)
            ex = s_local_register(&w, &model, schemes, n_schemes);
        if (!ex)
            ex = s_local_register(&w, &model, profiles, n_profiles);
        if (!ex)
            ex = s_local_register(&w, &model, &ll, 1);
        if (!ex)
            ex = s_local_client(w.n_ep, cli->deadline_ms, "kvedge eval (cloud)", &cloud);
        if (!ex)
            ex = s_local_client(w.p_ep, cli->deadline_ms, "kvedge eval (edge)", &proxy);
    } else if (!ex) {
        ex = kvedge_cli_connect(cli, "kvedge eval (cloud)", &cloud);
        kvedge_cli_t pc = *cli;
        pc.host = proxy_ep;
        if (!ex)
            ex = kvedge_cli_connect(&pc, "kvedge eval (edge)", &proxy);
    }
    kvedge_eval_result_t *res = NULL;
    if (!ex) {
        kvedge_eval_opts_t o = {
            .decoder = d,
            .model = &model,
            .cloud = cloud,
            .proxy = proxy,
            .docs = (const int32_t *const *)docs.doc,
            .doc_len = docs.len,
            .n_docs = docs.n,
            .ctx_tokens = (uint32_t)ctx,
            .cont_tokens = (uint32_t)cont,
            .chunk_tokens = (uint32_t)chunk,
            .schemes = schemes,
            .n_schemes = n_schemes,
            .profiles = profiles,
            .n_profiles = n_profiles,
            .max_docs = (size_t)docs_max,
            .max_s = (double)budget,
            .deadline_ms = cli->deadline_ms,
            .wait_ms = (int)wait_ms,
            .progress = s_progress,
            .progress_arg = &prog,
        };
        rc = kvedge_eval_run(&o, &res);
        if (rc != KVEDGE_OK)
            ex = s_run_fail(rc, model_id, &o);
    }
    kvedge_client_destroy(&proxy);
    kvedge_client_destroy(&cloud);
    s_local_stop(&w);
    if (!ex) {
        kvedge_eval_print(stdout, res, cli->json);
        if (plot_dir) {
            ex = s_write(plot_dir, "quality_schemes.dat", res, 0);
            if (!ex)
                ex = s_write(plot_dir, "quality_layers.dat", res, 1);
            if (!ex)
                ex = s_write(plot_dir, "quality.json", res, 2);
        }
        if (!ex && profile_out)
            ex = s_profile_write(profile_out, res, model_id);
    }
    kvedge_eval_result_destroy(&res);
    kvedge_cli_docs_free(&docs);
    kvedge_decoder_destroy(&d);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_eval_cmds[] = {
    {"eval", s_cmd_eval,
     "--weights FILE (--ids FILE | --tokenizer DIR --text FILE) [-H CLOUD --proxy EP]",
     "Measure the quality of every cache scheme (perplexity, agreement, KL) on held-out text.",
     NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL},
};
